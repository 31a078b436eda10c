//! Splitting a byte stream into PostgreSQL protocol frames.
//!
//! After the startup phase every message on a v3 connection is a *tagged
//! frame*: one type byte, a big-endian `i32` length that counts itself and
//! the body but not the type byte, then the body. The decoders here look at
//! the header first, validate the length against [`Limits`] before touching
//! the body, and only then split the frame off the input buffer. A frame that
//! has not fully arrived yet is reported as [`Decoded::Incomplete`], never as
//! an error, and nothing is allocated or reserved from the claimed length.
//!
//! Frames keep the original bytes (`tag + length + body`) as one [`Bytes`],
//! so the proxy can forward a frame it does not need to inspect without
//! copying it.

use bytes::{Bytes, BytesMut};

pub use crate::startup::{decode_startup, CancelKey, StartupMessage, StartupPacket};

/// Size limits enforced while framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest value accepted in a tagged frame's length field (which counts
    /// itself and the body, not the type byte). Defaults to 1 GiB,
    /// PostgreSQL's own limit for a single value.
    pub max_message: usize,
    /// Largest startup-phase packet accepted (StartupMessage, SSLRequest,
    /// GSSENCRequest, CancelRequest). Defaults to 10 KiB.
    pub max_startup: usize,
}

/// Default [`Limits::max_message`]: 1 GiB.
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 30;
/// Default [`Limits::max_startup`]: 10 KiB.
pub const DEFAULT_MAX_STARTUP: usize = 10 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message: DEFAULT_MAX_MESSAGE,
            max_startup: DEFAULT_MAX_STARTUP,
        }
    }
}

/// Outcome of a decode attempt that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<T> {
    /// More bytes are needed. `needed` is how many more bytes must arrive
    /// before the frame is complete, when the header has been seen (`None`
    /// while the header itself is still incomplete). The value has been
    /// checked against [`Limits`], but callers should still not reserve large
    /// buffers up front on the word of a peer.
    Incomplete {
        /// Additional bytes required, if known.
        needed: Option<usize>,
    },
    /// One complete frame, removed from the front of the buffer.
    Frame(T),
}

/// Why a byte stream is not a valid PostgreSQL protocol stream.
///
/// Every variant is a protocol violation (SQLSTATE `08P01`, see
/// [`FrameError::sqlstate`]); after a framing error the connection cannot be
/// resynchronised and should be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length field is smaller than the smallest legal message.
    #[error("invalid message length {len}: smaller than the minimum")]
    TooShort {
        /// Length claimed by the peer.
        len: usize,
    },
    /// The length field exceeds the configured maximum.
    #[error("invalid message length {len}: larger than the maximum of {max} bytes")]
    TooLong {
        /// Length claimed by the peer.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// A startup-phase packet carried a request code this proxy does not know.
    #[error("unsupported startup request code {0}")]
    UnknownStartupCode(u32),
    /// A startup-phase packet is malformed or asks for an unsupported
    /// protocol version.
    #[error("invalid startup packet: {0}")]
    InvalidStartup(String),
    /// A tagged message's body does not match its format.
    #[error("malformed message of type {}: {reason}", tag_display(*.tag))]
    Malformed {
        /// The message type byte.
        tag: u8,
        /// What is wrong with it.
        reason: String,
    },
    /// A frontend sent a message type that does not exist.
    #[error("invalid frontend message type {}", tag_display(*.0))]
    UnknownTag(u8),
}

impl FrameError {
    /// The SQLSTATE to report to a client for this error: always
    /// `08P01` (protocol_violation), as PostgreSQL does.
    pub fn sqlstate(&self) -> &'static str {
        crate::sqlstate::PROTOCOL_VIOLATION
    }
}

fn tag_display(tag: u8) -> String {
    if tag.is_ascii_graphic() {
        format!("'{}' ({tag})", tag as char)
    } else {
        format!("{tag}")
    }
}

/// Tags a frontend may send once the startup phase is over:
/// Query, Parse, Bind, Describe, Execute, Close, Sync, Flush, FunctionCall,
/// CopyData, CopyDone, CopyFail, Terminate and the password/SASL response.
pub const FRONTEND_TAGS: &[u8] = b"QPBDECSHFdcfXp";

