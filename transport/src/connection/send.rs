// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Sending: [`Connection::poll_transmit`] picks the work (a stream's response or request
//! segment) and the path, and builds the data packet.

use super::*;

/// What the scheduler picked to send.
enum Work {
    Request {
        stream: usize,
        msn: u32,
        seg: u32,
        attempt: u16,
        retransmit: bool,
    },
    Response {
        stream: usize,
        msn: u32,
        seg: u32,
        kind: ResponseKind,
        retransmit: bool,
    },
}

impl Work {
    fn stream(&self) -> usize {
        match *self {
            Work::Request { stream, .. } | Work::Response { stream, .. } => stream,
        }
    }
}

impl<P: PathSlots, S: StreamSlots> Connection<P, S> {
    /// Writes the next datagram to send into `buf` (at least `mtu` + 68 bytes for data) and
    /// describes it; None when there is nothing to send now.
    pub fn poll_transmit(
        &mut self,
        now: u64,
        buf: &mut [u8],
        mem: &mut impl Memory,
    ) -> Option<Transmit> {
        if self.ack_now || self.ack_deadline().is_some_and(|d| d <= now) {
            if let Some(t) = self.emit_ack(now, buf) {
                return Some(t);
            }
        }
        if let Some(t) = self.emit_nak(now, buf) {
            return Some(t);
        }
        if let Some(t) = self.emit_probe(now, buf) {
            return Some(t);
        }
        if buf.len() < MAX_HEADER_LEN.saturating_add(self.cfg.mtu as usize) {
            return None;
        }
        // Bounded: each failed attempt fails a WQE or a response.
        for _ in 0..8 {
            // No stream has anything to send: no path to pick (`pick_work` would say None).
            self.sched.front(WORK)?;
            let in_flight = self.in_flight();
            if !self.cc.has_room(in_flight) {
                return None;
            }
            // The work first: a stream on the WORK list may have nothing to send after all
            // (it leaves the list then), and a path pick looks at every path.
            let work = self.pick_work(now)?;
            let mut pi = self.pick_path(now, u32::MAX)?;
            let planes = self.streams.slot(work.stream()).map_or(0, |s| s.cfg.planes);
            // A stream restricted to some planes goes on the best of their paths; when none
            // of them has room, other streams go first (it waits for that room), unless none
            // of them is usable at all (then the restriction is set aside).
            let mut mask = u32::MAX;
            if planes != 0 {
                match self.pick_path(now, planes) {
                    Some(i) => (pi, mask) = (i, planes),
                    None if self.planes_usable(planes) => {
                        self.sched.rotate(&mut self.streams, WORK);
                        continue;
                    }
                    None => {}
                }
            }
            if !self.cc.ready(now) {
                // Held by the pacer (`poll_timeout` now includes its deadline); the next
                // call picks the same work again.
                return None;
            }
            self.commit_path(now, mask);
            // Deficit round-robin: the stream goes to the back of the WORK list once its turn
            // has sent `stream_quantum` packets.
            let si = work.stream();
            if si != self.turn_stream || self.turn_left == 0 {
                self.turn_stream = si;
                self.turn_left = self.cfg.stream_quantum.max(1);
            }
            self.turn_left -= 1;
            if self.turn_left == 0 {
                self.sched.rotate(&mut self.streams, WORK);
            }
            if let Some(t) = self.emit_data(now, pi, work, buf, mem) {
                self.cc.on_send(now, t.len);
                return Some(t);
            }
        }
        None
    }

    /// The first stream on the WORK list with something to send (the caller moves it to the
    /// back when it sends: round-robin); within a stream, responses first, then requests. A
    /// stream found with nothing to send leaves the list (something that gives it work puts
    /// it back).
    fn pick_work(&mut self, now: u64) -> Option<Work> {
        let (streams, sched) = (&mut self.streams, &mut self.sched);
        loop {
            let i = sched.front(WORK)?;
            let Some(s) = streams.slot_mut(i) else {
                sched.pop(streams, WORK);
                continue;
            };
            if !s.open || s.error().is_some() {
                sched.pop(streams, WORK);
                continue;
            }
            if let Some(r) = s.resp.next_segment() {
                return Some(Work::Response {
                    stream: i,
                    msn: r.msn,
                    seg: r.seg,
                    kind: r.kind,
                    retransmit: r.retransmit,
                });
            }
            if let Some(r) = s.req.next_segment(now) {
                return Some(Work::Request {
                    stream: i,
                    msn: r.msn,
                    seg: r.seg,
                    attempt: r.attempt,
                    retransmit: r.retransmit,
                });
            }
            sched.pop(streams, WORK);
        }
    }

