//! Message flows real drivers use that the test drivers above do not: asyncpg's
//! Parse/Describe/Flush without Sync, and libpq 17's cancel sent after SSLRequest on the
//! same socket. Spoken here as raw protocol, byte for byte what those drivers send.

use std::time::Duration;

use pgfresh_tests::raw::{self, cstr, exec_params, first_value, msg, startup};
use pgfresh_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Read whole messages until one with `tag` arrives; returns (tags seen, key data if any).
async fn read_until(s: &mut TcpStream, tag: u8) -> (Vec<u8>, Option<[u8; 8]>) {
    let messages = raw::read_until(s, tag).await;
    let key = messages
        .iter()
        .find(|(t, _)| *t == b'K')
        .map(|(_, body)| body[..8].try_into().unwrap());
    (raw::tags(&messages), key)
}

async fn login() -> (TcpStream, [u8; 8]) {
    let mut s = TcpStream::connect(proxy().addr).await.unwrap();
    s.write_all(&startup("app_trust", "app")).await.unwrap();
    let (_, key) = read_until(&mut s, b'Z').await;
    (s, key.expect("BackendKeyData"))
}

#[tokio::test]
async fn parse_describe_flush_is_answered_before_any_sync() {
    let (mut s, _) = login().await;
    // Prepare the asyncpg way: Parse + Describe + Flush, then wait for the answers.
    let mut parse = cstr("__asyncpg_stmt_1__");
    parse.extend_from_slice(&cstr("SELECT $1::int + 1"));
    parse.extend_from_slice(&0u16.to_be_bytes());
    let mut describe = vec![b'S'];
    describe.extend_from_slice(&cstr("__asyncpg_stmt_1__"));
    let mut out = msg(b'P', &parse);
    out.extend(msg(b'D', &describe));
    out.extend(msg(b'H', &[]));
    s.write_all(&out).await.unwrap();
    let (tags, _) = read_until(&mut s, b'T').await;
    assert_eq!(
        tags,
        vec![b'1', b't', b'T'],
        "ParseComplete, ParameterDescription, RowDescription"
    );
    // Then Bind/Execute/Sync for the same statement.
    let mut bind = cstr("");
    bind.extend_from_slice(&cstr("__asyncpg_stmt_1__"));
    bind.extend_from_slice(&0u16.to_be_bytes()); // parameter formats: text
    bind.extend_from_slice(&1u16.to_be_bytes()); // one parameter
    bind.extend_from_slice(&2i32.to_be_bytes());
    bind.extend_from_slice(b"41");
    bind.extend_from_slice(&0u16.to_be_bytes()); // result formats: text
    let mut execute = cstr("");
    execute.extend_from_slice(&0i32.to_be_bytes());
    let mut out = msg(b'B', &bind);
    out.extend(msg(b'E', &execute));
    out.extend(msg(b'S', &[]));
    s.write_all(&out).await.unwrap();
    let (tags, _) = read_until(&mut s, b'Z').await;
    assert_eq!(
        tags,
        vec![b'2', b'D', b'C', b'Z'],
        "BindComplete, DataRow, CommandComplete, ReadyForQuery"
    );
}

#[tokio::test]
async fn cancel_after_ssl_request_on_the_same_socket() {
    let (mut s, key) = login().await;
    s.write_all(&msg(b'Q', &cstr("SELECT pg_sleep(60)")))
        .await
        .unwrap();
    // libpq 17 (cancel_safe) and asyncpg: SSLRequest, 'N', then CancelRequest on that socket.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let mut c = TcpStream::connect(proxy().addr).await.unwrap();
        let mut ssl = 8u32.to_be_bytes().to_vec();
        ssl.extend_from_slice(&80_877_103u32.to_be_bytes());
        c.write_all(&ssl).await.unwrap();
        let mut n = [0u8; 1];
        c.read_exact(&mut n).await.unwrap();
        assert_eq!(n[0], b'N');
        let mut cancel = 16u32.to_be_bytes().to_vec();
        cancel.extend_from_slice(&80_877_102u32.to_be_bytes());
        cancel.extend_from_slice(&key);
        c.write_all(&cancel).await.unwrap();
        // The query ends with 57014 once the cancel reaches it (retry: it may not be running yet).
        match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {
                reply.extend_from_slice(&buf[..n]);
                break;
            }
            _ => assert!(
                std::time::Instant::now() < deadline,
                "the cancel never arrived"
            ),
        }
    }
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("57014"), "{text}");
}

