//! Routing end to end on a real primary + 2 streaming standbys: reads to replicas,
//! writes and hot relations to the primary, transactions on one node, the
//! must-primary list, lagging replicas out of the pool.
//!
//! Tests here change replication (delays, pauses), so they run one at a time.

use std::collections::HashMap;
use std::time::Duration;

use pgfresh_tests::*;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

async fn port_of(c: &tokio_postgres::Client, sql: &str) -> u16 {
    let row = c
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    row.get::<_, i32>(0) as u16
}

fn primary_port() -> u16 {
    node_port(0)
}

fn standby_ports() -> [u16; 2] {
    [node_port(1), node_port(2)]
}

/// Polls until `sql` (whose first column is `inet_server_port()`) runs on a standby.
async fn on_a_standby(c: &tokio_postgres::Client, sql: &str, what: &str) {
    poll(what, Duration::from_secs(60), || async {
        standby_ports()
            .contains(&port_of(c, sql).await)
            .then_some(())
    })
    .await;
}

async fn wait_replicated(c: &tokio_postgres::Client) {
    wait_replicated_on(cluster(), c).await;
}

#[tokio::test]
async fn cold_reads_are_spread_over_both_replicas() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let c = p.connect().await;
    let t = unique("cold");
    c.batch_execute(&format!(
        "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1)"
    ))
    .await
    .unwrap();
    wait_replicated(&c).await;
    // Once the write is older than the TTL, reads go to replicas.
    let sql = format!("SELECT inet_server_port() FROM {t}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while port_of(&c, &sql).await == primary_port() {
        assert!(
            std::time::Instant::now() < deadline,
            "reads never left the primary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut seen: HashMap<u16, usize> = HashMap::new();
    for _ in 0..200 {
        *seen.entry(port_of(&c, &sql).await).or_default() += 1;
    }
    assert!(
        !seen.contains_key(&primary_port()),
        "cold read served by the primary: {seen:?}"
    );
    for s in standby_ports() {
        assert!(
            seen.get(&s).copied().unwrap_or(0) > 20,
            "replica {s} got too few reads: {seen:?}"
        );
    }
}

#[tokio::test]
async fn read_after_write_never_misses_with_delayed_replicas() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let delay = ApplyDelay::set(300);
    let writer = p.connect().await;
    let reader = p.connect().await;
    let t = unique("raw");
    writer
        .batch_execute(&format!("CREATE TABLE {t}(id int primary key, v text)"))
        .await
        .unwrap();
    let ins = writer
        .prepare(&format!("INSERT INTO {t} VALUES ($1, 'x')"))
        .await
        .unwrap();
    let sel_same = writer
        .prepare(&format!("SELECT count(*) FROM {t} WHERE id = $1"))
        .await
        .unwrap();
    let sel_other = reader
        .prepare(&format!("SELECT count(*) FROM {t} WHERE id = $1"))
        .await
        .unwrap();
    let (mut same_misses, mut cross_misses) = (0, 0);
    for i in 0..200i32 {
        writer.execute(&ins, &[&i]).await.unwrap();
        // Same session, at once.
        let n: i64 = writer.query_one(&sel_same, &[&i]).await.unwrap().get(0);
        same_misses += usize::from(n != 1);
        // Another session, at once (simple protocol too).
        let n: i64 = reader.query_one(&sel_other, &[&i]).await.unwrap().get(0);
        cross_misses += usize::from(n != 1);
        let rows = reader
            .simple_query(&format!("SELECT id FROM {t} WHERE id = {i}"))
            .await
            .unwrap();
        let found = rows
            .iter()
            .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)));
        cross_misses += usize::from(!found);
    }
    drop(delay);
    assert_eq!(same_misses, 0, "same-session read-after-write misses");
    assert_eq!(cross_misses, 0, "cross-session read-after-write misses");
}

/// pgfresh's own queries name `pg_catalog`: a session whose search path puts a schema
/// with a `pg_current_wal_insert_lsn()` of its own first cannot hand pgfresh a made-up commit
/// position (one every replica has replayed, so the next read would go to a stale one).
#[tokio::test]
async fn a_shadowing_function_cannot_fake_a_commit_position() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let writer = p.connect().await;
    let reader = p.connect().await;
    let t = unique("shadowed");
    let s = unique("shadowing");
    writer
        .batch_execute(&format!(
            "CREATE SCHEMA {s};
             CREATE FUNCTION {s}.pg_current_wal_insert_lsn() RETURNS pg_lsn
                 LANGUAGE sql AS $$SELECT '0/1'::pg_lsn$$;
             CREATE TABLE {t}(id int primary key)"
        ))
        .await
        .unwrap();
    wait_replicated(&writer).await;
    writer
        .batch_execute(&format!("SET search_path = {s}, pg_catalog, public"))
        .await
        .unwrap();
    let delay = ApplyDelay::set(300);
    let mut misses = 0;
    for i in 0..50i32 {
        writer
            .execute(&format!("INSERT INTO {t} VALUES ($1)"), &[&i])
            .await
            .unwrap();
        let n: i64 = reader
            .query_one(&format!("SELECT count(*) FROM {t} WHERE id = $1"), &[&i])
            .await
            .unwrap()
            .get(0);
        misses += usize::from(n != 1);
    }
    drop(delay);
    assert_eq!(misses, 0, "reads that missed the write just acknowledged");
}

#[tokio::test]
async fn transactions_stay_on_one_node() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let c = p.connect().await;
    let t = p.cold_table(&c, "txn").await;
    let mut replica_txns = 0;
    for _ in 0..20 {
        c.batch_execute("BEGIN READ ONLY").await.unwrap();
        let first = port_of(&c, &format!("SELECT inet_server_port() FROM {t}")).await;
        for _ in 0..4 {
            assert_eq!(
                port_of(&c, "SELECT inet_server_port()").await,
                first,
                "read-only transaction hopped nodes"
            );
        }
        c.batch_execute("COMMIT").await.unwrap();
        replica_txns += usize::from(first != primary_port());
    }
    assert!(
        replica_txns > 0,
        "read-only transactions never used a replica"
    );
    // Read-write transactions run wholly on the primary, reads included.
    for _ in 0..5 {
        c.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            port_of(&c, &format!("SELECT inet_server_port() FROM {t} LIMIT 1")).await,
            primary_port()
        );
        c.batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
            .await
            .unwrap();
        assert_eq!(
            port_of(&c, "SELECT inet_server_port()").await,
            primary_port()
        );
        c.batch_execute("COMMIT").await.unwrap();
    }
    // Extended-protocol transaction (tokio-postgres Transaction).
    let mut c = c;
    let tx = c.transaction().await.unwrap();
    let ports: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(
                tx.query_one("SELECT inet_server_port()", &[])
                    .await
                    .unwrap()
                    .get::<_, i32>(0) as u16,
            );
        }
        v
    };
    tx.commit().await.unwrap();
    assert!(ports.iter().all(|p| *p == primary_port()), "{ports:?}");
}

