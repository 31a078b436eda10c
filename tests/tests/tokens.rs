//! Position tokens: a session with `pgfresh.track_commit_lsn` gets each commit's position
//! (ParameterStatus `pgfresh.commit_lsn`, `SHOW pgfresh.commit_lsn`); another session —
//! here on another pgfresh, which knows nothing of the write — that carries it in
//! `pgfresh.min_lsn` (or a `pgfresh:min_lsn` comment) reads only on nodes that replayed it.

use std::time::Duration;

use pgfresh_tests::raw::msg;
use pgfresh_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

async fn simple_value(c: &tokio_postgres::Client, sql: &str) -> String {
    c.simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default()
}

fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.code().code().to_string())
        .unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

/// The token form `TLI/X/Y` with the cluster's timeline (1).
fn assert_token_form(token: &str) {
    let parts: Vec<&str> = token.split('/').collect();
    assert_eq!(parts.len(), 3, "token {token:?}");
    assert_eq!(parts[0], "1", "timeline of {token:?}");
    assert!(
        u32::from_str_radix(parts[1], 16).is_ok() && u32::from_str_radix(parts[2], 16).is_ok(),
        "token {token:?}"
    );
}

/// Read messages up to ReadyForQuery: (tags in order, ParameterStatus pairs).
async fn until_ready(s: &mut TcpStream) -> (Vec<u8>, Vec<(String, String)>) {
    let (mut tags, mut params) = (Vec::new(), Vec::new());
    loop {
        let mut head = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(30), s.read_exact(&mut head))
            .await
            .expect("answered")
            .expect("read");
        let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 4];
        s.read_exact(&mut body).await.unwrap();
        tags.push(head[0]);
        if head[0] == b'S' {
            let mut it = body.split(|b| *b == 0);
            let k = String::from_utf8_lossy(it.next().unwrap()).to_string();
            let v = String::from_utf8_lossy(it.next().unwrap()).to_string();
            params.push((k, v));
        }
        if head[0] == b'Z' {
            return (tags, params);
        }
    }
}

