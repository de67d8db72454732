// SPDX-License-Identifier: GPL-2.0

//! Memory windows (rxe_mw.c's role): a bind or a local invalidate as a QP's send queue
//! reaches it, and the MR and address a remote access through a window's rkey reaches. The
//! rules are `verbs_core::mw`'s; here they meet the device's tables.
//!
//! A window holds its MR by key (`verbs::Mw`), and an access through it finds the MR in the MR
//! table as any access does, under that table's lock: a window never keeps an MR's pages. An
//! MR with a window bound to it cannot be deregistered (`EBUSY`, `ops::mr_in_use`); one whose
//! bind raced with its deregistration, or whose MR moved to another PD, reaches nothing.

use crate::verbs::{Mr, MrError, Verbs};
use crate::verbs_core::{
    ib::access,
    mw::{judge_access, judge_bind, judge_invalidate, BindRequest, BoundMr, MwError, MwState},
};

/// Why an access through a window failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WindowError {
    /// The window refused it (key, state, owner, rights, bounds).
    Window(MwError),
    /// The MR is gone (or in another PD now).
    NoMr,
    /// The MR refused it (its memory moved under the window: bounds).
    Mr(MrError),
}

impl Verbs {
    /// The bind `req` by QP `qpn` of PD `pd` (a type 1 window's `ibv_bind_mw`, a type 2's
    /// BIND_MW work request): the window takes its new rkey and binding, or nothing changes.
    pub(crate) fn bind_mw(&self, pd: usize, qpn: u32, req: &BindRequest) -> Result<(), MwError> {
        let mw = self.mw_at(req.mw_rkey).ok_or(MwError::NoWindow)?;
        let mr = self.with_mr(req.mr_key, None, |m: &Mr| BoundMr {
            key: m.key,
            shape: m.shape(),
        });
        let (rkey, binding) = judge_bind(&mw, req, pd, qpn, mr.as_ref())?;
        let now = MwState {
            rkey,
            binding,
            ..mw
        };
        // A concurrent bind of the same window (type 1, from another QP) that came first
        // changed its rkey: this one is refused, as if it had come second.
        if self.set_mw(mw.rkey, now) {
            Ok(())
        } else {
            Err(MwError::NoWindow)
        }
    }

    /// A LOCAL_INV of `rkey` by a QP of PD `pd`: a bound type 2 window becomes unbound.
    pub(crate) fn invalidate_mw(&self, pd: usize, rkey: u32) -> Result<(), MwError> {
        let mw = self.mw(rkey).ok_or(MwError::NoWindow)?;
        judge_invalidate(&mw, rkey, pd)?;
        let now = MwState {
            binding: None,
            ..mw
        };
        if self.set_mw(rkey, now) {
            Ok(())
        } else {
            Err(MwError::NoWindow)
        }
    }

    /// `f` applied to the MR that window `rkey` reaches for `len` bytes at `va` needing the
    /// remote right `right`, for QP `qpn` of PD `pd`, with the address in the MR and the right
    /// the MR itself must have (its local write for writes and atomics: the window grants the
    /// remote right); under the MR table's lock, as `Verbs::with_mr`.
    pub(crate) fn with_window<R>(
        &self,
        rkey: u32,
        pd: usize,
        qpn: u32,
        (va, len, right): (u64, u64, u32),
        f: impl FnOnce(&Mr, u64, u32) -> Result<R, MrError>,
    ) -> Result<R, WindowError> {
        let mw = self
            .mw(rkey)
            .ok_or(WindowError::Window(MwError::NoWindow))?;
        let (mr_key, at) =
            judge_access(&mw, rkey, pd, qpn, va, len, right).map_err(WindowError::Window)?;
        let mr_right = if right & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0 {
            access::LOCAL_WRITE
        } else {
            0
        };
        self.with_mr(mr_key, Some(pd), |mr| f(mr, at, mr_right))
            .ok_or(WindowError::NoMr)?
            .map_err(WindowError::Mr)
    }
}
