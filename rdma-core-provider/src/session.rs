// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! A lock that one thread may hold across calls: the extended verbs' sessions.
//!
//! `ibv_start_poll` .. `ibv_end_poll` on an extended CQ and `ibv_wr_start` ..
//! `ibv_wr_complete` / `ibv_wr_abort` on an extended QP are each one critical section spread
//! over several calls into the provider (C providers take a spinlock in the first and release
//! it in the last). [`Session`] is that: a value behind a mutex plus the thread, if any, that
//! holds it open. The one-call verbs (`ibv_poll_cq`, `ibv_post_send`) wait until no other
//! thread holds it, and are refused to the holder itself (in C they would deadlock); the calls
//! inside a session are served only to its holder. No guard lives across calls, so all of it
//! is safe code over `std::sync`.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// The calling thread, as a token: the address of a thread-local, unique among live threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner(usize);

impl Owner {
    /// The calling thread's token.
    pub fn current() -> Self {
        thread_local! {
            static TOKEN: u8 = const { 0 };
        }
        TOKEN.with(|t| Owner(core::ptr::from_ref(t) as usize))
    }
}

/// The caller holds the session itself, so it cannot wait for it to close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InSession;

#[derive(Debug)]
struct Slot<T> {
    value: T,
    owner: Option<Owner>,
}

/// A value guarded by a mutex that one thread may also hold open across calls.
#[derive(Debug)]
pub struct Session<T> {
    slot: Mutex<Slot<T>>,
    /// Signalled whenever a session closes.
    closed: Condvar,
}

impl<T> Session<T> {
    pub fn new(value: T) -> Self {
        Self {
            slot: Mutex::new(Slot { value, owner: None }),
            closed: Condvar::new(),
        }
    }

    /// The slot, once no other thread holds a session; `InSession` if `me` holds it. A poisoned
    /// lock (a panic caught while it was held) is still usable: the values stay consistent at
    /// every point where a panic can occur.
    fn free(&self, me: Owner) -> Result<MutexGuard<'_, Slot<T>>, InSession> {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match slot.owner {
                None => return Ok(slot),
                Some(o) if o == me => return Err(InSession),
                Some(_) => {
                    slot = self
                        .closed
                        .wait(slot)
                        .unwrap_or_else(PoisonError::into_inner)
                }
            }
        }
    }

    fn held(&self, me: Owner) -> Option<MutexGuard<'_, Slot<T>>> {
        let slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        (slot.owner == Some(me)).then_some(slot)
    }

    /// Runs `f` on the value outside any session (a one-call verb), waiting for another
    /// thread's session to close.
    pub fn with<R>(&self, me: Owner, f: impl FnOnce(&mut T) -> R) -> Result<R, InSession> {
        self.free(me).map(|mut slot| f(&mut slot.value))
    }

    /// Opens a session for `me` (waiting for another thread's to close) and runs `f` in it;
    /// the session stays open if `f` says so (`(result, true)`), else it closes at once.
    pub fn open<R>(&self, me: Owner, f: impl FnOnce(&mut T) -> (R, bool)) -> Result<R, InSession> {
        let mut slot = self.free(me)?;
        let (r, keep) = f(&mut slot.value);
        if keep {
            slot.owner = Some(me);
        }
        Ok(r)
    }

    /// Runs `f` in the session `me` holds; `None` (and `f` not run) if it holds none.
    pub fn within<R>(&self, me: Owner, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.held(me).map(|mut slot| f(&mut slot.value))
    }

    /// Runs `f` in the session `me` holds, then closes it (waking the waiters); `None` (and
    /// `f` not run) if it holds none.
    pub fn close<R>(&self, me: Owner, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let mut slot = self.held(me)?;
        let r = f(&mut slot.value);
        slot.owner = None;
        drop(slot);
        self.closed.notify_all();
        Some(r)
    }

    /// Reads the value whoever holds it, without waiting for a session to close: for what
    /// never changes (a ring's address) and for the holder's reads of its own session state.
    pub fn peek<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        f(&slot.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn owners_differ_between_threads() {
        let me = Owner::current();
        assert_eq!(me, Owner::current());
        let other = std::thread::spawn(Owner::current).join().unwrap();
        assert_ne!(me, other);
    }

    #[test]
    fn a_session_serves_only_its_holder() {
        let s = Session::new(0u32);
        let me = Owner::current();
        assert_eq!(s.with(me, |v| *v += 1), Ok(()));
        // Not open: within/close do nothing.
        assert_eq!(s.within(me, |v| *v), None);
        assert_eq!(s.close(me, |v| *v), None);
        // Opened and closed at once (f said so).
        assert_eq!(s.open(me, |v| (*v, false)), Ok(1));
        assert_eq!(s.within(me, |v| *v), None);
        // Held open: the holder works in it, its one-call verbs are refused.
        assert_eq!(s.open(me, |_| ((), true)), Ok(()));
        assert_eq!(s.within(me, |v| std::mem::replace(v, 7)), Some(1));
        assert_eq!(s.with(me, |_| ()), Err(InSession));
        assert_eq!(s.open(me, |_| ((), true)), Err(InSession));
        assert_eq!(s.peek(|v| *v), 7);
        // Another thread is neither served inside it nor can close it.
        std::thread::scope(|t| {
            t.spawn(|| {
                let them = Owner::current();
                assert_eq!(s.within(them, |v| *v), None);
                assert_eq!(s.close(them, |v| *v), None);
                assert_eq!(s.peek(|v| *v), 7);
            });
        });
        assert_eq!(s.close(me, |v| *v + 1), Some(8));
        assert_eq!(s.with(me, |v| *v), Ok(7));
    }

    #[test]
    fn others_wait_for_the_session_to_close() {
        let s = Session::new(Vec::new());
        let me = Owner::current();
        s.open(me, |v: &mut Vec<&str>| {
            v.push("open");
            ((), true)
        })
        .unwrap();
        let released = AtomicBool::new(false);
        let (started, waiting) = mpsc::channel();
        std::thread::scope(|t| {
            let with = t.spawn(|| {
                started.send(()).unwrap();
                s.with(Owner::current(), |v| {
                    assert!(released.load(Ordering::SeqCst), "ran inside the session");
                    v.push("with");
                })
                .unwrap()
            });
            let opener = t.spawn(|| {
                let them = Owner::current();
                s.open(them, |v| {
                    assert!(released.load(Ordering::SeqCst), "opened inside the session");
                    v.push("other");
                    ((), true)
                })
                .unwrap();
                s.close(them, |v| v.push("other closed")).unwrap();
            });
            waiting.recv().unwrap();
            std::thread::sleep(Duration::from_millis(50));
            s.within(me, |v| v.push("inside")).unwrap();
            released.store(true, Ordering::SeqCst);
            s.close(me, |v| v.push("closed")).unwrap();
            with.join().unwrap();
            opener.join().unwrap();
        });
        let log = s.peek(|v| v.clone());
        assert_eq!(&log[..3], ["open", "inside", "closed"]);
        assert_eq!(log.len(), 6);
    }
}
