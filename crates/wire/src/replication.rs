//! The streaming-replication sub-protocol carried in CopyData once `START_REPLICATION`
//! has begun, and the `pgoutput` logical-decoding messages inside it, as far as a reader
//! that wants to know *which relations each committed transaction changed, and where its
//! commit ends* needs them.
//!
//! Server → client CopyData holds XLogData (`w`) or a primary keepalive (`k`); client →
//! server CopyData holds a standby status update (`r`). Inside XLogData, `pgoutput`
//! (protocol version 1) sends Begin, Relation, Insert/Update/Delete, Truncate and Commit
//! messages (and Origin, Type, logical Message, which a reader of relations skips). Row
//! contents are not decoded: a change is known by its relation's id alone.
//!
//! Every decoder checks lengths before reading and fails with [`FrameError::Malformed`]
//! instead of panicking.

use bytes::{BufMut, Bytes, BytesMut};

use crate::cursor::Cursor;
use crate::framing::FrameError;

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01 00:00:00 UTC).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800 * 1_000_000;

/// One server message of a replication stream (the body of a CopyData).
#[derive(Debug, PartialEq, Eq)]
pub enum StreamMessage<'a> {
    /// WAL data: `start` is the position of the data (for logical decoding, of the
    /// decoded record), `end` the server's sent position; `data` one `pgoutput` message.
    XLogData {
        start: u64,
        end: u64,
        data: &'a [u8],
    },
    /// The server's position (`end`: for logical decoding, how far it has decoded and
    /// sent), and whether it wants a status update back at once.
    Keepalive { end: u64, reply: bool },
}

/// Decodes the body of a CopyData received during streaming.
pub fn parse_stream(body: &[u8]) -> Result<StreamMessage<'_>, FrameError> {
    let mut c = Cursor::new(b'd', body);
    match c.u8("replication message kind")? {
        b'w' => {
            let start = u64_of(&mut c, "XLogData start")?;
            let end = u64_of(&mut c, "XLogData end")?;
            let _sent_at = u64_of(&mut c, "XLogData send time")?;
            Ok(StreamMessage::XLogData {
                start,
                end,
                data: c.rest(),
            })
        }
        b'k' => {
            let end = u64_of(&mut c, "keepalive end")?;
            let _sent_at = u64_of(&mut c, "keepalive send time")?;
            let reply = c.u8("keepalive reply flag")? != 0;
            c.finish()?;
            Ok(StreamMessage::Keepalive { end, reply })
        }
        other => Err(c.malformed(format!(
            "unknown replication message kind {:?}",
            other as char
        ))),
    }
}

/// A CopyData frame with a standby status update: WAL positions written, flushed and
/// applied (a logical-decoding client reports how far it has processed in all three, so
/// the slot may release what is before), and whether the server should answer at once
/// (with a keepalive).
pub fn standby_status(processed: u64, reply: bool, now: std::time::SystemTime) -> Bytes {
    let micros = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let mut body = BytesMut::with_capacity(34);
    body.put_u8(b'r');
    body.put_u64(processed);
    body.put_u64(processed);
    body.put_u64(processed);
    body.put_i64(micros.saturating_sub(PG_EPOCH_OFFSET_MICROS));
    body.put_u8(u8::from(reply));
    crate::build::copy_data(&body)
}

/// A `pgoutput` message (protocol version 1), reduced to what tells which relations a
/// transaction changed.
#[derive(Debug, PartialEq, Eq)]
pub enum Pgoutput<'a> {
    /// A transaction's changes begin (`final_lsn`: where its commit record is).
    Begin { final_lsn: u64, xid: u32 },
    /// The transaction committed: `end_lsn` is the end of its commit record (a standby
    /// that has replayed up to there has the transaction).
    Commit { commit_lsn: u64, end_lsn: u64 },
    /// The description of relation `id`, sent before its first change in a stream (and
    /// again when it changes). `namespace` is empty for `pg_catalog`.
    Relation {
        id: u32,
        namespace: &'a str,
        name: &'a str,
    },
    /// A row of relation `relation` was inserted, updated or deleted.
    Change { relation: u32 },
    /// These relations were truncated.
    Truncate { relations: Vec<u32> },
    /// Origin, Type, logical Message: nothing about relations written.
    Other(u8),
}

/// Decodes one `pgoutput` message (the data of an XLogData).
pub fn parse_pgoutput(data: &[u8]) -> Result<Pgoutput<'_>, FrameError> {
    let mut c = Cursor::new(b'w', data);
    let kind = c.u8("pgoutput message kind")?;
    match kind {
        b'B' => {
            let final_lsn = u64_of(&mut c, "Begin final LSN")?;
            let _ts = u64_of(&mut c, "Begin timestamp")?;
            let xid = c.u32("Begin xid")?;
            Ok(Pgoutput::Begin { final_lsn, xid })
        }
        b'C' => {
            let _flags = c.u8("Commit flags")?;
            let commit_lsn = u64_of(&mut c, "Commit LSN")?;
            let end_lsn = u64_of(&mut c, "Commit end LSN")?;
            let _ts = u64_of(&mut c, "Commit timestamp")?;
            Ok(Pgoutput::Commit {
                commit_lsn,
                end_lsn,
            })
        }
        b'R' => {
            let id = c.u32("Relation id")?;
            let namespace = c.cstr("Relation namespace")?;
            let name = c.cstr("Relation name")?;
            // Replica identity and columns follow; a reader of names needs none of them.
            Ok(Pgoutput::Relation {
                id,
                namespace,
                name,
            })
        }
        b'I' | b'U' | b'D' => Ok(Pgoutput::Change {
            relation: c.u32("changed relation id")?,
        }),
        b'T' => {
            let n = c.u32("Truncate relation count")? as usize;
            let _options = c.u8("Truncate options")?;
            if n.saturating_mul(4) > c.remaining().len() {
                return Err(c.malformed(format!(
                    "Truncate: {n} relation ids do not fit in the {} bytes that remain",
                    c.remaining().len()
                )));
            }
            let relations = (0..n)
                .map(|_| c.u32("truncated relation id"))
                .collect::<Result<_, _>>()?;
            Ok(Pgoutput::Truncate { relations })
        }
        b'O' | b'Y' | b'M' => Ok(Pgoutput::Other(kind)),
        other => Err(c.malformed(format!("unknown pgoutput message kind {:?}", other as char))),
    }
}

