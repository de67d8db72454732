// SPDX-License-Identifier: GPL-2.0

//! Memory windows, type 1 and type 2B (as rxe offers them): binding a window onto a part of
//! an MR, invalidating it, and what a remote access through its rkey may reach.
//!
//! - A **type 1** window belongs to its protection domain: it is bound (and rebound, and
//!   invalidated by a bind of length 0) with `ibv_bind_mw`, which the provider posts as a
//!   BIND_MW WQE, and any QP of its PD may reach it.
//! - A **type 2** window is bound by a BIND_MW work request to one QP, which alone may reach
//!   it, and must be invalidated (`LOCAL_INV`, or the window freed) before it is bound again.
//!   The work request chooses the rkey's low byte (`ibv_inc_rkey`), so that a peer holding
//!   the old rkey cannot use the new binding.
//!
//! Each rule cites the InfiniBand specification's compliance statement, as rxe's `rxe_mw.c`
//! does. A refused bind completes with `IBV_WC_MW_BIND_ERR` and a refused local invalidate
//! with `IBV_WC_LOC_QP_OP_ERR`; both move the QP to the error state. A refused remote access
//! is the requester's `IBV_WC_REM_ACCESS_ERR`.

use super::ib::access;
use super::mr::MrShape;

/// `enum ib_mw_type`.
pub mod mw_type {
    /// `IB_MW_TYPE_1`.
    pub const ONE: u32 = 1;
    /// `IB_MW_TYPE_2`.
    pub const TWO: u32 = 2;
}

/// The rights a window may grant (`mw_access_flags` of a bind).
pub const BIND_ACCESS: u32 = access::LOCAL_WRITE
    | access::REMOTE_WRITE
    | access::REMOTE_READ
    | access::REMOTE_ATOMIC
    | access::ZERO_BASED;

/// What a window is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The MR's key.
    pub mr_key: u32,
    /// Where the window starts, in the MR's address space.
    pub addr: u64,
    /// Its length in bytes.
    pub length: u64,
    /// The rights it grants (`IB_ACCESS_*`, `IB_ZERO_BASED`: remote addresses are offsets
    /// into the window).
    pub access: u32,
    /// Type 2: the QP it is bound to (the only one that may reach it); type 1: 0.
    pub qpn: u32,
}

/// A window as the bind rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwState {
    /// `mw_type::ONE` or `mw_type::TWO`.
    pub kind: u32,
    /// Its protection domain, by identity.
    pub pd: usize,
    /// Its rkey now.
    pub rkey: u32,
    /// Bound (a type 1 window bound with length 0 is unbound again).
    pub binding: Option<Binding>,
}

/// A BIND_MW work request, as the provider wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindRequest {
    /// The window's rkey as the consumer knows it: it names the window by its index (the
    /// consumer's byte may be an older one: libibverbs does not update a type 2 window's
    /// rkey after a bind).
    pub mw_rkey: u32,
    /// The rkey the window gets (only its low byte may differ).
    pub new_rkey: u32,
    /// The MR's lkey (ignored for a bind of length 0).
    pub mr_key: u32,
    /// Where the window starts.
    pub addr: u64,
    /// Its length (0: unbind, type 1 only).
    pub length: u64,
    /// The rights it grants.
    pub access: u32,
}

/// The MR a bind names, as the bind rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundMr {
    /// Its key.
    pub key: u32,
    /// Its shape (iova, length, rights, PD).
    pub shape: MrShape,
}

/// Why a bind, an invalidate or an access is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MwError {
    /// The key names no window of this device (stale, or another object's).
    NoWindow,
    /// The window is in the wrong state for it (a bound type 2 window bound again, an
    /// invalidate of a type 1 window or of an unbound one).
    State,
    /// Another protection domain, or (type 2) another QP.
    Owner,
    /// The new rkey names another window.
    Key,
    /// The MR is missing, or does not allow binding (`IB_ACCESS_MW_BIND`), or is zero-based.
    Mr,
    /// Rights the MR does not back (remote write or atomic without local write), or unknown.
    Rights,
    /// Outside the MR, or the access outside the window.
    Bounds,
}

