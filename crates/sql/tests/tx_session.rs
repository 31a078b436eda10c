//! Transaction control and session state effects.

use pgfresh_sql::{
    analyze_uncached, DiscardKind, Isolation, Kind, MustPrimary, RelName, SessionEffect as S,
    TxEffect as T, TxModes,
};

fn modes(
    read_only: Option<bool>,
    isolation: Option<Isolation>,
    deferrable: Option<bool>,
) -> TxModes {
    TxModes {
        read_only,
        isolation,
        deferrable,
    }
}

#[test]
fn transaction_control() {
    let none = TxModes::default();
    let cases: Vec<(&str, T)> = vec![
        ("BEGIN", T::Begin(none)),
        ("BEGIN TRANSACTION", T::Begin(none)),
        ("START TRANSACTION", T::Begin(none)),
        ("BEGIN READ ONLY", T::Begin(modes(Some(true), None, None))),
        (
            "START TRANSACTION READ ONLY",
            T::Begin(modes(Some(true), None, None)),
        ),
        ("BEGIN READ WRITE", T::Begin(modes(Some(false), None, None))),
        (
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            T::Begin(modes(None, Some(Isolation::RepeatableRead), None)),
        ),
        (
            "BEGIN ISOLATION LEVEL READ COMMITTED, READ ONLY",
            T::Begin(modes(Some(true), Some(Isolation::ReadCommitted), None)),
        ),
        (
            "begin isolation level read uncommitted",
            T::Begin(modes(None, Some(Isolation::ReadUncommitted), None)),
        ),
        (
            "START TRANSACTION ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE",
            T::Begin(modes(Some(true), Some(Isolation::Serializable), Some(true))),
        ),
        (
            "BEGIN NOT DEFERRABLE",
            T::Begin(modes(None, None, Some(false))),
        ),
        ("COMMIT", T::Commit { chain: false }),
        ("END", T::Commit { chain: false }),
        ("COMMIT AND CHAIN", T::Commit { chain: true }),
        ("ROLLBACK", T::Rollback { chain: false }),
        ("ABORT", T::Rollback { chain: false }),
        ("ROLLBACK AND CHAIN", T::Rollback { chain: true }),
        ("SAVEPOINT sp1", T::Savepoint("sp1".into())),
        ("RELEASE SAVEPOINT sp1", T::Release("sp1".into())),
        ("RELEASE sp1", T::Release("sp1".into())),
        ("ROLLBACK TO SAVEPOINT sp1", T::RollbackTo("sp1".into())),
        ("ROLLBACK TO sp1", T::RollbackTo("sp1".into())),
        (
            "PREPARE TRANSACTION 'g1'",
            T::PrepareTransaction("g1".into()),
        ),
        ("COMMIT PREPARED 'g1'", T::CommitPrepared("g1".into())),
        ("ROLLBACK PREPARED 'g1'", T::RollbackPrepared("g1".into())),
        (
            "SET TRANSACTION READ ONLY",
            T::SetTransaction(modes(Some(true), None, None)),
        ),
        (
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            T::SetTransaction(modes(None, Some(Isolation::Serializable), None)),
        ),
    ];
    let count = cases.len();
    for (sql, effect) in cases {
        let a = analyze_uncached(sql);
        assert_eq!(a.kind, Kind::Transaction, "{sql}");
        assert_eq!(a.statements[0].tx.as_ref(), Some(&effect), "{sql}");
        let serializable = matches!(&effect, T::Begin(m) | T::SetTransaction(m) if m.isolation == Some(Isolation::Serializable));
        assert_eq!(
            a.must_primary.contains(&MustPrimary::SerializableTxn),
            serializable,
            "{sql}"
        );
        let two_phase = matches!(
            effect,
            T::PrepareTransaction(_) | T::CommitPrepared(_) | T::RollbackPrepared(_)
        );
        assert_eq!(
            a.must_primary.contains(&MustPrimary::TwoPhaseCommit),
            two_phase,
            "{sql}"
        );
    }
    assert_eq!(count, 27);

    let a = analyze_uncached("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY");
    assert_eq!(a.kind, Kind::Session);
    assert_eq!(
        a.statements[0].tx,
        Some(T::SetSessionCharacteristics(modes(Some(true), None, None)))
    );
}

/// What PostgreSQL runs in a failed transaction (its `IsTransactionExitStmt`).
#[test]
fn statements_that_exit_a_failed_transaction() {
    for (sql, exits) in [
        ("COMMIT", true),
        ("END", true),
        ("ROLLBACK", true),
        ("ABORT", true),
        ("ROLLBACK AND CHAIN", true),
        ("ROLLBACK TO SAVEPOINT sp1", true),
        ("PREPARE TRANSACTION 'g1'", true),
        ("BEGIN", false),
        ("SAVEPOINT sp1", false),
        ("RELEASE sp1", false),
        ("COMMIT PREPARED 'g1'", false),
        ("ROLLBACK PREPARED 'g1'", false),
        ("SET TRANSACTION READ ONLY", false),
    ] {
        let a = analyze_uncached(sql);
        let tx = a.statements[0]
            .tx
            .as_ref()
            .expect("a transaction statement");
        assert_eq!(tx.exits_transaction(), exits, "{sql}");
    }
}

