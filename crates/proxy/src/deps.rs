//! Dependency graphs learned from the primary's catalog, per database (DESIGN §1 rule 6).
//!
//! A statement's side effects (triggers, rewrite rules, foreign-key cascades, partition
//! routing, functions in defaults and checks, the bodies of called functions) are marked with
//! its own writes, and a read of a view or of a table with row-security policies is a read of
//! what those read. The graph that says what those are ([`pgfresh_deps::DepGraph`]) is built
//! from thirteen catalog queries ([`pgfresh_deps::catalog`]) run on the primary, in the database
//! the graph is for, on a connection of pgfresh's own as the `[monitor]` user (as
//! [`crate::catalog`] reads `pg_proc`), plus the manual rules of `relation_dependencies`.
//!
//! - [`Dependencies::graph`] is the hot path: a map load, a few atomics, an `Arc` clone, no
//!   clock. It returns what is loaded (None before the first load) and starts a load in the
//!   background when the database is new or its [`REFRESH`] interval passed (a timer the
//!   worker arms after each load marks the entry due).
//! - [`Dependencies::invalidate`], called after DDL passes through pgfresh, schedules a
//!   reload now. At most one load runs per database; requests during a load cause exactly
//!   one more load after it.
//! - A change made outside this pgfresh is found by [`crate::schema_watch`] (every
//!   `dependency_check_ms`), which marks the whole database and schedules a reload.
//! - When `relation_dependencies` changes, every loaded graph is rebuilt from the catalog
//!   rows already fetched, without querying the catalog.
//! - A failed load is logged (the server's own message and SQLSTATE) and counted; the
//!   previous graph stays in force and the load is retried after [`RETRY_AFTER_ERROR`]
//!   (doubling while failures go on, up to [`REFRESH`]).
//! - With `learn_dependencies = false` nothing is loaded and [`Dependencies::graph`]
//!   returns the graph of the manual rules alone (None when there are none).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::schema_window::{SchemaChange, SchemaWindow};
use pgfresh_config::Config;
use pgfresh_deps::catalog::{
    char_column, EVENT_TRIGGERS_SQL, FOREIGN_KEYS_SQL, FUNCTIONS_SQL, IMPLICIT_CALLS_SQL,
    IMPLICIT_CASTS_SQL, INHERITS_SQL, POLICY_DEPS_SQL, RELATIONS_SQL, RULES_SQL, TRIGGERS_SQL,
    VIEW_CALLS_SQL, VIEW_DEPS_SQL, WRITE_CALLS_SQL,
};
use pgfresh_deps::{
    CatalogRows, DepGraph, EventTriggerRow, ForeignKeyRow, FunctionRow, ImplicitCallRow,
    ImplicitCastRow, InheritsRow, ManualRule, Oid, PolicyDepRow, RelationRow, RuleRow, TriggerRow,
    ViewCallRow, ViewDepRow, WriteCallRow,
};
use tokio::sync::oneshot;

use crate::context::Shared;
use crate::monitor_conn::MonitorConn;

/// How often a database's graph is loaded again without any DDL seen.
pub const REFRESH: Duration = Duration::from_secs(30);

/// After a failed load, the next one starts this much later (sooner than [`REFRESH`], so a
/// graph missing at start-up, before the primary is known, does not stay missing long);
/// the delay doubles with each further failure in a row, up to [`REFRESH`].
pub const RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);

/// The answer of the on-demand calls while nothing is learned.
const NOT_LEARNING: &str = "learn_dependencies is off: nothing is loaded from the catalog";

/// How long a database's first login waits for its first load at most
/// ([`Dependencies::first_load`]).
pub const FIRST_LOAD_WAIT: Duration = Duration::from_secs(5);

/// Databases tracked at most; past it [`Dependencies::graph`] answers None for new ones.
pub const MAX_DATABASES: usize = 1000;

/// A load (connect, thirteen queries) that takes longer is abandoned and counted as an error.
pub const LOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// The manual rules in force, and the graph they make on their own.
struct Rules {
    /// Starts at 1 and grows with every change; a graph records the generation it was
    /// built with (0: no graph yet).
    generation: u64,
    texts: Vec<String>,
    parsed: Vec<ManualRule>,
    /// What `graph()` returns with `learn_dependencies = false`; None without rules.
    rules_only: Option<Arc<DepGraph>>,
}

