//! The monitor's memory of each node and the computation of a new [`ClusterView`] from it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use pgfresh_lsn::Lsn;

use crate::eligibility::{
    choose_primary, ineligible_reason, over_threshold, NodeFacts, PrimaryCandidate, Role,
};
use crate::lag::{self, PositionHistory, TimeBehind};
use crate::settings::{MonitorSettings, NodeId, NodeSpec};
use crate::timeline::TimelineHistory;
use crate::view::{ClusterEvent, ClusterView, ExternalLag, NodeStatus};
use crate::Ineligible;

mod nodes;

/// What one successful poll of a node reported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub(crate) in_recovery: bool,
    /// `pg_current_wal_lsn()`, primaries only.
    pub(crate) current_lsn: Option<Lsn>,
    pub(crate) replay_lsn: Option<Lsn>,
    pub(crate) receive_lsn: Option<Lsn>,
    pub(crate) paused: bool,
    /// Age of the last replayed transaction, measured on the node. Used for time lag only
    /// where the primary's position history cannot date the replay position (see [`lag`]).
    pub(crate) replay_age_ms: Option<i64>,
    /// `pg_stat_wal_receiver.status`; `None` when there is no WAL receiver (or it is hidden).
    pub(crate) receiver_status: Option<String>,
    /// Current timeline (primary) or received timeline (standby).
    pub(crate) timeline: Option<u32>,
    /// Standbys without a WAL receiver timeline only: the newer of the last restartpoint's
    /// and the minimum recovery point's timelines (a lower bound of the replay timeline).
    pub(crate) control_timeline: Option<u32>,
    /// The monitor's connection is encrypted (`None`: not a SQL poll).
    pub(crate) tls: Option<bool>,
}

#[derive(Debug, Clone, Default)]
struct NodeState {
    polled: bool,
    last_ok: Option<Instant>,
    consecutive_failures: u32,
    sample: Option<Sample>,
    last_error: Option<String>,
    role: Option<Role>,
    /// Last role other than `Unknown`.
    last_known_role: Option<Role>,
    demoted: bool,
    out_bytes: bool,
    out_time: bool,
    eligible: bool,
    reason: Option<Ineligible>,
    external: Option<ExternalLag>,
    /// While the node is out of recovery: when it was first seen at each recent position.
    history: PositionHistory,
    /// Dropped from the node set: polls are ignored and it stays out of everything.
    retired: bool,
}

/// Everything the monitor remembers; guarded by one mutex in the balancer.
///
/// `specs` and `nodes` are indexed by [`NodeId`] and only ever grow: a node removed from the
/// configuration is marked retired, never deleted, so ids stay stable.
#[derive(Debug)]
pub(crate) struct State {
    specs: Vec<NodeSpec>,
    nodes: Vec<NodeState>,
    primary: Option<NodeId>,
    pool_external: Option<ExternalLag>,
    /// Timeline histories read from primaries, by timeline (the newest few).
    histories: BTreeMap<u32, Arc<TimelineHistory>>,
    generation: u64,
    /// Bumped by every change of the node set ([`State::update_nodes`]).
    specs_generation: u64,
}

/// How many timeline histories are kept (the newest ones).
const HISTORIES_KEPT: usize = 8;

impl State {
    pub(crate) fn new(specs: Vec<NodeSpec>) -> State {
        let nodes = vec![NodeState::default(); specs.len()];
        State {
            specs,
            nodes,
            primary: None,
            pool_external: None,
            histories: BTreeMap::from([(1, Arc::new(TimelineHistory::initial()))]),
            generation: 0,
            specs_generation: 0,
        }
    }

    /// The history of `timeline` is known (timeline 1's always is).
    pub(crate) fn has_history(&self, timeline: u32) -> bool {
        self.histories.contains_key(&timeline)
    }

    /// Keeps a history read from a primary; only the newest few are kept.
    pub(crate) fn set_history(&mut self, history: TimelineHistory) {
        self.histories.insert(history.timeline(), Arc::new(history));
        while self.histories.len() > HISTORIES_KEPT {
            self.histories.pop_first();
        }
    }

