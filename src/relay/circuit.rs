//! The circuit breaker of one endpoint: after `circuit_failures` consecutive attempts that say the
//! endpoint is down, the circuit opens and only one probe attempt at a time goes out, on the
//! endpoint's backoff schedule; the first probe the endpoint answers closes it. It also keeps the
//! endpoint's own request to slow down: after a 429 or 503 with `Retry-After`, no attempt to the
//! endpoint starts before that time, whichever delivery it answered. Pure state; the dispatcher
//! drives it and publishes its view in the store's `Circuits` for the API.

use std::time::Duration;

use super::policy::retry_delay;
use super::sender::AttemptResult;
use crate::config::RetryConfig;
use crate::store::{CircuitState, CircuitView};

/// Whether an attempt's result says the endpoint itself is down (counts toward opening the circuit):
/// no HTTP answer (connect, timeout, TLS, forbidden address), a redirect, a 5xx, or 401, 403, 408,
/// 429 (every delivery would get them). Any other answer — 2xx, 410, or a 4xx refusing this one
/// delivery (400, 404, 409, 422, ...) — shows the endpoint up.
pub fn endpoint_down(result: &AttemptResult) -> bool {
    // Decided before any request went out (a template that cannot render, a held declaration).
    if matches!(result.record.error_class, Some("template" | "held")) {
        return false;
    }
    match result.record.status_code {
        None => true,
        Some(s) => (300..400).contains(&s) || s >= 500 || matches!(s, 401 | 403 | 408 | 429),
    }
}

/// A state change worth logging and counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Closed → open (threshold reached).
    Opened,
    /// Open → half-open (a probe went out).
    Probing,
    /// Half-open → open (the probe failed; the next one is scheduled).
    Reopened,
    /// Open or half-open → closed (the endpoint answered).
    Closed,
}

/// One endpoint's breaker. `threshold` 0 disables it (the circuit never opens).
#[derive(Debug, Clone)]
pub struct Circuit {
    threshold: u32,
    retry: RetryConfig,
    view: CircuitView,
    /// Failed probes since the circuit opened: the backoff step of the next probe.
    failed_probes: u32,
    /// Whether the last attempt that found the endpoint down got no HTTP answer at all (connect,
    /// timeout, TLS). Only then does an answer outside the deliveries say anything new
    /// ([`Self::reachable`]): an endpoint that answers 401 or 503 was reachable all along.
    unanswered: bool,
}

impl Circuit {
    /// A closed breaker that opens after `threshold` consecutive down attempts and then probes on
    /// `retry`'s schedule (`initial_delay` doubling to `max_delay`, with jitter).
    pub fn new(threshold: u32, retry: RetryConfig) -> Self {
        Self { threshold, retry, view: CircuitView::default(), failed_probes: 0, unanswered: false }
    }

    /// The current view.
    pub fn view(&self) -> CircuitView {
        self.view
    }

    /// How many attempts may start now, given `in_flight` attempts and the `concurrency` limit:
    /// none while the endpoint is throttled; all free slots while closed; while open, 1 once
    /// `next_probe_at` has come and nothing is in flight (attempts started before the circuit opened
    /// finish first); 0 while half-open.
    pub fn allowance(&self, now: i64, in_flight: usize, concurrency: usize) -> usize {
        if self.throttled(now) {
            return 0;
        }
        match self.view.state {
            CircuitState::Closed => concurrency.saturating_sub(in_flight),
            CircuitState::Open if in_flight == 0 && self.view.next_probe_at.is_none_or(|at| now >= at) => 1,
            CircuitState::Open | CircuitState::HalfOpen => 0,
        }
    }

    /// When the dispatcher should look again while the circuit blocks sending (`None` when closed
    /// or half-open: then due deliveries and finished attempts wake it): the later of the end of the
    /// throttle and the next probe.
    pub fn wake_at(&self) -> Option<i64> {
        let probe = (self.view.state == CircuitState::Open).then_some(self.view.next_probe_at).flatten();
        match (probe, self.view.throttled_until) {
            (Some(p), Some(t)) => Some(p.max(t)),
            (p, t) => p.or(t),
        }
    }

    /// Whether the endpoint asked not to be sent anything before a time still to come.
    pub fn throttled(&self, now: i64) -> bool {
        self.view.throttled_until.is_some_and(|until| until > now)
    }

