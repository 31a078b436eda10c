use std::time::{Duration, Instant};

use pgfresh_config::*;

const MINIMAL: &str = r#"
[[nodes]]
name = "pg0"
host = "127.0.0.1"
port = 5432
"#;

fn with(extra: &str) -> String {
    format!("{MINIMAL}\n{extra}")
}

#[test]
fn minimal_file_gets_defaults() {
    let c = parse_str(MINIMAL).unwrap();
    assert_eq!(c.proxy.listen, "127.0.0.1:6432");
    assert_eq!(c.routing.recent_access_ttl_ms, 1000);
    assert_eq!(c.routing.recent_access_max_ttl_ms, 60000);
    assert_eq!(c.nodes[0].weight, 1);
    assert!(c.routing.enable_query_parser);
    assert!(!c.routing.resolve_lost_commits, "off unless asked for");
    assert_eq!(c.pool.pool_mode, PoolMode::Session);
    assert_eq!(c.tls.client_mode(), ClientTlsMode::Disable);
    let c = parse_str(&with(
        "[tls]\nclient_tls_cert_file = \"c\"\nclient_tls_key_file = \"k\"\n",
    ))
    .unwrap();
    assert_eq!(
        c.tls.client_mode(),
        ClientTlsMode::Prefer,
        "prefer once a certificate is set"
    );
    let c = parse_str(&with(
        "[proxy]\nadmin_listen = \"0.0.0.0:9930\"\nadmin_token = \"t\"\n",
    ))
    .unwrap();
    assert_eq!(
        c.proxy.admin_listen, "0.0.0.0:9930",
        "a token opens other addresses"
    );
}

#[test]
fn the_io_engine_is_the_ring_where_one_thread_serves_every_client() {
    let c = parse_str(MINIMAL).unwrap();
    assert_eq!(c.proxy.io_engine, IoEngine::Auto);
    assert!(c.proxy.io_engine.wants_ring(c.proxy.worker_threads));
    // A work-stealing runtime spreads the sessions over its threads; one ring would not.
    assert!(!IoEngine::Auto.wants_ring(4));
    assert!(IoEngine::IoUring.wants_ring(4));
    assert!(!IoEngine::Epoll.wants_ring(0));
    for (text, engine) in [
        ("auto", IoEngine::Auto),
        ("epoll", IoEngine::Epoll),
        ("io_uring", IoEngine::IoUring),
    ] {
        let c = parse_str(&with(&format!("[proxy]\nio_engine = \"{text}\"\n"))).unwrap();
        assert_eq!(c.proxy.io_engine, engine);
        assert_eq!(engine.as_str(), text);
    }
    let err = parse_str(&with("[proxy]\nio_engine = \"uring\"\n")).unwrap_err();
    assert!(err.to_string().contains("io_engine"), "{err}");
}

#[test]
fn shipped_example_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conf/pgfresh.toml");
    let c = load_file(std::path::Path::new(path)).unwrap();
    assert_eq!(c.nodes.len(), 3);
}

#[test]
fn unknown_key_is_named() {
    let err = parse_str(&with("[routing]\nrecent_acess_ttl_ms = 5\n")).unwrap_err();
    assert!(err.to_string().contains("recent_acess_ttl_ms"), "{err}");
    let err = parse_str(&with("[bogus]\nx = 1\n")).unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
}

