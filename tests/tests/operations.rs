//! Operating pgfresh against the real cluster: hot reload of the config file, the
//! external-controller HTTP API, Prometheus metrics, the admin console through psql,
//! and the status page rendered by headless Chromium.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use pgfresh_proxy::admin::samples;
use pgfresh_tests::admin::*;
use pgfresh_tests::*;
use serde_json::Value;

#[tokio::test]
async fn file_edit_changes_ttl_for_the_next_statement_without_dropping_the_connection() {
    let (p, text) = proxy_with_ttl(60_000);
    let c = p.connect().await;
    let t = replicated_table(&c, "reload_ttl").await;
    let primary = primary_port(&status(&p).await);

    c.batch_execute(&format!("INSERT INTO {t} VALUES (1)"))
        .await
        .unwrap();
    let (port, n) = served_by(&c, &t).await;
    assert_eq!(
        (port, n),
        (primary, 1),
        "a hot relation is read on the primary"
    );

    // TTL 0 turns recency forcing off: the relation still in the map stops forcing.
    write_config(
        &p.config_path,
        &text.replace("recent_access_ttl_ms = 60000", "recent_access_ttl_ms = 0"),
    );
    let edited = Instant::now();
    let mut served = primary;
    // The reload is expected well within a second (the time is printed and recorded in
    // the README's "Hot reload" section); the deadline here only bounds a broken reload, so a loaded
    // machine cannot make the test fail.
    while edited.elapsed() < Duration::from_secs(30) {
        served = served_by(&c, &t).await.0;
        if served != primary {
            break;
        }
        tokio::task::yield_now().await;
    }
    let took = edited.elapsed();
    assert_ne!(served, primary, "the new TTL never came into force");
    println!("file edit -> new TTL in force after {took:?}");
    let s = status(&p).await;
    assert_eq!(s["recent_access_ttl_ms"], 0);
    assert_eq!(s["ttl_source"], "file");

    // Back to a long TTL: a write followed by a read goes to the primary again.
    write_config(&p.config_path, &text);
    let edited = Instant::now();
    eventually("TTL back to 60000", Duration::from_secs(30), || {
        p.shared.recency.ttl_ms() == 60_000
    })
    .await;
    println!("second edit in force after {:?}", edited.elapsed());
    c.batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
        .await
        .unwrap();
    assert_eq!(served_by(&c, &t).await, (primary, 2));
    assert!(!c.is_closed(), "the session survived both reloads");
    assert_eq!(reload_count(&status(&p).await, "error"), 0);
}

#[tokio::test]
async fn invalid_edit_changes_nothing_and_is_counted() {
    let (p, text) = proxy_with_ttl(700);
    let before = status(&p).await;
    let metrics_before = http(p.admin, "GET", "/metrics", None, None).await.body;
    let errors_before = metric_sum(
        &metrics_before,
        "pgfresh_config_reloads_total",
        Some(("result", "error")),
    );

    // A valid change (time threshold) together with an invalid one (TTL above the cap):
    // the file is rejected whole.
    let bad = text
        .replace("recent_access_ttl_ms = 700", "recent_access_ttl_ms = 90000\nrecent_access_max_ttl_ms = 60000\ndelay_threshold_by_time = 1234");
    write_config(&p.config_path, &bad);
    let s = wait_status(&p, None, "the rejected reload to be counted", |s| {
        reload_count(s, "error") > reload_count(&before, "error")
    })
    .await;
    assert_eq!(s["recent_access_ttl_ms"], 700);
    let cfg = get_json(&p, "/v1/config", None).await;
    assert_eq!(cfg["routing"]["recent_access_ttl_ms"], 700);
    assert_ne!(cfg["routing"]["delay_threshold_by_time"], 1234);

    // A file that is not TOML at all is rejected too.
    write_config(&p.config_path, "[routing\nrecent_access_ttl_ms = ");
    let after_first = s.clone();
    let s = wait_status(&p, None, "the second rejected reload to be counted", |s| {
        reload_count(s, "error") > reload_count(&after_first, "error")
    })
    .await;
    assert_eq!(p.shared.recency.ttl_ms(), 700);
    assert_eq!(reload_count(&s, "ok"), reload_count(&before, "ok"));

    let metrics_after = http(p.admin, "GET", "/metrics", None, None).await.body;
    let errors_after = metric_sum(
        &metrics_after,
        "pgfresh_config_reloads_total",
        Some(("result", "error")),
    );
    assert!(
        errors_after >= errors_before + 2.0,
        "pgfresh_config_reloads_total{{result=\"error\"}} went {errors_before} -> {errors_after}"
    );

    // The proxy still serves, and a good file is taken again.
    let c = p.connect().await;
    c.simple_query("SELECT 1").await.unwrap();
    write_config(
        &p.config_path,
        &text.replace("recent_access_ttl_ms = 700", "recent_access_ttl_ms = 900"),
    );
    eventually("the good file applied", Duration::from_secs(30), || {
        p.shared.recency.ttl_ms() == 900
    })
    .await;
}

