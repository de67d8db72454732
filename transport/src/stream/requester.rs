// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Requester side of a stream: the send queue.
//!
//! Each posted WQE gets the next MSN (and, if it consumes a receive WQE at the peer, the next
//! RSN) and is cut into MTU-sized segments. A segment is "done" when its packet is acknowledged
//! on its path; lost segments become sendable again and go out as new packets on any path.
//! A message completes when the responder reports it complete in an ACK's stream entry (SEND,
//! WRITE) or when all its response data arrived (READ, atomics); completions are delivered in
//! posting order.

use super::super::connection::retransmit::Outcome;
use super::super::connection::sack::SegWindow;
use super::super::memory::{AccessError, Memory, QpMem};
use super::super::wire::{seq_diff, NakCode};
use super::super::zero::{zero_valid, ZeroValid};
use super::{
    CqStatus, Cqe, PostError, SendWqe, StreamId, WrOpcode, MAX_RD_ATOMIC, MSG_WINDOW, SQ_DEPTH,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum State {
    Pending = 0,
    Done(CqStatus),
}

/// Completion timeouts that count one retry while the connection delivers and the message's
/// paths are still recovering its packets (`Requester::on_timer`).
const SLOW_TIMEOUTS: u8 = 4;

// All-zero bytes are `Pending`, the variant written 0, which carries nothing (a `#[repr(u8)]`
// enum is its tag byte, then the variant's fields). Only the entries from `head` to `tail`
// are read, and `reset` writes every entry (`Entry::empty`).
impl ZeroValid for State {}

#[derive(Clone, Copy, Debug)]
struct Entry {
    state: State,
    wqe: SendWqe,
    opcode: WrOpcode,
    rsn: u32,
    /// Bytes on the wire in the request direction (0 for READ/atomic requests).
    len: u32,
    /// Request packets.
    n_segs: u32,
    out: SegWindow,
    /// READ: response segments received.
    resp: SegWindow,
    resp_segs: u32,
    attempt: u16,
    retries: u8,
    rnr_retries: u8,
    rnr_until: u64,
    /// The current attempt is a resend after a completion timeout.
    poke: bool,
    /// Completion timeouts passed while its paths were still recovering its packets on a
    /// connection that delivers (see `Requester::on_timer`), since the last retry counted.
    slow: u8,
}
zero_valid!(struct Entry {
    state, wqe, opcode, rsn, len, n_segs, out, resp, resp_segs, attempt, retries, rnr_retries,
    rnr_until, poke, slow,
});

impl Entry {
    fn empty() -> Self {
        Entry {
            state: State::Done(CqStatus::WrFlushErr),
            wqe: SendWqe::default(),
            opcode: WrOpcode::Send,
            rsn: 0,
            len: 0,
            n_segs: 1,
            out: SegWindow::new(),
            resp: SegWindow::new(),
            resp_segs: 0,
            attempt: 0,
            retries: 0,
            rnr_retries: 0,
            rnr_until: 0,
            poke: false,
            slow: 0,
        }
    }
}

/// A request packet the connection should send now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestSegment {
    /// Message.
    pub msn: u32,
    /// Segment (packet index) in the message.
    pub seg: u32,
    /// The message's attempt.
    pub attempt: u16,
    /// The segment was sent before.
    pub retransmit: bool,
}

/// Everything needed to build the packet for a [`RequestSegment`].
#[derive(Clone, Copy, Debug)]
pub struct SegmentInfo {
    /// The WQE.
    pub wqe: SendWqe,
    /// Its operation.
    pub opcode: WrOpcode,
    /// Receive sequence number (if it consumes a receive WQE).
    pub rsn: u32,
    /// Byte offset of this segment.
    pub offset: u32,
    /// Payload bytes of this segment.
    pub payload_len: u32,
    /// Message length (0 for READ/atomic requests).
    pub total_len: u32,
    /// First segment.
    pub first: bool,
    /// Last segment.
    pub last: bool,
}

/// What a response packet turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RespVerdict {
    /// New data placed (or a duplicate): acknowledge the packet.
    Accept,
    /// Outside the tracking window: do not acknowledge; the responder will resend it.
    Drop,
}

