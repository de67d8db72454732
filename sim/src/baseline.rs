// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! The baselines: simple single-path transports in the same fabric.
//!
//! - **RoCEv2-like** ([`Mode::GoBackN`]): one UDP source port per QP (one ECMP route), one PSN
//!   space; the receiver takes only the expected PSN, drops anything after a gap and sends
//!   one NAK per gap; the sender goes back to the NAK's PSN (or, on its retransmission
//!   timeout, to the oldest unacknowledged one) and sends everything again. No window:
//!   DCQCN's rate alone limits it. Lossy fabric: no PFC.
//! - **IRN-like** ([`Mode::Selective`]): the same route and rate control, but the receiver
//!   keeps out-of-order packets and NAKs each one with the PSN it got (a one-packet SACK);
//!   the sender keeps at most a BDP of packets outstanding, retransmits the holes below the
//!   highest SACKed PSN once per recovery episode, and uses IRN's two timeouts (a short
//!   one when few packets are outstanding).
//!
//! DCQCN (reaction point at the sender, notification point at the receiver): a CE-marked
//! packet makes the receiver send a CNP, at most one per `cnp_interval_ns`; on a CNP the
//! sender sets its target rate to its current rate, cuts the current rate by alpha/2 and
//! raises alpha (gain g); alpha decays by (1-g) every `timer_ns` without CNP; every
//! `timer_ns` the rate recovers: 5 stages of fast recovery (halfway to the target), then
//! additive (`rai`) and hyper (`rhai`) increase of the target. Starts at line rate.

use crate::endpoint::{Body, End, EndCounters, HostCtx, Packet};
use std::collections::{BTreeSet, VecDeque};

/// Header bytes of a data packet besides the overhead (BTH + RETH + ICRC).
pub const DATA_HEADER: u32 = 32;
/// Wire bytes of an ACK, NAK or CNP (headers and overhead).
pub const CTRL_WIRE: u32 = 82;
/// Wire overhead of every packet (Ethernet, IP, UDP, FCS, preamble and gap).
pub const OVERHEAD: u32 = 50;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    GoBackN,
    Selective,
}

#[derive(Clone, Copy, Debug)]
pub enum BasePkt {
    Data { psn: u64, len: u32, last: bool },
    Ack { cum: u64 },
    Nak { cum: u64, sack: Option<u64> },
    Cnp,
}

#[derive(Clone, Copy, Debug)]
pub struct BaseConfig {
    pub mode: Mode,
    pub mtu: u32,
    pub line_mbps: f64,
    /// Retransmission timeout (go-back-N; IRN's `RTO_high`), ns.
    pub rto_ns: u64,
    /// IRN's `RTO_low`, with at most `rto_low_pkts` outstanding.
    pub rto_low_ns: u64,
    pub rto_low_pkts: u64,
    /// Most packets outstanding (IRN: the BDP; RoCE: no limit).
    pub window: u64,
    pub ack_every: u32,
    pub dcqcn: bool,
    pub cnp_interval_ns: u64,
    pub timer_ns: u64,
    pub g: f64,
    pub rai_mbps: f64,
    pub rhai_mbps: f64,
    pub min_mbps: f64,
}

impl BaseConfig {
    /// RoCEv2-like at `line_mbps`: go-back-N, a 1 ms timeout (far below a NIC's usual
    /// milliseconds-to-seconds), DCQCN with its published constants.
    pub fn roce(line_mbps: u64, mtu: u32) -> Self {
        let line = line_mbps as f64;
        BaseConfig {
            mode: Mode::GoBackN,
            mtu,
            line_mbps: line,
            rto_ns: 1_000_000,
            rto_low_ns: 1_000_000,
            rto_low_pkts: 0,
            window: u64::MAX,
            ack_every: 4,
            dcqcn: true,
            cnp_interval_ns: 50_000,
            timer_ns: 55_000,
            g: 1.0 / 16.0,
            rai_mbps: line / 2_000.0,
            rhai_mbps: line / 200.0,
            min_mbps: line / 1_000.0,
        }
    }

