//! The admin console: the virtual database `pgfresh`, for users with `admin = true`,
//! in the manner of pgbouncer's console (`psql -d pgfresh -U admin`).
//! Speaks the simple query protocol; answers SHOW NODES, SHOW POOLS, SHOW CLIENTS, SHOW SERVERS,
//! SHOW HOT, SHOW WAL_FEED, SHOW CONFIG, SHOW STATS, SHOW DEPENDENCIES, SHOW HELP, RELOAD and
//! SET recent_access_ttl_ms = N. Several `;`-separated commands may be sent at once;
//! the first error ends the string.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::tls::ClientStream;
use bytes::{BufMut, BytesMut};
use pgfresh_wire::{
    build, parse_frontend, sqlstate, ErrorResponse, FrontendMessage, Limits, Severity, TxStatus,
};
use tokio::io::AsyncWriteExt;

use crate::admin;
use crate::client::Login;
use crate::context::Shared;
use crate::io::{read_frame, Side};

pub(crate) fn row_description(out: &mut BytesMut, cols: &[&str]) {
    let mut body = BytesMut::new();
    body.put_u16(cols.len() as u16);
    for c in cols {
        body.put_slice(c.as_bytes());
        body.put_u8(0);
        body.put_u32(0); // table oid
        body.put_u16(0); // column number
        body.put_u32(25); // text
        body.put_i16(-1);
        body.put_i32(-1);
        body.put_u16(0); // text format
    }
    out.put_u8(b'T');
    out.put_u32(body.len() as u32 + 4);
    out.put_slice(&body);
}

pub(crate) fn data_row(out: &mut BytesMut, values: &[String]) {
    let mut body = BytesMut::new();
    body.put_u16(values.len() as u16);
    for v in values {
        body.put_u32(v.len() as u32);
        body.put_slice(v.as_bytes());
    }
    out.put_u8(b'D');
    out.put_u32(body.len() as u32 + 4);
    out.put_slice(&body);
}

fn table(out: &mut BytesMut, cols: &[&str], rows: Vec<Vec<String>>) {
    row_description(out, cols);
    let n = rows.len();
    for r in rows {
        data_row(out, &r);
    }
    out.extend_from_slice(&build::command_complete(&format!("SHOW {n}")));
}

pub async fn run(mut sock: ClientStream, mut buf: BytesMut, shared: Arc<Shared>, login: Login) {
    if !login.user.admin {
        let e = ErrorResponse::fatal(
            sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            format!(
                "user \"{}\" may not open the admin console",
                login.user.name
            ),
        );
        let _ = sock.write_all(&e.to_bytes()).await;
        let _ = sock.flush().await;
        return;
    }
    let mut out = BytesMut::new();
    out.extend_from_slice(&build::parameter_status(
        "server_version",
        "15.0 (pgfresh console)",
    ));
    out.extend_from_slice(&build::parameter_status("client_encoding", "UTF8"));
    out.extend_from_slice(&build::parameter_status(
        "standard_conforming_strings",
        "on",
    ));
    out.extend_from_slice(&build::backend_key_data(pgfresh_wire::CancelKey {
        pid: 0,
        secret: 0,
    }));
    out.extend_from_slice(&build::ready_for_query(TxStatus::Idle));
    if sock.write_all(&out).await.is_err() || sock.flush().await.is_err() {
        return;
    }
    let limits = Limits {
        max_message: 1 << 20,
        max_startup: 10 * 1024,
    };
    loop {
        let Ok(frame) = read_frame(&mut sock, &mut buf, &limits, Side::Frontend).await else {
            return;
        };
        let mut out = BytesMut::new();
        match parse_frontend(&frame) {
            Ok(FrontendMessage::Query { sql }) => answer(&shared, sql, &mut out).await,
            Ok(FrontendMessage::Terminate) => return,
            Ok(_) => {
                out.extend_from_slice(
                    &ErrorResponse::error(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        "the admin console accepts simple queries only",
                    )
                    .to_bytes(),
                );
            }
            Err(e) => {
                let _ = sock
                    .write_all(&ErrorResponse::fatal(e.sqlstate(), e.to_string()).to_bytes())
                    .await;
                let _ = sock.flush().await;
                return;
            }
        }
        out.extend_from_slice(&build::ready_for_query(TxStatus::Idle));
        if sock.write_all(&out).await.is_err() || sock.flush().await.is_err() {
            return;
        }
    }
}

