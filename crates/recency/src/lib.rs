//! The memory of what was written recently.
//!
//! When a transaction that wrote relations commits, the proxy records them with
//! [`RecencyMap::mark`]; a read that touches a relation still "hot" — written within
//! the recency TTL (`recent_access_ttl_ms`) — is answered [`Hotness::Hot`] by
//! [`RecencyMap::lookup`] and goes to the primary, or, when the answer carries a
//! `required_lsn`, to a replica that has replayed that far.
//!
//! Behaviour an operator can rely on:
//! - **TTL read at each call.** [`RecencyMap::set_ttl_ms`] (a config reload or a
//!   controller push) applies to entries already recorded. The TTL is clamped to
//!   `max_ttl_ms`. TTL 0 turns recency forcing off: nothing is recorded, lookups
//!   answer cold, and the cold-start window is ignored; the always-hot list still
//!   applies, since it is an explicit routing rule rather than recency.
//! - **Conservative matching** (DESIGN §1.8): a read of unqualified `orders` is hot
//!   if any `*.orders` is hot; a read of `a.orders` is hot if `a.orders` or an
//!   unqualified `orders` write is hot. Names arrive folded by the SQL layer.
//! - **LSNs.** Each entry keeps the highest commit LSN of its current hot streak, or
//!   "unknown" if any write of the streak came without one. A hot answer's
//!   `required_lsn` is the highest LSN among the matched entries, `None` if any is
//!   unknown — then only the primary will do.
//! - **Staleness cap.** With `max_staleness_ms`, a relation written without a pause
//!   as long as the TTL stops forcing reads once its streak is that old: its readers
//!   accept data up to that stale so the primary is not pinned forever.
//! - **Lists.** `never_track` relations are never recorded; `always_hot` relations
//!   are always hot (see [`RelPattern`] for the matching rules).
//! - **Cold start.** For `cold_start_ms` after creation and after
//!   [`RecencyMap::begin_cold_start`] (failover, node-set change), every lookup is
//!   hot: the map cannot know what was written before.
//! - **Bounded memory.** [`RecencyMap::sweep`] frees expired entries in bounded
//!   batches; past `max_entries`, new writes of a database are dropped and that
//!   database answers hot ([`HotReason::Overflow`]) for one TTL after the last drop.
//! - **Injected clock.** Time comes from a [`Clock`]; tests use [`ManualClock`].
//!
//! The crate is synchronous and free of I/O; it is safe to share between threads.
//!
//! ```
//! use std::sync::Arc;
//! use pgfresh_lsn::Lsn;
//! use pgfresh_recency::{ManualClock, RecencyConfig, RecencyMap, RelKey, HotReason};
//!
//! let clock = Arc::new(ManualClock::new(0));
//! let cfg = RecencyConfig { ttl_ms: 1_000, cold_start_ms: 0, ..RecencyConfig::default() };
//! let map = RecencyMap::new(cfg, clock.clone());
//!
//! map.mark("shop", &[RelKey::qualified("app", "orders")], Some(Lsn(0x1_0000_0010)));
//! let answer = map.lookup("shop", &[RelKey::unqualified("orders")]);
//! assert_eq!(answer.reason(), Some(HotReason::RecentWrite));
//! assert_eq!(answer.required_lsn(), Some("1/10".parse().unwrap()));
//!
//! clock.advance(1_000);
//! assert!(!map.lookup("shop", &[RelKey::unqualified("orders")]).is_hot());
//! ```

mod clock;
mod config;
mod counters;
mod database;
mod hotness;
mod key;
mod lookup;
mod map;
mod sweep;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ParsePatternError, RecencyConfig, RelKey, RelPattern};
pub use hotness::{HotEntry, HotReason, Hotness, RecencyStats, SweepStats};
pub use map::RecencyMap;
pub use pgfresh_lsn::Lsn;
