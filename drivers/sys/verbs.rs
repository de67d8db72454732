// SPDX-License-Identifier: GPL-2.0

//! Trampolines for the verbs objects: MR, CQ, SRQ, QP. Each object the RDMA core allocates
//! (`ib_cq`, `ib_qp`, `ib_srq`, with the sizes set in the ops) is followed by an
//! `Option<Arc<...>>` to our safe object, set on create and taken on destroy; MRs we allocate
//! ourselves. The objects live in `crate::verbs`.

use super::udata::Udata;
use super::{
    bhlock::{new_spinlock_bh, SpinLockBh},
    bindings,
    ibdev::{engine_of, verbs_of},
    ring::UserRing,
    to_errno,
    umem::UserMemory,
};
use crate::verbs::{
    limits, Caps, Cq, CqRing, Fifo, InlineStore, Mr, Qp, QpParts, QpQueues, QpState, Srq, Verbs,
};
use crate::verbs_core::udata::{self, DvModify};
use core::{
    mem::{offset_of, size_of},
    ptr::{self, NonNull},
};
use kernel::transmute::AsBytes;
use kernel::{ffi::c_int, prelude::*, sync::Arc};

#[repr(C)]
pub(super) struct MetaCq {
    ibcq: bindings::ib_cq,
    cq: Option<Arc<Cq>>,
}

#[repr(C)]
pub(super) struct MetaQp {
    ibqp: bindings::ib_qp,
    /// A user RC QP.
    qp: Option<Arc<Qp>>,
    /// The GSI QP of a port (a kernel consumer's: the MAD layer's).
    pub(super) gsi: Option<Arc<crate::gsi::GsiQp>>,
}

#[repr(C)]
pub(super) struct MetaSrq {
    ibsrq: bindings::ib_srq,
    srq: Option<Arc<Srq>>,
}

#[repr(C)]
struct MetaMr {
    ibmr: bindings::ib_mr,
    mr: Option<Arc<Mr>>,
}

const _: () = assert!(offset_of!(MetaCq, ibcq) == 0);
const _: () = assert!(offset_of!(MetaQp, ibqp) == 0);
const _: () = assert!(offset_of!(MetaSrq, ibsrq) == 0);
const _: () = assert!(offset_of!(MetaMr, ibmr) == 0);

pub(super) const SIZE_CQ: usize = size_of::<MetaCq>();
pub(super) const SIZE_QP: usize = size_of::<MetaQp>();
pub(super) const SIZE_SRQ: usize = size_of::<MetaSrq>();

/// Raises a CQ's completion and error events (the core's `comp_handler`/`event_handler`).
pub(crate) struct CqNotifier(NonNull<bindings::ib_cq>);

// SAFETY: the `ib_cq` outlives the `Cq` holding this (destroy_cq drops the `Cq` before the
// core frees the `ib_cq`), and the core's handlers may run on any CPU.
unsafe impl Send for CqNotifier {}
// SAFETY: as above; the handlers do their own locking.
unsafe impl Sync for CqNotifier {}

impl CqNotifier {
    /// A completion event (`ibv_get_cq_event` wakes up).
    pub(crate) fn notify(&self) {
        let cq = self.0.as_ptr();
        // SAFETY: the `ib_cq` is alive (see the `Send` impl); the core set the handler and
        // its context at creation and never changes them.
        unsafe {
            if let Some(handler) = (*cq).comp_handler {
                handler(cq, (*cq).cq_context);
            }
        }
    }

    /// The CQ overflowed: an asynchronous `IBV_EVENT_CQ_ERR`.
    pub(crate) fn overflow(&self) {
        let cq = self.0.as_ptr();
        // SAFETY: as in `notify`.
        unsafe {
            if let Some(handler) = (*cq).event_handler {
                let mut event = bindings::ib_event {
                    device: (*cq).device,
                    event: bindings::ib_event_type_IB_EVENT_CQ_ERR,
                    ..Default::default()
                };
                event.element.cq = cq;
                handler(&mut event, (*cq).cq_context);
            }
        }
    }
}

/// The core's `ib_qp` or `ib_srq` an [`AsyncEvents`] raises events on.
struct EventObject<T>(NonNull<T>);

// SAFETY: a pointer the core's objects are reached by from any CPU; dereferenced only under
// `AsyncEvents::object`'s lock, while the object is alive (see `AsyncEvents`).
unsafe impl<T> Send for EventObject<T> {}

