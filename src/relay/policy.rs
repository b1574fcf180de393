//! The retry policy (docs/explanation/delivery.md): what an attempt's result
//! means for the delivery, and when to try again.

use std::time::{Duration, SystemTime};

use backon::{BackoffBuilder, ExponentialBuilder};

use crate::config::RetryConfig;
use crate::store::Outcome;

/// What the receiver (or the network) said, as far as the policy cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx.
    Success,
    /// 410 Gone: the receiver wants no more deliveries; the endpoint is disabled.
    Gone,
    /// A request template's `permanent` status, or a template that cannot render: the delivery
    /// fails at once (replayable).
    Permanent,
    /// Anything else (timeout, connect, TLS, redirect, non-2xx): retry per schedule.
    Retry {
        /// `Retry-After` of a 429/503, if any.
        retry_after: Option<Duration>,
    },
}

/// Whether a non-2xx answer to a DELETED still completes it: 404 (the appliance has no such VIP) and
/// 410 (gone) both mean the load balancer is not there any more, which is what a DELETED asks for
/// For other kinds they are failures.
pub fn already_gone(kind: &str, status: Option<u16>) -> bool {
    kind == "DELETED" && matches!(status, Some(404 | 410))
}

/// The delay before attempt `attempts + 1`, after `attempts` failures (1-based): `initial_delay`
/// doubling per failure up to `max_delay`, with jitter (backon's exponential backoff).
pub fn backoff(retry: &RetryConfig, attempts: u32) -> Duration {
    ExponentialBuilder::default()
        .with_min_delay(retry.initial_delay)
        .with_max_delay(retry.max_delay)
        .with_jitter()
        .without_max_times()
        .build()
        .nth(attempts.saturating_sub(1) as usize)
        .unwrap_or(retry.max_delay)
        .min(retry.max_delay)
}

/// The delivery's next state after a failed attempt: `Failed` once `max_attempts` attempts are spent
/// or the delivery is older than `max_age`; else `Retry` after [`retry_delay`]. `attempts` counts
/// the attempt just made.
pub fn after_failure(
    retry: &RetryConfig,
    attempts: u32,
    age: Duration,
    now_ms: i64,
    retry_after: Option<Duration>,
) -> Outcome {
    if attempts >= retry.max_attempts || age >= retry.max_age {
        return Outcome::Failed;
    }
    let delay = retry_delay(retry, attempts, retry_after);
    Outcome::Retry(now_ms + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX))
}

/// The wait after `attempts` failures when the receiver asked for `retry_after`: its answer is a
/// hint bounded by our own policy, as the established senders treat it: never sooner than our
/// backoff (a `Retry-After` in the past or of 0 s does not make us hammer it), never later than
/// `max_delay`.
pub fn retry_delay(retry: &RetryConfig, attempts: u32, retry_after: Option<Duration>) -> Duration {
    let ours = backoff(retry, attempts);
    retry_after.map_or(ours, |asked| asked.max(ours)).min(retry.max_delay)
}

/// Parses `Retry-After`: delay-seconds or an HTTP date (RFC 9110 §10.2.3). A date in the past is 0.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // delay-seconds past u64 is still a (very long) delay, clamped like any other.
        return Some(Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry() -> RetryConfig {
        RetryConfig {
            max_attempts: 5,
            max_age: Duration::from_secs(3600),
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let r = retry();
        let first = backoff(&r, 1);
        assert!(first >= Duration::from_secs(1) && first <= Duration::from_secs(2), "{first:?}");
        let third = backoff(&r, 3);
        assert!(third >= Duration::from_secs(4) && third <= Duration::from_secs(8), "{third:?}");
        assert_eq!(backoff(&r, 30), Duration::from_secs(60));
    }

    #[test]
    fn gives_up_on_attempts_or_age_and_clamps_retry_after() {
        let r = retry();
        assert_eq!(after_failure(&r, 5, Duration::ZERO, 0, None), Outcome::Failed);
        assert_eq!(after_failure(&r, 1, Duration::from_secs(3600), 0, None), Outcome::Failed);
        assert_eq!(after_failure(&r, 1, Duration::ZERO, 1000, Some(Duration::from_secs(3))), Outcome::Retry(4000));
        assert_eq!(after_failure(&r, 1, Duration::ZERO, 0, Some(Duration::from_secs(999))), Outcome::Retry(60_000));
    }

    #[test]
    fn a_retry_after_shorter_than_our_backoff_or_in_the_past_waits_our_backoff() {
        let r = retry();
        // After the third failure our backoff is 4 to 8 s (1 s doubled twice, with jitter).
        for asked in [None, Some(Duration::ZERO), Some(Duration::from_millis(10)), Some(Duration::from_secs(2))] {
            let delay = retry_delay(&r, 3, asked);
            assert!(delay >= Duration::from_secs(4) && delay <= Duration::from_secs(8), "{asked:?}: {delay:?}");
        }
        assert_eq!(retry_delay(&r, 3, Some(Duration::from_secs(30))), Duration::from_secs(30));
        assert_eq!(retry_delay(&r, 3, Some(Duration::from_secs(3600))), Duration::from_secs(60));
    }

    /// tests/relay.rs `retry_after_is_honoured` and `a_retry_after_in_the_past_or_unreadable_waits_our_backoff`
    /// check over real sockets that the next attempt never comes sooner; the exact times are here, on
    /// the policy's own clock (`now_ms`), not on the wall clock of a loaded machine.
    #[test]
    fn the_next_attempt_is_scheduled_at_the_retry_after_asked_within_max_delay_or_after_our_backoff() {
        let r = RetryConfig { initial_delay: Duration::from_millis(400), max_delay: Duration::from_secs(5), ..retry() };
        let now = 1_000_000;
        let two_s = Some(Duration::from_secs(2));
        assert_eq!(after_failure(&r, 1, Duration::ZERO, now, two_s), Outcome::Retry(now + 2_000), "as asked");
        let at = |asked| match after_failure(&r, 1, Duration::ZERO, now, asked) {
            Outcome::Retry(at) => at - now,
            other => panic!("{other:?}"),
        };
        for asked in [None, Some(Duration::ZERO), Some(Duration::from_millis(10))] {
            assert!((400..=800).contains(&at(asked)), "{asked:?}: our first step, 400 ms plus jitter");
        }
        assert_eq!(at(Some(Duration::from_secs(60))), 5_000, "clamped to max_delay");
    }

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        let now = httpdate::parse_http_date("Sun, 29 Nov 2026 12:00:00 GMT").unwrap();
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("Sun, 29 Nov 2026 12:00:30 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("Sun, 29 Nov 2026 11:00:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("18446744073709551616", now), Some(Duration::from_secs(u64::MAX)));
        assert_eq!(parse_retry_after(&"9".repeat(7000), now), Some(Duration::from_secs(u64::MAX)));
        assert_eq!(parse_retry_after("-5", now), None);
    }
}
