// SPDX-License-Identifier: GPL-2.0

//! The device's verbs ops (rxe_verbs.c's role): creating, changing and destroying CQs, SRQs,
//! MRs and QPs, the doorbell, and the kernel consumers' work requests (on the GSI QP, and on
//! their RC QPs, whose rings are in kernel memory only) and fast registration MRs. Safe
//! code: `crate::sys::ops` turns the core's calls into these, and the rules that judge user
//! input (`crate::verbs_core`) are host-tested.

use crate::datapath::PathInfo;
use crate::frwr::FastReg;
use crate::gsi::{GsiQp, PostError, GSI_MAX_SGE, GSI_MAX_WR, GSI_QPN};
use crate::sys::ops::{MrRequest, QpInit, QpMade, QpQuery, SrqAttr, VerbsOps};
use crate::sys::udata::Udata;
use crate::sys::{
    ring::{RingEntry, UserRing},
    CqNotifier, DeviceCtx, KernelMemory, KernelRcRecvs, KernelRcSends, KernelRecvs, KernelSends,
    QpEvents, SrqEvents, KERNEL_LKEY,
};
use crate::verbs::{
    limits, reserve_in, Caps, Cq, CqRing, Fifo, InlineStore, KernelQp, KernelWc, LongLists, Mr,
    MrMemory, Mw, MwObject, Qp, QpParts, QpQueues, QpState, Srq, MW_KEY_BIT,
};
use crate::verbs_core::{
    abi, caps, frwr,
    ib::{self, access, QpType},
    mr::{judge_rereg, MrShape, Rereg, ReregError},
    mw::{mw_type, MwState},
    qp::{modify_is_ok, ModifyAttr},
    udata::{self, DvModify},
};
use kernel::{prelude::*, sync::Arc};

/// The driver of `sys::ops`.
pub(crate) struct MetaRoceOps;

/// What the core's `ib_qp` holds: a QP of the data path (a user's RC, UC or UD QP, or a
/// kernel consumer's RC QP), or the GSI QP of a port (the MAD layer's).
pub(crate) enum QpObject {
    User(Arc<Qp>),
    Gsi(Arc<GsiQp>),
}

fn post_error(e: PostError) -> Error {
    match e {
        PostError::Invalid => EINVAL,
        PostError::Full => ENOMEM,
    }
}

#[vtable]
impl VerbsOps for MetaRoceOps {
    type Cq = Arc<Cq>;
    type Srq = Arc<Srq>;
    type Qp = QpObject;
    type Mr = Arc<Mr>;
    type Mw = MwObject;

    fn create_cq(
        dev: &DeviceCtx<'_>,
        cqe: u32,
        flags: u32,
        udata: Option<&Udata<'_>>,
        notifier: CqNotifier,
    ) -> Result<(Arc<Cq>, u32)> {
        if flags != 0 || !(1..=limits::MAX_CQE).contains(&cqe) {
            return Err(EINVAL);
        }
        if dev.verbs.cqs.load(core::sync::atomic::Ordering::Relaxed) >= limits::MAX_CQ {
            return Err(ENOMEM);
        }
        let (cq, entries) = match udata {
            // A kernel consumer's CQ (the MAD layer's): completions wait in kernel memory for
            // `poll_cq`.
            None => {
                let cq = Arc::pin_init(
                    Cq::new(CqRing::Kernel(Fifo::new(cqe)?), notifier),
                    GFP_KERNEL,
                )?;
                let entries = cq.capacity();
                (cq, entries)
            }
            Some(udata) => {
                // One slot more than asked for, so a full CQ of `cqe` entries fits.
                let ring = UserRing::new(&udata.ucontext()?, cqe + 1)?;
                let cq = Arc::pin_init(Cq::new(CqRing::User(ring), notifier), GFP_KERNEL)?;
                udata.respond_cq(cq.ring_info().ok_or(EINVAL)?)?;
                // The ring's extra slot is not the application's.
                let entries = cq.capacity() - 1;
                (cq, entries)
            }
        };
        dev.verbs
            .cqs
            .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        Ok((cq, entries))
    }

