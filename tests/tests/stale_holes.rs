//! The stale holes: writes whose effects reach relations the statement does not name, and
//! read-only transactions that read what another session just wrote (DESIGN §1 rules 2, 3
//! and 6). With both standbys replaying 400 ms behind, a read issued at once after the write
//! must see it, through the same connection and through another one, over the simple and
//! the extended protocol.
//!
//! Each test creates its own objects, starts a proxy that learns them from the catalog
//! (`learn_dependencies`, on by default), waits until `GET /v1/dependencies` shows the edges
//! the test relies on, then runs 30 write-then-read iterations per protocol and requires
//! zero stale reads. A control loop against a proxy that does not learn dependencies must
//! then see at least one stale read, proving the test can fail.
//!
//! Tests here change replication delays, so they run one at a time.

use std::time::{Duration, Instant};

use pgfresh_tests::*;
use serde_json::Value;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Write-then-read iterations per protocol and loop.
const ITERATIONS: usize = 30;
/// Replay delay of both standbys while the loops run.
const DELAY_MS: u64 = 400;
/// The control proxy: the same config without learned dependencies.
const CONTROL: &str = "learn_dependencies = false";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Proto {
    /// `batch_execute` / `simple_query`, `$1` spliced in as a literal.
    Simple,
    /// `execute` / `query_one` with `$1` bound as an int4 parameter.
    Extended,
    /// The same with a statement each connection prepared once and runs again (drivers'
    /// prepared statements: a Bind of a named statement, which pgfresh sends as it came
    /// where the connection holds it).
    Prepared,
}

/// The statements the connections of a loop prepared (`Proto::Prepared`), by connection
/// and text; emptied when a loop starts.
static PREPARED: std::sync::Mutex<Vec<(usize, String, tokio_postgres::Statement)>> =
    std::sync::Mutex::new(Vec::new());

/// `sql` prepared on `c`, once.
async fn prepared(c: &tokio_postgres::Client, sql: &str) -> tokio_postgres::Statement {
    let key = c as *const tokio_postgres::Client as usize;
    let held = PREPARED
        .lock()
        .unwrap()
        .iter()
        .find(|(k, s, _)| *k == key && s == sql)
        .map(|(_, _, st)| st.clone());
    if let Some(st) = held {
        return st;
    }
    let st = c
        .prepare(sql)
        .await
        .unwrap_or_else(|e| panic!("prepare {sql}: {e}"));
    PREPARED
        .lock()
        .unwrap()
        .push((key, sql.to_owned(), st.clone()));
    st
}

fn splice(sql: &str, arg: i32) -> String {
    sql.replace("$1", &format!("({arg})"))
}

/// Run `sql` (no rows wanted); `$1`, if present, is `arg`.
async fn exec(c: &tokio_postgres::Client, proto: Proto, sql: &str, arg: i32) {
    let r = match proto {
        Proto::Simple => c.batch_execute(&splice(sql, arg)).await,
        Proto::Extended if sql.contains("$1") => c.execute(sql, &[&arg]).await.map(drop),
        Proto::Extended => c.execute(sql, &[]).await.map(drop),
        Proto::Prepared => {
            let st = prepared(c, sql).await;
            if sql.contains("$1") {
                c.execute(&st, &[&arg]).await.map(drop)
            } else {
                c.execute(&st, &[]).await.map(drop)
            }
        }
    };
    r.unwrap_or_else(|e| panic!("{proto:?} {sql} ({arg}): {e}"));
}

/// The bigint in the first column of the one row `sql` returns; `$1` is `arg`.
async fn read_i64(c: &tokio_postgres::Client, proto: Proto, sql: &str, arg: i32) -> i64 {
    match proto {
        Proto::Simple => {
            let msgs = c
                .simple_query(&splice(sql, arg))
                .await
                .unwrap_or_else(|e| panic!("{sql} ({arg}): {e}"));
            msgs.iter()
                .find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{sql}: no row"))
                .parse()
                .unwrap_or_else(|e| panic!("{sql}: not a bigint: {e}"))
        }
        Proto::Extended => {
            let row = if sql.contains("$1") {
                c.query_one(sql, &[&arg]).await
            } else {
                c.query_one(sql, &[]).await
            };
            row.unwrap_or_else(|e| panic!("{sql} ({arg}): {e}")).get(0)
        }
        Proto::Prepared => {
            let st = prepared(c, sql).await;
            let row = if sql.contains("$1") {
                c.query_one(&st, &[&arg]).await
            } else {
                c.query_one(&st, &[]).await
            };
            row.unwrap_or_else(|e| panic!("{sql} ({arg}): {e}")).get(0)
        }
    }
}

/// Which connection a read runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Via {
    /// The connection that wrote.
    Writer,
    /// Another connection of the same proxy.
    Other,
    /// Another connection with `SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY`.
    ReadOnlySession,
    /// Another connection with `SET default_transaction_read_only = on`.
    ReadOnlyDefault,
}

/// One read of a hole, checked after every write.
struct Read {
    via: Via,
    /// Opens a transaction around the read (`BEGIN READ ONLY` ...), committed after it.
    begin: Option<&'static str>,
    /// A statement run first inside that transaction (a cold read choosing the node).
    first: Option<String>,
    /// Returns one bigint that moves by the hole's `delta` with every write; `$1` is `arg`.
    sql: String,
    arg: i32,
}

impl Read {
    fn label(&self) -> String {
        match self.begin {
            Some(b) => format!("{:?}: {b}; {}", self.via, self.sql),
            None => format!("{:?}: {}", self.via, self.sql),
        }
    }
}

/// `sql` read at once after the write, on the writer's connection and on another one.
fn plain(sql: &str, arg: i32) -> Vec<Read> {
    [Via::Writer, Via::Other]
        .into_iter()
        .map(|via| Read {
            via,
            begin: None,
            first: None,
            sql: sql.to_owned(),
            arg,
        })
        .collect()
}

/// An edge `/v1/dependencies` must list before the test may rely on it: `kind`, and the
/// unqualified names of `from` and `to` (functions with their `()`).
struct Edge {
    kind: &'static str,
    from: String,
    to: String,
}

fn edge(kind: &'static str, from: &str, to: &str) -> Edge {
    Edge {
        kind,
        from: from.to_owned(),
        to: to.to_owned(),
    }
}

/// `public.orders_1_2` or `"public"."orders_1_2"` names `orders_1_2`.
fn label_names(label: &str, name: &str) -> bool {
    let last = label.rsplit('.').next().unwrap_or(label);
    last.trim_matches('"') == name || last.replace('"', "") == name
}

/// A write whose effect a statement-level reading of its text misses.
struct Hole {
    name: &'static str,
    /// The write; `$1` is a number unique to the iteration (1, 2, ...).
    write: String,
    /// How every read's value moves with one write.
    delta: i64,
    reads: Vec<Read>,
    /// Edges that must be learned first.
    edges: Vec<Edge>,
    /// Functions `/v1/dependencies` must list as unanalysable first (name with `()`).
    unanalysable: Vec<String>,
    /// A query returning `inet_server_port()` that must reach a replica before the loops
    /// start (e.g. proof that the proxy knows a function is STABLE).
    warmup: Option<String>,
    /// An extra statement run directly on the primary (not through pgfresh) before each
    /// write, and a read through pgfresh after it that must see it: `(write, read)`, the
    /// read's value growing by 1 per iteration.
    out_of_band: Option<(String, String)>,
}

impl Hole {
    /// A hole that needs nothing learned first: `write`, then `read` (moving by 1 a write)
    /// on the writer's connection and another one.
    /// Nothing to write or read: the edges a test waits for before it goes on.
    fn edges(name: &'static str, edges: Vec<Edge>) -> Hole {
        Hole {
            name,
            write: String::new(),
            delta: 0,
            reads: vec![],
            edges,
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        }
    }

    /// A write moving every read by `delta`, once `edges` are learned.
    fn learned(
        name: &'static str,
        write: String,
        delta: i64,
        reads: Vec<Read>,
        edges: Vec<Edge>,
    ) -> Hole {
        Hole {
            edges,
            delta,
            reads,
            ..Hole::plain(name, write, "")
        }
    }

    fn plain(name: &'static str, write: String, read: &str) -> Hole {
        Hole {
            name,
            write,
            delta: 1,
            reads: plain(read, 1),
            edges: vec![],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        }
    }
}

/// An event trigger of database `app`, dropped with this (event triggers fire in every
/// test of the binary, so none outlives its test).
struct DropEventTrigger(String);

impl Drop for DropEventTrigger {
    fn drop(&mut self) {
        let _ = cluster().psql(0, "app", &format!("DROP EVENT TRIGGER {}", self.0));
    }
}

/// DDL and seed data, through the shared proxy; returns once both standbys have it.
async fn setup(sql: &str) {
    let c = proxy().connect().await;
    c.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("setup failed: {e:?}\n{sql}"));
    wait_replicated_on(cluster(), &c).await;
}

/// A connection straight to the primary, bypassing pgfresh: the truth.
async fn primary_direct() -> tokio_postgres::Client {
    node_direct(0).await
}

