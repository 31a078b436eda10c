//! Session state that must follow a client across the backend connections it uses:
//! settings (startup parameters and SET/RESET/DISCARD), prepared statements, and the
//! reasons that pin a session to the primary.

use std::collections::BTreeSet;
use std::hash::Hash;
use std::sync::Arc;

use pgfresh_sql::Analysis;

use super::settings::SettingChange;

/// Why a session is pinned to the primary until the reason is cleared.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PinReason {
    TempTable,
    Listen,
    AdvisoryLock,
    HoldCursor,
    RouteSetting,
    /// `set_config(name, value, false)` with a name or value that is not a literal.
    UnknownSetting,
}

impl PinReason {
    /// The state lives on the server connection: in transaction mode the session keeps
    /// its connection until the state is gone. (`SET pgfresh.route` only steers routing.)
    pub fn holds_connection(&self) -> bool {
        !matches!(self, PinReason::RouteSetting)
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            PinReason::TempTable => "temp_table",
            PinReason::Listen => "listen",
            PinReason::AdvisoryLock => "advisory_lock",
            PinReason::HoldCursor => "hold_cursor",
            PinReason::RouteSetting => "route_setting",
            PinReason::UnknownSetting => "unknown_setting",
        }
    }
}

/// A statement prepared by the client, remembered so it can be prepared again on
/// another node.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The Parse frame exactly as the client sent it.
    pub parse: bytes::Bytes,
    /// The Parse after the statement's name: query text and parameter types, what
    /// identifies the statement on a server connection in transaction mode.
    pub content: bytes::Bytes,
    pub analysis: Arc<Analysis>,
    pub hash: u64,
}

impl Prepared {
    /// The statement `name` of the Parse frame `parse`, with its analysis.
    pub fn new(parse: bytes::Bytes, name: &str, analysis: Arc<Analysis>) -> Self {
        Self {
            content: crate::statements::parse_content(&parse, name),
            hash: text_hash(&parse),
            parse,
            analysis,
        }
    }

    /// The statement ends a transaction (COMMIT, ROLLBACK, ROLLBACK TO, PREPARE
    /// TRANSACTION), which PostgreSQL parses, binds and describes in a failed transaction
    /// too.
    pub fn exits_transaction(&self) -> bool {
        exits_transaction(&self.analysis)
    }
}

/// `analysis` is of one statement that ends a transaction
/// ([`pgfresh_sql::TxEffect::exits_transaction`]).
pub fn exits_transaction(analysis: &Analysis) -> bool {
    matches!(
        analysis.statements.as_slice(),
        [s] if s.tx.as_ref().is_some_and(pgfresh_sql::TxEffect::exits_transaction)
    )
}

/// A session's settings: (parameter name, the SQL statement that sets it), in order.
/// Server connections record the list they carry; a connection is up to date for a
/// session when the two lists are equal by content (shared `Arc`s compare first by
/// address), so sessions never mistake each other's state.
pub type SettingsList = Arc<Vec<(String, String)>>;

/// Settings lists equal in content, shared: every session's list (and so every
/// connection's record of one) is the one `Arc` of its content while any holder lives, so
/// [`needs_replay`] between sessions with the same settings stops at the address instead
/// of reading both lists (which, with hundreds of clients taking turns on a few
/// connections, are rarely in the cache).
mod interned {
    use std::collections::HashMap;
    use std::hash::BuildHasher;
    use std::sync::{Arc, LazyLock, Mutex, Weak};

    use super::SettingsList;

    type Table = HashMap<u64, Vec<Weak<Vec<(String, String)>>>, foldhash::fast::FixedState>;

    static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(Default::default);

    /// The shared list equal to `list` (`list` itself if it is the first of its content).
    pub(super) fn intern(list: SettingsList) -> SettingsList {
        let hash = foldhash::fast::FixedState::default().hash_one(&*list);
        let mut table = TABLE.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = table.entry(hash).or_default();
        bucket.retain(|w| w.strong_count() > 0);
        if let Some(same) = bucket
            .iter()
            .filter_map(Weak::upgrade)
            .find(|l| **l == *list)
        {
            return same;
        }
        bucket.push(Arc::downgrade(&list));
        // Now and then, buckets whose lists all went.
        if table.len() > 1024 && table.len().is_power_of_two() {
            table.retain(|_, b| b.iter().any(|w| w.strong_count() > 0));
        }
        list
    }
}

