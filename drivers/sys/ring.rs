// SPDX-License-Identifier: GPL-2.0

//! Rings shared with userspace (SQ, RQ, SRQ, CQ; layout in `uapi/metaroce-abi.h`), and the
//! same rings in kernel memory only, for a kernel consumer's QP (its SQ and RQ: the kernel's
//! `post_send`/`post_recv` produce into them, and the data path takes them as a user QP's).
//!
//! The memory comes from `vmalloc_user` and is mapped by the provider through an
//! `rdma_user_mmap_entry`. The entry owns the memory: dropping the [`UserRing`] removes the
//! entry, and the RDMA core calls `mmap_free` (which frees both) once the last user mapping
//! is gone, so neither side ever sees freed memory.
//!
//! Userspace can write anything into the ring at any time. The index the kernel owns (the
//! consumer's of an SQ, RQ or SRQ, the producer's of a CQ) lives in kernel memory and is only
//! published to the shared header, never read back; the index userspace owns is read once per
//! use and bounded against the ring size, and each entry is copied out whole before it is
//! looked at.

use super::{bindings, udata::Ucontext};
use crate::verbs_core::queue;
use core::{
    mem::size_of,
    ptr::{self, NonNull},
    sync::atomic::{AtomicU32, Ordering},
};
use kernel::prelude::*;

const HDR: usize = bindings::METAROCE_RING_HDR_SIZE as usize;
use kernel::page::PAGE_SIZE;
const PRODUCER: usize = 0;
const CONSUMER: usize = 64;

/// An entry of a ring shared with userspace.
///
/// # Safety
///
/// Every bit pattern must be a valid value (userspace writes the entries of the rings it
/// produces), and the type must have no padding (the kernel's entries are copied out whole).
pub(crate) unsafe trait RingEntry: Copy {}

// SAFETY: plain `#[repr(C)]` structs of integers and byte arrays with explicit padding fields,
// laid out as `uapi/metaroce-abi.h` says (`super::abi` checks each field's offset).
unsafe impl RingEntry for crate::verbs_core::abi::SendWqe {}
// SAFETY: as above.
unsafe impl RingEntry for crate::verbs_core::abi::RecvWqe {}
// SAFETY: as above.
unsafe impl RingEntry for crate::verbs_core::abi::Cqe {}

/// The mmap entry; `rdma` first so the core's pointer is ours.
#[repr(C)]
struct MmapEntry {
    rdma: bindings::rdma_user_mmap_entry,
    memory: *mut u8,
}

/// A ring of `T` entries shared with userspace (or, made by [`UserRing::new_kernel`], only
/// the kernel's).
pub(crate) struct UserRing<T> {
    memory: NonNull<u8>,
    /// None for a kernel ring (never mapped).
    entry: Option<NonNull<MmapEntry>>,
    num_entries: u32,
    /// Bytes from one entry to the next: `size_of::<T>()`, or less for a ring whose entries
    /// hold fewer SGEs than `T` has room for (a copied-out entry has zeroes past the stride).
    stride: usize,
    length: usize,
    /// The kernel's index (a ring is used from one side only: consumer or producer); the
    /// header's copy is written from it, never read.
    own: AtomicU32,
    _entries: core::marker::PhantomData<T>,
}

// SAFETY: the ring memory lives until `mmap_free`, after we are gone; all access goes through
// atomics and whole-entry volatile copies.
unsafe impl<T> Send for UserRing<T> {}
// SAFETY: as above; callers serialise producer-side and consumer-side use with their locks.
unsafe impl<T> Sync for UserRing<T> {}

/// What the provider needs to map a ring.
#[derive(Clone, Copy)]
pub(crate) struct RingInfo {
    pub(crate) offset: u64,
    pub(crate) length: u64,
    pub(crate) num_entries: u32,
    pub(crate) entry_size: u32,
}

impl From<RingInfo> for bindings::metaroce_mmap_info {
    fn from(r: RingInfo) -> Self {
        bindings::metaroce_mmap_info {
            offset: r.offset,
            length: r.length,
            num_entries: r.num_entries,
            entry_size: r.entry_size,
        }
    }
}

impl<T: RingEntry> UserRing<T> {
    /// A ring of at least `min_entries` entries (rounded up to a power of two), mappable in
    /// `uctx`.
    pub(crate) fn new(uctx: &Ucontext<'_>, min_entries: u32) -> Result<Self> {
        Self::with_stride(uctx, min_entries, size_of::<T>())
    }

