//! The client's prepared statements and transactions behave as on its own PostgreSQL
//! connection. Each script runs on a direct connection to the primary (the reference) and
//! through pgfresh (in transaction mode, and where it says so in session mode too), and
//! the outcomes must be the same message for message.

use pgfresh_tests::exchange::*;
use pgfresh_tests::raw::{cstr, msg};
use pgfresh_tests::*;

/// Runs `steps` on the primary and through `p`, each read up to its ReadyForQuery; the
/// outcomes through pgfresh must be the primary's. Returns them.
async fn same_as_postgresql(p: &ProxyHandle, steps: &[Vec<u8>]) -> Vec<String> {
    let steps: Vec<(Vec<u8>, usize)> = steps.iter().map(|s| (s.clone(), 1)).collect();
    same_as_postgresql_pipelined(p, &steps).await
}

/// A Parse of the unnamed statement that the server refuses leaves no unnamed
/// statement (PostgreSQL drops the old one before parsing); one an error skips changes
/// nothing.
#[tokio::test]
async fn a_refused_unnamed_parse_leaves_no_unnamed_statement() {
    let p = start_proxy(&tx_config(""));
    let good = |tag: &str| parse("", &format!("/* pgfresh:primary */ SELECT '{tag}'::text"));
    let bad = || parse("", "/* pgfresh:primary */ SELEC 1");
    let steps = [
        [good("a"), sync()].concat(),
        [bad(), sync()].concat(),
        [bind_execute(""), sync()].concat(),
        // Refused after the batch ran the earlier one.
        [good("b"), bind_execute(""), bad(), bind_execute(""), sync()].concat(),
        [bind_execute(""), sync()].concat(),
        // Skipped by an error before it: the earlier one stays.
        [good("c"), sync()].concat(),
        [bind_execute("nope"), good("d"), sync()].concat(),
        [bind_execute(""), sync()].concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[2].contains("error=26000"), "{r:?}");
    assert!(r[4].contains("error=26000"), "{r:?}");
    assert!(r[7].contains("row=c"), "{r:?}");
}

/// A simple Query destroys the unnamed statement, whatever it runs (one pgfresh
/// answers itself too) and whether it fails.
#[tokio::test]
async fn a_simple_query_destroys_the_unnamed_statement() {
    let p = start_proxy(&tx_config(""));
    let good = || parse("", "/* pgfresh:primary */ SELECT 'u'::text");
    let mut steps = Vec::new();
    for q in ["SELECT 1", "SELEC 1", "SET pgfresh.route = auto"] {
        steps.push([good(), sync()].concat());
        steps.push(query(q));
        steps.push([bind_execute(""), sync()].concat());
    }
    // A BEGIN pgfresh defers is a Query too.
    steps.push([good(), sync()].concat());
    steps.push(query("BEGIN"));
    steps.push([bind_execute(""), sync()].concat());
    steps.push(query("ROLLBACK"));
    let r = same_as_postgresql(&p, &steps).await;
    for i in [2, 5, 8, 11] {
        assert!(r[i].contains("error=26000"), "step {i}: {r:?}");
    }
}

/// A BEGIN pgfresh answered itself opens its transaction before the transaction's first
/// batch runs, with its modes, when that batch is the extended protocol's (the drivers'
/// unnamed statements): the batch runs in the transaction, an error in it leaves the
/// transaction failed, and the next transaction has its own modes, all as on the
/// client's own connection, in both pool modes.
#[tokio::test]
async fn a_deferred_begin_opens_its_transaction_with_the_first_batch() {
    let batch = |sql: &str| [parse("", sql), bind_execute(""), sync()].concat();
    for config in [config_text(""), tx_config("")] {
        let p = start_proxy(&config);
        let steps = [
            batch("BEGIN ISOLATION LEVEL REPEATABLE READ"),
            batch("SELECT current_setting('transaction_isolation')"),
            batch("SELECT 'second'::text"),
            query("COMMIT"),
            query("BEGIN READ ONLY"),
            batch("SELECT current_setting('transaction_read_only')"),
            query("ROLLBACK"),
            batch("BEGIN"),
            batch("SELEC 1"),
            batch("SELECT 1"),
            query("ROLLBACK"),
            batch("SELECT current_setting('transaction_isolation')"),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[1].contains("row=repeatable read"), "{r:?}");
        assert!(r[1].ends_with("status=T"), "{r:?}");
        assert!(r[5].contains("row=on"), "{r:?}");
        assert!(r[8].contains("error=42601"), "{r:?}");
        assert!(r[8].ends_with("status=E"), "{r:?}");
        assert!(r[9].contains("error=25P02"), "{r:?}");
        assert!(r[11].contains("row=read committed"), "{r:?}");
        assert!(r[11].ends_with("status=I"), "{r:?}");
    }
}