#[test]
fn invalid_values_are_named() {
    let cases = [
        (
            "[routing]\nrecent_access_ttl_ms = 70000\n",
            "routing.recent_access_ttl_ms",
        ),
        ("[proxy]\nlisten = \"nope\"\n", "proxy.listen"),
        ("[pool]\npool_size = 0\n", "pool.pool_size"),
        (
            "[monitor]\nsr_check_period_ms = 5\n",
            "monitor.sr_check_period_ms",
        ),
        (
            "[monitor]\nreplay_check_period_ms = 500\n",
            "monitor.replay_check_period_ms",
        ),
        ("[[users]]\nname = \"a\"\n", "users[0].password"),
        (
            "[[nodes]]\nname = \"pg0\"\nhost = \"h\"\nport = 1\n",
            "nodes[1].name",
        ),
        (
            "[routing]\ndependency_check_ms = 5\n",
            "routing.dependency_check_ms",
        ),
        (
            "[routing]\ndependency_notify_channel = \"0123456789012345678901234567890123456789012345678901234567890123\"\n",
            "routing.dependency_notify_channel",
        ),
        (
            "[routing]\nnever_track = [\"a.b.c\"]\n",
            "routing.never_track",
        ),
        (
            "[[users]]\nname = \"a\"\npassword = \"SCRAM-SHA-256$4096:c2FsdA==$a:b\"\nserver_user = \"b\"\n",
            "users[0].server_password",
        ),
        ("[pool]\nmax_prepared_statements = 0\n", "pool.max_prepared_statements"),
        (
            "[pool]\npool_mode = \"statement\"\n",
            "pool_mode",
        ),
        (
            "[tls]\nclient_tls_sslmode = \"require\"\n",
            "tls.client_tls_sslmode",
        ),
        (
            "[tls]\nclient_tls_sslmode = \"verify-ca\"\nclient_tls_cert_file = \"c\"\nclient_tls_key_file = \"k\"\n",
            "tls.client_tls_ca_file",
        ),
        (
            "[proxy]\nadmin_listen = \"0.0.0.0:9930\"\n",
            "proxy.admin_listen",
        ),
        ("[auth]\nauth_user = \"nobody\"\n", "auth.auth_user"),
        (
            "[tls]\nserver_tls_sslmode = \"verify-full\"\n",
            "nodes.pg0.server_tls_ca_file",
        ),
        (
            "[tls]\nserver_tls_cert_file = \"c\"\n",
            "nodes.pg0.server_tls_cert_file",
        ),
        (
            "[tls]\nserver_tls_sslmode = \"verify-ca\"\nserver_tls_ca_file = \"/nonexistent/ca.pem\"\n",
            "nodes.pg0.server_tls_ca_file",
        ),
    ];
    for (extra, key) in cases {
        let err = parse_str(&with(extra)).unwrap_err();
        assert!(err.to_string().contains(key), "{extra:?}: {err}");
    }
    assert!(parse_str("").unwrap_err().to_string().contains("nodes"));
    assert!(parse_str("[proxy\n").is_err());
}

#[test]
fn reload_classes() {
    assert_eq!(
        reload_class("routing.recent_access_ttl_ms"),
        ReloadClass::Live
    );
    assert_eq!(reload_class("routing.delay_threshold"), ReloadClass::Live);
    assert_eq!(
        reload_class("routing.resolve_lost_commits"),
        ReloadClass::Live
    );
    assert_eq!(reload_class("nodes[0].weight"), ReloadClass::Live);
    assert_eq!(reload_class("nodes[0].port"), ReloadClass::Live);
    assert_eq!(reload_class("nodes"), ReloadClass::Live);
    assert_eq!(reload_class("proxy.listen"), ReloadClass::Restart);
    assert_eq!(reload_class("pool.pool_size"), ReloadClass::Restart);
    assert_eq!(
        reload_class("routing.parse_cache_bytes"),
        ReloadClass::Restart
    );
    assert_eq!(reload_class("something.new"), ReloadClass::Restart);
}

#[test]
fn diff_reports_leaf_keys() {
    let a = parse_str(MINIMAL).unwrap();
    let b = parse_str(&with(
        "[routing]\nrecent_access_ttl_ms = 250\n[proxy]\nlisten = \"127.0.0.1:7000\"\n",
    ))
    .unwrap();
    let d = diff(&a, &b);
    let keys: Vec<_> = d.iter().map(|k| (k.key.as_str(), k.class)).collect();
    assert!(
        keys.contains(&("routing.recent_access_ttl_ms", ReloadClass::Live)),
        "{keys:?}"
    );
    assert!(
        keys.contains(&("proxy.listen", ReloadClass::Restart)),
        "{keys:?}"
    );
    assert_eq!(keys.len(), 2);
}

#[test]
fn redaction_hides_secrets() {
    let c = parse_str(&with(
        "[proxy]\nadmin_token = \"t0k\"\n[[users]]\nname = \"a\"\npassword = \"pw\"\n",
    ))
    .unwrap();
    let text = serde_json::to_string(&redacted(&c)).unwrap();
    assert!(!text.contains("t0k") && !text.contains("\"pw\""), "{text}");
}