/// libpq's `PQprepare(conn, "", sql, …)` once, then `PQexecPrepared(conn, "", …)` again
/// and again: the unnamed statement lives on the server until the next Parse of it or the
/// next simple Query. pgfresh's own queries in the same write (the position probe after
/// a write, a replay sample after a read) are simple queries, so they destroy it too: the
/// next execution must still find it (prepared again first), and the client must never see
/// pgfresh's work in its statement's place.
#[tokio::test]
async fn the_unnamed_statement_survives_pgfresh_own_queries() {
    let (mut s, _) = login().await;
    let table = format!("unnamed_{}", std::process::id());
    s.write_all(&msg(b'Q', &cstr(&format!("CREATE TABLE {table} (v int)"))))
        .await
        .unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0.last(), Some(&b'Z'));
    let mut parse = cstr("");
    parse.extend_from_slice(&cstr(&format!("INSERT INTO {table} VALUES ($1::int)")));
    parse.extend_from_slice(&0u16.to_be_bytes());
    let mut out = msg(b'P', &parse);
    out.extend(msg(b'S', &[]));
    s.write_all(&out).await.unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"1Z");
    // Every execution is an autocommit write, so pgfresh follows each one with its
    // position probe.
    for i in 1..=3 {
        s.write_all(&exec_named("", &i.to_string())).await.unwrap();
        let (tags, error, _) = replies(&mut s).await;
        assert_eq!(
            tags, b"2CZ",
            "execution {i} of the unnamed statement: {error:?}"
        );
    }
    s.write_all(&msg(
        b'Q',
        &cstr(&format!("SELECT count(*) FROM {table}; DROP TABLE {table}")),
    ))
    .await
    .unwrap();
    let messages = raw::read_until(&mut s, b'Z').await;
    let row = messages.iter().find(|(t, _)| *t == b'D').expect("a row");
    assert_eq!(&row.1[6..], b"3", "three rows inserted");
}

/// The same with `resolve_lost_commits`: a COMMIT run from the unnamed statement gets
/// pgfresh's transaction-id probe (a simple Query) in front of it in the same write, so
/// the statement must be prepared again between the two, or the COMMIT fails and the
/// transaction is lost.
#[tokio::test]
async fn a_commit_from_the_unnamed_statement_survives_the_transaction_id_probe() {
    let p = start_proxy(&config_text("resolve_lost_commits = true"));
    let mut s = TcpStream::connect(p.addr).await.unwrap();
    s.write_all(&startup("app_trust", "app")).await.unwrap();
    read_until(&mut s, b'Z').await;
    let table = format!("unnamed_commit_{}", std::process::id());
    let run = |sql: String| msg(b'Q', &cstr(&sql));
    s.write_all(&run(format!("CREATE TABLE {table} (v int)")))
        .await
        .unwrap();
    read_until(&mut s, b'Z').await;
    // PQprepare(conn, "", "COMMIT"), then a transaction made of named statements only.
    let parse = |name: &str, sql: &str| {
        let mut body = cstr(name);
        body.extend_from_slice(&cstr(sql));
        body.extend_from_slice(&0u16.to_be_bytes());
        msg(b'P', &body)
    };
    let mut out = parse("", "COMMIT");
    out.extend(msg(b'S', &[]));
    s.write_all(&out).await.unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"1Z");
    for (name, sql) in [
        ("b", "BEGIN".to_string()),
        ("i", format!("INSERT INTO {table} VALUES (1)")),
    ] {
        let mut out = parse(name, &sql);
        let mut bind = cstr("");
        bind.extend_from_slice(&cstr(name));
        bind.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        out.extend(msg(b'B', &bind));
        out.extend(msg(b'E', &[0, 0, 0, 0, 0]));
        out.extend(msg(b'S', &[]));
        s.write_all(&out).await.unwrap();
        assert_eq!(read_until(&mut s, b'Z').await.0, b"12CZ", "{sql}");
    }
    // PQexecPrepared(conn, "", …): the COMMIT.
    let mut bind = cstr("");
    bind.extend_from_slice(&cstr(""));
    bind.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    let mut out = msg(b'B', &bind);
    out.extend(msg(b'E', &[0, 0, 0, 0, 0]));
    out.extend(msg(b'S', &[]));
    s.write_all(&out).await.unwrap();
    let messages = raw::read_until(&mut s, b'Z').await;
    let error = messages
        .iter()
        .find(|(t, _)| *t == b'E')
        .map(|(_, body)| String::from_utf8_lossy(body).replace('\0', " "));
    assert_eq!(raw::tags(&messages), b"2CZ", "the COMMIT: {error:?}");
    let count = cluster()
        .psql(0, "app", &format!("SELECT count(*) FROM {table}"))
        .expect("count on the primary");
    assert_eq!(count, "1", "the transaction committed");
    cluster()
        .psql(0, "app", &format!("DROP TABLE {table}"))
        .expect("drop");
}

