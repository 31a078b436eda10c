//! The per-node poll loop: one dedicated connection per node, never shared with client pools
//! (with the sessions on io_uring, a standby's fast replay polls have a second one on the
//! ring, [`crate::ring_polls`]).
//! A node with a Patroni REST endpoint is polled over HTTP instead (see [`crate::patroni`]).

use std::sync::Arc;
use std::time::Duration;

use pgfresh_lsn::Lsn;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_postgres::{Client, Row, Statement};
use tokio_util::sync::CancellationToken;

use crate::fast::{run_polls, PollSite, Polls};
use crate::patroni::PatroniPoller;
use crate::reports::{ReceiverIdent, Sender};
use crate::ring_polls::RingPolls;
use crate::settings::{MonitorSettings, NodeId, NodeSpec};
use crate::state::Sample;
use crate::timeline::TimelineHistory;
use crate::Inner;

/// Reads a timeline's history file on the primary. `pg_read_file` is revoked from PUBLIC:
/// the monitor role needs superuser or `GRANT EXECUTE ON FUNCTION pg_read_file(text)`
/// (membership in `pg_read_server_files` alone is not enough: it widens which files the
/// function may read, not who may call it).
const HISTORY_SQL: &str = "SELECT pg_read_file($1)";

/// How long after a failed history read the next one is tried.
const HISTORY_RETRY: Duration = Duration::from_secs(5);

/// One round trip that reports everything the view needs, on a primary or a standby.
///
/// The timeline (column 8): on a primary, the insert timeline, the first 8 hexadecimal
/// digits of the name of the WAL file being written (right after a promotion this is
/// already the new timeline; `pg_control_checkpoint()` would say the old one until the
/// next checkpoint). On a standby, the timeline its WAL receiver receives. A standby
/// without a running WAL receiver (no row in `pg_stat_wal_receiver`) has no direct
/// answer: PostgreSQL does not expose the replay timeline. Column 9 then gives the newer
/// of the timelines of its last restartpoint (`pg_control_checkpoint().timeline_id`) and
/// of its minimum recovery point (`pg_control_recovery().min_recovery_end_timeline`): a
/// lower bound that may trail the replay timeline until the next restartpoint. It is
/// shown, and keeps such a standby away from tokens of a newer timeline, but it never
/// decides [`crate::Ineligible::WrongTimeline`] (a standby without a receiver is out of
/// the pool as not streaming anyway, unless a pushed lag stands in for the receiver).
const POLL_SQL: &str = "\
SELECT r.rec,
       CASE WHEN r.rec THEN NULL ELSE pg_current_wal_lsn()::text END,
       pg_last_wal_replay_lsn()::text,
       pg_last_wal_receive_lsn()::text,
       CASE WHEN r.rec THEN pg_is_wal_replay_paused() ELSE false END,
       (extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()) * 1000)::float8,
       w.status::text,
       CASE WHEN r.rec THEN NULLIF(w.received_tli, 0)::int8
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8 END,
       CASE WHEN r.rec AND coalesce(w.received_tli, 0) = 0 THEN
            (SELECT greatest(c.timeline_id, NULLIF(rc.min_recovery_end_timeline, 0))::int8
             FROM pg_control_checkpoint() c, pg_control_recovery() rc) END,
       w.slot_name::text, w.conninfo, w.sender_host, w.sender_port
FROM (SELECT pg_is_in_recovery() AS rec) r
LEFT JOIN pg_stat_wal_receiver w ON true";

/// A primary's walsenders streaming physical replication, for matching them to the
/// standbys ([`crate::reports`]); with their slot, if any (a logical walsender's slot is
/// logical: left out).
const SENDERS_SQL: &str = "\
SELECT r.pid, r.application_name, s.slot_name::text
FROM pg_catalog.pg_stat_replication r
LEFT JOIN pg_catalog.pg_replication_slots s ON s.active_pid = r.pid
WHERE r.state = 'streaming' AND s.slot_type IS DISTINCT FROM 'logical'";

