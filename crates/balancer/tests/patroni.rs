//! Nodes watched through Patroni's REST API: each node is a small HTTP server answering
//! `GET /patroni` with a member status document the test changes over time. A leader and
//! two streaming replicas; a paused replica and a lagging one leave the pool and return; a
//! node whose API fails is down; a switchover makes a replica the leader. No PostgreSQL is
//! involved.

#[allow(dead_code)] // each test binary uses part of the shared helpers
mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use pgfresh_balancer::{Balancer, ClusterEvent, Ineligible, MonitorSettings, NodeSpec, Role};
use pgfresh_lsn::Lsn;
use serde_json::json;
use tokio::net::TcpListener;

use common::{until, DEADLINE};

const MB: u64 = 1024 * 1024;

/// One node's fake Patroni REST API.
struct FakePatroni {
    addr: SocketAddr,
    answer: Arc<Mutex<(StatusCode, String)>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakePatroni {
    async fn start(body: String) -> FakePatroni {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answer = Arc::new(Mutex::new((StatusCode::OK, body)));
        let shared = answer.clone();
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let answer = shared.clone();
                let service = service_fn(move |req: Request<Incoming>| {
                    let (status, body) = if req.uri().path() == "/patroni" {
                        answer.lock().unwrap().clone()
                    } else {
                        (StatusCode::NOT_FOUND, String::new())
                    };
                    async move {
                        let mut response = Response::new(Full::new(Bytes::from(body)));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(async move {
                    // A connection ends when the monitor drops it; that is not an error here.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakePatroni {
            addr,
            answer,
            server,
        }
    }

    fn set(&self, body: String) {
        *self.answer.lock().unwrap() = (StatusCode::OK, body);
    }

    fn fail(&self, status: StatusCode, body: &str) {
        *self.answer.lock().unwrap() = (status, body.to_string());
    }
}

impl Drop for FakePatroni {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn leader(location: u64, timeline: u32) -> String {
    json!({
        "state": "running",
        "postmaster_start_time": "2024-05-01 10:00:00.000000+00:00",
        "role": "primary",
        "server_version": 160002,
        "xlog": {"location": location},
        "timeline": timeline,
        "patroni": {"version": "4.0.4", "scope": "test"}
    })
    .to_string()
}

fn replica(replayed: u64, paused: bool, timeline: u32) -> String {
    json!({
        "state": "running",
        "role": "replica",
        "server_version": 160002,
        "xlog": {
            "received_location": replayed,
            "replayed_location": replayed,
            "replayed_timestamp": null,
            "paused": paused
        },
        "timeline": timeline,
        "replication_state": "streaming"
    })
    .to_string()
}

fn specs(nodes: &[FakePatroni]) -> Vec<NodeSpec> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| NodeSpec {
            name: format!("pg{i}"),
            // Not used for a node watched through Patroni: nothing listens here.
            host: "127.0.0.1".to_string(),
            port: 1,
            weight: 1,
            patroni_url: Some(format!("http://{}", n.addr)),
            tls: Default::default(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_lag_and_switchover_from_patroni() {
    let base = 0x300_0000;
    let nodes = [
        FakePatroni::start(leader(base, 3)).await,
        FakePatroni::start(replica(base, false, 3)).await,
        FakePatroni::start(replica(base, false, 3)).await,
    ];
    let settings = MonitorSettings {
        sr_check_period: Duration::from_millis(20),
        health_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        delay_threshold_bytes: Some(MB),
        ..MonitorSettings::default()
    };
    let b = Balancer::start(specs(&nodes), settings);
    assert!(b.wait_ready(tokio::time::Instant::now() + DEADLINE).await);

    // A leader and two streaming replicas.
    let v = until(&b, "initial roles", |v| {
        v.primary == Some(0) && v.nodes[1].eligible && v.nodes[2].eligible
    })
    .await;
    assert_eq!(v.nodes[0].role, Role::Primary);
    assert_eq!(v.nodes[0].current_lsn, Some(Lsn(base)));
    assert_eq!(v.nodes[0].ineligible_reason, Some(Ineligible::NotStandby));
    assert_eq!(v.primary_lsn, Some(Lsn(base)));
    for r in 1..3 {
        let n = &v.nodes[r];
        assert_eq!(n.role, Role::Standby);
        assert!(n.healthy && n.streaming && !n.paused);
        assert_eq!(n.replay_lsn, Some(Lsn(base)));
        assert_eq!(n.receive_lsn, Some(Lsn(base)));
        assert_eq!(n.timeline, Some(3));
        assert_eq!(n.lag_bytes, Some(0));
        assert_eq!(n.lag_ms, Some(0));
    }
    let mut events = b.subscribe();

    // The leader writes 4 MB; node 1 is paused where it was, node 2 keeps up.
    let written = base + 4 * MB;
    nodes[1].set(replica(base, true, 3));
    nodes[2].set(replica(written, false, 3));
    nodes[0].set(leader(written, 3));
    let v = until(&b, "node 1 paused and out", |v| {
        v.nodes[1].ineligible_reason == Some(Ineligible::Paused)
            && v.nodes[2].replay_lsn == Some(Lsn(written))
            && v.primary_lsn == Some(Lsn(written))
    })
    .await;
    assert!(v.nodes[1].paused);
    assert_eq!(v.nodes[1].lag_bytes, Some(4 * MB));
    assert!(v.nodes[2].eligible);
    assert_eq!(v.eligible().collect::<Vec<_>>(), vec![2]);
    for _ in 0..20 {
        assert_eq!(b.select_replica(None).map(|s| s.node()), Some(2));
    }

    // Node 1 resumes but is 2 MB behind: out on lag until it catches up.
    nodes[1].set(replica(written - 2 * MB, false, 3));
    until(&b, "node 1 lagging", |v| {
        v.nodes[1].ineligible_reason == Some(Ineligible::LaggingBytes)
    })
    .await;
    nodes[1].set(replica(written, false, 3));
    let v = until(&b, "node 1 back", |v| v.nodes[1].eligible).await;
    assert_eq!(v.nodes[1].lag_bytes, Some(0));

    // A failing API is a failed poll: an error status, then a body that is no status.
    nodes[2].fail(StatusCode::SERVICE_UNAVAILABLE, "{}");
    let v = until(&b, "node 2 down on 503", |v| {
        v.nodes[2].ineligible_reason == Some(Ineligible::Down)
    })
    .await;
    assert_eq!(v.nodes[2].role, Role::Unknown);
    assert!(v.nodes[2].last_error.as_deref().unwrap().contains("503"));
    nodes[2].set(replica(written, false, 3));
    until(&b, "node 2 back", |v| v.nodes[2].eligible).await;
    nodes[2].fail(StatusCode::OK, "<html>proxy error</html>");
    let v = until(&b, "node 2 down on garbage", |v| !v.nodes[2].healthy).await;
    assert!(v.nodes[2]
        .last_error
        .as_deref()
        .unwrap()
        .contains("unexpected Patroni status document"));
    nodes[2].set(replica(written, false, 3));
    until(&b, "node 2 back again", |v| v.nodes[2].eligible).await;

    // Switchover: node 1 becomes the leader on timeline 4, node 0 a replica following it.
    let promoted = written + 0x1000;
    nodes[1].set(leader(promoted, 4));
    nodes[0].set(replica(promoted, false, 4));
    nodes[2].set(replica(promoted, false, 4));
    let v = until(&b, "node 1 leads, the others follow", |v| {
        v.primary == Some(1)
            && v.nodes[0].eligible
            && v.nodes[2].eligible
            && v.nodes[0].timeline == Some(4)
            && v.nodes[2].timeline == Some(4)
    })
    .await;
    assert_eq!(v.nodes[1].role, Role::Primary);
    assert_eq!(v.nodes[1].ineligible_reason, Some(Ineligible::NotStandby));
    assert_eq!(v.nodes[0].role, Role::Standby);
    assert_eq!(v.primary_lsn, Some(Lsn(promoted)));
    assert_eq!(v.nodes[0].lag_bytes, Some(0));
    let node = b
        .wait_for(Lsn(promoted), tokio::time::Instant::now() + DEADLINE)
        .await
        .unwrap();
    assert!(node == 0 || node == 2, "{node}");

    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    for want in [
        ClusterEvent::EligibilityChanged {
            node: 1,
            eligible: false,
            reason: Some(Ineligible::Paused),
        },
        ClusterEvent::EligibilityChanged {
            node: 1,
            eligible: false,
            reason: Some(Ineligible::LaggingBytes),
        },
        ClusterEvent::EligibilityChanged {
            node: 1,
            eligible: true,
            reason: None,
        },
        ClusterEvent::RoleChanged {
            node: 2,
            from: Role::Standby,
            to: Role::Unknown,
        },
        ClusterEvent::RoleChanged {
            node: 0,
            from: Role::Primary,
            to: Role::Standby,
        },
        ClusterEvent::RoleChanged {
            node: 1,
            from: Role::Standby,
            to: Role::Primary,
        },
    ] {
        assert!(seen.contains(&want), "missing {want:?} in {seen:#?}");
    }
    // The write target moved from node 0 to node 1 (directly, or through a moment with
    // none when node 0's demotion was seen first) and never named anyone else.
    let primaries: Vec<_> = seen
        .iter()
        .filter_map(|e| match e {
            ClusterEvent::PrimaryChanged { from, to } => Some((*from, *to)),
            _ => None,
        })
        .collect();
    assert!(
        primaries == [(Some(0), Some(1))] || primaries == [(Some(0), None), (None, Some(1))],
        "{primaries:?}"
    );
    b.shutdown();
}

#[tokio::test]
async fn unusable_url_and_unreachable_api_are_failed_polls() {
    // A port bound and never listened on, held for the whole test: connections to it are
    // refused, and no other test's server can be given it meanwhile (a port freed again
    // could be: the other test's mock API then answered for this node).
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let closed = held.local_addr().unwrap();
    let spec = |name: &str, url: String| NodeSpec {
        name: name.to_string(),
        host: "127.0.0.1".to_string(),
        port: 1,
        weight: 1,
        patroni_url: Some(url),
        tls: Default::default(),
    };
    let b = Balancer::start(
        vec![
            spec("tls", "https://127.0.0.1:8008".to_string()),
            spec("gone", format!("http://{closed}")),
        ],
        MonitorSettings {
            sr_check_period: Duration::from_millis(20),
            health_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(500),
            ..MonitorSettings::default()
        },
    );
    assert!(b.wait_ready(tokio::time::Instant::now() + DEADLINE).await);
    let v = until(&b, "errors on both nodes", |v| {
        v.nodes.iter().all(|n| n.last_error.is_some())
    })
    .await;
    assert!(v.nodes[0]
        .last_error
        .as_deref()
        .unwrap()
        .contains("https is not supported"));
    assert!(v.nodes[1]
        .last_error
        .as_deref()
        .unwrap()
        .starts_with("request failed"));
    for n in &v.nodes {
        assert_eq!(n.role, Role::Unknown);
        assert_eq!(n.ineligible_reason, Some(Ineligible::Down));
    }
    assert_eq!(v.primary, None);
    b.shutdown();
}
