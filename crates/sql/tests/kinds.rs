//! Statement kinds with their relations: reads, writes, DDL, utility, EXPLAIN.

#[macro_use]
mod common;

use pgfresh_sql::MustPrimary as M;

#[test]
fn reads() {
    let n = common::run(&[
        case!("SELECT 1", Read, [], [], []),
        case!("select * from orders", Read, ["orders"], [], []),
        case!(
            "SELECT id FROM app.orders WHERE id = $1",
            Read,
            ["app.orders"],
            [],
            []
        ),
        case!("VALUES (1, 2), (3, 4)", Read, [], [], []),
        case!("TABLE orders", Read, ["orders"], [], []),
        case!(
            "SELECT count(*) FROM orders GROUP BY status HAVING count(*) > 1",
            Read,
            ["orders"],
            [],
            []
        ),
        case!(
            "SELECT now(), random(), clock_timestamp(), gen_random_uuid()",
            Read,
            [],
            [],
            []
        ),
        case!("SELECT pg_sleep(0.1)", Read, [], [], []),
        case!(
            "SELECT current_setting('search_path'), version()",
            Read,
            [],
            [],
            []
        ),
        case!(
            "SELECT * FROM a UNION ALL SELECT * FROM b EXCEPT SELECT * FROM c",
            Read,
            ["a", "b", "c"],
            [],
            []
        ),
        case!(
            "SELECT * FROM t ORDER BY id LIMIT 10 OFFSET 5",
            Read,
            ["t"],
            [],
            []
        ),
        case!("SHOW search_path", Read, [], [], []),
        case!("SELECT txid_current_snapshot()", Read, [], [], []),
        case!(
            "SELECT * FROM orders FOR UPDATE SKIP LOCKED",
            Read,
            ["orders"],
            [],
            [M::LockingClause]
        ),
    ]);
    assert_eq!(n, 14);
}

#[test]
fn writes() {
    let n = common::run(&[
        case!("INSERT INTO orders (id) VALUES (1)", Write, [], ["orders"], []),
        case!("INSERT INTO app.orders SELECT * FROM staging", Write, ["staging"], ["app.orders"], []),
        case!("INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET v = excluded.v", Write, [], ["t"], []),
        case!("INSERT INTO t VALUES (1) RETURNING id", Write, [], ["t"], []),
        case!("UPDATE orders SET total = 0 WHERE id = 1", Write, [], ["orders"], []),
        case!("UPDATE orders o SET total = p.amount FROM payments p WHERE p.order_id = o.id", Write, ["payments"], ["orders"], []),
        case!("DELETE FROM orders WHERE id IN (SELECT order_id FROM refunds)", Write, ["refunds"], ["orders"], []),
        case!("DELETE FROM orders USING customers c WHERE c.id = orders.cid", Write, ["customers"], ["orders"], []),
        case!("MERGE INTO stock s USING deliveries d ON s.item = d.item WHEN MATCHED THEN UPDATE SET qty = s.qty + d.qty WHEN NOT MATCHED THEN INSERT VALUES (d.item, d.qty)", Write, ["deliveries"], ["stock"], []),
        case!("TRUNCATE a, app.b", Write, [], ["a", "app.b"], []),
        case!("COPY orders FROM STDIN", Write, [], ["orders"], [M::CopyFrom]),
        case!("COPY orders (id, total) FROM STDIN WITH (FORMAT csv)", Write, [], ["orders"], [M::CopyFrom]),
        case!("COPY orders TO STDOUT", Read, ["orders"], [], []),
        case!("COPY (SELECT * FROM orders) TO STDOUT", Read, ["orders"], [], []),
        case!("COPY orders TO '/tmp/x.csv'", Read, ["orders"], [], [M::CopyServerFile]),
        case!("COPY (INSERT INTO t VALUES (1) RETURNING *) TO STDOUT", Write, [], ["t"], []),
        case!("SELECT * INTO newt FROM orders", Write, ["orders"], ["newt"], [M::SelectInto]),
        case!("CREATE TABLE summary AS SELECT status, count(*) FROM orders GROUP BY 1", Write, ["orders"], ["summary"], []),
        case!("CREATE MATERIALIZED VIEW mv AS SELECT * FROM orders", Write, ["orders"], ["mv"], []),
        case!("REFRESH MATERIALIZED VIEW CONCURRENTLY app.mv", Write, [], ["app.mv"], []),
        case!("WITH moved AS (DELETE FROM a RETURNING *) INSERT INTO b SELECT * FROM moved", Write, [], ["a", "b"], [M::WritableCte]),
        case!("CALL process_orders(1)", Write, [], [], [M::CallProcedure]),
        case!("DO $$BEGIN PERFORM 1; END$$", Write, [], [], [M::DoBlock]),
    ]);
    assert_eq!(n, 23);
}

