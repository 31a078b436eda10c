//! Adding and removing nodes by editing the config file, while clients stay connected.

use std::time::Duration;

use pgfresh_tests::admin::write_config;
use pgfresh_tests::*;

fn node_block(i: usize) -> String {
    format!(
        "[[nodes]]\nname = \"pg{i}\"\nhost = \"127.0.0.1\"\nport = {}\n\n",
        node_port(i)
    )
}

async fn ports_seen(
    c: &tokio_postgres::Client,
    sql: &str,
    reads: usize,
) -> std::collections::HashSet<u16> {
    let mut seen = std::collections::HashSet::new();
    for _ in 0..reads {
        let row = c.query_one(sql, &[]).await.unwrap();
        seen.insert(row.get::<_, i32>(0) as u16);
    }
    seen
}

#[tokio::test]
async fn nodes_added_and_removed_live() {
    let full = config_text("");
    let without_pg2 = full.replace(&node_block(2), "");
    assert_ne!(full, without_pg2, "the test config lists pg2");
    let p = start_proxy(&without_pg2);
    let c = p.connect().await;
    let t = p.cold_table(&c, "nodes").await;
    let sql = format!("SELECT inet_server_port() FROM {t}");
    let (pg1, pg2) = (node_port(1), node_port(2));
    assert!(
        !ports_seen(&c, &sql, 30).await.contains(&pg2),
        "pg2 is not configured yet"
    );

    // Add pg2: it is monitored, joins the read pool, and the same session reads from it.
    write_config(&p.config_path, &full);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if ports_seen(&c, &sql, 20).await.contains(&pg2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pg2 never served a read after being added"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Remove pg1: it leaves the pool at once, its connections are closed, and the session
    // (which has used pg1) goes on with the others.
    write_config(&p.config_path, &full.replace(&node_block(1), ""));
    let shared = p.shared.clone();
    eventually("pg1 retired", Duration::from_secs(30), || {
        shared
            .balancer
            .view()
            .nodes
            .iter()
            .any(|n| n.spec.name == "pg1" && n.retired)
    })
    .await;
    let seen = ports_seen(&c, &sql, 50).await;
    assert!(
        !seen.contains(&pg1),
        "a removed node served a read: {seen:?}"
    );
    assert!(seen.contains(&pg2), "{seen:?}");
    // New sessions work too.
    let c2 = p.connect().await;
    assert!(!ports_seen(&c2, &sql, 20).await.contains(&pg1));
}
