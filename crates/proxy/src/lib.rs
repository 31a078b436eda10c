//! pgfresh-proxy: the listener, client sessions, server pools, the router, the admin
//! API and console, and metrics.
//!
//! Start a proxy with [`Proxy::start`] on an already-bound listener and a shutdown
//! future, so tests bind port 0 in-process.

pub mod admin;
pub mod auth_file;
pub mod auth_query;
pub mod cancel;
pub mod catalog;
pub mod client;
pub mod clients;
pub mod console;
pub mod context;
pub mod deps;
pub mod error;
pub mod io;
pub mod listener;
pub mod monitor_conn;
pub mod name_map;
pub mod pause;
pub mod pool;
pub mod refused;
pub mod ring_thread;
pub mod router;
pub mod schema_watch;
pub mod schema_window;
pub mod server;
pub mod session;
pub mod statements;
pub mod tls;
pub mod wal_feed;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use pgfresh_balancer::{Balancer, MonitorSettings, NodeSpec};
use pgfresh_config::{Config, ConfigHandle};
use pgfresh_recency::{RecencyConfig, RecencyMap, RelPattern, SystemClock};
use pgfresh_sql::{Analyzer, AnalyzerOptions, FunctionPolicy};
use tokio::net::TcpListener;

pub use context::Shared;
pub use error::ProxyError;

/// How the proxy is asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Stop accepting; let sessions finish their transactions up to the shutdown timeout.
    Graceful,
    /// Close everything now.
    Fast,
}

pub fn monitor_settings(c: &Config) -> MonitorSettings {
    MonitorSettings {
        user: c.monitor.user.clone(),
        password: c.monitor.password.clone(),
        database: c.monitor.database.clone(),
        sr_check_period: Duration::from_millis(c.monitor.sr_check_period_ms),
        replay_check_period: Duration::from_millis(c.monitor.replay_check_period_ms),
        replay_from_primary: c.monitor.replay_from_primary,
        health_timeout: Duration::from_millis(c.monitor.health_timeout_ms),
        connect_timeout: Duration::from_millis(c.monitor.connect_timeout_ms),
        delay_threshold_bytes: c.routing.delay_threshold,
        delay_threshold_ms: c.routing.delay_threshold_by_time,
        load_balance: match c.routing.load_balance {
            pgfresh_config::LoadBalance::Random => pgfresh_balancer::LoadBalance::Random,
            pgfresh_config::LoadBalance::LeastOutstanding => {
                pgfresh_balancer::LoadBalance::LeastOutstanding
            }
        },
        prefer_lower_delay_standby: c.routing.prefer_lower_delay_standby,
        ..MonitorSettings::default()
    }
}

fn node_specs(c: &Config) -> Vec<NodeSpec> {
    c.nodes
        .iter()
        .map(|n| NodeSpec {
            name: n.name.clone(),
            host: n.host.clone(),
            port: n.port,
            weight: n.weight,
            patroni_url: n.patroni_url.clone(),
            tls: std::sync::Arc::new(node_tls(&n.server_tls(&c.tls))),
        })
        .collect()
}

/// The nodetls settings for a node's `server_tls_*` keys.
fn node_tls(t: &pgfresh_config::ServerTls) -> pgfresh_nodetls::Settings {
    use pgfresh_config::ServerTlsMode as C;
    use pgfresh_nodetls::Mode as M;
    pgfresh_nodetls::Settings {
        mode: match t.mode {
            C::Disable => M::Disable,
            C::Prefer => M::Prefer,
            C::Require => M::Require,
            C::VerifyCa => M::VerifyCa,
            C::VerifyFull => M::VerifyFull,
        },
        ca_file: t.ca_file.clone(),
        cert_file: t.cert_file.clone(),
        key_file: t.key_file.clone(),
    }
}

/// One node's answer to [`check_monitor_logins`].
#[derive(Debug, Clone)]
pub struct NodeLoginCheck {
    /// The node's configured name.
    pub name: String,
    /// `host:port` as configured.
    pub address: String,
    /// Role and version, or what went wrong in the words the monitor records
    /// (the server's message and SQLSTATE, or the I/O error).
    pub result: Result<pgfresh_balancer::LoginCheck, String>,
}

