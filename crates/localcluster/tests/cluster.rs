//! Starts real clusters: writes on the primary reach the standbys, pausing replay hides
//! them until resumed, and authentication follows the configured method.

use std::time::{Duration, Instant};

use pgfresh_localcluster::{AuthMethod, ClusterOptions, LocalCluster};

const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `sql` on node `i` until it prints `want` (errors, such as a table that has not
/// reached the standby yet, count as "not yet").
fn poll_eq(c: &LocalCluster, i: usize, sql: &str, want: &str) {
    let start = Instant::now();
    loop {
        let got = c.psql(i, "app", sql);
        if got.as_deref().ok() == Some(want) {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "node {i}: {sql} gave {got:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Logs in over TCP with psql (as this OS user; psql itself may run as root).
fn tcp_login(c: &LocalCluster, i: usize, user: &str, password: &str, db: &str) -> bool {
    std::process::Command::new(c.bin_dir().join("psql"))
        .args(["-XAtq", "-c", "SELECT 1"])
        .arg(c.conninfo(i, user, password, db))
        .env_remove("PGPASSWORD")
        .stdin(std::process::Stdio::null())
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn shared_cluster_replicates_and_pause_hides_writes() {
    let c = LocalCluster::shared();
    assert_eq!(c.nodes().len(), 3);
    assert_eq!(c.host(), "127.0.0.1");
    assert_eq!(c.psql(0, "app", "SELECT pg_is_in_recovery()").unwrap(), "f");
    for i in 1..3 {
        assert_eq!(c.psql(i, "app", "SELECT pg_is_in_recovery()").unwrap(), "t");
        assert_eq!(
            c.psql(i, "app", "SELECT status FROM pg_stat_wal_receiver")
                .unwrap(),
            "streaming"
        );
    }
    // The extra role can create objects in the public schema of the created database.
    c.psql(
        0,
        "app",
        "SET ROLE app; CREATE TABLE lc_t (v int); INSERT INTO lc_t VALUES (1)",
    )
    .unwrap();
    for i in 1..3 {
        poll_eq(c, i, "SELECT coalesce(sum(v), 0) FROM lc_t", "1");
    }

    c.pause_replay(1).unwrap();
    c.psql(0, "app", "INSERT INTO lc_t VALUES (2)").unwrap();
    c.wait_caught_up(2, DEADLINE).unwrap();
    assert_eq!(c.psql(2, "app", "SELECT sum(v) FROM lc_t").unwrap(), "3");
    assert_eq!(c.psql(1, "app", "SELECT sum(v) FROM lc_t").unwrap(), "1");
    assert!(c.wait_caught_up(1, Duration::from_millis(300)).is_err());
    c.resume_replay(1).unwrap();
    c.wait_caught_up(1, DEADLINE).unwrap();
    assert_eq!(c.psql(1, "app", "SELECT sum(v) FROM lc_t").unwrap(), "3");

    assert!(tcp_login(c, 1, "app", "app-secret", "app"));
    assert!(!tcp_login(c, 1, "app", "wrong", "app"));
    let (su, pw) = c.superuser();
    assert!(tcp_login(c, 0, su, pw, "postgres"));
    assert!(c.data_dir(0).join("PG_VERSION").exists());
    assert!(c.bin_dir().join("pg_ctl").exists());
}

#[test]
fn failover_with_md5_and_teardown() {
    let c = LocalCluster::start(ClusterOptions {
        auth: AuthMethod::Md5,
        users: vec![("u'1".to_string(), "p w".to_string())],
        ..ClusterOptions::default()
    })
    .expect("cluster");
    let dir = c.data_dir(0).parent().unwrap().to_path_buf();
    let stored = c
        .psql(
            0,
            "postgres",
            "SELECT left(rolpassword, 3) FROM pg_authid WHERE rolname = 'u''1'",
        )
        .unwrap();
    assert_eq!(stored, "md5");
    assert!(tcp_login(&c, 0, "u'1", "p w", "postgres"));
    assert!(!tcp_login(&c, 0, "u'1", "pw", "postgres"));
    c.psql(
        0,
        "postgres",
        "CREATE TABLE f (v int); INSERT INTO f VALUES (1)",
    )
    .unwrap();
    c.wait_caught_up(1, DEADLINE).unwrap();
    c.wait_caught_up(2, DEADLINE).unwrap();

    // Old primary goes away; node 1 takes over; node 2 follows it.
    c.stop_node(0).unwrap();
    c.promote(1).unwrap();
    assert_eq!(
        c.psql(1, "postgres", "SELECT pg_is_in_recovery()").unwrap(),
        "f"
    );
    c.repoint_standby(2, 1).unwrap();
    c.psql(1, "postgres", "INSERT INTO f VALUES (2)").unwrap();
    c.wait_caught_up(2, DEADLINE).unwrap();
    assert_eq!(c.psql(2, "postgres", "SELECT sum(v) FROM f").unwrap(), "3");
    c.wait_streaming(2, DEADLINE).unwrap();

    // A stopped node restarts on its port.
    c.stop_node(2).unwrap();
    assert!(c.psql(2, "postgres", "SELECT 1").is_err());
    c.start_node(2).unwrap();
    c.wait_streaming(2, DEADLINE).unwrap();

    drop(c);
    assert!(!dir.exists(), "cluster directory left behind");
}
