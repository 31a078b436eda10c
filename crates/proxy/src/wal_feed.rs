//! Writes pgfresh did not relay, learned from the primary's own WAL (`wal_feed`).
//!
//! A write made straight on the primary (a job, a migration tool past the pooler) or
//! through another pgfresh instance never passes this one, so nothing marks what it wrote
//! and a read of it here may go to a replica that has not replayed it. With `wal_feed` on,
//! each database in use has a feed: a logical-replication connection to the primary (as
//! the `[monitor]` user) with a temporary slot and the built-in `pgoutput` plugin over the
//! publication [`PUBLICATION`] (made `FOR ALL TABLES` when missing). For every committed
//! transaction the feed decodes, the relations it changed — with the ancestors of the
//! partitions among them, and what the dependency graph adds — are marked in the recency
//! map with the end of its commit record, as a commit through pgfresh is: reads of them
//! go to a replica that has replayed that position, or to the primary.
//!
//! `on` leaves a window: a read that arrives after a commit was acknowledged elsewhere
//! but before the feed decoded it (usually well under a millisecond) is routed without
//! it. `strict` closes it: a read bound for a replica first asks the feed to catch up
//! ([`Feed::caught_up`]); the feed reads the primary's WAL insert position (one query
//! serves every read waiting at that moment) and answers once it has decoded up to
//! there. While the feed is not streaming, or does not catch up within
//! `wal_feed_wait_ms`, such a read goes to the primary. The walsender decodes flushed WAL
//! only, so WAL past the last flush that no commit flushes (pages pruned by reads) holds a
//! read until the WAL writer flushes it (`wal_writer_delay`: the feed warns when it is
//! above 20 ms); a keepalive asked for (paced, one a millisecond at most after one that
//! fell short) carries how far decoding got past WAL with no commit in it.
//!
//! The feed costs the primary a walsender decoding its WAL and the proxy the decoded
//! changes (row contents included: `pgoutput` sends them; pgfresh reads only the relation
//! of each). It needs `wal_level = logical` on the primary, a free replication slot and
//! WAL sender, and a monitor role with the REPLICATION attribute (creating the
//! publication needs a superuser; an operator can create it instead). A feed that cannot
//! start or breaks logs the server's reason (once per reason) and starts again a second
//! later (backing off to ten seconds while it keeps failing), on whichever node is then
//! the primary.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use pgfresh_config::WalFeed;
use pgfresh_lsn::Lsn;
use pgfresh_sql::RelName;
use pgfresh_wire::replication::{parse_pgoutput, parse_stream, Pgoutput, StreamMessage};
use pgfresh_wire::{build, parse_backend, BackendMessage};

use crate::context::Shared;
use crate::deps::lock;
use crate::error::ProxyError;
use crate::monitor_conn::MonitorConn;
use crate::server::{ServerConn, Target};

/// The publication the feed decodes.
pub const PUBLICATION: &str = "pgfresh_feed";

/// How long a feed that is off waits before it looks again, and a feed that failed
/// before it starts again (doubled after each failure in a row, up to [`MAX_RETRY`]).
const RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(10);

/// How long after a keepalive that did not answer a waiting request the feed asks for
/// another.
const PING_PACE: Duration = Duration::from_millis(1);

/// How often the feed reports its position to the primary (so the slot releases WAL) and
/// looks at the config.
const STATUS_PERIOD: Duration = Duration::from_secs(1);

/// The feeds of the databases clients use (held in [`Shared`] as `wal_feeds`).
#[derive(Default)]
pub struct WalFeeds {
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
}

impl WalFeeds {
    /// The feed of `db`, started (idle while `wal_feed` is off) at the first call.
    pub fn feed(&self, shared: &Arc<Shared>, db: &str) -> Arc<Feed> {
        let mut feeds = lock(&self.feeds);
        if let Some(f) = feeds.get(db) {
            return f.clone();
        }
        let feed = Arc::new(Feed::new(db));
        feeds.insert(db.to_string(), feed.clone());
        tokio::spawn(run(Arc::downgrade(shared), feed.clone()));
        feed
    }

