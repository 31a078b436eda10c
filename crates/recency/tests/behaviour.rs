//! Table-style behaviour tests under a manual clock.

use std::sync::Arc;

use pgfresh_recency::{
    HotReason, Hotness, Lsn, ManualClock, RecencyConfig, RecencyMap, RelKey, RelPattern,
};

fn map_with(cfg: RecencyConfig) -> (Arc<ManualClock>, RecencyMap) {
    let clock = Arc::new(ManualClock::new(1_000));
    let map = RecencyMap::new(cfg, clock.clone());
    (clock, map)
}

fn map(ttl_ms: u64) -> (Arc<ManualClock>, RecencyMap) {
    map_with(RecencyConfig {
        ttl_ms,
        cold_start_ms: 0,
        ..RecencyConfig::default()
    })
}

#[allow(non_snake_case)]
fn U(name: &str) -> RelKey<'_> {
    RelKey::unqualified(name)
}

#[allow(non_snake_case)]
fn Q<'a>(schema: &'a str, name: &'a str) -> RelKey<'a> {
    RelKey::qualified(schema, name)
}

fn hot(map: &RecencyMap, db: &str, rels: &[RelKey<'_>]) -> bool {
    map.lookup(db, rels).is_hot()
}

#[test]
fn written_relation_is_hot_until_ttl_passes() {
    let (clock, map) = map(500);
    assert!(!hot(&map, "db", &[U("orders")]));
    map.mark("db", &[U("orders")], None);
    assert!(hot(&map, "db", &[U("orders")]));
    clock.advance(499);
    assert!(hot(&map, "db", &[U("orders")]));
    clock.advance(1);
    assert!(!hot(&map, "db", &[U("orders")]));
}

#[test]
fn databases_and_names_are_separate() {
    let (_clock, map) = map(500);
    map.mark("db1", &[U("orders")], None);
    assert!(!hot(&map, "db2", &[U("orders")]));
    assert!(!hot(&map, "db1", &[U("order"), U("orders_archive")]));
    assert!(hot(&map, "db1", &[U("items"), U("orders")]));
    // Quoted names arrive unfolded and are distinct.
    assert!(!hot(&map, "db1", &[U("Orders")]));
}

#[test]
fn conservative_schema_matching_both_ways() {
    // (written, read, expected)
    let cases: &[(RelKey<'_>, RelKey<'_>, bool)] = &[
        (Q("app", "orders"), U("orders"), true),
        (Q("app", "orders"), Q("app", "orders"), true),
        (Q("app", "orders"), Q("b", "orders"), false),
        (U("orders"), Q("app", "orders"), true),
        (U("orders"), Q("b", "orders"), true),
        (U("orders"), U("orders"), true),
        (Q("app", "orders"), Q("app", "items"), false),
    ];
    for (written, read, expected) in cases {
        let (_clock, map) = map(1_000);
        map.mark("db", &[*written], None);
        assert_eq!(
            hot(&map, "db", &[*read]),
            *expected,
            "write {written} read {read}"
        );
    }
}

#[test]
fn hot_answer_names_the_written_relation() {
    let (_clock, map) = map(1_000);
    map.mark("db", &[Q("app", "orders")], Some(Lsn(7)));
    assert_eq!(
        map.lookup("db", &[U("items"), U("orders")]),
        Hotness::Hot {
            reason: HotReason::RecentWrite,
            relation: Some("app.orders".into()),
            required_lsn: Some(Lsn(7)),
        }
    );
}

#[test]
fn requirement_answers_as_lookup_without_the_name() {
    let (clock, map) = map(1_000);
    let rels = [U("items"), U("orders")];
    assert_eq!(map.requirement("db", &rels), Hotness::Cold);
    map.mark("db", &[Q("app", "orders")], Some(Lsn(7)));
    map.mark("db", &[U("items")], Some(Lsn(9)));
    assert_eq!(
        map.requirement("db", &rels),
        Hotness::Hot {
            reason: HotReason::RecentWrite,
            relation: None,
            required_lsn: Some(Lsn(9)),
        }
    );
    assert_eq!(
        map.lookup("db", &rels).required_lsn(),
        map.requirement("db", &rels).required_lsn()
    );
    map.mark("db", &[U("orders")], None);
    assert_eq!(map.requirement("db", &rels).required_lsn(), None);
    assert!(map.requirement("db", &rels).is_hot());
    clock.advance(1_000);
    assert_eq!(map.requirement("db", &rels), Hotness::Cold);
}

#[test]
fn ttl_changes_apply_to_existing_entries() {
    let (clock, map) = map(1_000);
    map.mark("db", &[U("orders")], None);
    clock.advance(600);
    assert!(hot(&map, "db", &[U("orders")]));
    assert_eq!(map.set_ttl_ms(500), 500);
    assert!(
        !hot(&map, "db", &[U("orders")]),
        "shortened TTL cools old entries"
    );
    assert_eq!(map.set_ttl_ms(5_000), 5_000);
    assert!(
        hot(&map, "db", &[U("orders")]),
        "lengthened TTL re-heats unswept entries"
    );
    assert_eq!(map.ttl_ms(), 5_000);
}

#[test]
fn the_window_floor_keeps_writes_recent_past_a_shorter_ttl() {
    let (clock, map) = map(500);
    map.set_window_floor_ms(2_000);
    assert_eq!(map.window_ms(), 2_000);
    map.mark("db", &[U("orders")], None);
    clock.advance(1_500);
    assert!(
        hot(&map, "db", &[U("orders")]),
        "past the TTL, inside the floor"
    );
    map.sweep(usize::MAX);
    assert!(
        hot(&map, "db", &[U("orders")]),
        "not swept inside the floor"
    );
    clock.advance(500);
    assert!(!hot(&map, "db", &[U("orders")]), "past the floor");
    // A TTL of 0 turns recency off for reads, floor or not; a longer TTL is the window.
    map.set_ttl_ms(0);
    assert_eq!(map.window_ms(), 0);
    map.set_ttl_ms(3_000);
    assert_eq!(map.window_ms(), 3_000);
}

#[test]
fn max_ttl_clamps() {
    let (_clock, map) = map_with(RecencyConfig {
        ttl_ms: 90_000,
        max_ttl_ms: 60_000,
        cold_start_ms: 0,
        ..RecencyConfig::default()
    });
    assert_eq!(map.ttl_ms(), 60_000, "the configured TTL is clamped too");
    assert_eq!(map.set_ttl_ms(70_000), 60_000);
    assert_eq!(map.ttl_ms(), 60_000);
    assert_eq!(
        map.set_max_ttl_ms(2_000),
        2_000,
        "lowering the cap lowers the TTL"
    );
    assert_eq!(map.ttl_ms(), 2_000);
    assert_eq!(map.set_ttl_ms(3_000), 2_000);
    assert_eq!(
        map.set_max_ttl_ms(10_000),
        2_000,
        "raising the cap keeps the TTL"
    );
    assert_eq!(map.max_ttl_ms(), 10_000);
}

#[test]
fn ttl_zero_disables_recency_but_not_always_hot() {
    let (clock, map) = map_with(RecencyConfig {
        ttl_ms: 0,
        cold_start_ms: 5_000,
        always_hot: vec!["app.config".parse().unwrap()],
        ..RecencyConfig::default()
    });
    map.mark("db", &[U("orders")], None);
    assert_eq!(map.len(), 0, "nothing is recorded while disabled");
    assert!(
        !hot(&map, "db", &[U("orders")]),
        "cold start is ignored at TTL 0"
    );
    assert_eq!(
        map.lookup("db", &[U("config")]).reason(),
        Some(HotReason::AlwaysHot)
    );
    // Enabling recency inside the cold-start window makes it count again.
    map.set_ttl_ms(1_000);
    assert_eq!(
        map.lookup("db", &[U("orders")]).reason(),
        Some(HotReason::ColdStart)
    );
    clock.advance(5_000);
    assert!(!hot(&map, "db", &[U("orders")]));
}

#[test]
fn cold_start_window_at_creation_and_on_demand() {
    let (clock, map) = map_with(RecencyConfig {
        ttl_ms: 1_000,
        cold_start_ms: 2_000,
        ..RecencyConfig::default()
    });
    assert!(map.in_cold_start_window());
    assert_eq!(
        map.lookup("any", &[]),
        Hotness::Hot {
            reason: HotReason::ColdStart,
            relation: None,
            required_lsn: None
        }
    );
    clock.advance(1_999);
    assert!(hot(&map, "db", &[U("x")]));
    clock.advance(1);
    assert!(!hot(&map, "db", &[U("x")]));
    assert!(!map.in_cold_start_window());

    map.begin_cold_start();
    assert_eq!(
        map.lookup("db", &[U("x")]).reason(),
        Some(HotReason::ColdStart)
    );
    clock.advance(1_000);
    map.set_cold_start_ms(500);
    map.begin_cold_start();
    clock.advance(999);
    assert!(
        hot(&map, "db", &[U("x")]),
        "a shorter new window never cuts a running one"
    );
    clock.advance(1);
    assert!(!hot(&map, "db", &[U("x")]));
    assert_eq!(map.stats().hits_cold_start, 4);
}

#[test]
fn no_cold_start_when_window_is_zero() {
    let (_clock, map) = map(1_000);
    map.begin_cold_start();
    assert!(!hot(&map, "db", &[U("x")]));
}

#[test]
fn required_lsn_is_max_and_unknown_wins() {
    let (clock, map) = map(1_000);
    map.mark("db", &[U("a")], Some("1/10".parse().unwrap()));
    map.mark("db", &[U("b")], Some("2/0".parse().unwrap()));
    map.mark("db", &[U("a")], Some("0/FF".parse().unwrap()));
    let answer = map.lookup("db", &[U("a"), U("b")]);
    assert_eq!(answer.required_lsn(), Some("2/0".parse().unwrap()));
    assert_eq!(
        map.lookup("db", &[U("a")]).required_lsn(),
        Some("1/10".parse().unwrap()),
        "an older LSN arriving late does not lower the entry's position"
    );
    map.mark("db", &[U("c")], None);
    let answer = map.lookup("db", &[U("a"), U("c")]);
    assert!(answer.is_hot());
    assert_eq!(answer.required_lsn(), None);
    map.mark("db", &[U("a")], Some(Lsn(0)));
    assert_eq!(
        map.lookup("db", &[U("a")]).required_lsn(),
        None,
        "0/0 is unknown"
    );
    // A new streak after expiry forgets the old position.
    clock.advance(1_000);
    map.mark("db", &[U("a")], Some(Lsn(42)));
    assert_eq!(map.lookup("db", &[U("a")]).required_lsn(), Some(Lsn(42)));
}

#[test]
fn max_staleness_releases_continuously_written_relation() {
    let (clock, map) = map_with(RecencyConfig {
        ttl_ms: 100,
        max_staleness_ms: Some(1_000),
        cold_start_ms: 0,
        ..RecencyConfig::default()
    });
    for _ in 0..10 {
        map.mark("db", &[U("log")], None);
        assert!(hot(&map, "db", &[U("log")]));
        clock.advance(99);
    }
    map.mark("db", &[U("log")], None);
    clock.advance(10); // streak is now 1000 ms old
    assert!(
        !hot(&map, "db", &[U("log")]),
        "streak older than max staleness"
    );
    assert!(map.stats().stale_releases >= 1);
    let listed = map.hot_relations(Some("db"), 10);
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].forcing);
    // A pause as long as the TTL ends the streak; the next write forces again.
    clock.advance(100);
    map.mark("db", &[U("log")], None);
    assert!(hot(&map, "db", &[U("log")]));
    map.set_max_staleness_ms(None);
    assert_eq!(map.max_staleness_ms(), None);
}

