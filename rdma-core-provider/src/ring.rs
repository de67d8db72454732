// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The shared-memory rings of `uapi/metaroce-abi.h` (SQ, RQ, SRQ, CQ), in safe Rust.
//!
//! A ring mapping is a 128-byte header (`producer`, `consumer`, each on its own cache line)
//! followed by `num_entries` (a power of two) entries of `entry_size` bytes. The indices are
//! free-running `u32` counters: `slot = index & (num_entries - 1)`, occupancy is
//! `producer - consumer` in wrapping arithmetic, so they may wrap past `u32::MAX` freely.
//!
//! This module holds the geometry check, the index math and the producer / consumer
//! protocols, written against [`RingMemory`]: the FFI layer implements it over the mmap()ed
//! ring (atomics for the indices, volatile copies for the entries), the tests over a `Vec`.

use crate::ffi::sys;
use core::fmt;

/// Size of `struct metaroce_ring_hdr`; the entries start at this offset.
pub const HDR_SIZE: usize = sys::METAROCE_RING_HDR_SIZE as usize;
/// Byte offset of `producer` in the ring header.
pub const PRODUCER_OFFSET: usize = 0;
/// Byte offset of `consumer` in the ring header.
pub const CONSUMER_OFFSET: usize = 64;

/// Where and how big a ring is, checked from the kernel's `struct metaroce_mmap_info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// mmap() offset on the uverbs fd.
    pub offset: u64,
    /// Bytes to map (at least the header plus all entries).
    pub map_len: usize,
    /// Entries in the ring, a power of two.
    pub num_entries: u32,
    /// Bytes between consecutive entries (`entry_size`); at least the entry type's size.
    pub stride: usize,
}

/// A `struct metaroce_mmap_info` this provider cannot use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GeometryError {
    /// `num_entries` is zero or not a power of two.
    NumEntries(u32),
    /// `entry_size` is smaller than the entry structure or not a multiple of 8.
    EntrySize { entry_size: u32, needed: usize },
    /// `length` does not cover the header and all entries.
    Length { length: u64, needed: u64 },
}

impl fmt::Display for GeometryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NumEntries(n) => write!(f, "ring num_entries {n} is not a power of two"),
            Self::EntrySize { entry_size, needed } => write!(
                f,
                "ring entry_size {entry_size} (need a multiple of 8, at least {needed})"
            ),
            Self::Length { length, needed } => {
                write!(f, "ring length {length} < {needed} (header + entries)")
            }
        }
    }
}

impl Geometry {
    /// Checks a ring description whose entries are at least `entry_min` bytes.
    pub fn new(info: &sys::metaroce_mmap_info, entry_min: usize) -> Result<Self, GeometryError> {
        let n = info.num_entries;
        if n == 0 || !n.is_power_of_two() {
            return Err(GeometryError::NumEntries(n));
        }
        let es = info.entry_size;
        if (es as usize) < entry_min || !es.is_multiple_of(8) {
            return Err(GeometryError::EntrySize {
                entry_size: es,
                needed: entry_min,
            });
        }
        // n <= 2^31 and es < 2^32: the product fits in u64.
        let needed = HDR_SIZE as u64 + u64::from(n) * u64::from(es);
        let map_len = usize::try_from(info.length).ok();
        match map_len {
            Some(map_len) if info.length >= needed => Ok(Self {
                offset: info.offset,
                map_len,
                num_entries: n,
                stride: es as usize,
            }),
            _ => Err(GeometryError::Length {
                length: info.length,
                needed,
            }),
        }
    }

    /// The slot a free-running index refers to.
    pub fn slot(&self, index: u32) -> u32 {
        index & (self.num_entries - 1)
    }

    /// Byte offset, from the start of the mapping, of the entry `index` refers to. Always
    /// inside the mapping (and 8-byte aligned) for a checked geometry.
    pub fn entry_offset(&self, index: u32) -> usize {
        HDR_SIZE + self.slot(index) as usize * self.stride
    }
}

/// Entries between `consumer` and `producer` (wrapping, so correct across the u32 wrap).
pub fn occupancy(producer: u32, consumer: u32) -> u32 {
    producer.wrapping_sub(consumer)
}

/// The other side broke the ring protocol: it claims more entries than the ring holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Corrupt {
    pub producer: u32,
    pub consumer: u32,
}

