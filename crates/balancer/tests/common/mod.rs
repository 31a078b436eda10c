//! Helpers shared by the integration tests.

use std::sync::Arc;
use std::time::Duration;

use pgfresh_balancer::{Balancer, ClusterView, MonitorSettings, NodeSpec};
use pgfresh_localcluster::LocalCluster;
use pgfresh_lsn::Lsn;

pub const PERIOD: Duration = Duration::from_millis(50);
pub const DEADLINE: Duration = Duration::from_secs(30);

pub fn specs(c: &LocalCluster) -> Vec<NodeSpec> {
    c.nodes()
        .iter()
        .map(|n| NodeSpec {
            name: n.name.clone(),
            host: c.host().to_string(),
            port: n.port,
            weight: 1,
            patroni_url: None,
            tls: Default::default(),
        })
        .collect()
}

pub fn settings(c: &LocalCluster) -> MonitorSettings {
    let (user, password) = c.superuser();
    MonitorSettings {
        user: user.to_string(),
        password: password.to_string(),
        database: "postgres".to_string(),
        sr_check_period: PERIOD,
        health_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        ..MonitorSettings::default()
    }
}

/// Starts a balancer on `c` and waits for its first complete round of polls.
pub async fn start(c: &LocalCluster, settings: MonitorSettings) -> Balancer {
    let b = Balancer::start(specs(c), settings);
    assert!(b.wait_ready(tokio::time::Instant::now() + DEADLINE).await);
    b
}

/// Polls the view, with the replay positions learned since it was published
/// ([`Balancer::view_now`]), until `pred` holds; panics with the last view after
/// [`DEADLINE`].
pub async fn until(
    b: &Balancer,
    what: &str,
    mut pred: impl FnMut(&ClusterView) -> bool,
) -> Arc<ClusterView> {
    poll(what, || {
        let v = Arc::new(b.view_now());
        if pred(&v) {
            Ok(v)
        } else {
            Err(v)
        }
    })
    .await
}

/// The one poll loop of these tests: `check` every 10 ms until it gives `Ok`; after
/// [`DEADLINE`] panics with `what` and the last `Err` (what was seen instead).
pub async fn poll<T, Last: std::fmt::Debug>(
    what: &str,
    mut check: impl FnMut() -> Result<T, Last>,
) -> T {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match check() {
            Ok(v) => return v,
            Err(last) => assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; last seen: {last:#?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The node's current WAL position (on the primary) via psql.
pub fn current_lsn(c: &LocalCluster, primary: usize) -> Lsn {
    c.psql(primary, "postgres", "SELECT pg_current_wal_lsn()")
        .unwrap()
        .parse()
        .unwrap()
}

/// Polls `sql` on node `i` until it prints `want`.
#[allow(dead_code)] // not every test binary waits on SQL
pub async fn until_sql(c: &LocalCluster, i: usize, sql: &str, want: &str) {
    let what = format!("{sql:?} to print {want:?} on node {i}");
    poll(&what, || {
        let got = c.psql(i, "postgres", sql).unwrap();
        if got == want {
            Ok(())
        } else {
            Err(got)
        }
    })
    .await
}