/// Every walsender's last report of its standby's replay, between the full polls of a
/// primary while reads wait on replay positions ([`crate::reports`]): one function call.
pub(crate) const REPORTS_SQL: &str = "\
SELECT pid, replay_lsn::text FROM pg_catalog.pg_stat_get_wal_senders() WHERE replay_lsn IS NOT NULL";

/// The fast poll between full polls while reads wait on replay positions
/// ([`crate::demand`]): one function call, no catalog access.
pub(crate) const REPLAY_SQL: &str = "SELECT pg_last_wal_replay_lsn()::text";

/// An open monitor connection with its prepared poll statements.
struct Conn {
    client: Client,
    statement: Statement,
    replay: Statement,
    senders: Statement,
    reports: Statement,
    driver: JoinHandle<()>,
    /// The login it was opened with; a settings change that alters it reconnects.
    login: Login,
    /// Encrypted (TLS negotiated with the node's `server_tls_sslmode`).
    tls: bool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Where a node's facts come from.
enum Source {
    /// SQL polls over a dedicated monitor connection (opened on demand).
    Sql(Option<Conn>),
    /// The node's Patroni REST API.
    Patroni(PatroniPoller),
}

impl Source {
    fn for_node(spec: &NodeSpec, s: &MonitorSettings) -> Source {
        match &spec.patroni_url {
            Some(url) => Source::Patroni(PatroniPoller::new(url, s)),
            None => Source::Sql(None),
        }
    }

    /// The node's facts, and, from a SQL poll of a standby, how its upstream knows it.
    async fn poll(
        &mut self,
        spec: &NodeSpec,
        s: &MonitorSettings,
    ) -> Result<(Sample, Option<ReceiverIdent>), String> {
        match self {
            Source::Sql(conn) => poll(conn, spec, s).await,
            Source::Patroni(p) => p.poll(s).await.map(|sample| (sample, None)),
        }
    }

    /// A primary's walsenders streaming physical replication; `None` where there is no
    /// SQL connection.
    async fn list_senders(&self, s: &MonitorSettings) -> Option<Result<Vec<Sender>, String>> {
        match self {
            Source::Sql(Some(conn)) => Some(list_senders(conn, s).await),
            Source::Sql(None) | Source::Patroni(_) => None,
        }
    }

    /// Each walsender's last report of its standby's replay; `None` where there is no SQL
    /// connection.
    async fn poll_reports(&self, s: &MonitorSettings) -> Option<Result<Vec<(i32, Lsn)>, String>> {
        match self {
            Source::Sql(Some(conn)) => Some(poll_reports(conn, s).await),
            Source::Sql(None) | Source::Patroni(_) => None,
        }
    }

    /// Reads the history file of `timeline` over the monitor connection; `None` where
    /// there is no SQL connection (a Patroni node, or the connection is gone).
    async fn read_history(
        &self,
        timeline: u32,
        s: &MonitorSettings,
    ) -> Option<Result<TimelineHistory, String>> {
        match self {
            Source::Sql(Some(conn)) => Some(read_history(conn, timeline, s).await),
            Source::Sql(None) | Source::Patroni(_) => None,
        }
    }

    /// A standby's replay position alone; `None` where there is no SQL connection.
    async fn poll_replay(&self, s: &MonitorSettings) -> Option<Result<Option<Lsn>, String>> {
        match self {
            Source::Sql(Some(conn)) => Some(poll_replay(conn, s).await),
            Source::Sql(None) | Source::Patroni(_) => None,
        }
    }

