// SPDX-License-Identifier: GPL-2.0

//! The verbs objects: memory regions, completion queues, shared receive queues and queue
//! pairs, with their tables per device. Safe code; the rings and pinned memory they own come
//! from `crate::sys` and have safe interfaces.
//!
//! Names follow the InfiniBand spec: QP, WQE, CQE, PSN, rkey/lkey, SGE.

use crate::sys::{
    bhlock::{new_spinlock_bh, SpinLockBh},
    bindings,
    ring::{RingInfo, UserRing},
    umem::UserMemory,
    CqNotifier, QpEvents, SrqEvents,
};
use core::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU8, Ordering};
use kernel::{
    new_mutex, new_spinlock_irq,
    prelude::*,
    sync::{Arc, Mutex, SpinLockIrq},
};

pub(crate) type SendWqe = bindings::metaroce_send_wqe;
pub(crate) type RecvWqe = bindings::metaroce_recv_wqe;
pub(crate) type Cqe = bindings::metaroce_cqe;

/// Limits this device reports and enforces.
pub(crate) mod limits {
    /// QPs, CQs, SRQs, MRs per device.
    pub(crate) const MAX_QP: u32 = 1 << 14;
    pub(crate) const MAX_CQ: u32 = 1 << 14;
    pub(crate) const MAX_SRQ: u32 = 1 << 12;
    pub(crate) const MAX_MR: u32 = 1 << 16;
    /// Work requests per queue, CQEs per CQ.
    pub(crate) const MAX_QP_WR: u32 = 1 << 14;
    pub(crate) const MAX_CQE: u32 = (1 << 16) - 1;
    pub(crate) const MAX_SRQ_WR: u32 = 1 << 14;
    /// SGEs per WQE: what the transport core carries.
    pub(crate) const MAX_SGE: u32 = 4;
    /// Inline payload per send WQE (what the WQE's SGE area holds).
    pub(crate) const MAX_INLINE: u32 = crate::sys::bindings::METAROCE_MAX_INLINE;
    /// Outstanding RDMA READ / atomic operations per QP, each way.
    pub(crate) const MAX_RD_ATOM: u32 = 16;
}

/// A memory region.
pub(crate) struct Mr {
    /// The key, both lkey and rkey.
    pub(crate) key: u32,
    /// The address the application names the region by (`ibv_reg_mr_iova`'s iova).
    pub(crate) iova: u64,
    pub(crate) length: u64,
    /// `IB_ACCESS_*` flags.
    pub(crate) access: u32,
    /// The protection domain, by identity.
    pub(crate) pd: usize,
    mem: UserMemory,
}

/// Why a memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MrError {
    Bounds,
    Permission,
}

impl Mr {
    pub(crate) fn new(
        key: u32,
        iova: u64,
        length: u64,
        access: u32,
        pd: usize,
        mem: UserMemory,
    ) -> Self {
        Mr {
            key,
            iova,
            length,
            access,
            pd,
            mem,
        }
    }

    /// The offset of `[va, va + len)` in the region, if it is inside.
    fn offset(&self, va: u64, len: u64) -> Result<u64, MrError> {
        let off = va.checked_sub(self.iova).ok_or(MrError::Bounds)?;
        let end = off.checked_add(len).ok_or(MrError::Bounds)?;
        if end > self.length || end > self.mem.len() {
            return Err(MrError::Bounds);
        }
        Ok(off)
    }

    /// Checks that `[va, va + len)` is inside and `needed` is granted, touching nothing.
    pub(crate) fn check(&self, va: u64, len: u64, needed: u32) -> Result<(), MrError> {
        self.allow(needed)?;
        self.offset(va, len).map(|_| ())
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
        self.allow(needed)?;
        let off = self.offset(va, data.len() as u64)?;
        self.mem.write(off, data).map_err(|_| MrError::Bounds)
    }

    /// Reads into `out` from `va`.
    pub(crate) fn read(&self, va: u64, out: &mut [u8], needed: u32) -> Result<(), MrError> {
        self.allow(needed)?;
        let off = self.offset(va, out.len() as u64)?;
        self.mem.read(off, out).map_err(|_| MrError::Bounds)
    }