    /// As [`UserRing::new`], with entries of `stride` bytes: a multiple of 8, at most
    /// `size_of::<T>()` (`EINVAL` otherwise). Each entry is `T`'s first `stride` bytes.
    pub(crate) fn with_stride(
        uctx: &Ucontext<'_>,
        min_entries: u32,
        stride: usize,
    ) -> Result<Self> {
        if stride == 0 || stride % 8 != 0 || stride > size_of::<T>() {
            return Err(EINVAL);
        }
        let (num_entries, length) = Self::size(min_entries, stride)?;
        // SAFETY: plain allocation; zeroed, so both indices start at 0.
        let memory = NonNull::new(unsafe { bindings::vmalloc_user_noprof(length) }.cast::<u8>())
            .ok_or(ENOMEM)?;
        let entry = KBox::new(
            MmapEntry {
                rdma: bindings::rdma_user_mmap_entry::default(),
                memory: memory.as_ptr(),
            },
            GFP_KERNEL,
        );
        let entry = match entry {
            Ok(e) => NonNull::from(KBox::leak(e)),
            Err(e) => {
                // SAFETY: allocated above, never shared.
                unsafe { bindings::vfree(memory.as_ptr().cast()) };
                return Err(e.into());
            }
        };
        // SAFETY: `uctx` is live for the call (its type's invariant); on success the core owns a
        // reference to the entry until it calls `mmap_free`.
        let err = unsafe {
            bindings::rdma_user_mmap_entry_insert(
                uctx.as_ptr(),
                ptr::addr_of_mut!((*entry.as_ptr()).rdma),
                length,
            )
        };
        if err != 0 {
            // SAFETY: the insert failed, so the entry and memory are still only ours.
            unsafe {
                bindings::vfree(memory.as_ptr().cast());
                drop(KBox::from_raw(entry.as_ptr()));
            }
            return Err(Error::from_errno(err));
        }
        Ok(UserRing {
            memory,
            entry: Some(entry),
            num_entries,
            stride,
            length,
            own: AtomicU32::new(0),
            _entries: core::marker::PhantomData,
        })
    }

    /// A ring of at least `min_entries` entries in kernel memory only: a kernel consumer's
    /// send or receive queue, which [`UserRing::produce`] fills.
    pub(crate) fn new_kernel(min_entries: u32) -> Result<Self> {
        let stride = size_of::<T>();
        let (num_entries, length) = Self::size(min_entries, stride)?;
        // SAFETY: plain allocation; zeroed, so both indices start at 0.
        let memory = NonNull::new(unsafe { bindings::vmalloc_user_noprof(length) }.cast::<u8>())
            .ok_or(ENOMEM)?;
        Ok(UserRing {
            memory,
            entry: None,
            num_entries,
            stride,
            length,
            own: AtomicU32::new(0),
            _entries: core::marker::PhantomData,
        })
    }

    /// Entries (a power of two) and bytes of a ring of at least `min_entries` of `stride`
    /// bytes.
    fn size(min_entries: u32, stride: usize) -> Result<(u32, usize)> {
        let num_entries = min_entries
            .max(1)
            .checked_next_power_of_two()
            .ok_or(EINVAL)?;
        let bytes = (num_entries as usize)
            .checked_mul(stride)
            .and_then(|b| b.checked_add(HDR))
            .ok_or(EINVAL)?;
        Ok((num_entries, bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE))
    }

    /// Where the provider maps it (a kernel ring has no mapping: offset 0, never handed out).
    pub(crate) fn info(&self) -> RingInfo {
        let offset = match self.entry {
            // SAFETY: the entry is inserted and alive while we are.
            Some(e) => unsafe { bindings::metaroce_glue_mmap_get_offset(&(*e.as_ptr()).rdma) },
            None => 0,
        };
        RingInfo {
            offset,
            length: self.length as u64,
            num_entries: self.num_entries,
            entry_size: self.stride as u32,
        }
    }

    pub(crate) fn num_entries(&self) -> u32 {
        self.num_entries
    }

    fn index(&self, at: usize) -> &AtomicU32 {
        // SAFETY: `at` is 0 or 64, inside the header page, 4-byte aligned; an `AtomicU32` may
        // alias memory that userspace writes concurrently.
        unsafe { &*self.memory.as_ptr().add(at).cast::<AtomicU32>() }
    }

