//! Storage faults for real: the database on a small tmpfs that a ballast file fills (SQLITE_FULL), and a
//! second SQLite connection (the `sqlite3` CLI) holding `BEGIN EXCLUSIVE` (SQLITE_BUSY). Nothing is
//! recorded or signalled while the database refuses writes, `/readyz` says why within about a second,
//! and once the fault clears every change is recorded exactly once and delivered, without a restart.
//! The same holds while the watch's writer prepares a large plan's next chunk beside a write (the
//! tests at the end, on a multi-thread runtime), and for an event id another writer took.
//!
//! The tmpfs test needs `mount` (the tests run as root here); it panics with a clear message otherwise.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::api::Api;
use common::receiver::Receiver;
use common::*;
use reqwest::StatusCode;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use vipwatch::config::Config;
use vipwatch::store::DeliveryFilter;

/// A tmpfs of `size` mounted on a temp directory; unmounted (lazily, so a panic while files are
/// open still cleans up) when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount runs");
        assert!(status.success(), "mount -t tmpfs failed (this test needs root): {status}");
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Fills the filesystem of database `db` with the file `path` until ENOSPC; returns its size. First
/// empties `db`'s WAL (`sqlite3`: `PRAGMA wal_checkpoint(TRUNCATE)`): vipwatch checkpoints in the
/// background, and a WAL it started over rewrites blocks the file already has, so small writes would
/// still fit on the full disk (they would be durable; the test needs every write to take new space).
///
/// Async, so the in-process vipwatch runs on meanwhile: a `#[tokio::test]` runs it on the test's one
/// thread, and a CLI waited for there (blocking) would wait for a transaction vipwatch had begun and
/// could not finish until the wait was over.
async fn fill(db: &Path, path: &Path) -> u64 {
    let out = tokio::process::Command::new("sqlite3")
        .arg(db)
        .arg("PRAGMA busy_timeout = 5000; PRAGMA wal_checkpoint(TRUNCATE);")
        .output()
        .await
        .expect("the sqlite3 CLI is installed");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().last(), Some("0|0|0"), "WAL emptied: {out:?}");
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 4096];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("ballast: {e}"),
        }
    }
    let _ = f.sync_all();
    written
}

/// A config over `db` with one endpoint and fast retries of failed writes.
fn config(h: &Harness, db: PathBuf, rx: &Receiver) -> Config {
    let mut config = h.config_with(vec![webhook("lab", &rx.url)]);
    config.database.path = db;
    config.database.write_retry_max_delay = Duration::from_millis(300);
    config
}

/// GET /readyz with a hard 3 s bound: returns the answer and how long it took.
async fn readyz(api: &Api) -> (StatusCode, String, Duration) {
    let started = Instant::now();
    let answer =
        tokio::time::timeout(Duration::from_secs(3), api.get("/readyz")).await.expect("/readyz answers within 3 s");
    (answer.status, answer.body["detail"].as_str().map_or(answer.text.clone(), str::to_owned), started.elapsed())
}

async fn wait_accepted(rx: &Receiver, n: usize) -> Vec<receiver::Hit> {
    wait_until(&format!("{n} accepted deliveries"), || async { (rx.accepted().len() >= n).then(|| rx.accepted()) })
        .await
}

