//! The benchmarks' figures as data: each run replaces its benchmark's entry in one JSON file,
//! `benchmarks/results.json` (schema: `docs/benchmarks.md`), from which `scripts/bench-report.py`
//! makes the tables and plots of the docs. The human-readable lines on stdout stay as they are.
//!
//! A figure is a name, a value and a unit, and, where the run has one, the baseline it is compared
//! with (measured in the same run, in the same unit) and the ratio value / baseline: absolute figures
//! depend on the machine and what else runs on it, ratios to a baseline of the same minute much less.
//!
//! `BENCH_RESULTS=path` writes another file (an A/B run that should not replace the committed
//! figures); `BENCH_RESULTS=` (empty) writes none.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{Map, Value, json};

/// The file's format; `scripts/bench-report.py` refuses another.
pub const SCHEMA: u64 = 1;

/// Significant digits kept of every value and ratio: the runs' noise is far larger, and shorter
/// numbers keep the file's diffs small.
const DIGITS: i32 = 4;

/// One run of one benchmark: its parameters and figures, written by [`Results::write`].
pub struct Results {
    key: String,
    args: Vec<String>,
    parameters: Map<String, Value>,
    figures: Vec<Value>,
    date: jiff::Timestamp,
    commit: Value,
    load_start: Option<f64>,
    begun: Instant,
}

impl Results {
    /// A run of benchmark `key` (its entry in the file: the bench's name, or a mode of it such as
    /// `burst-sizes`), begun now: the date, commit and load are taken here, before the measurements.
    pub fn new(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            // `cargo bench` passes `--bench` to every harness-less benchmark: not one of ours.
            args: std::env::args().skip(1).filter(|a| a != "--bench").collect(),
            parameters: Map::new(),
            figures: Vec::new(),
            date: jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).expect("now is a valid time"),
            commit: commit(),
            load_start: load_average(),
            begun: Instant::now(),
        }
    }

    /// An effective parameter of the run (its defaults included), e.g. `("services", 10000)`.
    pub fn param(&mut self, name: &str, value: impl Into<Value>) {
        self.parameters.insert(name.to_owned(), value.into());
    }

    /// A figure without a baseline (a count, or a value whose reference is another figure's).
    pub fn figure(&mut self, name: &str, value: f64, unit: &str) {
        self.push(name, value, unit, None);
    }

    /// A figure next to its baseline from the same run, in the same unit: `baseline` names it and
    /// `base` is its value; the ratio is `value / base`.
    pub fn compare(&mut self, name: &str, value: f64, unit: &str, baseline: &str, base: f64) {
        self.push(name, value, unit, Some((baseline, base)));
    }

    fn push(&mut self, name: &str, value: f64, unit: &str, baseline: Option<(&str, f64)>) {
        assert!(
            self.figures.iter().all(|f| f["name"] != name),
            "{}: figure {name:?} recorded twice (names identify figures)",
            self.key
        );
        let (baseline, ratio) = match baseline {
            Some((b, base)) => (json!({"name": b, "value": number(base)}), number(value / base)),
            None => (Value::Null, Value::Null),
        };
        self.figures
            .push(json!({"name": name, "value": number(value), "unit": unit, "baseline": baseline, "ratio": ratio}));
    }

    /// Merges this run into the results file (see the module's doc): under an exclusive lock on its
    /// directory, reads the file, replaces this benchmark's entry, writes a temporary file beside it
    /// and renames it over the file. Keys are sorted, so a new run changes only its own lines.
    pub fn write(self) {
        let Some(path) = path() else { return };
        let entry = json!({
            "args": self.args,
            "parameters": self.parameters,
            "environment": environment(),
            "date": self.date.to_string(),
            "duration_s": number(self.begun.elapsed().as_secs_f64()),
            "commit": self.commit,
            "machine": machine(self.load_start),
            "figures": self.figures,
        });
        if let Err(e) = merge(&path, &self.key, entry.clone()) {
            eprintln!("{}: not written ({e}); this run's entry `{}`:\n{entry:#}", path.display(), self.key);
            return;
        }
        eprintln!("{}: `{}` written", path.display(), self.key);
    }
}

/// `BENCH_RESULTS`, else `benchmarks/results.json` in the repository; `None` when set but empty.
fn path() -> Option<PathBuf> {
    match std::env::var_os("BENCH_RESULTS") {
        Some(p) if p.is_empty() => None,
        Some(p) => Some(p.into()),
        None => Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("benchmarks/results.json")),
    }
}

