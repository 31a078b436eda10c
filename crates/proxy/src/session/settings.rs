//! Session settings recorded only once the server confirmed them (DESIGN §1.7).
//!
//! Every statement a unit runs yields one [`StmtEvent`], in the order the server
//! answers them (one CommandComplete each). A setting change is *staged* when its
//! CommandComplete arrives, and becomes part of the session's state only when its
//! transaction commits: at the ReadyForQuery that ends an implicit transaction without
//! an error, or at an explicit COMMIT the server answered with `COMMIT` (a COMMIT of a
//! failed transaction is answered `ROLLBACK`). `ROLLBACK` drops what is staged,
//! `ROLLBACK TO SAVEPOINT` drops what was staged after that savepoint, and `SET LOCAL`
//! is never recorded.
//!
//! WITH HOLD cursors follow the same rules: one declared is kept once its transaction
//! commits (and pins the session to its connection, see `SessionState::hold_cursor`), while
//! a CLOSE takes effect at once, as in the server.

use std::sync::Arc;

use pgfresh_sql::{Analysis, DiscardKind, Isolation, SessionEffect, Statement, TxEffect};
use pgfresh_wire::TxStatus;

use super::state::{literal, quote_ident, SessionState};

/// A change to the session's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingChange {
    /// `name` now has the value `stmt` sets (`None`: back to its default).
    Set {
        name: String,
        value: Option<String>,
        stmt: Option<String>,
    },
    /// RESET ALL, DISCARD ALL.
    ResetAll,
    /// A WITH HOLD cursor was declared: it outlives its transaction once that commits,
    /// on the connection that declared it.
    HoldCursor(String),
    /// CLOSE of a cursor (`None`: CLOSE ALL), in effect at once: a rollback of its
    /// transaction does not bring the cursor back.
    CloseCursor(Option<String>),
}

/// What one statement means for settings, in the order of the server's answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StmtEvent {
    /// Nothing for the settings.
    Other,
    Change(Vec<SettingChange>),
    Savepoint(String),
    Release(String),
    RollbackTo(String),
    Commit,
    Rollback,
    /// CLOSE of a cursor (`None`: CLOSE ALL).
    Close(Option<String>),
    /// SQL PREPARE or DEALLOCATE: a change to the client's prepared statements (boxed:
    /// rare, and every statement has an event).
    Statements(Box<StatementChange>),
}

/// A change SQL PREPARE or DEALLOCATE makes to the client's prepared statements, made
/// when the server completes the statement (`Session::statements_completed`), as on the
/// client's own connection: not transactional (a rollback of the transaction keeps it),
/// and one the server refuses, or skips after an error before it, makes none. Until then
/// the client's next unit waits to be read (`Session::statements_unsettled`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatementChange {
    /// PREPARE `name`: its own text (prepared again as written wherever it is executed)
    /// and the analysis of the statement it prepares.
    Prepare {
        name: String,
        text: String,
        analysis: Arc<Analysis>,
    },
    /// DEALLOCATE `name` (`None`: DEALLOCATE ALL), which drops a protocol-level
    /// statement of that name too (one namespace for both).
    Deallocate(Option<String>),
}

impl StmtEvent {
    /// The event changes the client's prepared statements.
    pub fn changes_statements(&self) -> bool {
        matches!(self, StmtEvent::Statements(_))
    }
}

/// Staged changes of the open (implicit or explicit) transaction, with savepoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Staged {
    Change(SettingChange),
    Savepoint(String),
}

