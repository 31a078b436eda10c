//! The extended-protocol batch most clients send for one statement, recognised in
//! place: Parse and Bind of the unnamed statement and portal, an optional Describe of
//! the portal, Execute, Sync (libpq's `PQexecParams`, pgbench `-M extended`,
//! node-postgres and psycopg without prepared statements).
//!
//! A proxy that takes such a batch whole, as one chunk of bytes, saves splitting and
//! parsing five frames one by one. [`unnamed_batch`] accepts exactly what
//! [`crate::parse_frontend`] would accept for those five messages, and nothing else: any
//! other message, a name that is not empty, a malformed field, a message over the
//! length limit, or a batch not complete yet gives `None`, and the caller takes the
//! frames one by one (and reports what is wrong with them).
//!
//! [`named_batch`] does the same for the batch that runs a statement prepared earlier
//! under a name: Bind of it to the unnamed portal, an optional Describe of the portal,
//! Execute, Sync (pgbench `-M prepared`, JDBC past its prepare threshold, asyncpg,
//! psycopg 3 with prepared statements).
//!
//! [`lone_query`] recognises a simple Query that is the whole buffer.

use std::ops::Range;

use crate::cursor::Cursor;
use crate::framing::{frame_at, Limits, HEADER_LEN};

/// Where the parts of an [`unnamed_batch`] lie in the buffer it was found at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnnamedBatch {
    /// The whole batch, Parse to Sync: `buf[..len]`.
    pub len: usize,
    /// The Parse message: `buf[..parse_len]`.
    pub parse_len: usize,
    /// The query text (not yet checked as UTF-8): `buf[sql]`.
    pub sql: Range<usize>,
    /// Where each message ends: Parse, Bind, the Describe if there is one, Execute, Sync.
    pub ends: [usize; 5],
    /// How many of `ends` there are (4 without a Describe, else 5).
    pub messages: usize,
}

/// The batch at the start of `buf`, when it is the unnamed one-statement batch complete
/// and well formed (see the module comment).
pub fn unnamed_batch(buf: &[u8], limits: &Limits) -> Option<UnnamedBatch> {
    let mut pos = 0;
    let mut ends = [0; 5];
    let parse = message(buf, &mut pos, b'P', limits)?;
    let parse_len = pos;
    ends[0] = pos;
    let sql = parse_body(buf, parse)?;
    let bind = message(buf, &mut pos, b'B', limits)?;
    bind_body(&buf[bind])?;
    ends[1] = pos;
    let mut n = 2;
    if buf.get(pos) == Some(&b'D') {
        let describe = message(buf, &mut pos, b'D', limits)?;
        // The unnamed portal.
        if buf[describe] != [b'P', 0] {
            return None;
        }
        ends[n] = pos;
        n += 1;
    }
    let execute = message(buf, &mut pos, b'E', limits)?;
    // The unnamed portal and a row limit.
    if buf[execute.clone()].len() != 5 || buf[execute.start] != 0 {
        return None;
    }
    ends[n] = pos;
    n += 1;
    let sync = message(buf, &mut pos, b'S', limits)?;
    if !sync.is_empty() {
        return None;
    }
    ends[n] = pos;
    Some(UnnamedBatch {
        len: pos,
        parse_len,
        sql,
        ends,
        messages: n + 1,
    })
}

/// Where the parts of a [`named_batch`] lie in the buffer it was found at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedBatch {
    /// The whole batch, Bind to Sync: `buf[..len]`.
    pub len: usize,
    /// Where each message ends: Bind, the Describe if there is one, Execute, Sync.
    pub ends: [usize; 4],
    /// How many of `ends` there are (3 without a Describe, else 4).
    pub messages: usize,
    /// The statement's name (UTF-8, not empty): `buf[statement]`.
    pub statement: Range<usize>,
}