    /// An atomic on the 8-byte word at `va`; returns the old value.
    pub(crate) fn atomic(&self, va: u64, op: impl Fn(u64) -> u64) -> Result<u64, MrError> {
        self.allow(bindings::ib_access_flags_IB_ACCESS_REMOTE_ATOMIC)?;
        let off = self.offset(va, 8)?;
        self.mem.atomic(off, op).map_err(|_| MrError::Bounds)
    }
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
    /// Taken by the data path in softirq too.
    #[pin]
    ring: SpinLockBh<UserRing<RecvWqe>>,
    pub(crate) limit: AtomicU32,
    /// Userspace broke the ring (see [`Srq::take_with`]): no entry is taken from it any more.
    broken: AtomicBool,
    #[pin]
    pub(crate) events: SrqEvents,
}

/// What [`Srq::take_with`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SrqTake {
    Taken,
    NotTaken,
    /// Userspace broke the ring just now: `IB_EVENT_SRQ_ERR` was raised, and the SRQ gives no
    /// more entries (later calls return `NotTaken`).
    RingError,
}

impl Srq {
    pub(crate) fn new(
        srqn: u32,
        ring: UserRing<RecvWqe>,
        events: impl PinInit<SrqEvents>,
    ) -> impl PinInit<Self> {
        pin_init!(Srq {
            srqn,
            ring <- new_spinlock_bh!(ring, "metaroce_srq"),
            limit: AtomicU32::new(0),
            broken: AtomicBool::new(false),
            events <- events,
        })
    }

    pub(crate) fn ring_info(&self) -> RingInfo {
        self.ring.lock().info()
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.ring.lock().num_entries()
    }

    /// Offers the next posted receive WQE (a copy) to `f`; it leaves the ring if `f` takes
    /// it (returns true). A producer index beyond the ring or a WQE that does not decode
    /// ([`crate::sys::recv_wqe_decodes`]) breaks the SRQ for good: the first time, `IB_EVENT_SRQ_ERR`.
    pub(crate) fn take_with(&self, f: impl FnOnce(&RecvWqe) -> bool) -> SrqTake {
        let ring = self.ring.lock();
        if self.broken.load(Ordering::Relaxed) {
            return SrqTake::NotTaken;
        }
        match ring.peek() {
            Ok(Some(wqe)) if !crate::sys::recv_wqe_decodes(&wqe) => {}
            Ok(Some(wqe)) if f(&wqe) => {
                ring.pop();
                return SrqTake::Taken;
            }
            Ok(_) => return SrqTake::NotTaken,
            Err(_) => {}
        }
        // Under the ring's lock: raised once.
        self.broken.store(true, Ordering::Relaxed);
        self.events.srq_error();
        SrqTake::RingError
    }
}

/// QP states, as `enum ib_qp_state` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

impl QpState {
    pub(crate) fn from_ib(s: u32) -> Option<Self> {
        Some(match s {
            bindings::ib_qp_state_IB_QPS_RESET => QpState::Reset,
            bindings::ib_qp_state_IB_QPS_INIT => QpState::Init,
            bindings::ib_qp_state_IB_QPS_RTR => QpState::Rtr,
            bindings::ib_qp_state_IB_QPS_RTS => QpState::Rts,
            bindings::ib_qp_state_IB_QPS_SQD => QpState::Sqd,
            bindings::ib_qp_state_IB_QPS_SQE => QpState::Sqe,
            bindings::ib_qp_state_IB_QPS_ERR => QpState::Err,
            _ => return None,
        })
    }

    pub(crate) fn to_ib(self) -> u32 {
        match self {
            QpState::Reset => bindings::ib_qp_state_IB_QPS_RESET,
            QpState::Init => bindings::ib_qp_state_IB_QPS_INIT,
            QpState::Rtr => bindings::ib_qp_state_IB_QPS_RTR,
            QpState::Rts => bindings::ib_qp_state_IB_QPS_RTS,
            QpState::Sqd => bindings::ib_qp_state_IB_QPS_SQD,
            QpState::Sqe => bindings::ib_qp_state_IB_QPS_SQE,
            QpState::Err => bindings::ib_qp_state_IB_QPS_ERR,
        }
    }
}

/// The connection attributes `modify_qp` sets, kept as plain values.
#[derive(Clone, Copy, Default)]
pub(crate) struct QpAttrs {
    pub(crate) path_mtu: u32,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) access_flags: i32,
    pub(crate) pkey_index: u16,
    pub(crate) port_num: u32,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) sq_draining: u8,
    /// Destination GID (an IPv4-mapped or IPv6 address), from the AH.
    pub(crate) dgid: [u8; 16],
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
    pub(crate) flow_label: u32,
    pub(crate) sl: u8,
    pub(crate) ah_set: bool,
}

