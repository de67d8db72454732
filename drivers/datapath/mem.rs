// SPDX-License-Identifier: GPL-2.0

//! The transport's view of our MR table ([`Mem`]): every access on behalf of a QP, checked
//! against that QP's protection domain and rights.

use super::*;

/// The transport's view of our MR table: every access on behalf of a QP, checked against that
/// QP's protection domain and (remote accesses) its `qp_access_flags` as well as the MR's own
/// rights.
pub(super) struct Mem<'a> {
    verbs: &'a Verbs,
    /// The QP last asked about: a run or a batch mostly serves one.
    last: Option<QpRights>,
    /// SRQs found broken by userspace (`SrqTake::RingError`), for `ring_errors`.
    pub(super) ring_errors: u64,
}

/// What the checks need of a QP.
#[derive(Clone, Copy)]
struct QpRights {
    qpn: u32,
    pd: usize,
    access: u32,
    /// A kernel consumer's QP: its SGEs under `local_dma_lkey` name kernel memory.
    kmem: Option<KernelMemory>,
}

fn access_error(e: verbs::MrError) -> AccessError {
    match e {
        verbs::MrError::Bounds => AccessError::Bounds,
        verbs::MrError::Permission => AccessError::Permission,
    }
}

impl<'a> Mem<'a> {
    pub(super) fn new(verbs: &'a Verbs) -> Self {
        Mem {
            verbs,
            last: None,
            ring_errors: 0,
        }
    }

    fn rights(&mut self, qpn: u32) -> Result<QpRights, AccessError> {
        if let Some(r) = self.last.filter(|r| r.qpn == qpn) {
            return Ok(r);
        }
        let r = self
            .verbs
            .with_qp(qpn, |qp| QpRights {
                qpn,
                pd: qp.pd,
                access: qp.access_flags(),
                kmem: qp.kernel.map(|k| k.mem),
            })
            .ok_or(AccessError::Key)?;
        self.last = Some(r);
        Ok(r)
    }

    /// A kernel QP's SGE under `local_dma_lkey`: the kernel address `offset` bytes into it,
    /// if `len` bytes fit there. Err(Key) for a user QP (no user MR has that key).
    fn kernel_sge(
        &mut self,
        qpn: u32,
        sge: &Sge,
        offset: u32,
        len: usize,
    ) -> Result<(KernelMemory, u64), AccessError> {
        let mem = self.rights(qpn)?.kmem.ok_or(AccessError::Key)?;
        let end = u64::from(offset) + len as u64;
        if end > u64::from(sge.len) {
            return Err(AccessError::Bounds);
        }
        Ok((mem, sge.addr.wrapping_add(u64::from(offset))))
    }

    /// The list an SGE under `LIST_LKEY` names, copied out of QP `qpn`'s store (zero-length
    /// entries after its end); Err(Key) unless it is a list of that QP.
    fn long_list(&mut self, qpn: u32, sge: &Sge) -> Result<[Sge; vwqe::MAX_LIST], AccessError> {
        let r = ListRef::from_addr(sge.addr);
        if r.qpn != qpn {
            return Err(AccessError::Key);
        }
        let mut list = [Sge::default(); vwqe::MAX_LIST];
        self.verbs
            .with_qp(qpn, |qp| qp.inner.lock().lists.copy(r, &mut list))
            .flatten()
            .ok_or(AccessError::Key)?;
        Ok(list)
    }

    /// `f` applied to the MR `lkey` names, if it is in QP `qpn`'s protection domain (under
    /// the MR table's lock: see `Verbs::with_mr`).
    fn local_mr<R>(
        &mut self,
        qpn: u32,
        lkey: u32,
        f: impl FnOnce(&verbs::Mr) -> Result<R, verbs::MrError>,
    ) -> Result<R, AccessError> {
        let pd = self.rights(qpn)?.pd;
        self.verbs
            .with_mr(lkey, Some(pd), f)
            .ok_or(AccessError::Key)?
            .map_err(access_error)
    }

