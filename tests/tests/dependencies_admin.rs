//! The dependency graph learned from the primary's catalog, as the admin API
//! (`GET /v1/dependencies`) and the console (`SHOW DEPENDENCIES`) show it: triggers, FK
//! cascades, views, partitions, function bodies and unanalysable (dynamic SQL) bodies; a
//! reload after DDL; manual rules from the config file, changed live, and a bad rule
//! rejected with the running config kept; the schema window while a change is in flight.

use std::time::{Duration, Instant};

use pgfresh_tests::admin::*;
use pgfresh_tests::*;
use serde_json::Value;

/// Poll `GET /v1/dependencies` every 20 ms until `done` holds for it (a minute at most),
/// asking the loader for `app`'s graph each time, as a session does.
async fn wait_deps(
    p: &ProxyHandle,
    token: Option<&str>,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let _ = p.shared.deps.graph(&p.shared, "app");
        let d = get_json(p, "/v1/dependencies", token).await;
        if done(&d) {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {d}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `app`'s report has an edge of `kind` from `from` to `to` (and `via`, if given).
fn has_edge(d: &Value, kind: &str, from: &str, to: &str, via: Option<&str>) -> bool {
    d["databases"]["app"]["edges"]
        .as_array()
        .is_some_and(|edges| {
            edges.iter().any(|e| {
                e["kind"] == kind
                    && e["from"] == from
                    && e["to"] == to
                    && via.is_none_or(|v| e["via"] == v)
            })
        })
}

fn unanalysable<'a>(d: &'a Value, function: &str) -> Option<&'a Value> {
    d["databases"]["app"]["unanalysable"]
        .as_array()?
        .iter()
        .find(|u| u["function"] == function)
}

