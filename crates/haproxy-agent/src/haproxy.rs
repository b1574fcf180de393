//! HAProxy itself: started in master-worker mode (`-W`, master CLI on `<dir>/master.sock`) in a
//! process group of its own, so it outlives an agent restart; a configuration checked with `haproxy
//! -c` when a reload of it failed; reloaded
//! through the master CLI and the reload confirmed with `show proc` (HAProxy 2.6 answers `reload`
//! with nothing: the master line's reload counter goes up, and its `failed` count is 0 after a good
//! reload); changed at run time through the admin socket, with `severity-output number` so an error
//! (`[0-3]:`) is told from a notice. These are HAProxy 2.6's answers as observed, not only as
//! documented.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::time::Instant;
use tracing::info;

/// Lines of HAProxy's own output kept for error reports.
const LOG_TAIL: usize = 50;

/// Lines of `haproxy -c`'s complaints kept in a refusal (its answer and its log line): a
/// configuration with thousands of errors must not become a megabyte answer.
const CHECK_LINES: usize = 20;

/// The first `n` lines of `text` (each at most 512 bytes), with a count of the lines left out.
fn first_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let cut =
        |l: &&str| if l.len() <= 512 { (*l).to_owned() } else { format!("{}…", &l[..l.floor_char_boundary(511)]) };
    let mut out: Vec<String> = lines.iter().take(n).map(cut).collect();
    if lines.len() > n {
        out.push(format!("… ({} more lines)", lines.len() - n));
    }
    out.join("\n")
}

/// Something HAProxy did not do.
#[derive(Debug, thiserror::Error)]
pub enum HaproxyError {
    /// `haproxy -c` refused the configuration (its output).
    #[error("HAProxy refused the configuration: {0}")]
    Invalid(String),
    /// A reload failed; the old workers keep serving the previous configuration (the master's
    /// output, e.g. a bind that failed).
    #[error("reload failed: {0}")]
    ReloadFailed(String),
    /// No answer in time, or no master at all.
    #[error("HAProxy is not answering: {0}")]
    Unavailable(String),
    /// A Runtime API command answered an error.
    #[error("runtime API: {0}")]
    Runtime(String),
}

/// `show proc` of the master: its reload counters and how many workers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    /// The master's pid (it keeps it across reloads: the master re-executes itself).
    pub pid: u32,
    /// Reloads since the master started.
    pub reloads: u64,
    /// Failed reloads since the last good one.
    pub failed: u64,
    /// Workers (the current one and old ones still draining).
    pub workers: usize,
}

/// What one look at the master found ([`Haproxy::look`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// It answered `show proc`.
    Up(Proc),
    /// No master process runs (why).
    Gone(String),
    /// A master process runs but did not answer (why).
    Silent(String),
    /// The master answered, but one of its workers (the current one or an old one still draining)
    /// did not (why): alive but stopped or hung, it keeps its listening sockets and serves nothing.
    WorkerSilent(String),
}

/// One HAProxy installation in the agent's directory.
pub struct Haproxy {
    bin: PathBuf,
    /// `haproxy.cfg`.
    pub config: PathBuf,
    /// The master CLI socket (`-S <dir>/master.sock`).
    pub master: PathBuf,
    /// The admin socket (`stats socket`, level admin).
    pub admin: PathBuf,
    pid_file: PathBuf,
    /// The last pid read from `pid_file` (0: none yet).
    last_pid: std::sync::atomic::AtomicU32,
    log: Arc<Mutex<VecDeque<String>>>,
    /// Reloads in progress ([`Haproxy::reload`]); see [`Haproxy::reloading`].
    reloads: std::sync::atomic::AtomicUsize,
}

/// Whether process `pid` runs (stopped counts as running): `/proc/<pid>/stat` is `pid (comm) state
/// ...`, and Z and X are exited.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z" | "X"))
}

