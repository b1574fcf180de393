//! The `vipwatch` binary: parse the CLI and config, set up logging, run the chosen subcommand.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use vipwatch::cli::{Cli, Command};
use vipwatch::config::Config;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("vipwatch: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::CheckConfig => {
            print!("{}", config.to_redacted_toml());
            Ok(())
        }
        Command::Serve => serve(config),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vipwatch: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = EnvFilter::try_from_env("VIPWATCH_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

#[tokio::main]
async fn serve(config: Config) -> anyhow::Result<()> {
    let listen = config.server.listen;
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    vipwatch::app::run(config, listener, shutdown_signal()).await?;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
