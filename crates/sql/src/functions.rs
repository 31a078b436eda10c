//! Function classification: built-ins a standby runs safely, built-ins that need the primary,
//! and the configuration-dependent policy for everything else.

use std::collections::HashSet;
use std::sync::OnceLock;

use crate::builtins::{CATALOG_LOOKUPS, CATALOG_TYPES, PRIMARY_ONLY, STANDBY_SAFE};
use crate::model::MustPrimary;
use crate::names::FuncName;

/// What the analyzer knows about a built-in function without any configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Builtin {
    /// A `pg_catalog` function a hot standby runs and that writes nothing.
    StandbySafe,
    /// A built-in that must run on the primary, with the reason (recorded in the cached analysis).
    Primary(MustPrimary),
    /// A `set_config` call.
    SetConfig,
    /// Not a known built-in: the function policy decides.
    Unknown,
}

/// Standby-safe built-ins: [`STANDBY_SAFE`], and the catalog lookups (which are catalog
/// reads too, see [`reads_catalog`]).
fn standby_safe() -> &'static HashSet<&'static str> {
    static SET: OnceLock<HashSet<&'static str>> = OnceLock::new();
    SET.get_or_init(|| {
        STANDBY_SAFE
            .iter()
            .chain(CATALOG_LOOKUPS)
            .copied()
            .collect()
    })
}

fn primary_only() -> &'static HashSet<&'static str> {
    static SET: OnceLock<HashSet<&'static str>> = OnceLock::new();
    SET.get_or_init(|| PRIMARY_ONLY.iter().copied().collect())
}

/// Classifies a call by name. Only unqualified names and names in `pg_catalog` are built-ins.
pub(crate) fn classify_builtin(f: &FuncName) -> Builtin {
    match f.schema.as_deref() {
        None | Some("pg_catalog") => {}
        Some(_) => return Builtin::Unknown,
    }
    let name: &str = &f.name;
    match name {
        "nextval" | "setval" | "currval" | "lastval" => {
            return Builtin::Primary(MustPrimary::Sequence(name.to_owned()))
        }
        "txid_current"
        | "txid_current_if_assigned"
        | "pg_current_xact_id"
        | "pg_current_xact_id_if_assigned" => {
            return Builtin::Primary(MustPrimary::TxidFunction(name.to_owned()))
        }
        "pg_notify" => return Builtin::Primary(MustPrimary::Notify),
        "set_config" => return Builtin::SetConfig,
        "pg_is_in_recovery" => return Builtin::Primary(MustPrimary::ServerState(name.to_owned())),
        "lowrite" => return Builtin::Primary(MustPrimary::BuiltinWriter(name.to_owned())),
        _ => {}
    }
    if name.starts_with("pg_advisory_") || name.starts_with("pg_try_advisory_") {
        return Builtin::Primary(MustPrimary::AdvisoryLock {
            session_level: !name.contains("_xact_"),
        });
    }
    if name.starts_with("lo_") && name != "lo_get" {
        return Builtin::Primary(MustPrimary::BuiltinWriter(name.to_owned()));
    }
    if primary_only().contains(name) {
        return Builtin::Primary(MustPrimary::BuiltinWriter(name.to_owned()));
    }
    if standby_safe().contains(name) {
        return Builtin::StandbySafe;
    }
    Builtin::Unknown
}

/// Whether `f` is a built-in pgfresh knows: one that writes nothing, or whose writes the
/// analysis names itself (`nextval`, the large-object functions ...). Anything else may be a
/// user function, whose body only the catalog tells.
pub fn is_known_builtin(f: &FuncName) -> bool {
    !matches!(classify_builtin(f), Builtin::Unknown)
}

/// Some of `functions` is not a known built-in: what it may write or fire only the
/// catalog tells.
pub fn calls_user_functions(functions: &[FuncName]) -> bool {
    functions.iter().any(|f| !is_known_builtin(f))
}

/// A built-in whose answer comes from the system catalogs (`to_regclass`, `pg_get_viewdef`,
/// `has_table_privilege`, `pg_table_size` ...): the call counts as a catalog read.
pub(crate) fn reads_catalog(f: &FuncName) -> bool {
    static SET: OnceLock<HashSet<&'static str>> = OnceLock::new();
    matches!(f.schema.as_deref(), None | Some("pg_catalog"))
        && SET
            .get_or_init(|| CATALOG_LOOKUPS.iter().copied().collect())
            .contains(&*f.name)
}

