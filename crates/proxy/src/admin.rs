//! The admin HTTP listener (`proxy.admin_listen`): Prometheus metrics, status and
//! config as JSON, the external-controller endpoints, and a small self-refreshing
//! status page.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/` | the status page (self-contained HTML) |
//! | GET | `/metrics` | Prometheus text exposition |
//! | GET | `/v1/status` | nodes, TTL and its source, hot relations, routing counters |
//! | GET | `/v1/config` | the effective config, secrets redacted |
//! | GET | `/v1/dependencies` | the dependency graph of every database loaded so far |
//! | PUT | `/v1/config/recent_access_ttl_ms` | `{"value": N}`: set the recency TTL (clamped) |
//! | PUT | `/v1/lag` | `{"lag_ms": N, "node": "name"?, "source": "text"?}`: push an external lag |
//!
//! With `proxy.admin_token` set, every PUT and `/v1/status`, `/v1/config` and
//! `/v1/dependencies` need `Authorization: Bearer <token>`; without it they answer 401.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::context::Shared;
use crate::Proxy;

/// Where the TTL in force came from.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TtlSource {
    /// `"file"` (startup or a reload that changed the key) or `"api"`.
    pub source: &'static str,
    /// Unix milliseconds.
    pub set_at_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl TtlSource {
    /// Set now by `source` ("file", "api" or "console").
    pub fn new(source: &'static str) -> Self {
        Self {
            source,
            set_at_ms: now_ms(),
        }
    }
    pub fn file() -> Self {
        Self {
            source: "file",
            set_at_ms: now_ms(),
        }
    }
    pub fn api() -> Self {
        Self {
            source: "api",
            set_at_ms: now_ms(),
        }
    }
}

/// The process-wide Prometheus recorder (installed on first use).
pub fn metrics_handle() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| match PrometheusBuilder::new().install_recorder() {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "cannot install the metrics recorder");
                None
            }
        })
        .as_ref()
}

