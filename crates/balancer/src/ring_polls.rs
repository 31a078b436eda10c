//! The fast replay polls on the sessions' pgfresh-ring thread (`[proxy] io_engine =
//! "io_uring"`, [`crate::Balancer::start_on`]).
//!
//! Between two full polls a standby's fast polls run every `replay_check_period`
//! (milliseconds) while reads wait on replay positions, and every commit a session notes
//! may wake them ([`crate::demand`]). On tokio, each of those is a wake-up of a tokio
//! thread that is otherwise idle while the sessions run on the ring; on a loaded machine
//! it comes late, so positions were learned less often than on epoll. Here the polls are
//! one more task of the ring: their timers are the ring's, the commits' wakes stay on the
//! thread, and the poll's socket is one of the ring's.
//!
//! The full polls stay on tokio. For each period the monitor hands the ring a *window*
//! (until its next full poll) and waits until the ring says the window is over, so a
//! fast poll's answer never lands after the full poll that supersedes it. The ring side
//! keeps its own monitor connection to the standby (the full polls' connection belongs
//! to tokio), opened at the first window that polls and again after a failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgfresh_lsn::Lsn;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::fast::{run_polls, PollSite, Polls};
use crate::monitor::{REPLAY_SQL, REPORTS_SQL};
use crate::poll_conn::PollConn;
use crate::settings::{MonitorSettings, NodeId, NodeSpec};
use crate::Inner;

/// How long past its end (and the timeouts of a connect and a poll) a window may go
/// before the monitor gives the ring up.
const GRACE: Duration = Duration::from_secs(1);

/// One period's fast polls, handed to the ring.
struct Window {
    polls: Polls,
    settings: Arc<MonitorSettings>,
    /// When the next full poll is due.
    until: Instant,
    /// Sent (or dropped) once the polls of the window have stopped.
    done: oneshot::Sender<()>,
}

/// A standby monitor's side of its fast polls on the ring. Dropping it ends them.
pub(crate) struct RingPolls {
    windows: mpsc::Sender<Window>,
}

impl RingPolls {
    /// Starts the standby `id`'s fast-poll task on `ring`; it ends with `cancel`, or when
    /// this is dropped.
    pub(crate) fn start(
        ring: &pgfresh_ring::Handle,
        inner: &Arc<Inner>,
        id: NodeId,
        spec: &NodeSpec,
        cancel: &CancellationToken,
    ) -> RingPolls {
        let (windows, rx) = mpsc::channel(1);
        drop(ring.spawn(serve(inner.clone(), id, spec.clone(), rx, cancel.clone())));
        RingPolls { windows }
    }

    /// Runs the fast polls on the ring until `until`; returns once they have stopped.
    /// False when the ring did not run them: its task is gone, or the window was not
    /// over a grace after `until` (a connect and a poll, each within its timeout, may
    /// overrun it; a ring that ended or stalls does not answer at all). Then the
    /// caller gives the ring up and polls itself.
    pub(crate) async fn window(
        &self,
        settings: &Arc<MonitorSettings>,
        until: Instant,
        polls: Polls,
    ) -> bool {
        let (done, finished) = oneshot::channel();
        let window = Window {
            polls,
            settings: settings.clone(),
            until,
            done,
        };
        let grace = settings.connect_timeout + settings.health_timeout * 2 + GRACE;
        let deadline = tokio::time::Instant::from_std(until) + grace;
        let ran = tokio::time::timeout_at(deadline, async {
            self.windows.send(window).await.is_ok() && finished.await.is_ok()
        })
        .await;
        // Given up, `finished` is dropped with the timed-out future: the ring's task
        // sees it before it looks at another answer.
        ran.unwrap_or(false)
    }
}