impl Rules {
    fn new(generation: u64, texts: &[String]) -> Rules {
        // The config was validated with the same parser; a failure here cannot happen, but
        // if it did no rule is better than a wrong one.
        let parsed = pgfresh_deps::parse_rules(texts).unwrap_or_else(|e| {
            tracing::error!(error = %e, "relation_dependencies do not parse; ignoring them");
            Vec::new()
        });
        let rules_only = (!parsed.is_empty())
            .then(|| Arc::new(DepGraph::build(&CatalogRows::default(), &parsed)));
        Rules {
            generation,
            texts: texts.to_vec(),
            parsed,
            rules_only,
        }
    }
}

type Waiter = oneshot::Sender<Result<Arc<DepGraph>, String>>;

/// What the worker of one database has been asked to do.
#[derive(Default)]
struct Work {
    /// A worker task runs (it takes the flags below until none is left).
    running: bool,
    /// Query the catalog again (then rebuild).
    load: bool,
    /// Rebuild from the cached rows (the rules changed).
    rebuild: bool,
    /// Callers of `load_now`, answered after the next load.
    waiters: Vec<Waiter>,
}

pub(crate) struct Entry {
    pub(crate) db: String,
    graph: ArcSwapOption<DepGraph>,
    /// Rules generation the graph in `graph` was built with; 0 before the first.
    built_with: AtomicU64,
    /// The next periodic load is due: set by the timer the worker arms after each load
    /// (and at the start), taken by the first [`Dependencies::graph_of`] call after it.
    due: AtomicBool,
    /// The number of the last timer armed; an older timer that fires changes nothing.
    armed: AtomicU64,
    /// Failed loads in a row (for the retry delay).
    failures: std::sync::atomic::AtomicU32,
    /// The rows of the last successful load, for rebuilds when the rules change.
    rows: Mutex<Option<Arc<CatalogRows>>>,
    work: Mutex<Work>,
    /// Effect-changing schema changes through pgfresh and what the graph learned of them.
    pub(crate) window: Arc<SchemaWindow>,
    /// What [`crate::schema_watch`] compares the catalog with.
    pub(crate) watch: crate::schema_watch::Watch,
    /// Woken after each load, whatever its outcome (see [`Dependencies::first_load`]).
    loaded: tokio::sync::Notify,
    /// A login gave up waiting for the first load: later ones do not wait.
    waited_out: AtomicBool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A database's entry, kept by a caller between calls of [`Dependencies::graph_of`]
/// (entries are never removed; none past [`MAX_DATABASES`]), with its graph read through
/// an `arc_swap::Cache`: while no load replaced the graph, a read is one atomic load.
#[derive(Default)]
pub struct DbEntry(Option<Option<(Arc<Entry>, GraphCache)>>);

type GraphCache = arc_swap::Cache<EntryGraph, Option<Arc<DepGraph>>>;

/// An entry's graph, for its cache.
struct EntryGraph(Arc<Entry>);

impl std::ops::Deref for EntryGraph {
    type Target = ArcSwapOption<DepGraph>;

    fn deref(&self) -> &Self::Target {
        &self.0.graph
    }
}

/// The dependency graphs of the databases clients use (held in [`Shared`] as `deps`).
pub struct Dependencies {
    dbs: ArcSwap<foldhash::HashMap<String, Arc<Entry>>>,
    /// Serializes insertions into `dbs` (copy on write; readers never wait).
    insert: Mutex<()>,
    rules: ArcSwap<Rules>,
    /// `rules`' generation, read by every session turn that asks for a graph (an atomic
    /// load instead of loading the rules).
    generation: AtomicU64,
    learn: AtomicBool,
    /// The shared state loads run with; set once by [`Dependencies::attach`].
    shared: OnceLock<Weak<Shared>>,
}

impl Dependencies {
    /// Empty, with the dependency keys of `config`.
    pub fn new(config: &Config) -> Dependencies {
        Dependencies {
            dbs: ArcSwap::from_pointee(Default::default()),
            insert: Mutex::new(()),
            rules: ArcSwap::from_pointee(Rules::new(1, &config.routing.relation_dependencies)),
            generation: AtomicU64::new(1),
            learn: AtomicBool::new(config.routing.learn_dependencies),
            shared: OnceLock::new(),
        }
    }

