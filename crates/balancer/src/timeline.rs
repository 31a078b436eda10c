//! Timeline histories and what a client's position token means on the current timeline,
//! free of I/O.
//!
//! A promoted standby starts a new timeline at its *switch point*: WAL before that
//! position is shared with the timeline it forked from, WAL the old primary wrote at or
//! after it is not part of the new history. PostgreSQL records the ancestry of timeline
//! `N` in `pg_wal/0000000N.history` (hexadecimal file name), one line per ancestor:
//! `parentTLI<TAB>X/Y<TAB>reason`, where `X/Y` is where the parent ended and the next
//! timeline of the chain began. The history of timeline `N` lists every ancestor, so one
//! file is the whole chain. Timeline 1 has no ancestors and no file.

use std::fmt;

use pgfresh_lsn::{Lsn, Position};

/// Where one ancestor timeline ended in a [`TimelineHistory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    /// The ancestor timeline.
    pub tli: u32,
    /// Where it ended: its WAL before this position belongs to every later timeline of the
    /// chain; from here on the next timeline of the chain took over.
    pub at: Lsn,
    /// The reason PostgreSQL wrote (`no recovery target specified`), for display.
    pub reason: String,
}

/// The ancestry of one timeline, as read from its history file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineHistory {
    timeline: u32,
    switches: Vec<Switch>,
}

/// A history file that cannot be read as one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid history file for timeline {timeline}, line {line}: {reason}")]
pub struct HistoryError {
    /// The timeline whose history was read.
    pub timeline: u32,
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

impl TimelineHistory {
    /// The history of timeline 1: no ancestors.
    pub fn initial() -> TimelineHistory {
        TimelineHistory {
            timeline: 1,
            switches: Vec::new(),
        }
    }

    /// Reads the content of `timeline`'s history file, the way PostgreSQL does
    /// (`readTimeLineHistory`): blank lines and lines starting with `#` are skipped; every
    /// other line is a decimal timeline id, whitespace, an `X/Y` switch point, and an
    /// optional reason. Timeline ids must increase and stay below `timeline`; switch points
    /// must not decrease.
    pub fn parse(timeline: u32, text: &str) -> Result<TimelineHistory, HistoryError> {
        if timeline == 0 {
            return Err(HistoryError {
                timeline,
                line: 0,
                reason: "timeline 0 does not exist".to_string(),
            });
        }
        let mut switches: Vec<Switch> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let err = |reason: String| HistoryError {
                timeline,
                line: i + 1,
                reason,
            };
            let line = line.trim_start();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.splitn(3, char::is_whitespace);
            let tli_text = fields.next().unwrap_or_default();
            let tli: u32 = tli_text
                .parse()
                .ok()
                .filter(|_| tli_text.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| {
                    err(format!(
                        "expected a numeric timeline id, found {tli_text:?}"
                    ))
                })?;
            let lsn_text = fields.next().unwrap_or_default();
            let at: Lsn = lsn_text.parse().map_err(|_| {
                err(format!(
                    "expected a switch point like 0/3000060 after the timeline id, found {lsn_text:?}"
                ))
            })?;
            let reason = fields.next().unwrap_or_default().trim().to_string();
            if let Some(last) = switches.last() {
                if tli <= last.tli {
                    return Err(err(format!(
                        "timeline ids must increase ({tli} after {})",
                        last.tli
                    )));
                }
                if at < last.at {
                    return Err(err(format!(
                        "switch points must not decrease ({at} after {})",
                        last.at
                    )));
                }
            }
            if tli >= timeline {
                return Err(err(format!(
                    "ancestor timeline {tli} is not older than timeline {timeline}"
                )));
            }
            switches.push(Switch { tli, at, reason });
        }
        Ok(TimelineHistory { timeline, switches })
    }

    /// The timeline this is the history of.
    pub fn timeline(&self) -> u32 {
        self.timeline
    }

    /// Its ancestors, oldest first, with where each ended.
    pub fn switches(&self) -> &[Switch] {
        &self.switches
    }

    /// Where ancestor `tli` ended; `None` when it is not an ancestor (including this
    /// timeline itself).
    pub fn switch_point(&self, tli: u32) -> Option<Lsn> {
        self.switches.iter().find(|s| s.tli == tli).map(|s| s.at)
    }

    /// What `pos` means on this timeline; see [`Translation`].
    ///
    /// * on this timeline → [`Translation::Current`];
    /// * on an ancestor, at or before where it ended → [`Translation::Current`] (the WAL up
    ///   to there is shared);
    /// * on an ancestor, past where it ended → [`Translation::Diverged`];
    /// * on a newer timeline, or an older one that is not an ancestor (a branch abandoned
    ///   by a later promotion) → [`Translation::Unknown`].
    pub fn translate(&self, pos: &Position) -> Translation {
        if pos.tli() == self.timeline {
            return Translation::Current(pos.lsn());
        }
        match self.switch_point(pos.tli()) {
            Some(switch) if pos.lsn() <= switch => Translation::Current(pos.lsn()),
            Some(switch) => Translation::Diverged { switch },
            None => Translation::Unknown,
        }
    }
}

impl fmt::Display for TimelineHistory {
    /// The history file form (`1\t0/3000060\tno recovery target specified`, one line per
    /// ancestor).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.switches {
            writeln!(f, "{}\t{}\t{}", s.tli, s.at, s.reason)?;
        }
        Ok(())
    }
}

