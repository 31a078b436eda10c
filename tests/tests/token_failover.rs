//! Tokens across a promotion, on a private primary + 2 standbys: both standbys are cut
//! off, the old primary takes one more write (a token nobody else has), stops, standby 1
//! is promoted (timeline 2) and standby 2 follows it. A token from before the switch
//! point is still served by a replica that replayed it; the lost write's token sends the
//! read to the primary, counted as diverged.

use std::time::Duration;

use pgfresh_tests::*;

async fn show_token(c: &tokio_postgres::Client) -> String {
    c.simple_query("SHOW pgfresh.commit_lsn")
        .await
        .unwrap()
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap()
}

fn counter(name_and_labels: &str) -> u64 {
    let text = pgfresh_proxy::admin::metrics_handle()
        .map(|h| h.render())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name_and_labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn read(c: &tokio_postgres::Client, t: &str) -> (u16, i64) {
    let row = c
        .query_one(
            &format!("SELECT inet_server_port(), count(*) FROM {t}"),
            &[],
        )
        .await
        .unwrap();
    (row.get::<_, i32>(0) as u16, row.get(1))
}

#[tokio::test]
async fn tokens_are_translated_through_the_new_timeline() {
    let cluster = private_cluster();
    let p = start_proxy(&config_text_for(&cluster, ""));
    let writer = p
        .connect_with_options("-c pgfresh.track_commit_lsn=on")
        .await;
    writer
        .batch_execute("CREATE TABLE t(id int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();
    let kept = show_token(&writer).await;
    assert!(kept.starts_with("1/"), "{kept}");
    wait_replicated_on(&cluster, &writer).await;

    // Both standbys stop receiving; the old primary takes a write only it will ever have.
    for i in 1..=2 {
        cut_off_standby(&cluster, i).await;
    }
    writer
        .batch_execute("INSERT INTO t VALUES (2)")
        .await
        .unwrap();
    let lost = show_token(&writer).await;
    assert_ne!(lost, kept);
    drop(writer);

    cluster.stop_node(0).unwrap();
    cluster.promote(1).unwrap();
    cluster.repoint_standby(2, 1).unwrap();
    let balancer = p.shared.balancer.clone();
    eventually(
        "node 1 primary on timeline 2, its history known, node 2 following it",
        Duration::from_secs(120),
        || {
            let v = balancer.view();
            v.primary == Some(1)
                && v.primary_timeline == Some(2)
                && v.timeline_history
                    .as_ref()
                    .is_some_and(|h| h.timeline() == 2)
                && v.nodes[2].eligible
                && v.nodes[2].timeline == Some(2)
        },
    )
    .await;

    // The recency window of the writes above is over: only the tokens decide.
    p.wait_cold(&["t"]).await;
    let reader = p.connect().await;
    // Before the switch point: valid on timeline 2, a replica that replayed it serves it.
    reader
        .batch_execute(&format!("SET pgfresh.min_lsn = '{kept}'"))
        .await
        .unwrap();
    let before = counter("pgfresh_routed_total{target=\"replica\",reason=\"token\"}");
    let mut on_replica = 0;
    for _ in 0..20 {
        let (port, n) = read(&reader, "t").await;
        assert_eq!(n, 1, "timeline 2 has only the kept row");
        on_replica += usize::from(port == cluster.port(2));
    }
    assert!(on_replica > 0, "no token read reached the replica");
    assert!(counter("pgfresh_routed_total{target=\"replica\",reason=\"token\"}") > before);

    // Past the switch point: the new primary never had it. The primary answers, counted.
    let diverged = counter("pgfresh_token_reads_total{outcome=\"diverged\"}");
    reader
        .batch_execute(&format!("SET pgfresh.min_lsn = '{lost}'"))
        .await
        .unwrap();
    for _ in 0..10 {
        let (port, n) = read(&reader, "t").await;
        assert_eq!(
            port,
            cluster.port(1),
            "a diverged token reads on the primary"
        );
        assert_eq!(n, 1);
    }
    assert!(counter("pgfresh_token_reads_total{outcome=\"diverged\"}") >= diverged + 10);
}
