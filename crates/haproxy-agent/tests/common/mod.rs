//! Test harness: a real `haproxy` (Debian's, on PATH), the agent in-process on 127.0.0.1:0, "pods" that
//! answer every TCP connection with their name, signed deliveries built from the contract's types,
//! and VIPs in 127.100.0.0/16 (every loopback address is local: no setup needed).

#![allow(dead_code)]

/// The workspace's one policy for a program a test needs (tests/common/require.rs): skip with a
/// `SKIPPED` line locally, fail under CI.
#[path = "../../../../tests/common/require.rs"]
pub mod require;

pub use require::require_tool;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use vipwatch_contract::{BackendMode, BackendPort, Backends, Member, MemberState, WebhookPayload};
use vipwatch_haproxy::AgentConfig;

pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A fresh VIP `127.100.X.Y`, unique within the test process.
pub fn vip() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) + (std::process::id() % 200) * 250;
    format!("127.100.{}.{}", (n / 250) % 250, n % 250 + 1)
}

/// A pod: answers every connection with `name\n` and closes.
pub async fn pod(name: &str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reply = format!("{name}\n");
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let reply = reply.clone();
            tokio::spawn(async move {
                let _ = s.write_all(reply.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// What a connection to `addr` reads (`Err` when refused or reset).
pub async fn hit(addr: &str) -> Result<String, String> {
    let io = async {
        let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.map_err(|e| e.to_string())?;
        Ok(out.trim().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), io).await.map_err(|_| "timeout".to_owned())?
}

/// The agent with its own directory; HAProxy stops with it.
pub struct Agent {
    pub dir: TempDir,
    pub running: Option<vipwatch_haproxy::Running>,
    pub url: String,
    pub client: reqwest::Client,
}

impl Agent {
    /// The agent, or `None` without `haproxy` ([`require_tool`]'s policy: the test then returns).
    pub async fn start() -> Option<Self> {
        require_tool("haproxy")?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let mut a = Self { dir, running: None, url: String::new(), client: reqwest::Client::new() };
        a.restart().await;
        Some(a)
    }

    pub fn config(&self) -> AgentConfig {
        AgentConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            secrets: vec![SECRET.into()],
            dir: self.dir.path().to_owned(),
            server_slots: 4,
            batch_window: Duration::from_millis(50),
            reload_timeout: Duration::from_secs(5),
            // A new event log under a known cluster name (a replaced vipwatch database) takes it over
            // after 1 s of silence from the old one, not 10 min.
            cluster_takeover_after: Duration::from_secs(1),
            stop_haproxy_on_exit: true,
            ..AgentConfig::default()
        }
    }

    /// Starts (again) with the same directory; HAProxy keeps running across it.
    pub async fn restart(&mut self) {
        let mut config = self.config();
        config.stop_haproxy_on_exit = false;
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = vipwatch_haproxy::start(config, listener).await.expect("agent starts");
        self.url = format!("http://{}", running.addr);
        self.running = Some(running);
    }

    /// POSTs `payload` signed with `secret` under `id`; returns the status and the body.
    pub async fn send_as(&self, payload: &WebhookPayload, id: &str, secret: &str) -> (u16, Value) {
        post(&self.client, &self.url, &serde_json::to_value(payload).unwrap(), id, secret).await
    }

    /// POSTs any JSON `body`, signed with the right secret under a fresh id.
    pub async fn send_json(&self, body: &Value) -> (u16, Value) {
        post(&self.client, &self.url, body, &fresh_id(), SECRET).await
    }

    /// [`Self::send_as`] with the right secret and a fresh id.
    pub async fn send(&self, payload: &WebhookPayload) -> (u16, Value) {
        self.send_as(payload, &fresh_id(), SECRET).await
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = self.client.get(format!("{}{path}", self.url)).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// The master's reload counter (`show proc`).
    pub async fn reloads(&self) -> u64 {
        let h = vipwatch_haproxy::haproxy::Haproxy::new("haproxy".as_ref(), self.dir.path());
        h.show_proc().await.unwrap().reloads
    }

    pub fn config_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.cfg")).unwrap()
    }

    pub async fn stop(mut self) {
        let h = vipwatch_haproxy::haproxy::Haproxy::new("haproxy".as_ref(), self.dir.path());
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
        h.stop().await;
    }
}

impl Drop for Agent {
    /// A failed test still stops its HAProxy (it runs in a process group of its own).
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("haproxy.pid")) {
            let _ = std::process::Command::new("kill").args(["-TERM", pid.trim()]).status();
        }
    }
}

/// POSTs `body` to the agent at `url`, signed with `secret` under `id`; the status and the answer.
pub async fn post(client: &reqwest::Client, url: &str, body: &Value, id: &str, secret: &str) -> (u16, Value) {
    let body = body.to_string();
    let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let signature = standardwebhooks::Webhook::new(secret).unwrap().sign(id, ts, body.as_bytes()).unwrap();
    let r = client
        .post(format!("{url}/hooks/vip"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A fresh `webhook-id`.
pub fn fresh_id() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    format!("msg_test{:08}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A Service `shop/<name>` (uid `uid-<name>`) on `vip` with TCP `ports`, members `(port index, pod,
/// state)` in mode pod, as vipwatch delivers it.
pub fn delivery(
    kind: &str,
    event_id: i64,
    name: &str,
    vip: &str,
    ports: &[i32],
    members: &[(usize, SocketAddr, MemberState)],
) -> WebhookPayload {
    let ports_json: Vec<Value> = ports.iter().map(|p| json!({"name": format!("p{p}"), "protocol": "TCP", "port": p, "targetPort": "8080", "nodePort": null, "appProtocol": null})).collect();
    let backend_ports = ports
        .iter()
        .enumerate()
        .map(|(i, p)| BackendPort {
            name: Some(format!("p{p}").into()),
            protocol: "TCP".into(),
            port: *p,
            members: members
                .iter()
                .filter(|(pi, _, _)| *pi == i)
                .map(|(_, a, state)| Member {
                    address: a.ip().to_string().into(),
                    port: a.port().into(),
                    state: *state,
                    node_name: None,
                    zone: None,
                })
                .collect(),
        })
        .collect();
    let backends = Backends {
        mode: BackendMode::Pod,
        revision: event_id as u64,
        hash: format!("sha256:{event_id}"),
        health_check: None,
        reason: None,
        ports: backend_ports,
    };
    let event = match kind {
        "service.added" => "ADDED",
        "service.modified" => "MODIFIED",
        "service.deleted" => "DELETED",
        _ => "SYNCED",
    };
    let body = json!({
        "type": kind, "timestamp": "2026-12-01T00:00:00.000Z",
        "data": {"event_id": if event == "SYNCED" { Value::Null } else { json!(event_id) }, "event": event,
                 "cause": if event == "SYNCED" { "resync" } else { "watch" },
                 "service": {"namespace": "shop", "name": name, "uid": format!("uid-{name}"), "resourceVersion": event_id.to_string(),
                             "vips": [vip], "type": "LoadBalancer", "loadBalancerClass": null, "ports": ports_json,
                             "selector": {}, "externalTrafficPolicy": "Cluster", "healthCheckNodePort": null,
                             "sessionAffinity": "None", "sessionAffinityTimeoutSeconds": null, "loadBalancerSourceRanges": [],
                             "externalIPs": [], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                             "allocateLoadBalancerNodePorts": null, "loadBalancerIP": null, "requestedIPs": [], "ingress": [],
                             "labels": {}, "annotations": {}, "allocation": null, "finalizers": [], "deleting": false,
                             "backends": backends},
                 "previous": null, "changed": []}});
    serde_json::from_value(body).unwrap()
}

pub fn active(i: usize, a: SocketAddr) -> (usize, SocketAddr, MemberState) {
    (i, a, MemberState::Active)
}

/// Waits until `check` holds, failing the test with `what` after [`DEADLINE`].
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await; // ok: polling a condition under a deadline
    }
}

/// Sends a full resync `id` of the default cluster, as vipwatch does: each of `services` (built with
/// [`delivery`]) as a `service.synced` marked `index` of `total`, then the `sync.completed`. Returns
/// each answer's status, the `sync.completed`'s last.
pub async fn resync(agent: &Agent, id: &str, services: &[WebhookPayload]) -> Vec<u16> {
    let total = services.len() as u64;
    let mut statuses = Vec::new();
    for (i, s) in services.iter().enumerate() {
        let mut d = s.clone();
        d.kind = vipwatch_contract::PayloadType::ServiceSynced;
        d.data.event = vipwatch_contract::EventKind::Synced;
        d.data.event_id = None;
        d.data.cause = vipwatch_contract::Cause::Resync;
        d.data.sync = Some(vipwatch_contract::SyncMarker {
            id: id.into(),
            index: Some(i as u64 + 1),
            total,
            as_of_event_id: Some(1_000_000),
        });
        statuses.push(agent.send(&d).await.0);
    }
    let mut done: WebhookPayload = serde_json::from_value(json!({
        "type": "sync.completed", "timestamp": "2026-12-01T00:00:00.000Z",
        "data": {"event_id": null, "event": "SYNCED", "cause": "resync", "previous": null, "changed": []}}))
    .unwrap();
    done.data.sync =
        Some(vipwatch_contract::SyncMarker { id: id.into(), index: None, total, as_of_event_id: Some(1_000_000) });
    statuses.push(agent.send(&done).await.0);
    statuses
}

/// A response's receiver identity headers (`vipwatch_contract::receiver`).
pub fn identity(headers: &reqwest::header::HeaderMap) -> Option<vipwatch_contract::ReceiverIdentity> {
    vipwatch_contract::ReceiverIdentity::from_headers(|name| headers.get(name).and_then(|v| v.to_str().ok()))
}