/// A connection straight to node `i`, bypassing pgfresh.
async fn node_direct(i: usize) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=app password={APP_PASSWORD} dbname=app connect_timeout=10",
            node_port(i)
        ),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap_or_else(|e| panic!("connect to node {i}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

async fn dependencies(p: &ProxyHandle) -> (u16, Value) {
    let r = admin::http(p.admin, "GET", "/v1/dependencies", None, None).await;
    let body = if r.status == 200 {
        r.json()
    } else {
        Value::String(r.body)
    };
    (r.status, body)
}

fn graph_has(deps: &Value, hole: &Hole) -> bool {
    let db = &deps["databases"]["app"];
    let edges = db["edges"].as_array().cloned().unwrap_or_default();
    let unanalysable = db["unanalysable"].as_array().cloned().unwrap_or_default();
    hole.edges.iter().all(|want| {
        edges.iter().any(|e| {
            e["kind"] == want.kind
                && e["from"]
                    .as_str()
                    .is_some_and(|s| label_names(s, &want.from))
                && e["to"].as_str().is_some_and(|s| label_names(s, &want.to))
        })
    }) && hole.unanalysable.iter().all(|f| {
        unanalysable
            .iter()
            .any(|u| u["function"].as_str().is_some_and(|s| label_names(s, f)))
    })
}

/// Polls `/v1/dependencies` until the hole's edges and unanalysable functions are listed
/// for database `app` (the graph loads in the background once a client uses the database).
async fn wait_graph(p: &ProxyHandle, hole: &Hole) {
    let c = p.connect().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        c.simple_query("SELECT 1")
            .await
            .expect("a statement in app");
        let (status, deps) = dependencies(p).await;
        if status == 200 && graph_has(&deps, hole) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: the dependency graph never showed the test's objects: HTTP {status} {deps}",
            hole.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls until `sql` (returning `inet_server_port()` first) runs on a replica.
async fn wait_replica_read(p: &ProxyHandle, sql: &str) {
    let c = p.connect().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let port: i32 = c
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0);
        if port as u16 != node_port(0) {
            return;
        }
        assert!(Instant::now() < deadline, "{sql} never ran on a replica");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stale reads seen by one loop, per read (label, stale count, first mismatches).
struct Tally {
    per_read: Vec<(String, usize, Vec<String>)>,
    out_of_band: usize,
}

impl Tally {
    fn total(&self) -> usize {
        self.per_read.iter().map(|r| r.1).sum::<usize>() + self.out_of_band
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (label, n, first) in &self.per_read {
            writeln!(f, "    {n}/{ITERATIONS} stale  {label}  {first:?}")?;
        }
        if self.out_of_band > 0 {
            writeln!(
                f,
                "    {}/{ITERATIONS} stale  out-of-band read",
                self.out_of_band
            )?;
        }
        Ok(())
    }
}

/// `ITERATIONS` times: the write through pgfresh, then every read at once through pgfresh;
/// counts the reads that do not see the write. `next` numbers the writes across loops.
async fn run_loop(p: &ProxyHandle, hole: &Hole, proto: Proto, next: &mut i32) -> Tally {
    PREPARED.lock().unwrap().clear();
    let writer = p.connect().await;
    let other = p.connect().await;
    let ro_session = p.connect().await;
    ro_session
        .batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        .await
        .expect("read-only session");
    let ro_default = p.connect().await;
    ro_default
        .batch_execute("SET default_transaction_read_only = on")
        .await
        .expect("read-only by default");
    let truth = primary_direct().await;
    let mut expected = Vec::new();
    for r in &hole.reads {
        expected.push(read_i64(&truth, Proto::Extended, &r.sql, r.arg).await);
    }
    let mut oob_expected = match &hole.out_of_band {
        Some((_, read)) => read_i64(&truth, Proto::Extended, read, 0).await,
        None => 0,
    };
    let mut tally = Tally {
        per_read: hole
            .reads
            .iter()
            .map(|r| (r.label(), 0, Vec::new()))
            .collect(),
        out_of_band: 0,
    };
    for _ in 0..ITERATIONS {
        let n = *next;
        *next += 1;
        if let Some((write, _)) = &hole.out_of_band {
            truth
                .batch_execute(write)
                .await
                .unwrap_or_else(|e| panic!("{write}: {e}"));
            oob_expected += 1;
        }
        exec(&writer, proto, &hole.write, n).await;
        for (i, r) in hole.reads.iter().enumerate() {
            expected[i] += hole.delta;
            let c = match r.via {
                Via::Writer => &writer,
                Via::Other => &other,
                Via::ReadOnlySession => &ro_session,
                Via::ReadOnlyDefault => &ro_default,
            };
            if let Some(begin) = r.begin {
                exec(c, proto, begin, 0).await;
            }
            if let Some(first) = &r.first {
                read_i64(c, proto, first, 0).await;
            }
            let got = read_i64(c, proto, &r.sql, r.arg).await;
            if r.begin.is_some() {
                exec(c, proto, "COMMIT", 0).await;
            }
            if got != expected[i] {
                let t = &mut tally.per_read[i];
                t.1 += 1;
                if t.2.len() < 3 {
                    t.2.push(format!("write {n}: saw {got}, expected {}", expected[i]));
                }
            }
        }
        if let Some((_, read)) = &hole.out_of_band {
            let got = read_i64(&writer, proto, read, 0).await;
            tally.out_of_band += usize::from(got != oob_expected);
        }
    }
    // The test's own arithmetic agrees with the primary.
    for (i, r) in hole.reads.iter().enumerate() {
        let now = read_i64(&truth, Proto::Extended, &r.sql, r.arg).await;
        assert_eq!(
            now, expected[i],
            "{}: expected values drifted: {}",
            hole.name, r.sql
        );
    }
    tally
}

/// The whole check of one hole: a learning proxy sees no stale read over either protocol;
/// a proxy with `control` config sees at least one.
async fn check_hole(hole: Hole, control: &str) {
    check_hole_over(hole, control, &[Proto::Simple, Proto::Extended]).await;
}

/// `check_hole` over `protos`.
async fn check_hole_over(hole: Hole, control: &str, protos: &[Proto]) {
    let mut next = 1;
    let learning = start_proxy(&config_text(""));
    wait_graph(&learning, &hole).await;
    if let Some(w) = &hole.warmup {
        wait_replica_read(&learning, w).await;
    }
    let _delay = ApplyDelay::set(DELAY_MS);
    let mut report = String::new();
    let mut main_stale = 0;
    for &proto in protos {
        let t = run_loop(&learning, &hole, proto, &mut next).await;
        report.push_str(&format!("  learning, {proto:?}: {} stale\n{t}", t.total()));
        main_stale += t.total();
    }
    drop(learning);
    eprintln!("{}:\n{report}", hole.name);
    assert_eq!(main_stale, 0, "{}: stale reads:\n{report}", hole.name);

    // Control: the same loops must catch staleness without the learned graph.
    let blind = start_proxy(&config_text(control));
    if let Some(w) = &hole.warmup {
        wait_replica_read(&blind, w).await;
    }
    let mut control_report = String::new();
    let mut control_stale = 0;
    for &proto in protos {
        let t = run_loop(&blind, &hole, proto, &mut next).await;
        control_report.push_str(&format!("  control, {proto:?}: {} stale\n{t}", t.total()));
        control_stale += t.total();
    }
    eprintln!("{} (control `{control}`):\n{control_report}", hole.name);
    assert!(
        control_stale > 0,
        "{}: the control (`{control}`) saw no stale read, so the test proves nothing:\n{control_report}",
        hole.name
    );
}

#[tokio::test]
async fn trigger_writes_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (orders, totals, f) = (
        unique("orders"),
        unique("order_totals"),
        unique("bump_total"),
    );
    setup(&format!(
        "CREATE TABLE {orders}(id serial PRIMARY KEY, amount int NOT NULL);
         CREATE TABLE {totals}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {totals} VALUES (1, 0);
         CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           UPDATE {totals} SET n = n + 1 WHERE id = 1;
           RETURN NEW;
         END $$;
         CREATE TRIGGER {f}_trg AFTER INSERT ON {orders} FOR EACH ROW EXECUTE FUNCTION {f}();"
    ))
    .await;
    check_hole(
        Hole {
            name: "trigger",
            write: format!("INSERT INTO {orders}(amount) VALUES ($1::int)"),
            delta: 1,
            reads: plain(&format!("SELECT n FROM {totals} WHERE id = $1::int"), 1),
            edges: vec![
                edge("trigger", &orders, &format!("{f}()")),
                edge("function", &format!("{f}()"), &totals),
            ],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

/// A rewrite rule (`CREATE RULE ... DO ALSO`) runs a statement of its own with every write:
/// an INSERT into the logged table updates a counter no statement names.
#[tokio::test]
async fn rule_actions_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (events, counts, rule) = (
        unique("rule_events"),
        unique("rule_counts"),
        unique("count_events"),
    );
    setup(&format!(
        "CREATE TABLE {events}(id serial PRIMARY KEY, n int NOT NULL);
         CREATE TABLE {counts}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {counts} VALUES (1, 0);
         CREATE RULE {rule} AS ON INSERT TO {events}
           DO ALSO UPDATE {counts} SET n = n + 1 WHERE id = 1;"
    ))
    .await;
    check_hole(
        Hole {
            edges: vec![edge("rule", &events, &counts)],
            ..Hole::plain(
                "rewrite rule",
                format!("INSERT INTO {events}(n) VALUES ($1::int)"),
                &format!("SELECT n FROM {counts} WHERE id = $1::int"),
            )
        },
        CONTROL,
    )
    .await;
}

/// Large objects live in `pg_catalog.pg_largeobject`, which no statement names: `lo_put`
/// writes it and `lo_get` reads it. (The control turns recency routing off, which proves
/// the loop sees a stale read when nothing guards it.)
#[tokio::test]
async fn large_object_writes_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let oid: i64 = primary_direct()
        .await
        .query_one("SELECT lo_from_bytea(0, int4send(0))::int8", &[])
        .await
        .expect("a large object")
        .get(0);
    setup("SELECT 1").await;
    check_hole(
        Hole::plain(
            "large object",
            format!("SELECT lo_put({oid}, 0, int4send($1::int))"),
            &format!("SELECT ('x' || encode(lo_get({oid}), 'hex'))::bit(32)::int::int8"),
        ),
        "enable_recent_access_routing = false",
    )
    .await;
}

/// A `DO` block's code is not read, so what it writes is not known: the whole database
/// counts as written, and a read of the table it updated sees the update.
/// `setval` is a call in a SELECT, but it writes the sequence: a read of the sequence
/// relation (`SELECT last_value FROM s`) must see it. (`setval` is logged exactly;
/// `nextval` is logged ahead, so a standby that replayed it shows a later value than
/// the primary's, never an earlier one.)
#[tokio::test]
async fn sequence_values_set_by_setval_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let seq = unique("seq");
    setup(&format!("CREATE SEQUENCE {seq} MINVALUE 0 START 0")).await;
    check_hole(
        Hole::plain(
            "sequence",
            format!("SELECT setval('{seq}', $1::int)"),
            &format!("SELECT last_value FROM {seq}"),
        ),
        "enable_recent_access_routing = false",
    )
    .await;
}

/// `setval` of a sequence named at run time (`pg_get_serial_sequence`, as ORMs reset
/// sequences): pgfresh cannot tell which sequence it writes, so the whole database counts
/// as written and a read of the sequence sees the new value.
#[tokio::test]
async fn sequence_values_set_through_a_computed_name_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let t = unique("serial");
    setup(&format!(
        "CREATE TABLE {t}(id serial PRIMARY KEY);
         ALTER SEQUENCE {t}_id_seq MINVALUE 0 RESTART WITH 0"
    ))
    .await;
    check_hole(
        Hole::plain(
            "sequence named at run time",
            format!("SELECT setval(pg_get_serial_sequence('{t}', 'id'), $1::int)"),
            &format!("SELECT last_value FROM {t}_id_seq"),
        ),
        "enable_recent_access_routing = false",
    )
    .await;
}

/// A function whose body sets a sequence it names only at run time: pgfresh cannot tell
/// what the body writes, so a call of it counts as a write of the whole database.
#[tokio::test]
async fn a_function_writing_a_sequence_named_at_run_time_is_read_fresh() {
    let _g = SERIAL.lock().await;
    let (t, f) = (unique("fserial"), unique("fserial_set"));
    setup(&format!(
        "CREATE TABLE {t}(id serial PRIMARY KEY);
         ALTER SEQUENCE {t}_id_seq MINVALUE 0 RESTART WITH 0;
         CREATE FUNCTION {f}(v int) RETURNS void LANGUAGE plpgsql AS $$
         BEGIN PERFORM setval(pg_get_serial_sequence('{t}', 'id'), v); END $$"
    ))
    .await;
    check_hole(
        Hole::plain(
            "a function setting a sequence named at run time",
            format!("SELECT {f}($1::int)"),
            &format!("SELECT last_value FROM {t}_id_seq"),
        ),
        "enable_recent_access_routing = false",
    )
    .await;
}

#[tokio::test]
async fn do_block_writes_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let counts = unique("do_counts");
    setup(&format!(
        "CREATE TABLE {counts}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {counts} VALUES (1, 0);"
    ))
    .await;
    check_hole(
        Hole::plain(
            "DO block",
            format!("DO $$ BEGIN UPDATE {counts} SET n = n + 1 WHERE id = 1; END $$"),
            &format!("SELECT n FROM {counts} WHERE id = $1::int"),
        ),
        "enable_recent_access_routing = false",
    )
    .await;
}

