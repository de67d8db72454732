// SPDX-License-Identifier: GPL-2.0

//! UD QPs of userspace (rxe_req.c's and rxe_resp.c's roles for UD): their sends leave as
//! MetaRoCE DATAGRAM packets (`docs/wire-format.md`), which belong to no connection, and the
//! DATAGRAMs that name them are placed into their receive queues behind a GRH, as a RoCE NIC
//! places a UD SEND.
//!
//! - The doorbell ([`Engine::ud_doorbell`], the `post_send` syscall) sends, in RTS, every WQE
//!   its SQ holds: each a datagram to the GID of its address vector (`abi::UdAv`), from the
//!   QP's port, with a UDP source port of its own (the entropy ECMP hashes, so that a UD QP's
//!   traffic spreads over the fabric's paths as a connection's does), and completes it. UD is
//!   unreliable: a datagram the network loses still completes successfully.
//! - An arriving DATAGRAM ([`Engine::ud_deliver`], the receive thread) is taken by the QP it
//!   names if that QP is a UD QP of the port it came in on, in RTR or later, with the Q_Key it
//!   carries; else it is dropped and counted (`datagrams_dropped`), as UD does. Its receive
//!   WQE (the QP's RQ or SRQ) gets the 40-byte GRH, then the payload.
//! - Errors as the verbs say: a WQE whose SGEs do not name the QP's memory completes with
//!   `IBV_WC_LOC_PROT_ERR`, one longer than the port's MTU with `IBV_WC_LOC_LEN_ERR`, and the
//!   QP goes to the error state (flushing what follows); a receive buffer too small for the
//!   datagram completes with `IBV_WC_LOC_LEN_ERR`. A WQE the provider cannot have written
//!   breaks the QP (`IB_EVENT_QP_FATAL`), as on RC.

use super::{datagrams::DgFrom, Engine, MAX_DATAGRAM};
use crate::{
    counters::Counter,
    gsi,
    net::IpAddr,
    transport::memory::{for_each_piece, AccessError, Sge},
    transport::wire::{BaseHeader, DatagramExt, Ext, Flags, Header, Opcode},
    verbs::{Cqe, Qp, QpQueues, QpState, SrqTake, Verbs},
    verbs_core::{
        ib::{self, access, mtu, wc_opcode, wc_status, QpType, WC_GRH, WC_WITH_IMM},
        wqe::{judge_recv, judge_ud_send, Judged, Payload, RecvWork, UdSendWork},
    },
};
use core::sync::atomic::{AtomicU32, Ordering};
use kernel::sync::Arc;

/// A Q_Key with this bit set in a work request means the QP's own.
const QKEY_OWN: u32 = 0x8000_0000;
/// Datagrams sent by UD QPs, for their source ports.
static UD_SEQ: AtomicU32 = AtomicU32::new(0);

/// The UDP source port of the next datagram of QP `qpn`: spread over the range, a different
/// one each time (a multiplicative hash of the QP and a sequence number).
fn ud_sport(qpn: u32) -> u16 {
    let seq = UD_SEQ.fetch_add(1, Ordering::Relaxed);
    let h = (qpn ^ seq.rotate_left(16)).wrapping_mul(0x9e37_79b1) >> 18;
    super::dynamic_port(h)
}

/// Why a send did not leave.
enum SendError {
    /// Its SGEs name memory the QP may not read.
    Protection,
    /// Longer than the port's MTU.
    Length,
}

impl Engine {
    /// The longest UD message: the port's active MTU in bytes (what `query_port` reports
    /// from the same link MTU), which a DATAGRAM's headers fit beside.
    fn ud_max_message(&self) -> u32 {
        mtu::bytes(mtu::largest_within(self.mtu())).unwrap_or(256)
    }

