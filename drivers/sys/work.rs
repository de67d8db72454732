// SPDX-License-Identifier: GPL-2.0

//! The module's own workqueue (the data path runs on it), the clock and randomness.
//!
//! An owned queue, rather than a system one, so module unload can drain it: once the devices
//! are gone, `destroy_workqueue` waits for every work item still queued.

use super::bindings;
use core::sync::atomic::{AtomicPtr, Ordering};
use kernel::{prelude::*, workqueue::Queue};

static QUEUE: AtomicPtr<bindings::workqueue_struct> = AtomicPtr::new(core::ptr::null_mut());

pub(super) fn create() -> Result {
    // SAFETY: plain allocation; the result is null or a queue we own until `destroy`.
    let wq = unsafe { bindings::metaroce_glue_alloc_wq() };
    if wq.is_null() {
        return Err(ENOMEM);
    }
    QUEUE.store(wq, Ordering::Release);
    Ok(())
}

pub(super) fn destroy() {
    let wq = QUEUE.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !wq.is_null() {
        // SAFETY: created in `create`; draining runs every queued item to completion first.
        unsafe { bindings::destroy_workqueue(wq) };
    }
}

/// The data-path workqueue.
pub(crate) fn queue() -> &'static Queue {
    let wq = QUEUE.load(Ordering::Acquire);
    // SAFETY: set at module init before any device exists and destroyed only after all
    // devices are gone, so every caller (a device's data path) sees a live queue.
    unsafe { Queue::from_raw(wq.cast()) }
}

/// Monotonic time in nanoseconds.
pub(crate) fn now_ns() -> u64 {
    // SAFETY: reads the clock.
    unsafe { bindings::metaroce_glue_ktime_get_ns() }
}

/// 64 random bits (seeds the transport's path entropy).
pub(crate) fn random_u64() -> u64 {
    // SAFETY: reads the kernel's RNG.
    unsafe { bindings::get_random_u64() }
}
