//! Which keys apply live and which need a restart — one table, used by reloads and by
//! `pgfresh check`.

use serde_json::Value;

use crate::model::Config;

/// When a changed key takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadClass {
    /// Applied to the next statement of every session.
    Live,
    /// Reported on reload, applied at the next start.
    Restart,
}

/// Every key (or key prefix) and its class. The first matching prefix wins; a key not
/// listed is restart-only, which is the safe default.
pub const RELOAD_TABLE: &[(&str, ReloadClass)] = &[
    ("proxy.listen", ReloadClass::Restart),
    ("proxy.admin_listen", ReloadClass::Restart),
    ("proxy.admin_token", ReloadClass::Live),
    ("proxy.admin_tls", ReloadClass::Live),
    ("proxy.max_client_connections", ReloadClass::Live),
    ("proxy.client_login_timeout_ms", ReloadClass::Live),
    ("proxy.shutdown_timeout_ms", ReloadClass::Live),
    ("proxy.log_level", ReloadClass::Live),
    ("proxy.max_message_bytes", ReloadClass::Live),
    ("proxy.worker_threads", ReloadClass::Restart),
    ("proxy.io_engine", ReloadClass::Restart),
    ("pool.pool_size", ReloadClass::Restart),
    // Sessions are built for one mode.
    ("pool.pool_mode", ReloadClass::Restart),
    ("pool.", ReloadClass::Live),
    ("monitor.user", ReloadClass::Restart),
    ("monitor.password", ReloadClass::Restart),
    ("monitor.database", ReloadClass::Restart),
    ("monitor.", ReloadClass::Live),
    ("routing.parse_cache_entries", ReloadClass::Restart),
    ("routing.parse_cache_bytes", ReloadClass::Restart),
    // Dependency graphs are rebuilt (from cached catalog rows) when the rules change.
    ("routing.learn_dependencies", ReloadClass::Live),
    ("routing.relation_dependencies", ReloadClass::Live),
    ("routing.dependency_check_ms", ReloadClass::Live),
    ("routing.dependency_notify_channel", ReloadClass::Live),
    // Read when a COMMIT is sent: a change applies to the next COMMIT of every session.
    ("routing.resolve_lost_commits", ReloadClass::Live),
    ("routing.", ReloadClass::Live),
    // The acceptor is rebuilt; connections already open keep their session.
    ("tls.", ReloadClass::Live),
    ("auth.", ReloadClass::Live),
    // Nodes can be added, removed, moved and re-weighted live.
    ("nodes", ReloadClass::Live),
    ("users", ReloadClass::Live),
];

/// The reload class of a dotted key such as `routing.recent_access_ttl_ms` or `nodes[1].weight`.
pub fn reload_class(key: &str) -> ReloadClass {
    RELOAD_TABLE
        .iter()
        .find(|(prefix, _)| key == *prefix || key.starts_with(prefix))
        .map(|(_, c)| *c)
        .unwrap_or(ReloadClass::Restart)
}

/// A key whose value differs between two configs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedKey {
    pub key: String,
    pub class: ReloadClass,
}

/// Every leaf key whose value differs, with its class. Arrays of tables (`nodes`,
/// `users`) are compared element by element (`nodes[0].weight`); a changed length
/// reports the array itself.
pub fn diff(old: &Config, new: &Config) -> Vec<ChangedKey> {
    let (a, b) = (to_value(old), to_value(new));
    let mut out = Vec::new();
    walk("", &a, &b, &mut out);
    out.into_iter()
        .map(|key| ChangedKey {
            class: reload_class(&key),
            key,
        })
        .collect()
}

/// Every leaf key of a config with its value rendered as TOML-ish text and its class.
pub fn describe(config: &Config) -> Vec<(String, String, ReloadClass)> {
    let mut out = Vec::new();
    flatten("", &to_value(config), &mut out);
    out.into_iter()
        .map(|(k, v)| {
            let class = reload_class(&k);
            (k, v, class)
        })
        .collect()
}

fn to_value(c: &Config) -> Value {
    serde_json::to_value(c).unwrap_or(Value::Null)
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn walk(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let null = Value::Null;
                walk(
                    &join(prefix, k),
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y))
            if x.len() == y.len() && x.iter().any(Value::is_object) =>
        {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                walk(&format!("{prefix}[{i}]"), p, q, out);
            }
        }
        _ if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                flatten(&join(prefix, k), v, out);
            }
        }
        Value::Array(items) if items.iter().any(Value::is_object) => {
            for (i, item) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), item, out);
            }
        }
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

/// A copy safe to show: passwords, tokens and verifiers replaced.
pub fn redacted(c: &Config) -> Config {
    let mut c = c.clone();
    let hide = |s: &mut Option<String>| {
        if s.is_some() {
            *s = Some("<redacted>".into());
        }
    };
    hide(&mut c.proxy.admin_token);
    if !c.monitor.password.is_empty() {
        c.monitor.password = "<redacted>".into();
    }
    for u in &mut c.users {
        hide(&mut u.password);
        hide(&mut u.server_password);
    }
    c
}
