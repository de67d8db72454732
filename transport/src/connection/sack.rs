// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Selective acknowledgement state.
//!
//! - [`PsnWindow`]: the receiver's view of one path's PSN space: a cumulative PSN plus the
//!   256-bit bitmap of PSNs received beyond it, exactly what a path entry of an ACK carries.
//! - [`SegWindow`]: per-message segment bookkeeping (which packets of a message are acknowledged
//!   or in flight at the sender; which have arrived at the receiver), a 256-segment window that
//!   slides over messages of any length.

use super::super::wire::{seq_diff, PathAck, SACK_BITS, SACK_WORDS};
use super::super::zero::{zero_valid, ZeroValid};

/// How far beyond a path's cumulative PSN a receiver accepts a PSN: one more than
/// `RECV_WINDOW` beyond is dropped unseen ([`PsnWindow::record`]), so a spoofed packet cannot
/// slide the window over the real ones.
///
/// 4 x 256, so that no conforming sender reaches it. A sender keeps at most 256 unresolved
/// packets per path, and until a retransmission timeout resolves a packet only when it or a
/// later one was acknowledged; an ACK that acknowledges a PSN has a cumulative PSN at most
/// 256 below it. So a path's next PSN is at most 2 x 256 + 1 beyond the last cumulative PSN
/// its peer reported, and a receiver's cumulative PSN is never below that report. What is
/// left (two more windows) absorbs the new PSNs of a timeout or two (a tail loss, a route
/// change) before the peer reports again. Only a path that stays unanswered through many
/// timeouts gets further; it then takes no new PSN and probes with an earlier one
/// ([`InFlight::window_limited`](super::retransmit::InFlight::window_limited)).
pub const RECV_WINDOW: u32 = 4 * SACK_BITS as u32;

type Bits = [u64; SACK_WORDS];

fn bit(bits: &Bits, i: usize) -> bool {
    bits.get(i / 64).is_some_and(|w| (w >> (i % 64)) & 1 == 1)
}

fn set_bit(bits: &mut Bits, i: usize) {
    if let Some(w) = bits.get_mut(i / 64) {
        *w |= 1 << (i % 64);
    }
}

fn clear_bit(bits: &mut Bits, i: usize) {
    if let Some(w) = bits.get_mut(i / 64) {
        *w &= !(1 << (i % 64));
    }
}

/// Shifts the bitmap towards bit 0 by `k` bits (bit `k` becomes bit 0).
fn shift_down(bits: &mut Bits, k: usize) {
    if k == 0 {
        return;
    }
    if k >= SACK_BITS {
        *bits = [0; SACK_WORDS];
        return;
    }
    let words = k / 64;
    let sh = k % 64;
    let mut out = [0u64; SACK_WORDS];
    for (i, o) in out.iter_mut().enumerate() {
        let lo = bits.get(i + words).copied().unwrap_or(0);
        let hi = bits.get(i + words + 1).copied().unwrap_or(0);
        *o = if sh == 0 {
            lo
        } else {
            (lo >> sh) | (hi << (64 - sh))
        };
    }
    *bits = out;
}

/// Number of consecutive set bits from bit 0.
fn leading_run(bits: &Bits) -> usize {
    let mut n = 0;
    for w in bits {
        let ones = w.trailing_ones() as usize;
        n += ones;
        if ones < 64 {
            break;
        }
    }
    n
}

/// What [`PsnWindow::record`] made of a PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// First arrival of this PSN.
    New,
    /// Seen before, or below the window.
    Duplicate,
    /// More than [`RECV_WINDOW`] beyond the cumulative PSN: not recorded.
    OutOfWindow,
}

/// Receiver side of one path's PSN space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PsnWindow {
    /// Lowest PSN not received (everything below is received or was skipped).
    cum: u32,
    /// Bit i: PSN cum + 1 + i received.
    bits: Bits,
}
zero_valid!(struct PsnWindow { cum, bits });

impl PsnWindow {
    /// An empty window expecting `initial_psn` first.
    pub fn new(initial_psn: u32) -> Self {
        PsnWindow {
            cum: initial_psn,
            bits: [0; SACK_WORDS],
        }
    }

    /// The cumulative PSN (lowest not received).
    pub fn cum(&self) -> u32 {
        self.cum
    }

    /// The SACK bitmap (bit i: PSN cum + 1 + i).
    pub fn sack(&self) -> Bits {
        self.bits
    }

