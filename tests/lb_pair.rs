//! A pair of load-balancer hosts, built from the shipped files: two network namespaces (`lb1`, `lb2`),
//! each running keepalived with `deploy/haproxy-agent/keepalived.conf`, `vipwatch-haproxy` as its
//! systemd unit starts it with `vipwatch-haproxy.toml`, and the HAProxy the agent runs; the sysctl file
//! applied in each. A client namespace (`cl`) makes requests to the VIPs; the test's own namespace
//! holds vipwatch, the simulated apiserver and the Pods (HTTP servers), all on one bridge (in a `sw`
//! namespace). Only addresses and paths differ from the shipped files.
//!
//! ```text
//!        198.18.S.0/24 bridge (ns sw)
//!   ┌─────────┬──────────┬──────────┬────────────────────────┐
//!  cl .100   lb1 .11    lb2 .12    test ns .1 (vipwatch, apiserver, Pods .51)
//!            VIPs .200-.203 on whichever host keepalived makes MASTER
//! ```
//!
//! Needs root, `ip`, `keepalived`, `haproxy` and `curl` (the shipped track script's).

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tempfile::TempDir;
use vipwatch::app::Running;
use vipwatch::config::Config;
use vipwatch::fake_apiserver::Resource;
use vipwatch::model::backends::{MODE_ANNOTATION, ModeSetting, SERVICE_NAME_LABEL};
use vipwatch::store::DeliveryFilter;

/// The tools the pair needs, or why this run cannot build it.
fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    for tool in ["ip", "keepalived", "haproxy", "curl"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Some(format!("`{tool}` is not installed (`.ci/run` installs it)"));
        }
    }
    None
}

/// Whether the pair can run here: under `CI` a missing prerequisite fails the test, elsewhere it is
/// skipped with the reason printed.
fn can_run() -> bool {
    let Some(why) = missing_prerequisite() else { return true };
    assert!(std::env::var_os("CI").is_none(), "the load-balancer pair test cannot run: {why}");
    eprintln!("SKIPPED: the load-balancer pair test: {why}");
    false
}

/// Runs `ip ARGS`, failing the test with its stderr when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("`ip` runs");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// The namespaces, veth pairs and bridge of one test run. Dropping it kills every process in its
/// namespaces and removes them (and with them the veth pairs).
struct Net {
    /// Prefix of the namespaces' names and name of the test namespace's veth end: `vwp<pid>n<n>`
    /// for the test process's `n`th network.
    prefix: String,
    /// The third octet of the network's `198.18.S.0/24` (RFC 2544 benchmarking space), from the pid
    /// and `n`, so that two networks on one machine do not share a route.
    subnet: u8,
}

