//! What the fake server does with one SQL statement. Statements are told apart by their
//! first keyword, as PostgreSQL's grammar would, and by a few markers the fuzzer (or its
//! dictionary) can write into the text:
//!
//! * `fail`: the statement fails with an ERROR;
//! * `die`: the server ends the session with a FATAL error (as `pg_terminate_backend`);
//! * `pg_sleep`: the statement runs until cancelled, or 20 ms;
//! * `series`: a SELECT returns 10 rows instead of 1.
//!
//! A SELECT answers its first single-quoted literal (or `1`), so the harness can tell
//! whose answer it received.

use super::msg::{Column, Value, BOOL, FLOAT8, INT8, TEXT};

/// The node a server plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Replica,
}

/// The WAL position every node reports: replicas have replayed everything.
pub const LSN: &str = "0/3000000";

/// How a statement changes the transaction state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxEffect {
    None,
    Begin,
    Commit,
    Rollback,
    /// `ROLLBACK TO SAVEPOINT`: leaves a failed transaction usable again.
    RollbackTo,
    /// `SAVEPOINT`, `RELEASE`: only inside a transaction block.
    Savepoint,
}

/// What running a statement produces.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Rows, then `SELECT n`.
    Rows {
        columns: Vec<Column>,
        rows: Vec<Vec<Value>>,
    },
    /// A command without rows and its tag.
    Command { tag: String, effect: TxEffect },
    /// ERROR with this SQLSTATE and message.
    Error { code: &'static str, message: String },
    /// FATAL error, then the server closes the connection.
    Die,
    /// COPY FROM STDIN: the server waits for CopyData.
    CopyIn,
    /// COPY TO STDOUT: two rows of CopyData.
    CopyOut,
    /// Runs until cancelled (then ERROR 57014) or until a short timeout (then `SELECT 1`).
    Sleep,
    /// An empty statement (only blanks and comments).
    Empty,
}

/// The statements of a simple Query, split at semicolons (quotes are not honoured:
/// the fake server is not a parser). An empty list is an empty query.
pub fn split(sql: &str) -> Vec<&str> {
    sql.split(';')
        .filter(|s| !strip_comments(s).is_empty())
        .collect()
}

/// The text after leading blanks and comments.
fn strip_comments(mut s: &str) -> &str {
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |(_, r)| r);
        } else {
            return s;
        }
    }
}

/// The first word in upper case, and the upper-cased text.
fn words(sql: &str) -> (String, String) {
    let text = strip_comments(sql);
    let first: String = text
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    (first.to_ascii_uppercase(), text.to_ascii_uppercase())
}

/// Commands that end a failed transaction rather than being refused in it.
pub fn ends_transaction(sql: &str) -> bool {
    let (first, upper) = words(sql);
    matches!(
        effect(&first, &upper),
        TxEffect::Commit | TxEffect::Rollback | TxEffect::RollbackTo
    )
}

fn effect(first: &str, upper: &str) -> TxEffect {
    match first {
        "BEGIN" | "START" => TxEffect::Begin,
        "COMMIT" | "END" => TxEffect::Commit,
        "ROLLBACK" | "ABORT" if upper.contains(" TO ") => TxEffect::RollbackTo,
        "ROLLBACK" | "ABORT" => TxEffect::Rollback,
        "SAVEPOINT" | "RELEASE" => TxEffect::Savepoint,
        _ => TxEffect::None,
    }
}

/// Statements PostgreSQL's grammar starts with, that return no rows (besides the ones
/// with their own handling).
const COMMANDS: &[&str] = &[
    "ALTER",
    "ANALYZE",
    "CALL",
    "CHECKPOINT",
    "CLOSE",
    "CLUSTER",
    "COMMENT",
    "CREATE",
    "DEALLOCATE",
    "DECLARE",
    "DELETE",
    "DISCARD",
    "DO",
    "DROP",
    "EXECUTE",
    "GRANT",
    "INSERT",
    "LISTEN",
    "LOAD",
    "LOCK",
    "MERGE",
    "MOVE",
    "NOTIFY",
    "PREPARE",
    "REFRESH",
    "REINDEX",
    "RELEASE",
    "RESET",
    "REVOKE",
    "SAVEPOINT",
    "SET",
    "TRUNCATE",
    "UNLISTEN",
    "UPDATE",
    "VACUUM",
];

/// Statements that return rows.
const QUERIES: &[&str] = &[
    "EXPLAIN", "FETCH", "SELECT", "SHOW", "TABLE", "VALUES", "WITH",
];