#[tokio::test]
async fn ttl_api_clamps_rejects_bad_bodies_and_requires_the_token() {
    let token = "op-token-42";
    let text = config_text("recent_access_ttl_ms = 1000\nrecent_access_max_ttl_ms = 5000")
        .replacen(
            "[proxy]\n",
            &format!("[proxy]\nadmin_token = \"{token}\"\n"),
            1,
        );
    let p = start_proxy(&text);
    let put = |body: &'static str, tok: Option<&'static str>| {
        http(
            p.admin,
            "PUT",
            "/v1/config/recent_access_ttl_ms",
            tok,
            Some(body),
        )
    };

    // Without (or with a wrong) bearer token: 401 for PUTs, status and config.
    assert_eq!(put(r#"{"value": 10}"#, None).await.status, 401);
    assert_eq!(put(r#"{"value": 10}"#, Some("nope")).await.status, 401);
    for path in ["/v1/status", "/v1/config"] {
        let r = http(p.admin, "GET", path, None, None).await;
        assert_eq!(r.status, 401, "{path}");
        assert!(r.json()["error"].is_string());
    }
    let lag = http(p.admin, "PUT", "/v1/lag", None, Some(r#"{"lag_ms": 1}"#)).await;
    assert_eq!(lag.status, 401);
    assert_eq!(p.shared.recency.ttl_ms(), 1000);
    // Metrics and the page stay open to scrapers.
    assert_eq!(
        http(p.admin, "GET", "/metrics", None, None).await.status,
        200
    );
    assert_eq!(http(p.admin, "GET", "/", None, None).await.status, 200);

    let r = put(r#"{"value": 250}"#, Some(token)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["recent_access_ttl_ms"], 250);
    assert_eq!(r.json()["clamped"], false);
    assert_eq!(p.shared.recency.ttl_ms(), 250);
    let s = get_json(&p, "/v1/status", Some(token)).await;
    assert_eq!(s["recent_access_ttl_ms"], 250);
    assert_eq!(s["ttl_source"], "api");
    assert!(s["ttl_set_at_ms"].as_u64().unwrap() > 1_600_000_000_000);

    let r = put(r#"{"value": 999999999}"#, Some(token)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["recent_access_ttl_ms"], 5000);
    assert_eq!(r.json()["clamped"], true);
    assert_eq!(p.shared.recency.ttl_ms(), 5000);

    for bad in [
        "not json",
        "{}",
        r#"{"value": -5}"#,
        r#"{"value": "10"}"#,
        r#"{"value": 1.5}"#,
        r#"[10]"#,
    ] {
        let r = put(bad, Some(token)).await;
        assert_eq!(r.status, 400, "body {bad}");
        assert!(r.json()["error"].is_string(), "body {bad}: {}", r.body);
    }
    assert_eq!(p.shared.recency.ttl_ms(), 5000, "bad bodies change nothing");
    let wrong_method = http(
        p.admin,
        "GET",
        "/v1/config/recent_access_ttl_ms",
        Some(token),
        None,
    )
    .await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(http(p.admin, "GET", "/nope", None, None).await.status, 404);

    // Precedence: a reload that does not touch the TTL keeps the API value...
    assert_eq!(put(r#"{"value": 777}"#, Some(token)).await.status, 200);
    let before = get_json(&p, "/v1/status", Some(token)).await;
    write_config(
        &p.config_path,
        &text.replace(
            "cold_start_ms = 0",
            "cold_start_ms = 0\ndelay_threshold_by_time = 4321",
        ),
    );
    let s = wait_status(&p, Some(token), "the reload", |s| {
        reload_count(s, "ok") > reload_count(&before, "ok")
    })
    .await;
    assert_eq!(s["recent_access_ttl_ms"], 777);
    assert_eq!(s["ttl_source"], "api");
    let cfg = get_json(&p, "/v1/config", Some(token)).await;
    assert_eq!(cfg["routing"]["delay_threshold_by_time"], 4321);
    assert_eq!(cfg["routing"]["recent_access_ttl_ms"], 777);
    // ...and one that changes it wins, as the most recent change.
    write_config(
        &p.config_path,
        &text
            .replace("recent_access_ttl_ms = 1000", "recent_access_ttl_ms = 1500")
            .replace(
                "cold_start_ms = 0",
                "cold_start_ms = 0\ndelay_threshold_by_time = 4321",
            ),
    );
    let s = wait_status(&p, Some(token), "the file TTL", |s| {
        s["recent_access_ttl_ms"] == 1500
    })
    .await;
    assert_eq!(s["ttl_source"], "file");
    assert_eq!(
        get_json(&p, "/v1/config", Some(token)).await["proxy"]["admin_token"],
        "<redacted>"
    );
}

#[tokio::test]
async fn ttl_api_changes_routing_of_the_next_read() {
    let (p, _) = proxy_with_ttl(60_000);
    let c = p.connect().await;
    let t = replicated_table(&c, "api_ttl").await;
    let primary = primary_port(&status(&p).await);
    c.batch_execute(&format!("INSERT INTO {t} VALUES (1)"))
        .await
        .unwrap();
    assert_eq!(served_by(&c, &t).await.0, primary);
    let r = http(
        p.admin,
        "PUT",
        "/v1/config/recent_access_ttl_ms",
        None,
        Some(r#"{"value": 0}"#),
    )
    .await;
    assert_eq!(r.status, 200);
    // Applied before the reply: the very next read of the still-tracked relation leaves the primary.
    assert_ne!(served_by(&c, &t).await.0, primary);
    let r = http(
        p.admin,
        "PUT",
        "/v1/config/recent_access_ttl_ms",
        None,
        Some(r#"{"value": 60000}"#),
    )
    .await;
    assert_eq!(r.status, 200);
    c.batch_execute(&format!("INSERT INTO {t} VALUES (2)"))
        .await
        .unwrap();
    assert_eq!(served_by(&c, &t).await, (primary, 2));
}

#[tokio::test]
async fn status_reports_nodes_ttl_hot_relations_and_routing_counters() {
    // A TTL long enough that the write is still hot when the status is read.
    let (p, _) = proxy_with_ttl(60_000);
    let p = &p;
    let c = p.connect().await;
    let t = unique("status_hot");
    c.batch_execute(&format!(
        "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1)"
    ))
    .await
    .unwrap();
    c.simple_query(&format!("SELECT count(*) FROM {t}"))
        .await
        .unwrap();
    c.simple_query("SELECT 1").await.unwrap();

    let s = status(p).await;
    let nodes = s["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    let primaries: Vec<_> = nodes.iter().filter(|n| n["role"] == "primary").collect();
    assert_eq!(primaries.len(), 1);
    assert_eq!(s["primary"], primaries[0]["name"]);
    assert_eq!(primaries[0]["in_pool"], false);
    assert_eq!(primaries[0]["not_in_pool_reason"], "not_standby");
    assert!(primaries[0]["current_lsn"].is_string());
    for n in nodes.iter().filter(|n| n["role"] == "standby") {
        assert_eq!(n["healthy"], true, "{n}");
        assert!(
            n["replay_lsn"].as_str().is_some_and(|l| l.contains('/')),
            "{n}"
        );
        assert!(n["lag_bytes"].is_u64(), "{n}");
        assert!(n["lag_ms"].is_u64(), "{n}");
        assert!(n["in_pool"].is_boolean());
    }
    assert_eq!(s["recent_access_ttl_ms"], 60_000);
    assert_eq!(s["ttl_source"], "file");
    assert!(s["ttl_set_at_ms"].is_u64());
    assert!(s["hot_relation_count"].as_u64().unwrap() >= 1);
    assert!(
        s["hot_relations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["relation"].as_str().is_some_and(|r| r.ends_with(&t))),
        "{t} among the hot relations: {}",
        s["hot_relations"]
    );
    let routing = &s["routing"];
    assert!(routing["total"].as_u64().unwrap() >= 3, "{routing}");
    assert!(
        routing["forced_by_recency"].as_u64().unwrap() >= 1,
        "{routing}"
    );
    let by = routing["by_reason"].as_array().unwrap();
    assert!(by
        .iter()
        .any(|r| r["target"] == "primary" && r["reason"] == "write"));
    assert!(by.iter().any(|r| r["reason"] == "hot_relation"));
    assert!(routing["reads"].as_u64().unwrap() >= routing["replica"].as_u64().unwrap());
}

#[tokio::test]
async fn config_endpoint_redacts_secrets() {
    let p = proxy();
    let r = http(p.admin, "GET", "/v1/config", None, None).await;
    assert_eq!(r.status, 200);
    for secret in [
        APP_PASSWORD,
        "admin-pass",
        "md5-pass",
        cluster().superuser().1,
    ] {
        assert!(!r.body.contains(secret), "secret {secret:?} leaked");
    }
    let cfg = r.json();
    assert_eq!(cfg["routing"]["recent_access_ttl_ms"], 1000);
    assert_eq!(cfg["monitor"]["password"], "<redacted>");
    let users = cfg["users"].as_array().unwrap();
    let app = users.iter().find(|u| u["name"] == "app").unwrap();
    assert_eq!(app["password"], "<redacted>");
    assert_eq!(cfg["nodes"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn pushed_lag_takes_replicas_out_of_the_read_pool() {
    // TTL 0: no read is forced to the primary by the table's recent creation.
    let p = start_proxy(&config_text(
        "delay_threshold_by_time = 2000\nrecent_access_ttl_ms = 0",
    ));
    let c = p.connect().await;
    let t = replicated_table(&c, "lag_push").await;
    let s = status(&p).await;
    let primary = primary_port(&s);
    let standby = |name: &str| {
        s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap()["port"]
            .as_u64()
            .unwrap() as u16
    };
    let pg2 = standby("pg2");

    for bad in [
        r#"{}"#,
        r#"{"lag_ms": "x"}"#,
        r#"{"lag_ms": 5, "node": "nope"}"#,
        r#"{"lag_ms": 5, "node": 3}"#,
        "]",
    ] {
        let r = http(p.admin, "PUT", "/v1/lag", None, Some(bad)).await;
        assert_eq!(r.status, 400, "{bad}");
        assert!(r.json()["error"].is_string());
    }

    let push = |body: &'static str| http(p.admin, "PUT", "/v1/lag", None, Some(body));
    let r = push(r#"{"lag_ms": 600000, "node": "pg1", "source": "aurora"}"#).await;
    assert_eq!(r.status, 200, "{}", r.body);
    eventually("pg1 out of the read pool", Duration::from_secs(30), || {
        let v = p.shared.balancer.view();
        !v.nodes[1].eligible && v.nodes[2].eligible
    })
    .await;
    let s = status(&p).await;
    let n1 = &s["nodes"][1];
    assert_eq!(n1["in_pool"], false);
    assert_eq!(n1["not_in_pool_reason"], "lagging_time");
    assert_eq!(n1["external_lag"]["source"], "aurora");
    assert!(n1["lag_ms"].as_u64().unwrap() >= 600_000);
    for _ in 0..10 {
        assert_eq!(
            served_by(&c, &t).await.0,
            pg2,
            "reads avoid the lagging pg1"
        );
    }

    // A pool-wide lag: no replica is eligible, reads fall back to the primary (counted).
    let fallbacks = |s: &Value| -> u64 {
        s["routing"]["primary_fallbacks"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
    };
    let before = fallbacks(&status(&p).await);
    assert_eq!(push(r#"{"lag_ms": 600000}"#).await.status, 200);
    eventually("no replica eligible", Duration::from_secs(30), || {
        p.shared.balancer.view().eligible().count() == 0
    })
    .await;
    assert!(status(&p).await["pool_external_lag"]["lag_ms"] == 600_000);
    assert_eq!(served_by(&c, &t).await.0, primary);
    assert!(fallbacks(&status(&p).await) > before);
}

#[tokio::test]
async fn metrics_endpoint_exposes_the_pgfresh_series() {
    // A TTL long enough that the read below is forced by the write, however loaded the machine.
    let (p, _) = proxy_with_ttl(60_000);
    let p = &p;
    let c = p.connect().await;
    let t = unique("metrics");
    c.batch_execute(&format!(
        "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1)"
    ))
    .await
    .unwrap();
    c.simple_query(&format!("SELECT * FROM {t}")).await.unwrap();
    c.simple_query("SELECT 1").await.unwrap();
    let text = http(p.admin, "GET", "/metrics", None, None).await.body;
    let expected = [
        "pgfresh_routed_total",
        "pgfresh_replica_lag_bytes",
        "pgfresh_replica_lag_seconds",
        "pgfresh_replica_max_lag_bytes",
        "pgfresh_replica_max_lag_seconds",
        "pgfresh_replica_eligible",
        "pgfresh_hot_relations",
        "pgfresh_recent_access_ttl_ms",
        "pgfresh_client_connections",
        "pgfresh_server_connections",
        "pgfresh_server_connections_opened_total",
        "pgfresh_parse_cache_hits_total",
        "pgfresh_parse_cache_misses_total",
        "pgfresh_recency_marks_total",
    ];
    let missing: Vec<_> = expected
        .iter()
        .filter(|m| samples(&text, m).is_empty())
        .collect();
    assert!(missing.is_empty(), "missing series {missing:?} in:\n{text}");
    assert!(metric_sum(&text, "pgfresh_routed_total", Some(("reason", "write"))) >= 1.0);
    assert!(
        metric_sum(
            &text,
            "pgfresh_routed_total",
            Some(("reason", "hot_relation"))
        ) >= 1.0
    );
    assert!(metric_sum(&text, "pgfresh_parse_cache_misses_total", None) >= 1.0);
    assert!(
        metric_sum(
            &text,
            "pgfresh_recency_forced_total",
            Some(("relation", t.as_str()))
        ) >= 1.0,
        "the read forced by the write is counted under its relation"
    );
    let eligible = samples(&text, "pgfresh_replica_eligible");
    assert!(
        eligible.len() >= 2,
        "one eligibility series per replica: {eligible:?}"
    );
    assert!(text.contains("# TYPE pgfresh_routed_total counter"));
}

#[tokio::test]
async fn admin_console_works_from_psql() {
    // A TTL long enough that the write below is still hot when SHOW HOT runs, however
    // loaded the machine is.
    let (p, text) = proxy_with_ttl(60000);
    let c = p.connect().await;
    let t = unique("console_hot");
    c.batch_execute(&format!(
        "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1)"
    ))
    .await
    .unwrap();
    c.simple_query(&format!("SELECT * FROM {t}")).await.unwrap();

    let (nodes, _) = console_ok(&p, "SHOW NODES");
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert_eq!(nodes.iter().filter(|r| r[2] == "primary").count(), 1);
    assert_eq!(nodes.iter().filter(|r| r[2] == "standby").count(), 2);
    assert!(
        nodes
            .iter()
            .filter(|r| r[2] == "standby")
            .all(|r| r[10] == "in"),
        "{nodes:?}"
    );

    let (pools, _) = console_ok(&p, "SHOW POOLS");
    // PgBouncer's column names first, for its dashboards and exporters.
    let (admin_client, conn) = tokio_postgres::connect(
        &p.conninfo("admin", "admin-pass", "pgfresh"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("console login");
    tokio::spawn(conn);
    for (command, first) in [
        (
            "SHOW POOLS",
            &[
                "database",
                "user",
                "cl_active",
                "cl_waiting",
                "sv_active",
                "sv_idle",
            ][..],
        ),
        (
            "SHOW CLIENTS",
            &["type", "user", "database", "state", "addr", "port"][..],
        ),
        (
            "SHOW SERVERS",
            &["type", "user", "database", "state", "addr", "port"][..],
        ),
    ] {
        let names: Vec<String> = admin_client
            .simple_query(command)
            .await
            .expect(command)
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::RowDescription(cols) => {
                    Some(cols.iter().map(|c| c.name().to_string()).collect())
                }
                _ => None,
            })
            .expect("a row description");
        assert_eq!(&names[..first.len()], first, "{command}");
    }
    assert!(
        pools
            .iter()
            .any(|r| r[0] == "app" && r[1] == "app" && r[4] != "0" && r[11] == "session"),
        "the open session holds a connection: {pools:?}"
    );

    let (clients, _) = console_ok(&p, "SHOW CLIENTS");
    // This psql session is not a proxied client; the open application session is.
    assert!(
        clients
            .iter()
            .any(|r| r[0] == "C" && r[1] == "app" && r[2] == "app" && r[3] == "active"),
        "{clients:?}"
    );
    let stat = |rows: &[Vec<String>], k: &str| -> String {
        rows.iter()
            .find(|r| r[0] == k)
            .map(|r| r[1].clone())
            .unwrap_or_else(|| panic!("{k} in {rows:?}"))
    };
    let (servers, _) = console_ok(&p, "SHOW SERVERS");
    assert!(
        servers
            .iter()
            .any(|r| r[0] == "S" && r[3] == "active" && r[7].parse::<i32>().is_ok()),
        "{servers:?}"
    );

    let (hot, _) = console_ok(&p, "SHOW HOT");
    let row = hot
        .iter()
        .find(|r| r[1].ends_with(&t))
        .expect("hot relation listed");
    assert_eq!(row[0], "app");
    assert!(row[2].parse::<u64>().is_ok() && row[3].parse::<u64>().unwrap() >= 1);
    assert!(
        row[4].parse::<u64>().unwrap() >= 1,
        "the read was forced: {row:?}"
    );

    let (config, _) = console_ok(&p, "SHOW CONFIG");
    let ttl = config
        .iter()
        .find(|r| r[0] == "routing.recent_access_ttl_ms")
        .unwrap();
    assert_eq!((ttl[1].as_str(), ttl[2].as_str()), ("60000", "live"));
    let listen = config.iter().find(|r| r[0] == "proxy.listen").unwrap();
    assert_eq!(listen[2], "restart");
    assert!(!config.iter().any(|r| r[1].contains("admin-pass")));

    let (stats, _) = console_ok(&p, "SHOW STATS");
    assert!(
        // Two routed units here (the write batch and the read); counters are per process.
        stat(&stats, "routed_total").parse::<u64>().unwrap() >= 2,
        "{stats:?}"
    );
    assert!(stat(&stats, "routed.primary.write").parse::<u64>().unwrap() >= 1);

    let (_, notices) = console_ok(&p, "SET recent_access_ttl_ms = 4321");
    assert!(notices.contains("60000 -> 4321"), "{notices}");
    assert_eq!(p.shared.recency.ttl_ms(), 4321);
    let (_, notices) = console_ok(&p, "set recent_access_ttl_ms to 99999999;");
    assert!(notices.contains("clamped"), "{notices}");
    assert_eq!(p.shared.recency.ttl_ms(), 60_000);

    // RELOAD applies a changed file and names the keys.
    std::fs::write(
        &p.config_path,
        text.replace(
            "recent_access_ttl_ms = 60000",
            "recent_access_ttl_ms = 1200",
        ),
    )
    .unwrap();
    // The file watch may have taken the edit already; either way, once RELOAD has
    // answered, the new value is the config in force.
    let (_, notices) = console_ok(&p, "RELOAD");
    assert!(
        notices.contains("applied: routing.recent_access_ttl_ms")
            || notices.contains("config file unchanged"),
        "{notices}"
    );
    assert_eq!(
        p.shared.config.snapshot().routing.recent_access_ttl_ms,
        1200
    );
    eventually("TTL 1200 in force", Duration::from_secs(30), || {
        p.shared.recency.ttl_ms() == 1200
    })
    .await;
    // An invalid file: RELOAD fails and nothing changes.
    std::fs::write(&p.config_path, "this is not toml =").unwrap();
    let (ok, _, err) = console(&p, "admin", "admin-pass", &["RELOAD"]);
    assert!(!ok && err.contains("reload rejected"), "{err}");
    assert_eq!(p.shared.recency.ttl_ms(), 1200);

    let (ok, _, err) = console(&p, "admin", "admin-pass", &["SHOW NONSENSE"]);
    assert!(!ok && err.contains("unknown console command"), "{err}");
    let (ok, _, err) = console(
        &p,
        "admin",
        "admin-pass",
        &["SET recent_access_ttl_ms = lots"],
    );
    assert!(!ok && err.contains("usage"), "{err}");
    let (ok, _, err) = console(&p, "app", APP_PASSWORD, &["SHOW NODES"]);
    assert!(
        !ok && err.contains("may not open the admin console"),
        "{err}"
    );
}

/// The text of `s` between the first `start` and the next `end` (empty when absent).
fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    s.split_once(start)
        .and_then(|(_, rest)| rest.split_once(end))
        .map_or("", |(x, _)| x)
}

#[tokio::test]
async fn status_page_renders_the_node_table_in_headless_chromium() {
    let chromium = Path::new("/usr/bin/chromium");
    if !chromium.exists() {
        println!("SKIPPED status_page_renders_the_node_table_in_headless_chromium: /usr/bin/chromium is missing (apt-get install -y chromium)");
        return;
    }
    let p = proxy();
    let profile = tempfile::tempdir().expect("profile dir");
    let page = http(p.admin, "GET", "/", None, None).await;
    assert_eq!(page.status, 200);
    for external in ["src=", "href=", "@import", "url(", "http://", "https://"] {
        assert!(
            !page.body.contains(external),
            "the page must be self-contained ({external})"
        );
    }

    // coreutils `timeout` bounds a hung browser.
    let out = Command::new("timeout")
        .arg("120")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
        ])
        .args(["--no-first-run", "--disable-background-networking"])
        .args([
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args([
            "--virtual-time-budget=5000",
            "--dump-dom",
            &p.admin_url("/"),
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium failed: {:?}", out.status);
    let dom = String::from_utf8_lossy(&out.stdout);
    let table = between(&dom, "id=\"nodes\"", "</table>");
    let rows: Vec<(&str, &str)> = table
        .split("<tr data-node=\"")
        .skip(1)
        .map(|r| {
            (
                r.split('"').next().unwrap_or(""),
                between(r, "data-role=\"", "\""),
            )
        })
        .collect();
    let view = p.shared.balancer.view();
    let expected: Vec<(&str, &str)> = view
        .nodes
        .iter()
        .map(|n| (n.spec.name.as_str(), n.role.as_str()))
        .collect();
    assert_eq!(rows, expected, "rendered node rows:\n{dom}");
    let primary = view
        .primary
        .map(|i| view.nodes[i].spec.name.clone())
        .expect("a primary");
    let summary = between(&dom, "<p id=\"summary\">", "</p>");
    assert!(
        summary.starts_with(&format!("primary: {primary}")),
        "{summary}"
    );
    assert!(
        dom.contains("<div class=\"v\" id=\"ttl\">1000</div>"),
        "{dom}"
    );
}

#[tokio::test]
async fn grafana_dashboard_plots_series_the_proxy_exports() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/pgfresh-dashboard.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard file"))
            .expect("dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let titles: Vec<&str> = panels.iter().filter_map(|p| p["title"].as_str()).collect();
    for wanted in [
        "Replica lag (time) per replica",
        "Offload ratio",
        "Primary fallback rate",
        "Reads forced to the primary by recency",
    ] {
        assert!(titles.contains(&wanted), "{wanted} in {titles:?}");
    }
    let exprs: Vec<&str> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    let offload = exprs
        .iter()
        .find(|e| e.contains("target=\"replica\"") && e.contains(" / "))
        .expect("an offload-ratio expression");
    assert!(offload.contains("pgfresh_routed_total"));

    // Every series the dashboard plots is one the proxy exports. Two appear with their
    // first event only (a fallback, a reload); every other one must be present now.
    let p = proxy();
    let c = p.connect().await;
    c.simple_query("SELECT 1").await.unwrap();
    let text = http(p.admin, "GET", "/metrics", None, None).await.body;
    let on_first_event = [
        "pgfresh_primary_fallbacks_total",
        "pgfresh_config_reloads_total",
    ];
    let mut names: Vec<&str> = exprs
        .iter()
        .flat_map(|e| e.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_')))
        .filter(|w| w.starts_with("pgfresh_"))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        if on_first_event.contains(&name) {
            continue;
        }
        assert!(
            !samples(&text, name).is_empty(),
            "dashboard series {name} is not exported"
        );
    }
}