/// The batch of `raw::exec_params`: pgfresh takes it whole, as one chunk, when all of it
/// has arrived, and frame by frame otherwise (or when its statement changes the session,
/// or it is over the batch limit). Either way the client
/// gets the same answers: writes are marked (the next read sees them), the unnamed
/// statement it parsed can be bound again on its own, an error at Execute ends the batch
/// at its Sync, and a setting made through it follows the session.
#[tokio::test]
async fn the_usual_unnamed_batch_is_answered_alike_whole_or_in_pieces() {
    let (mut s, _) = login().await;
    let table = format!("whole_batch_{}", std::process::id());
    s.write_all(&msg(b'Q', &cstr(&format!("CREATE TABLE {table} (v int)"))))
        .await
        .unwrap();
    read_until(&mut s, b'Z').await;
    let insert = format!("INSERT INTO {table} VALUES ($1::int)");
    // Whole, in one write.
    s.write_all(&exec_params(&insert, &["1"])).await.unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"12nCZ");
    // The same batch in two writes, Parse and Bind first: taken whole or frame by frame,
    // as the session happens to read them, with the same answers.
    let batch = exec_params(&insert, &["2"]);
    let bind_end = {
        let parse_len = 1 + u32::from_be_bytes(batch[1..5].try_into().unwrap()) as usize;
        parse_len
            + 1
            + u32::from_be_bytes(batch[parse_len + 1..parse_len + 5].try_into().unwrap()) as usize
    };
    s.write_all(&batch[..bind_end]).await.unwrap();
    s.flush().await.unwrap();
    s.write_all(&batch[bind_end..]).await.unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"12nCZ");
    // Every write is seen by the next read, through a whole batch too.
    let count = format!("SELECT count(*) FROM {table} WHERE v > $1");
    s.write_all(&exec_params(&count, &["0"])).await.unwrap();
    let messages = raw::read_until(&mut s, b'Z').await;
    assert_eq!(raw::tags(&messages), b"12TDCZ");
    assert_eq!(first_value(&messages), "2");
    // The unnamed statement a whole batch parsed, bound again on its own: that read runs
    // again (a read of no table, on a standby), not the INSERT the session parsed before.
    s.write_all(&exec_params("SELECT $1::int + 1", &["1"]))
        .await
        .unwrap();
    assert_eq!(first_value(&raw::read_until(&mut s, b'Z').await), "2");
    s.write_all(&exec_named("", "2")).await.unwrap();
    let messages = raw::read_until(&mut s, b'Z').await;
    assert_eq!(raw::tags(&messages), b"2DCZ");
    assert_eq!(first_value(&messages), "3");
    // And again in place of the read's: it is the INSERT that runs, where the INSERT must
    // run.
    s.write_all(&exec_params(&insert, &["3"])).await.unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"12nCZ");
    s.write_all(&exec_named("", "4")).await.unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"2CZ");
    s.write_all(&exec_params(&count, &["0"])).await.unwrap();
    assert_eq!(first_value(&raw::read_until(&mut s, b'Z').await), "4");
    // An error at Execute: the batch ends at its Sync, and the next one runs.
    let divide = format!("SELECT 1 / (count(*) - count(*))::int FROM {table} WHERE v > $1");
    s.write_all(&exec_params(&divide, &["0"])).await.unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"12TEZ");
    // A setting through the same batch shape goes frame by frame and follows the session.
    s.write_all(&exec_params("SET application_name = 'whole_batch'", &[]))
        .await
        .unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"12nCSZ");
    s.write_all(&exec_params(
        "SELECT current_setting($1)",
        &["application_name"],
    ))
    .await
    .unwrap();
    let messages = raw::read_until(&mut s, b'Z').await;
    assert_eq!(first_value(&messages), "whole_batch");
    // Over the batch limit (1 MiB) the same shape is never taken whole: frame by frame,
    // sent on before its Sync, and answered alike.
    let big = "x".repeat(1_200_000);
    s.write_all(&exec_params("SELECT length($1::text)", &[&big]))
        .await
        .unwrap();
    let messages = raw::read_until(&mut s, b'Z').await;
    assert_eq!(raw::tags(&messages), b"12TDCZ");
    assert_eq!(first_value(&messages), "1200000");
    s.write_all(&msg(b'Q', &cstr(&format!("DROP TABLE {table}"))))
        .await
        .unwrap();
    read_until(&mut s, b'Z').await;
}

