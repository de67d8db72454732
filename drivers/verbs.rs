// SPDX-License-Identifier: GPL-2.0

//! The verbs objects: memory regions, completion queues, shared receive queues and queue
//! pairs, with their tables per device. Safe code; the rings and pinned memory they own come
//! from `crate::sys` and have safe interfaces.
//!
//! Names follow the InfiniBand spec: QP, WQE, CQE, PSN, rkey/lkey, SGE.

use crate::frwr::FastReg;
use crate::sys::{
    bhlock::{new_spinlock_bh, SpinLockBh},
    ring::{RingInfo, UserRing},
    umem::UserMemory,
    CqNotifier, KernelMemory, QpEvents, SrqEvents,
};
use core::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU8, Ordering};
use kernel::{
    new_mutex, new_spinlock_irq,
    prelude::*,
    sync::{Arc, Mutex, SpinLockIrq},
};

use crate::transport::{
    memory::{SgList, Sge, MAX_SGE},
    stream,
};
use crate::verbs_core::{
    abi::Sge as WqeSge,
    ib::{wc_opcode, wc_status, QpType},
    lists::{ListRef, ListSlots, Queue},
    qp::ModifyAttr,
    wqe::{judge_recv, Judged, RecvWork, SgList as WqeSgList, MAX_LIST},
};
pub(crate) use crate::verbs_core::{
    abi::{Cqe, RecvWqe, SendWqe},
    caps::{limits, Caps},
    ib::QpState,
    mr::MrShape,
    mw::MwState,
    qp::{QpAttrs, QpChange},
    wqe::{INLINE_LKEY, LIST_LKEY},
};

/// A memory region.
pub(crate) struct Mr {
    /// The key, both lkey and rkey (a fast registration's is its [`FastReg`]'s: it changes).
    pub(crate) key: u32,
    /// The address the application names the region by (`ibv_reg_mr_iova`'s iova; a fast
    /// registration's is its registration's).
    pub(crate) iova: u64,
    pub(crate) length: u64,
    /// `IB_ACCESS_*` flags.
    pub(crate) access: u32,
    /// The protection domain, by identity.
    pub(crate) pd: usize,
    pub(crate) mem: MrMemory,
}

/// What a region's bytes are.
pub(crate) enum MrMemory {
    /// A user MR's pinned pages: shared with the MR a rereg that keeps the translation makes
    /// of it.
    User(Arc<UserMemory>),
    /// A kernel consumer's fast registration MR (`frwr.rs`).
    Fast(Pin<KBox<FastReg>>),
}

/// Why a memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MrError {
    Bounds,
    Permission,
}

impl Mr {
    /// The MR with key `key`, shaped `shape`, over the pinned memory `mem`.
    pub(crate) fn new(key: u32, shape: &MrShape, mem: Arc<UserMemory>) -> Self {
        Mr {
            key,
            iova: shape.iova,
            length: shape.length,
            access: shape.access,
            pd: shape.pd,
            mem: MrMemory::User(mem),
        }
    }

    /// A fast registration MR of `pd` (unregistered).
    pub(crate) fn fast(key: u32, pd: usize, fast: Pin<KBox<FastReg>>) -> Self {
        Mr {
            key,
            iova: 0,
            length: 0,
            access: 0,
            pd,
            mem: MrMemory::Fast(fast),
        }
    }

    /// Whether `key` names it now.
    pub(crate) fn has_key(&self, key: u32) -> bool {
        match &self.mem {
            MrMemory::User(_) => self.key == key,
            MrMemory::Fast(f) => f.owns(key),
        }
    }

    /// What a rereg may change of it.
    pub(crate) fn shape(&self) -> MrShape {
        MrShape {
            iova: self.iova,
            length: self.length,
            access: self.access,
            pd: self.pd,
        }
    }

    /// Its pinned memory, to share with the MR a rereg makes of it (a user MR's).
    pub(crate) fn memory(&self) -> Option<Arc<UserMemory>> {
        match &self.mem {
            MrMemory::User(m) => Some(m.clone()),
            MrMemory::Fast(_) => None,
        }
    }

    /// Whether its memory was pinned writable.
    pub(crate) fn memory_writable(&self) -> bool {
        match &self.mem {
            MrMemory::User(m) => m.writable(),
            MrMemory::Fast(_) => false,
        }
    }

    /// The offset of `[va, va + len)` in a user region, if it is inside.
    fn offset(&self, va: u64, len: u64, mem: &UserMemory) -> Result<u64, MrError> {
        let off = va.checked_sub(self.iova).ok_or(MrError::Bounds)?;
        let end = off.checked_add(len).ok_or(MrError::Bounds)?;
        if end > self.length || end > mem.len() {
            return Err(MrError::Bounds);
        }
        Ok(off)
    }

    /// Checks that `[va, va + len)` is inside and `needed` is granted, touching nothing.
    pub(crate) fn check(&self, va: u64, len: u64, needed: u32) -> Result<(), MrError> {
        match &self.mem {
            MrMemory::User(m) => {
                self.allow(needed)?;
                self.offset(va, len, m).map(|_| ())
            }
            MrMemory::Fast(f) => f.check(va, len, needed),
        }
    }

    fn allow(&self, needed: u32) -> Result<(), MrError> {
        if self.access & needed == needed {
            Ok(())
        } else {
            Err(MrError::Permission)
        }
    }

    /// Writes `data` at `va` (local receive, or remote WRITE with `needed` the remote right).
    pub(crate) fn write(&self, va: u64, data: &[u8], needed: u32) -> Result<(), MrError> {
        match &self.mem {
            MrMemory::User(m) => {
                self.allow(needed)?;
                let off = self.offset(va, data.len() as u64, m)?;
                m.write(off, data).map_err(|_| MrError::Bounds)
            }
            MrMemory::Fast(f) => f.write(va, data, needed),
        }
    }

    /// Reads into `out` from `va`.
    pub(crate) fn read(&self, va: u64, out: &mut [u8], needed: u32) -> Result<(), MrError> {
        match &self.mem {
            MrMemory::User(m) => {
                self.allow(needed)?;
                let off = self.offset(va, out.len() as u64, m)?;
                m.read(off, out).map_err(|_| MrError::Bounds)
            }
            MrMemory::Fast(f) => f.read(va, out, needed),
        }
    }

