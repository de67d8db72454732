// SPDX-License-Identifier: GPL-2.0

//! Fast registration MRs (rxe_mr.c's fast-reg part): a kernel consumer allocates one
//! (`ib_alloc_mr`), stages a page list in it (`ib_map_mr_sg`), and registers it in its send
//! queue's order with an `IB_WR_REG_MR` work request; a `LOCAL_INV`, or a peer's SEND with
//! invalidate, makes it unreachable again. The rules are `verbs_core::frwr`'s (host-tested);
//! this is the object and its memory.
//!
//! The MR sits in the device's MR table from its allocation on, as an [`Mr`] whose memory is
//! a [`FastReg`]: registering renumbers its slot with the registration's key (so a peer
//! holding the previous key finds nothing), invalidating leaves the slot but makes every
//! access fail.

use crate::{
    sys::KernelMemory,
    verbs::{Mr, MrError, MrMemory, Verbs, MW_KEY_BIT},
    verbs_core::frwr::{self, FrwrError, FrwrState, Registration, Staged},
    verbs_core::wqe::RegRequest,
};
use kernel::{new_spinlock_irq, prelude::*, sync::Arc, sync::SpinLockIrq};

/// What changes, under one IRQ-safe lock (`ib_map_mr_sg` may be called in any context).
struct FastInner {
    state: FrwrState,
    staged: Staged,
    /// Page addresses `ib_map_mr_sg` staged (capacity: the MR's pages).
    staging: KVec<u64>,
    /// The registration's page addresses (capacity: the MR's pages).
    pages: KVec<u64>,
}

/// A fast registration MR's pages and state.
#[pin_data]
pub(crate) struct FastReg {
    mem: KernelMemory,
    #[pin]
    inner: SpinLockIrq<FastInner>,
}

impl FastReg {
    /// An unregistered MR of protection domain `pd` with key `key`, for `max_pages` pages.
    pub(crate) fn new(
        pd: usize,
        key: u32,
        max_pages: u32,
        mem: KernelMemory,
    ) -> Result<impl PinInit<Self>> {
        let staging = KVec::with_capacity(max_pages as usize, GFP_KERNEL)?;
        let pages = KVec::with_capacity(max_pages as usize, GFP_KERNEL)?;
        Ok(pin_init!(FastReg {
            mem,
            inner <- new_spinlock_irq!(
                FastInner {
                    state: FrwrState {
                        pd,
                        key,
                        max_pages,
                        reg: None,
                    },
                    staged: Staged::default(),
                    staging,
                    pages,
                },
                "metaroce_frwr"
            ),
        }))
    }

    /// Its key now.
    pub(crate) fn key(&self) -> u32 {
        self.inner.lock().state.key
    }

    /// `ib_map_mr_sg` begins: the staged list is emptied.
    pub(crate) fn map_begin(&self) {
        let mut i = self.inner.lock();
        i.staging.clear();
        i.staged = Staged::default();
    }

    /// One page of the list (`ib_sg_to_pages`' callback); ENOMEM past the MR's pages.
    pub(crate) fn map_page(&self, addr: u64) -> Result {
        self.inner
            .lock()
            .staging
            .push_within_capacity(addr)
            .map_err(|_| ENOMEM)
    }

    /// `ib_map_mr_sg` ends: the region `ib_sg_to_pages` computed.
    pub(crate) fn map_end(&self, iova: u64, length: u64, page_size: u32) {
        let mut i = self.inner.lock();
        let pages = i.staging.len() as u32;
        i.staged = Staged {
            iova,
            length,
            page_size,
            pages,
        };
    }

    /// Carries out an `IB_WR_REG_MR` of a QP of protection domain `qp_pd`: the staged list
    /// becomes the registration's. Returns the key it had.
    fn register(&self, qp_pd: usize, req: &RegRequest) -> Result<u32, FrwrError> {
        let mut guard = self.inner.lock();
        let i = &mut *guard;
        let reg = frwr::judge_reg(&i.state, qp_pd, req, &i.staged)?;
        i.pages.clear();
        for &p in i.staging.iter() {
            // Both hold the MR's pages at most.
            let _ = i.pages.push_within_capacity(p);
        }
        let old = i.state.key;
        i.state.key = req.key;
        i.state.reg = Some(reg);
        Ok(old)
    }

    /// A local invalidate, or a peer's SEND with invalidate, of `key`.
    fn invalidate(&self, qp_pd: usize, key: u32) -> Result<(), FrwrError> {
        let mut i = self.inner.lock();
        frwr::judge_invalidate(&i.state, qp_pd, key)?;
        i.state.reg = None;
        Ok(())
    }