impl Net {
    const HOSTS: [&'static str; 3] = ["lb1", "lb2", "cl"];

    fn build() -> Self {
        static BUILT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let (pid, n) = (std::process::id(), BUILT.fetch_add(1, Ordering::Relaxed));
        let net = Self { prefix: format!("vwp{pid}n{n}"), subnet: ((pid * 8 + n) % 250) as u8 + 1 };
        net.remove();
        let sw = net.ns("sw");
        ip(&["netns", "add", &sw]);
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        for (host, last) in Self::HOSTS.iter().zip([11, 12, 100]) {
            let ns = net.ns(host);
            ip(&["netns", "add", &ns]);
            ip(&["link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", host, "netns", &sw]);
            ip(&["-n", &sw, "link", "set", host, "master", "br0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", net.ip(last)), "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        ip(&["link", "add", &net.prefix, "type", "veth", "peer", "name", "test", "netns", &sw]);
        ip(&["-n", &sw, "link", "set", "test", "master", "br0", "up"]);
        for last in [1, 51] {
            ip(&["addr", "add", &format!("{}/24", net.ip(last)), "dev", &net.prefix]);
        }
        ip(&["link", "set", &net.prefix, "up"]);
        net
    }

    fn ns(&self, host: &str) -> String {
        format!("{}-{host}", self.prefix)
    }

    fn ip(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.subnet, last)
    }

    /// The host of the pair whose `eth0` holds `vip` right now (keepalived's MASTER).
    fn holder(&self, vip: Ipv4Addr) -> Option<&'static str> {
        ["lb1", "lb2"].into_iter().find(|host| {
            let out = Command::new("ip").args(["-n", &self.ns(host), "-o", "addr", "show", "dev", "eth0"]).output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(" {vip}/")))
        })
    }

    /// Takes `host`'s link to the bridge down (`up` false) or up again.
    fn link(&self, host: &str, up: bool) {
        ip(&["-n", &self.ns(host), "link", "set", "eth0", if up { "up" } else { "down" }]);
    }

    fn remove(&self) {
        for host in Self::HOSTS.iter().chain(&["sw"]) {
            let ns = self.ns(host);
            let pids = Command::new("ip").args(["netns", "pids", &ns]).output();
            for pid in pids.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default().lines() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
            let _ = Command::new("ip").args(["netns", "del", &ns]).stderr(Stdio::null()).status();
        }
        let _ = Command::new("ip").args(["link", "del", &self.prefix]).stderr(Stdio::null()).status();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The repository's `deploy/haproxy-agent/NAME`.
fn shipped(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy-agent").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `keepalived.conf` as shipped, with the example VIPs replaced by `vips` and, for the second host,
/// the priority its comment gives.
fn keepalived_conf(vips: &[Ipv4Addr], second: bool) -> String {
    let mut out = Vec::new();
    let mut listed = false;
    for line in shipped("keepalived.conf").lines() {
        if line.trim_start().starts_with("192.0.2.") {
            if !listed {
                out.extend(vips.iter().map(|vip| format!("        {vip}/24 dev eth0")));
                listed = true;
            }
            continue;
        }
        if second && line.trim_start().starts_with("priority 100") {
            out.push(line.replacen("priority 100", "priority 90", 1));
            continue;
        }
        out.push(line.to_owned());
    }
    assert!(listed, "the shipped keepalived.conf lists its example VIPs as 192.0.2.x lines");
    out.join("\n") + "\n"
}

/// `vipwatch-haproxy.toml` as shipped, with the agent's directory and secret file under `dir`.
fn agent_toml(dir: &Path) -> String {
    let text = shipped("vipwatch-haproxy.toml");
    let text = text.replace("/var/lib/vipwatch-haproxy", &dir.join("agent").display().to_string());
    text.replace("/etc/vipwatch-haproxy/webhook-secret", &dir.join("webhook-secret").display().to_string())
}

/// The systemd unit's `ExecStart` and `Environment`, with the binary and configuration paths replaced.
fn agent_command(config: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let unit = shipped("vipwatch-haproxy.service");
    let value = |key: &str| unit.lines().filter_map(|l| l.strip_prefix(key)).map(str::to_owned).collect::<Vec<_>>();
    let exec = value("ExecStart=").pop().expect("the unit has an ExecStart");
    let binary = agent_binary().display().to_string();
    let exec = exec
        .replace("/usr/local/bin/vipwatch-haproxy", &binary)
        .replace("/etc/vipwatch-haproxy/vipwatch-haproxy.toml", &config.display().to_string());
    let env =
        value("Environment=").iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
    (exec.split_whitespace().map(str::to_owned).collect(), env)
}

/// The workspace's `vipwatch-haproxy` binary, beside vipwatch's (`cargo test --workspace` builds both).
fn agent_binary() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_vipwatch")).with_file_name("vipwatch-haproxy");
    assert!(bin.exists(), "{} is missing: run the tests with `cargo test --workspace`", bin.display());
    bin
}

/// One load-balancer host: its namespace and directory, its keepalived and its agent (HAProxy is the
/// agent's child in its own process group, as under systemd).
struct Host {
    name: &'static str,
    ns: String,
    dir: PathBuf,
    keepalived: Option<std::process::Child>,
    agent: Option<std::process::Child>,
}

impl Host {
    fn new(net: &Net, root: &Path, name: &'static str, vips: &[Ipv4Addr]) -> Self {
        let ns = net.ns(name);
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("agent")).unwrap();
        std::fs::write(dir.join("webhook-secret"), receiver::SECRET).unwrap();
        std::fs::write(dir.join("vipwatch-haproxy.toml"), agent_toml(&dir)).unwrap();
        std::fs::write(dir.join("keepalived.conf"), keepalived_conf(vips, name == "lb2")).unwrap();
        let sysctl = root.join("90-vipwatch-haproxy.conf");
        std::fs::write(&sysctl, shipped("90-vipwatch-haproxy.conf")).unwrap();
        let out = Command::new("ip").args(["netns", "exec", &ns, "sysctl", "-q", "-p"]).arg(&sysctl).output();
        let out = out.unwrap();
        assert!(out.status.success(), "sysctl -p in {ns}: {}", String::from_utf8_lossy(&out.stderr));
        Self { name, ns, dir, keepalived: None, agent: None }
    }

    /// Runs `argv` in the host's namespace, its output appended to `DIR/<log>.log`.
    fn spawn(&self, argv: &[String], env: &[(String, String)], log: &str) -> std::process::Child {
        let file = || std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(log)).unwrap();
        Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .args(argv)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file())
            .stderr(file())
            .spawn()
            .unwrap_or_else(|e| panic!("{} in {}: {e}", argv[0], self.ns))
    }

    fn start_agent(&mut self) {
        let (argv, env) = agent_command(&self.dir.join("vipwatch-haproxy.toml"));
        self.agent = Some(self.spawn(&argv, &env, "agent.log"));
    }

    fn start_keepalived(&mut self) {
        let path = |f: &str| self.dir.join(f).display().to_string();
        let argv = vec![
            "keepalived".to_owned(),
            "--dont-fork".to_owned(),
            "--log-console".to_owned(),
            "--use-file".to_owned(),
            path("keepalived.conf"),
            "--pid".to_owned(),
            path("keepalived.pid"),
            "--vrrp_pid".to_owned(),
            path("vrrp.pid"),
            "--checkers_pid".to_owned(),
            path("checkers.pid"),
        ];
        self.keepalived = Some(self.spawn(&argv, &[], "keepalived.log"));
    }

    /// SIGKILLs the agent (HAProxy keeps running, as `KillMode=process` leaves it).
    fn kill_agent(&mut self) {
        let mut agent = self.agent.take().expect("the agent runs");
        agent.kill().unwrap();
        agent.wait().unwrap();
    }

    /// SIGKILLs HAProxy's master and workers on this host.
    fn kill_haproxy(&self) {
        let pids = Command::new("ip").args(["netns", "pids", &self.ns]).output().unwrap();
        for pid in String::from_utf8_lossy(&pids.stdout).lines() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "haproxy" {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
    }

    /// What this host's agent answers on `GET /healthz`, from the test's namespace.
    async fn healthz(&self, net: &Net) -> Option<u16> {
        let host = if self.name == "lb1" { net.ip(11) } else { net.ip(12) };
        let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build().unwrap();
        let answer = client.get(format!("http://{host}:9080/healthz")).send().await.ok()?;
        Some(answer.status().as_u16())
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        for child in [self.keepalived.as_mut(), self.agent.as_mut()].into_iter().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What the client saw: `(when, answered)` per request, in order.
type Seen = Arc<Mutex<Vec<(Instant, bool)>>>;

/// A client in namespace `ns` asking `GET http://VIP/` over a new connection every 20 ms until
/// dropped; an answer counts when it is a Pod's `hello from pod`.
struct Client {
    seen: Seen,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    fn start(ns: &str, vip: SocketAddr) -> Self {
        let seen = Seen::default();
        let stop = Arc::new(AtomicBool::new(false));
        let netns = std::fs::File::open(format!("/run/netns/{ns}")).expect("the client namespace exists");
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            // SAFETY: setns on an open namespace file moves this thread (only) into that namespace.
            let entered = unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(entered, 0, "setns: {}", std::io::Error::last_os_error());
            while !st.load(Ordering::Relaxed) {
                let answered = request(vip).is_some_and(|body| body.contains("hello from pod"));
                s.lock().unwrap().push((Instant::now(), answered));
                std::thread::sleep(Duration::from_millis(20)); // ok: the client's request rate
            }
        });
        Self { seen, stop, thread: Some(thread) }
    }

    fn seen(&self) -> Vec<(Instant, bool)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One HTTP/1.0 `GET /` to `addr`, with 300 ms to connect and 1 s to answer.
fn request(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: vip\r\n\r\n").ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    Some(body)
}

/// From the client's record: the first answered request after `since`, and how many failed between
/// `since` and it.
fn recovery(seen: &[(Instant, bool)], since: Instant) -> Option<(Duration, usize)> {
    let after: Vec<_> = seen.iter().filter(|(at, _)| *at >= since).collect();
    let first_failed = after.iter().position(|(_, ok)| !ok);
    let back = match first_failed {
        None => after.first()?,
        Some(i) => after[i..].iter().find(|(_, ok)| *ok)?,
    };
    let failed = after.iter().filter(|(at, ok)| !ok && *at < back.0).count();
    Some((back.0 - since, failed))
}

/// The pair with vipwatch delivering to both agents.
struct Pair {
    net: Net,
    _root: TempDir,
    hosts: Vec<Host>,
    h: Harness,
    vw: Option<Running>,
    pod: SocketAddr,
}

impl Pair {
    async fn start() -> Self {
        init_logs();
        let net = Net::build();
        let root = tempfile::tempdir().unwrap();
        let vips: Vec<Ipv4Addr> = (200..204).map(|last| net.ip(last)).collect();
        let mut hosts = vec![Host::new(&net, root.path(), "lb1", &vips), Host::new(&net, root.path(), "lb2", &vips)];
        for host in &mut hosts {
            host.start_agent();
            host.start_keepalived();
        }
        let pod = pod(SocketAddr::from((net.ip(51), 8080))).await;
        let h = Harness::new().await;
        let vw = Some(h.start(Self::config(&h, &net)).await);
        Self { net, _root: root, hosts, h, vw, pod }
    }

    fn config(h: &Harness, net: &Net) -> Config {
        let url = |last| format!("http://{}:9080/hooks/vipwatch", net.ip(last));
        let host = |name: &str, last| {
            let mut w = webhook(name, &url(last));
            w.appliance = Some("pair".into());
            w
        };
        let mut config = h.config_with(vec![host("lb1", 11), host("lb2", 12)]);
        config.backends.mode = ModeSetting::Pod;
        let pool = format!("name = \"pair\"\naddresses = [\"{}-{}\"]", net.ip(200), net.ip(203));
        config.pools = vec![toml::from_str(&pool).unwrap()];
        config
    }

    fn host(&mut self, name: &str) -> &mut Host {
        self.hosts.iter_mut().find(|h| h.name == name).unwrap()
    }

    /// Creates Service `eval/<name>` on port 80 with the Pod as its one member; returns its VIP once
    /// its status shows one.
    async fn service(&self, name: &str) -> Ipv4Addr {
        let mut svc = lb_service("eval", name, 80);
        svc["metadata"]["annotations"] = json!({ MODE_ANNOTATION: "pod" });
        self.h.api.apply(svc);
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "eval", "labels": {SERVICE_NAME_LABEL: name}},
            "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": self.pod.port()}],
            "endpoints": [{"addresses": [self.pod.ip().to_string()], "conditions": {"ready": true}}]});
        self.h.api.apply_resource(Resource::EndpointSlices, slice);
        let what = format!("a VIP in eval/{name}'s status");
        let vip = wait_until(&what, || async {
            let svc = self.h.api.get("eval", name)?;
            svc.pointer("/status/loadBalancer/ingress/0/ip")?.as_str().map(str::to_owned)
        })
        .await;
        vip.parse().unwrap()
    }

    /// Waits until `vip` answers from the client namespace; returns the host holding it.
    async fn wait_serving(&self, vip: Ipv4Addr) -> &'static str {
        let ns = self.net.ns("cl");
        wait_until(&format!("{vip}:80 answers from the client namespace"), || async {
            let holder = self.net.holder(vip)?;
            let ns = ns.clone();
            let answered = tokio::task::spawn_blocking(move || in_namespace(&ns, || request((vip, 80).into())))
                .await
                .unwrap()
                .is_some_and(|b| b.contains("hello from pod"));
            answered.then_some(holder)
        })
        .await
    }

    /// Waits until `host` holds `vip`.
    async fn wait_holder(&self, vip: Ipv4Addr, host: &str) {
        wait_until(&format!("{vip} on {host}"), || async { (self.net.holder(vip) == Some(host)).then_some(()) }).await;
    }

    fn describe(&self) -> String {
        let logs = self.hosts.iter().map(|h| {
            let tail = |s: String| {
                let lines: Vec<&str> = s.lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n")
            };
            let (keepalived, agent) = (tail(h.log("keepalived.log")), tail(h.log("agent.log")));
            format!("--- {} keepalived:\n{keepalived}\n--- {} agent:\n{agent}", h.name, h.name)
        });
        logs.collect::<Vec<_>>().join("\n")
    }

    async fn stop(mut self) {
        if let Some(vw) = self.vw.take() {
            vw.stop().await.unwrap();
        }
    }
}

