//! Non-destructive checks on the shared primary + 2 standbys: lag from paused replay and
//! apply delay, pool membership, waiting for a position, and live node-set changes.

mod common;

use std::time::Duration;

use common::{current_lsn, settings, specs, start, until, until_sql, DEADLINE, PERIOD};
use pgfresh_balancer::{Balancer, ClusterEvent, Ineligible, Role, WaitTimeout};
use pgfresh_localcluster::LocalCluster;

/// The tests pause replicas of one shared cluster: run them one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Undoes whatever an earlier (possibly failed) test left on the standbys.
fn reset(c: &LocalCluster) {
    for i in 1..3 {
        c.resume_replay(i).unwrap();
        c.set_apply_delay(i, 0).unwrap();
    }
}

fn all_good(v: &pgfresh_balancer::ClusterView) -> bool {
    v.primary == Some(0) && v.nodes[1].eligible && v.nodes[2].eligible
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_replica_lags_leaves_pool_and_returns() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    // The shortest supported poll period.
    let mut s = settings(c);
    s.sr_check_period = Duration::from_millis(10);
    let b = start(c, s).await;
    let v = until(&b, "initial roles", all_good).await;
    assert_eq!(v.nodes[0].role, Role::Primary);
    assert_eq!(v.nodes[0].ineligible_reason, Some(Ineligible::NotStandby));
    assert_eq!(v.nodes[1].role, Role::Standby);
    assert!(v.nodes[1].streaming);
    assert_eq!(v.nodes[1].timeline, v.nodes[0].timeline);
    let mut events = b.subscribe();
    // Node 1 replays everything up to a known write before it is paused.
    c.psql(0, "app", "CREATE TABLE IF NOT EXISTS bal_t (v int)")
        .unwrap();
    c.wait_caught_up(1, DEADLINE).unwrap();

    c.pause_replay(1).unwrap();
    let paused_at = std::time::Instant::now();
    // The second poll of node 1 recorded after the pause started after it: it must show it.
    let mut polls_after = Vec::new();
    let v = until(&b, "two polls of node 1 after the pause", |v| {
        let ok = v.nodes[1].last_poll_ok;
        if let Some(t) = ok.filter(|t| *t > paused_at) {
            if polls_after.last() != Some(&t) {
                polls_after.push(t);
            }
        }
        polls_after.len() >= 2
    })
    .await;
    // `until` re-reads the view; the predicate only collected timestamps.
    assert!(!v.nodes[1].eligible);
    assert_eq!(v.nodes[1].ineligible_reason, Some(Ineligible::Paused));
    assert!(v.nodes[2].eligible);

    c.psql(
        0,
        "app",
        "CREATE TABLE IF NOT EXISTS bal_t (v int); INSERT INTO bal_t VALUES (1)",
    )
    .unwrap();
    let v = until(&b, "lag on node 1", |v| {
        v.nodes[1].lag_bytes.unwrap_or(0) > 0 && v.nodes[1].lag_ms.unwrap_or(0) > 0
    })
    .await;
    assert!(v.max_lag_bytes >= v.nodes[1].lag_bytes);
    assert!(v.max_lag_ms >= v.nodes[1].lag_ms);
    assert!(v.nodes[1].replay_lsn < v.primary_lsn);
    for _ in 0..200 {
        assert_eq!(*b.select_replica(None).unwrap(), 2);
    }
    let mut saw_leave = false;
    while let Ok(e) = events.try_recv() {
        if e == (ClusterEvent::EligibilityChanged {
            node: 1,
            eligible: false,
            reason: Some(Ineligible::Paused),
        }) {
            saw_leave = true;
        }
    }
    assert!(saw_leave, "no eligibility event for the paused replica");

    c.resume_replay(1).unwrap();
    until(&b, "node 1 caught up and back in the pool", |v| {
        v.nodes[1].eligible && v.nodes[1].lag_bytes == Some(0) && v.nodes[1].lag_ms == Some(0)
    })
    .await;
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_lag_threshold_with_apply_delay() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    let mut s = settings(c);
    s.delay_threshold_ms = Some(300);
    s.delay_threshold_bytes = Some(1 << 30);
    let b = start(c, s).await;
    until(&b, "initial roles", all_good).await;

    // Node 2 replays a known write before replay is held back; the next commit then sits
    // unreplayed, and its time lag grows from when the primary was seen past it.
    c.psql(
        0,
        "app",
        "CREATE TABLE IF NOT EXISTS bal_d (v int); INSERT INTO bal_d VALUES (1)",
    )
    .unwrap();
    c.wait_caught_up(2, DEADLINE).unwrap();
    c.set_apply_delay(2, 60_000).unwrap();
    c.psql(0, "app", "INSERT INTO bal_d VALUES (2)").unwrap();
    let v = until(&b, "node 2 out on time lag", |v| {
        v.nodes[2].ineligible_reason == Some(Ineligible::LaggingTime)
    })
    .await;
    assert!(v.nodes[2].lag_ms.is_some_and(|ms| ms > 300), "{v:#?}");
    assert!(v.nodes[1].eligible);

    c.set_apply_delay(2, 0).unwrap();
    until(&b, "node 2 back", |v| v.nodes[2].eligible).await;
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_position() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    let b = start(c, settings(c)).await;
    until(&b, "initial roles", all_good).await;
    let deadline = || tokio::time::Instant::now() + DEADLINE;

    // Caught-up replicas: resolves on the first poll that shows the position.
    c.psql(
        0,
        "app",
        "CREATE TABLE IF NOT EXISTS bal_w (v int); INSERT INTO bal_w VALUES (1)",
    )
    .unwrap();
    let lsn = current_lsn(c, 0);
    let node = b.wait_for(lsn, deadline()).await.unwrap();
    assert!(node == 1 || node == 2);

    // Both replicas paused: it waits, and resolves when one resumes.
    c.pause_replay(1).unwrap();
    c.pause_replay(2).unwrap();
    until(&b, "both paused", |v| {
        !v.nodes[1].eligible && !v.nodes[2].eligible
    })
    .await;
    c.psql(0, "app", "INSERT INTO bal_w VALUES (2)").unwrap();
    let lsn = current_lsn(c, 0);
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            b.wait_for(lsn, tokio::time::Instant::now() + DEADLINE)
                .await
        })
    };
    // Several polls later it is still waiting.
    let generation = b.view().generation;
    until(&b, "more polls", |v| v.generation >= generation + 6).await;
    assert!(!waiter.is_finished());
    c.resume_replay(2).unwrap();
    assert_eq!(waiter.await.unwrap(), Ok(2));

    // Replicas that never reach the position: the wait times out.
    c.pause_replay(2).unwrap();
    until(&b, "node 2 paused again", |v| !v.nodes[2].eligible).await;
    c.psql(0, "app", "INSERT INTO bal_w VALUES (3)").unwrap();
    let unreachable = current_lsn(c, 0);
    let short = tokio::time::Instant::now() + Duration::from_millis(500);
    assert_eq!(
        b.wait_for(unreachable, short).await,
        Err(WaitTimeout {
            required: unreachable
        })
    );
    c.resume_replay(2).unwrap();
    c.resume_replay(1).unwrap();
    until(&b, "both back", all_good).await;
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_primary_wal_without_transactions_keeps_replicas_in_pool() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    let mut s = settings(c);
    s.sr_check_period = Duration::from_millis(10);
    s.delay_threshold_ms = Some(200);
    s.delay_threshold_bytes = Some(1 << 30);
    let b = start(c, s).await;
    until(&b, "initial roles", all_good).await;
    let mut events = b.subscribe();
    // Each CHECKPOINT writes WAL but no transaction: the last replayed commit keeps getting
    // older than the threshold while the replicas stay milliseconds behind.
    for _ in 0..10 {
        let generation = b.view().generation;
        until(&b, "some idle polls", |v| v.generation >= generation + 60).await;
        c.psql(0, "postgres", "CHECKPOINT").unwrap();
    }
    let generation = b.view().generation;
    let v = until(&b, "polls after the last checkpoint", |v| {
        v.generation >= generation + 60 && all_good(v)
    })
    .await;
    assert!(v.nodes[1].lag_ms.is_some() && v.nodes[2].lag_ms.is_some());
    while let Ok(e) = events.try_recv() {
        assert!(
            !matches!(
                e,
                ClusterEvent::EligibilityChanged {
                    eligible: false,
                    ..
                }
            ),
            "a replica left the pool on an idle primary: {e:?}"
        );
    }
    b.shutdown();
}

