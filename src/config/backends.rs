//! `[backends]`: how pool members are computed and how their churn is coalesced (docs/how-to/backends.md).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::model::backends::{ADDRESS_TYPES, MemberRules, ModeSetting};

/// `[backends]` table.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BackendsConfig {
    /// How pool members are chosen: `nodePort` (every eligible Node × each port's `nodePort`), `pod` (the endpoints
    /// of the Service's EndpointSlices) or `none` (no members; Nodes and EndpointSlices are not watched).
    /// Overridden per endpoint (`webhooks.backend_mode`) and per Service (annotation `vipwatch.io/backend-mode`).
    pub mode: ModeSetting,
    /// Member changes of one Service within this window (after the last one) become one `MODIFIED`; a new Service
    /// in mode `pod` waits at most this long for its first endpoints.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub window: Duration,
    /// Under continuous churn, a pending member change goes out at the latest this long after the first one. At
    /// least `window`, at most `1m`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub max_wait: Duration,
    /// Node address types by preference (`InternalIP`, `ExternalIP`), for the primary address of each family the
    /// Service uses.
    pub address_types: Vec<String>,
    /// With `externalTrafficPolicy: Local` in mode `nodePort`: list only the Nodes hosting a ready endpoint (a Node
    /// with only draining ones is `draining`), for appliances that cannot run the `healthCheckNodePort` health
    /// check.
    pub local_endpoints_only: bool,
    /// The health check hinted for `externalTrafficPolicy: Cluster` (kube-proxy's `/healthz`); `0`: no hint.
    pub kube_proxy_health_port: u16,
}

impl Default for BackendsConfig {
    fn default() -> Self {
        Self {
            mode: ModeSetting::NodePort,
            window: Duration::from_millis(100),
            max_wait: Duration::from_secs(2),
            address_types: ADDRESS_TYPES.iter().map(|t| (*t).to_owned()).collect(),
            local_endpoints_only: false,
            kube_proxy_health_port: 10256,
        }
    }
}

impl BackendsConfig {
    /// The settings the member computation takes.
    pub fn rules(&self) -> MemberRules {
        MemberRules {
            address_types: self.address_types.clone(),
            local_endpoints_only: self.local_endpoints_only,
            kube_proxy_health_port: self.kube_proxy_health_port,
        }
    }

    /// Checks the values. Errors: [`ConfigError::Value`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, reason: String| Err(ConfigError::Value { key, reason });
        if self.address_types.is_empty() {
            return bad("backends.address_types", "must name at least one of InternalIP, ExternalIP".into());
        }
        for (i, t) in self.address_types.iter().enumerate() {
            if !ADDRESS_TYPES.contains(&t.as_str()) {
                return bad("backends.address_types", format!("`{t}` is not InternalIP or ExternalIP"));
            }
            if self.address_types[..i].contains(t) {
                return bad("backends.address_types", format!("`{t}` is listed twice"));
            }
        }
        if self.max_wait < self.window {
            return bad("backends.max_wait", "must not be shorter than backends.window".into());
        }
        if self.max_wait > Duration::from_secs(60) {
            return bad("backends.max_wait", "must be at most 1m (member changes would wait longer)".into());
        }
        Ok(())
    }
}