    /// An atomic on the 8-byte word at `va` (with `needed` the right it takes: remote
    /// atomic, or local write through a window); returns the old value.
    pub(crate) fn atomic(
        &self,
        va: u64,
        needed: u32,
        op: impl Fn(u64) -> u64,
    ) -> Result<u64, MrError> {
        match &self.mem {
            MrMemory::User(m) => {
                self.allow(needed)?;
                let off = self.offset(va, 8, m)?;
                m.atomic(off, op).map_err(|_| MrError::Bounds)
            }
            MrMemory::Fast(f) => f.atomic(va, needed, op),
        }
    }
}

/// The bit that marks a memory window's key: MR keys stay below it (`MAX_MR` << 8), so the
/// data path tells the two apart by the key alone; a window's table number is its key without
/// it. `INLINE_LKEY` has it too, but names no window (beyond `MAX_MW`).
pub(crate) const MW_KEY_BIT: u32 = 1 << 31;
const _: () = assert!((limits::MAX_MR as u64) << 8 <= MW_KEY_BIT as u64);
const _: () = assert!((limits::MAX_MW as u64) << 8 < (INLINE_LKEY & !MW_KEY_BIT) as u64);

/// A memory window, as it is now: bound or not. Immutable: a bind or an invalidate puts a new
/// one in its table slot (under the table's lock). It holds the MR by key, not by reference:
/// an access through it finds the MR as any access does, so a window outliving its MR's
/// deregistration reaches nothing (and holds no pages).
pub(crate) struct Mw {
    pub(crate) state: MwState,
}

/// What the core's `ib_mw` carries: the window's table index.
pub(crate) struct MwObject {
    pub(crate) index: u32,
}

/// A table of objects by a 24-bit index; keys and numbers carry the index in their upper bits
/// and a key byte below, so a stale key does not find a new object. QP numbers take a counter
/// there; MR keys (rkeys go on the wire) a random byte, as rxe's do, other than the one the
/// slot's previous key had: a remote peer cannot derive one MR's rkey from another's.
///
/// A number is reserved (its slot taken) before its object is built and inserted under it, with
/// the table unlocked in between: the slot stays taken meanwhile, so concurrent creates (other
/// processes on the same device) never get the same number. Every access checks the whole
/// number, generation included.
pub(crate) struct Table<T> {
    slots: KVec<Slot<T>>,
    generation: u8,
    /// The key byte is random, not `generation`.
    random_keys: bool,
    max: u32,
    /// Slots taken (reserved or holding an object).
    live: u32,
}

enum Slot<T> {
    /// Free; the key byte its last number had (so the next one differs).
    Free(u8),
    /// Taken by `reserve` for this number; its object is not inserted yet.
    Reserved(u32),
    Live(u32, Arc<T>),
}

impl<T> Table<T> {
    /// Slots taken (reserved or holding an object).
    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    pub(crate) const fn new(max: u32) -> Self {
        Table {
            slots: KVec::new(),
            generation: 0,
            random_keys: false,
            max,
            live: 0,
        }
    }

    /// A table whose numbers end in a random byte (MR keys).
    pub(crate) const fn with_random_keys(max: u32) -> Self {
        let mut t = Self::new(max);
        t.random_keys = true;
        t
    }

    /// Reserves a slot, returning its number (index << 8 | key byte), starting at `first`.
    pub(crate) fn reserve(&mut self, first: u32) -> Result<u32> {
        loop {
            if let Some(number) = self.try_reserve(first)? {
                return Ok(number);
            }
            let room = self.room_needed(first).saturating_sub(self.slots.len());
            self.slots.reserve(room, GFP_KERNEL)?;
        }
    }

    /// [`Table::reserve`] without allocating: `Ok(None)` when the slots must grow first (to
    /// [`Table::room_needed`], see [`Table::grow`]).
    fn try_reserve(&mut self, first: u32) -> Result<Option<u32>> {
        if self.live >= self.max {
            return Err(ENOMEM);
        }
        let start = first as usize;
        let index = match self
            .slots
            .iter()
            .skip(start)
            .position(|s| matches!(s, Slot::Free(_)))
        {
            Some(i) => i + start,
            None => {
                if self.room_needed(first) > self.slots.capacity() {
                    return Ok(None);
                }
                // Within the capacity just checked: no allocation.
                while self.slots.len() < start {
                    self.slots.push(Slot::Free(0), GFP_ATOMIC)?;
                }
                self.slots.push(Slot::Free(0), GFP_ATOMIC)?;
                self.slots.len() - 1
            }
        };
        let last = match self.slots.get(index) {
            Some(Slot::Free(b)) => *b,
            _ => 0,
        };
        let byte = if self.random_keys {
            let r = crate::sys::work::random_u64() as u8;
            if r == last {
                r.wrapping_add(1)
            } else {
                r
            }
        } else {
            self.generation = self.generation.wrapping_add(1);
            self.generation
        };
        let number = ((index as u32) << 8) | u32::from(byte);
        if let Some(slot) = self.slots.get_mut(index) {
            *slot = Slot::Reserved(number);
            self.live += 1;
        }
        Ok(Some(number))
    }

    /// Slots a reservation from `first` may need.
    fn room_needed(&self, first: u32) -> usize {
        self.slots.len().max(first as usize) + 1
    }

    /// Moves the slots into `room` if it has more capacity; returns the storage that is no
    /// longer used, to be freed by the caller (outside the table's lock).
    fn grow(&mut self, mut room: KVec<Slot<T>>) -> KVec<Slot<T>> {
        if room.capacity() <= self.slots.capacity() {
            return room;
        }
        room.clear();
        for slot in self.slots.drain_all() {
            // Within `room`'s capacity, larger than the old storage's: always fits.
            let _ = room.push_within_capacity(slot);
        }
        core::mem::replace(&mut self.slots, room)
    }

