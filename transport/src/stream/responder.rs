// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Responder side of a stream: the receive queue, message assembly, READ/atomic responses.
//!
//! Data is placed the moment it arrives, in any order: a SEND names its receive WQE (RSN) and
//! its offset, a WRITE its address. Duplicates are recognised by placement (message number and
//! segment), never by PSN, since a retransmission is a new packet. Messages complete strictly
//! in MSN order; the completion point goes back to the requester in ACK stream entries.
//!
//! WRITEs to the same bytes end as in-order execution leaves them: a packet of a WRITE that
//! arrives after a newer WRITE of the stream placed some of its bytes (same rkey) is placed
//! around them ([`Responder::write_behind_newer`]). Applications rely on this (rxe and HCAs
//! place in order): UCX's `put_bw` rewrites one buffer and polls a sequence number in its
//! last bytes, which an older WRITE's late packet would turn back.

use super::super::connection::retransmit::Outcome;
use super::super::connection::sack::SegWindow;
use super::super::memory::{Access, AccessError, AtomicOp, Memory, QpMem};
use super::super::wire::{seq_diff, NakCode, Opcode, FLUSH_GLOBAL, FLUSH_PERSISTENT, FLUSH_REGION};
use super::super::zero::{zero_valid, ZeroValid};
use super::requester::segments;
use super::{
    CqOpcode, CqStatus, Cqe, PostError, RecvWqe, StreamId, MSG_WINDOW, RESP_DEPTH, RQ_DEPTH,
};

/// What the connection should do with an arriving request packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Processed (or a harmless duplicate): acknowledge its PSN.
    Accept,
    /// Acknowledge its PSN and send this NAK for its message.
    Nak(NakCode, u32),
    /// Acknowledge its PSN and send this NAK for message `.0`: a later message than the
    /// packet's, that failed when the packet moved the completion point to it (the NAK must
    /// name the message that failed: an earlier one completes successfully).
    NakMsn(u32, NakCode),
    /// Not processed (no room to track it): do not acknowledge; it will be resent.
    Drop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum SlotState {
    Free = 0,
    /// Data arriving.
    Receiving,
    /// Complete; waiting for earlier messages.
    Done,
    /// Failed with this NAK code.
    Failed(NakCode),
    /// Dropped (an unreliable stream's failure, for this reason): its packets are taken and
    /// ignored; it completes in its turn without its data.
    Dropped(NakCode),
}

// All-zero bytes are `Free` (what `reset` gives), the variant written 0, which carries nothing
// (a `#[repr(u8)]` enum is its tag byte, then the variant's fields).
impl ZeroValid for SlotState {}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    msn: u32,
    opcode: Opcode,
    total_len: u32,
    n_segs: u32,
    segs: SegWindow,
    rsn: u32,
    /// Immediate data (valid with `has_imm`).
    imm: u32,
    has_imm: bool,
    solicited: bool,
    /// A request carried out at the completion point (atomics, ATOMIC WRITE, FLUSH): its
    /// address, key and operands (as in its `AtomicExt`). A WRITE's: its first byte's address
    /// and its key (for [`Responder::write_behind_newer`]).
    va: u64,
    rkey: u32,
    compare: u64,
    swap_add: u64,
}
zero_valid!(struct Slot {
    state, msn, opcode, total_len, n_segs, segs, rsn, imm, has_imm, solicited, va, rkey,
    compare, swap_add,
});

impl Slot {
    fn free() -> Self {
        Slot {
            state: SlotState::Free,
            msn: 0,
            opcode: Opcode::Send,
            total_len: 0,
            n_segs: 0,
            segs: SegWindow::new(),
            rsn: 0,
            imm: 0,
            has_imm: false,
            solicited: false,
            va: 0,
            rkey: 0,
            compare: 0,
            swap_add: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum RqState {
    Posted = 0,
    Done {
        status: CqStatus,
        byte_len: u32,
        imm: Option<u32>,
        opcode: CqOpcode,
        solicited: bool,
        invalidated: bool,
    },
}

// All-zero bytes are `Posted` (what `reset` gives), the variant written 0, which carries
// nothing (a `#[repr(u8)]` enum is its tag byte, then the variant's fields; `Done`'s are never
// all-zero bytes, so its `Option` is not a concern).
impl ZeroValid for RqState {}

#[derive(Clone, Copy, Debug)]
struct RqEntry {
    state: RqState,
    wqe: RecvWqe,
}
zero_valid!(struct RqEntry { state, wqe });

/// A response being sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ResponseKind {
    /// RDMA READ data from `[va, va + len)` under `rkey`.
    Read {
        /// Remote address.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// Bytes.
        len: u32,
    } = 0,
    /// Atomic response carrying the original value.
    Atomic {
        /// Value before the operation.
        orig: u64,
    },
}

// All-zero bytes are `Read { va: 0, rkey: 0, len: 0 }`: the variant written 0 (a `#[repr(u8)]`
// enum is its tag byte, then the variant's fields), with the fields checked below. It carries
// data, but a response slot's kind means nothing while the slot is not `used`, and a zeroed
// slot is not (nor is any after `reset`).
impl ZeroValid for ResponseKind {}
const _: () = {
    #[allow(dead_code)]
    fn check(kind: &ResponseKind) {
        fn field<T: ZeroValid>(_: &T) {}
        if let ResponseKind::Read { va, rkey, len } = kind {
            field(va);
            field(rkey);
            field(len);
        }
    }
};

#[derive(Clone, Copy, Debug)]
struct Response {
    used: bool,
    /// It may be sent (an atomic's once it was carried out).
    ready: bool,
    msn: u32,
    kind: ResponseKind,
    n_segs: u32,
    segs: SegWindow,
}
zero_valid!(struct Response { used, ready, msn, kind, n_segs, segs });

/// A response packet the connection should send now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseSegment {
    /// The requester's message.
    pub msn: u32,
    /// Segment of the response.
    pub seg: u32,
    /// What is being answered.
    pub kind: ResponseKind,
    /// The segment was sent before.
    pub retransmit: bool,
}

/// Responder counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponderStats {
    /// Payload bytes placed.
    pub placed_bytes: u64,
    /// Duplicate packets (already placed or completed).
    pub duplicates: u64,
    /// Packets not tracked (outside a window, no response slot).
    pub dropped: u64,
    /// RNR NAKs sent.
    pub rnr_naks: u64,
    /// Messages completed.
    pub completed: u64,
    /// SEND_WITH_INV messages failed: their rkey named nothing this QP may invalidate.
    pub invalidate_errors: u64,
    /// Messages an unreliable (UC) stream dropped.
    pub dropped_messages: u64,
    /// WRITE packets that arrived after a newer WRITE placed some of their bytes, and were
    /// placed around them.
    pub behind_newer: u64,
}
zero_valid!(struct ResponderStats {
    placed_bytes, duplicates, dropped, rnr_naks, completed, invalidate_errors, dropped_messages,
    behind_newer,
});

#[derive(Clone, Debug)]
/// A stream's receive queue, message assembly and responses.
pub struct Responder {
    rq: [RqEntry; RQ_DEPTH],
    /// RSN of the oldest receive WQE not yet delivered as a completion.
    rq_head: u32,
    /// RSN the next posted receive WQE gets.
    rq_tail: u32,
    slots: [Slot; MSG_WINDOW as usize],
    /// Every MSN before this one is complete.
    completed: u32,
    /// The newest WRITE that placed data (until one has, the first MSN expected): a packet
    /// of an older one may find bytes it placed ([`Self::write_behind_newer`]).
    newest_write: u32,
    resps: [Response; RESP_DEPTH],
    /// First failed message: nothing at or after it completes.
    /// First failed message (valid with `error_set`) and its NAK code.
    error_set: bool,
    error_msn: u32,
    error_code: u8,
    /// A UC QP's: a message that fails is dropped and the stream goes on (below).
    unreliable: bool,
    /// Counters.
    pub stats: ResponderStats,
}
zero_valid!(struct Responder {
    rq, rq_head, rq_tail, slots, completed, newest_write, resps, error_set, error_msn,
    error_code, unreliable, stats,
});

impl Default for Responder {
    fn default() -> Self {
        Self::new()
    }
}

fn slot_index(msn: u32) -> usize {
    msn as usize % MSG_WINDOW as usize
}

