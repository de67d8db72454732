// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Sender-side loss detection on one path: the in-flight table of the path's PSN space.
//!
//! Every path has its own PSN space, so reordering *across* paths (the normal case when
//! packets are sprayed over routes of different delays) never looks like loss. A path is one
//! ECMP route and normally delivers in order; when it does not (a route change, a reordering
//! link), the rule below tolerates it. A packet is declared **lost** when a packet sent after
//! it on the same path has been acknowledged and it has been outstanding for longer than the
//! RTT of that later packet (or the smoothed RTT, if larger: a packet sent into a longer local
//! queue has a longer RTT) plus a reordering window (RACK, RFC 8985, per path): its data is
//! handed back at once to be resent (on any path, as a new packet). The reordering window is
//! a quarter of the smoothed RTT, widened to cover every reordering the path has shown (a
//! hole later filled by its original packet: retransmissions carry new PSNs, so a filled
//! hole is always reordering), and narrowed again after a long run without any.
//!
//! What an ACK does not resolve, the path's timers do ([`super::path`]): the reordering
//! timer for packets inside the window, a tail-loss probe, then a retransmission timeout that
//! declares every unresolved packet lost.
//!
//! A path never takes a PSN more than [`RECV_WINDOW`] beyond the last cumulative PSN its peer
//! reported: the receiver drops anything further. Only timeouts can bring a path there (they
//! resolve packets nobody acknowledged, so every timeout lets up to 256 more PSNs go out, and
//! a path that stays dead sends a probe with a new PSN at every one); at that limit its
//! probes repeat an earlier PSN ([`InFlight::limit_probe_psn`]).

use super::super::wire::{seq_lt, PathAck, SACK_BITS};
use super::super::zero::{zero_valid, ZeroValid};
use super::sack::RECV_WINDOW;

/// What a packet carried, so an ACK or a loss can be reported to its owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SentItem {
    /// Who owns the packet.
    pub kind: ItemKind,
    /// Stream slot index.
    pub stream: u16,
    /// Message (requester's MSN).
    pub msn: u32,
    /// Segment (packet index) within the message.
    pub seg: u32,
    /// The message's send attempt (bumped when an RNR NAK restarts it).
    pub attempt: u16,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
/// Owner of a sent packet.
pub enum ItemKind {
    /// A requester packet (SEND/WRITE data, READ or atomic request).
    #[default]
    Request,
    /// A responder packet (READ response data, atomic response).
    Response,
    /// A probe: carries nothing.
    Probe,
}
zero_valid!(ItemKind::Request);

/// How a packet was resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The path acknowledged it (possibly after it was declared lost: then its data arrived
    /// after all, and the owner may stop waiting for the retransmission).
    Acked,
    /// A later PSN on the same path was acknowledged and the reordering window passed.
    Lost,
    /// The path's retransmission timer expired.
    TimedOut,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
enum SlotState {
    /// Nothing, or resolved for good.
    #[default]
    Free,
    /// Sent, neither acknowledged nor declared lost.
    Live,
    /// Declared lost by the reordering rule; an ACK for it later is a spurious loss.
    Lost,
}
zero_valid!(SlotState::Free);

/// One PSN of the table; the [`SentItem`] fields are inlined (24 bytes instead of 32: 2 KiB
/// less per path).
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    sent_at: u64,
    msn: u32,
    seg: u32,
    stream: u16,
    attempt: u16,
    kind: ItemKind,
    state: SlotState,
    /// Its data was handed back to be sent again while it was still Live
    /// ([`InFlight::resend_tail`]): a later loss or timeout of it reports nothing more.
    resent: bool,
}
zero_valid!(struct Slot { sent_at, msn, seg, stream, attempt, kind, state, resent });

impl Slot {
    fn new(now: u64, item: SentItem) -> Self {
        Slot {
            sent_at: now,
            msn: item.msn,
            seg: item.seg,
            stream: item.stream,
            attempt: item.attempt,
            kind: item.kind,
            state: SlotState::Live,
            resent: false,
        }
    }

    fn item(&self) -> SentItem {
        SentItem {
            kind: self.kind,
            stream: self.stream,
            msn: self.msn,
            seg: self.seg,
            attempt: self.attempt,
        }
    }
}

/// Result of applying one ACK entry or running loss detection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckSummary {
    /// Packets newly acknowledged.
    pub acked: u32,
    /// Packets newly declared lost.
    pub lost: u32,
    /// Acknowledged packets that arrived after a later packet of the path (reordering).
    pub reordered: u32,
    /// Of those, packets that had already been declared lost (spurious losses).
    pub spurious: u32,
    /// The largest reordering extent seen (how much later than the packets sent after it
    /// a reordered packet arrived), ns; 0 if none.
    pub reorder_extent: u64,
}

/// After this many loss detections without reordering seen in between, the learned
/// reordering window is halved (RFC 8985's `reo_wnd_persist`, 16 loss recoveries): only loss
/// shows that a wide window costs something (it delays loss detection), so only loss shrinks
/// it. Reordering that comes and goes (a transfer without it between two with it) is not
/// forgotten in between.
const REORDER_PERSIST: u32 = 16;

