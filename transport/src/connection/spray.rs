// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Spraying: which path the next data packet takes. Smooth weighted round-robin over the
//! usable paths, each weighted by its health, picking among those with window room; runs of
//! packets on one path (`Config::path_burst`), whose later packets need no full pick while
//! nothing changed.

use super::*;

/// Bound of a path's round-robin credit. What a path earns while it waits is capped lower, at
/// one round's total ([`Connection::spray`]); this bounds what a path picked often owes.
const CREDIT_BOUND: i32 = 1 << 20;

/// Whether path `p`'s runs are `Config::lossy_path_burst` long: it has been losing
/// (`Config::lossy_run_rate`) and its network has been marking (`Config::marked_run_rate`).
fn short_runs(cfg: &Config, p: &Path) -> bool {
    p.loss_rate() > cfg.lossy_run_rate && p.ecn_rate() >= cfg.marked_run_rate
}

/// A path pick not charged yet: its planes mask and path (the weights of the full pick behind
/// it are in `Path::pick_weight`, their total in `Connection::run_total`). Plain fields, not
/// an `Option` of a tuple: a connection is built from all-zero bytes (`ZeroValid`), which
/// must be a valid value of every field, and here all-zero is "no pick".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Pick {
    valid: bool,
    mask: u32,
    path: usize,
}

zero_valid!(struct Pick { valid, mask, path });

impl Pick {
    pub(super) const NONE: Pick = Pick {
        valid: false,
        mask: 0,
        path: 0,
    };

    /// The pick, if there is one.
    fn get(self) -> Option<(u32, usize)> {
        self.valid.then_some((self.mask, self.path))
    }
}

impl<P: PathSlots, S: StreamSlots> Connection<P, S> {
    /// Packet spraying: smooth weighted round-robin over the usable (Active or Probing) paths,
    /// each weighted by its score ([`Path::weight`]: recent loss, ECN, RTT inflation); the
    /// packet goes on the one with the most credit among those with window room. Equal paths
    /// take turns in index order, so the planes (path i is on plane i % planes) stay evenly
    /// loaded; a degraded path gets a smaller share and a smaller window. Only when no path
    /// is usable does data go out on Suspect/Failed paths (so a dead peer still exhausts the
    /// retry count).
    ///
    /// Only paths on the planes in `mask` (bit per plane; `u32::MAX`: all) take part.
    pub(super) fn pick_path(&mut self, now: u64, mask: u32) -> Option<usize> {
        self.spray(now, false, mask)
    }

    /// Charges the pick [`Connection::pick_path`] made with `mask` to the round-robin
    /// credits, once the packet is sure to leave (nothing changed in between, so the same
    /// path is charged): with the weights the pick found, or, if the last pick was made
    /// with another mask, by spraying again.
    pub(super) fn commit_path(&mut self, now: u64, mask: u32) {
        let Some((picked_mask, i)) = core::mem::replace(&mut self.last_pick, Pick::NONE).get()
        else {
            self.spray(now, true, mask);
            return;
        };
        if picked_mask != mask {
            self.spray(now, true, mask);
            return;
        }
        // The pick's credits, with the weights of the full pick it was or whose run it went
        // on with: charged at the next full pick (`spray`), which is where they are
        // read.
        self.charge_burst(i);
        self.run_rounds = self.run_rounds.saturating_add(1);
    }

    /// The run of packets on one path (`Config::path_burst`): path `i` takes the next packet.
    fn charge_burst(&mut self, i: usize) {
        if i == self.burst_path && self.burst_left > 0 {
            self.burst_left -= 1;
        } else {
            self.burst_path = i;
            let lossy = self
                .paths
                .as_ref()
                .get(i)
                .is_some_and(|p| short_runs(&self.cfg, p));
            let run = if lossy {
                self.cfg.path_burst.min(self.cfg.lossy_path_burst)
            } else {
                self.cfg.path_burst
            };
            self.burst_left = run.saturating_sub(1);
        }
    }