/// Judges the bind `req` of window `mw` by QP `qpn` of protection domain `qp_pd`, with `mr`
/// the MR its `mr_key` names (None if none). Returns what the window becomes: its rkey and
/// binding (None: unbound); changes nothing.
pub fn judge_bind(
    mw: &MwState,
    req: &BindRequest,
    qp_pd: usize,
    qpn: u32,
    mr: Option<&BoundMr>,
) -> Result<(u32, Option<Binding>), MwError> {
    if req.mw_rkey & !0xff != mw.rkey & !0xff {
        return Err(MwError::NoWindow);
    }
    // The new rkey keeps the window's index; only the consumer's byte changes.
    if req.new_rkey & !0xff != mw.rkey & !0xff {
        return Err(MwError::Key);
    }
    // C10-72: the QP and the window are in one protection domain.
    if mw.pd != qp_pd {
        return Err(MwError::Owner);
    }
    if req.access & !BIND_ACCESS != 0 {
        return Err(MwError::Rights);
    }
    match mw.kind {
        mw_type::ONE => {
            // o10-36.2.2: a type 1 window is not zero-based.
            if req.access & access::ZERO_BASED != 0 {
                return Err(MwError::Rights);
            }
            if req.length == 0 {
                return Ok((req.new_rkey, None));
            }
        }
        _ => {
            // o10-37.2.30: a bound type 2 window is invalidated before it is bound again.
            if mw.binding.is_some() {
                return Err(MwError::State);
            }
            // o10-37.2.40: a type 2 window is bound to some memory.
            if req.length == 0 {
                return Err(MwError::Bounds);
            }
        }
    }
    let mr = match mr {
        Some(mr) if mr.key == req.mr_key => mr,
        _ => return Err(MwError::Mr),
    };
    // C10-73: the MR allows binding, is in the QP's domain and is not zero-based itself.
    if mr.shape.access & access::MW_BIND == 0 || mr.shape.access & access::ZERO_BASED != 0 {
        return Err(MwError::Mr);
    }
    if mr.shape.pd != qp_pd {
        return Err(MwError::Owner);
    }
    // C10-74: remote writes and atomics through the window need the MR's local write.
    if req.access & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0
        && mr.shape.access & access::LOCAL_WRITE == 0
    {
        return Err(MwError::Rights);
    }
    // C10-75: the window lies inside the MR.
    let end = req.addr.checked_add(req.length).ok_or(MwError::Bounds)?;
    let mr_end = mr
        .shape
        .iova
        .checked_add(mr.shape.length)
        .ok_or(MwError::Bounds)?;
    if req.addr < mr.shape.iova || end > mr_end {
        return Err(MwError::Bounds);
    }
    Ok((
        req.new_rkey,
        Some(Binding {
            mr_key: mr.key,
            addr: req.addr,
            length: req.length,
            access: req.access,
            qpn: if mw.kind == mw_type::ONE { 0 } else { qpn },
        }),
    ))
}

/// Judges a local invalidate of window `mw` through `rkey` by a QP of domain `qp_pd`: only a
/// bound type 2 window of that domain, named by its current rkey, is invalidated.
pub fn judge_invalidate(mw: &MwState, rkey: u32, qp_pd: usize) -> Result<(), MwError> {
    if rkey != mw.rkey {
        return Err(MwError::NoWindow);
    }
    if mw.kind != mw_type::TWO || mw.binding.is_none() {
        return Err(MwError::State);
    }
    if mw.pd != qp_pd {
        return Err(MwError::Owner);
    }
    Ok(())
}

/// Judges a remote access of `len` bytes at `va` needing `needed` rights through window `mw`
/// (named by `rkey`), arriving on QP `qpn` of domain `qp_pd`. Returns the MR's key and the
/// address in the MR's address space that the access starts at.
pub fn judge_access(
    mw: &MwState,
    rkey: u32,
    qp_pd: usize,
    qpn: u32,
    va: u64,
    len: u64,
    needed: u32,
) -> Result<(u32, u64), MwError> {
    if rkey != mw.rkey {
        return Err(MwError::NoWindow);
    }
    let b = mw.binding.ok_or(MwError::State)?;
    // Type 1: any QP of the window's domain; type 2: the QP it is bound to.
    if mw.pd != qp_pd || (mw.kind == mw_type::TWO && b.qpn != qpn) {
        return Err(MwError::Owner);
    }
    if b.access & needed != needed {
        return Err(MwError::Rights);
    }
    let off = if b.access & access::ZERO_BASED != 0 {
        va
    } else {
        va.checked_sub(b.addr).ok_or(MwError::Bounds)?
    };
    let end = off.checked_add(len).ok_or(MwError::Bounds)?;
    if end > b.length {
        return Err(MwError::Bounds);
    }
    Ok((b.mr_key, b.addr + off))
}

