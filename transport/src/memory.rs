// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! The core's only window onto memory: a trait the caller implements with its memory-region
//! table (the kernel: MRs and umem pages; the simulator: `Vec`s).
//!
//! Local buffers are named by SGEs (lkey, address, length); the core never dereferences an
//! address itself. Remote accesses name (rkey, va); the implementation checks key, bounds and
//! access rights and answers with an [`AccessError`], which the core turns into a NAK.

use super::zero::{zero_valid, ZeroValid};

/// A scatter/gather element: `len` bytes at `addr` in the region named by `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Start address in the region's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region.
    pub lkey: u32,
}
zero_valid!(struct Sge { addr, len, lkey });

/// Most SGEs one WQE may carry.
pub const MAX_SGE: usize = 4;

/// A WQE's local buffer: up to [`MAX_SGE`] SGEs, used in order as one contiguous range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SgList {
    sges: [Sge; MAX_SGE],
    count: u8,
}
zero_valid!(struct SgList { sges, count });

impl SgList {
    /// A list of `sges`, or None if there are more than `MAX_SGE` or their total overflows u32.
    pub fn new(sges: &[Sge]) -> Option<SgList> {
        if sges.len() > MAX_SGE {
            return None;
        }
        let mut l = SgList {
            sges: [Sge::default(); MAX_SGE],
            count: 0,
        };
        for (d, s) in l.sges.iter_mut().zip(sges) {
            *d = *s;
        }
        l.count = sges.len() as u8;
        // The total must fit a message length.
        l.checked_total()?;
        Some(l)
    }

    /// A list of one SGE.
    pub fn single(sge: Sge) -> SgList {
        SgList::new(&[sge]).unwrap_or_default()
    }

    /// The SGEs, in order.
    pub fn sges(&self) -> &[Sge] {
        self.sges.get(..usize::from(self.count)).unwrap_or(&[])
    }

    fn checked_total(&self) -> Option<u32> {
        self.sges()
            .iter()
            .try_fold(0u32, |a, s| a.checked_add(s.len))
    }

    /// Total bytes.
    pub fn total(&self) -> u32 {
        self.checked_total().unwrap_or(0)
    }

    /// Calls `f(sge, offset_in_sge, range_in_data)` for each piece of `[offset, offset+len)`.
    /// Err(Length) if the range exceeds the list.
    pub fn for_each_piece(
        &self,
        offset: u32,
        len: usize,
        f: impl FnMut(&Sge, u32, core::ops::Range<usize>) -> Result<(), AccessError>,
    ) -> Result<(), AccessError> {
        for_each_piece(self.sges(), offset, len, f)
    }
}

/// Calls `f(sge, offset_in_sge, range_in_data)` for each piece of bytes `[offset, offset+len)`
/// of `sges` taken in order as one contiguous range (what [`SgList::for_each_piece`] does;
/// also for lists longer than an `SgList` holds, which a caller keeps itself).
/// Err(Length) if the range exceeds the list.
pub fn for_each_piece(
    sges: &[Sge],
    offset: u32,
    len: usize,
    mut f: impl FnMut(&Sge, u32, core::ops::Range<usize>) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
    let mut skip = offset;
    let mut done = 0usize;
    for s in sges {
        if done >= len {
            break;
        }
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let avail = usize::try_from(s.len - skip).unwrap_or(usize::MAX);
        let n = avail.min(len - done);
        f(s, skip, done..done + n)?;
        done += n;
        skip = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(AccessError::Length)
    }
}

/// Why a memory access failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessError {
    /// Unknown or invalid key.
    Key,
    /// Outside the region.
    Bounds,
    /// The region does not allow this access.
    Permission,
    /// Atomic address not 8-byte aligned.
    Alignment,
    /// Local buffer too short for the data.
    Length,
}

/// Remote access kinds, for [`Memory::check_remote`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// RDMA READ source.
    Read,
    /// RDMA WRITE destination.
    Write,
    /// Atomic target.
    Atomic,
}

/// An atomic operation on one 8-byte word (host byte order in memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Store `swap` if the word equals `compare`.
    CompareSwap {
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// Add `add` (wrapping).
    FetchAdd {
        /// Addend.
        add: u64,
    },
    /// Store `value` (ATOMIC WRITE: the word is never seen half written).
    Write {
        /// New value.
        value: u64,
    },
}

impl AtomicOp {
    /// The word's new value, given its old one.
    pub fn apply(self, old: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
            AtomicOp::FetchAdd { add } => old.wrapping_add(add),
            AtomicOp::Write { value } => value,
        }
    }

    /// The remote right it takes: an ATOMIC WRITE is a write (as rxe judges it), the others
    /// atomics.
    pub fn access(self) -> Access {
        match self {
            AtomicOp::Write { .. } => Access::Write,
            AtomicOp::CompareSwap { .. } | AtomicOp::FetchAdd { .. } => Access::Atomic,
        }
    }
}

