// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The extended CQ and QP verbs: `create_cq_ex` with the `ibv_cq_ex` polling functions, and
//! `create_qp_ex` with the `ibv_qp_ex` work request functions (`ibv_wr_*`).
//!
//! Both make the same objects as `create_cq` / `create_qp` (a [`Cq`], a [`Qp`]) through the
//! same kernel commands and rings; only the functions in the libibverbs object differ, so
//! `ibv_poll_cq`, `ibv_post_send`, `ibv_query_qp`, `ibv_modify_qp` and the destroys work on
//! them unchanged. A poll (`start_poll` .. `end_poll`) and a work request batch (`wr_start`
//! .. `wr_complete`/`wr_abort`) are sessions of the CQ's / SQ's [`Session`]: the calls in
//! between run only for the thread that opened it. The safe logic is in `crate::ex`.

use super::{
    copy_inline_sge, finish_cq, finish_qp, guard, new_object, outer, report_corrupt_cq,
    ring_doorbell, set_errno, sys, ud_dest, Cq, CqState, Qp, SqState, PANIC_ERRNO,
};
use crate::ex::{self, WrBatch, WrData, WrOp};
use crate::session::{Owner, Session};
use crate::wqe::{self, PostError, SendLimits, MAX_SGE};
use core::ffi::{c_int, c_void};
use core::mem::size_of;
use core::ptr;

const EINVAL: c_int = sys::EINVAL as c_int;
const ENOENT: c_int = sys::ENOENT as c_int;

// ---------------------------------------------------------------------------------------------
// Extended CQ.

pub(super) unsafe extern "C" fn create_cq_ex(
    ibctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_cq_init_attr_ex,
) -> *mut sys::ibv_cq_ex {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller's attributes (libibverbs checked the pointer's wc_flags already).
        let (comp_mask, wc_flags, flags) =
            unsafe { ((*attr).comp_mask, (*attr).wc_flags, (*attr).flags) };
        if let Err(errno) = ex::check_cq_attr(comp_mask, wc_flags, flags) {
            set_errno(errno);
            return ptr::null_mut();
        }
        let mut cq = new_object::<Cq>();
        let p = cq.as_mut_ptr();
        // SAFETY: all-zero is a valid request and response (plain integers).
        let mut cmd: sys::ibv_create_cq_ex = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        let mut resp: sys::metaroce_cmd_create_cq_ex_resp = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them; the verbs_cq is zeroed and stays at this
        // address (the kernel's user_handle). With the attributes checked above the command
        // asks the kernel for no CQ flag: the same CQ create_cq makes.
        let ret = unsafe {
            sys::ibv_cmd_create_cq_ex(
                ibctx,
                attr,
                ptr::addr_of_mut!((*p).vcq),
                &mut cmd,
                size_of::<sys::ibv_create_cq_ex>(),
                ptr::addr_of_mut!(resp.ibv_resp),
                size_of::<sys::metaroce_cmd_create_cq_ex_resp>(),
                0,
            )
        };
        if ret != 0 {
            set_errno(ret);
            return ptr::null_mut();
        }
        // SAFETY: the kernel CQ of cq, created on ibctx just now.
        let p = unsafe { finish_cq(cq, ibctx, &resp.drv_payload.ring) };
        if p.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: p is live and not handed out yet; writing the function pointers of its
        // ibv_cq_ex (libibverbs initialises the rest after we return).
        unsafe {
            let cqx = ptr::addr_of_mut!((*p).vcq.__bindgen_anon_1.cq_ex);
            set_poll_ops(cqx, wc_flags);
            cqx
        }
    })
}

/// Installs the polling functions, and the `read_*` functions `wc_flags` asks for (as rxe and
/// mlx5 do: a field not asked for has no function). `read_opcode`, `read_vendor_err` and
/// `read_wc_flags` are always there.
///
/// # Safety
/// `cqx` must be the `ibv_cq_ex` of a live [`Cq`] not yet handed out.
pub(super) unsafe fn set_poll_ops(cqx: *mut sys::ibv_cq_ex, wc_flags: u64) {
    let asked = |flag: u32| wc_flags & u64::from(flag) != 0;
    // Each `wc_flags` bit that asks for a 32-bit read function, and the function.
    type Read32 = unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u32;
    let u32_readers: [(u32, Read32); 5] = [
        (
            sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_BYTE_LEN,
            read_byte_len,
        ),
        (
            sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_IMM,
            read_imm_data,
        ),
        (
            sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_QP_NUM,
            read_qp_num,
        ),
        (
            sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SRC_QP,
            read_src_qp,
        ),
        (sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SLID, read_slid),
    ];
    // SAFETY: cqx is ours, live, and seen by nobody else yet (contract).
    unsafe {
        (*cqx).start_poll = Some(start_poll);
        (*cqx).next_poll = Some(next_poll);
        (*cqx).end_poll = Some(end_poll);
        (*cqx).read_opcode = Some(read_opcode);
        (*cqx).read_vendor_err = Some(read_vendor_err);
        (*cqx).read_wc_flags = Some(read_wc_flags);
        let [byte_len, imm, qp_num, src_qp, slid] = u32_readers.map(|(f, r)| asked(f).then_some(r));
        (*cqx).read_byte_len = byte_len;
        (*cqx).read_imm_data = imm;
        (*cqx).read_qp_num = qp_num;
        (*cqx).read_src_qp = src_qp;
        (*cqx).read_slid = slid;
        (*cqx).read_sl = asked(sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SL)
            .then_some(read_sl as unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u8);
        (*cqx).read_dlid_path_bits =
            asked(sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_DLID_PATH_BITS)
                .then_some(read_dlid_path_bits as unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u8);
    }
}

/// The CQ state of an extended CQ.
///
/// # Safety
/// `cqx` must be the `ibv_cq_ex` of a live [`Cq`] (made by `create_cq_ex`).
unsafe fn cq_state<'a>(cqx: *mut sys::ibv_cq_ex) -> &'a Session<CqState> {
    let cq = outer::<_, Cq>(cqx);
    // SAFETY: per the contract; `ring` is our field, set before the CQ was handed out.
    unsafe { &(*cq).ring }
}

/// What `start_poll` / `next_poll` do with the next completion: make it the current one (the
/// `read_*` functions read it) and show its `status` and `wr_id` in the `ibv_cq_ex`;
/// `ENOENT` if there is none yet, `EPROTO` if the kernel broke the ring protocol.
///
/// # Safety
/// `cqx` as for [`cq_state`].
unsafe fn advance(cqx: *mut sys::ibv_cq_ex, s: &mut CqState) -> c_int {
    match s.ring.take() {
        Ok(Some(cqe)) => {
            s.cur = cqe;
            // SAFETY: the libibverbs part of our live CQ (contract); only these two fields.
            unsafe {
                ptr::addr_of_mut!((*cqx).status).write(cqe.status);
                ptr::addr_of_mut!((*cqx).wr_id).write(cqe.wr_id);
            }
            0
        }
        Ok(None) => ENOENT,
        Err(c) => {
            report_corrupt_cq(c);
            crate::abi::ABI_MISMATCH_ERRNO
        }
    }
}

/// `ibv_start_poll`: 0 with the first completion current and the session open (until
/// `ibv_end_poll`), or `ENOENT` (empty), `EPROTO` (a corrupt ring) or `EINVAL` (a non-zero
/// `attr->comp_mask`, or the caller already polls this CQ) with no session open.
unsafe extern "C" fn start_poll(
    cqx: *mut sys::ibv_cq_ex,
    attr: *mut sys::ibv_poll_cq_attr,
) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: NULL or the caller's attributes.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return EINVAL;
        }
        // SAFETY: libibverbs calls this on our extended CQ.
        let state = unsafe { cq_state(cqx) };
        state
            .open(Owner::current(), |s| {
                // SAFETY: as above.
                let ret = unsafe { advance(cqx, s) };
                (ret, ret == 0)
            })
            .unwrap_or(EINVAL)
    })
}

/// `ibv_next_poll`: 0 with the next completion current, `ENOENT` if there is none yet (the
/// session stays open: the caller may try again, and must still call `ibv_end_poll`),
/// `EPROTO` for a corrupt ring, `EINVAL` outside the caller's session.
unsafe extern "C" fn next_poll(cqx: *mut sys::ibv_cq_ex) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: libibverbs calls this on our extended CQ.
        let state = unsafe { cq_state(cqx) };
        state
            // SAFETY: as above.
            .within(Owner::current(), |s| unsafe { advance(cqx, s) })
            .unwrap_or(EINVAL)
    })
}

