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
