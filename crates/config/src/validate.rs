//! Parsing and validation. A file is accepted whole or rejected whole; every error names
//! the key it is about.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

use crate::model::{AuthMethod, Config};

/// The shortest `routing.dependency_check_ms` other than 0 (each check is a catalog query on
/// the primary per database in use).
pub const MIN_DEPENDENCY_CHECK_MS: u64 = 50;

/// Why a configuration file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Syntax { path: String, message: String },
    #[error("invalid value for `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

impl ConfigError {
    fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// Read, parse and validate a file.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_str(&text).map_err(|e| match e {
        ConfigError::Syntax { message, .. } => ConfigError::Syntax {
            path: path.display().to_string(),
            message,
        },
        other => other,
    })
}

/// Parse and validate TOML text.
pub fn parse_str(text: &str) -> Result<Config, ConfigError> {
    let config: Config = toml::from_str(text).map_err(|e| ConfigError::Syntax {
        path: "<config>".into(),
        message: e.to_string().trim_end().to_string(),
    })?;
    validate(&config)?;
    Ok(config)
}

/// Check every cross-field rule.
pub fn validate(c: &Config) -> Result<(), ConfigError> {
    c.proxy
        .listen
        .parse::<SocketAddr>()
        .map_err(|e| ConfigError::invalid("proxy.listen", e.to_string()))?;
    if !c.proxy.admin_listen.is_empty() {
        let admin = c
            .proxy
            .admin_listen
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::invalid("proxy.admin_listen", e.to_string()))?;
        let token = c.proxy.admin_token.as_deref().unwrap_or("");
        if !admin.ip().is_loopback() && token.is_empty() {
            return Err(ConfigError::invalid(
                "proxy.admin_listen",
                format!(
                    "{admin} is reachable from other hosts; set proxy.admin_token so the HTTP API \
                     (which can change routing) is not open to anyone who can connect"
                ),
            ));
        }
    }
    if c.proxy.max_client_connections == 0 {
        return Err(ConfigError::invalid(
            "proxy.max_client_connections",
            "must be at least 1",
        ));
    }
    if c.proxy.max_message_bytes < 1024 {
        return Err(ConfigError::invalid(
            "proxy.max_message_bytes",
            "must be at least 1024",
        ));
    }
    if c.pool.pool_size == 0 {
        return Err(ConfigError::invalid("pool.pool_size", "must be at least 1"));
    }
    let tls = &c.tls;
    if c.proxy.admin_tls
        && (tls.client_tls_cert_file.is_empty()
            || tls.client_mode() == crate::ClientTlsMode::Disable)
    {
        return Err(ConfigError::invalid(
            "proxy.admin_tls",
            "needs [tls] client_tls_cert_file and client_tls_key_file (the same certificate serves the admin API)",
        ));
    }
    let mode = tls.client_mode();
    if mode != crate::ClientTlsMode::Disable
        && (tls.client_tls_cert_file.is_empty() || tls.client_tls_key_file.is_empty())
    {
        return Err(ConfigError::invalid(
            "tls.client_tls_sslmode",
            format!(
                "{} needs client_tls_cert_file and client_tls_key_file",
                mode.as_str()
            ),
        ));
    }
    if mode.verifies_clients() && tls.client_tls_ca_file.is_empty() {
        return Err(ConfigError::invalid(
            "tls.client_tls_ca_file",
            format!(
                "client_tls_sslmode = {} needs the CA that client certificates chain to",
                mode.as_str()
            ),
        ));
    }
    for n in &c.nodes {
        validate_server_tls(n, &n.server_tls(tls))?;
    }
    if !c.auth.auth_user.is_empty() {
        let Some(u) = c.user(&c.auth.auth_user) else {
            return Err(ConfigError::invalid(
                "auth.auth_user",
                format!("{:?} is not a [[users]] entry", c.auth.auth_user),
            ));
        };
        if u.server_password().is_none() {
            return Err(ConfigError::invalid(
                "auth.auth_user",
                "its [[users]] entry needs a password pgfresh can log in to the nodes with",
            ));
        }
        if c.auth.auth_query.trim().is_empty() {
            return Err(ConfigError::invalid("auth.auth_query", "empty"));
        }
    }
    if c.pool.max_prepared_statements == 0 {
        return Err(ConfigError::invalid(
            "pool.max_prepared_statements",
            "must be at least 1",
        ));
    }
    if c.monitor.sr_check_period_ms < 10 {
        return Err(ConfigError::invalid(
            "monitor.sr_check_period_ms",
            "must be at least 10",
        ));
    }
    if c.monitor.replay_check_period_ms > c.monitor.sr_check_period_ms {
        return Err(ConfigError::invalid(
            "monitor.replay_check_period_ms",
            "must be at most monitor.sr_check_period_ms (0 turns the fast replay polls off)",
        ));
    }
    if c.monitor.health_timeout_ms < c.monitor.sr_check_period_ms {
        return Err(ConfigError::invalid(
            "monitor.health_timeout_ms",
            "must be at least monitor.sr_check_period_ms",
        ));
    }
    let r = &c.routing;
    if r.recent_access_max_ttl_ms == 0 {
        return Err(ConfigError::invalid(
            "routing.recent_access_max_ttl_ms",
            "must be positive",
        ));
    }
    if r.recent_access_ttl_ms > r.recent_access_max_ttl_ms {
        return Err(ConfigError::invalid(
            "routing.recent_access_ttl_ms",
            format!(
                "{} exceeds routing.recent_access_max_ttl_ms ({})",
                r.recent_access_ttl_ms, r.recent_access_max_ttl_ms
            ),
        ));
    }
    if (1..MIN_DEPENDENCY_CHECK_MS).contains(&r.dependency_check_ms) {
        return Err(ConfigError::invalid(
            "routing.dependency_check_ms",
            format!("must be 0 (off) or at least {MIN_DEPENDENCY_CHECK_MS}"),
        ));
    }
    if r.dependency_notify_channel.len() > 63 || r.dependency_notify_channel.contains('\0') {
        return Err(ConfigError::invalid(
            "routing.dependency_notify_channel",
            "must be a channel name of at most 63 bytes, without NUL",
        ));
    }
    if r.recency_max_entries == 0 {
        return Err(ConfigError::invalid(
            "routing.recency_max_entries",
            "must be at least 1",
        ));
    }
    for (key, list) in [
        ("routing.never_track", &r.never_track),
        ("routing.always_hot", &r.always_hot),
        ("routing.write_function_list", &r.write_function_list),
        (
            "routing.read_only_function_list",
            &r.read_only_function_list,
        ),
    ] {
        for item in list {
            if item.trim().is_empty() || item.split('.').count() > 2 {
                return Err(ConfigError::invalid(
                    key,
                    format!("{item:?} is not `name` or `schema.name`"),
                ));
            }
        }
    }
    for (i, rule) in r.relation_dependencies.iter().enumerate() {
        pgfresh_deps::ManualRule::parse(rule)
            .map_err(|e| ConfigError::invalid(format!("routing.relation_dependencies[{i}]"), e))?;
    }
    if c.nodes.is_empty() {
        return Err(ConfigError::invalid(
            "nodes",
            "at least one [[nodes]] entry is required",
        ));
    }
    let mut names = HashSet::new();
    let mut addrs = HashSet::new();
    for (i, n) in c.nodes.iter().enumerate() {
        let key = |f: &str| format!("nodes[{i}].{f}");
        if n.name.is_empty() {
            return Err(ConfigError::invalid(key("name"), "must not be empty"));
        }
        if !names.insert(n.name.as_str()) {
            return Err(ConfigError::invalid(
                key("name"),
                format!("duplicate node name {:?}", n.name),
            ));
        }
        if n.host.is_empty() {
            return Err(ConfigError::invalid(key("host"), "must not be empty"));
        }
        if n.port == 0 {
            return Err(ConfigError::invalid(key("port"), "must not be 0"));
        }
        if !addrs.insert((n.host.as_str(), n.port)) {
            return Err(ConfigError::invalid(
                key("port"),
                format!("{}:{} is listed twice", n.host, n.port),
            ));
        }
    }
    let mut users = HashSet::new();
    for (i, u) in c.users.iter().enumerate() {
        let key = |f: &str| format!("users[{i}].{f}");
        if u.name.is_empty() {
            return Err(ConfigError::invalid(key("name"), "must not be empty"));
        }
        if !users.insert(u.name.as_str()) {
            return Err(ConfigError::invalid(
                key("name"),
                format!("duplicate user {:?}", u.name),
            ));
        }
        match u.auth {
            AuthMethod::ScramSha256 | AuthMethod::Md5 if u.password.is_none() => {
                return Err(ConfigError::invalid(
                    key("password"),
                    "required unless auth = \"trust\"",
                ));
            }
            AuthMethod::Md5 if u.password_is_verifier() => {
                return Err(ConfigError::invalid(
                    key("password"),
                    "md5 authentication needs the plain password, not a SCRAM verifier",
                ));
            }
            _ => {}
        }
        // A SCRAM verifier without server_password: pgfresh logs in to the nodes with the
        // keys the client's own login proves (SCRAM pass-through), which only the same
        // role, storing the same verifier, accepts.
        if u.password_is_verifier()
            && u.server_password.is_none()
            && u.server_user.as_deref().is_some_and(|s| s != u.name)
        {
            return Err(ConfigError::invalid(
                key("server_password"),
                "required when password is a SCRAM verifier and server_user is another role \
                 (SCRAM pass-through logs in as the client's own role only)",
            ));
        }
    }
    Ok(())
}

