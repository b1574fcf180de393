//! Time as vipwatch shows it: Unix milliseconds rendered as RFC 3339.

/// Unix milliseconds as RFC 3339 in UTC with milliseconds, e.g. `2026-11-29T23:05:00.123Z` (the
/// webhook payload's `timestamp`, every time the API shows). A value outside jiff's range (years
/// −9999 to 9999) shows as the Unix epoch.
pub fn rfc3339(ms: i64) -> String {
    let ts = jiff::Timestamp::from_millisecond(ms).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{ts:.3}")
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn milliseconds_render_as_rfc3339_utc() {
        assert_eq!(rfc3339(1_796_147_117_123), "2026-12-01T17:45:17.123Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(i64::MAX), "1970-01-01T00:00:00.000Z");
    }
}