#[derive(Clone, Debug)]
/// A stream's send queue and its progress.
pub struct Requester {
    sq: [Entry; SQ_DEPTH],
    /// MSN of the oldest entry not yet delivered as a completion.
    head: u32,
    /// Next MSN to assign.
    tail: u32,
    next_rsn: u32,
    /// Every MSN before this one is complete at the responder.
    peer_completed: u32,
    /// Time of the last forward progress (for the completion timeout).
    last_progress: u64,
    /// Counters.
    pub stats: RequesterStats,
}
zero_valid!(struct Requester { sq, head, tail, next_rsn, peer_completed, last_progress, stats });

/// Requester counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequesterStats {
    /// WQEs posted.
    pub posted: u64,
    /// WQEs completed successfully.
    pub completed: u64,
    /// RNR NAKs received.
    pub rnr_naks: u64,
    /// Messages resent whole after a completion timeout.
    pub pokes: u64,
}
zero_valid!(struct RequesterStats { posted, completed, rnr_naks, pokes });

/// Number of MTU-sized packets for `len` bytes (at least one).
pub fn segments(len: u32, mtu: u32) -> u32 {
    let mtu = mtu.max(1);
    len.div_ceil(mtu).max(1)
}

impl Default for Requester {
    fn default() -> Self {
        Self::new()
    }
}

impl Requester {
    /// An empty send queue.
    pub fn new() -> Self {
        Requester {
            sq: [Entry::empty(); SQ_DEPTH],
            head: 0,
            tail: 0,
            next_rsn: 0,
            peer_completed: 0,
            last_progress: 0,
            stats: RequesterStats::default(),
        }
    }

    /// Re-initialises in place; the first message gets MSN and RSN `start`.
    pub fn reset(&mut self, start: u32) {
        for e in self.sq.iter_mut() {
            *e = Entry::empty();
        }
        self.head = start;
        self.tail = start;
        self.next_rsn = start;
        self.peer_completed = start;
        self.last_progress = 0;
        self.stats = RequesterStats::default();
    }

    fn entry(&mut self, msn: u32) -> Option<&mut Entry> {
        if seq_diff(msn, self.head) < 0 || seq_diff(msn, self.tail) >= 0 {
            return None;
        }
        self.sq.get_mut(msn as usize % SQ_DEPTH)
    }

    /// Send WQEs not yet completed (and not yet delivered).
    pub fn outstanding(&self) -> u32 {
        self.tail.wrapping_sub(self.head)
    }

    /// Queues a WQE; `failed` posts it straight into the flushed state (stream in error).
    pub fn post(
        &mut self,
        wqe: SendWqe,
        mtu: u32,
        now: u64,
        failed: bool,
    ) -> Result<(), PostError> {
        if self.outstanding() as usize >= SQ_DEPTH {
            return Err(PostError::QueueFull);
        }
        let opcode = wqe.opcode;
        let local_len = wqe.local.total();
        let (len, n_segs, resp_segs) = match opcode {
            WrOpcode::RdmaRead => (0, 1, segments(local_len, mtu)),
            WrOpcode::CmpSwap | WrOpcode::FetchAdd => {
                if local_len < 8 || !wqe.remote_va.is_multiple_of(8) {
                    return Err(PostError::InvalidWqe);
                }
                (0, 1, 1)
            }
            // One packet, acknowledged as a WRITE is; the value travels in the header.
            WrOpcode::AtomicWrite => {
                if !wqe.remote_va.is_multiple_of(8) {
                    return Err(PostError::InvalidWqe);
                }
                (0, 1, 0)
            }
            WrOpcode::Flush => (0, 1, 0),
            _ => (local_len, segments(local_len, mtu), 0),
        };
        if matches!(
            opcode,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead
        ) && wqe.remote_va.checked_add(u64::from(local_len)).is_none()
        {
            return Err(PostError::InvalidWqe);
        }
        let msn = self.tail;
        let rsn = if opcode.consumes_recv() {
            let r = self.next_rsn;
            self.next_rsn = r.wrapping_add(1);
            r
        } else {
            0
        };
        let e = Entry {
            state: if failed {
                State::Done(CqStatus::WrFlushErr)
            } else {
                State::Pending
            },
            wqe,
            opcode,
            rsn,
            len,
            n_segs,
            resp_segs,
            ..Entry::empty()
        };
        let slot = self
            .sq
            .get_mut(msn as usize % SQ_DEPTH)
            .ok_or(PostError::QueueFull)?;
        *slot = e;
        if self.outstanding() == 0 {
            self.last_progress = now;
        }
        self.tail = msn.wrapping_add(1);
        self.stats.posted += 1;
        Ok(())
    }

