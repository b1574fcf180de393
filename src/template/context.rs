//! The data model templates see (docs/reference/templates.md). Event mode: the default payload's
//! fields lifted to the top (`service`, `previous`, `changed`, `backends`, `vips`, ...) and `told`,
//! what this endpoint last acknowledged for the Service; full-state mode: `services`, every in-scope
//! Service in the same shape as `service`.

use minijinja::Value;
use minijinja::value::Serde;
use serde_json::{Map, Value as Json, json};
use vipwatch_contract::{Backends, WebhookService};

use crate::store::ServiceRow;

/// The context of an event-mode request, from the stored default payload `payload` (the outbox's
/// exact JSON): `type`, `timestamp`, `event`, `event_id`, `cause`, `log_id`, `service`, `previous`,
/// `changed`, `backends` (= `service.backends`), `backends_diff`, `vips` (= `service.vips`), `sync`,
/// `cluster` (the cluster's name, `data.cluster`), plus `told` (the `service` value of the last
/// delivery of this Service the endpoint acknowledged, from table `told`; `None`, `none` to
/// templates, when it never acknowledged one or acknowledged its `DELETED` since), `webhook.name`,
/// `secrets` and `captured` (values captured by earlier requests). Absent fields are `none`, so
/// `{% if previous %}` works under strict undefined.
pub fn event_context(
    payload: &Json,
    webhook: &str,
    secrets: &Json,
    told: Option<&Json>,
    captured: &Map<String, Json>,
) -> Value {
    let data = &payload["data"];
    let service = &data["service"];
    let ctx = json!({
        "type": payload["type"],
        "timestamp": payload["timestamp"],
        "event": data["event"],
        "event_id": data["event_id"],
        "cause": data["cause"],
        "log_id": data["log_id"],
        "cluster": data["cluster"],
        "service": service,
        "previous": data["previous"],
        "changed": data.get("changed").cloned().unwrap_or_else(|| json!([])),
        "backends": service["backends"],
        "backends_diff": data["backendsDiff"],
        "vips": service.get("vips").cloned().unwrap_or_else(|| json!([])),
        "sync": data["sync"],
        "told": told,
        "webhook": {"name": webhook},
        "secrets": secrets,
        "captured": captured,
    });
    Value::from(Serde(ctx))
}

/// The context of a full-state request: `services` (sorted by namespace and name, each shaped as an
/// event's `service`), `cluster` (the cluster's name: a declaration covers one cluster, so each
/// cluster declares a tenant or object set of its own), `timestamp` (RFC 3339, render time),
/// `webhook.name`, `secrets`, `captured`.
pub fn full_state_context(
    services: Vec<Json>,
    cluster: Option<&str>,
    timestamp: &str,
    webhook: &str,
    secrets: &Json,
    captured: &Map<String, Json>,
) -> Value {
    let ctx = json!({
        "services": services,
        "cluster": cluster,
        "timestamp": timestamp,
        "webhook": {"name": webhook},
        "secrets": secrets,
        "captured": captured,
    });
    Value::from(Serde(ctx))
}

/// One Service of the state table in the payload's `service` shape, with `backends` (the members in
/// the endpoint's mode, `None` for mode `none`).
pub fn service_value(row: &ServiceRow, backends: Option<&Backends>) -> Json {
    let s = WebhookService {
        namespace: row.key.namespace.to_string(),
        name: row.key.name.to_string(),
        uid: row.uid.clone(),
        resource_version: row.resource_version.clone(),
        vips: row.view.vips(),
        view: std::sync::Arc::new(row.view.clone()),
        backends: backends.cloned(),
    };
    serde_json::to_value(s).expect("a service serializes")
}
