//! TLS toward clients with certificates made in the test (rcgen): psql and tokio-postgres
//! over TLS, `require` refusing plain clients, host names checked by `verify-full`,
//! client certificates under `verify-ca`, certificates rotated while a TLS session stays
//! connected, a broken certificate file ignored, and bytes sent between SSLRequest and
//! the handshake refused; pgbench over TLS. Toward the nodes: nodes with `ssl = on` that
//! refuse plain logins, reached with `server_tls_sslmode = verify-full` by every kind of
//! connection pgfresh makes (checked on the servers through `pg_stat_ssl`).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use pgfresh_tests::admin::{console_ok, write_config};
use pgfresh_tests::pki::{make_pki, Pki};
use pgfresh_tests::*;

/// The test config with a `[tls]` section: `mode`, the certificate pgfresh serves from
/// `cert`/`key`, and `ca` for client certificates.
fn tls_config(mode: &str, cert: &Path, key: &Path, ca: Option<&Path>) -> String {
    let mut text = format!(
        "{}\n[tls]\nclient_tls_sslmode = \"{mode}\"\nclient_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\n",
        config_text(""),
        cert.display(),
        key.display()
    );
    if let Some(ca) = ca {
        text.push_str(&format!("client_tls_ca_file = \"{}\"\n", ca.display()));
    }
    text
}

