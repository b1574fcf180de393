//! What the benchmarks share: a child process (`vipwatch serve`, the HAProxy agent) found by the
//! address it logs, its peak RSS (VmHWM) and CPU time from `/proc`, and percentiles; [`load`]: the
//! Services, changes and receiver the `vipwatch serve` benchmarks drive; [`results`]: each run's
//! figures written into `benchmarks/results.json`.
//!
//! Linux only: `/proc/<pid>/status`, `/proc/<pid>/stat` and `/proc/<pid>/clear_refs` (writing `5`
//! resets VmHWM to the current RSS, Linux ≥ 4.0, which is how a phase gets its own peak).

#![allow(dead_code)] // each benchmark uses its own part of this module

pub mod load;
pub mod results;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The longest a benchmark waits for a phase that has no shorter bound of its own (vipwatch ready, an
/// initial sync delivered): generous, since `BENCH_WRAP` may run vipwatch under a profiler that
/// slows it tenfold, but finite.
pub const SLOW_DEADLINE: Duration = Duration::from_secs(600);

/// Polls `done` every `poll` until it holds; panics naming `what` after [`SLOW_DEADLINE`].
pub async fn wait_until(what: &str, poll: Duration, mut done: impl FnMut() -> bool) {
    poll_until(what, poll, || std::future::ready(done())).await
}

/// Waits until `GET http://{addr}/readyz` answers 200. Panics after [`SLOW_DEADLINE`] (a benchmark
/// that hangs says so instead of waiting forever).
pub async fn wait_readyz(addr: &str) {
    let url = format!("http://{addr}/readyz");
    let client = reqwest::Client::new();
    let ready = || async { client.get(&url).send().await.is_ok_and(|r| r.status() == 200) };
    poll_until(&format!("{url} 200 (BENCH_LOG_FILE keeps the log)"), Duration::from_millis(5), ready).await
}

/// The loop behind [`wait_until`] and [`wait_readyz`]: awaits `done` every `poll` until it holds;
/// panics naming `what` after [`SLOW_DEADLINE`].
async fn poll_until<F: std::future::Future<Output = bool>>(what: &str, poll: Duration, mut done: impl FnMut() -> F) {
    let deadline = std::time::Instant::now() + SLOW_DEADLINE;
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "{what}: not within {} s", SLOW_DEADLINE.as_secs());
        tokio::time::sleep(poll).await; // ok: benchmark polling, not a test
    }
}

/// Peak resident set size (VmHWM) of `pid` since it started or since [`reset_peak_rss`], in MiB
/// (0 when the process is gone).
pub fn peak_rss_mib(pid: u32) -> f64 {
    status_kib(pid, "VmHWM:") / 1024.0
}

/// Resident set size now (VmRSS) of `pid`, in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    status_kib(pid, "VmRSS:") / 1024.0
}

/// Resident set size now of `pid` by kind, in MiB: `(anonymous, file-backed)` (RssAnon, RssFile).
/// File-backed is mostly the binary's own code and read-only data as mapped (the kernel maps pages
/// around each one touched, so it follows the binary's size more than the code run); anonymous is
/// the heap, stacks and the allocator's free lists.
pub fn rss_split_mib(pid: u32) -> (f64, f64) {
    (status_kib(pid, "RssAnon:") / 1024.0, status_kib(pid, "RssFile:") / 1024.0)
}

fn status_kib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

/// Resets `pid`'s VmHWM to its current RSS, so the next [`peak_rss_mib`] is this phase's peak.
pub fn reset_peak_rss(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("clear_refs (Linux ≥ 4.0, same user)");
}

/// CPU time (user + system) `pid` has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum()).unwrap_or(0);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

/// Bytes `pid` has written so far through write system calls (`wchar` of `/proc/<pid>/io`: files and
/// sockets alike, whether or not they reached the disk yet).
pub fn written_bytes(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("/proc/<pid>/io (Linux, same user)");
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("wchar in /proc/<pid>/io")
}

/// Prints this process's peak RSS next to `before` (its peak before vipwatch started in it), for the
/// benchmarks that run vipwatch in-process: the figure includes the fake apiserver and the load.
/// Records it in `results` as `peak RSS`.
pub fn report_own_peak_rss(before: f64, results: &mut results::Results) {
    let peak = peak_rss_mib(std::process::id());
    println!(
        "peak RSS   : {peak:.1} MiB for this process (vipwatch in-process + fake apiserver + load); {before:.1} MiB before vipwatch started; ratio {:.2}",
        peak / before
    );
    results.compare("peak RSS (whole process)", peak, "MiB", "the process before vipwatch started", before);
}

/// The `p` quantile (0..=1) of ascending `sorted` (NaN when empty).
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted.get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN)
}

/// A child process that prints its address on a log line; the rest of its output is drained.
pub struct Process {
    /// The child.
    pub child: Child,
    /// The first word after the marker on the line that carried it.
    pub addr: String,
}