    fn slot(&self, index: u32) -> *mut u64 {
        let slot = queue::slot(index, self.num_entries);
        // SAFETY: `slot < num_entries`, and the memory holds HDR + num_entries entries of
        // `stride` bytes; HDR and `stride` are multiples of 8, the memory page-aligned.
        unsafe {
            self.memory
                .as_ptr()
                .add(HDR + slot * self.stride)
                .cast::<u64>()
        }
    }

    /// One volatile copy of the entry at `index`: its `stride` bytes, the rest of `T` zero.
    ///
    /// # Safety
    ///
    /// `index`'s slot must be one this side may read now (the ring's protocol).
    unsafe fn read_slot(&self, index: u32) -> T {
        let mut out = core::mem::MaybeUninit::<T>::zeroed();
        let src = self.slot(index);
        let dst = out.as_mut_ptr().cast::<u64>();
        for i in 0..self.stride / 8 {
            // SAFETY: `i * 8 < stride <= size_of::<T>()`: inside the slot and inside `out`,
            // both 8-byte aligned (`T` holds u64 fields). Userspace may be rewriting the slot:
            // that yields a garbage entry, which validation rejects.
            unsafe { dst.add(i).write(src.add(i).read_volatile()) };
        }
        // SAFETY: zeroed, then written with bytes: every bit pattern is a `T` (`RingEntry`).
        unsafe { out.assume_init() }
    }

    /// One volatile copy of `entry`'s first `stride` bytes into the slot of `index`.
    ///
    /// # Safety
    ///
    /// `index`'s slot must be one this side may write now (the ring's protocol).
    unsafe fn write_slot(&self, index: u32, entry: &T) {
        let src = ptr::from_ref(entry).cast::<u64>();
        let dst = self.slot(index);
        for i in 0..self.stride / 8 {
            // SAFETY: as in `read_slot`; `T` has no padding (`RingEntry`).
            unsafe { dst.add(i).write_volatile(src.add(i).read()) };
        }
    }

    /// Consumer side: how many entries userspace has posted that are not taken yet.
    /// Err(EOVERFLOW) as for `peek`.
    pub(crate) fn available(&self) -> Result<u32> {
        let consumer = self.own.load(Ordering::Relaxed);
        let producer = self.index(PRODUCER).load(Ordering::Acquire);
        queue::available(consumer, producer, self.num_entries).map_err(|_| EOVERFLOW)
    }

    /// Consumer side (SQ/RQ/SRQ): the next entry userspace has posted, copied out, or None.
    /// Err(EOVERFLOW) if userspace's producer index claims more than the ring holds.
    pub(crate) fn peek(&self) -> Result<Option<T>> {
        let consumer = self.own.load(Ordering::Relaxed);
        let producer = self.index(PRODUCER).load(Ordering::Acquire);
        let avail =
            queue::available(consumer, producer, self.num_entries).map_err(|_| EOVERFLOW)?;
        if avail == 0 {
            return Ok(None);
        }
        // SAFETY: a slot userspace posted and we have not taken.
        Ok(Some(unsafe { self.read_slot(consumer) }))
    }

    /// Consumer side: the entry returned by `peek` is done with.
    pub(crate) fn pop(&self) {
        let c = self.own.load(Ordering::Relaxed).wrapping_add(1);
        self.own.store(c, Ordering::Relaxed);
        self.index(CONSUMER).store(c, Ordering::Release);
    }

    /// Producer side (CQ resize): moves the entries userspace has not consumed yet into `to`,
    /// a new ring no one produced into, in order. Err(EINVAL) if they do not fit (nothing is
    /// moved then), or if userspace's consumer index claims more than this ring produced.
    pub(crate) fn move_pending_to(&self, to: &UserRing<T>) -> Result {
        let producer = self.own.load(Ordering::Relaxed);
        let consumer = self.index(CONSUMER).load(Ordering::Acquire);
        let pending = queue::available(consumer, producer, self.num_entries).map_err(|_| EINVAL)?;
        if pending > to.num_entries {
            return Err(EINVAL);
        }
        for i in 0..pending {
            // SAFETY: a slot this ring produced and userspace has not consumed.
            let entry = unsafe { self.read_slot(consumer.wrapping_add(i)) };
            to.push(&entry)?;
        }
        Ok(())
    }

