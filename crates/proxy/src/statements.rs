//! Transaction mode: the protocol-level prepared statements that exist on one server
//! connection, keyed by their full content (query text and parameter types, compared
//! byte for byte, and the search_path and role they resolve names under, see
//! [`cache_key`]), under names pgfresh owns. Clients sharing the connection share a
//! statement when they prepared the same content under whatever names; the cache is
//! bounded, least recently used first out.

use bytes::{BufMut, Bytes, BytesMut};

/// Server-side statement names pgfresh gives out start with this.
pub const PREFIX: &str = "__pgfresh_";

#[derive(Default, Debug)]
pub struct StatementCache {
    /// (foldhash, not SipHash: a Bind looks its statement's content up here, a hundred
    /// bytes or so, in nearly every statement.)
    by_content: foldhash::HashMap<Bytes, Entry>,
    next_id: u64,
    tick: u64,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    used: u64,
}

impl StatementCache {
    /// A new use starts (one unit): statements used from now on are not evicted by it.
    pub fn begin_use(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The statement's id if this connection has it (and mark it used).
    pub fn lookup(&mut self, content: &Bytes) -> Option<u64> {
        let tick = self.tick;
        self.by_content.get_mut(content).map(|e| {
            e.used = tick;
            e.id
        })
    }

    /// Record a statement about to be prepared on this connection; its new id.
    pub fn insert(&mut self, content: Bytes) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.by_content.insert(
            content,
            Entry {
                id,
                used: self.tick,
            },
        );
        id
    }

    /// The server did not prepare it after all (an error skipped or failed its Parse).
    pub fn remove(&mut self, content: &Bytes) {
        self.by_content.remove(content);
    }

    /// Evict least recently used statements, none used since `since`, until at most
    /// `max` remain. Returns the ids to close on the server, with their content.
    pub fn evict_over(&mut self, max: usize, since: u64) -> Vec<(u64, Bytes)> {
        let mut closed = Vec::new();
        while self.by_content.len() > max {
            let Some((content, id)) = self
                .by_content
                .iter()
                .filter(|(_, e)| e.used < since)
                .min_by_key(|(_, e)| e.used)
                .map(|(c, e)| (c.clone(), e.id))
            else {
                break;
            };
            self.by_content.remove(&content);
            closed.push((id, content));
        }
        closed
    }

    /// An evicted statement is on the connection after all (the server skipped its
    /// Close): it counts again, under its id, unless its content was prepared again since.
    pub fn restore(&mut self, id: u64, content: Bytes) {
        let used = self.tick;
        self.by_content.entry(content).or_insert(Entry { id, used });
    }

    pub fn clear(&mut self) {
        self.by_content.clear();
    }

    pub fn len(&self) -> usize {
        self.by_content.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_content.is_empty()
    }
}

/// The key of a statement in a connection's cache: its content, then `scope` (what else
/// decides the relations its names resolve to; empty for most sessions, the key is then
/// the content itself). A content's length follows from its parameter count, so a key
/// with a scope never equals another content.
pub fn cache_key(content: &Bytes, scope: &[u8]) -> Bytes {
    if scope.is_empty() {
        return content.clone();
    }
    let mut key = BytesMut::with_capacity(content.len() + scope.len());
    key.put_slice(content);
    key.put_slice(scope);
    key.freeze()
}

/// A server-side statement name, built on the stack: the transaction-mode rewrite
/// names one in nearly every Bind, and `format!` there cost about 700 instructions a
/// statement.
#[derive(Clone, Copy)]
pub struct ServerName {
    buf: [u8; PREFIX.len() + 20],
    len: u8,
}

impl ServerName {
    /// The name of statement `id`.
    pub fn of(id: u64) -> ServerName {
        let mut n = ServerName::prefix();
        let mut digits = itoa::Buffer::new();
        let d = digits.format(id).as_bytes();
        n.buf[PREFIX.len()..PREFIX.len() + d.len()].copy_from_slice(d);
        n.len += d.len() as u8;
        n
    }

