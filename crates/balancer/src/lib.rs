//! The live cluster view behind pgfresh's routing: which node is the primary, which
//! replicas are healthy, how far behind each one is, and which replica serves the next read.
//!
//! [`Balancer::start`] spawns one monitor task per configured node on the current tokio
//! runtime. Each task keeps its own connection (never one from the client pools, so a
//! saturated pool cannot hide a failover) and polls every `sr_check_period`:
//! `pg_is_in_recovery()`, the primary's `pg_current_wal_lsn()` and timeline, and a
//! standby's replay and receive positions, pause state, last replayed transaction time and
//! WAL receiver status and timeline. A node configured with a
//! [`NodeSpec::patroni_url`] is instead polled, at the same period, through Patroni's REST
//! API (`GET /patroni`, plain HTTP only), whose member status is mapped to the same facts
//! ([`patroni`]); SQL and Patroni nodes can be mixed. Every poll publishes a new immutable
//! [`ClusterView`] that readers load without locking ([`Balancer::view`]).
//!
//! * **Roles** come only from the polls, never from the configuration order. The primary
//!   switches as soon as exactly one node is out of recovery (see
//!   [`eligibility::choose_primary`]); a second one is flagged
//!   ([`Ineligible::SecondPrimary`]) and never named the write target.
//! * **Lag** is per replica ([`lag`]): bytes = primary current LSN − replica replay LSN,
//!   never negative; time = 0 once replay reached the primary's position, otherwise how
//!   long ago the primary was first seen past the replay position (from a short history
//!   of the primary's polled positions, so an idle primary writing a checkpoint record does
//!   not make a caught-up replica look seconds late, and a paused replica's lag keeps
//!   growing). Externally measured lag can be pushed ([`Balancer::push_external_lag`]) and
//!   raises the time lag while it is fresh.
//! * **Eligibility**: healthy, in recovery, streaming, not paused, on the primary's
//!   timeline, and within the byte and time thresholds, with hysteresis on the way back.
//!   Every ineligible node carries an [`Ineligible`] reason.
//! * **Selection** ([`Balancer::select_replica`]): weighted random or least outstanding
//!   requests, optionally only among the least-lagged replicas, optionally only among
//!   replicas that replayed a required position. [`Balancer::wait_for`] waits, poll by
//!   poll, for such a replica.
//! * **Timelines** ([`timeline`]): the view carries the primary's timeline and, once read
//!   from the primary's `pg_wal/0000000N.history` (superuser or `EXECUTE` on
//!   `pg_read_file(text)`), its [`TimelineHistory`]. [`ClusterView::translate`] says what a
//!   client's `TLI/X/Y` position means now ([`Translation`]);
//!   [`Balancer::select_replica_for`] and [`Balancer::wait_for_position`] choose only
//!   replicas on the primary's timeline.
//! * **Node set** ([`Balancer::update_nodes`]): nodes can be added and removed live.
//!   Every node keeps its [`NodeId`] for the life of the balancer; a removed node is
//!   retired ([`Ineligible::Removed`]) and stays in the view, never selected.
//! * **Events** ([`Balancer::subscribe`]): role, primary and eligibility changes. The
//!   first successful poll of each node announces its role as a change from
//!   [`Role::Unknown`]: that is its initial discovery, not a failover.
//! * **Metrics** through the `metrics` facade: gauges `pgfresh_replica_lag_bytes{node}`,
//!   `pgfresh_replica_lag_seconds{node}`, `pgfresh_replica_max_lag_bytes`,
//!   `pgfresh_replica_max_lag_seconds`, `pgfresh_replica_eligible{node}`,
//!   `pgfresh_replica_ineligible{node,reason}` (1 for the current reason) and the counter
//!   `pgfresh_role_changes_total{node}`.

mod demand;
pub mod eligibility;
mod fast;
pub mod lag;
mod live;
mod monitor;
pub mod patroni;
mod poll_conn;
mod reader;
mod reports;
mod ring_polls;
pub mod select;
mod settings;
mod state;
pub mod timeline;
mod view;

use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arc_swap::ArcSwap;
use pgfresh_lsn::{Lsn, TokenOrLsn};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