    /// Records a poll outcome. Outcomes for a retired (or unknown) node are dropped: its
    /// monitor may finish one last poll after the node was removed.
    pub(crate) fn record(&mut self, id: NodeId, result: Result<Sample, String>, now: Instant) {
        let Some(n) = self.nodes.get_mut(id).filter(|n| !n.retired) else {
            return;
        };
        n.polled = true;
        match result {
            Ok(sample) => {
                if sample.in_recovery {
                    n.history.clear();
                } else if let Some(lsn) = sample.current_lsn {
                    n.history.observe(lsn, now);
                }
                n.last_ok = Some(now);
                n.consecutive_failures = 0;
                n.sample = Some(sample);
                n.last_error = None;
            }
            Err(e) => {
                n.consecutive_failures = n.consecutive_failures.saturating_add(1);
                n.last_error = Some(e);
            }
        }
    }

    /// Every current node has been polled at least once (successfully or not).
    pub(crate) fn all_polled(&self) -> bool {
        self.nodes.iter().all(|n| n.polled || n.retired)
    }

    pub(crate) fn set_external(&mut self, id: Option<NodeId>, lag: ExternalLag) {
        match id {
            Some(id) => {
                if let Some(n) = self.nodes.get_mut(id).filter(|n| !n.retired) {
                    n.external = Some(lag);
                }
            }
            None => self.pool_external = Some(lag),
        }
    }

    /// Sets the weights of the current (not retired) nodes, in id order.
    pub(crate) fn set_weights(&mut self, weights: &[u32]) {
        let current = self
            .specs
            .iter_mut()
            .zip(&self.nodes)
            .filter(|(_, n)| !n.retired)
            .map(|(spec, _)| spec);
        for (spec, w) in current.zip(weights) {
            spec.weight = *w;
        }
    }

