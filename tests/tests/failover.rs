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

/// A row a writer wrote: (client, sequence number, part).
type Row = (i32, i32, i32);

/// What the writers of [`primary_killed_under_load`] saw.
#[derive(Default)]
struct Tally {
    /// Rows whose write was acknowledged.
    acked: Vec<Row>,
    /// Rows whose write failed in a way that leaves its outcome open (08006, 08007, a
    /// closed connection).
    unknown: Vec<Row>,
    /// Rows of transactions pgfresh reported rolled back (class 40).
    rolled_back: Vec<Row>,
    /// Errors by SQLSTATE ("-" for a connection closed without one).
    errors: std::collections::BTreeMap<String, u32>,
    /// Each read of a writer's own rows: how many it saw, and the rows acknowledged to
    /// that writer before the read was sent.
    reads: Vec<(usize, Vec<Row>)>,
    /// When each acknowledgement arrived.
    ack_times: Vec<std::time::Instant>,
}

/// One writer: autocommit INSERTs, two-row transactions, and reads of its own rows,
/// through `p`, until `stop`; reconnects whenever its session ends.
async fn writer(
    conninfo: String,
    table: String,
    client: i32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tally: std::sync::Arc<std::sync::Mutex<Tally>>,
) {
    let mut conn: Option<tokio_postgres::Client> = None;
    let mut seq = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let c = match &conn {
            Some(c) if !c.is_closed() => c,
            _ => match tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await {
                Ok((c, task)) => {
                    tokio::spawn(task);
                    conn.insert(c)
                }
                Err(e) => {
                    let code = e.code().map_or("-".into(), |c| c.code().to_string());
                    *tally
                        .lock()
                        .unwrap()
                        .errors
                        .entry(format!("login {code}"))
                        .or_default() += 1;
                    // A login during a failover waits for the new primary itself (up
                    // to client_login_timeout_ms): a failure is counted and the writer
                    // tries again.
                    continue;
                }
            },
        };
        seq += 1;
        let (rows, result) = match seq % 3 {
            0 => {
                let acked: Vec<_> = tally
                    .lock()
                    .unwrap()
                    .acked
                    .iter()
                    .filter(|r| r.0 == client)
                    .copied()
                    .collect();
                let sql = format!("SELECT count(*) FROM {table} WHERE client = {client}");
                match c.query_one(&sql, &[]).await {
                    Ok(row) => {
                        let seen = row.get::<_, i64>(0) as usize;
                        tally.lock().unwrap().reads.push((seen, acked));
                        continue;
                    }
                    Err(e) => (Vec::new(), Err(e)),
                }
            }
            1 => {
                let row = (client, seq, 0);
                let sql = format!("INSERT INTO {table} VALUES ({client}, {seq}, 0)");
                (vec![row], c.batch_execute(&sql).await)
            }
            _ => {
                let sql = format!(
                    "BEGIN; INSERT INTO {table} VALUES ({client}, {seq}, 0); \
                     INSERT INTO {table} VALUES ({client}, {seq}, 1); COMMIT"
                );
                (
                    vec![(client, seq, 0), (client, seq, 1)],
                    c.batch_execute(&sql).await,
                )
            }
        };
        let mut t = tally.lock().unwrap();
        match result {
            Ok(()) => {
                t.acked.extend(rows);
                t.ack_times.push(std::time::Instant::now());
            }
            Err(e) => {
                let code = e.code().map_or("-".into(), |c| c.code().to_string());
                if code.starts_with("40") {
                    t.rolled_back.extend(rows);
                } else {
                    t.unknown.extend(rows);
                }
                *t.errors.entry(code).or_default() += 1;
            }
        }
    }
}

