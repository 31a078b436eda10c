//! Server connection pools, one per (node, server user, database).
//!
//! In session mode a client session holds a connection to each node it uses and gives
//! it back, reset, when it ends. In transaction mode it takes one for each unit of work
//! and checks it in ([`Pools::checkin`]) as soon as its transaction is over, clean
//! (nothing to reset: the session's state is compared and replayed by content).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use foldhash::fast::RandomState;
use std::time::{Duration, Instant};

use pgfresh_config::PoolMode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ProxyError;
use crate::server::{ServerConn, Target};
use crate::session::state::{needs_replay, SettingsList};

mod wait;
use wait::{Waited, Waits};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PoolKey {
    node: usize,
    host: Arc<str>,
    port: u16,
    user: Arc<str>,
    database: Arc<str>,
}

/// Timeouts and sizes read from the config snapshot each time a connection is taken.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub mode: PoolMode,
    pub pool_size: usize,
    /// How long to wait for a free connection: `acquire_timeout_ms` in session mode,
    /// `query_wait_timeout_ms` in transaction mode.
    pub acquire_timeout: Duration,
    pub connect_timeout: Duration,
    pub login_timeout: Duration,
    pub idle_timeout: Duration,
    /// `server_lifetime_ms`: older connections are closed instead of lent again.
    pub lifetime: Duration,
}

impl PoolSettings {
    /// `conn` has been open longer than `server_lifetime_ms` at `now`.
    fn past_lifetime(&self, conn: &ServerConn, now: Instant) -> bool {
        !self.lifetime.is_zero() && now.saturating_duration_since(conn.opened) > self.lifetime
    }
}

struct Idle {
    /// Boxed: a connection moves between the pool and a session at every unit in
    /// transaction mode, and a pointer moves for less than the whole connection.
    conn: Box<ServerConn>,
    since: Instant,
    /// When `idle_timeout_ms` or `server_lifetime_ms` (as they were when it came back)
    /// ends its stay, and which, so that lending it compares two instants and nothing
    /// more. A reload that shortens either is applied by [`Pools::close_expired`]
    /// within a second.
    expires: Option<(Instant, CloseReason)>,
}

impl Idle {
    fn new(conn: Box<ServerConn>, s: &PoolSettings, now: Instant) -> Self {
        let expires = expiry_of(now, conn.opened, s);
        Idle {
            conn,
            since: now,
            expires,
        }
    }

    /// Why this pooled connection is not to be lent for `target` at `now` (with the
    /// node at `generation`), if it is not.
    fn unfit(&mut self, target: &Target, generation: u64, now: Instant) -> Option<Unfit> {
        if let Some((_, why)) = self.expires.filter(|(at, _)| now > *at) {
            return Some(Unfit::Expired(why));
        }
        if self.conn.generation != generation || self.conn.target.tls != target.tls {
            return Some(Unfit::Stale);
        }
        (!self.conn.still_open()).then_some(Unfit::ClosedByServer)
    }

    /// Why this pooled connection is to be closed at `now` rather than lent, by the
    /// settings `s` in force now (the sweep; lending uses `expires`, set on return).
    fn expiry(&self, s: &PoolSettings, now: Instant) -> Option<CloseReason> {
        expiry_of(self.since, self.conn.opened, s)
            .filter(|(at, _)| now > *at)
            .map(|(_, why)| why)
    }
}

