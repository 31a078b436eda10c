//! Lag arithmetic, free of I/O.
//!
//! Lag is always computed per replica from ordered [`Lsn`] values, never averaged, never
//! compared as text, and never negative.
//!
//! **Byte lag** is the primary's current position minus the replica's replay position.
//!
//! **Time lag** answers "how long ago was the primary at the position this replica has
//! replayed?". The monitor keeps, per primary, a [`PositionHistory`]: the first time each
//! polled `pg_current_wal_lsn()` value was observed. A replica whose replay position has
//! reached the primary's latest position is 0 ms behind; otherwise its lag is the time
//! since the primary was first seen past the replay position. Two consequences:
//!
//! * On an idle primary that writes a little WAL outside any transaction (a checkpoint, a
//!   running-transactions record), a caught-up replica is behind only for the moment it
//!   takes to replay that record: its lag reads as at most about one poll period, not as
//!   the age of the last transaction.
//! * A replica whose replay stopped (paused, or held back by `recovery_min_apply_delay`)
//!   shows a lag that grows with wall-clock time as soon as the primary writes anything.
//!
//! The measurement has the granularity of the primary's poll period: the primary passed the
//! replay position somewhere between two polls, and the later one is used. Positions seen
//! within [`HISTORY_RESOLUTION`] of each other share the earlier time (rounding lag up, never
//! down), which bounds the history to [`HISTORY_SPAN`] / [`HISTORY_RESOLUTION`] entries.
//!
//! When the history does not reach back far enough to say when the primary passed a
//! replica's position (just after start or a failover, or when the replica is more than
//! [`HISTORY_SPAN`] behind), the history only gives a lower bound ([`TimeBehind::AtLeast`]).
//! Only then is the standby's own measure used as well: the age of the last transaction it
//! replayed (`clock_timestamp() − pg_last_xact_replay_timestamp()`). That age never
//! understates lag (the replayed commit is at or before the replay position), so the larger
//! of the two is reported; without it, the lag is unknown, which keeps the replica out of a
//! time-bounded pool instead of letting a replica that was already far behind when the
//! monitor started look fresh.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pgfresh_lsn::Lsn;

/// How far back a [`PositionHistory`] remembers exactly when the primary passed a position.
pub const HISTORY_SPAN: Duration = Duration::from_secs(60);

/// Positions observed closer together than this share one history entry.
pub const HISTORY_RESOLUTION: Duration = Duration::from_millis(10);

/// When a primary was first observed at (or past) each of its recent WAL positions.
///
/// Entries are strictly increasing in both position and time. Observations are expected in
/// time order; a position lower than the latest one means a different WAL history (the node
/// was restored or rewound) and restarts the record.
#[derive(Debug, Clone)]
pub struct PositionHistory {
    /// `(position, first observed at)`, oldest first.
    entries: VecDeque<(Lsn, Instant)>,
    /// The position of the newest entry dropped for age: for replay positions at or above
    /// it, the oldest remaining entry is exactly when the primary passed them.
    floor: Option<Lsn>,
    span: Duration,
    resolution: Duration,
}

impl Default for PositionHistory {
    fn default() -> Self {
        PositionHistory::new(HISTORY_SPAN, HISTORY_RESOLUTION)
    }
}

/// How far a replica's replay position is behind the primary, in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBehind {
    /// The replica has replayed the primary's latest observed position.
    CaughtUp,
    /// The primary was first seen past the replay position this long ago.
    Since(Duration),
    /// The primary was past the replay position already at the oldest remembered
    /// observation, this long ago; the real lag may be larger.
    AtLeast(Duration),
    /// Nothing is known about the primary's positions.
    Unknown,
}

impl PositionHistory {
    /// An empty history remembering `span` back, merging positions seen within `resolution`
    /// of the previous entry into it. The entry count stays below
    /// `span / resolution + 2`.
    pub fn new(span: Duration, resolution: Duration) -> PositionHistory {
        PositionHistory {
            entries: VecDeque::new(),
            floor: None,
            span,
            resolution,
        }
    }

