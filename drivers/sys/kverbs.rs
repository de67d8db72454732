// SPDX-License-Identifier: GPL-2.0

//! Verbs for kernel consumers: what the MAD layer needs for the GSI QP of each port (and so the
//! connection manager, `rdma_cm`): address handles, the GSI QP itself, `post_send` and
//! `post_recv` with work request chains, and `poll_cq` on kernel CQs. The objects live in
//! `crate::gsi` and `crate::verbs`.
//!
//! The device does virtual DMA (it registers with no DMA device, as rxe and siw do), so an
//! SGE's address from a kernel consumer is a kernel virtual address, and every SGE names the
//! PD's `local_dma_lkey` ([`KERNEL_LKEY`]).

use super::{
    bindings,
    ibdev::engine_of,
    to_errno,
    verbs::{cq_of, MetaQp},
};
use crate::{
    gsi::{GsiQp, GsiRecv, GsiSend, KernelSgl, PostError, GSI_MAX_SGE, GSI_MAX_WR, GSI_QPN},
    verbs::KernelWc,
};
use core::{mem::offset_of, mem::size_of, ptr};
use kernel::{ffi::c_int, prelude::*, sync::Arc};

/// The lkey of kernel memory (the device's `local_dma_lkey`, which every kernel PD gets). No
/// MR has it (their keys are below 2^24), and user WQEs naming it find no MR.
pub(crate) const KERNEL_LKEY: u32 = 0xffff_fffe;

/// A buffer of a kernel consumer's work request: kernel memory (virtual DMA) that the consumer
/// keeps valid until the request completes (the verbs contract for posted buffers).
#[derive(Clone, Copy, Default)]
pub(crate) struct KernelBuf {
    addr: usize,
    len: usize,
}

// SAFETY: kernel memory is the same on every CPU; its owner keeps it valid while we hold this
// (see `KernelBuf::new`).
unsafe impl Send for KernelBuf {}
// SAFETY: as above; we only copy to and from it.
unsafe impl Sync for KernelBuf {}

