//! Schema changes made outside this pgfresh: DDL run directly on the primary (a migration
//! tool connected past the pooler, say) or through another pgfresh instance.
//!
//! Such a change is not seen passing by, so [`crate::schema_window`] cannot cover it: writes
//! through this pgfresh go on being expanded with the graph loaded before it, without the
//! new trigger's (rule's, function's ...) effects, until the graph is loaded again. To
//! bound that, every database in use is asked every `dependency_check_ms` for one text that
//! changes whenever a catalog row the graph is built from may have changed
//! ([`pgfresh_deps::catalog::SCHEMA_FINGERPRINT_SQL`], about a millisecond). When it differs
//! from the last one seen (the first is taken in the first load's own snapshot):
//!
//! 1. the database's schema window opens (a [`SchemaChange`] begins): writes analysed from
//!    now on, and writes analysed before but committed after, mark the whole database with
//!    their commit position, as during a change through pgfresh;
//! 2. the primary's WAL insert position is read, and the whole database is marked with it.
//!    Every write this pgfresh relayed before step 1, whatever its unknown effects, has
//!    its commit before that position, so reads go only to replicas that have replayed it
//!    (without `lsn_routing`, or when the position cannot be read: to the primary, for the
//!    TTL);
//! 3. the change ends, which schedules a reload; the window closes once a load that started
//!    after it has succeeded.
//!
//! What remains uncovered is a read made between such a write and the check that follows
//! it (at most `dependency_check_ms` plus a query later). A change through this pgfresh is
//! seen by the check too, which costs one more whole-database mark and reload, harmless.
//!
//! With `dependency_notify_channel` set, the check's connection also `LISTEN`s on that
//! channel, and a notification on it (an event trigger on `ddl_command_end` calling
//! `pg_notify`, which the operator installs) runs the check at once: the uncovered time
//! shrinks to the notification's way to pgfresh and one query.
//!
//! One connection per database is kept (as the `[monitor]` user) while the database is in
//! use (or, with a channel, once it was loaded); a database no session asked for since the
//! last check is not checked, and without a channel its connection is closed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::context::Shared;
use crate::deps::{lock, pg_error, Entry};
use crate::monitor_conn::MonitorConn;
use crate::schema_window::SchemaChange;
use pgfresh_deps::catalog::SCHEMA_FINGERPRINT_SQL;

/// How often a watcher looks at the config again while checks are off.
const OFF_RECHECK: Duration = Duration::from_secs(1);

/// A check (query and mark) that takes longer is abandoned and counted as an error.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// The watch state of one database (held by its dependency entry).
#[derive(Default)]
pub struct Watch {
    /// The last fingerprint seen (by a check, or the first load); None before the first load.
    baseline: Mutex<Option<String>>,
    /// A session asked for the database's graph since the last check.
    used: AtomicBool,
    /// The watcher task was started.
    started: AtomicBool,
    /// The check's connection, kept while the database is in use; the lock also keeps two
    /// checks of one database (the watcher's and `check_now`'s) from running at once.
    conn: tokio::sync::Mutex<Option<CheckConn>>,
    /// Woken by a notification on the listened channel.
    heard: Arc<tokio::sync::Notify>,
}

impl Watch {
    /// A session asked for the graph (the hot path: one relaxed load, a store only when
    /// the flag was down).
    pub fn used(&self) {
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }

    /// A load succeeded with `fingerprint` in its snapshot: the first one is the baseline
    /// (later ones are not: a change made outside between two checks must still be seen,
    /// however many loads learned it meanwhile).
    pub fn loaded(&self, fingerprint: String) {
        let mut baseline = lock(&self.baseline);
        if baseline.is_none() {
            *baseline = Some(fingerprint);
        }
    }
}

/// The fingerprint of the catalog, as `client` (a connection or a transaction) sees it.
pub async fn fingerprint(client: &impl tokio_postgres::GenericClient) -> Result<String, String> {
    fingerprint_of(client.query_one(SCHEMA_FINGERPRINT_SQL, &[]).await)
}

