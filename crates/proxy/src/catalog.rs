//! Function volatility learned from `pg_proc` on the primary, per database.
//!
//! A call of a user function may stay a read only when the function cannot write: the
//! catalog marks it STABLE or IMMUTABLE (DESIGN §1.5). pgfresh reads `pg_proc` of each
//! database its clients use, on a connection of its own as the monitor user, and refreshes
//! it every 30 s and after DDL ([`Catalog::invalidate`]: through pgfresh, or found by the
//! schema check). Until a database's functions are loaded (again), and for functions
//! created since the last load, calls are unknown and go to the primary.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use pgfresh_sql::{FuncName, Volatility, VolatilityOracle};

use crate::context::Shared;
use crate::monitor_conn::MonitorConn;

/// How often a database's functions are read again.
pub const REFRESH: Duration = Duration::from_secs(30);

/// The functions of one database.
#[derive(Default, Debug)]
pub struct DbFunctions {
    /// (schema, name) → volatility; the most volatile over overloads.
    qualified: HashMap<(String, String), Volatility>,
    /// name → the most volatile over every schema (an unqualified call may resolve to any).
    unqualified: HashMap<String, Volatility>,
}

fn rank(v: Volatility) -> u8 {
    match v {
        Volatility::Immutable => 0,
        Volatility::Stable => 1,
        Volatility::Volatile => 2,
    }
}

fn worst(a: Volatility, b: Volatility) -> Volatility {
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

impl DbFunctions {
    /// Build from (schema, name, provolatile) rows.
    pub fn from_rows(rows: impl IntoIterator<Item = (String, String, char)>) -> Self {
        let mut f = DbFunctions::default();
        for (schema, name, vol) in rows {
            let v = match vol {
                'i' => Volatility::Immutable,
                's' => Volatility::Stable,
                _ => Volatility::Volatile,
            };
            let q = f.qualified.entry((schema, name.clone())).or_insert(v);
            *q = worst(*q, v);
            let u = f.unqualified.entry(name).or_insert(v);
            *u = worst(*u, v);
        }
        f
    }
}

impl VolatilityOracle for DbFunctions {
    fn volatility(&self, f: &FuncName) -> Option<Volatility> {
        match f.schema.as_deref() {
            Some(schema) => self
                .qualified
                .get(&(schema.to_string(), f.name.to_string()))
                .copied(),
            None => self.unqualified.get(&*f.name).copied(),
        }
    }
}

struct Entry {
    functions: Arc<ArcSwapOption<DbFunctions>>,
    loading_since: Mutex<Option<Instant>>,
    /// Loads started, and the number of the one whose answer is in `functions`: an older
    /// load that finishes after a newer one is not stored.
    started: AtomicU64,
    stored: Arc<Mutex<u64>>,
}

/// The per-database function catalogs.
#[derive(Default)]
pub struct Catalog {
    dbs: Mutex<HashMap<String, Arc<Entry>>>,
}

const QUERY: &str = "SELECT n.nspname::text, p.proname::text, p.provolatile::text \
                     FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
                     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')";

impl Catalog {
    /// The functions of `db` if known; starts (or refreshes) loading them otherwise.
    pub fn functions(&self, shared: &Arc<Shared>, db: &str) -> Option<Arc<DbFunctions>> {
        let entry = {
            let mut dbs = self.dbs.lock().unwrap_or_else(|p| p.into_inner());
            if dbs.len() > 1000 && !dbs.contains_key(db) {
                return None; // bounded: only so many databases are tracked
            }
            dbs.entry(db.to_string())
                .or_insert_with(|| {
                    Arc::new(Entry {
                        functions: Arc::new(ArcSwapOption::empty()),
                        loading_since: Mutex::new(None),
                        started: AtomicU64::new(0),
                        stored: Arc::new(Mutex::new(0)),
                    })
                })
                .clone()
        };
        let mut loading = entry
            .loading_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if loading.is_none_or(|t| t.elapsed() >= REFRESH) {
            *loading = Some(Instant::now());
            let number = entry.started.fetch_add(1, Ordering::AcqRel) + 1;
            let (shared, db, slot) = (shared.clone(), db.to_string(), entry.functions.clone());
            let stored = entry.stored.clone();
            tokio::spawn(async move {
                match load(&shared, &db).await {
                    Ok(f) => {
                        let mut last = stored.lock().unwrap_or_else(|p| p.into_inner());
                        if *last < number {
                            *last = number;
                            slot.store(Some(Arc::new(f)));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(database = %db, error = %e, "cannot read pg_proc; user functions go to the primary")
                    }
                }
            });
        }
        entry.functions.load_full()
    }

    /// DDL may have changed the functions of `db` (through pgfresh, or found by the schema
    /// check): what was loaded is dropped (until the next load, every user function counts
    /// as unknown, so calls go to the primary), loads already running are not stored, and
    /// the next [`Self::functions`] call loads again.
    pub fn invalidate(&self, db: &str) {
        let entry = self
            .dbs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(db)
            .cloned();
        if let Some(e) = entry {
            let mut loading = e.loading_since.lock().unwrap_or_else(|p| p.into_inner());
            *e.stored.lock().unwrap_or_else(|p| p.into_inner()) = e.started.load(Ordering::Acquire);
            e.functions.store(None);
            *loading = None;
        }
    }
}

async fn load(shared: &Shared, db: &str) -> Result<DbFunctions, String> {
    let conn = MonitorConn::open(shared, None, Some(db), "pgfresh catalog").await?;
    let rows = conn
        .client
        .query(QUERY, &[])
        .await
        .map_err(|e| pgfresh_balancer::describe_pg_error(&e));
    conn.close().await;
    let rows = rows?;
    Ok(DbFunctions::from_rows(rows.iter().map(|r| {
        let vol: String = r.get(2);
        (r.get(0), r.get(1), vol.chars().next().unwrap_or('v'))
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_volatile_overload_wins() {
        let f = DbFunctions::from_rows([
            ("app".to_string(), "f".to_string(), 's'),
            ("app".to_string(), "f".to_string(), 'v'),
            ("other".to_string(), "g".to_string(), 'i'),
            ("app".to_string(), "g".to_string(), 's'),
        ]);
        assert_eq!(
            f.volatility(&FuncName::new(Some("app"), "f")),
            Some(Volatility::Volatile)
        );
        assert_eq!(
            f.volatility(&FuncName::new(Some("other"), "g")),
            Some(Volatility::Immutable)
        );
        // Unqualified: any schema on the search path may be the one called.
        assert_eq!(
            f.volatility(&FuncName::new(None, "g")),
            Some(Volatility::Stable)
        );
        assert_eq!(f.volatility(&FuncName::new(None, "nope")), None);
    }
}