    /// Consumer side (SRQ resize): moves the entries userspace posted that are not taken yet
    /// into `to`, a new ring no one used, in order from its slot 0, and sets `to`'s producer
    /// index after them (where userspace goes on posting). Err(EINVAL) if they do not fit
    /// or userspace's producer index claims more than this ring holds (nothing moved then).
    pub(crate) fn move_posted_to(&self, to: &UserRing<T>) -> Result {
        let consumer = self.own.load(Ordering::Relaxed);
        let producer = self.index(PRODUCER).load(Ordering::Acquire);
        let posted = queue::available(consumer, producer, self.num_entries).map_err(|_| EINVAL)?;
        if posted > to.num_entries {
            return Err(EINVAL);
        }
        for i in 0..posted {
            // SAFETY: slots of both rings (`i < posted <= to.num_entries`): one posted here and
            // not taken (userspace may be rewriting it: a garbage entry is judged when taken),
            // one of `to`, which userspace has not mapped yet.
            unsafe {
                let entry = self.read_slot(consumer.wrapping_add(i));
                to.write_slot(i, &entry);
            }
        }
        // `to`'s consumer index stays 0; userspace owns its producer index from now on.
        to.index(PRODUCER).store(posted, Ordering::Release);
        Ok(())
    }

    /// Producer side of a kernel ring's consumer-side queue (a kernel QP's SQ or RQ, which
    /// the data path consumes): appends `entry`, or Err(ENOMEM) if the queue is full. The
    /// caller serialises producers (the QP's post lock).
    pub(crate) fn produce(&self, entry: &T) -> Result {
        if self.entry.is_some() {
            // A user ring's producer is userspace.
            return Err(EINVAL);
        }
        let producer = self.index(PRODUCER).load(Ordering::Relaxed);
        let consumer = self.index(CONSUMER).load(Ordering::Acquire);
        if !queue::has_room(producer, consumer, self.num_entries) {
            return Err(ENOMEM);
        }
        // SAFETY: a slot the consumer is done with; no one else writes a kernel ring.
        unsafe { self.write_slot(producer, entry) };
        self.index(PRODUCER)
            .store(producer.wrapping_add(1), Ordering::Release);
        Ok(())
    }

    /// Producer side (CQ): appends `entry`, or Err(ENOSPC) if userspace has not made room.
    pub(crate) fn push(&self, entry: &T) -> Result {
        let producer = self.own.load(Ordering::Relaxed);
        let consumer = self.index(CONSUMER).load(Ordering::Acquire);
        if !queue::has_room(producer, consumer, self.num_entries) {
            return Err(ENOSPC);
        }
        // SAFETY: a slot that userspace has consumed.
        unsafe { self.write_slot(producer, entry) };
        let p = producer.wrapping_add(1);
        self.own.store(p, Ordering::Relaxed);
        self.index(PRODUCER).store(p, Ordering::Release);
        Ok(())
    }
}

impl<T> Drop for UserRing<T> {
    fn drop(&mut self) {
        match self.entry {
            // SAFETY: inserted in `new`; after this the core frees the entry and the memory
            // through `mmap_free` once no mapping is left.
            Some(e) => unsafe {
                bindings::rdma_user_mmap_entry_remove(ptr::addr_of_mut!((*e.as_ptr()).rdma))
            },
            // SAFETY: allocated in `new_kernel`, never mapped, ours alone.
            None => unsafe { bindings::vfree(self.memory.as_ptr().cast()) },
        }
    }
}

/// `ib_device_ops.mmap`: maps the ring whose entry `vma`'s offset names.
///
/// # Safety
///
/// Called only by the RDMA core with a live context of ours and the VMA being mapped.
pub(super) unsafe extern "C" fn mmap(
    uctx: *mut bindings::ib_ucontext,
    vma: *mut bindings::vm_area_struct,
) -> kernel::ffi::c_int {
    // SAFETY: per the contract; a found entry is referenced until `put`.
    unsafe {
        let rdma = bindings::rdma_user_mmap_entry_get(uctx, vma);
        if rdma.is_null() {
            return EINVAL.to_errno();
        }
        let entry = rdma.cast::<MmapEntry>();
        let err = bindings::remap_vmalloc_range(vma, (*entry).memory.cast(), 0);
        bindings::rdma_user_mmap_entry_put(rdma);
        err
    }
}

/// `ib_device_ops.mmap_free`: the last reference to a ring's entry is gone.
///
/// # Safety
///
/// Called only by the RDMA core, once per entry we inserted.
pub(super) unsafe extern "C" fn mmap_free(rdma: *mut bindings::rdma_user_mmap_entry) {
    // SAFETY: every entry we insert is a leaked `KBox<MmapEntry>` owning its vmalloc memory.
    unsafe {
        let entry = KBox::from_raw(rdma.cast::<MmapEntry>());
        bindings::vfree(entry.memory.cast());
    }
}
