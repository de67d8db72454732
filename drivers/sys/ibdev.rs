// SPDX-License-Identifier: GPL-2.0

//! The `ib_device`: allocation, registration, the ops table and its trampolines.
//!
//! Each trampoline checks nothing the core already guarantees, turns the raw pointers it is
//! given into references and hands them to safe code in [`crate::device`].

use super::{
    bindings, netdev::HeldNetDev, netdev::NetDev, ops::VerbsOps, ring, to_errno, DRIVER_ID,
};
use crate::{datapath::Engine, device::Device, verbs::Verbs};
use core::{
    mem::{offset_of, size_of, ManuallyDrop},
    ptr::{self, NonNull},
};
use kernel::sync::Arc;
use kernel::{ffi::c_char, ffi::c_int, prelude::*, ModuleMetadata};

/// The memory the RDMA core allocates for each device: its `ib_device` first (the core frees
/// it as such), then ours.
#[repr(C)]
struct MetaDev {
    ibdev: bindings::ib_device,
    /// Written right after allocation, before the ops (and so `dealloc_driver`) are set.
    state: ManuallyDrop<Device>,
    /// The verbs objects (MRs, QPs, SRQs by number); written with `state`.
    verbs: ManuallyDrop<Arc<Verbs>>,
    /// The data path, once the device has a socket to send on; written with `state`.
    engine: ManuallyDrop<Option<Arc<Engine>>>,
}

/// A user context (`ibv_open_device`); ours will hold the mmap entries of the rings.
#[repr(C)]
struct MetaUcontext {
    ibuc: bindings::ib_ucontext,
}

/// A protection domain.
#[repr(C)]
struct MetaPd {
    ibpd: bindings::ib_pd,
}

const _: () = assert!(offset_of!(MetaDev, ibdev) == 0);
const _: () = assert!(offset_of!(MetaUcontext, ibuc) == 0);
const _: () = assert!(offset_of!(MetaPd, ibpd) == 0);

/// The driver of the verbs objects' ops (`sys::ops`).
type Driver = crate::ops::MetaRoceOps;

/// The ops the RDMA core calls. Built per device: `ib_set_device_ops` copies it.
fn device_ops() -> bindings::ib_device_ops {
    let mut ops = bindings::ib_device_ops {
        // The core pins the module while user contexts are open.
        owner: <<Driver as VerbsOps>::OwnerModule as ModuleMetadata>::THIS_MODULE
            .as_ptr()
            .cast(),
        driver_id: DRIVER_ID,
        uverbs_abi_ver: super::UVERBS_ABI_VERSION,
        dealloc_driver: Some(dealloc_driver),
        // The `planes` file (`sys::planes`).
        device_group: super::planes::attribute_group(),
        query_device: Some(query_device),
        query_port: Some(query_port),
        query_pkey: Some(query_pkey),
        get_port_immutable: Some(get_port_immutable),
        get_link_layer: Some(get_link_layer),
        alloc_hw_port_stats: Some(super::stats::alloc_hw_port_stats),
        get_hw_stats: Some(super::stats::get_hw_stats),
        alloc_ucontext: Some(alloc_ucontext),
        dealloc_ucontext: Some(dealloc_ucontext),
        disassociate_ucontext: Some(disassociate_ucontext),
        alloc_pd: Some(alloc_pd),
        dealloc_pd: Some(dealloc_pd),
        size_ib_ucontext: size_of::<MetaUcontext>(),
        size_ib_pd: size_of::<MetaPd>(),
        mmap: Some(ring::mmap),
        mmap_free: Some(ring::mmap_free),
        create_ah: Some(super::kverbs::create_ah),
        destroy_ah: Some(super::kverbs::destroy_ah),
        size_ib_ah: super::kverbs::SIZE_AH,
        ..Default::default()
    };
    // CQs, SRQs, MRs, QPs: the driver's `VerbsOps`.
    super::ops::fill::<Driver>(&mut ops);
    ops
}

/// The parts of a device that its verbs ops work with.
pub(crate) struct DeviceCtx<'a> {
    /// The verbs objects (MRs, QPs, SRQs by number).
    pub(crate) verbs: &'a Arc<Verbs>,
    /// The data path, if the device has a socket to send on.
    pub(crate) engine: Option<&'a Arc<Engine>>,
}