/// Runs `f` on this thread inside namespace `ns` (a blocking call, from `spawn_blocking`), then
/// returns the thread to the namespace it was in.
fn in_namespace<T>(ns: &str, f: impl FnOnce() -> T) -> T {
    let own = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
    let target = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    // SAFETY: setns on open namespace files moves only this thread; it is moved back before returning.
    unsafe {
        assert_eq!(libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET), 0, "setns into {ns}");
        let out = f();
        assert_eq!(libc::setns(own.as_raw_fd(), libc::CLONE_NEWNET), 0, "setns back");
        out
    }
}

/// A Pod at `addr`: an HTTP server answering every request with `hello from pod <ip>`.
async fn pod(addr: SocketAddr) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("the Pod's address is free");
    let body = format!("hello from pod {}\n", addr.ip());
    let app = axum::Router::new().fallback(axum::routing::get(move || std::future::ready(body.clone())));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// The other host of the pair.
fn other(host: &str) -> &'static str {
    if host == "lb1" { "lb2" } else { "lb1" }
}

/// Waits until the client's record shows it answered again after `lost` (and the VIP is on a host);
/// returns how long after `lost` the first answer came and how many requests failed before it.
async fn recovered(client: &Client, lost: Instant) -> (Duration, usize) {
    wait_until("an answer through the VIP after the loss", || async {
        let seen = client.seen();
        let last_ok = seen.last().is_some_and(|(at, ok)| *ok && *at > lost);
        last_ok.then(|| recovery(&seen, lost)).flatten()
    })
    .await;
    recovery(&client.seen(), lost).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_the_active_host_moves_every_vip_to_the_standby_which_serves_every_service() {
    if !can_run() {
        return;
    }
    let mut pair = Pair::start().await;
    let web = pair.service("web").await;
    let api = pair.service("api").await;
    let active = pair.wait_serving(web).await;
    assert_eq!(pair.wait_serving(api).await, active, "one host holds every VIP");
    let client = Client::start(&pair.net.ns("cl"), (web, 80).into());
    wait_until("the client's first answer", || async { client.seen().iter().any(|(_, ok)| *ok).then_some(()) }).await;

    // The agent is SIGKILLed on the active host: keepalived's track script fails, the VIPs move.
    let lost = Instant::now();
    pair.host(active).kill_agent();
    let standby = other(active);
    pair.wait_holder(web, standby).await;
    let (back, failed) = recovered(&client, lost).await;
    eprintln!("agent killed on {active}: answered from {standby} after {back:?}, {failed} failed requests");
    assert_eq!(pair.wait_serving(api).await, standby, "every Service answers on the standby\n{}", pair.describe());
    pair.host(active).start_agent();
    wait_until(&format!("{active}'s agent healthy again"), || async {
        (pair.hosts.iter().find(|h| h.name == active).unwrap().healthz(&pair.net).await == Some(200)).then_some(())
    })
    .await;

    // HAProxy is SIGKILLed on the host now active: its agent starts it again.
    let active = standby;
    let lost = Instant::now();
    pair.host(active).kill_haproxy();
    let (back, failed) = recovered(&client, lost).await;
    let holder_now = pair.wait_serving(web).await;
    eprintln!("HAProxy killed on {active}: answered from {holder_now} after {back:?}, {failed} failed requests");
    assert_eq!(pair.wait_serving(api).await, holder_now, "every Service answers\n{}", pair.describe());

    // The active host's link goes down: VRRP adverts stop, the other host takes the VIPs.
    let active = holder_now;
    let lost = Instant::now();
    pair.net.link(active, false);
    let standby = other(active);
    pair.wait_holder(web, standby).await;
    let (back, failed) = recovered(&client, lost).await;
    eprintln!("link of {active} down: answered from {standby} after {back:?}, {failed} failed requests");
    assert_eq!(pair.wait_serving(api).await, standby, "every Service answers on the standby\n{}", pair.describe());
    drop(client);
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pair_is_one_appliance_a_new_service_gets_its_status_while_one_host_is_down() {
    if !can_run() {
        return;
    }
    let mut pair = Pair::start().await;
    let web = pair.service("web").await;
    let active = pair.wait_serving(web).await;
    let standby = other(active);
    pair.host(standby).kill_agent();
    pair.host(standby).kill_haproxy();

    let api = pair.service("api").await;
    assert_eq!(pair.wait_serving(api).await, active, "the active host serves the new Service");
    let store = &pair.vw.as_ref().unwrap().store;
    let filter = DeliveryFilter { name: Some("api".into()), webhook: Some(standby.into()), ..Default::default() };
    let to_standby = store.deliveries(&filter).await.unwrap();
    assert_eq!(to_standby.iter().map(|d| d.state.as_str()).collect::<Vec<_>>(), ["pending"], "{to_standby:?}");
    pair.stop().await;
}
