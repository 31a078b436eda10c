//! Bad input gets a clear error and disturbs nobody: malformed lengths, unknown
//! message types, garbage before startup, clients vanishing mid-message. A healthy
//! session runs alongside every case and must be unaffected.

use std::time::Duration;

use pgfresh_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Read everything the proxy sends until it closes the connection (bounded).
async fn read_until_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!("proxy neither answered nor closed; got {out:?}"),
        }
    }
}

/// The SQLSTATE of the first ErrorResponse in `bytes`.
fn sqlstate(bytes: &[u8]) -> Option<String> {
    let mut i = 0;
    while i + 5 <= bytes.len() {
        let tag = bytes[i];
        let len = u32::from_be_bytes(bytes[i + 1..i + 5].try_into().ok()?) as usize;
        let body = bytes.get(i + 5..i + 1 + len)?;
        if tag == b'E' {
            let mut fields = body.split(|b| *b == 0);
            for f in fields.by_ref() {
                if f.first() == Some(&b'C') {
                    return Some(String::from_utf8_lossy(&f[1..]).to_string());
                }
            }
        }
        i += 1 + len;
    }
    None
}

fn startup_packet(user: &str, db: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&196608u32.to_be_bytes());
    for (k, v) in [("user", user), ("database", db)] {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut pkt = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    pkt.extend_from_slice(&body);
    pkt
}

/// A raw connection logged in as the trust user (no password exchange needed).
async fn logged_in() -> TcpStream {
    logged_in_to(proxy()).await
}

/// A raw connection to `p` logged in as the trust user.
async fn logged_in_to(p: &ProxyHandle) -> TcpStream {
    let mut s = TcpStream::connect(p.addr).await.unwrap();
    s.write_all(&startup_packet("app_trust", "app"))
        .await
        .unwrap();
    // Read until ReadyForQuery.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(6).any(|w| w == [b'Z', 0, 0, 0, 5, b'I']) {
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed during login: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    s
}

async fn healthy_session_still_works(c: &tokio_postgres::Client) {
    let v: i32 = c.query_one("SELECT 40 + 2", &[]).await.unwrap().get(0);
    assert_eq!(v, 42);
}

#[tokio::test]
async fn startup_garbage_and_bad_lengths() {
    let healthy = proxy().connect().await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("length below 8", vec![0, 0, 0, 3, 1, 2, 3, 4]),
        ("length over the startup max", {
            let mut v = 1_000_000u32.to_be_bytes().to_vec();
            v.extend_from_slice(&196608u32.to_be_bytes());
            v
        }),
        (
            "HTTP instead of PostgreSQL",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        ("protocol 2", {
            let mut v = 8u32.to_be_bytes().to_vec();
            v.extend_from_slice(&0x0002_0000u32.to_be_bytes());
            v
        }),
        ("unknown request code", {
            let mut v = 8u32.to_be_bytes().to_vec();
            v.extend_from_slice(&80_877_199u32.to_be_bytes());
            v
        }),
    ];
    for (what, bytes) in cases {
        let mut s = TcpStream::connect(proxy().addr).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        let reply = read_until_close(&mut s).await;
        assert_eq!(
            sqlstate(&reply).as_deref(),
            Some("08P01"),
            "{what}: {reply:?}"
        );
        healthy_session_still_works(&healthy).await;
    }
}

#[tokio::test]
async fn ssl_and_gss_requests_are_refused_on_the_same_socket() {
    let mut s = TcpStream::connect(proxy().addr).await.unwrap();
    for code in [80_877_103u32, 80_877_104u32] {
        let mut v = 8u32.to_be_bytes().to_vec();
        v.extend_from_slice(&code.to_be_bytes());
        s.write_all(&v).await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        assert_eq!(b[0], b'N');
    }
    s.write_all(&startup_packet("app_trust", "app"))
        .await
        .unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();
    assert_eq!(b[0], b'R', "login continues after the refusals");
}

