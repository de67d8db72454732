// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Control packets: ACKs (path and stream entries, the receiver's grant), NAKs and probes,
//! and the path they go on.

use super::*;

/// Non-dirty streams whose state each ACK repeats.
const EXTRA_STREAM_ACKS: usize = 4;

impl<P: PathSlots, S: StreamSlots> Connection<P, S> {
    /// As [`Connection::transmit`], for an ACK or NAK on control path `path`: it goes out
    /// with the source port the peer's latest packet on that path came with
    /// ([`Path::reply_port`]), so that the peer's entropy picks both routes of the path's
    /// round trip. A path whose ACKs die on their way back times out at the peer, which
    /// gives it a new source port: that moves its ACKs too. (With our own port, an ACK route
    /// that crosses a dead link stays dead: nothing we send on it is ever acknowledged.)
    fn reply(&mut self, path: usize, len: usize) -> Option<Transmit> {
        let mut t = self.transmit(path, len, false)?;
        if let Some(p) = self.paths.as_ref().get(path) {
            t.src_port = p.reply_port();
        }
        Some(t)
    }

    /// A path for control packets (ACK, NAK): round-robin over Active paths, else any.
    ///
    /// Preferred: Active paths that received a packet lately (within the minimum RTO of the
    /// latest arrival on any path). A plane that delivers nothing to us (cut, or the peer
    /// stopped using it because it failed) most likely drops our ACKs too.
    fn control_path(&mut self) -> usize {
        let n = self.send_paths.max(1);
        let planes_up = self.planes_up;
        let up = |p: &Path| plane_bit(p.plane) & planes_up != 0;
        let paths = self.paths.as_ref().get(..self.send_paths).unwrap_or(&[]);
        let newest = paths.iter().map(|p| p.last_rx).max().unwrap_or(0);
        let fresh_after = newest.saturating_sub(self.cfg.path.min_rto);
        // An Active path on a plane that is up and that received lately; else any Active
        // path on a plane that is up; else any path on a plane that is up.
        for (active_only, fresh) in [(true, true), (true, false), (false, false)] {
            for k in 0..n {
                let i = (self.rr_ack_path + k) % n;
                if paths.get(i).is_some_and(|p| {
                    up(p)
                        && (!active_only || p.state == PathState::Active)
                        && (!fresh || p.last_rx >= fresh_after)
                }) {
                    self.rr_ack_path = (i + 1) % n;
                    return i;
                }
            }
        }
        self.rr_ack_path = (self.rr_ack_path + 1) % n;
        self.rr_ack_path
    }

