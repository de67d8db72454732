// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A small deterministic PRNG (splitmix64) and the hash the ECMP switches use.

/// splitmix64: every stream of numbers is a function of the seed alone.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// True with probability `ppm` / 1e6.
    pub fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && (self.next_u64() % 1_000_000) < u64::from(ppm)
    }

    /// Uniform in `0..n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// A seeded permutation of `0..n`.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
        v
    }
}

/// splitmix64's finaliser: a good 64-bit mixing function.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The ECMP hash of a switch: its own seed and the packet's 5-tuple (the protocol is always
/// UDP; the addresses are the host numbers).
pub fn ecmp_hash(switch_seed: u64, src: u32, dst: u32, sport: u16, dport: u16) -> u64 {
    let t = u64::from(src) << 32 | u64::from(dst);
    let p = u64::from(sport) << 16 | u64::from(dport);
    mix(mix(switch_seed ^ t) ^ p.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}