/// SQL-level PREPARE and protocol-level Parse share one namespace, as in PostgreSQL:
/// each refuses a name the other made (42P05), and DEALLOCATE drops either.
#[tokio::test]
async fn prepare_and_parse_share_one_namespace() {
    let p = start_proxy(&tx_config(""));
    let x = unique("nsx");
    let y = unique("nsy");
    let steps = [
        [parse(&x, "/* pgfresh:primary */ SELECT 'px'::text"), sync()].concat(),
        query(&format!(
            "/* pgfresh:primary */ PREPARE {x} AS SELECT 'sx'::text"
        )),
        [bind_execute(&x), sync()].concat(),
        query(&format!(
            "/* pgfresh:primary */ PREPARE {y} AS SELECT 'sy'::text"
        )),
        [parse(&y, "/* pgfresh:primary */ SELECT 'py'::text"), sync()].concat(),
        query(&format!("/* pgfresh:primary */ EXECUTE {y}")),
        // In a transaction, the refusal fails it.
        query("BEGIN"),
        query(&format!(
            "/* pgfresh:primary */ PREPARE {x} AS SELECT 'tx'::text"
        )),
        query("ROLLBACK"),
        // DEALLOCATE drops a protocol-level statement: the name is free for PREPARE.
        query(&format!("DEALLOCATE {x}")),
        [bind_execute(&x), sync()].concat(),
        query(&format!(
            "/* pgfresh:primary */ PREPARE {x} AS SELECT 'sx2'::text"
        )),
        query(&format!("/* pgfresh:primary */ EXECUTE {x}")),
        // And a SQL-level one: the name is free for Parse.
        query(&format!("DEALLOCATE {y}")),
        [
            parse(&y, "/* pgfresh:primary */ SELECT 'py2'::text"),
            sync(),
        ]
        .concat(),
        [bind_execute(&y), sync()].concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    let exists = |n: &str| format!("error=42P05:prepared statement \"{n}\" already exists");
    assert!(r[1].contains(&exists(&x)), "{r:?}");
    assert!(r[4].contains(&exists(&y)), "{r:?}");
    assert!(r[7].contains("status=E"), "{r:?}");
    assert!(r[15].contains("row=py2"), "{r:?}");
}

/// A read a standby refuses runs again on the primary; the Parse in its batch that the
/// refusal skipped on the standby runs there, and the client has its statement after.
#[tokio::test]
async fn a_refused_read_retried_elsewhere_keeps_the_statements_it_parses() {
    let v = unique("refused_parse");
    cluster()
        .psql(
            0,
            "app",
            &format!(
                "CREATE SEQUENCE {v}_seq; GRANT ALL ON {v}_seq TO PUBLIC;
                 CREATE VIEW {v} AS SELECT nextval('{v}_seq') AS n;
                 GRANT ALL ON {v} TO PUBLIC;"
            ),
        )
        .unwrap();
    let p = start_proxy(&tx_config("enable_recent_access_routing = false"));
    let c = p.connect().await;
    wait_replicated_on(cluster(), &c).await;
    let refusals = "pgfresh_standby_refusals_total{sqlstate=\"25006\"}";
    let before = metric_value(refusals);
    let mut s = raw::connect(p.addr).await;
    let read = format!("SELECT n::text FROM {v}");
    let r = run(
        &mut s,
        &[[
            parse("r1", &read),
            bind_execute("r1"),
            parse("s2", "SELECT 'two'::text"),
            sync(),
        ]
        .concat()],
    )
    .await;
    assert!(r[0].starts_with("12DC1Z"), "{r:?}");
    assert!(
        metric_value(refusals) > before,
        "the read was refused by a standby first"
    );
    let r = run(&mut s, &[[bind_execute("s2"), sync()].concat()]).await;
    assert!(r[0].contains("row=two"), "{r:?}");
}

/// The step that shows where a read-only transaction reading `table` (one row) runs: the
/// node's port (so it is left out of the comparison).
fn port_step(table: &str) -> String {
    format!("SELECT inet_server_port()::text FROM {table}")
}

/// The outcome of `port_step` on a standby.
fn on_a_standby(outcome: &str) -> bool {
    [1, 2]
        .iter()
        .any(|i| outcome.contains(&format!("row={} ", node_port(*i))))
}

/// As `same_as_postgresql`, except that the `probe` steps (`port_step`) must answer a
/// standby's port through pgfresh (the transaction ran there).
async fn same_on_a_standby(p: &ProxyHandle, probe: &str, steps: &[&str]) -> Vec<String> {
    let frames: Vec<Vec<u8>> = steps.iter().map(|s| query(s)).collect();
    let reference = run(&mut direct_session().await, &frames).await;
    let through = run(&mut raw::connect(p.addr).await, &frames).await;
    for (i, (want, got)) in reference.iter().zip(&through).enumerate() {
        if steps[i] == probe {
            assert!(on_a_standby(got), "step {i} ran on the primary: {got}");
        } else {
            assert_eq!(
                got, want,
                "step {i} ({}): pgfresh differs from PostgreSQL",
                steps[i]
            );
        }
    }
    reference
}

/// A read-only transaction chained (`COMMIT AND CHAIN`, `ROLLBACK AND CHAIN`) off a standby
/// keeps, as on PostgreSQL, the characteristics of the transaction before it, also those
/// that came from the session's defaults, when the ending transaction changed those
/// defaults (`default_transaction_isolation`, `SET SESSION CHARACTERISTICS`,
/// `default_transaction_deferrable`): the new defaults apply from the next transaction on.
#[tokio::test]
async fn a_chained_transaction_keeps_the_characteristics_the_defaults_gave() {
    // (set before the transaction, set in it, the chain)
    let cases = [
        (
            "",
            "SET default_transaction_isolation = 'repeatable read'",
            "COMMIT AND CHAIN",
        ),
        (
            "",
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            "COMMIT AND CHAIN",
        ),
        (
            "SET default_transaction_isolation = 'repeatable read'",
            "SET default_transaction_isolation = 'read committed'",
            "COMMIT AND CHAIN",
        ),
        (
            "",
            "SET default_transaction_deferrable = on",
            "COMMIT AND CHAIN",
        ),
        (
            "SET default_transaction_isolation = 'repeatable read'",
            "RESET default_transaction_isolation",
            "ROLLBACK AND CHAIN",
        ),
    ];
    for config in [config_text(""), tx_config("")] {
        let p = start_proxy(&config);
        let c = p.connect().await;
        let probe = &port_step(&p.cold_table(&c, "chain_defaults").await);
        poll(
            "reads on a standby",
            std::time::Duration::from_secs(60),
            || async {
                let row = simple_row(&c, probe).await;
                let port = format!("row={} ", row.get(0).unwrap_or(""));
                on_a_standby(&port).then_some(())
            },
        )
        .await;
        for (before, inside, chain) in cases {
            let mut steps = vec![
                before,
                "BEGIN READ ONLY",
                probe,
                inside,
                chain,
                "SHOW transaction_isolation",
                "SHOW transaction_read_only",
                "SHOW transaction_deferrable",
                "COMMIT",
                "SHOW transaction_isolation",
                "SHOW transaction_deferrable",
            ];
            steps.retain(|s| !s.is_empty());
            same_on_a_standby(&p, probe, &steps).await;
        }
    }
}

/// A Parse naming `name` with one parameter of type `oid`.
fn parse_typed(name: &str, sql: &str, oid: u32) -> Vec<u8> {
    let mut b = cstr(name);
    b.extend(cstr(sql));
    b.extend(1u16.to_be_bytes());
    b.extend(oid.to_be_bytes());
    msg(b'P', &b)
}

/// SQL `EXECUTE` runs a statement the client made with a protocol Parse (PostgreSQL has
/// one namespace for both), with parameters, in and out of a transaction, over both
/// protocols, until DEALLOCATE drops it; the name is then free for PREPARE.
#[tokio::test]
async fn execute_runs_a_statement_made_by_parse() {
    let p = start_proxy(&tx_config(""));
    let x = unique("exec_x");
    let y = unique("exec_y");
    let q = |sql: String| query(&sql);
    let steps = [
        [parse(&x, "SELECT 'px'::text"), sync()].concat(),
        q(format!("EXECUTE {x}")),
        [parse_typed(&y, "SELECT ($1 + 1)::text", 23), sync()].concat(),
        q(format!("EXECUTE {y}(41)")),
        q(format!("EXECUTE {y}('x')")),
        query("BEGIN"),
        q(format!("EXECUTE {y}(1); EXECUTE {x}")),
        query("COMMIT"),
        [
            parse("", &format!("EXECUTE {y}(2)")),
            bind_execute(""),
            sync(),
        ]
        .concat(),
        q(format!("DEALLOCATE {x}")),
        q(format!("EXECUTE {x}")),
        [bind_execute(&x), sync()].concat(),
        q(format!("PREPARE {x} AS SELECT 'sx'::text")),
        q(format!("EXECUTE {x}")),
        // In a transaction: DEALLOCATE after an EXECUTE drops it there too.
        query("BEGIN"),
        q(format!("EXECUTE {y}(3)")),
        q(format!("DEALLOCATE {y}")),
        q(format!("EXECUTE {y}(4)")),
        query("ROLLBACK"),
        query("BEGIN"),
        [parse(&y, "SELECT 'py2'::text"), sync()].concat(),
        q(format!("EXECUTE {y}")),
        q(format!("DEALLOCATE {y}")),
        q(format!("PREPARE {y} AS SELECT 'sy'::text")),
        q(format!("EXECUTE {y}")),
        query("COMMIT"),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[1].contains("row=px"), "{r:?}");
    assert!(r[3].contains("row=42"), "{r:?}");
    assert!(r[8].contains("row=3"), "{r:?}");
    assert!(r[10].contains("error=26000"), "{r:?}");
    assert!(r[13].contains("row=sx"), "{r:?}");
    assert!(r[17].contains("error=26000"), "{r:?}");
    assert!(r[24].contains("row=sy"), "{r:?}");
}

/// Session mode: a statement the client made with a protocol Parse, whose batch ran on a
/// standby, runs by SQL `EXECUTE` wherever that is routed (a read goes to a standby,
/// maybe the other one; a hint sends it to the primary), a PREPARE of its name is
/// refused wherever it runs, and once DEALLOCATEd no copy of it on another connection
/// runs, as on one PostgreSQL connection.
#[tokio::test]
async fn session_mode_execute_runs_a_statement_parsed_on_another_node() {
    let p = start_proxy(&config_text(""));
    let x = unique("sexec_x");
    let steps = [
        [parse(&x, "SELECT 'px'::text"), bind_execute(&x), sync()].concat(),
        query(&format!("EXECUTE {x}")),
        query(&format!("EXECUTE {x}")),
        query(&format!("/* pgfresh:primary */ EXECUTE {x}")),
        query(&format!("PREPARE {x} AS SELECT 'sx'::text")),
        [bind_execute(&x), sync()].concat(),
        // Gone everywhere: no connection's copy runs (where PostgreSQL answers 26000).
        query(&format!("DEALLOCATE {x}")),
        query(&format!("EXECUTE {x}")),
        query(&format!("/* pgfresh:primary */ EXECUTE {x}")),
        [bind_execute(&x), sync()].concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    for i in 1..4 {
        assert!(r[i].contains("row=px"), "step {i}: {r:?}");
    }
    assert!(r[4].contains("error=42P05"), "{r:?}");
    for i in 7..10 {
        assert!(r[i].contains("error=26000"), "step {i}: {r:?}");
    }
}

/// Two clients' statements of the same name, made by Parse and run by `EXECUTE`, stay
/// each client's own on the connections they share.
#[tokio::test]
async fn execute_of_a_parsed_name_runs_the_clients_own_statement() {
    let p = start_proxy(&tx_config(""));
    let name = unique("exec_own");
    let mut a = raw::connect(p.addr).await;
    let mut b = raw::connect(p.addr).await;
    let prepare = |tag: &str| [parse(&name, &format!("SELECT '{tag}'::text")), sync()].concat();
    let execute = query(&format!("EXECUTE {name}"));
    run(&mut a, &[prepare("a")]).await;
    run(&mut b, &[prepare("b")]).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.extend(run(&mut a, std::slice::from_ref(&execute)).await);
        got.extend(run(&mut b, std::slice::from_ref(&execute)).await);
    }
    run(&mut a, &[query("BEGIN"), execute.clone()]).await;
    got.extend(run(&mut b, std::slice::from_ref(&execute)).await);
    got.extend(run(&mut a, &[execute.clone(), query("COMMIT")]).await);
    let rows: Vec<&str> = got
        .iter()
        .map(|o| {
            o.split(" row=")
                .nth(1)
                .unwrap_or(o)
                .split(' ')
                .next()
                .unwrap_or("")
        })
        .collect();
    assert_eq!(
        rows,
        ["a", "b", "a", "b", "a", "b", "b", "a", "CZ"],
        "{got:?}"
    );
}

/// An `EXECUTE` runs the client's statement as it was when the `EXECUTE` came, not as a
/// Close and Parse later in the same batch left it (the connection the batch lands on may
/// lack the statement, so pgfresh parses it there first).
#[tokio::test]
async fn execute_runs_the_statement_as_it_was_when_read() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let y = unique(&format!("exec_read_{prefix}_y"));
        let s = unique(&format!("exec_read_{prefix}_s"));
        let steps = [
            [parse(&y, "SELECT 'one'::text"), bind_execute(&y), sync()].concat(),
            [
                parse(&s, &format!("/* pgfresh:primary */ EXECUTE {y}")),
                bind_execute(&s),
                close_statement(&y),
                parse(&y, "SELECT 'two'::text"),
                bind_execute(&y),
                sync(),
            ]
            .concat(),
            query(&format!("/* pgfresh:primary */ EXECUTE {y}")),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[1].contains("row=one row=two"), "{prefix}: {r:?}");
        assert!(r[2].contains("row=two"), "{prefix}: {r:?}");
    }
}

