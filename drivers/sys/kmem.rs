// SPDX-License-Identifier: GPL-2.0

//! Kernel memory named by kernel consumers: the buffers of a kernel QP's work requests (SGEs
//! under the device's `local_dma_lkey`) and the pages a fast registration maps.
//!
//! The device does virtual DMA (it registers with no DMA device, as rxe and siw do): the
//! "DMA addresses" a kernel consumer hands it (`ib_dma_map_sg`, `sg_dma_address`) are kernel
//! virtual addresses. The verbs contract makes the consumer keep a posted buffer valid until
//! its work request completes, and a registered page until the registration is invalidated.
//!
//! [`KernelMemory`] is the capability to touch such memory. Only this layer makes one, and
//! only for an object a kernel consumer created (a QP or a fast registration MR: the core's
//! call had no `udata`); the driver uses it only with addresses taken from that object's own
//! work requests and registrations, which userspace never sees or writes (the QP's rings are
//! not mapped). So userspace can never make the device touch kernel memory of its choosing.

use core::{
    ptr,
    sync::atomic::{AtomicU64, Ordering},
};

/// Kernel addresses have the top bit set (x86-64, arm64); anything below is refused.
const KERNEL_HALF: u64 = 1 << 63;

/// The capability to copy to and from kernel consumers' memory (see the module's
/// documentation).
#[derive(Clone, Copy)]
pub(crate) struct KernelMemory(());

/// An address outside the kernel's half, or a misaligned atomic.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BadAddress;

impl KernelMemory {
    /// For an object a kernel consumer created (no `udata`).
    pub(super) fn new() -> Self {
        KernelMemory(())
    }

    fn check(addr: u64, len: usize) -> Result<*mut u8, BadAddress> {
        let end = addr.checked_add(len as u64).ok_or(BadAddress)?;
        if addr < KERNEL_HALF || end < KERNEL_HALF {
            return Err(BadAddress);
        }
        Ok(addr as usize as *mut u8)
    }

    /// Copies `out.len()` bytes from `addr`.
    pub(crate) fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), BadAddress> {
        if out.is_empty() {
            return Ok(());
        }
        let p = Self::check(addr, out.len())?;
        // SAFETY: `addr` names a kernel consumer's buffer of at least `out.len()` bytes that it
        // keeps valid while its request is outstanding (the module's documentation: only such
        // addresses reach us); `out` is ours and cannot overlap it.
        unsafe { ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to `addr`.
    pub(crate) fn write(&self, addr: u64, data: &[u8]) -> Result<(), BadAddress> {
        if data.is_empty() {
            return Ok(());
        }
        let p = Self::check(addr, data.len())?;
        // SAFETY: as in `read`; the consumer gave the buffer for the device to write (a
        // receive, a READ's target, a registration with write rights).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// Replaces the 8-byte word at `addr` (8-byte aligned) by `op` of it, atomically;
    /// returns the old value.
    pub(crate) fn atomic(&self, addr: u64, op: impl Fn(u64) -> u64) -> Result<u64, BadAddress> {
        if addr % 8 != 0 {
            return Err(BadAddress);
        }
        let p = Self::check(addr, 8)?;
        // SAFETY: as in `read`, an aligned word of it; atomics through this device are atomic
        // with each other and with the consumer's own atomics on the word.
        let word = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        let mut cur = word.load(Ordering::SeqCst);
        loop {
            match word.compare_exchange(cur, op(cur), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(old) => return Ok(old),
                Err(now) => cur = now,
            }
        }
    }
}
