// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Smoothed RTT and retransmission timeout, RFC 6298 style, in integer nanoseconds.

use super::super::zero::{zero_valid, ZeroValid};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// RTT estimator of one path.
pub struct RttEstimator {
    srtt: u64,
    rttvar: u64,
    rto: u64,
    min_rto: u64,
    max_rto: u64,
    /// Smallest sample since the last route change (0: none yet).
    min_rtt: u64,
    has_sample: bool,
}
zero_valid!(struct RttEstimator { srtt, rttvar, rto, min_rto, max_rto, min_rtt, has_sample });

/// Clock granularity term G of RFC 6298 (1 us).
const GRANULARITY_NS: u64 = 1_000;

impl RttEstimator {
    /// An estimator with RTO `initial_rto` until the first sample, clamped to `[min_rto, max_rto]`.
    pub fn new(initial_rto: u64, min_rto: u64, max_rto: u64) -> Self {
        let max_rto = max_rto.max(min_rto);
        RttEstimator {
            srtt: 0,
            rttvar: 0,
            rto: initial_rto.clamp(min_rto, max_rto),
            min_rto,
            max_rto,
            min_rtt: 0,
            has_sample: false,
        }
    }

    /// Feeds one RTT sample (ns).
    pub fn sample(&mut self, r: u64) {
        if self.min_rtt == 0 || r < self.min_rtt {
            self.min_rtt = r.max(1);
        }
        if !self.has_sample {
            self.srtt = r;
            self.rttvar = r / 2;
            self.has_sample = true;
        } else {
            let diff = self.srtt.abs_diff(r);
            // rttvar = 3/4 rttvar + 1/4 |srtt - r|; srtt = 7/8 srtt + 1/8 r
            self.rttvar = (self.rttvar / 4).saturating_mul(3).saturating_add(diff / 4);
            self.srtt = (self.srtt / 8).saturating_mul(7).saturating_add(r / 8);
        }
        let var = self.rttvar.saturating_mul(4).max(GRANULARITY_NS);
        self.rto = self
            .srtt
            .saturating_add(var)
            .clamp(self.min_rto, self.max_rto);
    }

    /// At least one sample was taken.
    pub fn has_sample(&self) -> bool {
        self.has_sample
    }

    /// Smoothed RTT (0 before the first sample).
    pub fn srtt(&self) -> u64 {
        self.srtt
    }

    /// Smallest RTT sample since the last [`RttEstimator::route_changed`] (0 before one).
    pub fn min_rtt(&self) -> u64 {
        self.min_rtt
    }

    /// The path moved to another route (new UDP source port): its base RTT is unknown again.
    /// The smoothed RTT and RTO stay as they are until samples of the new route come in.
    pub fn route_changed(&mut self) {
        self.min_rtt = 0;
    }

    /// RTT variation (0 before the first sample).
    pub fn rttvar(&self) -> u64 {
        self.rttvar
    }

    /// Current RTO before backoff.
    pub fn rto(&self) -> u64 {
        self.rto
    }

    /// RTO after `backoff` consecutive timeouts: doubled each time, capped at the maximum.
    pub fn backed_off(&self, backoff: u8) -> u64 {
        let shift = u32::from(backoff.min(16));
        self.rto
            .checked_shl(shift)
            .unwrap_or(u64::MAX)
            .min(self.max_rto)
    }

    /// Probe timeout for a tail-loss probe by the smoothed RTT `srtt` (the path's own, or
    /// one it borrows before its first sample): 2 * srtt + `extra` (ACK delay, reordering
    /// window), at most the RTO.
    pub fn pto(&self, srtt: u64, extra: u64) -> u64 {
        srtt.saturating_mul(2).saturating_add(extra).min(self.rto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sample_and_convergence() {
        let mut r = RttEstimator::new(1_000_000, 10_000, 100_000_000);
        assert_eq!(r.rto(), 1_000_000);
        r.sample(100_000);
        assert_eq!(r.srtt(), 100_000);
        assert_eq!(r.rttvar(), 50_000);
        assert_eq!(r.rto(), 300_000);
        for _ in 0..200 {
            r.sample(100_000);
        }
        assert!(r.srtt().abs_diff(100_000) < 1_000);
        assert!(r.rttvar() < 1_000);
        // Clamped at min_rto from below.
        assert!(r.rto() >= 10_000 && r.rto() < 110_000);
        assert_eq!(r.min_rtt(), 100_000);
        r.route_changed();
        assert_eq!(r.min_rtt(), 0);
    }

    #[test]
    fn variance_reacts_to_jitter() {
        let mut r = RttEstimator::new(1_000_000, 1_000, 100_000_000);
        for i in 0..100 {
            r.sample(if i % 2 == 0 { 50_000 } else { 150_000 });
        }
        assert!(r.rttvar() > 30_000);
        assert!(r.rto() > 200_000);
    }

    #[test]
    fn backoff_caps_and_huge_samples_saturate() {
        let mut r = RttEstimator::new(1_000, 1_000, 1_000_000);
        assert_eq!(r.backed_off(3), 8_000);
        assert_eq!(r.backed_off(200), 1_000_000);
        r.sample(u64::MAX);
        r.sample(u64::MAX);
        assert_eq!(r.rto(), 1_000_000);
        assert!(r.pto(r.srtt(), 0) <= r.rto());
    }
}
