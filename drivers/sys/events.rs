// SPDX-License-Identifier: GPL-2.0

//! The events a verbs object raises through the core's handlers: a CQ's completion and
//! overflow events, a QP's or SRQ's asynchronous errors.

use super::bhlock::{new_spinlock_bh, SpinLockBh};
use super::bindings;
use core::ptr::NonNull;
use kernel::prelude::*;

/// Raises a CQ's completion and error events (the core's `comp_handler`/`event_handler`).
pub(crate) struct CqNotifier(pub(super) NonNull<bindings::ib_cq>);

// SAFETY: the `ib_cq` outlives the `Cq` holding this (destroy_cq drops the `Cq` before the
// core frees the `ib_cq`), and the core's handlers may run on any CPU.
unsafe impl Send for CqNotifier {}
// SAFETY: as above; the handlers do their own locking.
unsafe impl Sync for CqNotifier {}

impl CqNotifier {
    /// A completion event (`ibv_get_cq_event` wakes up).
    pub(crate) fn notify(&self) {
        let cq = self.0.as_ptr();
        // SAFETY: the `ib_cq` is alive (see the `Send` impl); the core set the handler and
        // its context at creation and never changes them.
        unsafe {
            if let Some(handler) = (*cq).comp_handler {
                handler(cq, (*cq).cq_context);
            }
        }
    }

    /// The CQ overflowed: an asynchronous `IBV_EVENT_CQ_ERR`.
    pub(crate) fn overflow(&self) {
        let cq = self.0.as_ptr();
        // SAFETY: as in `notify`.
        unsafe {
            if let Some(handler) = (*cq).event_handler {
                let mut event = bindings::ib_event {
                    device: (*cq).device,
                    event: bindings::ib_event_type_IB_EVENT_CQ_ERR,
                    ..Default::default()
                };
                event.element.cq = cq;
                handler(&mut event, (*cq).cq_context);
            }
        }
    }
}

/// The core's `ib_qp` or `ib_srq` an [`AsyncEvents`] raises events on.
struct EventObject<T>(NonNull<T>);

// SAFETY: a pointer the core's objects are reached by from any CPU; dereferenced only under
// `AsyncEvents::object`'s lock, while the object is alive (see `AsyncEvents`).
unsafe impl<T> Send for EventObject<T> {}

/// Raises the asynchronous events of a user QP (`IB_EVENT_QP_FATAL`) or SRQ
/// (`IB_EVENT_SRQ_ERR`) through the core's `event_handler`, from any context (the data path's
/// softirq and locks included), until the object is destroyed.
///
/// Lifetime: the data path reaches a QP through its `Arc<Qp>` (the QP table, its stream's slot)
/// and an SRQ through the QPs' `Arc<Srq>`, and an `Arc` says nothing of the `ib_qp`/`ib_srq`,
/// which the core frees as soon as `destroy_qp`/`destroy_srq` returns (`ib_destroy_qp_user`,
/// `ib_destroy_srq_user`), and whose uverbs event list it releases right after
/// (`ib_uverbs_release_uevent`). So the object's pointer is kept here, under a lock, only from
/// create until destroy starts: `destroy_qp`/`destroy_srq` take it out first ([`Self::detach`]),
/// and raising an event holds the lock from reading the pointer until the handler returns. An
/// event is raised before destroy takes the pointer, or finds none; never after destroy began,
/// however long an `Arc` lives.
#[pin_data]
pub(crate) struct AsyncEvents<T> {
    /// The core's object; None once its destroy began.
    #[pin]
    object: SpinLockBh<Option<EventObject<T>>>,
}

/// A user QP's asynchronous events.
pub(crate) type QpEvents = AsyncEvents<bindings::ib_qp>;
/// A user SRQ's asynchronous events.
pub(crate) type SrqEvents = AsyncEvents<bindings::ib_srq>;

impl<T> AsyncEvents<T> {
    /// Events on `object`.
    ///
    /// # Safety
    ///
    /// `object` must be the core's `ib_qp`/`ib_srq` being created (its `device`,
    /// `event_handler` and context set, as the core does before the driver's create), and
    /// [`Self::detach`] must be called before it is freed: at the start of its destroy, or
    /// when its create fails while others can reach this.
    pub(super) unsafe fn new(object: NonNull<T>) -> impl PinInit<Self> {
        pin_init!(Self {
            object <- new_spinlock_bh!(Some(EventObject(object)), "metaroce_async_events"),
        })
    }

    /// The object is being destroyed: no event is raised from now on (one being raised on
    /// another CPU has returned when this does).
    pub(super) fn detach(&self) {
        *self.object.lock() = None;
    }
}

/// A core object that raises asynchronous events through its `event_handler`.
pub(crate) trait EventTarget {
    /// Raises `event` on `object` through its handler, if it has one.
    ///
    /// # Safety
    ///
    /// `object` must be alive, with `device`, the handler and its context set (the core sets
    /// them before our create and never changes them).
    unsafe fn raise(object: *mut Self, event: bindings::ib_event_type);
}

/// `EventTarget` for a core object type whose `ib_event` element is the field `$element` and
/// whose handler's context is `$context`.
macro_rules! event_target {
    ($object:ty, $element:ident, $context:ident) => {
        impl EventTarget for $object {
            unsafe fn raise(object: *mut Self, event: bindings::ib_event_type) {
                // SAFETY: per the contract. The handlers (the core's `__ib_qp_event_handler`
                // then uverbs' `ib_uverbs_qp_event_handler`; uverbs'
                // `ib_uverbs_srq_event_handler`) take a spinlock with interrupts saved and
                // allocate with GFP_ATOMIC: callable in softirq and under our locks, and they
                // call nothing of ours.
                unsafe {
                    if let Some(handler) = (*object).event_handler {
                        let mut e = bindings::ib_event {
                            device: (*object).device,
                            event,
                            ..Default::default()
                        };
                        e.element.$element = object;
                        handler(&mut e, (*object).$context);
                    }
                }
            }
        }
    };
}

event_target!(bindings::ib_qp, qp, qp_context);
event_target!(bindings::ib_srq, srq, srq_context);

impl<T: EventTarget> AsyncEvents<T> {
    /// Raises `event`, if the object is not being destroyed.
    fn raise(&self, event: bindings::ib_event_type) {
        let object = self.object.lock();
        if let Some(EventObject(o)) = object.as_ref() {
            // SAFETY: the object is alive while its pointer is here and we hold the lock (see
            // the type), with its device and handler set by the core before our create.
            unsafe { T::raise(o.as_ptr(), event) };
        }
    }
}

impl AsyncEvents<bindings::ib_qp> {
    /// `IB_EVENT_QP_FATAL` (`IBV_EVENT_QP_FATAL` for the application), if the QP is not
    /// being destroyed.
    pub(crate) fn qp_fatal(&self) {
        self.raise(bindings::ib_event_type_IB_EVENT_QP_FATAL);
    }
}

impl AsyncEvents<bindings::ib_srq> {
    /// `IB_EVENT_SRQ_ERR` (`IBV_EVENT_SRQ_ERR`), if the SRQ is not being destroyed.
    pub(crate) fn srq_error(&self) {
        self.raise(bindings::ib_event_type_IB_EVENT_SRQ_ERR);
    }

    /// `IB_EVENT_SRQ_LIMIT_REACHED` (`IBV_EVENT_SRQ_LIMIT_REACHED`): fewer WQEs are left than
    /// the limit `modify_srq` armed.
    pub(crate) fn srq_limit_reached(&self) {
        self.raise(bindings::ib_event_type_IB_EVENT_SRQ_LIMIT_REACHED);
    }
}
