//! The fake apiserver's tests, one test binary (fewer binaries to link than one per file): its
//! protocol over real sockets, the Node and EndpointSlice resources, HTTP writes, Events, and the
//! installed `kubectl` driving it. Each module holds one theme; run one with
//! `cargo test -p vipwatch-fake-apiserver --test suite <module>::`.

/// The workspace's one policy for a program a test needs (tests/common/require.rs): skip with a
/// `SKIPPED` line locally, fail under CI.
#[path = "../../../../tests/common/require.rs"]
mod require;

mod events;
mod kubectl;
mod protocol;
mod resources;
mod writes;