    /// After a failed poll: the next one starts from a new connection.
    fn reset(&mut self) {
        match self {
            Source::Sql(conn) => *conn = None,
            Source::Patroni(p) => p.reset(),
        }
    }
}

/// Polls node `id` (configured as `spec`) every period until `cancel` fires, recording each
/// outcome.
pub(crate) async fn run(inner: Arc<Inner>, id: NodeId, spec: NodeSpec, cancel: CancellationToken) {
    let mut source = Source::for_node(&spec, &inner.settings.load());
    let mut next = Instant::now();
    let mut failures = FailureLog::default();
    let mut history = HistoryFetch::default();
    // Started the first time the node answers as a standby; given up for good if a
    // window does not end in time (a ring that ended or stalls).
    let mut ring_polls: Option<RingPolls> = None;
    let mut ring_given_up = false;
    loop {
        let settings = inner.settings.load_full();
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            r = source.poll(&spec, &settings) => r,
        };
        if outcome.is_err() {
            source.reset();
        }
        let (outcome, ident) = match outcome {
            Ok((sample, ident)) => (Ok(sample), ident),
            Err(e) => (Err(e), None),
        };
        inner.reports.note_receiver(id, ident);
        match failures.observe(outcome.as_ref().map(|_| ()).map_err(String::as_str)) {
            Some(Change::Failing(e)) => {
                tracing::warn!(node = %spec.name, error = %e, "monitor cannot poll node");
            }
            Some(Change::Recovered(e)) => {
                tracing::info!(node = %spec.name, previous_error = %e, "monitor reaches node again");
            }
            None => {
                if let Err(e) = &outcome {
                    tracing::debug!(node = %spec.name, error = %e, "monitor poll failed");
                }
            }
        }
        let primary_timeline = outcome
            .as_ref()
            .ok()
            .filter(|s| !s.in_recovery)
            .and_then(|s| s.timeline);
        let standby = outcome.as_ref().is_ok_and(|s| s.in_recovery);
        inner.record(id, outcome);
        if let Some(tl) = primary_timeline.filter(|&t| history.due(t, &inner)) {
            let read = tokio::select! {
                _ = cancel.cancelled() => return,
                r = source.read_history(tl, &settings) => r,
            };
            match read {
                Some(Ok(h)) => {
                    tracing::info!(node = %spec.name, timeline = tl, history = %h.to_string().trim_end(), "timeline history read");
                    history.last_error = None;
                    inner.record_history(h);
                }
                Some(Err(e)) => {
                    if history.last_error.as_deref() != Some(e.as_str()) {
                        tracing::warn!(
                            node = %spec.name,
                            timeline = tl,
                            error = %e,
                            "cannot read the primary's timeline history (the monitor role needs \
                             superuser or EXECUTE on pg_read_file(text)); position tokens of \
                             earlier timelines are unknown until it can be read"
                        );
                    }
                    history.last_error = Some(e);
                    history.retry_at = Some(Instant::now() + HISTORY_RETRY);
                }
                None => {}
            }
        }
        let reporting = primary_timeline.is_some()
            && settings.replay_from_primary
            && !settings.replay_check_period.is_zero();
        if reporting {
            tokio::select! {
                _ = cancel.cancelled() => return,
                () = match_senders(&inner, id, &spec, &source, &settings) => {}
            }
        } else if inner.reports.forget(id) {
            tracing::info!(node = %spec.name, "standby positions are no longer read from this node's walsenders");
        }
        next = (next + settings.period()).max(Instant::now());
        if !standby && !reporting {
            // A promoted node keeps no idle fast-poll connection, unless it reports its
            // standbys' positions.
            ring_polls = None;
        } else if ring_polls.is_none() && !ring_given_up && matches!(source, Source::Sql(_)) {
            ring_polls = inner
                .ring
                .as_ref()
                .map(|r| RingPolls::start(r, &inner, id, &spec, &cancel));
        }
        let until_next = async {
            let polls = match (standby, reporting) {
                _ if settings.replay_check_period.is_zero() => None,
                (true, _) => Some(Polls::Replay),
                (false, true) => Some(Polls::Reports),
                (false, false) => None,
            };
            let Some(polls) = polls else {
                sleep_until(next).await;
                return true;
            };
            // On the sessions' ring when there is one; here if it did not run them.
            if let Some(ring) = &ring_polls {
                return ring.window(&settings, next.into_std(), polls).await;
            }
            let mut site = OnTokio(&source);
            run_polls(
                polls,
                &inner,
                id,
                &spec.name,
                &mut site,
                &settings,
                next.into_std(),
            )
            .await;
            true
        };
        let ran = tokio::select! {
            _ = cancel.cancelled() => return,
            ran = until_next => ran,
        };
        if !ran {
            tracing::warn!(node = %spec.name, "the fast replay polls did not run on the sessions' ring in time; they run on tokio from now on");
            ring_given_up = true;
            ring_polls = None;
        }
    }
}