/// Raises the asynchronous events of a user QP (`IB_EVENT_QP_FATAL`) or SRQ
/// (`IB_EVENT_SRQ_ERR`) through the core's `event_handler`, from any context (the data path's
/// softirq and locks included), until the object is destroyed.
///
/// Lifetime: the data path reaches a QP through its `Arc<Qp>` (the QP table, its stream's slot)
/// and an SRQ through the QPs' `Arc<Srq>`, and an `Arc` says nothing of the `ib_qp`/`ib_srq`,
/// which the core frees as soon as `destroy_qp`/`destroy_srq` returns (`ib_destroy_qp_user`,
/// `ib_destroy_srq_user`), and whose uverbs event list it releases right after
/// (`ib_uverbs_release_uevent`). So the object's pointer is kept here, under a lock, only from
/// create until destroy starts: `destroy_qp`/`destroy_srq` take it out first ([`Self::detach`]),
/// and raising an event holds the lock from reading the pointer until the handler returns. An
/// event is raised before destroy takes the pointer, or finds none; never after destroy began,
/// however long an `Arc` lives.
#[pin_data]
pub(crate) struct AsyncEvents<T> {
    /// The core's object; None once its destroy began.
    #[pin]
    object: SpinLockBh<Option<EventObject<T>>>,
}

/// A user QP's asynchronous events.
pub(crate) type QpEvents = AsyncEvents<bindings::ib_qp>;
/// A user SRQ's asynchronous events.
pub(crate) type SrqEvents = AsyncEvents<bindings::ib_srq>;

impl<T> AsyncEvents<T> {
    /// Events on `object`.
    ///
    /// # Safety
    ///
    /// `object` must be the core's `ib_qp`/`ib_srq` being created (its `device`,
    /// `event_handler` and context set, as the core does before the driver's create), and
    /// [`Self::detach`] must be called before it is freed: at the start of its destroy, or
    /// when its create fails while others can reach this.
    unsafe fn new(object: NonNull<T>) -> impl PinInit<Self> {
        pin_init!(Self {
            object <- new_spinlock_bh!(Some(EventObject(object)), "metaroce_async_events"),
        })
    }

    /// The object is being destroyed: no event is raised from now on (one being raised on
    /// another CPU has returned when this does).
    fn detach(&self) {
        *self.object.lock() = None;
    }
}

impl AsyncEvents<bindings::ib_qp> {
    /// `IB_EVENT_QP_FATAL` (`IBV_EVENT_QP_FATAL` for the application), if the QP is not
    /// being destroyed.
    pub(crate) fn qp_fatal(&self) {
        let object = self.object.lock();
        let Some(EventObject(qp)) = object.as_ref() else {
            return;
        };
        let qp = qp.as_ptr();
        // SAFETY: the `ib_qp` is alive while its pointer is here and we hold the lock (see the
        // type); the core set `device`, the handler and its context before our create and
        // never changes them. The handler (the core's `__ib_qp_event_handler`, then uverbs'
        // `ib_uverbs_qp_event_handler`) takes a spinlock with interrupts saved and allocates
        // with GFP_ATOMIC: callable in softirq and under our locks, and it calls nothing of
        // ours.
        unsafe {
            if let Some(handler) = (*qp).event_handler {
                let mut event = bindings::ib_event {
                    device: (*qp).device,
                    event: bindings::ib_event_type_IB_EVENT_QP_FATAL,
                    ..Default::default()
                };
                event.element.qp = qp;
                handler(&mut event, (*qp).qp_context);
            }
        }
    }
}

impl AsyncEvents<bindings::ib_srq> {
    /// `IB_EVENT_SRQ_ERR` (`IBV_EVENT_SRQ_ERR`), if the SRQ is not being destroyed.
    pub(crate) fn srq_error(&self) {
        let object = self.object.lock();
        let Some(EventObject(srq)) = object.as_ref() else {
            return;
        };
        let srq = srq.as_ptr();
        // SAFETY: as in `qp_fatal`, for the `ib_srq` (uverbs' `ib_uverbs_srq_event_handler`).
        unsafe {
            if let Some(handler) = (*srq).event_handler {
                let mut event = bindings::ib_event {
                    device: (*srq).device,
                    event: bindings::ib_event_type_IB_EVENT_SRQ_ERR,
                    ..Default::default()
                };
                event.element.srq = srq;
                handler(&mut event, (*srq).srq_context);
            }
        }
    }
}

/// An `ERR_PTR`.
fn err_ptr<T>(e: Error) -> *mut T {
    e.to_errno() as isize as *mut T
}

/// The user context of a uverbs call that must come from userspace.
fn user_context(udata: Option<&Udata<'_>>) -> Result<*mut bindings::ib_ucontext> {
    // Kernel consumers (no udata) have their own paths (`kverbs`) where they are supported.
    udata.ok_or(EOPNOTSUPP)?.ucontext()
}

// ---- CQ ----

/// # Safety
///
/// Called only by the RDMA core with a CQ it allocated (`size_ib_cq`, zeroed).
pub(super) unsafe extern "C" fn create_cq(
    ibcq: *mut bindings::ib_cq,
    attr: *const bindings::ib_cq_init_attr,
    attrs: *mut bindings::uverbs_attr_bundle,
) -> c_int {
    // SAFETY: per the contract; `attrs` is null for kernel consumers.
    to_errno(unsafe { create_cq_inner(ibcq, &*attr, attrs) })
}

