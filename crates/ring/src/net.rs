//! TCP sockets whose receives and sends are ring operations.
//!
//! A stream keeps one receive posted while its buffer is empty, into a buffer its shared
//! core owns; the completion fills the buffer, and reads copy out of it. So the data of a
//! receive is never lost with a dropped future: it waits in the buffer for the next read.
//! Writes are copied into the stream's queue and sent in order, one send in flight at a
//! time (what arrives meanwhile goes out in the next); `flush` waits until the kernel has
//! taken everything. A dropped stream cancels its receive and lets its queued bytes go out
//! (as a closed socket's kernel buffer would) for up to the runtime's linger, then closes.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use io_uring::{opcode, types};

use crate::executor;
use crate::executor::Remote;
use crate::reactor::{Oneshot, Slot};

/// A receive's first size; it doubles (up to `RECV_MAX`) each time a receive fills it.
const RECV_MIN: usize = 4 * 1024;
const RECV_MAX: usize = 64 * 1024;
/// Bytes a stream queues for sending before `try_write` answers `WouldBlock`.
pub const SEND_LIMIT: usize = 256 * 1024;

/// How long, by default, the bytes a dropped stream still had queued may take to reach
/// the kernel ([`crate::Runtime::set_linger`]). Past it they are given up and the socket
/// closes; what the kernel already took still goes out, as after a plain `close`. A peer
/// that stops reading would otherwise keep the socket, and up to [`SEND_LIMIT`] bytes,
/// for as long as it acknowledges with a zero window.
pub const LINGER: std::time::Duration = std::time::Duration::from_secs(10);

/// How a stream's receiving side stands.
#[derive(Clone, Copy, PartialEq, Debug)]
enum RxEnd {
    Open,
    /// The peer closed its side.
    Eof,
    /// A receive failed with this errno.
    Failed(i32),
}

struct Rx {
    /// Received bytes; `buf[pos..]` not yet read. While a receive is in flight the
    /// buffer is empty and the kernel owns its capacity.
    buf: Vec<u8>,
    pos: usize,
    op: Option<u64>,
    end: RxEnd,
    size: usize,
    waiter: Waiter,
}

struct Tx {
    /// The bytes of the send in flight; `inflight[sent..]` not yet taken by the kernel.
    inflight: Vec<u8>,
    sent: usize,
    op: Option<u64>,
    /// Bytes written since that send started, sent when it completes.
    queued: Vec<u8>,
    failed: Option<i32>,
    waiter: Waiter,
}

impl Tx {
    fn pending(&self) -> usize {
        self.inflight.len() - self.sent + self.queued.len()
    }
}

/// A stream's state, shared by its handle and the slots of its operations in flight.
pub(crate) struct Core {
    sock: std::net::TcpStream,
    rx: RefCell<Rx>,
    tx: RefCell<Tx>,
    /// The runtime whose ring runs the stream's operations, on whose thread alone `rx`
    /// and `tx` are touched.
    owner: Arc<Remote>,
    /// Set when a dropped handle left bytes queued: dropped with the core (the bytes went
    /// out, or were given up, and the socket closed), which ends the task that would give
    /// them up after the linger.
    lingering: RefCell<Option<tokio::sync::oneshot::Sender<()>>>,
    /// The socket's index in the ring's table of registered sockets ([`crate::fixed`]),
    /// which operations name it by; `None`: by its descriptor.
    fixed: Option<u32>,
}

impl Drop for Core {
    fn drop(&mut self) {
        // The table's reference would keep the socket open: take it out. (Off the owner's
        // thread the runtime is gone, and its table with it.)
        if let Some(index) = self.fixed {
            if executor::is_current(&self.owner) {
                let _ = executor::try_with(|cx| cx.reactor.unregister(index));
            }
        }
    }
}

// SAFETY: `rx`, `tx` and `lingering` (the only parts that are not thread-safe) are borrowed only on the
// owner runtime's thread: every entry point of `TcpStream` checks `here()` first, the
// completions are handled by that runtime's reactor, and a handle dropped elsewhere sends
// its core back there (`TcpStream::drop`). Other threads only move the `Arc` and read
// `sock`, which is thread-safe; the core's own drop frees memory and closes the socket,
// which any thread may do.
unsafe impl Send for Core {}
// SAFETY: as for `Send`.
unsafe impl Sync for Core {}

impl Core {
    /// `Ok` on the owner runtime's thread; elsewhere the error every I/O call answers.
    fn here(&self) -> io::Result<()> {
        if executor::is_current(&self.owner) {
            Ok(())
        } else {
            Err(io::Error::other(
                "pgfresh-ring: a stream used outside the thread of its runtime",
            ))
        }
    }

