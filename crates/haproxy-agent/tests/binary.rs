//! The `vipwatch-haproxy` binary as systemd runs it: configured through `VIPWATCH_HAPROXY_CONFIG`
//! and `VIPWATCH_HAPROXY_LOG` (which are not keys), with its log on a full disk (`/dev/full`), one
//! agent per directory.

mod common;

use std::io::Read;
use std::process::{Child, Command, Stdio};

use common::*;

/// The agent binary with no other `VIPWATCH_HAPROXY_*` variable than `env`.
fn agent(env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vipwatch-haproxy"));
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("VIPWATCH_HAPROXY_")) {
        cmd.env_remove(key);
    }
    cmd.envs(env.iter().copied()).stdin(Stdio::null()).stdout(Stdio::null());
    cmd
}

/// A port nobody listens on right now, for an agent started at once. It is closed again, so another
/// listener could be given it before the agent binds it: safe here only because this binary's one
/// test binds nothing else until the agent is healthy (the second agent listens on port 0).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_systemd_way_with_its_log_on_a_full_disk_keeps_applying_and_keeps_one_agent_per_directory() {
    let Some(_haproxy) = require_tool("haproxy") else { return };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("vipwatch-haproxy.toml");
    let toml = format!(
        "listen = \"127.0.0.1:{port}\"\nsecrets = [\"{SECRET}\"]\ndir = \"{}\"\nbatch_window = \"20ms\"\nstop_haproxy_on_exit = true\n",
        dir.path().join("state").display()
    );
    std::fs::write(&config, toml).unwrap();
    let env = [("VIPWATCH_HAPROXY_CONFIG", config.to_str().unwrap()), ("VIPWATCH_HAPROXY_LOG", "debug")];
    // Every log line fails with ENOSPC.
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let first = Running(agent(&env).stderr(full).spawn().unwrap());
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let healthy = || async { client.get(format!("{url}/healthz")).send().await.is_ok_and(|r| r.status() == 200) };
    let answers = || async { client.get(format!("{url}/healthz")).send().await.is_ok() };
    wait_until("the agent to answer", answers).await;
    // A first start is not caught up until vipwatch's first full resync (an empty one here).
    let completed = serde_json::json!({"type": "sync.completed", "timestamp": "2026-12-01T00:00:00.000Z",
        "data": {"event_id": null, "event": "SYNCED", "cause": "resync", "previous": null, "changed": [],
                 "sync": {"id": "sync_1", "index": null, "total": 0, "as_of_event_id": 0}}});
    assert_eq!(post(&client, &url, &completed, &fresh_id(), SECRET).await.0, 200);
    assert!(healthy().await);

    let a = pod("a").await;
    let vip = vip();
    let added = serde_json::to_value(delivery("service.added", 1, "web", &vip, &[18090], &[active(0, a)])).unwrap();
    assert_eq!(post(&client, &url, &added, &fresh_id(), SECRET).await, (200, serde_json::json!({"status": "applied"})));
    assert_eq!(hit(&format!("{vip}:18090")).await.as_deref(), Ok("a"));

    // HAProxy killed: the agent, logging about it into the full disk, brings it back.
    let pid = std::fs::read_to_string(dir.path().join("state/haproxy.pid")).unwrap();
    assert!(Command::new("kill").args(["-KILL", pid.trim()]).status().unwrap().success());
    wait_until("HAProxy back, serving the VIP", || async {
        hit(&format!("{vip}:18090")).await.as_deref() == Ok("a") && healthy().await
    })
    .await;
    let modified =
        serde_json::to_value(delivery("service.modified", 2, "web", &vip, &[18090], &[active(0, a)])).unwrap();
    assert_eq!(post(&client, &url, &modified, &fresh_id(), SECRET).await.0, 200);

    // A second agent on the same directory (another port) refuses to start, and says why.
    let mut second = agent(&env).env("VIPWATCH_HAPROXY_LISTEN", "127.0.0.1:0").stderr(Stdio::piped()).spawn().unwrap();
    let status = second.wait().unwrap();
    let mut err = String::new();
    second.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    let expected = format!(
        "vipwatch-haproxy: another vipwatch-haproxy already runs with dir {0} (it holds {0}/agent.lock); one agent per directory",
        dir.path().join("state").display()
    );
    assert_eq!(err.lines().last(), Some(expected.as_str()), "{err}");
    // Healthy again at once if a reload's moment of silence on the master CLI was caught.
    wait_until("the first agent untouched and healthy", healthy).await;

    let mut first = first;
    assert!(Command::new("kill").args(["-TERM", &first.0.id().to_string()]).status().unwrap().success());
    assert_eq!(first.0.wait().unwrap().code(), Some(0));
}
