//! Must-primary reasons, including the routing failures users reported against other proxies.

#[macro_use]
mod common;

use pgfresh_sql::{analyze_uncached, Kind, MustPrimary as M, RelName};

#[test]
fn reported_failures_of_other_proxies() {
    let n = common::run(&[
        // A CTE containing UPDATE sent to a replica.
        case!("WITH u AS (UPDATE accounts SET balance = balance - 1 WHERE id = 1 RETURNING *) SELECT * FROM u", Write, [], ["accounts"], [M::WritableCte]),
        // SELECT ... FOR NO KEY UPDATE sent to a replica.
        case!("SELECT * FROM accounts WHERE id = 1 FOR NO KEY UPDATE", Read, ["accounts"], [], [M::LockingClause]),
        // txid_current() routed to a standby.
        case!("SELECT txid_current()", Read, [], [], [M::TxidFunction("txid_current".into())]),
        // A parse failure treated as a read.
        case!("SELEC * FROM accounts", Unclassified, [], [], []),
    ]);
    assert_eq!(n, 4);
    assert!(!analyze_uncached("SELECT * FROM accounts FOR NO KEY UPDATE").is_standby_safe());
    assert!(
        !analyze_uncached("WITH u AS (UPDATE a SET x = 1 RETURNING *) SELECT * FROM u")
            .is_standby_safe()
    );
}

#[test]
fn must_primary_reasons() {
    let seq = |s: &str| M::Sequence(s.into());
    let n = common::run(&[
        case!("SELECT * FROM t FOR UPDATE", Read, ["t"], [], [M::LockingClause]),
        case!("SELECT * FROM t FOR SHARE", Read, ["t"], [], [M::LockingClause]),
        case!("SELECT * FROM t FOR KEY SHARE NOWAIT", Read, ["t"], [], [M::LockingClause]),
        case!("SELECT * FROM t JOIN u ON t.id = u.id FOR UPDATE OF t", Read, ["t", "u"], [], [M::LockingClause]),
        case!("SELECT * FROM (SELECT * FROM t FOR UPDATE) s", Read, ["t"], [], [M::LockingClause]),
        case!("SELECT * FROM t WHERE id IN (SELECT id FROM u FOR SHARE)", Read, ["t", "u"], [], [M::LockingClause]),
        case!("SELECT nextval('order_seq')", Read, [], ["order_seq"], [seq("nextval")]),
        case!("SELECT setval('s', 10)", Read, [], ["s"], [seq("setval")]),
        case!("SELECT setval('App.\"S\"'::regclass, 10)", Read, [], ["app.\"S\""], [seq("setval")]),
        case!("SELECT nextval(pg_get_serial_sequence('t', 'id'))", Read, [], [], [seq("nextval")]),
        case!("SELECT currval('s')", Read, [], [], [seq("currval")]),
        case!("SELECT lastval()", Read, [], [], [seq("lastval")]),
        case!("SELECT pg_catalog.nextval('s')", Read, [], ["s"], [seq("nextval")]),
        case!("INSERT INTO t (id) VALUES (nextval('s'))", Write, [], ["s", "t"], [seq("nextval")]),
        case!("SELECT pg_advisory_lock(1)", Read, [], [], [M::AdvisoryLock { session_level: true }]),
        case!("SELECT pg_try_advisory_lock(1, 2)", Read, [], [], [M::AdvisoryLock { session_level: true }]),
        case!("SELECT pg_advisory_xact_lock(1)", Read, [], [], [M::AdvisoryLock { session_level: false }]),
        case!("SELECT pg_try_advisory_xact_lock_shared(1)", Read, [], [], [M::AdvisoryLock { session_level: false }]),
        case!("SELECT pg_advisory_unlock_all()", Read, [], [], [M::AdvisoryLock { session_level: true }]),
        case!("SELECT pg_notify('ch', 'x')", Read, [], [], [M::Notify]),
        case!("SELECT txid_current_if_assigned()", Read, [], [], [M::TxidFunction("txid_current_if_assigned".into())]),
        case!("SELECT pg_current_xact_id()", Read, [], [], [M::TxidFunction("pg_current_xact_id".into())]),
        case!("SELECT set_config('app.user', '42', false)", Read, [], [], [M::SetConfig]),
        case!("SELECT lo_import('/tmp/x')", Read, [], ["pg_catalog.pg_largeobject"], [M::BuiltinWriter("lo_import".into())]),
        case!("SELECT lo_put(7, 0, 'x')", Read, [], ["pg_catalog.pg_largeobject"], [M::BuiltinWriter("lo_put".into())]),
        case!("SELECT pg_catalog.lo_unlink(7)", Read, [], ["pg_catalog.pg_largeobject"], [M::BuiltinWriter("lo_unlink".into())]),
        case!("SELECT lowrite(0, 'x')", Read, [], ["pg_catalog.pg_largeobject"], [M::BuiltinWriter("lowrite".into())]),
        case!("SELECT lo_get(7)", Read, ["pg_catalog.pg_largeobject"], [], []),
        case!("SELECT loread(0, 10)", Read, ["pg_catalog.pg_largeobject"], [], []),
        case!("SELECT app.lo_get(7)", Read, [], [], []),
        case!("SELECT pg_switch_wal()", Read, [], [], [M::BuiltinWriter("pg_switch_wal".into())]),
        case!("SELECT pg_current_wal_lsn()", Read, [], [], [M::BuiltinWriter("pg_current_wal_lsn".into())]),
        case!("SELECT pg_terminate_backend(123)", Read, [], [], [M::BuiltinWriter("pg_terminate_backend".into())]),
        case!("SELECT pg_is_in_recovery()", Read, [], [], [M::ServerState("pg_is_in_recovery".into())]),
        case!("SHOW transaction_read_only", Read, [], [], [M::ServerState("transaction_read_only".into())]),
        case!("SELECT * FROM t WHERE id = (SELECT nextval('s'))", Read, ["t"], ["s"], [seq("nextval")]),
        case!("SELECT CASE WHEN x THEN pg_advisory_xact_lock(1) END FROM t", Read, ["t"], [], [M::AdvisoryLock { session_level: false }]),
        case!("SELECT coalesce(nextval('s'), 0)", Read, [], ["s"], [seq("nextval")]),
        case!("SELECT count(*) FILTER (WHERE nextval('s') > 0) FROM t", Read, ["t"], ["s"], [seq("nextval")]),
        case!("SELECT * FROM generate_series(1, nextval('s'))", Read, [], ["s"], [seq("nextval")]),
        case!("WITH x AS (SELECT * FROM t FOR UPDATE) SELECT * FROM x", Read, ["t"], [], [M::LockingClause]),
        case!("WITH RECURSIVE r AS (SELECT 1 UNION ALL SELECT 1 FROM r, LATERAL (DELETE FROM t RETURNING 1) d) SELECT * FROM r", Unclassified, [], [], []),
        case!("SELECT * FROM t WHERE EXISTS (WITH d AS (DELETE FROM u RETURNING 1) SELECT 1 FROM d)", Write, ["t"], ["u"], [M::WritableCte]),
        case!("WITH a AS (WITH b AS (INSERT INTO deep VALUES (1) RETURNING *) SELECT * FROM b) SELECT * FROM a", Write, [], ["deep"], [M::WritableCte]),
        case!("WITH m AS (MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE RETURNING t.id) SELECT * FROM m", Write, ["s"], ["t"], [M::WritableCte]),
        case!("SELECT * FROM pg_temp.scratch", Read, ["pg_temp.scratch"], [], [M::TempRelation(RelName::new(Some("pg_temp"), "scratch"))]),
        case!("SET default_transaction_isolation = 'serializable'", Session, [], [], [M::SerializableTxn]),
    ]);
    assert_eq!(n, 47);
}

