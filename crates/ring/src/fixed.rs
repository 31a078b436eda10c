//! The ring's table of registered sockets ("fixed files"): an operation on a socket in
//! the table names it by its index, so the kernel neither looks its descriptor up nor
//! takes and drops a reference to it per operation.
//!
//! A stream's socket is put in the table when the stream is made and taken out when its
//! core is dropped (no operation of it is in flight then). The table holds its own
//! reference to the socket, so the socket stays open until it is taken out: that happens
//! at once, or at the ring's next turn when the ring was busy. A socket that finds no
//! free index (the table is full, or could not be made) is named by its descriptor.

/// Which indexes are free, handed out lowest first from those never used.
#[derive(Debug, Default)]
pub(crate) struct Indexes {
    /// Entries the kernel's table has (0: no table).
    size: u32,
    /// Indexes below this have been handed out before.
    next: u32,
    /// Indexes taken out of the table, free again.
    free: Vec<u32>,
    /// Indexes whose socket is still to be taken out of the table.
    closing: Vec<u32>,
}

impl Indexes {
    pub(crate) fn new(size: u32) -> Indexes {
        Indexes {
            size,
            ..Indexes::default()
        }
    }

    /// A free index, if there is one.
    pub(crate) fn take(&mut self) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            return Some(i);
        }
        if self.next < self.size {
            self.next += 1;
            return Some(self.next - 1);
        }
        None
    }

    /// `index` is free again (its socket was taken out of the table, or never got in).
    pub(crate) fn give_back(&mut self, index: u32) {
        self.free.push(index);
    }

    /// `index`'s socket is to be taken out of the table when the ring is next free.
    pub(crate) fn defer_close(&mut self, index: u32) {
        self.closing.push(index);
    }

    /// The indexes whose socket is still to be taken out.
    pub(crate) fn take_closing(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.closing)
    }

    pub(crate) fn has_closing(&self) -> bool {
        !self.closing.is_empty()
    }

    /// Indexes whose socket is in the table (those still closing included).
    pub(crate) fn in_table(&self) -> usize {
        self.next as usize - self.free.len()
    }
}

/// How many entries the table gets: as many descriptors as the process may open, at
/// most `cap` (the kernel refuses a table larger than the open-files limit).
pub(crate) fn table_size(cap: u32) -> u32 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    u32::try_from(lim.rlim_cur).unwrap_or(u32::MAX).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_are_handed_out_once_and_reused_only_after_they_are_given_back() {
        let mut ix = Indexes::new(3);
        assert_eq!(ix.take(), Some(0));
        assert_eq!(ix.take(), Some(1));
        assert_eq!(ix.take(), Some(2));
        assert_eq!(ix.take(), None, "a full table names sockets by descriptor");
        ix.defer_close(1);
        assert_eq!(ix.take(), None, "an index still closing is not free");
        assert!(ix.has_closing());
        assert_eq!(ix.in_table(), 3, "a closing socket is still in the table");
        for i in ix.take_closing() {
            ix.give_back(i);
        }
        assert!(!ix.has_closing());
        assert_eq!(ix.in_table(), 2);
        assert_eq!(ix.take(), Some(1));
        assert_eq!(ix.take(), None);
    }

    #[test]
    fn no_table_no_indexes() {
        assert_eq!(Indexes::new(0).take(), None);
    }
}