#[cfg(test)]
mod tests {
    use super::*;
    use access::{LOCAL_WRITE as LW, MW_BIND, REMOTE_READ as RR, REMOTE_WRITE as RW, ZERO_BASED};

    const PD: usize = 7;
    const QPN: u32 = 0x101;

    fn mr(access: u32) -> BoundMr {
        BoundMr {
            key: 0x1234,
            shape: MrShape {
                iova: 0x10000,
                length: 0x4000,
                access,
                pd: PD,
            },
        }
    }

    fn mw(kind: u32) -> MwState {
        MwState {
            kind,
            pd: PD,
            rkey: 0x0100_0000 | 0x42,
            binding: None,
        }
    }

    fn bind(m: &MwState, addr: u64, length: u64, acc: u32) -> BindRequest {
        BindRequest {
            mw_rkey: m.rkey,
            new_rkey: (m.rkey & !0xff) | 0x43,
            mr_key: 0x1234,
            addr,
            length,
            access: acc,
        }
    }

    #[test]
    fn type2_bind_access_invalidate() {
        let mut w = mw(mw_type::TWO);
        let m = mr(LW | MW_BIND);
        let (rkey, b) =
            judge_bind(&w, &bind(&w, 0x11000, 0x1000, RW | LW), PD, QPN, Some(&m)).unwrap();
        assert_eq!(rkey, 0x0100_0043);
        assert_eq!(b.unwrap().qpn, QPN);
        w.rkey = rkey;
        w.binding = b;
        // Reached through its new rkey, inside, with its rights, from its QP only.
        assert_eq!(
            judge_access(&w, rkey, PD, QPN, 0x11800, 0x800, RW),
            Ok((0x1234, 0x11800))
        );
        assert_eq!(
            judge_access(&w, 0x0100_0042, PD, QPN, 0x11800, 8, RW),
            Err(MwError::NoWindow)
        );
        assert_eq!(
            judge_access(&w, rkey, PD, QPN + 1, 0x11800, 8, RW),
            Err(MwError::Owner)
        );
        assert_eq!(
            judge_access(&w, rkey, PD, QPN, 0x11800, 8, RR),
            Err(MwError::Rights)
        );
        assert_eq!(
            judge_access(&w, rkey, PD, QPN, 0x11f00, 0x101, RW),
            Err(MwError::Bounds)
        );
        assert_eq!(
            judge_access(&w, rkey, PD, QPN, 0x10fff, 1, RW),
            Err(MwError::Bounds)
        );
        assert_eq!(
            judge_access(&w, rkey, PD, QPN, u64::MAX, 2, RW),
            Err(MwError::Bounds)
        );
        // Bound: not bound again before an invalidate.
        assert_eq!(
            judge_bind(&w, &bind(&w, 0x11000, 0x10, RW | LW), PD, QPN, Some(&m)),
            Err(MwError::State)
        );
        assert_eq!(
            judge_invalidate(&w, 0x0100_0042, PD),
            Err(MwError::NoWindow)
        );
        assert_eq!(judge_invalidate(&w, rkey, PD + 1), Err(MwError::Owner));
        assert_eq!(judge_invalidate(&w, rkey, PD), Ok(()));
        w.binding = None;
        assert_eq!(
            judge_access(&w, rkey, PD, QPN, 0x11800, 8, RW),
            Err(MwError::State)
        );
        assert_eq!(judge_invalidate(&w, rkey, PD), Err(MwError::State));
    }

    #[test]
    fn type1_binds_rebinds_and_unbinds_with_length_0() {
        let mut w = mw(mw_type::ONE);
        let m = mr(LW | MW_BIND);
        let (rkey, b) = judge_bind(&w, &bind(&w, 0x10000, 0x4000, RR), PD, QPN, Some(&m)).unwrap();
        assert_eq!(b.unwrap().qpn, 0, "any QP of the domain");
        w.rkey = rkey;
        w.binding = b;
        assert!(judge_access(&w, rkey, PD, QPN + 5, 0x13ff8, 8, RR).is_ok());
        assert_eq!(
            judge_access(&w, rkey, PD + 1, QPN, 0x13ff8, 8, RR),
            Err(MwError::Owner)
        );
        // Rebound while bound, then unbound by length 0 (no MR needed).
        let r = bind(&w, 0x12000, 0x100, RR);
        let (rkey2, b2) = judge_bind(&w, &r, PD, QPN, Some(&m)).unwrap();
        assert_eq!(b2.unwrap().addr, 0x12000);
        w.rkey = rkey2;
        w.binding = b2;
        let (rkey3, b3) = judge_bind(&w, &bind(&w, 0, 0, 0), PD, QPN, None).unwrap();
        assert_eq!(b3, None);
        w.rkey = rkey3;
        w.binding = b3;
        assert_eq!(
            judge_access(&w, rkey3, PD, QPN, 0x12000, 8, RR),
            Err(MwError::State)
        );
        // Type 1 is never zero-based, nor invalidated locally.
        assert_eq!(
            judge_bind(
                &w,
                &bind(&w, 0x10000, 8, RR | ZERO_BASED),
                PD,
                QPN,
                Some(&m)
            ),
            Err(MwError::Rights)
        );
        assert_eq!(judge_invalidate(&w, rkey3, PD), Err(MwError::State));
    }