    pub(super) fn emit_ack(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        let any_path = self
            .paths
            .as_ref()
            .iter()
            .take(self.num_paths)
            .any(|p| p.recv_pending);
        // Stale entries (closed, or already reported) leave the front of the ACK list.
        while let Some(i) = self.sched.front(ACK) {
            if self.streams.slot(i).is_some_and(|s| s.open && s.ack_dirty) {
                break;
            }
            self.sched.pop(&mut self.streams, ACK);
        }
        let any_stream = self.sched.len(ACK) != 0;
        // The repeat timer fired (through `handle_timeout`, which sets `ack_now`, or found due).
        let repeat =
            self.ack_repeat && (self.ack_now || self.ack_deadline().is_some_and(|d| d <= now));
        if !any_path && !any_stream && !repeat {
            self.ack_now = false;
            self.ack_armed = false;
            self.ack_repeat = false;
            self.unacked = 0;
            return None;
        }
        let cp = self.control_path();
        let base = self.control_base(cp, Opcode::Ack, now);
        if any_path || any_stream || self.grant.rate_mbps != 0 {
            self.ack_grant = self.grant;
        }
        let info = AckHeader {
            rate_hint_mbps: self.ack_grant.rate_mbps,
            share: self.ack_grant.share,
            ..AckHeader::default()
        };
        let mut w = AckWriter::new(buf, base, info).ok()?;
        let dirty_streams = self.sched.len(ACK);
        let stream_room = dirty_streams.min(255).saturating_mul(STREAM_ACK_LEN);
        let mut left_over = false;
        // Repeats of recent entries first, in the room the new ones leave (best effort).
        let pending = self
            .paths
            .as_ref()
            .iter()
            .take(self.num_paths)
            .filter(|p| p.recv_pending)
            .count();
        let reserve = pending
            .saturating_add(1)
            .saturating_mul(PATH_ACK_LEN)
            .saturating_add(stream_room);
        for p in self.paths.as_mut().iter_mut().take(self.num_paths) {
            if w.remaining() < reserve || w.path_count() >= u8::MAX - pending.min(254) as u8 {
                break;
            }
            if let Some(a) = p.take_repeat() {
                if w.push_path(&a).is_err() {
                    break;
                }
            }
        }
        for p in self.paths.as_mut().iter_mut().take(self.num_paths) {
            if !p.recv_pending {
                continue;
            }
            if w.remaining() < PATH_ACK_LEN + stream_room || w.path_count() == u8::MAX {
                left_over = true;
                break;
            }
            let a = p.take_ack();
            if w.push_path(&a).is_err() {
                left_over = true;
                break;
            }
        }
        while let Some(i) = self.sched.front(ACK) {
            let Some(s) = self.streams.slot_mut(i) else {
                self.sched.pop(&mut self.streams, ACK);
                continue;
            };
            if s.open && s.ack_dirty {
                let e = super::super::wire::StreamAck {
                    qp: s.cfg.remote_qp,
                    completed_msn: s.resp.completed_msn(),
                };
                if w.push_stream(&e).is_err() {
                    left_over = true;
                    break;
                }
                s.ack_dirty = false;
                self.sched.note_reported(i);
            }
            self.sched.pop(&mut self.streams, ACK);
        }
        // Also repeat the state of a few recently reported streams, round-robin: an ACK that
        // carried a stream's last change may have been lost, and a requester with nothing
        // left in flight would otherwise wait for its completion timeout.
        let mut extra = 0;
        for _ in 0..streams::REPEAT {
            if extra >= EXTRA_STREAM_ACKS || w.remaining() < STREAM_ACK_LEN {
                break;
            }
            let Some(i) = self.sched.next_repeat() else {
                break;
            };
            let Some(s) = self.streams.slot(i) else {
                continue;
            };
            if !s.open || s.error().is_some() {
                continue;
            }
            let e = super::super::wire::StreamAck {
                qp: s.cfg.remote_qp,
                completed_msn: s.resp.completed_msn(),
            };
            if w.push_stream(&e).is_err() {
                break;
            }
            extra += 1;
        }
        let len = w.finish();
        self.ack_now = left_over;
        // After an ACK with news, one repeat once ACKs stop (a lost last ACK would otherwise
        // cost the sender a probe timeout, or its completion timeout for a stream's state).
        let news = any_path || any_stream;
        self.ack_armed = news;
        self.ack_repeat = news;
        self.ack_at = now.saturating_add(self.cfg.path.min_rto.max(self.cfg.path.ack_delay));
        self.unacked = 0;
        self.stats.acks_out += 1;
        self.reply(cp, len)
    }

    pub(super) fn emit_nak(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        if self.nak_len == 0 {
            return None;
        }
        let n = *self.naks.get(self.nak_head)?;
        self.nak_head = (self.nak_head + 1) % NAK_QUEUE;
        self.nak_len -= 1;
        let code = NakCode::from_code(n.code)?;
        let cp = self.control_path();
        let mut base = self.control_base(cp, Opcode::Nak, now);
        base.dst_qp = n.dst_qp;
        base.src_qp = n.src_qp;
        base.msn = n.msn;
        let h = Header {
            base,
            ext: Ext::Nak(NakExt {
                code,
                value: n.value,
            }),
        };
        let len = h.emit(buf).ok()?;
        self.stats.naks_out += 1;
        if let Some(c) = self.stats.naks_out_by_code.get_mut(code as usize) {
            *c += 1;
        }
        self.reply(cp, len)
    }

    /// The base header of a control packet (ACK, NAK, probe) on path `path`.
    fn control_base(&self, path: usize, opcode: Opcode, now: u64) -> BaseHeader {
        base_header(&self.cfg, self.paths.as_ref().get(path), opcode, None, now)
    }

    pub(super) fn emit_probe(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        let i = self
            .paths
            .as_ref()
            .iter()
            .take(self.send_paths)
            .position(|p| {
                p.need_probe && p.can_probe() && plane_bit(p.plane) & self.planes_up != 0
            })?;
        let mut base = self.control_base(i, Opcode::Probe, now);
        base.flags = Flags(Flags::ACK_REQ);
        let p = self.paths.as_mut().get_mut(i)?;
        // Write first, then claim the PSN: nothing is consumed if the buffer is too small.
        let h = Header {
            base,
            ext: Ext::Probe,
        };
        if buf.len() < h.len() {
            return None;
        }
        let psn = p.on_send_probe(now)?;
        p.need_probe = false;
        self.run_fresh = false;
        p.stats.probes += 1;
        let h = Header {
            base: BaseHeader { psn, ..base },
            ext: Ext::Probe,
        };
        let len = h.emit(buf).ok()?;
        self.stats.probes_out += 1;
        self.transmit(i, len, true)
    }
}
