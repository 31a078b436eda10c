//! State shared by every session of one proxy instance.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use pgfresh_balancer::Balancer;
use pgfresh_config::{Config, ConfigHandle};
use pgfresh_recency::RecencyMap;
use pgfresh_sql::{Analyzer, FunctionPolicy};

use crate::cancel::CancelRegistry;
use crate::pool::{PoolSettings, Pools};
use crate::server::Target;

pub struct Shared {
    pub config: ConfigHandle,
    pub pools: Pools,
    pub cancels: CancelRegistry,
    pub verifiers: crate::client::VerifierCache,
    pub analyzer: Analyzer,
    /// Stands in for an analysis while `enable_query_parser` is off.
    pub not_analyzed: Arc<pgfresh_sql::Analysis>,
    pub recency: Arc<RecencyMap>,
    pub balancer: Balancer,
    /// Function lists compiled from the config; rebuilt on reload.
    pub policy: ArcSwap<FunctionPolicy>,
    pub clients: AtomicUsize,
    /// The clients now connected, for SHOW CLIENTS.
    pub client_list: Arc<crate::clients::ClientRegistry>,
    /// Reads currently running on the primary because no replica could serve them.
    pub fallbacks_in_flight: AtomicUsize,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// User-function volatility per database, from `pg_proc`.
    pub catalog: crate::catalog::Catalog,
    /// Dependency graphs per database (triggers, cascades, views, partitions, bodies).
    pub deps: crate::deps::Dependencies,
    /// `pgfresh_recency_forced_total` by relation label (capped; the rest count as
    /// "other"): handles, so a hot read costs no registry lookup and no label string.
    pub forced_labels: std::sync::Mutex<foldhash::HashMap<String, metrics::Counter>>,
    /// Where the TTL in force came from ("file", "api", "console") and when.
    pub ttl_source: ArcSwap<crate::admin::TtlSource>,
    /// SCRAM pass-through keys per user name, from the latest client login that proved
    /// them (users whose password is a verifier and who have no server_password).
    pub passthrough:
        std::sync::Mutex<std::collections::HashMap<String, pgfresh_wire::auth::ScramKeys>>,
    /// Users from `[auth] auth_file`.
    pub auth_file: crate::auth_file::AuthFile,
    /// Users looked up with `[auth] auth_query`.
    pub auth_query: crate::auth_query::AuthQuery,
    /// TLS toward clients, rebuilt when `[tls]` or its files change.
    pub client_tls: crate::tls::ClientTls,
    /// Statements the standbys refused lately: straight to the primary.
    pub refused: crate::refused::RefusedReads,
    /// The WAL feeds of the databases in use (`wal_feed`).
    pub wal_feeds: crate::wal_feed::WalFeeds,
    /// The console's PAUSE and RESUME.
    pub pause: crate::pause::Pause,
    /// The runtime client sessions run on with the io_uring engine (`None`: tokio).
    pub ring: Option<pgfresh_ring::Handle>,
    /// Faults integration tests arm ([`Shared::arm_fault`]).
    #[doc(hidden)]
    pub faults: crate::session::lost_commit::Faults,
}

/// Relations labelled individually on `pgfresh_recency_forced_total`; the rest count as "other".
pub const FORCED_LABEL_CAP: usize = 100;

impl Shared {
    /// Test hook: arm a fault the next session to reach it triggers (once).
    #[doc(hidden)]
    pub fn arm_fault(&self, fault: crate::session::lost_commit::Fault) {
        self.faults.arm(fault);
    }

    /// Count a read forced to the primary by a recent write to `relation`.
    pub fn count_forced(&self, relation: &str) {
        let mut labels = self.forced_labels.lock().unwrap_or_else(|p| p.into_inner());
        // One label per relation up to the cap, then "other" (kept with the rest once
        // used, so a relation past the cap costs a lookup, not a registration).
        let label = if labels.contains_key(relation) || labels.len() < FORCED_LABEL_CAP {
            relation
        } else {
            "other"
        };
        if let Some(counter) = labels.get(label) {
            counter.increment(1);
            return;
        }
        let counter =
            metrics::counter!("pgfresh_recency_forced_total", "relation" => label.to_string());
        counter.increment(1);
        labels.insert(label.to_string(), counter);
    }

    pub fn pool_settings(c: &Config) -> PoolSettings {
        let wait = match c.pool.pool_mode {
            pgfresh_config::PoolMode::Session => c.pool.acquire_timeout_ms,
            pgfresh_config::PoolMode::Transaction => c.pool.query_wait_timeout_ms,
        };
        PoolSettings {
            mode: c.pool.pool_mode,
            pool_size: c.pool.pool_size,
            acquire_timeout: Duration::from_millis(wait),
            connect_timeout: Duration::from_millis(c.pool.connect_timeout_ms),
            login_timeout: Duration::from_millis(c.pool.server_login_timeout_ms),
            idle_timeout: Duration::from_millis(c.pool.idle_timeout_ms),
            lifetime: Duration::from_millis(c.pool.server_lifetime_ms),
        }
    }

    /// The error for "no primary is known", saying why (the monitor cannot reach any node,
    /// with the first node's error; or no reachable node is out of recovery).
    pub fn no_primary(&self) -> crate::error::ProxyError {
        crate::error::ProxyError::NoPrimary(Some(self.balancer.view().no_primary_reason()))
    }

    /// The connection target for `node` (a balancer node id) as `user` on `database`,
    /// or None when the node is unknown or was removed from the config.
    pub fn target(
        &self,
        node: usize,
        user: &pgfresh_config::UserConfig,
        database: &str,
    ) -> Option<Target> {
        let view = self.balancer.view();
        let n = view.node(node).filter(|n| !n.retired)?;
        Some(Target {
            node,
            node_name: n.spec.name.as_str().into(),
            host: n.spec.host.as_str().into(),
            port: n.spec.port,
            tls: n.spec.tls.clone(),
            user: user.server_user().into(),
            password: user.server_password().map(Into::into),
            passthrough: if user.server_password().is_none() && user.password_is_verifier() {
                self.passthrough
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&user.name)
                    .copied()
            } else {
                None
            },
            database: database.into(),
        })
    }

    pub fn client_count(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }
}

/// Holds one of the `max_primary_fallbacks` slots while a fallback read runs.
pub struct FallbackSlot(Arc<Shared>);

impl FallbackSlot {
    pub fn try_take(shared: &Arc<Shared>, max: usize) -> Option<Self> {
        let prev = shared.fallbacks_in_flight.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            shared.fallbacks_in_flight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Self(shared.clone()))
    }
}

impl Drop for FallbackSlot {
    fn drop(&mut self) {
        self.0.fallbacks_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