    /// Gives the loader the state it loads with (the config, the primary). Called once the
    /// `Shared` holding this is built; later calls change nothing.
    pub fn attach(&self, shared: &Arc<Shared>) {
        if self.shared.get().is_none() {
            let _ = self.shared.set(Arc::downgrade(shared));
        }
    }

    /// Applies `learn_dependencies` and `relation_dependencies` from a new config: when the
    /// rules changed, every loaded graph is rebuilt from its cached catalog rows.
    pub fn apply_config(&self, config: &Config) {
        let r = &config.routing;
        self.learn.store(r.learn_dependencies, Ordering::Relaxed);
        let current = self.rules.load();
        if current.texts == r.relation_dependencies {
            return;
        }
        let rules = Rules::new(current.generation + 1, &r.relation_dependencies);
        tracing::info!(
            rules = rules.parsed.len(),
            "relation_dependencies changed; rebuilding dependency graphs"
        );
        let generation = rules.generation;
        self.rules.store(Arc::new(rules));
        self.generation.store(generation, Ordering::Release);
        for entry in self.dbs.load().values() {
            if entry.built_with.load(Ordering::Relaxed) != 0 {
                self.schedule(entry, false, None);
            }
        }
    }

    pub(crate) fn learning(&self) -> bool {
        self.learn.load(Ordering::Relaxed)
    }

    /// The entry of `db`, created when new (None past [`MAX_DATABASES`]).
    fn entry(&self, db: &str) -> Option<Arc<Entry>> {
        if let Some(e) = self.dbs.load().get(db) {
            return Some(e.clone());
        }
        let _guard = lock(&self.insert);
        let dbs = self.dbs.load_full();
        if let Some(e) = dbs.get(db) {
            return Some(e.clone());
        }
        if dbs.len() >= MAX_DATABASES {
            return None;
        }
        let entry = Arc::new(Entry {
            db: db.to_string(),
            graph: ArcSwapOption::empty(),
            built_with: AtomicU64::new(0),
            due: AtomicBool::new(true),
            armed: AtomicU64::new(0),
            failures: Default::default(),
            rows: Mutex::new(None),
            work: Mutex::new(Work::default()),
            window: Arc::new(SchemaWindow::unlearned()),
            watch: Default::default(),
            loaded: tokio::sync::Notify::new(),
            waited_out: AtomicBool::new(false),
        });
        let mut next = HashMap::clone(&dbs);
        next.insert(db.to_string(), entry.clone());
        self.dbs.store(Arc::new(next));
        Some(entry)
    }

    /// The dependency graph of `db` as loaded so far: None until the first load finished
    /// (or past [`MAX_DATABASES`]). Starts a background load when `db` is new or its
    /// [`REFRESH`] interval passed. With `learn_dependencies = false`, the graph of the
    /// manual rules alone (None without rules). Cheap: no lock is held across an await, no
    /// I/O is waited for.
    pub fn graph(&self, shared: &Arc<Shared>, db: &str) -> Option<Arc<DepGraph>> {
        self.graph_of(shared, db, &mut DbEntry::default())
    }

    /// [`Self::graph`] for a caller that asks again and again for the same database
    /// (a session): `entry` keeps the database's entry between calls, so a call does
    /// not look the name up.
    pub fn graph_of(
        &self,
        shared: &Arc<Shared>,
        db: &str,
        entry: &mut DbEntry,
    ) -> Option<Arc<DepGraph>> {
        let mut held = None;
        self.refresh_graph(shared, db, entry, &mut held);
        held
    }

