//! What a function body reads, writes and calls, from its `pg_get_functiondef` text.
//!
//! PL/pgSQL: libpg_query's PL/pgSQL parser returns the function as JSON; every `PLpgSQL_expr`
//! in it (statements, conditions, assignments, cursor queries, defaults) holds SQL text whose
//! `parseMode` says how PostgreSQL completes it (0: a whole statement; 2: an expression, run
//! as `SELECT expr`; 3–5: an assignment `target := expr`). Each piece is analysed with
//! [`pgfresh_sql::analyze_uncached`]. Dynamic SQL (`EXECUTE`, `FOR ... IN EXECUTE`,
//! `RETURN QUERY EXECUTE`, `OPEN ... FOR EXECUTE`), a `DO` block, or a piece that does not
//! parse makes the body unanalysable.
//!
//! SQL: the `AS '...'` string, or the statements of a `BEGIN ATOMIC ... END` body (deparsed
//! back to text), are analysed the same way.

use pg_query::NodeEnum;
use pgfresh_sql::{analyze_uncached, FuncName, Kind, MustPrimary, RelName};
use serde_json::Value;

/// The reason reported for dynamic SQL.
pub const DYNAMIC_SQL: &str = "dynamic SQL (EXECUTE)";

/// What one body does, as written (names not yet resolved against the catalog).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BodyEffects {
    /// Relations read.
    pub reads: Vec<RelName>,
    /// Relations written.
    pub writes: Vec<RelName>,
    /// Functions called.
    pub calls: Vec<FuncName>,
    /// Operators applied and types cast to (`Statement::implicit_calls`): a user-defined
    /// one runs its function, which the graph knows by these names.
    pub implicit_calls: Vec<FuncName>,
    /// Why the body cannot be analysed, when it cannot.
    pub unanalysable: Option<String>,
    /// The body may write another database (`Statement::writes_elsewhere`: `dblink`).
    pub writes_elsewhere: bool,
}

impl BodyEffects {
    fn unanalysable(reason: impl Into<String>) -> Self {
        BodyEffects {
            unanalysable: Some(reason.into()),
            ..Default::default()
        }
    }

    fn fail(&mut self, reason: impl Into<String>) {
        if self.unanalysable.is_none() {
            self.unanalysable = Some(reason.into());
        }
    }

    /// Adds what one SQL statement (or several) does.
    fn add_sql(&mut self, sql: &str) {
        let a = analyze_uncached(sql);
        if a.kind == Kind::Unclassified {
            let why = a.error.as_deref().unwrap_or("unclassified");
            self.fail(format!("cannot parse {:?}: {why}", shorten(sql)));
            return;
        }
        if a.must_primary.contains(&MustPrimary::DoBlock) {
            self.fail("DO block");
        }
        if a.statements.iter().any(|s| s.writes_unnamed) {
            // `TRUNCATE … CASCADE`, `nextval` of a sequence named at run time ...
            self.fail(format!(
                "writes relations it does not name: {:?}",
                shorten(sql)
            ));
        }
        self.writes_elsewhere |= a.statements.iter().any(|s| s.writes_elsewhere);
        self.reads.extend(a.reads.iter().cloned());
        self.writes.extend(a.writes.iter().cloned());
        self.calls.extend(a.functions.iter().cloned());
        self.implicit_calls.extend(a.implicit_calls.iter().cloned());
    }

    fn finish(mut self) -> Self {
        for v in [&mut self.reads, &mut self.writes] {
            v.sort();
            v.dedup();
        }
        for v in [&mut self.calls, &mut self.implicit_calls] {
            v.sort();
            v.dedup();
        }
        self
    }
}

