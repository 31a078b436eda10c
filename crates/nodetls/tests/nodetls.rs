//! The TLS negotiation and stream against a small TLS echo server made in the test:
//! each mode's certificate checks, `N` answers, bytes injected after `S`, a megabyte
//! each way through the non-blocking stream, certificate files changing on disk, and a
//! client certificate presented to a node that asks for one.

use std::sync::Arc;

use bytes::BytesMut;
use pgfresh_nodetls::{connect, Mode, ServerStream, Settings};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, format!("test CA {name}"));
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    Ca { cert, key }
}

/// A server certificate for `names`, signed by `ca`: (cert PEM, key PEM).
fn server_cert(ca: &Ca, names: &[&str]) -> (String, String) {
    let p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.cert, &ca.key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// How the fake node answers SSLRequest.
#[derive(Clone, Copy)]
enum Answer {
    /// `S`, then TLS, then echo.
    Tls,
    /// `N`, then echo in plain.
    Plain,
    /// `S` followed at once by bytes that are not TLS.
    Injected,
}

/// A one-connection fake node on a free port.
async fn node(answer: Answer, cert: (String, String)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let chain = vec![CertificateDer::from_pem_slice(cert.0.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(cert.1.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut req = [0u8; 8];
        sock.read_exact(&mut req).await.unwrap();
        assert_eq!(req, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f], "an SSLRequest");
        match answer {
            Answer::Plain => {
                sock.write_all(b"N").await.unwrap();
                let (mut r, mut w) = sock.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
            Answer::Injected => {
                sock.write_all(b"Shello, this is not TLS").await.unwrap();
                let mut rest = Vec::new();
                let _ = sock.read_to_end(&mut rest).await;
            }
            Answer::Tls => {
                sock.write_all(b"S").await.unwrap();
                let Ok(tls) = acceptor.accept(sock).await else {
                    return;
                };
                let (mut r, mut w) = tokio::io::split(tls);
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            }
        }
    });
    port
}

fn write(dir: &tempfile::TempDir, name: &str, pem: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, pem).unwrap();
    p.to_string_lossy().into_owned()
}

/// A directory of its own for a test's files, removed when the test is done with it.
fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("pgfresh-nodetls-{tag}-"))
        .tempdir()
        .unwrap()
}

async fn try_connect(port: u16, host: &str, settings: &Settings) -> Result<ServerStream, String> {
    let tcp = pgfresh_nodetls::Tcp::connect("127.0.0.1", port)
        .await
        .unwrap();
    connect(tcp, settings, host).await
}

fn settings(mode: Mode, ca_file: &str) -> Settings {
    Settings {
        mode,
        ca_file: ca_file.to_string(),
        ..Settings::default()
    }
}

#[tokio::test]
async fn each_mode_checks_what_it_promises() {
    let dir = tempdir("modes");
    let ours = ca("ours");
    let other = ca("other");
    let ca_file = write(&dir, "ca.pem", &ours.cert.pem());
    let other_file = write(&dir, "other.pem", &other.cert.pem());
    let good = server_cert(&ours, &["db.internal"]);

    // verify-full: chain and name.
    let port = node(Answer::Tls, good.clone()).await;
    let s = try_connect(port, "db.internal", &settings(Mode::VerifyFull, &ca_file))
        .await
        .expect("the right CA and name");
    assert!(s.is_tls());
    let port = node(Answer::Tls, good.clone()).await;
    let err = try_connect(port, "127.0.0.1", &settings(Mode::VerifyFull, &ca_file))
        .await
        .err()
        .expect("a name the certificate does not carry is refused");
    assert!(err.contains("TLS handshake with 127.0.0.1"), "{err}");
    assert!(err.contains("not valid for name"), "{err}");

    // verify-ca: chain only.
    let port = node(Answer::Tls, good.clone()).await;
    try_connect(port, "127.0.0.1", &settings(Mode::VerifyCa, &ca_file))
        .await
        .expect("verify-ca does not compare the name");
    let port = node(Answer::Tls, good.clone()).await;
    let err = try_connect(port, "db.internal", &settings(Mode::VerifyCa, &other_file))
        .await
        .err()
        .expect("another CA is refused");
    assert!(err.contains("UnknownIssuer"), "{err}");

    // require: encrypted, not authenticated.
    let port = node(Answer::Tls, good.clone()).await;
    let s = try_connect(port, "127.0.0.1", &settings(Mode::Require, ""))
        .await
        .expect("require takes any certificate");
    assert!(s.is_tls());
    assert!(s.tls_description().unwrap().contains("TLS"));

    // disable: no SSLRequest at all; the first bytes the node sees are ours.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut s = try_connect(port, "127.0.0.1", &settings(Mode::Disable, ""))
        .await
        .unwrap();
    assert!(!s.is_tls());
    s.write_all(b"startup").await.unwrap();
    let (mut accepted, _) = listener.accept().await.unwrap();
    let mut first = [0u8; 7];
    accepted.read_exact(&mut first).await.unwrap();
    assert_eq!(
        &first, b"startup",
        "disable sends nothing before the startup packet"
    );
}

