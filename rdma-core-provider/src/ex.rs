// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The extended CQ and QP verbs in safe Rust: which `ibv_create_cq_ex` / `ibv_create_qp_ex`
//! attributes this provider accepts, and a batch of work requests being built through the
//! `ibv_wr_*` API.
//!
//! An extended CQ is an ordinary CQ (the same kernel command, ring and `ibv_poll_cq`) read one
//! completion at a time; an extended QP is an ordinary QP whose send work requests may also be
//! built field by field. A [`WrBatch`] turns each one into exactly the WQE `ibv_post_send`
//! writes for the same work (through [`wqe::encode_send`]) and queues it unpublished in the SQ
//! ring; `wr_complete` publishes them all with one store and one doorbell, or none of them if
//! any failed (its errno is what `wr_complete` returns), and `wr_abort` forgets them.

use crate::ffi::sys;
use crate::ring::{Producer, RingMemory, Staged};
use crate::wqe::{self, PostError, SendLimits, SendWr, UdDest, MAX_INLINE};
use core::ffi::c_int;

const EOPNOTSUPP: c_int = sys::EOPNOTSUPP as c_int;
const EINVAL: c_int = sys::EINVAL as c_int;

/// The `wc_flags` an extended CQ can read: every field a `metaroce_cqe` carries
/// (`IBV_WC_STANDARD_FLAGS`: byte_len, imm_data / invalidated rkey, qp_num, src_qp, slid, sl,
/// dlid_path_bits; opcode, vendor_err and wc_flags are always readable). Timestamps, CVLAN,
/// flow tag and tag matching are not in the CQE.
pub const WC_FLAGS_SUPPORTED: u64 = sys::IBV_WC_STANDARD_FLAGS as u64;

/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a hint we may ignore (the CQ stays locked).
/// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN` is refused: the kernel never overwrites an unconsumed
/// CQE (it raises `IBV_EVENT_CQ_ERR`) and takes no CQ flags (it fails them with `EINVAL`).
pub const CQ_FLAGS_SUPPORTED: u32 =
    sys::ibv_create_cq_attr_flags_IBV_CREATE_CQ_ATTR_SINGLE_THREADED;

/// Checks `ibv_cq_init_attr_ex`'s `comp_mask`, `wc_flags` and (with
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`) `flags`: anything unknown or unsupported is `EOPNOTSUPP`, as
/// rdma-core's providers answer. `IBV_CQ_INIT_ATTR_MASK_PD` names a parent domain, which this
/// provider has none of.
pub fn check_cq_attr(comp_mask: u32, wc_flags: u64, flags: u32) -> Result<(), c_int> {
    if comp_mask & !sys::ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
        return Err(EOPNOTSUPP);
    }
    if wc_flags & !WC_FLAGS_SUPPORTED != 0 {
        return Err(EOPNOTSUPP);
    }
    if comp_mask & sys::ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
        && flags & !CQ_FLAGS_SUPPORTED != 0
    {
        return Err(EOPNOTSUPP);
    }
    Ok(())
}

/// Each `IBV_QP_EX_WITH_*` send op and the `ibv_wr_opcode` its builder posts. TSO has none
/// the device carries (`verbs-core/src/wqe.rs` fails the QP on it).
pub const SEND_OPS: [(u64, u32); 12] = [
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE as u64,
        sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM as u64,
        sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND as u64,
        sys::ibv_wr_opcode_IBV_WR_SEND,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM as u64,
        sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ as u64,
        sys::ibv_wr_opcode_IBV_WR_RDMA_READ,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP as u64,
        sys::ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD as u64,
        sys::ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_LOCAL_INV as u64,
        sys::ibv_wr_opcode_IBV_WR_LOCAL_INV,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_BIND_MW as u64,
        sys::ibv_wr_opcode_IBV_WR_BIND_MW,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_INV as u64,
        sys::ibv_wr_opcode_IBV_WR_SEND_WITH_INV,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_FLUSH as u64,
        sys::ibv_wr_opcode_IBV_WR_FLUSH,
    ),
    (
        sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_WRITE as u64,
        sys::ibv_wr_opcode_IBV_WR_ATOMIC_WRITE,
    ),
];

/// Checks `send_ops_flags` for a QP of `qp_type`: every op must be one `ibv_post_send` accepts
/// on that type (RC: all twelve of [`SEND_OPS`]; UC: sends and RDMA writes; UD: the two sends;
/// the others: none), else `EOPNOTSUPP`.
pub fn check_send_ops(qp_type: u32, send_ops_flags: u64) -> Result<(), c_int> {
    let mut left = send_ops_flags;
    for (flag, opcode) in SEND_OPS {
        if send_ops_flags & flag != 0 {
            if !wqe::opcode_allowed(qp_type, opcode) {
                return Err(EOPNOTSUPP);
            }
            left &= !flag;
        }
    }
    if left != 0 {
        return Err(EOPNOTSUPP);
    }
    Ok(())
}

/// The `ibv_qp_init_attr_ex.comp_mask` bits accepted.
pub const QP_COMP_MASK_SUPPORTED: u32 = sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD
    | sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS
    | sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// Checks an `ibv_qp_init_attr_ex`: `comp_mask` within [`QP_COMP_MASK_SUPPORTED`] (XRC, TSO,
/// RSS: `EOPNOTSUPP`) and with a PD (`EINVAL` without), no create flags (`EOPNOTSUPP`), and
/// [`check_send_ops`]. Returns whether the QP gets the `ibv_wr_*` API
/// (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` given).
pub fn check_qp_attr(
    comp_mask: u32,
    create_flags: u32,
    qp_type: u32,
    send_ops_flags: u64,
) -> Result<bool, c_int> {
    if comp_mask & !QP_COMP_MASK_SUPPORTED != 0 {
        return Err(EOPNOTSUPP);
    }
    if comp_mask & sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD == 0 {
        return Err(EINVAL);
    }
    if comp_mask & sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS != 0
        && create_flags != 0
    {
        return Err(EOPNOTSUPP);
    }
    let ex = comp_mask & sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
    if ex {
        check_send_ops(qp_type, send_ops_flags)?;
    }
    Ok(ex)
}

