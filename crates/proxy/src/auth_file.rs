//! Users from `[auth] auth_file` (PgBouncer's userlist.txt), re-read when the file or the
//! config changes (checked every second); a file that does not parse is reported and the
//! users loaded before stay. `[[users]]` wins over the file.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwapOption;
use pgfresh_config::UserConfig;

struct Loaded {
    path: String,
    stamp: Option<(SystemTime, u64)>,
    users: HashMap<String, UserConfig>,
}

#[derive(Default)]
pub struct AuthFile {
    current: ArcSwapOption<Loaded>,
}

fn stamp(path: &str) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl AuthFile {
    /// The user `name` as the file describes it.
    pub fn user(&self, name: &str) -> Option<UserConfig> {
        self.current.load().as_ref()?.users.get(name).cloned()
    }

    /// Re-read `path` if it or its contents changed since the last read.
    pub fn refresh(&self, path: &str) {
        let current = self.current.load();
        if path.is_empty() {
            if current.is_some() {
                self.current.store(None);
            }
            return;
        }
        let now = stamp(path);
        if current
            .as_ref()
            .is_some_and(|c| c.path == path && c.stamp == now)
        {
            return;
        }
        let read = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| pgfresh_config::userlist::parse(&text));
        let users = match read {
            Ok(users) => {
                metrics::counter!("pgfresh_auth_file_loads_total", "result" => "ok").increment(1);
                tracing::info!(path, users = users.len(), "auth_file loaded");
                users.into_iter().map(|u| (u.name.clone(), u)).collect()
            }
            Err(e) => {
                metrics::counter!("pgfresh_auth_file_loads_total", "result" => "error")
                    .increment(1);
                tracing::error!(path, error = %e, "auth_file not loaded; the users read before stay");
                // Remember the stamp so the error is reported once per change.
                current
                    .as_ref()
                    .map(|c| c.users.clone())
                    .unwrap_or_default()
            }
        };
        self.current.store(Some(Arc::new(Loaded {
            path: path.to_string(),
            stamp: now,
            users,
        })));
    }
}