#[tokio::test]
async fn bad_messages_after_login() {
    let healthy = proxy().connect().await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("length below 4", vec![b'Q', 0, 0, 0, 2]),
        ("length over the max", {
            let mut v = vec![b'Q'];
            v.extend_from_slice(&0x7fff_fff0u32.to_be_bytes());
            v
        }),
        ("unknown message type", vec![b'!', 0, 0, 0, 4]),
        (
            "query without terminator",
            vec![b'Q', 0, 0, 0, 7, b'a', b'b', b'c'],
        ),
        ("password message after login", vec![b'p', 0, 0, 0, 5, 0]),
    ];
    for (what, bytes) in cases {
        let mut s = logged_in().await;
        s.write_all(&bytes).await.unwrap();
        let reply = read_until_close(&mut s).await;
        assert_eq!(
            sqlstate(&reply).as_deref(),
            Some("08P01"),
            "{what}: {reply:?}"
        );
        healthy_session_still_works(&healthy).await;
    }
}

#[tokio::test]
async fn clients_vanishing_mid_message_disturb_nobody() {
    let healthy = proxy().connect().await;
    // Mid-startup.
    let mut s = TcpStream::connect(proxy().addr).await.unwrap();
    s.write_all(&startup_packet("app", "app")[..10])
        .await
        .unwrap();
    drop(s);
    // Mid-message after login, and mid-query (the server is still answering).
    let mut s = logged_in().await;
    s.write_all(&[b'Q', 0, 0, 0, 100, b'S', b'E'])
        .await
        .unwrap();
    drop(s);
    let mut s = logged_in().await;
    let q = b"SELECT pg_sleep(0.2), g FROM generate_series(1, 100000) g\0";
    let mut msg = vec![b'Q'];
    msg.extend_from_slice(&((q.len() + 4) as u32).to_be_bytes());
    msg.extend_from_slice(q);
    s.write_all(&msg).await.unwrap();
    drop(s);
    // Never finishing the startup: dropped after the login timeout with a clear error.
    let mut s = TcpStream::connect(proxy().addr).await.unwrap();
    s.write_all(&[0, 0]).await.unwrap();
    let reply = read_until_close(&mut s).await;
    assert_eq!(
        sqlstate(&reply).as_deref(),
        Some("08P01"),
        "login timeout: {reply:?}"
    );
    healthy_session_still_works(&healthy).await;
    // The pool recovered its connections: many new sessions still work.
    for _ in 0..5 {
        let c = proxy().connect().await;
        healthy_session_still_works(&c).await;
    }
}

#[tokio::test]
async fn unparseable_sql_goes_to_the_primary_and_errors_normally() {
    let c = proxy().connect().await;
    let err = c.simple_query("SELEC 1").await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "42601");
    let err = c.simple_query("SELECT 'unterminated").await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "42601");
    healthy_session_still_works(&c).await;
}

#[tokio::test]
async fn too_many_clients_get_53300() {
    let mut text = config_text("");
    text = text.replace(
        "client_login_timeout_ms = 10000",
        "client_login_timeout_ms = 10000\nmax_client_connections = 2",
    );
    let p = start_proxy(&text);
    let a = p.connect().await;
    let b = p.connect().await;
    let err = p.connect_as("app", APP_PASSWORD, "app").await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("53300"), "{err}");
    healthy_session_still_works(&a).await;
    healthy_session_still_works(&b).await;
}

/// A client that goes away while its session waits for a reply that never comes: after
/// an error in an extended-protocol message the server ignores everything up to a Sync,
/// Queries included, so no Query here is ever answered. The session must still end and
/// give its server connections back (found by the `session` fuzz target: the session
/// stopped reading a client that had a second Query waiting behind the first, or that
/// had said Terminate, and so never saw it close).
#[tokio::test]
async fn a_client_gone_while_no_reply_will_come_leaves_nothing_behind() {
    let p = start_proxy(&config_text(""));
    for (queries, terminate) in [(2, false), (1, true)] {
        let mut s = logged_in_to(&p).await;
        let mut batch = raw::msg(b'P', b"\0SELECT $1\0\0\0");
        batch.extend(raw::msg(b'B', b"\0no_such_statement\0\0\0\0\0\0\0"));
        for _ in 0..queries {
            batch.extend(raw::msg(b'Q', b"SELECT 1\0"));
        }
        s.write_all(&batch).await.unwrap();
        let replies = raw::read_until(&mut s, b'E').await;
        assert_eq!(raw::tags(&replies), b"1E", "{queries} queries");
        if terminate {
            s.write_all(&raw::msg(b'X', b"")).await.unwrap();
        }
        drop(s);
        eventually(
            &format!("the session ({queries} queries, terminate: {terminate}) ended and gave its server connections back"),
            Duration::from_secs(10),
            || p.shared.client_count() == 0 && p.shared.pools.counts().iter().all(|c| c.lent == 0),
        )
        .await;
    }
    healthy_session_still_works(&p.connect().await).await;
}