/// Access to one ring's shared memory. The implementation over the mapped ring lives in the
/// FFI layer; the indices are atomics there (acquire loads, release stores) and the entries are
/// copied in and out, never referenced.
pub trait RingMemory {
    /// The entry structure (`metaroce_send_wqe`, `metaroce_recv_wqe`, `metaroce_cqe`).
    type Entry: Copy;
    /// Entries in the ring (a power of two).
    fn num_entries(&self) -> u32;
    /// `producer`, read with acquire ordering.
    fn load_producer(&self) -> u32;
    /// `consumer`, read with acquire ordering.
    fn load_consumer(&self) -> u32;
    /// Publishes `producer` with release ordering (after the entries it covers are written).
    fn store_producer(&self, value: u32);
    /// Publishes `consumer` with release ordering (after the entries it frees were read).
    fn store_consumer(&self, value: u32);
    /// Copies `entry` into the slot of `index`.
    fn write_entry(&self, index: u32, entry: &Self::Entry);
    /// Copies the entry out of the slot of `index`.
    fn read_entry(&self, index: u32) -> Self::Entry;
}

/// Our end of a ring we produce into (SQ, RQ, SRQ): only we write `producer`, so we keep our
/// own copy of it and publish it once per batch.
#[derive(Debug)]
pub struct Producer<M: RingMemory> {
    ring: M,
    /// Next index to fill; `producer` is published up to here except while a batch is open.
    head: u32,
}

impl<M: RingMemory> Producer<M> {
    /// Takes over a fresh ring, starting where its `producer` stands (the kernel initialises
    /// both indices to the same value, normally 0).
    pub fn new(ring: M) -> Result<Self, Corrupt> {
        let head = ring.load_producer();
        let consumer = ring.load_consumer();
        if occupancy(head, consumer) > ring.num_entries() {
            return Err(Corrupt {
                producer: head,
                consumer,
            });
        }
        Ok(Self { ring, head })
    }

    /// The ring memory.
    pub fn ring(&self) -> &M {
        &self.ring
    }

    /// Starts a batch of entries, published together by [`Batch::commit`].
    pub fn batch(&mut self) -> Batch<'_, M> {
        let staged = self.stage();
        Batch {
            producer: self,
            staged: Some(staged),
        }
    }

    /// Starts a batch that may span calls (the extended post API's `wr_start` ..
    /// `wr_complete`): entries [`Producer::push_staged`] writes stay invisible to the consumer
    /// until [`Producer::commit_staged`]; [`Producer::abort_staged`] forgets them. Only one
    /// batch may be open at a time (the caller's lock sees to it).
    pub fn stage(&self) -> Staged {
        Staged {
            start: self.head,
            consumer: self.ring.load_consumer(),
        }
    }

    fn has_room(&self, staged: &Staged) -> bool {
        // A consumer claiming more than the ring (or "ahead" of us, which wraps to a huge
        // occupancy) counts as full: we never overwrite what might be unconsumed.
        occupancy(self.head, staged.consumer) < self.ring.num_entries()
    }

    /// Writes `entry` into the next free slot (not yet visible to the consumer).
    pub fn push_staged(&mut self, staged: &mut Staged, entry: &M::Entry) -> Result<(), PushError> {
        if !self.has_room(staged) {
            // Re-read the consumer only when the ring looks full.
            staged.consumer = self.ring.load_consumer();
            if !self.has_room(staged) {
                return Err(PushError::Full);
            }
        }
        self.ring.write_entry(self.head, entry);
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Entries pushed into `staged` so far.
    pub fn staged_len(&self, staged: &Staged) -> u32 {
        occupancy(self.head, staged.start)
    }

    /// Publishes the entries of `staged` (one release store of `producer`, none if it is
    /// empty); returns how many.
    pub fn commit_staged(&mut self, staged: Staged) -> u32 {
        let n = self.staged_len(&staged);
        if n != 0 {
            self.ring.store_producer(self.head);
        }
        n
    }

    /// Forgets the entries of `staged`: the ring is as before [`Producer::stage`] (the slots
    /// they were written to are free, the next entries overwrite them).
    pub fn abort_staged(&mut self, staged: Staged) {
        self.head = staged.start;
    }
}

