//! Stale reads that came from how a unit's statements were combined or ordered, not from
//! what a statement touches behind its text (that is `stale_holes.rs`): a session-state
//! statement sent with others, a SQL `EXECUTE`, writes whose transaction state changed
//! in the same unit or pipeline, and a write older than the TTL on a replica the pool
//! still takes. Each test writes, waits for the acknowledgement, then reads through
//! pgfresh while both standbys replay `DELAY_MS` behind, until they have replayed it; a
//! read that misses the acknowledged write is stale, and none may be.
//!
//! Tests here change replication delays, so they run one at a time.

use std::time::{Duration, Instant};

use pgfresh_tests::*;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Replay delay of both standbys while a test writes and reads.
const DELAY_MS: u64 = 400;
/// Write-then-read rounds per test.
const ROUNDS: i64 = 5;

/// (server port, `count(*)` of `t`) through `c`, over the simple protocol.
async fn port_count(c: &tokio_postgres::Client, sql: &str) -> (u16, i64) {
    let r = simple_row(c, sql).await;
    let port = r.get(0).expect("port").parse().expect("a port");
    let n = r.get(1).expect("count").parse().expect("a count");
    (port, n)
}

fn count_sql(t: &str) -> String {
    format!("SELECT inet_server_port(), count(*) FROM {t}")
}

/// Transaction mode, 10 connections a node.
fn tx_config() -> String {
    format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = 10\n",
        config_text("")
    )
}

/// The primary's WAL insert position now, as a number, asked through `c`.
async fn primary_position(c: &tokio_postgres::Client) -> u64 {
    let r = simple_row(
        c,
        "/* pgfresh:primary */ SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint",
    )
    .await;
    r.get(0).expect("position").parse().expect("a number")
}

/// Every standby has replayed `position` (asked of each directly).
fn replayed_everywhere(position: u64) -> bool {
    standbys_replayed(cluster(), &format!("'0/0'::pg_lsn + {position}"))
}

/// Reads `t` through `c` from now until every standby has replayed what the primary had
/// written when it began: the reads that saw fewer than `expected` rows, as (port,
/// count).
async fn stale_until_replicated(
    setup: &tokio_postgres::Client,
    c: &tokio_postgres::Client,
    t: &str,
    expected: i64,
) -> Vec<(u16, i64)> {
    let position = primary_position(setup).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stale = Vec::new();
    loop {
        let (port, n) = port_count(c, &count_sql(t)).await;
        if n < expected {
            stale.push((port, n));
        }
        if replayed_everywhere(position) {
            return stale;
        }
        assert!(
            Instant::now() < deadline,
            "the standbys never replayed {position}"
        );
    }
}

/// A proxy with `config`, a table `t` holding one row, the client under test `c` and a
/// writer, with the standbys replaying `DELAY_MS` behind.
struct Setup {
    p: ProxyHandle,
    setup: tokio_postgres::Client,
    t: String,
    c: tokio_postgres::Client,
    writer: tokio_postgres::Client,
    _delay: ApplyDelay,
}

impl Setup {
    async fn new(config: &str, prefix: &str) -> Setup {
        let p = start_proxy(config);
        let setup = p.connect().await;
        let t = p.cold_table(&setup, prefix).await;
        let c = p.connect().await;
        let writer = p.connect().await;
        let _delay = ApplyDelay::set(DELAY_MS);
        Setup {
            p,
            setup,
            t,
            c,
            writer,
            _delay,
        }
    }

    /// Round `i`: the client's last statement runs on a replica (a cold read), then the
    /// writer adds a row; the client must see `2 + i` rows from here on.
    async fn write(&self, i: i64) {
        port_count(&self.c, &count_sql(&self.t)).await;
        self.writer
            .batch_execute(&format!("INSERT INTO {} VALUES ({})", self.t, 10 + i))
            .await
            .unwrap();
    }

    /// A new table with one row, cold.
    async fn table(&self, prefix: &str) -> String {
        self.p.cold_table(&self.setup, prefix).await
    }