#[test]
fn never_track_and_always_hot_lists() {
    let (_clock, map) = map_with(RecencyConfig {
        ttl_ms: 1_000,
        cold_start_ms: 0,
        never_track: vec!["audit.*".parse().unwrap(), "events".parse().unwrap()],
        always_hot: vec!["app.settings".parse().unwrap()],
        ..RecencyConfig::default()
    });
    map.mark(
        "db",
        &[Q("audit", "log"), U("events"), Q("x", "events"), U("log")],
        None,
    );
    assert_eq!(map.len(), 1, "only unqualified log is recorded");
    assert!(!hot(&map, "db", &[U("events")]));
    assert!(
        hot(&map, "db", &[Q("audit", "log")]),
        "unqualified log may be audit.log"
    );
    assert_eq!(map.stats().never_tracked, 3);
    assert_eq!(map.stats().marks, 1);

    let answer = map.lookup("db", &[U("settings")]);
    assert_eq!(answer.reason(), Some(HotReason::AlwaysHot));
    assert_eq!(answer.required_lsn(), None);
    assert!(!hot(&map, "db", &[Q("other", "settings")]));

    map.set_lists(Vec::new(), Vec::new());
    assert!(!hot(&map, "db", &[U("settings")]));
    map.mark("db", &[U("events")], None);
    assert!(hot(&map, "db", &[U("events")]));
    // A list given later (a config reload) applies at once, to both kinds of lookup.
    map.set_lists(Vec::new(), vec!["flags".parse().unwrap()]);
    assert_eq!(
        map.requirement("db", &[U("flags")]).reason(),
        Some(HotReason::AlwaysHot)
    );
}

