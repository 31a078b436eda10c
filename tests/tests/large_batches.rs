//! Extended batches larger than the proxy's batch limit, sent before their Sync: large
//! parameters in, large results out, long pipelines, large COPY rows. Each must be
//! answered in full, byte for byte, and leave the session usable.

use std::time::Duration;

use futures_util::SinkExt;
use pgfresh_tests::raw::{cstr, msg};
use pgfresh_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Echo `len` bytes through `SELECT $1::text` (Parse/Bind/Execute/Sync).
async fn echo(c: &tokio_postgres::Client, len: usize) {
    let big: String = (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    let row = tokio::time::timeout(
        Duration::from_secs(120),
        c.query_one("SELECT $1::text, length($1::text)", &[&big]),
    )
    .await
    .unwrap_or_else(|_| panic!("a {len}-byte parameter was never answered"))
    .unwrap_or_else(|e| panic!("{len}-byte parameter: {e}"));
    let back: String = row.get(0);
    let n: i32 = row.get(1);
    assert_eq!(n as usize, len);
    assert!(back == big, "{len}-byte parameter came back changed");
}

#[tokio::test]
async fn one_and_sixteen_mebibyte_parameters_echo_back() {
    let c = proxy().connect().await;
    for len in [1_048_000, 1_048_576, 1_048_577, 3 << 20, 16 << 20] {
        echo(&c, len).await;
    }
    // The session still works, on any node.
    let one: i32 = c.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
}

#[tokio::test]
async fn large_parameter_into_a_write_stays_on_the_primary() {
    let p = proxy();
    let c = p.connect().await;
    let t = unique("bigw");
    c.batch_execute(&format!("CREATE TABLE {t}(v text)"))
        .await
        .unwrap();
    let big = "x".repeat(2 << 20);
    let n = c
        .execute(&format!("INSERT INTO {t} VALUES ($1)"), &[&big])
        .await
        .unwrap();
    assert_eq!(n, 1);
    let len: i32 = c
        .query_one(&format!("SELECT length(v) FROM {t}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(len as usize, big.len());
}

async fn raw_login() -> TcpStream {
    let mut s = TcpStream::connect(proxy().addr).await.unwrap();
    let mut body = 196608u32.to_be_bytes().to_vec();
    for w in ["user", "app_trust", "database", "app"] {
        body.extend_from_slice(&cstr(w));
    }
    body.push(0);
    let mut start = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    start.extend_from_slice(&body);
    s.write_all(&start).await.unwrap();
    let mut count = [0usize; 256];
    read_messages(&mut s, b'Z', &mut count).await;
    s
}

/// Read messages until `stop` arrives, counting them by tag.
async fn read_messages(s: &mut TcpStream, stop: u8, count: &mut [usize; 256]) {
    loop {
        let mut head = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(120), s.read_exact(&mut head))
            .await
            .expect("the proxy kept answering")
            .expect("read header");
        let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len - 4];
        s.read_exact(&mut body).await.expect("read body");
        assert_ne!(head[0], b'E', "error: {}", String::from_utf8_lossy(&body));
        count[head[0] as usize] += 1;
        if head[0] == stop {
            return;
        }
    }
}

/// One Parse, then 10,000 Bind/Execute pairs with a 300-byte parameter each (about
/// 3.5 MB before the single Sync), written while the answers (6 KB rows, 60 MB in
/// all) stream back: the server answers long before the batch is all sent.
#[tokio::test]
async fn ten_thousand_binds_in_one_pipelined_batch() {
    let mut s = raw_login().await;
    const N: usize = 10_000;
    let mut batch = msg(
        b'P',
        &[cstr(""), cstr("SELECT repeat($1::text, 20)"), vec![0, 0]].concat(),
    );
    let param = "p".repeat(300);
    for _ in 0..N {
        let mut bind = [cstr(""), cstr("")].concat();
        bind.extend_from_slice(&0u16.to_be_bytes()); // parameter formats
        bind.extend_from_slice(&1u16.to_be_bytes());
        bind.extend_from_slice(&(param.len() as i32).to_be_bytes());
        bind.extend_from_slice(param.as_bytes());
        bind.extend_from_slice(&0u16.to_be_bytes()); // result formats
        batch.extend_from_slice(&msg(b'B', &bind));
        batch.extend_from_slice(&msg(b'E', &[cstr(""), vec![0, 0, 0, 0]].concat()));
    }
    batch.extend_from_slice(&msg(b'S', &[]));
    let (mut r, mut w) = s.split();
    let write = async {
        w.write_all(&batch).await.unwrap();
    };
    let mut count = [0usize; 256];
    let read = async {
        let mut rs = ReadOnly(&mut r);
        rs.read_until_z(&mut count).await;
    };
    tokio::join!(write, read);
    assert_eq!(count[b'1' as usize], 1, "ParseComplete");
    assert_eq!(count[b'2' as usize], N, "BindComplete");
    assert_eq!(count[b'D' as usize], N, "DataRow");
    assert_eq!(count[b'C' as usize], N, "CommandComplete");
    // The session goes on.
    s.write_all(&msg(b'Q', &cstr("SELECT 1"))).await.unwrap();
    let mut count = [0usize; 256];
    read_messages(&mut s, b'Z', &mut count).await;
    assert_eq!(count[b'D' as usize], 1);
}

struct ReadOnly<'a, 'b>(&'a mut tokio::net::tcp::ReadHalf<'b>);

impl ReadOnly<'_, '_> {
    async fn read_until_z(&mut self, count: &mut [usize; 256]) {
        loop {
            let mut head = [0u8; 5];
            tokio::time::timeout(Duration::from_secs(120), self.0.read_exact(&mut head))
                .await
                .expect("the proxy kept answering while the batch was written")
                .expect("read header");
            let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
            let mut body = vec![0u8; len - 4];
            self.0.read_exact(&mut body).await.expect("read body");
            assert_ne!(head[0], b'E', "error: {}", String::from_utf8_lossy(&body));
            count[head[0] as usize] += 1;
            if head[0] == b'Z' {
                return;
            }
        }
    }
}

#[tokio::test]
async fn copy_from_stdin_with_large_rows() {
    let p = proxy();
    let c = p.connect().await;
    let t = unique("bigcopy");
    c.batch_execute(&format!("CREATE TABLE {t}(id int, v text)"))
        .await
        .unwrap();
    let sink = c
        .copy_in::<_, bytes::Bytes>(&format!("COPY {t} FROM STDIN"))
        .await
        .unwrap();
    futures_util::pin_mut!(sink);
    let row_len = 3 << 20;
    for i in 0..4 {
        let mut line = format!("{i}\t").into_bytes();
        line.extend(std::iter::repeat_n(b'c', row_len));
        line.push(b'\n');
        sink.send(bytes::Bytes::from(line)).await.unwrap();
    }
    let n = sink.finish().await.unwrap();
    assert_eq!(n, 4);
    let row = c
        .query_one(
            &format!("/* pgfresh:primary */ SELECT count(*), sum(length(v))::bigint FROM {t}"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 4);
    assert_eq!(row.get::<_, i64>(1), 4 * row_len as i64);
}

fn bind_text(params: &[&[u8]]) -> Vec<u8> {
    let mut bind = [cstr(""), cstr("")].concat();
    bind.extend_from_slice(&0u16.to_be_bytes());
    bind.extend_from_slice(&(params.len() as u16).to_be_bytes());
    for p in params {
        bind.extend_from_slice(&(p.len() as i32).to_be_bytes());
        bind.extend_from_slice(p);
    }
    bind.extend_from_slice(&0u16.to_be_bytes());
    msg(b'B', &bind)
}

/// A 32 MB result is being produced while a 16 MiB parameter of the same batch is
/// still on its way to the server: the server can only take the parameter once its
/// result has been read.
#[tokio::test]
async fn large_result_while_a_large_parameter_is_still_sent() {
    let mut s = raw_login().await;
    let mut batch = msg(
        b'P',
        &[
            cstr(""),
            cstr("SELECT length(repeat($1::text, $2::int))::text, repeat($1::text, $2::int)"),
            vec![0, 0],
        ]
        .concat(),
    );
    let x = vec![b'x'; 1000];
    batch.extend_from_slice(&bind_text(&[&x, b"32000"]));
    batch.extend_from_slice(&msg(b'E', &[cstr(""), vec![0, 0, 0, 0]].concat()));
    let big = vec![b'y'; 16 << 20];
    batch.extend_from_slice(&bind_text(&[&big, b"1"]));
    batch.extend_from_slice(&msg(b'E', &[cstr(""), vec![0, 0, 0, 0]].concat()));
    batch.extend_from_slice(&msg(b'S', &[]));
    let (mut r, mut w) = s.split();
    let write = async {
        w.write_all(&batch).await.unwrap();
    };
    let mut count = [0usize; 256];
    let read = async {
        ReadOnly(&mut r).read_until_z(&mut count).await;
    };
    tokio::join!(write, read);
    assert_eq!(count[b'D' as usize], 2, "both rows arrived");
    assert_eq!(count[b'C' as usize], 2);
    s.write_all(&msg(b'Q', &cstr("SELECT 1"))).await.unwrap();
    let mut count = [0usize; 256];
    read_messages(&mut s, b'Z', &mut count).await;
    assert_eq!(count[b'D' as usize], 1);
}
