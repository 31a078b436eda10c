//! The window between a schema change that can move effects and the dependency graph
//! that knows it.
//!
//! Some DDL changes what other statements touch behind their text: a new trigger, rule,
//! function body, view, row-security policy, partition or foreign key
//! (`Statement::changes_effects`). The
//! graph learned from the catalog knows such a change only once a load that started
//! after its commit finished. Until then a write is analysed with a graph that may miss
//! what it fires, so pgfresh marks such writes as writing the whole database (with their
//! commit's position, so a replica that replayed them may still serve reads):
//!
//! - a write analysed while such a change is open (sent, not yet ended) or ended but
//!   not yet learned ([`SchemaWindow::stamp`] is `None`);
//! - a write analysed before such a change was sent and committed after it (a write
//!   waiting on the DDL's lock fires the new trigger): [`SchemaWindow::changed_since`]
//!   its stamp;
//! - the unit or transaction holding the change itself (its own writes, and those that
//!   were made earlier and now reach further).
//!
//! The window is also open before a database's first successful load
//! ([`SchemaWindow::unlearned`]): nothing of its triggers is known yet.
//!
//! One window per database, shared by every session through pgfresh; a change made
//! directly on the primary, or through another pgfresh instance, is learned at the next
//! periodic load (documented).

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// What [`SchemaWindow::stamp`] returns: the count of changes sent, cut to 32 bits (a unit
/// in flight carries one, so it is kept small; only equality is asked of it, and 2^32
/// changes would have to be sent while one write is in flight to fool it).
pub type Stamp = u32;

/// Counts of one database's effect-changing schema changes and of what the graph learned.
///
/// Orderings are sequentially consistent: [`SchemaWindow::stamp`] reads `sent` before
/// `open`, and [`SchemaChange::begin`] raises `open` before `sent`, so a stamp that saw
/// a change sent also sees it open.
#[derive(Debug, Default)]
pub struct SchemaWindow {
    /// Changes sent, ever.
    sent: AtomicU64,
    /// Changes sent and not yet ended (committed, rolled back, or lost with their session).
    open: AtomicU64,
    /// Changes ended, ever.
    ended: AtomicU64,
    /// `ended` as of the start of the last successful catalog load: those changes are in
    /// the graph in force.
    learned: AtomicU64,
}

impl SchemaWindow {
    /// The window of a database whose graph was never loaded: open until the first load
    /// succeeds (until then no trigger, cascade or function body of it is known).
    pub fn unlearned() -> SchemaWindow {
        let w = SchemaWindow::default();
        w.ended.store(1, SeqCst);
        w
    }

    /// Taken before a write is analysed with the graph: `Some(stamp)` when the graph in
    /// hand knows every change sent so far, `None` while one is open or not yet learned.
    pub fn stamp(&self) -> Option<Stamp> {
        let sent = self.sent.load(SeqCst) as Stamp;
        let current =
            self.open.load(SeqCst) == 0 && self.learned.load(SeqCst) >= self.ended.load(SeqCst);
        current.then_some(sent)
    }

    /// Whether a change was sent after `stamp` was taken (a write analysed before it may
    /// have run under it).
    pub fn changed_since(&self, stamp: Stamp) -> bool {
        self.sent.load(SeqCst) as Stamp != stamp
    }

    /// Whether the graph in force may miss a change (one is open, or ended and not yet
    /// learned).
    pub fn is_open(&self) -> bool {
        self.stamp().is_none()
    }

    /// Changes sent and not yet ended.
    pub fn changes_in_flight(&self) -> u64 {
        self.open.load(SeqCst)
    }

    /// A catalog load starts: what it will have learned if it succeeds.
    pub fn load_starting(&self) -> u64 {
        self.ended.load(SeqCst)
    }

    /// A load that started at `upto` ([`Self::load_starting`]) succeeded and its graph is
    /// in force.
    pub fn learned(&self, upto: u64) {
        self.learned.fetch_max(upto, SeqCst);
    }
}