impl QpAttrs {
    /// Takes the fields `mask` names from `attr`.
    pub(crate) fn apply(&mut self, attr: &bindings::ib_qp_attr, mask: u32) {
        use bindings::*;
        let has = |bit: u32| mask & bit != 0;
        if has(ib_qp_attr_mask_IB_QP_PATH_MTU) {
            self.path_mtu = attr.path_mtu;
        }
        if has(ib_qp_attr_mask_IB_QP_QKEY) {
            self.qkey = attr.qkey;
        }
        if has(ib_qp_attr_mask_IB_QP_RQ_PSN) {
            self.rq_psn = attr.rq_psn & 0x00ff_ffff;
        }
        if has(ib_qp_attr_mask_IB_QP_SQ_PSN) {
            self.sq_psn = attr.sq_psn & 0x00ff_ffff;
        }
        if has(ib_qp_attr_mask_IB_QP_DEST_QPN) {
            self.dest_qp_num = attr.dest_qp_num;
        }
        if has(ib_qp_attr_mask_IB_QP_ACCESS_FLAGS) {
            self.access_flags = attr.qp_access_flags;
        }
        if has(ib_qp_attr_mask_IB_QP_PKEY_INDEX) {
            self.pkey_index = attr.pkey_index;
        }
        if has(ib_qp_attr_mask_IB_QP_PORT) {
            self.port_num = attr.port_num;
        }
        if has(ib_qp_attr_mask_IB_QP_MAX_QP_RD_ATOMIC) {
            self.max_rd_atomic = attr.max_rd_atomic;
        }
        if has(ib_qp_attr_mask_IB_QP_MAX_DEST_RD_ATOMIC) {
            self.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if has(ib_qp_attr_mask_IB_QP_MIN_RNR_TIMER) {
            self.min_rnr_timer = attr.min_rnr_timer;
        }
        if has(ib_qp_attr_mask_IB_QP_TIMEOUT) {
            self.timeout = attr.timeout;
        }
        if has(ib_qp_attr_mask_IB_QP_RETRY_CNT) {
            self.retry_cnt = attr.retry_cnt;
        }
        if has(ib_qp_attr_mask_IB_QP_RNR_RETRY) {
            self.rnr_retry = attr.rnr_retry;
        }
        if has(ib_qp_attr_mask_IB_QP_AV) {
            let grh = &attr.ah_attr.grh;
            self.dgid = crate::sys::gid_bytes(&grh.dgid);
            self.sgid_index = grh.sgid_index;
            self.hop_limit = grh.hop_limit;
            self.traffic_class = grh.traffic_class;
            self.flow_label = grh.flow_label;
            self.sl = attr.ah_attr.sl;
            self.ah_set = true;
        }
    }

    /// Fills what `query_qp` reports.
    pub(crate) fn fill(&self, attr: &mut bindings::ib_qp_attr) {
        attr.path_mtu = self.path_mtu;
        attr.qkey = self.qkey;
        attr.rq_psn = self.rq_psn;
        attr.sq_psn = self.sq_psn;
        attr.dest_qp_num = self.dest_qp_num;
        attr.qp_access_flags = self.access_flags;
        attr.pkey_index = self.pkey_index;
        attr.port_num = self.port_num;
        attr.max_rd_atomic = self.max_rd_atomic;
        attr.max_dest_rd_atomic = self.max_dest_rd_atomic;
        attr.min_rnr_timer = self.min_rnr_timer;
        attr.timeout = self.timeout;
        attr.retry_cnt = self.retry_cnt;
        attr.rnr_retry = self.rnr_retry;
        attr.sq_draining = self.sq_draining;
        attr.ah_attr.grh.dgid.raw = self.dgid;
        attr.ah_attr.grh.sgid_index = self.sgid_index;
        attr.ah_attr.grh.hop_limit = self.hop_limit;
        attr.ah_attr.grh.traffic_class = self.traffic_class;
        attr.ah_attr.grh.flow_label = self.flow_label;
        attr.ah_attr.sl = self.sl;
        attr.ah_attr.port_num = self.port_num;
        attr.ah_attr.type_ = bindings::rdma_ah_attr_type_RDMA_AH_ATTR_TYPE_ROCE;
        attr.ah_attr.ah_flags = bindings::ib_ah_flags_IB_AH_GRH as u8;
    }

    /// The destination as an IPv4 address, if the GID is IPv4-mapped.
    pub(crate) fn dest_ipv4(&self) -> Option<[u8; 4]> {
        match crate::net::IpAddr::from_gid(&self.dgid) {
            crate::net::IpAddr::V4(a) => Some(a),
            crate::net::IpAddr::V6(_) => None,
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
    pub(crate) queues: QpQueues,
    /// Inline payloads of its send WQEs in the transport (None without `max_inline_data`).
    pub(crate) inline: Option<InlineStore>,
    /// Its stream on the connection to its peer, from RTS on.
    pub(crate) binding: Option<crate::datapath::Binding>,
}

/// A queue pair (RC): an ordered stream of messages on the connection to its peer.
#[pin_data]
pub(crate) struct Qp {
    pub(crate) qpn: u32,
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
    #[pin]
    pub(crate) events: QpEvents,
}

/// What a `modify_qp` asks, checked against the QP but not applied ([`Qp::prepare`]): the
/// attributes and state the QP will have once [`Qp::commit`] takes it. Whatever may still fail
/// (attaching to the connection) uses these before the QP changes, so a failed call leaves the
/// QP as it was.
#[derive(Clone, Copy)]
pub(crate) struct QpChange {
    pub(crate) attrs: QpAttrs,
    pub(crate) state: QpState,
    access: Option<u32>,
}

/// The capacities a QP was created with (after rounding up).
#[derive(Clone, Copy)]
pub(crate) struct Caps {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

impl Caps {
    /// As `query_qp` reports them.
    pub(crate) fn to_ib(self) -> bindings::ib_qp_cap {
        bindings::ib_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
            max_rdma_ctxs: 0,
        }
    }
}

/// The lkey of the one SGE that stands for an inline payload: its address is the QP number
/// (high 32 bits) and the payload's offset in that QP's [`InlineStore`]. No MR has it (MR keys
/// are `index << 8 | key byte` with fewer than 2^16 indices), and a WQE from userspace naming
/// it is refused.
pub(crate) const INLINE_LKEY: u32 = u32::MAX;
const _: () = assert!((limits::MAX_MR as u64) << 8 < INLINE_LKEY as u64);

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

/// The parts `Qp::new` takes.
pub(crate) struct QpParts {
    pub(crate) qpn: u32,
    pub(crate) pd: usize,
    pub(crate) send_cq: Arc<Cq>,
    pub(crate) recv_cq: Arc<Cq>,
    pub(crate) srq: Option<Arc<Srq>>,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: Caps,
    pub(crate) queues: QpQueues,
    pub(crate) inline: Option<InlineStore>,
}

impl Qp {
    pub(crate) fn new(p: QpParts, events: impl PinInit<QpEvents>) -> impl PinInit<Self> {
        pin_init!(Qp {
            qpn: p.qpn,
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
                    queues: p.queues,
                    inline: p.inline,
                    binding: None,
                },
                "metaroce_qp"
            ),
            modify <- new_mutex!((), "metaroce_qp_modify"),
            events <- events,
        })
    }

    /// Validates the requested capacities against the device limits (verbs semantics: a
    /// request beyond them fails the create) and rounds the queue sizes up to the rings'.
    pub(crate) fn check_caps(cap: &bindings::ib_qp_cap, has_srq: bool) -> Result<Caps> {
        if cap.max_send_wr > limits::MAX_QP_WR
            || cap.max_recv_wr > limits::MAX_QP_WR
            || cap.max_send_sge > limits::MAX_SGE
            || cap.max_recv_sge > limits::MAX_SGE
            || cap.max_inline_data > limits::MAX_INLINE
        {
            return Err(EINVAL);
        }
        Ok(Caps {
            max_send_wr: cap.max_send_wr.max(1).next_power_of_two(),
            max_recv_wr: if has_srq {
                0
            } else {
                cap.max_recv_wr.max(1).next_power_of_two()
            },
            max_send_sge: cap.max_send_sge.max(1),
            max_recv_sge: if has_srq { 0 } else { cap.max_recv_sge.max(1) },
            // A QP that asks for none gets none (and no inline store).
            max_inline_data: if cap.max_inline_data > 0 {
                limits::MAX_INLINE
            } else {
                0
            },
        })
    }

    /// Checks a `modify_qp` (after the transition check, `ib_modify_qp_is_ok`) and returns
    /// what the QP becomes, changing nothing. The caller holds [`Qp::modify`].
    pub(crate) fn prepare(&self, attr: &bindings::ib_qp_attr, mask: u32) -> Result<QpChange> {
        let inner = self.inner.lock();
        if mask & bindings::ib_qp_attr_mask_IB_QP_AV != 0
            && crate::sys::gid_bytes(&attr.ah_attr.grh.dgid) == [0; 16]
        {
            return Err(EINVAL);
        }
        let mut attrs = inner.attrs;
        attrs.apply(attr, mask);
        let state = if mask & bindings::ib_qp_attr_mask_IB_QP_STATE != 0 {
            QpState::from_ib(attr.qp_state).ok_or(EINVAL)?
        } else {
            inner.state
        };
        if state == QpState::Rtr && inner.state != QpState::Rtr && !attrs.ah_set {
            return Err(EINVAL);
        }
        let access = (mask & bindings::ib_qp_attr_mask_IB_QP_ACCESS_FLAGS != 0)
            .then_some(attr.qp_access_flags as u32);
        Ok(QpChange {
            attrs,
            state,
            access,
        })
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

    /// Userspace broke one of the QP's rings (a producer index beyond it, a WQE that does not
    /// decode): the QP moves to the error state and `IB_EVENT_QP_FATAL` is raised. Once: a QP
    /// already in the error state stays there quietly (returns false). The caller holds
    /// `inner`, fails the QP's stream and has the rings flushed (see `datapath::Engine::feed`).
    pub(crate) fn ring_error(&self, inner: &mut QpInner) -> bool {
        if inner.state == QpState::Err {
            return false;
        }
        inner.state = QpState::Err;
        self.events.qp_fatal();
        true
    }

    /// The transport failed the QP's stream (retries exhausted, remote error): the QP is in
    /// the error state; what is left in its rings is flushed.
    pub(crate) fn set_error(&self) {
        self.inner.lock().state = QpState::Err;
        self.flush();
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
        while let Ok(Some(wqe)) = inner.queues.sq.peek() {
            inner.queues.sq.pop();
            let cqe = cqe(
                wqe.wr_id,
                bindings::ib_wc_status_IB_WC_WR_FLUSH_ERR,
                wc_opcode_for_send(wqe.opcode),
                self.qpn,
            );
            self.send_cq.complete(&cqe, false);
        }
        if let Some(rq) = &inner.queues.rq {
            while let Ok(Some(wqe)) = rq.peek() {
                rq.pop();
                let cqe = cqe(
                    wqe.wr_id,
                    bindings::ib_wc_status_IB_WC_WR_FLUSH_ERR,
                    bindings::ib_wc_opcode_IB_WC_RECV,
                    self.qpn,
                );
                self.recv_cq.complete(&cqe, false);
            }
        }
    }
}

/// A completion with no data (errors, flushes).
pub(crate) fn cqe(wr_id: u64, status: u32, opcode: u32, qpn: u32) -> Cqe {
    Cqe {
        wr_id,
        status,
        opcode,
        qp_num: qpn,
        ..Default::default()
    }
}

/// The completion opcode (`ib_wc_opcode`) of a send-queue work request (`ib_wr_opcode`).
pub(crate) fn wc_opcode_for_send(wr_opcode: u32) -> u32 {
    use bindings as b;
    match wr_opcode {
        b::ib_wr_opcode_IB_WR_RDMA_WRITE | b::ib_wr_opcode_IB_WR_RDMA_WRITE_WITH_IMM => {
            b::ib_wc_opcode_IB_WC_RDMA_WRITE
        }
        b::ib_wr_opcode_IB_WR_RDMA_READ => b::ib_wc_opcode_IB_WC_RDMA_READ,
        b::ib_wr_opcode_IB_WR_ATOMIC_CMP_AND_SWP => b::ib_wc_opcode_IB_WC_COMP_SWAP,
        b::ib_wr_opcode_IB_WR_ATOMIC_FETCH_AND_ADD => b::ib_wc_opcode_IB_WC_FETCH_ADD,
        _ => b::ib_wc_opcode_IB_WC_SEND,
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
                (mr.key == key && pd.is_none_or(|pd| mr.pd == pd)).then(|| f(mr))
            })
            .flatten()
    }
}
