//! One client session: the loop that reads the client and the backend it is using,
//! routes each unit, and relays replies.
//!
//! The session holds at most one server connection per node (session pooling) and
//! one *active* backend, the one whose replies it is relaying. It switches backends
//! only between units, when the active backend owes nothing (see [`unit::InFlight`]).

mod client_side;
mod cold_read;
mod fast;
pub mod lost_commit;
mod out;
mod phase;
mod pooling;
mod relay;
mod rewrite;
mod routing;
mod send;
pub mod settings;
mod shutdown;
pub mod state;
mod texts;
pub mod tokens;
pub mod unit;
mod watchdog;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use crate::tls::ClientStream;
use bytes::{Bytes, BytesMut};
use pgfresh_wire::{build, CancelKey, Limits, TxStatus};
use tokio::io::AsyncWriteExt;

use crate::cancel::CancelSlot;
use crate::client::Login;
use crate::clients::ClientState;
use crate::context::{FallbackSlot, Shared};
use crate::error::{Disposition, ProxyError};
use crate::pool::Leased;
use pgfresh_config::PoolMode;
pub use phase::DeferredBegin;
use phase::{TxPhase, WirePhase};
use state::SessionState;
use unit::{ClientUnit, InFlight};

/// Bytes queued for a server past which the client is not read until the server
/// takes them.
const MAX_PENDING: usize = 1 << 20;

/// What an open explicit transaction has written so far.
#[derive(Default)]
struct TxWrites {
    writes: Vec<pgfresh_sql::RelName>,
    /// An unanalysable function body ran: the whole database is marked at COMMIT.
    whole_db: bool,
    /// DDL ran: the dependency graph is reloaded once the transaction ends.
    ddl: bool,
    /// The oldest schema window stamp of the transaction's units (see `InFlight`).
    schema_stamp: Option<crate::schema_window::Stamp>,
    /// Effect-changing schema changes of the transaction, ended when it ends.
    schema_changes: crate::schema_window::SchemaChanges,
}

impl TxWrites {
    /// Takes in what an ended unit of the open transaction wrote and changed.
    fn absorb(&mut self, u: &mut InFlight, wrote: bool) {
        if wrote {
            self.writes.append(&mut u.writes);
            self.whole_db |= u.whole_db;
            self.schema_stamp = oldest(self.schema_stamp, u.schema_stamp);
        }
        self.ddl |= u.ddl;
        self.schema_changes.append(&mut u.schema_changes);
    }
}

/// The older of two schema window stamps (stamps only grow).
fn oldest<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The most client output held back while a commit's position is learned.
const HOLD_LIMIT: usize = 1 << 20;

