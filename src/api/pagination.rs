//! Paging shared by every list: `limit` (1..=1000, default 100), opaque `cursor`s, and the
//! `{"items": [...], "next_cursor": ...}` envelope; plus the RFC 3339 time parameters.
//!
//! A cursor is base64url (no padding) of `{"l": <list>, "k": <last key served>}` followed by the
//! first 8 bytes of SHA-256 over a domain tag and that JSON. The check catches any altered,
//! truncated or foreign cursor (400 `invalid_cursor`); it is an integrity check, not a secret: a
//! cursor only names a position in a list every caller may read anyway. Cursors stay valid across
//! restarts.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::error::ApiError;

/// Items per page when `limit` is absent.
pub const DEFAULT_LIMIT: u32 = 100;
/// Largest accepted `limit`.
pub const MAX_LIMIT: u32 = 1000;

const TAG: &[u8] = b"vipwatch-cursor-v1\0";
const CHECK_LEN: usize = 8;

/// Validates `limit`: absent = [`DEFAULT_LIMIT`]; outside 1..=[`MAX_LIMIT`] is
/// [`ApiError::InvalidQuery`].
pub fn limit(requested: Option<u32>) -> Result<usize, ApiError> {
    match requested.unwrap_or(DEFAULT_LIMIT) {
        n @ 1..=MAX_LIMIT => Ok(n as usize),
        n => Err(ApiError::InvalidQuery(format!("limit: {n} is not between 1 and {MAX_LIMIT}"))),
    }
}

/// The cursor for "after `key`" in list `list` (e.g. `events`).
pub fn encode_cursor<K: Serialize>(list: &str, key: &K) -> String {
    let json = serde_json::to_vec(&serde_json::json!({ "l": list, "k": key })).unwrap_or_default();
    let mut bytes = json.clone();
    bytes.extend_from_slice(&check(&json));
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The key inside `cursor`, if it was issued for `list` and is intact; else
/// [`ApiError::InvalidCursor`].
pub fn decode_cursor<K: DeserializeOwned>(list: &str, cursor: &str) -> Result<K, ApiError> {
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| ApiError::InvalidCursor)?;
    let split = bytes.len().checked_sub(CHECK_LEN).ok_or(ApiError::InvalidCursor)?;
    let (json, sum) = bytes.split_at(split);
    if check(json) != sum {
        return Err(ApiError::InvalidCursor);
    }
    #[derive(serde::Deserialize)]
    struct Envelope<K> {
        l: String,
        k: K,
    }
    let envelope: Envelope<K> = serde_json::from_slice(json).map_err(|_| ApiError::InvalidCursor)?;
    if envelope.l != list {
        return Err(ApiError::InvalidCursor);
    }
    Ok(envelope.k)
}

/// Decodes an optional cursor (see [`decode_cursor`]).
pub fn after<K: DeserializeOwned>(list: &str, cursor: Option<&str>) -> Result<Option<K>, ApiError> {
    cursor.map(|c| decode_cursor(list, c)).transpose()
}

fn check(json: &[u8]) -> [u8; CHECK_LEN] {
    let digest = Sha256::new().chain_update(TAG).chain_update(json).finalize();
    let mut out = [0u8; CHECK_LEN];
    out.copy_from_slice(&digest[..CHECK_LEN]);
    out
}

/// Cuts a page: `rows` were fetched with `limit + 1`; keeps `limit` and returns the cursor after the
/// last kept row when more exist.
pub fn cut<T, K: Serialize>(
    mut rows: Vec<T>,
    limit: usize,
    list: &str,
    key: impl Fn(&T) -> K,
) -> (Vec<T>, Option<String>) {
    if rows.len() <= limit {
        return (rows, None);
    }
    rows.truncate(limit);
    let next = rows.last().map(|last| encode_cursor(list, &key(last)));
    (rows, next)
}

/// Parses an RFC 3339 time parameter `name` to Unix milliseconds; else [`ApiError::InvalidQuery`].
pub fn parse_time(name: &str, value: &str) -> Result<i64, ApiError> {
    let ts: jiff::Timestamp =
        value.parse().map_err(|e| ApiError::InvalidQuery(format!("{name}: not an RFC 3339 time: {e}")))?;
    Ok(ts.as_millisecond())
}

pub use crate::model::rfc3339;

/// Declares a page type `{"items": [...], "next_cursor": ...}` of `$item` with an OpenAPI schema.
macro_rules! page {
    ($name:ident, $item:ty, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, serde::Serialize, utoipa::ToSchema)]
        pub struct $name {
            /// This page, in the list's order.
            pub items: Vec<$item>,
            /// Pass as `cursor` for the next page; `null` on the last page.
            pub next_cursor: Option<String>,
        }
    };
}
pub(crate) use page;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_any_altered_byte_is_rejected() {
        let c = encode_cursor("events", &42i64);
        assert_eq!(decode_cursor::<i64>("events", &c).unwrap(), 42);
        assert!(matches!(decode_cursor::<i64>("deliveries", &c), Err(ApiError::InvalidCursor)));
        for i in 0..c.len() {
            let mut bytes = c.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let tampered = String::from_utf8(bytes).unwrap();
            assert!(decode_cursor::<i64>("events", &tampered).is_err(), "byte {i}");
        }
        assert!(decode_cursor::<i64>("events", "").is_err());
        assert!(decode_cursor::<i64>("events", "!!").is_err());
    }

    #[test]
    fn limits_outside_the_range_are_rejected() {
        assert_eq!(limit(None).unwrap(), 100);
        assert_eq!(limit(Some(1000)).unwrap(), 1000);
        assert!(limit(Some(0)).is_err() && limit(Some(1001)).is_err());
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(parse_time("since", "2026-01-01T00:00:00Z").unwrap(), 1_767_225_600_000);
        assert_eq!(parse_time("since", "2026-01-01T01:00:00.5+01:00").unwrap(), 1_767_225_600_500);
        assert!(parse_time("since", "yesterday").is_err());
    }
}
