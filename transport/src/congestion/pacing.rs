// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Pacing: data packets leave no faster than a rate, with a bounded burst.

use super::super::zero::{zero_valid, ZeroValid};

/// Bytes a datagram costs on the wire beyond its UDP payload (Ethernet header and FCS, IPv4,
/// UDP, rounded up), counted by the pacer so that a rate means link bandwidth.
pub const PACKET_OVERHEAD: u32 = 50;

/// A next-send-time pacer (as Linux `sch_fq` does it): each packet moves the next send time
/// on by its wire time at the rate; after an idle spell the next send time may lag behind
/// the clock by at most `burst_ns`, which is the largest burst that leaves back to back.
/// A rate of 0 means no pacing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pacer {
    rate_mbps: u32,
    next_send: u64,
    burst_ns: u64,
}
zero_valid!(struct Pacer { rate_mbps, next_send, burst_ns });

impl Pacer {
    /// A pacer allowing bursts of `burst_ns` worth of packets, not pacing yet.
    pub fn new(burst_ns: u64) -> Self {
        Pacer {
            rate_mbps: 0,
            next_send: 0,
            burst_ns,
        }
    }

    /// Paces to `rate_mbps` Mbit/s from now on (0: stop pacing).
    pub fn set_rate(&mut self, rate_mbps: u32) {
        self.rate_mbps = rate_mbps;
    }

    /// The pacing rate, Mbit/s (0 = none).
    pub fn rate(&self) -> u32 {
        self.rate_mbps
    }

    /// A packet may leave now.
    pub fn ready(&self, now: u64) -> bool {
        self.rate_mbps == 0 || now >= self.next_send
    }

    /// When the next packet may leave (None when not pacing).
    pub fn next_send(&self) -> Option<u64> {
        (self.rate_mbps != 0).then_some(self.next_send)
    }

    /// A datagram of `len` bytes (UDP payload) left at `now`.
    pub fn on_send(&mut self, now: u64, len: usize) {
        if self.rate_mbps == 0 {
            return;
        }
        let bits = (len as u64).saturating_add(u64::from(PACKET_OVERHEAD)) * 8;
        // Mbit/s = bits per microsecond: ns = bits * 1000 / rate.
        let wire_ns = bits * 1_000 / u64::from(self.rate_mbps);
        let start = self.next_send.max(now.saturating_sub(self.burst_ns));
        self.next_send = start.saturating_add(wire_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paces_after_a_burst() {
        let mut p = Pacer::new(2_000);
        assert!(p.ready(0) && p.next_send().is_none(), "no rate: no pacing");
        p.set_rate(1_000); // 1 Gbit/s: 950 + 50 bytes = 8 us
        let now = 1_000_000;
        let mut sent = 0;
        while p.ready(now) {
            p.on_send(now, 950);
            sent += 1;
        }
        // 2 us of burst credit: the first packet, plus the one sent while the credit lasts.
        assert_eq!(sent, 1, "a burst of 2 us holds less than one 8 us packet");
        assert_eq!(p.next_send(), Some(now - 2_000 + 8_000));
        // Over a long run the rate holds.
        let mut t = now;
        let mut n = 0u64;
        while t < now + 1_000_000 {
            if p.ready(t) {
                p.on_send(t, 950);
                n += 1;
            }
            t = p.next_send().unwrap().max(t + 100);
        }
        assert!((124..=127).contains(&n), "{n} packets in 1 ms at 1 Gbit/s");
    }
}