#[test]
fn session_effects() {
    let set = |name: &str, value: Option<&str>, local: bool| S::Set {
        name: name.into(),
        value: value.map(Into::into),
        local,
    };
    let cases: Vec<(&str, Kind, S)> = vec![
        (
            "SET search_path = app, public",
            Kind::Session,
            set("search_path", Some("app, public"), false),
        ),
        (
            "SET LOCAL statement_timeout = 5000",
            Kind::Session,
            set("statement_timeout", Some("5000"), true),
        ),
        (
            "SET SESSION work_mem TO '64MB'",
            Kind::Session,
            set("work_mem", Some("64MB"), false),
        ),
        (
            "SET TIME ZONE 'UTC'",
            Kind::Session,
            set("timezone", Some("UTC"), false),
        ),
        // The same as RESET (a startup value comes back); SET LOCAL's is not.
        (
            "SET client_encoding TO DEFAULT",
            Kind::Session,
            S::Reset("client_encoding".into()),
        ),
        (
            "SET LOCAL work_mem TO DEFAULT",
            Kind::Session,
            set("work_mem", None, true),
        ),
        (
            "SET extra_float_digits = 3",
            Kind::Session,
            set("extra_float_digits", Some("3"), false),
        ),
        (
            "SET default_transaction_read_only = on",
            Kind::Session,
            set("default_transaction_read_only", Some("on"), false),
        ),
        (
            "RESET search_path",
            Kind::Session,
            S::Reset("search_path".into()),
        ),
        ("RESET ALL", Kind::Session, S::ResetAll),
        ("DISCARD ALL", Kind::Session, S::Discard(DiscardKind::All)),
        (
            "DISCARD PLANS",
            Kind::Session,
            S::Discard(DiscardKind::Plans),
        ),
        (
            "DISCARD SEQUENCES",
            Kind::Session,
            S::Discard(DiscardKind::Sequences),
        ),
        ("DISCARD TEMP", Kind::Session, S::Discard(DiscardKind::Temp)),
        (
            "SET ROLE reporting",
            Kind::Session,
            S::SetRole(Some("reporting".into())),
        ),
        ("SET ROLE NONE", Kind::Session, S::SetRole(None)),
        ("RESET ROLE", Kind::Session, S::SetRole(None)),
        (
            "SET SESSION AUTHORIZATION alice",
            Kind::Session,
            S::SetSessionAuthorization(Some("alice".into())),
        ),
        (
            "RESET SESSION AUTHORIZATION",
            Kind::Session,
            S::SetSessionAuthorization(None),
        ),
        (
            "EXECUTE get_user(1)",
            Kind::Session,
            S::Execute {
                name: "get_user".into(),
            },
        ),
        (
            "DEALLOCATE get_user",
            Kind::Session,
            S::Deallocate(Some("get_user".into())),
        ),
        (
            "DEALLOCATE PREPARE get_user",
            Kind::Session,
            S::Deallocate(Some("get_user".into())),
        ),
        ("DEALLOCATE ALL", Kind::Session, S::Deallocate(None)),
        ("LISTEN jobs", Kind::Session, S::Listen("jobs".into())),
        (
            "UNLISTEN jobs",
            Kind::Session,
            S::Unlisten(Some("jobs".into())),
        ),
        ("UNLISTEN *", Kind::Session, S::Unlisten(None)),
        (
            "NOTIFY jobs, 'payload'",
            Kind::Session,
            S::Notify("jobs".into()),
        ),
        (
            "DECLARE c CURSOR FOR SELECT * FROM t",
            Kind::Read,
            S::DeclareCursor {
                name: "c".into(),
                with_hold: false,
            },
        ),
        (
            "DECLARE c CURSOR WITH HOLD FOR SELECT * FROM t",
            Kind::Read,
            S::DeclareCursor {
                name: "c".into(),
                with_hold: true,
            },
        ),
        (
            "DECLARE c NO SCROLL CURSOR WITHOUT HOLD FOR SELECT * FROM t FOR UPDATE",
            Kind::Read,
            S::DeclareCursor {
                name: "c".into(),
                with_hold: false,
            },
        ),
        ("FETCH 10 FROM c", Kind::Session, S::Fetch("c".into())),
        ("MOVE NEXT IN c", Kind::Session, S::Fetch("c".into())),
        ("CLOSE c", Kind::Session, S::CloseCursor(Some("c".into()))),
        ("CLOSE ALL", Kind::Session, S::CloseCursor(None)),
        (
            "CREATE TEMP TABLE scratch (id int)",
            Kind::Write,
            S::CreateTemp(RelName::new(None, "scratch")),
        ),
        (
            "CREATE TEMPORARY TABLE s2 AS SELECT * FROM t",
            Kind::Write,
            S::CreateTemp(RelName::new(None, "s2")),
        ),
        (
            "SELECT * INTO TEMP s3 FROM t",
            Kind::Write,
            S::CreateTemp(RelName::new(None, "s3")),
        ),
        (
            "CREATE TEMP VIEW tv AS SELECT 1",
            Kind::Write,
            S::CreateTemp(RelName::new(None, "tv")),
        ),
        (
            "CREATE TEMP SEQUENCE ts",
            Kind::Write,
            S::CreateTemp(RelName::new(None, "ts")),
        ),
        (
            "SELECT set_config('app.tenant', '7', true)",
            Kind::Read,
            S::SetConfig {
                name: Some("app.tenant".into()),
                value: Some("7".into()),
                local: Some(true),
            },
        ),
        (
            "SELECT set_config('a.b', $1, false)",
            Kind::Read,
            S::SetConfig {
                name: Some("a.b".into()),
                value: None,
                local: Some(false),
            },
        ),
        // The flag read as PostgreSQL reads a boolean.
        (
            "SELECT set_config('a.b', '1', ' TRUE ')",
            Kind::Read,
            S::SetConfig {
                name: Some("a.b".into()),
                value: Some("1".into()),
                local: Some(true),
            },
        ),
        (
            "SELECT set_config('a.b', '1', 'of')",
            Kind::Read,
            S::SetConfig {
                name: Some("a.b".into()),
                value: Some("1".into()),
                local: Some(false),
            },
        ),
        // Every call of a statement, in order.
        (
            "SELECT set_config('a.b', '1', false), set_config('c.d', '2', true)",
            Kind::Read,
            S::SetConfigs(vec![
                S::SetConfig {
                    name: Some("a.b".into()),
                    value: Some("1".into()),
                    local: Some(false),
                },
                S::SetConfig {
                    name: Some("c.d".into()),
                    value: Some("2".into()),
                    local: Some(true),
                },
            ]),
        ),
    ];
    let count = cases.len();
    for (sql, kind, effect) in cases {
        let a = analyze_uncached(sql);
        assert_eq!(a.kind, kind, "{sql}: {a:?}");
        assert_eq!(a.statements[0].session.as_ref(), Some(&effect), "{sql}");
        if let S::CreateTemp(name) = &effect {
            assert!(
                a.must_primary
                    .contains(&MustPrimary::TempRelation(name.clone())),
                "{sql}"
            );
            assert!(a.writes.contains(name), "{sql}");
        }
    }
    assert_eq!(count, 44);
    let a =
        analyze_uncached("DECLARE c NO SCROLL CURSOR WITHOUT HOLD FOR SELECT * FROM t FOR UPDATE");
    assert_eq!(a.must_primary, vec![MustPrimary::LockingClause]);
    assert!(analyze_uncached("LISTEN jobs")
        .must_primary
        .contains(&MustPrimary::Listen));
    assert!(analyze_uncached("NOTIFY jobs")
        .must_primary
        .contains(&MustPrimary::Notify));
}