#[tokio::test]
async fn must_primary_statements_never_reach_a_standby() {
    let _g = SERIAL.lock().await;
    let p = start_proxy(&config_text("write_function_list = [\"bump\"]"));
    let c = p.connect().await;
    let t = unique("mp");
    c.batch_execute(&format!(
        "CREATE TABLE {t}(id int primary key, v int); INSERT INTO {t} VALUES (1, 0);
         CREATE SEQUENCE {t}_seq;
         CREATE FUNCTION bump() RETURNS int LANGUAGE plpgsql AS $$ BEGIN UPDATE {t} SET v = v + 1; RETURN inet_server_port(); END $$;
         CREATE PROCEDURE {t}_proc() LANGUAGE sql AS $$ UPDATE {t} SET v = v + 1 $$;"
    ))
    .await
    .unwrap();
    wait_replicated(&c).await;
    p.wait_cold(&[&t, &format!("{t}_seq")]).await;
    let pp = primary_port();
    let returning_port = [
        format!("SELECT nextval('{t}_seq'), inet_server_port()"),
        format!("SELECT setval('{t}_seq', 10), inet_server_port()"),
        format!("SELECT inet_server_port() FROM {t} FOR UPDATE"),
        format!("SELECT inet_server_port() FROM {t} FOR SHARE"),
        format!("SELECT inet_server_port() FROM {t} FOR NO KEY UPDATE"),
        format!("SELECT inet_server_port() FROM {t} FOR KEY SHARE"),
        format!(
            "WITH u AS (UPDATE {t} SET v = v + 1 RETURNING id) SELECT inet_server_port() FROM u"
        ),
        "SELECT txid_current()::int * 0 + inet_server_port()".to_string(),
        "SELECT pg_current_xact_id()::text::bigint * 0 + inet_server_port()".to_string(),
        "SELECT pg_advisory_xact_lock(42)::text, inet_server_port()".to_string(),
        "SELECT pg_try_advisory_xact_lock(43), inet_server_port()".to_string(),
        "SELECT pg_notify('pgfresh_mp', 'x'), inet_server_port()".to_string(),
        "SELECT bump()".to_string(),
    ];
    for sql in &returning_port {
        let rows = c
            .simple_query(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let port = rows
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    r.get(r.len() - 1).map(|s| s.parse::<u16>().unwrap())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("{sql}: no row"));
        assert_eq!(port, pp, "{sql} ran on a standby");
    }
    // Statements a standby refuses outright: success proves they ran on the primary.
    for sql in [
        format!("BEGIN; LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE; SELECT * FROM {t}; COMMIT"),
        "LISTEN pgfresh_mp; UNLISTEN *".to_string(),
        format!("CALL {t}_proc()"),
        format!("DO $$ BEGIN UPDATE {t} SET v = v + 1; END $$"),
        format!("SELECT * INTO {t}_copy FROM {t}"),
        format!("EXPLAIN ANALYZE UPDATE {t} SET v = v + 1"),
        "CREATE TEMP TABLE mp_tmp(a int); INSERT INTO mp_tmp VALUES (1); SELECT * FROM mp_tmp"
            .to_string(),
        "DISCARD ALL".to_string(),
        format!("BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY; SELECT * FROM {t}; COMMIT"),
        "SELECT pg_advisory_lock(7); SELECT pg_advisory_unlock(7)".to_string(),
    ] {
        c.batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    // Two-phase commit: PREPARE TRANSACTION and COMMIT PREPARED.
    let gid = unique("gid");
    c.batch_execute(&format!(
        "BEGIN; INSERT INTO {t} VALUES (200, 0); PREPARE TRANSACTION '{gid}'"
    ))
    .await
    .unwrap();
    c.batch_execute(&format!("COMMIT PREPARED '{gid}'"))
        .await
        .unwrap();
    // COPY FROM STDIN.
    let sink = c.copy_in(&format!("COPY {t} FROM STDIN")).await.unwrap();
    futures_util::pin_mut!(sink);
    futures_util::SinkExt::send(&mut sink, bytes::Bytes::from_static(b"100\t1\n"))
        .await
        .unwrap();
    sink.finish().await.unwrap();
    // LOCK then SELECT in one transaction: the SELECT runs where the lock is.
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute(&format!("LOCK TABLE {t}")).await.unwrap();
    assert_eq!(
        port_of(&c, &format!("SELECT inet_server_port() FROM {t} LIMIT 1")).await,
        pp
    );
    c.batch_execute("COMMIT").await.unwrap();
    // Temp tables pin the session to the primary until DISCARD ALL.
    c.batch_execute("CREATE TEMP TABLE pin_tmp(a int)")
        .await
        .unwrap();
    for _ in 0..5 {
        assert_eq!(port_of(&c, "SELECT inet_server_port()").await, pp);
    }
    c.batch_execute("DISCARD ALL").await.unwrap();
}

#[tokio::test]
async fn settings_and_prepared_statements_work_on_replicas() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let c = p.connect().await;
    let schema = unique("sch");
    c.batch_execute(&format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.items(id int); INSERT INTO {schema}.items VALUES (7)"))
        .await
        .unwrap();
    wait_replicated(&c).await;
    p.wait_cold(&["items"]).await;
    c.batch_execute(&format!("SET search_path = {schema}, public"))
        .await
        .unwrap();
    c.batch_execute("SET statement_timeout = '4321ms'")
        .await
        .unwrap();
    let mut on_replica = 0;
    for _ in 0..20 {
        let r = c
            .query_one(
                "SELECT id, current_setting('statement_timeout'), inet_server_port() FROM items",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(r.get::<_, i32>(0), 7);
        assert_eq!(r.get::<_, String>(1), "4321ms");
        on_replica += usize::from(r.get::<_, i32>(2) as u16 != primary_port());
    }
    assert!(on_replica > 0, "no read reached a replica");
    // A statement prepared on one node executes on the others.
    let stmt = c
        .prepare("SELECT inet_server_port(), $1::int + 1")
        .await
        .unwrap();
    let mut ports = std::collections::HashSet::new();
    for i in 0..30i32 {
        let r = c.query_one(&stmt, &[&i]).await.unwrap();
        assert_eq!(r.get::<_, i32>(1), i + 1);
        ports.insert(r.get::<_, i32>(0));
    }
    assert!(
        ports.len() >= 2,
        "prepared statement ran on one node only: {ports:?}"
    );
    // SQL-level PREPARE/EXECUTE follows the session too.
    c.batch_execute("PREPARE q(int) AS SELECT inet_server_port(), $1 * 2")
        .await
        .unwrap();
    for _ in 0..10 {
        let rows = c.simple_query("EXECUTE q(21)").await.unwrap();
        let v = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(1).map(str::to_string),
            _ => None,
        });
        assert_eq!(v.as_deref(), Some("42"));
    }
    c.batch_execute("DEALLOCATE q").await.unwrap();
}

#[tokio::test]
async fn paused_replicas_leave_the_pool_and_reads_fall_back() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let c = p.connect().await;
    let t = p.cold_table(&c, "pause").await;
    let sql = format!("SELECT inet_server_port() FROM {t}");
    let [s1, s2] = standby_ports();
    cluster().pause_replay(1).unwrap();
    // Make WAL so the paused replica falls behind.
    c.batch_execute(&format!(
        "CREATE TABLE {t}_other(id int); INSERT INTO {t}_other SELECT generate_series(1, 1000)"
    ))
    .await
    .unwrap();
    let shared = p.shared.clone();
    eventually(
        "paused replica leaves the pool",
        Duration::from_secs(30),
        || {
            let v = shared.balancer.view();
            !v.nodes[1].eligible
        },
    )
    .await;
    for _ in 0..50 {
        let port = port_of(&c, &sql).await;
        assert_ne!(port, s1, "read served by the paused replica");
    }
    cluster().pause_replay(2).unwrap();
    c.batch_execute(&format!("INSERT INTO {t}_other VALUES (1)"))
        .await
        .unwrap();
    eventually("both replicas out", Duration::from_secs(30), || {
        let v = shared.balancer.view();
        !v.nodes[1].eligible && !v.nodes[2].eligible
    })
    .await;
    for _ in 0..20 {
        assert_eq!(
            port_of(&c, &sql).await,
            primary_port(),
            "with no eligible replica, reads fall back to the primary"
        );
    }
    let metrics = pgfresh_proxy::admin::metrics_handle()
        .map(|h| h.render())
        .unwrap_or_default();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("pgfresh_primary_fallbacks_total") && !l.ends_with(" 0")),
        "fallbacks not counted:\n{metrics}"
    );
    assert!(
        metrics.contains("pgfresh_routed_total"),
        "routing decisions not counted"
    );
    cluster().resume_replay(1).unwrap();
    cluster().resume_replay(2).unwrap();
    eventually("replicas back in the pool", Duration::from_secs(60), || {
        let v = shared.balancer.view();
        v.nodes[1].eligible && v.nodes[2].eligible
    })
    .await;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..100 {
        seen.insert(port_of(&c, &sql).await);
    }
    assert!(
        seen.contains(&s1) || seen.contains(&s2),
        "reads did not return to the replicas: {seen:?}"
    );
}

#[tokio::test]
async fn parser_off_sends_everything_to_the_primary() {
    let _g = SERIAL.lock().await;
    let p = start_proxy(&config_text("enable_query_parser = false"));
    let c = p.connect().await;
    for _ in 0..20 {
        assert_eq!(
            port_of(&c, "SELECT inet_server_port()").await,
            primary_port()
        );
    }
}