    /// Whether `psn` may be recorded: at most [`RECV_WINDOW`] beyond the cumulative PSN
    /// (anything before it is a duplicate).
    pub fn in_window(&self, psn: u32) -> bool {
        seq_diff(psn, self.cum) <= RECV_WINDOW as i32
    }

    /// Records the arrival of `psn`. A PSN more than 256 beyond the cumulative PSN slides the
    /// window forward (the sender never has more than 256 unresolved PSNs on a path, so the
    /// PSNs skipped were already given up by it); one more than [`RECV_WINDOW`] beyond changes
    /// nothing (no sender goes that far: such a packet is forged).
    pub fn record(&mut self, psn: u32) -> Recorded {
        let d = seq_diff(psn, self.cum);
        if d < 0 {
            return Recorded::Duplicate;
        }
        if !self.in_window(psn) {
            return Recorded::OutOfWindow;
        }
        let d = d as u32 as usize; // 0..=RECV_WINDOW
        if d == 0 {
            self.cum = self.cum.wrapping_add(1);
            self.advance();
            return Recorded::New;
        }
        let idx = d - 1;
        if idx >= SACK_BITS {
            // Slide the window by k so that psn lands on its last bit. Shifting by k - 1 and
            // moving cum by k leaves bit 0 describing the new cum itself, which is what
            // `advance` expects; then psn is inside the window.
            let k = idx - (SACK_BITS - 1);
            shift_down(&mut self.bits, k - 1);
            self.cum = self.cum.wrapping_add(k as u32);
            self.advance();
            return self.record(psn);
        }
        if bit(&self.bits, idx) {
            return Recorded::Duplicate;
        }
        set_bit(&mut self.bits, idx);
        Recorded::New
    }

    /// Whether `psn` has been recorded (or lies below the window).
    pub fn contains(&self, psn: u32) -> bool {
        let d = seq_diff(psn, self.cum);
        if d < 0 {
            return true;
        }
        d > 0 && bit(&self.bits, d as u32 as usize - 1)
    }

    /// Moves `cum` past every PSN received contiguously after it.
    fn advance(&mut self) {
        // Called right after cum moved: bit 0 now describes cum itself.
        loop {
            if !bit(&self.bits, 0) {
                // New cum not received. Shift by one so bit 0 describes new cum + 1.
                shift_down(&mut self.bits, 1);
                return;
            }
            // New cum was received: skip the whole run.
            let run = leading_run(&self.bits);
            shift_down(&mut self.bits, run);
            self.cum = self.cum.wrapping_add(run as u32);
        }
    }

    /// The ACK entry describing this window.
    pub fn to_ack(&self, path_id: u16, plane: u8, echo_ts: u32, marks: (u16, u16)) -> PathAck {
        PathAck {
            path_id,
            plane,
            cum_psn: self.cum,
            echo_ts,
            ecn_ce: marks.0,
            busy: marks.1,
            sack: self.bits,
        }
    }
}

/// Segment bookkeeping for one message: segments before `base` are all done; bit i of `done`
/// is segment `base + i`, likewise `inflight` (sender side only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegWindow {
    base: u32,
    done: Bits,
    inflight: Bits,
    /// One past the highest segment ever sent (sender) / ever received (receiver).
    high: u32,
}
zero_valid!(struct SegWindow { base, done, inflight, high });

impl SegWindow {
    /// Segments tracked beyond the first missing one.
    pub const WIDTH: u32 = SACK_BITS as u32;

    /// Nothing done, nothing in flight.
    pub fn new() -> Self {
        SegWindow::default()
    }

    /// First segment not done.
    pub fn base(&self) -> u32 {
        self.base
    }

    /// All of `n` segments done.
    pub fn complete(&self, n: u32) -> bool {
        self.base >= n
    }

    fn index(&self, seg: u32) -> Option<usize> {
        let i = seg.checked_sub(self.base)?;
        if i < Self::WIDTH {
            Some(i as usize)
        } else {
            None
        }
    }

    /// Whether `seg` may be tracked now (inside the window).
    pub fn in_window(&self, seg: u32) -> bool {
        seg < self.base || self.index(seg).is_some()
    }

    /// Whether `seg` is done.
    pub fn is_done(&self, seg: u32) -> bool {
        seg < self.base || self.index(seg).is_some_and(|i| bit(&self.done, i))
    }