/// The event for `stmt`; `text` is the statement's own SQL when known (replayed as
/// written, so list and quoted values keep their exact form).
pub fn event_of(stmt: &Statement, text: Option<&str>) -> StmtEvent {
    if let Some(tx) = &stmt.tx {
        return match tx {
            TxEffect::Savepoint(n) => StmtEvent::Savepoint(n.clone()),
            TxEffect::Release(n) => StmtEvent::Release(n.clone()),
            TxEffect::RollbackTo(n) => StmtEvent::RollbackTo(n.clone()),
            // PREPARE TRANSACTION ends the transaction for the session: its settings stay.
            TxEffect::Commit { .. } | TxEffect::PrepareTransaction(_) => StmtEvent::Commit,
            TxEffect::Rollback { .. } => StmtEvent::Rollback,
            TxEffect::SetSessionCharacteristics(m) => {
                let mut changes = Vec::new();
                if let Some(ro) = m.read_only {
                    let v = if ro { "on" } else { "off" };
                    changes.push(set("default_transaction_read_only", v));
                }
                if let Some(iso) = &m.isolation {
                    let v = match iso {
                        Isolation::ReadUncommitted => "read uncommitted",
                        Isolation::ReadCommitted => "read committed",
                        Isolation::RepeatableRead => "repeatable read",
                        Isolation::Serializable => "serializable",
                    };
                    changes.push(set("default_transaction_isolation", v));
                }
                if let Some(d) = m.deferrable {
                    changes.push(set(
                        "default_transaction_deferrable",
                        if d { "on" } else { "off" },
                    ));
                }
                StmtEvent::Change(changes)
            }
            _ => StmtEvent::Other,
        };
    }
    let Some(effect) = &stmt.session else {
        return StmtEvent::Other;
    };
    if let SessionEffect::SetConfigs(calls) = effect {
        // One statement that calls set_config more than once: each call that sets the
        // session's value counts, in the order the server makes them.
        let changes: Vec<SettingChange> = calls.iter().filter_map(set_config_change).collect();
        return match changes.is_empty() {
            true => StmtEvent::Other,
            false => StmtEvent::Change(changes),
        };
    }
    let change = match effect {
        SessionEffect::Prepare { name, inner } => {
            // A text pgfresh cannot read back cannot be prepared elsewhere: not recorded.
            return text.map_or(StmtEvent::Other, |t| {
                StmtEvent::Statements(Box::new(StatementChange::Prepare {
                    name: name.clone(),
                    text: t.to_string(),
                    analysis: Arc::new(super::send::analysis_of(inner)),
                }))
            });
        }
        SessionEffect::Deallocate(name) => {
            return StmtEvent::Statements(Box::new(StatementChange::Deallocate(name.clone())))
        }
        SessionEffect::Set { local: true, .. } => return StmtEvent::Other,
        SessionEffect::Set { name, value, .. } => SettingChange::Set {
            name: name.clone(),
            value: value.clone(),
            stmt: text.map(str::to_string).or_else(|| {
                value
                    .as_ref()
                    .map(|v| format!("SET {} = {}", quote_ident(name), literal(v)))
            }),
        },
        SessionEffect::Reset(name) => SettingChange::Set {
            name: name.clone(),
            value: None,
            stmt: None,
        },
        SessionEffect::ResetAll | SessionEffect::Discard(DiscardKind::All) => {
            SettingChange::ResetAll
        }
        SessionEffect::DeclareCursor {
            name,
            with_hold: true,
        } => SettingChange::HoldCursor(name.clone()),
        SessionEffect::CloseCursor(name) => return StmtEvent::Close(name.clone()),
        SessionEffect::SetRole(v) => SettingChange::Set {
            name: "role".into(),
            value: v.clone(),
            stmt: v
                .as_ref()
                .map(|r| text.map_or_else(|| format!("SET ROLE {}", ident(r)), str::to_string)),
        },
        SessionEffect::SetSessionAuthorization(v) => SettingChange::Set {
            name: "session_authorization".into(),
            value: v.clone(),
            stmt: v.as_ref().map(|u| {
                text.map_or_else(
                    || format!("SET SESSION AUTHORIZATION {}", ident(u)),
                    str::to_string,
                )
            }),
        },
        SessionEffect::SetConfig { .. } => match set_config_change(effect) {
            Some(change) => change,
            None => return StmtEvent::Other,
        },
        _ => return StmtEvent::Other,
    };
    StmtEvent::Change(vec![change])
}

