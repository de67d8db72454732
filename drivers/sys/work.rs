// SPDX-License-Identifier: GPL-2.0

//! The data path's receive threads ([`CpuThreads`]) and its timer (their alarm, a soft
//! high-resolution timer whose callback runs in softirq), the clock and randomness.

use super::bindings;
use core::{
    ffi::{c_int, c_void},
    ptr::NonNull,
    sync::atomic::{AtomicPtr, AtomicU8, Ordering},
};
use kernel::{
    new_spinlock_irq,
    prelude::*,
    sync::{Arc, SpinLockIrq},
    types::Opaque,
};


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

    /// Sets `bits` in the thread's pending work and wakes it if it had none (at the end of
    /// the [`TxSection`] we are in, if any). Any context.
    fn post(&self, bits: u8) {
        if self.shared.pending.fetch_or(bits, Ordering::AcqRel) != 0 {
            // Already kicked: woken, or held back by a section, perhaps one preempted here.
            rescue_preempted();
        } else if !defer_wake(self.task) {
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
        rescue_preempted();
        if pending & KICKED != 0 {
            T::run(&shared.work);
        }
    }
    drop(shared);
    0
}

/// One [`Kthread`] per possible CPU serving the same work; [`CpuThreads::kick`] wakes the one
/// of the calling CPU.
pub(crate) struct CpuThreads<T: KthreadWork> {
    /// Declared first: dropped (the timer cancelled) before the threads it points to.
    alarm: Pin<KBox<Alarm<T>>>,
    threads: KVec<Kthread<T>>,
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
    /// The `CpuThreads`' threads: the buffer of a `KVec` that is not changed while the
    /// alarm lives (`CpuThreads` drops the alarm first).
    threads: *const Kthread<T>,
    count: usize,
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
    // SAFETY: `threads` and `count` describe the live slice of the `CpuThreads`' threads.
    let threads = unsafe { core::slice::from_raw_parts(alarm.threads, alarm.count) };
    rescue_preempted();
    // Every thread serves the same work.
    if let Some(t) = threads.first() {
        T::alarm(&t.shared.work);
    }
    bindings::hrtimer_restart::HRTIMER_NORESTART
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
        let (first, count) = (threads.as_ptr(), threads.len());
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
                threads: first,
                count,
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
            f(i, t.shared.pending.load(Ordering::Relaxed));
        }
    }

    /// Wakes the calling CPU's thread, or with `spread` the next CPU's (wrapping; another's
    /// if CPU numbers are sparse). Any context.
    pub(crate) fn kick(&self, spread: bool) {
        // SAFETY: reads the CPU number; a stale value only picks another thread.
        let cpu = unsafe { bindings::metaroce_glue_smp_processor_id() } as usize;
        let cpu = cpu + usize::from(spread);
        if let Some(t) = self.threads.get(cpu % self.threads.len().max(1)) {
            t.kick();
        }
    }
}

/// CPUs whose transmit sections are tracked (beyond them, wakeups are not deferred).
const TX_CPUS: usize = 64;
/// Wakeups one section can hold back (more are done at once).
const TX_DEFERRED: usize = 8;
/// One CPU's transmit section: the task in it and the threads to wake when it ends.
struct TxSlot {
    owner: AtomicPtr<bindings::task_struct>,
    /// Tasks with a reference taken (`get_task_struct`); null: free. Filled in the owner's
    /// context on this CPU (its own code and the softirqs and interrupts that run on top of
    /// it), each entry claimed from null with one compare-exchange and emptied with one swap,
    /// so an interrupt that comes while the owner wakes them (`flush_section`) can neither
    /// overwrite a task not yet woken nor be skipped. (Claiming by a counter, reset before
    /// the entries were read, let an interrupt overwrite one: that thread's wakeup was lost
    /// with its `pending` bit set, so no kick woke it again, and its device stopped receiving
    /// for good: the incast victim's receiver, its queue full, in CI.)
    wake: [AtomicPtr<bindings::task_struct>; TX_DEFERRED],
}

static TX_SLOTS: [TxSlot; TX_CPUS] = [const {
    TxSlot {
        owner: AtomicPtr::new(core::ptr::null_mut()),
        wake: [const { AtomicPtr::new(core::ptr::null_mut()) }; TX_DEFERRED],
    }
}; TX_CPUS];

/// A stretch of code that sends datagrams and may receive them too: over a veth or loopback
/// the receiver's softirq runs inside our send, on this CPU. Receive threads kicked meanwhile
/// are woken when the section ends, not at once, so a burst is received as one batch: a FIFO
/// thread woken on this CPU would otherwise preempt the sender after every datagram (one
/// context switch and one ACK per packet). Like NAPI's deferral of a softirq to its end.
pub(crate) struct TxSection {
    slot: &'static TxSlot,
}

