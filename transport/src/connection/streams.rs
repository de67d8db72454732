// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Where a connection keeps its streams, and how it finds the few that need attention without
//! looking at the others.
//!
//! The streams live in storage the caller provides through [`StreamSlots`]: a fixed array in
//! tests, the simulator and the fuzz target, a growable set of allocations in the kernel. A
//! connection may carry thousands of streams (one per QP between two devices), most of them
//! idle at any moment, so nothing on the per-packet, per-transmit or per-event path scans them:
//!
//! - the QP index: a hash of the local QP number chained through the slots themselves (the
//!   head of bucket `b` lives in slot `b`; the bucket count follows the slot count in powers
//!   of two, so chains stay short);
//! - intrusive index lists, threaded through [`Links`] in each slot: free slots, streams that
//!   may have something to send, streams that may have an event, streams whose ACK state
//!   changed, streams that may have a deadline. A stream is put on the lists when something
//!   happens to it ("touched"); a list's consumer drops it when it finds nothing there, so
//!   every removal is paid for by an earlier event.
//!
//! Membership means "look here", never "there is something here": a stream closed while on a
//! list is skipped when it comes up.

use super::super::stream::Stream;
use super::super::zero::{zero_valid, ZeroValid};

/// Storage for a connection's streams: slot `i` holds the stream with id `i`.
///
/// Every slot must start out closed (as [`Stream::closed`] or all-zero bytes; storage that is
/// zero-allocated should be [`ZeroValid`]). Slots are
/// never moved between indices; storage may grow but only the connection's
/// [`super::Connection::release_streams`] lets it shrink.
pub trait StreamSlots {
    /// Slots available now.
    fn slot_count(&self) -> usize;
    /// Slot `i`.
    fn slot(&self, i: usize) -> Option<&Stream>;
    /// Slot `i`, mutably.
    fn slot_mut(&mut self, i: usize) -> Option<&mut Stream>;
    /// Adds at least one closed slot at the end; false if the storage cannot grow (the
    /// default: fixed storage).
    fn grow(&mut self) -> bool {
        false
    }
    /// Drops every slot (all are closed): the connection has no stream left. The default
    /// keeps fixed storage as it is.
    fn release(&mut self) {}
}

impl<const N: usize> StreamSlots for [Stream; N] {
    fn slot_count(&self) -> usize {
        N
    }
    fn slot(&self, i: usize) -> Option<&Stream> {
        self.get(i)
    }
    fn slot_mut(&mut self, i: usize) -> Option<&mut Stream> {
        self.get_mut(i)
    }
}

/// Most streams one connection can carry (stream ids are 16 bits).
pub const MAX_STREAMS: usize = 1 << 16;

/// The lists a slot can be on.
pub(crate) const FREE: usize = 0;
/// May have a request or response segment to send.
pub(crate) const WORK: usize = 1;
/// May have a completion or a stream error to report.
pub(crate) const EVENT: usize = 2;
/// Its responder's completion point changed: the next ACK reports it.
pub(crate) const ACK: usize = 3;
/// May have a completion-timeout or RNR deadline.
pub(crate) const TIMER: usize = 4;
/// Number of lists.
pub const LISTS: usize = 5;

/// Streams whose ACK entry the following ACKs repeat (an ACK that carried a stream's last
/// change may have been lost).
pub(crate) const REPEAT: usize = 16;

/// A slot's place in its connection's lists and QP index. Kept across [`Stream::reset`]:
/// it belongs to the slot, not to the stream in it. All-zero: on no list.
#[derive(Clone, Copy, Debug, Default)]
pub struct Links {
    /// Next slot (index + 1, 0 = none) on each list.
    next: [u32; LISTS],
    /// Bit `l`: on list `l`.
    member: u8,
    /// Next slot in the same QP hash chain (index + 1).
    qp_next: u32,
    /// Head of QP hash chain number <this slot's index> (index + 1).
    bucket: u32,
}
zero_valid!(struct Links { next, member, qp_next, bucket });

#[derive(Clone, Copy, Debug, Default)]
struct List {
    /// Index + 1 of the first and last slot; 0 when empty.
    head: u32,
    tail: u32,
    len: u32,
}
zero_valid!(struct List { head, tail, len });

/// The connection's side of the lists and the index. All-zero: no slots known yet.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sched {
    lists: [List; LISTS],
    /// Slots taken into the free list and the index (storage may have grown beyond).
    known: usize,
    /// log2 of the QP hash bucket count (buckets exist once `known` > 0).
    bucket_bits: u32,
    /// A lower bound of the earliest deadline of the streams on the TIMER list (valid while
    /// the list is not empty).
    timer_hint: u64,
    /// The shortest completion timeout of the streams parked off the TIMER list (waiting
    /// for their turn while the connection delivers); 0: none is.
    parked_stall: u64,
    /// Recently reported streams (index + 1) and the round-robin position over them.
    repeat: [u32; REPEAT],
    repeat_next: usize,
    repeat_rr: usize,
}
zero_valid!(struct Sched {
    lists, known, bucket_bits, timer_hint, parked_stall, repeat, repeat_next, repeat_rr,
});