/// The primary `id` lists its walsenders, and they are matched to the standbys again
/// ([`crate::reports`]); a primary that cannot list them keeps no map.
async fn match_senders(
    inner: &Inner,
    id: NodeId,
    spec: &NodeSpec,
    source: &Source,
    settings: &MonitorSettings,
) {
    match source.list_senders(settings).await {
        Some(Ok(senders)) => {
            if let Some(map) = inner.reports.remap(id, &spec.host, spec.port, &senders) {
                log_map(inner, &spec.name, &map);
            }
        }
        Some(Err(e)) => {
            tracing::debug!(node = %spec.name, error = %e, "cannot list the primary's walsenders");
            inner.reports.forget(id);
        }
        None => {
            inner.reports.forget(id);
        }
    }
}

/// Logs which standbys' positions the primary `name`'s walsenders now report.
fn log_map(inner: &Inner, name: &str, map: &crate::reports::SenderMap) {
    let view = inner.view.load();
    let standbys: Vec<&str> = map
        .by_pid
        .iter()
        .filter_map(|(_, node)| view.nodes.get(*node).map(|n| n.spec.name.as_str()))
        .collect();
    if standbys.is_empty() {
        tracing::info!(node = %name, "no standby is matched to the primary's walsenders: each standby's replay is polled on the standby itself");
    } else {
        tracing::info!(node = %name, standbys = %standbys.join(", "), "standby replay positions are read from the primary's walsenders while the standbys report");
    }
}

/// The fast polls on tokio, over the full polls' connection.
struct OnTokio<'a>(&'a Source);

impl PollSite for OnTokio<'_> {
    async fn sleep_until(&self, at: std::time::Instant) {
        sleep_until(Instant::from_std(at)).await;
    }

    async fn poll_replay(&mut self, s: &MonitorSettings) -> Option<Result<Option<Lsn>, String>> {
        self.0.poll_replay(s).await
    }

    async fn poll_reports(
        &mut self,
        s: &MonitorSettings,
    ) -> Option<Result<Vec<(i32, Lsn)>, String>> {
        self.0.poll_reports(s).await
    }
}

/// Reading the history of a primary's timeline: when to try again after a failure, and
/// the last error (logged once per change).
#[derive(Debug, Default)]
struct HistoryFetch {
    retry_at: Option<Instant>,
    last_error: Option<String>,
}

impl HistoryFetch {
    /// The history of `timeline` is missing and no failed read holds the next one back.
    fn due(&self, timeline: u32, inner: &Inner) -> bool {
        self.retry_at.is_none_or(|t| Instant::now() >= t) && !inner.has_history(timeline)
    }
}

async fn read_history(
    c: &Conn,
    timeline: u32,
    s: &MonitorSettings,
) -> Result<TimelineHistory, String> {
    let path = format!("pg_wal/{timeline:08X}.history");
    let row = timeout(
        s.health_timeout.max(Duration::from_millis(1)),
        c.client.query_one(HISTORY_SQL, &[&path]),
    )
    .await
    .map_err(|_| format!("reading {path} timed out after {:?}", s.health_timeout))?
    .map_err(|e| format!("reading {path} failed: {}", describe_pg_error(&e)))?;
    let text: String = row
        .try_get(0)
        .map_err(|e| format!("reading {path}: unexpected result: {e}"))?;
    TimelineHistory::parse(timeline, &text).map_err(|e| e.to_string())
}

/// A node's last poll error, so that a failure is logged once per change rather than once
/// per poll, and a recovery once.
#[derive(Debug, Default)]
struct FailureLog {
    last: Option<String>,
}

/// What [`FailureLog::observe`] says is worth a log line.
#[derive(Debug, PartialEq, Eq)]
enum Change<'a> {
    /// The node fails with a new error (it was fine, or failed differently).
    Failing(&'a str),
    /// The node answers again after this error.
    Recovered(String),
}