/// A proxy in front of the primary and one standby only, so that every read goes to the
/// same standby and a statement prepared on the primary is missing there; `pool` is TOML
/// for its `[pool]` table.
fn one_standby_proxy(pool: &str) -> ProxyHandle {
    let c = cluster();
    let third = format!(
        "[[nodes]]\nname = \"pg2\"\nhost = \"127.0.0.1\"\nport = {}\n\n",
        c.nodes()[2].port
    );
    let text = config_text("");
    assert!(text.contains(&third), "the config names the third node");
    start_proxy(&format!("{}\n[pool]\n{pool}\n", text.replace(&third, "")))
}

/// Both pool modes; transaction mode with one connection a node, so each unit of the
/// session lands on the connection the one before it used on that node.
const MODES: [&str; 2] = [
    "pool_mode = \"session\"",
    "pool_mode = \"transaction\"\npool_size = 1",
];

fn parse_named(name: &str, sql: &str) -> Vec<u8> {
    let mut body = cstr(name);
    body.extend_from_slice(&cstr(sql));
    body.extend_from_slice(&0u16.to_be_bytes());
    msg(b'P', &body)
}

/// Bind of statement `name` to the unnamed portal with one text parameter, Execute, Sync
/// (for the unnamed statement: `PQexecPrepared(conn, "", …)`).
fn exec_named(name: &str, value: &str) -> Vec<u8> {
    let mut out = raw::bind(name, &[value]);
    out.extend(raw::execute());
    out.extend(msg(b'S', &[]));
    out
}

/// A session on `p` with its own table, and statement `name` (a read of no table, its
/// text named after it: transaction mode shares a text between names) prepared on the
/// primary by a batch that also writes the table, so that pgfresh must
/// prepare it again before the standby can run it. Returns the session and the table.
async fn prepared_on_primary(p: &ProxyHandle, name: &str) -> (TcpStream, String) {
    let mut s = raw::connect(p.addr).await;
    let table = unique("pipeline");
    s.write_all(&msg(b'Q', &cstr(&format!("CREATE TABLE {table} (v int)"))))
        .await
        .unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"CZ");
    let mut out = parse_named(name, &format!("SELECT $1::int + 1 AS {name}"));
    out.extend(raw::exec_params(
        &format!("INSERT INTO {table} VALUES ($1::int)"),
        &["1"],
    ));
    s.write_all(&out).await.unwrap();
    assert_eq!(
        read_until(&mut s, b'Z').await.0,
        b"112nCZ",
        "prepared with a write"
    );
    (s, table)
}

async fn drop_table(s: &mut TcpStream, table: &str) {
    s.write_all(&msg(b'Q', &cstr(&format!("DROP TABLE {table}"))))
        .await
        .unwrap();
    assert_eq!(read_until(s, b'Z').await.0, b"CZ");
}

