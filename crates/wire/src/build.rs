//! Builders for complete protocol frames.
//!
//! Each function returns the full bytes of one message (type byte, length,
//! body) ready to write to a socket. Strings are written as C strings: a
//! string that contains a NUL byte is cut at the first NUL, because the
//! protocol cannot carry it and the receiver would stop reading there anyway;
//! every frame produced here is therefore well-formed.
//!
//! # Panics
//!
//! A frame whose body would exceed the protocol's `i32` length (2 GiB) cannot
//! be represented; building one panics. Every limit the proxy enforces is far
//! below that.

use bytes::{BufMut, Bytes, BytesMut};

use crate::backend::TxStatus;
use crate::error::ErrorResponse;
use crate::framing::CancelKey;
use crate::startup::{CANCEL_REQUEST_CODE, GSSENC_REQUEST_CODE, PROTOCOL_3_0, SSL_REQUEST_CODE};

/// Writes the body with `f`, then fills in the length.
fn frame(tag: u8, capacity: usize, f: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + capacity);
    buf.put_u8(tag);
    buf.put_i32(0);
    f(&mut buf);
    let len = i32::try_from(buf.len() - 1).expect("protocol frame larger than 2 GiB");
    buf[1..5].copy_from_slice(&len.to_be_bytes());
    buf.freeze()
}

/// Writes a startup-phase packet (no type byte).
fn untagged(capacity: usize, f: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut buf = BytesMut::with_capacity(4 + capacity);
    buf.put_i32(0);
    f(&mut buf);
    let len = i32::try_from(buf.len()).expect("startup packet larger than 2 GiB");
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    buf.freeze()
}

fn put_cstr(buf: &mut BytesMut, s: &str) {
    let bytes = s.as_bytes();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    buf.put_slice(&bytes[..end]);
    buf.put_u8(0);
}

fn count(n: usize, what: &str) -> i16 {
    i16::try_from(n).unwrap_or_else(|_| panic!("{what}: {n} exceeds the protocol's 32767"))
}

fn data_len(n: usize) -> i32 {
    i32::try_from(n).expect("protocol value larger than 2 GiB")
}

// ---------------------------------------------------------------- frontend

/// Query (`Q`).
pub fn query(sql: &str) -> Bytes {
    frame(b'Q', sql.len() + 1, |b| put_cstr(b, sql))
}

/// Parse (`P`) of `sql` as statement `name` with the given parameter type
/// OIDs (0 leaves a type unspecified).
///
/// # Panics
///
/// If more than 32767 parameter types are given.
pub fn parse(name: &str, sql: &str, param_types: &[u32]) -> Bytes {
    let n = count(param_types.len(), "parameter types");
    frame(
        b'P',
        name.len() + sql.len() + 4 + 4 * param_types.len(),
        |b| {
            put_cstr(b, name);
            put_cstr(b, sql);
            b.put_i16(n);
            for &oid in param_types {
                b.put_u32(oid);
            }
        },
    )
}

/// Bind (`B`) of `statement` into `portal`.
///
/// # Panics
///
/// If any list is longer than 32767 entries.
pub fn bind(
    portal: &str,
    statement: &str,
    param_formats: &[i16],
    params: &[Option<&[u8]>],
    result_formats: &[i16],
) -> Bytes {
    let nf = count(param_formats.len(), "parameter formats");
    let np = count(params.len(), "parameters");
    let nr = count(result_formats.len(), "result formats");
    let data: usize = params.iter().map(|p| 4 + p.map_or(0, <[u8]>::len)).sum();
    let cap = portal.len() + statement.len() + 8 + 2 * (param_formats.len() + result_formats.len());
    frame(b'B', cap + data, |b| {
        put_cstr(b, portal);
        put_cstr(b, statement);
        b.put_i16(nf);
        for &f in param_formats {
            b.put_i16(f);
        }
        b.put_i16(np);
        for p in params {
            match p {
                None => b.put_i32(-1),
                Some(v) => {
                    b.put_i32(data_len(v.len()));
                    b.put_slice(v);
                }
            }
        }
        b.put_i16(nr);
        for &f in result_formats {
            b.put_i16(f);
        }
    })
}

/// Describe (`D`) of a statement (`kind = b'S'`) or portal (`b'P'`).
pub fn describe(kind: u8, name: &str) -> Bytes {
    frame(b'D', name.len() + 2, |b| {
        b.put_u8(kind);
        put_cstr(b, name);
    })
}