    /// Computes the next view and the events since the previous one.
    pub(crate) fn compute(
        &mut self,
        settings: &MonitorSettings,
        outstanding: &[u64],
        now: Instant,
    ) -> (ClusterView, Vec<ClusterEvent>) {
        let mut events = Vec::new();
        let fresh = |e: &Option<ExternalLag>| {
            e.as_ref()
                .filter(|x| {
                    now.saturating_duration_since(x.received) <= settings.external_lag_max_age
                })
                .cloned()
        };
        let pool_external = fresh(&self.pool_external);

        // Health and role of every node.
        let roles: Vec<Role> = self
            .nodes
            .iter()
            .map(|n| {
                let healthy = !n.retired
                    && n.last_ok.is_some_and(|t| {
                        now.saturating_duration_since(t) <= settings.health_timeout
                    })
                    && n.consecutive_failures < 2;
                match (&n.sample, healthy) {
                    (Some(s), true) if s.in_recovery => Role::Standby,
                    (Some(_), true) => Role::Primary,
                    _ => Role::Unknown,
                }
            })
            .collect();

        // The primary.
        let candidates: Vec<PrimaryCandidate> = roles
            .iter()
            .enumerate()
            .filter(|(_, r)| **r == Role::Primary)
            .map(|(i, _)| PrimaryCandidate {
                node: i,
                timeline: self.nodes[i].sample.as_ref().and_then(|s| s.timeline),
            })
            .collect();
        let primary = choose_primary(self.primary, &candidates);
        if primary != self.primary {
            events.push(ClusterEvent::PrimaryChanged {
                from: self.primary,
                to: primary,
            });
            self.primary = primary;
        }
        let primary_sample = primary.and_then(|p| self.nodes[p].sample.clone());
        let primary_lsn = primary_sample.as_ref().and_then(|s| s.current_lsn);
        let primary_tl = primary_sample.as_ref().and_then(|s| s.timeline);

        // How long ago the primary passed each standby's replay position.
        let primary_history = primary.map(|p| &self.nodes[p].history);
        let behind: Vec<TimeBehind> = self
            .nodes
            .iter()
            .zip(&roles)
            .map(|(n, role)| {
                let replay = n.sample.as_ref().and_then(|s| s.replay_lsn);
                match (role, replay, primary_history) {
                    (Role::Standby, Some(replay), Some(history)) => {
                        history.time_behind(lag::effective_replay(replay, primary_lsn), now)
                    }
                    _ => TimeBehind::Unknown,
                }
            })
            .collect();

        let h = settings.hysteresis_fraction();
        let mut statuses = Vec::with_capacity(self.nodes.len());
        let (mut max_bytes, mut max_ms) = (None::<u64>, None::<u64>);
        for (i, n) in self.nodes.iter_mut().enumerate() {
            let role = roles[i];
            let prev = n.role.unwrap_or(Role::Unknown);
            if n.role.is_some_and(|r| r != role) || (n.role.is_none() && role != Role::Unknown) {
                events.push(ClusterEvent::RoleChanged {
                    node: i,
                    from: prev,
                    to: role,
                });
            }
            n.role = Some(role);
            if role != Role::Unknown {
                if n.last_known_role == Some(Role::Primary) && role == Role::Standby {
                    n.demoted = true;
                }
                n.last_known_role = Some(role);
            }
            let healthy = role != Role::Unknown;
            let standby = role == Role::Standby;
            let sample = n.sample.as_ref().filter(|_| healthy);
            let external = fresh(&n.external);
            let pushed: Vec<u64> = external
                .iter()
                .chain(pool_external.iter())
                .map(|e| e.lag_ms)
                .collect();

            let replay = sample
                .and_then(|s| s.replay_lsn)
                .map(|r| lag::effective_replay(r, primary_lsn));
            let (lag_bytes, lag_ms) = if standby {
                let polled_ms = lag::lag_ms(behind[i], sample.and_then(|s| s.replay_age_ms));
                (
                    lag::lag_bytes(primary_lsn, replay),
                    lag::effective_lag_ms(polled_ms, pushed.iter().copied()),
                )
            } else {
                (None, None)
            };
            let receiver = sample.and_then(|s| s.receiver_status.as_deref());
            let streaming = standby
                && (receiver == Some("streaming") || (receiver.is_none() && !pushed.is_empty()));
            let timeline = sample.and_then(|s| s.timeline);
            let shown_timeline =
                timeline.or_else(|| sample.filter(|_| standby).and_then(|s| s.control_timeline));
            let wrong_timeline =
                standby && primary_tl.is_some() && timeline.is_some() && primary_tl != timeline;
            if n.demoted
                && standby
                && streaming
                && !wrong_timeline
                && primary_tl.is_some()
                && timeline.is_some()
            {
                n.demoted = false;
            }
            if standby {
                n.out_bytes =
                    over_threshold(lag_bytes, settings.delay_threshold_bytes, n.out_bytes, h);
                n.out_time = over_threshold(lag_ms, settings.delay_threshold_ms, n.out_time, h);
                if let Some(b) = lag_bytes {
                    max_bytes = Some(max_bytes.map_or(b, |m| m.max(b)));
                }
                if let Some(ms) = lag_ms {
                    max_ms = Some(max_ms.map_or(ms, |m| m.max(ms)));
                }
            } else if healthy {
                n.out_bytes = false;
                n.out_time = false;
            }
            let paused = sample.is_some_and(|s| s.in_recovery && s.paused);
            let facts = NodeFacts {
                healthy,
                role,
                is_primary: primary == Some(i),
                streaming,
                paused,
                wrong_timeline,
                demoted: n.demoted,
                over_bytes: n.out_bytes,
                over_time: n.out_time,
            };
            let reason = if n.retired {
                Some(Ineligible::Removed)
            } else {
                ineligible_reason(&facts)
            };
            let eligible = reason.is_none();
            if eligible != n.eligible || reason != n.reason {
                events.push(ClusterEvent::EligibilityChanged {
                    node: i,
                    eligible,
                    reason,
                });
            }
            n.eligible = eligible;
            n.reason = reason;

            statuses.push(NodeStatus {
                spec: self.specs[i].clone(),
                role,
                healthy,
                current_lsn: sample.and_then(|s| s.current_lsn),
                replay_lsn: replay,
                receive_lsn: sample.and_then(|s| s.receive_lsn),
                lag_bytes,
                lag_ms,
                paused,
                tls: sample.and_then(|s| s.tls),
                streaming,
                timeline: shown_timeline,
                eligible,
                ineligible_reason: reason,
                last_poll_ok: n.last_ok,
                last_error: n.last_error.clone(),
                outstanding: outstanding.get(i).copied().unwrap_or(0),
                external_lag: external,
                retired: n.retired,
            });
        }
        self.generation += 1;
        let view = ClusterView {
            nodes: statuses,
            primary,
            primary_lsn,
            primary_timeline: primary_tl,
            timeline_history: primary_tl.and_then(|t| self.histories.get(&t).cloned()),
            max_lag_bytes: max_bytes,
            max_lag_ms: max_ms,
            pool_external_lag: pool_external,
            generation: self.generation,
            specs_generation: self.specs_generation,
        };
        (view, events)
    }
}

