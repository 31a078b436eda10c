//! What lives as long as the fuzzing process: a tokio runtime, the fake nodes, and two
//! proxies in front of them, one per pool mode.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use pgfresh_config::ConfigHandle;
use pgfresh_proxy::{Proxy, Shared, Stop};

use crate::backend::{self, Backend, MONITOR_USER, SERVER_PASSWORD};
use crate::client::Login;

/// The trusted client login.
pub const TRUST: Login = Login {
    user: "app",
    password: None,
};

/// The md5 client login.
pub const MD5: Login = Login {
    user: "app_md5",
    password: Some("client-pw"),
};

/// A proxy running on the harness's runtime.
pub struct RunningProxy {
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
}

pub struct Harness {
    pub rt: tokio::runtime::Runtime,
    pub backend: Backend,
    pub session_pool: RunningProxy,
    pub transaction_pool: RunningProxy,
}

impl Harness {
    pub fn proxy(&self, transaction_pool: bool) -> &RunningProxy {
        if transaction_pool {
            &self.transaction_pool
        } else {
            &self.session_pool
        }
    }

    pub fn proxies(&self) -> [&RunningProxy; 2] {
        [&self.session_pool, &self.transaction_pool]
    }
}

/// The harness, started on first use.
pub fn get() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(start)
}

fn start() -> Harness {
    abort_on_panic();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (backend, session_pool, transaction_pool) = rt.block_on(async {
        let backend = backend::start().await.expect("fake nodes");
        let session_pool = start_proxy(&backend, "session").await;
        let transaction_pool = start_proxy(&backend, "transaction").await;
        (backend, session_pool, transaction_pool)
    });
    for p in [&session_pool, &transaction_pool] {
        wait_until_ready(&p.shared);
    }
    Harness {
        rt,
        backend,
        session_pool,
        transaction_pool,
    }
}

/// A panic in any thread, proxy tasks included, ends the process: tokio would
/// otherwise catch a task's panic and the fuzzer would never see it.
fn abort_on_panic() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        std::process::abort();
    }));
}

fn config_text(backend: &Backend, pool_mode: &str) -> String {
    format!(
        r#"
[proxy]
listen = "127.0.0.1:0"
admin_listen = ""
client_login_timeout_ms = 5000
max_client_connections = 50

[pool]
pool_mode = "{pool_mode}"
pool_size = 4
acquire_timeout_ms = 5000
query_wait_timeout_ms = 5000
connect_timeout_ms = 2000
server_login_timeout_ms = 2000

[monitor]
user = "{MONITOR_USER}"
sr_check_period_ms = 100
# Generous: a node the monitor calls down would fail the checks for nothing when the
# machine is busy.
health_timeout_ms = 10000
connect_timeout_ms = 10000

[routing]
cold_start_ms = 0
learn_dependencies = false
# A small parse cache: memory stays flat over millions of distinct texts, and
# eviction runs.
parse_cache_entries = 1000
parse_cache_bytes = 1048576

[[nodes]]
name = "primary"
host = "127.0.0.1"
port = {}

[[nodes]]
name = "replica"
host = "127.0.0.1"
port = {}

[[users]]
name = "{}"
auth = "trust"
server_user = "app"
server_password = "{SERVER_PASSWORD}"

[[users]]
name = "{}"
password = "{}"
auth = "md5"
server_user = "app"
server_password = "{SERVER_PASSWORD}"
"#,
        backend.primary.port(),
        backend.replica.port(),
        TRUST.user,
        MD5.user,
        MD5.password.unwrap_or_default(),
    )
}

async fn start_proxy(backend: &Backend, pool_mode: &str) -> RunningProxy {
    let config = pgfresh_config::parse_str(&config_text(backend, pool_mode)).expect("config");
    let proxy = Proxy::new(ConfigHandle::new(config, None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the proxy");
    let addr = listener.local_addr().expect("proxy address");
    let shared = proxy.shared.clone();
    tokio::spawn(proxy.run(listener, None, std::future::pending::<Stop>()));
    RunningProxy { addr, shared }
}

/// Waits until the monitor has named the primary and put the replica in the read pool.
fn wait_until_ready(shared: &Shared) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = shared.balancer.view();
        if view.primary.is_some() && view.nodes.iter().any(|n| n.eligible) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the monitor did not accept the fake nodes"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
