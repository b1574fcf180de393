//! Two or three real `vipwatch serve` processes on one PostgreSQL database, the simulated API and
//! recording receivers: SIGKILL, SIGSTOP and SIGTERM of the leader. Test timings: lease
//! TTL 3 s, renewed every 500 ms.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../common/mod.rs"]
mod common;

use common::receiver::{Receiver, Reply, SECRET};
use common::*;
use vipwatch::store::DeliveryFilter;

/// The lease TTL of these tests (`database.leader_ttl`).
const TTL: Duration = Duration::from_secs(3);
/// Attempts in flight per replica (`relay.concurrency`): the most a fail-over may repeat.
const CONCURRENCY: usize = 8;

/// One `vipwatch serve` process.
struct Replica {
    name: &'static str,
    api: String,
    child: tokio::process::Child,
    /// Every line it logged so far.
    logs: Logs,
}

/// The lines a replica logged (its stderr), in order.
type Logs = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

impl Replica {
    /// Starts replica `name` on `h`'s database, delivering to `rx`, with addresses from 10.9.0.0/22.
    async fn start(h: &Harness, name: &'static str, rx: &Receiver) -> Self {
        Self::start_with(h, name, rx, &[]).await
    }

    /// [`Replica::start`] with `env` (`VIPWATCH_*` overrides) on top of its config file.
    async fn start_with(h: &Harness, name: &'static str, rx: &Receiver, env: &[(&str, &str)]) -> Self {
        vipwatch::relay::sender::install_crypto_provider(); // for this test's own HTTP clients
        let config_path = h.dir.path().join(format!("{name}.toml"));
        let config = format!(
            "[kubernetes]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nleader_ttl = \"3s\"\nleader_renew = \"500ms\"\n\
             replica = \"{name}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
             [relay]\nconcurrency = {CONCURRENCY}\npoll_interval = \"100ms\"\nlease = \"5s\"\n\
             [[pools]]\nname = \"lab\"\naddresses = [\"10.9.0.0/22\"]\n\
             [[webhooks]]\nname = \"lab\"\nurl = \"{}\"\nsecret = \"{SECRET}\"\ntimeout = \"2s\"\n\
             retry = {{ initial_delay = \"50ms\", max_delay = \"500ms\" }}\n",
            h.api.url(),
            h.pg_url.as_deref().expect("PostgreSQL harness"),
            rx.url
        );
        std::fs::write(&config_path, config).unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_vipwatch"))
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env("VIPWATCH_LOG", "warn,vipwatch::app=info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = Logs::default();
        Self { name, api: api_url(name, stderr, logs.clone()).await, child, logs }
    }

    /// How many lines it logged so far: a mark for [`Replica::logged_since`].
    fn log_mark(&self) -> usize {
        self.logs.lock().unwrap().len()
    }

    /// The lines it logged after `mark`.
    fn logged_since(&self, mark: usize) -> Vec<String> {
        self.logs.lock().unwrap()[mark..].to_vec()
    }

    /// `GET /readyz`: the status and the body (the problem's `detail` when not ready).
    async fn readyz(&self) -> (u16, String) {
        let resp = reqwest::get(format!("{}/readyz", self.api)).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        match serde_json::from_str::<Value>(&body) {
            Ok(problem) => (status, problem["detail"].as_str().unwrap_or_default().to_owned()),
            Err(_) => (status, body),
        }
    }

    /// `GET /api/v1/status`'s `leader`, when the replica answers.
    async fn leader(&self) -> Option<Value> {
        let status: Value = reqwest::get(format!("{}/api/v1/status", self.api)).await.ok()?.json().await.ok()?;
        Some(status["leader"].clone())
    }

    /// The value of the unlabelled sample `name` on `/metrics`.
    async fn metric(&self, name: &str) -> Option<f64> {
        let text = reqwest::get(format!("{}/metrics", self.api)).await.ok()?.text().await.ok()?;
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Waits until this replica's role is `role` (`leader`, `follower`).
    async fn wait_role(&self, role: &str) {
        wait_until(&format!("{} is {role}", self.name), || async {
            (self.role().await.as_deref() == Some(role)).then_some(())
        })
        .await;
    }

    async fn role(&self) -> Option<String> {
        Some(self.leader().await?["role"].as_str()?.to_owned())
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self.child.id().expect("running") as libc::pid_t;
        // SAFETY: sends a signal to our own child process.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
}

/// The API's base URL, from the replica's `API listening addr=…` log line (it listens on port 0: a
/// port picked here and bound later by the child could be given to another test meanwhile). The
/// child's log goes on to this process's stderr, as if inherited, and into `logs`.
async fn api_url(name: &str, stderr: tokio::process::ChildStderr, logs: Logs) -> String {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let keep = logs.clone();
    let find = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            eprintln!("{line}");
            keep.lock().unwrap().push(line.clone());
            if let Some((_, rest)) = line.split_once("API listening addr=") {
                return rest.split_whitespace().next().unwrap().to_owned();
            }
        }
        panic!("replica {name} ended before its API listened");
    };
    let addr = tokio::time::timeout(DEADLINE, find).await.expect("the replica's API listens");
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
            logs.lock().unwrap().push(line);
        }
    });
    format!("http://{addr}")
}