    /// The standbys caught up, for the next round.
    async fn caught_up(&self) {
        wait_replicated_on(cluster(), &self.setup).await;
    }

    /// `stale_until_replicated` for `t` read by the client under test.
    async fn stale(&self, t: &str, expected: i64) -> Vec<(u16, i64)> {
        stale_until_replicated(&self.setup, &self.c, t, expected).await
    }

    /// A raw protocol connection to the proxy.
    async fn raw(&self) -> tokio::net::TcpStream {
        raw::connect(self.p.addr).await
    }
}

/// A simple Query frame.
fn q(sql: &str) -> Vec<u8> {
    raw::msg(b'Q', &raw::cstr(sql))
}

/// An unnamed Parse of `sql` (no parameter types).
fn parse(sql: &str) -> Vec<u8> {
    let mut body = raw::cstr("");
    body.extend_from_slice(&raw::cstr(sql));
    body.extend_from_slice(&0u16.to_be_bytes());
    raw::msg(b'P', &body)
}

/// Sends `frames` in one write and reads until `n` ReadyForQuery came back; the tags seen.
async fn pipeline(s: &mut tokio::net::TcpStream, frames: &[Vec<u8>], n: usize) -> Vec<u8> {
    use tokio::io::AsyncWriteExt;
    s.write_all(&frames.concat())
        .await
        .expect("write to pgfresh");
    let mut tags = Vec::new();
    for _ in 0..n {
        tags.extend(raw::tags(&raw::read_until(s, b'Z').await));
    }
    tags
}

/// A SQL `EXECUTE` of a prepared read is that read: it must not run on whatever node the
/// session used last without the recency check (it did: `EXECUTE` is a session-state
/// statement, and those ran where the session was).
#[tokio::test]
async fn an_sql_execute_of_a_read_is_routed_as_the_read() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&config_text(""), "uh_exec").await;
    s.c.batch_execute(&format!("PREPARE uh_q AS {}", count_sql(&s.t)))
        .await
        .unwrap();
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        s.write(i).await;
        let (port, n) = port_count(&s.c, "EXECUTE uh_q").await;
        if n < 2 + i {
            stale.push((port, n));
        }
        s.caught_up().await;
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// A transaction whose first statement is a `SET LOCAL` is a transaction: a write-capable
/// one starts on the primary (it started on the session's last node, a replica included,
/// where it read stale rows and its writes were refused); a read-only one on a node that
/// has replayed every write acknowledged before it.
#[tokio::test]
async fn a_transaction_opened_by_set_local_starts_where_it_should() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&config_text(""), "uh_setlocal").await;
    let primary = node_port(0);
    let mut wrong = Vec::new();
    for i in 0..ROUNDS {
        for read_only in [false, true] {
            s.write(2 * i + i64::from(read_only)).await;
            let begin = if read_only {
                "BEGIN READ ONLY"
            } else {
                "BEGIN"
            };
            s.c.batch_execute(begin).await.unwrap();
            s.c.batch_execute("SET LOCAL statement_timeout = '10s'")
                .await
                .unwrap();
            let (port, n) = port_count(&s.c, &count_sql(&s.t)).await;
            let wrote = if read_only {
                Ok(())
            } else {
                s.c.batch_execute(&format!("INSERT INTO {} VALUES (-1)", s.t))
                    .await
                    .map_err(|e| e.as_db_error().map(|d| d.message().to_owned()))
            };
            s.c.batch_execute("ROLLBACK").await.unwrap();
            let want = 2 + 2 * i + i64::from(read_only);
            if (!read_only && port != primary) || n < want || wrote.is_err() {
                wrong.push((begin, port, n, wrote));
            }
            s.caught_up().await;
        }
    }
    assert!(
        wrong.is_empty(),
        "write-capable transactions off the primary, stale reads or refused writes \
         (begin, port, count, insert): {wrong:?}"
    );
}

