//! Internal errors and the one place that turns them into what a client sees.

use bytes::Bytes;
use pgfresh_wire::{sqlstate, ErrorResponse, FrameError};

/// Everything that can go wrong inside a session.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("client protocol violation: {0}")]
    ClientProtocol(#[from] FrameError),
    #[error("client closed the connection")]
    ClientGone,
    #[error("client I/O: {0}")]
    ClientIo(std::io::Error),
    #[error("password authentication failed for user \"{0}\"")]
    AuthFailed(String),
    #[error("no such user \"{0}\"")]
    UnknownUser(String),
    #[error("{0}")]
    Startup(String),
    #[error("too many client connections")]
    TooManyClients,
    /// A plain connection where `client_tls_sslmode` requires TLS.
    #[error("SSL required: pgfresh accepts only TLS connections here (client_tls_sslmode = {0}); connect with sslmode=require or stronger")]
    TlsRequired(&'static str),
    #[error("timed out waiting for a server connection to {node}")]
    PoolTimeout { node: String },
    /// Transaction mode: no server connection became free in time for a statement.
    #[error("query_wait_timeout: no server connection to {node} became free within {waited_ms} ms (pool_size {pool_size}); the statement was not run")]
    QueryWaitTimeout {
        node: String,
        waited_ms: u64,
        pool_size: usize,
    },
    /// The console's PAUSE held the statement longer than the wait allows.
    #[error("pgfresh is paused (console PAUSE) and was not resumed within {waited_ms} ms; the statement was not run")]
    PausedTooLong { waited_ms: u64 },
    #[error("cannot connect to {node}: {reason}")]
    ServerConnect { node: String, reason: String },
    /// The server rejected our login; carries the server's own error fields.
    #[error("server refused login: {message}")]
    ServerLogin { code: String, message: String },
    #[error("server connection to {node} lost: {reason}")]
    ServerLost { node: String, reason: String },
    #[error("server connection to {node} lost after COMMIT was sent")]
    CommitOutcomeUnknown { node: String },
    /// The connection to the primary was lost after COMMIT was sent, and the primary
    /// says the transaction rolled back (`resolve_lost_commits`).
    #[error("server connection to {node} lost after COMMIT was sent; the primary reports that the transaction (id {xid}) rolled back")]
    CommitRolledBack { node: String, xid: u64 },
    /// The connection to the primary was lost after COMMIT was sent, a failover followed,
    /// and the transaction wrote past the point where the new primary's timeline begins:
    /// its commit is not on the new timeline (`resolve_lost_commits`).
    #[error("server connection to {node} lost after COMMIT was sent; the transaction (id {xid}) was lost in a failover: it wrote past {switch}, where the timeline of the new primary {new_primary} begins, so the new primary never received its commit; it is rolled back")]
    CommitLostInFailover {
        node: String,
        xid: u64,
        new_primary: String,
        switch: String,
    },
    #[error("server {node} sent an invalid message: {reason}")]
    ServerProtocol { node: String, reason: String },
    /// No node is known as the primary; carries why, when the cluster view can tell
    /// ([`pgfresh_balancer::ClusterView::no_primary_reason`]).
    #[error("no primary is available{}", reason_suffix(.0))]
    NoPrimary(Option<String>),
    #[error("the node serving this transaction changed role; the transaction was rolled back")]
    RoleChanged,
    #[error("login timed out")]
    LoginTimeout,
    /// Transaction mode: the client held a server connection in an open transaction
    /// (or an extended batch left open by a Flush) without a word for too long.
    #[error("terminating connection: idle in transaction for {ms} ms while holding a server connection (idle_transaction_timeout_ms)")]
    IdleTransactionTimeout { ms: u64 },
    #[error("pgfresh is shutting down")]
    Shutdown,
    #[error(
        "no replica can serve this read consistently and the primary fallback limit is reached"
    )]
    FallbackLimit,
    /// Transaction mode: SQL-level PREPARE, EXECUTE or DEALLOCATE of a name in the space
    /// pgfresh names statements on shared server connections with.
    #[error("prepared statement name \"{0}\" is reserved: on shared server connections (pool_mode = \"transaction\") names beginning with \"{prefix}\" are pgfresh's own", prefix = crate::statements::PREFIX)]
    ReservedStatementName(String),
    /// A malformed position token or pgfresh setting value.
    #[error("{0}")]
    InvalidToken(String),
    /// `on_stale = "error"`: no replica has replayed the position a token requires.
    #[error("no replica has replayed position {required} yet (the most advanced has replayed {best}); on_stale = \"error\" forbids reading it on the primary")]
    StaleReplica { required: String, best: String },
}

