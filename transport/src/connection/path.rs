//! A path: one ECMP route (a UDP source port on a plane) with its own PSN space in each
//! direction, congestion window, RTT estimate, timers and state.

use super::super::congestion::Window;
use super::super::rng::XorShift;
use super::super::wire::PathAck;
use super::retransmit::{AckSummary, InFlight, Outcome, SentItem};
use super::rtt::RttEstimator;
use super::sack::PsnWindow;

/// Path health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PathState {
    /// Carries data.
    Active,
    /// Had a retransmission timeout: no new data, only probes, until a probe is acknowledged.
    Suspect,
    /// Several timeouts in a row: probed with backed-off timers until it answers.
    Failed,
}

/// Counters of one path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Packets sent on the path (data, probes).
    pub sent: u64,
    /// Of those, retransmissions.
    pub retransmitted: u64,
    /// Packets acknowledged.
    pub acked: u64,
    /// Packets declared lost (SACK gap or timeout).
    pub lost: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Probes sent.
    pub probes: u64,
    /// Packets received on the path (first arrivals).
    pub received: u64,
    /// Duplicate or below-window arrivals.
    pub duplicates: u64,
    /// ECN CE marks the peer echoed for packets we sent.
    pub ecn_ce: u64,
    /// UDP source port changes (after timeouts).
    pub entropy_changes: u64,
}

/// Path tuning shared by all paths of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathConfig {
    /// First PSN of every path's space, in both directions (both ends agree).
    pub initial_psn: u32,
    /// Initial congestion window, packets.
    pub initial_cwnd: u16,
    /// Largest congestion window, packets (at most 256).
    pub max_cwnd: u16,
    /// RTO before the first RTT sample, ns.
    pub initial_rto: u64,
    /// Smallest RTO, ns (at least `MIN_TIMEOUT`).
    pub min_rto: u64,
    /// Largest RTO after back-off, ns.
    pub max_rto: u64,
    /// Longest time an ACK is held back for coalescing, ns.
    pub ack_delay: u64,
    /// Consecutive timeouts after which a path is Failed.
    pub fail_after: u8,
}

#[derive(Clone, Debug)]
/// One path of a connection, both directions.
pub struct Path {
    /// Path id (its index in the connection; carried in every packet).
    pub id: u16,
    /// Plane the path runs on.
    pub plane: u8,
    /// UDP source port: the path's ECMP entropy.
    pub sport: u16,
    /// Health.
    pub state: PathState,
    /// Sender side: packets in flight on this path.
    pub inflight: InFlight,
    /// Sender side: congestion window.
    pub cc: Window,
    /// Sender side: RTT estimate and RTO.
    pub rtt: RttEstimator,
    ack_delay: u64,
    fail_after: u8,
    /// Start of the current probe-timeout interval (last progress or first send after idle).
    timer_start: u64,
    /// A probe (TLP or RTO probe) is outstanding, scheduled at `probe_at`.
    probe_armed: bool,
    probe_at: u64,
    backoff: u8,
    consecutive_rtos: u8,
    /// A probe should be sent on this path.
    pub need_probe: bool,
    // Receive side.
    /// Receive side: which PSNs of the peer's space arrived.
    pub recv: PsnWindow,
    /// Packets were received since the last ACK.
    pub recv_pending: bool,
    /// Receive side: timestamp of the latest new packet (echoed in ACKs).
    pub last_ts: u32,
    /// Receive side: CE marks since the last ACK.
    pub ecn_ce: u16,
    /// Counters.
    pub stats: PathStats,
}

