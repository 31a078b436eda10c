//! Full protocol passthrough through pgfresh with a real driver (tokio-postgres):
//! simple and extended queries, prepared statements, transactions, errors, COPY,
//! large results, notifications, cancellation and authentication.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt, TryStreamExt};
use pgfresh_tests::*;
use tokio_postgres::{AsyncMessage, NoTls, SimpleQueryMessage};

#[tokio::test]
async fn simple_and_multi_statement_queries() {
    let c = proxy().connect().await;
    let t = unique("simple");
    let msgs = c
        .simple_query(&format!("CREATE TABLE {t}(id int primary key, v text); INSERT INTO {t} VALUES (1,'a'),(2,'b'); SELECT count(*) FROM {t}"))
        .await
        .unwrap();
    let rows: Vec<_> = msgs
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap().to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(rows, vec!["2"]);
    // Empty query.
    let msgs = c.simple_query("").await.unwrap();
    assert!(msgs
        .iter()
        .all(|m| !matches!(m, SimpleQueryMessage::Row(_))));
}

#[tokio::test]
async fn extended_protocol_and_prepared_statements() {
    let c = proxy().connect().await;
    let t = unique("ext");
    c.batch_execute(&format!("CREATE TABLE {t}(id int primary key, v text)"))
        .await
        .unwrap();
    let ins = c
        .prepare(&format!("INSERT INTO {t} VALUES ($1, $2)"))
        .await
        .unwrap();
    for i in 0..50 {
        c.execute(&ins, &[&i, &format!("v{i}")]).await.unwrap();
    }
    let sel = c
        .prepare(&format!("SELECT v FROM {t} WHERE id = $1"))
        .await
        .unwrap();
    for i in [0, 17, 49] {
        // The read may go to a replica; the prepared statement must exist there too.
        let row = c.query_one(&sel, &[&i]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), format!("v{i}"));
    }
    let n: i64 = c
        .query_one(&format!("SELECT count(*) FROM {t}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 50);
    // Parameter types and NULLs round-trip.
    let row = c
        .query_one(
            "SELECT $1::int8 + 1, $2::text IS NULL",
            &[&41i64, &None::<String>],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 42);
    assert!(row.get::<_, bool>(1));
}

#[tokio::test]
async fn pipelined_queries_keep_their_order() {
    let c = proxy().connect().await;
    let t = unique("pipe");
    c.batch_execute(&format!("CREATE TABLE {t}(id int)"))
        .await
        .unwrap();
    let stmt = c.prepare("SELECT $1::int4").await.unwrap();
    let futures: Vec<_> = (0..20i32)
        .map(|i| {
            let c = &c;
            let stmt = &stmt;
            async move { c.query_one(stmt, &[&i]).await.map(|r| r.get::<_, i32>(0)) }
        })
        .collect();
    let results = futures_util::future::join_all(futures).await;
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(r.unwrap(), i as i32);
    }
}

