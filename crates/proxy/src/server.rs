//! One connection from pgfresh to a PostgreSQL node: connect, authenticate, start up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pgfresh_nodetls::ServerStream;
use pgfresh_wire::auth::{ClientLogin, LoginError, LoginStep, Secret};
use pgfresh_wire::{build, parse_backend, BackendMessage, CancelKey, Limits, TxStatus};

use crate::error::ProxyError;
use crate::io::{try_frame, ReadError, Side};

/// Where a node is and who we log in as.
#[derive(Clone, Debug)]
pub struct Target {
    pub node: usize,
    pub node_name: Arc<str>,
    pub host: Arc<str>,
    pub port: u16,
    /// TLS toward the node (`server_tls_*`).
    pub tls: Arc<pgfresh_nodetls::Settings>,
    pub user: Arc<str>,
    pub password: Option<Arc<str>>,
    /// SCRAM pass-through keys, used when there is no password.
    pub passthrough: Option<pgfresh_wire::auth::ScramKeys>,
    pub database: Arc<str>,
}

/// Numbers server connections for SHOW SERVERS.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// An authenticated, started server connection.
pub struct ServerConn {
    /// pgfresh's own number for this connection.
    pub id: u64,
    pub connected_at: std::time::SystemTime,
    /// When it was opened, for `server_lifetime_ms`.
    pub opened: std::time::Instant,
    pub target: Target,
    pub stream: ServerStream,
    pub rbuf: BytesMut,
    /// Bytes queued for the server that it has not accepted yet (see [`ServerConn::queue`]).
    pub wbuf: BytesMut,
    pub key: CancelKey,
    /// Where a cancel of this connection's query goes, built the first time it is
    /// asked for ([`ServerConn::cancel_target`]).
    cancel_target: Option<Arc<crate::cancel::CancelTarget>>,
    /// ParameterStatus values the server reported, kept current.
    pub params: HashMap<String, String>,
    /// Session mode: statements on this connection made by Parse under the client's own
    /// name (the unnamed one as ""), with the hash of their text so a redefinition is
    /// noticed.
    pub prepared: crate::name_map::NameMap<u64>,
    /// Statements on this connection under the client's own name made by SQL PREPARE
    /// (both modes), or in transaction mode a statement of the client's parsed under its
    /// name for an EXECUTE of it; by name, with the hash of their text. Transaction mode
    /// drops them at check-in ([`ServerConn::sql_prepared_cleanup`]).
    pub sql_prepared: crate::name_map::NameMap<u64>,
    /// Transaction mode: protocol-level statements on this connection, by content,
    /// under pgfresh's own names.
    pub statements: crate::statements::StatementCache,
    /// The settings this connection carries, compared by content with a session's
    /// before it is used; `None` when unknown (a replay failed).
    pub settings: Option<crate::session::state::SettingsList>,
    /// The cluster generation the connection was made in; a role change makes it stale.
    pub generation: u64,
    pub tx: TxStatus,
    /// Counted in `pgfresh_tls_connections{side="server"}` while open, when encrypted.
    _tls_count: Option<crate::tls::TlsCount>,
}

/// Limits for server traffic: servers are trusted more than clients, but a corrupted
/// stream must still not make us allocate without bound.
pub fn server_limits() -> Limits {
    Limits {
        max_message: 1 << 30,
        max_startup: 10 * 1024,
    }
}

impl ServerConn {
    /// Connect, authenticate and wait for the first ReadyForQuery.
    pub async fn connect(
        target: Target,
        startup_params: &[(String, String)],
        connect_timeout: Duration,
        login_timeout: Duration,
        generation: u64,
    ) -> Result<ServerConn, ProxyError> {
        Self::open(
            target,
            startup_params,
            None,
            (connect_timeout, login_timeout),
            generation,
        )
        .await
    }

    /// A logical-replication connection to the target's database (`replication=database`:
    /// replication commands and SQL), for pgfresh's own use ([`crate::wal_feed`]); a
    /// client's startup parameters never open one.
    pub async fn connect_replication(
        target: Target,
        connect_timeout: Duration,
        login_timeout: Duration,
    ) -> Result<ServerConn, ProxyError> {
        Self::open(
            target,
            &[],
            Some("database"),
            (connect_timeout, login_timeout),
            0,
        )
        .await
    }

