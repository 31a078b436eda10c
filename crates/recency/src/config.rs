//! Configuration, relation names and relation patterns.

use std::fmt;
use std::str::FromStr;

/// Settings of a [`crate::RecencyMap`]. Every field except `max_entries` can also be
/// changed later through the map's setters; `max_entries` through
/// [`crate::RecencyMap::set_max_entries`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecencyConfig {
    /// How long (ms) a committed write keeps its relation hot (`recent_access_ttl_ms`).
    /// `0` disables recency forcing: writes are not recorded and lookups answer cold,
    /// except for `always_hot` relations.
    pub ttl_ms: u64,
    /// The shortest window a write stays recent, whatever the TTL (see
    /// [`crate::RecencyMap::set_window_floor_ms`]). `0`: the TTL alone.
    pub window_floor_ms: u64,
    /// Upper bound for any TTL that is set (`recent_access_max_ttl_ms`).
    pub max_ttl_ms: u64,
    /// Optional cap on how long a continuously written relation is forced to the
    /// primary, counted from the first write of its unbroken hot streak. `None`: no cap.
    pub max_staleness_ms: Option<u64>,
    /// Length (ms) of the cold-start window, during which every lookup answers hot.
    /// Starts when the map is created and again on
    /// [`crate::RecencyMap::begin_cold_start`]. `0`: no cold-start window.
    pub cold_start_ms: u64,
    /// Hard cap on the number of tracked relation entries, all databases together.
    pub max_entries: usize,
    /// Relations whose writes are never recorded.
    pub never_track: Vec<RelPattern>,
    /// Relations that every lookup treats as hot.
    pub always_hot: Vec<RelPattern>,
}

impl Default for RecencyConfig {
    /// TTL 1 s, no window floor, cap 60 s, no staleness cap, 1 s cold start, 100 000
    /// entries, empty lists.
    fn default() -> Self {
        RecencyConfig {
            ttl_ms: 1_000,
            window_floor_ms: 0,
            max_ttl_ms: 60_000,
            max_staleness_ms: None,
            cold_start_ms: 1_000,
            max_entries: 100_000,
            never_track: Vec::new(),
            always_hot: Vec::new(),
        }
    }
}

/// A relation as the SQL layer names it: identifiers already folded (unquoted names
/// lower-cased, quoted names kept verbatim), schema present only when the statement
/// qualified the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RelKey<'a> {
    /// The schema, when the statement wrote `schema.name`.
    pub schema: Option<&'a str>,
    /// The relation name.
    pub name: &'a str,
}

impl<'a> RelKey<'a> {
    /// A relation named without a schema (`orders`).
    pub fn unqualified(name: &'a str) -> Self {
        RelKey { schema: None, name }
    }

    /// A schema-qualified relation (`app.orders`).
    pub fn qualified(schema: &'a str, name: &'a str) -> Self {
        RelKey {
            schema: Some(schema),
            name,
        }
    }
}

impl fmt::Display for RelKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.schema {
            Some(s) => write!(f, "{s}.{}", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// A relation pattern for the `never_track` and `always_hot` lists.
///
/// Text form: `name`, `schema.name`, `schema.*`, `*.name` or `*`. Identifiers follow
/// PostgreSQL's rules: unquoted ones are folded to lower case, double-quoted ones are
/// kept as written (`"Audit"."Log"`, with `""` for a literal quote). A missing schema
/// or `*` matches any schema; `*` as the name matches any relation.
///
/// Matching is conservative in the safe direction for each list:
/// - `never_track` drops a write only when the pattern certainly covers it. A write
///   to unqualified `log` is not covered by `audit.log`, since the statement may have
///   written another schema's `log`.
/// - `always_hot` forces a read whenever the pattern may match it. A read of
///   unqualified `orders` matches `app.orders`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RelPattern {
    schema: Option<String>,
    name: Option<String>,
}

impl RelPattern {
    /// A pattern from already folded parts; `None` is a wildcard.
    pub fn new(schema: Option<&str>, name: Option<&str>) -> Self {
        RelPattern {
            schema: schema.map(str::to_owned),
            name: name.map(str::to_owned),
        }
    }

    /// The schema part; `None` matches any schema.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The name part; `None` matches any name.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// True when every relation `rel` can denote is matched (used for `never_track`).
    pub fn covers(&self, rel: &RelKey<'_>) -> bool {
        let name_ok = self.name.as_deref().is_none_or(|n| n == rel.name);
        let schema_ok = match (self.schema.as_deref(), rel.schema) {
            (None, _) => true,
            (Some(p), Some(s)) => p == s,
            (Some(_), None) => false,
        };
        name_ok && schema_ok
    }

    /// True when `rel` may denote a matched relation (used for `always_hot`).
    pub fn may_match(&self, rel: &RelKey<'_>) -> bool {
        let name_ok = self.name.as_deref().is_none_or(|n| n == rel.name);
        let schema_ok = match (self.schema.as_deref(), rel.schema) {
            (Some(p), Some(s)) => p == s,
            _ => true,
        };
        name_ok && schema_ok
    }
}

impl fmt::Display for RelPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |f: &mut fmt::Formatter<'_>, p: Option<&str>| match p {
            None => f.write_str("*"),
            Some(s) if is_plain_ident(s) => f.write_str(s),
            Some(s) => write!(f, "\"{}\"", s.replace('"', "\"\"")),
        };
        if let Some(schema) = self.schema.as_deref() {
            part(f, Some(schema))?;
            f.write_str(".")?;
        }
        part(f, self.name.as_deref())
    }
}