    /// The next request packet to send, oldest message first: a pending completion-timeout
    /// poke, else a lost or never-sent segment inside the windows.
    pub fn next_segment(&mut self, now: u64) -> Option<RequestSegment> {
        let limit = self.peer_completed.wrapping_add(MSG_WINDOW);
        let mut rd_atomic = 0u32;
        let mut msn = self.head;
        while msn != self.tail && seq_diff(msn, limit) < 0 {
            let e = self.sq.get_mut(msn as usize % SQ_DEPTH)?;
            match e.state {
                State::Done(s) if s != CqStatus::Success => return None, // nothing after an error
                State::Done(_) => {}
                State::Pending => {
                    let is_rd = e.opcode.is_read_or_atomic();
                    if is_rd {
                        rd_atomic += 1;
                    }
                    if e.rnr_until > now {
                        msn = msn.wrapping_add(1);
                        continue;
                    }
                    let fresh = !e.out.was_sent(0) && !e.poke;
                    if !(is_rd && fresh && rd_atomic > MAX_RD_ATOMIC) {
                        if let Some(seg) = e.out.next_unsent(e.n_segs) {
                            return Some(RequestSegment {
                                msn,
                                seg,
                                attempt: e.attempt,
                                retransmit: e.poke || e.out.was_sent(seg),
                            });
                        }
                    }
                }
            }
            msn = msn.wrapping_add(1);
        }
        None
    }

    /// Describes a segment for packet building.
    pub fn segment_info(&mut self, msn: u32, seg: u32, mtu: u32) -> Option<SegmentInfo> {
        let e = self.entry(msn)?;
        let mtu = mtu.max(1);
        let offset = seg.checked_mul(mtu)?;
        let payload_len = e.len.saturating_sub(offset).min(mtu);
        Some(SegmentInfo {
            wqe: e.wqe,
            opcode: e.opcode,
            rsn: e.rsn,
            offset,
            payload_len,
            total_len: e.len,
            first: seg == 0,
            last: seg.saturating_add(1) >= e.n_segs,
        })
    }

    /// The segment was handed to a path. The first sending of a segment of the oldest
    /// unfinished message restarts the completion timeout: it runs from when the message
    /// went out, not from when it was posted (as a NIC's transport timer starts with the
    /// transmission). Among thousands of streams taking turns on one connection, a message
    /// may wait seconds for its turn.
    pub fn mark_sent(&mut self, now: u64, msn: u32, seg: u32) {
        let Some(e) = self.entry(msn) else {
            return;
        };
        let fresh = !e.out.was_sent(seg);
        e.out.mark_sent(seg);
        // Only a first sending needs the scan for the oldest message (not a retransmission).
        if fresh && self.oldest_pending() == Some(msn) {
            self.last_progress = now;
        }
    }

    /// The oldest unfinished message has not all gone out yet, and no message waits out an
    /// RNR back-off: the requester waits for its turn to send (on a connection shared with
    /// other streams), not for the peer.
    pub fn waiting_for_turn(&self) -> bool {
        let mut msn = self.head;
        let mut oldest = None;
        while msn != self.tail {
            if let Some(e) = self.sq.get(msn as usize % SQ_DEPTH) {
                if e.state == State::Pending {
                    if e.rnr_until != 0 {
                        return false;
                    }
                    oldest = oldest.or(Some(e));
                }
            }
            msn = msn.wrapping_add(1);
        }
        oldest.is_some_and(|e| !e.out.was_sent(e.n_segs.saturating_sub(1)))
    }

    /// The MSN of the oldest message not yet done.
    fn oldest_pending(&self) -> Option<u32> {
        let mut msn = self.head;
        while msn != self.tail {
            if self.sq.get(msn as usize % SQ_DEPTH)?.state == State::Pending {
                return Some(msn);
            }
            msn = msn.wrapping_add(1);
        }
        None
    }