/// The change one `set_config` call makes to the session: none when it sets the
/// transaction's value only, or names what pgfresh cannot read (the session is then
/// pinned where it ran, see `send.rs`).
fn set_config_change(call: &SessionEffect) -> Option<SettingChange> {
    let SessionEffect::SetConfig {
        name: Some(name),
        value: Some(value),
        local: Some(false),
    } = call
    else {
        return None;
    };
    Some(SettingChange::Set {
        name: name.clone(),
        value: Some(value.clone()),
        stmt: Some(format!(
            "SELECT pg_catalog.set_config({}, {}, false)",
            literal(name),
            literal(value)
        )),
    })
}

fn set(name: &str, value: &str) -> SettingChange {
    SettingChange::Set {
        name: name.into(),
        value: Some(value.into()),
        stmt: Some(format!("SET {name} = {}", literal(value))),
    }
}

/// A role or user name as an identifier (quoted unless plain lower case).
fn ident(name: &str) -> String {
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// The staged changes of a session and how they settle.
#[derive(Debug, Default)]
pub struct Pending {
    staged: Vec<Staged>,
}

impl Pending {
    /// A statement completed (its CommandComplete carried `tag`). Returns the changes
    /// that are now committed.
    pub fn on_complete(&mut self, event: StmtEvent, tag: &[u8]) -> Vec<SettingChange> {
        match event {
            // (Prepared statements are no settings: see `StatementChange`.)
            StmtEvent::Other | StmtEvent::Statements(_) => Vec::new(),
            StmtEvent::Change(c) => {
                self.staged.extend(c.into_iter().map(Staged::Change));
                Vec::new()
            }
            StmtEvent::Savepoint(n) => {
                self.staged.push(Staged::Savepoint(n));
                Vec::new()
            }
            StmtEvent::Release(n) => {
                if let Some(i) = self.savepoint(&n) {
                    // The savepoint and the ones after it are gone; their changes stay.
                    let mut k = 0;
                    self.staged.retain(|s| {
                        let keep = k < i || !matches!(s, Staged::Savepoint(_));
                        k += 1;
                        keep
                    });
                }
                Vec::new()
            }
            StmtEvent::RollbackTo(n) => {
                if let Some(i) = self.savepoint(&n) {
                    self.staged.truncate(i + 1);
                }
                Vec::new()
            }
            StmtEvent::Commit if tag.starts_with(b"COMMIT") || tag.starts_with(b"PREPARE") => {
                self.take()
            }
            StmtEvent::Commit | StmtEvent::Rollback => {
                self.staged.clear();
                Vec::new()
            }
            StmtEvent::Close(name) => {
                // A cursor declared in this transaction is not kept at its commit.
                self.staged.retain(|s| match s {
                    Staged::Change(SettingChange::HoldCursor(n)) => {
                        name.as_ref().is_some_and(|c| c != n)
                    }
                    _ => true,
                });
                vec![SettingChange::CloseCursor(name)]
            }
        }
    }

    /// ReadyForQuery with `status` ended a unit that saw an error (`failed`) or not.
    /// Outside a transaction, what is still staged belonged to the implicit transaction
    /// that just ended: committed unless it failed.
    pub fn on_ready(&mut self, status: TxStatus, failed: bool) -> Vec<SettingChange> {
        // Asked at every ReadyForQuery: nearly always nothing is staged.
        if status != TxStatus::Idle || self.staged.is_empty() {
            return Vec::new();
        }
        if failed {
            self.staged.clear();
            return Vec::new();
        }
        self.take()
    }

    /// The statement that staged the changes failed with no ReadyForQuery to say so (its
    /// connection was lost): they go, as at a failed one.
    pub fn abandon(&mut self) {
        self.staged.clear();
    }

    fn take(&mut self) -> Vec<SettingChange> {
        self.staged
            .drain(..)
            .filter_map(|s| match s {
                Staged::Change(c) => Some(c),
                Staged::Savepoint(_) => None,
            })
            .collect()
    }

    fn savepoint(&self, name: &str) -> Option<usize> {
        self.staged
            .iter()
            .rposition(|s| matches!(s, Staged::Savepoint(n) if n == name))
    }

    pub fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }
}

