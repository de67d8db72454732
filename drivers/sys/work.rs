// SPDX-License-Identifier: GPL-2.0

//! The data path's receive threads ([`CpuThreads`]) and its timer (their alarm, a soft
//! high-resolution timer whose callback runs in softirq), the clock and randomness.

use super::bindings;
use core::{
    ffi::{c_int, c_void},
    ptr::NonNull,
    sync::atomic::{AtomicU8, Ordering},
};
use kernel::{
    new_spinlock_irq,
    prelude::*,
    sync::{Arc, SpinLockIrq},
    types::Opaque,
};

/// Whether the caller may take the data path's locks (they disable bottom halves): not in a
/// hard interrupt and not with interrupts off, where a kernel consumer may post.
pub(crate) fn may_take_bh_locks() -> bool {
    // SAFETY: reads the CPU's context.
    unsafe { bindings::metaroce_glue_may_take_bh_locks() }
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
    /// The alarm set with [`CpuThreads::arm`] went off: called from the timer's callback, in
    /// softirq (it must not sleep).
    fn alarm(_this: &Arc<Self>) {}
}

/// `KthreadShared::pending` bit: run.
const KICKED: u8 = 1;

struct KthreadShared<T> {
    pending: AtomicU8,
    work: Arc<T>,
}

/// A kernel thread bound to one CPU, at low real-time priority (`sched_set_fifo_low`), that
/// runs [`KthreadWork::run`] whenever [`Kthread::kick`] is called, the way a NIC's interrupt
/// thread serves its rings.
///
/// Why not a work item: the kernel preempts lazily, so a woken kworker waits for the next
/// tick (1 ms) while an application busy-polls its CQ on that CPU; a FIFO thread preempts it
/// at once. Why bound: the data path hands bulk receive runs to the thread of another CPU
/// than the one sending them ([`CpuThreads::kick`]), so the two proceed in parallel; small
/// datagrams are received in softirq and need no thread.
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
                pending: AtomicU8::new(0),
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
        self.post(KICKED);
    }

    /// Sets `bits` in the thread's pending work and wakes it if it had none (with some, it
    /// was woken already and takes them before it sleeps again). Any context.
    fn post(&self, bits: u8) {
        if self.shared.pending.fetch_or(bits, Ordering::AcqRel) == 0 {
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
        let pending = shared.pending.swap(0, Ordering::AcqRel);
        if pending == 0 {
            // SAFETY: sleeps until woken (by `kick` or `kthread_stop`).
            unsafe { bindings::schedule() };
            continue;
        }
        // SAFETY: as above.
        unsafe { bindings::metaroce_glue_set_current_running() };
        if pending & KICKED != 0 {
            T::run(&shared.work);
        }
    }
    drop(shared);
    0
}

/// One [`Kthread`] per possible CPU serving the same work; [`CpuThreads::kick`] wakes the one
/// of the calling CPU. CPU numbers may be sparse (`cpu_possible_mask` need not be 0..n) and
/// CPUs may go offline: a kick only wakes the thread of an online CPU.
pub(crate) struct CpuThreads<T: KthreadWork> {
    /// Declared first: dropped (the timer cancelled) before the threads it points to.
    alarm: Pin<KBox<Alarm<T>>>,
    /// By CPU number, up to `nr_cpu_ids`; None for a CPU that is not possible.
    threads: KVec<Option<Kthread<T>>>,
}

/// Slack allowed when arming the alarm: lets the kernel fire it together with a nearby timer.
const ALARM_SLACK_NS: u64 = 20_000;
/// The soonest the alarm goes off after it is armed.
const ALARM_MIN_DELAY_NS: u64 = 10_000;

/// A one-shot high-resolution timer (`CLOCK_MONOTONIC`, soft: its callback runs in softirq)
/// that runs [`KthreadWork::alarm`] there, on the CPU it fires on: no thread to wake, so the
/// transport's timers are as late as the timer is, not as the scheduler makes a thread.
/// Workqueue timers only have jiffy resolution; the transport's ACK delay, pacing and
/// retransmission timers want microseconds.
#[repr(C)]
#[pin_data(PinnedDrop)]
struct Alarm<T: KthreadWork> {
    /// The first field: the callback gets from the timer to the `Alarm` by a cast.
    #[pin]
    timer: Opaque<bindings::hrtimer>,
    /// When the timer is set to go off (ns, `CLOCK_MONOTONIC`); in the past once it has.
    #[pin]
    at: SpinLockIrq<u64>,
    /// The `CpuThreads`' first thread, in the buffer of a `KVec` that is not changed while
    /// the alarm lives (`CpuThreads` drops the alarm first).
    first: *const Kthread<T>,
}

// SAFETY: the raw pointer is only read, as a shared slice of `Kthread`s, which are `Sync`;
// the timer is only used through kernel calls that lock it.
unsafe impl<T: KthreadWork> Send for Alarm<T> {}
// SAFETY: as above.
unsafe impl<T: KthreadWork> Sync for Alarm<T> {}

#[pinned_drop]
impl<T: KthreadWork> PinnedDrop for Alarm<T> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: the timer was set up in `CpuThreads::new`; `hrtimer_cancel` waits for a
        // callback in progress, after which nothing refers to the alarm.
        unsafe { bindings::hrtimer_cancel(self.timer.get()) };
    }
}