    /// Whether a path on the planes in `mask` is usable (Active or Probing, its plane up),
    /// with or without window room.
    pub(super) fn planes_usable(&self, mask: u32) -> bool {
        let ok = self.planes_up & mask;
        self.paths
            .as_ref()
            .iter()
            .take(self.send_paths)
            .any(|p| plane_bit(p.plane) & ok != 0 && p.usable())
    }

    /// One round of smooth weighted round-robin: every eligible path earns its weight, the
    /// one with the most credit among those with window room is picked and pays what they
    /// earned (charged at the next full pick; with `commit` false only once `commit_path`
    /// says the packet leaves). Only paths on the planes in `mask` take part.
    ///
    /// A path without window room earns its weight too, up to one round's total: so when
    /// its room comes back it has its turn, and its share does not depend on when its ACKs
    /// free its window (which the receiver's ACK timing moves: its delayed ACKs, an ACK at
    /// once when a message completes). Earning only with room gave the paths whose ACKs
    /// came back early more than their share, and a path that alone had room piled up
    /// credit while the others waited and was picked again right after its run. Only a path
    /// without room is capped: one with room that was not picked earns all its weight, as in
    /// plain smooth round-robin (were it capped too, a pick made while every other path sat
    /// at the cap would cost nothing, and the lowest-numbered paths with room would take
    /// every pick). A lossy path
    /// (`Config::lossy_run_rate`) whose run ended is not picked for the next one while
    /// another path has room: its runs stay `Config::lossy_path_burst` packets long.
    pub(super) fn spray(&mut self, now: u64, commit: bool, mask: u32) -> Option<usize> {
        // A pick that finds no path leaves nothing to charge.
        self.last_pick = Pick::NONE;
        if let Some(i) = self.run_goes_on(now, mask) {
            self.picked(commit, mask, i);
            return Some(i);
        }
        // The picks charged since the last full pick (`commit_path`): each path it weighed
        // earns its weight per pick, window room or not, but one that had no room none
        // beyond one round's total (what a path may be owed: its turn as soon as it has
        // room, no more); its path pays what they earned, in the pass below, before the new
        // weights are taken.
        let rounds = i32::try_from(core::mem::replace(&mut self.run_rounds, 0)).unwrap_or(i32::MAX);
        let owed = self.run_total.max(1);
        let n = self.send_paths;
        let planes_up = self.planes_up & mask;
        let paths = self.paths.as_mut().get_mut(..n)?;
        let up = |p: &Path| plane_bit(p.plane) & planes_up != 0;
        // What the paths at the cap could not earn: the pick's path does not pay it.
        let mut unearned: i32 = 0;
        // One pass for the charges, and for the best health and RTT, among the usable paths
        // and among all that are up (those count when none is usable).
        let mut any_usable = false;
        let (mut usable_health, mut usable_srtt) = (0u16, u64::MAX);
        let (mut up_health, mut up_srtt) = (0u16, u64::MAX);
        for p in paths.iter_mut() {
            if rounds > 0 && p.pick_weight > 0 {
                let credit = p
                    .credit
                    .saturating_add(p.pick_weight.saturating_mul(rounds));
                if credit > owed && !p.pick_room {
                    let capped = owed.max(p.credit);
                    unearned = unearned.saturating_add(credit.saturating_sub(capped));
                    p.credit = capped;
                } else {
                    p.credit = credit.min(CREDIT_BOUND);
                }
            }
            p.pick_weight = 0;
            if !up(p) {
                continue;
            }
            p.age(now);
            let srtt = if p.rtt.has_sample() {
                p.rtt.srtt()
            } else {
                u64::MAX
            };
            up_health = up_health.max(p.health());
            up_srtt = up_srtt.min(srtt);
            if p.usable() {
                any_usable = true;
                usable_health = usable_health.max(p.health());
                usable_srtt = usable_srtt.min(srtt);
            }
        }
        if rounds > 0 {
            // The weights' total per pick, less what the cap kept from the paths.
            let earned = self
                .run_total
                .saturating_mul(rounds)
                .saturating_sub(unearned);
            if let Some(p) = paths.get_mut(self.burst_path) {
                p.credit = p.credit.saturating_sub(earned).max(-CREDIT_BOUND);
            }
        }
        let eligible = |p: &Path| up(p) && (p.usable() || !any_usable);
        let (best_health, best_srtt) = if any_usable {
            (usable_health, usable_srtt)
        } else {
            (up_health, up_srtt)
        };
        let best_srtt = if best_srtt == u64::MAX { 0 } else { best_srtt };
        let mut total: i32 = 0;
        let mut best: Option<usize> = None;
        let mut best_credit = i32::MIN;
        let (burst_path, mut burst_ok) = (self.burst_path, false);
        let cfg = &self.cfg;
        let lossy_done =
            self.burst_left == 0 && paths.get(burst_path).is_some_and(|p| short_runs(cfg, p));
        let mut alone: Option<usize> = None;
        for (i, p) in paths.iter_mut().enumerate() {
            if !eligible(p) {
                continue;
            }
            // Every eligible path earns its weight in this round (charged at the next full
            // pick); only one with window room can be picked.
            let w = p.weight(best_srtt, now);
            p.pick_weight = w;
            total = total.saturating_add(w);
            p.pick_room = p.has_window(best_health);
            if !p.pick_room {
                continue;
            }
            let credit = p
                .credit
                .saturating_add(w)
                .clamp(-CREDIT_BOUND, CREDIT_BOUND);
            if lossy_done && i == burst_path {
                // Its run ended: another path goes next, if one has room.
                alone = Some(i);
                continue;
            }
            if credit > best_credit {
                best_credit = credit;
                best = Some(i);
            }
            burst_ok |= i == burst_path;
        }
        // A run on the last path goes on while it may (and the path may take it).
        let i = if burst_ok && self.burst_left > 0 {
            burst_path
        } else {
            best.or(alone)?
        };
        (self.run_total, self.run_health, self.run_mask) = (total, best_health, mask);
        (self.run_now, self.run_fresh) = (now, true);
        self.picked(commit, mask, i);
        Some(i)
    }

