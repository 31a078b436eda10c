//! Faults under way. A server connection killed in the middle of a large result (shared
//! cluster): the client that was reading gets an error, the connection is not used
//! again, and other clients on the same pool go on (transaction mode with one connection
//! per node, so a reused dead connection would fail the next statement); a setting made
//! by a Query whose replica is killed mid-result is not kept. A replica
//! stopped under select-only load (private cluster): no transaction fails. The config
//! file replaced by garbage and then by a new TTL under load: no transaction fails. 200
//! clients vanishing mid-startup, mid-message, mid-transaction and mid-result under load:
//! no transaction fails, every session is cleaned up, the pool is whole.

use std::time::Duration;

use futures_util::{pin_mut, TryStreamExt};
use pgfresh_tests::*;

/// Kills the backend whose `application_name` is `name` on node `i`; true when one was
/// killed.
fn kill_backend(i: usize, name: &str) -> bool {
    cluster()
        .psql(
            i,
            "postgres",
            &format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = '{name}' AND state = 'active'"
            ),
        )
        .is_ok_and(|n| n == "1")
}

/// Held by the tests that run pgbench on the shared cluster: `pgbench -i` drops and
/// makes again the same tables, which another such test may be using.
static PGBENCH_TABLES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// pgbench through `p` in the background (`args` come after `-n`), for a fault to land in.
fn pgbench_in_background(
    p: &ProxyHandle,
    args: &[&str],
) -> tokio::task::JoinHandle<std::process::Output> {
    let env = p.libpq_env();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(pg_bin("pgbench"))
            .arg("-n")
            .args(args)
            .envs(env)
            .output()
            .expect("run pgbench")
    })
}

/// pgbench's output, after checking that it ended with no failed transaction and no
/// aborted client.
fn pgbench_clean(out: &std::process::Output) -> String {
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("aborted"), "{text}");
    assert!(text.contains("number of failed transactions: 0"), "{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_mid_result_fails_that_query_only() {
    let p = start_proxy(&format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = 1\n",
        config_text("")
    ));
    let reader = p.connect().await;
    let other = p.connect().await;
    // The name follows the client onto whatever connection runs its statement.
    reader
        .batch_execute("SET application_name = 'mid_result'")
        .await
        .unwrap();
    // 200 000 rows, produced slowly enough that the kill lands while they stream.
    let rows = reader
        .query_raw(
            "/* pgfresh:primary */ SELECT g, repeat('x', 100) FROM generate_series(1, 200000) g \
             WHERE g % 1000 <> 0 OR pg_sleep(0.01) IS NOT NULL",
            std::iter::empty::<i32>(),
        )
        .await
        .expect("the query starts");
    pin_mut!(rows);
    let mut received = 0u64;
    while received < 10 {
        rows.try_next()
            .await
            .expect("rows before the kill")
            .expect("more rows");
        received += 1;
    }
    poll(
        "the backend streaming the result to be killed",
        Duration::from_secs(30),
        || async { kill_backend(0, "mid_result").then_some(()) },
    )
    .await;
    let outcome = loop {
        match rows.try_next().await {
            Ok(Some(_)) => received += 1,
            Ok(None) => break Ok(received),
            Err(e) => break Err(e),
        }
    };
    let err = outcome.expect_err("the result was cut off, so the query fails");
    let code = err.code().map(|c| c.code().to_string());
    assert!(
        matches!(code.as_deref(), Some("57P01") | Some("08006") | None),
        "{err} ({code:?})"
    );
    assert!(received < 200_000, "{received} rows");
    eprintln!("mid-result kill: {received} rows, then {err} ({code:?})");

    // The pool's only connection to the primary is gone: the next statements, from
    // another client and from a new one, run on a fresh one.
    for _ in 0..3 {
        let n: i64 = other
            .query_one(
                "/* pgfresh:primary */ SELECT count(*) FROM generate_series(1, 10)",
                &[],
            )
            .await
            .expect("another client's statement runs")
            .get(0);
        assert_eq!(n, 10);
    }
    let fresh = p.connect().await;
    fresh
        .simple_query("/* pgfresh:primary */ SELECT 1")
        .await
        .expect("a new client's statement runs");
}

