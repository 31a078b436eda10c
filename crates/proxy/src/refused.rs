//! Statements the standbys refused, remembered for a while so that their next runs go to
//! the primary at once instead of being refused again (one wasted round trip, and an
//! ERROR in the standby's log, each time).
//!
//! A read a standby refuses with an error the primary would not give (`25006`, `0A000`,
//! `55000`: see `session::unit::Refusal`) runs again on the primary. What made it fail
//! is in the statement (a view calling `nextval()`, an unlogged table pgfresh did not
//! know of) or in the login (a role's or database's serializable default), so the same
//! statement, by the same user in the same database, is remembered here for
//! [`REMEMBER`] and routed to the primary (reason `standby_refused`) until then. The key
//! is the statement's analysis, shared by every session that runs the same text while it
//! stays in the analysis cache (the entry holds it, so its address stays its own), with
//! the database and the user. A recovery conflict is transient and is not remembered.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgfresh_sql::Analysis;

use crate::deps::lock;

/// How long a refused statement goes straight to the primary.
pub const REMEMBER: Duration = Duration::from_secs(60);

/// At most this many statements are remembered; past it, the oldest go first.
pub const MAX_ENTRIES: usize = 10_000;

/// A statement (its analysis' address) run by a login (see [`login_key`]).
type Key = (usize, u64);

/// The statement's analysis, held so that its address stays its own, and until when it
/// is remembered.
type Remembered = (Arc<Analysis>, Instant);

/// The statements remembered (held in `Shared` as `refused`).
#[derive(Default)]
pub struct RefusedReads {
    entries: Mutex<HashMap<Key, Remembered>>,
    /// The number of entries, read without the lock (the common case: none).
    len: AtomicUsize,
}

/// Who runs a statement: its database and user, hashed together.
pub fn login_key(database: &str, user: &str) -> u64 {
    foldhash::fast::FixedState::default().hash_one((database, user))
}

impl RefusedReads {
    /// `parts`, run by `login` (see [`login_key`]), were refused by a standby.
    pub fn remember(&self, login: u64, parts: &[Arc<Analysis>], now: Instant) {
        let mut entries = lock(&self.entries);
        for part in parts {
            if entries.len() >= MAX_ENTRIES {
                entries.retain(|_, (_, until)| *until > now);
            }
            if entries.len() >= MAX_ENTRIES {
                let oldest = entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(k, _)| *k);
                if let Some(k) = oldest {
                    entries.remove(&k);
                }
            }
            entries.insert(
                (Arc::as_ptr(part) as usize, login),
                (part.clone(), now + REMEMBER),
            );
        }
        self.len.store(entries.len(), Ordering::Release);
    }

    /// Whether one of `parts`, run by `login`, was refused within [`REMEMBER`].
    pub fn refused(&self, login: u64, parts: &[Arc<Analysis>], now: Instant) -> bool {
        if self.len.load(Ordering::Acquire) == 0 {
            return false;
        }
        let entries = lock(&self.entries);
        parts.iter().any(|p| {
            entries
                .get(&(Arc::as_ptr(p) as usize, login))
                .is_some_and(|(_, until)| *until > now)
        })
    }

    /// Statements remembered now (expired ones included until the bound makes room).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn analysis(sql: &str) -> Arc<Analysis> {
        Arc::new(pgfresh_sql::analyze_uncached(sql))
    }

    #[test]
    fn a_refused_statement_is_remembered_for_its_login_and_for_a_while() {
        let r = RefusedReads::default();
        let (a, b) = (analysis("SELECT * FROM v"), analysis("SELECT * FROM w"));
        let (alice, bob) = (login_key("app", "alice"), login_key("app", "bob"));
        let t0 = Instant::now();
        assert!(!r.refused(alice, std::slice::from_ref(&a), t0));
        r.remember(alice, std::slice::from_ref(&a), t0);
        assert!(r.refused(alice, std::slice::from_ref(&a), t0));
        // Another statement, another user, the same text in another database: not known.
        assert!(!r.refused(alice, std::slice::from_ref(&b), t0));
        assert!(!r.refused(bob, std::slice::from_ref(&a), t0));
        assert!(!r.refused(login_key("other", "alice"), std::slice::from_ref(&a), t0));
        // Forgotten once the time is up.
        assert!(!r.refused(alice, std::slice::from_ref(&a), t0 + REMEMBER));
    }

    #[test]
    fn past_the_bound_the_oldest_go_first() {
        let r = RefusedReads::default();
        let t0 = Instant::now();
        let first = analysis("SELECT 0");
        r.remember(1, std::slice::from_ref(&first), t0);
        let rest: Vec<_> = (1..MAX_ENTRIES)
            .map(|i| analysis(&format!("SELECT {i}")))
            .collect();
        for (i, a) in rest.iter().enumerate() {
            r.remember(
                1,
                std::slice::from_ref(a),
                t0 + Duration::from_millis(i as u64 + 1),
            );
        }
        assert_eq!(r.len(), MAX_ENTRIES);
        // None has expired yet: the oldest makes room.
        let last = analysis("SELECT 'last'");
        r.remember(1, std::slice::from_ref(&last), t0 + Duration::from_secs(30));
        assert_eq!(r.len(), MAX_ENTRIES);
        assert!(!r.refused(1, &[first], t0 + Duration::from_secs(30)));
        assert!(r.refused(1, &[last], t0 + Duration::from_secs(30)));
    }
}
