//! TLS from pgfresh to PostgreSQL nodes, with PgBouncer's names and meanings
//! (`server_tls_sslmode`, `server_tls_ca_file`, `server_tls_cert_file`,
//! `server_tls_key_file`).
//!
//! * [`Settings`] says what a node asks for; [`Settings::client_config`] turns it into a
//!   rustls client configuration, kept per settings and rebuilt when a file changes on
//!   disk (a file that no longer loads is reported and the last good configuration
//!   stays).
//! * [`connect`] negotiates TLS on a fresh TCP connection (SSLRequest, exactly one byte of
//!   answer, then the handshake) and gives the relay a [`ServerStream`] it can drive
//!   without blocking, plain or encrypted alike.
//! * [`pg::connect`] does the same for pgfresh's own tokio-postgres connections (the
//!   monitor, the catalog reader, `auth_query`) and tells whether TLS was used.
//!
//! | mode | TLS | certificate chain | host name |
//! |---|---|---|---|
//! | `disable` | never | – | – |
//! | `prefer` (default) | when the node offers it | not checked | not checked |
//! | `require` | always | not checked | not checked |
//! | `verify-ca` | always | must chain to `server_tls_ca_file` | not checked |
//! | `verify-full` | always | must chain to `server_tls_ca_file` | must match the node's `host` |

mod load;
pub mod pg;
mod stream;
mod tcp;
mod verify;

use std::sync::Arc;

pub use load::certs;
pub use stream::{connect, ServerStream};
pub use tcp::Tcp;

/// `server_tls_sslmode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    /// The mode's name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Prefer => "prefer",
            Mode::Require => "require",
            Mode::VerifyCa => "verify-ca",
            Mode::VerifyFull => "verify-full",
        }
    }

    /// A node that does not offer TLS is refused.
    pub fn requires_tls(self) -> bool {
        matches!(self, Mode::Require | Mode::VerifyCa | Mode::VerifyFull)
    }

    /// The node's certificate must chain to the configured CA.
    pub fn verifies(self) -> bool {
        matches!(self, Mode::VerifyCa | Mode::VerifyFull)
    }
}

/// What TLS toward one node is asked to be. Paths are read as given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Settings {
    pub mode: Mode,
    /// CA certificates (PEM) the node's certificate must chain to (verify modes).
    pub ca_file: String,
    /// A client certificate chain (PEM) to present to the node; empty for none.
    pub cert_file: String,
    /// Its private key (PEM).
    pub key_file: String,
}

impl Settings {
    /// What is missing or contradictory, without reading any file.
    pub fn check(&self) -> Result<(), String> {
        if self.mode.verifies() && self.ca_file.is_empty() {
            return Err(format!(
                "server_tls_sslmode = {} needs server_tls_ca_file (the CA the node's certificate chains to)",
                self.mode.as_str()
            ));
        }
        if self.cert_file.is_empty() != self.key_file.is_empty() {
            return Err(
                "server_tls_cert_file and server_tls_key_file go together: give both or neither"
                    .into(),
            );
        }
        Ok(())
    }

    /// The rustls configuration for these settings, `None` with `disable`. Built on first
    /// use and again whenever one of the files changes; when a changed file does not
    /// load, the error is logged once and the last good configuration is returned (an
    /// error only when there never was one).
    pub fn client_config(&self) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
        if self.mode == Mode::Disable {
            return Ok(None);
        }
        load::cached(self).map(Some)
    }
}