impl FailureLog {
    fn observe<'a>(&mut self, outcome: Result<(), &'a str>) -> Option<Change<'a>> {
        match outcome {
            Err(e) if self.last.as_deref() == Some(e) => None,
            Err(e) => {
                self.last = Some(e.to_string());
                Some(Change::Failing(e))
            }
            Ok(()) => self.last.take().map(Change::Recovered),
        }
    }
}

async fn poll(
    conn: &mut Option<Conn>,
    spec: &NodeSpec,
    s: &MonitorSettings,
) -> Result<(Sample, Option<ReceiverIdent>), String> {
    if conn
        .as_ref()
        .is_some_and(|c| !c.login.is_of(s) || c.client.is_closed())
    {
        *conn = None;
    }
    if conn.is_none() {
        *conn = Some(connect(spec, s).await?);
    }
    let Some(c) = conn.as_ref() else {
        return Err("no monitor connection".to_string());
    };
    let row = timeout(s.health_timeout, c.client.query_one(&c.statement, &[]))
        .await
        .map_err(|_| format!("poll timed out after {:?}", s.health_timeout))?
        .map_err(|e| format!("poll failed: {}", describe_pg_error(&e)))?;
    let mut sample = parse_row(&row)?;
    sample.tls = Some(c.tls);
    let ident = match sample.in_recovery {
        true => parse_ident(&row)?,
        false => None,
    };
    Ok((sample, ident))
}

/// How a standby's upstream knows it (columns 9 to 12 of [`POLL_SQL`]).
fn parse_ident(row: &Row) -> Result<Option<ReceiverIdent>, String> {
    let err = |e: tokio_postgres::Error| format!("unexpected poll result: {e}");
    let conninfo: Option<&str> = row.try_get(10).map_err(err)?;
    Ok(ReceiverIdent::from_receiver(
        row.try_get(9).map_err(err)?,
        conninfo,
        row.try_get(11).map_err(err)?,
        row.try_get(12).map_err(err)?,
    ))
}

async fn list_senders(c: &Conn, s: &MonitorSettings) -> Result<Vec<Sender>, String> {
    let rows = timeout(s.health_timeout, c.client.query(&c.senders, &[]))
        .await
        .map_err(|_| format!("listing walsenders timed out after {:?}", s.health_timeout))?
        .map_err(|e| format!("listing walsenders failed: {}", describe_pg_error(&e)))?;
    let err = |e: tokio_postgres::Error| format!("unexpected walsender list: {e}");
    let mut senders = Vec::with_capacity(rows.len());
    for r in &rows {
        // A row whose name is hidden (a monitor role without pg_read_all_stats) names no
        // one.
        let Some(app) = r.try_get::<_, Option<String>>(1).map_err(err)? else {
            continue;
        };
        senders.push(Sender {
            pid: r.try_get(0).map_err(err)?,
            app,
            slot: r.try_get(2).map_err(err)?,
        });
    }
    Ok(senders)
}

async fn poll_reports(c: &Conn, s: &MonitorSettings) -> Result<Vec<(i32, Lsn)>, String> {
    let rows = timeout(s.health_timeout, c.client.query(&c.reports, &[]))
        .await
        .map_err(|_| format!("report poll timed out after {:?}", s.health_timeout))?;
    reports_from(rows)
}

/// The reports a report poll answered: (walsender process id, replay position).
pub(crate) fn reports_from(
    rows: Result<Vec<Row>, tokio_postgres::Error>,
) -> Result<Vec<(i32, Lsn)>, String> {
    let rows = rows.map_err(|e| format!("report poll failed: {}", describe_pg_error(&e)))?;
    let err = |e: tokio_postgres::Error| format!("unexpected report poll result: {e}");
    rows.iter()
        .map(|r| {
            let pid: i32 = r.try_get(0).map_err(err)?;
            let text: &str = r.try_get(1).map_err(err)?;
            Ok((pid, text.parse::<Lsn>().map_err(|e| e.to_string())?))
        })
        .collect()
}

