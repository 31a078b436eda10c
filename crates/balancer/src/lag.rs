//! Lag arithmetic, free of I/O.
//!
//! Lag is always computed per replica from ordered [`Lsn`] values, never averaged, never
//! compared as text, and never negative.

use pgfresh_lsn::Lsn;

/// Bytes the replica's replay position is behind the primary's current position.
///
/// `None` when either position is unknown. The subtraction is `primary − replica` and
/// saturates at zero, so a replica sampled after the primary (and therefore apparently
/// ahead of it) reads as "not behind" instead of wrapping to a huge number or a negative
/// one that a `lag > threshold` test would never catch.
pub fn lag_bytes(primary_current: Option<Lsn>, replica_replay: Option<Lsn>) -> Option<u64> {
    Some(primary_current?.bytes_ahead_of(replica_replay?))
}

/// Milliseconds the replica is behind.
///
/// Zero when the replica has replayed up to the primary's position (an idle primary does
/// not make a caught-up replica look late). Otherwise the age of the last transaction the
/// replica replayed (`replay_age_ms`, measured on the replica as
/// `clock_timestamp() − pg_last_xact_replay_timestamp()`), clamped at zero against clock
/// skew. `None` when the replica is behind and its replay age is unknown, or when a
/// position is missing.
pub fn lag_ms(
    primary_current: Option<Lsn>,
    replica_replay: Option<Lsn>,
    replay_age_ms: Option<i64>,
) -> Option<u64> {
    let behind = lag_bytes(primary_current, replica_replay)?;
    if behind == 0 {
        return Some(0);
    }
    replay_age_ms.map(|age| u64::try_from(age).unwrap_or(0))
}

/// Combines a polled lag with externally pushed ones: the largest known value wins, so a
/// pushed lag can make a replica look later but never hide lag the database reports.
pub fn effective_lag_ms(polled: Option<u64>, pushed: impl IntoIterator<Item = u64>) -> Option<u64> {
    pushed
        .into_iter()
        .fold(polled, |acc, v| Some(acc.map_or(v, |a| a.max(v))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsn(s: &str) -> Option<Lsn> {
        Some(s.parse().unwrap())
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
    }

    #[test]
    fn unknown_positions_give_unknown_lag() {
        assert_eq!(lag_bytes(None, lsn("0/1")), None);
        assert_eq!(lag_bytes(lsn("0/1"), None), None);
        assert_eq!(lag_ms(None, lsn("0/1"), Some(5)), None);
    }

    #[test]
    fn time_lag_zero_when_caught_up_even_if_idle() {
        // The last transaction replayed an hour ago, but nothing happened since.
        assert_eq!(lag_ms(lsn("0/100"), lsn("0/100"), Some(3_600_000)), Some(0));
        // A replica apparently ahead is caught up too.
        assert_eq!(lag_ms(lsn("0/100"), lsn("0/200"), Some(3_600_000)), Some(0));
    }

    #[test]
    fn time_lag_is_replay_age_when_behind() {
        assert_eq!(lag_ms(lsn("0/200"), lsn("0/100"), Some(1500)), Some(1500));
        // Clock skew making the age negative reads as zero, not as a wrapped number.
        assert_eq!(lag_ms(lsn("0/200"), lsn("0/100"), Some(-40)), Some(0));
        // Behind without any replayed transaction yet: unknown.
        assert_eq!(lag_ms(lsn("0/200"), lsn("0/100"), None), None);
    }

    #[test]
    fn pushed_lag_only_raises() {
        assert_eq!(effective_lag_ms(Some(10), [5]), Some(10));
        assert_eq!(effective_lag_ms(Some(10), [50, 20]), Some(50));
        assert_eq!(effective_lag_ms(None, [7]), Some(7));
        assert_eq!(effective_lag_ms(None, []), None);
    }
}
