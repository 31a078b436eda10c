//! pgfresh's login to a PostgreSQL server, without I/O: the caller sends the
//! StartupMessage, then hands [`ClientLogin::on_message`] each message the server sends
//! and does what the returned [`LoginStep`] says, up to the server's first
//! ReadyForQuery. Every connection pgfresh opens to a node logs in this way (the
//! sessions' server connections and the monitor's poll connections), so the methods it
//! answers and the errors it gives are the same everywhere.

use bytes::Bytes;

use super::{md5_password_hash, md5_response_from_stored, ScramClient, ScramKeys};
use super::{ScramPassthrough, SCRAM_SHA_256};
use crate::backend::{Auth, BackendMessage, TxStatus};
use crate::build;
use crate::framing::CancelKey;

/// What pgfresh answers a server's authentication requests with.
#[derive(Clone, Copy, Debug)]
pub enum Secret<'a> {
    /// A password. For md5, a stored md5 hash (`md5` and 32 hex digits) answers as the
    /// password would.
    Password(&'a str),
    /// The SCRAM keys a client's own login to pgfresh gave (pass-through).
    ScramKeys(ScramKeys),
    /// None: only a server that asks for none (trust) can be logged in to.
    None,
}

/// Why a login failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// The server's ErrorResponse, in its words.
    #[error("{message} (SQLSTATE {code})")]
    Refused { code: String, message: String },
    /// The server asks for a password and none is known.
    #[error("server asks for a password and none is configured for user {user}")]
    NoPassword { user: String },
    /// The server asks for SCRAM-SHA-256 and only an md5 hash of the password is known.
    #[error("the server asks for SCRAM-SHA-256 and only an md5 hash is known for user {user}")]
    Md5HashOnly { user: String },
    /// An authentication method or SASL mechanism pgfresh does not answer.
    #[error("{0}")]
    Unsupported(String),
    /// A message out of turn, or a SCRAM exchange that failed (the server's signature).
    #[error("{0}")]
    Protocol(String),
}

/// What to do after a server message (see [`ClientLogin::on_message`]).
#[derive(Debug, PartialEq, Eq)]
pub enum LoginStep<'m> {
    /// Send this to the server, then read on.
    Send(Bytes),
    /// A ParameterStatus the server reports; read on.
    Parameter { name: &'m str, value: &'m str },
    /// The key to cancel this connection's queries; read on.
    Key(CancelKey),
    /// Nothing to do: read on.
    Read,
    /// Logged in: the server's first ReadyForQuery, with its transaction status.
    Ready(TxStatus),
}

/// A SCRAM exchange in progress.
enum Scram {
    Password(ScramClient),
    Keys(ScramPassthrough),
}

/// One login as `user` with a [`Secret`] (see the module comment).
pub struct ClientLogin<'a> {
    user: &'a str,
    secret: Secret<'a>,
    scram: Option<Scram>,
}

impl<'a> ClientLogin<'a> {
    pub fn new(user: &'a str, secret: Secret<'a>) -> Self {
        ClientLogin {
            user,
            secret,
            scram: None,
        }
    }

