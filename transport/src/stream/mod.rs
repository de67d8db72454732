// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A stream: one QP's ordered sequence of messages on a connection, in both roles.
//!
//! - [`requester`]: posted send WQEs, message numbering, segmentation, completion in order,
//!   retry and RNR counters (rxe's `req` and `comp`).
//! - [`responder`]: posted receive WQEs, placement of arriving data in any order, in-order
//!   completion, READ and atomic responses (rxe's `resp`).
//!
//! Sizes are fixed by the constants below; a stream is about 11 KiB, whether idle or busy.

pub mod requester;
pub mod responder;

use super::memory::SgList;
use super::wire::NakCode;
use super::zero::{zero_valid, ZeroValid};
pub use requester::Requester;
pub use responder::Responder;

/// Send queue depth (posted, unfinished send WQEs) per stream. The caller keeps the rest of a
/// QP's send queue (the kernel: the ring userspace posts to) and feeds the stream as WQEs
/// complete, so this bounds only the messages in progress, not the QP's queue depth.
pub const SQ_DEPTH: usize = 32;
/// Receive queue depth per stream (receive WQEs handed to the stream); as with the send
/// queue, the caller holds the rest. Twice the message window, so that receives completed
/// but not yet polled never make a message in the window wait for one.
pub const RQ_DEPTH: usize = 64;
/// Messages a requester may have beyond the responder's completion point; the responder keeps
/// one assembly slot per message in this window. A message with a lost packet holds the
/// window for the two or three round trips its recovery takes, so the window must cover
/// several bandwidth-delay products for loss to cost little (`docs/datapath.md`, "Loss in
/// the guest").
pub const MSG_WINDOW: u32 = 32;
/// READ/atomic responses a responder serves at once per stream: twice `MAX_RD_ATOMIC`, since
/// a response's slot frees only when the ACK of its last packet arrives, which may come after
/// the requester, having seen the response, sent its next READ.
pub const RESP_DEPTH: usize = 16;
/// READ/atomic requests a requester has outstanding at once per stream.
pub const MAX_RD_ATOMIC: u32 = 8;
/// `rnr_retry` value meaning "retry forever".
pub const RNR_RETRY_INFINITE: u8 = 7;

// Ring indices are sequence numbers modulo the depth: the depths must divide 2^32 so that
// indices stay consistent when the 32-bit MSN/RSN wrap.
const _: () = assert!(SQ_DEPTH.is_power_of_two() && RQ_DEPTH.is_power_of_two());
const _: () = assert!(MSG_WINDOW.is_power_of_two() && MSG_WINDOW as usize <= SQ_DEPTH);
const _: () = assert!(RESP_DEPTH >= 2 * MAX_RD_ATOMIC as usize);

/// A stream's index in its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u16);

/// Per-stream settings (the QP attributes that matter to the transport).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamConfig {
    /// This side's QP number (the peer's packets carry it as dst_qp).
    pub local_qp: u32,
    /// The peer's QP number.
    pub remote_qp: u32,
    /// Timeouts a message may suffer before RETRY_EXC_ERR (0-7).
    pub retry_cnt: u8,
    /// RNR NAKs a message may receive before RNR_RETRY_EXC_ERR; 7 = infinite.
    pub rnr_retry: u8,
    /// The RNR back-off this side's responder asks of the peer, in microseconds.
    pub rnr_timer_us: u32,
    /// First MSN (and RSN) this side's requester uses; the peer's `recv_msn` must match.
    pub send_msn: u32,
    /// First MSN (and RSN) this side's responder expects: the peer's `send_msn`.
    pub recv_msn: u32,
    /// Completion timeout of this stream in ns (the verbs "local ACK timeout",
    /// 4.096 us x 2^timeout): without progress for this long, the oldest unfinished message
    /// counts a retry. 0: the connection's `stall_timeout`.
    pub ack_timeout: u64,
    /// The QP takes its receive WQEs from a shared receive queue: when a message needs one the
    /// stream does not have, the responder asks [`super::memory::Memory::shared_recv`] for it
    /// (at once, as the message arrives), instead of answering RNR.
    pub srq: bool,
    /// Planes (bit `k`: plane `k`) that may carry this stream's packets; 0: every plane. A
    /// restriction that leaves no usable path (every plane of it down, or its paths failed)
    /// is set aside until one is usable again: it steers traffic, it never fails a stream.
    pub planes: u32,
    /// A UC QP's stream: its responder drops a message that fails instead of failing the
    /// stream ([`responder::Responder::set_unreliable`]), so its requester never meets a NAK
    /// but RNR.
    pub unreliable: bool,
}
zero_valid!(struct StreamConfig {
    local_qp, remote_qp, retry_cnt, rnr_retry, rnr_timer_us, send_msn, recv_msn, ack_timeout, srq,
    planes, unreliable,
});

