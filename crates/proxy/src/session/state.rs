//! Session state that must follow a client across the backend connections it uses:
//! settings (startup parameters and SET/RESET/DISCARD), prepared statements, and the
//! reasons that pin a session to the primary.

use std::collections::BTreeSet;
use std::hash::Hash;
use std::sync::Arc;

use pgfresh_sql::Analysis;

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
}

/// A session's settings: (parameter name, the SQL statement that sets it), in order.
/// Server connections record the list they carry; a connection is up to date for a
/// session when the two lists are equal by content (shared `Arc`s compare first by
/// address), so sessions never mistake each other's state.
pub type SettingsList = Arc<Vec<(String, String)>>;

/// The statement that returns a connection to its login defaults before a session's
/// settings are replayed: `RESET ALL` leaves the role and session authorization alone.
pub const RESET_SETTINGS: &str = "SET SESSION AUTHORIZATION DEFAULT; RESET ALL";

/// Whether a connection carrying `conn` needs `session`'s settings replayed.
pub fn needs_replay(conn: Option<&SettingsList>, session: &SettingsList) -> bool {
    match conn {
        Some(c) => !Arc::ptr_eq(c, session) && c != session,
        None => true,
    }
}

#[derive(Default)]
pub struct SessionState {
    /// `SET` statements to replay on a connection, in order, one per parameter.
    settings: SettingsList,
    /// Protocol-level named statements by name ("" is the unnamed one).
    pub prepared: crate::name_map::NameMap<Prepared>,
    /// SQL-level PREPARE statements by name: the PREPARE text and its inner analysis.
    pub sql_prepared: foldhash::HashMap<String, (String, Arc<Analysis>)>,
    pub pins: BTreeSet<PinReason>,
    /// Route hint for the whole session (`SET pgfresh.route`, startup options).
    pub route_primary: bool,
    /// `default_transaction_read_only` is on for this session.
    pub default_read_only: bool,
}

/// A statement text's hash, to notice a name prepared again with another text (the same
/// for the whole process; foldhash, seeded once, is much cheaper per Parse than SipHash).
pub fn text_hash(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<foldhash::quality::RandomState> = std::sync::OnceLock::new();
    SEED.get_or_init(Default::default).hash_one(bytes)
}

/// Quote a value as a SQL string literal.
pub fn literal(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

impl SessionState {
    /// Record a startup parameter: replayed as `SET name = 'value'`.
    pub fn set_param(&mut self, name: &str, value: &str) {
        let stmt = format!(
            "SET {} = {}",
            quote_ident(&name.to_ascii_lowercase()),
            literal(value)
        );
        self.set(name, Some(value), Some(stmt));
    }

    /// Record a parameter change. `value` is the new value as text (for the settings
    /// pgfresh itself reads); `stmt` is the SQL that reproduces it on another
    /// connection, `None` to return the parameter to its default.
    pub fn set(&mut self, name: &str, value: Option<&str>, stmt: Option<String>) {
        let name = name.to_ascii_lowercase();
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
        let list = Arc::make_mut(&mut self.settings);
        list.retain(|(n, _)| *n != name);
        if let Some(stmt) = stmt {
            list.push((name, stmt));
        }
    }

    /// RESET ALL / DISCARD ALL.
    pub fn reset_all(&mut self) {
        self.settings = Default::default();
        self.default_read_only = false;
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
            format!("{RESET_SETTINGS};SET timezone = 'UTC';set search_path to b")
        );
        let before = s.settings().clone();
        s.set("search_path", None, None);
        assert_eq!(replay(&s), format!("{RESET_SETTINGS};SET timezone = 'UTC'"));
        assert!(needs_replay(Some(&before), s.settings()));
        // Equal content, different allocation: up to date.
        let copy: SettingsList = Arc::new((**s.settings()).clone());
        assert!(!needs_replay(Some(&copy), s.settings()));
        assert!(needs_replay(None, s.settings()));
        s.reset_all();
        assert_eq!(replay(&s), RESET_SETTINGS);
        assert!(!needs_replay(Some(&Default::default()), s.settings()));
    }
}