    /// Puts `obj` in the slot `reserve` took for `number` (nothing if it is not that one's).
    pub(crate) fn insert(&mut self, number: u32, obj: Arc<T>) {
        if let Some(slot) = self.slots.get_mut((number >> 8) as usize) {
            if matches!(slot, Slot::Reserved(n) if *n == number) {
                *slot = Slot::Live(number, obj);
            }
        }
    }

    /// Puts `obj` in the place of `number`'s object; returns the object it replaces, or
    /// `obj` back when `number` holds none (both to be dropped after the table's lock).
    pub(crate) fn replace(&mut self, number: u32, obj: Arc<T>) -> Result<Arc<T>, Arc<T>> {
        match self.slots.get_mut((number >> 8) as usize) {
            Some(Slot::Live(n, old)) if *n == number => Ok(core::mem::replace(old, obj)),
            _ => Err(obj),
        }
    }

    /// Puts `obj` in the place of `number`'s object under the number `renumbered` (the same
    /// index, another key byte: a window's bind), returning the object it replaces; or `obj`
    /// back when `number` holds none.
    pub(crate) fn update(
        &mut self,
        number: u32,
        renumbered: u32,
        obj: Arc<T>,
    ) -> Result<Arc<T>, Arc<T>> {
        if renumbered >> 8 != number >> 8 {
            return Err(obj);
        }
        match self.slots.get_mut((number >> 8) as usize) {
            Some(Slot::Live(n, old)) if *n == number => {
                *n = renumbered;
                Ok(core::mem::replace(old, obj))
            }
            _ => Err(obj),
        }
    }

    /// The objects satisfying `f`, a reference each, into `out` (as many as fit in its
    /// capacity; a scan of every slot: slow paths only).
    pub(crate) fn collect(&self, mut f: impl FnMut(&T) -> bool, out: &mut KVec<Arc<T>>) {
        for s in self.slots.iter() {
            if let Slot::Live(_, obj) = s {
                if f(obj) && out.push_within_capacity(obj.clone()).is_err() {
                    break;
                }
            }
        }
    }

    /// Whether any object in the table satisfies `f` (a scan of every slot: slow paths only).
    pub(crate) fn any(&self, mut f: impl FnMut(&T) -> bool) -> bool {
        self.slots
            .iter()
            .any(|s| matches!(s, Slot::Live(_, obj) if f(obj)))
    }

    /// The number and object in slot `index`, if it holds one.
    pub(crate) fn at(&self, index: u32) -> Option<(u32, &Arc<T>)> {
        match self.slots.get(index as usize)? {
            Slot::Live(n, obj) => Some((*n, obj)),
            _ => None,
        }
    }

    /// Frees `number`'s slot (reserved or holding its object); returns the object.
    pub(crate) fn remove(&mut self, number: u32) -> Option<Arc<T>> {
        let slot = self.slots.get_mut((number >> 8) as usize)?;
        let ours = match slot {
            Slot::Reserved(n) | Slot::Live(n, _) => *n == number,
            Slot::Free(_) => false,
        };
        if !ours {
            return None;
        }
        self.live -= 1;
        match core::mem::replace(slot, Slot::Free(number as u8)) {
            Slot::Live(_, obj) => Some(obj),
            _ => None,
        }
    }

    /// `f` applied to `number`'s object, if it has one (under the table's lock, for the
    /// caller: nothing else can release the object meanwhile).
    pub(crate) fn with<R>(&self, number: u32, f: impl FnOnce(&Arc<T>) -> R) -> Option<R> {
        match self.slots.get((number >> 8) as usize)? {
            Slot::Live(n, obj) if *n == number => Some(f(obj)),
            _ => None,
        }
    }
}

/// Reserves a number in a table the data path reads with bottom halves off: the slots grow
/// outside the lock (with `GFP_KERNEL`), since nothing allocates under it. Process context.
pub(crate) fn reserve_in<T>(table: &SpinLockBh<Table<T>>, first: u32) -> Result<u32> {
    loop {
        let need = {
            let mut t = table.lock();
            if let Some(number) = t.try_reserve(first)? {
                return Ok(number);
            }
            t.room_needed(first)
        };
        let room = KVec::with_capacity(need.max(16).saturating_mul(2), GFP_KERNEL)?;
        let unused = table.lock().grow(room);
        drop(unused);
    }
}

/// A queue of fixed capacity in kernel memory, allocated once: pushing never allocates (so it
/// works in atomic context).
pub(crate) struct Fifo<T> {
    items: KVec<Option<T>>,
    head: usize,
    len: usize,
}

impl<T> Fifo<T> {
    pub(crate) fn new(capacity: u32) -> Result<Self> {
        let n = capacity.max(1) as usize;
        let mut items = KVec::with_capacity(n, GFP_KERNEL)?;
        for _ in 0..n {
            items.push(None, GFP_KERNEL)?;
        }
        Ok(Fifo {
            items,
            head: 0,
            len: 0,
        })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `item`; gives it back when full.
    pub(crate) fn push(&mut self, item: T) -> core::result::Result<(), T> {
        let cap = self.items.len();
        if self.len == cap {
            return Err(item);
        }
        match self.items.get_mut((self.head + self.len) % cap) {
            Some(slot) => {
                *slot = Some(item);
                self.len += 1;
                Ok(())
            }
            None => Err(item),
        }
    }

    /// The oldest entry.
    pub(crate) fn peek(&self) -> Option<&T> {
        if self.len == 0 {
            return None;
        }
        self.items.get(self.head)?.as_ref()
    }

    /// Takes the oldest entry.
    pub(crate) fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let item = self.items.get_mut(self.head)?.take();
        self.head = (self.head + 1) % self.items.len();
        self.len -= 1;
        item
    }

    /// Drops every entry.
    pub(crate) fn clear(&mut self) {
        while self.pop().is_some() {}
        self.head = 0;
    }
}

/// A completion for a kernel consumer: the CQE and what `struct ib_wc` has beyond it.
#[derive(Clone, Copy, Default)]
pub(crate) struct KernelWc {
    pub(crate) cqe: Cqe,
    /// The `ib_qp` the completion belongs to (its address: the core's `wc->qp`).
    pub(crate) ibqp: usize,
    /// `enum rdma_network_type` of a received datagram (with `IB_WC_WITH_NETWORK_HDR_TYPE`).
    pub(crate) network_hdr_type: u8,
    pub(crate) port_num: u8,
}

