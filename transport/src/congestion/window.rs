// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A congestion window in packets with DCTCP-style ECN response (see `docs/congestion.md`).

use super::super::zero::{zero_valid, ZeroValid};

/// `alpha` is fixed-point with this many units for 1.0.
pub const ALPHA_ONE: u32 = 1024;
/// EWMA gain of `alpha`: g = 1 / 2^`ALPHA_SHIFT` = 1/16 (DCTCP's recommended gain).
pub const ALPHA_SHIFT: u32 = 4;

/// A congestion window in packets, used per path and per connection.
///
/// - slow start (+1 per acknowledged packet) while below `ssthresh`, which starts at the
///   initial window for a path (no slow start) and at the maximum for a connection, and drops
///   to the window at the first decrease;
/// - additive increase: `step` packets per window's worth of acknowledged packets;
/// - on echoed ECN CE, at most once per smoothed RTT: `cwnd *= 1 - alpha / 2`, where `alpha`
///   is the EWMA (gain 1/16) of the fraction of packets marked per window (DCTCP); `alpha`
///   is 1 until the first mark (no estimate yet), so the first reaction halves;
/// - halved on a retransmission timeout.
///
/// Loss found by SACK does not shrink it: on a sprayed fabric random loss is not a congestion
/// signal, ECN is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    cwnd: u32,
    acc: u32,
    max: u32,
    ssthresh: u32,
    step: u32,
    alpha: u32,
    obs_acked: u32,
    obs_marked: u32,
    last_decrease: u64,
    /// A mark was seen: `alpha` is being estimated (until then it stays 1).
    marked: bool,
}
zero_valid!(struct Window {
    cwnd, acc, max, ssthresh, step, alpha, obs_acked, obs_marked, last_decrease, marked,
});

impl Window {
    /// A path window of `initial` packets that grows (+1 per RTT) to at most `max`, both
    /// clamped to 1..=256 (a path never has more than 256 unresolved packets).
    pub fn new(initial: u16, max: u16) -> Self {
        let max = u32::from(max).clamp(1, 256);
        let cwnd = u32::from(initial).clamp(1, max);
        Self::with(cwnd, max, cwnd, 1)
    }

    /// A window of `initial` packets up to `max` that slow-starts until its first decrease
    /// and then grows by `step` packets per RTT.
    pub fn slow_start(initial: u32, max: u32, step: u32) -> Self {
        let max = max.max(1);
        Self::with(initial.clamp(1, max), max, max, step.max(1))
    }

    fn with(cwnd: u32, max: u32, ssthresh: u32, step: u32) -> Self {
        Window {
            cwnd,
            acc: 0,
            max,
            ssthresh,
            step,
            alpha: ALPHA_ONE,
            obs_acked: 0,
            obs_marked: 0,
            last_decrease: 0,
            marked: false,
        }
    }

    /// Current window in packets.
    pub fn cwnd(&self) -> u32 {
        self.cwnd
    }

    /// The DCTCP marked-fraction estimate, in 1/`ALPHA_ONE`.
    pub fn alpha(&self) -> u32 {
        self.alpha
    }

    /// Room for one more packet with `in_flight` unresolved.
    pub fn has_room(&self, in_flight: u32) -> bool {
        in_flight < self.cwnd
    }

    /// `acked` packets were newly acknowledged.
    pub fn on_ack(&mut self, acked: u32) {
        // Observation window for alpha: one window's worth of acknowledged packets.
        self.obs_acked = self.obs_acked.saturating_add(acked);
        if self.marked && self.obs_acked >= self.cwnd {
            let marked = self.obs_marked.min(self.obs_acked);
            let f = u64::from(marked) * u64::from(ALPHA_ONE) / u64::from(self.obs_acked.max(1));
            let a = self.alpha - (self.alpha >> ALPHA_SHIFT) + ((f as u32) >> ALPHA_SHIFT);
            self.alpha = a.min(ALPHA_ONE);
            self.obs_acked = 0;
            self.obs_marked = 0;
        }
        if self.cwnd < self.ssthresh {
            self.cwnd = self
                .cwnd
                .saturating_add(acked)
                .min(self.ssthresh)
                .min(self.max);
            return;
        }
        let acc = self.acc.saturating_add(acked.saturating_mul(self.step));
        let cwnd = self.cwnd.max(1);
        self.cwnd = self.cwnd.saturating_add(acc / cwnd).min(self.max);
        self.acc = acc % cwnd;
    }