/// # Safety
///
/// As `create_cq`.
unsafe fn create_cq_inner(
    ibcq: *mut bindings::ib_cq,
    attr: &bindings::ib_cq_init_attr,
    attrs: *mut bindings::uverbs_attr_bundle,
) -> Result {
    if attr.flags != 0 || attr.cqe < 1 || attr.cqe > limits::MAX_CQE {
        return Err(EINVAL);
    }
    // SAFETY: `ibcq` is live and `device` set by the core.
    let verbs = unsafe { verbs_of((*ibcq).device) };
    if verbs.cqs.load(core::sync::atomic::Ordering::Relaxed) >= limits::MAX_CQ {
        return Err(ENOMEM);
    }
    if attrs.is_null() {
        // A kernel consumer's CQ (the MAD layer's): completions wait in kernel memory for
        // `poll_cq`.
        let notifier = CqNotifier(NonNull::new(ibcq).ok_or(EINVAL)?);
        let cq = Arc::pin_init(
            Cq::new(CqRing::Kernel(Fifo::new(attr.cqe)?), notifier),
            GFP_KERNEL,
        )?;
        let entries = cq.capacity();
        // SAFETY: per the contract.
        unsafe { install_cq(ibcq, verbs, cq, entries) };
        return Ok(());
    }
    // SAFETY: `attrs` is the live bundle of this uverbs call; its driver udata lives as long.
    let udata = unsafe {
        let b = &mut (*attrs).__bindgen_anon_1.__bindgen_anon_1;
        Udata::from_raw(ptr::addr_of_mut!(b.driver_udata))
    }
    .ok_or(EINVAL)?;
    let uctx = udata.ucontext()?;
    // One slot more than asked for, so a full CQ of `cqe` entries fits.
    // SAFETY: `uctx` is a live context of our device.
    let ring = unsafe { UserRing::new(uctx, attr.cqe + 1) }?;
    let notifier = CqNotifier(NonNull::new(ibcq).ok_or(EINVAL)?);
    let cq = Arc::pin_init(Cq::new(CqRing::User(ring), notifier), GFP_KERNEL)?;
    let resp = bindings::metaroce_create_cq_resp {
        ring: cq.ring_info().ok_or(EINVAL)?.into(),
    };
    udata.respond(&resp)?;
    // The ring's extra slot is not the application's.
    let entries = cq.capacity() - 1;
    // SAFETY: per the contract.
    unsafe { install_cq(ibcq, verbs, cq, entries) };
    Ok(())
}

/// Makes `cq` the CQ behind `ibcq`, reporting `entries` to the core, and counts it.
///
/// # Safety
///
/// `ibcq` must be the core's zeroed allocation of our size for a CQ being created, not yet
/// seen by anyone else.
unsafe fn install_cq(ibcq: *mut bindings::ib_cq, verbs: &Verbs, cq: Arc<Cq>, entries: u32) {
    // SAFETY: per the contract.
    unsafe {
        (*ibcq).cqe = entries as c_int;
        ptr::addr_of_mut!((*ibcq.cast::<MetaCq>()).cq).write(Some(cq));
    }
    verbs
        .cqs
        .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
}

/// # Safety
///
/// Called only by the RDMA core for a CQ we created, with no QP using it any more.
pub(super) unsafe extern "C" fn destroy_cq(
    ibcq: *mut bindings::ib_cq,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract; QPs hold their own `Arc`s, so in-flight completions finish.
    unsafe {
        let verbs = verbs_of((*ibcq).device);
        if (*ibcq.cast::<MetaCq>()).cq.take().is_some() {
            verbs
                .cqs
                .fetch_sub(1, core::sync::atomic::Ordering::Relaxed);
        }
    }
    0
}

/// # Safety
///
/// Called only by the RDMA core for a CQ we created.
pub(super) unsafe extern "C" fn req_notify_cq(
    ibcq: *mut bindings::ib_cq,
    flags: bindings::ib_cq_notify_flags,
) -> c_int {
    // SAFETY: per the contract.
    if let Some(cq) = unsafe { &(*ibcq.cast::<MetaCq>()).cq } {
        let solicited = flags & bindings::ib_cq_notify_flags_IB_CQ_SOLICITED_MASK
            == bindings::ib_cq_notify_flags_IB_CQ_SOLICITED;
        cq.arm(solicited);
        // Kernel consumers may ask whether completions arrived before they armed.
        if flags & bindings::ib_cq_notify_flags_IB_CQ_REPORT_MISSED_EVENTS != 0
            && cq.has_completions()
        {
            return 1;
        }
    }
    0
}