/// In-flight table of one path: PSNs `[una, next)`, at most 256 of them, and no more than
/// [`RECV_WINDOW`] beyond the peer's last reported cumulative PSN.
#[derive(Clone, Debug)]
pub struct InFlight {
    una: u32,
    next: u32,
    /// The highest cumulative PSN the peer reported for the path (at most `next`): the
    /// receiver's is never below it, so every PSN up to `peer_cum + RECV_WINDOW` is in its
    /// window.
    peer_cum: u32,
    unresolved: u32,
    /// Probes among the unresolved packets.
    probes: u32,
    /// Highest PSN acknowledged so far (valid when `has_high`).
    high: u32,
    has_high: bool,
    /// RTT of the packet `high` (sent last among the acknowledged ones), ns.
    rack_rtt: u64,
    /// Reordering window learned from observed reordering, ns.
    reo_learned: u64,
    /// Loss detections since reordering was last seen (see [`REORDER_PERSIST`]).
    losses_since_reorder: u32,
    /// Smallest reordering window, ns.
    reo_floor: u64,
    /// A timeout left packets declared lost below `una` (kept to notice a late arrival)
    /// until `next` reaches `lost_behind_until`, when their slots have all been reused.
    /// Otherwise every slot below `una` is free.
    lost_behind: bool,
    lost_behind_until: u32,
    slots: [Slot; SACK_BITS],
}
zero_valid!(struct InFlight {
    una, next, peer_cum, unresolved, probes, high, has_high, rack_rtt, reo_learned,
    losses_since_reorder, reo_floor, lost_behind, lost_behind_until, slots,
});

impl InFlight {
    /// An empty table starting at `initial_psn`.
    pub fn new(initial_psn: u32) -> Self {
        InFlight {
            una: initial_psn,
            next: initial_psn,
            peer_cum: initial_psn,
            unresolved: 0,
            probes: 0,
            high: initial_psn,
            has_high: false,
            rack_rtt: 0,
            reo_learned: 0,
            losses_since_reorder: 0,
            reo_floor: 0,
            lost_behind: false,
            lost_behind_until: 0,
            slots: [Slot::default(); SACK_BITS],
        }
    }

    /// The same with a smallest reordering window of `floor` ns.
    pub fn with_reorder_floor(mut self, floor: u64) -> Self {
        self.reo_floor = floor;
        self
    }

    /// Sets the smallest reordering window, ns.
    pub fn set_reorder_floor(&mut self, floor: u64) {
        self.reo_floor = floor;
    }

    /// Re-initialises in place.
    pub fn reset(&mut self, initial_psn: u32) {
        self.una = initial_psn;
        self.next = initial_psn;
        self.peer_cum = initial_psn;
        self.unresolved = 0;
        self.probes = 0;
        self.high = initial_psn;
        self.has_high = false;
        self.rack_rtt = 0;
        self.reo_learned = 0;
        self.losses_since_reorder = 0;
        self.lost_behind = false;
        self.lost_behind_until = 0;
        for s in self.slots.iter_mut() {
            *s = Slot::default();
        }
    }

    fn slot(&mut self, psn: u32) -> Option<&mut Slot> {
        self.slots.get_mut(psn as usize % SACK_BITS)
    }

    /// Packets neither acknowledged nor declared lost.
    pub fn unresolved(&self) -> u32 {
        self.unresolved
    }

    /// Unresolved packets that carry data (requests and responses), probes left out: what
    /// the path holds of the connection's window. A path that lost its route keeps probing
    /// it, and its probes must not take the window the data needs on the other paths.
    pub fn unresolved_data(&self) -> u32 {
        self.unresolved.saturating_sub(self.probes)
    }

    /// The PSN the next packet gets.
    pub fn next_psn(&self) -> u32 {
        self.next
    }

    /// The highest cumulative PSN the peer reported for this path.
    pub fn peer_cum(&self) -> u32 {
        self.peer_cum
    }

    /// Room for another PSN: the span `[una, next]` must stay within the SACK bitmap, and
    /// `next` within the receiver's window ([`InFlight::window_limited`]).
    pub fn has_room(&self) -> bool {
        (self.next.wrapping_sub(self.una) as usize) < SACK_BITS && !self.window_limited()
    }

    /// `next` is more than [`RECV_WINDOW`] beyond the peer's last reported cumulative PSN:
    /// the receiver might drop it, so the path takes no new PSN until the peer reports
    /// progress. Until a timeout `next` stays within 2 x 256 + 1 of it (see [`RECV_WINDOW`]):
    /// only a path whose packets go unanswered through many timeouts gets here.
    pub fn window_limited(&self) -> bool {
        self.next.wrapping_sub(self.peer_cum) > RECV_WINDOW
    }

