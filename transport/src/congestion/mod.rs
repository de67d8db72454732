//! Congestion control. For now one per-path window in packets with ECN-driven AIMD; the
//! congestion-control issue adds the per-connection window and the receiver's rate hint and
//! share from ACKs, and may turn this into a trait with several implementations.

/// A per-path congestion window, in packets (1..=256: a path never has more than 256
/// unresolved packets).
///
/// - +1 packet per window's worth of acknowledged packets (additive increase);
/// - halved on echoed ECN CE, at most once per smoothed RTT;
/// - halved on a retransmission timeout.
///
/// Loss found by SACK does not shrink it: on a sprayed fabric random loss is not a congestion
/// signal, ECN is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    cwnd: u16,
    acc: u16,
    max: u16,
    last_decrease: u64,
}

impl Window {
    /// A window of `initial` packets that grows to at most `max` (both clamped to 1..=256).
    pub fn new(initial: u16, max: u16) -> Self {
        let max = max.clamp(1, 256);
        Window {
            cwnd: initial.clamp(1, max),
            acc: 0,
            max,
            last_decrease: 0,
        }
    }

    /// Current window in packets.
    pub fn cwnd(&self) -> u16 {
        self.cwnd
    }

    /// Room for one more packet with `in_flight` unresolved.
    pub fn has_room(&self, in_flight: u32) -> bool {
        in_flight < u32::from(self.cwnd)
    }

    /// `acked` packets were newly acknowledged.
    pub fn on_ack(&mut self, acked: u32) {
        let acc = u32::from(self.acc).saturating_add(acked);
        let cwnd = u32::from(self.cwnd).max(1);
        let (inc, rest) = (acc / cwnd, acc % cwnd);
        self.cwnd = u32::from(self.cwnd)
            .saturating_add(inc)
            .min(u32::from(self.max)) as u16;
        self.acc = rest as u16;
    }

    /// ECN CE was echoed for this path.
    pub fn on_ecn(&mut self, now: u64, srtt: u64) {
        if now.saturating_sub(self.last_decrease) >= srtt {
            self.halve();
            self.last_decrease = now;
        }
    }

    /// The path's retransmission timer expired.
    pub fn on_timeout(&mut self) {
        self.halve();
    }

    fn halve(&mut self) {
        self.cwnd = (self.cwnd / 2).max(1);
        self.acc = 0;
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
        w.on_ecn(100, 50);
        assert_eq!(w.cwnd(), 3);
        w.on_ecn(120, 50);
        assert_eq!(w.cwnd(), 3, "once per RTT");
        w.on_timeout();
        w.on_timeout();
        w.on_timeout();
        assert_eq!(w.cwnd(), 1, "never below one");
        assert_eq!(Window::new(0, 0).cwnd(), 1);
    }
}