fn tag(i: usize) -> u32 {
    (i as u32).wrapping_add(1)
}

fn untag(t: u32) -> Option<usize> {
    (t as usize).checked_sub(1)
}

impl Sched {
    pub(crate) fn len(&self, list: usize) -> usize {
        self.lists.get(list).map_or(0, |l| l.len as usize)
    }

    pub(crate) fn front(&self, list: usize) -> Option<usize> {
        untag(self.lists.get(list)?.head)
    }

    /// Appends slot `i` to `list` unless it is already on it.
    pub(crate) fn push(&mut self, s: &mut (impl StreamSlots + ?Sized), list: usize, i: usize) {
        let bit = 1u8 << list;
        let Some(l) = self.lists.get_mut(list) else {
            return;
        };
        let Some(st) = s.slot_mut(i) else { return };
        if st.links.member & bit != 0 {
            return;
        }
        st.links.member |= bit;
        if let Some(n) = st.links.next.get_mut(list) {
            *n = 0;
        }
        match untag(l.tail).and_then(|t| s.slot_mut(t)) {
            Some(t) => {
                if let Some(n) = t.links.next.get_mut(list) {
                    *n = tag(i);
                }
            }
            None => l.head = tag(i),
        }
        l.tail = tag(i);
        l.len += 1;
    }

    /// Takes the first slot off `list`.
    pub(crate) fn pop(
        &mut self,
        s: &mut (impl StreamSlots + ?Sized),
        list: usize,
    ) -> Option<usize> {
        let l = self.lists.get_mut(list)?;
        let i = untag(l.head)?;
        let next = match s.slot_mut(i) {
            Some(st) => {
                st.links.member &= !(1u8 << list);
                st.links.next.get(list).copied().unwrap_or(0)
            }
            None => 0,
        };
        l.head = next;
        if next == 0 {
            *l = List::default();
        } else {
            l.len = l.len.saturating_sub(1);
        }
        Some(i)
    }

    /// Moves the first slot of `list` to its end (round-robin).
    pub(crate) fn rotate(&mut self, s: &mut (impl StreamSlots + ?Sized), list: usize) {
        if let Some(i) = self.pop(s, list) {
            self.push(s, list, i);
        }
    }

    /// Something happened to stream `i`: it may have work, events and a deadline.
    pub(crate) fn touch(&mut self, s: &mut (impl StreamSlots + ?Sized), i: usize, stall: u64) {
        self.push(s, WORK, i);
        self.push(s, EVENT, i);
        self.note_deadline(s, i, stall);
    }

    /// Puts stream `i` on the TIMER list if it has a deadline, keeping `timer_hint` a lower
    /// bound of the list's deadlines.
    pub(crate) fn note_deadline(
        &mut self,
        s: &mut (impl StreamSlots + ?Sized),
        i: usize,
        stall: u64,
    ) {
        let Some(st) = s.slot_mut(i) else { return };
        st.parked = false;
        if !st.open || st.error().is_some() {
            return;
        }
        let Some(d) = st.req.deadline(st.ack_timeout(stall)) else {
            return;
        };
        if self.len(TIMER) == 0 {
            self.timer_hint = d;
        } else {
            self.timer_hint = self.timer_hint.min(d);
        }
        self.push(s, TIMER, i);
    }

    /// The earliest stream deadline (a lower bound: firing early is harmless).
    pub(crate) fn timer_hint(&self) -> Option<u64> {
        (self.len(TIMER) != 0).then_some(self.timer_hint)
    }

    pub(crate) fn set_timer_hint(&mut self, hint: Option<u64>) {
        self.timer_hint = hint.unwrap_or(u64::MAX);
    }

    /// Stream `i` (taken off the TIMER list by the caller) waits for its turn: parked until
    /// something happens to it ([`Sched::note_deadline`]) or the connection stops
    /// delivering ([`Sched::unpark_all`]). `stall`: its completion timeout.
    pub(crate) fn park(&mut self, s: &mut (impl StreamSlots + ?Sized), i: usize, stall: u64) {
        if let Some(st) = s.slot_mut(i) {
            st.parked = true;
            let stall = stall.max(1);
            self.parked_stall = match self.parked_stall {
                0 => stall,
                p => p.min(stall),
            };
        }
    }

    /// The shortest completion timeout among parked streams, if any is parked.
    pub(crate) fn parked_stall(&self) -> Option<u64> {
        (self.parked_stall != 0).then_some(self.parked_stall)
    }