    /// Records that the primary was at `lsn` at time `at`.
    pub fn observe(&mut self, lsn: Lsn, at: Instant) {
        match self.entries.back_mut() {
            Some((latest, _)) if lsn < *latest => {
                self.clear();
                self.entries.push_back((lsn, at));
            }
            Some((latest, _)) if lsn == *latest => {}
            // Close to the previous entry: extend it. Claiming the primary was already at
            // `lsn` a little earlier only ever rounds lag up.
            Some((latest, first_seen))
                if at.saturating_duration_since(*first_seen) < self.resolution =>
            {
                *latest = lsn;
            }
            _ => self.entries.push_back((lsn, at)),
        }
        self.expire(at);
    }

    /// Drops entries older than the span, keeping the newest of them: it still bounds
    /// from below how long ago the primary passed anything before it.
    fn expire(&mut self, now: Instant) {
        let Some(cutoff) = now.checked_sub(self.span) else {
            return;
        };
        while self.entries.len() >= 2 && self.entries[1].1 <= cutoff {
            self.floor = self.entries.pop_front().map(|(lsn, _)| lsn);
        }
    }

    /// Forgets everything (the node stopped being this primary).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.floor = None;
    }

    /// The latest position observed.
    pub fn latest(&self) -> Option<Lsn> {
        self.entries.back().map(|(lsn, _)| *lsn)
    }

    /// Number of entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Nothing observed (since the last [`PositionHistory::clear`]).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How long before `now` the primary first moved past `replay`.
    pub fn time_behind(&self, replay: Lsn, now: Instant) -> TimeBehind {
        let Some(latest) = self.latest() else {
            return TimeBehind::Unknown;
        };
        if replay >= latest {
            return TimeBehind::CaughtUp;
        }
        // The earliest entry past `replay`; one exists because `latest > replay`.
        let idx = self.entries.partition_point(|(lsn, _)| *lsn <= replay);
        let Some(&(_, passed_at)) = self.entries.get(idx) else {
            return TimeBehind::Unknown;
        };
        let elapsed = now.saturating_duration_since(passed_at);
        if idx > 0 || self.floor.is_some_and(|f| replay >= f) {
            TimeBehind::Since(elapsed)
        } else {
            TimeBehind::AtLeast(elapsed)
        }
    }
}

/// Bytes the replica's replay position is behind the primary's current position.
///
/// `None` when either position is unknown. The subtraction is `primary − replica` and
/// saturates at zero, so a replica sampled after the primary (and therefore apparently
/// ahead of it) reads as "not behind" instead of wrapping to a huge number or a negative
/// one that a `lag > threshold` test would never catch.
/// WAL page size (PostgreSQL's default `XLOG_BLCKSZ`).
pub const WAL_PAGE: u64 = 8192;
/// The largest WAL page header (the long header at the start of a segment).
pub const WAL_PAGE_HEADER_MAX: u64 = 40;

/// The replay position to compare with the primary's. When the last record ends
/// exactly at a WAL page boundary, the primary already reports its insert position past
/// the next page's header (24 or 40 bytes further) while a fully caught-up standby reports
/// the boundary itself; without this correction an idle, caught-up standby would look a
/// few bytes, and then ever more seconds, behind.
pub fn effective_replay(replay: Lsn, primary_current: Option<Lsn>) -> Lsn {
    match primary_current {
        Some(p)
            if replay < p && replay.0 % WAL_PAGE == 0 && p.0 - replay.0 <= WAL_PAGE_HEADER_MAX =>
        {
            p
        }
        _ => replay,
    }
}

pub fn lag_bytes(primary_current: Option<Lsn>, replica_replay: Option<Lsn>) -> Option<u64> {
    Some(primary_current?.bytes_ahead_of(replica_replay?))
}

