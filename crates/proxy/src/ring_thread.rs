//! The io_uring engine (`[proxy] io_engine = "io_uring"`, or `"auto"` with
//! `worker_threads = 0`): the thread whose pgfresh-ring runtime runs every client session.
//!
//! The listener accepts on tokio and hands each socket over; the session, its client
//! socket and the server connections it opens then live on this thread, whose loop waits
//! in `io_uring_enter` (see `docs/benchmarks.md`), and so do the standbys' fast replay
//! polls (`pgfresh_balancer::Balancer::start_on`). Everything else stays on tokio: the
//! monitor's full polls, the admin API, the WAL feeds, timers. The thread enters tokio's runtime, so a
//! session's `tokio::time` and `tokio::spawn` work as before (a timer or task there wakes
//! the ring through an eventfd).

use tokio::sync::oneshot;

/// The running thread; once it is dropped, the runtime ends with the last task on it (the
/// sessions, and the fast replay polls, which end with the balancer).
pub struct RingThread {
    pub handle: pgfresh_ring::Handle,
    _stop: oneshot::Sender<()>,
}

impl RingThread {
    /// The sessions' ring if `proxy.io_engine` wants one (`auto`: with `worker_threads =
    /// 0`) and the kernel sets it up; `None`: the sessions run on tokio's epoll. Says
    /// which in the log.
    pub fn for_config(proxy: &pgfresh_config::ProxySection) -> Option<RingThread> {
        let engine = proxy.io_engine;
        if !engine.wants_ring(proxy.worker_threads) {
            tracing::info!(io_engine = engine.as_str(), "client sessions run on epoll");
            return None;
        }
        match RingThread::start() {
            Ok(r) => {
                tracing::info!(
                    io_engine = engine.as_str(),
                    "client sessions run on io_uring"
                );
                Some(r)
            }
            Err(e) if engine == pgfresh_config::IoEngine::IoUring => {
                tracing::error!(error = %e, "io_engine = \"io_uring\": cannot set up an io_uring; client sessions run on epoll");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "io_engine = \"auto\": cannot set up an io_uring (a kernel before 6.1, or io_uring disabled or filtered); client sessions run on epoll");
                None
            }
        }
    }

    /// Starts the thread, inside the tokio runtime of the caller.
    pub fn start() -> std::io::Result<RingThread> {
        let tokio = tokio::runtime::Handle::current();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("pgfresh-ring".into())
            .spawn(move || {
                let _tokio = tokio.enter();
                let rt = match pgfresh_ring::Runtime::new(4096) {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let handle = rt.handle();
                let _ = ready_tx.send(Ok(handle.clone()));
                // Until the proxy is dropped (its sender with it), and then until the
                // tasks still running have ended: a session told to shut down says so
                // to its client (57P01) before it goes, as it does on tokio; the fast
                // replay polls end with the balancer.
                rt.block_on(async move {
                    let _ = stop_rx.await;
                    while handle.tasks() > 0 {
                        pgfresh_ring::sleep(std::time::Duration::from_millis(10)).await;
                    }
                });
            })?;
        let handle = ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the ring thread ended before it started"))??;
        Ok(RingThread {
            handle,
            _stop: stop_tx,
        })
    }
}
