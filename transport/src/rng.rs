// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A small seeded PRNG (xorshift64*) for path entropy. Not cryptographic: the caller seeds it
//! (the kernel from `get_random_u64`), tests with fixed seeds.

use super::zero::{zero_valid, ZeroValid};

#[derive(Clone, Debug)]
pub struct XorShift {
    state: u64,
}
zero_valid!(struct XorShift { state });

impl XorShift {
    pub fn new(seed: u64) -> Self {
        // Zero is a fixed point of xorshift; replace it.
        XorShift {
            state: if seed == 0 {
                0x9e37_79b9_7f4a_7c15
            } else {
                seed
            },
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A UDP source port in the dynamic range 49152..=65535, different from `avoid`.
    pub fn source_port(&mut self, avoid: u16) -> u16 {
        loop {
            let p = 49152u16 | (self.next_u64() >> 50) as u16;
            if p != avoid {
                return p;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_in_range_and_deterministic() {
        let mut a = XorShift::new(7);
        let mut b = XorShift::new(7);
        for _ in 0..1000 {
            let p = a.source_port(0);
            assert!(p >= 49152);
            assert_eq!(p, b.source_port(0));
        }
        let mut z = XorShift::new(0);
        assert_ne!(z.next_u64(), 0);
    }
}