fn merge(path: &Path, key: &str, entry: Value) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    // The lock is the directory's (flock works on a directory's descriptor): no lock file to leave
    // behind, and two benchmarks finishing at once do not lose each other's entry.
    let lock = std::fs::File::open(&dir)?;
    // SAFETY: flock on a descriptor we own; it is released when `lock` is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut all = match std::fs::read_to_string(path) {
        Ok(text) => {
            serde_json::from_str::<Value>(&text).map_err(|e| std::io::Error::other(format!("not JSON: {e}")))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({}),
        Err(e) => return Err(e),
    };
    if !all.is_object() {
        return Err(std::io::Error::other("not a JSON object"));
    }
    match all.get("schema") {
        None => all["schema"] = json!(SCHEMA),
        Some(s) if *s == json!(SCHEMA) => {}
        Some(s) => return Err(std::io::Error::other(format!("schema {s}, this benchmark writes {SCHEMA}"))),
    }
    if !all["benchmarks"].is_object() {
        all["benchmarks"] = json!({});
    }
    all["benchmarks"][key] = entry;
    let text = serde_json::to_string_pretty(&sorted(all)).expect("a Value serializes") + "\n";
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("results"),
        std::process::id()
    ));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// `value` with its object keys in order at every depth (whatever order `serde_json::Map` keeps).
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let ordered: BTreeMap<String, Value> = map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(ordered.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// `v` rounded to [`DIGITS`] significant digits; `null` when not finite (a phase that did not run).
fn number(v: f64) -> Value {
    if !v.is_finite() {
        return Value::Null;
    }
    if v == 0.0 {
        return json!(0.0);
    }
    let decimals = DIGITS - 1 - v.abs().log10().floor() as i32;
    let rounded = if decimals >= 0 {
        format!("{v:.0$}", decimals as usize).parse().unwrap_or(v)
    } else {
        let unit = 10f64.powi(-decimals);
        (v / unit).round() * unit
    };
    json!(rounded)
}

/// The checkout's commit, `{"id": <short hash>, "dirty": <bool>, "built": <UTC time>}`: dirty when
/// the code measured may not be that commit's, because a tracked file other than the results and
/// the docs differs from it, or because a source file changed after this benchmark was built (in a
/// checkout shared with others, or a binary run without `cargo bench`). `null` outside a git
/// checkout.
fn commit() -> Value {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let Some(id) = git(&["rev-parse", "--short", "HEAD"]) else { return Value::Null };
    let changes =
        git(&["status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks", ":(exclude)docs"]);
    // The older of this benchmark's executable and the `vipwatch` binary it runs.
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let exe = std::env::current_exe().ok();
    let built = [exe.as_deref().and_then(modified), modified(Path::new(env!("CARGO_BIN_EXE_vipwatch")))]
        .into_iter()
        .flatten()
        .min();
    let sources = git(&["ls-files", "--", "src", "crates", "benches", "migrations", "Cargo.toml", "Cargo.lock"]);
    let newer = match (built, sources) {
        (Some(built), Some(files)) => {
            files.lines().any(|f| modified(&Path::new(dir).join(f)).is_some_and(|m| m > built))
        }
        _ => true,
    };
    let built = built
        .and_then(|t| jiff::Timestamp::try_from(t).ok())
        .and_then(|t| jiff::Timestamp::from_second(t.as_second()).ok())
        .map(|t| t.to_string());
    json!({"id": id, "dirty": newer || changes.is_none_or(|c| !c.is_empty()), "built": built})
}

/// What the figures depend on: the CPU model, its cores, the memory, and the 1-minute load average
/// at the start and the end of the run (above the cores, other work shared them).
fn machine(load_start: Option<f64>) -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_owned()));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: Option<f64> = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
    json!({
        "cpu": cpu,
        "cores": cores,
        "memory_gib": mem_kib.map(|k| (k / 1024.0 / 1024.0 * 10.0).round() / 10.0),
        "load_1m": {"start": load_start.map(number), "end": load_average().map(number)},
    })
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// The knobs in the environment that change what a benchmark measures: `BENCH_*`, vipwatch's own
/// `VIPWATCH_*` overrides (its children inherit them), the allocators' variables. Values of names
/// that may hold a secret (a database URL, a password, a token) are written as `(set)`.
fn environment() -> BTreeMap<String, String> {
    const PREFIXES: [&str; 4] = ["BENCH_", "VIPWATCH_", "MIMALLOC_", "MALLOC_"];
    const SECRET: [&str; 5] = ["URL", "SECRET", "PASSWORD", "TOKEN", "KEY"];
    std::env::vars()
        .filter(|(k, _)| PREFIXES.iter().any(|p| k.starts_with(p)) || k == "GLIBC_TUNABLES")
        .map(|(k, v)| {
            let hidden = SECRET.iter().any(|s| k.to_ascii_uppercase().contains(s));
            let v = if hidden { "(set)".to_owned() } else { v };
            (k, v)
        })
        .collect()
}
