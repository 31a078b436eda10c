//! Typed, borrowing views of the messages a client sends.
//!
//! [`parse_frontend`] reads a [`Frame`] on demand; the returned view borrows
//! strings and byte slices from the frame, so inspecting a message costs no
//! copies beyond the small vector of Parse's parameter types. Format codes are read
//! as-is: their meaning (and the consistency of their count with the parameters) is the
//! server's to judge, so a client gets the same error it would get without the proxy. Every field is
//! validated: strings must be NUL-terminated UTF-8, counts must be
//! non-negative and fit in the body, and no bytes may trail the last field.

use crate::cursor::Cursor;
use crate::framing::{Frame, FrameError};

/// A client message, borrowed from its [`Frame`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontendMessage<'a> {
    /// Simple query (`Q`); may contain several statements.
    Query {
        /// The SQL text.
        sql: &'a str,
    },
    /// Parse (`P`): prepare `sql` as statement `name` (empty = unnamed).
    Parse {
        /// Statement name, empty for the unnamed statement.
        name: &'a str,
        /// The SQL text.
        sql: &'a str,
        /// Parameter type OIDs the client specified (0 = unspecified).
        param_types: Vec<u32>,
    },
    /// Bind (`B`): create `portal` from `statement` with parameters.
    Bind {
        /// Portal name, empty for the unnamed portal.
        portal: &'a str,
        /// Prepared statement name, empty for the unnamed statement.
        statement: &'a str,
        /// Format codes, parameter values and result formats, validated and read on
        /// demand (routing needs only the names).
        params: BindParams<'a>,
    },
    /// Describe (`D`) a statement (`kind = b'S'`) or portal (`b'P'`).
    Describe {
        /// `b'S'` or `b'P'`.
        kind: u8,
        /// Statement or portal name.
        name: &'a str,
    },
    /// Execute (`E`) a portal.
    Execute {
        /// Portal name.
        portal: &'a str,
        /// Row limit, 0 = no limit.
        max_rows: i32,
    },
    /// Close (`C`) a statement (`kind = b'S'`) or portal (`b'P'`).
    Close {
        /// `b'S'` or `b'P'`.
        kind: u8,
        /// Statement or portal name.
        name: &'a str,
    },
    /// Sync (`S`): end of an extended-query batch.
    Sync,
    /// Flush (`H`): ask the server to send pending output.
    Flush,
    /// CopyData (`d`) payload.
    CopyData(&'a [u8]),
    /// CopyDone (`c`).
    CopyDone,
    /// CopyFail (`f`) with the client's reason.
    CopyFail {
        /// Error message from the client.
        message: &'a str,
    },
    /// Terminate (`X`).
    Terminate,
    /// PasswordMessage, SASLInitialResponse or SASLResponse (`p`): the raw
    /// body; which one it is depends on the authentication exchange (see
    /// [`crate::auth::parse_sasl_initial_response`]).
    Password(&'a [u8]),
    /// FunctionCall (`F`), passed through without inspection.
    FunctionCall,
}

/// A Query or Parse that is well formed except that its query text is not UTF-8: what a
/// client whose `client_encoding` is not UTF8 sends (the server converts it), or text
/// the server itself refuses (22021) if the encoding is UTF8.
#[derive(Debug, PartialEq, Eq)]
pub struct NonUtf8Text<'a> {
    /// The statement's name (a Parse's; empty for a Query).
    pub name: &'a str,
    /// The text, as sent.
    pub text: &'a [u8],
}

/// The frame as a [`NonUtf8Text`], when it is one: [`parse_frontend`] refused it only
/// because its query text is not UTF-8.
pub fn non_utf8_text(frame: &Frame) -> Option<NonUtf8Text<'_>> {
    let mut cur = Cursor::new(frame.tag, frame.body());
    let name = match frame.tag {
        b'Q' => "",
        b'P' => cur.cstr("statement name").ok()?,
        _ => return None,
    };
    let rest = cur.remaining();
    let end = memchr::memchr(0, rest)?;
    let text = &rest[..end];
    if std::str::from_utf8(text).is_ok() {
        return None;
    }
    let mut tail = Cursor::new(frame.tag, &rest[end + 1..]);
    if frame.tag == b'P' {
        let n = tail.count(4, "parameter type count").ok()?;
        tail.bytes(4 * n, "parameter types").ok()?;
    }
    tail.finish().ok()?;
    Some(NonUtf8Text { name, text })
}

