//! SCRAM pass-through: a user configured with the SCRAM verifier the nodes store (and no
//! server_password) logs in to pgfresh with its password, and pgfresh logs in to every
//! node with the keys that login proved, never knowing the password.

use std::time::Duration;

use pgfresh_tests::*;

async fn row(c: &tokio_postgres::Client, sql: &str) -> (String, i32) {
    let r = c
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    (r.get(0), r.get(1))
}

#[tokio::test]
async fn scram_passthrough_logs_in_to_the_nodes_without_the_password() {
    let verifier = cluster()
        .psql(
            0,
            "postgres",
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'app'",
        )
        .unwrap()
        .trim()
        .to_string();
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "{verifier}");
    let plain = format!("name = \"app\"\npassword = \"{APP_PASSWORD}\"\n");
    let text = config_text("");
    assert!(text.contains(&plain));
    // The password appears nowhere in pgfresh's config: only the nodes' verifier.
    let text = text.replace(
        &plain,
        &format!("name = \"app\"\npassword = \"{verifier}\"\n"),
    );
    let p = start_proxy(&text);
    let c = p.connect().await;
    let (user, port) = row(
        &c,
        "/* pgfresh:primary */ SELECT current_user::text, inet_server_port()",
    )
    .await;
    assert_eq!((user.as_str(), port), ("app", node_port(0) as i32));
    // A replica's connection logs in the same way.
    let c = &c;
    poll(
        "a read on a replica",
        Duration::from_secs(30),
        || async move {
            let (user, port) = row(c, "SELECT current_user::text, inet_server_port()").await;
            assert_eq!(user, "app");
            (port != node_port(0) as i32).then_some(())
        },
    )
    .await;
    // A wrong password proves nothing and gets nothing.
    let wrong = tokio_postgres::connect(
        &p.conninfo("app", "not-the-password", "app"),
        tokio_postgres::NoTls,
    )
    .await;
    let err = wrong.err().expect("a wrong password is refused");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD),
        "{err:?}"
    );
}

#[tokio::test]
async fn users_from_an_auth_file_log_in_and_the_file_reloads() {
    login_roles(&[("tp_file", "file-secret"), ("tp_plain", "plain-secret")]).await;
    let c = cluster();
    let verifier = c
        .psql(
            0,
            "postgres",
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'tp_file'",
        )
        .unwrap()
        .trim()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("userlist.txt");
    std::fs::write(&file, format!("\"tp_file\" \"{verifier}\"\n")).unwrap();
    let p = start_proxy(&format!(
        "{}\n[auth]\nauth_file = \"{}\"\n",
        config_text(""),
        file.display()
    ));
    // The file's verifier checks the client's password; the nodes take the client's keys.
    let a = p.connect_as("tp_file", "file-secret", "app").await.unwrap();
    let (user, _) = row(
        &a,
        "/* pgfresh:primary */ SELECT current_user::text, inet_server_port()",
    )
    .await;
    assert_eq!(user, "tp_file");
    let (user, _) = row(&a, "SELECT current_user::text, inet_server_port()").await;
    assert_eq!(user, "tp_file");
    assert!(p.connect_as("tp_file", "wrong", "app").await.is_err());
    assert!(
        p.connect_as("tp_plain", "plain-secret", "app")
            .await
            .is_err(),
        "not in the file yet"
    );

    // A user added to the file can log in within a second or so; a plain password there
    // is also what pgfresh logs in to the nodes with.
    std::fs::write(
        &file,
        format!("\"tp_file\" \"{verifier}\"\n\"tp_plain\" \"plain-secret\"\n"),
    )
    .unwrap();
    let p = &p;
    let b = poll(
        "the new user gets in",
        Duration::from_secs(30),
        || async move { p.connect_as("tp_plain", "plain-secret", "app").await.ok() },
    )
    .await;
    let (user, _) = row(
        &b,
        "/* pgfresh:primary */ SELECT current_user::text, inet_server_port()",
    )
    .await;
    assert_eq!(user, "tp_plain");

    // A file that does not parse is refused; the users read before stay.
    replace_with_garbage(
        &file,
        "this is not a userlist\n",
        "pgfresh_auth_file_loads_total{result=\"error\"}",
    )
    .await;
    p.connect_as("tp_plain", "plain-secret", "app")
        .await
        .expect("users from the last good file stay");
}

#[tokio::test]
async fn users_unknown_to_pgfresh_are_looked_up_with_auth_query() {
    login_roles(&[("tp_query", "query-secret")]).await;
    // The test config's admin user logs in to the nodes as the superuser, which may read
    // pg_shadow (the default auth_query).
    let p = start_proxy(&format!(
        "{}\n[auth]\nauth_user = \"admin\"\n",
        config_text("")
    ));
    let found = "pgfresh_auth_lookups_total{result=\"found\"}";
    let cached = "pgfresh_auth_lookups_total{result=\"cached\"}";
    let (found_before, cached_before) = (metric_value(found), metric_value(cached));
    for _ in 0..3 {
        // The verifier from pg_shadow checks the password; the nodes take the client's keys.
        let q = p
            .connect_as("tp_query", "query-secret", "app")
            .await
            .unwrap();
        let (user, _) = row(
            &q,
            "/* pgfresh:primary */ SELECT current_user::text, inet_server_port()",
        )
        .await;
        assert_eq!(user, "tp_query");
        let (user, _) = row(&q, "SELECT current_user::text, inet_server_port()").await;
        assert_eq!(user, "tp_query");
    }
    assert!(
        metric_value(found) > found_before,
        "looked up on the primary"
    );
    assert!(
        metric_value(cached) > cached_before,
        "then answered from the cache"
    );
    assert!(p.connect_as("tp_query", "wrong", "app").await.is_err());
    let Err(err) = p.connect_as("tp_nobody", "x", "app").await else {
        panic!("an unknown user is refused");
    };
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD),
        "{err:?}"
    );
}