/// A type whose input looks a name up in the catalogs (`'orders'::regclass`); `names` is
/// the type name's parts (`[pg_catalog, ]regclass`).
pub(crate) fn is_catalog_type(names: &[&str]) -> bool {
    match names {
        [name] | ["pg_catalog", name] => CATALOG_TYPES.contains(name),
        _ => false,
    }
}

/// What a built-in large-object function does to `pg_catalog.pg_largeobject`, where large
/// objects live: `lo_get` and `loread` read it; every other `lo_*` function and `lowrite`
/// write it (or may: `lo_open` and the like are counted as writes, which only keeps
/// reads of large objects on the primary a little longer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LargeObjects {
    Read,
    Write,
}

/// [`LargeObjects`] for a call of `f`, when it is a built-in large-object function.
pub(crate) fn large_objects(f: &FuncName) -> Option<LargeObjects> {
    if !matches!(f.schema.as_deref(), None | Some("pg_catalog")) {
        return None;
    }
    match &*f.name {
        "lo_get" | "loread" => Some(LargeObjects::Read),
        "lowrite" => Some(LargeObjects::Write),
        n if n.starts_with("lo_") => Some(LargeObjects::Write),
        _ => None,
    }
}

/// Volatility as PostgreSQL's `pg_proc.provolatile` records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Volatility {
    /// `i`: same result for the same arguments, forever.
    Immutable,
    /// `s`: same result within one statement; cannot modify the database.
    Stable,
    /// `v`: may do anything, including writes.
    Volatile,
}

/// Source of function volatility, typically learned from `pg_proc` on the primary.
pub trait VolatilityOracle {
    /// Volatility of the function, or `None` when it is not known.
    fn volatility(&self, f: &FuncName) -> Option<Volatility>;
}

impl<F> VolatilityOracle for F
where
    F: Fn(&FuncName) -> Option<Volatility>,
{
    fn volatility(&self, f: &FuncName) -> Option<Volatility> {
        self(f)
    }
}

/// Operator configuration for function calls (`write_function_list`,
/// `read_only_function_list`).
///
/// Matching: an unqualified list entry matches a call to that name in any schema. A qualified
/// write entry (`app.f`) also matches an unqualified call `f` (it may resolve to `app.f`); a
/// qualified read-only entry matches only calls qualified the same way. A function in both
/// lists is treated as a writer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionPolicy {
    /// Functions that write: calls go to the primary.
    pub write_functions: HashSet<FuncName>,
    /// User functions known not to write: calls may run on a standby.
    pub read_only_functions: HashSet<FuncName>,
}

impl FunctionPolicy {
    /// Builds a policy from names as written in configuration (`f`, `app.f`, `"App"."F"`).
    pub fn from_lists<W, R>(write: W, read_only: R) -> Result<Self, crate::NameError>
    where
        W: IntoIterator,
        W::Item: AsRef<str>,
        R: IntoIterator,
        R::Item: AsRef<str>,
    {
        Ok(Self {
            write_functions: write
                .into_iter()
                .map(|n| FuncName::parse(n.as_ref()))
                .collect::<Result<_, _>>()?,
            read_only_functions: read_only
                .into_iter()
                .map(|n| FuncName::parse(n.as_ref()))
                .collect::<Result<_, _>>()?,
        })
    }

    /// True when the call may be one of the listed write functions.
    pub fn is_write(&self, call: &FuncName) -> bool {
        if self.write_functions.is_empty() {
            return false;
        }
        let bare = FuncName {
            schema: None,
            name: call.name.clone(),
        };
        if self.write_functions.contains(call) || self.write_functions.contains(&bare) {
            return true;
        }
        // An unqualified call may resolve to a qualified entry.
        call.schema.is_none() && self.write_functions.iter().any(|w| w.name == call.name)
    }

    /// True when the call is certainly one of the listed read-only functions.
    pub fn is_read_only(&self, call: &FuncName) -> bool {
        if self.read_only_functions.is_empty() {
            return false;
        }
        let bare = FuncName {
            schema: None,
            name: call.name.clone(),
        };
        self.read_only_functions.contains(call) || self.read_only_functions.contains(&bare)
    }
}