#[tokio::test]
async fn the_commit_position_arrives_before_the_commit_returns() {
    let p = proxy();
    let c = p.connect().await;
    let t = unique("tok_ps");
    c.batch_execute(&format!("CREATE TABLE {t}(id int)"))
        .await
        .unwrap();
    let mut s = TcpStream::connect(p.addr).await.unwrap();
    let mut body = 196608u32.to_be_bytes().to_vec();
    for w in [
        "user",
        "app_trust",
        "database",
        "app",
        "options",
        "-c pgfresh.track_commit_lsn=on",
    ] {
        body.extend_from_slice(w.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut start = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    start.extend_from_slice(&body);
    s.write_all(&start).await.unwrap();
    until_ready(&mut s).await;
    let query = |sql: &str| {
        let mut b = sql.as_bytes().to_vec();
        b.push(0);
        msg(b'Q', &b)
    };
    let mut last = String::new();
    for sql in [
        format!("INSERT INTO {t} VALUES (1)"),
        format!("BEGIN; INSERT INTO {t} VALUES (2); COMMIT"),
    ] {
        s.write_all(&query(&sql)).await.unwrap();
        let (tags, params) = until_ready(&mut s).await;
        let token = params
            .iter()
            .find(|(k, _)| k == "pgfresh.commit_lsn")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no pgfresh.commit_lsn after {sql}: {tags:?}"));
        assert_token_form(&token);
        assert_ne!(token, last, "a new position per commit");
        let s_at = tags.iter().position(|t| *t == b'S').unwrap();
        assert!(
            s_at < tags.len() - 1,
            "ParameterStatus before ReadyForQuery"
        );
        last = token;
    }
    // A read reports nothing; SHOW answers the last position.
    s.write_all(&query(&format!("SELECT count(*) FROM {t}")))
        .await
        .unwrap();
    let (_, params) = until_ready(&mut s).await;
    assert!(params.is_empty(), "{params:?}");
    s.write_all(&query("SHOW pgfresh.commit_lsn"))
        .await
        .unwrap();
    let (tags, _) = until_ready(&mut s).await;
    assert_eq!(tags, b"TDCZ");
}

/// One iteration: write through `writer` (on proxy A), take the token, read through
/// `reader` (proxy B) with the token applied by `apply`. True when the row was seen.
async fn write_then_read(
    writer: &tokio_postgres::Client,
    reader: &tokio_postgres::Client,
    t: &str,
    i: i32,
    how: &str,
) -> (bool, u16) {
    writer
        .execute(&format!("INSERT INTO {t} VALUES ($1)"), &[&i])
        .await
        .unwrap();
    let token = simple_value(writer, "SHOW pgfresh.commit_lsn").await;
    let read = format!("SELECT inet_server_port(), count(*) FROM {t} WHERE id = {i}");
    let sql = match how {
        "session" => {
            reader
                .batch_execute(&format!("SET pgfresh.min_lsn = '{token}'"))
                .await
                .unwrap();
            read
        }
        "comment" => format!("{read} /* pgfresh:min_lsn={token} */"),
        _ => read,
    };
    let row = reader.query_one(&sql, &[]).await.unwrap();
    (row.get::<_, i64>(1) == 1, row.get::<_, i32>(0) as u16)
}

#[tokio::test]
async fn a_token_carried_to_another_proxy_never_reads_stale() {
    let _g = SERIAL.lock().await;
    let a = proxy();
    let b = start_proxy(&config_text(""));
    let writer = a
        .connect_with_options("-c pgfresh.track_commit_lsn=on")
        .await;
    let t = unique("tok_x");
    writer
        .batch_execute(&format!("CREATE TABLE {t}(id int); CREATE TABLE {t}_cold(id int); INSERT INTO {t}_cold VALUES (1)"))
        .await
        .unwrap();
    wait_replicated_on(cluster(), &writer).await;
    let _delay = ApplyDelay::set(200);
    let reader = b.connect().await;
    let cold_reader = b.connect().await;
    let (mut stale, mut cold_on_replicas) = (0, 0);
    for i in 0..300 {
        let how = if i % 2 == 0 { "session" } else { "comment" };
        let (seen, _) = write_then_read(&writer, &reader, &t, i, how).await;
        stale += usize::from(!seen);
        // Reads without a token still use replicas.
        let port: i32 = cold_reader
            .query_one(&format!("SELECT inet_server_port() FROM {t}_cold"), &[])
            .await
            .unwrap()
            .get(0);
        cold_on_replicas += usize::from(port as u16 != node_port(0));
    }
    assert_eq!(stale, 0, "stale reads with a token");
    assert!(
        cold_on_replicas > 250,
        "reads without a token left the replicas: {cold_on_replicas}/300"
    );
    // Control: the same reads without a token (a session that never set one) are stale:
    // proxy B knows nothing of the writes.
    let fresh_reader = b.connect().await;
    let mut control_stale = 0;
    for i in 300..330 {
        let (seen, _) = write_then_read(&writer, &fresh_reader, &t, i, "none").await;
        control_stale += usize::from(!seen);
    }
    assert!(control_stale > 0, "the control never read stale data");
}

#[tokio::test]
async fn on_stale_error_answers_pf001_naming_the_positions() {
    let _g = SERIAL.lock().await;
    let a = proxy();
    let b = start_proxy(&config_text("on_stale = \"error\""));
    let writer = a
        .connect_with_options("-c pgfresh.track_commit_lsn=on")
        .await;
    let t = unique("tok_err");
    writer
        .batch_execute(&format!("CREATE TABLE {t}(id int)"))
        .await
        .unwrap();
    wait_replicated_on(cluster(), &writer).await;
    let _delay = ApplyDelay::set(60_000);
    writer
        .batch_execute(&format!("INSERT INTO {t} VALUES (1)"))
        .await
        .unwrap();
    let token = simple_value(&writer, "SHOW pgfresh.commit_lsn").await;
    let reader = b.connect().await;
    reader
        .batch_execute(&format!("SET pgfresh.min_lsn = '{token}'"))
        .await
        .unwrap();
    let err = reader
        .query_one(&format!("SELECT count(*) FROM {t}"), &[])
        .await
        .expect_err("no replica has the position");
    assert_eq!(sqlstate(&err), "PF001", "{err}");
    let text = err.as_db_error().unwrap().message().to_string();
    assert!(text.contains(&token), "names the required position: {text}");
    assert!(text.contains("replayed"), "{text}");
    // The session goes on; a write is not a read and is not refused.
    reader
        .batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
        .await
        .unwrap();
}

#[tokio::test]
async fn malformed_tokens_are_refused_with_a_clear_message() {
    let p = proxy();
    let c = p.connect().await;
    for sql in [
        "SET pgfresh.min_lsn = 'garbage'",
        "SET pgfresh.min_lsn = '1/2/3/4'",
        "SET pgfresh.min_lsn = 'x/0/1'",
        "SET pgfresh.track_commit_lsn = maybe",
        "SELECT 1 /* pgfresh:min_lsn=zz */",
    ] {
        let err = c.batch_execute(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&err), "22023", "{sql}: {err}");
        let text = err.as_db_error().unwrap().message().to_string();
        assert!(
            text.contains("TLI/X/Y") || text.contains("on or off"),
            "{sql}: {text}"
        );
    }
    // Extended protocol too.
    let err = c
        .execute("SET pgfresh.min_lsn = 'nope'", &[])
        .await
        .expect_err("extended SET");
    assert_eq!(sqlstate(&err), "22023", "{err}");
    // The session is unharmed and has no token.
    assert_eq!(simple_value(&c, "SELECT 1").await, "1");
    // A malformed startup option refuses the login.
    let conninfo = format!(
        "{} options='-c pgfresh.min_lsn=bad'",
        p.conninfo("app", APP_PASSWORD, "app")
    );
    let err = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .err()
        .expect("login refused");
    assert_eq!(sqlstate(&err), "22023", "{err}");
}

#[tokio::test]
async fn psql_and_psycopg_carry_tokens() {
    let _g = SERIAL.lock().await;
    let a = proxy();
    let b = start_proxy(&config_text(""));
    let writer = a.connect().await;
    let t = unique("tok_drv");
    writer
        .batch_execute(&format!("CREATE TABLE {t}(id int)"))
        .await
        .unwrap();
    wait_replicated_on(cluster(), &writer).await;
    let _delay = ApplyDelay::set(200);
    // psycopg reads the ParameterStatus right after commit() and carries it to proxy B
    // in the startup options.
    let script = format!(
        r#"
import psycopg
a = psycopg.connect("host=127.0.0.1 port={pa} user=app password={pw} dbname=app options='-c pgfresh.track_commit_lsn=on'", autocommit=False)
stale = 0
for i in range(20):
    a.execute("INSERT INTO {t} VALUES (%s)", (i,))
    a.commit()
    token = a.info.parameter_status("pgfresh.commit_lsn")
    assert token, "no token after commit"
    with psycopg.connect(f"host=127.0.0.1 port={pb} user=app password={pw} dbname=app options='-c pgfresh.min_lsn={{token}}'") as b:
        n = b.execute("SELECT count(*) FROM {t} WHERE id = %s", (i,)).fetchone()[0]
        stale += n != 1
print("stale", stale)
"#,
        pa = a.addr.port(),
        pb = b.addr.port(),
        pw = APP_PASSWORD,
    );
    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(&script)
        .output()
        .await
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "psycopg script: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("stale 0"), "{stdout}");
    // psql: the token set in the session applies to the next statements.
    for i in 100..110 {
        writer
            .batch_execute(&format!("INSERT INTO {t} VALUES ({i})"))
            .await
            .unwrap();
        let token = writer
            .query_one(
                "/* pgfresh:primary */ SELECT pg_current_wal_lsn()::text",
                &[],
            )
            .await
            .unwrap()
            .get::<_, String>(0);
        let out = tokio::process::Command::new(pg_bin("psql"))
            .envs(b.libpq_env())
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .arg("-c")
            .arg(format!("SET pgfresh.min_lsn = '1/{token}'"))
            .arg("-c")
            .arg(format!("SELECT count(*) FROM {t} WHERE id = {i}"))
            .output()
            .await
            .expect("psql");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.trim().ends_with('1'), "psql read stale: {stdout}");
    }
}

