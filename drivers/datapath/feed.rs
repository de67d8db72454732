// SPDX-License-Identifier: GPL-2.0

//! Feeding: a QP's posted WQEs taken from its rings (each judged once, copied out of
//! shared memory once) into its stream of the peer's connection; local operations (MW binds,
//! invalidations, fast registrations) carried out in send-queue order.

use super::*;

/// A judged SGE list as plain SGEs (UD gathers and scatters it itself).
pub(super) fn sges(l: &vwqe::SgList) -> ([Sge; vwqe::MAX_LIST], usize) {
    let mut list = [Sge::default(); vwqe::MAX_LIST];
    for (d, s) in list.iter_mut().zip(l.sges()) {
        *d = verbs::transport_sge(s);
    }
    (list, l.sges().len())
}

/// What became of a send WQE's inline payload.
#[derive(Clone, Copy)]
enum Stash {
    NotInline,
    /// Kept; the SGE that stands for it.
    Stored(Sge),
    /// No free slot now.
    Full,
    /// The QP has no transport stream to count it against.
    Invalid,
}

/// Keeps the inline payload of `work` (if it has one: its bytes are the first of `wqe.data`)
/// in the QP's store.
fn stash_inline(
    inner: &mut verbs::QpInner,
    wqe: &SendWqe,
    work: &SendWork,
    qpn: u32,
    stats: Option<(
        stream::requester::RequesterStats,
        stream::responder::ResponderStats,
    )>,
) -> Stash {
    let Payload::Inline(len) = work.payload else {
        return Stash::NotInline;
    };
    let (Some(store), Some((req, _))) = (inner.inline.as_mut(), stats) else {
        return Stash::Invalid;
    };
    // `judge_send` bounded `len` by the data area.
    let Some(data) = wqe.data.get(..len as usize) else {
        return Stash::Invalid;
    };
    match store.store(req.posted, data) {
        Some(offset) => Stash::Stored(Sge {
            addr: (u64::from(qpn) << 32) | u64::from(offset),
            len,
            lkey: verbs::INLINE_LKEY,
        }),
        None => Stash::Full,
    }
}

/// A judged send WQE as the transport takes it, its local data `local` (the SGE standing for
/// its inline payload, kept in the QP's [`verbs::InlineStore`], or its SGE list as
/// [`verbs::transport_list`] gives it).
fn send_wqe(w: &SendWork, local: SgList) -> Option<stream::SendWqe> {
    let opcode = match w.op {
        SendOp::Send => WrOpcode::Send,
        SendOp::SendWithImm => WrOpcode::SendWithImm,
        SendOp::SendWithInv => WrOpcode::SendWithInv,
        SendOp::RdmaWrite => WrOpcode::RdmaWrite,
        SendOp::RdmaWriteWithImm => WrOpcode::RdmaWriteWithImm,
        SendOp::RdmaRead => WrOpcode::RdmaRead,
        SendOp::CmpSwap => WrOpcode::CmpSwap,
        SendOp::FetchAdd => WrOpcode::FetchAdd,
        SendOp::AtomicWrite => WrOpcode::AtomicWrite,
        SendOp::Flush => WrOpcode::Flush,
        // Carried out by the feeder (`Engine::local_op`), never by the transport.
        SendOp::BindMw | SendOp::LocalInv | SendOp::RegMr => return None,
    };
    let mut t = stream::SendWqe::new(w.wr_id, opcode, local).remote(w.remote_addr, w.rkey);
    if let Some(imm) = w.imm {
        t = t.imm(imm);
    }
    if w.op == SendOp::SendWithInv {
        // The rkey the receiver invalidates travels where immediate data would.
        t = t.imm(w.rkey);
    }
    if let Some((compare_add, swap)) = w.atomic {
        t = t.atomic(compare_add, swap);
    }
    t.signaled = w.signaled;
    t.solicited = w.solicited;
    Some(t)
}

impl Engine {
    /// Feeds the QPs on the feed queue; those that want another round stay on it.
    pub(super) fn feed_queued(&self, p: &mut PeerInner, now: u64) {
        let PeerInner {
            conn, qps, feed, ..
        } = p;
        let mut again = false;
        for &sid in feed.iter() {
            if let Some(slot) = qps.get_mut(usize::from(sid.0)) {
                // Failed before this round: its transport flushes come out of this round.
                let failed_before = slot.failed;
                let fed = Self::feed(&self.verbs, conn, slot, sid, now);
                if fed == Fed::RingError {
                    self.counters.inc(Counter::RingErrors);
                }
                if failed_before {
                    slot.failed = false;
                }
                slot.queued = fed != Fed::Done;
                again |= slot.queued;
            }
        }
        if again {
            feed.retain(|sid| qps.get(usize::from(sid.0)).is_some_and(|s| s.queued));
        } else {
            feed.clear();
        }
    }

