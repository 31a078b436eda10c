//! The configuration schema. Every field here is documented in `conf/pgfresh.toml`.
//!
//! Unknown keys are rejected (`deny_unknown_fields`) so a typo never silently falls back
//! to a default.

use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub proxy: ProxySection,
    #[serde(default)]
    pub pool: PoolSection,
    #[serde(default)]
    pub monitor: MonitorSection,
    #[serde(default)]
    pub routing: RoutingSection,
    #[serde(default)]
    pub tls: TlsSection,
    #[serde(default)]
    pub auth: AuthSection,
    #[serde(default)]
    pub nodes: Vec<NodeConfig>,
    #[serde(default)]
    pub users: Vec<UserConfig>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxySection {
    /// Address clients connect to.
    pub listen: String,
    /// HTTP admin listener (/metrics, /v1/status, /v1/config, status page). Empty disables it.
    pub admin_listen: String,
    /// Bearer token required by the admin API's PUT endpoints and status when set.
    pub admin_token: Option<String>,
    /// Serve the admin HTTP API over TLS with `[tls]`'s client certificate.
    pub admin_tls: bool,
    /// Client connections accepted at once; past it new clients get SQLSTATE 53300.
    pub max_client_connections: usize,
    /// A client that has not finished startup and authentication by then is dropped.
    pub client_login_timeout_ms: u64,
    /// SIGTERM: how long running sessions may take to finish before they are closed.
    pub shutdown_timeout_ms: u64,
    /// Tracing filter, e.g. "info" or "pgfresh_proxy=debug,info".
    pub log_level: String,
    /// Largest protocol message accepted from a client (bytes).
    pub max_message_bytes: usize,
    /// Threads serving clients: 0 runs everything on one thread (least CPU per
    /// statement); N > 0 uses a work-stealing runtime with N threads.
    pub worker_threads: usize,
    /// What the client sessions' sockets wait on: tokio's epoll reactor, or one io_uring
    /// on a thread of its own that runs every session (fewer system calls and wake-ups a
    /// statement; Linux 6.1 or later); `auto` (the default) takes the ring where
    /// `worker_threads` is 0 and the kernel grants one.
    pub io_engine: IoEngine,
}

/// The client sessions' I/O engine (`[proxy] io_engine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoEngine {
    /// `IoUring` where `worker_threads` is 0 (one thread serves every client either way)
    /// and the kernel sets up a ring; `Epoll` otherwise.
    #[default]
    Auto,
    /// Tokio's reactor, on the runtime `worker_threads` describes.
    Epoll,
    /// pgfresh-ring: sessions on one thread whose loop waits in `io_uring_enter`.
    IoUring,
}

impl IoEngine {
    pub fn as_str(self) -> &'static str {
        match self {
            IoEngine::Auto => "auto",
            IoEngine::Epoll => "epoll",
            IoEngine::IoUring => "io_uring",
        }
    }

    /// Whether the sessions should try the ring, given `worker_threads`.
    pub fn wants_ring(self, worker_threads: usize) -> bool {
        match self {
            IoEngine::Auto => worker_threads == 0,
            IoEngine::Epoll => false,
            IoEngine::IoUring => true,
        }
    }
}

impl Default for ProxySection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:6432".into(),
            admin_listen: "127.0.0.1:9930".into(),
            admin_token: None,
            admin_tls: false,
            max_client_connections: 1000,
            client_login_timeout_ms: 15_000,
            shutdown_timeout_ms: 30_000,
            log_level: "info".into(),
            max_message_bytes: 1 << 30,
            worker_threads: 0,
            io_engine: IoEngine::Auto,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSection {
    /// When a client gives its server connection back: at the end of its session, or
    /// at the end of each transaction.
    pub pool_mode: PoolMode,
    /// Server connections per (node, user, database).
    pub pool_size: usize,
    /// How long a session waits for a free server connection before it gets an error.
    pub acquire_timeout_ms: u64,
    /// TCP connect timeout to a node.
    pub connect_timeout_ms: u64,
    /// Deadline for a node to finish authentication and startup.
    pub server_login_timeout_ms: u64,
    /// Sent to a server connection before it goes back to the pool.
    pub reset_query: String,
    /// Idle pooled server connections are closed after this long (0 = never).
    pub idle_timeout_ms: u64,
    /// Server connections open longer than this are closed instead of being lent again
    /// (0 = never); a session never loses the connection it holds.
    pub server_lifetime_ms: u64,
    /// Transaction mode: how long a statement waits for a free server connection
    /// before it fails with SQLSTATE 57014 (the session goes on).
    pub query_wait_timeout_ms: u64,
    /// Transaction mode: protocol-level prepared statements kept per server connection
    /// (least recently used ones are closed beyond this).
    pub max_prepared_statements: usize,
    /// Transaction mode: an extended batch left open by a Flush, or a transaction, may
    /// hold its server connection idle this long before the client is disconnected
    /// (0 = no limit).
    pub idle_transaction_timeout_ms: u64,
}

