// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Congestion control (the algorithm, its parameters and the reasoning: `docs/congestion.md`).
//!
//! Sender side, per connection ([`ConnCc`]) and per path ([`Window`] in each path):
//! - each path has a DCTCP-style window that reacts to the CE marks the receiver echoes for
//!   that path, so one congested route sheds load without slowing the others;
//! - the connection has a window over all its paths (same response to the marks of all
//!   paths, slow start until the first mark), bounded also by the bandwidth-delay product of
//!   the rate the receiver granted;
//! - data packets are paced ([`Pacer`]) to the receiver's grant.
//!
//! Receiver side: one [`RateAllocator`] per receiving device, owned by the caller, divides the
//! device's inbound capacity among the senders that are sending to it; each connection into
//! the device returns its sender's [`Grant`] in every ACK (`rate_hint` and `share`).
//!
//! Loss found by SACK never shrinks a window: random loss is normal on this fabric, ECN is the
//! congestion signal. A retransmission timeout halves the path's window.

mod allocator;
mod pacing;
mod window;

use super::zero::{zero_valid, ZeroValid};
pub use allocator::{Grant, RateAllocator, SenderSlot, DEFAULT_EPOCH_NS, DEFAULT_TARGET_PERMILLE};
pub use pacing::{Pacer, PACKET_OVERHEAD};
pub use window::{Window, ALPHA_ONE, ALPHA_SHIFT};

/// The connection window allows this multiple of the bandwidth-delay product of the granted
/// rate (base RTT times rate): room for ACK coalescing and RTT jitter; the pacer, not the
/// window, holds the rate.
pub const RATE_WINDOW_GAIN: u64 = 2;
/// The rate-derived bound never goes below this many packets.
pub const MIN_RATE_WINDOW: u32 = 4;
/// After slow start the connection window grows by one packet per path per RTT, but by no
/// more than this many per plane its paths are on: a plane's paths share that plane's links
/// at both ends, and what the window adds in one RTT is queue there until the marks answer
/// (many paths adding one each built queues that outlasted fresh paths' initial RTO;
/// `docs/congestion.md`). Per plane, because each plane has links of its own.
pub const WINDOW_STEP_PER_PLANE: u32 = 16;

/// Congestion-control settings of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CcConfig {
    /// React to echoed ECN CE marks (path and connection windows). Off only for experiments.
    pub ecn: bool,
    /// Follow the receiver's grant: pace to its rate and bound the connection window by the
    /// rate's bandwidth-delay product. Off only for experiments.
    pub receiver_rate: bool,
    /// Connection window before the first ACK, packets per plane that carries the
    /// connection's paths: what a new sender may put on each plane before the receiver has
    /// told it its share. Per plane, because each plane is a fabric of its own, with its own
    /// last-hop port and buffer at the receiver, and spraying spreads the first window evenly
    /// over the planes ([`ConnCc::set_planes`]).
    pub initial_window: u32,
    /// Largest connection window, packets.
    pub max_window: u32,
    /// Largest burst the pacer lets out back to back after a pause, ns of the paced rate.
    /// The caller must be able to wake up this often: a caller with coarse timers needs a
    /// longer burst, or pacing slows it below the rate.
    pub pacing_burst_ns: u64,
}
zero_valid!(struct CcConfig { ecn, receiver_rate, initial_window, max_window, pacing_burst_ns });

impl CcConfig {
    /// Defaults: both signals on; 16 packets per plane before the first ACK; at most 2048 in
    /// flight; bursts of 10 us.
    pub const fn new() -> Self {
        CcConfig {
            ecn: true,
            receiver_rate: true,
            initial_window: 16,
            max_window: 2048,
            pacing_burst_ns: 10_000,
        }
    }
}

impl Default for CcConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Counters of a connection's congestion control (sender side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CcStats {
    /// Times data was ready but the pacer held it back.
    pub paced: u64,
    /// Times data was ready but the connection window was full.
    pub window_limited: u64,
    /// CE marks echoed to us, all paths.
    pub ecn_ce: u64,
}
zero_valid!(struct CcStats { paced, window_limited, ecn_ce });

/// The sender side of a connection's congestion control: the connection window, the pacer
/// and the receiver's latest grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnCc {
    cfg: CcConfig,
    window: Window,
    pacer: Pacer,
    grant: Grant,
    /// Smallest smoothed RTT seen on any path (0 = none yet), ns.
    base_rtt: u64,
    /// Bytes of a full data packet on the wire.
    packet_bytes: u32,
    /// Data is waiting for the pacer.
    held: bool,
    /// Paths of the connection (the window's growth per RTT once slow start ended, [`step`]).
    paths: u32,
    /// Planes that carry its paths ([`ConnCc::set_planes`]; also in [`step`]).
    planes: u32,
    /// An ACK arrived: the window is no longer the initial one.
    acked: bool,
    /// Counters.
    pub stats: CcStats,
}
zero_valid!(struct ConnCc {
    cfg, window, pacer, grant, base_rtt, packet_bytes, held, paths, planes, acked, stats,
});

