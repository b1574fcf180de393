//! Pure data: the normalized Service view a load balancer cares about, the in-scope rule, and the
//! LB-relevant diff that decides ADDED / MODIFIED / DELETED. No I/O in here.

pub mod annotations;
pub mod backends;
pub mod bounded;
mod change;
pub mod cluster;
mod gates;
mod notice;
mod scope;
mod time;
mod view;

pub use change::{Cause, ChangeKind, Decision, Observed, Recorded, Tracked, decide_apply, decide_delete};
pub use gates::Gates;
pub use notice::{Assignment, FINALIZER, Feedback, NOTICE_QUEUE, Notice, Reason};
pub use scope::Scope;
pub use time::rfc3339;
pub use view::{
    Allocation, IngressView, PortView, REQUESTED_IP_ANNOTATIONS, ServiceKey, ServiceView, VipSource, changed_fields,
};
pub use vipwatch_label_selector::{LabelSelector, SelectorError};
