// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! The timers a connection asks its caller to arm. The caller arms one timer at
//! [`super::Connection::poll_timeout`] and calls [`super::Connection::handle_timeout`] when it
//! fires (or earlier; firing early is harmless); what fires then is here too.

use super::*;

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

impl<P: PathSlots, S: StreamSlots> Connection<P, S> {
    /// The earliest deadline the caller must arm a timer for.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.next_timer().map(|(t, _)| t)
    }

    fn next_timer(&self) -> Option<(u64, Timer)> {
        let mut e = Earliest::new();
        e.offer(self.ack_deadline(), Timer::Ack);
        e.offer(self.cc.deadline(), Timer::Pacing);
        let behind = self.behind();
        for (i, p) in self.paths.as_ref().iter().take(self.num_paths).enumerate() {
            e.offer(p.deadline(behind), Timer::Path(i));
        }
        e.offer(
            self.sched.timer_hint(),
            Timer::Stream(self.sched.front(TIMER).unwrap_or(0)),
        );
        // Parked streams count on the connection delivering: when it last did plus their
        // timeout, they go back on the TIMER list.
        e.offer(
            self.sched
                .parked_stall()
                .map(|st| self.delivered_at.saturating_add(st)),
            Timer::Stream(0),
        );
        e.get()
    }

    /// What the paths' timers need to know of the others ([`Behind`]). The RTT a path
    /// without a sample borrows is only offered while that path is the connection's last
    /// with packets unanswered: a fresh connection's paths under load (an incast's) would
    /// otherwise probe by another path's RTT where their own routes' queues are longer.
    /// Stops at the second path with packets unanswered: under load (most calls) nothing is
    /// borrowed, and the pass ends after a path or two.
    fn behind(&self) -> Behind {
        let (mut busy, mut srtt) = (0u32, 0u64);
        for p in self.paths.as_ref().iter().take(self.num_paths) {
            if p.inflight.unresolved() > 0 {
                busy += 1;
                if busy > 1 {
                    break;
                }
            }
            srtt = srtt.max(p.rtt.srtt());
        }
        Behind {
            sent: self.delivered_sent,
            last_srtt: if busy == 1 { srtt } else { 0 },
        }
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        self.paths_changed();
        if self.ack_deadline().is_some_and(|d| d <= now) {
            self.ack_now = true;
            self.ack_armed = false;
        }
        self.cc.on_timer(now);
        let stall = self.cfg.stall_timeout;
        let behind = self.behind();
        let (paths, streams, sched, rng) = (
            self.paths.as_mut(),
            &mut self.streams,
            &mut self.sched,
            &mut self.rng,
        );
        for p in paths.iter_mut().take(self.num_paths) {
            if p.deadline(behind).is_some_and(|d| d <= now) {
                p.on_timer(now, rng, behind, |item, outcome, _| {
                    resolve(streams, sched, stall, now, item, outcome)
                });
            }
        }
        self.stats.timeouts = self.paths.as_ref().iter().map(|p| p.stats.timeouts).sum();
        if let Some(st) = self.sched.parked_stall() {
            if now >= self.delivered_at.saturating_add(st) {
                // Nothing delivered for a whole timeout: the waiting is the peer's silence
                // now, and every stream's timeout counts.
                self.sched.unpark_all(&mut self.streams, stall);
            }
        }
        if self.sched.timer_hint().is_some_and(|d| d <= now) {
            self.stream_timers(now);
        }
    }

    /// Fires the streams' due completion timeouts and RNR back-offs: one pass over the
    /// streams on the TIMER list (those with outstanding work), which leaves on it only those
    /// that still have a deadline and makes the hint exact.
    ///
    /// A stream whose oldest message has not all gone out, on a connection that delivers,
    /// waits for its turn among the connection's streams, and its timeout would only restart
    /// (`Requester::on_timer`): it is parked off the list, so that thousands of streams
    /// waiting their turns are not all visited every timeout (with 4,000 QPs that pass was
    /// the busiest function). It goes back on the list when something happens to it, when
    /// its turn comes (`mark_sent`), or when the connection stops delivering.
    fn stream_timers(&mut self, now: u64) {
        let stall_default = self.cfg.stall_timeout;
        let (streams, sched) = (&mut self.streams, &mut self.sched);
        let mut earliest: Option<u64> = None;
        for _ in 0..sched.len(TIMER) {
            let Some(i) = sched.pop(streams, TIMER) else {
                break;
            };
            let Some(s) = streams.slot_mut(i) else {
                continue;
            };
            if !s.open || s.error().is_some() {
                continue;
            }
            let stall = s.ack_timeout(stall_default);
            if s.req.deadline(stall).is_some_and(|d| d <= now) {
                let retry_cnt = s.cfg.retry_cnt;
                let delivering =
                    self.delivered_at != 0 && now < self.delivered_at.saturating_add(stall);
                if s.req.on_timer(now, stall, retry_cnt, delivering) {
                    s.req.fail_retry_exceeded();
                }
                sched.push(streams, WORK, i);
                sched.push(streams, EVENT, i);
            }
            let Some(s) = streams.slot(i) else { continue };
            if let Some(d) = s.req.deadline(stall) {
                let delivering =
                    self.delivered_at != 0 && now < self.delivered_at.saturating_add(stall);
                if delivering && s.req.waiting_for_turn() {
                    sched.park(streams, i, stall);
                    // It wants to send: on the WORK list it is (or its turn never comes).
                    sched.push(streams, WORK, i);
                    continue;
                }
                earliest = Some(earliest.map_or(d, |e| e.min(d)));
                sched.push(streams, TIMER, i);
            }
        }
        sched.set_timer_hint(earliest);
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