/// Execute (`E`) of `portal`, returning at most `max_rows` rows (0 = all).
pub fn execute(portal: &str, max_rows: i32) -> Bytes {
    frame(b'E', portal.len() + 5, |b| {
        put_cstr(b, portal);
        b.put_i32(max_rows);
    })
}

/// Close (`C`) of a statement (`kind = b'S'`) or portal (`b'P'`).
pub fn close(kind: u8, name: &str) -> Bytes {
    frame(b'C', name.len() + 2, |b| {
        b.put_u8(kind);
        put_cstr(b, name);
    })
}

/// Sync (`S`).
pub fn sync() -> Bytes {
    Bytes::from_static(b"S\0\0\0\x04")
}

/// Flush (`H`).
pub fn flush() -> Bytes {
    Bytes::from_static(b"H\0\0\0\x04")
}

/// Terminate (`X`).
pub fn terminate() -> Bytes {
    Bytes::from_static(b"X\0\0\0\x04")
}

/// CopyData (`d`), usable in both directions.
pub fn copy_data(data: &[u8]) -> Bytes {
    frame(b'd', data.len(), |b| b.put_slice(data))
}

/// CopyDone (`c`), usable in both directions.
pub fn copy_done() -> Bytes {
    Bytes::from_static(b"c\0\0\0\x04")
}

/// CopyFail (`f`) with a reason.
pub fn copy_fail(message: &str) -> Bytes {
    frame(b'f', message.len() + 1, |b| put_cstr(b, message))
}

/// StartupMessage for protocol 3.0 with the given parameters (`user` is
/// required by servers; `database` defaults to the user name).
pub fn startup(params: &[(&str, &str)]) -> Bytes {
    startup_with_protocol(PROTOCOL_3_0, params)
}

/// StartupMessage asking for protocol version `protocol`
/// (`major << 16 | minor`).
pub fn startup_with_protocol(protocol: u32, params: &[(&str, &str)]) -> Bytes {
    let cap: usize = params.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    untagged(cap + 5, |b| {
        b.put_u32(protocol);
        for (k, v) in params {
            put_cstr(b, k);
            put_cstr(b, v);
        }
        b.put_u8(0);
    })
}

/// SSLRequest.
pub fn ssl_request() -> Bytes {
    untagged(4, |b| b.put_u32(SSL_REQUEST_CODE))
}

/// GSSENCRequest.
pub fn gssenc_request() -> Bytes {
    untagged(4, |b| b.put_u32(GSSENC_REQUEST_CODE))
}

/// CancelRequest for the backend identified by `key`.
pub fn cancel_request(key: CancelKey) -> Bytes {
    untagged(12, |b| {
        b.put_u32(CANCEL_REQUEST_CODE);
        b.put_i32(key.pid);
        b.put_i32(key.secret);
    })
}

/// PasswordMessage (`p`) carrying a cleartext password or an md5 hash; the
/// bytes are sent as a C string.
pub fn password_message(password: &[u8]) -> Bytes {
    let end = password
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(password.len());
    frame(b'p', end + 1, |b| {
        b.put_slice(&password[..end]);
        b.put_u8(0);
    })
}

/// SASLInitialResponse (`p`): the chosen mechanism and its first message.
pub fn sasl_initial_response(mechanism: &str, data: &[u8]) -> Bytes {
    frame(b'p', mechanism.len() + 5 + data.len(), |b| {
        put_cstr(b, mechanism);
        b.put_i32(data_len(data.len()));
        b.put_slice(data);
    })
}

/// SASLResponse (`p`).
pub fn sasl_response(data: &[u8]) -> Bytes {
    frame(b'p', data.len(), |b| b.put_slice(data))
}

// ----------------------------------------------------------------- backend

/// The single byte `N` refusing an SSLRequest or GSSENCRequest.
pub fn ssl_no() -> Bytes {
    Bytes::from_static(b"N")
}

/// ReadyForQuery (`Z`): one of three constant frames, so making one allocates nothing.
pub fn ready_for_query(status: TxStatus) -> Bytes {
    Bytes::from_static(match status {
        TxStatus::Idle => b"Z\0\0\0\x05I",
        TxStatus::InTransaction => b"Z\0\0\0\x05T",
        TxStatus::Failed => b"Z\0\0\0\x05E",
    })
}

/// ParameterStatus (`S`).
pub fn parameter_status(name: &str, value: &str) -> Bytes {
    frame(b'S', name.len() + value.len() + 2, |b| {
        put_cstr(b, name);
        put_cstr(b, value);
    })
}