pub use eligibility::{Ineligible, Role};
pub use monitor::{check_login, describe_connect_error, describe_pg_error, LoginCheck};
pub use reader::Reader;
pub use select::Candidate;
pub use settings::{LagTarget, LoadBalance, MonitorSettings, NodeId, NodeSpec};
pub use timeline::{HistoryError, Switch, TimelineHistory, Translation};
pub use view::{ClusterEvent, ClusterView, ExternalLag, NodeStatus};

use state::{Sample, State};

/// Capacity of the event channel; a subscriber that falls further behind gets `Lagged`.
const EVENT_CAPACITY: usize = 1024;

/// No eligible replica replayed the required position before the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no eligible replica replayed {required} before the deadline")]
pub struct WaitTimeout {
    /// The position that was waited for.
    pub required: Lsn,
}

/// Shared between the handle and the monitor tasks.
pub(crate) struct Inner {
    pub(crate) settings: Arc<ArcSwap<MonitorSettings>>,
    state: Mutex<State>,
    pub(crate) view: Arc<ArcSwap<ClusterView>>,
    /// Reads waiting on replay positions: the standbys' monitors poll them faster.
    pub(crate) demand: demand::ReplayDemand,
    /// The standbys as the primary's walsenders know them ([`reports`]).
    pub(crate) reports: reports::Reports,
    /// The live facts ([`live`]: outstanding requests, sampled replay positions) of every
    /// node ever configured, indexed by [`NodeId`]. Only ever grows (replaced under the
    /// state lock, before the view that names a new node is published), so a loaded copy
    /// covers every id of any view loaded before it.
    live: Arc<ArcSwap<Vec<Arc<live::NodeLive>>>>,
    /// Stops each node's monitor task, indexed by [`NodeId`]; `None` once retired. Only
    /// touched under the state lock.
    monitors: Mutex<Vec<Option<CancellationToken>>>,
    /// Where monitor tasks are spawned, also for nodes added from outside the runtime.
    runtime: tokio::runtime::Handle,
    /// The sessions' pgfresh-ring, where the standbys' fast replay polls run
    /// ([`ring_polls`]); `None`: beside the full polls, on tokio.
    pub(crate) ring: Option<pgfresh_ring::Handle>,
    events: broadcast::Sender<ClusterEvent>,
    generation: watch::Sender<u64>,
    ready: watch::Sender<bool>,
    cancel: CancellationToken,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a poll outcome and publishes the resulting view.
    pub(crate) fn record(&self, id: NodeId, outcome: Result<Sample, String>) {
        let mut state = self.lock();
        state.record(id, outcome, Instant::now());
        if let Some(live) = self.live.load().get(id) {
            live.clear_replay();
        }
        if state.all_polled() {
            self.ready.send_if_modified(|r| !std::mem::replace(r, true));
        }
        self.publish(&mut state);
    }

    /// Node `id`'s live facts ([`live`]).
    pub(crate) fn live(&self, id: NodeId) -> Option<Arc<live::NodeLive>> {
        self.live.load().get(id).cloned()
    }

    /// The newest replay position known of node `id`: the published view's, or one
    /// learned since ([`live`]).
    pub(crate) fn known_replay(&self, id: NodeId) -> Option<Lsn> {
        let view = self.view.load().nodes.get(id).and_then(|n| n.replay_lsn);
        view.max(self.live(id).and_then(|l| l.replay()))
    }

    /// Standby `id` replayed `lsn`, as `from` said ([`live`]). Waiters on a position
    /// look again when it moved.
    pub(crate) fn learn_replay(&self, id: NodeId, lsn: Lsn, from: live::Source) {
        if self.live.load().get(id).is_some_and(|l| l.learn(lsn, from)) {
            self.generation.send_modify(|_| {});
        }
    }

    /// The history of `timeline` is known.
    pub(crate) fn has_history(&self, timeline: u32) -> bool {
        self.lock().has_history(timeline)
    }

    /// Keeps a timeline history read from a primary and publishes the view.
    pub(crate) fn record_history(&self, history: timeline::TimelineHistory) {
        let mut state = self.lock();
        state.set_history(history);
        self.publish(&mut state);
    }