fn is_plain_ident(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'$'))
}

/// A relation pattern could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParsePatternError {
    /// Empty text or an empty identifier (`app.`).
    #[error("empty identifier in relation pattern {0:?}")]
    Empty(String),
    /// A double-quoted identifier without its closing quote.
    #[error("unterminated quoted identifier in relation pattern {0:?}")]
    Unterminated(String),
    /// More than two dot-separated parts, or text after a quoted identifier.
    #[error("relation pattern {0:?} must be name, schema.name, schema.* or *.name")]
    Shape(String),
}

impl FromStr for RelPattern {
    type Err = ParsePatternError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut parts: Vec<Option<String>> = Vec::with_capacity(2);
        let mut rest = text.trim();
        loop {
            let (part, after) = parse_part(rest, text)?;
            parts.push(part);
            match after.strip_prefix('.') {
                Some(next) => rest = next,
                None if after.is_empty() => break,
                None => return Err(ParsePatternError::Shape(text.to_owned())),
            }
            if parts.len() == 2 {
                return Err(ParsePatternError::Shape(text.to_owned()));
            }
        }
        let name = parts.pop().flatten();
        let schema = parts.pop().flatten();
        Ok(RelPattern { schema, name })
    }
}

/// Reads one identifier (or `*`) from the start of `s`; returns it and the rest.
fn parse_part<'s>(s: &'s str, whole: &str) -> Result<(Option<String>, &'s str), ParsePatternError> {
    if let Some(rest) = s.strip_prefix('*') {
        return Ok((None, rest));
    }
    if let Some(body) = s.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            if c != '"' {
                out.push(c);
                continue;
            }
            if body[i + 1..].starts_with('"') {
                out.push('"');
                chars.next();
                continue;
            }
            if out.is_empty() {
                return Err(ParsePatternError::Empty(whole.to_owned()));
            }
            return Ok((Some(out), &body[i + 1..]));
        }
        return Err(ParsePatternError::Unterminated(whole.to_owned()));
    }
    let end = s.find(['.', '"']).unwrap_or(s.len());
    let ident = s[..end].trim();
    if ident.is_empty() {
        return Err(ParsePatternError::Empty(whole.to_owned()));
    }
    Ok((Some(ident.to_ascii_lowercase()), &s[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> RelPattern {
        s.parse().unwrap()
    }

    #[test]
    fn parses_forms() {
        assert_eq!(p("Orders"), RelPattern::new(None, Some("orders")));
        assert_eq!(
            p("App.Orders"),
            RelPattern::new(Some("app"), Some("orders"))
        );
        assert_eq!(p("app.*"), RelPattern::new(Some("app"), None));
        assert_eq!(p("*.log"), RelPattern::new(None, Some("log")));
        assert_eq!(p("*"), RelPattern::new(None, None));
        assert_eq!(
            p("\"Audit\".\"Log\""),
            RelPattern::new(Some("Audit"), Some("Log"))
        );
        assert_eq!(p("\"a.b\".c"), RelPattern::new(Some("a.b"), Some("c")));
        assert_eq!(
            p("\"say \"\"hi\"\"\""),
            RelPattern::new(None, Some("say \"hi\""))
        );
    }

    #[test]
    fn rejects_bad_patterns() {
        for bad in ["", "a.", ".a", "a.b.c", "\"open", "\"\"", "\"x\"y", "a..b"] {
            assert!(bad.parse::<RelPattern>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "orders",
            "app.orders",
            "app.*",
            "*",
            "\"Audit\".\"Log\"",
            "\"a.b\".c",
        ] {
            let pat = p(text);
            assert_eq!(
                pat.to_string().parse::<RelPattern>().unwrap(),
                pat,
                "{text}"
            );
        }
        assert_eq!(p("*.log").to_string(), "log");
    }

    #[test]
    fn never_track_covers_only_certain_matches() {
        let pat = p("audit.log");
        assert!(pat.covers(&RelKey::qualified("audit", "log")));
        assert!(!pat.covers(&RelKey::unqualified("log")));
        assert!(!pat.covers(&RelKey::qualified("app", "log")));
        let any_schema = p("log");
        assert!(any_schema.covers(&RelKey::unqualified("log")));
        assert!(any_schema.covers(&RelKey::qualified("app", "log")));
        let whole_schema = p("audit.*");
        assert!(whole_schema.covers(&RelKey::qualified("audit", "x")));
        assert!(!whole_schema.covers(&RelKey::unqualified("x")));
    }

    #[test]
    fn always_hot_matches_possible_relations() {
        let pat = p("app.orders");
        assert!(pat.may_match(&RelKey::unqualified("orders")));
        assert!(pat.may_match(&RelKey::qualified("app", "orders")));
        assert!(!pat.may_match(&RelKey::qualified("b", "orders")));
        assert!(!pat.may_match(&RelKey::unqualified("items")));
    }
}