    pub(super) fn transmit(
        &mut self,
        path: usize,
        len: usize,
        ecn_capable: bool,
    ) -> Option<Transmit> {
        let p = self.paths.as_ref().get(path)?;
        self.stats.packets_out += 1;
        Some(Transmit {
            len,
            path: p.id,
            plane: p.plane,
            src_port: p.sport,
            ecn_capable,
        })
    }

    fn emit_data(
        &mut self,
        now: u64,
        pi: usize,
        work: Work,
        buf: &mut [u8],
        mem: &mut impl Memory,
    ) -> Option<Transmit> {
        let mtu = self.cfg.mtu;
        let (si, header, item, retransmit) = match work {
            Work::Request {
                stream,
                msn,
                seg,
                attempt,
                retransmit,
            } => {
                let s = self.streams.slot_mut(stream)?;
                let cfg = s.cfg;
                let info = s.req.segment_info(msn, seg, mtu)?;
                let opcode = match info.opcode {
                    WrOpcode::Send => Opcode::Send,
                    WrOpcode::SendWithImm => Opcode::SendWithImm,
                    WrOpcode::SendWithInv => Opcode::SendWithInv,
                    WrOpcode::RdmaWrite => Opcode::RdmaWrite,
                    WrOpcode::RdmaWriteWithImm => Opcode::RdmaWriteWithImm,
                    WrOpcode::RdmaRead => Opcode::ReadRequest,
                    WrOpcode::CmpSwap => Opcode::CmpSwap,
                    WrOpcode::FetchAdd => Opcode::FetchAdd,
                    WrOpcode::AtomicWrite => Opcode::AtomicWrite,
                    WrOpcode::Flush => Opcode::Flush,
                };
                let mut base = base_header(
                    &self.cfg,
                    self.paths.as_ref().get(pi),
                    opcode,
                    Some(&cfg),
                    now,
                );
                base.msn = msn;
                let mut flags = Flags::default()
                    .with(Flags::FIRST, info.first)
                    .with(Flags::LAST, info.last)
                    .with(Flags::ACK_REQ, info.last || retransmit)
                    .with(Flags::RETRANSMIT, retransmit);
                if info.last && info.wqe.solicited {
                    flags = flags.with(Flags::SOLICITED, true);
                }
                base.flags = flags;
                let imm = (opcode.has_imm() && info.last).then_some(info.wqe.imm);
                let w = info.wqe;
                let ext = match opcode {
                    Opcode::Send | Opcode::SendWithImm | Opcode::SendWithInv => {
                        Ext::Send(SendExt {
                            rsn: info.rsn,
                            offset: info.offset,
                            total_len: info.total_len,
                            payload_len: info.payload_len,
                            imm,
                        })
                    }
                    Opcode::RdmaWrite | Opcode::RdmaWriteWithImm => Ext::Write(WriteExt {
                        va: w.remote_va.wrapping_add(u64::from(info.offset)),
                        rkey: w.rkey,
                        rsn: info.rsn,
                        offset: info.offset,
                        total_len: info.total_len,
                        payload_len: info.payload_len,
                        imm,
                    }),
                    Opcode::ReadRequest => Ext::ReadRequest(ReadReqExt {
                        va: w.remote_va,
                        rkey: w.rkey,
                        len: w.local.total(),
                    }),
                    _ => Ext::Atomic(AtomicExt {
                        va: w.remote_va,
                        rkey: w.rkey,
                        swap_add: w.swap_add,
                        compare: if matches!(opcode, Opcode::CmpSwap | Opcode::Flush) {
                            w.compare
                        } else {
                            0
                        },
                    }),
                };
                let h = Header { base, ext };
                // Payload first (it may fail), straight into the buffer behind the header.
                let hl = h.len();
                let pl = h.payload_len() as usize;
                let dst = buf.get_mut(hl..hl.checked_add(pl)?)?;
                let res =
                    w.local
                        .for_each_piece(info.offset, pl, |sge, off, r| match dst.get_mut(r) {
                            Some(d) => mem.read_local(cfg.local_qp, sge, off, d),
                            None => Err(super::super::memory::AccessError::Length),
                        });
                if let Err(e) = res {
                    s.req.fail_local(msn, e);
                    self.touch(stream);
                    return None;
                }
                let item = SentItem {
                    kind: ItemKind::Request,
                    stream: stream as u16,
                    msn,
                    seg,
                    attempt,
                };
                (stream, h, item, retransmit)
            }
            Work::Response {
                stream,
                msn,
                seg,
                kind,
                retransmit,
            } => {
                let s = self.streams.slot_mut(stream)?;
                let cfg = s.cfg;
                let opcode = match kind {
                    ResponseKind::Read { .. } => Opcode::ReadResponse,
                    ResponseKind::Atomic { .. } => Opcode::AtomicResponse,
                };
                let mut base = base_header(
                    &self.cfg,
                    self.paths.as_ref().get(pi),
                    opcode,
                    Some(&cfg),
                    now,
                );
                base.msn = msn;
                let h = match kind {
                    ResponseKind::Read { va, rkey, len } => {
                        let offset = seg.checked_mul(mtu)?;
                        let payload_len = len.saturating_sub(offset).min(mtu);
                        let last = offset.saturating_add(payload_len) >= len;
                        base.flags = Flags::default()
                            .with(Flags::FIRST, seg == 0)
                            .with(Flags::LAST, last)
                            .with(Flags::ACK_REQ, last || retransmit)
                            .with(Flags::RETRANSMIT, retransmit);
                        let h = Header {
                            base,
                            ext: Ext::ReadResponse(DataExt {
                                offset,
                                total_len: len,
                                payload_len,
                            }),
                        };
                        let hl = h.len();
                        let dst = buf.get_mut(hl..hl.checked_add(payload_len as usize)?)?;
                        if !dst.is_empty() {
                            let src = va.wrapping_add(u64::from(offset));
                            if mem.read_remote(cfg.local_qp, rkey, src, dst).is_err() {
                                s.resp.abort_response(msn);
                                self.touch(stream);
                                self.queue_nak(
                                    cfg.remote_qp,
                                    cfg.local_qp,
                                    msn,
                                    NakCode::RemoteAccess,
                                    0,
                                );
                                return None;
                            }
                        }
                        h
                    }
                    ResponseKind::Atomic { orig } => {
                        base.flags = Flags(Flags::FIRST | Flags::LAST | Flags::ACK_REQ)
                            .with(Flags::RETRANSMIT, retransmit);
                        Header {
                            base,
                            ext: Ext::AtomicResponse(orig),
                        }
                    }
                };
                let item = SentItem {
                    kind: ItemKind::Response,
                    stream: stream as u16,
                    msn,
                    seg,
                    attempt: 0,
                };
                (stream, h, item, retransmit)
            }
        };
        // Claim the PSN and write the header.
        let p = self.paths.as_mut().get_mut(pi)?;
        let psn = p.on_send(now, item, retransmit)?;
        let mut header = header;
        header.base.psn = psn;
        let hl = header.emit(buf).ok()?;
        let len = hl.checked_add(header.payload_len() as usize)?;
        let s = self.streams.slot_mut(si)?;
        match item.kind {
            ItemKind::Request => {
                s.req.mark_sent(now, item.msn, item.seg);
                // Its turn came: its completion timeout runs again.
                if s.parked {
                    let stall = self.cfg.stall_timeout;
                    self.sched.note_deadline(&mut self.streams, si, stall);
                }
            }
            _ => s.resp.mark_sent(item.msn, item.seg),
        }
        self.stats.data_packets_out += 1;
        if retransmit {
            self.stats.retransmits += 1;
        }
        self.transmit(pi, len, true)
    }

    /// Unresolved packets on all paths: what the connection window counts. The probes of a
    /// path that is not usable (Suspect, Failed: it timed out, and its data went to the
    /// other paths) are left out (`InFlight::unresolved_data`): they must not take the window
    /// the data needs on the paths that work.
    fn in_flight(&self) -> u32 {
        self.paths
            .as_ref()
            .iter()
            .take(self.num_paths)
            .map(|p| {
                if p.usable() {
                    p.inflight.unresolved()
                } else {
                    p.inflight.unresolved_data()
                }
            })
            .fold(0u32, u32::saturating_add)
    }
}