#[test]
fn prepare_carries_the_inner_classification() {
    let a = analyze_uncached("PREPARE upd(int) AS UPDATE t SET x = $1");
    assert_eq!(a.kind, Kind::Session);
    assert!(a.writes.is_empty(), "PREPARE itself writes nothing");
    match &a.statements[0].session {
        Some(S::Prepare { name, inner }) => {
            assert_eq!(name, "upd");
            assert_eq!(inner.kind, Kind::Write);
            assert_eq!(inner.writes, vec![RelName::new(None, "t")]);
        }
        other => panic!("unexpected {other:?}"),
    }
    let a = analyze_uncached("PREPARE q AS SELECT * FROM t FOR UPDATE");
    match &a.statements[0].session {
        Some(S::Prepare { inner, .. }) => {
            assert_eq!(inner.kind, Kind::Read);
            assert_eq!(inner.must_primary, vec![MustPrimary::LockingClause]);
            assert!(!inner.is_standby_safe());
        }
        other => panic!("unexpected {other:?}"),
    }
    let a = analyze_uncached("EXECUTE a; EXECUTE b(1)");
    assert_eq!(a.executes().collect::<Vec<_>>(), ["a", "b"]);
    // CREATE TABLE … AS EXECUTE runs the prepared statement too: the caller looks it up.
    let a = analyze_uncached("CREATE TABLE x AS EXECUTE p(1)");
    assert_eq!(a.executes().collect::<Vec<_>>(), ["p"]);
    assert_eq!(a.kind, Kind::Write);
    assert_eq!(a.writes, vec![RelName::parse("x").unwrap()]);
    let a = analyze_uncached("EXECUTE p(nextval('s'))");
    assert_eq!(
        a.must_primary,
        vec![MustPrimary::Sequence("nextval".into())]
    );
}
