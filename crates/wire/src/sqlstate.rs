//! SQLSTATE codes used by the proxy.
//!
//! Standard PostgreSQL codes keep their PostgreSQL names (upper-cased).
//! Codes in the `PF` class are pgfresh's own; clients see them like any
//! other SQLSTATE in an ErrorResponse.

/// `00000` successful_completion.
pub const SUCCESSFUL_COMPLETION: &str = "00000";
/// `08000` connection_exception.
pub const CONNECTION_EXCEPTION: &str = "08000";
/// `08001` sqlclient_unable_to_establish_sqlconnection.
pub const SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION: &str = "08001";
/// `08006` connection_failure.
pub const CONNECTION_FAILURE: &str = "08006";
/// `08007` transaction_resolution_unknown.
pub const TRANSACTION_RESOLUTION_UNKNOWN: &str = "08007";
/// `08P01` protocol_violation.
pub const PROTOCOL_VIOLATION: &str = "08P01";
/// `0A000` feature_not_supported.
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
/// `22023` invalid_parameter_value.
pub const INVALID_PARAMETER_VALUE: &str = "22023";
/// `25006` read_only_sql_transaction.
pub const READ_ONLY_SQL_TRANSACTION: &str = "25006";
/// `25P02` in_failed_sql_transaction.
pub const IN_FAILED_SQL_TRANSACTION: &str = "25P02";
/// `25P03` idle_in_transaction_session_timeout.
pub const IDLE_IN_TRANSACTION_SESSION_TIMEOUT: &str = "25P03";
/// `26000` invalid_sql_statement_name.
pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
/// `28000` invalid_authorization_specification.
pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
/// `28P01` invalid_password.
pub const INVALID_PASSWORD: &str = "28P01";
/// `34000` invalid_cursor_name.
pub const INVALID_CURSOR_NAME: &str = "34000";
/// `3D000` invalid_catalog_name (unknown database).
pub const INVALID_CATALOG_NAME: &str = "3D000";
/// `40000` transaction_rollback.
pub const TRANSACTION_ROLLBACK: &str = "40000";
/// `40001` serialization_failure.
pub const SERIALIZATION_FAILURE: &str = "40001";
/// `40P01` deadlock_detected.
pub const DEADLOCK_DETECTED: &str = "40P01";
/// `42601` syntax_error.
pub const SYNTAX_ERROR: &str = "42601";
/// `42P05` duplicate_prepared_statement.
pub const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";
/// `53300` too_many_connections.
pub const TOO_MANY_CONNECTIONS: &str = "53300";
/// `53400` configuration_limit_exceeded.
pub const CONFIGURATION_LIMIT_EXCEEDED: &str = "53400";
/// `55000` object_not_in_prerequisite_state.
pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
/// `57014` query_canceled.
pub const QUERY_CANCELED: &str = "57014";
/// `57P01` admin_shutdown.
pub const ADMIN_SHUTDOWN: &str = "57P01";
/// `57P02` crash_shutdown.
pub const CRASH_SHUTDOWN: &str = "57P02";
/// `57P03` cannot_connect_now.
pub const CANNOT_CONNECT_NOW: &str = "57P03";
/// `57P05` idle_session_timeout.
pub const IDLE_SESSION_TIMEOUT: &str = "57P05";
/// `XX000` internal_error.
pub const INTERNAL_ERROR: &str = "XX000";
/// `PF001` (pgfresh): no replica has caught up with the position this
/// session must read at, and the session's policy forbids falling back to
/// the primary.
pub const REPLICA_NOT_CAUGHT_UP: &str = "PF001";
/// `PF002` (pgfresh): no node is available to serve the statement.
pub const NO_NODE_AVAILABLE: &str = "PF002";

/// Whether `code` has the shape of a SQLSTATE: five characters, each an
/// ASCII digit or upper-case letter.
pub fn is_valid(code: &str) -> bool {
    code.len() == 5
        && code
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
}

/// The two-character class of a SQLSTATE (`"28"` for `28P01`), or `None`
/// when `code` is not a valid SQLSTATE.
pub fn class(code: &str) -> Option<&str> {
    is_valid(code).then(|| &code[..2])
}
