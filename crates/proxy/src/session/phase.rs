//! Where a session stands: its transaction ([`TxPhase`]) and the messages it is between
//! ([`WirePhase`]), each one enum.

use std::sync::Arc;

use pgfresh_sql::{Isolation, TxEffect, TxModes};
use pgfresh_wire::TxStatus;

/// A transaction BEGIN that pgfresh answered itself and will send to the node the
/// transaction's first real statement is routed to.
pub struct DeferredBegin {
    pub sql: String,
    pub analysis: Arc<pgfresh_sql::Analysis>,
}

/// The BEGIN that opens, on another node, the transaction an AND CHAIN began on a standby:
/// read-only (as every transaction a standby runs), with the isolation level and
/// deferrability the transaction before it named (`modes`); what it did not name comes
/// from the session's defaults, as it did for that one.
pub fn chained_begin(modes: &TxModes) -> String {
    let mut sql = String::from("BEGIN");
    if let Some(level) = modes.isolation {
        sql.push_str(match level {
            Isolation::ReadUncommitted => " ISOLATION LEVEL READ UNCOMMITTED",
            Isolation::ReadCommitted => " ISOLATION LEVEL READ COMMITTED",
            Isolation::RepeatableRead => " ISOLATION LEVEL REPEATABLE READ",
            Isolation::Serializable => " ISOLATION LEVEL SERIALIZABLE",
        });
    }
    sql.push_str(" READ ONLY");
    match modes.deferrable {
        Some(true) => sql.push_str(" DEFERRABLE"),
        Some(false) => sql.push_str(" NOT DEFERRABLE"),
        None => {}
    }
    sql
}

/// Asked in the transaction an AND CHAIN began on a standby: its characteristics, as
/// PostgreSQL gave them (those of the transaction before it, also where they came from
/// the session's defaults, which that transaction may have changed since).
pub const CHAIN_MODES_SQL: &str = "SELECT pg_catalog.current_setting('transaction_isolation'), \
     pg_catalog.current_setting('transaction_deferrable')";

/// The modes `CHAIN_MODES_SQL` answered (`transaction_isolation`,
/// `transaction_deferrable`), read-only as every transaction on a standby; `None` for
/// an answer that is not one.
pub fn chain_modes(isolation: Option<&str>, deferrable: Option<&str>) -> Option<TxModes> {
    let isolation = match isolation? {
        "read uncommitted" => Isolation::ReadUncommitted,
        "read committed" => Isolation::ReadCommitted,
        "repeatable read" => Isolation::RepeatableRead,
        "serializable" => Isolation::Serializable,
        _ => return None,
    };
    let deferrable = match deferrable? {
        "on" => true,
        "off" => false,
        _ => return None,
    };
    Some(TxModes {
        read_only: Some(true),
        isolation: Some(isolation),
        deferrable: Some(deferrable),
    })
}

/// The modes a transaction-control statement names for the transaction open on a server:
/// BEGIN names them anew, SET TRANSACTION changes those it names.
pub fn follow_modes(modes: &mut TxModes, stmt: &pgfresh_sql::Statement) {
    match &stmt.tx {
        Some(TxEffect::Begin(m)) => *modes = *m,
        Some(TxEffect::SetTransaction(m)) => {
            modes.read_only = m.read_only.or(modes.read_only);
            modes.isolation = m.isolation.or(modes.isolation);
            modes.deferrable = m.deferrable.or(modes.deferrable);
        }
        _ => {}
    }
}

/// The client's transaction, as the client last saw it.
pub enum TxPhase {
    /// No transaction is open.
    Idle,
    /// pgfresh answered `BEGIN` itself: the client is in a transaction that no server
    /// has seen yet. The BEGIN goes, just ahead of the transaction's first real
    /// statement, to the node that statement is routed to.
    Deferred(DeferredBegin),
    /// A transaction is open on a server.
    Open,
    /// The open transaction failed: the server ignores everything up to its end.
    Failed,
}