/// A batch of entries not yet published, opened by [`Producer::stage`]: where it started and
/// the last `consumer` read (re-read only when the ring looks full).
#[derive(Debug, PartialEq, Eq)]
pub struct Staged {
    start: u32,
    consumer: u32,
}

/// Why an entry could not be queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// Every slot holds an entry the consumer has not taken yet.
    Full,
}

/// Entries written but not yet published, within one call. Dropping it without
/// [`Batch::commit`] forgets them (the next batch overwrites them).
#[derive(Debug)]
pub struct Batch<'p, M: RingMemory> {
    producer: &'p mut Producer<M>,
    /// `None` once committed.
    staged: Option<Staged>,
}

impl<M: RingMemory> Batch<'_, M> {
    /// Writes `entry` into the next free slot (not yet visible to the consumer).
    pub fn push(&mut self, entry: &M::Entry) -> Result<(), PushError> {
        let staged = self.staged.as_mut().expect("a live batch");
        self.producer.push_staged(staged, entry)
    }

    /// Entries pushed in this batch.
    pub fn len(&self) -> u32 {
        self.staged
            .as_ref()
            .map_or(0, |s| self.producer.staged_len(s))
    }

    /// Whether nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Publishes the pushed entries (one release store of `producer`); returns how many.
    pub fn commit(mut self) -> u32 {
        let staged = self.staged.take().expect("a live batch");
        self.producer.commit_staged(staged)
    }
}

impl<M: RingMemory> Drop for Batch<'_, M> {
    fn drop(&mut self) {
        if let Some(staged) = self.staged.take() {
            self.producer.abort_staged(staged);
        }
    }
}

/// Our end of a ring we consume from (CQ): only we write `consumer`.
#[derive(Debug)]
pub struct Consumer<M: RingMemory> {
    ring: M,
    /// Next index to free; published up to here.
    tail: u32,
    /// Entries after `tail` handed out by [`Consumer::take`] whose slots are not freed yet.
    taken: u32,
}

impl<M: RingMemory> Consumer<M> {
    /// Takes over a fresh ring, starting where its `consumer` stands.
    pub fn new(ring: M) -> Result<Self, Corrupt> {
        let tail = ring.load_consumer();
        let producer = ring.load_producer();
        if occupancy(producer, tail) > ring.num_entries() {
            return Err(Corrupt {
                producer,
                consumer: tail,
            });
        }
        Ok(Self {
            ring,
            tail,
            taken: 0,
        })
    }

    /// The ring memory.
    pub fn ring(&self) -> &M {
        &self.ring
    }

    /// Entries published and not yet handed out; a producer claiming more than the ring
    /// holds, or fewer than we already took (it went backwards), is corrupt.
    fn available(&self) -> Result<u32, Corrupt> {
        let producer = self.ring.load_producer();
        let published = occupancy(producer, self.tail);
        if published > self.ring.num_entries() || published < self.taken {
            return Err(Corrupt {
                producer,
                consumer: self.tail,
            });
        }
        Ok(published - self.taken)
    }

    /// Takes up to `max` entries, oldest first, handing each to `sink`; then frees their slots
    /// (and those of entries [`Consumer::take`] handed out before) with one release store of
    /// `consumer`. Returns how many were taken.
    pub fn poll(&mut self, max: usize, mut sink: impl FnMut(M::Entry)) -> Result<usize, Corrupt> {
        let take = (self.available()? as usize).min(max);
        let first = self.tail.wrapping_add(self.taken);
        for i in 0..take as u32 {
            sink(self.ring.read_entry(first.wrapping_add(i)));
        }
        self.taken += take as u32;
        self.release();
        Ok(take)
    }

    /// Hands out the next entry without freeing its slot (the extended CQ's `start_poll` /
    /// `next_poll`); `Ok(None)` if there is none now. [`Consumer::release`] frees the slots.
    pub fn take(&mut self) -> Result<Option<M::Entry>, Corrupt> {
        if self.available()? == 0 {
            return Ok(None);
        }
        let entry = self.ring.read_entry(self.tail.wrapping_add(self.taken));
        self.taken += 1;
        Ok(Some(entry))
    }

