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

    /// A primary's walsenders' last reports of their standbys' replay: (walsender
    /// process id, position); `None` where there is no connection to ask.
    async fn poll_reports(
        &mut self,
        s: &MonitorSettings,
    ) -> Option<Result<Vec<(i32, Lsn)>, String>>;
}

/// Until `next` (the next full poll): while reads wait on replay positions this standby
/// is not known to have replayed, polls its `pg_last_wal_replay_lsn()` every
/// `replay_check_period` and records it; once it is known to have every wanted position
/// (asked for by a read, or a commit's), waits for a newer one ([`crate::demand`]);
/// while a read's sample or the standby's reports to the primary ([`crate::reports`])
/// keep it fresh, waits a period from the last of them instead of polling. A
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
        // A sample answered within the period, or the standby's reports to the primary
        // moved its position within two (the primary's report polls run every period; a
        // second one allows for a report that had nothing new): as fresh as a poll would
        // be. The next poll is due when that has passed, unless another comes first.
        let fresh_until = live.as_ref().and_then(|l| {
            let sampled = l.sampled_at().map(|t| t + settings.replay_check_period);
            let reported = l
                .reported_at()
                .map(|t| t + settings.replay_check_period * 2);
            sampled.max(reported)
        });
        if let Some(due) = fresh_until.filter(|due| *due > Instant::now()) {
            if due >= next {
                return site.sleep_until(next).await;
            }
            site.sleep_until(due).await;
            continue;
        }
        let tick = Instant::now() + settings.replay_check_period;
        polls.increment(1);
        let answer = site.poll_replay(settings).await;
        let Some(replayed) = answered(site, answer, next, name, "fast replay poll").await else {
            return;
        };
        if let Some(lsn) = replayed {
            inner.learn_replay(id, lsn, crate::live::Source::Poll);
        }
        if !next_tick(site, tick, next).await {
            return;
        }
    }
}

/// A poll's answer; `None`, having waited until `next` (the polls end until the full
/// poll), when it failed (logged) or there was no connection to ask.
async fn answered<P: PollSite, T>(
    site: &P,
    answer: Option<Result<T, String>>,
    next: Instant,
    name: &str,
    what: &str,
) -> Option<T> {
    match answer {
        Some(Ok(v)) => Some(v),
        Some(Err(e)) => {
            tracing::debug!(node = %name, error = %e, "{what} failed");
            site.sleep_until(next).await;
            None
        }
        None => {
            site.sleep_until(next).await;
            None
        }
    }
}

/// Waits for the next poll's `tick`; false, having waited until `next`, once the window
/// ends first.
async fn next_tick<P: PollSite>(site: &P, tick: Instant, next: Instant) -> bool {
    if tick >= next {
        site.sleep_until(next).await;
        return false;
    }
    site.sleep_until(tick).await;
    true
}

/// Until `next`, the polls `polls` of node `id` on `site`.
pub(crate) async fn run_polls<P: PollSite>(
    polls: Polls,
    inner: &Inner,
    id: NodeId,
    name: &str,
    site: &mut P,
    settings: &MonitorSettings,
    next: Instant,
) {
    match polls {
        Polls::Replay => fast_polls(inner, id, name, site, settings, next).await,
        Polls::Reports => report_polls(inner, id, name, site, settings, next).await,
    }
}

/// What a node's polls between its full polls ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Polls {
    /// A standby's own replay position ([`fast_polls`]).
    Replay,
    /// A primary's walsenders' reports of their standbys' ([`report_polls`]).
    Reports,
}

