//! `pgfresh demo`: a throwaway primary + 2 streaming standbys from the installed
//! PostgreSQL binaries, and pgfresh in front of them.

use std::process::ExitCode;

use pgfresh_config::ConfigHandle;
use pgfresh_localcluster::{ClusterOptions, LocalCluster};

/// The demo's login role (trust auth at the proxy; pgfresh logs in to the nodes with its password).
pub const DEMO_USER: &str = "app";
const DEMO_PASSWORD: &str = "app-demo-password";

pub fn demo(listen: &str, admin_listen: &str) -> ExitCode {
    println!("pgfresh demo: creating a primary and 2 streaming standbys (takes a few seconds)...");
    let cluster = match LocalCluster::start(ClusterOptions {
        users: vec![(DEMO_USER.to_string(), DEMO_PASSWORD.to_string())],
        databases: vec![DEMO_USER.to_string()],
        ..ClusterOptions::default()
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pgfresh demo: cannot start PostgreSQL: {e}");
            return ExitCode::from(1);
        }
    };
    // Let the demo user create tables in its database.
    if let Err(e) = cluster.psql(0, DEMO_USER, &format!("ALTER DATABASE {DEMO_USER} OWNER TO {DEMO_USER}; ALTER SCHEMA public OWNER TO {DEMO_USER};")) {
        eprintln!("pgfresh demo: cannot prepare the demo database: {e}");
        return ExitCode::from(1);
    }
    let (su, su_pw) = cluster.superuser();
    let mut text = format!(
        "[proxy]\nlisten = \"{listen}\"\nadmin_listen = \"{admin_listen}\"\n\n[monitor]\nuser = \"{su}\"\npassword = \"{su_pw}\"\n\n"
    );
    for (i, node) in cluster.nodes().iter().enumerate() {
        text.push_str(&format!(
            "[[nodes]]\nname = \"{}\"\nhost = \"{}\"\nport = {}\n\n",
            if i == 0 {
                "pg0".to_string()
            } else {
                format!("pg{i}")
            },
            cluster.host(),
            node.port
        ));
    }
    text.push_str(&format!(
        "[[users]]\nname = \"{DEMO_USER}\"\nauth = \"trust\"\nserver_password = \"{DEMO_PASSWORD}\"\n\n[[users]]\nname = \"admin\"\nauth = \"trust\"\nadmin = true\nserver_user = \"{su}\"\nserver_password = \"{su_pw}\"\n"
    ));
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("pgfresh demo: cannot create a temp dir: {e}");
            return ExitCode::from(1);
        }
    };
    let path = dir.path().join("pgfresh.toml");
    if let Err(e) = std::fs::write(&path, &text) {
        eprintln!("pgfresh demo: cannot write {}: {e}", path.display());
        return ExitCode::from(1);
    }
    let handle = match ConfigHandle::open(&path) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("pgfresh demo: generated config is invalid: {e}");
            return ExitCode::from(1);
        }
    };
    let (host, port) = listen.rsplit_once(':').unwrap_or((listen, "6432"));
    println!();
    for (i, node) in cluster.nodes().iter().enumerate() {
        println!(
            "  node pg{i}: {}:{} ({})",
            cluster.host(),
            node.port,
            if i == 0 { "primary" } else { "standby" }
        );
    }
    println!(
        "  config:   {} (edit it: live keys reload within a second)",
        path.display()
    );
    println!();
    println!("Connect:       psql -h {host} -p {port} -U {DEMO_USER}");
    println!(
        "Admin console: psql -h {host} -p {port} -U admin pgfresh   (try SHOW NODES; SHOW HOT;)"
    );
    println!("Status page:   http://{admin_listen}/   metrics: http://{admin_listen}/metrics");
    println!("Press Ctrl-C to stop; everything is removed.");
    let workers = handle.snapshot().proxy.worker_threads;
    let code = super::runtime(workers).block_on(super::run(handle));
    drop(cluster);
    code
}