/// Apply committed changes to the session state; `node` ran the statements that made them
/// (`None`: its connection is gone, and with it the cursors declared there).
pub fn apply(state: &mut SessionState, changes: Vec<SettingChange>, node: Option<usize>) {
    for c in changes {
        match c {
            SettingChange::Set { name, value, stmt } => state.set(&name, value.as_deref(), stmt),
            SettingChange::ResetAll => state.reset_all(),
            SettingChange::HoldCursor(name) => {
                if let Some(node) = node {
                    state.hold_cursor(name, node);
                }
            }
            SettingChange::CloseCursor(name) => state.close_cursor(name.as_deref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(sql: &str) -> StmtEvent {
        let a = pgfresh_sql::analyze_uncached(sql);
        event_of(&a.statements[0], Some(sql))
    }

    fn names(c: &[SettingChange]) -> Vec<String> {
        c.iter()
            .map(|c| match c {
                SettingChange::Set { name, .. } => name.clone(),
                SettingChange::ResetAll => "ALL".into(),
                SettingChange::HoldCursor(n) => format!("hold {n}"),
                SettingChange::CloseCursor(n) => format!("close {n:?}"),
            })
            .collect()
    }

    #[test]
    fn a_hold_cursor_is_kept_once_committed_and_closed_at_once() {
        let declare = |n: &str| ev(&format!("DECLARE {n} CURSOR WITH HOLD FOR SELECT 1"));
        let mut p = Pending::default();
        assert!(p.on_complete(declare("a"), b"DECLARE CURSOR").is_empty());
        assert_eq!(
            names(&p.on_complete(StmtEvent::Commit, b"COMMIT")),
            ["hold a"]
        );
        // Rolled back, or declared in a failed implicit transaction: not kept.
        p.on_complete(declare("b"), b"DECLARE CURSOR");
        assert!(p.on_complete(StmtEvent::Rollback, b"ROLLBACK").is_empty());
        p.on_complete(declare("b"), b"DECLARE CURSOR");
        assert!(p.on_ready(TxStatus::Idle, true).is_empty());
        // Without HOLD a cursor ends with its transaction.
        assert_eq!(ev("DECLARE c CURSOR FOR SELECT 1"), StmtEvent::Other);
        // A CLOSE takes effect at once; a cursor it closes is not kept at the commit.
        p.on_complete(declare("d"), b"DECLARE CURSOR");
        p.on_complete(declare("e"), b"DECLARE CURSOR");
        let closed = p.on_complete(ev("CLOSE d"), b"CLOSE CURSOR");
        assert_eq!(names(&closed), ["close Some(\"d\")"]);
        assert_eq!(names(&p.on_ready(TxStatus::Idle, false)), ["hold e"]);
        p.on_complete(declare("f"), b"DECLARE CURSOR");
        let closed = p.on_complete(ev("CLOSE ALL"), b"CLOSE CURSOR ALL");
        assert_eq!(names(&closed), ["close None"]);
        assert!(p.on_ready(TxStatus::Idle, false).is_empty());
        // Applied: the session is pinned while it keeps a cursor, on the node it names.
        let mut s = SessionState::default();
        apply(&mut s, vec![SettingChange::HoldCursor("a".into())], None);
        assert!(s.pinned().is_none(), "no connection: no cursor");
        let holds = vec![
            SettingChange::HoldCursor("a".into()),
            SettingChange::HoldCursor("b".into()),
        ];
        apply(&mut s, holds, Some(2));
        assert_eq!(s.cursor_node("a"), Some(2));
        apply(
            &mut s,
            vec![SettingChange::CloseCursor(Some("a".into()))],
            Some(0),
        );
        assert!(s.pinned().is_some() && s.cursor_node("a").is_none());
        s.connection_gone(2);
        assert!(s.pinned().is_none() && s.cursor_node("b").is_none());
    }

    #[test]
    fn set_local_and_plain_statements_change_nothing() {
        assert_eq!(ev("SET LOCAL work_mem = '1MB'"), StmtEvent::Other);
        assert_eq!(ev("SELECT 1"), StmtEvent::Other);
        assert_eq!(
            ev("SELECT set_config('work_mem', '2MB', true)"),
            StmtEvent::Other
        );
    }

    #[test]
    fn every_set_config_of_a_statement_that_sets_the_session_counts() {
        let e = ev(
            "SELECT set_config('a.b', '1', false), set_config('c.d', '2', true), \
             set_config('e.f', '3', 'off')",
        );
        let StmtEvent::Change(changes) = e else {
            panic!("{e:?}");
        };
        assert_eq!(names(&changes), ["a.b", "e.f"]);
        assert_eq!(
            ev("SELECT set_config('a.b', '1', true), set_config('c.d', '2', 'yes')"),
            StmtEvent::Other
        );
    }

    #[test]
    fn autocommit_set_commits_at_ready_unless_it_failed() {
        let mut p = Pending::default();
        assert!(p.on_complete(ev("SET work_mem = '1MB'"), b"SET").is_empty());
        assert_eq!(names(&p.on_ready(TxStatus::Idle, false)), ["work_mem"]);
        p.on_complete(ev("SET work_mem = '1MB'"), b"SET");
        assert!(p.on_ready(TxStatus::Idle, true).is_empty());
        assert!(p.is_empty());
    }

    #[test]
    fn explicit_transactions_and_savepoints() {
        let mut p = Pending::default();
        p.on_complete(ev("SET work_mem = '1MB'"), b"SET");
        assert!(p.on_ready(TxStatus::InTransaction, false).is_empty());
        p.on_complete(ev("SAVEPOINT a"), b"SAVEPOINT");
        p.on_complete(ev("SET search_path = x"), b"SET");
        p.on_complete(ev("ROLLBACK TO SAVEPOINT a"), b"ROLLBACK");
        p.on_complete(ev("SET statement_timeout = 5"), b"SET");
        p.on_complete(ev("SAVEPOINT b"), b"SAVEPOINT");
        p.on_complete(ev("SET lock_timeout = 5"), b"SET");
        p.on_complete(ev("RELEASE b"), b"RELEASE");
        let done = p.on_complete(ev("COMMIT"), b"COMMIT");
        assert_eq!(
            names(&done),
            ["work_mem", "statement_timeout", "lock_timeout"]
        );
        // A failed transaction's COMMIT is answered ROLLBACK.
        p.on_complete(ev("SET work_mem = '1MB'"), b"SET");
        assert!(p.on_complete(ev("COMMIT"), b"ROLLBACK").is_empty());
        assert!(p.is_empty());
        p.on_complete(ev("SET work_mem = '1MB'"), b"SET");
        assert!(p.on_complete(ev("ROLLBACK"), b"ROLLBACK").is_empty());
        assert!(p.on_ready(TxStatus::Idle, false).is_empty());
    }

    #[test]
    fn session_characteristics_and_set_config_are_settings() {
        let StmtEvent::Change(c) = ev("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        else {
            panic!("not a change");
        };
        assert_eq!(names(&c), ["default_transaction_read_only"]);
        let StmtEvent::Change(c) = ev("SELECT set_config('work_mem', '2MB', false)") else {
            panic!("not a change");
        };
        assert_eq!(names(&c), ["work_mem"]);
        let StmtEvent::Change(c) = ev("SET ROLE \"Admin\"") else {
            panic!("not a change");
        };
        assert!(
            matches!(&c[0], SettingChange::Set { stmt: Some(s), .. } if s == "SET ROLE \"Admin\"")
        );
    }
}