/// Where users come from besides `[[users]]` (PgBouncer's names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// A PgBouncer userlist.txt: `"user" "secret"` per line, the secret a SCRAM-SHA-256
    /// verifier, an md5 hash (`md5` + 32 hex digits) or a plain password. Re-read within
    /// a second of a change; `[[users]]` wins over it.
    pub auth_file: String,
    /// A `[[users]]` entry pgfresh logs in as (with its server credentials) to look up
    /// users that are neither in `[[users]]` nor in `auth_file` with `auth_query`.
    pub auth_user: String,
    /// Returns (name, secret) for the user `$1`; the secret as in `auth_file`.
    pub auth_query: String,
}

impl Default for AuthSection {
    fn default() -> Self {
        Self {
            auth_file: String::new(),
            auth_user: String::new(),
            auth_query: "SELECT usename, passwd FROM pg_shadow WHERE usename = $1".into(),
        }
    }
}

/// TLS toward clients (PgBouncer's names). Paths are read as given (relative ones from
/// pgfresh's working directory).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSection {
    /// `None`: `prefer` when a certificate is configured, else `disable`.
    pub client_tls_sslmode: Option<ClientTlsMode>,
    /// The certificate chain pgfresh presents to clients (PEM).
    pub client_tls_cert_file: String,
    /// Its private key (PEM).
    pub client_tls_key_file: String,
    /// CA certificates client certificates must chain to (`verify-ca`, `verify-full`).
    pub client_tls_ca_file: String,
    /// TLS toward the nodes (every connection: pools, monitor, catalog reader,
    /// `auth_query`, cancel requests); `[[nodes]]` may override it and the three files.
    pub server_tls_sslmode: ServerTlsMode,
    /// CA certificates nodes' certificates must chain to (`verify-ca`, `verify-full`).
    pub server_tls_ca_file: String,
    /// A client certificate (PEM) pgfresh presents to nodes; empty for none.
    pub server_tls_cert_file: String,
    /// Its private key (PEM).
    pub server_tls_key_file: String,
}

/// What pgfresh asks of the nodes' TLS (`server_tls_sslmode`, PgBouncer's meanings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerTlsMode {
    /// Never TLS.
    Disable,
    /// TLS when the node offers it; its certificate is not checked.
    #[default]
    Prefer,
    /// Always TLS; the certificate is not checked.
    Require,
    /// Always TLS; the certificate must chain to `server_tls_ca_file`.
    VerifyCa,
    /// As `verify-ca`, and the certificate must name the node's `host`.
    VerifyFull,
}

/// The TLS settings in force for one node: its own `server_tls_*` keys, else `[tls]`'s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerTls {
    pub mode: ServerTlsMode,
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
}

impl TlsSection {
    /// The mode in force: the configured one, or `prefer` with a certificate and
    /// `disable` without.
    pub fn client_mode(&self) -> ClientTlsMode {
        self.client_tls_sslmode
            .unwrap_or(if self.client_tls_cert_file.is_empty() {
                ClientTlsMode::Disable
            } else {
                ClientTlsMode::Prefer
            })
    }
}

/// What pgfresh asks of clients' TLS (`client_tls_sslmode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientTlsMode {
    /// TLS is refused (SSLRequest is answered `N`).
    Disable,
    /// TLS when the client asks for it.
    Allow,
    /// TLS when the client asks for it (the same as `allow` on this side).
    Prefer,
    /// Only TLS connections are accepted (cancel requests excepted).
    Require,
    /// TLS with a client certificate that chains to `client_tls_ca_file`.
    VerifyCa,
    /// As `verify-ca`.
    VerifyFull,
}