    /// Every feed started so far, by database.
    pub fn all(&self) -> Vec<Arc<Feed>> {
        let mut v: Vec<_> = lock(&self.feeds).values().cloned().collect();
        v.sort_by(|a, b| a.db.cmp(&b.db));
        v
    }
}

/// One database's feed: how far it has decoded, and the reads waiting for it.
pub struct Feed {
    pub db: String,
    streaming: AtomicBool,
    /// Times the feed began streaming.
    starts: AtomicU64,
    /// Every commit that ends at or before this position has been marked.
    position: AtomicU64,
    commits: AtomicU64,
    /// Catch-up requests made so far (see [`Feed::caught_up`]); each is a number.
    requested: AtomicU64,
    /// The last request answered: every request up to this number is caught up with.
    confirmed: tokio::sync::watch::Sender<u64>,
    /// Wakes the feed for a request.
    asked: tokio::sync::Notify,
    error: Mutex<Option<String>>,
}

impl Feed {
    fn new(db: &str) -> Feed {
        Feed {
            db: db.to_string(),
            streaming: AtomicBool::new(false),
            starts: AtomicU64::new(0),
            position: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            requested: AtomicU64::new(0),
            confirmed: tokio::sync::watch::Sender::new(0),
            asked: tokio::sync::Notify::new(),
            error: Mutex::new(None),
        }
    }

    /// The feed is connected and decoding.
    pub fn streaming(&self) -> bool {
        self.streaming.load(Ordering::Acquire)
    }

    /// Every commit ending at or before this position has been marked.
    pub fn position(&self) -> Lsn {
        Lsn(self.position.load(Ordering::Acquire))
    }

    /// Commits decoded since the proxy started.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Why the feed last failed, while it is not streaming.
    pub fn error(&self) -> Option<String> {
        lock(&self.error).clone()
    }

    /// Waits (up to `limit`) until the feed has marked every commit made before this call;
    /// false when it is not streaming or does not get there in time.
    pub async fn caught_up(&self, limit: Duration) -> bool {
        if !self.streaming() {
            return false;
        }
        let n = self.requested.fetch_add(1, Ordering::AcqRel) + 1;
        let mut confirmed = self.confirmed.subscribe();
        self.asked.notify_one();
        let answered = tokio::time::timeout(limit, confirmed.wait_for(|c| *c >= n)).await;
        matches!(answered, Ok(Ok(_)))
    }

    fn advance(&self, to: u64) {
        self.position.fetch_max(to, Ordering::AcqRel);
    }
}

/// The feed of one database, for as long as the proxy lives.
async fn run(shared: Weak<Shared>, feed: Arc<Feed>) {
    let mut failing: Option<String> = None;
    let mut pause = RETRY;
    loop {
        let Some(s) = shared.upgrade() else {
            return;
        };
        if s.config.snapshot().routing.wal_feed != WalFeed::Off {
            let starts = feed.starts.load(Ordering::Acquire);
            let result = stream(&s, &feed).await;
            feed.streaming.store(false, Ordering::Release);
            if feed.starts.load(Ordering::Acquire) != starts {
                // It streamed: a failure now is a new one, and it starts again at once.
                failing = None;
            }
            match result {
                Ok(()) => {
                    failing = None;
                    pause = RETRY;
                }
                Err(e) => {
                    metrics::counter!("pgfresh_wal_feed_errors_total").increment(1);
                    if failing.as_deref() != Some(e.as_str()) {
                        tracing::warn!(database = %feed.db, error = %e,
                            "WAL feed stopped; it starts again in a moment");
                    }
                    *lock(&feed.error) = Some(e.clone());
                    // One that keeps failing starts again less and less often.
                    pause = if failing.is_none() {
                        RETRY
                    } else {
                        (pause * 2).min(MAX_RETRY)
                    };
                    failing = Some(e);
                }
            }
            if *s.shutdown.borrow() {
                return;
            }
        } else {
            pause = RETRY;
        }
        drop(s); // not kept alive while waiting
        tokio::time::sleep(pause).await;
    }
}