    /// IRN-like: selective repeat, a window of `bdp_pkts`, RTO_low 100 us (3 packets
    /// outstanding or fewer), RTO_high 320 us.
    pub fn irn(line_mbps: u64, mtu: u32, bdp_pkts: u64) -> Self {
        BaseConfig {
            mode: Mode::Selective,
            rto_ns: 320_000,
            rto_low_ns: 100_000,
            rto_low_pkts: 3,
            window: bdp_pkts.max(4),
            ..BaseConfig::roce(line_mbps, mtu)
        }
    }
}

struct Msg {
    flow: u32,
    /// One past its last PSN.
    end: u64,
    last_len: u32,
}

pub struct BaseEnd {
    cfg: BaseConfig,
    sport: u16,
    // Sender.
    msgs: VecDeque<Msg>,
    /// PSNs assigned to posted messages.
    total: u64,
    una: u64,
    nxt: u64,
    /// One past the highest PSN ever sent.
    high_sent: u64,
    /// Selective repeat: per PSN in `una..nxt`, SACKed and resent in this recovery.
    sacked: VecDeque<bool>,
    resent: VecDeque<bool>,
    recovery: bool,
    recovery_end: u64,
    high_sack: u64,
    rto_at: Option<u64>,
    next_send: u64,
    // DCQCN reaction point.
    rc: f64,
    rt: f64,
    alpha: f64,
    alpha_at: u64,
    inc_at: Option<u64>,
    stage: u32,
    // Receiver.
    rcv_nxt: u64,
    ooo: BTreeSet<u64>,
    since_ack: u32,
    nak_sent: bool,
    last_cnp: Option<u64>,
    ctrl: VecDeque<BasePkt>,
    done: Vec<u32>,
    counters: EndCounters,
}

impl BaseEnd {
    /// `sport`: the QP's fixed UDP source port.
    pub fn new(cfg: BaseConfig, sport: u16) -> Self {
        BaseEnd {
            cfg,
            sport,
            msgs: VecDeque::new(),
            total: 0,
            una: 0,
            nxt: 0,
            high_sent: 0,
            sacked: VecDeque::new(),
            resent: VecDeque::new(),
            recovery: false,
            recovery_end: 0,
            high_sack: 0,
            rto_at: None,
            next_send: 0,
            rc: cfg.line_mbps,
            rt: cfg.line_mbps,
            alpha: 1.0,
            alpha_at: 0,
            inc_at: None,
            stage: 0,
            rcv_nxt: 0,
            ooo: BTreeSet::new(),
            since_ack: 0,
            nak_sent: false,
            last_cnp: None,
            ctrl: VecDeque::new(),
            done: Vec::new(),
            counters: EndCounters::default(),
        }
    }

    fn len_of(&self, psn: u64) -> (u32, bool) {
        for m in &self.msgs {
            if psn < m.end {
                return if psn + 1 == m.end {
                    (m.last_len, true)
                } else {
                    (self.cfg.mtu, false)
                };
            }
        }
        (self.cfg.mtu, false)
    }

    fn rto(&self) -> u64 {
        if self.nxt - self.una <= self.cfg.rto_low_pkts {
            self.cfg.rto_low_ns
        } else {
            self.cfg.rto_ns
        }
    }

    fn advance(&mut self, now: u64, cum: u64) {
        if cum <= self.una {
            return;
        }
        let cum = cum.min(self.high_sent);
        for _ in self.una..cum {
            self.sacked.pop_front();
            self.resent.pop_front();
        }
        self.una = cum;
        if self.nxt < cum {
            self.nxt = cum;
        }
        self.high_sack = self.high_sack.max(cum);
        while self.msgs.front().is_some_and(|m| m.end <= self.una) {
            let m = self.msgs.pop_front().unwrap();
            self.done.push(m.flow);
        }
        if self.recovery && self.una >= self.recovery_end {
            self.recovery = false;
        }
        self.rto_at = (self.una < self.nxt).then(|| now + self.rto());
    }