/// Waits until exactly one of `replicas` says it leads; returns its index.
async fn one_leader(replicas: &[&Replica]) -> usize {
    wait_until("exactly one leader", || async {
        let mut leaders = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            match r.role().await.as_deref() {
                Some("leader") => leaders.push(i),
                Some(_) => {}
                None => return None,
            }
        }
        (leaders.len() == 1).then(|| leaders[0])
    })
    .await
}

/// Every pool address on two Services, in the simulated API's statuses: must stay empty.
fn shared_addresses(h: &Harness) -> Vec<String> {
    let mut owners: HashMap<String, String> = HashMap::new();
    let mut shared = Vec::new();
    for svc in h.api.list() {
        let key = format!("{}/{}", svc["metadata"]["namespace"], svc["metadata"]["name"]);
        for ingress in svc["status"]["loadBalancer"]["ingress"].as_array().into_iter().flatten() {
            if let Some(ip) = ingress["ip"].as_str()
                && let Some(other) = owners.insert(ip.to_owned(), key.clone())
            {
                shared.push(format!("{ip}: {other} and {key}"));
            }
        }
    }
    shared
}

/// Per Service, the event ids the receiver accepted (first arrival of each `webhook-id`), in order of
/// arrival; and how many arrivals repeated a `webhook-id`.
fn arrivals(rx: &Receiver) -> (BTreeMap<String, Vec<i64>>, usize) {
    let mut seen = HashSet::new();
    let mut per_service: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut repeated = 0;
    for hit in rx.accepted() {
        if !seen.insert(hit.header("webhook-id")) {
            repeated += 1;
            continue;
        }
        let body = hit.json();
        let key = format!("{}/{}", body["data"]["service"]["namespace"], body["data"]["service"]["name"]);
        per_service.entry(key).or_default().push(hit.event().1);
    }
    (per_service, repeated)
}

#[tokio::test]
async fn sigkill_of_the_leader_mid_burst_a_follower_takes_over_and_every_change_arrives_in_order_once() {
    let h = Harness::new().await;
    let rx = Receiver::start(|_, _| Reply::After(Duration::from_millis(2), 204)).await;
    let a = Replica::start(&h, "a", &rx).await;
    let b = Replica::start(&h, "b", &rx).await;
    let c = Replica::start(&h, "c", &rx).await;
    let mut replicas = [a, b, c];
    let first = one_leader(&replicas.iter().collect::<Vec<_>>()).await;
    let follower = (first + 1) % 3;
    // A follower's SSE tail from the start: it must see every event exactly once, in order; and its
    // reads must answer throughout.
    let sse = SseLog::follow(format!("{}/api/v1/events/stream?after_id=0", replicas[follower].api));
    let reads = Reads::poll(format!("{}/api/v1/services?limit=5", replicas[follower].api));

    for i in 0..300 {
        h.api.apply(lb_service("burst", &format!("svc-{i:03}"), 80));
    }
    wait_until("part of the burst delivered", || async { (rx.accepted().len() >= 60).then_some(()) }).await;
    replicas[first].child.start_kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    replicas[first].child.wait().await.unwrap();
    let delivered_before = rx.accepted().len();
    assert!(delivered_before < 300, "the kill happened mid-burst ({delivered_before} delivered)");
    let survivors: Vec<&Replica> = replicas.iter().enumerate().filter(|(i, _)| *i != first).map(|(_, r)| r).collect();
    let next = one_leader(&survivors).await;
    let takeover = killed.elapsed();
    assert!(takeover < TTL + Duration::from_secs(3), "takeover took {takeover:?}");
    eprintln!("takeover after SIGKILL: {takeover:?}");
    assert_ne!(survivors[next].name, replicas[first].name);
    for i in 0..100 {
        h.api.update("burst", &format!("svc-{i:03}"), |o| o["metadata"]["labels"]["tier"] = serde_json::json!("gold"));
    }

    let store = h.store().await;
    let deliveries = wait_until("every change delivered and every status written", || async {
        let rows = store.deliveries(&DeliveryFilter::default()).await.unwrap();
        let settled = rows.iter().all(|r| r.state == "succeeded" || r.state == "superseded");
        let modified = rows.iter().filter(|r| r.kind == "MODIFIED" && r.state == "succeeded").count();
        let statuses = h.api.list().iter().filter(|s| s["status"]["loadBalancer"]["ingress"].is_array()).count();
        (settled && modified >= 100 && statuses == 300).then_some(rows)
    })
    .await;
    assert_eq!(shared_addresses(&h), Vec::<String>::new(), "no address on two Services");
    let accepted: HashSet<String> = rx.accepted().iter().map(|hit| hit.header("webhook-id")).collect();
    for d in deliveries.iter().filter(|d| d.state == "succeeded") {
        assert!(accepted.contains(&d.msg_id), "delivery {} ({}) never arrived", d.id, d.key);
    }
    let (per_service, repeated) = arrivals(&rx);
    for (service, ids) in &per_service {
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{service}: arrivals out of order {ids:?}");
    }
    assert!(repeated <= CONCURRENCY, "{repeated} repeated deliveries; only the {CONCURRENCY} in flight may repeat");
    let events = store.events(&vipwatch::store::EventFilter::default()).await.unwrap();
    assert_eq!(events.iter().filter(|e| e.event_type == "ADDED").count(), 300, "every Service recorded once");

    let all: Vec<i64> = events.iter().map(|e| e.id).collect();
    let last = *all.last().unwrap();
    wait_until("the follower's SSE tail reached the last event", || async {
        (sse.ids().last() == Some(&last)).then_some(())
    })
    .await;
    assert_eq!(sse.ids(), all, "the SSE tail saw every event once, in order");
    let (ok, failed) = reads.stop();
    assert!(ok > 0 && failed.is_empty(), "{ok} reads answered, failed: {failed:?}");
    store.close().await;
}