/// The SQLSTATE of the first ErrorResponse among `messages`.
fn error_code(messages: &[(u8, Vec<u8>)]) -> Option<String> {
    let (_, body) = messages.iter().find(|(t, _)| *t == b'E')?;
    body.split(|b| *b == 0)
        .find_map(|f| f.strip_prefix(b"C"))
        .map(|c| String::from_utf8_lossy(c).to_string())
}

/// Whether any message among `messages` holds `needle`.
fn holds(messages: &[(u8, Vec<u8>)], needle: &[u8]) -> bool {
    messages
        .iter()
        .any(|(_, b)| b.windows(needle.len()).any(|w| w == needle))
}

/// A text that is not UTF-8 is not a protocol violation: with `client_encoding` UTF8 the
/// server refuses it (22021) and the session goes on; with another encoding the server
/// converts it and runs it. pgfresh cannot read such a text, so it runs on the primary.
#[tokio::test]
async fn texts_that_are_not_utf8_reach_the_server_and_the_session_goes_on() {
    texts_not_utf8_through(proxy()).await;
    // In transaction mode the named statement is mapped onto the shared connection too
    // (one a node: the second Parse of the name finds the first's connection).
    let tx = start_proxy(&format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = 1\n",
        config_text("")
    ));
    texts_not_utf8_through(&tx).await;
}

async fn texts_not_utf8_through(p: &ProxyHandle) {
    let mut s = logged_in_to(p).await;
    let latin1_query = b"SELECT CASE WHEN 'caf\xe9' = 'caf' || chr(233) THEN 'latin1-ok' END, pg_is_in_recovery()::text\0";
    s.write_all(&raw::msg(b'Q', latin1_query)).await.unwrap();
    let got = raw::read_until(&mut s, b'Z').await;
    assert_eq!(error_code(&got).as_deref(), Some("22021"), "{got:?}");
    s.write_all(&raw::msg(b'Q', b"SET client_encoding TO 'LATIN1'\0"))
        .await
        .unwrap();
    let got = raw::read_until(&mut s, b'Z').await;
    assert_eq!(error_code(&got), None, "{got:?}");
    // Simple protocol, then a named statement over the extended protocol: converted by
    // the server, run on the primary.
    s.write_all(&raw::msg(b'Q', latin1_query)).await.unwrap();
    let got = raw::read_until(&mut s, b'Z').await;
    assert_eq!(error_code(&got), None, "{got:?}");
    assert!(
        holds(&got, b"latin1-ok") && holds(&got, b"false"),
        "{got:?}"
    );
    let mut parse = b"latin1_stmt\0".to_vec();
    parse.extend_from_slice(latin1_query);
    parse.extend_from_slice(&0u16.to_be_bytes());
    let mut batch = raw::msg(b'P', &parse);
    batch.extend_from_slice(&raw::msg(b'B', b"\0latin1_stmt\0\0\0\0\0\0\0"));
    batch.extend_from_slice(&raw::msg(b'E', b"\0\0\0\0\0"));
    batch.extend_from_slice(&raw::msg(b'S', b""));
    // Twice, closed in between: the name is the client's, not the server connection's.
    for _ in 0..2 {
        s.write_all(&batch).await.unwrap();
        let got = raw::read_until(&mut s, b'Z').await;
        assert_eq!(error_code(&got), None, "{got:?}");
        assert!(
            holds(&got, b"latin1-ok") && holds(&got, b"false"),
            "{got:?}"
        );
        let mut close = raw::msg(b'C', b"Slatin1_stmt\0");
        close.extend_from_slice(&raw::msg(b'S', b""));
        s.write_all(&close).await.unwrap();
        let got = raw::read_until(&mut s, b'Z').await;
        assert_eq!(error_code(&got), None, "{got:?}");
    }
    // The session is still whole.
    s.write_all(&raw::msg(b'Q', b"SELECT 'still-here'\0"))
        .await
        .unwrap();
    let got = raw::read_until(&mut s, b'Z').await;
    assert!(holds(&got, b"still-here"), "{got:?}");
}