#[tokio::test]
async fn reads_through_a_view_see_writes_to_its_base_table() {
    let _g = SERIAL.lock().await;
    let (orders, view) = (unique("orders"), unique("orders_view"));
    setup(&format!(
        "CREATE TABLE {orders}(id serial PRIMARY KEY, amount int NOT NULL);
         CREATE VIEW {view} AS SELECT id, amount FROM {orders};"
    ))
    .await;
    check_hole(
        Hole {
            name: "view",
            write: format!("INSERT INTO {orders}(amount) VALUES ($1::int)"),
            delta: 1,
            reads: plain(
                &format!("SELECT count(*) FROM {view} WHERE amount >= $1::int"),
                0,
            ),
            edges: vec![edge("view", &view, &orders)],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

/// A column default that calls a function with side effects (a gapless invoice number taken
/// from a counter table): an INSERT that names only `invoices` writes the counter too.
#[tokio::test]
async fn functions_in_column_defaults_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (invoices, counter, next) = (
        unique("gapless_invoices"),
        unique("gapless_counter"),
        unique("next_invoice_no"),
    );
    setup(&format!(
        "CREATE TABLE {counter}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {counter} VALUES (1, 0);
         CREATE FUNCTION {next}() RETURNS bigint LANGUAGE plpgsql AS $$
         DECLARE v bigint;
         BEGIN UPDATE {counter} SET n = n + 1 WHERE id = 1 RETURNING n INTO v; RETURN v; END $$;
         CREATE TABLE {invoices}(no bigint PRIMARY KEY DEFAULT {next}(), amount int NOT NULL);"
    ))
    .await;
    check_hole(
        Hole {
            name: "function in a column default",
            write: format!("INSERT INTO {invoices}(amount) VALUES ($1::int)"),
            delta: 1,
            reads: plain(&format!("SELECT n FROM {counter} WHERE id = $1::int"), 1),
            edges: vec![
                edge("expression", &invoices, &format!("{next}()")),
                edge("function", &format!("{next}()"), &counter),
            ],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

/// Columns whose types are domains with a check and a default that call functions with
/// side effects (the check through a domain over that domain): an INSERT that names only
/// `orders` runs both, and each writes the audit table.
#[tokio::test]
async fn functions_in_domain_checks_and_defaults_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (orders, audit, check, next, dom) = (
        unique("dom_orders"),
        unique("dom_audit"),
        unique("dom_check"),
        unique("dom_next"),
        unique("dom_amount"),
    );
    setup(&format!(
        "CREATE TABLE {audit}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {audit} VALUES (1, 0);
         CREATE FUNCTION {check}(v int) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN UPDATE {audit} SET n = n + 1 WHERE id = 1; RETURN v > 0; END $$;
         CREATE FUNCTION {next}() RETURNS bigint LANGUAGE plpgsql AS $$
         BEGIN UPDATE {audit} SET n = n + 1 WHERE id = 1; RETURN 1; END $$;
         CREATE DOMAIN {dom} AS int CHECK ({check}(VALUE));
         CREATE DOMAIN {dom}_outer AS {dom};
         CREATE DOMAIN {dom}_no AS bigint DEFAULT {next}();
         CREATE TABLE {orders}(id serial PRIMARY KEY, amount {dom}_outer NOT NULL, no {dom}_no);"
    ))
    .await;
    check_hole(
        Hole {
            name: "functions in a domain check and default",
            write: format!("INSERT INTO {orders}(amount) VALUES ($1::int)"),
            delta: 2,
            reads: plain(&format!("SELECT n FROM {audit} WHERE id = $1::int"), 1),
            edges: vec![
                edge("expression", &orders, &format!("{check}()")),
                edge("expression", &orders, &format!("{next}()")),
                edge("function", &format!("{check}()"), &audit),
            ],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

/// A domain whose check calls a function with side effects, used inside a composite type,
/// a range type and an array of the composite rather than as a column's own type: each
/// value made of them is checked (`ROW(v, 'x')::pair` once, the range's two bounds once
/// each), and each check writes the audit table behind an INSERT that names only `orders`.
#[tokio::test]
async fn functions_in_domain_checks_inside_composite_and_range_columns_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (orders, audit, check, dom) = (
        unique("cdom_orders"),
        unique("cdom_audit"),
        unique("cdom_check"),
        unique("cdom_amount"),
    );
    setup(&format!(
        "CREATE TABLE {audit}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {audit} VALUES (1, 0);
         CREATE FUNCTION {check}(v int) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN UPDATE {audit} SET n = n + 1 WHERE id = 1; RETURN v > 0; END $$;
         CREATE DOMAIN {dom} AS int CHECK ({check}(VALUE));
         CREATE TYPE {dom}_pair AS (amount {dom}, note text);
         CREATE TYPE {dom}_span AS RANGE (subtype = {dom});
         CREATE TABLE {orders}(id serial PRIMARY KEY, pair {dom}_pair,
           span {dom}_span, pairs {dom}_pair[]);"
    ))
    .await;
    check_hole(
        Hole::learned(
            "a domain check inside composite, range and array columns",
            format!(
                "INSERT INTO {orders}(pair, span, pairs) VALUES (\
                 ROW($1::int, 'x')::{dom}_pair, \
                 ('[' || $1::int || ',' || ($1::int + 1) || ')')::{dom}_span, \
                 ARRAY[ROW($1::int, 'y')::{dom}_pair])"
            ),
            4,
            plain(&format!("SELECT n FROM {audit} WHERE id = $1::int"), 1),
            vec![
                edge("expression", &orders, &format!("{check}()")),
                edge("function", &format!("{check}()"), &audit),
            ],
        ),
        CONTROL,
    )
    .await;
}

/// Functions that run where a statement names something else: an aggregate's state
/// transition function, an operator's function, an explicit cast's function and an
/// assignment cast's (a value of another type written to a column of the cast's type).
/// Each writes the audit table behind a statement that names none of them: an INSERT
/// into a plain table, and a SELECT that applies the aggregate, the operator and the
/// cast only.
#[tokio::test]
async fn functions_behind_aggregates_operators_and_casts_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let p = unique("implicit");
    let (audit, bump, table) = (
        format!("{p}_audit"),
        format!("{p}_bump"),
        format!("{p}_plain"),
    );
    let (agg, step, op_f, wrapped, to_wrapped, tagged, to_tagged) = (
        format!("{p}_sum"),
        format!("{p}_step"),
        format!("{p}_plus"),
        format!("{p}_wrapped"),
        format!("{p}_to_wrapped"),
        format!("{p}_tagged"),
        format!("{p}_to_tagged"),
    );
    setup(&format!(
        "CREATE TABLE {audit}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {audit} VALUES (1, 0);
         CREATE FUNCTION {bump}() RETURNS void LANGUAGE plpgsql AS $$
         BEGIN UPDATE {audit} SET n = n + 1 WHERE id = 1; END $$;
         CREATE FUNCTION {step}(s int, v int) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN PERFORM {bump}(); RETURN s + v; END $$;
         CREATE AGGREGATE {agg}(int) (sfunc = {step}, stype = int, initcond = '0');
         CREATE FUNCTION {op_f}(a int, b int) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN PERFORM {bump}(); RETURN a + b; END $$;
         CREATE OPERATOR <+> (leftarg = int, rightarg = int, function = {op_f});
         CREATE TYPE {wrapped} AS (v int);
         CREATE FUNCTION {to_wrapped}(a int) RETURNS {wrapped} LANGUAGE plpgsql AS $$
         BEGIN PERFORM {bump}(); RETURN ROW(a)::{wrapped}; END $$;
         CREATE CAST (int AS {wrapped}) WITH FUNCTION {to_wrapped}(int);
         CREATE TYPE {tagged} AS (v int);
         CREATE FUNCTION {to_tagged}(a int) RETURNS {tagged} LANGUAGE plpgsql AS $$
         BEGIN PERFORM {bump}(); RETURN ROW(a)::{tagged}; END $$;
         CREATE CAST (int AS {tagged}) WITH FUNCTION {to_tagged}(int) AS ASSIGNMENT;
         CREATE TABLE {table}(x int, w {wrapped}, t {tagged});"
    ))
    .await;
    let edges = || {
        vec![
            edge("function", &format!("{agg}()"), &format!("{step}()")),
            edge("function", "operator <+>()", &format!("{op_f}()")),
            edge(
                "function",
                &format!("cast to {wrapped}()"),
                &format!("{to_wrapped}()"),
            ),
            edge("expression", &table, &format!("{to_tagged}()")),
            edge("function", &format!("{bump}()"), &audit),
        ]
    };
    let read = format!("SELECT n FROM {audit} WHERE id = $1::int");
    // Four functions a row: the aggregate's step, the operator, both casts.
    check_hole(
        Hole::learned(
            "an INSERT through an aggregate, an operator and casts",
            format!(
                "INSERT INTO {table}(x, w, t) \
                 SELECT {agg}(v) <+> 1, $1::int::{wrapped}, $1::int FROM (VALUES (1)) s(v)"
            ),
            4,
            plain(&read, 1),
            edges(),
        ),
        CONTROL,
    )
    .await;
    // A read, as far as its text shows.
    check_hole(
        Hole::learned(
            "a SELECT applying an aggregate, an operator and a cast",
            format!(
                "SELECT {agg}(v <+> 1), max((v::{wrapped}).v) \
                 FROM (VALUES ($1::int)) s(v)"
            ),
            3,
            plain(&read, 1),
            edges(),
        ),
        CONTROL,
    )
    .await;
}

/// A user cast applied implicitly (`AS IMPLICIT`: on assignment and inside expressions)
/// runs its function where the text names no cast and no type: an INSERT of a value of
/// the cast's source type into a column of a built-in type, and a comparison of such a
/// value with a number. Its function writes the audit table.
#[tokio::test]
async fn functions_behind_implicit_casts_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let p = unique("implicast");
    let (audit, bump, tag, tag_to_int, src, dst) = (
        format!("{p}_audit"),
        format!("{p}_bump"),
        format!("{p}_tag"),
        format!("{p}_tag_to_int"),
        format!("{p}_src"),
        format!("{p}_dst"),
    );
    setup(&format!(
        "CREATE TABLE {audit}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {audit} VALUES (1, 0);
         CREATE FUNCTION {bump}() RETURNS void LANGUAGE plpgsql AS $$
         BEGIN UPDATE {audit} SET n = n + 1 WHERE id = 1; END $$;
         CREATE TYPE {tag} AS (v int);
         CREATE FUNCTION {tag_to_int}(t {tag}) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN PERFORM {bump}(); RETURN t.v; END $$;
         CREATE CAST ({tag} AS int) WITH FUNCTION {tag_to_int}({tag}) AS IMPLICIT;
         CREATE TABLE {src}(id int, t {tag});
         INSERT INTO {src} VALUES (1, ROW(5));
         CREATE TABLE {dst}(x int);"
    ))
    .await;
    // A writing cast to int sends every `::int` of the database to the primary: dropped
    // when the test ends, pass or fail, so that the tests after it read on the replicas.
    struct DropCast(String);
    impl Drop for DropCast {
        fn drop(&mut self) {
            let _ = cluster().psql(
                0,
                "app",
                &format!("DROP CAST IF EXISTS ({} AS int)", self.0),
            );
        }
    }
    let _cast = DropCast(tag.clone());
    let edges = || {
        vec![
            edge("function", &format!("{bump}()"), &audit),
            edge("expression", &src, &format!("{tag_to_int}()")),
        ]
    };
    // (No `::int` in the texts: an explicit cast to int runs the cast's function too.)
    let read = format!("SELECT n FROM {audit} WHERE id = $1");
    // One row cast on assignment to `x int`.
    check_hole(
        Hole::learned(
            "an INSERT through an implicit cast",
            format!("INSERT INTO {dst}(x) SELECT t FROM {src} WHERE id = 1 AND $1 > 0"),
            1,
            plain(&read, 1),
            edges(),
        ),
        CONTROL,
    )
    .await;
    // A read as far as its text shows: `t > 0` casts `t` to int.
    check_hole(
        Hole::learned(
            "a SELECT comparing through an implicit cast",
            format!("SELECT count(*) FROM {src} WHERE id = 1 AND t > 0 AND $1 > 0"),
            1,
            plain(&read, 1),
            edges(),
        ),
        CONTROL,
    )
    .await;
}

/// More functions that run behind a statement naming none of them: those a materialized
/// view's query calls run at its refresh, a trigger's `WHEN` condition runs with the write
/// it guards, and a function applying a user operator (PL/pgSQL and SQL bodies alike) runs
/// the operator's function. Each writes the audit table.
#[tokio::test]
async fn functions_behind_refreshes_trigger_conditions_and_operators_in_bodies_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let p = unique("behind");
    let (audit, bump, mv, guarded, noop, op_f, uses_pl, uses_sql) = (
        format!("{p}_audit"),
        format!("{p}_bump"),
        format!("{p}_mv"),
        format!("{p}_guarded"),
        format!("{p}_noop"),
        format!("{p}_plus"),
        format!("{p}_uses_pl"),
        format!("{p}_uses_sql"),
    );
    setup(&format!(
        "CREATE TABLE {audit}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {audit} VALUES (1, 0);
         CREATE FUNCTION {bump}() RETURNS int LANGUAGE plpgsql AS $$
         BEGIN UPDATE {audit} SET n = n + 1 WHERE id = 1; RETURN 1; END $$;
         CREATE MATERIALIZED VIEW {mv} AS SELECT {bump}() AS x;
         CREATE FUNCTION {noop}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RETURN NEW; END $$;
         CREATE TABLE {guarded}(x int);
         CREATE TRIGGER {guarded}_trg BEFORE INSERT ON {guarded} FOR EACH ROW
           WHEN ({bump}() = 1) EXECUTE FUNCTION {noop}();
         CREATE FUNCTION {op_f}(a int, b int) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN PERFORM {bump}(); RETURN a + b; END $$;
         CREATE OPERATOR <<+>> (leftarg = int, rightarg = int, function = {op_f});
         CREATE FUNCTION {uses_pl}(v int) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN RETURN v <<+>> 1; END $$;
         CREATE FUNCTION {uses_sql}(v int) RETURNS int LANGUAGE sql AS $$ SELECT v <<+>> 1 $$;"
    ))
    .await;
    let edges = || {
        vec![
            edge("view", &mv, &format!("{bump}()")),
            edge("expression", &guarded, &format!("{bump}()")),
            edge("function", &format!("{uses_pl}()"), "operator <<+>>()"),
            edge("function", &format!("{uses_sql}()"), "operator <<+>>()"),
            edge("function", "operator <<+>>()", &format!("{op_f}()")),
        ]
    };
    let read = format!("SELECT n FROM {audit} WHERE id = $1::int");
    for (name, write, delta) in [
        ("a refresh", format!("REFRESH MATERIALIZED VIEW {mv}"), 1),
        (
            "a trigger's condition",
            format!("INSERT INTO {guarded} VALUES ($1::int)"),
            1,
        ),
        (
            "operators in function bodies",
            format!("SELECT {uses_pl}($1::int), {uses_sql}($1::int)"),
            2,
        ),
    ] {
        check_hole(
            Hole::learned(name, write, delta, plain(&read, 1), edges()),
            CONTROL,
        )
        .await;
    }
}

/// Reads that write: a view whose query calls a function that writes (an audit of who
/// reads it; read directly or by a function), a table whose row-security policy does; and
/// a write checked by a policy that does. The read runs on the primary (a standby would refuse the write) and marks
/// what the function writes; so does the write.
#[tokio::test]
async fn writes_of_functions_run_by_views_and_policies_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let p = unique("audited");
    let (audit, bump, view, docs, inbox) = (
        format!("{p}_audit"),
        format!("{p}_bump"),
        format!("{p}_view"),
        format!("{p}_docs"),
        format!("{p}_inbox"),
    );
    setup(&format!(
        "CREATE TABLE {audit}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {audit} VALUES (1, 0);
         CREATE FUNCTION {bump}() RETURNS int LANGUAGE plpgsql AS $$
         BEGIN UPDATE {audit} SET n = n + 1 WHERE id = 1; RETURN 1; END $$;
         CREATE VIEW {view} AS SELECT {bump}() AS x;
         CREATE FUNCTION {p}_reader(v int) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN RETURN (SELECT x FROM {view}) + v; END $$;
         CREATE TABLE {docs}(x int);
         INSERT INTO {docs} VALUES (1);
         ALTER TABLE {docs} ENABLE ROW LEVEL SECURITY;
         ALTER TABLE {docs} FORCE ROW LEVEL SECURITY;
         CREATE POLICY {docs}_read ON {docs} FOR SELECT USING ({bump}() = 1);
         CREATE TABLE {inbox}(x int);
         ALTER TABLE {inbox} ENABLE ROW LEVEL SECURITY;
         ALTER TABLE {inbox} FORCE ROW LEVEL SECURITY;
         CREATE POLICY {inbox}_write ON {inbox} FOR INSERT WITH CHECK ({bump}() = 1);"
    ))
    .await;
    let edges = || {
        vec![
            edge("view", &view, &format!("{bump}()")),
            edge("policy", &docs, &format!("{bump}()")),
            edge("expression", &inbox, &format!("{bump}()")),
            edge("function", &format!("{bump}()"), &audit),
        ]
    };
    let read = format!("SELECT n FROM {audit} WHERE id = $1::int");
    for (name, write) in [
        (
            "a read of a view",
            format!("SELECT x::int8 FROM {view} WHERE $1::int > 0"),
        ),
        (
            "a function reading the view",
            format!("SELECT {p}_reader($1::int)"),
        ),
        (
            "a read under a policy",
            format!("SELECT count(*) FROM {docs} WHERE $1::int > 0"),
        ),
        (
            "a write under a policy",
            format!("INSERT INTO {inbox} VALUES ($1::int)"),
        ),
    ] {
        // (Prepared statements too. Their first run, which prepares them on the primary,
        // marks what they write, so these loops cannot show the lane's question for a
        // statement the connection holds: `a_held_prepared_statement_s_hidden_write_is_read_fresh`.)
        check_hole_over(
            Hole::learned(name, write, 1, plain(&read, 1), edges()),
            CONTROL,
            &[Proto::Simple, Proto::Extended, Proto::Prepared],
        )
        .await;
    }
}

/// Operators and aggregates inside what the catalog keeps, not in the statement: a view
/// whose query applies a user aggregate or operator, a check constraint applying a user
/// operator. The catalog records the operator (or the aggregate), not the function that
/// runs; each writes the audit table.
#[tokio::test]
async fn operators_and_aggregates_inside_views_and_checks_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let p = unique("inside");
    let (audit, bump, step, agg, op_f, summed, added, checked) = (
        format!("{p}_audit"),
        format!("{p}_bump"),
        format!("{p}_step"),
        format!("{p}_sum"),
        format!("{p}_plus"),
        format!("{p}_summed"),
        format!("{p}_added"),
        format!("{p}_checked"),
    );
    setup(&format!(
        "CREATE TABLE {audit}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {audit} VALUES (1, 0);
         CREATE FUNCTION {bump}() RETURNS void LANGUAGE plpgsql AS $$
         BEGIN UPDATE {audit} SET n = n + 1 WHERE id = 1; END $$;
         CREATE FUNCTION {step}(s int, v int) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN PERFORM {bump}(); RETURN s + v; END $$;
         CREATE AGGREGATE {agg}(int) (sfunc = {step}, stype = int, initcond = '0');
         CREATE FUNCTION {op_f}(a int, b int) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN PERFORM {bump}(); RETURN a + b; END $$;
         CREATE OPERATOR <<<+>>> (leftarg = int, rightarg = int, function = {op_f});
         CREATE VIEW {summed} AS SELECT {agg}(x) AS s FROM (VALUES (1)) t(x);
         CREATE VIEW {added} AS SELECT 1 <<<+>>> 2 AS y;
         CREATE TABLE {checked}(x int CHECK ((x <<<+>>> 0) IS NOT NULL));"
    ))
    .await;
    let edges = || {
        vec![
            edge("view", &summed, &format!("{agg}()")),
            edge("view", &added, &format!("{op_f}()")),
            edge("expression", &checked, &format!("{op_f}()")),
            edge("function", &format!("{bump}()"), &audit),
        ]
    };
    let read = format!("SELECT n FROM {audit} WHERE id = $1::int");
    for (name, write) in [
        (
            "a view applying an aggregate",
            format!("SELECT s::int8 FROM {summed} WHERE $1::int > 0"),
        ),
        (
            "a view applying an operator",
            format!("SELECT y::int8 FROM {added} WHERE $1::int > 0"),
        ),
        (
            "a check applying an operator",
            format!("INSERT INTO {checked} VALUES ($1::int)"),
        ),
    ] {
        check_hole(
            Hole::learned(name, write, 1, plain(&read, 1), edges()),
            CONTROL,
        )
        .await;
    }
}

/// A view whose query calls a function: a read of the view reads what the function reads
/// (here a balance summed from a ledger the view does not name).
#[tokio::test]
async fn reads_through_a_view_see_what_its_functions_read() {
    let _g = SERIAL.lock().await;
    let (accounts, ledger, bal, view) = (
        unique("vf_accounts"),
        unique("vf_ledger"),
        unique("vf_balance"),
        unique("vf_balances"),
    );
    setup(&format!(
        "CREATE TABLE {accounts}(id int PRIMARY KEY);
         INSERT INTO {accounts} VALUES (1);
         CREATE TABLE {ledger}(account int NOT NULL, amount int NOT NULL);
         CREATE FUNCTION {bal}(a int) RETURNS bigint STABLE LANGUAGE sql
           AS 'SELECT coalesce(sum(amount), 0) FROM {ledger} WHERE account = a';
         CREATE VIEW {view} AS SELECT id, {bal}(id) AS balance FROM {accounts};"
    ))
    .await;
    check_hole(
        Hole {
            name: "view calling a function",
            write: format!("INSERT INTO {ledger} VALUES (1, 1 + 0 * $1::int)"),
            delta: 1,
            reads: plain(&format!("SELECT balance FROM {view} WHERE id = $1::int"), 1),
            edges: vec![
                edge("view", &view, &format!("{bal}()")),
                edge("function", &format!("{bal}()"), &ledger),
            ],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

/// Row security: a read of `docs` returns the rows of the groups the reader belongs to, so
/// a membership just granted must be seen by the next read of `docs`, which names only
/// `docs` (the policy reads `memberships`).
#[tokio::test]
async fn reads_filtered_by_a_row_security_policy_see_writes_to_what_it_reads() {
    let _g = SERIAL.lock().await;
    let (docs, members) = (unique("rls_docs"), unique("rls_members"));
    setup(&format!(
        "CREATE TABLE {docs}(id serial PRIMARY KEY, grp int NOT NULL);
         INSERT INTO {docs}(grp) SELECT g FROM generate_series(1, 1000) g;
         CREATE TABLE {members}(grp int NOT NULL, member name NOT NULL);
         ALTER TABLE {docs} ENABLE ROW LEVEL SECURITY;
         ALTER TABLE {docs} FORCE ROW LEVEL SECURITY;
         CREATE POLICY {docs}_members ON {docs} FOR SELECT
           USING (grp IN (SELECT m.grp FROM {members} m WHERE m.member = current_user));"
    ))
    .await;
    check_hole(
        Hole {
            name: "row-security policy",
            write: format!("INSERT INTO {members} VALUES ($1::int, current_user)"),
            delta: 1,
            reads: plain(
                &format!("SELECT count(*) FROM {docs} WHERE id > $1::int"),
                0,
            ),
            edges: vec![edge("policy", &docs, &members)],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

#[tokio::test]
async fn reads_of_a_partition_see_writes_routed_through_its_parent() {
    let _g = SERIAL.lock().await;
    let events = unique("events");
    let part = format!("{events}_2026");
    setup(&format!(
        "CREATE TABLE {events}(created date NOT NULL, n int NOT NULL) PARTITION BY RANGE (created);
         CREATE TABLE {part} PARTITION OF {events} FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
         CREATE TABLE {events}_other PARTITION OF {events} DEFAULT;"
    ))
    .await;
    check_hole(
        Hole {
            name: "partition",
            write: format!("INSERT INTO {events}(created, n) VALUES ('2026-03-01', $1::int)"),
            delta: 1,
            reads: plain(
                &format!("SELECT count(*) FROM {part} WHERE n >= $1::int"),
                0,
            ),
            edges: vec![edge("partition", &events, &part)],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

#[tokio::test]
async fn writes_in_a_called_function_body_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (ledger, f) = (unique("ledger"), unique("place_order"));
    setup(&format!(
        "CREATE TABLE {ledger}(id serial PRIMARY KEY, n int NOT NULL);
         CREATE FUNCTION {f}(x int) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO {ledger}(n) VALUES (x);
           RETURN x;
         END $$;"
    ))
    .await;
    check_hole(
        Hole {
            name: "function body",
            write: format!("SELECT {f}($1::int)"),
            delta: 1,
            reads: plain(
                &format!("SELECT count(*) FROM {ledger} WHERE n >= $1::int"),
                0,
            ),
            edges: vec![edge("function", &format!("{f}()"), &ledger)],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

#[tokio::test]
async fn foreign_key_cascades_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (customers, addresses) = (unique("customers"), unique("addresses"));
    // Enough customers for every delete of both loops (4 × ITERATIONS).
    setup(&format!(
        "CREATE TABLE {customers}(id int PRIMARY KEY);
         CREATE TABLE {addresses}(id serial PRIMARY KEY,
           customer_id int NOT NULL REFERENCES {customers}(id) ON DELETE CASCADE);
         INSERT INTO {customers} SELECT g FROM generate_series(1, 200) g;
         INSERT INTO {addresses}(customer_id) SELECT g FROM generate_series(1, 200) g;"
    ))
    .await;
    check_hole(
        Hole {
            name: "foreign key cascade",
            write: format!("DELETE FROM {customers} WHERE id = $1::int"),
            delta: -1,
            reads: plain(
                &format!("SELECT count(*) FROM {addresses} WHERE customer_id >= $1::int"),
                0,
            ),
            edges: vec![edge("foreign_key", &customers, &addresses)],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

#[tokio::test]
async fn stable_functions_reading_a_written_table_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (orders, sql_f, pl_f) = (
        unique("orders"),
        unique("has_order_sql"),
        unique("has_order_pl"),
    );
    setup(&format!(
        "CREATE TABLE {orders}(id serial PRIMARY KEY, amount int NOT NULL);
         CREATE FUNCTION {sql_f}(min_amount int) RETURNS bigint LANGUAGE sql STABLE AS
           $$ SELECT count(*) FROM {orders} WHERE amount >= min_amount $$;
         CREATE FUNCTION {pl_f}(min_amount int) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
         BEGIN
           RETURN (SELECT count(*) FROM {orders} WHERE amount >= min_amount);
         END $$;"
    ))
    .await;
    let mut reads = plain(&format!("SELECT {sql_f}($1::int)"), 0);
    reads.extend(plain(&format!("SELECT {pl_f}($1::int)"), 0));
    check_hole(
        Hole {
            name: "stable functions",
            write: format!("INSERT INTO {orders}(amount) VALUES ($1::int)"),
            delta: 1,
            reads,
            edges: vec![
                edge("function", &format!("{sql_f}()"), &orders),
                edge("function", &format!("{pl_f}()"), &orders),
            ],
            unanalysable: vec![],
            // The calls are reads only once the proxy knows both functions are STABLE.
            warmup: Some(format!(
                "SELECT (inet_server_port() + 0 * ({sql_f}(0) + {pl_f}(0)))::int"
            )),
            out_of_band: None,
        },
        CONTROL,
    )
    .await;
}

#[tokio::test]
async fn read_only_transactions_see_what_was_acknowledged_before_them() {
    let _g = SERIAL.lock().await;
    let (t, cold) = (unique("ro_hot"), unique("ro_cold"));
    setup(&format!(
        "CREATE TABLE {t}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {t} VALUES (1, 0);
         CREATE TABLE {cold}(id int);
         INSERT INTO {cold} VALUES (1);"
    ))
    .await;
    let read = format!("SELECT n FROM {t} WHERE id = $1::int");
    let first = format!("SELECT count(*) FROM {cold}");
    let mut reads = Vec::new();
    for begin in ["BEGIN READ ONLY", "START TRANSACTION READ ONLY"] {
        for via in [Via::Writer, Via::Other] {
            reads.push(Read {
                via,
                begin: Some(begin),
                first: Some(first.clone()),
                sql: read.clone(),
                arg: 1,
            });
        }
    }
    // default_transaction_read_only on in the session: a plain BEGIN is read-only.
    for via in [Via::ReadOnlySession, Via::ReadOnlyDefault] {
        reads.push(Read {
            via,
            begin: Some("BEGIN"),
            first: Some(first.clone()),
            sql: read.clone(),
            arg: 1,
        });
    }
    // No dependency switch governs this rule, so the control turns recency routing off
    // altogether: a read-only transaction then runs on any replica inside the lag budget.
    check_hole(
        Hole {
            name: "read-only transactions",
            write: format!("UPDATE {t} SET n = n + 1 WHERE id = 1 AND $1::int > 0"),
            delta: 1,
            reads,
            edges: vec![],
            unanalysable: vec![],
            // The cold table is served by replicas before the loops start.
            warmup: Some(format!("SELECT inet_server_port() FROM {cold} LIMIT 1")),
            out_of_band: None,
        },
        "enable_recent_access_routing = false",
    )
    .await;
}

#[tokio::test]
async fn dynamic_sql_in_a_trigger_is_handled_conservatively() {
    let _g = SERIAL.lock().await;
    let (src, target, unrelated, f) = (
        unique("dyn_src"),
        unique("dyn_target"),
        unique("dyn_unrelated"),
        unique("dyn_bump"),
    );
    setup(&format!(
        "CREATE TABLE {src}(id serial PRIMARY KEY, n int NOT NULL);
         CREATE TABLE {target}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {target} VALUES (1, 0);
         CREATE TABLE {unrelated}(id serial PRIMARY KEY);
         CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           EXECUTE format('UPDATE %I SET n = n + 1 WHERE id = 1', '{target}');
           RETURN NEW;
         END $$;
         CREATE TRIGGER {f}_trg AFTER INSERT ON {src} FOR EACH ROW EXECUTE FUNCTION {f}();"
    ))
    .await;
    check_hole(
        Hole {
            name: "dynamic SQL",
            write: format!("INSERT INTO {src}(n) VALUES ($1::int)"),
            delta: 1,
            reads: plain(&format!("SELECT n FROM {target} WHERE id = $1::int"), 1),
            edges: vec![edge("trigger", &src, &format!("{f}()"))],
            unanalysable: vec![format!("{f}()")],
            warmup: None,
            // A table nobody names: written straight on the primary just before each write
            // through pgfresh. What the trigger may write is unknown, so a read of any
            // relation right after it goes to the primary (or a replica that has replayed
            // the trigger's write, hence this one too).
            out_of_band: Some((
                format!("INSERT INTO {unrelated} DEFAULT VALUES"),
                format!("SELECT count(*) FROM {unrelated}"),
            )),
        },
        CONTROL,
    )
    .await;
}

/// `TRUNCATE … CASCADE` empties every table with a foreign key to the truncated one,
/// whatever the key's actions: pgfresh cannot name them from the text, so the whole
/// database is hot (primary only) for the TTL. (With replay merely delayed a standby
/// takes the truncation's lock before its commit and readers wait for it, so replay is
/// paused here to expose a stale read.)
#[tokio::test]
async fn truncate_cascade_is_read_fresh() {
    let _g = SERIAL.lock().await;
    let (customers, addresses) = (unique("tc_customers"), unique("tc_addresses"));
    setup(&format!(
        "CREATE TABLE {customers}(id int PRIMARY KEY);
         CREATE TABLE {addresses}(id int, customer_id int REFERENCES {customers}(id));"
    ))
    .await;
    let p = proxy();
    let c = p.connect().await;
    let direct = primary_direct().await;
    for i in 0..5 {
        direct
            .batch_execute(&format!(
                "INSERT INTO {customers} VALUES ({i}); INSERT INTO {addresses} VALUES ({i}, {i})"
            ))
            .await
            .unwrap();
        wait_replicated_on(cluster(), &c).await;
        p.wait_cold(&[&customers, &addresses]).await;
        let paused = PausedReplay::now();
        c.batch_execute(&format!("TRUNCATE {customers} CASCADE"))
            .await
            .unwrap();
        let n = read_i64(
            &c,
            if i % 2 == 0 {
                Proto::Simple
            } else {
                Proto::Extended
            },
            &format!("SELECT count(*) FROM {addresses} WHERE id >= $1::int"),
            0,
        )
        .await;
        drop(paused);
        assert_eq!(
            n, 0,
            "iteration {i}: the cascaded truncation was read stale"
        );
    }
}

/// `TRUNCATE … RESTART IDENTITY` resets the sequences owned by the truncated tables'
/// columns, and `ALTER TABLE … ALTER COLUMN … RESTART` an identity column's sequence,
/// which the text does not name: the whole database counts as written, and a read of
/// such a sequence (`SELECT last_value FROM t_id_seq`) sees the reset. (Replay is
/// paused, as for `TRUNCATE … CASCADE` above.)
#[tokio::test]
async fn sequence_restarts_behind_a_table_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let t = unique("tri_serial");
    let seq = format!("{t}_id_seq");
    setup(&format!(
        "CREATE TABLE {t}(id int GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY)"
    ))
    .await;
    let p = proxy();
    let c = p.connect().await;
    let other = p.connect().await;
    let direct = primary_direct().await;
    let read = format!("SELECT last_value FROM {seq} WHERE $1::int = 0");
    let mut stale = Vec::new();
    for i in 0..4 {
        direct
            .batch_execute(&format!(
                "INSERT INTO {t} DEFAULT VALUES; INSERT INTO {t} DEFAULT VALUES"
            ))
            .await
            .unwrap();
        wait_replicated_on(cluster(), &c).await;
        p.wait_cold(&[&t, &seq]).await;
        let paused = PausedReplay::now();
        let restart = if i % 4 < 2 {
            format!("TRUNCATE {t} RESTART IDENTITY")
        } else {
            format!("ALTER TABLE {t} ALTER COLUMN id RESTART WITH 1")
        };
        c.batch_execute(&restart).await.unwrap();
        let proto = if i % 2 == 0 {
            Proto::Simple
        } else {
            Proto::Extended
        };
        let want = read_i64(&direct, Proto::Extended, &read, 0).await;
        for (label, client) in [("writer", &c), ("other", &other)] {
            let got = read_i64(client, proto, &read, 0).await;
            if got != want {
                stale.push(format!("{restart}, {label}: saw {got}, expected {want}"));
            }
        }
        drop(paused);
        // TRUNCATE left the table empty; the restarted identity would collide.
        direct
            .batch_execute(&format!("TRUNCATE {t}"))
            .await
            .unwrap();
    }
    assert!(
        stale.is_empty(),
        "stale reads of a restarted sequence: {stale:?}"
    );
}

/// Replay paused on both standbys while this lives.
struct PausedReplay;

impl PausedReplay {
    fn now() -> PausedReplay {
        for i in 1..cluster().nodes().len() {
            cluster().pause_replay(i).expect("pause replay");
        }
        PausedReplay
    }
}

impl Drop for PausedReplay {
    fn drop(&mut self) {
        for i in 1..cluster().nodes().len() {
            let _ = cluster().resume_replay(i);
        }
    }
}

/// Two-phase commit: a prepared transaction's writes become visible at `COMMIT PREPARED`,
/// which may come from any session (or another service), so that commit counts as writing
/// the whole database. Returns the stale reads of `rounds` rounds through `p`.
async fn two_phase_misses(p: &ProxyHandle, counts: &str, rounds: usize) -> usize {
    let writer = p.connect().await;
    let other = p.connect().await;
    let truth = primary_direct().await;
    let read = format!("SELECT n FROM {counts} WHERE id = 1");
    let mut expected = read_i64(&truth, Proto::Extended, &read, 0).await;
    let mut misses = 0;
    for i in 0..rounds {
        let gid = format!("{counts}_{i}_{}", std::process::id());
        writer
            .batch_execute(&format!(
                "BEGIN; UPDATE {counts} SET n = n + 1 WHERE id = 1; PREPARE TRANSACTION '{gid}'"
            ))
            .await
            .expect("prepare");
        // The commit from another session than the one that prepared.
        other
            .batch_execute(&format!("COMMIT PREPARED '{gid}'"))
            .await
            .expect("commit prepared");
        expected += 1;
        for (c, proto) in [(&writer, Proto::Simple), (&other, Proto::Extended)] {
            misses += usize::from(read_i64(c, proto, &read, 0).await != expected);
        }
    }
    misses
}

#[tokio::test]
async fn writes_of_a_prepared_transaction_are_read_fresh_after_commit_prepared() {
    let _g = SERIAL.lock().await;
    let counts = unique("twophase_counts");
    setup(&format!(
        "CREATE TABLE {counts}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {counts} VALUES (1, 0);"
    ))
    .await;
    let guarded = start_proxy(&config_text(""));
    let blind = start_proxy(&config_text("enable_recent_access_routing = false"));
    let _delay = ApplyDelay::set(DELAY_MS);
    let misses = two_phase_misses(&guarded, &counts, ITERATIONS).await;
    let control = two_phase_misses(&blind, &counts, ITERATIONS).await;
    assert_eq!(misses, 0, "stale reads after COMMIT PREPARED");
    assert!(
        control > 0,
        "the control without recency routing saw no stale read, so the test proves nothing"
    );
}

/// The dblink extension runs SQL over a connection of its own, here to the database the
/// client is in (an autonomous audit write): what it writes commits behind the call, and
/// the whole database counts as written.
#[tokio::test]
async fn writes_over_dblink_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let counts = unique("dblink_counts");
    cluster()
        .psql(0, "app", "CREATE EXTENSION IF NOT EXISTS dblink")
        .expect("the dblink extension");
    struct DropDblink;
    impl Drop for DropDblink {
        fn drop(&mut self) {
            let _ = cluster().psql(0, "app", "DROP EXTENSION IF EXISTS dblink");
        }
    }
    let _dblink = DropDblink;
    setup(&format!(
        "CREATE TABLE {counts}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {counts} VALUES (1, 0);"
    ))
    .await;
    let conn = format!(
        "host=127.0.0.1 port={} dbname=app user=app password={APP_PASSWORD}",
        node_port(0)
    );
    check_hole(
        Hole::plain(
            "dblink",
            format!(
                "SELECT dblink_exec('{conn}', 'UPDATE {counts} SET n = n + 1 WHERE id = 1'), \
                 $1::int"
            ),
            &format!("SELECT n FROM {counts} WHERE id = $1::int"),
        ),
        "enable_recent_access_routing = false",
    )
    .await;
}

/// `ITERATIONS` times: a dblink write from database `app` to `db` through `p`, then a
/// read of what it wrote by a session of `p` in `db`; the stale reads.
async fn dblink_elsewhere_misses(p: &ProxyHandle, db: &str, counts: &str) -> usize {
    let writer = p.connect().await;
    let reader = p
        .connect_as("app", APP_PASSWORD, db)
        .await
        .expect("a session in the other database");
    let truth = cluster()
        .psql(0, db, &format!("SELECT n FROM {counts} WHERE id = 1"))
        .expect("the count on the primary");
    let mut expected: i64 = truth.parse().expect("a number");
    let conn = format!(
        "host=127.0.0.1 port={} dbname={db} user=app password={APP_PASSWORD}",
        node_port(0)
    );
    let write = format!(
        "SELECT dblink_exec('{conn}', 'UPDATE {counts} SET n = n + 1 WHERE id = 1'), $1::int"
    );
    let read = format!("SELECT n FROM {counts} WHERE id = $1::int");
    let mut misses = 0;
    for i in 0..ITERATIONS {
        let proto = if i % 2 == 0 {
            Proto::Simple
        } else {
            Proto::Extended
        };
        exec(&writer, proto, &write, 1).await;
        expected += 1;
        misses += usize::from(read_i64(&reader, proto, &read, 1).await != expected);
    }
    misses
}

/// A dblink write to another database of the same instance, read through the same
/// pgfresh in that database: the call may have written any database, so every database
/// counts as written.
#[tokio::test]
async fn writes_over_dblink_to_another_database_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (db, counts) = (unique("dblink_db"), unique("dblink_far"));
    cluster()
        .psql(0, "app", "CREATE EXTENSION IF NOT EXISTS dblink")
        .expect("the dblink extension");
    struct DropBoth(String);
    impl Drop for DropBoth {
        fn drop(&mut self) {
            let _ = cluster().psql(0, "app", "DROP EXTENSION IF EXISTS dblink");
            let _ = cluster().psql(
                0,
                "postgres",
                &format!("DROP DATABASE IF EXISTS {}", self.0),
            );
        }
    }
    let _drop = DropBoth(db.clone());
    cluster()
        .psql(0, "postgres", &format!("CREATE DATABASE {db} OWNER app"))
        .expect("the other database");
    cluster()
        .psql(
            0,
            &db,
            &format!(
                "SET ROLE app; CREATE TABLE {counts}(id int PRIMARY KEY, n bigint NOT NULL);
                 INSERT INTO {counts} VALUES (1, 0);"
            ),
        )
        .expect("the other database's table");
    let c = proxy().connect().await;
    wait_replicated_on(cluster(), &c).await;
    let guarded = start_proxy(&config_text(""));
    let blind = start_proxy(&config_text("enable_recent_access_routing = false"));
    let _delay = ApplyDelay::set(DELAY_MS);
    let misses = dblink_elsewhere_misses(&guarded, &db, &counts).await;
    let control = dblink_elsewhere_misses(&blind, &db, &counts).await;
    eprintln!("dblink to another database: {misses} stale, control {control} stale");
    assert_eq!(
        misses, 0,
        "stale reads after a dblink write to another database"
    );
    assert!(
        control > 0,
        "the control without recency routing saw no stale read, so the test proves nothing"
    );
}

/// A write to a foreign table goes to another server, which may be this very database
/// (`postgres_fdw` pointed back at it, to write outside the caller's transaction): what
/// it writes there is not known, so the whole database counts as written.
#[tokio::test]
async fn writes_through_a_foreign_table_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (counts, server, foreign, view) = (
        unique("fdw_counts"),
        unique("fdw_loopback"),
        unique("fdw_counts_remote"),
        unique("fdw_counts_view"),
    );
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "CREATE EXTENSION IF NOT EXISTS postgres_fdw;
                 CREATE SERVER {server} FOREIGN DATA WRAPPER postgres_fdw
                   OPTIONS (host '127.0.0.1', port '{}', dbname 'app');
                 CREATE USER MAPPING FOR app SERVER {server}
                   OPTIONS (user 'app', password '{APP_PASSWORD}');
                 GRANT USAGE ON FOREIGN SERVER {server} TO app;",
                node_port(0)
            ),
        )
        .expect("a loopback foreign server");
    // Dropped with the test: the server, its mapping, the foreign table and the view.
    struct DropFdw;
    impl Drop for DropFdw {
        fn drop(&mut self) {
            let _ = cluster().psql(0, "app", "DROP EXTENSION IF EXISTS postgres_fdw CASCADE");
        }
    }
    let _fdw = DropFdw;
    setup(&format!(
        "CREATE TABLE {counts}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {counts} VALUES (1, 0);
         CREATE FOREIGN TABLE {foreign}(id int, n bigint) SERVER {server}
           OPTIONS (table_name '{counts}');
         CREATE VIEW {view} AS SELECT id, n FROM {foreign};"
    ))
    .await;
    check_hole(
        Hole::learned(
            "a foreign table",
            format!("UPDATE {foreign} SET n = n + 1 WHERE id = 1 AND $1::int > 0"),
            1,
            plain(&format!("SELECT n FROM {counts} WHERE id = $1::int"), 1),
            // (Proof the graph is loaded: the view's edge.)
            vec![edge("view", &view, &foreign)],
        ),
        CONTROL,
    )
    .await;
}

/// How a write meets a trigger created just before it, with the dependency graph not yet
/// reloaded.
#[derive(Clone, Copy, Debug)]
enum BesideDdl {
    /// `CREATE TRIGGER ...; INSERT ...` in one simple-protocol string.
    SameString,
    /// `BEGIN`, `CREATE TRIGGER`, `INSERT`, `COMMIT` over the extended protocol.
    SameTransaction,
    /// Another session's INSERT, sent while the CREATE TRIGGER's transaction is open,
    /// waits for its lock and runs under the new trigger.
    WaitingOnTheLock,
    /// Another session's write, analysed before the CREATE TRIGGER was sent, blocked on
    /// an advisory lock inside a function until the trigger's commit is replayed.
    AnalysedBefore,
}

/// The fixture of [`writes_beside_a_new_trigger_are_read_fresh`]: a counter, a trigger
/// function bumping it, and fresh tables, each with a function `<table>_ins(key)` that
/// inserts a row once it holds advisory lock `key`.
struct TriggerFixture {
    totals: String,
    bump: String,
    lock_key: i64,
    next_table: usize,
    tables: Vec<String>,
}

impl TriggerFixture {
    async fn create(tables: usize) -> TriggerFixture {
        let (totals, bump) = (unique("bd_totals"), unique("bd_bump"));
        let tables: Vec<String> = (0..tables).map(|_| unique("bd_src")).collect();
        let mut sql = format!(
            "CREATE TABLE {totals}(id int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO {totals} VALUES (1, 0);
             CREATE FUNCTION {bump}() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN UPDATE {totals} SET n = n + 1 WHERE id = 1; RETURN NEW; END $$;"
        );
        for t in &tables {
            sql.push_str(&format!(
                "CREATE TABLE {t}(id int);
                 CREATE FUNCTION {t}_ins(k bigint) RETURNS int LANGUAGE plpgsql AS $$
                 BEGIN PERFORM pg_advisory_xact_lock(k); INSERT INTO {t} VALUES (1); RETURN 1; END $$;"
            ));
        }
        setup(&sql).await;
        TriggerFixture {
            totals,
            bump,
            lock_key: i64::from(std::process::id()) * 1000 + 7,
            next_table: 0,
            tables,
        }
    }

    fn take_table(&mut self) -> String {
        let t = self.tables[self.next_table].clone();
        self.next_table += 1;
        t
    }

    fn create_trigger(&self, table: &str) -> String {
        format!(
            "CREATE TRIGGER {table}_trg AFTER INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {}()",
            self.bump
        )
    }
}

/// Polls the primary until a backend of `app` waits on a lock running a query that
/// contains `needle`.
async fn wait_lock_waiter(truth: &tokio_postgres::Client, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = truth
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
                &[&needle],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if n > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no backend waited on a lock for {needle}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One write beside a new trigger through `p`, then a read of the counter the trigger
/// bumps from the writer's connection and another one; returns the stale reads.
async fn beside_ddl_round(
    p: &ProxyHandle,
    fx: &mut TriggerFixture,
    how: BesideDdl,
    expected: &mut i64,
) -> usize {
    let table = fx.take_table();
    let ddl = fx.create_trigger(&table);
    let ddl_session = p.connect().await;
    let writer = std::sync::Arc::new(p.connect().await);
    let other = p.connect().await;
    let truth = primary_direct().await;
    let insert = format!("INSERT INTO {table} VALUES (1)");
    match how {
        BesideDdl::SameString => {
            exec(&writer, Proto::Simple, &format!("{ddl}; {insert}"), 0).await;
        }
        BesideDdl::SameTransaction => {
            for sql in ["BEGIN", ddl.as_str(), insert.as_str(), "COMMIT"] {
                exec(&writer, Proto::Extended, sql, 0).await;
            }
        }
        BesideDdl::WaitingOnTheLock => {
            exec(&ddl_session, Proto::Simple, &format!("BEGIN; {ddl}"), 0).await;
            let w = writer.clone();
            let sql = insert.clone();
            let blocked = tokio::spawn(async move { exec(&w, Proto::Extended, &sql, 0).await });
            wait_lock_waiter(&truth, &insert).await;
            exec(&ddl_session, Proto::Simple, "COMMIT", 0).await;
            blocked.await.expect("the blocked insert");
        }
        BesideDdl::AnalysedBefore => {
            let key = fx.lock_key;
            truth
                .execute("SELECT pg_advisory_lock($1)", &[&key])
                .await
                .expect("advisory lock");
            let w = writer.clone();
            let call = format!("SELECT {table}_ins({key})");
            let sql = call.clone();
            let blocked = tokio::spawn(async move { exec(&w, Proto::Extended, &sql, 0).await });
            wait_lock_waiter(&truth, &call).await;
            exec(&ddl_session, Proto::Simple, &ddl, 0).await;
            // The standbys have replayed the trigger's commit, and pgfresh knows it: only
            // the write's own commit position keeps its effects off them.
            wait_replicated_on(cluster(), &truth).await;
            wait_replica_read(p, "SELECT inet_server_port()").await;
            truth
                .execute("SELECT pg_advisory_unlock($1)", &[&key])
                .await
                .expect("advisory unlock");
            blocked.await.expect("the blocked call");
        }
    }
    *expected += 1;
    let read = format!("SELECT n FROM {} WHERE id = 1", fx.totals);
    let mut stale = 0;
    for (c, proto) in [(&*writer, Proto::Extended), (&other, Proto::Simple)] {
        stale += usize::from(read_i64(c, proto, &read, 0).await != *expected);
    }
    assert_eq!(
        read_i64(&truth, Proto::Extended, &read, 0).await,
        *expected,
        "{how:?}: the trigger did not run"
    );
    stale
}

/// A schema change that makes writes run a user function, in the same string or
/// transaction as a write that runs it (or running it itself): a column default, a check,
/// a domain's check, a column of a domain made before (in a new table, too, or as a new
/// attribute of a composite column's type), `ALTER COLUMN ... TYPE ... USING`, `CREATE
/// TABLE (LIKE ... INCLUDING DEFAULTS)`. The graph in hand has no edge to what the function writes, so the change
/// counts like a new trigger (the unit marks the whole database) and what the function
/// wrote is read fresh. (Without that, every round here read stale.)
#[tokio::test]
async fn writes_beside_a_new_default_or_check_calling_a_function_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let p = start_proxy(&config_text(""));
    p.shared
        .deps
        .load_now(&p.shared, "app")
        .await
        .expect("the first dependency load");
    let truth = primary_direct().await;
    let mut stale = Vec::new();
    // (Statements run with `{t}` the table, `{f}` the function; each table has one row.)
    for (name, statements) in [
        (
            "default",
            &[
                "ALTER TABLE {t} ADD COLUMN no bigint DEFAULT {f}()",
                "INSERT INTO {t}(amount) VALUES (1)",
            ][..],
        ),
        (
            "check",
            &[
                "ALTER TABLE {t} ADD CHECK ({f}() > 0)",
                "INSERT INTO {t}(amount) VALUES (1)",
            ][..],
        ),
        (
            "domain check",
            &[
                "CREATE DOMAIN {t}_d AS int CHECK ({f}() > 0)",
                "ALTER TABLE {t} ADD COLUMN d {t}_d",
                "INSERT INTO {t}(amount, d) VALUES (1, 1)",
            ][..],
        ),
        (
            "column of a domain made before",
            &[
                "ALTER TABLE {t} ADD COLUMN d {t}_dd",
                "INSERT INTO {t}(amount, d) VALUES (1, 1)",
            ][..],
        ),
        (
            "new table with a column of a domain made before",
            &[
                "CREATE TABLE {t}_new(d {t}_dd)",
                "INSERT INTO {t}_new VALUES (1)",
            ][..],
        ),
        (
            "new attribute of a composite column's type",
            &[
                "ALTER TYPE {t}_pair ADD ATTRIBUTE b {t}_dd",
                "INSERT INTO {t}(amount, p) VALUES (1, ROW(1, 1))",
            ][..],
        ),
        (
            "type change using",
            &["ALTER TABLE {t} ALTER COLUMN amount TYPE bigint USING amount + {f}()"][..],
        ),
        (
            "like including defaults",
            &[
                "CREATE TABLE {t}_copy (LIKE {t}_src INCLUDING DEFAULTS)",
                "INSERT INTO {t}_copy DEFAULT VALUES",
            ][..],
        ),
    ] {
        for same_string in [true, false] {
            let (t, counter, f) = (unique("bd_t"), unique("bd_counter"), unique("bd_next"));
            setup(&format!(
                "CREATE TABLE {counter}(id int PRIMARY KEY, n bigint NOT NULL);
                 INSERT INTO {counter} VALUES (1, 0);
                 CREATE FUNCTION {f}() RETURNS bigint LANGUAGE plpgsql AS $$
                 DECLARE v bigint;
                 BEGIN UPDATE {counter} SET n = n + 1 WHERE id = 1 RETURNING n INTO v; RETURN v; END $$;
                 CREATE DOMAIN {t}_dd AS int CHECK ({f}() > 0);
                 CREATE TYPE {t}_pair AS (a int);
                 CREATE TABLE {t}(amount int, p {t}_pair); INSERT INTO {t}(amount) VALUES (0);
                 CREATE TABLE {t}_src(no bigint DEFAULT {f}())"
            ))
            .await;
            let _delay = ApplyDelay::set(DELAY_MS);
            let writer = p.connect().await;
            let other = p.connect().await;
            let sqls: Vec<String> = statements
                .iter()
                .map(|s| s.replace("{t}", &t).replace("{f}", &f))
                .collect();
            if same_string {
                exec(&writer, Proto::Simple, &sqls.join("; "), 0).await;
            } else {
                exec(&writer, Proto::Extended, "BEGIN", 0).await;
                for sql in &sqls {
                    exec(&writer, Proto::Extended, sql, 0).await;
                }
                exec(&writer, Proto::Extended, "COMMIT", 0).await;
            }
            let read = format!("SELECT n FROM {counter} WHERE id = 1");
            let expected = read_i64(&truth, Proto::Extended, &read, 0).await;
            assert!(expected > 0, "{name}: the function did not run");
            for (c, proto) in [(&writer, Proto::Extended), (&other, Proto::Simple)] {
                if read_i64(c, proto, &read, 0).await != expected {
                    stale.push(format!("{name} (same string: {same_string})"));
                }
            }
        }
    }
    assert!(
        stale.is_empty(),
        "stale reads of what a new default or check wrote: {stale:?}"
    );
}

/// A write that runs under a trigger pgfresh has not learned yet: created in the same
/// string or transaction, or by another session while the write waits for the trigger's
/// lock or was analysed before it. The commit of the change, and every write analysed
/// while the graph may be out of date, count as writing the whole database (with their
/// positions), so reads of what the trigger wrote are fresh.
#[tokio::test]
async fn writes_beside_a_new_trigger_are_read_fresh() {
    let _g = SERIAL.lock().await;
    const ROUNDS: usize = 4;
    let variants = [
        BesideDdl::SameString,
        BesideDdl::SameTransaction,
        BesideDdl::WaitingOnTheLock,
        BesideDdl::AnalysedBefore,
    ];
    let mut fx = TriggerFixture::create(2 * ROUNDS * variants.len()).await;
    let truth = primary_direct().await;
    let read = format!("SELECT n FROM {} WHERE id = 1", fx.totals);
    let mut expected = read_i64(&truth, Proto::Extended, &read, 0).await;
    let guarded = start_proxy(&config_text(""));
    wait_graph(
        &guarded,
        &Hole {
            name: "beside ddl",
            write: String::new(),
            delta: 0,
            reads: vec![],
            edges: vec![edge("function", &format!("{}()", fx.bump), &fx.totals)],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
    )
    .await;
    let blind = start_proxy(&config_text(CONTROL));
    let _delay = ApplyDelay::set(DELAY_MS);
    let mut report = String::new();
    let (mut stale, mut control) = (0, 0);
    for how in variants {
        let (mut s, mut c) = (0, 0);
        for _ in 0..ROUNDS {
            s += beside_ddl_round(&guarded, &mut fx, how, &mut expected).await;
            c += beside_ddl_round(&blind, &mut fx, how, &mut expected).await;
        }
        report.push_str(&format!(
            "  {how:?}: {s}/{} stale, control {c}/{}\n",
            2 * ROUNDS,
            2 * ROUNDS
        ));
        stale += s;
        control += usize::from(c > 0);
    }
    eprintln!("writes beside a new trigger:\n{report}");
    assert_eq!(stale, 0, "stale reads beside a new trigger:\n{report}");
    assert_eq!(
        control,
        variants.len(),
        "a control without learned dependencies saw no stale read, so the test proves nothing:\n{report}"
    );
}

/// The first column of the one row `sql` returns, as a bigint; None when the statement
/// fails (a standby that has not replayed a CREATE TABLE says the relation does not exist).
async fn try_read_i64(c: &tokio_postgres::Client, proto: Proto, sql: &str) -> Option<i64> {
    match proto {
        Proto::Simple => c
            .simple_query(sql)
            .await
            .ok()?
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
                _ => None,
            }),
        Proto::Extended => c.query_one(sql, &[]).await.ok().map(|r| r.get(0)),
        Proto::Prepared => {
            let st = c.prepare(sql).await.ok()?;
            c.query_one(&st, &[]).await.ok().map(|r| r.get(0))
        }
    }
}

/// Built-ins and casts that look names up in the catalogs (`to_regclass`, `'t'::regclass`,
/// `has_table_privilege`) answer from the standby's catalog, which may not have the table
/// just created through pgfresh yet: they count as catalog reads, served by the primary.
#[tokio::test]
async fn catalog_lookups_after_ddl_are_read_fresh() {
    let _g = SERIAL.lock().await;
    const ROUNDS: usize = 10;
    let p = start_proxy(&config_text(""));
    let writer = p.connect().await;
    let other = p.connect().await;
    let standby = node_direct(1).await;
    let _delay = ApplyDelay::set(DELAY_MS);
    let (mut stale, mut control) = (Vec::new(), 0);
    for i in 0..ROUNDS {
        let t = unique("catalog_lookup");
        let proto = if i % 2 == 0 {
            Proto::Simple
        } else {
            Proto::Extended
        };
        exec(&writer, proto, &format!("CREATE TABLE {t}(id int)"), 0).await;
        let reads = [
            format!("SELECT (to_regclass('{t}') IS NOT NULL)::int::bigint"),
            format!("SELECT has_table_privilege('{t}', 'SELECT')::int::bigint"),
            format!("SELECT pg_relation_size('{t}'::regclass) * 0 + 1"),
        ];
        for (c, via) in [(&writer, "writer"), (&other, "other")] {
            for sql in &reads {
                if try_read_i64(c, proto, sql).await != Some(1) {
                    stale.push(format!("{via} {proto:?}: {sql}"));
                }
            }
        }
        // The test can fail: the standby itself does not know the table yet.
        control += usize::from(try_read_i64(&standby, proto, &reads[0]).await != Some(1));
    }
    assert!(stale.is_empty(), "catalog lookups read stale: {stale:#?}");
    assert!(
        control > 0,
        "the standby knew every new table at once, so the test proves nothing"
    );
}

/// An event trigger (`CREATE EVENT TRIGGER ... ON ddl_command_end`) that logs DDL into a
/// table: every DDL statement writes the log, which its text never names, and so do the
/// statements pgfresh counts as writes that PostgreSQL fires event triggers for (CREATE
/// TABLE AS, SELECT INTO, CREATE MATERIALIZED VIEW, CREATE TEMP TABLE).
#[tokio::test]
async fn writes_of_event_triggers_are_read_fresh() {
    let _g = SERIAL.lock().await;
    const ROUNDS: usize = 10;
    let (log, f, evt) = (unique("ddl_log"), unique("log_ddl"), unique("audit_ddl"));
    setup(&format!(
        "CREATE TABLE {log}(id serial PRIMARY KEY, tag text NOT NULL);"
    ))
    .await;
    // Event triggers need a superuser; the function runs as whoever runs the DDL.
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "CREATE FUNCTION {f}() RETURNS event_trigger LANGUAGE plpgsql AS $$
                 BEGIN INSERT INTO public.{log}(tag) VALUES (tg_tag); END $$;
                 CREATE EVENT TRIGGER {evt} ON ddl_command_end EXECUTE FUNCTION {f}();"
            ),
        )
        .expect("create the event trigger");
    let _drop = DropEventTrigger(evt.clone());
    let truth = primary_direct().await;
    wait_replicated_on(cluster(), &truth).await;
    let learning = start_proxy(&config_text(""));
    wait_graph(
        &learning,
        &Hole {
            name: "event trigger",
            write: String::new(),
            delta: 0,
            reads: vec![],
            edges: vec![
                edge("event_trigger", "ddl", &format!("{f}()")),
                edge("function", &format!("{f}()"), &log),
            ],
            unanalysable: vec![],
            warmup: None,
            out_of_band: None,
        },
    )
    .await;
    let blind = start_proxy(&config_text(CONTROL));
    let read = format!("SELECT count(*) FROM {log}");
    let _delay = ApplyDelay::set(DELAY_MS);
    let mut misses = [0usize; 2];
    for (i, p) in [&learning, &blind].into_iter().enumerate() {
        let writer = p.connect().await;
        let other = p.connect().await;
        for round in 0..ROUNDS {
            let proto = if round % 2 == 0 {
                Proto::Simple
            } else {
                Proto::Extended
            };
            // DDL, and statements pgfresh counts as writes that fire event triggers too
            // (a temporary table pins the writer to the primary: the other connection
            // still reads from a replica).
            // Each round starts with the log replayed everywhere (cold), so no round's
            // read rides on the mark of the round before.
            wait_replicated_on(cluster(), &truth).await;
            let name = format!("{log}_{i}_{round}");
            let ddl = match round % 5 {
                0 => format!("CREATE TABLE {name}(id int)"),
                1 => format!("CREATE TABLE {name} AS SELECT 1 AS id"),
                2 => format!("SELECT 1 AS id INTO {name}"),
                3 => format!("CREATE MATERIALIZED VIEW {name} AS SELECT 1 AS id"),
                _ => format!("CREATE TEMP TABLE {name}(id int)"),
            };
            exec(&writer, proto, &ddl, 0).await;
            let expected = read_i64(&truth, Proto::Extended, &read, 0).await;
            for c in [&writer, &other] {
                misses[i] += usize::from(read_i64(c, proto, &read, 0).await != expected);
            }
        }
    }
    assert_eq!(misses[0], 0, "stale reads of what an event trigger wrote");
    assert!(
        misses[1] > 0,
        "the control without learned dependencies saw no stale read, so the test proves nothing"
    );
}

/// A database pgfresh has not loaded the dependencies of yet: writes analysed before the
/// first load finished count as writing the whole database, so what their triggers wrote is
/// read fresh. (A first login waits for the load, so here learning is switched on live
/// after the sessions logged in: the write's own statement then starts the load and is
/// analysed before it ends.)
#[tokio::test]
async fn writes_before_the_first_dependency_load_are_read_fresh() {
    let _g = SERIAL.lock().await;
    const ROUNDS: usize = 3;
    let (orders, totals, f) = (unique("fl_orders"), unique("fl_totals"), unique("fl_bump"));
    setup(&format!(
        "CREATE TABLE {orders}(id serial PRIMARY KEY, amount int NOT NULL);
         CREATE TABLE {totals}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {totals} VALUES (1, 0);
         CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN UPDATE {totals} SET n = n + 1 WHERE id = 1; RETURN NEW; END $$;
         CREATE TRIGGER {f}_trg AFTER INSERT ON {orders} FOR EACH ROW EXECUTE FUNCTION {f}();"
    ))
    .await;
    let truth = primary_direct().await;
    let read = format!("SELECT n FROM {totals} WHERE id = 1");
    let _delay = ApplyDelay::set(DELAY_MS);
    let mut misses = [0usize; 2];
    for (i, extra) in ["", CONTROL].into_iter().enumerate() {
        for round in 0..ROUNDS {
            // A new proxy that learns nothing while the sessions log in.
            let p = start_proxy(&config_text(CONTROL));
            let writer = p.connect().await;
            let other = p.connect().await;
            if extra.is_empty() {
                std::fs::write(&p.config_path, config_text(extra)).unwrap();
                pgfresh_proxy::reload_config(&p.shared, "test").expect("learning switched on");
                assert!(p.shared.config.snapshot().routing.learn_dependencies);
            }
            let proto = if round % 2 == 0 {
                Proto::Simple
            } else {
                Proto::Extended
            };
            exec(
                &writer,
                proto,
                &format!("INSERT INTO {orders}(amount) VALUES ($1::int)"),
                1,
            )
            .await;
            let expected = read_i64(&truth, Proto::Extended, &read, 0).await;
            for c in [&writer, &other] {
                misses[i] += usize::from(read_i64(c, proto, &read, 0).await != expected);
            }
        }
    }
    assert_eq!(misses[0], 0, "stale reads before the first dependency load");
    assert!(
        misses[1] > 0,
        "the control without learned dependencies saw no stale read, so the test proves nothing"
    );
}

/// `PREFIX_orders`, `PREFIX_totals` (one row, n = 0) and a trigger function `PREFIX_bump`
/// that counts into it, with no trigger yet: for tests that create the trigger themselves.
async fn orders_and_totals(prefix: &str) -> (String, String, String) {
    let (orders, totals, f) = (
        unique(&format!("{prefix}_orders")),
        unique(&format!("{prefix}_totals")),
        unique(&format!("{prefix}_bump")),
    );
    setup(&format!(
        "CREATE TABLE {orders}(id serial PRIMARY KEY, amount int NOT NULL);
         CREATE TABLE {totals}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {totals} VALUES (1, 0);
         CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN UPDATE {totals} SET n = n + 1 WHERE id = 1; RETURN NEW; END $$;"
    ))
    .await;
    (orders, totals, f)
}

/// Replay delay of both standbys in the rounds below: long enough that a read right after
/// the write finds no replica that has it, on a loaded machine too.
const OUTSIDE_DELAY_MS: u64 = 2_000;

/// A trigger created straight on the primary (a migration run past the pooler): writes
/// through pgfresh go on being expanded with the graph loaded before it. With both standbys
/// replaying late, each round creates the trigger outside pgfresh, writes through pgfresh, lets the
/// schema check run (`check_now`, what `dependency_check_ms` runs periodically), then reads
/// what the trigger wrote through two connections. The check marks the whole database with
/// the primary's position: the reads must be fresh. The control runs the same rounds
/// without the check: its reads must be stale (the graph in force knows no trigger).
#[tokio::test]
async fn writes_after_a_schema_change_made_outside_pgfresh_are_read_fresh_once_checked() {
    let _g = SERIAL.lock().await;
    const ROUNDS: usize = 4;
    let (orders, totals, f) = orders_and_totals("ob").await;
    let truth = primary_direct().await;
    let read = format!("SELECT n FROM {totals} WHERE id = 1");
    // Delayed standbys stay in the read pool for the whole round.
    let extra = "delay_threshold_by_time = 600000";
    let mut misses = [0usize; 2];
    for (i, checked) in [true, false].into_iter().enumerate() {
        for round in 0..ROUNDS {
            let p = start_proxy(&config_text(extra));
            p.shared
                .deps
                .load_now(&p.shared, "app")
                .await
                .expect("the first dependency load");
            let trigger = format!("{f}_trg{round}");
            let proto = if round % 2 == 0 {
                Proto::Simple
            } else {
                Proto::Extended
            };
            // (A paused standby leaves the read pool; a delayed one stays.)
            let delay = ApplyDelay::set(OUTSIDE_DELAY_MS);
            truth
                .batch_execute(&format!(
                    "CREATE TRIGGER {trigger} AFTER INSERT ON {orders} \
                     FOR EACH ROW EXECUTE FUNCTION {f}()"
                ))
                .await
                .expect("the trigger, made outside pgfresh");
            let writer = p.connect().await;
            exec(
                &writer,
                proto,
                &format!("INSERT INTO {orders}(amount) VALUES ($1::int)"),
                1,
            )
            .await;
            if checked {
                let changed = p
                    .shared
                    .deps
                    .check_now(&p.shared, "app")
                    .await
                    .expect("the schema check");
                assert!(changed, "the check did not see the new trigger");
            }
            let expected = read_i64(&truth, Proto::Extended, &read, 0).await;
            let other = p.connect().await;
            for c in [&writer, &other] {
                misses[i] += usize::from(read_i64(c, proto, &read, 0).await != expected);
            }
            drop(delay);
            truth
                .batch_execute(&format!("DROP TRIGGER {trigger} ON {orders}"))
                .await
                .expect("drop the trigger");
        }
    }
    eprintln!(
        "reads after a trigger made outside pgfresh: {}/{} stale once checked, control {}/{}",
        misses[0],
        2 * ROUNDS,
        misses[1],
        2 * ROUNDS
    );
    assert_eq!(misses[0], 0, "stale reads after the schema check");
    assert!(
        misses[1] > 0,
        "the control without the check saw no stale read, so the test proves nothing"
    );
}

/// The periodic check (`dependency_check_ms`) finds a trigger created straight on the
/// primary, and the reload it asks for learns it, long before the 30 s refresh would.
/// A plain table made outside pgfresh changes nothing a graph is built from and is not
/// counted as a change.
#[tokio::test]
async fn the_periodic_schema_check_finds_changes_made_outside_pgfresh() {
    let _g = SERIAL.lock().await;
    let (orders, _, f) = orders_and_totals("pc").await;
    let p = start_proxy(&config_text("dependency_check_ms = 50"));
    p.shared
        .deps
        .load_now(&p.shared, "app")
        .await
        .expect("the first dependency load");
    let changed = "pgfresh_schema_checks_total{result=\"changed\"}";
    let unchanged = "pgfresh_schema_checks_total{result=\"unchanged\"}";
    let c = p.connect().await;
    let truth = primary_direct().await;
    // Plain DDL: the checks go on and see no change.
    let before = metric_value(changed);
    truth
        .batch_execute(&format!("CREATE TABLE {}(id int)", unique("pc_plain")))
        .await
        .expect("a plain table");
    let seen = metric_value(unchanged);
    poll(
        "two checks after the plain table",
        Duration::from_secs(60),
        || async {
            // The database must stay in use for the checks to run.
            c.simple_query("SELECT 1").await.expect("a statement");
            (metric_value(unchanged) >= seen + 2.0).then_some(())
        },
    )
    .await;
    assert_eq!(
        metric_value(changed),
        before,
        "a plain table counted as a change"
    );
    // A trigger: found, and learned.
    truth
        .batch_execute(&format!(
            "CREATE TRIGGER {f}_trg AFTER INSERT ON {orders} FOR EACH ROW EXECUTE FUNCTION {f}()"
        ))
        .await
        .expect("the trigger, made outside pgfresh");
    let hole = Hole::edges(
        "outside ddl",
        vec![edge("trigger", &orders, &format!("{f}()"))],
    );
    let found = |what: &'static str, after: f64| {
        let c = &c;
        poll(what, Duration::from_secs(60), move || async move {
            c.simple_query("SELECT 1").await.expect("a statement");
            let now = metric_value(changed);
            (now > after).then_some(now)
        })
    };
    let after_trigger = found("the check to find the trigger", before).await;
    wait_graph(&p, &hole).await;
    // A table with a column of a domain whose check calls a function: the column alone
    // (the function and the domain were there before) is a change too, and learned.
    let (check, dom, checked) = (unique("pc_check"), unique("pc_dom"), unique("pc_checked"));
    truth
        .batch_execute(&format!(
            "CREATE FUNCTION {check}(v int) RETURNS boolean LANGUAGE sql AS $$ SELECT v > 0 $$;
             CREATE DOMAIN {dom} AS int CHECK ({check}(VALUE))"
        ))
        .await
        .expect("the domain, made outside pgfresh");
    let after_domain = found("the check to find the domain", after_trigger).await;
    truth
        .batch_execute(&format!("CREATE TABLE {checked}(amount {dom}[])"))
        .await
        .expect("the table, made outside pgfresh");
    found("the check to find the domain column", after_domain).await;
    let hole = Hole::edges(
        "outside ddl",
        vec![edge("expression", &checked, &format!("{check}()"))],
    );
    wait_graph(&p, &hole).await;
}

/// With `dependency_notify_channel`, an event trigger that notifies on every DDL makes the
/// schema check run at once: the periodic check here is ten minutes away, and a trigger
/// created straight on the primary is still found and learned.
#[tokio::test]
async fn a_ddl_notification_runs_the_schema_check_at_once() {
    let _g = SERIAL.lock().await;
    let (orders, _, f) = orders_and_totals("nc").await;
    let (notify, evt, channel) = (unique("nc_notify"), unique("nc_evt"), unique("nc_ddl"));
    // What the README tells operators to install (event triggers need a superuser).
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "CREATE FUNCTION {notify}() RETURNS event_trigger LANGUAGE plpgsql AS $$
                 BEGIN PERFORM pg_notify('{channel}', current_database()); END $$;
                 CREATE EVENT TRIGGER {evt} ON ddl_command_end EXECUTE FUNCTION {notify}();"
            ),
        )
        .expect("create the notifying event trigger");
    let _drop = DropEventTrigger(evt.clone());
    let p = start_proxy(&config_text(&format!(
        "dependency_check_ms = 600000\ndependency_notify_channel = \"{channel}\""
    )));
    p.shared
        .deps
        .load_now(&p.shared, "app")
        .await
        .expect("the first dependency load");
    let truth = primary_direct().await;
    // (As a superuser: pg_stat_activity hides other roles' queries.)
    eventually(
        "the schema check to listen",
        Duration::from_secs(60),
        || {
            cluster()
                .psql(
                    0,
                    "app",
                    "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'pgfresh schema check' AND query LIKE 'LISTEN%'",
                )
                .is_ok_and(|n| n != "0")
        },
    )
    .await;
    let changed = "pgfresh_schema_checks_total{result=\"changed\"}";
    let before = metric_value(changed);
    truth
        .batch_execute(&format!(
            "CREATE TRIGGER {f}_trg AFTER INSERT ON {orders} FOR EACH ROW EXECUTE FUNCTION {f}()"
        ))
        .await
        .expect("the trigger, made outside pgfresh");
    poll(
        "the notified check to find the trigger",
        Duration::from_secs(60),
        || async { (metric_value(changed) > before).then_some(()) },
    )
    .await;
    let hole = Hole::edges(
        "notified ddl",
        vec![edge("trigger", &orders, &format!("{f}()"))],
    );
    wait_graph(&p, &hole).await;
}

/// A commit the server has not written to its WAL yet (`synchronous_commit = off`, in
/// the session or the server's config) is read fresh. The position pgfresh learns after a
/// commit must cover the commit record: the WAL insert position does, while the write
/// position (`pg_current_wal_lsn()`) can stay behind it until the WAL writer runs, and a
/// standby that has replayed everything written looked caught up for a commit it did not
/// have. Standbys replay at once here: they are caught up to what was written, which is
/// where the hole was.
#[tokio::test]
async fn asynchronous_commits_are_read_fresh() {
    let _serial = SERIAL.lock().await;
    let t = unique("async_commit");
    setup(&format!(
        "CREATE TABLE {t}(id int PRIMARY KEY, v int); INSERT INTO {t} VALUES (1, 0)"
    ))
    .await;
    let p = start_proxy(&config_text(""));
    let read = format!("SELECT inet_server_port(), v FROM {t} WHERE id = 1");
    wait_replica_read(&p, &read).await;
    let writer = p.connect().await;
    writer
        .batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    let other = p.connect().await;
    let mut stale = Vec::new();
    for i in 1..=(2 * ITERATIONS as i32) {
        writer
            .execute(&format!("UPDATE {t} SET v = $1 WHERE id = 1"), &[&i])
            .await
            .unwrap();
        for (who, c) in [("same session", &writer), ("another session", &other)] {
            let row = c.query_one(&read, &[]).await.unwrap();
            let (port, v): (i32, i32) = (row.get(0), row.get(1));
            if v != i {
                stale.push(format!("{who}: {v} for {i} on port {port}"));
            }
        }
    }
    assert!(stale.is_empty(), "{} stale reads: {stale:?}", stale.len());
    // The position is one the standbys reach: reads of the table go back to them.
    wait_replica_read(&p, &read).await;
}

/// A FunctionCall message (`F`) runs a function by its oid, as libpq's `PQfn` does for
/// its large-object calls (`lo_write`, `lo_creat`, `lo_truncate` ...; psycopg2's
/// `lobject`). pgfresh cannot see what it writes, so it counts as a write of the whole
/// database. Returns the stale reads of `rounds` rounds through `p`: each calls a user
/// function bumping `counts` and `lo_put` on large object `lo` over a raw connection, then
/// reads both through the raw connection's neighbours.
async fn function_call_misses(
    p: &ProxyHandle,
    counts: &str,
    f: &str,
    lo: i64,
    rounds: usize,
) -> usize {
    use tokio::io::AsyncWriteExt;
    let truth = primary_direct().await;
    let oid = |sig: &str| {
        let truth = &truth;
        let sql = format!("SELECT '{sig}'::regprocedure::oid::int8");
        async move {
            let oid: i64 = truth.query_one(&sql, &[]).await.expect("an oid").get(0);
            u32::try_from(oid).expect("an oid")
        }
    };
    let (bump, lo_put) = (
        oid(&format!("{f}()")).await,
        oid("lo_put(oid, bigint, bytea)").await,
    );
    let mut s = raw::connect(p.addr).await;
    let writer = p.connect().await;
    let other = p.connect().await;
    let count = format!("SELECT n FROM {counts} WHERE id = 1");
    let object = format!("SELECT ('x' || encode(lo_get({lo}), 'hex'))::bit(32)::int::int8");
    let mut misses = 0;
    for i in 0..rounds {
        let value = format!("\\x{:08x}", i + 1);
        // Every other round in an explicit transaction, marked at its COMMIT.
        let in_tx = i % 2 == 1;
        if in_tx {
            s.write_all(&raw::msg(b'Q', &raw::cstr("BEGIN")))
                .await
                .expect("BEGIN");
            raw::read_until(&mut s, b'Z').await;
        }
        for call in [
            function_call(bump, &[]),
            function_call(lo_put, &[&lo.to_string(), "0", &value]),
        ] {
            s.write_all(&call).await.expect("write to pgfresh");
            let replies = raw::read_until(&mut s, b'Z').await;
            assert!(
                raw::tags(&replies).contains(&b'V'),
                "no FunctionCallResponse: {replies:?}"
            );
        }
        if in_tx {
            s.write_all(&raw::msg(b'Q', &raw::cstr("COMMIT")))
                .await
                .expect("COMMIT");
            raw::read_until(&mut s, b'Z').await;
        }
        for read in [&count, &object] {
            let want = read_i64(&truth, Proto::Extended, read, 0).await;
            for (c, proto) in [(&writer, Proto::Simple), (&other, Proto::Extended)] {
                misses += usize::from(read_i64(c, proto, read, 0).await != want);
            }
        }
    }
    misses
}

/// A FunctionCall message of the function `oid`, text arguments, a text result.
fn function_call(oid: u32, args: &[&str]) -> Vec<u8> {
    let mut body = oid.to_be_bytes().to_vec();
    body.extend_from_slice(&1u16.to_be_bytes());
    body.extend_from_slice(&0u16.to_be_bytes());
    body.extend_from_slice(
        &u16::try_from(args.len())
            .expect("few arguments")
            .to_be_bytes(),
    );
    for a in args {
        body.extend_from_slice(
            &i32::try_from(a.len())
                .expect("a short argument")
                .to_be_bytes(),
        );
        body.extend_from_slice(a.as_bytes());
    }
    body.extend_from_slice(&0u16.to_be_bytes());
    raw::msg(b'F', &body)
}

#[tokio::test]
async fn writes_of_a_function_call_message_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let (counts, f) = (unique("fastpath_counts"), unique("fastpath_bump"));
    setup(&format!(
        "CREATE TABLE {counts}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {counts} VALUES (1, 0);
         CREATE FUNCTION {f}() RETURNS bigint LANGUAGE plpgsql AS $$
         DECLARE v bigint;
         BEGIN UPDATE {counts} SET n = n + 1 WHERE id = 1 RETURNING n INTO v; RETURN v; END $$;"
    ))
    .await;
    let lo: i64 = primary_direct()
        .await
        .query_one("SELECT lo_from_bytea(0, int4send(0))::int8", &[])
        .await
        .expect("a large object")
        .get(0);
    setup("SELECT 1").await;
    let guarded = start_proxy(&config_text(""));
    let blind = start_proxy(&config_text("enable_recent_access_routing = false"));
    let _delay = ApplyDelay::set(DELAY_MS);
    let misses = function_call_misses(&guarded, &counts, &f, lo, 10).await;
    let control = function_call_misses(&blind, &counts, &f, lo, 10).await;
    assert_eq!(misses, 0, "stale reads after FunctionCall messages");
    assert!(
        control > 0,
        "the control without recency routing saw no stale read, so the test proves nothing"
    );
}

