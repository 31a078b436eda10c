//! The transaction-id probe sent before a watched COMMIT, and its answer.

use pgfresh_lsn::Lsn;

/// The transaction-id probe pgfresh sends before a watched COMMIT: the id, the WAL
/// insert position, and whether a logged write proves the id is in the WAL (see
/// [`xid_probe`]).
pub const XID_PROBE: &str =
    "SELECT pg_catalog.txid_current_if_assigned(), pg_catalog.pg_current_wal_insert_lsn()";

/// At most this many of the transaction's written relations are checked by the probe.
pub(super) const PROBE_RELATIONS: usize = 8;

/// The probe for a transaction that wrote `writes` (as the session parsed them):
/// [`XID_PROBE`] and a third column, true when the transaction inserted, updated or
/// deleted a row of one of them that is a permanent (WAL-logged) relation — counted by
/// the transaction's own statistics (`pg_stat_get_xact_tuples_*`), resolved by the
/// session's own search path, so a temporary table shadowing a name is not mistaken for
/// it. Such a write put a WAL record carrying the transaction's id (or a subtransaction's,
/// which is newer) before the insert position. The column cannot fail: names go through
/// `format('%I')` and `to_regclass` (NULL for what does not exist), literals are `E''`.
pub fn xid_probe(writes: &[pgfresh_sql::RelName]) -> String {
    fn lit(s: &str) -> String {
        format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
    }
    let mut regs: Vec<String> = Vec::new();
    for w in writes {
        if w.name.contains('\0') || w.schema.as_deref().is_some_and(|s| s.contains('\0')) {
            continue;
        }
        let r = match &w.schema {
            Some(schema) => format!(
                "pg_catalog.to_regclass(pg_catalog.format('%I.%I', {}, {}))",
                lit(schema),
                lit(&w.name)
            ),
            None => format!(
                "pg_catalog.to_regclass(pg_catalog.quote_ident({}))",
                lit(&w.name)
            ),
        };
        if !regs.contains(&r) {
            regs.push(r);
        }
        if regs.len() == PROBE_RELATIONS {
            break;
        }
    }
    if regs.is_empty() {
        return format!("{XID_PROBE}, false");
    }
    format!(
        "{XID_PROBE}, EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid IN ({}) \
         AND c.relpersistence = 'p' AND pg_catalog.pg_stat_get_xact_tuples_inserted(c.oid) \
         + pg_catalog.pg_stat_get_xact_tuples_updated(c.oid) \
         + pg_catalog.pg_stat_get_xact_tuples_deleted(c.oid) > 0)",
        regs.join(", ")
    )
}

/// The answer of the transaction-id probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::session) struct ProbeRow {
    /// `None`: no id assigned (or an unreadable column).
    pub xid: Option<u64>,
    pub insert_lsn: Option<Lsn>,
    pub logged: bool,
}

/// Column `i` of a DataRow body as text: `None` for NULL, and for a column that is
/// missing, malformed or not UTF-8.
pub(in crate::session) fn text_column(body: &[u8], i: usize) -> Option<&str> {
    pgfresh_wire::backend::data_row_column(body, i)
        .ok()
        .flatten()
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// The probe's DataRow body: id (NULL when none is assigned), insert position, whether a
/// logged write proves the id. What is missing or unreadable is `None` / false.
pub(in crate::session) fn parse_probe(body: &[u8]) -> ProbeRow {
    let col = |i: usize| text_column(body, i);
    ProbeRow {
        xid: col(0).and_then(|t| t.parse().ok()),
        insert_lsn: col(1).and_then(|t| t.parse().ok()),
        logged: col(2) == Some("t"),
    }
}