/// The tags of the replies up to ReadyForQuery, with the first error's text.
async fn replies(s: &mut TcpStream) -> (Vec<u8>, Option<String>, Vec<(u8, Vec<u8>)>) {
    let messages = raw::read_until(s, b'Z').await;
    let error = messages
        .iter()
        .find(|(t, _)| *t == b'E')
        .map(|(_, body)| String::from_utf8_lossy(body).replace('\0', " "));
    (raw::tags(&messages), error, messages)
}

/// A pipeline left open by a Flush and continued in the same write: the replies of the
/// first part reach the client first, in order, even when the second part needs a
/// statement pgfresh prepares again (its ParseComplete is the one to swallow, not the
/// client's).
#[tokio::test]
async fn a_statement_prepared_again_inside_a_pipeline_keeps_the_replies_in_order() {
    for mode in MODES {
        let p = one_standby_proxy(mode);
        let (mut s, table) = prepared_on_primary(&p, "pipe_a").await;
        // A read on the standby: Parse and Describe of a new statement, Flush, then the
        // statement prepared on the primary, all sent before any reply.
        let mut out = parse_named("pipe_b", "SELECT 2");
        let mut describe = vec![b'S'];
        describe.extend_from_slice(&cstr("pipe_b"));
        out.extend(msg(b'D', &describe));
        out.extend(msg(b'H', &[]));
        out.extend(exec_named("pipe_a", "41"));
        s.write_all(&out).await.unwrap();
        let (tags, error, messages) = replies(&mut s).await;
        assert_eq!(
            tags, b"1tT2DCZ",
            "{mode}: ParseComplete, descriptions, then the execution ({error:?})"
        );
        assert_eq!(first_value(&messages), "42");
        drop_table(&mut s, &table).await;
    }
}

/// The same pipeline whose first part fails: the server skips everything up to the Sync,
/// the statement pgfresh put in front of the second part too, so the connection does not
/// have it, and the next execution must prepare it again rather than fail with 26000.
/// The second part is sent with the first, or once the error has arrived.
#[tokio::test]
async fn a_statement_prepared_again_behind_a_failed_message_is_prepared_again_next_time() {
    for mode in MODES {
        let p = one_standby_proxy(mode);
        for after_the_error in [false, true] {
            let name = format!("skip_{after_the_error}");
            let (mut s, table) = prepared_on_primary(&p, &name).await;
            let mut out = parse_named("", "SELECT * FROM no_such_table_for_pipelines");
            out.extend(msg(b'H', &[]));
            if after_the_error {
                s.write_all(&out).await.unwrap();
                assert_eq!(read_until(&mut s, b'E').await.0, b"E", "{mode}");
                s.write_all(&exec_named(&name, "1")).await.unwrap();
                assert_eq!(read_until(&mut s, b'Z').await.0, b"Z", "{mode}");
            } else {
                out.extend(exec_named(&name, "1"));
                s.write_all(&out).await.unwrap();
                assert_eq!(read_until(&mut s, b'Z').await.0, b"EZ", "{mode}");
            }
            s.write_all(&exec_named(&name, "41")).await.unwrap();
            let (tags, error, messages) = replies(&mut s).await;
            assert_eq!(
                tags, b"2DCZ",
                "{mode}, sent after the error: {after_the_error} ({error:?})"
            );
            assert_eq!(first_value(&messages), "42");
            drop_table(&mut s, &table).await;
        }
    }
}