/// Memory access the core calls into. All methods must be safe against any key or address:
/// they come from the wire.
///
/// `qp` is the local QP whose stream makes the access. The implementation checks that the
/// region belongs to that QP's protection domain, and for remote accesses also that the QP
/// grants the remote right (`IB_ACCESS_REMOTE_*` of its `qp_access_flags`) as well as the
/// region; a refusal is [`AccessError::Key`] (another PD's key is no key for this QP) or
/// [`AccessError::Permission`].
pub trait Memory {
    /// Copies `out.len()` bytes from a local SGE at `offset` within it (sending).
    fn read_local(
        &mut self,
        qp: u32,
        sge: &Sge,
        offset: u32,
        out: &mut [u8],
    ) -> Result<(), AccessError>;
    /// Copies `data` into a local SGE at `offset` within it (receiving, READ responses).
    fn write_local(
        &mut self,
        qp: u32,
        sge: &Sge,
        offset: u32,
        data: &[u8],
    ) -> Result<(), AccessError>;
    /// Checks that `[va, va+len)` under `rkey` allows `access`, without touching data.
    fn check_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        len: u32,
        access: Access,
    ) -> Result<(), AccessError>;
    /// RDMA WRITE placement.
    fn write_remote(&mut self, qp: u32, rkey: u32, va: u64, data: &[u8])
        -> Result<(), AccessError>;
    /// RDMA READ source.
    fn read_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        out: &mut [u8],
    ) -> Result<(), AccessError>;
    /// Executes an atomic and returns the original value; the region must grant
    /// [`AtomicOp::access`].
    fn atomic(&mut self, qp: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError>;
    /// An RDMA FLUSH for QP `qp`: makes what earlier messages placed in `[va, va + len)` under
    /// `rkey` (with `whole_region`, all of the region `rkey` names) visible to every observer,
    /// or persistent with `persistent`; the region must allow that flush (its access flags).
    /// Memory without flush keeps the default: refused.
    fn flush(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        len: u64,
        persistent: bool,
        whole_region: bool,
    ) -> Result<(), AccessError> {
        let _ = (qp, rkey, va, len, persistent, whole_region);
        Err(AccessError::Permission)
    }
    /// Invalidates, for QP `qp`, the memory window (or region) that `rkey` names: a
    /// SEND_WITH_INV's request, carried out before its receive completes. Memory without
    /// windows keeps the default: nothing to invalidate.
    fn invalidate(&mut self, qp: u32, rkey: u32) -> Result<(), AccessError> {
        let _ = (qp, rkey);
        Err(AccessError::Key)
    }
    /// The next receive WQE of the shared receive queue of QP `qp` (a stream with
    /// `StreamConfig::srq`), taken off that queue; None if it is empty (the responder then
    /// answers RNR). Memory without SRQs keeps the default.
    fn shared_recv(&mut self, qp: u32) -> Option<super::stream::RecvWqe> {
        let _ = qp;
        None
    }
}

/// [`Memory`] as the stream of one local QP sees it: every access names that QP.
pub struct QpMem<'a, M: Memory> {
    /// The memory.
    pub mem: &'a mut M,
    /// The local QP making the accesses.
    pub qp: u32,
}

impl<'a, M: Memory> QpMem<'a, M> {
    /// `mem` as QP `qp` sees it.
    pub fn new(mem: &'a mut M, qp: u32) -> Self {
        QpMem { mem, qp }
    }

    /// [`Memory::invalidate`] for this QP.
    pub fn invalidate(&mut self, rkey: u32) -> Result<(), AccessError> {
        self.mem.invalidate(self.qp, rkey)
    }

    /// [`Memory::read_local`] for this QP.
    pub fn read_local(
        &mut self,
        sge: &Sge,
        offset: u32,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        self.mem.read_local(self.qp, sge, offset, out)
    }

    /// [`Memory::write_local`] for this QP.
    pub fn write_local(&mut self, sge: &Sge, offset: u32, data: &[u8]) -> Result<(), AccessError> {
        self.mem.write_local(self.qp, sge, offset, data)
    }

    /// [`Memory::check_remote`] for this QP.
    pub fn check_remote(
        &mut self,
        rkey: u32,
        va: u64,
        len: u32,
        access: Access,
    ) -> Result<(), AccessError> {
        self.mem.check_remote(self.qp, rkey, va, len, access)
    }

    /// [`Memory::write_remote`] for this QP.
    pub fn write_remote(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), AccessError> {
        self.mem.write_remote(self.qp, rkey, va, data)
    }

    /// [`Memory::read_remote`] for this QP.
    pub fn read_remote(&mut self, rkey: u32, va: u64, out: &mut [u8]) -> Result<(), AccessError> {
        self.mem.read_remote(self.qp, rkey, va, out)
    }

    /// [`Memory::atomic`] for this QP.
    pub fn atomic(&mut self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        self.mem.atomic(self.qp, rkey, va, op)
    }

    /// [`Memory::flush`] for this QP.
    pub fn flush(
        &mut self,
        rkey: u32,
        va: u64,
        len: u64,
        persistent: bool,
        whole_region: bool,
    ) -> Result<(), AccessError> {
        self.mem
            .flush(self.qp, rkey, va, len, persistent, whole_region)
    }
}
