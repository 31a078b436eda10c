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
    /// The client connected over TLS.
    pub tls: bool,
    state: AtomicU8,
    /// When the current wait for a server connection began, in microseconds since
    /// [`epoch`] (meaningful while the state is Waiting).
    wait_since_us: AtomicU64,
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
        if s == ClientState::Waiting {
            self.wait_since_us.store(now_us(), Ordering::Relaxed);
        }
        self.state.store(s as u8, Ordering::Relaxed);
    }

    /// How long the client has been waiting for a server connection (zero if it is not).
    pub fn waited(&self) -> std::time::Duration {
        if self.state() != ClientState::Waiting {
            return std::time::Duration::ZERO;
        }
        let since = self.wait_since_us.load(Ordering::Relaxed);
        std::time::Duration::from_micros(now_us().saturating_sub(since))
    }

    pub fn set_pinned(&self, reason: Option<&'static str>) {
        *self.pinned.lock().unwrap_or_else(|p| p.into_inner()) = reason;
    }

    pub fn pinned(&self) -> Option<&'static str> {
        *self.pinned.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A fixed point in time the wait starts are counted from.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    epoch().elapsed().as_micros() as u64
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
        tls: bool,
    ) -> Listed {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let info = Arc::new(ClientInfo {
            user: user.to_string(),
            database: database.to_string(),
            addr,
            application_name: application_name.to_string(),
            connected_at: SystemTime::now(),
            tls,
            state: AtomicU8::new(ClientState::Idle as u8),
            wait_since_us: AtomicU64::new(0),
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