fn write(path: &std::path::Path, text: &str) {
    // Write-then-rename, as editors and config managers do.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn reload_is_all_or_nothing_and_keeps_restart_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgfresh.toml");
    write(&path, MINIMAL);
    let h = ConfigHandle::open(&path).unwrap();

    write(
        &path,
        &with("[routing]\nrecent_access_ttl_ms = 300\n[proxy]\nlisten = \"127.0.0.1:7001\"\n"),
    );
    let out = h.reload().unwrap();
    assert_eq!(h.snapshot().routing.recent_access_ttl_ms, 300);
    assert_eq!(
        h.snapshot().proxy.listen,
        "127.0.0.1:6432",
        "restart-only key must not change live"
    );
    assert_eq!(out.pending_restart.len(), 1);

    write(&path, &with("[routing]\nrecent_access_ttl_ms = \"soon\"\n"));
    assert!(h.reload().is_err());
    assert_eq!(h.snapshot().routing.recent_access_ttl_ms, 300);
    assert_eq!(h.reload_counts(), (1, 1));
}

#[test]
fn api_value_survives_unrelated_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgfresh.toml");
    write(&path, MINIMAL);
    let h = ConfigHandle::open(&path).unwrap();
    h.update(|c| c.routing.recent_access_ttl_ms = 350);
    write(&path, &with("[routing]\ndelay_threshold = 1024\n"));
    h.reload().unwrap();
    let s = h.snapshot();
    assert_eq!(s.routing.recent_access_ttl_ms, 350);
    assert_eq!(s.routing.delay_threshold, Some(1024));
    // A file change of the TTL itself wins over the pushed value.
    write(
        &path,
        &with("[routing]\ndelay_threshold = 1024\nrecent_access_ttl_ms = 900\n"),
    );
    h.reload().unwrap();
    assert_eq!(h.snapshot().routing.recent_access_ttl_ms, 900);
}

#[test]
fn file_watch_fires_on_edit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgfresh.toml");
    write(&path, MINIMAL);
    let (tx, rx) = std::sync::mpsc::channel();
    let _w = FileWatch::start(&path, Duration::from_millis(50), move || {
        let _ = tx.send(());
    })
    .unwrap();
    write(&path, &with("[routing]\nrecent_access_ttl_ms = 10\n"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut fired = false;
    while Instant::now() < deadline {
        if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            fired = true;
            break;
        }
    }
    assert!(fired, "file watch did not report the edit");
}

#[test]
fn nodes_reload_live() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgfresh.toml");
    let two = |w: u32, port: u16| {
        format!("[[nodes]]\nname = \"a\"\nhost = \"h\"\nport = 1\n\n[[nodes]]\nname = \"b\"\nhost = \"h\"\nport = {port}\nweight = {w}\n")
    };
    write(&path, &two(1, 2));
    let h = ConfigHandle::open(&path).unwrap();
    write(&path, &two(5, 3));
    h.reload().unwrap();
    let s = h.snapshot();
    assert_eq!((s.nodes[1].weight, s.nodes[1].port), (5, 3));
    write(
        &path,
        &format!(
            "{}\n[[nodes]]\nname = \"c\"\nhost = \"h\"\nport = 9\n",
            two(5, 3)
        ),
    );
    let out = h.reload().unwrap();
    assert_eq!(h.snapshot().nodes.len(), 3);
    assert!(out.applied.iter().any(|k| k.key == "nodes"), "{out:?}");
}

#[test]
fn dependency_keys_default_and_validate() {
    let c = parse_str(MINIMAL).unwrap();
    assert!(c.routing.learn_dependencies);
    assert!(c.routing.relation_dependencies.is_empty());

    let c = parse_str(&with(
        "[routing]\nlearn_dependencies = false\nrelation_dependencies = [\n  \"orders -> order_totals, audit_log\",\n  \"place_order() -> orders, ledger\",\n  'app.\"Weird\" -> \"x,y\"',\n]\n",
    ))
    .unwrap();
    assert!(!c.routing.learn_dependencies);
    assert_eq!(c.routing.relation_dependencies.len(), 3);

    // A bad rule rejects the file, naming the key and the rule.
    for (rules, rule) in [
        ("[\"orders -> a\", \"orders\"]", "\"orders\""),
        ("[\"f(int) -> a\"]", "f(int)"),
        ("[\"a -> b,\"]", "a -> b,"),
        ("[\"a -> a\"]", "a -> a"),
        ("[\"a -> b -> c\"]", "a -> b -> c"),
    ] {
        let err = parse_str(&with(&format!(
            "[routing]\nrelation_dependencies = {rules}\n"
        )))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("routing.relation_dependencies"),
            "{rules}: {err}"
        );
        assert!(err.contains(rule), "{rules}: {err}");
    }
}

