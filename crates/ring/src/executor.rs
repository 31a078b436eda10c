//! Tasks, their queues, and the loop that runs them and waits in the ring.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::Duration;
use std::time::Instant;

use async_task::{Runnable, Task};

use crate::reactor::{Reactor, Wait};
use crate::time::Timers;

/// Tasks run between two looks at the ring while others keep being woken.
const BATCH: usize = 128;

/// What other threads share with a runtime: the tasks they woke, and how to wake it.
pub(crate) struct Remote {
    queue: Mutex<Vec<Runnable>>,
    /// Whether `queue` may hold tasks: the loop looks here, not at the lock, each turn.
    queued: AtomicBool,
    /// Tasks spawned and not yet finished or dropped.
    tasks: AtomicUsize,
    /// Set while the loop waits in the ring (or is about to): a wake from another
    /// thread must then write the eventfd, whose read the ring keeps posted.
    parked: AtomicBool,
    eventfd: OwnedFd,
}

impl Remote {
    fn push(&self, r: Runnable) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push(r);
        self.queued.store(true, Ordering::SeqCst);
        self.unpark();
    }

    fn unpark(&self) {
        // SeqCst pairs with the loop's store of `parked` before its last look at the
        // queue: either it sees what was pushed, or this sees it parked.
        if self.parked.load(Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd this struct owns.
            let _ = unsafe {
                libc::write(
                    self.eventfd.as_raw_fd(),
                    (&one as *const u64).cast(),
                    std::mem::size_of::<u64>(),
                )
            };
        }
    }

    /// Moves the tasks other threads woke to `into`.
    fn take_into(&self, into: &mut VecDeque<Runnable>) {
        if self.queued.swap(false, Ordering::SeqCst) {
            into.extend(
                self.queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .drain(..),
            );
        }
    }

    fn has_work(&self) -> bool {
        self.queued.load(Ordering::SeqCst)
    }
}

/// A runtime's state on its own thread.
pub(crate) struct Context {
    queue: RefCell<VecDeque<Runnable>>,
    remote: Arc<Remote>,
    pub(crate) reactor: Reactor,
    pub(crate) timers: RefCell<Timers>,
    /// How long a dropped stream's unsent bytes may take ([`Runtime::set_linger`]).
    pub(crate) linger: Cell<Duration>,
    /// Waits for a deadline ended by a completion since the timers were last fired by
    /// the clock (see `park`).
    waits_since_check: Cell<u32>,
}

/// A wait for the next deadline that a completion ended fires the timers by the clock
/// once in this many (see `Context::park`).
const CLOCK_CHECK: u32 = 64;

