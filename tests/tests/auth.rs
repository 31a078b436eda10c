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
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (user, port) = row(&c, "SELECT current_user::text, inet_server_port()").await;
        assert_eq!(user, "app");
        if port != node_port(0) as i32 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no read reached a replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
