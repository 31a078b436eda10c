//! A TCP socket on either I/O engine: tokio's epoll reactor, or the io_uring of the
//! pgfresh-ring runtime that runs the calling thread (the io_uring engine, `[proxy]
//! io_engine`).
//!
//! The engine is the calling thread's: a socket connected on a ring thread is a ring
//! socket, anywhere else a tokio one (the listener hands accepted sockets to the ring
//! itself). Both answer the same calls, so the relay's code
//! does not change with the engine. (A tokio socket used on a ring thread still works,
//! its readiness reaching the ring through tokio's thread, only more slowly.)

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connected TCP socket (see the module documentation).
#[derive(Debug)]
pub enum Tcp {
    Epoll(tokio::net::TcpStream),
    Ring(pgfresh_ring::TcpStream),
}

impl Tcp {
    /// Connects to `host:port` on the calling thread's engine, with `TCP_NODELAY` set.
    pub async fn connect(host: &str, port: u16) -> io::Result<Tcp> {
        if pgfresh_ring::Handle::try_current().is_none() {
            let s = tokio::net::TcpStream::connect((host, port)).await?;
            let _ = s.set_nodelay(true);
            return Ok(Tcp::Epoll(s));
        }
        let mut last = None;
        for addr in tokio::net::lookup_host((host, port)).await? {
            match pgfresh_ring::TcpStream::connect(addr).await {
                Ok(s) => return Ok(Tcp::Ring(s)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{host} resolves to no address"),
            )
        }))
    }

    /// The ring runtime this socket belongs to (`None` for a tokio socket): where work on
    /// it must be started.
    pub fn home(&self) -> Option<pgfresh_ring::Handle> {
        match self {
            Tcp::Epoll(_) => None,
            Tcp::Ring(s) => Some(s.handle()),
        }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Tcp::Epoll(s) => s.peer_addr(),
            Tcp::Ring(s) => s.peer_addr(),
        }
    }

    /// Ready when a read may find something. The waker takes the socket's one reader
    /// slot: one task reads a socket at a time.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Tcp::Epoll(s) => s.poll_read_ready(cx),
            Tcp::Ring(s) => s.poll_read_ready(cx),
        }
    }

    /// [`Tcp::poll_read_ready`] as a future: the socket's one reader slot, not a waiter
    /// list.
    pub async fn readable(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_read_ready(cx)).await
    }

    /// Waits until the socket (or, on the ring, its send queue) takes more bytes.
    pub async fn writable(&self) -> io::Result<()> {
        match self {
            Tcp::Epoll(s) => s.writable().await,
            Tcp::Ring(s) => s.writable().await,
        }
    }

    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Tcp::Epoll(s) => s.try_read(buf),
            Tcp::Ring(s) => s.try_read(buf),
        }
    }

    /// Appends what arrived to `buf` without waiting; `Ok(0)` at the end, `WouldBlock`
    /// when nothing is there. On epoll, a read that got less than `buf` had room for
    /// emptied the socket, so tokio is told to forget the socket's readiness at once (by
    /// answering "would block" from `try_io` while keeping the bytes): without this, the
    /// next wait returns at once and costs a `recv` that finds nothing, one wasted system
    /// call per message and direction. (A byte that arrives meanwhile is a new readiness
    /// event, which tokio does not lose.) On the ring, the next receive is posted as soon
    /// as the bytes are taken, and waiting costs no system call of its own.
    pub fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        let s = match self {
            Tcp::Epoll(s) => s,
            Tcp::Ring(s) => return s.try_read_buf(buf),
        };
        let room = buf.capacity() - buf.len();
        let mut drained = None;
        let read = s.try_io(tokio::io::Interest::READABLE, || {
            let n = s.try_read_buf(buf)?;
            if n > 0 && n < room {
                drained = Some(n);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match drained {
            Some(n) => Ok(n),
            None => read,
        }
    }

    /// Writes what can go now; `WouldBlock` when nothing can. On the ring the bytes are
    /// queued and go out in order as the kernel takes them.
    pub fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Tcp::Epoll(s) => s.try_write(bytes),
            Tcp::Ring(s) => s.try_write(bytes),
        }
    }

    pub fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let s = match self {
            Tcp::Epoll(s) => return s.try_write_vectored(bufs),
            Tcp::Ring(s) => s,
        };
        let mut total = 0;
        for b in bufs {
            match s.try_write(b) {
                Ok(n) => {
                    total += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(e) if total == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(total)
    }
}

impl AsyncRead for Tcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Tcp::Epoll(s) => Pin::new(s).poll_read(cx, buf),
            Tcp::Ring(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Tcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Tcp::Epoll(s) => Pin::new(s).poll_write(cx, buf),
            Tcp::Ring(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Tcp::Epoll(s) => Pin::new(s).poll_flush(cx),
            Tcp::Ring(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Tcp::Epoll(s) => Pin::new(s).poll_shutdown(cx),
            Tcp::Ring(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