/// Until `next` (the primary's next full poll): while reads wait on replay positions
/// that a standby matched to one of the primary's walsenders is not known to have
/// replayed, reads every walsender's last report every `replay_check_period` and records
/// each matched standby's ([`crate::reports`]); once they are known to have every wanted
/// position, waits for a newer one. A failed poll ends them until the full poll.
pub(crate) async fn report_polls<P: PollSite>(
    inner: &Inner,
    id: NodeId,
    name: &str,
    site: &mut P,
    settings: &MonitorSettings,
    next: Instant,
) {
    let polls = metrics::counter!("pgfresh_standby_report_polls_total", "node" => name.to_string());
    loop {
        if !inner.demand.active() {
            tokio::select! {
                _ = site.sleep_until(next) => return,
                _ = inner.demand.wait_active() => {}
            }
        }
        let Some(map) = inner.reports.map_of(id) else {
            return site.sleep_until(next).await;
        };
        // The least a matched standby is known to have replayed.
        let least = map
            .by_pid
            .iter()
            .map(|&(_, node)| inner.known_replay(node))
            .min()
            .flatten();
        if inner.demand.wanted() <= least {
            tokio::select! {
                _ = site.sleep_until(next) => return,
                _ = inner.demand.wait_raised(least) => {}
            }
            continue;
        }
        let tick = Instant::now() + settings.replay_check_period;
        polls.increment(1);
        let answer = site.poll_reports(settings).await;
        let Some(reports) = answered(site, answer, next, name, "standby report poll").await else {
            return;
        };
        for (pid, lsn) in reports {
            if let Some(node) = map.node_of(pid) {
                inner.learn_replay(node, lsn, crate::live::Source::Report);
            }
        }
        if !next_tick(site, tick, next).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::reports::{ReceiverIdent, Sender};
    use crate::state::tests::{primary, specs, standby};
    use crate::{Balancer, MonitorSettings};

    /// A site whose polls answer what the test set, and count themselves.
    #[derive(Default)]
    struct Fake {
        replay: Option<Lsn>,
        reports: Vec<(i32, Lsn)>,
        replay_polls: usize,
        report_polls: usize,
    }

    impl PollSite for Fake {
        async fn sleep_until(&self, at: Instant) {
            tokio::time::sleep_until(at.into()).await;
        }

        async fn poll_replay(
            &mut self,
            _: &MonitorSettings,
        ) -> Option<Result<Option<Lsn>, String>> {
            self.replay_polls += 1;
            Some(Ok(self.replay))
        }

        async fn poll_reports(
            &mut self,
            _: &MonitorSettings,
        ) -> Option<Result<Vec<(i32, Lsn)>, String>> {
            self.report_polls += 1;
            Some(Ok(self.reports.clone()))
        }
    }

    fn named(app: &str) -> Option<ReceiverIdent> {
        Some(ReceiverIdent {
            slot: None,
            app: Some(app.into()),
            sender_host: Some("h".into()),
            sender_port: Some(1),
        })
    }

    #[tokio::test]
    async fn the_primarys_reports_stand_in_for_a_standbys_own_polls() {
        // A long period: each window below is one poll at most, and a standby's reports
        // stay fresh however slowly the test runs.
        let settings = MonitorSettings {
            replay_check_period: Duration::from_secs(5),
            ..MonitorSettings::default()
        };
        let b = Balancer::unmonitored(&specs(3), settings.clone(), None);
        let inner = &b.inner;
        inner.record(0, Ok(primary(0x600, 1)));
        inner.record(1, Ok(standby(0x500, 1, 0)));
        inner.record(2, Ok(standby(0x500, 1, 0)));
        inner.reports.note_receiver(1, named("n1"));
        inner.reports.note_receiver(2, named("n2"));
        let senders = [
            Sender {
                pid: 11,
                app: "n1".into(),
                slot: None,
            },
            Sender {
                pid: 12,
                app: "n2".into(),
                slot: None,
            },
            Sender {
                pid: 13,
                app: "pg_receivewal".into(),
                slot: None,
            },
        ];
        inner.reports.remap(0, "h", 1, &senders).expect("a map");

        // A read waits on 0x600: the primary's walsenders are asked, and what they say of
        // a matched standby is learned (pid 13 streams to no configured node).
        inner.demand.record(Lsn(0x600));
        let mut primary_site = Fake {
            reports: vec![(11, Lsn(0x600)), (13, Lsn(0x700))],
            ..Fake::default()
        };
        let until = Instant::now() + Duration::from_millis(10);
        report_polls(inner, 0, "n0", &mut primary_site, &settings, until).await;
        assert!(primary_site.report_polls >= 1);
        assert_eq!(inner.known_replay(1), Some(Lsn(0x600)));
        assert_eq!(inner.known_replay(2), Some(Lsn(0x500)));

        // Reads now wait on a newer position. Standby 1's reports moved a moment ago: its
        // own poll waits two periods from then, past the window.
        inner.demand.record(Lsn(0x800));
        let window = Instant::now() + Duration::from_millis(10);
        let mut standby1 = Fake::default();
        fast_polls(inner, 1, "n1", &mut standby1, &settings, window).await;
        assert_eq!(
            standby1.replay_polls, 0,
            "polled although its reports moved"
        );
        // Standby 2's never did: it is polled at once.
        inner.demand.record(Lsn(0x800));
        let mut standby2 = Fake {
            replay: Some(Lsn(0x800)),
            ..Fake::default()
        };
        let window = Instant::now() + Duration::from_millis(10);
        fast_polls(inner, 2, "n2", &mut standby2, &settings, window).await;
        assert!(standby2.replay_polls >= 1);
        assert_eq!(inner.known_replay(2), Some(Lsn(0x800)));

        // Without a map (switched off, or nothing matched) the primary asks nothing.
        assert!(inner.reports.forget(0));
        let mut primary_site = Fake::default();
        let until = Instant::now() + Duration::from_millis(10);
        report_polls(inner, 0, "n0", &mut primary_site, &settings, until).await;
        assert_eq!(primary_site.report_polls, 0);
    }
}