/// Parses a client frame into a typed view.
///
/// Fails with [`FrameError::UnknownTag`] for a type byte a client may not
/// send and [`FrameError::Malformed`] for a body that does not match its
/// message format.
pub fn parse_frontend(frame: &Frame) -> Result<FrontendMessage<'_>, FrameError> {
    let tag = frame.tag;
    let mut cur = Cursor::new(tag, frame.body());
    let msg = match tag {
        b'Q' => FrontendMessage::Query {
            sql: cur.cstr("query string")?,
        },
        b'P' => {
            let name = cur.cstr("statement name")?;
            let sql = cur.cstr("query string")?;
            let n = cur.count(4, "parameter type count")?;
            let mut param_types = Vec::with_capacity(n);
            for _ in 0..n {
                param_types.push(cur.u32("parameter type")?);
            }
            FrontendMessage::Parse {
                name,
                sql,
                param_types,
            }
        }
        b'B' => parse_bind(&mut cur)?,
        b'D' => {
            let kind = describe_kind(&mut cur)?;
            FrontendMessage::Describe {
                kind,
                name: cur.cstr("name")?,
            }
        }
        b'E' => FrontendMessage::Execute {
            portal: cur.cstr("portal name")?,
            max_rows: cur.i32("row limit")?,
        },
        b'C' => {
            let kind = describe_kind(&mut cur)?;
            FrontendMessage::Close {
                kind,
                name: cur.cstr("name")?,
            }
        }
        b'S' => FrontendMessage::Sync,
        b'H' => FrontendMessage::Flush,
        b'd' => FrontendMessage::CopyData(cur.rest()),
        b'c' => FrontendMessage::CopyDone,
        b'f' => FrontendMessage::CopyFail {
            message: cur.cstr("error message")?,
        },
        b'X' => FrontendMessage::Terminate,
        b'p' => FrontendMessage::Password(cur.rest()),
        b'F' => {
            cur.rest();
            FrontendMessage::FunctionCall
        }
        other => return Err(FrameError::UnknownTag(other)),
    };
    cur.finish()?;
    Ok(msg)
}

fn describe_kind(cur: &mut Cursor<'_>) -> Result<u8, FrameError> {
    match cur.u8("target kind")? {
        k @ (b'S' | b'P') => Ok(k),
        k => Err(cur.malformed(format!("target kind must be 'S' or 'P', got byte {k}"))),
    }
}

fn parse_bind<'a>(cur: &mut Cursor<'a>) -> Result<FrontendMessage<'a>, FrameError> {
    let portal = cur.cstr("portal name")?;
    let statement = cur.cstr("statement name")?;
    let n = cur.count(2, "parameter format count")?;
    let formats = cur.bytes(2 * n, "parameter format")?;
    let n = cur.count(4, "parameter count")?;
    let start = cur.remaining();
    for _ in 0..n {
        let len = cur.i32("parameter length")?;
        match len {
            -1 => {}
            len if len < 0 => {
                return Err(cur.malformed(format!("parameter length {len} is negative")))
            }
            len => {
                cur.bytes(len as usize, "parameter value")?;
            }
        }
    }
    let values = &start[..start.len() - cur.remaining().len()];
    let n_results = cur.count(2, "result format count")?;
    let results = cur.bytes(2 * n_results, "result format")?;
    Ok(FrontendMessage::Bind {
        portal,
        statement,
        params: BindParams {
            formats,
            values,
            count: n as u16,
            results,
        },
    })
}

/// The parameter part of a Bind, borrowed from the frame and already validated: every
/// count fits the body, every value length is -1 (NULL) or fits. Reading it allocates
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindParams<'a> {
    formats: &'a [u8],
    values: &'a [u8],
    count: u16,
    results: &'a [u8],
}

