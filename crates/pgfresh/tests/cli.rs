//! The `pgfresh` command line: check and explain (no cluster needed).

use std::process::Command;

fn pgfresh(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pgfresh"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("run pgfresh");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn check_prints_effective_config_with_reload_classes() {
    let (ok, text) = pgfresh(&["check", "-c", "conf/pgfresh.toml"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("routing.recent_access_ttl_ms = 1000    # live"),
        "{text}"
    );
    assert!(
        text.contains("proxy.listen = \"127.0.0.1:6432\"    # restart"),
        "{text}"
    );
    assert!(
        !text.contains("\"secret\""),
        "passwords must be redacted: {text}"
    );
    assert!(
        text.contains("routing.learn_dependencies = true    # live"),
        "{text}"
    );
    assert!(
        text.contains("routing.relation_dependencies = []    # live"),
        "{text}"
    );
}

#[test]
fn check_rejects_a_bad_dependency_rule_naming_key_and_rule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[routing]\nrelation_dependencies = [\"orders -> totals\", \"place_order(int) -> x\"]\n[[nodes]]\nname='a'\nhost='h'\nport=1\n",
    )
    .unwrap();
    let (ok, text) = pgfresh(&["check", "-c", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        text.contains("routing.relation_dependencies[1]") && text.contains("place_order(int) -> x"),
        "{text}"
    );
}

#[test]
fn check_rejects_a_bad_file_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[routing]\nrecent_acces_ttl_ms = 5\n[[nodes]]\nname='a'\nhost='h'\nport=1\n",
    )
    .unwrap();
    let (ok, text) = pgfresh(&["check", "-c", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(text.contains("recent_acces_ttl_ms"), "{text}");
}

#[test]
fn explain_shows_analysis_and_decision() {
    let cases = [
        (
            "SELECT * FROM orders o JOIN app.items i ON i.id = o.item",
            "replica",
            "reads:        orders, app.items",
        ),
        (
            "WITH u AS (UPDATE t SET a = 1 RETURNING *) SELECT * FROM u",
            "primary",
            "writes:       t",
        ),
        (
            "SELECT * FROM t FOR NO KEY UPDATE",
            "primary",
            "locking_clause",
        ),
        ("SELEC 1", "primary", "unclassified"),
        ("SELECT nextval('s')", "primary", "must_primary"),
        // Hints count in any comment, also in sqlcommenter form.
        (
            "SELECT * FROM t /* pgfresh:primary */",
            "primary",
            "hint:         Primary",
        ),
        (
            "SELECT /* pgfresh:primary */ * FROM t",
            "primary",
            "hint:         Primary",
        ),
        (
            "SELECT * FROM t /*action='list',pgfresh='primary'*/",
            "primary",
            "hint:         Primary",
        ),
        (
            "SELECT '/* pgfresh:primary */' FROM t",
            "replica",
            "reads:        t",
        ),
        (
            "SELECT * FROM t /* pgfresh:min_lsn=1/0/16B3748 */",
            "replica",
            "min_lsn hint: 1/0/16B3748",
        ),
    ];
    for (sql, target, needle) in cases {
        let (ok, text) = pgfresh(&["explain", "-c", "conf/pgfresh.toml", sql]);
        assert!(ok, "{text}");
        assert!(
            text.contains(&format!(
                "route:        {}",
                if target == "primary" {
                    "primary"
                } else {
                    "a replica"
                }
            )),
            "{sql}: {text}"
        );
        assert!(
            text.contains(needle),
            "{sql}: expected {needle:?} in\n{text}"
        );
    }
}
