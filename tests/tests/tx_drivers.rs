//! Real client drivers through a transaction-mode pgfresh: psycopg 3, asyncpg,
//! node-postgres and pgjdbc, each with its own way of using protocol-level prepared
//! statements, six clients sharing two server connections per node (pgjdbc through a
//! session-mode pgfresh too).
//!
//! Each driver runs a script of `tests/drivers/` (installed by `scripts/prereqs.sh`:
//! python3-psycopg, python3-asyncpg, node-postgres, a JDK and the pgjdbc jar). A script
//! gets host, port, user, password, database and a table of its own; it prints
//! `OK <checks>` when every check passed. Besides the checks of its results, each script
//! looks at `pg_prepared_statements` on the server connection of one of its
//! transactions: its statements must be there under pgfresh's names (`__pgfresh_N`) and
//! not under the driver's own, so the driver did use named statements and pgfresh did
//! map them. Each driver runs once more over TLS, against a proxy that refuses plain
//! clients (`client_tls_sslmode = require`).
//!
//! Two tests keep bugs the drivers ran into fixed: psycopg's `DEALLOCATE name` of a
//! protocol-level statement, and asyncpg's row-limited Execute of a write (its relations
//! must be marked although no CommandComplete comes).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use pgfresh_tests::*;

/// Server connections per node: fewer than the scripts' six clients.
const POOL_SIZE: usize = 2;

/// How long one script may run before it counts as hung (it needs a few seconds).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

/// The transaction-mode proxy shared by this binary's tests.
fn tx_proxy() -> &'static ProxyHandle {
    static P: OnceLock<ProxyHandle> = OnceLock::new();
    P.get_or_init(|| start_proxy(&tx_config()))
}

fn tx_config() -> String {
    format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = {POOL_SIZE}\n",
        config_text("")
    )
}

/// The same with `client_tls_sslmode = require` (a certificate made here): a script that
/// did not use TLS would be refused.
fn tls_tx_proxy() -> &'static ProxyHandle {
    static P: OnceLock<(tempfile::TempDir, ProxyHandle)> = OnceLock::new();
    &P.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let pki = pgfresh_tests::pki::make_pki(dir.path(), "drivers");
        let p = start_proxy(&format!(
            "{}\n[tls]\nclient_tls_sslmode = \"require\"\nclient_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\n",
            tx_config(),
            pki.server_cert.display(),
            pki.server_key.display()
        ));
        (dir, p)
    })
    .1
}

/// The proxy for a run, and the scripts' environment for it.
fn proxy_for(tls: bool) -> (&'static ProxyHandle, Vec<(&'static str, String)>) {
    if tls {
        (tls_tx_proxy(), vec![("PGFRESH_TEST_TLS", "1".into())])
    } else {
        (tx_proxy(), Vec::new())
    }
}

fn drivers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("drivers")
}

/// Run `program args… HOST PORT USER PASSWORD DBNAME TABLE extra…` against the shared
/// proxy; returns the number of checks the script reported. Fails the test, showing the
/// script's output, when it exits non-zero, runs past [`SCRIPT_TIMEOUT`] or does not end
/// with `OK <checks>`.
async fn run_driver(
    p: &ProxyHandle,
    what: &str,
    program: &str,
    args: &[&str],
    env: &[(&str, String)],
    extra: &[&str],
) -> u64 {
    let table = unique(&format!("txd_{what}"));
    // Output goes to files: a script killed at the deadline still shows what it printed.
    let dir = tempfile::tempdir().expect("temp dir");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let started = Instant::now();
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .args([
            "127.0.0.1".to_string(),
            p.addr.port().to_string(),
            "app".into(),
            APP_PASSWORD.into(),
            "app".into(),
            table.clone(),
        ])
        .args(extra)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(drivers_dir())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{what}: cannot run {program} (scripts/prereqs.sh installs it): {e}")
        });
    let status = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait()).await;
    if status.is_err() {
        let _ = child.kill().await;
    }
    let elapsed = started.elapsed();
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let shown = format!("--- stdout\n{stdout}\n--- stderr\n{stderr}");
    let status = match status {
        Ok(s) => s.expect("wait for the script"),
        Err(_) => panic!("{what}: still running after {SCRIPT_TIMEOUT:?} (a hang?)\n{shown}"),
    };
    assert!(status.success(), "{what}: {status}\n{shown}");
    let checks = stdout
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("OK "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{what}: no final `OK <checks>` line\n{shown}"));
    eprintln!("{what}: {checks} checks in {elapsed:.1?}");
    checks
}