impl Responder {
    /// An empty responder.
    pub fn new() -> Self {
        Responder {
            rq: [RqEntry {
                state: RqState::Posted,
                wqe: RecvWqe::default(),
            }; RQ_DEPTH],
            rq_head: 0,
            rq_tail: 0,
            slots: [Slot::free(); MSG_WINDOW as usize],
            completed: 0,
            newest_write: 0,
            resps: [Response {
                used: false,
                ready: false,
                msn: 0,
                kind: ResponseKind::Atomic { orig: 0 },
                n_segs: 0,
                segs: SegWindow::new(),
            }; RESP_DEPTH],
            error_set: false,
            error_msn: 0,
            error_code: 0,
            unreliable: false,
            stats: ResponderStats::default(),
        }
    }

    /// Makes this the responder of an unreliable connected (UC) QP, as the IBA's UC responder
    /// treats errors (its classes D and E): a message that cannot be carried out (a bad rkey
    /// or rights for a WRITE, a receive buffer too short or unusable for a SEND, a packet that
    /// contradicts its message) is dropped, not NAKed; the stream goes on with the next one. A
    /// dropped message that consumes a receive WQE still completes it, in order, with an error
    /// status (the WQE is the requester's by RSN, so it cannot be kept for a later message),
    /// where rxe drops silently unless the QP has an SRQ. A SEND that finds no receive WQE is
    /// answered RNR as on RC (the requester retries without limit), where UC would drop it:
    /// with messages placed out of order, only the requester's RSN can keep the receive
    /// queue in order. Kept across [`Self::reset`].
    pub fn set_unreliable(&mut self, unreliable: bool) {
        self.unreliable = unreliable;
    }

    /// The completion point reported to the requester.
    pub fn completed_msn(&self) -> u32 {
        self.completed
    }

    /// The completion point reached a failed message: the stream must go to error.
    pub fn failed(&self) -> Option<NakCode> {
        match self.error() {
            Some((m, code)) if m == self.completed => Some(code),
            _ => None,
        }
    }

    /// The first failed message and its NAK code.
    fn error(&self) -> Option<(u32, NakCode)> {
        if !self.error_set {
            return None;
        }
        NakCode::from_code(self.error_code).map(|c| (self.error_msn, c))
    }

    /// Re-initialises in place; the first message expected has MSN and RSN `start`.
    pub fn reset(&mut self, start: u32) {
        for e in self.rq.iter_mut() {
            e.state = RqState::Posted;
            e.wqe = RecvWqe::default();
        }
        self.rq_head = start;
        self.rq_tail = start;
        for s in self.slots.iter_mut() {
            *s = Slot::free();
        }
        self.completed = start;
        self.newest_write = start;
        for r in self.resps.iter_mut() {
            r.used = false;
        }
        self.error_set = false;
        self.error_msn = 0;
        self.error_code = 0;
        self.stats = ResponderStats::default();
    }