fn shorten(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// Analyses the definition of a function in `language` (`plpgsql`, `sql`, anything else is
/// unanalysable; `None` definition likewise).
pub fn analyze_body(language: &str, definition: Option<&str>) -> BodyEffects {
    let Some(def) = definition else {
        return BodyEffects::unanalysable(match language {
            "sql" | "plpgsql" => "no definition".to_owned(),
            other => format!("language {other}"),
        });
    };
    match language {
        "plpgsql" => analyze_plpgsql(def),
        "sql" => analyze_sql_function(def),
        other => BodyEffects::unanalysable(format!("language {other}")),
    }
    .finish()
}

/// What the actions of a rewrite rule do, from its `pg_get_ruledef` text (`CREATE RULE name
/// AS ON event TO relation [WHERE condition] DO [ALSO | INSTEAD] actions`): each action, and
/// the condition (for the functions it calls), analysed like a statement of a SQL function.
/// `DO INSTEAD NOTHING` does nothing.
pub fn analyze_rule(definition: &str) -> BodyEffects {
    let parsed = match pg_query::parse(definition) {
        Ok(p) => p,
        Err(e) => return BodyEffects::unanalysable(format!("rule parse failure: {e}")),
    };
    let Some(NodeEnum::RuleStmt(rule)) = first_statement(&parsed) else {
        return BodyEffects::unanalysable("not a CREATE RULE text");
    };
    let mut fx = BodyEffects::default();
    let condition = rule.where_clause.clone().map(|w| {
        // `SELECT WHERE condition`; the enums set as the parser sets them (the deparser
        // refuses their protobuf defaults).
        NodeEnum::SelectStmt(Box::new(pg_query::protobuf::SelectStmt {
            where_clause: Some(w),
            op: pg_query::protobuf::SetOperation::SetopNone as i32,
            limit_option: pg_query::protobuf::LimitOption::Default as i32,
            ..Default::default()
        }))
    });
    let actions = rule.actions.iter().filter_map(|a| a.node.clone());
    for node in condition.into_iter().chain(actions) {
        match node.deparse() {
            Ok(sql) => fx.add_sql(&sql),
            Err(e) => fx.fail(format!("cannot deparse a rule action: {e}")),
        }
    }
    fx.finish()
}

fn analyze_plpgsql(def: &str) -> BodyEffects {
    let json = match pg_query::parse_plpgsql(def) {
        Ok(j) => j,
        Err(e) => return BodyEffects::unanalysable(format!("PL/pgSQL parse failure: {e}")),
    };
    let mut fx = BodyEffects::default();
    walk(&json, &mut fx);
    fx
}

/// Statement types whose SQL is built at run time.
const DYNAMIC: [&str; 2] = ["PLpgSQL_stmt_dynexecute", "PLpgSQL_stmt_dynfors"];

fn walk(v: &Value, fx: &mut BodyEffects) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| walk(i, fx)),
        Value::Object(map) => {
            for (key, value) in map {
                if DYNAMIC.contains(&key.as_str()) {
                    fx.fail(DYNAMIC_SQL);
                } else if key == "dynquery" {
                    // RETURN QUERY EXECUTE / OPEN ... FOR EXECUTE
                    fx.fail(DYNAMIC_SQL);
                } else if key == "PLpgSQL_expr" {
                    expr(value, fx);
                    continue;
                }
                walk(value, fx);
            }
        }
        _ => {}
    }
}

/// One embedded piece of SQL, completed as PostgreSQL completes it for its parse mode.
fn expr(v: &Value, fx: &mut BodyEffects) {
    let Some(query) = v.get("query").and_then(Value::as_str) else {
        return;
    };
    let mode = v.get("parseMode").and_then(Value::as_i64).unwrap_or(0);
    match mode {
        0 => fx.add_sql(query),
        2 => fx.add_sql(&format!("SELECT {query}")),
        3..=5 => match assignment_value(query) {
            Some(value) => fx.add_sql(&format!("SELECT {value}")),
            None => fx.fail(format!("cannot parse assignment {:?}", shorten(query))),
        },
        // Modes 1 (type names) and others carry no SQL that runs.
        _ => {}
    }
}

/// The expression of `target := expr` (or `target = expr`), the target being a variable,
/// a field or an element (`a.b`, `a[i]`).
fn assignment_value(query: &str) -> Option<&str> {
    let mut depth = 0i32;
    let mut quoted = false;
    for (i, c) in query.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '[' if !quoted => depth += 1,
            ']' if !quoted => depth -= 1,
            ':' if !quoted && depth == 0 && query[i..].starts_with(":=") => {
                return Some(&query[i + 2..]);
            }
            '=' if !quoted && depth == 0 => return Some(&query[i + 1..]),
            _ => {}
        }
    }
    None
}

