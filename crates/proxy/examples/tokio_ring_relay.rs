//! Can a tokio proxy have io_uring's system calls without leaving tokio? The byte relay of
//! `bare_relay` (no parsing, no routing, one server connection per client), on the same
//! single-threaded tokio runtime, with its socket reads and writes made through one
//! io_uring instead of readiness and `recv`/`send`:
//!
//! - each receive and send is an entry on the thread's ring, awaited as a future;
//! - the entries are handed to the kernel in one `io_uring_enter` when the runtime is about
//!   to park (`on_thread_park`), and completions already there are taken then too, so a
//!   turn that finds some does not park at all;
//! - the ring runs with deferred task work (completions are posted on this thread when it
//!   enters the ring, never by interrupting it) and signals an eventfd that tokio's epoll
//!   watches, so a completion that arrives while the runtime waits wakes it like any
//!   socket would.
//!
//! So a busy turn costs one `io_uring_enter` and one `epoll_wait` for all clients together,
//! against two `recvfrom`, two `sendto` and part of an `epoll_wait` a statement on epoll.
//! Timers, channels and every other tokio socket keep working. `bench/pgbench-compare.sh`
//! (target `tokio-ring-relay`) sets its CPU a statement beside the tokio relay's, the
//! io_uring relay's (`uring_relay`, no runtime) and PgBouncer's. Measured (docs/
//! benchmarks.md, the twelfth round): a third of the tokio relay's system calls and no
//! less CPU a statement; the ring relay that waits in `io_uring_enter` itself is cheaper.
//!
//!   cargo run --release -p pgfresh-proxy --example tokio_ring_relay -- LISTEN_ADDR SERVER_ADDR

// The ring takes raw buffer pointers: each buffer lives in its relay's future, which is
// never dropped before the operations naming it have completed (every `op` is awaited to
// its end, and the runtime is never shut down with relays running).
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::task::{Poll, Waker};

use io_uring::{opcode, squeue, types, IoUring};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};

const BUF: usize = 64 * 1024;
/// `IORING_ENTER_GETEVENTS`.
const GETEVENTS: u32 = 1;

/// One operation on the ring: its waiting task and, once completed, its result.
#[derive(Default)]
struct Slot {
    waker: Option<Waker>,
    result: Option<i32>,
}

/// The thread's ring and the operations on it, by user data (an index into `slots`).
struct Ring {
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<usize>,
}

thread_local! {
    static RING: RefCell<Option<Ring>> = const { RefCell::new(None) };
}

impl Ring {
    /// Queue `entry`; it reaches the kernel at the next submit.
    fn push(&mut self, entry: squeue::Entry) -> usize {
        let id = self.free.pop().unwrap_or_else(|| {
            self.slots.push(Slot::default());
            self.slots.len() - 1
        });
        let entry = entry.user_data(id as u64);
        // SAFETY: the buffer the entry names outlives the operation (see the crate note).
        while unsafe { self.ring.submission().push(&entry) }.is_err() {
            let _ = self.ring.submit();
        }
        id
    }

    /// Hand queued entries to the kernel and take every completion already posted.
    fn turn(&mut self) {
        let queued = self.ring.submission().len() as u32;
        // With deferred task work, completions are posted only when the ring is entered
        // asking for events: this one call submits and posts them.
        // SAFETY: no argument is passed.
        let _ = unsafe {
            self.ring
                .submitter()
                .enter::<libc::sigset_t>(queued, 0, GETEVENTS, None)
        };
        self.reap();
    }

    fn reap(&mut self) {
        for cqe in self.ring.completion() {
            let slot = &mut self.slots[cqe.user_data() as usize];
            slot.result = Some(cqe.result());
            if let Some(w) = slot.waker.take() {
                // Only schedules the task: nothing runs under this borrow.
                w.wake();
            }
        }
    }
}

fn with_ring<T>(f: impl FnOnce(&mut Ring) -> T) -> T {
    RING.with(|r| f(r.borrow_mut().as_mut().expect("ring installed")))
}

