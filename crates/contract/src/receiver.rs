//! What a receiver says about itself in its answers, so a sender can tell that an endpoint lost its
//! state, or restarted and may have missed deliveries, and resync it without an operator.
//!
//! A receiver that keeps state (the HAProxy agent) sends on **every** answer:
//!
//! - [`GENERATION_HEADER`]: the identity of its stored state, made when that state was created and
//!   kept with it. A different value from the same endpoint means the receiver lost its state (a
//!   rebuilt host, a wiped disk): whatever it acknowledged before is gone.
//! - [`INSTANCE_HEADER`]: this run of the receiver, new at every start.
//!
//! and may send:
//!
//! - [`CONCURRENCY_HEADER`]: how many deliveries it takes in at once. A receiver that applies the
//!   deliveries arriving together as one change (the HAProxy agent: one reload for all of them) goes
//!   through a large change in fewer, larger steps when the sender keeps that many in flight.
//!
//! and on answers to a delivery, and to a probe, also:
//!
//! - [`CAUGHT_UP_HEADER`]: `true` when the receiver holds the whole state of the sender's cluster
//!   (`data.cluster` of the delivery; [`CLUSTER_HEADER`] of a probe), `false` when it needs a full
//!   resync of that cluster (`service.synced` for every Service, and `sync.completed`) before it may
//!   be trusted with traffic. A receiver that just started is not caught up: it could not receive
//!   what was sent while it was down.
//!
//! A **probe** is a `GET` on the delivery URL (no body, no signature), with [`CLUSTER_HEADER`] naming
//! the sender's cluster: it is answered `200` with the three headers and a [`ReceiverState`] body,
//! and lets a sender notice an endpoint coming back without waiting for its next retry.
//!
//! What the sender does with them: see [`ReceiverIdentity`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Response header: the identity of the receiver's stored state, `gen_` + 32 lowercase hex digits.
pub const GENERATION_HEADER: &str = "vipwatch-receiver-generation";

/// Response header: the receiver's current run, `run_` + 32 lowercase hex digits, new at every start.
pub const INSTANCE_HEADER: &str = "vipwatch-receiver-instance";

/// Response header: how many deliveries the receiver takes in at once, a decimal integer of at least 1.
/// A sender with no limit of its own for the endpoint keeps up to this many in flight (vipwatch:
/// the endpoint's `concurrency`, when set, wins; at most [`MAX_CONCURRENCY`]).
pub const CONCURRENCY_HEADER: &str = "vipwatch-receiver-concurrency";

/// The most deliveries in flight a receiver may ask for ([`CONCURRENCY_HEADER`]); a larger number
/// reads as this one. The same bound as an endpoint's own `concurrency` in vipwatch's configuration.
pub const MAX_CONCURRENCY: usize = 4096;

/// Response header on answers to a delivery or a probe: `true` or `false` (see the module docs).
pub const CAUGHT_UP_HEADER: &str = "vipwatch-receiver-caught-up";

/// Request header of a probe: the sender's cluster name (vipwatch's `cluster.name`); the receiver
/// answers [`CAUGHT_UP_HEADER`] for it (for `default` when absent, as for a delivery without
/// `data.cluster`).
pub const CLUSTER_HEADER: &str = "vipwatch-cluster";

/// The response headers, as one value.
///
/// A sender keeps, per endpoint, the last identity it saw, and acts on each answer:
///
/// - `generation` differs from the one seen before: the endpoint lost its state. Worth a warning
///   and a counter; it also answers `caught_up: false`.
/// - `caught_up == Some(false)`: enqueue a full resync of this endpoint, once per `(generation,
///   instance)` — a resync already sent to the same run is not repeated (that run counts it); a new
///   run (a restart in the middle of a resync) gets a new one.
/// - no headers at all: a receiver that does not speak this (a plain webhook receiver): nothing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiverIdentity {
    /// [`GENERATION_HEADER`].
    pub generation: String,
    /// [`INSTANCE_HEADER`].
    pub instance: String,
    /// [`CAUGHT_UP_HEADER`]; `None` on answers that are not about a cluster (e.g. `/healthz`).
    pub caught_up: Option<bool>,
    /// [`CONCURRENCY_HEADER`], at most [`MAX_CONCURRENCY`]; `None` when the receiver does not say.
    pub concurrency: Option<usize>,
}