#[tokio::test]
async fn a_full_disk_records_nothing_says_so_in_readyz_and_loses_nothing_once_space_is_back() {
    let h = Harness::new().await;
    let fs = Tmpfs::mount("8m");
    let rx = Receiver::ok().await;
    let vw = h.start(config(&h, fs.path().join("vipwatch.db"), &rx)).await;
    let api = Api::new(&vw);
    h.api.apply(lb_service("shop", "a", 80));
    wait_accepted(&rx, 1).await;
    assert_eq!(wait_events(&vw.store, 1).await.len(), 1);
    assert_eq!(readyz(&api).await.0, StatusCode::OK);
    let committed_before = *vw.committed().borrow();

    let ballast = fs.path().join("ballast");
    assert!(fill(&fs.path().join("vipwatch.db"), &ballast).await > 0);
    h.api.apply(lb_service("shop", "b", 81));
    h.api.apply(lb_service("shop", "c", 82));

    let detail = wait_until("/readyz 503 naming the full disk", || async {
        let (status, detail, took) = readyz(&api).await;
        assert!(took < Duration::from_secs(2), "/readyz took {took:?}");
        (status == StatusCode::SERVICE_UNAVAILABLE).then_some(detail)
    })
    .await;
    assert!(
        detail.starts_with("not ready: database: not writable: database or disk is full (since "),
        "detail: {detail}"
    );
    // Retries happen meanwhile (each counted); none of them reported anything.
    wait_until("a second failed write", || async {
        (api.metric("vipwatch_store_write_errors_total{kind=\"full\"}").await >= 2.0).then_some(())
    })
    .await;
    assert_eq!(api.metric("vipwatch_store_writable").await, 0.0);
    assert_eq!(*vw.committed().borrow(), committed_before, "no commit signalled while the disk is full");
    assert_eq!(events(&vw.store).await.len(), 1, "nothing recorded while the disk is full");
    assert_eq!(api.metric("vipwatch_events_total{type=\"ADDED\",cause=\"watch\"}").await, 1.0);
    assert_eq!(rx.accepted().len(), 1);
    assert_eq!(api.get("/healthz").await.status, StatusCode::OK, "/healthz is about the process");

    std::fs::remove_file(&ballast).unwrap();
    let rows = wait_events(&vw.store, 3).await;
    let added = |name: &str| (s("ADDED"), s("watch"), format!("shop/{name}"));
    assert_eq!(summary(&rows), vec![added("a"), added("b"), added("c")], "each change recorded exactly once");
    let hits = wait_accepted(&rx, 3).await;
    let mut delivered: Vec<_> = hits.iter().map(|hit| hit.json()["data"]["service"]["name"].clone()).collect();
    delivered.sort_by_key(ToString::to_string);
    assert_eq!(delivered, vec!["a", "b", "c"], "each change delivered once");
    wait_until("/readyz 200 again", || async { (readyz(&api).await.0 == StatusCode::OK).then_some(()) }).await;
    assert_eq!(api.metric("vipwatch_store_writable").await, 1.0);
    let deliveries = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
    let states: Vec<_> = deliveries.iter().map(|d| (d.event_id, d.state.as_str(), d.attempts)).collect();
    assert_eq!(states, vec![(Some(1), "succeeded", 1), (Some(2), "succeeded", 1), (Some(3), "succeeded", 1)]);
    assert_eq!(rx.accepted().len(), 3, "nothing sent twice");
    vw.stop().await.unwrap();
}

/// The `sqlite3` CLI holding `BEGIN EXCLUSIVE` on a database until released or dropped (killed then).
///
/// Async, like [`fill`]: the lock is taken while the in-process vipwatch may be in a write
/// transaction on the test's thread, which must be able to finish it for the CLI to get the lock.
struct ExclusiveLock {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
}

impl ExclusiveLock {
    async fn take(db: &Path) -> Self {
        let mut child = tokio::process::Command::new("sqlite3")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the sqlite3 CLI is installed");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b".bail on\n.timeout 5000\nBEGIN EXCLUSIVE;\nSELECT 'locked';\n").await.unwrap();
        stdin.flush().await.unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).await.unwrap();
        if line.trim() != "locked" {
            let mut err = String::new();
            child.stderr.as_mut().unwrap().read_to_string(&mut err).await.unwrap();
            panic!("sqlite3 did not take the exclusive lock within its 5 s busy timeout: {err}");
        }
        Self { child, stdin: Some(stdin) }
    }

    async fn release(mut self) {
        let mut stdin = self.stdin.take().unwrap();
        stdin.write_all(b"COMMIT;\n.quit\n").await.unwrap();
        drop(stdin);
        assert!(self.child.wait().await.unwrap().success());
    }
}