    /// `f` applied to what `rkey` reaches for `len` bytes at `va`, if the QP `qpn` grants
    /// `right` (an `IB_ACCESS_REMOTE_*` flag): an MR of the QP's protection domain, with `va`
    /// and `right` (the MR's own rights are checked on access); or, through a memory window
    /// (`mw.rs`), its MR with the address in it and the right the MR itself needs.
    fn remote_mr<R>(
        &mut self,
        qpn: u32,
        rkey: u32,
        (va, len, right): (u64, u64, u32),
        f: impl FnOnce(&verbs::Mr, u64, u32) -> Result<R, verbs::MrError>,
    ) -> Result<R, AccessError> {
        let r = self.rights(qpn)?;
        if r.access & right != right {
            return Err(AccessError::Permission);
        }
        if rkey & verbs::MW_KEY_BIT != 0 && rkey != verbs::INLINE_LKEY {
            return self
                .verbs
                .with_window(rkey, r.pd, qpn, (va, len, right), f)
                .map_err(|e| match e {
                    WindowError::Window(MwError::Bounds) => AccessError::Bounds,
                    WindowError::Window(MwError::Rights) => AccessError::Permission,
                    WindowError::Mr(e) => access_error(e),
                    WindowError::Window(_) | WindowError::NoMr => AccessError::Key,
                });
        }
        self.verbs
            .with_mr(rkey, Some(r.pd), |mr| f(mr, va, right))
            .ok_or(AccessError::Key)?
            .map_err(access_error)
    }
}