/// Connects, decodes until the feed is turned off, the proxy stops (Ok) or something
/// fails (Err, with the server's reason).
async fn stream(shared: &Arc<Shared>, feed: &Feed) -> Result<(), String> {
    let primary = shared.balancer.primary().ok_or("no primary is known")?;
    let sampler =
        MonitorConn::open(shared, Some(primary), Some(&feed.db), "pgfresh wal feed").await?;
    let result = async {
        ensure_publication(&sampler.client, &feed.db).await?;
        let mut conn = replication_conn(shared, primary, &feed.db)
            .await
            .map_err(|e| e.to_string())?;
        start(&mut conn).await?;
        *lock(&feed.error) = None;
        feed.starts.fetch_add(1, Ordering::AcqRel);
        feed.streaming.store(true, Ordering::Release);
        tracing::info!(database = %feed.db, node = primary, "WAL feed streaming");
        let geometry = WalGeometry::of(&sampler.client).await?;
        if shared.config.snapshot().routing.wal_feed == WalFeed::Strict
            && geometry.writer_delay_ms > STRICT_WRITER_DELAY_MS
        {
            tracing::warn!(database = %feed.db, wal_writer_delay_ms = geometry.writer_delay_ms,
                "with wal_feed = \"strict\", a read can wait up to the primary's wal_writer_delay for WAL nothing else flushes (such as pruning by reads); set it to a few milliseconds");
        }
        Decoder::new(shared, feed)
            .run(&mut conn, &sampler.client, geometry)
            .await
    }
    .await;
    sampler.close().await;
    result
}

/// The publication exists, or is made now. One that an operator made for some tables
/// only is used, with a warning: writes to the others are not learned.
async fn ensure_publication(client: &tokio_postgres::Client, db: &str) -> Result<(), String> {
    let all_tables: Option<bool> = client
        .query_opt(
            "SELECT puballtables FROM pg_catalog.pg_publication WHERE pubname = $1",
            &[&PUBLICATION],
        )
        .await
        .map_err(|e| {
            format!(
                "looking for publication {PUBLICATION}: {}",
                crate::deps::pg_error(&e)
            )
        })?
        .map(|r| r.get(0));
    if all_tables == Some(false) {
        tracing::warn!(database = %db,
            "publication {PUBLICATION} is not FOR ALL TABLES: the WAL feed learns nothing of writes to tables outside it");
    }
    if all_tables.is_none() {
        client
            .batch_execute(&format!("CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES"))
            .await
            .map_err(|e| {
                format!(
                    "publication {PUBLICATION} does not exist and cannot be made: {}",
                    crate::deps::pg_error(&e)
                )
            })?;
        tracing::info!("made publication {PUBLICATION} FOR ALL TABLES for the WAL feed");
    }
    Ok(())
}

async fn replication_conn(
    shared: &Shared,
    node: usize,
    db: &str,
) -> Result<ServerConn, ProxyError> {
    let config = shared.config.snapshot();
    let view = shared.balancer.view();
    let n = view.node(node).ok_or(ProxyError::NoPrimary(None))?;
    let target = Target {
        node,
        node_name: n.spec.name.as_str().into(),
        host: n.spec.host.as_str().into(),
        port: n.spec.port,
        tls: n.spec.tls.clone(),
        user: config.monitor.user.as_str().into(),
        password: Some(config.monitor.password.as_str().into()),
        passthrough: None,
        database: db.into(),
    };
    drop(view);
    let timeout = Duration::from_millis(config.monitor.connect_timeout_ms);
    ServerConn::connect_replication(target, timeout, timeout * 5).await
}