/// Session mode: whichever node a batch lands on, the client's statements there are as on
/// its own connection when the batch begins. A Parse of a name it has is refused (42P05);
/// a Bind after the batch's own Close fails (26000); one before it runs the old version.
#[tokio::test]
async fn session_mode_statements_are_the_clients_wherever_a_batch_runs() {
    let p = start_proxy(&config_text(""));
    let y = unique("sess_names_y");
    let parse_y = |tag: &str, hint: &str| parse(&y, &format!("{hint}SELECT '{tag}'::text"));
    let primary = "/* pgfresh:primary */ ";
    let steps = [
        [parse_y("one", ""), bind_execute(&y), sync()].concat(),
        // Parsed again, on a standby and on the primary: refused, the old one stays.
        [parse_y("two", ""), bind_execute(&y), sync()].concat(),
        [parse_y("two", primary), sync()].concat(),
        [bind_execute(&y), sync()].concat(),
        // The batch's own Close, then Parse: the Bind before runs the old one.
        [
            bind_execute(&y),
            close_statement(&y),
            parse_y("three", primary),
            bind_execute(&y),
            sync(),
        ]
        .concat(),
        [bind_execute(&y), sync()].concat(),
        // Closed, then bound in the same batch: 26000, and closed for good.
        [close_statement(&y), bind_execute(&y), sync()].concat(),
        [bind_execute(&y), sync()].concat(),
        query(&format!("{primary}SELECT 1")),
        [parse_y("four", ""), bind_execute(&y), sync()].concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[1].contains("error=42P05"), "{r:?}");
    assert!(r[2].contains("error=42P05"), "{r:?}");
    assert!(r[3].contains("row=one"), "{r:?}");
    assert!(r[4].contains("row=one row=three"), "{r:?}");
    assert!(r[5].contains("row=three"), "{r:?}");
    assert!(r[6].contains("error=26000"), "{r:?}");
    assert!(r[7].contains("error=26000"), "{r:?}");
    assert!(r[9].contains("row=four"), "{r:?}");
}

/// Transaction mode: a statement made by Parse, run by `EXECUTE` and then closed in the
/// same transaction, is gone for a later `EXECUTE` there too (26000, as in PostgreSQL).
#[tokio::test]
async fn a_closed_statement_does_not_run_from_the_copy_an_execute_made() {
    let p = start_proxy(&tx_config(""));
    let x = unique("closed_copy_x");
    let steps = [
        query("BEGIN"),
        [parse(&x, "SELECT 'px'::text"), sync()].concat(),
        query(&format!("EXECUTE {x}")),
        [close_statement(&x), sync()].concat(),
        query(&format!("EXECUTE {x}")),
        query("ROLLBACK"),
        // Pinned to its connection by a temporary table: across transactions too.
        query("CREATE TEMP TABLE closed_copy_pin (a int)"),
        [parse(&x, "SELECT 'py'::text"), sync()].concat(),
        query(&format!("EXECUTE {x}")),
        [close_statement(&x), sync()].concat(),
        query(&format!("EXECUTE {x}")),
        query("DISCARD ALL"),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[2].contains("row=px"), "{r:?}");
    assert!(r[4].contains("error=26000"), "{r:?}");
    assert!(r[8].contains("row=py"), "{r:?}");
    assert!(r[10].contains("error=26000"), "{r:?}");
}

/// A Parse of a name the client already has is refused (42P05), and PostgreSQL's error
/// names the client's statement, wherever the batch runs; the old statement stays.
#[tokio::test]
async fn a_parse_of_a_name_in_use_is_refused_naming_the_clients_statement() {
    let p = start_proxy(&tx_config(""));
    let x = unique("in_use_x");
    let steps = [
        [parse(&x, "SELECT 'one'::text"), sync()].concat(),
        [parse(&x, "SELECT 'two'::text"), sync()].concat(),
        [
            parse(&x, "/* pgfresh:primary */ SELECT 'two'::text"),
            bind_execute(&x),
            sync(),
        ]
        .concat(),
        [bind_execute(&x), sync()].concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    let exists = format!("error=42P05:prepared statement \"{x}\" already exists");
    assert!(r[1].contains(&exists), "{r:?}");
    assert!(r[2].contains(&exists), "{r:?}");
    assert!(r[3].contains("row=one"), "{r:?}");
}

/// A PREPARE of a name the client already PREPAREd is refused (42P05) wherever it runs,
/// as on PostgreSQL, and the first statement stays; after DEALLOCATE the name is free.
#[tokio::test]
async fn a_prepare_of_a_name_in_use_is_refused_wherever_it_runs() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let x = unique(&format!("prepare_twice_{prefix}"));
        let q = |sql: String| query(&sql);
        let steps = [
            q(format!(
                "/* pgfresh:primary */ PREPARE {x} AS SELECT 'one'::text"
            )),
            q(format!("PREPARE {x} AS SELECT 'two'::text")),
            q(format!(
                "/* pgfresh:primary */ PREPARE {x} AS SELECT 'two'::text"
            )),
            q(format!("EXECUTE {x}")),
            q(format!(
                "DEALLOCATE {x}; PREPARE {x} AS SELECT 'three'::text"
            )),
            q(format!("EXECUTE {x}")),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        let exists = format!("error=42P05:prepared statement \"{x}\" already exists");
        assert!(r[1].contains(&exists), "{prefix}: {r:?}");
        assert!(r[2].contains(&exists), "{prefix}: {r:?}");
        assert!(r[3].contains("row=one"), "{prefix}: {r:?}");
        assert!(r[5].contains("row=three"), "{prefix}: {r:?}");
    }
}

/// Session mode: a Parse an error skipped made no statement, though pgfresh's record of
/// the connection may count it until the next unit mends it; what pgfresh sends to mend it
/// must not fail the client's transaction: an `EXECUTE` of the name in a transaction
/// fails with 26000 as on PostgreSQL (not with 25P02, after pgfresh's own `DEALLOCATE`
/// failed there).
#[tokio::test]
async fn a_statement_an_error_skipped_does_not_fail_a_later_transaction() {
    let p = start_proxy(&config_text(""));
    let z = unique("skipped_z");
    let steps = [
        [bind_execute(&z), parse(&z, "SELECT 'one'::text"), sync()].concat(),
        query("BEGIN"),
        query("SELECT 'in'::text"),
        query(&format!("EXECUTE {z}")),
        query("ROLLBACK"),
        query(&format!("EXECUTE {z}")),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[0].contains("error=26000"), "{r:?}");
    assert!(r[3].contains("error=26000"), "{r:?}");
    assert!(r[5].contains("error=26000"), "{r:?}");
}