impl TxPhase {
    /// The phase a server's ReadyForQuery reports.
    pub fn from_server(status: TxStatus) -> TxPhase {
        match status {
            TxStatus::Idle => TxPhase::Idle,
            TxStatus::InTransaction => TxPhase::Open,
            TxStatus::Failed => TxPhase::Failed,
        }
    }

    /// The status a ReadyForQuery to the client carries.
    pub fn status(&self) -> TxStatus {
        match self {
            TxPhase::Idle => TxStatus::Idle,
            TxPhase::Deferred(_) | TxPhase::Open => TxStatus::InTransaction,
            TxPhase::Failed => TxStatus::Failed,
        }
    }

    pub fn is_idle(&self) -> bool {
        matches!(self, TxPhase::Idle)
    }

    /// A transaction runs on a server (not only the BEGIN pgfresh answered itself).
    pub fn on_server(&self) -> bool {
        matches!(self, TxPhase::Open | TxPhase::Failed)
    }

    /// The BEGIN pgfresh answered, now to be sent: the transaction is then open on the
    /// server it goes to.
    pub fn take_deferred(&mut self) -> Option<DeferredBegin> {
        match std::mem::replace(self, TxPhase::Open) {
            TxPhase::Deferred(begin) => Some(begin),
            other => {
                *self = other;
                None
            }
        }
    }

    pub fn deferred(&self) -> Option<&DeferredBegin> {
        match self {
            TxPhase::Deferred(begin) => Some(begin),
            _ => None,
        }
    }

    /// The deferred BEGIN, now to open a transaction with `modes`.
    pub fn defer_with(&mut self, modes: &TxModes) {
        if let TxPhase::Deferred(begin) = self {
            begin.sql = chained_begin(modes);
            begin.analysis = Arc::new(pgfresh_sql::analyze_uncached(&begin.sql));
        }
    }
}

/// Where the client's messages stand between units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WirePhase {
    /// A unit starts with the client's next message and ends at its Sync or Query.
    Units,
    /// An extended batch went out up to a Flush (or early, past the batch limit): the
    /// rest of it, up to its Sync, goes to the same node.
    OpenBatch(usize),
    /// COPY FROM STDIN runs on the active backend, which ignores Syncs until CopyDone or
    /// CopyFail. Started by an extended batch (`Some` node), that batch goes on to its
    /// Sync on the same node afterwards.
    CopyIn(Option<usize>),
}

impl WirePhase {
    /// The node the open batch continues on.
    pub fn batch_node(&self) -> Option<usize> {
        match *self {
            WirePhase::OpenBatch(n) | WirePhase::CopyIn(Some(n)) => Some(n),
            _ => None,
        }
    }

    pub fn copy_in(&self) -> bool {
        matches!(self, WirePhase::CopyIn(_))
    }

    /// A unit went out to `node` leaving its batch open (or, `None`, closed it).
    pub fn set_batch(&mut self, node: Option<usize>) {
        *self = match *self {
            WirePhase::CopyIn(_) => WirePhase::CopyIn(node),
            _ => node.map_or(WirePhase::Units, WirePhase::OpenBatch),
        };
    }

    /// The server started COPY FROM STDIN: for an extended batch's unit, on `node`,
    /// whose batch now stays open until the client's Sync after the copy.
    pub fn copy_started(&mut self, extended_on: Option<usize>) {
        *self = WirePhase::CopyIn(extended_on.or(self.batch_node()));
    }