/// One client's session. Its fields are laid out in declaration order (`repr(C)`): those
/// every statement touches first, those it rarely touches last. With hundreds of clients
/// taking turns a session is rarely in the cache, so each cache line a statement touches
/// costs a miss (docs/benchmarks.md).
#[repr(C)]
pub struct Session {
    shared: Arc<Shared>,
    /// The config in force, refreshed from `config_cache` at each turn of the loop (one
    /// atomic read while it stays the same) instead of loaded per use.
    config: Arc<pgfresh_config::Config>,
    config_cache: pgfresh_config::ConfigCache,
    /// The dependency graph (see `refresh_graph`), kept between turns and brought up to
    /// date once a turn, when `graph_turn` is still false.
    graph: Option<Arc<pgfresh_deps::DepGraph>>,
    graph_turn: bool,
    /// The session database's entry in the shared dependency graphs, once looked up.
    deps_entry: crate::deps::DbEntry,
    /// Connection targets by node and their pools, with the node-set generation
    /// (`ClusterView::specs_generation`) they were built in; dropped when the config
    /// changes (the pool size).
    targets: Vec<Option<(u64, Arc<crate::server::Target>, crate::pool::PoolRef)>>,
    /// The balancer's answers for this session's reads, from cached snapshots (a read
    /// asks for the primary and a replica; arc-swap's guarded loads cost more).
    balancer: pgfresh_balancer::Reader,
    /// The function lists in force (`Shared::policy`), one atomic read a unit while they
    /// stay the same.
    policy: routing::PolicyCache,
    /// The last read routed to any replica for want of recent writes, with what that
    /// depended on (see `cold_read`).
    cold_read: Option<cold_read::ColdRead>,
    /// `pgfresh_routed_total` handles this session has used.
    routed: Vec<(bool, &'static str, metrics::Counter)>,
    /// The `pgfresh_primary_fallbacks_total{reason="no_eligible_replica"}` handle, once
    /// used: with no replica in the pool every read counts there.
    no_replica_fallbacks: Option<metrics::Counter>,
    client: ClientStream,
    cbuf: BytesMut,
    limits: Limits,
    cancel_slot: CancelSlot,
    /// The address of the target `cancel_slot` holds, 0 when it holds none: the slot's
    /// `Arc` keeps that target alive, so no other can have the address meanwhile.
    cancel_shown: usize,
    /// Server connections by node index.
    backends: Vec<Option<Leased>>,
    active: Option<usize>,
    /// Units sent to the active backend and not yet answered by ReadyForQuery.
    inflight: VecDeque<InFlight>,
    /// The analyses of this session's latest texts.
    texts: texts::Texts,
    /// The client's transaction, as the client last saw it.
    tx: TxPhase,
    /// The extended-protocol batch being collected (up to Sync or Flush). Units are
    /// boxed: they move from batch to queue to send to retry without being copied.
    batch: Box<ClientUnit>,
    /// A finished unit, cleared, that the next batch reuses (its box and vectors)
    /// instead of allocating them for each statement.
    spare: Option<Box<ClientUnit>>,
    /// Units read from the client, in order, not yet sent. The front one may be
    /// waiting for the active backend to drain before the session can move nodes.
    ready: VecDeque<Box<ClientUnit>>,
    /// Where the client's messages stand between units: an extended batch left open
    /// (the rest of it goes to the same node), a COPY FROM STDIN running.
    wire: WirePhase,
    /// Replica selection guard (least-outstanding accounting) and fallback slot held
    /// while a unit runs.
    replica_guard: Option<pgfresh_balancer::Selection>,
    fallback_slot: Option<FallbackSlot>,
    /// Output to the client, flushed once per loop turn (held back from a commit on
    /// while its relations wait for its position).
    out: out::ClientOut,
    /// Replies pgfresh made for the client (transaction mode) that are due after the
    /// server reply being relayed.
    due: Vec<Bytes>,
    /// Transaction mode: the buffer a unit's messages are rewritten into, reused.
    rewrite_buf: BytesMut,
    /// This client in SHOW CLIENTS.
    listed: crate::clients::Listed,
    terminating: bool,
    /// `enable_query_parser`, read once per batch of client frames.
    parser_enabled: bool,
    /// `pool_mode`, fixed for the session's life.
    mode: pgfresh_config::PoolMode,
    /// The pool's timeouts and sizes in `config`, worked out when it changes.
    pool_settings: crate::pool::PoolSettings,
    pin_gauge: pooling::PinGauge,
    state: SessionState,
    /// Position tokens: the session's `pgfresh.min_lsn`, commit positions reported.
    tokens: tokens::Tokens,
    /// What the open explicit transaction wrote, marked when it commits.
    tx_writes: TxWrites,
    /// The COMMIT in flight pgfresh can resolve if its connection is lost.
    lost: lost_commit::LostCommits,
    /// The modes the transaction open on a server named (BEGIN, SET TRANSACTION): those
    /// of the transaction an AND CHAIN begins (see `Session::chain_anew`).
    tx_modes: pgfresh_sql::TxModes,
    /// A unit sent since nothing of the client's was last in flight may write any
    /// database of the instance, committed while it runs (`dblink`): every database is
    /// marked at each reply that tells the client a statement ended (CommandComplete,
    /// ErrorResponse, ReadyForQuery), until a unit is sent with nothing in flight again.
    writes_elsewhere: bool,
    // Rarely touched after the login.
    /// Setting changes waiting for their transaction to commit.
    pending_settings: settings::Pending,
    /// What each portal's Execute will mean for the settings (extended protocol).
    portal_events: foldhash::HashMap<String, settings::StmtEvent>,
    login: Login,
    /// A startup option pgfresh refuses (reported when the session starts).
    startup_error: Option<ProxyError>,
    /// The parameter values the client was last told (ParameterStatus), and those held
    /// for the unit in flight.
    reports: relay::Reports,
}

impl Session {
    pub fn new(
        shared: Arc<Shared>,
        client: ClientStream,
        cbuf: BytesMut,
        login: Login,
        cancel_slot: CancelSlot,
    ) -> Self {
        let config = shared.config.snapshot();
        let nodes = shared.balancer.view().nodes.len();
        let mut state = SessionState::default();
        let mut tokens = tokens::Tokens::default();
        let mut startup_error = None;
        for (k, v) in &login.params {
            match k.as_str() {
                "options" => {
                    for (name, value) in state::parse_options(v) {
                        if name == "pgfresh.route" {
                            state.route_primary = value.eq_ignore_ascii_case("primary");
                        } else {
                            if let Err(e) = tokens.set(&name, Some(&value)) {
                                startup_error.get_or_insert(e);
                            }
                            state.set_param(&name, &value);
                        }
                    }
                }
                "replication" => {}
                _ => state.set_param(k, v),
            }
        }
        if state.route_primary {
            state.pins.insert(state::PinReason::RouteSetting);
        }
        let application_name = login
            .params
            .iter()
            .find(|(k, _)| k == "application_name")
            .map_or("", |(_, v)| v.as_str());
        let listed = shared.client_list.list(
            &login.user.name,
            &login.database,
            client.peer_addr(),
            application_name,
            client.is_tls(),
        );
        Self {
            limits: Limits {
                max_message: config.proxy.max_message_bytes,
                max_startup: 10 * 1024,
            },
            config_cache: shared.config.cache(),
            graph: None,
            graph_turn: false,
            deps_entry: Default::default(),
            balancer: shared.balancer.reader(),
            policy: routing::PolicyCache::new(&shared),
            cold_read: None,
            routed: Vec::new(),
            no_replica_fallbacks: None,
            targets: Vec::new(),
            texts: Default::default(),
            config: config.clone(),
            shared,
            client,
            cbuf,
            login,
            cancel_slot,
            cancel_shown: 0,
            backends: (0..nodes).map(|_| None).collect(),
            active: None,
            inflight: VecDeque::new(),
            state,
            pending_settings: settings::Pending::default(),
            tokens,
            startup_error,
            reports: Default::default(),
            portal_events: Default::default(),
            tx: TxPhase::Idle,
            tx_writes: TxWrites::default(),
            batch: Box::new(ClientUnit::new()),
            spare: None,
            ready: VecDeque::new(),
            wire: WirePhase::Units,
            replica_guard: None,
            fallback_slot: None,
            out: out::ClientOut::default(),
            terminating: false,
            parser_enabled: true,
            lost: Default::default(),
            tx_modes: Default::default(),
            writes_elsewhere: false,
            mode: config.pool.pool_mode,
            pool_settings: Shared::pool_settings(&config),
            pin_gauge: Default::default(),
            due: Vec::new(),
            rewrite_buf: BytesMut::new(),
            listed,
        }
    }

