// SPDX-License-Identifier: GPL-2.0

//! The planes of a device, from the administrator's side (`docs/multiplane.md`).
//!
//! - `/sys/class/infiniband/<dev>/planes`, in the tradition of bonding's `slaves` file:
//!   `echo +eth1 > planes` adds a plane on `eth1` (a netdev in the namespace of the device's
//!   port 1 netdev), `echo -eth1 > planes` removes it; reading lists one line per plane,
//!   `plane netdev address state`. Plane `k` is port `k + 1`, and a device has as many ports
//!   as planes were added: adding one makes the device again with a port more
//!   (`ibdev::grow`; `EBUSY` while it is in use). Removing one leaves its port down, without
//!   a netdev (as a pulled cable does, and so that no other plane changes number), and the
//!   next plane added takes that port (`ib_device_set_netdev`), in use or not.
//! - The netdev notifier: a plane whose netdev unregisters is removed (the whole device when
//!   it is port 1's, as `rdma link add` made it); a plane's link going down or up sets that
//!   plane down or up in every connection.
//!
//! Plane changes and netdev events are serialised by RTNL.

use super::{
    bindings, ibdev,
    netdev::{HeldNetDev, NetDev, Rtnl},
    KernelStatic, DRIVER_ID,
};
use crate::device::MAX_PLANES;
use core::{fmt::Write, ptr};
use kernel::{
    ffi::{c_char, c_ulong},
    prelude::*,
};

static PLANES_ATTR: KernelStatic<bindings::device_attribute> =
    // SAFETY: a plain C struct (pointers, integers, optional function pointers): all zeroes
    // is its empty value and valid for every field.
    KernelStatic::new(unsafe { core::mem::zeroed() });
static PEERS_ATTR: KernelStatic<bindings::device_attribute> =
    // SAFETY: as for `PLANES_ATTR`.
    KernelStatic::new(unsafe { core::mem::zeroed() });
static PATHS_ATTR: KernelStatic<bindings::device_attribute> =
    // SAFETY: as for `PLANES_ATTR`.
    KernelStatic::new(unsafe { core::mem::zeroed() });
static MAX_PEERS_ATTR: KernelStatic<bindings::device_attribute> =
    // SAFETY: as for `PLANES_ATTR`.
    KernelStatic::new(unsafe { core::mem::zeroed() });
static ATTRS: KernelStatic<[*mut bindings::attribute; 5]> = KernelStatic::new([ptr::null_mut(); 5]);
static GROUP: KernelStatic<bindings::attribute_group> =
    // SAFETY: as for `PLANES_ATTR`.
    KernelStatic::new(unsafe { core::mem::zeroed() });

/// The device's attribute group (`ib_device_ops.device_group`): the `planes` file, the
/// `paths` file (paths per connection), the `max_peers` file (peer devices a device keeps a
/// connection to at most) and the read-only `peers` file (the data path's connections, for
/// operators and tests).
pub(super) fn attribute_group() -> *const bindings::attribute_group {
    GROUP.get()
}

kernel::sync::global_lock! {
    // SAFETY: initialised in `init`, at module load, before any device (and so any store
    // that takes it) exists.
    unsafe(uninit) static PLANES_LOCK: Mutex<()> = ();
}