/// Milliseconds the replica is behind, from what the primary's history says
/// ([`PositionHistory::time_behind`]) and, only where that is a lower bound, the age of the
/// last transaction the replica replayed (`replay_age_ms`, measured on the replica; negative
/// values from clock skew count as zero).
///
/// `None` when nothing is known, or when the history gives only a lower bound and the
/// replay age is unknown.
pub fn lag_ms(behind: TimeBehind, replay_age_ms: Option<i64>) -> Option<u64> {
    match behind {
        TimeBehind::CaughtUp => Some(0),
        TimeBehind::Since(d) => Some(millis(d)),
        TimeBehind::AtLeast(d) => {
            replay_age_ms.map(|age| millis(d).max(u64::try_from(age).unwrap_or(0)))
        }
        TimeBehind::Unknown => None,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Combines a polled lag with externally pushed ones: the largest known value wins, so a
/// pushed lag can make a replica look later but never hide lag the database reports.
pub fn effective_lag_ms(polled: Option<u64>, pushed: impl IntoIterator<Item = u64>) -> Option<u64> {
    pushed
        .into_iter()
        .fold(polled, |acc, v| Some(acc.map_or(v, |a| a.max(v))))
}

#[cfg(test)]
mod page_boundary_tests {
    use super::*;

    #[test]
    fn a_standby_at_a_page_boundary_is_caught_up() {
        let boundary = Lsn(5 * WAL_PAGE);
        assert_eq!(
            effective_replay(boundary, Some(Lsn(boundary.0 + 24))),
            Lsn(boundary.0 + 24)
        );
        assert_eq!(
            effective_replay(boundary, Some(Lsn(boundary.0 + 40))),
            Lsn(boundary.0 + 40)
        );
        // Really behind: more than a header, or not at a boundary.
        assert_eq!(
            effective_replay(boundary, Some(Lsn(boundary.0 + 41))),
            boundary
        );
        assert_eq!(
            effective_replay(Lsn(boundary.0 - 8), Some(Lsn(boundary.0 + 16))),
            Lsn(boundary.0 - 8)
        );
        assert_eq!(effective_replay(boundary, None), boundary);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsn(s: &str) -> Option<Lsn> {
        Some(s.parse().unwrap())
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn bytes_behind_is_primary_minus_replica() {
        assert_eq!(
            lag_bytes(lsn("0/3000000"), lsn("0/2000000")),
            Some(0x100_0000)
        );
        assert_eq!(lag_bytes(lsn("1/0"), lsn("0/FFFFFFFF")), Some(1));
        assert_eq!(lag_bytes(lsn("0/5"), lsn("0/5")), Some(0));
    }

    #[test]
    fn inverted_sign_does_not_wrap_or_hide_lag() {
        // The classic bug computes replica − primary. For a replica behind by 1 MiB that is
        // negative: as unsigned it wraps to ~2^64, as signed it is < 0 and never exceeds a
        // threshold, so the lag ban never fires.
        let primary = lsn("0/2100000");
        let replica = lsn("0/2000000");
        let buggy_signed = replica.unwrap().0 as i64 - primary.unwrap().0 as i64;
        assert!(
            buggy_signed < 0,
            "the buggy form never exceeds a positive threshold"
        );
        let threshold = 1024;
        let lag = lag_bytes(primary, replica).unwrap();
        assert_eq!(lag, 0x10_0000);
        assert!(lag > threshold, "the correct form bans the replica");
        // A replica sampled after the primary may look ahead: never behind, never huge.
        assert_eq!(lag_bytes(replica, primary), Some(0));
    }

    #[test]
    fn numeric_not_text_order() {
        // "9/0" > "10/0" as text; the primary at 10/0 is 1<<32 bytes ahead of 9/0.
        assert_eq!(lag_bytes(lsn("10/0"), lsn("9/0")), Some(0x1_0000_0000 * 7));
        assert_eq!(lag_bytes(lsn("A/0"), lsn("9/0")), Some(0x1_0000_0000));
        let mut h = PositionHistory::default();
        let t = Instant::now();
        h.observe(Lsn(0x9_0000_0000), t);
        h.observe(Lsn(0x10_0000_0000), t + ms(100));
        assert_eq!(
            h.time_behind(Lsn(0x9_0000_0000), t + ms(150)),
            TimeBehind::Since(ms(50))
        );
    }

    #[test]
    fn unknown_positions_give_unknown_lag() {
        assert_eq!(lag_bytes(None, lsn("0/1")), None);
        assert_eq!(lag_bytes(lsn("0/1"), None), None);
        let h = PositionHistory::default();
        assert!(h.is_empty());
        assert_eq!(h.time_behind(Lsn(1), Instant::now()), TimeBehind::Unknown);
        assert_eq!(lag_ms(TimeBehind::Unknown, Some(5)), None);
    }

    #[test]
    fn idle_primary_wal_blip_lags_one_poll_not_the_last_commit_age() {
        // The primary polled every 100 ms sits at 0/5000000 for ten seconds; the replica has
        // replayed it, and its last replayed transaction is ten seconds old.
        let poll = ms(100);
        let t0 = Instant::now();
        let idle = Lsn(0x500_0000);
        let mut h = PositionHistory::default();
        for i in 0..100 {
            h.observe(idle, t0 + poll * i);
        }
        let replay_age = Some(10_000);
        let blip_at = t0 + poll * 100;
        assert_eq!(lag_ms(h.time_behind(idle, blip_at), replay_age), Some(0));
        // A checkpoint writes a few bytes of WAL and no transaction.
        h.observe(Lsn(0x500_0068), blip_at);
        // Until the replica's next poll shows the record replayed, it is behind by at most
        // the time since the primary was first seen past it: one poll period at worst.
        for elapsed in [0, 30, 60, 100] {
            let lag = lag_ms(h.time_behind(idle, blip_at + ms(elapsed)), replay_age);
            assert_eq!(lag, Some(elapsed), "not the 10 s age of the last commit");
        }
        h.observe(Lsn(0x500_0068), blip_at + poll);
        assert_eq!(
            lag_ms(h.time_behind(Lsn(0x500_0068), blip_at + poll), replay_age),
            Some(0)
        );
    }

    #[test]
    fn steady_writes_give_the_replica_delay() {
        // The primary writes 100 bytes per millisecond and is polled every 50 ms; the
        // replica replays what the primary had written 300 ms earlier.
        let t0 = Instant::now();
        let at = |t_ms: u64| Lsn(0x100_0000 + t_ms * 100);
        let mut h = PositionHistory::default();
        for step in 0..200u64 {
            let poll_ms = step * 50;
            h.observe(at(poll_ms), t0 + ms(poll_ms));
            if poll_ms < 400 {
                continue;
            }
            // Evaluated between two primary polls, as when a replica's poll lands.
            let now_ms = poll_ms + 23;
            let replay = at(now_ms - 300);
            let lag = lag_ms(h.time_behind(replay, t0 + ms(now_ms)), None).unwrap();
            // The primary passed `replay` 300 ms ago and is first seen past it at its next
            // poll: the measure is within one poll period below the truth.
            assert!((250..=300).contains(&lag), "lag {lag} at {now_ms} ms");
            assert_eq!(lag, 273);
        }
        assert!(h.len() <= 60_000 / 10 + 2);
    }

    #[test]
    fn paused_replica_lag_grows_while_the_primary_writes() {
        let t0 = Instant::now();
        let mut h = PositionHistory::default();
        let replay = Lsn(0x300_0000);
        h.observe(replay, t0);
        assert_eq!(h.time_behind(replay, t0 + ms(500)), TimeBehind::CaughtUp);
        let mut previous = 0;
        for step in 1..=40u32 {
            // One small write per poll; replay stays where it was paused.
            let now = t0 + ms(100) * step;
            h.observe(Lsn(0x300_0000 + u64::from(step) * 0x80), now);
            let lag = lag_ms(h.time_behind(replay, now + ms(20)), Some(0)).unwrap();
            assert_eq!(lag, 100 * u64::from(step - 1) + 20);
            assert!(step == 1 || lag > previous);
            previous = lag;
        }
        // Also once the primary stops writing: the missing WAL keeps getting older.
        assert_eq!(
            h.time_behind(replay, t0 + ms(60_000)),
            TimeBehind::Since(ms(59_900))
        );
    }

    #[test]
    fn observations_close_together_round_lag_up() {
        let t0 = Instant::now();
        let mut h = PositionHistory::new(Duration::from_secs(60), ms(10));
        h.observe(Lsn(100), t0);
        h.observe(Lsn(200), t0 + ms(20));
        h.observe(Lsn(300), t0 + ms(25)); // merged into the 200 entry
        assert_eq!(h.len(), 2);
        assert_eq!(h.latest(), Some(Lsn(300)));
        // The primary passed 250 at 25 ms at the latest; the merged entry says 20 ms.
        assert_eq!(
            h.time_behind(Lsn(250), t0 + ms(100)),
            TimeBehind::Since(ms(80))
        );
        assert_eq!(
            h.time_behind(Lsn(150), t0 + ms(100)),
            TimeBehind::Since(ms(80))
        );
        assert_eq!(h.time_behind(Lsn(300), t0 + ms(100)), TimeBehind::CaughtUp);
    }

    #[test]
    fn history_is_bounded_and_bounds_old_lag_from_below() {
        let span = Duration::from_secs(2);
        let res = ms(10);
        let t0 = Instant::now();
        let mut h = PositionHistory::new(span, res);
        // 20 s of writes observed every millisecond.
        for i in 1..=20_000u64 {
            h.observe(Lsn(i * 10), t0 + ms(i));
            assert!(h.len() <= 2_000 / 10 + 2, "{} entries", h.len());
        }
        let now = t0 + ms(20_000);
        // Recent positions are exact (within the resolution).
        assert!(matches!(
            h.time_behind(Lsn(19_500 * 10), now),
            TimeBehind::Since(d) if d > ms(490) && d <= ms(500)
        ));
        // A position older than the span: the oldest kept entry gives a lower bound of at
        // least the span, raised by the replay age when the standby reports one.
        match h.time_behind(Lsn(10), now) {
            TimeBehind::AtLeast(d) => assert!(d >= span, "{d:?}"),
            other => panic!("expected a lower bound, got {other:?}"),
        }
        assert_eq!(
            lag_ms(h.time_behind(Lsn(10), now), Some(19_999)),
            Some(19_999)
        );
        assert_eq!(lag_ms(h.time_behind(Lsn(10), now), None), None);
        let bound = lag_ms(h.time_behind(Lsn(10), now), Some(5)).unwrap();
        assert!(bound >= 2_000, "{bound}");
        // Just past the dropped entries the answer is exact again.
        let oldest = h.entries[0].0;
        assert!(matches!(
            h.time_behind(oldest, now),
            TimeBehind::Since(d) if d < span + res
        ));
    }

    #[test]
    fn idle_primary_keeps_its_first_observation() {
        // An hour without writes: the only entry is older than the span but is kept, so a
        // replica behind it shows at least the hour.
        let t0 = Instant::now();
        let mut h = PositionHistory::default();
        h.observe(Lsn(500), t0);
        for i in 1..=36_000u32 {
            h.observe(Lsn(500), t0 + ms(100) * i);
        }
        assert_eq!(h.len(), 1);
        let now = t0 + Duration::from_secs(3600);
        assert_eq!(
            h.time_behind(Lsn(400), now),
            TimeBehind::AtLeast(Duration::from_secs(3600))
        );
        assert_eq!(h.time_behind(Lsn(500), now), TimeBehind::CaughtUp);
        // A write after the hour: the caught-up replica is behind only since the write.
        h.observe(Lsn(600), now);
        assert_eq!(
            h.time_behind(Lsn(500), now + ms(40)),
            TimeBehind::Since(ms(40))
        );
    }

    #[test]
    fn position_going_back_restarts_the_history() {
        let t0 = Instant::now();
        let mut h = PositionHistory::default();
        h.observe(Lsn(1000), t0);
        h.observe(Lsn(2000), t0 + ms(100));
        h.observe(Lsn(1500), t0 + ms(200));
        assert_eq!(h.len(), 1);
        assert_eq!(h.latest(), Some(Lsn(1500)));
        assert_eq!(
            h.time_behind(Lsn(1200), t0 + ms(300)),
            TimeBehind::AtLeast(ms(100))
        );
        h.clear();
        assert!(h.is_empty());
    }

    #[test]
    fn lower_bound_uses_replay_age_and_skew_reads_as_zero() {
        let d = ms(400);
        assert_eq!(lag_ms(TimeBehind::AtLeast(d), Some(1500)), Some(1500));
        assert_eq!(lag_ms(TimeBehind::AtLeast(d), Some(100)), Some(400));
        assert_eq!(lag_ms(TimeBehind::AtLeast(d), Some(-40)), Some(400));
        assert_eq!(lag_ms(TimeBehind::AtLeast(d), None), None);
        // Where the history is exact, the replay age plays no part.
        assert_eq!(lag_ms(TimeBehind::Since(d), Some(9_000)), Some(400));
        assert_eq!(lag_ms(TimeBehind::CaughtUp, Some(3_600_000)), Some(0));
        assert_eq!(lag_ms(TimeBehind::CaughtUp, None), Some(0));
    }

    #[test]
    fn pushed_lag_only_raises() {
        assert_eq!(effective_lag_ms(Some(10), [5]), Some(10));
        assert_eq!(effective_lag_ms(Some(10), [50, 20]), Some(50));
        assert_eq!(effective_lag_ms(None, [7]), Some(7));
        assert_eq!(effective_lag_ms(None, []), None);
    }
}