/// A `SET` sent in one query with a read is that read (recency checked), and the setting
/// still follows the session.
#[tokio::test]
async fn a_set_sent_with_a_read_is_routed_as_the_read() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&config_text(""), "uh_setread").await;
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        s.write(i).await;
        let sql = format!("SET application_name = 'uh_{i}'; {}", count_sql(&s.t));
        let msgs = s.c.simple_query(&sql).await.unwrap();
        let row = msgs
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            })
            .expect("a row");
        let port: u16 = row.get(0).unwrap().parse().unwrap();
        let n: i64 = row.get(1).unwrap().parse().unwrap();
        if n < 2 + i {
            stale.push((port, n));
        }
        let name = simple_row(&s.c, "SHOW application_name").await;
        assert_eq!(name.get(0), Some(format!("uh_{i}").as_str()));
        s.caught_up().await;
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// What a unit wrote before its error stays once a ROLLBACK TO SAVEPOINT undoes the
/// error, and commits with the transaction: its relations are marked at COMMIT (a failed
/// unit's writes were left out).
#[tokio::test]
async fn writes_kept_by_a_rollback_to_savepoint_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&tx_config(), "uh_svp").await;
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        let t = s.table("uh_svp").await;
        s.writer.batch_execute("BEGIN").await.unwrap();
        let failed = s
            .writer
            .simple_query(&format!(
                "INSERT INTO {t} VALUES ({i}); SAVEPOINT s; SELECT 1/0"
            ))
            .await;
        assert!(failed.is_err(), "the division fails");
        s.writer
            .batch_execute("ROLLBACK TO SAVEPOINT s")
            .await
            .unwrap();
        s.writer.batch_execute("COMMIT").await.unwrap();
        stale.extend(s.stale(&t, 2).await);
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// A write pipelined right behind a COMMIT runs outside the transaction: it is marked
/// (it was taken for part of the transaction, which the COMMIT's ReadyForQuery then
/// forgot).
#[tokio::test]
async fn a_write_pipelined_behind_a_commit_is_read_fresh() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&tx_config(), "uh_pipec").await;
    let mut conn = s.raw().await;
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        let t = s.table("uh_pipec").await;
        pipeline(&mut conn, &[q("BEGIN"), q("SELECT 1")], 2).await;
        let insert = q(&format!("INSERT INTO {t} VALUES ({i})"));
        let tags = pipeline(&mut conn, &[q("COMMIT"), insert], 2).await;
        assert!(!tags.contains(&b'E'), "an error: {tags:?}");
        stale.extend(s.stale(&t, 2).await);
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// A write pipelined right behind a BEGIN that came while another unit was in flight
/// belongs to the transaction: it is marked when the transaction commits, with the
/// commit's position (it was taken for an autocommit write, marked with a position from
/// inside the transaction, and left out of what the COMMIT marks).
#[tokio::test]
async fn a_write_pipelined_behind_a_begin_is_read_fresh() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&tx_config(), "uh_pipeb").await;
    let mut conn = s.raw().await;
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        let a = s.table("uh_pipeb_a").await;
        let t = s.table("uh_pipeb_t").await;
        let frames = [
            q(&format!("INSERT INTO {a} VALUES ({i})")),
            q("BEGIN"),
            q(&format!("INSERT INTO {t} VALUES ({i})")),
        ];
        let tags = pipeline(&mut conn, &frames, 3).await;
        assert!(!tags.contains(&b'E'), "an error: {tags:?}");
        // pgfresh knows a standby has replayed the open transaction's INSERT record (the
        // replay delay holds back commit records only).
        let inserted = primary_position(&s.setup).await;
        eventually(
            "a standby known past the INSERT",
            Duration::from_secs(60),
            || {
                let view = s.p.shared.balancer.view();
                view.nodes
                    .iter()
                    .any(|n| n.replay_lsn.is_some_and(|l| l.0 >= inserted))
            },
        )
        .await;
        pipeline(&mut conn, &[q("COMMIT")], 1).await;
        stale.extend(s.stale(&t, 2).await);
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// A read-only transaction whose BEGIN is pipelined behind a read starts where every
/// write acknowledged before its first statement has been replayed (its node was fixed,
/// and checked, at the BEGIN).
#[tokio::test]
async fn a_read_only_begin_pipelined_behind_a_read_reads_fresh() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&tx_config(), "uh_robegin").await;
    let mut conn = s.raw().await;
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        pipeline(&mut conn, &[q("SELECT 1"), q("BEGIN READ ONLY")], 2).await;
        s.writer
            .batch_execute(&format!("INSERT INTO {} VALUES ({})", s.t, 10 + i))
            .await
            .unwrap();
        let select = q(&format!("SELECT count(*)::text FROM {}", s.t));
        tokio::io::AsyncWriteExt::write_all(&mut conn, &select)
            .await
            .unwrap();
        let msgs = raw::read_until(&mut conn, b'Z').await;
        let (_, row) = msgs.iter().find(|(tag, _)| *tag == b'D').expect("a row");
        // One column: its length (4 bytes) after the column count (2), then the text.
        let len = i32::from_be_bytes(row[2..6].try_into().unwrap()) as usize;
        let n: i64 = String::from_utf8_lossy(&row[6..6 + len]).parse().unwrap();
        if n < 2 + i {
            stale.push(n);
        }
        pipeline(&mut conn, &[q("COMMIT")], 1).await;
        s.caught_up().await;
    }
    assert!(stale.is_empty(), "stale counts: {stale:?}");
}

