//! Qualified names of relations and functions, folded the way PostgreSQL folds identifiers.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Why a qualified name written by a person (in configuration, on a command line) was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The text is empty or has an empty part (`app.`, `.orders`).
    #[error("empty identifier in {0:?}")]
    Empty(String),
    /// A double quote is not closed.
    #[error("unterminated quoted identifier in {0:?}")]
    Unterminated(String),
    /// More than three dot-separated parts, or garbage after a quoted part.
    #[error("malformed qualified name {0:?}")]
    Malformed(String),
}

/// A relation name after PostgreSQL identifier folding: unquoted identifiers are lower-cased,
/// quoted identifiers are kept exactly (`"Orders"` stays `Orders`, `ORDERS` becomes `orders`).
///
/// `schema` is `None` when the statement did not qualify the name. Two names denote possibly the
/// same relation when their `name`s are equal and their schemas are not both present and
/// different; see [`RelName::may_match`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelName {
    /// Schema as written (folded), `None` when unqualified.
    pub schema: Option<Arc<str>>,
    /// Relation name (folded).
    pub name: Arc<str>,
}

/// A function name after identifier folding, schema-qualified only when written so.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FuncName {
    /// Schema as written (folded), `None` when unqualified.
    pub schema: Option<Arc<str>>,
    /// Function name (folded).
    pub name: Arc<str>,
}

macro_rules! qualified_name_impl {
    ($ty:ident) => {
        impl $ty {
            /// A name from already-folded parts (as the parser reports them).
            pub fn new(schema: Option<&str>, name: &str) -> Self {
                Self {
                    schema: schema.filter(|s| !s.is_empty()).map(Arc::from),
                    name: Arc::from(name),
                }
            }

            /// Parses a possibly qualified, possibly quoted name as a person writes it in SQL
            /// (`orders`, `App.Orders`, `"App"."Orders"`), folding unquoted parts to lower case.
            /// A three-part name drops its leading database part, as PostgreSQL does.
            pub fn parse(text: &str) -> Result<Self, NameError> {
                let mut parts = parse_qualified(text)?;
                let name = parts
                    .pop()
                    .ok_or_else(|| NameError::Empty(text.to_owned()))?;
                let schema = parts.pop();
                Ok(Self {
                    schema: schema.map(Arc::from),
                    name: Arc::from(name),
                })
            }

            /// The schema, if the name was qualified.
            pub fn schema(&self) -> Option<&str> {
                self.schema.as_deref()
            }

            /// True when both names may denote the same object: equal names and schemas that
            /// are not both present and different.
            pub fn may_match(&self, other: &Self) -> bool {
                self.name == other.name
                    && match (&self.schema, &other.schema) {
                        (Some(a), Some(b)) => a == b,
                        _ => true,
                    }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                if let Some(schema) = &self.schema {
                    write_ident(f, schema)?;
                    f.write_str(".")?;
                }
                write_ident(f, &self.name)
            }
        }

        impl FromStr for $ty {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }
    };
}

qualified_name_impl!(RelName);
qualified_name_impl!(FuncName);

impl FuncName {
    /// The name under which the user functions behind operator `symbol` are known (`1 <+>
    /// 2` runs the operator's function, which the text does not name): `operator <+>`, in
    /// `schema` when the operator was qualified (`OPERATOR(app.<+>)`).
    pub fn operator(schema: Option<&str>, symbol: &str) -> Self {
        Self::new(schema, &format!("operator {symbol}"))
    }

    /// The name under which the user functions behind casts to type `type_name` are known
    /// (`x::app.money` runs the cast's function): `cast to money`, in `schema` when the type
    /// was qualified.
    pub fn cast_to(schema: Option<&str>, type_name: &str) -> Self {
        Self::new(schema, &format!("cast to {type_name}"))
    }
}

impl RelName {
    /// `pg_catalog.pg_largeobject`: what the large-object functions read and write.
    pub fn large_objects() -> RelName {
        RelName::new(Some("pg_catalog"), "pg_largeobject")
    }

    /// True for [`RelName::large_objects`]: the one system catalog whose rows applications
    /// write (through the `lo_*` functions), so its writes are tracked like a table's.
    pub fn is_large_objects(&self) -> bool {
        self.name.as_ref() == "pg_largeobject"
            && self.schema.as_deref().is_none_or(|s| s == "pg_catalog")
    }

    /// True when the name refers to the system catalogs: schema `pg_catalog` or
    /// `information_schema`, or an unqualified name starting with `pg_` (which resolves to
    /// `pg_catalog` first under every default search path).
    pub fn is_system_catalog(&self) -> bool {
        match self.schema.as_deref() {
            Some(s) => s == "pg_catalog" || s == "information_schema",
            None => self.name.starts_with("pg_"),
        }
    }
}