/// A temporary slot, then `START_REPLICATION` from its start.
async fn start(conn: &mut ServerConn) -> Result<(), String> {
    static SLOTS: AtomicU64 = AtomicU64::new(0);
    let slot = format!(
        "pgfresh_{:016x}_{}",
        rand::random::<u64>(),
        SLOTS.fetch_add(1, Ordering::Relaxed)
    );
    let create =
        format!("CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT");
    conn.run_quiet(&create)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("creating a replication slot: {e}"))?;
    let begin = format!(
        "START_REPLICATION SLOT {slot} LOGICAL 0/0 (proto_version '1', publication_names '{PUBLICATION}')"
    );
    conn.send(&build::query(&begin))
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let frame = conn.read().await.map_err(|e| e.to_string())?;
        match parse_backend(&frame).map_err(|e| e.to_string())? {
            BackendMessage::CopyBothResponse => return Ok(()),
            BackendMessage::ErrorResponse(f) => {
                return Err(format!(
                    "starting replication: {}: {}",
                    f.code.unwrap_or("XX000"),
                    f.message.unwrap_or("error")
                ))
            }
            _ => {}
        }
    }
}

/// A sample of the primary's position under way: the last request it answers, and the
/// position.
type Sample<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = (u64, Result<u64, String>)> + Send + 'a>>;

/// A catch-up request answered once the feed has decoded up to `position`.
struct Pending {
    request: u64,
    position: u64,
}

/// What the stream has told so far: relation names by id, the open transaction's
/// relations, the catch-up requests waiting.
struct Decoder<'a> {
    shared: &'a Arc<Shared>,
    feed: &'a Feed,
    relations: HashMap<u32, RelName>,
    changed: HashSet<u32>,
    in_transaction: bool,
    pending: Vec<Pending>,
    /// A keepalive was asked for and has not come yet.
    pinged: bool,
    /// When to ask for the next keepalive while a request waits (paced: see `ping`).
    next_ping: Option<tokio::time::Instant>,
}

impl<'a> Decoder<'a> {
    fn new(shared: &'a Arc<Shared>, feed: &'a Feed) -> Self {
        Decoder {
            shared,
            feed,
            relations: HashMap::new(),
            changed: HashSet::new(),
            in_transaction: false,
            pending: Vec::new(),
            pinged: false,
            next_ping: None,
        }
    }

    async fn run(
        mut self,
        conn: &mut ServerConn,
        sampler: &tokio_postgres::Client,
        geometry: WalGeometry,
    ) -> Result<(), String> {
        let mut stop = self.shared.shutdown.clone();
        let mut status = tokio::time::interval(STATUS_PERIOD);
        let mut sample: Option<Sample<'_>> = None;
        loop {
            tokio::select! {
                frame = conn.read() => {
                    let frame = frame.map_err(|e| e.to_string())?;
                    self.on_frame(conn, &frame.raw).await?;
                }
                (request, position) = async { sample.as_mut().expect("guarded").await }, if sample.is_some() => {
                    sample = None;
                    let position = geometry.record_end(position?);
                    self.pending.push(Pending { request, position });
                    self.settle();
                    self.ping(conn).await?;
                }
                () = async { tokio::time::sleep_until(self.next_ping.expect("guarded")).await }, if self.next_ping.is_some() => {
                    self.next_ping = None;
                    self.ping(conn).await?;
                }
                () = self.feed.asked.notified(), if sample.is_none() => {
                    // Every request made so far was made before this sample is taken.
                    let request = self.feed.requested.load(Ordering::Acquire);
                    sample = Some(Box::pin(async move { (request, insert_position(sampler).await) }));
                }
                _ = status.tick() => {
                    if self.shared.config.snapshot().routing.wal_feed == WalFeed::Off {
                        return Ok(());
                    }
                    self.report(conn, false).await?;
                }
                _ = stop.changed() => return Ok(()),
            }
        }
    }

