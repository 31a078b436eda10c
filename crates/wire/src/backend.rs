//! Typed, borrowing views of the messages a server sends.
//!
//! [`parse_backend`] decodes the messages the proxy acts on (authentication,
//! session parameters, transaction status, errors, notifications, the
//! extended-query acknowledgements). Messages the proxy only forwards, such
//! as RowDescription and DataRow, are recognised by type without looking at
//! their body; unknown types are [`BackendMessage::Other`].

use crate::cursor::Cursor;
use crate::framing::{CancelKey, Frame, FrameError};

/// A server message, borrowed from its [`Frame`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendMessage<'a> {
    /// Authentication request or result (`R`).
    Authentication(Auth<'a>),
    /// ParameterStatus (`S`): a run-time parameter's current value.
    ParameterStatus {
        /// Parameter name.
        name: &'a str,
        /// Parameter value.
        value: &'a str,
    },
    /// BackendKeyData (`K`): the key to cancel this backend's queries.
    BackendKeyData(CancelKey),
    /// ReadyForQuery (`Z`) with the transaction status.
    ReadyForQuery(TxStatus),
    /// CommandComplete (`C`) with the command tag, e.g. `INSERT 0 1`.
    CommandComplete {
        /// The command tag.
        tag: &'a str,
    },
    /// ErrorResponse (`E`).
    ErrorResponse(ErrorFields<'a>),
    /// NoticeResponse (`N`).
    NoticeResponse(ErrorFields<'a>),
    /// NotificationResponse (`A`) from LISTEN/NOTIFY.
    NotificationResponse {
        /// Process id of the notifying backend.
        pid: i32,
        /// Channel name.
        channel: &'a str,
        /// Payload string.
        payload: &'a str,
    },
    /// ParseComplete (`1`).
    ParseComplete,
    /// BindComplete (`2`).
    BindComplete,
    /// CloseComplete (`3`).
    CloseComplete,
    /// NoData (`n`).
    NoData,
    /// EmptyQueryResponse (`I`).
    EmptyQueryResponse,
    /// PortalSuspended (`s`): Execute hit its row limit.
    PortalSuspended,
    /// RowDescription (`T`), body not inspected.
    RowDescription,
    /// DataRow (`D`), body not inspected.
    DataRow,
    /// CopyInResponse (`G`), body not inspected.
    CopyInResponse,
    /// CopyOutResponse (`H`), body not inspected.
    CopyOutResponse,
    /// CopyBothResponse (`W`), body not inspected.
    CopyBothResponse,
    /// CopyData (`d`), body not inspected.
    CopyData,
    /// CopyDone (`c`).
    CopyDone,
    /// ParameterDescription (`t`), body not inspected.
    ParameterDescription,
    /// NegotiateProtocolVersion (`v`), body not inspected.
    NegotiateProtocolVersion,
    /// Any other message type (FunctionCallResponse `V`, future types, ...).
    Other(u8),
}

/// The body of an Authentication (`R`) message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth<'a> {
    /// AuthenticationOk (0).
    Ok,
    /// AuthenticationCleartextPassword (3).
    CleartextPassword,
    /// AuthenticationMD5Password (5) with its salt.
    Md5Password {
        /// Four random bytes to hash the password with.
        salt: [u8; 4],
    },
    /// AuthenticationSASL (10) with the mechanisms the server offers.
    Sasl {
        /// Mechanism names, e.g. `SCRAM-SHA-256`.
        mechanisms: Vec<&'a str>,
    },
    /// AuthenticationSASLContinue (11) with SASL data.
    SaslContinue(&'a [u8]),
    /// AuthenticationSASLFinal (12) with SASL data.
    SaslFinal(&'a [u8]),
    /// Any other method (Kerberos, GSSAPI, SSPI, ...), by code.
    Other(u32),
}

/// Transaction status reported by ReadyForQuery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxStatus {
    /// `I`: not in a transaction block.
    Idle,
    /// `T`: in a transaction block.
    InTransaction,
    /// `E`: in a failed transaction block; statements are rejected until
    /// the block ends.
    Failed,
}

impl TxStatus {
    /// The status byte on the wire.
    pub fn as_byte(self) -> u8 {
        match self {
            TxStatus::Idle => b'I',
            TxStatus::InTransaction => b'T',
            TxStatus::Failed => b'E',
        }
    }

    /// Parses a status byte.
    pub fn from_byte(b: u8) -> Option<TxStatus> {
        match b {
            b'I' => Some(TxStatus::Idle),
            b'T' => Some(TxStatus::InTransaction),
            b'E' => Some(TxStatus::Failed),
            _ => None,
        }
    }
}

/// The fields of an ErrorResponse or NoticeResponse.
///
/// The common fields are exposed directly; [`ErrorFields::fields`] iterates
/// all of them (type byte and value) in wire order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFields<'a> {
    /// `S`: severity, possibly localized.
    pub severity: Option<&'a str>,
    /// `V`: severity, never localized (PostgreSQL 9.6+).
    pub severity_nonlocalized: Option<&'a str>,
    /// `C`: SQLSTATE code.
    pub code: Option<&'a str>,
    /// `M`: primary message.
    pub message: Option<&'a str>,
    /// `D`: detail.
    pub detail: Option<&'a str>,
    /// `H`: hint.
    pub hint: Option<&'a str>,
    raw: &'a [u8],
}

impl<'a> ErrorFields<'a> {
    /// Parses the body of an `E` or `N` message.
    pub fn parse(tag: u8, body: &'a [u8]) -> Result<ErrorFields<'a>, FrameError> {
        let mut out = ErrorFields {
            severity: None,
            severity_nonlocalized: None,
            code: None,
            message: None,
            detail: None,
            hint: None,
            raw: body,
        };
        let mut cur = Cursor::new(tag, body);
        loop {
            let field = cur.u8("field type")?;
            if field == 0 {
                break;
            }
            let value = cur.cstr("field value")?;
            match field {
                b'S' => out.severity = Some(value),
                b'V' => out.severity_nonlocalized = Some(value),
                b'C' => out.code = Some(value),
                b'M' => out.message = Some(value),
                b'D' => out.detail = Some(value),
                b'H' => out.hint = Some(value),
                _ => {}
            }
        }
        cur.finish()?;
        Ok(out)
    }

    /// All fields in wire order, as (field type, value).
    pub fn fields(&self) -> ErrorFieldIter<'a> {
        ErrorFieldIter { rest: self.raw }
    }

    /// The value of field `field`, if present.
    pub fn get(&self, field: u8) -> Option<&'a str> {
        self.fields().find(|(f, _)| *f == field).map(|(_, v)| v)
    }

    /// The severity, preferring the non-localized form.
    pub fn severity_code(&self) -> Option<&'a str> {
        self.severity_nonlocalized.or(self.severity)
    }
}