    /// Whether `key` names it now (its protection domain is its `Mr`'s, which `with_mr`
    /// checks).
    pub(crate) fn owns(&self, key: u32) -> bool {
        self.key() == key
    }

    /// `f` applied to each piece of the `len` bytes at `va` (an access needing `needed`),
    /// with the kernel address of the piece and its place in the access.
    fn each_piece(
        &self,
        va: u64,
        len: usize,
        needed: u32,
        mut f: impl FnMut(u64, core::ops::Range<usize>) -> Result<(), MrError>,
    ) -> Result<(), MrError> {
        let i = self.inner.lock();
        let reg: &Registration = i.state.reg.as_ref().ok_or(MrError::Bounds)?;
        let start = reg.locate(va, len as u64, needed).map_err(map_error)?;
        let mut at = 0;
        for p in reg.pieces(start, len) {
            let page = *i.pages.get(p.page).ok_or(MrError::Bounds)?;
            f(page + p.offset as u64, at..at + p.len)?;
            at += p.len;
        }
        Ok(())
    }

    /// Checks that `[va, va + len)` is registered with `needed`.
    pub(crate) fn check(&self, va: u64, len: u64, needed: u32) -> Result<(), MrError> {
        let i = self.inner.lock();
        let reg = i.state.reg.as_ref().ok_or(MrError::Bounds)?;
        reg.locate(va, len, needed).map(|_| ()).map_err(map_error)
    }

    pub(crate) fn read(&self, va: u64, out: &mut [u8], needed: u32) -> Result<(), MrError> {
        let mem = self.mem;
        self.each_piece(va, out.len(), needed, |addr, r| {
            let dst = out.get_mut(r).ok_or(MrError::Bounds)?;
            mem.read(addr, dst).map_err(|_| MrError::Bounds)
        })
    }

    pub(crate) fn write(&self, va: u64, data: &[u8], needed: u32) -> Result<(), MrError> {
        let mem = self.mem;
        self.each_piece(va, data.len(), needed, |addr, r| {
            let src = data.get(r).ok_or(MrError::Bounds)?;
            mem.write(addr, src).map_err(|_| MrError::Bounds)
        })
    }

    pub(crate) fn atomic(
        &self,
        va: u64,
        needed: u32,
        op: impl Fn(u64) -> u64,
    ) -> Result<u64, MrError> {
        let mut old = None;
        let mem = self.mem;
        self.each_piece(va, 8, needed, |addr, r| {
            // An aligned word never crosses a page.
            if r.len() != 8 {
                return Err(MrError::Bounds);
            }
            old = Some(mem.atomic(addr, &op).map_err(|_| MrError::Bounds)?);
            Ok(())
        })?;
        old.ok_or(MrError::Bounds)
    }
}

fn map_error(e: FrwrError) -> MrError {
    match e {
        FrwrError::Permission => MrError::Permission,
        _ => MrError::Bounds,
    }
}

impl Verbs {
    /// Carries out the `IB_WR_REG_MR` `req` of a QP of protection domain `pd`: the MR its key's
    /// index names is registered and its slot renumbered with the new key.
    pub(crate) fn reg_fast(&self, pd: usize, req: &RegRequest) -> Result<(), FrwrError> {
        let mut mrs = self.mrs.lock();
        let (number, mr) = mrs.at(req.key >> 8).ok_or(FrwrError::Key)?;
        let MrMemory::Fast(fast) = &mr.mem else {
            return Err(FrwrError::Key);
        };
        fast.register(pd, req)?;
        let mr: Arc<Mr> = mr.clone();
        // The same object under its new number (a clone of it comes back: not the last
        // reference, so nothing is freed under the lock).
        let _ = mrs.update(number, req.key, mr);
        Ok(())
    }

    /// A local invalidate or a peer's SEND with invalidate of `key` for a QP of protection
    /// domain `pd`: of a memory window (`mw.rs`) or of a kernel consumer's fast registration
    /// MR, as the key says. Whether it took place (a refused one changes nothing).
    pub(crate) fn invalidate(&self, pd: usize, key: u32) -> bool {
        if key & MW_KEY_BIT != 0 {
            self.invalidate_mw(pd, key).is_ok()
        } else {
            self.invalidate_fast(pd, key).is_ok()
        }
    }

    /// Invalidates the fast registration MR `key` names for a QP of protection domain `pd`
    /// (a `LOCAL_INV`, or a peer's SEND with invalidate).
    fn invalidate_fast(&self, pd: usize, key: u32) -> Result<(), FrwrError> {
        self.mrs
            .lock()
            .with(key, |mr| match &mr.mem {
                MrMemory::Fast(fast) => fast.invalidate(pd, key),
                MrMemory::User(_) => Err(FrwrError::Key),
            })
            .unwrap_or(Err(FrwrError::Key))
    }
}