    /// Local memory could not be read for a segment: the WQE fails with a local error.
    pub fn fail_local(&mut self, msn: u32, err: AccessError) {
        if let Some(e) = self.entry(msn) {
            if e.state == State::Pending {
                e.state = State::Done(match err {
                    AccessError::Length => CqStatus::LocLenErr,
                    _ => CqStatus::LocProtErr,
                });
            }
        }
    }

    /// A request packet was resolved on its path: acknowledged, lost (resent at once) or timed
    /// out (resent; the path deals with its own timeout, see `on_timer` for retries).
    pub fn on_outcome(&mut self, now: u64, msn: u32, seg: u32, attempt: u16, outcome: Outcome) {
        let Some(e) = self.entry(msn) else {
            return;
        };
        if e.attempt != attempt || e.state != State::Pending {
            return;
        }
        match outcome {
            Outcome::Acked => {
                if e.out.mark_done(seg) {
                    self.last_progress = now;
                }
            }
            Outcome::Lost => e.out.mark_lost(seg),
            Outcome::TimedOut => {
                // A path timed out: that is the path's trouble (it backs off, changes entropy,
                // may be declared failed), and the data goes again on the others. The message
                // itself counts a retry only when the stream makes no progress for its
                // completion timeout (`on_timer`), as the verbs' retry_cnt means.
                e.out.mark_lost(seg);
            }
        }
    }

    /// Stream entry of an ACK: messages before `completed` are complete at the responder.
    pub fn on_stream_ack(&mut self, now: u64, completed: u32) {
        // Ignore regressions and claims beyond what was posted.
        if seq_diff(completed, self.peer_completed) <= 0 || seq_diff(completed, self.tail) > 0 {
            return;
        }
        let mut msn = self.peer_completed;
        while msn != completed {
            if let Some(e) = self.entry(msn) {
                if e.state == State::Pending && !e.opcode.is_read_or_atomic() {
                    e.state = State::Done(CqStatus::Success);
                }
            }
            msn = msn.wrapping_add(1);
        }
        self.peer_completed = completed;
        self.last_progress = now;
    }

    /// READ response data. Validates the placement against the WQE before writing.
    #[allow(clippy::too_many_arguments)]
    pub fn on_read_response(
        &mut self,
        now: u64,
        msn: u32,
        offset: u32,
        total_len: u32,
        data: &[u8],
        mtu: u32,
        mem: &mut QpMem<'_, impl Memory>,
    ) -> RespVerdict {
        let Some(e) = self.entry(msn) else {
            return RespVerdict::Accept;
        };
        if e.state != State::Pending || e.opcode != WrOpcode::RdmaRead {
            return RespVerdict::Accept; // late duplicate
        }
        let mtu = mtu.max(1);
        let seg = offset / mtu;
        let expect = e.wqe.local.total().saturating_sub(offset).min(mtu);
        if total_len != e.wqe.local.total()
            || !offset.is_multiple_of(mtu)
            || data.len() != expect as usize
            || seg >= e.resp_segs
        {
            // A response that does not fit the request: the READ fails.
            e.state = State::Done(CqStatus::RemInvReqErr);
            return RespVerdict::Accept;
        }
        if e.resp.is_done(seg) {
            return RespVerdict::Accept;
        }
        if !e.resp.in_window(seg) {
            return RespVerdict::Drop;
        }
        let res = e
            .wqe
            .local
            .for_each_piece(offset, data.len(), |sge, off, r| {
                mem.write_local(sge, off, data.get(r).unwrap_or(&[]))
            });
        if let Err(err) = res {
            e.state = State::Done(match err {
                AccessError::Length => CqStatus::LocLenErr,
                _ => CqStatus::LocProtErr,
            });
            return RespVerdict::Accept;
        }
        e.resp.mark_done(seg);
        if e.resp.complete(e.resp_segs) {
            e.state = State::Done(CqStatus::Success);
        }
        self.last_progress = now;
        RespVerdict::Accept
    }