    /// The PSN a probe repeats while the path is [`InFlight::window_limited`]: `next - 257`.
    /// It is in the receiver's window (`RECV_WINDOW - 256` beyond `peer_cum`) and below every
    /// PSN this table still looks at (the 256 before `next`), so an ACK for it resolves no
    /// packet of the table. A receiver that already has it answers a duplicate; one that
    /// never saw it slides its window to 256 below it, to just below the PSNs the table
    /// tracks (all it skips was given up by timeouts): either way its ACK reports a
    /// cumulative PSN at most 2 x 256 + 1 below `next`, and the path has room again.
    pub fn limit_probe_psn(&self) -> u32 {
        self.next.wrapping_sub(SACK_BITS as u32 + 1)
    }

    /// The reordering window for a path whose smoothed RTT is `srtt`: a quarter of it, or
    /// the reordering learned on the path if that is larger (at most 8 * `srtt`), and at
    /// least the configured floor.
    pub fn reorder_window(&self, srtt: u64) -> u64 {
        let learned = self.reo_learned.min(srtt.saturating_mul(8));
        (srtt / 4).max(learned).max(self.reo_floor)
    }

    /// Records a packet sent now; returns its PSN, or None without room.
    pub fn push(&mut self, now: u64, item: SentItem) -> Option<u32> {
        if !self.has_room() {
            return None;
        }
        let psn = self.next;
        *self.slot(psn)? = Slot::new(now, item);
        self.next = psn.wrapping_add(1);
        if self.lost_behind && !seq_lt(self.next, self.lost_behind_until) {
            self.lost_behind = false;
        }
        self.unresolved = self.unresolved.saturating_add(1);
        if item.kind == ItemKind::Probe {
            self.probes = self.probes.saturating_add(1);
        }
        Some(psn)
    }

    /// Widens the reordering window to cover a reordering of `extent` ns (seen on this path,
    /// or on another path of the connection: the fabric reorders).
    pub fn learn_reordering(&mut self, extent: u64) {
        // A quarter more than the largest extent seen, so the next one like it passes.
        let want = extent.saturating_add(extent / 4);
        self.reo_learned = self.reo_learned.max(want);
        self.losses_since_reorder = 0;
    }

    /// Applies a path ACK entry: reports newly acknowledged packets (also those declared lost
    /// before, counted as spurious), then runs loss detection ([`InFlight::detect_lost`]).
    pub fn on_ack(
        &mut self,
        now: u64,
        srtt: u64,
        ack: &PathAck,
        mut report: impl FnMut(SentItem, Outcome, u64),
    ) -> AckSummary {
        let mut sum = AckSummary::default();
        let mut probes = 0;
        // The peer's cumulative PSN only grows; one beyond what was sent is not the peer's.
        if seq_lt(self.peer_cum, ack.cum_psn) && !seq_lt(self.next, ack.cum_psn) {
            self.peer_cum = ack.cum_psn;
        }
        let prev_high = self.has_high.then_some(self.high);
        // Every PSN whose slot may still be meaningful: those from `una` on, and, after a
        // timeout, the last 256 sent (slots of PSNs below `una` can only be Lost ones kept to
        // notice a late arrival). Most ACKs so look at a few slots, not 256.
        let low = if self.lost_behind {
            self.next.wrapping_sub(SACK_BITS as u32)
        } else {
            self.una
        };
        let span = self.next.wrapping_sub(low).min(SACK_BITS as u32);
        for i in 0..span {
            let psn = low.wrapping_add(i);
            if !ack.acks(psn) {
                continue;
            }
            let below_una = seq_lt(psn, self.una);
            let rack_rtt = self.rack_rtt;
            let Some(s) = self.slot(psn) else { continue };
            let state = s.state;
            if state == SlotState::Free || (below_una && state == SlotState::Live) {
                continue;
            }
            let (item, at) = (s.item(), s.sent_at);
            s.state = SlotState::Free;
            let rtt = now.saturating_sub(at);
            let reordered = prev_high.is_some_and(|h| seq_lt(psn, h));
            if reordered {
                sum.reordered += 1;
                let extent = rtt.saturating_sub(rack_rtt).max(1);
                sum.reorder_extent = sum.reorder_extent.max(extent);
                self.learn_reordering(extent);
            }
            if state == SlotState::Lost {
                sum.spurious += 1;
            } else {
                sum.acked += 1;
                probes += u32::from(item.kind == ItemKind::Probe);
                if !self.has_high || !seq_lt(psn, self.high) {
                    self.high = psn;
                    self.has_high = true;
                    self.rack_rtt = rtt;
                }
            }
            report(item, Outcome::Acked, at);
        }
        self.unresolved = self.unresolved.saturating_sub(sum.acked);
        self.probes = self.probes.saturating_sub(probes);
        sum.lost = self.detect_lost(now, srtt, &mut report);
        self.advance(now, srtt);
        sum
    }