#[tokio::test]
async fn a_database_locked_by_another_process_makes_readyz_answer_503_at_once_and_changes_wait_for_the_lock() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = h.start(config(&h, h.db_path(), &rx)).await;
    let api = Api::new(&vw);
    h.api.apply(lb_service("shop", "a", 80));
    wait_accepted(&rx, 1).await;
    assert_eq!(readyz(&api).await.0, StatusCode::OK);

    let lock = ExclusiveLock::take(&h.db_path()).await;
    h.api.apply(lb_service("shop", "b", 81));
    let (status, detail, took) = readyz(&api).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{detail}");
    assert!(took < Duration::from_millis(1500), "/readyz took {took:?}");
    assert!(detail.starts_with("not ready: database: not writable: "), "detail: {detail}");
    assert!(detail.contains("locked"), "detail: {detail}");
    // Asked again while the lock is held: still 503, still fast.
    let (status, _, took) = readyz(&api).await;
    assert_eq!((status, took < Duration::from_millis(1500)), (StatusCode::SERVICE_UNAVAILABLE, true), "{took:?}");
    assert_eq!(events(&vw.store).await.len(), 1, "nothing recorded while the lock is held");

    lock.release().await;
    let rows = wait_events(&vw.store, 2).await;
    let added = |name: &str| (s("ADDED"), s("watch"), format!("shop/{name}"));
    assert_eq!(summary(&rows), vec![added("a"), added("b")], "the change made meanwhile is recorded once");
    assert_eq!(wait_accepted(&rx, 2).await.len(), 2);
    wait_until("/readyz 200 again", || async { (readyz(&api).await.0 == StatusCode::OK).then_some(()) }).await;
    assert_eq!(rx.accepted().len(), 2, "nothing sent twice");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn an_accepted_delivery_whose_outcome_cannot_be_recorded_is_not_sent_again() {
    let h = Harness::new().await;
    let fs = Tmpfs::mount("8m");
    // The appliance takes 0.7 s to accept (under the 1 s webhook timeout): the disk fills meanwhile.
    let rx = Receiver::start(|_, _| receiver::Reply::After(Duration::from_millis(700), 200)).await;
    let vw = h.start(config(&h, fs.path().join("vipwatch.db"), &rx)).await;
    let api = Api::new(&vw);
    h.api.apply(lb_service("shop", "a", 80));
    wait_until("the attempt in flight", || async { (!rx.hits().is_empty()).then_some(()) }).await;
    let ballast = fs.path().join("ballast");
    fill(&fs.path().join("vipwatch.db"), &ballast).await;

    wait_accepted(&rx, 1).await;
    // Recording the outcome fails, again and again (backed off); the delivery is not sent again.
    wait_until("three failed writes after the acceptance", || async {
        (api.metric("vipwatch_store_write_errors_total{kind=\"full\"}").await >= 3.0).then_some(())
    })
    .await;
    assert_eq!(rx.hits().len(), 1, "not re-sent while its outcome waits for the database");
    let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
    assert_eq!((rows[0].state.as_str(), rows[0].attempts), ("pending", 0), "nothing recorded yet");

    std::fs::remove_file(&ballast).unwrap();
    wait_until("the outcome recorded", || async {
        let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
        (rows[0].state == "succeeded").then_some(())
    })
    .await;
    let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
    assert_eq!((rows.len(), rows[0].attempts), (1, 1));
    assert_eq!(vw.store.attempts(rows[0].id).await.unwrap().len(), 1);
    assert_eq!(rx.hits().len(), 1, "sent exactly once");
    vw.stop().await.unwrap();
}

// Faults while the watch's writer pipelines a large plan (the next chunk prepared while the one
// before is written: multi-thread runtime, no endpoint taking the changes). Each fault comes while
// the first round of changes is being written, and the second round is only made after it: so the
// fault always meets writes still to come (a fault timed against a running writer alone may come
// after its last write, and did in CI). A helper's runs showed the lock hitting a pipelined write,
// and the taken id hitting one in 2 of 4 runs; they pass either way, since every write must keep
// these rules.

const N: usize = 1500;