/// A work request as an `ibv_wr_*` builder named it (with `ibv_qp_ex.wr_id` and `.wr_flags`
/// as they were then), before its data; fields its opcode does not use are 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WrOp {
    pub wr_id: u64,
    pub opcode: u32,
    pub send_flags: u32,
    /// Big-endian, as the application gave it.
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub compare_add: u64,
    pub swap: u64,
    /// UD: the destination `ibv_wr_set_ud_addr` gave, if it came before the data setter.
    pub ud: Option<UdDest>,
}

impl WrOp {
    /// The `ibv_post_send` work request for the same work, with `sg_list` as its SGEs.
    fn view<'a>(&self, sg_list: &'a [sys::ibv_sge]) -> SendWr<'a> {
        SendWr {
            wr_id: self.wr_id,
            opcode: self.opcode,
            send_flags: self.send_flags,
            sg_list,
            imm_data: self.imm_data,
            remote_addr: self.remote_addr,
            rkey: self.rkey,
            compare_add: self.compare_add,
            swap: self.swap,
            ud: self.ud,
        }
    }
}

/// The work request a batch is building, between its builder and its last setter.
#[derive(Clone, Copy)]
// An entry of up to 32 SGEs kept for one work request of the open batch: boxing it would
// allocate in the post path.
#[allow(clippy::large_enum_variant)]
enum Pending {
    /// A builder named it; its data setter has not come yet (on UD perhaps its address has).
    Op(WrOp),
    /// UD: its data setter came before `ibv_wr_set_ud_addr` (the verbs allow either order):
    /// encoded and checked with a zero address vector, which the address setter overwrites
    /// before it queues the WQE.
    NeedsAddress(wqe::SendEntry),
}

impl core::fmt::Debug for Pending {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Op(op) => f.debug_tuple("Op").field(op).finish(),
            Self::NeedsAddress(w) => f.debug_tuple("NeedsAddress").field(&w.wr_id).finish(),
        }
    }
}

