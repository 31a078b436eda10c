//! The server messages pgfresh-wire has no builder for: it never sends them, it only
//! relays them from servers.

use pgfresh_wire::bytes::{BufMut, Bytes, BytesMut};
use pgfresh_wire::ErrorResponse;

/// A type OID of the columns the fake server returns.
pub const BOOL: u32 = 16;
pub const INT8: u32 = 20;
pub const TEXT: u32 = 25;
pub const FLOAT8: u32 = 701;

/// One value of a result row.
#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Bool(bool),
    Int8(i64),
    Float8(f64),
    Text(String),
}

impl Value {
    /// The value in format `format` (0 text, 1 binary; any other code is treated as
    /// text, the server having refused it at Bind).
    fn encode(&self, format: i16) -> Option<Vec<u8>> {
        let binary = format == 1;
        Some(match self {
            Value::Null => return None,
            Value::Bool(b) if binary => vec![u8::from(*b)],
            Value::Bool(b) => {
                if *b {
                    b"t".to_vec()
                } else {
                    b"f".to_vec()
                }
            }
            Value::Int8(n) if binary => n.to_be_bytes().to_vec(),
            Value::Int8(n) => n.to_string().into_bytes(),
            Value::Float8(f) if binary => f.to_be_bytes().to_vec(),
            Value::Float8(f) => f.to_string().into_bytes(),
            Value::Text(s) => s.clone().into_bytes(),
        })
    }
}

/// A result column: name and type.
#[derive(Clone, Debug)]
pub struct Column {
    pub name: &'static str,
    pub oid: u32,
}

fn frame(tag: u8, f: impl FnOnce(&mut BytesMut)) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(tag);
    b.put_i32(0);
    f(&mut b);
    let len = (b.len() - 1) as i32;
    b[1..5].copy_from_slice(&len.to_be_bytes());
    b.freeze()
}

/// The format of column `i` under a Bind's result format codes, as PostgreSQL applies
/// them: none means text, one applies to every column, otherwise one per column.
pub fn format_of(formats: &[i16], i: usize) -> i16 {
    match formats {
        [] => 0,
        [one] => *one,
        many => many.get(i).copied().unwrap_or(0),
    }
}

/// RowDescription (`T`).
pub fn row_description(columns: &[Column], formats: &[i16]) -> Bytes {
    frame(b'T', |b| {
        b.put_i16(columns.len() as i16);
        for (i, c) in columns.iter().enumerate() {
            b.put_slice(c.name.as_bytes());
            b.put_u8(0);
            b.put_u32(0); // table OID
            b.put_i16(0); // column number
            b.put_u32(c.oid);
            b.put_i16(if c.oid == TEXT { -1 } else { 8 });
            b.put_i32(-1); // type modifier
            b.put_i16(format_of(formats, i));
        }
    })
}

/// DataRow (`D`).
pub fn data_row(values: &[Value], formats: &[i16]) -> Bytes {
    frame(b'D', |b| {
        b.put_i16(values.len() as i16);
        for (i, v) in values.iter().enumerate() {
            match v.encode(format_of(formats, i)) {
                None => b.put_i32(-1),
                Some(bytes) => {
                    b.put_i32(bytes.len() as i32);
                    b.put_slice(&bytes);
                }
            }
        }
    })
}

/// ParameterDescription (`t`) of `n` parameters of type text.
pub fn parameter_description(n: usize) -> Bytes {
    frame(b't', |b| {
        b.put_i16(n as i16);
        for _ in 0..n {
            b.put_u32(TEXT);
        }
    })
}

/// CopyInResponse (`G`) or CopyOutResponse (`H`): text format, one column.
pub fn copy_response(tag: u8) -> Bytes {
    frame(tag, |b| {
        b.put_u8(0);
        b.put_i16(1);
        b.put_i16(0);
    })
}

/// ErrorResponse with severity ERROR.
pub fn error(code: &'static str, message: impl Into<String>) -> Bytes {
    ErrorResponse::error(code, message).to_bytes()
}

/// ErrorResponse with severity FATAL (the server closes the connection after it).
pub fn fatal(code: &'static str, message: impl Into<String>) -> Bytes {
    ErrorResponse::fatal(code, message).to_bytes()
}

/// NoticeResponse with severity WARNING.
pub fn warning(code: &'static str, message: impl Into<String>) -> Bytes {
    ErrorResponse::new(pgfresh_wire::Severity::Warning, code, message).to_notice_bytes()
}