const HELP: &[(&str, &str)] = &[
    (
        "SHOW NODES",
        "nodes with role, health, replay LSN, lag and read-pool membership",
    ),
    (
        "SHOW POOLS",
        "server connection pools per node, database and user (PgBouncer's columns first)",
    ),
    (
        "SHOW CLIENTS",
        "client connections: state (active, waiting, idle), wait, pin reason",
    ),
    (
        "SHOW SERVERS",
        "server connections: lent (active) or pooled (idle), backend pid, statements kept",
    ),
    (
        "SHOW HOT",
        "recently written relations with age, writes and forced reads",
    ),
    (
        "SHOW WAL_FEED",
        "the WAL feed of each database in use: streaming, decoded position, commits, error",
    ),
    (
        "SHOW CONFIG",
        "the effective config (secrets redacted) and how each key reloads",
    ),
    (
        "SHOW STATS",
        "routing counters, offload ratio, fallbacks, caches, reloads",
    ),
    (
        "SHOW DEPENDENCIES [database]",
        "learned and manual dependency edges, and bodies that cannot be analysed",
    ),
    (
        "RELOAD",
        "re-read the config file; an invalid file changes nothing",
    ),
    (
        "PAUSE",
        "hold every unit needing a server connection; answers once none is in use, pooled ones closed",
    ),
    ("RESUME", "end a PAUSE: the units it held go on"),
    (
        "SET recent_access_ttl_ms = N",
        "set the recency TTL (clamped to recent_access_max_ttl_ms)",
    ),
    ("SHOW HELP", "this list"),
];

fn error(out: &mut BytesMut, code: &'static str, msg: impl Into<String>) {
    out.extend_from_slice(&ErrorResponse::error(code, msg).to_bytes());
}

fn notice(out: &mut BytesMut, msg: impl Into<String>) {
    out.extend_from_slice(
        &ErrorResponse::new(Severity::Notice, sqlstate::SUCCESSFUL_COMPLETION, msg)
            .to_notice_bytes(),
    );
}

fn kv(rows: &mut Vec<Vec<String>>, k: &str, v: impl ToString) {
    rows.push(vec![k.to_string(), v.to_string()]);
}

/// Answer a query string (one or more `;`-separated commands) into `out`.
pub async fn answer(shared: &Shared, sql: &str, out: &mut BytesMut) {
    let commands: Vec<&str> = sql
        .split(';')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    if commands.is_empty() {
        out.extend_from_slice(&build::empty_query_response());
        return;
    }
    for cmd in commands {
        let before = out.len();
        if cmd.eq_ignore_ascii_case("pause") {
            // The one command that waits (for the connections in use to come back).
            pause(shared, out).await;
        } else {
            answer_one(shared, cmd, out);
        }
        // Stop at the first error, as PostgreSQL does for a multi-statement string.
        if contains_error(&out[before..]) {
            return;
        }
    }
}

/// Whether the frames written for one command include an ErrorResponse.
fn contains_error(mut frames: &[u8]) -> bool {
    while frames.len() >= 5 {
        let tag = frames[0];
        let len = u32::from_be_bytes([frames[1], frames[2], frames[3], frames[4]]) as usize;
        if tag == b'E' {
            return true;
        }
        let Some(rest) = frames.get(1 + len..) else {
            return false;
        };
        frames = rest;
    }
    false
}