/// Session mode: a Parse of a name the client PREPAREd is refused (42P05) wherever the
/// batch runs, as on PostgreSQL (one namespace for both), and the PREPAREd statement
/// stays, run by EXECUTE and by Bind alike.
#[tokio::test]
async fn session_mode_a_parse_of_a_prepared_name_is_refused_wherever_it_runs() {
    let p = start_proxy(&config_text(""));
    let y = unique("sess_prepared_y");
    let steps = [
        query(&format!(
            "/* pgfresh:primary */ PREPARE {y} AS SELECT 'one'::text"
        )),
        [parse(&y, "SELECT 'two'::text"), sync()].concat(),
        [
            parse(&y, "/* pgfresh:primary */ SELECT 'two'::text"),
            bind_execute(&y),
            sync(),
        ]
        .concat(),
        query(&format!("EXECUTE {y}")),
        [bind_execute(&y), sync()].concat(),
        query(&format!("/* pgfresh:primary */ EXECUTE {y}")),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    let exists = format!("error=42P05:prepared statement \"{y}\" already exists");
    assert!(r[1].contains(&exists), "{r:?}");
    assert!(r[2].contains(&exists), "{r:?}");
    for i in 3..6 {
        assert!(r[i].contains("row=one"), "step {i}: {r:?}");
    }
}

/// A Describe of a statement the client PREPAREd describes it, as on PostgreSQL (one
/// namespace for both), wherever the batch runs.
#[tokio::test]
async fn a_describe_of_a_prepared_statement_describes_it() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let z = unique(&format!("describe_prepared_{prefix}"));
        let steps = [
            query(&format!(
                "/* pgfresh:primary */ PREPARE {z} AS SELECT 'one'::text"
            )),
            [describe(b'S', &z), sync()].concat(),
            [describe(b'S', &z), bind_execute(&z), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[1].starts_with("tTZ"), "{prefix}: {r:?}");
        assert!(r[2].contains("row=one"), "{prefix}: {r:?}");
    }
}

/// Transaction mode: in a failed transaction a Parse is refused (25P02) and makes no
/// statement, as on PostgreSQL, also one whose text the connection already has under
/// pgfresh's name (which pgfresh otherwise answers itself).
#[tokio::test]
async fn a_parse_in_a_failed_transaction_is_refused() {
    let p = start_proxy(&tx_config(""));
    let a = unique("failed_parse_a");
    let b = unique("failed_parse_b");
    let text = format!("SELECT '{b}'::text");
    let steps = [
        query("BEGIN"),
        [parse(&a, &text), bind_execute(&a), sync()].concat(),
        query("SELEC 1"),
        [parse(&b, &text), sync()].concat(),
        query("ROLLBACK"),
        [bind_execute(&b), sync()].concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[3].contains("error=25P02"), "{r:?}");
    assert!(r[5].contains("error=26000"), "{r:?}");
}

/// A SQL PREPARE or DEALLOCATE counts once the server completes it, as on PostgreSQL: one
/// the server refuses (a syntax error later in its string, a failed transaction, a name in
/// use) or skips (an error before it in its string) changes nothing, and one that
/// completed stays when its transaction is rolled back (they are not transactional). A
/// DEALLOCATE of a statement made by Parse, after a ROLLBACK in the same string, drops it.
#[tokio::test]
async fn prepare_and_deallocate_count_once_the_server_completes_them() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let [x, y, z, w] = ["x", "y", "z", "w"].map(|n| unique(&format!("completed_{prefix}_{n}")));
        let q = |sql: String| query(&sql);
        let primary = "/* pgfresh:primary */";
        let steps = [
            // Refused with its string: no z.
            q(format!("PREPARE {z} AS SELECT 'z1'::text; SELEC 1")),
            q(format!("EXECUTE {z}")),
            [parse(&z, "SELECT 'z2'::text"), sync()].concat(),
            // Refused in a failed transaction: y is free after it.
            query("BEGIN"),
            query("SELEC 1"),
            q(format!("{primary} PREPARE {y} AS SELECT 'y1'::text")),
            query("ROLLBACK"),
            q(format!("{primary} PREPARE {y} AS SELECT 'y2'::text")),
            q(format!("EXECUTE {y}")),
            // Refused (a name in use): the DEALLOCATE after it is skipped, y stays.
            q(format!("PREPARE {y} AS SELECT 'y3'::text; DEALLOCATE {y}")),
            q(format!("EXECUTE {y}")),
            // Completed in a transaction rolled back: w stays.
            query("BEGIN"),
            q(format!("{primary} PREPARE {w} AS SELECT 'w1'::text")),
            query("ROLLBACK"),
            q(format!("EXECUTE {w}")),
            // A statement made by Parse, dropped by a DEALLOCATE after a ROLLBACK.
            [parse(&x, "SELECT 'x1'::text"), sync()].concat(),
            q(format!("ROLLBACK; DEALLOCATE {x}")),
            [bind_execute(&x), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[1].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[2].starts_with("1Z"), "{prefix}: {r:?}");
        assert!(r[7].starts_with("CZ"), "{prefix}: {r:?}");
        assert!(r[9].contains("error=42P05"), "{prefix}: {r:?}");
        assert!(r[10].contains("row=y2"), "{prefix}: {r:?}");
        assert!(r[14].contains("row=w1"), "{prefix}: {r:?}");
        assert!(r[16].starts_with("NCCZ"), "{prefix}: {r:?}");
        assert!(r[17].contains("error=26000"), "{prefix}: {r:?}");
    }
}

/// Session mode: a statement the client PREPAREd on one node and DEALLOCATEd where its
/// session went next is gone on both: a Parse of its name on the first node makes the
/// client's statement, as on PostgreSQL (not refused with 42P05 by the copy left there).
#[tokio::test]
async fn session_mode_a_deallocated_statement_leaves_no_copy_behind() {
    let p = start_proxy(&config_text(""));
    let y = unique("deallocated_copy");
    let primary = "/* pgfresh:primary */";
    let steps = [
        query(&format!("{primary} PREPARE {y} AS SELECT 'one'::text")),
        // Read on a standby: the session's next statements run there.
        query("SELECT 'q'::text"),
        query(&format!("DEALLOCATE {y}")),
        [
            parse(&y, &format!("{primary} SELECT 'two'::text")),
            bind_execute(&y),
            sync(),
        ]
        .concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[3].contains("row=two"), "{r:?}");
}

/// Session mode: in a failed transaction PostgreSQL refuses a batch's first message that
/// is not a Close, each kind with its own error: a Parse of a text that does not parse
/// with 42601, a Bind of a statement the client has with 25P02. A statement the client
/// made on another node is not parsed ahead of them there (that Parse would be refused
/// first, 25P02); after the ROLLBACK it runs as it was.
#[tokio::test]
async fn session_mode_a_failed_transaction_refuses_the_clients_own_first_message() {
    let p = start_proxy(&config_text(""));
    let [x, y] = ["x", "y"].map(|n| unique(&format!("failed_first_{n}")));
    let steps = [
        [
            parse(&y, "/* pgfresh:primary */ SELECT 'one'::text"),
            sync(),
        ]
        .concat(),
        // Read on a standby: the transaction runs there.
        query("BEGIN READ ONLY"),
        query("SELECT 'q'::text"),
        query("SELEC 1"),
        [parse(&x, "SELEC 1"), bind_execute(&y), sync()].concat(),
        [bind_execute(&y), sync()].concat(),
        query("ROLLBACK"),
        [bind_execute(&y), sync()].concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[4].contains("error=42601"), "{r:?}");
    assert!(r[5].contains("error=25P02"), "{r:?}");
    assert!(r[7].contains("row=one"), "{r:?}");
}

/// In a failed transaction PostgreSQL refuses a Bind of a statement the client PREPAREd
/// (25P02), wherever the transaction runs; and a refused Parse of the unnamed statement,
/// the batch's first message, leaves none (PostgreSQL drops the old one before it
/// parses): a Describe of it after a second Parse the error skipped answers 26000.
#[tokio::test]
async fn a_failed_transaction_refuses_the_clients_statements_as_postgresql_does() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let x = unique(&format!("failed_refuses_{prefix}"));
        let steps = [
            query(&format!(
                "/* pgfresh:primary */ PREPARE {x} AS SELECT 'one'::text"
            )),
            // Read on a standby: the transaction runs there.
            query("BEGIN READ ONLY"),
            query("SELECT 'q'::text"),
            query("SELEC 1"),
            [bind_execute(&x), sync()].concat(),
            [
                parse("", "SELECT 'a'::text"),
                parse("", "SELECT 'b'::text"),
                sync(),
            ]
            .concat(),
            [describe(b'S', ""), sync()].concat(),
            query("ROLLBACK"),
            [bind_execute(&x), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[4].contains("error=25P02"), "{prefix}: {r:?}");
        assert!(r[5].contains("error=25P02"), "{prefix}: {r:?}");
        assert!(r[6].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[8].contains("row=one"), "{prefix}: {r:?}");
    }
}