/// Where a CQ's entries go: the ring a user process polls, or a queue in the kernel that the
/// core's `poll_cq` empties (kernel consumers: the MAD layer's CQ of the GSI QP).
pub(crate) enum CqRing {
    User(UserRing<Cqe>),
    Kernel(Fifo<KernelWc>),
}

/// Completion notification requested with `ibv_req_notify_cq`.
const ARM_NONE: u8 = 0;
const ARM_SOLICITED: u8 = 1;
const ARM_NEXT: u8 = 2;

/// A completion queue: a ring the kernel fills and userspace polls, or (kernel consumers) a
/// queue in kernel memory.
#[pin_data]
pub(crate) struct Cq {
    /// IRQ-safe: kernel consumers may poll and post from any context.
    #[pin]
    ring: SpinLockIrq<CqRing>,
    armed: AtomicU8,
    notifier: CqNotifier,
}

impl Cq {
    pub(crate) fn new(ring: CqRing, notifier: CqNotifier) -> impl PinInit<Self> {
        pin_init!(Cq {
            ring <- new_spinlock_irq!(ring, "metaroce_cq"),
            armed: AtomicU8::new(ARM_NONE),
            notifier,
        })
    }

    /// Where the user ring is mapped (None for a kernel CQ).
    pub(crate) fn ring_info(&self) -> Option<RingInfo> {
        match &*self.ring.lock() {
            CqRing::User(r) => Some(r.info()),
            CqRing::Kernel(_) => None,
        }
    }

    /// `ibv_resize_cq` of a user CQ: the completions not polled yet move to `ring`, which
    /// the CQ fills from then on; the old ring is unmapped when the provider drops its
    /// mapping. EINVAL if they do not fit (the CQ is unchanged), EOPNOTSUPP for a kernel CQ.
    pub(crate) fn resize(&self, ring: UserRing<Cqe>) -> Result {
        let mut guard = self.ring.lock();
        let CqRing::User(old) = &*guard else {
            return Err(EOPNOTSUPP);
        };
        old.move_pending_to(&ring)?;
        let old = core::mem::replace(&mut *guard, CqRing::User(ring));
        drop(guard);
        // Its mmap entry is removed outside the IRQ-safe lock: that may free its memory.
        drop(old);
        Ok(())
    }

    /// Entries the ring holds (what `ibv_create_cq` reports as `cqe`).
    pub(crate) fn capacity(&self) -> u32 {
        match &*self.ring.lock() {
            CqRing::User(r) => r.num_entries(),
            CqRing::Kernel(q) => q.capacity() as u32,
        }
    }

    /// `ibv_req_notify_cq`: the next completion (or the next solicited one) raises an event.
    pub(crate) fn arm(&self, solicited_only: bool) {
        let want = if solicited_only {
            ARM_SOLICITED
        } else {
            ARM_NEXT
        };
        // Arming for "next" overrides "solicited"; never downgrade.
        self.armed.fetch_max(want, Ordering::SeqCst);
        // Pairs with the fence in `complete_wc`: a completion added while we arm either sees
        // the arming (and notifies) or is in the ring when the consumer polls it after arming.
        fence(Ordering::SeqCst);
    }

    /// Adds a completion; raises the completion event if the CQ is armed for it. A full ring
    /// is an overflow: the CQE is lost and the CQ reports an error event.
    pub(crate) fn complete(&self, cqe: &Cqe, solicited: bool) {
        self.complete_wc(
            KernelWc {
                cqe: *cqe,
                ..KernelWc::default()
            },
            solicited,
        );
    }

    /// [`Cq::complete`] with what a kernel consumer's completion carries besides.
    pub(crate) fn complete_wc(&self, wc: KernelWc, solicited: bool) {
        let pushed = match &mut *self.ring.lock() {
            CqRing::User(r) => r.push(&wc.cqe).is_ok(),
            CqRing::Kernel(q) => q.push(wc).is_ok(),
        };
        if !pushed {
            self.notifier.overflow();
            return;
        }
        // The CQE is in the ring before we look at the arming (store then load: only a full
        // fence orders them), pairing with the one in `arm`.
        fence(Ordering::SeqCst);
        let armed = self.armed.load(Ordering::SeqCst);
        if (armed == ARM_NEXT || (armed == ARM_SOLICITED && solicited))
            && self
                .armed
                .compare_exchange(armed, ARM_NONE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.notifier.notify();
        }
    }

    /// Kernel CQ: hands the oldest completions, `max` at most, to `out`; returns how many.
    pub(crate) fn poll(&self, max: usize, mut out: impl FnMut(usize, &KernelWc)) -> usize {
        let mut ring = self.ring.lock();
        let CqRing::Kernel(q) = &mut *ring else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Some(wc) = q.pop() else { break };
            out(n, &wc);
            n += 1;
        }
        n
    }

    /// Kernel CQ: whether completions are waiting (`IB_CQ_REPORT_MISSED_EVENTS`).
    pub(crate) fn has_completions(&self) -> bool {
        match &*self.ring.lock() {
            CqRing::Kernel(q) => q.len() > 0,
            CqRing::User(_) => false,
        }
    }
}

/// A shared receive queue.
#[pin_data]
pub(crate) struct Srq {
    pub(crate) srqn: u32,
    /// SGEs a receive may carry, as created (at least one).
    pub(crate) max_sge: u32,
    /// Taken by the data path in softirq too.
    #[pin]
    ring: SpinLockBh<UserRing<RecvWqe>>,
    pub(crate) limit: AtomicU32,
    /// Userspace broke the ring (see [`Srq::take_with`]): no entry is taken from it any more.
    broken: AtomicBool,
    pub(crate) events: Arc<SrqEvents>,
}

