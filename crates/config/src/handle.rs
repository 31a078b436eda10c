//! The live configuration: an owned `ArcSwap` snapshot, reloads that are all-or-nothing,
//! and a debounced file watch.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::model::Config;
use crate::reload::{diff, ChangedKey, ReloadClass};
use crate::validate::{load_file, ConfigError};

/// What a reload did.
#[derive(Debug)]
pub struct ReloadOutcome {
    /// Keys whose new value is now in force.
    pub applied: Vec<ChangedKey>,
    /// Keys that changed in the file but wait for a restart (their old value stays).
    pub pending_restart: Vec<ChangedKey>,
}

/// Shared handle to the configuration in force. Clone it freely; readers take a
/// snapshot once per request with [`ConfigHandle::snapshot`].
#[derive(Clone)]
pub struct ConfigHandle {
    inner: Arc<Inner>,
}

/// See [`ConfigHandle::cache`].
pub struct ConfigCache(arc_swap::Cache<Current, Arc<Config>>);

impl ConfigCache {
    /// The config in force now.
    pub fn load(&mut self) -> &Arc<Config> {
        self.0.load()
    }
}

/// The handle's `ArcSwap`, owned, for [`ConfigCache`].
#[derive(Clone)]
struct Current(Arc<Inner>);

impl std::ops::Deref for Current {
    type Target = ArcSwap<Config>;
    fn deref(&self) -> &ArcSwap<Config> {
        &self.0.current
    }
}

struct Inner {
    current: ArcSwap<Config>,
    path: Option<PathBuf>,
    /// The config as last read from the file (restart-only keys included), so that
    /// the next reload reports only what changed since.
    last_file: Mutex<Config>,
    reload_ok: AtomicU64,
    reload_err: AtomicU64,
}

impl ConfigHandle {
    /// A handle over an already-validated config; `path` is where reloads read from.
    pub fn new(config: Config, path: Option<PathBuf>) -> Self {
        Self {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(config.clone()),
                path,
                last_file: Mutex::new(config),
                reload_ok: AtomicU64::new(0),
                reload_err: AtomicU64::new(0),
            }),
        }
    }

    /// Load and validate `path`, and return a handle over it.
    pub fn open(path: &Path) -> Result<Self, ConfigError> {
        let c = load_file(path)?;
        Ok(Self::new(c, Some(path.to_path_buf())))
    }

    /// The config in force now.
    pub fn snapshot(&self) -> Arc<Config> {
        self.inner.current.load_full()
    }

    /// A per-owner cache of the config in force: [`ConfigCache::load`] costs one atomic
    /// read while the config stays the same (for code that reads it per statement).
    pub fn cache(&self) -> ConfigCache {
        ConfigCache(arc_swap::Cache::new(Current(self.inner.clone())))
    }

    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// (successful, failed) reload counts.
    pub fn reload_counts(&self) -> (u64, u64) {
        (
            self.inner.reload_ok.load(Ordering::Relaxed),
            self.inner.reload_err.load(Ordering::Relaxed),
        )
    }

    /// Apply a change made in memory (the admin API, the console). Restart-only keys are
    /// refused by the caller's own rules; this only swaps.
    pub fn update(&self, f: impl Fn(&mut Config)) -> Arc<Config> {
        self.inner.current.rcu(|cur| {
            let mut next = Config::clone(cur);
            f(&mut next);
            next
        });
        self.snapshot()
    }

    /// Re-read the file. An invalid file changes nothing. Live keys that changed in the
    /// file are applied; restart-only keys keep their running value and are reported.
    /// Keys that did not change in the file keep their running value, so a value pushed
    /// through the admin API survives a reload that does not touch it.
    pub fn reload(&self) -> Result<ReloadOutcome, ConfigError> {
        let Some(path) = self.inner.path.as_deref() else {
            return Ok(ReloadOutcome {
                applied: Vec::new(),
                pending_restart: Vec::new(),
            });
        };
        let file = match load_file(path) {
            Ok(c) => c,
            Err(e) => {
                self.inner.reload_err.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        let mut last = self
            .inner
            .last_file
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let changed = diff(&last, &file);
        let (applied, pending): (Vec<_>, Vec<_>) = changed
            .into_iter()
            .partition(|k| k.class == ReloadClass::Live);
        if !applied.is_empty() {
            let current = self.snapshot();
            let merged = merge_live(&current, &file, &applied);
            if let Err(e) = crate::validate::validate(&merged) {
                self.inner.reload_err.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
            self.inner.current.store(Arc::new(merged));
        }
        *last = file;
        self.inner.reload_ok.fetch_add(1, Ordering::Relaxed);
        Ok(ReloadOutcome {
            applied,
            pending_restart: pending,
        })
    }
}

/// Take the running config and copy over the sections that hold changed live keys.
/// Whole top-level values are copied per changed leaf key via JSON paths.
fn merge_live(current: &Config, file: &Config, applied: &[ChangedKey]) -> Config {
    let mut cur = serde_json::to_value(current).unwrap_or_default();
    let new = serde_json::to_value(file).unwrap_or_default();
    for k in applied {
        // Arrays of tables are replaced whole: `nodes[1].weight` maps to `nodes`.
        let top = k.key.split(['[', '.']).next().unwrap_or("");
        if top == "nodes" || top == "users" {
            cur[top] = new[top].clone();
            continue;
        }
        let mut parts = k.key.splitn(2, '.');
        if let (Some(section), Some(field)) = (parts.next(), parts.next()) {
            cur[section][field] = new[section][field].clone();
        }
    }
    serde_json::from_value(cur).unwrap_or_else(|_| file.clone())
}

/// Watches the config file and calls `on_change` (debounced) when it is written,
/// renamed over, or recreated. Editors that replace the file are handled by watching
/// the parent directory. Drop the returned guard to stop watching.
pub struct FileWatch {
    _watcher: notify::RecommendedWatcher,
    _thread: std::thread::JoinHandle<()>,
}

impl FileWatch {
    pub fn start(
        path: &Path,
        debounce: Duration,
        on_change: impl Fn() + Send + 'static,
    ) -> Result<Self, notify::Error> {
        use notify::{RecursiveMode, Watcher};
        let file = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let dir = file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let name = file.file_name().map(|n| n.to_os_string());
        let (tx, rx) = mpsc::channel::<()>();
        let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            if let Ok(ev) = ev {
                let relevant = ev.kind.is_modify() || ev.kind.is_create() || ev.kind.is_remove();
                let ours = ev
                    .paths
                    .iter()
                    .any(|p| p.file_name().map(|n| n.to_os_string()) == name);
                if relevant && ours {
                    let _ = tx.send(());
                }
            }
        })?;
        watcher.watch(&dir, RecursiveMode::NonRecursive)?;
        let thread = std::thread::Builder::new()
            .name("pgfresh-config-watch".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    // Debounce: wait until the burst of events is over.
                    while rx.recv_timeout(debounce).is_ok() {}
                    on_change();
                }
            })
            .map_err(|e| notify::Error::generic(&e.to_string()))?;
        Ok(Self {
            _watcher: watcher,
            _thread: thread,
        })
    }
}
