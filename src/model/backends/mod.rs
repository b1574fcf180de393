//! Pool members (backends): what a Service's traffic goes to on the appliance, computed from Nodes and
//! EndpointSlices. Pure: the recorder keeps the [`BackendIndex`] up to date from the watches and asks
//! [`compute_sets`] for a Service's members whenever one of its inputs changed.

mod index;
mod members;
mod mode;
mod node;
mod sets;
mod slice;

pub use index::BackendIndex;
pub use members::{MemberRules, compute};
pub use mode::{MODE_ANNOTATION, ModePlan, ModeSetting, annotated};
pub use node::{ADDRESS_TYPES, AUTOSCALER_TAINT, EXCLUDE_LABEL, NodeAddressView, NodeView, ObservedNode, ZONE_LABEL};
pub use sets::{BackendSets, changed, compute_sets, diff, diffs, in_mode, shrink};
pub use slice::{ObservedSlice, SERVICE_NAME_LABEL, SliceEndpoint, SlicePort, SliceView};

#[cfg(test)]
mod tests;
