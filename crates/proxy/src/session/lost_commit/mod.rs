//! Commits whose acknowledgement was lost (`[routing] resolve_lost_commits`).
//!
//! When the option is on, a unit that is only a COMMIT of an explicit transaction on the
//! primary is preceded, in the same write, by an injected probe ([`xid_probe`]):
//! `SELECT txid_current_if_assigned(), pg_current_wal_insert_lsn(), <logged>` — the
//! transaction's id (NULL when it wrote nothing), the WAL insert position `P`, and
//! whether the transaction inserted, updated or deleted rows of a permanent relation it
//! names. Its answer is swallowed like the position probe's; the watch also keeps the
//! node's timeline from the monitor's view. Every WAL record the transaction wrote is
//! before `P`, its commit record after it. If the connection to the primary is lost
//! after that COMMIT was sent, the session does not answer 08007 at once: it stops
//! (nothing else of the session runs meanwhile), asks `txid_status(id)` on a connection
//! of its own as the `[monitor]` user, and answers the client with the real outcome,
//! within `client_login_timeout_ms`:
//!
//! | what pgfresh learns | client gets | session |
//! |---|---|---|
//! | `committed` (or the COMMIT's own CommandComplete had arrived) | `COMMIT` + ReadyForQuery idle, writes marked first | goes on |
//! | no id (NULL: the transaction wrote nothing) | `COMMIT` + ReadyForQuery idle | goes on |
//! | `aborted` | ERROR `40000` transaction_rollback + ReadyForQuery idle | goes on |
//! | after a failover, `P` past the new timeline's switch point | ERROR `40000` (lost in a failover) + ReadyForQuery idle | goes on |
//! | id or position not learned, `txid_status` NULL (too old), `in progress` past the deadline, no primary, a failover pgfresh cannot vouch for (below) | FATAL `08007`, writes marked first as if it committed | ends |
//!
//! `COMMIT AND CHAIN` is not watched (the chained transaction goes with the connection):
//! a lost one is `08007`, its writes marked as if it committed — and so are those of any
//! lost COMMIT when the option is off.
//!
//! Whom to ask (`plan`): the node the COMMIT went to while it is still the primary of
//! the same pool generation. After a failover — another node primary, or the same node in
//! a new generation, on a newer timeline — the position `(old timeline, P)` is translated
//! through the new primary's timeline history:
//!
//! * at or before the switch point ([`Translation::Current`]): the new primary replayed
//!   every record the transaction wrote; one of them carries its id (or a
//!   subtransaction's, which is newer), so the new primary's id counter is past it and
//!   it cannot have handed the id to another transaction. The new primary is asked;
//!   `aborted` then also covers a commit record that never crossed the switch — the
//!   transaction is not part of the timeline the application now sees.
//! * past it ([`Translation::Diverged`]): the commit record, later still, is not on the
//!   new timeline — rolled back (`CommitLostInFailover`, counted as `aborted`).
//! * unknown (history not read yet, the view still on the old timeline): wait, within
//!   the same deadline.
//!
//! The hole: with asynchronous replication the new primary's ids fork from the old
//! one's, and a transaction that wrote no WAL carrying its id before `P` — it wrote only
//! unlogged or temporary tables, or got its id from `txid_current()` or a no-op — may
//! share its id with one of the new timeline. So the new primary is asked only when the
//! probe's third column proves a logged write (rows of a permanent relation among those
//! the session saw it write, at most `PROBE_RELATIONS` (8), counted by the transaction's
//! own statistics, `track_counts`); otherwise, and for writes pgfresh cannot name (an
//! unanalysable function body), the answer after a failover is 08007. The same node
//! restarted on the same timeline is 08007 as before (a crash may also reuse an id that
//! no WAL recorded).
//!
//! Autocommit writes are not covered: their id is assigned while the statement runs and
//! only the statement itself could return it; learning it would mean wrapping the
//! client's statement in a transaction pgfresh commits itself.

mod fault;
mod plan;
mod probe;

pub use fault::{Fault, Faults};
use plan::{ask, Answer, XidAt};
pub(in crate::session) use probe::{parse_probe, text_column, ProbeRow};
pub use probe::{xid_probe, XID_PROBE};

use std::time::Duration;

