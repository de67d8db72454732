// SPDX-License-Identifier: GPL-2.0

//! The verbs ops as a driver implements them: [`VerbsOps`], a `#[vtable]` trait over typed
//! handles, and the `extern "C"` trampolines (generic over it) that the RDMA core calls.
//!
//! A trampoline turns the core's pointers into what the trait takes: the device's parts
//! ([`DeviceCtx`]), the call's driver data ([`Udata`]), the objects the driver stored in the
//! core's allocations (an `ib_cq`, `ib_srq`, `ib_qp` is followed by the driver's object; an
//! `ib_mr` we allocate ourselves), plain copies of the attributes, and the kernel consumers'
//! work request chains as iterators of decoded requests. It writes back what the core wants
//! (sizes, numbers, keys). The driver's side is safe code (`crate::ops`).
//!
//! Ops that hold no driver state stay here and in `ibdev`/`kverbs` (the device's and ports'
//! attributes, PDs, user contexts, address handles).

use super::{
    bindings,
    events::{AsyncEvents, CqNotifier, QpEvents, SrqEvents},
    ibdev::{ctx, DeviceCtx},
    kmem::KernelMemory,
    kverbs::{self, KernelRcRecvs, KernelRcSends, KernelRecvs, KernelSends},
    to_errno,
    udata::Udata,
    umem::UserMemory,
};
use crate::verbs::KernelWc;
use crate::verbs_core::{
    caps::Caps,
    ib::{QpState, QpType},
    qp::{ModifyAttr, QpAttrs},
};
use core::{
    marker::PhantomData,
    mem::{offset_of, size_of},
    ptr::{self, NonNull},
};
use kernel::{
    error::VTABLE_DEFAULT_ERROR,
    ffi::{c_int, c_uint},
    prelude::*,
    sync::Arc,
};

/// An SRQ's attributes: what a create or modify asks for, and what it gets.
pub(crate) struct SrqAttr {
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    pub(crate) srq_limit: u32,
}

/// A QP create's attributes (`ib_qp_init_attr`), with the CQs and SRQ resolved to the
/// driver's objects.
pub(crate) struct QpInit<'a, T: VerbsOps + ?Sized> {
    /// `enum ib_qp_type`.
    pub(crate) qp_type: u32,
    pub(crate) create_flags: u32,
    pub(crate) send_cq: Option<&'a T::Cq>,
    pub(crate) recv_cq: Option<&'a T::Cq>,
    pub(crate) srq: Option<&'a T::Srq>,
    pub(crate) caps: Caps,
    /// `IB_SIGNAL_ALL_WR`.
    pub(crate) sig_all: bool,
    /// The port of a GSI QP.
    pub(crate) port: u32,
    /// The PD (its identity: an MR and a QP match when they name the same one).
    pub(crate) pd: usize,
    /// The core's `ib_qp` (its identity), which kernel work completions name.
    pub(crate) handle: usize,
    /// A kernel consumer's QP (no `udata`): the capability to touch the memory its work
    /// requests name.
    pub(crate) kernel: Option<KernelMemory>,
}

/// A created QP: the object, its number and the capacities it got.
pub(crate) struct QpMade<Q> {
    pub(crate) qp: Q,
    pub(crate) qpn: u32,
    pub(crate) caps: Caps,
}

/// What `query_qp` reports.
pub(crate) enum QpQuery {
    /// A connected QP: its attributes as modified.
    Connected {
        state: QpState,
        qp_type: QpType,
        attrs: QpAttrs,
        caps: Caps,
        sig_all: bool,
    },
    /// The GSI QP of a port.
    Gsi {
        state: QpState,
        qkey: u32,
        sq_psn: u32,
        pkey_index: u16,
        port: u32,
        caps: Caps,
    },
}

/// The user memory an `ibv_reg_mr` names, pinned only when the driver asks.
pub(crate) struct MrRequest<'call> {
    ibdev: NonNull<bindings::ib_device>,
    pub(crate) start: u64,
    pub(crate) length: u64,
    pub(crate) iova: u64,
    /// `IB_ACCESS_*`.
    pub(crate) access: u32,
    _call: PhantomData<&'call ()>,
}

impl<'call> MrRequest<'call> {
    /// The device context and the request of a `reg_user_mr` or `rereg_user_mr` call on
    /// `ibdev` (None for a device that is not set).
    ///
    /// # Safety
    ///
    /// `ibdev` is null or a live device of ours, and the call is that of the process whose
    /// memory `start`, `length` name; the results are used only during the call.
    unsafe fn of_call(
        ibdev: *mut bindings::ib_device,
        start: u64,
        length: u64,
        iova: u64,
        access: c_int,
    ) -> Option<(DeviceCtx<'call>, Self)> {
        let raw = NonNull::new(ibdev)?;
        // SAFETY: per the contract, `ibdev` is live and ours.
        let dev = unsafe { ctx(ibdev) };
        let req = MrRequest {
            ibdev: raw,
            start,
            length,
            iova,
            access: access as u32,
            _call: PhantomData,
        };
        Some((dev, req))
    }

    /// Pins the memory of the calling process (`ib_umem_get`) for the rights `access`
    /// (writable when they allow a write).
    pub(crate) fn pin(&self, access: u32) -> Result<UserMemory> {
        // SAFETY: the device is live for the call (type invariant), and a request exists only
        // during the `reg_user_mr` or `rereg_user_mr` of the process that owns the memory.
        unsafe { UserMemory::pin(self.ibdev.as_ptr(), self.start, self.length, access as i32) }
    }
}

