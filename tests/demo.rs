//! `vipwatch demo` as a user runs it: the built binary on a free port, with a fast script and a
//! temporary directory. Its appliance prints verified deliveries, its API shows events and succeeded
//! deliveries, and SIGTERM stops it with status 0.

mod common;

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{require_tool, wait_until};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// A running `vipwatch demo` and everything it printed so far.
struct Demo {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

impl Demo {
    /// Starts `vipwatch demo ARGS... --dir DIR` with `env` and no other `VIPWATCH_*` variable.
    fn start(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vipwatch"));
        cmd.arg("demo").args(args).arg("--dir").arg(dir);
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("VIPWATCH_")) {
            cmd.env_remove(key);
        }
        cmd.envs(env.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().expect("vipwatch demo starts");
        let (stdout, out_reader) = collect(child.stdout.take().unwrap());
        let (stderr, err_reader) = collect(child.stderr.take().unwrap());
        Self { child, stdout, stderr, readers: vec![out_reader, err_reader] }
    }

    fn lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits until some stdout line satisfies `pred`; returns it.
    async fn line(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        wait_until(what, || async { self.lines().into_iter().find(|l| pred(l)) }).await
    }

    /// Waits (at most 10 s) for the process to exit and its output to be read to the end.
    async fn exit(&mut self) -> ExitStatus {
        let readers = std::mem::take(&mut self.readers);
        let exited = async {
            let status = self.child.wait().await.unwrap();
            for reader in readers {
                reader.await.unwrap();
            }
            status
        };
        match tokio::time::timeout(Duration::from_secs(10), exited).await {
            Ok(status) => status,
            Err(_) => panic!("the demo did not exit within 10 s; stderr: {:?}", self.stderr.lock().unwrap()),
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
}

/// Collects the lines of `stream` as they arrive, until its end (when the task finishes).
fn collect(stream: impl AsyncRead + Unpin + Send + 'static) -> (Arc<Mutex<Vec<String>>>, JoinHandle<()>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    let reader = tokio::spawn(async move {
        let mut reader = BufReader::new(stream).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            sink.lock().unwrap().push(line);
        }
    });
    (lines, reader)
}

