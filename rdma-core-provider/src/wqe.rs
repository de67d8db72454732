// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Work queue entries of `uapi/metaroce-abi.h` in safe Rust: checking a send / receive work
//! request and encoding it as a ring entry ([`SendEntry`], [`RecvEntry`]: `struct
//! metaroce_send_wqe` / `struct metaroce_recv_wqe` and the SGEs past them), and translating a
//! `struct metaroce_cqe` into an `ibv_wc`.
//!
//! The FFI layer turns the caller's `ibv_send_wr` / `ibv_recv_wr` into the borrowed views
//! below (reading only the union members the opcode uses) and copies inline data through the
//! callback it passes, so nothing here touches application memory directly.

use crate::ffi::sys;
use crate::ring::{Batch, PushError, RingMemory};
use core::ffi::c_int;
use core::mem::size_of;
use core::ops::{Deref, DerefMut};

/// SGEs in `struct metaroce_send_wqe` itself (12): a send entry of the smallest size.
pub const MAX_SEND_SGE: u32 = sys::METAROCE_MAX_SEND_SGE;
/// Largest inline payload of a send WQE (192 bytes).
pub const MAX_INLINE: u32 = sys::METAROCE_MAX_INLINE;
/// SGEs in `struct metaroce_recv_wqe` itself (7).
pub const MAX_RECV_SGE: u32 = sys::METAROCE_MAX_RECV_SGE;
/// The most SGEs a WQE carries (32), in a ring whose entries have room for them.
pub const MAX_SGE: u32 = sys::METAROCE_MAX_SGE;

/// A send queue entry of the largest size: the WQE structure and the SGEs 12.. that go on
/// past its SGE array in a ring whose `entry_size` has room (`uapi/metaroce-abi.h`, entry
/// sizes). A ring of smaller entries takes its first `entry_size` bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SendEntry {
    pub wqe: sys::metaroce_send_wqe,
    pub more: [sys::metaroce_sge; (MAX_SGE - MAX_SEND_SGE) as usize],
}

/// A receive queue entry of the largest size: the WQE and the SGEs 7.. past it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RecvEntry {
    pub wqe: sys::metaroce_recv_wqe,
    pub more: [sys::metaroce_sge; (MAX_SGE - MAX_RECV_SGE) as usize],
}

// The SGEs past each structure continue its SGE array without a gap.
const _: () = {
    use core::mem::offset_of;
    type S = sys::metaroce_send_wqe;
    type R = sys::metaroce_recv_wqe;
    assert!(offset_of!(SendEntry, more) == size_of::<S>());
    assert!(offset_of!(S, data) + 16 * MAX_SEND_SGE as usize == size_of::<S>());
    assert!(offset_of!(RecvEntry, more) == size_of::<R>());
    assert!(offset_of!(R, sge) + 16 * MAX_RECV_SGE as usize == size_of::<R>());
    assert!(size_of::<SendEntry>() == size_of::<S>() + 16 * (MAX_SGE - MAX_SEND_SGE) as usize);
    assert!(size_of::<RecvEntry>() == size_of::<R>() + 16 * (MAX_SGE - MAX_RECV_SGE) as usize);
};

impl Deref for SendEntry {
    type Target = sys::metaroce_send_wqe;
    fn deref(&self) -> &Self::Target {
        &self.wqe
    }
}

impl DerefMut for SendEntry {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.wqe
    }
}

impl Deref for RecvEntry {
    type Target = sys::metaroce_recv_wqe;
    fn deref(&self) -> &Self::Target {
        &self.wqe
    }
}

impl SendEntry {
    /// An entry holding `wqe` and no SGEs past it.
    pub fn new(wqe: sys::metaroce_send_wqe) -> Self {
        Self {
            wqe,
            more: [NO_SGE; (MAX_SGE - MAX_SEND_SGE) as usize],
        }
    }
}

/// The SGEs a send entry of `entry_size` bytes holds (at most [`MAX_SGE`]).
pub fn send_sge_capacity(entry_size: usize) -> u32 {
    let header = size_of::<sys::metaroce_send_wqe>() - 16 * MAX_SEND_SGE as usize;
    (entry_size.saturating_sub(header) / 16).min(MAX_SGE as usize) as u32
}

/// The SGEs a receive entry of `entry_size` bytes holds (at most [`MAX_SGE`]).
pub fn recv_sge_capacity(entry_size: usize) -> u32 {
    let header = size_of::<sys::metaroce_recv_wqe>() - 16 * MAX_RECV_SGE as usize;
    (entry_size.saturating_sub(header) / 16).min(MAX_SGE as usize) as u32
}

const WR_RDMA_WRITE: u32 = sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE;
const WR_RDMA_WRITE_WITH_IMM: u32 = sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM;
const WR_SEND: u32 = sys::ibv_wr_opcode_IBV_WR_SEND;
const WR_SEND_WITH_IMM: u32 = sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM;
const WR_SEND_WITH_INV: u32 = sys::ibv_wr_opcode_IBV_WR_SEND_WITH_INV;
const WR_RDMA_READ: u32 = sys::ibv_wr_opcode_IBV_WR_RDMA_READ;
const WR_ATOMIC_CMP_AND_SWP: u32 = sys::ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP;
const WR_ATOMIC_FETCH_AND_ADD: u32 = sys::ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD;
const WR_LOCAL_INV: u32 = sys::ibv_wr_opcode_IBV_WR_LOCAL_INV;
const WR_BIND_MW: u32 = sys::ibv_wr_opcode_IBV_WR_BIND_MW;
const WR_ATOMIC_WRITE: u32 = sys::ibv_wr_opcode_IBV_WR_ATOMIC_WRITE;
const WR_FLUSH: u32 = sys::ibv_wr_opcode_IBV_WR_FLUSH;

/// `IBV_SEND_INLINE`.
pub const SEND_INLINE: u32 = sys::ibv_send_flags_IBV_SEND_INLINE;
/// The `ibv_send_flags` a WQE may carry (passed to the kernel unchanged).
pub const SEND_FLAGS_SUPPORTED: u32 = sys::ibv_send_flags_IBV_SEND_FENCE
    | sys::ibv_send_flags_IBV_SEND_SIGNALED
    | sys::ibv_send_flags_IBV_SEND_SOLICITED
    | sys::ibv_send_flags_IBV_SEND_INLINE
    | sys::ibv_send_flags_IBV_SEND_IP_CSUM;

/// What the operation of a send work request needs from the rest of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    /// SEND, SEND_WITH_IMM: no remote address.
    Send,
    /// RDMA_WRITE(_WITH_IMM), RDMA_READ: `wr.rdma`.
    Rdma,
    /// ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD: `wr.atomic`.
    Atomic,
    /// BIND_MW (`bind_mw`), LOCAL_INV (`invalidate_rkey`): carried out by the device, no data.
    Local,
    /// ATOMIC_WRITE, FLUSH: a remote address and operands, no data (`ibv_send_wr` has no
    /// member for them: only `ibv_wr_atomic_write` and `ibv_wr_flush` build them).
    Operands,
}

/// The class of a send opcode this provider supports, `None` for any other.
pub fn op_class(opcode: u32) -> Option<OpClass> {
    match opcode {
        WR_SEND | WR_SEND_WITH_IMM | WR_SEND_WITH_INV => Some(OpClass::Send),
        WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM | WR_RDMA_READ => Some(OpClass::Rdma),
        WR_ATOMIC_CMP_AND_SWP | WR_ATOMIC_FETCH_AND_ADD => Some(OpClass::Atomic),
        WR_BIND_MW | WR_LOCAL_INV => Some(OpClass::Local),
        WR_ATOMIC_WRITE | WR_FLUSH => Some(OpClass::Operands),
        _ => None,
    }
}