    fn on_cnp(&mut self, now: u64) {
        if !self.cfg.dcqcn {
            return;
        }
        let g = self.cfg.g;
        let k = now.saturating_sub(self.alpha_at) / self.cfg.timer_ns;
        self.alpha *= (1.0 - g).powi(k.min(10_000) as i32);
        self.alpha = (1.0 - g) * self.alpha + g;
        self.alpha_at = now;
        self.rt = self.rc;
        self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(self.cfg.min_mbps);
        self.stage = 0;
        self.inc_at = Some(now + self.cfg.timer_ns);
    }

    fn increase(&mut self, now: u64) {
        self.stage += 1;
        if self.stage > 10 {
            self.rt += self.cfg.rhai_mbps;
        } else if self.stage > 5 {
            self.rt += self.cfg.rai_mbps;
        }
        self.rt = self.rt.min(self.cfg.line_mbps);
        self.rc = (self.rc + self.rt) / 2.0;
        if self.rc >= self.cfg.line_mbps * 0.999 {
            self.rc = self.cfg.line_mbps;
            self.inc_at = None;
        } else {
            self.inc_at = Some(now + self.cfg.timer_ns);
        }
    }

    /// The next data PSN to send, if the window allows one.
    fn next_psn(&mut self) -> Option<u64> {
        if self.cfg.mode == Mode::Selective && self.recovery {
            let end = self.high_sack.min(self.nxt);
            for psn in self.una..end {
                let i = (psn - self.una) as usize;
                if !self.sacked[i] && !self.resent[i] {
                    self.resent[i] = true;
                    return Some(psn);
                }
            }
        }
        if self.nxt < self.total && self.nxt - self.una < self.cfg.window {
            let psn = self.nxt;
            self.nxt += 1;
            if self.cfg.mode == Mode::Selective {
                self.sacked.push_back(false);
                self.resent.push_back(false);
            }
            return Some(psn);
        }
        None
    }

    /// Would `next_psn` give a PSN (pacing aside)?
    fn can_send(&self) -> bool {
        if self.nxt < self.total && self.nxt - self.una < self.cfg.window {
            return true;
        }
        self.cfg.mode == Mode::Selective
            && self.recovery
            && (self.una..self.high_sack.min(self.nxt)).any(|psn| {
                let i = (psn - self.una) as usize;
                !self.sacked[i] && !self.resent[i]
            })
    }

    fn receive_data(
        &mut self,
        now: u64,
        psn: u64,
        len: u32,
        last: bool,
        ce: bool,
        ctx: &mut HostCtx,
    ) {
        if ce
            && self.cfg.dcqcn
            && self
                .last_cnp
                .is_none_or(|t| now >= t + self.cfg.cnp_interval_ns)
        {
            self.last_cnp = Some(now);
            self.ctrl.push_back(BasePkt::Cnp);
        }
        match self.cfg.mode {
            Mode::GoBackN => {
                if psn == self.rcv_nxt {
                    ctx.rx_bytes += u64::from(len);
                    self.rcv_nxt += 1;
                    self.since_ack += 1;
                    self.nak_sent = false;
                    if last || self.since_ack >= self.cfg.ack_every {
                        self.since_ack = 0;
                        self.ctrl.push_back(BasePkt::Ack { cum: self.rcv_nxt });
                    }
                } else if psn > self.rcv_nxt {
                    if !self.nak_sent {
                        self.nak_sent = true;
                        self.ctrl.push_back(BasePkt::Nak {
                            cum: self.rcv_nxt,
                            sack: None,
                        });
                    }
                } else {
                    self.ctrl.push_back(BasePkt::Ack { cum: self.rcv_nxt });
                }
            }
            Mode::Selective => {
                if psn == self.rcv_nxt {
                    ctx.rx_bytes += u64::from(len);
                    let filled = !self.ooo.is_empty();
                    self.rcv_nxt += 1;
                    while self.ooo.remove(&self.rcv_nxt) {
                        self.rcv_nxt += 1;
                    }
                    self.since_ack += 1;
                    if last || filled || self.since_ack >= self.cfg.ack_every {
                        self.since_ack = 0;
                        self.ctrl.push_back(BasePkt::Ack { cum: self.rcv_nxt });
                    }
                } else if psn > self.rcv_nxt {
                    if self.ooo.insert(psn) {
                        ctx.rx_bytes += u64::from(len);
                    }
                    self.ctrl.push_back(BasePkt::Nak {
                        cum: self.rcv_nxt,
                        sack: Some(psn),
                    });
                } else {
                    self.ctrl.push_back(BasePkt::Ack { cum: self.rcv_nxt });
                }
            }
        }
    }
}