    /// [`Self::graph_of`] into `held`, the graph a caller keeps between calls: replaced
    /// only when the current one is another (a session asks once a turn, and a clone and
    /// drop of the graph's `Arc` would be two locked changes of a count all sessions share).
    pub fn refresh_graph(
        &self,
        shared: &Arc<Shared>,
        db: &str,
        entry: &mut DbEntry,
        held: &mut Option<Arc<DepGraph>>,
    ) {
        if !self.learning() {
            keep_graph(held, self.rules.load().rules_only.as_ref());
            return;
        }
        self.attach(shared);
        let Some((entry, graph)) = entry
            .0
            .get_or_insert_with(|| {
                self.entry(db)
                    .map(|e| (e.clone(), arc_swap::Cache::new(EntryGraph(e))))
            })
            .as_mut()
        else {
            *held = None;
            return;
        };
        entry.watch.used();
        if entry.due.load(Ordering::Relaxed) {
            // One caller per period starts the load; the worker arms the next timer.
            if entry.due.swap(false, Ordering::AcqRel) {
                self.schedule(entry, true, None);
            }
        } else {
            let built = entry.built_with.load(Ordering::Relaxed);
            if built != 0 && built != self.generation.load(Ordering::Acquire) {
                // The rules changed and the eager rebuild has not finished (or could not
                // start): ask again; requests coalesce.
                self.schedule(entry, false, None);
            }
        }
        keep_graph(held, graph.load().as_ref());
    }

    /// Waits, [`FIRST_LOAD_WAIT`] and `budget` at most, for the first load of `db` to end
    /// (it starts the load if none has). Called at a session's login: until a database is
    /// learned, a statement that calls a user function (not a built-in) may write
    /// anything as far as pgfresh knows, so it goes to the primary and marks the whole
    /// database; a login that waits these few milliseconds once per database spares its
    /// first statements that. Returns at once when the graph is in hand, when nothing is
    /// learned, after a failed load (the statements are then treated as before:
    /// conservatively), and once a login has waited the whole [`FIRST_LOAD_WAIT`] (a load
    /// that hangs delays one round of logins, not every login until it ends).
    pub async fn first_load(
        &self,
        shared: &Arc<Shared>,
        db: &str,
        entry: &mut DbEntry,
        budget: Duration,
    ) {
        if !self.learning() || self.graph_of(shared, db, entry).is_some() {
            return;
        }
        let Some(Some((e, _))) = &entry.0 else {
            return;
        };
        let e = e.clone();
        if e.waited_out.load(Ordering::Relaxed) {
            return;
        }
        let ended = e.loaded.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        // A load that ended between the lookup above and `enable`.
        if e.graph.load().is_some() || e.failures.load(Ordering::Relaxed) > 0 {
            return;
        }
        let full = budget >= FIRST_LOAD_WAIT;
        let timed_out = tokio::time::timeout(budget.min(FIRST_LOAD_WAIT), ended)
            .await
            .is_err();
        // (A login short of time gives up early without ending the others' waits.)
        if timed_out && full && !e.waited_out.swap(true, Ordering::Relaxed) {
            tracing::warn!(database = %e.db, wait = ?FIRST_LOAD_WAIT,
                "the first dependency load did not end within a login's wait; logins go on without waiting for it");
        }
    }