/// The parts of the device behind `ibdev`.
///
/// # Safety
///
/// As for [`state`], for `'a`.
pub(super) unsafe fn ctx<'a>(ibdev: *const bindings::ib_device) -> DeviceCtx<'a> {
    // SAFETY: per the contract.
    unsafe {
        DeviceCtx {
            verbs: verbs_of(ibdev),
            engine: engine_of(ibdev),
        }
    }
}

/// Our state of the device behind `ibdev`.
///
/// # Safety
///
/// `ibdev` must be a live device that this driver allocated (every `ib_device` whose ops
/// reach our trampolines is), with its state initialised.
pub(super) unsafe fn state<'a>(ibdev: *const bindings::ib_device) -> &'a Device {
    // SAFETY: per the contract `ibdev` is the first field of a live `MetaDev` (offset 0,
    // checked above), whose `state` was written before the ops were installed.
    unsafe { &(*ibdev.cast::<MetaDev>()).state }
}

/// The verbs objects of the device behind `ibdev`.
///
/// # Safety
///
/// As for [`state`].
pub(super) unsafe fn verbs_of<'a>(ibdev: *const bindings::ib_device) -> &'a Arc<Verbs> {
    // SAFETY: as in `state`; `verbs` is written together with `state`.
    unsafe { &(*ibdev.cast::<MetaDev>()).verbs }
}

/// The data path of the device behind `ibdev`, if it has one.
///
/// # Safety
///
/// As for [`state`].
pub(super) unsafe fn engine_of<'a>(ibdev: *const bindings::ib_device) -> Option<&'a Arc<Engine>> {
    // SAFETY: as in `state`; `engine` is written together with `state`.
    unsafe { (*ibdev.cast::<MetaDev>()).engine.as_ref() }
}

/// The netdev of `port` (plane `port - 1`), if it has one, with a reference held until the
/// result is dropped.
///
/// # Safety
///
/// `ibdev` must be a live device.
pub(super) unsafe fn port_netdev(ibdev: *mut bindings::ib_device, port: u32) -> Option<HeldNetDev> {
    // SAFETY: `ibdev` is live; `ib_device_get_netdev` returns null (also for a port out of
    // range) or a held reference, which we hand over to `HeldNetDev`.
    unsafe { HeldNetDev::from_held(bindings::ib_device_get_netdev(ibdev, port)) }
}

/// `rdma link add NAME type metaroce netdev NDEV`: a device of one port (plane 0 on `ndev`).
pub(super) fn add_device(name: *const c_char, ndev: &NetDev<'_>) -> Result {
    // SAFETY: `ndev` is alive for the call; a non-null result is a reference we must put.
    let existing = unsafe { bindings::ib_device_get_by_netdev(ndev.as_ptr(), DRIVER_ID) };
    if !existing.is_null() {
        // SAFETY: `existing` is the reference `ib_device_get_by_netdev` gave us.
        unsafe { bindings::ib_device_put(existing) };
        return Err(EEXIST);
    }
    create(name, &[ndev], None)
}

/// The settings a device keeps when it is made again with one more plane (`grow`).
#[derive(Clone, Copy)]
struct Settings {
    paths: u32,
    max_peers: u32,
}