/// A Query that SETs and then reads, whose replica fails while the rows stream: the
/// statement fails, and with it its implicit transaction, so the setting it made is not
/// the session's (PostgreSQL rolls it back): no connection the session uses after it,
/// replica or primary, gets it replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_made_by_a_query_a_replica_failure_ended_is_not_kept() {
    use tokio::io::AsyncWriteExt;
    let p = start_proxy(&config_text(""));
    let mut s = raw::connect(p.addr).await;
    let query = async |s: &mut tokio::net::TcpStream, sql: &str| {
        s.write_all(&raw::msg(b'Q', &raw::cstr(sql))).await.unwrap();
        raw::read_until(s, b'Z').await
    };
    // The name follows the session onto every connection it uses.
    query(&mut s, "SET application_name = 'staged_kill'").await;
    let work_mem = "SELECT current_setting('work_mem')";
    let default = raw::first_value(&query(&mut s, work_mem).await);
    assert_ne!(default, "77MB");
    // Cold: a standby runs it. Rows stream, slowly, until the kill.
    s.write_all(&raw::msg(
        b'Q',
        &raw::cstr(
            "SET work_mem = '77MB'; SELECT g FROM generate_series(1, 200000) g \
             WHERE g % 1000 <> 0 OR pg_sleep(0.05) IS NOT NULL",
        ),
    ))
    .await
    .unwrap();
    raw::read_until(&mut s, b'D').await;
    poll(
        "the standby's backend streaming the rows to be killed",
        Duration::from_secs(30),
        || async {
            (kill_backend(1, "staged_kill") || kill_backend(2, "staged_kill")).then_some(())
        },
    )
    .await;
    let rest = raw::read_until(&mut s, b'Z').await;
    assert!(raw::tags(&rest).contains(&b'E'), "the statement failed");
    // A statement pgfresh settles settings at, then reads on every node.
    query(&mut s, "SHOW work_mem").await;
    for _ in 0..4 {
        let on_standby = raw::first_value(&query(&mut s, work_mem).await);
        assert_eq!(on_standby, default, "a standby's work_mem");
    }
    let primary = format!("/* pgfresh:primary */ {work_mem}");
    assert_eq!(
        raw::first_value(&query(&mut s, &primary).await),
        default,
        "the primary's work_mem"
    );
}

/// A private cluster with pgbench's tables (scale 1) replicated and cold, a proxy in
/// front of it, and pgbench `-S` (4 clients, `seconds` long) running through it, once
/// replica 1 serves some of its reads.
async fn select_only_load_on_replica_1(
    seconds: u32,
) -> (
    pgfresh_localcluster::LocalCluster,
    ProxyHandle,
    tokio::task::JoinHandle<std::process::Output>,
) {
    let c = private_cluster();
    let p = start_proxy(&config_text_for(&c, ""));
    p.pgbench("app", &["-i", "-s", "1", "-q"]);
    for i in 1..3 {
        c.wait_caught_up(i, Duration::from_secs(60)).unwrap();
    }
    p.wait_cold(&["pgbench_accounts", "pgbench_branches", "pgbench_tellers"])
        .await;
    // A duration, not a count: the fault must land while it runs.
    let bench = select_only_on_replica(&c, &p, 1, seconds).await;
    (c, p, bench)
}

/// pgbench `-S` (4 clients, `seconds` long) through `p`, returned once replica `i` has
/// some of its sessions.
async fn select_only_on_replica(
    c: &pgfresh_localcluster::LocalCluster,
    p: &ProxyHandle,
    i: usize,
    seconds: u32,
) -> tokio::task::JoinHandle<std::process::Output> {
    let seconds = seconds.to_string();
    // At most 1 000 transactions a second, so that a long run leaves the other tests
    // of this binary their share of the machine.
    let bench = pgbench_in_background(
        p,
        &["-S", "-c", "4", "-j", "4", "-R", "1000", "-T", &seconds],
    );
    poll(
        &format!("pgbench sessions on replica {i}"),
        Duration::from_secs(60),
        || async {
            let n = c
                .psql(
                    i,
                    "postgres",
                    "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'",
                )
                .unwrap_or_default();
            (n.parse::<u32>().unwrap_or(0) > 0).then_some(())
        },
    )
    .await;
    bench
}

