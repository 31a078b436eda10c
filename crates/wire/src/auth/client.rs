//! The client side of SCRAM-SHA-256, used when pgfresh logs in to a
//! PostgreSQL server. A thin state-checked wrapper around the
//! `postgres-protocol` crate's implementation.

use bytes::Bytes;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};

use super::scram::SCRAM_SHA_256;
use super::AuthError;

enum Step {
    /// client-first-message produced, waiting for server-first-message.
    Started,
    /// client-final-message produced, waiting for server-final-message.
    Continued,
    /// The server's signature was verified.
    Done,
    /// The exchange failed; nothing more can be sent.
    Failed,
}

/// One SCRAM-SHA-256 login to a server, without channel binding.
///
/// 1. send [`initial_response`](Self::initial_response) (a complete
///    SASLInitialResponse frame) after AuthenticationSASL;
/// 2. pass the AuthenticationSASLContinue data to [`update`](Self::update)
///    and send its result with [`crate::build::sasl_response`];
/// 3. pass the AuthenticationSASLFinal data to [`finish`](Self::finish).
pub struct ScramClient {
    inner: ScramSha256,
    first: Vec<u8>,
    step: Step,
}

impl ScramClient {
    /// Starts an exchange with `password`.
    pub fn new(password: impl AsRef<[u8]>) -> Self {
        let inner = ScramSha256::new(password.as_ref(), ChannelBinding::unsupported());
        let first = inner.message().to_vec();
        ScramClient {
            inner,
            first,
            step: Step::Started,
        }
    }

    /// The mechanism name to announce.
    pub fn mechanism(&self) -> &'static str {
        SCRAM_SHA_256
    }

    /// The client-first-message.
    pub fn initial_message(&self) -> &[u8] {
        &self.first
    }

    /// The complete SASLInitialResponse frame.
    pub fn initial_response(&self) -> Bytes {
        crate::build::sasl_initial_response(SCRAM_SHA_256, &self.first)
    }

    /// Handles the server-first-message; returns the client-final-message.
    pub fn update(&mut self, server_first: &[u8]) -> Result<&[u8], AuthError> {
        if !matches!(self.step, Step::Started) {
            self.step = Step::Failed;
            return Err(AuthError::OutOfOrder(
                "server-first-message not expected now",
            ));
        }
        self.step = Step::Failed;
        self.inner
            .update(server_first)
            .map_err(|e| AuthError::Server(e.to_string()))?;
        self.step = Step::Continued;
        Ok(self.inner.message())
    }

    /// Verifies the server-final-message; the login succeeded only if this
    /// returns `Ok`.
    pub fn finish(&mut self, server_final: &[u8]) -> Result<(), AuthError> {
        if !matches!(self.step, Step::Continued) {
            self.step = Step::Failed;
            return Err(AuthError::OutOfOrder(
                "server-final-message not expected now",
            ));
        }
        self.step = Step::Failed;
        self.inner
            .finish(server_final)
            .map_err(|e| AuthError::Server(e.to_string()))?;
        self.step = Step::Done;
        Ok(())
    }

    /// Whether the server proved it knows the password.
    pub fn is_done(&self) -> bool {
        matches!(self.step, Step::Done)
    }
}