/// In a failed transaction a Close completes, and the batch's next message is refused:
/// a Bind or Describe of a statement the client has, behind one or more Closes, answers
/// CloseComplete and then 25P02 as on PostgreSQL, also where the transaction's connection
/// lacks the statement (made by PREPARE or by Parse on the primary, the transaction on a
/// standby); a Bind of a statement one of those Closes closed answers 26000.
#[tokio::test]
async fn a_failed_transaction_refuses_the_first_use_behind_closes() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let [x, y, z] = ["x", "y", "z"].map(|n| unique(&format!("behind_closes_{prefix}_{n}")));
        let steps = [
            query(&format!(
                "/* pgfresh:primary */ PREPARE {x} AS SELECT 'one'::text"
            )),
            [
                parse(&y, "/* pgfresh:primary */ SELECT 'two'::text"),
                sync(),
            ]
            .concat(),
            // Read on a standby: the transaction runs there.
            query("BEGIN READ ONLY"),
            query("SELECT 'q'::text"),
            query("SELEC 1"),
            [close_statement(""), bind_execute(&x), sync()].concat(),
            [
                close_statement(&z),
                close_statement(""),
                bind_execute(&y),
                sync(),
            ]
            .concat(),
            [close_statement(&z), describe(b'S', &x), sync()].concat(),
            [close_statement(&y), bind_execute(&y), sync()].concat(),
            query("ROLLBACK"),
            [bind_execute(&x), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        for i in 5..=7 {
            assert!(r[i].starts_with('3'), "{prefix} step {i}: {r:?}");
            assert!(r[i].contains("error=25P02"), "{prefix} step {i}: {r:?}");
        }
        assert!(r[8].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[10].contains("row=one"), "{prefix}: {r:?}");
    }
}

/// A batch that parses a statement and EXECUTEs it (through the unnamed statement) runs
/// it, and only from its Parse on: a Describe or Bind of the name in front of the Parse
/// answers 26000 as on PostgreSQL (transaction mode parsed the EXECUTE's statement under
/// the client's name ahead of the whole batch). After the batch the statement runs by
/// EXECUTE and by Bind alike.
#[tokio::test]
async fn a_statement_parsed_and_executed_in_one_batch_exists_from_its_parse_on() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let x = unique(&format!("parsed_then_executed_{prefix}"));
        let execute = [parse("", &format!("EXECUTE {x}")), bind_execute("")].concat();
        let steps = [
            [
                describe(b'S', &x),
                parse(&x, "SELECT 'one'::text"),
                execute.clone(),
                sync(),
            ]
            .concat(),
            [
                parse(&x, "SELECT 'one'::text"),
                describe(b'S', &x),
                execute.clone(),
                sync(),
            ]
            .concat(),
            query(&format!("EXECUTE {x}")),
            [bind_execute(&x), sync()].concat(),
            [
                close_statement(&x),
                bind_execute(&x),
                parse(&x, "SELECT 'two'::text"),
                execute,
                sync(),
            ]
            .concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[0].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[1].contains("row=one"), "{prefix}: {r:?}");
        assert!(
            r[2].contains("row=one") && r[3].contains("row=one"),
            "{prefix}: {r:?}"
        );
        assert!(r[4].contains("error=26000"), "{prefix}: {r:?}");
    }
}

/// A Parse an error skipped leaves no statement on the connection, nor a record that
/// passes for one: once the client parses the same text on another node (a read, on a
/// standby), an EXECUTE and a Bind of it on the first node (the primary) run it.
#[tokio::test]
async fn a_skipped_parse_does_not_pass_for_the_statement_parsed_again_elsewhere() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let x = unique(&format!("skipped_then_elsewhere_{prefix}"));
        let steps = [
            // A transaction that may write runs on the primary.
            query("BEGIN"),
            [
                bind_execute("nope"),
                parse(&x, "SELECT 'one'::text"),
                sync(),
            ]
            .concat(),
            query("ROLLBACK"),
            [parse(&x, "SELECT 'one'::text"), sync()].concat(),
            query(&format!("/* pgfresh:primary */ EXECUTE {x}")),
            query("BEGIN"),
            [bind_execute(&x), sync()].concat(),
            query("COMMIT"),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[1].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[4].contains("row=one"), "{prefix}: {r:?}");
        assert!(r[6].contains("row=one"), "{prefix}: {r:?}");
    }
}

/// Runs `steps` on the primary and through `p`, each step's messages sent at once and
/// read up to its `readies` ReadyForQuery; the outcomes through pgfresh must be the
/// primary's, reply for reply (one a ReadyForQuery). Returns them.
async fn same_as_postgresql_pipelined(p: &ProxyHandle, steps: &[(Vec<u8>, usize)]) -> Vec<String> {
    async fn run_all<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
        s: &mut S,
        steps: &[(Vec<u8>, usize)],
    ) -> Vec<String> {
        use tokio::io::AsyncWriteExt;
        let mut outcomes = Vec::new();
        for (frames, readies) in steps {
            s.write_all(frames).await.unwrap();
            for _ in 0..*readies {
                outcomes.push(outcome(&raw::read_until(s, b'Z').await));
            }
        }
        outcomes
    }
    let reference = run_all(&mut direct_session().await, steps).await;
    let through = run_all(&mut raw::connect(p.addr).await, steps).await;
    for (i, (want, got)) in reference.iter().zip(&through).enumerate() {
        assert_eq!(got, want, "reply {i}: pgfresh differs from PostgreSQL");
    }
    reference
}

/// A batch pipelined behind one whose Parse an error may still skip sees the client's
/// statements as PostgreSQL leaves them: the first batch's refused Parse of `z` makes no
/// statement, and the second batch's Parse of `z`, skipped after its own error, does not
/// bring the refused one back (in session mode the second batch was read before the first
/// was answered, and took back its Parse to the refused text).
#[tokio::test]
async fn a_batch_pipelined_behind_a_refused_parse_sees_no_statement() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let [x, z] = ["x", "z"].map(|n| unique(&format!("pipelined_refused_{prefix}_{n}")));
        let steps = [
            (
                [
                    parse(&x, "SELECT 'one'::text"),
                    parse(&z, "SELEC 1"),
                    sync(),
                    bind_execute("nope"),
                    parse(&z, "SELECT 'two'::text"),
                    sync(),
                ]
                .concat(),
                2,
            ),
            ([bind_execute(&z), sync()].concat(), 1),
            ([bind_execute(&x), sync()].concat(), 1),
        ];
        let r = same_as_postgresql_pipelined(&p, &steps).await;
        assert!(r[0].contains("error=42601"), "{prefix}: {r:?}");
        assert!(r[1].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[2].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[3].contains("row=one"), "{prefix}: {r:?}");
    }
}

/// A Parse of a name the client PREPAREd is refused (42P05) also when the batch parses
/// the name again and then closes it: until that Close the name is the PREPAREd
/// statement (transaction mode looked only at the batch's next message of the name).
#[tokio::test]
async fn a_parse_of_a_prepared_name_is_refused_before_a_later_close_of_it() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let y = unique(&format!("prepared_closed_later_{prefix}"));
        let steps = [
            query(&format!(
                "/* pgfresh:primary */ PREPARE {y} AS SELECT 'one'::text"
            )),
            [
                parse(&y, "/* pgfresh:primary */ SELECT 'two'::text"),
                close_statement(""),
                parse(&y, "SELECT 'three'::text"),
                close_statement(&y),
                sync(),
            ]
            .concat(),
            [bind_execute(&y), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(
            r[1].starts_with("EZ") && r[1].contains("error=42P05"),
            "{prefix}: {r:?}"
        );
        assert!(r[2].contains("row=one"), "{prefix}: {r:?}");
    }
}

/// Session mode, as transaction mode: a batch pipelined behind one whose leading Parse of
/// the unnamed statement the server refuses finds no unnamed statement (26000), not the
/// refused text parsed again.
#[tokio::test]
async fn a_batch_pipelined_behind_a_refused_unnamed_parse_finds_none() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let steps = [(
            [
                parse("", "/* pgfresh:primary */ SELEC 1"),
                bind_execute("nope"),
                sync(),
                bind_execute(""),
                sync(),
            ]
            .concat(),
            2,
        )];
        let r = same_as_postgresql_pipelined(&p, &steps).await;
        assert!(r[0].contains("error=42601"), "{prefix}: {r:?}");
        assert!(r[1].contains("error=26000"), "{prefix}: {r:?}");
    }
}