#[tokio::test]
async fn a_node_without_tls_is_plain_under_prefer_and_refused_under_require() {
    let c = ca("n");
    let cert = server_cert(&c, &["localhost"]);
    let port = node(Answer::Plain, cert.clone()).await;
    let mut s = try_connect(port, "localhost", &settings(Mode::Prefer, ""))
        .await
        .expect("prefer falls back to plain");
    assert!(!s.is_tls());
    s.write_all(b"ping").await.unwrap();
    let mut buf = BytesMut::new();
    while buf.len() < 4 {
        assert!(s.read_some(&mut buf).await.unwrap() > 0);
    }
    assert_eq!(&buf[..], b"ping");

    let port = node(Answer::Plain, cert).await;
    let err = try_connect(port, "localhost", &settings(Mode::Require, ""))
        .await
        .err()
        .expect("require refuses a node without TLS");
    assert_eq!(
        err,
        "the node does not offer TLS and server_tls_sslmode is require"
    );
}

#[tokio::test]
async fn bytes_after_the_s_are_not_taken_as_tls() {
    let c = ca("i");
    let port = node(Answer::Injected, server_cert(&c, &["localhost"])).await;
    let err = try_connect(port, "localhost", &settings(Mode::Require, ""))
        .await
        .err()
        .expect("injected plaintext fails the handshake");
    assert!(err.starts_with("TLS handshake with localhost"), "{err}");
}

