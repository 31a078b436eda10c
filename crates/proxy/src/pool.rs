//! Server connection pools, one per (node, server user, database), in session mode:
//! a client session holds a connection to each node it uses and gives it back, reset,
//! when it ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ProxyError;
use crate::server::{ServerConn, Target};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PoolKey {
    node: usize,
    host: Arc<str>,
    port: u16,
    user: Arc<str>,
    database: Arc<str>,
}

/// Timeouts and sizes read from the config snapshot at each acquire.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub pool_size: usize,
    pub acquire_timeout: Duration,
    pub connect_timeout: Duration,
    pub login_timeout: Duration,
    pub idle_timeout: Duration,
}

struct Idle {
    conn: ServerConn,
    since: Instant,
}

struct Pool {
    idle: Mutex<Vec<Idle>>,
    slots: Arc<Semaphore>,
}

/// All pools, plus a per-node generation counter bumped when a node changes role,
/// so connections made before the change are closed instead of reused.
#[derive(Default)]
pub struct Pools {
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    generations: Mutex<HashMap<usize, Arc<AtomicU64>>>,
}

/// A server connection lent to one client session.
pub struct Leased {
    pub conn: ServerConn,
    _permit: OwnedSemaphorePermit,
    pool: Arc<Pool>,
}

impl Pools {
    fn generation_cell(&self, node: usize) -> Arc<AtomicU64> {
        let mut g = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        g.entry(node).or_default().clone()
    }

    /// The current generation of a node.
    pub fn generation(&self, node: usize) -> u64 {
        self.generation_cell(node).load(Ordering::Acquire)
    }

    /// Mark every connection to `node` as stale (role change, removal). Idle ones are
    /// dropped now; leased ones are dropped by their session at its next statement.
    pub fn invalidate_node(&self, node: usize) {
        self.generation_cell(node).fetch_add(1, Ordering::AcqRel);
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        for (key, pool) in pools.iter() {
            if key.node == node {
                pool.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
            }
        }
    }

    fn pool(&self, target: &Target, size: usize) -> Arc<Pool> {
        let key = PoolKey {
            node: target.node,
            host: target.host.clone(),
            port: target.port,
            user: target.user.clone(),
            database: target.database.clone(),
        };
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Pool {
                    idle: Mutex::new(Vec::new()),
                    slots: Arc::new(Semaphore::new(size)),
                })
            })
            .clone()
    }

    /// Take an idle connection or open a new one, waiting for a free slot up to the
    /// acquire timeout.
    pub async fn acquire(
        &self,
        target: &Target,
        startup_params: &[(String, String)],
        s: &PoolSettings,
    ) -> Result<Leased, ProxyError> {
        let pool = self.pool(target, s.pool_size);
        let permit = tokio::time::timeout(s.acquire_timeout, pool.slots.clone().acquire_owned())
            .await
            .map_err(|_| ProxyError::PoolTimeout {
                node: target.node_name.to_string(),
            })?
            .map_err(|_| ProxyError::Shutdown)?;
        let generation = self.generation(target.node);
        loop {
            let idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let Some(idle) = idle else { break };
            let expired = !s.idle_timeout.is_zero() && idle.since.elapsed() > s.idle_timeout;
            if idle.conn.generation == generation && !expired {
                return Ok(Leased {
                    conn: idle.conn,
                    _permit: permit,
                    pool,
                });
            }
            tokio::spawn(idle.conn.terminate());
        }
        let conn = ServerConn::connect(
            target.clone(),
            startup_params,
            s.connect_timeout,
            s.login_timeout,
            generation,
        )
        .await?;
        metrics::counter!("pgfresh_server_connections_opened_total", "node" => target.node_name.to_string()).increment(1);
        Ok(Leased {
            conn,
            _permit: permit,
            pool,
        })
    }

    /// Give a connection back after the session is done with it. It is reset first;
    /// a connection that is not idle, is stale, or fails the reset is closed instead.
    pub async fn release(&self, mut leased: Leased, reset_query: &str) {
        let generation = self.generation(leased.conn.target.node);
        let reusable = leased.conn.generation == generation
            && leased.conn.tx == pgfresh_wire::TxStatus::Idle
            && leased.conn.wbuf.is_empty()
            && (reset_query.is_empty()
                || matches!(leased.conn.run_quiet(reset_query).await, Ok(Ok(()))));
        if reusable {
            leased.conn.prepared.clear();
            leased.conn.state_version = 0;
            let pool = leased.pool.clone();
            pool.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Idle {
                    conn: leased.conn,
                    since: Instant::now(),
                });
        } else {
            leased.conn.terminate().await;
        }
    }

    /// (idle, in use) connection counts per node name, for SHOW POOLS and metrics.
    pub fn counts(&self) -> Vec<(usize, String, String, usize, usize)> {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .iter()
            .map(|(k, p)| {
                let idle = p.idle.lock().unwrap_or_else(|p| p.into_inner()).len();
                let size_in_use = p.slots.available_permits();
                (
                    k.node,
                    k.user.to_string(),
                    k.database.to_string(),
                    idle,
                    size_in_use,
                )
            })
            .collect()
    }
}