/// Run one operation on the ring and wait for its result.
async fn op(entry: squeue::Entry) -> i32 {
    let id = with_ring(|r| r.push(entry));
    poll_fn(|cx| {
        with_ring(|r| {
            let slot = &mut r.slots[id];
            match slot.result.take() {
                Some(res) => {
                    slot.waker = None;
                    r.free.push(id);
                    Poll::Ready(res)
                }
                None => {
                    match &slot.waker {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        _ => slot.waker = Some(cx.waker().clone()),
                    }
                    Poll::Pending
                }
            }
        })
    })
    .await
}

/// Bytes from `from` to `to` until either end closes.
async fn pump(from: RawFd, to: RawFd) {
    let mut buf = vec![0u8; BUF].into_boxed_slice();
    loop {
        let n = op(opcode::Recv::new(types::Fd(from), buf.as_mut_ptr(), BUF as u32).build()).await;
        if n <= 0 {
            return;
        }
        let n = n as usize;
        let mut sent = 0;
        while sent < n {
            let rest = &buf[sent..n];
            let m = op(opcode::Send::new(types::Fd(to), rest.as_ptr(), rest.len() as u32).build())
                .await;
            if m <= 0 {
                return;
            }
            sent += m as usize;
        }
    }
}

async fn relay(client: TcpStream, server: String) {
    let Ok(upstream) = TcpStream::connect(&server).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    // Out of tokio's reactor: the ring does their I/O from here on. They stay non-blocking;
    // the ring waits for a socket's readiness itself either way.
    let (Ok(client), Ok(upstream)) = (client.into_std(), upstream.into_std()) else {
        return;
    };
    let (c, s) = (client.as_raw_fd(), upstream.as_raw_fd());
    // Either direction ending ends both: the other's pending receive then completes.
    let close = || {
        let _ = upstream.shutdown(Shutdown::Both);
        let _ = client.shutdown(Shutdown::Both);
    };
    tokio::join!(
        async {
            pump(c, s).await;
            close()
        },
        async {
            pump(s, c).await;
            close()
        },
    );
}

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(server)) = (args.next(), args.next()) else {
        eprintln!("usage: tokio_ring_relay LISTEN_ADDR SERVER_ADDR");
        std::process::exit(2);
    };
    // Deferred task work: completions are posted on this thread, in `Ring::turn`, never by
    // interrupting it. The ring signals an eventfd when work is waiting, and that eventfd
    // is what tokio's epoll watches (edge-triggered: each signal is a new edge, so it is
    // never read).
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(1024)?;
    // SAFETY: plain system call; the descriptor is owned from here on.
    let wake_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if wake_fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `eventfd` returned a new descriptor nothing else owns.
    let wake_fd = unsafe { OwnedFd::from_raw_fd(wake_fd) };
    ring.submitter().register_eventfd(wake_fd.as_raw_fd())?;
    RING.with(|r| {
        *r.borrow_mut() = Some(Ring {
            ring,
            slots: Vec::new(),
            free: Vec::new(),
        })
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(|| {
            RING.with(|r| r.borrow_mut().as_mut().map(Ring::turn))
                .unwrap_or(())
        })
        .build()?;
    runtime.block_on(async move {
        // SAFETY: the eventfd stays open, owned by the `AsyncFd`, for its whole life.
        let wake = unsafe { AsyncFd::register_with_interest(wake_fd, Interest::READABLE) }
            .map_err(io::Error::from)?;
        tokio::spawn(async move {
            loop {
                let Ok(mut ready) = wake.readable().await else {
                    return;
                };
                // Completions that came while the runtime waited in epoll.
                with_ring(Ring::turn);
                ready.clear_ready();
            }
        });
        let listener = TcpListener::bind(&listen).await?;
        loop {
            let (client, _) = listener.accept().await?;
            tokio::spawn(relay(client, server.clone()));
        }
    })
}