/// pgbench select-only through pgfresh while a replica is stopped (fast shutdown: its
/// backends are terminated with 57P01), then, in a second run, while the other replica
/// is killed (immediate shutdown: its connections simply close): reads that had received
/// nothing go to another node, and each run ends with every transaction done and none
/// failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_or_killed_under_select_only_load_fails_no_transaction() {
    let (c, p, bench) = select_only_load_on_replica_1(6).await;
    c.stop_node(1).unwrap();
    let stopped_mid_run = !bench.is_finished();
    let out = bench.await.unwrap();
    c.start_node(1).unwrap();
    let text = pgbench_clean(&out);
    assert!(
        stopped_mid_run,
        "the replica stopped while pgbench ran:\n{text}"
    );
    c.wait_caught_up(1, Duration::from_secs(60)).unwrap();
    let bench = select_only_on_replica(&c, &p, 2, 6).await;
    c.kill_node(2).unwrap();
    let killed_mid_run = !bench.is_finished();
    let out = bench.await.unwrap();
    let text = pgbench_clean(&out);
    assert!(
        killed_mid_run,
        "the replica died while pgbench ran:\n{text}"
    );
    // Whether a read was in flight on the replica when it stopped is timing; either way
    // no transaction failed.
    eprintln!(
        "replicas stopped and killed: {} reads sent elsewhere (all tests of this binary)",
        metric_value("pgfresh_read_retries_total")
    );
}

/// Under pgbench load, the config file is replaced by garbage (refused, counted; the
/// running config holds), then by a valid file with another TTL (applied): no
/// transaction fails and no client is disconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_replaced_by_garbage_then_by_a_new_ttl_under_load() {
    let _tables = PGBENCH_TABLES.lock().await;
    let p = start_proxy(&config_text(""));
    p.pgbench("app", &["-i", "-s", "1", "-q"]);
    // A duration, not a count: both edits below must land while it runs.
    let bench = pgbench_in_background(&p, &["-c", "4", "-j", "4", "-T", "6"]);
    let ttl = p.shared.recency.ttl_ms();
    replace_with_garbage(
        &p.config_path,
        "[routing\nrecent_access_ttl_ms = ",
        "pgfresh_config_reloads_total{result=\"error\"}",
    )
    .await;
    assert_eq!(p.shared.recency.ttl_ms(), ttl, "the running config holds");
    pgfresh_tests::admin::write_config(
        &p.config_path,
        &config_text(&format!("recent_access_ttl_ms = {}", ttl + 1500)),
    );
    poll("the new TTL to apply", Duration::from_secs(30), || async {
        (p.shared.recency.ttl_ms() == ttl + 1500).then_some(())
    })
    .await;
    let edited_mid_run = !bench.is_finished();
    let out = bench.await.unwrap();
    let text = pgbench_clean(&out);
    assert!(
        edited_mid_run,
        "both edits landed while pgbench ran:\n{text}"
    );
}

