//! Read-pool eligibility and primary choice, free of I/O.

use crate::settings::NodeId;

/// A node's role as last observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Not in recovery.
    Primary,
    /// In recovery (a hot standby).
    Standby,
    /// Not answering, or not polled yet.
    Unknown,
}

impl Role {
    /// Lower-case name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Standby => "standby",
            Role::Unknown => "unknown",
        }
    }
}

/// Why a node is not in the read pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ineligible {
    /// No poll succeeded within the health timeout (or two in a row failed).
    Down,
    /// It is the primary.
    NotStandby,
    /// In recovery but not streaming from a primary.
    NotStreaming,
    /// Behind the primary by more than the byte threshold.
    LaggingBytes,
    /// Behind the primary by more than the time threshold.
    LaggingTime,
    /// WAL replay is paused (it falls behind with every write).
    Paused,
    /// Receiving a timeline other than the primary's.
    WrongTimeline,
    /// It was a primary and has not yet rejoined as a streaming standby on the primary's
    /// timeline.
    Demoted,
    /// A second node out of recovery; it is neither written to nor read from.
    SecondPrimary,
    /// No longer in the configured node set ([`crate::Balancer::update_nodes`]): it is not
    /// monitored any more and is never selected or named primary.
    Removed,
}

impl Ineligible {
    /// Every reason, for exporting one metric series per reason.
    pub const ALL: [Ineligible; 10] = [
        Ineligible::Down,
        Ineligible::NotStandby,
        Ineligible::NotStreaming,
        Ineligible::LaggingBytes,
        Ineligible::LaggingTime,
        Ineligible::Paused,
        Ineligible::WrongTimeline,
        Ineligible::Demoted,
        Ineligible::SecondPrimary,
        Ineligible::Removed,
    ];

    /// Snake-case name for logs, metrics and the status API.
    pub fn as_str(self) -> &'static str {
        match self {
            Ineligible::Down => "down",
            Ineligible::NotStandby => "not_standby",
            Ineligible::NotStreaming => "not_streaming",
            Ineligible::LaggingBytes => "lagging_bytes",
            Ineligible::LaggingTime => "lagging_time",
            Ineligible::Paused => "paused",
            Ineligible::WrongTimeline => "wrong_timeline",
            Ineligible::Demoted => "demoted",
            Ineligible::SecondPrimary => "second_primary",
            Ineligible::Removed => "removed",
        }
    }
}

/// Whether a lag keeps (or puts) a replica out of the pool.
///
/// A replica in the pool leaves when `lag > threshold`. Once out (`was_out`), it returns
/// only when `lag <= threshold * (1 - hysteresis)`, so a lag hovering at the threshold does
/// not flap it in and out. An unknown lag counts as over any set threshold.
pub fn over_threshold(
    lag: Option<u64>,
    threshold: Option<u64>,
    was_out: bool,
    hysteresis: f64,
) -> bool {
    let Some(threshold) = threshold else {
        return false;
    };
    let Some(lag) = lag else {
        return true;
    };
    if was_out {
        // Truncation is deliberate: re-entry must be at or below the lowered mark.
        let reenter = (threshold as f64 * (1.0 - hysteresis.clamp(0.0, 1.0))) as u64;
        lag > reenter
    } else {
        lag > threshold
    }
}

/// What eligibility is decided from, for one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node answered recently.
    pub healthy: bool,
    /// Its observed role.
    pub role: Role,
    /// It is the node the view names as primary.
    pub is_primary: bool,
    /// A standby that streams (or, without a WAL receiver to ask, has a fresh external lag).
    pub streaming: bool,
    /// Replay is paused.
    pub paused: bool,
    /// Its received timeline differs from the primary's (both known).
    pub wrong_timeline: bool,
    /// It was primary and has not rejoined yet.
    pub demoted: bool,
    /// Over the byte threshold (after hysteresis).
    pub over_bytes: bool,
    /// Over the time threshold (after hysteresis).
    pub over_time: bool,
}

/// The first reason, in order of severity, that keeps a node out of the read pool.
pub fn ineligible_reason(f: &NodeFacts) -> Option<Ineligible> {
    if !f.healthy {
        return Some(Ineligible::Down);
    }
    match f.role {
        Role::Unknown => return Some(Ineligible::Down),
        Role::Primary if f.is_primary => return Some(Ineligible::NotStandby),
        Role::Primary => return Some(Ineligible::SecondPrimary),
        Role::Standby => {}
    }
    if f.demoted {
        Some(Ineligible::Demoted)
    } else if f.wrong_timeline {
        Some(Ineligible::WrongTimeline)
    } else if !f.streaming {
        Some(Ineligible::NotStreaming)
    } else if f.paused {
        Some(Ineligible::Paused)
    } else if f.over_bytes {
        Some(Ineligible::LaggingBytes)
    } else if f.over_time {
        Some(Ineligible::LaggingTime)
    } else {
        None
    }
}

/// A node out of recovery, as seen by the primary choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrimaryCandidate {
    /// The node.
    pub node: NodeId,
    /// Its current timeline, when known.
    pub timeline: Option<u32>,
}