    /// The prefix alone: a name in pgfresh's space that no statement has.
    pub fn prefix() -> ServerName {
        let mut buf = [0; PREFIX.len() + 20];
        buf[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
        ServerName {
            buf,
            len: PREFIX.len() as u8,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for ServerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

/// Appends the message `tag` whose body is the concatenation of `body` to `out`.
fn put_frame(out: &mut BytesMut, tag: u8, body: &[&[u8]]) {
    let len: usize = body.iter().map(|b| b.len()).sum();
    out.reserve(5 + len);
    out.put_u8(tag);
    out.put_u32((4 + len) as u32);
    for b in body {
        out.put_slice(b);
    }
}

/// Appends a Parse of `content` (query text and parameter types, as in a client's Parse
/// after its name) under `name` to `out`.
pub fn put_parse(out: &mut BytesMut, name: &[u8], content: &[u8]) {
    put_frame(out, b'P', &[name, b"\0", content]);
}

/// Appends the client's Bind frame `raw`, its statement name replaced, to `out`.
pub fn put_bind_renamed(
    out: &mut BytesMut,
    raw: &[u8],
    portal: &[u8],
    statement: &[u8],
    new_name: &ServerName,
) {
    // Body: portal\0 statement\0 rest.
    let rest = &raw[5 + portal.len() + 1 + statement.len() + 1..];
    put_frame(
        out,
        b'B',
        &[portal, b"\0", new_name.as_bytes(), b"\0", rest],
    );
}

/// Appends a Describe or Close of statement `name` to `out`.
pub fn put_statement_message(out: &mut BytesMut, tag: u8, name: &ServerName) {
    put_frame(out, tag, &[b"S", name.as_bytes(), b"\0"]);
}

/// The names a Bind frame's body starts with, portal then statement, when both are there
/// (bytes as sent: a Bind is checked whole, UTF-8 names included, when it comes in).
pub fn bind_names(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    let body = raw.get(5..)?;
    let p = memchr::memchr(0, body)?;
    let rest = &body[p + 1..];
    let s = memchr::memchr(0, rest)?;
    Some((&body[..p], &rest[..s]))
}

/// The content of a client's Parse frame: everything after the statement name.
pub fn parse_content(raw: &Bytes, name: &str) -> Bytes {
    raw.slice(5 + name.len() + 1..)
}

/// The ErrorResponse with body `body` whose message names one of pgfresh's statements
/// (`"__pgfresh_N"`), naming the client's statement `client` there instead; `None` when
/// the message names none. (A refused Parse of a name the client has is sent under its
/// statement's server name, see `session::rewrite`.)
pub fn error_naming(body: &[u8], client: &str) -> Option<Bytes> {
    let quoted = format!("\"{PREFIX}");
    let mut fields = BytesMut::with_capacity(body.len() + client.len());
    let mut renamed = false;
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first().filter(|(k, _)| **k != 0) {
        let end = memchr::memchr(0, tail)?;
        let value = &tail[..end];
        rest = &tail[end + 1..];
        fields.put_u8(kind);
        let at = (kind == b'M')
            .then(|| memchr::memmem::find(value, quoted.as_bytes()))
            .flatten();
        match at {
            Some(at) => {
                // The name between the quotes: the prefix and its digits.
                let name_end = value[at + quoted.len()..]
                    .iter()
                    .position(|b| !b.is_ascii_digit())
                    .map(|n| at + quoted.len() + n)
                    .filter(|e| value.get(*e) == Some(&b'"'))?;
                fields.put_slice(&value[..=at]);
                fields.put_slice(client.as_bytes());
                fields.put_slice(&value[name_end..]);
                renamed = true;
            }
            None => fields.put_slice(value),
        }
        fields.put_u8(0);
    }
    fields.put_u8(0);
    let mut out = BytesMut::new();
    put_frame(&mut out, b'E', &[&fields]);
    renamed.then(|| out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_eviction_spares_the_current_unit() {
        let mut c = StatementCache::default();
        let a = Bytes::from_static(b"select 1\0\0\0");
        let b = Bytes::from_static(b"select 2\0\0\0");
        let d = Bytes::from_static(b"select 3\0\0\0");
        c.begin_use();
        let ia = c.insert(a.clone());
        c.begin_use();
        c.insert(b.clone());
        let since = c.begin_use();
        assert!(c.lookup(&b).is_some());
        c.insert(d.clone());
        // `a` is the least recently used; `b` and `d` belong to the current unit.
        assert_eq!(c.evict_over(2, since), vec![(ia, a.clone())]);
        assert_eq!(c.evict_over(1, since), Vec::new());
        assert_eq!(c.len(), 2);
        assert!(c.lookup(&a).is_none());
        // Its Close skipped: it counts again, under its own name.
        c.restore(ia, a.clone());
        assert_eq!(c.lookup(&a), Some(ia));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn a_scope_makes_another_key_and_none_keeps_the_content() {
        let content = Bytes::from_static(b"select 1\0\0\0");
        assert_eq!(cache_key(&content, b""), content);
        let a = cache_key(&content, b"\0SET search_path = a");
        let b = cache_key(&content, b"\0SET search_path = b");
        assert!(a != content && a != b && a.starts_with(&content));
    }

    #[test]
    fn server_names_are_the_prefix_and_the_id() {
        assert_eq!(ServerName::of(7).as_bytes(), b"__pgfresh_7");
        assert_eq!(
            ServerName::of(u64::MAX).as_bytes(),
            format!("{PREFIX}{}", u64::MAX).as_bytes()
        );
        assert_eq!(ServerName::prefix().as_bytes(), PREFIX.as_bytes());
    }

    /// One message written by `put` into a buffer of its own.
    fn one(put: impl FnOnce(&mut BytesMut)) -> Bytes {
        let mut b = BytesMut::new();
        put(&mut b);
        b.freeze()
    }

    #[test]
    fn frames_round_trip_through_the_wire_parser() {
        let client = one(|b| put_parse(b, b"stmt1", b"select $1\0\0\x01\0\0\0\x17"));
        let content = parse_content(&client, "stmt1");
        assert_eq!(&content[..], b"select $1\0\0\x01\0\0\0\x17");
        let server = one(|b| put_parse(b, ServerName::of(7).as_bytes(), &content));
        let f = pgfresh_wire::Frame {
            tag: b'P',
            raw: server,
        };
        match pgfresh_wire::parse_frontend(&f).unwrap() {
            pgfresh_wire::FrontendMessage::Parse { name, sql, .. } => {
                assert_eq!(name, "__pgfresh_7");
                assert_eq!(sql, "select $1");
            }
            other => panic!("{other:?}"),
        }
        let bind = pgfresh_wire::build::bind("p", "s1", &[], &[Some(b"42")], &[]);
        assert_eq!(bind_names(&bind), Some((&b"p"[..], &b"s1"[..])));
        // A second message after it: only this one is renamed.
        let renamed = one(|b| {
            put_bind_renamed(b, &bind, b"p", b"s1", &ServerName::of(2));
            put_statement_message(b, b'C', &ServerName::of(2));
        });
        let f = pgfresh_wire::Frame {
            tag: b'B',
            raw: renamed.slice(..renamed.len() - 18),
        };
        match pgfresh_wire::parse_frontend(&f).unwrap() {
            pgfresh_wire::FrontendMessage::Bind {
                portal,
                statement,
                params,
                ..
            } => {
                assert_eq!((portal, statement), ("p", "__pgfresh_2"));
                assert_eq!(params.values().next(), Some(Some(&b"42"[..])));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(&renamed[renamed.len() - 18..], b"C\0\0\0\x11S__pgfresh_2\0");
    }

    #[test]
    fn bind_names_needs_both_terminators() {
        assert_eq!(bind_names(b"B\0\0\0\x06p\0"), None);
        assert_eq!(bind_names(b"B\0\0\0\x04"), None);
        assert_eq!(bind_names(b"B\0\0\0\x06\0\0"), Some((&b""[..], &b""[..])));
    }

    #[test]
    fn an_error_naming_a_server_statement_names_the_client_s() {
        let body = b"SERROR\0C42P05\0Mprepared statement \"__pgfresh_12\" already exists\0Rx\0\0";
        let renamed = error_naming(body, "mine").expect("renamed");
        assert_eq!(
            &renamed[5..],
            b"SERROR\0C42P05\0Mprepared statement \"mine\" already exists\0Rx\0\0"
        );
        assert_eq!(
            renamed.len(),
            1 + u32::from_be_bytes(renamed[1..5].try_into().unwrap()) as usize
        );
        // The client's own name, or none: nothing to do.
        assert!(error_naming(
            b"C42P05\0Mprepared statement \"mine\" already exists\0\0",
            "x"
        )
        .is_none());
    }
}
