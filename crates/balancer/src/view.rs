//! The published snapshot of the cluster and the events that announce its changes.

use std::sync::Arc;
use std::time::Instant;

use pgfresh_lsn::{Lsn, Position, TokenOrLsn};

use crate::eligibility::{Ineligible, Role};
use crate::settings::{NodeId, NodeSpec};
use crate::timeline::{TimelineHistory, Translation};

/// A lag value pushed from outside the database, with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalLag {
    /// The lag, in milliseconds.
    pub lag_ms: u64,
    /// Who measured it (free text, for display).
    pub source: String,
    /// When it was pushed.
    pub received: Instant,
}

/// One node in a [`ClusterView`].
#[derive(Debug, Clone, PartialEq)]
pub struct NodeStatus {
    /// The node as configured (with its current weight); for a retired node, as it was
    /// last configured.
    pub spec: NodeSpec,
    /// Role from the last poll; [`Role::Unknown`] while the node is down.
    pub role: Role,
    /// A poll succeeded within the health timeout (and the last two did not both fail).
    pub healthy: bool,
    /// On the primary: its current WAL write position.
    pub current_lsn: Option<Lsn>,
    /// On a standby: the last WAL position replayed.
    pub replay_lsn: Option<Lsn>,
    /// On a standby: the last WAL position received and flushed.
    pub receive_lsn: Option<Lsn>,
    /// On a standby: bytes behind the primary's current position.
    pub lag_bytes: Option<u64>,
    /// On a standby: milliseconds since the primary was first seen past this node's replay
    /// position (0 when replay reached the primary's position; see [`crate::lag`]), raised
    /// by any fresh externally pushed lag. `None` when it cannot be told.
    pub lag_ms: Option<u64>,
    /// WAL replay is paused.
    pub paused: bool,
    /// The monitor's connection to the node is encrypted; `None` while it has none (or
    /// the node is watched through Patroni).
    pub tls: Option<bool>,
    /// On a standby: the WAL receiver reports `streaming`.
    pub streaming: bool,
    /// On the primary: its insert timeline (from `pg_walfile_name(pg_current_wal_lsn())`,
    /// right from the moment of a promotion). On a standby: the timeline its WAL receiver
    /// receives (`pg_stat_wal_receiver.received_tli`); without a WAL receiver to ask, the
    /// newer of the timelines of its last restartpoint and of its minimum recovery point
    /// (`pg_control_checkpoint()`, `pg_control_recovery()`) — a lower bound of the
    /// timeline it replays, which can trail it until the next restartpoint. Only the WAL
    /// receiver's timeline decides [`Ineligible::WrongTimeline`].
    pub timeline: Option<u32>,
    /// In the read pool.
    pub eligible: bool,
    /// Why not, when not.
    pub ineligible_reason: Option<Ineligible>,
    /// When a poll last succeeded.
    pub last_poll_ok: Option<Instant>,
    /// The last poll error, cleared by the next success.
    pub last_error: Option<String>,
    /// Requests currently holding a selection of this node (at publication time).
    pub outstanding: u64,
    /// The fresh externally pushed lag for this node, if any.
    pub external_lag: Option<ExternalLag>,
    /// The node was dropped from the configured node set
    /// ([`crate::Balancer::update_nodes`]): it is no longer polled, its role is
    /// [`Role::Unknown`], it is never healthy, primary or selected, and its reason is
    /// [`Ineligible::Removed`]. It keeps its entry (and id) for the status API.
    pub retired: bool,
}

/// An immutable snapshot of the whole cluster, replaced on every poll.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterView {
    /// Every node ever configured, indexed by [`NodeId`]: the current ones and the retired
    /// ones ([`NodeStatus::retired`]), one entry per node for the life of the balancer.
    pub nodes: Vec<NodeStatus>,
    /// The write target, when exactly one is known.
    pub primary: Option<NodeId>,
    /// The primary's current WAL position at its last poll.
    pub primary_lsn: Option<Lsn>,
    /// The primary's timeline at its last poll.
    pub primary_timeline: Option<u32>,
    /// The ancestry of [`ClusterView::primary_timeline`], once known: always for timeline
    /// 1; for a later timeline once the monitor has read the primary's history file (which
    /// needs a monitor role allowed to run `pg_read_file(text)`: superuser, or an explicit
    /// `GRANT EXECUTE`; until then it stays `None`, retried every 5 s). Used by
    /// [`ClusterView::translate`].
    pub timeline_history: Option<Arc<TimelineHistory>>,
    /// Largest byte lag among healthy standbys (eligible or not).
    pub max_lag_bytes: Option<u64>,
    /// Largest time lag among healthy standbys (eligible or not).
    pub max_lag_ms: Option<u64>,
    /// The fresh externally pushed lag for the whole pool, if any.
    pub pool_external_lag: Option<ExternalLag>,
    /// Increases with every published snapshot.
    pub generation: u64,
    /// Increases whenever the node set or a node's spec may have changed (a config
    /// reload), not with polls: what a connection target is made of (`nodes[..].spec`,
    /// `retired`) stays the same while it does.
    pub specs_generation: u64,
}

