//! Session settings follow a session only once the server confirmed them: a SET that
//! fails, or whose transaction (or savepoint) is rolled back, is never replayed on
//! another node, and one setting a node refuses does not undo the others.

use pgfresh_tests::*;

const SHOWN: &str = "SELECT inet_server_port(), current_setting('work_mem'), \
     current_setting('statement_timeout'), current_setting('search_path'), \
     current_setting('lock_timeout'), current_setting('maintenance_work_mem'), \
     current_setting('idle_in_transaction_session_timeout'), \
     current_setting('default_transaction_read_only')";

type Shown = Vec<String>;

async fn shown(c: &tokio_postgres::Client, prefix: &str) -> (u16, Shown) {
    let row = simple_row(c, &format!("{prefix}{SHOWN}")).await;
    let port: u16 = row.get(0).unwrap().parse().unwrap();
    let values = (1..row.len())
        .map(|i| row.get(i).unwrap_or("").to_string())
        .collect();
    (port, values)
}

/// Every read on a replica shows exactly what the primary shows, and replicas served
/// some of them.
async fn replicas_agree_with_primary(c: &tokio_postgres::Client, expected: &[&str]) {
    let (port, primary) = shown(c, "/* pgfresh:primary */ ").await;
    assert_eq!(port, node_port(0));
    assert_eq!(primary, expected, "the primary's settings");
    let mut on_replicas = 0;
    for _ in 0..30 {
        let (port, values) = shown(c, "").await;
        if port != node_port(0) {
            on_replicas += 1;
        }
        assert_eq!(values, primary, "settings on node with port {port}");
    }
    assert!(on_replicas > 0, "no read reached a replica");
}

async fn must_fail(c: &tokio_postgres::Client, sql: &str) {
    assert!(c.batch_execute(sql).await.is_err(), "{sql} should fail");
}

#[tokio::test]
async fn only_confirmed_and_committed_settings_are_replayed() {
    let c = proxy().connect().await;
    // Confirmed in autocommit: kept.
    c.batch_execute("SET work_mem = '5MB'").await.unwrap();
    // Rolled back, in one query and statement by statement.
    c.batch_execute("BEGIN; SET statement_timeout = '7s'; ROLLBACK")
        .await
        .unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute("SET statement_timeout = '8s'")
        .await
        .unwrap();
    c.batch_execute("ROLLBACK").await.unwrap();
    // A savepoint rolled back; what follows it commits.
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute("SAVEPOINT s").await.unwrap();
    c.batch_execute("SET search_path = nowhere, public")
        .await
        .unwrap();
    c.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
    c.batch_execute("SET lock_timeout = '3s'").await.unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    // A transaction that failed: its COMMIT is a rollback.
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute("SET maintenance_work_mem = '99MB'")
        .await
        .unwrap();
    must_fail(&c, "SELECT 1/0").await;
    let _ = c.batch_execute("COMMIT").await;
    // Statements the server refuses.
    must_fail(&c, "SET no_such_setting = 1").await;
    must_fail(&c, "SET statement_timeout = 'abc'").await;
    must_fail(&c, "SET search_path = 1 2").await;
    // A good SET in the same implicit transaction as a failing statement.
    must_fail(&c, "SET statement_timeout = '9s'; SELECT 1/0").await;
    // set_config(..., false) in a rolled-back transaction, then committed.
    c.batch_execute("BEGIN; SELECT set_config('work_mem', '11MB', false); ROLLBACK")
        .await
        .unwrap();
    // Extended protocol: confirmed, and rolled back.
    c.execute("SET idle_in_transaction_session_timeout = '9s'", &[])
        .await
        .unwrap();
    c.execute("BEGIN", &[]).await.unwrap();
    c.execute("SET maintenance_work_mem = '98MB'", &[])
        .await
        .unwrap();
    c.execute("ROLLBACK", &[]).await.unwrap();
    replicas_agree_with_primary(
        &c,
        &["5MB", "0", "\"$user\", public", "3s", "64MB", "9s", "off"],
    )
    .await;
    // A committed set_config and SET SESSION CHARACTERISTICS are replayed too.
    c.batch_execute(
        "BEGIN; SELECT set_config('work_mem', '12MB', false); COMMIT; \
         SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    )
    .await
    .unwrap();
    replicas_agree_with_primary(
        &c,
        &["12MB", "0", "\"$user\", public", "3s", "64MB", "9s", "on"],
    )
    .await;
}

/// `transaction_read_only = off` is accepted by the primary and refused by a standby
/// ("cannot set transaction read-write mode during recovery"): replaying it on a
/// replica fails, and must not undo the session's other settings there.
#[tokio::test]
async fn a_setting_a_replica_refuses_does_not_undo_the_others() {
    let c = proxy().connect().await;
    c.batch_execute("SET work_mem = '6MB'").await.unwrap();
    c.batch_execute("SET transaction_read_only = off")
        .await
        .unwrap();
    c.batch_execute("SET lock_timeout = '4s'").await.unwrap();
    let mut on_replicas = 0;
    for _ in 0..30 {
        let (port, values) = shown(&c, "").await;
        if port != node_port(0) {
            on_replicas += 1;
        }
        assert_eq!(values[0], "6MB", "work_mem on port {port}");
        assert_eq!(values[3], "4s", "lock_timeout on port {port}");
    }
    assert!(on_replicas > 0, "no read reached a replica");
}
