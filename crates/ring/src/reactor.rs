//! The ring: operations in flight, their slots, and the turn that submits and reaps.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::io;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};
use slab::Slab;

use crate::fixed::Indexes;
use crate::net::Core;

/// How long a turn may wait for a completion.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    /// Submit and reap what is there.
    No,
    /// Until this deadline.
    Until(Instant),
    /// Until a completion comes.
    Forever,
}

/// What a completion is for.
pub(crate) enum Slot {
    /// A stream's receive into its buffer.
    Recv(Arc<Core>),
    /// A stream's send of its buffer.
    Send(Arc<Core>),
    /// An operation a future awaits (accept, connect).
    Oneshot(Oneshot),
    /// The read of the executor's eventfd, posted again at each completion.
    Wake,
    /// A cancel request: nothing to do when it completes.
    Cancel,
}

/// An operation a future awaits, and what it must keep alive.
pub(crate) struct Oneshot {
    pub(crate) result: Option<i32>,
    pub(crate) waker: Option<Waker>,
    /// The future was dropped before the completion: the slot goes at the completion,
    /// and `orphan` takes care of what it produced (an accepted socket is closed).
    pub(crate) abandoned: bool,
    pub(crate) orphan: fn(i32),
    /// Memory the operation names (a socket address), freed with the slot.
    pub(crate) _keep: Option<Box<dyn Any>>,
}

/// `IORING_RECVSEND_POLL_FIRST` (linux/io_uring.h).
const RECVSEND_POLL_FIRST: u16 = 1;

pub(crate) struct Reactor {
    ring: RefCell<IoUring>,
    /// Each slot with the tag its token carries: a completion or a cancel that names a
    /// slot since freed and taken again (the slab reuses keys) matches nothing.
    slots: RefCell<Slab<(u32, Slot)>>,
    next_tag: Cell<u32>,
    /// The eventfd's 8 bytes, read by the posted `Wake` operation.
    wake_buf: Box<Cell<u64>>,
    eventfd: i32,
    /// Set by `shutdown`: the eventfd read is not posted again.
    closing: Cell<bool>,
    /// The kernel takes `IORING_RECVSEND_POLL_FIRST` (5.19; known from deferred task
    /// work, 6.1, having been set up).
    poll_first: bool,
    /// The registered sockets' table ([`crate::fixed`]).
    fixed: RefCell<Indexes>,
    /// Where `CLOCK_MONOTONIC` (the clock of `Instant`) stood at an `Instant`, when the
    /// kernel takes a wait's deadline as an absolute time (`IORING_ENTER_ABS_TIMER`,
    /// 6.12): a wait for the next timer then reads no clock.
    monotonic: Option<(Instant, Duration)>,
}

/// Completions taken out of the queue at a time (see `Reactor::reap`).
const REAP_BATCH: usize = 32;

/// The most sockets the table holds (its kernel memory is about 16 bytes an entry).
const FIXED_MAX: u32 = 1 << 16;

impl Reactor {
    pub(crate) fn new(entries: u32, eventfd: i32) -> io::Result<Reactor> {
        // Deferred task work (6.1+) keeps the kernel from interrupting the thread to post
        // completions: they are posted when it next enters the ring to wait.
        let deferred = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .build(entries);
        let poll_first = deferred.is_ok();
        let ring = deferred
            .or_else(|_| IoUring::builder().setup_coop_taskrun().build(entries))
            .or_else(|_| IoUring::new(entries))?;
        // A sparse table (5.19); without one every socket is named by its descriptor.
        let size = crate::fixed::table_size(FIXED_MAX);
        let size = if size > 0 && ring.submitter().register_files_sparse(size).is_ok() {
            size
        } else {
            0
        };
        let monotonic = monotonic_base(&ring);
        let r = Reactor {
            ring: RefCell::new(ring),
            slots: RefCell::new(Slab::with_capacity(256)),
            next_tag: Cell::new(0),
            wake_buf: Box::new(Cell::new(0)),
            eventfd,
            closing: Cell::new(false),
            poll_first,
            fixed: RefCell::new(Indexes::new(size)),
            monotonic,
        };
        r.post_wake_read(None);
        Ok(r)
    }

    fn post_wake_read(&self, token: Option<u64>) {
        let token = token.unwrap_or_else(|| self.insert(Slot::Wake));
        let e = opcode::Read::new(types::Fd(self.eventfd), self.wake_buf.as_ptr().cast(), 8)
            .build()
            .user_data(token);
        // SAFETY: the buffer is the reactor's boxed u64, which outlives the ring (the
        // ring is dropped first, in field order, after `shutdown` reaped everything).
        unsafe { self.push(&e) };
    }

    /// The `ioprio` of a receive posted when the socket is most likely empty (every byte
    /// it had was read): wait for data before trying to read, which skips a receive
    /// attempt that would find nothing.
    pub(crate) fn recv_ioprio(&self) -> u16 {
        if self.poll_first {
            RECVSEND_POLL_FIRST
        } else {
            0
        }
    }