    /// Posts a receive WQE (consumed in posting order by RSN).
    pub fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), PostError> {
        if self.rq_tail.wrapping_sub(self.rq_head) as usize >= RQ_DEPTH {
            return Err(PostError::QueueFull);
        }
        let e = self
            .rq
            .get_mut(self.rq_tail as usize % RQ_DEPTH)
            .ok_or(PostError::QueueFull)?;
        *e = RqEntry {
            state: RqState::Posted,
            wqe,
        };
        self.rq_tail = self.rq_tail.wrapping_add(1);
        Ok(())
    }

    /// A message with receive sequence number `rsn` would find no WQE posted for it, and the
    /// queue has room to post up to it (so WQEs pulled from a shared queue now can serve it).
    pub fn wants_recv(&self, rsn: u32) -> bool {
        let ahead = seq_diff(rsn, self.rq_tail);
        ahead >= 0 && (ahead as u64) < (RQ_DEPTH as u64).saturating_sub(self.rq_len() as u64)
    }

    fn rq_len(&self) -> usize {
        self.rq_tail.wrapping_sub(self.rq_head) as usize
    }

    /// The receive WQE with sequence number `rsn`, if posted and not yet completed.
    fn recv_wqe(&self, rsn: u32) -> Option<&RqEntry> {
        if seq_diff(rsn, self.rq_head) < 0 || seq_diff(rsn, self.rq_tail) >= 0 {
            return None;
        }
        self.rq.get(rsn as usize % RQ_DEPTH)
    }

    fn fail(&mut self, msn: u32, code: NakCode) -> Verdict {
        if self.unreliable {
            if let Some(s) = self.slots.get_mut(slot_index(msn)) {
                if s.msn == msn && s.state != SlotState::Free {
                    s.state = SlotState::Dropped(code);
                }
            }
            self.stats.dropped_messages += 1;
            return Verdict::Accept;
        }
        match self.error() {
            Some((m, _)) if seq_diff(m, msn) <= 0 => {}
            _ => {
                self.error_set = true;
                self.error_msn = msn;
                self.error_code = code as u8;
            }
        }
        if let Some(s) = self.slots.get_mut(slot_index(msn)) {
            if s.msn == msn && s.state != SlotState::Free {
                s.state = SlotState::Failed(code);
            }
        }
        Verdict::Nak(code, 0)
    }

    /// Checks the message window. `Err` carries the verdict for packets that need no work.
    fn window_check(&mut self, msn: u32) -> Result<(), Verdict> {
        let d = seq_diff(msn, self.completed);
        if d < 0 {
            self.stats.duplicates += 1;
            return Err(Verdict::Accept);
        }
        if let Some((m, code)) = self.error() {
            if seq_diff(msn, m) >= 0 {
                return Err(Verdict::Nak(code, 0));
            }
        }
        if d >= MSG_WINDOW as i32 {
            self.stats.dropped += 1;
            return Err(Verdict::Drop);
        }
        Ok(())
    }

    /// SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM data.
    #[allow(clippy::too_many_arguments)]
    pub fn on_data(
        &mut self,
        opcode: Opcode,
        msn: u32,
        rsn: u32,
        va: u64,
        rkey: u32,
        offset: u32,
        total_len: u32,
        imm: Option<u32>,
        solicited: bool,
        data: &[u8],
        mtu: u32,
        rnr_timer_us: u32,
        mem: &mut QpMem<'_, impl Memory>,
    ) -> Verdict {
        let dropped = self.stats.dropped_messages;
        let v = self.place_data(
            opcode,
            msn,
            rsn,
            va,
            rkey,
            offset,
            total_len,
            imm,
            solicited,
            data,
            mtu,
            rnr_timer_us,
            mem,
        );
        // A message an unreliable stream just dropped may be the one the completion point
        // waits for: it completes (without its data) now, and those after it that are done.
        if self.stats.dropped_messages != dropped {
            if let Some((m, code)) = self.advance(mem) {
                return Verdict::NakMsn(m, code);
            }
        }
        v
    }

    #[allow(clippy::too_many_arguments)]
    fn place_data(
        &mut self,
        opcode: Opcode,
        msn: u32,
        rsn: u32,
        va: u64,
        rkey: u32,
        offset: u32,
        total_len: u32,
        imm: Option<u32>,
        solicited: bool,
        data: &[u8],
        mtu: u32,
        rnr_timer_us: u32,
        mem: &mut QpMem<'_, impl Memory>,
    ) -> Verdict {
        if let Err(v) = self.window_check(msn) {
            return v;
        }
        let mtu = mtu.max(1);
        let consumes = opcode.consumes_recv();
        let is_send = opcode.is_send();
        let idx = slot_index(msn);
        let existing = self
            .slots
            .get(idx)
            .map(|s| s.state != SlotState::Free && s.msn == msn)
            .unwrap_or(false);
        if !existing {
            // First packet of this message to arrive: match it.
            let mut refused = None;
            if consumes {
                match self.recv_wqe(rsn) {
                    None if seq_diff(rsn, self.rq_tail) >= 0 => {
                        // No receive WQE posted yet.
                        self.stats.rnr_naks += 1;
                        return Verdict::Nak(NakCode::Rnr, rnr_timer_us);
                    }
                    None => refused = Some(NakCode::InvalidRequest),
                    Some(rq) if rq.state != RqState::Posted => {
                        refused = Some(NakCode::InvalidRequest);
                    }
                    // Receive buffer too small (the requester sees an invalid request).
                    Some(rq) if is_send && total_len > rq.wqe.local.total() => {
                        refused = Some(NakCode::InvalidRequest);
                    }
                    Some(_) => {}
                }
            }
            if let (Some(code), false) = (refused, self.unreliable) {
                return self.fail(msn, code);
            }
            let Some(s) = self.slots.get_mut(idx) else {
                return Verdict::Drop;
            };
            *s = Slot {
                state: SlotState::Receiving,
                msn,
                opcode,
                total_len,
                n_segs: segments(total_len, mtu),
                segs: SegWindow::new(),
                rsn,
                // (A WRITE's; checked against the others' in `write_behind_newer`.)
                va: va.wrapping_sub(u64::from(offset)),
                rkey,
                ..Slot::free()
            };
            // An unreliable stream's refused message keeps its slot, dropped, so that it
            // completes in its turn.
            if let Some(code) = refused {
                return self.fail(msn, code);
            }
        }
        let Some(s) = self.slots.get_mut(idx) else {
            return Verdict::Drop;
        };
        match s.state {
            SlotState::Failed(code) => return Verdict::Nak(code, 0),
            SlotState::Done => {
                self.stats.duplicates += 1;
                return Verdict::Accept;
            }
            // The rest of a dropped message: taken, not placed.
            SlotState::Dropped(_) => return Verdict::Accept,
            _ => {}
        }
        // Every packet must agree with the message and sit on an MTU boundary.
        let expect_len = total_len.saturating_sub(offset).min(mtu);
        if s.opcode != opcode
            || s.total_len != total_len
            || (consumes && s.rsn != rsn)
            || (!is_send && (s.rkey != rkey || s.va != va.wrapping_sub(u64::from(offset))))
            || !offset.is_multiple_of(mtu)
            || data.len() != expect_len as usize
        {
            return self.fail(msn, NakCode::InvalidRequest);
        }
        let seg = offset / mtu;
        if s.segs.is_done(seg) {
            self.stats.duplicates += 1;
            return Verdict::Accept;
        }
        if !s.segs.in_window(seg) {
            self.stats.dropped += 1;
            return Verdict::Drop;
        }
        let placed = if is_send {
            let rsn = s.rsn;
            match self.recv_wqe(rsn) {
                Some(rq) => {
                    let sgl = rq.wqe.local;
                    sgl.for_each_piece(offset, data.len(), |sge, off, r| {
                        mem.write_local(sge, off, data.get(r).unwrap_or(&[]))
                    })
                }
                None => Err(AccessError::Length),
            }
        } else if data.is_empty() {
            Ok(())
        } else {
            match va.checked_add(data.len() as u64) {
                // An older WRITE than one that placed data: it may find that one's bytes.
                // (Further ahead than the window is a value left from 2^31 messages ago.)
                Some(_) if (1..MSG_WINDOW as i32).contains(&seq_diff(self.newest_write, msn)) => {
                    self.write_behind_newer(msn, va, rkey, data, mtu, mem)
                }
                Some(_) => {
                    self.newest_write = msn;
                    mem.write_remote(rkey, va, data)
                }
                None => Err(AccessError::Bounds),
            }
        };
        if let Err(e) = placed {
            let code = if is_send {
                NakCode::RemoteOperational
            } else {
                access_nak(e)
            };
            return self.fail(msn, code);
        }
        let Some(s) = self.slots.get_mut(idx) else {
            return Verdict::Drop;
        };
        s.segs.mark_done(seg);
        if let Some(v) = imm {
            s.imm = v;
            s.has_imm = true;
        }
        s.solicited |= solicited;
        self.stats.placed_bytes += data.len() as u64;
        if s.segs.complete(s.n_segs) {
            s.state = SlotState::Done;
            if let Some((m, code)) = self.advance(mem) {
                return Verdict::NakMsn(m, code);
            }
        }
        Verdict::Accept
    }

    /// Places WRITE data of message `msn` (`data` at `va` under `rkey`) around the bytes newer
    /// WRITEs of the stream placed there already, under the same key: in-order execution
    /// leaves theirs. Bytes a newer WRITE has not placed yet are written: its packet
    /// overwrites them when it comes. A newer message that completed would mean `msn` did,
    /// so every one that matters still has its slot, with its placed segments. The work is
    /// bounded by the slot window: each pass over the slots finds the first newer placed
    /// range left in the packet's, of at most two segments a slot (a packet is one MTU).
    fn write_behind_newer(
        &mut self,
        msn: u32,
        va: u64,
        rkey: u32,
        data: &[u8],
        mtu: u32,
        mem: &mut QpMem<'_, impl Memory>,
    ) -> Result<(), AccessError> {
        let len = u32::try_from(data.len()).map_err(|_| AccessError::Bounds)?;
        let end = va.checked_add(u64::from(len)).ok_or(AccessError::Bounds)?;
        let Some(first) = self.newer_placed(msn, rkey, va, end, mtu) else {
            return mem.write_remote(rkey, va, data);
        };
        // Judged as a whole, as the packet written whole would be.
        mem.check_remote(rkey, va, len, Access::Write)?;
        self.stats.behind_newer += 1;
        let (mut pos, mut next) = (va, Some(first));
        while pos < end {
            // Bytes up to the next newer range are written; the range is skipped.
            let (stop, skip_to) = match next {
                Some((start, stop)) => (start, stop.min(end)),
                None => (end, end),
            };
            if stop > pos {
                let piece = usize::try_from(pos - va)
                    .ok()
                    .zip(usize::try_from(stop - va).ok());
                let bytes = piece.and_then(|(a, b)| data.get(a..b)).unwrap_or(&[]);
                mem.write_remote(rkey, pos, bytes)?;
            }
            pos = skip_to;
            next = self.newer_placed(msn, rkey, pos, end, mtu);
        }
        Ok(())
    }

    /// The first range in `[pos, end)` that a WRITE newer than `msn` placed under `rkey`
    /// (of those starting first, the longest), cut to start at `pos` at the earliest.
    fn newer_placed(
        &self,
        msn: u32,
        rkey: u32,
        pos: u64,
        end: u64,
        mtu: u32,
    ) -> Option<(u64, u64)> {
        let mtu = u64::from(mtu.max(1));
        let mut first: Option<(u64, u64)> = None;
        for t in self.slots.iter() {
            if t.state == SlotState::Free
                || !matches!(t.opcode, Opcode::RdmaWrite | Opcode::RdmaWriteWithImm)
                || t.rkey != rkey
                || seq_diff(t.msn, msn) <= 0
            {
                continue;
            }
            let Some(t_end) = t.va.checked_add(u64::from(t.total_len)) else {
                continue;
            };
            let (lo, hi) = (pos.max(t.va), end.min(t_end));
            if lo >= hi {
                continue;
            }
            // The newer message's segments over [lo, hi).
            for seg in (lo - t.va) / mtu..=(hi - 1 - t.va) / mtu {
                let Ok(seg32) = u32::try_from(seg) else {
                    break;
                };
                if !t.segs.is_done(seg32) {
                    continue;
                }
                let s_start = t.va + seg * mtu;
                let range = (s_start.max(pos), s_start.saturating_add(mtu).min(t_end));
                first = match first {
                    Some(f) if f.0 < range.0 || (f.0 == range.0 && f.1 >= range.1) => Some(f),
                    _ => Some(range),
                };
            }
        }
        first
    }

    /// Claims a response slot for `msn`, or None when all are busy.
    fn new_response(&mut self, msn: u32, kind: ResponseKind, n_segs: u32, ready: bool) -> bool {
        match self.resps.iter_mut().find(|r| !r.used) {
            Some(r) => {
                *r = Response {
                    used: true,
                    ready,
                    msn,
                    kind,
                    n_segs,
                    segs: SegWindow::new(),
                };
                true
            }
            None => false,
        }
    }

    /// Claims the assembly slot for a single-packet request; Err if it was seen already.
    fn single_packet_slot(&mut self, msn: u32, opcode: Opcode) -> Result<(), Verdict> {
        let idx = slot_index(msn);
        let s = self.slots.get_mut(idx).ok_or(Verdict::Drop)?;
        if s.state != SlotState::Free && s.msn == msn {
            return Err(match s.state {
                SlotState::Failed(code) => Verdict::Nak(code, 0),
                _ => Verdict::Accept,
            });
        }
        *s = Slot {
            state: SlotState::Receiving,
            msn,
            opcode,
            n_segs: 1,
            ..Slot::free()
        };
        Ok(())
    }

    fn done_single(
        &mut self,
        msn: u32,
        mem: &mut QpMem<'_, impl Memory>,
    ) -> Option<(u32, NakCode)> {
        if let Some(s) = self.slots.get_mut(slot_index(msn)) {
            s.state = SlotState::Done;
        }
        self.advance(mem)
    }

    /// RDMA READ request: validate the whole range now, then serve it from a response slot.
    pub fn on_read_request(
        &mut self,
        msn: u32,
        va: u64,
        rkey: u32,
        len: u32,
        mtu: u32,
        mem: &mut QpMem<'_, impl Memory>,
    ) -> Verdict {
        if let Err(v) = self.window_check(msn) {
            return v;
        }
        if self.unreliable {
            return self.drop_unsupported(msn, Opcode::ReadRequest, mem);
        }
        let idx = slot_index(msn);
        if self
            .slots
            .get(idx)
            .is_some_and(|s| s.state != SlotState::Free && s.msn == msn)
        {
            return self
                .single_packet_slot(msn, Opcode::ReadRequest)
                .err()
                .unwrap_or(Verdict::Accept);
        }
        if va.checked_add(u64::from(len)).is_none() {
            return self.fail_new(msn, Opcode::ReadRequest, NakCode::RemoteAccess);
        }
        if let Err(e) = mem.check_remote(rkey, va, len, Access::Read) {
            return self.fail_new(msn, Opcode::ReadRequest, access_nak(e));
        }
        // Served once the completion point reaches it (`execute`): it reads what every
        // earlier WRITE placed.
        if !self.new_response(
            msn,
            ResponseKind::Read { va, rkey, len },
            segments(len, mtu),
            false,
        ) {
            self.stats.dropped += 1;
            return Verdict::Drop;
        }
        if let Err(v) = self.single_packet_slot(msn, Opcode::ReadRequest) {
            return v;
        }
        if let Some((m, code)) = self.done_single(msn, mem) {
            return Verdict::NakMsn(m, code);
        }
        Verdict::Accept
    }

    /// CMP_SWP, FETCH_ADD, ATOMIC WRITE or FLUSH (one packet, `AtomicExt`'s fields): taken now,
    /// carried out exactly once when the completion point reaches it (`execute`), after every
    /// earlier message's data is placed: an atomic sees an earlier WRITE to its word, an
    /// ATOMIC WRITE lands after the data it flags, a FLUSH covers what came before it. An
    /// atomic's response slot is claimed now (the request is not taken without one); its
    /// result is kept there for resending.
    #[allow(clippy::too_many_arguments)]
    pub fn on_atomic(
        &mut self,
        msn: u32,
        va: u64,
        rkey: u32,
        compare: u64,
        swap_add: u64,
        opcode: Opcode,
        mem: &mut QpMem<'_, impl Memory>,
    ) -> Verdict {
        if let Err(v) = self.window_check(msn) {
            return v;
        }
        if self.unreliable {
            return self.drop_unsupported(msn, opcode, mem);
        }
        let idx = slot_index(msn);
        if self
            .slots
            .get(idx)
            .is_some_and(|s| s.state != SlotState::Free && s.msn == msn)
        {
            return self
                .single_packet_slot(msn, opcode)
                .err()
                .unwrap_or(Verdict::Accept);
        }
        let responds = matches!(opcode, Opcode::CmpSwap | Opcode::FetchAdd);
        if responds && !self.resps.iter().any(|r| !r.used) {
            self.stats.dropped += 1;
            return Verdict::Drop;
        }
        if let Err(v) = self.single_packet_slot(msn, opcode) {
            return v;
        }
        if let Some(s) = self.slots.get_mut(idx) {
            s.va = va;
            s.rkey = rkey;
            s.compare = compare;
            s.swap_add = swap_add;
        }
        if responds {
            // There is room (checked above).
            self.new_response(msn, ResponseKind::Atomic { orig: 0 }, 1, false);
        }
        if let Some((m, code)) = self.done_single(msn, mem) {
            return Verdict::NakMsn(m, code);
        }
        Verdict::Accept
    }

    /// Carries out what message `s` does once every earlier one is complete: a READ's or an
    /// atomic's response becomes ready to send (the atomic executed), an ATOMIC WRITE stores,
    /// a FLUSH flushes, a SEND_WITH_INV invalidates its rkey. The NAK code if that fails.
    fn execute(&mut self, s: &Slot, mem: &mut QpMem<'_, impl Memory>) -> Result<(), NakCode> {
        match s.opcode {
            // (A successful invalidation has nothing more to do.)
            Opcode::SendWithInv if !s.has_imm || mem.invalidate(s.imm).is_err() => {
                self.stats.invalidate_errors += 1;
                return Err(NakCode::InvalidRequest);
            }
            Opcode::ReadRequest => {
                if let Some(r) = self.response(s.msn) {
                    r.ready = true;
                }
            }
            Opcode::CmpSwap | Opcode::FetchAdd => {
                let op = if s.opcode == Opcode::CmpSwap {
                    AtomicOp::CompareSwap {
                        compare: s.compare,
                        swap: s.swap_add,
                    }
                } else {
                    AtomicOp::FetchAdd { add: s.swap_add }
                };
                match mem.atomic(s.rkey, s.va, op) {
                    Ok(orig) => {
                        if let Some(r) = self.response(s.msn) {
                            r.kind = ResponseKind::Atomic { orig };
                            r.ready = true;
                        }
                    }
                    Err(e) => {
                        self.abort_response(s.msn);
                        return Err(access_nak(e));
                    }
                }
            }
            Opcode::AtomicWrite => {
                // The bytes land in the order they travel (the value is them read as a
                // big-endian number).
                let value = u64::from_ne_bytes(s.swap_add.to_be_bytes());
                let op = AtomicOp::Write { value };
                mem.atomic(s.rkey, s.va, op).map_err(access_nak)?;
            }
            Opcode::Flush => {
                let (kind, level) = (s.compare as u8, (s.compare >> 8) as u8);
                if !matches!(kind, FLUSH_GLOBAL | FLUSH_PERSISTENT)
                    || level > FLUSH_REGION
                    || s.compare >> 16 != 0
                {
                    return Err(NakCode::InvalidRequest);
                }
                mem.flush(
                    s.rkey,
                    s.va,
                    s.swap_add,
                    kind == FLUSH_PERSISTENT,
                    level == FLUSH_REGION,
                )
                .map_err(access_nak)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// A request UC has no operation for (READ, an atomic, ATOMIC WRITE, FLUSH) on an
    /// unreliable stream: dropped, as any message that cannot be carried out there.
    fn drop_unsupported(
        &mut self,
        msn: u32,
        opcode: Opcode,
        mem: &mut QpMem<'_, impl Memory>,
    ) -> Verdict {
        if let Err(v) = self.single_packet_slot(msn, opcode) {
            return v;
        }
        self.fail(msn, NakCode::InvalidRequest);
        if let Some((m, code)) = self.advance(mem) {
            return Verdict::NakMsn(m, code);
        }
        Verdict::Accept
    }

    fn fail_new(&mut self, msn: u32, opcode: Opcode, code: NakCode) -> Verdict {
        let _ = self.single_packet_slot(msn, opcode);
        self.fail(msn, code)
    }

    /// Moves the completion point over complete messages, completing receive WQEs and
    /// carrying out what each does in message order (`execute`: a SEND_WITH_INV's
    /// invalidation after every earlier message's accesses, which may have used that rkey;
    /// READ and atomic responses; ATOMIC WRITE; FLUSH). A message that fails there fails the
    /// stream: returns its MSN and NAK code.
    fn advance(&mut self, mem: &mut QpMem<'_, impl Memory>) -> Option<(u32, NakCode)> {
        loop {
            if matches!(self.error(), Some((m, _)) if m == self.completed) {
                return None;
            }
            let idx = slot_index(self.completed);
            let mut s = self.slots.get(idx).copied()?;
            if s.msn != self.completed {
                return None;
            }
            if s.state == SlotState::Done {
                if let Err(code) = self.execute(&s, mem) {
                    if !self.unreliable {
                        let Verdict::Nak(code, _) = self.fail(s.msn, code) else {
                            return None;
                        };
                        return Some((s.msn, code));
                    }
                    self.stats.dropped_messages += 1;
                    s.state = SlotState::Dropped(code);
                }
            }
            if let SlotState::Dropped(code) = s.state {
                self.complete_dropped(&s, code);
                if let Some(slot) = self.slots.get_mut(idx) {
                    *slot = Slot::free();
                }
                self.completed = self.completed.wrapping_add(1);
                continue;
            }
            if s.state != SlotState::Done {
                return None;
            }
            let invalidated = s.opcode == Opcode::SendWithInv;
            if s.opcode.consumes_recv() {
                // byte_len is the message length for both (as rxe reports it).
                let opcode = if s.opcode == Opcode::RdmaWriteWithImm {
                    CqOpcode::RecvRdmaWithImm
                } else {
                    CqOpcode::Recv
                };
                let byte_len = s.total_len;
                if let Some(rq) = self.rq.get_mut(s.rsn as usize % RQ_DEPTH) {
                    rq.state = RqState::Done {
                        status: CqStatus::Success,
                        byte_len,
                        imm: s.has_imm.then_some(s.imm),
                        opcode,
                        solicited: s.solicited,
                        invalidated,
                    };
                }
            }
            if let Some(slot) = self.slots.get_mut(idx) {
                *slot = Slot::free();
            }
            self.stats.completed += 1;
            self.completed = self.completed.wrapping_add(1);
        }
    }

    /// A dropped message (an unreliable stream's) reached the completion point: the receive
    /// WQE it was to consume, if it names one still waiting, completes with the error's
    /// status; a WRITE without immediate completes nothing.
    fn complete_dropped(&mut self, s: &Slot, code: NakCode) {
        if !s.opcode.consumes_recv()
            || seq_diff(s.rsn, self.rq_head) < 0
            || seq_diff(s.rsn, self.rq_tail) >= 0
        {
            return;
        }
        let status = match code {
            NakCode::RemoteAccess => CqStatus::RemAccessErr,
            NakCode::RemoteOperational => CqStatus::LocProtErr,
            _ => CqStatus::RemInvReqErr,
        };
        let opcode = if s.opcode == Opcode::RdmaWriteWithImm {
            CqOpcode::RecvRdmaWithImm
        } else {
            CqOpcode::Recv
        };
        if let Some(rq) = self.rq.get_mut(s.rsn as usize % RQ_DEPTH) {
            if rq.state == RqState::Posted {
                rq.state = RqState::Done {
                    status,
                    byte_len: 0,
                    imm: None,
                    opcode,
                    solicited: false,
                    invalidated: false,
                };
            }
        }
    }

    /// Next response packet to send: a lost or unsent segment of the oldest response.
    pub fn next_segment(&self) -> Option<ResponseSegment> {
        let mut best: Option<ResponseSegment> = None;
        for r in self.resps.iter().filter(|r| r.used && r.ready) {
            if let Some(seg) = r.segs.next_unsent(r.n_segs) {
                let older = best.is_none_or(|b| seq_diff(r.msn, b.msn) < 0);
                if older {
                    best = Some(ResponseSegment {
                        msn: r.msn,
                        seg,
                        kind: r.kind,
                        retransmit: r.segs.was_sent(seg),
                    });
                }
            }
        }
        best
    }

    fn response(&mut self, msn: u32) -> Option<&mut Response> {
        self.resps.iter_mut().find(|r| r.used && r.msn == msn)
    }

    /// The response segment was handed to a path.
    pub fn mark_sent(&mut self, msn: u32, seg: u32) {
        if let Some(r) = self.response(msn) {
            r.segs.mark_sent(seg);
        }
    }

    /// A response packet was resolved on its path; fully acknowledged responses are freed.
    pub fn on_outcome(&mut self, msn: u32, seg: u32, outcome: Outcome) {
        let Some(r) = self.response(msn) else { return };
        match outcome {
            Outcome::Acked => {
                r.segs.mark_done(seg);
                if r.segs.complete(r.n_segs) {
                    r.used = false;
                }
            }
            Outcome::Lost | Outcome::TimedOut => r.segs.mark_lost(seg),
        }
    }

    /// The response's source could not be read any more: drop it (the caller NAKs).
    pub fn abort_response(&mut self, msn: u32) {
        if let Some(r) = self.response(msn) {
            r.used = false;
        }
    }

    /// Delivers the next receive completion in order; with the stream in error, posted
    /// receive WQEs are flushed.
    pub fn pop_completion(&mut self, stream: StreamId, src_qp: u32, in_error: bool) -> Option<Cqe> {
        if self.rq_head == self.rq_tail {
            return None;
        }
        let e = self.rq.get(self.rq_head as usize % RQ_DEPTH)?;
        let cqe = match e.state {
            RqState::Done {
                status,
                byte_len,
                imm,
                opcode,
                solicited,
                invalidated,
            } => Cqe {
                stream,
                wr_id: e.wqe.wr_id,
                status,
                opcode,
                byte_len,
                imm,
                invalidated,
                solicited,
                src_qp,
            },
            RqState::Posted if in_error => Cqe {
                stream,
                wr_id: e.wqe.wr_id,
                status: CqStatus::WrFlushErr,
                opcode: CqOpcode::Recv,
                byte_len: 0,
                imm: None,
                invalidated: false,
                solicited: false,
                src_qp,
            },
            RqState::Posted => return None,
        };
        self.rq_head = self.rq_head.wrapping_add(1);
        Some(cqe)
    }
}

fn access_nak(e: AccessError) -> NakCode {
    match e {
        AccessError::Alignment => NakCode::InvalidRequest,
        _ => NakCode::RemoteAccess,
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::memory::{SgList, Sge};
    use super::*;
    use proptest::strategy::Strategy;
    use std::vec::Vec;

    /// A receive WQE of one 8-byte SGE under lkey 1.
    fn recv8(wr_id: u64, addr: u64) -> RecvWqe {
        RecvWqe {
            wr_id,
            local: SgList::single(Sge {
                addr,
                len: 8,
                lkey: 1,
            }),
        }
    }

    /// One flat region: lkey/rkey 1 covers [0, len).
    struct Flat(Vec<u8>);

    impl Flat {
        fn range(
            &self,
            key: u32,
            va: u64,
            len: usize,
        ) -> Result<core::ops::Range<usize>, AccessError> {
            if key != 1 {
                return Err(AccessError::Key);
            }
            let s = usize::try_from(va).map_err(|_| AccessError::Bounds)?;
            let e = s.checked_add(len).ok_or(AccessError::Bounds)?;
            if e > self.0.len() {
                return Err(AccessError::Bounds);
            }
            Ok(s..e)
        }
    }

    impl Memory for Flat {
        fn read_local(
            &mut self,
            _qp: u32,
            sge: &Sge,
            offset: u32,
            out: &mut [u8],
        ) -> Result<(), AccessError> {
            let r = self.range(sge.lkey, sge.addr + u64::from(offset), out.len())?;
            out.copy_from_slice(&self.0[r]);
            Ok(())
        }
        fn write_local(
            &mut self,
            _qp: u32,
            sge: &Sge,
            offset: u32,
            data: &[u8],
        ) -> Result<(), AccessError> {
            let r = self.range(sge.lkey, sge.addr + u64::from(offset), data.len())?;
            self.0[r].copy_from_slice(data);
            Ok(())
        }
        fn check_remote(
            &mut self,
            _qp: u32,
            rkey: u32,
            va: u64,
            len: u32,
            _a: Access,
        ) -> Result<(), AccessError> {
            self.range(rkey, va, len as usize).map(|_| ())
        }
        fn write_remote(
            &mut self,
            _qp: u32,
            rkey: u32,
            va: u64,
            data: &[u8],
        ) -> Result<(), AccessError> {
            let r = self.range(rkey, va, data.len())?;
            self.0[r].copy_from_slice(data);
            Ok(())
        }
        fn read_remote(
            &mut self,
            _qp: u32,
            rkey: u32,
            va: u64,
            out: &mut [u8],
        ) -> Result<(), AccessError> {
            let r = self.range(rkey, va, out.len())?;
            out.copy_from_slice(&self.0[r]);
            Ok(())
        }
        fn atomic(
            &mut self,
            _qp: u32,
            rkey: u32,
            va: u64,
            op: AtomicOp,
        ) -> Result<u64, AccessError> {
            let r = self.range(rkey, va, 8)?;
            let old = u64::from_ne_bytes(self.0[r.clone()].try_into().unwrap());
            let new = op.apply(old);
            self.0[r].copy_from_slice(&new.to_ne_bytes());
            Ok(old)
        }
        /// Key 1 allows a global flush, not a persistent one; byte 62 counts flushes.
        fn flush(
            &mut self,
            _qp: u32,
            rkey: u32,
            va: u64,
            len: u64,
            persistent: bool,
            whole_region: bool,
        ) -> Result<(), AccessError> {
            if !whole_region {
                self.range(
                    rkey,
                    va,
                    usize::try_from(len).map_err(|_| AccessError::Bounds)?,
                )?;
            } else if rkey != 1 {
                return Err(AccessError::Key);
            }
            if persistent {
                return Err(AccessError::Permission);
            }
            self.0[62] += 1;
            Ok(())
        }
        /// Keys 7 and 8 are windows; the region's last byte records the last invalidated.
        fn invalidate(&mut self, _qp: u32, rkey: u32) -> Result<(), AccessError> {
            if !(7..=8).contains(&rkey) {
                return Err(AccessError::Key);
            }
            if let Some(b) = self.0.last_mut() {
                *b = rkey as u8;
            }
            Ok(())
        }
    }

    fn send(
        r: &mut Responder,
        mem: &mut QpMem<'_, Flat>,
        msn: u32,
        rsn: u32,
        off: u32,
        total: u32,
        byte: u8,
    ) -> Verdict {
        let len = total.saturating_sub(off).min(4) as usize;
        let data = std::vec![byte; len];
        r.on_data(
            Opcode::Send,
            msn,
            rsn,
            0,
            0,
            off,
            total,
            None,
            false,
            &data,
            4,
            100,
            mem,
        )
    }

    #[test]
    fn send_with_inv_invalidates_in_message_order() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        for wr_id in [20, 21] {
            r.post_recv(recv8(wr_id, 32)).unwrap();
        }
        let data = |op,
                    msn,
                    rsn,
                    off: u32,
                    total: u32,
                    imm,
                    mem: &mut QpMem<'_, Flat>,
                    r: &mut Responder| {
            let len = total.saturating_sub(off).min(4) as usize;
            let d = std::vec![0x5a; len];
            let va = 8 + u64::from(off);
            r.on_data(op, msn, rsn, va, 1, off, total, imm, false, &d, 4, 100, mem)
        };
        // Message 0, a WRITE (perhaps through the window message 1 invalidates), has its
        // second half missing when message 1, SEND_WITH_INV of rkey 7, is all there.
        assert_eq!(
            data(Opcode::RdmaWrite, 0, 0, 0, 8, None, &mut mem, &mut r),
            Verdict::Accept
        );
        let last = Some(7);
        assert_eq!(
            data(Opcode::SendWithInv, 1, 0, 0, 4, last, &mut mem, &mut r),
            Verdict::Accept
        );
        assert_eq!(
            mem.mem.0[63], 0,
            "not invalidated before the WRITE before it is complete"
        );
        assert!(r.pop_completion(StreamId(0), 0, false).is_none());
        assert_eq!(
            data(Opcode::RdmaWrite, 0, 0, 4, 8, None, &mut mem, &mut r),
            Verdict::Accept
        );
        assert_eq!(mem.mem.0[63], 7, "invalidated in message order");
        let c = r.pop_completion(StreamId(0), 0, false).unwrap();
        assert_eq!((c.wr_id, c.imm, c.invalidated), (20, Some(7), true));
        // An rkey the QP may not invalidate fails the message (an invalid request).
        let v = data(Opcode::SendWithInv, 2, 1, 0, 4, Some(9), &mut mem, &mut r);
        assert_eq!(v, Verdict::NakMsn(2, NakCode::InvalidRequest));
        assert_eq!(r.failed(), Some(NakCode::InvalidRequest));
        assert_eq!(r.stats.invalidate_errors, 1);
        assert_eq!(mem.mem.0[63], 7);
        assert!(r.pop_completion(StreamId(0), 0, false).is_none());
    }

    /// An unreliable (UC) stream drops what fails and goes on: a WRITE with a bad rkey
    /// (nothing placed, no completion), a WRITE_WITH_IMM with one (its receive WQE completes
    /// with a remote access error), a SEND longer than its buffer (an invalid request), the
    /// rest of each taken and ignored; the SEND after them lands and completes in order. An
    /// RC stream fails at the first.
    #[test]
    fn an_unreliable_stream_drops_failed_messages_and_goes_on() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        r.set_unreliable(true);
        r.reset(0);
        for wr_id in [30, 31, 32] {
            r.post_recv(recv8(wr_id, 32)).unwrap();
        }
        let pkt = |op,
                   msn,
                   rsn,
                   rkey,
                   off: u32,
                   total: u32,
                   imm,
                   r: &mut Responder,
                   mem: &mut QpMem<'_, Flat>| {
            let len = total.saturating_sub(off).min(4) as usize;
            let d = std::vec![0x77; len];
            r.on_data(
                op, msn, rsn, 0, rkey, off, total, imm, false, &d, 4, 100, mem,
            )
        };
        // Message 0: a WRITE of 8 bytes with rkey 9 (no such key), both packets.
        assert_eq!(
            pkt(Opcode::RdmaWrite, 0, 0, 9, 0, 8, None, &mut r, &mut mem),
            Verdict::Accept
        );
        // Dropped at its first packet: the completion point moves past it at once (the
        // requester's completion waits for it).
        assert_eq!(r.completed_msn(), 1);
        assert_eq!(
            pkt(Opcode::RdmaWrite, 0, 0, 9, 4, 8, None, &mut r, &mut mem),
            Verdict::Accept
        );
        // Message 1: WRITE_WITH_IMM with rkey 9, consuming receive 0 (wr_id 30).
        let imm = Some(5);
        assert_eq!(
            pkt(
                Opcode::RdmaWriteWithImm,
                1,
                0,
                9,
                0,
                4,
                imm,
                &mut r,
                &mut mem
            ),
            Verdict::Accept
        );
        // Message 2: a SEND of 12 bytes into an 8-byte buffer (receive 1, wr_id 31).
        for off in [0, 4, 8] {
            assert_eq!(
                pkt(Opcode::Send, 2, 1, 0, off, 12, None, &mut r, &mut mem),
                Verdict::Accept
            );
        }
        // Message 3: a SEND that fits (receive 2, wr_id 32).
        assert_eq!(
            pkt(Opcode::Send, 3, 2, 0, 0, 4, None, &mut r, &mut mem),
            Verdict::Accept
        );
        // Message 4: a READ request, which UC has not: dropped too.
        assert_eq!(r.on_read_request(4, 0, 1, 8, 4, &mut mem), Verdict::Accept);
        assert_eq!(r.failed(), None);
        assert_eq!(r.completed_msn(), 5);
        assert_eq!(r.stats.dropped_messages, 4);
        assert!(
            mem.mem.0[..32].iter().all(|&b| b == 0),
            "nothing written through the bad key"
        );
        assert_eq!(&mem.mem.0[32..36], &[0x77; 4]);
        let c = r.pop_completion(StreamId(0), 0, false).unwrap();
        assert_eq!((c.wr_id, c.status), (30, CqStatus::RemAccessErr));
        let c = r.pop_completion(StreamId(0), 0, false).unwrap();
        assert_eq!((c.wr_id, c.status), (31, CqStatus::RemInvReqErr));
        let c = r.pop_completion(StreamId(0), 0, false).unwrap();
        assert_eq!((c.wr_id, c.status, c.byte_len), (32, CqStatus::Success, 4));
        assert!(r.pop_completion(StreamId(0), 0, false).is_none());

        // The same first message on an RC stream fails it.
        let mut r = Responder::new();
        assert_eq!(
            pkt(Opcode::RdmaWrite, 0, 0, 9, 0, 8, None, &mut r, &mut mem),
            Verdict::Nak(NakCode::RemoteAccess, 0)
        );
        assert_eq!(r.failed(), Some(NakCode::RemoteAccess));
    }

    /// A message that fails when an earlier one's last packet moves the completion point to
    /// it is NAKed by its own MSN: the earlier one succeeded.
    #[test]
    fn a_failure_reached_through_an_earlier_message_naks_the_failed_one() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        r.post_recv(recv8(1, 32)).unwrap();
        let write = |off, r: &mut Responder, mem: &mut QpMem<'_, Flat>| {
            r.on_data(
                Opcode::RdmaWrite,
                0,
                0,
                8 + u64::from(off),
                1,
                off,
                8,
                None,
                false,
                &[1; 4],
                4,
                100,
                mem,
            )
        };
        assert_eq!(write(0, &mut r, &mut mem), Verdict::Accept);
        let v = r.on_data(
            Opcode::SendWithInv,
            1,
            0,
            0,
            0,
            0,
            4,
            Some(9),
            false,
            &[2; 4],
            4,
            100,
            &mut mem,
        );
        assert_eq!(v, Verdict::Accept, "judged only at the completion point");
        assert_eq!(
            write(4, &mut r, &mut mem),
            Verdict::NakMsn(1, NakCode::InvalidRequest)
        );
        assert_eq!(r.completed_msn(), 1, "the WRITE completed");
        assert_eq!(r.failed(), Some(NakCode::InvalidRequest));
    }

    #[test]
    fn out_of_order_send_placement_and_in_order_completion() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        r.post_recv(recv8(10, 0)).unwrap();
        r.post_recv(recv8(11, 16)).unwrap();
        // Message 1 arrives complete before message 0.
        assert_eq!(send(&mut r, &mut mem, 1, 1, 0, 3, 0xbb), Verdict::Accept);
        assert!(r.pop_completion(StreamId(0), 0, false).is_none());
        assert_eq!(send(&mut r, &mut mem, 0, 0, 4, 8, 0xa2), Verdict::Accept);
        assert_eq!(send(&mut r, &mut mem, 0, 0, 4, 8, 0xa2), Verdict::Accept); // duplicate
        assert_eq!(r.stats.duplicates, 1);
        assert_eq!(r.completed_msn(), 0);
        assert_eq!(send(&mut r, &mut mem, 0, 0, 0, 8, 0xa1), Verdict::Accept);
        assert_eq!(r.completed_msn(), 2);
        assert_eq!(
            &mem.mem.0[0..8],
            &[0xa1, 0xa1, 0xa1, 0xa1, 0xa2, 0xa2, 0xa2, 0xa2]
        );
        assert_eq!(&mem.mem.0[16..19], &[0xbb; 3]);
        let c = r.pop_completion(StreamId(0), 0, false).unwrap();
        assert_eq!((c.wr_id, c.byte_len), (10, 8));
        assert_eq!(r.pop_completion(StreamId(0), 0, false).unwrap().wr_id, 11);
        // Late duplicate of a completed message.
        assert_eq!(send(&mut r, &mut mem, 0, 0, 0, 8, 0xff), Verdict::Accept);
        assert_eq!(mem.mem.0[0], 0xa1);
    }

    #[test]
    fn rnr_then_accept() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        assert_eq!(
            send(&mut r, &mut mem, 0, 0, 0, 4, 1),
            Verdict::Nak(NakCode::Rnr, 100)
        );
        r.post_recv(recv8(1, 0)).unwrap();
        assert_eq!(send(&mut r, &mut mem, 0, 0, 0, 4, 1), Verdict::Accept);
        assert_eq!(r.completed_msn(), 1);
    }

    #[test]
    fn bad_rkey_fails_and_blocks_later_messages() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        let v = r.on_data(
            Opcode::RdmaWrite,
            0,
            0,
            0,
            9,
            0,
            4,
            None,
            false,
            &[1, 2, 3, 4],
            4,
            100,
            &mut mem,
        );
        assert_eq!(v, Verdict::Nak(NakCode::RemoteAccess, 0));
        assert_eq!(r.failed(), Some(NakCode::RemoteAccess));
        let v = r.on_data(
            Opcode::RdmaWrite,
            1,
            0,
            0,
            1,
            0,
            4,
            None,
            false,
            &[1, 2, 3, 4],
            4,
            100,
            &mut mem,
        );
        assert_eq!(v, Verdict::Nak(NakCode::RemoteAccess, 0));
        assert_eq!(mem.mem.0[0], 0);
    }

    #[test]
    fn window_and_misaligned_packets() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        let v = r.on_data(
            Opcode::RdmaWrite,
            MSG_WINDOW,
            0,
            0,
            1,
            0,
            4,
            None,
            false,
            &[1; 4],
            4,
            100,
            &mut mem,
        );
        assert_eq!(v, Verdict::Drop);
        let v = r.on_data(
            Opcode::RdmaWrite,
            0,
            0,
            2,
            1,
            2,
            8,
            None,
            false,
            &[1; 4],
            4,
            100,
            &mut mem,
        );
        assert_eq!(v, Verdict::Nak(NakCode::InvalidRequest, 0));
    }

    #[test]
    fn read_and_atomic_responses() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        mem.mem.0[8..16].copy_from_slice(&5u64.to_ne_bytes());
        let mut r = Responder::new();
        assert_eq!(r.on_read_request(0, 0, 1, 10, 4, &mut mem), Verdict::Accept);
        assert_eq!(r.on_read_request(0, 0, 1, 10, 4, &mut mem), Verdict::Accept);
        assert_eq!(
            r.on_read_request(1, 60, 1, 10, 4, &mut mem),
            Verdict::Nak(NakCode::RemoteAccess, 0)
        );
        let mut r = Responder::new();
        r.on_read_request(0, 0, 1, 10, 4, &mut mem);
        assert_eq!(
            r.on_atomic(1, 8, 1, 0, 3, Opcode::FetchAdd, &mut mem),
            Verdict::Accept
        );
        assert_eq!(
            r.on_atomic(1, 8, 1, 0, 3, Opcode::FetchAdd, &mut mem),
            Verdict::Accept
        );
        assert_eq!(
            u64::from_ne_bytes(mem.mem.0[8..16].try_into().unwrap()),
            8,
            "executed once"
        );
        let mut segs = Vec::new();
        while let Some(s) = r.next_segment() {
            r.mark_sent(s.msn, s.seg);
            segs.push((s.msn, s.seg));
        }
        assert_eq!(segs, std::vec![(0, 0), (0, 1), (0, 2), (1, 0)]);
        r.on_outcome(0, 1, Outcome::Lost);
        assert_eq!(
            r.next_segment().map(|s| (s.msn, s.seg, s.retransmit)),
            Some((0, 1, true))
        );
        for seg in 0..3 {
            r.on_outcome(0, seg, Outcome::Acked);
        }
        r.on_outcome(1, 0, Outcome::Acked);
        assert!(r.next_segment().is_none());
        assert_eq!(r.completed_msn(), 2);
    }

    /// What a message does at the responder happens in message order, whatever order its
    /// packets arrive in: with a WRITE's second half late, a FETCH_ADD on its word, a READ of
    /// it, an ATOMIC WRITE and a FLUSH behind it all wait, then run in order.
    #[test]
    fn requests_behind_an_incomplete_write_run_in_message_order() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        let write = |off: u32, bytes: [u8; 4], r: &mut Responder, mem: &mut QpMem<'_, Flat>| {
            r.on_data(
                Opcode::RdmaWrite,
                0,
                0,
                16 + u64::from(off),
                1,
                off,
                8,
                None,
                false,
                &bytes,
                4,
                100,
                mem,
            )
        };
        // WRITE of 8 bytes at 16: 0x01010101, then the second half later.
        assert_eq!(write(0, [1; 4], &mut r, &mut mem), Verdict::Accept);
        let fa = r.on_atomic(1, 16, 1, 0, 1, Opcode::FetchAdd, &mut mem);
        assert_eq!(fa, Verdict::Accept);
        assert_eq!(r.on_read_request(2, 16, 1, 8, 4, &mut mem), Verdict::Accept);
        let aw = r.on_atomic(3, 24, 1, 0, 0x7777, Opcode::AtomicWrite, &mut mem);
        assert_eq!(aw, Verdict::Accept);
        let range = u64::from(FLUSH_GLOBAL);
        let fl = r.on_atomic(4, 16, 1, range, 16, Opcode::Flush, &mut mem);
        assert_eq!(fl, Verdict::Accept);
        assert_eq!(
            mem.mem.0[16..32],
            [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(mem.mem.0[62], 0, "no flush yet");
        assert!(
            r.next_segment().is_none(),
            "no response before the WRITE is complete"
        );
        assert_eq!(r.completed_msn(), 0);

        assert_eq!(write(4, [2; 4], &mut r, &mut mem), Verdict::Accept);
        assert_eq!(r.completed_msn(), 5);
        let written = u64::from_ne_bytes([1, 1, 1, 1, 2, 2, 2, 2]);
        let word = |m: &QpMem<'_, Flat>, at: usize| {
            u64::from_ne_bytes(m.mem.0[at..at + 8].try_into().unwrap())
        };
        assert_eq!(
            word(&mem, 16),
            written + 1,
            "the FETCH_ADD ran after the WRITE"
        );
        assert_eq!(mem.mem.0[24..32], 0x7777u64.to_be_bytes());
        assert_eq!(mem.mem.0[62], 1, "flushed once");
        let mut segs = Vec::new();
        while let Some(s) = r.next_segment() {
            r.mark_sent(s.msn, s.seg);
            segs.push((s.msn, s.seg, s.kind));
        }
        assert_eq!(segs.len(), 3);
        assert_eq!(segs[0].2, ResponseKind::Atomic { orig: written });
        assert_eq!(
            (segs[1].0, segs[2].0),
            (2, 2),
            "then the READ's two segments"
        );

        // A FLUSH the region does not allow (persistent) fails at its turn: remote access.
        let persistent = u64::from(FLUSH_PERSISTENT);
        let v = r.on_atomic(5, 16, 1, persistent, 8, Opcode::Flush, &mut mem);
        assert_eq!(v, Verdict::NakMsn(5, NakCode::RemoteAccess));
        assert_eq!(r.failed(), Some(NakCode::RemoteAccess));
    }

    /// An ATOMIC WRITE or an atomic on a bad key fails when its turn comes, by its own MSN.
    #[test]
    fn a_failed_atomic_naks_its_own_message() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        let v = r.on_atomic(0, 8, 5, 0, 1, Opcode::AtomicWrite, &mut mem);
        assert_eq!(v, Verdict::NakMsn(0, NakCode::RemoteAccess));
        let mut r = Responder::new();
        let v = r.on_atomic(0, 8, 5, 0, 1, Opcode::CmpSwap, &mut mem);
        assert_eq!(v, Verdict::NakMsn(0, NakCode::RemoteAccess));
        assert!(
            r.next_segment().is_none(),
            "no response for a failed atomic"
        );
        assert!(
            r.resps.iter().all(|x| !x.used),
            "its response slot is free again"
        );
    }

    /// Byte `k` of message `msn`'s data in the overlapping-WRITE tests: distinct per message
    /// (for up to 7 messages) and per position (within 32 bytes).
    fn pattern(msn: u32, k: u32) -> u8 {
        ((msn as u8 + 1) << 5) | (k as u8 & 0x1f)
    }

    /// Packet `off` of WRITE `i`, one of `writes` (va, len), sent with MTU 4 and rkey 1 as
    /// message `start + i`.
    fn write_packet(
        r: &mut Responder,
        mem: &mut QpMem<'_, Flat>,
        start: u32,
        writes: &[(u64, u32)],
        i: u32,
        off: u32,
    ) -> Verdict {
        let (va, len) = writes[i as usize];
        let data: Vec<u8> = (off..len.min(off + 4)).map(|k| pattern(i, k)).collect();
        r.on_data(
            Opcode::RdmaWrite,
            start.wrapping_add(i),
            0,
            va + u64::from(off),
            1,
            off,
            len,
            None,
            false,
            &data,
            4,
            100,
            mem,
        )
    }

    /// Every packet (message, offset) of `writes` with MTU 4.
    fn write_packets(writes: &[(u64, u32)]) -> Vec<(u32, u32)> {
        let mut p = Vec::new();
        for (msn, &(_, len)) in writes.iter().enumerate() {
            for off in (0..len.max(1)).step_by(4) {
                p.push((msn as u32, off));
            }
        }
        p
    }

    /// Delivers the packets of `writes` (va, len), messages from `start` on, in `order` and
    /// checks that memory ends as the WRITEs carried out one after the other leave it.
    fn check_writes_in_order(start: u32, writes: &[(u64, u32)], order: &[(u32, u32)]) {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        r.reset(start);
        for &(i, off) in order {
            let v = write_packet(&mut r, &mut mem, start, writes, i, off);
            assert_eq!(v, Verdict::Accept, "packet {i}/{off}");
        }
        let n = writes.len() as u32;
        assert_eq!(r.completed_msn(), start.wrapping_add(n));
        if order.windows(2).all(|w| w[0].0 <= w[1].0) {
            assert_eq!(
                r.stats.behind_newer, 0,
                "messages in order: nothing to look for"
            );
        }
        let mut expect = std::vec![0u8; 64];
        for (msn, &(va, len)) in writes.iter().enumerate() {
            for k in 0..len {
                expect[va as usize + k as usize] = pattern(msn as u32, k);
            }
        }
        assert_eq!(
            mem.mem.0, expect,
            "writes {writes:?}, packets in order {order:?}"
        );
    }

    /// A packet of a WRITE that arrives after a later WRITE placed the same bytes does not
    /// overwrite them: memory ends as in-order execution leaves it (an application rewriting
    /// one buffer, whose last bytes it polls, sees the newest data).
    #[test]
    fn an_older_write_arriving_late_does_not_overwrite_a_newer_one() {
        // Same va, one packet each; then three packets each, all of the newer one first.
        check_writes_in_order(0, &[(8, 4), (8, 4)], &[(1, 0), (0, 0)]);
        let same = [(8, 12), (8, 12)];
        check_writes_in_order(0, &same, &[(1, 0), (1, 4), (1, 8), (0, 0), (0, 4), (0, 8)]);
        // Interleaved: the older message's packets before, between and after the newer's.
        check_writes_in_order(0, &same, &[(0, 0), (1, 4), (1, 0), (0, 4), (0, 8), (1, 8)]);
        // In message order: no packet is older than the newest WRITE.
        check_writes_in_order(0, &same, &write_packets(&same));
        // Three WRITEs, the newest first: the middle one's late packets lose to the newest
        // only where it placed, and beat the oldest.
        let three = [(8, 12), (8, 12), (8, 12)];
        check_writes_in_order(
            0,
            &three,
            &[
                (2, 4),
                (1, 0),
                (1, 4),
                (1, 8),
                (0, 8),
                (0, 4),
                (0, 0),
                (2, 0),
                (2, 8),
            ],
        );
    }

    /// Partial overlaps at offsets that are not multiples of the MTU: a late packet is placed
    /// around what newer WRITEs placed.
    #[test]
    fn a_late_write_packet_is_placed_around_newer_partial_overlaps() {
        // 0: [0, 16); 1: [6, 13); 2: [3, 8); 3: [14, 15).
        let writes = [(0, 16), (6, 7), (3, 5), (14, 1)];
        let mut newest_first = write_packets(&writes);
        newest_first.reverse();
        check_writes_in_order(0, &writes, &newest_first);
        // The oldest message's packets last, the others in order.
        let mut order: Vec<(u32, u32)> = write_packets(&writes)
            .into_iter()
            .filter(|p| p.0 != 0)
            .collect();
        order.extend(write_packets(&writes[..1]));
        check_writes_in_order(0, &writes, &order);
        // Unaligned on both: 0: [1, 11); 1: [5, 14).
        let writes = [(1, 10), (5, 9)];
        let mut order = write_packets(&writes);
        order.reverse();
        check_writes_in_order(0, &writes, &order);
    }

    /// A WRITE_WITH_IMM's late packet loses to a newer WRITE the same way, and its message
    /// still completes with its immediate data.
    #[test]
    fn a_late_write_with_imm_packet_loses_to_a_newer_write() {
        let mut flat = Flat(std::vec![0; 64]);
        let mut mem = QpMem::new(&mut flat, 1);
        let mut r = Responder::new();
        r.post_recv(recv8(1, 48)).unwrap();
        let mut pkt = |op, msn, va, rkey, off: u32, byte: u8, imm| {
            r.on_data(
                op, msn, 0, va, rkey, off, 8, imm, false, &[byte; 4], 4, 100, &mut mem,
            )
        };
        // 0: WRITE_WITH_IMM [16, 24); 1: WRITE [16, 24).
        assert_eq!(
            pkt(Opcode::RdmaWrite, 1, 16, 1, 0, 0xb1, None),
            Verdict::Accept
        );
        let imm = Some(7);
        let with_imm = Opcode::RdmaWriteWithImm;
        assert_eq!(pkt(with_imm, 0, 16, 1, 0, 0xa1, None), Verdict::Accept);
        assert_eq!(pkt(with_imm, 0, 20, 1, 4, 0xa2, imm), Verdict::Accept);
        assert_eq!(
            pkt(Opcode::RdmaWrite, 1, 20, 1, 4, 0xb2, None),
            Verdict::Accept
        );
        assert_eq!(r.completed_msn(), 2);
        assert_eq!(
            mem.mem.0[16..24],
            [0xb1, 0xb1, 0xb1, 0xb1, 0xb2, 0xb2, 0xb2, 0xb2]
        );
        let c = r.pop_completion(StreamId(0), 0, false).unwrap();
        assert_eq!((c.wr_id, c.imm, c.byte_len), (1, imm, 8));
    }

    /// Every packet of a WRITE names the key and the address (its first byte's, less its
    /// offset) its first one did: where a WRITE placed is known from its segments.
    #[test]
    fn a_write_packet_that_disagrees_on_key_or_address_fails_its_message() {
        for (va, rkey) in [(21, 1), (20, 3)] {
            let mut flat = Flat(std::vec![0; 64]);
            let mut mem = QpMem::new(&mut flat, 1);
            let mut r = Responder::new();
            let mut pkt = |va, rkey, off| {
                r.on_data(
                    Opcode::RdmaWrite,
                    0,
                    0,
                    va,
                    rkey,
                    off,
                    8,
                    None,
                    false,
                    &[1; 4],
                    4,
                    100,
                    &mut mem,
                )
            };
            assert_eq!(pkt(16, 1, 0), Verdict::Accept);
            assert_eq!(pkt(va, rkey, 4), Verdict::Nak(NakCode::InvalidRequest, 0));
            assert_eq!(mem.mem.0[20..24], [0; 4], "{va} {rkey}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Any WRITEs (up to 7, any va and length, MTU 4), their packets in any order:
        /// memory ends as in-order execution leaves it.
        #[test]
        fn overlapping_writes_in_any_packet_order_end_as_in_order(
            start in (0u32..4).prop_map(|k| k.wrapping_sub(2)),
            (writes, order) in proptest::collection::vec((0u64..40, 0u32..24), 1..8)
                .prop_flat_map(|w| {
                    let p = write_packets(&w);
                    (proptest::strategy::Just(w), proptest::strategy::Just(p).prop_shuffle())
                })
        ) {
            check_writes_in_order(start, &writes, &order);
        }
    }
}