/// The statement that returns a connection to its login defaults before a session's
/// settings are replayed: `RESET ALL` leaves the role and session authorization alone.
pub const RESET_SETTINGS: &str = "SET SESSION AUTHORIZATION DEFAULT; RESET ALL";

/// The settings of a connection just logged in: none (the shared empty list).
pub fn no_settings() -> SettingsList {
    interned::intern(SettingsList::default())
}

/// Whether a connection carrying `conn` needs `session`'s settings replayed.
pub fn needs_replay(conn: Option<&SettingsList>, session: &SettingsList) -> bool {
    match conn {
        Some(c) => !Arc::ptr_eq(c, session) && c != session,
        None => true,
    }
}

pub struct SessionState {
    /// `SET` statements to replay on a connection, in order, one per parameter.
    settings: SettingsList,
    /// The startup parameters, as recorded (lower-cased name, value, statement): what a
    /// RESET brings back, as on the client's own connection, where they are the reset
    /// values.
    startup: Vec<(String, String, String)>,
    /// Protocol-level named statements by name ("" is the unnamed one).
    pub prepared: crate::name_map::NameMap<Prepared>,
    /// SQL-level PREPARE statements by name: the PREPARE text and its inner analysis.
    pub sql_prepared: foldhash::HashMap<String, (String, Arc<Analysis>)>,
    /// The client has PREPAREd a statement at some time (never reset): only then can a
    /// connection of its own hold one under a `sql:` record (session mode), so only then
    /// does a unit look for one (`send::prepare_statements`, on every named Bind).
    pub sql_prepared_ever: bool,
    pub pins: BTreeSet<PinReason>,
    /// The WITH HOLD cursors the session keeps, by name, with the node whose connection
    /// holds each (`PinReason::HoldCursor` while there is one).
    hold_cursors: std::collections::BTreeMap<String, usize>,
    /// Route hint for the whole session (`SET pgfresh.route`, startup options).
    pub route_primary: bool,
    /// `default_transaction_read_only` is on for this session.
    pub default_read_only: bool,
    /// `default_transaction_isolation` is `serializable` for this session: a hot standby
    /// refuses every statement then, so the session's reads run on the primary.
    pub default_serializable: bool,
}

impl Default for SessionState {
    fn default() -> Self {
        Self {
            settings: no_settings(),
            startup: Vec::new(),
            prepared: Default::default(),
            sql_prepared: Default::default(),
            sql_prepared_ever: false,
            pins: Default::default(),
            hold_cursors: Default::default(),
            route_primary: false,
            default_read_only: false,
            default_serializable: false,
        }
    }
}

/// Session mode: what a connection's record holds for a statement name whose state there
/// is unknown (the client's Parse or Close of it that an error skipped or refused, see
/// `Session::skipped`). No text hashes to it, so the next unit that uses the name closes
/// it there and parses the client's statement again.
pub const UNKNOWN_STATEMENT: u64 = u64::MAX;

/// A statement text's hash, to notice a name prepared again with another text (the same
/// for the whole process; foldhash, seeded once, is much cheaper per Parse than SipHash).
/// Never [`UNKNOWN_STATEMENT`].
pub fn text_hash(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<foldhash::quality::RandomState> = std::sync::OnceLock::new();
    SEED.get_or_init(Default::default)
        .hash_one(bytes)
        .min(UNKNOWN_STATEMENT - 1)
}