#[tokio::test]
async fn a_leader_paused_past_its_lease_commits_and_sends_nothing_when_it_resumes_and_follows() {
    let h = Harness::new().await;
    let (rx_a, rx_b) = (Receiver::ok().await, Receiver::ok().await);
    let a = Replica::start(&h, "a", &rx_a).await;
    a.wait_role("leader").await;
    let b = Replica::start(&h, "b", &rx_b).await;
    b.wait_role("follower").await;
    for i in 0..10 {
        h.api.apply(lb_service("shop", &format!("web-{i}"), 80));
    }
    wait_until("a delivered the first 10", || async { (rx_a.accepted().len() == 10).then_some(()) }).await;

    a.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    b.wait_role("leader").await;
    assert!(stopped.elapsed() >= TTL - Duration::from_secs(1), "b waited for the lease to expire");
    // While a is paused, its watch connection still receives these: it will read them on resuming.
    for i in 10..20 {
        h.api.apply(lb_service("shop", &format!("web-{i}"), 80));
    }
    wait_until("b delivered the next 10", || async { (rx_b.accepted().len() >= 10).then_some(()) }).await;
    let sent_by_a = rx_a.hits().len();

    a.signal(libc::SIGCONT);
    a.wait_role("follower").await;
    h.api.apply(lb_service("shop", "web-20", 80));
    wait_until("b delivered one more", || async {
        rx_b.accepted().iter().any(|hit| hit.json()["data"]["service"]["name"] == "web-20").then_some(())
    })
    .await;
    assert_eq!(rx_a.hits().len(), sent_by_a, "a sent nothing after it resumed");
    let store = h.store().await;
    let events = store.events(&vipwatch::store::EventFilter::default()).await.unwrap();
    let added: Vec<String> =
        events.iter().filter(|e| e.event_type == "ADDED").map(|e| e.key.name.to_string()).collect();
    let expected: Vec<String> = (0..21).map(|i| format!("web-{i}")).collect();
    assert_eq!(added, expected, "each Service recorded once: a committed nothing after it resumed");
    let status = b.leader().await.unwrap();
    assert_eq!((status["holder"].as_str(), status["epoch"].as_i64()), (Some("b"), Some(2)));
    store.close().await;
}

#[tokio::test]
async fn sigterm_of_the_leader_hands_over_in_under_2_s() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let mut a = Replica::start(&h, "a", &rx).await;
    a.wait_role("leader").await;
    let b = Replica::start(&h, "b", &rx).await;
    b.wait_role("follower").await;
    assert_eq!((a.metric("vipwatch_leader").await, b.metric("vipwatch_leader").await), (Some(1.0), Some(0.0)));
    h.api.apply(lb_service("shop", "web", 80));
    wait_until("the ADDED delivered", || async { (rx.accepted().len() == 1).then_some(()) }).await;

    a.signal(libc::SIGTERM);
    let asked = Instant::now();
    b.wait_role("leader").await;
    let handover = asked.elapsed();
    eprintln!("handover after SIGTERM: {handover:?}");
    assert!(handover < Duration::from_secs(2), "handover took {handover:?}");
    assert!(a.child.wait().await.unwrap().success(), "a stopped cleanly");
    h.api.update("shop", "web", |o| o["metadata"]["labels"]["tier"] = serde_json::json!("gold"));
    wait_until("b delivers the MODIFIED", || async { (rx.accepted().len() == 2).then_some(()) }).await;
    assert_eq!(rx.accepted()[1].event().0, "MODIFIED");
}

