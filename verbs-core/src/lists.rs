// SPDX-License-Identifier: GPL-2.0

//! SGE lists longer than the transport core carries (`memory::MAX_SGE`), kept by the driver
//! per QP while the transport holds their WQEs.
//!
//! The transport core keeps each WQE's SGEs inline in its fixed queues, a few per WQE, so that
//! a stream stays small. A WQE with a longer list (up to [`super::wqe::MAX_LIST`]) goes to the
//! transport as one SGE under [`super::wqe::LIST_LKEY`] whose address names the QP and a slot
//! here ([`ListRef`]) and whose length is the list's total; the driver's memory access resolves
//! it piece by piece through the slot's list.
//!
//! Slots are taken in posting order and never freed explicitly: the transport holds at most
//! `depth` WQEs of a queue (its send or receive queue depth) and completes them in order, so
//! the WQEs it holds are always the newest posted. With `depth + 1` slots, the slot the next
//! WQE takes belonged to one posted `depth + 1` WQEs before, which the transport no longer
//! holds, even while it refuses the new one (a post that fails is staged again, in the same
//! slot, when it is retried).

use super::abi::Sge;

/// Which of a QP's queues a list belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// The send queue (the local side of SENDs, WRITEs, READs and atomics).
    Send,
    /// The receive queue (its own RQ, or the receives it took from its SRQ).
    Recv,
}

/// What an SGE under `LIST_LKEY` names: its address, the QP (high 32 bits), the queue (bit
/// 31) and the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListRef {
    /// The QP whose list it is.
    pub qpn: u32,
    /// Its queue.
    pub queue: Queue,
    /// The slot in that queue's lists.
    pub slot: u32,
}

const RECV_BIT: u32 = 1 << 31;

impl ListRef {
    /// The SGE address that names it.
    pub fn addr(self) -> u64 {
        let q = match self.queue {
            Queue::Send => 0,
            Queue::Recv => RECV_BIT,
        };
        (u64::from(self.qpn) << 32) | u64::from(q | (self.slot & !RECV_BIT))
    }

    /// The list an SGE address names.
    pub fn from_addr(addr: u64) -> ListRef {
        let low = addr as u32;
        ListRef {
            qpn: (addr >> 32) as u32,
            queue: if low & RECV_BIT != 0 {
                Queue::Recv
            } else {
                Queue::Send
            },
            slot: low & !RECV_BIT,
        }
    }
}

/// The slots of one queue's lists, over storage the caller owns: `slots` lists of `per_list`
/// SGEs each, in one flat slice of [`ListSlots::storage_len`] entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListSlots {
    per_list: usize,
    slots: u32,
    /// The slot the next list takes.
    next: u32,
}

impl ListSlots {
    /// Slots for a queue the transport holds at most `depth` WQEs of, lists of at most
    /// `per_list` SGEs.
    pub fn new(depth: u32, per_list: usize) -> Self {
        ListSlots {
            per_list,
            slots: depth.saturating_add(1),
            next: 0,
        }
    }

    /// SGEs the storage holds.
    pub fn storage_len(&self) -> usize {
        self.per_list.saturating_mul(self.slots as usize)
    }

    /// Forgets every list (the transport holds none of the queue's WQEs any more: its stream
    /// was opened again).
    pub fn clear(&mut self) {
        self.next = 0;
    }

    /// Writes `list` into the next slot of `storage`, the rest of the slot with zero-length
    /// entries (which no access reaches), and returns the slot; None if `list` is longer than
    /// a slot or `storage` is not [`ListSlots::storage_len`] long. Nothing is taken until
    /// [`ListSlots::commit`].
    pub fn stage(&self, storage: &mut [Sge], list: &[Sge]) -> Option<u32> {
        if list.len() > self.per_list || storage.len() != self.storage_len() {
            return None;
        }
        let slot = self.next;
        let at = (slot as usize).checked_mul(self.per_list)?;
        let dst = storage.get_mut(at..at.checked_add(self.per_list)?)?;
        for (i, d) in dst.iter_mut().enumerate() {
            *d = list.get(i).copied().unwrap_or_default();
        }
        Some(slot)
    }