/// Picks the primary from the healthy nodes that report being out of recovery.
///
/// The current primary stays while it is still among them (any other is a second primary:
/// flagged, never written to). Otherwise the switch happens when exactly one candidate
/// exists, or when exactly one is on the highest known timeline (a promotion always starts
/// a new timeline). Anything more ambiguous names no primary rather than two.
pub fn choose_primary(current: Option<NodeId>, candidates: &[PrimaryCandidate]) -> Option<NodeId> {
    if let Some(cur) = current {
        if candidates.iter().any(|c| c.node == cur) {
            return Some(cur);
        }
    }
    match candidates {
        [] => None,
        [only] => Some(only.node),
        many => {
            let top = many.iter().filter_map(|c| c.timeline).max()?;
            let mut on_top = many.iter().filter(|c| c.timeline == Some(top));
            match (on_top.next(), on_top.next()) {
                (Some(c), None) => Some(c.node),
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standby() -> NodeFacts {
        NodeFacts {
            healthy: true,
            role: Role::Standby,
            is_primary: false,
            streaming: true,
            paused: false,
            wrong_timeline: false,
            demoted: false,
            over_bytes: false,
            over_time: false,
        }
    }

    #[test]
    fn hysteresis_leave_above_threshold_return_below_lowered_mark() {
        let t = Some(1000);
        let h = 0.2;
        // In the pool: leaves only above the threshold.
        assert!(!over_threshold(Some(1000), t, false, h));
        assert!(over_threshold(Some(1001), t, false, h));
        // Out of the pool: stays out until at or below 800.
        assert!(over_threshold(Some(1000), t, true, h));
        assert!(over_threshold(Some(801), t, true, h));
        assert!(!over_threshold(Some(800), t, true, h));
        assert!(!over_threshold(Some(0), t, true, h));
    }

    #[test]
    fn hysteresis_sequence_does_not_flap() {
        let t = Some(100);
        let mut out = false;
        let mut transitions = 0;
        // Lag oscillating around the threshold changes membership once, not every sample.
        for lag in [90, 101, 99, 100, 95, 101, 99, 85, 79, 90, 100] {
            let now_out = over_threshold(Some(lag), t, out, 0.2);
            if now_out != out {
                transitions += 1;
            }
            out = now_out;
        }
        // out at 101, back in at 79: two transitions; 90 and 100 stay in.
        assert_eq!(transitions, 2);
        assert!(!out);
    }

    #[test]
    fn no_threshold_never_bans_and_unknown_lag_bans_when_set() {
        assert!(!over_threshold(None, None, true, 0.2));
        assert!(!over_threshold(Some(u64::MAX), None, false, 0.2));
        assert!(over_threshold(None, Some(10), false, 0.2));
    }

    #[test]
    fn hysteresis_extremes() {
        // 0: same mark both ways; 1: must be fully caught up.
        assert!(!over_threshold(Some(10), Some(10), true, 0.0));
        assert!(over_threshold(Some(1), Some(10), true, 1.0));
        assert!(!over_threshold(Some(0), Some(10), true, 1.0));
        // Out-of-range values are clamped.
        assert!(!over_threshold(Some(10), Some(10), true, -3.0));
    }

    #[test]
    fn reasons_in_order() {
        assert_eq!(ineligible_reason(&standby()), None);
        let down = NodeFacts {
            healthy: false,
            paused: true,
            ..standby()
        };
        assert_eq!(ineligible_reason(&down), Some(Ineligible::Down));
        let unknown = NodeFacts {
            role: Role::Unknown,
            ..standby()
        };
        assert_eq!(ineligible_reason(&unknown), Some(Ineligible::Down));
        let primary = NodeFacts {
            role: Role::Primary,
            is_primary: true,
            ..standby()
        };
        assert_eq!(ineligible_reason(&primary), Some(Ineligible::NotStandby));
        let second = NodeFacts {
            role: Role::Primary,
            ..standby()
        };
        assert_eq!(ineligible_reason(&second), Some(Ineligible::SecondPrimary));
        let demoted = NodeFacts {
            demoted: true,
            wrong_timeline: true,
            ..standby()
        };
        assert_eq!(ineligible_reason(&demoted), Some(Ineligible::Demoted));
        let tl = NodeFacts {
            wrong_timeline: true,
            streaming: false,
            ..standby()
        };
        assert_eq!(ineligible_reason(&tl), Some(Ineligible::WrongTimeline));
        let ns = NodeFacts {
            streaming: false,
            paused: true,
            ..standby()
        };
        assert_eq!(ineligible_reason(&ns), Some(Ineligible::NotStreaming));
        let paused = NodeFacts {
            paused: true,
            over_bytes: true,
            ..standby()
        };
        assert_eq!(ineligible_reason(&paused), Some(Ineligible::Paused));
        let bytes = NodeFacts {
            over_bytes: true,
            over_time: true,
            ..standby()
        };
        assert_eq!(ineligible_reason(&bytes), Some(Ineligible::LaggingBytes));
        let time = NodeFacts {
            over_time: true,
            ..standby()
        };
        assert_eq!(ineligible_reason(&time), Some(Ineligible::LaggingTime));
    }

    fn cand(node: NodeId, timeline: Option<u32>) -> PrimaryCandidate {
        PrimaryCandidate { node, timeline }
    }

    #[test]
    fn primary_never_taken_from_order_and_never_two() {
        // Node 2 is the only one out of recovery: it is the primary, whatever the order.
        assert_eq!(choose_primary(None, &[cand(2, Some(1))]), Some(2));
        // The current primary keeps the role while it answers; the other is a second primary.
        assert_eq!(
            choose_primary(Some(0), &[cand(0, Some(1)), cand(1, Some(2))]),
            Some(0)
        );
        // The old primary stopped answering: the promoted one takes over.
        assert_eq!(choose_primary(Some(0), &[cand(1, Some(2))]), Some(1));
        // No one out of recovery: no primary.
        assert_eq!(choose_primary(Some(0), &[]), None);
        // Two candidates, no current: the higher timeline wins; a tie names no one.
        assert_eq!(
            choose_primary(None, &[cand(0, Some(1)), cand(1, Some(2))]),
            Some(1)
        );
        assert_eq!(
            choose_primary(None, &[cand(0, Some(2)), cand(1, Some(2))]),
            None
        );
        assert_eq!(choose_primary(None, &[cand(0, None), cand(1, None)]), None);
    }
}