/// A PostgreSQL server of this test's own (scripts/pg-test.sh), stopped and removed on drop.
struct OwnServer {
    dir: std::path::PathBuf,
    url: String,
}

impl OwnServer {
    fn start(dir: std::path::PathBuf) -> Self {
        let out = std::process::Command::new(pg_script()).arg("start").arg(&dir).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        Self { dir, url: String::from_utf8(out.stdout).unwrap().trim().to_owned() }
    }

    /// Fast shutdown: every session is cut, and nothing answers until it is started again.
    fn stop(&self) {
        let out = std::process::Command::new(pg_script()).arg("stop").arg(&self.dir).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    /// Fast restart: every session is cut.
    fn restart(&self) {
        let out = std::process::Command::new(pg_script()).arg("restart").arg(&self.dir).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new(pg_script()).arg("stop").arg(&self.dir).status();
    }
}

/// A harness on a fresh database of a PostgreSQL server of the test's own (which the test may stop
/// or restart); skips, or fails under CI, like every PostgreSQL test.
async fn on_own_server() -> (Harness, OwnServer) {
    let _ = pg_server_url();
    let mut h = Harness::on(vipwatch::store::Backend::Sqlite).await;
    let server = OwnServer::start(std::env::temp_dir().join(format!("vw-pg-{}", uuid::Uuid::new_v4().simple())));
    h.pg_url = Some(fresh_pg_database(&server.url).await);
    (h, server)
}

fn pg_script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/pg-test.sh")
}

#[tokio::test]
async fn after_a_restart_of_postgresql_every_replica_recovers_by_itself() {
    let (h, server) = on_own_server().await;
    let rx = Receiver::ok().await;
    let a = Replica::start(&h, "a", &rx).await;
    let b = Replica::start(&h, "b", &rx).await;
    one_leader(&[&a, &b]).await;
    h.api.apply(lb_service("shop", "web-0", 80));
    wait_until("the first ADDED delivered", || async { (rx.accepted().len() == 1).then_some(()) }).await;

    server.restart();
    h.api.apply(lb_service("shop", "web-1", 80));
    one_leader(&[&a, &b]).await;
    wait_until("the change made across the restart delivered", || async {
        rx.accepted().iter().any(|hit| hit.json()["data"]["service"]["name"] == "web-1").then_some(())
    })
    .await;
    for r in [&a, &b] {
        let services: Value = reqwest::get(format!("{}/api/v1/services", r.api)).await.unwrap().json().await.unwrap();
        assert_eq!(services["items"].as_array().map(Vec::len), Some(2), "replica {} reads again", r.name);
    }
}

/// An SSE client of `/api/v1/events/stream` that reconnects with `Last-Event-ID`; collects the ids.
struct SseLog {
    ids: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SseLog {
    fn follow(url: String) -> Self {
        let ids = std::sync::Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
        let log = ids.clone();
        let task = tokio::spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let last = log.lock().unwrap().last().copied();
                let mut req = client.get(&url);
                if let Some(id) = last {
                    req = req.header("Last-Event-ID", id.to_string());
                }
                let Ok(mut resp) = req.send().await else { continue };
                let mut buf = String::new();
                while let Ok(Some(chunk)) = resp.chunk().await {
                    buf.push_str(&String::from_utf8_lossy(&chunk));
                    while let Some(end) = buf.find('\n') {
                        let line: String = buf.drain(..=end).collect();
                        if let Some(id) = line.trim_end().strip_prefix("id:") {
                            log.lock().unwrap().push(id.trim().parse().unwrap());
                        }
                    }
                }
            }
        });
        Self { ids, task }
    }

    fn ids(&self) -> Vec<i64> {
        self.ids.lock().unwrap().clone()
    }
}

