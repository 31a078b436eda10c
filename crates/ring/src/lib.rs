//! A single-threaded executor whose reactor is one io_uring.
//!
//! Tokio waits for readiness: the runtime parks in `epoll_wait`, wakes, and each socket
//! then costs a `recvfrom` or `sendto` of its own, four system calls and a wake-up a
//! relayed statement. Here the loop waits for completions: every receive and send the
//! tasks asked for since the last wait goes to the kernel in the same `io_uring_enter`
//! that waits for the next completion, so with several connections busy one system call
//! stands for many (see `docs/benchmarks.md`, "the system calls' floor").
//!
//! What it offers is what a proxy's session loop needs, in tokio's shapes so the code
//! above can stay generic:
//!
//! - [`Runtime::block_on`] and [`spawn`]: tasks on the calling thread. Their wakers may
//!   be used from any thread (a tokio timer or channel on another thread wakes them through
//!   an eventfd the ring reads).
//! - [`TcpStream`]: a socket whose receive stays posted in the ring across polls, so a
//!   `select!` that drops a read future loses nothing; sends are buffered in the stream and
//!   go out as the kernel takes them (`try_write` accepts up to a bound, `flush` waits for
//!   the kernel to have taken everything). It implements tokio's `AsyncRead` and
//!   `AsyncWrite`, and offers tokio's `readable` / `try_read_buf` / `writable` /
//!   `try_write`.
//! - [`TcpListener`], [`sleep`], and a [`Handle`] that starts tasks on the runtime from
//!   other threads.
//! - Streams are `Send` and `Sync` so that they can sit in structures shared between
//!   threads (a connection pool), but they belong to the thread of the runtime that made
//!   them: used from another thread, their I/O answers an error, and dropped there, the
//!   closing is handed back to their runtime.
//!
//! Linux only (io_uring, 5.11 or later for the wait's timeout; deferred task work is used
//! where the kernel has it, 6.1 or later).

// The ring takes raw pointers into buffers: each buffer is owned by a stream's shared
// core (or an operation's slot), which the slot of every operation naming it keeps alive
// until the operation's completion has been reaped. `reactor.rs` and `net.rs` say so at
// each push.
#![allow(unsafe_code)]

mod executor;
mod fixed;
mod net;
mod reactor;
mod time;

pub use executor::{spawn, Handle, JoinHandle, Runtime};
pub use net::{TcpListener, TcpStream, LINGER, SEND_LIMIT};
pub use time::{sleep, sleep_until, turn_now, Sleep};
