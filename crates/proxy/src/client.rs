//! The client's side of connection start: TLS/GSS refusal, cancel requests, the
//! startup message, and authentication against `[[users]]`.

use bytes::BytesMut;
use pgfresh_config::{AuthMethod, Config, UserConfig};
use pgfresh_wire::auth::{
    md5_verify, md5_verify_password, parse_sasl_initial_response, ScramServer, ScramVerifier,
};
use pgfresh_wire::{
    build, decode_startup, parse_frontend, CancelKey, Decoded, FrontendMessage, Limits,
    StartupPacket,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::error::ProxyError;
use crate::io::{fill, read_frame, ReadError, Side};

/// What the client asked for at startup, once it has proved who it is.
#[derive(Debug)]
pub enum Opening {
    /// A session for `user` on `database`.
    Session(Login),
    /// A cancel request for the session holding this key.
    Cancel(CancelKey),
}

#[derive(Debug, Clone)]
pub struct Login {
    pub user: UserConfig,
    pub database: String,
    /// Startup parameters other than user/database, in the client's order.
    pub params: Vec<(String, String)>,
    /// The keys the client's SCRAM login proved, when its password is a stored verifier:
    /// what SCRAM pass-through logs in to the nodes with.
    pub passthrough: Option<Box<pgfresh_wire::auth::ScramKeys>>,
}

pub(crate) fn read_err(e: ReadError) -> ProxyError {
    match e {
        ReadError::Closed | ReadError::Truncated => ProxyError::ClientGone,
        ReadError::Io(e) => ProxyError::ClientIo(e),
        ReadError::Frame(f) => ProxyError::ClientProtocol(f),
    }
}

/// Read startup-phase packets until a StartupMessage or CancelRequest arrives, then
/// authenticate. TLS and GSS encryption requests are answered `N` on the same socket.
pub async fn open<S: AsyncRead + AsyncWrite + Unpin>(
    sock: &mut S,
    buf: &mut BytesMut,
    config: &Config,
    shared: &crate::context::Shared,
) -> Result<Opening, ProxyError> {
    let limits = Limits {
        max_message: config.proxy.max_message_bytes,
        max_startup: 10 * 1024,
    };
    let startup = loop {
        match decode_startup(buf, &limits)? {
            Decoded::Incomplete { .. } => fill(sock, buf).await.map_err(read_err)?,
            Decoded::Frame(StartupPacket::SslRequest)
            | Decoded::Frame(StartupPacket::GssEncRequest) => {
                write(sock, &build::ssl_no()).await?;
            }
            Decoded::Frame(StartupPacket::Cancel(key)) => return Ok(Opening::Cancel(key)),
            Decoded::Frame(StartupPacket::Startup(m)) => break m,
        }
    };
    let user_name = startup
        .user()
        .ok_or_else(|| {
            ProxyError::Startup("no PostgreSQL user name specified in startup packet".into())
        })?
        .to_string();
    let database = startup.database().unwrap_or(&user_name).to_string();
    let params: Vec<(String, String)> = startup
        .params
        .iter()
        .filter(|(k, _)| k != "user" && k != "database")
        .cloned()
        .collect();
    // [[users]] first, then auth_file, then auth_query.
    let mut user = config
        .user(&user_name)
        .cloned()
        .or_else(|| shared.auth_file.user(&user_name));
    if user.is_none() {
        user = shared.auth_query.user(shared, &database, &user_name).await;
    }
    let Some(user) = user else {
        // Same answer as a wrong password, as PostgreSQL gives, so user names cannot be probed.
        return Err(ProxyError::AuthFailed(user_name));
    };
    let passthrough = authenticate(sock, buf, &user, &limits, &shared.verifiers).await?;
    Ok(Opening::Session(Login {
        user,
        database,
        params,
        passthrough,
    }))
}

async fn write<S: AsyncWrite + Unpin>(sock: &mut S, bytes: &[u8]) -> Result<(), ProxyError> {
    sock.write_all(bytes).await.map_err(ProxyError::ClientIo)?;
    sock.flush().await.map_err(ProxyError::ClientIo)
}

async fn read_password<S: AsyncRead + Unpin>(
    sock: &mut S,
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Vec<u8>, ProxyError> {
    let frame = read_frame(sock, buf, limits, Side::Frontend)
        .await
        .map_err(read_err)?;
    match parse_frontend(&frame)? {
        FrontendMessage::Password(body) => Ok(body.to_vec()),
        _ => Err(ProxyError::Startup(format!(
            "expected a password message, got message type {:?}",
            frame.tag as char
        ))),
    }
}

async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    sock: &mut S,
    buf: &mut BytesMut,
    user: &UserConfig,
    limits: &Limits,
    verifiers: &VerifierCache,
) -> Result<Option<Box<pgfresh_wire::auth::ScramKeys>>, ProxyError> {
    let failed = || ProxyError::AuthFailed(user.name.clone());
    let mut keys = None;
    match user.auth {
        AuthMethod::Trust => {}
        AuthMethod::Md5 => {
            let password = user.password.as_deref().ok_or_else(failed)?;
            let salt: [u8; 4] = rand::random();
            write(sock, &build::auth_md5(salt)).await?;
            let answer = read_password(sock, buf, limits).await?;
            let ok = if user.password_is_md5() {
                // A stored md5 hash (auth_file) checks the answer as PostgreSQL does.
                md5_verify(password, salt, &answer)
            } else {
                md5_verify_password(&user.name, password, salt, &answer)
            };
            if !ok {
                return Err(failed());
            }
        }
        AuthMethod::ScramSha256 => {
            let stored = user.password.as_deref().ok_or_else(failed)?;
            let verifier = verifiers.get(stored).ok_or_else(failed)?;
            let mut server = ScramServer::new(verifier, &mut rand::rng());
            write(sock, &build::auth_sasl(&["SCRAM-SHA-256"])).await?;
            let first = read_password(sock, buf, limits).await?;
            let (mechanism, data) = parse_sasl_initial_response(&first)?;
            let server_first = server.client_first(mechanism, data).map_err(|_| failed())?;
            write(sock, &build::auth_sasl_continue(&server_first)).await?;
            let last = read_password(sock, buf, limits).await?;
            let server_final = server.client_final(&last).map_err(|_| failed())?;
            write(sock, &build::auth_sasl_final(&server_final)).await?;
            if user.password_is_verifier() {
                keys = server.passthrough_keys().map(Box::new);
            }
        }
    }
    write(sock, &build::authentication_ok()).await?;
    Ok(keys)
}

/// SCRAM verifiers per configured password. Deriving one from a plain password costs
/// 4096 PBKDF2 rounds, so it is done once per password, with a random salt, as
/// PostgreSQL does once per role.
#[derive(Default)]
pub struct VerifierCache {
    map: std::sync::Mutex<std::collections::HashMap<String, ScramVerifier>>,
}

impl VerifierCache {
    /// The verifier for a stored password (plain text or a SCRAM verifier string).
    pub fn get(&self, stored: &str) -> Option<ScramVerifier> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = map.get(stored) {
            return Some(v.clone());
        }
        let v = if stored.starts_with("SCRAM-SHA-256$") {
            ScramVerifier::parse(stored).ok()?
        } else {
            ScramVerifier::from_password(stored, &rand::random::<[u8; 16]>(), 4096)
        };
        if map.len() > 10_000 {
            map.clear();
        }
        map.insert(stored.to_string(), v.clone());
        Some(v)
    }
}