    /// Declares lost every unresolved packet sent before the highest acknowledged one and
    /// outstanding for longer than that one's RTT (or `srtt`, if larger) plus the reordering
    /// window. Returns how many.
    pub fn detect_lost(
        &mut self,
        now: u64,
        srtt: u64,
        mut report: impl FnMut(SentItem, Outcome, u64),
    ) -> u32 {
        if !self.has_high {
            return 0;
        }
        let wait = self
            .rack_rtt
            .max(srtt)
            .saturating_add(self.reorder_window(srtt));
        let (high, span) = (self.high, self.next.wrapping_sub(self.una));
        let (mut n, mut probes) = (0, 0);
        for i in 0..span {
            let psn = self.una.wrapping_add(i);
            if !seq_lt(psn, high) {
                break;
            }
            if let Some(s) = self.slot(psn) {
                if s.state == SlotState::Live && now.saturating_sub(s.sent_at) >= wait {
                    s.state = SlotState::Lost;
                    n += 1;
                    let (item, at) = (s.item(), s.sent_at);
                    probes += u32::from(item.kind == ItemKind::Probe);
                    if !s.resent {
                        report(item, Outcome::Lost, at);
                    }
                }
            }
        }
        self.unresolved = self.unresolved.saturating_sub(n);
        self.probes = self.probes.saturating_sub(probes);
        if n > 0 && self.reo_learned > 0 {
            // A loss detection the learned window delayed (see `REORDER_PERSIST`).
            self.losses_since_reorder = self.losses_since_reorder.saturating_add(1);
            if self.losses_since_reorder >= REORDER_PERSIST {
                self.losses_since_reorder = 0;
                self.reo_learned /= 2;
            }
        }
        self.advance(now, srtt);
        n
    }

    /// When [`InFlight::detect_lost`] will next declare a packet lost, if no ACK comes first.
    pub fn loss_deadline(&self, srtt: u64) -> Option<u64> {
        if !self.has_high {
            return None;
        }
        let wait = self
            .rack_rtt
            .max(srtt)
            .saturating_add(self.reorder_window(srtt));
        let span = self.next.wrapping_sub(self.una);
        for i in 0..span {
            let psn = self.una.wrapping_add(i);
            if !seq_lt(psn, self.high) {
                break;
            }
            if let Some(s) = self.slots.get(psn as usize % SACK_BITS) {
                if s.state == SlotState::Live {
                    // The oldest such packet is the first due (PSN order is send order).
                    return Some(s.sent_at.saturating_add(wait));
                }
            }
        }
        None
    }

    /// The newest unresolved packet's PSN (the path's tail), if there is one.
    fn tail_psn(&self) -> Option<u32> {
        let span = self.next.wrapping_sub(self.una).min(SACK_BITS as u32);
        (1..=span).map(|i| self.next.wrapping_sub(i)).find(|&psn| {
            self.slots
                .get(psn as usize % SACK_BITS)
                .is_some_and(|s| s.state == SlotState::Live)
        })
    }

    /// When the newest unresolved packet (the path's tail) was sent, if there is one.
    pub fn tail_sent(&self) -> Option<u64> {
        let psn = self.tail_psn()?;
        self.slots.get(psn as usize % SACK_BITS).map(|s| s.sent_at)
    }

    /// Hands the tail's data back to be sent again (reported as lost) while the packet stays
    /// in flight: an ACK for it later is reported as usual, a loss or timeout of it no more.
    /// Nothing if the tail is a probe or was handed back already. Returns how many packets
    /// were handed back (0 or 1).
    pub fn resend_tail(&mut self, mut report: impl FnMut(SentItem, Outcome, u64)) -> u32 {
        let Some(psn) = self.tail_psn() else { return 0 };
        let Some(s) = self.slot(psn) else { return 0 };
        if s.resent || s.kind == ItemKind::Probe {
            return 0;
        }
        s.resent = true;
        let (item, at) = (s.item(), s.sent_at);
        report(item, Outcome::Lost, at);
        1
    }

    /// Retransmission timeout: every unresolved packet is lost.
    pub fn on_timeout(&mut self, mut report: impl FnMut(SentItem, Outcome, u64)) -> u32 {
        let span = self.next.wrapping_sub(self.una);
        let mut n = 0;
        let mut left_lost = false;
        for i in 0..span {
            let psn = self.una.wrapping_add(i);
            if let Some(s) = self.slot(psn) {
                left_lost |= s.state == SlotState::Lost;
                if s.state == SlotState::Live {
                    s.state = SlotState::Free;
                    n += 1;
                    let (item, at) = (s.item(), s.sent_at);
                    if !s.resent {
                        report(item, Outcome::TimedOut, at);
                    }
                }
            }
        }
        if left_lost {
            // Left behind `una`: ACKs look at the whole window until its slots are reused.
            self.lost_behind = true;
            self.lost_behind_until = self.next.wrapping_add(SACK_BITS as u32);
        }
        self.unresolved = 0;
        self.probes = 0;
        self.una = self.next;
        n
    }

    /// How long a packet declared lost holds `una` ([`InFlight::advance`]): twice the loss
    /// threshold.
    fn hold(&self, srtt: u64) -> u64 {
        self.rack_rtt
            .max(srtt)
            .saturating_add(self.reorder_window(srtt))
            .saturating_mul(2)
    }