/// Our CQ behind an `ib_cq` the core hands us.
///
/// # Safety
///
/// `ibcq` must be null or a live CQ of our device.
pub(super) unsafe fn cq_of(ibcq: *mut bindings::ib_cq) -> Result<Arc<Cq>> {
    if ibcq.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: per the contract.
    unsafe { (*ibcq.cast::<MetaCq>()).cq.clone() }.ok_or(EINVAL)
}

// ---- SRQ ----

/// # Safety
///
/// Called only by the RDMA core with an SRQ it allocated (`size_ib_srq`, zeroed).
pub(super) unsafe extern "C" fn create_srq(
    ibsrq: *mut bindings::ib_srq,
    init: *mut bindings::ib_srq_init_attr,
    udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract.
    to_errno(unsafe { create_srq_inner(ibsrq, &mut *init, udata) })
}

/// # Safety
///
/// As `create_srq`.
unsafe fn create_srq_inner(
    ibsrq: *mut bindings::ib_srq,
    init: &mut bindings::ib_srq_init_attr,
    udata: *mut bindings::ib_udata,
) -> Result {
    // SAFETY: `udata` is this call's (or null).
    let udata = unsafe { Udata::from_raw(udata) };
    let uctx = user_context(udata.as_ref())?;
    if init.srq_type != bindings::ib_srq_type_IB_SRQT_BASIC
        || init.attr.max_wr < 1
        || init.attr.max_wr > limits::MAX_SRQ_WR
        || init.attr.max_sge > limits::MAX_SGE
    {
        return Err(EINVAL);
    }
    // SAFETY: `ibsrq` is live with `device` set by the core.
    let verbs = unsafe { verbs_of((*ibsrq).device) };
    // SAFETY: `uctx` is a live context of our device.
    let ring = unsafe { UserRing::new(uctx, init.attr.max_wr) }?;
    let ibsrq_ptr = NonNull::new(ibsrq).ok_or(EINVAL)?;
    let srqn = verbs.srqs.lock().reserve(1)?;
    // SAFETY: the core's `ib_srq` being created, with `device`, `event_handler` and
    // `srq_context` set (`ib_create_srq_user`); `destroy_srq` detaches first, and a failed
    // create drops the only reference to the SRQ before returning.
    let events = unsafe { SrqEvents::new(ibsrq_ptr) };
    let srq = match Arc::pin_init(Srq::new(srqn, ring, events), GFP_KERNEL) {
        Ok(srq) => srq,
        Err(e) => {
            verbs.srqs.lock().remove(srqn);
            return Err(e);
        }
    };
    srq.limit
        .store(init.attr.srq_limit, core::sync::atomic::Ordering::Relaxed);
    let resp = bindings::metaroce_create_srq_resp {
        ring: srq.ring_info().into(),
        srq_num: srqn,
        reserved: 0,
    };
    if let Err(e) = udata.as_ref().ok_or(EINVAL).and_then(|u| u.respond(&resp)) {
        verbs.srqs.lock().remove(srqn);
        return Err(e);
    }
    init.attr.max_wr = srq.capacity();
    init.attr.max_sge = limits::MAX_SGE;
    verbs.srqs.lock().insert(srqn, srq.clone());
    // SAFETY: the core's zeroed allocation of our size; not yet visible to anyone else.
    unsafe { ptr::addr_of_mut!((*ibsrq.cast::<MetaSrq>()).srq).write(Some(srq)) };
    Ok(())
}

/// # Safety
///
/// Called only by the RDMA core for an SRQ we created.
pub(super) unsafe extern "C" fn modify_srq(
    ibsrq: *mut bindings::ib_srq,
    attr: *mut bindings::ib_srq_attr,
    mask: bindings::ib_srq_attr_mask,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract.
    let (srq, attr) = unsafe { (&(*ibsrq.cast::<MetaSrq>()).srq, &*attr) };
    let Some(srq) = srq else {
        return EINVAL.to_errno();
    };
    if mask & bindings::ib_srq_attr_mask_IB_SRQ_MAX_WR != 0 {
        // Resizing would move the ring under the provider's mapping.
        return EOPNOTSUPP.to_errno();
    }
    if mask & bindings::ib_srq_attr_mask_IB_SRQ_LIMIT != 0 {
        if attr.srq_limit > srq.capacity() {
            return EINVAL.to_errno();
        }
        srq.limit
            .store(attr.srq_limit, core::sync::atomic::Ordering::Relaxed);
    }
    0
}

/// # Safety
///
/// Called only by the RDMA core for an SRQ we created.
pub(super) unsafe extern "C" fn query_srq(
    ibsrq: *mut bindings::ib_srq,
    attr: *mut bindings::ib_srq_attr,
) -> c_int {
    // SAFETY: per the contract.
    let (srq, attr) = unsafe { (&(*ibsrq.cast::<MetaSrq>()).srq, &mut *attr) };
    let Some(srq) = srq else {
        return EINVAL.to_errno();
    };
    attr.max_wr = srq.capacity();
    attr.max_sge = limits::MAX_SGE;
    attr.srq_limit = srq.limit.load(core::sync::atomic::Ordering::Relaxed);
    0
}

