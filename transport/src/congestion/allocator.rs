// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! The receiver's side: one [`RateAllocator`] per receiving device divides its inbound
//! capacity among the senders that are sending to it; every connection into the device
//! reports to it and returns the grant to its sender in every ACK.

use super::super::zero::{zero_valid, ZeroValid};

/// What a receiver grants one sender, as carried in the ACK header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// The rate the sender may send to this receiver, Mbit/s (0 = no limit given).
    pub rate_mbps: u32,
    /// The sender's share of the receiver's inbound capacity, in 1/65536 (0 = none given).
    pub share: u16,
}
zero_valid!(struct Grant { rate_mbps, share });

/// A connection's registration with its device's allocator (plain data, zero = never seen).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderSlot {
    /// The last epoch the sender was counted in (0 = never).
    epoch: u64,
}
zero_valid!(struct SenderSlot { epoch });

/// Divides a receiver's inbound capacity equally among its active senders.
///
/// While arrivals carry CE marks, the granted total is lowered to `1 - F/2` of the target (F:
/// the fraction of data packets marked in the last interval), so a queue built before the
/// grants took hold (the senders' first window) drains instead of standing; it climbs back
/// by 1/16 per unmarked interval.
///
/// Time is cut into epochs of `epoch_ns`. A sender is active while data from it arrived in the
/// current or the previous epoch; so a new sender counts from its first packet (its share and
/// everyone else's change with the next ACK each of them gets: within an RTT), and a sender
/// that stopped is forgotten one to two epochs later. Each active sender is granted
/// `capacity * target / active` (see `docs/congestion.md`). No allocation, O(1) per call: the
/// per-sender state is the [`SenderSlot`] each connection keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateAllocator {
    capacity_mbps: u32,
    target_permille: u32,
    epoch_ns: u64,
    epoch: u64,
    epoch_start: u64,
    /// Senders counted in the current epoch, in the previous one, and how many of the
    /// current ones were also counted in the previous one.
    cur: u32,
    prev: u32,
    carried: u32,
    /// Drain: the fraction of the target granted, in 1/`SCALE_ONE`, lowered while arrivals
    /// carry CE marks (the receiver's last hop, or another hop on the way, is queueing).
    scale: u32,
    interval_ns: u64,
    interval_start: u64,
    arrived: u32,
    marked: u32,
    /// Bottleneck estimate: while a good part of the arrivals carry CE marks, something on
    /// the way (this device's last hop or a hop before it) is queueing, so what arrives is
    /// what that bottleneck delivers. Measured over periods of `rate_period_ns` (wire bytes,
    /// `PACKET_OVERHEAD` included); `est_mbps` 0 = no estimate (the capacity applies).
    rate_period_ns: u64,
    rate_start: u64,
    rate_bytes: u64,
    rate_arrived: u32,
    rate_marked: u32,
    est_mbps: u32,
}

/// `scale` of 1.0.
pub const SCALE_ONE: u32 = 1024;
/// Default drain interval: the marked fraction of arrivals is measured this long.
pub const DEFAULT_INTERVAL_NS: u64 = 50_000;

/// Default bottleneck-measurement period.
pub const DEFAULT_RATE_PERIOD_NS: u64 = 500_000;
/// A measurement period counts as congested (its arrival rate is the bottleneck's) when at
/// least 1/`CONGESTED_FRACTION` of its data packets carried CE: a queue past the marking
/// threshold for most of the period, so the bottleneck was busy throughout. Fewer marks can
/// come from bursts of senders that arrive in clumps (a loaded host), whose average rate says
/// nothing about the bottleneck; the drain (`scale`) answers those.
const CONGESTED_FRACTION: u32 = 2;
/// The estimate never goes below this fraction of the capacity (1/1024: 9.8 Mbit/s of 10
/// Gbit/s), so a wrong measurement cannot starve the senders.
const EST_FLOOR_SHIFT: u32 = 10;

/// Default epoch: long against a data-centre RTT, short against a human.
pub const DEFAULT_EPOCH_NS: u64 = 500_000;
/// Default target utilisation of the inbound capacity, per mille: the 5% left keeps the
/// receiver's last-hop queue near empty and absorbs header overheads the pacers miss.
pub const DEFAULT_TARGET_PERMILLE: u32 = 950;

impl RateAllocator {
    /// An allocator for `capacity_mbps` Mbit/s of inbound capacity (0: grant nothing).
    pub fn new(capacity_mbps: u32) -> Self {
        RateAllocator {
            capacity_mbps,
            target_permille: DEFAULT_TARGET_PERMILLE,
            epoch_ns: DEFAULT_EPOCH_NS,
            epoch: 1,
            scale: SCALE_ONE,
            interval_ns: DEFAULT_INTERVAL_NS,
            rate_period_ns: DEFAULT_RATE_PERIOD_NS,
            ..RateAllocator::default()
        }
    }

