//! The memory allocators of the `vipwatch` binary, and their settings.
//!
//! The binary's Rust code allocates with mimalloc (`#[global_allocator]` in `src/main.rs`); SQLite,
//! which is C, allocates with glibc's `malloc`. [`tune`] sets both up for a long-running process
//! whose peaks (a first list, a burst of changes) are far above its steady state. Each setting given
//! in the environment wins over the one made here.
//!
//! Why mimalloc: with glibc's allocator for everything, its slow paths (`_int_malloc`,
//! `malloc_consolidate`, `unlink_chunk`: the 1–2 KB bodies, rows and buffers of every change are
//! beyond its per-thread cache) took a large share of vipwatch's CPU in a burst of changes, and no
//! glibc setting changed that (more per-thread cache, no fastbins, two arenas). mimalloc lowers the
//! CPU per change and the latency of a burst, for a little more peak RSS with the settings of
//! [`tune_mimalloc`]. The measurements are in docs/explanation/design-decisions.md.

/// Sets up both allocators. Call first thing in `main`.
///
/// # Safety
/// No other thread may exist yet: glibc's `mallopt` and mimalloc's option table are not made for
/// changes while other threads allocate.
pub unsafe fn tune() {
    tune_mimalloc();
    tune_glibc();
}

/// mimalloc 3's option numbers, from `mimalloc.h` (`mi_option_e`) of `libmimalloc-sys` 0.1.49
/// (mimalloc 3.3.2), whose Rust bindings do not name them. The dependency is pinned to that version;
/// `the_option_numbers_name_the_options_meant` checks them against their distinctive defaults.
mod option {
    /// Delay before freed memory goes back to the system (ms; mimalloc 3's default 1,000).
    pub const PURGE_DELAY: i32 = 15;
    /// Collect the thread's heap every N "generic" allocations (default 10,000).
    pub const GENERIC_COLLECT: i32 = 34;
    /// Full small pages kept per size class (default 2).
    pub const PAGE_FULL_RETAIN: i32 = 36;

    /// The value mimalloc now reads for `option`.
    pub fn get(option: i32) -> std::ffi::c_long {
        // SAFETY: reads one of mimalloc's option values.
        unsafe { libmimalloc_sys::mi_option_get(option) }
    }
}

/// mimalloc's defaults trade memory for speed: freed memory goes back to the system a second
/// later, and with transparent huge pages on (`madvise`, Debian's default) its arenas are backed by
/// 2 MiB pages: peak RSS in a burst of changes is far higher. So (each step lowers peak RSS at the
/// same CPU; see docs/explanation/design-decisions.md):
/// - its arenas are never advised into huge pages (the crate's `no_thp` feature, `Cargo.toml`), and
///   huge pages are off for this process (`prctl(PR_SET_THP_DISABLE)`, for systems where they are
///   `always` on) unless `MIMALLOC_ALLOW_THP` is set;
/// - freed memory goes back at once (`purge_delay` 0), no full pages are kept per size class (in
///   every thread started after `main` begins: the main thread's heap was made before, with 2), and
///   a thread's heap is collected every 1,000 slow-path allocations (mimalloc checks the count only
///   that often, so smaller values act the same).
///
/// The same options in the environment (`MIMALLOC_PURGE_DELAY`, `MIMALLOC_GENERIC_COLLECT`,
/// `MIMALLOC_PAGE_FULL_RETAIN`) win: mimalloc read them when the process started, and
/// `mi_option_set_default` changes only an option the environment left unset. So
/// `MIMALLOC_VERBOSE=1`, which prints the options at that start, shows mimalloc's defaults for the
/// three, not these values. Turning huge pages off is inherited by child processes (the demo's
/// HAProxy).
fn tune_mimalloc() {
    if !in_environment("allow_thp") {
        disable_transparent_huge_pages();
    }
    let settings = [(option::PURGE_DELAY, 0), (option::GENERIC_COLLECT, 1_000), (option::PAGE_FULL_RETAIN, 0)];
    for (option, value) in settings {
        // SAFETY: sets one of mimalloc's option values (a plain store into its option table).
        unsafe { libmimalloc_sys::mi_option_set_default(option, value) };
    }
}

