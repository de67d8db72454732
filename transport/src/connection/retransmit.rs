//! Sender-side loss detection on one path: the in-flight table of the path's PSN space.
//!
//! Each path delivers in order (it is one ECMP route), so when an ACK shows PSN `h` received,
//! every unresolved PSN below `h` on the same path was **lost**, not reordered: its data is
//! handed back at once to be resent (on any path, as a new packet). What an ACK does not
//! resolve, the path's timers do ([`super::path`]): a tail-loss probe, then a retransmission
//! timeout that declares every unresolved packet lost.

use super::super::wire::{seq_lt, PathAck, SACK_BITS};

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

/// How a packet was resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The path acknowledged it.
    Acked,
    /// A later PSN on the same path was acknowledged.
    Lost,
    /// The path's retransmission timer expired.
    TimedOut,
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    live: bool,
    sent_at: u64,
    item: SentItem,
}

/// Result of applying one ACK entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckSummary {
    /// Packets newly acknowledged.
    pub acked: u32,
    /// Packets newly declared lost.
    pub lost: u32,
}

/// In-flight table of one path: PSNs `[una, next)`, at most 256 of them.
#[derive(Clone, Debug)]
pub struct InFlight {
    una: u32,
    next: u32,
    unresolved: u32,
    slots: [Slot; SACK_BITS],
}

impl InFlight {
    /// An empty table starting at `initial_psn`.
    pub fn new(initial_psn: u32) -> Self {
        InFlight {
            una: initial_psn,
            next: initial_psn,
            unresolved: 0,
            slots: [Slot::default(); SACK_BITS],
        }
    }

    /// Re-initialises in place.
    pub fn reset(&mut self, initial_psn: u32) {
        self.una = initial_psn;
        self.next = initial_psn;
        self.unresolved = 0;
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

    /// The PSN the next packet gets.
    pub fn next_psn(&self) -> u32 {
        self.next
    }

    /// Room for another PSN: the span `[una, next]` must stay within the SACK bitmap.
    pub fn has_room(&self) -> bool {
        (self.next.wrapping_sub(self.una) as usize) < SACK_BITS
    }

    /// Records a packet sent now; returns its PSN, or None without room.
    pub fn push(&mut self, now: u64, item: SentItem) -> Option<u32> {
        if !self.has_room() {
            return None;
        }
        let psn = self.next;
        *self.slot(psn)? = Slot {
            live: true,
            sent_at: now,
            item,
        };
        self.next = psn.wrapping_add(1);
        self.unresolved = self.unresolved.saturating_add(1);
        Some(psn)
    }

    /// Applies a path ACK entry: reports newly acknowledged packets, then every unresolved
    /// packet below the highest acknowledged PSN as lost.
    pub fn on_ack(
        &mut self,
        ack: &PathAck,
        mut report: impl FnMut(SentItem, Outcome, u64),
    ) -> AckSummary {
        let mut sum = AckSummary::default();
        let span = self.next.wrapping_sub(self.una);
        let mut highest: Option<u32> = None;
        for i in 0..span {
            let psn = self.una.wrapping_add(i);
            if !ack.acks(psn) {
                continue;
            }
            highest = Some(psn);
            if let Some(s) = self.slot(psn) {
                if s.live {
                    s.live = false;
                    let (item, at) = (s.item, s.sent_at);
                    sum.acked += 1;
                    report(item, Outcome::Acked, at);
                }
            }
        }
        if let Some(h) = highest {
            for i in 0..span {
                let psn = self.una.wrapping_add(i);
                if !seq_lt(psn, h) {
                    break;
                }
                if let Some(s) = self.slot(psn) {
                    if s.live {
                        s.live = false;
                        let (item, at) = (s.item, s.sent_at);
                        sum.lost += 1;
                        report(item, Outcome::Lost, at);
                    }
                }
            }
        }
        self.unresolved = self.unresolved.saturating_sub(sum.acked + sum.lost);
        self.advance();
        sum
    }

    /// Retransmission timeout: every unresolved packet is lost.
    pub fn on_timeout(&mut self, mut report: impl FnMut(SentItem, Outcome, u64)) -> u32 {
        let span = self.next.wrapping_sub(self.una);
        let mut n = 0;
        for i in 0..span {
            let psn = self.una.wrapping_add(i);
            if let Some(s) = self.slot(psn) {
                if s.live {
                    s.live = false;
                    n += 1;
                    let (item, at) = (s.item, s.sent_at);
                    report(item, Outcome::TimedOut, at);
                }
            }
        }
        self.unresolved = 0;
        self.una = self.next;
        n
    }

    fn advance(&mut self) {
        while self.una != self.next {
            let una = self.una;
            match self.slot(una) {
                Some(s) if s.live => break,
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
        let mut v = Vec::new();
        f.on_ack(a, |it, o, _| v.push((it.seg, o)));
        v
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
    fn ack_for_unsent_psns_is_ignored() {
        let mut f = InFlight::new(10);
        f.push(0, item(0));
        let v = run(&mut f, &ack(500, &[600]));
        assert_eq!(v, std::vec![(0, Outcome::Acked)]);
        assert_eq!(f.next_psn(), 11);
    }
}