/// Counts a reload in progress while it lives, also when the reload's future is dropped.
struct Reloading<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Reloading<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Reloading<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Haproxy {
    /// HAProxy `bin` working in `dir`.
    pub fn new(bin: &Path, dir: &Path) -> Self {
        Self {
            bin: bin.to_owned(),
            config: dir.join("haproxy.cfg"),
            master: dir.join("master.sock"),
            admin: dir.join("admin.sock"),
            pid_file: dir.join("haproxy.pid"),
            last_pid: Default::default(),
            log: Arc::default(),
            reloads: Default::default(),
        }
    }

    /// `haproxy -c -f <path>`. Errors: [`HaproxyError::Invalid`] with HAProxy's explanation (its
    /// `[ALERT]` lines, else all it printed), or [`HaproxyError::Unavailable`] when the binary cannot
    /// run.
    pub async fn check(&self, path: &Path) -> Result<(), HaproxyError> {
        // Not `-q`: it silences the alerts that say what is wrong, too.
        let out = tokio::process::Command::new(&self.bin)
            .arg("-c")
            .arg("-f")
            .arg(path)
            .output()
            .await
            .map_err(|e| HaproxyError::Unavailable(format!("cannot run {}: {e}", self.bin.display())))?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let alerts: Vec<&str> = stderr.lines().filter(|l| l.contains("[ALERT]")).collect();
        let why = if alerts.is_empty() { stderr.trim().to_owned() } else { alerts.join("\n") };
        let text = first_lines(&why, CHECK_LINES);
        Err(HaproxyError::Invalid(if text.is_empty() { format!("exit {}", out.status) } else { text }))
    }