/// The `sqlite3` CLI run once on `db` with `sql`; its output.
async fn sqlite(db: &Path, sql: &str) -> String {
    let out = tokio::process::Command::new("sqlite3")
        .arg("-cmd")
        .arg(".timeout 20000")
        .arg(db)
        .arg(sql)
        .output()
        .await
        .expect("the sqlite3 CLI is installed");
    assert!(out.status.success(), "sqlite3 {sql}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Every write error counted so far, of any kind (the sum of `vipwatch_store_write_errors_total`).
async fn write_errors(api: &Api) -> f64 {
    let samples = api.samples().await.into_iter();
    samples.filter(|(name, _)| name.starts_with("vipwatch_store_write_errors_total{")).map(|(_, v)| v).sum()
}

/// Waits until the first round of changes is being written: more than `n + past_seed` events
/// committed.
async fn first_round_under_way(vw: &vipwatch::app::Running, past_seed: usize) {
    let committed = vw.committed();
    wait_until("writes under way", || async { (*committed.borrow() > (N + past_seed) as i64).then_some(()) }).await;
}

/// The database locked by another process (SQLITE_BUSY after the 5 s busy timeout, retried) while
/// a large plan's chunks are written with the next one prepared beside: once the lock is gone every
/// change is recorded once, ids 1..=3N without a gap, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_while_chunks_are_pipelined_loses_nothing_and_keeps_ids_in_order() {
    let h = Harness::new().await;
    seed_bulk(&h.api, N);
    let mut config = h.config();
    config.database.write_retry_max_delay = Duration::from_millis(300);
    let vw = h.start(config).await;
    let api = Api::new(&vw);
    change_bulk(&h.api, N, 1);
    first_round_under_way(&vw, 300).await;
    let lock = ExclusiveLock::take(&h.db_path()).await;
    change_bulk(&h.api, N, 2);
    let at_lock = *vw.committed().borrow();
    wait_until("a write that failed on the lock", || async { (write_errors(&api).await >= 1.0).then_some(()) }).await;
    assert_eq!(*vw.committed().borrow(), at_lock, "nothing committed while locked");
    lock.release().await;
    assert_bulk_recorded_in_order(&vw.store, N).await;
    vw.stop().await.unwrap();
}

/// Another writer takes an event id a later chunk of a pipelined plan was prepared with: that chunk
/// is prepared again after the foreign id; every change is recorded once, in order, and the only gap
/// in the ids ends at the foreign one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_taken_under_a_pipelined_plan_is_skipped_and_nothing_is_lost() {
    let h = Harness::new().await;
    seed_bulk(&h.api, N);
    let vw = h.start(h.config()).await;
    change_bulk(&h.api, N, 1);
    first_round_under_way(&vw, 100).await;
    // The id is chosen under the write lock, 700 past the last one: it is free when taken, and
    // below 3N, where the writes still to come reach.
    let taken = sqlite(
        &h.db_path(),
        "BEGIN IMMEDIATE; \
         INSERT INTO events (id, observed_at, type, namespace, name, uid, resource_version, cause, view) \
         SELECT MAX(id) + 700, 1, 'ADDED', 'zz-foreign', 'x', 'u', '1', 'watch', '{}' FROM events RETURNING id; \
         COMMIT;",
    )
    .await;
    let id: i64 = taken.trim().parse().unwrap();
    assert!(id < 3 * N as i64, "the foreign id {id} is among the ids still to come");
    change_bulk(&h.api, N, 2);
    wait_until("every change recorded", || async {
        let n: usize =
            sqlite(&h.db_path(), "SELECT COUNT(*) FROM events WHERE namespace = 'bulk';").await.trim().parse().unwrap();
        (n >= 3 * N).then_some(())
    })
    .await;
    sqlite(&h.db_path(), "DELETE FROM events WHERE namespace = 'zz-foreign';").await;
    let rows = events(&vw.store).await;
    assert_bulk_changed_twice(&rows, N);
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let gaps: Vec<(i64, i64)> = ids.windows(2).filter(|w| w[1] != w[0] + 1).map(|w| (w[0], w[1])).collect();
    assert_eq!((ids[0], gaps.len()), (1, 1), "one gap, at the foreign id: {gaps:?}");
    assert_eq!(gaps[0].1, id + 1, "the ids go on after the foreign one");
    vw.stop().await.unwrap();
}