    /// Atomic response: the original value goes to the first 8 bytes of the local buffer.
    pub fn on_atomic_response(
        &mut self,
        now: u64,
        msn: u32,
        orig: u64,
        mem: &mut QpMem<'_, impl Memory>,
    ) {
        let Some(e) = self.entry(msn) else { return };
        if e.state != State::Pending || !matches!(e.opcode, WrOpcode::CmpSwap | WrOpcode::FetchAdd)
        {
            return;
        }
        let bytes = orig.to_ne_bytes();
        let res = e.wqe.local.for_each_piece(0, 8, |sge, off, r| {
            mem.write_local(sge, off, bytes.get(r).unwrap_or(&[]))
        });
        e.state = State::Done(match res {
            Ok(()) => CqStatus::Success,
            Err(AccessError::Length) => CqStatus::LocLenErr,
            Err(_) => CqStatus::LocProtErr,
        });
        self.last_progress = now;
    }

    /// A NAK for message `msn`. RNR: the message restarts after the back-off (a new attempt;
    /// acknowledgements of the old one are ignored) unless `rnr_retry` is used up. Other codes
    /// fail the message.
    pub fn on_nak(&mut self, now: u64, msn: u32, code: NakCode, value: u32, rnr_retry: u8) {
        if code == NakCode::Rnr {
            self.stats.rnr_naks += 1;
        }
        let Some(e) = self.entry(msn) else { return };
        if e.state != State::Pending {
            return;
        }
        match code {
            NakCode::Rnr => {
                if rnr_retry != super::RNR_RETRY_INFINITE {
                    e.rnr_retries = e.rnr_retries.saturating_add(1);
                    if e.rnr_retries > rnr_retry {
                        e.state = State::Done(CqStatus::RnrRetryExcErr);
                        return;
                    }
                }
                // A burst of NAKs for one attempt (one per packet) restarts it once.
                if e.rnr_until > now {
                    return;
                }
                e.rnr_until = now.saturating_add(u64::from(value.max(1)).saturating_mul(1000));
                e.attempt = e.attempt.wrapping_add(1);
                e.out = SegWindow::new();
                e.poke = false;
                self.last_progress = now;
            }
            NakCode::OutOfWindow => {}
            _ => e.state = State::Done(CqStatus::from_nak(code)),
        }
    }

    /// Retry count exceeded (peer unreachable): the oldest pending WQE completes with
    /// RETRY_EXC_ERR; the stream goes to error and flushes the rest.
    pub fn fail_retry_exceeded(&mut self) {
        let mut msn = self.head;
        while msn != self.tail {
            if let Some(e) = self.entry(msn) {
                if e.state == State::Pending {
                    e.state = State::Done(CqStatus::RetryExcErr);
                    return;
                }
            }
            msn = msn.wrapping_add(1);
        }
    }

    /// Earliest time this requester needs attention: the completion timeout or an RNR back-off.
    pub fn deadline(&self, stall_timeout: u64) -> Option<u64> {
        let mut d: Option<u64> = None;
        let mut msn = self.head;
        let mut any_pending = false;
        while msn != self.tail {
            if let Some(e) = self.sq.get(msn as usize % SQ_DEPTH) {
                if e.state == State::Pending {
                    any_pending = true;
                    if e.rnr_until != 0 {
                        d = Some(d.map_or(e.rnr_until, |x| x.min(e.rnr_until)));
                    }
                }
            }
            msn = msn.wrapping_add(1);
        }
        if any_pending {
            let s = self.last_progress.saturating_add(stall_timeout);
            d = Some(d.map_or(s, |x| x.min(s)));
        }
        d
    }