    /// Copies posted WQEs out of a QP's rings into its stream while there is room; in the
    /// error state flushes them instead (`Qp::flush`).
    ///
    /// Userspace may have written anything into its rings: a producer index claiming more
    /// than a ring holds, or a WQE the provider could not have written
    /// (`sys::send_wqe_decodes`, `sys::recv_wqe_decodes`), fails the QP (`Qp::fatal`:
    /// the error state, `IB_EVENT_QP_FATAL`) and its stream. The WQE stays in the ring and
    /// flushes with the others, after what the transport held for the QP: that flushes as
    /// the run's next round delivers its completions, and the rings wait for a feed after
    /// that ([`QpSlot::failed`]).
    pub(super) fn feed(
        verbs: &Verbs,
        conn: &mut Conn,
        slot: &mut QpSlot,
        sid: StreamId,
        now: u64,
    ) -> Fed {
        let QpSlot { qp, failed, .. } = slot;
        let Some(qp) = qp.as_ref() else {
            return Fed::Done;
        };
        if *failed {
            return Fed::Again;
        }
        let mut inner = qp.inner.lock();
        if inner.state == QpState::Err {
            drop(inner);
            qp.flush();
            return Fed::Done;
        }
        // Receives are taken from RTR on, sends only in RTS.
        let receiving = matches!(inner.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
        let sending = inner.state == QpState::Rts;
        let mut broken = false;
        if let Some(rq) = qp.queues.rq.as_ref().filter(|_| receiving) {
            loop {
                let wqe = match rq.peek() {
                    Ok(Some(wqe)) => wqe,
                    Ok(None) => break,
                    Err(_) => {
                        broken = true;
                        break;
                    }
                };
                let judged = match judge_recv(&wqe) {
                    Judged::Usable(w) => {
                        let max = qp.cap.max_recv_sge;
                        verbs::transport_list(&mut inner.lists, Queue::Recv, qp.qpn, &w.local, max)
                    }
                    Judged::Refused => None,
                    Judged::Fatal => {
                        broken = true;
                        break;
                    }
                };
                // Unusable SGEs (or a list longer than the QP's max_recv_sge): the WQE
                // completes in error, like a bad post would.
                let Some((local, staged)) = judged else {
                    rq.pop();
                    qp.recv_error(wqe.wr_id, wc_status::LOC_LEN_ERR);
                    continue;
                };
                let posted = conn.post_recv(
                    sid,
                    stream::RecvWqe {
                        wr_id: wqe.wr_id,
                        local,
                    },
                );
                match posted {
                    Ok(()) => {
                        rq.pop();
                        if staged {
                            inner.lists.commit(Queue::Recv);
                        }
                    }
                    Err(_) => break,
                }
            }
        }
        if let (Some(store), Some((req, _))) = (inner.inline.as_mut(), conn.stream_stats(sid)) {
            store.release(req.completed);
        }
        while sending && !broken {
            let wqe = match qp.queues.sq.peek() {
                Ok(Some(wqe)) => wqe,
                Ok(None) => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            };
            // A kernel consumer's ring holds what the kernel wrote (REG_MR among it).
            let judge = if qp.kernel.is_some() {
                judge_kernel_send
            } else {
                judge_send
            };
            let work = match judge(&wqe, qp.sq_sig_all, inner.inline.is_some()) {
                // A UC QP has no READ, atomics, SEND with invalidate, ATOMIC WRITE or FLUSH
                // (the provider refuses them at post).
                Judged::Usable(w) if qp.qp_type == QpType::Uc && !w.op.on_uc() => None,
                Judged::Usable(w) => Some(w),
                Judged::Refused => None,
                Judged::Fatal => {
                    broken = true;
                    break;
                }
            };
            // A bind, a registration or a local invalidate (it sends nothing): carried out
            // once every WQE before it has completed, so that its completion follows theirs.
            // An unsignaled, unfenced bind or registration that succeeds has no completion:
            // it takes effect at once, as rxe's requester does (no earlier WQE can be using a
            // window or an MR being bound or registered). A local invalidate always waits: an
            // earlier WQE still in flight may be resent and read through the lkey it revokes.
            if let Some(w) = work.filter(|w| w.op.is_local()) {
                if conn.send_outstanding(sid) != 0 {
                    let early = !w.signaled && !w.fence && w.op != SendOp::LocalInv;
                    // One that fails changes nothing: it waits, and fails in order.
                    if !(early && Self::apply_local(verbs, qp, &w)) {
                        conn.want_send_drained(sid);
                        break;
                    }
                    qp.queues.sq.pop();
                    continue;
                }
                qp.queues.sq.pop();
                if !Self::local_op(verbs, qp, &w) {
                    // Refused: completed in error, and the QP fails (what follows flushes).
                    inner.state = QpState::Err;
                    drop(inner);
                    let _ = conn.fail_stream(sid);
                    *failed = true;
                    return Fed::Again;
                }
                continue;
            }
            let stash = match &work {
                Some(w) => stash_inline(&mut inner, &wqe, w, qp.qpn, conn.stream_stats(sid)),
                None => Stash::NotInline,
            };
            let mut staged = false;
            let twqe = match (work, stash) {
                (Some(w), Stash::NotInline) => match w.payload {
                    Payload::Sges(l) => {
                        let max = qp.cap.max_send_sge;
                        verbs::transport_list(&mut inner.lists, Queue::Send, qp.qpn, &l, max)
                            .and_then(|(local, s)| {
                                staged = s;
                                send_wqe(&w, local)
                            })
                    }
                    Payload::Inline(_) => None,
                },
                (Some(w), Stash::Stored(sge)) => send_wqe(&w, SgList::single(sge)),
                // Every slot holds a payload still in flight: wait for completions (which
                // may be unsignaled: ask to hear of them).
                (Some(_), Stash::Full) => {
                    conn.want_send_room(sid);
                    break;
                }
                (None, _) | (Some(_), Stash::Invalid) => None,
            };
            let Some(twqe) = twqe else {
                // Refused (a bad SGE list, an operation the QP has not): it completes in
                // error once every WQE before it has, and the QP fails (what follows
                // flushes), as a local QP operation error does on hardware and on rxe.
                if conn.send_outstanding(sid) != 0 {
                    conn.want_send_drained(sid);
                    break;
                }
                qp.queues.sq.pop();
                let cqe = Cqe::status_only(
                    wqe.wr_id,
                    wc_status::LOC_QP_OP_ERR,
                    wc_opcode::for_send(wqe.opcode),
                    qp.qpn,
                );
                qp.complete_send(&cqe);
                inner.state = QpState::Err;
                drop(inner);
                let _ = conn.fail_stream(sid);
                *failed = true;
                return Fed::Again;
            };
            match conn.post_send(now, sid, twqe) {
                Ok(()) => {
                    qp.queues.sq.pop();
                    if staged {
                        inner.lists.commit(Queue::Send);
                    }
                }
                Err(_) => {
                    // Not taken: its payload is stashed again next time.
                    if let (Stash::Stored(_), Some(store)) = (stash, inner.inline.as_mut()) {
                        store.unstore_newest();
                    }
                    break;
                }
            }
        }
        if broken && qp.fatal(&mut inner) {
            drop(inner);
            let _ = conn.fail_stream(sid);
            *failed = true;
            return Fed::RingError;
        }
        Fed::Done
    }

    /// Carries out the bind, registration or local invalidate `w` of `qp` (`mw.rs`, `frwr.rs`)
    /// and completes it: with a CQE if it is signaled, or in error (`IB_WC_MW_BIND_ERR`,
    /// `IB_WC_LOC_QP_OP_ERR`, as rxe) always. Returns whether it succeeded.
    pub(super) fn local_op(verbs: &Verbs, qp: &Qp, w: &SendWork) -> bool {
        let done = Self::apply_local(verbs, qp, w);
        let (opcode, error) = match w.op {
            SendOp::BindMw => (wc_opcode::BIND_MW, wc_status::MW_BIND_ERR),
            SendOp::RegMr => (wc_opcode::REG_MR, wc_status::LOC_QP_OP_ERR),
            _ => (wc_opcode::LOCAL_INV, wc_status::LOC_QP_OP_ERR),
        };
        let status = if done { wc_status::SUCCESS } else { error };
        if w.signaled || !done {
            let cqe = Cqe::status_only(w.wr_id, status, opcode, qp.qpn);
            qp.complete_send(&cqe);
        }
        done
    }

    /// The effect of the bind, registration or local invalidate `w` of `qp`: whether it took
    /// place (a refused one changes nothing).
    pub(super) fn apply_local(verbs: &Verbs, qp: &Qp, w: &SendWork) -> bool {
        match (w.op, w.bind, w.reg) {
            (SendOp::BindMw, Some(b), _) => verbs.bind_mw(qp.pd, qp.qpn, &b).is_ok(),
            (SendOp::RegMr, _, Some(r)) => verbs.reg_fast(qp.pd, &r).is_ok(),
            (SendOp::LocalInv, _, _) => verbs.invalidate(qp.pd, w.rkey),
            _ => false,
        }
    }
}