#[tokio::test]
async fn learns_triggers_cascades_views_partitions_and_bodies_and_reloads_after_ddl() {
    let p = start_proxy(&config_text(""));
    let c = p.connect().await;
    let a = unique("deps");
    c.batch_execute(&format!(
        "CREATE TABLE {a}_totals(n int);
         CREATE TABLE {a}_orders(id int PRIMARY KEY);
         CREATE FUNCTION {a}_bump() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN UPDATE {a}_totals SET n = n + 1; RETURN NEW; END $$;
         CREATE TRIGGER {a}_bump_trg AFTER INSERT ON {a}_orders
           FOR EACH ROW EXECUTE FUNCTION {a}_bump();
         CREATE TABLE {a}_items(order_id int REFERENCES {a}_orders(id) ON DELETE CASCADE);
         CREATE VIEW {a}_v AS SELECT o.id FROM {a}_orders o;
         CREATE TABLE {a}_events(id int) PARTITION BY RANGE (id);
         CREATE TABLE {a}_events_1 PARTITION OF {a}_events FOR VALUES FROM (0) TO (1000);
         CREATE FUNCTION {a}_dyn() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN EXECUTE format('INSERT INTO %I VALUES (1)', TG_ARGV[0]); RETURN NEW; END $$;
         CREATE TRIGGER {a}_dyn_trg AFTER INSERT ON {a}_items
           FOR EACH ROW EXECUTE FUNCTION {a}_dyn('{a}_totals');"
    ))
    .await
    .expect("create the schema");
    // The DDL went through pgfresh: the session (or, here, the test) asks for a reload.
    p.shared.deps.invalidate("app");

    let rel = |s: &str| format!("public.{a}_{s}");
    let func = |s: &str| format!("public.{a}_{s}()");
    let d = wait_deps(&p, None, "every edge kind", |d| {
        has_edge(
            d,
            "trigger",
            &rel("orders"),
            &func("bump"),
            Some(&format!("{a}_bump_trg")),
        ) && has_edge(d, "function", &func("bump"), &rel("totals"), None)
            && has_edge(d, "foreign_key", &rel("orders"), &rel("items"), None)
            && has_edge(d, "view", &rel("v"), &rel("orders"), None)
            && has_edge(d, "partition", &rel("events"), &rel("events_1"), None)
            && unanalysable(d, &func("dyn")).is_some()
    })
    .await;
    let fk = d["databases"]["app"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "foreign_key" && e["to"] == rel("items").as_str())
        .unwrap();
    assert_eq!(fk["action"], "on delete cascade", "{fk}");
    let dynamic = unanalysable(&d, &func("dyn")).unwrap();
    assert!(
        dynamic["reason"].as_str().unwrap().contains("EXECUTE"),
        "{dynamic}"
    );
    assert_eq!(dynamic["language"], "plpgsql");
    assert_eq!(dynamic["overridden_by_rule"], false);
    let report = &d["databases"]["app"];
    assert!(report["relations"].as_u64().unwrap() >= 6, "{report}");
    assert!(report["functions"].as_u64().unwrap() >= 2, "{report}");
    // The hot path hands out the same graph.
    let g = p.shared.deps.graph(&p.shared, "app").expect("graph loaded");
    assert!(!g.is_empty());

    // The console shows the same, one row per edge plus one per unanalysable body.
    let (rows, _) = console_ok(&p, "SHOW DEPENDENCIES");
    let row = |kind: &str, from: &str| {
        rows.iter()
            .find(|r| r[0] == "app" && r[1] == kind && r[2] == from)
            .unwrap_or_else(|| panic!("{kind} from {from} in {rows:?}"))
            .clone()
    };
    let trigger = row("trigger", &rel("orders"));
    assert_eq!(
        trigger[3..],
        [func("bump"), format!("{a}_bump_trg"), "fires".to_string()]
    );
    let dynamic = row("unanalysable", &func("dyn"));
    assert!(dynamic[5].contains("EXECUTE"), "{dynamic:?}");
    assert_eq!(row("view", &rel("v"))[3], rel("orders"));
    assert_eq!(row("partition", &rel("events"))[3], rel("events_1"));
    let (one, _) = console_ok(&p, "SHOW DEPENDENCIES app");
    assert!(
        !one.is_empty() && one.iter().all(|r| r[0] == "app"),
        "{one:?}"
    );
    let (none, _) = console_ok(&p, "show dependencies no_such_db");
    assert!(none.is_empty(), "{none:?}");
    let (help, _) = console_ok(&p, "SHOW HELP");
    assert!(
        help.iter().any(|r| r[0].starts_with("SHOW DEPENDENCIES")),
        "{help:?}"
    );

    // New DDL through pgfresh: a trigger on the totals table writing a log table. A
    // reload picks it up (long before the 30 s refresh), and a burst of requests
    // coalesces into loads that still end with the new trigger in the graph.
    c.batch_execute(&format!(
        "CREATE TABLE {a}_log(at timestamptz);
         CREATE FUNCTION {a}_log_fn() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN INSERT INTO {a}_log VALUES (now()); RETURN NEW; END $$;
         CREATE TRIGGER {a}_log_trg AFTER UPDATE ON {a}_totals
           FOR EACH ROW EXECUTE FUNCTION {a}_log_fn();"
    ))
    .await
    .expect("add a trigger");
    let invalidated = Instant::now();
    for _ in 0..20 {
        p.shared.deps.invalidate("app");
    }
    let d = wait_deps(&p, None, "the new trigger", |d| {
        has_edge(
            d,
            "trigger",
            &rel("totals"),
            &func("log_fn"),
            Some(&format!("{a}_log_trg")),
        ) && has_edge(d, "function", &func("log_fn"), &rel("log"), None)
    })
    .await;
    println!(
        "new trigger visible {:?} after invalidate",
        invalidated.elapsed()
    );
    assert!(has_edge(&d, "trigger", &rel("orders"), &func("bump"), None));

    // The expansions the router will use. A write to totals also writes log (trigger).
    // A write to orders writes totals (trigger) and may cascade to items, whose trigger
    // runs dynamic SQL: the whole database.
    let g = p.shared.deps.graph(&p.shared, "app").unwrap();
    let mut marks = Vec::new();
    let e = g.expand_writes(&[pgfresh_sql_name(&format!("{a}_totals"))], &[], &mut marks);
    assert!(!e.is_whole_database());
    let marked: Vec<String> = marks.iter().map(|m| m.to_string()).collect();
    assert_eq!(marked, vec![rel("log")]);
    marks.clear();
    let e = g.expand_writes(&[pgfresh_sql_name(&format!("{a}_orders"))], &[], &mut marks);
    assert!(e.is_whole_database());
    let marked: Vec<String> = marks.iter().map(|m| m.to_string()).collect();
    assert!(
        marked.contains(&rel("totals")) && marked.contains(&rel("items")),
        "{marked:?}"
    );

    // load_now waits for a load of its own.
    let g = p
        .shared
        .deps
        .load_now(&p.shared, "app")
        .await
        .expect("load now");
    assert!(g.report().edges.len() >= 6);
}

fn pgfresh_sql_name(name: &str) -> pgfresh_sql::RelName {
    pgfresh_sql::RelName::new(None, name)
}