/// The alarm's timer callback (softirq).
///
/// # Safety
///
/// `timer` must be the `timer` field of a live `Alarm<T>`.
unsafe extern "C" fn alarm_fn<T: KthreadWork>(
    timer: *mut bindings::hrtimer,
) -> bindings::hrtimer_restart {
    // SAFETY: `timer` is the first field of a `repr(C)` `Alarm<T>` (`Opaque` is transparent),
    // alive until its drop has cancelled the timer and waited for this callback.
    let alarm = unsafe { &*timer.cast::<Alarm<T>>() };
    // SAFETY: `first` points to a live thread of the `CpuThreads` (which has at least one).
    let first = unsafe { &*alarm.first };
    // Every thread serves the same work.
    T::alarm(&first.shared.work);
    bindings::hrtimer_restart::HRTIMER_NORESTART
}

impl<T: KthreadWork> CpuThreads<T> {
    /// Starts the threads (named `name` with `%u` replaced by the CPU number).
    pub(crate) fn new(name: &CStr, work: Arc<T>) -> Result<Self> {
        // SAFETY: reads a variable set at boot.
        let n = unsafe { bindings::metaroce_glue_nr_cpu_ids() }.max(1);
        let mut threads = KVec::with_capacity(n as usize, GFP_KERNEL)?;
        for cpu in 0..n {
            // SAFETY: reads the possible mask (fixed at boot) for a CPU number below nr_cpu_ids.
            let possible = unsafe { bindings::metaroce_glue_cpu_possible(cpu) };
            let t = if possible {
                Some(Kthread::new(name, cpu, work.clone())?)
            } else {
                None
            };
            threads.push(t, GFP_KERNEL)?;
        }
        // CPU 0 is always possible; the buffer does not move from here on.
        let first: *const Kthread<T> = threads.iter().flatten().next().ok_or(EINVAL)?;
        let alarm = KBox::pin_init(
            pin_init!(Alarm::<T> {
                // SAFETY: `slot` is the timer's memory, pinned; `alarm_fn::<T>` is called with
                // it only, and it is the first field of this `Alarm<T>`.
                timer <- Opaque::ffi_init(|slot: *mut bindings::hrtimer| unsafe {
                    bindings::hrtimer_setup(
                        slot,
                        Some(alarm_fn::<T>),
                        bindings::CLOCK_MONOTONIC as bindings::clockid_t,
                        bindings::hrtimer_mode_HRTIMER_MODE_ABS_SOFT,
                    )
                }),
                at <- new_spinlock_irq!(0, "metaroce_alarm"),
                first,
            }),
            GFP_KERNEL,
        )?;
        Ok(CpuThreads { alarm, threads })
    }

    /// Makes sure [`KthreadWork::alarm`] runs at `deadline` (ns, `CLOCK_MONOTONIC`) or a
    /// little later (up to `ALARM_SLACK_NS`, and `ALARM_MIN_DELAY_NS` after `now` at the
    /// soonest); an alarm already set sooner stays. `now` is the current time. Any context.
    pub(crate) fn arm(&self, deadline: u64, now: u64) {
        // Never at once: a deadline that stays in the past must not become a busy loop.
        let deadline = deadline.max(now.saturating_add(ALARM_MIN_DELAY_NS));
        let mut at = self.alarm.at.lock();
        if *at > now && *at <= deadline {
            return;
        }
        *at = deadline;
        // SAFETY: the timer was set up in `new` and lives as long as `self`; the expiry is a
        // `CLOCK_MONOTONIC` time in ns, which fits an i64 for centuries of uptime.
        unsafe {
            bindings::hrtimer_start_range_ns(
                self.alarm.timer.get(),
                deadline.min(i64::MAX as u64) as i64,
                ALARM_SLACK_NS,
                bindings::hrtimer_mode_HRTIMER_MODE_ABS_SOFT,
            )
        };
    }

    /// Each thread's pending work bits (`KICKED` 1), for diagnostics.
    pub(crate) fn pending(&self, mut f: impl FnMut(usize, u8)) {
        for (i, t) in self.threads.iter().enumerate() {
            if let Some(t) = t {
                f(i, t.shared.pending.load(Ordering::Relaxed));
            }
        }
    }

    /// Wakes the calling CPU's thread, or with `spread` the next online CPU's (wrapping).
    /// Any context.
    ///
    /// A thread of an offline CPU is never picked: it cannot run until its CPU is back, and
    /// what it was woken for would wait as long. The calling CPU is online (a stale number
    /// read after a migration only picks another thread, which is checked alike).
    pub(crate) fn kick(&self, spread: bool) {
        // SAFETY: reads the CPU number.
        let here = unsafe { bindings::metaroce_glue_smp_processor_id() } as usize;
        let n = self.threads.len().max(1);
        let online = |cpu: usize| {
            // SAFETY: reads the online mask; `cpu < nr_cpu_ids`.
            self.threads.get(cpu).is_some_and(Option::is_some)
                && unsafe { bindings::metaroce_glue_cpu_online(cpu as u32) }
        };
        let start = here + usize::from(spread);
        let pick = (0..n)
            .map(|k| (start + k) % n)
            .find(|&cpu| online(cpu))
            .unwrap_or(here % n);
        if let Some(Some(t)) = self.threads.get(pick) {
            t.kick();
        }
    }
}
