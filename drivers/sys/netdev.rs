// SPDX-License-Identifier: GPL-2.0

//! Safe, read-only views of a `struct net_device`.

use super::bindings;
use core::{marker::PhantomData, ops::Deref, ptr::NonNull};

/// A `net_device` that stays alive for `'a` (the caller holds it, or [`HeldNetDev`] does).
pub(crate) struct NetDev<'a> {
    ptr: NonNull<bindings::net_device>,
    _lifetime: PhantomData<&'a bindings::net_device>,
}

impl NetDev<'_> {
    /// # Safety
    ///
    /// `ptr` must point to a registered `net_device` that stays alive for the returned lifetime.
    pub(super) unsafe fn from_raw<'a>(ptr: NonNull<bindings::net_device>) -> NetDev<'a> {
        NetDev {
            ptr,
            _lifetime: PhantomData,
        }
    }

    pub(super) fn as_ptr(&self) -> *mut bindings::net_device {
        self.ptr.as_ptr()
    }

    /// The MTU of the link, in bytes.
    pub(crate) fn mtu(&self) -> u32 {
        // SAFETY: the type invariant keeps the netdev alive; `mtu` is a plain integer that the
        // stack updates with single stores, which C readers read the same way.
        unsafe { (*self.ptr.as_ptr()).mtu }
    }

    /// The hardware address, zero-padded to six bytes (shorter on non-Ethernet links).
    pub(crate) fn mac(&self) -> [u8; 6] {
        let mut mac = [0u8; 6];
        // SAFETY: the type invariant keeps the netdev alive; `dev_addr` points to `addr_len`
        // valid bytes for as long as the netdev is registered.
        unsafe {
            let ndev = &*self.ptr.as_ptr();
            if !ndev.dev_addr.is_null() {
                let len = usize::from(ndev.addr_len).min(mac.len());
                core::ptr::copy_nonoverlapping(ndev.dev_addr, mac.as_mut_ptr(), len);
            }
        }
        mac
    }

    /// The RDMA port state this link implies (ACTIVE when running with carrier).
    pub(crate) fn port_state(&self) -> bindings::ib_port_state {
        // SAFETY: the type invariant keeps the netdev alive for the call.
        unsafe { bindings::metaroce_glue_curr_port_state(self.as_ptr()) }
    }

    /// Whether the link can carry packets: running, with carrier.
    pub(crate) fn link_up(&self) -> bool {
        self.port_state() == bindings::ib_port_state_IB_PORT_ACTIVE
    }

    /// The interface name (`IFNAMSIZ` bytes, NUL-padded).
    pub(crate) fn name(&self) -> [u8; 16] {
        let mut name = [0u8; 16];
        // SAFETY: the type invariant keeps the netdev alive; `name` is an inline array the
        // stack changes only under RTNL (a rename), and any bytes are valid `u8`s.
        let src = unsafe { &(*self.ptr.as_ptr()).name };
        for (d, s) in name.iter_mut().zip(src.iter()) {
            *d = *s;
        }
        name
    }

    /// The interface's primary IPv4 address, if it has one.
    pub(crate) fn ipv4(&self) -> Option<[u8; 4]> {
        // SAFETY: the type invariant keeps the netdev alive; the call reads its addresses
        // under RCU itself. Scope 0 (RT_SCOPE_UNIVERSE): a global address.
        let addr = unsafe { bindings::inet_select_addr(self.as_ptr(), 0, 0) };
        (addr != 0).then(|| addr.to_ne_bytes())
    }

    /// Whether the interface is administratively up (`IFF_UP`).
    pub(crate) fn is_up(&self) -> bool {
        // SAFETY: the type invariant keeps the netdev alive for the call.
        let flags = unsafe { bindings::netif_get_flags(self.as_ptr()) };
        flags & bindings::net_device_flags_IFF_UP != 0
    }
}

/// A `net_device` on which we hold a reference (`dev_hold`), dropped with `dev_put`.
pub(crate) struct HeldNetDev(NetDev<'static>);

impl HeldNetDev {
    /// # Safety
    ///
    /// `ptr` must be null or a `net_device` whose reference the caller hands over to us.
    pub(super) unsafe fn from_held(ptr: *mut bindings::net_device) -> Option<Self> {
        // SAFETY: the reference we now own keeps the netdev alive until `drop`.
        NonNull::new(ptr).map(|p| HeldNetDev(unsafe { NetDev::from_raw(p) }))
    }
}

impl Deref for HeldNetDev {
    type Target = NetDev<'static>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Drop for HeldNetDev {
    fn drop(&mut self) {
        // SAFETY: we own one reference on this netdev (see `from_held`) and give it back.
        unsafe { bindings::metaroce_glue_dev_put(self.0.as_ptr()) }
    }
}

/// RTNL, held while this lives.
pub(crate) struct Rtnl;

impl Rtnl {
    /// Takes RTNL. Process context, by a thread that does not hold it: a sysfs store, or a
    /// verb that only userspace reaches (uverbs calls the driver without RTNL).
    pub(crate) fn lock() -> Self {
        // SAFETY: per the caller's contract above (the lock sleeps, and is not recursive).
        unsafe { bindings::rtnl_lock() };
        Rtnl
    }
}

impl Drop for Rtnl {
    fn drop(&mut self) {
        // SAFETY: taken in `lock`.
        unsafe { bindings::rtnl_unlock() };
    }
}