/// The ring task: each window's polls, over its own connection.
async fn serve(
    inner: Arc<Inner>,
    id: NodeId,
    spec: NodeSpec,
    mut windows: mpsc::Receiver<Window>,
    cancel: CancellationToken,
) {
    let mut site = OnRing {
        spec,
        conn: None,
        failing: None,
    };
    loop {
        let mut w = tokio::select! {
            _ = cancel.cancelled() => return,
            w = windows.recv() => match w {
                Some(w) => w,
                None => return,
            },
        };
        let name = site.spec.name.clone();
        tokio::select! {
            // First: once the monitor stopped waiting (its task ended, or it gave the
            // window up), nothing more is learned from this window.
            biased;
            _ = cancel.cancelled() => return,
            _ = w.done.closed() => return,
            _ = run_polls(w.polls, &inner, id, &name, &mut site, &w.settings, w.until) => {}
        }
        let _ = w.done.send(());
    }
}

/// The fast polls on the ring: its timers, its connection to the standby.
struct OnRing {
    spec: NodeSpec,
    conn: Option<PollConn>,
    /// The last failure, logged once per change: the full polls run over another
    /// connection and would not report this one's.
    failing: Option<String>,
}

impl PollSite for OnRing {
    async fn sleep_until(&self, at: Instant) {
        pgfresh_ring::sleep_until(at).await;
    }

    async fn poll_replay(&mut self, s: &MonitorSettings) -> Option<Result<Option<Lsn>, String>> {
        Some(self.ask(s, "replay poll", async |c| c.replay().await).await)
    }

    async fn poll_reports(
        &mut self,
        s: &MonitorSettings,
    ) -> Option<Result<Vec<(i32, Lsn)>, String>> {
        Some(
            self.ask(s, "report poll", async |c| c.reports().await)
                .await,
        )
    }
}

impl OnRing {
    /// One poll over the connection (opened if need be), within `health_timeout`;
    /// `what` names it in a timeout's message. The answer goes through `noted`.
    async fn ask<T>(
        &mut self,
        s: &MonitorSettings,
        what: &str,
        poll: impl AsyncFnOnce(&mut PollConn) -> Result<T, String>,
    ) -> Result<T, String> {
        let answer = match self.conn(s).await {
            Ok(conn) => within(s.health_timeout, poll(conn))
                .await
                .unwrap_or_else(|| Err(format!("{what} timed out after {:?}", s.health_timeout))),
            Err(e) => Err(e),
        };
        self.noted(answer)
    }

    /// The connection, opened anew when there is none, the login changed or the node
    /// closed it while it was idle (one that failed was dropped: see `noted`).
    async fn conn(&mut self, s: &MonitorSettings) -> Result<&mut PollConn, String> {
        if self
            .conn
            .as_mut()
            .is_some_and(|c| !c.login.is_of(s) || !c.is_open())
        {
            self.conn = None;
        }
        if self.conn.is_none() {
            self.conn = Some(connect(&self.spec, s).await?);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| "no fast-poll connection".to_string())
    }

    /// A poll's `answer`: a failure drops the connection (the next window starts from a
    /// new one) and is logged once per change, as is the recovery.
    fn noted<T>(&mut self, answer: Result<T, String>) -> Result<T, String> {
        match &answer {
            Err(e) => {
                self.conn = None;
                if self.failing.as_ref() != Some(e) {
                    tracing::warn!(node = %self.spec.name, error = %e, "fast replay polls on the ring failed; they pause until the next full poll");
                    self.failing = Some(e.clone());
                }
            }
            Ok(_) => {
                if let Some(e) = self.failing.take() {
                    tracing::info!(node = %self.spec.name, previous_error = %e, "fast replay polls on the ring answer again");
                }
            }
        }
        answer
    }
}

/// Opens a monitor connection to `spec` on the ring and prepares the replay and report
/// polls.
async fn connect(spec: &NodeSpec, s: &MonitorSettings) -> Result<PollConn, String> {
    within(
        s.connect_timeout,
        PollConn::open(spec, s, REPLAY_SQL, REPORTS_SQL),
    )
    .await
    .ok_or_else(|| format!("connect timed out after {:?}", s.connect_timeout))?
    .map_err(|e| format!("connect failed: {e}"))
}

/// `future`'s output, or `None` once `limit` has passed (on the ring's timers).
async fn within<F: std::future::Future>(limit: Duration, future: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = future => Some(out),
        _ = pgfresh_ring::sleep(limit) => None,
    }
}