    async fn on_frame(&mut self, conn: &mut ServerConn, raw: &[u8]) -> Result<(), String> {
        let body = raw.get(5..).unwrap_or_default();
        match raw.first() {
            Some(b'd') => match parse_stream(body).map_err(|e| e.to_string())? {
                StreamMessage::XLogData { data, .. } => {
                    self.on_change(parse_pgoutput(data).map_err(|e| e.to_string())?);
                    Ok(())
                }
                StreamMessage::Keepalive { end, reply } => {
                    self.pinged = false;
                    if !self.in_transaction {
                        // Everything the server decoded before this was sent before it.
                        self.feed.advance(end);
                        self.settle();
                    }
                    if reply {
                        self.report(conn, false).await?;
                    }
                    if !self.pending.is_empty() {
                        // Not there yet: ask again a moment later (asking at once would
                        // keep both sides busy while the server is still decoding).
                        self.next_ping = Some(tokio::time::Instant::now() + PING_PACE);
                    }
                    Ok(())
                }
            },
            Some(b'E') => {
                let f = pgfresh_wire::ErrorFields::parse(b'E', body).map_err(|e| e.to_string())?;
                Err(format!(
                    "{}: {}",
                    f.code.unwrap_or("XX000"),
                    f.message.unwrap_or("error")
                ))
            }
            Some(b'c') => Err("the server ended the replication stream".into()),
            _ => Ok(()),
        }
    }

    fn on_change(&mut self, m: Pgoutput<'_>) {
        match m {
            Pgoutput::Begin { .. } => {
                self.in_transaction = true;
                self.changed.clear();
            }
            Pgoutput::Relation {
                id,
                namespace,
                name,
            } => {
                let schema = if namespace.is_empty() {
                    "pg_catalog"
                } else {
                    namespace
                };
                self.relations.insert(id, RelName::new(Some(schema), name));
            }
            Pgoutput::Change { relation } => {
                self.changed.insert(relation);
            }
            Pgoutput::Truncate { relations } => self.changed.extend(relations),
            Pgoutput::Commit { end_lsn, .. } => {
                self.in_transaction = false;
                self.commit(end_lsn);
                self.feed.advance(end_lsn);
                self.feed.commits.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("pgfresh_wal_feed_commits_total").increment(1);
                self.settle();
            }
            Pgoutput::Other(_) => {}
        }
    }

    /// Marks what a decoded commit wrote, with the end of its commit record.
    fn commit(&mut self, end_lsn: u64) {
        let mut writes: Vec<RelName> = self
            .changed
            .drain()
            .filter_map(|id| self.relations.get(&id).cloned())
            .collect();
        if writes.is_empty() {
            return;
        }
        let db = &self.feed.db;
        let config = self.shared.config.snapshot();
        let lsn = config.routing.lsn_routing.then_some(Lsn(end_lsn));
        let recency = &self.shared.recency;
        if let Some(graph) = self.shared.deps.graph(self.shared, db) {
            let mut more = Vec::new();
            if let pgfresh_deps::Expansion::WholeDatabase =
                graph.expand_writes(&writes, &[], &mut more)
            {
                recency.mark_database_at(db, lsn);
            }
            writes.extend(more);
        }
        let keys: Vec<_> = writes.iter().map(crate::router::rel_key).collect();
        recency.mark(db, &keys, lsn);
    }

    /// Answers the catch-up requests the decoded position now covers.
    fn settle(&mut self) {
        let at = self.feed.position.load(Ordering::Acquire);
        let answered = self
            .pending
            .iter()
            .filter(|p| p.position <= at)
            .map(|p| p.request)
            .max();
        self.pending.retain(|p| p.position > at);
        if let Some(n) = answered {
            self.feed.confirmed.send_if_modified(|c| {
                let newer = n > *c;
                *c = (*c).max(n);
                newer
            });
        }
    }

    /// While a request waits, asks the server for a keepalive (it carries how far the
    /// server has decoded, also past WAL with no commit in it); one at a time, and after a
    /// keepalive that was not far enough, no sooner than [`PING_PACE`] later. (Under steady
    /// writes the next decoded commit usually answers first.)
    async fn ping(&mut self, conn: &mut ServerConn) -> Result<(), String> {
        if self.pending.is_empty() || self.pinged {
            return Ok(());
        }
        self.pinged = true;
        self.report(conn, true).await
    }