    fn resize_user_cq(
        _dev: &DeviceCtx<'_>,
        cq: &Arc<Cq>,
        cqe: u32,
        udata: &Udata<'_>,
    ) -> Result<u32> {
        if !(1..=limits::MAX_CQE).contains(&cqe) {
            return Err(EINVAL);
        }
        // As at create: one slot more than asked for. The provider maps the new ring from the
        // response once the call succeeded; a failed call leaves the CQ as it was.
        let ring = UserRing::new(&udata.ucontext()?, cqe + 1)?;
        let entries = ring.num_entries() - 1;
        udata.respond_cq(ring.info())?;
        cq.resize(ring)?;
        Ok(entries)
    }

    fn destroy_cq(dev: &DeviceCtx<'_>, cq: Arc<Cq>) {
        // QPs hold their own references, so their in-flight completions finish.
        drop(cq);
        dev.verbs
            .cqs
            .fetch_sub(1, core::sync::atomic::Ordering::Relaxed);
    }

    fn req_notify_cq(cq: &Arc<Cq>, solicited: bool, report_missed: bool) -> bool {
        cq.arm(solicited);
        // Kernel consumers may ask whether completions arrived before they armed.
        report_missed && cq.has_completions()
    }

    fn poll_cq(cq: &Arc<Cq>, max: usize, each: &mut dyn FnMut(usize, &KernelWc)) -> usize {
        cq.poll(max, each)
    }

    fn create_srq(
        dev: &DeviceCtx<'_>,
        srq_type: u32,
        attr: &SrqAttr,
        udata: Option<&Udata<'_>>,
        events: Arc<SrqEvents>,
    ) -> Result<(Arc<Srq>, SrqAttr)> {
        // Kernel consumers' SRQs are not supported.
        let udata = udata.ok_or(EOPNOTSUPP)?;
        let uctx = udata.ucontext()?;
        if srq_type != ib::srq_type::BASIC || attr.max_sge > limits::MAX_RECV_SGE {
            return Err(EINVAL);
        }
        caps::srq_wr(attr.max_wr).map_err(|_| EINVAL)?;
        let max_sge = attr.max_sge.max(1);
        let ring = UserRing::with_stride(&uctx, attr.max_wr, abi::recv_entry_size(max_sge))?;
        let srqn = dev.verbs.srqs.lock().reserve(1)?;
        let srq = match Arc::pin_init(Srq::new(srqn, max_sge, ring, events), GFP_KERNEL) {
            Ok(srq) => srq,
            Err(e) => {
                dev.verbs.srqs.lock().remove(srqn);
                return Err(e);
            }
        };
        srq.limit
            .store(attr.srq_limit, core::sync::atomic::Ordering::Relaxed);
        if let Err(e) = udata.respond_srq(srq.ring_info(), srqn) {
            dev.verbs.srqs.lock().remove(srqn);
            return Err(e);
        }
        dev.verbs.srqs.lock().insert(srqn, srq.clone());
        let got = SrqAttr {
            max_wr: srq.capacity(),
            max_sge,
            srq_limit: attr.srq_limit,
        };
        Ok((srq, got))
    }

