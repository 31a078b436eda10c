//! Manual dependency rules from configuration (`relation_dependencies`).
//!
//! Two forms, names possibly schema-qualified and quoted as in SQL:
//! - `orders -> order_totals, audit_log`: a write to `orders` also writes `order_totals` and
//!   `audit_log`;
//! - `place_order() -> orders, ledger`: a call of `place_order` (any overload) writes and
//!   reads `orders` and `ledger`. Such a rule also declares what the function does, so a body
//!   pgfresh cannot analyse (dynamic SQL) no longer expands to the whole database.

use pgfresh_sql::{FuncName, RelName};
use serde::Serialize;

/// The left-hand side of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum RuleSource {
    /// A relation: a write to it writes the targets.
    Relation(#[serde(serialize_with = "crate::report::display")] RelName),
    /// A function (`name()`): a call of it writes and reads the targets.
    Function(#[serde(serialize_with = "crate::report::display")] FuncName),
}

/// One parsed rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ManualRule {
    /// The rule as written, for messages and introspection.
    pub text: String,
    /// Left-hand side.
    pub source: RuleSource,
    /// Right-hand side, in order, without duplicates.
    #[serde(serialize_with = "crate::report::display_all")]
    pub targets: Vec<RelName>,
}

impl ManualRule {
    /// Parses one rule; the error names the rule and what is wrong with it.
    pub fn parse(text: &str) -> Result<ManualRule, String> {
        let err = |what: String| format!("relation_dependencies rule {text:?}: {what}");
        let parts = split_outside_quotes(text, "->");
        let [lhs, rhs] = parts.as_slice() else {
            return Err(err(if parts.len() < 2 {
                "expected `source -> target, ...`".to_owned()
            } else {
                "more than one `->`".to_owned()
            }));
        };
        let lhs = lhs.trim();
        let source = match lhs.strip_suffix(')') {
            Some(head) => {
                let Some(name) = head.trim_end().strip_suffix('(') else {
                    return Err(err(format!(
                        "{lhs:?}: a function is written `name()`, without arguments"
                    )));
                };
                let name = name.trim_end();
                RuleSource::Function(
                    FuncName::parse(name).map_err(|e| err(format!("function name: {e}")))?,
                )
            }
            None => RuleSource::Relation(
                RelName::parse(lhs).map_err(|e| err(format!("source relation: {e}")))?,
            ),
        };
        let mut targets: Vec<RelName> = Vec::new();
        for t in split_outside_quotes(rhs, ",") {
            let t = t.trim();
            if t.is_empty() {
                return Err(err("empty target (stray comma?)".to_owned()));
            }
            let name = RelName::parse(t).map_err(|e| err(format!("target relation: {e}")))?;
            if !targets.contains(&name) {
                targets.push(name);
            }
        }
        if let RuleSource::Relation(src) = &source {
            targets.retain(|t| t != src);
            if targets.is_empty() {
                return Err(err("a relation cannot depend only on itself".to_owned()));
            }
        }
        Ok(ManualRule {
            text: text.to_owned(),
            source,
            targets,
        })
    }
}

/// Parses every rule; the first bad one is the error.
pub fn parse_rules<S: AsRef<str>>(rules: &[S]) -> Result<Vec<ManualRule>, String> {
    rules
        .iter()
        .map(|r| ManualRule::parse(r.as_ref()))
        .collect()
}

/// Splits on `sep` where it is not inside double quotes.
fn split_outside_quotes<'a>(text: &'a str, sep: &str) -> Vec<&'a str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < bytes.len() {
        if bytes[i] == b'"' {
            quoted = !quoted;
        } else if !quoted && text[i..].starts_with(sep) {
            parts.push(&text[start..i]);
            i += sep.len();
            start = i;
            continue;
        }
        i += 1;
    }
    parts.push(&text[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(s: Option<&str>, n: &str) -> RelName {
        RelName::new(s, n)
    }

    #[test]
    fn good_rules() {
        let r = ManualRule::parse("orders -> order_totals, audit_log").unwrap();
        assert_eq!(r.source, RuleSource::Relation(rel(None, "orders")));
        assert_eq!(
            r.targets,
            vec![rel(None, "order_totals"), rel(None, "audit_log")]
        );

        let r = ManualRule::parse(" place_order ( ) ->orders,ledger,orders").unwrap();
        assert_eq!(
            r.source,
            RuleSource::Function(FuncName::new(None, "place_order"))
        );
        assert_eq!(r.targets, vec![rel(None, "orders"), rel(None, "ledger")]);

        let r = ManualRule::parse(r#""App"."Orders" -> "a,b", "x->y".T"#).unwrap();
        assert_eq!(r.source, RuleSource::Relation(rel(Some("App"), "Orders")));
        assert_eq!(r.targets, vec![rel(None, "a,b"), rel(Some("x->y"), "t")]);

        let r = ManualRule::parse("Billing.Charge() -> billing.ledger").unwrap();
        assert_eq!(
            r.source,
            RuleSource::Function(FuncName::new(Some("billing"), "charge"))
        );
    }

    #[test]
    fn bad_rules_name_the_rule() {
        for (rule, needle) in [
            ("orders", "expected `source -> target"),
            ("orders -> a -> b", "more than one"),
            ("orders ->", "empty target"),
            ("orders -> a,,b", "empty target"),
            ("-> a", "source relation"),
            ("f(int) -> a", "without arguments"),
            ("\"abc -> a", "expected"),
            ("orders -> \"abc", "target relation"),
            ("a b -> c", "source relation"),
            ("orders -> orders", "only on itself"),
            ("() -> a", "function name"),
        ] {
            let e = ManualRule::parse(rule).unwrap_err();
            assert!(e.contains(&format!("{rule:?}")), "{e}");
            assert!(e.contains(needle), "{rule}: {e}");
        }
        assert!(parse_rules(&["a -> b", "c"]).unwrap_err().contains("\"c\""));
        assert_eq!(parse_rules(&["a -> b", "c -> d"]).unwrap().len(), 2);
    }
}