/// What a data setter gives the pending work request.
#[derive(Clone, Copy, Debug)]
pub enum WrData<'a> {
    /// `ibv_wr_set_sge` / `_sge_list`: as `ibv_post_send`'s `sg_list` (so `IBV_SEND_INLINE` in
    /// `wr_flags` copies their bytes into the WQE, as there).
    Sges(&'a [sys::ibv_sge]),
    /// `ibv_wr_set_inline_data` / `_list`, gathered: the payload itself.
    Inline(&'a [u8]),
}

/// Gathers the payload of `ibv_wr_set_inline_data_list` (`ibv_wr_set_inline_data` is a
/// one-buffer list) into WQE-sized storage: `copy(buf, dst)` fills `dst` (`buf.length` bytes)
/// from `buf.addr`; it is called only once the total is known to fit in `max` bytes, and not
/// for empty buffers. Returns the storage and the total.
pub fn gather_inline(
    bufs: &[sys::ibv_data_buf],
    max: u32,
    mut copy: impl FnMut(&sys::ibv_data_buf, &mut [u8]),
) -> Result<([u8; MAX_INLINE as usize], usize), PostError> {
    let limit = max.min(MAX_INLINE) as usize;
    let total = bufs
        .iter()
        .try_fold(0usize, |sum, b| sum.checked_add(b.length))
        .filter(|total| *total <= limit)
        .ok_or(PostError::InlineTooLong)?;
    let mut data = [0u8; MAX_INLINE as usize];
    let mut at = 0;
    for b in bufs.iter().filter(|b| b.length != 0) {
        copy(b, &mut data[at..at + b.length]);
        at += b.length;
    }
    Ok((data, total))
}

/// One `ibv_wr_start` .. `ibv_wr_complete` / `ibv_wr_abort` batch of an SQ. A builder makes a
/// work request pending; its data setter encodes it and queues the WQE (unpublished); a
/// pending request that got no data is queued without data when the next builder comes or
/// at `wr_complete`. On a UD QP a work request also needs `ibv_wr_set_ud_addr`, before or
/// after its data setter: the WQE is queued once it has both (or, with no data, at the next
/// builder or `wr_complete`). The first error sticks: nothing after it is queued, and
/// `wr_complete` returns its errno with nothing published.
#[derive(Debug)]
pub struct WrBatch {
    staged: Staged,
    pending: Option<Pending>,
    error: Option<PostError>,
}

impl WrBatch {
    /// `ibv_wr_start`: a batch on `ring`, which must have no other batch open.
    pub fn start<M: RingMemory>(ring: &Producer<M>) -> Self {
        Self {
            staged: ring.stage(),
            pending: None,
            error: None,
        }
    }

    /// The error that will fail `wr_complete`, if any yet.
    pub fn error(&self) -> Option<PostError> {
        self.error
    }

    /// Fails the batch with `e` (unless it failed already).
    pub fn fail(&mut self, e: PostError) {
        self.pending = None;
        self.error.get_or_insert(e);
    }

    /// Queues `wqe` (a checked encoding) or fails the batch.
    fn queue<M: RingMemory<Entry = wqe::SendEntry>>(
        &mut self,
        ring: &mut Producer<M>,
        wqe: Result<wqe::SendEntry, PostError>,
    ) {
        match wqe.and_then(|w| {
            ring.push_staged(&mut self.staged, &w)
                .map_err(PostError::from)
        }) {
            Ok(()) => {}
            Err(e) => self.fail(e),
        }
    }

    /// Queues the pending work request with no data, if there is one.
    fn flush<M: RingMemory<Entry = wqe::SendEntry>>(
        &mut self,
        ring: &mut Producer<M>,
        limits: &SendLimits,
    ) {
        match self.pending.take() {
            None => {}
            Some(Pending::Op(op)) => {
                let wqe = wqe::encode_send(&op.view(&[]), limits, |_, _| {});
                self.queue(ring, wqe);
            }
            Some(Pending::NeedsAddress(_)) => self.fail(PostError::NoAddress),
        }
    }

    /// A builder (`ibv_wr_send`, `ibv_wr_rdma_write`, ...): `op` becomes the pending work
    /// request, after the one before it is queued.
    pub fn build<M: RingMemory<Entry = wqe::SendEntry>>(
        &mut self,
        ring: &mut Producer<M>,
        limits: &SendLimits,
        op: WrOp,
    ) {
        self.flush(ring, limits);
        if self.error.is_none() {
            self.pending = Some(Pending::Op(op));
        }
    }

    /// A data setter: encodes the pending work request with `data` and queues it. A setter
    /// with no builder before it fails the batch (`EINVAL`). `copy_inline` is
    /// [`wqe::encode_send`]'s, for `IBV_SEND_INLINE` with SGEs.
    pub fn set_data<M: RingMemory<Entry = wqe::SendEntry>>(
        &mut self,
        ring: &mut Producer<M>,
        limits: &SendLimits,
        data: WrData<'_>,
        copy_inline: impl FnMut(&sys::ibv_sge, &mut [u8]),
    ) {
        if self.error.is_some() {
            return;
        }
        let Some(Pending::Op(mut op)) = self.pending.take() else {
            return self.fail(PostError::OutOfOrder);
        };
        // UD with no address yet: encode against a placeholder, the address setter fills it.
        let needs_address = limits.qp_type == sys::ibv_qp_type_IBV_QPT_UD && op.ud.is_none();
        if needs_address {
            op.ud = Some(UdDest::default());
        }
        let wqe = match data {
            WrData::Sges(sges) => wqe::encode_send(&op.view(sges), limits, copy_inline),
            WrData::Inline(bytes) => wqe::encode_send_inline(&op.view(&[]), bytes, limits),
        };
        match wqe {
            Ok(w) if needs_address => self.pending = Some(Pending::NeedsAddress(w)),
            _ => self.queue(ring, wqe),
        }
    }

    /// `ibv_wr_set_ud_addr`: the pending work request's destination (`None`: the AH was NULL
    /// or not one of this context's, `EINVAL`). Only on a UD QP, once per work request, after
    /// its builder; anything else fails the batch (`EINVAL`).
    pub fn set_ud_addr<M: RingMemory<Entry = wqe::SendEntry>>(
        &mut self,
        ring: &mut Producer<M>,
        limits: &SendLimits,
        dest: Option<UdDest>,
    ) {
        if self.error.is_some() {
            return;
        }
        if limits.qp_type != sys::ibv_qp_type_IBV_QPT_UD {
            return self.fail(PostError::OutOfOrder);
        }
        let Some(dest) = dest else {
            return self.fail(PostError::NoAddress);
        };
        match self.pending.take() {
            Some(Pending::Op(op)) if op.ud.is_none() => {
                self.pending = Some(Pending::Op(WrOp {
                    ud: Some(dest),
                    ..op
                }));
            }
            Some(Pending::NeedsAddress(mut w)) => {
                wqe::set_ud_av(&mut w, &dest.av());
                self.queue(ring, Ok(w));
            }
            // No builder, or a second address for the same work request.
            _ => self.fail(PostError::OutOfOrder),
        }
    }

    /// `ibv_wr_complete`: publishes every queued WQE with one store (returning how many; the
    /// caller rings the doorbell if any), or, if anything failed, none (the ring is as before
    /// `wr_start`) and returns the error.
    pub fn complete<M: RingMemory<Entry = wqe::SendEntry>>(
        mut self,
        ring: &mut Producer<M>,
        limits: &SendLimits,
    ) -> Result<u32, PostError> {
        self.flush(ring, limits);
        match self.error {
            Some(e) => {
                ring.abort_staged(self.staged);
                Err(e)
            }
            None => Ok(ring.commit_staged(self.staged)),
        }
    }

    /// `ibv_wr_abort`: forgets every queued WQE; the ring is as before `wr_start`.
    pub fn abort<M: RingMemory>(self, ring: &mut Producer<M>) {
        ring.abort_staged(self.staged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::testing::VecRing;
    use crate::wqe::{encode_send, SendEntry, MAX_SEND_SGE};

    const RC: u32 = sys::ibv_qp_type_IBV_QPT_RC;
    const UC: u32 = sys::ibv_qp_type_IBV_QPT_UC;
    const UD: u32 = sys::ibv_qp_type_IBV_QPT_UD;
    const LIMITS: SendLimits = SendLimits {
        qp_type: RC,
        max_sge: 2,
        max_inline: 64,
    };

    #[test]
    fn cq_attributes() {
        const FLAGS: u32 = sys::ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS;
        const PD: u32 = sys::ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD;
        assert_eq!(WC_FLAGS_SUPPORTED, 0x7f);
        assert_eq!(check_cq_attr(0, 0, 0), Ok(()));
        assert_eq!(check_cq_attr(0, WC_FLAGS_SUPPORTED, 0), Ok(()));
        // Every single flag outside the standard ones, known or not.
        for bit in 7..64 {
            assert_eq!(check_cq_attr(0, 1 << bit, 0), Err(EOPNOTSUPP), "{bit}");
        }
        // flags count only with IBV_CQ_INIT_ATTR_MASK_FLAGS.
        assert_eq!(check_cq_attr(0, 0, u32::MAX), Ok(()));
        assert_eq!(check_cq_attr(FLAGS, 0, CQ_FLAGS_SUPPORTED), Ok(()));
        assert_eq!(check_cq_attr(FLAGS, 0, 1), Ok(())); // SINGLE_THREADED
        assert_eq!(check_cq_attr(FLAGS, 0, 2), Err(EOPNOTSUPP)); // IGNORE_OVERRUN
        assert_eq!(check_cq_attr(FLAGS, 0, 4), Err(EOPNOTSUPP));
        // A parent domain, unknown mask bits.
        assert_eq!(check_cq_attr(PD, 0, 0), Err(EOPNOTSUPP));
        assert_eq!(check_cq_attr(FLAGS | 4, 0, 0), Err(EOPNOTSUPP));
        assert_eq!(check_cq_attr(1 << 31, 0, 0), Err(EOPNOTSUPP));
    }

    #[test]
    fn send_ops_per_qp_type() {
        let all: u64 = SEND_OPS.iter().map(|(f, _)| f).sum();
        assert_eq!(all, 0x3ff | 1 << 11 | 1 << 12);
        assert_eq!(check_send_ops(RC, all), Ok(()));
        assert_eq!(check_send_ops(RC, 0), Ok(()));
        let uc_ok: u64 = 0xf; // RDMA_WRITE(_WITH_IMM), SEND(_WITH_IMM)
        assert_eq!(check_send_ops(UC, uc_ok), Ok(()));
        for bit in [4, 5, 6, 7, 8, 9, 11, 12] {
            assert_eq!(check_send_ops(UC, 1 << bit), Err(EOPNOTSUPP), "UC {bit}");
        }
        // UD: SEND and SEND_WITH_IMM only.
        assert_eq!(check_send_ops(UD, 0xc), Ok(()));
        for bit in [0, 1, 4, 5, 6, 7, 8, 9, 11, 12] {
            assert_eq!(check_send_ops(UD, 1 << bit), Err(EOPNOTSUPP), "UD {bit}");
        }
        // TSO, and unknown bits.
        for bit in (10..11).chain(13..64) {
            assert_eq!(check_send_ops(RC, 1 << bit), Err(EOPNOTSUPP), "RC {bit}");
        }
        // The opcodes are the ones post_send takes.
        for (_, opcode) in SEND_OPS {
            assert!(wqe::op_class(opcode).is_some());
        }
    }

    #[test]
    fn qp_attributes() {
        const PD: u32 = sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD;
        const CF: u32 = sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS;
        const OPS: u32 = sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        const SEND: u64 = sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND as u64;
        assert_eq!(check_qp_attr(PD | OPS, 0, RC, SEND), Ok(true));
        assert_eq!(check_qp_attr(PD | OPS | CF, 0, RC, SEND), Ok(true));
        assert_eq!(check_qp_attr(PD | CF, 0, UD, SEND), Ok(false)); // ops ignored
        assert_eq!(check_qp_attr(PD | OPS, 0, UD, 0), Ok(true));
        assert_eq!(check_qp_attr(PD | OPS, 0, UD, SEND), Ok(true));
        const WRITE: u64 = sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE as u64;
        assert_eq!(
            check_qp_attr(PD | OPS, 0, UD, SEND | WRITE),
            Err(EOPNOTSUPP)
        );
        assert_eq!(check_qp_attr(PD | CF, 2, RC, 0), Err(EOPNOTSUPP));
        assert_eq!(check_qp_attr(OPS, 0, RC, SEND), Err(EINVAL));
        // XRCD, MAX_TSO_HEADER, IND_TABLE, RX_HASH, unknown.
        for bit in [1, 3, 4, 5, 7, 31] {
            assert_eq!(check_qp_attr(PD | 1 << bit, 0, RC, 0), Err(EOPNOTSUPP));
        }
    }

    fn sge(addr: u64, length: u32, lkey: u32) -> sys::ibv_sge {
        sys::ibv_sge { addr, length, lkey }
    }

    fn op(opcode: u32, wr_id: u64) -> WrOp {
        WrOp {
            wr_id,
            opcode,
            send_flags: sys::ibv_send_flags_IBV_SEND_SIGNALED,
            ..WrOp::default()
        }
    }

    fn no_copy(_: &sys::ibv_sge, _: &mut [u8]) {
        panic!("no inline copy expected");
    }

    #[test]
    fn a_batch_queues_what_post_send_would_and_publishes_once() {
        let ring = VecRing::new(8, zero_wqe(), 5);
        let mut p = Producer::new(&ring).unwrap();
        let mut b = WrBatch::start(&p);
        let sges = [sge(0x1000, 16, 3), sge(0x2000, 8, 4)];
        let mut write = op(sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE, 1);
        (write.remote_addr, write.rkey) = (0x9000, 0x77);
        b.build(&mut p, &LIMITS, write);
        b.set_data(&mut p, &LIMITS, WrData::Sges(&sges), no_copy);
        // A send with no data setter: queued without data when the next builder comes.
        b.build(&mut p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 2));
        let mut imm = op(sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM, 3);
        imm.imm_data = 0x0a0b_0c0du32.to_be();
        b.build(&mut p, &LIMITS, imm);
        b.set_data(&mut p, &LIMITS, WrData::Inline(b"abc"), no_copy);
        let mut faa = op(sys::ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD, 4);
        (faa.remote_addr, faa.rkey, faa.compare_add) = (0x9008, 0x77, 5);
        b.build(&mut p, &LIMITS, faa);
        b.set_data(&mut p, &LIMITS, WrData::Sges(&sges[1..]), no_copy);
        // Nothing visible before wr_complete.
        assert_eq!((ring.producer.get(), ring.producer_stores.get()), (5, 0));
        assert_eq!(b.error(), None);
        assert_eq!(b.complete(&mut p, &LIMITS), Ok(4));
        assert_eq!((ring.producer.get(), ring.producer_stores.get()), (9, 1));

        let send_wr = |o: &WrOp, sg| o.view(sg);
        let expect = [
            encode_send(&send_wr(&write, &sges), &LIMITS, no_copy).unwrap(),
            encode_send(
                &send_wr(&op(sys::ibv_wr_opcode_IBV_WR_SEND, 2), &[]),
                &LIMITS,
                no_copy,
            )
            .unwrap(),
            wqe::encode_send_inline(&send_wr(&imm, &[]), b"abc", &LIMITS).unwrap(),
            encode_send(&send_wr(&faa, &sges[1..]), &LIMITS, no_copy).unwrap(),
        ];
        for (i, e) in expect.iter().enumerate() {
            assert_eq!(wqe_bytes(&ring.slot(5 + i as u32)), wqe_bytes(e), "WQE {i}");
        }
        assert_eq!(ring.slot(7).inline_len, 3);
        assert_eq!(ring.slot(8).compare_add, 5);
    }

    #[test]
    fn memory_window_builders_need_no_data_setter() {
        // wr_bind_mw and wr_local_inv are complete as built (the next builder or wr_complete
        // queues them); wr_send_inv takes its data like a send.
        let ring = VecRing::new(8, zero_wqe(), 0);
        let mut p = Producer::new(&ring).unwrap();
        let mut b = WrBatch::start(&p);
        let mut bind = op(sys::ibv_wr_opcode_IBV_WR_BIND_MW, 1);
        (bind.rkey, bind.imm_data, bind.remote_addr) = (0x8000_0500, 0x8000_0501, 0x4000);
        (bind.compare_add, bind.swap) = (64, (2u64 << 32) | 0x33);
        b.build(&mut p, &LIMITS, bind);
        let mut inv = op(sys::ibv_wr_opcode_IBV_WR_LOCAL_INV, 2);
        inv.imm_data = 0x8000_0501;
        b.build(&mut p, &LIMITS, inv);
        let mut sinv = op(sys::ibv_wr_opcode_IBV_WR_SEND_WITH_INV, 3);
        sinv.imm_data = 0x8000_0777;
        b.build(&mut p, &LIMITS, sinv);
        let sges = [sge(0x1000, 16, 3)];
        b.set_data(&mut p, &LIMITS, WrData::Sges(&sges), no_copy);
        assert_eq!(b.complete(&mut p, &LIMITS), Ok(3));
        let w = ring.slot(0);
        assert_eq!(
            (w.opcode, w.num_sge, w.rkey, w.imm_data),
            (8, 0, 0x8000_0500, 0x8000_0501)
        );
        assert_eq!(
            (w.remote_addr, w.compare_add, w.swap),
            (0x4000, 64, (2u64 << 32) | 0x33)
        );
        let w = ring.slot(1);
        assert_eq!(
            (w.opcode, w.num_sge, w.imm_data, w.rkey),
            (7, 0, 0x8000_0501, 0)
        );
        let w = ring.slot(2);
        assert_eq!((w.opcode, w.num_sge, w.imm_data), (9, 1, 0x8000_0777));
    }

    #[test]
    fn a_failed_batch_publishes_nothing() {
        let ring = VecRing::new(4, zero_wqe(), 0);
        let mut p = Producer::new(&ring).unwrap();
        type Run = fn(&mut WrBatch, &mut Producer<&VecRing<SendEntry>>);
        let cases: [(&str, Run, PostError); 6] = [
            (
                "too many SGEs",
                |b, p| {
                    b.build(p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
                    b.set_data(p, &LIMITS, WrData::Sges(&[sge(0, 1, 1); 3]), no_copy);
                },
                PostError::TooManySge,
            ),
            (
                "inline too long",
                |b, p| {
                    b.build(p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
                    b.set_data(p, &LIMITS, WrData::Inline(&[0; 65]), no_copy);
                },
                PostError::InlineTooLong,
            ),
            (
                "ring full",
                |b, p| {
                    for i in 0..5 {
                        b.build(p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, i));
                        b.set_data(p, &LIMITS, WrData::Sges(&[]), no_copy);
                    }
                },
                PostError::QueueFull,
            ),
            (
                "a setter with no builder",
                |b, p| b.set_data(p, &LIMITS, WrData::Sges(&[]), no_copy),
                PostError::OutOfOrder,
            ),
            (
                "two setters",
                |b, p| {
                    b.build(p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
                    b.set_data(p, &LIMITS, WrData::Sges(&[]), no_copy);
                    b.set_data(p, &LIMITS, WrData::Sges(&[]), no_copy);
                },
                PostError::OutOfOrder,
            ),
            (
                "an atomic with no 8-byte SGE (the last WR, queued at wr_complete)",
                |b, p| {
                    b.build(p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
                    let mut a = op(sys::ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP, 2);
                    a.remote_addr = 8;
                    b.build(p, &LIMITS, a);
                },
                PostError::BadAtomic,
            ),
        ];
        for (what, run, err) in cases {
            let mut b = WrBatch::start(&p);
            run(&mut b, &mut p);
            assert_eq!(b.complete(&mut p, &LIMITS), Err(err), "{what}");
            assert_eq!(
                (ring.producer.get(), ring.producer_stores.get()),
                (0, 0),
                "{what}"
            );
        }
        // The first error is the one reported; later calls change nothing.
        let mut b = WrBatch::start(&p);
        b.fail(PostError::InlineTooLong);
        b.build(&mut p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
        b.set_data(&mut p, &LIMITS, WrData::Sges(&[sge(0, 1, 1); 9]), no_copy);
        assert_eq!(b.complete(&mut p, &LIMITS), Err(PostError::InlineTooLong));
        assert_eq!(PostError::OutOfOrder.errno(), EINVAL);
        assert_eq!(PostError::QueueFull.errno(), sys::ENOMEM as c_int);
        // After all that, the ring takes a full batch from slot 0.
        let mut b = WrBatch::start(&p);
        for i in 0..4 {
            b.build(&mut p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 10 + i));
        }
        assert_eq!(b.complete(&mut p, &LIMITS), Ok(4));
        assert_eq!((ring.slot(0).wr_id, ring.slot(3).wr_id), (10, 13));
    }

    const UD_LIMITS: SendLimits = SendLimits {
        qp_type: UD,
        ..LIMITS
    };

    fn dest(n: u8) -> UdDest {
        UdDest {
            dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, n],
            remote_qpn: 0x100 + u32::from(n),
            remote_qkey: 0x1111_0000 + u32::from(n),
        }
    }

    #[test]
    fn ud_address_before_or_after_the_data_gives_post_sends_wqe() {
        let ring = VecRing::new(8, zero_wqe(), 0);
        let mut p = Producer::new(&ring).unwrap();
        let mut b = WrBatch::start(&p);
        let sges = [sge(0x1000, 16, 3)];
        // Address first, then SGEs.
        b.build(&mut p, &UD_LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
        b.set_ud_addr(&mut p, &UD_LIMITS, Some(dest(1)));
        b.set_data(&mut p, &UD_LIMITS, WrData::Sges(&sges), no_copy);
        // Inline data first, then the address (the WQE is queued only then).
        let mut imm = op(sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM, 2);
        imm.imm_data = 0x0a0b_0c0du32.to_be();
        b.build(&mut p, &UD_LIMITS, imm);
        b.set_data(&mut p, &UD_LIMITS, WrData::Inline(b"abc"), no_copy);
        b.set_ud_addr(&mut p, &UD_LIMITS, Some(dest(2)));
        // An address and no data: queued at wr_complete with none.
        b.build(&mut p, &UD_LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 3));
        b.set_ud_addr(&mut p, &UD_LIMITS, Some(dest(3)));
        assert_eq!(b.complete(&mut p, &UD_LIMITS), Ok(3));
        let with = |o: WrOp, d| WrOp { ud: Some(d), ..o };
        let expect = [
            encode_send(
                &with(op(sys::ibv_wr_opcode_IBV_WR_SEND, 1), dest(1)).view(&sges),
                &UD_LIMITS,
                no_copy,
            )
            .unwrap(),
            wqe::encode_send_inline(&with(imm, dest(2)).view(&[]), b"abc", &UD_LIMITS).unwrap(),
            encode_send(
                &with(op(sys::ibv_wr_opcode_IBV_WR_SEND, 3), dest(3)).view(&[]),
                &UD_LIMITS,
                no_copy,
            )
            .unwrap(),
        ];
        for (i, e) in expect.iter().enumerate() {
            assert_eq!(wqe_bytes(&ring.slot(i as u32)), wqe_bytes(e), "WQE {i}");
        }
        assert_eq!(ring.slot(1).remote_addr, expect[1].remote_addr);
        assert_ne!(ring.slot(1).remote_addr, 0);
    }

    #[test]
    fn ud_batches_without_a_proper_address_fail() {
        let ring = VecRing::new(4, zero_wqe(), 0);
        let mut p = Producer::new(&ring).unwrap();
        type Run = fn(&mut WrBatch, &mut Producer<&VecRing<SendEntry>>);
        let cases: [(&str, SendLimits, Run, PostError); 7] = [
            (
                "no address, data",
                UD_LIMITS,
                |b, p| {
                    b.build(p, &UD_LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
                    b.set_data(p, &UD_LIMITS, WrData::Sges(&[]), no_copy);
                },
                PostError::NoAddress,
            ),
            (
                "no address, no data",
                UD_LIMITS,
                |b, p| b.build(p, &UD_LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1)),
                PostError::NoAddress,
            ),
            (
                "a NULL or foreign AH",
                UD_LIMITS,
                |b, p| {
                    b.build(p, &UD_LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
                    b.set_ud_addr(p, &UD_LIMITS, None);
                },
                PostError::NoAddress,
            ),
            (
                "two addresses",
                UD_LIMITS,
                |b, p| {
                    b.build(p, &UD_LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
                    b.set_ud_addr(p, &UD_LIMITS, Some(dest(1)));
                    b.set_ud_addr(p, &UD_LIMITS, Some(dest(1)));
                },
                PostError::OutOfOrder,
            ),
            (
                "an address with no builder",
                UD_LIMITS,
                |b, p| b.set_ud_addr(p, &UD_LIMITS, Some(dest(1))),
                PostError::OutOfOrder,
            ),
            (
                "an RDMA write on UD",
                UD_LIMITS,
                |b, p| {
                    b.build(p, &UD_LIMITS, op(sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE, 1));
                    b.set_ud_addr(p, &UD_LIMITS, Some(dest(1)));
                },
                PostError::BadOpcode,
            ),
            (
                "an address on an RC QP",
                LIMITS,
                |b, p| {
                    b.build(p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 1));
                    b.set_ud_addr(p, &LIMITS, Some(dest(1)));
                },
                PostError::OutOfOrder,
            ),
        ];
        for (what, limits, run, err) in cases {
            let mut b = WrBatch::start(&p);
            run(&mut b, &mut p);
            assert_eq!(b.complete(&mut p, &limits), Err(err), "{what}");
            assert_eq!(
                (ring.producer.get(), ring.producer_stores.get()),
                (0, 0),
                "{what}"
            );
        }
    }

    #[test]
    fn abort_leaves_the_ring_as_before() {
        let ring = VecRing::new(4, zero_wqe(), 2);
        let mut p = Producer::new(&ring).unwrap();
        let mut b = WrBatch::start(&p);
        for i in 0..3 {
            b.build(&mut p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, i));
            b.set_data(&mut p, &LIMITS, WrData::Sges(&[]), no_copy);
        }
        b.abort(&mut p);
        assert_eq!((ring.producer.get(), ring.producer_stores.get()), (2, 0));
        // The next batch starts at the same slot and can fill the whole ring.
        let mut b = WrBatch::start(&p);
        for i in 0..4 {
            b.build(&mut p, &LIMITS, op(sys::ibv_wr_opcode_IBV_WR_SEND, 20 + i));
        }
        assert_eq!(b.complete(&mut p, &LIMITS), Ok(4));
        assert_eq!((ring.producer.get(), ring.slot(2).wr_id), (6, 20));
        // An empty batch publishes nothing.
        assert_eq!(WrBatch::start(&p).complete(&mut p, &LIMITS), Ok(0));
        assert_eq!(ring.producer_stores.get(), 1);
    }

    #[test]
    fn inline_from_sges_and_gathered_buffers() {
        let src = *b"0123456789abcdef";
        let ring = VecRing::new(4, zero_wqe(), 0);
        let mut p = Producer::new(&ring).unwrap();
        // IBV_SEND_INLINE with SGEs: the bytes are copied, as post_send does.
        let mut b = WrBatch::start(&p);
        let mut o = op(sys::ibv_wr_opcode_IBV_WR_SEND, 1);
        o.send_flags |= wqe::SEND_INLINE;
        b.build(&mut p, &LIMITS, o);
        let mut copied = 0;
        b.set_data(&mut p, &LIMITS, WrData::Sges(&[sge(0, 10, 0)]), |s, d| {
            copied += 1;
            d.copy_from_slice(&src[s.addr as usize..][..s.length as usize]);
        });
        assert_eq!((b.complete(&mut p, &LIMITS), copied), (Ok(1), 1));
        let w = ring.slot(0);
        assert_eq!((w.num_sge, w.inline_len), (0, 10));
        assert_eq!(&crate::ffi::union_views::inline_of(&w)[..10], &src[..10]);

        // gather_inline: buffers in order, empty ones skipped, limits checked before copying.
        let bufs = [(0usize, 4usize), (4, 0), (8, 8)].map(|(at, length)| sys::ibv_data_buf {
            addr: at as *mut core::ffi::c_void,
            length,
        });
        let copy = |b: &sys::ibv_data_buf, d: &mut [u8]| {
            assert_ne!(b.length, 0);
            d.copy_from_slice(&src[b.addr as usize..][..b.length]);
        };
        let (data, len) = gather_inline(&bufs, 64, copy).unwrap();
        assert_eq!(&data[..len], b"012389abcdef");
        assert!(data[len..].iter().all(|&b| b == 0));
        assert_eq!(
            gather_inline(&bufs, 11, |_, _| panic!("copied")).err(),
            Some(PostError::InlineTooLong)
        );
        let huge = [usize::MAX, 2].map(|length| sys::ibv_data_buf {
            addr: core::ptr::null_mut(),
            length,
        });
        assert_eq!(
            gather_inline(&huge, 192, |_, _| panic!("copied")).err(),
            Some(PostError::InlineTooLong)
        );
        assert_eq!(gather_inline(&[], 0, |_, _| ()).unwrap().1, 0);
        assert_eq!(MAX_SEND_SGE, 12);
    }

    fn zero_wqe() -> SendEntry {
        SendEntry::new(sys::metaroce_send_wqe {
            wr_id: 0,
            opcode: 0,
            send_flags: 0,
            num_sge: 0,
            inline_len: 0,
            imm_data: 0,
            reserved0: 0,
            remote_addr: 0,
            rkey: 0,
            reserved1: 0,
            compare_add: 0,
            swap: 0,
            data: sys::metaroce_send_wqe__bindgen_ty_1 {
                inline_data: [0; MAX_INLINE as usize],
            },
        })
    }

    fn wqe_bytes(w: &SendEntry) -> Vec<u8> {
        let mut v = Vec::new();
        for x in [w.wr_id, w.remote_addr, w.compare_add, w.swap] {
            v.extend(x.to_ne_bytes());
        }
        for x in [
            w.opcode,
            w.send_flags,
            w.num_sge,
            w.inline_len,
            w.imm_data,
            w.reserved0,
            w.rkey,
            w.reserved1,
        ] {
            v.extend(x.to_ne_bytes());
        }
        v.extend(crate::ffi::union_views::inline_of(w));
        for s in &w.more {
            v.extend(s.addr.to_ne_bytes());
            v.extend(s.length.to_ne_bytes());
            v.extend(s.lkey.to_ne_bytes());
        }
        v
    }
}