impl Path {
    /// A fresh path with a random UDP source port.
    pub fn new(id: u16, plane: u8, cfg: &PathConfig, rng: &mut XorShift) -> Self {
        Path {
            id,
            plane,
            sport: rng.source_port(0),
            state: PathState::Active,
            inflight: InFlight::new(cfg.initial_psn),
            cc: Window::new(cfg.initial_cwnd, cfg.max_cwnd),
            rtt: RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto),
            ack_delay: cfg.ack_delay,
            fail_after: cfg.fail_after.max(1),
            timer_start: 0,
            probe_armed: false,
            probe_at: 0,
            backoff: 0,
            consecutive_rtos: 0,
            need_probe: false,
            recv: PsnWindow::new(cfg.initial_psn),
            recv_pending: false,
            last_ts: 0,
            ecn_ce: 0,
            stats: PathStats::default(),
        }
    }

    /// Re-initialises in place (as `new`, without a stack temporary).
    pub fn reset(&mut self, id: u16, plane: u8, cfg: &PathConfig, rng: &mut XorShift) {
        self.id = id;
        self.plane = plane;
        self.sport = rng.source_port(0);
        self.state = PathState::Active;
        self.inflight.reset(cfg.initial_psn);
        self.cc = Window::new(cfg.initial_cwnd, cfg.max_cwnd);
        self.rtt = RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto);
        self.ack_delay = cfg.ack_delay;
        self.fail_after = cfg.fail_after.max(1);
        self.timer_start = 0;
        self.probe_armed = false;
        self.probe_at = 0;
        self.backoff = 0;
        self.consecutive_rtos = 0;
        self.need_probe = false;
        self.recv = PsnWindow::new(cfg.initial_psn);
        self.recv_pending = false;
        self.last_ts = 0;
        self.ecn_ce = 0;
        self.stats = PathStats::default();
    }

    /// Window room for a data packet (state is judged by the caller).
    pub fn has_window(&self) -> bool {
        self.cc.has_room(self.inflight.unresolved()) && self.inflight.has_room()
    }

    /// Records a packet sent now and returns its PSN.
    pub fn on_send(&mut self, now: u64, item: SentItem, retransmit: bool) -> Option<u32> {
        if self.inflight.unresolved() == 0 {
            self.timer_start = now;
        }
        let psn = self.inflight.push(now, item)?;
        self.stats.sent += 1;
        if retransmit {
            self.stats.retransmitted += 1;
        }
        Some(psn)
    }

    /// Applies this path's entry of an ACK; `report` gets every resolved packet.
    pub fn on_ack(
        &mut self,
        now: u64,
        ack: &PathAck,
        report: impl FnMut(SentItem, Outcome, u64),
    ) -> AckSummary {
        let sum = self.inflight.on_ack(ack, report);
        self.stats.acked += u64::from(sum.acked);
        self.stats.lost += u64::from(sum.lost);
        if sum.acked > 0 {
            let sample = (now as u32).wrapping_sub(ack.echo_ts);
            self.rtt.sample(u64::from(sample));
            self.timer_start = now;
            self.probe_armed = false;
            self.need_probe = false;
            self.backoff = 0;
            self.consecutive_rtos = 0;
            self.state = PathState::Active;
            self.cc.on_ack(sum.acked);
        }
        if ack.ecn_ce > 0 {
            self.stats.ecn_ce += u64::from(ack.ecn_ce);
            self.cc.on_ecn(now, self.rtt.srtt(), u32::from(ack.ecn_ce));
        }
        sum
    }

    /// The deadline of this path's timer, if armed.
    pub fn deadline(&self) -> Option<u64> {
        if self.probe_armed {
            return Some(
                self.probe_at
                    .saturating_add(self.rtt.backed_off(self.backoff)),
            );
        }
        if self.inflight.unresolved() > 0 {
            return Some(
                self.timer_start
                    .saturating_add(self.rtt.pto(self.ack_delay)),
            );
        }
        None
    }

    /// Fires the timer if due. The first expiry sends a tail-loss probe; an expiry with a
    /// probe outstanding is a retransmission timeout: every unresolved packet is lost, the path
    /// moves to a new UDP source port, backs off and turns Suspect (Failed after `fail_after`
    /// in a row). Returns the number of packets declared lost.
    pub fn on_timer(
        &mut self,
        now: u64,
        rng: &mut XorShift,
        report: impl FnMut(SentItem, Outcome, u64),
    ) -> u32 {
        match self.deadline() {
            Some(d) if d <= now => {}
            _ => return 0,
        }
        if !self.probe_armed {
            // Tail-loss probe.
            self.probe_armed = true;
            self.probe_at = now;
            self.need_probe = true;
            return 0;
        }
        let lost = self.inflight.on_timeout(report);
        self.stats.timeouts += 1;
        self.stats.lost += u64::from(lost);
        self.backoff = self.backoff.saturating_add(1).min(16);
        self.consecutive_rtos = self.consecutive_rtos.saturating_add(1);
        self.state = if self.consecutive_rtos >= self.fail_after {
            PathState::Failed
        } else {
            PathState::Suspect
        };
        self.sport = rng.source_port(self.sport);
        self.stats.entropy_changes += 1;
        self.cc.on_timeout();
        self.probe_armed = true;
        self.probe_at = now;
        self.need_probe = true;
        lost
    }

    /// Receive side: a sequenced packet arrived on this path.
    pub fn on_receive(&mut self, psn: u32, ts: u32, ecn_ce: bool) -> bool {
        let new = self.recv.record(psn) == super::sack::Recorded::New;
        if new {
            self.stats.received += 1;
        } else {
            self.stats.duplicates += 1;
        }
        if new {
            // A late duplicate's old timestamp would inflate the sender's RTT sample.
            self.last_ts = ts;
        }
        if ecn_ce {
            self.ecn_ce = self.ecn_ce.saturating_add(1);
        }
        self.recv_pending = true;
        new
    }

    /// The ACK entry for this path; clears the pending state.
    pub fn take_ack(&mut self) -> PathAck {
        let a = self
            .recv
            .to_ack(self.id, self.plane, self.last_ts, self.ecn_ce);
        self.ecn_ce = 0;
        self.recv_pending = false;
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> PathConfig {
        PathConfig {
            initial_psn: 0,
            initial_cwnd: 4,
            max_cwnd: 64,
            initial_rto: 1_000_000,
            min_rto: 100_000,
            max_rto: 10_000_000,
            ack_delay: 10_000,
            fail_after: 2,
        }
    }

    #[test]
    fn tlp_then_rto_changes_entropy_and_state() {
        let mut rng = XorShift::new(1);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        let port = p.sport;
        assert_eq!(p.deadline(), None);
        p.on_send(0, SentItem::default(), false);
        let d = p.deadline().unwrap();
        assert_eq!(p.on_timer(d - 1, &mut rng, |_, _, _| {}), 0);
        assert!(!p.need_probe);
        assert_eq!(p.on_timer(d, &mut rng, |_, _, _| {}), 0);
        assert!(p.need_probe); // tail-loss probe
        assert_eq!(p.state, PathState::Active);
        let d2 = p.deadline().unwrap();
        assert_eq!(p.on_timer(d2, &mut rng, |_, _, _| {}), 1);
        assert_eq!(p.state, PathState::Suspect);
        assert_ne!(p.sport, port);
        let d3 = p.deadline().unwrap();
        assert!(d3 - d2 > d2 - d, "backed off");
        p.on_timer(d3, &mut rng, |_, _, _| {});
        assert_eq!(p.state, PathState::Failed);
        // A probe answered brings it back.
        p.on_send(d3, SentItem::default(), false);
        let psn = p.inflight.next_psn().wrapping_sub(1);
        let ack = PathAck {
            cum_psn: psn.wrapping_add(1),
            echo_ts: d3 as u32,
            ..PathAck::default()
        };
        let s = p.on_ack(d3 + 50_000, &ack, |_, _, _| {});
        assert_eq!(s.acked, 1);
        assert_eq!(p.state, PathState::Active);
        assert_eq!(p.rtt.srtt(), 50_000);
        assert_eq!(p.deadline(), None);
    }

    #[test]
    fn window_grows_and_halves_on_ecn() {
        let mut rng = XorShift::new(1);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        for _ in 0..4 {
            p.on_send(0, SentItem::default(), false);
        }
        assert!(!p.has_window());
        let ack = PathAck {
            cum_psn: 4,
            echo_ts: 0,
            ..PathAck::default()
        };
        p.on_ack(1000, &ack, |_, _, _| {});
        assert_eq!(p.cc.cwnd(), 5);
        let ack = PathAck {
            cum_psn: 4,
            echo_ts: 0,
            ecn_ce: 1,
            ..PathAck::default()
        };
        p.on_ack(1_000_000, &ack, |_, _, _| {});
        assert_eq!(p.cc.cwnd(), 2);
    }
}
