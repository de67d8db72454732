// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A path: one ECMP route (a UDP source port on a plane) with its own PSN space in each
//! direction, congestion window, RTT estimate, timers and state.
//!
//! States: **Active** paths carry data. A retransmission timeout moves the path to another
//! route (a new UDP source port) and makes it **Suspect**: no new data, only a probe, until
//! the probe is answered (back to Active). After `fail_after` timeouts in a row it is
//! **Failed**: its data has gone to the other paths and it is probed in the background with
//! backed-off timers, a new route each time. When a probe of a Failed path is answered the
//! path is re-admitted as **Probing**: it carries data again, and turns Active once a
//! window's worth is acknowledged (a timeout while Probing fails it again at once).
//!
//! For path selection each path keeps a *health* in 1..=1024 from its recent loss and ECN
//! rates (exponentially weighted) and whether a tail-loss probe is outstanding; its share of
//! new data and its usable window scale with it ([`Path::weight`], [`Path::has_window`]).

use super::super::congestion::Window;
use super::super::rng::XorShift;
use super::super::wire::PathAck;
use super::super::zero::{zero_valid, ZeroValid};
use super::retransmit::{AckSummary, InFlight, ItemKind, Outcome, SentItem};
use super::rtt::RttEstimator;
use super::sack::PsnWindow;
use super::Arrival;

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
    /// A Failed path whose probe was answered: carries data again, on probation.
    Probing,
}
// A fresh path is Active (`Path::reset`).
zero_valid!(PathState::Active);

/// Acknowledged packets a re-admitted path needs before it is Active again.
const PROBATION: u16 = 16;
/// Full health.
pub const FULL_HEALTH: u16 = 1024;
/// ACKs after the one that reported a path's news that repeat its entry (an ACK lost on a
/// broken reverse route must not cost the sender a timeout).
pub const ACK_REPEATS: u8 = 2;
/// The loss and ECN rates of a path halve for every this many of its smoothed RTTs without
/// news of them (no ACK, no loss on it), and its RTT counts against its weight only this
/// long after its last sample: a path the picker seldom chooses is seldom measured, and must
/// not keep a verdict from long ago (with runs of 16 packets per path, paths that lost part
/// of one run at a full queue kept a tenth of their share).
pub const ESTIMATE_AGE_RTTS: u64 = 8;
/// Nor shorter than this many RTOs: a verdict is kept for a few timeouts at least.
pub const ESTIMATE_AGE_RTOS: u64 = 4;
/// A path that probes early because it is behind the others ([`Path::deadline`]) also hands
/// its tail's data back to be sent again when its recent loss rate is at least this (in
/// 1/65536: 1/512). A path that has not lost lately only probes: its tail is most likely on
/// its way, and a resend would be spurious.
pub const RESEND_LOSS_RATE: u16 = 128;

/// What a path's timer needs to know of the connection's other paths ([`Path::deadline`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Behind {
    /// When the newest packet the connection has had acknowledged on any path was sent (0:
    /// none yet): a path whose unanswered tail was sent before it is behind the others.
    pub sent: u64,
    /// While only one path has packets unanswered: the largest smoothed RTT of the
    /// connection's paths (0 otherwise, or none yet), what that path goes by if it has no RTT
    /// sample of its own ([`Path::rtt_or`]).
    pub last_srtt: u64,
}

impl Behind {
    /// Nothing acknowledged on any path yet.
    pub const NONE: Behind = Behind {
        sent: 0,
        last_srtt: 0,
    };
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
    /// Of those, probes that repeated an earlier PSN because the path had run
    /// [`RECV_WINDOW`](super::sack::RECV_WINDOW) beyond what its peer acknowledged (a path
    /// dead for that many timeouts).
    pub limit_probes: u64,
    /// Packets received on the path (first arrivals).
    pub received: u64,
    /// Duplicate or below-window arrivals.
    pub duplicates: u64,
    /// Arrivals dropped unseen because their PSN was more than
    /// [`RECV_WINDOW`](super::sack::RECV_WINDOW) beyond the path's cumulative PSN: a
    /// conforming peer never sends one, so they are forged (off-path injection) or corrupt.
    pub out_of_window: u64,
    /// ECN CE marks the peer echoed for packets we sent.
    pub ecn_ce: u64,
    /// Marks the peer set itself for packets we sent, its receive queue being long
    /// ([`PathAck::busy`]).
    pub busy: u64,
    /// UDP source port changes (after timeouts).
    pub entropy_changes: u64,
    /// Packets acknowledged after a later packet of the path (reordering within the path).
    pub reordered: u64,
    /// Of the packets declared lost, those acknowledged later after all.
    pub spurious: u64,
    /// Times the path was declared Failed.
    pub failures: u64,
    /// Times a Failed path answered a probe and was re-admitted.
    pub readmissions: u64,
    /// Tails handed back to be sent again by an early probe ([`RESEND_LOSS_RATE`]).
    pub tail_resends: u64,
}
zero_valid!(struct PathStats {
    sent, retransmitted, acked, lost, timeouts, probes, limit_probes, received, duplicates,
    out_of_window, ecn_ce, busy, entropy_changes, reordered, spurious, failures, readmissions,
    tail_resends,
});

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
    /// Smallest reordering window of loss detection, ns: reordering within a path by up to
    /// this much is never taken for loss, however short the RTT.
    pub min_reorder_window: u64,
}
zero_valid!(struct PathConfig {
    initial_psn, initial_cwnd, max_cwnd, initial_rto, min_rto, max_rto, ack_delay, fail_after,
    min_reorder_window,
});

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
    /// The window a fresh path starts with (a re-admitted path starts again from it).
    cc_initial: Window,
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
    /// A probe that repeated an earlier PSN (the path at its window limit) is unanswered:
    /// its PSN and timestamp.
    limit_probe: bool,
    limit_probe_psn: u32,
    limit_probe_ts: u32,
    /// Recent loss rate, 0..=65535 (EWMA over resolved packets).
    loss_rate: u16,
    /// Recent ECN CE rate, 0..=65535 (EWMA over acknowledged packets).
    ecn_rate: u16,
    /// When the two rates last had news (or were last aged, [`Path::age`]).
    news_at: u64,
    /// When the latest RTT sample was taken.
    rtt_at: u64,
    /// Health from the two rates and the probe state, 1..=1024 (0 before reset).
    health: u16,
    /// Packets still to be acknowledged while Probing.
    probation: u16,
    /// Smooth weighted round-robin credit (kept by the connection's path picker).
    pub credit: i32,
    /// The weight the connection's last pick gave this path (0: not eligible then), so that
    /// charging the pick needs no second look at every path.
    pub pick_weight: i32,
    /// Whether the connection's last pick found window room on this path.
    pub pick_room: bool,
    // Receive side.
    /// Receive side: which PSNs of the peer's space arrived.
    pub recv: PsnWindow,
    /// Packets were received since the last ACK.
    pub recv_pending: bool,
    /// ACKs that will still repeat this path's entry.
    ack_repeats: u8,
    /// Receive side: when the latest packet arrived on this path (0: never).
    pub last_rx: u64,
    /// Receive side: timestamp of the latest new packet (echoed in ACKs).
    pub last_ts: u32,
    /// Receive side: the UDP source port of the latest packet that arrived on this path (0:
    /// none yet), the peer's entropy for it ([`Path::reply_port`]).
    peer_sport: u16,
    /// Receive side: CE marks since the last ACK.
    pub ecn_ce: u16,
    /// Receive side: arrivals without CE marked busy ([`Arrival::rx_busy`]) since the last ACK.
    pub busy: u16,
    /// Counters.
    pub stats: PathStats,
}
zero_valid!(struct Path {
    id, plane, sport, state, inflight, cc, cc_initial, rtt, ack_delay, fail_after, timer_start,
    probe_armed, probe_at, backoff, consecutive_rtos, need_probe, limit_probe, limit_probe_psn,
    limit_probe_ts, loss_rate, ecn_rate, news_at, rtt_at, health, probation, credit, pick_weight,
    pick_room,
    recv, recv_pending, ack_repeats, last_rx, last_ts, peer_sport, ecn_ce, busy, stats,
});