#[test]
fn catalog_reads_are_flagged() {
    for (sql, flagged) in [
        ("SELECT * FROM pg_class", true),
        ("SELECT * FROM pg_catalog.pg_namespace n", true),
        ("SELECT table_name FROM information_schema.tables", true),
        (
            "SELECT * FROM orders o JOIN pg_stat_activity a ON true",
            true,
        ),
        ("SELECT * FROM orders", false),
        ("SELECT * FROM app.pg_like_name", false),
        // Built-ins and casts that look names up in the catalogs.
        ("SELECT to_regclass('orders')", true),
        ("SELECT pg_catalog.pg_get_viewdef('v'::regclass)", true),
        ("SELECT has_table_privilege('orders', 'SELECT')", true),
        ("SELECT pg_total_relation_size('orders')", true),
        ("SELECT 'orders'::regclass::oid", true),
        ("SELECT $1::pg_catalog.regtype", true),
        ("SELECT obj_description(1, 'pg_class')", true),
        ("SELECT lower('x'), '1'::int4, now()", false),
        ("SELECT app.to_regclass('orders')", false),
    ] {
        let a = analyze_uncached(sql);
        assert_eq!(a.touches_catalog, flagged, "{sql}");
        assert_eq!(a.statements[0].touches_catalog, flagged, "{sql}");
        assert_eq!(a.kind, Kind::Read, "{sql}");
    }
}
