//! Live changes of the node set: matching new specs to known nodes, appending new ones and
//! retiring the ones no longer configured.

use super::{NodeState, State};
use crate::settings::{NodeId, NodeSpec};

/// The outcome of [`State::update_nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Membership {
    /// The id of each given spec, in the given order.
    pub(crate) ids: Vec<NodeId>,
    /// Nodes created by this update (they need a monitor), ascending.
    pub(crate) added: Vec<NodeId>,
    /// Nodes retired by this update (their monitor stops), ascending.
    pub(crate) retired: Vec<NodeId>,
    /// Nodes whose TLS settings changed (their monitor reconnects with the new ones).
    pub(crate) tls_changed: Vec<NodeId>,
}

/// Whether two specs of the same name watch the same server (only the weight may differ).
fn same_endpoint(a: &NodeSpec, b: &NodeSpec) -> bool {
    a.host == b.host && a.port == b.port && a.patroni_url == b.patroni_url
}

impl State {
    /// How many nodes were ever configured (the next new node gets this id).
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The current (or, when retired, last) spec of node `id`.
    ///
    /// # Panics
    /// If `id` was never assigned.
    pub(crate) fn spec(&self, id: NodeId) -> &NodeSpec {
        &self.specs[id]
    }

    /// Replaces the node set.
    ///
    /// Each spec takes the current node of the same name when host, port and Patroni URL
    /// are unchanged (its weight is updated); otherwise it becomes a new node with the next
    /// unused id. A name given twice matches at most one current node; the second spec
    /// becomes a new node. Current nodes that no spec took are retired: their poll data and
    /// pushed lag are dropped, their last spec, last successful poll time and last error
    /// are kept for display. Nothing is ever removed, so ids are never reused.
    pub(crate) fn update_nodes(&mut self, specs: Vec<NodeSpec>) -> Membership {
        self.specs_generation += 1;
        let mut taken = vec![false; self.nodes.len()];
        let mut ids = Vec::with_capacity(specs.len());
        let mut added = Vec::new();
        let mut tls_changed = Vec::new();
        for spec in specs {
            let current = (0..taken.len())
                .find(|&i| !taken[i] && !self.nodes[i].retired && self.specs[i].name == spec.name);
            match current {
                Some(i) if same_endpoint(&self.specs[i], &spec) => {
                    taken[i] = true;
                    if self.specs[i].tls != spec.tls {
                        tls_changed.push(i);
                    }
                    self.specs[i] = spec;
                    ids.push(i);
                }
                _ => {
                    let id = self.nodes.len();
                    self.specs.push(spec);
                    self.nodes.push(NodeState::default());
                    taken.push(true);
                    added.push(id);
                    ids.push(id);
                }
            }
        }
        let mut retired = Vec::new();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if !taken[i] && !n.retired {
                retire(n);
                retired.push(i);
            }
        }
        Membership {
            ids,
            added,
            retired,
            tls_changed,
        }
    }
}