/// The batch at the start of `buf`, when it is the one-statement batch of a named
/// statement, complete and well formed (see the module comment).
pub fn named_batch(buf: &[u8], limits: &Limits) -> Option<NamedBatch> {
    let mut pos = 0;
    let mut ends = [0; 4];
    let mut n = 0;
    let bind = message(buf, &mut pos, b'B', limits)?;
    ends[n] = pos;
    n += 1;
    // The unnamed portal, then the statement's name.
    let b = buf[bind.clone()].strip_prefix(&[0])?;
    let name_len = memchr::memchr(0, b)?;
    if name_len == 0 {
        return None;
    }
    std::str::from_utf8(&b[..name_len]).ok()?;
    params_body(&b[name_len + 1..])?;
    let statement = bind.start + 1..bind.start + 1 + name_len;
    if buf.get(pos) == Some(&b'D') {
        let describe = message(buf, &mut pos, b'D', limits)?;
        if buf[describe] != [b'P', 0] {
            return None;
        }
        ends[n] = pos;
        n += 1;
    }
    let execute = message(buf, &mut pos, b'E', limits)?;
    if buf[execute.clone()].len() != 5 || buf[execute.start] != 0 {
        return None;
    }
    ends[n] = pos;
    n += 1;
    let sync = message(buf, &mut pos, b'S', limits)?;
    if !sync.is_empty() {
        return None;
    }
    ends[n] = pos;
    Some(NamedBatch {
        len: pos,
        ends,
        messages: n + 1,
        statement,
    })
}

/// The body of the complete message with `tag` at `*pos` (moved past it).
/// The text of the Query that is the whole of `buf` (not yet checked as UTF-8), when
/// `buf` is exactly one complete Query within the length limit whose text has no NUL
/// inside: what [`crate::parse_frontend`] accepts as a Query, with nothing after it.
pub fn lone_query(buf: &[u8], limits: &Limits) -> Option<Range<usize>> {
    let mut pos = 0;
    let body = message(buf, &mut pos, b'Q', limits)?;
    if pos != buf.len() {
        return None;
    }
    let (&0, text) = buf[body.clone()].split_last()? else {
        return None;
    };
    if text.contains(&0) {
        return None;
    }
    Some(body.start..body.end - 1)
}

/// The text of the one statement `frames` run, and the kind of its Describe (`P` or `S`)
/// if it has one, when they are exactly: an unnamed Parse with no parameter types, a
/// Bind of it to the unnamed portal with no parameters (and at most one parameter format
/// code, which the server then ignores), an optional Describe of that portal or
/// statement, an Execute of the portal and a Sync, one message a frame (a BEGIN as
/// drivers send it, which a proxy may answer itself). Each frame must be a whole message
/// that [`crate::parse_frontend`] accepted when it was read: what is checked here is
/// the shape, with plain slices (this runs for every such transaction).
pub fn lone_statement(frames: &[bytes::Bytes]) -> Option<(&str, Option<u8>)> {
    let mut sql = None;
    let mut described = None;
    let mut expected = [b'P', b'B', b'D', b'E', b'S'].into_iter();
    for raw in frames {
        let (&tag, rest) = raw.split_first()?;
        let (len, body) = rest.split_first_chunk::<4>()?;
        if u32::from_be_bytes(*len) as usize != rest.len() {
            return None;
        }
        // The optional Describe may be skipped.
        if expected.find(|&t| t == tag || t != b'D')? != tag {
            return None;
        }
        match tag {
            b'P' => {
                // The unnamed statement, the text, no parameter types.
                let text = body.strip_prefix(&[0])?.strip_suffix(&[0, 0, 0])?;
                if memchr::memchr(0, text).is_some() {
                    return None;
                }
                sql = Some(std::str::from_utf8(text).ok()?);
            }
            b'B' => {
                // The unnamed portal and statement, at most one format code, no parameters.
                let rest = body.strip_prefix(&[0, 0])?;
                let (formats, rest) = rest.split_first_chunk::<2>()?;
                let formats = u16::from_be_bytes(*formats) as usize;
                if formats > 1 || rest.get(2 * formats..2 * formats + 2)? != [0, 0] {
                    return None;
                }
            }
            b'D' => match body {
                [kind @ (b'P' | b'S'), 0] => described = Some(*kind),
                _ => return None,
            },
            // The unnamed portal, any row limit.
            b'E' if body.len() == 5 && body[0] == 0 => {}
            b'S' if body.is_empty() => {}
            _ => return None,
        }
    }
    if expected.next().is_some() {
        return None;
    }
    Some((sql?, described))
}