    /// The doorbell of a UD QP: sends what its SQ holds (in RTS; before, the WQEs wait) and
    /// completes each. Process context.
    pub(crate) fn ud_doorbell(self: &Arc<Self>, qp: &Arc<Qp>) {
        let mut scratch = self.datagrams.scratch.lock();
        loop {
            let (wqe, qkey, port) = {
                let mut inner = qp.inner.lock();
                if inner.state != QpState::Rts {
                    break;
                }
                match qp.queues.sq.peek() {
                    Ok(Some(w)) => {
                        qp.queues.sq.pop();
                        (w, inner.attrs.qkey, inner.attrs.port_num)
                    }
                    Ok(None) => break,
                    Err(_) => {
                        // A producer index beyond the ring.
                        qp.fatal(&mut inner);
                        self.counters.inc(Counter::RingErrors);
                        break;
                    }
                }
            };
            let work = match judge_ud_send(&wqe, qp.sq_sig_all) {
                Judged::Usable(w) => w,
                Judged::Refused => {
                    self.ud_send_failed(qp, wqe.wr_id, wc_status::LOC_LEN_ERR);
                    break;
                }
                Judged::Fatal => {
                    qp.fatal(&mut qp.inner.lock());
                    self.counters.inc(Counter::RingErrors);
                    break;
                }
            };
            let qkey = if work.remote_qkey & QKEY_OWN != 0 {
                qkey
            } else {
                work.remote_qkey
            };
            match self.ud_send(qp, &work, &wqe.data, qkey, port, &mut scratch) {
                Ok(()) => {
                    if work.signaled {
                        let mut cqe = Cqe::status_only(
                            work.wr_id,
                            wc_status::SUCCESS,
                            wc_opcode::SEND,
                            qp.qpn,
                        );
                        cqe.byte_len = work.len();
                        qp.send_cq.complete(&cqe, false);
                    }
                }
                Err(e) => {
                    let status = match e {
                        SendError::Protection => wc_status::LOC_PROT_ERR,
                        SendError::Length => wc_status::LOC_LEN_ERR,
                    };
                    self.ud_send_failed(qp, work.wr_id, status);
                    break;
                }
            }
        }
        drop(scratch);
        // Work posted in (or left by a move to) the error state completes flushed.
        if qp.state() == QpState::Err {
            qp.flush();
        }
    }

    /// A send WQE completed in error: the QP goes to the error state (the rest flushes).
    fn ud_send_failed(&self, qp: &Qp, wr_id: u64, status: u32) {
        let cqe = Cqe::status_only(wr_id, status, wc_opcode::SEND, qp.qpn);
        qp.send_cq.complete(&cqe, false);
        qp.set_error();
    }

    /// Builds the DATAGRAM of `w` in `buf` and sends it from the QP's port.
    fn ud_send(
        &self,
        qp: &Qp,
        w: &UdSendWork,
        wqe_data: &[u8],
        qkey: u32,
        port: u32,
        buf: &mut [u8],
    ) -> core::result::Result<(), SendError> {
        let len = w.len();
        if len > self.ud_max_message() {
            return Err(SendError::Length);
        }
        let header = Header {
            base: BaseHeader {
                opcode: if w.imm.is_some() {
                    Opcode::DatagramWithImm
                } else {
                    Opcode::Datagram
                },
                flags: Flags(Flags::FIRST | Flags::LAST).with(Flags::SOLICITED, w.solicited),
                dst_qp: w.remote_qpn,
                src_qp: qp.qpn,
                conn_id: 0,
                path_id: 0,
                plane: 0,
                psn: 0,
                msn: 0,
                timestamp: crate::sys::work::now_ns() as u32,
            },
            ext: Ext::Datagram(DatagramExt {
                qkey,
                pkey: 0xffff,
                payload_len: len,
                imm: w.imm,
            }),
        };
        let hl = header.emit(buf).map_err(|_| SendError::Length)?;
        let end = hl.checked_add(len as usize).ok_or(SendError::Length)?;
        if end > MAX_DATAGRAM {
            return Err(SendError::Length);
        }
        let out = buf.get_mut(hl..end).ok_or(SendError::Length)?;
        match w.payload {
            Payload::Inline(n) => {
                let src = wqe_data.get(..n as usize).ok_or(SendError::Length)?;
                out.copy_from_slice(src);
            }
            Payload::Sges(l) => {
                let (list, n) = super::sges(&l);
                gather(&self.verbs, qp.pd, list.get(..n).unwrap_or(&[]), out)?
            }
        }
        let dst = IpAddr::from_gid(&w.dgid);
        let plane = (port as usize).wrapping_sub(1);
        if let Some(data) = buf.get(..end) {
            // Lost on the way is lost: UD.
            let src = self.send_on(plane, &dst, ud_sport(qp.qpn), false, data);
            self.counters.inc(Counter::DatagramsSent);
            if let (Some(src), true) = (src, dst.is_multicast()) {
                self.mcast_loopback(plane, src, dst, &header, data, hl);
            }
        }
        Ok(())
    }