    /// Removes the entries published and not yet handed out for which `doomed` holds,
    /// keeping the others in order (what a QP reset does to its completions, as libmlx5's
    /// `mlx5_cq_clean`): the kept ones move towards the newest, and `consumer` moves past the
    /// slots freed. The producer writes only beyond what it published, so the slots swept are
    /// ours. Returns how many went. Not within a session ([`Consumer::take`]'s entries out).
    pub fn discard_where(
        &mut self,
        mut doomed: impl FnMut(&M::Entry) -> bool,
    ) -> Result<u32, Corrupt> {
        let avail = self.available()?;
        let first = self.tail.wrapping_add(self.taken);
        let mut removed = 0u32;
        for i in (0..avail).rev() {
            let index = first.wrapping_add(i);
            let e = self.ring.read_entry(index);
            if doomed(&e) {
                removed += 1;
            } else if removed != 0 {
                self.ring.write_entry(index.wrapping_add(removed), &e);
            }
        }
        if removed != 0 {
            // The kept entries now start `removed` slots later; any taken ones still precede
            // them (none outside a session).
            self.tail = self.tail.wrapping_add(removed);
            self.ring.store_consumer(self.tail);
        }
        Ok(removed)
    }

    /// Frees the slots of the entries [`Consumer::take`] handed out (one release store of
    /// `consumer`, none if there are none: the extended CQ's `end_poll`); returns how many.
    pub fn release(&mut self) -> u32 {
        let n = self.taken;
        if n != 0 {
            self.tail = self.tail.wrapping_add(n);
            self.taken = 0;
            self.ring.store_consumer(self.tail);
        }
        n
    }
}

/// A ring in ordinary memory with the same semantics, for tests (also of the FFI layer).
#[cfg(test)]
pub mod testing {
    use super::RingMemory;
    use core::cell::{Cell, RefCell};

    #[derive(Debug)]
    pub struct VecRing<T: Copy> {
        pub producer: Cell<u32>,
        pub consumer: Cell<u32>,
        pub entries: RefCell<Vec<T>>,
        pub producer_stores: Cell<u32>,
        pub consumer_stores: Cell<u32>,
    }

    impl<T: Copy> VecRing<T> {
        pub fn new(num_entries: u32, fill: T, start: u32) -> Self {
            assert!(num_entries.is_power_of_two());
            Self {
                producer: Cell::new(start),
                consumer: Cell::new(start),
                entries: RefCell::new(vec![fill; num_entries as usize]),
                producer_stores: Cell::new(0),
                consumer_stores: Cell::new(0),
            }
        }
        pub fn slot(&self, index: u32) -> T {
            let e = self.entries.borrow();
            e[index as usize & (e.len() - 1)]
        }
    }

