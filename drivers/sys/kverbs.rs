// SPDX-License-Identifier: GPL-2.0

//! Verbs for kernel consumers: what the MAD layer needs for the GSI QP of each port (and so the
//! connection manager, `rdma_cm`): address handles, the work request chains of `post_send` and
//! `post_recv` as iterators of decoded requests, and the work completions `poll_cq` returns.
//! The objects live in `crate::gsi` and `crate::verbs`; their ops in `crate::ops`.
//!
//! The device does virtual DMA (it registers with no DMA device, as rxe and siw do), so an
//! SGE's address from a kernel consumer is a kernel virtual address, and every SGE names the
//! PD's `local_dma_lkey` ([`KERNEL_LKEY`]).

use super::bindings;
use crate::{
    gsi::{GsiRecv, GsiSend, KernelSgl, PostError, GSI_MAX_SGE},
    verbs::{KernelWc, RecvWqe, SendWqe},
    verbs_core::abi::{Sge, MAX_SGE},
    verbs_core::ib::wr_opcode as op,
};
use core::{marker::PhantomData, mem::offset_of, mem::size_of, ptr};
use kernel::{ffi::c_int, prelude::*};

/// The lkey of kernel memory (the device's `local_dma_lkey`, which every kernel PD gets). No
/// MR has it (their keys are below 2^24), and user WQEs naming it find no MR.
pub(crate) const KERNEL_LKEY: u32 = 0xffff_fffe;
// The keys the kernel keeps for itself name different things.
const _: () =
    assert!(KERNEL_LKEY != crate::verbs::INLINE_LKEY && KERNEL_LKEY != crate::verbs::LIST_LKEY);

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

// ---- work completions ----

/// A kernel work completion as the core's `ib_wc`.
pub(super) fn fill_wc(out: &mut bindings::ib_wc, k: &KernelWc) {
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

// ---- work request chains ----

/// A kernel work request type whose chains [`WrChain`] walks.
pub(crate) trait KernelWr {
    /// The request as the driver takes it.
    type Decoded;

    fn next(&self) -> *const Self;

    /// Checks and copies the request.
    ///
    /// # Safety
    ///
    /// `self` must be a live request posted to one of our kernel QPs (for a send, on a UD QP:
    /// the `wr` field of an `ib_ud_wr`).
    unsafe fn decode(&self) -> core::result::Result<Self::Decoded, PostError>;
}

impl KernelWr for bindings::ib_send_wr {
    type Decoded = GsiSend;

    fn next(&self) -> *const Self {
        self.next
    }

    unsafe fn decode(&self) -> core::result::Result<GsiSend, PostError> {
        // SAFETY: per the contract.
        unsafe { gsi_send(self) }
    }
}

impl KernelWr for bindings::ib_recv_wr {
    type Decoded = GsiRecv;

    fn next(&self) -> *const Self {
        self.next
    }

    unsafe fn decode(&self) -> core::result::Result<GsiRecv, PostError> {
        // SAFETY: per the contract the SGE list is the request's; `wr_id` and `wr_cqe` share
        // the union, either is 64 bits we hand back.
        let (sgl, wr_id) = unsafe {
            (
                kernel_sgl(self.sg_list, self.num_sge),
                self.__bindgen_anon_1.wr_id,
            )
        };
        sgl.map(|sgl| GsiRecv { wr_id, sgl })
            .ok_or(PostError::Invalid)
    }
}

/// A kernel consumer's chain of work requests, decoded one by one.
pub(crate) struct WrChain<'a, W: KernelWr> {
    next: *const W,
    current: *const W,
    _chain: PhantomData<&'a W>,
}

/// A chain of send work requests (on a UD QP).
pub(crate) type KernelSends<'a> = WrChain<'a, bindings::ib_send_wr>;
/// A chain of receive work requests.
pub(crate) type KernelRecvs<'a> = WrChain<'a, bindings::ib_recv_wr>;
/// A chain of send work requests on an RC QP, as the WQEs of its ring.
pub(crate) type KernelRcSends<'a> = WrChain<'a, RcSendWr>;
/// A chain of receive work requests on an RC QP, as the WQEs of its ring.
pub(crate) type KernelRcRecvs<'a> = WrChain<'a, RcRecvWr>;

