//! The store-heavy end-to-end tests again, on PostgreSQL: each file below is compiled here as a
//! module, and the harness (`common::backend`) runs every test of this binary against a fresh
//! database on the server in `VIPWATCH_TEST_PG_URL` (`scripts/pg-test.sh start DIR` prints one;
//! `.ci/run` starts one). Without it this binary skips, except under CI, where it fails.
//! Between them these files cover every store method: event log and state (watch_events), outbox,
//! claims, superseding, replay (relay), allocation, releases and cleanups (allocation,
//! address_reuse), Nodes and members (backends), held deletions (deletion_guard), full-state
//! endpoints (templates) and the API's queries (api).

// Each file declares `mod common;` itself, so the shared harness is compiled once per module here:
// intended, it keeps every file runnable on its own.
#![allow(clippy::duplicate_mod)]

#[path = "address_reuse.rs"]
mod address_reuse;
#[path = "allocation.rs"]
mod allocation;
#[path = "api.rs"]
mod api;
#[path = "backends.rs"]
mod backends;
#[path = "deletion_guard.rs"]
mod deletion_guard;
/// The PostgreSQL-only tests: replicas, leader election, fail-over.
#[path = "postgres/ha.rs"]
mod ha;
#[path = "relay.rs"]
mod relay;
#[path = "templates.rs"]
mod templates;
#[path = "watch_events.rs"]
mod watch_events;