/// When a connection opened at `opened` and pooled at `now` is to be closed rather than
/// lent, and why: the earlier of the end of its `idle_timeout_ms` and of its
/// `server_lifetime_ms` (`0`: never).
fn expiry_of(now: Instant, opened: Instant, s: &PoolSettings) -> Option<(Instant, CloseReason)> {
    let end = |from: Instant, d: Duration| (!d.is_zero()).then(|| from.checked_add(d)).flatten();
    let idle = end(now, s.idle_timeout).map(|t| (t, CloseReason::IdleTimeout));
    let life = end(opened, s.lifetime).map(|t| (t, CloseReason::Lifetime));
    match (idle, life) {
        (Some(a), Some(b)) => Some(if b.0 <= a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Why a pooled connection is not lent (see [`Idle::unfit`]).
enum Unfit {
    /// Past `idle_timeout_ms` or `server_lifetime_ms`.
    Expired(CloseReason),
    /// Made before its node changed role, or with other `server_tls_*` settings than
    /// the node has now.
    Stale,
    /// Its server closed it meanwhile (restart, `pg_terminate_backend`, a timeout on
    /// the server): replaced.
    ClosedByServer,
}

impl Unfit {
    fn dispose(self, conn: Box<ServerConn>, target: &Target) {
        match self {
            Unfit::Expired(why) => return why.close(conn),
            Unfit::Stale => {}
            Unfit::ClosedByServer => {
                metrics::counter!("pgfresh_server_connections_replaced_total", "node" => target.node_name.to_string()).increment(1);
                tracing::info!(node = %target.node_name, "a pooled server connection was closed by the server; replaced");
            }
        }
        conn.close_in_background();
    }
}

/// Why pgfresh closes a server connection it could otherwise pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CloseReason {
    /// Idle in the pool longer than `idle_timeout_ms`.
    IdleTimeout,
    /// Open longer than `server_lifetime_ms`.
    Lifetime,
    /// The console's PAUSE (see [`crate::pause`]).
    Pause,
}

impl CloseReason {
    fn as_str(self) -> &'static str {
        match self {
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::Lifetime => "lifetime",
            CloseReason::Pause => "pause",
        }
    }

    /// Closes `conn`, counted in `pgfresh_server_connections_closed_total`.
    fn close(self, conn: Box<ServerConn>) {
        metrics::counter!(
            "pgfresh_server_connections_closed_total",
            "node" => conn.target.node_name.to_string(),
            "reason" => self.as_str()
        )
        .increment(1);
        conn.close_in_background();
    }
}

/// One pool's connections and the clients waiting for one.
struct Pool {
    /// The connections, idle and lent, under one lock: lending one and taking it back
    /// each lock once.
    conns: Mutex<Conns>,
    slots: Arc<Semaphore>,
    /// Its node's generation (see [`Pools::invalidate_node`]), shared with the pools of
    /// the same node, read without a lock.
    generation: Arc<AtomicU64>,
    /// The waits in progress, with their deadlines (also `cl_waiting`, `maxwait`).
    waiting: Arc<Waits>,
    /// Connections ever lent (for `sv_used`-style accounting and SHOW POOLS).
    lent_total: AtomicU64,
    /// Connections now lent out and running a unit or held by a session.
    lent: AtomicUsize,
    /// Transaction mode: the ParameterStatus set a login with these settings got, so
    /// the next login with the same settings needs no connection (newest last).
    logins: Mutex<Vec<(SettingsList, LoginParams)>>,
    /// `pgfresh_pool_wait_seconds` for this pool's mode, looked up once.
    wait_seconds: std::sync::OnceLock<metrics::Histogram>,
}

/// A pool's connections: those waiting in it, and a record of each one lent out (for
/// SHOW SERVERS) in reused slots, which its lease knows.
#[derive(Default)]
struct Conns {
    /// The most recently returned last, lent first.
    idle: Vec<Idle>,
    lent: Vec<Option<LentConn>>,
    free: Vec<usize>,
}

impl Conns {
    fn lend(&mut self, record: LentConn) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.lent[i] = Some(record);
                i
            }
            None => {
                self.lent.push(Some(record));
                self.lent.len() - 1
            }
        }
    }

    fn returned(&mut self, slot: usize) {
        self.lent[slot] = None;
        self.free.push(slot);
    }
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait_seconds(&self, mode: PoolMode) -> &metrics::Histogram {
        self.wait_seconds.get_or_init(
            || metrics::histogram!("pgfresh_pool_wait_seconds", "mode" => mode.as_str()),
        )
    }
}