/// What [`Srq::take`] took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// A WQE of up to 32 SGEs, taken out of a ring and used at once: boxing it would allocate
// on the data path for every receive.
#[allow(clippy::large_enum_variant)]
pub(crate) enum SrqTake {
    Taken(RecvWork),
    /// A well-formed WQE the device cannot use (`Judged::Refused`): it left the ring, with
    /// this `wr_id`, to complete in error on the QP that took it.
    Refused(u64),
    Empty,
    /// Userspace broke the ring just now: `IB_EVENT_SRQ_ERR` was raised, and the SRQ gives no
    /// more entries (later calls return `Empty`).
    RingError,
}

impl Srq {
    pub(crate) fn new(
        srqn: u32,
        max_sge: u32,
        ring: UserRing<RecvWqe>,
        events: Arc<SrqEvents>,
    ) -> impl PinInit<Self> {
        pin_init!(Srq {
            srqn,
            max_sge,
            ring <- new_spinlock_bh!(ring, "metaroce_srq"),
            limit: AtomicU32::new(0),
            broken: AtomicBool::new(false),
            events,
        })
    }

    pub(crate) fn ring_info(&self) -> RingInfo {
        self.ring.lock().info()
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.ring.lock().num_entries()
    }

    /// `ibv_modify_srq(IBV_SRQ_MAX_WR)`: the WQEs posted and not taken yet move to `ring`,
    /// which the SRQ takes from then on (its old ring is unmapped when the provider drops its
    /// mapping). EINVAL if they do not fit (the SRQ is unchanged).
    pub(crate) fn resize(&self, ring: UserRing<RecvWqe>) -> Result {
        let mut guard = self.ring.lock();
        guard.move_posted_to(&ring)?;
        let old = core::mem::replace(&mut *guard, ring);
        drop(guard);
        // Its mmap entry is removed outside the lock that softirq takes: that may free memory.
        drop(old);
        Ok(())
    }

    /// Takes the next posted receive WQE, judged (`crate::verbs_core::wqe::judge_recv`). A
    /// producer index beyond the ring or a WQE the provider could not have written breaks the
    /// SRQ for good: the first time, `IB_EVENT_SRQ_ERR`.
    pub(crate) fn take(&self) -> SrqTake {
        let ring = self.ring.lock();
        if self.broken.load(Ordering::Relaxed) {
            return SrqTake::Empty;
        }
        match ring.peek() {
            Ok(None) => return SrqTake::Empty,
            Ok(Some(wqe)) => match judge_recv(&wqe) {
                Judged::Usable(w) => {
                    ring.pop();
                    self.check_limit(&ring);
                    return SrqTake::Taken(w);
                }
                Judged::Refused => {
                    ring.pop();
                    self.check_limit(&ring);
                    return SrqTake::Refused(wqe.wr_id);
                }
                Judged::Fatal => {}
            },
            Err(_) => {}
        }
        // Under the ring's lock: raised once.
        self.broken.store(true, Ordering::Relaxed);
        self.events.srq_error();
        SrqTake::RingError
    }

    /// After a WQE was taken (under the ring's lock): with a limit armed and fewer WQEs left
    /// than it, `IB_EVENT_SRQ_LIMIT_REACHED`, once: the limit goes back to 0 (disarmed), as
    /// the verbs say, until `modify_srq` arms it again.
    fn check_limit(&self, ring: &UserRing<RecvWqe>) {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit != 0 && ring.available().is_ok_and(|left| left < limit) {
            self.limit.store(0, Ordering::Relaxed);
            self.events.srq_limit_reached();
        }
    }
}

/// What a QP's queues are made of.
pub(crate) struct QpQueues {
    pub(crate) sq: UserRing<SendWqe>,
    pub(crate) rq: Option<UserRing<RecvWqe>>,
}

/// Everything about a QP that changes, under one lock.
pub(crate) struct QpInner {
    pub(crate) state: QpState,
    pub(crate) attrs: QpAttrs,
    /// Inline payloads of its send WQEs in the transport (None without `max_inline_data`).
    pub(crate) inline: Option<InlineStore>,
    /// SGE lists of its WQEs in the transport longer than the transport carries.
    pub(crate) lists: LongLists,
    /// Its stream on the connection to its peer, from RTS on.
    pub(crate) binding: Option<crate::datapath::Binding>,
}

/// A user queue pair: RC or UC (an ordered stream of messages on the connection to its peer; a
/// UC stream drops a message that fails instead of failing) or UD (datagrams to any QP, no
/// connection: `datapath/ud.rs`).
#[pin_data]
pub(crate) struct Qp {
    pub(crate) qpn: u32,
    /// `QpType::Rc`, `QpType::Uc` (the same streams, `StreamConfig::unreliable`) or `QpType::Ud`.
    pub(crate) qp_type: QpType,
    pub(crate) pd: usize,
    pub(crate) send_cq: Arc<Cq>,
    pub(crate) recv_cq: Arc<Cq>,
    pub(crate) srq: Option<Arc<Srq>>,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: Caps,
    /// `qp_access_flags` (`IB_ACCESS_REMOTE_*`), also in `inner`: read on the data path
    /// without the QP's lock.
    access: AtomicU32,
    /// Planes this QP's packets may take (bit per plane; 0: every plane), set through the
    /// direct verbs (`metaroce_dv_set_qp_planes`); the stream takes it when it opens.
    planes: AtomicU32,
    /// Taken by the data path in softirq too: nothing sleeps or allocates under it.
    #[pin]
    pub(crate) inner: SpinLockBh<QpInner>,
    /// Held across a whole `modify_qp` (check, attach, commit): uverbs lets two run at once
    /// on one QP, and each must see the state the other left.
    #[pin]
    pub(crate) modify: Mutex<()>,
    pub(crate) events: Arc<QpEvents>,
    /// Its rings. Taken from (peek, pop) only under `inner`; a kernel consumer's are produced
    /// into under `post`.
    pub(crate) queues: QpQueues,
    /// A kernel consumer's QP: the core's `ib_qp` (which its work completions name) and the
    /// capability to touch the memory its work requests name (`local_dma_lkey` SGEs).
    pub(crate) kernel: Option<KernelQp>,
    /// Serialises a kernel consumer's posts into its rings (they post from any context).
    #[pin]
    pub(crate) post: SpinLockIrq<()>,
}