/// Run the psycopg script with this `prepare_threshold` ("0" or "default") and, when
/// given, psycopg's `prepared_max`.
async fn psycopg(threshold: &str, prepared_max: Option<&str>, tls: bool) -> u64 {
    let script = drivers_dir().join("psycopg_tx.py");
    let mut extra = vec![threshold];
    extra.extend(prepared_max);
    let (p, env) = proxy_for(tls);
    run_driver(
        p,
        &format!(
            "psycopg_{}",
            threshold.replace(|c: char| !c.is_alphanumeric(), "")
        ),
        "/usr/bin/python3",
        &[script.to_str().unwrap()],
        &env,
        &extra,
    )
    .await
}

/// psycopg prepares every statement the first time it runs it (`prepare_threshold=0`).
#[tokio::test]
async fn psycopg_prepares_everything() {
    let checks = psycopg("0", None, false).await;
    assert_eq!(checks, 6 * (30 * 3 + 4));
}

/// psycopg with its default threshold: statements are prepared from their sixth run on.
#[tokio::test]
async fn psycopg_default_threshold() {
    let checks = psycopg("default", None, false).await;
    assert_eq!(checks, 6 * (30 * 3 + 4));
}

/// psycopg keeps at most `prepared_max` statements prepared (100 by default) and sends
/// `DEALLOCATE <name>` (a simple query) for the least recently used one past that.
#[tokio::test]
async fn psycopg_deallocates_statements_past_prepared_max() {
    let checks = psycopg("0", Some("2"), false).await;
    assert_eq!(checks, 6 * (30 * 3 + 4));
}

/// asyncpg: statements prepared with Parse + Describe + Flush, executemany, statement
/// cache evictions (Close).
#[tokio::test]
async fn asyncpg_prepared_statements() {
    assert_eq!(asyncpg(false).await, 6 * (30 * 4 + 3) + 6);
}

async fn asyncpg(tls: bool) -> u64 {
    let script = drivers_dir().join("asyncpg_tx.py");
    let (p, env) = proxy_for(tls);
    run_driver(
        p,
        "asyncpg",
        "/usr/bin/python3",
        &[script.to_str().unwrap()],
        &env,
        &[],
    )
    .await
}

/// node-postgres: named queries, the same name with another text on each client.
#[tokio::test]
async fn node_postgres_named_queries() {
    assert_eq!(node_postgres(false).await, 6 * (30 * 4 + 3));
}

async fn node_postgres(tls: bool) -> u64 {
    let dir = drivers_dir();
    // npm's install (scripts/prereqs.sh) or Debian's node-pg.
    let node_path = format!("{}:/usr/share/nodejs", dir.join("node_modules").display());
    let script = dir.join("node_pg_tx.js");
    let (p, mut env) = proxy_for(tls);
    env.push(("NODE_PATH", node_path));
    run_driver(p, "node_pg", "node", &[script.to_str().unwrap()], &env, &[]).await
}

/// pgjdbc with prepareThreshold=1: named statements from the first run, batches,
/// transactions, read-only transactions, and failed ones rolled back.
#[tokio::test]
async fn jdbc_prepared_statements_batches_and_read_only_transactions() {
    assert_eq!(jdbc(false).await, 6 * (30 * 7 + 3));
}

/// The same through a session-mode pgfresh: a read-only transaction runs on a standby,
/// where pgjdbc's prepared ROLLBACK (parsed on the primary) is not; in the failed
/// transaction pgfresh puts it there and it runs, as PostgreSQL runs it (pgfresh refused
/// it, 25P02, and left the client in the failed transaction).
#[tokio::test]
async fn jdbc_in_session_mode() {
    static P: OnceLock<ProxyHandle> = OnceLock::new();
    let p = P.get_or_init(|| start_proxy(&config_text("")));
    assert_eq!(jdbc_on(p, &[], &["session"]).await, 6 * (30 * 7 + 1));
}

async fn jdbc(tls: bool) -> u64 {
    let (p, env) = proxy_for(tls);
    jdbc_on(p, &env, &[]).await
}

async fn jdbc_on(p: &ProxyHandle, env: &[(&str, String)], extra: &[&str]) -> u64 {
    let script = drivers_dir().join("JdbcTx.java");
    run_driver(
        p,
        "jdbc",
        "java",
        &[
            // A short program: the quick JIT only, and the smallest collector.
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-cp",
            "/usr/share/java/postgresql.jar",
            script.to_str().unwrap(),
        ],
        env,
        extra,
    )
    .await
}