    /// Starts the monitor task of node `id`. Called with the state lock held.
    fn spawn_monitor(self: &Arc<Self>, id: NodeId, spec: NodeSpec) {
        let token = self.cancel.child_token();
        let mut monitors = self.monitors.lock().unwrap_or_else(|p| p.into_inner());
        if monitors.len() <= id {
            monitors.resize(id + 1, None);
        }
        monitors[id] = Some(token.clone());
        drop(monitors);
        self.runtime
            .spawn(monitor::run(self.clone(), id, spec, token));
    }

    /// Recomputes the view from `state`, stores it, and announces it.
    fn publish(&self, state: &mut State) {
        let outstanding: Vec<u64> = self
            .live
            .load()
            .iter()
            .map(|c| c.outstanding.load(Ordering::Relaxed))
            .collect();
        let settings = self.settings.load();
        let (view, events) = state.compute(&settings, &outstanding, Instant::now());
        export_metrics(&view, &events);
        for e in &events {
            log_event(&view, e);
        }
        let generation = view.generation;
        self.view.store(Arc::new(view));
        for e in events {
            // No subscriber is not an error.
            let _ = self.events.send(e);
        }
        self.generation.send_replace(generation);
    }
}

/// The cluster view and replica selection. Cheap to clone; the monitor stops when the last
/// clone is dropped or on [`Balancer::shutdown`].
#[derive(Clone)]
pub struct Balancer {
    inner: Arc<Inner>,
    _stop_on_drop: Arc<DropGuard>,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer")
            .field("view", &self.view())
            .finish()
    }
}

/// A chosen replica. Derefs to its [`NodeId`]; while it is alive it counts as one
/// outstanding request on that node (for `least_outstanding`).
#[derive(Debug)]
pub struct Selection {
    node: NodeId,
    counter: Arc<live::NodeLive>,
}

impl Selection {
    /// Counts one more outstanding request on `node` for as long as the selection lives
    /// (its `Drop` counts it off).
    fn counted(node: NodeId, counter: Arc<live::NodeLive>) -> Selection {
        counter.outstanding.fetch_add(1, Ordering::Relaxed);
        Selection { node, counter }
    }

    /// The chosen node.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// A read is about to go to this replica: true when it should ask the replica for its
    /// replay position in the same write, right after the read ([`live`]: reads are
    /// waiting on replay positions, and the replica's fast-poll task granted a sample
    /// this period that no other read took). Report the answer with
    /// [`Balancer::learn_replay`].
    pub fn take_replay_sample(&self) -> bool {
        self.counter.take_sample()
    }
}

impl Deref for Selection {
    type Target = NodeId;
    fn deref(&self) -> &NodeId {
        &self.node
    }
}

impl Drop for Selection {
    fn drop(&mut self) {
        self.counter.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Balancer {
    /// Starts monitoring `nodes` on the current tokio runtime; they get the ids `0..n` in
    /// their order. Nodes added later by [`Balancer::update_nodes`] are monitored on the
    /// same runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(nodes: Vec<NodeSpec>, settings: MonitorSettings) -> Balancer {
        Balancer::start_on(nodes, settings, None)
    }

    /// As [`Balancer::start`], with the standbys' fast replay polls on `ring` (the
    /// sessions' pgfresh-ring runtime, `io_engine = "io_uring"`) rather than on tokio: their
    /// millisecond timers and the commits' wake-ups then stay on the thread that runs the
    /// sessions. The full polls stay on tokio.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start_on(
        nodes: Vec<NodeSpec>,
        settings: MonitorSettings,
        ring: Option<pgfresh_ring::Handle>,
    ) -> Balancer {
        let b = Balancer::unmonitored(&nodes, settings, ring);
        {
            // Held so that a first poll cannot publish before every monitor is registered.
            let _state = b.inner.lock();
            for (id, spec) in nodes.into_iter().enumerate() {
                b.inner.spawn_monitor(id, spec);
            }
        }
        b
    }

