// SPDX-License-Identifier: GPL-2.0

//! The hardware counters as the RDMA core sees them (`rdma statistic show link DEV/1`,
//! `/sys/class/infiniband/DEV/ports/1/hw_counters/`): the `alloc_hw_port_stats` and
//! `get_hw_stats` ops over [`crate::counters`].

use super::{bindings, ibdev};
use crate::counters::{COUNTER_NAMES, NUM_COUNTERS};
use core::ptr;
use kernel::{
    ffi::{c_int, c_ulong},
    str::as_char_ptr_in_const_context,
};

/// The counter descriptions the core keeps a pointer to: static, never written.
struct Descs([bindings::rdma_stat_desc; NUM_COUNTERS]);

// SAFETY: the table is immutable and its pointers refer to static, immutable strings.
unsafe impl Sync for Descs {}

static DESCS: Descs = Descs(descs());

const fn descs() -> [bindings::rdma_stat_desc; NUM_COUNTERS] {
    let mut descs = [bindings::rdma_stat_desc {
        name: ptr::null(),
        flags: 0,
        priv_: ptr::null(),
    }; NUM_COUNTERS];
    let mut i = 0;
    while i < NUM_COUNTERS {
        descs[i].name = as_char_ptr_in_const_context(COUNTER_NAMES[i]);
        i += 1;
    }
    descs
}

/// `alloc_hw_port_stats`: one set of our counters for the port.
///
/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
pub(super) unsafe extern "C" fn alloc_hw_port_stats(
    _ibdev: *mut bindings::ib_device,
    _port: u32,
) -> *mut bindings::rdma_hw_stats {
    // SAFETY: `DESCS` is static with `NUM_COUNTERS` entries; the core frees the result.
    unsafe {
        bindings::rdma_alloc_hw_stats_struct(
            DESCS.0.as_ptr(),
            NUM_COUNTERS as c_int,
            bindings::RDMA_HW_STATS_DEFAULT_LIFESPAN as c_ulong,
        )
    }
}

/// `get_hw_stats`: copies all counters; returns how many.
///
/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
pub(super) unsafe extern "C" fn get_hw_stats(
    ibdev: *mut bindings::ib_device,
    stats: *mut bindings::rdma_hw_stats,
    port: u32,
    _index: c_int,
) -> c_int {
    // SAFETY: the core passes its live device and the stats struct `alloc_hw_port_stats`
    // returned for it, locked for us to fill.
    let (dev, stats) = unsafe { (ibdev::state(ibdev), &mut *stats) };
    let n = usize::try_from(stats.num_counters)
        .unwrap_or(0)
        .min(NUM_COUNTERS);
    // SAFETY: the struct was allocated with `num_counters` values, and `n` is at most that.
    let values = unsafe { stats.value.as_mut_slice(n) };
    // Port 1 reports the device (all planes, and the transport's counters); port k + 1 what
    // plane k's socket counted.
    match dev.port_counters(port) {
        Some(c) => c.snapshot(values),
        None => values.fill(0),
    }
    n as c_int
}
