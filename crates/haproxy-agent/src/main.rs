//! The `vipwatch-haproxy` binary: parse the CLI and config, set up logging, run the agent.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use vipwatch_haproxy::AgentConfig;
use vipwatch_haproxy::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("VIPWATCH_HAPROXY_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A log line that cannot be written (stderr on a full disk, a closed pipe) is lost quietly:
    // tracing's own error report about it would panic on the same stderr, in the task that logged.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .log_internal_errors(false)
        .init();
    let command = cli.command.unwrap_or(Command::Serve);
    let loaded = match command {
        Command::Render => AgentConfig::load_unchecked(cli.config.as_deref()),
        _ => AgentConfig::load(cli.config.as_deref()),
    };
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vipwatch-haproxy: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Serve => serve(config),
        Command::CheckConfig => match config.check_haproxy() {
            Ok(version) => {
                print!("# {version}\n{}", config.to_redacted_toml());
                Ok(())
            }
            Err(e) => {
                eprintln!("vipwatch-haproxy: invalid configuration: {e}");
                return ExitCode::from(2);
            }
        },
        Command::Render => render(&config),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vipwatch-haproxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn render(config: &AgentConfig) -> anyhow::Result<()> {
    let mut desired =
        vipwatch_haproxy::state::Desired::load(&config.dir.join("state.json")).map_err(anyhow::Error::msg)?;
    desired.reslot(config.server_slots);
    let haproxy = vipwatch_haproxy::haproxy::Haproxy::new(&config.haproxy_bin, &config.dir);
    let globals = vipwatch_haproxy::render::Globals {
        admin_socket: haproxy.admin.display().to_string(),
        hard_stop_after: config.hard_stop_after,
        mworker_max_reloads: config.mworker_max_reloads,
    };
    print!("{}", vipwatch_haproxy::render::render(&desired, &globals).text);
    Ok(())
}

#[tokio::main]
async fn serve(config: AgentConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    vipwatch_haproxy::run(config, listener, shutdown_signal()).await?;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