const QPT_UD: u32 = sys::ibv_qp_type_IBV_QPT_UD;

/// Whether a QP in `state` (`enum ibv_qp_state`, as libibverbs keeps it in `ibv_qp.state`)
/// takes send work requests: from RTS on (RTS, SQD, SQE, and the error state, which flushes
/// them); before, `ibv_post_send` fails with `EINVAL`, as on rxe and the IB spec's "immediate
/// error".
pub fn sends_allowed(state: u32) -> bool {
    state >= sys::ibv_qp_state_IBV_QPS_RTS
}

/// Whether a QP in `state` takes receive work requests: from INIT on; in RESET `EINVAL`.
pub fn recvs_allowed(state: u32) -> bool {
    state >= sys::ibv_qp_state_IBV_QPS_INIT
}

/// Whether a QP of `qp_type` may post `opcode`. RC: all twelve (the seven that move data,
/// SEND_WITH_INV, a memory window bind and a local invalidate, ATOMIC_WRITE and FLUSH); UC: sends and RDMA writes (no
/// reads or atomics, IB spec); UD: sends only (a datagram has no remote memory, and the ABI's
/// `metaroce_ud_av` takes the place of the RDMA/atomic fields). Every other type (XRC, raw
/// packet, ...): none.
pub fn opcode_allowed(qp_type: u32, opcode: u32) -> bool {
    match qp_type {
        sys::ibv_qp_type_IBV_QPT_RC => op_class(opcode).is_some(),
        sys::ibv_qp_type_IBV_QPT_UC => matches!(
            opcode,
            WR_SEND | WR_SEND_WITH_IMM | WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM
        ),
        QPT_UD => matches!(opcode, WR_SEND | WR_SEND_WITH_IMM),
        _ => false,
    }
}

// The address vector overlays the 32 bytes from `remote_addr` to the end of `swap`, which a
// UD WQE does not use otherwise; `set_ud_av` relies on these offsets.
const _: () = {
    use core::mem::{offset_of, size_of};
    type S = sys::metaroce_send_wqe;
    assert!(size_of::<sys::metaroce_ud_av>() == 32);
    assert!(offset_of!(S, remote_addr) == sys::METAROCE_UD_AV_OFFSET as usize);
    assert!(offset_of!(S, rkey) == sys::METAROCE_UD_AV_OFFSET as usize + 8);
    assert!(offset_of!(S, reserved1) == sys::METAROCE_UD_AV_OFFSET as usize + 12);
    assert!(offset_of!(S, compare_add) == sys::METAROCE_UD_AV_OFFSET as usize + 16);
    assert!(offset_of!(S, swap) == sys::METAROCE_UD_AV_OFFSET as usize + 24);
    assert!(offset_of!(S, data) == sys::METAROCE_UD_AV_OFFSET as usize + 32);
};

/// Where a UD send goes: the address handle's destination GID and the work request's remote
/// QPN and Q_Key (both passed to the kernel unchanged: a Q_Key with bit 31 set means the QP's
/// own, and the kernel judges the QPN).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdDest {
    /// The GID in network order, as in `ibv_gid.raw`.
    pub dgid: [u8; 16],
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

impl UdDest {
    /// The ABI's `struct metaroce_ud_av` for this destination (reserved words zero).
    pub fn av(&self) -> sys::metaroce_ud_av {
        sys::metaroce_ud_av {
            dgid: self.dgid,
            remote_qpn: self.remote_qpn,
            remote_qkey: self.remote_qkey,
            reserved: [0; 2],
        }
    }
}

/// Checks the `ibv_ah_attr` of a new address handle and returns the destination GID it keeps
/// (all a UD WQE needs of it; the kernel sends from the QP's port with its own source GID).
/// RoCE needs a GRH, so `is_global` must be set; `port_num` must be one of the device's
/// (1 ..= `num_ports`), and the GID not all zero. `dlid`, `sl`, `src_path_bits`,
/// `static_rate` and the GRH's `sgid_index`, `flow_label`, `hop_limit` and `traffic_class`
/// have no place in the WQE and are ignored. `EINVAL` for anything refused.
pub fn check_ah_attr(
    is_global: u8,
    port_num: u8,
    dgid: [u8; 16],
    num_ports: u8,
) -> Result<[u8; 16], c_int> {
    if is_global == 0 || port_num == 0 || port_num > num_ports || dgid == [0; 16] {
        return Err(sys::EINVAL as c_int);
    }
    Ok(dgid)
}

/// Writes `av` over the 32 bytes at `METAROCE_UD_AV_OFFSET` of `wqe` (the fields
/// `remote_addr`, `rkey`, `reserved1`, `compare_add`, `swap`), byte for byte as the struct
/// lies in memory: each field takes the native-endian value of the bytes it covers.
pub fn set_ud_av(wqe: &mut sys::metaroce_send_wqe, av: &sys::metaroce_ud_av) {
    let mut b = [0u8; 32];
    b[..16].copy_from_slice(&av.dgid);
    b[16..20].copy_from_slice(&av.remote_qpn.to_ne_bytes());
    b[20..24].copy_from_slice(&av.remote_qkey.to_ne_bytes());
    b[24..28].copy_from_slice(&av.reserved[0].to_ne_bytes());
    b[28..32].copy_from_slice(&av.reserved[1].to_ne_bytes());
    let u64_at = |at: usize| u64::from_ne_bytes(core::array::from_fn(|i| b[at + i]));
    let u32_at = |at: usize| u32::from_ne_bytes(core::array::from_fn(|i| b[at + i]));
    wqe.remote_addr = u64_at(0);
    wqe.rkey = u32_at(8);
    wqe.reserved1 = u32_at(12);
    wqe.compare_add = u64_at(16);
    wqe.swap = u64_at(24);
}

/// Why a work request was not posted; [`PostError::errno`] is what the verb returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// An opcode this provider does not support, or not on this QP type.
    BadOpcode,
    /// A send flag outside `SEND_FLAGS_SUPPORTED`.
    BadFlags,
    /// More SGEs than the queue allows, a negative `num_sge`, or a NULL `sg_list` with SGEs.
    TooManySge,
    /// Inline payload larger than `max_inline_data`.
    InlineTooLong,
    /// Atomic with a local buffer under 8 bytes or a misaligned remote address.
    BadAtomic,
    /// The ring is full.
    QueueFull,
    /// An `ibv_wr_*` call out of place: a data setter with no builder before it (or a second
    /// one), `wr_start` inside a batch, a setter this QP has no use for.
    OutOfOrder,
    /// A UD send without a usable address: no address handle (`wr.ud.ah` NULL, or
    /// `ibv_wr_set_ud_addr` never called), or one not made on this QP's context.
    NoAddress,
}

impl PostError {
    /// `EINVAL` for a malformed request, `ENOMEM` for a full queue.
    pub fn errno(self) -> c_int {
        match self {
            Self::QueueFull => sys::ENOMEM as c_int,
            _ => sys::EINVAL as c_int,
        }
    }
}

impl From<PushError> for PostError {
    fn from(_: PushError) -> Self {
        Self::QueueFull
    }
}

/// Per-queue limits, as created (clamped to what the WQE layout can hold).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendLimits {
    /// `ibv_qp_type` of the QP.
    pub qp_type: u32,
    /// `cap.max_send_sge`, at most what the ring's entries hold ([`send_sge_capacity`]).
    pub max_sge: u32,
    /// `cap.max_inline_data`, at most [`MAX_INLINE`].
    pub max_inline: u32,
}

