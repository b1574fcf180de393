//! Object metadata helpers shared by the object store and the Event store: uids, timestamps,
//! `generateName` suffixes, finalizer and deletion-timestamp accessors. (Key normalisation depends on a
//! resource's scope and lives in [`super::resource::Resource::normalise`].)

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

/// `metadata` of an object as a mutable map, creating it (and making `obj` an object) if needed.
pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let map = obj.as_object_mut().expect("just made an object");
    let meta = map.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut().expect("just made an object")
}

/// A string field of `metadata`, `None` if absent, not a string or empty.
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str().filter(|s| !s.is_empty())
}

/// `metadata.finalizers` as strings (absent / `null` / non-array = none; non-string entries skipped).
pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// Whether the object carries a `metadata.deletionTimestamp` (it is being deleted, waiting for finalizers).
pub(crate) fn is_terminating(obj: &Value) -> bool {
    meta_str(obj, "deletionTimestamp").is_some()
}

/// `name` + 5 random characters from the apiserver's alphabet (`bcdfghjklmnpqrstvwxz2456789`), as
/// `metadata.generateName` asks for.
pub(crate) fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = next_random();
    let suffix: String = (0..5)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize] as char;
            x /= ALPHABET.len() as u64;
            c
        })
        .collect();
    format!("{prefix}{suffix}")
}

/// A pseudo-random 64-bit number (process seed mixed with a counter by splitmix64); not cryptographic.
fn next_random() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut z = seed().wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0))
}

/// A fresh UUID-shaped uid, unique within this process.
pub(crate) fn new_uid() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let seed = seed();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
        (seed >> 32) as u32,
        (seed >> 16) & 0xffff,
        seed & 0xfff,
        (n >> 48) & 0xfff,
        n & 0xffff_ffff_ffff
    )
}

/// Current UTC time as RFC 3339 with second precision, e.g. `2025-01-31T12:00:00Z`.
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_shape() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
    }

    #[test]
    fn generated_names_differ_and_use_the_alphabet() {
        let (a, b) = (generate_name("web-"), generate_name("web-"));
        assert_ne!(a, b);
        assert_eq!(a.len(), 9);
        assert!(a[4..].bytes().all(|c| b"bcdfghjklmnpqrstvwxz2456789".contains(&c)), "{a}");
    }

    #[test]
    fn finalizer_helpers() {
        let o = json!({"metadata": {"finalizers": ["a", 1, "b"], "deletionTimestamp": "2025-01-01T00:00:00Z"}});
        assert_eq!(finalizers(&o), vec!["a", "b"]);
        assert!(is_terminating(&o));
        assert!(!is_terminating(&json!({"metadata": {"deletionTimestamp": null}})));
    }
}