/// Under pgbench load on a transaction-mode pgfresh (10 server connections per node),
/// 200 clients misbehave: they vanish mid-startup, mid-message after login, inside an
/// open transaction, and right after sending a query with a large result. pgbench loses
/// nothing, every vanished session is cleaned up, and the pool is whole afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_vanishing_under_load_disturb_nobody() {
    let _tables = PGBENCH_TABLES.lock().await;
    use tokio::io::AsyncWriteExt;
    let p = start_proxy(&format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = 10\n",
        config_text("")
    ));
    p.pgbench("app", &["-i", "-s", "1", "-q"]);
    // A duration, not a count: the misbehaving clients below must come while it runs.
    let bench = pgbench_in_background(&p, &["-c", "4", "-j", "4", "-T", "6"]);
    let logged_in = || async {
        let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
        s.write_all(&raw::startup("app_trust", "app"))
            .await
            .unwrap();
        raw::read_until(&mut s, b'Z').await;
        s
    };
    let query = |sql: &str| raw::msg(b'Q', &raw::cstr(sql));
    for round in 0..50 {
        // Mid-startup.
        let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
        s.write_all(&raw::startup("app_trust", "app")[..10])
            .await
            .unwrap();
        drop(s);
        // Mid-message after login.
        let mut s = logged_in().await;
        s.write_all(&query("SELECT 1")[..7]).await.unwrap();
        drop(s);
        // Inside an open transaction that holds a server connection.
        let mut s = logged_in().await;
        s.write_all(&query(&format!("BEGIN; SELECT {round}")))
            .await
            .unwrap();
        raw::read_until(&mut s, b'Z').await;
        drop(s);
        // Right after a query with a large result, unread.
        let mut s = logged_in().await;
        s.write_all(&query(
            "SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g",
        ))
        .await
        .unwrap();
        drop(s);
    }
    let during = !bench.is_finished();
    let out = bench.await.unwrap();
    let text = pgbench_clean(&out);
    assert!(during, "the clients vanished while pgbench ran:\n{text}");
    let cleaned = poll(
        "every vanished session to be cleaned up",
        Duration::from_secs(600),
        // The proxy is this test's own: no session at all may be left (not even
        // pgbench -i's, whose end the proxy may notice after pgbench has exited).
        || async { (p.shared.client_count() == 0).then_some(()) },
    );
    if tokio::time::timeout(Duration::from_secs(60), cleaned)
        .await
        .is_err()
    {
        let (clients, _) = pgfresh_tests::admin::console_ok(&p, "SHOW CLIENTS");
        panic!("sessions left after 60 s: {clients:#?}");
    }
    // The pool is whole: more clients than it has connections run at once.
    let clients: Vec<_> = futures_util::future::join_all((0..20).map(|_| p.connect())).await;
    let answers = futures_util::future::join_all(clients.iter().map(|c| {
        c.query_one(
            "/* pgfresh:primary */ SELECT count(*) FROM pgbench_branches",
            &[],
        )
    }))
    .await;
    for a in answers {
        assert_eq!(a.expect("a statement after the storm").get::<_, i64>(0), 1);
    }
}

/// Thaws a frozen node when dropped, so that a failing test never leaves a cluster
/// whose shutdown would wait on stopped processes.
struct Frozen<'a>(&'a pgfresh_localcluster::LocalCluster, usize);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = self.0.thaw_node(self.1);
    }
}

/// Reads on `p` from one client, one after another, until `stop` is set; returns the
/// longest a read took.
async fn longest_read(p: &ProxyHandle, stop: &std::sync::atomic::AtomicBool) -> Duration {
    let c = p.connect().await;
    let mut longest = Duration::ZERO;
    // Paced (a read every 5 ms at most), to leave the machine to the load under test.
    let mut pace = tokio::time::interval(Duration::from_millis(5));
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        pace.tick().await;
        let started = std::time::Instant::now();
        c.query_one("SELECT abalance FROM pgbench_accounts WHERE aid = 1", &[])
            .await
            .expect("a read while a replica is frozen");
        longest = longest.max(started.elapsed());
    }
    longest
}

