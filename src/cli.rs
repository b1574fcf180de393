//! Command-line interface (clap): subcommands and their options.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// vipwatch: give Kubernetes LoadBalancer Services a VIP on an external load-balancer appliance.
#[derive(Debug, Parser)]
#[command(name = "vipwatch", version, about)]
pub struct Cli {
    /// Config file (TOML). Default: `vipwatch.toml` in the working directory when it exists.
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
    /// Validate the configuration and print the effective config, secrets redacted. Exit 2 if invalid.
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
}