/// Fills in the `planes` attribute and its group. Called once at module load, before the
/// link type is registered (so before any device, and so any reader, exists).
pub(super) fn init() {
    // SAFETY: called once, at module load, before any device exists.
    unsafe { PLANES_LOCK.init() };
    // SAFETY: nothing reads the statics yet (see above) and this runs once, so the writes
    // race with nothing; the pointers stored point to statics, which live forever.
    unsafe {
        let attr = &mut *PLANES_ATTR.get();
        attr.attr.name = c"planes".as_char_ptr();
        // Root may write (like bonding's `slaves`), everyone may read.
        attr.attr.mode = 0o644;
        attr.__bindgen_anon_1.show = Some(planes_show);
        attr.__bindgen_anon_2.store = Some(planes_store);
        let peers = &mut *PEERS_ATTR.get();
        peers.attr.name = c"peers".as_char_ptr();
        peers.attr.mode = 0o444;
        peers.__bindgen_anon_1.show = Some(peers_show);
        let paths = &mut *PATHS_ATTR.get();
        paths.attr.name = c"paths".as_char_ptr();
        paths.attr.mode = 0o644;
        paths.__bindgen_anon_1.show = Some(paths_show);
        paths.__bindgen_anon_2.store = Some(paths_store);
        let max_peers = &mut *MAX_PEERS_ATTR.get();
        max_peers.attr.name = c"max_peers".as_char_ptr();
        max_peers.attr.mode = 0o644;
        max_peers.__bindgen_anon_1.show = Some(max_peers_show);
        max_peers.__bindgen_anon_2.store = Some(max_peers_store);
        let attrs = &mut *ATTRS.get();
        attrs[0] = ptr::addr_of_mut!(attr.attr);
        attrs[1] = ptr::addr_of_mut!(peers.attr);
        attrs[2] = ptr::addr_of_mut!(paths.attr);
        attrs[3] = ptr::addr_of_mut!(max_peers.attr);
        let group = &mut *GROUP.get();
        group.__bindgen_anon_2.attrs = attrs.as_mut_ptr();
    }
}

/// A `core::fmt::Write` into a byte buffer that drops what does not fit.
pub(crate) struct BufWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Write for BufWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let bytes = s.as_bytes();
        let room = self.buf.len().saturating_sub(self.len);
        let n = bytes.len().min(room);
        if let (Some(dst), Some(src)) = (self.buf.get_mut(self.len..self.len + n), bytes.get(..n)) {
            dst.copy_from_slice(src);
        }
        self.len += n;
        Ok(())
    }
}

/// A netdev name (NUL-padded bytes) as text.
fn name_str(name: &[u8; 16]) -> &str {
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    core::str::from_utf8(name.get(..len).unwrap_or(&[])).unwrap_or("?")
}

/// The listing: one line per plane, `plane netdev address state`.
fn list_planes(ibdev: *mut bindings::ib_device, w: &mut BufWriter<'_>) {
    for port in 1..=MAX_PLANES {
        // SAFETY: the caller's device is live (sysfs keeps it registered while the file is
        // being read).
        let Some(ndev) = (unsafe { ibdev::port_netdev(ibdev, port) }) else {
            continue;
        };
        let name = ndev.name();
        let _ = write!(w, "{} {} ", port - 1, name_str(&name));
        let _ = match ndev.ipv4() {
            Some([a, b, c, d]) => write!(w, "{a}.{b}.{c}.{d}"),
            None => write!(w, "-"),
        };
        let _ = writeln!(w, " {}", if ndev.link_up() { "up" } else { "down" });
    }
}

/// A `show` of one of our device attributes: the listing `f` writes.
///
/// # Safety
///
/// `dev` and `buf` as sysfs passes them to `show`: the `struct device` of one of our
/// registered devices (our group is only on those, which stay registered while sysfs calls
/// us) and a zeroed buffer of `PAGE_SIZE` bytes, ours for the call.
unsafe fn show(
    dev: *mut bindings::device,
    buf: *mut c_char,
    f: impl FnOnce(*mut bindings::ib_device, &mut BufWriter<'_>),
) -> isize {
    // SAFETY: per the contract.
    let ibdev = unsafe { bindings::metaroce_glue_device_to_ibdev(dev) };
    // SAFETY: per the contract.
    let out = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), kernel::page::PAGE_SIZE) };
    let mut w = BufWriter { buf: out, len: 0 };
    f(ibdev, &mut w);
    w.len as isize
}