    /// Marks `seg` done; returns true the first time. Out-of-window segments are ignored
    /// (returns false).
    pub fn mark_done(&mut self, seg: u32) -> bool {
        let Some(i) = self.index(seg) else {
            return false;
        };
        if bit(&self.done, i) {
            return false;
        }
        set_bit(&mut self.done, i);
        clear_bit(&mut self.inflight, i);
        if seg >= self.high {
            self.high = seg.saturating_add(1);
        }
        let run = leading_run(&self.done);
        if run > 0 {
            shift_down(&mut self.done, run);
            shift_down(&mut self.inflight, run);
            self.base = self.base.saturating_add(run as u32);
        }
        true
    }

    /// Sender: `seg` handed to a path.
    pub fn mark_sent(&mut self, seg: u32) {
        if let Some(i) = self.index(seg) {
            set_bit(&mut self.inflight, i);
        }
        if seg >= self.high {
            self.high = seg.saturating_add(1);
        }
    }

    /// Sender: the packet carrying `seg` was lost; it becomes sendable again.
    pub fn mark_lost(&mut self, seg: u32) {
        if let Some(i) = self.index(seg) {
            clear_bit(&mut self.inflight, i);
        }
    }

    /// Sender: whether `seg` was sent before (a send now is a retransmission).
    pub fn was_sent(&self, seg: u32) -> bool {
        seg < self.high
    }

    /// Sender: the first segment below `n` that is neither done nor in flight and fits the
    /// window.
    pub fn next_unsent(&self, n: u32) -> Option<u32> {
        for (w, (d, f)) in self.done.iter().zip(self.inflight.iter()).enumerate() {
            let free = !(d | f);
            if free != 0 {
                let seg = self
                    .base
                    .checked_add((w * 64) as u32 + free.trailing_zeros())?;
                return if seg < n { Some(seg) } else { None };
            }
        }
        None
    }