fn message(buf: &[u8], pos: &mut usize, tag: u8, limits: &Limits) -> Option<Range<usize>> {
    let (found, end) = frame_at(buf, *pos, limits.max_message).ok()??;
    if found != tag {
        return None;
    }
    let body = *pos + HEADER_LEN..end;
    *pos = end;
    Some(body)
}

/// The text's range in a Parse body that names the unnamed statement.
fn parse_body(buf: &[u8], body: Range<usize>) -> Option<Range<usize>> {
    let b = &buf[body.clone()];
    // The unnamed statement, then the text up to its terminator.
    let rest = b.strip_prefix(&[0])?;
    let end = memchr::memchr(0, rest)?;
    let mut cur = Cursor::new(b'P', &rest[end + 1..]);
    let n = cur.count(4, "parameter type count").ok()?;
    cur.bytes(4 * n, "parameter types").ok()?;
    cur.finish().ok()?;
    let start = body.start + 1;
    Some(start..start + end)
}

/// Whether a Bind body binds the unnamed statement to the unnamed portal, well formed
/// as [`crate::frontend`] checks it: every count non-negative and within the body, every
/// value NULL or within the body, nothing after the result formats. (Read here with
/// plain slices: this runs for every statement of such clients.)
fn bind_body(b: &[u8]) -> Option<()> {
    // The unnamed portal, then the unnamed statement.
    params_body(b.strip_prefix(&[0, 0])?)
}

