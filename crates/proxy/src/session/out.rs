//! What is queued for the client: one buffer of bytes in the order they go, replies
//! relayed from a server and replies pgfresh makes alike, written once a turn of the
//! session loop (`Session::flush_client`).
//!
//! Bytes, not a list of buffers: the replies of a usual statement are a few hundred
//! bytes, and copying them into one buffer the session keeps costs less than sharing
//! the server connection's buffer with a queue of pieces (an atomic count raised and
//! lowered for every piece, an allocation when it starts to be shared), and lets
//! several replies go out in one write with nothing to gather. A large result passes
//! through in pieces no larger than a read from the server.
//!
//! While a commit's relations wait for its position, what is queued from the commit's
//! replies on is held back ([`ClientOut::hold`]) until the position is known
//! ([`ClientOut::release`]).

use bytes::{Buf, Bytes, BytesMut};

/// Kept across flushes up to this capacity (a usual statement's replies fit many times
/// over); a larger buffer (a large result went through) is let go once it has been
/// written, so an idle session holds at most this much here (10 000 idle clients: 40 MiB
/// at the very most, as much as the ring's receive buffers they keep posted).
const KEEP_CAPACITY: usize = 4 * 1024;

/// The bytes queued for the client (see the module comment).
#[derive(Default)]
pub(super) struct ClientOut {
    buf: BytesMut,
    /// While a commit's relations wait for its position ([`super::unit::DeferredMarks`]):
    /// the bytes from this offset on are held back, in order, until it arrives.
    hold_from: Option<usize>,
}

impl ClientOut {
    pub(super) fn push(&mut self, bytes: impl AsRef<[u8]>) {
        self.buf.extend_from_slice(bytes.as_ref());
    }

    pub(super) fn extend<B: AsRef<[u8]>>(&mut self, items: impl IntoIterator<Item = B>) {
        for b in items {
            self.push(b);
        }
    }

    /// Everything in `queue`, in order, leaving it empty.
    pub(super) fn append(&mut self, queue: &mut Vec<Bytes>) {
        self.extend(queue.drain(..));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Takes back the ReadyForQuery pushed last (a local answer whose ReadyForQuery
    /// belongs to a later part of the client's Query).
    pub(super) fn pop_ready_for_query(&mut self) {
        let at = self.buf.len().saturating_sub(READY_FOR_QUERY_LEN);
        debug_assert_eq!(
            self.buf.get(at),
            Some(&b'Z'),
            "the last reply queued is not a ReadyForQuery"
        );
        if self.buf.get(at) == Some(&b'Z') {
            self.buf.truncate(at);
        }
    }

    /// From now on, what is queued is held back until [`ClientOut::release`].
    pub(super) fn hold(&mut self) {
        self.hold_from.get_or_insert(self.buf.len());
    }

    /// What was held may go.
    pub(super) fn release(&mut self) {
        self.hold_from = None;
    }

    /// Bytes held back now.
    pub(super) fn held(&self) -> usize {
        self.hold_from
            .map_or(0, |h| self.buf.len().saturating_sub(h))
    }

    /// The bytes that may be written now: all of them, or those ahead of a hold.
    pub(super) fn ready(&self) -> &[u8] {
        let end = self
            .hold_from
            .map_or(self.buf.len(), |h| h.min(self.buf.len()));
        &self.buf[..end]
    }

    /// The first `n` bytes of [`ClientOut::ready`] were written.
    pub(super) fn written(&mut self, n: usize) {
        self.buf.advance(n);
        if let Some(h) = self.hold_from.as_mut() {
            *h = h.saturating_sub(n);
        }
        if self.buf.is_empty() {
            // (Back at its start first: until then its capacity is what is left past
            // the bytes written.)
            crate::io::rewind(&mut self.buf);
            if self.buf.capacity() > KEEP_CAPACITY {
                self.buf = BytesMut::new();
            }
        }
    }
}

/// A ReadyForQuery's length: its tag, its length word and the status byte.
const READY_FOR_QUERY_LEN: usize = 6;

#[cfg(test)]
mod tests {
    use super::*;
    use pgfresh_wire::{build, TxStatus};

    #[test]
    fn bytes_go_in_order_and_a_written_buffer_starts_again() {
        let mut out = ClientOut::default();
        out.push(build::parse_complete());
        out.append(&mut vec![build::bind_complete(), build::no_data()]);
        out.extend([build::command_complete("SELECT 0")]);
        out.push(build::ready_for_query(TxStatus::Idle));
        let mut want = Vec::new();
        for b in [
            build::parse_complete(),
            build::bind_complete(),
            build::no_data(),
            build::command_complete("SELECT 0"),
            build::ready_for_query(TxStatus::Idle),
        ] {
            want.extend_from_slice(&b);
        }
        assert_eq!(out.ready(), &want[..]);
        out.written(4);
        assert_eq!(out.ready(), &want[4..]);
        out.written(out.ready().len());
        assert!(out.is_empty());
    }

    #[test]
    fn the_last_ready_for_query_is_taken_back() {
        let mut out = ClientOut::default();
        out.push(build::command_complete("BEGIN"));
        out.push(build::ready_for_query(TxStatus::InTransaction));
        out.pop_ready_for_query();
        assert_eq!(out.ready(), &build::command_complete("BEGIN")[..]);
    }

    #[test]
    fn what_is_queued_after_a_hold_waits_for_its_release_in_order() {
        let rows = build::command_complete("SELECT 1");
        let commit = build::command_complete("COMMIT");
        let ready = build::ready_for_query(TxStatus::Idle);
        let mut out = ClientOut::default();
        out.push(&rows);
        out.hold();
        out.push(&commit);
        out.hold(); // (a second hold keeps the first offset)
        assert_eq!(out.ready(), &rows[..]);
        assert_eq!(out.held(), commit.len());
        out.written(rows.len());
        assert!(out.ready().is_empty(), "the commit is still held");
        out.push(&ready);
        assert_eq!(out.held(), commit.len() + ready.len());
        out.release();
        assert_eq!(out.ready(), &[&commit[..], &ready[..]].concat()[..]);
        assert_eq!(out.held(), 0);
    }

    #[test]
    fn a_large_buffer_is_let_go_once_written() {
        let mut out = ClientOut::default();
        out.push(vec![b'D'; 4 * KEEP_CAPACITY]);
        out.written(out.ready().len());
        assert!(out.buf.capacity() <= KEEP_CAPACITY);
        out.push([1, 2, 3]);
        out.written(out.ready().len());
        assert!(out.buf.capacity() > 0, "a small one is kept");
    }
}