impl Drop for SseLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads `url` every 50 ms until stopped; counts the answers and keeps every failure.
struct Reads {
    ok: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    failed: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reads {
    fn poll(url: String) -> Self {
        let ok = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let failed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (count, failures) = (ok.clone(), failed.clone());
        let task = tokio::spawn(async move {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tick.tick().await;
                match client.get(&url).send().await {
                    Ok(r) if r.status() == 200 => {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Ok(r) => failures.lock().unwrap().push(format!("status {}", r.status())),
                    Err(e) => failures.lock().unwrap().push(e.to_string()),
                }
            }
        });
        Self { ok, failed, task }
    }

    fn stop(self) -> (usize, Vec<String>) {
        self.task.abort();
        (self.ok.load(std::sync::atomic::Ordering::SeqCst), self.failed.lock().unwrap().clone())
    }
}

/// The schema starts empty, and PostgreSQL plans a never-analysed table as if it held a row or two
/// (the relay's claim then read every pending delivery per candidate). A leader analyses the tables
/// once its first full list is stored: the planner's row count of `services` is then exact.
#[tokio::test]
async fn a_leader_refreshes_the_planner_statistics_once_its_first_list_is_stored() {
    let h = Harness::new().await;
    let pool = sqlx::PgPool::connect(h.pg_url.as_deref().unwrap()).await.unwrap();
    let reltuples = "SELECT reltuples::float8 FROM pg_class WHERE relname = 'services' AND relkind = 'r'";
    for name in ["a", "b", "c"] {
        h.api.apply(lb_service("ns", name, 80));
    }
    let running = h.start(h.config()).await;
    let analysed = wait_until("services analysed", || {
        let pool = pool.clone();
        async move {
            let n: f64 = sqlx::query_scalar(reltuples).fetch_one(&pool).await.unwrap();
            (n >= 0.0).then_some(n)
        }
    })
    .await;
    assert_eq!(analysed, 3.0);
    running.stop().await.unwrap();
}

/// A TCP proxy in front of the test server's unix socket that holds every chunk for `delay` in
/// each direction: a slow link to PostgreSQL (the round trip is twice `delay`).
async fn slow_link(pg_url: &str, delay: Duration) -> String {
    let url: url::Url = pg_url.parse().unwrap();
    let host = url.query_pairs().find(|(k, _)| k == "host").expect("a unix-socket URL").1.into_owned();
    let socket = std::path::Path::new(&host).join(".s.PGSQL.5432");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::UnixStream::connect(&socket).await.unwrap();
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(delayed_copy(cr, sw, delay));
            tokio::spawn(delayed_copy(sr, cw, delay));
        }
    });
    format!("postgres://postgres@127.0.0.1:{port}{}", url.path())
}

/// Copies `from` to `to`, each chunk `delay` after it was read (in order).
async fn delayed_copy(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until((at + delay).into()).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
            return;
        }
    }
}

/// Over a link with a 60 ms round trip, a lease renewed every 100 ms: setting up a connection takes
/// several round trips, longer than one renewal interval. The replica is still elected and records
/// the Service (the bid used to be cut at `leader_renew`, connecting included: never elected).
#[tokio::test]
async fn a_replica_is_elected_over_a_link_slower_than_its_renewal_interval() {
    let h = Harness::new().await;
    let slow = slow_link(h.pg_url.as_deref().unwrap(), Duration::from_millis(30)).await;
    h.api.apply(lb_service("ns", "web", 80));
    let mut config = h.config();
    config.database.url = Some(vipwatch::config::Secret::new(&slow));
    config.database.leader_ttl = Duration::from_secs(3);
    config.database.leader_renew = Duration::from_millis(100);
    let running = h.start(config).await;
    let events = wait_events(&running.store, 1).await;
    assert_eq!(summary(&events), vec![(s("ADDED"), s("startup"), s("ns/web"))]);
    running.stop().await.unwrap();
}

/// A leader that cannot reach Kubernetes gives its lease up after `leader_step_down_after` (2 s
/// here), and a replica that can takes over and records the cluster. The lease lives in PostgreSQL,
/// so nothing else would end the cut-off leader's term.
#[tokio::test]
async fn a_leader_that_cannot_reach_kubernetes_gives_the_lease_to_one_that_can() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(lb_service("shop", "web", 80));
    let refused = Refused::new();
    let dead = refused.addr;
    let cut_off =
        [("VIPWATCH_KUBERNETES__URL", &*format!("http://{dead}")), ("VIPWATCH_DATABASE__LEADER_STEP_DOWN_AFTER", "2s")];
    let a = Replica::start_with(&h, "a", &rx, &cut_off).await;
    a.wait_role("leader").await;
    let b = Replica::start(&h, "b", &rx).await;
    b.wait_role("leader").await;
    wait_until("the ADDED delivered", || async { (rx.accepted().len() == 1).then_some(()) }).await;
    assert_eq!(rx.accepted()[0].event().0, "ADDED");
    assert_eq!(a.role().await.as_deref(), Some("follower"));
}