/// A prepared statement the connection already holds is sent as it came (the plain
/// reads' lane), and what it writes behind its text is still marked: a read of a view
/// whose function writes `audit`, run again once `audit` is cold, then `audit` read at
/// once from another session. (`lsn_routing = false`: a standby serves the read only when
/// `audit` is cold; the loops above cannot show this, since the statement's first run,
/// which prepares it on the primary, marks `audit` and keeps it hot for the whole loop.)
#[tokio::test]
async fn a_held_prepared_statement_s_hidden_write_is_read_fresh() {
    let _g = SERIAL.lock().await;
    let p = unique("held_stmt");
    let (audit, bump, view) = (
        format!("{p}_audit"),
        format!("{p}_bump"),
        format!("{p}_view"),
    );
    setup(&format!(
        "CREATE TABLE {audit}(id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {audit} VALUES (1, 0);
         CREATE FUNCTION {bump}() RETURNS int LANGUAGE plpgsql AS $$
         BEGIN UPDATE {audit} SET n = n + 1 WHERE id = 1; RETURN 1; END $$;
         CREATE VIEW {view} AS SELECT {bump}() AS x;"
    ))
    .await;
    let proxy = start_proxy(&config_text("lsn_routing = false"));
    wait_graph(
        &proxy,
        &Hole::learned(
            "a held prepared statement",
            String::new(),
            1,
            vec![],
            vec![
                edge("view", &view, &format!("{bump}()")),
                edge("function", &format!("{bump}()"), &audit),
            ],
        ),
    )
    .await;
    let writer = proxy.connect().await;
    let reader = proxy.connect().await;
    let write = writer
        .prepare(&format!("SELECT x::int8 FROM {view}"))
        .await
        .unwrap();
    let read = reader
        .prepare(&format!(
            "SELECT inet_server_port(), n FROM {audit} WHERE id = 1"
        ))
        .await
        .unwrap();
    let _delay = ApplyDelay::set(DELAY_MS);
    let mut stale = Vec::new();
    for round in 1..=3i64 {
        // `audit` cold again: the read reaches a standby.
        poll("audit cold", Duration::from_secs(60), || async {
            let row = reader.query_one(&read, &[]).await.unwrap();
            (row.get::<_, i32>(0) as u16 != node_port(0)).then_some(())
        })
        .await;
        // The first round prepares the statement on the primary; later rounds find it.
        writer.query_one(&write, &[]).await.unwrap();
        let row = reader.query_one(&read, &[]).await.unwrap();
        let n: i64 = row.get(1);
        if n != round {
            stale.push((round, n, row.get::<_, i32>(0)));
        }
    }
    assert!(stale.is_empty(), "stale reads (round, n, port): {stale:?}");
}