impl Path {
    /// A fresh path with a random UDP source port.
    pub fn new(id: u16, plane: u8, cfg: &PathConfig, rng: &mut XorShift) -> Self {
        Path {
            id,
            plane,
            sport: rng.source_port(0),
            state: PathState::Active,
            inflight: InFlight::new(cfg.initial_psn).with_reorder_floor(cfg.min_reorder_window),
            cc: Window::new(cfg.initial_cwnd, cfg.max_cwnd),
            cc_initial: Window::new(cfg.initial_cwnd, cfg.max_cwnd),
            rtt: RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto),
            ack_delay: cfg.ack_delay,
            fail_after: cfg.fail_after.max(1),
            timer_start: 0,
            probe_armed: false,
            probe_at: 0,
            backoff: 0,
            consecutive_rtos: 0,
            need_probe: false,
            limit_probe: false,
            limit_probe_psn: 0,
            limit_probe_ts: 0,
            loss_rate: 0,
            ecn_rate: 0,
            news_at: 0,
            rtt_at: 0,
            health: FULL_HEALTH,
            probation: 0,
            credit: 0,
            pick_weight: 0,
            pick_room: false,
            recv: PsnWindow::new(cfg.initial_psn),
            recv_pending: false,
            ack_repeats: 0,
            last_rx: 0,
            last_ts: 0,
            peer_sport: 0,
            ecn_ce: 0,
            busy: 0,
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
        self.inflight.set_reorder_floor(cfg.min_reorder_window);
        self.cc = Window::new(cfg.initial_cwnd, cfg.max_cwnd);
        self.cc_initial = self.cc;
        self.rtt = RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto);
        self.ack_delay = cfg.ack_delay;
        self.fail_after = cfg.fail_after.max(1);
        self.timer_start = 0;
        self.probe_armed = false;
        self.probe_at = 0;
        self.backoff = 0;
        self.consecutive_rtos = 0;
        self.need_probe = false;
        self.limit_probe = false;
        self.limit_probe_psn = 0;
        self.limit_probe_ts = 0;
        self.loss_rate = 0;
        self.ecn_rate = 0;
        self.news_at = 0;
        self.rtt_at = 0;
        self.health = FULL_HEALTH;
        self.probation = 0;
        self.credit = 0;
        self.pick_weight = 0;
        self.pick_room = false;
        self.recv = PsnWindow::new(cfg.initial_psn);
        self.recv_pending = false;
        self.ack_repeats = 0;
        self.last_rx = 0;
        self.last_ts = 0;
        self.peer_sport = 0;
        self.ecn_ce = 0;
        self.busy = 0;
        self.stats = PathStats::default();
    }

    /// Starts both PSN spaces again from `initial_psn` (the peer's connection is a new one);
    /// the caller has resolved what was in flight (`InFlight::on_timeout`). An Active path's
    /// window, RTT, health and statistics are the route's and stay. A path that timed out
    /// (Suspect, Failed, Probing) timed out against the old connection, which dropped what
    /// it sent (a peer made again answers nothing of the old PSN spaces): that history is
    /// the old peer's, not the route's, so the path is Active again with a fresh window and
    /// no loss, as a re-admitted one is, rather than waiting for its backed-off probes.
    pub fn restart_psns(&mut self, cfg: &PathConfig) {
        if self.state != PathState::Active {
            self.state = PathState::Active;
            self.cc = self.cc_initial;
            self.loss_rate = 0;
            self.ecn_rate = 0;
        }
        self.backoff = 0;
        self.consecutive_rtos = 0;
        self.probation = 0;
        self.limit_probe = false;
        self.update_health();
        self.inflight.reset(cfg.initial_psn);
        self.inflight.set_reorder_floor(cfg.min_reorder_window);
        self.recv = PsnWindow::new(cfg.initial_psn);
        self.recv_pending = false;
        self.ack_repeats = 0;
        self.timer_start = 0;
        self.probe_armed = false;
        self.need_probe = false;
    }

    /// The path may carry new data (Active or Probing).
    pub fn usable(&self) -> bool {
        matches!(self.state, PathState::Active | PathState::Probing)
    }

    /// Window room for a data packet (state is judged by the caller): the congestion window
    /// scaled by the path's health relative to `best_health`, the best of the connection's
    /// paths (at least one packet): when every path is equally lossy, none is held back.
    pub fn has_window(&self, best_health: u16) -> bool {
        let n = self.inflight.unresolved();
        // n < cwnd * health / best, without a division.
        let room = u64::from(n) * u64::from(best_health.max(1))
            < u64::from(self.cc.cwnd()) * u64::from(self.health);
        self.cc.has_room(n) && (n == 0 || room) && self.inflight.has_room()
    }

    /// Health, 1..=1024: recent loss and ECN rates, a tail-loss probe outstanding.
    pub fn health(&self) -> u16 {
        self.health
    }

    /// Recent loss rate of the path, in 1/65536.
    pub fn loss_rate(&self) -> u16 {
        self.loss_rate
    }

    /// Recent ECN CE rate of the path, in 1/65536.
    pub fn ecn_rate(&self) -> u16 {
        self.ecn_rate
    }

    /// How long estimates stay as they are without news: `ESTIMATE_AGE_RTTS` smoothed RTTs,
    /// at least `ESTIMATE_AGE_RTOS` RTOs.
    fn age_period(&self) -> u64 {
        self.rtt
            .srtt()
            .saturating_mul(ESTIMATE_AGE_RTTS)
            .max(self.rtt.rto().saturating_mul(ESTIMATE_AGE_RTOS))
    }

    /// Ages the loss and ECN rates: they halve for every aging period that passed without
    /// news of them (an ACK, a loss), so one seldom used drifts back towards full health and
    /// gets picked, and so measured, again. A path in use gets news with every ACK and keeps
    /// its estimates as measured.
    ///
    /// Only an Active path ages: a Suspect or Failed one has unanswered packets, which is news
    /// (a cut route must not look healthy again by waiting).
    pub fn age(&mut self, now: u64) {
        if self.state != PathState::Active || (self.loss_rate | self.ecn_rate) == 0 {
            return;
        }
        let period = self.age_period().max(1);
        let since = now.saturating_sub(self.news_at);
        // Checked first: a path in use gets news every ACK, and this runs for every path on
        // every packet sent (a division each was a measurable part of spraying).
        if since < period {
            return;
        }
        let k = since / period;
        // Checked: `>>` by 16 or more on a u16 panics with overflow checks, else shifts by
        // the amount modulo 16.
        let k = k.min(16) as u32;
        self.loss_rate = self.loss_rate.checked_shr(k).unwrap_or(0);
        self.ecn_rate = self.ecn_rate.checked_shr(k).unwrap_or(0);
        self.update_health();
        self.news_at = now;
    }

    /// Selection weight: the health, halved when the smoothed RTT is over twice `best_srtt`
    /// (the best of the connection's paths) and quartered over four times (cheap: shifts);
    /// an RTT sampled longer than an aging period before `now` no longer counts.
    pub fn weight(&self, best_srtt: u64, now: u64) -> i32 {
        let srtt = self.rtt.srtt();
        let stale =
            self.state == PathState::Active && now.saturating_sub(self.rtt_at) > self.age_period();
        let shift = if stale || best_srtt == 0 || srtt < best_srtt.saturating_mul(2) {
            0
        } else if srtt < best_srtt.saturating_mul(4) {
            1
        } else {
            2
        };
        (i32::from(self.health) >> shift).max(1)
    }

    fn update_health(&mut self) {
        let mut w: u64 = u64::from(FULL_HEALTH);
        // 5% loss: two thirds; a dead route (100%): 1/11.
        w = w * 65_536 / (65_536 + 10 * u64::from(self.loss_rate));
        // ECN also shrinks the congestion window: only a mild preference here.
        w = w * 65_536 / (65_536 + 2 * u64::from(self.ecn_rate));
        if self.probe_armed {
            w /= 8;
        }
        self.health = w.clamp(1, u64::from(FULL_HEALTH)) as u16;
    }

    /// `hits` of `n` events (lost of resolved, marked of acknowledged); gain n / (n + 64).
    fn ewma(rate: u16, hits: u32, n: u32) -> u16 {
        if n == 0 {
            return rate;
        }
        let x = i64::from(hits.min(n)) * 65_535 / i64::from(n);
        let r = i64::from(rate);
        let n = i64::from(n);
        (r + (x - r) * n / (n + 64)).clamp(0, 65_535) as u16
    }

    fn fail(&mut self) {
        if self.state != PathState::Failed {
            self.stats.failures += 1;
        }
        self.state = PathState::Failed;
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

    /// Whether a probe may go out now: with a new PSN, or, at the window limit, repeating
    /// an earlier one ([`Path::on_send_probe`]).
    pub fn can_probe(&self) -> bool {
        self.inflight.has_room() || self.inflight.window_limited()
    }

    /// Records a probe sent now and returns its PSN: a new one, or, while the path is
    /// window-limited ([`InFlight::window_limited`]: dead through so many timeouts that a
    /// new PSN might be beyond the receiver's window), [`InFlight::limit_probe_psn`] again.
    /// That one is not in the in-flight table (the probe timer alone runs it), and an ACK
    /// that acknowledges it answers the probe.
    pub fn on_send_probe(&mut self, now: u64) -> Option<u32> {
        if !self.inflight.window_limited() {
            let item = SentItem {
                kind: ItemKind::Probe,
                ..SentItem::default()
            };
            return self.on_send(now, item, false);
        }
        let psn = self.inflight.limit_probe_psn();
        self.limit_probe = true;
        self.limit_probe_psn = psn;
        // As the probe's header carries it (the wire carries the clock modulo 2^32).
        self.limit_probe_ts = now as u32;
        self.stats.sent += 1;
        self.stats.limit_probes += 1;
        Some(psn)
    }

    /// Applies this path's entry of an ACK; `report` gets every resolved packet.
    pub fn on_ack(
        &mut self,
        now: u64,
        ack: &PathAck,
        report: impl FnMut(SentItem, Outcome, u64),
    ) -> AckSummary {
        // A probe that repeated an earlier PSN acknowledges no packet of the table: the ACK
        // that covers its PSN answers it.
        let limit_answered = self.limit_probe && ack.acks(self.limit_probe_psn);
        if limit_answered {
            self.limit_probe = false;
        }
        let sum = self.inflight.on_ack(now, self.rtt.srtt(), ack, report);
        self.stats.acked += u64::from(sum.acked);
        self.stats.lost += u64::from(sum.lost);
        self.stats.reordered += u64::from(sum.reordered);
        self.stats.spurious += u64::from(sum.spurious);
        if sum.acked > 0 || limit_answered {
            // The echoed timestamp is the latest first arrival's: a repeated PSN the receiver
            // already had is no arrival, and then there is no sample.
            if sum.acked > 0 || ack.echo_ts == self.limit_probe_ts {
                let sample = (now as u32).wrapping_sub(ack.echo_ts);
                self.rtt.sample(u64::from(sample));
                self.rtt_at = now;
            }
            self.timer_start = now;
            self.probe_armed = false;
            self.need_probe = false;
            self.backoff = 0;
            self.consecutive_rtos = 0;
            match self.state {
                PathState::Active => {}
                PathState::Suspect => self.state = PathState::Active,
                PathState::Failed => {
                    // Re-admitted: what it learned while failed (losses, a window halved
                    // down to nothing) says nothing about the route it has now.
                    self.state = PathState::Probing;
                    self.probation = PROBATION;
                    self.stats.readmissions += 1;
                    self.cc = self.cc_initial;
                    self.loss_rate = 0;
                    self.ecn_rate = 0;
                }
                PathState::Probing => {
                    let left = self.probation.saturating_sub(sum.acked.min(0xffff) as u16);
                    self.probation = left;
                    if left == 0 {
                        self.state = PathState::Active;
                    }
                }
            }
            self.cc.on_ack(sum.acked);
        }
        // The receiver's own marks shrink the window as the network's do (its queue adds
        // delay all the same), but only the network's say something about this path.
        if ack.ecn_ce > 0 || ack.busy > 0 {
            self.stats.ecn_ce += u64::from(ack.ecn_ce);
            self.stats.busy += u64::from(ack.busy);
            let marks = u32::from(ack.ecn_ce) + u32::from(ack.busy);
            self.cc.on_ecn(now, self.rtt.srtt(), marks);
        }
        // Spurious losses were delivered after all: they count against the loss rate no more.
        let delivered = sum.acked + sum.spurious;
        self.loss_rate = Self::ewma(self.loss_rate, sum.lost, delivered + sum.lost);
        self.ecn_rate = Self::ewma(self.ecn_rate, u32::from(ack.ecn_ce), sum.acked);
        if delivered + sum.lost > 0 {
            self.news_at = now;
        }
        self.update_health();
        sum
    }

    /// The deadline of this path's timer, if armed: the reordering timer of its loss
    /// detection, the end of the hold of a lost packet that keeps its table full
    /// ([`InFlight::hold_deadline`]), or the probe / retransmission timer. A path whose tail
    /// was sent before the newest packet the connection has had acknowledged (`behind`)
    /// probes early ([`Path::behind_deadline`]).
    pub fn deadline(&self, behind: Behind) -> Option<u64> {
        let srtt = self.rtt.srtt();
        super::timer::min_deadline(
            super::timer::min_deadline(
                self.inflight.loss_deadline(srtt),
                self.inflight.hold_deadline(srtt),
            ),
            self.probe_deadline(behind),
        )
    }

    fn probe_deadline(&self, behind: Behind) -> Option<u64> {
        if self.probe_armed {
            return Some(
                self.probe_at
                    .saturating_add(self.rtt.backed_off(self.backoff)),
            );
        }
        if self.inflight.unresolved() > 0 {
            let pto = match self.rtt_or(behind.last_srtt) {
                Some((srtt, _)) => self.rtt.pto(
                    srtt,
                    self.ack_delay
                        .saturating_add(self.inflight.reorder_window(srtt)),
                ),
                None => self.rtt.rto(),
            };
            let pto = self.timer_start.saturating_add(pto);
            return super::timer::min_deadline(Some(pto), self.behind_deadline(behind));
        }
        None
    }

    /// The path's smoothed RTT and RTT variation, or, without a sample of its own, `other`
    /// (a smoothed RTT of the connection's other paths, [`Behind::last_srtt`]) as a first
    /// sample would set them (variation half of it); None with neither. A fresh
    /// connection's path whose first packets were all lost has no sample: a small message's
    /// lost last packet (often its path's only one) would wait for the initial RTO, though
    /// the other paths already say how far the peer is.
    fn rtt_or(&self, other: u64) -> Option<(u64, u64)> {
        if self.rtt.has_sample() {
            Some((self.rtt.srtt(), self.rtt.rttvar()))
        } else if other != 0 {
            Some((other, other / 2))
        } else {
            None
        }
    }

    /// The early probe of a path behind the others: its tail was sent before a packet the
    /// peer acknowledged on another path, so it should have been answered by now as well,
    /// give or take the RTT differences. It is due the path's smoothed RTT plus the larger
    /// of its reordering window and 4 RTT variations after the tail was sent, rather than
    /// two RTTs after the path's last progress: a lost last packet of a step (nothing later
    /// on its path to show it lost) otherwise holds the step for the full probe timeout.
    /// A path without an RTT sample goes by the connection's ([`Path::rtt_or`]).
    fn behind_deadline(&self, behind: Behind) -> Option<u64> {
        let tail = self.inflight.tail_sent()?;
        if tail >= behind.sent {
            return None;
        }
        let (srtt, rttvar) = self.rtt_or(behind.last_srtt)?;
        let margin = self
            .inflight
            .reorder_window(srtt)
            .max(rttvar.saturating_mul(4));
        Some(tail.saturating_add(srtt).saturating_add(margin))
    }

    /// Fires the timer if due: the reordering timer declares overdue packets lost; the first
    /// probe-timer expiry sends a tail-loss probe; an expiry with the probe unanswered is a
    /// retransmission timeout: every unresolved packet is lost, the path moves to a new UDP
    /// source port, backs off and turns Suspect (Failed after `fail_after` in a row). A probe
    /// sent early because the path is behind (`behind`, [`Path::deadline`]) hands the tail's
    /// data back too if the path has been losing ([`RESEND_LOSS_RATE`]). Returns the number
    /// of packets declared lost.
    pub fn on_timer(
        &mut self,
        now: u64,
        rng: &mut XorShift,
        behind: Behind,
        report: impl FnMut(SentItem, Outcome, u64),
    ) -> u32 {
        let mut report = report;
        let srtt = self.rtt.srtt();
        let mut lost = 0;
        if self.inflight.hold_deadline(srtt).is_some_and(|d| d <= now) {
            self.inflight.release_held(now, srtt);
        }
        if self.inflight.loss_deadline(srtt).is_some_and(|d| d <= now) {
            lost = self.inflight.detect_lost(now, srtt, &mut report);
            self.stats.lost += u64::from(lost);
            self.loss_rate = Self::ewma(self.loss_rate, lost, lost);
            self.news_at = now;
            self.update_health();
        }
        match self.probe_deadline(behind) {
            Some(d) if d <= now => {}
            _ => return lost,
        }
        if !self.probe_armed {
            let early = self.behind_deadline(behind).is_some_and(|d| d <= now);
            if early && self.loss_rate >= RESEND_LOSS_RATE {
                let n = self.inflight.resend_tail(&mut report);
                self.stats.tail_resends += u64::from(n);
            }
            // Tail-loss probe (the path's health drops while it is out).
            self.probe_armed = true;
            self.probe_at = now;
            self.need_probe = true;
            self.update_health();
            return lost;
        }
        let timed_out = self.inflight.on_timeout(&mut report);
        self.stats.timeouts += 1;
        self.stats.lost += u64::from(timed_out);
        self.backoff = self.backoff.saturating_add(1).min(16);
        self.consecutive_rtos = self.consecutive_rtos.saturating_add(1);
        if self.consecutive_rtos >= self.fail_after || self.state == PathState::Probing {
            self.fail();
        } else if self.state == PathState::Active {
            self.state = PathState::Suspect;
        }
        // Another route: the old one may be what failed.
        self.sport = rng.source_port(self.sport);
        self.stats.entropy_changes += 1;
        self.rtt.route_changed();
        self.cc.on_timeout();
        self.probe_armed = true;
        self.probe_at = now;
        self.need_probe = true;
        let n = timed_out.max(1);
        self.loss_rate = Self::ewma(self.loss_rate, n, n);
        self.news_at = now;
        self.update_health();
        lost + timed_out
    }

    /// Receive side: whether a sequenced packet with `psn` may be looked at at all (its PSN
    /// is in the receive window, [`PsnWindow::in_window`]); one that is not is counted
    /// (`out_of_window`) and must be dropped before anything else sees it.
    pub fn check_window(&mut self, psn: u32) -> bool {
        let ok = self.recv.in_window(psn);
        if !ok {
            self.stats.out_of_window += 1;
        }
        ok
    }

    /// Receive side: a sequenced packet arrived on this path (its PSN passed
    /// [`Path::check_window`]; one out of the window changes nothing here either).
    pub fn on_receive(&mut self, now: u64, psn: u32, ts: u32, arrival: Arrival) -> bool {
        let recorded = self.recv.record(psn);
        if recorded == super::sack::Recorded::OutOfWindow {
            return false;
        }
        self.last_rx = now;
        // A duplicate too: a probe that repeats a PSN may come on the path's new route.
        if arrival.src_port != 0 {
            self.peer_sport = arrival.src_port;
        }
        let ecn_ce = arrival.ecn_ce;
        let new = recorded == super::sack::Recorded::New;
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
        } else if arrival.rx_busy {
            self.busy = self.busy.saturating_add(1);
        }
        self.recv_pending = true;
        new
    }

    /// The UDP source port for the ACKs and NAKs this path carries: the peer's latest
    /// entropy for the path, so that they take the route the peer chose for the path's way
    /// back; our own port until the peer sent on the path.
    pub fn reply_port(&self) -> u16 {
        if self.peer_sport != 0 {
            self.peer_sport
        } else {
            self.sport
        }
    }

    /// The ACK entry for this path; clears the pending state. The next [`ACK_REPEATS`] ACKs
    /// repeat it ([`Path::take_repeat`]).
    pub fn take_ack(&mut self) -> PathAck {
        let a = self
            .recv
            .to_ack(self.id, self.plane, self.last_ts, (self.ecn_ce, self.busy));
        self.ecn_ce = 0;
        self.busy = 0;
        self.recv_pending = false;
        self.ack_repeats = ACK_REPEATS;
        a
    }

    /// The entry again, for an ACK that has room (None when no repeat is due). CE marks are
    /// not repeated: the sender must not count them twice.
    pub fn take_repeat(&mut self) -> Option<PathAck> {
        if self.recv_pending || self.ack_repeats == 0 {
            return None;
        }
        self.ack_repeats -= 1;
        Some(self.recv.to_ack(self.id, self.plane, self.last_ts, (0, 0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The connection had a packet sent at `sent` acknowledged (no RTT of its own needed).
    fn at(sent: u64) -> Behind {
        Behind { sent, last_srtt: 0 }
    }

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
            min_reorder_window: 0,
        }
    }

    /// A path with eight RTT samples of 10 us (a small RTT variation), then one data packet
    /// (segment 1) in flight, sent at 200 us.
    fn path_with_tail(rng: &mut XorShift) -> Path {
        let mut p = Path::new(0, 0, &cfg(), rng);
        for i in 0..8u64 {
            let t = i * 20_000;
            p.on_send(t, SentItem::default(), false);
            let ack = PathAck {
                cum_psn: i as u32 + 1,
                echo_ts: t as u32,
                ..PathAck::default()
            };
            p.on_ack(t + 10_000, &ack, |_, _, _| {});
        }
        let item = SentItem {
            seg: 1,
            ..SentItem::default()
        };
        p.on_send(200_000, item, false);
        p
    }

    /// A path whose table is full behind a packet declared lost, with everything after it
    /// acknowledged, has nothing to be acknowledged or to time out: its timer gives the
    /// packet up when its hold ends, and the path has window room again.
    #[test]
    fn a_full_table_held_by_a_loss_is_released_by_the_timer() {
        let mut rng = XorShift::new(1);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        for seg in 0..crate::wire::SACK_BITS as u32 {
            let item = SentItem {
                seg,
                ..SentItem::default()
            };
            assert!(p.on_send(0, item, false).is_some());
        }
        let mut ack = PathAck {
            cum_psn: 0,
            echo_ts: 0,
            ..PathAck::default()
        };
        for i in 0..crate::wire::SACK_BITS - 1 {
            ack.sack[i / 64] |= 1 << (i % 64);
        }
        let mut lost = 0;
        p.on_ack(50_000, &ack, |_, o, _| {
            lost += u32::from(o == Outcome::Lost)
        });
        assert_eq!((lost, p.inflight.unresolved()), (1, 0));
        assert!(!p.has_window(p.health()), "the loss holds the table");
        let d = p
            .deadline(Behind::NONE)
            .expect("a full table held by a loss has a deadline");
        p.on_timer(d, &mut rng, Behind::NONE, |_, _, _| {});
        assert!(p.has_window(p.health()));
        assert_eq!(p.deadline(Behind::NONE), None);
    }

    /// A path whose tail was sent before a packet acknowledged on another path probes at
    /// its RTT plus a margin after the tail, not two RTTs after its last progress; if it
    /// has been losing, the tail's data goes back to be sent again, once.
    #[test]
    fn a_path_behind_the_others_probes_early_and_resends_its_tail() {
        let mut rng = XorShift::new(1);
        let mut p = path_with_tail(&mut rng);
        let normal = p.deadline(Behind::NONE).unwrap();
        // Nothing newer delivered elsewhere: the usual probe timeout.
        assert_eq!(p.deadline(at(200_000)), Some(normal));
        let early = p.deadline(at(205_000)).unwrap();
        assert!(early < normal, "{early} < {normal}");
        assert!(
            early >= 210_000,
            "not before an RTT after the tail: {early}"
        );
        p.loss_rate = 1_000;
        let mut v = std::vec::Vec::new();
        assert_eq!(
            p.on_timer(early - 1, &mut rng, at(205_000), |_, _, _| {}),
            0
        );
        assert!(!p.need_probe);
        p.on_timer(early, &mut rng, at(205_000), |it, o, _| v.push((it.seg, o)));
        assert_eq!(v, std::vec![(1, Outcome::Lost)]);
        assert!(p.need_probe);
        assert_eq!(p.stats.tail_resends, 1);
        // Its timeout later reports nothing more: the data went back already.
        let rto = p.deadline(at(205_000)).unwrap();
        p.on_timer(rto, &mut rng, at(205_000), |it, o, _| v.push((it.seg, o)));
        assert_eq!(v.len(), 1);
        assert_eq!(p.stats.timeouts, 1);
    }

    /// A path behind the others that has not lost lately probes early without resending.
    #[test]
    fn a_path_not_losing_lately_probes_without_resending() {
        let mut rng = XorShift::new(1);
        let mut p = path_with_tail(&mut rng);
        assert_eq!(p.loss_rate(), 0);
        let early = p.deadline(at(205_000)).unwrap();
        p.on_timer(early, &mut rng, at(205_000), |_, _, _| {
            panic!("nothing resent")
        });
        assert!(p.need_probe);
        assert_eq!(p.stats.tail_resends, 0);
    }

    /// A path without an RTT sample probes at its initial RTO, or, when it is the
    /// connection's last with packets unanswered, by the other paths' smoothed RTT as a first
    /// sample would set its own: 2 srtt + ACK delay + reordering window (a quarter srtt).
    #[test]
    fn a_path_without_a_sample_borrows_the_connections_rtt() {
        let mut rng = XorShift::new(1);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        p.on_send(500_000, SentItem::default(), false);
        assert_eq!(p.deadline(Behind::NONE), Some(1_500_000));
        let last = Behind {
            sent: 0,
            last_srtt: 40_000,
        };
        assert_eq!(p.deadline(last), Some(500_000 + 80_000 + 10_000 + 10_000));
        // Behind the others too: due srtt + 4 (srtt / 2) after the tail, which is later here.
        let behind = Behind {
            sent: 600_000,
            ..last
        };
        assert_eq!(p.deadline(behind), Some(500_000 + 80_000 + 10_000 + 10_000));
        // Never beyond its RTO.
        let far = Behind {
            sent: 0,
            last_srtt: 5_000_000,
        };
        assert_eq!(p.deadline(far), Some(1_500_000));
        // Its own first sample (20 us) wins over any borrowed RTT.
        p.on_ack(
            520_000,
            &PathAck {
                cum_psn: 1,
                echo_ts: 500_000,
                ..PathAck::default()
            },
            |_, _, _| {},
        );
        p.on_send(600_000, SentItem::default(), false);
        assert_eq!(p.deadline(last), Some(600_000 + 40_000 + 10_000 + 5_000));
    }

    #[test]
    fn tlp_then_rto_changes_entropy_and_state() {
        let mut rng = XorShift::new(1);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        let port = p.sport;
        assert_eq!(p.deadline(Behind::NONE), None);
        p.on_send(0, SentItem::default(), false);
        let d = p.deadline(Behind::NONE).unwrap();
        assert_eq!(p.on_timer(d - 1, &mut rng, Behind::NONE, |_, _, _| {}), 0);
        assert!(!p.need_probe);
        // Tail-loss probe.
        assert_eq!(p.on_timer(d, &mut rng, Behind::NONE, |_, _, _| {}), 0);
        assert!(p.need_probe);
        assert_eq!(p.state, PathState::Active);
        let d2 = p.deadline(Behind::NONE).unwrap();
        assert_eq!(p.on_timer(d2, &mut rng, Behind::NONE, |_, _, _| {}), 1);
        assert_eq!(p.state, PathState::Suspect);
        assert_ne!(p.sport, port);
        let d3 = p.deadline(Behind::NONE).unwrap();
        assert!(d3 - d2 > d2 - d, "backed off");
        p.on_timer(d3, &mut rng, Behind::NONE, |_, _, _| {});
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
        // Re-admitted on probation; Active once PROBATION packets are acknowledged.
        assert_eq!(p.state, PathState::Probing);
        assert!(p.usable());
        assert_eq!((p.stats.failures, p.stats.readmissions), (1, 1));
        assert_eq!(p.rtt.srtt(), 50_000);
        assert_eq!(p.deadline(Behind::NONE), None);
        let t = d3 + 60_000;
        for _ in 0..PROBATION {
            p.on_send(t, SentItem::default(), false);
        }
        let ack = PathAck {
            cum_psn: p.inflight.next_psn(),
            echo_ts: t as u32,
            ..PathAck::default()
        };
        p.on_ack(t + 50_000, &ack, |_, _, _| {});
        assert_eq!(p.state, PathState::Active);
        assert_eq!(p.stats.failures, 1);
    }

    #[test]
    fn loss_lowers_health_and_window_then_recovers() {
        let mut rng = XorShift::new(3);
        let mut c = cfg();
        c.initial_cwnd = 64;
        let mut p = Path::new(0, 0, &c, &mut rng);
        assert_eq!((p.health(), p.weight(0, 0)), (FULL_HEALTH, 1024));
        // Every other packet lost, for a while.
        let mut t = 0u64;
        for _ in 0..20 {
            let first = p.inflight.next_psn();
            for _ in 0..8 {
                p.on_send(t, SentItem::default(), false);
            }
            let mut sack = [0u64; super::super::super::wire::SACK_WORDS];
            for k in (1..8).step_by(2) {
                sack[0] |= 1 << (k - 1);
            }
            let ack = PathAck {
                cum_psn: first,
                echo_ts: t as u32,
                sack,
                ..PathAck::default()
            };
            t += 10_000;
            p.on_ack(t, &ack, |_, _, _| {});
            t += 1_000_000;
            p.on_timer(t, &mut rng, Behind::NONE, |_, _, _| {});
            let ack = PathAck {
                cum_psn: p.inflight.next_psn(),
                echo_ts: t as u32,
                ..PathAck::default()
            };
            p.on_ack(t, &ack, |_, _, _| {});
        }
        assert!(p.loss_rate() > 20_000, "{}", p.loss_rate());
        assert!(p.health() < 400, "{}", p.health());
        let h = p.health();
        // Clean traffic brings it back.
        for _ in 0..50 {
            for _ in 0..8 {
                p.on_send(t, SentItem::default(), false);
            }
            let ack = PathAck {
                cum_psn: p.inflight.next_psn(),
                echo_ts: t as u32,
                ..PathAck::default()
            };
            t += 10_000;
            p.on_ack(t, &ack, |_, _, _| {});
        }
        assert!(p.health() > 1000 && p.health() > h, "{}", p.health());
    }

    /// One round of 8 packets sent at `t`, every other one lost: a SACK, the reordering
    /// timer declaring the holes lost, an ACK for the rest. Returns when the round ended.
    fn lossy_round(p: &mut Path, rng: &mut XorShift, t: u64) -> u64 {
        let first = p.inflight.next_psn();
        for _ in 0..8 {
            p.on_send(t, SentItem::default(), false);
        }
        let mut sack = [0u64; super::super::super::wire::SACK_WORDS];
        for k in (1..8).step_by(2) {
            sack[0] |= 1 << (k - 1);
        }
        let ack = |cum_psn, sack| PathAck {
            cum_psn,
            echo_ts: t as u32,
            sack,
            ..PathAck::default()
        };
        p.on_ack(t + 10_000, &ack(first, sack), |_, _, _| {});
        let end = p.deadline(Behind::NONE).unwrap_or(t + 20_000);
        p.on_timer(end, rng, Behind::NONE, |_, _, _| {});
        // One more packet, acknowledged: nothing left outstanding.
        p.on_send(end, SentItem::default(), false);
        p.on_ack(
            end + 10_000,
            &ack(p.inflight.next_psn(), [0; _]),
            |_, _, _| {},
        );
        end + 10_000
    }

    #[test]
    fn estimates_without_news_age_back_to_health() {
        let mut rng = XorShift::new(5);
        let mut c = cfg();
        c.initial_cwnd = 64;
        let mut p = Path::new(0, 0, &c, &mut rng);
        let mut t = 10_000_000;
        for _ in 0..10 {
            t = lossy_round(&mut p, &mut rng, t);
        }
        assert_eq!(p.state, PathState::Active);
        let (loss, health) = (p.loss_rate(), p.health());
        assert!(loss > 15_000 && health < 500, "{loss} {health}");
        let period = p.age_period();
        // Within a period of the last news: as measured.
        p.age(t + period - 1);
        assert_eq!(p.loss_rate(), loss);
        // Not Active: unanswered packets are news enough, no aging.
        p.state = PathState::Suspect;
        p.age(t + 5 * period);
        assert_eq!(p.loss_rate(), loss);
        p.state = PathState::Active;
        // A period without news halves the rate; news starts the clock again.
        p.age(t + period);
        assert_eq!(p.loss_rate(), loss >> 1);
        let t = lossy_round(&mut p, &mut rng, t + 2 * period);
        let (loss, period) = (p.loss_rate(), p.age_period());
        p.age(t + period - 1);
        assert_eq!(p.loss_rate(), loss);
        // Long without news: back to (nearly) full health, so picked and measured again.
        p.age(t + 20 * period);
        assert!(p.health() > 1000, "{}", p.health());
    }

    #[test]
    fn a_stale_rtt_stops_lowering_the_weight() {
        let mut rng = XorShift::new(6);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        p.on_send(0, SentItem::default(), false);
        let t = 400_000;
        let ack = PathAck {
            cum_psn: p.inflight.next_psn(),
            echo_ts: 0,
            ..PathAck::default()
        };
        p.on_ack(t, &ack, |_, _, _| {});
        let srtt = p.rtt.srtt();
        assert!(srtt >= 400_000, "{srtt}");
        // Over four times the best path's: a quarter of the weight, while the sample is fresh.
        assert_eq!(p.weight(srtt / 5, t), FULL_HEALTH as i32 / 4);
        assert_eq!(
            p.weight(srtt / 5, t + p.age_period() + 1),
            FULL_HEALTH as i32
        );
    }

    #[test]
    fn window_grows_and_halves_on_ecn() {
        let mut rng = XorShift::new(1);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        for _ in 0..4 {
            p.on_send(0, SentItem::default(), false);
        }
        assert!(!p.has_window(FULL_HEALTH));
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

    #[test]
    fn busy_marks_shrink_the_window_but_say_nothing_of_the_path() {
        // Two packets acknowledged with one mark, the network's or the receiver's own.
        let marked = |ack: PathAck| {
            let mut rng = XorShift::new(1);
            let mut p = Path::new(0, 0, &cfg(), &mut rng);
            for _ in 0..4 {
                p.on_send(0, SentItem::default(), false);
            }
            let first = PathAck {
                cum_psn: 2,
                ..PathAck::default()
            };
            p.on_ack(1000, &first, |_, _, _| {});
            let (cwnd, health) = (p.cc.cwnd(), p.health);
            p.on_ack(1_000_000, &PathAck { cum_psn: 4, ..ack }, |_, _, _| {});
            assert!(p.cc.cwnd() < cwnd);
            (
                p.ecn_rate(),
                p.health < health,
                p.stats.ecn_ce,
                p.stats.busy,
            )
        };
        let (rate, lower, ce, busy) = marked(PathAck {
            ecn_ce: 1,
            ..PathAck::default()
        });
        assert!(rate > 0 && lower && (ce, busy) == (1, 0));
        let (rate, lower, ce, busy) = marked(PathAck {
            busy: 1,
            ..PathAck::default()
        });
        assert!(rate == 0 && !lower && (ce, busy) == (0, 1));
    }

    #[test]
    fn the_receiver_echoes_its_own_marks_apart_once() {
        let mut rng = XorShift::new(1);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        let busy = Arrival {
            rx_busy: true,
            ..Arrival::default()
        };
        p.on_receive(10, 0, 1, busy);
        p.on_receive(
            11,
            1,
            2,
            Arrival {
                ecn_ce: true,
                ..busy
            },
        );
        p.on_receive(12, 2, 3, busy);
        p.on_receive(13, 3, 4, Arrival::default());
        let a = p.take_ack();
        // A CE-marked arrival counts as CE only.
        assert_eq!((a.cum_psn, a.ecn_ce, a.busy), (4, 1, 2));
        let r = p.take_repeat().unwrap();
        assert_eq!((r.cum_psn, r.ecn_ce, r.busy), (4, 0, 0));
        p.on_receive(14, 4, 5, Arrival::default());
        let a = p.take_ack();
        assert_eq!((a.ecn_ce, a.busy), (0, 0));
    }

    /// Sends a data packet, then lets every timer fire with nothing answered: a probe per
    /// timeout, as a blackholed path does. Returns the probes' PSNs and the time of the last.
    fn blackholed(p: &mut Path, rng: &mut XorShift, timeouts: usize) -> (std::vec::Vec<u32>, u64) {
        let mut t = 1_000;
        p.on_send(t, SentItem::default(), false);
        let mut psns = std::vec::Vec::new();
        for _ in 0..timeouts {
            t = p.deadline(Behind::NONE).unwrap();
            p.on_timer(t, rng, Behind::NONE, |_, _, _| {});
            if p.need_probe {
                assert!(p.can_probe());
                psns.push(p.on_send_probe(t).unwrap());
                p.need_probe = false;
            }
        }
        (psns, t)
    }

    #[test]
    fn a_path_dead_past_the_window_probes_with_an_earlier_psn_and_comes_back() {
        use super::super::sack::{Recorded, RECV_WINDOW};
        let mut rng = XorShift::new(7);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        let (psns, t) = blackholed(&mut p, &mut rng, 3_000);
        assert_eq!(p.state, PathState::Failed);
        // The data packet and RECV_WINDOW probes took new PSNs; the rest repeat one.
        let next = p.inflight.next_psn();
        assert_eq!(next, RECV_WINDOW + 1);
        let r = next - 257;
        assert_eq!(
            p.stats.limit_probes,
            psns.len() as u64 - u64::from(RECV_WINDOW)
        );
        assert!(psns.iter().skip(RECV_WINDOW as usize).all(|&q| q == r));
        // A receiver that heard nothing takes every one of them.
        let mut rx = PsnWindow::new(0);
        assert!(psns.iter().all(|&q| rx.in_window(q)));
        // The route comes back: the last probe arrives, new, and slides the window.
        assert_eq!(rx.record(r), Recorded::New);
        let ack = rx.to_ack(0, 0, t as u32, (0, 0));
        let s = p.on_ack(t + 30_000, &ack, |_, _, _| {});
        assert_eq!(s.acked, 0, "no packet of the table");
        assert_eq!(p.state, PathState::Probing);
        assert_eq!(p.stats.readmissions, 1);
        assert_eq!(p.rtt.srtt(), 30_000, "the probe's own arrival: a sample");
        assert_eq!(p.deadline(Behind::NONE), None);
        assert!(p.has_window(FULL_HEALTH));
        let psn = p.on_send(t + 40_000, SentItem::default(), false).unwrap();
        assert_eq!(psn, next);
        assert!(rx.in_window(psn));
    }

    #[test]
    fn a_path_whose_acks_were_lost_is_answered_by_a_duplicate() {
        let mut rng = XorShift::new(8);
        let mut p = Path::new(0, 0, &cfg(), &mut rng);
        let (psns, t) = blackholed(&mut p, &mut rng, 2_000);
        assert!(p.stats.limit_probes > 0);
        // The receiver had everything (only its ACKs were lost): the repeated PSN is a
        // duplicate, and the echoed timestamp is an older packet's.
        let mut rx = PsnWindow::new(0);
        rx.record(0);
        for &q in &psns {
            rx.record(q);
        }
        assert_eq!(rx.cum(), p.inflight.next_psn());
        let ack = rx.to_ack(0, 0, 5, (0, 0));
        p.on_ack(t + 30_000, &ack, |_, _, _| {});
        assert_eq!(p.state, PathState::Probing);
        assert!(!p.rtt.has_sample(), "no sample from a stale timestamp");
        assert_eq!(p.inflight.peer_cum(), p.inflight.next_psn());
        assert!(p.has_window(FULL_HEALTH));
    }
}