/// One effect-changing schema change on its way: begun when its unit is sent, ended when
/// dropped (the unit's transaction ended, or the session went away). Ending it calls
/// `on_end` (which schedules the graph's reload).
pub struct SchemaChange {
    window: Arc<SchemaWindow>,
    on_end: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl SchemaChange {
    pub fn begin(window: Arc<SchemaWindow>, on_end: Box<dyn FnOnce() + Send + Sync>) -> Self {
        window.open.fetch_add(1, SeqCst);
        window.sent.fetch_add(1, SeqCst);
        SchemaChange {
            window,
            on_end: Some(on_end),
        }
    }
}

impl Drop for SchemaChange {
    fn drop(&mut self) {
        // `ended` before `open`: a stamp that sees the change closed sees it not learned.
        self.window.ended.fetch_add(1, SeqCst);
        self.window.open.fetch_sub(1, SeqCst);
        if let Some(f) = self.on_end.take() {
            f();
        }
    }
}

/// The schema changes a unit or a transaction holds: almost always none, so one pointer
/// (a unit in flight is moved on every statement).
///
/// A boxed `Vec` on purpose: a thin pointer (8 bytes) where a `Vec` takes 24 and a boxed
/// slice 16; the rare unit that holds a change pays the second allocation.
#[derive(Debug, Default)]
#[allow(clippy::box_collection)]
pub struct SchemaChanges(Option<Box<Vec<SchemaChange>>>);

impl SchemaChanges {
    /// Holds no change.
    pub fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|v| v.is_empty())
    }

    pub fn push(&mut self, change: SchemaChange) {
        self.0.get_or_insert_with(Box::default).push(change);
    }

    /// Moves every change of `other` here.
    pub fn append(&mut self, other: &mut SchemaChanges) {
        let Some(theirs) = other.0.take() else {
            return;
        };
        match &mut self.0 {
            Some(ours) => ours.extend(*theirs),
            None => self.0 = Some(theirs),
        }
    }
}

impl From<Option<SchemaChange>> for SchemaChanges {
    fn from(change: Option<SchemaChange>) -> Self {
        SchemaChanges(change.map(|c| Box::new(vec![c])))
    }
}

impl std::fmt::Debug for SchemaChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaChange").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn change(w: &Arc<SchemaWindow>, ended: &Arc<AtomicUsize>) -> SchemaChange {
        let ended = ended.clone();
        SchemaChange::begin(
            w.clone(),
            Box::new(move || {
                ended.fetch_add(1, SeqCst);
            }),
        )
    }

    #[test]
    fn the_window_is_open_from_the_change_until_a_load_after_its_end() {
        let w = Arc::new(SchemaWindow::default());
        let ends = Arc::new(AtomicUsize::new(0));
        let before = w.stamp().expect("nothing changed yet");
        let c = change(&w, &ends);
        assert!(w.is_open());
        assert!(
            w.changed_since(before),
            "a write analysed before the change"
        );
        // A load that started while the change was open learns nothing of it.
        let early = w.load_starting();
        drop(c);
        assert_eq!(ends.load(SeqCst), 1, "the end schedules a reload");
        w.learned(early);
        assert!(w.is_open(), "the load started before the change ended");
        let late = w.load_starting();
        w.learned(late);
        let after = w.stamp().expect("learned");
        assert!(!w.changed_since(after));
        assert!(w.changed_since(before));
    }

    #[test]
    fn a_database_never_loaded_is_in_the_window_until_its_first_load() {
        let w = SchemaWindow::unlearned();
        assert!(w.is_open());
        w.learned(w.load_starting());
        assert!(!w.is_open());
    }

    #[test]
    fn overlapping_changes_keep_the_window_open_until_the_last_is_learned() {
        let w = Arc::new(SchemaWindow::default());
        let ends = Arc::new(AtomicUsize::new(0));
        let a = change(&w, &ends);
        let b = change(&w, &ends);
        drop(a);
        w.learned(w.load_starting());
        assert!(w.is_open(), "b is still open");
        drop(b);
        assert!(w.is_open(), "b is not learned");
        w.learned(w.load_starting());
        assert!(!w.is_open());
        // An older load finishing late does not move `learned` back.
        w.learned(0);
        assert!(!w.is_open());
    }
}
