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
    verbs::KernelWc,
};
use core::{marker::PhantomData, mem::offset_of, mem::size_of, ptr};
use kernel::{ffi::c_int, prelude::*};

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