/// pgbench select-only through pgfresh while a replica is frozen (SIGSTOP of all its
/// processes: its sockets stay open and nothing answers). Reads already sent to it are
/// given up on once the monitor marks it down and go to another node; new reads avoid
/// it; pgbench finishes, with the replica still frozen, with no failed transaction. Once
/// thawed, the replica serves reads again. Before pgfresh gave up on frozen nodes, every
/// client whose read had gone to the replica waited for as long as it stayed frozen.
/// Then replay is paused on the other replica under a read-mostly mix with writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_is_left_and_taken_back() {
    // The replica stays frozen for the rest of the run: about 30 s.
    let (c, p, bench) = select_only_load_on_replica_1(32).await;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let probe = longest_read(&p, &stop);
    let fault = async {
        c.freeze_node(1).unwrap();
        let frozen = Frozen(&c, 1);
        let frozen_mid_run = !bench.is_finished();
        poll(
            "the monitor to mark replica 1 down",
            Duration::from_secs(60),
            || async { (!p.shared.balancer.view().nodes[1].healthy).then_some(()) },
        )
        .await;
        // The replica stays frozen until pgbench is done: a read stuck on it would
        // keep pgbench from ending.
        let out = tokio::time::timeout(Duration::from_secs(120), bench)
            .await
            .expect("pgbench ends while the replica is still frozen")
            .unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (out, frozen_mid_run, frozen)
    };
    let (longest, (out, frozen_mid_run, frozen)) = tokio::join!(probe, fault);
    let text = pgbench_clean(&out);
    assert!(
        frozen_mid_run,
        "the replica froze while pgbench ran:\n{text}"
    );
    eprintln!("frozen replica: the longest read of one client took {longest:?}");
    drop(frozen);
    // Thawed, it is polled again, rejoins the read pool and serves reads.
    let reader = p.connect().await;
    poll(
        "replica 1 to serve reads again",
        Duration::from_secs(60),
        || async {
            let (port, _) = pgfresh_tests::admin::served_by(&reader, "pgbench_branches").await;
            (port == c.port(1)).then_some(())
        },
    )
    .await;

    // Replay paused on the other replica under a read-mostly mix with writes: it leaves
    // the read pool at once (a paused replica falls behind with every write), nothing
    // fails, and it comes back when replay resumes.
    let bench = pgbench_in_background(
        &p,
        &[
            "-b",
            "select-only@9",
            "-b",
            "simple-update@1",
            "-c",
            "4",
            "-j",
            "4",
            "-T",
            "4",
        ],
    );
    c.pause_replay(2).unwrap();
    let paused_mid_run = !bench.is_finished();
    poll(
        "replica 2 out of the read pool",
        Duration::from_secs(60),
        || async {
            let v = p.shared.balancer.view();
            (v.nodes[2].ineligible_reason.map(|r| r.as_str()) == Some("paused")).then_some(())
        },
    )
    .await;
    let out = bench.await.unwrap();
    c.resume_replay(2).unwrap();
    let text = pgbench_clean(&out);
    assert!(paused_mid_run, "replay paused while pgbench ran:\n{text}");
    poll(
        "replica 2 back in the read pool",
        Duration::from_secs(60),
        || async { p.shared.balancer.view().nodes[2].eligible.then_some(()) },
    )
    .await;
}

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kb * 1024
}

/// A client asks for a 1 GiB result and never reads it. pgfresh relays only as fast as
/// the client takes bytes, so the server ends up blocked writing (`ClientWrite`) while
/// pgfresh's memory stays where it was; other sessions go on; when the client goes
/// away, the query's server connection is closed (its state is unknown) and the server
/// stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_a_huge_result_costs_no_memory() {
    slow_reader_costs_no_memory("/* pgfresh:primary */ ", 128 << 20).await;
}

/// The same after a write in the same simple query: the output held while the write's
/// position is learned is bounded too.
#[tokio::test]
async fn a_huge_result_after_a_write_is_not_held_in_memory() {
    let p = proxy();
    let t = unique("write_then_read");
    p.connect()
        .await
        .batch_execute(&format!("CREATE TABLE {t}(v int)"))
        .await
        .unwrap();
    // Without the bound on held output this process grew by 99–159 MiB by the time the
    // server looked blocked (and kept growing); with it, by about 1 MiB.
    slow_reader_costs_no_memory(
        &format!("BEGIN; INSERT INTO {t} VALUES (1); COMMIT; "),
        48 << 20,
    )
    .await;
}