fn reason_suffix(reason: &Option<String>) -> String {
    reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default()
}

/// How the error ends the exchange with the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Send the error and close the client connection.
    Fatal,
    /// Send the error, then ReadyForQuery; the session goes on.
    Recoverable,
    /// Nothing can be sent: the client is gone.
    Silent,
}

impl ProxyError {
    /// The SQLSTATE a client sees for this error.
    pub fn sqlstate(&self) -> &'static str {
        use ProxyError::*;
        match self {
            ClientProtocol(e) => e.sqlstate(),
            ClientGone | ClientIo(_) => sqlstate::CONNECTION_FAILURE,
            AuthFailed(_) => sqlstate::INVALID_PASSWORD,
            TlsRequired(_) => sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            UnknownUser(_) => sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            Startup(_) => sqlstate::PROTOCOL_VIOLATION,
            TooManyClients | PoolTimeout { .. } => sqlstate::TOO_MANY_CONNECTIONS,
            QueryWaitTimeout { .. } | PausedTooLong { .. } => sqlstate::QUERY_CANCELED,
            ServerConnect { .. } | NoPrimary(_) => {
                sqlstate::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION
            }
            ServerLogin { .. } => sqlstate::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
            ServerLost { .. } | RoleChanged => sqlstate::CONNECTION_FAILURE,
            CommitOutcomeUnknown { .. } => sqlstate::TRANSACTION_RESOLUTION_UNKNOWN,
            CommitRolledBack { .. } | CommitLostInFailover { .. } => sqlstate::TRANSACTION_ROLLBACK,
            ServerProtocol { .. } => sqlstate::PROTOCOL_VIOLATION,
            LoginTimeout => sqlstate::PROTOCOL_VIOLATION,
            IdleTransactionTimeout { .. } => sqlstate::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
            Shutdown => sqlstate::ADMIN_SHUTDOWN,
            FallbackLimit | StaleReplica { .. } => sqlstate::REPLICA_NOT_CAUGHT_UP,
            InvalidToken(_) => sqlstate::INVALID_PARAMETER_VALUE,
            ReservedStatementName(_) => sqlstate::INVALID_SQL_STATEMENT_NAME,
        }
    }

    pub fn disposition(&self) -> Disposition {
        use ProxyError::*;
        match self {
            ClientGone | ClientIo(_) => Disposition::Silent,
            PoolTimeout { .. }
            | QueryWaitTimeout { .. }
            | PausedTooLong { .. }
            | NoPrimary(_)
            | ServerConnect { .. }
            | FallbackLimit
            | StaleReplica { .. }
            | InvalidToken(_)
            | ReservedStatementName(_)
            | RoleChanged
            | CommitRolledBack { .. }
            | CommitLostInFailover { .. } => Disposition::Recoverable,
            _ => Disposition::Fatal,
        }
    }

    /// The ErrorResponse frame with severity ERROR (the session goes on).
    pub fn to_client_as_error(&self) -> Bytes {
        ErrorResponse::error(self.sqlstate(), self.to_string()).to_bytes()
    }

    /// The ErrorResponse frame for this error.
    pub fn to_client(&self) -> Bytes {
        if let ProxyError::ServerLogin { code, message } = self {
            return ErrorResponse::fatal(code.clone(), message.clone()).to_bytes();
        }
        let resp = match self.disposition() {
            Disposition::Recoverable => ErrorResponse::error(self.sqlstate(), self.to_string()),
            _ => ErrorResponse::fatal(self.sqlstate(), self.to_string()),
        };
        resp.to_bytes()
    }
}