    /// Finish login: connect to the primary, replay the startup parameters, and send
    /// the client its ParameterStatus set, BackendKeyData and ReadyForQuery.
    pub async fn start(&mut self, key: CancelKey) -> Result<(), ProxyError> {
        if let Some(e) = self.startup_error.take() {
            return Err(e);
        }
        let login_timeout = Duration::from_millis(self.config.proxy.client_login_timeout_ms);
        // Leave a margin so the client hears why, before the listener's own deadline.
        let deadline =
            std::time::Instant::now() + login_timeout.saturating_sub(Duration::from_millis(250));
        let primary = self.primary_for_login(deadline).await?;
        // Transaction mode: a login with settings the pool has seen logged in needs no
        // server connection; the client gets what that login reported.
        let config = self.config.clone();
        let target = self
            .shared
            .target(primary, &self.login.user, &self.login.database);
        let remembered = target
            .as_ref()
            .filter(|_| self.mode == PoolMode::Transaction);
        if let Some(t) = remembered {
            let size = config.pool.pool_size;
            if let Some(params) = self
                .shared
                .pools
                .login_params(t, size, self.state.settings())
            {
                // A login with these settings succeeded: the database exists.
                self.learn_database(deadline).await;
                return self.send_login_reply(key, &params).await;
            }
        }
        // PAUSE: a login that needs a connection waits for RESUME within its own time.
        self.wait_out_pause(deadline.saturating_duration_since(std::time::Instant::now()))
            .await?;
        let primary = self.attach_primary_for_login(primary, deadline).await?;
        // After the server took the login: a database that does not exist gets no entry.
        self.learn_database(deadline).await;
        let Some(leased) = self.backends[primary].as_mut() else {
            return Err(ProxyError::NoPrimary(None));
        };
        for sql in self.state.replay_statements() {
            if let Err(msg) = leased.conn.run_quiet(sql).await? {
                return Err(ProxyError::ServerLogin {
                    code: msg.get(..5).unwrap_or("08000").to_string(),
                    message: msg,
                });
            }
        }
        leased.conn.settings = Some(self.state.settings().clone());
        let mut params: Vec<(String, String)> = leased
            .conn
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        params.sort();
        let params = Arc::new(params);
        if let Some(t) = remembered {
            self.shared.pools.remember_login_params(
                t,
                config.pool.pool_size,
                self.state.settings(),
                params.clone(),
            );
        }
        self.send_login_reply(key, &params).await
    }