    impl<T: Copy> RingMemory for &VecRing<T> {
        type Entry = T;
        fn num_entries(&self) -> u32 {
            self.entries.borrow().len() as u32
        }
        fn load_producer(&self) -> u32 {
            self.producer.get()
        }
        fn load_consumer(&self) -> u32 {
            self.consumer.get()
        }
        fn store_producer(&self, value: u32) {
            self.producer_stores.set(self.producer_stores.get() + 1);
            self.producer.set(value)
        }
        fn store_consumer(&self, value: u32) {
            self.consumer_stores.set(self.consumer_stores.get() + 1);
            self.consumer.set(value)
        }
        fn write_entry(&self, index: u32, entry: &T) {
            let mut e = self.entries.borrow_mut();
            let mask = e.len() - 1;
            e[index as usize & mask] = *entry;
        }
        fn read_entry(&self, index: u32) -> T {
            self.slot(index)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::VecRing;
    use super::*;
    use core::mem::size_of;

    fn info(num_entries: u32, entry_size: u32, length: u64) -> sys::metaroce_mmap_info {
        sys::metaroce_mmap_info {
            offset: 4096,
            length,
            num_entries,
            entry_size,
        }
    }

    #[test]
    fn header_layout_matches_the_abi() {
        use core::mem::offset_of;
        type H = sys::metaroce_ring_hdr;
        assert_eq!(size_of::<H>(), HDR_SIZE);
        assert_eq!(HDR_SIZE, 128);
        assert_eq!(offset_of!(H, producer), PRODUCER_OFFSET);
        assert_eq!(offset_of!(H, consumer), CONSUMER_OFFSET);
        assert_eq!(size_of::<sys::metaroce_mmap_info>(), 24);
    }

    #[test]
    fn geometry_accepts_a_good_ring() {
        let g = Geometry::new(&info(64, 256, 128 + 64 * 256), 256).unwrap();
        assert_eq!(
            g,
            Geometry {
                offset: 4096,
                map_len: 128 + 64 * 256,
                num_entries: 64,
                stride: 256
            }
        );
        assert_eq!(g.entry_offset(0), 128);
        assert_eq!(g.entry_offset(63), 128 + 63 * 256);
        assert_eq!(g.entry_offset(64), 128);
        assert_eq!(g.entry_offset(u32::MAX), 128 + 63 * 256);
        // A larger stride (a future, grown entry) and a page-rounded length are fine.
        let g = Geometry::new(&info(1, 512, 8192), 256).unwrap();
        assert_eq!((g.stride, g.map_len, g.slot(7)), (512, 8192, 0));
    }

    #[test]
    fn geometry_rejects_bad_rings() {
        for n in [0, 3, 100, u32::MAX] {
            assert_eq!(
                Geometry::new(&info(n, 64, u64::MAX), 64),
                Err(GeometryError::NumEntries(n))
            );
        }
        for es in [0, 32, 63, 68] {
            assert!(matches!(
                Geometry::new(&info(8, es, 1 << 20), 64),
                Err(GeometryError::EntrySize { .. })
            ));
        }
        assert_eq!(
            Geometry::new(&info(8, 64, 128 + 8 * 64 - 1), 64),
            Err(GeometryError::Length {
                length: 128 + 8 * 64 - 1,
                needed: 128 + 8 * 64
            })
        );
        // Huge rings do not overflow the size computation.
        assert!(matches!(
            Geometry::new(&info(1 << 31, 1 << 31, u64::MAX), 64),
            Err(GeometryError::EntrySize { .. }) | Ok(_)
        ));
        assert!(matches!(
            Geometry::new(&info(1 << 31, 1 << 20, 1 << 40), 64),
            Err(GeometryError::Length { .. })
        ));
        assert!(GeometryError::NumEntries(3)
            .to_string()
            .contains("power of two"));
    }

    #[test]
    fn occupancy_wraps() {
        assert_eq!(occupancy(5, 5), 0);
        assert_eq!(occupancy(7, 5), 2);
        assert_eq!(occupancy(2, u32::MAX - 1), 4);
        assert_eq!(occupancy(0, u32::MAX), 1);
        // "Consumer ahead of producer" is a huge occupancy, i.e. corrupt.
        assert_eq!(occupancy(5, 6), u32::MAX);
    }

    #[test]
    fn producer_fills_to_full_then_reports_full() {
        let ring = VecRing::new(4, 0u64, 0);
        let mut p = Producer::new(&ring).unwrap();
        let mut b = p.batch();
        for i in 0..4 {
            b.push(&(100 + i)).unwrap();
        }
        assert_eq!(b.push(&999), Err(PushError::Full));
        assert_eq!(b.len(), 4);
        // Nothing visible before the commit.
        assert_eq!(ring.producer.get(), 0);
        assert_eq!(b.commit(), 4);
        assert_eq!(ring.producer.get(), 4);
        assert_eq!(ring.producer_stores.get(), 1);
        assert_eq!(
            (0..4).map(|i| ring.slot(i)).collect::<Vec<_>>(),
            [100, 101, 102, 103]
        );
        // Still full in the next batch, until the consumer frees slots.
        let mut b = p.batch();
        assert_eq!(b.push(&5), Err(PushError::Full));
        ring.consumer.set(1);
        b.push(&5).unwrap(); // re-reads the consumer when it looks full
        assert_eq!(b.push(&6), Err(PushError::Full));
        assert_eq!(b.commit(), 1);
        assert_eq!((ring.producer.get(), ring.slot(4)), (5, 5));
        // An empty batch publishes nothing.
        assert_eq!(p.batch().commit(), 0);
        assert_eq!(ring.producer_stores.get(), 2);
    }

    #[test]
    fn producer_wraps_the_u32_indices() {
        let start = u32::MAX - 2;
        let ring = VecRing::new(8, 0u32, start);
        let mut p = Producer::new(&ring).unwrap();
        let mut next = 0u32;
        for round in 0..5 {
            let mut b = p.batch();
            for _ in 0..6 {
                b.push(&next).unwrap();
                next += 1;
            }
            assert_eq!(b.commit(), 6, "round {round}");
            // The consumer takes everything, checking order and slot placement.
            let (prod, mut cons) = (ring.producer.get(), ring.consumer.get());
            while cons != prod {
                let v = ring.slot(cons);
                assert_eq!(v, next - occupancy(prod, cons));
                cons = cons.wrapping_add(1);
            }
            ring.consumer.set(cons);
        }
        assert_eq!(ring.producer.get(), start.wrapping_add(30));
        assert!(ring.producer.get() < start); // it did wrap
    }

    #[test]
    fn producer_treats_a_corrupt_consumer_as_full() {
        let ring = VecRing::new(4, 0u8, 10);
        let mut p = Producer::new(&ring).unwrap();
        ring.consumer.set(11); // "ahead" of the producer
        assert_eq!(p.batch().push(&1), Err(PushError::Full));
        let ring = VecRing::new(4, 0u8, 0);
        ring.producer.set(9);
        assert_eq!(
            Producer::new(&ring).unwrap_err(),
            Corrupt {
                producer: 9,
                consumer: 0
            }
        );
    }

    #[test]
    fn consumer_empty_partial_and_wrapping() {
        let start = u32::MAX - 1;
        let ring = VecRing::new(4, 0u32, start);
        let mut c = Consumer::new(&ring).unwrap();
        let mut got = Vec::new();
        assert_eq!(c.poll(8, |e| got.push(e)), Ok(0));
        assert_eq!(ring.consumer.get(), start);
        // The "kernel" produces 3 entries across the wrap.
        for i in 0..3u32 {
            ring.entries.borrow_mut()[(start.wrapping_add(i) & 3) as usize] = 10 + i;
        }
        ring.producer.set(start.wrapping_add(3));
        assert_eq!(c.poll(2, |e| got.push(e)), Ok(2));
        assert_eq!(ring.consumer.get(), start.wrapping_add(2));
        assert_eq!(c.poll(0, |e| got.push(e)), Ok(0));
        assert_eq!(c.poll(16, |e| got.push(e)), Ok(1));
        assert_eq!(got, [10, 11, 12]);
        assert_eq!(ring.consumer.get(), 1);
        // Exactly full is fine.
        ring.producer.set(5);
        assert_eq!(c.poll(16, |_| ()), Ok(4));
    }

    #[test]
    fn discard_keeps_the_others_in_order_across_the_wrap() {
        let start = u32::MAX - 2;
        let ring = VecRing::new(8, 0u32, start);
        let mut c = Consumer::new(&ring).unwrap();
        // Six published: odd ones belong to the QP being reset.
        for i in 0..6u32 {
            (&ring).write_entry(start.wrapping_add(i), &(100 + i));
        }
        ring.producer.set(start.wrapping_add(6));
        assert_eq!(c.discard_where(|e| e % 2 == 1), Ok(3));
        assert_eq!(ring.consumer.get(), start.wrapping_add(3));
        let mut got = Vec::new();
        assert_eq!(c.poll(16, |e| got.push(e)), Ok(3));
        assert_eq!(got, [100, 102, 104]);
        // Nothing to remove: no store; an empty ring: none either.
        let stores = ring.consumer_stores.get();
        (&ring).write_entry(start.wrapping_add(6), &7);
        ring.producer.set(start.wrapping_add(7));
        assert_eq!(c.discard_where(|e| *e == 8), Ok(0));
        assert_eq!(ring.consumer_stores.get(), stores);
        assert_eq!(c.discard_where(|_| true), Ok(1));
        assert_eq!(c.discard_where(|_| true), Ok(0));
        assert_eq!(c.poll(16, |_| ()), Ok(0));
    }

    #[test]
    fn consumer_rejects_a_producer_claiming_too_much() {
        let ring = VecRing::new(4, 0u32, 0);
        let mut c = Consumer::new(&ring).unwrap();
        ring.producer.set(5);
        assert_eq!(
            c.poll(16, |_| panic!("no entry may be read")),
            Err(Corrupt {
                producer: 5,
                consumer: 0
            })
        );
        assert_eq!(ring.consumer.get(), 0);
        ring.producer.set(u32::MAX); // "behind" the consumer
        assert!(c.poll(1, |_| ()).is_err());
        assert!(Consumer::new(&ring).is_err());
    }

    #[test]
    fn a_dropped_batch_publishes_nothing_and_is_overwritten() {
        let ring = VecRing::new(4, 0u32, 0);
        let mut p = Producer::new(&ring).unwrap();
        {
            let mut b = p.batch();
            b.push(&1).unwrap();
            b.push(&2).unwrap();
            assert_eq!(b.len(), 2);
        }
        assert_eq!((ring.producer.get(), ring.producer_stores.get()), (0, 0));
        let mut b = p.batch();
        b.push(&3).unwrap();
        assert_eq!(b.commit(), 1);
        assert_eq!((ring.producer.get(), ring.slot(0)), (1, 3));
    }

    #[test]
    fn staged_batches_commit_or_abort_as_a_whole() {
        let ring = VecRing::new(4, 0u32, u32::MAX - 1);
        let mut p = Producer::new(&ring).unwrap();
        // Aborted: the ring is as before, the next batch reuses the slots.
        let mut st = p.stage();
        for v in [10, 11, 12] {
            p.push_staged(&mut st, &v).unwrap();
        }
        assert_eq!(p.staged_len(&st), 3);
        assert_eq!(ring.producer.get(), u32::MAX - 1);
        p.abort_staged(st);
        assert_eq!(
            (ring.producer.get(), ring.producer_stores.get()),
            (u32::MAX - 1, 0)
        );
        // Committed across the u32 wrap: one store.
        let mut st = p.stage();
        for v in [20, 21, 22, 23] {
            p.push_staged(&mut st, &v).unwrap();
        }
        assert_eq!(p.push_staged(&mut st, &24), Err(PushError::Full));
        assert_eq!(p.commit_staged(st), 4);
        assert_eq!((ring.producer.get(), ring.producer_stores.get()), (2, 1));
        assert_eq!(
            (u32::MAX - 1..=u32::MAX)
                .chain(0..2)
                .map(|i| ring.slot(i))
                .collect::<Vec<_>>(),
            [20, 21, 22, 23]
        );
        // Full until the consumer frees a slot (re-read when it looks full); an empty
        // commit stores nothing.
        let mut st = p.stage();
        assert_eq!(p.push_staged(&mut st, &30), Err(PushError::Full));
        ring.consumer.set(u32::MAX);
        p.push_staged(&mut st, &30).unwrap();
        assert_eq!(p.commit_staged(st), 1);
        assert_eq!(p.commit_staged(p.stage()), 0);
        assert_eq!((ring.producer.get(), ring.producer_stores.get()), (3, 2));
    }

    #[test]
    fn consumer_take_and_release() {
        let start = u32::MAX;
        let ring = VecRing::new(4, 0u32, start);
        let mut c = Consumer::new(&ring).unwrap();
        assert_eq!(c.take(), Ok(None));
        assert_eq!(c.release(), 0);
        assert_eq!(ring.consumer_stores.get(), 0);
        for i in 0..3u32 {
            ring.entries.borrow_mut()[(start.wrapping_add(i) & 3) as usize] = 40 + i;
        }
        ring.producer.set(start.wrapping_add(2));
        assert_eq!(c.take(), Ok(Some(40)));
        assert_eq!(c.take(), Ok(Some(41)));
        assert_eq!(c.take(), Ok(None));
        // Nothing freed before release.
        assert_eq!(ring.consumer.get(), start);
        // An entry published meanwhile is seen by the next take.
        ring.producer.set(start.wrapping_add(3));
        assert_eq!(c.take(), Ok(Some(42)));
        assert_eq!(c.release(), 3);
        assert_eq!((ring.consumer.get(), ring.consumer_stores.get()), (2, 1));
        // A producer going back behind what was taken, or claiming too much, is corrupt.
        ring.entries.borrow_mut()[2] = 43;
        ring.producer.set(3);
        assert_eq!(c.take(), Ok(Some(43)));
        ring.producer.set(2);
        assert!(c.take().is_err());
        ring.producer.set(2 + 5);
        assert!(c.take().is_err());
        // poll() after take() frees the taken entries too, in the same store.
        ring.producer.set(4);
        ring.entries.borrow_mut()[3] = 44;
        let mut got = Vec::new();
        assert_eq!(c.poll(8, |e| got.push(e)), Ok(1));
        assert_eq!(got, [44]);
        assert_eq!((ring.consumer.get(), ring.consumer_stores.get()), (4, 2));
    }
}