    /// The next step after the server's `msg`.
    pub fn on_message<'m>(&mut self, msg: BackendMessage<'m>) -> Result<LoginStep<'m>, LoginError> {
        match msg {
            BackendMessage::Authentication(auth) => self.on_auth(auth),
            BackendMessage::ParameterStatus { name, value } => {
                Ok(LoginStep::Parameter { name, value })
            }
            BackendMessage::BackendKeyData(key) => Ok(LoginStep::Key(key)),
            BackendMessage::ReadyForQuery(tx) => Ok(LoginStep::Ready(tx)),
            BackendMessage::ErrorResponse(fields) => Err(LoginError::Refused {
                code: fields.code.unwrap_or("08000").to_string(),
                message: fields
                    .message
                    .unwrap_or("server refused the connection")
                    .to_string(),
            }),
            BackendMessage::NoticeResponse(_) | BackendMessage::NegotiateProtocolVersion => {
                Ok(LoginStep::Read)
            }
            other => Err(LoginError::Protocol(format!(
                "unexpected message during login: {other:?}"
            ))),
        }
    }

    fn on_auth<'m>(&mut self, auth: Auth<'_>) -> Result<LoginStep<'m>, LoginError> {
        let step = match auth {
            Auth::Ok => LoginStep::Read,
            Auth::CleartextPassword => password_step(self.password()?.as_bytes()),
            Auth::Md5Password { salt } => {
                let pw = self.password()?;
                let hash = md5_response_from_stored(pw, salt)
                    .unwrap_or_else(|| md5_password_hash(self.user, pw, salt));
                password_step(hash.as_bytes())
            }
            Auth::Sasl { mechanisms } => {
                if !mechanisms.contains(&SCRAM_SHA_256) {
                    return Err(LoginError::Unsupported(format!(
                        "no supported SASL mechanism in {mechanisms:?}"
                    )));
                }
                let (scram, first) = self.start_scram()?;
                self.scram = Some(scram);
                LoginStep::Send(build::sasl_initial_response(SCRAM_SHA_256, &first))
            }
            Auth::SaslContinue(data) => {
                let reply = match self.scram.as_mut() {
                    Some(Scram::Password(c)) => c.update(data).map(<[u8]>::to_vec),
                    Some(Scram::Keys(k)) => k.update(data),
                    None => return Err(out_of_turn()),
                }
                .map_err(|e| LoginError::Protocol(e.to_string()))?;
                LoginStep::Send(build::sasl_response(&reply))
            }
            Auth::SaslFinal(data) => {
                match self.scram.take() {
                    Some(Scram::Password(mut c)) => c.finish(data),
                    Some(Scram::Keys(mut k)) => k.finish(data),
                    None => return Err(out_of_turn()),
                }
                .map_err(|e| LoginError::Protocol(format!("the server's SCRAM signature: {e}")))?;
                LoginStep::Read
            }
            Auth::Other(code) => {
                return Err(LoginError::Unsupported(format!(
                    "unsupported authentication request {code}"
                )))
            }
        };
        Ok(step)
    }

    fn start_scram(&self) -> Result<(Scram, Vec<u8>), LoginError> {
        match self.secret {
            Secret::ScramKeys(keys) => {
                let k = ScramPassthrough::new(keys);
                let first = k.initial_message();
                Ok((Scram::Keys(k), first))
            }
            Secret::Password(pw) if super::is_md5_secret(pw) => Err(LoginError::Md5HashOnly {
                user: self.user.to_string(),
            }),
            Secret::Password(pw) => {
                let c = ScramClient::new(pw);
                let first = c.initial_message().to_vec();
                Ok((Scram::Password(c), first))
            }
            Secret::None => Err(self.no_password()),
        }
    }

    fn password(&self) -> Result<&'a str, LoginError> {
        match self.secret {
            Secret::Password(pw) => Ok(pw),
            _ => Err(self.no_password()),
        }
    }

    fn no_password(&self) -> LoginError {
        LoginError::NoPassword {
            user: self.user.to_string(),
        }
    }
}

/// A PasswordMessage of `answer` (NUL-terminated).
fn password_step<'m>(answer: &[u8]) -> LoginStep<'m> {
    LoginStep::Send(build::password_message(&[answer, b"\0"].concat()))
}

