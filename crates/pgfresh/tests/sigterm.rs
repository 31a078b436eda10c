//! SIGTERM to the real binary under load: new connections are refused at once; for 90 %
//! of `shutdown_timeout_ms` the sessions go on serving their clients (a client that
//! finishes and leaves sees no error); then each session closes at its next transaction
//! boundary (FATAL 57P01), no transaction in flight is cut, and the process exits within
//! `shutdown_timeout_ms` even when a transaction would run past it.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgfresh_localcluster::LocalCluster;
use pgfresh_tests::{eventually, poll};

const SHUTDOWN_TIMEOUT_MS: u64 = 6000;
const WORKERS: i32 = 8;

/// A loopback port free a moment ago.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn config(c: &LocalCluster, port: u16) -> String {
    let (su, su_pw) = c.superuser();
    let mut text = format!(
        "[proxy]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_timeout_ms = {SHUTDOWN_TIMEOUT_MS}\n\n\
         [monitor]\nuser = \"{su}\"\npassword = \"{su_pw}\"\nsr_check_period_ms = 50\n\n\
         [[users]]\nname = \"app\"\npassword = \"app-secret\"\n\n"
    );
    for (i, n) in c.nodes().iter().enumerate() {
        text.push_str(&format!(
            "[[nodes]]\nname = \"pg{i}\"\nhost = \"127.0.0.1\"\nport = {}\n\n",
            n.port
        ));
    }
    text
}