/// psql with `conninfo` (password of user app given); returns (success, stdout + stderr).
fn psql(p: &ProxyHandle, conninfo: &str, sql: &str) -> (bool, String) {
    let out = Command::new(pg_bin("psql"))
        .env_clear()
        .env("PGPASSWORD", APP_PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .args([
            "-X",
            "-A",
            "-t",
            "-d",
            &format!("{conninfo} port={} user=app dbname=app", p.addr.port()),
            "-c",
            sql,
        ])
        .output()
        .expect("run psql");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// A proxy serving a fresh certificate of CA "a" in `mode` (client certificates from the
/// same CA in the verify modes); the directory holds the files while it lives.
fn tls_proxy(mode: &str) -> (tempfile::TempDir, Pki, ProxyHandle) {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path(), "a");
    let ca = mode.starts_with("verify").then_some(pki.ca.as_path());
    let p = start_proxy(&tls_config(mode, &pki.server_cert, &pki.server_key, ca));
    (dir, pki, p)
}

#[test]
fn require_accepts_tls_and_refuses_plain_clients() {
    let (_dir, _pki, p) = tls_proxy("require");
    let (ok, out) = psql(&p, "host=localhost sslmode=require", "\\conninfo");
    assert!(ok, "{out}");
    assert!(out.contains("SSL connection (protocol: TLSv1."), "{out}");
    let (ok, out) = psql(&p, "host=localhost sslmode=require", "SELECT 40 + 2");
    assert!(ok && out.trim() == "42", "{out}");
    // A plain client is told why, with SQLSTATE 28000.
    let (ok, out) = psql(&p, "host=localhost sslmode=disable", "SELECT 1");
    assert!(!ok, "{out}");
    assert!(out.contains("SSL required"), "{out}");
}

#[test]
fn verify_full_checks_the_host_name() {
    let (_dir, pki, p) = tls_proxy("prefer");
    let root = format!("sslrootcert={}", pki.ca.display());
    let (ok, out) = psql(
        &p,
        &format!("host=localhost sslmode=verify-full {root}"),
        "SELECT 1",
    );
    assert!(ok, "{out}");
    // The certificate names localhost, not 127.0.0.1.
    let (ok, out) = psql(
        &p,
        &format!("host=127.0.0.1 sslmode=verify-full {root}"),
        "SELECT 1",
    );
    assert!(!ok, "{out}");
    assert!(out.contains("does not match host name"), "{out}");
    // verify-ca checks the chain only.
    let (ok, out) = psql(
        &p,
        &format!("host=127.0.0.1 sslmode=verify-ca {root}"),
        "SELECT 1",
    );
    assert!(ok, "{out}");
    // prefer still takes plain clients.
    let (ok, out) = psql(&p, "host=localhost sslmode=disable", "SELECT 1");
    assert!(ok, "{out}");
}

#[test]
fn verify_ca_requires_a_client_certificate_from_the_ca() {
    let (dir, pki, p) = tls_proxy("verify-ca");
    let other = make_pki(dir.path(), "b");
    let (ok, out) = psql(&p, "host=localhost sslmode=require", "SELECT 1");
    assert!(!ok, "no client certificate: {out}");
    let with = |c: &Pki| {
        format!(
            "host=localhost sslmode=require sslcert={} sslkey={}",
            c.client_cert.display(),
            c.client_key.display()
        )
    };
    let (ok, out) = psql(&p, &with(&pki), "SELECT 1");
    assert!(ok, "{out}");
    let (ok, out) = psql(&p, &with(&other), "SELECT 1");
    assert!(!ok, "a certificate from another CA: {out}");
}

/// A rustls client configuration trusting `ca`.
fn client_config(ca: &Path) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca).unwrap();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// A tokio-postgres client over TLS, trusting `ca`.
async fn tls_client(p: &ProxyHandle, ca: &Path) -> tokio_postgres::Client {
    let config = client_config(ca);
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(config);
    let (client, conn) = tokio_postgres::connect(
        &format!(
            "host=localhost port={} user=app password={APP_PASSWORD} dbname=app sslmode=require",
            p.addr.port()
        ),
        tls,
    )
    .await
    .expect("TLS connection through pgfresh");
    tokio::spawn(conn);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_while_sessions_stay_connected() {
    let dir = tempfile::tempdir().unwrap();
    let first = make_pki(dir.path(), "first");
    let second = make_pki(dir.path(), "second");
    // pgfresh serves whatever is at these two paths.
    let cert = dir.path().join("served.pem");
    let key = dir.path().join("served.key");
    std::fs::copy(&first.server_cert, &cert).unwrap();
    std::fs::copy(&first.server_key, &key).unwrap();
    let p = start_proxy(&tls_config("require", &cert, &key, None));
    let session = tls_client(&p, &first.ca).await;
    session.simple_query("SELECT 1").await.unwrap();

    // Replace the files: new connections get the second certificate.
    std::fs::copy(&second.server_key, &key).unwrap();
    std::fs::copy(&second.server_cert, &cert).unwrap();
    let root = |pki: &Pki| {
        format!(
            "host=localhost sslmode=verify-full sslrootcert={}",
            pki.ca.display()
        )
    };
    eventually(
        "the new certificate is served",
        Duration::from_secs(30),
        || psql(&p, &root(&second), "SELECT 1").0,
    )
    .await;
    let (ok, out) = psql(&p, &root(&first), "SELECT 1");
    assert!(!ok, "the old certificate is still served: {out}");
    // The session made before the rotation goes on.
    session.simple_query("SELECT 2").await.unwrap();

    // A broken certificate file is refused; the second certificate stays in force.
    replace_with_garbage(
        &cert,
        "not a certificate",
        "pgfresh_tls_reloads_total{result=\"error\"}",
    )
    .await;
    let (ok, out) = psql(&p, &root(&second), "SELECT 1");
    assert!(ok, "{out}");
    session.simple_query("SELECT 3").await.unwrap();
}

#[tokio::test]
async fn bytes_sent_between_ssl_request_and_handshake_are_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_dir, _pki, p) = tls_proxy("prefer");
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    // SSLRequest, then a plain StartupMessage in the same write, before any answer.
    let mut bytes = vec![0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    bytes.extend(raw::startup("app_trust", "app"));
    s.write_all(&bytes).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut answer))
        .await
        .expect("pgfresh closed the connection")
        .unwrap();
    assert_ne!(answer.first(), Some(&b'S'), "the handshake must not start");
    assert_eq!(
        answer.first(),
        Some(&b'E'),
        "an error, then the connection closes"
    );
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.contains("unencrypted data after SSL request"),
        "{text}"
    );
}

#[tokio::test]
async fn the_admin_api_can_use_the_same_certificate() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path(), "a");
    let text = tls_config("prefer", &pki.server_cert, &pki.server_key, None).replacen(
        "[proxy]\n",
        "[proxy]\nadmin_tls = true\n",
        1,
    );
    let p = start_proxy(&text);
    let config = client_config(&pki.ca);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .expect("TLS to the admin API");
    tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("pgfresh_"), "{answer}");
    // Plain HTTP gets no answer.
    let mut plain = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), plain.read_to_end(&mut answer)).await;
    assert!(
        !String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "plain HTTP was served"
    );
}

