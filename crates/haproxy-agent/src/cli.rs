//! The command line of `vipwatch-haproxy` (clap): its subcommands and options.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// vipwatch-haproxy: apply vipwatch's deliveries (VIPs, ports, pool members) to a real HAProxy.
#[derive(Debug, Parser)]
#[command(name = "vipwatch-haproxy", version, about)]
pub struct Cli {
    /// Config file (TOML). Default: `vipwatch-haproxy.toml` in the working directory when it exists.
    #[arg(long, short = 'c', global = true, env = "VIPWATCH_HAPROXY_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do (default: `serve`).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The subcommands.
#[derive(Debug, Clone, Copy, Subcommand)]
pub enum Command {
    /// Run HAProxy with the stored state and accept deliveries until SIGTERM / Ctrl-C.
    Serve,
    /// Validate the configuration (the secrets, and that `haproxy_bin -v` runs) and print it with
    /// HAProxy's version, secrets redacted. Exit 2 if invalid.
    CheckConfig,
    /// Print the `haproxy.cfg` the stored state renders (what `serve` would run); needs no secret.
    Render,
}