    /// The handle is gone: cancel the posted receive; queued bytes still go out, and the
    /// socket closes when the last operation completes — or once the runtime's linger
    /// has passed, when whatever is still queued is given up ([`LINGER`]). On the
    /// owner's thread only.
    fn release(self: &Arc<Self>) {
        let op = self.rx.borrow().op;
        if let Some(key) = op {
            executor::with(|cx| cx.reactor.cancel(key));
        }
        if self.tx.borrow().pending() > 0 {
            let core = Arc::downgrade(self);
            let linger = executor::with(|cx| cx.linger.get());
            let (closed_tx, closed) = tokio::sync::oneshot::channel::<()>();
            *self.lingering.borrow_mut() = Some(closed_tx);
            drop(executor::spawn(async move {
                tokio::select! {
                    biased;
                    // The core is gone: nothing is left to give up.
                    _ = closed => {}
                    () = crate::time::sleep(linger) => {
                        if let Some(core) = core.upgrade() {
                            core.give_up_sending();
                        }
                    }
                }
            }));
        }
    }

    /// A dropped stream's bytes did not go out within the linger: drop what is queued
    /// and cancel the send in flight, whose completion then lets the socket close.
    fn give_up_sending(&self) {
        let mut tx = self.tx.borrow_mut();
        tx.queued.clear();
        tx.failed.get_or_insert(libc::ECANCELED);
        if let Some(key) = tx.op {
            executor::with(|cx| cx.reactor.cancel(key));
        }
    }

    fn fd(&self) -> types::Fd {
        types::Fd(self.sock.as_raw_fd())
    }

    /// Posts a receive if none is in flight and every received byte has been read.
    fn arm_recv(self: &Arc<Self>) {
        let mut rx = self.rx.borrow_mut();
        if rx.op.is_some() || rx.pos < rx.buf.len() || rx.end != RxEnd::Open {
            return;
        }
        rx.buf.clear();
        rx.pos = 0;
        let size = rx.size;
        rx.buf.reserve(size);
        let (ptr, cap) = (rx.buf.as_mut_ptr(), rx.buf.capacity());
        executor::with(|cx| {
            let key = cx.reactor.insert(Slot::Recv(self.clone()));
            let ioprio = cx.reactor.recv_ioprio();
            let e = match self.fixed {
                Some(i) => opcode::Recv::new(types::Fixed(i), ptr, cap as u32)
                    .ioprio(ioprio)
                    .build(),
                None => opcode::Recv::new(self.fd(), ptr, cap as u32)
                    .ioprio(ioprio)
                    .build(),
            }
            .user_data(key);
            // SAFETY: the buffer belongs to this core, which the slot keeps alive; it is
            // neither read nor resized while `rx.op` is set.
            unsafe { cx.reactor.push(&e) };
            rx.op = Some(key);
        });
    }

    pub(crate) fn recv_done(self: Arc<Self>, res: i32) {
        let waker = {
            let mut rx = self.rx.borrow_mut();
            rx.op = None;
            if res > 0 {
                let n = res as usize;
                // SAFETY: the kernel wrote `n` bytes into the buffer's capacity.
                unsafe { rx.buf.set_len(n) };
                rx.pos = 0;
                if n == rx.buf.capacity() && rx.size < RECV_MAX {
                    rx.size *= 2;
                }
            } else if res == 0 {
                rx.end = RxEnd::Eof;
            } else {
                rx.end = RxEnd::Failed(-res);
            }
            rx.waiter.take()
        };
        if let Some(w) = waker {
            w.wake_by_ref();
            self.rx.borrow_mut().waiter.keep(w);
        }
    }