    /// CopyDone or CopyFail went to the server.
    pub fn copy_ended(&mut self) {
        if let WirePhase::CopyIn(batch) = *self {
            *self = batch.map_or(WirePhase::Units, WirePhase::OpenBatch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begin() -> DeferredBegin {
        DeferredBegin {
            sql: "BEGIN".into(),
            analysis: Arc::new(pgfresh_sql::analyze_uncached("BEGIN")),
        }
    }

    #[test]
    fn a_deferred_begin_is_a_transaction_to_the_client_and_none_on_a_server() {
        let mut phase = TxPhase::Deferred(begin());
        assert_eq!(phase.status(), TxStatus::InTransaction);
        assert!(!phase.is_idle() && !phase.on_server());
        assert_eq!(phase.deferred().map(|b| b.sql.as_str()), Some("BEGIN"));
        assert!(phase.take_deferred().is_some());
        assert!(phase.on_server() && phase.take_deferred().is_none());
        assert_eq!(phase.status(), TxStatus::InTransaction);
    }

    #[test]
    fn a_chained_begin_keeps_the_modes_named_and_is_read_only() {
        let mut modes = TxModes::default();
        assert_eq!(chained_begin(&modes), "BEGIN READ ONLY");
        let stmt = |sql: &str| pgfresh_sql::analyze_uncached(sql).statements.remove(0);
        follow_modes(&mut modes, &stmt("BEGIN ISOLATION LEVEL REPEATABLE READ"));
        follow_modes(&mut modes, &stmt("SET TRANSACTION READ ONLY DEFERRABLE"));
        follow_modes(&mut modes, &stmt("SELECT 1"));
        assert_eq!(
            chained_begin(&modes),
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY DEFERRABLE"
        );
        // A BEGIN names the modes of a new transaction.
        follow_modes(&mut modes, &stmt("START TRANSACTION READ ONLY"));
        let begin = chained_begin(&modes);
        assert_eq!(begin, "BEGIN READ ONLY");
        // It reads back as what it says.
        let analysis = pgfresh_sql::analyze_uncached(&begin);
        let read_only = TxModes {
            read_only: Some(true),
            ..TxModes::default()
        };
        assert_eq!(analysis.statements[0].tx, Some(TxEffect::Begin(read_only)));
    }

    #[test]
    fn the_modes_a_standby_answers_make_the_chained_begin() {
        let modes = chain_modes(Some("repeatable read"), Some("off")).unwrap();
        assert_eq!(
            chained_begin(&modes),
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY NOT DEFERRABLE"
        );
        let mut phase = TxPhase::Deferred(begin());
        phase.defer_with(&chain_modes(Some("read committed"), Some("on")).unwrap());
        let sql = phase.deferred().map(|b| b.sql.clone()).unwrap_or_default();
        assert_eq!(
            sql,
            "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY DEFERRABLE"
        );
        assert!(chain_modes(Some("snapshot"), Some("on")).is_none());
        assert!(chain_modes(Some("read committed"), None).is_none());
        // Only a deferred BEGIN takes them.
        let mut idle = TxPhase::Idle;
        idle.defer_with(&modes);
        assert!(idle.is_idle());
    }

    #[test]
    fn the_server_status_maps_to_its_phase() {
        for s in [TxStatus::Idle, TxStatus::InTransaction, TxStatus::Failed] {
            assert_eq!(TxPhase::from_server(s).status(), s);
        }
        assert!(TxPhase::Idle.take_deferred().is_none());
    }

    #[test]
    fn a_copy_started_by_an_extended_batch_leaves_the_batch_open_after_it() {
        let mut w = WirePhase::Units;
        w.copy_started(Some(2));
        assert!(w.copy_in() && w.batch_node() == Some(2));
        w.copy_ended();
        assert_eq!(w, WirePhase::OpenBatch(2));
        w.set_batch(None);
        assert_eq!(w, WirePhase::Units);
        // A simple COPY keeps what was open; closing a batch keeps the copy.
        let mut w = WirePhase::OpenBatch(1);
        w.copy_started(None);
        assert_eq!(w, WirePhase::CopyIn(Some(1)));
        w.set_batch(None);
        assert_eq!(w, WirePhase::CopyIn(None));
        w.copy_ended();
        assert_eq!(w, WirePhase::Units);
    }
}