#[tokio::test]
async fn transactions_commit_rollback_and_errors() {
    let mut c = proxy().connect().await;
    let t = unique("tx");
    c.batch_execute(&format!("CREATE TABLE {t}(id int primary key)"))
        .await
        .unwrap();
    {
        let tx = c.transaction().await.unwrap();
        tx.execute(&format!("INSERT INTO {t} VALUES (1)"), &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    {
        let tx = c.transaction().await.unwrap();
        tx.execute(&format!("INSERT INTO {t} VALUES (2)"), &[])
            .await
            .unwrap();
        tx.rollback().await.unwrap();
    }
    // An error inside a transaction puts it in the failed state until ROLLBACK.
    c.batch_execute("BEGIN").await.unwrap();
    let err = c
        .batch_execute(&format!("INSERT INTO {t} VALUES (1)"))
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "23505");
    let err = c.batch_execute("SELECT 1").await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "25P02");
    c.batch_execute("ROLLBACK").await.unwrap();
    let n: i64 = c
        .query_one(&format!("SELECT count(*) FROM {t}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // An error outside a transaction leaves the session usable.
    assert!(c
        .batch_execute("SELECT * FROM no_such_table_at_all")
        .await
        .is_err());
    assert_eq!(
        c.query_one("SELECT 7", &[]).await.unwrap().get::<_, i32>(0),
        7
    );
}

#[tokio::test]
async fn copy_in_and_out() {
    let c = proxy().connect().await;
    let t = unique("copy");
    c.batch_execute(&format!("CREATE TABLE {t}(id int, v text)"))
        .await
        .unwrap();
    let sink = c.copy_in(&format!("COPY {t} FROM STDIN")).await.unwrap();
    let mut data = String::new();
    for i in 0..10_000 {
        data.push_str(&format!("{i}\tvalue {i}\n"));
    }
    futures_util::pin_mut!(sink);
    sink.send(bytes::Bytes::from(data.clone())).await.unwrap();
    let n = sink.finish().await.unwrap();
    assert_eq!(n, 10_000);
    let stream = c
        .copy_out(&format!("COPY (SELECT * FROM {t} ORDER BY id) TO STDOUT"))
        .await
        .unwrap();
    let chunks: Vec<bytes::Bytes> = stream.try_collect().await.unwrap();
    let out: Vec<u8> = chunks.concat();
    assert_eq!(String::from_utf8(out).unwrap(), data);
    // A failed COPY IN leaves the session usable.
    let sink = c.copy_in(&format!("COPY {t} FROM STDIN")).await.unwrap();
    futures_util::pin_mut!(sink);
    sink.send(bytes::Bytes::from_static(b"not-a-number\tx\n"))
        .await
        .unwrap();
    assert!(sink.finish().await.is_err());
    assert_eq!(
        c.query_one("SELECT 1", &[]).await.unwrap().get::<_, i32>(0),
        1
    );
}

#[tokio::test]
async fn large_results_stream() {
    let c = proxy().connect().await;
    let rows = c
        .query(
            "SELECT g, repeat('x', 100) FROM generate_series(1, 200000) g",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 200_000);
    assert_eq!(rows[199_999].get::<_, i32>(0), 200_000);
}

#[tokio::test]
async fn notifications_reach_a_listening_client() {
    let p = proxy();
    let (listener, mut conn) =
        tokio_postgres::connect(&p.conninfo("app", APP_PASSWORD, "app"), NoTls)
            .await
            .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(msg)) = stream.next().await {
            if let AsyncMessage::Notification(n) = msg {
                let _ = tx.send((n.channel().to_string(), n.payload().to_string()));
            }
        }
    });
    let chan = unique("chan");
    listener
        .batch_execute(&format!("LISTEN {chan}"))
        .await
        .unwrap();
    let sender = p.connect().await;
    sender
        .batch_execute(&format!("NOTIFY {chan}, 'hello'"))
        .await
        .unwrap();
    // Delivered while the listening client is idle.
    let got = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, (chan.clone(), "hello".to_string()));
    sender
        .query_one("SELECT pg_notify($1, 'second')", &[&chan])
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.1, "second");
}

#[tokio::test]
async fn cancel_a_running_query() {
    let c = proxy().connect().await;
    let token = c.cancel_token();
    let running = tokio::spawn(async move { c.batch_execute("SELECT pg_sleep(60)").await });
    // Cancel as soon as the query is running (the cancel is retried until it lands).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        token.cancel_query(NoTls).await.unwrap();
        if running.is_finished() || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = running.await.unwrap().unwrap_err();
    assert_eq!(err.code().unwrap().code(), "57014");
}

#[tokio::test]
async fn authentication_methods() {
    let p = proxy();
    // SCRAM (the default), md5 and trust users.
    p.connect_as("app", APP_PASSWORD, "app").await.unwrap();
    let c = p.connect_as("app_md5", "md5-pass", "app").await.unwrap();
    assert_eq!(
        c.query_one("SELECT current_user::text", &[])
            .await
            .unwrap()
            .get::<_, String>(0),
        "app"
    );
    p.connect_as("app_trust", "ignored", "app").await.unwrap();
    for (user, pw) in [("app", "wrong"), ("app_md5", "wrong"), ("nobody", "x")] {
        let err = p.connect_as(user, pw, "app").await.unwrap_err();
        assert_eq!(err.code().map(|c| c.code()), Some("28P01"), "{user}: {err}");
    }
    // A database that does not exist: the server's own error.
    let err = p
        .connect_as("app", APP_PASSWORD, "no_such_db")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("3D000"), "{err}");
}

#[tokio::test]
async fn session_settings_follow_the_session() {
    let c = proxy().connect().await;
    c.batch_execute("SET statement_timeout = '1234ms'")
        .await
        .unwrap();
    c.batch_execute("SET application_name = 'pgfresh-test'")
        .await
        .unwrap();
    // Reads may land on any node; each must see the session's settings.
    for _ in 0..10 {
        let r = c
            .query_one(
                "SELECT current_setting('statement_timeout'), current_setting('application_name')",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(r.get::<_, String>(0), "1234ms");
        assert_eq!(r.get::<_, String>(1), "pgfresh-test");
    }
    c.batch_execute("RESET statement_timeout").await.unwrap();
    for _ in 0..5 {
        let r = c
            .query_one("SELECT current_setting('statement_timeout')", &[])
            .await
            .unwrap();
        assert_eq!(r.get::<_, String>(0), "0");
    }
}
