//! The server side of SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL
//! speaks it, without channel binding.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use super::{ct_eq, AuthError};

/// The SASL mechanism name.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";
/// PostgreSQL's default iteration count for new verifiers.
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// Length of a freshly generated salt, as PostgreSQL uses.
const SALT_LEN: usize = 16;
/// Random bytes in the server's part of the nonce, as PostgreSQL uses.
const SERVER_NONCE_LEN: usize = 18;

type HmacSha256 = Hmac<Sha256>;

pub(super) fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// PBKDF2-HMAC-SHA-256 with one output block, SCRAM's `Hi()`.
fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut prev = hmac(password, &[salt, &[0, 0, 0, 1]]);
    let mut out = prev;
    for _ in 1..iterations {
        prev = hmac(password, &[&prev]);
        for (o, p) in out.iter_mut().zip(prev) {
            *o ^= p;
        }
    }
    out
}

/// SASLprep the password when possible; PostgreSQL uses the raw bytes when
/// the password is not UTF-8 or contains prohibited characters.
fn normalize(password: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(password) {
        Ok(s) => match stringprep::saslprep(s) {
            Ok(p) => p.into_owned().into_bytes(),
            Err(_) => password.to_vec(),
        },
        Err(_) => password.to_vec(),
    }
}

/// What the server stores to check SCRAM-SHA-256 logins, in PostgreSQL's
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` format.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    /// PBKDF2 iteration count.
    pub iterations: u32,
    /// Salt.
    pub salt: Vec<u8>,
    /// `H(HMAC(SaltedPassword, "Client Key"))`.
    pub stored_key: [u8; 32],
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: [u8; 32],
}

impl fmt::Debug for ScramVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramVerifier")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramVerifier {
    /// Derives a verifier from a password, a salt and an iteration count
    /// (an iteration count of 0 is treated as 1).
    pub fn from_password(password: impl AsRef<[u8]>, salt: &[u8], iterations: u32) -> Self {
        let iterations = iterations.max(1);
        let salted = hi(&normalize(password.as_ref()), salt, iterations);
        let client_key = hmac(&salted, &[b"Client Key"]);
        ScramVerifier {
            iterations,
            salt: salt.to_vec(),
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, &[b"Server Key"]),
        }
    }

    /// Derives a verifier with a random 16-byte salt and
    /// [`DEFAULT_ITERATIONS`], as `CREATE ROLE ... PASSWORD` does.
    pub fn generate(password: impl AsRef<[u8]>) -> Self {
        let mut salt = [0u8; SALT_LEN];
        rand::Rng::fill(&mut rand::rng(), &mut salt[..]);
        Self::from_password(password, &salt, DEFAULT_ITERATIONS)
    }

    /// A verifier for a role that does not exist, so that an unknown user
    /// goes through the same exchange as a known one and fails only at the
    /// proof, as PostgreSQL does; the client cannot tell which users exist.
    /// `secret` should be random and fixed for the life of the process: the
    /// salt it yields for a given user name is then stable, as a real one
    /// would be. No password can satisfy the verifier.
    pub fn mock(user: &str, secret: &[u8]) -> Self {
        let derive = |label: &[u8]| hmac(secret, &[label, user.as_bytes()]);
        ScramVerifier {
            iterations: DEFAULT_ITERATIONS,
            salt: derive(b"mock salt")[..SALT_LEN].to_vec(),
            stored_key: derive(b"mock stored key"),
            server_key: derive(b"mock server key"),
        }
    }

    /// Parses PostgreSQL's stored format.
    pub fn parse(s: &str) -> Result<Self, AuthError> {
        let bad = |why: &str| AuthError::InvalidVerifier(why.to_owned());
        let rest = s
            .strip_prefix("SCRAM-SHA-256$")
            .ok_or_else(|| bad("does not start with SCRAM-SHA-256$"))?;
        let (params, keys) = rest
            .split_once('$')
            .ok_or_else(|| bad("expected <iterations>:<salt>$<StoredKey>:<ServerKey>"))?;
        let (iter, salt) = params
            .split_once(':')
            .ok_or_else(|| bad("expected <iterations>:<salt>"))?;
        let (stored, server) = keys
            .split_once(':')
            .ok_or_else(|| bad("expected <StoredKey>:<ServerKey>"))?;
        let iterations: u32 = iter
            .parse()
            .map_err(|_| bad("iteration count is not a number"))?;
        if iterations == 0 {
            return Err(bad("iteration count is zero"));
        }
        let salt = STANDARD
            .decode(salt)
            .map_err(|_| bad("salt is not valid base64"))?;
        if salt.is_empty() {
            return Err(bad("salt is empty"));
        }
        let key = |b64: &str, what: &str| -> Result<[u8; 32], AuthError> {
            let raw = STANDARD
                .decode(b64)
                .map_err(|_| bad(&format!("{what} is not valid base64")))?;
            <[u8; 32]>::try_from(raw.as_slice())
                .map_err(|_| bad(&format!("{what} is not 32 bytes long")))
        };
        Ok(ScramVerifier {
            iterations,
            salt,
            stored_key: key(stored, "StoredKey")?,
            server_key: key(server, "ServerKey")?,
        })
    }
}

impl FromStr for ScramVerifier {
    type Err = AuthError;

    fn from_str(s: &str) -> Result<Self, AuthError> {
        Self::parse(s)
    }
}

impl fmt::Display for ScramVerifier {
    /// Renders the verifier in PostgreSQL's stored format.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            STANDARD.encode(&self.salt),
            STANDARD.encode(self.stored_key),
            STANDARD.encode(self.server_key)
        )
    }
}

/// Where a [`ScramServer`] exchange stands.
enum State {
    AwaitingClientFirst,
    AwaitingClientFinal {
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
    },
    Done,
    Failed,
}

/// The server side of one SCRAM-SHA-256 exchange.
///
/// Feed it the client's SASLInitialResponse data with
/// [`client_first`](Self::client_first), send the result in
/// AuthenticationSASLContinue; feed the SASLResponse data to
/// [`client_final`](Self::client_final) and send the result in
/// AuthenticationSASLFinal followed by AuthenticationOk. Any error ends the
/// exchange.
pub struct ScramServer {
    verifier: ScramVerifier,
    server_nonce: String,
    state: State,
    /// The ClientKey the client proved it has, once the exchange is done.
    client_key: Option<[u8; 32]>,
}

impl ScramServer {
    /// Starts an exchange for `verifier`, drawing the server nonce from
    /// `rng` (which must be cryptographically secure, e.g. `rand::rng()`).
    pub fn new<R: rand::Rng + ?Sized>(verifier: ScramVerifier, rng: &mut R) -> Self {
        let mut raw = [0u8; SERVER_NONCE_LEN];
        rng.fill(&mut raw[..]);
        ScramServer {
            verifier,
            server_nonce: STANDARD.encode(raw),
            state: State::AwaitingClientFirst,
            client_key: None,
        }
    }

    /// After a successful exchange, the keys that let pgfresh log in to a server
    /// storing the same verifier without the password (SCRAM pass-through): the
    /// ClientKey recovered from the client's proof, and the verifier's ServerKey.
    pub fn passthrough_keys(&self) -> Option<super::ScramKeys> {
        self.client_key.map(|client_key| super::ScramKeys {
            client_key,
            server_key: self.verifier.server_key,
        })
    }

    /// Whether the exchange completed successfully.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Handles the client-first-message; returns the server-first-message.
    pub fn client_first(&mut self, mechanism: &str, data: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::AwaitingClientFirst) {
            self.state = State::Failed;
            return Err(AuthError::OutOfOrder("client-first-message sent twice"));
        }
        self.state = State::Failed;
        if mechanism != SCRAM_SHA_256 {
            return Err(AuthError::UnsupportedMechanism(mechanism.to_owned()));
        }
        let msg = std::str::from_utf8(data)
            .map_err(|_| AuthError::Malformed("client-first-message is not UTF-8".into()))?;
        let (gs2_header, bare) = split_gs2_header(msg)?;
        let client_nonce = parse_client_first_bare(bare)?;
        let nonce = format!("{client_nonce}{}", self.server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            STANDARD.encode(&self.verifier.salt),
            self.verifier.iterations
        );
        let reply = server_first.clone().into_bytes();
        self.state = State::AwaitingClientFinal {
            gs2_header: gs2_header.to_owned(),
            client_first_bare: bare.to_owned(),
            server_first,
            nonce,
        };
        Ok(reply)
    }

    /// Handles the client-final-message; returns the server-final-message
    /// (`v=<ServerSignature>`) when the client's proof is right.
    pub fn client_final(&mut self, data: &[u8]) -> Result<Vec<u8>, AuthError> {
        let State::AwaitingClientFinal {
            gs2_header,
            client_first_bare,
            server_first,
            nonce,
        } = std::mem::replace(&mut self.state, State::Failed)
        else {
            return Err(AuthError::OutOfOrder(
                "client-final-message before client-first-message",
            ));
        };
        let msg = std::str::from_utf8(data)
            .map_err(|_| AuthError::Malformed("client-final-message is not UTF-8".into()))?;
        let (without_proof, proof_b64) = msg
            .rsplit_once(",p=")
            .ok_or_else(|| AuthError::Malformed("proof attribute missing".into()))?;
        let mut attrs = without_proof.split(',');
        let cbind = attrs
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .ok_or_else(|| AuthError::Malformed("channel binding attribute expected".into()))?;
        let client_nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or_else(|| AuthError::Malformed("nonce attribute expected".into()))?;
        for ext in attrs {
            if !is_attribute(ext) {
                return Err(AuthError::Malformed(format!("invalid attribute \"{ext}\"")));
            }
        }
        let cbind = STANDARD
            .decode(cbind)
            .map_err(|_| AuthError::Malformed("channel binding is not valid base64".into()))?;
        if cbind != gs2_header.as_bytes() {
            return Err(AuthError::ChannelBindingMismatch);
        }
        if !ct_eq(client_nonce.as_bytes(), nonce.as_bytes()) {
            return Err(AuthError::NonceMismatch);
        }
        let proof = STANDARD
            .decode(proof_b64)
            .map_err(|_| AuthError::Malformed("proof is not valid base64".into()))?;
        let proof = <[u8; 32]>::try_from(proof.as_slice())
            .map_err(|_| AuthError::Malformed("proof is not 32 bytes long".into()))?;

        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature = hmac(&self.verifier.stored_key, &[auth_message.as_bytes()]);
        let mut client_key = proof;
        for (k, s) in client_key.iter_mut().zip(client_signature) {
            *k ^= s;
        }
        let computed: [u8; 32] = Sha256::digest(client_key).into();
        if !ct_eq(&computed, &self.verifier.stored_key) {
            return Err(AuthError::InvalidProof);
        }
        let server_signature = hmac(&self.verifier.server_key, &[auth_message.as_bytes()]);
        self.client_key = Some(client_key);
        self.state = State::Done;
        Ok(format!("v={}", STANDARD.encode(server_signature)).into_bytes())
    }
}

/// Splits `gs2-header` (`n,,` / `y,,`) from `client-first-message-bare`.
fn split_gs2_header(msg: &str) -> Result<(&str, &str), AuthError> {
    let after_flag = match msg.as_bytes().first() {
        Some(b'n' | b'y') => &msg[1..],
        Some(b'p') => return Err(AuthError::ChannelBindingNotSupported),
        _ => {
            return Err(AuthError::Malformed(
                "unexpected channel-binding flag".into(),
            ))
        }
    };
    let after_comma = after_flag
        .strip_prefix(',')
        .ok_or_else(|| AuthError::Malformed("comma expected after channel-binding flag".into()))?;
    if after_comma.starts_with("a=") {
        return Err(AuthError::Malformed(
            "client uses authorization identity, but it is not supported".into(),
        ));
    }
    let bare = after_comma
        .strip_prefix(',')
        .ok_or_else(|| AuthError::Malformed("unexpected attribute in GS2 header".into()))?;
    Ok((&msg[..msg.len() - bare.len()], bare))
}

/// Parses `client-first-message-bare` and returns the client nonce.
fn parse_client_first_bare(bare: &str) -> Result<&str, AuthError> {
    let mut attrs = bare.split(',');
    let user = attrs.next().unwrap_or_default();
    if user.starts_with("m=") {
        return Err(AuthError::Malformed(
            "client requires an unsupported SCRAM extension".into(),
        ));
    }
    if !user.starts_with("n=") {
        return Err(AuthError::Malformed("user name attribute expected".into()));
    }
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or_else(|| AuthError::Malformed("nonce attribute expected".into()))?;
    if nonce.is_empty()
        || !nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(AuthError::Malformed(
            "nonce must be non-empty printable ASCII".into(),
        ));
    }
    for ext in attrs {
        if !is_attribute(ext) {
            return Err(AuthError::Malformed(format!("invalid attribute \"{ext}\"")));
        }
    }
    Ok(nonce)
}

/// `attr-val`: one ASCII letter, `=`, value.
fn is_attribute(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b'='
}

#[cfg(test)]
#[path = "scram_tests.rs"]
mod tests;