/// # Safety
///
/// Called only by the RDMA core for an SRQ we created, with no QP using it any more.
pub(super) unsafe extern "C" fn destroy_srq(
    ibsrq: *mut bindings::ib_srq,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        if let Some(srq) = (*ibsrq.cast::<MetaSrq>()).srq.take() {
            // First: the `ib_srq` is freed when we return (see `AsyncEvents`).
            srq.events.detach();
            verbs_of((*ibsrq).device).srqs.lock().remove(srq.srqn);
        }
    }
    0
}

// ---- MR ----

/// # Safety
///
/// Called only by the RDMA core (`ibv_reg_mr`) with a live PD and this call's udata.
pub(super) unsafe extern "C" fn reg_user_mr(
    ibpd: *mut bindings::ib_pd,
    start: u64,
    length: u64,
    iova: u64,
    access: c_int,
    _dmah: *mut bindings::ib_dmah,
    _udata: *mut bindings::ib_udata,
) -> *mut bindings::ib_mr {
    // SAFETY: per the contract.
    match unsafe { reg_user_mr_inner(ibpd, start, length, iova, access) } {
        Ok(ibmr) => ibmr,
        Err(e) => err_ptr(e),
    }
}

/// # Safety
///
/// As `reg_user_mr`.
unsafe fn reg_user_mr_inner(
    ibpd: *mut bindings::ib_pd,
    start: u64,
    length: u64,
    iova: u64,
    access: c_int,
) -> Result<*mut bindings::ib_mr> {
    if length == 0 || iova.checked_add(length).is_none() {
        return Err(EINVAL);
    }
    // SAFETY: the PD is live with `device` set.
    let ibdev = unsafe { (*ibpd).device };
    // SAFETY: as above.
    let verbs = unsafe { verbs_of(ibdev) };
    // SAFETY: `ibdev` is live; we run in the registering process.
    let mem = unsafe { UserMemory::pin(ibdev, start, length, access) }?;
    let key = crate::verbs::reserve_in(&verbs.mrs, 1)?;
    let mr = Mr::new(key, iova, length, access as u32, ibpd as usize, mem);
    let mr = match Arc::new(mr, GFP_KERNEL) {
        Ok(mr) => mr,
        Err(e) => {
            verbs.mrs.lock().remove(key);
            return Err(e.into());
        }
    };
    let meta = KBox::new(
        MetaMr {
            ibmr: bindings::ib_mr::default(),
            mr: Some(mr.clone()),
        },
        GFP_KERNEL,
    );
    let mut meta = match meta {
        Ok(m) => m,
        Err(e) => {
            verbs.mrs.lock().remove(key);
            return Err(e.into());
        }
    };
    meta.ibmr.lkey = key;
    meta.ibmr.rkey = key;
    meta.ibmr.iova = iova;
    meta.ibmr.length = length;
    verbs.mrs.lock().insert(key, mr);
    Ok(ptr::addr_of_mut!(KBox::leak(meta).ibmr))
}

/// The DMA MR of a kernel PD: local access to kernel memory under [`KERNEL_LKEY`] (the
/// device's `local_dma_lkey`, so the core only asks for one with `IB_PD_UNSAFE_GLOBAL_RKEY`).
/// Remote access to all of kernel memory is refused.
///
/// [`KERNEL_LKEY`]: super::kverbs::KERNEL_LKEY
///
/// # Safety
///
/// Called only by the RDMA core with a live kernel PD.
pub(super) unsafe extern "C" fn get_dma_mr(
    _ibpd: *mut bindings::ib_pd,
    access: c_int,
) -> *mut bindings::ib_mr {
    let remote = bindings::ib_access_flags_IB_ACCESS_REMOTE_READ
        | bindings::ib_access_flags_IB_ACCESS_REMOTE_WRITE
        | bindings::ib_access_flags_IB_ACCESS_REMOTE_ATOMIC;
    if access as u32 & remote != 0 {
        return err_ptr(EOPNOTSUPP);
    }
    let meta = KBox::new(
        MetaMr {
            ibmr: bindings::ib_mr::default(),
            mr: None,
        },
        GFP_KERNEL,
    );
    match meta {
        Ok(mut meta) => {
            meta.ibmr.lkey = super::kverbs::KERNEL_LKEY;
            ptr::addr_of_mut!(KBox::leak(meta).ibmr)
        }
        Err(e) => err_ptr(e.into()),
    }
}

