// SPDX-License-Identifier: GPL-2.0

//! The module's own workqueue (the data path's timers run on it), its receive threads, the
//! clock and randomness.
//!
//! An owned queue, rather than a system one, so module unload can drain it: once the devices
//! are gone, `destroy_workqueue` waits for every work item still queued.

use super::bindings;
use core::{
    ffi::{c_int, c_void},
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicPtr, Ordering},
};
use kernel::{prelude::*, sync::Arc, workqueue::Queue};

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

/// What a [`Kthread`] runs each time it is kicked.
pub(crate) trait KthreadWork: Send + Sync + 'static {
    /// Does the pending work (the thread may be kicked again meanwhile: it runs again).
    fn run(this: &Arc<Self>);
}

struct KthreadShared<T> {
    pending: AtomicBool,
    work: Arc<T>,
}

/// A kernel thread bound to one CPU, at low real-time priority (`sched_set_fifo_low`), that
/// runs [`KthreadWork::run`] whenever [`Kthread::kick`] is called, the way a NIC's interrupt
/// thread serves its rings.
///
/// Why not a work item: the kernel preempts lazily, so a woken kworker waits for the next
/// tick (1 ms) while an application busy-polls its CQ on that CPU; a FIFO thread preempts it
/// at once. Why bound: waking a thread on another CPU costs an IPI, which under emulation
/// (QEMU TCG) took as long as a tick; [`CpuThreads`] wakes the one of the kicking CPU.
pub(crate) struct Kthread<T: KthreadWork> {
    task: NonNull<bindings::task_struct>,
    shared: Arc<KthreadShared<T>>,
}

// SAFETY: the task pointer is only used for `wake_up_process` and `kthread_stop`, which may be
// called from any context and CPU; the shared state is `Sync`.
unsafe impl<T: KthreadWork> Send for Kthread<T> {}
// SAFETY: as above.
unsafe impl<T: KthreadWork> Sync for Kthread<T> {}

impl<T: KthreadWork> Kthread<T> {
    /// Starts a thread on `cpu` serving `work`, named `name` with `%u` replaced by `cpu`.
    pub(crate) fn new(name: &CStr, cpu: u32, work: Arc<T>) -> Result<Self> {
        let shared = Arc::new(
            KthreadShared {
                pending: AtomicBool::new(false),
                work,
            },
            GFP_KERNEL,
        )?;
        let data = Arc::into_raw(shared.clone()).cast_mut().cast::<c_void>();
        // SAFETY: `thread_fn::<T>` matches the thread function signature and takes ownership
        // of `data`, one reference to the shared state; the name is formatted into the task.
        let task = unsafe {
            bindings::kthread_create_on_cpu(Some(thread_fn::<T>), data, cpu, name.as_char_ptr())
        };
        if task.is_null() || kernel::error::from_err_ptr(task).is_err() {
            // SAFETY: the thread was not created, so the reference given to it comes back.
            drop(unsafe { Arc::from_raw(data.cast::<KthreadShared<T>>()) });
            return Err(ENOMEM);
        }
        // SAFETY: `task` is the thread just created, not yet running.
        unsafe { bindings::sched_set_fifo_low(task) };
        // SAFETY: start it: it runs `thread_fn`, which returns only when stopped, so the
        // reference it holds is always given back.
        unsafe { bindings::wake_up_process(task) };
        Ok(Kthread {
            // `task` was checked non-null above.
            task: NonNull::new(task).ok_or(ENOMEM)?,
            shared,
        })
    }

    /// Asks the thread to run (again). Any context.
    pub(crate) fn kick(&self) {
        if !self.shared.pending.swap(true, Ordering::AcqRel) {
            // SAFETY: the task lives until `drop` stops it, and `drop` needs `&mut self`.
            unsafe { bindings::wake_up_process(self.task.as_ptr()) };
        }
    }
}

impl<T: KthreadWork> Drop for Kthread<T> {
    fn drop(&mut self) {
        // SAFETY: the thread runs `thread_fn` until `kthread_stop`, which waits for it to
        // return; it is never stopped twice (this is the only stop, and it takes `self`).
        unsafe { bindings::kthread_stop(self.task.as_ptr()) };
    }
}

/// The thread's body.
///
/// # Safety
///
/// `data` must be a reference to a `KthreadShared<T>` from `Arc::into_raw`, given to this call.
unsafe extern "C" fn thread_fn<T: KthreadWork>(data: *mut c_void) -> c_int {
    // SAFETY: `data` is the reference `Kthread::new` gave this thread.
    let shared = unsafe { Arc::from_raw(data.cast::<KthreadShared<T>>()) };
    loop {
        // Announce the sleep before looking at `pending`, so a kick in between wakes us.
        // SAFETY: sets the current task's state; no lock held.
        unsafe { bindings::metaroce_glue_set_current_interruptible() };
        // SAFETY: called by a kthread.
        if unsafe { bindings::kthread_should_stop() } {
            // SAFETY: as above.
            unsafe { bindings::metaroce_glue_set_current_running() };
            break;
        }
        if !shared.pending.swap(false, Ordering::AcqRel) {
            // SAFETY: sleeps until woken (by `kick` or `kthread_stop`).
            unsafe { bindings::schedule() };
            continue;
        }
        // SAFETY: as above.
        unsafe { bindings::metaroce_glue_set_current_running() };
        T::run(&shared.work);
    }
    drop(shared);
    0
}

/// One [`Kthread`] per possible CPU serving the same work; [`CpuThreads::kick`] wakes the one
/// of the calling CPU.
pub(crate) struct CpuThreads<T: KthreadWork> {
    threads: KVec<Kthread<T>>,
}

impl<T: KthreadWork> CpuThreads<T> {
    /// Starts the threads (named `name` with `%u` replaced by the CPU number).
    pub(crate) fn new(name: &CStr, work: Arc<T>) -> Result<Self> {
        // SAFETY: reads the CPU count.
        let n = unsafe { bindings::metaroce_glue_num_possible_cpus() }.max(1);
        let mut threads = KVec::with_capacity(n as usize, GFP_KERNEL)?;
        for cpu in 0..n {
            threads.push(Kthread::new(name, cpu, work.clone())?, GFP_KERNEL)?;
        }
        Ok(CpuThreads { threads })
    }

    /// Wakes the calling CPU's thread (another's if CPU numbers are sparse). Any context.
    pub(crate) fn kick(&self) {
        // SAFETY: reads the CPU number; a stale value only picks another thread.
        let cpu = unsafe { bindings::metaroce_glue_smp_processor_id() } as usize;
        if let Some(t) = self.threads.get(cpu % self.threads.len().max(1)) {
            t.kick();
        }
    }
}
