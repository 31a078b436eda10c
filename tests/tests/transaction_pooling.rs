//! Transaction pooling (`pool_mode = "transaction"`): many clients on a few server
//! connections, each client's settings and prepared statements intact on whatever
//! connection its next transaction lands, and routing guarantees unchanged.

use std::sync::OnceLock;
use std::time::Duration;

use pgfresh_tests::*;
use tokio_postgres::SimpleQueryMessage;

const POOL_SIZE: usize = 10;

/// The transaction-mode proxy of this binary: `POOL_SIZE` connections per node.
fn tx_proxy() -> &'static ProxyHandle {
    static P: OnceLock<ProxyHandle> = OnceLock::new();
    P.get_or_init(|| start_proxy(&tx_config(POOL_SIZE, "")))
}

fn tx_config(pool_size: usize, pool_extra: &str) -> String {
    tx_config_routing(pool_size, pool_extra, "")
}

fn tx_config_routing(pool_size: usize, pool_extra: &str, routing: &str) -> String {
    format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = {pool_size}\n{pool_extra}\n",
        config_text(routing)
    )
}

async fn first_value(c: &tokio_postgres::Client, sql: &str) -> String {
    c.simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_string()),
            _ => None,
        })
        .expect("a row")
}

/// A direct superuser connection to node `i`.
async fn direct(i: usize) -> tokio_postgres::Client {
    let (su, pw) = cluster().superuser();
    direct_to(i, su, pw, "postgres").await
}

/// Server connections of user `app` to database `db`, as the node sees them (pgfresh's
/// catalog reader connects as the monitor user).
async fn server_connections(node: &tokio_postgres::Client, db: &str) -> i64 {
    node.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND usename = 'app' AND backend_type = 'client backend'",
        &[&db],
    )
    .await
    .expect("count connections")
    .get(0)
}