    /// The schema window of the database of `entry`, once [`Self::graph_of`] found its
    /// entry; None with `learn_dependencies = false` (there is no learned graph to be out
    /// of date).
    pub fn window<'e>(&self, entry: &'e DbEntry) -> Option<&'e SchemaWindow> {
        match &entry.0 {
            Some(Some((entry, _))) if self.learning() => Some(&entry.window),
            _ => None,
        }
    }

    /// An effect-changing schema change is being sent in the database of `entry` (found
    /// by [`Self::graph_of`]): the database's window stays open until the change ends
    /// (the guard is dropped, which schedules a reload) and a load after it succeeded.
    /// None when nothing is learned (`learn_dependencies = false`).
    pub fn begin_change(&self, entry: &DbEntry) -> Option<SchemaChange> {
        let Some(Some((entry, _))) = &entry.0 else {
            return None;
        };
        self.change_of(entry)
    }

    /// A schema change of the database of `entry` begins (see [`Self::begin_change`]).
    pub(crate) fn change_of(&self, entry: &Arc<Entry>) -> Option<SchemaChange> {
        if !self.learning() {
            return None;
        }
        let shared = self.shared.get()?.clone();
        let reload = entry.clone();
        Some(SchemaChange::begin(
            entry.window.clone(),
            Box::new(move || {
                if let Some(shared) = shared.upgrade() {
                    shared.deps.schedule(&reload, true, None);
                    shared.catalog.invalidate(&reload.db);
                }
            }),
        ))
    }

    /// Schedules a reload of `db` now (after DDL passed through pgfresh). Coalesces: with a
    /// load in flight, one more load runs after it, however many requests came.
    pub fn invalidate(&self, db: &str) {
        if !self.learning() {
            return;
        }
        if let Some(entry) = self.entry(db) {
            self.schedule(&entry, true, None);
        }
    }

    /// Loads `db` now and returns the graph built (for tests and admin tools). Waits for a
    /// load in flight and then one more, so the answer reflects the catalog as of this call.
    pub async fn load_now(&self, shared: &Arc<Shared>, db: &str) -> Result<Arc<DepGraph>, String> {
        if !self.learning() {
            return Err(NOT_LEARNING.into());
        }
        self.attach(shared);
        let entry = self
            .entry(db)
            .ok_or_else(|| format!("more than {MAX_DATABASES} databases are tracked"))?;
        let (tx, rx) = oneshot::channel();
        self.schedule(&entry, true, Some(tx));
        rx.await
            .map_err(|_| "the dependency loader stopped".to_string())?
    }

    /// Asks the primary now whether the schema of `db` changed outside this pgfresh since
    /// the last check (see [`crate::schema_watch`]), as the periodic check does; true when
    /// it did (the whole database was marked and a reload scheduled). An error when `db`
    /// was never loaded or the primary cannot be asked.
    pub async fn check_now(&self, shared: &Arc<Shared>, db: &str) -> Result<bool, String> {
        if !self.learning() {
            return Err(NOT_LEARNING.into());
        }
        let entry = self
            .dbs
            .load()
            .get(db)
            .cloned()
            .ok_or_else(|| format!("database {db} was never loaded"))?;
        crate::schema_watch::check(shared, &entry).await
    }

    /// The graphs of every database loaded so far, sorted by name (what `graph()` would
    /// return for each: the manual rules alone when `learn_dependencies` is off).
    pub fn loaded(&self) -> Vec<(String, Arc<DepGraph>)> {
        let dbs = self.dbs.load();
        let rules_only = (!self.learning()).then(|| self.rules.load().rules_only.clone());
        let mut out: Vec<(String, Arc<DepGraph>)> = dbs
            .values()
            .filter_map(|e| {
                let g = match &rules_only {
                    Some(r) => r.clone(),
                    None => e.graph.load_full(),
                }?;
                Some((e.db.clone(), g))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Asks the worker of `entry` for a load (`load`) or a rebuild, starting it if idle.
    fn schedule(&self, entry: &Arc<Entry>, load: bool, waiter: Option<Waiter>) {
        let mut work = lock(&entry.work);
        if load {
            work.load = true;
        } else {
            work.rebuild = true;
        }
        work.waiters.extend(waiter);
        if work.running {
            return;
        }
        let Some(shared) = self.shared.get().cloned() else {
            // Not attached yet: the first `graph()` call attaches and loads.
            entry.due.store(true, Ordering::Relaxed);
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            entry.due.store(true, Ordering::Relaxed);
            return;
        };
        work.running = true;
        drop(work);
        rt.spawn(run(shared, entry.clone()));
    }
}

/// Marks `entry` due for a load `after` from now (replacing the timer armed before).
fn arm(entry: &Arc<Entry>, after: Duration) {
    let number = entry.armed.fetch_add(1, Ordering::AcqRel) + 1;
    let entry = entry.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        if entry.armed.load(Ordering::Acquire) == number {
            entry.due.store(true, Ordering::Release);
        }
    });
}