/// The fingerprint in the answer to [`SCHEMA_FINGERPRINT_SQL`].
fn fingerprint_of(
    answer: Result<tokio_postgres::Row, tokio_postgres::Error>,
) -> Result<String, String> {
    answer
        .map_err(|e| format!("schema fingerprint query: {}", pg_error(&e)))?
        .try_get("fingerprint")
        .map_err(|e| format!("schema fingerprint query: {e}"))
}

/// The check's connection: the channel it listens on ("" for none), and the fingerprint
/// query prepared on it.
pub(crate) struct CheckConn {
    conn: MonitorConn,
    channel: String,
    fingerprint: tokio_postgres::Statement,
}

/// Starts the watcher of `entry` once (after its first successful load).
pub(crate) fn start(shared: &Arc<Shared>, entry: &Arc<Entry>) {
    if entry.watch.started.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(run(Arc::downgrade(shared), entry.clone()));
}

/// What the config in force asks of a watcher this turn.
struct Turn {
    /// How long until the next check.
    pause: Duration,
    /// Checks are on (`dependency_check_ms` > 0, dependencies learned).
    on: bool,
    /// A channel is set: the connection listens on it, kept while the database is unused.
    listen: bool,
}

impl Turn {
    fn of(shared: &Shared) -> Turn {
        let config = shared.config.snapshot();
        let r = &config.routing;
        let on = r.dependency_check_ms > 0 && shared.deps.learning();
        Turn {
            pause: match r.dependency_check_ms {
                0 => OFF_RECHECK,
                ms => Duration::from_millis(ms),
            },
            on,
            listen: on && !r.dependency_notify_channel.is_empty(),
        }
    }
}

/// The watcher of one database: a check every `dependency_check_ms` while the database is
/// in use, and on every notification, until the proxy is gone.
async fn run(shared: Weak<Shared>, entry: Arc<Entry>) {
    let mut failing: Option<String> = None;
    loop {
        let Some(s) = shared.upgrade() else {
            return;
        };
        let Turn { pause, listen, .. } = Turn::of(&s);
        if listen {
            // Listening from the start, not only from the first check on.
            let mut conn = entry.watch.conn.lock().await;
            if let Err(e) = connected(&s, &entry, &mut conn).await {
                report(&entry, &mut failing, e);
            }
        }
        drop(s); // not kept alive while waiting
        let heard = tokio::select! {
            () = tokio::time::sleep(pause) => false,
            () = entry.watch.heard.notified() => true,
        };
        let Some(s) = shared.upgrade() else {
            return;
        };
        let turn = Turn::of(&s);
        let used = entry.watch.used.swap(false, Ordering::Relaxed);
        if !turn.on || !(used || heard) {
            // Nothing to check; no connection kept unless it listens.
            if !turn.listen {
                if let Some(c) = entry.watch.conn.lock().await.take() {
                    c.conn.close().await;
                }
            }
            continue;
        }
        match check(&s, &entry).await {
            Ok(_) => failing = None,
            Err(e) => {
                metrics::counter!("pgfresh_schema_checks_total", "result" => "error").increment(1);
                report(&entry, &mut failing, e);
            }
        }
    }
}

/// Logs a failed check or listen when failures start or their reason changes, not every
/// period.
fn report(entry: &Entry, failing: &mut Option<String>, e: String) {
    if failing.as_deref() != Some(e.as_str()) {
        tracing::warn!(database = %entry.db, error = %e,
            "cannot check whether the schema changed outside pgfresh; will retry");
    }
    *failing = Some(e);
}

/// One check of `entry`'s database (see the module documentation): true when the schema
/// changed since the last one.
pub(crate) async fn check(shared: &Arc<Shared>, entry: &Arc<Entry>) -> Result<bool, String> {
    let mut conn = entry.watch.conn.lock().await;
    connected(shared, entry, &mut conn).await?;
    let c = conn.as_ref().expect("connected");
    let outcome = tokio::time::timeout(CHECK_TIMEOUT, detect(shared, entry, c))
        .await
        .unwrap_or_else(|_| Err(format!("timed out after {CHECK_TIMEOUT:?}")));
    if outcome.is_err() {
        // A new connection next time (the primary may have changed, or the socket died).
        if let Some(c) = conn.take() {
            c.conn.close().await;
        }
    }
    outcome
}

