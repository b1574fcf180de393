//! The `vipwatch` binary: parse the CLI and config, set up logging, run the chosen subcommand.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use vipwatch::cli::{Cli, Command};
use vipwatch::config::Config;
use vipwatch::healthcheck::healthz_url;

/// mimalloc for the Rust code, tuned by [`vipwatch::allocator::tune`], which says why.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // SAFETY: first thing in `main`, before any other thread exists.
    unsafe { vipwatch::allocator::tune() };
    let cli = Cli::parse();
    init_tracing(&cli.command);
    vipwatch::allocator::log_settings();
    let result = match cli.command {
        // The demo writes and loads its own config; these need none.
        Command::Demo { listen, interval, dir } => demo(vipwatch::demo::DemoOptions { listen, interval, dir }),
        Command::DemoReceiver { listen, secret } => demo_receiver(listen, secret),
        Command::Healthcheck { url: Some(url) } => healthcheck(url),
        command => match Config::load(cli.config.as_deref()) {
            Ok(config) => with_config(command, config),
            Err(e) => {
                eprintln!("vipwatch: invalid configuration: {e}");
                return ExitCode::from(2);
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vipwatch: {}", vipwatch::app::ErrorChain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

fn with_config(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::CheckConfig => {
            // Templates: compiled and rendered against the sample Service (docs/reference/templates.md).
            let rendered = match vipwatch::template::check_config(&config) {
                Ok(lines) => lines,
                Err(e) => {
                    eprintln!("vipwatch: invalid configuration: {e}");
                    std::process::exit(2);
                }
            };
            print!("{}", config.to_redacted_toml());
            for line in rendered {
                println!("# template sample: {line}");
            }
            for (webhook, appliance) in config.lone_appliances() {
                let why = vipwatch::config::LONE_APPLIANCE;
                eprintln!("vipwatch: warning: webhook `{webhook}`, appliance `{appliance}`: {why}");
            }
            Ok(())
        }
        Command::Serve => serve(config),
        Command::Openapi => {
            // A closed pipe (`vipwatch openapi | head`) is not an error.
            let _ =
                std::io::Write::write_all(&mut std::io::stdout(), vipwatch::api::openapi::document_json().as_bytes());
            Ok(())
        }
        Command::FakeApiserver { listen, seed } => fake_apiserver(listen, seed),
        Command::Resync { webhook } => resync(config, webhook),
        Command::ReleaseFinalizers => release_finalizers(config),
        Command::Healthcheck { url: None } => healthcheck(healthz_url(config.server.listen)),
        Command::Demo { .. } | Command::DemoReceiver { .. } | Command::Healthcheck { url: Some(_) } => {
            unreachable!("run without a config")
        }
    }
}

/// Logs to stderr, filtered by `VIPWATCH_LOG`; by default `info`, but `warn` for the demo commands so
/// their readable lines on stdout stand out.
fn init_tracing(command: &Command) {
    // PostgreSQL's notices (`relation "_sqlx_migrations" already exists, skipping` at every start)
    // are not news at info.
    let default = match command {
        Command::Demo { .. } | Command::DemoReceiver { .. } => "warn",
        _ => "info,sqlx::postgres::notice=warn",
    };
    let filter = EnvFilter::try_from_env("VIPWATCH_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only on a terminal: redirected logs (files, journald, kubectl logs) stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A log line that cannot be written (stderr on a full disk, a closed pipe) is lost quietly:
    // tracing's own error report about it would panic on the same stderr, in the task that logged.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .log_internal_errors(false)
        .init();
}

#[tokio::main]
async fn demo(options: vipwatch::demo::DemoOptions) -> anyhow::Result<()> {
    vipwatch::demo::run(options, shutdown_signal()).await?;
    Ok(())
}

#[tokio::main]
async fn demo_receiver(listen: std::net::SocketAddr, secret: String) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let mut appliance = vipwatch::demo::Appliance::start(listener, &secret).await?;
    println!("demo appliance listening on http://{}", appliance.addr());
    tokio::select! {
        _ = shutdown_signal() => {}
        _ = appliance.stopped() => anyhow::bail!("the demo appliance stopped"),
    }
    appliance.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn healthcheck(url: url::Url) -> anyhow::Result<()> {
    let status = vipwatch::healthcheck::check(&url).await?;
    println!("healthy: GET {url} answered {status}");
    Ok(())
}

/// Runs the controller on a runtime of `server.worker_threads` workers (one by default, see
/// [`vipwatch::config::ServerConfig::worker_threads`]).
fn serve(config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.server.worker_threads)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listen = config.server.listen;
        let listener =
            tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
        vipwatch::app::run(config, listener, shutdown_signal()).await?;
        Ok(())
    })
}

#[tokio::main]
async fn resync(mut config: Config, webhook: Option<String>) -> anyhow::Result<()> {
    let store = vipwatch::store::Store::connect(&config.database).await?;
    config.cluster.name = Some(vipwatch::app::cluster::resolve(&config, &store, None).await?);
    for (name, n) in vipwatch::route::resync(&store, &config, webhook.as_deref()).await? {
        println!("{name}: enqueued service.synced for {n} Services");
    }
    store.close().await;
    Ok(())
}

#[tokio::main]
async fn release_finalizers(config: Config) -> anyhow::Result<()> {
    vipwatch::relay::sender::install_crypto_provider();
    let client = vipwatch::watch::connect(&config.kubernetes).await?;
    let released = vipwatch::publish::release_finalizers(&client, &config).await?;
    for key in &released {
        println!("released {key}");
    }
    println!("removed the {} finalizer from {} Services", vipwatch::model::FINALIZER, released.len());
    Ok(())
}

#[tokio::main]
async fn fake_apiserver(listen: std::net::SocketAddr, seed: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let api = vipwatch::fake_apiserver::FakeApiServer::start_on(listener).await?;
    if let Some(dir) = seed {
        let objects = vipwatch::fake_apiserver::read_seed_dir(&dir)?;
        tracing::info!(objects = objects.len(), dir = %dir.display(), "seeded");
        api.seed(objects);
    }
    println!("fake apiserver listening on {}", api.url());
    shutdown_signal().await;
    api.shutdown().await;
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
