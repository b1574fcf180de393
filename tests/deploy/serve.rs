//! `vipwatch serve` as a real process started the way a container runtime starts it: only the given
//! environment, a read-only root filesystem (remounted read-only in a private mount namespace of its
//! own, `unshare -rm`) and one fresh tmpfs as the only writable place, the database directory (the
//! Deployment's claim). Runs until `/readyz` answers 200, then gets SIGTERM.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

/// Every writable mount but the kernel's own is made read-only; then `$1` gets a tmpfs and the rest
/// of the arguments run in its place.
const READ_ONLY_ROOT: &str = r#"set -e
mount -o remount,bind,ro /
for m in $(findmnt -rn -o TARGET -O rw); do
  case "$m" in /proc*|/sys*|/dev*) ;; *) mount -o remount,bind,ro "$m" 2>/dev/null || true ;; esac
done
mount -t tmpfs -o mode=0700 tmpfs "$1"
shift
exec "$@""#;

/// How a [`serve_read_only`] run went.
pub struct Served {
    /// `/readyz` answered 200.
    pub ready: bool,
    /// The exit status after SIGTERM (or after it stopped on its own).
    pub status: ExitStatus,
    /// Everything it logged.
    pub stderr: String,
}

/// Starts `vipwatch serve` with exactly `env` (no other `VIPWATCH_*` variable) and `data` as the only
/// writable directory; waits up to `deadline` for `/readyz` to answer 200 on the address it logs, then
/// sends SIGTERM and waits up to `deadline` again for it to exit.
pub async fn serve_read_only(env: &[(String, String)], data: &Path, deadline: Duration) -> Served {
    let mut cmd = super::deploy_files::command("unshare", env);
    cmd.args(["-rm", "--", "sh", "-c", READ_ONLY_ROOT, "sh"]);
    cmd.arg(data).arg(env!("CARGO_BIN_EXE_vipwatch")).arg("serve");
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = tokio::process::Command::from(cmd).kill_on_drop(true).spawn().expect("unshare runs");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut stderr = String::new();
    let ready = tokio::time::timeout(deadline, async {
        while let Ok(Some(line)) = lines.next_line().await {
            stderr.push_str(&line);
            stderr.push('\n');
            if let Some(addr) = line.split("API listening addr=").nth(1) {
                return wait_ready(addr.trim()).await;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if let Some(pid) = child.id() {
        // The shell `exec`s vipwatch: the child's pid is vipwatch's.
        let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    }
    let status = tokio::time::timeout(deadline, child.wait()).await.expect("exits after SIGTERM").unwrap();
    while let Ok(Ok(Some(line))) = tokio::time::timeout(Duration::from_secs(1), lines.next_line()).await {
        stderr.push_str(&line);
        stderr.push('\n');
    }
    Served { ready, status, stderr }
}

/// Polls `http://ADDR/readyz` every 50 ms until it answers 200.
async fn wait_ready(addr: &str) -> bool {
    let url = format!("http://{addr}/readyz");
    vipwatch::relay::sender::install_crypto_provider();
    let client = reqwest::Client::new();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        if let Ok(r) = client.get(&url).send().await
            && r.status() == 200
        {
            return true;
        }
    }
}