#[tokio::test]
async fn manual_rules_reload_live_and_a_bad_rule_is_rejected() {
    let token = "deps-token";
    let m = unique("rule");
    let rules = |list: &str| format!("relation_dependencies = [{list}]");
    let base = config_text(&rules(&format!("\"{m}_src -> {m}_dst\""))).replace(
        "[proxy]\n",
        &format!("[proxy]\nadmin_token = \"{token}\"\n"),
    );
    let p = start_proxy(&base);

    let r = http(p.admin, "GET", "/v1/dependencies", None, None).await;
    assert_eq!(r.status, 401, "{}", r.body);

    p.shared
        .deps
        .load_now(&p.shared, "app")
        .await
        .expect("load app");
    let d = wait_deps(&p, Some(token), "the manual rule", |d| {
        has_edge(d, "manual", &format!("{m}_src"), &format!("{m}_dst"), None)
    })
    .await;
    let edge = d["databases"]["app"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "manual")
        .unwrap();
    assert_eq!(edge["via"], format!("{m}_src -> {m}_dst"), "{edge}");

    // A database the monitor cannot read: the error is the server's own (message and
    // SQLSTATE), counted, and nothing is shown for it.
    let errors = |text: &str| {
        metric_sum(
            text,
            "pgfresh_dependency_loads_total",
            Some(("result", "error")),
        )
    };
    let before = errors(&http(p.admin, "GET", "/metrics", None, None).await.body);
    let err = p
        .shared
        .deps
        .load_now(&p.shared, &format!("{m}_nodb"))
        .await
        .expect_err("no such database");
    assert!(
        err.contains("does not exist") && err.contains("3D000"),
        "{err}"
    );
    let after = errors(&http(p.admin, "GET", "/metrics", None, None).await.body);
    assert!(after > before, "errors counted: {before} -> {after}");
    let d = get_json(&p, "/v1/dependencies", Some(token)).await;
    assert!(d["databases"].get(format!("{m}_nodb")).is_none(), "{d}");

    // A changed rule takes effect without a restart (graphs rebuilt from cached rows).
    let changed = config_text(&rules(&format!(
        "\"{m}_src -> {m}_other\", \"{m}_fn() -> {m}_ledger\""
    )))
    .replace(
        "[proxy]\n",
        &format!("[proxy]\nadmin_token = \"{token}\"\n"),
    );
    write_config(&p.config_path, &changed);
    wait_deps(&p, Some(token), "the changed rules", |d| {
        has_edge(
            d,
            "manual",
            &format!("{m}_src"),
            &format!("{m}_other"),
            None,
        ) && !has_edge(d, "manual", &format!("{m}_src"), &format!("{m}_dst"), None)
            && d["databases"]["app"]["edges"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["kind"] == "manual" && e["to"] == format!("{m}_ledger").as_str())
    })
    .await;

    // A bad rule rejects the whole file (together with a valid change next to it): the
    // running rules and TTL stay, and the error names the key and the rule.
    let before = get_json(&p, "/v1/status", Some(token)).await;
    let bad = changed.replace(
        &format!("\"{m}_fn() -> {m}_ledger\""),
        &format!("\"{m}_fn() -> {m}_ledger\", \"{m}_broken\""),
    );
    let bad = bad.replace(
        "cold_start_ms = 0",
        "cold_start_ms = 0\nrecent_access_ttl_ms = 4321",
    );
    write_config(&p.config_path, &bad);
    wait_status(&p, Some(token), "the rejected reload", |s| {
        reload_count(s, "error") > reload_count(&before, "error")
    })
    .await;
    let (ok, _, err) = console(&p, "admin", "admin-pass", &["RELOAD"]);
    assert!(!ok, "RELOAD of a bad rule must fail");
    assert!(
        err.contains("routing.relation_dependencies[2]") && err.contains(&format!("{m}_broken")),
        "{err}"
    );
    let running = p.shared.config.snapshot();
    assert_eq!(running.routing.relation_dependencies.len(), 2);
    assert_ne!(running.routing.recent_access_ttl_ms, 4321);
    let d = get_json(&p, "/v1/dependencies", Some(token)).await;
    assert!(
        has_edge(
            &d,
            "manual",
            &format!("{m}_src"),
            &format!("{m}_other"),
            None
        ),
        "{d}"
    );

    // learn_dependencies = false: only the manual rules are in force.
    write_config(
        &p.config_path,
        &changed.replace(
            "cold_start_ms = 0",
            "cold_start_ms = 0\nlearn_dependencies = false",
        ),
    );
    eventually("learn_dependencies off", Duration::from_secs(30), || {
        !p.shared.config.snapshot().routing.learn_dependencies
    })
    .await;
    let d = wait_deps(&p, Some(token), "the rules-only graph", |d| {
        d["databases"]["app"]["edges"]
            .as_array()
            .is_some_and(|e| !e.is_empty() && e.iter().all(|e| e["kind"] == "manual"))
    })
    .await;
    assert!(
        has_edge(
            &d,
            "manual",
            &format!("{m}_src"),
            &format!("{m}_other"),
            None
        ),
        "{d}"
    );
    let g = p.shared.deps.graph(&p.shared, "app").expect("rules graph");
    assert!(g
        .report()
        .edges
        .iter()
        .all(|e| e.kind == pgfresh_deps::EdgeKind::Manual));
}

