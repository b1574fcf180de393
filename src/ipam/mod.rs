//! IP address management: the configured `[[pools]]` and the allocator that gives each owned
//! `LoadBalancer` Service its VIPs. Pure and synchronous; the watch recorder owns the one [`Allocator`]
//! and persists its decisions in the Service's view, in the event's transaction.

mod allocator;
mod pool;
mod release;
pub mod request;

pub use allocator::{Allocator, PoolUsage};
pub use pool::{AddrRange, Family, Pool, PoolError, Pools};
pub use release::{pool_addresses, withdrawn};
