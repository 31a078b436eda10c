//! Writes pgfresh did not relay — straight on the primary, or through another pgfresh —
//! learned from the primary's WAL (`wal_feed`), with the standbys replaying seconds behind:
//! a read right after such a write is fresh with `strict`; with `on`, once the feed has
//! decoded the commit; without the feed, it is stale.

use std::time::Duration;

use pgfresh_tests::*;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// The standbys replay this far behind while a test writes.
const DELAY_MS: u64 = 3_000;

/// Rounds of write-then-read in each run.
const ROUNDS: i32 = 12;

/// A direct connection to the primary as `app`, past every pgfresh.
async fn direct_app() -> tokio_postgres::Client {
    direct_to(0, "app", APP_PASSWORD, "app").await
}

/// A proxy with `wal_feed = mode` (recency on, LSN routing on) and a client of it.
async fn reader(mode: &str) -> (ProxyHandle, tokio_postgres::Client) {
    reader_pooled(mode, "session").await
}

/// [`reader`] in `pool_mode` (session or transaction, 4 connections a node).
async fn reader_pooled(mode: &str, pool_mode: &str) -> (ProxyHandle, tokio_postgres::Client) {
    let p = start_proxy(&format!(
        "{}\n[pool]\npool_mode = \"{pool_mode}\"\npool_size = 4\n",
        config_text(&format!("wal_feed = \"{mode}\""))
    ));
    let c = p.connect().await;
    (p, c)
}

/// Waits until the feed of database `app` of `p` is `what`: `ok` says so of a feed.
async fn wait_feed(
    p: &ProxyHandle,
    what: &str,
    ok: impl Fn(&pgfresh_proxy::wal_feed::Feed) -> bool,
) {
    poll(what, Duration::from_secs(60), || async {
        let feeds = p.shared.wal_feeds.all();
        feeds.iter().any(|f| f.db == "app" && ok(f)).then_some(())
    })
    .await;
}

/// The feed of database `app` of `p` is streaming.
async fn wait_streaming(p: &ProxyHandle) {
    wait_feed(p, "the WAL feed streaming", |f| f.streaming()).await;
}

/// The feed of `app` of `p` has decoded up to `lsn`.
async fn wait_decoded(p: &ProxyHandle, lsn: pgfresh_recency::Lsn) {
    wait_feed(p, "the feed to decode the commit", |f| f.position() >= lsn).await;
}

async fn insert_position(c: &tokio_postgres::Client) -> pgfresh_recency::Lsn {
    let row = c
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .unwrap();
    row.get::<_, String>(0).parse().unwrap()
}

/// Writes `ROUNDS` rows, alternately straight on the primary and through `other` (a
/// pgfresh that is not `reader`), and reads each through `reader` right after its
/// commit (after `before_read`, if it waits for anything); returns how many reads missed
/// their row.
async fn stale_reads<F, Fut>(
    t: &str,
    other: &tokio_postgres::Client,
    reader: &tokio_postgres::Client,
    mut before_read: F,
) -> usize
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let direct = direct_app().await;
    let mut stale = 0;
    for i in 0..ROUNDS {
        let writer = if i % 2 == 0 { &direct } else { other };
        writer
            .execute(&format!("INSERT INTO {t} VALUES ($1)"), &[&i])
            .await
            .unwrap();
        before_read().await;
        let n: i64 = reader
            .query_one(&format!("SELECT count(*) FROM {t} WHERE v = $1"), &[&i])
            .await
            .unwrap()
            .get(0);
        if n == 0 {
            stale += 1;
        }
    }
    stale
}

/// A table of its own with one row (`v = -1`), replicated.
async fn table(prefix: &str) -> String {
    let t = unique(prefix);
    let direct = direct_app().await;
    direct
        .batch_execute(&format!(
            "CREATE TABLE {t}(v int); INSERT INTO {t} VALUES (-1)"
        ))
        .await
        .unwrap();
    wait_replicated_on(cluster(), &direct).await;
    t
}