#[test]
fn expiry_and_sweep_under_fake_clock() {
    let (clock, map) = map(1_000);
    for i in 0..100 {
        map.mark("db", &[U(&format!("t{i}"))], Some(Lsn(i + 1)));
    }
    map.mark("db", &[Q("a", "t0"), Q("b", "t0")], None);
    assert_eq!(map.len(), 102);
    let s = map.sweep(usize::MAX);
    assert_eq!((s.removed, s.remaining), (0, 102), "nothing expired yet");
    assert!(s.done);

    clock.advance(500);
    map.mark("db", &[U("t1")], None);
    clock.advance(500);
    // Bounded batches: 10 items at a time.
    let s = map.sweep(10);
    assert_eq!(s.examined, 10);
    assert!(!s.done);
    let mut total = s.removed;
    loop {
        let s = map.sweep(10);
        total += s.removed;
        if s.done {
            break;
        }
    }
    assert_eq!(total, 101, "all but the rewritten t1 expired");
    assert_eq!(map.len(), 1);
    assert!(hot(&map, "db", &[U("t1")]));
    assert_eq!(map.stats().expirations, 101);

    clock.advance(500);
    while !map.sweep(10).done {}
    assert!(map.is_empty());
}

#[test]
fn sweep_keeps_live_schemas_of_a_slot() {
    let (clock, map) = map(1_000);
    map.mark("db", &[Q("a", "t")], None);
    clock.advance(600);
    map.mark("db", &[Q("b", "t")], None);
    clock.advance(400);
    while !map.sweep(100).done {}
    assert_eq!(map.len(), 1);
    assert!(!hot(&map, "db", &[Q("a", "t")]));
    assert!(hot(&map, "db", &[Q("b", "t")]));
    clock.advance(600);
    while !map.sweep(100).done {}
    assert!(map.is_empty());
}