/// One packet per path, at most [`WINDOW_STEP_PER_PLANE`] per plane.
fn step(paths: u32, planes: u32) -> u32 {
    paths
        .min(WINDOW_STEP_PER_PLANE.saturating_mul(planes.max(1)))
        .max(1)
}

impl ConnCc {
    /// The congestion state of a fresh connection with `paths` paths whose full data packets
    /// are `packet_bytes` long (payload and headers), on one plane until
    /// [`ConnCc::set_planes`] says otherwise.
    pub fn new(cfg: CcConfig, packet_bytes: u32, paths: u32) -> Self {
        let paths = paths.max(1);
        ConnCc {
            cfg,
            window: Window::slow_start(cfg.initial_window, cfg.max_window, step(paths, 1)),
            pacer: Pacer::new(cfg.pacing_burst_ns),
            grant: Grant::default(),
            base_rtt: 0,
            packet_bytes: packet_bytes.saturating_add(PACKET_OVERHEAD).max(1),
            held: false,
            paths,
            planes: 1,
            acked: false,
            stats: CcStats::default(),
        }
    }

    /// The connection's paths are on `planes` planes that may carry packets: before the first
    /// ACK the window is `initial_window` packets per plane (each plane's last hop absorbs
    /// its share of a new sender's first window, as one plane's does of a one-plane
    /// sender's); after it the window goes its own way, growing by at most
    /// [`WINDOW_STEP_PER_PLANE`] per plane and RTT.
    pub fn set_planes(&mut self, planes: u32) {
        self.planes = planes.max(1);
        if !self.acked {
            let initial = self.cfg.initial_window.saturating_mul(self.planes);
            self.window =
                Window::slow_start(initial, self.cfg.max_window, step(self.paths, self.planes));
        } else {
            self.window.set_step(step(self.paths, self.planes));
        }
    }

    /// The connection window in force, packets: the ECN window, bounded by the grant's.
    pub fn window(&self) -> u32 {
        match self.rate_window() {
            Some(r) => self.window.cwnd().min(r),
            None => self.window.cwnd(),
        }
    }

    /// The bound the receiver's grant puts on the window (None: no grant or no RTT yet).
    fn rate_window(&self) -> Option<u32> {
        if !self.cfg.receiver_rate || self.grant.rate_mbps == 0 || self.base_rtt == 0 {
            return None;
        }
        // Mbit/s * ns / 8000 = bytes. Saturating and checked: no panic path (a zero packet
        // size gives no bound rather than a division by zero).
        let bdp = u64::from(self.grant.rate_mbps).saturating_mul(self.base_rtt) / 8_000;
        let pkts = bdp
            .saturating_mul(RATE_WINDOW_GAIN)
            .checked_div(u64::from(self.packet_bytes))?;
        Some((pkts.min(u64::from(u32::MAX)) as u32).max(MIN_RATE_WINDOW))
    }

    /// Room for one more data packet with `in_flight` unresolved on all paths.
    pub fn has_room(&mut self, in_flight: u32) -> bool {
        let room = in_flight < self.window();
        if !room {
            self.stats.window_limited += 1;
        }
        room
    }

    /// An ACK acknowledged `acked` packets and echoed `marked` CE marks over all its path
    /// entries; `srtt` is the largest smoothed RTT of those paths, `min_srtt` the smallest.
    pub fn on_ack(&mut self, now: u64, acked: u32, marked: u32, srtt: u64, min_srtt: u64) {
        self.acked = true;
        if min_srtt != 0 && (self.base_rtt == 0 || min_srtt < self.base_rtt) {
            self.base_rtt = min_srtt;
        }
        if acked > 0 {
            self.window.on_ack(acked);
        }
        if marked > 0 {
            self.stats.ecn_ce = self.stats.ecn_ce.saturating_add(u64::from(marked));
            if self.cfg.ecn {
                self.window.on_ecn(now, srtt, marked);
            }
        }
        if let Some(r) = self.rate_window() {
            // Growth beyond the grant's bound is not earned: the bound, not the window, held.
            self.window.clamp_to(r);
        }
    }

    /// The receiver's grant arrived (in an ACK header).
    pub fn on_grant(&mut self, grant: Grant) {
        if !self.cfg.receiver_rate {
            return;
        }
        self.grant = grant;
        self.pacer.set_rate(grant.rate_mbps);
    }

    /// The receiver's latest grant (zero when not following grants).
    pub fn grant(&self) -> Grant {
        self.grant
    }

    /// The pacing rate, Mbit/s (0 = not pacing).
    pub fn pacing_rate(&self) -> u32 {
        self.pacer.rate()
    }

    /// Smallest smoothed RTT seen on any path, ns (0 = none yet).
    pub fn base_rtt(&self) -> u64 {
        self.base_rtt
    }

    /// A data packet may leave now; if not, the caller holds it and must wake at
    /// [`ConnCc::deadline`].
    pub fn ready(&mut self, now: u64) -> bool {
        let ready = self.pacer.ready(now);
        if !ready {
            self.held = true;
            self.stats.paced += 1;
        }
        ready
    }

