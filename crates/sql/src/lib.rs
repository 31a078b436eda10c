//! SQL text to routing analysis.
//!
//! Given SQL text (a simple-query string, or the query of a protocol Parse message), this crate
//! produces an [`Analysis`]: for each statement whether a hot standby may run it, which
//! relations it reads and writes, which functions it calls, the reasons it must run on the
//! primary, and what it does to the transaction or session. Parsing uses the real PostgreSQL
//! parser (libpg_query); each statement's tree is walked once. The crate is pure and
//! synchronous.
//!
//! ```
//! use pgfresh_sql::{analyze_uncached, Kind, MustPrimary, RelName};
//!
//! let a = analyze_uncached("WITH t AS (UPDATE jobs SET n = n + 1 RETURNING id) SELECT * FROM t");
//! assert_eq!(a.kind, Kind::Write);
//! assert_eq!(a.writes, vec![RelName::new(None, "jobs")]);
//! assert!(a.must_primary.contains(&MustPrimary::WritableCte));
//!
//! let a = analyze_uncached("SELECT * FROM \"Orders\" o JOIN app.ITEMS i USING (id)");
//! assert_eq!(a.kind, Kind::Read);
//! assert_eq!(a.reads, vec![RelName::new(None, "Orders"), RelName::new(Some("app"), "items")]);
//! ```
//!
//! Use [`Analyzer`] for the cached path. Function policy (`write_function_list`,
//! `read_only_function_list`, volatility from `pg_proc`) depends on configuration and is applied
//! after the cache with [`Analysis::function_reasons`].

mod analyze;
mod builtins;
mod cache;
mod classify;
mod effects;
mod functions;
mod hints;
mod model;
mod names;
pub mod shape;
mod visit;

pub use analyze::{
    after_first_statement, analyze_bytes, analyze_uncached, unknown_prepared_statement,
};
pub use cache::{entry_weight, Analyzer, AnalyzerOptions, CacheStats, Keyed};
pub use functions::{
    calls_user_functions, is_known_builtin, reasons_for, FunctionPolicy, Volatility,
    VolatilityOracle,
};
pub use hints::parse_hint_lsn as parse_position;
pub use model::{
    Analysis, DiscardKind, HintLsn, Isolation, Kind, MustPrimary, RouteHint, SessionEffect,
    Statement, TxEffect, TxModes,
};
pub use names::{FuncName, NameError, RelName};