    /// `marked` packets (at least one) were echoed with ECN CE; `srtt` is the RTT that spaces
    /// decreases.
    pub fn on_ecn(&mut self, now: u64, srtt: u64, marked: u32) {
        self.obs_marked = self.obs_marked.saturating_add(marked.max(1));
        self.marked = true;
        if now.saturating_sub(self.last_decrease) >= srtt {
            // Rounded up: with alpha 1 this is halving, rounded down.
            let cut = (u64::from(self.cwnd) * u64::from(self.alpha))
                .div_ceil(u64::from(2 * ALPHA_ONE))
                .max(1) as u32;
            self.cwnd = self.cwnd.saturating_sub(cut).max(1);
            self.ssthresh = self.cwnd;
            self.acc = 0;
            self.last_decrease = now;
        }
    }

    /// The path's retransmission timer expired.
    pub fn on_timeout(&mut self) {
        self.cwnd = (self.cwnd / 2).max(1);
        self.ssthresh = self.cwnd;
        self.acc = 0;
    }

    /// Sets the additive increase: `step` packets per window's worth acknowledged (at
    /// least 1).
    pub fn set_step(&mut self, step: u32) {
        self.step = step.max(1);
    }

    /// Lowers the window to at most `limit` (at least 1): another bound took over.
    pub fn clamp_to(&mut self, limit: u32) {
        if self.cwnd > limit {
            self.cwnd = limit.max(1);
            self.acc = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aimd() {
        let mut w = Window::new(4, 6);
        assert!(w.has_room(3) && !w.has_room(4));
        w.on_ack(3);
        assert_eq!(w.cwnd(), 4);
        w.on_ack(1);
        assert_eq!(w.cwnd(), 5);
        w.on_ack(1000);
        assert_eq!(w.cwnd(), 6, "capped");
        w.on_ecn(100, 50, 1);
        assert_eq!(w.cwnd(), 3, "alpha starts at 1: the first reaction halves");
        w.on_ecn(120, 50, 1);
        assert_eq!(w.cwnd(), 3, "once per RTT");
        w.on_timeout();
        w.on_timeout();
        w.on_timeout();
        assert_eq!(w.cwnd(), 1, "never below one");
        assert_eq!(Window::new(0, 0).cwnd(), 1);
    }

    #[test]
    fn alpha_follows_the_marked_fraction() {
        let mut w = Window::new(100, 256);
        w.on_ecn(0, 0, 1);
        assert_eq!(w.cwnd(), 50);
        // Many windows with no marks: alpha decays towards 0 and a decrease is gentle.
        for _ in 0..200 {
            w.on_ack(w.cwnd());
        }
        assert!(w.alpha() < ALPHA_ONE / 50, "alpha {}", w.alpha());
        let before = w.cwnd();
        w.on_ecn(1_000_000, 10, 1);
        assert!(
            w.cwnd() >= before - before / 20,
            "{} -> {}",
            before,
            w.cwnd()
        );
        // Every packet marked: alpha climbs back towards 1.
        for _ in 0..200 {
            let c = w.cwnd();
            w.on_ecn(0, u64::MAX, c);
            w.on_ack(c);
        }
        assert!(w.alpha() > ALPHA_ONE * 9 / 10, "alpha {}", w.alpha());
    }

    #[test]
    fn slow_start_until_first_decrease() {
        let mut w = Window::slow_start(4, 1000, 8);
        w.on_ack(4);
        assert_eq!(w.cwnd(), 8);
        w.on_ack(8);
        assert_eq!(w.cwnd(), 16);
        w.on_ecn(10, 0, 1);
        assert_eq!(w.cwnd(), 8);
        // Additive increase: `step` packets per window.
        w.on_ack(8);
        assert_eq!(w.cwnd(), 16);
        w.clamp_to(5);
        assert_eq!(w.cwnd(), 5);
    }
}
