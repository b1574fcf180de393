//! Load-balancer hosts as network namespaces, built from the shipped files
//! (`deploy/haproxy-agent/`): the bridge, the hosts' keepalived and `vipwatch-haproxy`, and a client
//! that records which requests through a VIP were answered. Used by `tests/lb_pair.rs` and
//! `benches/failover.rs`; needs root, `ip`, `keepalived`, `haproxy` and `curl`.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The tools the pair needs, or why this run cannot build it.
pub fn missing_prerequisite() -> Option<String> {
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

/// Runs `ip ARGS`, failing the test with its stderr when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("`ip` runs");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// The namespaces, veth pairs and bridge of one test run. Dropping it kills every process in its
/// namespaces and removes them (and with them the veth pairs).
pub struct Net {
    /// Prefix of the namespaces' names and name of the test namespace's veth end: `vwp<pid>n<n>`
    /// for the test process's `n`th network.
    pub prefix: String,
    /// The third octet of the network's `198.18.S.0/24` (RFC 2544 benchmarking space): the first
    /// one, from an offset of the pid and `n`, that no route of this machine uses yet, so that two
    /// networks on one machine (two test runs at once) do not share a route.
    pub subnet: u8,
}

/// The first `S` in 1..=250, counting on from `offset`, whose `198.18.S.0/24` no route of the test's
/// namespace uses and no other network of this process took.
fn free_subnet(offset: u32) -> u8 {
    static TAKEN: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());
    let mut mine = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    let taken = |s: u32| {
        let out = std::process::Command::new("ip").args(["-4", "route", "show", &format!("198.18.{s}.0/24")]).output();
        mine.contains(&s) || out.map(|o| !o.stdout.is_empty()).unwrap_or(false)
    };
    let free = (0..250).map(|i| (offset + i) % 250 + 1).find(|s| !taken(*s));
    mine.extend(free);
    u8::try_from(free.expect("a free 198.18.S.0/24 (250 in use?)")).expect("at most 250")
}

impl Net {
    const HOSTS: [&'static str; 3] = ["lb1", "lb2", "cl"];

    pub fn build() -> Self {
        static BUILT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let (pid, n) = (std::process::id(), BUILT.fetch_add(1, Ordering::Relaxed));
        let net = Self { prefix: format!("vwp{pid}n{n}"), subnet: free_subnet((pid * 8 + n) % 250) };
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

    pub fn ns(&self, host: &str) -> String {
        format!("{}-{host}", self.prefix)
    }

    pub fn ip(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.subnet, last)
    }

    /// The host of the pair whose `eth0` holds `vip` right now (keepalived's MASTER).
    pub fn holder(&self, vip: Ipv4Addr) -> Option<&'static str> {
        self.holders(vip).first().copied()
    }