/// Session mode: a statement closed on one node leaves no copy that a DEALLOCATE on
/// another finds (26000, as on PostgreSQL), and a statement deallocated on one node
/// leaves none that a PREPARE of its name on another would meet (the EXECUTE runs the new
/// one).
#[tokio::test]
async fn session_mode_statements_gone_on_one_node_are_gone_on_every_node() {
    let p = start_proxy(&config_text(""));
    let [y, z] = ["y", "z"].map(|n| unique(&format!("gone_everywhere_{n}")));
    let primary = "/* pgfresh:primary */ ";
    let steps = [
        [parse(&z, &format!("{primary}SELECT 'one'::text")), sync()].concat(),
        // A read makes a standby the active node; a Close alone runs there.
        query("SELECT 'q'::text"),
        [close_statement(&z), sync()].concat(),
        query(&format!("{primary}SELECT 'q'::text")),
        query(&format!("DEALLOCATE {z}")),
        [parse(&y, &format!("{primary}SELECT 'old'::text")), sync()].concat(),
        query("SELECT 'q'::text"),
        query("DEALLOCATE ALL"),
        query(&format!("PREPARE {y} AS SELECT 'new'::text")),
        query(&format!("{primary}EXECUTE {y}")),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[4].contains("error=26000"), "{r:?}");
    assert!(r[9].contains("row=new"), "{r:?}");
}

/// A protocol Close drops a statement the client made with SQL PREPARE, as on PostgreSQL
/// (one namespace for both): a Parse of the name after it makes the client's statement
/// (not refused with 42P05), and an EXECUTE runs that one. A Close an error skips (after
/// a Parse of the name, refused with 42P05) drops nothing.
#[tokio::test]
async fn a_close_drops_a_prepared_statement() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let z = unique(&format!("close_prepared_{prefix}"));
        let steps = [
            query(&format!(
                "/* pgfresh:primary */ PREPARE {z} AS SELECT 'one'::text"
            )),
            [parse(&z, "SELECT 'two'::text"), close_statement(&z), sync()].concat(),
            [
                bind_execute(&z),
                close_statement(&z),
                parse(&z, "SELECT 'three'::text"),
                bind_execute(&z),
                sync(),
            ]
            .concat(),
            query(&format!("EXECUTE {z}")),
            [close_statement(&z), sync()].concat(),
            query(&format!("EXECUTE {z}")),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[1].contains("error=42P05"), "{prefix}: {r:?}");
        assert!(
            r[2].contains("row=one") && r[2].contains("row=three"),
            "{prefix}: {r:?}"
        );
        assert!(r[3].contains("row=three"), "{prefix}: {r:?}");
        assert!(r[5].contains("error=26000"), "{prefix}: {r:?}");
    }
}

/// Session mode: a Parse an error skipped made no statement, and a statement the client
/// PREPAREd under that name later stays when a batch names it (a Parse of it refused
/// with 42601, not closed first as a stale copy): EXECUTE runs it, DEALLOCATE drops it.
#[tokio::test]
async fn session_mode_a_skipped_parse_leaves_a_later_prepared_statement() {
    let p = start_proxy(&config_text(""));
    let z = unique("skipped_parse_prepared");
    let primary = "/* pgfresh:primary */";
    let steps = [
        [
            bind_execute("nope"),
            parse(&z, &format!("{primary} SELECT 'one'::text")),
            sync(),
        ]
        .concat(),
        query(&format!("{primary} PREPARE {z} AS SELECT 'two'::text")),
        [parse(&z, &format!("{primary} SELEC 1")), sync()].concat(),
        query(&format!("{primary} EXECUTE {z}")),
        query(&format!("DEALLOCATE {z}")),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[2].contains("error=42601"), "{r:?}");
    assert!(r[3].contains("row=two"), "{r:?}");
    assert!(r[4].starts_with("CZ"), "{r:?}");
}

/// A statement whose text is `EXECUTE x` is described as `x` (its parameters and rows),
/// in a batch of its own too, where `x` is not yet on the connection under the client's
/// name; in both modes.
#[tokio::test]
async fn a_describe_of_an_execute_describes_the_statement_it_runs() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let z = unique(&format!("describe_execute_{prefix}"));
        let w = unique(&format!("describe_execute_named_{prefix}"));
        let steps = [
            [parse(&z, "SELECT 'one'::text"), sync()].concat(),
            [parse("", &format!("EXECUTE {z}")), sync()].concat(),
            [describe(b'S', ""), sync()].concat(),
            [parse(&w, &format!("EXECUTE {z}")), sync()].concat(),
            [describe(b'S', &w), sync()].concat(),
            [describe(b'S', &w), bind_execute(&w), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[2].starts_with("tTZ"), "{prefix}: {r:?}");
        assert!(r[4].starts_with("tTZ"), "{prefix}: {r:?}");
        assert!(r[5].contains("row=one"), "{prefix}: {r:?}");
    }
}

/// Session mode: a PREPARE of a name the client closed on another node makes the new
/// statement where it runs (PostgreSQL has no statement of that name any more, though a
/// copy of the old one may be left on that node), and an EXECUTE there runs it.
#[tokio::test]
async fn session_mode_a_prepare_of_a_name_closed_elsewhere_makes_the_statement() {
    // Reads on the first standby only: the Parse runs there.
    let config = config_text("").replacen("name = \"pg2\"\n", "name = \"pg2\"\nweight = 0\n", 1);
    let p = start_proxy(&config);
    let z = unique("prepare_closed");
    let primary = "/* pgfresh:primary */ ";
    let steps = [
        [parse(&z, "SELECT 'one'::text"), bind_execute(&z), sync()].concat(),
        // The primary becomes the active node; a Close alone runs there.
        query(&format!("{primary}SELECT 'q'::text")),
        [close_statement(&z), sync()].concat(),
        // Back on the standby, which still holds the Parse's copy: the PREPARE runs there.
        query("SELECT 'q'::text"),
        query(&format!("PREPARE {z} AS SELECT 'new'::text")),
        query(&format!("EXECUTE {z}")),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[4].starts_with("CZ"), "{r:?}");
    assert!(r[5].contains("row=new"), "{r:?}");
}

/// A refused Parse of the unnamed statement leaves none, also when a later Parse of it in
/// the same batch was skipped (taking that one back must not bring the refused text
/// back); in both modes.
#[tokio::test]
async fn a_refused_unnamed_parse_stays_refused_behind_a_skipped_one() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let z = unique(&format!("refused_unnamed_{prefix}"));
        let primary = "/* pgfresh:primary */ ";
        let steps = [
            [
                parse("", &format!("{primary}SELEC 1")),
                parse("", &format!("{primary}SELECT 'a'::text")),
                bind_execute(""),
                sync(),
            ]
            .concat(),
            [
                close_statement(""),
                parse(&z, &format!("{primary}SELECT 'z'::text")),
                sync(),
            ]
            .concat(),
            [bind_execute(""), sync()].concat(),
            [parse("", "SELEC 1"), parse("", "SELECT 'b'::text"), sync()].concat(),
            [bind_execute(""), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[1].starts_with("31Z"), "{prefix}: {r:?}");
        assert!(r[2].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[4].contains("error=26000"), "{prefix}: {r:?}");
    }
}

/// Transaction mode: in a failed transaction a Parse of a name the client has is answered
/// as PostgreSQL answers it, by its text first: a syntax error (42601), or else the
/// failed transaction's 25P02; also where the connection lacks the client's statement
/// of that name (parsed on a standby), which is not put there first.
#[tokio::test]
async fn a_parse_of_a_name_in_use_in_a_failed_transaction_reports_its_syntax_error() {
    let p = start_proxy(&tx_config(""));
    let y = unique("failed_tx_name_in_use");
    let primary = "/* pgfresh:primary */ ";
    let steps = [
        [parse(&y, "SELECT 'a'::text"), sync()].concat(),
        query("BEGIN"),
        query(&format!("{primary}SELEC 1")),
        [parse(&y, &format!("{primary}SELEC 1")), sync()].concat(),
        [parse(&y, &format!("{primary}SELECT 'b'::text")), sync()].concat(),
        query("ROLLBACK"),
        [bind_execute(&y), sync()].concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[3].contains("error=42601"), "{r:?}");
    assert!(r[4].contains("error=25P02"), "{r:?}");
    assert!(r[6].contains("row=a"), "{r:?}");
}

