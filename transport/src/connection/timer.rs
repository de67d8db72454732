// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! The timers a connection asks its caller to arm. The caller arms one timer at
//! [`super::Connection::poll_timeout`] and calls [`super::Connection::handle_timeout`] when it
//! fires (or earlier; firing early is harmless).

/// Which timer is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// Send a coalesced ACK.
    Ack,
    /// A path's tail-loss probe or retransmission timeout (index into the paths).
    Path(usize),
    /// A stream's completion timeout or RNR back-off (index into the streams).
    Stream(usize),
    /// Data held back by the pacer may leave.
    Pacing,
}

/// Keeps the earliest of several optional deadlines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Earliest(Option<(u64, Timer)>);

impl Earliest {
    /// No deadline yet.
    pub fn new() -> Self {
        Earliest(None)
    }

    /// Keeps `deadline` for `timer` if it is the earliest so far.
    pub fn offer(&mut self, deadline: Option<u64>, timer: Timer) {
        if let Some(d) = deadline {
            match self.0 {
                Some((cur, _)) if cur <= d => {}
                _ => self.0 = Some((d, timer)),
            }
        }
    }

    /// The earliest deadline and its timer.
    pub fn get(&self) -> Option<(u64, Timer)> {
        self.0
    }
}

/// Earliest of two optional deadlines.
pub fn min_deadline(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_wins() {
        let mut e = Earliest::new();
        e.offer(None, Timer::Ack);
        e.offer(Some(50), Timer::Path(1));
        e.offer(Some(20), Timer::Stream(0));
        e.offer(Some(20), Timer::Path(3));
        assert_eq!(e.get(), Some((20, Timer::Stream(0))));
        assert_eq!(min_deadline(None, Some(3)), Some(3));
        assert_eq!(min_deadline(Some(4), Some(3)), Some(3));
    }
}