/// Iterator over the (type, value) pairs of an [`ErrorFields`].
#[derive(Debug, Clone)]
pub struct ErrorFieldIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for ErrorFieldIter<'a> {
    type Item = (u8, &'a str);

    fn next(&mut self) -> Option<(u8, &'a str)> {
        let (&field, after) = self.rest.split_first()?;
        if field == 0 {
            self.rest = &[];
            return None;
        }
        let pos = after.iter().position(|&b| b == 0)?;
        let value = std::str::from_utf8(&after[..pos]).ok()?;
        self.rest = &after[pos + 1..];
        Some((field, value))
    }
}

/// Parses a server frame into a typed view.
///
/// Fails with [`FrameError::Malformed`] when the body of a message the proxy
/// inspects does not match its format. Unknown types are not an error.
pub fn parse_backend(frame: &Frame) -> Result<BackendMessage<'_>, FrameError> {
    let tag = frame.tag;
    let body = frame.body();
    let mut cur = Cursor::new(tag, body);
    let msg = match tag {
        b'R' => BackendMessage::Authentication(parse_auth(&mut cur)?),
        b'S' => BackendMessage::ParameterStatus {
            name: cur.cstr("parameter name")?,
            value: cur.cstr("parameter value")?,
        },
        b'K' => BackendMessage::BackendKeyData(CancelKey {
            pid: cur.i32("process id")?,
            secret: cur.i32("secret key")?,
        }),
        b'Z' => {
            let b = cur.u8("transaction status")?;
            let status = TxStatus::from_byte(b)
                .ok_or_else(|| cur.malformed(format!("unknown transaction status byte {b}")))?;
            BackendMessage::ReadyForQuery(status)
        }
        b'C' => BackendMessage::CommandComplete {
            tag: cur.cstr("command tag")?,
        },
        b'E' => BackendMessage::ErrorResponse(ErrorFields::parse(tag, cur.rest())?),
        b'N' => BackendMessage::NoticeResponse(ErrorFields::parse(tag, cur.rest())?),
        b'A' => BackendMessage::NotificationResponse {
            pid: cur.i32("process id")?,
            channel: cur.cstr("channel")?,
            payload: cur.cstr("payload")?,
        },
        b'1' => BackendMessage::ParseComplete,
        b'2' => BackendMessage::BindComplete,
        b'3' => BackendMessage::CloseComplete,
        b'n' => BackendMessage::NoData,
        b'I' => BackendMessage::EmptyQueryResponse,
        b's' => BackendMessage::PortalSuspended,
        b'c' => BackendMessage::CopyDone,
        opaque => {
            cur.rest();
            match opaque {
                b'T' => BackendMessage::RowDescription,
                b'D' => BackendMessage::DataRow,
                b'G' => BackendMessage::CopyInResponse,
                b'H' => BackendMessage::CopyOutResponse,
                b'W' => BackendMessage::CopyBothResponse,
                b'd' => BackendMessage::CopyData,
                b't' => BackendMessage::ParameterDescription,
                b'v' => BackendMessage::NegotiateProtocolVersion,
                other => BackendMessage::Other(other),
            }
        }
    };
    cur.finish()?;
    Ok(msg)
}