/// The ParameterStatus values a login reports to its client.
pub type LoginParams = Arc<Vec<(String, String)>>;

/// How many distinct login settings a pool remembers.
const MAX_LOGINS: usize = 64;

/// A lent connection, as SHOW SERVERS shows it.
#[derive(Clone, Debug)]
struct LentConn {
    pid: i32,
    connected_at: std::time::SystemTime,
    tls: bool,
    since: Instant,
}

impl LentConn {
    fn of(conn: &ServerConn, since: Instant) -> Self {
        LentConn {
            pid: conn.key.pid,
            connected_at: conn.connected_at,
            tls: conn.stream.is_tls(),
            since,
        }
    }
}

/// One server connection, for SHOW SERVERS.
#[derive(Clone, Debug)]
pub struct ServerRow {
    pub node: usize,
    pub user: String,
    pub database: String,
    pub host: String,
    pub port: u16,
    /// `active` (lent to a client) or `idle` (in the pool).
    pub state: &'static str,
    pub pid: i32,
    pub connected_at: std::time::SystemTime,
    /// Encrypted (`server_tls_sslmode`).
    pub tls: bool,
    /// How long it has been in that state.
    pub for_: Duration,
    /// Prepared statements pgfresh keeps on it (idle connections; transaction mode).
    pub prepared: Option<usize>,
}

/// All pools, plus a per-node generation counter bumped when a node changes role,
/// so connections made before the change are closed instead of reused.
#[derive(Default)]
pub struct Pools {
    pools: Mutex<HashMap<PoolKey, Arc<Pool>, RandomState>>,
    /// Generation per node index (grown when a node is added), each shared with the
    /// node's pools.
    generations: RwLock<Vec<Arc<AtomicU64>>>,
}

/// A server connection lent to one client session.
pub struct Leased {
    /// Boxed, as in the idle list.
    pub conn: Box<ServerConn>,
    permit: OwnedSemaphorePermit,
    lent: Lent,
}

/// A handle on one pool (see [`Pools::pool_ref`]).
#[derive(Clone)]
pub struct PoolRef(Arc<Pool>);

impl PoolRef {
    /// Its node's generation now (see [`Pools::invalidate_node`]).
    pub fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }
}

/// Counts a lease in its pool while it lasts, with its record's slot there (or
/// [`RETURNED`] once the record is gone).
struct Lent {
    pool: Arc<Pool>,
    slot: usize,
}

/// A lease whose record was removed with its connection's return to the idle list.
const RETURNED: usize = usize::MAX;