/// A statement a batch parses and then EXECUTEs is not put on the connection ahead of the
/// batch (session mode: the batch's own Parse makes it there): where its text does not
/// parse, the client hears the syntax error (42601) of its own Parse, not the 25P02 of a
/// transaction pgfresh's early copy failed; in both modes.
#[tokio::test]
async fn a_statement_parsed_and_executed_in_one_batch_is_not_parsed_ahead_of_it() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let y = unique(&format!("parsed_then_executed_{prefix}"));
        let primary = "/* pgfresh:primary */ ";
        let steps = [
            [parse(&y, "SELECT 'a'::text"), sync()].concat(),
            query("BEGIN"),
            [
                close_statement(&y),
                parse(&y, &format!("{primary}SELEC 1")),
                parse("", &format!("{primary}EXECUTE {y}")),
                bind_execute(""),
                sync(),
            ]
            .concat(),
            query("ROLLBACK"),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[2].contains("error=42601"), "{prefix}: {r:?}");
    }
}

/// A Query that ends a failed transaction and then EXECUTEs or PREPAREs a name of a
/// statement the client made by Parse (on a standby: the transaction's connection lacks
/// it under the client's name) runs that statement, and is refused the PREPARE (42P05),
/// as on PostgreSQL; in both modes.
#[tokio::test]
async fn a_query_that_ends_a_failed_transaction_finds_the_clients_statements_after() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let x = unique(&format!("after_failed_tx_{prefix}"));
        let primary = "/* pgfresh:primary */ ";
        let steps = [
            [parse(&x, "SELECT 'x'::text"), sync()].concat(),
            query("BEGIN"),
            query(&format!("{primary}SELEC 1")),
            query(&format!("ROLLBACK; {primary}EXECUTE {x}")),
            query("BEGIN"),
            query(&format!("{primary}SELEC 1")),
            query(&format!("COMMIT; PREPARE {x} AS SELECT 'y'::text")),
            query(&format!("EXECUTE {x}")),
            // A transaction pgfresh has not begun on any server (its BEGIN deferred).
            query("BEGIN"),
            query(&format!("COMMIT; {primary}EXECUTE {x}")),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[3].contains("row=x"), "{prefix}: {r:?}");
        assert!(r[6].contains("error=42P05"), "{prefix}: {r:?}");
        assert!(r[7].contains("row=x"), "{prefix}: {r:?}");
        assert!(r[9].contains("row=x"), "{prefix}: {r:?}");
    }
}

/// Transaction mode: in a transaction, a Parse pipelined behind a batch that fails it is
/// refused (25P02) as on PostgreSQL, also one of a text the connection already holds
/// (which pgfresh otherwise answers itself): it waits for the batch ahead.
#[tokio::test]
async fn a_parse_pipelined_behind_a_failing_batch_is_refused() {
    let p = start_proxy(&tx_config(""));
    let [w, z] = ["w", "z"].map(|n| unique(&format!("pipelined_failing_{n}")));
    let primary = "/* pgfresh:primary */ ";
    let text = format!("{primary}SELECT 'one'::text");
    let steps = [
        ([parse(&w, &text), sync()].concat(), 1),
        (query("BEGIN"), 1),
        (query(&format!("{primary}SELECT 1")), 1),
        (
            [bind_execute("nope"), sync(), parse(&z, &text), sync()].concat(),
            2,
        ),
        (query("ROLLBACK"), 1),
        ([bind_execute(&z), sync()].concat(), 1),
    ];
    let r = same_as_postgresql_pipelined(&p, &steps).await;
    assert!(r[4].contains("error=25P02"), "{r:?}");
    assert!(r[6].contains("error=26000"), "{r:?}");
}

/// A refused Parse of the unnamed statement drops the client's unnamed statement, not
/// the one a batch pipelined behind it parses; in both modes.
#[tokio::test]
async fn a_refused_unnamed_parse_leaves_the_one_pipelined_behind_it() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let primary = "/* pgfresh:primary */ ";
        let steps = [
            (
                [
                    parse("", &format!("{primary}SELEC 1")),
                    sync(),
                    parse("", &format!("{primary}SELECT 'behind'::text")),
                    sync(),
                ]
                .concat(),
                2,
            ),
            ([bind_execute(""), sync()].concat(), 1),
        ];
        let r = same_as_postgresql_pipelined(&p, &steps).await;
        assert!(r[2].contains("row=behind"), "{prefix}: {r:?}");
    }
}

/// Transaction mode: a Close of a statement an EXECUTE ran earlier in the batch (the
/// EXECUTE put a copy on the connection under the client's name) leaves nothing a Bind
/// of the name can run (26000), as on PostgreSQL.
#[tokio::test]
async fn a_close_drops_the_copy_an_execute_made() {
    let p = start_proxy(&tx_config(""));
    let x = unique("close_execute_copy");
    let primary = "/* pgfresh:primary */ ";
    let steps = [
        [parse(&x, "SELECT 'x'::text"), sync()].concat(),
        [
            parse("", &format!("{primary}EXECUTE {x}")),
            bind_execute(""),
            close_statement(&x),
            bind_execute(&x),
            sync(),
        ]
        .concat(),
    ];
    let r = same_as_postgresql(&p, &steps).await;
    assert!(
        r[1].contains("row=x") && r[1].contains("error=26000"),
        "{r:?}"
    );
}

/// A statement pgfresh puts on the connection for a unit (a DEALLOCATE's, here) that the
/// server refuses, because a batch pipelined ahead failed the transaction, is not counted
/// as there: a Describe of it after is refused as PostgreSQL refuses it (25P02), not
/// answered 26000; in both modes.
#[tokio::test]
async fn a_statement_put_in_a_transaction_failed_ahead_is_not_counted() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let y = unique(&format!("put_failed_ahead_{prefix}"));
        let primary = "/* pgfresh:primary */ ";
        let steps = [
            ([parse(&y, "SELECT 'a'::text"), sync()].concat(), 1),
            (query("BEGIN"), 1),
            (query(&format!("{primary}SELECT 1")), 1),
            (
                [
                    bind_execute("nope"),
                    sync(),
                    query(&format!("{primary}DEALLOCATE {y}")),
                ]
                .concat(),
                2,
            ),
            ([describe(b'S', &y), sync()].concat(), 1),
            (query("ROLLBACK"), 1),
            ([bind_execute(&y), sync()].concat(), 1),
        ];
        let r = same_as_postgresql_pipelined(&p, &steps).await;
        assert!(r[5].contains("error=25P02"), "{prefix}: {r:?}");
        assert!(r[7].contains("row=a"), "{prefix}: {r:?}");
    }
}

/// In a transaction, a batch that closes a statement and then binds it, pipelined behind
/// a batch that fails the transaction, answers CloseComplete and 26000 as PostgreSQL does
/// (a Close is not refused in a failed transaction, and a Bind of a statement that does
/// not exist fails before the failed transaction is looked at). Session mode counted the
/// Bind as one of a statement pgfresh never saw, dropped the connection's copy ahead of
/// the batch, and then put the client's statement back in front of it, where the server
/// refused it (25P02) once the batch ahead had failed.
#[tokio::test]
async fn a_bind_behind_its_close_pipelined_behind_a_failing_batch_finds_no_statement() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let x = unique(&format!("closed_then_bound_{prefix}"));
        let steps = [
            (query("BEGIN"), 1),
            ([parse(&x, "SELECT 'one'::text"), sync()].concat(), 1),
            (
                [
                    bind_execute("nope"),
                    sync(),
                    close_statement(&x),
                    bind_execute(&x),
                    sync(),
                ]
                .concat(),
                2,
            ),
            (query("ROLLBACK"), 1),
        ];
        let r = same_as_postgresql_pipelined(&p, &steps).await;
        assert!(r[2].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[3].starts_with("3E"), "{prefix}: {r:?}");
        assert!(r[3].contains("error=26000"), "{prefix}: {r:?}");
    }
}

/// In a transaction, a Parse pipelined behind a batch that fails the transaction reports
/// its own syntax error (42601) as on PostgreSQL, which checks the syntax first, also
/// where it names a statement the client has and the transaction's connection lacks.
/// Session mode put the client's statement on that connection ahead of the batch (so
/// that the server would refuse the Parse of a name in use, 42P05), and the server
/// refused that (25P02) once the batch ahead had failed; a batch that needs statements
/// put ahead of it now waits for the client's batches ahead in a transaction.
#[tokio::test]
async fn a_parse_pipelined_behind_a_failing_batch_reports_its_syntax_error() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let y = unique(&format!("behind_failing_{prefix}"));
        let steps = [
            (
                [
                    parse(&y, "/* pgfresh:primary */ SELECT 'one'::text"),
                    sync(),
                ]
                .concat(),
                1,
            ),
            // Read on a standby: the transaction runs there.
            (query("BEGIN READ ONLY"), 1),
            (query("SELECT 'q'::text"), 1),
            (
                [bind_execute("nope"), sync(), parse(&y, "SELEC 1"), sync()].concat(),
                2,
            ),
            (query("ROLLBACK"), 1),
            ([bind_execute(&y), sync()].concat(), 1),
        ];
        let r = same_as_postgresql_pipelined(&p, &steps).await;
        assert!(r[3].contains("error=26000"), "{prefix}: {r:?}");
        assert!(r[4].contains("error=42601"), "{prefix}: {r:?}");
        assert!(r[6].contains("row=one"), "{prefix}: {r:?}");
    }
}