/// What a kernel consumer's QP has beyond a user QP.
#[derive(Clone, Copy)]
pub(crate) struct KernelQp {
    pub(crate) ibqp: usize,
    pub(crate) mem: KernelMemory,
}

// The inline SGE's lkey (`INLINE_LKEY`, from the rules) stands for a payload kept in the
// QP's [`InlineStore`]: the SGE's address is the QP number (high 32 bits) and the payload's
// offset there.

/// Inline payloads a QP may have in the transport at once.
pub(crate) const INLINE_SLOTS: usize = 16;
const INLINE_SLOT: usize = limits::MAX_INLINE as usize;

/// A QP's inline payloads while the transport holds their WQEs (it reads the payload when it
/// sends, and again when it resends): slots used in posting order and freed in completion
/// order, as RC completes in order.
pub(crate) struct InlineStore {
    buf: KVVec<u8>,
    /// Per slot: the WQE's position in its stream's posting order (the requester's `posted`
    /// count before it); the slot is free once more WQEs than that have completed.
    owner: [u64; INLINE_SLOTS],
    tail: usize,
    len: usize,
}

impl InlineStore {
    pub(crate) fn new() -> Result<Self> {
        let mut buf = KVVec::with_capacity(INLINE_SLOTS * INLINE_SLOT, GFP_KERNEL)?;
        buf.resize(INLINE_SLOTS * INLINE_SLOT, 0, GFP_KERNEL)?;
        Ok(InlineStore {
            buf,
            owner: [0; INLINE_SLOTS],
            tail: 0,
            len: 0,
        })
    }

    /// Forgets every payload (the QP's stream was reopened).
    pub(crate) fn clear(&mut self) {
        self.tail = 0;
        self.len = 0;
    }

    /// Frees the slots of WQEs among the first `completed` of the stream.
    pub(crate) fn release(&mut self, completed: u64) {
        while self.len > 0 && self.owner.get(self.tail).is_some_and(|&o| o < completed) {
            self.tail = (self.tail + 1) % INLINE_SLOTS;
            self.len -= 1;
        }
    }

    /// Keeps `data` for the WQE at position `posted`; returns its offset, or None if every
    /// slot is in use (or `data` is too long).
    pub(crate) fn store(&mut self, posted: u64, data: &[u8]) -> Option<u32> {
        if self.len == INLINE_SLOTS || data.len() > INLINE_SLOT {
            return None;
        }
        let slot = (self.tail + self.len) % INLINE_SLOTS;
        let at = slot * INLINE_SLOT;
        self.buf.get_mut(at..at + data.len())?.copy_from_slice(data);
        *self.owner.get_mut(slot)? = posted;
        self.len += 1;
        Some(at as u32)
    }

    /// Takes back the newest payload (its WQE was not taken after all).
    pub(crate) fn unstore_newest(&mut self) {
        self.len = self.len.saturating_sub(1);
    }

    /// Copies the bytes at `offset` into `out`.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Option<()> {
        let end = offset.checked_add(out.len())?;
        // A payload never crosses its slot.
        if end > (offset / INLINE_SLOT + 1) * INLINE_SLOT {
            return None;
        }
        out.copy_from_slice(self.buf.get(offset..end)?);
        Some(())
    }
}

/// A QP's SGE lists longer than the transport carries (`memory::MAX_SGE`) while the
/// transport holds their WQEs (`verbs_core::lists`): each queue's only if the QP may post
/// such lists (its `max_send_sge`, its `max_recv_sge` or its SRQ's `max_sge` beyond the
/// transport's). A WQE with a longer list on a queue without them completes in error.
#[derive(Default)]
pub(crate) struct LongLists {
    send: Option<(ListSlots, KVVec<WqeSge>)>,
    recv: Option<(ListSlots, KVVec<WqeSge>)>,
}

/// A ring WQE's SGE as the transport names it.
pub(crate) fn transport_sge(s: &WqeSge) -> Sge {
    Sge {
        addr: s.addr,
        len: s.length,
        lkey: s.lkey,
    }
}

/// The transport's SGE list for `l`, a judged list of queue `queue` of QP `qpn`: the same
/// SGEs if the transport carries that many, else one SGE under `LIST_LKEY` naming the slot
/// where `lists` stages it. The bool says whether it was staged (then the caller commits it
/// once the transport takes the WQE). None for a list longer than `max` (the SGEs the queue
/// was created with), which completes in error.
pub(crate) fn transport_list(
    lists: &mut LongLists,
    queue: Queue,
    qpn: u32,
    l: &WqeSgList,
    max: u32,
) -> Option<(SgList, bool)> {
    let sges = l.sges();
    if sges.len() > max as usize {
        return None;
    }
    if sges.len() <= MAX_SGE {
        let mut list = [Sge::default(); MAX_SGE];
        for (d, s) in list.iter_mut().zip(sges) {
            *d = transport_sge(s);
        }
        return Some((SgList::new(list.get(..sges.len())?)?, false));
    }
    let (slots, storage) = lists.queue(queue)?;
    let slot = slots.stage(storage, sges)?;
    let sge = Sge {
        addr: ListRef { qpn, queue, slot }.addr(),
        len: l.total(),
        lkey: LIST_LKEY,
    };
    Some((SgList::single(sge), true))
}

impl LongLists {
    /// Lists for the queues that may have them: `send` and `recv` are the longest lists the
    /// QP's send and receive queues (its SRQ's) may carry.
    pub(crate) fn new(send: u32, recv: u32) -> Result<Self> {
        let make = |depth: usize, per: u32| -> Result<Option<(ListSlots, KVVec<WqeSge>)>> {
            if per as usize <= MAX_SGE {
                return Ok(None);
            }
            let slots = ListSlots::new(depth as u32, per as usize);
            let mut v = KVVec::with_capacity(slots.storage_len(), GFP_KERNEL)?;
            v.resize(slots.storage_len(), WqeSge::default(), GFP_KERNEL)?;
            Ok(Some((slots, v)))
        };
        Ok(LongLists {
            send: make(stream::SQ_DEPTH, send)?,
            recv: make(stream::RQ_DEPTH, recv)?,
        })
    }