/// After an error the server skips every message up to the Sync and answers none of
/// them: a Close of the client's statement in a continuation sent after the error gets
/// no CloseComplete (transaction mode answers a client's Close itself), and the
/// statement, never closed, still runs.
#[tokio::test]
async fn a_close_after_an_error_in_a_pipeline_is_skipped_like_the_server_skips_it() {
    for mode in MODES {
        let p = one_standby_proxy(mode);
        let mut s = raw::connect(p.addr).await;
        let mut out = parse_named("kept", "SELECT $1::int + 1 AS kept");
        out.extend(msg(b'S', &[]));
        s.write_all(&out).await.unwrap();
        assert_eq!(read_until(&mut s, b'Z').await.0, b"1Z", "{mode}");
        let mut out = parse_named("", "SELECT * FROM no_such_table_for_pipelines");
        out.extend(msg(b'H', &[]));
        s.write_all(&out).await.unwrap();
        assert_eq!(read_until(&mut s, b'E').await.0, b"E", "{mode}");
        let mut close = vec![b'S'];
        close.extend_from_slice(&cstr("kept"));
        let mut out = msg(b'C', &close);
        out.extend(msg(b'S', &[]));
        s.write_all(&out).await.unwrap();
        assert_eq!(
            read_until(&mut s, b'Z').await.0,
            b"Z",
            "{mode}: nothing but the Sync's"
        );
        s.write_all(&exec_named("kept", "41")).await.unwrap();
        let (tags, error, messages) = replies(&mut s).await;
        assert_eq!(tags, b"2DCZ", "{mode}: {error:?}");
        assert_eq!(first_value(&messages), "42");
    }
}

/// A Parse and a Close the server skipped after an error never happened for the client
/// either: a statement whose Parse was skipped does not exist (its execution fails with
/// 26000, as PostgreSQL answers, even where pgfresh would have to prepare it first), and
/// one whose Close was skipped still runs, on any node.
#[tokio::test]
async fn a_parse_or_close_skipped_after_an_error_is_taken_back() {
    for mode in MODES {
        let p = one_standby_proxy(mode);
        // Prepared on the primary only (with a write), so that it runs on the standby only
        // once pgfresh prepares it there.
        let (mut s, table) = prepared_on_primary(&p, "closed_in_vain").await;
        let failing = || {
            let mut out = parse_named("", "SELECT * FROM no_such_table_for_pipelines");
            out.extend(msg(b'H', &[]));
            out
        };
        // A Parse of a write skipped on the standby: the write, run where writes run, finds
        // no statement.
        let mut out = failing();
        out.extend(parse_named(
            "never_parsed",
            &format!("INSERT INTO {table} VALUES ($1::int)"),
        ));
        out.extend(msg(b'S', &[]));
        s.write_all(&out).await.unwrap();
        assert_eq!(read_until(&mut s, b'Z').await.0, b"EZ", "{mode}");
        s.write_all(&exec_named("never_parsed", "7")).await.unwrap();
        let (tags, error, _) = replies(&mut s).await;
        assert_eq!(tags, b"EZ", "{mode}: {error:?}");
        assert!(
            error.as_deref().is_some_and(|e| e.contains("C26000")),
            "{mode}: {error:?}"
        );
        // A Close skipped on the standby: the statement still runs there.
        let mut close = vec![b'S'];
        close.extend_from_slice(&cstr("closed_in_vain"));
        let mut out = failing();
        out.extend(msg(b'C', &close));
        out.extend(msg(b'S', &[]));
        s.write_all(&out).await.unwrap();
        assert_eq!(read_until(&mut s, b'Z').await.0, b"EZ", "{mode}");
        s.write_all(&exec_named("closed_in_vain", "41"))
            .await
            .unwrap();
        let (tags, error, messages) = replies(&mut s).await;
        assert_eq!(tags, b"2DCZ", "{mode}: {error:?}");
        assert_eq!(first_value(&messages), "42");
        drop_table(&mut s, &table).await;
    }
}