/// # Safety
///
/// Called only by the RDMA core for an MR we registered.
pub(super) unsafe extern "C" fn dereg_mr(
    ibmr: *mut bindings::ib_mr,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: every MR we hand out is a leaked `KBox<MetaMr>`; the core calls this once.
    unsafe {
        let verbs = verbs_of((*ibmr).device);
        let meta = KBox::from_raw(ibmr.cast::<MetaMr>());
        // Dropped outside the table's lock: the last reference releases the pages, which
        // may sleep. The data path uses an MR only under that lock (`Verbs::with_mr`), so
        // once it is out of the table nothing copies to or from its pages.
        let removed = verbs.mrs.lock().remove(meta.ibmr.lkey);
        drop(removed);
        drop(meta);
    }
    0
}

// ---- QP ----

/// # Safety
///
/// Called only by the RDMA core with a QP it allocated (`size_ib_qp`, zeroed).
pub(super) unsafe extern "C" fn create_qp(
    ibqp: *mut bindings::ib_qp,
    init: *mut bindings::ib_qp_init_attr,
    udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract.
    to_errno(unsafe { create_qp_inner(ibqp, &mut *init, udata) })
}

/// # Safety
///
/// As `create_qp`.
unsafe fn create_qp_inner(
    ibqp: *mut bindings::ib_qp,
    init: &mut bindings::ib_qp_init_attr,
    udata: *mut bindings::ib_udata,
) -> Result {
    if udata.is_null() {
        // SAFETY: per the contract, with no udata: a kernel consumer.
        return unsafe { super::kverbs::create_gsi(ibqp, init) };
    }
    // SAFETY: `udata` is this call's.
    let udata = unsafe { Udata::from_raw(udata) };
    let uctx = user_context(udata.as_ref())?;
    if init.qp_type != bindings::ib_qp_type_IB_QPT_RC {
        return Err(EOPNOTSUPP);
    }
    if init.create_flags != 0 {
        return Err(EINVAL);
    }
    // SAFETY: `ibqp` is live with `device` and `pd` set by the core; the CQs and SRQ are
    // live objects of ours (the core resolved them from user handles).
    let (verbs, pd, send_cq, recv_cq, srq) = unsafe {
        let srq = if init.srq.is_null() {
            None
        } else {
            Some((*init.srq.cast::<MetaSrq>()).srq.clone().ok_or(EINVAL)?)
        };
        (
            verbs_of((*ibqp).device),
            (*ibqp).pd as usize,
            cq_of(init.send_cq)?,
            cq_of(init.recv_cq)?,
            srq,
        )
    };
    let cap = Caps::check(&super::abi::caps_of(&init.cap), srq.is_some()).map_err(|_| EINVAL)?;
    // SAFETY: `uctx` is a live context of our device.
    let sq = unsafe { UserRing::new(uctx, cap.max_send_wr) }?;
    let rq = if srq.is_none() {
        // SAFETY: as above.
        Some(unsafe { UserRing::new(uctx, cap.max_recv_wr) }?)
    } else {
        None
    };
    let resp = bindings::metaroce_create_qp_resp {
        sq: sq.info().into(),
        rq: rq.as_ref().map(|r| r.info().into()).unwrap_or_default(),
        max_inline_data: cap.max_inline_data,
        reserved: 0,
    };
    let inline = if cap.max_inline_data > 0 {
        Some(InlineStore::new()?)
    } else {
        None
    };
    let ibqp_ptr = NonNull::new(ibqp).ok_or(EINVAL)?;
    let qpn = crate::verbs::reserve_in(&verbs.qps, 1)?;
    let parts = QpParts {
        qpn,
        pd,
        send_cq,
        recv_cq,
        srq,
        sq_sig_all: init.sq_sig_type == bindings::ib_sig_type_IB_SIGNAL_ALL_WR,
        cap,
        queues: QpQueues { sq, rq },
        inline,
    };
    // SAFETY: the core's `ib_qp` being created, with `device`, `event_handler` and
    // `qp_context` set (`create_qp` in the core's verbs.c); `destroy_qp` detaches first, and a
    // failed create drops the only reference to the QP (not yet in the table) before
    // returning.
    let events = unsafe { QpEvents::new(ibqp_ptr) };
    let qp = match Arc::pin_init(Qp::new(parts, events), GFP_KERNEL) {
        Ok(qp) => qp,
        Err(e) => {
            verbs.qps.lock().remove(qpn);
            return Err(e);
        }
    };
    if let Err(e) = udata.as_ref().ok_or(EINVAL).and_then(|u| u.respond(&resp)) {
        verbs.qps.lock().remove(qpn);
        return Err(e);
    }
    init.cap.max_send_wr = cap.max_send_wr;
    init.cap.max_recv_wr = cap.max_recv_wr;
    init.cap.max_send_sge = cap.max_send_sge;
    init.cap.max_recv_sge = cap.max_recv_sge;
    init.cap.max_inline_data = cap.max_inline_data;
    verbs.qps.lock().insert(qpn, qp.clone());
    // SAFETY: the core's zeroed allocation of our size; not yet visible to anyone else.
    unsafe {
        (*ibqp).qp_num = qpn;
        ptr::addr_of_mut!((*ibqp.cast::<MetaQp>()).qp).write(Some(qp));
    }
    Ok(())
}