    /// A balancer over `nodes` whose monitors are not started.
    fn unmonitored(
        nodes: &[NodeSpec],
        settings: MonitorSettings,
        ring: Option<pgfresh_ring::Handle>,
    ) -> Balancer {
        let cancel = CancellationToken::new();
        let inner = Arc::new(Inner {
            view: Arc::new(ArcSwap::from_pointee(state::initial_view(nodes))),
            state: Mutex::new(State::new(nodes.to_vec())),
            demand: demand::ReplayDemand::new(),
            reports: reports::Reports::default(),
            live: Arc::new(ArcSwap::from_pointee(
                nodes
                    .iter()
                    .map(|n| Arc::new(live::NodeLive::new(&n.name)))
                    .collect(),
            )),
            monitors: Mutex::new(Vec::with_capacity(nodes.len())),
            runtime: tokio::runtime::Handle::current(),
            ring,
            settings: Arc::new(ArcSwap::from_pointee(settings)),
            events: broadcast::channel(EVENT_CAPACITY).0,
            generation: watch::channel(0).0,
            ready: watch::channel(false).0,
            cancel: cancel.clone(),
        });
        if nodes.is_empty() {
            inner.ready.send_replace(true);
        }
        Balancer {
            inner,
            _stop_on_drop: Arc::new(cancel.drop_guard()),
        }
    }

    /// The standbys whose replay positions the primary's walsenders report, as its last
    /// full poll matched them (`replay_from_primary`; see [`reports`]).
    pub fn reported_standbys(&self) -> Vec<NodeId> {
        let Some(primary) = self.primary() else {
            return Vec::new();
        };
        self.inner
            .reports
            .map_of(primary)
            .map(|m| m.by_pid.iter().map(|(_, node)| *node).collect())
            .unwrap_or_default()
    }

    /// The latest snapshot (lock-free).
    pub fn view(&self) -> Arc<ClusterView> {
        self.inner.view.load_full()
    }

    /// The current write target.
    pub fn primary(&self) -> Option<NodeId> {
        self.inner.view.load().primary
    }

    /// Picks an eligible replica by the configured policy; with `required`, only among
    /// replicas whose replay position has reached it. `None` when no replica qualifies.
    pub fn select_replica(&self, required: Option<Lsn>) -> Option<Selection> {
        let (node, counter) = self.pick(required)?;
        Some(Selection::counted(node, counter))
    }

    fn pick(&self, required: Option<Lsn>) -> Option<(NodeId, Arc<live::NodeLive>)> {
        self.pick_in(&self.inner.view.load(), required, None)
    }

    /// Picks among the eligible replicas of `view` that replayed `required` and, with
    /// `timeline`, report exactly that timeline.
    fn pick_in(
        &self,
        view: &ClusterView,
        required: Option<Lsn>,
        timeline: Option<u32>,
    ) -> Option<(NodeId, Arc<live::NodeLive>)> {
        // Loaded after the view: it has an entry for every node the view names.
        let counters = self.inner.live.load();
        let settings = self.inner.settings.load();
        reader::pick_among(
            &self.inner.demand,
            view,
            &counters,
            &settings,
            required,
            timeline,
            &mut rand::rng(),
        )
    }

    /// A reader for one session: [`Reader::select_replica`] and [`Reader::primary`]
    /// answer as [`Balancer::select_replica`] and [`Balancer::primary`] do, from caches
    /// of the published snapshots.
    pub fn reader(&self) -> Reader {
        Reader::new(&self.inner)
    }

    /// Picks a replica for a client-carried position, deciding on one snapshot of the view
    /// (so a failover between translating and choosing cannot mix two timelines).
    ///
    /// The position is translated ([`ClusterView::translate_token`]; a bare LSN counts as
    /// the current timeline). When it is [`Translation::Current`]`(lsn)`, the choice is
    /// among the eligible replicas that replayed `lsn` **and report the primary's
    /// timeline** ([`NodeStatus::timeline`]; a replica whose timeline is unknown is not
    /// chosen). For a bare LSN while the primary's timeline is unknown, the timeline is
    /// not checked (as [`Balancer::select_replica`]).
    ///
    /// `Err` says why no replica: `Current(lsn)` — no such replica has replayed it yet
    /// (wait with [`Balancer::wait_for_position`] or read from the primary);
    /// `Diverged`/`Unknown` — no replica can serve it; the read goes to the primary.
    pub fn select_replica_for(
        &self,
        required: impl Into<TokenOrLsn>,
    ) -> Result<Selection, Translation> {
        let view = self.inner.view.load();
        let (node, counter) = self.pick_for(&view, &required.into())?;
        Ok(Selection::counted(node, counter))
    }