impl Memory for Mem<'_> {
    fn read_local(
        &mut self,
        qp: u32,
        sge: &Sge,
        offset: u32,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        if sge.lkey == verbs::INLINE_LKEY {
            // An inline payload: in the store of the QP named by the address's high half,
            // which must be the QP sending it.
            if (sge.addr >> 32) as u32 != qp {
                return Err(AccessError::Key);
            }
            let at = (sge.addr as u32 as usize).saturating_add(offset as usize);
            return self
                .verbs
                .with_qp(qp, |qp| {
                    let inner = qp.inner.lock();
                    let store = inner.inline.as_ref().ok_or(AccessError::Key)?;
                    store.read(at, out).ok_or(AccessError::Bounds)
                })
                .ok_or(AccessError::Key)?;
        }
        if sge.lkey == verbs::LIST_LKEY {
            // A list longer than the transport carries: each piece from its own SGE (never
            // another kept list: the rules refuse the kernel's keys in a posted list).
            let list = self.long_list(qp, sge)?;
            return for_each_piece(&list, offset, out.len(), |s, off, r| {
                let chunk = out.get_mut(r).ok_or(AccessError::Length)?;
                match s.lkey {
                    verbs::LIST_LKEY | verbs::INLINE_LKEY => Err(AccessError::Key),
                    _ => self.read_local(qp, s, off, chunk),
                }
            });
        }
        if sge.lkey == KERNEL_LKEY {
            let (mem, addr) = self.kernel_sge(qp, sge, offset, out.len())?;
            return mem.read(addr, out).map_err(|_| AccessError::Bounds);
        }
        let va = sge
            .addr
            .checked_add(u64::from(offset))
            .ok_or(AccessError::Bounds)?;
        self.local_mr(qp, sge.lkey, |mr| mr.read(va, out, 0))
    }

    fn write_local(
        &mut self,
        qp: u32,
        sge: &Sge,
        offset: u32,
        data: &[u8],
    ) -> Result<(), AccessError> {
        if sge.lkey == verbs::LIST_LKEY {
            let list = self.long_list(qp, sge)?;
            return for_each_piece(&list, offset, data.len(), |s, off, r| {
                let bytes = data.get(r).ok_or(AccessError::Length)?;
                match s.lkey {
                    verbs::LIST_LKEY | verbs::INLINE_LKEY => Err(AccessError::Key),
                    _ => self.write_local(qp, s, off, bytes),
                }
            });
        }
        if sge.lkey == KERNEL_LKEY {
            let (mem, addr) = self.kernel_sge(qp, sge, offset, data.len())?;
            return mem.write(addr, data).map_err(|_| AccessError::Bounds);
        }
        let va = sge
            .addr
            .checked_add(u64::from(offset))
            .ok_or(AccessError::Bounds)?;
        self.local_mr(qp, sge.lkey, |mr| mr.write(va, data, access::LOCAL_WRITE))
    }

    fn check_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        len: u32,
        access: Access,
    ) -> Result<(), AccessError> {
        let right = remote_right(access);
        self.remote_mr(qp, rkey, (va, u64::from(len), right), |mr, va, right| {
            mr.check(va, u64::from(len), right)
        })
    }

    fn write_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        data: &[u8],
    ) -> Result<(), AccessError> {
        let right = access::REMOTE_WRITE;
        let len = data.len() as u64;
        self.remote_mr(qp, rkey, (va, len, right), |mr, va, right| {
            mr.write(va, data, right)
        })
    }

    fn read_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        let right = access::REMOTE_READ;
        let len = out.len() as u64;
        self.remote_mr(qp, rkey, (va, len, right), |mr, va, right| {
            mr.read(va, out, right)
        })
    }

    /// A SEND_WITH_INV's rkey: a type 2 window of the QP's PD (`mw.rs`), or a kernel
    /// consumer's fast registration MR (`frwr.rs`).
    fn invalidate(&mut self, qp: u32, rkey: u32) -> Result<(), AccessError> {
        let pd = self.rights(qp)?.pd;
        if self.verbs.invalidate(pd, rkey) {
            Ok(())
        } else {
            Err(AccessError::Key)
        }
    }

    fn shared_recv(&mut self, qp: u32) -> Option<stream::RecvWqe> {
        let (taken, broke) = self
            .verbs
            .with_qp(qp, |qp| {
                let srq = qp.srq.as_ref()?;
                loop {
                    match srq.take() {
                        verbs::SrqTake::Taken(w) => {
                            // The responder takes it at once: a long list is committed
                            // as it is staged.
                            let mut inner = qp.inner.lock();
                            let list = verbs::transport_list(
                                &mut inner.lists,
                                Queue::Recv,
                                qp.qpn,
                                &w.local,
                                srq.max_sge,
                            );
                            let Some((local, staged)) = list else {
                                drop(inner);
                                qp.recv_error(w.wr_id, wc_status::LOC_LEN_ERR);
                                continue;
                            };
                            if staged {
                                inner.lists.commit(Queue::Recv);
                            }
                            break Some((
                                Some(stream::RecvWqe {
                                    wr_id: w.wr_id,
                                    local,
                                }),
                                false,
                            ));
                        }
                        // Unusable SGEs: it completes in error on this QP, like a bad post
                        // would; the next one may do.
                        verbs::SrqTake::Refused(wr_id) => {
                            qp.recv_error(wr_id, wc_status::LOC_LEN_ERR);
                        }
                        verbs::SrqTake::Empty => break Some((None, false)),
                        verbs::SrqTake::RingError => break Some((None, true)),
                    }
                }
            })
            .flatten()?;
        if broke {
            self.ring_errors += 1;
        }
        taken
    }

    fn atomic(&mut self, qp: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        if va % 8 != 0 {
            return Err(AccessError::Alignment);
        }
        let right = remote_right(op.access());
        self.remote_mr(qp, rkey, (va, 8, right), |mr, va, right| {
            mr.atomic(va, right, |old| op.apply(old))
        })
    }

    /// The region must grant the flush's placement type (`IB_ACCESS_FLUSH_GLOBAL`; the device
    /// has no persistent memory, so no region grants `IB_ACCESS_FLUSH_PERSISTENT`) and hold
    /// the range; a memory window's rkey is refused (windows grant no flush). Data is placed
    /// by CPU stores as it arrives, and every earlier message's is (the transport runs a
    /// FLUSH in message order): a full barrier makes it visible to every observer.
    fn flush(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        len: u64,
        persistent: bool,
        whole_region: bool,
    ) -> Result<(), AccessError> {
        if rkey & verbs::MW_KEY_BIT != 0 {
            return Err(AccessError::Key);
        }
        let right = if persistent {
            access::FLUSH_PERSISTENT
        } else {
            access::FLUSH_GLOBAL
        };
        // The QP's own access flags have no flush bits: the region's decide.
        self.remote_mr(qp, rkey, (va, len, 0), |mr, va, _| {
            if whole_region {
                mr.check(mr.iova, 0, right)
            } else {
                mr.check(va, len, right)
            }
        })?;
        core::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }
}

fn remote_right(access: Access) -> u32 {
    match access {
        Access::Read => access::REMOTE_READ,
        Access::Write => access::REMOTE_WRITE,
        Access::Atomic => access::REMOTE_ATOMIC,
    }
}