/// With PostgreSQL gone, reads answer 503 `database_unavailable` naming the fault's kind (what the
/// operator can act on), not 500 `internal`: every read endpoint maps storage faults the same way.
#[tokio::test]
async fn reads_answer_503_database_unavailable_while_postgresql_is_down() {
    let (h, server) = on_own_server().await;
    let rx = Receiver::ok().await;
    let a = Replica::start(&h, "a", &rx).await;
    one_leader(&[&a]).await;
    server.stop();
    for path in ["/api/v1/status", "/api/v1/services", "/api/v1/events"] {
        let resp = reqwest::get(format!("{}{path}", a.api)).await.unwrap();
        let status = resp.status().as_u16();
        let problem: Value = resp.json().await.unwrap();
        assert_eq!(
            (status, problem["code"].as_str(), problem["detail"].as_str()),
            (503, Some("database_unavailable"), Some("the database is unavailable (io); retry later")),
            "{path}"
        );
    }
}

/// The lease of the fail-over edge tests, as the field check ran it: `leader_ttl` 3 s renewed every
/// 1 s (so the session limits are 1 s each, `SessionLimits::for_lease`), with the lease, fencing and
/// store logged at info and everything else at warn.
const LEASE_3S_1S: &[(&str, &str)] = &[
    ("VIPWATCH_DATABASE__LEADER_TTL", "3s"),
    ("VIPWATCH_DATABASE__LEADER_RENEW", "1s"),
    ("VIPWATCH_LOG", "warn,vipwatch::app=info,vipwatch::leader=info,vipwatch::store=info"),
];
/// `leader_renew` in [`LEASE_3S_1S`].
const RENEW: Duration = Duration::from_secs(1);
/// The session limits of [`LEASE_3S_1S`]: each half of `leader_ttl - leader_renew`.
const SESSION_LIMIT: Duration = Duration::from_secs(1);
/// What a measured bound may exceed its terms by: the status polls (every 20 ms), a bid's round
/// trip, and a loaded test machine.
const SLACK: Duration = Duration::from_millis(500);

/// The advisory lock every PostgreSQL write transaction takes first (the store's `ORDER_LOCK`),
/// together with the fence's `FOR SHARE` lock on the lease row on a leader's store. `pg_locks`
/// shows a bigint key as `classid` (its high 32 bits) and `objid` (its low 32 bits).
const ORDER_LOCK: i64 = 0x7669_7077_6f72_6472;

/// The state (`pg_stat_activity.state`) of the session in this test's database that holds the
/// write-order lock, if one does: the replica with a write transaction open.
async fn order_lock_holder(pool: &sqlx::PgPool) -> Option<String> {
    order_lock_session(pool).await.map(|(_, state, _)| state)
}

/// The session holding the write-order lock: its backend pid, its state and when that state began.
async fn order_lock_session(pool: &sqlx::PgPool) -> Option<(i32, String, String)> {
    let sql = "SELECT a.pid, a.state, a.state_change::text FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
               WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = $1 AND l.objid::bigint = $2 \
               AND l.objsubid = 1 AND a.datname = current_database()";
    sqlx::query_as(sql).bind(ORDER_LOCK >> 32).bind(ORDER_LOCK & 0xffff_ffff).fetch_optional(pool).await.unwrap()
}

/// Stops `r` (SIGSTOP) at a moment its write connection has a transaction open: it then holds the
/// lease row `FOR SHARE` and the write-order lock until the server ends its session. Stops it,
/// waits up to 300 ms for the session to show `idle in transaction` with the lock, the same state
/// since the same moment 100 ms later (a statement written to the socket just before the stop,
/// a `COMMIT` among them, may still reach a busy server and end that state), else resumes it and
/// tries again a little later. Returns when it was stopped.
async fn stop_inside_a_write_transaction(r: &Replica, pool: &sqlx::PgPool) -> Instant {
    for attempt in 0..50u64 {
        r.signal(libc::SIGSTOP);
        let stopped = Instant::now();
        let idle_in_transaction = async {
            loop {
                if let Some(seen) = order_lock_session(pool).await
                    && seen.1 == "idle in transaction"
                {
                    tokio::time::sleep(Duration::from_millis(100)).await; // ok: how long a state must hold
                    return order_lock_session(pool).await == Some(seen);
                }
                tokio::time::sleep(Duration::from_millis(10)).await; // ok: polling interval
            }
        };
        if tokio::time::timeout(Duration::from_millis(400), idle_in_transaction).await == Ok(true) {
            eprintln!("{} stopped inside a write transaction (attempt {})", r.name, attempt + 1);
            return stopped;
        }
        r.signal(libc::SIGCONT);
        // ok: not a wait for anything; moves the next stop to another phase of the writer's cycle.
        tokio::time::sleep(Duration::from_millis(20 + 17 * (attempt % 7))).await;
    }
    panic!("{} never stopped inside a write transaction", r.name);
}

