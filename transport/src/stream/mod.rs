//! A stream: one QP's ordered sequence of messages on a connection, in both roles.
//!
//! - [`requester`]: posted send WQEs, message numbering, segmentation, completion in order,
//!   retry and RNR counters (rxe's `req` and `comp`).
//! - [`responder`]: posted receive WQEs, placement of arriving data in any order, in-order
//!   completion, READ and atomic responses (rxe's `resp`).
//!
//! Sizes are fixed by the constants below; a stream is a few tens of KiB.

pub mod requester;
pub mod responder;

use super::memory::SgList;
use super::wire::NakCode;
pub use requester::Requester;
pub use responder::Responder;

/// Send queue depth (outstanding send WQEs) per stream.
pub const SQ_DEPTH: usize = 64;
/// Receive queue depth per stream.
pub const RQ_DEPTH: usize = 64;
/// Messages a requester may have beyond the responder's completion point; the responder keeps
/// one assembly slot per message in this window.
pub const MSG_WINDOW: u32 = 32;
/// READ/atomic responses a responder serves at once per stream.
pub const RESP_DEPTH: usize = 16;
/// READ/atomic requests a requester has outstanding at once per stream.
pub const MAX_RD_ATOMIC: u32 = 8;
/// `rnr_retry` value meaning "retry forever".
pub const RNR_RETRY_INFINITE: u8 = 7;

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
}

impl StreamConfig {
    pub fn new(local_qp: u32, remote_qp: u32) -> Self {
        StreamConfig {
            local_qp,
            remote_qp,
            retry_cnt: 7,
            rnr_retry: 7,
            rnr_timer_us: 100,
        }
    }
}

/// Operation of a send WQE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WrOpcode {
    #[default]
    Send,
    SendWithImm,
    RdmaWrite,
    RdmaWriteWithImm,
    RdmaRead,
    CmpSwap,
    FetchAdd,
}

impl WrOpcode {
    /// Consumes a receive WQE at the responder.
    pub fn consumes_recv(self) -> bool {
        matches!(
            self,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
        )
    }

    pub fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::CmpSwap | WrOpcode::FetchAdd
        )
    }

    pub fn cq_opcode(self) -> CqOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm => CqOpcode::Send,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => CqOpcode::RdmaWrite,
            WrOpcode::RdmaRead => CqOpcode::RdmaRead,
            WrOpcode::CmpSwap => CqOpcode::CmpSwap,
            WrOpcode::FetchAdd => CqOpcode::FetchAdd,
        }
    }
}

/// A send work request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendWqe {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    /// Source (SEND/WRITE) or destination (READ; atomic: 8 bytes for the original value).
    pub local: SgList,
    pub remote_va: u64,
    pub rkey: u32,
    pub imm: u32,
    /// CMP_SWP compare value.
    pub compare: u64,
    /// CMP_SWP swap value or FETCH_ADD addend.
    pub swap_add: u64,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    pub solicited: bool,
}

impl SendWqe {
    pub fn new(wr_id: u64, opcode: WrOpcode, local: SgList) -> Self {
        SendWqe {
            wr_id,
            opcode,
            local,
            signaled: true,
            ..SendWqe::default()
        }
    }

    pub fn remote(mut self, va: u64, rkey: u32) -> Self {
        self.remote_va = va;
        self.rkey = rkey;
        self
    }

    pub fn imm(mut self, imm: u32) -> Self {
        self.imm = imm;
        self
    }

    pub fn atomic(mut self, compare: u64, swap_add: u64) -> Self {
        self.compare = compare;
        self.swap_add = swap_add;
        self
    }
}

/// A receive work request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub local: SgList,
}

/// Completion status, named after `ib_wc_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CqStatus {
    Success,
    LocLenErr,
    LocProtErr,
    WrFlushErr,
    RemAccessErr,
    RemInvReqErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
}

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
    Send,
    RdmaWrite,
    RdmaRead,
    CmpSwap,
    FetchAdd,
    Recv,
    RecvRdmaWithImm,
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    pub stream: StreamId,
    pub wr_id: u64,
    pub status: CqStatus,
    pub opcode: CqOpcode,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub solicited: bool,
    /// The peer's QP (receive completions).
    pub src_qp: u32,
}

/// Why a post was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    QueueFull,
    NoSuchStream,
    /// Missing opcode, address range overflow, atomic buffer shorter than 8 bytes, ...
    InvalidWqe,
}

/// One stream slot of a connection.
///
/// Like every type the connection stores, its all-zero bit pattern is a valid (closed) value;
/// see [`super::connection::Connection::reset`].
#[derive(Clone, Debug)]
pub struct Stream {
    pub cfg: StreamConfig,
    pub open: bool,
    /// The stream (QP) is in the error state (with `error_status`): everything outstanding is
    /// flushed.
    in_error: bool,
    error_status: CqStatus,
    pub error_reported: bool,
    pub req: Requester,
    pub resp: Responder,
    /// The responder's completion point changed (or a duplicate arrived): tell the peer.
    pub ack_dirty: bool,
}

impl Stream {
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
        }
    }

    /// Re-initialises in place (no large temporaries): open with `cfg`, or closed.
    pub fn reset(&mut self, cfg: Option<StreamConfig>) {
        self.cfg = cfg.unwrap_or(StreamConfig::new(0, 0));
        self.open = cfg.is_some();
        self.in_error = false;
        self.error_status = CqStatus::Success;
        self.error_reported = false;
        self.req.reset();
        self.resp.reset();
        self.ack_dirty = false;
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