#[tokio::test]
async fn a_megabyte_each_way_through_the_non_blocking_stream() {
    let c = ca("big");
    let port = node(Answer::Tls, server_cert(&c, &["localhost"])).await;
    let mut s = try_connect(port, "localhost", &settings(Mode::Require, ""))
        .await
        .unwrap();
    let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    // Write without ever waiting on reads first: the echo comes back while we write,
    // so the loop must interleave, as the session loop does.
    let mut sent = 0;
    let mut got = BytesMut::new();
    while got.len() < data.len() {
        if sent < data.len() {
            match s.try_write(&data[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("write: {e}"),
            }
        }
        s.flush_unsent().unwrap();
        match s.try_read_buf(&mut got) {
            Ok(0) => panic!("closed after {} bytes", got.len()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::select! {
                    r = s.readable() => r.unwrap(),
                    r = s.writable(), if sent < data.len() || s.has_unsent() => r.unwrap(),
                }
            }
            Err(e) => panic!("read: {e}"),
        }
    }
    assert_eq!(&got[..], &data[..], "every byte back, in order");
    assert!(s.still_open(), "an idle echo connection is open");
    s.shutdown().await;
}

#[tokio::test]
async fn changed_files_are_read_again_and_a_broken_one_keeps_the_last_good() {
    let dir = tempdir("files");
    let first = ca("first");
    let second = ca("second");
    let ca_file = write(&dir, "ca.pem", &first.cert.pem());
    let s = settings(Mode::VerifyFull, &ca_file);
    let signed_by_second = server_cert(&second, &["localhost"]);

    let port = node(Answer::Tls, signed_by_second.clone()).await;
    assert!(try_connect(port, "localhost", &s).await.is_err());

    // The CA file now holds the second CA (a different length, so the change is seen
    // even within the file system's timestamp resolution).
    let both = format!("{}{}", second.cert.pem(), first.cert.pem());
    std::fs::write(&ca_file, &both).unwrap();
    let port = node(Answer::Tls, signed_by_second.clone()).await;
    try_connect(port, "localhost", &s)
        .await
        .expect("the new CA is used for the next connection");

    // A broken file: the last good configuration stays.
    std::fs::write(&ca_file, "not a certificate").unwrap();
    let port = node(Answer::Tls, signed_by_second).await;
    try_connect(port, "localhost", &s)
        .await
        .expect("a broken CA file keeps the previous one");

    // Settings that never loaded are an error that names the file.
    let missing = settings(Mode::VerifyCa, "/nonexistent/ca.pem");
    let err = missing.client_config().expect_err("a missing file");
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
}

#[test]
fn check_names_what_is_missing() {
    let s = settings(Mode::VerifyFull, "");
    assert!(s.check().unwrap_err().contains("needs server_tls_ca_file"));
    let s = Settings {
        cert_file: "c.pem".into(),
        ..Settings::default()
    };
    assert!(s.check().unwrap_err().contains("go together"));
    assert!(Settings::default().check().is_ok());
}

/// `server_tls_cert_file` / `server_tls_key_file`: pgfresh presents its certificate to a
/// node that asks for one, and the node sees it.
#[tokio::test]
async fn a_client_certificate_is_presented_when_configured() {
    let dir = tempdir("clientcert");
    let c = ca("cc");
    let (server_pem, server_key) = server_cert(&c, &["localhost"]);
    let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "pgfresh");
    let client_key = KeyPair::generate().unwrap();
    let client = client_params
        .signed_by(&client_key, &c.cert, &c.key)
        .unwrap();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(server_pem.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(server_key.as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let node = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut req = [0u8; 8];
        sock.read_exact(&mut req).await.unwrap();
        sock.write_all(b"S").await.unwrap();
        let mut tls = acceptor
            .accept(sock)
            .await
            .expect("the node accepts the certificate");
        let seen = tls.get_ref().1.peer_certificates().map(|c| c.len());
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await.unwrap();
        seen
    });
    let settings = Settings {
        mode: Mode::VerifyFull,
        ca_file: write(&dir, "ca.pem", &c.cert.pem()),
        cert_file: write(&dir, "client.pem", &client.pem()),
        key_file: write(&dir, "client.key", &client_key.serialize_pem()),
    };
    let mut s = try_connect(port, "localhost", &settings).await.unwrap();
    s.write_all(b"x").await.unwrap();
    assert_eq!(
        node.await.unwrap(),
        Some(1),
        "the node saw pgfresh's certificate"
    );
}

/// A read that empties the socket makes tokio forget its readiness without a second
/// `recv`; bytes that arrive afterwards still wake the reader.
#[tokio::test]
async fn a_drained_read_still_wakes_for_the_next_bytes() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let reader = pgfresh_nodetls::Tcp::connect("127.0.0.1", port)
        .await
        .unwrap();
    let (mut writer, _) = listener.accept().await.unwrap();
    let mut buf = BytesMut::with_capacity(4096);
    for round in 0..100u32 {
        let message = format!("message {round}");
        writer.write_all(message.as_bytes()).await.unwrap();
        let start = buf.len();
        while buf.len() - start < message.len() {
            tokio::time::timeout(std::time::Duration::from_secs(30), reader.readable())
                .await
                .expect("the reader is woken for new bytes")
                .unwrap();
            match reader.try_read_buf(&mut buf) {
                Ok(n) => assert!(n > 0, "the writer did not close"),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(&buf[start..], message.as_bytes());
    }
}
