//! The graph described for people: `SHOW DEPENDENCIES` and `GET /v1/dependencies`.

use serde::{Serialize, Serializer};

/// Why one relation or function leads to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    /// A write to `from` fires trigger `via`, whose function is `to`.
    Trigger,
    /// A write to `from` runs the actions of rewrite rule `via`, which write or call `to`.
    Rule,
    /// A delete or update of `from` cascades to `to` (foreign key `via`).
    ForeignKey,
    /// View `from` reads `to` (and a write through the view writes it), or calls function
    /// `to` (see `action`).
    View,
    /// A read of `from` is filtered by row-security policy `via`, whose expression reads or
    /// calls `to`.
    Policy,
    /// `to` is a partition of `from`.
    Partition,
    /// `to` inherits from `from`.
    Inheritance,
    /// Function `from` writes, reads or calls `to` (see `action`).
    Function,
    /// A write to `from` evaluates an expression (`via`: a column `default`, a `check`
    /// constraint, an `index` expression) that calls function `to`.
    Expression,
    /// DDL (`from` is `ddl`) fires event trigger `via`, whose function is `to`.
    EventTrigger,
    /// A rule from `relation_dependencies`.
    Manual,
}

/// One edge of the dependency graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Edge {
    /// What kind of dependency.
    pub kind: EdgeKind,
    /// Source: a relation (`schema.name`) or a function (`schema.name()`).
    pub from: String,
    /// Target, written the same way.
    pub to: String,
    /// The trigger, constraint or rule behind the edge, if any.
    pub via: Option<String>,
    /// What happens: `fires`, `on delete cascade`, `reads`, `writes`, `calls` ...
    pub action: String,
}

/// A function whose effects cannot be known from its text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct UnanalysableBody {
    /// `schema.name()`.
    pub function: String,
    /// Its language.
    pub language: String,
    /// Why: `dynamic SQL (EXECUTE)`, `language plpython3u`, a parse error ...
    pub reason: String,
    /// A manual rule describes the function, so calls of it expand to the rule's relations
    /// instead of the whole database.
    pub overridden_by_rule: bool,
}

/// Everything the graph knows, for introspection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DependencyReport {
    /// Relations known from the catalog.
    pub relations: usize,
    /// Functions known from the catalog.
    pub functions: usize,
    /// Every edge, sorted.
    pub edges: Vec<Edge>,
    /// Functions whose bodies cannot be analysed, sorted.
    pub unanalysable: Vec<UnanalysableBody>,
    /// Unlogged tables (`schema.name`, sorted): a standby cannot read them, so every read
    /// that reaches one runs on the primary.
    pub unlogged: Vec<String>,
}

/// Serializes a value through its `Display`.
pub(crate) fn display<T: std::fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Serializes a list through each element's `Display`.
pub(crate) fn display_all<T: std::fmt::Display, S: Serializer>(
    v: &[T],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|x| x.to_string()))
}

/// The referential actions of a foreign key that write the referencing table, as words;
/// `None` when neither does (NO ACTION, RESTRICT).
pub(crate) fn fk_action(on_delete: char, on_update: char) -> Option<String> {
    let word = |c: char| match c {
        'c' => Some("cascade"),
        'n' => Some("set null"),
        'd' => Some("set default"),
        _ => None,
    };
    let parts: Vec<String> = [("on delete", on_delete), ("on update", on_update)]
        .into_iter()
        .filter_map(|(when, c)| word(c).map(|w| format!("{when} {w}")))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fk_actions() {
        assert_eq!(fk_action('a', 'r'), None);
        assert_eq!(fk_action('c', 'a').as_deref(), Some("on delete cascade"));
        assert_eq!(
            fk_action('n', 'd').as_deref(),
            Some("on delete set null, on update set default")
        );
    }
}