    fn queue(&mut self, queue: Queue) -> Option<(&mut ListSlots, &mut [WqeSge])> {
        let q = match queue {
            Queue::Send => self.send.as_mut(),
            Queue::Recv => self.recv.as_mut(),
        }?;
        Some((&mut q.0, &mut q.1[..]))
    }

    /// The transport took the WQE whose list `queue` staged last.
    pub(crate) fn commit(&mut self, queue: Queue) {
        if let Some((slots, _)) = self.queue(queue) {
            slots.commit();
        }
    }

    /// Forgets every list (the QP's stream was opened again).
    pub(crate) fn clear(&mut self) {
        for (slots, _) in [self.send.as_mut(), self.recv.as_mut()]
            .into_iter()
            .flatten()
        {
            slots.clear();
        }
    }

    /// Copies the list `r` names into `out` (zero-length entries after its end); None if
    /// there is no such list.
    pub(crate) fn copy(&mut self, r: ListRef, out: &mut [Sge; MAX_LIST]) -> Option<()> {
        let (slots, storage) = self.queue(r.queue)?;
        let list = slots.list(storage, r.slot)?;
        for (i, d) in out.iter_mut().enumerate() {
            *d = transport_sge(&list.get(i).copied().unwrap_or_default());
        }
        Some(())
    }
}

/// The parts `Qp::new` takes.
pub(crate) struct QpParts {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) pd: usize,
    pub(crate) send_cq: Arc<Cq>,
    pub(crate) recv_cq: Arc<Cq>,
    pub(crate) srq: Option<Arc<Srq>>,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: Caps,
    pub(crate) queues: QpQueues,
    pub(crate) inline: Option<InlineStore>,
    pub(crate) lists: LongLists,
    pub(crate) kernel: Option<KernelQp>,
}

impl Qp {
    pub(crate) fn new(p: QpParts, events: Arc<QpEvents>) -> impl PinInit<Self> {
        pin_init!(Qp {
            qpn: p.qpn,
            qp_type: p.qp_type,
            pd: p.pd,
            send_cq: p.send_cq,
            recv_cq: p.recv_cq,
            srq: p.srq,
            sq_sig_all: p.sq_sig_all,
            cap: p.cap,
            access: AtomicU32::new(0),
            planes: AtomicU32::new(0),
            inner <- new_spinlock_bh!(
                QpInner {
                    state: QpState::Reset,
                    attrs: QpAttrs::default(),
                    inline: p.inline,
                    lists: p.lists,
                    binding: None,
                },
                "metaroce_qp"
            ),
            modify <- new_mutex!((), "metaroce_qp_modify"),
            events,
            kernel: p.kernel,
            queues: p.queues,
            post <- new_spinlock_irq!((), "metaroce_qp_post"),
        })
    }

    /// Adds a completion of its send queue (a kernel consumer's names its `ib_qp`).
    pub(crate) fn complete_send(&self, cqe: &Cqe) {
        self.send_cq.complete_wc(self.wc(cqe), false);
    }

    /// Adds a completion of its receive queue.
    pub(crate) fn complete_recv(&self, cqe: &Cqe, solicited: bool) {
        self.recv_cq.complete_wc(self.wc(cqe), solicited);
    }

    fn wc(&self, cqe: &Cqe) -> KernelWc {
        KernelWc {
            cqe: *cqe,
            ibqp: self.kernel.map_or(0, |k| k.ibqp),
            network_hdr_type: 0,
            port_num: 1,
        }
    }

    /// Judges a `modify_qp` (`crate::verbs_core::qp::prepare`: the transition, then each
    /// attribute) and returns what the QP becomes, changing nothing. The caller holds
    /// [`Qp::modify`].
    pub(crate) fn prepare(&self, attr: &ModifyAttr, mask: u32) -> Result<QpChange> {
        let inner = self.inner.lock();
        crate::verbs_core::qp::prepare(inner.state, &inner.attrs, self.qp_type, attr, mask)
            .map_err(|_| EINVAL)
    }

    /// Applies a prepared change; it cannot fail. The caller holds [`Qp::modify`], so the QP
    /// is still as `prepare` found it, but for the data path's one change: the error state
    /// (its stream failed, or userspace broke a ring, while the modify ran), which only a
    /// move to RESET leaves.
    pub(crate) fn commit(&self, c: &QpChange) {
        let mut inner = self.inner.lock();
        inner.attrs = c.attrs;
        if inner.state != QpState::Err || c.state == QpState::Reset {
            inner.state = c.state;
        }
        if let Some(a) = c.access {
            self.access.store(a, Ordering::Release);
        }
    }

    pub(crate) fn state(&self) -> QpState {
        self.inner.lock().state
    }

    /// `qp_access_flags`: the remote accesses the QP allows (`IB_ACCESS_REMOTE_*`).
    pub(crate) fn access_flags(&self) -> u32 {
        self.access.load(Ordering::Acquire)
    }

    /// The planes the QP's packets may take (0: every plane).
    pub(crate) fn planes(&self) -> u32 {
        self.planes.load(Ordering::Acquire)
    }

    pub(crate) fn set_planes(&self, planes: u32) {
        self.planes.store(planes, Ordering::Release);
    }

    /// The QP cannot go on: userspace broke one of its rings (a producer index beyond it, a
    /// WQE that does not decode), or its connection was retired (`datapath::Engine::
    /// set_link_mtu`). It moves to the error state and `IB_EVENT_QP_FATAL` is raised. Once: a
    /// QP already in the error state stays there quietly (returns false). The caller holds
    /// `inner`, fails the QP's stream and has the rings flushed (see `datapath::Engine::feed`).
    pub(crate) fn fatal(&self, inner: &mut QpInner) -> bool {
        if inner.state == QpState::Err {
            return false;
        }
        inner.state = QpState::Err;
        self.events.qp_fatal();
        true
    }

    /// The transport failed the QP's stream (retries exhausted, remote error): the QP is in
    /// the error state. Its rings are not flushed here: the WQEs the transport still holds are
    /// older and complete first (their events follow the stream's error), and the rings flush
    /// at the QP's next feed (`datapath::Engine::feed`), which the caller queues.
    pub(crate) fn set_error(&self) {
        self.inner.lock().state = QpState::Err;
    }