fn u64_of(c: &mut Cursor<'_>, what: &str) -> Result<u64, FrameError> {
    let b = c.bytes(8, what)?;
    Ok(u64::from_be_bytes([
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xlog(start: u64, data: &[u8]) -> Vec<u8> {
        let mut v = vec![b'w'];
        v.extend_from_slice(&start.to_be_bytes());
        v.extend_from_slice(&(start + 8).to_be_bytes());
        v.extend_from_slice(&0u64.to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn stream_messages_are_decoded() {
        let w = xlog(0x10, b"Ohello\0");
        assert_eq!(
            parse_stream(&w),
            Ok(StreamMessage::XLogData {
                start: 0x10,
                end: 0x18,
                data: b"Ohello\0"
            })
        );
        let mut k = vec![b'k'];
        k.extend_from_slice(&0x2000u64.to_be_bytes());
        k.extend_from_slice(&0u64.to_be_bytes());
        k.push(1);
        assert_eq!(
            parse_stream(&k),
            Ok(StreamMessage::Keepalive {
                end: 0x2000,
                reply: true
            })
        );
        for bad in [&b""[..], b"w\0\0", b"k\0\0\0\0\0\0\0\0", b"z"] {
            assert!(parse_stream(bad).is_err(), "{bad:?}");
        }
        // A keepalive with bytes after its last field is refused.
        let mut long = k.clone();
        long.push(0);
        assert!(parse_stream(&long).is_err());
    }

    #[test]
    fn pgoutput_messages_name_relations_and_commits() {
        let mut begin = vec![b'B'];
        begin.extend_from_slice(&0x500u64.to_be_bytes());
        begin.extend_from_slice(&0u64.to_be_bytes());
        begin.extend_from_slice(&7u32.to_be_bytes());
        assert_eq!(
            parse_pgoutput(&begin),
            Ok(Pgoutput::Begin {
                final_lsn: 0x500,
                xid: 7
            })
        );
        let mut rel = vec![b'R'];
        rel.extend_from_slice(&16384u32.to_be_bytes());
        rel.extend_from_slice(b"app\0Orders\0d\0\x01");
        assert_eq!(
            parse_pgoutput(&rel),
            Ok(Pgoutput::Relation {
                id: 16384,
                namespace: "app",
                name: "Orders"
            })
        );
        for kind in [b'I', b'U', b'D'] {
            let mut m = vec![kind];
            m.extend_from_slice(&16384u32.to_be_bytes());
            m.extend_from_slice(b"N\0\0");
            assert_eq!(parse_pgoutput(&m), Ok(Pgoutput::Change { relation: 16384 }));
        }
        let mut t = vec![b'T'];
        t.extend_from_slice(&2u32.to_be_bytes());
        t.push(0);
        t.extend_from_slice(&1u32.to_be_bytes());
        t.extend_from_slice(&2u32.to_be_bytes());
        assert_eq!(
            parse_pgoutput(&t),
            Ok(Pgoutput::Truncate {
                relations: vec![1, 2]
            })
        );
        let mut commit = vec![b'C', 0];
        commit.extend_from_slice(&0x500u64.to_be_bytes());
        commit.extend_from_slice(&0x530u64.to_be_bytes());
        commit.extend_from_slice(&0u64.to_be_bytes());
        assert_eq!(
            parse_pgoutput(&commit),
            Ok(Pgoutput::Commit {
                commit_lsn: 0x500,
                end_lsn: 0x530
            })
        );
        assert_eq!(parse_pgoutput(b"Yx"), Ok(Pgoutput::Other(b'Y')));
    }

    #[test]
    fn malformed_pgoutput_is_an_error_not_a_panic() {
        let mut huge = vec![b'T'];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        huge.push(0);
        for bad in [
            &b""[..],
            b"B\0\0",
            b"C\0",
            b"R\0\0\0\x01app",
            b"I\0\0",
            &huge,
            b"Z",
        ] {
            assert!(parse_pgoutput(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_status_update_reports_one_position_three_times() {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(946_684_800 + 1);
        let f = standby_status(0xABCD, true, at);
        assert_eq!(&f[..5], b"d\0\0\0\x26");
        assert_eq!(f[5], b'r');
        for i in 0..3 {
            let at = 6 + i * 8;
            assert_eq!(&f[at..at + 8], &0xABCDu64.to_be_bytes());
        }
        assert_eq!(&f[30..38], &1_000_000i64.to_be_bytes());
        assert_eq!(f[38], 1);
    }
}