/// A database of the test's own, owned by `app`, once every standby has it.
async fn own_database(name: &str) {
    let c = cluster();
    c.psql(0, "postgres", &format!("DROP DATABASE IF EXISTS {name}"))
        .unwrap();
    c.psql(0, "postgres", &format!("CREATE DATABASE {name} OWNER app"))
        .unwrap();
    for i in 1..3 {
        let node = &direct(i).await;
        poll(
            "the standbys have the database",
            Duration::from_secs(30),
            || async move {
                let n: i64 = node
                    .query_one(
                        "SELECT count(*) FROM pg_database WHERE datname = $1",
                        &[&name],
                    )
                    .await
                    .unwrap()
                    .get(0);
                (n == 1).then_some(())
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_clients_share_ten_connections_per_node() {
    own_database("tpmany").await;
    let p = tx_proxy();
    let conninfo = p.conninfo("app", APP_PASSWORD, "tpmany");
    let connect = move || {
        let conninfo = conninfo.clone();
        async move {
            let (c, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
                .await
                .expect("connect through pgfresh");
            tokio::spawn(conn);
            c
        }
    };
    let setup = connect().await;
    setup
        .batch_execute("CREATE TABLE many (client int, n int, PRIMARY KEY (client, n))")
        .await
        .unwrap();
    drop(setup);
    // The nodes' own count of connections to the database, sampled during the run.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut samplers = Vec::new();
    for i in 0..3 {
        let done = done.clone();
        samplers.push(tokio::spawn(async move {
            let node = direct(i).await;
            let mut peak = 0;
            // A sample every 20 ms while the clients run.
            let mut every = tokio::time::interval(Duration::from_millis(20));
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                every.tick().await;
                peak = peak.max(server_connections(&node, "tpmany").await);
            }
            peak
        }));
    }
    let mut tasks = Vec::new();
    for client in 0..500i32 {
        let connect = connect.clone();
        tasks.push(tokio::spawn(async move {
            let c = connect().await;
            // tokio-postgres names its statements s0, s1, … on every connection: the
            // names of all 500 clients collide on the shared server connections, and
            // each client's s2 has a text of its own.
            let insert = c.prepare("INSERT INTO many VALUES ($1, $2)").await.unwrap();
            let count = c
                .prepare("SELECT count(*) FROM many WHERE client = $1")
                .await
                .unwrap();
            let own = c
                .prepare(&format!("SELECT $1::int + {client}"))
                .await
                .unwrap();
            for n in 0..4i32 {
                c.execute(&insert, &[&client, &n]).await.unwrap();
                let seen: i64 = c.query_one(&count, &[&client]).await.unwrap().get(0);
                // Read-after-write through the proxy: never less than written.
                assert_eq!(seen, i64::from(n) + 1, "client {client} after write {n}");
                let sum: i32 = c.query_one(&own, &[&n]).await.unwrap().get(0);
                assert_eq!(
                    sum,
                    n + client,
                    "client {client} ran another client's statement"
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for (i, s) in samplers.into_iter().enumerate() {
        let peak = s.await.unwrap();
        assert!(
            peak <= POOL_SIZE as i64,
            "node {i} had {peak} connections to the test database (pool_size {POOL_SIZE})"
        );
    }
    let check = connect().await;
    assert_eq!(
        first_value(&check, "SELECT count(*) FROM many").await,
        "2000"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settings_never_leak_between_clients_sharing_connections() {
    let c = cluster();
    c.psql(
        0,
        "postgres",
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tp_reader') \
         THEN CREATE ROLE tp_reader NOLOGIN; END IF; END $$; GRANT tp_reader TO app;",
    )
    .unwrap();
    let p = start_proxy(&tx_config(2, ""));
    let mut tasks = Vec::new();
    for client in 0..40 {
        let conninfo = p.conninfo("app", APP_PASSWORD, "app");
        tasks.push(tokio::spawn(async move {
            let (c, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let name = format!("client_{client}");
            let role = client % 2 == 0;
            c.batch_execute(&format!("SET application_name = '{name}'"))
                .await
                .unwrap();
            if role {
                c.batch_execute("SET ROLE tp_reader").await.unwrap();
            }
            for _ in 0..20 {
                let (app, user) = {
                    let rows = c
                        .simple_query("SELECT current_setting('application_name'), current_user")
                        .await
                        .unwrap();
                    let r = rows
                        .iter()
                        .find_map(|m| match m {
                            SimpleQueryMessage::Row(r) => Some(r),
                            _ => None,
                        })
                        .unwrap();
                    (r.get(0).unwrap().to_string(), r.get(1).unwrap().to_string())
                };
                assert_eq!(app, name);
                assert_eq!(user, if role { "tp_reader" } else { "app" }, "{name}");
                // A transaction that sets and rolls back leaves nothing behind.
                c.batch_execute("BEGIN; SET application_name = 'rolled_back'; ROLLBACK")
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn a_set_in_a_rolled_back_transaction_is_not_replayed() {
    let p = start_proxy(&tx_config(1, ""));
    let a = p.connect().await;
    let b = p.connect().await;
    a.batch_execute("BEGIN; SET work_mem = '7MB'; ROLLBACK; SET statement_timeout = '4s'")
        .await
        .unwrap();
    for _ in 0..10 {
        // One connection per node: both clients take turns on it.
        assert_eq!(first_value(&a, "SHOW work_mem").await, "4MB");
        assert_eq!(first_value(&a, "SHOW statement_timeout").await, "4s");
        assert_eq!(first_value(&b, "SHOW statement_timeout").await, "0");
        assert_eq!(
            first_value(&a, "/* pgfresh:primary */ SHOW statement_timeout").await,
            "4s"
        );
    }
}

/// Wait until the primary runs a query containing `text`.
async fn running_on_primary(text: &str) {
    let node = &direct(0).await;
    let pattern = &format!("%{text}%");
    poll(text, Duration::from_secs(30), || async move {
        let n: i64 = node
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE $1 AND pid <> pg_backend_pid()",
                &[pattern],
            )
            .await
            .unwrap()
            .get(0);
        (n > 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_cancel_reaches_the_query_on_a_connection_the_client_had_before() {
    // One connection on the primary: the client's second unit runs on the connection its
    // first gave back, and the cancel slot, cleared at that check-in, must name it again.
    let p = start_proxy(&tx_config(1, ""));
    let c = p.connect().await;
    c.batch_execute("/* pgfresh:primary */ SELECT 1")
        .await
        .unwrap();
    let cancel = c.cancel_token();
    let sleep = tokio::spawn(async move {
        c.simple_query("/* pgfresh:primary */ SELECT pg_sleep(30.5)")
            .await
            .map(|_| ())
    });
    running_on_primary("pg_sleep(30.5)").await;
    cancel.cancel_query(tokio_postgres::NoTls).await.unwrap();
    let err = sleep.await.unwrap().expect_err("cancelled");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{err}"
    );
}

#[tokio::test]
async fn a_cancel_after_check_in_reaches_no_other_client() {
    let p = start_proxy(&tx_config(1, ""));
    let a = p.connect().await;
    let b = p.connect().await;
    // A runs on the primary's only connection and gives it back.
    a.batch_execute("/* pgfresh:primary */ SELECT 1")
        .await
        .unwrap();
    let a_cancel = a.cancel_token();
    let b_cancel = b.cancel_token();
    let sleep = tokio::spawn(async move {
        b.simple_query("/* pgfresh:primary */ SELECT pg_sleep(1.5)")
            .await
            .map(|_| ())
    });
    running_on_primary("pg_sleep(1.5)").await;
    // A's cancel: A has nothing running, so nothing is cancelled.
    a_cancel.cancel_query(tokio_postgres::NoTls).await.unwrap();
    sleep
        .await
        .unwrap()
        .expect("B's query must not be cancelled by A's cancel");
    // Control: B's own cancel does reach B's query.
    let b = p.connect().await;
    let b_cancel_2 = b.cancel_token();
    let _ = b_cancel;
    let sleep = tokio::spawn(async move {
        b.simple_query("/* pgfresh:primary */ SELECT pg_sleep(30)")
            .await
            .map(|_| ())
    });
    running_on_primary("pg_sleep(30)").await;
    b_cancel_2
        .cancel_query(tokio_postgres::NoTls)
        .await
        .unwrap();
    let err = sleep.await.unwrap().expect_err("cancelled");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_in_every_query_mode() {
    own_database("tpbench").await;
    let p = tx_proxy();
    let pgbench = |args: &[&str]| p.pgbench("tpbench", args);
    pgbench(&["-i", "-s", "1", "-q"]);
    for mode in ["simple", "extended", "prepared"] {
        for extra in [&["-S"][..], &[][..]] {
            // Twice as many clients as server connections per node. One thread per
            // client: pgbench prepares synchronously, so a client waiting for a
            // connection would stall the clients of its thread that hold one.
            let mut args = vec!["-M", mode, "-c", "20", "-j", "20", "-t", "50"];
            args.extend_from_slice(extra);
            let text = pgbench(&args);
            assert!(
                text.contains("number of failed transactions: 0"),
                "{args:?}:\n{text}"
            );
            assert!(
                text.contains("number of transactions actually processed: 1000/1000"),
                "{args:?}:\n{text}"
            );
        }
    }
}

mod wire {
    //! Raw protocol helpers for the prepared-statement tests.
    use pgfresh_tests::raw::{cstr, msg};

    pub fn parse(name: &str, sql: &str) -> Vec<u8> {
        let mut b = cstr(name);
        b.extend(cstr(sql));
        b.extend(0u16.to_be_bytes());
        msg(b'P', &b)
    }

    /// Bind one text parameter to `statement` (unnamed portal), then Execute.
    pub fn bind_execute(statement: &str, param: &str) -> Vec<u8> {
        let mut b = cstr("");
        b.extend(cstr(statement));
        b.extend(0u16.to_be_bytes());
        b.extend(1u16.to_be_bytes());
        b.extend((param.len() as i32).to_be_bytes());
        b.extend(param.as_bytes());
        b.extend(0u16.to_be_bytes());
        let mut out = msg(b'B', &b);
        let mut e = cstr("");
        e.extend(0i32.to_be_bytes());
        out.extend(msg(b'E', &e));
        out
    }

    pub fn close(name: &str) -> Vec<u8> {
        let mut b = vec![b'S'];
        b.extend(cstr(name));
        msg(b'C', &b)
    }

    pub fn describe(name: &str) -> Vec<u8> {
        let mut b = vec![b'S'];
        b.extend(cstr(name));
        msg(b'D', &b)
    }

    pub fn sync() -> Vec<u8> {
        msg(b'S', &[])
    }

    /// The first column of the DataRows among `messages`, as text.
    pub fn values(messages: &[(u8, Vec<u8>)]) -> Vec<String> {
        messages
            .iter()
            .filter(|(t, _)| *t == b'D')
            .map(|(_, b)| {
                let len = i32::from_be_bytes(b[2..6].try_into().unwrap()) as usize;
                String::from_utf8(b[6..6 + len].to_vec()).unwrap()
            })
            .collect()
    }

    /// The SQLSTATE of the first ErrorResponse among `messages`.
    pub fn sqlstate(messages: &[(u8, Vec<u8>)]) -> Option<String> {
        messages
            .iter()
            .find(|(t, _)| *t == b'E')
            .and_then(|(_, b)| {
                b.split(|x| *x == 0)
                    .find_map(|f| f.strip_prefix(b"C"))
                    .map(|c| String::from_utf8_lossy(c).to_string())
            })
    }
}

fn metrics_text() -> String {
    pgfresh_proxy::admin::metrics_handle()
        .map(|h| h.render())
        .unwrap_or_default()
}

async fn raw_login(p: &ProxyHandle) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(&raw::startup("app_trust", "app"))
        .await
        .unwrap();
    raw::read_until(&mut s, b'Z').await;
    s
}

/// Send `bytes` and read up to the next ReadyForQuery.
async fn exchange(s: &mut tokio::net::TcpStream, bytes: Vec<u8>) -> Vec<(u8, Vec<u8>)> {
    use tokio::io::AsyncWriteExt;
    s.write_all(&bytes).await.unwrap();
    raw::read_until(s, b'Z').await
}

#[tokio::test]
async fn clients_keep_their_own_statements_under_colliding_names() {
    use wire::*;
    // One connection per node: every statement of both clients lands on it.
    let p = start_proxy(&tx_config(1, ""));
    let mut a = raw_login(&p).await;
    let mut b = raw_login(&p).await;
    let select = |tag: &str| format!("/* pgfresh:primary */ SELECT '{tag}'::text || $1::text");
    let r = exchange(&mut a, [parse("stmt", &select("a")), sync()].concat()).await;
    assert_eq!(raw::tags(&r), b"1Z");
    let r = exchange(&mut b, [parse("stmt", &select("b")), sync()].concat()).await;
    assert_eq!(raw::tags(&r), b"1Z");
    // The same text under another name shares the server statement: still answered.
    let r = exchange(&mut b, [parse("same_as_a", &select("a")), sync()].concat()).await;
    assert_eq!(raw::tags(&r), b"1Z");
    for _ in 0..3 {
        let r = exchange(&mut a, [bind_execute("stmt", "x"), sync()].concat()).await;
        assert_eq!(values(&r), ["ax"]);
        let r = exchange(&mut b, [bind_execute("stmt", "x"), sync()].concat()).await;
        assert_eq!(values(&r), ["bx"]);
        let r = exchange(&mut b, [bind_execute("same_as_a", "y"), sync()].concat()).await;
        assert_eq!(values(&r), ["ay"]);
    }
    // Close and redefine in one batch: every reply in order, the new text runs.
    let r = exchange(
        &mut a,
        [
            close("stmt"),
            parse("stmt", &select("c")),
            bind_execute("stmt", "z"),
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(raw::tags(&r), b"312DCZ");
    assert_eq!(values(&r), ["cz"]);
    // B's statement of that name is untouched; Describe answers for B's.
    let r = exchange(
        &mut b,
        [describe("stmt"), bind_execute("stmt", "w"), sync()].concat(),
    )
    .await;
    assert_eq!(raw::tags(&r), b"tT2DCZ");
    assert_eq!(values(&r), ["bw"]);
    // Names a client never prepared, pgfresh's own included, do not exist for it.
    for name in ["nope", "__pgfresh_1"] {
        let r = exchange(&mut a, [bind_execute(name, "x"), sync()].concat()).await;
        assert_eq!(
            sqlstate(&r).as_deref(),
            Some("26000"),
            "{name}: {:?}",
            raw::tags(&r)
        );
    }
    // A failed Parse leaves nothing behind on the server: the same name parses again.
    let r = exchange(&mut a, [parse("bad", "SELEC 1"), sync()].concat()).await;
    assert_eq!(sqlstate(&r).as_deref(), Some("42601"));
    let r = exchange(
        &mut a,
        [parse("bad", &select("d")), bind_execute("bad", "v"), sync()].concat(),
    )
    .await;
    assert_eq!(values(&r), ["dv"]);
    // After an error the rest of the batch is skipped, replies made here included.
    let r = exchange(
        &mut b,
        [
            bind_execute("nope", "x"),
            parse("stmt2", &select("a")),
            close("stmt"),
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(raw::tags(&r), b"EZ");
    let r = exchange(&mut b, [bind_execute("stmt", "still"), sync()].concat()).await;
    assert_eq!(
        values(&r),
        ["bstill"],
        "the skipped Close did not close B's statement"
    );
    // Parsing a name the client already has is refused as PostgreSQL refuses it, and the
    // statement stays what it was.
    let r = exchange(&mut a, [parse("stmt", &select("e")), sync()].concat()).await;
    assert_eq!(
        sqlstate(&r).as_deref(),
        Some("42P05"),
        "{:?}",
        raw::tags(&r)
    );
    let r = exchange(&mut a, [bind_execute("stmt", "y"), sync()].concat()).await;
    assert_eq!(values(&r), ["cy"]);
}

/// A batch whose error skips a statement's Parse (one pgfresh prepares first on the
/// connection, or the client's own) while the client's next batch, pipelined behind it,
/// runs that statement's content: the next batch still finds it on the server.
#[tokio::test]
async fn a_parse_an_error_skipped_leaves_no_hole_for_the_batch_pipelined_behind() {
    use wire::*;
    let p = start_proxy(&tx_config(1, "max_prepared_statements = 2\n"));
    let mut a = raw_login(&p).await;
    let select = |tag: &str| format!("/* pgfresh:primary */ SELECT '{tag}'::text || $1::text");
    for (name, tag) in [("s1", "one"), ("s2", "two"), ("s3", "three")] {
        let r = exchange(&mut a, [parse(name, &select(tag)), sync()].concat()).await;
        assert_eq!(raw::tags(&r), b"1Z");
    }
    let fail = || {
        [
            parse("", "/* pgfresh:primary */ SELECT 1/0"),
            raw::bind("", &[]),
            raw::execute(),
        ]
        .concat()
    };
    // s1 was evicted from the connection (at most two): the first batch's Bind of it
    // prepares it first, after the error; the second batch binds it too.
    let r = exchange(
        &mut a,
        [
            fail(),
            bind_execute("s1", "x"),
            sync(),
            bind_execute("s1", "y"),
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(sqlstate(&r).as_deref(), Some("22012"));
    let r = raw::read_until(&mut a, b'Z').await;
    assert_eq!(values(&r), ["oney"], "{:?}", sqlstate(&r));
    // The client's Parse of a new text is skipped; the next batch parses the same text
    // under another name.
    let r = exchange(
        &mut a,
        [
            fail(),
            parse("s4", &select("four")),
            sync(),
            parse("s5", &select("four")),
            bind_execute("s5", "z"),
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(sqlstate(&r).as_deref(), Some("22012"));
    let r = raw::read_until(&mut a, b'Z').await;
    assert_eq!(values(&r), ["fourz"], "{:?}", sqlstate(&r));
    // What the skipped Parse would have made does not exist; the rest is intact.
    let r = exchange(&mut a, [bind_execute("s4", "w"), sync()].concat()).await;
    assert_eq!(sqlstate(&r).as_deref(), Some("26000"));
    for (name, want) in [("s1", "onew"), ("s2", "twow"), ("s5", "fourw")] {
        let r = exchange(&mut a, [bind_execute(name, "w"), sync()].concat()).await;
        assert_eq!(values(&r), [want], "{name}: {:?}", sqlstate(&r));
    }
}

/// The client's Parses and Closes that an error skips never happened: a batch pipelined
/// behind them sees the client's statements as PostgreSQL does, the skipped change undone.
#[tokio::test]
async fn a_batch_pipelined_behind_a_skipped_parse_or_close_sees_it_undone() {
    use wire::*;
    let p = start_proxy(&tx_config(1, ""));
    let mut a = raw_login(&p).await;
    let select = |tag: &str| format!("/* pgfresh:primary */ SELECT '{tag}'::text || $1::text");
    let r = exchange(&mut a, [parse("a", &select("x")), sync()].concat()).await;
    assert_eq!(raw::tags(&r), b"1Z");
    // A Close skipped, then the name parsed again: it still exists (42P05), and keeps
    // its text.
    let r = exchange(
        &mut a,
        [
            bind_execute("nope", "1"),
            close("a"),
            sync(),
            parse("a", &select("y")),
            bind_execute("a", "1"),
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(raw::tags(&r), b"EZ");
    let r = raw::read_until(&mut a, b'Z').await;
    assert_eq!(sqlstate(&r).as_deref(), Some("42P05"), "{:?}", values(&r));
    let r = exchange(&mut a, [bind_execute("a", "2"), sync()].concat()).await;
    assert_eq!(values(&r), ["x2"], "{:?}", sqlstate(&r));
    // A Parse skipped: the statement does not exist for the batch behind.
    let r = exchange(
        &mut a,
        [
            bind_execute("nope", "1"),
            parse("b", &select("z")),
            sync(),
            bind_execute("b", "1"),
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(raw::tags(&r), b"EZ");
    let r = raw::read_until(&mut a, b'Z').await;
    assert_eq!(sqlstate(&r).as_deref(), Some("26000"), "{:?}", values(&r));
}

/// Parse, Bind and Execute of the unnamed statement (`tag`), answered.
async fn run_unnamed(s: &mut tokio::net::TcpStream, tag: &str) {
    use wire::*;
    let sql = format!("/* pgfresh:primary */ SELECT '{tag}'::text || $1::text");
    let r = exchange(s, [parse("", &sql), bind_execute("", "1"), sync()].concat()).await;
    assert_eq!(values(&r), [format!("{tag}1")]);
}

/// The unnamed statement is the client's own too: a Bind or Describe of it where the
/// client has none fails as PostgreSQL fails it, never reaching the unnamed statement
/// another client left on the connection, and a batch that binds the client's earlier
/// one before parsing a new one runs each in turn.
#[tokio::test]
async fn the_unnamed_statement_of_another_client_is_out_of_reach() {
    use wire::*;
    let p = start_proxy(&tx_config(1, ""));
    let mut a = raw_login(&p).await;
    let mut b = raw_login(&p).await;
    let select = |tag: &str| format!("/* pgfresh:primary */ SELECT '{tag}'::text || $1::text");
    run_unnamed(&mut b, "b").await;
    let r = exchange(&mut a, [bind_execute("", "2"), sync()].concat()).await;
    assert_eq!(sqlstate(&r).as_deref(), Some("26000"), "{:?}", values(&r));
    let r = exchange(&mut a, [describe(""), sync()].concat()).await;
    assert_eq!(
        sqlstate(&r).as_deref(),
        Some("26000"),
        "{:?}",
        raw::tags(&r)
    );
    // Closed by the client: gone for it, whatever the connection holds.
    run_unnamed(&mut a, "a").await;
    let close = pgfresh_tests::raw::msg(b'C', b"S\0");
    let r = exchange(&mut a, [close, sync()].concat()).await;
    assert_eq!(raw::tags(&r), b"3Z");
    run_unnamed(&mut b, "b").await;
    let r = exchange(&mut a, [bind_execute("", "3"), sync()].concat()).await;
    assert_eq!(sqlstate(&r).as_deref(), Some("26000"), "{:?}", values(&r));
    // The client's unnamed statement, then a new one, in one batch.
    run_unnamed(&mut a, "a").await;
    run_unnamed(&mut b, "b").await;
    let r = exchange(
        &mut a,
        [
            bind_execute("", "4"),
            parse("", &select("c")),
            bind_execute("", "5"),
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(values(&r), ["a4", "c5"], "{:?}", sqlstate(&r));
}

/// A continuation of a batch left open by a Flush closes least recently used statements
/// in front of its messages. When an error earlier in the batch skips both the Parse of
/// a statement and that Close, the statement was never prepared: it is not counted as
/// on the connection, and the next Parse of its text prepares it.
#[tokio::test]
async fn a_statement_whose_parse_and_eviction_an_error_skipped_is_not_counted() {
    use wire::*;
    let p = start_proxy(&tx_config(1, "max_prepared_statements = 1\n"));
    let mut a = raw_login(&p).await;
    let select = |tag: &str| format!("/* pgfresh:primary */ SELECT '{tag}'::text || $1::text");
    let r = exchange(&mut a, [parse("s1", &select("x")), sync()].concat()).await;
    assert_eq!(raw::tags(&r), b"1Z");
    // Two new statements after the error, then the Sync, which closes one of them.
    let flush = pgfresh_tests::raw::msg(b'H', &[]);
    let r = exchange(
        &mut a,
        [
            bind_execute("nope", "1"),
            parse("s2", &select("y")),
            parse("s3", &select("z")),
            flush,
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(raw::tags(&r), b"EZ");
    for (name, tag) in [("s4", "y"), ("s5", "z")] {
        let r = exchange(
            &mut a,
            [parse(name, &select(tag)), bind_execute(name, "1"), sync()].concat(),
        )
        .await;
        assert_eq!(
            values(&r),
            [format!("{tag}1")],
            "{name}: {:?}",
            sqlstate(&r)
        );
    }
}

/// The same text names other relations under another search_path: clients whose
/// search_path differs do not share its statement (PostgreSQL would refuse to run it
/// for the other, "cached plan must not change result type", where their tables
/// differ), each runs it against its own tables.
#[tokio::test]
async fn clients_with_other_search_paths_keep_their_own_statements() {
    let p = start_proxy(&tx_config(1, ""));
    let admin = p.connect().await;
    let (sa, sb) = (unique("path_a"), unique("path_b"));
    admin
        .batch_execute(&format!(
            "/* pgfresh:primary */ CREATE SCHEMA {sa}; CREATE SCHEMA {sb};
             CREATE TABLE {sa}.t (v int); CREATE TABLE {sb}.t (v text, w int);
             INSERT INTO {sa}.t VALUES (1); INSERT INTO {sb}.t VALUES ('b', 2)"
        ))
        .await
        .unwrap();
    let sql = "/* pgfresh:primary */ SELECT * FROM t";
    for _ in 0..2 {
        for (schema, want) in [(&sa, "1"), (&sb, "b")] {
            let c = p.connect().await;
            c.batch_execute(&format!("SET search_path = {schema}"))
                .await
                .unwrap();
            let s = c
                .prepare(sql)
                .await
                .unwrap_or_else(|e| panic!("{schema}: {e}"));
            let rows = c
                .query(&s, &[])
                .await
                .unwrap_or_else(|e| panic!("{schema}: {e}"));
            let got = match s.columns()[0].type_() {
                &tokio_postgres::types::Type::INT4 => rows[0].get::<_, i32>(0).to_string(),
                _ => rows[0].get::<_, String>(0),
            };
            assert_eq!(got, want, "{schema}");
        }
    }
}

/// On a shared connection pgfresh's statements live under its own names: SQL-level
/// PREPARE, EXECUTE and DEALLOCATE cannot reach them (another client's statement would
/// run, or be gone for it), as a Bind or Describe cannot.
#[tokio::test]
async fn sql_statements_cannot_reach_the_names_pgfresh_gives_statements() {
    use wire::*;
    let p = start_proxy(&tx_config(1, ""));
    let mut a = raw_login(&p).await;
    let b = p.connect().await;
    let select = "/* pgfresh:primary */ SELECT 'a'::text || $1::text";
    let r = exchange(&mut a, [parse("s1", select), sync()].concat()).await;
    assert_eq!(raw::tags(&r), b"1Z");
    for sql in [
        "EXECUTE __pgfresh_1('x')",
        "DEALLOCATE __pgfresh_1",
        "DEALLOCATE PREPARE \"__pgfresh_1\"",
        "PREPARE __pgfresh_2 AS SELECT 1",
    ] {
        let sql = format!("/* pgfresh:primary */ {sql}");
        let e = b.simple_query(&sql).await.map(|_| ()).unwrap_err();
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME),
            "{sql}: {e:?}"
        );
        let e = b.query(&sql, &[]).await.map(|_| ()).unwrap_err();
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME),
            "{sql}: {e:?}"
        );
    }
    // A's statement is still its own.
    let r = exchange(&mut a, [bind_execute("s1", "y"), sync()].concat()).await;
    assert_eq!(values(&r), ["ay"], "{:?}", sqlstate(&r));
    // The names are free to the client's own statements at the protocol level.
    let r = exchange(
        &mut a,
        [parse("__pgfresh_1", "SELECT 'own'"), sync()].concat(),
    )
    .await;
    assert_eq!(raw::tags(&r), b"1Z");
    let q = pgfresh_tests::raw::msg(b'Q', &pgfresh_tests::raw::cstr("DEALLOCATE __pgfresh_1"));
    let r = exchange(&mut a, q).await;
    assert_eq!(raw::tags(&r), b"CZ", "{:?}", sqlstate(&r));
}

#[tokio::test]
async fn sql_prepare_and_execute_per_client() {
    let p = start_proxy(&tx_config(1, ""));
    let a = p.connect().await;
    let b = p.connect().await;
    a.batch_execute("PREPARE q(int) AS SELECT $1 + 1")
        .await
        .unwrap();
    b.batch_execute("PREPARE q(int) AS SELECT $1 + 100")
        .await
        .unwrap();
    for i in 0..5 {
        assert_eq!(
            first_value(&a, &format!("EXECUTE q({i})")).await,
            (i + 1).to_string()
        );
        assert_eq!(
            first_value(&b, &format!("EXECUTE q({i})")).await,
            (i + 100).to_string()
        );
    }
    a.batch_execute("DEALLOCATE q").await.unwrap();
    assert!(a.batch_execute("EXECUTE q(1)").await.is_err());
    assert_eq!(first_value(&b, "EXECUTE q(1)").await, "101");
}

#[tokio::test]
async fn session_state_keeps_the_connection_until_it_is_gone() {
    let p = start_proxy(&tx_config(1, "query_wait_timeout_ms = 300\n"));
    let a = p.connect().await;
    let b = p.connect().await;
    a.batch_execute("CREATE TEMP TABLE scratch(v int); INSERT INTO scratch VALUES (1)")
        .await
        .unwrap();
    // A keeps the primary's only connection: B waits, then is told why.
    let err = b
        .batch_execute("/* pgfresh:primary */ SELECT 1")
        .await
        .expect_err("no connection is free");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{err}"
    );
    let msg = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(msg.contains("query_wait_timeout"), "{msg}");
    // A's temp table is there for every statement it runs meanwhile.
    for _ in 0..5 {
        assert_eq!(first_value(&a, "SELECT count(*) FROM scratch").await, "1");
    }
    let metrics = metrics_text();
    assert!(
        metrics.contains("pgfresh_pinned_sessions{reason=\"temp_table\"} 1"),
        "{metrics}"
    );
    a.batch_execute("DISCARD TEMP").await.unwrap();
    // The state is gone: the connection goes back and B gets it.
    assert_eq!(first_value(&b, "/* pgfresh:primary */ SELECT 2").await, "2");
    let metrics = metrics_text();
    assert!(
        metrics.contains("pgfresh_pinned_sessions{reason=\"temp_table\"} 0"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_idle_transaction_holding_a_connection_is_ended() {
    let p = start_proxy(&tx_config(1, "idle_transaction_timeout_ms = 300\n"));
    let a = p.connect().await;
    let b = p.connect().await;
    a.batch_execute("BEGIN; /* pgfresh:primary */ SELECT 1")
        .await
        .unwrap();
    // A sits in its transaction; B gets the connection once A is disconnected.
    assert_eq!(first_value(&b, "/* pgfresh:primary */ SELECT 3").await, "3");
    let err = a
        .batch_execute("SELECT 1")
        .await
        .expect_err("A was disconnected");
    assert!(err.is_closed() || err.code().is_some(), "{err}");
}

#[tokio::test]
async fn connections_the_server_closed_while_pooled_are_replaced() {
    own_database("tpdead").await;
    let p = start_proxy(&tx_config(2, ""));
    let conninfo = p.conninfo("app", APP_PASSWORD, "tpdead");
    let (c, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    for _ in 0..10 {
        first_value(&c, "/* pgfresh:primary */ SELECT 1").await;
        first_value(&c, "SELECT 1").await;
    }
    let mut killed = 0;
    for i in 0..3 {
        let node = direct(i).await;
        let n: i64 = node
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = 'tpdead'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        killed += n;
        let node = &node;
        poll(
            "the terminated connections are gone",
            Duration::from_secs(20),
            || async move { (server_connections(node, "tpdead").await == 0).then_some(()) },
        )
        .await;
    }
    assert!(killed > 0, "the pool held connections to terminate");
    // Every statement succeeds: dead pooled connections are noticed before use.
    for _ in 0..10 {
        assert_eq!(first_value(&c, "/* pgfresh:primary */ SELECT 1").await, "1");
        assert_eq!(first_value(&c, "SELECT 1").await, "1");
    }
}

#[tokio::test]
async fn read_only_transactions_stay_on_one_node() {
    let p = tx_proxy();
    let c = p.connect().await;
    for _ in 0..5 {
        c.batch_execute("BEGIN READ ONLY").await.unwrap();
        let first = first_value(&c, "SELECT inet_server_port()").await;
        for _ in 0..5 {
            assert_eq!(first_value(&c, "SELECT inet_server_port()").await, first);
        }
        c.batch_execute("COMMIT").await.unwrap();
    }
}

/// Writes by one client, each read at once by the writer and by another client, all
/// sharing `p`'s connections; returns the reads that missed their write.
async fn read_after_write_misses(p: &ProxyHandle, rounds: i32) -> (usize, usize) {
    let writer = p.connect().await;
    let reader = p.connect().await;
    let t = unique("tp_raw");
    writer
        .batch_execute(&format!("CREATE TABLE {t}(id int primary key)"))
        .await
        .unwrap();
    // The table itself is on every node before the run (the control run has no
    // recency routing to send its statements to the primary).
    wait_replicated_on(cluster(), &writer).await;
    let ins = writer
        .prepare(&format!("INSERT INTO {t} VALUES ($1)"))
        .await
        .unwrap();
    let sel = format!("SELECT count(*) FROM {t} WHERE id = $1");
    let sel_same = writer.prepare(&sel).await.unwrap();
    let sel_other = reader.prepare(&sel).await.unwrap();
    let (mut same, mut cross) = (0, 0);
    for i in 0..rounds {
        writer.execute(&ins, &[&i]).await.unwrap();
        let n: i64 = writer.query_one(&sel_same, &[&i]).await.unwrap().get(0);
        same += usize::from(n != 1);
        let n: i64 = reader.query_one(&sel_other, &[&i]).await.unwrap().get(0);
        cross += usize::from(n != 1);
    }
    (same, cross)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_after_write_holds_with_delayed_replicas() {
    let delay = ApplyDelay::set(300);
    // Two connections per node: the writer's and the reader's units take turns on them.
    let p = start_proxy(&tx_config(2, ""));
    let (same, cross) = read_after_write_misses(&p, 100).await;
    // Control: without recency routing the same run reads stale rows from the replicas.
    let off = start_proxy(&tx_config_routing(
        2,
        "",
        "enable_recent_access_routing = false",
    ));
    let (off_same, off_cross) = read_after_write_misses(&off, 20).await;
    drop(delay);
    assert_eq!(
        (same, cross),
        (0, 0),
        "read-after-write misses (same, cross)"
    );
    assert!(
        off_same + off_cross > 0,
        "the control run without recency routing never read stale: the test cannot fail"
    );
}

#[tokio::test]
async fn a_listening_client_keeps_its_connection_and_gets_notifications() {
    use futures_util::StreamExt;
    let p = start_proxy(&tx_config(2, ""));
    let (listener, mut conn) = tokio_postgres::connect(
        &p.conninfo("app", APP_PASSWORD, "app"),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_string());
            }
        }
    });
    listener.batch_execute("LISTEN tp_channel").await.unwrap();
    let metrics = metrics_text();
    assert!(
        metrics.contains("pgfresh_pinned_sessions{reason=\"listen\"} 1"),
        "{metrics}"
    );
    let notifier = p.connect().await;
    for i in 0..3 {
        // Other clients keep running on the remaining connection meanwhile.
        notifier
            .batch_execute(&format!("NOTIFY tp_channel, 'n{i}'"))
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("notification delivered")
            .expect("channel open");
        assert_eq!(got, format!("n{i}"));
    }
    listener.batch_execute("UNLISTEN *").await.unwrap();
    let metrics = metrics_text();
    assert!(
        metrics.contains("pgfresh_pinned_sessions{reason=\"listen\"} 0"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_with_copy_meta_commands_and_errors() {
    let p = tx_proxy();
    let t = unique("tp_psql");
    let rows: String = (0..5000).map(|i| format!("{i}\tvalue {i}\n")).collect();
    let script = format!(
        "CREATE TABLE {t}(id int primary key, v text);\n\
         COPY {t} FROM STDIN;\n{rows}\\.\n\
         \\d {t}\n\
         SELECT count(*) FROM {t};\n\
         BEGIN;\nINSERT INTO {t} VALUES (-1, 'in a transaction');\nSELECT count(*) FROM {t};\nCOMMIT;\n\
         SELECT 1/0;\n\
         SELECT max(id) FROM {t};\n"
    );
    let mut child = tokio::process::Command::new(pg_bin("psql"))
        .args(["-X", "-A", "-t", "-q"])
        .envs(p.libpq_env())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use tokio::io::AsyncWriteExt;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(script.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.contains(&"5000"), "{stdout}\n{stderr}");
    assert!(lines.contains(&"5001"), "{stdout}\n{stderr}");
    assert!(lines.contains(&"4999"), "{stdout}\n{stderr}");
    assert!(stdout.contains("id|integer"), "\\d output: {stdout}");
    assert!(stderr.contains("division by zero"), "{stderr}");
}

#[tokio::test]
async fn deallocate_of_a_protocol_level_statement_works_in_both_modes() {
    use wire::*;
    let session = proxy();
    let transaction = start_proxy(&tx_config(1, ""));
    for p in [session, &transaction] {
        let mut c = raw_login(p).await;
        for round in 0..3 {
            // A statement prepared with Parse, deallocated with SQL, as psycopg does past
            // its prepared_max.
            let r = exchange(&mut c, [parse("s1", "SELECT $1::int + 1"), sync()].concat()).await;
            assert_eq!(raw::tags(&r), b"1Z");
            let r = exchange(
                &mut c,
                [bind_execute("s1", &round.to_string()), sync()].concat(),
            )
            .await;
            assert_eq!(values(&r), [(round + 1).to_string()]);
            let q = pgfresh_tests::raw::msg(b'Q', &pgfresh_tests::raw::cstr("DEALLOCATE s1"));
            let r = exchange(&mut c, q).await;
            assert_eq!(raw::tags(&r), b"CZ", "DEALLOCATE s1: {:?}", sqlstate(&r));
            // The statement is gone for the client.
            let r = exchange(&mut c, [bind_execute("s1", "1"), sync()].concat()).await;
            assert_eq!(sqlstate(&r).as_deref(), Some("26000"));
        }
    }
}

#[tokio::test]
async fn logins_need_no_server_connection_once_their_settings_are_known() {
    let p = start_proxy(&tx_config(1, "query_wait_timeout_ms = 500\n"));
    // The first login with these settings runs them on a connection and is remembered.
    let holder = p.connect().await;
    // The primary's only connection stays in this transaction meanwhile.
    holder
        .batch_execute("BEGIN; /* pgfresh:primary */ SELECT 1")
        .await
        .unwrap();
    for _ in 0..20 {
        // Logging in would otherwise wait for that connection and time out.
        let c = p.connect().await;
        assert_eq!(first_value(&c, "SELECT 1").await, "1");
        assert_eq!(first_value(&c, "SHOW client_encoding").await, "UTF8");
    }
    holder.batch_execute("COMMIT").await.unwrap();
}

#[tokio::test]
async fn a_batch_left_open_by_flush_holds_its_connection_only_so_long() {
    use tokio::io::AsyncWriteExt;
    let p = start_proxy(&tx_config(1, "idle_transaction_timeout_ms = 300\n"));
    let mut a = raw_login(&p).await;
    // asyncpg's way: Parse + Describe + Flush, answered, then nothing more.
    let mut b = wire::parse("held", "/* pgfresh:primary */ SELECT $1::int");
    b.extend(wire::describe("held"));
    b.extend(pgfresh_tests::raw::msg(b'H', &[]));
    a.write_all(&b).await.unwrap();
    let r = raw::read_until(&mut a, b'T').await;
    assert_eq!(raw::tags(&r), b"1tT");
    // The batch holds the primary's only connection until A is disconnected.
    let other = p.connect().await;
    assert_eq!(
        first_value(&other, "/* pgfresh:primary */ SELECT 5").await,
        "5"
    );
    let r = raw::read_until(&mut a, b'E').await;
    let (_, body) = r.last().unwrap();
    assert!(
        String::from_utf8_lossy(body).contains("25P03"),
        "{:?}",
        String::from_utf8_lossy(body)
    );
}

/// The pids of the server connections to `db` that `app` holds on node `node`.
async fn backend_pids(node: &tokio_postgres::Client, db: &str) -> Vec<i32> {
    node.query(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND usename = 'app' AND backend_type = 'client backend'",
        &[&db],
    )
    .await
    .expect("list connections")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connections_idle_too_long_are_closed_while_others_stay_busy() {
    own_database("tpidle").await;
    let p = start_proxy(&tx_config(10, "idle_timeout_ms = 500"));
    // Six transactions at once open six connections on the primary.
    let mut clients = Vec::new();
    for _ in 0..6 {
        let c = p.connect_as("app", APP_PASSWORD, "tpidle").await.unwrap();
        c.batch_execute("BEGIN").await.unwrap();
        first_value(&c, "/* pgfresh:primary */ SELECT pg_backend_pid()").await;
        clients.push(c);
    }
    for c in &clients {
        c.batch_execute("COMMIT").await.unwrap();
    }
    let primary = &direct(0).await;
    assert_eq!(server_connections(primary, "tpidle").await, 6);
    // One client keeps working: the connection it takes each time (the most recently
    // returned) never idles long, and the five under it are never taken. They are still
    // closed once idle longer than idle_timeout_ms.
    let busy = &clients[0];
    poll(
        "the connections idle too long to be closed",
        Duration::from_secs(30),
        || async move {
            assert_eq!(
                first_value(busy, "/* pgfresh:primary */ SELECT 1").await,
                "1"
            );
            (server_connections(primary, "tpidle").await == 1).then_some(())
        },
    )
    .await;
    assert_eq!(
        first_value(busy, "/* pgfresh:primary */ SELECT 1").await,
        "1"
    );
}

#[tokio::test]
async fn connections_older_than_server_lifetime_are_replaced_between_transactions() {
    own_database("tplife").await;
    let p = start_proxy(&tx_config(
        2,
        "server_lifetime_ms = 300\nidle_timeout_ms = 0",
    ));
    let c = &p.connect_as("app", APP_PASSWORD, "tplife").await.unwrap();
    let pid = "/* pgfresh:primary */ SELECT pg_backend_pid()";
    let first = &first_value(c, pid).await;
    poll(
        "a connection past its lifetime to be replaced",
        Duration::from_secs(30),
        || async move { (first_value(c, pid).await != *first).then_some(()) },
    )
    .await;
    // The old connection is closed, not kept idle; the pool stays within its size.
    let primary = &direct(0).await;
    let first: i32 = first.parse().unwrap();
    poll(
        "the old connection to be closed",
        Duration::from_secs(30),
        || async move { (!backend_pids(primary, "tplife").await.contains(&first)).then_some(()) },
    )
    .await;
    assert!(server_connections(primary, "tplife").await <= 2);
}

#[tokio::test]
async fn a_session_keeps_its_connection_past_server_lifetime_and_it_closes_after() {
    own_database("tplifes").await;
    // Session mode.
    let p = start_proxy(&format!(
        "{}\n[pool]\nserver_lifetime_ms = 300\n",
        config_text("")
    ));
    let conninfo = p.conninfo("app", APP_PASSWORD, "tplifes");
    let (c, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let pid = "/* pgfresh:primary */ SELECT pg_backend_pid()";
    let first = first_value(&c, pid).await;
    // Once the connection the session holds is well past its lifetime (as SHOW SERVERS
    // sees it), it is still the session's: a held connection is never taken from it.
    let held: i32 = first.parse().unwrap();
    let shared = p.shared.clone();
    eventually(
        "the held connection to outlive server_lifetime_ms",
        Duration::from_secs(30),
        || {
            shared.pools.servers().iter().any(|s| {
                s.pid == held
                    && s.connected_at
                        .elapsed()
                        .is_ok_and(|age| age > Duration::from_millis(600))
            })
        },
    )
    .await;
    assert_eq!(first_value(&c, pid).await, first);
    drop(c);
    let _ = driver.await;
    // Given back past its lifetime: closed, not pooled.
    let first: i32 = first.parse().unwrap();
    let primary = &direct(0).await;
    poll(
        "the connection past its lifetime to be closed at the session's end",
        Duration::from_secs(30),
        || async move { (!backend_pids(primary, "tplifes").await.contains(&first)).then_some(()) },
    )
    .await;
}

/// A console connection (tokio-postgres: PAUSE waits, and the test goes on meanwhile).
async fn console_client(p: &ProxyHandle) -> tokio_postgres::Client {
    p.connect_as("admin", "admin-pass", "pgfresh")
        .await
        .expect("console login")
}

type PauseTask = tokio::task::JoinHandle<(
    tokio_postgres::Client,
    Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>,
)>;

/// Sends PAUSE from a console connection of its own and returns once the pause is in
/// force; the task ends with PAUSE's answer (and the connection, for RESUME).
async fn start_pause(p: &ProxyHandle) -> PauseTask {
    let admin = console_client(p).await;
    let pause = tokio::spawn(async move {
        let r = admin.simple_query("PAUSE").await;
        (admin, r)
    });
    poll("pgfresh to be paused", Duration::from_secs(30), || async {
        p.shared.pause.is_paused().then_some(())
    })
    .await;
    pause
}

/// Polls until `app` holds no server connection to `db` on the primary.
async fn no_server_connections(db: &str) {
    let primary = &direct(0).await;
    poll(
        "the pooled connections to be closed",
        Duration::from_secs(30),
        || async move { (server_connections(primary, db).await == 0).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_lets_open_transactions_finish_holds_new_ones_and_resume_lets_them_go() {
    own_database("tppause").await;
    let p = start_proxy(&tx_config(4, ""));
    let connect = || async { p.connect_as("app", APP_PASSWORD, "tppause").await.unwrap() };
    let a = connect().await;
    let b = connect().await;
    a.batch_execute("BEGIN").await.unwrap();
    first_value(&a, "/* pgfresh:primary */ SELECT pg_backend_pid()").await;
    // PAUSE waits: a's transaction holds its connection.
    let pause = start_pause(&p).await;
    // A second PAUSE is refused; b's next statement needs a connection and is held.
    let other = console_client(&p).await;
    let again = other.simple_query("PAUSE").await.unwrap_err();
    assert_eq!(again.code().map(|c| c.code()), Some("55000"), "{again:?}");
    let held = tokio::spawn(async move {
        let v = first_value(&b, "/* pgfresh:primary */ SELECT 42").await;
        (b, v)
    });
    // The open transaction goes on to its end.
    assert_eq!(first_value(&a, "/* pgfresh:primary */ SELECT 2").await, "2");
    assert!(
        !pause.is_finished(),
        "PAUSE answered while a transaction was open"
    );
    a.batch_execute("COMMIT").await.unwrap();
    let (admin, paused) = pause.await.unwrap();
    paused.expect("PAUSE answers once the transaction ended");
    // Nothing is in use and the pooled connections are closed: the node could restart.
    let primary = &direct(0).await;
    no_server_connections("tppause").await;
    assert!(!held.is_finished(), "a statement ran while paused");
    assert_eq!(server_connections(primary, "tppause").await, 0);
    admin.simple_query("RESUME").await.expect("RESUME");
    let (b, v) = held.await.unwrap();
    assert_eq!(v, "42");
    assert_eq!(first_value(&b, "SELECT 7").await, "7");
    assert_eq!(first_value(&a, "/* pgfresh:primary */ SELECT 8").await, "8");
    let not_paused = admin.simple_query("RESUME").await.unwrap_err();
    assert_eq!(not_paused.code().map(|c| c.code()), Some("55000"));
}

#[tokio::test]
async fn a_statement_held_by_pause_past_query_wait_timeout_fails_and_the_session_goes_on() {
    own_database("tppausew").await;
    let p = start_proxy(&tx_config(2, "query_wait_timeout_ms = 300"));
    let c = p.connect_as("app", APP_PASSWORD, "tppausew").await.unwrap();
    assert_eq!(first_value(&c, "SELECT 1").await, "1");
    let admin = console_client(&p).await;
    admin
        .simple_query("PAUSE")
        .await
        .expect("PAUSE with nothing in use");
    let err = c.simple_query("SELECT 1").await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err:?}");
    let msg = err
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(msg.contains("paused"), "{msg}");
    admin.simple_query("RESUME").await.expect("RESUME");
    assert_eq!(first_value(&c, "SELECT 1").await, "1");
}

#[tokio::test]
async fn in_session_mode_pause_waits_for_clients_to_leave_and_they_keep_working() {
    own_database("tppauses").await;
    let p = start_proxy(&format!("{}\n", config_text("")));
    let s = p.connect_as("app", APP_PASSWORD, "tppauses").await.unwrap();
    assert_eq!(first_value(&s, "SELECT 1").await, "1");
    let pause = start_pause(&p).await;
    // The session holds its connections: it goes on, and PAUSE waits for it to leave.
    assert_eq!(first_value(&s, "/* pgfresh:primary */ SELECT 2").await, "2");
    assert_eq!(first_value(&s, "SELECT 3").await, "3");
    assert!(
        !pause.is_finished(),
        "PAUSE answered while a session held connections"
    );
    drop(s);
    let (admin, paused) = pause.await.unwrap();
    paused.expect("PAUSE answers once the session left");
    // A new login needs a connection: it waits for RESUME.
    let conninfo = p.conninfo("app", APP_PASSWORD, "tppauses");
    let login = tokio::spawn(async move {
        let (c, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
            .await
            .expect("login after RESUME");
        tokio::spawn(conn);
        c
    });
    no_server_connections("tppauses").await;
    assert!(
        !login.is_finished(),
        "a login got a connection while paused"
    );
    admin.simple_query("RESUME").await.expect("RESUME");
    let s = login.await.unwrap();
    assert_eq!(first_value(&s, "SELECT 4").await, "4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_the_wait_of_a_statement_held_by_pause() {
    own_database("tppausex").await;
    let p = start_proxy(&tx_config(2, "query_wait_timeout_ms = 600000"));
    let c = p.connect_as("app", APP_PASSWORD, "tppausex").await.unwrap();
    let admin = console_client(&p).await;
    admin.simple_query("PAUSE").await.expect("PAUSE");
    let held = tokio::spawn(async move { c.simple_query("SELECT 1").await.map(drop) });
    let listed = p.shared.client_list.clone();
    poll("the statement to wait", Duration::from_secs(30), || {
        let waiting = listed
            .snapshot()
            .iter()
            .any(|c| c.state() == pgfresh_proxy::clients::ClientState::Waiting);
        async move { waiting.then_some(()) }
    })
    .await;
    // Stopping pgfresh tells the waiting session at once (57P01), not after the wait.
    tokio::task::spawn_blocking(move || drop(p)).await.unwrap();
    let err = held.await.unwrap().unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("57P01"), "{err:?}");
}

#[tokio::test]
async fn a_login_held_by_pause_fails_within_its_own_time() {
    own_database("tppausel").await;
    // Session mode: a login needs a server connection. The statement wait is long, the
    // login's own time short.
    let text = config_text("").replacen(
        "client_login_timeout_ms = 10000",
        "client_login_timeout_ms = 1000",
        1,
    );
    assert!(text.contains("client_login_timeout_ms = 1000\n"));
    let p = start_proxy(&format!("{text}\n[pool]\nquery_wait_timeout_ms = 600000\n"));
    let admin = console_client(&p).await;
    admin.simple_query("PAUSE").await.expect("PAUSE");
    let err = p
        .connect_as("app", APP_PASSWORD, "tppausel")
        .await
        .map(drop)
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err:?}");
    admin.simple_query("RESUME").await.expect("RESUME");
    let c = p.connect_as("app", APP_PASSWORD, "tppausel").await.unwrap();
    assert_eq!(first_value(&c, "SELECT 1").await, "1");
}

/// SHOW SERVERS' rows as (state, remote_pid), from a console connection.
async fn show_servers(admin: &tokio_postgres::Client) -> Vec<(String, i32)> {
    admin
        .simple_query("SHOW SERVERS")
        .await
        .expect("SHOW SERVERS")
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some((
                r.get("state").unwrap().to_string(),
                r.get("remote_pid").unwrap().parse().unwrap(),
            )),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_servers_follows_each_connection_between_lent_and_pooled() {
    own_database("tpshow").await;
    let p = start_proxy(&tx_config(3, ""));
    let admin = &console_client(&p).await;
    let connect = || async { p.connect_as("app", APP_PASSWORD, "tpshow").await.unwrap() };
    let a = connect().await;
    a.batch_execute("CREATE TABLE shown (id int)")
        .await
        .unwrap();
    // An open transaction holds its connection: listed as active, under its pid.
    a.batch_execute("BEGIN; INSERT INTO shown VALUES (1)")
        .await
        .unwrap();
    let pid: i32 = first_value(&a, "SELECT pg_backend_pid()")
        .await
        .parse()
        .unwrap();
    let rows = show_servers(admin).await;
    assert_eq!(
        rows.iter()
            .filter(|(s, _)| s == "active")
            .collect::<Vec<_>>(),
        vec![&("active".to_string(), pid)],
        "{rows:?}"
    );
    // Its end gives it back: the same connection, now idle, and nothing lent.
    a.batch_execute("COMMIT").await.unwrap();
    let rows = show_servers(admin).await;
    assert!(rows.contains(&("idle".to_string(), pid)), "{rows:?}");
    assert!(rows.iter().all(|(s, _)| s == "idle"), "{rows:?}");
    // Many units from several clients over three connections a node: each lease's
    // record goes with its return, and a record's slot is reused.
    let clients = futures_util::future::join_all((0..6).map(|_| connect())).await;
    futures_util::future::join_all(clients.iter().enumerate().map(|(i, c)| async move {
        for n in 0..40 {
            c.execute("INSERT INTO shown VALUES ($1)", &[&(i as i32 * 100 + n)])
                .await
                .unwrap();
            c.query_one("SELECT count(*) FROM shown", &[])
                .await
                .unwrap();
        }
    }))
    .await;
    // A read on a standby may be followed by pgfresh's own replay sample, which holds
    // the connection a moment after the client has its answer: polled.
    let shared = &p.shared;
    let rows = poll(
        "every connection back in its pool",
        Duration::from_secs(30),
        || async move {
            let rows = show_servers(admin).await;
            let lent = shared.pools.counts().iter().map(|c| c.lent).sum::<usize>();
            (rows.iter().all(|(s, _)| s == "idle") && lent == 0).then_some(rows)
        },
    )
    .await;
    assert!(!rows.is_empty() && rows.len() <= 9, "{rows:?}");
}

/// Raw protocol helpers for the comparison of pipelined batches with PostgreSQL.
mod script {
    use pgfresh_tests::raw::{bind, cstr, execute, msg};

    /// The texts the scripts parse: their content (text and parameter types) decides which
    /// share a server statement; one fails at Execute for the parameter 0, one at Parse.
    const TEXTS: [(&str, &[u32]); 7] = [
        ("SELECT 'x0'::text || $1::text", &[]),
        ("SELECT 'x0'::text || $1::text", &[25]),
        ("SELECT 'x1'::text || $1::text", &[]),
        ("SELECT 'x2'::text || $1::text", &[]),
        ("SELECT 'x3'::text || $1::text", &[]),
        // random() keeps the division out of planning: it fails at Execute on any plan.
        (
            "SELECT (10 / ($1::text::int + (random() * 0)::int))::text",
            &[],
        ),
        ("SELEC oops $1", &[]),
    ];

    pub fn parse(name: &str, text: usize) -> Vec<u8> {
        let (sql, types) = TEXTS[text % TEXTS.len()];
        let mut b = cstr(name);
        b.extend(cstr(&format!("/* pgfresh:primary */ {sql}")));
        b.extend((types.len() as u16).to_be_bytes());
        for t in types {
            b.extend(t.to_be_bytes());
        }
        msg(b'P', &b)
    }

    /// Describe (`D`) or Close (`C`) of statement `name`.
    pub fn statement(tag: u8, name: &str) -> Vec<u8> {
        let mut b = vec![b'S'];
        b.extend(cstr(name));
        msg(tag, &b)
    }

    pub fn bind_execute(name: &str, param: &str, describe: bool) -> Vec<u8> {
        let mut out = bind(name, &[param]);
        if describe {
            out.extend(msg(b'D', b"P\0"));
        }
        out.extend(execute());
        out
    }

    /// A round of 1 to 3 batches sent at once, each up to its Sync, of messages picked
    /// by `pick` (a number below its argument) among Parse, Bind + Execute, Describe,
    /// Close and Flush of the statements `a`, `b` and `c`; and its number of batches.
    pub fn round(pick: &mut impl FnMut(u64) -> u64) -> (Vec<u8>, usize) {
        let batches = 1 + pick(3) as usize;
        let mut bytes = Vec::new();
        for _ in 0..batches {
            for _ in 0..=pick(5) {
                let name = ["a", "b", "c"][pick(3) as usize];
                match pick(10) {
                    0..=2 => bytes.extend(parse(name, pick(7) as usize)),
                    3..=5 => {
                        let param = if pick(6) == 0 { "0" } else { "5" };
                        bytes.extend(bind_execute(name, param, false));
                    }
                    6 => bytes.extend(statement(b'D', name)),
                    7 => bytes.extend(statement(b'C', name)),
                    8 => bytes.extend(msg(b'H', &[])),
                    _ => bytes.extend(bind_execute(name, "5", true)),
                }
            }
            bytes.extend(msg(b'S', &[]));
        }
        (bytes, batches)
    }

    /// What came back, as comparable text: message tags, rows' values, errors' SQLSTATEs
    /// (not their messages, which name the statement as the server knows it).
    pub fn summary(messages: &[(u8, Vec<u8>)]) -> String {
        let mut out = String::new();
        for (tag, body) in messages {
            match tag {
                b'D' => {
                    let len = i32::from_be_bytes(body[2..6].try_into().unwrap());
                    let value = usize::try_from(len).map_or("null".into(), |len| {
                        String::from_utf8_lossy(&body[6..6 + len]).into_owned()
                    });
                    out.push_str(&format!("D({value})"));
                }
                b'E' => {
                    let code = body.split(|b| *b == 0).find_map(|f| f.strip_prefix(b"C"));
                    out.push_str(&format!(
                        "E({})",
                        String::from_utf8_lossy(code.unwrap_or(b""))
                    ));
                }
                b'N' | b'S' => {}
                b'Z' => out.push_str("Z "),
                t => out.push(*t as char),
            }
        }
        out
    }
}

/// Runs `rounds` through `s`, answering each with the summary of its replies; between
/// rounds, `noise` (a client of the same proxy, if any) parses, runs and closes the same
/// names with other texts, on the same server connection.
async fn run_script(
    s: &mut (impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin),
    mut noise: Option<&mut tokio::net::TcpStream>,
    rounds: &[(Vec<u8>, usize)],
) -> Vec<String> {
    use tokio::io::AsyncWriteExt;
    let mut out = Vec::new();
    for (i, (bytes, batches)) in rounds.iter().enumerate() {
        s.write_all(bytes).await.unwrap();
        let mut got = String::new();
        for _ in 0..*batches {
            got.push_str(&script::summary(&raw::read_until(s, b'Z').await));
        }
        out.push(got);
        if let Some(noise) = noise.as_deref_mut() {
            let n = ["a", "b", "c"][i % 3];
            let batch = [
                script::parse(n, 2 + i % 3),
                script::bind_execute(n, "n", false),
                script::statement(b'C', n),
                wire::sync(),
            ];
            let r = exchange(noise, batch.concat()).await;
            assert_eq!(raw::tags(&r), b"12DC3Z");
        }
    }
    out
}

/// Pipelined batches of Parse, Bind, Execute, Describe, Close and Flush of a few
/// statement names, with errors in the middle (at Parse, at Execute, names that do not
/// exist, names parsed twice), get the very replies PostgreSQL gives on a connection of
/// its own, through a transaction-mode connection shared with another client and
/// bounded to two statements (every script evicts).
#[tokio::test]
async fn pipelined_batches_with_errors_answer_as_postgresql_does() {
    use tokio::io::AsyncWriteExt;
    let p = start_proxy(&tx_config(1, "max_prepared_statements = 2\n"));
    let socket = cluster()
        .data_dir(0)
        .parent()
        .expect("the cluster's directory")
        .join(format!(".s.PGSQL.{}", node_port(0)));
    let mut differences = Vec::new();
    for seed in 0..40u64 {
        let mut state = seed.wrapping_mul(6364136223846793005) | 1;
        let mut pick = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let rounds: Vec<(Vec<u8>, usize)> = (0..8).map(|_| script::round(&mut pick)).collect();
        let mut direct = tokio::net::UnixStream::connect(&socket).await.unwrap();
        direct
            .write_all(&raw::startup(cluster().superuser().0, "app"))
            .await
            .unwrap();
        raw::read_until(&mut direct, b'Z').await;
        let expected = run_script(&mut direct, None, &rounds).await;
        let mut client = raw_login(&p).await;
        let mut noise = raw_login(&p).await;
        let got = run_script(&mut client, Some(&mut noise), &rounds).await;
        if let Some(i) = (0..rounds.len()).find(|i| expected[*i] != got[*i]) {
            differences.push(format!(
                "seed {seed}, round {i}: PostgreSQL {:?}, pgfresh {:?}",
                expected[i], got[i]
            ));
        }
    }
    assert!(differences.is_empty(), "{differences:#?}");
}

/// Clients running the same texts and their own, more than a connection keeps
/// (`max_prepared_statements = 2`), prepared and run concurrently (tokio-postgres
/// pipelines them), with an error among them, on one connection per node: each gets
/// its own statement's results, and its writes are all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_over_the_statement_bound_each_run_their_own_statements() {
    use futures_util::future::join_all;
    use tokio_postgres::error::SqlState;
    let p = start_proxy(&tx_config(1, "max_prepared_statements = 2\n"));
    let table = unique("bound");
    let admin = p.connect().await;
    admin
        .batch_execute(&format!("CREATE TABLE {table} (client int, round int)"))
        .await
        .unwrap();
    let client = |i: i32| {
        let (p, table) = (&p, &table);
        async move {
            let c = p.connect().await;
            let mut wrong = Vec::new();
            for round in 0..8i32 {
                let texts = [
                    "SELECT $1::int + 1".to_string(),
                    "SELECT $1::int + 2".to_string(),
                    format!("SELECT $1::int * 1000 + {i}"),
                ];
                let want = [round + 1, round + 2, round * 1000 + i];
                let runs = texts.iter().zip(want).map(|(text, want)| {
                    let c = &c;
                    async move {
                        let s = c.prepare(text).await.map_err(|e| e.to_string())?;
                        let v: i32 = c
                            .query_one(&s, &[&round])
                            .await
                            .map_err(|e| e.to_string())?
                            .get(0);
                        (v == want).then_some(()).ok_or(format!("{text}: {v}"))
                    }
                });
                let write = async {
                    let s = c
                        .prepare(&format!("INSERT INTO {table} VALUES ($1, $2)"))
                        .await
                        .map_err(|e| e.to_string())?;
                    c.execute(&s, &[&i, &round])
                        .await
                        .map_err(|e| e.to_string())?;
                    let s = c
                        .prepare("SELECT 1 / $1::int")
                        .await
                        .map_err(|e| e.to_string())?;
                    match c.query_one(&s, &[&0i32]).await {
                        Err(e) if e.code() == Some(&SqlState::DIVISION_BY_ZERO) => Ok(()),
                        other => Err(format!("1 / 0: {other:?}")),
                    }
                };
                let (runs, write) = tokio::join!(join_all(runs), write);
                wrong.extend(runs.into_iter().chain([write]).filter_map(Result::err));
            }
            let n: i64 = c
                .query_one(
                    &format!("SELECT count(*) FROM {table} WHERE client = $1"),
                    &[&i],
                )
                .await
                .unwrap()
                .get(0);
            if n != 8 {
                wrong.push(format!("{n} rows written"));
            }
            wrong
        }
    };
    let wrong: Vec<String> = join_all((0..8).map(client)).await.concat();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A WITH HOLD cursor keeps the client on its connection from the commit that keeps it to
/// its CLOSE (or CLOSE ALL), and no longer: the pin stayed after `CLOSE name`, and was
/// taken when the cursor never outlived its transaction (a rollback, a failed DECLARE).
#[tokio::test]
async fn a_hold_cursor_keeps_the_connection_until_it_is_closed() {
    let p = start_proxy(&tx_config(1, "query_wait_timeout_ms = 300\n"));
    let a = p.connect().await;
    let b = p.connect().await;
    // Whether B gets the primary's only connection now.
    let b_gets_it = || async {
        b.batch_execute("/* pgfresh:primary */ SELECT 1")
            .await
            .is_ok()
    };
    let mut wrong = Vec::new();
    a.batch_execute(
        "BEGIN; DECLARE tp_c CURSOR WITH HOLD FOR SELECT generate_series(1, 3); COMMIT",
    )
    .await
    .unwrap();
    if b_gets_it().await {
        wrong.push("declared and committed: B got A's connection");
    }
    for want in ["1", "2"] {
        assert_eq!(first_value(&a, "FETCH 1 FROM tp_c").await, want);
        assert_eq!(first_value(&a, "/* pgfresh:primary */ SELECT 7").await, "7");
    }
    a.batch_execute("CLOSE tp_c").await.unwrap();
    if !b_gets_it().await {
        wrong.push("closed: B waited");
    }
    // Declared in a transaction that rolled back, or not declared at all: no cursor.
    a.batch_execute("BEGIN; DECLARE tp_r CURSOR WITH HOLD FOR SELECT 1; ROLLBACK")
        .await
        .unwrap();
    if !b_gets_it().await {
        wrong.push("rolled back: B waited");
    }
    a.batch_execute("DECLARE tp_f CURSOR WITH HOLD FOR SELECT * FROM tp_no_such_table")
        .await
        .expect_err("no such table");
    if !b_gets_it().await {
        wrong.push("failed DECLARE: B waited");
    }
    // Two cursors: the connection goes back when the last one is closed.
    a.batch_execute(
        "BEGIN; DECLARE tp_x CURSOR WITH HOLD FOR SELECT 1; \
         DECLARE tp_y CURSOR WITH HOLD FOR SELECT 2; COMMIT",
    )
    .await
    .unwrap();
    a.batch_execute("CLOSE tp_x").await.unwrap();
    if b_gets_it().await {
        wrong.push("one of two closed: B got A's connection");
    }
    assert_eq!(first_value(&a, "FETCH 1 FROM tp_y").await, "2");
    a.batch_execute("CLOSE ALL").await.unwrap();
    if !b_gets_it().await {
        wrong.push("CLOSE ALL: B waited");
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// A WITH HOLD cursor lives on the node that declared it, a standby included (a read-only
/// transaction's, or an autocommit read's): its FETCH, MOVE and CLOSE go there in both pool
/// modes, whatever ran elsewhere meanwhile, and so does a read-only transaction that starts
/// with a FETCH (they went to the primary, where the session's reads go while it holds the
/// cursor, and found no cursor), over both protocols.
#[tokio::test]
async fn a_hold_cursor_is_fetched_where_it_was_declared() {
    let primary = node_port(0).to_string();
    let mut wrong = Vec::new();
    for config in [config_text(""), tx_config(POOL_SIZE, "")] {
        let p = start_proxy(&config);
        let declares = [
            (
                "BEGIN READ ONLY; SELECT 1; \
                 DECLARE tp_h CURSOR WITH HOLD FOR SELECT generate_series(1, 3); COMMIT",
                false,
            ),
            (
                "DECLARE tp_h CURSOR WITH HOLD FOR SELECT generate_series(1, 3)",
                false,
            ),
            (
                "DECLARE tp_h CURSOR WITH HOLD FOR SELECT generate_series(1, 3)",
                true,
            ),
        ];
        for (declare, extended) in declares {
            let c = p.connect().await;
            if extended {
                c.execute(declare, &[]).await.unwrap();
            } else {
                c.batch_execute(declare).await.unwrap();
            }
            let mut fetched = Vec::new();
            for fetch in ["FETCH 1 FROM tp_h", "MOVE 1 IN tp_h", "FETCH 1 FROM tp_h"] {
                // Something else runs in between, on the primary.
                first_value(&c, "/* pgfresh:primary */ SELECT 1").await;
                // The last FETCH starts a read-only transaction.
                let in_transaction = fetched.len() == 2;
                if in_transaction {
                    c.batch_execute("BEGIN READ ONLY").await.unwrap();
                }
                let got = if extended {
                    c.query(fetch, &[])
                        .await
                        .map(|rows| rows.first().map(|r| r.get::<_, i32>(0).to_string()))
                } else {
                    c.simple_query(fetch).await.map(|m| {
                        m.iter().find_map(|m| match m {
                            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                            _ => None,
                        })
                    })
                };
                fetched.push(got.map_err(|e| e.to_string()));
                if in_transaction {
                    c.batch_execute("COMMIT").await.unwrap();
                }
            }
            let closed = c
                .batch_execute("CLOSE tp_h")
                .await
                .map_err(|e| e.to_string());
            // Closed: the session's reads may leave the primary again.
            let port = first_value(&c, "SELECT inet_server_port()").await;
            let want = vec![
                Ok(Some("1".to_string())),
                Ok(None),
                Ok(Some("3".to_string())),
            ];
            if fetched != want || closed.is_err() || port == primary {
                wrong.push((declare, extended, fetched, closed, port));
            }
            // Declared in a transaction that rolled back: no cursor, nothing held.
            c.batch_execute(
                "BEGIN READ ONLY; DECLARE tp_r CURSOR WITH HOLD FOR SELECT 1; ROLLBACK",
            )
            .await
            .unwrap();
            let port = first_value(&c, "SELECT inet_server_port()").await;
            if port == primary {
                wrong.push(("rolled back", extended, Vec::new(), Ok(()), port));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "(declared, extended, fetched, closed, next read's port): {wrong:?}"
    );
}

/// `COMMIT AND CHAIN` and `ROLLBACK AND CHAIN` on the primary go on in the transaction they
/// begin: the client keeps its connection through the chain to the final COMMIT.
#[tokio::test]
async fn a_chained_transaction_keeps_its_connection() {
    let p = start_proxy(&tx_config(1, "query_wait_timeout_ms = 300\n"));
    let a = p.connect().await;
    let b = p.connect().await;
    let pid = "/* pgfresh:primary */ SELECT pg_backend_pid()";
    for (chain, extended) in [("COMMIT AND CHAIN", false), ("ROLLBACK AND CHAIN", true)] {
        a.batch_execute("BEGIN").await.unwrap();
        let before = first_value(&a, pid).await;
        if extended {
            a.execute(chain, &[]).await.unwrap();
        } else {
            a.batch_execute(chain).await.unwrap();
        }
        let err = b
            .batch_execute("/* pgfresh:primary */ SELECT 1")
            .await
            .expect_err("A holds the primary's only connection");
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
            "{chain}: {err}"
        );
        assert_eq!(
            first_value(&a, "SELECT pg_backend_pid()").await,
            before,
            "{chain}"
        );
        a.batch_execute("COMMIT").await.unwrap();
        assert_eq!(first_value(&b, "/* pgfresh:primary */ SELECT 2").await, "2");
    }
}

/// A read-only transaction chained (`COMMIT AND CHAIN`, `ROLLBACK AND CHAIN`) off a standby
/// starts anew with its first statement, here on the primary: the standby's connection goes
/// back once the chain's rollback there is answered, so the client holds one connection at
/// a time, and another client's read finds the standby's only connection free.
#[tokio::test]
async fn a_chained_transaction_moved_off_a_standby_holds_one_connection() {
    let standby = node_port(1).to_string();
    // One standby only, so that the other client's read needs its connection.
    let second = format!(
        "[[nodes]]\nname = \"pg2\"\nhost = \"127.0.0.1\"\nport = {}\n\n",
        node_port(2)
    );
    let text = tx_config(1, "query_wait_timeout_ms = 2000\n").replace(&second, "");
    assert!(!text.contains("\"pg2\""), "{text}");
    let p = start_proxy(&text);
    let admin = &console_client(&p).await;
    let a = p.connect().await;
    let b = p.connect().await;
    let t = p.cold_table(&a, "tp_chain_one").await;
    let read = format!("SELECT inet_server_port()::text FROM {t}");
    let mut wrong = Vec::new();
    for chain in ["COMMIT AND CHAIN", "ROLLBACK AND CHAIN"] {
        poll(
            "a read-only transaction on the standby",
            Duration::from_secs(60),
            || async {
                a.batch_execute("BEGIN READ ONLY").await.unwrap();
                if first_value(&a, &read).await == standby {
                    return Some(());
                }
                a.batch_execute("ROLLBACK").await.unwrap();
                None
            },
        )
        .await;
        a.batch_execute(chain).await.unwrap();
        let moved = first_value(&a, &format!("/* pgfresh:primary */ {read}")).await;
        let lent = show_servers(admin)
            .await
            .into_iter()
            .filter(|(state, _)| state == "active")
            .count();
        let other = match b.simple_query(&read).await {
            Ok(rows) => rows
                .iter()
                .find_map(|m| match m {
                    SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                    _ => None,
                })
                .unwrap_or_default(),
            Err(e) => e.as_db_error().map_or(e.to_string(), |d| {
                format!("{}: {}", d.code().code(), d.message())
            }),
        };
        a.batch_execute("COMMIT").await.unwrap();
        let got = (moved, lent, other);
        if got != (node_port(0).to_string(), 1, standby.clone()) {
            wrong.push((chain, got));
        }
    }
    assert!(
        wrong.is_empty(),
        "(chain, (chained transaction's port, connections lent, the other client's read)): \
         {wrong:?}"
    );
}