    /// Sets the epoch length (at least 1 us) and returns the allocator.
    pub fn with_epoch(mut self, epoch_ns: u64) -> Self {
        self.epoch_ns = epoch_ns.max(1_000);
        self
    }

    /// Sets the drain interval (at least 1 us; about two base RTTs) and returns the allocator.
    pub fn with_interval(mut self, interval_ns: u64) -> Self {
        self.interval_ns = interval_ns.max(1_000);
        self
    }

    /// Sets the bottleneck-measurement period (at least 1 us; several RTTs and several of the
    /// caller's wake-ups, so that one period's arrivals are a rate) and returns the allocator.
    pub fn with_rate_period(mut self, period_ns: u64) -> Self {
        self.rate_period_ns = period_ns.max(1_000);
        self
    }

    /// Sets the target utilisation (per mille, 1..=1000) and returns the allocator.
    pub fn with_target(mut self, permille: u32) -> Self {
        self.target_permille = permille.clamp(1, 1000);
        self
    }

    /// Changes the inbound capacity (the link's speed changed).
    pub fn set_capacity(&mut self, capacity_mbps: u32) {
        self.capacity_mbps = capacity_mbps;
    }

    /// The inbound capacity, Mbit/s.
    pub fn capacity(&self) -> u32 {
        self.capacity_mbps
    }

    /// The capacity grants are computed from, Mbit/s: the inbound capacity, or less while a
    /// bottleneck on the way has been measured below it.
    pub fn effective_capacity(&self) -> u32 {
        match self.est_mbps {
            0 => self.capacity_mbps,
            e => e.min(self.capacity_mbps),
        }
    }

    /// Closes the measurement period if it is over. A congested period's arrival rate is the
    /// bottleneck's (averaged with the previous estimate); an uncongested one lets the
    /// estimate climb by 1/8, until it reaches the capacity and is dropped.
    fn measure(&mut self, now: u64) {
        let len = match self.rate_period_ns {
            0 => DEFAULT_RATE_PERIOD_NS,
            l => l.max(1_000),
        };
        if self.rate_start == 0 || now < self.rate_start {
            self.rate_start = now.max(1);
            return;
        }
        let elapsed = now.saturating_sub(self.rate_start);
        if elapsed < len {
            return;
        }
        let congested = self.rate_arrived > 0
            && self.rate_marked.saturating_mul(CONGESTED_FRACTION) >= self.rate_arrived;
        // A long silence in the period: its rate says nothing about the bottleneck.
        if congested && elapsed < len.saturating_mul(4) {
            // bits per ns * 1000 = Mbit/s.
            let rate = (self.rate_bytes.saturating_mul(8_000) / elapsed.max(1))
                .clamp(1, u64::from(u32::MAX)) as u32;
            self.est_mbps = match self.est_mbps {
                0 => rate,
                e => ((u64::from(e) + u64::from(rate)) / 2) as u32,
            };
        } else if self.est_mbps != 0 {
            let e = self.est_mbps;
            self.est_mbps = e.saturating_add(e / 8).saturating_add(1);
        }
        if self.est_mbps >= self.capacity_mbps {
            self.est_mbps = 0;
        } else if self.est_mbps != 0 {
            self.est_mbps = self
                .est_mbps
                .max((self.capacity_mbps >> EST_FLOOR_SHIFT).max(1));
        }
        self.rate_start = now.max(1);
        self.rate_bytes = 0;
        self.rate_arrived = 0;
        self.rate_marked = 0;
    }

    fn advance(&mut self, now: u64) {
        if self.epoch == 0 {
            // A zeroed allocator: start its clock.
            self.epoch = 1;
            self.epoch_start = now;
        }
        let len = match self.epoch_ns {
            0 => DEFAULT_EPOCH_NS,
            l => l.max(1_000),
        };
        let passed = now.saturating_sub(self.epoch_start) / len;
        if passed == 0 {
            return;
        }
        self.prev = if passed == 1 { self.cur } else { 0 };
        self.cur = 0;
        self.carried = 0;
        self.epoch = self.epoch.saturating_add(passed);
        self.epoch_start = self.epoch_start.saturating_add(passed.saturating_mul(len));
    }