/// A send work request as the FFI layer read it from `struct ibv_send_wr`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub opcode: u32,
    pub send_flags: u32,
    pub sg_list: &'a [sys::ibv_sge],
    /// `imm_data`, big-endian as the application stored it; LOCAL_INV: `invalidate_rkey`
    /// (the same union); BIND_MW: the window's new rkey (`bind_mw.rkey`).
    pub imm_data: u32,
    /// `wr.rdma.remote_addr` / `wr.atomic.remote_addr` (0 for sends).
    pub remote_addr: u64,
    /// `wr.rdma.rkey` / `wr.atomic.rkey` (0 for sends).
    pub rkey: u32,
    /// `wr.atomic.compare_add`; BIND_MW: the length; ATOMIC_WRITE: the 8 bytes read as a
    /// big-endian number; FLUSH: the length (0 otherwise).
    pub compare_add: u64,
    /// `wr.atomic.swap`; BIND_MW: the rights << 32 | the MR's lkey; FLUSH: the placement type
    /// | the selectivity level << 8 (0 otherwise).
    pub swap: u64,
    /// On a UD QP: where the send goes (`wr.ud`, its AH resolved); not looked at otherwise.
    pub ud: Option<UdDest>,
}

fn sge(s: &sys::ibv_sge) -> sys::metaroce_sge {
    sys::metaroce_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

const NO_SGE: sys::metaroce_sge = sys::metaroce_sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

/// Checks `wr` against `limits` and encodes it. With `IBV_SEND_INLINE` (honoured for sends
/// and RDMA writes, dropped for reads and atomics, which have no payload to inline) the SGEs'
/// bytes go into `data.inline_data`: `copy_inline(sge, dst)` must fill `dst` (exactly
/// `sge.length` bytes) from the SGE's address; it is called only after every check passed,
/// in SGE order, and not for empty SGEs.
pub fn encode_send(
    wr: &SendWr<'_>,
    limits: &SendLimits,
    mut copy_inline: impl FnMut(&sys::ibv_sge, &mut [u8]),
) -> Result<SendEntry, PostError> {
    let (class, av) = check_op(wr, limits)?;
    if class == OpClass::Operands
        && wr.opcode == WR_ATOMIC_WRITE
        && !wr.remote_addr.is_multiple_of(8)
    {
        return Err(PostError::BadAtomic);
    }
    if matches!(class, OpClass::Local | OpClass::Operands) {
        // No data: the SGEs are not looked at (the kernel refuses them), nor is inline.
        let data = sys::metaroce_send_wqe__bindgen_ty_1 {
            sge: [NO_SGE; MAX_SEND_SGE as usize],
        };
        let flags = wr.send_flags & !SEND_INLINE;
        return Ok(SendEntry::new(assemble(wr, class, av, flags, data, 0, 0)));
    }
    let num_sge = u32::try_from(wr.sg_list.len()).map_err(|_| PostError::TooManySge)?;
    if num_sge > limits.max_sge.min(MAX_SGE) {
        return Err(PostError::TooManySge);
    }
    let total: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    let mut send_flags = wr.send_flags;
    if class == OpClass::Atomic && (total < 8 || !wr.remote_addr.is_multiple_of(8)) {
        return Err(PostError::BadAtomic);
    }
    let inline = send_flags & SEND_INLINE != 0 && carries_payload(wr.opcode);
    if !inline {
        send_flags &= !SEND_INLINE;
    }
    if inline {
        if total > u64::from(limits.max_inline.min(MAX_INLINE)) {
            return Err(PostError::InlineTooLong);
        }
        let mut bytes = [0u8; MAX_INLINE as usize];
        let mut at = 0usize;
        for s in wr.sg_list.iter().filter(|s| s.length != 0) {
            let len = s.length as usize;
            copy_inline(s, &mut bytes[at..at + len]);
            at += len;
        }
        let data = sys::metaroce_send_wqe__bindgen_ty_1 { inline_data: bytes };
        let wqe = assemble(wr, class, av, send_flags, data, 0, total as u32);
        return Ok(SendEntry::new(wqe));
    };
    let mut sges = [NO_SGE; MAX_SEND_SGE as usize];
    let (here, past) = wr.sg_list.split_at(wr.sg_list.len().min(sges.len()));
    for (d, s) in sges.iter_mut().zip(here) {
        *d = sge(s);
    }
    let data = sys::metaroce_send_wqe__bindgen_ty_1 { sge: sges };
    let mut entry = SendEntry::new(assemble(wr, class, av, send_flags, data, num_sge, 0));
    for (d, s) in entry.more.iter_mut().zip(past) {
        *d = sge(s);
    }
    Ok(entry)
}

/// Encodes `wr` with `data` as its inline payload (`wr.sg_list` is not looked at): the WQE
/// [`encode_send`] makes for `wr` with `IBV_SEND_INLINE` and SGEs holding those bytes (the
/// extended API's `ibv_wr_set_inline_data`/`_list`, which need no SGEs and no
/// `IBV_SEND_INLINE` in `wr_flags`). Only sends and RDMA writes carry a payload to inline.
pub fn encode_send_inline(
    wr: &SendWr<'_>,
    data: &[u8],
    limits: &SendLimits,
) -> Result<SendEntry, PostError> {
    let (class, av) = check_op(wr, limits)?;
    if !carries_payload(wr.opcode) {
        return Err(PostError::BadOpcode);
    }
    if data.len() > limits.max_inline.min(MAX_INLINE) as usize {
        return Err(PostError::InlineTooLong);
    }
    let mut bytes = [0u8; MAX_INLINE as usize];
    bytes[..data.len()].copy_from_slice(data);
    Ok(SendEntry::new(assemble(
        wr,
        class,
        av,
        wr.send_flags | SEND_INLINE,
        sys::metaroce_send_wqe__bindgen_ty_1 { inline_data: bytes },
        0,
        data.len() as u32,
    )))
}

/// Whether the opcode has a payload of its own, which `IBV_SEND_INLINE` can carry in the WQE.
fn carries_payload(opcode: u32) -> bool {
    matches!(
        opcode,
        WR_SEND | WR_SEND_WITH_IMM | WR_SEND_WITH_INV | WR_RDMA_WRITE | WR_RDMA_WRITE_WITH_IMM
    )
}

/// The checks every send WQE passes first: the opcode on this QP type, the send flags, and on
/// a UD QP its destination, whose address vector the WQE then carries.
fn check_op(
    wr: &SendWr<'_>,
    limits: &SendLimits,
) -> Result<(OpClass, Option<sys::metaroce_ud_av>), PostError> {
    if !opcode_allowed(limits.qp_type, wr.opcode) {
        return Err(PostError::BadOpcode);
    }
    let class = op_class(wr.opcode).ok_or(PostError::BadOpcode)?;
    if wr.send_flags & !SEND_FLAGS_SUPPORTED != 0 {
        return Err(PostError::BadFlags);
    }
    let av = if limits.qp_type == QPT_UD {
        Some(wr.ud.ok_or(PostError::NoAddress)?.av())
    } else {
        None
    };
    Ok((class, av))
}

/// The WQE for a checked `wr`: the fields its opcode does not use are zero; with `av` (a UD
/// send) the address vector takes the 32 bytes from `remote_addr` on.
fn assemble(
    wr: &SendWr<'_>,
    class: OpClass,
    av: Option<sys::metaroce_ud_av>,
    send_flags: u32,
    data: sys::metaroce_send_wqe__bindgen_ty_1,
    num_sge: u32,
    inline_len: u32,
) -> sys::metaroce_send_wqe {
    // BIND_MW (`SendWr::bind`): the window's rkey now in `rkey`, the new one in `imm_data`,
    // the address in `remote_addr`, the length in `compare_add`, the rights and the MR's lkey
    // in `swap` (high and low half); LOCAL_INV: the rkey in `imm_data`.
    let (remote_addr, rkey) = match (class, wr.opcode) {
        (OpClass::Send, _) | (OpClass::Local, WR_LOCAL_INV) => (0, 0),
        _ => (wr.remote_addr, wr.rkey),
    };
    let (compare_add, swap) = match wr.opcode {
        WR_ATOMIC_CMP_AND_SWP | WR_BIND_MW | WR_FLUSH => (wr.compare_add, wr.swap),
        WR_ATOMIC_FETCH_AND_ADD | WR_ATOMIC_WRITE => (wr.compare_add, 0),
        _ => (0, 0),
    };
    let imm_data = match wr.opcode {
        WR_SEND_WITH_IMM
        | WR_RDMA_WRITE_WITH_IMM
        | WR_BIND_MW
        | WR_LOCAL_INV
        | WR_SEND_WITH_INV => wr.imm_data,
        _ => 0,
    };
    let mut wqe = sys::metaroce_send_wqe {
        wr_id: wr.wr_id,
        opcode: wr.opcode,
        send_flags,
        num_sge,
        inline_len,
        imm_data,
        reserved0: 0,
        remote_addr,
        rkey,
        reserved1: 0,
        compare_add,
        swap,
        data,
    };
    if let Some(av) = av {
        set_ud_av(&mut wqe, &av);
    }
    wqe
}

/// Checks a receive work request (RQ or SRQ) against the queue's `max_sge` and encodes it.
pub fn encode_recv(
    wr_id: u64,
    sg_list: &[sys::ibv_sge],
    max_sge: u32,
) -> Result<RecvEntry, PostError> {
    let num_sge = u32::try_from(sg_list.len()).map_err(|_| PostError::TooManySge)?;
    if num_sge > max_sge.min(MAX_SGE) {
        return Err(PostError::TooManySge);
    }
    let mut entry = RecvEntry {
        wqe: sys::metaroce_recv_wqe {
            wr_id,
            num_sge,
            reserved: 0,
            sge: [NO_SGE; MAX_RECV_SGE as usize],
        },
        more: [NO_SGE; (MAX_SGE - MAX_RECV_SGE) as usize],
    };
    let (here, past) = sg_list.split_at(sg_list.len().min(MAX_RECV_SGE as usize));
    for (d, s) in entry.wqe.sge.iter_mut().zip(here) {
        *d = sge(s);
    }
    for (d, s) in entry.more.iter_mut().zip(past) {
        *d = sge(s);
    }
    Ok(entry)
}

/// How posting a list of work requests ended.
#[derive(Debug, PartialEq, Eq)]
pub struct PostOutcome<W> {
    /// Work requests written and published.
    pub posted: u32,
    /// The first one that was not posted, and why; the ones after it were not looked at.
    pub failed: Option<(W, PostError)>,
}

/// Posts `wrs` in order into `batch`: `encode` checks and encodes each; the first failure (or
/// a full ring) stops the list. Everything before it is published with one release store.
pub fn post_list<M: RingMemory, W>(
    mut batch: Batch<'_, M>,
    wrs: impl IntoIterator<Item = W>,
    mut encode: impl FnMut(&W) -> Result<M::Entry, PostError>,
) -> PostOutcome<W> {
    let mut failed = None;
    for wr in wrs {
        match encode(&wr).and_then(|e| batch.push(&e).map_err(PostError::from)) {
            Ok(()) => {}
            Err(e) => {
                failed = Some((wr, e));
                break;
            }
        }
    }
    PostOutcome {
        posted: batch.commit(),
        failed,
    }
}

/// Translates a completion 1:1 (the CQE fields carry the `ibv_wc` values).
pub fn cqe_to_wc(cqe: &sys::metaroce_cqe) -> sys::ibv_wc {
    sys::ibv_wc {
        wr_id: cqe.wr_id,
        status: cqe.status,
        opcode: cqe.opcode,
        vendor_err: cqe.vendor_err,
        byte_len: cqe.byte_len,
        __bindgen_anon_1: sys::ibv_wc__bindgen_ty_1 {
            imm_data: cqe.imm_data,
        },
        qp_num: cqe.qp_num,
        src_qp: cqe.src_qp,
        wc_flags: cqe.wc_flags,
        pkey_index: cqe.pkey_index,
        slid: cqe.slid,
        sl: cqe.sl,
        dlid_path_bits: cqe.dlid_path_bits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posting_waits_for_the_states_that_take_work() {
        use sys::{
            ibv_qp_state_IBV_QPS_ERR as ERR, ibv_qp_state_IBV_QPS_INIT as INIT,
            ibv_qp_state_IBV_QPS_RESET as RESET, ibv_qp_state_IBV_QPS_RTR as RTR,
            ibv_qp_state_IBV_QPS_RTS as RTS,
        };
        assert!(!sends_allowed(RESET) && !sends_allowed(INIT) && !sends_allowed(RTR));
        assert!(sends_allowed(RTS) && sends_allowed(ERR));
        assert!(!recvs_allowed(RESET) && recvs_allowed(INIT) && recvs_allowed(ERR));
    }
    use crate::ring::testing::VecRing;
    use crate::ring::Producer;
    use core::mem::{offset_of, size_of};

    const RC: SendLimits = SendLimits {
        qp_type: sys::ibv_qp_type_IBV_QPT_RC,
        max_sge: MAX_SEND_SGE,
        max_inline: MAX_INLINE,
    };

    fn sges(n: usize) -> Vec<sys::ibv_sge> {
        (0..n)
            .map(|i| sys::ibv_sge {
                addr: 0x1000 * (i as u64 + 1),
                length: 8 * (i as u32 + 1),
                lkey: 0x100 + i as u32,
            })
            .collect()
    }

    fn wr(opcode: u32, sg_list: &[sys::ibv_sge]) -> SendWr<'_> {
        SendWr {
            wr_id: 0xabcd_0000_0000_0001,
            opcode,
            send_flags: sys::ibv_send_flags_IBV_SEND_SIGNALED,
            sg_list,
            imm_data: 0x1234_5678u32.to_be(),
            remote_addr: 0x7000_0000_0010,
            rkey: 0xfeed,
            compare_add: 11,
            swap: 22,
            ud: None,
        }
    }

    fn no_inline(_: &sys::ibv_sge, _: &mut [u8]) {
        panic!("no inline copy expected");
    }

    use crate::ffi::union_views::{inline_of, sge_of, wc_imm};

    #[test]
    fn wqe_layouts_match_the_abi() {
        type S = sys::metaroce_send_wqe;
        assert_eq!(size_of::<S>(), sys::METAROCE_SEND_WQE_SIZE as usize);
        assert_eq!(size_of::<S>(), 256);
        assert_eq!(offset_of!(S, opcode), 8);
        assert_eq!(offset_of!(S, imm_data), 24);
        assert_eq!(offset_of!(S, remote_addr), 32);
        assert_eq!(offset_of!(S, rkey), 40);
        assert_eq!(offset_of!(S, compare_add), 48);
        assert_eq!(offset_of!(S, swap), 56);
        assert_eq!(offset_of!(S, data), 64);
        assert_eq!(MAX_SEND_SGE, 12);
        assert_eq!(MAX_INLINE, 192);
        type R = sys::metaroce_recv_wqe;
        assert_eq!(size_of::<R>(), sys::METAROCE_RECV_WQE_SIZE as usize);
        assert_eq!(offset_of!(R, sge), 16);
        assert_eq!(MAX_RECV_SGE, 7);
        type C = sys::metaroce_cqe;
        assert_eq!(size_of::<C>(), sys::METAROCE_CQE_SIZE as usize);
        assert_eq!(offset_of!(C, pkey_index), 40);
        assert_eq!(offset_of!(C, sl), 44);
        assert_eq!(size_of::<sys::metaroce_sge>(), 16);
        assert_eq!(size_of::<sys::metaroce_sge>(), size_of::<sys::ibv_sge>());
    }

    #[test]
    fn opcode_values_are_the_libibverbs_ones() {
        // The ABI passes ibv_wr_opcode / ibv_send_flags values; the kernel's IB_WR_* /
        // IB_SEND_* have the same values.
        assert_eq!(
            [
                WR_RDMA_WRITE,
                WR_RDMA_WRITE_WITH_IMM,
                WR_SEND,
                WR_SEND_WITH_IMM
            ],
            [0, 1, 2, 3]
        );
        assert_eq!(
            [WR_RDMA_READ, WR_ATOMIC_CMP_AND_SWP, WR_ATOMIC_FETCH_AND_ADD],
            [4, 5, 6]
        );
        assert_eq!(SEND_INLINE, 8);
        assert_eq!(SEND_FLAGS_SUPPORTED, 0x1f);
    }

    #[test]
    fn encodes_every_supported_opcode() {
        let list = sges(3);
        for op in (0..=6u32).chain([WR_SEND_WITH_INV]) {
            let w = encode_send(&wr(op, &list), &RC, no_inline).unwrap();
            assert_eq!(w.wr_id, 0xabcd_0000_0000_0001);
            assert_eq!(w.opcode, op);
            assert_eq!(w.send_flags, sys::ibv_send_flags_IBV_SEND_SIGNALED);
            assert_eq!((w.num_sge, w.inline_len), (3, 0));
            let s = sge_of(&w);
            for (i, e) in list.iter().enumerate() {
                assert_eq!(
                    (s[i].addr, s[i].length, s[i].lkey),
                    (e.addr, e.length, e.lkey)
                );
            }
            assert!(s[3..]
                .iter()
                .all(|e| e.addr == 0 && e.length == 0 && e.lkey == 0));
            // SEND_WITH_INV's rkey is where immediate data would be (invalidate_rkey).
            let with_imm = matches!(
                op,
                WR_SEND_WITH_IMM | WR_RDMA_WRITE_WITH_IMM | WR_SEND_WITH_INV
            );
            assert_eq!(
                w.imm_data,
                if with_imm { 0x1234_5678u32.to_be() } else { 0 }
            );
            let remote = op_class(op) != Some(OpClass::Send);
            assert_eq!(w.remote_addr, if remote { 0x7000_0000_0010 } else { 0 });
            assert_eq!(w.rkey, if remote { 0xfeed } else { 0 });
            let (ca, sw) = match op {
                WR_ATOMIC_CMP_AND_SWP => (11, 22),
                WR_ATOMIC_FETCH_AND_ADD => (11, 0),
                _ => (0, 0),
            };
            assert_eq!((w.compare_add, w.swap), (ca, sw));
            assert_eq!((w.reserved0, w.reserved1), (0, 0));
        }
    }

    /// ATOMIC_WRITE and FLUSH carry their operands, never data (SGEs and inline are dropped);
    /// an ATOMIC_WRITE's address must be aligned; neither exists on UC or UD.
    #[test]
    fn atomic_write_and_flush_carry_operands_only() {
        let list = sges(2);
        let mut w = wr(WR_ATOMIC_WRITE, &list);
        w.remote_addr = 0x7000_0000_0010;
        w.compare_add = 0x0102_0304_0506_0708;
        w.swap = 99;
        w.send_flags |= SEND_INLINE;
        let e = encode_send(&w, &RC, no_inline).unwrap();
        assert_eq!((e.opcode, e.num_sge, e.inline_len), (WR_ATOMIC_WRITE, 0, 0));
        assert_eq!(e.send_flags & SEND_INLINE, 0);
        assert_eq!((e.remote_addr, e.rkey), (0x7000_0000_0010, 0xfeed));
        assert_eq!((e.compare_add, e.swap), (0x0102_0304_0506_0708, 0));
        w.remote_addr += 4;
        assert_eq!(
            encode_send(&w, &RC, no_inline).err(),
            Some(PostError::BadAtomic)
        );
        let mut f = wr(WR_FLUSH, &list);
        f.compare_add = 4096;
        f.swap = 1 | 1 << 8;
        let e = encode_send(&f, &RC, no_inline).unwrap();
        assert_eq!((e.opcode, e.num_sge), (WR_FLUSH, 0));
        assert_eq!((e.compare_add, e.swap), (4096, 1 | 1 << 8));
        for t in [sys::ibv_qp_type_IBV_QPT_UC, QPT_UD] {
            assert!(!opcode_allowed(t, WR_ATOMIC_WRITE));
            assert!(!opcode_allowed(t, WR_FLUSH));
        }
    }

    #[test]
    fn rejects_unsupported_opcodes_and_flags() {
        let list = sges(1);
        for op in [10, 11, 12, 13, 16, 100, u32::MAX] {
            assert_eq!(
                encode_send(&wr(op, &list), &RC, no_inline).err().unwrap(),
                PostError::BadOpcode
            );
        }
        let mut w = wr(WR_SEND, &list);
        w.send_flags = 1 << 5;
        assert_eq!(
            encode_send(&w, &RC, no_inline).err().unwrap(),
            PostError::BadFlags
        );
        w.send_flags = SEND_FLAGS_SUPPORTED & !SEND_INLINE;
        assert_eq!(encode_send(&w, &RC, no_inline).unwrap().send_flags, 0x17);
        assert_eq!(PostError::BadOpcode.errno(), 22);
        assert_eq!(PostError::QueueFull.errno(), 12);
    }

    #[test]
    fn memory_window_operations() {
        // BIND_MW: the window's rkey, the new one, address, length, rights and the MR's lkey
        // where the ABI puts them; no data, whatever SGEs or inline flag came with it.
        let list = sges(2);
        let mut w = wr(WR_BIND_MW, &list);
        (w.rkey, w.imm_data, w.remote_addr) = (0x8000_0142, 0x8000_0143, 0x1000);
        (w.compare_add, w.swap) = (0x200, (6u64 << 32) | 0x1234);
        w.send_flags = SEND_INLINE | 2;
        let q = encode_send(&w, &RC, no_inline).unwrap();
        assert_eq!(
            (q.opcode, q.num_sge, q.inline_len, q.send_flags),
            (WR_BIND_MW, 0, 0, 2)
        );
        assert_eq!(
            (q.rkey, q.imm_data, q.remote_addr),
            (0x8000_0142, 0x8000_0143, 0x1000)
        );
        assert_eq!((q.compare_add, q.swap), (0x200, (6u64 << 32) | 0x1234));
        assert_eq!(bytes_of(&q)[64..], [0u8; 192], "no data");
        // LOCAL_INV: only the rkey to invalidate, in imm_data.
        let mut w = wr(WR_LOCAL_INV, &[]);
        (w.imm_data, w.rkey, w.remote_addr) = (0x8000_0143, 9, 9);
        let q = encode_send(&w, &RC, no_inline).unwrap();
        assert_eq!(
            (q.imm_data, q.rkey, q.remote_addr, q.num_sge),
            (0x8000_0143, 0, 0, 0)
        );
    }

    #[test]
    fn opcodes_per_qp_type() {
        let uc = SendLimits {
            qp_type: sys::ibv_qp_type_IBV_QPT_UC,
            ..RC
        };
        let ud = SendLimits {
            qp_type: sys::ibv_qp_type_IBV_QPT_UD,
            ..RC
        };
        let list = sges(1);
        for op in 0..=6u32 {
            let uc_ok = op <= 3;
            assert_eq!(
                encode_send(&wr(op, &list), &uc, no_inline).is_ok(),
                uc_ok,
                "{op}"
            );
            // UD: the two sends, with a destination; without one, NoAddress.
            let ud_ok = op == WR_SEND || op == WR_SEND_WITH_IMM;
            let mut w = wr(op, &list);
            assert_eq!(
                encode_send(&w, &ud, no_inline).err().unwrap(),
                if ud_ok {
                    PostError::NoAddress
                } else {
                    PostError::BadOpcode
                },
                "{op}"
            );
            w.ud = Some(DEST);
            assert_eq!(encode_send(&w, &ud, no_inline).is_ok(), ud_ok, "{op}");
        }
        // Neither are the memory window operations, which only RC takes here.
        let mut w = wr(sys::ibv_wr_opcode_IBV_WR_BIND_MW, &list);
        assert_eq!(
            encode_send(&w, &uc, no_inline).err(),
            Some(PostError::BadOpcode)
        );
        w.ud = Some(DEST);
        assert_eq!(
            encode_send(&w, &ud, no_inline).err(),
            Some(PostError::BadOpcode)
        );
        assert_eq!(PostError::NoAddress.errno(), sys::EINVAL as c_int);
    }

    const UD: SendLimits = SendLimits {
        qp_type: sys::ibv_qp_type_IBV_QPT_UD,
        max_sge: MAX_SEND_SGE,
        max_inline: MAX_INLINE,
    };

    /// ::ffff:10.1.2.3, QPN 0x12345, Q_Key 0x8000_0000 (the QP's own).
    const DEST: UdDest = UdDest {
        dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3],
        remote_qpn: 0x12345,
        remote_qkey: 0x8000_0000,
    };

    /// The 32 bytes `struct metaroce_ud_av` is in memory for `d`, written out by hand.
    fn av_bytes(d: &UdDest) -> Vec<u8> {
        let mut v = d.dgid.to_vec();
        v.extend(d.remote_qpn.to_ne_bytes());
        v.extend(d.remote_qkey.to_ne_bytes());
        v.extend([0u8; 8]);
        v
    }

    #[test]
    fn ud_sends_carry_the_address_vector_at_offset_32() {
        assert_eq!(sys::METAROCE_UD_AV_OFFSET, 32);
        let list = sges(2);
        for op in [WR_SEND, WR_SEND_WITH_IMM] {
            let mut w = wr(op, &list);
            w.ud = Some(DEST);
            let e = encode_send(&w, &UD, no_inline).unwrap();
            let b = bytes_of(&e);
            assert_eq!(&b[32..64], &av_bytes(&DEST)[..], "opcode {op}");
            // Everything else is what the same send on an RC QP is.
            let rc = bytes_of(&encode_send(&wr(op, &list), &RC, no_inline).unwrap());
            assert_eq!(&b[..32], &rc[..32]);
            assert_eq!(&b[64..], &rc[64..]);
            assert_eq!((e.num_sge, e.inline_len), (2, 0));
        }
        // The ABI struct itself, as bindgen lays it out.
        let av = DEST.av();
        assert_eq!(av.reserved, [0, 0]);
        let mut e = encode_send(&wr(WR_SEND, &[]), &RC, no_inline).unwrap();
        set_ud_av(&mut e, &av);
        assert_eq!(&bytes_of(&e)[32..64], &av_bytes(&DEST)[..]);
        // A GID whose every byte differs shows no byte is swapped or dropped.
        let d = UdDest {
            dgid: core::array::from_fn(|i| 0xa0 + i as u8),
            remote_qpn: 0x00ab_cdef,
            remote_qkey: 0x1122_3344,
        };
        let mut w = wr(WR_SEND, &list);
        w.ud = Some(d);
        assert_eq!(
            &bytes_of(&encode_send(&w, &UD, no_inline).unwrap())[32..64],
            &av_bytes(&d)[..]
        );
    }

    #[test]
    fn ud_inline_sends() {
        let mut list = sges(2);
        list[1].length = 0;
        let mut w = wr(WR_SEND_WITH_IMM, &list);
        w.send_flags |= SEND_INLINE;
        w.ud = Some(DEST);
        let e = encode_send(&w, &UD, fill_pattern).unwrap();
        assert_eq!((e.num_sge, e.inline_len, e.imm_data), (0, 8, w.imm_data));
        assert_eq!(&bytes_of(&e)[32..64], &av_bytes(&DEST)[..]);
        // Given directly: the same WQE.
        let mut bytes = [0u8; 8];
        fill_pattern(&list[0], &mut bytes);
        let mut w2 = wr(WR_SEND_WITH_IMM, &[]);
        w2.ud = Some(DEST);
        let e2 = encode_send_inline(&w2, &bytes, &UD).unwrap();
        assert_eq!(bytes_of(&e), bytes_of(&e2));
        w2.ud = None;
        assert_eq!(
            encode_send_inline(&w2, &bytes, &UD).err(),
            Some(PostError::NoAddress)
        );
    }

    #[test]
    fn address_handle_attributes() {
        const EINVAL: c_int = sys::EINVAL as c_int;
        let gid = DEST.dgid;
        assert_eq!(check_ah_attr(1, 1, gid, 1), Ok(gid));
        assert_eq!(check_ah_attr(1, 8, gid, 8), Ok(gid));
        // No GRH: RoCE has none without one.
        assert_eq!(check_ah_attr(0, 1, gid, 1), Err(EINVAL));
        // Port 0, a port beyond the device's.
        assert_eq!(check_ah_attr(1, 0, gid, 8), Err(EINVAL));
        assert_eq!(check_ah_attr(1, 2, gid, 1), Err(EINVAL));
        assert_eq!(check_ah_attr(1, 1, gid, 0), Err(EINVAL));
        // The all-zero GID.
        assert_eq!(check_ah_attr(1, 1, [0; 16], 1), Err(EINVAL));
        // Any other GID (link-local IPv6, a single non-zero byte) is the kernel's to route.
        let mut one = [0u8; 16];
        one[15] = 1;
        assert_eq!(check_ah_attr(1, 1, one, 1), Ok(one));
    }

    #[test]
    fn sge_limits() {
        let list = sges(13);
        assert!(encode_send(&wr(WR_SEND, &list[..12]), &RC, no_inline).is_ok());
        assert_eq!(
            encode_send(&wr(WR_SEND, &list), &RC, no_inline)
                .err()
                .unwrap(),
            PostError::TooManySge
        );
        let two = SendLimits { max_sge: 2, ..RC };
        assert!(encode_send(&wr(WR_RDMA_READ, &list[..2]), &two, no_inline).is_ok());
        assert_eq!(
            encode_send(&wr(WR_RDMA_READ, &list[..3]), &two, no_inline)
                .err()
                .unwrap(),
            PostError::TooManySge
        );
        // Past the structure's 12: SGEs 12.. follow it in the entry; never more than 32.
        let big = SendLimits { max_sge: 64, ..RC };
        let long = sges(33);
        let w = encode_send(&wr(WR_SEND, &long[..32]), &big, no_inline).unwrap();
        assert_eq!(w.num_sge, 32);
        assert_eq!(crate::ffi::union_views::sge_of(&w)[11].addr, long[11].addr);
        assert_eq!(w.more.len(), 20);
        for (got, want) in w.more.iter().zip(&long[12..32]) {
            assert_eq!(
                (got.addr, got.length, got.lkey),
                (want.addr, want.length, want.lkey)
            );
        }
        assert_eq!(
            encode_send(&wr(WR_SEND, &long), &big, no_inline).err(),
            Some(PostError::TooManySge)
        );
        // Twelve or fewer leave the SGEs past the structure zero.
        let w = encode_send(&wr(WR_SEND, &list[..12]), &big, no_inline).unwrap();
        assert!(w
            .more
            .iter()
            .all(|s| (s.addr, s.length, s.lkey) == (0, 0, 0)));
        // Zero SGEs: a zero-length send.
        let w = encode_send(&wr(WR_SEND, &[]), &RC, no_inline).unwrap();
        assert_eq!((w.num_sge, w.inline_len), (0, 0));
    }

    fn fill_pattern(s: &sys::ibv_sge, dst: &mut [u8]) {
        assert_eq!(dst.len(), s.length as usize);
        for (i, b) in dst.iter_mut().enumerate() {
            *b = (s.lkey as u8).wrapping_add(i as u8);
        }
    }

    #[test]
    fn inline_sends_and_writes() {
        let mut list = sges(3); // 8 + 16 + 24 = 48 bytes
        list[1].length = 0; // skipped
        for op in [
            WR_SEND,
            WR_SEND_WITH_IMM,
            WR_RDMA_WRITE,
            WR_RDMA_WRITE_WITH_IMM,
        ] {
            let mut w = wr(op, &list);
            w.send_flags |= SEND_INLINE;
            let mut calls = 0;
            let e = encode_send(&w, &RC, |s, d| {
                calls += 1;
                fill_pattern(s, d)
            })
            .unwrap();
            assert_eq!(calls, 2);
            assert_eq!((e.num_sge, e.inline_len), (0, 32));
            assert_eq!(
                e.send_flags,
                SEND_INLINE | sys::ibv_send_flags_IBV_SEND_SIGNALED
            );
            let data = inline_of(&e);
            let expect: Vec<u8> = (0..8u8)
                .map(|i| 0x00u8.wrapping_add(i))
                .chain((0..24u8).map(|i| 0x02u8.wrapping_add(i)))
                .collect();
            assert_eq!(&data[..32], &expect[..]);
            assert!(data[32..].iter().all(|b| *b == 0));
        }
    }

    #[test]
    fn inline_limits() {
        let mut list = sges(2);
        list[0].length = 100;
        list[1].length = 92; // 192: exactly the WQE's room
        let mut w = wr(WR_SEND, &list);
        w.send_flags = SEND_INLINE;
        assert_eq!(encode_send(&w, &RC, fill_pattern).unwrap().inline_len, 192);
        list[1].length = 93;
        let mut w = wr(WR_SEND, &list);
        w.send_flags = SEND_INLINE;
        assert_eq!(
            encode_send(&w, &RC, no_inline).err().unwrap(),
            PostError::InlineTooLong
        );
        // The QP's max_inline_data is the limit.
        let small = SendLimits {
            max_inline: 64,
            ..RC
        };
        list[0].length = 32;
        list[1].length = 33;
        let mut w = wr(WR_RDMA_WRITE, &list);
        w.send_flags = SEND_INLINE;
        assert_eq!(
            encode_send(&w, &small, no_inline).err().unwrap(),
            PostError::InlineTooLong
        );
        list[1].length = 32;
        let mut w = wr(WR_RDMA_WRITE, &list);
        w.send_flags = SEND_INLINE;
        assert_eq!(
            encode_send(&w, &small, fill_pattern).unwrap().inline_len,
            64
        );
        // Huge lengths do not overflow the sum.
        list[0].length = u32::MAX;
        list[1].length = u32::MAX;
        let mut w = wr(WR_SEND, &list);
        w.send_flags = SEND_INLINE;
        assert_eq!(
            encode_send(&w, &RC, no_inline).err().unwrap(),
            PostError::InlineTooLong
        );
    }

    #[test]
    fn inline_is_ignored_for_reads_and_atomics() {
        let list = sges(1);
        for op in [WR_RDMA_READ, WR_ATOMIC_CMP_AND_SWP, WR_ATOMIC_FETCH_AND_ADD] {
            let mut w = wr(op, &list);
            w.send_flags |= SEND_INLINE;
            let e = encode_send(&w, &RC, no_inline).unwrap();
            assert_eq!((e.num_sge, e.inline_len), (1, 0));
            assert_eq!(e.send_flags & SEND_INLINE, 0);
        }
    }

    #[test]
    fn atomic_checks() {
        let mut list = sges(1);
        list[0].length = 4;
        for op in [WR_ATOMIC_CMP_AND_SWP, WR_ATOMIC_FETCH_AND_ADD] {
            assert_eq!(
                encode_send(&wr(op, &list), &RC, no_inline).err().unwrap(),
                PostError::BadAtomic
            );
            let ok = sges(1);
            let mut w = wr(op, &ok);
            w.remote_addr = 0x1004;
            assert_eq!(
                encode_send(&w, &RC, no_inline).err().unwrap(),
                PostError::BadAtomic
            );
            w.remote_addr = 0x1008;
            assert_eq!(encode_send(&w, &RC, no_inline).unwrap().remote_addr, 0x1008);
        }
    }

    #[test]
    fn sge_capacity_of_an_entry_size() {
        // The ABI's sizes: 64 header bytes then 16 an SGE (send), 16 then 16 (receive).
        assert_eq!(send_sge_capacity(256), 12);
        assert_eq!(send_sge_capacity(64 + 16 * 20), 20);
        assert_eq!(send_sge_capacity(576), 32);
        assert_eq!(send_sge_capacity(4096), 32);
        assert_eq!(send_sge_capacity(8), 0);
        assert_eq!(recv_sge_capacity(128), 7);
        assert_eq!(recv_sge_capacity(528), 32);
        assert_eq!(recv_sge_capacity(16 + 16 * 9), 9);
        assert_eq!(core::mem::size_of::<SendEntry>(), 576);
        assert_eq!(core::mem::size_of::<RecvEntry>(), 528);
    }

    #[test]
    fn recv_wqes() {
        let list = sges(8);
        let r = encode_recv(42, &list[..7], 7).unwrap();
        assert_eq!((r.wr_id, r.num_sge, r.reserved), (42, 7, 0));
        assert_eq!(
            (r.sge[6].addr, r.sge[6].length, r.sge[6].lkey),
            (0x7000, 56, 0x106)
        );
        assert_eq!(
            encode_recv(1, &list, 7).err().unwrap(),
            PostError::TooManySge
        );
        // Past the structure's 7: SGEs 7.. follow it in the entry; never more than 32.
        let long = sges(33);
        let r = encode_recv(1, &long[..32], 64).unwrap();
        assert_eq!(r.num_sge, 32);
        assert_eq!(r.sge[6].addr, long[6].addr);
        for (got, want) in r.more.iter().zip(&long[7..32]) {
            assert_eq!(
                (got.addr, got.length, got.lkey),
                (want.addr, want.length, want.lkey)
            );
        }
        assert_eq!(
            encode_recv(1, &long, 64).err().unwrap(),
            PostError::TooManySge
        );
        assert_eq!(
            encode_recv(1, &list[..3], 2).err().unwrap(),
            PostError::TooManySge
        );
        let r = encode_recv(1, &[], 0).unwrap();
        assert_eq!(r.num_sge, 0);
        assert!(r
            .sge
            .iter()
            .chain(&r.more)
            .all(|s| s.addr == 0 && s.length == 0));
    }

    #[test]
    fn post_list_stops_at_the_first_bad_wr() {
        let list = sges(1);
        let bad_op = wr(42, &list);
        let reqs = [
            wr(WR_SEND, &list),
            wr(WR_RDMA_WRITE, &list),
            bad_op,
            wr(WR_SEND, &list),
        ];
        let ring = VecRing::new(8, 0u64, 0);
        let mut p = Producer::new(&ring).unwrap();
        let out = post_list(p.batch(), reqs.iter().enumerate(), |(_, w)| {
            encode_send(w, &RC, no_inline).map(|e| e.wr_id ^ u64::from(e.opcode))
        });
        assert_eq!(out.posted, 2);
        let (bad, err) = out.failed.unwrap();
        assert_eq!((bad.0, err), (2, PostError::BadOpcode));
        assert_eq!(ring.producer.get(), 2);
        assert_eq!(ring.producer_stores.get(), 1);
        assert_eq!(ring.slot(1), 0xabcd_0000_0000_0001); // RDMA_WRITE is opcode 0
    }

    #[test]
    fn post_list_reports_a_full_ring_with_enomem() {
        let ring = VecRing::new(2, 0u32, u32::MAX);
        let mut p = Producer::new(&ring).unwrap();
        let out = post_list(p.batch(), 0..5u32, |i| Ok(*i));
        assert_eq!(out.posted, 2);
        assert_eq!(out.failed, Some((2, PostError::QueueFull)));
        assert_eq!(out.failed.unwrap().1.errno(), sys::ENOMEM as c_int);
        assert_eq!(ring.producer.get(), 1);
        // First WR bad: nothing published.
        let out = post_list(p.batch(), 0..1u32, |_| Err(PostError::BadFlags));
        assert_eq!(out.posted, 0);
        assert_eq!(ring.producer_stores.get(), 1);
    }

    #[test]
    fn cqe_translation_is_one_to_one() {
        let cqe = sys::metaroce_cqe {
            wr_id: 0x1122_3344_5566_7788,
            status: sys::ibv_wc_status_IBV_WC_LOC_PROT_ERR,
            opcode: sys::ibv_wc_opcode_IBV_WC_RECV_RDMA_WITH_IMM,
            vendor_err: 0x55,
            byte_len: 4096,
            imm_data: 0xdead_beefu32.to_be(),
            qp_num: 0x12,
            src_qp: 0x34,
            wc_flags: sys::ibv_wc_flags_IBV_WC_WITH_IMM | sys::ibv_wc_flags_IBV_WC_GRH,
            pkey_index: 7,
            slid: 0xbeef,
            sl: 3,
            dlid_path_bits: 9,
            reserved: [0xff; 18],
        };
        let wc = cqe_to_wc(&cqe);
        assert_eq!(wc.wr_id, 0x1122_3344_5566_7788);
        assert_eq!(wc.status, 4);
        assert_eq!(wc.opcode, 129);
        assert_eq!((wc.vendor_err, wc.byte_len), (0x55, 4096));
        assert_eq!(wc_imm(&wc), 0xdead_beefu32.to_be());
        assert_eq!((wc.qp_num, wc.src_qp, wc.wc_flags), (0x12, 0x34, 3));
        assert_eq!(
            (wc.pkey_index, wc.slid, wc.sl, wc.dlid_path_bits),
            (7, 0xbeef, 3, 9)
        );
        // The flag values the kernel must use are libibverbs', not the kernel's IB_WC_*.
        assert_eq!(sys::ibv_wc_flags_IBV_WC_IP_CSUM_OK, 4);
        assert_eq!(sys::ibv_wc_flags_IBV_WC_WITH_INV, 8);
    }

    #[test]
    fn inline_bytes_encode_like_inline_sges() {
        let payload: Vec<u8> = (0..48u8).collect();
        let list = [
            sys::ibv_sge {
                addr: 0x1000,
                length: 20,
                lkey: 1,
            },
            sys::ibv_sge {
                addr: 0x2000,
                length: 28,
                lkey: 2,
            },
        ];
        for op in [
            WR_SEND,
            WR_SEND_WITH_IMM,
            WR_RDMA_WRITE,
            WR_RDMA_WRITE_WITH_IMM,
        ] {
            let mut w = wr(op, &list);
            w.send_flags |= SEND_INLINE;
            let from_sges = encode_send(&w, &RC, |s, d| {
                let at = if s.addr == 0x1000 { 0 } else { 20 };
                d.copy_from_slice(&payload[at..at + d.len()]);
            })
            .unwrap();
            // Without IBV_SEND_INLINE in the flags and no SGEs: the same WQE.
            let mut w = wr(op, &[]);
            w.send_flags &= !SEND_INLINE;
            let from_bytes = encode_send_inline(&w, &payload, &RC).unwrap();
            assert_eq!(bytes_of(&from_sges), bytes_of(&from_bytes), "opcode {op}");
            assert_eq!(from_bytes.send_flags & SEND_INLINE, SEND_INLINE);
        }
        // No SGE limit applies, the inline limit does; reads and atomics take no inline data.
        let none = SendLimits { max_sge: 0, ..RC };
        assert_eq!(
            encode_send_inline(&wr(WR_SEND, &[]), &payload, &none)
                .unwrap()
                .inline_len,
            48
        );
        let small = SendLimits {
            max_inline: 47,
            ..RC
        };
        assert_eq!(
            encode_send_inline(&wr(WR_SEND, &[]), &payload, &small).err(),
            Some(PostError::InlineTooLong)
        );
        assert_eq!(
            encode_send_inline(&wr(WR_SEND, &[]), &[0; 193], &RC).err(),
            Some(PostError::InlineTooLong)
        );
        for op in [
            WR_RDMA_READ,
            WR_ATOMIC_CMP_AND_SWP,
            WR_ATOMIC_FETCH_AND_ADD,
            WR_BIND_MW,
            WR_LOCAL_INV,
            10,
        ] {
            assert_eq!(
                encode_send_inline(&wr(op, &[]), &payload, &RC).err(),
                Some(PostError::BadOpcode)
            );
        }
        let mut w = wr(WR_SEND, &[]);
        w.send_flags = 1 << 7;
        assert_eq!(
            encode_send_inline(&w, &payload, &RC).err(),
            Some(PostError::BadFlags)
        );
        // An empty payload: a zero-length inline send.
        let e = encode_send_inline(&wr(WR_SEND, &[]), &[], &RC).unwrap();
        assert_eq!((e.num_sge, e.inline_len), (0, 0));
    }

    /// The bytes of a WQE as they land in the ring.
    fn bytes_of(w: &sys::metaroce_send_wqe) -> [u8; 256] {
        let mut out = [0u8; 256];
        let mut put = |at: usize, b: &[u8]| out[at..at + b.len()].copy_from_slice(b);
        put(0, &w.wr_id.to_ne_bytes());
        put(8, &w.opcode.to_ne_bytes());
        put(12, &w.send_flags.to_ne_bytes());
        put(16, &w.num_sge.to_ne_bytes());
        put(20, &w.inline_len.to_ne_bytes());
        put(24, &w.imm_data.to_ne_bytes());
        put(28, &w.reserved0.to_ne_bytes());
        put(32, &w.remote_addr.to_ne_bytes());
        put(40, &w.rkey.to_ne_bytes());
        put(44, &w.reserved1.to_ne_bytes());
        put(48, &w.compare_add.to_ne_bytes());
        put(56, &w.swap.to_ne_bytes());
        put(64, &inline_of(w));
        out
    }
}