/// The worker of one database: takes requests until none is left.
async fn run(shared: Weak<Shared>, entry: Arc<Entry>) {
    loop {
        let Some(shared) = shared.upgrade() else {
            return; // the proxy is gone
        };
        let deps = &shared.deps;
        let (load, mut rebuild, waiters) = {
            let mut work = lock(&entry.work);
            if !work.load && !work.rebuild {
                work.running = false;
                return;
            }
            let taken = (work.load, work.rebuild, std::mem::take(&mut work.waiters));
            work.load = false;
            work.rebuild = false;
            taken
        };
        let started = Instant::now();
        let mut outcome: Result<(), String> = Ok(());
        if load && !deps.learning() {
            // Asked again once learning is on.
            entry.due.store(true, Ordering::Relaxed);
        }
        let load = load && deps.learning();
        // The schema changes ended before the catalog is read: learned if this load works.
        let upto = entry.window.load_starting();
        if load {
            arm(&entry, REFRESH);
            let fetched = tokio::time::timeout(LOAD_TIMEOUT, fetch(&shared, &entry.db))
                .await
                .unwrap_or_else(|_| Err(format!("timed out after {LOAD_TIMEOUT:?}")));
            match fetched {
                Ok((rows, fingerprint)) => {
                    entry.watch.loaded(fingerprint);
                    crate::schema_watch::start(&shared, &entry);
                    *lock(&entry.rows) = Some(Arc::new(rows));
                    entry.failures.store(0, Ordering::Relaxed);
                    rebuild = true;
                }
                Err(e) => {
                    let failures = entry.failures.fetch_add(1, Ordering::Relaxed).min(8);
                    arm(
                        &entry,
                        (RETRY_AFTER_ERROR * 2u32.pow(failures)).min(REFRESH),
                    );
                    outcome = Err(e);
                }
            }
        } else if !waiters.is_empty() {
            outcome = Err(NOT_LEARNING.into());
        }
        if rebuild {
            let rows = lock(&entry.rows).clone();
            if let Some(rows) = rows {
                let rules = deps.rules.load_full();
                let generation = rules.generation;
                // Parsing function bodies costs tens of milliseconds on big schemas.
                match tokio::task::spawn_blocking(move || DepGraph::build(&rows, &rules.parsed))
                    .await
                {
                    Ok(graph) => {
                        metrics::gauge!("pgfresh_dependency_edges", "database" => entry.db.clone())
                            .set(graph.report().edges.len() as f64);
                        tracing::debug!(
                            database = %entry.db,
                            edges = graph.report().edges.len(),
                            unanalysable = graph.report().unanalysable.len(),
                            "dependency graph built"
                        );
                        entry.graph.store(Some(Arc::new(graph)));
                        entry.built_with.store(generation, Ordering::Relaxed);
                    }
                    Err(e) => {
                        outcome = Err(format!("building the dependency graph failed: {e}"));
                    }
                }
            }
        }
        if load {
            match &outcome {
                Ok(()) => {
                    entry.window.learned(upto);
                    metrics::counter!("pgfresh_dependency_loads_total", "result" => "ok")
                        .increment(1);
                    metrics::histogram!("pgfresh_dependency_load_seconds")
                        .record(started.elapsed().as_secs_f64());
                }
                Err(e) => {
                    metrics::counter!("pgfresh_dependency_loads_total", "result" => "error")
                        .increment(1);
                    tracing::warn!(
                        database = %entry.db,
                        error = %e,
                        "cannot load the dependency graph; the previous one stays in force"
                    );
                }
            }
            entry.loaded.notify_waiters();
        }
        for w in waiters {
            let answer = outcome.clone().and_then(|()| {
                entry
                    .graph
                    .load_full()
                    .ok_or_else(|| "no graph was built".to_string())
            });
            let _ = w.send(answer);
        }
    }
}

/// The name of an edge kind as the admin API writes it (`trigger`, `foreign_key` ...).
pub fn edge_kind_name(kind: pgfresh_deps::EdgeKind) -> String {
    match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{kind:?}").to_ascii_lowercase(),
    }
}

/// The `GET /v1/dependencies` document: `{"databases": {"<db>": <DependencyReport>}}` for
/// every database loaded so far.
pub fn report_json(deps: &Dependencies) -> serde_json::Value {
    let windows = deps.dbs.load();
    let databases: serde_json::Map<String, serde_json::Value> = deps
        .loaded()
        .into_iter()
        .map(|(db, g)| {
            let mut report = serde_json::to_value(g.report()).unwrap_or(serde_json::Value::Null);
            let window = windows
                .get(&db)
                .filter(|_| deps.learning())
                .map(|e| &e.window);
            if let (Some(obj), Some(w)) = (report.as_object_mut(), window) {
                obj.insert(
                    "schema_window".into(),
                    serde_json::json!({
                        "open": w.is_open(),
                        "changes_in_flight": w.changes_in_flight(),
                    }),
                );
            }
            (db, report)
        })
        .collect();
    serde_json::json!({ "databases": databases })
}

