//! Commits whose acknowledgement was lost (`[routing] resolve_lost_commits`).
//!
//! When the option is on, a unit that is only a COMMIT of an explicit transaction on the
//! primary is preceded, in the same write, by an injected `SELECT
//! txid_current_if_assigned()` whose answer (the transaction's id, or NULL when it wrote
//! nothing) is swallowed like the position probe's. If the connection to the primary is
//! lost after that COMMIT was sent, the session does not answer 08007 at once: it stops
//! (nothing else of the session runs meanwhile), asks the primary `txid_status(id)` on a
//! connection of its own as the `[monitor]` user, and answers the client with the real
//! outcome, within `client_login_timeout_ms`:
//!
//! | what pgfresh learns | client gets | session |
//! |---|---|---|
//! | `committed` (or the COMMIT's own CommandComplete had arrived) | `COMMIT` + ReadyForQuery idle, writes marked first | goes on |
//! | no id (NULL: the transaction wrote nothing) | `COMMIT` + ReadyForQuery idle | goes on |
//! | `aborted` | ERROR `40000` transaction_rollback + ReadyForQuery idle | goes on |
//! | id not learned, `txid_status` NULL (too old), `in progress` past the deadline, no primary, the primary changed | FATAL `08007` | ends |
//!
//! Only the node the COMMIT was sent to is asked, and only while it is still the primary
//! of the same generation: after a failover the new primary may have handed the same id
//! to another transaction (its history forks from the old primary's wherever replication
//! had got to), so its answer could be about someone else's transaction.
//!
//! Autocommit writes are not covered: their id is assigned while the statement runs and
//! only the statement itself could return it; learning it would mean wrapping the
//! client's statement in a transaction pgfresh commits itself.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use bytes::Bytes;
use pgfresh_recency::RelKey;
use pgfresh_sql::TxEffect;
use pgfresh_wire::{build, TxStatus};
use tokio::time::Instant;

use super::settings::StmtEvent;
use super::unit::{ClientUnit, InFlight};
use super::Session;
use crate::context::Shared;
use crate::error::ProxyError;

/// The transaction-id probe pgfresh sends before a watched COMMIT.
pub const XID_PROBE: &str = "SELECT txid_current_if_assigned()";

/// Faults the integration tests arm. Not part of the supported interface.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct Faults(AtomicU8);

/// A fault the integration tests can arm (once: the first session that reaches it
/// disarms it).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// The next COMMIT unit sent to a server: once its bytes are written (and the answer
    /// of the transaction-id probe ahead of it, if any, was read), the session closes
    /// that server connection without reading the COMMIT's reply. The server still
    /// runs the COMMIT it received: it reads it before it sees the end of the stream.
    DropAfterCommit = 1,
}

impl Faults {
    pub fn arm(&self, fault: Fault) {
        self.0.store(fault as u8, Ordering::SeqCst);
    }

    pub fn disarm(&self) {
        self.0.store(0, Ordering::SeqCst);
    }

