//! TLS toward clients: the acceptor built from `[tls]`, and the first packets of a
//! connection (SSLRequest answered `S` and the handshake done on the same socket, or `N`).
//!
//! The acceptor is rebuilt when the config changes and when the certificate, key or CA
//! files change on disk (checked every second); a file that cannot be loaded is
//! reported and the running acceptor stays. Connections already open keep theirs.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use arc_swap::ArcSwapOption;
use bytes::BytesMut;
use pgfresh_config::{ClientTlsMode, TlsSection};
use pgfresh_nodetls::certs;
use pgfresh_nodetls::Tcp;
use pgfresh_wire::{build, decode_startup, Decoded, Limits, StartupPacket};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::error::ProxyError;
use crate::io::fill;

/// A client connection, plain or TLS.
pub enum ClientStream {
    Plain(Tcp),
    Tls(Box<TlsStream<Tcp>>),
}

impl ClientStream {
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp().peer_addr().ok()
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }

    /// Wait for and append what the client sends next (`Ok(0)`: it closed). Cancel-safe:
    /// nothing is read before the socket is ready, and what is read is returned at once.
    pub async fn read_some(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        crate::io::rewind(buf);
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        match self {
            ClientStream::Plain(s) => loop {
                // The socket's one reader slot, not a waiter list (`Tcp::readable`).
                s.readable().await?;
                match s.try_read_buf(buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    other => return other,
                }
            },
            ClientStream::Tls(s) => tokio::io::AsyncReadExt::read_buf(s.as_mut(), buf).await,
        }
    }

    /// Write all of `bytes`. Plain TCP tries the socket first, so the usual reply, which
    /// the socket takes whole, costs no future and no readiness wait.
    pub async fn write_all_now(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if let ClientStream::Plain(s) = self {
            match s.try_write(bytes) {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => return s.write_all(&bytes[n..]).await,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        self.write_all(bytes).await
    }

    /// Hand TLS records still waiting to the socket (plain TCP keeps nothing back).
    pub async fn flush_tls(&mut self) -> std::io::Result<()> {
        match self {
            ClientStream::Plain(_) => Ok(()),
            ClientStream::Tls(s) => s.flush().await,
        }
    }

    fn tcp(&self) -> &Tcp {
        match self {
            ClientStream::Plain(s) => s,
            ClientStream::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What the acceptor was built from: the section and each file's modification time and
/// length, so a change on disk is noticed.
#[derive(Clone, Debug, PartialEq)]
struct Stamp {
    section: TlsSection,
    files: Vec<Option<(SystemTime, u64)>>,
}

fn stamp(section: &TlsSection) -> Stamp {
    let files = [
        &section.client_tls_cert_file,
        &section.client_tls_key_file,
        &section.client_tls_ca_file,
    ]
    .iter()
    .map(|p| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    })
    .collect();
    Stamp {
        section: section.clone(),
        files,
    }
}

/// The client-side TLS in force.
pub struct Active {
    pub mode: ClientTlsMode,
    /// `None` with `disable`.
    pub acceptor: Option<TlsAcceptor>,
    stamp: Stamp,
}

#[derive(Default)]
pub struct ClientTls {
    current: ArcSwapOption<Active>,
}

fn build_acceptor(section: &TlsSection, mode: ClientTlsMode) -> Result<TlsAcceptor, String> {
    let chain = certs(&section.client_tls_cert_file)?;
    let key_path = &section.client_tls_key_file;
    let key = PrivateKeyDer::from_pem_file(Path::new(key_path))
        .map_err(|e| format!("{key_path}: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if mode.verifies_clients() {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(&section.client_tls_ca_file)? {
            roots
                .add(c)
                .map_err(|e| format!("{}: {e}", section.client_tls_ca_file))?;
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| e.to_string())?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("certificate and key do not go together: {e}"))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

impl ClientTls {
    /// The TLS in force (`None` before the first successful load).
    pub fn active(&self) -> Option<Arc<Active>> {
        self.current.load_full()
    }

    /// Rebuild the acceptor if `section` or its files changed since the last load. A
    /// load that fails keeps what runs and is reported (logged, counted) once per change.
    pub fn refresh(&self, section: &TlsSection) {
        let now = stamp(section);
        let current = self.current.load();
        if current.as_ref().is_some_and(|a| a.stamp == now) {
            return;
        }
        let mode = section.client_mode();
        let built = if mode == ClientTlsMode::Disable {
            Ok(None)
        } else {
            build_acceptor(section, mode).map(Some)
        };
        match built {
            Ok(acceptor) => {
                if current.is_some() {
                    tracing::info!(mode = mode.as_str(), "client TLS reloaded");
                }
                metrics::counter!("pgfresh_tls_reloads_total", "result" => "ok").increment(1);
                self.current.store(Some(Arc::new(Active {
                    mode,
                    acceptor,
                    stamp: now,
                })));
            }
            Err(e) => {
                tracing::error!(error = %e, "client TLS not (re)loaded; the running certificate stays");
                metrics::counter!("pgfresh_tls_reloads_total", "result" => "error").increment(1);
                // Remember the failed files so the error is reported once, not every second.
                let keep = current.as_ref().map(|a| Active {
                    mode: a.mode,
                    acceptor: a.acceptor.clone(),
                    stamp: now.clone(),
                });
                if let Some(k) = keep {
                    self.current.store(Some(Arc::new(k)));
                }
            }
        }
    }
}

/// Answer the connection's first SSLRequest (and GSSENCRequest, always `N`); `stream`
/// becomes what the rest of the connection speaks. Nothing is consumed from `buf` but the
/// requests answered. A failed handshake leaves `stream` empty (nothing more can be said).
pub async fn negotiate(
    stream: &mut Option<ClientStream>,
    buf: &mut BytesMut,
    tls: Option<&Active>,
    limits: &Limits,
) -> Result<(), ProxyError> {
    loop {
        let Some(ClientStream::Plain(sock)) = stream.as_mut() else {
            return Ok(());
        };
        let mut peek = buf.clone();
        let packet = match decode_startup(&mut peek, limits)? {
            Decoded::Incomplete { .. } => {
                fill(sock, buf).await.map_err(crate::client::read_err)?;
                continue;
            }
            Decoded::Frame(p) => p,
        };
        match packet {
            StartupPacket::GssEncRequest => {
                *buf = peek;
                sock.write_all(&build::ssl_no())
                    .await
                    .map_err(ProxyError::ClientIo)?;
            }
            StartupPacket::SslRequest => {
                *buf = peek;
                let Some(acceptor) = tls.and_then(|t| t.acceptor.clone()) else {
                    sock.write_all(&build::ssl_no())
                        .await
                        .map_err(ProxyError::ClientIo)?;
                    continue;
                };
                if !buf.is_empty() {
                    // Bytes sent after SSLRequest and before the handshake could be
                    // read as if they came over TLS: refused.
                    metrics::counter!("pgfresh_tls_handshakes_total", "side" => "client", "result" => "refused")
                        .increment(1);
                    return Err(ProxyError::Startup(
                        "unencrypted data after SSL request (sent before the TLS handshake)".into(),
                    ));
                }
                sock.write_all(b"S").await.map_err(ProxyError::ClientIo)?;
                let Some(ClientStream::Plain(sock)) = stream.take() else {
                    return Err(ProxyError::ClientGone);
                };
                return match acceptor.accept(sock).await {
                    Ok(s) => {
                        metrics::counter!("pgfresh_tls_handshakes_total", "side" => "client", "result" => "ok")
                            .increment(1);
                        *stream = Some(ClientStream::Tls(Box::new(s)));
                        Ok(())
                    }
                    Err(e) => {
                        metrics::counter!("pgfresh_tls_handshakes_total", "side" => "client", "result" => "failed")
                            .increment(1);
                        tracing::info!(error = %e, "client TLS handshake failed");
                        Err(ProxyError::ClientGone)
                    }
                };
            }
            // A startup or cancel packet: the connection stays plain.
            _ => return Ok(()),
        }
    }
}

/// Counts an encrypted connection in `pgfresh_tls_connections{side}` while it lasts
/// (`side` is `client` or `server`).
pub struct TlsCount(&'static str);

impl TlsCount {
    pub fn new(side: &'static str) -> Self {
        metrics::gauge!("pgfresh_tls_connections", "side" => side).increment(1.0);
        TlsCount(side)
    }
}

impl Drop for TlsCount {
    fn drop(&mut self) {
        metrics::gauge!("pgfresh_tls_connections", "side" => self.0).decrement(1.0);
    }
}