/// The binary, listening and logged into; a few tries in case another process took the
/// free port first.
async fn start(c: &LocalCluster, dir: &std::path::Path) -> (Child, String) {
    for _ in 0..5 {
        let port = free_port();
        let path = dir.join("pgfresh.toml");
        std::fs::write(&path, config(c, port)).unwrap();
        let log = std::fs::File::create(dir.join("pgfresh.log")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_pgfresh"))
            .args(["-c", path.to_str().unwrap()])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start pgfresh");
        let conninfo =
            format!("host=127.0.0.1 port={port} user=app password=app-secret dbname=app");
        // True once it takes logins; false if it exited (the port was taken).
        let started = poll("pgfresh to take logins", Duration::from_secs(60), || {
            let exited = child.try_wait().unwrap().is_some();
            let conninfo = conninfo.clone();
            async move {
                if exited {
                    return Some(false);
                }
                tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
                    .await
                    .ok()
                    .map(|_| true)
            }
        })
        .await;
        if started {
            return (child, conninfo);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!(
        "pgfresh did not start: {}",
        std::fs::read_to_string(dir.join("pgfresh.log")).unwrap_or_default()
    );
}

async fn connect(
    conninfo: &str,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Option<String>>,
) {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
        .await
        .expect("login");
    // The connection's end: the SQLSTATE it ended with, if any.
    let ended = tokio::spawn(async move {
        conn.await
            .err()
            .and_then(|e| e.code().map(|c| c.code().to_string()))
    });
    (client, ended)
}

/// What the workers saw.
#[derive(Default)]
struct Outcome {
    /// Transactions committed, per worker.
    committed: Vec<i64>,
    /// Statements that failed inside a transaction the worker had begun.
    failed_inside: Vec<String>,
}

/// Runs transactions of several statements until the session is closed; a failure
/// at BEGIN (the session closed at a boundary) ends it quietly.
async fn worker(conninfo: String, table: String, id: i32, outcome: Arc<Mutex<Outcome>>) {
    let (c, _ended) = connect(&conninfo).await;
    let mut committed = 0;
    loop {
        if c.batch_execute("BEGIN").await.is_err() {
            break;
        }
        let inside = async {
            c.batch_execute(&format!("UPDATE {table} SET n = n + 1 WHERE id = {id}"))
                .await?;
            c.batch_execute("SELECT pg_sleep(0.01)").await?;
            c.batch_execute("COMMIT").await
        };
        match inside.await {
            Ok(()) => committed += 1,
            Err(e) => {
                outcome.lock().unwrap().failed_inside.push(e.to_string());
                break;
            }
        }
    }
    outcome.lock().unwrap().committed.push(committed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_finishes_transactions_and_exits_in_time() {
    let c = LocalCluster::shared();
    let dir = tempfile::tempdir().unwrap();
    c.psql(0, "app", "ALTER SCHEMA public OWNER TO app")
        .unwrap();
    let (mut child, conninfo) = start(c, dir.path()).await;
    let table = "sigterm_accounts".to_string();
    let (setup, _) = connect(&conninfo).await;
    setup
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, n int NOT NULL); \
             INSERT INTO {table} SELECT g, 0 FROM generate_series(0, {WORKERS} - 1) g"
        ))
        .await
        .unwrap();
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| tokio::spawn(worker(conninfo.clone(), table.clone(), id, outcome.clone())))
        .collect();
    // Idle clients: some stay, some do one more thing after the signal and leave; and one
    // whose transaction would outlast the shutdown timeout.
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(connect(&conninfo).await);
    }
    let mut leaving = Vec::new();
    for _ in 0..3 {
        leaving.push(connect(&conninfo).await);
    }
    let (long, long_ended) = connect(&conninfo).await;
    long.batch_execute("BEGIN").await.unwrap();
    let long_running = tokio::spawn(async move { long.batch_execute("SELECT pg_sleep(60)").await });
    let commits = {
        let setup = &setup;
        let table = &table;
        move || async move {
            setup
                .query_one(
                    &format!("/* pgfresh:primary */ SELECT sum(n) FROM {table}"),
                    &[],
                )
                .await
                .map(|r| r.get::<_, i64>(0))
                .unwrap_or(0)
        }
    };
    // Load first: every worker has committed some transactions.
    poll(
        "every worker committing",
        Duration::from_secs(60),
        || async { (commits().await >= (WORKERS as i64) * 5).then_some(()) },
    )
    .await;
    drop(setup);

    let terminated = Instant::now();
    let pid = child.id().to_string();
    assert!(Command::new("sh")
        .args(["-c", &format!("kill -TERM {pid}")])
        .status()
        .unwrap()
        .success());
    // New connections are refused at once...
    let addr = conninfo_addr(&conninfo);
    eventually("the listener to close", Duration::from_secs(60), || {
        std::net::TcpStream::connect(&addr).is_err()
    })
    .await;
    // Clients that use their sessions while the proxy drains, then leave: no error.
    for (client, ended) in leaving {
        client
            .batch_execute(&format!("UPDATE {table} SET n = n WHERE id = 0"))
            .await
            .expect("a statement while the proxy drains");
        drop(client);
        assert_eq!(ended.await.unwrap(), None, "a clean goodbye");
    }
    // ...and the process exits once the long transaction has had its time.
    let status = poll("pgfresh to exit", Duration::from_secs(60), || {
        std::future::ready(child.try_wait().unwrap())
    })
    .await;
    let took = terminated.elapsed();
    assert!(status.success(), "exit status {status}");

    for w in workers {
        w.await.unwrap();
    }
    let o = std::mem::take(&mut *outcome.lock().unwrap());
    assert!(
        o.failed_inside.is_empty(),
        "statements failed inside transactions: {:?}",
        o.failed_inside
    );
    // Every worker's session was closed at a boundary, with 57P01.
    for (client, ended) in idle {
        let code = ended.await.unwrap();
        assert_eq!(
            code.as_deref(),
            Some("57P01"),
            "an idle client's session ends with 57P01"
        );
        assert!(client.is_closed());
    }
    // The long transaction was cut off at the timeout, not waited for.
    let long_result = long_running.await.unwrap();
    assert!(long_result.is_err(), "the long transaction cannot finish");
    let _ = long_ended.await;
    // Every acknowledged COMMIT is in the table, and nothing else.
    let committed: i64 = o.committed.iter().sum();
    let total: i64 = c
        .psql(0, "app", &format!("SELECT sum(n) FROM {table}"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total, committed);
    eprintln!(
        "SIGTERM under load: {committed} transactions committed, none failed inside; \
         exit {took:?} after SIGTERM (shutdown_timeout_ms = {SHUTDOWN_TIMEOUT_MS})"
    );
    c.psql(0, "app", &format!("DROP TABLE {table}")).unwrap();
}

/// `host:port` of a conninfo made by [`start`].
fn conninfo_addr(conninfo: &str) -> String {
    let field = |k: &str| {
        conninfo
            .split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .unwrap()
            .to_string()
    };
    format!("{}:{}", field("host="), field("port="))
}