/// An error in the server's own words (message and SQLSTATE), not tokio-postgres's
/// generic "db error".
pub(crate) fn pg_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

fn oid(row: &tokio_postgres::Row, col: &str) -> Result<Oid, String> {
    let v: i64 = row.try_get(col).map_err(|e| format!("column {col}: {e}"))?;
    Oid::try_from(v).map_err(|_| format!("column {col}: {v} is not an oid"))
}

fn text(row: &tokio_postgres::Row, col: &str) -> Result<String, String> {
    row.try_get(col).map_err(|e| format!("column {col}: {e}"))
}

fn letter(row: &tokio_postgres::Row, col: &str) -> Result<char, String> {
    Ok(char_column(&text(row, col)?))
}

/// Runs the thirteen catalog queries and the schema fingerprint on the primary in `db`, in
/// one read-only snapshot.
async fn fetch(shared: &Shared, db: &str) -> Result<(CatalogRows, String), String> {
    let mut conn = MonitorConn::open(shared, None, Some(db), "pgfresh dependencies").await?;
    let rows = query_all(&mut conn.client).await;
    conn.close().await;
    rows
}

async fn query_all(client: &mut tokio_postgres::Client) -> Result<(CatalogRows, String), String> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(|e| pg_error(&e))?;
    let run = |what: &'static str, sql: &'static str| {
        let tx = &tx;
        async move {
            tx.query(sql, &[])
                .await
                .map_err(|e| format!("{what} query: {}", pg_error(&e)))
        }
    };
    let mut rows = CatalogRows::default();
    for r in run("relations", RELATIONS_SQL).await? {
        rows.relations.push(RelationRow {
            oid: oid(&r, "oid")?,
            schema: text(&r, "schema")?,
            name: text(&r, "name")?,
            relkind: letter(&r, "relkind")?,
            unlogged: r
                .try_get("unlogged")
                .map_err(|e| format!("column unlogged: {e}"))?,
        });
    }
    for r in run("triggers", TRIGGERS_SQL).await? {
        rows.triggers.push(TriggerRow {
            table_oid: oid(&r, "table_oid")?,
            function_oid: oid(&r, "function_oid")?,
            name: text(&r, "name")?,
        });
    }
    for r in run("foreign_keys", FOREIGN_KEYS_SQL).await? {
        rows.foreign_keys.push(ForeignKeyRow {
            name: text(&r, "name")?,
            referencing_oid: oid(&r, "referencing_oid")?,
            referenced_oid: oid(&r, "referenced_oid")?,
            on_delete: letter(&r, "on_delete")?,
            on_update: letter(&r, "on_update")?,
        });
    }
    for r in run("view_deps", VIEW_DEPS_SQL).await? {
        rows.view_deps.push(ViewDepRow {
            view_oid: oid(&r, "view_oid")?,
            base_oid: oid(&r, "base_oid")?,
        });
    }
    for r in run("inherits", INHERITS_SQL).await? {
        rows.inherits.push(InheritsRow {
            child_oid: oid(&r, "child_oid")?,
            parent_oid: oid(&r, "parent_oid")?,
        });
    }
    for r in run("functions", FUNCTIONS_SQL).await? {
        rows.functions.push(FunctionRow {
            oid: oid(&r, "oid")?,
            schema: text(&r, "schema")?,
            name: text(&r, "name")?,
            language: text(&r, "language")?,
            definition: r
                .try_get::<_, Option<String>>("definition")
                .map_err(|e| format!("column definition: {e}"))?,
            volatility: letter(&r, "volatility")?,
        });
    }
    for r in run("rules", RULES_SQL).await? {
        rows.rules.push(RuleRow {
            table_oid: oid(&r, "table_oid")?,
            name: text(&r, "name")?,
            definition: text(&r, "definition")?,
        });
    }
    for r in run("view_calls", VIEW_CALLS_SQL).await? {
        rows.view_calls.push(ViewCallRow {
            view_oid: oid(&r, "view_oid")?,
            function_oid: oid(&r, "function_oid")?,
        });
    }
    for r in run("policy_deps", POLICY_DEPS_SQL).await? {
        rows.policy_deps.push(PolicyDepRow {
            table_oid: oid(&r, "table_oid")?,
            name: text(&r, "name")?,
            ref_oid: oid(&r, "ref_oid")?,
            ref_kind: letter(&r, "ref_kind")?,
        });
    }
    for r in run("write_calls", WRITE_CALLS_SQL).await? {
        rows.write_calls.push(WriteCallRow {
            table_oid: oid(&r, "table_oid")?,
            function_oid: oid(&r, "function_oid")?,
            via: text(&r, "via")?,
        });
    }
    for r in run("event_triggers", EVENT_TRIGGERS_SQL).await? {
        rows.event_triggers.push(EventTriggerRow {
            name: text(&r, "name")?,
            event: text(&r, "event")?,
            function_oid: oid(&r, "function_oid")?,
        });
    }
    for r in run("implicit_calls", IMPLICIT_CALLS_SQL).await? {
        rows.implicit_calls.push(ImplicitCallRow {
            kind: letter(&r, "kind")?,
            schema: text(&r, "schema")?,
            name: text(&r, "name")?,
            function_oid: oid(&r, "function_oid")?,
            owner_oid: oid(&r, "owner_oid")?,
        });
    }
    for r in run("implicit_casts", IMPLICIT_CASTS_SQL).await? {
        rows.implicit_casts.push(ImplicitCastRow {
            kind: letter(&r, "kind")?,
            schema: text(&r, "schema")?,
            name: text(&r, "name")?,
            function_oid: oid(&r, "function_oid")?,
            oid: oid(&r, "oid")?,
        });
    }
    let fingerprint = crate::schema_watch::fingerprint(&tx).await?;
    tx.commit().await.map_err(|e| pg_error(&e))?;
    Ok((rows, fingerprint))
}