    /// When the lost packet holding `una` is given up, if it holds a full table (no room for
    /// a new PSN). Only ACKs and the path's timer move `una`, and a path whose packets after
    /// the held one were all acknowledged has nothing left to be acknowledged or to time
    /// out: this deadline is what lets it send again.
    pub fn hold_deadline(&self, srtt: u64) -> Option<u64> {
        if (self.next.wrapping_sub(self.una) as usize) < SACK_BITS {
            return None;
        }
        let s = self.slots.get(self.una as usize % SACK_BITS)?;
        (s.state == SlotState::Lost).then(|| s.sent_at.saturating_add(self.hold(srtt)))
    }

    /// The path's timer at [`InFlight::hold_deadline`]: gives up the lost packets whose hold
    /// ended.
    pub fn release_held(&mut self, now: u64, srtt: u64) {
        self.advance(now, srtt);
    }

    /// Moves `una` past resolved PSNs. A packet declared lost holds it for twice the loss
    /// threshold: while it does, the path cannot run 256 PSNs ahead of it, so the receiver
    /// never slides its window past it, and an ACK that covers it really means it arrived (a
    /// spurious loss). After that it is given up for good.
    fn advance(&mut self, now: u64, srtt: u64) {
        let hold = self.hold(srtt);
        while self.una != self.next {
            let una = self.una;
            match self.slot(una) {
                Some(s) if s.state == SlotState::Live => break,
                Some(s) if s.state == SlotState::Lost => {
                    if now.saturating_sub(s.sent_at) < hold {
                        break;
                    }
                    s.state = SlotState::Free;
                    self.una = una.wrapping_add(1);
                }
                _ => self.una = una.wrapping_add(1),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::wire::SACK_WORDS;
    use super::*;
    use std::vec::Vec;

    fn item(seg: u32) -> SentItem {
        SentItem {
            seg,
            ..SentItem::default()
        }
    }

    fn ack(cum: u32, extra: &[u32]) -> PathAck {
        let mut sack = [0u64; SACK_WORDS];
        for p in extra {
            let i = p.wrapping_sub(cum).wrapping_sub(1) as usize;
            sack[i / 64] |= 1 << (i % 64);
        }
        PathAck {
            cum_psn: cum,
            sack,
            ..PathAck::default()
        }
    }

    fn run(f: &mut InFlight, a: &PathAck) -> Vec<(u32, Outcome)> {
        run_at(f, 1_000, 0, a)
    }

    /// Probes are counted apart (`unresolved_data`) as they are sent, acknowledged, declared
    /// lost and timed out.
    #[test]
    fn probes_are_counted_apart_from_data() {
        let probe = SentItem {
            kind: ItemKind::Probe,
            ..SentItem::default()
        };
        let mut f = InFlight::new(100);
        f.push(0, item(0)); // 100
        f.push(0, probe); // 101
        f.push(0, item(1)); // 102
        f.push(0, probe); // 103
        assert_eq!((f.unresolved(), f.unresolved_data()), (4, 2));
        run(&mut f, &ack(100, &[101]));
        assert_eq!(
            (f.unresolved(), f.unresolved_data()),
            (2, 1),
            "a probe and 100 acked"
        );
        let mut n = 0;
        f.on_timeout(|_, _, _| n += 1);
        assert_eq!((n, f.unresolved(), f.unresolved_data()), (2, 0, 0));
        f.push(1_000, probe); // 104
        f.push(1_000, item(2)); // 105
        f.push(1_000, probe); // 106
                              // 106 acknowledged: 104 and 105 below it are lost once the reordering window passed.
        run_at(&mut f, 10_000_000, 0, &ack(104, &[106]));
        assert_eq!((f.unresolved(), f.unresolved_data()), (0, 0));
    }

    /// A lost packet that holds a full table is given up at its deadline even when nothing
    /// after it is left to be acknowledged: the table has room again.
    #[test]
    fn a_held_loss_with_a_full_table_has_a_deadline() {
        let mut f = InFlight::new(0);
        for i in 0..SACK_BITS as u32 {
            f.push(0, item(i));
        }
        assert!(!f.has_room());
        assert_eq!(f.hold_deadline(1_000), None, "nothing lost");
        // Everything after PSN 0 acknowledged at 10 us; at 15 us 0 is lost (the loss
        // threshold is 10.25 us), and holds `una` for twice that.
        let extra: Vec<u32> = (1..SACK_BITS as u32).collect();
        run_at(&mut f, 10_000, 1_000, &ack(0, &extra));
        assert_eq!(f.unresolved(), 1);
        assert_eq!(f.detect_lost(15_000, 1_000, |_, _, _| {}), 1);
        assert_eq!(f.unresolved(), 0);
        assert!(!f.has_room(), "held: the path cannot run 256 PSNs past it");
        let d = f.hold_deadline(1_000).expect("a deadline");
        assert!(d > 10_000);
        f.release_held(d - 1, 1_000);
        assert!(!f.has_room(), "not before its deadline");
        f.release_held(d, 1_000);
        assert!(f.has_room());
        assert_eq!(f.hold_deadline(1_000), None);
    }

    fn run_at(f: &mut InFlight, now: u64, srtt: u64, a: &PathAck) -> Vec<(u32, Outcome)> {
        let mut v = Vec::new();
        f.on_ack(now, srtt, a, |it, o, _| v.push((it.seg, o)));
        v
    }

    /// A tail handed back is reported lost once: its later timeout reports nothing, an ACK
    /// for it is reported as usual.
    #[test]
    fn a_resent_tail_is_handed_back_once() {
        let mut f = InFlight::new(100);
        f.push(0, item(0));
        f.push(10, item(1));
        assert_eq!(f.tail_sent(), Some(10));
        let mut v = Vec::new();
        assert_eq!(f.resend_tail(|it, o, _| v.push((it.seg, o))), 1);
        assert_eq!(v, std::vec![(1, Outcome::Lost)]);
        // Still in flight, and not handed back twice.
        assert_eq!(f.unresolved(), 2);
        assert_eq!(f.resend_tail(|it, o, _| v.push((it.seg, o))), 0);
        assert_eq!(v.len(), 1);
        // A timeout reports only the packet not handed back.
        let mut t = Vec::new();
        assert_eq!(f.on_timeout(|it, o, _| t.push((it.seg, o))), 2);
        assert_eq!(t, std::vec![(0, Outcome::TimedOut)]);
        assert_eq!(f.tail_sent(), None);
        // Handed back, then acknowledged: the ACK is reported.
        f.push(20, item(2));
        f.resend_tail(|_, _, _| {});
        let v = run(&mut f, &ack(103, &[]));
        assert_eq!(v, std::vec![(2, Outcome::Acked)]);
        // A probe is never handed back.
        f.push(
            30,
            SentItem {
                kind: ItemKind::Probe,
                ..SentItem::default()
            },
        );
        assert_eq!(f.resend_tail(|_, _, _| panic!("a probe has no data")), 0);
    }

    #[test]
    fn gap_below_acked_psn_is_lost_at_once() {
        let mut f = InFlight::new(100);
        for s in 0..5 {
            assert_eq!(f.push(0, item(s)), Some(100 + s));
        }
        // 100, 101 in order; 103 received: 102 is lost (same path, in order).
        let v = run(&mut f, &ack(102, &[103]));
        assert_eq!(
            v,
            std::vec![
                (0, Outcome::Acked),
                (1, Outcome::Acked),
                (3, Outcome::Acked),
                (2, Outcome::Lost)
            ]
        );
        assert_eq!(f.unresolved(), 1); // 104 still out
                                       // Nothing above 104 acked: no loss for it.
        let v = run(&mut f, &ack(102, &[103]));
        assert!(v.is_empty());
        let v = run(&mut f, &ack(102, &[103, 104]));
        assert_eq!(v, std::vec![(4, Outcome::Acked)]);
        assert_eq!(f.unresolved(), 0);
        assert!(f.has_room());
    }

    #[test]
    fn reordered_but_complete_acks_lose_nothing() {
        let mut f = InFlight::new(u32::MAX - 1); // wraps
        for s in 0..4 {
            f.push(0, item(s));
        }
        // An old ACK after a newer one changes nothing.
        let v = run(&mut f, &ack(2, &[]));
        assert_eq!(v.len(), 4);
        assert!(v.iter().all(|(_, o)| *o == Outcome::Acked));
        assert!(run(&mut f, &ack(u32::MAX, &[])).is_empty());
    }

    #[test]
    fn slot_is_24_bytes() {
        assert_eq!(core::mem::size_of::<Slot>(), 24);
    }

    #[test]
    fn window_is_256_and_timeout_loses_all() {
        let mut f = InFlight::new(0);
        for s in 0..256 {
            assert!(f.push(0, item(s)).is_some());
        }
        assert!(!f.has_room());
        assert!(f.push(0, item(999)).is_none());
        let mut n = 0;
        f.on_timeout(|_, o, _| {
            assert_eq!(o, Outcome::TimedOut);
            n += 1
        });
        assert_eq!(n, 256);
        assert!(f.has_room());
        assert_eq!(f.push(0, item(1)), Some(256));
    }

    #[test]
    fn reordering_inside_the_window_is_not_loss_and_is_learned() {
        let mut f = InFlight::new(0);
        // Sent 1 us apart; srtt 40 us: reordering window 10 us.
        for s in 0..4 {
            f.push(u64::from(s) * 1_000, item(s));
        }
        // 1 and 2 acked at 41/42 us (RTT 40 us), 0 not yet: within the window, no loss.
        assert_eq!(run_at(&mut f, 42_000, 40_000, &ack(0, &[1, 2])).len(), 2);
        assert_eq!(f.unresolved(), 2);
        // The reordering timer: 0 was sent at 0, wait = rack RTT 40 us + 10 us.
        assert_eq!(f.loss_deadline(40_000), Some(50_000));
        // 0 arrives at 48 us: reordered, not lost; learned 8 us (+25%) < 10 us.
        let v = run_at(&mut f, 48_000, 40_000, &ack(3, &[]));
        assert_eq!(v, std::vec![(0, Outcome::Acked)]);
        assert_eq!(f.unresolved(), 1);
        // Now a gap that passes the window is lost by the timer path.
        for s in 4..8 {
            f.push(50_000 + u64::from(s), item(s));
        }
        run_at(&mut f, 90_000, 40_000, &ack(3, &[5, 6, 7]));
        let mut lost = Vec::new();
        f.detect_lost(110_000, 40_000, |it, o, _| lost.push((it.seg, o)));
        // 3 was lost by the ACK itself; 4 (sent at 50 us) by the timer: 40 + 10 us later.
        assert_eq!(lost, std::vec![(4, Outcome::Lost)]);
        // 4 arrives after all: acked (spurious), and the window grows to cover it
        // (70 us RTT against 40: 30 us, +25%).
        let mut v = Vec::new();
        let sum = f.on_ack(120_000, 40_000, &ack(3, &[4, 5, 6, 7]), |it, o, _| {
            v.push((it.seg, o))
        });
        assert_eq!(v, std::vec![(4, Outcome::Acked)]);
        assert_eq!((sum.spurious, sum.reordered), (1, 1));
        assert!(f.reorder_window(40_000) > 35_000);
        assert_eq!(f.unresolved(), 0);
    }

    #[test]
    fn learned_reordering_is_kept_until_losses_show_it_costs() {
        let srtt = 40_000;
        let mut f = InFlight::new(0);
        f.learn_reordering(80_000);
        assert_eq!(f.reorder_window(srtt), 100_000);
        // 4,096 packets acknowledged in order: no reason to forget.
        let (mut t, mut psn) = (0u64, 0u32);
        for _ in 0..4096 {
            f.push(t, item(psn));
            psn += 1;
            t += 1_000;
            run_at(&mut f, t + srtt, srtt, &ack(psn, &[]));
        }
        assert_eq!(f.reorder_window(srtt), 100_000);
        // Losses: a packet, one sent 150 us after it acknowledged 40 us later, declares
        // it lost (190 us > 40 + 100 us). 15 of them keep the window, the 16th halves it.
        // The receiver's cumulative PSN stays at the first hole; it SACKs what came.
        let (hole, mut came) = (psn, Vec::new());
        for k in 0..REORDER_PERSIST {
            t += 1_000_000;
            f.push(t, item(psn));
            f.push(t + 150_000, item(psn + 1));
            came.push(psn + 1);
            let v = run_at(&mut f, t + 190_000, srtt, &ack(hole, &came));
            assert!(v.contains(&(psn, Outcome::Lost)), "{v:?}");
            psn += 2;
            let want = if k + 1 < REORDER_PERSIST {
                100_000
            } else {
                50_000
            };
            assert_eq!(f.reorder_window(srtt), want, "after {} losses", k + 1);
        }
    }

    #[test]
    fn a_lost_packet_holds_the_window_then_is_given_up() {
        let mut f = InFlight::new(0);
        f.push(0, item(0));
        for s in 1..4 {
            f.push(20_000, item(s));
        }
        // 0 lost (1..3 acked, RTT 40 us, window 10 us); it holds `una` for 2 x 50 us.
        let v = run_at(&mut f, 60_000, 40_000, &ack(0, &[1, 2, 3]));
        assert!(v.contains(&(0, Outcome::Lost)));
        for s in 4..256 {
            f.push(40_000, item(s));
        }
        assert!(!f.has_room(), "256 PSNs from the lost one on");
        // Past the hold, it is given up: room again, and the receiver may skip it (an ACK
        // whose cumulative PSN passed it is no spurious loss).
        let v = run_at(&mut f, 100_001, 40_000, &ack(0, &[1, 2, 3]));
        assert!(v.is_empty());
        assert!(f.has_room());
        let mut sum = AckSummary::default();
        f.on_ack(100_002, 40_000, &ack(300, &[]), |_, _, _| {});
        let s2 = f.on_ack(100_003, 40_000, &ack(300, &[]), |_, _, _| {});
        sum.spurious += s2.spurious;
        assert_eq!(sum.spurious, 0);
    }

    #[test]
    fn a_late_ack_after_a_timeout_is_a_spurious_loss_until_the_slot_is_reused() {
        let mut f = InFlight::new(0);
        f.push(0, item(0));
        for s in 1..4 {
            f.push(20_000, item(s));
        }
        // 0 declared lost by the reordering rule, then the path times out: 2 and 3 go too.
        let v = run_at(&mut f, 60_000, 40_000, &ack(0, &[1]));
        assert!(v.contains(&(0, Outcome::Lost)));
        let mut timed_out = 0;
        f.on_timeout(|_, _, _| timed_out += 1);
        assert_eq!(timed_out, 2); // 2 and 3 (1 was acknowledged, 0 was lost already)
        f.push(70_000, item(4));
        // The original 0 arrives after all: noticed although it is below `una` now.
        let s = f.on_ack(80_000, 40_000, &ack(1, &[]), |_, _, _| {});
        assert_eq!((s.spurious, s.acked), (1, 0));
        let s = f.on_ack(85_000, 40_000, &ack(5, &[]), |_, _, _| {});
        assert_eq!((s.spurious, s.acked), (0, 1));
        // Once 256 more PSNs have reused its slot, ACKs look from `una` only.
        for k in 5..300 {
            let psn = f.next_psn();
            f.push(90_000, item(k));
            let s = f.on_ack(90_000, 40_000, &ack(psn.wrapping_add(1), &[]), |_, _, _| {});
            assert_eq!(s.acked, 1);
        }
        assert!(!f.lost_behind);
    }

    #[test]
    fn ack_for_unsent_psns_is_ignored() {
        let mut f = InFlight::new(10);
        f.push(0, item(0));
        let v = run(&mut f, &ack(500, &[600]));
        assert_eq!(v, std::vec![(0, Outcome::Acked)]);
        assert_eq!(f.next_psn(), 11);
    }

    /// A path whose packets nobody answers: one PSN per timeout (a probe), as a blackholed
    /// path sends.
    fn dead_path_round(f: &mut InFlight) -> Option<u32> {
        let psn = f.push(0, item(0));
        f.on_timeout(|_, _, _| {});
        psn
    }

    #[test]
    fn a_dead_path_stops_at_the_receive_window_until_the_peer_reports() {
        let mut f = InFlight::new(u32::MAX - 100); // wraps
        let mut sent = 0;
        while let Some(psn) = dead_path_round(&mut f) {
            assert_eq!(psn.wrapping_sub(f.peer_cum()), sent);
            sent += 1;
        }
        // PSNs peer_cum ..= peer_cum + RECV_WINDOW went out, no further.
        assert_eq!(sent, RECV_WINDOW + 1);
        assert!(f.window_limited() && !f.has_room());
        let next = f.next_psn();
        let r = f.limit_probe_psn();
        assert_eq!(r, next.wrapping_sub(257));
        assert_eq!(
            r.wrapping_sub(f.peer_cum()),
            RECV_WINDOW - 256,
            "in the window"
        );
        // An ACK from beyond what was sent, or an older one, changes nothing.
        run(&mut f, &ack(next.wrapping_add(1), &[]));
        run(&mut f, &ack(u32::MAX - 200, &[]));
        assert_eq!(f.peer_cum(), u32::MAX - 100);
        assert!(f.window_limited());
        // A receiver that never saw the repeated PSN slides to 256 below it: room again,
        // and the ACK resolves nothing of the table (it is all below it).
        let v = run(&mut f, &ack(r.wrapping_sub(256), &[r]));
        assert!(v.is_empty());
        assert_eq!(f.peer_cum(), next.wrapping_sub(513));
        assert!(f.has_room());
        let more = (0..)
            .take_while(|_| dead_path_round(&mut f).is_some())
            .count();
        assert_eq!(more, RECV_WINDOW as usize - 512);
    }

    /// With ACKs and no timeouts a path's next PSN stays within 2 x 256 + 1 of the peer's
    /// reported cumulative PSN (the margin `RECV_WINDOW` is chosen from), under random and
    /// burst loss, with the holes given up by the reordering rule and slid over by the
    /// receiver.
    #[test]
    fn without_timeouts_a_path_stays_within_two_windows_of_the_peer() {
        use super::super::super::rng::XorShift;
        use super::super::sack::PsnWindow;
        let start = u32::MAX - 5_000;
        let (mut f, mut rx) = (InFlight::new(start), PsnWindow::new(start));
        let mut rng = XorShift::new(9);
        let (rtt, mut t) = (10_000u64, 0u64);
        let (mut ahead, mut reported_ahead, mut delivered) = (0, 0, 0u32);
        for round in 0..3_000u32 {
            // Every 50th round all of it is lost; otherwise one packet in four.
            let burst = round % 50 == 49;
            for _ in 0..64 {
                if !f.has_room() {
                    break;
                }
                assert!(!f.window_limited());
                let psn = f.push(t, item(0)).unwrap();
                assert!(rx.in_window(psn));
                ahead = ahead.max(f.next_psn().wrapping_sub(rx.cum()));
                reported_ahead = reported_ahead.max(f.next_psn().wrapping_sub(f.peer_cum()));
                if !burst && !rng.next_u64().is_multiple_of(4) {
                    rx.record(psn);
                    delivered += 1;
                }
                t += 100;
            }
            t += rtt;
            f.on_ack(t, rtt, &rx.to_ack(0, 0, 0, (0, 0)), |_, _, _| {});
            if f.loss_deadline(rtt).is_some_and(|d| d <= t) {
                f.detect_lost(t, rtt, |_, _, _| {});
            }
        }
        assert!(delivered > 100_000, "{delivered}");
        assert!(reported_ahead <= 2 * 256 + 1, "{reported_ahead}");
        assert!(ahead <= reported_ahead, "{ahead}");
    }
}