/// A stream of changes to the simulated API at about `per_second`: 50 Services, each updated in
/// turn (a label), so the leader writes events and deliveries continuously. Stops when dropped.
struct Load(tokio::task::JoinHandle<()>);

impl Load {
    fn start(api: &vipwatch::fake_apiserver::FakeApiServer, per_second: u64) -> Self {
        for i in 0..50 {
            api.apply(lb_service("load", &format!("svc-{i:02}"), 80));
        }
        let api = api.clone();
        Self(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1000 / per_second));
            for n in 0u64.. {
                tick.tick().await;
                let name = format!("svc-{:02}", n % 50);
                api.update("load", &name, |o| {
                    o["metadata"]["labels"]["round"] = serde_json::json!((n / 50).to_string())
                });
            }
        }))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A leader stopped (SIGSTOP) inside a write transaction, under 60 changes/s, holds the lease row
/// `FOR SHARE` and the write-order lock. The server ends that transaction within the session limit
/// (1 s with a 3 s lease renewed every 1 s), before the lease expires, so the follower takes over
/// within `leader_ttl + leader_renew` of the stop, as after a crash, and delivers. (With the fixed
/// 5 s idle-in-transaction limit the takeover waited for it: 5.0–5.6 s.)
#[tokio::test]
async fn a_leader_stopped_inside_a_write_transaction_is_replaced_within_the_ttl_plus_one_renewal() {
    let h = Harness::new().await;
    let (rx_a, rx_b) = (Receiver::ok().await, Receiver::ok().await);
    let a = Replica::start_with(&h, "a", &rx_a, LEASE_3S_1S).await;
    a.wait_role("leader").await;
    let b = Replica::start_with(&h, "b", &rx_b, LEASE_3S_1S).await;
    b.wait_role("follower").await;
    let pool = sqlx::PgPool::connect(h.pg_url.as_deref().unwrap()).await.unwrap();
    let _load = Load::start(&h.api, 60);
    wait_until("a delivers the load", || async { (rx_a.accepted().len() >= 100).then_some(()) }).await;

    let stopped = stop_inside_a_write_transaction(&a, &pool).await;
    wait_until("the server ended the stopped leader's transaction", || async {
        order_lock_holder(&pool).await.is_none().then_some(())
    })
    .await;
    let released = stopped.elapsed();
    b.wait_role("leader").await;
    let takeover = stopped.elapsed();
    let before = rx_b.accepted().len();
    wait_until("b delivers", || async { (rx_b.accepted().len() > before).then_some(()) }).await;
    let delivering = stopped.elapsed();
    eprintln!("after the stop: locks released {released:?}, takeover {takeover:?}, b delivering {delivering:?}");
    assert!(released < SESSION_LIMIT + SLACK, "the stopped leader's locks went after {released:?}");
    assert!(takeover < TTL + RENEW + SLACK, "takeover took {takeover:?}");
    a.signal(libc::SIGCONT);
    a.wait_role("follower").await;
}

/// The leader stopped inside a write transaction resumes after the server ended that transaction
/// and a follower took over. Its open write fails (the connection is gone): that is its term's
/// end, not a database fault. It follows, and `/readyz` answers 200 throughout (a follower is
/// ready while it can read; its writes' connection is replaced at once). Its log has no ERROR line
/// from the resume on, and tells the fence's refusal once, at info, with the epoch. (Before, it
/// answered 503 `database: not writable: … Broken pipe` for about 6 s and logged the stand-down at
/// ERROR.)
#[tokio::test]
async fn a_deposed_leader_resumed_after_its_session_was_ended_stays_ready_and_logs_no_error() {
    let h = Harness::new().await;
    let (rx_a, rx_b) = (Receiver::ok().await, Receiver::ok().await);
    let a = Replica::start_with(&h, "a", &rx_a, LEASE_3S_1S).await;
    a.wait_role("leader").await;
    let b = Replica::start_with(&h, "b", &rx_b, LEASE_3S_1S).await;
    b.wait_role("follower").await;
    let pool = sqlx::PgPool::connect(h.pg_url.as_deref().unwrap()).await.unwrap();
    let _load = Load::start(&h.api, 60);
    wait_until("a delivers the load", || async { (rx_a.accepted().len() >= 100).then_some(()) }).await;
    assert_eq!(a.readyz().await, (200, "ready".to_owned()));

    stop_inside_a_write_transaction(&a, &pool).await;
    b.wait_role("leader").await;
    wait_until("the server ended the stopped leader's transaction", || async {
        order_lock_holder(&pool).await.is_none().then_some(())
    })
    .await;
    let mark = a.log_mark();
    a.signal(libc::SIGCONT);
    let resumed = Instant::now();
    let mut answers = Vec::new();
    while resumed.elapsed() < Duration::from_secs(3) {
        answers.push(a.readyz().await);
        tokio::time::sleep(Duration::from_millis(50)).await; // ok: the polling interval of a probe
    }
    let not_ready: Vec<_> = answers.iter().filter(|(status, _)| *status != 200).collect();
    assert_eq!(not_ready, Vec::<&(u16, String)>::new(), "a answered /readyz {} times", answers.len());
    assert_eq!(a.role().await.as_deref(), Some("follower"));

    let logged = a.logged_since(mark);
    let errors: Vec<&String> = logged.iter().filter(|l| l.contains(" ERROR ")).collect();
    assert_eq!(errors, Vec::<&String>::new(), "no ERROR line after the resume");
    let refusals: Vec<&String> =
        logged.iter().filter(|l| l.contains("not the leader any more: this term's writes are refused")).collect();
    assert_eq!(refusals.len(), 1, "the refusal logged once: {refusals:?}");
    assert!(refusals[0].contains(" INFO ") && refusals[0].contains("epoch=1"), "{}", refusals[0]);
}

