//! An EndpointSlice as the load balancer sees it: which Service it belongs to, its ports (resolved
//! target ports) and its serving endpoints with their state. Rules from the EndpointSlice API and
//! kube-proxy: the Service is the label
//! `kubernetes.io/service-name`; FQDN slices have no semantics and are skipped; only the first address
//! of an endpoint counts; a nil `ready` is true, a nil `serving` equals `ready`, a nil `terminating` is
//! false; a ready endpoint is `active`, a serving and terminating one `draining`, anything else is
//! left out.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use vipwatch_contract::MemberState;

use crate::model::ServiceKey;

/// The label naming the Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One port of a slice: `name` (`""` when unnamed) and `protocol` match a Service port; `port` is the
/// resolved target port the endpoints listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePort {
    /// The Service port's name, `""` for a single unnamed port.
    pub name: String,
    /// `TCP`, `UDP` or `SCTP` (default `TCP`).
    pub protocol: String,
    /// The target port number.
    pub port: i32,
}

/// One serving endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceEndpoint {
    /// Its first address.
    pub address: IpAddr,
    /// `active` (ready) or `draining` (serving and terminating).
    pub state: MemberState,
    /// The Node it runs on.
    pub node: Option<Arc<str>>,
    /// Its zone.
    pub zone: Option<Arc<str>>,
}

/// The projection of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceView {
    /// `addressType` is `IPv6` (else `IPv4`).
    pub ipv6: bool,
    /// Its ports with a number (a nil port, "all ports", is skipped).
    pub ports: Vec<SlicePort>,
    /// Its serving endpoints, in slice order.
    pub endpoints: Vec<SliceEndpoint>,
}

/// An EndpointSlice as the apiserver just reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedSlice {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The Service it belongs to (`None` without the service-name label: nobody's).
    pub service: Option<ServiceKey>,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
    /// The projection (`None` for an FQDN slice, which counts as empty).
    pub view: Option<SliceView>,
}

impl ObservedSlice {
    /// Projects an EndpointSlice. Never fails: what cannot be used is left out.
    pub fn from_slice(slice: &EndpointSlice) -> Self {
        let meta = &slice.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let service = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .filter(|s| !s.is_empty())
            .map(|s| ServiceKey::new(namespace.clone(), s.clone()));
        let ipv6 = slice.address_type == "IPv6";
        let view = matches!(slice.address_type.as_str(), "IPv4" | "IPv6").then(|| SliceView {
            ipv6,
            ports: slice.ports.iter().flatten().filter_map(port).collect(),
            // An address of the other family than the slice's `addressType` is invalid (the
            // apiserver's validation refuses it; a hand-written slice may still hold one): skipped.
            endpoints: slice
                .endpoints
                .iter()
                .flatten()
                .filter_map(endpoint)
                .filter(|e| e.address.is_ipv6() == ipv6)
                .collect(),
        });
        Self {
            namespace,
            name: meta.name.clone().unwrap_or_default(),
            service,
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            view,
        }
    }
}

fn port(p: &k8s_openapi::api::discovery::v1::EndpointPort) -> Option<SlicePort> {
    Some(SlicePort {
        name: p.name.clone().unwrap_or_default(),
        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
        port: p.port?,
    })
}

fn endpoint(e: &Endpoint) -> Option<SliceEndpoint> {
    let address: IpAddr = e.addresses.first()?.parse().ok()?;
    let c = e.conditions.as_ref();
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    let serving = c.and_then(|c| c.serving).unwrap_or(ready);
    let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
    let state = if ready && !terminating {
        MemberState::Active
    } else if serving && terminating {
        MemberState::Draining
    } else {
        return None;
    };
    let node = e.node_name.as_deref().map(Arc::from);
    let zone = e.zone.as_deref().map(Arc::from);
    Some(SliceEndpoint { address, state, node, zone })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe(json: serde_json::Value) -> ObservedSlice {
        ObservedSlice::from_slice(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn the_documented_slice_is_one_active_endpoint_of_its_service() {
        let text = include_str!("../../../tests/data/kubernetes/endpointslice-docs.json");
        let s = observe(serde_json::from_str(text).unwrap());
        assert_eq!(s.service, Some(ServiceKey::new("default", "example")));
        let view = s.view.unwrap();
        assert_eq!(view.ports, vec![SlicePort { name: "http".into(), protocol: "TCP".into(), port: 80 }]);
        assert_eq!(
            view.endpoints,
            vec![SliceEndpoint {
                address: "10.1.2.3".parse().unwrap(),
                state: MemberState::Active,
                node: Some("node-1".into()),
                zone: Some("us-west2-a".into())
            }]
        );
    }

    #[test]
    fn conditions_decide_the_state_with_kubernetes_nil_defaults() {
        let s = observe(serde_json::json!({"metadata": {"name": "s", "namespace": "shop",
            "labels": {SERVICE_NAME_LABEL: "web"}}, "addressType": "IPv4", "endpoints": [
            {"addresses": ["10.0.0.1"]},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": false, "terminating": true}},
            {"addresses": ["10.0.0.4"], "conditions": {"ready": false}},
            {"addresses": ["10.0.0.5", "10.0.0.6"], "conditions": {"ready": true}},
            {"addresses": ["fd00::7"], "conditions": {"ready": true}},
            {"addresses": []}]}));
        let states: Vec<(String, MemberState)> =
            s.view.unwrap().endpoints.iter().map(|e| (e.address.to_string(), e.state)).collect();
        assert_eq!(
            states,
            vec![
                ("10.0.0.1".into(), MemberState::Active),
                ("10.0.0.2".into(), MemberState::Draining),
                ("10.0.0.5".into(), MemberState::Active)
            ]
        );
    }

    #[test]
    fn fqdn_slices_and_nil_ports_are_skipped() {
        let fqdn = observe(serde_json::json!({"metadata": {"name": "s", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "FQDN", "endpoints": [{"addresses": ["db.example.net"]}]}));
        assert_eq!(fqdn.view, None);
        let all_ports = observe(serde_json::json!({"metadata": {"name": "s"}, "addressType": "IPv6",
            "ports": [{"name": "x", "protocol": "UDP"}, {"port": 53, "protocol": "UDP"}]}));
        assert_eq!(all_ports.service, None);
        let view = all_ports.view.unwrap();
        assert!(view.ipv6);
        assert_eq!(view.ports, vec![SlicePort { name: "".into(), protocol: "UDP".into(), port: 53 }]);
    }
}
