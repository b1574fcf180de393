//! Which backend mode applies where: `[backends] mode` for everything, overridden per webhook endpoint
//! (`backend_mode`) and per Service (annotation `vipwatch.io/backend-mode`). The most specific wins:
//! the Service's annotation, then the endpoint's setting, then the global one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vipwatch_contract::BackendMode;

use crate::model::ServiceView;

/// The annotation through which a Service picks its backend mode (`nodePort`, `pod` or `none`).
pub const MODE_ANNOTATION: &str = "vipwatch.io/backend-mode";

/// A configured backend mode: a [`BackendMode`], or `none` (no members computed or sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ModeSetting {
    /// Nodes × nodePorts.
    NodePort,
    /// EndpointSlice endpoints.
    Pod,
    /// No members.
    None,
}

impl ModeSetting {
    /// The mode, `None` for `none`.
    pub fn mode(self) -> Option<BackendMode> {
        match self {
            Self::NodePort => Some(BackendMode::NodePort),
            Self::Pod => Some(BackendMode::Pod),
            Self::None => None,
        }
    }

    /// `nodePort`, `pod` or `none`, as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodePort => "nodePort",
            Self::Pod => "pod",
            Self::None => "none",
        }
    }

    /// Parses `nodePort`, `pod` or `none` (exact spelling).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(Self::None),
            other => BackendMode::parse(other).map(|m| match m {
                BackendMode::NodePort => Self::NodePort,
                BackendMode::Pod => Self::Pod,
            }),
        }
    }
}

/// What the Service's annotation asks for: `Ok(None)` without it, `Err(value)` for a value that is not
/// `nodePort`, `pod` or `none` (ignored: the endpoint's or the global mode applies).
pub fn annotated(view: &ServiceView) -> Result<Option<ModeSetting>, &str> {
    match view.annotations.get(MODE_ANNOTATION) {
        None => Ok(None),
        Some(v) => ModeSetting::parse(v.trim()).map(Some).ok_or(v.as_str()),
    }
}

/// The global mode and the endpoints' overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModePlan {
    /// `[backends] mode`.
    pub global: ModeSetting,
    /// `backend_mode` of the endpoints that set one, by endpoint name.
    pub endpoints: BTreeMap<String, ModeSetting>,
}

impl ModePlan {
    /// The mode endpoint `endpoint` gets for the Service `view`: its annotation, else the endpoint's
    /// setting, else the global one; `None` for `none`.
    pub fn mode_for(&self, view: &ServiceView, endpoint: &str) -> Option<BackendMode> {
        let setting = annotated(view).ok().flatten();
        setting.or_else(|| self.endpoints.get(endpoint).copied()).unwrap_or(self.global).mode()
    }

    /// Every mode some endpoint may get for `view` (the ones to compute), ascending. None at all when
    /// nothing but `none` is configured: Nodes and EndpointSlices are not watched then.
    pub fn modes_for(&self, view: &ServiceView) -> Vec<BackendMode> {
        if !self.any() {
            return Vec::new();
        }
        if let Ok(Some(setting)) = annotated(view) {
            return setting.mode().into_iter().collect();
        }
        let mut modes: Vec<BackendMode> = std::iter::once(self.global)
            .chain(self.endpoints.values().copied())
            .filter_map(ModeSetting::mode)
            .collect();
        modes.sort();
        modes.dedup();
        modes
    }

    /// Whether any mode but `none` is configured anywhere (else Nodes and EndpointSlices are not
    /// watched, and annotations asking for a mode have nothing to work with).
    pub fn any(&self) -> bool {
        self.global != ModeSetting::None || self.endpoints.values().any(|m| *m != ModeSetting::None)
    }
}
