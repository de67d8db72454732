// SPDX-License-Identifier: GPL-2.0

//! A [`NodeAddr`] that one writer at a time changes and any context reads without a lock: a
//! sequence count around four atomic words. A reader that overlapped a write (the count odd,
//! or changed while it read) reads again, so it never sees half of one address and half of
//! another. Writers are serialised by their caller (a peer's lock).

use crate::net::NodeAddr;
use core::sync::atomic::{fence, AtomicU32, Ordering};

pub(crate) struct AddrCell {
    seq: AtomicU32,
    words: [AtomicU32; 4],
}

impl AddrCell {
    pub(crate) const fn new() -> Self {
        AddrCell {
            seq: AtomicU32::new(0),
            words: [const { AtomicU32::new(0) }; 4],
        }
    }

    pub(crate) fn load(&self) -> NodeAddr {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let w: [u32; 4] = core::array::from_fn(|i| {
                    self.words.get(i).map_or(0, |x| x.load(Ordering::Relaxed))
                });
                // The words' loads happen before the second look at the count.
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return NodeAddr::from_words(w);
                }
            }
            core::hint::spin_loop();
        }
    }

    /// Stores `a`, returns the address it replaces. One writer at a time (the caller's lock).
    pub(crate) fn swap(&self, a: NodeAddr) -> NodeAddr {
        let old = self.load();
        if old == a {
            return old;
        }
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        // The odd count is seen before any of the new words.
        fence(Ordering::Release);
        for (x, w) in self.words.iter().zip(a.words()) {
            x.store(w, Ordering::Relaxed);
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
        old
    }
}
