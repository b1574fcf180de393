//! What a test needs from outside the repository (a program on `PATH`, the PostgreSQL server of
//! `VIPWATCH_TEST_PG_URL`), with one policy for when it is missing: on a developer's machine the
//! test prints a visible `SKIPPED` line with the reason and returns early (a newcomer without
//! HAProxy or PostgreSQL still gets a green `cargo test`); under CI (`CI` set, as `.ci/run` sets it)
//! the test panics, since CI installs every one of them and an absence there is a broken run, not a
//! reason to skip.
//!
//! A plain file without `use super::…`, so that test binaries without the shared harness
//! (tests/deploy.rs) and the workspace's other crates include it with `#[path]`.

#![allow(dead_code)]

use std::path::PathBuf;

/// The environment variable with the URL of the PostgreSQL server the tests may use (any database on
/// it; each test creates its own). `scripts/pg-test.sh start DIR` prints one.
pub const PG_URL_VAR: &str = "VIPWATCH_TEST_PG_URL";

/// Whether this is a CI run: the `CI` variable is set (`.ci/run` sets it, as CI services do).
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// The path of the program `tool` on `PATH`, or `None` after a `SKIPPED` line naming the test and
/// how to install it. Under CI a missing program panics instead (see the module documentation).
pub fn require_tool(tool: &str) -> Option<PathBuf> {
    on_path(tool).or_else(|| missing(&format!("`{tool}` on PATH ({})", install_hint(tool))))
}

/// The URL of the PostgreSQL server in [`PG_URL_VAR`], or `None` after a `SKIPPED` line. Under CI an
/// unset variable panics instead (see the module documentation).
pub fn require_pg() -> Option<String> {
    match std::env::var(PG_URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => missing(&format!("a PostgreSQL server in {PG_URL_VAR} (`scripts/pg-test.sh start DIR` prints one)")),
    }
}

/// `Some(())` when the tests run as root, as network namespaces (`ip netns`) need; else `None` after a
/// `SKIPPED` line. Under CI it panics instead.
pub fn require_root() -> Option<()> {
    use std::os::unix::fs::MetadataExt as _;
    // `/proc/self` belongs to the process's effective user.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if root { Some(()) } else { missing("root, for network namespaces (`ip netns`)") }
}

/// Where each program the tests run comes from.
fn install_hint(tool: &str) -> &'static str {
    match tool {
        "haproxy" => "Debian package `haproxy`",
        "promtool" => "Debian package `prometheus`",
        "chromium" => "Debian package `chromium`",
        "keepalived" => "Debian package `keepalived`",
        "curl" => "Debian package `curl`",
        "ip" => "Debian package `iproute2`",
        _ => "see the README's test prerequisites",
    }
}

/// Panics under CI; else prints the `SKIPPED` line for the running test and returns `None`.
fn missing<T>(what: &str) -> Option<T> {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    if under_ci() {
        panic!("{test} needs {what}, and CI is set: CI installs it (`.ci/run`), so its absence is a broken run");
    }
    // Straight to stderr: the test harness captures `eprintln!` of a passing test.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test} needs {what}");
    None
}

/// The first executable file named `tool` in the directories of `PATH`: where the tests, and the
/// HAProxy agent they start (`haproxy_bin` defaults to `haproxy`), run it from.
fn on_path(tool: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|file| file.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}