/// What a timeline-qualified position means for a read on the current cluster
/// ([`crate::ClusterView::translate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Translation {
    /// The position is part of the primary's current timeline, at this LSN: its timeline
    /// is the primary's, or an ancestor that ended at or after it. Replay positions of
    /// replicas on the primary's timeline compare with it directly.
    Current(Lsn),
    /// The position is on an ancestor timeline past the point where that timeline ended
    /// (`switch`): a write the old primary made that the new primary never received. No
    /// replica can be proven to hold it; the read goes to the primary, and the caller
    /// counts it.
    Diverged {
        /// Where the token's timeline ended.
        switch: Lsn,
    },
    /// Cannot be told: no primary or its timeline is unknown, the token's timeline is
    /// newer than the primary's (a view that has not caught up with a failover, or a stale
    /// primary), not one of its ancestors, or the primary's history has not been read
    /// (yet). The read goes to the primary.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(tli: u32, lsn: u64) -> Position {
        Position::new(tli, Lsn(lsn)).unwrap()
    }

    #[test]
    fn parses_real_history_files() {
        let h = TimelineHistory::parse(2, "1\t0/3000060\tno recovery target specified\n").unwrap();
        assert_eq!(h.timeline(), 2);
        assert_eq!(
            h.switches(),
            &[Switch {
                tli: 1,
                at: Lsn(0x300_0060),
                reason: "no recovery target specified".into()
            }]
        );
        assert_eq!(h.switch_point(1), Some(Lsn(0x300_0060)));
        assert_eq!(h.switch_point(2), None);
        assert_eq!(
            h.to_string(),
            "1\t0/3000060\tno recovery target specified\n"
        );

        let text = "1\t0/3000060\tno recovery target specified\n\n\
                    # a comment\n\
                    2\t0/5000148\tbefore 2026-11-30 11:00:00+00\n";
        let h = TimelineHistory::parse(3, text).unwrap();
        assert_eq!(
            h.switches()
                .iter()
                .map(|s| (s.tli, s.at))
                .collect::<Vec<_>>(),
            vec![(1, Lsn(0x300_0060)), (2, Lsn(0x500_0148))]
        );
        // Skipped timelines (2 abandoned, 3 forked from 1) and no reason at all.
        let h = TimelineHistory::parse(3, "1\t0/3000060\n").unwrap();
        assert_eq!(h.switch_point(2), None);
        assert_eq!(h.switches()[0].reason, "");
        // An empty file: no ancestors.
        assert!(TimelineHistory::parse(1, "").unwrap().switches().is_empty());
        assert_eq!(
            TimelineHistory::initial(),
            TimelineHistory::parse(1, "").unwrap()
        );
    }

    #[test]
    fn rejects_malformed_history_files() {
        for (tl, text, line, want) in [
            (2, "x\t0/1\n", 1, "expected a numeric timeline id"),
            (2, "1\n", 1, "expected a switch point"),
            (2, "1\tzz\treason\n", 1, "expected a switch point"),
            (3, "1\t0/10\n\n1\t0/20\n", 3, "timeline ids must increase"),
            (
                3,
                "1\t0/20\n2\t0/10\n",
                2,
                "switch points must not decrease",
            ),
            (2, "2\t0/10\n", 1, "is not older than timeline 2"),
            (2, "-1\t0/10\n", 1, "expected a numeric timeline id"),
        ] {
            let e = TimelineHistory::parse(tl, text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.reason.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn translates_around_the_switch_point() {
        let h = TimelineHistory::parse(2, "1\t0/3000060\tno recovery target specified\n").unwrap();
        assert_eq!(
            h.translate(&pos(1, 0x300_0000)),
            Translation::Current(Lsn(0x300_0000))
        );
        assert_eq!(
            h.translate(&pos(1, 0x300_0060)),
            Translation::Current(Lsn(0x300_0060))
        );
        assert_eq!(
            h.translate(&pos(1, 0x300_0061)),
            Translation::Diverged {
                switch: Lsn(0x300_0060)
            }
        );
        // On the current timeline, also before its start (the shared prefix).
        assert_eq!(
            h.translate(&pos(2, 0x100)),
            Translation::Current(Lsn(0x100))
        );
        assert_eq!(
            h.translate(&pos(2, 0x900_0000)),
            Translation::Current(Lsn(0x900_0000))
        );
        // A newer timeline than the primary's.
        assert_eq!(h.translate(&pos(3, 0x100)), Translation::Unknown);
    }

    #[test]
    fn translates_multi_hop_histories() {
        // 1 → 2 at 0/3000060, 2 → 3 at 0/5000148.
        let h = TimelineHistory::parse(3, "1\t0/3000060\tx\n2\t0/5000148\ty\n").unwrap();
        assert_eq!(
            h.translate(&pos(1, 0x300_0060)),
            Translation::Current(Lsn(0x300_0060))
        );
        assert_eq!(
            h.translate(&pos(1, 0x400_0000)),
            Translation::Diverged {
                switch: Lsn(0x300_0060)
            }
        );
        assert_eq!(
            h.translate(&pos(2, 0x400_0000)),
            Translation::Current(Lsn(0x400_0000))
        );
        assert_eq!(
            h.translate(&pos(2, 0x500_0148)),
            Translation::Current(Lsn(0x500_0148))
        );
        assert_eq!(
            h.translate(&pos(2, 0x500_0149)),
            Translation::Diverged {
                switch: Lsn(0x500_0148)
            }
        );
        assert_eq!(
            h.translate(&pos(3, 0x700_0000)),
            Translation::Current(Lsn(0x700_0000))
        );
        assert_eq!(h.translate(&pos(4, 0)), Translation::Unknown);

        // 1 → 3 directly (timeline 2 was abandoned): a token on 2 cannot be placed.
        let h = TimelineHistory::parse(3, "1\t0/3000060\tx\n").unwrap();
        assert_eq!(h.translate(&pos(2, 0x100)), Translation::Unknown);
        assert_eq!(
            h.translate(&pos(1, 0x100)),
            Translation::Current(Lsn(0x100))
        );
    }
}