impl ClientTlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientTlsMode::Disable => "disable",
            ClientTlsMode::Allow => "allow",
            ClientTlsMode::Prefer => "prefer",
            ClientTlsMode::Require => "require",
            ClientTlsMode::VerifyCa => "verify-ca",
            ClientTlsMode::VerifyFull => "verify-full",
        }
    }

    /// Plain connections are refused.
    pub fn required(self) -> bool {
        matches!(
            self,
            ClientTlsMode::Require | ClientTlsMode::VerifyCa | ClientTlsMode::VerifyFull
        )
    }

    /// Clients must present a certificate.
    pub fn verifies_clients(self) -> bool {
        matches!(self, ClientTlsMode::VerifyCa | ClientTlsMode::VerifyFull)
    }
}

/// When a server connection goes back to the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolMode {
    /// When the client disconnects: the client holds one connection per node it used.
    #[default]
    Session,
    /// When each transaction (or autocommit statement, or extended batch) ends.
    Transaction,
}

impl PoolMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

impl Default for PoolSection {
    fn default() -> Self {
        Self {
            pool_mode: PoolMode::Session,
            pool_size: 20,
            acquire_timeout_ms: 10_000,
            connect_timeout_ms: 5_000,
            server_login_timeout_ms: 10_000,
            reset_query: "DISCARD ALL".into(),
            idle_timeout_ms: 600_000,
            server_lifetime_ms: 3_600_000,
            query_wait_timeout_ms: 120_000,
            max_prepared_statements: 200,
            idle_transaction_timeout_ms: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorSection {
    /// Role used by the monitor's own connection to each node (one per node,
    /// separate from the client pools). Needs only LOGIN.
    pub user: String,
    pub password: String,
    pub database: String,
    /// Poll period for roles, WAL positions and lag.
    pub sr_check_period_ms: u64,
    /// While reads wait on replay positions no replica is known to have: how often each
    /// standby is also asked for `pg_last_wal_replay_lsn()` between the full polls, for a
    /// second after the last such read, paused for a standby known to have replayed the
    /// newest position asked for or committed through pgfresh, and for a period after a
    /// read's sample of it answered. 0: only the full polls.
    pub replay_check_period_ms: u64,
    /// While reads wait on replay positions, the primary is asked for every standby's last
    /// report of its replay (`pg_stat_get_wal_senders()`) in one query each
    /// `replay_check_period_ms`, and a standby whose reports move is not polled itself.
    /// Only standbys streaming from the primary's configured host and port under a slot
    /// or application name no one else has are matched. false: each standby is polled.
    pub replay_from_primary: bool,
    /// A node whose last successful poll is older than this is down.
    pub health_timeout_ms: u64,
    pub connect_timeout_ms: u64,
}

impl Default for MonitorSection {
    fn default() -> Self {
        Self {
            user: "postgres".into(),
            password: String::new(),
            database: "postgres".into(),
            sr_check_period_ms: 100,
            replay_check_period_ms: 2,
            replay_from_primary: false,
            health_timeout_ms: 2_000,
            connect_timeout_ms: 2_000,
        }
    }
}

/// What a read that must observe a position token does when no replica has replayed it
/// (after `replica_wait_ms`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStale {
    /// Run on the primary, which has every position.
    #[default]
    Primary,
    /// Fail with SQLSTATE PF001 naming the required and the best available position.
    Error,
}

/// Whether pgfresh learns the writes it did not relay (straight to the primary, through
/// another pgfresh instance) from the primary's WAL, through logical decoding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WalFeed {
    /// Only the writes pgfresh relays are known.
    #[default]
    Off,
    /// Every commit the feed decodes marks what it wrote, a moment after it committed.
    On,
    /// As `on`, and a read goes to a replica only once the feed has decoded every commit
    /// made before the read arrived; while the feed is down, to the primary.
    Strict,
}

impl WalFeed {
    pub fn as_str(self) -> &'static str {
        match self {
            WalFeed::Off => "off",
            WalFeed::On => "on",
            WalFeed::Strict => "strict",
        }
    }
}