/// Serve the admin API on `listener` for as long as the proxy runs.
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    let _ = metrics_handle();
    let mut stop = proxy.shared.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let sock = match accepted {
            Ok((sock, _)) => sock,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            // admin_tls: the client certificate of [tls] serves the API too.
            let acceptor = proxy.shared.config.snapshot().proxy.admin_tls.then(|| {
                proxy
                    .shared
                    .client_tls
                    .active()
                    .and_then(|t| t.acceptor.clone())
            });
            // The admin API stays on tokio whatever `io_engine` says.
            let sock = pgfresh_nodetls::Tcp::Epoll(sock);
            let stream = match acceptor {
                None => crate::tls::ClientStream::Plain(sock),
                Some(None) => {
                    tracing::warn!(
                        "admin_tls is on but no certificate is loaded; connection refused"
                    );
                    return;
                }
                Some(Some(acceptor)) => match acceptor.accept(sock).await {
                    Ok(s) => crate::tls::ClientStream::Tls(Box::new(s)),
                    Err(e) => {
                        tracing::debug!(error = %e, "admin TLS handshake failed");
                        return;
                    }
                },
            };
            let svc = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(handle(req, &proxy).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .header("cache-control", "no-store")
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn json_reply(status: StatusCode, v: Value) -> Response<Full<Bytes>> {
    reply(status, "application/json", v.to_string())
}

fn error(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    json_reply(status, json!({ "error": msg }))
}

/// Compares without stopping at the first differing byte, so response timing does
/// not reveal how much of a guessed token was right.
fn token_matches(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

fn authorized(req: &Request<Incoming>, token: Option<&str>) -> bool {
    let Some(token) = token else {
        return true;
    };
    req.headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| token_matches(t.trim(), token))
}

const ENDPOINTS: &[(&str, &[Method])] = &[
    ("/", &[Method::GET]),
    ("/metrics", &[Method::GET]),
    ("/v1/status", &[Method::GET]),
    ("/v1/config", &[Method::GET]),
    ("/v1/dependencies", &[Method::GET]),
    ("/v1/config/recent_access_ttl_ms", &[Method::PUT]),
    ("/v1/lag", &[Method::PUT]),
];

async fn handle(req: Request<Incoming>, proxy: &Proxy) -> Response<Full<Bytes>> {
    let config = proxy.shared.config.snapshot();
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let Some((_, methods)) = ENDPOINTS.iter().find(|(p, _)| *p == path) else {
        return error(StatusCode::NOT_FOUND, "no such endpoint");
    };
    let allowed =
        methods.contains(&method) || (method == Method::HEAD && methods.contains(&Method::GET));
    if !allowed {
        return error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed here");
    }
    let needs_auth = method == Method::PUT
        || path == "/v1/status"
        || path == "/v1/config"
        || path == "/v1/dependencies";
    if needs_auth && !authorized(&req, config.proxy.admin_token.as_deref()) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    match (method, path.as_str()) {
        (_, "/metrics") => {
            refresh_metrics(&proxy.shared);
            let text = metrics_handle().map(|h| h.render()).unwrap_or_default();
            reply(StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        (_, "/v1/status") => json_reply(StatusCode::OK, status_json(proxy)),
        (_, "/v1/dependencies") => {
            json_reply(StatusCode::OK, crate::deps::report_json(&proxy.shared.deps))
        }
        (_, "/v1/config") => json_reply(
            StatusCode::OK,
            serde_json::to_value(pgfresh_config::redacted(&config)).unwrap_or(Value::Null),
        ),
        (_, "/v1/config/recent_access_ttl_ms") => match read_value(req).await {
            Ok(v) => {
                let (ttl, previous) = set_ttl(&proxy.shared, v, "api");
                json_reply(
                    StatusCode::OK,
                    json!({
                        "recent_access_ttl_ms": ttl,
                        "previous": previous,
                        "requested": v,
                        "clamped": ttl != v,
                        "source": "api",
                    }),
                )
            }
            Err(msg) => error(StatusCode::BAD_REQUEST, &msg),
        },
        (_, "/v1/lag") => match read_json(req).await {
            Ok(body) => push_lag(proxy, &body),
            Err(msg) => error(StatusCode::BAD_REQUEST, &msg),
        },
        _ => reply(StatusCode::OK, "text/html; charset=utf-8", STATUS_PAGE),
    }
}

/// Set the recency TTL in memory (clamped to `recent_access_max_ttl_ms`), apply it to
/// the running parts and log it with its source. Returns (TTL now in force, TTL before).
/// Used by the HTTP API and the admin console.
pub fn set_ttl(shared: &Shared, requested: u64, source: &'static str) -> (u64, u64) {
    let before = shared.config.snapshot().routing.recent_access_ttl_ms;
    let after = shared.config.update(|c| {
        c.routing.recent_access_ttl_ms = requested.min(c.routing.recent_access_max_ttl_ms);
    });
    let applied = after.routing.recent_access_ttl_ms;
    // The source first: whoever sees the new TTL also sees where it came from.
    shared.ttl_source.store(Arc::new(TtlSource::new(source)));
    Proxy::apply_config(shared);
    metrics::gauge!("pgfresh_recent_access_ttl_ms").set(shared.recency.ttl_ms() as f64);
    tracing::info!(
        ttl_ms = applied,
        previous_ms = before,
        requested_ms = requested,
        source,
        "recent_access_ttl_ms changed"
    );
    (applied, before)
}

fn push_lag(proxy: &Proxy, body: &Value) -> Response<Full<Bytes>> {
    const USAGE: &str =
        "body must be {\"lag_ms\": N, \"node\": \"name\" (optional, default: the whole pool), \"source\": \"text\" (optional)}";
    let Some(lag) = body.get("lag_ms").and_then(Value::as_u64) else {
        return error(StatusCode::BAD_REQUEST, USAGE);
    };
    let (target, node) = match body.get("node") {
        None | Some(Value::Null) => (pgfresh_balancer::LagTarget::Pool, None),
        Some(Value::String(name)) => match proxy
            .shared
            .balancer
            .view()
            .nodes
            .iter()
            .position(|n| &n.spec.name == name && !n.retired)
        {
            Some(i) => (pgfresh_balancer::LagTarget::Node(i), Some(name.clone())),
            None => return error(StatusCode::BAD_REQUEST, &format!("unknown node {name:?}")),
        },
        Some(_) => return error(StatusCode::BAD_REQUEST, USAGE),
    };
    let source = match body.get("source") {
        None | Some(Value::Null) => "api".to_string(),
        Some(Value::String(s)) if s.len() <= 200 => s.clone(),
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "source must be a string of at most 200 bytes",
            )
        }
    };
    tracing::info!(lag_ms = lag, node = node.as_deref().unwrap_or("<pool>"), source = %source, "external lag pushed");
    proxy
        .shared
        .balancer
        .push_external_lag(target, lag, source.clone());
    json_reply(
        StatusCode::OK,
        json!({ "accepted": true, "lag_ms": lag, "node": node, "source": source }),
    )
}

async fn read_json(req: Request<Incoming>) -> Result<Value, String> {
    let body = Limited::new(req.into_body(), 64 * 1024)
        .collect()
        .await
        .map_err(|e| format!("cannot read body: {e}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| format!("invalid JSON: {e}"))
}

async fn read_value(req: Request<Incoming>) -> Result<u64, String> {
    let v = read_json(req).await?;
    v.get("value")
        .and_then(Value::as_u64)
        .ok_or_else(|| "body must be {\"value\": N} with N a non-negative integer".to_string())
}

/// Publish values that live in the proxy's own structures (not recorded as they
/// happen) just before `/metrics` renders them.
fn refresh_metrics(shared: &Shared) {
    let cache = shared.analyzer.cache_stats();
    metrics::counter!("pgfresh_parse_cache_hits_total").absolute(cache.hits);
    metrics::counter!("pgfresh_parse_cache_misses_total").absolute(cache.misses);
    metrics::gauge!("pgfresh_parse_cache_entries").set(cache.entries as f64);
    metrics::gauge!("pgfresh_parse_cache_bytes").set(cache.weighted_bytes as f64);
    let rec = shared.recency.stats();
    metrics::counter!("pgfresh_recency_marks_total").absolute(rec.marks);
    metrics::counter!("pgfresh_recency_hits_total").absolute(rec.hits);
    metrics::counter!("pgfresh_recency_expirations_total").absolute(rec.expirations);
    metrics::counter!("pgfresh_recency_overflows_total").absolute(rec.overflows);
    metrics::gauge!("pgfresh_hot_relations").set(shared.recency.len() as f64);
    metrics::gauge!("pgfresh_recent_access_ttl_ms").set(shared.recency.ttl_ms() as f64);
    metrics::gauge!("pgfresh_primary_fallbacks_in_flight").set(
        shared
            .fallbacks_in_flight
            .load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    for p in pool_rows(shared) {
        metrics::gauge!("pgfresh_server_connections", "node" => p.node.clone(), "state" => "active")
            .set(p.active as f64);
        metrics::gauge!("pgfresh_server_connections", "node" => p.node, "state" => "idle")
            .set(p.idle as f64);
    }
}

/// One server connection pool, as shown by `/v1/status` and `SHOW POOLS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolRow {
    pub node: String,
    pub user: String,
    pub database: String,
    /// Connections lent to client sessions now.
    pub active: usize,
    /// Connections open and waiting in the pool.
    pub idle: usize,
    /// Connections that may still be opened or lent.
    pub free: usize,
    pub pool_size: usize,
    /// Clients waiting for a connection now, and the longest current wait.
    pub waiting: usize,
    pub max_wait: std::time::Duration,
    pub mode: &'static str,
}

/// Every pool with its counts, in (node, user, database) order.
pub fn pool_rows(shared: &Shared) -> Vec<PoolRow> {
    let config = shared.config.snapshot();
    let size = config.pool.pool_size;
    let mut rows: Vec<PoolRow> = shared
        .pools
        .counts()
        .into_iter()
        .map(|c| PoolRow {
            node: config
                .nodes
                .get(c.node)
                .map(|n| n.name.clone())
                .unwrap_or_else(|| format!("#{}", c.node)),
            user: c.user,
            database: c.database,
            active: c.lent,
            idle: c.idle,
            free: c.free,
            pool_size: size,
            waiting: c.waiting,
            max_wait: c.max_wait,
            mode: config.pool.pool_mode.as_str(),
        })
        .collect();
    rows.sort_by(|a, b| (&a.node, &a.user, &a.database).cmp(&(&b.node, &b.user, &b.database)));
    rows
}

/// Routing reasons that stand for a read that a replica could have served; the
/// offload ratio is replica-routed statements over these.
pub const READ_REASONS: &[&str] = &[
    "replica",
    "read_only_txn",
    "hot_relation",
    "hot_relation_lsn",
    "read_only_snapshot",
    "token",
    "token_primary",
    "no_eligible_replica",
    "wal_feed",
];

/// One sample of a Prometheus text exposition: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

/// The samples of metric `name` in Prometheus text `text` (comments skipped).
pub fn samples(text: &str, name: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = if let Some(inner) = rest.strip_prefix('{') {
                let (labels, after) = parse_labels(inner)?;
                (labels, after)
            } else if rest.starts_with(' ') {
                (BTreeMap::new(), rest)
            } else {
                return None;
            };
            let value = value.split_whitespace().next()?.parse::<f64>().ok()?;
            Some((labels, value))
        })
        .collect()
}

/// Parse `k="v",k2="v2"}` (the part after `{`); returns the labels and the rest of the line.
fn parse_labels(s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_string();
        let mut chars = rest[eq + 1..].char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in chars {
            match (escaped, c) {
                (true, 'n') => {
                    value.push('\n');
                    escaped = false;
                }
                (true, c) => {
                    value.push(c);
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        labels.insert(key, value);
        rest = &rest[end?..];
    }
}

/// Routing counters summarised from a Prometheus text exposition: per (target, reason)
/// counts, reads, replica reads and the offload ratio, fallbacks by reason, and reads
/// forced to the primary by recency.
pub fn routing_summary(text: &str) -> Value {
    let mut by: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (labels, v) in samples(text, "pgfresh_routed_total") {
        let target = labels.get("target").cloned().unwrap_or_default();
        let reason = labels.get("reason").cloned().unwrap_or_default();
        *by.entry((target, reason)).or_default() += v as u64;
    }
    let total: u64 = by.values().sum();
    let to = |t: &str| -> u64 { by.iter().filter(|((x, _), _)| x == t).map(|(_, v)| v).sum() };
    let reads: u64 = by
        .iter()
        .filter(|((_, r), _)| READ_REASONS.contains(&r.as_str()))
        .map(|(_, v)| v)
        .sum();
    let replica_reads = to("replica");
    let forced: u64 = by
        .iter()
        .filter(|((t, r), _)| t == "primary" && r.starts_with("hot_relation"))
        .map(|(_, v)| v)
        .sum();
    let mut fallbacks = serde_json::Map::new();
    for (labels, v) in samples(text, "pgfresh_primary_fallbacks_total") {
        let reason = labels.get("reason").cloned().unwrap_or_default();
        let slot = fallbacks.entry(reason).or_insert(json!(0u64));
        *slot = json!(slot.as_u64().unwrap_or(0) + v as u64);
    }
    let by_reason: Vec<Value> = by
        .iter()
        .map(|((t, r), v)| json!({ "target": t, "reason": r, "count": v }))
        .collect();
    json!({
        "total": total,
        "primary": to("primary"),
        "replica": replica_reads,
        "reads": reads,
        "offload_ratio": if reads == 0 { Value::Null } else { json!(replica_reads as f64 / reads as f64) },
        "forced_by_recency": forced,
        "primary_fallbacks": fallbacks,
        "by_reason": by_reason,
    })
}

fn node_json(n: &pgfresh_balancer::NodeStatus) -> Value {
    let external = n.external_lag.as_ref().map(|e| {
        json!({ "lag_ms": e.lag_ms, "source": e.source, "age_ms": e.received.elapsed().as_millis() as u64 })
    });
    json!({
        "name": n.spec.name,
        "host": n.spec.host,
        "port": n.spec.port,
        "weight": n.spec.weight,
        "role": n.role.as_str(),
        "healthy": n.healthy,
        "current_lsn": n.current_lsn.map(|l| l.to_string()),
        "replay_lsn": n.replay_lsn.map(|l| l.to_string()),
        "receive_lsn": n.receive_lsn.map(|l| l.to_string()),
        "lag_bytes": n.lag_bytes,
        "lag_ms": n.lag_ms,
        "external_lag": external,
        "paused": n.paused,
        "streaming": n.streaming,
        "timeline": n.timeline,
        "in_pool": n.eligible,
        "not_in_pool_reason": n.ineligible_reason.map(|r| r.as_str()),
        "outstanding": n.outstanding,
        "last_poll_age_ms": n.last_poll_ok.map(|t| t.elapsed().as_millis() as u64),
        "last_error": n.last_error,
        "server_tls_sslmode": n.spec.tls.mode.as_str(),
        "monitor_tls": n.tls,
    })
}

/// The JSON of `GET /v1/status`, also read by the status page.
pub fn status_json(proxy: &Proxy) -> Value {
    let shared = &proxy.shared;
    let view = shared.balancer.view_now();
    let nodes: Vec<Value> = view.nodes.iter().map(node_json).collect();
    let stats = shared.recency.stats();
    let hot: Vec<Value> = shared
        .recency
        .hot_relations(None, 20)
        .into_iter()
        .map(|h| json!({ "database": h.db, "relation": h.relation, "age_ms": h.age_ms, "writes": h.writes, "hits": h.hits }))
        .collect();
    // The TTL before its source: a reload stores the source first, so whoever reads a
    // new TTL here also reads where it came from.
    let ttl = shared.recency.ttl_ms();
    let source = proxy.shared.ttl_source.load();
    let config = shared.config.snapshot();
    let (reloads_ok, reloads_err) = shared.config.reload_counts();
    let cache = shared.analyzer.cache_stats();
    let prom = metrics_handle().map(|h| h.render()).unwrap_or_default();
    let pools: Vec<Value> = pool_rows(shared)
        .into_iter()
        .map(|p| json!({ "node": p.node, "user": p.user, "database": p.database, "active": p.active, "idle": p.idle, "waiting": p.waiting, "max_wait_ms": p.max_wait.as_millis() as u64, "pool_size": p.pool_size, "pool_mode": p.mode }))
        .collect();
    json!({
        "nodes": nodes,
        "primary": view.primary.and_then(|p| view.nodes.get(p)).map(|n| n.spec.name.clone()),
        "max_lag_bytes": view.max_lag_bytes,
        "max_lag_ms": view.max_lag_ms,
        "pool_external_lag": view.pool_external_lag.as_ref().map(|e| json!({ "lag_ms": e.lag_ms, "source": e.source, "age_ms": e.received.elapsed().as_millis() as u64 })),
        "recent_access_ttl_ms": ttl,
        "recent_access_max_ttl_ms": shared.recency.max_ttl_ms(),
        "enable_recent_access_routing": config.routing.enable_recent_access_routing,
        "ttl_source": source.source,
        "ttl_set_at_ms": source.set_at_ms,
        "hot_relation_count": shared.recency.len(),
        "hot_relations": hot,
        "recency": {
            "marks": stats.marks,
            "hits": stats.hits,
            "expirations": stats.expirations,
            "overflows": stats.overflows,
        },
        "routing": routing_summary(&prom),
        "primary_fallbacks_in_flight": shared.fallbacks_in_flight.load(std::sync::atomic::Ordering::Relaxed),
        "parse_cache": { "hits": cache.hits, "misses": cache.misses, "entries": cache.entries },
        "config_reloads": { "ok": reloads_ok, "error": reloads_err },
        "pools": pools,
        "paused": shared.pause.is_paused(),
        "clients": shared.client_count(),
        "wal_feed": {
            "mode": config.routing.wal_feed.as_str(),
            "databases": shared.wal_feeds.all().iter().map(|f| json!({
                "database": f.db,
                "streaming": f.streaming(),
                "position": f.position().to_string(),
                "commits": f.commits(),
                "error": f.error(),
            })).collect::<Vec<_>>(),
        },
    })
}

const STATUS_PAGE: &str = include_str!("status.html");

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE pgfresh_routed_total counter\n\
        pgfresh_routed_total{target=\"replica\",reason=\"replica\"} 6\n\
        pgfresh_routed_total{target=\"primary\",reason=\"hot_relation\"} 2\n\
        pgfresh_routed_total{target=\"primary\",reason=\"no_eligible_replica\"} 2\n\
        pgfresh_routed_total{target=\"primary\",reason=\"write\"} 10\n\
        pgfresh_routed_total_other 99\n\
        pgfresh_primary_fallbacks_total{reason=\"no_eligible_replica\"} 2\n\
        pgfresh_hot_relations 3\n";

    #[test]
    fn samples_parse_labels_and_values() {
        let s = samples(TEXT, "pgfresh_routed_total");
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].0.get("target").map(String::as_str), Some("replica"));
        assert_eq!(s[0].1, 6.0);
        let hot = samples(TEXT, "pgfresh_hot_relations");
        assert_eq!(hot, vec![(BTreeMap::new(), 3.0)]);
    }

    #[test]
    fn label_values_unescape() {
        let s = samples("m{a=\"x\\\"y\",b=\"c\\\\d\"} 1\n", "m");
        assert_eq!(s[0].0["a"], "x\"y");
        assert_eq!(s[0].0["b"], "c\\d");
        assert!(samples("m{a=\"unterminated} 1\n", "m").is_empty());
    }

    #[test]
    fn routing_summary_computes_offload_and_forced() {
        let v = routing_summary(TEXT);
        assert_eq!(v["total"], 20);
        assert_eq!(v["reads"], 10);
        assert_eq!(v["replica"], 6);
        assert_eq!(v["forced_by_recency"], 2);
        assert_eq!(v["offload_ratio"], 0.6);
        assert_eq!(v["primary_fallbacks"]["no_eligible_replica"], 2);
        assert_eq!(routing_summary("")["offload_ratio"], Value::Null);
    }

    #[test]
    fn token_comparison() {
        assert!(token_matches("s3cret", "s3cret"));
        assert!(!token_matches("s3cre", "s3cret"));
        assert!(!token_matches("s3cret!", "s3cret"));
        assert!(!token_matches("", "s3cret"));
        assert!(!token_matches("S3cret", "s3cret"));
    }
}