/// The monitor's login to `spec`.
pub(crate) fn login_config(spec: &NodeSpec, s: &MonitorSettings) -> tokio_postgres::Config {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(&spec.host)
        .port(spec.port)
        .user(&s.user)
        .password(&s.password)
        .dbname(&s.database)
        .application_name("pgfresh-monitor")
        .connect_timeout(s.connect_timeout);
    cfg
}

/// The login a monitor connection was opened with: a settings change that alters it
/// reconnects.
pub(crate) struct Login {
    user: String,
    password: String,
    database: String,
}

impl Login {
    pub(crate) fn of(s: &MonitorSettings) -> Login {
        Login {
            user: s.user.clone(),
            password: s.password.clone(),
            database: s.database.clone(),
        }
    }

    /// `s` still names this login (compared in place: a poll copies nothing).
    pub(crate) fn is_of(&self, s: &MonitorSettings) -> bool {
        self.user == s.user && self.password == s.password && self.database == s.database
    }
}

async fn connect(spec: &NodeSpec, s: &MonitorSettings) -> Result<Conn, String> {
    let mut cfg = login_config(spec, s);
    let pgfresh_nodetls::pg::Connected {
        client,
        connection,
        tls,
    } = timeout(
        s.connect_timeout,
        pgfresh_nodetls::pg::connect(&mut cfg, &spec.tls),
    )
    .await
    .map_err(|_| format!("connect timed out after {:?}", s.connect_timeout))?
    .map_err(|e| format!("connect failed: {}", describe_connect_error(&e)))?;
    let driver = tokio::spawn(async move {
        // The connection ends with an error when the server goes away; the next poll
        // notices through the client and reconnects.
        let _ = connection.await;
    });
    let prepared = async {
        let statement = prepare(&client, POLL_SQL, "the poll", s).await?;
        let replay = prepare(&client, REPLAY_SQL, "the replay poll", s).await?;
        let senders = prepare(&client, SENDERS_SQL, "the walsender list", s).await?;
        let reports = prepare(&client, REPORTS_SQL, "the standbys' reports", s).await?;
        Ok::<_, String>((statement, replay, senders, reports))
    }
    .await;
    let (statement, replay, senders, reports) = match prepared {
        Ok(p) => p,
        Err(e) => {
            driver.abort();
            return Err(e);
        }
    };
    Ok(Conn {
        client,
        statement,
        replay,
        senders,
        reports,
        driver,
        login: Login::of(s),
        tls,
    })
}

/// [`describe_pg_error`] for a connection attempt, which can also fail on its TLS files.
pub fn describe_connect_error(e: &pgfresh_nodetls::pg::ConnectError) -> String {
    match e {
        pgfresh_nodetls::pg::ConnectError::Postgres(e) => describe_pg_error(e),
        other => other.to_string(),
    }
}

/// What went wrong, in the server's own words when the server answered: its message and
/// SQLSTATE (`password authentication failed for user "x" (SQLSTATE 28P01)`); otherwise
/// the error with its causes (`error connecting to server: Connection refused (os error
/// 111)`). tokio-postgres's own `Display` says only "db error" for a server error.
pub fn describe_pg_error(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// What a monitor login to a node found: [`check_login`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginCheck {
    /// `pg_is_in_recovery()` answered true.
    pub in_recovery: bool,
    /// The server's `server_version` setting.
    pub server_version: String,
    /// The connection was encrypted.
    pub tls: bool,
}

/// Logs in to `spec` with the monitor's credentials, as the monitor does, and asks for the
/// node's role and version. The error is the text the monitor would record as the node's
/// `last_error` (the server's message and SQLSTATE, or the I/O error).
pub async fn check_login(spec: &NodeSpec, s: &MonitorSettings) -> Result<LoginCheck, String> {
    let conn = connect(spec, s).await?;
    let row = timeout(
        s.health_timeout.max(Duration::from_millis(1)),
        conn.client.query_one(
            "SELECT pg_is_in_recovery(), current_setting('server_version')",
            &[],
        ),
    )
    .await
    .map_err(|_| format!("query timed out after {:?}", s.health_timeout))?
    .map_err(|e| format!("query failed: {}", describe_pg_error(&e)))?;
    Ok(LoginCheck {
        in_recovery: row
            .try_get(0)
            .map_err(|e| format!("unexpected result: {e}"))?,
        server_version: row
            .try_get(1)
            .map_err(|e| format!("unexpected result: {e}"))?,
        tls: conn.tls,
    })
}

