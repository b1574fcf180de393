//! Command-line interface (clap): subcommands and their options.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// vipwatch: give Kubernetes LoadBalancer Services a VIP on an external load-balancer appliance.
#[derive(Debug, Parser)]
#[command(name = "vipwatch", version, about)]
pub struct Cli {
    /// Config file (TOML). Default: `vipwatch.toml` in the working directory when it exists. Every
    /// subcommand reads it but `demo` and `demo-receiver`.
    #[arg(long, short = 'c', global = true, env = "VIPWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Watch Services, record changes, serve the API (runs until SIGTERM / Ctrl-C).
    Serve,
    /// Validate the configuration (and render every request template against a sample Service) and
    /// print the effective config, secrets redacted. Exit 2 if invalid: every subcommand exits 2 with
    /// one message naming the key when the configuration is invalid.
    CheckConfig,
    /// Enqueue a `service.synced` delivery with the current view of every in-scope Service, for
    /// appliances that drifted or were rebuilt. A running `vipwatch serve` sends them.
    Resync {
        /// Only this endpoint (default: every enabled endpoint).
        #[arg(long)]
        webhook: Option<String>,
    },
    /// Remove vipwatch's `vipwatch.io/cleanup` finalizer from every Service in the configured
    /// namespaces (the uninstall path: run it after stopping `vipwatch serve`, or deleted Services wait
    /// for a DELETED that nobody will deliver).
    ReleaseFinalizers,
    /// Print the OpenAPI 3.1 document of the REST API (what `/openapi.json` serves) to stdout.
    Openapi,
    /// Run the simulated Kubernetes API (the fake apiserver the tests use) until Ctrl-C, for trying
    /// vipwatch without a cluster: `kubectl --server http://LISTEN get svc -A` works against it.
    FakeApiserver {
        /// Listen address.
        #[arg(long, default_value = "127.0.0.1:6443")]
        listen: std::net::SocketAddr,
        /// Directory of Service JSON files to seed (one object per `*.json` file).
        #[arg(long)]
        seed: Option<PathBuf>,
    },
    /// Show the whole product with nothing else installed: a simulated cluster with sample Services,
    /// vipwatch itself, and a demo appliance printing each signed delivery, driven by a scripted
    /// stream of changes and faults until Ctrl-C / SIGTERM. Ignores `--config`: the demo writes its
    /// own into `--dir`.
    Demo {
        /// API listen address [default: 127.0.0.1:8080, or a free port when that is taken].
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Time between scripted changes (humantime, e.g. `3s`, `200ms`).
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        interval: std::time::Duration,
        /// Directory for the generated config and the database (the old database is removed at start).
        #[arg(long, default_value = "vipwatch-demo")]
        dir: PathBuf,
    },
    /// Run the demo appliance alone: verify each Standard Webhooks delivery and print one line per
    /// request (204, or 401 for a bad signature); `GET /healthz` answers 200. Ignores `--config`.
    DemoReceiver {
        /// Listen address.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: std::net::SocketAddr,
        /// The endpoint's Standard Webhooks secret (`whsec_...`).
        #[arg(long, env = "APPLIANCE_WEBHOOK_SECRET", hide_env_values = true)]
        secret: String,
    },
    /// Exit 0 when the running service answers `GET /healthz` with 2xx within 3 s, else 1 with the
    /// reason (for container health checks; the address comes from `server.listen`).
    Healthcheck {
        /// URL to check instead of `http://<server.listen>/healthz`.
        #[arg(long)]
        url: Option<url::Url>,
    },
}
