//! OpenAPI schemas of types the API serializes but does not own: the normalized Service view
//! (`model::ServiceView`) and the webhook body (`relay::payload`). They mirror those types field for
//! field; the tests below fail when a mirror drifts from what is really serialized.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One Service port as the load balancer sees it (`spec.ports[]`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = PortView)]
pub struct PortViewSchema {
    /// Port name.
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The Service port the VIP listens on.
    pub port: i32,
    /// Target port on the Pods: a number or a named port, as a string.
    pub target_port: String,
    /// NodePort, when allocated.
    pub node_port: Option<i32>,
    /// `appProtocol` hint.
    pub app_protocol: Option<String>,
}

/// One `status.loadBalancer.ingress[]` entry.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = IngressView)]
pub struct IngressViewSchema {
    /// IP address.
    pub ip: Option<String>,
    /// DNS name.
    pub hostname: Option<String>,
    /// `VIP` or `Proxy`.
    pub ip_mode: Option<String>,
}

/// The normalized, LB-relevant view of a Service (camelCase, Kubernetes defaults filled in).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ServiceView)]
pub struct ServiceViewSchema {
    /// `spec.type`.
    #[serde(rename = "type")]
    pub service_type: String,
    /// `spec.loadBalancerClass`.
    pub load_balancer_class: Option<String>,
    /// `spec.ports`.
    pub ports: Vec<PortViewSchema>,
    /// `spec.selector`.
    pub selector: BTreeMap<String, String>,
    /// `spec.externalTrafficPolicy`.
    pub external_traffic_policy: Option<String>,
    /// `spec.healthCheckNodePort`.
    pub health_check_node_port: Option<i32>,
    /// `spec.sessionAffinity`.
    pub session_affinity: String,
    /// `spec.sessionAffinityConfig.clientIP.timeoutSeconds` (seconds).
    pub session_affinity_timeout_seconds: Option<i32>,
    /// `spec.loadBalancerSourceRanges`.
    pub load_balancer_source_ranges: Vec<String>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<String>,
    /// `spec.ipFamilies`.
    pub ip_families: Vec<String>,
    /// `spec.ipFamilyPolicy`.
    pub ip_family_policy: Option<String>,
    /// `spec.allocateLoadBalancerNodePorts`.
    pub allocate_load_balancer_node_ports: Option<bool>,
    /// `spec.loadBalancerIP`.
    pub load_balancer_ip: Option<String>,
    /// IPs requested by annotation.
    pub requested_ips: Vec<String>,
    /// `status.loadBalancer.ingress`.
    pub ingress: Vec<IngressViewSchema>,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// The VIPs vipwatch assigned (from a pool, or by an appliance with `assigns_vip`), or why none
    /// yet; `null` when vipwatch does not assign this Service's addresses.
    pub allocation: Option<AllocationSchema>,
    /// `metadata.finalizers`.
    pub finalizers: Vec<String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

/// The addresses vipwatch assigned to a Service, or why it has none.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Allocation)]
pub struct AllocationSchema {
    /// `pool` or `appliance`.
    pub source: String,
    /// The `[[pools]]` entry the addresses come from.
    pub pool: Option<String>,
    /// The VIPs, primary family first; empty while pending.
    pub addresses: Vec<String>,
    /// A DNS name instead of addresses (appliance only).
    pub hostname: Option<String>,
    /// Why there is no address yet (impossible request, pool exhausted).
    pub reason: Option<String>,
}

/// The Service in a webhook body: identity, VIPs, and the normalized view's fields.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WebhookService)]
pub struct WebhookServiceSchema {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion` of the change.
    pub resource_version: String,
    /// VIP addresses: published ingress first, then requested.
    pub vips: Vec<String>,
    /// The normalized view's fields.
    #[serde(flatten)]
    pub view: ServiceViewSchema,
}

/// `data` of a webhook body.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = WebhookPayloadData)]
pub struct WebhookDataSchema {
    /// Event-log id; `null` for `service.synced`.
    pub event_id: Option<i64>,
    /// `ADDED`, `MODIFIED`, `DELETED` or `SYNCED`.
    #[schema(pattern = "^(ADDED|MODIFIED|DELETED|SYNCED)$")]
    pub event: String,
    /// `watch`, `relist`, `startup` or `resync`.
    pub cause: String,
    /// The Service after the change (the last view for DELETED).
    pub service: WebhookServiceSchema,
    /// MODIFIED: the Service before; otherwise `null`.
    pub previous: Option<WebhookServiceSchema>,
    /// MODIFIED: the changed field names; otherwise empty.
    pub changed: Vec<String>,
}

/// The body vipwatch POSTs to each webhook endpoint (Standard Webhooks; signed with the
/// `webhook-id`, `webhook-timestamp` and `webhook-signature` headers).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = WebhookPayload)]
pub struct WebhookPayloadSchema {
    /// `service.added`, `service.modified`, `service.deleted` or `service.synced`.
    #[serde(rename = "type")]
    #[schema(pattern = "^service\\.(added|modified|deleted|synced)$")]
    pub kind: String,
    /// When the change was observed, RFC 3339 UTC with milliseconds.
    #[schema(format = DateTime)]
    pub timestamp: String,
    /// The change.
    pub data: WebhookDataSchema,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ServiceKey, ServiceView};
    use crate::relay::payload::{PayloadInput, render};

    fn view() -> ServiceView {
        let svc = serde_json::json!({"metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"a": "b"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}], "loadBalancerIP": "192.0.2.9"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP"}]}}});
        let mut v = ServiceView::from_service(&serde_json::from_value(svc).unwrap());
        v.allocation = Some(crate::model::Allocation::pending("pool `lab` exhausted".into()));
        v
    }

    #[test]
    fn the_service_view_mirror_has_exactly_the_serialized_fields() {
        let json = serde_json::to_value(view()).unwrap();
        let mirror: ServiceViewSchema = serde_json::from_value(json.clone()).expect("every field is there");
        assert_eq!(serde_json::to_value(mirror).unwrap(), json, "and no other one");
    }

    #[test]
    fn the_payload_mirror_has_exactly_the_serialized_fields() {
        let (v, key) = (view(), ServiceKey::new("shop", "web"));
        let body = render(&PayloadInput {
            event_id: Some(7),
            event: "MODIFIED",
            cause: "watch",
            observed_at: 1_767_225_600_000,
            key: &key,
            uid: "u-1",
            resource_version: "42",
            view: &v,
            previous: Some(&v),
            changed: &["ports"],
        });
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mirror: WebhookPayloadSchema = serde_json::from_value(json.clone()).expect("every field is there");
        assert_eq!(serde_json::to_value(mirror).unwrap(), json, "and no other one");
    }
}