/// A client sends `prefix` and a query with a 1 GiB result, then never reads: the
/// server ends up blocked writing it while this process (pgfresh) grew by less than
/// `limit` bytes; other sessions go on; when the client leaves the server stops.
async fn slow_reader_costs_no_memory(prefix: &str, limit: u64) {
    use tokio::io::AsyncWriteExt;
    let p = proxy();
    let before = rss();
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(&raw::startup("app_trust", "app"))
        .await
        .unwrap();
    raw::read_until(&mut s, b'Z').await;
    let marker = unique("slow_reader");
    s.write_all(&raw::msg(
        b'Q',
        &raw::cstr(&format!(
            "{prefix}SELECT '{marker}', repeat('x', 1024) FROM generate_series(1, 1048576)"
        )),
    ))
    .await
    .unwrap();
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%{marker}%' \
         AND query NOT LIKE '%pg_stat_activity%' AND wait_event = 'ClientWrite'"
    );
    // Blocked for good, not for a moment while pgfresh was busy: seen 10 times in a row.
    let in_a_row = std::cell::Cell::new(0);
    poll(
        "the server blocked writing the result",
        Duration::from_secs(120),
        || async {
            let blocked = cluster().psql(0, "postgres", &waiting).ok()? == "1";
            in_a_row.set(if blocked { in_a_row.get() + 1 } else { 0 });
            (in_a_row.get() >= 10).then_some(())
        },
    )
    .await;
    let grown = rss().saturating_sub(before);
    eprintln!(
        "slow reader: the server is blocked writing; this process grew by {} KiB",
        grown / 1024
    );
    assert!(
        grown < limit,
        "pgfresh buffered the result: {} MiB more",
        grown >> 20
    );
    // Other sessions are not held up.
    let other = p.connect().await;
    let n: i64 = other
        .query_one(
            "/* pgfresh:primary */ SELECT count(*) FROM generate_series(1, 10)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 10);
    // The client goes away: the server stops producing the result.
    drop(s);
    let running = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%{marker}%' \
         AND query NOT LIKE '%pg_stat_activity%'"
    );
    poll(
        "the server to stop the abandoned query",
        Duration::from_secs(120),
        || async { (cluster().psql(0, "postgres", &running).ok()? == "0").then_some(()) },
    )
    .await;
}

/// A standby closes the session's connection while the session reads from another node
/// (a terminated backend, a shutdown): the next statement bound for that standby finds
/// it closed before anything was sent and connects again, also inside a read-only
/// transaction, where nothing may be retried once sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_while_idle_is_replaced_before_use() {
    let p = proxy();
    let mut c = p.connect().await;
    let name = unique("idle_closed");
    let t = unique("idle_closed_t");
    c.batch_execute(&format!(
        "SET application_name = '{name}'; CREATE TABLE {t}(v int); INSERT INTO {t} VALUES (1)"
    ))
    .await
    .unwrap();
    wait_replicated_on(cluster(), &c).await;
    let (s1, s2) = (i32::from(node_port(1)), i32::from(node_port(2)));
    let read = format!("SELECT inet_server_port() FROM {t}");
    // Reads until the session holds a connection on standby 1 and last read on standby 2
    // (a deadline, not a count: on a loaded machine a standby may stay behind the lag
    // thresholds, and out of the reads' choice, for a while).
    let (mut seen1, mut last) = (false, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while std::time::Instant::now() < deadline {
        last = c.query_one(&read, &[]).await.unwrap().get(0);
        seen1 |= last == s1;
        if seen1 && last == s2 {
            break;
        }
    }
    assert!(seen1 && last == s2, "reads never went to both standbys");
    let on_1 = format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'");
    let killed = cluster()
        .psql(
            1,
            "postgres",
            &format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = '{name}'"
            ),
        )
        .unwrap();
    assert_eq!(killed, "1");
    poll(
        "the backend on standby 1 to be gone",
        Duration::from_secs(60),
        || async { (cluster().psql(1, "postgres", &on_1).ok()? == "0").then_some(()) },
    )
    .await;
    // Read-only transactions until one runs on standby 1 again: none fails.
    let mut landed = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while std::time::Instant::now() < deadline {
        let tx = c.build_transaction().read_only(true).start().await.unwrap();
        let port: i32 = tx.query_one(&read, &[]).await.unwrap().get(0);
        tx.commit().await.unwrap();
        if port == s1 {
            landed = true;
            break;
        }
    }
    assert!(landed, "no read-only transaction ran on standby 1");
}