    fn pick_for(
        &self,
        view: &ClusterView,
        required: &TokenOrLsn,
    ) -> Result<(NodeId, Arc<live::NodeLive>), Translation> {
        let translation = view.translate_token(required);
        let Translation::Current(lsn) = translation else {
            return Err(translation);
        };
        self.pick_in(view, Some(lsn), view.primary_timeline)
            .ok_or(translation)
    }

    /// [`Balancer::select_replica_for`] that waits, view by view, until a replica
    /// qualifies or `deadline` passes. Returns at once with `Err` when a view translates
    /// the position as [`Translation::Diverged`] or [`Translation::Unknown`] (the read
    /// belongs on the primary); `Err(Translation::Current(lsn))` is a timeout.
    pub async fn wait_for_position(
        &self,
        required: impl Into<TokenOrLsn>,
        deadline: tokio::time::Instant,
    ) -> Result<NodeId, Translation> {
        let required = required.into();
        let mut views = self.inner.generation.subscribe();
        loop {
            let view = self.inner.view.load();
            let err = match self.pick_for(&view, &required) {
                Ok((node, _)) => return Ok(node),
                Err(e @ Translation::Current(_)) => e,
                Err(e) => return Err(e),
            };
            match tokio::time::timeout_at(deadline, views.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Err(err),
            }
        }
    }

    /// Resolves with an eligible replica that has replayed `required`, as soon as a poll
    /// shows one (it wakes on each new view, it does not spin), or fails at `deadline`.
    pub async fn wait_for(
        &self,
        required: Lsn,
        deadline: tokio::time::Instant,
    ) -> Result<NodeId, WaitTimeout> {
        let mut views = self.inner.generation.subscribe();
        loop {
            if let Some((node, _)) = self.pick(Some(required)) {
                return Ok(node);
            }
            match tokio::time::timeout_at(deadline, views.changed()).await {
                Ok(Ok(())) => {}
                // The monitor is gone: no new view will come.
                Ok(Err(_)) | Err(_) => return Err(WaitTimeout { required }),
            }
        }
    }

    /// A commit through pgfresh ended at `lsn` on the primary: while reads wait on replay
    /// positions, the standbys' fast polls go on until each is known to have replayed it
    /// ([`demand`]).
    pub fn note_commit(&self, lsn: Lsn) {
        self.inner.demand.raise(lsn);
    }

    /// Standby `node` answered a replay sample with `lsn`: reads that need at most that
    /// position may go there from now on.
    pub fn learn_replay(&self, node: NodeId, lsn: Lsn) {
        self.inner.learn_replay(node, lsn, live::Source::Sample);
    }

    /// [`Balancer::view`] with the replay positions learned since it was published
    /// ([`live`]) in place of older ones: what replica selection knows now. For status
    /// pages (it copies the view).
    pub fn view_now(&self) -> ClusterView {
        let mut view = ClusterView::clone(&self.inner.view.load());
        let live = self.inner.live.load();
        for (n, l) in view.nodes.iter_mut().zip(live.iter()) {
            n.replay_lsn = n.replay_lsn.max(l.replay());
        }
        view
    }