/// Tries the monitor's login (`[monitor]` user, password, database) against every
/// configured node at once, as the monitor itself connects (`pgfresh check --connect`).
pub async fn check_monitor_logins(c: &Config) -> Vec<NodeLoginCheck> {
    let settings = monitor_settings(c);
    let tasks: Vec<_> = node_specs(c)
        .into_iter()
        .map(|spec| {
            let settings = settings.clone();
            tokio::spawn(async move {
                let result = pgfresh_balancer::check_login(&spec, &settings).await;
                NodeLoginCheck {
                    address: format!("{}:{}", spec.host, spec.port),
                    name: spec.name,
                    result,
                }
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(r) = t.await {
            out.push(r);
        }
    }
    out
}

fn patterns(list: &[String]) -> Vec<RelPattern> {
    list.iter().filter_map(|s| s.parse().ok()).collect()
}

fn recency_config(c: &Config) -> RecencyConfig {
    let r = &c.routing;
    RecencyConfig {
        ttl_ms: r.recent_access_ttl_ms,
        window_floor_ms: recency_window_floor(c),
        max_ttl_ms: r.recent_access_max_ttl_ms,
        max_staleness_ms: r.max_staleness_ms,
        cold_start_ms: r.cold_start_ms,
        max_entries: r.recency_max_entries,
        never_track: patterns(&r.never_track),
        always_hot: patterns(&r.always_hot),
    }
}

fn function_policy(c: &Config) -> FunctionPolicy {
    FunctionPolicy::from_lists(
        &c.routing.write_function_list,
        &c.routing.read_only_function_list,
    )
    .unwrap_or_default()
}

/// A running proxy.
pub struct Proxy {
    pub shared: Arc<Shared>,
    shutdown_tx: tokio::sync::watch::Sender<bool>,
    /// With the io_uring engine: the sessions' thread, stopped with the proxy.
    _ring: Option<ring_thread::RingThread>,
}

impl Proxy {
    /// Build the shared state and start the cluster monitor. Must run inside a tokio runtime.
    pub fn new(config: ConfigHandle) -> Proxy {
        let c = config.snapshot();
        // The recorder first: a metric handle made before it is installed counts nothing
        // (the monitor makes its handles as it starts).
        let _ = admin::metrics_handle();
        let ring = ring_thread::RingThread::for_config(&c.proxy);
        // The standbys' fast replay polls run beside the sessions, on their engine.
        let balancer = Balancer::start_on(
            node_specs(&c),
            monitor_settings(&c),
            ring.as_ref().map(|r| r.handle.clone()),
        );
        let recency = Arc::new(RecencyMap::new(
            recency_config(&c),
            Arc::new(SystemClock::new()),
        ));
        let analyzer = Analyzer::new(AnalyzerOptions {
            cache_max_entries: c.routing.parse_cache_entries,
            cache_max_bytes: c.routing.parse_cache_bytes,
        });
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            policy: ArcSwap::from_pointee(function_policy(&c)),
            config,
            pools: pool::Pools::default(),
            cancels: cancel::CancelRegistry::default(),
            verifiers: client::VerifierCache::default(),
            analyzer,
            not_analyzed: Arc::new(pgfresh_sql::Analysis::not_analyzed()),
            recency,
            balancer,
            clients: AtomicUsize::new(0),
            client_list: Default::default(),
            fallbacks_in_flight: AtomicUsize::new(0),
            shutdown: shutdown_rx,
            ttl_source: ArcSwap::from_pointee(admin::TtlSource::file()),
            forced_labels: Default::default(),
            catalog: Default::default(),
            deps: deps::Dependencies::new(&c),
            ring: ring.as_ref().map(|r| r.handle.clone()),
            faults: Default::default(),
            client_tls: Default::default(),
            passthrough: Default::default(),
            auth_file: Default::default(),
            auth_query: Default::default(),
            wal_feeds: Default::default(),
            pause: Default::default(),
            refused: Default::default(),
        });
        shared.deps.attach(&shared);
        shared.client_tls.refresh(&c.tls);
        shared.auth_file.refresh(&c.auth.auth_file);
        let proxy = Proxy {
            shared,
            shutdown_tx,
            _ring: ring,
        };
        proxy.spawn_background();
        proxy
    }

    /// Tasks that live as long as the proxy: recency sweeping, closing pooled server
    /// connections idle or open too long, role-change handling.
    fn spawn_background(&self) {
        let shared = self.shared.clone();
        let mut stop = self.shared.shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let mut ticks = 0u64;
            let mut events = shared.balancer.subscribe();
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        ticks += 1;
                        if ticks % 4 == 0 {
                            // Certificates and auth_file replaced on disk are picked up
                            // within a second.
                            let c = shared.config.snapshot();
                            shared.client_tls.refresh(&c.tls);
                            shared.auth_file.refresh(&c.auth.auth_file);
                            // Pooled connections idle or open too long are closed.
                            shared.pools.close_expired(&Shared::pool_settings(&c));
                        }
                        shared.recency.sweep(10_000);
                        let stats = shared.recency.stats();
                        metrics::gauge!("pgfresh_hot_relations").set(shared.recency.len() as f64);
                        metrics::gauge!("pgfresh_recent_access_ttl_ms").set(shared.recency.ttl_ms() as f64);
                        let _ = stats;
                    }
                    ev = events.recv() => match ev {
                        Ok(pgfresh_balancer::ClusterEvent::RoleChanged { from: pgfresh_balancer::Role::Unknown, .. }) => {
                            // First discovery of a node's role (or its return after being
                            // unreachable): connections made before were made to the same role.
                        }
                        Ok(pgfresh_balancer::ClusterEvent::RoleChanged { node, .. }) => {
                            tracing::warn!(node, "node changed role: closing its server connections");
                            shared.pools.invalidate_node(node);
                            shared.recency.begin_cold_start();
                        }
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(_) => return,
                    },
                    _ = stop.changed() => return,
                }
            }
        });
    }

    /// Apply a config snapshot's live keys to the running parts (recency, balancer,
    /// function lists). Called after every successful reload or API change.
    pub fn apply_config(shared: &Shared) {
        let c = shared.config.snapshot();
        let r = &c.routing;
        shared.recency.set_max_ttl_ms(r.recent_access_max_ttl_ms);
        shared.recency.set_ttl_ms(r.recent_access_ttl_ms);
        shared.recency.set_window_floor_ms(recency_window_floor(&c));
        shared.recency.set_max_staleness_ms(r.max_staleness_ms);
        shared.recency.set_cold_start_ms(r.cold_start_ms);
        shared.recency.set_max_entries(r.recency_max_entries);
        shared
            .recency
            .set_lists(patterns(&r.never_track), patterns(&r.always_hot));
        shared.balancer.update_settings(monitor_settings(&c));
        shared.policy.store(Arc::new(function_policy(&c)));
        shared.deps.apply_config(&c);
        shared.client_tls.refresh(&c.tls);
        shared.auth_file.refresh(&c.auth.auth_file);
    }

    /// Apply the config's node list: new nodes are monitored (and join the read pool
    /// once eligible), removed ones are retired and their pooled and leased server
    /// connections closed, weights updated. Relations written before the change may
    /// not be known to the new set, so recency starts a cold-start window.
    pub fn apply_nodes(shared: &Shared) {
        let c = shared.config.snapshot();
        shared.balancer.update_nodes(node_specs(&c));
        let view = shared.balancer.view();
        for (id, n) in view.nodes.iter().enumerate() {
            if n.retired {
                shared.pools.invalidate_node(id);
            }
        }
        shared.recency.begin_cold_start();
        tracing::info!(nodes = c.nodes.len(), "node list applied");
    }

    /// Re-read the config file and apply it; logs and counts the outcome.
    pub fn reload(&self) -> Result<(), pgfresh_config::ConfigError> {
        reload_config(&self.shared, "file").map(|_| ())
    }
}