/// Makes `held` the graph `current`, cloning it only when it is another.
fn keep_graph(held: &mut Option<Arc<DepGraph>>, current: Option<&Arc<DepGraph>>) {
    let same = match (&*held, current) {
        (Some(h), Some(c)) => Arc::ptr_eq(h, c),
        (None, None) => true,
        _ => false,
    };
    if !same {
        *held = current.cloned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(learn: bool, rules: &[&str]) -> Config {
        let mut c = pgfresh_config::parse_str(
            "[[nodes]]\nname = \"pg0\"\nhost = \"127.0.0.1\"\nport = 5432\n",
        )
        .unwrap();
        c.routing.learn_dependencies = learn;
        c.routing.relation_dependencies = rules.iter().map(|s| s.to_string()).collect();
        c
    }

    #[test]
    fn rules_only_graph_follows_the_config() {
        let d = Dependencies::new(&config(false, &[]));
        assert!(d.rules.load().rules_only.is_none());
        d.apply_config(&config(false, &["orders -> audit_log"]));
        let rules = d.rules.load();
        assert_eq!(rules.generation, 2);
        let g = rules.rules_only.clone().expect("a graph of the rules");
        let mut marks = Vec::new();
        let e = g.expand_writes(
            &[pgfresh_sql::RelName::new(None, "orders")],
            &[],
            &mut marks,
        );
        assert!(!e.is_whole_database());
        assert_eq!(marks, vec![pgfresh_sql::RelName::new(None, "audit_log")]);
        // The same rules again change nothing.
        d.apply_config(&config(false, &["orders -> audit_log"]));
        assert_eq!(d.rules.load().generation, 2);
        d.apply_config(&config(true, &[]));
        assert!(d.learning());
        assert!(d.rules.load().rules_only.is_none());
    }

    #[test]
    fn databases_are_bounded() {
        let d = Dependencies::new(&config(true, &[]));
        for i in 0..MAX_DATABASES {
            assert!(d.entry(&format!("db{i}")).is_some());
        }
        assert!(d.entry("one_too_many").is_none());
        assert!(d.entry("db7").is_some(), "known databases stay reachable");
        // Unattached and outside a runtime: nothing starts, and nothing is loaded.
        d.invalidate("db7");
        assert!(d.loaded().is_empty());
    }
}
