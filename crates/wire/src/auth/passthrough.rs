//! The client side of SCRAM-SHA-256 from keys instead of a password (SCRAM
//! pass-through, as PgBouncer does it). A client logging in to pgfresh proves it holds
//! the ClientKey of a stored verifier ([`super::ScramServer::passthrough_keys`]
//! recovers it from the proof); with that key and the verifier's ServerKey, pgfresh can
//! log in to a server that stores the same verifier, never knowing the password.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha256};

use super::scram::{hmac, SCRAM_SHA_256};
use super::{ct_eq, AuthError};

/// What a pass-through login needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ScramKeys {
    pub client_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl std::fmt::Debug for ScramKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScramKeys(<redacted>)")
    }
}

enum Step {
    Started,
    /// client-final-message sent; the AuthMessage the server must sign.
    Continued {
        auth_message: String,
    },
    Done,
    Failed,
}

/// One SCRAM-SHA-256 login to a server with [`ScramKeys`], without channel binding.
pub struct ScramPassthrough {
    keys: ScramKeys,
    nonce: String,
    step: Step,
}

impl ScramPassthrough {
    pub fn new(keys: ScramKeys) -> Self {
        let mut raw = [0u8; 18];
        rand::Rng::fill(&mut rand::rng(), &mut raw[..]);
        ScramPassthrough {
            keys,
            nonce: STANDARD.encode(raw),
            step: Step::Started,
        }
    }

    pub fn mechanism(&self) -> &'static str {
        SCRAM_SHA_256
    }

    fn first_bare(&self) -> String {
        format!("n=,r={}", self.nonce)
    }

    /// The client-first-message.
    pub fn initial_message(&self) -> Vec<u8> {
        format!("n,,{}", self.first_bare()).into_bytes()
    }

    /// Handles the server-first-message; returns the client-final-message.
    pub fn update(&mut self, server_first: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.step, Step::Started) {
            self.step = Step::Failed;
            return Err(AuthError::OutOfOrder(
                "server-first-message not expected now",
            ));
        }
        self.step = Step::Failed;
        let msg = std::str::from_utf8(server_first)
            .map_err(|_| AuthError::Server("server-first-message is not UTF-8".into()))?;
        let nonce = msg
            .split(',')
            .find_map(|a| a.strip_prefix("r="))
            .ok_or_else(|| AuthError::Server("server-first-message has no nonce".into()))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(AuthError::NonceMismatch);
        }
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{msg},{without_proof}", self.first_bare());
        let stored_key: [u8; 32] = Sha256::digest(self.keys.client_key).into();
        let signature = hmac(&stored_key, &[auth_message.as_bytes()]);
        let mut proof = self.keys.client_key;
        for (p, s) in proof.iter_mut().zip(signature) {
            *p ^= s;
        }
        self.step = Step::Continued { auth_message };
        Ok(format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes())
    }

    /// Checks the server-final-message: the server knows the ServerKey too.
    pub fn finish(&mut self, server_final: &[u8]) -> Result<(), AuthError> {
        let Step::Continued { auth_message } = std::mem::replace(&mut self.step, Step::Failed)
        else {
            return Err(AuthError::OutOfOrder(
                "server-final-message not expected now",
            ));
        };
        let msg = std::str::from_utf8(server_final)
            .map_err(|_| AuthError::Server("server-final-message is not UTF-8".into()))?;
        let signature = msg
            .strip_prefix("v=")
            .and_then(|v| STANDARD.decode(v).ok())
            .ok_or_else(|| AuthError::Server(format!("unexpected server-final-message {msg:?}")))?;
        let expected = hmac(&self.keys.server_key, &[auth_message.as_bytes()]);
        if !ct_eq(&signature, &expected) {
            return Err(AuthError::Server(
                "the server's signature does not match".into(),
            ));
        }
        self.step = Step::Done;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{ScramClient, ScramServer, ScramVerifier};

    /// A password login to a server holding `verifier`; the keys it yields.
    fn keys_from_a_login(verifier: &ScramVerifier, password: &str) -> ScramKeys {
        let mut server = ScramServer::new(verifier.clone(), &mut rand::rng());
        let mut client = ScramClient::new(password);
        let first = server
            .client_first(SCRAM_SHA_256, client.initial_message())
            .unwrap();
        let last = client.update(&first).unwrap().to_vec();
        let fin = server.client_final(&last).unwrap();
        client.finish(&fin).unwrap();
        server
            .passthrough_keys()
            .expect("keys after a successful login")
    }

    /// Log in to a server holding `verifier` with `keys`.
    fn passthrough(verifier: &ScramVerifier, keys: ScramKeys) -> Result<(), AuthError> {
        let mut server = ScramServer::new(verifier.clone(), &mut rand::rng());
        let mut client = ScramPassthrough::new(keys);
        let first = server.client_first(SCRAM_SHA_256, &client.initial_message())?;
        let last = client.update(&first)?;
        let fin = server.client_final(&last)?;
        client.finish(&fin)
    }

    #[test]
    fn keys_from_one_login_open_another_without_the_password() {
        let verifier = ScramVerifier::from_password("secret", b"0123456789abcdef", 4096);
        let keys = keys_from_a_login(&verifier, "secret");
        passthrough(&verifier, keys).unwrap();
        // Another salt (another verifier of the same password): the proof is refused.
        let other = ScramVerifier::from_password("secret", b"fedcba9876543210", 4096);
        assert!(matches!(
            passthrough(&other, keys),
            Err(AuthError::InvalidProof)
        ));
        // A wrong ServerKey: the server's signature is refused.
        let mut wrong = keys;
        wrong.server_key[0] ^= 1;
        assert!(passthrough(&verifier, wrong).is_err());
    }

    #[test]
    fn no_keys_after_a_failed_login() {
        let verifier = ScramVerifier::from_password("secret", b"0123456789abcdef", 4096);
        let mut server = ScramServer::new(verifier, &mut rand::rng());
        let mut client = ScramClient::new("wrong");
        let first = server
            .client_first(SCRAM_SHA_256, client.initial_message())
            .unwrap();
        let last = client.update(&first).unwrap().to_vec();
        assert!(server.client_final(&last).is_err());
        assert!(server.passthrough_keys().is_none());
    }
}
