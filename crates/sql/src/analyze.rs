//! Entry points: parse once, classify each statement, combine the verdicts.

use pg_query::protobuf::Token;

use crate::classify::{classify, sort_dedup};
use crate::hints::hints_in;
use crate::model::{Analysis, Kind, Statement};

/// Analyses SQL text without the cache. Pure, synchronous, never panics on any input.
///
/// Empty text (or text with only comments and semicolons), a NUL byte, and anything the
/// PostgreSQL parser rejects yield [`Kind::Unclassified`] with the reason in
/// [`Analysis::error`].
pub fn analyze_uncached(sql: &str) -> Analysis {
    let comments = if sql.contains("/*") || sql.contains("--") {
        scan_comments(sql)
    } else {
        Vec::new()
    };
    let hints = hints_in(comments.iter().map(String::as_str));

    let parsed = match pg_query::parse(sql) {
        Ok(p) => p,
        Err(e) => {
            let mut a = Analysis::unclassified(error_message(e));
            a.comments = comments;
            a.hint = hints.route;
            a.min_lsn_hint = hints.min_lsn;
            a.min_lsn_malformed = hints.bad_min_lsn;
            return a;
        }
    };
    let mut statements = Vec::with_capacity(parsed.protobuf.stmts.len());
    for raw in &parsed.protobuf.stmts {
        let start = usize::try_from(raw.stmt_location)
            .unwrap_or(0)
            .min(sql.len());
        let end = match usize::try_from(raw.stmt_len) {
            Ok(0) | Err(_) => sql.len(),
            Ok(len) => start.saturating_add(len).min(sql.len()),
        };
        let stmt = match raw.stmt.as_deref().and_then(|n| n.node.as_ref()) {
            Some(node) => classify(node, (start, end)),
            None => Statement::new(Kind::Unclassified, (start, end)),
        };
        statements.push(stmt);
    }
    let mut analysis = combine(statements);
    analysis.comments = comments;
    analysis.hint = hints.route;
    analysis.min_lsn_hint = hints.min_lsn;
    analysis.min_lsn_malformed = hints.bad_min_lsn;
    analysis
}

/// Where the first statement of `sql` ends, its semicolon included, when another follows:
/// the byte at which the rest of the text begins. `None` for one statement, and for text
/// the parser rejects.
pub fn after_first_statement(sql: &str) -> Option<usize> {
    let parsed = pg_query::parse(sql).ok()?;
    let second = parsed.protobuf.stmts.get(1)?;
    // The second statement's location is just after the first one's semicolon (its
    // leading blanks and comments belong to it).
    let at = usize::try_from(second.stmt_location).ok()?;
    (at > 0 && at < sql.len() && sql.is_char_boundary(at)).then_some(at)
}

/// Analyses raw bytes, as they arrive in a protocol message: text that is not valid UTF-8 is
/// unclassified.
pub fn analyze_bytes(sql: &[u8]) -> Analysis {
    match std::str::from_utf8(sql) {
        Ok(s) => analyze_uncached(s),
        Err(e) => Analysis::unclassified(format!("invalid UTF-8 in query text: {e}")),
    }
}

fn error_message(e: pg_query::Error) -> String {
    match e {
        pg_query::Error::Parse(m) => m,
        pg_query::Error::Conversion(_) => "query text contains a NUL byte".to_owned(),
        other => other.to_string(),
    }
}

/// What a SQL `EXECUTE` of a statement pgfresh has no analysis of runs (one prepared
/// over the extended protocol, or by a function): it may write anything, so it is a write
/// of the whole database.
pub fn unknown_prepared_statement() -> Analysis {
    let mut s = Statement::new(Kind::Write, (0, 0));
    s.writes_unnamed = true;
    combine(vec![s])
}

/// Builds the combined analysis from the per-statement ones.
pub(crate) fn combine(statements: Vec<Statement>) -> Analysis {
    if statements.is_empty() {
        return Analysis::unclassified("empty query");
    }
    let mut a = Analysis::unclassified("");
    a.error = None;
    a.kind = Kind::Read;
    if let [only] = statements.as_slice() {
        a.kind = only.kind;
        a.reads.clone_from(&only.reads);
        a.writes.clone_from(&only.writes);
        a.must_primary.clone_from(&only.must_primary);
        a.functions.clone_from(&only.functions);
        a.implicit_calls.clone_from(&only.implicit_calls);
        a.touches_catalog = only.touches_catalog;
    } else {
        for s in &statements {
            a.kind = a.kind.combine(s.kind);
            a.reads.extend(s.reads.iter().cloned());
            a.writes.extend(s.writes.iter().cloned());
            a.must_primary.extend(s.must_primary.iter().cloned());
            a.functions.extend(s.functions.iter().cloned());
            a.implicit_calls.extend(s.implicit_calls.iter().cloned());
            a.touches_catalog |= s.touches_catalog;
        }
        sort_dedup(&mut a.reads);
        sort_dedup(&mut a.writes);
        sort_dedup(&mut a.must_primary);
        sort_dedup(&mut a.functions);
        sort_dedup(&mut a.implicit_calls);
    }
    if a.kind == Kind::Unclassified {
        a.error = Some("statement could not be classified".to_owned());
    }
    a.calls_user_functions = crate::functions::calls_user_functions(&a.functions);
    a.statements = statements;
    a
}

/// Every comment in the text, verbatim, as PostgreSQL's scanner finds them (so comment markers
/// inside literals are not comments).
fn scan_comments(sql: &str) -> Vec<String> {
    let Ok(scan) = pg_query::scan(sql) else {
        return Vec::new();
    };
    scan.tokens
        .iter()
        .filter(|t| t.token == Token::CComment as i32 || t.token == Token::SqlComment as i32)
        .filter_map(|t| {
            let (s, e) = (usize::try_from(t.start).ok()?, usize::try_from(t.end).ok()?);
            sql.get(s..e).map(str::to_owned)
        })
        .collect()
}