    async fn open(
        target: Target,
        startup_params: &[(String, String)],
        replication: Option<&str>,
        (connect_timeout, login_timeout): (Duration, Duration),
        generation: u64,
    ) -> Result<ServerConn, ProxyError> {
        let err = |reason: String| ProxyError::ServerConnect {
            node: target.node_name.to_string(),
            reason,
        };
        let stream = tokio::time::timeout(
            connect_timeout,
            pgfresh_nodetls::Tcp::connect(&target.host, target.port),
        )
        .await
        .map_err(|_| err("connect timed out".into()))?
        .map_err(|e| err(e.to_string()))?;
        let negotiated = tokio::time::timeout(
            connect_timeout,
            pgfresh_nodetls::connect(stream, &target.tls, &target.host),
        )
        .await
        .unwrap_or_else(|_| Err("TLS negotiation timed out".into()));
        let result = match &negotiated {
            Ok(s) if s.is_tls() => Some("ok"),
            Ok(_) => (target.tls.mode != pgfresh_nodetls::Mode::Disable).then_some("plain"),
            Err(_) => Some("failed"),
        };
        if let Some(result) = result {
            metrics::counter!("pgfresh_tls_handshakes_total", "side" => "server", "result" => result)
                .increment(1);
        }
        let stream = negotiated.map_err(err)?;
        let tls_count = stream.is_tls().then(|| crate::tls::TlsCount::new("server"));
        let mut conn = ServerConn {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            connected_at: std::time::SystemTime::now(),
            opened: std::time::Instant::now(),
            target: target.clone(),
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            wbuf: BytesMut::new(),
            key: CancelKey { pid: 0, secret: 0 },
            cancel_target: None,
            params: HashMap::new(),
            prepared: Default::default(),
            sql_prepared: Default::default(),
            statements: Default::default(),
            settings: Some(crate::session::state::no_settings()),
            generation,
            tx: TxStatus::Idle,
            _tls_count: tls_count,
        };
        tokio::time::timeout(login_timeout, conn.login(startup_params, replication))
            .await
            .map_err(|_| err("login timed out".into()))??;
        Ok(conn)
    }

    async fn login(
        &mut self,
        startup_params: &[(String, String)],
        replication: Option<&str>,
    ) -> Result<(), ProxyError> {
        let mut params: Vec<(&str, &str)> = vec![
            ("user", &self.target.user),
            ("database", &self.target.database),
        ];
        for (k, v) in startup_params {
            if !matches!(k.as_str(), "user" | "database" | "replication") {
                params.push((k, v));
            }
        }
        if let Some(mode) = replication {
            params.push(("replication", mode));
        }
        let startup = build::startup(&params);
        self.send(&startup).await?;
        // (Its own handle on the user and password: the loop borrows the connection.)
        let (user, password) = (self.target.user.clone(), self.target.password.clone());
        let secret = match (&password, self.target.passthrough) {
            (Some(pw), _) => Secret::Password(pw),
            (None, Some(keys)) => Secret::ScramKeys(keys),
            (None, None) => Secret::None,
        };
        let mut login = ClientLogin::new(&user, secret);
        loop {
            let frame = self.read().await?;
            let msg = parse_backend(&frame).map_err(|e| self.protocol(e.to_string()))?;
            match login.on_message(msg).map_err(|e| self.login_error(e))? {
                LoginStep::Send(reply) => self.send(&reply).await?,
                LoginStep::Parameter { name, value } => {
                    self.params.insert(name.to_string(), value.to_string());
                }
                LoginStep::Key(key) => self.key = key,
                LoginStep::Ready(tx) => {
                    self.tx = tx;
                    return Ok(());
                }
                LoginStep::Read => {}
            }
        }
    }

