//! `[[pools]]`: the address pools VIPs are allocated from. Parsed and checked by
//! [`crate::ipam::Pools::new`] when the configuration is loaded.

use serde::{Deserialize, Serialize};

/// One `[[pools]]` entry, as written in the TOML file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Unique pool name; a Service asks for it with the `vipwatch.io/address-pool` annotation.
    pub name: String,
    /// CIDRs (`192.0.2.0/24`, `2001:db8::/120`: every address in them, network and broadcast included, as MetalLB
    /// does), inclusive ranges (`198.51.100.10-198.51.100.20`) and single addresses. An empty pool, a malformed
    /// range, a CIDR with host bits set, or an address in two ranges or two pools is an error at start.
    pub addresses: Vec<String>,
    /// Services that name no pool get addresses from this one (the first such pool in config order that accepts
    /// them); `false`: only Services that ask for this pool by name.
    #[serde(default = "yes")]
    pub auto_assign: bool,
    /// Namespaces allowed to use the pool; empty: all.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Label selector (Kubernetes syntax) a Service must match to use the pool; empty: every Service.
    #[serde(default)]
    pub service_selector: String,
    /// Skip IPv4 addresses ending in `.0` or `.255` (some old clients and routers drop them).
    #[serde(default)]
    pub avoid_buggy_ips: bool,
}

fn yes() -> bool {
    true
}
