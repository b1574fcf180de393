//! The whole chain over real sockets: the simulated Kubernetes API → `vipwatch` (pool VIPs, members in
//! mode pod) → signed deliveries → the HAProxy agent → a real `haproxy` → TCP through the VIP to a
//! "pod". Creating a Service makes its VIP answer; moving its endpoints moves the traffic without a
//! reload; deleting it makes the VIP refuse connections.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vipwatch::fake_apiserver::Resource;
use vipwatch::model::backends::{MODE_ANNOTATION, ModeSetting, SERVICE_NAME_LABEL};

/// A pod on `ip` answering every connection with `name`; returns its address.
async fn pod(ip: &str, port: u16, name: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(format!("{name}\n").as_bytes()).await;
            let _ = s.shutdown().await;
        }
    });
    addr
}

/// What one connection to `addr` reads; `None` when it is refused or reset.
async fn hit(addr: &str) -> Option<String> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out.trim().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), io).await.ok().flatten()
}

fn slice(svc: &str, port: u16, ips: &[&str]) -> Value {
    let endpoints: Vec<Value> =
        ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-1"), "namespace": "shop", "labels": {SERVICE_NAME_LABEL: svc}},
        "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": port}], "endpoints": endpoints})
}

#[tokio::test]
async fn a_service_gets_a_vip_that_reaches_its_pods_follows_its_endpoints_and_goes_away() {
    let Some(_haproxy) = require_tool("haproxy") else { return };
    vipwatch::relay::sender::install_crypto_provider();
    let h = Harness::new().await;
    // The agent, with HAProxy, in a directory of its own.
    let agent_dir = tempfile::tempdir().unwrap();
    let agent_config = vipwatch_haproxy::AgentConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        secrets: vec![receiver::SECRET.into()],
        dir: agent_dir.path().to_owned(),
        batch_window: Duration::from_millis(20),
        stop_haproxy_on_exit: true,
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let agent = vipwatch_haproxy::start(agent_config, listener).await.expect("the agent starts");
    // Pods on two loopback addresses, the same port.
    let a = pod("127.0.7.1", 0, "pod-a").await;
    let b = pod("127.0.7.2", a.port(), "pod-b").await;

    let mut config = h.config_with(vec![webhook("lb", &format!("http://{}/hooks/vipwatch", agent.addr))]);
    config.backends.mode = ModeSetting::Pod;
    let pool = format!("127.101.{}.0/28", std::process::id() % 250);
    config.pools =
        vec![toml::from_str(&format!("name = \"lab\"\naddresses = [\"{pool}\"]\navoid_buggy_ips = true")).unwrap()];
    let vw = h.start(config).await;

    let mut svc = lb_service("shop", "web", 18090);
    svc["metadata"]["annotations"] = json!({ MODE_ANNOTATION: "pod" });
    h.api.apply(svc);
    h.api.apply_resource(Resource::EndpointSlices, slice("web", a.port(), &["127.0.7.1"]));
    let vip = wait_until("the VIP in the Service's status", || async {
        let svc = h.api.get("shop", "web")?;
        svc.pointer("/status/loadBalancer/ingress/0/ip")?.as_str().map(str::to_owned)
    })
    .await;
    let addr = format!("{vip}:18090");
    wait_until("the VIP reaches pod-a", || async { (hit(&addr).await.as_deref() == Some("pod-a")).then_some(()) })
        .await;

    let haproxy = vipwatch_haproxy::haproxy::Haproxy::new("haproxy".as_ref(), agent_dir.path());
    let reloads = haproxy.show_proc().await.unwrap().reloads;
    h.api.apply_resource(Resource::EndpointSlices, slice("web", b.port(), &["127.0.7.2"]));
    wait_until("the traffic follows the endpoints to pod-b", || async {
        (hit(&addr).await.as_deref() == Some("pod-b")).then_some(())
    })
    .await;
    assert_eq!(haproxy.show_proc().await.unwrap().reloads, reloads, "a member change needs no reload");

    assert!(h.api.delete("shop", "web"));
    wait_until("the VIP refuses connections", || async { hit(&addr).await.is_none().then_some(()) }).await;
    vw.stop().await.unwrap();
    agent.stop().await;
}