    /// Starts a master on `haproxy.cfg` in a process group of its own (it survives the agent, unless
    /// `tied` asks the kernel to SIGTERM it when the agent dies, even by SIGKILL) and waits until its
    /// master CLI answers. Errors: it could not start or did not answer in `timeout`.
    pub async fn start(&self, timeout: Duration, tied: bool) -> Result<(), HaproxyError> {
        let mut command = tokio::process::Command::new(&self.bin);
        if tied {
            tie_to_parent(&mut command);
        }
        let mut child = command
            .arg("-W")
            .arg("-S")
            .arg(&self.master)
            .arg("-p")
            .arg(&self.pid_file)
            .arg("-f")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| HaproxyError::Unavailable(format!("cannot start {}: {e}", self.bin.display())))?;
        let stderr = child.stderr.take().expect("piped");
        let log = self.log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                info!(target: "haproxy", "{line}");
                let mut tail = log.lock().unwrap_or_else(|p| p.into_inner());
                tail.push_back(line);
                if tail.len() > LOG_TAIL {
                    tail.pop_front();
                }
            }
            let _ = child.wait().await;
        });
        let deadline = Instant::now() + timeout;
        loop {
            match self.show_proc().await {
                Ok(p) if p.workers > 0 => return Ok(()),
                _ if Instant::now() >= deadline => {
                    return Err(HaproxyError::Unavailable(format!("the master did not answer: {}", self.log_tail(5))));
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// The master's `show proc`. Errors: [`HaproxyError::Unavailable`].
    pub async fn show_proc(&self) -> Result<Proc, HaproxyError> {
        parse_proc(&ask(&self.master, "show proc").await?)
    }

    /// Reloads through the master CLI and confirms it with `show proc` within `timeout`. Call it
    /// once `haproxy.cfg` holds the new configuration: a master other than the one answering here
    /// (HAProxy died meanwhile and [`crate::supervise`] started it again) was started after the file
    /// was in place, so it runs the new configuration, and that counts as a confirmed reload.
    /// Errors: [`HaproxyError::ReloadFailed`] (with the master's last lines) or
    /// [`HaproxyError::Unavailable`].
    pub async fn reload(&self, timeout: Duration) -> Result<(), HaproxyError> {
        let _reloading = Reloading::new(&self.reloads);
        let before = self.show_proc().await?;
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clear();
        ask(&self.master, "reload").await?;
        tracing::debug!(master = before.pid, "reload sent; waiting for `show proc` to confirm it");
        let deadline = Instant::now() + timeout;
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            match self.show_proc().await {
                Ok(p) if p.pid != before.pid && p.workers > 0 => {
                    info!(
                        old = before.pid,
                        new = p.pid,
                        "HAProxy was started again during the reload: it runs the new configuration"
                    );
                    return Ok(());
                }
                Ok(p) if p.reloads > before.reloads && p.failed == 0 => return Ok(()),
                Ok(p) if p.reloads > before.reloads => {
                    let tail = self.log_tail(10);
                    let why = if tail.is_empty() {
                        "HAProxy kept the previous configuration; its messages are in the log of the agent that started it (this one attached to a running HAProxy)".to_owned()
                    } else {
                        tail
                    };
                    return Err(HaproxyError::ReloadFailed(why));
                }
                _ if Instant::now() >= deadline => {
                    return Err(HaproxyError::Unavailable(format!("no reload confirmed within {timeout:?}")));
                }
                _ => {}
            }
        }
    }

    /// Sends Runtime API commands (one line, `;`-separated) to the current worker. Errors: any
    /// answer line with severity 0 to 3.
    pub async fn runtime(&self, commands: &[String]) -> Result<(), HaproxyError> {
        if commands.is_empty() {
            return Ok(());
        }
        let answer = ask(&self.admin, &commands.join("; ")).await?;
        let errors: Vec<&str> =
            answer.lines().filter(|l| matches!(l.get(..4), Some("[0]:" | "[1]:" | "[2]:" | "[3]:"))).collect();
        if errors.is_empty() { Ok(()) } else { Err(HaproxyError::Runtime(errors.join("; "))) }
    }

    /// Stops the master (and its workers) with SIGTERM, when there is one.
    pub async fn stop(&self) {
        if let Some(pid) = self.pid() {
            let _ = tokio::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
        }
    }

    /// Whether a [`Haproxy::reload`] is in progress: the master is re-executing itself and parsing
    /// the whole configuration (about 2 s at 10,000 frontends), and meanwhile refuses its CLI while
    /// the old worker keeps serving. The reload's own timeout bounds how long that lasts.
    pub fn reloading(&self) -> bool {
        self.reloads.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// The master's pid from the pid file; the last one read while the file cannot be read (a
    /// master re-executing itself for a reload writes it anew).
    pub fn pid(&self) -> Option<u32> {
        use std::sync::atomic::Ordering;
        let read = std::fs::read_to_string(&self.pid_file).ok().and_then(|t| t.trim().parse().ok());
        match read {
            Some(pid) => {
                self.last_pid.store(pid, Ordering::Relaxed);
                Some(pid)
            }
            None => Some(self.last_pid.load(Ordering::Relaxed)).filter(|p| *p != 0),
        }
    }

    /// Whether process `pid` is a master of this installation: its command line names this master
    /// socket (`-S <dir>/master.sock`), which no other process's does. A pid that was reused, or a
    /// master that exited (an exited child not yet reaped is a zombie), is not. A live process whose
    /// command line cannot be read at this instant (in the middle of an `exec`, as a master is on
    /// every reload) is taken as the master still.
    pub fn is_master(&self, pid: u32) -> bool {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !cmdline.is_empty() {
            let socket = self.master.as_os_str().as_encoded_bytes();
            return cmdline.split(|b| *b == 0).any(|arg| arg == socket);
        }
        alive(pid)
    }

    /// HAProxy processes of this installation that the agent cannot reach: their command line names
    /// this master socket (`-S <dir>/master.sock`) but the socket file is gone, as when the
    /// directory was wiped while HAProxy ran. Their pids, ascending (the master and its workers,
    /// which share its command line); empty when there are none, or while the socket exists (a
    /// master that is merely silent, e.g. re-executing itself for a reload). Such a HAProxy still
    /// holds the VIPs' ports and serves what it last ran: the agent must not start a second one
    /// beside it.
    pub fn unreachable(&self) -> Vec<u32> {
        if self.master.exists() {
            return Vec::new();
        }
        let socket = self.master.as_os_str().as_encoded_bytes();
        let mut pids: Vec<u32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|pid: &u32| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmdline.split(|b| *b == 0).any(|arg| arg == socket)
            })
            .collect();
        pids.sort_unstable();
        pids
    }

    /// One look at the master, quick whatever its state: gone (no master process), answering `show
    /// proc`, or alive but silent. One attempt, at most `patience`: a master re-executing itself for a
    /// reload refuses connections for some 100 ms, which the caller judges over several looks.
    ///
    /// With `workers`, every worker `show proc` lists is also asked `show info` through the master
    /// (`@!<pid>`). The master holds each such question until its worker answers, however long, and
    /// takes only a few at a time: the caller asks a silent worker again only now and then.
    pub async fn look(&self, patience: Duration, workers: bool) -> Look {
        let pid = self.pid();
        if let Some(pid) = pid
            && !self.is_master(pid)
        {
            return Look::Gone(format!("the HAProxy master (pid {pid}) exited"));
        }
        let answer = tokio::time::timeout(patience, exchange(&self.master, "show proc")).await;
        match answer.map_err(|_| std::io::Error::other(format!("no answer in {patience:?}"))) {
            Ok(Ok(text)) => match parse_proc(&text) {
                Ok(p) if workers => match self.workers_answer(&worker_pids(&text), patience).await {
                    Ok(()) => Look::Up(p),
                    Err(e) => Look::WorkerSilent(format!("its worker {e} (master pid {})", p.pid)),
                },
                Ok(p) => Look::Up(p),
                Err(e) => Look::Silent(e.to_string()),
            },
            Ok(Err(e)) | Err(e) if pid.is_none() => match self.unreachable().as_slice() {
                [] => Look::Gone(format!("no HAProxy master runs ({}: {e})", self.master.display())),
                pids => Look::Silent(unreachable_reason(pids, &self.master)),
            },
            Ok(Err(e)) | Err(e) => Look::Silent(format!("its master CLI does not answer: {e}")),
        }
    }

    /// Whether every worker in `pids` answers `show info`, asked through the master (`@!<pid>`),
    /// within `patience` each: a worker that is alive but stopped or hung — the current one, or an
    /// old one that could not let go of its listening sockets — keeps taking connections it never
    /// serves, while its master answers as usual. Asked through the master rather than the admin
    /// socket, which only the current worker serves and a configuration the agent did not make may
    /// lack. Errors: `<pid> does not answer: <why>` for the first that does not.
    async fn workers_answer(&self, pids: &[u32], patience: Duration) -> Result<(), String> {
        for pid in pids {
            let answer = tokio::time::timeout(patience, exchange(&self.master, &format!("@!{pid} show info"))).await;
            let why = match answer {
                Ok(Ok(text)) if text.lines().any(|l| l.starts_with("Pid: ")) => continue,
                // The master gives up on a worker that does not answer with an empty answer, which
                // says what a timeout says.
                Ok(Ok(text)) if text.trim().is_empty() => format!("no answer to `show info` in {patience:?}"),
                Ok(Ok(text)) => format!("unexpected `show info` answer: {:?}", text.trim()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer to `show info` in {patience:?}"),
            };
            // An old worker that exited while it was asked is not silent: after a reload at 10,000
            // frontends it spends a second or two stopping its proxies, then leaves.
            if !alive(*pid) {
                continue;
            }
            return Err(format!("{pid} does not answer: {why}"));
        }
        Ok(())
    }

    /// HAProxy's last `n` output lines, joined.
    pub fn log_tail(&self, n: usize) -> String {
        let tail = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let skip = tail.len().saturating_sub(n);
        tail.iter().skip(skip).cloned().collect::<Vec<_>>().join(" | ")
    }
}

/// Makes the kernel send SIGTERM to the child when the agent's thread that spawned it exits
/// (`PR_SET_PDEATHSIG`, kept across HAProxy's re-exec on reload; its workers follow the master).
/// The runtime's worker threads live as long as the agent, so that is when the agent exits.
fn tie_to_parent(command: &mut tokio::process::Command) {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// One command on a CLI socket (connect, send, half-close, read to the end); retried for a moment
/// while the socket is being re-created by a reload. Errors: [`HaproxyError::Unavailable`].
async fn ask(socket: &Path, command: &str) -> Result<String, HaproxyError> {
    let mut last = String::new();
    for _ in 0..50 {
        match exchange(socket, command).await {
            Ok(answer) => return Ok(answer),
            Err(e) => {
                last = e.to_string();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    Err(HaproxyError::Unavailable(format!("{}: {last}", socket.display())))
}

async fn exchange(socket: &Path, command: &str) -> std::io::Result<String> {
    let io = async {
        let mut s = UnixStream::connect(socket).await?;
        s.write_all(format!("{command}\n").as_bytes()).await?;
        s.shutdown().await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    };
    tokio::time::timeout(Duration::from_secs(5), io).await.map_err(|_| std::io::Error::other("no answer in 5 s"))?
}

/// Why the agent neither uses nor replaces the HAProxy processes `pids` of this installation whose
/// master socket `socket` is gone, and what to do.
pub fn unreachable_reason(pids: &[u32], socket: &Path) -> String {
    let list = pids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    format!(
        "HAProxy of this directory runs (pids {list}) but its master socket {} is gone (the directory was \
         wiped while it ran): it serves what it last ran and holds the VIPs' ports, so the agent does not \
         start another beside it; stop it (`kill {list}`) and (re)start the agent, which then starts its own",
        socket.display()
    )
}

/// The pids of the workers a `show proc` answer lists (the current one first, then old ones).
fn worker_pids(text: &str) -> Vec<u32> {
    text.lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("worker"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

fn parse_proc(text: &str) -> Result<Proc, HaproxyError> {
    let bad = || HaproxyError::Unavailable(format!("unexpected `show proc` answer: {text:?}"));
    let master = text.lines().find(|l| l.split_whitespace().nth(1) == Some("master")).ok_or_else(bad)?;
    let fields: Vec<&str> = master.split_whitespace().collect();
    let pid = fields.first().and_then(|f| f.parse().ok()).ok_or_else(bad)?;
    let reloads = fields.get(2).and_then(|f| f.parse().ok()).ok_or_else(bad)?;
    let failed = master
        .split("[failed: ")
        .nth(1)
        .and_then(|r| r.split(']').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let workers = text.lines().filter(|l| l.split_whitespace().nth(1) == Some("worker")).count();
    Ok(Proc { pid, reloads, failed, workers })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_refusal_keeps_its_first_lines_and_says_how_many_are_left_out() {
        let text: Vec<String> = (1..=25).map(|i| format!("[ALERT] line {i}")).collect();
        let kept = super::first_lines(&text.join("\n"), 20);
        assert_eq!(kept.lines().count(), 21);
        assert_eq!(kept.lines().last(), Some("… (5 more lines)"));
        assert_eq!(super::first_lines(&"x".repeat(600), 20), format!("{}…", "x".repeat(511)));
    }

    use super::*;

    #[test]
    fn show_proc_of_haproxy_2_6_is_parsed() {
        let text = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
                    1244            master          2 [failed: 1]   0d00h00m02s     2.6.12-1+deb12u4\n\
                    # workers\n1298            worker          1               0d00h00m01s     2.6.12-1+deb12u4\n\
                    # programs\n\n";
        assert_eq!(parse_proc(text).unwrap(), Proc { pid: 1244, reloads: 2, failed: 1, workers: 1 });
    }
}