/// Our QP behind an `ib_qp`.
///
/// # Safety
///
/// `ibqp` must be a live QP of ours.
unsafe fn qp_of<'a>(ibqp: *mut bindings::ib_qp) -> Option<&'a Arc<Qp>> {
    // SAFETY: per the contract.
    unsafe { (*ibqp.cast::<MetaQp>()).qp.as_ref() }
}

/// # Safety
///
/// Called only by the RDMA core for a QP we created.
pub(super) unsafe extern "C" fn modify_qp(
    ibqp: *mut bindings::ib_qp,
    attr: *mut bindings::ib_qp_attr,
    mask: c_int,
    udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract.
    let (qp, attr, qp_type) = unsafe { (qp_of(ibqp), &*attr, (*ibqp).qp_type) };
    let mask = mask as u32;
    // SAFETY: per the contract.
    if let Some(gsi) = unsafe { super::kverbs::gsi_of(ibqp) } {
        return super::kverbs::modify_gsi(gsi, attr, mask, qp_type);
    }
    let Some(qp) = qp else {
        return EINVAL.to_errno();
    };
    // SAFETY: the core passes this call's udata (or null, from a kernel consumer).
    let udata = unsafe { Udata::from_raw(udata) };
    let dv = match dv_command(udata.as_ref()) {
        Ok(dv) => dv,
        Err(e) => return e.to_errno(),
    };
    // One modify at a time per QP: the check, the attach and the commit see one state.
    let _serial = qp.modify.lock();
    // Validate and attach with the new attributes first, then commit: a call that fails
    // (an IPv6 destination, no memory for the connection) leaves the QP as it was.
    let prev = qp.state();
    // SAFETY: the QP's device is live while the core calls us for it.
    let engine = unsafe { engine_of((*ibqp).device) };
    // The transition and every attribute are judged by the rules (`verbs_core::qp::prepare`;
    // a zero mask, the direct verbs' call, changes nothing in any state).
    let change = match qp.prepare(&super::abi::modify_attr(attr), mask) {
        Ok(c) => c,
        Err(e) => return e.to_errno(),
    };
    let ready = match (prev, change.state, engine) {
        (QpState::Init, QpState::Rtr, Some(engine)) => engine.attach(qp, &change.attrs),
        (QpState::Rtr, QpState::Rts, Some(engine)) => engine.start_sending(qp, &change.attrs),
        _ => Ok(()),
    };
    if ready.is_err() {
        return to_errno(ready);
    }
    qp.commit(&change);
    match (change.state, engine) {
        (QpState::Err, Some(engine)) => engine.fail(qp),
        (QpState::Err, None) => qp.flush(),
        _ => {}
    }
    if let (Some(planes), Some(engine)) = (dv.planes, engine) {
        engine.set_qp_planes(qp, planes);
    } else if let Some(planes) = dv.planes {
        qp.set_planes(planes);
    }
    match &udata {
        Some(u) => to_errno(dv_respond(u, qp, engine)),
        None => 0,
    }
}

/// Reads the driver data of a `modify_qp` (at most the command's size; the rest must be zero)
/// and has the rules judge it (`verbs_core::udata::modify_qp_cmd`).
fn dv_command(udata: Option<&Udata<'_>>) -> Result<DvModify> {
    let Some(u) = udata else {
        return Ok(DvModify::default());
    };
    let mut head = [0u8; udata::MODIFY_QP_CMD_SIZE];
    let n = u.read_head(&mut head)?;
    let cleared = u.cleared_from(head.len());
    udata::modify_qp_cmd(head.get(..n).unwrap_or(&[]), cleared).map_err(|e| match e {
        udata::UdataError::Unsupported => EOPNOTSUPP,
        udata::UdataError::Invalid => EINVAL,
    })
}