    /// Completes receive WQE `wr_id` in error with `status` (no data was placed).
    pub(crate) fn recv_error(&self, wr_id: u64, status: u32) {
        let cqe = Cqe::status_only(wr_id, status, wc_opcode::RECV, self.qpn);
        self.complete_recv(&cqe, false);
    }

    /// In the error state: completes every outstanding WQE with `IB_WC_WR_FLUSH_ERR`. A ring
    /// whose producer index claims more than it holds is left alone (nothing in it can be
    /// told from garbage); once userspace puts the index back in range, the next flush (a
    /// doorbell, a modify_qp) completes what it covers.
    pub(crate) fn flush(&self) {
        let inner = self.inner.lock();
        if inner.state != QpState::Err {
            return;
        }
        while let Ok(Some(wqe)) = self.queues.sq.peek() {
            self.queues.sq.pop();
            let cqe = Cqe::status_only(
                wqe.wr_id,
                wc_status::WR_FLUSH_ERR,
                wc_opcode::for_send(wqe.opcode),
                self.qpn,
            );
            self.complete_send(&cqe);
        }
        if let Some(rq) = &self.queues.rq {
            while let Ok(Some(wqe)) = rq.peek() {
                rq.pop();
                self.recv_error(wqe.wr_id, wc_status::WR_FLUSH_ERR);
            }
        }
    }

    /// The QP was reset: what its rings still hold is discarded, with no completion (the
    /// verbs' RESET state empties the work queues). A ring userspace broke is left as it
    /// is: the next post finds it.
    pub(crate) fn discard(&self) {
        // The rings are taken from under the QP's lock only.
        let _inner = self.inner.lock();
        while let Ok(Some(_)) = self.queues.sq.peek() {
            self.queues.sq.pop();
        }
        if let Some(rq) = &self.queues.rq {
            while let Ok(Some(_)) = rq.peek() {
                rq.pop();
            }
        }
    }
}

/// The verbs objects of one device.
#[pin_data]
pub(crate) struct Verbs {
    /// Read by the data path in softirq too (numbers are reserved with [`reserve_in`]).
    #[pin]
    pub(crate) mrs: SpinLockBh<Table<Mr>>,
    /// As `mrs`.
    #[pin]
    pub(crate) qps: SpinLockBh<Table<Qp>>,
    /// Memory windows, by key without `MW_KEY_BIT` (read by the data path as `mrs`).
    #[pin]
    pub(crate) mws: SpinLockBh<Table<Mw>>,
    #[pin]
    pub(crate) srqs: Mutex<Table<Srq>>,
    pub(crate) cqs: AtomicU32,
    pub(crate) pds: AtomicU32,
}

impl Verbs {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Verbs {
            mrs <- new_spinlock_bh!(Table::with_random_keys(limits::MAX_MR), "metaroce_mrs"),
            qps <- new_spinlock_bh!(Table::new(limits::MAX_QP), "metaroce_qps"),
            mws <- new_spinlock_bh!(Table::with_random_keys(limits::MAX_MW), "metaroce_mws"),
            srqs <- new_mutex!(Table::new(limits::MAX_SRQ), "metaroce_srqs"),
            cqs: AtomicU32::new(0),
            pds: AtomicU32::new(0),
        })
    }

    /// `f` applied to QP `qpn`, under the table's lock (the data path does not take a
    /// reference: dropping the last one may sleep).
    pub(crate) fn with_qp<R>(&self, qpn: u32, f: impl FnOnce(&Qp) -> R) -> Option<R> {
        self.qps
            .lock()
            .with(qpn, |qp| (qp.qpn == qpn).then(|| f(qp)))
            .flatten()
    }

    /// A reference to QP `qpn` (process context only: dropping the last one may sleep).
    pub(crate) fn qp(&self, qpn: u32) -> Option<Arc<Qp>> {
        self.qps
            .lock()
            .with(qpn, |qp| (qp.qpn == qpn).then(|| qp.clone()))
            .flatten()
    }

    /// References to the kernel consumers' QPs, as many as `out` has room for (process
    /// context only).
    pub(crate) fn kernel_qps(&self, out: &mut KVec<Arc<Qp>>) {
        self.qps.lock().collect(|qp| qp.kernel.is_some(), out);
    }

    /// The window `key` names as it is now (a copy, taken under the table's lock).
    pub(crate) fn mw(&self, key: u32) -> Option<MwState> {
        self.mw_at(key).filter(|s| s.rkey == key)
    }

    /// The window in `key`'s slot, whatever its key byte now (a bind names its window by
    /// index).
    pub(crate) fn mw_at(&self, key: u32) -> Option<MwState> {
        if key & MW_KEY_BIT == 0 {
            return None;
        }
        let index = (key & !MW_KEY_BIT) >> 8;
        self.mws.lock().at(index).map(|(_, mw)| mw.state)
    }

    /// Replaces window `key`'s state with `state` (its rkey may differ in its low byte): false
    /// if `key` names no window now (freed, or bound again meanwhile).
    pub(crate) fn set_mw(&self, key: u32, state: MwState) -> bool {
        let Ok(mw) = Arc::new(Mw { state }, GFP_ATOMIC) else {
            return false;
        };
        let res = self
            .mws
            .lock()
            .update(key & !MW_KEY_BIT, state.rkey & !MW_KEY_BIT, mw);
        // The replaced one (or ours) goes after the lock: windows hold no pages.
        res.is_ok()
    }

    /// `f` applied to the MR that `key` names if it belongs to `pd` (or any PD when `pd` is
    /// None), under the table's lock: `dereg_mr` waits for the copies it makes (the last
    /// reference to an MR must not go in softirq: releasing its pages may sleep).
    pub(crate) fn with_mr<R>(
        &self,
        key: u32,
        pd: Option<usize>,
        f: impl FnOnce(&Mr) -> R,
    ) -> Option<R> {
        self.mrs
            .lock()
            .with(key, |mr| {
                (mr.has_key(key) && pd.is_none_or(|pd| mr.pd == pd)).then(|| f(mr))
            })
            .flatten()
    }
}
