//! What the balancer is told: the nodes and how to watch them.

use std::time::Duration;

/// A node's position in [`crate::ClusterView::nodes`]. The nodes given to
/// [`crate::Balancer::start`] get `0..n` in their order; nodes added later by
/// [`crate::Balancer::update_nodes`] get the next ids after every id ever used, so an id
/// always names the same node (ids are never reused). The order carries no role.
pub type NodeId = usize;

/// A configured node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Name used in logs, metrics labels and the status API.
    pub name: String,
    /// Host name or address the monitor connects to.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Relative share of reads among eligible replicas; 0 takes the node out of read
    /// selection (it is still monitored and can be the primary).
    pub weight: u32,
    /// Base URL of the node's Patroni REST API, e.g. `http://10.0.0.5:8008` (plain HTTP
    /// only; `https://` is reported as a failed poll). When set, the node's role, WAL
    /// positions, pause state and timeline come from `GET {patroni_url}/patroni` instead of
    /// SQL polls, and `host`/`port` and the monitor login are not used to watch it (see
    /// [`crate::patroni`]).
    pub patroni_url: Option<String>,
    /// TLS toward the node, for the monitor and for every other connection to it.
    pub tls: std::sync::Arc<pgfresh_nodetls::Settings>,
}

/// How a replica is picked among the eligible ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadBalance {
    /// Weighted random choice.
    #[default]
    Random,
    /// The replica with the fewest outstanding requests relative to its weight (ties broken
    /// at random).
    LeastOutstanding,
}

/// Monitor and selection settings; all of them can be replaced live with
/// [`crate::Balancer::update_settings`].
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorSettings {
    /// Login role of the monitor connections. It must be a superuser or a member of
    /// `pg_monitor`, or the standby's WAL receiver status stays hidden and the standby is
    /// never considered streaming.
    pub user: String,
    /// Its password.
    pub password: String,
    /// Database the monitor connects to.
    pub database: String,
    /// Interval between two polls of a node (works down to 10 ms).
    pub sr_check_period: Duration,
    /// While reads wait for replay positions (see [`crate::demand`]): interval between
    /// two `pg_last_wal_replay_lsn()` polls of each standby, between the full polls.
    /// Zero: only the full polls.
    pub replay_check_period: Duration,
    /// While reads wait for replay positions, the primary's monitor reads every
    /// standby's last report to the primary each `replay_check_period`, in place of the
    /// standby's own polls while the reports move ([`crate::reports`]); the full poll of
    /// the primary then also lists its walsenders. False: each standby is polled alone.
    pub replay_from_primary: bool,
    /// A node is down when no poll has succeeded for this long; a single poll that runs
    /// longer is abandoned and counts as failed.
    pub health_timeout: Duration,
    /// Limit on establishing a monitor connection.
    pub connect_timeout: Duration,
    /// Bytes a replica may be behind the primary and stay in the read pool.
    pub delay_threshold_bytes: Option<u64>,
    /// Milliseconds a replica may be behind and stay in the read pool.
    pub delay_threshold_ms: Option<u64>,
    /// A replica that left the pool on lag re-enters only once its lag is at or below
    /// `threshold * (1 - hysteresis)`; between 0 and 1.
    pub hysteresis: f64,
    /// Selection policy.
    pub load_balance: LoadBalance,
    /// Choose only among the least-lagged eligible replicas.
    pub prefer_lower_delay_standby: bool,
    /// Externally pushed lag values older than this are ignored.
    pub external_lag_max_age: Duration,
}

impl Default for MonitorSettings {
    fn default() -> Self {
        MonitorSettings {
            user: "postgres".to_string(),
            password: String::new(),
            database: "postgres".to_string(),
            sr_check_period: Duration::from_millis(100),
            replay_check_period: Duration::from_millis(2),
            replay_from_primary: false,
            health_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            delay_threshold_bytes: None,
            delay_threshold_ms: None,
            hysteresis: 0.2,
            load_balance: LoadBalance::Random,
            prefer_lower_delay_standby: false,
            external_lag_max_age: Duration::from_secs(5),
        }
    }
}

impl MonitorSettings {
    /// The poll period, never below 1 ms.
    pub(crate) fn period(&self) -> Duration {
        self.sr_check_period.max(Duration::from_millis(1))
    }

    /// The hysteresis fraction clamped to `[0, 1]` (NaN counts as 0).
    pub(crate) fn hysteresis_fraction(&self) -> f64 {
        if self.hysteresis.is_nan() {
            0.0
        } else {
            self.hysteresis.clamp(0.0, 1.0)
        }
    }
}

/// Where an externally measured lag applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LagTarget {
    /// One replica.
    Node(NodeId),
    /// Every replica.
    Pool,
}