fn analyze_sql_function(def: &str) -> BodyEffects {
    let parsed = match pg_query::parse(def) {
        Ok(p) => p,
        Err(e) => return BodyEffects::unanalysable(format!("SQL function parse failure: {e}")),
    };
    let Some(NodeEnum::CreateFunctionStmt(cf)) = first_statement(&parsed) else {
        return BodyEffects::unanalysable("not a CREATE FUNCTION text");
    };
    let mut fx = BodyEffects::default();
    if let Some(body) = cf.sql_body.as_ref().and_then(|b| b.node.as_ref()) {
        // BEGIN ATOMIC: a list holding the list of statements.
        let mut stmts = Vec::new();
        collect_statements(body, &mut stmts);
        for s in stmts {
            match s.deparse() {
                Ok(sql) => fx.add_sql(&sql),
                Err(e) => fx.fail(format!("cannot deparse a BEGIN ATOMIC statement: {e}")),
            }
        }
        return fx;
    }
    let body = cf.options.iter().find_map(|o| match o.node.as_ref() {
        Some(NodeEnum::DefElem(d)) if d.defname == "as" => d.arg.as_ref(),
        _ => None,
    });
    let text = match body.and_then(|b| b.node.as_ref()) {
        Some(NodeEnum::List(l)) => l.items.first().and_then(|i| match i.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        }),
        Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
        _ => None,
    };
    match text {
        Some(t) if t.trim().trim_matches(';').trim().is_empty() => {}
        Some(t) => fx.add_sql(t),
        None => fx.fail("SQL function without a body"),
    }
    fx
}

/// The first statement of a parse result.
fn first_statement(parsed: &pg_query::ParseResult) -> Option<&NodeEnum> {
    parsed
        .protobuf
        .stmts
        .first()
        .and_then(|s| s.stmt.as_ref())
        .and_then(|s| s.node.as_ref())
}

fn collect_statements<'a>(node: &'a NodeEnum, out: &mut Vec<&'a NodeEnum>) {
    match node {
        NodeEnum::List(l) => {
            for i in &l.items {
                if let Some(n) = i.node.as_ref() {
                    collect_statements(n, out);
                }
            }
        }
        other => out.push(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignment_targets() {
        assert_eq!(assignment_value("v := 1"), Some(" 1"));
        assert_eq!(assignment_value("a[i] := x"), Some(" x"));
        assert_eq!(assignment_value("r.f = (SELECT 1)"), Some(" (SELECT 1)"));
        assert_eq!(assignment_value("\"a:=b\" := 2"), Some(" 2"));
        assert_eq!(assignment_value("nothing"), None);
    }

    #[test]
    fn rule_actions() {
        let fx = analyze_rule(
            "CREATE RULE r AS ON INSERT TO app.orders WHERE (app.keep(new.id)) \
             DO ALSO (INSERT INTO app.audit (id) VALUES (new.id); \
             UPDATE counts SET n = (n + 1) WHERE (id = 1); SELECT app.notify_it(new.id));",
        );
        assert_eq!(fx.unanalysable, None);
        let names = |v: &[RelName]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(names(&fx.writes), ["counts", "app.audit"]);
        let calls: Vec<String> = fx.calls.iter().map(ToString::to_string).collect();
        assert_eq!(calls, ["app.keep", "app.notify_it"]);
        let nothing = analyze_rule("CREATE RULE r AS ON DELETE TO t DO INSTEAD NOTHING;");
        assert_eq!(nothing, BodyEffects::default());
        assert!(analyze_rule("SELECT 1").unanalysable.is_some());
    }

    #[test]
    fn shortens_long_text() {
        assert_eq!(shorten(&"x".repeat(100)).len(), 63);
        assert_eq!(shorten(" a "), "a");
    }
}