/// Re-read the config file and apply its live keys; logs (with `trigger`: "file",
/// "sighup", "console") and counts the outcome. A file that fails validation changes
/// nothing.
pub fn reload_config(
    shared: &Shared,
    trigger: &str,
) -> Result<pgfresh_config::ReloadOutcome, pgfresh_config::ConfigError> {
    match shared.config.reload() {
        Ok(outcome) => {
            metrics::counter!("pgfresh_config_reloads_total", "result" => "ok").increment(1);
            for k in &outcome.applied {
                tracing::info!(key = %k.key, source = "file", trigger, "config key applied");
            }
            for k in &outcome.pending_restart {
                tracing::warn!(key = %k.key, "config key changed but needs a restart; old value stays in force");
            }
            // The source first: whoever sees the new TTL also sees where it came from.
            if outcome
                .applied
                .iter()
                .any(|k| k.key == "routing.recent_access_ttl_ms")
            {
                shared.ttl_source.store(Arc::new(admin::TtlSource::file()));
            }
            Proxy::apply_config(shared);
            let changed = |prefix: &str| outcome.applied.iter().any(|k| k.key.starts_with(prefix));
            if changed("nodes") {
                Proxy::apply_nodes(shared);
            } else if changed("tls.server_tls") {
                // The same nodes with new TLS settings: monitors reconnect, pools stop
                // reusing connections made with the old ones; no cold start.
                shared
                    .balancer
                    .update_nodes(node_specs(&shared.config.snapshot()));
            }
            Ok(outcome)
        }
        Err(e) => {
            metrics::counter!("pgfresh_config_reloads_total", "result" => "error").increment(1);
            tracing::error!(error = %e, trigger, "config reload rejected; the running config stays in force");
            Err(e)
        }
    }
}

