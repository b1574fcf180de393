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
}