    fn poll_readable(self: &Arc<Self>, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut rx = self.rx.borrow_mut();
            if rx.pos < rx.buf.len() || rx.end != RxEnd::Open {
                return Poll::Ready(());
            }
            rx.waiter.wait(cx.waker());
        }
        self.arm_recv();
        Poll::Pending
    }

    /// Copies received bytes out with `put`, which takes what it can and says how much.
    fn read_with(self: &Arc<Self>, put: impl FnOnce(&[u8]) -> usize) -> io::Result<usize> {
        let n = {
            let mut rx = self.rx.borrow_mut();
            if rx.pos < rx.buf.len() {
                let n = put(&rx.buf[rx.pos..]);
                rx.pos += n;
                n
            } else {
                match rx.end {
                    RxEnd::Eof => return Ok(0),
                    RxEnd::Failed(e) => return Err(io::Error::from_raw_os_error(e)),
                    RxEnd::Open => {
                        drop(rx);
                        self.arm_recv();
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                }
            }
        };
        // Everything read: the next receive goes in the next submission.
        self.arm_recv();
        Ok(n)
    }

    fn start_send(self: &Arc<Self>) {
        let mut tx = self.tx.borrow_mut();
        if tx.op.is_some() || tx.queued.is_empty() || tx.failed.is_some() {
            return;
        }
        let tx = &mut *tx;
        std::mem::swap(&mut tx.inflight, &mut tx.queued);
        tx.queued.clear();
        tx.sent = 0;
        self.post_send(tx);
    }

    fn post_send(self: &Arc<Self>, tx: &mut Tx) {
        let rest = &tx.inflight[tx.sent..];
        let (ptr, len) = (rest.as_ptr(), rest.len());
        executor::with(|cx| {
            let key = cx.reactor.insert(Slot::Send(self.clone()));
            let e = match self.fixed {
                Some(i) => opcode::Send::new(types::Fixed(i), ptr, len as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build(),
                None => opcode::Send::new(self.fd(), ptr, len as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build(),
            }
            .user_data(key);
            // SAFETY: `inflight` belongs to this core, which the slot keeps alive; it is
            // not changed while `tx.op` is set (new bytes go to `queued`).
            unsafe { cx.reactor.push(&e) };
            tx.op = Some(key);
        });
    }

    pub(crate) fn send_done(self: Arc<Self>, res: i32) {
        let waker = {
            let mut tx = self.tx.borrow_mut();
            let tx = &mut *tx;
            tx.op = None;
            if res < 0 || tx.failed.is_some() {
                // Failed, or given up (`give_up_sending`): nothing more is sent.
                tx.failed.get_or_insert(-res.min(0));
                tx.inflight.clear();
                tx.queued.clear();
                tx.sent = 0;
            } else {
                tx.sent += res as usize;
                if tx.sent < tx.inflight.len() {
                    self.post_send(tx);
                } else {
                    tx.inflight.clear();
                    tx.sent = 0;
                }
            }
            tx.waiter.take()
        };
        self.start_send();
        if let Some(w) = waker {
            w.wake_by_ref();
            self.tx.borrow_mut().waiter.keep(w);
        }
    }

    fn try_write(self: &Arc<Self>, data: &[u8]) -> io::Result<usize> {
        let (n, idle) = {
            let mut tx = self.tx.borrow_mut();
            if let Some(e) = tx.failed {
                return Err(io::Error::from_raw_os_error(e));
            }
            let room = SEND_LIMIT.saturating_sub(tx.pending());
            if room == 0 && !data.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = data.len().min(room);
            tx.queued.extend_from_slice(&data[..n]);
            (n, tx.op.is_none())
        };
        if idle {
            self.start_send();
        }
        Ok(n)
    }

    /// Ready when `done` holds for the sending side (or it failed).
    fn poll_tx(&self, cx: &mut Context<'_>, done: impl Fn(&Tx) -> bool) -> Poll<io::Result<()>> {
        let mut tx = self.tx.borrow_mut();
        if let Some(e) = tx.failed {
            return Poll::Ready(Err(io::Error::from_raw_os_error(e)));
        }
        if done(&tx) {
            return Poll::Ready(Ok(()));
        }
        tx.waiter.wait(cx.waker());
        Poll::Pending
    }
}

/// The task waiting on one side of a stream. Its waker stays stored after a wake, so the
/// task's next wait there finds it in place instead of cloning it again: that saves a waker
/// clone and drop a completion, each an atomic change of the task's reference count.
/// `waiting` says whether the task waits now, so that a completion nobody waits for wakes
/// nothing.
#[derive(Default)]
struct Waiter {
    waker: Option<Waker>,
    waiting: bool,
}

impl Waiter {
    /// The task of `waker` waits; the stored waker is reused when it wakes the same task.
    fn wait(&mut self, waker: &Waker) {
        match &mut self.waker {
            Some(w) => w.clone_from(waker),
            None => self.waker = Some(waker.clone()),
        }
        self.waiting = true;
    }

    /// The waker to wake, if a task waits: woken outside the side's borrow, then given back
    /// with [`Waiter::keep`].
    fn take(&mut self) -> Option<Waker> {
        if std::mem::take(&mut self.waiting) {
            self.waker.take()
        } else {
            None
        }
    }

    /// Stores a woken waker again, unless another was stored meanwhile.
    fn keep(&mut self, waker: Waker) {
        self.waker.get_or_insert(waker);
    }
}

/// A TCP stream on the ring of the thread that made it (see the module documentation).
pub struct TcpStream {
    core: Arc<Core>,
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStream")
            .field("fd", &self.core.sock.as_raw_fd())
            .finish()
    }
}

impl TcpStream {
    /// Takes over a connected socket, for the runtime of the calling thread.
    ///
    /// # Panics
    /// Outside a runtime.
    pub fn from_std(sock: std::net::TcpStream) -> TcpStream {
        let fixed = executor::with(|cx| cx.reactor.register(sock.as_raw_fd()));
        TcpStream {
            core: Arc::new(Core {
                sock,
                rx: RefCell::new(Rx {
                    buf: Vec::new(),
                    pos: 0,
                    op: None,
                    end: RxEnd::Open,
                    size: RECV_MIN,
                    waiter: Waiter::default(),
                }),
                tx: RefCell::new(Tx {
                    inflight: Vec::new(),
                    sent: 0,
                    op: None,
                    queued: Vec::new(),
                    failed: None,
                    waiter: Waiter::default(),
                }),
                owner: executor::current_remote(),
                lingering: RefCell::new(None),
                fixed,
            }),
        }
    }

    /// Connects to `addr`, with `TCP_NODELAY` set.
    pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        let domain = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: no memory preconditions; the result is checked.
        let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let (storage, len) = sockaddr(addr);
        let storage = Box::new(storage);
        let ptr: *const libc::sockaddr = (&*storage as *const libc::sockaddr_storage).cast();
        let e = opcode::Connect::new(types::Fd(fd.as_raw_fd()), ptr, len);
        // SAFETY: the address is boxed in the operation's slot until its completion.
        let res = unsafe { Op::start(e.build(), Some(Box::new(storage)), |_| {}) }.await;
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        let sock = std::net::TcpStream::from(fd);
        sock.set_nodelay(true)?;
        Ok(TcpStream::from_std(sock))
    }

    /// The runtime the stream belongs to.
    pub fn handle(&self) -> crate::Handle {
        crate::Handle::of(&self.core.owner)
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.core.sock.peer_addr()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.core.sock.local_addr()
    }

    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.core.sock.set_nodelay(on)
    }

    /// Waits until a read would not answer `WouldBlock`: bytes were received, the peer
    /// closed, or receiving failed.
    pub async fn readable(&self) -> io::Result<()> {
        poll_fn(|cx| self.poll_read_ready(cx)).await
    }

    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.core.here() {
            return Poll::Ready(Err(e));
        }
        self.core.poll_readable(cx).map(Ok)
    }

    /// Copies received bytes into `dst`; `Ok(0)` at the end of the stream, `WouldBlock`
    /// when nothing is there yet.
    pub fn try_read(&self, dst: &mut [u8]) -> io::Result<usize> {
        self.core.here()?;
        self.core.read_with(|src| {
            let n = src.len().min(dst.len());
            dst[..n].copy_from_slice(&src[..n]);
            n
        })
    }

    /// As [`try_read`](Self::try_read), appending to `dst`.
    pub fn try_read_buf<B: bytes::BufMut>(&self, dst: &mut B) -> io::Result<usize> {
        self.core.here()?;
        self.core.read_with(|src| {
            let n = src.len().min(dst.remaining_mut());
            dst.put_slice(&src[..n]);
            n
        })
    }

    /// Queues `data` for sending; takes all of it unless [`SEND_LIMIT`] bytes are already
    /// queued (then `WouldBlock`, and [`writable`](Self::writable) says when to retry).
    /// An error of an earlier send is reported here.
    pub fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        self.core.here()?;
        self.core.try_write(data)
    }

    /// Waits until the send queue has room.
    pub async fn writable(&self) -> io::Result<()> {
        self.core.here()?;
        poll_fn(|cx| self.core.poll_tx(cx, |tx| tx.pending() < SEND_LIMIT)).await
    }

    /// Bytes queued and not yet taken by the kernel (0 outside the stream's thread).
    pub fn unsent(&self) -> usize {
        if self.core.here().is_err() {
            return 0;
        }
        self.core.tx.borrow().pending()
    }

    /// Waits until the kernel has taken every queued byte.
    pub async fn flush(&self) -> io::Result<()> {
        self.core.here()?;
        poll_fn(|cx| self.core.poll_tx(cx, |tx| tx.pending() == 0)).await
    }
}

