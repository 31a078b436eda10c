//! The `pgfresh` command: run the proxy, validate a config, explain a routing
//! decision, or run the self-contained demo.

mod demo;
mod explain;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pgfresh_config::ConfigHandle;
use pgfresh_proxy::{Proxy, Stop};

#[derive(Parser)]
#[command(
    name = "pgfresh",
    version,
    about = "PostgreSQL proxy: reads to replicas, never stale"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Config file (for the default `run`).
    #[arg(
        short = 'c',
        long = "config",
        default_value = "conf/pgfresh.toml",
        global = true
    )]
    config: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (the default).
    Run,
    /// Validate a config file and print the effective values and their reload class.
    Check {
        /// Also log in to every node as the monitor does and report, per node, its role and
        /// version or the server's error; exits 1 when any node fails.
        #[arg(long)]
        connect: bool,
    },
    /// Print the analysis of a statement and the routing decision with its reasons.
    Explain {
        /// The SQL text.
        sql: String,
    },
    /// Start a throwaway primary + 2 streaming standbys and pgfresh in front of them.
    Demo {
        /// Where the proxy listens.
        #[arg(long, default_value = "127.0.0.1:6432")]
        listen: String,
        /// Where the admin HTTP API listens.
        #[arg(long, default_value = "127.0.0.1:9930")]
        admin_listen: String,
    },
}

type LogFilter =
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// The live log filter, so `log_level` can change on reload.
static LOG_FILTER: std::sync::OnceLock<LogFilter> = std::sync::OnceLock::new();

fn init_tracing(level: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("PGFRESH_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    if tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init()
        .is_ok()
    {
        let _ = LOG_FILTER.set(handle);
    }
}

/// Apply a new `log_level` (ignored while PGFRESH_LOG overrides it).
fn set_log_level(level: &str) {
    if std::env::var_os("PGFRESH_LOG").is_some() {
        return;
    }
    match (
        LOG_FILTER.get(),
        tracing_subscriber::EnvFilter::try_new(level),
    ) {
        (Some(handle), Ok(filter)) => {
            let _ = handle.reload(filter);
            tracing::info!(level, "log level changed");
        }
        (_, Err(e)) => tracing::warn!(level, error = %e, "invalid log_level; the old one stays"),
        _ => {}
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Check { connect } => check(&cli.config, connect),
        Command::Explain { sql } => explain::explain(&cli.config, &sql),
        Command::Run => {
            let handle = match ConfigHandle::open(&cli.config) {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("pgfresh: {e}");
                    return ExitCode::from(2);
                }
            };
            init_tracing(&handle.snapshot().proxy.log_level);
            let workers = handle.snapshot().proxy.worker_threads;
            runtime(workers).block_on(run(handle))
        }
        Command::Demo {
            listen,
            admin_listen,
        } => {
            init_tracing("info");
            demo::demo(&listen, &admin_listen)
        }
    }
}

/// The runtime the proxy runs on: `worker_threads = 0` is a single-threaded
/// (current-thread) runtime, N > 0 a work-stealing runtime with N workers.
fn runtime(worker_threads: usize) -> tokio::runtime::Runtime {
    let mut builder = if worker_threads == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(worker_threads);
        b
    };
    builder
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime")
}

fn check(path: &std::path::Path, connect: bool) -> ExitCode {
    let c = match pgfresh_config::load_file(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pgfresh: {e}");
            return ExitCode::from(2);
        }
    };
    println!("{}: valid", path.display());
    for (key, value, class) in pgfresh_config::describe(&pgfresh_config::redacted(&c)) {
        let class = match class {
            pgfresh_config::ReloadClass::Live => "live",
            pgfresh_config::ReloadClass::Restart => "restart",
        };
        println!("{key} = {value}    # {class}");
    }
    if !connect {
        return ExitCode::SUCCESS;
    }
    println!(
        "monitor login as \"{}\" to database \"{}\":",
        c.monitor.user, c.monitor.database
    );
    let checks = runtime(0).block_on(pgfresh_proxy::check_monitor_logins(&c));
    let mut failed = 0;
    for n in &checks {
        match &n.result {
            Ok(ok) => {
                let role = if ok.in_recovery { "standby" } else { "primary" };
                let tls = if ok.tls { "TLS" } else { "no TLS" };
                println!(
                    "node {} ({}): ok, {role}, PostgreSQL {}, {tls}",
                    n.name, n.address, ok.server_version
                );
            }
            Err(e) => {
                failed += 1;
                println!("node {} ({}): FAILED: {e}", n.name, n.address);
            }
        }
    }
    if failed > 0 {
        eprintln!(
            "pgfresh: the monitor cannot log in to {failed} of {} nodes",
            checks.len()
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// Run the proxy until SIGTERM (graceful) or SIGINT (fast); SIGHUP and file edits reload.
pub async fn run(handle: ConfigHandle) -> ExitCode {
    let config = handle.snapshot();
    let listener = match tokio::net::TcpListener::bind(&config.proxy.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pgfresh: cannot listen on {}: {e}", config.proxy.listen);
            return ExitCode::from(1);
        }
    };
    let admin = if config.proxy.admin_listen.is_empty() {
        None
    } else {
        match tokio::net::TcpListener::bind(&config.proxy.admin_listen).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!(
                    "pgfresh: cannot listen on {}: {e}",
                    config.proxy.admin_listen
                );
                return ExitCode::from(1);
            }
        }
    };
    let proxy = Proxy::new(handle.clone());
    let shared = proxy.shared.clone();
    // Reloads: file watch and SIGHUP both funnel into one task.
    let (reload_tx, mut reload_rx) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    let _watch = handle.path().and_then(|p| {
        let tx = reload_tx.clone();
        pgfresh_config::FileWatch::start(p, std::time::Duration::from_millis(200), move || {
            let _ = tx.send("file");
        })
        .map_err(
            |e| tracing::warn!(error = %e, "cannot watch the config file; SIGHUP still reloads"),
        )
        .ok()
    });
    {
        let tx = reload_tx.clone();
        tokio::spawn(async move {
            let Ok(mut hup) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            else {
                return;
            };
            while hup.recv().await.is_some() {
                let _ = tx.send("sighup");
            }
        });
    }
    tokio::spawn(async move {
        while let Some(why) = reload_rx.recv().await {
            tracing::info!(trigger = why, "reloading config");
            if let Ok(outcome) = pgfresh_proxy::reload_config(&shared, why) {
                if outcome.applied.iter().any(|k| k.key == "proxy.log_level") {
                    set_log_level(&shared.config.snapshot().proxy.log_level);
                }
            }
        }
    });
    tracing::info!(listen = %config.proxy.listen, admin = %config.proxy.admin_listen, "pgfresh listening");
    proxy.run(listener, admin, stop_signal()).await;
    ExitCode::SUCCESS
}

/// Resolves on SIGTERM (graceful) or SIGINT (fast).
pub async fn stop_signal() -> Stop {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return Stop::Fast;
    };
    tokio::select! {
        _ = term.recv() => { tracing::info!("SIGTERM: finishing sessions"); Stop::Graceful }
        _ = int.recv() => { tracing::info!("SIGINT: closing now"); Stop::Fast }
    }
}
