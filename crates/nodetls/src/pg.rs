//! pgfresh's own tokio-postgres connections to nodes (monitor, catalog reader,
//! `auth_query`) with the node's TLS settings, through tokio-postgres-rustls.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::{Mode, Settings};

type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;
type Connect = <MakeRustlsConnect as MakeTlsConnect<Socket>>::TlsConnect;

/// The connection half tokio-postgres returns; spawn it or await it.
pub type Connection = tokio_postgres::Connection<Socket, Stream>;

/// Why a connection could not be made.
#[derive(Debug)]
pub enum ConnectError {
    /// The TLS settings' files did not load.
    Settings(String),
    /// What tokio-postgres reported (the server's error, I/O or TLS).
    Postgres(tokio_postgres::Error),
}

/// An open connection and whether it is encrypted.
pub struct Connected {
    pub client: tokio_postgres::Client,
    pub connection: Connection,
    pub tls: bool,
}

/// Connect with `config` (host, port, user …), negotiating TLS as `settings` ask.
pub async fn connect(
    config: &mut tokio_postgres::Config,
    settings: &Settings,
) -> Result<Connected, ConnectError> {
    let (tls, used) = tracked(config, settings)?;
    let (client, connection) = config.connect(tls).await.map_err(ConnectError::Postgres)?;
    Ok(Connected {
        client,
        connection,
        tls: used.load(Ordering::Acquire),
    })
}

/// The TLS side of a connection as `settings` ask (`config`'s sslmode set to match), and
/// the flag its handshake sets.
fn tracked(
    config: &mut tokio_postgres::Config,
    settings: &Settings,
) -> Result<(Tracked, Arc<AtomicBool>), ConnectError> {
    let rustls = match settings.client_config().map_err(ConnectError::Settings)? {
        Some(c) => c,
        None => unused_config(),
    };
    config.ssl_mode(match settings.mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
    });
    let used = Arc::new(AtomicBool::new(false));
    let tls = Tracked {
        inner: MakeRustlsConnect::new((*rustls).clone()),
        used: used.clone(),
    };
    Ok((tls, used))
}

/// A configuration for `disable`, where tokio-postgres never starts TLS.
fn unused_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// MakeRustlsConnect that records whether a handshake completed.
#[derive(Clone)]
struct Tracked {
    inner: MakeRustlsConnect,
    used: Arc<AtomicBool>,
}

struct TrackedConnect {
    inner: Connect,
    used: Arc<AtomicBool>,
}

impl<S> MakeTlsConnect<S> for Tracked
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = TrackedConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, hostname: &str) -> Result<TrackedConnect, Self::Error> {
        Ok(TrackedConnect {
            inner: <MakeRustlsConnect as MakeTlsConnect<S>>::make_tls_connect(
                &mut self.inner,
                hostname,
            )?,
            used: self.used.clone(),
        })
    }
}

type ConnectFuture<S> = Pin<
    Box<
        dyn Future<
                Output = Result<
                    <Connect as TlsConnect<S>>::Stream,
                    <Connect as TlsConnect<S>>::Error,
                >,
            > + Send,
    >,
>;

impl<S> TlsConnect<S> for TrackedConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <Connect as TlsConnect<S>>::Stream;
    type Error = <Connect as TlsConnect<S>>::Error;
    type Future = ConnectFuture<S>;

    fn connect(self, stream: S) -> ConnectFuture<S> {
        let used = self.used;
        let handshake = <Connect as TlsConnect<S>>::connect(self.inner, stream);
        Box::pin(async move {
            let stream = handshake.await?;
            used.store(true, Ordering::Release);
            Ok(stream)
        })
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Settings(s) => write!(f, "server TLS: {s}"),
            ConnectError::Postgres(e) => write!(f, "{e}"),
        }
    }
}
