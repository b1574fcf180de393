//! The `vipwatch` binary: parse the CLI and config, set up logging, run the chosen subcommand.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use vipwatch::cli::{Cli, Command};
use vipwatch::config::Config;
use vipwatch::healthcheck::healthz_url;

fn main() -> ExitCode {
    tune_malloc();
    let cli = Cli::parse();
    init_tracing(&cli.command);
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

/// Tunes glibc's allocator for a long-running process whose peaks (a first list, a burst) are far
/// above its steady state. Must run before any thread starts. A setting given in the environment
/// (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, or `glibc.malloc.*` in
/// `GLIBC_TUNABLES`) wins: glibc reads those at the first allocation, and each one set there is left
/// alone here.
///
/// - One malloc arena instead of up to eight per core: every thread that allocates (tokio's workers,
///   its blocking pool, one thread per SQLite connection) otherwise gets an arena of its own that
///   keeps freed memory. With 10,000 Services peak RSS was ~10% higher with eight per core, and
///   6–8 MiB higher with two than with one, at no CPU cost the burst benchmark could see (issue 13).
/// - Fixed mmap and trim thresholds of 128 KiB (glibc's defaults, which it otherwise raises up to
///   32 MiB as large blocks are freed): a large buffer (a page of a list, a batch's statement) then
///   gets its own mapping that goes back to the system when freed, instead of a hole in the heap
///   that later small allocations pin, and free memory at the heap's top goes back too. Peak RSS in
///   the burst benchmark about 2 MiB lower in each phase, CPU per change the same (issue 13).
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        let unset = |var: &str, tunable: &str| std::env::var_os(var).is_none() && !tunables.contains(tunable);
        let settings = [
            ("MALLOC_ARENA_MAX", "glibc.malloc.arena_max", libc::M_ARENA_MAX, 1),
            ("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold", libc::M_MMAP_THRESHOLD, 128 << 10),
            ("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold", libc::M_TRIM_THRESHOLD, 128 << 10),
        ];
        for (var, tunable, param, value) in settings {
            if unset(var, tunable) {
                // SAFETY: mallopt only sets an allocator parameter; no other thread exists yet.
                unsafe {
                    libc::mallopt(param, value);
                }
            }
        }
    }
}

fn with_config(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::CheckConfig => {
            // Templates: compiled and rendered against the sample Service (README "Request templates").
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
async fn resync(config: Config, webhook: Option<String>) -> anyhow::Result<()> {
    let store = vipwatch::store::Store::connect(&config.database).await?;
    for (name, n) in vipwatch::relay::resync(&store, &config, webhook.as_deref()).await? {
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
