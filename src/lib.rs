//! vipwatch: watch Kubernetes `LoadBalancer` Services, record every change in SQLite, relay it to an
//! external load-balancer appliance, and serve the state over a REST API.
//!
//! Data flows one way: [`watch`] → [`store`] (event log, state) → relay, and [`api`] reads the store.
//! [`model`] holds the pure conversion and decision code they share.

pub mod allocator;
pub mod api;
pub mod app;
pub mod cli;
pub mod config;
pub mod demo;
/// The simulated Kubernetes API (tests and `vipwatch demo` / `vipwatch fake-apiserver`), from the
/// `vipwatch-fake-apiserver` crate.
pub use vipwatch_fake_apiserver as fake_apiserver;
pub mod healthcheck;
pub mod ipam;
pub mod leader;
pub mod metrics;
pub mod model;
pub mod publish;
pub mod relay;
pub mod route;
pub mod store;
pub mod template;
pub mod watch;