    /// Role, primary and eligibility changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ClusterEvent> {
        self.inner.events.subscribe()
    }

    /// Records a lag measured outside the database (for deployments whose replicas cannot
    /// report replay positions). It raises the node's (or every replica's) time lag until
    /// it is older than `external_lag_max_age`, and applies from the next poll on. A value
    /// for a retired or unknown node is ignored.
    pub fn push_external_lag(&self, target: LagTarget, lag_ms: u64, source: String) {
        let lag = ExternalLag {
            lag_ms,
            source,
            received: Instant::now(),
        };
        let mut state = self.inner.lock();
        match target {
            LagTarget::Node(id) => state.set_external(Some(id), lag),
            LagTarget::Pool => state.set_external(None, lag),
        }
        self.inner.publish(&mut state);
    }

    /// Replaces the settings: thresholds and selection apply at once, the poll period from
    /// the next poll, login changes by reconnecting.
    pub fn update_settings(&self, settings: MonitorSettings) {
        self.inner.settings.store(Arc::new(settings));
        let mut state = self.inner.lock();
        self.inner.publish(&mut state);
    }

    /// Replaces the weights of the current (not retired) nodes, in id order — the order of
    /// [`ClusterView::active`] — which is the configuration order as long as nodes were only
    /// appended or removed. Extra values are ignored, missing ones keep the current weight.
    /// [`Balancer::update_nodes`] also updates weights, matched by name.
    pub fn update_weights(&self, weights: Vec<u32>) {
        let mut state = self.inner.lock();
        state.set_weights(&weights);
        self.inner.publish(&mut state);
    }

    /// Replace the node set. Nodes are matched by `name`; a matched node whose host, port or
    /// patroni_url changed counts as removed + added. Existing nodes keep their NodeId; new
    /// nodes get new ids appended after every id ever used (ids are never reused); nodes no
    /// longer listed are retired: their monitor task stops, their NodeStatus stays in the
    /// view with `ineligible_reason = Some(Ineligible::Removed)`, role Unknown, healthy
    /// false, never primary, never selected. Weights of kept nodes are updated from the
    /// specs. Returns the NodeId of each given spec, in order. Emits events for what
    /// changes (a retired primary → PrimaryChanged to None unless another node is primary;
    /// eligibility changes as usual).
    ///
    /// More precisely:
    /// * A name listed twice matches at most one current node; the second spec becomes a
    ///   new node.
    /// * A retired node reports [`ClusterEvent::RoleChanged`] from its last role to
    ///   [`Role::Unknown`] (when its role was known) and
    ///   [`ClusterEvent::EligibilityChanged`] with [`Ineligible::Removed`]. A new node
    ///   starts like one given to [`Balancer::start`]: unknown and
    ///   [`Ineligible::Down`] until its first poll, announced by the usual events.
    /// * A retired node's [`NodeStatus`] keeps its last spec, last successful poll time and
    ///   last error; its positions, lag and pushed lag are cleared. Retired entries are kept
    ///   for the life of the balancer: the view holds one entry per node ever configured.
    /// * Selections still held on a retired node keep counting on it until dropped;
    ///   [`Balancer::wait_for`] and [`Balancer::push_external_lag`] keep working by id.
    /// * [`Balancer::wait_ready`] is a start-up latch: once it has resolved, nodes added
    ///   later do not reset it. Before that, it also waits for the added nodes (and no
    ///   longer for retired ones).
    ///
    /// The new view is published before this returns. It may be called from any thread;
    /// after [`Balancer::shutdown`] the set and view still change but no node is polled.
    pub fn update_nodes(&self, nodes: Vec<NodeSpec>) -> Vec<NodeId> {
        let mut state = self.inner.lock();
        let membership = state.update_nodes(nodes);
        if !membership.added.is_empty() {
            let mut live = Vec::clone(&self.inner.live.load());
            while live.len() < state.len() {
                live.push(Arc::new(live::NodeLive::new(&state.spec(live.len()).name)));
            }
            self.inner.live.store(Arc::new(live));
        }
        {
            let mut monitors = self
                .inner
                .monitors
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for &id in &membership.retired {
                if let Some(token) = monitors.get_mut(id).and_then(Option::take) {
                    token.cancel();
                }
            }
        }
        for &id in membership.added.iter().chain(&membership.tls_changed) {
            // A node's new TLS settings: its monitor starts again with them.
            if let Some(token) = self
                .inner
                .monitors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(id)
                .and_then(Option::take)
            {
                token.cancel();
            }
            self.inner.spawn_monitor(id, state.spec(id).clone());
        }
        if state.all_polled() {
            self.inner
                .ready
                .send_if_modified(|r| !std::mem::replace(r, true));
        }
        self.inner.publish(&mut state);
        membership.ids
    }

    /// Waits until every node has been polled once (successfully or not); false if the
    /// deadline came first.
    pub async fn wait_ready(&self, deadline: tokio::time::Instant) -> bool {
        let mut ready = self.inner.ready.subscribe();
        let outcome = tokio::time::timeout_at(deadline, ready.wait_for(|r| *r)).await;
        matches!(outcome, Ok(Ok(_)))
    }

    /// Stops the monitor tasks. The last view stays readable but no longer changes.
    pub fn shutdown(&self) {
        self.inner.cancel.cancel();
    }
}