/// Monitor connections currently open on node `i`.
fn monitor_connections(c: &LocalCluster, i: usize) -> u32 {
    c.psql(
        i,
        "postgres",
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgfresh-monitor'",
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_added_and_removed_live() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    let all = specs(c);
    let b = Balancer::start(all[..2].to_vec(), settings(c));
    assert!(b.wait_ready(tokio::time::Instant::now() + DEADLINE).await);
    let v = until(&b, "node 1 eligible", |v| {
        v.primary == Some(0) && v.nodes[1].eligible
    })
    .await;
    assert_eq!(v.nodes.len(), 2);
    // Held across the updates: counters are kept by id.
    let held = b.select_replica(None).unwrap();
    assert_eq!(*held, 1);

    // Node 2 joins with the next id.
    let mut events = b.subscribe();
    assert_eq!(b.update_nodes(all.clone()), vec![0, 1, 2]);
    let v = b.view();
    assert_eq!(v.nodes.len(), 3);
    assert_eq!(v.nodes[1].outstanding, 1);
    assert!(!v.nodes[2].retired);
    let v = until(&b, "node 2 eligible", |v| {
        v.primary == Some(0) && v.nodes[1].eligible && v.nodes[2].eligible
    })
    .await;
    assert_eq!(v.nodes[2].spec, all[2]);
    assert_eq!(v.nodes[2].role, Role::Standby);
    assert!(b.wait_ready(tokio::time::Instant::now() + DEADLINE).await);
    let mut joined = false;
    while let Ok(e) = events.try_recv() {
        assert!(
            !matches!(e, ClusterEvent::PrimaryChanged { .. }),
            "the primary did not change: {e:?}"
        );
        joined |= e
            == ClusterEvent::EligibilityChanged {
                node: 2,
                eligible: true,
                reason: None,
            };
    }
    assert!(joined, "no event for node 2 joining the pool");

    // Node 1 is dropped, with a new weight for node 2: node 1 is retired, stays in the
    // view, and its monitor connection closes.
    let mut reweighted = all[2].clone();
    reweighted.weight = 5;
    assert_eq!(b.update_nodes(vec![all[0].clone(), reweighted]), vec![0, 2]);
    let v = b.view();
    assert!(v.nodes[1].retired);
    assert_eq!(v.nodes[1].ineligible_reason, Some(Ineligible::Removed));
    assert_eq!(v.nodes[1].role, Role::Unknown);
    assert!(!v.nodes[1].healthy && !v.nodes[1].eligible);
    assert_eq!(v.nodes[1].spec, all[1], "the last spec stays visible");
    assert_eq!(v.nodes[2].spec.weight, 5);
    assert_eq!(v.active().collect::<Vec<_>>(), vec![0, 2]);
    until(&b, "node 1's monitor connection closed", |_| {
        monitor_connections(c, 1) == 0
    })
    .await;
    // Connections of balancers from earlier tests may take a moment to go.
    until(&b, "exactly node 2's own monitor connection", |_| {
        monitor_connections(c, 2) == 1
    })
    .await;
    let generation = b.view().generation;
    let v = until(&b, "more polls after the removal", |v| {
        v.generation >= generation + 6
    })
    .await;
    assert_eq!(v.primary, Some(0));
    assert!(v.nodes[1].retired && !v.nodes[1].healthy);
    assert_eq!(v.nodes[1].ineligible_reason, Some(Ineligible::Removed));
    assert!(v.nodes[2].eligible);
    for _ in 0..500 {
        assert_eq!(*b.select_replica(None).unwrap(), 2);
    }
    let mut removed = false;
    while let Ok(e) = events.try_recv() {
        assert!(
            !matches!(e, ClusterEvent::PrimaryChanged { .. }),
            "the primary did not change: {e:?}"
        );
        removed |= e
            == ClusterEvent::EligibilityChanged {
                node: 1,
                eligible: false,
                reason: Some(Ineligible::Removed),
            };
    }
    assert!(removed, "no event for node 1's removal");

    // Ids keep working: the held selection releases node 1's counter, and waiting for a
    // position resolves on node 2 only.
    drop(held);
    b.update_weights(vec![1, 1]);
    let v = b.view();
    assert_eq!(v.nodes[1].outstanding, 0);
    assert_eq!(v.nodes[2].spec.weight, 1);
    c.psql(
        0,
        "app",
        "CREATE TABLE IF NOT EXISTS bal_n (v int); INSERT INTO bal_n VALUES (1)",
    )
    .unwrap();
    let lsn = current_lsn(c, 0);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    assert_eq!(b.wait_for(lsn, deadline).await, Ok(2));
    assert_eq!(b.primary(), Some(0));
    b.shutdown();
}

/// Inserts a row on the primary and returns the position after it.
fn write_something(c: &LocalCluster) -> pgfresh_lsn::Lsn {
    c.psql(
        0,
        "app",
        "CREATE TABLE IF NOT EXISTS bal_fast (v int); INSERT INTO bal_fast VALUES (1)",
    )
    .unwrap();
    current_lsn(c, 0)
}

/// A sample answered within `replay_check_period` is as fresh as the standby's fast poll
/// would be: the poll waits a period from it. Both standbys answer a sample (with a
/// position older than the one wanted, as samples taken before the write would), then
/// reads wait on the write's position: neither standby is polled for it before a period
/// has passed since its sample, and both are once it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_sample_defers_the_standbys_fast_poll() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    let period = Duration::from_secs(3);
    let mut s = settings(c);
    s.sr_check_period = Duration::from_secs(600);
    s.health_timeout = Duration::from_secs(1200);
    s.replay_check_period = period;
    let b = start(c, s).await;
    until(&b, "initial roles", all_good).await;
    let old = b
        .view()
        .nodes
        .iter()
        .map(|n| n.replay_lsn)
        .collect::<Vec<_>>();
    let lsn = write_something(c);
    let replayed = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'");
    until_sql(c, 1, &replayed, "t").await;
    until_sql(c, 2, &replayed, "t").await;
    let sampled = tokio::time::Instant::now();
    for node in [1, 2] {
        b.learn_replay(node, old[node].expect("a replay position"));
    }
    until(&b, "both standbys polled for the wanted position", |v| {
        let known = (1..=2).all(|n| v.nodes[n].replay_lsn >= Some(lsn));
        if !known {
            // A read waits on the position (the demand lasts a second after the last).
            drop(b.select_replica(Some(lsn)));
        }
        known
    })
    .await;
    assert!(
        sampled.elapsed() >= period,
        "polled {:?} after the samples, within the period",
        sampled.elapsed()
    );
    b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_replay_polls_run_while_reads_wait_and_there_is_something_new() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    // Full polls so far apart that none happens during the test: only the fast replay
    // polls can tell the balancer about a new replay position.
    let mut s = settings(c);
    s.sr_check_period = Duration::from_secs(600);
    s.health_timeout = Duration::from_secs(1200);
    let b = start(c, s.clone()).await;
    until(&b, "initial roles", all_good).await;

    // No read has waited: the replay is not polled although both standbys moved on.
    let before = b.view();
    let lsn = write_something(c);
    let replayed = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'");
    until_sql(c, 1, &replayed, "t").await;
    until_sql(c, 2, &replayed, "t").await;
    let after = b.view();
    assert_eq!(after.generation, before.generation, "nothing was polled");
    assert!(after.nodes[1].replay_lsn < Some(lsn));

    // A read needs the position: no replica is known to have it, and a wait sees one
    // at the next fast poll (milliseconds, not the next full poll in ten minutes).
    assert!(b.select_replica(Some(lsn)).is_none());
    let node = b
        .wait_for(lsn, tokio::time::Instant::now() + DEADLINE)
        .await
        .unwrap();
    assert!(node == 1 || node == 2);
    until(
        &b,
        "both standbys known at the position the read asked for",
        |v| v.nodes[1].replay_lsn >= Some(lsn) && v.nodes[2].replay_lsn >= Some(lsn),
    )
    .await;
    // The demand lasts, but a standby known to have every position asked for has nothing
    // to tell: a later write pgfresh did not commit is not polled for although both
    // standbys replayed it.
    let lsn = write_something(c);
    let replayed = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'");
    until_sql(c, 1, &replayed, "t").await;
    until_sql(c, 2, &replayed, "t").await;
    let known = b.view_now();
    assert!(
        known.nodes[1].replay_lsn < Some(lsn) && known.nodes[2].replay_lsn < Some(lsn),
        "polled with nothing wanted: {:?}",
        [known.nodes[1].replay_lsn, known.nodes[2].replay_lsn]
    );
    // A commit pgfresh saw is polled for without a read asking.
    b.note_commit(lsn);
    until(&b, "the noted commit replayed", |v| {
        v.nodes[1].replay_lsn >= Some(lsn) && v.nodes[2].replay_lsn >= Some(lsn)
    })
    .await;
    // And one it did not see, as soon as a read asks for it.
    let lsn = write_something(c);
    let node = b
        .wait_for(lsn, tokio::time::Instant::now() + DEADLINE)
        .await
        .unwrap();
    assert!(node == 1 || node == 2);
    b.shutdown();

    // Control: with the fast polls off, the same wait only ends at its deadline.
    s.replay_check_period = Duration::ZERO;
    let b = start(c, s).await;
    until(&b, "initial roles", all_good).await;
    let lsn = write_something(c);
    until_sql(
        c,
        1,
        &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'"),
        "t",
    )
    .await;
    let short = tokio::time::Instant::now() + Duration::from_secs(1);
    assert_eq!(
        b.wait_for(lsn, short).await,
        Err(WaitTimeout { required: lsn })
    );
    b.shutdown();
}