/// How reads are spread over eligible replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadBalance {
    Random,
    LeastOutstanding,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingSection {
    /// Parse statements to route reads to replicas. Off: everything goes to the primary.
    pub enable_query_parser: bool,
    /// Force reads of recently written relations to the primary.
    pub enable_recent_access_routing: bool,
    /// Learn each commit's WAL position (a `pg_current_wal_insert_lsn()` pipelined after it)
    /// so a read of a recently written relation may also go to a replica that has
    /// replayed the write, instead of only to the primary.
    pub lsn_routing: bool,
    /// How long a written relation stays hot.
    pub recent_access_ttl_ms: u64,
    /// Cap on any TTL set by file or by the admin API.
    pub recent_access_max_ttl_ms: u64,
    /// A relation written continuously stops being forced to the primary this long
    /// after the first write of its hot streak. Unset: never.
    pub max_staleness_ms: Option<u64>,
    /// After start-up or a failover every read is treated as hot for this long.
    pub cold_start_ms: u64,
    /// Hard cap on tracked hot relations; past it every read of that database is hot.
    pub recency_max_entries: usize,
    /// Relations never tracked (e.g. append-only logs). `name` or `schema.name`.
    pub never_track: Vec<String>,
    /// Relations always treated as hot.
    pub always_hot: Vec<String>,
    /// Bytes of WAL a replica may be behind and still serve reads.
    pub delay_threshold: Option<u64>,
    /// Milliseconds a replica may be behind and still serve reads.
    pub delay_threshold_by_time: Option<u64>,
    pub load_balance: LoadBalance,
    pub prefer_lower_delay_standby: bool,
    /// Functions that write: statements calling them go to the primary.
    pub write_function_list: Vec<String>,
    /// User functions known not to write: calls stay reads.
    pub read_only_function_list: Vec<String>,
    /// Learn each database's dependency graph (triggers, foreign-key cascades, views,
    /// partitions and inheritance, function bodies) from the primary's catalog, so a
    /// statement's side effects are marked with its own writes. Off: only
    /// `relation_dependencies` apply.
    pub learn_dependencies: bool,
    /// Manual dependency rules: `"orders -> order_totals, audit_log"` (a write to `orders`
    /// also writes both) and `"place_order() -> orders, ledger"` (a call of `place_order`
    /// writes and reads both). Checked with `pgfresh_deps::parse_rules`.
    pub relation_dependencies: Vec<String>,
    /// How often (ms) each database in use is asked whether its schema changed outside
    /// this pgfresh (DDL run directly on the primary, or through another instance): a
    /// change seen marks the whole database with the primary's position and reloads its
    /// dependency graph. 0: off (such changes are learned at the next 30 s refresh, and
    /// writes made meanwhile are marked without their new effects).
    pub dependency_check_ms: u64,
    /// A channel the schema check `LISTEN`s on: a notification on it (from an event
    /// trigger on `ddl_command_end` that calls `pg_notify`, installed by the operator)
    /// runs the check at once instead of at the next period. Empty: none.
    pub dependency_notify_channel: String,
    /// With `lsn_routing`: how long a read of a recently written relation may wait for a
    /// replica to replay the write before it goes to the primary (0: go at once).
    pub replica_wait_ms: u64,
    /// A read carrying a position token (`pgfresh.min_lsn`) that no replica has replayed:
    /// `primary` (default) or `error` (SQLSTATE PF001).
    pub on_stale: OnStale,
    /// Learn the writes pgfresh did not relay from the primary's WAL (see [`WalFeed`]).
    pub wal_feed: WalFeed,
    /// With `wal_feed = "strict"`: how long a read bound for a replica waits for the feed
    /// to decode every commit made before it arrived, before it goes to the primary.
    pub wal_feed_wait_ms: u64,
    /// Cap on concurrent reads that fell back to the primary.
    pub max_primary_fallbacks: usize,
    /// Retries of an idempotent autocommit read on another node after a replica failed,
    /// or on the primary after a standby refused it (see the README's failure table).
    pub read_retry_budget: u32,
    /// Learn the transaction id of each explicit transaction as it commits (a
    /// `txid_current_if_assigned()` pipelined before the COMMIT) so that when the
    /// connection to the primary is lost after COMMIT was sent, the outcome is asked of
    /// the primary (`txid_status`) instead of answering 08007.
    pub resolve_lost_commits: bool,
    /// Parsed-statement cache bounds.
    pub parse_cache_entries: u64,
    pub parse_cache_bytes: u64,
}