/// Logs the settings in effect at `debug`, as one line `allocator settings` with mimalloc's
/// `purge_delay_ms`, `page_full_retain` and `generic_collect` as it now reads them, and
/// `thp_disabled` (whether transparent huge pages are off for this process; always `false` off
/// Linux). `MIMALLOC_VERBOSE` cannot show these: it prints the options before [`tune`] ran. Call
/// once logging is set up.
pub fn log_settings() {
    let get = option::get;
    tracing::debug!(
        purge_delay_ms = get(option::PURGE_DELAY),
        page_full_retain = get(option::PAGE_FULL_RETAIN),
        generic_collect = get(option::GENERIC_COLLECT),
        thp_disabled = transparent_huge_pages_disabled(),
        "allocator settings"
    );
}

/// Whether transparent huge pages are off for this process (`PR_GET_THP_DISABLE`).
fn transparent_huge_pages_disabled() -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_GET_THP_DISABLE only reads a flag of this process.
    return unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) } == 1;
    #[cfg(not(target_os = "linux"))]
    false
}

/// Whether mimalloc's option `name` (e.g. `allow_thp`) is in the environment: `MIMALLOC_<name>`,
/// in any case, as mimalloc reads it.
fn in_environment(name: &str) -> bool {
    let var = format!("MIMALLOC_{name}");
    std::env::vars_os().any(|(k, _)| k.eq_ignore_ascii_case(&var))
}

/// Turns transparent huge pages off for this process (Linux; a no-op elsewhere). mimalloc's own
/// `allow_thp` option does the same, but it is read when the process starts, before `main`.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Tunes glibc's allocator, which SQLite's allocations go to. Must run before any thread starts. A
/// setting given in the environment (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`, or `glibc.malloc.*` in `GLIBC_TUNABLES`) wins: glibc reads those at the
/// first allocation, and each one set there is left alone here.
///
/// - One malloc arena instead of up to eight per core: every thread that allocates (one thread per
///   SQLite connection) otherwise gets an arena of its own that keeps freed memory. Each arena
///   fewer lowers peak RSS, at no CPU cost (see docs/explanation/design-decisions.md).
/// - Fixed mmap and trim thresholds of 128 KiB (glibc's defaults, which it otherwise raises up to
///   32 MiB as large blocks are freed): a large buffer then gets its own mapping that goes back to
///   the system when freed, instead of a hole in the heap that later small allocations pin, and free
///   memory at the heap's top goes back too. Peak RSS is lower, CPU per change the same.
fn tune_glibc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        let unset = |var: &str, tunable: &str| std::env::var_os(var).is_none() && !tunables.contains(tunable);
        let settings = [
            ("MALLOC_ARENA_MAX", "glibc.malloc.arena_max", libc::M_ARENA_MAX, 1),
            ("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold", libc::M_MMAP_THRESHOLD, 128 << 10),
            ("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold", libc::M_TRIM_THRESHOLD, 128 << 10),
        ];
        for (var, tunable, param, value) in settings {
            if unset(var, tunable) {
                // SAFETY: mallopt only sets an allocator parameter; no other thread exists yet.
                unsafe {
                    libc::mallopt(param, value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::option::{self, get};

    /// The hard-coded option numbers are the options meant: mimalloc 3.3.2's defaults of those three
    /// are 1,000, 10,000 and 2, and of `page_max_candidates` (37) 4 (`src/options.c`); no test of
    /// this binary calls [`super::tune`].
    #[test]
    fn the_option_numbers_name_the_options_meant() {
        let vars = ["purge_delay", "reset_delay", "generic_collect", "page_full_retain", "page_max_candidates"];
        if vars.iter().any(|v| super::in_environment(v)) {
            return; // set by whoever runs the tests: the defaults are not what they say
        }
        assert_eq!(
            [get(option::PURGE_DELAY), get(option::GENERIC_COLLECT), get(option::PAGE_FULL_RETAIN)],
            [1_000, 10_000, 2]
        );
        // `page_max_candidates` (default 4) comes right after the last one.
        assert_eq!(get(option::PAGE_FULL_RETAIN + 1), 4);
    }
}