impl KernelBuf {
    /// # Safety
    ///
    /// `[addr, addr + len)` must be kernel memory that stays valid, and is not otherwise
    /// accessed in ways that conflict with ours, until the work request naming it completes
    /// or its QP is destroyed; the holder must not touch it after either.
    unsafe fn new(addr: u64, len: u32) -> Self {
        KernelBuf {
            addr: addr as usize,
            len: len as usize,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies the buffer's first `out.len()` bytes (at most all of it) into `out`.
    pub(crate) fn read(&self, out: &mut [u8]) {
        let n = out.len().min(self.len);
        if n == 0 {
            return;
        }
        // SAFETY: per `new`'s contract the `len >= n` bytes at `addr` are valid kernel memory
        // while we hold the buffer; `out` is ours and does not overlap it.
        unsafe { ptr::copy_nonoverlapping(self.addr as *const u8, out.as_mut_ptr(), n) };
    }

    /// Copies `data` to `offset` bytes into the buffer, as much as fits.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) {
        let n = data.len().min(self.len.saturating_sub(offset));
        if n == 0 {
            return;
        }
        // SAFETY: per `new`'s contract; `offset + n <= len`; `data` does not overlap it.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), (self.addr as *mut u8).add(offset), n) };
    }
}

/// The SGEs of a kernel work request.
///
/// # Safety
///
/// `sg_list` must point to `num_sge` live SGEs of a work request being posted to one of our
/// kernel QPs (so [`KernelBuf::new`]'s contract holds for each).
unsafe fn kernel_sgl(sg_list: *const bindings::ib_sge, num_sge: c_int) -> Option<KernelSgl> {
    let num = usize::try_from(num_sge).ok()?;
    if num > GSI_MAX_SGE || (num > 0 && sg_list.is_null()) {
        return None;
    }
    let mut sgl = KernelSgl {
        num,
        ..KernelSgl::default()
    };
    for (i, slot) in sgl.sges.iter_mut().take(num).enumerate() {
        // SAFETY: per the contract `sg_list` has `num` entries.
        let sge = unsafe { &*sg_list.add(i) };
        if sge.lkey != KERNEL_LKEY {
            return None;
        }
        // SAFETY: per the contract, the consumer keeps the memory until completion.
        *slot = unsafe { KernelBuf::new(sge.addr, sge.length) };
    }
    Some(sgl)
}

// ---- address handles ----

/// An address handle: where a UD work request goes.
#[repr(C)]
struct MetaAh {
    ibah: bindings::ib_ah,
    dgid: [u8; 16],
}

const _: () = assert!(offset_of!(MetaAh, ibah) == 0);
pub(super) const SIZE_AH: usize = size_of::<MetaAh>();

/// # Safety
///
/// Called only by the RDMA core with an AH it allocated (`size_ib_ah`, zeroed).
pub(super) unsafe extern "C" fn create_ah(
    ibah: *mut bindings::ib_ah,
    init: *mut bindings::rdma_ah_init_attr,
    udata: *mut bindings::ib_udata,
) -> c_int {
    if !udata.is_null() {
        // Userspace UD is not supported (the provider creates no UD QPs).
        return EOPNOTSUPP.to_errno();
    }
    // SAFETY: the core passes its live init attributes with a live `ah_attr`.
    let attr = unsafe { &*(*init).ah_attr };
    if u32::from(attr.ah_flags) & bindings::ib_ah_flags_IB_AH_GRH == 0 {
        // RoCE addresses are GIDs.
        return EINVAL.to_errno();
    }
    // SAFETY: our zeroed allocation of `SIZE_AH` bytes with the `ib_ah` first.
    unsafe { (*ibah.cast::<MetaAh>()).dgid = super::gid_bytes(&attr.grh.dgid) };
    0
}

/// # Safety
///
/// Called only by the RDMA core for an AH we created.
pub(super) unsafe extern "C" fn destroy_ah(_ibah: *mut bindings::ib_ah, _flags: u32) -> c_int {
    0
}

// ---- CQ ----

/// # Safety
///
/// Called only by the RDMA core for a CQ we created, with room for `num` completions at `wc`.
pub(super) unsafe extern "C" fn poll_cq(
    ibcq: *mut bindings::ib_cq,
    num: c_int,
    wc: *mut bindings::ib_wc,
) -> c_int {
    // SAFETY: per the contract.
    let Ok(cq) = (unsafe { cq_of(ibcq) }) else {
        return EINVAL.to_errno();
    };
    let max = usize::try_from(num).unwrap_or(0);
    let n = cq.poll(max, |i, k: &KernelWc| {
        // SAFETY: `i < max = num`, and the core gave us `num` entries.
        let out = unsafe { &mut *wc.add(i) };
        fill_wc(out, k);
    });
    n as c_int
}

fn fill_wc(out: &mut bindings::ib_wc, k: &KernelWc) {
    let c = &k.cqe;
    *out = bindings::ib_wc::default();
    // `wr_id` and `wr_cqe` share the union: the consumer's 64-bit value comes back as posted.
    out.__bindgen_anon_1.wr_id = c.wr_id;
    out.status = c.status;
    out.opcode = c.opcode;
    out.vendor_err = c.vendor_err;
    out.byte_len = c.byte_len;
    out.qp = k.ibqp as *mut bindings::ib_qp;
    out.ex.imm_data = c.imm_data;
    out.src_qp = c.src_qp;
    out.wc_flags = c.wc_flags as c_int;
    out.pkey_index = c.pkey_index;
    out.port_num = u32::from(k.port_num);
    out.network_hdr_type = k.network_hdr_type;
}

// ---- the GSI QP ----

/// `create_qp` from a kernel consumer: only the GSI QP (the MAD layer's, one per port).
///
/// # Safety
///
/// As `verbs::create_qp`, with no udata.
pub(super) unsafe fn create_gsi(
    ibqp: *mut bindings::ib_qp,
    init: &mut bindings::ib_qp_init_attr,
) -> Result {
    if init.qp_type != bindings::ib_qp_type_IB_QPT_GSI {
        return Err(EOPNOTSUPP);
    }
    if init.create_flags != 0
        || !init.srq.is_null()
        || init.port_num == 0
        || init.port_num > crate::device::MAX_PLANES
        || init.cap.max_send_wr > GSI_MAX_WR
        || init.cap.max_recv_wr > GSI_MAX_WR
        || init.cap.max_send_sge as usize > GSI_MAX_SGE
        || init.cap.max_recv_sge as usize > GSI_MAX_SGE
    {
        return Err(EINVAL);
    }
    // SAFETY: `ibqp` is live with `device` set by the core; the CQs are live CQs of ours.
    let (engine, send_cq, recv_cq) = unsafe {
        (
            engine_of((*ibqp).device).ok_or(ENODEV)?,
            cq_of(init.send_cq)?,
            cq_of(init.recv_cq)?,
        )
    };
    let max_send_wr = init.cap.max_send_wr.max(1);
    let max_recv_wr = init.cap.max_recv_wr.max(1);
    let qp = Arc::pin_init(
        GsiQp::new(
            init.port_num,
            ibqp as usize,
            send_cq,
            recv_cq,
            init.sq_sig_type == bindings::ib_sig_type_IB_SIGNAL_ALL_WR,
            max_send_wr,
            max_recv_wr,
        )?,
        GFP_KERNEL,
    )?;
    engine.set_gsi(init.port_num, Some(qp.clone()))?;
    init.cap = super::abi::ib_caps(&qp.cap);
    // SAFETY: the core's zeroed allocation of our size; not yet visible to anyone else.
    unsafe {
        (*ibqp).qp_num = GSI_QPN;
        ptr::addr_of_mut!((*ibqp.cast::<MetaQp>()).gsi).write(Some(qp));
    }
    Ok(())
}

/// Our GSI QP behind an `ib_qp`, if it is one.
///
/// # Safety
///
/// `ibqp` must be a live QP of ours.
pub(super) unsafe fn gsi_of<'a>(ibqp: *mut bindings::ib_qp) -> Option<&'a Arc<GsiQp>> {
    // SAFETY: per the contract.
    unsafe { (*ibqp.cast::<MetaQp>()).gsi.as_ref() }
}

/// `destroy_qp` of the GSI QP: after this nothing touches its buffers or completes.
///
/// # Safety
///
/// `ibqp` must be a live QP of ours, being destroyed.
pub(super) unsafe fn destroy_gsi(ibqp: *mut bindings::ib_qp) {
    // SAFETY: per the contract; the core frees the `ib_qp` after we return.
    unsafe {
        if let Some(qp) = (*ibqp.cast::<MetaQp>()).gsi.take() {
            qp.kill();
            if let Some(engine) = engine_of((*ibqp).device) {
                let _ = engine.set_gsi(qp.port, None);
            }
        }
    }
}

fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::Invalid => EINVAL.to_errno(),
        PostError::Full => ENOMEM.to_errno(),
    }
}