    /// Sender: nothing in flight and nothing left to send below `n`.
    pub fn idle(&self, n: u32) -> bool {
        self.inflight.iter().all(|w| *w == 0) && self.next_unsent(n).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_advances_cum() {
        let mut w = PsnWindow::new(10);
        for p in 10..20 {
            assert_eq!(w.record(p), Recorded::New);
        }
        assert_eq!(w.cum(), 20);
        assert_eq!(w.sack(), [0; 4]);
        assert_eq!(w.record(15), Recorded::Duplicate);
    }

    #[test]
    fn gap_then_fill() {
        let mut w = PsnWindow::new(0);
        w.record(0);
        w.record(2);
        w.record(3);
        w.record(5);
        assert_eq!(w.cum(), 1);
        // bits: 2 -> idx 0, 3 -> idx 1, 5 -> idx 3
        assert_eq!(w.sack()[0], 0b1011);
        let a = w.to_ack(0, 0, 0, (0, 0));
        assert!(a.acks(0) && !a.acks(1) && a.acks(2) && a.acks(3) && !a.acks(4) && a.acks(5));
        assert_eq!(w.record(1), Recorded::New);
        assert_eq!(w.cum(), 4);
        assert_eq!(w.sack()[0], 0b1);
        w.record(4);
        assert_eq!(w.cum(), 6);
        assert_eq!(w.sack(), [0; 4]);
    }

    #[test]
    fn wraps_around_u32() {
        let start = u32::MAX - 3;
        let mut w = PsnWindow::new(start);
        w.record(start.wrapping_add(1));
        w.record(start.wrapping_add(6)); // = 2
        assert_eq!(w.cum(), start);
        assert!(w.contains(2) && !w.contains(1) && w.contains(start.wrapping_sub(1)));
        for i in 0..8u32 {
            w.record(start.wrapping_add(i));
        }
        assert_eq!(w.cum(), 4);
        assert_eq!(w.record(u32::MAX), Recorded::Duplicate);
    }

    #[test]
    fn edges_of_bitmap_and_slide() {
        let mut w = PsnWindow::new(100);
        // cum+256 is the last bit.
        assert_eq!(w.record(356), Recorded::New);
        assert_eq!(w.cum(), 100);
        assert_eq!(w.sack()[3], 1 << 63);
        // cum+257 slides the window by one: 100 skipped, 356 now bit 254.
        assert_eq!(w.record(357), Recorded::New);
        assert_eq!(w.cum(), 101);
        assert!(w.contains(356) && w.contains(357) && !w.contains(101) && w.contains(100));
        // A far jump (within the window) clears everything below it.
        w.record(101 + 1_000);
        assert_eq!(w.cum(), 101 + 1_000 - 256);
        assert!(w.contains(101 + 1_000));
        assert!(!w.contains(101 + 1_000 - 1));
    }

    /// A window with some history: cum 1000, 1002 and 1256 received beyond it.
    fn busy_window() -> PsnWindow {
        let mut w = PsnWindow::new(990);
        for p in (990..1000).chain([1002, 1256]) {
            assert_eq!(w.record(p), Recorded::New);
        }
        assert_eq!(w.cum(), 1000);
        w
    }

    #[test]
    fn a_psn_beyond_the_window_changes_nothing() {
        let mut w = busy_window();
        let before = w;
        for d in [RECV_WINDOW + 1, RECV_WINDOW + 2, 1 << 20, (1 << 31) - 1] {
            let psn = w.cum().wrapping_add(d);
            assert!(!w.in_window(psn), "{d}");
            assert_eq!(w.record(psn), Recorded::OutOfWindow, "{d}");
            assert_eq!(w, before, "{d}: cum and bitmap unchanged");
            assert!(!w.contains(psn));
        }
        // The real traffic goes on as if nothing had come.
        assert_eq!(w.record(1000), Recorded::New);
        assert_eq!(w.record(1001), Recorded::New);
        assert_eq!(w.cum(), 1003);
    }

    #[test]
    fn a_psn_at_the_window_bound_is_accepted() {
        let mut w = busy_window();
        let psn = 1000 + RECV_WINDOW;
        assert!(w.in_window(psn));
        assert_eq!(w.record(psn), Recorded::New);
        // It slid the window: it is on the bitmap's last bit.
        assert_eq!(w.cum(), psn - 256);
        assert!(w.contains(psn) && !w.contains(psn - 1) && w.contains(1256));
        assert_eq!(w.record(psn), Recorded::Duplicate);
        // Below the window is a duplicate, however far.
        assert_eq!(w.record(psn.wrapping_sub(1 << 30)), Recorded::Duplicate);
    }

    #[test]
    fn the_window_bound_wraps_around_u32() {
        let start = u32::MAX - 10;
        let mut w = PsnWindow::new(start);
        let last = start.wrapping_add(RECV_WINDOW);
        assert_eq!(w.record(last.wrapping_add(1)), Recorded::OutOfWindow);
        assert_eq!(w, PsnWindow::new(start));
        assert_eq!(w.record(last), Recorded::New);
        assert_eq!(w.cum(), last.wrapping_sub(256));
    }

    #[test]
    fn full_bitmap_then_fill_cum() {
        let mut w = PsnWindow::new(0);
        for p in 1..=256 {
            w.record(p);
        }
        assert_eq!(w.sack(), [u64::MAX; 4]);
        w.record(0);
        assert_eq!(w.cum(), 257);
        assert_eq!(w.sack(), [0; 4]);
    }

    #[test]
    fn shift_down_cross_words() {
        let mut b = [0u64, 1, 0, 1 << 5];
        shift_down(&mut b, 65);
        assert_eq!(b, [0, 0, 1 << 4, 0]);
        let mut b = [u64::MAX; 4];
        shift_down(&mut b, 64);
        assert_eq!(b, [u64::MAX, u64::MAX, u64::MAX, 0]);
    }

    #[test]
    fn seg_window_sender_flow() {
        let mut s = SegWindow::new();
        let n = 300;
        // Window limits to 256 in flight.
        let mut sent = 0;
        while let Some(seg) = s.next_unsent(n) {
            s.mark_sent(seg);
            sent += 1;
        }
        assert_eq!(sent, 256);
        s.mark_lost(3);
        assert_eq!(s.next_unsent(n), Some(3));
        assert!(s.was_sent(3));
        s.mark_sent(3);
        for seg in 0..3 {
            assert!(s.mark_done(seg));
        }
        assert!(!s.mark_done(1));
        assert_eq!(s.base(), 3);
        // Base moved by 3: three more segments fit.
        assert_eq!(s.next_unsent(n), Some(256));
        for seg in 3..300 {
            s.mark_done(seg);
        }
        assert!(s.complete(n));
        assert!(s.idle(n));
    }

    #[test]
    fn seg_window_out_of_window_ignored() {
        let mut s = SegWindow::new();
        assert!(!s.mark_done(256));
        assert!(!s.in_window(256));
        assert!(s.mark_done(255));
        assert!(!s.complete(1));
        assert!(s.mark_done(0));
        assert!(s.is_done(255));
        assert_eq!(s.base(), 1);
    }
}