impl Proxy {
    /// Serve clients on `listener` (and the admin API on `admin`, when given) until
    /// `stop` resolves, then shut down as it says.
    pub async fn run(
        self,
        listener: TcpListener,
        admin: Option<TcpListener>,
        stop: impl std::future::Future<Output = Stop>,
    ) {
        let this = Arc::new(self);
        if let Some(admin) = admin {
            tokio::spawn(admin::serve(admin, this.clone()));
        }
        let (accept_stop_tx, accept_stop_rx) = tokio::sync::oneshot::channel::<()>();
        let accept = tokio::spawn(listener::serve(listener, this.shared.clone(), async move {
            let _ = accept_stop_rx.await;
        }));
        let how = stop.await;
        let _ = accept_stop_tx.send(());
        let _ = accept.await;
        let timeout = match how {
            Stop::Fast => Duration::ZERO,
            Stop::Graceful => {
                Duration::from_millis(this.shared.config.snapshot().proxy.shutdown_timeout_ms)
            }
        };
        let started = tokio::time::Instant::now();
        // Graceful: for the first 90 % of the timeout the sessions go on serving their
        // clients, which may finish and leave without seeing an error (a pool closing
        // its connections, a load balancer sending new ones elsewhere)...
        wait_for_clients(&this.shared, started + timeout - timeout / 10).await;
        // ...then each closes itself at its next transaction boundary (57P01), and at
        // the timeout whatever is left goes with the process.
        let _ = this.shutdown_tx.send(true);
        wait_for_clients(&this.shared, started + timeout).await;
        this.shared.balancer.shutdown();
    }
}

/// Returns once no client session is left, or at `until`.
async fn wait_for_clients(shared: &Shared, until: tokio::time::Instant) {
    while shared.client_count() > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The shortest window a write stays recent (see `RecencyMap::set_window_floor_ms`): a
/// replica stays in the read pool up to `delay_threshold_by_time` behind, as the monitor
/// last measured it, one `sr_check_period_ms` ago at most. A read outside the window may
/// go to any of them, so the window must cover that. (With no time threshold the TTL
/// alone is the window: size it to the replicas' lag.)
fn recency_window_floor(c: &pgfresh_config::Config) -> u64 {
    c.routing
        .delay_threshold_by_time
        .map_or(0, |lag| lag.saturating_add(c.monitor.sr_check_period_ms))
}