#[test]
fn dependency_keys_reload_live_and_bad_rules_change_nothing() {
    assert_eq!(
        reload_class("routing.learn_dependencies"),
        ReloadClass::Live
    );
    assert_eq!(
        reload_class("routing.relation_dependencies"),
        ReloadClass::Live
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgfresh.toml");
    write(&path, MINIMAL);
    let h = ConfigHandle::open(&path).unwrap();

    write(
        &path,
        &with("[routing]\nlearn_dependencies = false\nrelation_dependencies = [\"orders -> audit_log\"]\n"),
    );
    let out = h.reload().unwrap();
    let keys: Vec<_> = out.applied.iter().map(|k| k.key.as_str()).collect();
    assert!(keys.contains(&"routing.learn_dependencies"), "{keys:?}");
    assert!(keys.contains(&"routing.relation_dependencies"), "{keys:?}");
    assert!(out.pending_restart.is_empty(), "{out:?}");
    assert!(!h.snapshot().routing.learn_dependencies);

    // One bad rule among good ones: the whole file is rejected, the old rules stay.
    write(
        &path,
        &with("[routing]\nrelation_dependencies = [\"orders -> audit_log, ledger\", \"nonsense\"]\nrecent_access_ttl_ms = 5\n"),
    );
    let err = h.reload().unwrap_err().to_string();
    assert!(
        err.contains("routing.relation_dependencies[1]") && err.contains("nonsense"),
        "{err}"
    );
    let s = h.snapshot();
    assert_eq!(s.routing.relation_dependencies, vec!["orders -> audit_log"]);
    assert_eq!(s.routing.recent_access_ttl_ms, 1000);

    // `pgfresh check` and SHOW CONFIG list both keys.
    let described = describe(&s);
    for key in [
        "routing.learn_dependencies",
        "routing.relation_dependencies",
    ] {
        let (_, _, class) = described.iter().find(|(k, _, _)| k == key).expect(key);
        assert_eq!(*class, ReloadClass::Live);
    }
}

#[test]
fn server_tls_is_set_globally_and_per_node() {
    let c = parse_str(MINIMAL).unwrap();
    assert_eq!(
        c.nodes[0].server_tls(&c.tls).mode,
        ServerTlsMode::Prefer,
        "prefer by default, as PgBouncer"
    );
    let ca = std::env::temp_dir().join(format!("pgfresh-config-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, "a CA").unwrap();
    let text = format!(
        "[tls]\nserver_tls_sslmode = \"require\"\n\n{MINIMAL}\n[[nodes]]\nname = \"pg1\"\nhost = \"db1\"\nport = 5432\nserver_tls_sslmode = \"verify-full\"\nserver_tls_ca_file = \"{}\"\n",
        ca.display()
    );
    let c = parse_str(&text).unwrap();
    let global = c.nodes[0].server_tls(&c.tls);
    assert_eq!(global.mode, ServerTlsMode::Require);
    assert_eq!(global.ca_file, "");
    let own = c.nodes[1].server_tls(&c.tls);
    assert_eq!(own.mode, ServerTlsMode::VerifyFull);
    assert_eq!(own.ca_file, ca.display().to_string());
    // A node asking for verify-full without a CA anywhere is refused by name.
    let err = parse_str(&text.replace(&format!("server_tls_ca_file = \"{}\"\n", ca.display()), ""))
        .unwrap_err();
    assert!(
        err.to_string().contains("nodes.pg1.server_tls_ca_file"),
        "{err}"
    );
    let _ = std::fs::remove_file(&ca);
}