impl ReceiverIdentity {
    /// The headers to send, name and value.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![(GENERATION_HEADER, self.generation.clone()), (INSTANCE_HEADER, self.instance.clone())];
        if let Some(c) = self.caught_up {
            out.push((CAUGHT_UP_HEADER, c.to_string()));
        }
        if let Some(n) = self.concurrency {
            out.push((CONCURRENCY_HEADER, n.to_string()));
        }
        out
    }

    /// Reads the headers through `get` (a header's value by its lowercase name). `None` when the
    /// generation or the instance is missing: a receiver that does not speak this contract. A
    /// caught-up value other than `true` or `false` reads as absent, and so does a concurrency that
    /// is not a whole number of at least 1; a larger one than [`MAX_CONCURRENCY`] reads as that.
    pub fn from_headers<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<Self> {
        let generation = get(GENERATION_HEADER)?.trim().to_owned();
        let instance = get(INSTANCE_HEADER)?.trim().to_owned();
        let caught_up = get(CAUGHT_UP_HEADER).and_then(|v| match v.trim() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        });
        let concurrency = get(CONCURRENCY_HEADER)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n >= 1)
            .map(|n| n.min(MAX_CONCURRENCY));
        Some(Self { generation, instance, caught_up, concurrency })
    }
}

/// The body of the answer to a probe (`GET` on the delivery URL), camelCase JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReceiverState {
    /// [`GENERATION_HEADER`].
    pub generation: String,
    /// [`INSTANCE_HEADER`].
    pub instance: String,
    /// The probed cluster ([`CLUSTER_HEADER`], `default` when absent).
    pub cluster: String,
    /// Whether the receiver holds the probed cluster's whole state ([`CAUGHT_UP_HEADER`]).
    pub cluster_caught_up: bool,
    /// Whether the receiver is caught up with every cluster it waits for: what its health check
    /// reports.
    pub caught_up: bool,
    /// The clusters whose full resync it still waits for; empty with `caught_up: false` while it
    /// waits for the first resync of any cluster (it has no state to name one from).
    pub waiting_for: Vec<String>,
    /// Per cluster the receiver knows: whether it holds that cluster's whole state.
    pub clusters: BTreeMap<String, bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headers_round_trip_and_a_receiver_without_them_reads_as_none() {
        let id = ReceiverIdentity {
            generation: "gen_1".into(),
            instance: "run_2".into(),
            caught_up: Some(false),
            concurrency: Some(1024),
        };
        let headers = id.headers();
        assert_eq!(
            headers,
            [
                ("vipwatch-receiver-generation", "gen_1".to_owned()),
                ("vipwatch-receiver-instance", "run_2".to_owned()),
                ("vipwatch-receiver-caught-up", "false".to_owned()),
                ("vipwatch-receiver-concurrency", "1024".to_owned()),
            ]
        );
        let get = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
        assert_eq!(ReceiverIdentity::from_headers(get), Some(id));
        assert_eq!(ReceiverIdentity::from_headers(|_| None), None);
        let odd = |name: &str| if name == CAUGHT_UP_HEADER { Some("yes") } else { Some(" x ") };
        let read = ReceiverIdentity::from_headers(odd).unwrap();
        assert_eq!((read.generation.as_str(), read.caught_up, read.concurrency), ("x", None, None));
        for (said, read) in [("0", None), ("-3", None), ("many", None), (" 256 ", Some(256)), ("100000", Some(4096))] {
            let get = |name: &str| if name == CONCURRENCY_HEADER { Some(said) } else { Some("x") };
            assert_eq!(ReceiverIdentity::from_headers(get).unwrap().concurrency, read, "{said:?}");
        }
    }
}