    fn drain(&mut self, now: u64) {
        if self.scale == 0 {
            self.scale = SCALE_ONE;
        }
        let len = match self.interval_ns {
            0 => DEFAULT_INTERVAL_NS,
            l => l.max(1_000),
        };
        if now.saturating_sub(self.interval_start) < len {
            return;
        }
        // scale follows 1 - F/2 down at once, and climbs back by 1/16 per interval.
        let f = u64::from(self.marked.min(self.arrived)) * u64::from(SCALE_ONE)
            / u64::from(self.arrived.max(1));
        let target = SCALE_ONE - (f as u32) / 2;
        self.scale = if target < self.scale {
            target
        } else {
            self.scale.saturating_add(SCALE_ONE / 16).min(target)
        };
        self.arrived = 0;
        self.marked = 0;
        self.interval_start = now;
    }

    /// `packets` data packets (`wire_bytes` on the wire: datagrams plus `PACKET_OVERHEAD`
    /// each) from the sender of `slot` arrived by `now`, `marked` of them with ECN CE.
    pub fn note_data(
        &mut self,
        now: u64,
        slot: &mut SenderSlot,
        packets: u32,
        wire_bytes: u64,
        marked: u32,
    ) {
        self.drain(now);
        self.measure(now);
        self.arrived = self.arrived.saturating_add(packets);
        self.marked = self.marked.saturating_add(marked);
        self.rate_arrived = self.rate_arrived.saturating_add(packets);
        self.rate_marked = self.rate_marked.saturating_add(marked);
        self.rate_bytes = self.rate_bytes.saturating_add(wire_bytes);
        self.advance(now);
        if slot.epoch == self.epoch {
            return;
        }
        if slot.epoch != 0 && slot.epoch.saturating_add(1) == self.epoch {
            self.carried = self.carried.saturating_add(1);
        }
        self.cur = self.cur.saturating_add(1);
        slot.epoch = self.epoch;
    }

    /// `packets` datagrams for this device were dropped on arrival before any connection saw
    /// them (its receive queue was full: the host, not the link, is the bottleneck). They count
    /// as arrived and marked, so the drain and the bottleneck estimate treat a full receive
    /// queue like a marking last hop, and the grants come down to what the host processes.
    pub fn note_dropped(&mut self, now: u64, packets: u32) {
        self.drain(now);
        self.measure(now);
        self.arrived = self.arrived.saturating_add(packets);
        self.marked = self.marked.saturating_add(packets);
        self.rate_arrived = self.rate_arrived.saturating_add(packets);
        self.rate_marked = self.rate_marked.saturating_add(packets);
    }

    /// Active senders at `now` (data in this epoch or the previous one).
    pub fn active(&mut self, now: u64) -> u32 {
        self.advance(now);
        self.cur
            .saturating_add(self.prev.saturating_sub(self.carried))
    }

    /// Whether the sender of `slot` counts as active at `now`.
    pub fn is_active(&mut self, now: u64, slot: &SenderSlot) -> bool {
        self.advance(now);
        slot.epoch != 0 && slot.epoch.saturating_add(1) >= self.epoch
    }