#[test]
fn ddl_and_utility() {
    let n = common::run(&[
        case!("CREATE TABLE t (id int primary key)", Ddl, [], ["t"], []),
        case!(
            "CREATE TABLE IF NOT EXISTS app.t (id int)",
            Ddl,
            [],
            ["app.t"],
            []
        ),
        case!(
            "CREATE TABLE p1 PARTITION OF parent FOR VALUES IN (1)",
            Ddl,
            [],
            ["p1", "parent"],
            []
        ),
        case!(
            "ALTER TABLE orders ADD COLUMN note text",
            Ddl,
            [],
            ["orders"],
            []
        ),
        case!("DROP TABLE a, app.b", Ddl, [], ["a", "app.b"], []),
        case!("DROP VIEW IF EXISTS v", Ddl, [], ["v"], []),
        case!(
            "CREATE INDEX CONCURRENTLY i ON orders (id)",
            Ddl,
            [],
            ["orders"],
            []
        ),
        case!(
            "CREATE VIEW v AS SELECT * FROM orders",
            Ddl,
            ["orders"],
            ["v"],
            []
        ),
        case!("CREATE SEQUENCE s", Ddl, [], ["s"], []),
        case!(
            "ALTER TABLE orders RENAME TO orders_old",
            Ddl,
            [],
            ["orders"],
            []
        ),
        case!(
            "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            Ddl,
            [],
            [],
            []
        ),
        case!("GRANT SELECT ON orders TO app", Ddl, [], [], []),
        case!("COMMENT ON TABLE orders IS 'x'", Ddl, [], [], []),
        case!("CREATE SCHEMA app", Ddl, [], [], []),
        case!("CREATE EXTENSION pgcrypto", Ddl, [], [], []),
        case!("ALTER SYSTEM SET work_mem = '64MB'", Ddl, [], [], []),
        case!("CREATE DATABASE d", Ddl, [], [], []),
        case!("VACUUM ANALYZE orders", Utility, ["orders"], [], []),
        case!("VACUUM", Utility, [], [], []),
        case!("ANALYZE app.orders", Utility, ["app.orders"], [], []),
        case!("CHECKPOINT", Utility, [], [], []),
        case!(
            "CLUSTER orders USING orders_pkey",
            Utility,
            ["orders"],
            [],
            []
        ),
        case!("REINDEX TABLE orders", Utility, ["orders"], [], []),
        case!("LOAD 'auto_explain'", Utility, [], [], []),
        case!(
            "LOCK TABLE orders IN ACCESS EXCLUSIVE MODE",
            Utility,
            ["orders"],
            [],
            [M::Lock]
        ),
    ]);
    assert_eq!(n, 25);
}

#[test]
fn explain() {
    let n = common::run(&[
        case!("EXPLAIN SELECT * FROM orders", Read, ["orders"], [], []),
        case!("EXPLAIN UPDATE orders SET x = 1", Read, ["orders"], [], []),
        case!(
            "EXPLAIN SELECT nextval('s') FROM orders FOR UPDATE",
            Read,
            ["orders", "s"],
            [],
            []
        ),
        case!(
            "EXPLAIN ANALYZE SELECT * FROM orders",
            Read,
            ["orders"],
            [],
            []
        ),
        case!(
            "EXPLAIN (ANALYZE, BUFFERS) DELETE FROM orders",
            Write,
            [],
            ["orders"],
            [M::ExplainAnalyzeWrite]
        ),
        case!(
            "EXPLAIN ANALYZE INSERT INTO t VALUES (1)",
            Write,
            [],
            ["t"],
            [M::ExplainAnalyzeWrite]
        ),
        case!(
            "EXPLAIN (ANALYZE false) DELETE FROM orders",
            Read,
            ["orders"],
            [],
            []
        ),
        case!(
            "EXPLAIN (ANALYZE off, COSTS off) INSERT INTO t VALUES (1)",
            Read,
            ["t"],
            [],
            []
        ),
        case!(
            "EXPLAIN ANALYZE SELECT * FROM orders FOR UPDATE",
            Read,
            ["orders"],
            [],
            [M::LockingClause]
        ),
        case!(
            "EXPLAIN ANALYZE WITH x AS (UPDATE t SET a = 1 RETURNING *) SELECT * FROM x",
            Write,
            [],
            ["t"],
            [M::WritableCte, M::ExplainAnalyzeWrite]
        ),
        case!(
            "EXPLAIN ANALYZE CREATE TABLE t2 AS SELECT * FROM t",
            Write,
            ["t"],
            ["t2"],
            [M::ExplainAnalyzeWrite]
        ),
    ]);
    assert_eq!(n, 11);
}

