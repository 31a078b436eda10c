//! The admin console: the virtual database `pgfresh`, for users with `admin = true`.
//! Speaks the simple query protocol; answers SHOW NODES, SHOW POOLS, SHOW HOT,
//! SHOW CONFIG, SHOW STATS, RELOAD and SET recent_access_ttl_ms = N.

use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use pgfresh_wire::{
    build, parse_frontend, sqlstate, ErrorResponse, FrontendMessage, Limits, TxStatus,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::client::Login;
use crate::context::Shared;
use crate::io::{read_frame, Side};

fn row_description(out: &mut BytesMut, cols: &[&str]) {
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

fn data_row(out: &mut BytesMut, values: &[String]) {
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

pub async fn run(mut sock: TcpStream, mut buf: BytesMut, shared: Arc<Shared>, login: Login) {
    if !login.user.admin {
        let e = ErrorResponse::fatal(
            sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            format!(
                "user \"{}\" may not open the admin console",
                login.user.name
            ),
        );
        let _ = sock.write_all(&e.to_bytes()).await;
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
    if sock.write_all(&out).await.is_err() {
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
            Ok(FrontendMessage::Query { sql }) => answer(&shared, sql, &mut out),
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
                return;
            }
        }
        out.extend_from_slice(&build::ready_for_query(TxStatus::Idle));
        if sock.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// Answer one console command into `out`.
pub fn answer(shared: &Shared, sql: &str, out: &mut BytesMut) {
    let cmd = sql.trim().trim_end_matches(';').trim().to_ascii_lowercase();
    let words: Vec<&str> = cmd.split_whitespace().collect();
    match words.as_slice() {
        ["show", "nodes"] => {
            let view = shared.balancer.view();
            let rows = view
                .nodes
                .iter()
                .map(|n| {
                    vec![
                        n.spec.name.clone(),
                        format!("{}:{}", n.spec.host, n.spec.port),
                        n.role.as_str().to_string(),
                        n.healthy.to_string(),
                        n.replay_lsn.map(|l| l.to_string()).unwrap_or_default(),
                        n.lag_bytes.map(|l| l.to_string()).unwrap_or_default(),
                        n.lag_ms.map(|l| l.to_string()).unwrap_or_default(),
                        if n.eligible { "in".into() } else { n.ineligible_reason.map(|r| r.as_str()).unwrap_or("-").into() },
                    ]
                })
                .collect();
            table(out, &["name", "address", "role", "healthy", "replay_lsn", "lag_bytes", "lag_ms", "read_pool"], rows);
        }
        ["show", "pools"] => {
            let config = shared.config.snapshot();
            let rows = shared
                .pools
                .counts()
                .into_iter()
                .map(|(node, user, db, idle, free)| {
                    let name = config.nodes.get(node).map(|n| n.name.clone()).unwrap_or_default();
                    vec![name, user, db, idle.to_string(), free.to_string()]
                })
                .collect();
            table(out, &["node", "user", "database", "idle", "free_slots"], rows);
        }
        ["show", "clients"] => {
            table(out, &["clients"], vec![vec![shared.client_count().to_string()]]);
        }
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
        ["show", "stats"] => {
            let s = shared.recency.stats();
            let cache = shared.analyzer.cache_stats();
            let rows = vec![
                vec!["recency_marks".into(), s.marks.to_string()],
                vec!["recency_hits".into(), s.hits.to_string()],
                vec!["recency_expirations".into(), s.expirations.to_string()],
                vec!["recency_overflows".into(), s.overflows.to_string()],
                vec!["parse_cache_hits".into(), cache.hits.to_string()],
                vec!["parse_cache_misses".into(), cache.misses.to_string()],
                vec!["primary_fallbacks_in_flight".into(), shared.fallbacks_in_flight.load(std::sync::atomic::Ordering::Relaxed).to_string()],
            ];
            table(out, &["stat", "value"], rows);
        }
        ["reload"] => match shared.config.reload() {
            Ok(_) => {
                crate::Proxy::apply_config(shared);
                metrics::counter!("pgfresh_config_reloads_total", "result" => "ok").increment(1);
                out.extend_from_slice(&build::command_complete("RELOAD"));
            }
            Err(e) => {
                metrics::counter!("pgfresh_config_reloads_total", "result" => "error").increment(1);
                out.extend_from_slice(&ErrorResponse::error(sqlstate::INVALID_PARAMETER_VALUE, e.to_string()).to_bytes());
            }
        },
        ["set", "recent_access_ttl_ms", rest @ ..] => {
            let value = rest.iter().filter(|w| **w != "=" && **w != "to").map(|w| w.trim_matches('\'')).next();
            match value.and_then(|v| v.parse::<u64>().ok()) {
                Some(v) => {
                    let max = shared.config.snapshot().routing.recent_access_max_ttl_ms;
                    shared.config.update(|c| c.routing.recent_access_ttl_ms = v.min(max));
                    crate::Proxy::apply_config(shared);
                    out.extend_from_slice(&build::command_complete("SET"));
                }
                None => out.extend_from_slice(
                    &ErrorResponse::error(sqlstate::INVALID_PARAMETER_VALUE, "usage: SET recent_access_ttl_ms = N").to_bytes(),
                ),
            }
        }
        _ => out.extend_from_slice(
            &ErrorResponse::error(
                sqlstate::SYNTAX_ERROR,
                format!("unknown console command {sql:?}; try SHOW NODES, SHOW POOLS, SHOW CLIENTS, SHOW HOT, SHOW CONFIG, SHOW STATS, RELOAD, SET recent_access_ttl_ms = N"),
            )
            .to_bytes(),
        ),
    }
}