/// A SQL `EXECUTE` sent over the extended protocol (tokio-postgres `execute`, psycopg,
/// JDBC) runs the prepared statement as over the simple protocol: a write is marked
/// (only a simple Query's `EXECUTE` was looked up), and one prepared where pgfresh could
/// not see its text (over the extended protocol) counts as a write of the whole database.
#[tokio::test]
async fn sql_executes_over_the_extended_protocol_are_read_fresh() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&config_text(""), "uh_execw").await;
    let t = &s.t;
    let prepare = |name: &str| format!("PREPARE {name}(int) AS INSERT INTO {t} VALUES ($1)");
    s.writer.batch_execute(&prepare("uh_ins")).await.unwrap();
    s.writer.execute(&prepare("uh_ins2"), &[]).await.unwrap();
    let mut stale = Vec::new();
    let mut rows = 1;
    for i in 0..ROUNDS {
        s.writer.execute("EXECUTE uh_ins(2)", &[]).await.unwrap();
        rows += 1;
        stale.extend(s.stale(t, rows).await);
        let execute = format!("EXECUTE uh_ins2({i})");
        s.writer.batch_execute(&execute).await.unwrap();
        rows += 1;
        stale.extend(s.stale(t, rows).await);
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// `BEGIN READ WRITE` is write-capable in a session whose default is read-only: it starts
/// on the primary, where its writes are taken (the session's default won over the mode
/// the transaction named, and it started on a replica).
#[tokio::test]
async fn begin_read_write_in_a_read_only_session_starts_on_the_primary() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&config_text(""), "uh_rw").await;
    s.c.batch_execute("SET default_transaction_read_only = on")
        .await
        .unwrap();
    for _ in 0..ROUNDS {
        s.c.batch_execute("BEGIN READ WRITE").await.unwrap();
        let (port, _) = port_count(&s.c, &count_sql(&s.t)).await;
        let wrote =
            s.c.batch_execute(&format!("INSERT INTO {} VALUES (2)", s.t))
                .await
                .map_err(|e| e.as_db_error().map(|d| d.message().to_owned()));
        s.c.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(
            (port, wrote),
            (node_port(0), Ok(())),
            "BEGIN READ WRITE ran on the primary and could write"
        );
    }
}