impl<'a> BindParams<'a> {
    /// Parameter format codes (0 text, 1 binary), as the client sent them.
    pub fn param_formats(&self) -> impl ExactSizeIterator<Item = i16> + 'a {
        codes(self.formats)
    }

    /// The number of parameter values.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// No parameter values.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Parameter values in order; `None` is SQL NULL.
    pub fn values(&self) -> impl Iterator<Item = Option<&'a [u8]>> + 'a {
        let mut rest = self.values;
        (0..self.count).map(move |_| {
            let len = i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
            rest = &rest[4..];
            (len >= 0).then(|| {
                let (value, tail) = rest.split_at(len as usize);
                rest = tail;
                value
            })
        })
    }

    /// Result column format codes.
    pub fn result_formats(&self) -> impl ExactSizeIterator<Item = i16> + 'a {
        codes(self.results)
    }
}

fn codes(raw: &[u8]) -> impl ExactSizeIterator<Item = i16> + '_ {
    raw.chunks_exact(2)
        .map(|c| i16::from_be_bytes([c[0], c[1]]))
}

impl FrontendMessage<'_> {
    /// The message type byte.
    pub fn tag(&self) -> u8 {
        match self {
            FrontendMessage::Query { .. } => b'Q',
            FrontendMessage::Parse { .. } => b'P',
            FrontendMessage::Bind { .. } => b'B',
            FrontendMessage::Describe { .. } => b'D',
            FrontendMessage::Execute { .. } => b'E',
            FrontendMessage::Close { .. } => b'C',
            FrontendMessage::Sync => b'S',
            FrontendMessage::Flush => b'H',
            FrontendMessage::CopyData(_) => b'd',
            FrontendMessage::CopyDone => b'c',
            FrontendMessage::CopyFail { .. } => b'f',
            FrontendMessage::Terminate => b'X',
            FrontendMessage::Password(_) => b'p',
            FrontendMessage::FunctionCall => b'F',
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build;

    fn frame(raw: bytes::Bytes) -> Frame {
        Frame::from_raw(raw).expect("frame")
    }

    #[test]
    fn texts_that_are_not_utf8_are_told_apart_from_malformed_messages() {
        let latin1 = b"SELECT 'caf\xe9'";
        let mut q = vec![b'Q'];
        q.extend_from_slice(&((4 + latin1.len() + 1) as u32).to_be_bytes());
        q.extend_from_slice(latin1);
        q.push(0);
        let q = frame(q.into());
        assert!(parse_frontend(&q).is_err());
        assert_eq!(
            non_utf8_text(&q),
            Some(NonUtf8Text {
                name: "",
                text: latin1
            })
        );
        // A Parse: its name is UTF-8, its parameter types are read as usual.
        let mut body = b"s1\0".to_vec();
        body.extend_from_slice(latin1);
        body.push(0);
        body.extend_from_slice(&1u16.to_be_bytes());
        body.extend_from_slice(&25u32.to_be_bytes());
        let mut p = vec![b'P'];
        p.extend_from_slice(&((4 + body.len()) as u32).to_be_bytes());
        p.extend_from_slice(&body);
        let p = frame(p.clone().into());
        assert_eq!(non_utf8_text(&p).map(|t| t.name), Some("s1"));
        // Malformed otherwise: a parameter count the body does not hold, bytes after the
        // end, a UTF-8 text, another message type.
        let mut short = body.clone();
        short.truncate(short.len() - 1);
        let mut bad = vec![b'P'];
        bad.extend_from_slice(&((4 + short.len()) as u32).to_be_bytes());
        bad.extend_from_slice(&short);
        assert_eq!(non_utf8_text(&frame(bad.into())), None);
        let mut extra = q.raw.to_vec();
        extra.push(7);
        let n = extra.len() as u32 - 1;
        extra[1..5].copy_from_slice(&n.to_be_bytes());
        assert_eq!(non_utf8_text(&frame(extra.into())), None);
        assert_eq!(non_utf8_text(&frame(build::query("SELECT 1"))), None);
        assert_eq!(non_utf8_text(&frame(build::sync())), None);
    }
}