fn export_metrics(view: &ClusterView, events: &[ClusterEvent]) {
    // In id order: a node re-added under a retired node's name has the higher id, so its
    // values are the ones that stay on the shared `node` label.
    for n in &view.nodes {
        let name = n.spec.name.clone();
        if n.role == Role::Standby {
            if let Some(b) = n.lag_bytes {
                metrics::gauge!("pgfresh_replica_lag_bytes", "node" => name.clone()).set(b as f64);
            }
            if let Some(ms) = n.lag_ms {
                metrics::gauge!("pgfresh_replica_lag_seconds", "node" => name.clone())
                    .set(ms as f64 / 1000.0);
            }
        }
        metrics::gauge!("pgfresh_replica_eligible", "node" => name.clone()).set(if n.eligible {
            1.0
        } else {
            0.0
        });
    }
    metrics::gauge!("pgfresh_replica_max_lag_bytes").set(view.max_lag_bytes.unwrap_or(0) as f64);
    metrics::gauge!("pgfresh_replica_max_lag_seconds")
        .set(view.max_lag_ms.unwrap_or(0) as f64 / 1000.0);
    for e in events {
        match e {
            ClusterEvent::RoleChanged { node, .. } => {
                metrics::counter!("pgfresh_role_changes_total", "node" => view.nodes[*node].spec.name.clone())
                    .increment(1);
            }
            ClusterEvent::EligibilityChanged { node, reason, .. } => {
                let name = &view.nodes[*node].spec.name;
                for r in Ineligible::ALL {
                    let v = if *reason == Some(r) { 1.0 } else { 0.0 };
                    metrics::gauge!("pgfresh_replica_ineligible", "node" => name.clone(), "reason" => r.as_str())
                        .set(v);
                }
            }
            ClusterEvent::PrimaryChanged { .. } => {}
        }
    }
}

