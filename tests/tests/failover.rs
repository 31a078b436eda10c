//! Failover and replica failures, each test on a private cluster it may break.

use std::time::Duration;

use pgfresh_tests::*;

#[tokio::test]
async fn replica_failure_before_any_reply_is_retried_and_failover_keeps_idle_sessions() {
    let cluster = private_cluster();
    let p = start_proxy(&config_text_for(&cluster, ""));
    table_f(&cluster, &p).await;

    // 1. A replica killing the backend that runs an autocommit read, before any row was
    //    sent: the read is answered from another node, the client sees no error.
    let reader = p.connect().await;
    reader
        .batch_execute("SET application_name = 'retry_probe'")
        .await
        .unwrap();
    let query = tokio::spawn(async move {
        let r = reader
            .query_one("SELECT v, pg_sleep(1)::text FROM f WHERE id = 1", &[])
            .await;
        (reader, r)
    });
    let kill = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                WHERE application_name = 'retry_probe' AND state = 'active'";
    let mut killed = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !killed && std::time::Instant::now() < deadline && !query.is_finished() {
        for i in 1..=2 {
            // Kill once only: the retry may land on the other replica.
            if killed {
                break;
            }
            killed = cluster
                .psql(i, "app", kill)
                .map(|n| n != "0")
                .unwrap_or(false);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_reader, result) = query.await.unwrap();
    let row = result.expect("the read was retried on another node");
    assert_eq!(row.get::<_, String>(0), "one");
    assert!(killed, "the probe query never ran on a replica");

    failover_keeps_idle_sessions(&cluster, &p).await;
    drop(p);
    drop(cluster);
}

/// Table `f` with row 1, replicated and cold.
async fn table_f(cluster: &pgfresh_localcluster::LocalCluster, p: &ProxyHandle) {
    let setup = p.connect().await;
    setup
        .batch_execute(
            "CREATE TABLE f(id int primary key, v text); INSERT INTO f VALUES (1, 'one')",
        )
        .await
        .unwrap();
    wait_replicated_on(cluster, &setup).await;
    p.wait_cold(&["f"]).await;
}

#[tokio::test]
async fn transaction_mode_failover_keeps_idle_sessions() {
    let cluster = private_cluster();
    let p = start_proxy(&format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = 2\n",
        config_text_for(&cluster, "")
    ));
    table_f(&cluster, &p).await;
    failover_keeps_idle_sessions(&cluster, &p).await;
    drop(p);
    drop(cluster);
}

/// The primary stops and standby 1 is promoted: an idle session survives with its
/// settings, a session in a transaction on the old primary gets an error.
async fn failover_keeps_idle_sessions(
    cluster: &pgfresh_localcluster::LocalCluster,
    p: &ProxyHandle,
) {
    let idle = p.connect().await;
    idle.batch_execute("SET application_name = 'survivor'")
        .await
        .unwrap();
    idle.batch_execute("INSERT INTO f VALUES (2, 'two')")
        .await
        .unwrap();
    let in_tx = p.connect().await;
    in_tx
        .batch_execute("BEGIN; INSERT INTO f VALUES (3, 'three')")
        .await
        .unwrap();

    cluster.stop_node(0).unwrap();
    cluster.promote(1).unwrap();
    cluster.repoint_standby(2, 1).unwrap();
    let shared = p.shared.clone();
    eventually(
        "the proxy sees the new primary",
        Duration::from_secs(60),
        || shared.balancer.primary() == Some(1),
    )
    .await;

    assert!(
        in_tx.batch_execute("COMMIT").await.is_err(),
        "a transaction on the old primary must fail, not be replayed"
    );
    let new_primary = cluster.port(1) as i32;
    let mut last_err: Option<String>;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match idle
            .query_one("INSERT INTO f VALUES (4, 'four') RETURNING inet_server_port(), current_setting('application_name')", &[])
            .await
        {
            Ok(row) => {
                assert_eq!(row.get::<_, i32>(0), new_primary);
                assert_eq!(row.get::<_, String>(1), "survivor");
                break;
            }
            Err(e) => {
                // Until the new primary accepts writes the statement fails cleanly; the
                // session stays usable.
                last_err = Some(e.to_string());
                assert!(std::time::Instant::now() < deadline, "idle session never reached the new primary: {last_err:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let n: i64 = idle
        .query_one("/* pgfresh:primary */ SELECT count(*) FROM f", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 3, "rows 1, 2 and 4; the uncommitted 3 is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_during_a_failover_wait_for_the_new_primary() {
    let cluster = private_cluster();
    // A monitor that polls once a second: for a moment after the primary dies, pgfresh
    // still takes it for the primary, and logins find it refusing connections.
    let text = config_text_for(&cluster, "").replacen(
        "sr_check_period_ms = 50",
        "sr_check_period_ms = 1000\nhealth_timeout_ms = 2000",
        1,
    );
    assert!(text.contains("sr_check_period_ms = 1000"));
    let p = start_proxy(&text);
    p.connect().await;
    cluster.stop_node(0).unwrap();
    // Clients log in while the primary is gone and nothing is promoted yet.
    let logins: Vec<_> = (0..4)
        .map(|_| {
            let conninfo = p.conninfo("app", APP_PASSWORD, "app");
            tokio::spawn(async move {
                let (c, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await?;
                tokio::spawn(conn);
                c.query_one("/* pgfresh:primary */ SELECT inet_server_port()", &[])
                    .await
                    .map(|r| r.get::<_, i32>(0))
            })
        })
        .collect();
    cluster.promote(1).unwrap();
    cluster.repoint_standby(2, 1).unwrap();
    // Each login waited for the new primary instead of handing the client the old one's
    // "connection refused".
    for login in logins {
        let port = login
            .await
            .unwrap()
            .expect("the login waited for the new primary");
        assert_eq!(port, cluster.port(1) as i32);
    }
    drop(p);
    drop(cluster);
}