/// The verbs objects' ops. Methods with a default are optional: the ops table names a
/// trampoline only for those the driver implements (`HAS_*`).
///
/// Objects: a create returns the object, which the core's allocation then holds until the
/// destroy, which hands it back. The core calls nothing on an object after its destroy and
/// destroys nothing while another object uses it (a CQ or SRQ with QPs).
#[vtable]
pub(crate) trait VerbsOps: 'static {
    /// What an `ib_cq` carries.
    type Cq: Send + Sync;
    /// What an `ib_srq` carries.
    type Srq: Send + Sync;
    /// What an `ib_qp` carries.
    type Qp: Send + Sync;
    /// What an `ib_mr` carries.
    type Mr: Send + Sync;
    /// What an `ib_mw` carries.
    type Mw: Send + Sync;

    /// `create_cq` of `cqe` entries (a user's when `udata` is given, else a kernel consumer's):
    /// the CQ and the entries it has. `notifier` raises its events.
    fn create_cq(
        dev: &DeviceCtx<'_>,
        cqe: u32,
        flags: u32,
        udata: Option<&Udata<'_>>,
        notifier: CqNotifier,
    ) -> Result<(Self::Cq, u32)>;

    fn destroy_cq(dev: &DeviceCtx<'_>, cq: Self::Cq);

    /// `ibv_resize_cq` of a user CQ to at least `cqe` entries: the entries it has now (what
    /// the core reports as `cqe`).
    fn resize_user_cq(
        _dev: &DeviceCtx<'_>,
        _cq: &Self::Cq,
        _cqe: u32,
        _udata: &Udata<'_>,
    ) -> Result<u32> {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// Arms the CQ; returns whether completions are waiting (asked with `report_missed`).
    fn req_notify_cq(cq: &Self::Cq, solicited: bool, report_missed: bool) -> bool;

    /// A kernel consumer's `poll_cq`: hands at most `max` completions to `each` (with their
    /// index), returns how many.
    fn poll_cq(_cq: &Self::Cq, _max: usize, _each: &mut dyn FnMut(usize, &KernelWc)) -> usize {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// `create_srq`: the SRQ and the attributes it got. `events` raises its asynchronous
    /// events until its destroy begins.
    fn create_srq(
        _dev: &DeviceCtx<'_>,
        _srq_type: u32,
        _attr: &SrqAttr,
        _udata: Option<&Udata<'_>>,
        _events: Arc<SrqEvents>,
    ) -> Result<(Self::Srq, SrqAttr)> {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// `modify_srq` of the attributes named: the size (`resize`) or the limit; `udata` is the
    /// user's command (None for a kernel consumer).
    fn modify_srq(
        _srq: &Self::Srq,
        _attr: &SrqAttr,
        _resize: bool,
        _limit: bool,
        _udata: Option<&Udata<'_>>,
    ) -> Result {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    fn query_srq(_srq: &Self::Srq) -> SrqAttr {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    fn destroy_srq(_dev: &DeviceCtx<'_>, _srq: Self::Srq) {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// `reg_user_mr` in the PD `pd`: the MR and its key (lkey and rkey).
    fn reg_user_mr(dev: &DeviceCtx<'_>, pd: usize, req: &MrRequest<'_>) -> Result<(Self::Mr, u32)>;

    /// `rereg_user_mr` of `mr` (the object the `ib_mr` carries) with `IB_MR_REREG_*` `flags`:
    /// the new PD `pd`, and in `req` the new rights and translation (to pin when asked).
    /// Returns the object the `ib_mr` carries from then on; its keys stay.
    fn rereg_user_mr(
        _dev: &DeviceCtx<'_>,
        _mr: &Self::Mr,
        _flags: u32,
        _pd: usize,
        _req: &MrRequest<'_>,
    ) -> Result<Self::Mr> {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// A kernel PD's DMA MR: its object (if any) and lkey.
    fn get_dma_mr(_dev: &DeviceCtx<'_>, _access: u32) -> Result<(Option<Self::Mr>, u32)> {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// Whether the MR with `key` may be deregistered now: `EBUSY` while a memory window is
    /// bound to it (the MR then stays, as the verbs say).
    fn mr_in_use(_dev: &DeviceCtx<'_>, _key: u32) -> Result {
        Ok(())
    }

    /// `dereg_mr` of the MR with `key` (its object, None for a DMA MR).
    fn dereg_mr(dev: &DeviceCtx<'_>, mr: Option<Self::Mr>, key: u32);

    /// `ibv_alloc_mw` of type `kind` (`IB_MW_TYPE_1` or `_2`: the core refuses others) in
    /// the PD `pd`: the window and its rkey.
    fn alloc_mw(_dev: &DeviceCtx<'_>, _pd: usize, _kind: u32) -> Result<(Self::Mw, u32)> {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// `ibv_dealloc_mw`: the window goes, unbound.
    fn dealloc_mw(_dev: &DeviceCtx<'_>, _mw: Self::Mw) {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// `create_qp` (a user's when `udata` is given, else a kernel consumer's). `events`
    /// raises the QP's asynchronous events until its destroy begins.
    fn create_qp(
        dev: &DeviceCtx<'_>,
        init: &QpInit<'_, Self>,
        udata: Option<&Udata<'_>>,
        events: Arc<QpEvents>,
    ) -> Result<QpMade<Self::Qp>>;

    fn modify_qp(
        dev: &DeviceCtx<'_>,
        qp: &Self::Qp,
        attr: &ModifyAttr,
        mask: u32,
        udata: Option<&Udata<'_>>,
    ) -> Result;

    fn query_qp(qp: &Self::Qp) -> Result<QpQuery>;

    fn destroy_qp(dev: &DeviceCtx<'_>, qp: Self::Qp);

    /// `ibv_attach_mcast` of `qp` to the multicast group `gid` (uverbs has checked that the
    /// QP is UD). Called without RTNL.
    fn attach_mcast(_dev: &DeviceCtx<'_>, _qp: &Self::Qp, _gid: &[u8; 16]) -> Result {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// `ibv_detach_mcast`, as [`Self::attach_mcast`].
    fn detach_mcast(_dev: &DeviceCtx<'_>, _qp: &Self::Qp, _gid: &[u8; 16]) -> Result {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// A user QP's doorbell (an empty `POST_SEND`: its WQEs are in its ring).
    fn doorbell(dev: &DeviceCtx<'_>, qp: &Self::Qp) -> Result;

    /// A kernel consumer's send work requests; on an error the one last taken from `wrs`
    /// is the consumer's `bad_wr`.
    fn post_send_kernel(
        _dev: &DeviceCtx<'_>,
        _qp: &Self::Qp,
        _wrs: &mut KernelSends<'_>,
    ) -> Result {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// A kernel consumer's receive work requests, as [`Self::post_send_kernel`].
    fn post_recv_kernel(
        _dev: &DeviceCtx<'_>,
        _qp: &Self::Qp,
        _wrs: &mut KernelRecvs<'_>,
    ) -> Result {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// A kernel consumer's send work requests on an RC QP, as the WQEs of its ring.
    fn post_send_kernel_rc(
        _dev: &DeviceCtx<'_>,
        _qp: &Self::Qp,
        _wrs: &mut KernelRcSends<'_>,
    ) -> Result {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// A kernel consumer's receive work requests on an RC QP, as the WQEs of its ring.
    fn post_recv_kernel_rc(
        _dev: &DeviceCtx<'_>,
        _qp: &Self::Qp,
        _wrs: &mut KernelRcRecvs<'_>,
    ) -> Result {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// `ib_alloc_mr` of a fast registration MR (`IB_MR_TYPE_MEM_REG`) for `max_pages` pages
    /// in the PD `pd`: the MR and its key. `mem` lets it touch the pages it will map.
    fn alloc_mr(
        _dev: &DeviceCtx<'_>,
        _pd: usize,
        _max_pages: u32,
        _mem: KernelMemory,
    ) -> Result<(Self::Mr, u32)> {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// `ib_map_mr_sg` begins on `mr`: its staged page list is emptied.
    fn map_begin(_mr: &Self::Mr) {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// One page (its kernel address) of the list `ib_map_mr_sg` stages; ENOMEM when full.
    fn map_page(_mr: &Self::Mr, _addr: u64) -> Result {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// `ib_map_mr_sg` ends: the region it computed.
    fn map_end(_mr: &Self::Mr, _iova: u64, _length: u64, _page_size: u32) {
        build_error!(VTABLE_DEFAULT_ERROR)
    }
}

// ---- the core's allocations ----

#[repr(C)]
struct MetaCq<T: VerbsOps> {
    ibcq: bindings::ib_cq,
    cq: Option<T::Cq>,
}

#[repr(C)]
struct MetaSrq<T: VerbsOps> {
    ibsrq: bindings::ib_srq,
    srq: Evented<bindings::ib_srq, T::Srq>,
}

#[repr(C)]
struct MetaQp<T: VerbsOps> {
    ibqp: bindings::ib_qp,
    qp: Evented<bindings::ib_qp, T::Qp>,
}

/// A driver object and the events it raises on the core's object `E` (an `ib_qp`, `ib_srq`),
/// in the core's allocation.
struct Evented<E, O> {
    /// Kept from create to the start of destroy, which detaches it before the core frees its
    /// object (see `events::AsyncEvents`).
    events: Option<Arc<AsyncEvents<E>>>,
    object: Option<O>,
}

impl<E, O> Evented<E, O> {
    const EMPTY: Self = Evented {
        events: None,
        object: None,
    };

    fn get(&self) -> Option<&O> {
        self.object.as_ref()
    }

    /// Makes the object with `make`, which gets the events of `raw`, and stores it in `slot`;
    /// returns what else `make` returned. On failure the events are detached, whatever the
    /// driver did with them.
    ///
    /// # Safety
    ///
    /// `raw` must be the core's object being created, with `device`, `event_handler` and its
    /// context set (as the core does before the driver's create), and `slot` its `Evented` in
    /// the core's allocation of our size, empty, not yet seen by anyone else.
    unsafe fn create<R>(
        slot: *mut Self,
        raw: NonNull<E>,
        make: impl FnOnce(Arc<AsyncEvents<E>>) -> Result<(O, R)>,
    ) -> Result<R> {
        // SAFETY: per the contract; the events are detached below on failure and by `take` at
        // the start of destroy otherwise, both before the core frees the object.
        let events = Arc::pin_init(unsafe { AsyncEvents::new(raw) }, GFP_KERNEL)?;
        match make(events.clone()) {
            Ok((object, r)) => {
                let e = Evented {
                    events: Some(events),
                    object: Some(object),
                };
                // SAFETY: per the contract (an empty slot: nothing to drop).
                unsafe { slot.write(e) };
                Ok(r)
            }
            Err(err) => {
                events.detach();
                Err(err)
            }
        }
    }

    /// Takes the object out for its destroy, its events detached first: none is raised on
    /// the core's object once this returns.
    fn take(&mut self) -> Option<O> {
        if let Some(events) = self.events.take() {
            events.detach();
        }
        self.object.take()
    }
}

/// MRs we allocate (`reg_user_mr` returns an `ib_mr`).
#[repr(C)]
struct MetaMr<T: VerbsOps> {
    ibmr: bindings::ib_mr,
    mr: Option<T::Mr>,
}

/// Memory windows: the core allocates them (`size_ib_mw`, zeroed) and frees them after
/// `dealloc_mw`.
#[repr(C)]
struct MetaMw<T: VerbsOps> {
    ibmw: bindings::ib_mw,
    mw: Option<T::Mw>,
}

/// The object behind a core object, if the driver's create succeeded.
///
/// Every create trampoline writes its slot empty before anything else (the core's allocation
/// is zeroed, and zero bytes need not be a valid `Option` of the driver's type), so a slot is
/// valid from then on, also after a failed create.
///
/// # Safety
///
/// `raw` must be null or a live object of our device whose allocation is a `Meta` of `T`
/// (every object of its kind on our device is) and whose create began, and the result must
/// not outlive it.
unsafe fn slot<'a, M: 'a, O: 'a>(
    raw: *mut M,
    get: impl FnOnce(&'a M) -> Option<&'a O>,
) -> Option<&'a O> {
    if raw.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    get(unsafe { &*raw })
}

fn err_ptr<T>(e: Error) -> *mut T {
    e.to_errno() as isize as *mut T
}

/// Fills the object ops of `ops` with `T`'s trampolines.
pub(super) fn fill<T: VerbsOps + 'static>(ops: &mut bindings::ib_device_ops) {
    ops.create_cq = Some(create_cq::<T>);
    ops.destroy_cq = Some(destroy_cq::<T>);
    ops.req_notify_cq = Some(req_notify_cq::<T>);
    ops.size_ib_cq = size_of::<MetaCq<T>>();
    if T::HAS_RESIZE_USER_CQ {
        ops.resize_user_cq = Some(resize_user_cq::<T>);
    }
    if T::HAS_POLL_CQ {
        ops.poll_cq = Some(poll_cq::<T>);
    }
    if T::HAS_CREATE_SRQ {
        ops.create_srq = Some(create_srq::<T>);
        ops.modify_srq = Some(modify_srq::<T>);
        ops.query_srq = Some(query_srq::<T>);
        ops.destroy_srq = Some(destroy_srq::<T>);
        ops.size_ib_srq = size_of::<MetaSrq<T>>();
    }
    ops.reg_user_mr = Some(reg_user_mr::<T>);
    ops.dereg_mr = Some(dereg_mr::<T>);
    if T::HAS_REREG_USER_MR {
        ops.rereg_user_mr = Some(rereg_user_mr::<T>);
    }
    if T::HAS_GET_DMA_MR {
        ops.get_dma_mr = Some(get_dma_mr::<T>);
    }
    if T::HAS_ALLOC_MR {
        ops.alloc_mr = Some(alloc_mr::<T>);
        ops.map_mr_sg = Some(map_mr_sg::<T>);
    }
    if T::HAS_ALLOC_MW {
        ops.alloc_mw = Some(alloc_mw::<T>);
        ops.dealloc_mw = Some(dealloc_mw::<T>);
        ops.size_ib_mw = size_of::<MetaMw<T>>();
    }
    if T::HAS_ATTACH_MCAST {
        ops.attach_mcast = Some(attach_mcast::<T>);
        ops.detach_mcast = Some(detach_mcast::<T>);
    }
    ops.create_qp = Some(create_qp::<T>);
    ops.modify_qp = Some(modify_qp::<T>);
    ops.query_qp = Some(query_qp::<T>);
    ops.destroy_qp = Some(destroy_qp::<T>);
    ops.post_send = Some(post_send::<T>);
    if T::HAS_POST_RECV_KERNEL {
        ops.post_recv = Some(post_recv::<T>);
    }
    ops.size_ib_qp = size_of::<MetaQp<T>>();
}

// ---- CQ ----

/// # Safety
///
/// Called only by the RDMA core with a CQ it allocated (`size_ib_cq`, zeroed).
unsafe extern "C" fn create_cq<T: VerbsOps>(
    ibcq: *mut bindings::ib_cq,
    attr: *const bindings::ib_cq_init_attr,
    attrs: *mut bindings::uverbs_attr_bundle,
) -> c_int {
    const { assert!(offset_of!(MetaCq<T>, ibcq) == 0) };
    // SAFETY: the core's allocation of our size, being created (see `slot`).
    unsafe { ptr::addr_of_mut!((*ibcq.cast::<MetaCq<T>>()).cq).write(None) };
    // SAFETY: per the contract; `attr` is the core's, `attrs` null for kernel consumers or the
    // live bundle of this uverbs call, whose driver udata lives as long.
    let (dev, attr, udata) = unsafe {
        let udata = if attrs.is_null() {
            None
        } else {
            let b = &mut (*attrs).__bindgen_anon_1.__bindgen_anon_1;
            match Udata::from_raw(ptr::addr_of_mut!(b.driver_udata)) {
                Some(u) => Some(u),
                None => return EINVAL.to_errno(),
            }
        };
        (ctx((*ibcq).device), &*attr, udata)
    };
    let Some(raw) = NonNull::new(ibcq) else {
        return EINVAL.to_errno();
    };
    match T::create_cq(&dev, attr.cqe, attr.flags, udata.as_ref(), CqNotifier(raw)) {
        Ok((cq, entries)) => {
            // SAFETY: the core's allocation of our size, its slot empty (written above), not yet
            // seen by anyone else.
            unsafe {
                (*ibcq).cqe = entries as c_int;
                ptr::addr_of_mut!((*ibcq.cast::<MetaCq<T>>()).cq).write(Some(cq));
            }
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// # Safety
///
/// Called only by the RDMA core (`ib_uverbs_resize_cq`) for a live user CQ of ours, with the
/// driver udata of that uverbs call.
unsafe extern "C" fn resize_user_cq<T: VerbsOps>(
    ibcq: *mut bindings::ib_cq,
    cqe: c_uint,
    udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract.
    let (dev, cq, udata) = unsafe {
        (
            ctx((*ibcq).device),
            cq_of::<T>(ibcq),
            Udata::from_raw(udata),
        )
    };
    let (Some(cq), Some(udata)) = (cq, udata) else {
        return EINVAL.to_errno();
    };
    match T::resize_user_cq(&dev, cq, cqe, &udata) {
        Ok(entries) => {
            // SAFETY: per the contract; the core reads `cqe` back for its response, and holds
            // the CQ's uobject for the call, as for every other method on it.
            unsafe { (*ibcq).cqe = entries as c_int };
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// # Safety
///
/// Called only by the RDMA core for a CQ we created, with no QP using it any more.
unsafe extern "C" fn destroy_cq<T: VerbsOps>(
    ibcq: *mut bindings::ib_cq,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract; the core frees the `ib_cq` after we return.
    let (dev, cq) = unsafe { (ctx((*ibcq).device), (*ibcq.cast::<MetaCq<T>>()).cq.take()) };
    if let Some(cq) = cq {
        T::destroy_cq(&dev, cq);
    }
    0
}

/// The driver's CQ behind an `ib_cq`.
///
/// # Safety
///
/// `ibcq` must be null or a live CQ of our device, for `'a`.
unsafe fn cq_of<'a, T: VerbsOps>(ibcq: *mut bindings::ib_cq) -> Option<&'a T::Cq> {
    // SAFETY: per the contract.
    unsafe { slot(ibcq.cast::<MetaCq<T>>(), |m: &'a MetaCq<T>| m.cq.as_ref()) }
}

/// # Safety
///
/// Called only by the RDMA core for a CQ we created.
unsafe extern "C" fn req_notify_cq<T: VerbsOps>(
    ibcq: *mut bindings::ib_cq,
    flags: bindings::ib_cq_notify_flags,
) -> c_int {
    // SAFETY: per the contract.
    let Some(cq) = (unsafe { cq_of::<T>(ibcq) }) else {
        return 0;
    };
    let solicited = flags & bindings::ib_cq_notify_flags_IB_CQ_SOLICITED_MASK
        == bindings::ib_cq_notify_flags_IB_CQ_SOLICITED;
    let report = flags & bindings::ib_cq_notify_flags_IB_CQ_REPORT_MISSED_EVENTS != 0;
    c_int::from(T::req_notify_cq(cq, solicited, report))
}

/// # Safety
///
/// Called only by the RDMA core for a CQ we created, with room for `num` completions at `wc`.
unsafe extern "C" fn poll_cq<T: VerbsOps>(
    ibcq: *mut bindings::ib_cq,
    num: c_int,
    wc: *mut bindings::ib_wc,
) -> c_int {
    // SAFETY: per the contract.
    let Some(cq) = (unsafe { cq_of::<T>(ibcq) }) else {
        return EINVAL.to_errno();
    };
    let max = usize::try_from(num).unwrap_or(0);
    let n = T::poll_cq(cq, max, &mut |i, k| {
        if i < max {
            // SAFETY: `i < max = num`, and the core gave us `num` entries.
            kverbs::fill_wc(unsafe { &mut *wc.add(i) }, k);
        }
    });
    n.min(max) as c_int
}

// ---- SRQ ----

/// # Safety
///
/// Called only by the RDMA core with an SRQ it allocated (`size_ib_srq`, zeroed).
unsafe extern "C" fn create_srq<T: VerbsOps>(
    ibsrq: *mut bindings::ib_srq,
    init: *mut bindings::ib_srq_init_attr,
    udata: *mut bindings::ib_udata,
) -> c_int {
    const { assert!(offset_of!(MetaSrq<T>, ibsrq) == 0) };
    // SAFETY: the core's allocation of our size, being created (see `slot`).
    unsafe { ptr::addr_of_mut!((*ibsrq.cast::<MetaSrq<T>>()).srq).write(Evented::EMPTY) };
    // SAFETY: per the contract; `udata` is this call's (or null).
    let (dev, init, udata) = unsafe { (ctx((*ibsrq).device), &mut *init, Udata::from_raw(udata)) };
    let Some(raw) = NonNull::new(ibsrq) else {
        return EINVAL.to_errno();
    };
    let attr = SrqAttr {
        max_wr: init.attr.max_wr,
        max_sge: init.attr.max_sge,
        srq_limit: init.attr.srq_limit,
    };
    // SAFETY: the core's `ib_srq` being created, with `device`, `event_handler` and
    // `srq_context` set (`ib_create_srq_user`), in its zeroed allocation of our size.
    let made = unsafe {
        Evented::create(
            ptr::addr_of_mut!((*ibsrq.cast::<MetaSrq<T>>()).srq),
            raw,
            |events: Arc<SrqEvents>| {
                T::create_srq(&dev, init.srq_type, &attr, udata.as_ref(), events)
            },
        )
    };
    match made {
        Ok(got) => {
            init.attr.max_wr = got.max_wr;
            init.attr.max_sge = got.max_sge;
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// # Safety
///
/// `ibsrq` must be null or a live SRQ of our device, for `'a`.
unsafe fn srq_of<'a, T: VerbsOps>(ibsrq: *mut bindings::ib_srq) -> Option<&'a T::Srq> {
    // SAFETY: per the contract.
    unsafe { slot(ibsrq.cast::<MetaSrq<T>>(), |m: &'a MetaSrq<T>| m.srq.get()) }
}

/// # Safety
///
/// Called only by the RDMA core for an SRQ we created.
unsafe extern "C" fn modify_srq<T: VerbsOps>(
    ibsrq: *mut bindings::ib_srq,
    attr: *mut bindings::ib_srq_attr,
    mask: bindings::ib_srq_attr_mask,
    udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract; a non-null udata is the uverbs call's, live for it.
    let (srq, attr, udata) = unsafe { (srq_of::<T>(ibsrq), &*attr, Udata::from_raw(udata)) };
    let Some(srq) = srq else {
        return EINVAL.to_errno();
    };
    let a = SrqAttr {
        max_wr: attr.max_wr,
        max_sge: attr.max_sge,
        srq_limit: attr.srq_limit,
    };
    let resize = mask & bindings::ib_srq_attr_mask_IB_SRQ_MAX_WR != 0;
    let limit = mask & bindings::ib_srq_attr_mask_IB_SRQ_LIMIT != 0;
    to_errno(T::modify_srq(srq, &a, resize, limit, udata.as_ref()))
}

/// # Safety
///
/// Called only by the RDMA core for an SRQ we created.
unsafe extern "C" fn query_srq<T: VerbsOps>(
    ibsrq: *mut bindings::ib_srq,
    attr: *mut bindings::ib_srq_attr,
) -> c_int {
    // SAFETY: per the contract.
    let (srq, attr) = unsafe { (srq_of::<T>(ibsrq), &mut *attr) };
    let Some(srq) = srq else {
        return EINVAL.to_errno();
    };
    let a = T::query_srq(srq);
    attr.max_wr = a.max_wr;
    attr.max_sge = a.max_sge;
    attr.srq_limit = a.srq_limit;
    0
}

/// # Safety
///
/// Called only by the RDMA core for an SRQ we created, with no QP using it any more.
unsafe extern "C" fn destroy_srq<T: VerbsOps>(
    ibsrq: *mut bindings::ib_srq,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract; the core frees the `ib_srq` after we return.
    let (dev, srq) = unsafe {
        (
            ctx((*ibsrq).device),
            (*ibsrq.cast::<MetaSrq<T>>()).srq.take(),
        )
    };
    if let Some(srq) = srq {
        T::destroy_srq(&dev, srq);
    }
    0
}

// ---- MR ----

/// # Safety
///
/// Called only by the RDMA core (`ibv_reg_mr`) with a live PD and this call's udata.
unsafe extern "C" fn reg_user_mr<T: VerbsOps>(
    ibpd: *mut bindings::ib_pd,
    start: u64,
    length: u64,
    iova: u64,
    access: c_int,
    _dmah: *mut bindings::ib_dmah,
    _udata: *mut bindings::ib_udata,
) -> *mut bindings::ib_mr {
    const { assert!(offset_of!(MetaMr<T>, ibmr) == 0) };
    // SAFETY: the PD is live with `device` set, ours; this is the owning process's call.
    let Some((dev, req)) =
        (unsafe { MrRequest::of_call((*ibpd).device, start, length, iova, access) })
    else {
        return err_ptr(EINVAL);
    };
    // Allocated first, so that nothing of the driver's is to undo when it fails.
    let meta = KBox::new(
        MetaMr::<T> {
            ibmr: bindings::ib_mr::default(),
            mr: None,
        },
        GFP_KERNEL,
    );
    let mut meta = match meta {
        Ok(m) => m,
        Err(e) => return err_ptr(e.into()),
    };
    match T::reg_user_mr(&dev, ibpd as usize, &req) {
        Ok((mr, key)) => {
            meta.mr = Some(mr);
            meta.ibmr.lkey = key;
            meta.ibmr.rkey = key;
            meta.ibmr.iova = iova;
            meta.ibmr.length = length;
            ptr::addr_of_mut!(KBox::leak(meta).ibmr)
        }
        Err(e) => err_ptr(e),
    }
}

/// # Safety
///
/// Called only by the RDMA core (`ibv_rereg_mr`) for a user MR we registered, which the call
/// holds for writing (no other verb, dereg included, runs on it meanwhile), with a live PD.
unsafe extern "C" fn rereg_user_mr<T: VerbsOps>(
    ibmr: *mut bindings::ib_mr,
    flags: c_int,
    start: u64,
    length: u64,
    virt_addr: u64,
    access: c_int,
    ibpd: *mut bindings::ib_pd,
    _udata: *mut bindings::ib_udata,
) -> *mut bindings::ib_mr {
    // SAFETY: the MR is live with `device` set, ours; this is the owning process's call.
    let Some((dev, req)) =
        (unsafe { MrRequest::of_call((*ibmr).device, start, length, virt_addr, access) })
    else {
        return err_ptr(EINVAL);
    };
    // SAFETY: every MR we hand out is a leaked `KBox<MetaMr<T>>` (`ibmr` at offset 0); the
    // call holds it for writing, so this is the only reference for its duration.
    let meta = unsafe { &mut *ibmr.cast::<MetaMr<T>>() };
    let Some(old) = meta.mr.as_ref() else {
        // A DMA MR: not the user's to rereg.
        return err_ptr(EINVAL);
    };
    match T::rereg_user_mr(&dev, old, flags as u32, ibpd as usize, &req) {
        Ok(mr) => {
            // The object carried until now goes here, in process context (its pages may be
            // released, which sleeps). NULL: the same `ib_mr`, changed in place; the core
            // records the new PD, iova and length itself.
            drop(meta.mr.replace(mr));
            ptr::null_mut()
        }
        Err(e) => err_ptr(e),
    }
}

/// # Safety
///
/// Called only by the RDMA core with a live kernel PD.
unsafe extern "C" fn get_dma_mr<T: VerbsOps>(
    ibpd: *mut bindings::ib_pd,
    access: c_int,
) -> *mut bindings::ib_mr {
    // SAFETY: the PD is live with `device` set.
    let dev = unsafe { ctx((*ibpd).device) };
    let meta = KBox::new(
        MetaMr::<T> {
            ibmr: bindings::ib_mr::default(),
            mr: None,
        },
        GFP_KERNEL,
    );
    let mut meta = match meta {
        Ok(m) => m,
        Err(e) => return err_ptr(e.into()),
    };
    match T::get_dma_mr(&dev, access as u32) {
        Ok((mr, lkey)) => {
            meta.mr = mr;
            meta.ibmr.lkey = lkey;
            ptr::addr_of_mut!(KBox::leak(meta).ibmr)
        }
        Err(e) => err_ptr(e),
    }
}

/// # Safety
///
/// Called only by the RDMA core (`ib_alloc_mr`) with a live kernel PD.
unsafe extern "C" fn alloc_mr<T: VerbsOps>(
    ibpd: *mut bindings::ib_pd,
    mr_type: bindings::ib_mr_type,
    max_num_sg: u32,
) -> *mut bindings::ib_mr {
    if mr_type != bindings::ib_mr_type_IB_MR_TYPE_MEM_REG {
        return err_ptr(EINVAL);
    }
    // SAFETY: the PD is live with `device` set; `ib_alloc_mr` is a kernel consumer's call.
    let (dev, user) = unsafe { (ctx((*ibpd).device), !(*ibpd).uobject.is_null()) };
    if user {
        return err_ptr(EINVAL);
    }
    let meta = KBox::new(
        MetaMr::<T> {
            ibmr: bindings::ib_mr::default(),
            mr: None,
        },
        GFP_KERNEL,
    );
    let mut meta = match meta {
        Ok(m) => m,
        Err(e) => return err_ptr(e.into()),
    };
    match T::alloc_mr(&dev, ibpd as usize, max_num_sg, KernelMemory::new()) {
        Ok((mr, key)) => {
            meta.mr = Some(mr);
            meta.ibmr.lkey = key;
            meta.ibmr.rkey = key;
            ptr::addr_of_mut!(KBox::leak(meta).ibmr)
        }
        Err(e) => err_ptr(e),
    }
}

/// `ib_sg_to_pages`' callback: one page of the list being mapped.
///
/// # Safety
///
/// Called by `ib_sg_to_pages` from [`map_mr_sg`] with that call's MR.
unsafe extern "C" fn set_page<T: VerbsOps>(ibmr: *mut bindings::ib_mr, addr: u64) -> c_int {
    // SAFETY: per the contract, an MR we allocated (`MetaMr<T>`), held by the mapping call.
    let meta = unsafe { &*ibmr.cast::<MetaMr<T>>() };
    match meta.mr.as_ref() {
        Some(mr) => to_errno(T::map_page(mr, addr)),
        None => EINVAL.to_errno(),
    }
}

/// # Safety
///
/// Called only by the RDMA core (`ib_map_mr_sg`) for an MR of ours from `alloc_mr`, with a
/// live scatterlist of `sg_nents` entries DMA-mapped for our device, and `mr->page_size` set.
unsafe extern "C" fn map_mr_sg<T: VerbsOps>(
    ibmr: *mut bindings::ib_mr,
    sg: *mut bindings::scatterlist,
    sg_nents: c_int,
    sg_offset: *mut u32,
) -> c_int {
    // SAFETY: per the contract, an MR we allocated; the consumer does not free it meanwhile.
    let meta = unsafe { &*ibmr.cast::<MetaMr<T>>() };
    let Some(mr) = meta.mr.as_ref() else {
        return EINVAL.to_errno();
    };
    T::map_begin(mr);
    // SAFETY: per the contract; `set_page` takes the pages into `mr`, and the core sets the
    // MR's `iova` and `length`. The device does virtual DMA, so the pages' DMA addresses are
    // kernel addresses.
    let n = unsafe { bindings::ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, Some(set_page::<T>)) };
    // SAFETY: as above; the core's fields of the MR, which `ib_sg_to_pages` set.
    let (iova, length, page_size) = unsafe { ((*ibmr).iova, (*ibmr).length, (*ibmr).page_size) };
    T::map_end(mr, iova, length, page_size);
    n
}

/// # Safety
///
/// Called only by the RDMA core for an MR we registered.
unsafe extern "C" fn dereg_mr<T: VerbsOps>(
    ibmr: *mut bindings::ib_mr,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: the core's live MR of our device.
    let (dev, key) = unsafe { (ctx((*ibmr).device), (*ibmr).lkey) };
    // Refused: the MR stays whole, as the core's (it keeps its object on an error).
    if let Err(e) = T::mr_in_use(&dev, key) {
        return e.to_errno();
    }
    // SAFETY: every MR we hand out is a leaked `KBox<MetaMr<T>>`; the core calls this once
    // more only after an error, and we took nothing then.
    let mut meta = unsafe { KBox::from_raw(ibmr.cast::<MetaMr<T>>()) };
    T::dereg_mr(&dev, meta.mr.take(), key);
    0
}

// ---- MW ----

/// # Safety
///
/// Called only by the RDMA core (`ibv_alloc_mw`) with a window it allocated (`size_ib_mw`,
/// zeroed) whose `device`, `pd` and `type` are set, the PD live for the call.
unsafe extern "C" fn alloc_mw<T: VerbsOps>(
    ibmw: *mut bindings::ib_mw,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    const { assert!(offset_of!(MetaMw<T>, ibmw) == 0) };
    let meta = ibmw.cast::<MetaMw<T>>();
    // SAFETY: the core's allocation of our size, being created; zero bytes need not be a
    // valid `Option` of the driver's type, so the slot is written first.
    unsafe { ptr::addr_of_mut!((*meta).mw).write(None) };
    // SAFETY: per the contract.
    let (dev, pd, kind) = unsafe { (ctx((*ibmw).device), (*ibmw).pd as usize, (*ibmw).type_) };
    match T::alloc_mw(&dev, pd, kind) {
        Ok((mw, rkey)) => {
            // SAFETY: as above; the core reads `rkey` for its response.
            unsafe {
                (*ibmw).rkey = rkey;
                (*meta).mw = Some(mw);
            }
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// # Safety
///
/// Called only by the RDMA core for a window we allocated, once; it frees the allocation
/// after.
unsafe extern "C" fn dealloc_mw<T: VerbsOps>(ibmw: *mut bindings::ib_mw) -> c_int {
    // SAFETY: per the contract: our allocation, with its slot written by `alloc_mw`.
    let (dev, mw) = unsafe { (ctx((*ibmw).device), (*ibmw.cast::<MetaMw<T>>()).mw.take()) };
    if let Some(mw) = mw {
        T::dealloc_mw(&dev, mw);
    }
    0
}

// ---- QP ----

/// # Safety
///
/// Called only by the RDMA core with a QP it allocated (`size_ib_qp`, zeroed).
unsafe extern "C" fn create_qp<T: VerbsOps>(
    ibqp: *mut bindings::ib_qp,
    init: *mut bindings::ib_qp_init_attr,
    udata: *mut bindings::ib_udata,
) -> c_int {
    const { assert!(offset_of!(MetaQp<T>, ibqp) == 0) };
    // SAFETY: the core's allocation of our size, being created (see `slot`).
    unsafe { ptr::addr_of_mut!((*ibqp.cast::<MetaQp<T>>()).qp).write(Evented::EMPTY) };
    // SAFETY: per the contract: `ibqp` has `device` and `pd` set, `init` is the core's, and
    // its CQs and SRQ are live objects of ours (the core resolved them), for this call.
    let (dev, init, udata, pd) = unsafe {
        (
            ctx((*ibqp).device),
            &mut *init,
            Udata::from_raw(udata),
            (*ibqp).pd as usize,
        )
    };
    // SAFETY: as above.
    let (send_cq, recv_cq, srq) = unsafe {
        (
            cq_of::<T>(init.send_cq),
            cq_of::<T>(init.recv_cq),
            srq_of::<T>(init.srq),
        )
    };
    if !init.srq.is_null() && srq.is_none() {
        return EINVAL.to_errno();
    }
    let Some(raw) = NonNull::new(ibqp) else {
        return EINVAL.to_errno();
    };
    let qi = QpInit::<T> {
        qp_type: init.qp_type,
        create_flags: init.create_flags,
        send_cq,
        recv_cq,
        srq,
        caps: super::abi::caps_of(&init.cap),
        sig_all: init.sq_sig_type == bindings::ib_sig_type_IB_SIGNAL_ALL_WR,
        port: init.port_num,
        pd,
        handle: ibqp as usize,
        kernel: udata.is_none().then(KernelMemory::new),
    };
    // SAFETY: the core's `ib_qp` being created, with `device`, `event_handler` and
    // `qp_context` set (`create_qp` in the core's verbs.c), in its zeroed allocation of our
    // size.
    let made = unsafe {
        Evented::create(
            ptr::addr_of_mut!((*ibqp.cast::<MetaQp<T>>()).qp),
            raw,
            |events: Arc<QpEvents>| {
                T::create_qp(&dev, &qi, udata.as_ref(), events).map(|m| (m.qp, (m.qpn, m.caps)))
            },
        )
    };
    match made {
        Ok((qpn, caps)) => {
            init.cap = super::abi::ib_caps(&caps);
            // SAFETY: the core's `ib_qp`, ours to fill during its create.
            unsafe { (*ibqp).qp_num = qpn };
            0
        }
        Err(e) => e.to_errno(),
    }
}

/// # Safety
///
/// `ibqp` must be null or a live QP of our device, for `'a`.
unsafe fn qp_of<'a, T: VerbsOps>(ibqp: *mut bindings::ib_qp) -> Option<&'a T::Qp> {
    // SAFETY: per the contract.
    unsafe { slot(ibqp.cast::<MetaQp<T>>(), |m: &'a MetaQp<T>| m.qp.get()) }
}

/// # Safety
///
/// Called only by the RDMA core for a QP we created.
unsafe extern "C" fn modify_qp<T: VerbsOps>(
    ibqp: *mut bindings::ib_qp,
    attr: *mut bindings::ib_qp_attr,
    mask: c_int,
    udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract; `udata` is this call's (or null, from a kernel consumer).
    let (dev, qp, attr, udata) = unsafe {
        (
            ctx((*ibqp).device),
            qp_of::<T>(ibqp),
            &*attr,
            Udata::from_raw(udata),
        )
    };
    let Some(qp) = qp else {
        return EINVAL.to_errno();
    };
    let attr = super::abi::modify_attr(attr);
    to_errno(T::modify_qp(&dev, qp, &attr, mask as u32, udata.as_ref()))
}

/// # Safety
///
/// Called only by the RDMA core for a QP we created.
unsafe extern "C" fn query_qp<T: VerbsOps>(
    ibqp: *mut bindings::ib_qp,
    attr: *mut bindings::ib_qp_attr,
    _mask: c_int,
    init: *mut bindings::ib_qp_init_attr,
) -> c_int {
    // SAFETY: per the contract.
    let (qp, attr, init) = unsafe { (qp_of::<T>(ibqp), &mut *attr, &mut *init) };
    let Some(qp) = qp else {
        return EINVAL.to_errno();
    };
    let q = match T::query_qp(qp) {
        Ok(q) => q,
        Err(e) => return e.to_errno(),
    };
    *attr = bindings::ib_qp_attr::default();
    match q {
        QpQuery::Connected {
            state,
            qp_type,
            attrs,
            caps,
            sig_all,
        } => {
            attr.qp_state = state.to_ib();
            super::abi::fill_qp_attr(&attrs, attr);
            attr.cap = super::abi::ib_caps(&caps);
            init.cap = attr.cap;
            init.qp_type = qp_type.to_ib();
            init.sq_sig_type = if sig_all {
                bindings::ib_sig_type_IB_SIGNAL_ALL_WR
            } else {
                bindings::ib_sig_type_IB_SIGNAL_REQ_WR
            };
        }
        QpQuery::Gsi {
            state,
            qkey,
            sq_psn,
            pkey_index,
            port,
            caps,
        } => {
            attr.qp_state = state.to_ib();
            attr.qkey = qkey;
            attr.sq_psn = sq_psn;
            attr.pkey_index = pkey_index;
            attr.port_num = port;
            attr.cap = super::abi::ib_caps(&caps);
            init.cap = attr.cap;
            init.qp_type = bindings::ib_qp_type_IB_QPT_GSI;
            init.port_num = port;
        }
    }
    attr.cur_qp_state = attr.qp_state;
    0
}

/// # Safety
///
/// Called only by the RDMA core for a QP we created.
unsafe extern "C" fn destroy_qp<T: VerbsOps>(
    ibqp: *mut bindings::ib_qp,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract; the core frees the `ib_qp` after we return.
    let (dev, qp) = unsafe { (ctx((*ibqp).device), (*ibqp.cast::<MetaQp<T>>()).qp.take()) };
    if let Some(qp) = qp {
        T::destroy_qp(&dev, qp);
    }
    0
}

/// `op` (`attach_mcast` or `detach_mcast`) of the QP `ibqp` to the group `gid`.
///
/// # Safety
///
/// Called only by the RDMA core's `attach_mcast`/`detach_mcast` for a QP we created, with a
/// live GID.
unsafe fn mcast_op<T: VerbsOps>(
    ibqp: *mut bindings::ib_qp,
    gid: *mut bindings::ib_gid,
    op: fn(&DeviceCtx<'_>, &T::Qp, &[u8; 16]) -> Result,
) -> c_int {
    // SAFETY: per the contract; `raw` is the GID's bytes, every pattern valid.
    let (dev, qp, gid) = unsafe { (ctx((*ibqp).device), qp_of::<T>(ibqp), (*gid).raw) };
    match qp {
        Some(qp) => to_errno(op(&dev, qp, &gid)),
        None => EINVAL.to_errno(),
    }
}

/// # Safety
///
/// Called only by the RDMA core for a QP we created, with a live GID.
unsafe extern "C" fn attach_mcast<T: VerbsOps>(
    ibqp: *mut bindings::ib_qp,
    gid: *mut bindings::ib_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: the core's `attach_mcast`, per this function's contract.
    unsafe { mcast_op::<T>(ibqp, gid, T::attach_mcast) }
}

/// # Safety
///
/// As [`attach_mcast`].
unsafe extern "C" fn detach_mcast<T: VerbsOps>(
    ibqp: *mut bindings::ib_qp,
    gid: *mut bindings::ib_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: the core's `detach_mcast`, per this function's contract.
    unsafe { mcast_op::<T>(ibqp, gid, T::detach_mcast) }
}

/// The doorbell (uverbs `POST_SEND` with no work requests: user QPs post into the SQ ring), or
/// a kernel consumer's work requests.
///
/// # Safety
///
/// Called only by the RDMA core for a QP we created, with null or a live chain of work
/// requests and a valid `bad_wr`.
unsafe extern "C" fn post_send<T: VerbsOps>(
    ibqp: *mut bindings::ib_qp,
    wr: *const bindings::ib_send_wr,
    bad_wr: *mut *const bindings::ib_send_wr,
) -> c_int {
    // SAFETY: per the contract.
    let (dev, qp) = unsafe { (ctx((*ibqp).device), qp_of::<T>(ibqp)) };
    let Some(qp) = qp else {
        if !wr.is_null() {
            // SAFETY: per the contract.
            unsafe { *bad_wr = wr };
        }
        return EINVAL.to_errno();
    };
    if wr.is_null() {
        return to_errno(T::doorbell(&dev, qp));
    }
    // SAFETY: per the contract.
    let (user, qp_type) = unsafe { (!(*ibqp).uobject.is_null(), (*ibqp).qp_type) };
    // Work requests through uverbs (a user QP) name user memory, and only a UD QP's are
    // `ib_ud_wr`s: neither is what `KernelSends` decodes.
    let ud =
        qp_type == bindings::ib_qp_type_IB_QPT_GSI || qp_type == bindings::ib_qp_type_IB_QPT_UD;
    if T::HAS_POST_SEND_KERNEL_RC && !user && qp_type == bindings::ib_qp_type_IB_QPT_RC {
        // SAFETY: per the contract, a live chain posted to one of our kernel RC QPs.
        let mut wrs = unsafe { KernelRcSends::new(wr.cast()) };
        return match T::post_send_kernel_rc(&dev, qp, &mut wrs) {
            Ok(()) => 0,
            Err(e) => {
                // SAFETY: per the contract.
                unsafe { *bad_wr = wrs.current().cast() };
                e.to_errno()
            }
        };
    }
    if !T::HAS_POST_SEND_KERNEL || user || !ud {
        // SAFETY: per the contract.
        unsafe { *bad_wr = wr };
        return EOPNOTSUPP.to_errno();
    }
    // SAFETY: per the contract, a live chain posted to one of our kernel QPs.
    let mut wrs = unsafe { KernelSends::new(wr) };
    match T::post_send_kernel(&dev, qp, &mut wrs) {
        Ok(()) => 0,
        Err(e) => {
            // SAFETY: per the contract.
            unsafe { *bad_wr = wrs.current() };
            e.to_errno()
        }
    }
}

/// # Safety
///
/// Called only by the RDMA core for a QP we created, with a live chain of work requests and a
/// valid `bad_wr`.
unsafe extern "C" fn post_recv<T: VerbsOps>(
    ibqp: *mut bindings::ib_qp,
    wr: *const bindings::ib_recv_wr,
    bad_wr: *mut *const bindings::ib_recv_wr,
) -> c_int {
    // SAFETY: per the contract.
    let (dev, qp) = unsafe { (ctx((*ibqp).device), qp_of::<T>(ibqp)) };
    let Some(qp) = qp else {
        // SAFETY: per the contract.
        unsafe { *bad_wr = wr };
        return EINVAL.to_errno();
    };
    // Work requests through uverbs (a user QP) name user memory: user QPs post receives into
    // their rings.
    // SAFETY: per the contract.
    if unsafe { !(*ibqp).uobject.is_null() } {
        // SAFETY: per the contract.
        unsafe { *bad_wr = wr };
        return EOPNOTSUPP.to_errno();
    }
    // SAFETY: per the contract.
    if T::HAS_POST_RECV_KERNEL_RC && unsafe { (*ibqp).qp_type } == bindings::ib_qp_type_IB_QPT_RC {
        // SAFETY: per the contract, a live chain posted to one of our kernel RC QPs.
        let mut wrs = unsafe { KernelRcRecvs::new(wr.cast()) };
        return match T::post_recv_kernel_rc(&dev, qp, &mut wrs) {
            Ok(()) => 0,
            Err(e) => {
                // SAFETY: per the contract.
                unsafe { *bad_wr = wrs.current().cast() };
                e.to_errno()
            }
        };
    }
    // SAFETY: per the contract, a live chain posted to one of our kernel QPs.
    let mut wrs = unsafe { KernelRecvs::new(wr) };
    match T::post_recv_kernel(&dev, qp, &mut wrs) {
        Ok(()) => 0,
        Err(e) => {
            // SAFETY: per the contract.
            unsafe { *bad_wr = wrs.current() };
            e.to_errno()
        }
    }
}