/// How long the writer is given to receive an acknowledgement the relay's stop should
/// keep from it. Only a broken build's failure depends on it: with the acknowledgement
/// held, nothing arrives and the round goes on once it has passed.
const ACK_GRACE: Duration = Duration::from_secs(1);

/// A commit's acknowledgement is the client's to act on the moment it arrives: a client
/// that pipelines (libpq's pipeline mode) has the CommandComplete of its commit before the
/// ReadyForQuery. pgfresh marks the relations a commit wrote once the position probe it
/// pipelines after the commit answers, so it must keep the acknowledgement back until
/// then (DESIGN §1 rule 6). Here a relay in front of the primary keeps the probe's answer
/// back (`gate::Gate`: it stops the server connection right after the commit's
/// ReadyForQuery), the standbys apply commits a minute late, and as soon as the writer
/// has its CommandComplete another session reads the table: it must see the write.
/// Three commits, each to a table of its own that the standbys serve until then: an
/// UPDATE sent as the extended protocol's batch, one sent as a Query, and the COMMIT of
/// a transaction. (With the acknowledgement passed on at once, the writer has it while
/// the table is unmarked, and the read goes to a standby that has not applied the
/// write.)
#[tokio::test]
async fn a_commit_is_acknowledged_only_once_what_it_wrote_is_marked() {
    acknowledged_once_marked("session").await;
}