impl End for BaseEnd {
    fn post(&mut self, _now: u64, flow: u32, _qp: u16, bytes: u64) {
        let mtu = u64::from(self.cfg.mtu);
        let pkts = bytes.div_ceil(mtu).max(1);
        let last_len = (bytes.max(1) - (pkts - 1) * mtu) as u32;
        self.total += pkts;
        self.msgs.push_back(Msg {
            flow,
            end: self.total,
            last_len,
        });
    }

    fn on_packet(&mut self, now: u64, pkt: Packet, ctx: &mut HostCtx) {
        let Body::Base(b) = pkt.body else { return };
        match b {
            BasePkt::Data { psn, len, last } => self.receive_data(now, psn, len, last, pkt.ce, ctx),
            BasePkt::Ack { cum } => self.advance(now, cum),
            BasePkt::Nak { cum, sack } => {
                self.advance(now, cum);
                match (self.cfg.mode, sack) {
                    (Mode::GoBackN, _) => {
                        if self.nxt > self.una {
                            self.nxt = self.una;
                        }
                    }
                    (Mode::Selective, Some(s)) => {
                        if s >= self.una && s < self.nxt {
                            self.sacked[(s - self.una) as usize] = true;
                            self.high_sack = self.high_sack.max(s + 1);
                            if !self.recovery {
                                self.recovery = true;
                                self.recovery_end = self.nxt;
                            }
                        }
                    }
                    (Mode::Selective, None) => {}
                }
            }
            BasePkt::Cnp => self.on_cnp(now),
        }
    }

    fn on_timeout(&mut self, now: u64, _ctx: &mut HostCtx) {
        if self.rto_at.is_some_and(|t| t <= now) {
            if self.una < self.nxt {
                self.counters.timeouts += 1;
                match self.cfg.mode {
                    Mode::GoBackN => self.nxt = self.una,
                    Mode::Selective => {
                        self.resent.iter_mut().for_each(|r| *r = false);
                        self.recovery = true;
                        self.recovery_end = self.nxt;
                        self.high_sack = self.nxt;
                    }
                }
                self.rto_at = Some(now + self.rto());
            } else {
                self.rto_at = None;
            }
        }
        if self.inc_at.is_some_and(|t| t <= now) {
            self.increase(now);
        }
    }

    fn poll_transmit(&mut self, now: u64, _ctx: &mut HostCtx) -> Option<Packet> {
        let (body, wire, ecn) = if let Some(c) = self.ctrl.pop_front() {
            (c, CTRL_WIRE, false)
        } else {
            if now < self.next_send {
                return None;
            }
            let psn = self.next_psn()?;
            let (len, last) = self.len_of(psn);
            let wire = len + DATA_HEADER + OVERHEAD;
            self.counters.data_packets += 1;
            if psn < self.high_sent {
                self.counters.retransmits += 1;
            }
            self.high_sent = self.high_sent.max(psn + 1);
            let gap = (f64::from(wire) * 8_000.0 / self.rc) as u64;
            self.next_send = self.next_send.max(now.saturating_sub(gap)) + gap;
            if self.rto_at.is_none() {
                self.rto_at = Some(now + self.rto());
            }
            (BasePkt::Data { psn, len, last }, wire, true)
        };
        Some(Packet {
            src: 0,
            dst: 0,
            plane: 0,
            sport: self.sport,
            wire,
            qp: 0,
            ecn_capable: ecn,
            ce: false,
            body: Body::Base(body),
        })
    }