    /// The primary, once the monitor names one (right after start-up, or during a
    /// failover, it may not have yet), waiting until `deadline` at most.
    async fn primary_for_login(&self, deadline: std::time::Instant) -> Result<usize, ProxyError> {
        let balancer = &self.shared.balancer;
        let wait = async {
            loop {
                let mut events = balancer.subscribe();
                if let Some(p) = balancer.primary() {
                    return Some(p);
                }
                if events.recv().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout_at(deadline.into(), wait)
            .await
            .ok()
            .flatten()
            .ok_or_else(|| self.shared.no_primary())
    }

    /// Connect to the primary for a login. A primary that refuses connections or is
    /// shutting down may be going away in a failover: the login waits for the monitor
    /// to name a primary that takes it (until `deadline`), instead of failing at once.
    async fn attach_primary_for_login(
        &mut self,
        mut primary: usize,
        deadline: std::time::Instant,
    ) -> Result<usize, ProxyError> {
        loop {
            let mut events = self.shared.balancer.subscribe();
            let err = match self.attach(primary).await {
                Ok(()) => return Ok(primary),
                Err(e) => e,
            };
            if !in_failover(&err) || std::time::Instant::now() >= deadline {
                return Err(err);
            }
            tracing::info!(error = %err, "the primary does not take connections; the login waits for the cluster to settle");
            primary = self.settle(&mut events, deadline).await?;
        }
    }

    /// After the primary refused a connection: a role change, or a moment, then the
    /// primary the monitor names (waiting for one until `deadline`).
    async fn settle(
        &self,
        events: &mut tokio::sync::broadcast::Receiver<pgfresh_balancer::ClusterEvent>,
        deadline: std::time::Instant,
    ) -> Result<usize, ProxyError> {
        let pause = deadline
            .saturating_duration_since(std::time::Instant::now())
            .min(Duration::from_millis(200));
        let _ = tokio::time::timeout(pause, events.recv()).await;
        self.primary_for_login(deadline).await
    }

    /// A unit bound for the primary failed before anything was sent, with `err`: when
    /// that is a failover under way (no primary known, or the primary refusing
    /// connections) and the session has nothing else running, wait (up to
    /// `query_wait_timeout_ms` in all for this unit) for the monitor to name a primary,
    /// and say whether the unit should be routed again.
    async fn wait_out_failover(&mut self, unit: &mut ClientUnit, err: &ProxyError) -> bool {
        if !in_failover(err) || self.client_busy() || !self.tx.is_idle() {
            return false;
        }
        let now = std::time::Instant::now();
        let wait = Duration::from_millis(self.config.pool.query_wait_timeout_ms);
        let deadline = *unit.failover_deadline.get_or_insert(now + wait);
        if now >= deadline {
            return false;
        }
        tracing::info!(error = %err, "no primary takes connections; the statement waits for the cluster to settle");
        let mut events = self.shared.balancer.subscribe();
        self.settle(&mut events, deadline).await.is_ok()
    }

    /// The first login to a database waits (up to [`crate::deps::FIRST_LOAD_WAIT`], and
    /// half of what is left of the login's time, so the rest of the login still fits) for
    /// its dependencies to be learned, so its first statements are analysed with the
    /// catalog (see `Dependencies::first_load`).
    async fn learn_database(&mut self, deadline: std::time::Instant) {
        // Its WAL feed too (idle while `wal_feed` is off).
        self.shared
            .wal_feeds
            .feed(&self.shared, &self.login.database);
        let half_left = deadline.saturating_duration_since(std::time::Instant::now()) / 2;
        self.shared
            .deps
            .first_load(
                &self.shared,
                &self.login.database,
                &mut self.deps_entry,
                half_left,
            )
            .await;
    }

    /// ParameterStatus for each of `params`, BackendKeyData and ReadyForQuery.
    async fn send_login_reply(
        &mut self,
        key: CancelKey,
        params: &Arc<Vec<(String, String)>>,
    ) -> Result<(), ProxyError> {
        self.reports = relay::Reports::at_login(params.clone());
        let mut out = BytesMut::new();
        for (k, v) in params.iter() {
            out.extend_from_slice(&build::parameter_status(k, v));
        }
        out.extend_from_slice(&build::backend_key_data(key));
        out.extend_from_slice(&build::ready_for_query(TxStatus::Idle));
        self.client
            .write_all(&out)
            .await
            .map_err(ProxyError::ClientIo)?;
        self.client.flush().await.map_err(ProxyError::ClientIo)
    }

    /// Run until the client leaves or an error ends the session. (By reference: a
    /// session moved into this future would be kept in it twice.)
    pub async fn run(&mut self) {
        let result = self.main_loop().await;
        if let Err(e) = &result {
            match e.disposition() {
                Disposition::Silent => {}
                _ => {
                    let _ = self.client.write_all(&e.to_client()).await;
                    let _ = self.client.flush().await;
                    let _ = self.client.flush().await;
                }
            }
            tracing::debug!(user = %self.login.user.name, error = %e, "session ended with error");
        }
        // Boxed: once a session, and its state would otherwise sit beside the main loop's.
        Box::pin(self.release_all()).await;
    }

    /// Where `node` is and who this session logs in there as, and the pool of those
    /// connections, built again only when the node set changed since (in transaction
    /// mode a unit asks for them every time; the view itself changes with every poll).
    fn target(
        &mut self,
        node: usize,
    ) -> Option<(Arc<crate::server::Target>, crate::pool::PoolRef)> {
        let generation = self.balancer.specs_generation();
        if let Some(Some((g, t, p))) = self.targets.get(node) {
            if *g == generation {
                return Some((t.clone(), p.clone()));
            }
        }
        let t = Arc::new(
            self.shared
                .target(node, &self.login.user, &self.login.database)?,
        );
        let p = self.shared.pools.pool_ref(&t, self.config.pool.pool_size);
        if self.targets.len() <= node {
            self.targets.resize_with(node + 1, || None);
        }
        self.targets[node] = Some((generation, t.clone(), p.clone()));
        Some((t, p))
    }

    /// A new turn of the loop: the config in force now (if it changed), and the
    /// dependency graph looked up afresh when next needed.
    fn start_turn(&mut self) {
        self.graph_turn = false;
        let current = self.config_cache.load();
        if !Arc::ptr_eq(current, &self.config) {
            self.config = current.clone();
            self.pool_settings = Shared::pool_settings(current);
            self.targets.clear();
        }
    }

    async fn main_loop(&mut self) -> Result<(), ProxyError> {
        // One future for the whole session (not one per turn): it ends when shutdown
        // begins (or the proxy is gone).
        let mut stopping = *self.shared.shutdown.borrow();
        let mut stop = shutdown::ShutdownWait::new(&self.shared.shutdown);
        // Armed while something is in flight, to give up on a node that stopped
        // answering (see `watchdog`); reset only when it fires or is re-armed, not per
        // turn, and looked at only while something is in flight (one that fired
        // meanwhile is handled at the next such turn).
        let watchdog = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(watchdog);
        let mut watching = false;
        // (The lost-commit resolution is boxed: it runs rarely, and its state, several KiB,
        // would otherwise sit in every session's future.)
        loop {
            self.start_turn();
            if self.lost.has_pending() {
                Box::pin(self.resolve_lost_commit()).await?;
            }
            // Route and send what the client sent. A batch sent before its Sync (it
            // outgrew the batch limit) can leave more complete frames buffered: take
            // them too before waiting, or the server would wait for them forever.
            // (Each step only when it has something to do: a turn that relays a reply
            // has no client bytes and no units, and one that sends a unit has no output.)
            // (A unit that waited for the replies ahead of it, and goes now, also lets
            // the frames behind it be taken: they are buffered, and no readiness of the
            // client's socket will announce them again.)
            loop {
                let consumed = !self.cbuf.is_empty()
                    && (self.take_plain_read().await? || self.process_client()?);
                let waiting = self.ready.len();
                if waiting > 0 {
                    self.dispatch_ready().await?;
                }
                let dispatched = self.ready.len() < waiting;
                if !((consumed || dispatched) && self.ready.is_empty() && !self.cbuf.is_empty()) {
                    break;
                }
            }
            // Connections go back (transaction mode) before the reply that ended their
            // unit reaches the client, so the client's next statement can find them.
            self.checkin();
            if !self.out.is_empty() {
                self.flush_client().await?;
            }
            if self.terminating && self.inflight.is_empty() {
                return Ok(());
            }
            let active = self.active;
            let server = active.and_then(|n| self.backends[n].as_ref());
            let server_reading = server.is_some();
            let pending = server.map_or(0, |s| s.conn.unsent());
            // Backpressure: while the server has not taken what was queued for it, the
            // client is not read further (its replies are still relayed). While units
            // wait their turn (or the next batch waits to be read, see
            // `statements_unsettled`), the client is still read up to a bound, and after
            // Terminate only to notice it leave: a reply that never comes (after an error
            // in an extended-protocol message the server ignores everything up to a Sync,
            // Queries included) must not keep the session and its server connections
            // once the client has closed.
            let read_client = !self.terminating
                && pending < MAX_PENDING
                && (self.cbuf.len() < MAX_PENDING
                    || (self.ready.is_empty() && !self.statements_unsettled()));
            let watch_client = self.terminating;
            let idle_limit = self.idle_transaction_limit();
            if !watching && !self.inflight.is_empty() {
                let interval = self.watch_interval();
                watchdog
                    .as_mut()
                    .reset(tokio::time::Instant::now() + interval);
                watching = true;
                // The session's waker goes to the timer here, once an arming; the turns
                // after only look whether it fired (polling it each turn would hand the
                // timer the same waker again, an atomic exchange a statement). Polled
                // outside tokio's task budget: a spent budget would answer Pending without
                // handing the timer the waker, and nothing would poll it again.
                let register = std::future::poll_fn(|cx| Poll::Ready(watchdog.as_mut().poll(cx)));
                let _ = tokio::task::unconstrained(register).await;
            }
            // Polled in this order (no random start: that costs a random number per
            // turn): replies first, then what the client sends, then the timers.
            tokio::select! {
                biased;
                r = async { server.expect("guarded by server_reading").conn.stream.readable().await }, if server_reading => {
                    let node = active.unwrap_or_default();
                    if let Err(e) = r {
                        self.on_backend_lost(node, &e.to_string())?;
                    } else {
                        self.read_backend(node)?;
                    }
                }
                r = async { server.expect("guarded by pending").conn.stream.writable().await }, if pending > 0 => {
                    let node = active.unwrap_or_default();
                    let flushed = match r {
                        Ok(()) => self.backends[node].as_mut().map_or(Ok(()), |l| l.conn.flush_some()),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = flushed {
                        self.on_backend_lost(node, &e.to_string())?;
                    }
                }
                r = self.client.read_some(&mut self.cbuf), if read_client || watch_client => {
                    match r {
                        Ok(0) => {
                            if !self.cbuf.is_empty() && !self.terminating {
                                tracing::debug!("client closed the connection in the middle of a message");
                            }
                            return Ok(());
                        }
                        Ok(_) if self.terminating => self.cbuf.clear(),
                        Ok(_) => {}
                        Err(e) => return Err(ProxyError::ClientIo(e)),
                    }
                }
                () = std::future::poll_fn(|_| fired(&watchdog)), if watching && !self.inflight.is_empty() => {
                    watching = false;
                    self.check_active_node()?;
                }
                // An async block: the timer is made only when the branch is enabled
                // (select! evaluates every branch's expression, enabled or not).
                () = async { tokio::time::sleep(idle_limit.unwrap_or_default()).await }, if idle_limit.is_some() => {
                    let ms = idle_limit.unwrap_or_default().as_millis() as u64;
                    tracing::info!(user = %self.login.user.name, ms, "client idle in transaction too long; disconnected");
                    return Err(ProxyError::IdleTransactionTimeout { ms });
                }
                _ = &mut stop, if !stopping => {
                    stopping = true;
                    if self.client_idle() {
                        return Err(ProxyError::Shutdown);
                    }
                    // Finish the transaction first; checked again at the next turn.
                }
            }
            // A COMMIT lost just now is answered before anything else happens.
            if self.lost.has_pending() {
                Box::pin(self.resolve_lost_commit()).await?;
            }
            if stopping && self.client_idle() {
                self.flush_client().await?;
                return Err(ProxyError::Shutdown);
            }
        }
    }

    /// The active backend is readable: take what it sent and relay it.
    fn read_backend(&mut self, node: usize) -> Result<(), ProxyError> {
        let Some(s) = self.backends[node].as_mut() else {
            return Ok(());
        };
        crate::io::rewind(&mut s.conn.rbuf);
        if s.conn.rbuf.capacity() - s.conn.rbuf.len() < 4096 {
            s.conn.rbuf.reserve(32 * 1024);
        }
        match s.conn.stream.try_read_buf(&mut s.conn.rbuf) {
            Ok(0) => self.on_backend_lost(node, "connection closed by the server"),
            Ok(_) => self.relay(node),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => self.on_backend_lost(node, &e.to_string()),
        }
    }

    /// The active backend's connection failed while the session was reading it.
    ///
    /// An autocommit read on a replica that has not sent the client anything yet is
    /// sent again to another node (within `read_retry_budget`). A replica failing
    /// outside a transaction costs the client that statement only. Anything else —
    /// the primary, an open transaction, a COMMIT in flight — ends the session with
    /// the matching error (08007 when a COMMIT's outcome is unknown).
    fn on_backend_lost(&mut self, node: usize, reason: &str) -> Result<(), ProxyError> {
        let was_primary = self.shared.balancer.primary() == Some(node);
        let in_tx = self.tx.on_server();
        let mut client_units = self.inflight.iter().filter(|u| !u.is_injected());
        let first = client_units.next();
        let only_one = client_units.next().is_none();
        let retry = match first {
            Some(u) if only_one && !u.replied && !in_tx => u.retry.clone().map(|mut r| {
                // The client already has the acknowledgements forwarded so far.
                r.skip_acks += u.acks;
                r
            }),
            _ => None,
        };
        let budget = self.config.routing.read_retry_budget;
        let err = self.backend_lost(node, reason);
        // A commit whose ReadyForQuery waited for its position report: it committed, at
        // a position no one will tell now (its relations are primary-only for the
        // recency window).
        self.give_up_deferred_marks();
        self.release_held_ready();
        if self.inflight.iter().all(InFlight::is_injected) && !in_tx {
            // Idle (at most pgfresh's own probe was running; its marks simply stay
            // primary-only until they expire): nothing of the client's was lost. The next statement connects to whatever node
            // then holds the role it needs, with the session's state replayed. The
            // injected units go too: left in flight, they would hold every later unit
            // back, waiting for replies from a connection that no longer exists.
            self.inflight.clear();
            self.replica_guard = None;
            return Ok(());
        }
        if let Some(unit) = retry.filter(|u| u.retries < budget) {
            self.inflight.clear();
            self.wire.set_batch(None);
            self.replica_guard = None;
            self.retry_read(unit, node, reason);
            return Ok(());
        }
        if self.lost_commit(node, &err) {
            // resolve_lost_commit answers it next.
            return Ok(());
        }
        if was_primary || in_tx || self.inflight.iter().any(|u| u.commit_sent) {
            return Err(err);
        }
        // A replica failed outside a transaction: this statement fails, the session goes on.
        let owed: u32 = self
            .inflight
            .iter()
            .filter(|u| !u.is_injected())
            .map(|u| u32::from(u.owed.max(1)))
            .sum();
        self.inflight.clear();
        self.wire = WirePhase::Units;
        self.replica_guard = None;
        // Its implicit transaction failed: a setting it made is not the session's.
        self.pending_settings.abandon();
        self.out.push(err.to_client_as_error());
        for _ in 0..owed {
            self.out.push(build::ready_for_query(TxStatus::Idle));
        }
        self.tx = TxPhase::Idle;
        Ok(())
    }

    /// An autocommit read bound for a replica: if the replica fails before answering
    /// (or refuses the connection), the read may go to another node.
    fn retryable_read(
        &mut self,
        target: &crate::router::Target,
        unit: &ClientUnit,
        node: usize,
    ) -> bool {
        matches!(target, crate::router::Target::Replica { .. })
            && unit.synced
            && self.tx.is_idle()
            && Some(node) != self.balancer.primary()
    }

    /// Send `unit`, a read `node` failed, to another node next (the caller checked the
    /// retry budget).
    fn retry_read(&mut self, mut unit: Box<ClientUnit>, node: usize, reason: &str) {
        unit.retries += 1;
        unit.avoid = Some(node);
        metrics::counter!("pgfresh_read_retries_total").increment(1);
        tracing::info!(
            node,
            reason,
            "replica failed before answering: read sent to another node"
        );
        self.ready.push_front(unit);
    }

    /// Nothing of the client's is running or waiting: no transaction, no unit sent or
    /// queued (pgfresh's own injected work, such as a position probe, may still run).
    fn client_idle(&self) -> bool {
        self.tx.is_idle()
            && self.ready.is_empty()
            && self.inflight.iter().all(InFlight::is_injected)
            // A commit's ReadyForQuery waiting for its position is still the client's.
            && self.tokens.held_ready.is_none()
    }

    /// A backend connection failed. What the client gets depends on where it failed.
    fn backend_lost(&mut self, node: usize, reason: &str) -> ProxyError {
        let name = self.backends[node]
            .as_ref()
            .map(|l| l.conn.target.node_name.to_string())
            .unwrap_or_default();
        self.backends[node] = None;
        self.state.connection_gone(node);
        if self.active == Some(node) {
            self.active = None;
        }
        let committing = self.inflight.iter().any(|u| u.commit_sent);
        tracing::warn!(node = %name, reason, "server connection lost");
        if committing {
            ProxyError::CommitOutcomeUnknown { node: name }
        } else {
            ProxyError::ServerLost {
                node: name,
                reason: reason.to_string(),
            }
        }
    }

    /// From now on, what is queued for the client waits for [`Session::release_held_ready`].
    pub(super) fn hold_client_output(&mut self) {
        self.out.hold();
    }

    /// More than [`HOLD_LIMIT`] bytes held for a commit's position (a large result after
    /// a write in the same simple query): the commit's relations are marked without a
    /// position now (primary only for the TTL) and the output flows again, so holding
    /// never costs more memory than that.
    fn bound_held_output(&mut self) {
        if self.out.held() <= HOLD_LIMIT {
            return;
        }
        self.give_up_deferred_marks();
        self.out.release();
    }

    /// The relations waiting for a position probe in flight are marked without one
    /// (primary only for the TTL): its answer will not come, or will come too late.
    fn give_up_deferred_marks(&mut self) {
        for u in &mut self.inflight {
            if let Some(p) = u.probe_mut() {
                p.marks.settle(None);
            }
        }
    }

    async fn flush_client(&mut self) -> Result<(), ProxyError> {
        self.bound_held_output();
        let ready = self.out.ready();
        if ready.is_empty() {
            return Ok(());
        }
        let n = ready.len();
        self.client
            .write_all_now(ready)
            .await
            .map_err(ProxyError::ClientIo)?;
        self.out.written(n);
        // TLS keeps what the socket did not take yet until flushed (plain TCP: nothing).
        self.client.flush_tls().await.map_err(ProxyError::ClientIo)
    }

    /// Make the session's connection to `node` active, when it has one made since the
    /// node last changed role and not closed by its server meanwhile (those it drops).
    /// Says whether it had one; `attach` connects when it had not.
    fn reuse_connection(&mut self, node: usize) -> Result<bool, ProxyError> {
        if node >= self.backends.len() {
            // A node added to the config since this session started.
            self.backends.resize_with(node + 1, || None);
        }
        if self.idle_conn_closed(node) {
            // Its server closed it while another node was active (a shutdown, a
            // terminated backend): nothing was sent on it, so a new one serves the unit.
            tracing::info!(node, "server closed an idle connection; connecting again");
            self.backends[node] = None;
            self.state.connection_gone(node);
        }
        if let Some(l) = &self.backends[node] {
            if l.is_current() {
                // Already active: the cancel slot names this connection (every change
                // of `backends[node]` clears `active` or goes through `set_active`).
                if self.active != Some(node) {
                    self.set_active(node);
                }
                return Ok(true);
            }
            // The node changed role since this connection was made: do not reuse it.
            if let Some(stale) = self.backends[node].take() {
                stale.conn.close_in_background();
                self.state.connection_gone(node);
            }
            if self.active == Some(node) {
                self.active = None;
            }
            if self.tx.on_server() {
                // The transaction was on a node that changed role: fail it, never replay it.
                self.tx = TxPhase::Idle;
                self.tx_writes = TxWrites::default();
                return Err(ProxyError::RoleChanged);
            }
        }
        Ok(false)
    }

    /// Make sure the session holds a connection to `node`, and record it as the
    /// target of this client's cancel requests.
    async fn attach(&mut self, node: usize) -> Result<(), ProxyError> {
        if self.reuse_connection(node)? {
            return Ok(());
        }
        // Transaction mode: what the session holds on other nodes goes back first, so
        // sessions never wait for one node while holding another.
        self.checkin();
        if self.check_out_now(node) {
            return Ok(());
        }
        let (target, pool) = self.target(node).ok_or(ProxyError::NoPrimary(None))?;
        let before = self.listed.info.state();
        self.listed.info.set_state(ClientState::Waiting);
        let settings = self.pool_settings.clone();
        // PAUSE holds a session that holds no connection (see `crate::pause`); one that
        // began while this connection was being taken gets it back, unused.
        let leased = loop {
            if self.shared.pause.is_paused() && self.holds_no_connection() {
                let limit = Duration::from_millis(self.config.pool.query_wait_timeout_ms);
                if let Err(e) = self.wait_out_pause(limit).await {
                    self.listed.info.set_state(before);
                    return Err(e);
                }
            }
            match self.take_connection(node, &target, &pool, &settings).await {
                Ok(l) if self.shared.pause.is_paused() && self.holds_no_connection() => {
                    self.shared.pools.checkin(l, None, &settings);
                }
                taken => break taken,
            }
        };
        let leased = match leased {
            Ok(l) => l,
            Err(e) => {
                self.listed.info.set_state(before);
                return Err(e);
            }
        };
        self.listed.info.set_state(ClientState::Active);
        self.backends[node] = Some(leased);
        self.set_active(node);
        Ok(())
    }

    /// A connection to `node` that was not being read (another node was active) may have
    /// been closed by its server meanwhile: its socket is then readable. Costs no system
    /// call unless the runtime already saw it readable; then reads it: end of stream, an
    /// error, or a FATAL message mean it is gone (other messages, notices, stay buffered
    /// for the relay).
    fn idle_conn_closed(&mut self, node: usize) -> bool {
        use std::future::Future;
        if self.active == Some(node) {
            return false;
        }
        let Some(l) = self.backends.get_mut(node).and_then(Option::as_mut) else {
            return false;
        };
        let ready = {
            let readable = std::pin::pin!(l.conn.stream.readable());
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            readable.poll(&mut cx).is_ready()
        };
        if !ready {
            return false;
        }
        let before = l.conn.rbuf.len();
        match l.conn.stream.try_read_buf(&mut l.conn.rbuf) {
            Ok(0) => true,
            Ok(_) => relay::has_fatal(&l.conn.rbuf[before..]),
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }

    /// The session's connection to `node` was made before the node last changed role
    /// (`attach` replaces it).
    fn backend_stale(&self, node: usize) -> bool {
        self.backends
            .get(node)
            .and_then(Option::as_ref)
            .is_some_and(|l| !l.is_current())
    }

    fn set_active(&mut self, node: usize) {
        self.active = Some(node);
        if let Some(l) = self.backends[node].as_mut() {
            let target = l.conn.cancel_target();
            // Named already (the same connection as the last unit's): nothing to change,
            // no lock to take.
            let shown = Arc::as_ptr(target) as usize;
            if shown == self.cancel_shown {
                return;
            }
            let old = self
                .cancel_slot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .target
                .replace(target.clone());
            self.cancel_shown = shown;
            // Released outside the lock.
            drop(old);
        }
    }

    async fn release_all(&mut self) {
        let reset = self.config.pool.reset_query.clone();
        let settings = &self.pool_settings;
        for slot in self.backends.iter_mut() {
            if let Some(mut leased) = slot.take() {
                if self.active == leased.conn.target.node.into() && !self.inflight.is_empty() {
                    // Mid-query: the connection's state is unknown; close it.
                    leased.conn.tx = TxStatus::Failed;
                }
                self.shared.pools.release(leased, &reset, settings).await;
            }
        }
        self.cancel_slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .target = None;
        self.cancel_shown = 0;
        self.pin_gauge.clear();
    }

    /// Login failed after the client authenticated: tell it why and give back what
    /// the session took.
    pub async fn reject(mut self, e: ProxyError) {
        tracing::info!(user = %self.login.user.name, error = %e, "session start failed");
        let _ = self.client.write_all(&e.to_client()).await;
        let _ = self.client.flush().await;
        self.release_all().await;
    }

    /// Queue an error (and, outside a unit, ReadyForQuery) for the client.
    fn send_error(&mut self, e: &ProxyError, ready: bool) {
        self.out.push(e.to_client());
        if ready {
            self.out.push(build::ready_for_query(self.tx.status()));
        }
    }
}

/// An error that a failover under way explains: no primary known, or the primary
/// refusing connections or shutting down.
fn in_failover(err: &ProxyError) -> bool {
    match err {
        ProxyError::ServerConnect { .. } | ProxyError::NoPrimary(_) => true,
        ProxyError::ServerLogin { code, .. } => code.starts_with("57P"),
        _ => false,
    }
}

/// Ready once `timer` has fired, without handing it a waker: the session loop's watchdog,
/// given the session's waker once when armed.
fn fired(timer: &tokio::time::Sleep) -> Poll<()> {
    if timer.is_elapsed() {
        Poll::Ready(())
    } else {
        Poll::Pending
    }
}