#[tokio::test]
async fn recency_off_balances_reads_by_lag_only() {
    let _g = SERIAL.lock().await;
    let p = start_proxy(&config_text("enable_recent_access_routing = false"));
    let c = p.connect().await;
    let t = unique("norec");
    c.batch_execute(&format!("CREATE TABLE {t}(id int)"))
        .await
        .unwrap();
    wait_replicated(&c).await;
    // Right after a write, the read is not forced to the primary (with recency on, every
    // one of these reads would be).
    let mut on_replica = 0;
    for i in 0..20 {
        c.batch_execute(&format!("INSERT INTO {t} VALUES ({i})"))
            .await
            .unwrap();
        let sql = format!("SELECT inet_server_port() FROM (SELECT 1) x LEFT JOIN {t} ON false");
        on_replica += usize::from(port_of(&c, &sql).await != primary_port());
    }
    assert!(
        on_replica > 0,
        "recency routing is off: reads right after writes may use replicas"
    );
}

#[tokio::test]
async fn graceful_shutdown_lets_a_transaction_finish() {
    let _g = SERIAL.lock().await;
    // 9 s of draining, then 1 s to close at transaction boundaries.
    let text = config_text("").replacen("[proxy]\n", "[proxy]\nshutdown_timeout_ms = 10000\n", 1);
    assert!(text.contains("shutdown_timeout_ms = 10000"));
    let mut p = start_proxy(&text);
    let c = p.connect().await;
    let t = unique("grace");
    c.batch_execute(&format!(
        "CREATE TABLE {t}(id int); BEGIN; INSERT INTO {t} VALUES (1)"
    ))
    .await
    .unwrap();
    p.request_stop(Stop::Graceful);
    // New clients are refused once the listener is closed...
    let addr = p.addr;
    eventually("listener closed", Duration::from_secs(30), || {
        std::net::TcpStream::connect(addr).is_err()
    })
    .await;
    // ...but the open transaction still commits, and while the proxy drains the
    // session goes on serving its client.
    c.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("SELECT 1").await.unwrap();
    // Then the idle session is closed (57P01) and the proxy stops.
    eventually("the idle session closed", Duration::from_secs(60), || {
        c.is_closed()
    })
    .await;
    eventually("proxy stopped", Duration::from_secs(30), || p.has_stopped()).await;
    let check = cluster()
        .psql(0, "app", &format!("SELECT count(*) FROM {t}"))
        .unwrap();
    assert_eq!(check, "1");
}

#[tokio::test]
async fn routing_hints_make_reads_safer_but_never_move_writes() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let c = p.connect().await;
    let t = p.cold_table(&c, "hint").await;
    let read = format!("SELECT inet_server_port() FROM {t}");
    // A comment hint on one statement.
    for _ in 0..5 {
        assert_eq!(
            port_of(&c, &format!("/* pgfresh:primary */ {read}")).await,
            primary_port()
        );
    }
    // A per-session setting, intercepted by pgfresh (the server never sees it).
    c.batch_execute("SET pgfresh.route = 'primary'")
        .await
        .unwrap();
    for _ in 0..5 {
        assert_eq!(port_of(&c, &read).await, primary_port());
    }
    c.batch_execute("SET pgfresh.route = 'auto'").await.unwrap();
    let mut replica = 0;
    for _ in 0..10 {
        replica += usize::from(port_of(&c, &read).await != primary_port());
    }
    assert!(
        replica > 0,
        "after pgfresh.route = 'auto' reads use replicas again"
    );
    // Per connection, as a startup option.
    let conninfo = format!(
        "{} options='-c pgfresh.route=primary'",
        p.conninfo("app", APP_PASSWORD, "app")
    );
    let (pinned, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    for _ in 0..5 {
        assert_eq!(port_of(&pinned, &read).await, primary_port());
    }
    // A replica hint lets a read of a just-written table use a replica; it never
    // moves a write.
    c.batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
        .await
        .unwrap();
    let hinted = port_of(&c, &format!("/* pgfresh:replica */ SELECT inet_server_port() FROM (SELECT 1) x LEFT JOIN {t} ON false")).await;
    assert_ne!(hinted, primary_port(), "replica hint on a hot read");
    let row = c
        .query_one(
            &format!(
                "/* pgfresh:replica */ INSERT INTO {t} VALUES (3) RETURNING inet_server_port()"
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i32>(0) as u16,
        primary_port(),
        "a write with a replica hint still goes to the primary"
    );
}

/// The port a query reports, sent with the simple (`simple`) or extended protocol.
async fn port_via(c: &tokio_postgres::Client, sql: &str, simple: bool) -> u16 {
    if !simple {
        let rows = c
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        return rows
            .first()
            .map(|r| r.get::<_, i32>(0) as u16)
            .expect("a row");
    }
    let msgs = c
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    msgs.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql}: no row"))
        .parse()
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `{}` in each form stands for the hint's value (`primary` or `replica`).
const HINT_FORMS: [(&str, &str); 6] = [
    ("start", "/* pgfresh:{} */ SELECT inet_server_port() FROM {t}"),
    ("middle", "SELECT /* pgfresh:{} */ inet_server_port() FROM {t}"),
    ("end", "SELECT inet_server_port() FROM {t} /* pgfresh:{} */"),
    ("end, line comment", "SELECT inet_server_port() FROM {t} -- pgfresh:{}"),
    (
        "sqlcommenter",
        "SELECT inet_server_port() FROM {t} /*action='list',pgfresh='{}',traceparent='00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01'*/",
    ),
    (
        "sqlcommenter, URL-encoded",
        "SELECT inet_server_port() FROM {t} /*framework='django%3A4.2',pgfresh='%{}'*/",
    ),
];

fn hinted(form: &str, value: &str, t: &str) -> String {
    // The URL-encoded form spells the value's first letter as %XX.
    let value = if form.contains("='%{}'") {
        let (first, rest) = value.split_at(1);
        format!("{:02X}{rest}", first.as_bytes()[0])
    } else {
        value.to_string()
    };
    form.replace("{}", &value).replace("{t}", t)
}

#[tokio::test]
async fn hints_anywhere_in_the_text_route_as_written() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let c = p.connect().await;
    let t = p.cold_table(&c, "hintpos").await;
    for simple in [true, false] {
        let protocol = if simple { "simple" } else { "extended" };
        // Unhinted, a cold read goes to a replica: the primary hint is what moves it.
        let plain = format!("SELECT inet_server_port() FROM {t}");
        assert_ne!(
            port_via(&c, &plain, simple).await,
            primary_port(),
            "{protocol}: cold read"
        );
        for (name, form) in HINT_FORMS {
            let sql = hinted(form, "primary", &t);
            for _ in 0..5 {
                assert_eq!(
                    port_via(&c, &sql, simple).await,
                    primary_port(),
                    "{protocol}, primary hint at the {name}: {sql}"
                );
            }
        }
        // A replica hint sends a read of a table written an instant ago to a replica.
        for (name, form) in HINT_FORMS {
            c.batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
                .await
                .unwrap();
            let sql = hinted(form, "replica", &t);
            let port = port_via(&c, &sql, simple).await;
            assert!(
                standby_ports().contains(&port),
                "{protocol}, replica hint at the {name} right after a write: {sql} ran on {port}"
            );
        }
        // Both hints: primary wins.
        let both = format!(
            "/* pgfresh:replica */ SELECT inet_server_port() FROM {t} /*pgfresh='primary'*/"
        );
        assert_eq!(
            port_via(&c, &both, simple).await,
            primary_port(),
            "{protocol}: {both}"
        );
        // A hint inside a string literal is no hint.
        p.wait_cold(&[&t]).await;
        let literal =
            format!("SELECT inet_server_port() FROM {t} WHERE '/* pgfresh:primary */' <> ''");
        assert_ne!(
            port_via(&c, &literal, simple).await,
            primary_port(),
            "{protocol}: {literal}"
        );
    }
}

