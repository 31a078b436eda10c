//! The bounded analysis cache keyed by statement text.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quick_cache::sync::Cache;
use quick_cache::Weighter;

use crate::analyze::{analyze_bytes, analyze_uncached};
use crate::model::Analysis;
use crate::shape::literal_shape;

/// Cache bounds. Both hold at once: at most `cache_max_entries` entries and at most
/// `cache_max_bytes` estimated bytes (key text plus [`Analysis::estimated_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnalyzerOptions {
    /// Maximum number of cached statement texts.
    pub cache_max_entries: u64,
    /// Maximum estimated memory of the cache, in bytes.
    pub cache_max_bytes: u64,
}

impl Default for AnalyzerOptions {
    /// 10 000 entries, 32 MiB.
    fn default() -> Self {
        Self {
            cache_max_entries: 10_000,
            cache_max_bytes: 32 * 1024 * 1024,
        }
    }
}

/// Counters and size of the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that parsed the text.
    pub misses: u64,
    /// Entries currently cached (approximate while evictions are pending).
    pub entries: u64,
    /// Weighted size of the cached entries in bytes (approximate while evictions are pending).
    pub weighted_bytes: u64,
}

/// Analyses SQL text through a bounded cache, so a repeated statement costs one hash lookup.
///
/// Eviction is by weight: every entry weighs its estimated size but at least
/// `cache_max_bytes / cache_max_entries`, and the total weight is capped at `cache_max_bytes`;
/// together this enforces both bounds. The cache is split into a few shards, each with its
/// share of the budget; a text whose weight exceeds a shard's share is analysed but not kept.
/// Cheap to share across threads (`&Analyzer` or `Arc<Analyzer>`).
pub struct Analyzer {
    cache: Cache<Arc<str>, Entry, EntryWeight>,
    /// The least weight of an entry: `cache_max_bytes / cache_max_entries`.
    floor: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// A cached analysis with its weight, computed once at insertion (the cache asks for it
/// again while evicting).
#[derive(Clone)]
struct Entry {
    analysis: Arc<Analysis>,
    weight: u64,
}

#[derive(Clone, Copy)]
struct EntryWeight;

impl Weighter<Arc<str>, Entry> for EntryWeight {
    fn weight(&self, _key: &Arc<str>, entry: &Entry) -> u64 {
        entry.weight
    }
}

/// What a lookup was keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyed {
    /// The text itself: the same bytes will always find the same analysis.
    Text,
    /// The text's literal shape (see [`literal_shape`]): texts with other literal values
    /// share it.
    Shape,
}

impl std::fmt::Debug for Analyzer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analyzer")
            .field("stats", &self.cache_stats())
            .finish()
    }
}

/// Fixed per-entry overhead of the cache's own bookkeeping (key `Arc` header, the shard's
/// entry record, hash-table slot), in bytes; measured with `examples/cache_memory.rs`.
const ENTRY_OVERHEAD: usize = 256;

impl Analyzer {
    /// A new analyzer with an empty cache.
    pub fn new(opts: AnalyzerOptions) -> Self {
        let max_entries = opts.cache_max_entries.max(1);
        let max_bytes = opts.cache_max_bytes.max(1);
        let cache = Cache::with_weighter(
            usize::try_from(max_entries).unwrap_or(usize::MAX),
            max_bytes,
            EntryWeight,
        );
        Self {
            cache,
            floor: (max_bytes / max_entries).max(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The analysis of `sql`, from the cache when the same text was analysed before.
    /// Never panics; unparseable text yields an unclassified analysis (also cached).
    pub fn analyze(&self, sql: &str) -> Arc<Analysis> {
        self.analyze_keyed(sql).0
    }

    /// [`Analyzer::analyze`], also saying whether the analysis is keyed by the text itself
    /// or by its literal shape, for callers that keep a cache of their own by text.
    pub fn analyze_keyed(&self, sql: &str) -> (Arc<Analysis>, Keyed) {
        self.analyze_shaped(sql, literal_shape(sql).as_deref())
    }

    /// [`Analyzer::analyze_keyed`] for a caller that already has the text's literal shape
    /// (`None`: it has none), as [`crate::shape::literal_shape_into`] gives it.
    pub fn analyze_shaped(&self, sql: &str, shape: Option<&str>) -> (Arc<Analysis>, Keyed) {
        // Texts that differ only in literal values share one analysis (see `shape`); texts
        // with no literal, and those whose analysis cannot be shared, are keyed as written.
        if let Some(hit) = shape.and_then(|s| self.cache.get(s)) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return (hit.analysis, Keyed::Shape);
        }
        if let Some(hit) = self.cache.get(sql) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return (hit.analysis, Keyed::Text);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let analysis = Arc::new(analyze_uncached(sql));
        let (key, keyed) = match shape {
            Some(shape) if shareable(&analysis) => (shape.to_string(), Keyed::Shape),
            _ => (sql.to_string(), Keyed::Text),
        };
        let weight = (entry_weight(&key, &analysis) as u64).max(self.floor);
        self.cache.insert(
            Arc::from(key),
            Entry {
                analysis: Arc::clone(&analysis),
                weight,
            },
        );
        (analysis, keyed)
    }

    /// Like [`Analyzer::analyze`] for raw protocol bytes; text that is not UTF-8 is
    /// unclassified and not cached.
    pub fn analyze_bytes(&self, sql: &[u8]) -> Arc<Analysis> {
        match std::str::from_utf8(sql) {
            Ok(s) => self.analyze(s),
            Err(_) => Arc::new(analyze_bytes(sql)),
        }
    }

    /// Hit/miss counters and current size (evictions happen at insertion, so the size is
    /// exact).
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: self.cache.len() as u64,
            weighted_bytes: self.cache.weight(),
        }
    }

    /// Drops every cached entry (counters are kept).
    pub fn clear(&self) {
        self.cache.clear();
    }
}

/// Estimated bytes one cache entry holds: key text, analysis, bookkeeping.
/// Whether an analysis holds for every text of the same literal shape: not when it
/// failed to parse (a literal may be what is malformed), not when it carries session
/// effects, whose replay uses the literal values and text positions of the exact text,
/// and not when a literal names what it writes (`nextval('s')`, `setval('s', …)`).
fn shareable(a: &Analysis) -> bool {
    a.kind != crate::Kind::Unclassified
        && a.statements.iter().all(|s| s.session.is_none())
        && !a.functions.iter().any(|f| {
            matches!(f.schema.as_deref(), None | Some("pg_catalog"))
                && matches!(&*f.name, "nextval" | "setval")
        })
}

pub fn entry_weight(key: &str, value: &Analysis) -> usize {
    key.len() + value.estimated_bytes() + ENTRY_OVERHEAD
}
