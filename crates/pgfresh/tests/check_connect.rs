//! `pgfresh check --connect`: the monitor's login tried against each node of a real
//! primary + 2 standbys, with the server's own reason when it fails.

use std::process::Command;

use pgfresh_localcluster::LocalCluster;

fn check_connect(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgfresh.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pgfresh"))
        .args(["check", "--connect", "-c", path.to_str().unwrap()])
        .output()
        .expect("run pgfresh");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn config(c: &LocalCluster, password: &str, extra_node_port: Option<u16>) -> String {
    let (su, _) = c.superuser();
    let mut text = format!(
        "[monitor]\nuser = \"{su}\"\npassword = \"{password}\"\nconnect_timeout_ms = 5000\n\n"
    );
    for (i, n) in c.nodes().iter().enumerate() {
        text.push_str(&format!(
            "[[nodes]]\nname = \"pg{i}\"\nhost = \"127.0.0.1\"\nport = {}\n\n",
            n.port
        ));
    }
    if let Some(port) = extra_node_port {
        text.push_str(&format!(
            "[[nodes]]\nname = \"gone\"\nhost = \"127.0.0.1\"\nport = {port}\n\n"
        ));
    }
    text
}

/// A loopback port nobody listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn check_connect_reports_each_node() {
    let c = LocalCluster::shared();
    let (su, good) = c.superuser();

    // All good: ok with role and version for every node, exit 0.
    let (ok, text) = check_connect(&config(c, good, None));
    assert!(ok, "{text}");
    assert!(text.contains("valid"), "{text}");
    let node_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("node ")).collect();
    assert_eq!(node_lines.len(), 3, "{text}");
    assert!(
        node_lines[0].starts_with("node pg0 ")
            && node_lines[0].contains(": ok, primary, PostgreSQL "),
        "{text}"
    );
    for l in &node_lines[1..] {
        assert!(l.contains(": ok, standby, PostgreSQL "), "{text}");
    }

    // A wrong password: the server's message and SQLSTATE per node, exit non-zero.
    let (ok, text) = check_connect(&config(c, "not-the-password", None));
    assert!(!ok, "{text}");
    for i in 0..3 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("node pg{i} ")))
            .unwrap_or_else(|| panic!("no line for pg{i}:\n{text}"));
        assert!(
            line.contains(&format!(
                "FAILED: connect failed: password authentication failed for user \"{su}\""
            )) && line.contains("(SQLSTATE 28P01)"),
            "{text}"
        );
    }
    assert!(text.contains("cannot log in to 3 of 3 nodes"), "{text}");

    // A node nobody listens on: the I/O error, and the others still ok.
    let (ok, text) = check_connect(&config(c, good, Some(closed_port())));
    assert!(!ok, "{text}");
    let gone = text
        .lines()
        .find(|l| l.starts_with("node gone "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        gone.contains("FAILED") && gone.contains("Connection refused"),
        "{text}"
    );
    assert_eq!(text.matches(": ok, ").count(), 3, "{text}");
    assert!(text.contains("cannot log in to 1 of 4 nodes"), "{text}");
}
