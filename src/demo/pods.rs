//! The demo's "pods": one tiny HTTP server per EndpointSlice address (`127.0.R.H:8080`, every loopback
//! address is local), answering `hello from pod <address> (<namespace>/<name>)`, so a request through a
//! VIP on the demo's HAProxy shows which pod served it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use axum::Router;
use axum::routing::get;
use tokio::task::JoinHandle;

/// The port every demo pod listens on (the Services' target port).
pub const POD_PORT: u16 = 8080;

/// The running pods, by address.
#[derive(Default)]
pub struct Pods {
    running: Mutex<HashMap<IpAddr, JoinHandle<()>>>,
}

impl Pods {
    /// Starts a pod on `ip` for Service `owner` unless one runs there already. A pod that cannot bind
    /// (the address or port is taken) is skipped with a warning: the demo goes on.
    pub async fn ensure(&self, ip: IpAddr, owner: &str) {
        if self.running.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&ip) {
            return;
        }
        let listener = match tokio::net::TcpListener::bind(SocketAddr::new(ip, POD_PORT)).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%ip, error = %e, "demo pod cannot listen");
                return;
            }
        };
        let body = format!("hello from pod {ip} ({owner})\n");
        let app = Router::new().fallback(get(move || std::future::ready(body.clone())));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(ip, task);
    }

    /// Stops every pod.
    pub fn stop(&self) {
        for (_, task) in self.running.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            task.abort();
        }
    }
}
