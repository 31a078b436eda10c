//! A bounds-checked reader over a message body.
//!
//! Every accessor returns [`FrameError::Malformed`] instead of panicking when
//! the body is too short, a string is not NUL-terminated or not UTF-8, or a
//! count is negative. Counts read from the wire are checked against the bytes
//! that remain before anything is allocated from them.

use crate::framing::FrameError;

pub(crate) struct Cursor<'a> {
    tag: u8,
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(tag: u8, buf: &'a [u8]) -> Self {
        Cursor { tag, buf }
    }

    pub(crate) fn malformed(&self, reason: impl Into<String>) -> FrameError {
        FrameError::Malformed {
            tag: self.tag,
            reason: reason.into(),
        }
    }

    pub(crate) fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], FrameError> {
        if n > self.buf.len() {
            return Err(self.malformed(format!(
                "{what}: needs {n} bytes but only {} remain",
                self.buf.len()
            )));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, FrameError> {
        Ok(self.bytes(1, what)?[0])
    }

    pub(crate) fn i16(&mut self, what: &str) -> Result<i16, FrameError> {
        let b = self.bytes(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn i32(&mut self, what: &str) -> Result<i32, FrameError> {
        let b = self.bytes(4, what)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, FrameError> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A non-negative 16-bit count of items of `item_size` bytes each, checked
    /// against the remaining body so a caller may allocate `count` slots.
    pub(crate) fn count(&mut self, item_size: usize, what: &str) -> Result<usize, FrameError> {
        let n = self.i16(what)?;
        let n =
            usize::try_from(n).map_err(|_| self.malformed(format!("{what}: negative ({n})")))?;
        if n.saturating_mul(item_size) > self.buf.len() {
            return Err(self.malformed(format!(
                "{what}: {n} items do not fit in the {} bytes that remain",
                self.buf.len()
            )));
        }
        Ok(n)
    }

    /// A NUL-terminated UTF-8 string; the terminator is consumed.
    pub(crate) fn cstr(&mut self, what: &str) -> Result<&'a str, FrameError> {
        // Names are mostly empty (the unnamed statement and portal): nothing to scan or
        // check. Longer strings (query texts) are scanned a word at a time.
        if let [0, rest @ ..] = self.buf {
            self.buf = rest;
            return Ok("");
        }
        let Some(pos) = memchr::memchr(0, self.buf) else {
            return Err(self.malformed(format!("{what}: missing NUL terminator")));
        };
        let raw = &self.buf[..pos];
        self.buf = &self.buf[pos + 1..];
        std::str::from_utf8(raw).map_err(|e| self.malformed(format!("{what}: invalid UTF-8 ({e})")))
    }

    /// What remains, without consuming it.
    pub(crate) fn remaining(&self) -> &'a [u8] {
        self.buf
    }

    /// Everything that remains.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    /// Fails when bytes remain after the last field.
    pub(crate) fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.malformed(format!("{} unexpected trailing bytes", self.buf.len())))
        }
    }
}