/// `post_send` with work requests (a kernel consumer): queues each; the receive thread sends.
///
/// # Safety
///
/// Called only by the RDMA core for a QP of ours with a live chain of work requests.
pub(super) unsafe fn post_send_kernel(
    ibqp: *mut bindings::ib_qp,
    mut wr: *const bindings::ib_send_wr,
    bad_wr: *mut *const bindings::ib_send_wr,
) -> c_int {
    // SAFETY: per the contract.
    let Some(qp) = (unsafe { gsi_of(ibqp) }) else {
        // SAFETY: the core passes a valid out pointer.
        unsafe { *bad_wr = wr };
        return EOPNOTSUPP.to_errno();
    };
    let mut err = 0;
    let mut queued = false;
    while !wr.is_null() {
        // SAFETY: a live work request of the chain; on a UD QP every one is the `wr` field at
        // the start of an `ib_ud_wr` (`ud_wr()` in the core).
        let result = unsafe { gsi_send(&*wr) }.and_then(|s| qp.post_send(s));
        if let Err(e) = result {
            err = post_errno(e);
            break;
        }
        queued = true;
        // SAFETY: as above.
        wr = unsafe { (*wr).next };
    }
    if err != 0 {
        // SAFETY: the core passes a valid out pointer.
        unsafe { *bad_wr = wr };
    }
    if queued {
        // SAFETY: the QP's device is live while the core calls us for it.
        if let Some(engine) = unsafe { engine_of((*ibqp).device) } {
            engine.kick_datagrams();
        }
    }
    err
}