/// `ibv_end_poll`: frees the slots of every completion the session handed out (one store of
/// the ring's `consumer`) and closes it. Nothing if the caller has no session open (pyverbs
/// calls it after a `start_poll` that found the CQ empty).
unsafe extern "C" fn end_poll(cqx: *mut sys::ibv_cq_ex) {
    guard((), || {
        // SAFETY: libibverbs calls this on our extended CQ.
        let state = unsafe { cq_state(cqx) };
        state.close(Owner::current(), |s| s.ring.release());
    })
}

/// A field of the current completion (0 before the first). Valid between a successful
/// `start_poll`/`next_poll` and the next call of either or `end_poll`, as the verbs say.
///
/// # Safety
/// `cqx` as for [`cq_state`].
unsafe fn current<T>(cqx: *mut sys::ibv_cq_ex, field: impl FnOnce(&sys::metaroce_cqe) -> T) -> T {
    // SAFETY: per the contract.
    let state = unsafe { cq_state(cqx) };
    state.peek(|s| field(&s.cur))
}

macro_rules! cqe_reader {
    ($name:ident, $ty:ty, $field:ident) => {
        #[doc = concat!("`ibv_wc_read_", stringify!($field), "`: the current completion's.")]
        unsafe extern "C" fn $name(cqx: *mut sys::ibv_cq_ex) -> $ty {
            guard(0, || {
                // SAFETY: libibverbs calls this on our extended CQ.
                unsafe { current(cqx, |c| c.$field) }
            })
        }
    };
}

cqe_reader!(read_opcode, sys::ibv_wc_opcode, opcode);
cqe_reader!(read_vendor_err, u32, vendor_err);
cqe_reader!(read_byte_len, u32, byte_len);
// imm_data, big-endian as received; also ibv_wc_read_invalidated_rkey's (the same u32, as in
// struct ibv_wc).
cqe_reader!(read_imm_data, u32, imm_data);
cqe_reader!(read_qp_num, u32, qp_num);
cqe_reader!(read_src_qp, u32, src_qp);
cqe_reader!(read_wc_flags, u32, wc_flags);
cqe_reader!(read_sl, u8, sl);
cqe_reader!(read_dlid_path_bits, u8, dlid_path_bits);

/// `ibv_wc_read_slid` (the CQE's `slid` is 16 bits, the verb's 32).
unsafe extern "C" fn read_slid(cqx: *mut sys::ibv_cq_ex) -> u32 {
    guard(0, || {
        // SAFETY: libibverbs calls this on our extended CQ.
        unsafe { current(cqx, |c| u32::from(c.slid)) }
    })
}

// ---------------------------------------------------------------------------------------------
// Extended QP.

pub(super) unsafe extern "C" fn create_qp_ex(
    ibctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut sys::ibv_qp {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller's attributes.
        let mut cmd_attr = unsafe { attr.read() };
        let with_ops = match ex::check_qp_attr(
            cmd_attr.comp_mask,
            cmd_attr.create_flags,
            cmd_attr.qp_type,
            cmd_attr.send_ops_flags,
        ) {
            Ok(with_ops) => with_ops,
            Err(errno) => {
                set_errno(errno);
                return ptr::null_mut();
            }
        };
        // IBV_QP_INIT_ATTR_CREATE_FLAGS with no flag asks for nothing; ibv_cmd_create_qp_ex
        // refuses the bit itself. With PD and SEND_OPS_FLAGS (userspace only) left, the command
        // is the plain create_qp's.
        cmd_attr.comp_mask &= !sys::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS;
        let mut qp = new_object::<Qp>();
        let p = qp.as_mut_ptr();
        // SAFETY: all-zero is a valid request and response (plain integers).
        let mut cmd: sys::ibv_create_qp = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        let mut resp: sys::metaroce_cmd_create_qp_resp = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them (cmd_attr a copy of the caller's); the
        // verbs_qp is zeroed and stays at this address (the kernel's user_handle).
        let ret = unsafe {
            sys::ibv_cmd_create_qp_ex(
                ibctx,
                ptr::addr_of_mut!((*p).vqp),
                &mut cmd_attr,
                &mut cmd,
                size_of::<sys::ibv_create_qp>(),
                ptr::addr_of_mut!(resp.ibv_resp),
                size_of::<sys::metaroce_cmd_create_qp_resp>(),
            )
        };
        if ret != 0 {
            set_errno(ret);
            return ptr::null_mut();
        }
        // SAFETY: the kernel QP of qp, created on ibctx just now; cmd_attr.cap holds the
        // kernel's capabilities.
        let p = unsafe {
            finish_qp(
                qp,
                (*ibctx).cmd_fd,
                cmd_attr.qp_type,
                &mut cmd_attr.cap,
                &resp.drv_payload,
            )
        };
        if p.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: p is live and not handed out yet; attr is the caller's.
        unsafe {
            (*attr).cap = cmd_attr.cap;
            if with_ops {
                let vqp = ptr::addr_of_mut!((*p).vqp);
                (*vqp).comp_mask |= sys::verbs_qp_mask_VERBS_QP_EX;
                set_wr_ops(
                    ptr::addr_of_mut!((*vqp).__bindgen_anon_1.qp_ex),
                    cmd_attr.send_ops_flags,
                );
            }
            ptr::addr_of_mut!((*p).vqp.__bindgen_anon_1.qp)
        }
    })
}

/// Installs the `ibv_wr_*` functions: a builder for each op of `send_ops_flags` (checked by
/// `ex::check_send_ops`; the others stay NULL, as in rxe and mlx5), the data setters, and
/// `wr_set_ud_addr` (which fails the batch on a QP that is not UD). `wr_set_xrc_srqn` and
/// `wr_send_tso` stay NULL: the device has neither.
///
/// # Safety
/// `qpx` must be the `ibv_qp_ex` of a live [`Qp`] not yet handed out.
pub(super) unsafe fn set_wr_ops(qpx: *mut sys::ibv_qp_ex, send_ops_flags: u64) {
    let asked = |flag: u32| send_ops_flags & u64::from(flag) != 0;
    // SAFETY: qpx is ours, live, and seen by nobody else yet (contract).
    unsafe {
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND) {
            (*qpx).wr_send = Some(wr_send);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM) {
            (*qpx).wr_send_imm = Some(wr_send_imm);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE) {
            (*qpx).wr_rdma_write = Some(wr_rdma_write);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
            (*qpx).wr_rdma_write_imm = Some(wr_rdma_write_imm);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ) {
            (*qpx).wr_rdma_read = Some(wr_rdma_read);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) {
            (*qpx).wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) {
            (*qpx).wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_LOCAL_INV) {
            (*qpx).wr_local_inv = Some(wr_local_inv);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_BIND_MW) {
            (*qpx).wr_bind_mw = Some(wr_bind_mw);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_INV) {
            (*qpx).wr_send_inv = Some(wr_send_inv);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_WRITE) {
            (*qpx).wr_atomic_write = Some(wr_atomic_write);
        }
        if asked(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_FLUSH) {
            (*qpx).wr_flush = Some(wr_flush);
        }
        (*qpx).wr_set_sge = Some(wr_set_sge);
        (*qpx).wr_set_sge_list = Some(wr_set_sge_list);
        (*qpx).wr_set_inline_data = Some(wr_set_inline_data);
        (*qpx).wr_set_inline_data_list = Some(wr_set_inline_data_list);
        (*qpx).wr_set_ud_addr = Some(wr_set_ud_addr);
        (*qpx).wr_start = Some(wr_start);
        (*qpx).wr_complete = Some(wr_complete);
        (*qpx).wr_abort = Some(wr_abort);
    }
}

/// The SQ of an extended QP and its limits (`None`: the kernel gave the QP no SQ).
///
/// # Safety
/// `qpx` must be the `ibv_qp_ex` of a live [`Qp`] (made by `create_qp_ex`).
unsafe fn sq_of<'a>(qpx: *mut sys::ibv_qp_ex) -> Option<(&'a Session<SqState>, SendLimits)> {
    let qp = outer::<_, Qp>(qpx);
    // SAFETY: per the contract; `sq` and `limits` are our fields, set before the QP was handed
    // out and never changed.
    unsafe { (*qp).sq.as_ref().map(|sq| (sq, (*qp).limits)) }
}

/// Runs `f` on the batch the caller has open on `qpx`; nothing if it has none (a builder or
/// setter outside `wr_start` .. `wr_complete` has no batch to fail).
///
/// # Safety
/// `qpx` as for [`sq_of`].
unsafe fn in_batch(
    qpx: *mut sys::ibv_qp_ex,
    f: impl FnOnce(&mut WrBatch, &mut super::SendRing, &SendLimits),
) {
    // SAFETY: per the contract.
    let Some((sq, limits)) = (unsafe { sq_of(qpx) }) else {
        return;
    };
    sq.within(Owner::current(), |s| {
        if let Some(batch) = s.wr.as_mut() {
            f(batch, &mut s.ring, &limits);
        }
    });
}

