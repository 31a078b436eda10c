//! Authentication exchanges, on both sides of the proxy.
//!
//! * Clients authenticating to pgfresh: [`ScramServer`] runs the server side
//!   of SCRAM-SHA-256 against a [`ScramVerifier`] (stored in PostgreSQL's
//!   `SCRAM-SHA-256$...` format or derived from a plain password);
//!   [`md5_verify`] and [`md5_verify_password`] check an md5 response.
//! * pgfresh authenticating to PostgreSQL: [`ClientLogin`] answers what the server
//!   asks for, with [`ScramClient`] (a wrapper of the `postgres-protocol` crate's client
//!   side), [`ScramPassthrough`] or [`md5_password_hash`].
//!
//! Secrets are compared in constant time.

mod client;
mod login;
mod passthrough;
mod scram;

pub use client::ScramClient;
pub use login::{ClientLogin, LoginError, LoginStep, Secret};
pub use passthrough::{ScramKeys, ScramPassthrough};
pub use scram::{ScramServer, ScramVerifier, DEFAULT_ITERATIONS, SCRAM_SHA_256};

use md5::{Digest, Md5};

use crate::cursor::Cursor;
use crate::framing::FrameError;
use crate::sqlstate;

/// Why an authentication exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The client chose a SASL mechanism other than SCRAM-SHA-256.
    #[error("client selected an invalid SASL authentication mechanism \"{0}\"")]
    UnsupportedMechanism(String),
    /// The client requires channel binding, which is not offered.
    #[error("channel binding is not supported")]
    ChannelBindingNotSupported,
    /// A SCRAM message does not follow the grammar.
    #[error("malformed SCRAM message: {0}")]
    Malformed(String),
    /// The nonce in client-final-message is not the one negotiated.
    #[error("SCRAM nonce mismatch")]
    NonceMismatch,
    /// The channel binding attribute does not repeat the GS2 header.
    #[error("SCRAM channel binding check failed")]
    ChannelBindingMismatch,
    /// The client's proof is wrong: wrong password.
    #[error("password authentication failed")]
    InvalidProof,
    /// A message arrived in a state that does not expect it.
    #[error("unexpected SCRAM message: {0}")]
    OutOfOrder(&'static str),
    /// A stored SCRAM verifier could not be parsed.
    #[error("invalid SCRAM verifier: {0}")]
    InvalidVerifier(String),
    /// The server's SCRAM messages were rejected (client side).
    #[error("server SCRAM exchange failed: {0}")]
    Server(String),
}

impl AuthError {
    /// The SQLSTATE to report to a client: `28P01` for a wrong password,
    /// `28000` for an unusable stored verifier, `08P01` otherwise.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            AuthError::InvalidProof => sqlstate::INVALID_PASSWORD,
            AuthError::InvalidVerifier(_) => sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            AuthError::Server(_) => sqlstate::CONNECTION_FAILURE,
            _ => sqlstate::PROTOCOL_VIOLATION,
        }
    }
}

/// Splits a SASLInitialResponse body into the mechanism name and the
/// initial client data (empty when the client sent length -1).
pub fn parse_sasl_initial_response(body: &[u8]) -> Result<(&str, &[u8]), FrameError> {
    let mut cur = Cursor::new(b'p', body);
    let mechanism = cur.cstr("SASL mechanism")?;
    let len = cur.i32("SASL data length")?;
    let data = match len {
        -1 => &[][..],
        n if n < 0 => return Err(cur.malformed(format!("SASL data length {n} is negative"))),
        n => cur.bytes(n as usize, "SASL data")?,
    };
    cur.finish()?;
    Ok((mechanism, data))
}