    fn take(&self, fault: Fault) -> bool {
        self.0
            .compare_exchange(fault as u8, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// The COMMIT in flight that pgfresh can resolve if its connection is lost.
#[derive(Debug)]
struct Watch {
    node: usize,
    /// The probe's answer: `None` until its row arrived; `Some(None)`: no id assigned.
    xid: Option<Option<u64>>,
    /// What the client would have received for the unit had it committed.
    reply: Vec<Bytes>,
}

/// What is known about a lost COMMIT when its connection fails.
#[derive(Debug)]
enum Known {
    /// The COMMIT's CommandComplete had already been relayed.
    Committed,
    /// The transaction had no id: it wrote nothing, there is nothing to lose.
    NoXid,
    Xid(u64),
    Unknown(&'static str),
}

#[derive(Debug)]
struct Pending {
    node: usize,
    node_name: String,
    generation: u64,
    known: Known,
    /// The client's reply when the transaction committed (what it has not received yet).
    reply: Vec<Bytes>,
    writes: Vec<pgfresh_sql::RelName>,
    whole_db: bool,
    ddl: bool,
}

/// The session's part: the watched COMMIT, and a lost one waiting for its outcome.
#[derive(Debug, Default)]
pub(super) struct LostCommits {
    watch: Option<Watch>,
    pending: Option<Pending>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Committed,
    Aborted,
    Unknown,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::Aborted => "aborted",
            Outcome::Unknown => "unknown",
        }
    }
}

/// The id in a probe's DataRow body (one text column; NULL when none is assigned).
pub(super) fn parse_xid(body: &[u8]) -> Option<u64> {
    let len = i32::from_be_bytes(body.get(2..6)?.try_into().ok()?);
    if len < 0 {
        return None;
    }
    std::str::from_utf8(body.get(6..6 + len as usize)?)
        .ok()?
        .parse()
        .ok()
}

/// The replies a client gets for a unit that is only a COMMIT, when it commits; `None`
/// when the unit is anything else (it is then not watched).
fn commit_only_reply(unit: &ClientUnit) -> Option<Vec<Bytes>> {
    let mut stmts = unit.parts.iter().flat_map(|a| &a.statements).peekable();
    stmts.peek()?;
    if !stmts.all(|s| matches!(s.tx, Some(TxEffect::Commit { chain: false }))) {
        return None;
    }
    if unit.simple_sql.is_some() {
        let [_] = unit.parts.as_slice() else {
            return None;
        };
        let [_] = unit.parts[0].statements.as_slice() else {
            return None;
        };
        return Some(vec![
            build::command_complete("COMMIT"),
            build::ready_for_query(TxStatus::Idle),
        ]);
    }
    // An extended batch: Parse/Bind/Describe/Execute of the COMMIT, up to its Sync.
    let mut out = Vec::new();
    let mut executes = 0;
    for (i, f) in unit.frames.iter().enumerate() {
        let last = i + 1 == unit.frames.len();
        match f.first()? {
            b'P' => out.push(build::parse_complete()),
            b'B' => out.push(build::bind_complete()),
            b'D' => {
                if f.get(5) == Some(&b'S') {
                    // ParameterDescription with no parameters.
                    out.push(Bytes::from_static(&[b't', 0, 0, 0, 6, 0, 0]));
                }
                out.push(build::no_data());
            }
            b'E' => {
                executes += 1;
                out.push(build::command_complete("COMMIT"));
            }
            b'C' => out.push(build::close_complete()),
            b'S' if last => out.push(build::ready_for_query(TxStatus::Idle)),
            _ => return None,
        }
    }
    (executes == 1 && unit.synced).then_some(out)
}

/// Where the `n`th ReadyForQuery in `buf` ends, if it is there.
fn end_after_ready(buf: &[u8], n: u32) -> Option<usize> {
    let (mut pos, mut seen) = (0usize, 0u32);
    while buf.len() - pos >= 5 {
        let len =
            u32::from_be_bytes([buf[pos + 1], buf[pos + 2], buf[pos + 3], buf[pos + 4]]) as usize;
        if buf.len() - pos < 1 + len {
            return None;
        }
        let tag = buf[pos];
        pos += 1 + len;
        if tag == b'Z' {
            seen += 1;
            if seen >= n {
                return Some(pos);
            }
        }
    }
    None
}

impl Session {
    /// Before a committing unit is sent to `node`: with `resolve_lost_commits`, queue the
    /// transaction-id probe at the front of `pre` (what goes ahead of the unit in the
    /// same write) and watch the unit. Called for every committing unit, so an earlier
    /// COMMIT's id is never taken for this one's.
    pub(super) fn watch_commit(
        &mut self,
        node: usize,
        unit: &ClientUnit,
        continuing: bool,
        pre: &mut Vec<Bytes>,
    ) {
        self.lost.watch = None;
        if continuing
            || !unit.synced
            || !self.shared.config.snapshot().routing.resolve_lost_commits
            || self.tx != TxStatus::InTransaction
            || self.copy_in
            || Some(node) != self.shared.balancer.primary()
        {
            return;
        }
        let Some(reply) = commit_only_reply(unit) else {
            return;
        };
        pre.insert(0, build::query(XID_PROBE));
        let mut f = InFlight::injected();
        f.xid_probe = true;
        self.inflight.push_back(f);
        self.lost.watch = Some(Watch {
            node,
            xid: None,
            reply,
        });
    }

    /// The transaction-id probe answered (a DataRow of the injected unit in front).
    pub(super) fn xid_learned(&mut self, xid: Option<u64>) {
        if let Some(w) = self.lost.watch.as_mut() {
            w.xid = Some(xid);
        }
    }

    /// The connection to `node` was lost with a COMMIT in flight: when pgfresh may find
    /// out what became of it, take the session's unit off and return true; the outcome is
    /// then resolved by [`Session::resolve_lost_commit`] before anything else runs.
    pub(super) fn lost_commit(&mut self, node: usize, err: &ProxyError) -> bool {
        let ProxyError::CommitOutcomeUnknown { node: node_name } = err else {
            return false;
        };
        let watch = self.lost.watch.take().filter(|w| w.node == node);
        if watch.is_none() && !self.shared.config.snapshot().routing.resolve_lost_commits {
            return false;
        }
        let mut units = self.inflight.iter().filter(|u| !u.injected);
        let (unit, more) = (units.next(), units.next().is_some());
        let known = match (unit, watch.as_ref()) {
            (Some(u), _) if !more && u.committed && u.simple => Known::Committed,
            (_, None) => Known::Unknown("the COMMIT was not watched"),
            (None, _) => Known::Unknown("no COMMIT in flight"),
            (Some(_), _) if more => Known::Unknown("more statements were pipelined after it"),
            (Some(u), _) if u.error => Known::Unknown("the server's error reached the client"),
            (Some(u), _) if u.replied || u.acks > 0 || !u.commit_sent => {
                Known::Unknown("part of the reply already reached the client")
            }
            (Some(_), Some(w)) => match w.xid {
                None => Known::Unknown("the transaction id was not learned"),
                Some(None) => Known::NoXid,
                Some(Some(x)) => Known::Xid(x),
            },
        };
        let reply = match (&known, unit, watch) {
            // The CommandComplete is the client's already: only ReadyForQuery is owed.
            (Known::Committed, _, _) => vec![build::ready_for_query(TxStatus::Idle)],
            (_, _, Some(w)) => w.reply,
            _ => Vec::new(),
        };
        let (mut writes, mut whole_db, mut ddl) = (Vec::new(), false, false);
        if let Some(u) = unit {
            writes.extend(u.writes.iter().cloned());
            whole_db = u.whole_db;
            ddl = u.ddl;
        }
        writes.append(&mut self.tx_writes.writes);
        self.lost.pending = Some(Pending {
            node,
            node_name: node_name.clone(),
            generation: self.shared.pools.generation(node),
            known,
            reply,
            writes,
            whole_db: whole_db || self.tx_writes.whole_db,
            ddl: ddl || self.tx_writes.ddl,
        });
        self.inflight.clear();
        self.open_unit_node = None;
        self.replica_guard = None;
        self.fallback_slot = None;
        self.copy_in = false;
        true
    }

    /// Answer a lost COMMIT with its real outcome (a no-op when none is pending). Nothing
    /// else of the session runs until this returns.
    pub(super) async fn resolve_lost_commit(&mut self) -> Result<(), ProxyError> {
        let Some(p) = self.lost.pending.take() else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let wait = Duration::from_millis(
            self.shared
                .config
                .snapshot()
                .proxy
                .client_login_timeout_ms
                .max(1),
        );
        let (outcome, detail) = match p.known {
            Known::Committed => (Outcome::Committed, "its CommandComplete had arrived".into()),
            Known::NoXid => (
                Outcome::Committed,
                "the transaction had no id: it wrote nothing".into(),
            ),
            Known::Unknown(why) => (Outcome::Unknown, why.to_string()),
            Known::Xid(xid) => {
                match ask(
                    &self.shared,
                    p.node,
                    p.generation,
                    xid,
                    Instant::now() + wait,
                )
                .await
                {
                    Ok(true) => (
                        Outcome::Committed,
                        format!("txid_status({xid}) = committed"),
                    ),
                    Ok(false) => (Outcome::Aborted, format!("txid_status({xid}) = aborted")),
                    Err(e) => (Outcome::Unknown, e),
                }
            }
        };
        metrics::counter!("pgfresh_lost_commits_total", "outcome" => outcome.as_str()).increment(1);
        tracing::warn!(
            node = %p.node_name,
            outcome = outcome.as_str(),
            detail = %detail,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "connection to the primary lost after COMMIT was sent"
        );
        self.tx = TxStatus::Idle;
        self.tx_writes = super::TxWrites::default();
        match outcome {
            Outcome::Committed => {
                let mut changes = self
                    .pending_settings
                    .on_complete(StmtEvent::Commit, b"COMMIT");
                changes.extend(self.pending_settings.on_ready(TxStatus::Idle, false));
                if !changes.is_empty() {
                    super::settings::apply(&mut self.state, changes);
                }
                // As for any commit: the writes are marked before the client hears of it
                // (primary-only for the TTL: the commit's position is not known).
                if p.whole_db {
                    self.shared.recency.mark_database(&self.login.database);
                }
                if !p.writes.is_empty() {
                    let keys: Vec<RelKey<'_>> = p
                        .writes
                        .iter()
                        .map(|n| RelKey {
                            schema: n.schema.as_deref(),
                            name: &n.name,
                        })
                        .collect();
                    self.shared.recency.mark(&self.login.database, &keys, None);
                }
                if p.ddl {
                    self.ddl_done();
                }
                self.out.extend(p.reply);
                Ok(())
            }
            Outcome::Aborted => {
                self.pending_settings.on_ready(TxStatus::Idle, true);
                let Known::Xid(xid) = p.known else {
                    unreachable!("only an asked id can be aborted")
                };
                let e = ProxyError::CommitRolledBack {
                    node: p.node_name,
                    xid,
                };
                self.out.push(e.to_client_as_error());
                self.out.push(build::ready_for_query(TxStatus::Idle));
                Ok(())
            }
            Outcome::Unknown => Err(ProxyError::CommitOutcomeUnknown { node: p.node_name }),
        }
    }

    /// Test fault [`Fault::DropAfterCommit`], called once a committing unit is queued.
    pub(super) async fn after_commit_queued(&mut self, node: usize) -> Result<(), ProxyError> {
        if !self.shared.faults.take(Fault::DropAfterCommit) {
            return Ok(());
        }
        // Everything queued reaches the server.
        loop {
            let Some(l) = self.backends[node].as_mut() else {
                return Ok(());
            };
            if l.conn.wbuf.is_empty() {
                break;
            }
            let _ = l.conn.stream.writable().await;
            if l.conn.flush_some().is_err() {
                break;
            }
        }
        // The replies up to the transaction-id probe's are read and relayed; what the
        // server sends for the COMMIT is dropped unread.
        let upto = self.inflight.iter().position(|u| u.xid_probe);
        if let Some(i) = upto {
            let need: u32 = self.inflight.iter().take(i + 1).map(|u| u.owed).sum();
            loop {
                let Some(l) = self.backends[node].as_mut() else {
                    return Ok(());
                };
                if let Some(end) = end_after_ready(&l.conn.rbuf, need) {
                    l.conn.rbuf.truncate(end);
                    self.relay(node)?;
                    break;
                }
                let _ = l.conn.stream.readable().await;
                l.conn.rbuf.reserve(8192);
                match l.conn.stream.try_read_buf(&mut l.conn.rbuf) {
                    Ok(0) => break,
                    Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => break,
                    _ => {}
                }
            }
        }
        tracing::warn!(
            node,
            "test fault: dropping the server connection after COMMIT"
        );
        self.on_backend_lost(node, "test fault: connection dropped after COMMIT")?;
        self.resolve_lost_commit().await
    }
}

/// Ask the primary what became of transaction `xid`, as the monitor user: `Ok(true)`
/// committed, `Ok(false)` aborted, `Err(why)` when it cannot be known by `deadline`.
async fn ask(
    shared: &Shared,
    node: usize,
    generation: u64,
    xid: u64,
    deadline: Instant,
) -> Result<bool, String> {
    let work = async {
        let mut last_error = String::from("no primary is known");
        loop {
            // Wait for a primary; only the node the COMMIT went to can answer.
            let mut events = shared.balancer.subscribe();
            match shared.balancer.primary() {
                Some(p) if p != node || shared.pools.generation(node) != generation => {
                    return Err(
                        "the primary changed: a new primary cannot vouch for the old one's transaction ids"
                            .to_string(),
                    );
                }
                Some(_) => {}
                None => {
                    if let Err(tokio::sync::broadcast::error::RecvError::Closed) =
                        events.recv().await
                    {
                        return Err(last_error);
                    }
                    continue;
                }
            }
            match query_status(shared, node, xid).await {
                Ok(Some(s)) if s == "committed" => return Ok(true),
                Ok(Some(s)) if s == "aborted" => return Ok(false),
                Ok(Some(s)) => last_error = format!("txid_status({xid}) = {s}"),
                Ok(None) => {
                    return Err(format!(
                        "txid_status({xid}) is NULL: the id is too old to be known"
                    ))
                }
                Err(e) => last_error = e,
            }
            // In progress (the old backend is still committing) or not reachable: again.
            tokio::time::sleep(Duration::from_millis(20)).await;
            if Instant::now() >= deadline {
                return Err(last_error);
            }
        }
    };
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or_else(|_| Err("no answer before the deadline".to_string()))
}

async fn query_status(shared: &Shared, node: usize, xid: u64) -> Result<Option<String>, String> {
    let config = shared.config.snapshot();
    let view = shared.balancer.view();
    let spec = &view.node(node).ok_or("node not configured")?.spec;
    let mut pg = tokio_postgres::Config::new();
    pg.host(&spec.host)
        .port(spec.port)
        .user(&config.monitor.user)
        .password(&config.monitor.password)
        .dbname(&config.monitor.database)
        .application_name("pgfresh lost commit")
        .connect_timeout(Duration::from_millis(config.monitor.connect_timeout_ms));
    let (client, conn) = pg
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    let task = tokio::spawn(conn);
    let xid = i64::try_from(xid).map_err(|e| e.to_string())?;
    let row = client
        .query_one("SELECT txid_status($1)", &[&xid])
        .await
        .map_err(|e| e.to_string());
    drop(client);
    let _ = task.await;
    row?.try_get::<_, Option<String>>(0)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_row(v: Option<&str>) -> Vec<u8> {
        let mut b = vec![0, 1];
        match v {
            Some(t) => {
                b.extend_from_slice(&(t.len() as i32).to_be_bytes());
                b.extend_from_slice(t.as_bytes());
            }
            None => b.extend_from_slice(&(-1i32).to_be_bytes()),
        }
        b
    }

    #[test]
    fn probe_rows_parse() {
        assert_eq!(parse_xid(&data_row(Some("7401"))), Some(7401));
        assert_eq!(parse_xid(&data_row(None)), None);
        assert_eq!(parse_xid(&data_row(Some("x"))), None);
        assert_eq!(parse_xid(&[0, 1]), None);
    }

    #[test]
    fn ready_for_query_is_found_after_whole_frames_only() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&build::command_complete("SELECT 1"));
        buf.extend_from_slice(&build::ready_for_query(TxStatus::InTransaction));
        let first = buf.len();
        buf.extend_from_slice(&build::command_complete("COMMIT"));
        buf.extend_from_slice(&build::ready_for_query(TxStatus::Idle));
        assert_eq!(end_after_ready(&buf, 1), Some(first));
        assert_eq!(end_after_ready(&buf, 2), Some(buf.len()));
        assert_eq!(end_after_ready(&buf[..buf.len() - 1], 2), None);
    }

    #[test]
    fn faults_fire_once() {
        let f = Faults::default();
        assert!(!f.take(Fault::DropAfterCommit));
        f.arm(Fault::DropAfterCommit);
        assert!(f.take(Fault::DropAfterCommit));
        assert!(!f.take(Fault::DropAfterCommit));
    }
}
