//! A monitor that cannot log in says why: the server's message and SQLSTATE in the node's
//! `last_error` (`/v1/status`, `SHOW NODES`), one warning per node in the log (not one per
//! poll), and a client error that names the reason instead of a bare "no primary".
//!
//! Also: no secret reaches the log, a client's error or the config views.
//!
//! This binary installs a global tracing subscriber that writes into a buffer, so it holds
//! only tests that read the proxy's log.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pgfresh_tests::admin::{console_ok, wait_status};
use pgfresh_tests::*;

/// Everything the proxy logged since the process started: pgfresh's own crates at debug
/// (repeated monitor poll failures are counted; secrets are looked for), the rest at info.
fn log() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = Buf(buf.clone());
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,pgfresh_proxy=debug,pgfresh_balancer=debug,pgfresh_config=debug,pgfresh_nodetls=debug",
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

/// No secret reaches the log (pgfresh's crates at debug), a client's error, `/v1/config` or
/// `SHOW CONFIG`: client passwords (right and wrong), server passwords (including one the
/// node refuses), the monitor's password, the admin token, an auth_file password and the
/// verifier an auth_query lookup returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_log_a_client_or_the_config_views() {
    use pgfresh_tests::admin::get_json;
    log();
    let c = cluster();
    // tp_logs_srv is only ever a server user with a wrong password: no pooled connection
    // of it exists that a login could reuse.
    login_roles(&[
        ("tp_logs_file", "file-secret-4711"),
        ("tp_logs_query", "query-secret-4712"),
        ("tp_logs_srv", "srv-secret-4717"),
    ])
    .await;
    let verifier = c
        .psql(
            0,
            "postgres",
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'tp_logs_query'",
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let userlist = dir.path().join("userlist.txt");
    std::fs::write(&userlist, "\"tp_logs_file\" \"file-secret-4711\"\n").unwrap();
    let token = "admin-token-secret-4713";
    let p = start_proxy(&format!(
        "{}\n[[users]]\nname = \"bad_server\"\npassword = \"client-secret-4714\"\nserver_user = \"tp_logs_srv\"\nserver_password = \"wrong-server-secret-4715\"\n\n[auth]\nauth_file = \"{}\"\nauth_user = \"admin\"\n",
        config_text("").replace(
            "client_login_timeout_ms = 10000\n",
            &format!("client_login_timeout_ms = 10000\nadmin_token = \"{token}\"\n"),
        ),
        userlist.display()
    ));
    // Logins that work, and the errors clients get.
    let mut client_errors = Vec::new();
    for (user, password) in [
        ("app", APP_PASSWORD),
        ("tp_logs_file", "file-secret-4711"),
        ("tp_logs_query", "query-secret-4712"),
    ] {
        let s = p.connect_as(user, password, "app").await.unwrap();
        s.simple_query("/* pgfresh:primary */ SELECT 1")
            .await
            .unwrap();
        s.simple_query("/* pgfresh:replica */ SELECT 1")
            .await
            .unwrap();
    }
    for (user, password) in [
        ("app", "typo-secret-4716"),
        ("tp_logs_file", "typo-secret-4716"),
        ("tp_logs_query", "typo-secret-4716"),
        ("nobody", "typo-secret-4716"),
    ] {
        let err = p.connect_as(user, password, "app").await.unwrap_err();
        client_errors.push(
            err.as_db_error()
                .map_or(err.to_string(), |e| e.message().to_string()),
        );
    }
    // pgfresh takes this user's password, the node refuses the server password.
    let refused = match p
        .connect_as("bad_server", "client-secret-4714", "app")
        .await
    {
        Ok(s) => s.simple_query("SELECT 1").await.unwrap_err(),
        Err(e) => e,
    };
    let refused = refused
        .as_db_error()
        .map_or(refused.to_string(), |e| e.message().to_string());
    assert!(
        refused.contains("password authentication failed"),
        "{refused}"
    );
    client_errors.push(refused);

    let config = get_json(&p, "/v1/config", Some(token)).await.to_string();
    let (rows, _) = console_ok(&p, "SHOW CONFIG");
    let show_config = format!("{rows:?}");

    let (_, su_password) = c.superuser();
    let mut secrets = vec![
        APP_PASSWORD.to_string(),
        "admin-pass".into(),
        su_password.to_string(),
        token.into(),
        "client-secret-4714".into(),
        "wrong-server-secret-4715".into(),
        "file-secret-4711".into(),
        "query-secret-4712".into(),
        "typo-secret-4716".into(),
    ];
    // The verifier's keys (SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey).
    secrets.extend(
        verifier
            .rsplit('$')
            .next()
            .unwrap()
            .split(':')
            .map(str::to_string),
    );
    let logged = log_text();
    assert!(
        logged.contains("tp_logs_query"),
        "the log covers this test's proxy"
    );
    for s in &secrets {
        assert!(!logged.contains(s.as_str()), "{s} is in the log");
        assert!(
            !config.contains(s.as_str()),
            "{s} is in /v1/config: {config}"
        );
        assert!(!show_config.contains(s.as_str()), "{s} is in SHOW CONFIG");
        for e in &client_errors {
            assert!(!e.contains(s.as_str()), "{s} is in a client error: {e}");
        }
    }
}