/// A builder: `op` (with `ibv_qp_ex.wr_id` and `.wr_flags` as they are now) becomes the
/// batch's pending work request.
///
/// # Safety
/// `qpx` as for [`sq_of`].
unsafe fn build(qpx: *mut sys::ibv_qp_ex, op: WrOp) {
    // SAFETY: the libibverbs part of our live QP; the application writes these two fields
    // before calling a builder.
    let (wr_id, send_flags) = unsafe {
        (
            ptr::addr_of!((*qpx).wr_id).read(),
            ptr::addr_of!((*qpx).wr_flags).read(),
        )
    };
    let op = WrOp {
        wr_id,
        send_flags,
        ..op
    };
    // SAFETY: per the contract.
    unsafe { in_batch(qpx, |b, ring, limits| b.build(ring, limits, op)) };
}

macro_rules! builder {
    ($(#[$doc:meta])* $name:ident ($($arg:ident: $ty:ty),*) => $op:expr) => {
        $(#[$doc])*
        unsafe extern "C" fn $name(qpx: *mut sys::ibv_qp_ex, $($arg: $ty),*) {
            guard((), || {
                // SAFETY: libibverbs calls this on our extended QP.
                unsafe { build(qpx, $op) }
            })
        }
    };
}

builder!(
    /// `ibv_wr_local_inv`: no data setter follows (the next builder or `wr_complete` queues
    /// it).
    wr_local_inv(invalidate_rkey: u32) => WrOp {
        opcode: sys::ibv_wr_opcode_IBV_WR_LOCAL_INV,
        imm_data: invalidate_rkey,
        ..WrOp::default()
    }
);
builder!(
    /// `ibv_wr_send_inv`: a SEND whose receiver invalidates `invalidate_rkey`.
    wr_send_inv(invalidate_rkey: u32) => WrOp {
        opcode: sys::ibv_wr_opcode_IBV_WR_SEND_WITH_INV,
        imm_data: invalidate_rkey,
        ..WrOp::default()
    }
);

/// `ibv_wr_bind_mw`: a type 2 window `mw` bound with rkey `rkey` as `bind_info` says (no data
/// setter follows). A NULL window or bind fails the batch (`EINVAL`).
unsafe extern "C" fn wr_bind_mw(
    qpx: *mut sys::ibv_qp_ex,
    mw: *mut sys::ibv_mw,
    rkey: u32,
    bind_info: *const sys::ibv_mw_bind_info,
) {
    guard((), || {
        // SAFETY: the caller's bind description, if given.
        let info = unsafe { bind_info.as_ref() };
        let mut view = wqe::SendWr {
            opcode: sys::ibv_wr_opcode_IBV_WR_BIND_MW,
            ..wqe::SendWr::default()
        };
        let ok = info.is_some_and(|i| super::bind_view(&mut view, mw, rkey, i).is_ok());
        let op = WrOp {
            opcode: sys::ibv_wr_opcode_IBV_WR_BIND_MW,
            imm_data: view.imm_data,
            remote_addr: view.remote_addr,
            rkey: view.rkey,
            compare_add: view.compare_add,
            swap: view.swap,
            ..WrOp::default()
        };
        // SAFETY: libibverbs calls this on our extended QP.
        unsafe {
            if ok {
                build(qpx, op);
            } else {
                in_batch(qpx, |b, _, _| b.fail(wqe::PostError::BadOpcode));
            }
        }
    })
}

builder!(
    /// `ibv_wr_send`.
    wr_send() => WrOp { opcode: sys::ibv_wr_opcode_IBV_WR_SEND, ..WrOp::default() }
);
builder!(
    /// `ibv_wr_send_imm` (`imm_data` big-endian, as given).
    wr_send_imm(imm_data: u32) => WrOp {
        opcode: sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM,
        imm_data,
        ..WrOp::default()
    }
);
builder!(
    /// `ibv_wr_rdma_write`.
    wr_rdma_write(rkey: u32, remote_addr: u64) => WrOp {
        opcode: sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE,
        rkey,
        remote_addr,
        ..WrOp::default()
    }
);
builder!(
    /// `ibv_wr_rdma_write_imm`.
    wr_rdma_write_imm(rkey: u32, remote_addr: u64, imm_data: u32) => WrOp {
        opcode: sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM,
        rkey,
        remote_addr,
        imm_data,
        ..WrOp::default()
    }
);
builder!(
    /// `ibv_wr_rdma_read`.
    wr_rdma_read(rkey: u32, remote_addr: u64) => WrOp {
        opcode: sys::ibv_wr_opcode_IBV_WR_RDMA_READ,
        rkey,
        remote_addr,
        ..WrOp::default()
    }
);
builder!(
    /// `ibv_wr_atomic_cmp_swp`.
    wr_atomic_cmp_swp(rkey: u32, remote_addr: u64, compare: u64, swap: u64) => WrOp {
        opcode: sys::ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP,
        rkey,
        remote_addr,
        compare_add: compare,
        swap,
        ..WrOp::default()
    }
);
builder!(
    /// `ibv_wr_atomic_fetch_add`.
    wr_atomic_fetch_add(rkey: u32, remote_addr: u64, add: u64) => WrOp {
        opcode: sys::ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD,
        rkey,
        remote_addr,
        compare_add: add,
        ..WrOp::default()
    }
);

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr` stored at `remote_addr` (8-byte
/// aligned) at once; no data setter follows. The bytes are read now and travel in order (the
/// WQE's `compare_add` holds them read as a big-endian number); a NULL `atomic_wr` fails the
/// batch (`EINVAL`).
unsafe extern "C" fn wr_atomic_write(
    qpx: *mut sys::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    guard((), || {
        // SAFETY: the caller's 8 bytes, if given (any alignment).
        let value = (!atomic_wr.is_null())
            .then(|| unsafe { atomic_wr.cast::<[u8; 8]>().read_unaligned() })
            .map(u64::from_be_bytes);
        // SAFETY: libibverbs calls this on our extended QP.
        unsafe {
            match value {
                Some(value) => build(
                    qpx,
                    WrOp {
                        opcode: sys::ibv_wr_opcode_IBV_WR_ATOMIC_WRITE,
                        rkey,
                        remote_addr,
                        compare_add: value,
                        ..WrOp::default()
                    },
                ),
                None => in_batch(qpx, |b, _, _| b.fail(wqe::PostError::BadAtomic)),
            }
        }
    })
}

builder!(
    /// `ibv_wr_flush`: what earlier work requests placed in `[remote_addr, remote_addr +
    /// len)` (`IBV_FLUSH_MR`: in all of the region `rkey` names) made visible
    /// (`IBV_FLUSH_GLOBAL`) or persistent; no data setter follows. The device has no
    /// persistent memory: a persistent flush completes with a remote access error.
    wr_flush(rkey: u32, remote_addr: u64, len: usize, ptype: u8, level: u8) => WrOp {
        opcode: sys::ibv_wr_opcode_IBV_WR_FLUSH,
        rkey,
        remote_addr,
        compare_add: len as u64,
        swap: u64::from(ptype) | u64::from(level) << 8,
        ..WrOp::default()
    }
);

/// Gives the pending work request its SGEs (`IBV_SEND_INLINE` in its flags copies their bytes
/// now, as `ibv_post_send` does).
///
/// # Safety
/// `qpx` as for [`sq_of`]; with `IBV_SEND_INLINE` the SGEs must name readable memory.
unsafe fn set_sges(qpx: *mut sys::ibv_qp_ex, sges: &[sys::ibv_sge]) {
    // SAFETY: per the contract.
    unsafe {
        in_batch(qpx, |b, ring, limits| {
            // SAFETY: IBV_SEND_INLINE SGEs of the WR being built (contract).
            b.set_data(ring, limits, WrData::Sges(sges), |sge, dst| {
                copy_inline_sge(sge, dst)
            })
        })
    }
}

/// Fails the caller's open batch with `e`.
///
/// # Safety
/// `qpx` as for [`sq_of`].
unsafe fn fail(qpx: *mut sys::ibv_qp_ex, e: PostError) {
    // SAFETY: per the contract.
    unsafe { in_batch(qpx, |b, _, _| b.fail(e)) }
}

/// `ibv_wr_set_sge`: one SGE.
unsafe extern "C" fn wr_set_sge(qpx: *mut sys::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    guard((), || {
        let sge = sys::ibv_sge { addr, length, lkey };
        // SAFETY: libibverbs calls this on our extended QP; an inline SGE is the caller's.
        unsafe { set_sges(qpx, core::slice::from_ref(&sge)) }
    })
}

/// `ibv_wr_set_sge_list`: more SGEs than a WQE holds (or a NULL list with some) fail the batch
/// before the list is read; the QP's `max_send_sge` is checked by the encoding.
unsafe extern "C" fn wr_set_sge_list(
    qpx: *mut sys::ibv_qp_ex,
    num_sge: usize,
    sg_list: *const sys::ibv_sge,
) {
    guard((), || {
        if num_sge > MAX_SGE as usize || (num_sge != 0 && sg_list.is_null()) {
            // SAFETY: libibverbs calls this on our extended QP.
            return unsafe { fail(qpx, PostError::TooManySge) };
        }
        let sges = if num_sge == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's array of num_sge SGEs, read during this call only.
            unsafe { core::slice::from_raw_parts(sg_list, num_sge) }
        };
        // SAFETY: libibverbs calls this on our extended QP; inline SGEs are the caller's.
        unsafe { set_sges(qpx, sges) }
    })
}

/// Gathers `bufs` (the caller's, readable during this call) and gives them to the pending work
/// request as its inline payload.
///
/// # Safety
/// `qpx` as for [`sq_of`]; every non-empty buffer of `bufs` readable.
unsafe fn set_inline(qpx: *mut sys::ibv_qp_ex, bufs: &[sys::ibv_data_buf]) {
    // SAFETY: per the contract.
    let Some((_, limits)) = (unsafe { sq_of(qpx) }) else {
        return;
    };
    let gathered = ex::gather_inline(bufs, limits.max_inline, |b, dst| {
        // SAFETY: a non-empty buffer of the caller's (contract); dst has b.length bytes.
        unsafe {
            ptr::copy_nonoverlapping(b.addr.cast::<u8>(), dst.as_mut_ptr(), dst.len());
        }
    });
    // SAFETY: per the contract.
    unsafe {
        match gathered {
            Ok((data, len)) => in_batch(qpx, |b, ring, limits| {
                b.set_data(ring, limits, WrData::Inline(&data[..len]), |_, _| {})
            }),
            Err(e) => fail(qpx, e),
        }
    }
}

/// `ibv_wr_set_inline_data`: the payload copied into the WQE now (`IBV_SEND_INLINE` is
/// implied); over the QP's `max_inline_data` fails the batch.
unsafe extern "C" fn wr_set_inline_data(
    qpx: *mut sys::ibv_qp_ex,
    addr: *mut c_void,
    length: usize,
) {
    guard((), || {
        let buf = sys::ibv_data_buf { addr, length };
        // SAFETY: libibverbs calls this on our extended QP; the buffer is the caller's.
        unsafe { set_inline(qpx, core::slice::from_ref(&buf)) }
    })
}

/// `ibv_wr_set_inline_data_list`: the buffers' bytes, in order, as one payload.
unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut sys::ibv_qp_ex,
    num_buf: usize,
    buf_list: *const sys::ibv_data_buf,
) {
    guard((), || {
        if num_buf != 0 && buf_list.is_null() {
            // SAFETY: libibverbs calls this on our extended QP.
            return unsafe { fail(qpx, PostError::InlineTooLong) };
        }
        let bufs = if num_buf == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's array of num_buf buffers, read during this call only.
            unsafe { core::slice::from_raw_parts(buf_list, num_buf) }
        };
        // SAFETY: libibverbs calls this on our extended QP; the buffers are the caller's.
        unsafe { set_inline(qpx, bufs) }
    })
}