    /// A failed login as the client is told of it: the server's refusal in its words,
    /// what pgfresh lacks to answer as a failure to connect, the rest as the node's
    /// protocol.
    fn login_error(&self, e: LoginError) -> ProxyError {
        let node = self.target.node_name.to_string();
        match e {
            LoginError::Refused { code, message } => ProxyError::ServerLogin { code, message },
            LoginError::NoPassword { .. } => ProxyError::ServerConnect {
                node,
                reason: e.to_string(),
            },
            LoginError::Md5HashOnly { user } => ProxyError::ServerConnect {
                node,
                reason: format!(
                    "the node asks for SCRAM-SHA-256 and only an md5 hash is known for user {user} (auth_file); give its SCRAM verifier or password instead"
                ),
            },
            LoginError::Unsupported(reason) | LoginError::Protocol(reason) => {
                self.protocol(reason)
            }
        }
    }

    fn protocol(&self, reason: String) -> ProxyError {
        ProxyError::ServerProtocol {
            node: self.target.node_name.to_string(),
            reason,
        }
    }

    pub fn lost(&self, e: impl std::fmt::Display) -> ProxyError {
        ProxyError::ServerLost {
            node: self.target.node_name.to_string(),
            reason: e.to_string(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), ProxyError> {
        if !self.wbuf.is_empty() {
            let pending = std::mem::take(&mut self.wbuf);
            self.stream
                .write_all(&pending)
                .await
                .map_err(|e| self.lost(e))?;
        }
        self.stream.write_all(bytes).await.map_err(|e| self.lost(e))
    }

    /// Bytes given to this connection that the node has not been sent yet (queued, or
    /// encrypted records the socket has not taken): the session waits for the socket to
    /// become writable while this is not 0.
    pub fn unsent(&self) -> usize {
        self.wbuf.len() + usize::from(self.stream.has_unsent())
    }

    /// Queue bytes for the server without waiting: as much as the socket takes now is
    /// written at once, the rest stays in `wbuf` for the session loop to write when
    /// the socket is writable. The session keeps reading the server meanwhile, so a
    /// server answering a long batch while it is still being sent never waits on us.
    pub fn queue(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.wbuf.is_empty() {
            let n = self.write_now(bytes)?;
            if n < bytes.len() {
                self.wbuf.extend_from_slice(&bytes[n..]);
            }
            return Ok(());
        }
        self.wbuf.extend_from_slice(bytes);
        self.flush_some()
    }

    /// Write as much of `wbuf` as the socket takes without waiting.
    pub fn flush_some(&mut self) -> std::io::Result<()> {
        self.stream.flush_unsent()?;
        while !self.wbuf.is_empty() {
            let n = match self.stream.try_write(&self.wbuf) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            };
            // Advance, not split: the buffer stays this connection's own and is reused.
            bytes::Buf::advance(&mut self.wbuf, n);
        }
        crate::io::rewind(&mut self.wbuf);
        Ok(())
    }

    fn write_now(&mut self, mut bytes: &[u8]) -> std::io::Result<usize> {
        let mut written = 0;
        while !bytes.is_empty() {
            match self.stream.try_write(bytes) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    written += n;
                    bytes = &bytes[n..];
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(written)
    }

    /// Read one frame (used outside the relay loop: login, reset, injected queries).
    pub async fn read(&mut self) -> Result<pgfresh_wire::Frame, ProxyError> {
        loop {
            match try_frame(&mut self.rbuf, &server_limits(), Side::Backend) {
                Ok(Some(frame)) => return Ok(frame),
                Ok(None) => {}
                Err(f) => return Err(self.protocol(f.to_string())),
            }
            if self.rbuf.capacity() - self.rbuf.len() < 4096 {
                self.rbuf.reserve(16 * 1024);
            }
            match self.stream.read_some(&mut self.rbuf).await {
                Ok(0) if self.rbuf.is_empty() => return Err(self.lost(ReadError::Closed)),
                Ok(0) => return Err(self.lost(ReadError::Truncated)),
                Ok(_) => {}
                Err(e) => return Err(self.lost(e)),
            }
        }
    }

    /// Run a simple query and discard its results; Err carries the server's error
    /// message. Leaves the connection idle (ReadyForQuery seen).
    pub async fn run_quiet(&mut self, sql: &str) -> Result<Result<(), String>, ProxyError> {
        self.run_frames_quiet(&build::query(sql)).await
    }

    /// Consume replies until ReadyForQuery. Returns the first error's message, if any.
    pub async fn drain_until_ready(&mut self) -> Result<Result<(), String>, ProxyError> {
        let mut outcome = Ok(());
        loop {
            let frame = self.read().await?;
            match parse_backend(&frame).map_err(|e| self.protocol(e.to_string()))? {
                BackendMessage::ReadyForQuery(tx) => {
                    self.tx = tx;
                    return Ok(outcome);
                }
                BackendMessage::ErrorResponse(f) if outcome.is_ok() => {
                    outcome = Err(format!(
                        "{}: {}",
                        f.code.unwrap_or("XX000"),
                        f.message.unwrap_or("error")
                    ));
                }
                BackendMessage::ParameterStatus { name, value } => {
                    self.params.insert(name.to_string(), value.to_string());
                }
                _ => {}
            }
        }
    }

    /// The server has not closed this idle connection or sent anything on it (a server
    /// sends an idle connection nothing but a FATAL before it closes it).
    pub fn still_open(&mut self) -> bool {
        self.stream.still_open()
    }

    /// After a reset query ran: no statements; default settings when it was DISCARD ALL
    /// (`reset`), otherwise unknown.
    pub fn forget_session_state(&mut self, reset: bool) {
        self.forget_prepared();
        self.statements.clear();
        self.settings = if reset {
            Some(crate::session::state::no_settings())
        } else {
            None
        };
    }

    /// Where a cancel of this connection's query goes (once logged in), built once:
    /// a session names it each time this connection becomes its active one.
    pub fn cancel_target(&mut self) -> &Arc<crate::cancel::CancelTarget> {
        let (target, key) = (&self.target, self.key);
        self.cancel_target.get_or_insert_with(|| {
            Arc::new(crate::cancel::CancelTarget {
                host: target.host.clone(),
                port: target.port,
                tls: target.tls.clone(),
                key,
            })
        })
    }

    /// The client's SQL-level prepared statements were deallocated.
    pub fn forget_sql_prepared(&mut self) {
        self.sql_prepared.clear();
    }

    /// Every statement under a client's name is gone (DISCARD ALL, DEALLOCATE ALL, a
    /// reset).
    pub fn forget_prepared(&mut self) {
        self.prepared.clear();
        self.sql_prepared.clear();
    }

    /// A protocol Close for each SQL-level prepared statement a client left on this
    /// connection, then a Sync, or `None` when there are none. (A Close of a statement
    /// the server lacks completes all the same, where a `DEALLOCATE` would fail.)
    pub fn sql_prepared_cleanup(&self) -> Option<Vec<u8>> {
        let mut frames = Vec::new();
        for name in self.sql_prepared.keys() {
            frames.extend_from_slice(&build::close(b'S', name));
        }
        (!frames.is_empty()).then(|| {
            frames.extend_from_slice(&build::sync());
            frames
        })
    }

    /// Send `frames` (ending in a Sync or a Query) and discard the replies up to the
    /// ReadyForQuery; Err carries the server's first error message.
    pub async fn run_frames_quiet(
        &mut self,
        frames: &[u8],
    ) -> Result<Result<(), String>, ProxyError> {
        self.send(frames).await?;
        self.drain_until_ready().await
    }

    /// The ring runtime the connection's socket belongs to (`None` on tokio): where
    /// work on it must run.
    pub fn home(&self) -> Option<pgfresh_ring::Handle> {
        self.stream.tcp().home()
    }

    /// [`terminate`](Self::terminate) in a task of its own, on the connection's engine.
    pub fn close_in_background(self) {
        spawn_on(self.home(), self.terminate());
    }

    /// Bytes of a Terminate message, for a polite close.
    pub async fn terminate(mut self) {
        let t: Bytes = build::terminate();
        let _ = self.stream.write_all(&t).await;
        self.stream.shutdown().await;
    }
}

/// Starts `work` on `home`, the ring runtime of the sockets it uses, or on tokio.
pub fn spawn_on<F>(home: Option<pgfresh_ring::Handle>, work: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match home {
        Some(ring) => drop(ring.spawn(work)),
        None => drop(tokio::spawn(work)),
    }
}