impl TxSection {
    /// Starts a section on this CPU for the current task; None when one is already open here
    /// (this task's own: the outer one does the wakeups; or another task's, preempted: then
    /// this one's wakeups are not deferred). Process context.
    pub(crate) fn enter() -> Option<TxSection> {
        // SAFETY: reads the CPU number; if we migrate later, `defer_wake` on the new CPU does
        // not see us as the owner, and the wakeups are simply not deferred.
        let cpu = unsafe { bindings::metaroce_glue_smp_processor_id() } as usize;
        let slot = TX_SLOTS.get(cpu)?;
        // SAFETY: reads `current`.
        let me = unsafe { bindings::metaroce_glue_current() };
        match slot.owner.compare_exchange(
            core::ptr::null_mut(),
            me,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Some(TxSection { slot }),
            Err(owner) => {
                if owner != me {
                    // Another task's, preempted in it: what it holds back is woken now.
                    slot.wake_deferred();
                }
                None
            }
        }
    }
}

impl Drop for TxSection {
    fn drop(&mut self) {
        // No more deferrals (they happen only in the owner's context on the slot's CPU; if we
        // migrated, none happen at all), then the deferred wakeups.
        self.slot.owner.store(core::ptr::null_mut(), Ordering::Release);
        self.slot.wake_deferred();
    }
}

/// Wakes what this CPU's transmit section holds back if its owner is not the current task (in
/// interrupt context: the task interrupted): the owner was preempted inside it, and the
/// threads it deferred must not wait for it to be scheduled again (with a dozen busy-polling
/// processes per CPU that was many milliseconds, during which a receiver's thread slept
/// with its queue filling). Called where this CPU runs our code in another context: a
/// receive thread starting its work, a kick from a softirq, the alarm. Any context.
pub(crate) fn rescue_preempted() {
    if let Some((slot, Owner::Other)) = cpu_slot() {
        slot.wake_deferred();
    }
}

/// Who holds a CPU's transmit section, as the current task sees it.
#[derive(PartialEq)]
enum Owner {
    Nobody,
    /// The current task (in interrupt context: the task interrupted).
    Me,
    /// Another task: preempted in its section.
    Other,
}

/// This CPU's transmit section and who holds it. Any context.
fn cpu_slot() -> Option<(&'static TxSlot, Owner)> {
    // SAFETY: reads the CPU number and `current`; in interrupt context `current` is the task
    // interrupted, which is what makes a softirq inside a section see it.
    let (cpu, me) = unsafe {
        (
            bindings::metaroce_glue_smp_processor_id() as usize,
            bindings::metaroce_glue_current(),
        )
    };
    let slot = TX_SLOTS.get(cpu)?;
    let owner = slot.owner.load(Ordering::Acquire);
    let who = if owner.is_null() {
        Owner::Nobody
    } else if owner == me {
        Owner::Me
    } else {
        Owner::Other
    };
    Some((slot, who))
}

impl TxSlot {
    /// Wakes the tasks deferred so far. Any context: each entry is emptied by one swap, so
    /// the owner and a rescuer ([`rescue_preempted`]) never wake the same one twice.
    fn wake_deferred(&self) {
        for w in &self.wake {
            let task = w.swap(core::ptr::null_mut(), Ordering::AcqRel);
            if !task.is_null() {
                // SAFETY: `defer_wake` took a reference to the task, released here after the
                // wakeup.
                unsafe {
                    bindings::wake_up_process(task);
                    bindings::metaroce_glue_put_task_struct(task);
                }
            }
        }
    }
}

/// Holds back the wakeup of `task` until the end of the transmit section the current task is
/// in on this CPU; false (wake it now) when there is none or it is full. Any context.
fn defer_wake(task: NonNull<bindings::task_struct>) -> bool {
    let slot = match cpu_slot() {
        Some((slot, Owner::Me)) => slot,
        Some((slot, Owner::Other)) => {
            // Preempted in its section: its held-back wakeups go now, with ours.
            slot.wake_deferred();
            return false;
        }
        _ => return false,
    };
    // SAFETY: the task is alive (its `Kthread` is, and we are in its `post`); the reference
    // keeps it so until the section's end wakes it.
    unsafe { bindings::metaroce_glue_get_task_struct(task.as_ptr()) };
    for w in &slot.wake {
        if w
            .compare_exchange(
                core::ptr::null_mut(),
                task.as_ptr(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            return true;
        }
    }
    // Full: woken now by the caller; the reference is not needed.
    // SAFETY: we took it above.
    unsafe { bindings::metaroce_glue_put_task_struct(task.as_ptr()) };
    false
}