#[tokio::test]
async fn commits_mark_relations_and_rollbacks_do_not() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let c = p.connect().await;
    let (a, b) = (unique("rb_a"), unique("rb_b"));
    c.batch_execute(&format!(
        "CREATE TABLE {a}(id int); CREATE TABLE {b}(id int)"
    ))
    .await
    .unwrap();
    p.wait_cold(&[&a, &b]).await;
    let hot = |t: &str| {
        p.shared
            .recency
            .lookup("app", &[pgfresh_recency::RelKey::unqualified(t)])
            .is_hot()
    };
    c.batch_execute(&format!("BEGIN; INSERT INTO {a} VALUES (1); ROLLBACK"))
        .await
        .unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute(&format!("INSERT INTO {a} VALUES (2)"))
        .await
        .unwrap();
    assert!(!hot(&a), "an uncommitted write is not marked");
    c.batch_execute("ROLLBACK").await.unwrap();
    assert!(!hot(&a), "a rolled-back write marks nothing");
    c.batch_execute("BEGIN").await.unwrap();
    c.batch_execute(&format!("INSERT INTO {b} VALUES (1)"))
        .await
        .unwrap();
    c.batch_execute("SAVEPOINT s; ROLLBACK TO SAVEPOINT s")
        .await
        .unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    assert!(hot(&b), "a committed write is marked by the time COMMIT returns, savepoint rollbacks notwithstanding");
}

#[tokio::test]
async fn user_functions_follow_their_catalog_volatility() {
    let _g = SERIAL.lock().await;
    let stable = unique("f_stable");
    let volatile = unique("f_volatile");
    // Created before the proxy reads pg_proc.
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "CREATE FUNCTION {stable}() RETURNS int LANGUAGE sql STABLE AS 'SELECT inet_server_port()';
                 CREATE FUNCTION {volatile}() RETURNS int LANGUAGE sql VOLATILE AS 'SELECT inet_server_port()';"
            ),
        )
        .unwrap();
    let p = start_proxy(&config_text(""));
    let c = p.connect().await;
    wait_replicated(&c).await;
    // Until pg_proc is loaded the call is unknown and goes to the primary; then a STABLE
    // function may run on a replica.
    let sql = format!("SELECT {stable}()");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while port_of(&c, &sql).await == primary_port() {
        assert!(
            std::time::Instant::now() < deadline,
            "a STABLE function never ran on a replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..10 {
        assert_eq!(
            port_of(&c, &format!("SELECT {volatile}()")).await,
            primary_port(),
            "VOLATILE goes to the primary"
        );
    }
}

/// A function redefined through pgfresh from a STABLE read into a VOLATILE write: its next
/// call goes to the primary (the volatilities learned before are dropped with the DDL), not
/// to a standby that would refuse the write.
#[tokio::test]
async fn a_function_redefined_to_write_goes_to_the_primary_at_once() {
    let _g = SERIAL.lock().await;
    let (t, f) = (unique("redef_t"), unique("redef_f"));
    let p = start_proxy(&config_text(""));
    let c = p.connect().await;
    c.batch_execute(&format!(
        "CREATE TABLE {t}(id int);
         CREATE FUNCTION {f}() RETURNS int LANGUAGE sql STABLE AS 'SELECT inet_server_port()'"
    ))
    .await
    .unwrap();
    wait_replicated(&c).await;
    poll(
        "the STABLE function to run on a replica",
        Duration::from_secs(60),
        || async { (port_of(&c, &format!("SELECT {f}()")).await != primary_port()).then_some(()) },
    )
    .await;
    c.batch_execute(&format!(
        "CREATE OR REPLACE FUNCTION {f}() RETURNS int LANGUAGE sql VOLATILE AS \
         'INSERT INTO {t} VALUES (1); SELECT inet_server_port()'"
    ))
    .await
    .unwrap();
    let port: i32 = c
        .query_one(&format!("SELECT {f}()"), &[])
        .await
        .unwrap_or_else(|e| panic!("the call of the redefined function failed: {e}"))
        .get(0);
    assert_eq!(port as u16, primary_port());
}

#[tokio::test]
async fn lsn_routing_sends_hot_reads_to_replicas_that_replayed_the_write() {
    let _g = SERIAL.lock().await;
    // A long TTL: only the learned positions can let a hot read leave the primary.
    let p = start_proxy(&config_text("recent_access_ttl_ms = 60000"));
    let writer = p.connect().await;
    let reader = p.connect().await;
    let t = unique("lsn");
    writer
        .batch_execute(&format!("CREATE TABLE {t}(id int primary key)"))
        .await
        .unwrap();
    // Read-after-write across sessions never misses.
    let mut misses = 0;
    for i in 0..100i32 {
        if i % 2 == 0 {
            writer
                .execute(&format!("INSERT INTO {t} VALUES ({i})"), &[])
                .await
                .unwrap();
        } else {
            writer
                .batch_execute(&format!("BEGIN; INSERT INTO {t} VALUES ({i}); COMMIT"))
                .await
                .unwrap();
        }
        let n: i64 = reader
            .query_one(&format!("SELECT count(*) FROM {t} WHERE id = {i}"), &[])
            .await
            .unwrap()
            .get(0);
        misses += usize::from(n != 1);
    }
    assert_eq!(misses, 0);
    // Once the replicas have replayed the writes, the still-hot table is read from them.
    wait_replicated(&writer).await;
    let sql = format!("SELECT inet_server_port() FROM {t} LIMIT 1");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while port_of(&reader, &sql).await == primary_port() {
        assert!(
            std::time::Instant::now() < deadline,
            "hot reads never reached a caught-up replica"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(p
        .shared
        .recency
        .lookup("app", &[pgfresh_recency::RelKey::unqualified(&t)])
        .is_hot());
    // With replay paused, a new write keeps its readers on the primary.
    cluster().pause_replay(1).unwrap();
    cluster().pause_replay(2).unwrap();
    writer
        .execute(&format!("INSERT INTO {t} VALUES (1000)"), &[])
        .await
        .unwrap();
    for _ in 0..20 {
        let row = reader
            .query_one(
                &format!("SELECT inet_server_port(), count(*) FROM {t} WHERE id = 1000"),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(1), 1, "the new row is visible");
        assert_eq!(row.get::<_, i32>(0) as u16, primary_port());
    }
    cluster().resume_replay(1).unwrap();
    cluster().resume_replay(2).unwrap();
}

#[tokio::test]
async fn replica_wait_lets_a_hot_read_wait_for_a_replica_instead_of_the_primary() {
    let _g = SERIAL.lock().await;
    let p = start_proxy(&config_text(
        "recent_access_ttl_ms = 60000\nreplica_wait_ms = 10000",
    ));
    let delay = ApplyDelay::set(300);
    let writer = p.connect().await;
    let reader = p.connect().await;
    let t = unique("wait");
    writer
        .batch_execute(&format!("CREATE TABLE {t}(id int primary key)"))
        .await
        .unwrap();
    let mut on_replica = 0;
    for i in 0..10i32 {
        writer
            .execute(&format!("INSERT INTO {t} VALUES ({i})"), &[])
            .await
            .unwrap();
        let row = reader
            .query_one(
                &format!("SELECT inet_server_port(), count(*) FROM {t} WHERE id = {i}"),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(1), 1, "the row just written is visible");
        on_replica += usize::from(row.get::<_, i32>(0) as u16 != primary_port());
    }
    drop(delay);
    assert!(on_replica > 0, "no hot read waited for a replica");
    let metrics = pgfresh_proxy::admin::metrics_handle()
        .map(|h| h.render())
        .unwrap_or_default();
    assert!(
        metrics.contains("pgfresh_replica_wait_seconds"),
        "waits are recorded"
    );
}

/// While reads wait on replay positions, a read sent to a standby brings that standby's
/// replay position back with it (`SELECT pg_catalog.pg_last_wal_replay_lsn()` in the same
/// write). With the monitor's polls ten minutes apart, such a sample is the only way
/// pgfresh can learn that a standby replayed a new write. (Reads use the simple protocol
/// here: one unit each.)
#[tokio::test]
async fn a_read_on_a_standby_brings_back_its_replay_position() {
    let _g = SERIAL.lock().await;
    let slow = "sr_check_period_ms = 600000\nhealth_timeout_ms = 600000\n\
                replay_check_period_ms = 600000";
    // The monitor's first full poll is its only one here, and it must find both standbys
    // in the read pool: one still replaying what the primary wrote (as just after the
    // cluster was made, when this is the binary's first test) and that has replayed no
    // transaction since it started has an unknown time lag, which keeps it out of the
    // pool until the next full poll, ten minutes away. So the standbys catch up first, on
    // a commit of this test's own.
    cluster()
        .psql(
            0,
            "app",
            "CREATE TABLE IF NOT EXISTS sampled_catch_up(); DROP TABLE sampled_catch_up",
        )
        .expect("a commit on the primary");
    for i in 1..cluster().nodes().len() {
        cluster()
            .wait_caught_up(i, Duration::from_secs(60))
            .expect("standby replays");
    }
    let p = start_proxy(
        &config_text("recent_access_ttl_ms = 600000\nrecent_access_max_ttl_ms = 600000")
            .replace("sr_check_period_ms = 50", slow),
    );
    let pool = p.shared.balancer.view_now();
    assert!(
        pool.nodes[1].eligible && pool.nodes[2].eligible,
        "both standbys in the read pool after the first poll: {:?}",
        pool.nodes
            .iter()
            .map(|n| n.ineligible_reason)
            .collect::<Vec<_>>()
    );
    let c = p.connect().await;
    let t = unique("sampled");
    let hot_read = format!("SELECT inet_server_port() FROM {t}");
    let required = || {
        p.shared
            .recency
            .lookup("app", &[pgfresh_recency::RelKey::unqualified(&t)])
            .required_lsn()
            .expect("the write's position")
    };
    let known = || {
        let view = p.shared.balancer.view_now();
        [view.nodes[1].replay_lsn, view.nodes[2].replay_lsn]
    };
    c.batch_execute(&format!(
        "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1)"
    ))
    .await
    .unwrap();
    wait_replicated(&c).await;
    // The standbys stop replaying before the next write: the first hot read cannot find
    // a standby that has it, whatever the fast polls it starts answer meanwhile (they
    // run beside the session on the test's runtime), so it goes to the primary.
    let paused = ReplayPause::all();
    c.batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
        .await
        .unwrap();
    let second = required();
    assert_eq!(port_via(&c, &hot_read, true).await, primary_port());
    // That read started the demand for fresher positions: each standby's monitor polls
    // its position once (the next fast poll is ten minutes away), and learns where
    // replay stopped.
    let stopped = paused.positions();
    eventually("both standbys' fast polls", Duration::from_secs(60), || {
        known()
            .iter()
            .zip(&stopped)
            .all(|(k, s)| k.is_some_and(|k| k >= *s))
    })
    .await;
    // Replay goes on, and both standbys have the write; no poll will tell pgfresh.
    drop(paused);
    wait_replicated(&c).await;
    assert!(known().iter().all(|&k| k < Some(second)), "{:?}", known());
    assert_eq!(port_via(&c, &hot_read, true).await, primary_port());
    // A read of nothing hot goes to a standby and samples its position; the hot read
    // then goes to that standby.
    let (sampled, served) = poll(
        "a hot read served by the standby a read sampled",
        Duration::from_secs(60),
        || async {
            let sampled = port_via(&c, "SELECT inet_server_port()", true).await;
            let served = port_via(&c, &hot_read, true).await;
            (served != primary_port()).then_some((sampled, served))
        },
    )
    .await;
    assert_ne!(sampled, primary_port());
    assert_eq!(required(), second, "still hot, at the same position");
    assert_eq!(
        served, sampled,
        "only the sampled standby is known to have the write"
    );
}

/// Replay positions sampled after reads on standbys (see the test above) never let a read
/// reach a standby that has not replayed the write it depends on: with the standbys'
/// replay delayed, every read of the table just written sees the write, while reads of
/// nothing hot keep going to the standbys and sampling them.
#[tokio::test]
async fn sampled_replay_positions_never_cause_a_stale_read() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let delay = ApplyDelay::set(300);
    let writer = p.connect().await;
    let reader = p.connect().await;
    let t = unique("sampled_raw");
    writer
        .batch_execute(&format!("CREATE TABLE {t}(id int primary key)"))
        .await
        .unwrap();
    let samples = || {
        metric_value("pgfresh_replay_samples_total{node=\"pg1\"}")
            + metric_value("pgfresh_replay_samples_total{node=\"pg2\"}")
    };
    let before = samples();
    let (mut misses, mut on_standbys) = (0, 0);
    for i in 0..100i32 {
        writer
            .execute(&format!("INSERT INTO {t} VALUES ({i})"), &[])
            .await
            .unwrap();
        // A read of nothing hot: a standby, which may be sampled.
        on_standbys += usize::from(
            port_via(&reader, "SELECT inet_server_port()", true).await != primary_port(),
        );
        let rows = reader
            .simple_query(&format!("SELECT id FROM {t} WHERE id = {i}"))
            .await
            .unwrap();
        let found = rows
            .iter()
            .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)));
        misses += usize::from(!found);
    }
    drop(delay);
    assert_eq!(misses, 0, "read-after-write misses");
    assert_eq!(
        on_standbys, 100,
        "reads of nothing hot stay on the standbys"
    );
    assert!(samples() > before, "the standbys were sampled");
}

