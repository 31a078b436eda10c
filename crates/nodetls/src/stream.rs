//! The relay's connection to a node, plain or TLS, driven without blocking: the session
//! loop waits on the socket's readiness and then takes what is there, for both kinds.
//!
//! A TLS connection is a rustls `ClientConnection` over the raw socket. Reads decrypt
//! whatever has arrived (at most [`READ_CHUNK`] bytes of plaintext per call; when more is
//! waiting, [`ServerStream::readable`] answers at once). Writes encrypt at most
//! [`WRITE_CHUNK`] bytes per call and hand the records to the socket; records the socket
//! did not take yet are [`ServerStream::has_unsent`], and [`ServerStream::flush_unsent`]
//! sends them when the socket is writable again.

use std::io::{self, BufRead, Read, Write};
use std::task::Poll;

use bytes::BytesMut;
use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

use crate::tcp::Tcp;
use crate::{Mode, Settings};

/// Plaintext taken per read call before the caller gets to relay it.
const READ_CHUNK: usize = 64 * 1024;
/// Plaintext encrypted per write call.
const WRITE_CHUNK: usize = 64 * 1024;

/// PostgreSQL's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// A connection to a node.
pub enum ServerStream {
    Plain(Tcp),
    Tls(Box<TlsConn>),
}

pub struct TlsConn {
    tcp: Tcp,
    tls: rustls::ClientConnection,
    /// The last read stopped at [`READ_CHUNK`] with more possibly decrypted or buffered.
    more: bool,
    /// The socket reached its end.
    eof: bool,
}

/// `std::io` over a tokio socket's non-blocking calls, for rustls.
struct Sock<'a>(&'a Tcp);

impl Read for Sock<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for Sock<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Negotiate TLS on a fresh connection to `host` as `settings` ask: nothing with
/// `disable`; otherwise SSLRequest, exactly one byte of answer read (anything the node
/// sent after it is left to the TLS handshake, which refuses it), then the handshake.
/// Errors say why in words for the log and the client.
pub async fn connect(
    mut tcp: Tcp,
    settings: &Settings,
    host: &str,
) -> Result<ServerStream, String> {
    let Some(config) = settings.client_config()? else {
        return Ok(ServerStream::Plain(tcp));
    };
    tcp.write_all(&SSL_REQUEST)
        .await
        .map_err(|e| format!("sending SSLRequest: {e}"))?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .await
        .map_err(|e| format!("reading the answer to SSLRequest: {e}"))?;
    match answer[0] {
        b'S' => {}
        b'N' if settings.mode == Mode::Prefer => return Ok(ServerStream::Plain(tcp)),
        b'N' => {
            return Err(format!(
                "the node does not offer TLS and server_tls_sslmode is {}",
                settings.mode.as_str()
            ))
        }
        b'E' => return Err("the node answered SSLRequest with an error".into()),
        other => {
            return Err(format!(
                "the node answered SSLRequest with byte {other:#04x} instead of S or N"
            ))
        }
    }
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host} is not a host name TLS can check: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {host}: {e}"))?;
    let (tcp, tls) = tls.into_inner();
    Ok(ServerStream::Tls(Box::new(TlsConn {
        tcp,
        tls,
        more: false,
        eof: false,
    })))
}

impl ServerStream {
    pub fn tcp(&self) -> &Tcp {
        match self {
            ServerStream::Plain(s) => s,
            ServerStream::Tls(t) => &t.tcp,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, ServerStream::Tls(_))
    }

    /// Protocol version and cipher suite, e.g. `TLSv1_3/TLS13_AES_256_GCM_SHA384`.
    pub fn tls_description(&self) -> Option<String> {
        let ServerStream::Tls(t) = self else {
            return None;
        };
        let version = t.tls.protocol_version()?;
        let suite = t.tls.negotiated_cipher_suite()?;
        Some(format!("{version:?}/{:?}", suite.suite()))
    }