/// Whether `tag` is a message type a frontend may send.
pub fn is_frontend_tag(tag: u8) -> bool {
    FRONTEND_TAGS.contains(&tag)
}

/// Size of a tagged frame's header: type byte plus `i32` length.
pub const HEADER_LEN: usize = 5;

/// The tagged frame at `pos` in a buffer of frames, read in place: its tag and where it
/// ends; `None` while it has not fully arrived; `Err` with the length when that is
/// invalid (below 4 or above `max`).
pub fn frame_at(buf: &[u8], pos: usize, max: usize) -> Result<Option<(u8, usize)>, usize> {
    let Some(header) = buf.get(pos..pos + HEADER_LEN) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if !(4..=max).contains(&len) {
        return Err(len);
    }
    let end = pos + 1 + len;
    Ok((end <= buf.len()).then_some((header[0], end)))
}

/// One tagged protocol message, kept as the exact bytes that arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The message type byte.
    pub tag: u8,
    /// The whole frame: type byte, length and body.
    pub raw: Bytes,
}

impl Frame {
    /// Builds a frame from a complete raw message, checking that the length
    /// field matches the number of bytes.
    pub fn from_raw(raw: Bytes) -> Result<Frame, FrameError> {
        if raw.len() < HEADER_LEN {
            return Err(FrameError::TooShort { len: raw.len() });
        }
        let len = u32::from_be_bytes([raw[1], raw[2], raw[3], raw[4]]) as usize;
        if len < 4 {
            return Err(FrameError::TooShort { len });
        }
        if len.checked_add(1) != Some(raw.len()) {
            return Err(FrameError::Malformed {
                tag: raw[0],
                reason: format!(
                    "length field says {len} but the frame holds {} bytes",
                    raw.len() - 1
                ),
            });
        }
        Ok(Frame { tag: raw[0], raw })
    }

    /// The message body (the bytes after the 5-byte header).
    pub fn body(&self) -> &[u8] {
        self.raw.get(HEADER_LEN..).unwrap_or(&[])
    }

    /// Total size of the frame on the wire.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether the frame has no bytes at all (never true for a decoded frame).
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The frame's bytes, ready to forward.
    pub fn into_bytes(self) -> Bytes {
        self.raw
    }
}

/// Splits one tagged frame off the front of `buf`, accepting any type byte.
///
/// The length is validated as soon as the 5 header bytes are present: below 4
/// is [`FrameError::TooShort`], above `limits.max_message` is
/// [`FrameError::TooLong`]. The returned frame shares memory with the input
/// (`split_to` + `freeze`), nothing is copied.
pub fn decode_frame(buf: &mut BytesMut, limits: &Limits) -> Result<Decoded<Frame>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(Decoded::Incomplete { needed: None });
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len < 4 {
        return Err(FrameError::TooShort { len });
    }
    if len > limits.max_message {
        return Err(FrameError::TooLong {
            len,
            max: limits.max_message,
        });
    }
    let total = len.saturating_add(1);
    if buf.len() < total {
        return Ok(Decoded::Incomplete {
            needed: Some(total - buf.len()),
        });
    }
    let raw = buf.split_to(total).freeze();
    Ok(Decoded::Frame(Frame { tag: raw[0], raw }))
}

/// [`decode_frame`] for bytes sent by a client: the type byte must be one of
/// [`FRONTEND_TAGS`], checked as soon as it arrives.
pub fn decode_frontend(buf: &mut BytesMut, limits: &Limits) -> Result<Decoded<Frame>, FrameError> {
    if let Some(&tag) = buf.first() {
        if !is_frontend_tag(tag) {
            return Err(FrameError::UnknownTag(tag));
        }
    }
    decode_frame(buf, limits)
}

/// [`decode_frame`] for bytes sent by a server: every type byte is accepted,
/// unknown ones pass through as opaque frames.
pub fn decode_backend(buf: &mut BytesMut, limits: &Limits) -> Result<Decoded<Frame>, FrameError> {
    decode_frame(buf, limits)
}