/// BackendKeyData (`K`).
pub fn backend_key_data(key: CancelKey) -> Bytes {
    frame(b'K', 8, |b| {
        b.put_i32(key.pid);
        b.put_i32(key.secret);
    })
}

fn auth(code: u32, extra: usize, f: impl FnOnce(&mut BytesMut)) -> Bytes {
    frame(b'R', 4 + extra, |b| {
        b.put_u32(code);
        f(b);
    })
}

/// AuthenticationOk.
pub fn authentication_ok() -> Bytes {
    auth(0, 0, |_| {})
}

/// AuthenticationCleartextPassword.
pub fn auth_cleartext() -> Bytes {
    auth(3, 0, |_| {})
}

/// AuthenticationMD5Password with `salt`.
pub fn auth_md5(salt: [u8; 4]) -> Bytes {
    auth(5, 4, |b| b.put_slice(&salt))
}

/// AuthenticationSASL offering `mechanisms`.
pub fn auth_sasl(mechanisms: &[&str]) -> Bytes {
    let cap: usize = mechanisms.iter().map(|m| m.len() + 1).sum();
    auth(10, cap + 1, |b| {
        for m in mechanisms {
            put_cstr(b, m);
        }
        b.put_u8(0);
    })
}

/// AuthenticationSASLContinue with the server's SASL message.
pub fn auth_sasl_continue(data: &[u8]) -> Bytes {
    auth(11, data.len(), |b| b.put_slice(data))
}

/// AuthenticationSASLFinal with the server's last SASL message.
pub fn auth_sasl_final(data: &[u8]) -> Bytes {
    auth(12, data.len(), |b| b.put_slice(data))
}

/// CommandComplete (`C`) with a command tag such as `SELECT 1`.
pub fn command_complete(tag: &str) -> Bytes {
    frame(b'C', tag.len() + 1, |b| put_cstr(b, tag))
}

/// EmptyQueryResponse (`I`).
pub fn empty_query_response() -> Bytes {
    Bytes::from_static(b"I\0\0\0\x04")
}

/// ParseComplete (`1`).
pub fn parse_complete() -> Bytes {
    Bytes::from_static(b"1\0\0\0\x04")
}

/// BindComplete (`2`).
pub fn bind_complete() -> Bytes {
    Bytes::from_static(b"2\0\0\0\x04")
}

/// CloseComplete (`3`).
pub fn close_complete() -> Bytes {
    Bytes::from_static(b"3\0\0\0\x04")
}

/// NoData (`n`).
pub fn no_data() -> Bytes {
    Bytes::from_static(b"n\0\0\0\x04")
}

/// ParameterDescription (`t`) of a statement that takes no parameters.
pub fn no_parameters() -> Bytes {
    Bytes::from_static(b"t\0\0\0\x06\0\0")
}

/// NotificationResponse (`A`).
pub fn notification_response(pid: i32, channel: &str, payload: &str) -> Bytes {
    frame(b'A', 6 + channel.len() + payload.len(), |b| {
        b.put_i32(pid);
        put_cstr(b, channel);
        put_cstr(b, payload);
    })
}

/// NegotiateProtocolVersion (`v`): the newest minor version of protocol 3
/// supported and the `_pq_.` options that were not recognised.
///
/// # Panics
///
/// If more than `i32::MAX` options are given.
pub fn negotiate_protocol_version(minor: u32, unrecognized: &[&str]) -> Bytes {
    let cap: usize = unrecognized.iter().map(|o| o.len() + 1).sum();
    frame(b'v', 8 + cap, |b| {
        b.put_u32((3 << 16) | (minor & 0xffff));
        b.put_i32(data_len(unrecognized.len()));
        for o in unrecognized {
            put_cstr(b, o);
        }
    })
}

/// ErrorResponse (`E`); same as [`ErrorResponse::to_bytes`].
pub fn error_response(err: &ErrorResponse) -> Bytes {
    err.to_bytes()
}

/// NoticeResponse (`N`); same as [`ErrorResponse::to_notice_bytes`].
pub fn notice(err: &ErrorResponse) -> Bytes {
    err.to_notice_bytes()
}

pub(crate) fn error_fields(tag: u8, fields: &[(u8, &str)]) -> Bytes {
    let cap: usize = fields.iter().map(|(_, v)| v.len() + 2).sum();
    frame(tag, cap + 1, |b| {
        for (code, value) in fields {
            b.put_u8(*code);
            put_cstr(b, value);
        }
        b.put_u8(0);
    })
}