    /// Path `i` was picked among the planes in `mask`: charged now (`commit`: a round of
    /// the last full pick's weights, charged at the next full pick), or left for
    /// `commit_path` to charge once the packet is sure to leave.
    fn picked(&mut self, commit: bool, mask: u32, i: usize) {
        if commit {
            self.charge_burst(i);
            self.run_rounds = self.run_rounds.saturating_add(1);
        } else {
            self.last_pick = Pick {
                valid: true,
                mask,
                path: i,
            };
        }
    }

    /// The path of the current run, if its next packet may go there without a full pick:
    /// the run has packets left, the pick is among the same planes, and the path is still
    /// usable, on a plane that is up, with window room (against the best health the run's
    /// full pick found). Else a full pick decides (it also deals with runs on paths that
    /// are only picked because none is usable).
    fn run_goes_on(&self, now: u64, mask: u32) -> Option<usize> {
        if !self.run_fresh
            || now != self.run_now
            || self.burst_left == 0
            || mask != self.run_mask
            || self.burst_path >= self.send_paths
        {
            return None;
        }
        let i = self.burst_path;
        let p = self.paths.as_ref().get(i)?;
        let ok = plane_bit(p.plane) & self.planes_up & mask != 0
            && p.usable()
            && p.pick_weight != 0
            && p.has_window(self.run_health);
        ok.then_some(i)
    }

    /// Something changed the paths (a packet or a timeout came, a probe went, the paths or
    /// planes were changed): the next pick is a full one.
    pub(super) fn paths_changed(&mut self) {
        self.run_fresh = false;
    }
}