fn answer_one(shared: &Shared, sql: &str, out: &mut BytesMut) {
    let cmd = sql.to_ascii_lowercase();
    let words: Vec<&str> = cmd.split_whitespace().collect();
    match words.as_slice() {
        ["show", "nodes"] => show_nodes(shared, out),
        ["show", "pools"] => show_pools(shared, out),
        ["show", "servers"] => show_servers(shared, out),
        ["show", "clients"] => show_clients(shared, out),
        ["show", "wal_feed"] => show_wal_feed(shared, out),
        ["show", "hot"] => {
            let rows = shared
                .recency
                .hot_relations(None, 1000)
                .into_iter()
                .map(|h| vec![h.db, h.relation, h.age_ms.to_string(), h.writes.to_string(), h.hits.to_string()])
                .collect();
            table(out, &["database", "relation", "age_ms", "writes", "hits"], rows);
        }
        ["show", "config"] => {
            let c = pgfresh_config::redacted(&shared.config.snapshot());
            let rows = pgfresh_config::describe(&c)
                .into_iter()
                .map(|(k, v, class)| vec![k, v, format!("{class:?}").to_ascii_lowercase()])
                .collect();
            table(out, &["key", "value", "reload"], rows);
        }
        ["show", "stats"] => show_stats(shared, out),
        ["show", "dependencies"] => show_dependencies(shared, None, out),
        ["show", "dependencies", _] => {
            // The name as written (database names keep their case), quotes removed.
            let name = sql.split_whitespace().nth(2).unwrap_or_default();
            let name = name
                .strip_prefix('"')
                .and_then(|n| n.strip_suffix('"'))
                .map(|n| n.replace("\"\"", "\""))
                .unwrap_or_else(|| name.to_string());
            show_dependencies(shared, Some(&name), out)
        }
        ["show", "help"] | ["help"] => {
            let rows = HELP.iter().map(|(c, d)| vec![c.to_string(), d.to_string()]).collect();
            table(out, &["command", "description"], rows);
        }
        ["reload"] => reload(shared, out),
        ["resume"] => {
            if shared.pause.resume() {
                tracing::warn!("console RESUME: units held by the pause go on");
                out.extend_from_slice(&build::command_complete("RESUME"));
            } else {
                error(out, sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE, "pgfresh is not paused");
            }
        }
        ["set", "recent_access_ttl_ms", rest @ ..] => {
            let mut values = rest.iter().filter(|w| **w != "=" && **w != "to");
            let value = values.next().map(|w| w.trim_start_matches('=').trim_matches('\''));
            match (value.and_then(|v| v.parse::<u64>().ok()), values.next()) {
                (Some(v), None) => {
                    let (ttl, previous) = admin::set_ttl(shared, v, "console");
                    if ttl != v {
                        notice(out, format!("recent_access_ttl_ms clamped to recent_access_max_ttl_ms ({ttl})"));
                    }
                    notice(out, format!("recent_access_ttl_ms: {previous} -> {ttl}"));
                    out.extend_from_slice(&build::command_complete("SET"));
                }
                _ => error(out, sqlstate::INVALID_PARAMETER_VALUE, "usage: SET recent_access_ttl_ms = N (a non-negative integer, in milliseconds)"),
            }
        }
        ["set", key, ..] => error(
            out,
            sqlstate::FEATURE_NOT_SUPPORTED,
            format!("the console sets only recent_access_ttl_ms, not {key:?}; edit the config file and RELOAD for other keys"),
        ),
        _ => error(
            out,
            sqlstate::SYNTAX_ERROR,
            format!(
                "unknown console command {sql:?}; try {}",
                HELP.iter().map(|(c, _)| *c).collect::<Vec<_>>().join(", ")
            ),
        ),
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

/// `SHOW WAL_FEED`: one row per database whose feed was started (`wal_feed`).
fn show_wal_feed(shared: &Shared, out: &mut BytesMut) {
    let mode = shared.config.snapshot().routing.wal_feed.as_str();
    let rows = shared
        .wal_feeds
        .all()
        .iter()
        .map(|f| {
            vec![
                f.db.clone(),
                mode.to_string(),
                f.streaming().to_string(),
                f.position().to_string(),
                f.commits().to_string(),
                f.error().unwrap_or_default(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "database",
            "mode",
            "streaming",
            "position",
            "commits",
            "error",
        ],
        rows,
    );
}

fn show_nodes(shared: &Shared, out: &mut BytesMut) {
    let view = shared.balancer.view_now();
    let rows = view
        .nodes
        .iter()
        .map(|n| {
            vec![
                n.spec.name.clone(),
                format!("{}:{}", n.spec.host, n.spec.port),
                n.role.as_str().to_string(),
                n.healthy.to_string(),
                opt(n.current_lsn.or(n.replay_lsn)),
                opt(n.lag_bytes),
                opt(n.lag_ms),
                opt(n
                    .external_lag
                    .as_ref()
                    .map(|e| format!("{} ms ({})", e.lag_ms, e.source))),
                n.spec.weight.to_string(),
                n.outstanding.to_string(),
                if n.eligible {
                    "in".into()
                } else {
                    n.ineligible_reason.map_or("out", |r| r.as_str()).into()
                },
                n.last_error.clone().unwrap_or_default(),
                opt(n.tls),
            ]
        })
        .collect();
    table(
        out,
        &[
            "name",
            "address",
            "role",
            "healthy",
            "lsn",
            "lag_bytes",
            "lag_ms",
            "external_lag",
            "weight",
            "outstanding",
            "read_pool",
            "last_error",
            "tls",
        ],
        rows,
    );
}

/// `SHOW DEPENDENCIES [database]`: one row per edge of every loaded graph, then one per
/// body that cannot be analysed (kind `unanalysable`, the function in `from`, the reason in
/// `action`), then one per unlogged table (kind `unlogged`, the table in `from`).
fn show_dependencies(shared: &Shared, only: Option<&str>, out: &mut BytesMut) {
    let mut rows = Vec::new();
    for (db, graph) in shared.deps.loaded() {
        if only.is_some_and(|o| o != db) {
            continue;
        }
        let report = graph.report();
        for e in &report.edges {
            rows.push(vec![
                db.clone(),
                crate::deps::edge_kind_name(e.kind),
                e.from.clone(),
                e.to.clone(),
                e.via.clone().unwrap_or_default(),
                e.action.clone(),
            ]);
        }
        for u in &report.unanalysable {
            let mut reason = format!("{} ({})", u.reason, u.language);
            if u.overridden_by_rule {
                reason.push_str("; described by a relation_dependencies rule");
            } else {
                reason.push_str("; marks the whole database");
            }
            rows.push(vec![
                db.clone(),
                "unanalysable".to_string(),
                u.function.clone(),
                String::new(),
                String::new(),
                reason,
            ]);
        }
        for t in &report.unlogged {
            rows.push(vec![
                db.clone(),
                "unlogged".to_string(),
                t.clone(),
                String::new(),
                String::new(),
                "read on the primary only".to_string(),
            ]);
        }
    }
    table(
        out,
        &["database", "kind", "from", "to", "via", "action"],
        rows,
    );
}

fn time(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `SHOW POOLS`: one row per (node, database, user) pool. PgBouncer's columns first, with
/// their meaning per pool: `cl_active` clients holding one of its connections,
/// `cl_waiting` clients waiting for one, `sv_active`/`sv_idle` connections lent/pooled,
/// `maxwait` the longest current wait. Clients holding no connection (transaction mode,
/// between transactions) are in no pool's row; SHOW CLIENTS lists them.
fn show_pools(shared: &Shared, out: &mut BytesMut) {
    let rows = admin::pool_rows(shared)
        .into_iter()
        .map(|p| {
            vec![
                p.database,
                p.user,
                p.active.to_string(),
                p.waiting.to_string(),
                p.active.to_string(),
                p.idle.to_string(),
                "0".into(),
                "0".into(),
                "0".into(),
                p.max_wait.as_secs().to_string(),
                p.max_wait.subsec_micros().to_string(),
                p.mode.to_string(),
                p.node,
                p.pool_size.to_string(),
                p.free.to_string(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "database",
            "user",
            "cl_active",
            "cl_waiting",
            "sv_active",
            "sv_idle",
            "sv_used",
            "sv_tested",
            "sv_login",
            "maxwait",
            "maxwait_us",
            "pool_mode",
            "node",
            "pool_size",
            "free",
        ],
        rows,
    );
}

/// `SHOW CLIENTS`: one row per client connection, PgBouncer's columns first.
fn show_clients(shared: &Shared, out: &mut BytesMut) {
    let rows = shared
        .client_list
        .snapshot()
        .into_iter()
        .map(|c| {
            let waited = c.waited();
            vec![
                "C".into(),
                c.user.clone(),
                c.database.clone(),
                c.state().as_str().into(),
                opt(c.addr.map(|a| a.ip())),
                opt(c.addr.map(|a| a.port())),
                time(c.connected_at),
                waited.as_secs().to_string(),
                waited.subsec_micros().to_string(),
                c.application_name.clone(),
                c.tls.to_string(),
                c.pinned().unwrap_or_default().into(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "type",
            "user",
            "database",
            "state",
            "addr",
            "port",
            "connect_time",
            "wait",
            "wait_us",
            "application_name",
            "tls",
            "pinned",
        ],
        rows,
    );
}

/// `SHOW SERVERS`: one row per server connection, PgBouncer's columns first.
fn show_servers(shared: &Shared, out: &mut BytesMut) {
    let config = shared.config.snapshot();
    let rows = shared
        .pools
        .servers()
        .into_iter()
        .map(|s| {
            vec![
                "S".into(),
                s.user,
                s.database,
                s.state.into(),
                s.host,
                s.port.to_string(),
                time(s.connected_at),
                s.pid.to_string(),
                config
                    .nodes
                    .get(s.node)
                    .map(|n| n.name.clone())
                    .unwrap_or_else(|| format!("#{}", s.node)),
                s.for_.as_millis().to_string(),
                opt(s.prepared),
                s.tls.to_string(),
            ]
        })
        .collect();
    table(
        out,
        &[
            "type",
            "user",
            "database",
            "state",
            "addr",
            "port",
            "connect_time",
            "remote_pid",
            "node",
            "state_ms",
            "prepared_statements",
            "tls",
        ],
        rows,
    );
}

fn show_stats(shared: &Shared, out: &mut BytesMut) {
    let s = shared.recency.stats();
    let cache = shared.analyzer.cache_stats();
    let (reload_ok, reload_err) = shared.config.reload_counts();
    let prom = admin::metrics_handle()
        .map(|h| h.render())
        .unwrap_or_default();
    let routing = admin::routing_summary(&prom);
    let mut rows = Vec::new();
    for key in ["total", "primary", "replica", "reads", "forced_by_recency"] {
        kv(&mut rows, &format!("routed_{key}"), &routing[key]);
    }
    kv(
        &mut rows,
        "offload_ratio",
        routing["offload_ratio"]
            .as_f64()
            .map(|r| format!("{r:.4}"))
            .unwrap_or_default(),
    );
    if let Some(by) = routing["by_reason"].as_array() {
        for r in by {
            let name = format!(
                "routed.{}.{}",
                r["target"].as_str().unwrap_or(""),
                r["reason"].as_str().unwrap_or("")
            );
            kv(&mut rows, &name, &r["count"]);
        }
    }
    if let Some(f) = routing["primary_fallbacks"].as_object() {
        for (reason, n) in f {
            kv(&mut rows, &format!("primary_fallbacks.{reason}"), n);
        }
    }
    kv(
        &mut rows,
        "primary_fallbacks_in_flight",
        shared.fallbacks_in_flight.load(Ordering::Relaxed),
    );
    kv(&mut rows, "recent_access_ttl_ms", shared.recency.ttl_ms());
    kv(&mut rows, "hot_relations", shared.recency.len());
    kv(&mut rows, "recency_marks", s.marks);
    kv(&mut rows, "recency_hits", s.hits);
    kv(&mut rows, "recency_expirations", s.expirations);
    kv(&mut rows, "recency_overflows", s.overflows);
    kv(&mut rows, "parse_cache_hits", cache.hits);
    kv(&mut rows, "parse_cache_misses", cache.misses);
    kv(&mut rows, "parse_cache_entries", cache.entries);
    kv(&mut rows, "config_reloads_ok", reload_ok);
    kv(&mut rows, "config_reloads_error", reload_err);
    kv(&mut rows, "client_connections", shared.client_count());
    table(out, &["stat", "value"], rows);
}

/// PAUSE (see [`crate::pause`]): answers once no server connection is in use.
async fn pause(shared: &Shared, out: &mut BytesMut) {
    if !shared.pause.pause() {
        return error(
            out,
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pgfresh is already paused",
        );
    }
    tracing::warn!(
        in_use = shared.pools.lent_now(),
        "console PAUSE: holding new units until RESUME; waiting for the server connections in use"
    );
    match crate::pause::drain(shared).await {
        crate::pause::Paused::Drained { closed } => {
            tracing::warn!(
                closed,
                "paused: no server connection in use, pooled ones closed"
            );
            notice(
                out,
                format!("no server connection in use; {closed} pooled closed"),
            );
            out.extend_from_slice(&build::command_complete("PAUSE"));
        }
        crate::pause::Paused::Resumed => error(
            out,
            sqlstate::QUERY_CANCELED,
            "RESUME came before every server connection in use was given back",
        ),
    }
}

fn reload(shared: &Shared, out: &mut BytesMut) {
    match crate::reload_config(shared, "console") {
        Ok(outcome) => {
            let keys = |v: &[pgfresh_config::ChangedKey]| {
                v.iter()
                    .map(|k| k.key.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if outcome.applied.is_empty() && outcome.pending_restart.is_empty() {
                notice(out, "config file unchanged");
            }
            if !outcome.applied.is_empty() {
                notice(out, format!("applied: {}", keys(&outcome.applied)));
            }
            if !outcome.pending_restart.is_empty() {
                notice(
                    out,
                    format!(
                        "changed but needs a restart (old value stays): {}",
                        keys(&outcome.pending_restart)
                    ),
                );
            }
            out.extend_from_slice(&build::command_complete("RELOAD"));
        }
        Err(e) => {
            error(
                out,
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("reload rejected, nothing changed: {e}"),
            );
        }
    }
}
