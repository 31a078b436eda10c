//! Errors and notices the proxy sends to clients.
//!
//! [`ErrorResponse`] is an owned error in PostgreSQL's format: a severity, a
//! SQLSTATE (see [`crate::sqlstate`]), a message and optional detail and
//! hint. It renders to an `E` (ErrorResponse) or `N` (NoticeResponse) frame.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;

use crate::backend::ErrorFields;
use crate::build::error_fields;
use crate::framing::FrameError;
use crate::sqlstate;

/// Severity of an error or notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    /// The statement failed; the session continues.
    Error,
    /// The session is terminated.
    Fatal,
    /// All sessions are terminated.
    Panic,
    /// A warning notice.
    Warning,
    /// A notice.
    Notice,
    /// A debugging notice.
    Debug,
    /// An informational notice.
    Info,
    /// A log notice.
    Log,
}

impl Severity {
    /// The non-localized name PostgreSQL uses (`ERROR`, `FATAL`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "ERROR",
            Severity::Fatal => "FATAL",
            Severity::Panic => "PANIC",
            Severity::Warning => "WARNING",
            Severity::Notice => "NOTICE",
            Severity::Debug => "DEBUG",
            Severity::Info => "INFO",
            Severity::Log => "LOG",
        }
    }

    /// Parses a non-localized severity name.
    pub fn parse(s: &str) -> Option<Severity> {
        Some(match s {
            "ERROR" => Severity::Error,
            "FATAL" => Severity::Fatal,
            "PANIC" => Severity::Panic,
            "WARNING" => Severity::Warning,
            "NOTICE" => Severity::Notice,
            "DEBUG" => Severity::Debug,
            "INFO" => Severity::Info,
            "LOG" => Severity::Log,
            _ => return None,
        })
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error or notice to send to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorResponse {
    /// Severity (`S` and `V` fields).
    pub severity: Severity,
    /// SQLSTATE (`C` field).
    pub code: Cow<'static, str>,
    /// Primary message (`M` field).
    pub message: String,
    /// Optional detail (`D` field).
    pub detail: Option<String>,
    /// Optional hint (`H` field).
    pub hint: Option<String>,
}

impl ErrorResponse {
    /// An error with any severity.
    pub fn new(
        severity: Severity,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        ErrorResponse {
            severity,
            code: code.into(),
            message: message.into(),
            detail: None,
            hint: None,
        }
    }

    /// An `ERROR`: the statement fails, the session continues.
    pub fn error(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, code, message)
    }

    /// A `FATAL` error: the session ends after it is sent.
    pub fn fatal(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(Severity::Fatal, code, message)
    }

    /// Adds a detail line.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Adds a hint line.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    fn frame(&self, tag: u8) -> Bytes {
        let sev = self.severity.as_str();
        let mut fields: Vec<(u8, &str)> = vec![
            (b'S', sev),
            (b'V', sev),
            (b'C', &self.code),
            (b'M', &self.message),
        ];
        if let Some(d) = &self.detail {
            fields.push((b'D', d));
        }
        if let Some(h) = &self.hint {
            fields.push((b'H', h));
        }
        error_fields(tag, &fields)
    }

    /// The ErrorResponse (`E`) frame.
    pub fn to_bytes(&self) -> Bytes {
        self.frame(b'E')
    }

    /// The same fields as a NoticeResponse (`N`) frame.
    pub fn to_notice_bytes(&self) -> Bytes {
        self.frame(b'N')
    }

    /// An owned copy of a server's error, keeping severity, code, message,
    /// detail and hint. A missing or unknown severity becomes `ERROR`, a
    /// missing code `XX000`.
    pub fn from_fields(fields: &ErrorFields<'_>) -> Self {
        ErrorResponse {
            severity: fields
                .severity_code()
                .and_then(Severity::parse)
                .unwrap_or(Severity::Error),
            code: Cow::Owned(fields.code.unwrap_or(sqlstate::INTERNAL_ERROR).to_owned()),
            message: fields.message.unwrap_or_default().to_owned(),
            detail: fields.detail.map(str::to_owned),
            hint: fields.hint.map(str::to_owned),
        }
    }
}

impl fmt::Display for ErrorResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.severity, self.message, self.code)
    }
}

impl std::error::Error for ErrorResponse {}

impl From<&FrameError> for ErrorResponse {
    /// A framing error becomes a `FATAL` protocol violation: the stream
    /// cannot be resynchronised, so the connection must close after it.
    fn from(err: &FrameError) -> Self {
        ErrorResponse::fatal(err.sqlstate(), err.to_string())
    }
}
