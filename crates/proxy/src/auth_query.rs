//! `[auth] auth_user` + `auth_query`: a client whose user is in neither `[[users]]` nor
//! `auth_file` is looked up on the primary, in the database it asks for, by pgfresh logged
//! in as `auth_user`. Answers (a secret, or no such user) are kept for 30 s; lookups are
//! counted in `pgfresh_auth_lookups_total{result}`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pgfresh_config::UserConfig;

use crate::context::Shared;
use crate::monitor_conn::MonitorConn;

/// How long an answer is kept.
const KEEP: Duration = Duration::from_secs(30);
/// Most answers kept (beyond, the cache starts over).
const MAX_ENTRIES: usize = 10_000;

/// (database, user) → when it was answered, and the answer.
type Answers = HashMap<(String, String), (Instant, Option<UserConfig>)>;

#[derive(Default)]
pub struct AuthQuery {
    answers: Mutex<Answers>,
}

fn count(result: &'static str) {
    metrics::counter!("pgfresh_auth_lookups_total", "result" => result).increment(1);
}

impl AuthQuery {
    /// The user `name` of database `db` as `auth_query` describes it; `None` when the
    /// lookup is off, finds nothing, or fails (the reason is logged: the client is only
    /// told that authentication failed).
    pub async fn user(&self, shared: &Shared, db: &str, name: &str) -> Option<UserConfig> {
        let config = shared.config.snapshot();
        let auth = &config.auth;
        if auth.auth_user.is_empty() {
            return None;
        }
        let key = (db.to_string(), name.to_string());
        {
            let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, user)) = answers.get(&key).filter(|(at, _)| at.elapsed() < KEEP) {
                let _ = at;
                count("cached");
                return user.clone();
            }
        }
        let login = config.user(&auth.auth_user)?;
        let password = login.server_password()?;
        let looked_up = async {
            let conn = MonitorConn::open_as(
                shared,
                None,
                db,
                "pgfresh auth_query",
                login.server_user(),
                password,
            )
            .await?;
            let rows = conn
                .client
                .query(auth.auth_query.as_str(), &[&name])
                .await
                .map_err(|e| pgfresh_balancer::describe_pg_error(&e));
            conn.close().await;
            let rows = rows?;
            let secret = match rows.first() {
                Some(row) => row
                    .try_get::<_, Option<String>>(1)
                    .map_err(|e| format!("auth_query's second column: {e}"))?,
                None => None,
            };
            Ok::<_, String>(secret)
        };
        match tokio::time::timeout(Duration::from_secs(10), looked_up).await {
            Ok(Ok(secret)) => {
                count(if secret.is_some() {
                    "found"
                } else {
                    "not_found"
                });
                let user =
                    secret.map(|s| pgfresh_config::userlist::user_with_secret(name.to_string(), s));
                let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
                if answers.len() >= MAX_ENTRIES {
                    answers.clear();
                }
                answers.insert(key, (Instant::now(), user.clone()));
                user
            }
            Ok(Err(e)) => {
                count("error");
                tracing::warn!(user = name, database = db, error = %e, "auth_query lookup failed");
                None
            }
            Err(_) => {
                count("error");
                tracing::warn!(
                    user = name,
                    database = db,
                    "auth_query lookup timed out after 10 s"
                );
                None
            }
        }
    }
}
