//! The demo appliance: an HTTP receiver that verifies each delivery's Standard Webhooks signature
//! (`standardwebhooks` crate) and prints one readable line per request. Used by `vipwatch demo` and,
//! on its own, by `vipwatch demo-receiver` (the example appliance of `docker-compose.yml`).
//!
//! Routes: `GET /healthz` answers 200 `ok`; a `POST` to any other path is a delivery: 204 when the
//! signature verifies, 401 when it does not, 400 when a verified body is not a vipwatch payload.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use standardwebhooks::Webhook;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use vipwatch_contract::{Cause, WebhookPayload};

use super::say;

/// The appliance could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApplianceError {
    /// The secret is not a Standard Webhooks secret (`whsec_` + base64).
    #[error("the webhook secret is not a Standard Webhooks secret (`whsec_` + base64 key)")]
    Secret,
    /// The listener's address is unknown.
    #[error("demo appliance: cannot read the listener's address")]
    Io(#[from] std::io::Error),
}

/// A running demo appliance; stops on [`Appliance::shutdown`].
pub struct Appliance {
    addr: SocketAddr,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Appliance {
    /// Serves on `listener`, verifying signatures with `secret` (`whsec_…`) and printing one line per
    /// request to stdout. Errors: [`ApplianceError`].
    pub async fn start(listener: TcpListener, secret: &str) -> Result<Self, ApplianceError> {
        let verifier = Arc::new(Webhook::new(secret).map_err(|_| ApplianceError::Secret)?);
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .fallback_service(post(receive).with_state(verifier).fallback(|| async { StatusCode::METHOD_NOT_ALLOWED }));
        let cancel = CancellationToken::new();
        let stop = cancel.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
                tracing::error!(error = %e, "demo appliance stopped");
            }
        });
        Ok(Self { addr, cancel, task })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL vipwatch delivers to: `http://ADDR/hooks/vip`.
    pub fn url(&self) -> String {
        format!("http://{}/hooks/vip", self.addr)
    }

    /// Resolves if the server ends on its own (it should not).
    pub async fn stopped(&mut self) {
        let _ = (&mut self.task).await;
    }

    /// Stops accepting and waits for open requests to finish.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// One delivery: verify, then print `appliance  ✓ …` (204) or `appliance  ✗ …` (401 / 400).
async fn receive(State(verifier): State<Arc<Webhook>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let msg_id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or("(none)").to_owned();
    if let Err(e) = verifier.verify(&body, &headers) {
        say(&format!("appliance  ✗ rejected {msg_id}: {e} → 401"));
        return StatusCode::UNAUTHORIZED;
    }
    match serde_json::from_slice::<WebhookPayload>(&body) {
        Ok(payload) => {
            say(&format!("appliance  ✓ {}", describe(&payload)));
            StatusCode::NO_CONTENT
        }
        Err(e) => {
            say(&format!("appliance  ✗ signed, but not a vipwatch payload ({e}) → 400"));
            StatusCode::BAD_REQUEST
        }
    }
}

/// One line for a delivery, e.g.
/// `service.modified  shop/web  vips=[192.0.2.10] ports=80/TCP,443/TCP  (changed: ports)`.
/// The parenthesis lists the changed fields, and the cause unless it is `watch`; it is left out when
/// both are empty. With members, `members=N` counts them (active and draining) over every port.
pub fn describe(p: &WebhookPayload) -> String {
    let Some(s) = &p.data.service else {
        let sync = p.data.sync.as_ref().map(|s| format!("{} of {} Services", s.id, s.total)).unwrap_or_default();
        return format!("{:<16}  {sync}", p.kind.as_str());
    };
    let ports: Vec<String> = s.view.ports.iter().map(|port| format!("{}/{}", port.port, port.protocol)).collect();
    let mut notes = Vec::new();
    if !p.data.changed.is_empty() {
        notes.push(format!("changed: {}", p.data.changed.join(", ")));
    }
    if p.data.cause != Cause::Watch {
        notes.push(format!("cause: {}", p.data.cause.as_str()));
    }
    let notes = if notes.is_empty() { String::new() } else { format!("  ({})", notes.join("; ")) };
    let members = s.backends.as_ref().map(|b| format!(" members={}", b.members().count())).unwrap_or_default();
    let key = format!("{}/{}", s.namespace, s.name);
    format!("{:<16}  {key:<16}  vips=[{}] ports={}{members}{notes}", p.kind.as_str(), s.vips.join(","), ports.join(","))
}

#[cfg(test)]
mod tests {
    use vipwatch_contract::{Cause, EventKind, ServiceView};

    use super::*;
    use crate::model::ServiceKey;
    use crate::route::payload::{PayloadInput, payload};

    fn delivery(event: EventKind, cause: Cause, ports: serde_json::Value, changed: &[&str]) -> WebhookPayload {
        let svc = serde_json::json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer", "ports": ports},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}});
        let view = ServiceView::from_service(&serde_json::from_value(svc).unwrap());
        let key = ServiceKey::new("shop", "web");
        payload(&PayloadInput {
            event_id: Some(1),
            log_id: "log",
            cluster: Some("demo"),
            event,
            cause,
            observed_at: 0,
            key: &key,
            uid: "u",
            resource_version: "1",
            view: &std::sync::Arc::new(view),
            previous: None,
            changed,
            backends: None,
            backends_diff: None,
            sync: None,
        })
    }

    #[test]
    fn a_modified_delivery_reads_as_one_line_with_its_changed_fields() {
        let ports = serde_json::json!([{"port": 80}, {"name": "https", "port": 443}]);
        let p = delivery(EventKind::Modified, Cause::Watch, ports, &["ports"]);
        assert_eq!(
            describe(&p),
            "service.modified  shop/web          vips=[192.0.2.10] ports=80/TCP,443/TCP  (changed: ports)"
        );
    }

    #[test]
    fn a_startup_delivery_names_its_cause() {
        let p = delivery(EventKind::Added, Cause::Startup, serde_json::json!([{"port": 443}]), &[]);
        assert_eq!(
            describe(&p),
            "service.added     shop/web          vips=[192.0.2.10] ports=443/TCP  (cause: startup)"
        );
    }
}