/// An autocommit write in an extended batch left open by a Flush commits at the client's
/// later Sync, which may come after the recency window of a mark made at its
/// CommandComplete has passed: it is marked again when it commits (psycopg's
/// `executemany(..., returning=True)` reads the rows before it syncs).
#[tokio::test]
async fn a_write_committed_by_a_later_sync_is_read_fresh() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&tx_config(), "uh_flush").await;
    let mut conn = s.raw().await;
    let mut stale = Vec::new();
    for i in 0..3 {
        let t = s.table("uh_flush").await;
        let batch = [
            parse(&format!("INSERT INTO {t} VALUES ({i})")),
            raw::bind("", &[]),
            raw::execute(),
            raw::msg(b'H', &[]),
        ];
        tokio::io::AsyncWriteExt::write_all(&mut conn, &batch.concat())
            .await
            .unwrap();
        raw::read_until(&mut conn, b'C').await;
        // The client syncs only once the mark made at the CommandComplete has left the
        // recency window.
        s.p.wait_cold(&[&t]).await;
        pipeline(&mut conn, &[raw::msg(b'S', &[])], 1).await;
        stale.extend(s.stale(&t, 2).await);
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// A Bind of a statement made by SQL `PREPARE` (the server has one namespace for both
/// kinds) runs its write, which is marked (the unit carried no analysis: it ran where the
/// session was, as an empty query, and marked nothing).
#[tokio::test]
async fn a_bind_of_an_sql_prepared_write_is_read_fresh() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&config_text(""), "uh_bindsql").await;
    let mut conn = s.raw().await;
    let prepare = format!("PREPARE uh_w(int) AS INSERT INTO {} VALUES ($1)", s.t);
    let tags = pipeline(&mut conn, &[q(&prepare)], 1).await;
    assert!(!tags.contains(&b'E'), "PREPARE: {tags:?}");
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        let frames = [
            raw::bind("uh_w", &[&i.to_string()]),
            raw::execute(),
            raw::msg(b'S', &[]),
        ];
        let tags = pipeline(&mut conn, &frames, 1).await;
        assert!(!tags.contains(&b'E'), "Bind/Execute: {tags:?}");
        stale.extend(s.stale(&s.t, 2 + i).await);
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// `CREATE TABLE … AS EXECUTE p` runs the prepared statement `p`: what `p` writes (here
/// through a volatile function) is marked, as for `EXECUTE p` alone (only the new table
/// was).
#[tokio::test]
async fn create_table_as_execute_marks_what_the_statement_writes() {
    let _g = SERIAL.lock().await;
    // The function exists before the proxy starts: its first dependency load has it.
    let t = unique("uh_ctasx");
    let f = format!("{t}_bump");
    let first = proxy().connect().await;
    first
        .batch_execute(&format!(
            "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1); \
             CREATE FUNCTION {f}() RETURNS int LANGUAGE sql VOLATILE AS \
             $$ INSERT INTO {t} VALUES (7) RETURNING 1 $$"
        ))
        .await
        .unwrap();
    wait_replicated_on(cluster(), &first).await;
    let s = Setup::new(&config_text(""), "uh_ctas").await;
    s.p.wait_cold(&[&t]).await;
    s.writer
        .batch_execute(&format!("PREPARE uh_p AS SELECT {f}() AS x"))
        .await
        .unwrap();
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        s.writer
            .batch_execute(&format!("CREATE TABLE {t}_c{i} AS EXECUTE uh_p"))
            .await
            .unwrap();
        stale.extend(s.stale(&t, 2 + i).await);
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// A write older than the TTL stays recent while a replica the read pool still takes may
/// lack it: with the defaults (`recent_access_ttl_ms` 1000, `delay_threshold_by_time`
/// 2000) and standbys replaying 1.5 TTLs behind, the reads between the TTL and the
/// replay went to them and missed the write.
#[tokio::test]
async fn a_write_older_than_the_ttl_is_read_fresh_inside_the_lag_budget() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&config_text(""), "uh_ttl").await;
    let _longer = ApplyDelay::set(s.p.shared.recency.ttl_ms() * 3 / 2);
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        s.write(i).await;
        stale.extend(s.stale(&s.t, 2 + i).await);
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}