impl StreamConfig {
    /// A stream between QPs `local_qp` and `remote_qp` with the verbs defaults: retry_cnt 7,
    /// rnr_retry 7 (infinite), 100 us RNR back-off.
    pub fn new(local_qp: u32, remote_qp: u32) -> Self {
        StreamConfig {
            local_qp,
            remote_qp,
            retry_cnt: 7,
            rnr_retry: 7,
            rnr_timer_us: 100,
            send_msn: 0,
            recv_msn: 0,
            ack_timeout: 0,
            srq: false,
            planes: 0,
            unreliable: false,
        }
    }
}

/// Operation of a send WQE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WrOpcode {
    #[default]
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm,
    /// SEND whose receiver invalidates the rkey in `imm` (its memory window) before it
    /// completes the receive.
    SendWithInv,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE with immediate data (consumes a receive WQE).
    RdmaWriteWithImm,
    /// RDMA READ.
    RdmaRead,
    /// Atomic compare and swap.
    CmpSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// ATOMIC WRITE: the 8 bytes `swap_add` holds (read as a big-endian number: they travel
    /// and land in order) stored at once at the 8-byte aligned `remote_va`, in message order.
    AtomicWrite,
    /// RDMA FLUSH of `[remote_va, remote_va + swap_add)` under `rkey`; `compare` holds the
    /// placement type and selectivity level as the wire's `AtomicExt` does.
    Flush,
}
zero_valid!(WrOpcode::Send);

impl WrOpcode {
    /// Consumes a receive WQE at the responder.
    pub fn consumes_recv(self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::SendWithInv
                | WrOpcode::RdmaWriteWithImm
        )
    }

    /// READ or atomic: completes on response data.
    pub fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::CmpSwap | WrOpcode::FetchAdd
        )
    }

    /// The completion opcode.
    pub fn cq_opcode(self) -> CqOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => CqOpcode::Send,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => CqOpcode::RdmaWrite,
            WrOpcode::RdmaRead => CqOpcode::RdmaRead,
            WrOpcode::CmpSwap => CqOpcode::CmpSwap,
            WrOpcode::FetchAdd => CqOpcode::FetchAdd,
            WrOpcode::AtomicWrite => CqOpcode::AtomicWrite,
            WrOpcode::Flush => CqOpcode::Flush,
        }
    }
}

/// A send work request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendWqe {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Source (SEND/WRITE) or destination (READ; atomic: 8 bytes for the original value).
    pub local: SgList,
    /// Remote address (WRITE, READ, atomics).
    pub remote_va: u64,
    /// Remote key (WRITE, READ, atomics).
    pub rkey: u32,
    /// Immediate data (WITH_IMM opcodes).
    pub imm: u32,
    /// CMP_SWP compare value; FLUSH placement type and selectivity level.
    pub compare: u64,
    /// CMP_SWP swap value, FETCH_ADD addend, ATOMIC WRITE bytes (big-endian), FLUSH length.
    pub swap_add: u64,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Set SOLICITED on the last packet.
    pub solicited: bool,
}
zero_valid!(struct SendWqe {
    wr_id, opcode, local, remote_va, rkey, imm, compare, swap_add, signaled, solicited,
});

impl SendWqe {
    /// A signaled WQE with no remote part (set it with `remote`).
    pub fn new(wr_id: u64, opcode: WrOpcode, local: SgList) -> Self {
        SendWqe {
            wr_id,
            opcode,
            local,
            signaled: true,
            ..SendWqe::default()
        }
    }

    /// Sets the remote address and key.
    pub fn remote(mut self, va: u64, rkey: u32) -> Self {
        self.remote_va = va;
        self.rkey = rkey;
        self
    }

    /// Sets the immediate data.
    pub fn imm(mut self, imm: u32) -> Self {
        self.imm = imm;
        self
    }

    /// Sets the atomic operands.
    pub fn atomic(mut self, compare: u64, swap_add: u64) -> Self {
        self.compare = compare;
        self.swap_add = swap_add;
        self
    }
}

/// A receive work request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvWqe {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Buffer the message lands in.
    pub local: SgList,
}
zero_valid!(struct RecvWqe { wr_id, local });

/// Completion status, named after `ib_wc_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CqStatus {
    /// Completed successfully.
    Success,
    /// Local length error (buffer shorter than the data).
    LocLenErr,
    /// Local protection error (bad lkey or address).
    LocProtErr,
    /// Flushed: the stream is in error.
    WrFlushErr,
    /// Remote access error (rkey, bounds, rights).
    RemAccessErr,
    /// Remote invalid request (malformed, too long for the receive buffer).
    RemInvReqErr,
    /// Remote operational error (no such QP, responder failure).
    RemOpErr,
    /// Retry count exceeded (peer unreachable).
    RetryExcErr,
    /// RNR retry count exceeded.
    RnrRetryExcErr,
}
zero_valid!(CqStatus::Success);

impl CqStatus {
    pub(crate) fn from_nak(code: NakCode) -> CqStatus {
        match code {
            NakCode::RemoteAccess => CqStatus::RemAccessErr,
            NakCode::InvalidRequest | NakCode::OutOfWindow => CqStatus::RemInvReqErr,
            NakCode::RemoteOperational | NakCode::Rnr => CqStatus::RemOpErr,
        }
    }
}