/// Splits `a.b.c` into folded identifiers; keeps at most the last two parts of a three-part
/// name (database.schema.name).
fn parse_qualified(text: &str) -> Result<Vec<String>, NameError> {
    let err_malformed = || NameError::Malformed(text.to_owned());
    let mut parts = Vec::new();
    let mut chars = text.trim().chars().peekable();
    loop {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    Some('"') => break,
                    Some(c) => part.push(c),
                    None => return Err(NameError::Unterminated(text.to_owned())),
                }
            }
            match chars.peek() {
                None | Some('.') => {}
                Some(_) => return Err(err_malformed()),
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                if c == '"' || c.is_whitespace() {
                    return Err(err_malformed());
                }
                part.push(c.to_ascii_lowercase());
                chars.next();
            }
        }
        if part.is_empty() {
            return Err(NameError::Empty(text.to_owned()));
        }
        parts.push(part);
        match chars.next() {
            None => break,
            Some('.') => continue,
            Some(_) => return Err(err_malformed()),
        }
    }
    match parts.len() {
        1 | 2 => Ok(parts),
        3 => Ok(parts.split_off(1)),
        _ => Err(err_malformed()),
    }
}

/// Reserved key words that must be quoted to be used as a relation or function name.
const RESERVED: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "binary",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "group",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "intersect",
    "into",
    "is",
    "isnull",
    "join",
    "lateral",
    "leading",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "natural",
    "not",
    "notnull",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "outer",
    "overlaps",
    "placing",
    "primary",
    "references",
    "returning",
    "right",
    "select",
    "session_user",
    "similar",
    "some",
    "symmetric",
    "system_user",
    "table",
    "tablesample",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
];

/// Writes an identifier, double-quoted when PostgreSQL would need quotes to read it back.
fn write_ident(f: &mut fmt::Formatter<'_>, ident: &str) -> fmt::Result {
    let plain = ident
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && ident
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$')
        && !RESERVED.contains(&ident);
    if plain {
        return f.write_str(ident);
    }
    f.write_str("\"")?;
    for c in ident.chars() {
        if c == '"' {
            f.write_str("\"\"")?;
        } else {
            fmt::Write::write_char(f, c)?;
        }
    }
    f.write_str("\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_folds_and_keeps_quotes() {
        assert_eq!(
            RelName::parse("ORDERS").unwrap(),
            RelName::new(None, "orders")
        );
        assert_eq!(
            RelName::parse("App.\"Orders\"").unwrap(),
            RelName::new(Some("app"), "Orders")
        );
        assert_eq!(
            RelName::parse("db.s.t").unwrap(),
            RelName::new(Some("s"), "t")
        );
        assert_eq!(
            RelName::parse("\"a\"\"b\"").unwrap(),
            RelName::new(None, "a\"b")
        );
        assert!(matches!(RelName::parse(""), Err(NameError::Empty(_))));
        assert!(matches!(RelName::parse("a."), Err(NameError::Empty(_))));
        assert!(matches!(
            RelName::parse("\"abc"),
            Err(NameError::Unterminated(_))
        ));
        assert!(matches!(
            RelName::parse("a.b.c.d"),
            Err(NameError::Malformed(_))
        ));
        assert!(matches!(
            RelName::parse("a b"),
            Err(NameError::Malformed(_))
        ));
    }

    #[test]
    fn display_quotes_when_needed() {
        assert_eq!(
            RelName::new(Some("app"), "orders").to_string(),
            "app.orders"
        );
        assert_eq!(RelName::new(None, "Orders").to_string(), "\"Orders\"");
        assert_eq!(RelName::new(None, "user").to_string(), "\"user\"");
        assert_eq!(RelName::new(None, "a\"b").to_string(), "\"a\"\"b\"");
        assert_eq!(RelName::new(None, "1x").to_string(), "\"1x\"");
        for n in ["Orders", "user", "a b", "x\"y", "t1"] {
            let r = RelName::new(Some("S"), n);
            assert_eq!(RelName::parse(&r.to_string()).unwrap(), r);
        }
    }

    #[test]
    fn may_match_is_conservative() {
        let a = RelName::new(None, "orders");
        let b = RelName::new(Some("app"), "orders");
        let c = RelName::new(Some("other"), "orders");
        assert!(a.may_match(&b) && b.may_match(&a));
        assert!(!b.may_match(&c));
        assert!(!a.may_match(&RelName::new(None, "Orders")));
    }

    #[test]
    fn catalog_detection() {
        assert!(RelName::new(None, "pg_class").is_system_catalog());
        assert!(RelName::new(Some("information_schema"), "tables").is_system_catalog());
        assert!(!RelName::new(Some("app"), "pg_x").is_system_catalog());
        assert!(!RelName::new(None, "orders").is_system_catalog());
    }
}
