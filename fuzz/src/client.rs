//! The client side of a session: login, writes with chosen split points, and reading
//! replies with a bounded wait. Every byte the proxy sends must decode as a sequence of
//! well-formed server messages; anything else is a finding and panics.

use std::net::SocketAddr;
use std::time::Duration;

use pgfresh_wire::auth::md5_password_hash;
use pgfresh_wire::bytes::BytesMut;
use pgfresh_wire::{
    build, decode_backend, parse_backend, Auth, BackendMessage, CancelKey, Decoded, Frame, Limits,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// How long a read waits where nothing is owed but replies may come (after a Flush).
const UNOWED_IDLE: Duration = Duration::from_millis(2);

/// The client login: user name and, for md5, its password.
pub struct Login {
    pub user: &'static str,
    pub password: Option<&'static str>,
}

/// A client connection to the proxy.
pub struct Client {
    stream: TcpStream,
    /// Received bytes not yet decoded.
    rbuf: BytesMut,
    /// Bytes to send at the next [`Client::send`].
    pub pending: Vec<u8>,
    /// ReadyForQuery messages still expected.
    pub owed: usize,
    /// The session's key from BackendKeyData.
    pub key: Option<CancelKey>,
    /// The proxy closed the connection (or it broke).
    pub closed: bool,
    /// Bytes were sent after the last time every owed ReadyForQuery had arrived: replies
    /// to them (to a Flush, say) may still be on their way.
    unsettled: bool,
    /// Bytes were sent since the last read: worth waiting for their replies.
    sent_since_read: bool,
    /// Messages received since the last [`Client::take_received`].
    received: Vec<Frame>,
}

/// Why a login failed.
#[derive(Debug)]
pub struct LoginError(pub String);

impl Client {
    /// Connects and logs in (after an SSLRequest, which must be refused with `N`, when
    /// `ssl_request`); returns once ReadyForQuery arrived.
    pub async fn connect(
        addr: SocketAddr,
        login: &Login,
        ssl_request: bool,
        deadline: Duration,
    ) -> Result<Client, LoginError> {
        let stream = timeout(deadline, TcpStream::connect(addr))
            .await
            .map_err(|_| LoginError("connect timed out".into()))?
            .map_err(|e| LoginError(format!("connect: {e}")))?;
        let _ = stream.set_nodelay(true);
        let mut c = Client {
            stream,
            rbuf: BytesMut::new(),
            pending: Vec::new(),
            owed: 0,
            key: None,
            closed: false,
            unsettled: false,
            sent_since_read: false,
            received: Vec::new(),
        };
        timeout(deadline, c.login(login, ssl_request))
            .await
            .map_err(|_| LoginError("login timed out".into()))??;
        Ok(c)
    }

    async fn login(&mut self, login: &Login, ssl_request: bool) -> Result<(), LoginError> {
        let io = |e: std::io::Error| LoginError(e.to_string());
        if ssl_request {
            self.stream
                .write_all(&build::ssl_request())
                .await
                .map_err(io)?;
            let answer = self.stream.read_u8().await.map_err(io)?;
            assert_eq!(
                answer, b'N',
                "SSLRequest answered {answer:?} without TLS configured"
            );
        }
        let startup = build::startup(&[
            ("user", login.user),
            ("database", "app"),
            ("application_name", "fuzz"),
        ]);
        self.stream.write_all(&startup).await.map_err(io)?;
        loop {
            let frame = self
                .next_frame()
                .await
                .ok_or_else(|| LoginError("closed during login".into()))?;
            match parse_backend(&frame).expect("checked by next_frame") {
                BackendMessage::Authentication(Auth::Ok) => {}
                BackendMessage::Authentication(Auth::Md5Password { salt }) => {
                    let pw = login.password.expect("md5 asked of a trusted user");
                    let hash = md5_password_hash(login.user, pw, salt);
                    let answer = build::password_message(&[hash.as_bytes(), b"\0"].concat());
                    self.stream.write_all(&answer).await.map_err(io)?;
                }
                BackendMessage::Authentication(other) => panic!("unexpected {other:?}"),
                BackendMessage::BackendKeyData(key) => self.key = Some(key),
                BackendMessage::ReadyForQuery(_) => return Ok(()),
                BackendMessage::ErrorResponse(e) => {
                    return Err(LoginError(format!("{:?}: {:?}", e.code, e.message)))
                }
                _ => {}
            }
        }
    }

    /// The next whole message, reading as needed without a time limit; `None` once the
    /// connection is closed.
    async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.decoded() {
                return Some(f);
            }
            if self.closed || !self.read_more().await {
                return None;
            }
        }
    }

    /// A message already received in full, checked.
    fn decoded(&mut self) -> Option<Frame> {
        match decode_backend(&mut self.rbuf, &Limits::default()) {
            Ok(Decoded::Frame(f)) => {
                check(&f);
                Some(f)
            }
            Ok(Decoded::Incomplete { .. }) => None,
            Err(e) => panic!("the proxy sent a malformed frame: {e}"),
        }
    }

    /// Reads once; false when the connection is closed (a clean close must fall between
    /// two messages).
    async fn read_more(&mut self) -> bool {
        match self.stream.read_buf(&mut self.rbuf).await {
            Ok(0) => {
                assert!(
                    self.rbuf.is_empty(),
                    "the proxy closed the connection in the middle of a message: {:?}",
                    &self.rbuf[..]
                );
                self.closed = true;
                false
            }
            Ok(_) => true,
            // A reset can drop bytes in flight; only a clean close is held to framing.
            Err(_) => {
                self.closed = true;
                false
            }
        }
    }

    /// Writes what is pending, `chunk` bytes at a time (0: at once). A refused write
    /// means the proxy closed the connection.
    pub async fn send(&mut self, chunk: usize) {
        let data = std::mem::take(&mut self.pending);
        self.unsettled |= !data.is_empty();
        self.sent_since_read |= !data.is_empty();
        let size = if chunk == 0 { data.len().max(1) } else { chunk };
        for part in data.chunks(size) {
            let wrote = timeout(Duration::from_secs(2), self.stream.write_all(part)).await;
            if !matches!(wrote, Ok(Ok(()))) {
                self.closed = true;
                return;
            }
        }
    }

    /// Reads replies until every owed ReadyForQuery arrived (and nothing was sent after
    /// the last one), the proxy waits for COPY data, the connection closed, or nothing
    /// arrived for `idle` (for a shorter while where nothing is owed but replies may
    /// come, after a Flush). When nothing was sent since the last read, whatever was
    /// coming has had its wait: only what is already there is read.
    pub async fn settle(&mut self, idle: Duration) {
        let idle = if std::mem::take(&mut self.sent_since_read) {
            idle
        } else {
            Duration::ZERO // a timeout polls its future once before it looks at the clock
        };
        loop {
            while let Some(f) = self.decoded() {
                match f.tag {
                    b'Z' => {
                        self.owed = self.owed.saturating_sub(1);
                        self.unsettled &= self.owed > 0;
                    }
                    // COPY FROM STDIN: nothing more comes until the client sends data.
                    b'G' | b'W' => {
                        self.owed = 0;
                        self.unsettled = false;
                    }
                    _ => {}
                }
                self.received.push(f);
            }
            if self.closed || (self.owed == 0 && !self.unsettled) {
                return;
            }
            let wait = if self.owed > 0 {
                idle
            } else {
                idle.min(UNOWED_IDLE)
            };
            match timeout(wait, self.read_more()).await {
                Ok(true) => {}
                Ok(false) | Err(_) => return,
            }
        }
    }

    /// Takes the messages received so far.
    pub fn take_received(&mut self) -> Vec<Frame> {
        std::mem::take(&mut self.received)
    }
}

/// A message from the proxy must parse, and an error or notice must carry severity,
/// SQLSTATE and message, as PostgreSQL's always do.
fn check(f: &Frame) {
    match parse_backend(f) {
        Ok(BackendMessage::ErrorResponse(e) | BackendMessage::NoticeResponse(e)) => {
            assert!(
                e.severity.is_some() && e.code.is_some() && e.message.is_some(),
                "error or notice without severity, code or message: {e:?}"
            );
        }
        Ok(_) => {}
        Err(e) => panic!(
            "the proxy sent a malformed {:?} message: {e}",
            f.tag as char
        ),
    }
}

/// Sends a CancelRequest for `key` on a new connection, as libpq does, and closes it.
pub async fn cancel(addr: SocketAddr, key: CancelKey) {
    if let Ok(Ok(mut s)) = timeout(Duration::from_secs(2), TcpStream::connect(addr)).await {
        let _ = s.write_all(&build::cancel_request(key)).await;
        // The proxy closes the connection once it has passed the request on.
        let mut rest = Vec::new();
        let _ = timeout(Duration::from_millis(200), s.read_to_end(&mut rest)).await;
    }
}