/// The password carried by a PasswordMessage body (cleartext or md5 hash),
/// without its NUL terminator.
pub fn parse_password_message(body: &[u8]) -> Result<&str, FrameError> {
    let mut cur = Cursor::new(b'p', body);
    let password = cur.cstr("password")?;
    cur.finish()?;
    Ok(password)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The answer to an md5 challenge: `"md5" + md5(md5(password + user) + salt)`
/// in lower-case hex.
pub fn md5_password_hash(user: &str, password: &str, salt: [u8; 4]) -> String {
    postgres_protocol::authentication::md5_hash(user.as_bytes(), password.as_bytes(), salt)
}

/// The md5 secret PostgreSQL stores for a role: `"md5" + md5(password + user)`.
pub fn md5_stored_hash(user: &str, password: &str) -> String {
    postgres_protocol::password::md5(password.as_bytes(), user)
}

/// Checks a client's md5 `response` (with or without its NUL terminator)
/// against a stored md5 secret (`"md5"` + 32 hex digits) and the `salt` sent
/// in the challenge. Returns `false` for a malformed secret.
pub fn md5_verify(stored: &str, salt: [u8; 4], response: &[u8]) -> bool {
    md5_response_from_stored(stored, salt)
        .is_some_and(|expected| ct_eq(expected.as_bytes(), strip_nul(response)))
}

/// The answer to an md5 challenge from a stored md5 secret (`"md5"` + 32 hex digits)
/// instead of the password: `"md5" + md5(hex + salt)`. `None` for a malformed secret.
pub fn md5_response_from_stored(stored: &str, salt: [u8; 4]) -> Option<String> {
    if !is_md5_secret(stored) {
        return None;
    }
    let inner = &stored[3..];
    let mut md5 = Md5::new();
    md5.update(inner.to_ascii_lowercase().as_bytes());
    md5.update(salt);
    Some(format!("md5{}", hex(&md5.finalize())))
}

/// `s` has the form of a stored md5 secret: `"md5"` and 32 hex digits.
pub fn is_md5_secret(s: &str) -> bool {
    s.strip_prefix("md5")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Checks a client's md5 `response` against a plain password.
pub fn md5_verify_password(user: &str, password: &str, salt: [u8; 4], response: &[u8]) -> bool {
    ct_eq(
        md5_password_hash(user, password, salt).as_bytes(),
        strip_nul(response),
    )
}

fn strip_nul(b: &[u8]) -> &[u8] {
    b.strip_suffix(&[0]).unwrap_or(b)
}

/// Compares two byte strings in time that depends only on their lengths.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_md5_answer_from_the_stored_hash_is_the_answer_from_the_password() {
        let salt = [1, 2, 3, 4];
        let stored = md5_stored_hash("alice", "secret");
        assert_eq!(
            md5_response_from_stored(&stored, salt).unwrap(),
            md5_password_hash("alice", "secret", salt)
        );
        assert!(md5_response_from_stored("md5short", salt).is_none());
        assert!(md5_response_from_stored("plain", salt).is_none());
    }

    use super::*;

    #[test]
    fn md5_matches_postgres_reference_value() {
        // Reference value from the postgres-protocol test suite.
        let salt = [0x2a, 0x3d, 0x8f, 0xe0];
        let hash = md5_password_hash("md5_user", "password", salt);
        assert_eq!(hash, "md562af4dd09bbb41884907a838a3233294");
        assert!(md5_verify_password(
            "md5_user",
            "password",
            salt,
            hash.as_bytes()
        ));
        let stored = md5_stored_hash("md5_user", "password");
        assert!(md5_verify(&stored, salt, hash.as_bytes()));
        let mut with_nul = hash.clone().into_bytes();
        with_nul.push(0);
        assert!(md5_verify(&stored, salt, &with_nul));
        assert!(md5_verify(
            &stored.to_uppercase().replacen("MD5", "md5", 1),
            salt,
            hash.as_bytes()
        ));
    }

    #[test]
    fn md5_rejects_wrong_answers() {
        let salt = [1, 2, 3, 4];
        let stored = md5_stored_hash("alice", "secret");
        let good = md5_password_hash("alice", "secret", salt);
        assert!(md5_verify(&stored, salt, good.as_bytes()));
        assert!(!md5_verify(&stored, [1, 2, 3, 5], good.as_bytes()));
        let wrong = md5_password_hash("alice", "Secret", salt);
        assert!(!md5_verify(&stored, salt, wrong.as_bytes()));
        assert!(!md5_verify_password(
            "alice",
            "secret",
            salt,
            wrong.as_bytes()
        ));
        assert!(!md5_verify(&stored, salt, b""));
        assert!(!md5_verify("md5short", salt, good.as_bytes()));
        assert!(!md5_verify(
            "plaintext-secret-not-md5-hash-xx",
            salt,
            good.as_bytes()
        ));
        assert!(!md5_verify(
            &format!("md5{}", "z".repeat(32)),
            salt,
            good.as_bytes()
        ));
    }

    #[test]
    fn sasl_initial_response_layouts() {
        let ok = [&b"SCRAM-SHA-256\0"[..], &3i32.to_be_bytes(), b"abc"].concat();
        assert_eq!(
            parse_sasl_initial_response(&ok).unwrap(),
            ("SCRAM-SHA-256", &b"abc"[..])
        );
        let none = [&b"SCRAM-SHA-256\0"[..], &(-1i32).to_be_bytes()].concat();
        assert_eq!(parse_sasl_initial_response(&none).unwrap().1, b"");
        let bad: [&[u8]; 5] = [
            b"SCRAM-SHA-256",
            b"SCRAM-SHA-256\0\0\0",
            &[&b"M\0"[..], &(-2i32).to_be_bytes()].concat(),
            &[&b"M\0"[..], &4i32.to_be_bytes(), b"abc"].concat(),
            &[&b"M\0"[..], &2i32.to_be_bytes(), b"abc"].concat(),
        ];
        for body in bad {
            assert!(
                matches!(
                    parse_sasl_initial_response(body),
                    Err(FrameError::Malformed { tag: b'p', .. })
                ),
                "{body:?}"
            );
        }
    }

    #[test]
    fn password_message_body() {
        assert_eq!(parse_password_message(b"pw\0").unwrap(), "pw");
        assert!(parse_password_message(b"pw").is_err());
        assert!(parse_password_message(b"pw\0x").is_err());
        assert!(parse_password_message(b"\xff\0").is_err());
    }

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"", b""));
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