/// The view before any poll: every node unknown and out of the pool.
pub(crate) fn initial_view(specs: &[NodeSpec]) -> ClusterView {
    ClusterView {
        nodes: specs
            .iter()
            .map(|spec| NodeStatus {
                spec: spec.clone(),
                role: Role::Unknown,
                healthy: false,
                current_lsn: None,
                replay_lsn: None,
                receive_lsn: None,
                lag_bytes: None,
                lag_ms: None,
                paused: false,
                tls: None,
                streaming: false,
                timeline: None,
                eligible: false,
                ineligible_reason: Some(Ineligible::Down),
                last_poll_ok: None,
                last_error: None,
                outstanding: 0,
                external_lag: None,
                retired: false,
            })
            .collect(),
        primary: None,
        primary_lsn: None,
        primary_timeline: None,
        timeline_history: None,
        max_lag_bytes: None,
        max_lag_ms: None,
        pool_external_lag: None,
        generation: 0,
        specs_generation: 0,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    pub(crate) fn specs(n: usize) -> Vec<NodeSpec> {
        (0..n)
            .map(|i| NodeSpec {
                name: format!("n{i}"),
                host: "h".into(),
                port: 1,
                weight: 1,
                patroni_url: None,
                tls: Default::default(),
            })
            .collect()
    }

    pub(crate) fn primary(lsn: u64, tl: u32) -> Sample {
        Sample {
            in_recovery: false,
            current_lsn: Some(Lsn(lsn)),
            replay_lsn: None,
            receive_lsn: None,
            paused: false,
            replay_age_ms: None,
            receiver_status: None,
            timeline: Some(tl),
            control_timeline: None,
            tls: None,
        }
    }

    pub(crate) fn standby(replay: u64, tl: u32, age: i64) -> Sample {
        Sample {
            in_recovery: true,
            current_lsn: None,
            replay_lsn: Some(Lsn(replay)),
            receive_lsn: Some(Lsn(replay)),
            paused: false,
            replay_age_ms: Some(age),
            receiver_status: Some("streaming".into()),
            timeline: Some(tl),
            control_timeline: None,
            tls: None,
        }
    }

    fn round(
        st: &mut State,
        samples: Vec<Result<Sample, String>>,
        s: &MonitorSettings,
        now: Instant,
    ) -> (ClusterView, Vec<ClusterEvent>) {
        for (i, r) in samples.into_iter().enumerate() {
            st.record(i, r, now);
        }
        st.compute(s, &[0, 0, 0], now)
    }

    #[test]
    fn no_primary_reason_names_the_first_nodes_error() {
        let s = MonitorSettings::default();
        let mut st = State::new(specs(3));
        let t = Instant::now();
        let (v, _) = st.compute(&s, &[0, 0, 0], t);
        assert_eq!(
            v.no_primary_reason(),
            "the monitor has not reached any node yet"
        );
        let auth = "connect failed: password authentication failed for user \"m\" (SQLSTATE 28P01)";
        let (v, _) = round(
            &mut st,
            vec![Err(auth.into()), Err(auth.into()), Err("refused".into())],
            &s,
            t,
        );
        assert_eq!(v.primary, None);
        assert_eq!(
            v.no_primary_reason(),
            format!("the monitor cannot reach any node (n0: {auth})")
        );
        let (v, _) = round(
            &mut st,
            vec![
                Err(auth.into()),
                Ok(standby(10, 1, 0)),
                Ok(standby(10, 1, 0)),
            ],
            &s,
            t,
        );
        assert_eq!(
            v.no_primary_reason(),
            format!("no reachable node is out of recovery; the monitor cannot reach n0 ({auth})")
        );
    }

    #[test]
    fn lag_threshold_with_hysteresis_and_failover() {
        let s = MonitorSettings {
            delay_threshold_bytes: Some(1000),
            ..MonitorSettings::default()
        };
        let mut st = State::new(specs(3));
        let t = Instant::now();
        let (v, _) = round(
            &mut st,
            vec![
                Ok(primary(5000, 1)),
                Ok(standby(5000, 1, 9)),
                Ok(standby(3000, 1, 9)),
            ],
            &s,
            t,
        );
        assert_eq!(v.primary, Some(0));
        assert!(v.nodes[1].eligible);
        assert_eq!(
            v.nodes[1].lag_ms,
            Some(0),
            "caught up: no time lag however old the last commit"
        );
        assert_eq!(v.nodes[2].ineligible_reason, Some(Ineligible::LaggingBytes));
        assert_eq!(v.nodes[2].lag_ms, Some(9));
        assert_eq!(v.max_lag_bytes, Some(2000));
        // 900 behind: under the threshold but above the re-entry mark (800): stays out.
        let (v, _) = round(
            &mut st,
            vec![
                Ok(primary(5000, 1)),
                Ok(standby(5000, 1, 9)),
                Ok(standby(4100, 1, 9)),
            ],
            &s,
            t,
        );
        assert_eq!(v.nodes[2].ineligible_reason, Some(Ineligible::LaggingBytes));
        let (v, ev) = round(
            &mut st,
            vec![
                Ok(primary(5000, 1)),
                Ok(standby(5000, 1, 9)),
                Ok(standby(4200, 1, 9)),
            ],
            &s,
            t,
        );
        assert!(v.nodes[2].eligible);
        assert!(ev.contains(&ClusterEvent::EligibilityChanged {
            node: 2,
            eligible: true,
            reason: None
        }));

        // Node 1 promoted while node 0 still answers: node 0 stays primary, node 1 is flagged.
        let (v, _) = round(
            &mut st,
            vec![
                Ok(primary(5000, 1)),
                Ok(primary(5100, 2)),
                Ok(standby(5000, 1, 9)),
            ],
            &s,
            t,
        );
        assert_eq!(v.primary, Some(0));
        assert_eq!(
            v.nodes[1].ineligible_reason,
            Some(Ineligible::SecondPrimary)
        );
        // Node 0 fails twice: node 1 takes over; node 2 still receives timeline 1.
        let (_, _) = round(
            &mut st,
            vec![
                Err("x".into()),
                Ok(primary(5100, 2)),
                Ok(standby(5000, 1, 9)),
            ],
            &s,
            t,
        );
        let (v, ev) = round(
            &mut st,
            vec![
                Err("x".into()),
                Ok(primary(5100, 2)),
                Ok(standby(5000, 1, 9)),
            ],
            &s,
            t,
        );
        assert_eq!(v.primary, Some(1));
        assert!(ev.contains(&ClusterEvent::PrimaryChanged {
            from: Some(0),
            to: Some(1)
        }));
        assert_eq!(v.nodes[0].ineligible_reason, Some(Ineligible::Down));
        assert_eq!(
            v.nodes[2].ineligible_reason,
            Some(Ineligible::WrongTimeline)
        );
        // Old primary returns as a standby not yet on the new timeline: demoted.
        let (v, _) = round(
            &mut st,
            vec![
                Ok(standby(5000, 1, 9)),
                Ok(primary(5100, 2)),
                Ok(standby(5100, 2, 9)),
            ],
            &s,
            t,
        );
        assert_eq!(v.nodes[0].ineligible_reason, Some(Ineligible::Demoted));
        assert!(v.nodes[2].eligible);
        let (v, _) = round(
            &mut st,
            vec![
                Ok(standby(5100, 2, 9)),
                Ok(primary(5100, 2)),
                Ok(standby(5100, 2, 9)),
            ],
            &s,
            t,
        );
        assert!(v.nodes[0].eligible);
    }

    #[test]
    fn external_lag_raises_time_lag_until_stale() {
        let s = MonitorSettings {
            delay_threshold_ms: Some(100),
            external_lag_max_age: Duration::from_secs(5),
            ..MonitorSettings::default()
        };
        let mut st = State::new(specs(3));
        let t = Instant::now();
        let mut no_receiver = standby(5000, 1, 0);
        no_receiver.receiver_status = None;
        let samples = || {
            vec![
                Ok(primary(5000, 1)),
                Ok(standby(5000, 1, 0)),
                Ok(no_receiver.clone()),
            ]
        };
        let (v, _) = round(&mut st, samples(), &s, t);
        assert!(v.nodes[1].eligible);
        // Without a WAL receiver to ask and nothing pushed: not streaming.
        assert_eq!(v.nodes[2].ineligible_reason, Some(Ineligible::NotStreaming));
        st.set_external(
            None,
            ExternalLag {
                lag_ms: 50,
                source: "probe".into(),
                received: t,
            },
        );
        st.set_external(
            Some(1),
            ExternalLag {
                lag_ms: 400,
                source: "probe".into(),
                received: t,
            },
        );
        let (v, _) = round(&mut st, samples(), &s, t);
        assert_eq!(v.nodes[1].lag_ms, Some(400));
        assert_eq!(v.nodes[1].ineligible_reason, Some(Ineligible::LaggingTime));
        assert_eq!(v.nodes[2].lag_ms, Some(50));
        assert!(
            v.nodes[2].eligible,
            "a fresh pushed lag stands in for streaming status"
        );
        // Six seconds later the pushed values are ignored.
        let (v, _) = round(&mut st, samples(), &s, t + Duration::from_secs(6));
        assert!(v.nodes[1].external_lag.is_none());
        assert_eq!(v.nodes[2].ineligible_reason, Some(Ineligible::NotStreaming));
    }

    #[test]
    fn idle_primary_wal_blip_does_not_flap_the_replica() {
        let s = MonitorSettings {
            delay_threshold_ms: Some(1000),
            ..MonitorSettings::default()
        };
        let mut st = State::new(specs(3));
        let t0 = Instant::now();
        let poll = Duration::from_millis(100);
        // Ten idle seconds: everyone at 0/5000000, the last commit ten seconds old.
        let mut events = Vec::new();
        for i in 0..100u32 {
            let now = t0 + poll * i;
            let age = 10_000 + i64::from(i) * 100;
            let (v, ev) = round(
                &mut st,
                vec![
                    Ok(primary(0x500_0000, 1)),
                    Ok(standby(0x500_0000, 1, age)),
                    Ok(standby(0x500_0000, 1, age)),
                ],
                &s,
                now,
            );
            assert_eq!(v.nodes[1].lag_ms, Some(0));
            events.extend(ev);
        }
        // A checkpoint record: the primary is polled right after it, the replicas 50 ms
        // later still show the old replay position.
        let blip = t0 + poll * 100;
        st.record(0, Ok(primary(0x500_0068, 1)), blip);
        st.record(1, Ok(standby(0x500_0000, 1, 20_000)), blip + poll / 2);
        st.record(2, Ok(standby(0x500_0000, 1, 20_000)), blip + poll / 2);
        let (v, ev) = st.compute(&s, &[0, 0, 0], blip + poll / 2);
        events.extend(ev);
        assert_eq!(v.nodes[1].lag_bytes, Some(0x68));
        assert_eq!(
            v.nodes[1].lag_ms,
            Some(50),
            "not the age of the last commit"
        );
        assert!(v.nodes[1].eligible && v.nodes[2].eligible);
        let (v, ev) = round(
            &mut st,
            vec![
                Ok(primary(0x500_0068, 1)),
                Ok(standby(0x500_0068, 1, 20_100)),
                Ok(standby(0x500_0068, 1, 20_100)),
            ],
            &s,
            blip + poll,
        );
        events.extend(ev);
        assert_eq!(v.nodes[1].lag_ms, Some(0));
        assert!(
            !events.iter().any(|e| matches!(
                e,
                ClusterEvent::EligibilityChanged {
                    node: 1 | 2,
                    eligible: false,
                    ..
                }
            )),
            "{events:?}"
        );
    }

    #[test]
    fn paused_replica_time_lag_grows_while_the_primary_writes() {
        let s = MonitorSettings {
            delay_threshold_ms: Some(60_000),
            ..MonitorSettings::default()
        };
        let mut st = State::new(specs(3));
        let t0 = Instant::now();
        let mut paused = standby(0x300_0000, 1, 0);
        paused.paused = true;
        let mut last = None;
        for i in 0..50u32 {
            let now = t0 + Duration::from_millis(100) * i;
            let written = 0x300_0000 + u64::from(i) * 0x100;
            let (v, _) = round(
                &mut st,
                vec![
                    Ok(primary(written, 1)),
                    Ok(paused.clone()),
                    Ok(standby(written, 1, 0)),
                ],
                &s,
                now,
            );
            assert_eq!(v.nodes[1].ineligible_reason, Some(Ineligible::Paused));
            assert!(v.nodes[1].paused);
            assert!(v.nodes[2].eligible);
            let lag = v.nodes[1].lag_ms.unwrap();
            // The primary moved past the paused position at the second poll (100 ms).
            assert_eq!(lag, (u64::from(i) * 100).saturating_sub(100));
            assert!(last.is_none_or(|l| i < 2 || lag > l));
            last = Some(lag);
            assert_eq!(v.max_lag_ms, Some(lag));
        }
    }

    #[test]
    fn history_restarts_when_the_primary_becomes_a_standby() {
        let s = MonitorSettings::default();
        let mut st = State::new(specs(2));
        let t0 = Instant::now();
        st.record(0, Ok(primary(1000, 1)), t0);
        st.record(0, Ok(primary(2000, 1)), t0 + Duration::from_secs(1));
        assert_eq!(st.nodes[0].history.len(), 2);
        st.record(0, Ok(standby(2000, 2, 0)), t0 + Duration::from_secs(2));
        assert!(st.nodes[0].history.is_empty());
        st.record(1, Ok(primary(2100, 2)), t0 + Duration::from_secs(2));
        let (v, _) = st.compute(&s, &[0, 0], t0 + Duration::from_secs(3));
        assert_eq!(v.primary, Some(1));
        // The new primary's history starts at its first poll: only a lower bound (1 s) for
        // a replica behind it, raised by the replica's replay age (0 here).
        assert_eq!(v.nodes[0].lag_ms, Some(1000));
    }

    fn pos(tli: u32, lsn: u64) -> pgfresh_lsn::Position {
        pgfresh_lsn::Position::new(tli, Lsn(lsn)).unwrap()
    }

    #[test]
    fn timeline_history_follows_the_primary() {
        use crate::timeline::Translation;
        let s = MonitorSettings::default();
        let mut st = State::new(specs(3));
        let t = Instant::now();
        let (v, _) = st.compute(&s, &[0, 0, 0], t);
        assert_eq!(
            v.translate(&pos(1, 5)),
            Translation::Unknown,
            "no primary yet"
        );
        let (v, _) = round(
            &mut st,
            vec![
                Ok(primary(0x500_0000, 1)),
                Ok(standby(0x500_0000, 1, 0)),
                Ok(standby(0x500_0000, 1, 0)),
            ],
            &s,
            t,
        );
        assert_eq!(v.primary_timeline, Some(1));
        assert_eq!(v.timeline_history.as_ref().unwrap().timeline(), 1);
        assert_eq!(
            v.translate(&pos(1, 0x600_0000)),
            Translation::Current(Lsn(0x600_0000))
        );
        assert_eq!(v.translate(&pos(2, 5)), Translation::Unknown);

        // Node 1 is promoted at 0/5000000 (timeline 2); node 0 is gone.
        let promoted = vec![
            Err("down".into()),
            Ok(primary(0x500_1000, 2)),
            Ok(standby(0x500_0000, 1, 0)),
        ];
        round(&mut st, promoted.clone(), &s, t);
        let (v, _) = round(&mut st, promoted.clone(), &s, t);
        assert_eq!((v.primary, v.primary_timeline), (Some(1), Some(2)));
        assert_eq!(v.timeline_history, None);
        assert!(!st.has_history(2));
        // History unknown: the current timeline still translates, earlier ones do not.
        assert_eq!(
            v.translate(&pos(2, 0x500_1000)),
            Translation::Current(Lsn(0x500_1000))
        );
        assert_eq!(v.translate(&pos(1, 0x100)), Translation::Unknown);
        // Node 2 still receives timeline 1: out of the pool.
        assert_eq!(
            v.nodes[2].ineligible_reason,
            Some(Ineligible::WrongTimeline)
        );

        st.set_history(
            TimelineHistory::parse(2, "1\t0/5000000\tno recovery target specified\n").unwrap(),
        );
        let (v, _) = round(&mut st, promoted, &s, t);
        assert_eq!(
            v.timeline_history.as_ref().unwrap().switch_point(1),
            Some(Lsn(0x500_0000))
        );
        assert_eq!(
            v.translate(&pos(1, 0x400_0000)),
            Translation::Current(Lsn(0x400_0000))
        );
        assert_eq!(
            v.translate(&pos(1, 0x500_0000)),
            Translation::Current(Lsn(0x500_0000))
        );
        assert_eq!(
            v.translate(&pos(1, 0x500_0001)),
            Translation::Diverged {
                switch: Lsn(0x500_0000)
            }
        );
        assert_eq!(v.translate(&pos(3, 0)), Translation::Unknown);
        assert_eq!(
            v.translate_token(&pgfresh_lsn::TokenOrLsn::Lsn(Lsn(7))),
            Translation::Current(Lsn(7))
        );
    }

    #[test]
    fn only_the_newest_histories_are_kept() {
        let mut st = State::new(specs(1));
        for tl in 2..20u32 {
            st.set_history(TimelineHistory::parse(tl, &format!("1\t0/{tl:X}\n")).unwrap());
        }
        assert_eq!(st.histories.len(), HISTORIES_KEPT);
        assert!(st.has_history(19) && !st.has_history(2) && !st.has_history(1));
    }

    #[test]
    fn control_timeline_is_shown_but_does_not_decide_eligibility() {
        let s = MonitorSettings::default();
        let mut st = State::new(specs(3));
        let t = Instant::now();
        // Node 2's WAL receiver is gone (its timeline from pg_control), but a pushed lag
        // stands in for streaming.
        let mut no_receiver = standby(0x500_0000, 2, 0);
        no_receiver.receiver_status = None;
        no_receiver.timeline = None;
        no_receiver.control_timeline = Some(1);
        st.set_external(
            Some(2),
            ExternalLag {
                lag_ms: 0,
                source: "probe".into(),
                received: t,
            },
        );
        let (v, _) = round(
            &mut st,
            vec![
                Ok(primary(0x500_0000, 2)),
                Ok(standby(0x500_0000, 2, 0)),
                Ok(no_receiver),
            ],
            &s,
            t,
        );
        assert_eq!(v.nodes[2].timeline, Some(1));
        assert!(v.nodes[2].eligible, "{:?}", v.nodes[2].ineligible_reason);
        // The primary's own control timeline is never used.
        let mut p = primary(0x500_0000, 2);
        p.control_timeline = Some(1);
        let (v, _) = round(&mut st, vec![Ok(p)], &s, t);
        assert_eq!(v.nodes[0].timeline, Some(2));
    }
}