/// One UD send work request, checked and copied.
///
/// # Safety
///
/// `wr` must be the `wr` field of a live `ib_ud_wr` posted to one of our kernel QPs.
unsafe fn gsi_send(wr: &bindings::ib_send_wr) -> core::result::Result<GsiSend, PostError> {
    let imm = match wr.opcode {
        bindings::ib_wr_opcode_IB_WR_SEND => None,
        // SAFETY: a SEND_WITH_IMM carries its immediate in this view of the union.
        bindings::ib_wr_opcode_IB_WR_SEND_WITH_IMM => Some(u32::from_be(unsafe { wr.ex.imm_data })),
        _ => return Err(PostError::Invalid),
    };
    // SAFETY: per the contract `wr` starts an `ib_ud_wr` (offset 0, as `ud_wr()` assumes).
    let ud = unsafe { &*ptr::from_ref(wr).cast::<bindings::ib_ud_wr>() };
    if ud.ah.is_null() {
        return Err(PostError::Invalid);
    }
    // SAFETY: a live AH of our device (every AH on our QPs is ours).
    let dgid = unsafe { (*ud.ah.cast::<MetaAh>()).dgid };
    // SAFETY: per the contract, the SGE list is the work request's.
    let sgl = unsafe { kernel_sgl(wr.sg_list, wr.num_sge) }.ok_or(PostError::Invalid)?;
    let flags = wr.send_flags as u32;
    Ok(GsiSend {
        // SAFETY: `wr_id` and `wr_cqe` share the union; either is 64 bits we hand back.
        wr_id: unsafe { wr.__bindgen_anon_1.wr_id },
        signaled: flags & bindings::ib_send_flags_IB_SEND_SIGNALED as u32 != 0,
        solicited: flags & bindings::ib_send_flags_IB_SEND_SOLICITED as u32 != 0,
        imm,
        dgid,
        remote_qpn: ud.remote_qpn,
        remote_qkey: ud.remote_qkey,
        sgl,
    })
}

/// # Safety
///
/// Called only by the RDMA core for a QP of ours with a live chain of work requests.
pub(super) unsafe extern "C" fn post_recv(
    ibqp: *mut bindings::ib_qp,
    mut wr: *const bindings::ib_recv_wr,
    bad_wr: *mut *const bindings::ib_recv_wr,
) -> c_int {
    // SAFETY: per the contract.
    let Some(qp) = (unsafe { gsi_of(ibqp) }) else {
        // User QPs post receives into their rings.
        // SAFETY: the core passes a valid out pointer.
        unsafe { *bad_wr = wr };
        return EOPNOTSUPP.to_errno();
    };
    while !wr.is_null() {
        // SAFETY: a live work request of the chain, on one of our kernel QPs.
        let (sgl, wr_id, next) = unsafe {
            let w = &*wr;
            (
                kernel_sgl(w.sg_list, w.num_sge),
                w.__bindgen_anon_1.wr_id,
                w.next,
            )
        };
        let result = sgl
            .ok_or(PostError::Invalid)
            .and_then(|sgl| qp.post_recv(GsiRecv { wr_id, sgl }));
        if let Err(e) = result {
            // SAFETY: the core passes a valid out pointer.
            unsafe { *bad_wr = wr };
            return post_errno(e);
        }
        wr = next;
    }
    0
}

/// `modify_qp` of the GSI QP.
pub(super) fn modify_gsi(
    qp: &GsiQp,
    attr: &bindings::ib_qp_attr,
    mask: u32,
    qp_type: bindings::ib_qp_type,
) -> c_int {
    use crate::verbs_core::{ib, qp::modify_is_ok};
    let a = super::abi::modify_attr(attr);
    let cur = qp.state();
    let next = if mask & ib::attr_mask::STATE != 0 {
        ib::QpState::from_ib(a.qp_state)
    } else {
        Some(cur)
    };
    match (next, ib::QpType::from_ib(qp_type)) {
        (Some(next), Some(t)) if modify_is_ok(cur, next, t, mask) => to_errno(qp.modify(&a, mask)),
        _ => EINVAL.to_errno(),
    }
}

/// `query_qp` of the GSI QP.
pub(super) fn query_gsi(
    qp: &GsiQp,
    attr: &mut bindings::ib_qp_attr,
    init: &mut bindings::ib_qp_init_attr,
) {
    *attr = bindings::ib_qp_attr::default();
    let (state, qkey, sq_psn, pkey_index) = qp.attrs();
    attr.qp_state = state.to_ib();
    attr.cur_qp_state = attr.qp_state;
    attr.qkey = qkey;
    attr.sq_psn = sq_psn;
    attr.pkey_index = pkey_index;
    attr.port_num = qp.port;
    let cap = super::abi::ib_caps(&qp.cap);
    attr.cap = cap;
    init.cap = cap;
    init.qp_type = bindings::ib_qp_type_IB_QPT_GSI;
    init.port_num = qp.port;
}