    /// A multicast datagram this device sent on `plane` from `src` to the group `dst`
    /// (`data`, its payload from byte `hl` on) is placed in this device's QPs attached to the
    /// group, as the IP stack's multicast loopback would: it loops nothing back for a tunnel
    /// socket (a tunnel transmit counts as a nested device transmit, for which `sk_mc_loop`
    /// says no). Counted as a received datagram (or a dropped one, if no member took it).
    fn mcast_loopback(
        &self,
        plane: usize,
        src: IpAddr,
        dst: IpAddr,
        header: &Header,
        data: &[u8],
        hl: usize,
    ) {
        let (Ext::Datagram(d), Some(payload), Ok(plane)) =
            (header.ext, data.get(hl..), u8::try_from(plane))
        else {
            return;
        };
        let from = DgFrom {
            plane,
            src,
            dst,
            len: data.len(),
        };
        // No member here: the stack would not have looped it back either.
        let counter = match self.mcast_deliver(&from, &header.base, &d, payload) {
            None => return,
            Some(true) => Counter::DatagramsRcvd,
            Some(false) => Counter::DatagramsDropped,
        };
        self.counters.inc(counter);
    }

    /// A DATAGRAM for QP `qpn` (`b.dst_qp`, or a member of the multicast group it was sent
    /// to), not the GSI QP: placed if it is a UD QP that takes it.
    pub(super) fn ud_deliver(
        &self,
        qpn: u32,
        from: &DgFrom,
        b: &BaseHeader,
        d: &DatagramExt,
        payload: &[u8],
    ) -> core::result::Result<(), ()> {
        let (grh, network) = gsi::make_grh(&from.src, &from.dst, from.len);
        let solicited = b.flags.has(Flags::SOLICITED);
        self.verbs
            .with_qp(qpn, |qp| {
                if qp.qp_type != QpType::Ud {
                    return Err(());
                }
                let work = {
                    let inner = qp.inner.lock();
                    let taking = matches!(inner.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
                    if !taking
                        || inner.attrs.qkey != d.qkey
                        || (inner.attrs.port_num as usize).wrapping_sub(1)
                            != usize::from(from.plane)
                    {
                        return Err(());
                    }
                    match take_recv(qp, &qp.queues) {
                        Taken::Work(w) => w,
                        Taken::Refused(wr_id) => {
                            drop(inner);
                            qp.recv_error(wr_id, wc_status::LOC_LEN_ERR);
                            return Err(());
                        }
                        Taken::None => return Err(()),
                        Taken::Broken => {
                            drop(inner);
                            qp.fatal(&mut qp.inner.lock());
                            self.counters.inc(Counter::RingErrors);
                            return Err(());
                        }
                    }
                };
                let total = grh.len() + payload.len();
                let mut cqe =
                    Cqe::status_only(work.wr_id, wc_status::SUCCESS, wc_opcode::RECV, qp.qpn);
                cqe.byte_len = total as u32;
                cqe.src_qp = b.src_qp;
                cqe.wc_flags = WC_GRH;
                cqe.sl = ib::ud_recv_sl(network);
                if let Some(imm) = d.imm {
                    cqe.imm_data = imm;
                    cqe.wc_flags |= WC_WITH_IMM;
                }
                let (list, n) = super::sges(&work.local);
                let sges = list.get(..n).unwrap_or(&[]);
                let placed = if (work.local.total() as usize) < total {
                    Err(wc_status::LOC_LEN_ERR)
                } else {
                    scatter(&self.verbs, qp.pd, sges, 0, &grh)
                        .and_then(|()| scatter(&self.verbs, qp.pd, sges, grh.len() as u32, payload))
                        .map_err(|_| wc_status::LOC_PROT_ERR)
                };
                if let Err(status) = placed {
                    cqe = Cqe::status_only(work.wr_id, status, wc_opcode::RECV, qp.qpn);
                }
                qp.recv_cq.complete(&cqe, solicited);
                placed.map_err(|_| ())
            })
            .unwrap_or(Err(()))
    }
}

/// What a UD QP's receive queue gave.
// A WQE of up to 32 SGEs, taken out of a ring and used at once: boxing it would allocate
// on the data path for every receive.
#[allow(clippy::large_enum_variant)]
enum Taken {
    Work(RecvWork),
    /// A WQE that cannot be used: it completes in error.
    Refused(u64),
    None,
    /// Userspace broke the ring.
    Broken,
}

/// The next receive WQE of `qp`: from its SRQ, or from its RQ `rq`.
fn take_recv(qp: &Qp, queues: &QpQueues) -> Taken {
    if let Some(srq) = &qp.srq {
        return match srq.take() {
            SrqTake::Taken(w) => Taken::Work(w),
            SrqTake::Refused(wr_id) => Taken::Refused(wr_id),
            SrqTake::Empty | SrqTake::RingError => Taken::None,
        };
    }
    let Some(rq) = &queues.rq else {
        return Taken::None;
    };
    match rq.peek() {
        Ok(Some(wqe)) => {
            rq.pop();
            match judge_recv(&wqe) {
                Judged::Usable(w) => Taken::Work(w),
                Judged::Refused => Taken::Refused(wqe.wr_id),
                Judged::Fatal => Taken::Broken,
            }
        }
        Ok(None) => Taken::None,
        Err(_) => Taken::Broken,
    }
}

/// Copies the QP's memory that `sges` name (in protection domain `pd`, local access) into
/// `out`, which is as long as they are in all.
fn gather(
    verbs: &Verbs,
    pd: usize,
    sges: &[Sge],
    out: &mut [u8],
) -> core::result::Result<(), SendError> {
    for_each_piece(sges, 0, out.len(), |s, off, range| {
        let chunk = out.get_mut(range).ok_or(AccessError::Length)?;
        let va = s
            .addr
            .checked_add(u64::from(off))
            .ok_or(AccessError::Bounds)?;
        verbs
            .with_mr(s.lkey, Some(pd), |mr| mr.read(va, chunk, 0))
            .ok_or(AccessError::Key)?
            .map_err(|_| AccessError::Permission)
    })
    .map_err(|e| match e {
        AccessError::Length => SendError::Length,
        _ => SendError::Protection,
    })
}

/// Writes `data` into the memory `sges` name (in `pd`, local write), from byte `offset` of
/// the list on.
fn scatter(
    verbs: &Verbs,
    pd: usize,
    sges: &[Sge],
    offset: u32,
    data: &[u8],
) -> core::result::Result<(), AccessError> {
    for_each_piece(sges, offset, data.len(), |s, off, range| {
        let bytes = data.get(range).ok_or(AccessError::Length)?;
        let va = s
            .addr
            .checked_add(u64::from(off))
            .ok_or(AccessError::Bounds)?;
        verbs
            .with_mr(s.lkey, Some(pd), |mr| {
                mr.write(va, bytes, access::LOCAL_WRITE)
            })
            .ok_or(AccessError::Key)?
            .map_err(|_| AccessError::Permission)
    })
}