/// In a failed transaction PostgreSQL describes, binds and runs a prepared ROLLBACK or
/// COMMIT (it parses those there too): a driver that prepared its ROLLBACK (JDBC does,
/// past `prepareThreshold`) ends the failed transaction with it, also where the
/// transaction runs on a connection that lacks the statement. Session mode refused the
/// statement there (25P02) as it refuses any other, and the client was left in the
/// failed transaction (transaction mode's rewrite already parsed it there).
#[tokio::test]
async fn a_prepared_rollback_ends_a_failed_transaction() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let [rb, cm] = ["rb", "cm"].map(|n| unique(&format!("exit_{prefix}_{n}")));
        let fail = [
            // Read on a standby: the transaction runs there.
            query("BEGIN READ ONLY"),
            query("SELECT 'q'::text"),
            query("SELEC 1"),
        ];
        let steps: Vec<Vec<u8>> = [
            vec![[
                parse(&rb, "/* pgfresh:primary */ ROLLBACK"),
                parse(&cm, "/* pgfresh:primary */ COMMIT"),
                sync(),
            ]
            .concat()],
            fail.to_vec(),
            vec![
                [describe(b'S', &rb), sync()].concat(),
                [bind_execute(&rb), sync()].concat(),
            ],
            fail.to_vec(),
            vec![
                [bind_execute(&cm), sync()].concat(),
                query("SELECT 'after'::text"),
            ],
        ]
        .concat();
        let r = same_as_postgresql(&p, &steps).await;
        assert_eq!(r[4], "tnZ status=E", "{prefix}: {r:?}");
        assert_eq!(r[5], "2CZ status=I", "{prefix}: {r:?}");
        assert_eq!(r[9], "2CZ status=I", "{prefix}: {r:?}");
        assert!(r[10].contains("row=after"), "{prefix}: {r:?}");
    }
}

/// In a failed transaction the server parses a COMMIT or ROLLBACK: a Parse of one under a
/// name the batch has just closed completes (and the statement then ends the
/// transaction), as on PostgreSQL. Transaction mode sent the Parse under the server name
/// the connection already held that text under, to be refused as any other Parse is
/// there, and the server answered 42P05 instead.
#[tokio::test]
async fn a_rollback_parsed_again_in_a_failed_transaction_completes() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let t = unique(&format!("rollback_again_{prefix}"));
        let steps = [
            [parse(&t, "ROLLBACK"), sync()].concat(),
            query("BEGIN"),
            query("SELEC 1"),
            [close_statement(&t), parse(&t, "ROLLBACK"), sync()].concat(),
            [bind_execute(&t), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert_eq!(r[3], "31Z status=E", "{prefix}: {r:?}");
        assert_eq!(r[4], "2CZ status=I", "{prefix}: {r:?}");
    }
}

/// In a failed transaction a batch that begins by parsing a ROLLBACK TO (which the
/// server parses there) and then binds a statement the client has is refused at that
/// Bind (25P02), as on PostgreSQL, also where the transaction's connection lacks the
/// statement: pgfresh's refused Parse goes in front of the Bind, not only of a batch's
/// first message. Without it the server answered 26000.
#[tokio::test]
async fn a_failed_transaction_refuses_the_first_use_behind_a_parsed_rollback() {
    for (config, prefix) in [(config_text(""), "session"), (tx_config(""), "tx")] {
        let p = start_proxy(&config);
        let z = unique(&format!("behind_rollback_to_{prefix}"));
        let steps = [
            [
                parse(&z, "/* pgfresh:primary */ SELECT 'one'::text"),
                sync(),
            ]
            .concat(),
            // Read on a standby: the transaction runs there.
            query("BEGIN READ ONLY"),
            query("SELECT 'q'::text"),
            query("SELEC 1"),
            [parse("", "ROLLBACK TO s"), bind_execute(&z), sync()].concat(),
            query("ROLLBACK"),
            [bind_execute(&z), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[4].starts_with("1E"), "{prefix}: {r:?}");
        assert!(r[4].contains("error=25P02"), "{prefix}: {r:?}");
        assert!(r[6].contains("row=one"), "{prefix}: {r:?}");
    }
}

/// In a failed transaction a batch that runs a prepared ROLLBACK and then a statement
/// whose copy on the transaction's connection is one the client has since replaced never
/// runs that copy: session mode puts no statement there in the failed transaction (the
/// server would refuse it), and left the stale copy in place, which the Bind or EXECUTE
/// behind the ROLLBACK then ran (the old text's rows). It is closed ahead of the batch
/// now (a Close is not refused). PostgreSQL runs the client's new statement there; pgfresh
/// answers 26000 (a known difference: nothing can be put on the connection ahead of the
/// batch, and the statement is needed only after its ROLLBACK).
#[tokio::test]
async fn a_statement_replaced_elsewhere_never_runs_after_a_rollback_in_a_failed_transaction() {
    let p = start_proxy(&config_text(""));
    let [n, rb] = ["n", "rb"].map(|l| unique(&format!("stale_after_rollback_{l}")));
    let primary = "/* pgfresh:primary */ ";
    let setup = |last: Vec<u8>| {
        vec![
            [parse(&n, &format!("{primary}SELECT 'old'::text")), sync()].concat(),
            [parse(&rb, &format!("{primary}ROLLBACK")), sync()].concat(),
            // On a standby: the session leaves the primary, where `n` stays the old text.
            query("SELECT 'q'::text"),
            [close_statement(&n), parse(&n, "SELECT 'new'::text"), sync()].concat(),
            query("BEGIN"),
            query(&format!("{primary}SELECT 'q'::text")),
            query("SELEC 1"),
            last,
            [bind_execute(&n), sync()].concat(),
        ]
    };
    let by_bind = [bind_execute(&rb), bind_execute(&n), sync()].concat();
    let by_execute = [
        bind_execute(&rb),
        parse("", &format!("EXECUTE {n}")),
        bind_execute(""),
        sync(),
    ]
    .concat();
    for (what, last) in [("bind", by_bind), ("execute", by_execute)] {
        let r = run(&mut raw::connect(p.addr).await, &setup(last)).await;
        assert!(r[6].contains("status=E"), "{what}: {r:?}");
        assert!(r[7].starts_with("2C"), "{what}: the ROLLBACK ran: {r:?}");
        assert!(
            !r[7].contains("row=old"),
            "{what}: the replaced statement ran: {r:?}"
        );
        assert!(r[8].contains("row=new"), "{what}: {r:?}");
    }
}

/// A batch that runs a prepared ROLLBACK in a failed transaction is outside one from
/// there on: a Parse after it of a name the client has is refused 42P05, and the rest of
/// the batch skipped, as on PostgreSQL. Transaction mode mapped the whole batch as in the
/// failed transaction, where the server refuses any Parse before it looks at the name,
/// and sent that Parse under pgfresh's prefix: it completed.
#[tokio::test]
async fn a_batch_after_its_rollback_in_a_failed_transaction_is_outside_one() {
    for (config, prefix) in [(tx_config(""), "tx"), (config_text(""), "session")] {
        let p = start_proxy(&config);
        let [rb, n] = ["rb", "n"].map(|l| unique(&format!("after_rollback_{prefix}_{l}")));
        let steps = [
            [
                parse(&rb, "ROLLBACK"),
                parse(&n, "SELECT 'one'::text"),
                sync(),
            ]
            .concat(),
            query("BEGIN"),
            query("SELEC 1"),
            [
                bind_execute(&rb),
                parse(&n, "SELECT 'two'::text"),
                bind_execute(&n),
                sync(),
            ]
            .concat(),
            [bind_execute(&n), sync()].concat(),
        ];
        let r = same_as_postgresql(&p, &steps).await;
        assert!(r[3].starts_with("2CE"), "{prefix}: {r:?}");
        assert!(r[3].contains("error=42P05"), "{prefix}: {r:?}");
        assert!(r[4].contains("row=one"), "{prefix}: {r:?}");
    }
}