use bytes::Bytes;
use pgfresh_lsn::Position;
use pgfresh_recency::RelKey;
use pgfresh_sql::TxEffect;
use pgfresh_wire::{build, TxStatus};
use tokio::time::Instant;

use super::settings::StmtEvent;
use super::unit::{ClientUnit, InFlight};
use super::Session;
use crate::error::ProxyError;

/// The COMMIT in flight that pgfresh can resolve if its connection is lost.
#[derive(Debug)]
struct Watch {
    node: usize,
    /// The node's timeline when the COMMIT was sent (the monitor's view).
    timeline: Option<u32>,
    /// The probe's answer: `None` until its row arrived.
    probe: Option<ProbeRow>,
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
    Xid(XidAt),
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
    writes: LostWrites,
}

/// What a lost COMMIT (or a write committing with it) wrote: marked when it committed,
/// and when its outcome stays unknown, as if it had.
#[derive(Debug, Default)]
struct LostWrites {
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

impl LostCommits {
    /// A lost COMMIT waits for [`Session::resolve_lost_commit`].
    pub(super) fn has_pending(&self) -> bool {
        self.pending.is_some()
    }
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

/// The replies a client gets for a unit that is only a COMMIT, when it commits; `None`
/// when the unit is anything else (it is then not watched).
fn commit_only_reply(unit: &ClientUnit) -> Option<Vec<Bytes>> {
    let mut stmts = unit.parts.iter().flat_map(|a| &a.statements).peekable();
    stmts.peek()?;
    if !stmts.all(|s| matches!(s.tx, Some(TxEffect::Commit { chain: false }))) {
        return None;
    }
    if unit.simple {
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
    while let Ok(Some((tag, end))) = pgfresh_wire::frame_at(buf, pos, usize::MAX) {
        pos = end;
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
            || !self.config.routing.resolve_lost_commits
            || self.tx.status() != TxStatus::InTransaction
            || self.wire.copy_in()
            || Some(node) != self.shared.balancer.primary()
        {
            return;
        }
        let Some(reply) = commit_only_reply(unit) else {
            return;
        };
        // The unit is only a COMMIT: the transaction's writes are all in `tx_writes`.
        pre.insert(0, build::query(&xid_probe(&self.tx_writes.writes)));
        let f = InFlight::injected(super::unit::Injected::XidProbe);
        self.inflight.push_back(f);
        let timeline = self
            .shared
            .balancer
            .view()
            .node(node)
            .and_then(|n| n.timeline);
        self.lost.watch = Some(Watch {
            node,
            timeline,
            probe: None,
            reply,
        });
    }

    /// The transaction-id probe answered (a DataRow of the injected unit in front).
    pub(super) fn xid_learned(&mut self, row: ProbeRow) {
        if let Some(w) = self.lost.watch.as_mut() {
            w.probe = Some(row);
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
        if watch.is_none() && !self.config.routing.resolve_lost_commits {
            // 08007 follows at once; the COMMIT may have run all the same.
            let lost = self.lost_writes();
            self.mark_as_committed(&lost);
            return false;
        }
        let mut units = self.inflight.iter().filter(|u| !u.is_injected());
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
            (Some(_), Some(w)) => match w.probe {
                None => Known::Unknown("the transaction id was not learned"),
                Some(ProbeRow { xid: None, .. }) => Known::NoXid,
                Some(ProbeRow {
                    xid: Some(xid),
                    insert_lsn,
                    logged,
                }) => Known::Xid(XidAt {
                    xid,
                    at: w
                        .timeline
                        .zip(insert_lsn)
                        .and_then(|(t, l)| Position::new(t, l)),
                    logged,
                }),
            },
        };
        let reply = match (&known, unit, watch) {
            // The CommandComplete is the client's already: only ReadyForQuery is owed.
            (Known::Committed, _, _) => vec![build::ready_for_query(TxStatus::Idle)],
            (_, _, Some(w)) => w.reply,
            _ => Vec::new(),
        };
        let writes = self.lost_writes();
        self.lost.pending = Some(Pending {
            node,
            node_name: node_name.clone(),
            generation: self.shared.pools.generation(node),
            known,
            reply,
            writes,
        });
        self.inflight.clear();
        self.wire = super::WirePhase::Units;
        self.replica_guard = None;
        self.fallback_slot = None;
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
        let mut lost_in_failover = None;
        let (outcome, detail) = match p.known {
            Known::Committed => (Outcome::Committed, "its CommandComplete had arrived".into()),
            Known::NoXid => (
                Outcome::Committed,
                "the transaction had no id: it wrote nothing".into(),
            ),
            Known::Unknown(why) => (Outcome::Unknown, why.to_string()),
            Known::Xid(x) => {
                match ask(&self.shared, p.node, p.generation, x, Instant::now() + wait).await {
                    Ok(Answer::Status { node, committed }) => {
                        let on = self.node_name(node);
                        let status = if committed { "committed" } else { "aborted" };
                        let outcome = if committed {
                            Outcome::Committed
                        } else {
                            Outcome::Aborted
                        };
                        (
                            outcome,
                            format!("txid_status({}) = {status} on {on}", x.xid),
                        )
                    }
                    Ok(Answer::Lost { node, switch }) => {
                        let new_primary = self.node_name(node);
                        lost_in_failover = Some((new_primary.clone(), switch));
                        (
                            Outcome::Aborted,
                            format!(
                                "lost in a failover: written past {switch}, where the timeline of {new_primary} begins"
                            ),
                        )
                    }
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
        self.tx = super::TxPhase::Idle;
        self.tx_writes = super::TxWrites::default();
        match outcome {
            Outcome::Committed => {
                let mut changes = self
                    .pending_settings
                    .on_complete(StmtEvent::Commit, b"COMMIT");
                changes.extend(self.pending_settings.on_ready(TxStatus::Idle, false));
                if !changes.is_empty() {
                    super::settings::apply(&mut self.state, changes, None);
                }
                self.mark_as_committed(&p.writes);
                self.out.extend(p.reply);
                Ok(())
            }
            Outcome::Aborted => {
                self.pending_settings.on_ready(TxStatus::Idle, true);
                let Known::Xid(XidAt { xid, .. }) = p.known else {
                    // Only an id pgfresh asked about can be aborted; anything else is not
                    // known, and the client is told so rather than guessed at.
                    return Err(ProxyError::CommitOutcomeUnknown { node: p.node_name });
                };
                let e = match lost_in_failover {
                    Some((new_primary, switch)) => ProxyError::CommitLostInFailover {
                        node: p.node_name,
                        xid,
                        new_primary,
                        switch: switch.to_string(),
                    },
                    None => ProxyError::CommitRolledBack {
                        node: p.node_name,
                        xid,
                    },
                };
                self.out.push(e.to_client_as_error());
                self.out.push(build::ready_for_query(TxStatus::Idle));
                Ok(())
            }
            Outcome::Unknown => {
                // It may have committed: a read after the 08007 must see it if it did.
                self.mark_as_committed(&p.writes);
                Err(ProxyError::CommitOutcomeUnknown { node: p.node_name })
            }
        }
    }

    /// What the client units in flight and the open transaction wrote, taken from them
    /// (the connection they ran on is gone).
    fn lost_writes(&mut self) -> LostWrites {
        let mut lost = LostWrites::default();
        let mut stamp = self.tx_writes.schema_stamp;
        for u in self.inflight.iter().filter(|u| !u.is_injected()) {
            lost.writes.extend(u.writes.iter().cloned());
            lost.whole_db |= u.whole_db;
            lost.ddl |= u.ddl;
            stamp = super::oldest(stamp, u.schema_stamp);
        }
        lost.writes.append(&mut self.tx_writes.writes);
        lost.whole_db |= self.tx_writes.whole_db || self.schema_changed_since(stamp);
        lost.ddl |= self.tx_writes.ddl;
        lost
    }

    /// As for any commit: the writes are marked before the client hears of it
    /// (primary-only for the TTL: the commit's position is not known).
    fn mark_as_committed(&self, lost: &LostWrites) {
        if lost.whole_db {
            self.shared.recency.mark_database(&self.login.database);
        }
        if !lost.writes.is_empty() {
            let keys: Vec<RelKey<'_>> = lost.writes.iter().map(crate::router::rel_key).collect();
            self.shared.recency.mark(&self.login.database, &keys, None);
        }
        if lost.ddl {
            self.ddl_done();
        }
    }

    /// The configured name of `node` (its index when it has none).
    fn node_name(&self, node: usize) -> String {
        self.shared
            .balancer
            .view()
            .node(node)
            .map(|n| n.spec.name.clone())
            .unwrap_or_else(|| node.to_string())
    }

    /// Test faults [`Fault::DropAfterCommit`] and [`Fault::DropAfterCommitAndHold`],
    /// called once a committing unit is queued.
    pub(super) async fn after_commit_queued(&mut self, node: usize) -> Result<(), ProxyError> {
        let hold = if self.shared.faults.take(Fault::DropAfterCommit) {
            false
        } else if self.shared.faults.take(Fault::DropAfterCommitAndHold) {
            true
        } else {
            return Ok(());
        };
        // Everything queued reaches the server.
        loop {
            let Some(l) = self.backends[node].as_mut() else {
                return Ok(());
            };
            if l.conn.unsent() == 0 {
                break;
            }
            let _ = l.conn.stream.writable().await;
            if l.conn.flush_some().is_err() {
                break;
            }
        }
        // The replies up to the transaction-id probe's are read and relayed; what the
        // server sends for the COMMIT is dropped unread.
        let upto = self
            .inflight
            .iter()
            .position(|u| matches!(u.injected, Some(super::unit::Injected::XidProbe)));
        if let Some(i) = upto {
            let need: u32 = self
                .inflight
                .iter()
                .take(i + 1)
                .map(|u| u32::from(u.owed))
                .sum();
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
        if hold {
            self.shared.faults.hold().await;
        }
        self.resolve_lost_commit().await
    }
}

#[cfg(test)]
mod tests {
    use super::plan::*;
    use super::probe::*;
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

    fn data_row_of(cols: &[Option<&str>]) -> Vec<u8> {
        let mut b = (cols.len() as i16).to_be_bytes().to_vec();
        for v in cols {
            match v {
                Some(t) => {
                    b.extend_from_slice(&(t.len() as i32).to_be_bytes());
                    b.extend_from_slice(t.as_bytes());
                }
                None => b.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        b
    }

    #[test]
    fn probe_rows_parse() {
        // The one-column form (what an older probe answered) still gives the id.
        assert_eq!(parse_probe(&data_row(Some("7401"))).xid, Some(7401));
        assert_eq!(parse_probe(&data_row(None)).xid, None);
        assert_eq!(parse_probe(&data_row(Some("x"))).xid, None);
        assert_eq!(parse_probe(&[0, 1]).xid, None);
        assert_eq!(parse_probe(&[]).xid, None);
        let row = parse_probe(&data_row_of(&[Some("7401"), Some("0/3000148"), Some("t")]));
        assert_eq!(
            row,
            ProbeRow {
                xid: Some(7401),
                insert_lsn: Some("0/3000148".parse().unwrap()),
                logged: true,
            }
        );
        let row = parse_probe(&data_row_of(&[None, Some("0/3000148"), Some("f")]));
        assert_eq!((row.xid, row.logged), (None, false));
        assert!(row.insert_lsn.is_some());
        // A bad position or a truncated row loses only what is missing.
        let row = parse_probe(&data_row_of(&[Some("9"), Some("nope"), Some("t")]));
        assert_eq!((row.xid, row.insert_lsn, row.logged), (Some(9), None, true));
        let mut cut = data_row_of(&[Some("9"), Some("0/10"), Some("t")]);
        cut.truncate(cut.len() - 1);
        let row = parse_probe(&cut);
        assert_eq!(
            (row.xid, row.insert_lsn, row.logged),
            (Some(9), Some("0/10".parse().unwrap()), false)
        );
    }

    #[test]
    fn the_probe_checks_written_relations_safely() {
        use pgfresh_sql::RelName;
        let rel = |schema: Option<&str>, name: &str| RelName {
            schema: schema.map(Into::into),
            name: name.into(),
        };
        assert_eq!(xid_probe(&[]), format!("{XID_PROBE}, false"));
        let q = xid_probe(&[rel(None, "t"), rel(None, "t"), rel(Some("s"), "o'dd\\x")]);
        assert!(q.starts_with(XID_PROBE), "{q}");
        assert_eq!(q.matches("to_regclass").count(), 2, "{q}");
        assert!(
            q.contains("to_regclass(pg_catalog.quote_ident(E't'))"),
            "{q}"
        );
        assert!(
            q.contains("pg_catalog.to_regclass(pg_catalog.format('%I.%I', E's', E'o''dd\\\\x'))"),
            "{q}"
        );
        assert!(q.contains("relpersistence = 'p'"), "{q}");
        let many: Vec<RelName> = (0..20).map(|i| rel(None, &format!("t{i}"))).collect();
        assert_eq!(
            xid_probe(&many).matches("to_regclass").count(),
            PROBE_RELATIONS
        );
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

    fn view(
        primary: Option<usize>,
        tli: Option<u32>,
        history: Option<&str>,
    ) -> pgfresh_balancer::ClusterView {
        pgfresh_balancer::ClusterView {
            nodes: Vec::new(),
            primary,
            primary_lsn: None,
            primary_timeline: tli,
            timeline_history: history.map(|h| {
                std::sync::Arc::new(
                    pgfresh_balancer::TimelineHistory::parse(tli.unwrap(), h).unwrap(),
                )
            }),
            max_lag_bytes: None,
            max_lag_ms: None,
            pool_external_lag: None,
            generation: 0,
            specs_generation: 0,
        }
    }

    fn xid_at(tli: u32, lsn: &str, logged: bool) -> XidAt {
        XidAt {
            xid: 900,
            at: Position::new(tli, lsn.parse().unwrap()),
            logged,
        }
    }

    #[test]
    fn whom_to_ask_after_a_failover() {
        let history = "1\t0/3000000\tno recovery target specified\n";
        let x = xid_at(1, "0/2000000", true);
        // The same primary, same generation: itself, whatever the timeline says.
        assert_eq!(
            plan(&view(Some(0), Some(1), None), 0, true, &x),
            Plan::Ask(0)
        );
        assert!(matches!(
            plan(&view(None, None, None), 0, true, &x),
            Plan::Wait(_)
        ));
        // Failed over, the transaction's writes before the switch point: the new primary.
        let failed_over = view(Some(1), Some(2), Some(history));
        assert_eq!(plan(&failed_over, 0, false, &x), Plan::Ask(1));
        assert_eq!(plan(&failed_over, 0, true, &x), Plan::Ask(1));
        // The switch point exactly at the insert position: still every write before it.
        assert_eq!(
            plan(&failed_over, 0, false, &xid_at(1, "0/3000000", true)),
            Plan::Ask(1)
        );
        // ... but only when a logged write proves the id is in that WAL.
        assert!(matches!(
            plan(&failed_over, 0, false, &xid_at(1, "0/2000000", false)),
            Plan::Fail(_)
        ));
        // Past the switch point: lost, without asking (logged or not).
        for logged in [true, false] {
            assert_eq!(
                plan(&failed_over, 0, false, &xid_at(1, "0/3000001", logged)),
                Plan::Answer(Answer::Lost {
                    node: 1,
                    switch: "0/3000000".parse().unwrap()
                })
            );
        }
        // History not read yet, or the view still on the old timeline: wait.
        assert!(matches!(
            plan(&view(Some(1), Some(2), None), 0, false, &x),
            Plan::Wait(_)
        ));
        assert!(matches!(
            plan(&view(Some(1), Some(1), None), 0, false, &x),
            Plan::Wait(_)
        ));
        assert!(matches!(
            plan(&view(Some(1), None, None), 0, false, &x),
            Plan::Wait(_)
        ));
        // The same node restarted on the same timeline: unknown, as before.
        assert!(matches!(
            plan(&view(Some(0), Some(1), None), 0, false, &x),
            Plan::Fail(_)
        ));
        // The position was not learned: a changed primary cannot be asked.
        let blind = XidAt { at: None, ..x };
        assert!(matches!(
            plan(&failed_over, 0, false, &blind),
            Plan::Fail(_)
        ));
    }

    #[test]
    fn faults_fire_once() {
        let f = Faults::default();
        assert!(!f.take(Fault::DropAfterCommit));
        f.arm(Fault::DropAfterCommit);
        assert!(f.take(Fault::DropAfterCommit));
        assert!(!f.take(Fault::DropAfterCommit));
        f.arm(Fault::DropAfterCommitAndHold);
        assert!(!f.take(Fault::DropAfterCommit));
        assert!(f.take(Fault::DropAfterCommitAndHold));
    }
}