    /// Timer: past RNR back-offs are cleared; on a completion timeout the oldest message whose
    /// packets are all acknowledged but which has not completed is resent whole (the
    /// responder answers with its state or the NAK again). Returns true when that exceeds the
    /// retry count. `delivering`: the connection had packets acknowledged within the
    /// timeout (then a message that has not all gone out is waiting for its turn, not for the
    /// peer, and counts no retry).
    pub fn on_timer(
        &mut self,
        now: u64,
        stall_timeout: u64,
        retry_cnt: u8,
        delivering: bool,
    ) -> bool {
        let mut msn = self.head;
        while msn != self.tail {
            if let Some(e) = self.sq.get_mut(msn as usize % SQ_DEPTH) {
                if e.rnr_until != 0 && e.rnr_until <= now {
                    e.rnr_until = 0;
                }
            }
            msn = msn.wrapping_add(1);
        }
        if now < self.last_progress.saturating_add(stall_timeout) {
            return false;
        }
        self.last_progress = now;
        let mut msn = self.head;
        while msn != self.tail {
            if let Some(e) = self.sq.get_mut(msn as usize % SQ_DEPTH) {
                if e.state == State::Pending && e.rnr_until == 0 {
                    if delivering && !e.out.was_sent(e.n_segs.saturating_sub(1)) {
                        // Not all of it went out yet, while the connection delivers: its
                        // window is shared and its streams take turns, and waiting for ours
                        // is not the peer's silence. (A peer or a link gone delivers nothing:
                        // then the message counts retries, sent or not.)
                        return false;
                    }
                    if delivering && !e.out.complete(e.n_segs) {
                        // All sent, not all acknowledged, while the connection delivers: its
                        // paths are resending what they lost (under congestion, after
                        // backed-off timeouts), which is slowness, not the peer's silence. A
                        // retry counts every `SLOW_TIMEOUTS` such timeouts, so that a message
                        // the peer never takes still fails, later.
                        e.slow = e.slow.saturating_add(1);
                        if e.slow < SLOW_TIMEOUTS {
                            return false;
                        }
                    }
                    e.slow = 0;
                    if e.out.complete(e.n_segs) {
                        // Resend the whole message as a new attempt: whatever was lost (a NAK,
                        // an ACK, data the responder discarded), the responder answers it
                        // afresh and deduplicates what it already has.
                        e.attempt = e.attempt.wrapping_add(1);
                        e.out = SegWindow::new();
                        e.poke = true;
                        self.stats.pokes += 1;
                    }
                    // Packets still in flight are being resent by their paths; either way
                    // the oldest unfinished message went a whole timeout without progress.
                    e.retries = e.retries.saturating_add(1);
                    return e.retries > retry_cnt;
                }
            }
            msn = msn.wrapping_add(1);
        }
        false
    }

