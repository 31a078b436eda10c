//! Whom to ask what became of a lost COMMIT, and asking it (see the parent module).

use std::time::Duration;

use pgfresh_balancer::Translation;
use pgfresh_lsn::{Lsn, Position};
use tokio::time::Instant;

use crate::context::Shared;
use crate::monitor_conn::MonitorConn;

/// A transaction id and where its transaction stood in the WAL.
#[derive(Debug, Clone, Copy)]
pub(super) struct XidAt {
    pub(super) xid: u64,
    /// The old primary's timeline and WAL insert position when the COMMIT was sent:
    /// every record the transaction wrote is before it, its commit record after it.
    pub(super) at: Option<Position>,
    /// A logged write of the transaction proves a WAL record carrying its id before `at`.
    pub(super) logged: bool,
}

/// What [`ask`] found out.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// `txid_status` on `node` (the old primary, or the new one after a failover).
    Status { node: usize, committed: bool },
    /// After a failover to `node`: the transaction wrote past `switch`, where the old
    /// primary's timeline ends in the new primary's history. Its commit record is later
    /// still: it is not on the new timeline.
    Lost { node: usize, switch: Lsn },
}

/// Whom to ask about a transaction, from the cluster view now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Ask `txid_status` on this node.
    Ask(usize),
    /// The answer is known without asking.
    Answer(Answer),
    /// Not yet (no primary, or the new primary's history is not known): look again.
    Wait(&'static str),
    /// It cannot be known.
    Fail(&'static str),
}

/// Decide whom to ask about `x`, sent to `node` (pool generation `generation`), given the
/// current primary `primary` (and whether `node`'s pool generation is still the same).
///
/// * The same node, same generation: itself, as always.
/// * Another node, or the same one in a new generation, on a newer timeline: the
///   transaction's position translated through that primary's history —
///   [`Translation::Current`] (the switch point is at or past it: the new primary
///   replayed every record the transaction wrote, one of which carries its id, so its id
///   counter is past it and the id was not reused) asks the new primary, provided a
///   logged write proves such a record; [`Translation::Diverged`] is [`Answer::Lost`];
///   [`Translation::Unknown`] waits.
/// * The same node, same timeline, new generation (a restart): unknown, as before —
///   an id assigned without WAL may have been reused after a crash.
/// * Another node on the old timeline: the view has not caught up; wait.
pub(super) fn plan(
    view: &pgfresh_balancer::ClusterView,
    node: usize,
    same_generation: bool,
    x: &XidAt,
) -> Plan {
    let Some(primary) = view.primary else {
        return Plan::Wait("no primary is known");
    };
    if primary == node && same_generation {
        return Plan::Ask(node);
    }
    let Some(at) = x.at else {
        return Plan::Fail(
            "the primary changed and the transaction's timeline and position were not learned",
        );
    };
    match view.primary_timeline {
        None => Plan::Wait("the new primary's timeline is not known yet"),
        Some(t) if t == at.tli() && primary == node => Plan::Fail(
            "the primary restarted: an id it assigned without WAL may have been reused",
        ),
        Some(t) if t == at.tli() => Plan::Wait("the new primary's timeline is not known yet"),
        Some(_) => match view.translate(&at) {
            Translation::Current(_) if x.logged => Plan::Ask(primary),
            Translation::Current(_) => Plan::Fail(
                "the primary changed and no logged write of the transaction proves that the new primary knows its id \
                 (it wrote only unlogged or temporary relations, or none pgfresh could check)",
            ),
            Translation::Diverged { switch } => Plan::Answer(Answer::Lost {
                node: primary,
                switch,
            }),
            Translation::Unknown => {
                Plan::Wait("the new primary's timeline history is not known yet")
            }
        },
    }
}

/// Ask the primary — or the new primary after a failover, when that is sound ([`plan`])
/// — what became of transaction `x`, as the monitor user; `Err(why)` when it cannot be
/// known by `deadline`.
pub(super) async fn ask(
    shared: &Shared,
    node: usize,
    generation: u64,
    x: XidAt,
    deadline: Instant,
) -> Result<Answer, String> {
    let xid = x.xid;
    let work = async {
        let mut last_error: String;
        loop {
            let mut events = shared.balancer.subscribe();
            let same_generation = shared.pools.generation(node) == generation;
            let target = match plan(&shared.balancer.view(), node, same_generation, &x) {
                Plan::Ask(n) => n,
                Plan::Answer(a) => return Ok(a),
                Plan::Fail(why) => return Err(why.to_string()),
                Plan::Wait(why) => {
                    last_error = why.to_string();
                    // A change of the view, or a while (the history is read by polls
                    // that need not be announced).
                    tokio::select! {
                        r = events.recv() => {
                            if let Err(tokio::sync::broadcast::error::RecvError::Closed) = r {
                                return Err(last_error);
                            }
                        }
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                    continue;
                }
            };
            match query_status(shared, target, xid).await {
                Ok(Some(s)) if s == "committed" => {
                    return Ok(Answer::Status {
                        node: target,
                        committed: true,
                    })
                }
                Ok(Some(s)) if s == "aborted" => {
                    return Ok(Answer::Status {
                        node: target,
                        committed: false,
                    })
                }
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
    let xid = i64::try_from(xid).map_err(|e| e.to_string())?;
    let conn = MonitorConn::open(shared, Some(node), None, "pgfresh lost commit").await?;
    let row = conn
        .client
        .query_one("SELECT pg_catalog.txid_status($1)", &[&xid])
        .await
        .map_err(|e| pgfresh_balancer::describe_pg_error(&e));
    conn.close().await;
    row?.try_get::<_, Option<String>>(0)
        .map_err(|e| e.to_string())
}