/// A node's TLS settings: the verify modes need a CA, a client certificate needs its
/// key, and every file named must be readable now (its content is checked when the
/// first connection is made, and a later broken file keeps the last good one).
fn validate_server_tls(n: &crate::NodeConfig, t: &crate::ServerTls) -> Result<(), ConfigError> {
    use crate::ServerTlsMode::{VerifyCa, VerifyFull};
    let key = |k: &str| format!("nodes.{}.{k}", n.name);
    if matches!(t.mode, VerifyCa | VerifyFull) && t.ca_file.is_empty() {
        return Err(ConfigError::invalid(
            key("server_tls_ca_file"),
            "server_tls_sslmode verify-ca and verify-full need the CA the node's certificate chains to",
        ));
    }
    if t.cert_file.is_empty() != t.key_file.is_empty() {
        return Err(ConfigError::invalid(
            key("server_tls_cert_file"),
            "server_tls_cert_file and server_tls_key_file go together: give both or neither",
        ));
    }
    for (name, path) in [
        ("server_tls_ca_file", &t.ca_file),
        ("server_tls_cert_file", &t.cert_file),
        ("server_tls_key_file", &t.key_file),
    ] {
        if !path.is_empty() {
            if let Err(e) = std::fs::File::open(path) {
                return Err(ConfigError::invalid(key(name), format!("{path}: {e}")));
            }
        }
    }
    Ok(())
}