#[test]
fn ttl_zero_lets_sweep_free_everything() {
    let (_clock, map) = map(1_000);
    map.mark("db", &[U("a"), U("b")], None);
    map.set_ttl_ms(0);
    while !map.sweep(1).done {}
    assert!(map.is_empty());
}

#[test]
fn overflow_reports_database_hot_for_one_ttl() {
    let (clock, map) = map_with(RecencyConfig {
        ttl_ms: 1_000,
        cold_start_ms: 0,
        max_entries: 2,
        ..RecencyConfig::default()
    });
    map.mark("db1", &[U("a"), U("b")], Some(Lsn(5)));
    assert!(!hot(&map, "db1", &[U("zzz")]));
    map.mark("db2", &[U("c")], Some(Lsn(9)));
    assert_eq!(map.len(), 2);
    assert_eq!(map.stats().overflows, 1);
    let answer = map.lookup("db2", &[U("unrelated")]);
    assert_eq!(
        answer,
        Hotness::Hot {
            reason: HotReason::Overflow,
            relation: None,
            required_lsn: Some(Lsn(9)),
        }
    );
    assert!(
        !hot(&map, "db1", &[U("zzz")]),
        "other databases are unaffected"
    );
    // Existing entries are still updated while full.
    clock.advance(900);
    map.mark("db1", &[U("a")], None);
    clock.advance(100);
    assert!(
        !hot(&map, "db2", &[U("unrelated")]),
        "one TTL after the last drop"
    );
    assert_eq!(map.stats().hits_overflow, 1);
    // b expired; sweeping frees room so db2 can be stored again.
    map.mark("db2", &[U("c")], None);
    assert_eq!(map.stats().overflows, 1, "the reclaiming sweep made room");
    assert_eq!(
        map.lookup("db2", &[U("c")]).reason(),
        Some(HotReason::RecentWrite)
    );
    assert_eq!(map.len(), 2);
}