    /// The transport took the WQE whose list was staged last.
    pub fn commit(&mut self) {
        // No division (and so no divide-by-zero path) on the data path.
        self.next = match self.next.checked_add(1) {
            Some(n) if n < self.slots => n,
            _ => 0,
        };
    }

    /// The list in `slot` of `storage` (zero-length entries at its end); None for a slot
    /// beyond the storage.
    pub fn list<'a>(&self, storage: &'a [Sge], slot: u32) -> Option<&'a [Sge]> {
        if slot >= self.slots {
            return None;
        }
        let at = (slot as usize).checked_mul(self.per_list)?;
        storage.get(at..at.checked_add(self.per_list)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    fn sge(n: u32) -> Sge {
        Sge {
            addr: u64::from(n) * 0x100,
            length: n,
            lkey: n + 0x100,
        }
    }

    #[test]
    fn list_ref_round_trips_through_an_address() {
        for r in [
            ListRef {
                qpn: 0x00ab_cdef,
                queue: Queue::Recv,
                slot: 32,
            },
            ListRef {
                qpn: u32::MAX,
                queue: Queue::Send,
                slot: 0,
            },
        ] {
            assert_eq!(ListRef::from_addr(r.addr()), r);
        }
        assert_eq!(
            ListRef {
                qpn: 7,
                queue: Queue::Send,
                slot: 16
            }
            .addr(),
            (7 << 32) | 16
        );
    }

    #[test]
    fn slots_go_round_and_a_refused_post_is_staged_again_in_its_slot() {
        let mut s = ListSlots::new(16, 12);
        let mut storage = vec![Sge::default(); s.storage_len()];
        assert_eq!(storage.len(), 17 * 12);
        let list: vec::Vec<Sge> = (1..=5).map(sge).collect();
        for round in 0..40u32 {
            let slot = s.stage(&mut storage, &list).unwrap();
            assert_eq!(slot, round % 17);
            // Staged again (the transport refused it): the same slot.
            assert_eq!(s.stage(&mut storage, &list), Some(slot));
            s.commit();
            let got = s.list(&storage, slot).unwrap();
            assert_eq!(&got[..5], &list[..]);
            assert!(got[5..].iter().all(|e| *e == Sge::default()));
        }
        s.clear();
        assert_eq!(s.stage(&mut storage, &list), Some(0));
    }

    #[test]
    fn a_slot_is_reused_only_after_depth_more_lists() {
        // The transport holds at most `depth` WQEs: with lists committed as 0, 1, ..., the
        // lists of the newest `depth` are never overwritten by the next stage.
        let depth = 4u32;
        let mut s = ListSlots::new(depth, 2);
        let mut storage = vec![Sge::default(); s.storage_len()];
        let mut held: vec::Vec<(u32, u32)> = vec::Vec::new();
        for n in 0..50u32 {
            let slot = s.stage(&mut storage, &[sge(n + 1)]).unwrap();
            // Before the transport takes it, the ones it holds must be intact.
            for &(k, at) in &held {
                assert_eq!(s.list(&storage, at).unwrap()[0], sge(k + 1), "list {k}");
            }
            s.commit();
            held.push((n, slot));
            if held.len() > depth as usize {
                held.remove(0);
            }
        }
    }

    #[test]
    fn bad_lengths_and_slots_are_refused() {
        let s = ListSlots::new(2, 3);
        let mut storage = vec![Sge::default(); s.storage_len()];
        assert_eq!(s.stage(&mut storage, &[sge(1); 4]), None);
        assert_eq!(s.stage(&mut storage[1..], &[sge(1)]), None);
        assert_eq!(s.list(&storage, 3), None);
        assert!(s.list(&storage, 2).is_some());
    }
}