/// Extended reads on standbys while reads wait on replay positions (a table written
/// every round, its rows read back at once, replay delayed), through `p`: cold reads go
/// to the standbys, where one a period is followed by a sample of the standby's replay
/// position (a simple query, which destroys the unnamed statement). What each client
/// hears is exactly its own replies, also when its statement fails, and a Bind of the
/// unnamed statement without a Parse runs the client's statement again (pgfresh prepares
/// it again after the sample). Returns how many samples were taken.
async fn extended_reads_with_samples(p: &ProxyHandle, t: &str) -> f64 {
    use tokio::io::AsyncWriteExt;
    let samples = || {
        metric_value("pgfresh_replay_samples_total{node=\"pg1\"}")
            + metric_value("pgfresh_replay_samples_total{node=\"pg2\"}")
    };
    let mut writer = raw::connect(p.addr).await;
    let mut reader = raw::connect(p.addr).await;
    let insert = format!("INSERT INTO {t} VALUES ($1::int)");
    let hot = format!("SELECT count(*) FROM {t} WHERE id = $1::int");
    let before = samples();
    let mut on_standbys = 0;
    // A statement prepared under a name (as drivers prepare theirs), run by Bind alone.
    let mut prepare = exchange::parse("named_port", "SELECT inet_server_port()");
    prepare.extend(exchange::sync());
    reader.write_all(&prepare).await.unwrap();
    assert_eq!(raw::tags(&raw::read_until(&mut reader, b'Z').await), b"1Z");
    let mut named = raw::bind("named_port", &[]);
    named.extend(raw::msg(b'D', b"P\0"));
    named.extend(raw::execute());
    named.extend(raw::msg(b'S', &[]));
    for i in 0..150 {
        let id = i.to_string();
        let ask = async |s: &mut tokio::net::TcpStream, bytes: Vec<u8>| {
            s.write_all(&bytes).await.unwrap();
            raw::read_until(s, b'Z').await
        };
        let written = ask(&mut writer, raw::exec_params(&insert, &[&id])).await;
        assert_eq!(raw::tags(&written), b"12nCZ", "insert {i}");
        // Hot: waits for a standby that has the write, or goes to the primary; either
        // way reads wait on replay positions, so the standbys are sampled.
        let read = ask(&mut reader, raw::exec_params(&hot, &[&id])).await;
        assert_eq!(raw::tags(&read), b"12TDCZ", "hot read {i}");
        assert_eq!(raw::first_value(&read), "1", "read-after-write {i}");
        let cold = ask(
            &mut reader,
            raw::exec_params("SELECT inet_server_port()", &[]),
        )
        .await;
        assert_eq!(raw::tags(&cold), b"12TDCZ", "cold read {i}");
        let port: u16 = raw::first_value(&cold).parse().expect("a port");
        on_standbys += usize::from(port != primary_port());
        // The unnamed statement again, without a Parse: still the client's.
        let mut again = raw::bind("", &[]);
        again.extend(raw::msg(b'D', b"P\0"));
        again.extend(raw::execute());
        again.extend(raw::msg(b'S', &[]));
        let rerun = ask(&mut reader, again).await;
        assert_eq!(raw::tags(&rerun), b"2TDCZ", "bound again {i}");
        let value = raw::first_value(&rerun);
        assert!(
            value.parse::<u16>().is_ok(),
            "the client's statement ran: {value}"
        );
        // The named statement: its replies alone, on whichever node it ran.
        let by_name = ask(&mut reader, named.clone()).await;
        assert_eq!(raw::tags(&by_name), b"2TDCZ", "named read {i}");
        let port: u16 = raw::first_value(&by_name).parse().expect("a port");
        on_standbys += usize::from(port != primary_port());
        // A failing read: its error and ReadyForQuery, nothing of a sample's.
        let failed = ask(
            &mut reader,
            raw::exec_params("SELECT 1 / (random() * 0)::int", &[]),
        )
        .await;
        assert_eq!(raw::tags(&failed), b"12TEZ", "failed read {i}");
    }
    assert!(on_standbys > 0, "no cold read reached a standby");
    samples() - before
}