/// Marks `n` retired and drops what described its live state. The role, eligibility and
/// primary bookkeeping stay as they were so the next view computation announces the
/// change (role → unknown, reason → removed, a new primary if it was the primary).
fn retire(n: &mut NodeState) {
    n.retired = true;
    n.sample = None;
    n.external = None;
    n.history = Default::default();
    n.demoted = false;
    n.out_bytes = false;
    n.out_time = false;
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::tests::{primary, specs, standby};
    use super::*;
    use crate::eligibility::{Ineligible, Role};
    use crate::settings::MonitorSettings;
    use crate::view::{ClusterEvent, ClusterView, ExternalLag};

    /// Three nodes: 0 primary, 1 and 2 eligible standbys.
    fn healthy_three() -> (State, MonitorSettings, Instant) {
        let s = MonitorSettings::default();
        let mut st = State::new(specs(3));
        let t = Instant::now();
        st.record(0, Ok(primary(5000, 1)), t);
        st.record(1, Ok(standby(5000, 1, 0)), t);
        st.record(2, Ok(standby(5000, 1, 0)), t);
        let (v, _) = st.compute(&s, &[], t);
        assert_eq!(v.primary, Some(0));
        assert!(v.nodes[1].eligible && v.nodes[2].eligible);
        (st, s, t)
    }

    fn spec(name: &str, port: u16, weight: u32) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            host: "h".into(),
            port,
            weight,
            patroni_url: None,
            tls: Default::default(),
        }
    }

    fn assert_retired(v: &ClusterView, id: NodeId) {
        let n = &v.nodes[id];
        assert!(n.retired, "{n:?}");
        assert_eq!(n.role, Role::Unknown);
        assert!(!n.healthy && !n.eligible);
        assert_eq!(n.ineligible_reason, Some(Ineligible::Removed));
        assert_eq!((n.replay_lsn, n.lag_bytes, n.lag_ms), (None, None, None));
        assert_ne!(v.primary, Some(id));
        assert!(!v.eligible().any(|e| e == id));
        assert!(!v.active().any(|e| e == id));
    }

    #[test]
    fn ids_stay_stable_and_weights_follow_the_specs() {
        let (mut st, s, t) = healthy_three();
        // Reordered, one weight changed: same ids, no one added or retired.
        let m = st.update_nodes(vec![spec("n2", 1, 1), spec("n0", 1, 1), spec("n1", 1, 7)]);
        assert_eq!(
            m,
            Membership {
                ids: vec![2, 0, 1],
                added: vec![],
                retired: vec![],
                tls_changed: vec![],
            }
        );
        let (v, ev) = st.compute(&s, &[], t);
        assert!(ev.is_empty(), "{ev:?}");
        assert_eq!(v.nodes.len(), 3);
        assert_eq!(v.nodes[1].spec.weight, 7);
        assert!(v.nodes[1].eligible && v.nodes[2].eligible);
        assert!(v.nodes.iter().all(|n| !n.retired));
        // A new name is appended after the existing ids.
        let m = st.update_nodes(vec![
            spec("n0", 1, 1),
            spec("n1", 1, 7),
            spec("n2", 1, 1),
            spec("n3", 1, 1),
        ]);
        assert_eq!(m.ids, vec![0, 1, 2, 3]);
        assert_eq!(m.added, vec![3]);
        let (v, ev) = st.compute(&s, &[], t);
        assert_eq!(v.nodes[3].ineligible_reason, Some(Ineligible::Down));
        assert_eq!(
            ev,
            vec![ClusterEvent::EligibilityChanged {
                node: 3,
                eligible: false,
                reason: Some(Ineligible::Down),
            }]
        );
        assert!(!st.all_polled(), "the new node has not been polled yet");
        st.record(3, Ok(standby(5000, 1, 0)), t);
        assert!(st.all_polled());
        let (v, _) = st.compute(&s, &[], t);
        assert!(v.nodes[3].eligible);
        // New TLS settings keep the id and the node's state; its monitor must reconnect.
        let mut strict = spec("n1", 1, 7);
        strict.tls = std::sync::Arc::new(pgfresh_nodetls::Settings {
            mode: pgfresh_nodetls::Mode::Require,
            ..Default::default()
        });
        let m = st.update_nodes(vec![
            spec("n0", 1, 1),
            strict,
            spec("n2", 1, 1),
            spec("n3", 1, 1),
        ]);
        assert_eq!(
            (m.ids, m.added, m.tls_changed),
            (vec![0, 1, 2, 3], vec![], vec![1])
        );
        let (v, _) = st.compute(&s, &[], t);
        assert!(v.nodes[1].eligible);
        assert_eq!(v.nodes[1].spec.tls.mode, pgfresh_nodetls::Mode::Require);
    }

    #[test]
    fn retired_node_leaves_everything_and_ignores_late_polls() {
        let (mut st, s, t) = healthy_three();
        st.set_external(
            Some(1),
            ExternalLag {
                lag_ms: 5,
                source: "probe".into(),
                received: t,
            },
        );
        let m = st.update_nodes(vec![spec("n0", 1, 1), spec("n2", 1, 1)]);
        assert_eq!(m.ids, vec![0, 2]);
        assert_eq!(m.retired, vec![1]);
        let (v, ev) = st.compute(&s, &[], t);
        assert_retired(&v, 1);
        assert!(v.nodes[1].external_lag.is_none());
        assert_eq!(v.nodes[1].spec, spec("n1", 1, 1), "last spec kept");
        assert_eq!(v.nodes[1].last_poll_ok, Some(t));
        assert!(v.nodes[2].eligible);
        assert_eq!(v.primary, Some(0));
        assert_eq!(
            ev,
            vec![
                ClusterEvent::RoleChanged {
                    node: 1,
                    from: Role::Standby,
                    to: Role::Unknown,
                },
                ClusterEvent::EligibilityChanged {
                    node: 1,
                    eligible: false,
                    reason: Some(Ineligible::Removed),
                },
            ]
        );
        // A poll that was in flight when the node was removed does not revive it, and
        // lag pushed for it is dropped.
        st.record(1, Ok(standby(5000, 1, 0)), t);
        st.set_external(
            Some(1),
            ExternalLag {
                lag_ms: 5,
                source: "probe".into(),
                received: t,
            },
        );
        let (v, ev) = st.compute(&s, &[], t);
        assert_retired(&v, 1);
        assert!(v.nodes[1].external_lag.is_none());
        assert!(ev.is_empty(), "{ev:?}");
        // Weights by position apply to the current nodes only, in id order.
        st.set_weights(&[4, 9]);
        let (v, _) = st.compute(&s, &[], t);
        let weights: Vec<u32> = v.nodes.iter().map(|n| n.spec.weight).collect();
        assert_eq!(weights, vec![4, 1, 9]);
        // Removing everything leaves no primary.
        let m = st.update_nodes(vec![]);
        assert_eq!(m.retired, vec![0, 2]);
        let (v, ev) = st.compute(&s, &[], t);
        assert!(ev.contains(&ClusterEvent::PrimaryChanged {
            from: Some(0),
            to: None
        }));
        for id in 0..3 {
            assert_retired(&v, id);
        }
        assert!(st.all_polled());
    }

    #[test]
    fn readded_name_with_another_port_gets_a_new_id() {
        let (mut st, s, t) = healthy_three();
        let m = st.update_nodes(vec![spec("n0", 1, 1), spec("n1", 2, 1), spec("n2", 1, 1)]);
        assert_eq!(
            m,
            Membership {
                ids: vec![0, 3, 2],
                added: vec![3],
                retired: vec![1],
                tls_changed: vec![],
            }
        );
        let (v, _) = st.compute(&s, &[], t);
        assert_retired(&v, 1);
        assert_eq!(v.nodes[1].spec.port, 1);
        assert_eq!(v.nodes[3].spec, spec("n1", 2, 1));
        assert!(!v.nodes[3].retired);
        assert_eq!(v.nodes[3].ineligible_reason, Some(Ineligible::Down));
        // Going back to the old port is another new node: ids are never reused.
        let m = st.update_nodes(vec![spec("n0", 1, 1), spec("n1", 1, 1), spec("n2", 1, 1)]);
        assert_eq!(m.ids, vec![0, 4, 2]);
        assert_eq!(m.retired, vec![3]);
        // A changed Patroni URL or host also makes a new node.
        let mut patroni = spec("n2", 1, 1);
        patroni.patroni_url = Some("http://h:8008".into());
        let mut moved = spec("n0", 1, 1);
        moved.host = "elsewhere".into();
        let m = st.update_nodes(vec![moved, spec("n1", 1, 1), patroni]);
        assert_eq!(m.ids, vec![5, 4, 6]);
        assert_eq!(m.retired, vec![0, 2]);
        // A name given twice: the second one is a node of its own.
        let m = st.update_nodes(vec![spec("n1", 1, 1), spec("n1", 1, 1)]);
        assert_eq!(m.ids, vec![4, 7]);
        let (v, _) = st.compute(&s, &[], t);
        assert_eq!(v.nodes.len(), 8);
        assert_eq!(v.active().collect::<Vec<_>>(), vec![4, 7]);
    }

    #[test]
    fn retiring_the_primary() {
        // Alone: no primary any more.
        let (mut st, s, t) = healthy_three();
        st.update_nodes(vec![spec("n1", 1, 1), spec("n2", 1, 1)]);
        let (v, ev) = st.compute(&s, &[], t);
        assert_retired(&v, 0);
        assert_eq!(v.primary, None);
        assert_eq!(v.primary_lsn, None);
        assert!(ev.contains(&ClusterEvent::PrimaryChanged {
            from: Some(0),
            to: None
        }));
        assert!(ev.contains(&ClusterEvent::RoleChanged {
            node: 0,
            from: Role::Primary,
            to: Role::Unknown
        }));
        // A standby promoted later becomes the primary; the retired one never comes back.
        st.record(0, Ok(primary(6000, 2)), t);
        st.record(1, Ok(primary(5100, 2)), t);
        st.record(2, Ok(standby(5100, 2, 0)), t);
        let (v, _) = st.compute(&s, &[], t);
        assert_eq!(v.primary, Some(1));
        assert_retired(&v, 0);
        assert!(v.nodes[2].eligible);

        // With a second node out of recovery: it takes over at once.
        let (mut st, s, t) = healthy_three();
        st.record(2, Ok(primary(5100, 2)), t);
        let (v, _) = st.compute(&s, &[], t);
        assert_eq!(v.primary, Some(0));
        assert_eq!(
            v.nodes[2].ineligible_reason,
            Some(Ineligible::SecondPrimary)
        );
        st.update_nodes(vec![spec("n1", 1, 1), spec("n2", 1, 1)]);
        let (v, ev) = st.compute(&s, &[], t);
        assert_eq!(v.primary, Some(2));
        assert!(ev.contains(&ClusterEvent::PrimaryChanged {
            from: Some(0),
            to: Some(2)
        }));
        assert_eq!(v.nodes[2].ineligible_reason, Some(Ineligible::NotStandby));
        assert_retired(&v, 0);
    }
}