#[test]
fn overflow_lsn_unknown_when_a_dropped_write_had_none() {
    let (_clock, map) = map_with(RecencyConfig {
        ttl_ms: 1_000,
        cold_start_ms: 0,
        max_entries: 0,
        ..RecencyConfig::default()
    });
    map.mark("db", &[U("a")], Some(Lsn(5)));
    map.mark("db", &[U("b")], None);
    map.mark("db", &[U("c")], Some(Lsn(7)));
    assert_eq!(map.lookup("db", &[]).required_lsn(), None);
    assert_eq!(map.stats().overflows, 3);
    map.set_max_entries(10);
    map.mark("db", &[U("d")], None);
    assert_eq!(map.len(), 1);
}

/// `changes` moves after everything that can turn a cold answer hot, and only then: a
/// caller that saw `Cold` may keep that answer while the count stays.
#[test]
fn changes_move_with_whatever_can_turn_a_cold_answer_hot() {
    let (clock, map) = map_with(RecencyConfig {
        ttl_ms: 500,
        cold_start_ms: 100,
        max_entries: 1,
        ..RecencyConfig::default()
    });
    let moved = |f: &dyn Fn()| {
        let before = map.changes();
        f();
        map.changes() != before
    };
    clock.advance(200);
    let stays = [
        moved(&|| drop(map.lookup("db", &[U("a")]))),
        moved(&|| drop(map.lookup_database("db"))),
        moved(&|| {
            map.sweep(100);
        }),
        moved(&|| {
            map.set_ttl_ms(500);
        }),
        moved(&|| map.set_window_floor_ms(0)),
        moved(&|| map.resolve_pending("db", &[U("a")], 1, Lsn(7))),
    ];
    assert_eq!(stays, [false; 6], "nothing here can heat an answer");
    let moves = [
        moved(&|| map.mark("db", &[U("a")], Some(Lsn(5)))),
        moved(&|| {
            let _ = map.mark_pending("db", &[U("a")]);
        }),
        // The map is full: the write is dropped and the database overflows.
        moved(&|| map.mark("db", &[U("b")], None)),
        moved(&|| map.mark_database("db")),
        moved(&|| map.mark_instance()),
        moved(&|| map.begin_cold_start()),
        moved(&|| {
            map.set_ttl_ms(900);
        }),
        moved(&|| map.set_window_floor_ms(2_000)),
        moved(&|| map.set_max_staleness_ms(Some(50))),
        moved(&|| map.set_lists(Vec::new(), vec![RelPattern::new(None, Some("x"))])),
    ];
    assert_eq!(moves, [true; 10], "each of these can heat an answer");
}