/// The test config for `c` with nodes named by `host`, and `[tls] server_tls_sslmode =
/// mode` with the CA of `pki`.
fn server_tls_config(
    c: &pgfresh_localcluster::LocalCluster,
    host: &str,
    mode: &str,
    pki: &Pki,
) -> String {
    format!(
        "{}\n[tls]\nserver_tls_sslmode = \"{mode}\"\nserver_tls_ca_file = \"{}\"\n",
        config_text_for(c, "").replace("host = \"127.0.0.1\"", &format!("host = \"{host}\"")),
        pki.ca.display()
    )
}

/// Whether each of the server connections on node `i` that match `filter` (on
/// `pg_stat_activity a`) is encrypted, as the server sees it (`pg_stat_ssl`).
fn encrypted_on_server(
    c: &pgfresh_localcluster::LocalCluster,
    i: usize,
    filter: &str,
) -> Vec<String> {
    let out = c
        .psql(
            i,
            "postgres",
            &format!(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE {filter} ORDER BY pid"
            ),
        )
        .unwrap();
    out.lines().map(str::to_string).collect()
}

/// Nodes with `ssl = on` that refuse plain TCP logins (`hostnossl … reject`): pgfresh
/// with `server_tls_sslmode = verify-full` reaches them all over TLS — the monitor, the
/// client pools on the primary and a replica, the catalog reader and cancel requests —
/// and the servers' own `pg_stat_ssl` says so; large messages cross the encrypted relay
/// both ways. A wrong host name fails verify-full and passes verify-ca. The control: a
/// reload to `disable` reaches the monitor, which the servers then refuse (without TLS
/// none of this works), while a session made before keeps its encrypted connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_reached_over_tls_with_verify_full() {
    let c = private_cluster();
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path(), "nodes");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    // A STABLE function made before pgfresh starts: once the catalog reader has read
    // pg_proc (over TLS), calls of it may go to a replica.
    c.psql(
        0,
        "app",
        "CREATE FUNCTION tls_where() RETURNS bool STABLE LANGUAGE sql AS 'SELECT pg_is_in_recovery()'; \
         ALTER FUNCTION tls_where() OWNER TO app",
    )
    .unwrap();
    c.enable_ssl(&read(&pki.server_cert), &read(&pki.server_key), true)
        .unwrap();

    // start_proxy returns once the monitor sees the primary and both standbys.
    let p = start_proxy(&server_tls_config(&c, "localhost", "verify-full", &pki));
    for i in 0..3 {
        let monitors = encrypted_on_server(&c, i, "a.application_name = 'pgfresh-monitor'");
        assert!(
            !monitors.is_empty() && monitors.iter().all(|s| s == "t"),
            "node {i}: {monitors:?}"
        );
    }
    let (nodes, _) = console_ok(&p, "SHOW NODES");
    assert_eq!(nodes.len(), 3);
    for n in &nodes {
        assert_eq!(n.last().map(String::as_str), Some("true"), "{n:?}");
    }

    let client = p.connect().await;
    let t = unique("tls_nodes");
    client
        .batch_execute(&format!(
            "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1)"
        ))
        .await
        .unwrap();
    // pg_stat_ssl is a catalog view, read on the primary; a replica is asked from outside.
    let row = client
        .query_one(
            "SELECT s.ssl FROM pg_stat_ssl s WHERE s.pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(
        row.get::<_, bool>(0),
        "the primary's pool connection is encrypted"
    );
    client
        .simple_query("/* pgfresh:replica */ SELECT 1")
        .await
        .unwrap();
    let mut app_on_standbys = encrypted_on_server(&c, 1, "a.usename = 'app'");
    app_on_standbys.extend(encrypted_on_server(&c, 2, "a.usename = 'app'"));
    assert!(
        !app_on_standbys.is_empty() && app_on_standbys.iter().all(|s| s == "t"),
        "{app_on_standbys:?}"
    );
    assert!(metric_value("pgfresh_tls_handshakes_total{side=\"server\",result=\"ok\"}") >= 2.0);
    assert!(metric_value("pgfresh_tls_connections{side=\"server\"}") >= 2.0);
    let (servers, _) = console_ok(&p, "SHOW SERVERS");
    assert!(servers.len() >= 2, "{servers:?}");
    for s in &servers {
        assert_eq!(s.last().map(String::as_str), Some("true"), "{s:?}");
    }

    // The catalog reader: the STABLE function goes to a replica once pg_proc was read.
    poll(
        "the catalog reader to read pg_proc",
        Duration::from_secs(60),
        || async {
            let row = client.query_one("SELECT tls_where()", &[]).await.unwrap();
            row.get::<_, bool>(0).then_some(())
        },
    )
    .await;

    // A cancel reaches the node (over TLS as well).
    let slow = p.connect().await;
    let cancel = slow.cancel_token();
    let sleep = "/* pgfresh:primary */ SELECT pg_sleep(60)";
    let sleeper = tokio::spawn(async move { slow.simple_query(sleep).await.map(drop) });
    poll(
        "the sleep to run on the primary",
        Duration::from_secs(30),
        || async {
            let running = c
                .psql(
                    0,
                    "postgres",
                    &format!("SELECT count(*) FROM pg_stat_activity WHERE query = '{sleep}'"),
                )
                .unwrap();
            (running == "1").then_some(())
        },
    )
    .await;
    cancel.cancel_query(tokio_postgres::NoTls).await.unwrap();
    let err = sleeper.await.unwrap().expect_err("the sleep was cancelled");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{err}"
    );

    // Large messages both ways through the encrypted relay: a 16 MiB parameter echoed
    // back byte for byte while it is still being sent, and a 64 MB result.
    let big: String = (0..16 * 1024 * 1024u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let row = client.query_one("SELECT $1::text", &[&big]).await.unwrap();
    assert!(row.get::<_, &str>(0) == big, "the echo is exact");
    let row = client
        .query_one(
            "SELECT length(repeat('x', 64000000))::int, repeat('y', 64000000)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 64_000_000);
    assert_eq!(row.get::<_, &str>(1).len(), 64_000_000);

    // A host name the certificate does not carry fails verify-full, on the monitor's
    // connections as on every other.
    let wrong = start_proxy_unready(&server_tls_config(&c, "127.0.0.1", "verify-full", &pki));
    poll(
        "the monitor to report the name mismatch",
        Duration::from_secs(60),
        || async {
            let view = wrong.shared.balancer.view();
            let e = view.nodes[0].last_error.clone()?;
            e.contains("not valid for name").then_some(e)
        },
    )
    .await;
    drop(wrong);
    // verify-ca checks the chain only.
    let by_ca = start_proxy(&server_tls_config(&c, "127.0.0.1", "verify-ca", &pki));
    by_ca
        .connect()
        .await
        .simple_query("SELECT 1")
        .await
        .unwrap();
    drop(by_ca);
    // Without TLS the servers refuse pgfresh: a reload to `disable` reaches the monitor
    // (it reconnects with the new settings, and is refused), while the session made
    // before keeps its encrypted connections.
    write_config(
        &p.config_path,
        &server_tls_config(&c, "localhost", "disable", &pki),
    );
    poll(
        "the servers to refuse the monitor without TLS",
        Duration::from_secs(60),
        || async {
            let view = p.shared.balancer.view();
            let e = view.nodes[0].last_error.clone()?;
            e.contains("no encryption").then_some(e)
        },
    )
    .await;
    client
        .simple_query("/* pgfresh:primary */ SELECT 1")
        .await
        .unwrap();
}

/// pgbench over TLS (a proxy that refuses plain clients), simple, extended and prepared.
#[test]
fn pgbench_over_tls() {
    let (dir, _pki, p) = tls_proxy("require");
    let script = dir.path().join("bench.sql");
    std::fs::write(&script, "\\set x random(1, 1000)\nSELECT :x + 1;\n").unwrap();
    for mode in ["simple", "extended", "prepared"] {
        let out = Command::new(pg_bin("pgbench"))
            .args(["-n", "-M", mode, "-c", "4", "-j", "4", "-t", "50", "-f"])
            .arg(&script)
            .envs(p.libpq_env())
            .env("PGSSLMODE", "require")
            .output()
            .expect("run pgbench");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "pgbench -M {mode}:\n{text}");
        assert!(
            text.contains("number of transactions actually processed: 200/200"),
            "pgbench -M {mode}:\n{text}"
        );
    }
}