/// Opens the check's connection in `conn` unless one listening on the channel in force is
/// there already.
async fn connected(
    shared: &Arc<Shared>,
    entry: &Arc<Entry>,
    conn: &mut Option<CheckConn>,
) -> Result<(), String> {
    let channel = shared
        .config
        .snapshot()
        .routing
        .dependency_notify_channel
        .clone();
    if conn.as_ref().is_some_and(|c| c.channel != channel) {
        if let Some(c) = conn.take() {
            c.conn.close().await;
        }
    }
    if conn.is_none() {
        *conn = Some(open(shared, entry, &channel).await?);
    }
    Ok(())
}

/// The check's connection to the primary, with the fingerprint query prepared, listening on
/// `channel` unless it is empty.
async fn open(
    shared: &Arc<Shared>,
    entry: &Arc<Entry>,
    channel: &str,
) -> Result<CheckConn, String> {
    const APPLICATION: &str = "pgfresh schema check";
    let conn = if channel.is_empty() {
        MonitorConn::open(shared, None, Some(&entry.db), APPLICATION).await?
    } else {
        let heard = entry.watch.heard.clone();
        MonitorConn::open_listening(shared, &entry.db, APPLICATION, heard).await?
    };
    // Prepared once: each check then runs its cached plan (planning the text costs the
    // primary more than running it). Before the LISTEN, which is then the connection's
    // last statement in `pg_stat_activity`.
    let fingerprint = match conn.client.prepare(SCHEMA_FINGERPRINT_SQL).await {
        Ok(f) => f,
        Err(e) => {
            conn.close().await;
            return Err(format!("schema fingerprint query: {}", pg_error(&e)));
        }
    };
    if !channel.is_empty() {
        let listen = format!("LISTEN \"{}\"", channel.replace('"', "\"\""));
        if let Err(e) = conn.client.batch_execute(&listen).await {
            conn.close().await;
            return Err(format!("{listen}: {}", pg_error(&e)));
        }
    }
    Ok(CheckConn {
        conn,
        channel: channel.to_string(),
        fingerprint,
    })
}

async fn detect(shared: &Arc<Shared>, entry: &Arc<Entry>, c: &CheckConn) -> Result<bool, String> {
    let client = &c.conn.client;
    let now = fingerprint_of(client.query_one(&c.fingerprint, &[]).await)?;
    {
        let mut baseline = lock(&entry.watch.baseline);
        match baseline.as_deref() {
            None => {
                *baseline = Some(now);
                return Ok(false);
            }
            Some(seen) if seen == now => {
                metrics::counter!("pgfresh_schema_checks_total", "result" => "unchanged")
                    .increment(1);
                return Ok(false);
            }
            Some(_) => {}
        }
    }
    // The window first: a write whose commit this pgfresh relays from now on is covered by
    // the window, every one before by the position read after it.
    let change: Option<SchemaChange> = shared.deps.change_of(entry);
    let position = client
        .query_one("SELECT pg_catalog.pg_current_wal_insert_lsn()::text", &[])
        .await
        .map_err(|e| pg_error(&e))
        .and_then(|row| row.try_get::<_, String>(0).map_err(|e| e.to_string()))
        .and_then(|text| text.parse::<pgfresh_lsn::Lsn>().map_err(|e| e.to_string()));
    let lsn = match position {
        Ok(lsn) => Some(lsn),
        Err(e) => {
            // Marked without a position: reads of the database stay on the primary for
            // the TTL.
            tracing::warn!(database = %entry.db, error = %e,
                "cannot read the primary's WAL position after a schema change; marking without it");
            None
        }
    };
    // As a session marks: with a position only under `lsn_routing`.
    let lsn = lsn.filter(|_| shared.config.snapshot().routing.lsn_routing);
    shared.recency.mark_database_at(&entry.db, lsn);
    *lock(&entry.watch.baseline) = Some(now);
    metrics::counter!("pgfresh_schema_checks_total", "result" => "changed").increment(1);
    let position = lsn.map_or_else(|| "none (primary only)".to_string(), |l| l.to_string());
    tracing::info!(
        database = %entry.db,
        %position,
        "the catalog changed since the last schema check (DDL made elsewhere, or through this pgfresh); \
         the whole database is marked and its dependencies reloaded"
    );
    drop(change);
    Ok(true)
}