/// A pgfresh-ring runtime on its own thread inside the test's tokio runtime, as the
/// proxy's sessions have with `io_engine = "io_uring"`; stopped when dropped.
struct TestRing {
    handle: pgfresh_ring::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestRing {
    fn start() -> TestRing {
        let tokio = tokio::runtime::Handle::current();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _tokio = tokio.enter();
            let rt = pgfresh_ring::Runtime::new(256).expect("an io_uring");
            ready_tx.send(rt.handle()).unwrap();
            rt.block_on(async move {
                let _ = stopped.await;
            });
        });
        TestRing {
            handle: ready_rx.recv().unwrap(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Waits until `n` tasks are alive on the ring.
    async fn until_tasks(&self, n: usize, what: &str) {
        common::poll(what, || match self.handle.tasks() {
            t if t == n => Ok(()),
            t => Err(format!("{t} tasks on the ring, not {n}")),
        })
        .await;
    }
}

impl Drop for TestRing {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// With the sessions' ring given (`io_engine = "io_uring"`), the standbys' fast replay
/// polls run there, each over a connection of the ring's own, and end with the balancer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_replay_polls_run_on_the_sessions_ring() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    let ring = TestRing::start();
    // Full polls so far apart that none happens during the test: only the fast polls can
    // tell the balancer about a new replay position.
    let mut s = settings(c);
    s.sr_check_period = Duration::from_secs(600);
    s.health_timeout = Duration::from_secs(1200);
    let b = Balancer::start_on(specs(c), s, Some(ring.handle.clone()));
    assert!(b.wait_ready(tokio::time::Instant::now() + DEADLINE).await);
    until(&b, "initial roles", all_good).await;
    // One fast-poll task per standby, waiting for reads to need a position; no
    // connection is opened before one does.
    ring.until_tasks(2, "a fast-poll task per standby").await;

    let lsn = write_something(c);
    let replayed = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'");
    until_sql(c, 1, &replayed, "t").await;
    until_sql(c, 2, &replayed, "t").await;
    assert!(b.select_replica(Some(lsn)).is_none());
    let node = b
        .wait_for(lsn, tokio::time::Instant::now() + DEADLINE)
        .await
        .unwrap();
    assert!(node == 1 || node == 2);
    until(&b, "both standbys known at the position", |v| {
        v.nodes[1].replay_lsn >= Some(lsn) && v.nodes[2].replay_lsn >= Some(lsn)
    })
    .await;
    // Each standby's connection is its poller's own, read and written by that task on
    // the ring: no driver task beside it.
    let monitors =
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgfresh-monitor'";
    until_sql(c, 1, monitors, "2").await;
    ring.until_tasks(2, "only the pollers on the ring").await;

    // Shut down, the balancer leaves nothing running on the ring.
    b.shutdown();
    ring.until_tasks(0, "the fast polls ended with the balancer")
        .await;
    until_sql(c, 1, monitors, "0").await;
}

/// With `replay_from_primary`, the primary's full poll matches its walsenders to both
/// standbys (each streams from the primary's host and port under its own application
/// name), and while reads wait on a position the primary's monitor reads their reports
/// on the sessions' ring, over a second connection to the primary. Switched off, nothing
/// is matched and the primary gets no second connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_reports_its_standbys_replay_on_the_ring() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    let ring = TestRing::start();
    let mut s = settings(c);
    s.replay_from_primary = true;
    let b = Balancer::start_on(specs(c), s.clone(), Some(ring.handle.clone()));
    assert!(b.wait_ready(tokio::time::Instant::now() + DEADLINE).await);
    until(&b, "initial roles", all_good).await;
    // Matched at a full poll of the primary once the standbys' own polls named them.
    common::poll("both standbys matched to the primary's walsenders", || {
        let matched = b.reported_standbys();
        if matched == [1, 2] {
            Ok(())
        } else {
            Err(matched)
        }
    })
    .await;
    // A fast-poll task for each standby and one for the primary's reports.
    ring.until_tasks(3, "a fast-poll task per node").await;

    // Both standbys stop replaying: a read waits on a later write that no standby can be
    // known to have (not even from a full poll), and the reports are read every period
    // while it waits.
    c.pause_replay(1).unwrap();
    c.pause_replay(2).unwrap();
    let lsn = write_something(c);
    let reports = "SELECT count(*) FROM pg_stat_activity \
                   WHERE application_name = 'pgfresh-monitor' \
                   AND query LIKE '%pg_stat_get_wal_senders%'";
    common::poll("the standbys' reports read on the primary", || {
        drop(b.select_replica(Some(lsn)));
        let got = c.psql(0, "postgres", reports).unwrap();
        if got == "1" {
            Ok(())
        } else {
            Err(got)
        }
    })
    .await;
    c.resume_replay(1).unwrap();
    c.resume_replay(2).unwrap();
    let node = b
        .wait_for(lsn, tokio::time::Instant::now() + DEADLINE)
        .await
        .unwrap();
    assert!(node == 1 || node == 2);
    b.shutdown();
    ring.until_tasks(0, "the fast polls ended with the balancer")
        .await;

    // Control: switched off.
    s.replay_from_primary = false;
    let b = Balancer::start_on(specs(c), s, Some(ring.handle.clone()));
    assert!(b.wait_ready(tokio::time::Instant::now() + DEADLINE).await);
    let v = until(&b, "initial roles", all_good).await;
    until(&b, "a few more full polls", |now| {
        now.generation >= v.generation + 6
    })
    .await;
    assert!(b.reported_standbys().is_empty());
    ring.until_tasks(2, "a fast-poll task per standby only")
        .await;
    let lsn = write_something(c);
    b.wait_for(lsn, tokio::time::Instant::now() + DEADLINE)
        .await
        .unwrap();
    let monitors =
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgfresh-monitor'";
    until_sql(c, 0, monitors, "1").await;
    b.shutdown();
    ring.until_tasks(0, "the fast polls ended with the balancer")
        .await;
}

/// A ring that ended (or stalls) never runs the windows it is handed: the monitor gives
/// it up a grace after the window should have ended, and its full polls go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_polls_go_on_when_the_ring_does_not_run_the_fast_ones() {
    let _serial = SERIAL.lock().await;
    let c = LocalCluster::shared();
    reset(c);
    let ring = TestRing::start();
    let gone = ring.handle.clone();
    drop(ring);
    let s = settings(c);
    let grace = s.connect_timeout + s.health_timeout * 2 + Duration::from_secs(1);
    let b = Balancer::start_on(specs(c), s, Some(gone));
    assert!(b.wait_ready(tokio::time::Instant::now() + DEADLINE).await);
    let started = std::time::Instant::now();
    // Polls of standby 1 well after its first window should have been given up.
    until(&b, "full polls of a standby after the grace", |v| {
        v.nodes[1]
            .last_poll_ok
            .is_some_and(|t| t > started + grace + PERIOD * 2)
    })
    .await;
    b.shutdown();
}