impl Drop for Lent {
    fn drop(&mut self) {
        if self.slot != RETURNED {
            self.pool.lock().returned(self.slot);
        }
        // Sequentially consistent with the pause flag (see `crate::pause::Pause`).
        self.pool.lent.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One pool's figures, for SHOW POOLS, `/v1/status` and metrics.
#[derive(Clone, Debug, Default)]
pub struct PoolCounts {
    pub node: usize,
    pub user: String,
    pub database: String,
    /// Open connections waiting in the pool.
    pub idle: usize,
    /// Connections lent out now.
    pub lent: usize,
    /// Clients waiting for a connection now.
    pub waiting: usize,
    /// How long the oldest waiting client has waited.
    pub max_wait: Duration,
    /// Slots neither lent nor waiting for a permit holder (may still be opened).
    pub free: usize,
    pub lent_total: u64,
}

impl Pools {
    /// The current generation of a node.
    pub fn generation(&self, node: usize) -> u64 {
        let g = self.generations.read().unwrap_or_else(|p| p.into_inner());
        g.get(node).map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// The generation counter of `node`, made if new (shared with its pools).
    fn node_generation(&self, node: usize) -> Arc<AtomicU64> {
        if let Some(g) = self
            .generations
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
        {
            return g.clone();
        }
        let mut g = self.generations.write().unwrap_or_else(|p| p.into_inner());
        if g.len() <= node {
            g.resize_with(node + 1, Arc::default);
        }
        g[node].clone()
    }

    /// Mark every connection to `node` as stale (role change, removal). Idle ones are
    /// dropped now; leased ones are dropped by their session at its next statement.
    pub fn invalidate_node(&self, node: usize) {
        self.node_generation(node).fetch_add(1, Ordering::AcqRel);
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        for (key, pool) in pools.iter() {
            if key.node == node {
                pool.lock().idle.clear();
                pool.logins
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
            }
        }
    }

    /// The pool `target` belongs to (made with `size` slots if new), for
    /// [`Pools::permit`] and [`Pools::take_idle`]: a session keeps it with the target,
    /// so a unit does not look the pool up again.
    pub fn pool_ref(&self, target: &Target, size: usize) -> PoolRef {
        PoolRef(self.pool(target, size))
    }

    fn pool(&self, target: &Target, size: usize) -> Arc<Pool> {
        let key = PoolKey {
            node: target.node,
            host: target.host.clone(),
            port: target.port,
            user: target.user.clone(),
            database: target.database.clone(),
        };
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.get(&key) {
            return p.clone();
        }
        let pool = Arc::new(Pool {
            conns: Mutex::default(),
            slots: Arc::new(Semaphore::new(size)),
            generation: self.node_generation(target.node),
            waiting: Arc::default(),
            lent_total: AtomicU64::new(0),
            lent: AtomicUsize::new(0),
            logins: Mutex::new(Vec::new()),
            wait_seconds: Default::default(),
        });
        pools.insert(key, pool.clone());
        pool
    }

    /// A slot in `pool`: at once if one is free, else in arrival order (the semaphore
    /// is fair) up to the acquire timeout. Only a wait (none was free) is recorded in
    /// `pgfresh_pool_wait_seconds`. Holding the slot entitles the holder to one
    /// connection ([`Pools::take_idle`], [`Pools::connect`]).
    pub async fn permit(
        &self,
        pool: &PoolRef,
        target: &Target,
        s: &PoolSettings,
    ) -> Result<OwnedSemaphorePermit, ProxyError> {
        if let Some(p) = self.try_permit(pool) {
            return Ok(p);
        }
        let pool = &pool.0;
        let start = tokio::time::Instant::now();
        let got = pool
            .waiting
            .wait(&pool.slots, start, s.acquire_timeout)
            .await;
        pool.wait_seconds(s.mode)
            .record(start.elapsed().as_secs_f64());
        match got {
            Waited::Got(p) => Ok(p),
            Waited::Closed => Err(ProxyError::Shutdown),
            Waited::TimedOut => {
                metrics::counter!("pgfresh_pool_wait_timeouts_total", "node" => target.node_name.to_string())
                    .increment(1);
                Err(match s.mode {
                    PoolMode::Session => ProxyError::PoolTimeout {
                        node: target.node_name.to_string(),
                    },
                    PoolMode::Transaction => ProxyError::QueryWaitTimeout {
                        node: target.node_name.to_string(),
                        waited_ms: s.acquire_timeout.as_millis() as u64,
                        pool_size: s.pool_size,
                    },
                })
            }
        }
    }

    /// A slot of `pool` free now, without waiting (none while sessions wait in its queue:
    /// a released slot goes to the first of them).
    pub fn try_permit(&self, pool: &PoolRef) -> Option<OwnedSemaphorePermit> {
        pool.0.slots.clone().try_acquire_owned().ok()
    }

    /// With a slot held ([`Pools::permit`]): a pooled connection fit to lend, or the
    /// slot back when there is none (then [`Pools::connect`] opens one). A pooled
    /// connection past its time, made before its node changed role or with other
    /// `server_tls_*` settings, or closed by its server meanwhile (restart,
    /// `pg_terminate_backend`, idle timeout on the server) is noticed here, before
    /// anything is sent on it, and closed. Talks to no node: it needs no watching.
    pub fn take_idle(
        &self,
        pool: &PoolRef,
        target: &Target,
        permit: OwnedSemaphorePermit,
    ) -> Result<Leased, OwnedSemaphorePermit> {
        let pool = &pool.0;
        let generation = pool.generation.load(Ordering::Acquire);
        // Taken and returned at every unit in transaction mode: one clock read a turn
        // of the ring serves them all.
        let now = pgfresh_ring::turn_now();
        let mut unfit = Vec::new();
        let taken = {
            let mut conns = pool.lock();
            loop {
                let Some(mut idle) = conns.idle.pop() else {
                    break None;
                };
                match idle.unfit(target, generation, now) {
                    None => {
                        let slot = conns.lend(LentConn::of(&idle.conn, now));
                        break Some((idle.conn, slot));
                    }
                    Some(why) => unfit.push((idle.conn, why)),
                }
            }
        };
        for (conn, why) in unfit {
            why.dispose(conn, target);
        }
        match taken {
            Some((conn, slot)) => Ok(Leased::new(pool, conn, permit, slot)),
            None => Err(permit),
        }
    }

    /// With a slot held and no pooled connection fit to lend: open a new one.
    pub async fn connect(
        &self,
        pool: &PoolRef,
        target: &Target,
        startup_params: &[(String, String)],
        s: &PoolSettings,
        permit: OwnedSemaphorePermit,
    ) -> Result<Leased, ProxyError> {
        let pool = &pool.0;
        let generation = pool.generation.load(Ordering::Acquire);
        // Boxed: connecting is rare once the pool is warm, and its state (2 KiB) would
        // otherwise sit in every session's future.
        let conn = Box::pin(ServerConn::connect(
            target.clone(),
            startup_params,
            s.connect_timeout,
            s.login_timeout,
            generation,
        ))
        .await?;
        metrics::counter!("pgfresh_server_connections_opened_total", "node" => target.node_name.to_string()).increment(1);
        let slot = pool.lock().lend(LentConn::of(&conn, Instant::now()));
        Ok(Leased::new(pool, Box::new(conn), permit, slot))
    }

    /// Transaction mode: give a connection back at the end of a unit of work. Only a
    /// connection that is idle, current and owes nothing is kept; `cleanup` (messages
    /// ending in a Sync that drop what the client left behind, its SQL-level prepared
    /// statements) runs first.
    pub fn checkin(&self, mut leased: Leased, cleanup: Option<Vec<u8>>, s: &PoolSettings) {
        let reusable = leased.is_current()
            && leased.conn.tx == pgfresh_wire::TxStatus::Idle
            && leased.conn.unsent() == 0
            && leased.conn.rbuf.is_empty();
        if !reusable {
            leased.conn.close_in_background();
            return;
        }
        match cleanup {
            None => leased.return_idle(s),
            Some(frames) => {
                let s = s.clone();
                crate::server::spawn_on(leased.conn.home(), async move {
                    if matches!(leased.conn.run_frames_quiet(&frames).await, Ok(Ok(())))
                        && leased.conn.tx == pgfresh_wire::TxStatus::Idle
                    {
                        leased.conn.forget_sql_prepared();
                        leased.return_idle(&s);
                    } else {
                        leased.conn.terminate().await;
                    }
                });
            }
        }
    }

    /// Give a connection back after the session is done with it. It is reset first;
    /// a connection that is not idle, is stale, fails the reset, or is older than
    /// `server_lifetime_ms` is closed instead.
    pub async fn release(&self, mut leased: Leased, reset_query: &str, s: &PoolSettings) {
        if s.past_lifetime(&leased.conn, Instant::now()) {
            let Leased { conn, .. } = leased;
            return CloseReason::Lifetime.close(conn);
        }
        let reusable = leased.is_current()
            && leased.conn.tx == pgfresh_wire::TxStatus::Idle
            && leased.conn.unsent() == 0
            && (reset_query.is_empty()
                || matches!(leased.conn.run_quiet(reset_query).await, Ok(Ok(()))));
        if reusable {
            // Only DISCARD ALL is known to bring the connection back to its login defaults;
            // after anything else its settings are unknown and replayed before use.
            let reset = reset_query.to_ascii_uppercase().contains("DISCARD ALL");
            leased.conn.forget_session_state(reset);
            leased.return_idle(s);
        } else {
            leased.conn.terminate().await;
        }
    }

    /// Closes the pooled connections idle longer than `idle_timeout_ms` or open longer
    /// than `server_lifetime_ms` (run every second, with the settings in force now).
    /// Taking a connection checks the same of the one it takes, but the pool lends its
    /// most recently returned connection first: without this, those under it would stay
    /// open as long as the pool is busy.
    pub fn close_expired(&self, s: &PoolSettings) {
        let now = Instant::now();
        for pool in self.all() {
            let expired: Vec<(Box<ServerConn>, CloseReason)> = {
                let mut conns = pool.lock();
                if conns.idle.iter().all(|i| i.expiry(s, now).is_none()) {
                    continue;
                }
                // In their order: the most recently returned stays last, lent first.
                let mut kept = Vec::with_capacity(conns.idle.len());
                let mut expired = Vec::new();
                for i in conns.idle.drain(..) {
                    match i.expiry(s, now) {
                        Some(why) => expired.push((i.conn, why)),
                        None => kept.push(i),
                    }
                }
                conns.idle = kept;
                expired
            };
            for (conn, why) in expired {
                why.close(conn);
            }
        }
    }

    /// Server connections lent out now, in every pool.
    pub fn lent_now(&self) -> usize {
        self.all()
            .iter()
            .map(|p| p.lent.load(Ordering::SeqCst))
            .sum()
    }

    /// Closes every pooled (idle) connection; returns how many (PAUSE).
    pub fn close_idle(&self) -> usize {
        let mut closed = 0;
        for pool in self.all() {
            let idle = std::mem::take(&mut pool.lock().idle);
            closed += idle.len();
            for i in idle {
                CloseReason::Pause.close(i.conn);
            }
        }
        closed
    }

    /// Every pool, taken out of the map's lock.
    fn all(&self) -> Vec<Arc<Pool>> {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Transaction mode: what a login with `settings` reported last time on this pool.
    pub fn login_params(
        &self,
        target: &Target,
        size: usize,
        settings: &SettingsList,
    ) -> Option<LoginParams> {
        let pool = self.pool(target, size);
        let logins = pool.logins.lock().unwrap_or_else(|p| p.into_inner());
        logins
            .iter()
            .rev()
            .find(|(s, _)| !needs_replay(Some(s), settings))
            .map(|(_, p)| p.clone())
    }

    /// Remember what a login with `settings` reported.
    pub fn remember_login_params(
        &self,
        target: &Target,
        size: usize,
        settings: &SettingsList,
        params: LoginParams,
    ) {
        let pool = self.pool(target, size);
        let mut logins = pool.logins.lock().unwrap_or_else(|p| p.into_inner());
        logins.retain(|(s, _)| needs_replay(Some(s), settings));
        if logins.len() >= MAX_LOGINS {
            logins.remove(0);
        }
        logins.push((settings.clone(), params));
    }

    /// Every server connection, lent or idle.
    pub fn servers(&self) -> Vec<ServerRow> {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows = Vec::new();
        for (k, p) in pools.iter() {
            let row = |state, pid, connected_at, tls, for_, prepared| ServerRow {
                node: k.node,
                user: k.user.to_string(),
                database: k.database.to_string(),
                host: k.host.to_string(),
                port: k.port,
                state,
                pid,
                connected_at,
                tls,
                for_,
                prepared,
            };
            let conns = p.lock();
            for l in conns.lent.iter().flatten() {
                rows.push(row(
                    "active",
                    l.pid,
                    l.connected_at,
                    l.tls,
                    l.since.elapsed(),
                    None,
                ));
            }
            for i in conns.idle.iter() {
                rows.push(row(
                    "idle",
                    i.conn.key.pid,
                    i.conn.connected_at,
                    i.conn.stream.is_tls(),
                    i.since.elapsed(),
                    Some(i.conn.statements.len()),
                ));
            }
        }
        rows.sort_by(|a, b| {
            (a.node, &a.user, &a.database, a.pid).cmp(&(b.node, &b.user, &b.database, b.pid))
        });
        rows
    }

    /// Every pool's figures.
    pub fn counts(&self) -> Vec<PoolCounts> {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .iter()
            .map(|(k, p)| {
                let idle = p.lock().idle.len();
                let (waiting, max_wait) = p.waiting.count();
                PoolCounts {
                    node: k.node,
                    user: k.user.to_string(),
                    database: k.database.to_string(),
                    idle,
                    lent: p.lent.load(Ordering::Relaxed),
                    waiting,
                    max_wait,
                    free: p.slots.available_permits(),
                    lent_total: p.lent_total.load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}

impl Leased {
    /// Made since its node last changed role (see [`Pools::invalidate_node`]); read
    /// from its pool without a lock.
    pub fn is_current(&self) -> bool {
        self.conn.generation == self.lent.pool.generation.load(Ordering::Acquire)
    }

    fn new(
        pool: &Arc<Pool>,
        conn: Box<ServerConn>,
        permit: OwnedSemaphorePermit,
        slot: usize,
    ) -> Self {
        // Sequentially consistent with the pause flag (see `crate::pause::Pause`).
        pool.lent.fetch_add(1, Ordering::SeqCst);
        pool.lent_total.fetch_add(1, Ordering::Relaxed);
        Leased {
            conn,
            permit,
            lent: Lent {
                pool: pool.clone(),
                slot,
            },
        }
    }

    /// Into the pool's idle list, its lease record gone under the same lock.
    fn return_idle(self, s: &PoolSettings) {
        let Leased {
            conn,
            permit,
            mut lent,
        } = self;
        let idle = Idle::new(conn, s, pgfresh_ring::turn_now());
        {
            let mut conns = lent.pool.lock();
            conns.idle.push(idle);
            conns.returned(lent.slot);
        }
        lent.slot = RETURNED;
        // The slot is freed after the connection is in the idle list, so the next waiter
        // finds it there.
        drop(permit);
        drop(lent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(idle_ms: u64, lifetime_ms: u64) -> PoolSettings {
        PoolSettings {
            mode: PoolMode::Transaction,
            pool_size: 1,
            acquire_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            login_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_millis(idle_ms),
            lifetime: Duration::from_millis(lifetime_ms),
        }
    }

    #[test]
    fn a_pooled_connection_expires_at_the_earlier_of_its_two_limits() {
        let opened = Instant::now();
        let now = opened + Duration::from_secs(50);
        // The lifetime ends first: 60 s after opening, before 50 s + 20 s idle.
        assert_eq!(
            expiry_of(now, opened, &settings(20_000, 60_000)),
            Some((opened + Duration::from_secs(60), CloseReason::Lifetime))
        );
        assert_eq!(
            expiry_of(now, opened, &settings(5_000, 60_000)),
            Some((now + Duration::from_secs(5), CloseReason::IdleTimeout))
        );
        // Zero is never.
        assert_eq!(
            expiry_of(now, opened, &settings(0, 60_000)),
            Some((opened + Duration::from_secs(60), CloseReason::Lifetime))
        );
        assert_eq!(
            expiry_of(now, opened, &settings(5_000, 0)),
            Some((now + Duration::from_secs(5), CloseReason::IdleTimeout))
        );
        assert_eq!(expiry_of(now, opened, &settings(0, 0)), None);
    }

    #[test]
    fn the_longest_limits_the_config_allows_do_not_overflow() {
        let now = Instant::now();
        let far = now + Duration::from_secs(86_400 * 365 * 100);
        let e = expiry_of(now, now, &settings(u64::MAX, u64::MAX));
        assert!(e.is_none_or(|(at, _)| at > far), "{e:?}");
    }
}
