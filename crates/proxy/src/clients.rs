//! The client sessions now connected, for `SHOW CLIENTS`: who they are and what each is
//! doing (holding a server connection, waiting for one, idle between transactions).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

/// What a client is doing now, in PgBouncer's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ClientState {
    /// Holds no server connection (transaction mode, between transactions).
    Idle = 0,
    /// Holds a server connection.
    Active = 1,
    /// Waits for a server connection.
    Waiting = 2,
}

impl ClientState {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientState::Idle => "idle",
            ClientState::Active => "active",
            ClientState::Waiting => "waiting",
        }
    }
}

/// One connected client.
pub struct ClientInfo {
    pub user: String,
    pub database: String,
    pub addr: Option<SocketAddr>,
    pub application_name: String,
    pub connected_at: SystemTime,
    state: AtomicU8,
    /// When the current wait for a server connection began.
    wait_since: Mutex<Option<Instant>>,
    /// Why the session keeps its connection (see `PinReason`), if it does.
    pinned: Mutex<Option<&'static str>>,
}

impl ClientInfo {
    pub fn state(&self) -> ClientState {
        match self.state.load(Ordering::Relaxed) {
            1 => ClientState::Active,
            2 => ClientState::Waiting,
            _ => ClientState::Idle,
        }
    }

    pub fn set_state(&self, s: ClientState) {
        if self.state.swap(s as u8, Ordering::Relaxed) == s as u8 {
            return;
        }
        let mut since = self.wait_since.lock().unwrap_or_else(|p| p.into_inner());
        *since = (s == ClientState::Waiting).then(Instant::now);
    }

    /// How long the client has been waiting for a server connection (zero if it is not).
    pub fn waited(&self) -> std::time::Duration {
        self.wait_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }

    pub fn set_pinned(&self, reason: Option<&'static str>) {
        *self.pinned.lock().unwrap_or_else(|p| p.into_inner()) = reason;
    }

    pub fn pinned(&self) -> Option<&'static str> {
        *self.pinned.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
pub struct ClientRegistry {
    clients: Mutex<HashMap<u64, Arc<ClientInfo>>>,
    next: AtomicU64,
}

/// Keeps a client listed while it lives.
pub struct Listed {
    registry: Arc<ClientRegistry>,
    id: u64,
    pub info: Arc<ClientInfo>,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.registry
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl ClientRegistry {
    pub fn list(
        self: &Arc<Self>,
        user: &str,
        database: &str,
        addr: Option<SocketAddr>,
        application_name: &str,
    ) -> Listed {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let info = Arc::new(ClientInfo {
            user: user.to_string(),
            database: database.to_string(),
            addr,
            application_name: application_name.to_string(),
            connected_at: SystemTime::now(),
            state: AtomicU8::new(ClientState::Idle as u8),
            wait_since: Mutex::new(None),
            pinned: Mutex::new(None),
        });
        self.clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, info.clone());
        Listed {
            registry: self.clone(),
            id,
            info,
        }
    }

    /// Every client now connected, oldest first.
    pub fn snapshot(&self) -> Vec<Arc<ClientInfo>> {
        let mut v: Vec<(u64, Arc<ClientInfo>)> = self
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        v.into_iter().map(|(_, c)| c).collect()
    }
}