impl Drop for TcpStream {
    fn drop(&mut self) {
        if self.core.here().is_ok() {
            self.core.release();
        } else {
            // Its runtime cancels the receive; if that runtime is gone, the core goes with
            // its queue (and nothing of the kernel's can still name its buffers: a runtime
            // drains its ring before it goes).
            let core = self.core.clone();
            executor::spawn_on(&self.core.owner, async move { core.release() });
        }
    }
}

impl AsRawFd for TcpStream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.core.sock.as_raw_fd()
    }
}

impl tokio::io::AsyncRead for TcpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.core.here() {
            return Poll::Ready(Err(e));
        }
        loop {
            let r = self.core.read_with(|src| {
                let n = src.len().min(buf.remaining());
                buf.put_slice(&src[..n]);
                n
            });
            match r {
                Ok(_) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.core.poll_readable(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl tokio::io::AsyncWrite for TcpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Err(e) = self.core.here() {
            return Poll::Ready(Err(e));
        }
        loop {
            match self.core.try_write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match self.core.poll_tx(cx, |tx| tx.pending() < SEND_LIMIT) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(())) => {}
                    }
                }
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.core.here() {
            return Poll::Ready(Err(e));
        }
        self.core.poll_tx(cx, |tx| tx.pending() == 0)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.core.here() {
            return Poll::Ready(Err(e));
        }
        match self.core.poll_tx(cx, |tx| tx.pending() == 0) {
            Poll::Ready(Ok(())) => Poll::Ready(self.core.sock.shutdown(std::net::Shutdown::Write)),
            other => other,
        }
    }
}