fn parse_auth<'a>(cur: &mut Cursor<'a>) -> Result<Auth<'a>, FrameError> {
    let code = cur.u32("authentication code")?;
    Ok(match code {
        0 => Auth::Ok,
        3 => Auth::CleartextPassword,
        5 => {
            let s = cur.bytes(4, "md5 salt")?;
            Auth::Md5Password {
                salt: [s[0], s[1], s[2], s[3]],
            }
        }
        10 => {
            let mut mechanisms = Vec::new();
            loop {
                let m = cur.cstr("SASL mechanism")?;
                if m.is_empty() {
                    break;
                }
                mechanisms.push(m);
            }
            Auth::Sasl { mechanisms }
        }
        11 => Auth::SaslContinue(cur.rest()),
        12 => Auth::SaslFinal(cur.rest()),
        other => {
            cur.rest();
            Auth::Other(other)
        }
    })
}

impl BackendMessage<'_> {
    /// Whether this message is ReadyForQuery, the end of a server's reply to
    /// a Query or Sync.
    pub fn is_ready_for_query(&self) -> bool {
        matches!(self, BackendMessage::ReadyForQuery(_))
    }
}

/// Column `index` of a DataRow's body (`None`: SQL NULL); [`FrameError::Malformed`]
/// when the row has no such column or its lengths do not fit the body.
pub fn data_row_column(body: &[u8], index: usize) -> Result<Option<&[u8]>, FrameError> {
    let mut cur = Cursor::new(b'D', body);
    let columns = cur.count(4, "column count")?;
    if index >= columns {
        return Err(cur.malformed(format!("no column {index} in a row of {columns}")));
    }
    for i in 0..=index {
        let len = cur.i32("column length")?;
        let value = match usize::try_from(len) {
            Ok(n) => Some(cur.bytes(n, "column value")?),
            Err(_) if len == -1 => None,
            Err(_) => return Err(cur.malformed(format!("column length {len}"))),
        };
        if i == index {
            return Ok(value);
        }
    }
    unreachable!("the loop returns at `index`")
}

#[cfg(test)]
mod data_row_tests {
    use super::*;

    fn row(columns: &[Option<&[u8]>]) -> Vec<u8> {
        let mut b = (columns.len() as i16).to_be_bytes().to_vec();
        for c in columns {
            match c {
                Some(v) => {
                    b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    b.extend_from_slice(v);
                }
                None => b.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        b
    }

    #[test]
    fn a_rows_columns_are_read_by_index_with_null_apart() {
        let r = row(&[Some(b"4242"), None, Some(b"0/16B3748")]);
        assert_eq!(data_row_column(&r, 0).unwrap(), Some(&b"4242"[..]));
        assert_eq!(data_row_column(&r, 1).unwrap(), None);
        assert_eq!(data_row_column(&r, 2).unwrap(), Some(&b"0/16B3748"[..]));
        assert!(data_row_column(&r, 3).is_err(), "no fourth column");
    }

    #[test]
    fn a_row_whose_lengths_do_not_fit_is_malformed() {
        let mut r = row(&[Some(b"abc")]);
        r.truncate(r.len() - 1);
        assert!(data_row_column(&r, 0).is_err());
        let r = row(&[Some(b"abc")]);
        let mut bad = r.clone();
        bad[2..6].copy_from_slice(&(-2i32).to_be_bytes());
        assert!(
            data_row_column(&bad, 0).is_err(),
            "a negative length other than -1"
        );
        assert!(data_row_column(&[0], 0).is_err(), "a count cut short");
        assert!(data_row_column(&(-1i16).to_be_bytes(), 0).is_err());
    }
}