/// A send work request on a kernel consumer's RC QP: an `ib_send_wr`, or the `wr` of the
/// `ib_rdma_wr`, `ib_atomic_wr` or `ib_reg_wr` its opcode says it starts.
#[repr(transparent)]
pub(crate) struct RcSendWr(bindings::ib_send_wr);

/// A receive work request on a kernel consumer's RC QP.
#[repr(transparent)]
pub(crate) struct RcRecvWr(bindings::ib_recv_wr);

impl KernelWr for RcSendWr {
    type Decoded = SendWqe;

    fn next(&self) -> *const Self {
        self.0.next.cast()
    }

    unsafe fn decode(&self) -> core::result::Result<SendWqe, PostError> {
        // SAFETY: per the contract.
        unsafe { rc_send(&self.0) }
    }
}

impl KernelWr for RcRecvWr {
    type Decoded = RecvWqe;

    fn next(&self) -> *const Self {
        self.0.next.cast()
    }

    unsafe fn decode(&self) -> core::result::Result<RecvWqe, PostError> {
        let wr = &self.0;
        let num = usize::try_from(wr.num_sge).map_err(|_| PostError::Invalid)?;
        if num > MAX_SGE || (num > 0 && wr.sg_list.is_null()) {
            return Err(PostError::Invalid);
        }
        let mut w = RecvWqe {
            // SAFETY: `wr_id` and `wr_cqe` share the union; either is 64 bits we hand back.
            wr_id: unsafe { wr.__bindgen_anon_1.wr_id },
            num_sge: num as u32,
            ..RecvWqe::default()
        };
        for (i, slot) in w.sge.iter_mut().take(num).enumerate() {
            // SAFETY: per the contract the request's `sg_list` has `num_sge` entries.
            let sge = unsafe { &*wr.sg_list.add(i) };
            *slot = Sge {
                addr: sge.addr,
                length: sge.length,
                lkey: sge.lkey,
            };
        }
        Ok(w)
    }
}