thread_local! {
    static CURRENT: RefCell<Option<Rc<Context>>> = const { RefCell::new(None) };
    /// The address of `CURRENT`'s `Remote` (0 outside a runtime): what a stream compares
    /// with its owner's on every call, cheaper than borrowing `CURRENT`.
    static CURRENT_ID: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f` with the runtime this thread is running.
///
/// # Panics
/// Outside [`Runtime::block_on`].
pub(crate) fn with<R>(f: impl FnOnce(&Context) -> R) -> R {
    CURRENT.with(|c| {
        let cx = c.borrow();
        f(cx.as_ref()
            .expect("pgfresh-ring: used outside Runtime::block_on"))
    })
}

/// As [`with`], or `None` outside a runtime (or while the thread is being torn down).
pub(crate) fn try_with<R>(f: impl FnOnce(&Context) -> R) -> Option<R> {
    CURRENT
        .try_with(|c| c.try_borrow().ok()?.as_ref().map(|cx| f(cx)))
        .ok()
        .flatten()
}

/// This thread is running a ring runtime.
pub(crate) fn in_runtime() -> bool {
    CURRENT_ID.try_with(Cell::get).unwrap_or(0) != 0
}

fn schedule(remote: &Arc<Remote>, r: Runnable) {
    let r = CURRENT.with(|c| match c.borrow().as_ref() {
        Some(cx) if Arc::ptr_eq(&cx.remote, remote) => {
            cx.queue.borrow_mut().push_back(r);
            None
        }
        _ => Some(r),
    });
    if let Some(r) = r {
        remote.push(r);
    }
}

/// A handle to a spawned task: awaiting it gives its output. Dropping it detaches the
/// task (it runs on), as tokio's does.
pub struct JoinHandle<T>(Option<Task<T>>);

impl<T> Future for JoinHandle<T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<T> {
        let task = self.0.as_mut().expect("polled after completion");
        let out = Pin::new(task).poll(cx);
        if out.is_ready() {
            self.0 = None;
        }
        out
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.detach();
        }
    }
}

/// Whether the calling thread is running the runtime `remote` belongs to.
pub(crate) fn is_current(remote: &Arc<Remote>) -> bool {
    CURRENT_ID.try_with(Cell::get).unwrap_or(0) == Arc::as_ptr(remote) as usize
}

/// The calling thread's runtime, as other threads reach it.
pub(crate) fn current_remote() -> Arc<Remote> {
    with(|cx| cx.remote.clone())
}

/// Starts `future` on the runtime `remote` belongs to, from any thread.
pub(crate) fn spawn_on<F>(remote: &Arc<Remote>, future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let remote = remote.clone();
    let future = Counted::new(&remote, future);
    let (runnable, task) = async_task::spawn(future, move |r| schedule(&remote, r));
    runnable.schedule();
    JoinHandle(Some(task))
}

/// A runtime as other threads reach it: to start tasks there.
#[derive(Clone)]
pub struct Handle {
    remote: Arc<Remote>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").finish_non_exhaustive()
    }
}

impl Handle {
    pub(crate) fn of(remote: &Arc<Remote>) -> Handle {
        Handle {
            remote: remote.clone(),
        }
    }

    /// The runtime of the calling thread, if it runs one.
    pub fn try_current() -> Option<Handle> {
        try_with(|cx| Handle {
            remote: cx.remote.clone(),
        })
    }

    /// Starts `future` on this runtime; callable from any thread.
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        spawn_on(&self.remote, future)
    }

    /// Tasks spawned on this runtime that have neither finished nor been dropped.
    pub fn tasks(&self) -> usize {
        self.remote.tasks.load(Ordering::Acquire)
    }

    /// Whether the calling thread is the one running this runtime.
    pub fn is_current(&self) -> bool {
        is_current(&self.remote)
    }
}

/// A spawned future, counted in its runtime's `tasks` from its spawn to its drop.
struct Counted<F> {
    future: Pin<Box<F>>,
    remote: Arc<Remote>,
}

impl<F> Counted<F> {
    fn new(remote: &Arc<Remote>, future: F) -> Counted<F> {
        remote.tasks.fetch_add(1, Ordering::AcqRel);
        Counted {
            future: Box::pin(future),
            remote: remote.clone(),
        }
    }
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<F::Output> {
        self.future.as_mut().poll(cx)
    }
}

impl<F> Drop for Counted<F> {
    fn drop(&mut self) {
        self.remote.tasks.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts `future` on the runtime of the calling thread.
///
/// # Panics
/// Outside [`Runtime::block_on`].
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let remote = with(|cx| cx.remote.clone());
    let future = Counted::new(&remote, future);
    let (runnable, task) = async_task::spawn_local(future, move |r| schedule(&remote, r));
    runnable.schedule();
    JoinHandle(Some(task))
}

/// The waker of the future `block_on` runs.
struct MainWake {
    woken: AtomicBool,
    remote: Arc<Remote>,
}

impl Wake for MainWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.remote.unpark();
    }
}

/// A runtime: one io_uring and the tasks it drives, on the thread that made it.
pub struct Runtime {
    cx: Rc<Context>,
}

impl Runtime {
    /// A runtime with a ring of `entries` submission entries (rounded up to a power of
    /// two), on the calling thread; it must run there (the ring has a single issuer).
    pub fn new(entries: u32) -> io::Result<Runtime> {
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let reactor = Reactor::new(entries, eventfd.as_raw_fd())?;
        Ok(Runtime {
            cx: Rc::new(Context {
                queue: RefCell::new(VecDeque::new()),
                remote: Arc::new(Remote {
                    queue: Mutex::new(Vec::new()),
                    queued: AtomicBool::new(false),
                    tasks: AtomicUsize::new(0),
                    parked: AtomicBool::new(false),
                    eventfd,
                }),
                reactor,
                timers: RefCell::new(Timers::default()),
                linger: Cell::new(crate::net::LINGER),
                waits_since_check: Cell::new(0),
            }),
        })
    }

    /// How long the bytes a dropped stream still had queued may take to reach the kernel
    /// before its send is cancelled and its socket closed ([`crate::net::LINGER`] unless
    /// set). Streams dropped from then on use it.
    pub fn set_linger(&self, linger: Duration) {
        self.cx.linger.set(linger);
    }

    /// How many sockets are in the ring's table of registered sockets now (those that
    /// operations name by index rather than by descriptor; see the crate's `fixed`).
    pub fn registered_sockets(&self) -> usize {
        self.cx.reactor.registered()
    }

    /// How other threads reach this runtime.
    pub fn handle(&self) -> Handle {
        Handle {
            remote: self.cx.remote.clone(),
        }
    }

    /// Runs `future` to completion, and the spawned tasks beside it.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let _entered = Enter::new(self.cx.clone());
        let main = Arc::new(MainWake {
            woken: AtomicBool::new(true),
            remote: self.cx.remote.clone(),
        });
        let waker = Waker::from(main.clone());
        let mut tcx = TaskContext::from_waker(&waker);
        let mut future = pin!(future);
        let cx = &self.cx;
        loop {
            crate::time::new_turn();
            if main.woken.swap(false, Ordering::SeqCst) {
                if let Poll::Ready(v) = future.as_mut().poll(&mut tcx) {
                    return v;
                }
            }
            let ran = cx.run_batch();
            cx.remote.take_into(&mut cx.queue.borrow_mut());
            let busy =
                ran == BATCH || !cx.queue.borrow().is_empty() || main.woken.load(Ordering::SeqCst);
            // A turn that waited for a deadline and was ended by a completion before it
            // leaves the timers as they were: the clock is not read for them (a deadline
            // passed meanwhile is found by the next wait, which then does not wait). A
            // turn that did not wait fires them by the turn's clock: late by at most the
            // time its tasks ran, never early.
            if busy {
                let _ = cx.reactor.turn(Wait::No);
                cx.timers.borrow_mut().fire(crate::time::turn_now);
            } else if cx.park(&main.woken) {
                cx.timers.borrow_mut().fire(Instant::now);
            }
        }
    }
}

impl Context {
    /// Runs up to `BATCH` woken tasks; returns how many ran.
    fn run_batch(&self) -> usize {
        let mut ran = 0;
        while ran < BATCH {
            let Some(r) = self.queue.borrow_mut().pop_front() else {
                break;
            };
            // A task that panics is gone (its panic reported by the hook); the others
            // go on, as on tokio.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.run()));
            ran += 1;
        }
        ran
    }

    /// Waits in the ring for a completion, the next timer, or a wake from another thread.
    /// Returns whether a timer may be due: the wait ran until the earliest deadline (or
    /// that had passed already), the wait was skipped, or the timers' clock check is due.
    fn park(&self, main_woken: &AtomicBool) -> bool {
        self.remote.parked.store(true, Ordering::SeqCst);
        if self.remote.has_work() || main_woken.load(Ordering::SeqCst) {
            self.remote.parked.store(false, Ordering::SeqCst);
            let _ = self.reactor.turn(Wait::No);
            return true;
        }
        let next = self.timers.borrow().next();
        let due = match next {
            // The wait ends at the deadline, or at a completion before it. One that came
            // first leaves the timers as they were (the clock is not read for them: a
            // deadline passed meanwhile ends the next wait at once), except every
            // `CLOCK_CHECK`th time: under a load that always has a completion waiting, a
            // passed deadline is found that many waits late at most.
            Some(at) => {
                let checks = self.waits_since_check.get() + 1;
                self.waits_since_check.set(checks % CLOCK_CHECK);
                self.reactor.turn(Wait::Until(at)) || checks == CLOCK_CHECK
            }
            None => {
                let _ = self.reactor.turn(Wait::Forever);
                false
            }
        };
        self.remote.parked.store(false, Ordering::SeqCst);
        due
    }
}

/// Installs a runtime as the thread's current one for a `block_on`, and tears its tasks
/// down when the last `block_on` of a dropped runtime leaves.
struct Enter {
    previous: Option<Rc<Context>>,
    previous_id: usize,
}

impl Enter {
    fn new(cx: Rc<Context>) -> Enter {
        let previous_id = CURRENT_ID.with(|c| c.replace(Arc::as_ptr(&cx.remote) as usize));
        let previous = CURRENT.with(|c| c.borrow_mut().replace(cx));
        Enter {
            previous,
            previous_id,
        }
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        crate::time::new_turn();
        let previous = self.previous.take();
        CURRENT_ID.with(|c| c.set(self.previous_id));
        let _ = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), previous));
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Tasks still queued or waiting are dropped here, inside the runtime (their
        // futures' drops may cancel operations). Operations the kernel still holds are
        // cancelled and waited for, so no buffer they name is freed under them.
        let _entered = Enter::new(self.cx.clone());
        for _ in 0..3 {
            let queued: Vec<Runnable> = self.cx.queue.borrow_mut().drain(..).collect();
            drop(queued);
            let mut remote = VecDeque::new();
            self.cx.remote.take_into(&mut remote);
            drop(remote);
            let timers = self.cx.timers.borrow_mut().take_all();
            drop(timers);
        }
        self.cx.reactor.shutdown();
        let queued: Vec<Runnable> = self.cx.queue.borrow_mut().drain(..).collect();
        drop(queued);
    }
}
