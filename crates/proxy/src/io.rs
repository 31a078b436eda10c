//! Reading whole protocol frames from a socket.

use bytes::BytesMut;
use pgfresh_wire::{decode_backend, decode_frontend, Decoded, Frame, FrameError, Limits};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed")]
    Closed,
    #[error("connection closed in the middle of a message")]
    Truncated,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Which side's message set a frame is checked against.
#[derive(Clone, Copy, Debug)]
pub enum Side {
    Frontend,
    Backend,
}

/// Read until one whole frame is buffered and split it off `buf`.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    limits: &Limits,
    side: Side,
) -> Result<Frame, ReadError> {
    loop {
        if let Some(frame) = try_frame(buf, limits, side)? {
            return Ok(frame);
        }
        fill(r, buf).await?;
    }
}

/// Split one complete frame off `buf`, if one is there.
pub fn try_frame(
    buf: &mut BytesMut,
    limits: &Limits,
    side: Side,
) -> Result<Option<Frame>, FrameError> {
    let decoded = match side {
        Side::Frontend => decode_frontend(buf, limits)?,
        Side::Backend => decode_backend(buf, limits)?,
    };
    Ok(match decoded {
        Decoded::Frame(f) => Some(f),
        Decoded::Incomplete { .. } => None,
    })
}

/// An empty buffer that nothing else shares starts again at the beginning of its
/// allocation (no copy, no allocation; anything else is left as it is). Without this a
/// connection's reads walk the whole allocation before it is reused, each one landing on
/// cache lines the last did not touch: with hundreds of sessions, a cache miss a line.
pub fn rewind(buf: &mut BytesMut) {
    if buf.is_empty() {
        // Asking for one byte more than the buffer has room for makes it reclaim the
        // room before its start, which it can only do when it is not shared.
        let _ = buf.try_reclaim(buf.capacity() + 1);
    }
}

/// Read more bytes into `buf`; a clean EOF on a message boundary is `Closed`.
pub async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut) -> Result<(), ReadError> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    let n = r.read_buf(buf).await?;
    if n == 0 {
        return Err(if buf.is_empty() {
            ReadError::Closed
        } else {
            ReadError::Truncated
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_unshared_buffer_starts_again_at_its_beginning() {
        let mut buf = BytesMut::with_capacity(1024);
        let start = buf.as_ptr();
        // A vector-backed buffer read from and advanced (a server connection's writes).
        buf.extend_from_slice(&[7; 100]);
        bytes::Buf::advance(&mut buf, 100);
        assert_ne!(buf.as_ptr(), start);
        rewind(&mut buf);
        assert_eq!(buf.as_ptr(), start);
        assert_eq!(buf.capacity(), 1024);

        // A shared buffer whose split-off chunk is still held (a reply not yet written to
        // the client): left as it is, nothing allocated.
        buf.extend_from_slice(&[1; 200]);
        let chunk = buf.split_to(200).freeze();
        let at = buf.as_ptr();
        rewind(&mut buf);
        assert_eq!(buf.as_ptr(), at);
        assert_eq!(&chunk[..], &[1; 200][..]);
        // Once the chunk is gone, the buffer is its own again and starts over.
        drop(chunk);
        rewind(&mut buf);
        assert_eq!(buf.as_ptr(), start);
        assert_eq!(buf.capacity(), 1024);

        // Bytes still buffered are never moved.
        buf.extend_from_slice(b"abc");
        let _ = buf.split_to(1);
        let at = buf.as_ptr();
        rewind(&mut buf);
        assert_eq!(buf.as_ptr(), at);
        assert_eq!(&buf[..], b"bc");

        // An empty buffer with no allocation stays without one.
        let mut none = BytesMut::new();
        rewind(&mut none);
        assert_eq!(none.capacity(), 0);
    }
}