    /// The grant for the sender of `slot` at `now`: an equal share of the target capacity if
    /// it is active, nothing otherwise.
    pub fn grant(&mut self, now: u64, slot: &SenderSlot) -> Grant {
        if self.capacity_mbps == 0 || !self.is_active(now, slot) {
            return Grant::default();
        }
        let n = self.active(now).max(1);
        let permille = match self.target_permille {
            0 => DEFAULT_TARGET_PERMILLE,
            p => p,
        };
        self.drain(now);
        self.measure(now);
        let target = u64::from(self.effective_capacity()) * u64::from(permille) / 1000
            * u64::from(self.scale)
            / u64::from(SCALE_ONE);
        Grant {
            rate_mbps: (target / u64::from(n)).clamp(1, u64::from(u32::MAX)) as u32,
            share: (65_536 / u64::from(n)).clamp(1, 65_535) as u16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_shares_new_senders_count_at_once_departed_ones_fade() {
        let mut a = RateAllocator::new(10_000).with_epoch(100_000);
        let mut s = [SenderSlot::default(); 4];
        let t = 1_000;
        assert_eq!(a.grant(t, &s[0]), Grant::default(), "not active yet");
        a.note_data(t, &mut s[0], 1, 1_000, 0);
        assert_eq!(
            a.grant(t, &s[0]),
            Grant {
                rate_mbps: 9_500,
                share: 65_535
            }
        );
        a.note_data(t + 10, &mut s[1], 1, 1_000, 0);
        assert_eq!(
            a.grant(t + 10, &s[0]).rate_mbps,
            4_750,
            "a new sender counts at once"
        );
        // Next epoch: both keep sending; then a third joins early in the epoch.
        let t2 = t + 150_000;
        a.note_data(t2, &mut s[2], 1, 1_000, 0);
        assert_eq!(a.active(t2), 3, "the two of the previous epoch still count");
        a.note_data(t2 + 5, &mut s[0], 1, 1_000, 0);
        a.note_data(t2 + 6, &mut s[1], 1, 1_000, 0);
        a.note_data(t2 + 7, &mut s[1], 1, 1_000, 0);
        assert_eq!(a.active(t2 + 7), 3, "no double counting");
        assert_eq!(a.grant(t2, &s[2]).rate_mbps, 3_166);
        assert_eq!(a.grant(t2, &s[2]).share, 21_845);
        // Sender 1 stops; after its last epoch has passed only 0 and 2 remain.
        let t3 = t + 250_000;
        a.note_data(t3, &mut s[0], 1, 1_000, 0);
        a.note_data(t3, &mut s[2], 1, 1_000, 0);
        assert_eq!(a.active(t3), 3);
        let t4 = t + 350_000;
        a.note_data(t4, &mut s[0], 1, 1_000, 0);
        a.note_data(t4, &mut s[2], 1, 1_000, 0);
        assert_eq!(a.active(t4), 2);
        assert_eq!(a.grant(t4, &s[1]), Grant::default(), "inactive: no grant");
        // A long silence forgets everyone.
        assert_eq!(a.active(t + 10_000_000), 0);
    }

    #[test]
    fn marks_drain() {
        let mut a = RateAllocator::new(10_000).with_interval(10_000);
        let mut s = SenderSlot::default();
        a.note_data(0, &mut s, 10, 10_000, 10);
        assert_eq!(a.grant(0, &s).rate_mbps, 9_500);
        a.note_data(10_000, &mut s, 10, 10_000, 0);
        assert_eq!(a.grant(10_000, &s).rate_mbps, 4_750, "all marked: half");
        a.note_data(20_000, &mut s, 10, 10_000, 0);
        assert_eq!(a.grant(20_000, &s).rate_mbps, 5_343, "climbs back by 1/16");
        for k in 3..20 {
            a.note_data(k * 10_000, &mut s, 10, 10_000, 0);
        }
        assert_eq!(a.grant(200_000, &s).rate_mbps, 9_500);
    }

    #[test]
    fn a_marking_bottleneck_on_the_way_lowers_the_capacity() {
        // 10 Gbit/s at the receiver, but a 40 Mbit/s hop before it marks: 5 KB per ms arrive.
        let mut a = RateAllocator::new(10_000)
            .with_interval(1_000_000)
            .with_rate_period(10_000_000);
        let mut s = [SenderSlot::default(); 2];
        let ms = 1_000_000u64;
        for t in 1..=40u64 {
            a.note_data(t * ms, &mut s[0], 2, 2_500, 1);
            a.note_data(t * ms, &mut s[1], 2, 2_500, 1);
        }
        assert_eq!(a.effective_capacity(), 40, "measured while marked");
        let g = a.grant(40 * ms, &s[0]).rate_mbps;
        assert!((10..=19).contains(&g), "half of 95% of 40, drained: {g}");
        // Unmarked arrivals: the estimate climbs back, 1/8 per period, to the capacity.
        let mut t = 41;
        while a.effective_capacity() < 10_000 && t < 2_000 {
            a.note_data(t * ms, &mut s[0], 2, 2_500, 0);
            t += 1;
        }
        assert!(t < 1_000, "back to the capacity after {t} ms");
        // Marks on a minority of the packets (bursts) are not a bottleneck.
        for t in 2_000..2_100u64 {
            a.note_data(t * ms, &mut s[0], 20, 25_000, 9);
        }
        assert_eq!(a.effective_capacity(), 10_000);
        // Nor does a bottleneck estimate go below 1/1024 of the capacity.
        for t in 3_000..3_100u64 {
            a.note_data(t * ms, &mut s[0], 2, 100, 2);
        }
        assert_eq!(a.effective_capacity(), 9);
    }

    #[test]
    fn receive_queue_drops_count_as_marks() {
        // One sender at 100 Mbit/s (12.5 KB per ms) into a host that drops as much again.
        let mut a = RateAllocator::new(10_000)
            .with_interval(1_000_000)
            .with_rate_period(10_000_000);
        let mut s = SenderSlot::default();
        let ms = 1_000_000u64;
        for t in 1..=40u64 {
            a.note_data(t * ms, &mut s, 10, 12_500, 0);
            a.note_dropped(t * ms, 10);
        }
        assert_eq!(a.effective_capacity(), 100, "what the host took in");
        let g = a.grant(40 * ms, &s).rate_mbps;
        assert!((40..=95).contains(&g), "{g}");
    }

    #[test]
    fn zeroed_allocator_is_usable() {
        let mut a = RateAllocator::default();
        a.set_capacity(1_000);
        let mut s = SenderSlot::default();
        a.note_data(5_000_000, &mut s, 1, 1_000, 0);
        assert_eq!(a.grant(5_000_000, &s).rate_mbps, 950);
    }
}