    /// When held data may leave (None: nothing held).
    pub fn deadline(&self) -> Option<u64> {
        if self.held {
            self.pacer.next_send()
        } else {
            None
        }
    }

    /// The timer fired: held data is the caller's to send again (`poll_transmit`).
    pub fn on_timer(&mut self, now: u64) {
        if self.deadline().is_some_and(|d| d <= now) {
            self.held = false;
        }
    }

    /// A data packet of `len` bytes left.
    pub fn on_send(&mut self, now: u64, len: usize) {
        self.held = false;
        self.pacer.on_send(now, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_paces_and_bounds_the_window() {
        let mut cc = ConnCc::new(CcConfig::new(), 1000, 8);
        assert_eq!(cc.window(), 16);
        assert!(cc.ready(0));
        // No RTT yet: the grant paces but does not bound the window.
        cc.on_grant(Grant {
            rate_mbps: 1_000,
            share: 100,
        });
        assert_eq!(cc.window(), 16);
        // RTT 100 us at 1 Gbit/s: BDP 12.5 KB = 11.9 packets of 1050 B; twice that.
        cc.on_ack(0, 1, 0, 100_000, 100_000);
        assert_eq!(cc.window(), 17, "slow start, under the grant's bound");
        cc.on_ack(0, 100, 0, 100_000, 100_000);
        assert_eq!(cc.window(), 23);
        // Pacing: 1050 bytes at 1 Gbit/s = 8.4 us.
        cc.on_send(1_000_000, 1000);
        assert!(!cc.ready(1_000_000) || cc.deadline().is_none());
        cc.on_send(1_000_000, 1000);
        assert!(!cc.ready(1_000_000));
        let d = cc.deadline().expect("held");
        cc.on_timer(d);
        assert_eq!(cc.deadline(), None);
        assert!(cc.ready(d));
        // Experiments: receiver rate off ignores grants; ECN off ignores marks.
        let mut off = ConnCc::new(
            CcConfig {
                receiver_rate: false,
                ecn: false,
                ..CcConfig::new()
            },
            1000,
            8,
        );
        off.on_grant(Grant {
            rate_mbps: 1,
            share: 1,
        });
        assert_eq!(off.pacing_rate(), 0);
        off.on_ack(10, 4, 4, 10, 10);
        assert_eq!(off.window(), 20);
    }

    #[test]
    fn the_initial_window_is_per_plane_until_the_first_ack() {
        let mut cc = ConnCc::new(CcConfig::new(), 1000, 8);
        assert_eq!(cc.window(), 16);
        cc.set_planes(4);
        assert_eq!(cc.window(), 64);
        cc.set_planes(2);
        assert_eq!(cc.window(), 32, "a plane went down before any ACK");
        cc.on_ack(0, 1, 0, 10_000, 10_000);
        assert_eq!(cc.window(), 33, "slow start from the initial window");
        cc.set_planes(4);
        assert_eq!(cc.window(), 33, "after the first ACK the window is its own");
    }

    #[test]
    fn growth_per_rtt_is_one_packet_per_path_up_to_a_limit_per_plane() {
        for (paths, planes, step) in [(8, 1, 8), (32, 1, 16), (32, 2, 32), (256, 4, 64)] {
            let mut cc = ConnCc::new(CcConfig::new(), 1000, paths);
            cc.set_planes(planes);
            cc.on_ack(0, 128 - 16 * planes, 0, 10_000, 10_000);
            assert_eq!(cc.window(), 128);
            cc.on_ack(20_000, 0, 1, 10_000, 10_000);
            assert_eq!(cc.window(), 64, "the first mark halves");
            // One window's worth acknowledged: one RTT of additive increase.
            cc.on_ack(30_000, 64, 0, 10_000, 10_000);
            assert_eq!(cc.window(), 64 + step, "{paths} paths on {planes} planes");
        }
        // A plane lost after the first ACK: the growth follows.
        let mut cc = ConnCc::new(CcConfig::new(), 1000, 64);
        cc.set_planes(4);
        cc.on_ack(0, 64, 0, 10_000, 10_000);
        cc.on_ack(20_000, 0, 1, 10_000, 10_000);
        assert_eq!(cc.window(), 64);
        cc.set_planes(2);
        cc.on_ack(30_000, 64, 0, 10_000, 10_000);
        assert_eq!(cc.window(), 96);
    }

    #[test]
    fn marks_shrink_the_connection_window() {
        let mut cc = ConnCc::new(CcConfig::new(), 1000, 8);
        cc.on_ack(0, 48, 0, 10_000, 10_000);
        assert_eq!(cc.window(), 64);
        cc.on_ack(20_000, 0, 3, 10_000, 10_000);
        assert_eq!(cc.window(), 32);
        cc.on_ack(25_000, 0, 3, 10_000, 10_000);
        assert_eq!(cc.window(), 32, "once per RTT");
    }
}