    /// The endpoint answered `status` with `Retry-After: retry_after` at `now`: for a 429 or a 503,
    /// nothing more goes to it before `now + retry_after` (clamped to the retry schedule's
    /// `max_delay`). Returns the time when this starts or extends a throttle, `None` otherwise.
    pub fn throttle(&mut self, status: Option<u16>, retry_after: Option<Duration>, now: i64) -> Option<i64> {
        let asked = retry_after.filter(|_| matches!(status, Some(429 | 503)))?;
        let until = now.saturating_add(millis(asked.min(self.retry.max_delay)));
        if until <= now || self.view.throttled_until.is_some_and(|t| t >= until) {
            return None;
        }
        self.view.throttled_until = Some(until);
        Some(until)
    }

    /// The endpoint answered at `now` (Unix ms) outside the deliveries (a probe of
    /// [`super::catch_up`]): while open because attempts got no answer at all, the next probe may go
    /// now instead of at the next backoff step, so a receiver that comes back is noticed at once.
    /// Not when the attempts were answered (401, 5xx, ...): the endpoint was reachable and refusing,
    /// and probing at every such answer would replace the backoff with one attempt a second. Returns
    /// whether that changed anything.
    pub fn reachable(&mut self, now: i64) -> bool {
        let later = self.view.next_probe_at.is_some_and(|at| at > now) && self.unanswered;
        if self.view.state == CircuitState::Open && later {
            self.view.next_probe_at = Some(now);
        }
        self.view.state == CircuitState::Open && later
    }

    /// A probe was started (call after claiming while open).
    pub fn probe_started(&mut self) -> Option<Transition> {
        (self.view.state == CircuitState::Open).then(|| {
            self.view.state = CircuitState::HalfOpen;
            self.view.next_probe_at = None;
            Transition::Probing
        })
    }

    /// Records one finished attempt's `result` at `now` (Unix ms): [`Self::record`] with
    /// [`endpoint_down`], remembering whether a down attempt got any HTTP answer.
    pub fn record_result(
        &mut self,
        result: &AttemptResult,
        retry_after: Option<Duration>,
        now: i64,
    ) -> Option<Transition> {
        let down = endpoint_down(result);
        if down {
            self.unanswered = result.record.status_code.is_none();
        }
        self.record(down, retry_after, now)
    }

    /// Records one finished attempt at `now` (Unix ms): `down` per [`endpoint_down`], with the
    /// receiver's `Retry-After` if any (a longer wait than the backoff step, within `max_delay`).
    pub fn record(&mut self, down: bool, retry_after: Option<Duration>, now: i64) -> Option<Transition> {
        if !down {
            self.view.consecutive_failures = 0;
            if self.view.state == CircuitState::Closed {
                return None;
            }
            self.view = CircuitView { throttled_until: self.view.throttled_until, ..CircuitView::default() };
            self.failed_probes = 0;
            return Some(Transition::Closed);
        }
        self.view.consecutive_failures = self.view.consecutive_failures.saturating_add(1);
        match self.view.state {
            CircuitState::Closed if self.threshold > 0 && self.view.consecutive_failures >= self.threshold => {
                self.view.state = CircuitState::Open;
                self.view.open_since = Some(now);
                self.schedule_probe(retry_after, now);
                Some(Transition::Opened)
            }
            CircuitState::HalfOpen => {
                self.failed_probes = self.failed_probes.saturating_add(1);
                self.view.state = CircuitState::Open;
                self.schedule_probe(retry_after, now);
                Some(Transition::Reopened)
            }
            // An attempt started before the circuit opened, or a closed circuit below the threshold.
            CircuitState::Closed | CircuitState::Open => None,
        }
    }