/// Quote a value as a SQL string literal.
pub fn literal(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

impl SessionState {
    /// Record a startup parameter: replayed with `set_config`, which takes the value as
    /// the startup packet gives it (`SET search_path = 'a, b'` would make one quoted
    /// name of a list).
    pub fn set_param(&mut self, name: &str, value: &str) {
        let lower = name.to_ascii_lowercase();
        let stmt = format!(
            "SELECT pg_catalog.set_config({}, {}, false)",
            literal(&lower),
            literal(value)
        );
        self.set(name, Some(value), Some(stmt.clone()));
        self.startup.retain(|(n, _, _)| *n != lower);
        self.startup.push((lower, value.to_string(), stmt));
    }

    /// `changes` as they leave the session's settings where a parameter given at
    /// startup is reset (RESET, `SET ... TO DEFAULT`, RESET ALL, DISCARD ALL): at its
    /// startup value, the reset value of the client's own connection. A server
    /// connection's reset value is the server's default, so one that ran such a reset
    /// no longer holds the session's settings. Returns the parameters (lower-cased) so
    /// brought back to their startup values and not set again after (none: the changes
    /// are as they were).
    pub fn with_startup_values(&self, changes: &mut Vec<SettingChange>) -> Vec<String> {
        let mut restored: Vec<String> = Vec::new();
        if self.startup.is_empty() {
            return restored;
        }
        let startup_set = |(n, v, s): &(String, String, String)| SettingChange::Set {
            name: n.clone(),
            value: Some(v.clone()),
            stmt: Some(s.clone()),
        };
        let mut out = Vec::with_capacity(changes.len());
        for c in changes.drain(..) {
            match c {
                SettingChange::Set { name, stmt, .. }
                    if stmt.is_none() && self.startup_entry(&name).is_some() =>
                {
                    let entry = self.startup_entry(&name).expect("a startup value");
                    out.push(startup_set(entry));
                    restored.retain(|n| *n != entry.0);
                    restored.push(entry.0.clone());
                }
                SettingChange::ResetAll => {
                    out.push(SettingChange::ResetAll);
                    out.extend(self.startup.iter().map(startup_set));
                    restored = self.startup.iter().map(|(n, _, _)| n.clone()).collect();
                }
                SettingChange::Set { name, value, stmt } => {
                    restored.retain(|n| !n.eq_ignore_ascii_case(&name));
                    out.push(SettingChange::Set { name, value, stmt });
                }
                other => out.push(other),
            }
        }
        *changes = out;
        restored
    }

    fn startup_entry(&self, name: &str) -> Option<&(String, String, String)> {
        self.startup
            .iter()
            .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
    }

    /// The value the startup packet gave parameter `name`, if it gave one.
    pub fn startup_value(&self, name: &str) -> Option<&str> {
        self.startup_entry(name).map(|(_, v, _)| v.as_str())
    }

    /// Record a parameter change. `value` is the new value as text (for the settings
    /// pgfresh itself reads); `stmt` is the SQL that reproduces it on another
    /// connection, `None` to return the parameter to its default.
    pub fn set(&mut self, name: &str, value: Option<&str>, stmt: Option<String>) {
        let name = name.to_ascii_lowercase();
        if name == "default_transaction_isolation" {
            self.default_serializable = value.is_some_and(|v| {
                v.trim()
                    .trim_matches(|c| c == '\'' || c == '"')
                    .eq_ignore_ascii_case("serializable")
            });
        }
        if name == "default_transaction_read_only" {
            self.default_read_only = value
                .map(|v| {
                    matches!(
                        v.trim_matches('\'').to_ascii_lowercase().as_str(),
                        "on" | "true" | "yes" | "1"
                    )
                })
                .unwrap_or(false);
        }
        let mut list = Vec::clone(&self.settings);
        list.retain(|(n, _)| *n != name);
        if let Some(stmt) = stmt {
            list.push((name, stmt));
        }
        self.settings = interned::intern(Arc::new(list));
    }

    /// RESET ALL / DISCARD ALL.
    pub fn reset_all(&mut self) {
        self.settings = no_settings();
        self.default_read_only = false;
        self.default_serializable = false;
    }

    /// The statements that bring a connection to this session's settings, each sent
    /// as a query of its own so that one the server refuses cannot undo the others.
    /// Values are already SQL text (as the client wrote them in SET) except startup
    /// parameters, which are quoted when recorded.
    pub fn replay_statements(&self) -> impl Iterator<Item = &str> {
        std::iter::once(RESET_SETTINGS).chain(self.settings.iter().map(|(_, s)| s.as_str()))
    }

    pub fn settings(&self) -> &SettingsList {
        &self.settings
    }

    pub fn pinned(&self) -> Option<&PinReason> {
        self.pins.iter().next()
    }

    /// A WITH HOLD cursor `name` outlived the transaction that declared it on `node`.
    pub fn hold_cursor(&mut self, name: String, node: usize) {
        self.hold_cursors.insert(name, node);
        self.pins.insert(PinReason::HoldCursor);
    }

    /// The cursor `name` (`None`: every cursor) is closed.
    pub fn close_cursor(&mut self, name: Option<&str>) {
        match name {
            Some(n) => {
                self.hold_cursors.remove(n);
            }
            None => self.hold_cursors.clear(),
        }
        if self.hold_cursors.is_empty() {
            self.pins.remove(&PinReason::HoldCursor);
        }
    }

    /// The connection to `node` is gone, and the cursors it held with it.
    pub fn connection_gone(&mut self, node: usize) {
        if self.hold_cursors.is_empty() {
            return;
        }
        self.hold_cursors.retain(|_, n| *n != node);
        if self.hold_cursors.is_empty() {
            self.pins.remove(&PinReason::HoldCursor);
        }
    }

    /// The node holding the WITH HOLD cursor `name`, if the session keeps one.
    pub fn cursor_node(&self, name: &str) -> Option<usize> {
        self.hold_cursors.get(name).copied()
    }
}

/// Quote a GUC name if it is not a plain (possibly dotted) lowercase identifier.
pub fn quote_ident(name: &str) -> String {
    let plain = name.split('.').all(|p| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    });
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Parse `-c name=value` pairs (and `--name=value`) from the startup `options` string.
pub fn parse_options(options: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for ch in options.chars() {
        if escaped {
            cur.push(ch);
            escaped = false;
        } else if ch == '\\' {
            escaped = true;
        } else if ch.is_whitespace() {
            if !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(ch);
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        let pair = if w == "-c" {
            it.next()
        } else if let Some(rest) = w.strip_prefix("-c") {
            Some(rest.to_string())
        } else {
            w.strip_prefix("--").map(str::to_string)
        };
        if let Some((k, v)) = pair.as_deref().and_then(|p| p.split_once('=')) {
            out.push((k.replace('-', "_"), v.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parsing() {
        assert_eq!(
            parse_options("-c pgfresh.route=primary -csearch_path=a,b --statement-timeout=5s"),
            vec![
                ("pgfresh.route".into(), "primary".into()),
                ("search_path".into(), "a,b".into()),
                ("statement_timeout".into(), "5s".into())
            ]
        );
        assert_eq!(
            parse_options("-c x=a\\ b"),
            vec![("x".into(), "a b".into())]
        );
    }

    #[test]
    fn a_serializable_default_is_noticed_in_every_form() {
        let mut s = SessionState::default();
        for (value, serializable) in [
            ("'serializable'", true),
            ("SERIALIZABLE", true),
            (" \"Serializable\" ", true),
            ("'repeatable read'", false),
            ("serializable", true),
        ] {
            s.set(
                "Default_Transaction_Isolation",
                Some(value),
                Some(String::new()),
            );
            assert_eq!(s.default_serializable, serializable, "{value}");
        }
        s.set("default_transaction_isolation", None, None);
        assert!(!s.default_serializable, "RESET");
        s.set_param("default_transaction_isolation", "serializable");
        assert!(s.default_serializable, "a startup option");
        s.reset_all();
        assert!(!s.default_serializable, "RESET ALL");
    }

    #[test]
    fn sessions_with_equal_settings_share_one_list() {
        let (mut a, mut b) = (SessionState::default(), SessionState::default());
        assert!(Arc::ptr_eq(a.settings(), b.settings()), "no settings yet");
        a.set_param("TimeZone", "UTC");
        assert!(!Arc::ptr_eq(a.settings(), b.settings()));
        b.set_param("TimeZone", "UTC");
        assert!(Arc::ptr_eq(a.settings(), b.settings()), "same content");
        // A change of one is never seen by the other.
        b.set("search_path", Some("b"), Some("SET search_path = b".into()));
        assert_eq!(a.settings().len(), 1);
        assert_eq!(b.settings().len(), 2);
        assert!(needs_replay(Some(a.settings()), b.settings()));
        // Back to the same content: shared again.
        b.set("search_path", None, None);
        assert!(Arc::ptr_eq(a.settings(), b.settings()));
        // A connection's record keeps a list alive after its session changed.
        let conn = a.settings().clone();
        a.reset_all();
        b.reset_all();
        assert_eq!(conn.len(), 1);
        let mut c = SessionState::default();
        c.set_param("TimeZone", "UTC");
        assert!(Arc::ptr_eq(&conn, c.settings()));
    }

    #[test]
    fn settings_replay_keeps_last_value() {
        let mut s = SessionState::default();
        s.set("search_path", Some("a"), Some("SET search_path = a".into()));
        s.set_param("TimeZone", "UTC");
        s.set(
            "search_path",
            Some("b"),
            Some("set search_path to b".into()),
        );
        let replay = |s: &SessionState| s.replay_statements().collect::<Vec<_>>().join(";");
        assert_eq!(
            replay(&s),
            format!(
                "{RESET_SETTINGS};SELECT pg_catalog.set_config('timezone', 'UTC', false);\
                 set search_path to b"
            )
        );
        let before = s.settings().clone();
        s.set("search_path", None, None);
        assert_eq!(
            replay(&s),
            format!("{RESET_SETTINGS};SELECT pg_catalog.set_config('timezone', 'UTC', false)")
        );
        assert!(needs_replay(Some(&before), s.settings()));
        // Equal content, different allocation: up to date.
        let copy: SettingsList = Arc::new((**s.settings()).clone());
        assert!(!needs_replay(Some(&copy), s.settings()));
        assert!(needs_replay(None, s.settings()));
        s.reset_all();
        assert_eq!(replay(&s), RESET_SETTINGS);
        assert!(!needs_replay(Some(&Default::default()), s.settings()));
    }

    #[test]
    fn a_reset_brings_a_startup_value_back() {
        let mut s = SessionState::default();
        s.set_param("TimeZone", "UTC");
        s.set_param("application_name", "app");
        let reset = |name: &str| SettingChange::Set {
            name: name.into(),
            value: None,
            stmt: None,
        };
        let set = |name: &str| SettingChange::Set {
            name: name.into(),
            value: Some("x".into()),
            stmt: Some(format!("SET {name} = 'x'")),
        };
        // A parameter no startup packet gave resets to the default, as before.
        let mut changes = vec![reset("work_mem")];
        assert!(s.with_startup_values(&mut changes).is_empty());
        assert_eq!(changes, vec![reset("work_mem")]);
        let mut changes = vec![reset("timezone")];
        assert_eq!(s.with_startup_values(&mut changes), ["timezone"]);
        assert_eq!(
            changes,
            vec![SettingChange::Set {
                name: "timezone".into(),
                value: Some("UTC".into()),
                stmt: Some("SELECT pg_catalog.set_config('timezone', 'UTC', false)".into()),
            }]
        );
        // RESET ALL brings back every one; a SET after it keeps its own value.
        let mut changes = vec![SettingChange::ResetAll, set("TimeZone")];
        assert_eq!(s.with_startup_values(&mut changes), ["application_name"]);
        assert_eq!(changes.len(), 4);
        super::super::settings::apply(&mut s, changes, None);
        let replay = s.replay_statements().collect::<Vec<_>>().join(";");
        assert_eq!(
            replay,
            format!(
                "{RESET_SETTINGS};SELECT pg_catalog.set_config('application_name', 'app', false);\
                 SET TimeZone = 'x'"
            )
        );
        assert_eq!(s.startup_value("TIMEZONE"), Some("UTC"));
    }
}