    /// Puts every parked stream back on the TIMER list (one pass over the slots: only when
    /// the connection stopped delivering).
    pub(crate) fn unpark_all(&mut self, s: &mut (impl StreamSlots + ?Sized), stall: u64) {
        for i in 0..s.slot_count() {
            if s.slot(i).is_some_and(|st| st.parked) {
                self.note_deadline(s, i, stall);
            }
        }
        self.parked_stall = 0;
    }

    /// Remembers that stream `i`'s ACK entry was sent, for the repeats.
    pub(crate) fn note_reported(&mut self, i: usize) {
        let t = tag(i);
        if self.repeat.contains(&t) {
            return;
        }
        if let Some(r) = self.repeat.get_mut(self.repeat_next) {
            *r = t;
        }
        self.repeat_next = (self.repeat_next + 1) % REPEAT;
    }

    /// The next recently reported stream to repeat, round-robin; at most `REPEAT` calls
    /// per ACK make sense.
    pub(crate) fn next_repeat(&mut self) -> Option<usize> {
        for _ in 0..REPEAT {
            let t = self.repeat.get(self.repeat_rr).copied().unwrap_or(0);
            self.repeat_rr = (self.repeat_rr + 1) % REPEAT;
            if let Some(i) = untag(t) {
                return Some(i);
            }
        }
        None
    }

    // ------------------------------------------------------------ slots and the QP index

    /// Takes slots the storage gained into the free list, and rehashes when the bucket
    /// count changes (at each doubling: amortised O(1) per slot).
    pub(crate) fn adopt(&mut self, s: &mut (impl StreamSlots + ?Sized)) {
        let count = s.slot_count().min(MAX_STREAMS);
        if count <= self.known {
            return;
        }
        for i in self.known..count {
            if let Some(st) = s.slot_mut(i) {
                st.links = Links::default();
            }
            self.push(s, FREE, i);
        }
        self.known = count;
        let bits = usize::BITS - 1 - count.leading_zeros();
        if bits != self.bucket_bits {
            self.bucket_bits = bits;
            for i in 0..count {
                if let Some(st) = s.slot_mut(i) {
                    st.links.bucket = 0;
                }
            }
            for i in 0..count {
                if s.slot(i).is_some_and(|st| st.open) {
                    self.index_insert(s, i);
                }
            }
        }
    }

    /// Slots known (adopted).
    pub(crate) fn known(&self) -> usize {
        self.known
    }

    fn bucket(&self, qp: u32) -> Option<usize> {
        if self.known == 0 {
            return None;
        }
        // Fibonacci hashing; QP numbers may carry a generation in their low bits.
        let h = qp.wrapping_mul(0x9E37_79B1);
        let b = if self.bucket_bits == 0 {
            0
        } else {
            (h >> (32 - self.bucket_bits)) as usize
        };
        Some(b)
    }

    /// The open stream whose local QP is `qp`.
    pub(crate) fn lookup(&self, s: &(impl StreamSlots + ?Sized), qp: u32) -> Option<usize> {
        let b = self.bucket(qp)?;
        let mut t = s.slot(b)?.links.bucket;
        // Bounded even if the chain were corrupt.
        for _ in 0..self.known {
            let i = untag(t)?;
            let st = s.slot(i)?;
            if st.open && st.cfg.local_qp == qp {
                return Some(i);
            }
            t = st.links.qp_next;
        }
        None
    }

    /// Adds open stream `i` to the index.
    pub(crate) fn index_insert(&mut self, s: &mut (impl StreamSlots + ?Sized), i: usize) {
        let Some(qp) = s.slot(i).map(|st| st.cfg.local_qp) else {
            return;
        };
        let Some(b) = self.bucket(qp) else { return };
        let Some(head) = s.slot(b).map(|st| st.links.bucket) else {
            return;
        };
        if let Some(st) = s.slot_mut(i) {
            st.links.qp_next = head;
        }
        if let Some(bs) = s.slot_mut(b) {
            bs.links.bucket = tag(i);
        }
    }

    /// Removes stream `i` (still open, with its QP number) from the index.
    pub(crate) fn index_remove(&mut self, s: &mut (impl StreamSlots + ?Sized), i: usize) {
        let Some((qp, after)) = s.slot(i).map(|st| (st.cfg.local_qp, st.links.qp_next)) else {
            return;
        };
        let Some(b) = self.bucket(qp) else { return };
        let Some(mut t) = s.slot(b).map(|st| st.links.bucket) else {
            return;
        };
        if t == tag(i) {
            if let Some(bs) = s.slot_mut(b) {
                bs.links.bucket = after;
            }
            return;
        }
        for _ in 0..self.known {
            let Some(j) = untag(t) else { return };
            let Some(st) = s.slot_mut(j) else { return };
            if st.links.qp_next == tag(i) {
                st.links.qp_next = after;
                return;
            }
            t = st.links.qp_next;
        }
    }
}