async fn get_items(client: &reqwest::Client, url: &str) -> Vec<Value> {
    let body: Value = client.get(url).send().await.unwrap().json().await.unwrap();
    body["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn the_demo_relays_verified_changes_serves_them_and_stops_on_sigterm() {
    vipwatch::relay::sender::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    // 1 s between steps: longer than the backends window (100 ms), so each step is its own delivery
    // even on a loaded machine (a shorter interval merges the create and the port change).
    let mut demo = Demo::start(&["--listen", "127.0.0.1:0", "--interval", "1s"], dir.path(), &[]);
    let api = demo.line("the API URL", |l| l.starts_with("  API ")).await;
    let api = api.trim_start_matches("  API").trim().to_owned();
    assert!(api.starts_with("http://127.0.0.1:") && !api.ends_with(":0"), "{api}");

    // shop/web sends its two Pods (mode pod) for each of its two ports; the others their three Nodes.
    let startup = "appliance  ✓ service.added     shop/web          vips=[127.0.100.10] ports=8080/TCP,8443/TCP members=4  (cause: startup)";
    demo.line("shop/web's startup delivery", |l| l == startup).await;
    demo.line("the scripted create", |l| l == "demo       create Service shop/checkout (port 8080/TCP) and its Pod")
        .await;
    let added = "appliance  ✓ service.added     shop/checkout     vips=[127.0.100.3] ports=8080/TCP members=3";
    demo.line("the created Service's delivery", |l| l == added).await;
    let ports = "appliance  ✓ service.modified  shop/checkout     vips=[127.0.100.3] ports=8080/TCP,8443/TCP members=6  (changed: ports, backends)";
    demo.line("the port change's delivery", |l| l == ports).await;
    demo.line("the deletion's delivery", |l| l.starts_with("appliance  ✓ service.deleted   shop/checkout ")).await;
    let rolled = "appliance  ✓ service.modified  shop/web          vips=[127.0.100.10] ports=8080/TCP,8443/TCP members=4  (changed: backends; cause: backends)";
    demo.line("the rolled Pods' one MODIFIED", |l| l == rolled).await;
    let dropped = "appliance  ✓ service.modified  shop/cart         vips=[127.0.100.2] ports=8080/TCP members=2  (changed: backends; cause: backends)";
    demo.line("the excluded Node dropped from nodePort members", |l| l == dropped).await;
    // Resumed by a re-watch (cause watch) or a re-list, as vipwatch sees fit.
    let cut = "appliance  ✓ service.modified  payments/gateway  vips=[127.0.100.1] ports=8443/TCP members=2  (changed: labels";
    demo.line("the change made under a cut watch", |l| {
        [format!("{cut})"), format!("{cut}; cause: relist)")].iter().any(|c| c == l)
    })
    .await;
    demo.line("the forged delivery's rejection", |l| l == "appliance  ✗ rejected msg_forged: signature invalid → 401")
        .await;

    let client = reqwest::Client::new();
    let events = get_items(&client, &format!("{api}/api/v1/events")).await;
    assert!(events.len() >= 7, "4 at startup, then the script's: {events:?}");
    let succeeded = get_items(&client, &format!("{api}/api/v1/deliveries?state=succeeded")).await;
    assert!(succeeded.len() >= 7, "{succeeded:?}");
    let endpoints = ["demo-appliance", "haproxy"];
    assert!(succeeded.iter().all(|d| endpoints.contains(&d["webhook"].as_str().unwrap()) && d["state"] == "succeeded"));
    // Without HAProxy the demo runs on and says so (outside CI; under CI a missing HAProxy fails).
    if require_tool("haproxy").is_some() {
        // The demo's HAProxy serves the VIPs: the banner's curl reaches one of shop/web's Pods.
        demo.line("the VIP's curl", |l| l.starts_with("  via a VIP    curl -s http://127.0.100.10:8080/")).await;
        let body = wait_until("shop/web's Pods answering through the VIP", || async {
            let r = client.get("http://127.0.100.10:8080/").send().await.ok()?;
            r.text().await.ok().filter(|b| b.ends_with("(shop/web)\n"))
        })
        .await;
        assert!(body.starts_with("hello from pod 127.0."), "{body}");
    } else {
        demo.line("the note on HAProxy", |l| l.starts_with("  HAProxy      not installed")).await;
    }

    let pid = demo.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = demo.exit().await;
    assert_eq!(status.code(), Some(0), "stderr: {}", demo.stderr());
    demo.line("the last line", |l| l == "demo       stopped").await;
    assert!(dir.path().join("vipwatch.toml").is_file() && dir.path().join("vipwatch.db").is_file());
}

#[tokio::test]
async fn a_taken_listen_address_fails_with_a_hint() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut demo = Demo::start(&["--listen", &addr], dir.path(), &[]);
    assert_eq!(demo.exit().await.code(), Some(1));
    let expected = format!(
        "vipwatch: cannot listen on {addr} (`--listen 127.0.0.1:0` picks a free port): Address already in use (os error 98)"
    );
    assert_eq!(demo.stderr(), expected);
}

#[tokio::test]
async fn a_variable_that_would_point_the_demo_at_another_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("production.db");
    let env = [("VIPWATCH_DATABASE__PATH", elsewhere.to_str().unwrap())];
    let mut demo = Demo::start(&["--listen", "127.0.0.1:0"], dir.path(), &env);
    assert_eq!(demo.exit().await.code(), Some(1));
    assert_eq!(
        demo.stderr(),
        "vipwatch: VIPWATCH_DATABASE__PATH is set and would replace the demo's own `database.path`; unset it to run the demo"
    );
    assert!(!elsewhere.exists(), "nothing was written there");
}

#[tokio::test]
async fn a_killed_demo_takes_its_haproxy_with_it() {
    let Some(_haproxy) = require_tool("haproxy") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut demo = Demo::start(&["--listen", "127.0.0.1:0"], dir.path(), &[]);
    demo.line("the banner's HAProxy line", |l| l.starts_with("  HAProxy      a real HAProxy")).await;
    let pid_file = dir.path().join("haproxy/haproxy.pid");
    let master = wait_until("HAProxy's pid file", || async {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse::<u32>().ok()
    })
    .await;
    assert!(Path::new(&format!("/proc/{master}")).exists());

    // SIGKILL: no shutdown code runs, yet the VIPs must not stay bound by an orphaned HAProxy.
    demo.child.start_kill().unwrap();
    assert_eq!(demo.exit().await.code(), None);
    wait_until("the orphaned HAProxy master to exit", || async {
        let stat = std::fs::read_to_string(format!("/proc/{master}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for init to reap it.
        (stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z")).then_some(())
    })
    .await;
}