/// The same in transaction mode, where the connection goes back to the pool only once the
/// probe has answered.
#[tokio::test]
async fn a_commit_is_acknowledged_only_once_marked_in_transaction_mode() {
    acknowledged_once_marked("transaction").await;
}

async fn acknowledged_once_marked(pool_mode: &str) {
    use pgfresh_tests::gate::Gate;
    use tokio::io::AsyncWriteExt;
    let _serial = SERIAL.lock().await;
    let t = unique("ack_after_mark");
    let rounds = ["extended", "simple", "transaction"];
    for how in rounds {
        setup(&format!(
            "CREATE TABLE {t}_{how}(id int PRIMARY KEY, v int); INSERT INTO {t}_{how} VALUES (1, 0)"
        ))
        .await;
    }
    let gate = Gate::in_front_of(node_port(0));
    // The standbys stay in the read pool however far behind they apply.
    let text = config_text("delay_threshold_by_time = 600000").replacen(
        &format!("port = {}\n", node_port(0)),
        &format!("port = {}\n", gate.port()),
        1,
    ) + &format!("\n[pool]\npool_mode = \"{pool_mode}\"\n");
    let p = start_proxy(&text);
    let read = |how: &str| format!("SELECT inet_server_port(), v FROM {t}_{how} WHERE id = 1");
    for how in rounds {
        wait_replica_read(&p, &read(how)).await;
    }
    let reader = p.connect().await;
    let (mut from_writer, mut writer) = raw::connect(p.addr).await.into_split();
    // The writer's messages, each as soon as it arrives.
    let (tx, mut replies) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut header = [0u8; 5];
        while from_writer.read_exact(&mut header).await.is_ok() {
            let len = u32::from_be_bytes(header[1..5].try_into().unwrap()) as usize;
            let mut body = vec![0u8; len - 4];
            if from_writer.read_exact(&mut body).await.is_err()
                || tx.send((header[0], body)).is_err()
            {
                return;
            }
        }
    });
    // Long enough that no standby applies a commit of the test before it ends.
    let _delay = ApplyDelay::set(60_000);
    let mut stale = Vec::new();
    for how in rounds {
        let update = format!("UPDATE {t}_{how} SET v = 1 WHERE id = 1");
        let (word, commit) = match how {
            "extended" => ("UPDATE", raw::exec_params(&update, &[])),
            "simple" => ("UPDATE", raw::msg(b'Q', &raw::cstr(&update))),
            _ => {
                for sql in ["BEGIN", &update] {
                    writer
                        .write_all(&raw::msg(b'Q', &raw::cstr(sql)))
                        .await
                        .unwrap();
                    next_reply(&mut replies, b'Z').await;
                }
                ("COMMIT", raw::msg(b'Q', &raw::cstr("COMMIT")))
            }
        };
        gate.close_after(word);
        writer.write_all(&commit).await.unwrap();
        tokio::time::timeout(Duration::from_secs(60), gate.stopped())
            .await
            .expect("the relay stopped after the commit's ReadyForQuery");
        // The probe's answer is held in the relay: is the commit acknowledged anyway?
        let early = tokio::time::timeout(ACK_GRACE, next_reply(&mut replies, b'C'))
            .await
            .is_ok();
        let during_stop = if early {
            Some(reader.query_one(&read(how), &[]).await.unwrap())
        } else {
            None
        };
        gate.open();
        if !early {
            next_reply(&mut replies, b'C').await;
        }
        let after = reader.query_one(&read(how), &[]).await.unwrap();
        next_reply(&mut replies, b'Z').await;
        for (when, row) in [
            ("while the probe waited", during_stop),
            ("after", Some(after)),
        ] {
            let Some(row) = row else { continue };
            let (port, v): (i32, i32) = (row.get(0), row.get(1));
            if v != 1 {
                stale.push(format!("{how} {when}: {v} on port {port}"));
            }
        }
    }
    assert!(stale.is_empty(), "stale reads: {stale:?}");
}

/// Waits (60 s at most) for the writer's next message with `tag`, passing over others.
async fn next_reply(replies: &mut tokio::sync::mpsc::UnboundedReceiver<(u8, Vec<u8>)>, tag: u8) {
    loop {
        let (got, body) = tokio::time::timeout(Duration::from_secs(60), replies.recv())
            .await
            .expect("the writer's reply")
            .expect("the writer's connection");
        assert_ne!(got, b'E', "{}", String::from_utf8_lossy(&body));
        if got == tag {
            return;
        }
    }
}
