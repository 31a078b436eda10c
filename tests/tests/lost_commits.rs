//! `[routing] resolve_lost_commits`: the connection to the primary is lost right after a
//! COMMIT was sent (the test fault `DropAfterCommit`: the proxy closes the server
//! connection once the COMMIT's bytes are written, without reading its reply; the server
//! still runs the COMMIT it received). With the option, pgfresh asks the primary what
//! became of the transaction and answers the real outcome; without it (the control of
//! every case) the client gets 08007.
//!
//! The failover tests use a private cluster each and `Fault::DropAfterCommitAndHold`
//! (the session holds, the connection lost, until the test releases it): the cluster is
//! failed over in between, and pgfresh resolves the COMMIT on the new primary when the
//! transaction's position and a logged write allow it. Their control is the behaviour
//! before that: a changed primary was always 08007, which fails them.
//!
//! Each test toggles the option by rewriting the config file (it reloads live).

use std::time::Duration;

use pgfresh_proxy::session::lost_commit::Fault;
use pgfresh_tests::admin::{http, write_config};
use pgfresh_tests::pgfresh_localcluster::LocalCluster;
use pgfresh_tests::*;

/// The test config, with the option as given (a long TTL: the marks a resolved COMMIT
/// makes are checked after the client got its reply).
fn config(on: bool) -> String {
    config_text(&format!(
        "resolve_lost_commits = {on}\nrecent_access_ttl_ms = 5000"
    ))
}

async fn set_option(p: &ProxyHandle, on: bool) {
    write_config(&p.config_path, &config(on));
    let shared = p.shared.clone();
    eventually("the option reloads", Duration::from_secs(30), || {
        shared.config.snapshot().routing.resolve_lost_commits == on
    })
    .await;
}