/// The replay samples after extended reads stay pgfresh's, in session and transaction
/// mode (see `extended_reads_with_samples`).
#[tokio::test]
async fn replay_samples_after_extended_reads_stay_out_of_their_replies() {
    let _g = SERIAL.lock().await;
    let setup = proxy().connect().await;
    let t = unique("batch_sampled");
    setup
        .batch_execute(&format!("CREATE TABLE {t}(id int)"))
        .await
        .unwrap();
    wait_replicated(&setup).await;
    let delay = ApplyDelay::set(50);
    let session = extended_reads_with_samples(proxy(), &t).await;
    setup.batch_execute(&format!("TRUNCATE {t}")).await.unwrap();
    let tx = start_proxy(&format!(
        "{}\n[pool]\npool_mode = \"transaction\"\n",
        config_text("")
    ));
    let transaction = extended_reads_with_samples(&tx, &t).await;
    drop(delay);
    assert!(session > 0.0, "no sample was taken in session mode");
    assert!(transaction > 0.0, "no sample was taken in transaction mode");
}

/// Read-your-writes of `ids` through the usual unnamed batch (`raw::exec_params`, which
/// pgfresh takes whole as one chunk): each id written, then read back at once in the same
/// session and from another one. Returns the reads that missed their write.
async fn whole_batch_misses(p: &ProxyHandle, t: &str, ids: std::ops::Range<i32>) -> usize {
    use tokio::io::AsyncWriteExt;
    let mut writer = raw::connect(p.addr).await;
    let mut reader = raw::connect(p.addr).await;
    let insert = format!("INSERT INTO {t} VALUES ($1::int)");
    let select = format!("SELECT count(*) FROM {t} WHERE id = $1::int");
    let mut misses = 0;
    for i in ids {
        let id = i.to_string();
        writer
            .write_all(&raw::exec_params(&insert, &[&id]))
            .await
            .unwrap();
        let written = raw::read_until(&mut writer, b'Z').await;
        assert_eq!(raw::tags(&written), b"12nCZ", "insert {i}");
        for s in [&mut writer, &mut reader] {
            s.write_all(&raw::exec_params(&select, &[&id]))
                .await
                .unwrap();
            let read = raw::read_until(s, b'Z').await;
            misses += usize::from(raw::first_value(&read) != "1");
        }
    }
    misses
}

/// The same guarantee through the batch pgfresh takes whole: with replay delayed, every
/// read of a row just written sees it, same session and cross session. The control, with
/// recency routing off, reads from the delayed standbys and misses.
#[tokio::test]
async fn whole_unnamed_batches_read_their_writes_with_delayed_replicas() {
    let _g = SERIAL.lock().await;
    let setup = proxy().connect().await;
    let t = unique("whole");
    setup
        .batch_execute(&format!("CREATE TABLE {t}(id int primary key)"))
        .await
        .unwrap();
    wait_replicated(&setup).await;
    let delay = ApplyDelay::set(300);
    let guarded = whole_batch_misses(proxy(), &t, 0..100).await;
    let blind = start_proxy(&config_text("enable_recent_access_routing = false"));
    let control = whole_batch_misses(&blind, &t, 100..200).await;
    drop(delay);
    assert_eq!(guarded, 0, "read-after-write misses through whole batches");
    assert!(
        control > 0,
        "the control (recency routing off) saw no stale read, so the test proves nothing"
    );
}

/// `[monitor] replay_from_primary`: the standbys' replay positions read from the
/// primary's walsenders while reads wait never let a read reach a standby that has not
/// replayed the write it depends on. With replay delayed, every read of a row just
/// written sees it, same session and cross session, while the reports move the standbys'
/// known positions; the control, with recency routing off, misses.
#[tokio::test]
async fn replay_positions_from_the_primary_never_cause_a_stale_read() {
    let _g = SERIAL.lock().await;
    let reporting = |routing: &str| {
        start_proxy(&config_text(routing).replace(
            "sr_check_period_ms = 50\n",
            "sr_check_period_ms = 50\nreplay_from_primary = true\n",
        ))
    };
    let p = reporting("");
    let setup = p.connect().await;
    let t = unique("reported");
    setup
        .batch_execute(&format!("CREATE TABLE {t}(id int primary key)"))
        .await
        .unwrap();
    wait_replicated(&setup).await;
    let reports = || {
        metric_value("pgfresh_replay_reports_total{node=\"pg1\"}")
            + metric_value("pgfresh_replay_reports_total{node=\"pg2\"}")
    };
    let before = reports();
    let delay = ApplyDelay::set(300);
    let guarded = whole_batch_misses(&p, &t, 0..100).await;
    let blind = reporting("enable_recent_access_routing = false");
    let control = whole_batch_misses(&blind, &t, 100..200).await;
    drop(delay);
    assert_eq!(
        guarded, 0,
        "read-after-write misses with the primary's reports"
    );
    assert!(
        reports() > before,
        "no report of a standby's replay was read from the primary"
    );
    assert!(
        control > 0,
        "the control (recency routing off) saw no stale read, so the test proves nothing"
    );
}

/// What a standby answers `sql` through a proxy that does not learn the catalog (recency
/// off, so the read is sent to a standby as soon as one is in the pool): the controls of
/// the tests of what only the primary can run.
async fn refused_without_the_catalog(sql: &str) -> String {
    let control = start_proxy(&config_text(
        "enable_recent_access_routing = false\nlearn_dependencies = false\nread_retry_budget = 0",
    ));
    first_error(&control.connect().await, sql).await
}

/// The first error `sql` meets, tried until it meets one.
async fn first_error(c: &tokio_postgres::Client, sql: &str) -> String {
    poll(
        &format!("an error for {sql}"),
        Duration::from_secs(60),
        || async { c.query_one(sql, &[]).await.err().map(|e| format!("{e:?}")) },
    )
    .await
}

/// Reads that reach an unlogged table run on the primary: a standby has none of its rows and
/// refuses to scan it. Named, through a partitioned parent with an unlogged partition, through
/// a view, or inside a function — while reads of logged tables still go to the standbys.
/// Against a proxy that does not learn the catalog, the same read meets the standby's error.
#[tokio::test]
async fn reads_of_unlogged_tables_run_on_the_primary() {
    let _g = SERIAL.lock().await;
    let u = unique("unlogged");
    let l = unique("logged");
    let parent = unique("parted");
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "CREATE UNLOGGED TABLE {u}(id int); INSERT INTO {u} VALUES (1);
                 CREATE TABLE {l}(id int); INSERT INTO {l} VALUES (1);
                 CREATE TABLE {parent}(id int) PARTITION BY RANGE (id);
                 CREATE TABLE {parent}_a PARTITION OF {parent} FOR VALUES FROM (0) TO (10);
                 CREATE UNLOGGED TABLE {parent}_b PARTITION OF {parent} FOR VALUES FROM (10) TO (20);
                 CREATE VIEW {u}_v AS SELECT * FROM {u};
                 CREATE FUNCTION {u}_count() RETURNS bigint LANGUAGE sql STABLE
                     AS 'SELECT count(*) FROM {u}';
                 GRANT ALL ON {u}, {l}, {parent}, {u}_v TO PUBLIC;"
            ),
        )
        .unwrap();
    let reads = [
        format!("SELECT inet_server_port(), count(*) FROM {u}"),
        format!("SELECT inet_server_port(), count(*) FROM {parent}"),
        format!("SELECT inet_server_port(), count(*) FROM {u}_v"),
        format!("SELECT inet_server_port(), {u}_count()"),
    ];
    let logged = format!("SELECT inet_server_port(), count(*) FROM {l}");
    // Recency off: only what a standby can serve decides. The schema check runs often. No
    // retries: a read a standby refused would reach the primary that way too.
    let p = start_proxy(&config_text(
        "enable_recent_access_routing = false\ndependency_check_ms = 50\nread_retry_budget = 0",
    ));
    let c = p.connect().await;
    wait_replicated(&c).await;
    let listed = |table: String| {
        let (p, c) = (&p, &c);
        async move {
            // The database must stay in use for the schema checks to run.
            c.simple_query("SELECT 1").await.expect("a statement");
            let deps = admin::get_json(p, "/v1/dependencies", None).await;
            deps["databases"]["app"]["unlogged"]
                .as_array()
                .is_some_and(|t| t.iter().any(|n| n == &format!("public.{table}")))
                .then_some(())
        }
    };
    poll(
        "the graph to list the unlogged table",
        Duration::from_secs(60),
        || listed(u.clone()),
    )
    .await;
    // One made outside pgfresh after the graph was loaded: the schema check finds it.
    let late = format!("{u}_late");
    cluster()
        .psql(
            0,
            "app",
            &format!("CREATE UNLOGGED TABLE {late}(id int); GRANT ALL ON {late} TO PUBLIC"),
        )
        .unwrap();
    wait_replicated(&c).await;
    poll(
        "the schema check to find the new one",
        Duration::from_secs(60),
        || listed(late.clone()),
    )
    .await;
    let late_read = format!("SELECT inet_server_port(), count(*) FROM {late}");
    for sql in reads.iter().chain([&late_read]) {
        for _ in 0..10 {
            assert_eq!(port_of(&c, sql).await, primary_port(), "{sql}");
        }
    }
    on_a_standby(&c, &logged, "a logged table read on a standby").await;
    drop(c);
    drop(p);
    // The control: without the catalog the read goes to a standby, which refuses it.
    let refused = refused_without_the_catalog(&reads[0]).await;
    assert!(
        refused.contains("cannot access temporary or unlogged relations during recovery"),
        "{refused}"
    );
}