    #[test]
    fn bind_refusals() {
        let w = mw(mw_type::TWO);
        let ok = bind(&w, 0x11000, 0x100, RW | LW);
        let m = mr(LW | MW_BIND);
        assert!(judge_bind(&w, &ok, PD, QPN, Some(&m)).is_ok());
        // The window's rkey names it by index (any key byte), the new one is of that index.
        let r = BindRequest {
            mw_rkey: w.rkey ^ 1,
            ..ok
        };
        assert!(judge_bind(&w, &r, PD, QPN, Some(&m)).is_ok());
        let r = BindRequest {
            mw_rkey: w.rkey + 0x100,
            ..ok
        };
        assert_eq!(
            judge_bind(&w, &r, PD, QPN, Some(&m)),
            Err(MwError::NoWindow)
        );
        let r = BindRequest {
            new_rkey: w.rkey + 0x100,
            ..ok
        };
        assert_eq!(judge_bind(&w, &r, PD, QPN, Some(&m)), Err(MwError::Key));
        // Another domain's QP, an MR of another domain.
        assert_eq!(
            judge_bind(&w, &ok, PD + 1, QPN, Some(&m)),
            Err(MwError::Owner)
        );
        let mut other = m;
        other.shape.pd = PD + 1;
        assert_eq!(
            judge_bind(&w, &ok, PD, QPN, Some(&other)),
            Err(MwError::Owner)
        );
        // No MR, another MR, an MR without MW_BIND, a zero-based MR.
        assert_eq!(judge_bind(&w, &ok, PD, QPN, None), Err(MwError::Mr));
        let r = BindRequest {
            mr_key: 0x9999,
            ..ok
        };
        assert_eq!(judge_bind(&w, &r, PD, QPN, Some(&m)), Err(MwError::Mr));
        assert_eq!(
            judge_bind(&w, &ok, PD, QPN, Some(&mr(LW))),
            Err(MwError::Mr)
        );
        assert_eq!(
            judge_bind(&w, &ok, PD, QPN, Some(&mr(LW | MW_BIND | ZERO_BASED))),
            Err(MwError::Mr)
        );
        // Remote write through the window needs the MR's local write; unknown rights.
        assert_eq!(
            judge_bind(&w, &ok, PD, QPN, Some(&mr(MW_BIND))),
            Err(MwError::Rights)
        );
        let r = BindRequest {
            access: RW | (1 << 6),
            ..ok
        };
        assert_eq!(judge_bind(&w, &r, PD, QPN, Some(&m)), Err(MwError::Rights));
        // Outside the MR, wrapping, a type 2 bind of nothing.
        for (addr, length) in [(0xffff, 2), (0x13fff, 2), (u64::MAX, 2), (0x11000, 0)] {
            let r = BindRequest { addr, length, ..ok };
            assert_eq!(
                judge_bind(&w, &r, PD, QPN, Some(&m)),
                Err(MwError::Bounds),
                "{addr:x}+{length}"
            );
        }
    }

    #[test]
    fn zero_based_type2_window_takes_offsets() {
        let mut w = mw(mw_type::TWO);
        let m = mr(LW | MW_BIND);
        let (rkey, b) = judge_bind(
            &w,
            &bind(&w, 0x12000, 0x100, RW | ZERO_BASED),
            PD,
            QPN,
            Some(&m),
        )
        .unwrap();
        w.rkey = rkey;
        w.binding = b;
        assert_eq!(
            judge_access(&w, rkey, PD, QPN, 0x10, 0x10, RW),
            Ok((0x1234, 0x12010))
        );
        assert_eq!(
            judge_access(&w, rkey, PD, QPN, 0xf8, 0x10, RW),
            Err(MwError::Bounds)
        );
    }
}