/// Whether the rest of a Bind body, after its names, is well formed (see `bind_body`).
fn params_body(mut b: &[u8]) -> Option<()> {
    fn count(b: &mut &[u8]) -> Option<usize> {
        let (n, rest) = b.split_first_chunk::<2>()?;
        *b = rest;
        usize::try_from(i16::from_be_bytes(*n)).ok()
    }
    fn skip(b: &mut &[u8], n: usize) -> Option<()> {
        *b = b.get(n..)?;
        Some(())
    }
    let formats = count(&mut b)?;
    skip(&mut b, 2 * formats)?;
    for _ in 0..count(&mut b)? {
        let (len, rest) = b.split_first_chunk::<4>()?;
        b = rest;
        match i32::from_be_bytes(*len) {
            -1 => {}
            len => skip(&mut b, usize::try_from(len).ok()?)?,
        }
    }
    let results = count(&mut b)?;
    skip(&mut b, 2 * results)?;
    b.is_empty().then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build, parse_frontend, Frame, FrontendMessage};
    use bytes::{Bytes, BytesMut};

    fn batch(parts: &[Bytes]) -> Vec<u8> {
        parts.iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn a_lone_query_is_the_whole_buffer() {
        let limits = |max_message| Limits {
            max_message,
            max_startup: 10 * 1024,
        };
        let text = |buf: &[u8], max| lone_query(buf, &limits(max)).map(|r| buf[r].to_vec());
        let q = build::query("SELECT 1").to_vec();
        assert_eq!(text(&q, 1 << 20), Some(b"SELECT 1".to_vec()));
        // Part of one, two of them, one too long, one with a NUL inside its text.
        assert_eq!(text(&q[..q.len() - 1], 1 << 20), None);
        let two = batch(&[build::query("SELECT 1"), build::query("SELECT 1")]);
        assert_eq!(text(&two, 1 << 20), None);
        assert_eq!(text(&q, 8), None);
        let mut nul = q.clone();
        nul[6] = 0;
        assert_eq!(text(&nul, 1 << 20), None);
        assert_eq!(text(b"Q\0\0\0\x04", 1 << 20), None);
        assert_eq!(text(&build::sync(), 1 << 20), None);
    }

    fn usual(sql: &str) -> Vec<Bytes> {
        vec![
            build::parse("", sql, &[23]),
            build::bind("", "", &[0], &[Some(b"42".as_slice())], &[0]),
            build::describe(b'P', ""),
            build::execute("", 0),
            build::sync(),
        ]
    }

    #[test]
    fn the_usual_batch_is_found_whole() {
        let sql = "SELECT abalance FROM pgbench_accounts WHERE aid = $1";
        let parts = usual(sql);
        let mut buf = batch(&parts);
        let b = unnamed_batch(&buf, &Limits::default()).expect("found");
        assert_eq!(b.len, buf.len());
        assert_eq!(b.parse_len, parts[0].len());
        assert_eq!(&buf[b.sql.clone()], sql.as_bytes());
        let ends = |parts: &[Bytes]| {
            parts
                .iter()
                .scan(0, |end, p| {
                    *end += p.len();
                    Some(*end)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(b.ends[..b.messages], ends(&parts));
        // Without Describe too, and followed by more bytes (the next batch).
        let mut short = parts.clone();
        short.remove(2);
        let mut buf2 = batch(&short);
        let len = buf2.len();
        buf2.extend_from_slice(&build::query("SELECT 1"));
        let b2 = unnamed_batch(&buf2, &Limits::default()).expect("found");
        assert_eq!(b2.len, len);
        assert_eq!(b2.ends[..b2.messages], ends(&short));
        // Incomplete: not yet.
        buf.pop();
        assert_eq!(unnamed_batch(&buf, &Limits::default()), None);
    }

    #[test]
    fn a_lone_statement_is_told_by_its_frames() {
        let frames = |sql: &str, describe: Option<u8>| {
            let mut f = vec![
                build::parse("", sql, &[]),
                build::bind("", "", &[], &[], &[]),
            ];
            f.extend(describe.map(|k| build::describe(k, "")));
            f.extend([build::execute("", 0), build::sync()]);
            f
        };
        assert_eq!(
            lone_statement(&frames("BEGIN", None)),
            Some(("BEGIN", None))
        );
        for kind in [b'P', b'S'] {
            assert_eq!(
                lone_statement(&frames("BEGIN ISOLATION LEVEL SERIALIZABLE", Some(kind))),
                Some(("BEGIN ISOLATION LEVEL SERIALIZABLE", Some(kind)))
            );
        }
        // One parameter format code (ignored without parameters) and result formats.
        let mut f = frames("COMMIT", Some(b'P'));
        f[1] = build::bind("", "", &[1], &[], &[1, 0]);
        assert_eq!(lone_statement(&f), Some(("COMMIT", Some(b'P'))));
        // Not that shape: each is left to the server.
        let mut unlike = Vec::new();
        let mut typed = frames("BEGIN", None);
        typed[0] = build::parse("", "BEGIN", &[23]);
        unlike.push(typed);
        let mut named = frames("BEGIN", None);
        named[0] = build::parse("s1", "BEGIN", &[]);
        unlike.push(named);
        let mut with_param = frames("BEGIN", None);
        with_param[1] = build::bind("", "", &[0], &[Some(b"1".as_slice())], &[]);
        unlike.push(with_param);
        let mut two_formats = frames("BEGIN", None);
        two_formats[1] = build::bind("", "", &[0, 0], &[], &[]);
        unlike.push(two_formats);
        let mut portal = frames("BEGIN", None);
        portal[1] = build::bind("p", "", &[], &[], &[]);
        portal[2] = build::execute("p", 0);
        unlike.push(portal);
        let mut statement = frames("BEGIN", None);
        statement[1] = build::bind("", "s1", &[], &[], &[]);
        unlike.push(statement);
        let mut described_named = frames("BEGIN", Some(b'P'));
        described_named[2] = build::describe(b'P', "p");
        unlike.push(described_named);
        let mut no_sync = frames("BEGIN", None);
        no_sync.pop();
        unlike.push(no_sync);
        let mut flushed = frames("BEGIN", None);
        flushed.insert(2, build::flush());
        unlike.push(flushed);
        let mut twice = frames("BEGIN", None);
        twice.extend(frames("BEGIN", None));
        unlike.push(twice);
        let mut whole = BytesMut::new();
        for f in frames("BEGIN", None) {
            whole.extend_from_slice(&f);
        }
        unlike.push(vec![whole.freeze()]);
        let mut not_utf8 = frames("BEGIN", None);
        not_utf8[0] = {
            let mut p = BytesMut::from(&build::parse("", "BEGIN", &[])[..]);
            p[7] = 0xff;
            p.freeze()
        };
        unlike.push(not_utf8);
        for f in &unlike {
            assert_eq!(lone_statement(f), None, "{f:?}");
        }
    }

    #[test]
    fn anything_else_is_left_to_the_frames() {
        let sql = "SELECT 1";
        let named = vec![
            build::parse("s1", sql, &[]),
            build::bind("", "s1", &[], &[], &[]),
            build::execute("", 0),
            build::sync(),
        ];
        let portal = vec![
            build::parse("", sql, &[]),
            build::bind("p", "", &[], &[], &[]),
            build::execute("p", 0),
            build::sync(),
        ];
        let describe_statement = vec![
            build::parse("", sql, &[]),
            build::bind("", "", &[], &[], &[]),
            build::describe(b'S', ""),
            build::execute("", 0),
            build::sync(),
        ];
        let flush = vec![
            build::parse("", sql, &[]),
            build::bind("", "", &[], &[], &[]),
            build::execute("", 0),
            build::flush(),
        ];
        let two = [usual(sql), vec![build::execute("", 0), build::sync()]].concat();
        let mut bad_types = build::parse("", sql, &[]).to_vec();
        // A parameter count the body does not hold.
        let n = bad_types.len();
        bad_types[n - 1] = 3;
        let bad = vec![
            Bytes::from(bad_types),
            build::bind("", "", &[], &[], &[]),
            build::execute("", 0),
            build::sync(),
        ];
        for (i, parts) in [named, portal, describe_statement, flush, bad]
            .iter()
            .enumerate()
        {
            assert_eq!(
                unnamed_batch(&batch(parts), &Limits::default()),
                None,
                "case {i}"
            );
        }
        // Two Executes: the first five messages are a batch of their own only up to a
        // Sync, so this is not one.
        let mut joined = batch(&two[..4]);
        joined.extend_from_slice(&batch(&two[5..]));
        assert_eq!(unnamed_batch(&joined, &Limits::default()), None);
        // Over the length limit.
        let small = Limits {
            max_message: 20,
            ..Limits::default()
        };
        assert_eq!(
            unnamed_batch(&batch(&usual("SELECT a_long_column FROM t")), &small),
            None
        );
    }

    /// Whether the frame-by-frame parser reads `buf` as exactly the usual batch (the text
    /// as UTF-8, names empty).
    fn frames_make_the_batch(buf: &[u8]) -> bool {
        let mut rest = BytesMut::from(buf);
        let mut tags = Vec::new();
        while !rest.is_empty() {
            let Ok(crate::Decoded::Frame(frame)) =
                crate::decode_frontend(&mut rest, &Limits::default())
            else {
                return false;
            };
            let ok = matches!(
                parse_frontend(&frame),
                Ok(FrontendMessage::Parse { name: "", .. }
                    | FrontendMessage::Bind {
                        portal: "",
                        statement: "",
                        ..
                    }
                    | FrontendMessage::Describe {
                        kind: b'P',
                        name: ""
                    }
                    | FrontendMessage::Execute { portal: "", .. }
                    | FrontendMessage::Sync)
            );
            if !ok {
                return false;
            }
            tags.push(frame.tag);
        }
        tags == b"PBDES" || tags == b"PBES"
    }

    /// 20 000 copies of `base`, each with one to three bytes set at random (xorshift from
    /// `seed`: the same copies every run).
    fn mutations(base: &[u8], mut seed: u32) -> impl Iterator<Item = Vec<u8>> + '_ {
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        (0..20_000).map(move |_| {
            let mut buf = base.to_vec();
            for _ in 0..(next() % 3 + 1) {
                let i = next() as usize % buf.len();
                buf[i] = next() as u8;
            }
            buf
        })
    }

    /// Every batch it accepts, the frame-by-frame parser accepts with the same meaning,
    /// and every one the parser reads as that batch, it accepts:
    /// random mutations of the usual batch are either refused or parse cleanly as the
    /// same five messages.
    #[test]
    fn it_accepts_only_what_the_frame_parser_accepts() {
        let base = batch(&usual("SELECT $1::int"));
        let mut accepted = 0;
        for buf in mutations(&base, 0x9e37_79b9) {
            let Some(b) = unnamed_batch(&buf, &Limits::default()) else {
                assert!(!frames_make_the_batch(&buf), "refused {buf:?}");
                continue;
            };
            accepted += 1;
            let mut rest = BytesMut::from(&buf[..b.len]);
            let mut tags = Vec::new();
            while !rest.is_empty() {
                let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
                let frame = Frame::from_raw(rest.split_to(1 + len).freeze()).expect("frame");
                let msg = parse_frontend(&frame);
                match (frame.tag, msg) {
                    (b'P', Ok(FrontendMessage::Parse { name: "", .. })) => {}
                    // The text is checked as UTF-8 by the caller, not here.
                    (b'P', Err(_)) => assert!(std::str::from_utf8(&buf[b.sql.clone()]).is_err()),
                    (
                        b'B',
                        Ok(FrontendMessage::Bind {
                            portal: "",
                            statement: "",
                            ..
                        }),
                    ) => {}
                    (
                        b'D',
                        Ok(FrontendMessage::Describe {
                            kind: b'P',
                            name: "",
                        }),
                    ) => {}
                    (b'E', Ok(FrontendMessage::Execute { portal: "", .. })) => {}
                    (b'S', Ok(FrontendMessage::Sync)) => {}
                    other => panic!("accepted {other:?} in {buf:?}"),
                }
                tags.push(frame.tag);
            }
            assert!(tags == b"PBDES" || tags == b"PBES", "{tags:?}");
        }
        assert!(accepted > 0);
    }

    fn prepared(name: &str) -> Vec<Bytes> {
        vec![
            build::bind("", name, &[0], &[Some(b"42".as_slice())], &[0]),
            build::describe(b'P', ""),
            build::execute("", 0),
            build::sync(),
        ]
    }

    #[test]
    fn the_batch_of_a_named_statement_is_found_whole() {
        let parts = prepared("P0_1");
        let buf = batch(&parts);
        let b = named_batch(&buf, &Limits::default()).expect("found");
        assert_eq!(b.len, buf.len());
        assert_eq!(&buf[b.statement.clone()], b"P0_1");
        let mut end = 0;
        let ends: Vec<usize> = parts
            .iter()
            .map(|p| {
                end += p.len();
                end
            })
            .collect();
        assert_eq!(&b.ends[..b.messages], &ends[..]);
        // Without Describe, followed by the next batch.
        let mut short = parts.clone();
        short.remove(1);
        let mut buf2 = batch(&short);
        let len = buf2.len();
        buf2.extend_from_slice(&build::sync());
        let b2 = named_batch(&buf2, &Limits::default()).expect("found");
        assert_eq!((b2.len, b2.messages), (len, 3));
        // Incomplete: not yet.
        assert_eq!(named_batch(&buf[..buf.len() - 1], &Limits::default()), None);
        // The unnamed statement's is not this batch, and this one is not that.
        let unnamed = batch(&prepared("")[..]);
        assert_eq!(named_batch(&unnamed, &Limits::default()), None);
        assert_eq!(unnamed_batch(&buf, &Limits::default()), None);
    }

    #[test]
    fn other_batches_of_named_statements_are_left_to_the_frames() {
        let cases = [
            // A named portal.
            vec![
                build::bind("p", "s1", &[], &[], &[]),
                build::execute("p", 0),
                build::sync(),
            ],
            // Describe of the statement.
            vec![
                build::bind("", "s1", &[], &[], &[]),
                build::describe(b'S', "s1"),
                build::execute("", 0),
                build::sync(),
            ],
            // A row limit is fine, a Flush is not.
            vec![
                build::bind("", "s1", &[], &[], &[]),
                build::execute("", 0),
                build::flush(),
            ],
            // Parse first.
            vec![
                build::parse("s1", "SELECT 1", &[]),
                build::bind("", "s1", &[], &[], &[]),
                build::execute("", 0),
                build::sync(),
            ],
        ];
        for (i, parts) in cases.iter().enumerate() {
            assert_eq!(
                named_batch(&batch(parts), &Limits::default()),
                None,
                "case {i}"
            );
        }
        // A name that is not UTF-8.
        let mut bad = batch(&prepared("s1"));
        bad[6] = 0xff;
        assert_eq!(named_batch(&bad, &Limits::default()), None);
    }

    /// Whether the frame-by-frame parser reads `buf` as exactly a named statement's batch.
    fn frames_make_the_named_batch(buf: &[u8]) -> bool {
        let mut rest = BytesMut::from(buf);
        let mut tags = Vec::new();
        while !rest.is_empty() {
            let Ok(crate::Decoded::Frame(frame)) =
                crate::decode_frontend(&mut rest, &Limits::default())
            else {
                return false;
            };
            let ok = match parse_frontend(&frame) {
                Ok(FrontendMessage::Bind {
                    portal: "",
                    statement,
                    ..
                }) => !statement.is_empty(),
                Ok(
                    FrontendMessage::Describe {
                        kind: b'P',
                        name: "",
                    }
                    | FrontendMessage::Execute { portal: "", .. }
                    | FrontendMessage::Sync,
                ) => true,
                _ => false,
            };
            if !ok {
                return false;
            }
            tags.push(frame.tag);
        }
        tags == b"BDES" || tags == b"BES"
    }

    /// As for the unnamed batch: random mutations are either refused or read by the frame
    /// parser as the same messages, with the same statement name.
    #[test]
    fn the_named_batch_accepts_only_what_the_frame_parser_accepts() {
        let base = batch(&prepared("stmt_1"));
        let mut accepted = 0;
        for buf in mutations(&base, 0x2545_f491) {
            let Some(b) = named_batch(&buf, &Limits::default()) else {
                assert!(!frames_make_the_named_batch(&buf), "refused {buf:?}");
                continue;
            };
            accepted += 1;
            assert!(
                frames_make_the_named_batch(&buf[..b.len]),
                "accepted {buf:?}"
            );
            let first = Frame::from_raw(Bytes::copy_from_slice(&buf[..b.ends[0]])).expect("frame");
            match parse_frontend(&first) {
                Ok(FrontendMessage::Bind { statement, .. }) => {
                    assert_eq!(statement.as_bytes(), &buf[b.statement.clone()]);
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(accepted > 0);
    }
}