/// Registers a device called `name` with one port per netdev of `ndevs` (plane `k` on
/// `ndevs[k]`, port `k + 1`) and, if given, `settings`.
fn create(name: *const c_char, ndevs: &[&NetDev<'_>], settings: Option<Settings>) -> Result {
    let ndev = *ndevs.first().ok_or(EINVAL)?;
    let ports = u32::try_from(ndevs.len()).map_err(|_| EINVAL)?;
    if ports > crate::device::MAX_PLANES {
        return Err(ENOSPC);
    }
    let state = Device::new(ndev)?;
    // SAFETY: `_ib_alloc_device` allocates and zeroes at least `size_of::<MetaDev>()` bytes
    // with the `ib_device` at offset 0; `init_net` is the initial namespace, always alive (the
    // device follows its netdev's namespace through the RDMA core's shared mode).
    let ibdev = unsafe {
        bindings::_ib_alloc_device(size_of::<MetaDev>(), ptr::addr_of_mut!(bindings::init_net))
    };
    let ibdev = NonNull::new(ibdev).ok_or(ENOMEM)?.as_ptr();
    let dev = ibdev.cast::<MetaDev>();
    let node_guid = state.node_guid();
    let mtu = crate::device::payload_mtu(ndev.mtu());
    let counters = state.counters_arc();
    let plane_counters = state.plane_counters();
    let parts = Arc::pin_init(Verbs::new(), GFP_KERNEL).and_then(|verbs| {
        Ok((
            verbs.clone(),
            Engine::new(verbs, mtu, ndev, counters, plane_counters)?,
        ))
    });
    let (verbs, engine) = match parts {
        Ok((verbs, engine)) => (verbs, Some(engine)),
        Err(e) => {
            // SAFETY: no ops are set yet, so this only frees the memory.
            unsafe { bindings::ib_dealloc_device(ibdev) };
            return Err(e);
        }
    };
    // SAFETY: `dev` is our fresh, exclusively owned allocation; writing `state` before the
    // ops are set means `dealloc_driver` only ever sees it initialised.
    unsafe {
        ptr::addr_of_mut!((*dev).state).write(ManuallyDrop::new(state));
        ptr::addr_of_mut!((*dev).verbs).write(ManuallyDrop::new(verbs));
        ptr::addr_of_mut!((*dev).engine).write(ManuallyDrop::new(engine));
        let ib = &mut *ibdev;
        ib.node_type = bindings::RDMA_NODE_IB_CA as u8;
        // One port per plane: port `k + 1` is plane `k` (`sys::planes`).
        ib.phys_port_cnt = ports;
        ib.num_comp_vectors = bindings::metaroce_glue_num_possible_cpus() as c_int;
        // Kernel consumers' SGEs (virtual DMA) name this key (`sys::kverbs`).
        ib.local_dma_lkey = super::kverbs::KERNEL_LKEY;
        ib.node_guid = node_guid;
        let desc = b"metaroce\0";
        ptr::copy_nonoverlapping(desc.as_ptr().cast(), ib.node_desc.as_mut_ptr(), desc.len());
        ib.link_ops = super::registration::link_ops();
        let ops = device_ops();
        bindings::ib_set_device_ops(ibdev, &ops);
        // The SQ doorbell is an empty POST_SEND; CQ arming is a command too.
        ib.uverbs_cmd_mask |= (1u64 << bindings::ib_uverbs_write_cmds_IB_USER_VERBS_CMD_POST_SEND)
            | (1u64 << bindings::ib_uverbs_write_cmds_IB_USER_VERBS_CMD_REQ_NOTIFY_CQ);
    }
    let mut err = 0;
    // SAFETY: the engine was written above and lives as long as the device.
    if let Some(engine) = unsafe { engine_of(ibdev) } {
        let mut planes = ndevs.iter().enumerate().skip(1);
        let set = planes.try_for_each(|(k, n)| engine.add_plane(k, n));
        let set = set.and_then(|()| match settings {
            Some(s) => engine
                .set_paths(s.paths)
                .and_then(|()| engine.set_max_peers(s.max_peers)),
            None => Ok(()),
        });
        if let Err(e) = set {
            err = e.to_errno();
        }
    }
    for (port, n) in (1..).zip(ndevs) {
        if err == 0 {
            // SAFETY: `ibdev` is ours and not yet registered, `port` is one of its ports;
            // `n` is alive for the call and the core takes its own reference.
            err = unsafe { bindings::ib_device_set_netdev(ibdev, n.as_ptr(), port) };
        }
    }
    if err == 0 {
        // SAFETY: as above; a null DMA device means virtual DMA, as rxe and siw do.
        err = unsafe { bindings::ib_register_device(ibdev, name, ptr::null_mut()) };
    }
    if err != 0 {
        // SAFETY: registration failed, so the device is still only ours; this calls
        // `dealloc_driver`, which drops our state, then frees the memory.
        unsafe { bindings::ib_dealloc_device(ibdev) };
        return Err(Error::from_errno(err));
    }
    Ok(())
}

/// Whether the device has anything of a user's or a kernel consumer's: a user context, a
/// QP, an MR, a memory window or an SRQ (the RDMA core's own GSI QPs, PDs and CQs do not
/// count: they are made again with the device).
///
/// # Safety
///
/// `ibdev` must be a live device of ours.
unsafe fn in_use(ibdev: *mut bindings::ib_device) -> bool {
    // SAFETY: per the contract.
    let (dev, verbs) = unsafe { (state(ibdev), verbs_of(ibdev)) };
    dev.contexts() != 0
        || verbs.qps.lock().live() != 0
        || verbs.mrs.lock().live() != 0
        || verbs.mws.lock().live() != 0
        || verbs.srqs.lock().live() != 0
}

/// Makes the device `ibdev` again with one port more, whose plane is `ndev`: the RDMA core
/// fixes a device's ports when it registers it, and a device shows exactly its planes as
/// ports. `EBUSY` while the device is in use ([`in_use`]), `ENOSPC` with `MAX_PLANES` ports
/// already. The new device has the old one's name, planes and settings (`paths`,
/// `max_peers`), and counters from zero; if it cannot be registered, the old configuration
/// is registered again.
///
/// # Safety
///
/// `ibdev` must be a device of ours on which the caller holds a reference
/// (`ib_device_try_get`), which this consumes. Process context, without RTNL (the RDMA core
/// takes it to unregister and register), serialised with every other call (`sys::planes`).
pub(super) unsafe fn grow(ibdev: *mut bindings::ib_device, ndev: &NetDev<'_>) -> Result {
    // SAFETY: the caller's reference keeps the device and our state alive until the put.
    let put = || unsafe { bindings::ib_device_put(ibdev) };
    // SAFETY: as above.
    let (ports, name, engine) =
        unsafe { ((*ibdev).phys_port_cnt, (*ibdev).name, engine_of(ibdev)) };
    let Some(engine) = engine else {
        put();
        return Err(ENODEV);
    };
    let settings = Settings {
        paths: u32::from(engine.paths()),
        max_peers: engine.max_peers(),
    };
    let mut held = KVec::new();
    for port in 1..=ports {
        // SAFETY: as above.
        match unsafe { port_netdev(ibdev, port) } {
            Some(n) => held.push(n, GFP_KERNEL)?,
            // A port without a plane: the caller fills it instead.
            None => {
                put();
                return Err(EINVAL);
            }
        }
    }
    if ports >= crate::device::MAX_PLANES {
        put();
        return Err(ENOSPC);
    }
    // SAFETY: as above.
    if unsafe { in_use(ibdev) } {
        put();
        return Err(EBUSY);
    }
    let mut planes: KVec<&NetDev<'_>> = KVec::with_capacity(held.len() + 1, GFP_KERNEL)?;
    for n in held.iter() {
        planes.push(&**n, GFP_KERNEL)?;
    }
    planes.push(ndev, GFP_KERNEL)?;
    // SAFETY: our reference, handed over; the core unregisters the device (disassociating
    // nothing: it is not in use), which calls `dealloc_driver`, and frees it once the last
    // reference is gone. `name` is a copy.
    unsafe { bindings::ib_unregister_device_and_put(ibdev) };
    let made = create(name.as_ptr(), &planes, Some(settings));
    if let Err(e) = made {
        pr_warn!("metaroce: a device could not be made again with one more plane ({e:?}); restoring it\n");
        let old = planes.get(..planes.len() - 1).unwrap_or(&[]);
        if let Err(e2) = create(name.as_ptr(), old, Some(settings)) {
            pr_err!("metaroce: the device could not be restored ({e2:?}): it is gone\n");
        }
        return Err(e);
    }
    Ok(())
}

/// Unregisters the device on `ndev`, if we have one (its netdev is going away).
pub(super) fn remove_device_of(ndev: &NetDev<'_>) {
    // SAFETY: `ndev` is alive for the call; a non-null result is a reference we put below.
    let ibdev = unsafe { bindings::ib_device_get_by_netdev(ndev.as_ptr(), DRIVER_ID) };
    if !ibdev.is_null() {
        // SAFETY: we hold a reference, so the device and its data path are alive. Its socket
        // must close now, under RTNL, while the netdev's namespace is intact (kernel sockets
        // hold no reference on it); the device itself goes later, from a workqueue.
        if let Some(engine) = unsafe { engine_of(ibdev) } {
            engine.shutdown();
        }
        // SAFETY: we hold a reference; the queued unregistration takes its own and runs from
        // a workqueue, as the notifier context requires.
        unsafe {
            bindings::ib_unregister_device_queued(ibdev);
            bindings::ib_device_put(ibdev);
        }
    }
}

/// Unregisters every device of this driver (module unload).
pub(super) fn remove_all_devices() {
    // SAFETY: takes no pointers; returns once all our devices are unregistered and freed.
    unsafe { bindings::ib_unregister_driver(DRIVER_ID) }
}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn dealloc_driver(ibdev: *mut bindings::ib_device) {
    // SAFETY: the core calls this once, last, for a device we allocated and initialised.
    unsafe {
        let dev = ibdev.cast::<MetaDev>();
        if let Some(engine) = (*dev).engine.as_ref() {
            engine.shutdown();
        }
        ManuallyDrop::drop(&mut (*dev).engine);
        ManuallyDrop::drop(&mut (*dev).verbs);
        ManuallyDrop::drop(&mut (*dev).state);
    }
}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn query_device(
    ibdev: *mut bindings::ib_device,
    attr: *mut bindings::ib_device_attr,
    udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: the core passes its live device and an attribute struct for us to fill.
    let (dev, attr) = unsafe { (state(ibdev), &mut *attr) };
    // SAFETY: `udata` is null (kernel caller) or the core's live udata.
    if let Some(udata) = unsafe { Udata::from_raw(udata) } {
        // No driver-specific input or output is defined for query_device.
        if udata.inlen() != 0 || udata.outlen() != 0 {
            return EINVAL.to_errno();
        }
    }
    fill_device_attr(dev, attr);
    0
}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn query_port(
    ibdev: *mut bindings::ib_device,
    port: u32,
    attr: *mut bindings::ib_port_attr,
) -> c_int {
    if port == 0 || port > crate::device::MAX_PLANES {
        return EINVAL.to_errno();
    }
    // SAFETY: the core passes an attribute struct for us to fill.
    let attr = unsafe { &mut *attr };
    // SAFETY: `ibdev` is live.
    let ndev = unsafe { port_netdev(ibdev, port) };
    if ndev.is_some() {
        // SAFETY: `ibdev` is live and `attr` ours to fill; a netdev without ethtool speed
        // leaves the core's defaults (SDR x4), which is not an error for us.
        unsafe {
            bindings::ib_get_eth_speed(ibdev, port, &mut attr.active_speed, &mut attr.active_width)
        };
    }
    fill_port_attr(ndev.as_deref(), attr);
    0
}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn query_pkey(
    _ibdev: *mut bindings::ib_device,
    port: u32,
    index: u16,
    pkey: *mut u16,
) -> c_int {
    if port == 0 || port > crate::device::MAX_PLANES || index != 0 {
        return EINVAL.to_errno();
    }
    // SAFETY: the core passes a live `u16` for the result.
    unsafe { *pkey = 0xffff };
    0
}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn get_port_immutable(
    ibdev: *mut bindings::ib_device,
    port: u32,
    immutable: *mut bindings::ib_port_immutable,
) -> c_int {
    let mut attr = bindings::ib_port_attr::default();
    // SAFETY: the core calls this during registration with its live device; `ib_query_port`
    // calls back into `query_port`.
    let err = unsafe { bindings::ib_query_port(ibdev, port, &mut attr) };
    if err != 0 {
        return err;
    }
    // SAFETY: the core passes a live struct for us to fill.
    let immutable = unsafe { &mut *immutable };
    immutable.core_cap_flags = bindings::RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP;
    immutable.pkey_tbl_len = c_int::from(attr.pkey_tbl_len);
    immutable.gid_tbl_len = attr.gid_tbl_len;
    immutable.max_mad_size = bindings::IB_MGMT_MAD_SIZE;
    0
}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn get_link_layer(
    _ibdev: *mut bindings::ib_device,
    _port: u32,
) -> bindings::rdma_link_layer {
    bindings::rdma_link_layer_IB_LINK_LAYER_ETHERNET
}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn alloc_ucontext(
    uctx: *mut bindings::ib_ucontext,
    udata: *mut bindings::ib_udata,
) -> c_int {
    // SAFETY: the core passes the live udata of the uverbs call.
    let Some(udata) = (unsafe { Udata::from_raw(udata) }) else {
        return EINVAL.to_errno();
    };
    let err = to_errno(udata.respond(&ucontext_response()));
    if err == 0 {
        // SAFETY: the core passes a context of its live device (`device` is set).
        unsafe { state((*uctx).device) }.context_opened();
    }
    err
}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn dealloc_ucontext(uctx: *mut bindings::ib_ucontext) {
    // SAFETY: a context `alloc_ucontext` counted, of a device that outlives its contexts.
    unsafe { state((*uctx).device) }.context_closed();
}

/// The device is going (its netdev removed, `rdma link delete`, `rmmod`) while a process still
/// has it open: the core has destroyed every object of the context (each through its destroy
/// op) and zapped its ring mappings, which drops their entries (`ring::mmap_free`), so nothing
/// of ours is left in it. With this op the core does not wait for the process to close the
/// device (the netdev's removal used to block in `unregister_netdevice` until it did) and
/// does not pin the module for it: later calls of the process fail with `EIO`.
///
/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn disassociate_ucontext(_uctx: *mut bindings::ib_ucontext) {}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn alloc_pd(_pd: *mut bindings::ib_pd, _udata: *mut bindings::ib_udata) -> c_int {
    0
}

/// # Safety
///
/// Called only by the RDMA core, with the pointers its `ib_device_ops` contract promises.
unsafe extern "C" fn dealloc_pd(
    _pd: *mut bindings::ib_pd,
    _udata: *mut bindings::ib_udata,
) -> c_int {
    0
}

// What the device reports, from `crate::device`'s constants and the rules' limits.
use super::udata::Udata;
use crate::device::{FW_VERSION, MAX_PATHS, MAX_PD, MAX_PLANES, WIRE_OVERHEAD, WIRE_VERSION};
use crate::verbs_core::{caps::limits, ib::mtu, mcast};

/// `query_device`: what this device can do. Verbs that are not implemented yet report 0.
fn fill_device_attr(dev: &Device, attr: &mut bindings::ib_device_attr) {
    *attr = bindings::ib_device_attr::default();
    attr.fw_ver = FW_VERSION;
    attr.sys_image_guid = dev.node_guid();
    attr.vendor_id = 0xff_ffff;
    attr.vendor_part_id = 0;
    attr.hw_ver = WIRE_VERSION;
    attr.max_mr_size = u64::MAX;
    attr.page_size_cap = 0xffff_f000;
    attr.max_pd = MAX_PD;
    attr.max_pkeys = 1;
    attr.max_qp = limits::MAX_QP;
    attr.max_qp_wr = limits::MAX_QP_WR;
    attr.max_send_sge = limits::MAX_SEND_SGE;
    attr.max_recv_sge = limits::MAX_RECV_SGE;
    attr.max_sge_rd = limits::MAX_SEND_SGE;
    attr.max_cq = limits::MAX_CQ;
    attr.max_cqe = limits::MAX_CQE;
    attr.max_mr = limits::MAX_MR;
    attr.max_srq = limits::MAX_SRQ;
    attr.max_srq_wr = limits::MAX_SRQ_WR;
    attr.max_srq_sge = limits::MAX_RECV_SGE;
    attr.max_qp_rd_atom = limits::MAX_RD_ATOM;
    attr.max_qp_init_rd_atom = limits::MAX_RD_ATOM;
    attr.max_res_rd_atom = limits::MAX_RD_ATOM * limits::MAX_QP;
    attr.atomic_cap = bindings::ib_atomic_cap_IB_ATOMIC_HCA;
    // Fast registration for kernel consumers (`verbs_core::frwr`).
    attr.max_fast_reg_page_list_len = crate::verbs_core::frwr::MAX_PAGES;
    attr.max_mw = limits::MAX_MW;
    // Multicast for UD QPs (`verbs_core::mcast`).
    attr.max_mcast_grp = mcast::MAX_GROUPS as u32;
    attr.max_mcast_qp_attach = mcast::MAX_ATTACH as u32;
    attr.max_total_mcast_qp_attach = (mcast::MAX_GROUPS * mcast::MAX_ATTACH) as u32;
    // Memory windows of type 1 and 2B (`verbs_core::mw`); SRQ resize; ATOMIC WRITE; RDMA
    // FLUSH to global visibility (no persistent memory: no IB_DEVICE_FLUSH_PERSISTENT, so the
    // core refuses MRs that ask for it); fast registration and local invalidate for kernel
    // consumers (IB_DEVICE_MEM_MGT_EXTENSIONS: NVMe-oF, NFS over RDMA require it).
    attr.device_cap_flags = (bindings::ib_device_cap_flags_IB_DEVICE_RC_RNR_NAK_GEN
        | bindings::ib_device_cap_flags_IB_DEVICE_MEM_MGT_EXTENSIONS
        | bindings::ib_device_cap_flags_IB_DEVICE_MEM_WINDOW
        | bindings::ib_device_cap_flags_IB_DEVICE_MEM_WINDOW_TYPE_2B
        | bindings::ib_device_cap_flags_IB_DEVICE_SRQ_RESIZE
        | bindings::ib_device_cap_flags_IB_DEVICE_ATOMIC_WRITE
        | bindings::ib_device_cap_flags_IB_DEVICE_FLUSH_GLOBAL) as u64;
    // `rdma link delete` may remove the device, as it may any soft device's.
    attr.kernel_cap_flags = u64::from(bindings::ib_kernel_cap_flags_IBK_ALLOW_USER_UNREG)
        | u64::from(bindings::ib_kernel_cap_flags_IBK_LOCAL_DMA_LKEY);
}

/// `query_port`: the port's state follows its netdev; a port without one (a plane not
/// added) is down.
fn fill_port_attr(ndev: Option<&NetDev<'_>>, attr: &mut bindings::ib_port_attr) {
    // Speed and width were filled by the caller from the netdev's ethtool settings.
    let (speed, width) = (attr.active_speed, attr.active_width);
    *attr = bindings::ib_port_attr::default();
    attr.active_speed = speed;
    attr.active_width = width;
    attr.gid_tbl_len = 32;
    attr.port_cap_flags = bindings::ib_port_capability_mask_bits_IB_PORT_CM_SUP;
    attr.max_msg_sz = 1 << 31;
    attr.pkey_tbl_len = 1;
    attr.max_mtu = bindings::ib_mtu_IB_MTU_4096;
    let Some(ndev) = ndev else {
        attr.active_mtu = bindings::ib_mtu_IB_MTU_256;
        attr.state = bindings::ib_port_state_IB_PORT_DOWN;
        attr.phys_state = bindings::ib_port_phys_state_IB_PORT_PHYS_STATE_DISABLED as u8;
        return;
    };
    attr.active_mtu = mtu::largest_within(ndev.mtu().saturating_sub(WIRE_OVERHEAD));
    attr.state = ndev.port_state();
    attr.phys_state = if attr.state == bindings::ib_port_state_IB_PORT_ACTIVE {
        bindings::ib_port_phys_state_IB_PORT_PHYS_STATE_LINK_UP as u8
    } else if ndev.is_up() {
        bindings::ib_port_phys_state_IB_PORT_PHYS_STATE_POLLING as u8
    } else {
        bindings::ib_port_phys_state_IB_PORT_PHYS_STATE_DISABLED as u8
    };
}

/// The response to `alloc_ucontext` (`ibv_open_device`).
fn ucontext_response() -> bindings::metaroce_alloc_ucontext_resp {
    bindings::metaroce_alloc_ucontext_resp {
        abi_version: super::UVERBS_ABI_VERSION,
        wire_version: WIRE_VERSION,
        max_paths: MAX_PATHS,
        max_planes: MAX_PLANES,
        reserved: [0; 2],
    }
}