    /// Every host of the pair whose `eth0` holds `vip` right now.
    pub fn holders(&self, vip: Ipv4Addr) -> Vec<&'static str> {
        ["lb1", "lb2"]
            .into_iter()
            .filter(|host| {
                let out = Command::new("ip").args(["-n", &self.ns(host), "-o", "addr", "show", "dev", "eth0"]).output();
                out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(" {vip}/")))
            })
            .collect()
    }

    /// Cuts the two load-balancer hosts off from each other (`on`) while both still reach the client
    /// and the test's namespace (bridge port isolation), or joins them again: a split brain.
    pub fn split(&self, on: bool) {
        for host in ["lb1", "lb2"] {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.ns("sw"), "bridge", "link", "set", "dev", host, "isolated"])
                .arg(if on { "on" } else { "off" })
                .output()
                .expect("`bridge` runs");
            assert!(out.status.success(), "bridge link set {host}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    /// Takes `host`'s link to the bridge down (`up` false) or up again.
    pub fn link(&self, host: &str, up: bool) {
        ip(&["-n", &self.ns(host), "link", "set", "eth0", if up { "up" } else { "down" }]);
    }

    pub fn remove(&self) {
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
pub fn shipped(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy-agent").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `keepalived.conf` as shipped, with the example VIPs replaced by `vips` and, for the second host,
/// the priority its comment gives.
pub fn keepalived_conf(vips: &[Ipv4Addr], second: bool) -> String {
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
pub fn agent_toml(dir: &Path) -> String {
    let text = shipped("vipwatch-haproxy.toml");
    let text = text.replace("/var/lib/vipwatch-haproxy", &dir.join("agent").display().to_string());
    text.replace("/etc/vipwatch-haproxy/webhook-secret", &dir.join("webhook-secret").display().to_string())
}

/// The systemd unit's `ExecStart` and `Environment`, with the binary and configuration paths replaced.
pub fn agent_command(config: &Path) -> (Vec<String>, Vec<(String, String)>) {
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
pub fn agent_binary() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_vipwatch")).with_file_name("vipwatch-haproxy");
    assert!(bin.exists(), "{} is missing: run the tests with `cargo test --workspace`", bin.display());
    bin
}

/// One load-balancer host: its namespace and directory, its keepalived and its agent (HAProxy is the
/// agent's child in its own process group, as under systemd).
pub struct Host {
    pub name: &'static str,
    pub ns: String,
    pub dir: PathBuf,
    pub keepalived: Option<std::process::Child>,
    pub agent: Option<std::process::Child>,
}

impl Host {
    pub fn new(net: &Net, root: &Path, name: &'static str, vips: &[Ipv4Addr], secret: &str) -> Self {
        let ns = net.ns(name);
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("agent")).unwrap();
        std::fs::write(dir.join("webhook-secret"), secret).unwrap();
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
    pub fn spawn(&self, argv: &[String], env: &[(String, String)], log: &str) -> std::process::Child {
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

    pub fn start_agent(&mut self) {
        let (argv, env) = agent_command(&self.dir.join("vipwatch-haproxy.toml"));
        self.agent = Some(self.spawn(&argv, &env, "agent.log"));
    }

    /// Starts keepalived, with fresh pid files as after a reboot (`/run` is empty then; a killed
    /// keepalived's children may linger as zombies, which keepalived takes for a running daemon).
    pub fn start_keepalived(&mut self) {
        for pid_file in ["keepalived.pid", "vrrp.pid", "checkers.pid"] {
            let _ = std::fs::remove_file(self.dir.join(pid_file));
        }
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
    pub fn kill_agent(&mut self) {
        let mut agent = self.agent.take().expect("the agent runs");
        agent.kill().unwrap();
        agent.wait().unwrap();
    }

    /// The host loses power: every process in its namespace (keepalived and its children, the agent,
    /// HAProxy) is SIGKILLed.
    pub fn power_off(&mut self) {
        let pids = Command::new("ip").args(["netns", "pids", &self.ns]).output().unwrap();
        for pid in String::from_utf8_lossy(&pids.stdout).lines() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
        for child in [self.keepalived.take(), self.agent.take()].into_iter().flatten() {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILLs HAProxy's master and workers on this host; returns how many processes that was.
    pub fn kill_haproxy(&self) -> usize {
        let pids = Command::new("ip").args(["netns", "pids", &self.ns]).output().unwrap();
        let mut killed = 0;
        for pid in String::from_utf8_lossy(&pids.stdout).lines() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "haproxy" && Command::new("kill").args(["-KILL", pid]).status().is_ok_and(|s| s.success())
            {
                killed += 1;
            }
        }
        killed
    }

    /// What this host's agent answers on `GET /healthz`, from the test's namespace.
    pub async fn healthz(&self, net: &Net) -> Option<u16> {
        let host = if self.name == "lb1" { net.ip(11) } else { net.ip(12) };
        let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build().unwrap();
        let answer = client.get(format!("http://{host}:9080/healthz")).send().await.ok()?;
        Some(answer.status().as_u16())
    }

    pub fn log(&self, name: &str) -> String {
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
pub type Seen = Arc<Mutex<Vec<(Instant, bool)>>>;

/// A client in namespace `ns` asking `GET http://VIP/` over a new connection every 20 ms until
/// dropped; an answer counts when it is a Pod's `hello from pod`.
pub struct Client {
    pub seen: Seen,
    pub stop: Arc<AtomicBool>,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    pub fn start(ns: &str, vip: SocketAddr) -> Self {
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

    pub fn seen(&self) -> Vec<(Instant, bool)> {
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
pub fn request(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: vip\r\n\r\n").ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    Some(body)
}

/// From the client's record: the first answered request after `since`, and how many failed between
/// `since` and it.
pub fn recovery(seen: &[(Instant, bool)], since: Instant) -> Option<(Duration, usize)> {
    let after: Vec<_> = seen.iter().filter(|(at, _)| *at >= since).collect();
    let first_failed = after.iter().position(|(_, ok)| !ok);
    let back = match first_failed {
        None => after.first()?,
        Some(i) => after[i..].iter().find(|(_, ok)| *ok)?,
    };
    let failed = after.iter().filter(|(at, ok)| !ok && *at < back.0).count();
    Some((back.0 - since, failed))
}

/// Runs `f` on this thread inside namespace `ns` (a blocking call, from `spawn_blocking`), then
/// returns the thread to the namespace it was in.
pub fn in_namespace<T>(ns: &str, f: impl FnOnce() -> T) -> T {
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

/// The other host of the pair.
pub fn other(host: &str) -> &'static str {
    if host == "lb1" { "lb2" } else { "lb1" }
}