#[test]
fn a_do_block_and_commit_prepared_may_write_anything() {
    let a = pgfresh_sql::analyze_uncached("DO $$BEGIN UPDATE t SET x = 1; END$$");
    assert!(a.statements[0].writes_unnamed);
    let commit = pgfresh_sql::analyze_uncached("COMMIT PREPARED 'g'");
    assert!(commit.statements[0].writes_unnamed);
    let prepare = pgfresh_sql::analyze_uncached("PREPARE TRANSACTION 'g'");
    assert!(!prepare.statements[0].writes_unnamed);
    let truncate = pgfresh_sql::analyze_uncached("TRUNCATE t");
    assert!(!truncate.statements[0].writes_unnamed);
    for sql in [
        "TRUNCATE t CASCADE",
        "TRUNCATE t RESTART IDENTITY",
        "TRUNCATE ONLY a, b RESTART IDENTITY RESTRICT",
    ] {
        let a = pgfresh_sql::analyze_uncached(sql);
        assert!(a.statements[0].writes_unnamed, "{sql}");
    }
    let continued = pgfresh_sql::analyze_uncached("TRUNCATE t CONTINUE IDENTITY");
    assert!(!continued.statements[0].writes_unnamed);
    for (sql, unnamed) in [
        ("ALTER TABLE t ALTER COLUMN id RESTART WITH 1", true),
        ("ALTER TABLE t ALTER COLUMN id RESTART", true),
        ("ALTER TABLE t ALTER COLUMN id SET INCREMENT BY 2", true),
        ("ALTER TABLE t ALTER COLUMN id SET NOT NULL", false),
        ("ALTER TABLE t ADD COLUMN n int", false),
    ] {
        let a = pgfresh_sql::analyze_uncached(sql);
        assert_eq!(a.statements[0].writes_unnamed, unnamed, "{sql}");
    }
}

#[test]
fn a_sequence_named_at_run_time_may_be_any_relation() {
    for sql in [
        "SELECT nextval(pg_get_serial_sequence('t', 'id'))",
        "SELECT setval(pg_get_serial_sequence('t', 'id'), 10)",
        "SELECT nextval($1)",
        "INSERT INTO t(id) VALUES (nextval('seq_' || 'a'))",
        "SELECT nextval(16400)",
    ] {
        let a = pgfresh_sql::analyze_uncached(sql);
        assert!(a.statements[0].writes_unnamed, "{sql}");
    }
    for sql in [
        "SELECT nextval('s')",
        "SELECT currval('s')",
        "SELECT lastval()",
    ] {
        let a = pgfresh_sql::analyze_uncached(sql);
        assert!(!a.statements[0].writes_unnamed, "{sql}");
    }
}

#[test]
fn sql_run_over_dblink_may_write_anything() {
    for sql in [
        "SELECT dblink_exec('dbname=app', 'UPDATE audit SET n = n + 1')",
        "SELECT public.dblink_exec('UPDATE audit SET n = n + 1')",
        "SELECT * FROM dblink('dbname=app', 'INSERT INTO t VALUES (1) RETURNING id') AS r(id int)",
        "SELECT dblink_send_query('conn', 'DELETE FROM t')",
        "SELECT dblink_exec('dbname=app', $1)",
        "SELECT dblink_exec('dbname=app', 'SELECT app.bump()')",
    ] {
        let a = pgfresh_sql::analyze_uncached(sql);
        assert!(a.statements[0].writes_unnamed, "{sql}");
    }
    for sql in [
        "SELECT * FROM dblink('dbname=app', 'SELECT id FROM t') AS r(id int)",
        "SELECT dblink_connect('conn', 'dbname=app')",
        "SELECT dblink_get_result('conn')",
    ] {
        let a = pgfresh_sql::analyze_uncached(sql);
        assert!(!a.statements[0].writes_unnamed, "{sql}");
    }
}