    fn modify_srq(
        srq: &Arc<Srq>,
        attr: &SrqAttr,
        resize: bool,
        limit: bool,
        udata: Option<&Udata<'_>>,
    ) -> Result {
        if resize {
            // A user SRQ only (kernel consumers have none): a new ring, described to the
            // provider where its command says, then the posted WQEs move into it. A failed
            // move leaves the SRQ as it was; the provider maps the new ring only on success.
            let udata = udata.ok_or(EOPNOTSUPP)?;
            caps::srq_wr(attr.max_wr).map_err(|_| EINVAL)?;
            let out = udata.modify_srq_ring_out()?;
            let stride = abi::recv_entry_size(srq.max_sge);
            let ring = UserRing::with_stride(&udata.ucontext()?, attr.max_wr, stride)?;
            out.write(ring.info())?;
            srq.resize(ring)?;
        }
        if limit {
            if attr.srq_limit > srq.capacity() {
                return Err(EINVAL);
            }
            srq.limit
                .store(attr.srq_limit, core::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    fn query_srq(srq: &Arc<Srq>) -> SrqAttr {
        SrqAttr {
            max_wr: srq.capacity(),
            max_sge: srq.max_sge,
            srq_limit: srq.limit.load(core::sync::atomic::Ordering::Relaxed),
        }
    }

    fn destroy_srq(dev: &DeviceCtx<'_>, srq: Arc<Srq>) {
        dev.verbs.srqs.lock().remove(srq.srqn);
    }

    fn reg_user_mr(dev: &DeviceCtx<'_>, pd: usize, req: &MrRequest<'_>) -> Result<(Arc<Mr>, u32)> {
        if req.length == 0 || req.iova.checked_add(req.length).is_none() {
            return Err(EINVAL);
        }
        let mem = Arc::new(req.pin(req.access)?, GFP_KERNEL)?;
        let key = reserve_in(&dev.verbs.mrs, 1)?;
        let shape = MrShape {
            iova: req.iova,
            length: req.length,
            access: req.access,
            pd,
        };
        let mr = Mr::new(key, &shape, mem);
        match Arc::new(mr, GFP_KERNEL) {
            Ok(mr) => {
                dev.verbs.mrs.lock().insert(key, mr.clone());
                Ok((mr, key))
            }
            Err(e) => {
                dev.verbs.mrs.lock().remove(key);
                Err(e.into())
            }
        }
    }

    /// Any of the translation, the PD and the rights, judged by `verbs_core::mr`; the keys
    /// stay. A new MR takes the old one's place in the table under its lock, so the data path
    /// finds either whole; it shares the old one's pinned pages unless the translation
    /// changes (then new pages are pinned first, and the old ones go with the old MR).
    fn rereg_user_mr(
        dev: &DeviceCtx<'_>,
        old: &Arc<Mr>,
        flags: u32,
        pd: usize,
        req: &MrRequest<'_>,
    ) -> Result<Arc<Mr>> {
        let r = Rereg {
            flags,
            start: req.start,
            length: req.length,
            iova: req.iova,
            access: req.access,
            pd,
        };
        let (shape, repin) =
            judge_rereg(&old.shape(), old.memory_writable(), &r).map_err(|e| match e {
                ReregError::Unsupported => EOPNOTSUPP,
                ReregError::Invalid => EINVAL,
                ReregError::NotWritable => EACCES,
            })?;
        let mem = match (repin, old.memory()) {
            (false, Some(mem)) => mem,
            (true, _) => Arc::new(req.pin(shape.access)?, GFP_KERNEL)?,
            // A kernel consumer's fast registration MR: not the user's to rereg.
            (false, None) => return Err(EINVAL),
        };
        let mr = Arc::new(Mr::new(old.key, &shape, mem), GFP_KERNEL)?;
        // Whichever comes back (the replaced MR, or ours if the key had none) is dropped
        // here, after the lock.
        let replaced = dev.verbs.mrs.lock().replace(old.key, mr.clone());
        match replaced {
            Ok(prev) => {
                drop(prev);
                Ok(mr)
            }
            Err(ours) => {
                drop(ours);
                Err(EINVAL)
            }
        }
    }

    /// The DMA MR of a kernel PD: local access to kernel memory under [`KERNEL_LKEY`] (the
    /// device's `local_dma_lkey`, so the core only asks for one with
    /// `IB_PD_UNSAFE_GLOBAL_RKEY`). Remote access to all of kernel memory is refused.
    fn get_dma_mr(_dev: &DeviceCtx<'_>, flags: u32) -> Result<(Option<Arc<Mr>>, u32)> {
        if flags & (access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0 {
            return Err(EOPNOTSUPP);
        }
        Ok((None, KERNEL_LKEY))
    }

    fn mr_in_use(dev: &DeviceCtx<'_>, key: u32) -> Result {
        let bound = dev
            .verbs
            .mws
            .lock()
            .any(|w| w.state.binding.is_some_and(|b| b.mr_key == key));
        if bound {
            Err(EBUSY)
        } else {
            Ok(())
        }
    }

    fn dereg_mr(dev: &DeviceCtx<'_>, mr: Option<Arc<Mr>>, key: u32) {
        // Dropped outside the table's lock: the last reference releases the pages, which may
        // sleep. The data path uses an MR only under that lock (`Verbs::with_mr`), so once it
        // is out of the table nothing copies to or from its pages.
        // A fast registration MR's key is its last registration's (the consumer's `ib_mr`
        // may carry a key byte it never registered).
        let key = match mr.as_ref().map(|m| &m.mem) {
            Some(MrMemory::Fast(f)) => f.key(),
            _ => key,
        };
        let removed = if mr.is_some() {
            dev.verbs.mrs.lock().remove(key)
        } else {
            None
        };
        drop(removed);
        drop(mr);
    }

    /// A fast registration MR: in the MR table from now on, unregistered until an
    /// `IB_WR_REG_MR` (`frwr.rs`).
    fn alloc_mr(
        dev: &DeviceCtx<'_>,
        pd: usize,
        max_pages: u32,
        mem: KernelMemory,
    ) -> Result<(Arc<Mr>, u32)> {
        if max_pages == 0 || max_pages > frwr::MAX_PAGES {
            return Err(EINVAL);
        }
        let key = reserve_in(&dev.verbs.mrs, 1)?;
        let made = FastReg::new(pd, key, max_pages, mem)
            .and_then(|init| KBox::pin_init(init, GFP_KERNEL))
            .and_then(|fast| Arc::new(Mr::fast(key, pd, fast), GFP_KERNEL).map_err(Into::into));
        match made {
            Ok(mr) => {
                dev.verbs.mrs.lock().insert(key, mr.clone());
                Ok((mr, key))
            }
            Err(e) => {
                dev.verbs.mrs.lock().remove(key);
                Err(e)
            }
        }
    }

    fn map_begin(mr: &Arc<Mr>) {
        if let MrMemory::Fast(f) = &mr.mem {
            f.map_begin();
        }
    }

    fn map_page(mr: &Arc<Mr>, addr: u64) -> Result {
        match &mr.mem {
            MrMemory::Fast(f) => f.map_page(addr),
            MrMemory::User(_) => Err(EINVAL),
        }
    }

    fn map_end(mr: &Arc<Mr>, iova: u64, length: u64, page_size: u32) {
        if let MrMemory::Fast(f) = &mr.mem {
            f.map_end(iova, length, page_size);
        }
    }

    /// An unbound window of a random key byte, in the key space above the MRs'
    /// (`MW_KEY_BIT`).
    fn alloc_mw(dev: &DeviceCtx<'_>, pd: usize, kind: u32) -> Result<(MwObject, u32)> {
        if kind != mw_type::ONE && kind != mw_type::TWO {
            return Err(EINVAL);
        }
        let number = reserve_in(&dev.verbs.mws, 0)?;
        let rkey = number | MW_KEY_BIT;
        let state = MwState {
            kind,
            pd,
            rkey,
            binding: None,
        };
        match Arc::new(Mw { state }, GFP_KERNEL) {
            Ok(mw) => {
                dev.verbs.mws.lock().insert(number, mw);
                Ok((MwObject { index: number >> 8 }, rkey))
            }
            Err(e) => {
                dev.verbs.mws.lock().remove(number);
                Err(e.into())
            }
        }
    }

    fn dealloc_mw(dev: &DeviceCtx<'_>, mw: MwObject) {
        let mut t = dev.verbs.mws.lock();
        // Whatever key byte its binds gave it: the slot is the window's.
        let number = t.at(mw.index).map(|(n, _)| n);
        let removed = number.and_then(|n| t.remove(n));
        drop(t);
        drop(removed);
    }

    fn create_qp(
        dev: &DeviceCtx<'_>,
        init: &QpInit<'_, Self>,
        udata: Option<&Udata<'_>>,
        events: Arc<QpEvents>,
    ) -> Result<QpMade<QpObject>> {
        match (udata, init.kernel) {
            (Some(udata), _) => create_user_qp(dev, init, udata, events),
            (None, Some(mem)) if init.qp_type == QpType::Rc.to_ib() => {
                create_kernel_qp(dev, init, events, mem)
            }
            (None, _) => create_gsi(dev, init),
        }
    }

    fn modify_qp(
        dev: &DeviceCtx<'_>,
        qp: &QpObject,
        attr: &ModifyAttr,
        mask: u32,
        udata: Option<&Udata<'_>>,
    ) -> Result {
        match qp {
            QpObject::User(qp) => modify_user_qp(dev, qp, attr, mask, udata),
            QpObject::Gsi(qp) => {
                let cur = qp.state();
                let next = if mask & ib::attr_mask::STATE != 0 {
                    QpState::from_ib(attr.qp_state).ok_or(EINVAL)?
                } else {
                    cur
                };
                if !modify_is_ok(cur, next, QpType::Gsi, mask) {
                    return Err(EINVAL);
                }
                qp.modify(attr, mask)
            }
        }
    }

    fn query_qp(qp: &QpObject) -> Result<QpQuery> {
        Ok(match qp {
            QpObject::User(qp) => {
                let inner = qp.inner.lock();
                QpQuery::Connected {
                    state: inner.state,
                    qp_type: qp.qp_type,
                    attrs: inner.attrs,
                    caps: qp.cap,
                    sig_all: qp.sq_sig_all,
                }
            }
            QpObject::Gsi(qp) => {
                let (state, qkey, sq_psn, pkey_index) = qp.attrs();
                QpQuery::Gsi {
                    state,
                    qkey,
                    sq_psn,
                    pkey_index,
                    port: qp.port,
                    caps: qp.cap,
                }
            }
        })
    }

    fn destroy_qp(dev: &DeviceCtx<'_>, qp: QpObject) {
        match qp {
            QpObject::User(qp) => {
                if let Some(engine) = dev.engine {
                    if qp.qp_type == QpType::Ud {
                        engine.detach_mcast_everywhere(qp.qpn);
                    }
                    engine.detach(&qp);
                }
                // Dropped outside the table's lock (and after it, with `qp`, in process
                // context).
                let removed = dev.verbs.qps.lock().remove(qp.qpn);
                drop(removed);
            }
            QpObject::Gsi(qp) => {
                // After this nothing touches its buffers or completes.
                qp.kill();
                if let Some(engine) = dev.engine {
                    let _ = engine.set_gsi(qp.port, None);
                }
            }
        }
    }

    fn attach_mcast(dev: &DeviceCtx<'_>, qp: &QpObject, gid: &[u8; 16]) -> Result {
        match (qp, dev.engine) {
            (QpObject::User(qp), Some(engine)) if qp.qp_type == QpType::Ud => {
                engine.attach_mcast(qp.qpn, gid)
            }
            _ => Err(EINVAL),
        }
    }

    fn detach_mcast(dev: &DeviceCtx<'_>, qp: &QpObject, gid: &[u8; 16]) -> Result {
        match (qp, dev.engine) {
            (QpObject::User(qp), Some(engine)) if qp.qp_type == QpType::Ud => {
                engine.detach_mcast(qp.qpn, gid)
            }
            _ => Err(EINVAL),
        }
    }

    fn doorbell(dev: &DeviceCtx<'_>, qp: &QpObject) -> Result {
        let QpObject::User(qp) = qp else {
            return Err(EINVAL);
        };
        match dev.engine {
            Some(engine) if qp.qp_type == QpType::Ud => engine.ud_doorbell(qp),
            Some(engine) => engine.doorbell(qp),
            None => {
                if qp.state() == QpState::Err {
                    qp.flush();
                }
            }
        }
        Ok(())
    }

    /// Queues each; the receive thread sends.
    fn post_send_kernel(dev: &DeviceCtx<'_>, qp: &QpObject, wrs: &mut KernelSends<'_>) -> Result {
        let QpObject::Gsi(qp) = qp else {
            return Err(EOPNOTSUPP);
        };
        let mut queued = false;
        let mut result = Ok(());
        for wr in wrs {
            if let Err(e) = wr.and_then(|s| qp.post_send(s)) {
                result = Err(post_error(e));
                break;
            }
            queued = true;
        }
        if queued {
            if let Some(engine) = dev.engine {
                engine.kick_datagrams();
            }
        }
        result
    }

    /// Into the QP's send ring, then its doorbell.
    fn post_send_kernel_rc(
        dev: &DeviceCtx<'_>,
        qp: &QpObject,
        wrs: &mut KernelRcSends<'_>,
    ) -> Result {
        let QpObject::User(qp) = qp else {
            return Err(EOPNOTSUPP);
        };
        if qp.kernel.is_none() {
            return Err(EOPNOTSUPP);
        }
        let (posted, result) = produce_all(qp, &qp.queues.sq, wrs);
        if posted {
            if let Some(engine) = dev.engine {
                engine.kernel_doorbell(qp);
            }
        }
        result
    }

    /// Into the QP's receive ring; the data path takes them as its messages arrive (and
    /// flushes them at once in the error state).
    fn post_recv_kernel_rc(
        dev: &DeviceCtx<'_>,
        qp: &QpObject,
        wrs: &mut KernelRcRecvs<'_>,
    ) -> Result {
        let QpObject::User(qp) = qp else {
            return Err(EOPNOTSUPP);
        };
        let (Some(rq), Some(_)) = (qp.queues.rq.as_ref(), qp.kernel) else {
            return Err(EOPNOTSUPP);
        };
        let (_, result) = produce_all(qp, rq, wrs);
        // A QP in the error state completes them at once, flushed (`ib_drain_rq` waits for
        // that); the doorbell does it.
        if let Some(engine) = dev.engine {
            engine.kernel_doorbell(qp);
        }
        result
    }

    fn post_recv_kernel(_dev: &DeviceCtx<'_>, qp: &QpObject, wrs: &mut KernelRecvs<'_>) -> Result {
        // User QPs post receives into their rings.
        let QpObject::Gsi(qp) = qp else {
            return Err(EOPNOTSUPP);
        };
        for wr in wrs {
            wr.and_then(|r| qp.post_recv(r)).map_err(post_error)?;
        }
        Ok(())
    }
}

/// The long-list store of an RC or UC QP with capacities `cap`, on `srq` if it has one.
fn long_lists(cap: &Caps, srq: Option<&Srq>) -> Result<LongLists> {
    let recv = srq.map_or(cap.max_recv_sge, |s| s.max_sge);
    LongLists::new(cap.max_send_sge, recv)
}

/// A user RC or UD QP: its rings mapped in the caller's context, its number in the device's
/// table.
fn create_user_qp(
    dev: &DeviceCtx<'_>,
    init: &QpInit<'_, MetaRoceOps>,
    udata: &Udata<'_>,
    events: Arc<QpEvents>,
) -> Result<QpMade<QpObject>> {
    let uctx = udata.ucontext()?;
    let qp_type = match QpType::from_ib(init.qp_type) {
        Some(t @ (QpType::Rc | QpType::Uc | QpType::Ud)) => t,
        _ => return Err(EOPNOTSUPP),
    };
    if init.create_flags != 0 {
        return Err(EINVAL);
    }
    let (Some(send_cq), Some(recv_cq)) = (init.send_cq, init.recv_cq) else {
        return Err(EINVAL);
    };
    let srq = init.srq.cloned();
    let cap = Caps::check(&init.caps, srq.is_some()).map_err(|_| EINVAL)?;
    // Entries as large as the QP's SGEs need (`uapi/metaroce-abi.h`, entry sizes).
    let sq = UserRing::with_stride(
        &uctx,
        cap.max_send_wr,
        abi::send_entry_size(cap.max_send_sge),
    )?;
    let rq = if srq.is_none() {
        let stride = abi::recv_entry_size(cap.max_recv_sge);
        Some(UserRing::with_stride(&uctx, cap.max_recv_wr, stride)?)
    } else {
        None
    };
    let (sq_info, rq_info) = (sq.info(), rq.as_ref().map(|r| r.info()));
    // RC (and UC, which rides the same streams) resends: its inline payloads are kept while
    // the transport holds their WQEs. A UD datagram is built from the WQE's copy at once.
    let inline = if cap.max_inline_data > 0 && matches!(qp_type, QpType::Rc | QpType::Uc) {
        Some(InlineStore::new()?)
    } else {
        None
    };
    // RC and UC streams keep lists longer than the transport carries (UD gathers and
    // scatters a WQE's own list at once).
    let lists = if matches!(qp_type, QpType::Rc | QpType::Uc) {
        long_lists(&cap, srq.as_deref())?
    } else {
        LongLists::default()
    };
    let qpn = reserve_in(&dev.verbs.qps, 1)?;
    let parts = QpParts {
        qpn,
        qp_type,
        pd: init.pd,
        send_cq: send_cq.clone(),
        recv_cq: recv_cq.clone(),
        srq,
        sq_sig_all: init.sig_all,
        cap,
        queues: QpQueues { sq, rq },
        inline,
        lists,
        kernel: None,
    };
    let qp = match Arc::pin_init(Qp::new(parts, events), GFP_KERNEL) {
        Ok(qp) => qp,
        Err(e) => {
            dev.verbs.qps.lock().remove(qpn);
            return Err(e);
        }
    };
    if let Err(e) = udata.respond_qp(sq_info, rq_info, cap.max_inline_data) {
        dev.verbs.qps.lock().remove(qpn);
        return Err(e);
    }
    dev.verbs.qps.lock().insert(qpn, qp.clone());
    Ok(QpMade {
        qp: QpObject::User(qp),
        qpn,
        caps: cap,
    })
}

/// Puts each of a kernel consumer's work requests `wrs` into `ring` of `qp`, in order, under the
/// QP's post lock (consumers post from any context, several at once); stops at the first that
/// does not decode or fit. Returns whether any went in, and that error.
fn produce_all<W: RingEntry>(
    qp: &Qp,
    ring: &UserRing<W>,
    wrs: impl Iterator<Item = core::result::Result<W, PostError>>,
) -> (bool, Result) {
    let _serial = qp.post.lock();
    let mut posted = false;
    for wr in wrs {
        if let Err(e) = wr.map_err(post_error).and_then(|w| ring.produce(&w)) {
            return (posted, Err(e));
        }
        posted = true;
    }
    (posted, Ok(()))
}

/// A kernel consumer's RC QP: the same engine as a user's, its rings in kernel memory that
/// `post_send`/`post_recv` fill.
fn create_kernel_qp(
    dev: &DeviceCtx<'_>,
    init: &QpInit<'_, MetaRoceOps>,
    events: Arc<QpEvents>,
    mem: KernelMemory,
) -> Result<QpMade<QpObject>> {
    // No create flags (IB_QP_CREATE_*: integrity, block multicast loopback...) are offered.
    if init.create_flags != 0 {
        return Err(EINVAL);
    }
    let (Some(send_cq), Some(recv_cq)) = (init.send_cq, init.recv_cq) else {
        return Err(EINVAL);
    };
    let srq = init.srq.cloned();
    let cap = Caps::check(&init.caps, srq.is_some()).map_err(|_| EINVAL)?;
    let sq = UserRing::new_kernel(cap.max_send_wr)?;
    let rq = if srq.is_none() {
        Some(UserRing::new_kernel(cap.max_recv_wr)?)
    } else {
        None
    };
    let inline = if cap.max_inline_data > 0 {
        Some(InlineStore::new()?)
    } else {
        None
    };
    let lists = long_lists(&cap, srq.as_deref())?;
    let qpn = reserve_in(&dev.verbs.qps, 1)?;
    let parts = QpParts {
        qpn,
        qp_type: QpType::Rc,
        pd: init.pd,
        send_cq: send_cq.clone(),
        recv_cq: recv_cq.clone(),
        srq,
        sq_sig_all: init.sig_all,
        cap,
        queues: QpQueues { sq, rq },
        inline,
        lists,
        kernel: Some(KernelQp {
            ibqp: init.handle,
            mem,
        }),
    };
    let qp = match Arc::pin_init(Qp::new(parts, events), GFP_KERNEL) {
        Ok(qp) => qp,
        Err(e) => {
            dev.verbs.qps.lock().remove(qpn);
            return Err(e);
        }
    };
    dev.verbs.qps.lock().insert(qpn, qp.clone());
    Ok(QpMade {
        qp: QpObject::User(qp),
        qpn,
        caps: cap,
    })
}

/// A kernel consumer's QP: only the GSI QP (the MAD layer's, one per port).
fn create_gsi(dev: &DeviceCtx<'_>, init: &QpInit<'_, MetaRoceOps>) -> Result<QpMade<QpObject>> {
    if init.qp_type != QpType::Gsi.to_ib() {
        return Err(EOPNOTSUPP);
    }
    let c = &init.caps;
    if init.create_flags != 0
        || init.srq.is_some()
        || init.port == 0
        || init.port > crate::device::MAX_PLANES
        || c.max_send_wr > GSI_MAX_WR
        || c.max_recv_wr > GSI_MAX_WR
        || c.max_send_sge as usize > GSI_MAX_SGE
        || c.max_recv_sge as usize > GSI_MAX_SGE
    {
        return Err(EINVAL);
    }
    let engine = dev.engine.ok_or(ENODEV)?;
    let (Some(send_cq), Some(recv_cq)) = (init.send_cq, init.recv_cq) else {
        return Err(EINVAL);
    };
    let qp = Arc::pin_init(
        GsiQp::new(
            init.port,
            init.handle,
            send_cq.clone(),
            recv_cq.clone(),
            init.sig_all,
            c.max_send_wr.max(1),
            c.max_recv_wr.max(1),
        )?,
        GFP_KERNEL,
    )?;
    engine.set_gsi(init.port, Some(qp.clone()))?;
    Ok(QpMade {
        caps: qp.cap,
        qp: QpObject::Gsi(qp),
        qpn: GSI_QPN,
    })
}

fn modify_user_qp(
    dev: &DeviceCtx<'_>,
    qp: &Arc<Qp>,
    attr: &ModifyAttr,
    mask: u32,
    udata: Option<&Udata<'_>>,
) -> Result {
    let dv = dv_command(udata)?;
    // One modify at a time per QP: the check, the attach and the commit see one state.
    let _serial = qp.modify.lock();
    // Validate and attach with the new attributes first, then commit: a call that fails (an
    // IPv6 destination, no memory for the connection) leaves the QP as it was.
    let prev = qp.state();
    let engine = dev.engine;
    // The transition and every attribute are judged by the rules (`verbs_core::qp::prepare`;
    // a zero mask, the direct verbs' call, changes nothing in any state).
    let change = qp.prepare(attr, mask)?;
    // A UD QP rides no connection: nothing to attach.
    match (prev, change.state, engine) {
        (QpState::Init, QpState::Rtr, Some(engine)) if qp.qp_type != QpType::Ud => {
            engine.attach(qp, &change.attrs)?
        }
        (QpState::Rtr, QpState::Rts, Some(engine)) if qp.qp_type != QpType::Ud => {
            engine.start_sending(qp, &change.attrs)?
        }
        _ => {}
    }
    qp.commit(&change);
    match (change.state, engine) {
        (QpState::Err, Some(engine)) => engine.fail(qp),
        (QpState::Err, None) => qp.flush(),
        // Reset: off its connection (its stream closed; RTR opens a new one with the
        // attributes given then), its queues emptied.
        (QpState::Reset, engine) if prev != QpState::Reset => {
            if let Some(engine) = engine {
                engine.detach(qp);
            }
            qp.discard();
        }
        _ => {}
    }
    match (dv.planes, engine) {
        (Some(planes), Some(engine)) => engine.set_qp_planes(qp, planes),
        (Some(planes), None) => qp.set_planes(planes),
        _ => {}
    }
    match udata {
        Some(u) => dv_respond(u, qp, engine),
        None => Ok(()),
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

/// The direct verbs' answer to a `modify_qp`: the QP's planes, its connection and as many of
/// its paths as the caller's buffer takes (a stock `modify_qp` has no room and gets none).
fn dv_respond(udata: &Udata<'_>, qp: &Qp, engine: Option<&Arc<crate::datapath::Engine>>) -> Result {
    let Some(room) = udata.modify_qp_path_room() else {
        return Ok(());
    };
    let room = room.min(crate::device::MAX_PATHS as usize);
    let mut paths: KVec<PathInfo> = KVec::with_capacity(room, GFP_KERNEL)?;
    let mut nomem = false;
    let conn = engine.and_then(|e| {
        e.qp_connection(qp, |pi| {
            if paths.len() < room && !nomem {
                // Within the capacity reserved above: no allocation under the peer's lock.
                nomem = paths.push(pi, GFP_ATOMIC).is_err();
            }
        })
    });
    if nomem {
        return Err(ENOMEM);
    }
    udata.respond_modify_qp(qp.planes(), conn.as_ref(), &paths)
}