/// `GET /v1/dependencies` says, per database, whether the schema window is open: from an
/// effect-changing schema change being sent until the load after it has finished.
#[tokio::test]
async fn the_schema_window_is_shown_while_a_change_is_in_flight() {
    let p = start_proxy(&config_text(""));
    let (t, f) = (unique("sw_src"), unique("sw_fn"));
    let setup = p.connect().await;
    setup
        .batch_execute(&format!(
            "CREATE TABLE {t}(id int);
             CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;"
        ))
        .await
        .unwrap();
    let window = |d: &Value| d["databases"]["app"]["schema_window"].clone();
    wait_deps(&p, None, "a closed window", |d| window(d)["open"] == false).await;
    let c = p.connect().await;
    c.batch_execute(&format!(
        "BEGIN; CREATE TRIGGER {t}_trg AFTER INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {f}()"
    ))
    .await
    .unwrap();
    let d = get_json(&p, "/v1/dependencies", None).await;
    assert_eq!(
        window(&d),
        serde_json::json!({"open": true, "changes_in_flight": 1}),
        "{d}"
    );
    c.batch_execute("COMMIT").await.unwrap();
    let d = wait_deps(&p, None, "the window closed after the reload", |d| {
        window(d)["open"] == false
            && has_edge(
                d,
                "trigger",
                &format!("public.{t}"),
                &format!("public.{f}()"),
                None,
            )
    })
    .await;
    assert_eq!(window(&d)["changes_in_flight"], 0);
}

/// `p` has marked nothing of database `app` as written.
fn assert_not_marked(p: &ProxyHandle) {
    let now = p.shared.recency.lookup_database("app");
    assert!(
        matches!(now, pgfresh_recency::Hotness::Cold),
        "the database was marked: {now:?}"
    );
}

/// A pgfresh that has not learned a database yet must treat a statement calling a user
/// function as one that may write anything: the whole database is marked. The first login
/// to the database waits for the first load, so the first statements of a new pgfresh are
/// analysed with the catalog: a STABLE function that only reads marks nothing. (Without the
/// wait, the first of these reads marked the whole database.)
#[tokio::test]
async fn a_new_pgfresh_learns_the_database_before_its_first_statements() {
    let setup = proxy().connect().await;
    let (t, f) = (unique("first_load"), unique("first_load_count"));
    setup
        .batch_execute(&format!(
            "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1);
             CREATE FUNCTION {f}() RETURNS bigint LANGUAGE sql STABLE AS 'SELECT count(*) FROM {t}'"
        ))
        .await
        .unwrap();
    wait_replicated_on(cluster(), &setup).await;
    let fresh = start_proxy(&config_text(""));
    let c = fresh.connect().await;
    for _ in 0..20 {
        c.query_one(&format!("SELECT {f}()"), &[]).await.unwrap();
        assert_not_marked(&fresh);
    }
}

/// Before a database is learned, a read that calls only built-ins (`count(*)`,
/// `inet_server_port()`) is still a plain read: built-ins fire nothing and write only what
/// the analysis names. Here learning is switched on after the login (so nothing waited for
/// the load) and the reads start the load themselves: they stay on the replicas and mark
/// nothing.
#[tokio::test]
async fn reads_calling_only_built_ins_need_no_learned_graph() {
    let setup = proxy().connect().await;
    let t = unique("builtin_reads");
    setup
        .batch_execute(&format!(
            "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1)"
        ))
        .await
        .unwrap();
    wait_replicated_on(cluster(), &setup).await;
    let fresh = start_proxy(&config_text("learn_dependencies = false"));
    let c = fresh.connect().await;
    std::fs::write(&fresh.config_path, config_text("")).unwrap();
    pgfresh_proxy::reload_config(&fresh.shared, "test").expect("learning switched on");
    let mut on_primary = 0;
    for _ in 0..20 {
        let row = c
            .query_one(
                &format!("SELECT inet_server_port(), count(*) FROM {t}"),
                &[],
            )
            .await
            .unwrap();
        on_primary += usize::from(row.get::<_, i32>(0) as u16 == node_port(0));
    }
    assert_eq!(
        on_primary, 0,
        "reads that call built-ins went to the primary"
    );
    assert_not_marked(&fresh);
}