fn log_event(view: &ClusterView, e: &ClusterEvent) {
    let name = |i: &NodeId| view.nodes[*i].spec.name.as_str();
    match e {
        ClusterEvent::RoleChanged { node, from, to } => {
            tracing::info!(
                node = name(node),
                from = from.as_str(),
                to = to.as_str(),
                "node role changed"
            );
        }
        ClusterEvent::PrimaryChanged { from: None, to } => {
            // First discovery at start-up, or a primary found again after none was.
            tracing::info!(to = ?to.map(|i| name(&i).to_string()), "primary found");
        }
        ClusterEvent::PrimaryChanged { from, to } => {
            tracing::warn!(from = ?from.map(|i| name(&i).to_string()), to = ?to.map(|i| name(&i).to_string()), "primary changed");
        }
        ClusterEvent::EligibilityChanged {
            node,
            eligible,
            reason,
        } => {
            tracing::info!(
                node = name(node),
                eligible,
                reason = reason.map(Ineligible::as_str),
                "read pool membership changed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::{primary, specs, standby};
    use pgfresh_lsn::Position;

    fn pos(tli: u32, lsn: u64) -> Position {
        Position::new(tli, Lsn(lsn)).unwrap()
    }

    #[tokio::test]
    async fn positions_select_only_replicas_on_the_primarys_timeline() {
        let b = Balancer::unmonitored(&specs(3), MonitorSettings::default(), None);
        // Node 0 was promoted to timeline 2 at 0/5000000; node 1 follows it, node 2 (still
        // on timeline 1, further along) is out of the pool.
        b.inner.record(0, Ok(primary(0x600_0000, 2)));
        b.inner.record(1, Ok(standby(0x550_0000, 2, 0)));
        b.inner.record(2, Ok(standby(0x580_0000, 1, 0)));
        let v = b.view();
        assert_eq!(
            v.nodes[2].ineligible_reason,
            Some(Ineligible::WrongTimeline)
        );

        // Current timeline: the follower once it replayed the position.
        assert_eq!(*b.select_replica_for(pos(2, 0x550_0000)).unwrap(), 1);
        assert_eq!(
            b.select_replica_for(pos(2, 0x550_0001)).unwrap_err(),
            Translation::Current(Lsn(0x550_0001))
        );
        // Earlier timeline while its history is unknown: the primary.
        assert_eq!(
            b.select_replica_for(pos(1, 0x100)).unwrap_err(),
            Translation::Unknown
        );
        b.inner.record_history(
            TimelineHistory::parse(2, "1\t0/5000000\tno recovery target specified\n").unwrap(),
        );
        assert_eq!(*b.select_replica_for(pos(1, 0x100)).unwrap(), 1);
        assert_eq!(
            b.select_replica_for(pos(1, 0x500_0001)).unwrap_err(),
            Translation::Diverged {
                switch: Lsn(0x500_0000)
            }
        );
        // A bare LSN counts as the current timeline.
        assert_eq!(*b.select_replica_for(Lsn(0x100)).unwrap(), 1);

        // A replica whose timeline is unknown is not chosen for positions, only for plain
        // required LSNs.
        let mut unknown_tl = standby(0x550_0000, 2, 0);
        unknown_tl.timeline = None;
        b.inner.record(1, Ok(unknown_tl));
        assert!(b.view().nodes[1].eligible);
        assert_eq!(*b.select_replica(Some(Lsn(0x100))).unwrap(), 1);
        assert_eq!(
            b.select_replica_for(pos(2, 0x100)).unwrap_err(),
            Translation::Current(Lsn(0x100))
        );
    }

    #[tokio::test]
    async fn a_reader_answers_as_the_balancer_after_every_change() {
        let b = Balancer::unmonitored(&specs(3), MonitorSettings::default(), None);
        let mut r = b.reader();
        assert_eq!(r.primary(), None);
        assert!(r.select_replica(None).is_none());
        b.inner.record(0, Ok(primary(0x600_0000, 2)));
        b.inner.record(1, Ok(standby(0x500_0000, 2, 0)));
        // A new view: the cached one is replaced.
        assert_eq!(r.primary(), Some(0));
        assert_eq!(*r.select_replica(None).unwrap(), 1);
        assert!(r.select_replica(Some(Lsn(0x500_0001))).is_none());
        // A position learned since the view (a fast poll) counts at once.
        b.inner
            .learn_replay(1, Lsn(0x580_0000), crate::live::Source::Poll);
        assert_eq!(*r.select_replica(Some(Lsn(0x580_0000))).unwrap(), 1);
        // A node that joins the view brings its live facts with it.
        b.inner.record(2, Ok(standby(0x600_0000, 2, 0)));
        assert_eq!(*r.select_replica(Some(Lsn(0x600_0000))).unwrap(), 2);
        // New settings: least outstanding avoids the replica a held selection counts on.
        b.update_settings(MonitorSettings {
            load_balance: LoadBalance::LeastOutstanding,
            ..MonitorSettings::default()
        });
        let held = r.select_replica(Some(Lsn(0x500_0000))).unwrap();
        for _ in 0..20 {
            // Each selection below is dropped at once, so only `held` counts.
            let other = r.select_replica(Some(Lsn(0x500_0000))).unwrap().node();
            assert_ne!(other, held.node(), "the held selection counts");
            let same = b.select_replica(Some(Lsn(0x500_0000))).unwrap().node();
            assert_eq!(same, other);
        }
    }

    #[tokio::test]
    async fn waiting_for_a_position() {
        let b = Balancer::unmonitored(&specs(2), MonitorSettings::default(), None);
        b.inner.record(0, Ok(primary(0x600_0000, 2)));
        b.inner.record(1, Ok(standby(0x500_0000, 2, 0)));
        let soon = tokio::time::Instant::now() + std::time::Duration::from_millis(20);
        // Not replayed yet: times out with the position it waited for.
        assert_eq!(
            b.wait_for_position(pos(2, 0x600_0000), soon).await,
            Err(Translation::Current(Lsn(0x600_0000)))
        );
        // Unknown history: answered at once, however long the deadline.
        let later = tokio::time::Instant::now() + std::time::Duration::from_secs(3600);
        assert_eq!(
            b.wait_for_position(pos(1, 0x100), later).await,
            Err(Translation::Unknown)
        );
        // Replayed while waiting.
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.wait_for_position(pos(2, 0x600_0000), later).await })
        };
        tokio::task::yield_now().await;
        b.inner.record(1, Ok(standby(0x600_0000, 2, 0)));
        assert_eq!(waiter.await.unwrap(), Ok(1));
    }
}