fn code(e: &tokio_postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

fn count_on_primary(table: &str, filter: &str) -> String {
    cluster()
        .psql(
            0,
            "app",
            &format!("SELECT count(*) FROM {table} WHERE {filter}"),
        )
        .expect("count on the primary")
}

fn lost_commits(metrics: &str, outcome: &str) -> u64 {
    let key = format!("pgfresh_lost_commits_total{{outcome=\"{outcome}\"}}");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// BEGIN; INSERT; COMMIT with the fault armed, on a fresh session.
async fn commit_with_fault(
    p: &ProxyHandle,
    table: &str,
    id: i32,
) -> (tokio_postgres::Client, Result<(), tokio_postgres::Error>) {
    let c = p.connect().await;
    c.batch_execute(&format!("BEGIN; INSERT INTO {table} VALUES ({id})"))
        .await
        .expect("the transaction's write");
    p.shared.arm_fault(Fault::DropAfterCommit);
    let r = c.batch_execute("COMMIT").await;
    p.shared.faults.disarm();
    (c, r)
}

#[tokio::test]
async fn a_lost_commit_that_committed_is_answered_commit() {
    let p = start_proxy(&config(false));
    let setup = p.connect().await;
    let t = p.cold_table(&setup, "lost_ok").await;

    // Control: without the option the client is told 08007, although the COMMIT ran.
    set_option(&p, false).await;
    let (c, r) = commit_with_fault(&p, &t, 10).await;
    let e = r.expect_err("without the option the outcome is unknown");
    assert_eq!(code(&e), "08007", "{e}");
    assert!(c.is_closed() || c.batch_execute("SELECT 1").await.is_err());
    eventually("the control's COMMIT ran", Duration::from_secs(10), || {
        count_on_primary(&t, "id = 10") == "1"
    })
    .await;

    // With the option: the client gets COMMIT, the row is there, the table was marked
    // written before the reply reached the client (a read right after goes where the
    // write is visible), and that read sees the row.
    set_option(&p, true).await;
    p.wait_cold(&[&t]).await;
    let before = http(p.admin, "GET", "/metrics", None, None).await.body;
    let (c, r) = commit_with_fault(&p, &t, 11).await;
    r.expect("the lost COMMIT is answered COMMIT");
    assert!(
        p.shared
            .recency
            .lookup("app", &[pgfresh_recency::RelKey::unqualified(&t)])
            .is_hot(),
        "the transaction's write is marked before the COMMIT is answered"
    );
    assert_eq!(count_on_primary(&t, "id = 11"), "1");
    let reader = p.connect().await;
    let seen: i64 = reader
        .query_one(&format!("SELECT count(*) FROM {t} WHERE id = 11"), &[])
        .await
        .expect("read")
        .get(0);
    assert_eq!(seen, 1, "a read right after the COMMIT sees its row");
    // The session goes on (on a new server connection).
    let n: i64 = c
        .query_one(&format!("SELECT count(*) FROM {t}"), &[])
        .await
        .expect("the session goes on")
        .get(0);
    assert_eq!(n, 3);
    let after = http(p.admin, "GET", "/metrics", None, None).await.body;
    assert!(lost_commits(&after, "committed") > lost_commits(&before, "committed"));
}

#[tokio::test]
async fn a_lost_commit_that_rolled_back_is_answered_40000() {
    let p = start_proxy(&config(false));
    let setup = p.connect().await;
    let t = unique("lost_abort");
    // The unique check is deferred to COMMIT: the COMMIT itself fails on the server.
    setup
        .batch_execute(&format!(
            "CREATE TABLE {t}(id int, CONSTRAINT {t}_u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED); \
             INSERT INTO {t} VALUES (1)"
        ))
        .await
        .unwrap();

    set_option(&p, false).await;
    let (_c, r) = commit_with_fault(&p, &t, 1).await;
    let e = r.expect_err("control");
    assert_eq!(code(&e), "08007", "{e}");

    set_option(&p, true).await;
    let (c, r) = commit_with_fault(&p, &t, 1).await;
    let e = r.expect_err("the transaction rolled back");
    assert_eq!(code(&e), "40000", "{e}");
    let message = e.as_db_error().map(|d| d.message()).unwrap_or_default();
    assert!(message.contains("rolled back"), "{message}");
    assert_eq!(
        count_on_primary(&t, "id = 1"),
        "1",
        "the duplicate is absent"
    );
    // The transaction is over; the session goes on, idle.
    let n: i64 = c
        .query_one(&format!("SELECT count(*) FROM {t}"), &[])
        .await
        .expect("the session goes on")
        .get(0);
    assert_eq!(n, 1);
}

/// A transaction that only reads (no transaction id is ever assigned), its COMMIT lost.
async fn read_only_commit(
    p: &ProxyHandle,
    t: &str,
) -> (tokio_postgres::Client, Result<(), tokio_postgres::Error>) {
    let c = p.connect().await;
    c.batch_execute(&format!("BEGIN; SELECT count(*) FROM {t}"))
        .await
        .unwrap();
    p.shared.arm_fault(Fault::DropAfterCommit);
    let r = c.batch_execute("COMMIT").await;
    p.shared.faults.disarm();
    (c, r)
}

#[tokio::test]
async fn a_lost_commit_of_a_transaction_without_an_id_is_answered_commit() {
    let p = start_proxy(&config(false));
    let setup = p.connect().await;
    let t = p.cold_table(&setup, "lost_ro").await;
    set_option(&p, false).await;
    let (_c, r) = read_only_commit(&p, &t).await;
    let e = r.expect_err("control");
    assert_eq!(code(&e), "08007", "{e}");

    set_option(&p, true).await;
    let (c, r) = read_only_commit(&p, &t).await;
    r.expect("nothing was written, nothing can be lost: COMMIT");
    c.batch_execute("SELECT 1")
        .await
        .expect("the session goes on");
}

#[tokio::test]
async fn an_extended_protocol_commit_is_resolved_and_an_unwatched_one_stays_08007() {
    let p = start_proxy(&config(false));
    let setup = p.connect().await;
    let t = unique("lost_ext");
    setup
        .batch_execute(&format!("CREATE TABLE {t}(id int)"))
        .await
        .unwrap();
    // COMMIT as Bind/Execute/Sync of a prepared statement (the prepare is its own unit).
    let extended = |id: i32| {
        let (p, t) = (&p, t.clone());
        async move {
            let c = p.connect().await;
            c.batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES ({id})"))
                .await
                .unwrap();
            let commit = c.prepare("COMMIT").await.unwrap();
            p.shared.arm_fault(Fault::DropAfterCommit);
            let r = c.execute(&commit, &[]).await.map(drop);
            p.shared.faults.disarm();
            (c, r)
        }
    };

    let (_c, r) = extended(1).await;
    assert_eq!(code(&r.expect_err("control")), "08007");

    set_option(&p, true).await;
    let (c, r) = extended(2).await;
    r.expect("the lost COMMIT is answered COMMIT");
    assert_eq!(count_on_primary(&t, "id = 2"), "1");
    c.batch_execute("SELECT 1")
        .await
        .expect("the session goes on");

    // A write and its COMMIT in one query: the transaction's id was not learned before
    // the COMMIT (pgfresh watches only a unit that is just a COMMIT), so the outcome is
    // unknown even with the option.
    let before = http(p.admin, "GET", "/metrics", None, None).await.body;
    let c = p.connect().await;
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute(&format!("SELECT count(*) FROM {t}"))
        .await
        .unwrap();
    p.shared.arm_fault(Fault::DropAfterCommit);
    let r = c
        .batch_execute(&format!("INSERT INTO {t} VALUES (3); COMMIT"))
        .await;
    p.shared.faults.disarm();
    assert_eq!(code(&r.expect_err("unknown")), "08007");
    let after = http(p.admin, "GET", "/metrics", None, None).await.body;
    assert!(lost_commits(&after, "unknown") > lost_commits(&before, "unknown"));
}

/// This process's CPU time (the in-process proxy, plus the idle test harness), in ticks.
fn process_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    fields
        .get(11)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
}

/// The cost of the transaction-id probe: pgbench `-N` (BEGIN, 3 UPDATEs, SELECT, INSERT,
/// END) through the proxy with the option off and on, alternating. Prints tps, latency
/// and the proxy's CPU per transaction (debug build: compare the rows, not absolutes).
/// `cargo test -p pgfresh-tests --test lost_commits -- --ignored --nocapture`
#[tokio::test]
#[ignore]
async fn measure_xid_probe_cost() {
    let c = cluster();
    c.psql(0, "postgres", "DROP DATABASE IF EXISTS lostbench")
        .unwrap();
    c.psql(0, "postgres", "CREATE DATABASE lostbench OWNER app")
        .unwrap();
    let p = start_proxy(&config(false));
    let pgbench = |args: &[&str]| p.pgbench("lostbench", args);
    pgbench(&["-i", "-s", "1", "-q"]);
    let secs = std::env::var("LOST_BENCH_SECS").unwrap_or_else(|_| "8".into());
    let tick_us = 1_000_000.0 / 100.0; // CLK_TCK = 100 on Linux
    for round in 0..3 {
        for on in [false, true] {
            set_option(&p, on).await;
            let cpu0 = process_cpu_ticks();
            let text = pgbench(&["-N", "-M", "simple", "-c", "4", "-j", "2", "-T", &secs]);
            let cpu = (process_cpu_ticks() - cpu0) as f64 * tick_us;
            let field = |key: &str| -> f64 {
                text.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.split('/').next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            let txs = field("number of transactions actually processed: ");
            let latency = field("latency average = ");
            let tps = field("tps = ");
            println!(
                "round {round} resolve_lost_commits={on}: {txs} tx, tps {tps:.0}, latency {latency:.3} ms, proxy CPU {:.1} us/tx",
                cpu / txs.max(1.0)
            );
        }
    }
}

/// BEGIN; INSERT; then COMMIT with `Fault::DropAfterCommitAndHold`, in a task: returns
/// once the session holds (its server connection dropped after the COMMIT was written).
async fn commit_and_hold(
    p: &ProxyHandle,
    id: i32,
) -> tokio::task::JoinHandle<(tokio_postgres::Client, Result<(), tokio_postgres::Error>)> {
    let c = p.connect().await;
    c.batch_execute(&format!("BEGIN; INSERT INTO t VALUES ({id})"))
        .await
        .expect("the transaction's write");
    p.shared.arm_fault(Fault::DropAfterCommitAndHold);
    let task = tokio::spawn(async move {
        let r = c.batch_execute("COMMIT").await;
        (c, r)
    });
    let shared = p.shared.clone();
    eventually(
        "the session to hold after the COMMIT",
        Duration::from_secs(30),
        || shared.faults.holding(),
    )
    .await;
    task
}

/// Stop node 0, promote node 1, and wait until the proxy sees node 1 as the primary on
/// timeline 2 with its history.
async fn fail_over(cluster: &LocalCluster, p: &ProxyHandle) {
    cluster.stop_node(0).unwrap();
    cluster.promote(1).unwrap();
    let balancer = p.shared.balancer.clone();
    eventually(
        "node 1 primary on timeline 2, its history known",
        Duration::from_secs(120),
        || {
            let v = balancer.view();
            v.primary == Some(1)
                && v.primary_timeline == Some(2)
                && v.timeline_history
                    .as_ref()
                    .is_some_and(|h| h.timeline() == 2)
        },
    )
    .await;
}

fn count_on(cluster: &LocalCluster, node: usize, id: i32) -> String {
    cluster
        .psql(
            node,
            "app",
            &format!("SELECT count(*) FROM t WHERE id = {id}"),
        )
        .expect("count")
}

/// The COMMIT's connection is lost, then the primary fails over before pgfresh asks.
/// A: the commit had reached standby 1 before it was promoted: the new primary knows the
/// id and says committed — the client gets COMMIT. (Control: before pgfresh asked the new
/// primary, a changed primary was always 08007.)
#[tokio::test]
async fn a_lost_commit_that_reached_the_new_primary_is_answered_commit() {
    let cluster = private_cluster();
    let p = start_proxy(&config_text_for(&cluster, "resolve_lost_commits = true"));
    let setup = p.connect().await;
    setup.batch_execute("CREATE TABLE t(id int)").await.unwrap();
    wait_replicated_on(&cluster, &setup).await;
    drop(setup);

    let task = commit_and_hold(&p, 1).await;
    eventually("the row on standby 1", Duration::from_secs(60), || {
        count_on(&cluster, 1, 1) == "1"
    })
    .await;
    cut_off_standby(&cluster, 2).await;
    fail_over(&cluster, &p).await;
    p.shared.faults.release();

    let (c, r) = task.await.unwrap();
    r.expect("the lost COMMIT is answered COMMIT by the new primary");
    assert_eq!(count_on(&cluster, 1, 1), "1");
    c.batch_execute("SELECT 1")
        .await
        .expect("the session goes on");
}

/// B: both standbys were cut off before the transaction wrote: its writes are past the
/// switch point of the new timeline, the new primary never received its commit — the
/// client gets 40000, and the row is not there. (Control: 08007 before.)
#[tokio::test]
async fn a_lost_commit_past_the_switch_point_is_answered_rolled_back() {
    let cluster = private_cluster();
    let p = start_proxy(&config_text_for(&cluster, "resolve_lost_commits = true"));
    let setup = p.connect().await;
    setup.batch_execute("CREATE TABLE t(id int)").await.unwrap();
    wait_replicated_on(&cluster, &setup).await;
    drop(setup);
    for i in 1..=2 {
        cut_off_standby(&cluster, i).await;
    }

    let task = commit_and_hold(&p, 2).await;
    fail_over(&cluster, &p).await;
    let aborted = lost_commits(
        &http(p.admin, "GET", "/metrics", None, None).await.body,
        "aborted",
    );
    p.shared.faults.release();

    let (c, r) = task.await.unwrap();
    let e = r.expect_err("the commit was lost in the failover");
    assert_eq!(code(&e), "40000", "{e}");
    let message = e.as_db_error().map(|d| d.message()).unwrap_or_default();
    assert!(message.contains("lost in a failover"), "{message}");
    assert_eq!(
        count_on(&cluster, 1, 2),
        "0",
        "the new primary never got the row"
    );
    let after = http(p.admin, "GET", "/metrics", None, None).await.body;
    assert!(lost_commits(&after, "aborted") > aborted);
    c.batch_execute("SELECT 1")
        .await
        .expect("the session goes on");
}

/// The hole that stays: a transaction that wrote only an unlogged table put no WAL record
/// with its id before its commit, so after a failover its id may have been reused. Even
/// with its commit record replicated, pgfresh answers 08007 rather than ask.
#[tokio::test]
async fn a_lost_commit_of_unlogged_writes_after_a_failover_stays_08007() {
    let cluster = private_cluster();
    let p = start_proxy(&config_text_for(&cluster, "resolve_lost_commits = true"));
    let setup = p.connect().await;
    setup
        .batch_execute("CREATE UNLOGGED TABLE t(id int)")
        .await
        .unwrap();
    wait_replicated_on(&cluster, &setup).await;
    drop(setup);

    let task = commit_and_hold(&p, 3).await;
    let lsn = cluster
        .psql(0, "postgres", "SELECT pg_current_wal_lsn()")
        .unwrap();
    eventually(
        "standby 1 replays the commit",
        Duration::from_secs(60),
        || {
            cluster
                .psql(
                    1,
                    "postgres",
                    &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
                )
                .is_ok_and(|v| v == "t")
        },
    )
    .await;
    cut_off_standby(&cluster, 2).await;
    fail_over(&cluster, &p).await;
    p.shared.faults.release();

    let (_c, r) = task.await.unwrap();
    let e = r.expect_err("no logged write proves the id");
    assert_eq!(code(&e), "08007", "{e}");
}

/// `COMMIT AND CHAIN` is a COMMIT: when the connection to the primary is lost after it
/// was sent, the client gets 08007 (the chained transaction is gone with the
/// connection), and the transaction's writes are marked as if it committed — the
/// server still runs the COMMIT it received, and a read right after, from any session,
/// must see it. The standbys are paused: a read sent to one would miss the row.
/// The same holds for a plain COMMIT whose outcome stays unknown (option off).
#[tokio::test]
async fn a_lost_commit_and_chain_is_08007_and_marks_its_writes() {
    let p = start_proxy(&config(false));
    let setup = p.connect().await;
    let t = p.cold_table(&setup, "lost_chain").await;
    let _pause = ReplayPause::all();
    let mut stale = 0;
    let mut id = 100;
    for (on, commit) in [
        (false, "COMMIT AND CHAIN"),
        (false, "COMMIT"),
        (true, "COMMIT AND CHAIN"),
    ] {
        set_option(&p, on).await;
        id += 1;
        let c = p.connect().await;
        c.batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES ({id})"))
            .await
            .expect("the transaction's write");
        p.shared.arm_fault(Fault::DropAfterCommit);
        let r = c.batch_execute(commit).await;
        p.shared.faults.disarm();
        let e = r.expect_err("the outcome is unknown");
        assert_eq!(code(&e), "08007", "{commit} (option {on}): {e}");
        eventually("the COMMIT ran", Duration::from_secs(10), || {
            count_on_primary(&t, &format!("id = {id}")) == "1"
        })
        .await;
        let marked = p
            .shared
            .recency
            .lookup("app", &[pgfresh_recency::RelKey::unqualified(&t)])
            .is_hot();
        let reader = p.connect().await;
        let seen: i64 = reader
            .query_one(&format!("SELECT count(*) FROM {t} WHERE id = {id}"), &[])
            .await
            .expect("read")
            .get(0);
        if seen != 1 || !marked {
            eprintln!("{commit} (option {on}): marked {marked}, a read right after saw {seen}");
            stale += 1;
        }
    }
    assert_eq!(stale, 0, "stale reads after a lost COMMIT");
}