/// One RC send work request as the WQE the data path takes from the QP's ring (the layout
/// of `uapi/metaroce-abi.h`; a REG_MR names its MR by the key's index, its rights where a
/// SEND_WITH_IMM has its immediate). An inline send's data is copied into the WQE now: the
/// consumer may reuse its buffer once the post returns.
///
/// # Safety
///
/// `wr` must be a live request posted to one of our kernel RC QPs, starting the work request
/// type its opcode names.
unsafe fn rc_send(wr: &bindings::ib_send_wr) -> core::result::Result<SendWqe, PostError> {
    use bindings::*;
    let flags = wr.send_flags as u32;
    let kept = (ib_send_flags_IB_SEND_FENCE
        | ib_send_flags_IB_SEND_SIGNALED
        | ib_send_flags_IB_SEND_SOLICITED
        | ib_send_flags_IB_SEND_INLINE) as u32;
    let mut w = SendWqe {
        // SAFETY: `wr_id` and `wr_cqe` share the union; either is 64 bits we hand back.
        wr_id: unsafe { wr.__bindgen_anon_1.wr_id },
        opcode: wr.opcode,
        send_flags: flags & kept,
        ..SendWqe::default()
    };
    let num = usize::try_from(wr.num_sge).map_err(|_| PostError::Invalid)?;
    if num > MAX_SGE || (num > 0 && wr.sg_list.is_null()) {
        return Err(PostError::Invalid);
    }
    match wr.opcode {
        op::SEND => {}
        // SAFETY: a SEND_WITH_IMM carries its immediate in this view of the union.
        op::SEND_WITH_IMM => w.imm_data = unsafe { wr.ex.imm_data },
        // SAFETY: a SEND_WITH_INV carries the rkey to invalidate in this view of the union.
        op::SEND_WITH_INV => w.imm_data = unsafe { wr.ex.invalidate_rkey },
        op::RDMA_WRITE | op::RDMA_WRITE_WITH_IMM | op::RDMA_READ => {
            // SAFETY: per the contract an RDMA opcode starts an `ib_rdma_wr` (`wr` first).
            let rdma = unsafe { &*ptr::from_ref(wr).cast::<ib_rdma_wr>() };
            w.remote_addr = rdma.remote_addr;
            w.rkey = rdma.rkey;
            if wr.opcode == op::RDMA_WRITE_WITH_IMM {
                // SAFETY: as above, the immediate's view of the union.
                w.imm_data = unsafe { wr.ex.imm_data };
            }
        }
        op::ATOMIC_CMP_AND_SWP | op::ATOMIC_FETCH_AND_ADD => {
            // SAFETY: per the contract an atomic opcode starts an `ib_atomic_wr`.
            let at = unsafe { &*ptr::from_ref(wr).cast::<ib_atomic_wr>() };
            w.remote_addr = at.remote_addr;
            w.rkey = at.rkey;
            w.compare_add = at.compare_add;
            w.swap = at.swap;
        }
        op::LOCAL_INV => {
            // SAFETY: a LOCAL_INV names its key in the union.
            w.imm_data = unsafe { wr.ex.invalidate_rkey };
        }
        op::REG_MR => {
            // SAFETY: per the contract IB_WR_REG_MR starts an `ib_reg_wr`.
            let reg = unsafe { &*ptr::from_ref(wr).cast::<ib_reg_wr>() };
            if reg.mr.is_null() || num != 0 {
                return Err(PostError::Invalid);
            }
            // SAFETY: a live MR of ours (the consumer registers it on our QP).
            let (lkey, iova, length) =
                unsafe { ((*reg.mr).lkey, (*reg.mr).iova, (*reg.mr).length) };
            // The key keeps the MR's index (`ib_update_fast_reg_key` changes its low byte);
            // the data path finds the MR by it and checks its PD against the QP's.
            if reg.key >> 8 != lkey >> 8 {
                return Err(PostError::Invalid);
            }
            w.rkey = reg.key;
            w.imm_data = reg.access as u32;
            // The region as the MR names it now: the consumer may have renumbered it since it
            // mapped it (xprtrdma puts the XID in the iova).
            w.remote_addr = iova;
            w.compare_add = length;
            w.send_flags &= !(ib_send_flags_IB_SEND_INLINE as u32);
            return Ok(w);
        }
        _ => return Err(PostError::Invalid),
    }
    if flags & ib_send_flags_IB_SEND_INLINE as u32 != 0 && num > 0 {
        // The data, gathered into the WQE now.
        let mut at = 0usize;
        for i in 0..num {
            // SAFETY: per the contract the request's `sg_list` has `num_sge` entries.
            let sge = unsafe { &*wr.sg_list.add(i) };
            let len = sge.length as usize;
            let dst = w.data.get_mut(at..at + len).ok_or(PostError::Invalid)?;
            if sge.lkey != KERNEL_LKEY {
                return Err(PostError::Invalid);
            }
            // SAFETY: per the contract, the consumer's buffer until the post returns.
            unsafe { KernelBuf::new(sge.addr, sge.length) }.read(dst);
            at += len;
        }
        w.inline_len = at as u32;
        return Ok(w);
    }
    w.send_flags &= !(ib_send_flags_IB_SEND_INLINE as u32);
    w.num_sge = num as u32;
    for i in 0..num {
        // SAFETY: per the contract the request's `sg_list` has `num_sge` entries.
        let sge = unsafe { &*wr.sg_list.add(i) };
        w.set_sge(
            i,
            Sge {
                addr: sge.addr,
                length: sge.length,
                lkey: sge.lkey,
            },
        );
    }
    Ok(w)
}

impl<W: KernelWr> WrChain<'_, W> {
    /// # Safety
    ///
    /// `first` must start a live chain of requests that [`KernelWr::decode`] may take, for
    /// the chain's life.
    pub(super) unsafe fn new(first: *const W) -> Self {
        WrChain {
            next: first,
            current: first,
            _chain: PhantomData,
        }
    }

    /// The request last taken (the first before any): the consumer's `bad_wr` on an error.
    pub(super) fn current(&self) -> *const W {
        self.current
    }
}

impl<W: KernelWr> Iterator for WrChain<'_, W> {
    type Item = core::result::Result<W::Decoded, PostError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next.is_null() {
            return None;
        }
        self.current = self.next;
        // SAFETY: a live request of the chain (type invariant).
        let wr = unsafe { &*self.next };
        self.next = wr.next();
        // SAFETY: as above, one `decode` may take.
        Some(unsafe { wr.decode() })
    }
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