/// Every driver again over TLS, against a proxy that refuses plain clients.
#[tokio::test]
async fn psycopg_over_tls() {
    assert_eq!(psycopg("default", None, true).await, 6 * (30 * 3 + 4));
}

#[tokio::test]
async fn asyncpg_over_tls() {
    assert_eq!(asyncpg(true).await, 6 * (30 * 4 + 3) + 6);
}

#[tokio::test]
async fn node_postgres_over_tls() {
    assert_eq!(node_postgres(true).await, 6 * (30 * 4 + 3));
}

#[tokio::test]
async fn jdbc_over_tls() {
    assert_eq!(jdbc(true).await, 6 * (30 * 7 + 3));
}

/// Extended-protocol frames for [`a_write_stopped_at_its_row_limit_is_marked`].
mod wire {
    use pgfresh_tests::raw::{cstr, msg};

    /// Parse (unnamed statement, no parameter types), Bind (unnamed portal, no
    /// parameters, text results), Execute with `max_rows` (0: all), Sync.
    pub fn run(sql: &str, max_rows: i32) -> Vec<u8> {
        let mut parse = cstr("");
        parse.extend(cstr(sql));
        parse.extend(0u16.to_be_bytes());
        let mut bind = cstr("");
        bind.extend(cstr(""));
        bind.extend(0u16.to_be_bytes());
        bind.extend(0u16.to_be_bytes());
        bind.extend(0u16.to_be_bytes());
        let mut execute = cstr("");
        execute.extend(max_rows.to_be_bytes());
        [
            msg(b'P', &parse),
            msg(b'B', &bind),
            msg(b'E', &execute),
            msg(b'S', &[]),
        ]
        .concat()
    }
}

/// asyncpg's `fetchval`/`fetchrow` run a statement with Execute's row limit 1: a write
/// with RETURNING then ends in PortalSuspended instead of CommandComplete, and the
/// implicit transaction commits at Sync. Its relations must be marked as written all the
/// same, or the next read may go to a replica that has not replayed it
/// (`await conn.fetchval("INSERT ... RETURNING id")` then a SELECT of that row).
#[tokio::test]
async fn a_write_stopped_at_its_row_limit_is_marked() {
    use tokio::io::AsyncWriteExt;
    let p = tx_proxy();
    let c = p.connect().await;
    let t = p.cold_table(&c, "txd_rowlimit").await;
    let hot = |t: &str| {
        p.shared
            .recency
            .lookup("app", &[pgfresh_recency::RelKey::unqualified(t)])
            .is_hot()
    };
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(&raw::startup("app_trust", "app"))
        .await
        .unwrap();
    raw::read_until(&mut s, b'Z').await;
    // Control: Execute without a row limit ends in CommandComplete, and marks.
    s.write_all(&wire::run(
        &format!("INSERT INTO {t} VALUES (2) RETURNING id"),
        0,
    ))
    .await
    .unwrap();
    let r = raw::read_until(&mut s, b'Z').await;
    assert_eq!(raw::tags(&r), b"12DCZ");
    assert!(hot(&t), "a write that completed is marked");
    p.wait_cold(&[&t]).await;
    // Row limit 1: the insert is done and committed just the same.
    s.write_all(&wire::run(
        &format!("INSERT INTO {t} VALUES (3) RETURNING id"),
        1,
    ))
    .await
    .unwrap();
    let r = raw::read_until(&mut s, b'Z').await;
    assert_eq!(raw::tags(&r), b"12DsZ");
    assert!(
        hot(&t),
        "{t} was written (Execute stopped at its row limit, then Sync committed) but is not marked"
    );
    // And what that guards: with the replicas 300 ms behind, another client reads each
    // row inserted this way at once (reads go to a replica unless the table is hot).
    p.wait_cold(&[&t]).await;
    let delay = ApplyDelay::set(300);
    let mut misses = 0;
    for id in 10..20 {
        s.write_all(&wire::run(
            &format!("INSERT INTO {t} VALUES ({id}) RETURNING id"),
            1,
        ))
        .await
        .unwrap();
        raw::read_until(&mut s, b'Z').await;
        let n: i64 = c
            .query_one(&format!("SELECT count(*) FROM {t} WHERE id = {id}"), &[])
            .await
            .unwrap()
            .get(0);
        misses += usize::from(n != 1);
    }
    drop(delay);
    assert_eq!(
        misses, 0,
        "reads right after a row-limited insert missed it"
    );
}