    /// Wait until a read may find something.
    pub async fn readable(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_read_ready(cx)).await
    }

    /// [`ServerStream::readable`] as a poll. The waker goes to the socket's one reader
    /// slot rather than a waiter list (a lock, a list entry and its removal on every wait):
    /// one task reads a connection at a time, and the latest poll's waker is the one woken.
    pub fn poll_read_ready(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        match self {
            ServerStream::Plain(s) => s.poll_read_ready(cx),
            ServerStream::Tls(t) if t.more => Poll::Ready(Ok(())),
            ServerStream::Tls(t) => t.tcp.poll_read_ready(cx),
        }
    }

    /// Wait until the socket takes more bytes.
    pub async fn writable(&self) -> io::Result<()> {
        self.tcp().writable().await
    }

    /// Append what the node sent (decrypted) to `buf` without waiting. `Ok(0)`: the node
    /// closed the connection; `WouldBlock`: nothing yet.
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            ServerStream::Plain(s) => s.try_read_buf(buf),
            ServerStream::Tls(t) => t.read(buf),
        }
    }

    /// Write as much of `bytes` as can go now; `WouldBlock` when nothing can.
    pub fn try_write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            ServerStream::Plain(s) => s.try_write(bytes),
            ServerStream::Tls(t) => t.write(bytes),
        }
    }

    /// Encrypted records wait for the socket.
    pub fn has_unsent(&self) -> bool {
        match self {
            ServerStream::Plain(_) => false,
            ServerStream::Tls(t) => t.tls.wants_write(),
        }
    }

    /// Hand waiting records to the socket, as many as it takes now.
    pub fn flush_unsent(&mut self) -> io::Result<()> {
        match self {
            ServerStream::Plain(_) => Ok(()),
            ServerStream::Tls(t) => t.flush(),
        }
    }

    /// Write all of `bytes`, waiting for the socket as needed.
    pub async fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        loop {
            while !bytes.is_empty() {
                match self.try_write(bytes) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => bytes = &bytes[n..],
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
            if bytes.is_empty() && !self.has_unsent() {
                return Ok(());
            }
            self.writable().await?;
            self.flush_unsent()?;
        }
    }

    /// Wait for and append what the node sends next; `Ok(0)` when it closed.
    pub async fn read_some(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            match self.try_read_buf(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.readable().await?,
                other => return other,
            }
        }
    }

    /// An idle connection the node has neither closed nor sent anything on (a node sends
    /// an idle connection nothing but a FATAL before it closes it; TLS housekeeping such
    /// as session tickets does not count).
    pub fn still_open(&mut self) -> bool {
        match self {
            ServerStream::Plain(s) => {
                let mut probe = [0u8; 1];
                matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            ServerStream::Tls(t) => {
                let mut scratch = BytesMut::new();
                matches!(t.read(&mut scratch), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// Close politely: TLS close_notify when encrypted, then the socket's write side.
    pub async fn shutdown(&mut self) {
        if let ServerStream::Tls(t) = self {
            t.tls.send_close_notify();
            let _ = t.flush();
        }
        let tcp = match self {
            ServerStream::Plain(s) => s,
            ServerStream::Tls(t) => &mut t.tcp,
        };
        let _ = tcp.shutdown().await;
    }
}

impl TlsConn {
    fn read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.more = false;
        let start = buf.len();
        loop {
            self.tls
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let closed = take_plaintext(&mut self.tls, buf)?;
            // Alerts or key-update answers rustls wants to send go out now if they can.
            self.flush()?;
            let got = buf.len() - start;
            if closed {
                // With data, the next call reports the close.
                return Ok(got);
            }
            if got >= READ_CHUNK {
                self.more = true;
                return Ok(got);
            }
            match self.tls.read_tls(&mut Sock(&self.tcp)) {
                Ok(0) if self.eof => return Ok(got),
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => return Ok(got),
                Err(e) => return Err(e),
            }
        }
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.flush()?;
        if self.tls.wants_write() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self
            .tls
            .writer()
            .write(&bytes[..bytes.len().min(WRITE_CHUNK)])?;
        if n == 0 && !bytes.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.flush()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut Sock(&self.tcp)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Move every decrypted byte into `buf`; true once the node closed (with or without
/// close_notify).
fn take_plaintext(tls: &mut rustls::ClientConnection, buf: &mut BytesMut) -> io::Result<bool> {
    let mut reader = tls.reader();
    loop {
        match reader.fill_buf() {
            Ok([]) => return Ok(true),
            Ok(chunk) => {
                let n = chunk.len();
                buf.extend_from_slice(chunk);
                reader.consume(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(true),
            Err(e) => return Err(e),
        }
    }
}