    /// Delivers the next completion in posting order. With the stream in error, pending WQEs
    /// are flushed. Returns the CQE and whether it is an error that puts the stream in error.
    pub fn pop_completion(&mut self, stream: StreamId, in_error: bool) -> Option<(Cqe, bool)> {
        while self.head != self.tail {
            let e = self.sq.get(self.head as usize % SQ_DEPTH)?;
            let status = match e.state {
                // Once the stream is in error, later failures are flushes.
                State::Done(s) if in_error && s != CqStatus::Success => CqStatus::WrFlushErr,
                State::Done(s) => s,
                State::Pending if in_error => CqStatus::WrFlushErr,
                State::Pending => return None,
            };
            let byte_len = match e.opcode {
                WrOpcode::CmpSwap | WrOpcode::FetchAdd | WrOpcode::AtomicWrite => 8,
                WrOpcode::Flush => 0,
                _ => e.wqe.local.total(),
            };
            let cqe = Cqe {
                stream,
                wr_id: e.wqe.wr_id,
                status,
                opcode: e.opcode.cq_opcode(),
                byte_len,
                imm: None,
                invalidated: false,
                solicited: false,
                src_qp: 0,
            };
            let signaled = e.wqe.signaled;
            self.head = self.head.wrapping_add(1);
            if status == CqStatus::Success {
                self.stats.completed += 1;
                if !signaled {
                    continue;
                }
            }
            let fatal = status != CqStatus::Success && status != CqStatus::WrFlushErr;
            return Some((cqe, fatal));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::memory::{SgList, Sge};
    use super::*;

    fn wqe(op: WrOpcode, len: u32) -> SendWqe {
        SendWqe::new(
            7,
            op,
            SgList::single(Sge {
                addr: 0,
                len,
                lkey: 1,
            }),
        )
    }

    #[test]
    fn segments_and_completion_in_order() {
        let mut r = Requester::new();
        r.post(wqe(WrOpcode::Send, 2500), 1000, 0, false).unwrap();
        r.post(wqe(WrOpcode::RdmaWrite, 0), 1000, 0, false).unwrap();
        let mut sent = std::vec::Vec::new();
        while let Some(s) = r.next_segment(0) {
            r.mark_sent(0, s.msn, s.seg);
            sent.push((s.msn, s.seg));
        }
        assert_eq!(sent, std::vec![(0, 0), (0, 1), (0, 2), (1, 0)]);
        let i = r.segment_info(0, 2, 1000).unwrap();
        assert_eq!(
            (i.offset, i.payload_len, i.last, i.first),
            (2000, 500, true, false)
        );
        // Loss of (0,1): it comes back.
        r.on_outcome(0, 0, 1, 0, Outcome::Lost);
        assert_eq!(
            r.next_segment(0).map(|s| (s.msn, s.seg, s.retransmit)),
            Some((0, 1, true))
        );
        // Responder completes message 1 only: nothing delivered before message 0.
        r.on_stream_ack(0, 0);
        assert!(r.pop_completion(StreamId(0), false).is_none());
        r.on_stream_ack(0, 2);
        assert_eq!(
            r.pop_completion(StreamId(0), false).unwrap().0.status,
            CqStatus::Success
        );
        assert_eq!(
            r.pop_completion(StreamId(0), false).unwrap().0.opcode,
            super::super::CqOpcode::RdmaWrite
        );
        assert!(r.pop_completion(StreamId(0), false).is_none());
        // A bogus stream ack beyond what was posted is ignored.
        r.on_stream_ack(0, 100);
        assert_eq!(r.outstanding(), 0);
    }

    #[test]
    fn rnr_restarts_message_and_limits() {
        let mut r = Requester::new();
        r.post(wqe(WrOpcode::Send, 10), 1000, 0, false).unwrap();
        let s = r.next_segment(0).unwrap();
        r.mark_sent(0, s.msn, s.seg);
        r.on_outcome(0, 0, 0, 0, Outcome::Acked);
        r.on_nak(10, 0, NakCode::Rnr, 50, 1);
        assert!(r.next_segment(10).is_none(), "backing off");
        assert_eq!(r.deadline(1_000_000), Some(50_010));
        r.on_timer(50_010, 1_000_000, 7, false);
        let s = r.next_segment(50_010).unwrap();
        assert_eq!((s.seg, s.attempt, s.retransmit), (0, 1, false));
        // Stale ack of the first attempt is ignored.
        r.on_outcome(0, 0, 0, 0, Outcome::Acked);
        assert_eq!(r.next_segment(50_010).map(|s| s.seg), Some(0));
        r.on_nak(60_000, 0, NakCode::Rnr, 50, 1);
        let (c, fatal) = r.pop_completion(StreamId(0), false).unwrap();
        assert_eq!(c.status, CqStatus::RnrRetryExcErr);
        assert!(fatal);
    }

    #[test]
    fn completion_timeout_resends_whole_message() {
        let mut r = Requester::new();
        r.post(wqe(WrOpcode::Send, 2500), 1000, 0, false).unwrap();
        while let Some(s) = r.next_segment(0) {
            r.mark_sent(0, s.msn, s.seg);
        }
        for seg in 0..3 {
            r.on_outcome(10, 0, seg, 0, Outcome::Acked);
        }
        // All acknowledged on their paths, but the responder never reported completion.
        assert!(r.next_segment(10).is_none());
        assert_eq!(r.deadline(1000), Some(1010));
        assert!(!r.on_timer(1010, 1000, 7, false));
        let segs: std::vec::Vec<_> = core::iter::from_fn(|| {
            let s = r.next_segment(1010)?;
            r.mark_sent(0, s.msn, s.seg);
            Some((s.seg, s.attempt, s.retransmit))
        })
        .collect();
        assert_eq!(segs, std::vec![(0, 1, true), (1, 1, true), (2, 1, true)]);
        // Acks of the old attempt no longer count; the new one's do.
        r.on_outcome(1500, 0, 0, 0, Outcome::Acked);
        // A stall with attempt 1 still in flight counts a retry but resends nothing: its
        // packets are their paths' to resend.
        assert!(!r.on_timer(2600, 1000, 7, false));
        assert!(r.next_segment(2600).is_none(), "nothing to resend");
        for seg in 0..3 {
            r.on_outcome(2700, 0, seg, 1, Outcome::Acked);
        }
        // Out of retries on the next one.
        assert!(r.on_timer(3800, 1000, 0, false));
    }

    #[test]
    fn waiting_for_a_turn_is_not_a_retry() {
        let mut r = Requester::new();
        r.post(wqe(WrOpcode::RdmaWrite, 3000), 1000, 0, false)
            .unwrap();
        // Nothing of it went out for many completion timeouts (other streams' turns on a
        // connection that delivers).
        for t in 1..20u64 {
            assert!(
                !r.on_timer(t * 1000, 1000, 0, true),
                "no retry while unsent"
            );
        }
        // Its first packet, at 20_500, starts the completion timeout.
        let s = r.next_segment(20_500).unwrap();
        r.mark_sent(20_500, s.msn, s.seg);
        for _ in 0..2 {
            let s = r.next_segment(20_500).unwrap();
            r.mark_sent(20_500, s.msn, s.seg);
        }
        assert!(
            !r.on_timer(21_000, 1000, 0, false),
            "not a whole timeout since it went out"
        );
        // A whole one without progress: out of retries (retry_cnt 0).
        assert!(r.on_timer(21_500, 1000, 0, false));
        // A connection that delivers nothing (a link down: nothing can go out) counts
        // retries for a message that never went out too.
        let mut r = Requester::new();
        r.post(wqe(WrOpcode::RdmaWrite, 3000), 1000, 0, false)
            .unwrap();
        assert!(r.on_timer(1000, 1000, 0, false));
    }

    #[test]
    fn waits_for_its_turn_until_the_oldest_message_is_all_out() {
        let mut r = Requester::new();
        assert!(!r.waiting_for_turn(), "nothing posted");
        r.post(wqe(WrOpcode::RdmaWrite, 3000), 1000, 0, false)
            .unwrap();
        r.post(wqe(WrOpcode::RdmaWrite, 1000), 1000, 0, false)
            .unwrap();
        assert!(r.waiting_for_turn());
        for _ in 0..2 {
            let s = r.next_segment(0).unwrap();
            r.mark_sent(0, s.msn, s.seg);
        }
        assert!(r.waiting_for_turn(), "its last packet has not gone out");
        let s = r.next_segment(0).unwrap();
        r.mark_sent(0, s.msn, s.seg);
        assert!(
            !r.waiting_for_turn(),
            "the oldest went out: it waits for the peer"
        );
    }

    #[test]
    fn path_timeouts_are_not_message_retries() {
        let mut r = Requester::new();
        r.post(wqe(WrOpcode::RdmaWrite, 3000), 1000, 0, false)
            .unwrap();
        for _ in 0..3 {
            let s = r.next_segment(0).unwrap();
            r.mark_sent(0, s.msn, s.seg);
        }
        // Path timeouts (a peer not ready yet, a dead path) never fail the message...
        for _ in 1..50 {
            for seg in 0..3 {
                r.on_outcome(0, 0, seg, 0, Outcome::TimedOut);
            }
        }
        // ...a whole completion timeout without progress counts one retry.
        assert!(!r.on_timer(1000, 1000, 1, false));
        assert!(!r.on_timer(1500, 1000, 1, false), "not a whole timeout yet");
        assert!(r.on_timer(2000, 1000, 1, false));
    }

    #[test]
    fn rejects_bad_posts() {
        let mut r = Requester::new();
        assert_eq!(
            r.post(wqe(WrOpcode::CmpSwap, 4), 1000, 0, false),
            Err(PostError::InvalidWqe)
        );
        assert_eq!(
            r.post(
                wqe(WrOpcode::RdmaWrite, 10).remote(u64::MAX - 3, 1),
                1000,
                0,
                false
            ),
            Err(PostError::InvalidWqe)
        );
        for _ in 0..SQ_DEPTH {
            r.post(wqe(WrOpcode::Send, 1), 1000, 0, false).unwrap();
        }
        assert_eq!(
            r.post(wqe(WrOpcode::Send, 1), 1000, 0, false),
            Err(PostError::QueueFull)
        );
    }
}