    /// Puts the socket `fd` in the table; its index, or `None` when the table has no
    /// room (or the kernel refused it): then the socket is named by `fd`.
    pub(crate) fn register(&self, fd: std::os::fd::RawFd) -> Option<u32> {
        let index = self.fixed.borrow_mut().take()?;
        let done = self
            .ring
            .try_borrow()
            .ok()
            .and_then(|ring| ring.submitter().register_files_update(index, &[fd]).ok());
        if done == Some(1) {
            Some(index)
        } else {
            self.fixed.borrow_mut().give_back(index);
            None
        }
    }

    /// Takes the socket at `index` out of the table (no operation of it is in flight),
    /// now, or at the next turn if the ring is in use.
    pub(crate) fn unregister(&self, index: u32) {
        let done = self
            .ring
            .try_borrow()
            .ok()
            .is_some_and(|ring| ring.submitter().register_files_update(index, &[-1]).is_ok());
        let mut fixed = self.fixed.borrow_mut();
        if done {
            fixed.give_back(index);
        } else {
            fixed.defer_close(index);
        }
    }

    /// How many sockets are in the table.
    pub(crate) fn registered(&self) -> usize {
        self.fixed.borrow().in_table()
    }

    /// Takes out of the table the sockets whose removal had to wait. One that the
    /// kernel does not let go is kept out of use.
    fn unregister_deferred(&self) {
        if !self.fixed.borrow().has_closing() {
            return;
        }
        let closing = self.fixed.borrow_mut().take_closing();
        let ring = self.ring.borrow();
        for index in closing {
            if ring.submitter().register_files_update(index, &[-1]).is_ok() {
                self.fixed.borrow_mut().give_back(index);
            }
        }
    }

    /// Takes a slot and returns its token, for an entry to carry as its user data.
    pub(crate) fn insert(&self, slot: Slot) -> u64 {
        let tag = self.next_tag.get().wrapping_add(1);
        self.next_tag.set(tag);
        let key = self.slots.borrow_mut().insert((tag, slot));
        (u64::from(tag) << 32) | key as u64
    }

    /// Queues an entry for the next submission (submitting now if the queue is full).
    ///
    /// # Safety
    /// Every buffer the entry names must stay valid and unmoved until the entry's
    /// completion has been reaped: the entry's slot must own it, or own what owns it.
    pub(crate) unsafe fn push(&self, e: &squeue::Entry) {
        let mut ring = self.ring.borrow_mut();
        loop {
            // SAFETY: the caller's promise.
            if unsafe { ring.submission().push(e) }.is_ok() {
                return;
            }
            // Full: hand the kernel what is queued, and try again.
            if let Err(err) = ring.submit() {
                if err.raw_os_error() != Some(libc::EBUSY)
                    && err.kind() != io::ErrorKind::Interrupted
                {
                    panic!("pgfresh-ring: io_uring_enter failed: {err}");
                }
            }
        }
    }

    /// Asks the kernel to cancel the operation of slot `key`; its completion comes
    /// with -ECANCELED (or its result, if it finished first).
    pub(crate) fn cancel(&self, token: u64) {
        let me = self.insert(Slot::Cancel);
        let e = opcode::AsyncCancel::new(token).build().user_data(me);
        // SAFETY: a cancel names no buffer.
        unsafe { self.push(&e) };
    }

    /// Runs `f` on the oneshot of `token`; `None` if it is gone (the runtime shut down).
    pub(crate) fn oneshot<R>(&self, token: u64, f: impl FnOnce(&mut Oneshot) -> R) -> Option<R> {
        match self.slots.borrow_mut().get_mut(key_of(token)) {
            Some((tag, Slot::Oneshot(o))) if *tag == tag_of(token) => Some(f(o)),
            _ => None,
        }
    }

    /// Frees the slot of `token` (if it is still that token's).
    pub(crate) fn remove(&self, token: u64) -> Option<Slot> {
        let mut slots = self.slots.borrow_mut();
        match slots.get(key_of(token)) {
            Some((tag, _)) if *tag == tag_of(token) => Some(slots.remove(key_of(token)).1),
            _ => None,
        }
    }

