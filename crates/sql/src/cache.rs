//! The bounded analysis cache keyed by statement text.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use moka::sync::Cache;

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
/// together this enforces both bounds. Texts whose weight exceeds the whole budget are analysed
/// but not kept. Cheap to share across threads (`&Analyzer` or `Arc<Analyzer>`).
pub struct Analyzer {
    cache: Cache<Arc<str>, Arc<Analysis>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for Analyzer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analyzer")
            .field("stats", &self.cache_stats())
            .finish()
    }
}

/// Fixed per-entry overhead of the cache's own bookkeeping (key `Arc` header, the cache's entry
/// record with its access metadata, hash-table slot, eviction-deque node), in bytes; measured
/// with `examples/cache_memory.rs`.
const ENTRY_OVERHEAD: usize = 480;

impl Analyzer {
    /// A new analyzer with an empty cache.
    pub fn new(opts: AnalyzerOptions) -> Self {
        let max_entries = opts.cache_max_entries.max(1);
        let max_bytes = opts.cache_max_bytes.max(1);
        let floor = (max_bytes / max_entries).max(1);
        let cache = Cache::builder()
            .max_capacity(max_bytes)
            .weigher(move |key: &Arc<str>, value: &Arc<Analysis>| -> u32 {
                let bytes = entry_weight(key, value) as u64;
                u32::try_from(bytes.max(floor)).unwrap_or(u32::MAX)
            })
            .build();
        Self {
            cache,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The analysis of `sql`, from the cache when the same text was analysed before.
    /// Never panics; unparseable text yields an unclassified analysis (also cached).
    pub fn analyze(&self, sql: &str) -> Arc<Analysis> {
        if let Some(hit) = self.cache.get(sql) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return hit;
        }
        // Texts that differ only in literal values share one analysis (see `shape`).
        let shape = literal_shape(sql);
        if let Some(hit) = shape.as_deref().and_then(|s| self.cache.get(s)) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return hit;
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let analysis = Arc::new(analyze_uncached(sql));
        let key = match shape {
            Some(shape) if shareable(&analysis) => shape,
            _ => sql.to_string(),
        };
        self.cache.insert(Arc::from(key), Arc::clone(&analysis));
        analysis
    }

    /// Like [`Analyzer::analyze`] for raw protocol bytes; text that is not UTF-8 is
    /// unclassified and not cached.
    pub fn analyze_bytes(&self, sql: &[u8]) -> Arc<Analysis> {
        match std::str::from_utf8(sql) {
            Ok(s) => self.analyze(s),
            Err(_) => Arc::new(analyze_bytes(sql)),
        }
    }

    /// Hit/miss counters and current size.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: self.cache.entry_count(),
            weighted_bytes: self.cache.weighted_size(),
        }
    }

    /// Applies pending evictions now, so [`Analyzer::cache_stats`] is exact. Eviction also
    /// happens on its own during normal use.
    pub fn run_pending_tasks(&self) {
        self.cache.run_pending_tasks();
    }

    /// Drops every cached entry (counters are kept).
    pub fn clear(&self) {
        self.cache.invalidate_all();
        self.cache.run_pending_tasks();
    }
}

/// Estimated bytes one cache entry holds: key text, analysis, bookkeeping.
/// Whether an analysis holds for every text of the same literal shape: not when it
/// failed to parse (a literal may be what is malformed) and not when it carries session
/// effects, whose replay uses the literal values and text positions of the exact text.
fn shareable(a: &Analysis) -> bool {
    a.kind != crate::Kind::Unclassified && a.statements.iter().all(|s| s.session.is_none())
}

pub fn entry_weight(key: &str, value: &Analysis) -> usize {
    key.len() + value.estimated_bytes() + ENTRY_OVERHEAD
}