/// 8 clients write and read through pgfresh while the primary is killed
/// (`pg_ctl stop -m immediate`), a standby promoted and the other re-pointed. Every
/// write the clients saw acknowledged is compared with the new primary's contents.
/// Returns how many acknowledged rows are missing there.
async fn primary_killed_under_load(synchronous: bool) -> usize {
    let cluster = private_cluster();
    if synchronous {
        // Both standbys confirm each commit: whichever is promoted has every
        // acknowledged write.
        cluster
            .psql(
                0,
                "postgres",
                "ALTER SYSTEM SET synchronous_standby_names = 'ANY 2 (*)'",
            )
            .unwrap();
        cluster
            .psql(0, "postgres", "SELECT pg_reload_conf()")
            .unwrap();
    }
    let p = start_proxy(&config_text_for(&cluster, ""));
    let table = unique("ack");
    p.connect()
        .await
        .batch_execute(&format!(
            "CREATE TABLE {table} (client int, seq int, part int, PRIMARY KEY (client, seq, part))"
        ))
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tally = std::sync::Arc::new(std::sync::Mutex::new(Tally::default()));
    let writers: Vec<_> = (0..8)
        .map(|client| {
            tokio::spawn(writer(
                p.conninfo("app", APP_PASSWORD, "app"),
                table.clone(),
                client,
                stop.clone(),
                tally.clone(),
            ))
        })
        .collect();
    let acks = || tally.lock().unwrap().ack_times.len();
    poll(
        "writes before the kill",
        Duration::from_secs(60),
        || async { (acks() >= 200).then_some(()) },
    )
    .await;
    cluster.kill_node(0).unwrap();
    let promoting = std::time::Instant::now();
    cluster.promote(1).unwrap();
    cluster.repoint_standby(2, 1).unwrap();
    poll(
        "writes on the new primary",
        Duration::from_secs(120),
        || async {
            let t = tally.lock().unwrap();
            (t.ack_times.iter().filter(|&&a| a > promoting).count() >= 200).then_some(())
        },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        tokio::time::timeout(Duration::from_secs(120), w)
            .await
            .expect("every writer's last statement is answered")
            .unwrap();
    }

    // The new primary's rows, read directly.
    let (c, task) = tokio_postgres::connect(
        &cluster.conninfo(1, "app", APP_PASSWORD, "app"),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(task);
    let present: std::collections::HashSet<Row> = c
        .query(&format!("SELECT client, seq, part FROM {table}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let t = tally.lock().unwrap();
    let missing = t.acked.iter().filter(|r| !present.contains(r)).count();
    let unknown_present = t.unknown.iter().filter(|r| present.contains(r)).count();
    let rolled_back_present = t.rolled_back.iter().filter(|r| present.contains(r)).count();
    // A read is stale when it saw fewer rows than had been acknowledged to its writer
    // before it was sent and survived the failover (rows lost with the old primary were
    // visible there before it died, and are gone after).
    let stale_reads = t
        .reads
        .iter()
        .filter(|(seen, acked)| *seen < acked.iter().filter(|r| present.contains(r)).count())
        .count();
    let first_write = t
        .ack_times
        .iter()
        .filter(|&&a| a > promoting)
        .min()
        .map(|a| a.duration_since(promoting));
    eprintln!(
        "primary killed ({}): {} rows acknowledged, {missing} missing; {} of unknown outcome \
         ({unknown_present} present); {} reported rolled back ({rolled_back_present} present); \
         errors by SQLSTATE {:?}; first write {first_write:?} after the promotion began; \
         {stale_reads} stale reads of {}",
        if synchronous {
            "synchronous"
        } else {
            "asynchronous"
        },
        t.acked.len(),
        t.unknown.len(),
        t.rolled_back.len(),
        t.errors,
        t.reads.len()
    );
    assert_eq!(stale_reads, 0, "a client missed its own acknowledged write");
    assert_eq!(
        rolled_back_present, 0,
        "a transaction reported rolled back committed"
    );
    // A write sent to a node in recovery would fail with 25006.
    for code in t.errors.keys() {
        assert!(
            ["08006", "08007", "57P01", "-", "login 08006", "login 57P01"].contains(&code.as_str())
                || code.starts_with("40"),
            "unexpected error {code}: {:?}",
            t.errors
        );
    }
    drop(p);
    drop(cluster);
    missing
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_under_load_loses_no_acknowledged_write_with_synchronous_standbys() {
    assert_eq!(primary_killed_under_load(true).await, 0);
}

/// Asynchronous replication: a write the primary acknowledged before its standbys had
/// it can be lost with the primary — PostgreSQL's guarantee, not pgfresh's. The count is
/// reported (docs/reliability.md), not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_under_load_with_asynchronous_standbys() {
    primary_killed_under_load(false).await;
}

/// The primary terminates a session while its COMMIT runs (a deferred constraint
/// trigger sleeping at commit time): the server sends FATAL 57P01 and closes. The
/// client is told 08007 (whether the transaction committed is unknown to pgfresh), not
/// the FATAL, which a client would take as the COMMIT's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_off_by_the_server_is_08007_not_its_fatal() {
    let cluster = private_cluster();
    let p = start_proxy(&config_text_for(&cluster, ""));
    let c = p.connect().await;
    let t = unique("cut");
    c.batch_execute(&format!(
        "CREATE TABLE {t}(id int); \
         CREATE FUNCTION {t}_slow() RETURNS trigger LANGUAGE plpgsql AS \
           'BEGIN PERFORM pg_sleep(60); RETURN NULL; END'; \
         CREATE CONSTRAINT TRIGGER {t}_at_commit AFTER INSERT ON {t} \
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {t}_slow()"
    ))
    .await
    .unwrap();
    c.batch_execute(&format!(
        "SET application_name = 'cut_commit'; BEGIN; INSERT INTO {t} VALUES (1)"
    ))
    .await
    .unwrap();
    let commit = tokio::spawn(async move { c.batch_execute("COMMIT").await });
    poll(
        "the COMMIT running its deferred trigger, then terminated",
        Duration::from_secs(60),
        || async {
            let killed = cluster
                .psql(
                    0,
                    "postgres",
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = 'cut_commit' AND wait_event = 'PgSleep'",
                )
                .ok()?;
            (killed == "1").then_some(())
        },
    )
    .await;
    let err = commit
        .await
        .unwrap()
        .expect_err("the COMMIT's outcome is unknown to the client");
    assert_eq!(
        err.code().map(|c| c.code()),
        Some("08007"),
        "the client is told the outcome is unknown: {err}"
    );
}

/// A worker of the PAUSE test: transactions that write and read back, until `stop`; the
/// transactions it completed, or the first error.
async fn pause_worker(
    p: &ProxyHandle,
    id: i32,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<usize, String> {
    let c = p.connect().await;
    let mut n = 0usize;
    while !*stop.borrow() {
        let v = format!("{id}-{n}");
        let tx = async {
            c.batch_execute(&format!(
                "BEGIN; UPDATE pw SET v = '{v}' WHERE id = {id}; COMMIT"
            ))
            .await?;
            c.query_one("SELECT v FROM pw WHERE id = $1", &[&id]).await
        };
        let row = tx
            .await
            .map_err(|e| format!("worker {id}, transaction {n}: {e:?}"))?;
        let read: String = row.get(0);
        if read != v {
            return Err(format!("worker {id} read {read:?} after writing {v:?}"));
        }
        n += 1;
        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(n)
}

/// The runbook PAUSE is for: the primary is restarted between PAUSE and RESUME while
/// clients keep sending transactions (transaction mode), and none of them sees an error.
/// (The same restart without PAUSE cut a worker's connection in two runs of three.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_restarted_between_pause_and_resume_costs_no_client_an_error() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let cluster = private_cluster();
    let p = std::sync::Arc::new(start_proxy(&format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = 4\n",
        config_text_for(&cluster, "")
    )));
    let setup = p.connect().await;
    setup
        .batch_execute(
            "CREATE TABLE pw (id int PRIMARY KEY, v text); \
             INSERT INTO pw SELECT g, '' FROM generate_series(0, 3) g",
        )
        .await
        .unwrap();
    let done = std::sync::Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let workers: Vec<_> = (0..4)
        .map(|id| {
            let (p, done, stop) = (p.clone(), done.clone(), stop.clone());
            tokio::spawn(async move { pause_worker(&p, id, done, stop).await })
        })
        .collect();
    let at_least = |n: usize| {
        let done = done.clone();
        async move {
            let target = done.load(Ordering::Relaxed) + n;
            eventually("the workers to get on", Duration::from_secs(60), || {
                done.load(Ordering::Relaxed) >= target
            })
            .await;
        }
    };
    at_least(20).await;
    let admin = p
        .connect_as("admin", "admin-pass", "pgfresh")
        .await
        .expect("console login");
    admin.simple_query("PAUSE").await.expect("PAUSE");
    // A transaction whose connection went back before PAUSE answered may reach its
    // worker's count after it: the count is read once every worker waits, held, with
    // its next transaction.
    let admin = &admin;
    poll(
        "every worker to be held by the pause",
        Duration::from_secs(60),
        || async move {
            let held = admin
                .simple_query("SHOW CLIENTS")
                .await
                .expect("SHOW CLIENTS")
                .iter()
                .filter(|m| {
                    matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get("state") == Some("waiting"))
                })
                .count();
            (held == 4).then_some(())
        },
    )
    .await;
    let paused_at = done.load(Ordering::Relaxed);
    cluster.stop_node(0).unwrap();
    cluster.start_node(0).unwrap();
    let shared = p.shared.clone();
    eventually(
        "pgfresh to see the primary again",
        Duration::from_secs(60),
        || shared.balancer.primary() == Some(0),
    )
    .await;
    assert_eq!(
        done.load(Ordering::Relaxed),
        paused_at,
        "no transaction ran while paused"
    );
    admin.simple_query("RESUME").await.expect("RESUME");
    at_least(20).await;
    stop_tx.send(true).unwrap();
    for w in workers {
        let n = w.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert!(n > 0);
    }
}