    /// The next probe after the backoff step (a receiver's `Retry-After` when longer, within
    /// `max_delay`: [`retry_delay`]).
    fn schedule_probe(&mut self, retry_after: Option<Duration>, now: i64) {
        let delay = retry_delay(&self.retry, self.failed_probes.saturating_add(1), retry_after);
        self.view.next_probe_at = Some(now.saturating_add(millis(delay)));
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::policy::Verdict;
    use crate::store::AttemptRecord;

    fn retry() -> RetryConfig {
        RetryConfig {
            max_attempts: 100,
            max_age: Duration::from_secs(3600),
            initial_delay: Duration::from_millis(200),
            max_delay: Duration::from_millis(400),
        }
    }

    fn answered(status: Option<u16>) -> AttemptResult {
        let record = AttemptRecord { status_code: status, ..AttemptRecord::default() };
        AttemptResult { record, verdict: Verdict::Retry { retry_after: None }, body: Vec::new(), told: None }
    }

    #[test]
    fn opens_at_the_threshold_and_then_lets_one_probe_out_on_the_backoff_schedule() {
        let mut c = Circuit::new(3, retry());
        assert_eq!(c.record(true, None, 1000), None);
        assert_eq!(c.record(true, None, 1000), None);
        assert_eq!(c.allowance(1000, 0, 8), 8);
        assert_eq!(c.record(true, None, 1000), Some(Transition::Opened));
        let v = c.view();
        assert_eq!((v.state, v.consecutive_failures, v.open_since), (CircuitState::Open, 3, Some(1000)));
        let first = v.next_probe_at.unwrap();
        assert!((1200..=1400).contains(&first), "first probe 200..400 ms after opening: {first}");
        assert_eq!(c.allowance(first - 1, 0, 8), 0, "not before the probe is due");
        assert_eq!(c.allowance(first, 2, 8), 0, "not while older attempts are in flight");
        assert_eq!(c.allowance(first, 0, 8), 1);
        assert_eq!(c.probe_started(), Some(Transition::Probing));
        assert_eq!(c.allowance(first, 1, 8), 0);
        assert_eq!(c.record(true, None, 2000), Some(Transition::Reopened));
        let second = c.view().next_probe_at.unwrap();
        assert_eq!(second, 2400, "400 ms: 200 doubled, capped at max_delay (jitter is capped too)");
        assert_eq!(c.view().open_since, Some(1000), "open since the first opening");
    }

    /// The schedule tests/circuit_breaker.rs drives over real sockets, on tokio's paused clock: 30
    /// attempts fail at once (threshold 5), then a dispatcher that sleeps until [`Circuit::wake_at`]
    /// sends one probe at a time, each answered 500 after 30 ms, until the seventh is answered 204.
    #[tokio::test(start_paused = true)]
    async fn while_open_one_probe_at_a_time_goes_out_on_the_backoff_schedule_until_one_is_answered() {
        const EPOCH_MS: i64 = 1_000_000;
        let start = tokio::time::Instant::now();
        let now = || EPOCH_MS + millis(start.elapsed());
        let at = |ms: i64| start + Duration::from_millis(u64::try_from(ms - EPOCH_MS).unwrap());
        let mut c = Circuit::new(5, retry());
        let mut transitions = Vec::new();
        for _ in 0..30 {
            transitions.extend(c.record(true, None, now()));
        }
        assert_eq!(transitions, [Transition::Opened], "the fifth failure opens it; the others change nothing");
        let opened = now();

        let mut probes = Vec::new();
        for failed in [true, true, true, true, true, true, false] {
            let due = c.wake_at().expect("an open circuit says when to look again");
            assert_eq!(c.allowance(due - 1, 0, 8), 0, "nothing before the probe is due");
            tokio::time::sleep_until(at(due)).await;
            assert_eq!(c.allowance(now(), 0, 8), 1, "one probe once due");
            transitions.extend(c.probe_started());
            assert_eq!(c.allowance(now(), 1, 8), 0, "nothing else while the probe is out");
            assert_eq!(c.wake_at(), None, "half-open: the probe's answer wakes the dispatcher");
            probes.push(now());
            tokio::time::sleep(Duration::from_millis(30)).await; // ok: the probe's round trip, on paused time
            transitions.extend(c.record(failed, None, now()));
        }

        let first = probes[0] - opened;
        assert!((200..=400).contains(&first), "the first probe 200..400 ms after opening: {first} ms");
        let gaps: Vec<i64> = probes.windows(2).map(|p| p[1] - p[0]).collect();
        assert_eq!(gaps, [430; 6], "each later step 400 ms (200 doubled, capped) after the 30 ms failure");
        let count = |t: Transition| transitions.iter().filter(|&&x| x == t).count();
        assert_eq!(count(Transition::Probing), probes.len(), "one half-open transition per probe");
        assert_eq!(
            count(Transition::Opened) + count(Transition::Reopened),
            probes.len(),
            "opened, then once per failed probe"
        );
        assert_eq!((count(Transition::Closed), transitions.last()), (1, Some(&Transition::Closed)));
        assert_eq!(c.view(), CircuitView::default());
        assert_eq!(c.allowance(now(), 0, 8), 8, "closed: every slot");
    }

    #[test]
    fn retry_after_lengthens_the_step_within_max_delay_and_an_answer_closes_it() {
        let mut c = Circuit::new(1, retry());
        // The backoff step is 200..400 ms; 300 ms asked lies inside it, 10 ms is shorter.
        assert_eq!(c.record(true, Some(Duration::from_millis(10)), 0), Some(Transition::Opened));
        let first = c.view().next_probe_at.unwrap();
        assert!((200..=400).contains(&first), "never sooner than our backoff: {first}");
        c.probe_started();
        assert_eq!(c.record(true, Some(Duration::from_secs(60)), 500), Some(Transition::Reopened));
        assert_eq!(c.view().next_probe_at, Some(900), "clamped to max_delay");
        c.probe_started();
        assert_eq!(c.record(false, None, 900), Some(Transition::Closed));
        assert_eq!(c.view(), CircuitView::default());
        assert_eq!(c.allowance(900, 0, 8), 8);
    }

    #[test]
    fn a_429_or_503_with_retry_after_holds_every_delivery_until_then() {
        let mut c = Circuit::new(5, RetryConfig { max_delay: Duration::from_secs(60), ..retry() });
        assert_eq!(c.throttle(Some(500), Some(Duration::from_secs(5)), 1000), None, "only 429 and 503");
        assert_eq!(c.throttle(Some(429), None, 1000), None, "only with a Retry-After");
        assert_eq!(c.throttle(Some(429), Some(Duration::ZERO), 1000), None, "a time already past");
        assert_eq!(c.throttle(Some(503), Some(Duration::from_secs(5)), 1000), Some(6000));
        assert_eq!(c.allowance(5999, 0, 8), 0);
        assert_eq!(c.wake_at(), Some(6000));
        assert_eq!(c.throttle(Some(429), Some(Duration::from_secs(2)), 2000), None, "does not shorten it");
        assert_eq!(c.throttle(Some(429), Some(Duration::from_secs(3600)), 2000), Some(62_000), "clamped");
        assert_eq!(c.allowance(62_000, 0, 8), 8, "over at its end");
        assert_eq!(c.view().throttled_until, Some(62_000), "shown as it was");
        assert_eq!(c.record(false, None, 2000), None, "an answer does not lift it");
        assert!(c.throttled(61_999));
    }

    #[test]
    fn threshold_zero_never_opens_and_an_answer_resets_the_count() {
        let mut c = Circuit::new(0, retry());
        for _ in 0..50 {
            assert_eq!(c.record(true, None, 0), None);
        }
        assert_eq!(c.view().state, CircuitState::Closed);
        let mut c = Circuit::new(3, retry());
        c.record(true, None, 0);
        c.record(true, None, 0);
        c.record(false, None, 0);
        assert_eq!(c.record(true, None, 0), None);
        assert_eq!(c.view().consecutive_failures, 1);
    }

    #[test]
    fn per_delivery_refusals_show_the_endpoint_up() {
        let down: Vec<bool> =
            [None, Some(500), Some(503), Some(429), Some(401), Some(308), Some(422), Some(404), Some(410), Some(204)]
                .into_iter()
                .map(|s| endpoint_down(&answered(s)))
                .collect();
        assert_eq!(down, [true, true, true, true, true, true, false, false, false, false]);
    }

    #[test]
    fn an_answer_outside_the_deliveries_brings_the_next_probe_forward_only_while_open() {
        let mut c = Circuit::new(1, retry());
        assert!(!c.reachable(0), "closed: nothing to bring forward");
        assert_eq!(c.record_result(&answered(None), None, 0), Some(Transition::Opened));
        let due = c.view().next_probe_at.unwrap();
        assert!(due > 100);
        assert!(c.reachable(100));
        assert_eq!(c.view().next_probe_at, Some(100));
        assert!(!c.reachable(100), "already due");
        c.probe_started();
        assert!(!c.reachable(150), "half open: the probe is out");
    }

    #[test]
    fn an_answer_outside_the_deliveries_changes_nothing_when_the_attempts_were_answered() {
        for status in [401, 403, 500, 503] {
            let mut c = Circuit::new(1, retry());
            assert_eq!(c.record_result(&answered(Some(status)), None, 0), Some(Transition::Opened));
            let due = c.view().next_probe_at;
            assert!(!c.reachable(100), "{status}: reachable all along");
            assert_eq!(c.view().next_probe_at, due, "{status}");
        }
        // Answered, then silent: the last down attempt decides.
        let mut c = Circuit::new(1, retry());
        c.record_result(&answered(Some(503)), None, 0);
        c.probe_started();
        assert_eq!(c.record_result(&answered(None), None, 10), Some(Transition::Reopened));
        assert!(c.reachable(100));
    }
}