/// Prepares `sql` on a new monitor connection, within the health timeout.
pub(crate) async fn prepare(
    client: &Client,
    sql: &str,
    what: &str,
    s: &MonitorSettings,
) -> Result<Statement, String> {
    timeout(
        s.health_timeout.max(Duration::from_millis(1)),
        client.prepare(sql),
    )
    .await
    .map_err(|_| format!("preparing {what} timed out after {:?}", s.health_timeout))?
    .map_err(|e| format!("preparing {what} failed: {}", describe_pg_error(&e)))
}

async fn poll_replay(c: &Conn, s: &MonitorSettings) -> Result<Option<Lsn>, String> {
    let row = timeout(s.health_timeout, c.client.query_one(&c.replay, &[]))
        .await
        .map_err(|_| format!("replay poll timed out after {:?}", s.health_timeout))?;
    replay_from(row)
}

/// The position a replay poll answered.
pub(crate) fn replay_from(row: Result<Row, tokio_postgres::Error>) -> Result<Option<Lsn>, String> {
    let row = row.map_err(|e| format!("replay poll failed: {}", describe_pg_error(&e)))?;
    // Borrowed from the row: nothing is allocated per poll.
    let text: Option<&str> = row
        .try_get(0)
        .map_err(|e| format!("unexpected replay poll result: {e}"))?;
    text.map(|t| t.parse::<Lsn>().map_err(|e| e.to_string()))
        .transpose()
}

fn parse_row(row: &Row) -> Result<Sample, String> {
    let err = |e: tokio_postgres::Error| format!("unexpected poll result: {e}");
    let lsn = |i: usize| -> Result<Option<Lsn>, String> {
        let text: Option<String> = row.try_get(i).map_err(err)?;
        text.map(|t| t.parse::<Lsn>().map_err(|e| e.to_string()))
            .transpose()
    };
    let age: Option<f64> = row.try_get(5).map_err(err)?;
    let timeline: Option<i64> = row.try_get(7).map_err(err)?;
    let control_timeline: Option<i64> = row.try_get(8).map_err(err)?;
    Ok(Sample {
        in_recovery: row.try_get(0).map_err(err)?,
        current_lsn: lsn(1)?,
        replay_lsn: lsn(2)?,
        receive_lsn: lsn(3)?,
        paused: row.try_get(4).map_err(err)?,
        replay_age_ms: age.filter(|a| a.is_finite()).map(|a| a.round() as i64),
        receiver_status: row.try_get(6).map_err(err)?,
        timeline: timeline.and_then(|t| u32::try_from(t).ok()),
        control_timeline: control_timeline.and_then(|t| u32::try_from(t).ok()),
        tls: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_logged_once_per_change() {
        let mut log = FailureLog::default();
        assert_eq!(log.observe(Ok(())), None);
        let refused = "connect failed: error connecting to server: Connection refused";
        let auth = "connect failed: password authentication failed for user \"x\" (SQLSTATE 28P01)";
        assert_eq!(log.observe(Err(refused)), Some(Change::Failing(refused)));
        assert_eq!(log.observe(Err(refused)), None);
        assert_eq!(log.observe(Err(refused)), None);
        assert_eq!(log.observe(Err(auth)), Some(Change::Failing(auth)));
        assert_eq!(log.observe(Err(auth)), None);
        assert_eq!(
            log.observe(Ok(())),
            Some(Change::Recovered(auth.to_string()))
        );
        assert_eq!(log.observe(Ok(())), None);
        assert_eq!(log.observe(Err(auth)), Some(Change::Failing(auth)));
    }
}