impl Process {
    /// Starts `cmd` in a process group of its own and waits for `marker` on stdout (`from_stdout`)
    /// or stderr. Signals go to the whole group, so a `BENCH_WRAP` profiler's process (heaptrack is a
    /// shell script that waits for its child) and the vipwatch under it both get them.
    pub fn spawn(mut cmd: Command, marker: &str, from_stdout: bool) -> Self {
        cmd.process_group(0);
        let mut child = if from_stdout { cmd.stdout(Stdio::piped()) } else { cmd.stderr(Stdio::piped()) }
            .spawn()
            .expect("the child starts");
        let out: Box<dyn std::io::Read + Send> =
            if from_stdout { Box::new(child.stdout.take().unwrap()) } else { Box::new(child.stderr.take().unwrap()) };
        let mut lines = BufReader::new(out).lines();
        let addr = loop {
            let line = lines.next().unwrap_or_else(|| panic!("the child exited before printing `{marker}`")).unwrap();
            if let Some(a) = line.split(marker).nth(1) {
                break a.split_whitespace().next().unwrap_or("").to_owned();
            }
        };
        // `BENCH_LOG_FILE=path`: the child's remaining output goes there (else it is dropped).
        // Appended to: every child of a run (vipwatch, the agent) writes its lines into the one file.
        let mut copy = std::env::var_os("BENCH_LOG_FILE")
            .map(|p| std::fs::File::options().create(true).append(true).open(p).expect("BENCH_LOG_FILE"));
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if let Some(f) = copy.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
            }
        });
        Self { child, addr }
    }

    /// `vipwatch serve --config <config>`, found by its `API listening` line; logs at `info`, or as
    /// `BENCH_VIPWATCH_LOG` says (e.g. `info,sqlx::query=debug` with `BENCH_LOG_FILE` to see statements).
    /// `BENCH_WRAP` runs it under a profiler (e.g. `heaptrack -o /tmp/vw`; the figures of that run
    /// are the profiler's, not vipwatch's). `BENCH_VIPWATCH_BIN` runs another build (an older
    /// release, for before/after figures from one machine).
    pub fn vipwatch(config: &std::path::Path) -> Self {
        let bin = std::env::var("BENCH_VIPWATCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_vipwatch").into());
        let wrap = std::env::var("BENCH_WRAP").unwrap_or_default();
        let mut words = wrap.split_whitespace();
        let mut cmd = match words.next() {
            Some(tool) => {
                let mut cmd = Command::new(tool);
                cmd.args(words).arg(&bin);
                cmd
            }
            None => Command::new(&bin),
        };
        let log = std::env::var("BENCH_VIPWATCH_LOG").unwrap_or_else(|_| "info".into());
        cmd.args(["serve", "--config"]).arg(config).env("VIPWATCH_LOG", log);
        Self::spawn(cmd, "API listening addr=", false)
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its peak RSS so far, in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        peak_rss_mib(self.pid())
    }

    /// Waits until `GET /readyz` answers 200 ([`wait_readyz`]).
    pub async fn wait_ready(&self) {
        wait_readyz(&self.addr).await
    }

    /// Sends `signal` (`libc::SIGKILL`, `libc::SIGTERM`, ...) to the child's process group without
    /// waiting.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: sends a signal to the process group our own child leads (`spawn`).
        assert_eq!(unsafe { libc::kill(-(self.pid() as libc::pid_t), signal) }, 0, "kill(-{})", self.pid());
    }

    /// SIGTERM to the process group, then waits for the child's exit.
    pub fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    /// A child still running (the benchmark panicked, or dropped it without [`Process::stop`]) is
    /// killed, so no `vipwatch serve` outlives its benchmark.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: as in `signal`; the result is ignored (a drop during a panic must not panic).
            unsafe { libc::kill(-(self.pid() as libc::pid_t), libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

/// The relay rounds of a run so far, from `vipwatch_relay_round_seconds` on `http://{addr}/metrics`:
/// per stage (`waiting`, `store`), the sum of seconds and the count, over every endpoint.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rounds {
    pub waiting: (f64, f64),
    pub store: (f64, f64),
}

impl Rounds {
    /// Scrapes `http://{addr}/metrics` (zero when it does not answer).
    pub async fn scrape(addr: &str) -> Self {
        let text = match reqwest::get(format!("http://{addr}/metrics")).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let mut rounds = Self::default();
        for line in text.lines().filter(|l| l.starts_with("vipwatch_relay_round_seconds_")) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let value: f64 = value.parse().unwrap_or(0.0);
            let stage = if series.contains("stage=\"waiting\"") { &mut rounds.waiting } else { &mut rounds.store };
            if series.starts_with("vipwatch_relay_round_seconds_sum") {
                stage.0 += value;
            } else if series.starts_with("vipwatch_relay_round_seconds_count") {
                stage.1 += value;
            }
        }
        rounds
    }

    /// The mean of each stage, in ms, and the number of rounds, between `before` and `self`.
    pub fn since(&self, before: &Self) -> (f64, f64, f64) {
        let mean = |now: (f64, f64), then: (f64, f64)| {
            let n = now.1 - then.1;
            if n > 0.0 { (now.0 - then.0) / n * 1e3 } else { 0.0 }
        };
        (mean(self.waiting, before.waiting), mean(self.store, before.store), self.store.1 - before.store.1)
    }
}