/// A read-only transaction chained (`COMMIT AND CHAIN`, `ROLLBACK AND CHAIN`, `END` and
/// `ABORT AND CHAIN`, over both protocols) after one on a replica is a new transaction: it
/// starts where every write acknowledged before its first statement has been replayed, with
/// the modes of the one before (it began on the same standby at the chain, and read rows
/// older than a write the client had seen acknowledged meanwhile).
#[tokio::test]
async fn a_chained_read_only_transaction_reads_fresh() {
    let _g = SERIAL.lock().await;
    // (how the transaction begins, the chain, sent over the extended protocol, the
    // isolation the chained transaction keeps)
    let cases = [
        (
            "BEGIN READ ONLY",
            "COMMIT AND CHAIN",
            false,
            "read committed",
        ),
        (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            "ROLLBACK AND CHAIN",
            true,
            "repeatable read",
        ),
        (
            "BEGIN; SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY",
            "END AND CHAIN",
            false,
            "repeatable read",
        ),
        ("BEGIN", "ABORT AND CHAIN", true, "read committed"),
    ];
    let mut wrong = Vec::new();
    for config in [config_text(""), tx_config()] {
        let s = Setup::new(&config, "uh_chain").await;
        for (i, (begin, chain, extended, isolation)) in cases.into_iter().enumerate() {
            let i = i as i64;
            let read_only_default = begin == "BEGIN";
            if read_only_default {
                s.c.batch_execute("SET default_transaction_read_only = on")
                    .await
                    .unwrap();
            }
            s.c.batch_execute(begin).await.unwrap();
            port_count(&s.c, &count_sql(&s.t)).await;
            s.writer
                .batch_execute(&format!("INSERT INTO {} VALUES ({})", s.t, 10 + i))
                .await
                .unwrap();
            if extended {
                s.c.execute(chain, &[]).await.unwrap();
            } else {
                s.c.batch_execute(chain).await.unwrap();
            }
            let sql = format!(
                "SELECT inet_server_port(), count(*), current_setting('transaction_isolation'), \
                 current_setting('transaction_read_only') FROM {}",
                s.t
            );
            let r = simple_row(&s.c, &sql).await;
            let got = (
                r.get(1).unwrap_or("").parse::<i64>().unwrap_or(-1),
                r.get(2).unwrap_or("").to_string(),
                r.get(3).unwrap_or("").to_string(),
            );
            // The chained transaction stays on its node.
            let again = port_count(&s.c, &count_sql(&s.t)).await;
            s.c.batch_execute("COMMIT").await.unwrap();
            let port: u16 = r.get(0).unwrap_or("0").parse().unwrap_or(0);
            if got != (2 + i, isolation.to_string(), "on".to_string()) || again.0 != port {
                wrong.push((chain, port, got, again));
            }
            if read_only_default {
                s.c.batch_execute("RESET default_transaction_read_only")
                    .await
                    .unwrap();
            }
            s.caught_up().await;
        }
    }
    assert!(
        wrong.is_empty(),
        "stale or misplaced chained transactions \
         (chain, port, (count, isolation, read only), next read): {wrong:?}"
    );
}

/// A write whose text pgfresh cannot read (a client with `client_encoding` LATIN1 sends a
/// text that is not UTF-8; the server converts it) may write anything: it runs on the
/// primary and marks the whole database, so a read of what it wrote, in another session,
/// is fresh.
#[tokio::test]
async fn a_write_in_a_text_that_is_not_utf8_is_read_fresh() {
    let _g = SERIAL.lock().await;
    let s = Setup::new(&config_text(""), "uh_latin1").await;
    let mut w = s.raw().await;
    pipeline(&mut w, &[q("SET client_encoding TO 'LATIN1'")], 1).await;
    let mut stale = Vec::new();
    for i in 0..ROUNDS {
        port_count(&s.c, &count_sql(&s.t)).await;
        let mut insert = format!("INSERT INTO {} SELECT length('caf", s.t).into_bytes();
        insert.extend_from_slice(b"\xe9')");
        let tags = pipeline(&mut w, &[raw::msg(b'Q', &[insert, vec![0]].concat())], 1).await;
        assert!(!tags.contains(&b'E'), "the insert failed: {tags:?}");
        stale.extend(s.stale(&s.t, 2 + i).await);
        s.caught_up().await;
    }
    assert!(stale.is_empty(), "stale reads (port, count): {stale:?}");
}