/// Writes `struct metaroce_modify_qp_resp` and as many path entries as the caller's buffer
/// takes, if it has room for the fixed part (the provider's direct verbs give it; a stock
/// `modify_qp` gives none).
fn dv_respond(udata: &Udata<'_>, qp: &Qp, engine: Option<&Arc<crate::datapath::Engine>>) -> Result {
    let outlen = udata.outlen();
    let head = size_of::<bindings::metaroce_modify_qp_resp>();
    let entry = size_of::<bindings::metaroce_path_info>();
    if outlen < head {
        return Ok(());
    }
    let room = ((outlen - head) / entry).min(crate::device::MAX_PATHS as usize);
    // The answer as the user buffer takes it: the fixed part (written last), then the entries.
    let mut out: KVec<u8> = KVec::with_capacity(head + room * entry, GFP_KERNEL)?;
    out.extend_with(head, 0u8, GFP_KERNEL)?;
    let mut entries = 0usize;
    let mut nomem = false;
    let info = engine.and_then(|e| {
        e.qp_connection(qp, |pi| {
            if entries >= room || nomem {
                return;
            }
            let e = bindings::metaroce_path_info {
                path_id: pi.id,
                plane: pi.plane,
                state: pi.state,
                udp_sport: pi.sport,
                reserved: 0,
                srtt_us: pi.srtt_us,
                cwnd: pi.cwnd,
                in_flight: pi.in_flight,
                reserved1: 0,
                packets_sent: pi.sent,
                retransmits: pi.retransmits,
                ecn_marks: pi.ecn_marks,
                timeouts: pi.timeouts,
            };
            // Within the capacity reserved above: no allocation under the peer's lock.
            nomem = out.extend_from_slice(e.as_bytes(), GFP_ATOMIC).is_err();
            entries += 1;
        })
    });
    if nomem {
        return Err(ENOMEM);
    }
    let mut resp = bindings::metaroce_modify_qp_resp {
        plane_mask: qp.planes(),
        ..Default::default()
    };
    if let Some(c) = info {
        resp.connected = 1;
        resp.planes = c.planes;
        resp.planes_up = c.planes_up;
        resp.num_paths = c.paths;
        resp.qps = c.qps;
        resp.num_path_info = entries as u32;
    }
    resp.response_length = out.len() as u32;
    if let Some(fixed) = out.get_mut(..head) {
        fixed.copy_from_slice(resp.as_bytes());
    }
    // At most `outlen` bytes: the fixed part and at most `room` entries.
    udata.write(&out)
}

/// # Safety
///
/// Called only by the RDMA core for a QP we created.
pub(super) unsafe extern "C" fn query_qp(
    ibqp: *mut bindings::ib_qp,
    attr: *mut bindings::ib_qp_attr,
    _mask: c_int,
    init: *mut bindings::ib_qp_init_attr,
) -> c_int {
    // SAFETY: per the contract.
    let (qp, attr, init) = unsafe { (qp_of(ibqp), &mut *attr, &mut *init) };
    // SAFETY: per the contract.
    if let Some(gsi) = unsafe { super::kverbs::gsi_of(ibqp) } {
        super::kverbs::query_gsi(gsi, attr, init);
        return 0;
    }
    let Some(qp) = qp else {
        return EINVAL.to_errno();
    };
    let inner = qp.inner.lock();
    *attr = bindings::ib_qp_attr::default();
    attr.qp_state = inner.state.to_ib();
    attr.cur_qp_state = attr.qp_state;
    super::abi::fill_qp_attr(&inner.attrs, attr);
    let cap = super::abi::ib_caps(&qp.cap);
    attr.cap = cap;
    init.cap = cap;
    init.qp_type = bindings::ib_qp_type_IB_QPT_RC;
    init.sq_sig_type = if qp.sq_sig_all {
        bindings::ib_sig_type_IB_SIGNAL_ALL_WR
    } else {
        bindings::ib_sig_type_IB_SIGNAL_REQ_WR
    };
    0
}

/// # Safety
///
/// Called only by the RDMA core for a QP we created.
pub(super) unsafe extern "C" fn destroy_qp(
    ibqp: *mut bindings::ib_qp,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: per the contract; after this the core frees the `ib_qp`.
    unsafe {
        super::kverbs::destroy_gsi(ibqp);
        if let Some(qp) = (*ibqp.cast::<MetaQp>()).qp.take() {
            // First: the `ib_qp` is freed when we return (see `AsyncEvents`).
            qp.events.detach();
            if let Some(engine) = engine_of((*ibqp).device) {
                engine.detach(&qp);
            }
            // Dropped outside the table's lock (and after it, with `qp`, in process context).
            let removed = verbs_of((*ibqp).device).qps.lock().remove(qp.qpn);
            drop(removed);
        }
    }
    0
}

/// The doorbell: uverbs `POST_SEND` with no work requests (user QPs post into the SQ ring).
///
/// # Safety
///
/// Called only by the RDMA core for a QP we created.
pub(super) unsafe extern "C" fn post_send(
    ibqp: *mut bindings::ib_qp,
    wr: *const bindings::ib_send_wr,
    bad_wr: *mut *const bindings::ib_send_wr,
) -> c_int {
    if !wr.is_null() {
        // A kernel consumer's work requests (the GSI QP's).
        // SAFETY: per the contract.
        return unsafe { super::kverbs::post_send_kernel(ibqp, wr, bad_wr) };
    }
    // SAFETY: per the contract.
    let Some(qp) = (unsafe { qp_of(ibqp) }) else {
        return EINVAL.to_errno();
    };
    // SAFETY: the QP's device is live while the core calls us for it.
    match unsafe { engine_of((*ibqp).device) } {
        Some(engine) => engine.doorbell(qp),
        None => {
            if qp.state() == QpState::Err {
                qp.flush();
            }
        }
    }
    0
}