    async fn report(&self, conn: &mut ServerConn, reply: bool) -> Result<(), String> {
        let at = self.feed.position.load(Ordering::Acquire);
        let update =
            pgfresh_wire::replication::standby_status(at, reply, std::time::SystemTime::now());
        conn.send(&update).await.map_err(|e| e.to_string())
    }
}

/// The primary's WAL page and segment sizes, to compare the insert position it reports with
/// the record ends the stream reports.
#[derive(Clone, Copy)]
struct WalGeometry {
    page: u64,
    segment: u64,
    /// `wal_writer_delay`, in milliseconds: how long WAL that no commit flushes may wait.
    writer_delay_ms: i64,
}

/// With `strict`, a `wal_writer_delay` above this is worth a warning.
const STRICT_WRITER_DELAY_MS: i64 = 20;

impl WalGeometry {
    async fn of(client: &tokio_postgres::Client) -> Result<WalGeometry, String> {
        let row = client
            .query_one(
                "SELECT current_setting('wal_block_size')::int8, \
                 pg_catalog.pg_size_bytes(current_setting('wal_segment_size')), \
                 (SELECT setting::int8 FROM pg_catalog.pg_settings WHERE name = 'wal_writer_delay')",
                &[],
            )
            .await
            .map_err(|e| format!("reading the WAL geometry: {}", crate::deps::pg_error(&e)))?;
        let (page, segment): (i64, i64) = (row.get(0), row.get(1));
        let writer_delay_ms: Option<i64> = row.get(2);
        match (u64::try_from(page), u64::try_from(segment)) {
            (Ok(page), Ok(segment)) if page > 0 && segment > 0 => Ok(WalGeometry {
                page,
                segment,
                writer_delay_ms: writer_delay_ms.unwrap_or(0),
            }),
            _ => Err(format!(
                "unexpected WAL geometry: page {page}, segment {segment}"
            )),
        }
    }

    /// The insert position `lsn` as the end of the record before it. PostgreSQL reports
    /// where the next record will start: at the start of a page, past the page's header
    /// (40 bytes at a segment's start, 24 elsewhere), where the stream reports the end of
    /// the last record as the page's start. Any other position is both.
    fn record_end(self, lsn: u64) -> u64 {
        const LONG_HEADER: u64 = 40;
        const SHORT_HEADER: u64 = 24;
        if lsn % self.segment == LONG_HEADER {
            lsn - LONG_HEADER
        } else if lsn % self.page == SHORT_HEADER {
            lsn - SHORT_HEADER
        } else {
            lsn
        }
    }
}

/// The primary's WAL insert position: every commit acknowledged before it was read ends
/// at or before it (also an asynchronous one, whose record may not be flushed yet).
async fn insert_position(client: &tokio_postgres::Client) -> Result<u64, String> {
    let row = client
        .query_one("SELECT pg_catalog.pg_current_wal_insert_lsn()::text", &[])
        .await
        .map_err(|e| {
            format!(
                "reading the primary's WAL position: {}",
                crate::deps::pg_error(&e)
            )
        })?;
    let text: String = row.get(0);
    text.parse::<Lsn>()
        .map(|l| l.0)
        .map_err(|e| format!("the primary's WAL position {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::WalGeometry;

    #[test]
    fn an_insert_position_past_a_page_header_is_the_end_of_the_record_before() {
        let g = WalGeometry {
            page: 8192,
            segment: 16 * 1024 * 1024,
            writer_delay_ms: 200,
        };
        // Past a segment's long header, past a page's short header: the page's start.
        assert_eq!(g.record_end(3 * g.segment + 40), 3 * g.segment);
        assert_eq!(
            g.record_end(3 * g.segment + 5 * 8192 + 24),
            3 * g.segment + 5 * 8192
        );
        // Anywhere else, itself (a record may end 16 bytes past a short header).
        for lsn in [
            8192 + 40,
            8192 + 100,
            3 * g.segment,
            3 * g.segment + 8192 * 2 + 48,
        ] {
            assert_eq!(g.record_end(lsn), lsn, "{lsn}");
        }
    }
}
