// SPDX-License-Identifier: GPL-2.0

//! Module-wide registrations: the `metaroce` link type (`rdma link add ... type metaroce`) and
//! the netdev notifier that removes a device or plane when its netdev goes away and follows
//! the planes' link states (`planes`).

use super::{bindings, ibdev, netdev::NetDev, planes, to_errno, KernelStatic};
use core::ptr;
use kernel::{
    ffi::{c_char, c_int, c_ulong, c_void},
    prelude::*,
};

static LINK_OPS: KernelStatic<bindings::rdma_link_ops> =
    KernelStatic::new(bindings::rdma_link_ops {
        list: bindings::list_head {
            next: ptr::null_mut(),
            prev: ptr::null_mut(),
        },
        type_: c"metaroce".to_bytes_with_nul().as_ptr(),
        newlink: Some(newlink),
        dellink: None,
    });

static NETDEV_NOTIFIER: KernelStatic<bindings::notifier_block> =
    KernelStatic::new(bindings::notifier_block {
        notifier_call: Some(netdev_event),
        next: ptr::null_mut(),
        priority: 0,
    });

/// The link ops, for `ib_device.link_ops`.
pub(super) fn link_ops() -> *const bindings::rdma_link_ops {
    LINK_OPS.get()
}

/// What the module holds while it is loaded; dropping it undoes everything in reverse.
pub(crate) struct Registration {
    _private: (),
}

impl Registration {
    pub(crate) fn new(_module: &'static ThisModule) -> Result<Self> {
        // The host-tested QP transition table must be the core's: refuse to load otherwise.
        if let Err((cur, next, t, mask)) = super::abi::check_transition_table() {
            pr_err!(
                "QP transition table disagrees with ib_modify_qp_is_ok: {cur} -> {next}, type {t}, mask {mask:#x}\n"
            );
            return Err(EINVAL);
        }
        planes::init();
        // SAFETY: the notifier is a static, so it outlives its registration, which `drop`
        // undoes; it is registered once.
        let err = unsafe { bindings::register_netdevice_notifier(NETDEV_NOTIFIER.get()) };
        if err != 0 {
            return Err(Error::from_errno(err));
        }
        // SAFETY: as above for the link ops; from here on `newlink` can run.
        unsafe { bindings::rdma_link_register(LINK_OPS.get()) };
        Ok(Registration { _private: () })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: both were registered in `new`. No new device can appear once the link type
        // is gone; `remove_all_devices` then waits for every device to be freed, so no
        // notifier call can find one of ours after that.
        unsafe { bindings::rdma_link_unregister(LINK_OPS.get()) };
        ibdev::remove_all_devices();
        // SAFETY: registered in `new`.
        unsafe { bindings::unregister_netdevice_notifier(NETDEV_NOTIFIER.get()) };
    }
}

/// # Safety
///
/// Called only by the RDMA netlink code (`rdma link add`), with a live netdev and name.
unsafe extern "C" fn newlink(name: *const c_char, ndev: *mut bindings::net_device) -> c_int {
    let Some(ndev) = ptr::NonNull::new(ndev) else {
        return EINVAL.to_errno();
    };
    // SAFETY: the RDMA netlink handler holds a reference on `ndev` for the whole call and
    // passes a NUL-terminated device name.
    let ndev = unsafe { NetDev::from_raw(ndev) };
    to_errno(ibdev::add_device(name, &ndev))
}

/// # Safety
///
/// Called only by the netdev notifier chain, with a `netdev_notifier_info`.
unsafe extern "C" fn netdev_event(
    _nb: *mut bindings::notifier_block,
    event: c_ulong,
    info: *mut c_void,
) -> c_int {
    // SAFETY: netdev notifiers receive a `netdev_notifier_info` naming a live netdev.
    let ndev = unsafe { bindings::metaroce_glue_notifier_info_to_dev(info) };
    let Some(ndev) = ptr::NonNull::new(ndev) else {
        return bindings::NOTIFY_DONE as c_int;
    };
    // SAFETY: the netdev stays alive during its own notifications.
    planes::netdev_event(event, &unsafe { NetDev::from_raw(ndev) });
    bindings::NOTIFY_OK as c_int
}
