//! Test-only faults (hidden): drop the primary connection right after a COMMIT was sent.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Faults the integration tests arm. Not part of the supported interface.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct Faults {
    armed: AtomicU8,
    /// A session is held by [`Fault::DropAfterCommitAndHold`].
    holding: AtomicBool,
    release: tokio::sync::Notify,
}

/// A fault the integration tests can arm (once: the first session that reaches it
/// disarms it).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// The next COMMIT unit sent to a server: once its bytes are written (and the answer
    /// of the transaction-id probe ahead of it, if any, was read), the session closes
    /// that server connection without reading the COMMIT's reply. The server still
    /// runs the COMMIT it received: it reads it before it sees the end of the stream.
    DropAfterCommit = 1,
    /// As [`Fault::DropAfterCommit`], then the session holds (with the connection lost and
    /// the resolution pending; [`Faults::holding`] is true) until [`Faults::release`],
    /// and only then resolves the COMMIT, its deadline starting then: a test can fail the
    /// cluster over in between. Test-only.
    DropAfterCommitAndHold = 2,
}

impl Faults {
    pub fn arm(&self, fault: Fault) {
        self.armed.store(fault as u8, Ordering::SeqCst);
    }

    pub fn disarm(&self) {
        self.armed.store(0, Ordering::SeqCst);
    }

    /// A session is held by [`Fault::DropAfterCommitAndHold`].
    pub fn holding(&self) -> bool {
        self.holding.load(Ordering::SeqCst)
    }

    /// Let the held session go on (or the next one to hold, if none holds yet).
    pub fn release(&self) {
        self.release.notify_one();
    }

    pub(super) fn take(&self, fault: Fault) -> bool {
        self.armed
            .compare_exchange(fault as u8, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    pub(super) async fn hold(&self) {
        self.holding.store(true, Ordering::SeqCst);
        self.release.notified().await;
        self.holding.store(false, Ordering::SeqCst);
    }
}