/// Transaction mode keeps at most `max_prepared_statements` on a connection, closing the
/// least recently used first. A Close pgfresh puts in front of a continuation sent after an
/// error is skipped with the rest: the statement stays on the connection, and pgfresh still
/// counts it, so the bound holds.
#[tokio::test]
async fn an_eviction_skipped_after_an_error_leaves_the_statement_counted() {
    let p = one_standby_proxy(
        "pool_mode = \"transaction\"\npool_size = 1\nmax_prepared_statements = 2",
    );
    let mut s = raw::connect(p.addr).await;
    // Everything on the primary's one connection, where the catalog read at the end runs.
    let stmt = |name: &str| format!("/* pgfresh:primary */ SELECT $1::int + 1 AS {name}");
    // Two statements: the bound.
    for name in ["evict_a", "evict_b"] {
        let mut out = parse_named(name, &stmt(name));
        out.extend(msg(b'S', &[]));
        s.write_all(&out).await.unwrap();
        assert_eq!(read_until(&mut s, b'Z').await.0, b"1Z");
    }
    // A third, in a continuation sent after an error: pgfresh closes the oldest first,
    // and the server skips that Close and the Parse.
    let mut out = parse_named(
        "",
        "/* pgfresh:primary */ SELECT * FROM no_such_table_for_pipelines",
    );
    out.extend(msg(b'H', &[]));
    s.write_all(&out).await.unwrap();
    assert_eq!(read_until(&mut s, b'E').await.0, b"E");
    let mut out = parse_named("evict_c", &stmt("evict_c"));
    out.extend(msg(b'S', &[]));
    s.write_all(&out).await.unwrap();
    assert_eq!(read_until(&mut s, b'Z').await.0, b"Z");
    // Then the third again, and a fourth: each closes what it must to stay within two.
    for name in ["evict_c", "evict_d"] {
        let mut out = parse_named(name, &stmt(name));
        out.extend(msg(b'S', &[]));
        s.write_all(&out).await.unwrap();
        assert_eq!(read_until(&mut s, b'Z').await.0, b"1Z", "{name}");
    }
    s.write_all(&raw::exec_params(
        "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE $1",
        &["\\_\\_pgfresh\\_%"],
    ))
    .await
    .unwrap();
    let messages = raw::read_until(&mut s, b'Z').await;
    assert_eq!(first_value(&messages), "2", "statements on the connection");
}

/// The CommandComplete tag and the ReadyForQuery status among `messages`.
fn tag_and_status(messages: &[(u8, Vec<u8>)]) -> (String, u8) {
    let Some((_, tag)) = messages.iter().find(|(t, _)| *t == b'C') else {
        panic!("no CommandComplete in {messages:?}");
    };
    let (_, status) = messages
        .iter()
        .find(|(t, _)| *t == b'Z')
        .expect("ReadyForQuery");
    (
        String::from_utf8_lossy(tag.strip_suffix(b"\0").unwrap_or(tag)).into_owned(),
        status[0],
    )
}

/// Runs `sql` through `s` as the unnamed one-statement batch (as pgbench `-M extended`
/// sends BEGIN and COMMIT), or as a simple Query; returns what came back.
async fn run(s: &mut TcpStream, sql: &str, extended: bool) -> Vec<(u8, Vec<u8>)> {
    let bytes = if extended {
        exec_params(sql, &[])
    } else {
        msg(b'Q', &cstr(sql))
    };
    s.write_all(&bytes).await.unwrap();
    raw::read_until(s, b'Z').await
}

/// The unnamed batch of `sql` the way tokio-postgres' `query_typed` sends it: Parse, Bind,
/// Describe of the statement, Execute, Sync.
fn describe_statement_batch(sql: &str) -> Vec<u8> {
    raw::unnamed_batch(sql, &[], b'S')
}

/// Backends on the primary in a transaction for the session named `name`.
fn open_transactions(name: &str) -> String {
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = '{name}' AND xact_start IS NOT NULL"
            ),
        )
        .unwrap()
}

