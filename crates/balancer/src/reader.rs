//! Choosing a replica, and a session's cached reader of the balancer's snapshots.
//!
//! Every read asks for a replica: with arc-swap's guarded loads that is three loads (the
//! view, the live facts, the settings), each a thread-local debt-slot dance. A session
//! holds a [`Reader`] instead: one `arc_swap::Cache` per snapshot, so while nothing was
//! published a load is one atomic read and a pointer comparison.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use arc_swap::{ArcSwap, Cache};
use pgfresh_lsn::Lsn;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::demand::ReplayDemand;
use crate::live::NodeLive;
use crate::select::{self, Candidate};
use crate::settings::{MonitorSettings, NodeId};
use crate::view::ClusterView;
use crate::{Inner, Selection};

type Cached<T> = Cache<Arc<ArcSwap<T>>, Arc<T>>;

/// A session's view of the balancer (see [`crate::Balancer::reader`]).
pub struct Reader {
    inner: Arc<Inner>,
    view: Cached<ClusterView>,
    live: Cached<Vec<Arc<NodeLive>>>,
    settings: Cached<MonitorSettings>,
    /// The weighted random choice's generator, the reader's own (seeded from the
    /// thread's): a read draws one number, without the thread-local lookup and the
    /// block cipher of `rand::rng()`.
    rng: SmallRng,
}

impl Reader {
    pub(crate) fn new(inner: &Arc<Inner>) -> Reader {
        Reader {
            inner: inner.clone(),
            view: Cache::new(inner.view.clone()),
            live: Cache::new(inner.live.clone()),
            settings: Cache::new(inner.settings.clone()),
            rng: SmallRng::from_rng(&mut rand::rng()),
        }
    }

    /// The current write target, as [`crate::Balancer::primary`].
    pub fn primary(&mut self) -> Option<NodeId> {
        self.view.load().primary
    }

    /// The view's node-set generation, as [`crate::ClusterView::specs_generation`].
    pub fn specs_generation(&mut self) -> u64 {
        self.view.load().specs_generation
    }

    /// A replica by the configured policy, as [`crate::Balancer::select_replica`].
    pub fn select_replica(&mut self, required: Option<Lsn>) -> Option<Selection> {
        // The view first: the live facts loaded after it cover every node it names.
        let view = self.view.load();
        let live = self.live.load();
        let settings = self.settings.load();
        let (node, counter) = pick_among(
            &self.inner.demand,
            view,
            live,
            settings,
            required,
            None,
            &mut self.rng,
        )?;
        Some(Selection::counted(node, counter))
    }
}

/// Picks among the eligible replicas of `view` that replayed `required` and, with
/// `timeline`, report exactly that timeline. `counters` must cover every node of `view`
/// (loaded after it).
pub(crate) fn pick_among(
    demand: &ReplayDemand,
    view: &ClusterView,
    counters: &[Arc<NodeLive>],
    settings: &MonitorSettings,
    required: Option<Lsn>,
    timeline: Option<u32>,
    rng: &mut impl rand::Rng,
) -> Option<(NodeId, Arc<NodeLive>)> {
    // On the stack for up to eight nodes: this runs for every read. (Filled in place:
    // `collect` would return the whole array by value, a copy of it a read.)
    let mut candidates: smallvec::SmallVec<[Candidate; 8]> = smallvec::SmallVec::new();
    candidates.extend(
        view.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.eligible)
            .filter(|(i, n)| {
                required.is_none_or(|r| {
                    // The newer of the view's position and one learned since.
                    let learned = counters.get(*i).and_then(|l| l.replay());
                    n.replay_lsn.max(learned).is_some_and(|l| l >= r)
                })
            })
            .filter(|(_, n)| timeline.is_none_or(|t| n.timeline == Some(t)))
            .filter_map(|(i, n)| {
                Some(Candidate {
                    node: i,
                    weight: n.spec.weight,
                    outstanding: counters.get(i)?.outstanding.load(Ordering::Relaxed),
                    lag_bytes: n.lag_bytes,
                    lag_ms: n.lag_ms,
                })
            }),
    );
    if let Some(required) = required.filter(|_| candidates.is_empty()) {
        // A read waits on a position: poll the standbys' replay faster for a while.
        demand.record(required);
    }
    let node = select::pick(
        &candidates,
        settings.load_balance,
        settings.prefer_lower_delay_standby,
        rng,
    )?;
    Some((node, counters.get(node)?.clone()))
}