impl ClusterView {
    /// The nodes currently configured (not retired), in id order.
    pub fn active(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.retired)
            .map(|(i, _)| i)
    }

    /// The nodes currently in the read pool.
    pub fn eligible(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.eligible)
            .map(|(i, _)| i)
    }

    /// Why no primary is known, in words for an operator or a client: that the monitor
    /// cannot reach any node (with the first node's error), or that no reachable node is out
    /// of recovery. Meaningful when [`ClusterView::primary`] is `None`.
    pub fn no_primary_reason(&self) -> String {
        let active: Vec<&NodeStatus> = self.nodes.iter().filter(|n| !n.retired).collect();
        if active.is_empty() {
            return "no nodes are configured".to_string();
        }
        let failing: Vec<&NodeStatus> = active
            .iter()
            .copied()
            .filter(|n| n.role == Role::Unknown && n.last_error.is_some())
            .collect();
        if failing.len() == active.len() {
            let first = failing[0];
            let error = first.last_error.as_deref().unwrap_or_default();
            return format!(
                "the monitor cannot reach any node ({}: {error})",
                first.spec.name
            );
        }
        if active.iter().all(|n| n.role == Role::Unknown) {
            return "the monitor has not reached any node yet".to_string();
        }
        match failing.first() {
            Some(n) => format!(
                "no reachable node is out of recovery; the monitor cannot reach {} ({})",
                n.spec.name,
                n.last_error.as_deref().unwrap_or_default()
            ),
            None => "no node is out of recovery".to_string(),
        }
    }

    /// What a client's position token means for a read now (pure; see [`Translation`]):
    ///
    /// * the primary's timeline → [`Translation::Current`], also while its history is
    ///   unknown;
    /// * an ancestor of it (from [`ClusterView::timeline_history`]) →
    ///   [`Translation::Current`] at or before where that ancestor ended,
    ///   [`Translation::Diverged`] past it;
    /// * anything else — no primary or no primary timeline, history not read yet, a newer
    ///   timeline, an abandoned branch → [`Translation::Unknown`].
    pub fn translate(&self, pos: &Position) -> Translation {
        let Some(current) = self.primary_timeline else {
            return Translation::Unknown;
        };
        if pos.tli() == current {
            return Translation::Current(pos.lsn());
        }
        match &self.timeline_history {
            Some(h) if h.timeline() == current => h.translate(pos),
            _ => Translation::Unknown,
        }
    }

    /// [`ClusterView::translate`] for a token that may lack its timeline: a bare LSN is
    /// taken to be on the current timeline, so it is always [`Translation::Current`].
    pub fn translate_token(&self, token: &TokenOrLsn) -> Translation {
        match token {
            TokenOrLsn::Token(p) => self.translate(p),
            TokenOrLsn::Lsn(l) => Translation::Current(*l),
        }
    }

    /// The status of node `id`, if it exists.
    pub fn node(&self, id: NodeId) -> Option<&NodeStatus> {
        self.nodes.get(id)
    }
}

/// A change worth reacting to, broadcast to [`crate::Balancer::subscribe`]rs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEvent {
    /// A node's observed role changed (including to and from [`Role::Unknown`]): server
    /// connections to it should be closed rather than reused.
    ///
    /// The first successful poll of a node after [`crate::Balancer::start`] is reported as a
    /// change `from: Role::Unknown`: that event is the node's initial discovery, not a role
    /// change of a running node, and there are no earlier server connections to close. A
    /// node that goes down and comes back also reports `Unknown` → its role; a subscriber
    /// tells the two apart by whether it saw the node's earlier `… → Unknown` event. A node
    /// retired by [`crate::Balancer::update_nodes`] reports its last role → `Unknown` once
    /// (when its role was known) and never changes again.
    RoleChanged {
        /// The node.
        node: NodeId,
        /// The role before.
        from: Role,
        /// The role now.
        to: Role,
    },
    /// The write target changed.
    PrimaryChanged {
        /// The previous primary.
        from: Option<NodeId>,
        /// The new one (`None`: no primary known).
        to: Option<NodeId>,
    },
    /// A node entered or left the read pool, or the reason it is out changed.
    EligibilityChanged {
        /// The node.
        node: NodeId,
        /// In the pool now.
        eligible: bool,
        /// Why not, when not.
        reason: Option<Ineligible>,
    },
}