/// An extended read a standby refuses after its acknowledgements reached the client
/// (ParseComplete, BindComplete and RowDescription come with the error) runs again on the
/// primary, and the client hears each reply once: those the refused attempt forwarded are
/// not forwarded again, however the read is sent the second time.
#[tokio::test]
async fn a_read_a_standby_refused_after_its_acknowledgements_answers_each_once() {
    use tokio::io::AsyncWriteExt;
    let _g = SERIAL.lock().await;
    let u = unique("unlogged_acks");
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "CREATE UNLOGGED TABLE {u}(id int); INSERT INTO {u} VALUES (1);
                 GRANT ALL ON {u} TO PUBLIC"
            ),
        )
        .unwrap();
    // Without the catalog the read goes to a standby, which refuses it (0A000); the
    // refused read runs again on the primary.
    let p = start_proxy(&config_text(
        "enable_recent_access_routing = false\nlearn_dependencies = false",
    ));
    wait_replicated(&p.connect().await).await;
    let refusals = "pgfresh_standby_refusals_total{sqlstate=\"0A000\"}";
    let before = metric_value(refusals);
    let sql = format!("SELECT count(*) FROM {u}");
    for round in 0..3 {
        // The first round meets the refusal; the later ones go to the primary at once
        // (a refusal is remembered for the login), and read the same.
        let mut s = raw::connect(p.addr).await;
        s.write_all(&raw::exec_params(&sql, &[])).await.unwrap();
        let answer = raw::read_until(&mut s, b'Z').await;
        assert_eq!(raw::tags(&answer), b"12TDCZ", "round {round}");
        assert_eq!(raw::first_value(&answer), "1", "round {round}");
    }
    assert!(
        metric_value(refusals) > before,
        "a standby refused the read"
    );
}

/// A function the catalog marks STABLE whose body writes after all (`nextval` here) runs
/// on the primary: its analysed body says so. A STABLE function that only reads still goes
/// to a standby. Against a proxy that does not learn the catalog, the call meets the
/// standby's refusal.
#[tokio::test]
async fn a_stable_function_whose_body_writes_runs_on_the_primary() {
    let _g = SERIAL.lock().await;
    let f = unique("stable_next");
    let r = unique("stable_read");
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "CREATE SEQUENCE {f}_seq; GRANT ALL ON {f}_seq TO PUBLIC;
                 CREATE FUNCTION {f}() RETURNS bigint LANGUAGE plpgsql STABLE
                     AS $$ BEGIN RETURN nextval('{f}_seq'); END $$;
                 CREATE FUNCTION {r}() RETURNS int LANGUAGE plpgsql STABLE
                     AS $$ BEGIN RETURN inet_server_port(); END $$;"
            ),
        )
        .unwrap();
    let writes = format!("SELECT inet_server_port(), {f}()");
    let reads = format!("SELECT {r}()");
    // No retries: a call a standby refused would reach the primary that way too.
    let p = start_proxy(&config_text(
        "enable_recent_access_routing = false\nread_retry_budget = 0",
    ));
    let c = p.connect().await;
    wait_replicated(&c).await;
    // Until pg_proc is loaded the calls go to the primary; then the reader moves to a
    // standby, and the writer, once the graph has its body, stays.
    on_a_standby(&c, &reads, "the reader on a standby").await;
    poll(
        "the graph to have the writer",
        Duration::from_secs(60),
        || async {
            let deps = admin::get_json(&p, "/v1/dependencies", None).await;
            deps["databases"]["app"]["edges"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["from"] == format!("public.{f}()")))
                .then_some(())
        },
    )
    .await;
    for _ in 0..10 {
        assert_eq!(port_of(&c, &writes).await, primary_port(), "{writes}");
    }
    drop(c);
    drop(p);
    let refused = refused_without_the_catalog(&writes).await;
    assert!(
        refused.contains("cannot execute nextval() in a read-only transaction"),
        "{refused}"
    );
}

/// A session whose transactions default to SERIALIZABLE reads on the primary: a hot standby
/// refuses every statement in that mode ("cannot use serializable mode in a hot standby").
/// Set with SET, with SET SESSION CHARACTERISTICS, or as a startup option; once the default
/// is back, reads go to the standbys again.
#[tokio::test]
async fn a_serializable_default_keeps_the_session_s_reads_on_the_primary() {
    let _g = SERIAL.lock().await;
    // No retries: a read a standby refused would reach the primary that way too.
    let p = &start_proxy(&config_text("read_retry_budget = 0"));
    let c = p.connect().await;
    let t = p.cold_table(&c, "serializable_default").await;
    let read = format!("SELECT inet_server_port() FROM {t} LIMIT 1");
    for set in [
        "SET default_transaction_isolation = 'serializable'",
        "SET default_transaction_isolation TO SERIALIZABLE",
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    ] {
        on_a_standby(&c, &read, "a cold read on a standby").await;
        c.batch_execute(set).await.unwrap();
        for _ in 0..10 {
            assert_eq!(port_of(&c, &read).await, primary_port(), "{set}");
        }
        c.batch_execute("SET default_transaction_isolation = 'read committed'")
            .await
            .unwrap();
    }
    on_a_standby(&c, &read, "reads back on a standby").await;
    let s = p
        .connect_with_options("-c default_transaction_isolation=serializable")
        .await;
    for _ in 0..10 {
        assert_eq!(port_of(&s, &read).await, primary_port(), "startup option");
    }
}

/// `(n, port)` of the one row of `sql`, read with the simple protocol, a named prepared
/// statement, or the unnamed statement with its Describe (tokio-postgres' `query_typed`).
async fn row_of(c: &tokio_postgres::Client, sql: &str, how: &str) -> (i64, u16) {
    let (n, port): (i64, i32) = match how {
        "simple" => {
            let row = simple_row(c, sql).await;
            (
                row.get(0).unwrap().parse().unwrap(),
                row.get(1).unwrap().parse().unwrap(),
            )
        }
        "prepared" => {
            let row = c
                .query_one(sql, &[])
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
            (row.get(0), row.get(1))
        }
        _ => {
            let rows = c
                .query_typed(sql, &[])
                .await
                .unwrap_or_else(|e| panic!("{e:?}"));
            (rows[0].get(0), rows[0].get(1))
        }
    };
    (n, port as u16)
}