/// `ibv_wr_set_ud_addr`: the destination of the pending work request of a UD QP (before or
/// after its data setter), the address vector `ibv_post_send` writes for `wr.ud`. Fails the
/// batch (`EINVAL`) on a QP that is not UD, with a NULL AH or one of another context, with no
/// builder before it or a second one for the same work request.
unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut sys::ibv_qp_ex,
    ah: *mut sys::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    guard((), || {
        // SAFETY: our live QP, whose context never changes.
        let ctx = unsafe { (*qpx).qp_base.context };
        let set = |b: &mut WrBatch, ring: &mut super::SendRing, limits: &SendLimits| {
            // The AH is looked at only on a UD QP (the others fail the batch anyway).
            let dest = if limits.qp_type == sys::ibv_qp_type_IBV_QPT_UD {
                // SAFETY: the application's AH, NULL or live (verbs contract).
                unsafe { ud_dest(ctx, ah, remote_qpn, remote_qkey) }
            } else {
                None
            };
            b.set_ud_addr(ring, limits, dest)
        };
        // SAFETY: libibverbs calls this on our extended QP.
        unsafe { in_batch(qpx, set) }
    })
}

/// `ibv_wr_start`: opens a batch on the SQ (waiting for another thread's to end). A second
/// `wr_start` inside the caller's own batch fails that batch (`EINVAL` at `wr_complete`).
unsafe extern "C" fn wr_start(qpx: *mut sys::ibv_qp_ex) {
    guard((), || {
        // SAFETY: libibverbs calls this on our extended QP.
        let Some((sq, _)) = (unsafe { sq_of(qpx) }) else {
            return;
        };
        let opened = sq.open(Owner::current(), |s| {
            s.wr = Some(WrBatch::start(&s.ring));
            ((), true)
        });
        if opened.is_err() {
            // SAFETY: as above.
            unsafe { fail(qpx, PostError::OutOfOrder) };
        }
    })
}

/// `ibv_wr_complete`: publishes the batch's WQEs with one store and rings the doorbell once
/// (none if the batch is empty), returning 0 or the doorbell's errno; or, if building failed,
/// publishes nothing and returns that errno (`ENOMEM` for a full ring, `EINVAL` for the
/// rest). `EINVAL` with no batch open.
unsafe extern "C" fn wr_complete(qpx: *mut sys::ibv_qp_ex) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: libibverbs calls this on our extended QP.
        let Some((sq, limits)) = (unsafe { sq_of(qpx) }) else {
            return EINVAL;
        };
        // SAFETY: our live QP; `state` is libibverbs' record of the last modify_qp.
        let state = unsafe { (*qpx).qp_base.state };
        if !wqe::sends_allowed(state) {
            // Before RTS nothing is posted: the batch goes, as `ibv_post_send` would refuse it.
            sq.close(Owner::current(), |s| {
                if let Some(b) = s.wr.take() {
                    b.abort(&mut s.ring);
                }
            });
            return EINVAL;
        }
        let done = sq.close(Owner::current(), |s| {
            s.wr.take().map(|b| b.complete(&mut s.ring, &limits))
        });
        match done.flatten() {
            None => EINVAL,
            Some(Err(e)) => e.errno(),
            Some(Ok(0)) => 0,
            // SAFETY: our live QP (its ibv_qp is the start of the ibv_qp_ex).
            Some(Ok(_)) => unsafe { ring_doorbell(qpx.cast()) },
        }
    })
}