fn out_of_turn() -> LoginError {
    LoginError::Protocol("the server sent SASL data out of turn".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{ScramServer, ScramVerifier};

    const USER: &str = "app";
    const PASSWORD: &str = "s3cret";

    fn body(frame: &Bytes) -> crate::Frame {
        let mut buf = bytes::BytesMut::from(&frame[..]);
        match crate::decode_frontend(&mut buf, &crate::Limits::default()).unwrap() {
            crate::Decoded::Frame(f) => f,
            other => panic!("not a whole frame: {other:?}"),
        }
    }

    fn sent(step: LoginStep<'_>) -> crate::Frame {
        match step {
            LoginStep::Send(b) => body(&b),
            other => panic!("expected a message to send, got {other:?}"),
        }
    }

    fn password_of(frame: &crate::Frame) -> String {
        crate::auth::parse_password_message(frame.body())
            .unwrap()
            .to_string()
    }

    #[test]
    fn cleartext_and_md5_are_answered_from_the_password_or_a_stored_hash() {
        let mut l = ClientLogin::new(USER, Secret::Password(PASSWORD));
        let f = sent(
            l.on_message(BackendMessage::Authentication(Auth::CleartextPassword))
                .unwrap(),
        );
        assert_eq!(password_of(&f), PASSWORD);

        let salt = [1, 2, 3, 4];
        let f = sent(
            l.on_message(BackendMessage::Authentication(Auth::Md5Password { salt }))
                .unwrap(),
        );
        assert_eq!(password_of(&f), md5_password_hash(USER, PASSWORD, salt));

        let stored = crate::auth::md5_stored_hash(USER, PASSWORD);
        let mut l = ClientLogin::new(USER, Secret::Password(&stored));
        let f = sent(
            l.on_message(BackendMessage::Authentication(Auth::Md5Password { salt }))
                .unwrap(),
        );
        assert_eq!(password_of(&f), md5_password_hash(USER, PASSWORD, salt));
    }

    /// A SCRAM login against pgfresh's own server side, with `secret`; the server's
    /// answer to the client's proof, or why it failed.
    fn scram_against(verifier: ScramVerifier, secret: Secret<'_>) -> Result<(), String> {
        let mut l = ClientLogin::new(USER, secret);
        let mut server = ScramServer::new(verifier, &mut rand::rng());
        let sasl = Auth::Sasl {
            mechanisms: vec!["SCRAM-SHA-256-PLUS", SCRAM_SHA_256],
        };
        let first = sent(l.on_message(BackendMessage::Authentication(sasl)).unwrap());
        let (mechanism, data) = crate::auth::parse_sasl_initial_response(first.body()).unwrap();
        let server_first = server
            .client_first(mechanism, data)
            .map_err(|e| e.to_string())?;
        let last = sent(
            l.on_message(BackendMessage::Authentication(Auth::SaslContinue(
                &server_first,
            )))
            .unwrap(),
        );
        let server_final = server
            .client_final(last.body())
            .map_err(|e| e.to_string())?;
        let step = l
            .on_message(BackendMessage::Authentication(Auth::SaslFinal(
                &server_final,
            )))
            .map_err(|e| e.to_string())?;
        assert_eq!(step, LoginStep::Read);
        Ok(())
    }

    #[test]
    fn scram_logs_in_with_the_password_or_the_clients_keys() {
        let verifier = ScramVerifier::generate(PASSWORD);
        scram_against(verifier.clone(), Secret::Password(PASSWORD)).unwrap();
        let e = scram_against(verifier.clone(), Secret::Password("wrong")).unwrap_err();
        assert!(e.contains("password authentication failed"), "{e}");

        // The keys a client's proof gives (pass-through) log in without the password.
        let mut server = ScramServer::new(verifier.clone(), &mut rand::rng());
        let client = ScramClient::new(PASSWORD);
        let server_first = server
            .client_first(SCRAM_SHA_256, client.initial_message())
            .unwrap();
        let mut client = client;
        let last = client.update(&server_first).unwrap().to_vec();
        server.client_final(&last).unwrap();
        let keys = server.passthrough_keys().unwrap();
        scram_against(verifier, Secret::ScramKeys(keys)).unwrap();
    }

    #[test]
    fn what_cannot_be_answered_says_why() {
        let sasl = || {
            BackendMessage::Authentication(Auth::Sasl {
                mechanisms: vec![SCRAM_SHA_256],
            })
        };
        let md5 = crate::auth::md5_stored_hash(USER, PASSWORD);
        let mut l = ClientLogin::new(USER, Secret::Password(&md5));
        assert_eq!(
            l.on_message(sasl()).unwrap_err(),
            LoginError::Md5HashOnly { user: USER.into() }
        );
        let mut l = ClientLogin::new(USER, Secret::None);
        for ask in [
            sasl(),
            BackendMessage::Authentication(Auth::CleartextPassword),
            BackendMessage::Authentication(Auth::Md5Password { salt: [0; 4] }),
        ] {
            assert_eq!(
                l.on_message(ask).unwrap_err().to_string(),
                "server asks for a password and none is configured for user app"
            );
        }
        let mut l = ClientLogin::new(USER, Secret::Password(PASSWORD));
        let e = l
            .on_message(BackendMessage::Authentication(Auth::Sasl {
                mechanisms: vec!["SCRAM-SHA-256-PLUS"],
            }))
            .unwrap_err();
        assert!(matches!(e, LoginError::Unsupported(_)), "{e}");
        let e = l
            .on_message(BackendMessage::Authentication(Auth::Other(7)))
            .unwrap_err();
        assert_eq!(e.to_string(), "unsupported authentication request 7");
        let e = l
            .on_message(BackendMessage::Authentication(Auth::SaslContinue(b"r=x")))
            .unwrap_err();
        assert!(matches!(e, LoginError::Protocol(_)), "{e}");
        let e = l.on_message(BackendMessage::DataRow).unwrap_err();
        assert!(matches!(e, LoginError::Protocol(_)), "{e}");
    }

    #[test]
    fn the_servers_refusal_and_what_it_reports_come_through() {
        let mut l = ClientLogin::new(USER, Secret::None);
        assert_eq!(
            l.on_message(BackendMessage::Authentication(Auth::Ok))
                .unwrap(),
            LoginStep::Read
        );
        assert_eq!(
            l.on_message(BackendMessage::ParameterStatus {
                name: "server_version",
                value: "15.8"
            })
            .unwrap(),
            LoginStep::Parameter {
                name: "server_version",
                value: "15.8"
            }
        );
        let key = CancelKey { pid: 7, secret: 9 };
        assert_eq!(
            l.on_message(BackendMessage::BackendKeyData(key)).unwrap(),
            LoginStep::Key(key)
        );
        assert_eq!(
            l.on_message(BackendMessage::ReadyForQuery(TxStatus::Idle))
                .unwrap(),
            LoginStep::Ready(TxStatus::Idle)
        );
        let refusal =
            crate::ErrorResponse::fatal("28P01", "password authentication failed for user \"app\"");
        let mut buf = bytes::BytesMut::from(&build::error_response(&refusal)[..]);
        let crate::Decoded::Frame(frame) =
            crate::decode_backend(&mut buf, &crate::Limits::default()).unwrap()
        else {
            panic!("not a whole frame");
        };
        let e = l
            .on_message(crate::parse_backend(&frame).unwrap())
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "password authentication failed for user \"app\" (SQLSTATE 28P01)"
        );
    }
}