#[test]
fn hot_relations_lists_live_entries_newest_first() {
    let (clock, map) = map(1_000);
    map.mark("db1", &[Q("app", "orders")], Some(Lsn(3)));
    clock.advance(10);
    map.mark("db2", &[U("items")], None);
    map.mark("db2", &[U("items")], None);
    map.lookup("db2", &[U("items")]);
    let all = map.hot_relations(None, 10);
    assert_eq!(all.len(), 2);
    assert_eq!(
        (
            all[0].db.as_str(),
            all[0].relation.as_str(),
            all[0].writes,
            all[0].hits
        ),
        ("db2", "items", 2, 1)
    );
    assert_eq!(all[1].relation, "app.orders");
    assert_eq!((all[1].age_ms, all[1].lsn), (10, Some(Lsn(3))));
    assert!(all[1].forcing);
    assert_eq!(map.hot_relations(Some("db1"), 10).len(), 1);
    assert_eq!(map.hot_relations(None, 1).len(), 1);
    clock.advance(995);
    assert_eq!(
        map.hot_relations(None, 10).len(),
        1,
        "expired entries are not listed"
    );
}

#[test]
fn stats_count_marks_lookups_and_hits() {
    let (_clock, map) = map(1_000);
    map.mark("db", &[U("a"), U("b")], None);
    map.lookup("db", &[U("a")]);
    map.lookup("db", &[U("c")]);
    let s = map.stats();
    assert_eq!(
        (s.marks, s.lookups, s.hits, s.hits_recent_write),
        (2, 2, 1, 1)
    );
    assert_eq!(s.entries, 2);
}

#[test]
fn relation_pattern_from_config_text() {
    let p: RelPattern = "\"Audit\".*".parse().unwrap();
    assert_eq!(p.schema(), Some("Audit"));
    assert_eq!(p.name(), None);
}

mod pending_positions {
    use std::sync::Arc;

    use pgfresh_lsn::Lsn;
    use pgfresh_recency::*;

    fn map() -> (RecencyMap, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_000));
        let cfg = RecencyConfig {
            ttl_ms: 1_000,
            cold_start_ms: 0,
            ..RecencyConfig::default()
        };
        (RecencyMap::new(cfg, clock.clone()), clock)
    }

    const T: [RelKey<'static>; 1] = [RelKey {
        schema: None,
        name: "t",
    }];

    #[test]
    fn a_pending_write_needs_the_primary_until_its_position_arrives() {
        let (m, _) = map();
        let token = m.mark_pending("db", &T);
        assert_eq!(m.lookup("db", &T).required_lsn(), None);
        assert!(m.lookup("db", &T).is_hot());
        m.resolve_pending("db", &T, token, Lsn(500));
        assert_eq!(m.lookup("db", &T).required_lsn(), Some(Lsn(500)));
    }

    #[test]
    fn every_pending_write_of_a_streak_must_arrive() {
        let (m, _) = map();
        let a = m.mark_pending("db", &T);
        let b = m.mark_pending("db", &T);
        m.resolve_pending("db", &T, b, Lsn(900));
        assert_eq!(
            m.lookup("db", &T).required_lsn(),
            None,
            "a's position is still unknown"
        );
        m.resolve_pending("db", &T, a, Lsn(700));
        assert_eq!(
            m.lookup("db", &T).required_lsn(),
            Some(Lsn(900)),
            "the highest of the streak"
        );
        // A plain mark without a position keeps the streak unknown, as before.
        m.mark("db", &T, None);
        assert_eq!(m.lookup("db", &T).required_lsn(), None);
    }

    #[test]
    fn a_late_position_of_an_earlier_streak_is_ignored() {
        let (m, clock) = map();
        let old = m.mark_pending("db", &T);
        clock.advance(1_500); // the first streak expires
        let new = m.mark_pending("db", &T);
        m.resolve_pending("db", &T, old, Lsn(100));
        assert_eq!(
            m.lookup("db", &T).required_lsn(),
            None,
            "the new write's position is still pending"
        );
        m.resolve_pending("db", &T, new, Lsn(2_000));
        assert_eq!(m.lookup("db", &T).required_lsn(), Some(Lsn(2_000)));
    }
}
