//! The admin HTTP listener: Prometheus metrics, status and config as JSON, the
//! external-controller endpoints, and a small self-refreshing status page.

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

use crate::Proxy;

/// Where the TTL in force came from.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TtlSource {
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

pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    let _ = metrics_handle();
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            continue;
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(handle(req, &proxy).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(sock), svc)
                .await;
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn json_reply(status: StatusCode, v: Value) -> Response<Full<Bytes>> {
    reply(status, "application/json", v.to_string())
}

fn error(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    json_reply(status, json!({ "error": msg }))
}

async fn handle(req: Request<Incoming>, proxy: &Proxy) -> Response<Full<Bytes>> {
    let config = proxy.shared.config.snapshot();
    let authorized = match &config.proxy.admin_token {
        None => true,
        Some(token) => req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t == token),
    };
    let needs_auth = req.method() == Method::PUT
        || req.uri().path() == "/v1/status"
        || req.uri().path() == "/v1/config";
    if needs_auth && !authorized {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/metrics") => {
            let text = metrics_handle().map(|h| h.render()).unwrap_or_default();
            reply(StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        (Method::GET, "/v1/status") => json_reply(StatusCode::OK, status_json(proxy)),
        (Method::GET, "/v1/config") => json_reply(
            StatusCode::OK,
            serde_json::to_value(pgfresh_config::redacted(&config)).unwrap_or(Value::Null),
        ),
        (Method::PUT, "/v1/config/recent_access_ttl_ms") => match read_value(req).await {
            Ok(v) => {
                let max = config.routing.recent_access_max_ttl_ms;
                let ttl = v.min(max);
                proxy
                    .shared
                    .config
                    .update(|c| c.routing.recent_access_ttl_ms = ttl);
                Proxy::apply_config(&proxy.shared);
                proxy.ttl_source.store(Arc::new(TtlSource::api()));
                tracing::info!(
                    ttl_ms = ttl,
                    requested = v,
                    source = "api",
                    "recent_access_ttl_ms changed"
                );
                json_reply(
                    StatusCode::OK,
                    json!({ "recent_access_ttl_ms": ttl, "clamped": ttl != v }),
                )
            }
            Err(msg) => error(StatusCode::BAD_REQUEST, &msg),
        },
        (Method::PUT, "/v1/lag") => match read_json(req).await {
            Ok(body) => {
                let Some(lag) = body.get("lag_ms").and_then(Value::as_u64) else {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "body must be {\"lag_ms\": N, \"node\": \"name\"?}",
                    );
                };
                let target = match body.get("node").and_then(Value::as_str) {
                    None => pgfresh_balancer::LagTarget::Pool,
                    Some(name) => match config.nodes.iter().position(|n| n.name == name) {
                        Some(i) => pgfresh_balancer::LagTarget::Node(i),
                        None => return error(StatusCode::BAD_REQUEST, "unknown node"),
                    },
                };
                let source = body
                    .get("source")
                    .and_then(Value::as_str)
                    .unwrap_or("api")
                    .to_string();
                proxy.shared.balancer.push_external_lag(target, lag, source);
                json_reply(StatusCode::OK, json!({ "accepted": true }))
            }
            Err(msg) => error(StatusCode::BAD_REQUEST, &msg),
        },
        (Method::GET, "/") => reply(StatusCode::OK, "text/html; charset=utf-8", STATUS_PAGE),
        _ => error(StatusCode::NOT_FOUND, "no such endpoint"),
    }
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

/// The JSON of `GET /v1/status`, also used by the console and the status page.
pub fn status_json(proxy: &Proxy) -> Value {
    let shared = &proxy.shared;
    let view = shared.balancer.view();
    let nodes: Vec<Value> = view
        .nodes
        .iter()
        .map(|n| {
            json!({
                "name": n.spec.name,
                "host": n.spec.host,
                "port": n.spec.port,
                "role": n.role.as_str(),
                "healthy": n.healthy,
                "replay_lsn": n.replay_lsn.map(|l| l.to_string()),
                "lag_bytes": n.lag_bytes,
                "lag_ms": n.lag_ms,
                "paused": n.paused,
                "in_pool": n.eligible,
                "not_in_pool_reason": n.ineligible_reason.map(|r| r.as_str()),
                "last_error": n.last_error,
            })
        })
        .collect();
    let stats = shared.recency.stats();
    let hot: Vec<Value> = shared
        .recency
        .hot_relations(None, 20)
        .into_iter()
        .map(|h| json!({ "database": h.db, "relation": h.relation, "age_ms": h.age_ms, "writes": h.writes, "hits": h.hits }))
        .collect();
    let source = proxy.ttl_source.load();
    json!({
        "nodes": nodes,
        "primary": view.primary.and_then(|p| view.nodes.get(p)).map(|n| n.spec.name.clone()),
        "recent_access_ttl_ms": shared.recency.ttl_ms(),
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
        "clients": shared.client_count(),
    })
}

const STATUS_PAGE: &str = include_str!("status.html");
