//! `vipwatch demo`: the whole product on one machine with nothing else installed. It starts the
//! embedded fake apiserver seeded with sample Services, a demo appliance that verifies and prints each
//! signed delivery, and vipwatch itself ([`crate::app::start`]) with a config generated into the demo
//! directory and read by the normal loader; then a scripted stream of changes and faults runs until
//! Ctrl-C or SIGTERM. Output: the URLs to open, then one `demo …` line per scripted step and one
//! `appliance …` line per delivery, on stdout.

pub mod appliance;
mod config;
mod pods;
mod samples;
mod script;

use std::future::Future;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::app::{self, AppError, Running};
use crate::config::ConfigError;
use crate::fake_apiserver::FakeApiServer;
use crate::store::{StoreError, WriterLock};
pub use appliance::{Appliance, ApplianceError};
pub use config::demo_config_toml;

/// The API address used when `--listen` is not given; if it is taken, a free port is picked.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);

/// What `vipwatch demo` was asked for.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// API listen address; `None` = [`DEFAULT_LISTEN`], or any free port when that is taken.
    pub listen: Option<SocketAddr>,
    /// Time between scripted steps.
    pub interval: Duration,
    /// Directory for the generated config and the database (emptied of the old database at start).
    pub dir: PathBuf,
}

/// Why the demo could not run. The message names what failed; the cause is the error's `source`
/// (printed after it by the CLI).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The demo directory or a file in it cannot be created or removed.
    #[error("demo directory: {path}")]
    Dir {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The API address given with `--listen` cannot be bound.
    #[error("cannot listen on {addr} (`--listen 127.0.0.1:0` picks a free port)")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A local listener of the demo (fake apiserver, appliance) cannot be started.
    #[error("cannot start the {what}")]
    Start {
        /// Which part.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Another demo uses the same directory.
    #[error("another vipwatch uses the demo directory; stop it or pass another `--dir`")]
    Busy(#[source] StoreError),
    /// The demo appliance could not start.
    #[error(transparent)]
    Appliance(#[from] ApplianceError),
    /// The generated configuration was refused by the loader.
    #[error("the generated configuration is invalid")]
    Config(#[from] ConfigError),
    /// An environment variable points the demo at something other than its own parts.
    #[error("{var} is set and would replace the demo's own `{key}`; unset it to run the demo")]
    Overridden {
        /// The variable.
        var: &'static str,
        /// The config key it overrides.
        key: &'static str,
    },
    /// vipwatch itself failed to start or stopped with an error.
    #[error(transparent)]
    App(#[from] AppError),
}

/// Runs the demo until `shutdown` resolves (or vipwatch fails), then stops the script, vipwatch, the
/// appliance and the fake apiserver, in that order. Errors: [`DemoError`].
pub async fn run(options: DemoOptions, shutdown: impl Future<Output = ()>) -> Result<(), DemoError> {
    let api_listener = bind_api(options.listen).await?;
    let database = prepare_dir(&options.dir)?;
    let cluster = FakeApiServer::start().await.map_err(|source| DemoError::Start { what: "fake apiserver", source })?;
    let secret = config::random_secret();
    let appliance = Appliance::start(bind_local("demo appliance").await?, &secret).await?;
    // The agent's listener with the HAProxy it drives, when HAProxy is installed.
    let agent_listener = match haproxy_bin() {
        Some(bin) => Some((bind_local("HAProxy agent").await?, bin)),
        None => None,
    };
    let setup = config::DemoSetup {
        kubernetes_url: cluster.url(),
        appliance_url: appliance.url(),
        secret,
        listen: api_listener.local_addr().map_err(|source| DemoError::Start { what: "API", source })?,
        database,
        agent_url: agent_listener
            .as_ref()
            .and_then(|(l, _)| l.local_addr().ok())
            .map(|a| format!("http://{a}/hooks/vipwatch")),
    };
    let config = config::write_and_load(&options.dir, &setup)?;
    let objects = samples::seed();
    let pods = Arc::new(pods::Pods::default());
    let agent = match agent_listener {
        Some((listener, bin)) => start_agent(&options.dir, &setup.secret, listener, bin).await?,
        None => None,
    };
    if agent.is_some() {
        for (ip, owner) in samples::pod_addresses(&objects) {
            pods.ensure(ip, &owner).await;
        }
    }
    let setup = config::DemoSetup { agent_url: setup.agent_url.filter(|_| agent.is_some()), ..setup };
    cluster.seed(objects);
    let running = app::start(config, api_listener).await?;
    let result = supervise(&running, &cluster, &options, &setup, pods.clone(), shutdown).await;
    let stopped = running.stop().await;
    if let Some(agent) = agent {
        agent.stop().await;
    }
    pods.stop();
    appliance.shutdown().await;
    cluster.shutdown().await;
    say("demo       stopped");
    result.and(stopped.map_err(DemoError::from))
}

/// Waits until vipwatch is ready, prints the banner, runs the script until `shutdown` or a failure.
async fn supervise(
    running: &Running,
    cluster: &FakeApiServer,
    options: &DemoOptions,
    setup: &config::DemoSetup,
    pods: Arc<pods::Pods>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DemoError> {
    tokio::pin!(shutdown);
    tokio::select! {
        _ = running.ready() => {}
        _ = running.failed() => return Ok(()),
        _ = &mut shutdown => return Ok(()),
    }
    print_banner(setup, cluster, &options.dir);
    let cancel = CancellationToken::new();
    let script = script::run(cluster.clone(), setup.appliance_url.clone(), pods, options.interval, cancel.clone());
    let script = tokio::spawn(script);
    tokio::select! {
        _ = &mut shutdown => {}
        _ = running.failed() => {}
    }
    cancel.cancel();
    let _ = script.await;
    Ok(())
}

/// Where HAProxy runs from, if it is installed (the demo then runs the agent and a real HAProxy):
/// `haproxy` on `PATH`, else Debian's and a source install's `sbin` paths, which a user other than
/// root often does not have on `PATH`. `None` when none of them answers `haproxy -v`.
fn haproxy_bin() -> Option<std::path::PathBuf> {
    ["haproxy", "/usr/sbin/haproxy", "/usr/local/sbin/haproxy"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|bin| std::process::Command::new(bin).arg("-v").output().is_ok_and(|o| o.status.success()))
}

/// The HAProxy agent on `listener`, with a real HAProxy (`haproxy_bin`) in `<dir>/haproxy`. Its state
/// from an earlier demo is removed first, as the database is. Errors: [`DemoError::Dir`] when the old
/// state cannot be removed; an agent that fails to start is reported and left out (`None`: the
/// printing appliance alone).
async fn start_agent(
    dir: &Path,
    secret: &str,
    listener: TcpListener,
    haproxy_bin: std::path::PathBuf,
) -> Result<Option<vipwatch_haproxy::Running>, DemoError> {
    let agent_dir = dir.join("haproxy");
    let state = agent_dir.join("state.json");
    match std::fs::remove_file(&state) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(DemoError::Dir { path: state, source }),
    }
    let config = vipwatch_haproxy::AgentConfig {
        listen: SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        secrets: vec![secret.to_owned()],
        dir: std::path::absolute(&agent_dir).unwrap_or(agent_dir),
        batch_window: Duration::from_millis(100),
        stop_haproxy_on_exit: true,
        haproxy_bin,
        ..vipwatch_haproxy::AgentConfig::default()
    };
    match vipwatch_haproxy::start(config, listener).await {
        Ok(running) => Ok(Some(running)),
        Err(e) => {
            say(&format!("demo       HAProxy agent not started ({e}): deliveries go to the printing appliance only"));
            Ok(None)
        }
    }
}

/// Binds the API: `listen` if given (failing clearly when taken), else [`DEFAULT_LISTEN`] or, when
/// that is taken, any free port on 127.0.0.1.
async fn bind_api(listen: Option<SocketAddr>) -> Result<TcpListener, DemoError> {
    let addr = listen.unwrap_or(DEFAULT_LISTEN);
    match TcpListener::bind(addr).await {
        Ok(listener) => Ok(listener),
        Err(e) if listen.is_none() && e.kind() == std::io::ErrorKind::AddrInUse => {
            say(&format!("demo       {addr} is in use; the API takes a free port instead (see below)"));
            bind_local("API").await
        }
        Err(source) => Err(DemoError::Listen { addr, source }),
    }
}

/// Binds `127.0.0.1:0`.
async fn bind_local(what: &'static str) -> Result<TcpListener, DemoError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.map_err(|source| DemoError::Start { what, source })
}

/// Creates `dir` and removes the previous run's database; returns the database path. Errors:
/// [`DemoError::Dir`], or [`DemoError::Busy`] when a running demo holds that database.
fn prepare_dir(dir: &Path) -> Result<PathBuf, DemoError> {
    std::fs::create_dir_all(dir).map_err(|source| DemoError::Dir { path: dir.to_owned(), source })?;
    let database = std::path::absolute(dir.join(config::DATABASE_FILE))
        .map_err(|source| DemoError::Dir { path: dir.to_owned(), source })?;
    let _lock = WriterLock::acquire(&database).map_err(DemoError::Busy)?;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = database.clone().into_os_string();
        name.push(suffix);
        let path = PathBuf::from(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(DemoError::Dir { path, source }),
        }
    }
    Ok(database)
}

/// The URLs to open, a curl example, and how to reach the simulated cluster with kubectl.
fn print_banner(setup: &config::DemoSetup, cluster: &FakeApiServer, dir: &Path) {
    let api = format!("http://{}", crate::healthcheck::reachable(setup.listen));
    let lines = [
        "vipwatch demo: a simulated Kubernetes API, vipwatch, and a demo appliance, all on this machine".to_owned(),
        format!("  API          {api}"),
        format!("  Swagger UI   {api}/docs"),
        format!("  VIPs         {api}/api/v1/vips"),
        format!("  events       {api}/api/v1/events"),
        format!("  deliveries   {api}/api/v1/deliveries"),
        format!("  metrics      {api}/metrics"),
        format!("  try          curl -s '{api}/api/v1/events?namespace=shop&type=MODIFIED'"),
        format!(
            "  resync       curl -s -X POST -H 'Authorization: Bearer {}' {api}/api/v1/webhooks/{}/resync",
            config::API_TOKEN,
            config::WEBHOOK_NAME
        ),
        format!("  kubectl      kubectl --server {} get services -A", cluster.url()),
        format!("  files        {} ({} and {})", dir.display(), config::CONFIG_FILE, config::DATABASE_FILE),
    ];
    for line in lines {
        say(&line);
    }
    match &setup.agent_url {
        Some(url) => {
            let state = url.replace("/hooks/vipwatch", "/state");
            say(&format!(
                "  HAProxy      a real HAProxy, driven by the agent {state} ({}/haproxy/haproxy.cfg)",
                dir.display()
            ));
            say("  via a VIP    curl -s http://127.0.100.10:8080/   (shop/web: its Pods answer through HAProxy)");
        }
        None => say(
            "  HAProxy      not installed: deliveries go to the printing appliance only (install `haproxy` to send traffic through the VIPs)",
        ),
    }
    say("Ctrl-C stops the demo.");
}

/// Prints one line to stdout at once; a closed stdout is ignored.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
