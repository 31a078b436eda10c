//! Timelines on a private primary + 1 standby: the standby is cut off, the old primary
//! takes one more write, stops, and the standby is promoted. The view then knows timeline
//! 2 and its history: a position written before the cut translates to the new timeline,
//! the write the new primary never received is diverged. A monitor role that may not read
//! the history file sees it as unknown until it is granted the right.

mod common;

use common::{current_lsn, settings, start, until, until_sql, DEADLINE};
use pgfresh_balancer::{Role, Translation};
use pgfresh_localcluster::{ClusterOptions, LocalCluster};
use pgfresh_lsn::{Lsn, Position};

/// The primary's insert position as a `TLI/X/Y` token, as an application would record it.
fn token(c: &LocalCluster, node: usize) -> Position {
    let row = c
        .psql(
            node,
            "postgres",
            "SELECT substr(pg_walfile_name(lsn), 1, 8) || ' ' || lsn \
             FROM pg_current_wal_lsn() AS lsn",
        )
        .unwrap();
    let (file_tli, lsn) = row.split_once(' ').unwrap();
    let tli = u32::from_str_radix(file_tli, 16).unwrap();
    format!("{tli}/{lsn}").parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_with_a_diverged_write() {
    let c = LocalCluster::start(ClusterOptions {
        standbys: 1,
        users: vec![("mon".to_string(), "mon-pw".to_string())],
        ..ClusterOptions::default()
    })
    .expect("private cluster");
    let b = start(&c, settings(&c)).await;
    let mut restricted = settings(&c);
    restricted.user = "mon".to_string();
    restricted.password = "mon-pw".to_string();
    let r = start(&c, restricted).await;
    let v = until(&b, "initial roles", |v| {
        v.primary == Some(0) && v.nodes[1].eligible
    })
    .await;
    assert_eq!(v.primary_timeline, Some(1));
    assert_eq!(v.nodes[1].timeline, Some(1));
    assert_eq!(v.timeline_history.as_ref().unwrap().timeline(), 1);

    // A write both nodes have.
    c.psql(
        0,
        "postgres",
        "CREATE TABLE t (v int); INSERT INTO t VALUES (1)",
    )
    .unwrap();
    let kept = token(&c, 0);
    assert_eq!(kept.tli(), 1);
    assert!(kept.lsn() <= current_lsn(&c, 0));
    c.wait_caught_up(1, DEADLINE).unwrap();
    assert_eq!(b.view().translate(&kept), Translation::Current(kept.lsn()));
    let v = until(&b, "the standby replayed the kept write", |v| {
        v.nodes[1].replay_lsn >= Some(kept.lsn())
    })
    .await;
    assert_eq!(*b.select_replica_for(kept).unwrap(), 1, "{:?}", v.nodes[1]);

    // Cut the standby off: without a WAL receiver its timeline comes from pg_control.
    c.psql(1, "postgres", "ALTER SYSTEM SET primary_conninfo = ''")
        .unwrap();
    c.psql(1, "postgres", "SELECT pg_reload_conf()").unwrap();
    until_sql(&c, 1, "SELECT count(*) FROM pg_stat_wal_receiver", "0").await;
    let v = until(&b, "the standby not streaming", |v| !v.nodes[1].streaming).await;
    assert_eq!(v.nodes[1].timeline, Some(1), "{:?}", v.nodes[1]);

    // One more write on the old primary, which the standby never receives.
    c.psql(0, "postgres", "INSERT INTO t VALUES (2)").unwrap();
    let lost = token(&c, 0);
    assert!(lost.lsn() > kept.lsn());
    c.stop_node(0).unwrap();
    until(&b, "no primary", |v| v.primary.is_none()).await;
    assert_eq!(b.view().translate(&kept), Translation::Unknown);

    c.promote(1).unwrap();
    let v = until(&b, "node 1 primary on timeline 2 with its history", |v| {
        v.primary == Some(1)
            && v.primary_timeline == Some(2)
            && v.timeline_history
                .as_ref()
                .is_some_and(|h| h.timeline() == 2 && h.switch_point(1).is_some())
    })
    .await;
    assert_eq!(v.nodes[1].role, Role::Primary);
    assert_eq!(v.nodes[1].timeline, Some(2));
    let switch = v
        .timeline_history
        .as_ref()
        .unwrap()
        .switch_point(1)
        .unwrap();
    assert!(
        kept.lsn() <= switch && switch < lost.lsn(),
        "kept {kept}, switch {switch}, lost {lost}"
    );
    assert_eq!(v.translate(&kept), Translation::Current(kept.lsn()));
    assert_eq!(v.translate(&lost), Translation::Diverged { switch });
    let now = token(&c, 1);
    assert_eq!(now.tli(), 2);
    assert_eq!(v.translate(&now), Translation::Current(now.lsn()));
    assert_eq!(
        v.translate(&Position::new(3, Lsn(0)).unwrap()),
        Translation::Unknown
    );
    // No replica is left: a kept position still waits for one (or goes to the primary).
    assert_eq!(
        b.select_replica_for(kept).unwrap_err(),
        Translation::Current(kept.lsn())
    );
    assert_eq!(
        b.select_replica_for(lost).unwrap_err(),
        Translation::Diverged { switch }
    );

    // A monitor role that may not run pg_read_file: the primary and its timeline are
    // known, its history is not, until the role may read it.
    let v = until(&r, "restricted: node 1 primary on timeline 2", |v| {
        v.primary == Some(1) && v.primary_timeline == Some(2)
    })
    .await;
    assert_eq!(v.timeline_history, None);
    assert_eq!(v.translate(&kept), Translation::Unknown);
    assert_eq!(v.translate(&now), Translation::Current(now.lsn()));
    c.psql(
        1,
        "postgres",
        "GRANT EXECUTE ON FUNCTION pg_read_file(text) TO mon",
    )
    .unwrap();
    let v = until(&r, "restricted: history readable after the grant", |v| {
        v.timeline_history.is_some()
    })
    .await;
    assert_eq!(v.translate(&kept), Translation::Current(kept.lsn()));
    assert_eq!(v.translate(&lost), Translation::Diverged { switch });
    r.shutdown();
    b.shutdown();
}