/// # Safety
///
/// Called only by sysfs, for the `planes` attribute of one of our devices, with a buffer of
/// `PAGE_SIZE` bytes.
unsafe extern "C" fn planes_show(
    dev: *mut bindings::device,
    _attr: *mut bindings::device_attribute,
    buf: *mut c_char,
) -> isize {
    // SAFETY: per the contract.
    unsafe { show(dev, buf, list_planes) }
}

/// A `show` of the device's data path: what `f` writes of its engine (nothing while the
/// device has none).
///
/// # Safety
///
/// As for [`show`].
unsafe fn show_engine(
    dev: *mut bindings::device,
    buf: *mut c_char,
    f: impl FnOnce(&crate::datapath::Engine, &mut BufWriter<'_>),
) -> isize {
    // SAFETY: per the contract.
    unsafe {
        show(dev, buf, |ibdev, w| {
            // SAFETY: the device is live while sysfs calls us.
            if let Some(engine) = ibdev::engine_of(ibdev) {
                f(engine, w);
            }
        })
    }
}

/// A `store` to one of our device attributes: `f` gets the device and the input.
///
/// # Safety
///
/// `dev`, `buf` and `count` as sysfs passes them to `store`: the `struct device` of one of
/// our registered devices and `count` readable bytes at `buf`, valid for the call.
unsafe fn store(
    dev: *mut bindings::device,
    buf: *const c_char,
    count: usize,
    f: impl FnOnce(*mut bindings::ib_device, &[u8]) -> Result,
) -> isize {
    // SAFETY: per the contract.
    let ibdev = unsafe { bindings::metaroce_glue_device_to_ibdev(dev) };
    // SAFETY: per the contract.
    let input = unsafe { core::slice::from_raw_parts(buf.cast::<u8>(), count) };
    match f(ibdev, input) {
        Ok(()) => count as isize,
        Err(e) => e.to_errno() as isize,
    }
}

/// # Safety
///
/// Called only by sysfs, for the `peers` attribute of one of our devices, with a buffer of
/// `PAGE_SIZE` bytes.
unsafe extern "C" fn peers_show(
    dev: *mut bindings::device,
    _attr: *mut bindings::device_attribute,
    buf: *mut c_char,
) -> isize {
    // SAFETY: per the contract.
    unsafe { show_engine(dev, buf, |engine, w| engine.describe_peers(w)) }
}

/// # Safety
///
/// Called only by sysfs, for the `paths` attribute of one of our devices, with a buffer of
/// `PAGE_SIZE` bytes.
unsafe extern "C" fn paths_show(
    dev: *mut bindings::device,
    _attr: *mut bindings::device_attribute,
    buf: *mut c_char,
) -> isize {
    // SAFETY: per the contract.
    unsafe { show_u32(dev, buf, |engine| u32::from(engine.paths())) }
}

/// # Safety
///
/// Called only by sysfs, for the `paths` attribute of one of our devices, with `count`
/// bytes of input at `buf`.
unsafe extern "C" fn paths_store(
    dev: *mut bindings::device,
    _attr: *mut bindings::device_attribute,
    buf: *const c_char,
    count: usize,
) -> isize {
    // SAFETY: per the contract.
    unsafe { store_u32(dev, buf, count, crate::datapath::Engine::set_paths) }
}

/// # Safety
///
/// Called only by sysfs, for the `max_peers` attribute of one of our devices, with a buffer
/// of `PAGE_SIZE` bytes.
unsafe extern "C" fn max_peers_show(
    dev: *mut bindings::device,
    _attr: *mut bindings::device_attribute,
    buf: *mut c_char,
) -> isize {
    // SAFETY: per the contract.
    unsafe { show_u32(dev, buf, crate::datapath::Engine::max_peers) }
}

/// A show of one decimal number of the device's engine, `get`'s.
///
/// # Safety
///
/// As for `show_engine`: called from a sysfs show of one of our devices, with a buffer of
/// `PAGE_SIZE` bytes.
unsafe fn show_u32(
    dev: *mut bindings::device,
    buf: *mut c_char,
    get: impl Fn(&crate::datapath::Engine) -> u32,
) -> isize {
    // SAFETY: per the contract.
    unsafe {
        show_engine(dev, buf, |engine, w| {
            let _ = writeln!(w, "{}", get(engine));
        })
    }
}

/// # Safety
///
/// Called only by sysfs, for the `max_peers` attribute of one of our devices, with `count`
/// bytes of input at `buf`.
unsafe extern "C" fn max_peers_store(
    dev: *mut bindings::device,
    _attr: *mut bindings::device_attribute,
    buf: *const c_char,
    count: usize,
) -> isize {
    // SAFETY: per the contract.
    unsafe { store_u32(dev, buf, count, crate::datapath::Engine::set_max_peers) }
}

/// A store of one decimal number into the device's engine through `set`.
///
/// # Safety
///
/// As for `store`: called from a sysfs store of one of our devices, with `count` bytes at `buf`.
unsafe fn store_u32(
    dev: *mut bindings::device,
    buf: *const c_char,
    count: usize,
    set: fn(&crate::datapath::Engine, u32) -> Result,
) -> isize {
    // SAFETY: per the contract.
    unsafe {
        store(dev, buf, count, |ibdev, input| {
            let n = core::str::from_utf8(input.trim_ascii())
                .ok()
                .and_then(|t| t.parse::<u32>().ok())
                .ok_or(EINVAL)?;
            // SAFETY: the device is live while sysfs calls us.
            let engine = ibdev::engine_of(ibdev).ok_or(ENODEV)?;
            set(engine, n)
        })
    }
}

/// # Safety
///
/// Called only by sysfs, for the `planes` attribute of one of our devices, with `count`
/// bytes of input at `buf`.
unsafe extern "C" fn planes_store(
    dev: *mut bindings::device,
    attr: *mut bindings::device_attribute,
    buf: *const c_char,
    count: usize,
) -> isize {
    // SAFETY: per the contract.
    unsafe {
        store(dev, buf, count, |ibdev, input| match command(input)? {
            (b'+', name) => match add_plane(ibdev, &name)? {
                None => Ok(()),
                // SAFETY: the store of `dev`'s `planes` file, `attr`.
                Some(ndev) => grow(dev, attr, ibdev, &ndev),
            },
            (_, name) => remove_plane(ibdev, &name),
        })
    }
}

/// A device all of whose ports have a plane gets one more (`ibdev::grow`): a new device
/// replaces it. Unregistering it waits for every sysfs call into it to return, this one
/// included, so this one first steps out of that wait (`sysfs_break_active_protection`, as
/// PCI's `remove` file does); from then on the device is held by a reference of its own.
///
/// # Safety
///
/// Called from the `planes` store of `dev` (the `struct device` of `ibdev`), `attr` its
/// attribute, before it returns.
unsafe fn grow(
    dev: *mut bindings::device,
    attr: *mut bindings::device_attribute,
    ibdev: *mut bindings::ib_device,
    ndev: &NetDev<'_>,
) -> Result {
    // SAFETY: per the contract both are live; this takes a reference on the device's kobject
    // (so its memory, the `ib_device`'s, stays until the unbreak) and on the file's node.
    let kn = unsafe {
        bindings::sysfs_break_active_protection(
            ptr::addr_of_mut!((*dev).kobj),
            ptr::addr_of!((*attr).attr),
        )
    };
    let grown = {
        let _serial = PLANES_LOCK.lock();
        // SAFETY: the `ib_device` is still in memory (see above); this fails once its
        // unregistration has begun, and succeeds with a reference that holds it off.
        if unsafe { bindings::metaroce_glue_ib_device_try_get(ibdev) } {
            // SAFETY: our reference, handed over; process context, without RTNL, under
            // `PLANES_LOCK`.
            unsafe { ibdev::grow(ibdev, ndev) }
        } else {
            Err(ENODEV)
        }
    };
    if !kn.is_null() {
        // SAFETY: the node and reference `sysfs_break_active_protection` gave us.
        unsafe { bindings::sysfs_unbreak_active_protection(kn) };
    }
    grown
}

/// `+NAME` or `-NAME` (surrounding whitespace ignored): the operation and the netdev name,
/// NUL-terminated.
fn command(input: &[u8]) -> Result<(u8, [u8; 16])> {
    let input = input.trim_ascii();
    let (&op, name) = input.split_first().ok_or(EINVAL)?;
    // A netdev name: 1 to 15 bytes, no '/', ':' or whitespace (`dev_valid_name`).
    if name.is_empty()
        || name.len() >= 16
        || name
            .iter()
            .any(|&b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
    {
        return Err(EINVAL);
    }
    let mut cname = [0u8; 16];
    if let Some(dst) = cname.get_mut(..name.len()) {
        dst.copy_from_slice(name);
    }
    match op {
        b'+' | b'-' => Ok((op, cname)),
        _ => Err(EINVAL),
    }
}

/// The netdev called `name` in the namespace of the device's port 1 netdev. Under RTNL.
fn netdev_by_name(
    ibdev: *mut bindings::ib_device,
    name: &[u8; 16],
    _rtnl: &Rtnl,
) -> Result<HeldNetDev> {
    // SAFETY: the device is live (see `planes_store`).
    let port1 = unsafe { ibdev::port_netdev(ibdev, 1) }.ok_or(ENODEV)?;
    // SAFETY: `port1` is held, so its namespace pointer is valid; the device is not shut
    // down (the caller checked under RTNL), so its netdev is registered and the namespace
    // alive. `name` is NUL-terminated (at most 15 bytes of 16); a non-null result is a
    // reference handed over to `HeldNetDev`.
    unsafe {
        let net = bindings::metaroce_glue_dev_net(port1.as_ptr());
        HeldNetDev::from_held(bindings::dev_get_by_name(net, name.as_ptr()))
    }
    .ok_or(ENODEV)
}

/// `+NAME`: a new plane on the netdev `name`, on the first port without a netdev; if every
/// port has one, the netdev (held) for [`grow`].
fn add_plane(ibdev: *mut bindings::ib_device, name: &[u8; 16]) -> Result<Option<HeldNetDev>> {
    let port = {
        let rtnl = Rtnl::lock();
        // SAFETY: the device is live (see `planes_store`).
        let engine = unsafe { ibdev::engine_of(ibdev) }.ok_or(ENODEV)?;
        if !engine.is_open() {
            return Err(ENODEV);
        }
        let ndev = netdev_by_name(ibdev, name, &rtnl)?;
        // A netdev is a plane of at most one device (ours included).
        // SAFETY: `ndev` is held; a non-null result is a reference we put at once.
        let other = unsafe { bindings::ib_device_get_by_netdev(ndev.as_ptr(), DRIVER_ID) };
        if !other.is_null() {
            // SAFETY: the reference `ib_device_get_by_netdev` gave us.
            unsafe { bindings::ib_device_put(other) };
            return Err(EEXIST);
        }
        // SAFETY: the device is live.
        let ports = unsafe { (*ibdev).phys_port_cnt };
        // SAFETY: the device is live.
        let free = (2..=ports).find(|&p| unsafe { ibdev::port_netdev(ibdev, p) }.is_none());
        let Some(port) = free else {
            return Ok(Some(ndev));
        };
        engine.add_plane((port - 1) as usize, &ndev)?;
        // SAFETY: the device is live and `port` valid; `ndev` is registered (found by name
        // under RTNL, which its unregistration takes) and the core takes its own reference.
        // When it unregisters, our notifier clears the port again (`netdev_event`).
        let err = unsafe { bindings::ib_device_set_netdev(ibdev, ndev.as_ptr(), port) };
        if err != 0 {
            engine.remove_plane((port - 1) as usize);
            return Err(Error::from_errno(err));
        }
        port
    };
    // The RDMA core fills the new port's GID table from its netdev's addresses (this takes
    // RTNL itself).
    // SAFETY: the device is live and `port` valid.
    unsafe { bindings::rdma_roce_rescan_port(ibdev, port) };
    Ok(None)
}

/// `-NAME`: removes the plane on the netdev `name`. Plane 0 cannot be removed (`EBUSY`):
/// the device goes with it (`rdma link delete`).
fn remove_plane(ibdev: *mut bindings::ib_device, name: &[u8; 16]) -> Result {
    let rtnl = Rtnl::lock();
    let ndev = netdev_by_name(ibdev, name, &rtnl)?;
    let port = port_of(ibdev, &ndev).ok_or(ENOENT)?;
    if port == 1 {
        return Err(EBUSY);
    }
    detach_plane(ibdev, port);
    Ok(())
}

/// The port whose netdev is `ndev`.
fn port_of(ibdev: *mut bindings::ib_device, ndev: &NetDev<'_>) -> Option<u32> {
    (1..=MAX_PLANES).find(|&p| {
        // SAFETY: the caller's device is live.
        unsafe { ibdev::port_netdev(ibdev, p) }.is_some_and(|n| n.as_ptr() == ndev.as_ptr())
    })
}

/// Closes plane `port - 1` and takes the netdev off its port. Under RTNL.
fn detach_plane(ibdev: *mut bindings::ib_device, port: u32) {
    // SAFETY: the caller's device is live.
    if let Some(engine) = unsafe { ibdev::engine_of(ibdev) } {
        engine.remove_plane((port - 1) as usize);
    }
    // SAFETY: the device is live and `port` valid; a null netdev clears the port (the core
    // drops its reference).
    unsafe { bindings::ib_device_set_netdev(ibdev, ptr::null_mut(), port) };
}

/// A netdev event (under RTNL): for a netdev that is one of our planes, removes the plane
/// (or the device, for port 1) when it unregisters, follows the first plane's MTU, and each
/// plane's link state otherwise.
pub(super) fn netdev_event(event: c_ulong, ndev: &NetDev<'_>) {
    let unregister = event == bindings::netdev_cmd_NETDEV_UNREGISTER as c_ulong;
    let mtu = event == bindings::netdev_cmd_NETDEV_CHANGEMTU as c_ulong;
    let link = [
        bindings::netdev_cmd_NETDEV_UP,
        bindings::netdev_cmd_NETDEV_DOWN,
        bindings::netdev_cmd_NETDEV_CHANGE,
    ]
    .iter()
    .any(|&e| event == e as c_ulong);
    if !unregister && !mtu && !link {
        return;
    }
    // SAFETY: `ndev` is alive for the call; a non-null result is a reference we put below.
    let ibdev = unsafe { bindings::ib_device_get_by_netdev(ndev.as_ptr(), DRIVER_ID) };
    if ibdev.is_null() {
        return;
    }
    match port_of(ibdev, ndev) {
        Some(1) if unregister => ibdev::remove_device_of(ndev),
        Some(port) if unregister => detach_plane(ibdev, port),
        // The device's packet size follows its first plane's link.
        Some(1) if mtu => {
            // SAFETY: we hold a reference, so the device is live.
            if let Some(engine) = unsafe { ibdev::engine_of(ibdev) } {
                engine.set_link_mtu(ndev.mtu());
            }
        }
        Some(_) if mtu => {}
        Some(port) => {
            // SAFETY: we hold a reference, so the device is live.
            if let Some(engine) = unsafe { ibdev::engine_of(ibdev) } {
                engine.set_plane_link((port - 1) as usize, ndev.link_up());
            }
        }
        None => {}
    }
    // SAFETY: the reference `ib_device_get_by_netdev` gave us.
    unsafe { bindings::ib_device_put(ibdev) };
}