/// Completion opcode, named after `ib_wc_opcode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CqOpcode {
    /// SEND or SEND_WITH_IMM.
    Send,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// Compare and swap.
    CmpSwap,
    /// Fetch and add.
    FetchAdd,
    /// Receive of a SEND.
    Recv,
    /// Receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
    /// ATOMIC WRITE.
    AtomicWrite,
    /// RDMA FLUSH.
    Flush,
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    /// The stream (QP) it belongs to.
    pub stream: StreamId,
    /// The WQE's `wr_id`.
    pub wr_id: u64,
    /// Status.
    pub status: CqStatus,
    /// Operation.
    pub opcode: CqOpcode,
    /// Bytes transferred (message length; 8 for atomics).
    pub byte_len: u32,
    /// Immediate data (receives of WITH_IMM messages); with `invalidated`, the rkey the
    /// message invalidated (`IB_WC_WITH_INVALIDATE`).
    pub imm: Option<u32>,
    /// A receive of a SEND_WITH_INV: `imm` is the rkey invalidated.
    pub invalidated: bool,
    /// The message was sent solicited (receives).
    pub solicited: bool,
    /// The peer's QP (receive completions).
    pub src_qp: u32,
}

/// Why a post was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// The queue is full.
    QueueFull,
    /// No open stream with this id.
    NoSuchStream,
    /// Missing opcode, address range overflow, atomic buffer shorter than 8 bytes, ...
    InvalidWqe,
}

/// One stream slot of a connection.
///
/// Like every type the connection stores, its all-zero bit pattern is a valid (closed) value
/// ([`ZeroValid`]); see [`super::connection::Connection::reset`].
#[derive(Clone, Debug)]
pub struct Stream {
    /// QP numbers and retry settings.
    pub cfg: StreamConfig,
    /// The slot is in use.
    pub open: bool,
    /// The stream (QP) is in the error state (with `error_status`): everything outstanding is
    /// flushed.
    in_error: bool,
    error_status: CqStatus,
    /// The StreamError event was delivered.
    pub error_reported: bool,
    /// Send queue (requester role).
    pub req: Requester,
    /// Receive queue and responses (responder role).
    pub resp: Responder,
    /// The responder's completion point changed (or a duplicate arrived): tell the peer.
    pub ack_dirty: bool,
    /// A send WQE was refused for want of room: report when there is room again.
    pub(crate) sq_refused: bool,
    /// With `sq_refused`: report only once no send WQE is outstanding.
    pub(crate) sq_drain: bool,
    /// Off the connection's TIMER list while its oldest message waits for its turn on a
    /// connection that delivers (see `Connection::stream_timers`).
    pub(crate) parked: bool,
    /// The slot's place in the connection's lists and QP index (not the stream's state:
    /// `reset` keeps it).
    pub(crate) links: super::connection::streams::Links,
}
zero_valid!(struct Stream {
    cfg, open, in_error, error_status, error_reported, req, resp, ack_dirty, sq_refused, sq_drain,
    parked, links,
});

impl Stream {
    /// A closed (unused) slot.
    pub fn closed() -> Self {
        Stream {
            cfg: StreamConfig::new(0, 0),
            open: false,
            in_error: false,
            error_status: CqStatus::Success,
            error_reported: false,
            req: Requester::new(),
            resp: Responder::new(),
            ack_dirty: false,
            sq_refused: false,
            sq_drain: false,
            parked: false,
            links: super::connection::streams::Links::default(),
        }
    }

    /// The stream's completion timeout: its own, or the connection's `stall_timeout`.
    pub fn ack_timeout(&self, stall_timeout: u64) -> u64 {
        if self.cfg.ack_timeout != 0 {
            self.cfg.ack_timeout
        } else {
            stall_timeout
        }
    }

    /// Re-initialises in place (no large temporaries): open with `cfg`, or closed.
    pub fn reset(&mut self, cfg: Option<StreamConfig>) {
        self.cfg = cfg.unwrap_or(StreamConfig::new(0, 0));
        self.open = cfg.is_some();
        self.in_error = false;
        self.error_status = CqStatus::Success;
        self.error_reported = false;
        self.req.reset(self.cfg.send_msn);
        self.resp.reset(self.cfg.recv_msn);
        self.resp.set_unreliable(self.cfg.unreliable);
        self.ack_dirty = false;
        self.sq_refused = false;
        self.sq_drain = false;
        self.parked = false;
    }

    /// The error state, if the stream is in it.
    pub fn error(&self) -> Option<CqStatus> {
        self.in_error.then_some(self.error_status)
    }

    /// Moves the stream to the error state (first error wins).
    pub fn set_error(&mut self, status: CqStatus) {
        if !self.in_error {
            self.in_error = true;
            self.error_status = status;
        }
    }
}