/// A read a standby refuses with an error the primary would not give runs again on the
/// primary, and the client sees the primary's answer only: a view that calls `nextval()`,
/// which a standby refuses (25006), read with the simple protocol, a named prepared
/// statement and the unnamed statement with its Describe (the acknowledgements the client
/// already had are not repeated), in session and in transaction mode. The sequence
/// advances once a read. The refused statement is remembered: its next runs go to the
/// primary without a refusal. A recovery conflict (40001, raised here by a function on one
/// standby only) goes to another node; any other error reaches the client from the
/// standby. The control: without retries (`read_retry_budget = 0`) the client gets the
/// standby's refusal.
#[tokio::test]
async fn a_read_a_standby_refuses_runs_again_on_the_primary() {
    let _g = SERIAL.lock().await;
    let v = unique("refused");
    let [s1, _] = standby_ports();
    let raising = |name: &str, when: &str, code: &str| {
        format!(
            "CREATE FUNCTION {v}_{name}() RETURNS int LANGUAGE plpgsql STABLE AS $$
             BEGIN
                 IF {when} THEN
                     RAISE EXCEPTION 'refused on %', inet_server_port() USING ERRCODE = '{code}';
                 END IF;
                 RETURN inet_server_port();
             END $$;"
        )
    };
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "CREATE SEQUENCE {v}_seq; GRANT ALL ON {v}_seq TO PUBLIC;
                 CREATE VIEW {v} AS SELECT nextval('{v}_seq') AS n, inet_server_port() AS port;
                 GRANT ALL ON {v} TO PUBLIC;
                 {} {}",
                raising("conflict", &format!("inet_server_port() = {s1}"), "40001"),
                raising("other", "pg_is_in_recovery()", "22012"),
            ),
        )
        .unwrap();
    let read = format!("SELECT n, port FROM {v}");
    let refusals = "pgfresh_standby_refusals_total{sqlstate=\"25006\"}";
    let conflicts = "pgfresh_standby_refusals_total{sqlstate=\"40001\"}";
    for mode in ["session", "transaction"] {
        let p = start_proxy(&format!(
            "{}\n[pool]\npool_mode = \"{mode}\"\npool_size = 2\n",
            config_text("enable_recent_access_routing = false")
        ));
        let c = p.connect().await;
        wait_replicated(&c).await;
        // Once pg_proc is loaded, the calls go to a standby; an error that is not a
        // refusal reaches the client from there.
        let err = first_error(&c, &format!("SELECT {v}_other()")).await;
        assert!(
            standby_ports()
                .iter()
                .any(|port| err.contains(&format!("refused on {port}"))),
            "{mode}: {err}"
        );
        // Each protocol's text is its own statement: refused once (the retry skips the
        // acknowledgements the client has), then remembered, so its next runs go to the
        // primary at once.
        let before = metric_value(refusals);
        let routed = "pgfresh_routed_total{target=\"primary\",reason=\"standby_refused\"}";
        let routed_before = metric_value(routed);
        let mut last: Option<i64> = None;
        for how in ["simple", "prepared", "typed"] {
            let sql = format!("SELECT n, port AS {how} FROM {v}");
            for _ in 0..3 {
                let (n, port) = row_of(&c, &sql, how).await;
                assert_eq!(port, primary_port(), "{mode}, {how}");
                if let Some(l) = last {
                    assert_eq!(n, l + 1, "{mode}, {how}: the sequence advanced once");
                }
                last = Some(n);
            }
        }
        assert_eq!(
            metric_value(refusals) - before,
            3.0,
            "{mode}: one refusal a statement"
        );
        assert!(
            metric_value(routed) - routed_before >= 9.0,
            "{mode}: every read on the primary as refused"
        );
        // A conflict on standby 1 sends the call elsewhere: never an error, never s1.
        let conflict = format!("SELECT {v}_conflict()");
        let before = metric_value(conflicts);
        poll("a conflict retried", Duration::from_secs(60), || async {
            let port = c.query_one(&conflict, &[]).await.unwrap().get::<_, i32>(0) as u16;
            assert_ne!(port, s1, "{mode}");
            (metric_value(conflicts) > before).then_some(())
        })
        .await;
    }
    // The control: the standby's refusal reaches the client.
    let control = start_proxy(&config_text(
        "enable_recent_access_routing = false\nread_retry_budget = 0",
    ));
    let refused = first_error(&control.connect().await, &read).await;
    assert!(
        refused.contains("cannot execute nextval() in a read-only transaction"),
        "{refused}"
    );
}

/// The transaction `COMMIT AND CHAIN` begins after a read-only one on a standby is read-only
/// too, and, as on a single server, may be made read-write before its first statement: it
/// starts with that statement, on the primary then (it began on the standby, which refused
/// `SET TRANSACTION READ WRITE`).
#[tokio::test]
async fn a_transaction_chained_after_one_on_a_standby_may_become_read_write() {
    let _g = SERIAL.lock().await;
    let p = proxy();
    let c = p.connect().await;
    let t = p.cold_table(&c, "chain_rw").await;
    let read = format!("SELECT inet_server_port() FROM {t} LIMIT 1");
    for chain in ["COMMIT AND CHAIN", "ROLLBACK AND CHAIN"] {
        for read_write in [false, true] {
            c.batch_execute("BEGIN READ ONLY").await.unwrap();
            let first = port_of(&c, &read).await;
            assert!(standby_ports().contains(&first), "a cold read on a standby");
            c.batch_execute(chain).await.unwrap();
            if read_write {
                c.batch_execute("SET TRANSACTION READ WRITE")
                    .await
                    .unwrap_or_else(|e| panic!("{chain}: SET TRANSACTION READ WRITE: {e}"));
            }
            let insert = c
                .batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
                .await
                .map_err(|e| e.code().cloned());
            if read_write {
                let port = port_of(&c, &read).await;
                c.batch_execute("ROLLBACK").await.unwrap();
                assert_eq!((insert, port), (Ok(()), primary_port()), "{chain}");
            } else {
                c.batch_execute("ROLLBACK").await.unwrap();
                let read_only = tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION;
                assert_eq!(insert, Err(Some(read_only)), "{chain}: inherits READ ONLY");
            }
        }
    }
}

/// The port and row count a read of `t` answers (`SELECT inet_server_port(), count(*)`),
/// by the simple protocol (a literal) or the extended one (a prepared statement).
async fn port_and_count(c: &tokio_postgres::Client, t: &str, id: i32, simple: bool) -> (u16, i64) {
    let sql = format!("SELECT inet_server_port(), count(*) FROM {t} WHERE id = ");
    if simple {
        let row = simple_row(c, &format!("{sql}{id}")).await;
        let port: u16 = row.get(0).unwrap().parse().unwrap();
        (port, row.get(1).unwrap().parse().unwrap())
    } else {
        let row = c.query_one(&format!("{sql}$1"), &[&id]).await.unwrap();
        (row.get::<_, i32>(0) as u16, row.get(1))
    }
}

/// A session keeps the route of a read its table's coldness sent to a replica, and
/// routes the same text that way while nothing changes; a write another session makes
/// to the table since sends the next one where the write is, by either protocol. (The
/// standbys replay 500 ms behind: a read that went to one by the kept route would miss
/// the row. Without LSN routing a read reaches a standby only when its table is cold.)
#[tokio::test]
async fn a_kept_cold_route_gives_way_to_a_write_made_since() {
    let _g = SERIAL.lock().await;
    let p = start_proxy(&config_text(
        "lsn_routing = false\nrecent_access_ttl_ms = 100\ndelay_threshold_by_time = 2000",
    ));
    let writer = p.connect().await;
    let reader = p.connect().await;
    let t = unique("kept_cold");
    writer
        .batch_execute(&format!("CREATE TABLE {t}(id int primary key)"))
        .await
        .unwrap();
    wait_replicated(&writer).await;
    let delay = ApplyDelay::set(500);
    let mut misses = Vec::new();
    for (i, simple) in [(1, false), (2, true), (3, false), (4, true)] {
        // The very text read next goes to a standby: its table is cold, its route kept.
        poll(
            "a cold read on a standby",
            Duration::from_secs(60),
            || async {
                let (port, _) = port_and_count(&reader, &t, i, simple).await;
                standby_ports().contains(&port).then_some(())
            },
        )
        .await;
        writer
            .execute(&format!("INSERT INTO {t} VALUES ($1)"), &[&i])
            .await
            .unwrap();
        let (port, n) = port_and_count(&reader, &t, i, simple).await;
        if n != 1 {
            misses.push((i, simple, port));
        }
    }
    drop(delay);
    assert!(
        misses.is_empty(),
        "stale reads (id, simple, port): {misses:?}"
    );
}
