//! The client listener: accept, admit (connection limit), open (startup, auth,
//! cancel) under the login timeout, then run the session.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use pgfresh_nodetls::Tcp;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tracing::Instrument;

use pgfresh_config::ClientTlsMode;

use crate::client::{open, Opening};
use crate::context::Shared;
use crate::error::ProxyError;
use crate::session::Session;
use crate::tls::{self, ClientStream};

/// Accept clients on `listener` until `shutdown` resolves. Running sessions are not
/// waited for here; see [`crate::Proxy::run`].
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((sock, peer)) => {
                    let _ = sock.set_nodelay(true);
                    let shared = shared.clone();
                    // At debug level every log line of a session names its client.
                    let span = tracing::debug_span!("client", %peer);
                    match shared.ring.clone() {
                        None => drop(tokio::spawn(
                            async move {
                                handle_client(Tcp::Epoll(sock), shared).await;
                                tracing::trace!("client done");
                            }
                            .instrument(span),
                        )),
                        // The io_uring engine: the session runs on the ring's thread,
                        // its socket taken from tokio's reactor to the ring's.
                        Some(ring) => match sock.into_std() {
                            Ok(sock) => drop(ring.spawn(
                                async move {
                                    let sock = Tcp::Ring(pgfresh_ring::TcpStream::from_std(sock));
                                    handle_client(sock, shared).await;
                                    tracing::trace!("client done");
                                }
                                .instrument(span),
                            )),
                            Err(e) => tracing::warn!(error = %e, "cannot hand a client socket to the ring"),
                        },
                    }
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

struct ClientCount(Arc<Shared>);

impl Drop for ClientCount {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::AcqRel);
        metrics::gauge!("pgfresh_client_connections").decrement(1.0);
    }
}

async fn handle_client(sock: Tcp, shared: Arc<Shared>) {
    let config = shared.config.snapshot();
    let count = shared.clients.fetch_add(1, Ordering::AcqRel) + 1;
    metrics::gauge!("pgfresh_client_connections").increment(1.0);
    let _guard = ClientCount(shared.clone());
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let login_timeout = Duration::from_millis(config.proxy.client_login_timeout_ms);
    let tls = shared.client_tls.active();
    let limits = pgfresh_wire::Limits {
        max_message: config.proxy.max_message_bytes,
        max_startup: 10 * 1024,
    };
    let mut stream = Some(ClientStream::Plain(sock));
    // Boxed: the login's state (5 KiB) would otherwise stay in the session's future for
    // as long as the client is connected.
    let opened = tokio::time::timeout(
        login_timeout,
        Box::pin(async {
            tls::negotiate(&mut stream, &mut buf, tls.as_deref(), &limits).await?;
            let sock = stream.as_mut().ok_or(ProxyError::ClientGone)?;
            open(sock, &mut buf, &config, &shared).await
        }),
    )
    .await;
    let login = match opened {
        Err(_) => {
            reject(stream, ProxyError::LoginTimeout).await;
            return;
        }
        Ok(Err(e)) => {
            reject(stream, e).await;
            return;
        }
        Ok(Ok(Opening::Cancel(key))) => {
            shared.cancels.cancel(key).await;
            return;
        }
        Ok(Ok(Opening::Session(login))) => login,
    };
    let Some(sock) = stream else { return };
    if let Some(keys) = &login.passthrough {
        shared
            .passthrough
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(login.user.name.clone(), **keys);
    }
    let _tls_count = sock.is_tls().then(|| crate::tls::TlsCount::new("client"));
    let mode = tls.as_ref().map_or(ClientTlsMode::Disable, |t| t.mode);
    if mode.required() && !sock.is_tls() {
        reject(Some(sock), ProxyError::TlsRequired(mode.as_str())).await;
        return;
    }
    if count > config.proxy.max_client_connections {
        reject(Some(sock), ProxyError::TooManyClients).await;
        return;
    }
    if login.database == "pgfresh" {
        crate::console::run(sock, buf, shared, login).await;
        return;
    }
    let registration = shared.cancels.register();
    let mut session = Session::new(shared.clone(), sock, buf, login, registration.slot.clone());
    match tokio::time::timeout(login_timeout, session.start(registration.key)).await {
        Ok(Ok(())) => session.run().await,
        // (Boxed, as the login is: rare, and large.)
        Ok(Err(e)) => Box::pin(session.reject(e)).await,
        Err(_) => Box::pin(session.reject(ProxyError::LoginTimeout)).await,
    }
}

async fn reject(sock: Option<ClientStream>, e: ProxyError) {
    metrics::counter!("pgfresh_client_login_failures_total", "sqlstate" => e.sqlstate())
        .increment(1);
    tracing::info!(error = %e, "client rejected");
    let Some(mut sock) = sock else { return };
    if !matches!(e, ProxyError::ClientGone | ProxyError::ClientIo(_)) {
        let _ = sock.write_all(&e.to_client()).await;
    }
    let _ = sock.shutdown().await;
}
