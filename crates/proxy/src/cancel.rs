//! Cancel requests: each client gets a key of pgfresh's own; the registry maps it to
//! the backend currently running that client's query.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pgfresh_wire::{build, CancelKey};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Where a cancel for one client goes right now.
#[derive(Clone, Debug)]
pub struct CancelTarget {
    pub host: Arc<str>,
    pub port: u16,
    pub key: CancelKey,
}

pub type CancelSlot = Arc<Mutex<Option<CancelTarget>>>;

#[derive(Default)]
pub struct CancelRegistry {
    slots: Mutex<HashMap<CancelKey, CancelSlot>>,
}

/// Removes the client's key when its session ends.
pub struct Registration<'a> {
    registry: &'a CancelRegistry,
    pub key: CancelKey,
    pub slot: CancelSlot,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.registry
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

impl CancelRegistry {
    /// A fresh random key for a new client session.
    pub fn register(&self) -> Registration<'_> {
        let slot: CancelSlot = Arc::default();
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let key = CancelKey {
                pid: rand::random::<i32>() & 0x3fff_ffff,
                secret: rand::random(),
            };
            if let std::collections::hash_map::Entry::Vacant(e) = slots.entry(key) {
                e.insert(slot.clone());
                return Registration {
                    registry: self,
                    key,
                    slot,
                };
            }
        }
    }

    /// Forward a client's cancel to the backend running its query. Unknown keys are
    /// ignored silently, as PostgreSQL does.
    pub async fn cancel(&self, key: CancelKey) {
        let target = {
            let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots
                .get(&key)
                .and_then(|s| s.lock().unwrap_or_else(|p| p.into_inner()).clone())
        };
        let Some(t) = target else {
            tracing::debug!("cancel request for an unknown or idle session");
            return;
        };
        match TcpStream::connect((&*t.host, t.port)).await {
            Ok(mut s) => {
                let _ = s.write_all(&build::cancel_request(t.key)).await;
                let _ = s.shutdown().await;
                metrics::counter!("pgfresh_cancel_requests_total").increment(1);
            }
            Err(e) => {
                tracing::warn!(host = %t.host, port = t.port, error = %e, "cannot forward cancel request")
            }
        }
    }
}