    fn next_timeout(&self) -> Option<u64> {
        let mut t = self.rto_at;
        let mut min = |x: Option<u64>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t: u64| t.min(x)));
            }
        };
        min(self.inc_at);
        if self.ctrl.is_empty() && self.can_send() {
            min(Some(self.next_send));
        }
        t
    }

    fn take_done(&mut self, out: &mut Vec<u32>) {
        out.append(&mut self.done);
    }

    fn counters(&self) -> EndCounters {
        self.counters
    }
}

/// A baseline connection over several planes, as a collective library stripes a transfer
/// over one QP per NIC port: a transfer is cut into one part per plane, each part goes
/// through its own single-path QP (own source port), and the transfer completes when every
/// part did.
pub struct Striped {
    /// QP `q` on plane `p` is part `q * planes + p`.
    parts: Vec<BaseEnd>,
    planes: usize,
    /// Transfers in progress: (flow, parts not yet complete).
    left: Vec<(u32, u32)>,
    rr: usize,
    done: Vec<u32>,
    scratch: Vec<u32>,
}

impl Striped {
    /// One QP per plane for each of the pair's QPs, with source ports `sports[qp * planes +
    /// plane]`.
    pub fn new(cfg: BaseConfig, sports: &[u16], planes: usize) -> Self {
        Striped {
            parts: sports.iter().map(|&s| BaseEnd::new(cfg, s)).collect(),
            planes: planes.max(1),
            left: Vec::new(),
            rr: 0,
            done: Vec::new(),
            scratch: Vec::new(),
        }
    }
}

impl End for Striped {
    fn post(&mut self, now: u64, flow: u32, qp: u16, bytes: u64) {
        let first = usize::from(qp) * self.planes % self.parts.len();
        let n = (self.planes as u64).min(bytes.max(1));
        let each = bytes.max(1) / n;
        for i in 0..n {
            let b = if i + 1 == n {
                bytes.max(1) - each * (n - 1)
            } else {
                each
            };
            self.parts[first + i as usize].post(now, flow, 0, b);
        }
        self.left.push((flow, n as u32));
    }

    fn on_packet(&mut self, now: u64, pkt: Packet, ctx: &mut HostCtx) {
        let i = (usize::from(pkt.qp) * self.planes + usize::from(pkt.plane)) % self.parts.len();
        self.parts[i].on_packet(now, pkt, ctx);
    }

    fn on_timeout(&mut self, now: u64, ctx: &mut HostCtx) {
        for p in &mut self.parts {
            if p.next_timeout().is_some_and(|t| t <= now) {
                p.on_timeout(now, ctx);
            }
        }
    }

    fn poll_transmit(&mut self, now: u64, ctx: &mut HostCtx) -> Option<Packet> {
        let n = self.parts.len();
        for k in 0..n {
            let i = (self.rr + k) % n;
            if let Some(mut pkt) = self.parts[i].poll_transmit(now, ctx) {
                pkt.plane = (i % self.planes) as u8;
                pkt.qp = (i / self.planes) as u16;
                self.rr = (i + 1) % n;
                return Some(pkt);
            }
        }
        None
    }

    fn next_timeout(&self) -> Option<u64> {
        self.parts.iter().filter_map(|p| p.next_timeout()).min()
    }

    fn take_done(&mut self, out: &mut Vec<u32>) {
        for p in &mut self.parts {
            p.take_done(&mut self.scratch);
        }
        for f in self.scratch.drain(..) {
            if let Some(k) = self.left.iter().position(|&(g, _)| g == f) {
                self.left[k].1 -= 1;
                if self.left[k].1 == 0 {
                    self.left.swap_remove(k);
                    self.done.push(f);
                }
            }
        }
        out.append(&mut self.done);
    }

    fn counters(&self) -> EndCounters {
        let mut c = EndCounters::default();
        for p in &self.parts {
            let q = p.counters();
            c.data_packets += q.data_packets;
            c.retransmits += q.retransmits;
            c.timeouts += q.timeouts;
            c.failed += q.failed;
        }
        c
    }
}
