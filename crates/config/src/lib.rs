//! pgfresh configuration.
//!
//! - [`model`]: the TOML schema (`conf/pgfresh.toml` documents every key).
//! - [`validate`]: parsing and cross-field validation; errors name the key.
//! - [`reload`]: the one table of which keys apply live and which need a restart.
//! - [`handle`]: the owned `ArcSwap` handle read once per request, all-or-nothing
//!   reloads, and the debounced file watch.

pub mod handle;
pub mod model;
pub mod reload;
pub mod validate;

pub mod userlist;
pub use handle::{ConfigCache, ConfigHandle, FileWatch, ReloadOutcome};
pub use model::*;
pub use reload::{describe, diff, redacted, reload_class, ChangedKey, ReloadClass};
pub use validate::{load_file, parse_str, validate, ConfigError};