/// While writes wait (a session of the test holds the write-order lock), the leader's `/readyz`
/// says the database is not writable, and the follower's says ready: it serves reads, which
/// answer, and writes nothing of its own. (Before, the follower ran the leader's write probe and
/// answered 503 too.)
#[tokio::test]
async fn a_follower_is_ready_while_reads_answer_even_when_writes_wait() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let a = Replica::start(&h, "a", &rx).await;
    a.wait_role("leader").await;
    let b = Replica::start(&h, "b", &rx).await;
    b.wait_role("follower").await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_until("the ADDED delivered", || async { (rx.accepted().len() == 1).then_some(()) }).await;
    for r in [&a, &b] {
        wait_until(&format!("{} ready", r.name), || async { (r.readyz().await.0 == 200).then_some(()) }).await;
    }

    use sqlx::Connection as _;
    let mut blocker = sqlx::PgConnection::connect(h.pg_url.as_deref().unwrap()).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)").bind(ORDER_LOCK).execute(&mut blocker).await.unwrap();
    let locked = "not ready: database: not writable: write lock not obtained within 800 ms (database is locked)";
    let (status, detail) =
        wait_until("a not ready", || async { Some(a.readyz().await).filter(|(s, _)| *s == 503) }).await;
    // The detail ends with how long writes have failed, ` (since N s)`.
    assert_eq!((status, detail.rsplit_once(" (since ").map(|(d, _)| d)), (503, Some(locked)));
    assert_eq!(b.readyz().await, (200, "ready".to_owned()));

    sqlx::query("SELECT pg_advisory_unlock($1)").bind(ORDER_LOCK).execute(&mut blocker).await.unwrap();
    wait_until("a ready again", || async { (a.readyz().await.0 == 200).then_some(()) }).await;
}

/// A follower on a database where no leader has stored its first lists yet is not ready: what it
/// would serve is no complete picture (here the leader cannot reach Kubernetes). Once a leader has
/// stored them, every replica is ready, the cut-off one too now that it follows. (Before, the
/// follower answered 200 at once, serving an empty state as if it were current.)
#[tokio::test]
async fn a_follower_is_ready_only_once_some_leader_stored_its_first_lists() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(lb_service("shop", "web", 80));
    let refused = Refused::new();
    let dead = refused.addr;
    let cut_off =
        [("VIPWATCH_KUBERNETES__URL", &*format!("http://{dead}")), ("VIPWATCH_DATABASE__LEADER_STEP_DOWN_AFTER", "5s")];
    let a = Replica::start_with(&h, "a", &rx, &cut_off).await;
    a.wait_role("leader").await;
    let b = Replica::start(&h, "b", &rx).await;
    b.wait_role("follower").await;
    assert_eq!(
        b.readyz().await,
        (503, "not ready: watch: no leader has stored its first full lists in this database yet".to_owned())
    );
    assert_eq!(a.readyz().await, (503, "not ready: watch: waiting for the first full list".to_owned()));

    b.wait_role("leader").await;
    wait_until("b ready", || async { (b.readyz().await.0 == 200).then_some(()) }).await;
    wait_until("the ADDED delivered", || async { (rx.accepted().len() == 1).then_some(()) }).await;
    assert_eq!(rx.accepted()[0].event().0, "ADDED");
    a.wait_role("follower").await;
    assert_eq!(a.readyz().await, (200, "ready".to_owned()));
}