/// Must-primary reasons the function policy adds for `functions` (sorted, deduplicated).
///
/// Built-ins that need the primary are already in the cached analysis and are not repeated.
/// A call stays a read only when it is a standby-safe built-in, a listed read-only function,
/// or STABLE/IMMUTABLE according to the oracle; a listed write function, a VOLATILE function,
/// or a function nobody knows (no oracle, or the oracle has no entry) sends the statement to
/// the primary.
pub fn reasons_for(
    functions: &[FuncName],
    policy: &FunctionPolicy,
    oracle: Option<&dyn VolatilityOracle>,
) -> Vec<MustPrimary> {
    let mut out = Vec::new();
    for f in functions {
        if policy.is_write(f) {
            out.push(MustPrimary::ListedWriteFunction(f.clone()));
            continue;
        }
        match classify_builtin(f) {
            Builtin::StandbySafe | Builtin::Primary(_) | Builtin::SetConfig => continue,
            Builtin::Unknown => {}
        }
        if policy.is_read_only(f) {
            continue;
        }
        match oracle.and_then(|o| o.volatility(f)) {
            Some(Volatility::Immutable | Volatility::Stable) => {}
            Some(Volatility::Volatile) | None => out.push(MustPrimary::UserFunction(f.clone())),
        }
    }
    out.sort();
    out.dedup();
    out
}

impl crate::Analysis {
    /// Must-primary reasons from the function policy for every function this string calls.
    /// An empty result means the function calls alone do not prevent a standby.
    pub fn function_reasons(
        &self,
        policy: &FunctionPolicy,
        oracle: Option<&dyn VolatilityOracle>,
    ) -> Vec<MustPrimary> {
        reasons_for(&self.functions, policy, oracle)
    }
}

impl crate::Statement {
    /// Must-primary reasons from the function policy for this statement's calls (used for the
    /// inner statement of a SQL `PREPARE` when it is executed).
    pub fn function_reasons(
        &self,
        policy: &FunctionPolicy,
        oracle: Option<&dyn VolatilityOracle>,
    ) -> Vec<MustPrimary> {
        reasons_for(&self.functions, policy, oracle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_do_not_overlap() {
        for name in PRIMARY_ONLY {
            assert!(!standby_safe().contains(name), "{name} in both tables");
        }
    }

    #[test]
    fn an_analysis_knows_whether_it_calls_user_functions() {
        let calls = |sql: &str| crate::analyze_uncached(sql).calls_user_functions;
        assert!(!calls("SELECT count(*), now() FROM t"));
        assert!(!calls("SELECT nextval('s'); SELECT lower(name) FROM t"));
        assert!(calls("SELECT app.total(id) FROM t"));
        assert!(calls("SELECT 1; SELECT place_order(1)"));
    }

    #[test]
    fn builtin_classes() {
        let f = |s: &str| classify_builtin(&FuncName::parse(s).unwrap());
        assert_eq!(f("now"), Builtin::StandbySafe);
        assert_eq!(f("pg_catalog.lower"), Builtin::StandbySafe);
        assert_eq!(f("app.lower"), Builtin::Unknown);
        assert_eq!(
            f("pg_try_advisory_xact_lock"),
            Builtin::Primary(MustPrimary::AdvisoryLock {
                session_level: false
            })
        );
        assert_eq!(
            f("lo_import"),
            Builtin::Primary(MustPrimary::BuiltinWriter("lo_import".into()))
        );
        assert_eq!(f("lo_get"), Builtin::StandbySafe);
        assert_eq!(f("set_config"), Builtin::SetConfig);
        assert_eq!(f("my_func"), Builtin::Unknown);
    }

    #[test]
    fn catalog_lookups_are_standby_safe_built_ins() {
        for name in CATALOG_LOOKUPS {
            let f = FuncName::parse(name).unwrap();
            assert_eq!(classify_builtin(&f), Builtin::StandbySafe, "{name}");
            assert!(reads_catalog(&f), "{name}");
        }
        assert!(!reads_catalog(&FuncName::parse("app.to_regclass").unwrap()));
        assert!(!reads_catalog(&FuncName::parse("lower").unwrap()));
        assert!(is_catalog_type(&["pg_catalog", "regclass"]));
        assert!(!is_catalog_type(&["int4"]));
    }
}