/// What `sql` (one statement) does on a server playing `role`.
pub fn run(sql: &str, role: Role) -> Outcome {
    let (first, upper) = words(sql);
    if upper.contains("DIE") {
        return Outcome::Die;
    }
    if upper.contains("FAIL") {
        return Outcome::Error {
            code: "P0001",
            message: "failed as asked".into(),
        };
    }
    if first.is_empty() && strip_comments(sql).is_empty() {
        return Outcome::Empty;
    }
    match effect(&first, &upper) {
        TxEffect::None => {}
        TxEffect::Begin if first == "START" => {
            return command("START TRANSACTION".into(), TxEffect::Begin)
        }
        TxEffect::Begin => return command("BEGIN".into(), TxEffect::Begin),
        TxEffect::Commit => return command("COMMIT".into(), TxEffect::Commit),
        e @ (TxEffect::Rollback | TxEffect::RollbackTo) => return command("ROLLBACK".into(), e),
        TxEffect::Savepoint => return command(first, TxEffect::Savepoint),
    }
    if let Some(columns) = columns(&upper) {
        if upper.contains("PG_SLEEP") {
            return Outcome::Sleep;
        }
        return Outcome::Rows {
            rows: rows(sql, &upper, role),
            columns,
        };
    }
    match first.as_str() {
        "COPY" if upper.contains("FROM STDIN") => Outcome::CopyIn,
        "COPY" if upper.contains("TO STDOUT") => Outcome::CopyOut,
        "COPY" => command("COPY 0".into(), TxEffect::None),
        "INSERT" => command("INSERT 0 1".into(), TxEffect::None),
        "UPDATE" | "DELETE" | "MERGE" => command(format!("{first} 1"), TxEffect::None),
        "CREATE" | "DROP" | "ALTER" => {
            let second = upper.split_whitespace().nth(1).unwrap_or("TABLE");
            command(format!("{first} {second}"), TxEffect::None)
        }
        "DISCARD" if upper.contains("ALL") => command("DISCARD ALL".into(), TxEffect::None),
        f if COMMANDS.contains(&f) => command(first.clone(), TxEffect::None),
        _ => Outcome::Error {
            code: "42601",
            message: "syntax error".into(),
        },
    }
}

fn command(tag: String, effect: TxEffect) -> Outcome {
    Outcome::Command { tag, effect }
}

/// The monitor's poll: one round trip with the role, WAL positions and receiver state.
fn is_monitor_poll(upper: &str) -> bool {
    upper.contains("PG_IS_IN_RECOVERY() AS REC")
}

/// The columns of a row-returning statement, `None` for any other.
pub fn columns(upper: &str) -> Option<Vec<Column>> {
    let first = words(upper).0;
    if is_monitor_poll(upper) {
        let c = |name, oid| Column { name, oid };
        return Some(vec![
            c("rec", BOOL),
            c("current", TEXT),
            c("replay", TEXT),
            c("receive", TEXT),
            c("paused", BOOL),
            c("age", FLOAT8),
            c("status", TEXT),
            c("timeline", INT8),
            c("control_timeline", INT8),
        ]);
    }
    if upper.contains("PG_PROC") {
        // The catalog reader's function volatility query: three text columns.
        return Some(
            ["nspname", "proname", "provolatile"]
                .map(|name| Column { name, oid: TEXT })
                .to_vec(),
        );
    }
    QUERIES.contains(&first.as_str()).then(|| {
        vec![Column {
            name: "?column?",
            oid: TEXT,
        }]
    })
}

fn rows(sql: &str, upper: &str, role: Role) -> Vec<Vec<Value>> {
    if is_monitor_poll(upper) {
        return vec![monitor_row(role)];
    }
    if upper.contains("PG_PROC") {
        return Vec::new();
    }
    let value = if upper.contains("LSN") {
        LSN.to_string()
    } else {
        first_literal(sql).unwrap_or("1").to_string()
    };
    let n = if upper.contains("SERIES") { 10 } else { 1 };
    vec![vec![Value::Text(value)]; n]
}

/// The text between the first pair of single quotes.
pub fn first_literal(sql: &str) -> Option<&str> {
    let (_, rest) = sql.split_once('\'')?;
    Some(rest.split_once('\'')?.0)
}

/// The poll's row (see `POLL_SQL` in pgfresh-balancer): a primary at [`LSN`], or a
/// streaming replica that has replayed it. The timeline is left unknown, so no timeline
/// history is asked for.
fn monitor_row(role: Role) -> Vec<Value> {
    let lsn = || Value::Text(LSN.into());
    match role {
        Role::Primary => vec![
            Value::Bool(false),
            lsn(),
            Value::Null,
            Value::Null,
            Value::Bool(false),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
        ],
        Role::Replica => vec![
            Value::Bool(true),
            Value::Null,
            lsn(),
            lsn(),
            Value::Bool(false),
            Value::Float8(0.0),
            Value::Text("streaming".into()),
            Value::Null,
            Value::Null,
        ],
    }
}

/// The number of parameters a statement uses: its highest `$n`.
pub fn parameter_count(sql: &str) -> usize {
    let b = sql.as_bytes();
    let mut max = 0;
    for (i, _) in sql.match_indices('$') {
        let digits: String = b[i + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .take(4)
            .map(|&c| c as char)
            .collect();
        max = max.max(digits.parse().unwrap_or(0));
    }
    max
}
