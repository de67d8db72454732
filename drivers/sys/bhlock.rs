// SPDX-License-Identifier: GPL-2.0

//! Spinlocks that disable bottom halves while held (`spin_lock_bh`): the data path's locks,
//! which process context (the doorbell syscall, verbs, the receive threads) and softirq (the
//! UDP receive callback, the soft alarm) both take.
//!
//! A holder in process context keeps softirqs off its CPU, so a softirq never spins on a lock
//! its own CPU holds; a holder never sleeps and never allocates with `GFP_KERNEL`. The kernel
//! crate has `SpinLock` (no bottom-half protection: a softirq on the holder's CPU would spin
//! for ever) and `SpinLockIrq` (interrupts off: more than the data path needs); this is the
//! missing one, as a `kernel::sync::lock::Backend`, so that it has the same `Lock`/`Guard`
//! types and lockdep classes as theirs.

use super::bindings;
use kernel::sync::lock::{Backend, Guard, Lock};

/// A spinlock taken with bottom halves disabled.
pub(crate) type SpinLockBh<T> = Lock<T, SpinLockBhBackend>;
/// What [`SpinLockBh::lock`] returns; unlocks (and enables bottom halves) when dropped.
pub(crate) type SpinLockBhGuard<'a, T> = Guard<'a, T, SpinLockBhBackend>;

/// Creates a [`SpinLockBh`] initialiser with the given name and a new lock class.
macro_rules! new_spinlock_bh {
    ($inner:expr $(, $name:literal)? $(,)?) => {
        $crate::sys::bhlock::SpinLockBh::new(
            $inner,
            ::kernel::optional_name!($($name)?),
            ::kernel::static_lock_class!(),
        )
    };
}
pub(crate) use new_spinlock_bh;

/// The `spinlock_t` operations with bottom halves disabled.
pub(crate) struct SpinLockBhBackend;

/// Our bindings' view of the kernel crate's `spinlock_t` (the same C type).
fn ours(ptr: *mut kernel::bindings::spinlock_t) -> *mut bindings::spinlock_t {
    ptr.cast()
}

// SAFETY: the lock is a `spinlock_t`: `init` initialises it, `lock`/`try_lock` acquire it
// (exclusively, with bottom halves disabled on this CPU) and `unlock` releases it, re-enabling
// them; the guard state is empty, as the `_bh` calls keep what they need in the CPU's
// preemption count.
unsafe impl Backend for SpinLockBhBackend {
    type State = kernel::bindings::spinlock_t;
    type GuardState = ();

    unsafe fn init(
        ptr: *mut Self::State,
        name: *const kernel::ffi::c_char,
        key: *mut kernel::bindings::lock_class_key,
    ) {
        // SAFETY: the caller passes valid memory for the lock, a static name and a lock class
        // key that outlives it (the `Backend` contract).
        unsafe { kernel::bindings::__spin_lock_init(ptr, name, key) }
    }

    unsafe fn lock(ptr: *mut Self::State) -> Self::GuardState {
        // SAFETY: the caller passes an initialised lock (the `Backend` contract).
        unsafe { bindings::metaroce_glue_spin_lock_bh(ours(ptr)) }
    }

    unsafe fn try_lock(ptr: *mut Self::State) -> Option<Self::GuardState> {
        // SAFETY: as in `lock`.
        let taken = unsafe { bindings::metaroce_glue_spin_trylock_bh(ours(ptr)) };
        taken.then_some(())
    }

    unsafe fn unlock(ptr: *mut Self::State, _guard_state: &Self::GuardState) {
        // SAFETY: the caller holds the lock, taken with `lock` or `try_lock` (the `Backend`
        // contract), on this CPU: bottom halves stayed disabled, so no migration.
        unsafe { bindings::metaroce_glue_spin_unlock_bh(ours(ptr)) }
    }

    unsafe fn assert_is_held(ptr: *mut Self::State) {
        // SAFETY: the caller passes an initialised lock.
        unsafe { kernel::bindings::spin_assert_is_held(ptr) }
    }
}