/// A table of its own, a client of another pgfresh (the shared one) to write through, and
/// a pgfresh with `wal_feed = mode` whose feed streams, with a client.
async fn setup(
    prefix: &str,
    mode: &str,
) -> (
    String,
    tokio_postgres::Client,
    ProxyHandle,
    tokio_postgres::Client,
) {
    let t = table(prefix).await;
    let other = proxy().connect().await;
    let (p, c) = reader(mode).await;
    wait_streaming(&p).await;
    (t, other, p, c)
}

/// A superuser connection straight to the primary.
async fn direct_superuser() -> tokio_postgres::Client {
    let (su, pw) = cluster().superuser();
    direct_to(0, su, pw, "postgres").await
}

/// The replication slots of pgfresh's feeds on the primary, active ones.
async fn feed_slots(su: &tokio_postgres::Client) -> Vec<String> {
    su.query(
        "SELECT slot_name::text FROM pg_replication_slots WHERE slot_name LIKE 'pgfresh\\_%' AND active",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// With `strict`, a read right after a commit made past this pgfresh (on the primary, or
/// through another pgfresh) sees it, every time, in session and in transaction mode, while
/// a table no one wrote is still read on the standbys. The control: a pgfresh without the
/// feed reads stale.
#[tokio::test]
async fn a_strict_feed_reads_writes_made_elsewhere_fresh() {
    let _g = SERIAL.lock().await;
    let control = table("strict_control").await;
    let pooled = table("strict_pooled").await;
    let cold = table("strict_cold").await;
    let (t, other, p, c) = setup("strict", "strict").await;
    let read_cold = format!("SELECT inet_server_port() FROM {cold}");
    poll(
        "a cold read on a standby",
        Duration::from_secs(60),
        || async {
            let port = c.query_one(&read_cold, &[]).await.unwrap().get::<_, i32>(0) as u16;
            [node_port(1), node_port(2)].contains(&port).then_some(())
        },
    )
    .await;
    {
        let _delay = ApplyDelay::set(DELAY_MS);
        let stale = stale_reads(&t, &other, &c, || async {}).await;
        assert_eq!(stale, 0, "stale reads through a strict feed");
        // The same in transaction mode.
        let (tx, tx_client) = reader_pooled("strict", "transaction").await;
        wait_streaming(&tx).await;
        let stale = stale_reads(&pooled, &other, &tx_client, || async {}).await;
        assert_eq!(
            stale, 0,
            "stale reads through a strict feed, transaction mode"
        );
        let (_off, off) = reader("off").await;
        let stale = stale_reads(&control, &other, &off, || async {}).await;
        assert!(stale > 0, "the control read nothing stale");
    }
    let status = admin::get_json(&p, "/v1/status", None).await;
    assert_eq!(status["wal_feed"]["mode"], "strict");
    let app = status["wal_feed"]["databases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["database"] == "app")
        .cloned()
        .unwrap();
    assert_eq!(app["streaming"], true, "{app}");
    assert!(app["commits"].as_u64().unwrap() >= ROUNDS as u64, "{app}");
    // The console says the same (psql, as an operator would ask).
    let (rows, _) = admin::console_ok(&p, "SHOW WAL_FEED");
    let row = rows.iter().find(|r| r[0] == "app").expect("a row for app");
    assert_eq!(&row[1..3], ["strict", "true"], "{rows:?}");
}

/// With `on`, a commit made past this pgfresh is marked once the feed has decoded it: a
/// read after that is fresh.
#[tokio::test]
async fn an_on_feed_marks_writes_made_elsewhere_once_decoded() {
    let _g = SERIAL.lock().await;
    let (t, other, p, c) = setup("on", "on").await;
    let _delay = ApplyDelay::set(DELAY_MS);
    let direct = direct_app().await;
    let stale = stale_reads(&t, &other, &c, || async {
        wait_decoded(&p, insert_position(&direct).await).await
    })
    .await;
    assert_eq!(stale, 0, "stale reads after the feed decoded the commit");
}

/// A feed whose walsender is terminated starts again on a new slot, and reads stay fresh.
#[tokio::test]
async fn a_feed_whose_connection_is_killed_starts_again() {
    let _g = SERIAL.lock().await;
    let (t, other, p, c) = setup("killed", "strict").await;
    let su = direct_superuser().await;
    let before = poll("the feed's slot", Duration::from_secs(60), || async {
        let slots = feed_slots(&su).await;
        (!slots.is_empty()).then_some(slots)
    })
    .await;
    su.execute(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
         WHERE slot_name LIKE 'pgfresh\\_%' AND active",
        &[],
    )
    .await
    .unwrap();
    poll("a new slot", Duration::from_secs(60), || async {
        let slots = feed_slots(&su).await;
        let streaming = p.shared.wal_feeds.all().iter().any(|f| f.streaming());
        (streaming && slots.iter().any(|s| !before.contains(s))).then_some(())
    })
    .await;
    let _delay = ApplyDelay::set(DELAY_MS);
    let stale = stale_reads(&t, &other, &c, || async {}).await;
    assert_eq!(stale, 0, "stale reads after the feed started again");
}

/// A strict read waits for a feed that is behind: each write follows a commit of 100 000
/// rows, which the feed takes a while to receive, and the read right after still sees it.
#[tokio::test]
async fn a_strict_read_waits_for_a_feed_that_lags() {
    let _g = SERIAL.lock().await;
    let t = table("lagging").await;
    let bulk = table("bulk").await;
    let (p, c) = reader("strict").await;
    wait_streaming(&p).await;
    let direct = direct_app().await;
    let _delay = ApplyDelay::set(DELAY_MS);
    let mut stale = 0;
    for i in 0..6 {
        direct
            .batch_execute(&format!(
                "INSERT INTO {bulk} SELECT generate_series(1, 100000); INSERT INTO {t} VALUES ({i})"
            ))
            .await
            .unwrap();
        let n: i64 = c
            .query_one(&format!("SELECT count(*) FROM {t} WHERE v = $1"), &[&i])
            .await
            .unwrap()
            .get(0);
        stale += usize::from(n == 0);
    }
    assert_eq!(stale, 0, "stale reads behind a lagging feed");
}

/// A feed that cannot start says why — the server's own reason, in `/v1/status` (and the
/// log) — and with `strict`, reads that would go to a standby go to the primary meanwhile
/// (reason `wal_feed`). Here the `[monitor]` role may watch the standbys
/// (`pg_monitor`) but not open a replication connection.
#[tokio::test]
async fn a_feed_that_cannot_start_says_why_and_strict_reads_go_to_the_primary() {
    let _g = SERIAL.lock().await;
    let cold = table("feedless").await;
    cluster()
        .psql(
            0,
            "postgres",
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'feedless') THEN
                     CREATE ROLE feedless LOGIN PASSWORD 'feedless-secret' IN ROLE pg_monitor;
                 END IF;
             END $$",
        )
        .unwrap();
    let (su, su_pw) = cluster().superuser();
    let text = config_text("wal_feed = \"strict\"").replace(
        &format!("user = \"{su}\"\npassword = \"{su_pw}\""),
        "user = \"feedless\"\npassword = \"feedless-secret\"",
    );
    assert!(text.contains("user = \"feedless\""), "{text}");
    let p = start_proxy(&text);
    let c = p.connect().await;
    let error = poll("the feed's error", Duration::from_secs(60), || async {
        let status = admin::get_json(&p, "/v1/status", None).await;
        status["wal_feed"]["databases"]
            .as_array()?
            .iter()
            .find(|d| d["database"] == "app")?["error"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    // The publication when no one made it yet, else the replication connection.
    assert!(
        error.contains("permission denied") || error.contains("superuser or replication"),
        "{error}"
    );
    let before = metric_value("pgfresh_routed_total{target=\"primary\",reason=\"wal_feed\"}");
    for _ in 0..5 {
        let port = c
            .query_one(&format!("SELECT inet_server_port() FROM {cold}"), &[])
            .await
            .unwrap()
            .get::<_, i32>(0) as u16;
        assert_eq!(port, node_port(0), "a read without a feed");
    }
    assert!(
        metric_value("pgfresh_routed_total{target=\"primary\",reason=\"wal_feed\"}")
            >= before + 5.0
    );
}