#[tokio::test]
async fn read_only_transactions_honour_the_token() {
    let _g = SERIAL.lock().await;
    let a = proxy();
    let b = start_proxy(&config_text(""));
    let writer = a
        .connect_with_options("-c pgfresh.track_commit_lsn=on")
        .await;
    let t = unique("tok_ro");
    writer
        .batch_execute(&format!(
            "CREATE TABLE {t}(id int); CREATE TABLE {t}_c(id int)"
        ))
        .await
        .unwrap();
    wait_replicated_on(cluster(), &writer).await;
    let _delay = ApplyDelay::set(200);
    let reader = b.connect().await;
    for i in 0..30 {
        writer
            .batch_execute(&format!("INSERT INTO {t} VALUES ({i})"))
            .await
            .unwrap();
        let token = simple_value(&writer, "SHOW pgfresh.commit_lsn").await;
        reader
            .batch_execute(&format!("SET pgfresh.min_lsn = '{token}'"))
            .await
            .unwrap();
        reader.batch_execute("BEGIN READ ONLY").await.unwrap();
        reader
            .batch_execute(&format!("SELECT count(*) FROM {t}_c"))
            .await
            .unwrap();
        let n: i64 = reader
            .query_one(&format!("SELECT count(*) FROM {t} WHERE id = {i}"), &[])
            .await
            .unwrap()
            .get(0);
        reader.batch_execute("COMMIT").await.unwrap();
        assert_eq!(n, 1, "a read-only transaction read older than its token");
    }
}