impl Default for RoutingSection {
    fn default() -> Self {
        Self {
            enable_query_parser: true,
            enable_recent_access_routing: true,
            lsn_routing: true,
            recent_access_ttl_ms: 1_000,
            recent_access_max_ttl_ms: 60_000,
            max_staleness_ms: None,
            cold_start_ms: 2_000,
            recency_max_entries: 1_000_000,
            never_track: Vec::new(),
            always_hot: Vec::new(),
            delay_threshold: Some(16 * 1024 * 1024),
            delay_threshold_by_time: Some(2_000),
            load_balance: LoadBalance::Random,
            prefer_lower_delay_standby: false,
            write_function_list: Vec::new(),
            read_only_function_list: Vec::new(),
            learn_dependencies: true,
            relation_dependencies: Vec::new(),
            dependency_check_ms: 1_000,
            dependency_notify_channel: String::new(),
            replica_wait_ms: 0,
            on_stale: OnStale::Primary,
            wal_feed: WalFeed::Off,
            wal_feed_wait_ms: 1_000,
            max_primary_fallbacks: 1_000,
            read_retry_budget: 1,
            resolve_lost_commits: false,
            parse_cache_entries: 100_000,
            parse_cache_bytes: 64 * 1024 * 1024,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub name: String,
    pub host: String,
    pub port: u16,
    #[serde(default = "one")]
    pub weight: u32,
    /// Take role and lag from the Patroni REST API instead of SQL polls.
    #[serde(default)]
    pub patroni_url: Option<String>,
    /// This node's `server_tls_sslmode` (else `[tls]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_tls_sslmode: Option<ServerTlsMode>,
    /// This node's `server_tls_ca_file` (else `[tls]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_tls_ca_file: Option<String>,
    /// This node's `server_tls_cert_file` (else `[tls]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_tls_cert_file: Option<String>,
    /// This node's `server_tls_key_file` (else `[tls]`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_tls_key_file: Option<String>,
}

impl NodeConfig {
    /// The TLS settings for this node, its own keys over `[tls]`'s.
    pub fn server_tls(&self, tls: &TlsSection) -> ServerTls {
        let pick =
            |own: &Option<String>, global: &String| own.clone().unwrap_or_else(|| global.clone());
        ServerTls {
            mode: self.server_tls_sslmode.unwrap_or(tls.server_tls_sslmode),
            ca_file: pick(&self.server_tls_ca_file, &tls.server_tls_ca_file),
            cert_file: pick(&self.server_tls_cert_file, &tls.server_tls_cert_file),
            key_file: pick(&self.server_tls_key_file, &tls.server_tls_key_file),
        }
    }
}

fn one() -> u32 {
    1
}

/// How a client user proves who it is to pgfresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthMethod {
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    #[serde(rename = "md5")]
    Md5,
    #[serde(rename = "trust")]
    Trust,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// Plain password, or a SCRAM-SHA-256 verifier (`SCRAM-SHA-256$iter:salt$stored:server`).
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default = "default_auth")]
    pub auth: AuthMethod,
    /// Role pgfresh logs in as on the nodes (default: the same name).
    #[serde(default)]
    pub server_user: Option<String>,
    /// Password pgfresh uses on the nodes (default: `password` when it is plain text).
    #[serde(default)]
    pub server_password: Option<String>,
    /// May open the admin console (virtual database `pgfresh`).
    #[serde(default)]
    pub admin: bool,
}

/// `md5` followed by 32 hex digits.
pub fn is_md5_hash(s: &str) -> bool {
    s.strip_prefix("md5")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn default_auth() -> AuthMethod {
    AuthMethod::ScramSha256
}

impl UserConfig {
    /// True when `password` is a stored SCRAM verifier rather than plain text.
    /// `password` is an md5 hash (`md5` + 32 hex digits), as PostgreSQL stores it.
    pub fn password_is_md5(&self) -> bool {
        self.password.as_deref().is_some_and(is_md5_hash)
    }

    pub fn password_is_verifier(&self) -> bool {
        self.password
            .as_deref()
            .is_some_and(|p| p.starts_with("SCRAM-SHA-256$"))
    }

    /// The role used on the nodes.
    pub fn server_user(&self) -> &str {
        self.server_user.as_deref().unwrap_or(&self.name)
    }

    /// The password used on the nodes, if one is known.
    pub fn server_password(&self) -> Option<&str> {
        self.server_password
            .as_deref()
            .or(if self.password_is_verifier() {
                None
            } else {
                self.password.as_deref()
            })
    }
}

impl Config {
    /// The user entry for a login name.
    pub fn user(&self, name: &str) -> Option<&UserConfig> {
        self.users.iter().find(|u| u.name == name)
    }
}
