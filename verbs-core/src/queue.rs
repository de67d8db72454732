// SPDX-License-Identifier: GPL-2.0

//! Ring index arithmetic. Indices are free-running `u32` counters (slot = index mod the
//! power-of-two ring size). The side the kernel owns (the consumer of an SQ, RQ or SRQ, the
//! producer of a CQ) keeps its index in kernel memory; the other side's index is read from
//! user-writable memory and judged here before anything is read.

/// A producer index that claims more than the ring holds (or lies behind the consumer,
/// which wraps to the same thing): the ring is broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overflow;

/// Entries a consumer at `consumer` (the kernel's own index) may take when userspace's
/// producer index reads `producer`, in a ring of `num_entries`.
pub fn available(consumer: u32, producer: u32, num_entries: u32) -> Result<u32, Overflow> {
    let n = producer.wrapping_sub(consumer);
    if n > num_entries {
        Err(Overflow)
    } else {
        Ok(n)
    }
}

/// Whether a producer at `producer` (the kernel's own index) may write one more entry when
/// userspace's consumer index reads `consumer`. A consumer index ahead of the producer (a
/// lie) reads as a full ring: the kernel writes nothing userspace has not consumed.
pub fn has_room(producer: u32, consumer: u32, num_entries: u32) -> bool {
    producer.wrapping_sub(consumer) < num_entries
}

/// The slot of `index` in a ring of `num_entries` (a power of two).
pub fn slot(index: u32, num_entries: u32) -> usize {
    (index & num_entries.wrapping_sub(1)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bounds() {
        assert_eq!(available(0, 0, 8), Ok(0));
        assert_eq!(available(0, 8, 8), Ok(8));
        assert_eq!(available(0, 9, 8), Err(Overflow));
        assert_eq!(available(5, 4, 8), Err(Overflow), "behind the consumer");
        assert_eq!(available(u32::MAX, 3, 8), Ok(4), "across the wrap");
        assert!(has_room(7, 0, 8));
        assert!(!has_room(8, 0, 8));
        assert!(!has_room(0, 1, 8), "a consumer ahead of the producer");
        assert_eq!(slot(13, 8), 5);
    }

    proptest! {
        #[test]
        fn available_never_exceeds_the_ring(c: u32, p: u32, shift in 0u32..16) {
            let n = 1u32 << shift;
            if let Ok(k) = available(c, p, n) {
                prop_assert!(k <= n);
                prop_assert_eq!(c.wrapping_add(k), p);
            }
            prop_assert!(slot(p, n) < n as usize);
        }
    }
}
