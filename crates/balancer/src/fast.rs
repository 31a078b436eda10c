//! A standby's fast replay polls between two full polls ([`crate::demand`] says when they
//! are wanted), wherever they run: on tokio beside the full polls, or on the sessions'
//! pgfresh-ring thread ([`crate::ring_polls`]). A [`PollSite`] gives them their timers and
//! their connection; the schedule is the same on both.

use std::time::Instant;

use pgfresh_lsn::Lsn;

use crate::settings::{MonitorSettings, NodeId};
use crate::Inner;

/// What the fast polls need from where they run.
pub(crate) trait PollSite {
    /// Waits until `at`, on this site's timers.
    async fn sleep_until(&self, at: Instant);

    /// The standby's `pg_last_wal_replay_lsn()`; `None` where there is no connection to
    /// ask (the full poll opens and reports it).
    async fn poll_replay(&mut self, s: &MonitorSettings) -> Option<Result<Option<Lsn>, String>>;
}

/// Until `next` (the next full poll): while reads wait on replay positions this standby
/// is not known to have replayed, polls its `pg_last_wal_replay_lsn()` every
/// `replay_check_period` and records it; once it is known to have every wanted position
/// (asked for by a read, or a commit's), waits for a newer one ([`crate::demand`]). A
/// failed fast poll ends them until the full poll (on tokio it reports the failure; the
/// ring's own connection logs its failures itself).
pub(crate) async fn fast_polls<P: PollSite>(
    inner: &Inner,
    id: NodeId,
    name: &str,
    site: &mut P,
    settings: &MonitorSettings,
    next: Instant,
) {
    let polls = metrics::counter!("pgfresh_replay_polls_total", "node" => name.to_string());
    let live = inner.live(id);
    let grant = |granted: bool| {
        if let Some(l) = &live {
            l.grant_sample(granted);
        }
    };
    loop {
        // While reads wait (most ticks under constant writes) no timer is made here.
        if !inner.demand.active() {
            grant(false);
            tokio::select! {
                _ = site.sleep_until(next) => return grant(false),
                _ = inner.demand.wait_active() => {}
            }
        }
        let known = inner.known_replay(id);
        if inner.demand.wanted() <= known {
            // Nothing wanted is left to learn here.
            grant(false);
            tokio::select! {
                _ = site.sleep_until(next) => return,
                _ = inner.demand.wait_raised(known) => {}
            }
            continue;
        }
        // A read to this standby may ask for its position this period too (see `live`).
        grant(true);
        let sampled = live.as_ref().and_then(|l| l.sampled_at());
        if let Some(due) = sampled
            .map(|t| t + settings.replay_check_period)
            .filter(|due| *due > Instant::now())
        {
            // A sample answered within the period: as fresh as a poll would be. The next
            // poll is due a period after it, unless another sample comes first.
            if due >= next {
                return site.sleep_until(next).await;
            }
            site.sleep_until(due).await;
            continue;
        }
        let tick = Instant::now() + settings.replay_check_period;
        polls.increment(1);
        match site.poll_replay(settings).await {
            Some(Ok(Some(lsn))) => inner.learn_replay(id, lsn, crate::live::Source::Poll),
            Some(Ok(None)) => {}
            Some(Err(e)) => {
                tracing::debug!(node = %name, error = %e, "fast replay poll failed");
                return site.sleep_until(next).await;
            }
            None => return site.sleep_until(next).await,
        }
        if tick >= next {
            return site.sleep_until(next).await;
        }
        site.sleep_until(tick).await;
    }
}
