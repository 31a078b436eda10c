//! TLS toward clients with certificates made in the test (rcgen): psql and tokio-postgres
//! over TLS, `require` refusing plain clients, host names checked by `verify-full`,
//! client certificates under `verify-ca`, certificates rotated while a TLS session stays
//! connected, a broken certificate file ignored, and bytes sent between SSLRequest and
//! the handshake refused.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use pgfresh_tests::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// A CA and what it signed, as PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn write_private(path: &Path, pem: &str) {
    std::fs::write(path, pem).unwrap();
    // libpq refuses a client key others can read.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A CA named `name`, a server certificate for `localhost` and a client certificate for
/// user `app`, written to `dir` with `name` in the file names.
fn make_pki(dir: &Path, name: &str) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("pgfresh test CA {name}"));
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();

    let mut server_params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server = server_params.signed_by(&server_key, &ca, &ca_key).unwrap();

    let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params
        .distinguished_name
        .push(DnType::CommonName, "app");
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client = client_params.signed_by(&client_key, &ca, &ca_key).unwrap();

    let pki = Pki {
        ca: dir.join(format!("{name}-ca.pem")),
        server_cert: dir.join(format!("{name}-server.pem")),
        server_key: dir.join(format!("{name}-server.key")),
        client_cert: dir.join(format!("{name}-client.pem")),
        client_key: dir.join(format!("{name}-client.key")),
    };
    std::fs::write(&pki.ca, ca.pem()).unwrap();
    std::fs::write(&pki.server_cert, server.pem()).unwrap();
    write_private(&pki.server_key, &server_key.serialize_pem());
    std::fs::write(&pki.client_cert, client.pem()).unwrap();
    write_private(&pki.client_key, &client_key.serialize_pem());
    pki
}

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
