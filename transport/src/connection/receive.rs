// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Receiving: a datagram in ([`Connection::handle_packet`]): ACKs and NAKs for our
//! requests, and the sequenced packets (requests, responses, probes) of the peer's paths, placed
//! through the streams and acknowledged per path.

use super::*;

/// What one ACK's path entries say, for the connection's congestion control.
#[derive(Default)]
struct CcSample {
    acked: u32,
    marked: u32,
    max_srtt: u64,
    min_srtt: u64,
}

impl CcSample {
    fn add(&mut self, acked: u32, marked: u32, srtt: u64) {
        self.acked = self.acked.saturating_add(acked);
        self.marked = self.marked.saturating_add(marked);
        if srtt != 0 {
            self.max_srtt = self.max_srtt.max(srtt);
            self.min_srtt = if self.min_srtt == 0 {
                srtt
            } else {
                self.min_srtt.min(srtt)
            };
        }
    }
}

impl<P: PathSlots, S: StreamSlots> Connection<P, S> {
    /// Processes one arriving datagram.
    pub fn handle_packet(
        &mut self,
        now: u64,
        data: &[u8],
        arrival: Arrival,
        mem: &mut impl Memory,
    ) -> Result<(), RecvError> {
        self.paths_changed();
        self.stats.packets_in += 1;
        let view = match Packet::parse(data) {
            Ok(v) => v,
            Err(e) => {
                self.stats.parse_errors += 1;
                return Err(RecvError::Parse(e));
            }
        };
        let b = view.header.base;
        // HELLO and DATAGRAM are the device's (HELLO is how connection ids are learned).
        if matches!(view.header.ext, Ext::Hello(_) | Ext::Datagram(_)) {
            return Err(RecvError::DeviceLevel);
        }
        if b.conn_id != self.cfg.local_conn_id {
            self.stats.dropped_in += 1;
            return Err(RecvError::WrongConnection);
        }
        match view.header.ext {
            Ext::Ack(h) => {
                self.stats.acks_in += 1;
                let stall = self.cfg.stall_timeout;
                let (paths, streams, sched) =
                    (self.paths.as_mut(), &mut self.streams, &mut self.sched);
                let mut cc = CcSample::default();
                let mut reorder_extent = 0;
                // The stream whose packets the ACK resolved last, touched once for its run of
                // them (an ACK's entries mostly resolve runs of one stream's packets).
                let mut touched: Option<usize> = None;
                let mut newest_sent = self.delivered_sent;
                for pa in view.ack_paths() {
                    let i = usize::from(pa.path_id);
                    if i >= self.num_paths {
                        continue;
                    }
                    let mut pa = pa;
                    if !self.cfg.cc.ecn {
                        pa.ecn_ce = 0;
                        pa.busy = 0;
                    }
                    if let Some(p) = paths.get_mut(i) {
                        let sum = p.on_ack(now, &pa, |item, outcome, sent| {
                            if outcome == Outcome::Acked {
                                newest_sent = newest_sent.max(sent);
                            }
                            let Some(i) = apply_outcome(streams, now, item, outcome) else {
                                return;
                            };
                            if let Some(j) = touched.replace(i).filter(|&j| j != i) {
                                sched.touch(streams, j, stall);
                            }
                        });
                        let marked = u32::from(pa.ecn_ce) + u32::from(pa.busy);
                        cc.add(sum.acked, marked, p.rtt.srtt());
                        reorder_extent = reorder_extent.max(sum.reorder_extent);
                    }
                }
                if let Some(j) = touched {
                    sched.touch(streams, j, stall);
                }
                if reorder_extent > 0 {
                    // Reordering within one path is the fabric's doing (a reordering link):
                    // every path widens its reordering window, before it spuriously
                    // retransmits to learn the same.
                    for p in paths.iter_mut().take(self.num_paths) {
                        p.inflight.learn_reordering(reorder_extent);
                    }
                }
                if cc.acked > 0 {
                    self.delivered_at = now;
                }
                self.delivered_sent = newest_sent;
                self.cc
                    .on_ack(now, cc.acked, cc.marked, cc.max_srtt, cc.min_srtt);
                self.cc.on_grant(Grant {
                    rate_mbps: h.rate_hint_mbps,
                    share: h.share,
                });
                for sa in view.ack_streams() {
                    let Some(i) = sched.lookup(streams, sa.qp) else {
                        continue;
                    };
                    if let Some(s) = streams.slot_mut(i) {
                        s.req.on_stream_ack(now, sa.completed_msn);
                    }
                    sched.touch(streams, i, stall);
                }
                Ok(())
            }
            Ext::Nak(n) => {
                self.stats.naks_in += 1;
                if let Some(c) = self.stats.naks_in_by_code.get_mut(n.code as usize) {
                    *c += 1;
                }
                let i = self
                    .stream_index(b.dst_qp)
                    .ok_or(RecvError::UnknownStream)?;
                if let Some(s) = self.streams.slot_mut(i) {
                    let rnr_retry = s.cfg.rnr_retry;
                    let before = s.req.stats.rnr_naks;
                    s.req.on_nak(now, b.msn, n.code, n.value, rnr_retry);
                    self.stats.rnr_naks_in += s.req.stats.rnr_naks.wrapping_sub(before);
                }
                self.touch(i);
                Ok(())
            }
            Ext::Hello(_) | Ext::Datagram(_) => Err(RecvError::DeviceLevel),
            _ => self.handle_sequenced(now, &view, data.len(), arrival, mem),
        }
    }