/// A listening TCP socket whose accepts are ring operations.
pub struct TcpListener {
    sock: std::net::TcpListener,
}

impl TcpListener {
    pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
        Ok(TcpListener {
            sock: std::net::TcpListener::bind(addr)?,
        })
    }

    pub fn from_std(sock: std::net::TcpListener) -> TcpListener {
        TcpListener { sock }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// The next connection, with `TCP_NODELAY` set.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let e = opcode::Accept::new(
            types::Fd(self.sock.as_raw_fd()),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .flags(libc::SOCK_CLOEXEC);
        // SAFETY: an accept without an address names no buffer. A socket accepted after
        // the future is gone is closed (`close_fd`).
        let res = unsafe { Op::start(e.build(), None, close_fd) }.await;
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        // SAFETY: the completion hands over a new socket nothing else owns.
        let sock = unsafe { std::net::TcpStream::from_raw_fd(res) };
        sock.set_nodelay(true)?;
        let peer = sock.peer_addr()?;
        Ok((TcpStream::from_std(sock), peer))
    }
}

fn close_fd(res: i32) {
    if res >= 0 {
        // SAFETY: an accepted socket nothing else owns.
        drop(unsafe { OwnedFd::from_raw_fd(res) });
    }
}

/// A one-shot operation awaited as a future; its result is the completion's.
struct Op {
    token: Option<u64>,
}

impl Op {
    /// # Safety
    /// Every buffer the entry names must be owned by `keep` (or outlive the operation).
    unsafe fn start(
        e: io_uring::squeue::Entry,
        keep: Option<Box<dyn std::any::Any>>,
        orphan: fn(i32),
    ) -> Op {
        let token = executor::with(|cx| {
            let token = cx.reactor.insert(Slot::Oneshot(Oneshot {
                result: None,
                waker: None,
                abandoned: false,
                orphan,
                _keep: keep,
            }));
            // SAFETY: the caller's promise; the slot holds `keep`.
            unsafe { cx.reactor.push(&e.user_data(token)) };
            token
        });
        Op { token: Some(token) }
    }
}

impl Future for Op {
    type Output = i32;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i32> {
        let token = self.token.expect("polled after completion");
        let done = executor::with(|rt| {
            let res = rt.reactor.oneshot(token, |o| {
                if o.result.is_none() {
                    o.waker = Some(cx.waker().clone());
                }
                o.result
            });
            match res {
                Some(Some(r)) => {
                    rt.reactor.remove(token);
                    Some(r)
                }
                Some(None) => None,
                // The runtime is shutting down and took the slot.
                None => Some(-libc::ECANCELED),
            }
        });
        match done {
            Some(res) => {
                self.token = None;
                Poll::Ready(res)
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let _ = executor::try_with(|rt| {
            let finished = rt.reactor.oneshot(token, |o| {
                o.abandoned = true;
                o.waker = None;
                o.result
            });
            match finished {
                Some(Some(res)) => {
                    if let Some(Slot::Oneshot(o)) = rt.reactor.remove(token) {
                        (o.orphan)(res);
                    }
                }
                Some(None) => rt.reactor.cancel(token),
                None => {}
            }
        });
    }
}

/// `addr` as a C socket address and its length.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and suitably aligned.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}
