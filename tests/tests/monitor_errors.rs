//! A monitor that cannot log in says why: the server's message and SQLSTATE in the node's
//! `last_error` (`/v1/status`, `SHOW NODES`), one warning per node in the log (not one per
//! poll), and a client error that names the reason instead of a bare "no primary".
//!
//! This binary installs a global tracing subscriber that writes into a buffer, so it holds
//! only tests that read the proxy's log.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pgfresh_tests::admin::{console_ok, wait_status};
use pgfresh_tests::*;

/// Everything the proxy logged at info level and above (the monitor: debug, so repeated
/// poll failures can be counted) since the process started.
fn log() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = Buf(buf.clone());
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,pgfresh_balancer::monitor=debug",
            ))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init()
            .expect("the only subscriber in this test binary");
        buf
    })
}

#[derive(Clone)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_text() -> String {
    String::from_utf8_lossy(&log().lock().unwrap()).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_monitor_password_is_reported_with_the_servers_reason() {
    log();
    let (su, good) = cluster().superuser();
    let text = config_text("").replace(
        &format!("password = \"{good}\"\nsr_check_period_ms"),
        "password = \"not-the-password\"\nsr_check_period_ms",
    );
    assert!(text.contains("not-the-password"), "{text}");
    let p = start_proxy_unready(&text);

    // /v1/status: every node's last_error carries the server's message and SQLSTATE.
    let s = wait_status(&p, None, "every node to report its error", |s| {
        s["nodes"].as_array().is_some_and(|nodes| {
            nodes.iter().all(|n| {
                n["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("28P01"))
            })
        })
    })
    .await;
    for n in s["nodes"].as_array().unwrap() {
        let e = n["last_error"].as_str().unwrap();
        assert!(
            e.contains(&format!("password authentication failed for user \"{su}\"")),
            "{e}"
        );
        assert!(!e.contains("db error"), "{e}");
    }

    // SHOW NODES shows the same text.
    let (rows, header) = console_ok(&p, "SHOW NODES");
    assert!(
        rows.iter().all(|r| r
            .iter()
            .any(|c| c.contains("password authentication failed"))),
        "{header}\n{rows:?}"
    );

    // Let the monitor fail many more polls (every 50 ms): still one warning per node.
    let nodes = cluster().nodes().len();
    eventually(
        "five more failed polls of every node",
        Duration::from_secs(60),
        || {
            let logged = log_text();
            (0..nodes).all(|i| {
                logged
                    .lines()
                    .filter(|l| {
                        l.contains("monitor poll failed") && l.contains(&format!("node=pg{i} "))
                    })
                    .count()
                    >= 5
            })
        },
    )
    .await;
    let logged = log_text();
    for i in 0..cluster().nodes().len() {
        let lines: Vec<&str> = logged
            .lines()
            .filter(|l| {
                l.contains("monitor cannot poll node") && l.contains(&format!("node=pg{i} "))
            })
            .collect();
        assert_eq!(lines.len(), 1, "one warning for pg{i}:\n{logged}");
        assert!(lines[0].contains("WARN"), "{}", lines[0]);
        assert!(
            lines[0].contains("password authentication failed") && lines[0].contains("28P01"),
            "{}",
            lines[0]
        );
    }

    // A client login is refused with the reason, not a bare "no primary".
    let Err(err) = p.connect_as("app", APP_PASSWORD, "app").await else {
        panic!("no primary: the login must fail");
    };
    let db = err.as_db_error().expect("an error from pgfresh");
    let msg = db.message();
    assert!(msg.contains("no primary is available"), "{msg}");
    assert!(msg.contains("the monitor cannot reach any node"), "{msg}");
    assert!(
        msg.contains("pg0: connect failed: password authentication failed")
            && msg.contains("28P01"),
        "{msg}"
    );
    assert_eq!(db.code().code(), "08001", "{msg}");
}
