//! A scripted PostgreSQL server for the proxy to talk to: one listener plays the
//! primary, another a streaming replica. It answers the monitor's poll, logs the pools
//! in with md5, and runs statements as [`sql`] describes.

mod conn;
pub mod msg;
pub mod sql;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use pgfresh_wire::auth::{md5_verify_password, parse_password_message};
use pgfresh_wire::bytes::BytesMut;
use pgfresh_wire::{
    build, decode_frontend, decode_startup, CancelKey, Decoded, Frame, Limits, StartupPacket,
    TxStatus,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

pub use sql::Role;

/// The monitor's login (trusted, as over a local socket).
pub const MONITOR_USER: &str = "monitor";
/// The password the pools log in with (md5).
pub const SERVER_PASSWORD: &str = "server-pw";

/// Where the two nodes listen.
pub struct Backend {
    pub primary: SocketAddr,
    pub replica: SocketAddr,
}

/// Sessions by process id, with their secret, for CancelRequests.
#[derive(Default)]
struct Cancels {
    sessions: Mutex<HashMap<i32, (i32, Arc<Notify>)>>,
    next_pid: AtomicI32,
}

impl Cancels {
    fn register(self: &Arc<Self>) -> (CancelKey, Registered) {
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed) + 1000;
        let key = CancelKey {
            pid,
            secret: pid.wrapping_mul(7919),
        };
        let notify = Arc::new(Notify::new());
        self.lock().insert(pid, (key.secret, notify.clone()));
        let registered = Registered {
            cancels: self.clone(),
            pid,
            notify,
        };
        (key, registered)
    }

    /// A statement running on the session with `key` (if any) is cancelled; one that
    /// starts later is not.
    fn cancel(&self, key: CancelKey) {
        if let Some((secret, n)) = self.lock().get(&key.pid) {
            if *secret == key.secret {
                n.notify_waiters();
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, (i32, Arc<Notify>)>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A session's entry in [`Cancels`], removed when the session ends.
struct Registered {
    cancels: Arc<Cancels>,
    pid: i32,
    notify: Arc<Notify>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.cancels.lock().remove(&self.pid);
    }
}

/// Binds both nodes on 127.0.0.1 and serves them on the current tokio runtime.
pub async fn start() -> std::io::Result<Backend> {
    let cancels = Arc::new(Cancels::default());
    let primary = TcpListener::bind("127.0.0.1:0").await?;
    let replica = TcpListener::bind("127.0.0.1:0").await?;
    let backend = Backend {
        primary: primary.local_addr()?,
        replica: replica.local_addr()?,
    };
    tokio::spawn(accept(primary, Role::Primary, cancels.clone()));
    tokio::spawn(accept(replica, Role::Replica, cancels));
    Ok(backend)
}

async fn accept(listener: TcpListener, role: Role, cancels: Arc<Cancels>) {
    while let Ok((stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        tokio::spawn(session(stream, role, cancels.clone()));
    }
}

async fn session(mut stream: TcpStream, role: Role, cancels: Arc<Cancels>) -> std::io::Result<()> {
    let mut rbuf = BytesMut::new();
    let limits = Limits::default();
    let startup = loop {
        match decode_startup(&mut rbuf, &limits) {
            Ok(Decoded::Frame(StartupPacket::Startup(m))) => break m,
            Ok(Decoded::Frame(StartupPacket::SslRequest | StartupPacket::GssEncRequest)) => {
                stream.write_all(&build::ssl_no()).await?;
            }
            Ok(Decoded::Frame(StartupPacket::Cancel(key))) => {
                cancels.cancel(key);
                return Ok(());
            }
            Ok(Decoded::Incomplete { .. }) => {
                if stream.read_buf(&mut rbuf).await? == 0 {
                    return Ok(());
                }
            }
            Err(_) => return Ok(()),
        }
    };
    let user = startup.user().unwrap_or_default().to_string();
    if user != MONITOR_USER && !md5_login(&mut stream, &mut rbuf, &user).await? {
        let e = msg::fatal(
            "28P01",
            format!("password authentication failed for user \"{user}\""),
        );
        return stream.write_all(&e).await;
    }
    let (key, registered) = cancels.register();
    let mut hello = BytesMut::new();
    hello.extend_from_slice(&build::authentication_ok());
    for (name, value) in [
        ("server_version", "17.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("TimeZone", "UTC"),
        ("application_name", ""),
    ] {
        hello.extend_from_slice(&build::parameter_status(name, value));
    }
    hello.extend_from_slice(&build::backend_key_data(key));
    hello.extend_from_slice(&build::ready_for_query(TxStatus::Idle));
    stream.write_all(&hello).await?;
    conn::Conn::new(role, stream, rbuf, registered.notify.clone())
        .serve()
        .await
}

/// Asks for an md5 password and checks it against [`SERVER_PASSWORD`].
async fn md5_login(
    stream: &mut TcpStream,
    rbuf: &mut BytesMut,
    user: &str,
) -> std::io::Result<bool> {
    let salt = [7, 1, 3, 9];
    stream.write_all(&build::auth_md5(salt)).await?;
    let frame = read_frame(stream, rbuf).await?;
    Ok(frame.is_some_and(|f| {
        f.tag == b'p'
            && parse_password_message(f.body()).is_ok_and(|answer| {
                md5_verify_password(user, SERVER_PASSWORD, salt, answer.as_bytes())
            })
    }))
}

async fn read_frame(stream: &mut TcpStream, rbuf: &mut BytesMut) -> std::io::Result<Option<Frame>> {
    loop {
        match decode_frontend(rbuf, &Limits::default()) {
            Ok(Decoded::Frame(f)) => return Ok(Some(f)),
            Ok(Decoded::Incomplete { .. }) => {
                if stream.read_buf(rbuf).await? == 0 {
                    return Ok(None);
                }
            }
            Err(_) => return Ok(None),
        }
    }
}