    /// Submits what was queued, waits as `wait` says, and handles the completions. True
    /// when a timed wait ran its whole time (no completion came first).
    pub(crate) fn turn(&self, wait: Wait) -> bool {
        self.unregister_deferred();
        let timed_out = {
            let ring = self.ring.borrow();
            let submitter = ring.submitter();
            let r = match wait {
                Wait::No => {
                    let n = ring_pending(&ring);
                    // SAFETY: no extra argument; GETEVENTS runs deferred task work so the
                    // completions already due are posted without waiting for more.
                    unsafe {
                        submitter.enter::<libc::sigset_t>(
                            n,
                            0,
                            io_uring::EnterFlags::GETEVENTS.bits(),
                            None,
                        )
                    }
                }
                Wait::Forever => submitter.submit_and_wait(1),
                Wait::Until(at) => {
                    // An absolute time where the kernel takes one, else the time left.
                    let (deadline, flags) = match self.monotonic {
                        Some((base, on_clock)) => (
                            on_clock + at.saturating_duration_since(base),
                            io_uring::EnterFlags::ABS_TIMER,
                        ),
                        None => (
                            at.saturating_duration_since(crate::time::turn_now()),
                            io_uring::EnterFlags::empty(),
                        ),
                    };
                    let ts = types::Timespec::from(deadline);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    submitter.submit_with_args_and_flags(1, &args, flags)
                }
            };
            match r {
                Ok(_) => false,
                Err(e) => match e.raw_os_error() {
                    Some(libc::ETIME) => true,
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN) => false,
                    _ => panic!("pgfresh-ring: io_uring_enter failed: {e}"),
                },
            }
        };
        self.reap();
        timed_out
    }

    fn reap(&self) {
        // Taken out of the queue a batch at a time, then handled: handling a completion can
        // push entries, which needs the ring that the completion queue borrows. (One
        // queue view a batch, not one a completion: each reads the kernel's tail and
        // writes the head back.)
        let mut batch = [(0u64, 0i32); REAP_BATCH];
        loop {
            let n = {
                let mut ring = self.ring.borrow_mut();
                let mut n = 0;
                for (slot, c) in batch.iter_mut().zip(ring.completion()) {
                    *slot = (c.user_data(), c.result());
                    n += 1;
                }
                n
            };
            for &(token, res) in &batch[..n] {
                self.complete(token, res);
            }
            if n < REAP_BATCH {
                return;
            }
        }
    }

    fn complete(&self, token: u64, res: i32) {
        let mut slots = self.slots.borrow_mut();
        let key = key_of(token);
        match slots.get_mut(key) {
            Some((tag, _)) if *tag != tag_of(token) => {}
            Some((_, Slot::Oneshot(o))) if !o.abandoned => {
                o.result = Some(res);
                let waker = o.waker.take();
                drop(slots);
                if let Some(w) = waker {
                    w.wake();
                }
            }
            Some((_, Slot::Wake)) if !self.closing.get() => {
                drop(slots);
                self.post_wake_read(Some(token));
            }
            Some(_) => {
                let (_, slot) = slots.remove(key);
                drop(slots);
                match slot {
                    Slot::Recv(core) => core.recv_done(res),
                    Slot::Send(core) => core.send_done(res),
                    Slot::Oneshot(o) => (o.orphan)(res),
                    Slot::Wake | Slot::Cancel => {}
                }
            }
            None => {}
        }
    }

    /// Cancels every operation in flight and waits for their completions, so no buffer
    /// is freed while the kernel may still write it. Operations that do not complete
    /// within a second leave their slots (and buffers) leaked rather than freed.
    pub(crate) fn shutdown(&self) {
        self.closing.set(true);
        let tokens: Vec<u64> = self
            .slots
            .borrow()
            .iter()
            .filter(|(_, (_, s))| in_flight(s))
            .map(|(k, (tag, _))| (u64::from(*tag) << 32) | k as u64)
            .collect();
        for t in tokens {
            self.cancel(t);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while self.slots.borrow().iter().any(|(_, (_, s))| in_flight(s))
            && std::time::Instant::now() < deadline
        {
            let _ = self.turn(Wait::Until(Instant::now() + Duration::from_millis(10)));
        }
        let leftover = std::mem::take(&mut *self.slots.borrow_mut());
        if leftover.iter().any(|(_, (_, s))| in_flight(s)) {
            std::mem::forget(leftover);
        }
    }
}

/// Whether the kernel may still hold the slot's operation.
fn in_flight(slot: &Slot) -> bool {
    match slot {
        Slot::Oneshot(o) => o.result.is_none(),
        Slot::Recv(_) | Slot::Send(_) | Slot::Wake => true,
        Slot::Cancel => false,
    }
}

fn key_of(token: u64) -> usize {
    (token & u64::from(u32::MAX)) as usize
}

fn tag_of(token: u64) -> u32 {
    (token >> 32) as u32
}

/// Entries queued and not yet submitted.
fn ring_pending(ring: &IoUring) -> u32 {
    // SAFETY: reading the queue's length; the ring is borrowed, nothing pushes meanwhile.
    unsafe { ring.submission_shared().len() as u32 }
}

/// `(at, on_clock)`: `CLOCK_MONOTONIC` read `on_clock` at the instant `at` or after, when
/// the kernel takes absolute deadlines for a wait; None when it does not (before 6.12: the
/// probe, a wait for a deadline long past, fails with `EINVAL` instead of `ETIME`). A
/// deadline put on the clock this way is late by the few nanoseconds between the two
/// reads, never early. (`Instant` reads `CLOCK_MONOTONIC` on Linux.)
fn monotonic_base(ring: &IoUring) -> Option<(Instant, Duration)> {
    let past = types::Timespec::new();
    let args = types::SubmitArgs::new().timespec(&past);
    let probe =
        ring.submitter()
            .submit_with_args_and_flags(1, &args, io_uring::EnterFlags::ABS_TIMER);
    if probe.err()?.raw_os_error() != Some(libc::ETIME) {
        return None;
    }
    let at = Instant::now();
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write into.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return None;
    }
    Some((at, Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)))
}