    fn handle_sequenced(
        &mut self,
        now: u64,
        view: &super::super::wire::PacketView<'_>,
        len: usize,
        arrival: Arrival,
        mem: &mut impl Memory,
    ) -> Result<(), RecvError> {
        let b = view.header.base;
        let ecn_ce = arrival.ecn_ce;
        let pi = usize::from(b.path_id);
        if pi >= self.num_paths {
            self.stats.dropped_in += 1;
            return Err(RecvError::UnknownPath);
        }
        // First of all: a PSN beyond the path's receive window is no peer's, and dropped
        // before anything sees it, so a spoofed packet cannot slide the window past the real
        // ones, place data, elicit an ACK or touch the path's state.
        if self
            .paths
            .as_mut()
            .get_mut(pi)
            .is_some_and(|p| !p.check_window(b.psn))
        {
            self.stats.out_of_window_psn += 1;
            self.stats.dropped_in += 1;
            return Err(RecvError::OutOfWindow);
        }
        let mtu = self.cfg.mtu;
        let (verdict, completes) = if let Ext::Probe = view.header.ext {
            (Verdict::Accept, false)
        } else {
            let Some(si) = self.stream_index(b.dst_qp) else {
                // No such QP (closed, or never opened). Acknowledge the packet on its path so
                // the sender does not resend it as lost, and NAK requests so it fails fast.
                self.stats.dropped_in += 1;
                if let Some(p) = self.paths.as_mut().get_mut(pi) {
                    p.on_receive(now, b.psn, b.timestamp, arrival);
                }
                self.ack_now = true;
                if !matches!(
                    view.header.ext,
                    Ext::ReadResponse(_) | Ext::AtomicResponse(_)
                ) {
                    self.queue_nak(b.src_qp, b.dst_qp, b.msn, NakCode::RemoteOperational, 0);
                }
                return Err(RecvError::UnknownStream);
            };
            let Some(s) = self.streams.slot_mut(si) else {
                return Err(RecvError::UnknownStream);
            };
            let dups_before = s.resp.stats.duplicates;
            let completed_before = s.resp.completed_msn();
            let rnr_us = s.cfg.rnr_timer_us;
            let solicited = b.flags.has(Flags::SOLICITED);
            if s.cfg.srq && s.error().is_none() {
                // A QP on a shared receive queue takes the WQEs a message needs as it arrives.
                let rsn = match view.header.ext {
                    Ext::Send(x) => Some(x.rsn),
                    Ext::Write(x) if b.opcode == Opcode::RdmaWriteWithImm => Some(x.rsn),
                    _ => None,
                };
                if let Some(rsn) = rsn {
                    while s.resp.wants_recv(rsn) {
                        let Some(w) = mem.shared_recv(s.cfg.local_qp) else {
                            break;
                        };
                        // Cannot fail: `wants_recv` saw room.
                        if s.resp.post_recv(w).is_err() {
                            break;
                        }
                    }
                }
            }
            let v = if s.error().is_some() {
                // A QP in error answers requests with a NAK so the peer fails fast: the
                // message that failed it with its own NAK again (that one may have been lost),
                // the others with a remote operational error.
                match (view.header.ext, s.resp.failed()) {
                    (Ext::ReadResponse(_) | Ext::AtomicResponse(_), _) => Verdict::Accept,
                    _ if super::super::wire::seq_lt(b.msn, s.resp.completed_msn()) => {
                        Verdict::Accept
                    }
                    (_, Some(code)) if b.msn == s.resp.completed_msn() => Verdict::Nak(code, 0),
                    _ => Verdict::Nak(NakCode::RemoteOperational, 0),
                }
            } else {
                let mem = &mut QpMem::new(&mut *mem, s.cfg.local_qp);
                match view.header.ext {
                    Ext::Send(x) => s.resp.on_data(
                        b.opcode,
                        b.msn,
                        x.rsn,
                        0,
                        0,
                        x.offset,
                        x.total_len,
                        x.imm,
                        solicited,
                        view.payload,
                        mtu,
                        rnr_us,
                        mem,
                    ),
                    Ext::Write(x) => s.resp.on_data(
                        b.opcode,
                        b.msn,
                        x.rsn,
                        x.va,
                        x.rkey,
                        x.offset,
                        x.total_len,
                        x.imm,
                        solicited,
                        view.payload,
                        mtu,
                        rnr_us,
                        mem,
                    ),
                    Ext::ReadRequest(x) => {
                        s.resp.on_read_request(b.msn, x.va, x.rkey, x.len, mtu, mem)
                    }
                    Ext::Atomic(x) => s
                        .resp
                        .on_atomic(b.msn, x.va, x.rkey, x.compare, x.swap_add, b.opcode, mem),
                    Ext::ReadResponse(x) => match s.req.on_read_response(
                        now,
                        b.msn,
                        x.offset,
                        x.total_len,
                        view.payload,
                        mtu,
                        mem,
                    ) {
                        RespVerdict::Accept => Verdict::Accept,
                        RespVerdict::Drop => Verdict::Drop,
                    },
                    Ext::AtomicResponse(orig) => {
                        s.req.on_atomic_response(now, b.msn, orig, mem);
                        Verdict::Accept
                    }
                    _ => Verdict::Accept,
                }
            };
            if let Some(code) = s.resp.failed() {
                s.set_error(CqStatus::from_nak(code));
            }
            self.stats.duplicates += s.resp.stats.duplicates.wrapping_sub(dups_before);
            let report = !matches!(
                view.header.ext,
                Ext::ReadResponse(_) | Ext::AtomicResponse(_)
            );
            // The packet moved the completion point: see the ACK decision below.
            let completes = report && s.resp.completed_msn() != completed_before;
            if report {
                s.ack_dirty = true;
                self.sched.push(&mut self.streams, ACK, si);
            }
            self.touch(si);
            match v {
                Verdict::Nak(code, value) => self.queue_nak(b.src_qp, b.dst_qp, b.msn, code, value),
                Verdict::NakMsn(msn, code) => self.queue_nak(b.src_qp, b.dst_qp, msn, code, 0),
                Verdict::Accept | Verdict::Drop => {}
            }
            (v, completes)
        };
        if verdict == Verdict::Drop {
            self.stats.dropped_in += 1;
            return Ok(());
        }
        if let Some(p) = self.paths.as_mut().get_mut(pi) {
            p.on_receive(now, b.psn, b.timestamp, arrival);
        }
        // Inbound data makes the peer one of the device's active senders.
        if !matches!(view.header.ext, Ext::Probe) {
            self.rx_packets = self.rx_packets.saturating_add(1);
            self.rx_bytes = self
                .rx_bytes
                .saturating_add(len as u64 + u64::from(PACKET_OVERHEAD));
            // The receiver's own marks drain the grants as the network's do.
            let marked = ecn_ce || arrival.rx_busy;
            self.rx_marked = self.rx_marked.saturating_add(u32::from(marked));
        }
        self.unacked = self.unacked.saturating_add(1);
        // A packet that completes a message is answered at once, as its ACK_REQ asked: every
        // message's last packet carries ACK_REQ, and messages complete in MSN order, so one
        // completed by another packet had its ACK_REQ answered before it was complete (the
        // last packet overtook others on another path, or an earlier message was not
        // complete yet). That answer could not report it; waiting `ack_delay` for the next
        // would hold the requester's completion that long (and a collective's next step). So
        // no per-stream record of the unanswered ACK_REQ is needed.
        if b.flags.has(Flags::ACK_REQ)
            || completes
            || self.unacked >= self.cfg.ack_every
            || matches!(verdict, Verdict::Nak(..) | Verdict::NakMsn(..))
        {
            self.ack_now = true;
        } else if !self.ack_armed || self.ack_repeat {
            self.ack_armed = true;
            self.ack_repeat = false;
            self.ack_at = now.saturating_add(self.cfg.path.ack_delay);
        }
        Ok(())
    }

    pub(super) fn queue_nak(
        &mut self,
        dst_qp: u32,
        src_qp: u32,
        msn: u32,
        code: NakCode,
        value: u32,
    ) {
        // One pending NAK per message is enough.
        for k in 0..self.nak_len {
            if let Some(n) = self.naks.get((self.nak_head + k) % NAK_QUEUE) {
                if n.dst_qp == dst_qp && n.msn == msn && n.code == code as u8 {
                    return;
                }
            }
        }
        if self.nak_len >= NAK_QUEUE {
            self.stats.naks_dropped += 1;
            return;
        }
        if let Some(n) = self
            .naks
            .get_mut((self.nak_head + self.nak_len) % NAK_QUEUE)
        {
            *n = PendingNak {
                dst_qp,
                src_qp,
                msn,
                code: code as u8,
                value,
            };
            self.nak_len += 1;
        }
    }
}
