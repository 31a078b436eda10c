//! The untagged packets a client sends before the session starts.
//!
//! A connection opens with a packet that has no type byte: a big-endian `i32`
//! length (counting itself) followed by a 32-bit request code. The code is
//! either a protocol version (`3.x` for a StartupMessage) or one of the
//! special request codes for SSLRequest, GSSENCRequest and CancelRequest.

use bytes::{Bytes, BytesMut};

use crate::cursor::Cursor;
use crate::framing::{Decoded, FrameError, Limits};

/// Request code of an SSLRequest (1234.5679).
pub const SSL_REQUEST_CODE: u32 = 80_877_103;
/// Request code of a GSSENCRequest (1234.5680).
pub const GSSENC_REQUEST_CODE: u32 = 80_877_104;
/// Request code of a CancelRequest (1234.5678).
pub const CANCEL_REQUEST_CODE: u32 = 80_877_102;
/// Protocol version 3.0 as sent in a StartupMessage.
pub const PROTOCOL_3_0: u32 = 196_608;

/// The smallest legal startup-phase packet: length plus request code.
const MIN_STARTUP_LEN: usize = 8;

/// One startup-phase packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    /// A StartupMessage opening a session.
    Startup(StartupMessage),
    /// The client asks for TLS; answer `S` or `N` (see
    /// [`crate::build::ssl_no`]) and keep reading startup packets.
    SslRequest,
    /// The client asks for GSSAPI encryption; answer `N` to decline.
    GssEncRequest,
    /// A request to cancel the query running on another connection.
    Cancel(CancelKey),
}

/// The key identifying a backend for cancellation, as sent in BackendKeyData
/// and CancelRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CancelKey {
    /// Process id of the backend.
    pub pid: i32,
    /// Secret key of the backend.
    pub secret: i32,
}

/// A StartupMessage: protocol version and the session parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupMessage {
    /// Requested protocol version, `major << 16 | minor` (3.0 = 196608).
    pub protocol: u32,
    /// Parameters in the order the client sent them.
    pub params: Vec<(String, String)>,
}

impl StartupMessage {
    /// The value of parameter `key`; when the client repeated a parameter,
    /// the last occurrence wins, as in PostgreSQL.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `user` parameter.
    pub fn user(&self) -> Option<&str> {
        self.get("user")
    }

    /// The `database` parameter, defaulting to the user name as PostgreSQL
    /// does when it is absent or empty.
    pub fn database(&self) -> Option<&str> {
        match self.get("database") {
            Some(db) if !db.is_empty() => Some(db),
            _ => self.user(),
        }
    }

    /// The `options` parameter (command-line style settings).
    pub fn options(&self) -> Option<&str> {
        self.get("options")
    }

    /// The packet's bytes, as sent by a client.
    pub fn to_bytes(&self) -> Bytes {
        let params: Vec<(&str, &str)> = self
            .params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        crate::build::startup_with_protocol(self.protocol, &params)
    }

    /// Major protocol version (3).
    pub fn major(&self) -> u16 {
        (self.protocol >> 16) as u16
    }

    /// Minor protocol version.
    pub fn minor(&self) -> u16 {
        (self.protocol & 0xffff) as u16
    }
}

/// Splits one startup-phase packet off the front of `buf` and decodes it.
///
/// The length is validated before the body is read: below 8 bytes is
/// [`FrameError::TooShort`], above `limits.max_startup` is
/// [`FrameError::TooLong`]. Protocol versions other than 3.x are rejected
/// with [`FrameError::InvalidStartup`]; unknown `1234.x` request codes with
/// [`FrameError::UnknownStartupCode`].
pub fn decode_startup(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Decoded<StartupPacket>, FrameError> {
    if buf.len() < 4 {
        return Ok(Decoded::Incomplete { needed: None });
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len < MIN_STARTUP_LEN {
        return Err(FrameError::TooShort { len });
    }
    if len > limits.max_startup {
        return Err(FrameError::TooLong {
            len,
            max: limits.max_startup,
        });
    }
    if buf.len() < len {
        return Ok(Decoded::Incomplete {
            needed: Some(len - buf.len()),
        });
    }
    let packet = buf.split_to(len);
    parse_startup(&packet[4..]).map(Decoded::Frame)
}

fn parse_startup(body: &[u8]) -> Result<StartupPacket, FrameError> {
    let mut cur = Cursor::new(0, body);
    let code = cur
        .u32("request code")
        .map_err(|e| FrameError::InvalidStartup(e.to_string()))?;
    let exact = |name: &str, want: usize| {
        if body.len() + 4 == want {
            Ok(())
        } else {
            Err(FrameError::InvalidStartup(format!(
                "{name} must be {want} bytes long, got {}",
                body.len() + 4
            )))
        }
    };
    match code {
        SSL_REQUEST_CODE => exact("SSLRequest", 8).map(|()| StartupPacket::SslRequest),
        GSSENC_REQUEST_CODE => exact("GSSENCRequest", 8).map(|()| StartupPacket::GssEncRequest),
        CANCEL_REQUEST_CODE => {
            exact("CancelRequest", 16)?;
            let invalid = |e: FrameError| FrameError::InvalidStartup(e.to_string());
            let pid = cur.i32("process id").map_err(invalid)?;
            let secret = cur.i32("secret key").map_err(invalid)?;
            Ok(StartupPacket::Cancel(CancelKey { pid, secret }))
        }
        _ if code >> 16 == 1234 => Err(FrameError::UnknownStartupCode(code)),
        _ if code >> 16 != 3 => Err(FrameError::InvalidStartup(format!(
            "unsupported frontend protocol {}.{}: server supports 3.0",
            code >> 16,
            code & 0xffff
        ))),
        _ => parse_params(cur.rest()).map(|params| {
            StartupPacket::Startup(StartupMessage {
                protocol: code,
                params,
            })
        }),
    }
}

fn parse_params(mut rest: &[u8]) -> Result<Vec<(String, String)>, FrameError> {
    let invalid = |msg: String| FrameError::InvalidStartup(msg);
    let mut params = Vec::new();
    loop {
        match rest {
            [] => {
                return Err(invalid(
                    "missing terminator after the last parameter".into(),
                ))
            }
            [0] => return Ok(params),
            [0, ..] => {
                return Err(invalid(format!(
                    "{} bytes after the parameter list terminator",
                    rest.len() - 1
                )))
            }
            _ => {}
        }
        let (name, after_name) = split_cstr(rest)
            .ok_or_else(|| invalid("parameter name is not NUL-terminated".into()))?;
        let name = utf8(name, "parameter name")?;
        let (value, after_value) = split_cstr(after_name)
            .ok_or_else(|| invalid(format!("parameter \"{name}\" has no value")))?;
        let value = utf8(value, "parameter value")?;
        params.push((name.to_owned(), value.to_owned()));
        rest = after_value;
    }
}

fn split_cstr(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let pos = buf.iter().position(|&b| b == 0)?;
    Some((&buf[..pos], &buf[pos + 1..]))
}

fn utf8<'a>(raw: &'a [u8], what: &str) -> Result<&'a str, FrameError> {
    std::str::from_utf8(raw)
        .map_err(|e| FrameError::InvalidStartup(format!("{what} is not valid UTF-8 ({e})")))
}