/// BEGIN reaches no server until the transaction's first statement, in the extended
/// protocol as in the simple one: pgfresh answers it message by message as the server
/// would, sends it just ahead of that statement (which a ROLLBACK then undoes), and
/// answers the COMMIT or ROLLBACK of a transaction no server has seen, AND CHAIN
/// included, leaving the client in the new transaction.
#[tokio::test]
async fn begin_waits_for_the_transaction_s_first_statement_in_both_protocols() {
    let table = format!("deferred_begin_{}", std::process::id());
    cluster()
        .psql(
            0,
            "app",
            &format!("CREATE TABLE {table} (v int); GRANT ALL ON {table} TO PUBLIC"),
        )
        .unwrap();
    // Counted on a standby too: it has the table before the first count.
    for i in 1..cluster().nodes().len() {
        cluster()
            .wait_caught_up(i, Duration::from_secs(30))
            .expect("standby caught up");
    }
    for mode in MODES {
        let p = start_proxy(&format!("{}\n[pool]\n{mode}\n", config_text("")));
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        s.write_all(&startup("app_trust", "app")).await.unwrap();
        read_until(&mut s, b'Z').await;
        for extended in [true, false] {
            let name = format!("deferred_{}_{extended}", mode.len());
            run(&mut s, &format!("SET application_name = '{name}'"), false).await;
            let shape: &[u8] = if extended { b"12nCZ" } else { b"CZ" };
            let what = format!("{mode}, extended {extended}");
            // BEGIN: answered here, and no server is in a transaction for it.
            let begin = run(&mut s, "BEGIN", extended).await;
            assert_eq!(raw::tags(&begin), shape, "{what}");
            assert_eq!(tag_and_status(&begin), ("BEGIN".into(), b'T'), "{what}");
            assert_eq!(
                open_transactions(&name),
                "0",
                "{what}: BEGIN went to a server"
            );
            // The first statement takes it along; a ROLLBACK undoes what it wrote.
            let insert = format!("INSERT INTO {table} VALUES (1)");
            let count_rows = format!("SELECT count(*) FROM {table}");
            let inserted = run(&mut s, &insert, extended).await;
            assert_eq!(
                tag_and_status(&inserted),
                ("INSERT 0 1".into(), b'T'),
                "{what}"
            );
            assert_eq!(open_transactions(&name), "1", "{what}");
            let rolled = run(&mut s, "ROLLBACK", extended).await;
            assert_eq!(tag_and_status(&rolled), ("ROLLBACK".into(), b'I'), "{what}");
            let count = run(&mut s, &count_rows, extended).await;
            assert_eq!(
                first_value(&count),
                "0",
                "{what}: the INSERT was not undone"
            );
            // A transaction that ran nothing ends here too, without the server's warning.
            run(&mut s, "BEGIN", extended).await;
            let commit = run(&mut s, "COMMIT", extended).await;
            assert_eq!(raw::tags(&commit), shape, "{what}");
            assert_eq!(tag_and_status(&commit), ("COMMIT".into(), b'I'), "{what}");
            // AND CHAIN starts the next transaction at once: the client is in it, and
            // what it writes is undone by its ROLLBACK.
            run(&mut s, "BEGIN", extended).await;
            let chained = run(&mut s, "COMMIT AND CHAIN", extended).await;
            assert_eq!(tag_and_status(&chained), ("COMMIT".into(), b'T'), "{what}");
            run(&mut s, &insert, extended).await;
            let rolled = run(&mut s, "ROLLBACK AND CHAIN", extended).await;
            assert_eq!(tag_and_status(&rolled), ("ROLLBACK".into(), b'T'), "{what}");
            run(&mut s, &insert, extended).await;
            let rolled = run(&mut s, "ROLLBACK", extended).await;
            assert_eq!(tag_and_status(&rolled), ("ROLLBACK".into(), b'I'), "{what}");
            let count = run(&mut s, &count_rows, extended).await;
            assert_eq!(
                first_value(&count),
                "0",
                "{what}: a chained transaction was none"
            );
            assert_eq!(open_transactions(&name), "0", "{what}");
        }
        // tokio-postgres' query_typed describes the statement rather than the portal: a
        // ParameterDescription of none comes before the NoData, as from the server.
        let name = format!("deferred_{}_typed", mode.len());
        run(&mut s, &format!("SET application_name = '{name}'"), false).await;
        for (sql, tag, status) in [("BEGIN", "BEGIN", b'T'), ("COMMIT", "COMMIT", b'I')] {
            s.write_all(&describe_statement_batch(sql)).await.unwrap();
            let replies = raw::read_until(&mut s, b'Z').await;
            assert_eq!(raw::tags(&replies), b"12tnCZ", "{mode}: {sql}");
            assert_eq!(tag_and_status(&replies), (tag.into(), status), "{mode}");
            assert_eq!(
                open_transactions(&name),
                "0",
                "{mode}: {sql} went to a server"
            );
        }
    }
    cluster()
        .psql(0, "app", &format!("DROP TABLE {table}"))
        .unwrap();
}