/// `ibv_wr_abort`: forgets the batch's WQEs (the ring is as before `wr_start`) and ends it.
unsafe extern "C" fn wr_abort(qpx: *mut sys::ibv_qp_ex) {
    guard((), || {
        // SAFETY: libibverbs calls this on our extended QP.
        let Some((sq, _)) = (unsafe { sq_of(qpx) }) else {
            return;
        };
        sq.close(Owner::current(), |s| {
            if let Some(b) = s.wr.take() {
                b.abort(&mut s.ring);
            }
        });
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{
        ah_attr, link, make_ah, send_wr, test_context, test_pd, test_qp, test_ring, view, GID_V4,
        UD, UD_RECV,
    };
    use super::super::{destroy_ah, post_send, Context, MappedRing};
    use super::*;
    use crate::ring::{Consumer, RingMemory};
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    const ENOMEM: c_int = sys::ENOMEM as c_int;

    fn cqe(i: u32) -> sys::metaroce_cqe {
        sys::metaroce_cqe {
            wr_id: 0x1000 + u64::from(i),
            status: i % 2,
            opcode: sys::ibv_wc_opcode_IBV_WC_RECV_RDMA_WITH_IMM,
            vendor_err: 0x50 + i,
            byte_len: 100 * i,
            imm_data: (0xabc0_0000 + i).to_be(),
            qp_num: 0x10 + i,
            src_qp: 0x20 + i,
            wc_flags: sys::ibv_wc_flags_IBV_WC_WITH_IMM | sys::ibv_wc_flags_IBV_WC_GRH,
            pkey_index: 3,
            slid: 0xbe00 + i as u16,
            sl: i as u8 + 1,
            dlid_path_bits: i as u8 + 7,
            reserved: [0; 18],
        }
    }

    /// A Cq as create_cq_ex builds it, over a CQ ring in heap memory.
    fn test_cq(ring: MappedRing<sys::metaroce_cqe>, wc_flags: u64) -> *mut Cq {
        let mut cq = new_object::<Cq>();
        let p = cq.as_mut_ptr();
        // SAFETY: writing the fields of a zeroed Cq as finish_cq does; the Mapping names no
        // mapping and is never dropped (free_cq).
        unsafe {
            ptr::addr_of_mut!((*p).ring).write(CqState::new(Consumer::new(ring).unwrap()));
            let p = Box::into_raw(cq.assume_init());
            set_poll_ops(ptr::addr_of_mut!((*p).vcq.__bindgen_anon_1.cq_ex), wc_flags);
            p
        }
    }

    fn free_cq(p: *mut Cq) {
        // SAFETY: the Box of test_cq; its ring dropped in place (no mapping).
        unsafe {
            ptr::drop_in_place(ptr::addr_of_mut!((*p).ring));
            drop(Box::from_raw(p.cast::<core::mem::MaybeUninit<Cq>>()));
        }
    }

    fn cqx_of(p: *mut Cq) -> *mut sys::ibv_cq_ex {
        // SAFETY: p is live.
        unsafe { ptr::addr_of_mut!((*p).vcq.__bindgen_anon_1.cq_ex) }
    }

    /// The ops as an application reaches them (libibverbs' ibv_start_poll etc. are inline
    /// calls through these pointers).
    fn ops(cqx: *mut sys::ibv_cq_ex) -> sys::ibv_cq_ex {
        // SAFETY: a live CQ; a copy of its plain fields and function pointers.
        unsafe { cqx.read() }
    }

    #[test]
    fn extended_poll_reads_every_field_and_frees_at_end_poll() {
        let (mut buf, geo) = test_ring::<sys::metaroce_cqe>(4);
        let kernel = view::<sys::metaroce_cqe>(&mut buf, geo);
        kernel.store_producer(u32::MAX - 1);
        kernel.store_consumer(u32::MAX - 1);
        let p = test_cq(view(&mut buf, geo), ex::WC_FLAGS_SUPPORTED);
        let cqx = cqx_of(p);
        let o = ops(cqx);
        let mut attr = sys::ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: the callbacks as an application calls them, on a live CQ.
        unsafe {
            // Empty: ENOENT, no session (end_poll after it changes nothing, as pyverbs does).
            assert_eq!(o.start_poll.unwrap()(cqx, &mut attr), ENOENT);
            o.end_poll.unwrap()(cqx);
            assert_eq!(o.next_poll.unwrap()(cqx), EINVAL, "no session");
            // Three completions across the u32 wrap.
            for i in 0..3 {
                kernel.write_entry((u32::MAX - 1).wrapping_add(i), &cqe(i));
            }
            kernel.store_producer(1);
            for i in 0..3u32 {
                let ret = if i == 0 {
                    o.start_poll.unwrap()(cqx, &mut attr)
                } else {
                    o.next_poll.unwrap()(cqx)
                };
                assert_eq!(ret, 0, "completion {i}");
                let c = cqe(i);
                assert_eq!(((*cqx).wr_id, (*cqx).status), (c.wr_id, c.status));
                assert_eq!(o.read_opcode.unwrap()(cqx), c.opcode);
                assert_eq!(o.read_vendor_err.unwrap()(cqx), c.vendor_err);
                assert_eq!(o.read_byte_len.unwrap()(cqx), c.byte_len);
                assert_eq!(o.read_imm_data.unwrap()(cqx), c.imm_data);
                assert_eq!(o.read_qp_num.unwrap()(cqx), c.qp_num);
                assert_eq!(o.read_src_qp.unwrap()(cqx), c.src_qp);
                assert_eq!(o.read_wc_flags.unwrap()(cqx), c.wc_flags);
                assert_eq!(o.read_slid.unwrap()(cqx), u32::from(c.slid));
                assert_eq!(o.read_sl.unwrap()(cqx), c.sl);
                assert_eq!(o.read_dlid_path_bits.unwrap()(cqx), c.dlid_path_bits);
                // Nothing freed before end_poll.
                assert_eq!(kernel.load_consumer(), u32::MAX - 1);
            }
            // None left: ENOENT, the session stays open; one arriving now is seen.
            assert_eq!(o.next_poll.unwrap()(cqx), ENOENT);
            assert_eq!(o.start_poll.unwrap()(cqx, &mut attr), EINVAL, "nested");
            kernel.write_entry(1, &cqe(3));
            kernel.store_producer(2);
            assert_eq!(o.next_poll.unwrap()(cqx), 0);
            assert_eq!((*cqx).wr_id, 0x1003);
            // ibv_poll_cq inside one's own session is refused.
            let mut wc: [sys::ibv_wc; 2] = core::mem::zeroed();
            assert_eq!(super::super::poll_cq(cqx.cast(), 2, wc.as_mut_ptr()), -1);
            o.end_poll.unwrap()(cqx);
            assert_eq!(kernel.load_consumer(), 2, "all four freed");
            // ibv_poll_cq on the same CQ still works.
            kernel.write_entry(2, &cqe(4));
            kernel.store_producer(3);
            assert_eq!(super::super::poll_cq(cqx.cast(), 2, wc.as_mut_ptr()), 1);
            assert_eq!((wc[0].wr_id, wc[0].byte_len), (0x1004, 400));
            assert_eq!(kernel.load_consumer(), 3);
            // A non-zero poll attribute mask; a kernel claiming more than the ring holds.
            attr.comp_mask = 1;
            assert_eq!(o.start_poll.unwrap()(cqx, &mut attr), EINVAL);
            attr.comp_mask = 0;
            kernel.store_producer(3 + 5);
            assert_eq!(
                o.start_poll.unwrap()(cqx, &mut attr),
                crate::abi::ABI_MISMATCH_ERRNO
            );
            assert_eq!(
                o.next_poll.unwrap()(cqx),
                EINVAL,
                "no session after an error"
            );
            assert_eq!(kernel.load_consumer(), 3);
        }
        free_cq(p);
    }

    #[test]
    fn readers_only_for_the_wc_flags_asked() {
        let (mut buf, geo) = test_ring::<sys::metaroce_cqe>(4);
        let p = test_cq(view(&mut buf, geo), 0);
        let o = ops(cqx_of(p));
        assert!(o.start_poll.is_some() && o.next_poll.is_some() && o.end_poll.is_some());
        assert!(o.read_opcode.is_some() && o.read_vendor_err.is_some());
        assert!(o.read_wc_flags.is_some());
        assert!(o.read_byte_len.is_none() && o.read_imm_data.is_none());
        assert!(o.read_qp_num.is_none() && o.read_src_qp.is_none() && o.read_slid.is_none());
        assert!(o.read_sl.is_none() && o.read_dlid_path_bits.is_none());
        assert!(o.read_completion_ts.is_none() && o.read_cvlan.is_none());
        assert!(o.read_flow_tag.is_none() && o.read_tm_info.is_none());
        assert!(o.read_completion_wallclock_ns.is_none());
        free_cq(p);
        let (mut buf, geo) = test_ring::<sys::metaroce_cqe>(4);
        let p = test_cq(
            view(&mut buf, geo),
            u64::from(sys::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SL),
        );
        let o = ops(cqx_of(p));
        assert!(o.read_sl.is_some() && o.read_byte_len.is_none());
        free_cq(p);
    }

    /// An extended QP (test_qp's, RC, max_send_sge 4, max_inline_data 64, handle 77) whose
    /// doorbells go to the returned socket.
    struct ExQp {
        qp: *mut Qp,
        buf: Vec<u64>,
        kernel: UnixStream,
        _user: UnixStream,
        ctx: Box<Context>,
    }

    impl ExQp {
        fn new(entries: u32, send_ops_flags: u64) -> Self {
            Self::of_type(entries, send_ops_flags, RC_LIMITS)
        }

        /// The same QP with other limits (a UD QP: `UD`).
        fn of_type(entries: u32, send_ops_flags: u64, limits: SendLimits) -> Self {
            let (kernel, user) = UnixStream::pair().unwrap();
            kernel.set_nonblocking(true).unwrap();
            let mut ctx = test_context(1, user.as_raw_fd());
            let (mut buf, geo) = test_ring::<wqe::SendEntry>(entries);
            let qp = test_qp(view(&mut buf, geo), &mut ctx.ibv_ctx.context);
            // SAFETY: qp is live and not shared.
            unsafe {
                ptr::addr_of_mut!((*qp).limits).write(limits);
                let vqp = ptr::addr_of_mut!((*qp).vqp);
                (*vqp).comp_mask |= sys::verbs_qp_mask_VERBS_QP_EX;
                set_wr_ops(
                    ptr::addr_of_mut!((*vqp).__bindgen_anon_1.qp_ex),
                    send_ops_flags,
                );
            }
            Self {
                qp,
                buf,
                kernel,
                _user: user,
                ctx,
            }
        }

        /// An AH to `GID_V4` on this QP's context, as `ibv_create_ah` makes it.
        fn ah(&mut self) -> *mut sys::ibv_ah {
            let mut pd = test_pd(&mut self.ctx);
            // The PD is not kept: an AH keeps only the pointer, which nothing here reads.
            make_ah(&mut pd, &mut ah_attr(GID_V4))
        }

        fn qpx(&self) -> *mut sys::ibv_qp_ex {
            // SAFETY: live.
            unsafe { ptr::addr_of_mut!((*self.qp).vqp.__bindgen_anon_1.qp_ex) }
        }

        fn ops(&self) -> sys::ibv_qp_ex {
            // SAFETY: a copy of the live QP's plain fields and function pointers.
            unsafe { self.qpx().read() }
        }

        /// Sets `wr_id` and `wr_flags` as an application does before a builder.
        fn next(&self, wr_id: u64, wr_flags: u32) {
            // SAFETY: the application's fields of a live QP.
            unsafe {
                (*self.qpx()).wr_id = wr_id;
                (*self.qpx()).wr_flags = wr_flags;
            }
        }

        fn doorbells(&self) -> usize {
            let mut db = [0u8; 256];
            match (&self.kernel).read(&mut db) {
                Ok(n) => {
                    assert_eq!(n % 32, 0);
                    n / 32
                }
                Err(_) => 0,
            }
        }

        fn producer(&self) -> u32 {
            self.buf[0] as u32
        }

        fn bytes(&self) -> Vec<u64> {
            self.buf.clone()
        }

        /// The WQE in ring slot `i`.
        fn wqe(&self, i: usize) -> sys::metaroce_send_wqe {
            let at = crate::ring::HDR_SIZE + i * size_of::<sys::metaroce_send_wqe>();
            assert!(at + size_of::<sys::metaroce_send_wqe>() <= self.buf.len() * 8);
            // SAFETY: in bounds (checked) of the 8-aligned ring buffer; any bytes are a valid
            // WQE (plain integers and a byte union).
            unsafe {
                self.buf
                    .as_ptr()
                    .cast::<u8>()
                    .add(at)
                    .cast::<sys::metaroce_send_wqe>()
                    .read_unaligned()
            }
        }
    }

    impl Drop for ExQp {
        fn drop(&mut self) {
            // SAFETY: the Box leaked by test_qp.
            drop(unsafe { Box::from_raw(self.qp) });
        }
    }

    const ALL_RC: u64 = 0x3ff | 1 << 11 | 1 << 12;
    const RC_LIMITS: SendLimits = super::super::tests::RC;
    /// IBV_QP_EX_WITH_SEND | _SEND_WITH_IMM: what a UD QP takes.
    const UD_OPS: u64 = 0xc;
    const SIGNALED: u32 = sys::ibv_send_flags_IBV_SEND_SIGNALED;
    const INLINE: u32 = sys::ibv_send_flags_IBV_SEND_INLINE;

    #[test]
    fn wr_api_writes_the_wqes_post_send_writes() {
        let payload = *b"0123456789abcdefghijklmnopqrstuv";
        let mut sg2 = [
            sys::ibv_sge {
                addr: 0x1000,
                length: 100,
                lkey: 7,
            },
            sys::ibv_sge {
                addr: 0x2000,
                length: 200,
                lkey: 8,
            },
        ];
        let mut inline = [sys::ibv_sge {
            addr: payload.as_ptr() as u64,
            length: 20,
            lkey: 0,
        }];
        let mut sg1 = [sys::ibv_sge {
            addr: 0x3000,
            length: 8,
            lkey: 9,
        }];
        // The work through ibv_post_send.
        let old = ExQp::new(16, 0);
        let mut wrs = [
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg2),
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM, &mut inline),
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut inline),
            send_wr(sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE, &mut sg1),
            send_wr(sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM, &mut sg2),
            send_wr(sys::ibv_wr_opcode_IBV_WR_RDMA_READ, &mut sg1),
            send_wr(sys::ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP, &mut sg1),
            send_wr(sys::ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD, &mut sg1),
        ];
        wrs[1].send_flags |= INLINE;
        wrs[1].__bindgen_anon_1.imm_data = 0x0102_0304u32.to_be();
        wrs[2].wr_id = 999;
        wrs[2].send_flags = INLINE | sys::ibv_send_flags_IBV_SEND_SOLICITED;
        wrs[3].wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: 0xdead_0000,
            rkey: 0x55,
        };
        wrs[4].wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: 0xdead_1000,
            rkey: 0x56,
        };
        wrs[4].__bindgen_anon_1.imm_data = 0x0a0b_0c0du32.to_be();
        wrs[5].wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: 0xdead_2000,
            rkey: 0x57,
        };
        wrs[6].wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: 0xdead_3000,
            compare_add: 11,
            swap: 22,
            rkey: 0x58,
        };
        wrs[7].wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: 0xdead_4000,
            compare_add: 33,
            swap: 0,
            rkey: 0x59,
        };
        link(&mut wrs);
        let mut bad = ptr::null_mut();
        // SAFETY: the callback as libibverbs calls it, on a valid list.
        let ret = unsafe { post_send(old.qpx().cast(), &mut wrs[0], &mut bad) };
        assert_eq!(ret, 0);
        assert_eq!(old.doorbells(), 1);

        // The same work through the ibv_wr_* API: the same ring bytes, one doorbell.
        let new = ExQp::new(16, ALL_RC);
        let o = new.ops();
        let q = new.qpx();
        // SAFETY: the callbacks as an application calls them, on a live QP; the SGEs and
        // inline buffers are live.
        unsafe {
            o.wr_start.unwrap()(q);
            new.next(1002, SIGNALED);
            o.wr_send.unwrap()(q);
            o.wr_set_sge_list.unwrap()(q, 2, sg2.as_ptr());
            new.next(1003, SIGNALED | INLINE);
            o.wr_send_imm.unwrap()(q, 0x0102_0304u32.to_be());
            o.wr_set_sge.unwrap()(q, 0, payload.as_ptr() as u64, 20);
            // Inline data given directly, in two buffers: IBV_SEND_INLINE is implied.
            new.next(999, sys::ibv_send_flags_IBV_SEND_SOLICITED);
            o.wr_send.unwrap()(q);
            let bufs = [
                sys::ibv_data_buf {
                    addr: payload.as_ptr() as *mut c_void,
                    length: 12,
                },
                sys::ibv_data_buf {
                    addr: payload[12..].as_ptr() as *mut c_void,
                    length: 8,
                },
            ];
            o.wr_set_inline_data_list.unwrap()(q, 2, bufs.as_ptr());
            new.next(1000, SIGNALED);
            o.wr_rdma_write.unwrap()(q, 0x55, 0xdead_0000);
            o.wr_set_sge.unwrap()(q, 9, 0x3000, 8);
            new.next(1001, SIGNALED);
            o.wr_rdma_write_imm.unwrap()(q, 0x56, 0xdead_1000, 0x0a0b_0c0du32.to_be());
            o.wr_set_sge_list.unwrap()(q, 2, sg2.as_ptr());
            new.next(1004, SIGNALED);
            o.wr_rdma_read.unwrap()(q, 0x57, 0xdead_2000);
            o.wr_set_sge.unwrap()(q, 9, 0x3000, 8);
            new.next(1005, SIGNALED);
            o.wr_atomic_cmp_swp.unwrap()(q, 0x58, 0xdead_3000, 11, 22);
            o.wr_set_sge.unwrap()(q, 9, 0x3000, 8);
            new.next(1006, SIGNALED);
            o.wr_atomic_fetch_add.unwrap()(q, 0x59, 0xdead_4000, 33);
            o.wr_set_sge.unwrap()(q, 9, 0x3000, 8);
            assert_eq!(new.producer(), 0, "nothing visible before wr_complete");
            assert_eq!(new.doorbells(), 0);
            assert_eq!(o.wr_complete.unwrap()(q), 0);
        }
        assert_eq!(new.doorbells(), 1);
        assert_eq!(new.producer(), 8);
        assert_eq!(new.bytes(), old.bytes(), "ring memory differs");
        // An empty batch: 0, no doorbell; wr_complete with no batch: EINVAL.
        // SAFETY: as above.
        unsafe {
            o.wr_start.unwrap()(q);
            assert_eq!(o.wr_complete.unwrap()(q), 0);
            assert_eq!(o.wr_complete.unwrap()(q), EINVAL);
        }
        assert_eq!(new.doorbells(), 0);
    }

    #[test]
    fn wr_abort_and_failed_batches_leave_the_ring_as_before() {
        let qp = ExQp::new(4, ALL_RC);
        let o = qp.ops();
        let q = qp.qpx();
        let before = qp.bytes();
        let big = [0u8; 65];
        let sges = [sys::ibv_sge {
            addr: 0x3000,
            length: 8,
            lkey: 9,
        }; 13];
        // SAFETY: the callbacks as an application calls them, on a live QP.
        unsafe {
            // Abort: nothing published, no doorbell.
            o.wr_start.unwrap()(q);
            for i in 0..3 {
                qp.next(i, SIGNALED);
                o.wr_send.unwrap()(q);
                o.wr_set_sge.unwrap()(q, 9, 0x3000, 8);
            }
            o.wr_abort.unwrap()(q);
            assert_eq!(qp.producer(), 0);
            // Building errors: wr_complete's errno, nothing published.
            type Build =
                unsafe fn(&ExQp, &sys::ibv_qp_ex, *mut sys::ibv_qp_ex, &[u8], &[sys::ibv_sge]);
            let cases: [(&str, Build, c_int); 7] = [
                (
                    "ring full (5 WRs, 4 slots)",
                    |qp, o, q, _, _| {
                        for i in 0..5 {
                            qp.next(i, SIGNALED);
                            o.wr_send.unwrap()(q);
                        }
                    },
                    ENOMEM,
                ),
                (
                    "more SGEs than a WQE holds",
                    |_, o, q, _, sges| {
                        o.wr_send.unwrap()(q);
                        o.wr_set_sge_list.unwrap()(q, 13, sges.as_ptr());
                    },
                    EINVAL,
                ),
                (
                    "more SGEs than max_send_sge",
                    |_, o, q, _, sges| {
                        o.wr_rdma_write.unwrap()(q, 1, 0x1000);
                        o.wr_set_sge_list.unwrap()(q, 5, sges.as_ptr());
                    },
                    EINVAL,
                ),
                (
                    "inline data over max_inline_data",
                    |_, o, q, big, _| {
                        o.wr_send.unwrap()(q);
                        o.wr_set_inline_data.unwrap()(q, big.as_ptr() as *mut c_void, 65);
                    },
                    EINVAL,
                ),
                (
                    "inline data for an RDMA read",
                    |_, o, q, big, _| {
                        o.wr_rdma_read.unwrap()(q, 1, 0x1000);
                        o.wr_set_inline_data.unwrap()(q, big.as_ptr() as *mut c_void, 8);
                    },
                    EINVAL,
                ),
                (
                    "a UD address on an RC QP",
                    |_, o, q, _, _| {
                        o.wr_send.unwrap()(q);
                        o.wr_set_ud_addr.unwrap()(q, ptr::null_mut(), 1, 2);
                    },
                    EINVAL,
                ),
                (
                    "a setter before any builder",
                    |_, o, q, _, _| o.wr_set_sge.unwrap()(q, 1, 2, 3),
                    EINVAL,
                ),
            ];
            for (what, build, errno) in cases {
                o.wr_start.unwrap()(q);
                qp.next(7, SIGNALED);
                build(&qp, &o, q, &big, &sges);
                assert_eq!(o.wr_complete.unwrap()(q), errno, "{what}");
                assert_eq!(qp.producer(), 0, "{what}");
                assert_eq!(qp.doorbells(), 0, "{what}");
            }
            // A full ring wrote only slots the kernel had no claim on; the header is as before.
            assert_eq!(qp.bytes()[..16], before[..16]);
            // Afterwards the ring takes a whole batch from where it was.
            o.wr_start.unwrap()(q);
            for i in 0..4 {
                qp.next(40 + i, SIGNALED);
                o.wr_send.unwrap()(q);
            }
            assert_eq!(o.wr_complete.unwrap()(q), 0);
            assert_eq!((qp.producer(), qp.doorbells()), (4, 1));
            // Full now: the whole batch is refused with ENOMEM.
            o.wr_start.unwrap()(q);
            o.wr_send.unwrap()(q);
            assert_eq!(o.wr_complete.unwrap()(q), ENOMEM);
            assert_eq!((qp.producer(), qp.doorbells()), (4, 0));
        }
    }

    /// `ibv_wr_atomic_write` takes its 8 bytes when called (in order: `compare_add` holds them
    /// read big-endian), `ibv_wr_flush` its range, type and level; neither takes data, and a
    /// NULL value or a misaligned address fails the batch.
    #[test]
    fn atomic_write_and_flush_builders() {
        let qp = ExQp::new(4, ALL_RC);
        let o = qp.ops();
        let q = qp.qpx();
        let value = [1u8, 2, 3, 4, 5, 6, 7, 8];
        // SAFETY: the callbacks as an application calls them, on a live QP; `value` is live.
        unsafe {
            o.wr_start.unwrap()(q);
            qp.next(7, SIGNALED);
            o.wr_atomic_write.unwrap()(q, 0x31, 0xbeef_0008, value.as_ptr().cast());
            qp.next(8, SIGNALED);
            o.wr_flush.unwrap()(q, 0x32, 0xbeef_0000, 4096, 1, 1);
            assert_eq!(o.wr_complete.unwrap()(q), 0);
        }
        assert_eq!((qp.producer(), qp.doorbells()), (2, 1));
        let (a, f) = (qp.wqe(0), qp.wqe(1));
        assert_eq!(
            (a.wr_id, a.opcode, a.rkey, a.remote_addr, a.num_sge),
            (
                7,
                sys::ibv_wr_opcode_IBV_WR_ATOMIC_WRITE,
                0x31,
                0xbeef_0008,
                0
            )
        );
        assert_eq!((a.compare_add, a.swap), (0x0102_0304_0506_0708, 0));
        assert_eq!(
            (f.wr_id, f.opcode, f.rkey, f.remote_addr, f.num_sge),
            (8, sys::ibv_wr_opcode_IBV_WR_FLUSH, 0x32, 0xbeef_0000, 0)
        );
        assert_eq!((f.compare_add, f.swap), (4096, 1 | 1 << 8));
        // SAFETY: as above; a NULL value is the application's mistake, caught.
        unsafe {
            o.wr_start.unwrap()(q);
            o.wr_atomic_write.unwrap()(q, 0x31, 0xbeef_0008, ptr::null());
            assert_eq!(o.wr_complete.unwrap()(q), EINVAL);
            o.wr_start.unwrap()(q);
            o.wr_atomic_write.unwrap()(q, 0x31, 0xbeef_0004, value.as_ptr().cast());
            assert_eq!(o.wr_complete.unwrap()(q), EINVAL, "misaligned");
        }
        assert_eq!(qp.producer(), 2);
    }

    #[test]
    fn post_send_inside_ones_own_batch_is_refused() {
        let qp = ExQp::new(4, ALL_RC);
        let o = qp.ops();
        let q = qp.qpx();
        let mut sg = [sys::ibv_sge {
            addr: 0x3000,
            length: 8,
            lkey: 9,
        }];
        let mut wr = send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg);
        let mut bad = ptr::null_mut();
        // SAFETY: the callbacks as an application calls them, on a live QP.
        unsafe {
            o.wr_start.unwrap()(q);
            o.wr_send.unwrap()(q);
            assert_eq!(post_send(q.cast(), &mut wr, &mut bad), EINVAL);
            assert_eq!(bad, &mut wr as *mut _);
            // A second wr_start inside the batch fails it.
            o.wr_start.unwrap()(q);
            assert_eq!(o.wr_complete.unwrap()(q), EINVAL);
            assert_eq!(qp.producer(), 0);
            // Outside a batch both APIs post, one after the other.
            assert_eq!(post_send(q.cast(), &mut wr, &mut bad), 0);
            o.wr_start.unwrap()(q);
            o.wr_send.unwrap()(q);
            assert_eq!(o.wr_complete.unwrap()(q), 0);
            assert_eq!((qp.producer(), qp.doorbells()), (2, 2));
            // Builders and setters outside a batch do nothing.
            o.wr_send.unwrap()(q);
            o.wr_set_sge.unwrap()(q, 1, 2, 3);
            o.wr_abort.unwrap()(q);
            assert_eq!(qp.producer(), 2);
        }
    }

    #[test]
    fn ud_wr_api_writes_the_wqes_post_send_writes() {
        let payload = *b"0123456789abcdef";
        let mut sg = [sys::ibv_sge {
            addr: 0x1000,
            length: 100,
            lkey: 7,
        }];
        let mut inline = [sys::ibv_sge {
            addr: payload.as_ptr() as u64,
            length: 16,
            lkey: 0,
        }];
        // Through ibv_post_send.
        let mut old = ExQp::of_type(8, UD_OPS, UD);
        let old_ah = old.ah();
        let ud = |ah, remote_qpn, remote_qkey| sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn,
            remote_qkey,
        };
        let mut wrs = [
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg),
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM, &mut inline),
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg),
        ];
        wrs[0].wr.ud = ud(old_ah, 0x12, 0x8000_0000);
        wrs[1].wr.ud = ud(old_ah, 0x34, 0x1111);
        wrs[1].send_flags |= INLINE;
        wrs[1].__bindgen_anon_1.imm_data = 0x0102_0304u32.to_be();
        wrs[2].wr.ud = ud(old_ah, 0x00ff_ffff, 0x2222);
        link(&mut wrs);
        let mut bad = ptr::null_mut();
        // SAFETY: the callback as libibverbs calls it, on a valid list.
        assert_eq!(
            unsafe { post_send(old.qpx().cast(), &mut wrs[0], &mut bad) },
            0
        );

        // Through ibv_wr_*, the address before the data, after it, and with inline data.
        let mut new = ExQp::of_type(8, UD_OPS, UD);
        let ah = new.ah();
        let o = new.ops();
        let q = new.qpx();
        // SAFETY: the callbacks as an application calls them, on a live QP; the AH, SGEs and
        // inline bytes are live.
        unsafe {
            o.wr_start.unwrap()(q);
            new.next(1002, SIGNALED);
            o.wr_send.unwrap()(q);
            o.wr_set_ud_addr.unwrap()(q, ah, 0x12, 0x8000_0000);
            o.wr_set_sge.unwrap()(q, 7, 0x1000, 100);
            new.next(1003, SIGNALED);
            o.wr_send_imm.unwrap()(q, 0x0102_0304u32.to_be());
            o.wr_set_inline_data.unwrap()(q, payload.as_ptr() as *mut c_void, 16);
            o.wr_set_ud_addr.unwrap()(q, ah, 0x34, 0x1111);
            new.next(1002, SIGNALED);
            o.wr_send.unwrap()(q);
            o.wr_set_sge_list.unwrap()(q, 1, sg.as_ptr());
            o.wr_set_ud_addr.unwrap()(q, ah, 0x00ff_ffff, 0x2222);
            assert_eq!(o.wr_complete.unwrap()(q), 0);
        }
        assert_eq!((new.producer(), new.doorbells()), (3, 1));
        assert_eq!((old.producer(), old.doorbells()), (3, 1));
        assert_eq!(new.bytes(), old.bytes(), "ring memory differs");
        // SAFETY: the AHs, freed once.
        unsafe {
            assert_eq!(destroy_ah(ah), 0);
            assert_eq!(destroy_ah(old_ah), 0);
        }
    }

    #[test]
    fn ud_batches_need_one_of_their_own_ahs() {
        let mut qp = ExQp::of_type(4, UD_OPS, UD);
        let ah = qp.ah();
        let mut other = ExQp::of_type(4, UD_OPS, UD);
        let foreign = other.ah();
        let o = qp.ops();
        let q = qp.qpx();
        // SAFETY: the callbacks as an application calls them, on live QPs and AHs.
        unsafe {
            for (what, ah) in [
                ("NULL AH", ptr::null_mut()),
                ("another context's AH", foreign),
            ] {
                o.wr_start.unwrap()(q);
                o.wr_send.unwrap()(q);
                o.wr_set_ud_addr.unwrap()(q, ah, 1, 2);
                o.wr_set_sge.unwrap()(q, 1, 2, 3);
                assert_eq!(o.wr_complete.unwrap()(q), EINVAL, "{what}");
            }
            // No address at all.
            o.wr_start.unwrap()(q);
            o.wr_send.unwrap()(q);
            o.wr_set_sge.unwrap()(q, 1, 2, 3);
            assert_eq!(o.wr_complete.unwrap()(q), EINVAL, "no address");
            assert_eq!((qp.producer(), qp.doorbells()), (0, 0));
            // And a good one.
            o.wr_start.unwrap()(q);
            o.wr_send.unwrap()(q);
            o.wr_set_ud_addr.unwrap()(q, ah, 1, 2);
            assert_eq!(o.wr_complete.unwrap()(q), 0);
            assert_eq!((qp.producer(), qp.doorbells()), (1, 1));
            // An RC QP's batch fails even with a good AH (of its own context).
            let mut rc = ExQp::new(4, ALL_RC);
            let rc_ah = rc.ah();
            let ro = rc.ops();
            ro.wr_start.unwrap()(rc.qpx());
            ro.wr_send.unwrap()(rc.qpx());
            ro.wr_set_ud_addr.unwrap()(rc.qpx(), rc_ah, 1, 2);
            assert_eq!(ro.wr_complete.unwrap()(rc.qpx()), EINVAL);
            assert_eq!(rc.producer(), 0);
            for a in [ah, foreign, rc_ah] {
                assert_eq!(destroy_ah(a), 0);
            }
        }
    }

    #[test]
    fn extended_poll_of_a_ud_receive() {
        let (mut buf, geo) = test_ring::<sys::metaroce_cqe>(4);
        let kernel = view::<sys::metaroce_cqe>(&mut buf, geo);
        let p = test_cq(view(&mut buf, geo), ex::WC_FLAGS_SUPPORTED);
        let cqx = cqx_of(p);
        let o = ops(cqx);
        kernel.write_entry(0, &UD_RECV);
        kernel.store_producer(1);
        // SAFETY: the callbacks as an application calls them, on a live CQ.
        unsafe {
            assert_eq!(o.start_poll.unwrap()(cqx, ptr::null_mut()), 0);
            assert_eq!(((*cqx).wr_id, (*cqx).status), (77, 0));
            assert_eq!(o.read_opcode.unwrap()(cqx), sys::ibv_wc_opcode_IBV_WC_RECV);
            assert_eq!(o.read_byte_len.unwrap()(cqx), 140);
            assert_eq!(o.read_src_qp.unwrap()(cqx), 0x00ab_cdef);
            assert_eq!(o.read_qp_num.unwrap()(cqx), 0x11);
            assert_eq!(o.read_wc_flags.unwrap()(cqx), 3);
            assert_eq!(o.read_imm_data.unwrap()(cqx), 0x0a0b_0c0du32.to_be());
            assert_eq!((o.read_sl.unwrap()(cqx), o.read_slid.unwrap()(cqx)), (0, 0));
            o.end_poll.unwrap()(cqx);
        }
        assert_eq!(kernel.load_consumer(), 1);
        free_cq(p);
    }

    #[test]
    fn only_the_asked_builders_are_set() {
        let qp = ExQp::new(
            4,
            u64::from(sys::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND),
        );
        let o = qp.ops();
        assert!(o.wr_send.is_some());
        assert!(o.wr_send_imm.is_none() && o.wr_rdma_write.is_none());
        assert!(o.wr_rdma_write_imm.is_none() && o.wr_rdma_read.is_none());
        assert!(o.wr_atomic_cmp_swp.is_none() && o.wr_atomic_fetch_add.is_none());
        assert!(o.wr_start.is_some() && o.wr_complete.is_some() && o.wr_abort.is_some());
        assert!(o.wr_set_sge.is_some() && o.wr_set_sge_list.is_some());
        assert!(o.wr_set_inline_data.is_some() && o.wr_set_inline_data_list.is_some());
        assert!(o.wr_set_ud_addr.is_some());
        assert!(o.wr_bind_mw.is_none() && o.wr_local_inv.is_none() && o.wr_send_inv.is_none());
        assert!(o.wr_flush.is_none() && o.wr_atomic_write.is_none());
        // Never: the device has none of these.
        assert!(o.wr_send_tso.is_none() && o.wr_set_xrc_srqn.is_none());
        let all = ExQp::new(4, ALL_RC).ops();
        assert!(all.wr_send_imm.is_some() && all.wr_rdma_write.is_some());
        assert!(all.wr_rdma_write_imm.is_some() && all.wr_rdma_read.is_some());
        assert!(all.wr_atomic_cmp_swp.is_some() && all.wr_atomic_fetch_add.is_some());
        assert!(all.wr_bind_mw.is_some() && all.wr_local_inv.is_some());
        assert!(all.wr_send_inv.is_some());
        assert!(all.wr_flush.is_some() && all.wr_atomic_write.is_some());
        assert!(all.wr_send_tso.is_none() && all.wr_set_xrc_srqn.is_none());
    }

    #[test]
    fn another_threads_batch_waits_for_this_one() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let qp = ExQp::new(8, ALL_RC);
        let o = qp.ops();
        let q = qp.qpx() as usize;
        let done = AtomicBool::new(false);
        // SAFETY: the callbacks as an application calls them, on a live QP.
        unsafe { o.wr_start.unwrap()(q as *mut _) };
        std::thread::scope(|t| {
            let other = t.spawn(|| {
                let q = q as *mut sys::ibv_qp_ex;
                // SAFETY: as above; wr_start waits for the first batch to end.
                unsafe {
                    o.wr_start.unwrap()(q);
                    assert!(done.load(Ordering::SeqCst), "opened inside another batch");
                    o.wr_send.unwrap()(q);
                    assert_eq!(o.wr_complete.unwrap()(q), 0);
                }
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            // SAFETY: as above.
            unsafe {
                o.wr_send.unwrap()(q as *mut _);
                done.store(true, Ordering::SeqCst);
                assert_eq!(o.wr_complete.unwrap()(q as *mut _), 0);
            }
            other.join().unwrap();
        });
        assert_eq!(qp.producer(), 2);
    }
}
