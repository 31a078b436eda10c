//! Destructive checks on a private cluster, in one sequence: a stopped standby is marked
//! down and returns; the primary stops, a standby is promoted, the other follows it, and
//! the view names the new primary.

mod common;

use common::{current_lsn, settings, start, until, DEADLINE};
use pgfresh_balancer::{ClusterEvent, Ineligible, Role};
use pgfresh_localcluster::{ClusterOptions, LocalCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_down_and_failover() {
    let c = LocalCluster::start(ClusterOptions::default()).expect("private cluster");
    let b = start(&c, settings(&c)).await;
    until(&b, "initial roles", |v| {
        v.primary == Some(0) && v.nodes[1].eligible && v.nodes[2].eligible
    })
    .await;
    let mut events = b.subscribe();

    // A stopped standby is down, leaves the pool, and comes back when restarted.
    c.stop_node(2).unwrap();
    let v = until(&b, "node 2 down", |v| {
        v.nodes[2].ineligible_reason == Some(Ineligible::Down)
    })
    .await;
    assert!(!v.nodes[2].healthy);
    assert_eq!(v.nodes[2].role, Role::Unknown);
    assert!(v.nodes[2].last_error.is_some());
    assert_eq!(v.primary, Some(0));
    c.start_node(2).unwrap();
    until(&b, "node 2 back", |v| v.nodes[2].eligible).await;

    // Failover: the primary stops, node 1 is promoted, node 2 follows node 1.
    c.wait_caught_up(1, DEADLINE).unwrap();
    c.wait_caught_up(2, DEADLINE).unwrap();
    let old_tl = b.view().nodes[0].timeline.unwrap();
    c.stop_node(0).unwrap();
    until(&b, "no primary", |v| {
        v.primary.is_none() && !v.nodes[0].healthy
    })
    .await;
    c.promote(1).unwrap();
    let v = until(&b, "node 1 primary", |v| v.primary == Some(1)).await;
    assert_eq!(v.nodes[1].role, Role::Primary);
    assert!(v.nodes[1].timeline.unwrap() > old_tl);
    c.repoint_standby(2, 1).unwrap();
    let v = until(&b, "node 2 follows node 1", |v| {
        v.nodes[2].eligible && v.nodes[2].timeline == v.nodes[1].timeline
    })
    .await;
    assert_eq!(v.nodes[0].ineligible_reason, Some(Ineligible::Down));
    assert_eq!(v.nodes[1].ineligible_reason, Some(Ineligible::NotStandby));

    // Writes on the new primary are waited for on the follower.
    c.psql(1, "postgres", "CREATE TABLE after_failover (v int)")
        .unwrap();
    let lsn = current_lsn(&c, 1);
    let node = b
        .wait_for(lsn, tokio::time::Instant::now() + DEADLINE)
        .await
        .unwrap();
    assert_eq!(node, 2);

    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    for want in [
        ClusterEvent::RoleChanged {
            node: 2,
            from: Role::Standby,
            to: Role::Unknown,
        },
        ClusterEvent::RoleChanged {
            node: 2,
            from: Role::Unknown,
            to: Role::Standby,
        },
        ClusterEvent::RoleChanged {
            node: 0,
            from: Role::Primary,
            to: Role::Unknown,
        },
        ClusterEvent::PrimaryChanged {
            from: Some(0),
            to: None,
        },
        ClusterEvent::RoleChanged {
            node: 1,
            from: Role::Standby,
            to: Role::Primary,
        },
        ClusterEvent::PrimaryChanged {
            from: None,
            to: Some(1),
        },
    ] {
        assert!(seen.contains(&want), "missing {want:?} in {seen:#?}");
    }
    b.shutdown();
}
