//! Cancel requests: each client gets a key of pgfresh's own; the registry maps it to
//! the backend currently running that client's query.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pgfresh_wire::{build, CancelKey};

/// Where a cancel for one client goes right now.
#[derive(Clone, Debug)]
pub struct CancelTarget {
    pub host: Arc<str>,
    pub port: u16,
    /// The node's TLS settings: a cancel key is a secret, sent as the queries are.
    pub tls: Arc<pgfresh_nodetls::Settings>,
    pub key: CancelKey,
}

/// Where one client's cancels go, and how many are being forwarded there now.
#[derive(Default, Debug)]
pub struct SlotState {
    /// Shared with the server connection, which builds it once (see
    /// `ServerConn::cancel_target`).
    pub target: Option<Arc<CancelTarget>>,
    /// Cancels read from `target` and not yet delivered: the connection they go to
    /// must not run another client's query before they land (see `Session::checkin`).
    pub forwarding: u32,
}

pub type CancelSlot = Arc<Mutex<SlotState>>;

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
        let slot = {
            let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.get(&key).cloned()
        };
        let Some(slot) = slot else {
            tracing::debug!("cancel request for an unknown session");
            return;
        };
        let target = {
            let mut st = slot.lock().unwrap_or_else(|p| p.into_inner());
            let t = st.target.clone();
            if t.is_some() {
                st.forwarding += 1;
            }
            t
        };
        let Some(t) = target else {
            tracing::debug!("cancel request for a session with nothing running");
            return;
        };
        forward(&t).await;
        slot.lock().unwrap_or_else(|p| p.into_inner()).forwarding -= 1;
    }
}

/// Send a cancel request to the server and wait until the server has taken it (it
/// closes the connection once it has signalled the backend).
async fn forward(t: &CancelTarget) {
    let deliver = async {
        let tcp = pgfresh_nodetls::Tcp::connect(&t.host, t.port)
            .await
            .map_err(|e| e.to_string())?;
        let mut s = pgfresh_nodetls::connect(tcp, &t.tls, &t.host).await?;
        s.write_all(&build::cancel_request(t.key))
            .await
            .map_err(|e| e.to_string())?;
        let mut sink = bytes::BytesMut::new();
        while s.read_some(&mut sink).await.map_err(|e| e.to_string())? > 0 {
            sink.clear();
        }
        Ok::<(), String>(())
    };
    match tokio::time::timeout(std::time::Duration::from_secs(5), deliver).await {
        Ok(Ok(())) => metrics::counter!("pgfresh_cancel_requests_total").increment(1),
        Ok(Err(e)) => {
            tracing::warn!(host = %t.host, port = t.port, error = %e, "cannot forward cancel request")
        }
        Err(_) => {
            tracing::warn!(host = %t.host, port = t.port, "cancel request not acknowledged by the server within 5 s")
        }
    }
}
