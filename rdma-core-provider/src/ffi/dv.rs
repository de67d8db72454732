// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! The exported direct verbs (`metaroce_dv.h`, versioned `METAROCE_1.0` and `METAROCE_1.1`): the
//! argument checks, recognising our devices and QPs, the `ibv_cmd_modify_qp_ex` call, the
//! rings' addresses and the doorbell, and the copy-out to the caller. The command, the buffer
//! size, checking/converting the response and describing a ring are safe code in
//! [`crate::dv`].

use super::{guard, lock, outer, ring_doorbell, sys, Qp, DEVICE_OPS, PANIC_ERRNO};
use crate::dv;
use core::ffi::c_int;
use core::mem::size_of;
use core::ptr;

const EINVAL: c_int = sys::EINVAL as c_int;
const ENOMEM: c_int = sys::ENOMEM as c_int;
const EOPNOTSUPP: c_int = sys::EOPNOTSUPP as c_int;

// Each function's symbol gets the version METAROCE_1.0 (defined by libmetaroce.map, which
// build.rs gives the linker of the cdylib only; unit-test binaries have neither). `@@@` makes
// it the default version and renames the definition itself, so no unversioned alias remains.
#[cfg(not(test))]
core::arch::global_asm!(
    ".symver metaroce_dv_is_supported, metaroce_dv_is_supported@@@METAROCE_1.0",
    ".symver metaroce_dv_query_qp, metaroce_dv_query_qp@@@METAROCE_1.0",
    ".symver metaroce_dv_set_qp_planes, metaroce_dv_set_qp_planes@@@METAROCE_1.0",
    ".symver metaroce_dv_qp_rings, metaroce_dv_qp_rings@@@METAROCE_1.1",
    ".symver metaroce_dv_qp_doorbell, metaroce_dv_qp_doorbell@@@METAROCE_1.1",
);

/// Whether `device` is bound to this provider, as rdma-core's `is_mlx5_dev()`: its
/// `verbs_device` carries our `verbs_device_ops`. A second copy of the provider loaded from
/// another file has other ops, so its devices are not ours.
///
/// # Safety
/// `device` must be NULL or a live `ibv_device` of libibverbs.
unsafe fn is_ours(device: *mut sys::ibv_device) -> bool {
    if device.is_null() {
        return false;
    }
    // SAFETY: libibverbs allocates every ibv_device as the first field of a verbs_device
    // (driver.h: "Must be first") and sets `ops` before it hands the device out.
    let ops = unsafe { (*device.cast::<sys::verbs_device>()).ops };
    ptr::eq(ops, &DEVICE_OPS.0)
}

/// Whether `qp` (not NULL) belongs to a context of one of our devices.
///
/// # Safety
/// `qp` must point to a readable `ibv_qp`: a live QP of libibverbs, or one whose `context` is
/// NULL.
unsafe fn qp_is_ours(qp: *mut sys::ibv_qp) -> bool {
    // SAFETY: per the contract; a live QP's context and its device outlive it.
    unsafe {
        let ctx = (*qp).context;
        !ctx.is_null() && is_ours((*ctx).device)
    }
}

/// The response buffer of one call: zeroed 8-byte words (libibverbs' _ex write path counts
/// the response in words, and every field is at most 8-aligned), room for `room` paths.
struct RespBuf {
    words: Vec<u64>,
    room: usize,
}

impl RespBuf {
    fn new(room: usize) -> Result<Self, c_int> {
        let n = dv::resp_size(room) / 8;
        let mut words = Vec::new();
        words.try_reserve_exact(n).map_err(|_| ENOMEM)?;
        words.resize(n, 0);
        Ok(Self { words, room })
    }

    fn len(&self) -> usize {
        self.words.len() * 8
    }

    fn as_mut_ptr(&mut self) -> *mut sys::metaroce_cmd_modify_qp_resp {
        self.words.as_mut_ptr().cast()
    }

    /// Our part of the response (the fixed fields).
    fn drv(&self) -> &sys::metaroce_modify_qp_resp {
        // SAFETY: the buffer holds at least resp_size(0) = size_of::<metaroce_cmd_modify_qp_resp>()
        // initialised bytes (zeroed, then what the kernel wrote), 8-aligned; the struct is
        // plain integers (any bit pattern is valid) and its flexible array is zero-sized.
        unsafe {
            &(*self
                .words
                .as_ptr()
                .cast::<sys::metaroce_cmd_modify_qp_resp>())
            .drv_payload
        }
    }

    /// The first `n` entries of `paths[]`; `n` must not exceed the room.
    fn paths(&self, n: usize) -> &[sys::metaroce_path_info] {
        assert!(n <= self.room);
        // SAFETY: PATHS_OFFSET + room * entry size = resp_size(room) bytes are in the buffer,
        // initialised; PATHS_OFFSET is a multiple of 8, so the entries are aligned; they are
        // plain integers.
        unsafe {
            let first = self.words.as_ptr().cast::<u8>().add(dv::PATHS_OFFSET);
            core::slice::from_raw_parts(first.cast::<sys::metaroce_path_info>(), n)
        }
    }
}

/// One extended modify_qp that changes no standard attribute (attr_mask 0), carrying the
/// driver command `drv`, with room for `room` paths in the response. Errors are errno values.
///
/// # Safety
/// `qp` must be a live QP of one of our devices.
unsafe fn modify_qp_dv(
    qp: *mut sys::ibv_qp,
    drv: sys::metaroce_modify_qp_cmd,
    room: usize,
) -> Result<RespBuf, c_int> {
    let mut resp = RespBuf::new(room)?;
    let resp_len = resp.len();
    // SAFETY: all-zero is a valid request (libibverbs fills in the core part) and a valid
    // attribute set (attr_mask 0: libibverbs reads none of it).
    let mut cmd: sys::metaroce_cmd_modify_qp = unsafe { core::mem::zeroed() };
    let mut attr: sys::ibv_qp_attr = unsafe { core::mem::zeroed() };
    cmd.drv_payload = drv;
    // SAFETY: qp is live (contract). The request pointer covers the whole command (core, then
    // ours) whose size is passed; the response is resp_len writable, 8-aligned bytes that live
    // until we return.
    let ret = unsafe {
        sys::ibv_cmd_modify_qp_ex(
            qp,
            &mut attr,
            0,
            ptr::addr_of_mut!(cmd).cast::<sys::ibv_modify_qp_ex>(),
            size_of::<sys::metaroce_cmd_modify_qp>(),
            resp.as_mut_ptr().cast::<sys::ib_uverbs_ex_modify_qp_resp>(),
            resp_len,
        )
    };
    match ret {
        0 => Ok(resp),
        // ibv_cmd_* return the errno value.
        e => Err(e.abs()),
    }
}

/// `bool metaroce_dv_is_supported(struct ibv_device *device)`.
///
/// # Safety
/// `device` must be NULL or a device of `ibv_get_device_list()` (not yet freed).
#[no_mangle]
pub unsafe extern "C" fn metaroce_dv_is_supported(device: *mut sys::ibv_device) -> bool {
    // SAFETY: per the contract.
    guard(false, || unsafe { is_ours(device) })
}

/// `int metaroce_dv_query_qp(struct ibv_qp *qp, struct metaroce_dv_qp_info *info)`.
///
/// # Safety
/// `qp` must be NULL or a live QP; `info` NULL or the caller's struct, whose `paths` points
/// to at least `num_path_entries` writable entries (or is NULL with capacity 0).
#[no_mangle]
pub unsafe extern "C" fn metaroce_dv_query_qp(
    qp: *mut sys::ibv_qp,
    info: *mut sys::metaroce_dv_qp_info,
) -> c_int {
    guard(PANIC_ERRNO, || {
        if qp.is_null() || info.is_null() {
            return EINVAL;
        }
        // SAFETY: info is the caller's live struct (contract).
        let (capacity, paths) = unsafe { ((*info).num_path_entries, (*info).paths) };
        if paths.is_null() && capacity > 0 {
            return EINVAL;
        }
        // SAFETY: qp is a live QP (contract).
        if !unsafe { qp_is_ours(qp) } {
            return EOPNOTSUPP;
        }
        let room = dv::path_room(capacity);
        // SAFETY: a live QP of ours.
        let resp = match unsafe { modify_qp_dv(qp, dv::query_cmd(), room) } {
            Ok(resp) => resp,
            Err(errno) => return errno,
        };
        let filled = match dv::check_resp(resp.drv(), room) {
            Ok(n) => n,
            Err(e) => return e.errno(),
        };
        for (i, p) in resp.paths(filled).iter().enumerate() {
            // SAFETY: i < filled <= room <= capacity: an entry of the caller's array.
            unsafe { paths.add(i).write(dv::dv_path(p)) };
        }
        // SAFETY: info is the caller's live struct (contract).
        unsafe { info.write(dv::qp_info(resp.drv(), filled, paths)) };
        0
    })
}

/// `int metaroce_dv_set_qp_planes(struct ibv_qp *qp, uint32_t plane_mask)`.
///
/// # Safety
/// `qp` must be NULL or a live QP.
#[no_mangle]
pub unsafe extern "C" fn metaroce_dv_set_qp_planes(qp: *mut sys::ibv_qp, plane_mask: u32) -> c_int {
    guard(PANIC_ERRNO, || {
        if qp.is_null() {
            return EINVAL;
        }
        // SAFETY: qp is a live QP (contract).
        if !unsafe { qp_is_ours(qp) } {
            return EOPNOTSUPP;
        }
        // SAFETY: a live QP of ours.
        match unsafe { modify_qp_dv(qp, dv::set_planes_cmd(plane_mask), 0) } {
            // A kernel that did not answer did not understand the request either.
            Ok(resp) => dv::check_resp(resp.drv(), 0).map_or_else(|e| e.errno(), |_| 0),
            Err(errno) => errno,
        }
    })
}

/// `int metaroce_dv_qp_rings(struct ibv_qp *qp, struct metaroce_dv_qp_rings *rings)`.
///
/// # Safety
/// `qp` must be NULL or a live QP; `rings` NULL or the caller's writable struct.
#[no_mangle]
pub unsafe extern "C" fn metaroce_dv_qp_rings(
    qp: *mut sys::ibv_qp,
    rings: *mut sys::metaroce_dv_qp_rings,
) -> c_int {
    guard(PANIC_ERRNO, || {
        if qp.is_null() || rings.is_null() {
            return EINVAL;
        }
        // SAFETY: qp is a live QP (contract).
        if !unsafe { qp_is_ours(qp) } {
            return EOPNOTSUPP;
        }
        let ours = outer::<_, Qp>(qp);
        // SAFETY: a QP of our device was made by our create_qp: it is the `qp` of a live Qp,
        // whose sq/rq are set before it is handed out and never change.
        let (sq, rq) = unsafe { (&(*ours).sq, &(*ours).rq) };
        // The ring's address never changes: no need to wait for an ibv_wr_* batch to end.
        let sq = sq
            .as_ref()
            .map(|m| m.peek(|s| dv::dv_ring(s.ring.ring().base(), s.ring.ring().geometry())));
        let rq = rq.as_ref().map(|m| {
            let p = lock(m);
            dv::dv_ring(p.ring().base(), p.ring().geometry())
        });
        // SAFETY: rings is the caller's writable struct (contract).
        unsafe { rings.write(dv::qp_rings(sq, rq)) };
        0
    })
}

/// `int metaroce_dv_qp_doorbell(struct ibv_qp *qp)`.
///
/// # Safety
/// `qp` must be NULL or a live QP.
#[no_mangle]
pub unsafe extern "C" fn metaroce_dv_qp_doorbell(qp: *mut sys::ibv_qp) -> c_int {
    guard(PANIC_ERRNO, || {
        if qp.is_null() {
            return EINVAL;
        }
        // SAFETY: qp is a live QP (contract).
        if !unsafe { qp_is_ours(qp) } {
            return EOPNOTSUPP;
        }
        // SAFETY: a live QP of an open context of ours.
        unsafe { ring_doorbell(qp) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prototypes of metaroce_dv.h (bindgen'd) and the definitions have the same types.
    #[test]
    fn definitions_match_the_header() {
        let _: [unsafe extern "C" fn(*mut sys::ibv_device) -> bool; 2] =
            [sys::metaroce_dv_is_supported, metaroce_dv_is_supported];
        let _: [unsafe extern "C" fn(*mut sys::ibv_qp, *mut sys::metaroce_dv_qp_info) -> c_int; 2] =
            [sys::metaroce_dv_query_qp, metaroce_dv_query_qp];
        let _: [unsafe extern "C" fn(*mut sys::ibv_qp, u32) -> c_int; 2] =
            [sys::metaroce_dv_set_qp_planes, metaroce_dv_set_qp_planes];
        let _: [unsafe extern "C" fn(*mut sys::ibv_qp, *mut sys::metaroce_dv_qp_rings) -> c_int;
            2] = [sys::metaroce_dv_qp_rings, metaroce_dv_qp_rings];
        let _: [unsafe extern "C" fn(*mut sys::ibv_qp) -> c_int; 2] =
            [sys::metaroce_dv_qp_doorbell, metaroce_dv_qp_doorbell];
    }

    /// A device as libibverbs makes it, with the given ops.
    fn device(ops: *const sys::verbs_device_ops) -> Box<sys::verbs_device> {
        // SAFETY: verbs_device is integers, pointers and a list node: all-zero is valid.
        let mut dev: Box<sys::verbs_device> = Box::new(unsafe { core::mem::zeroed() });
        dev.ops = ops;
        dev
    }

    /// A context of `dev` and a QP of it (only the pointers the checks follow are set).
    fn qp_of(dev: &mut sys::verbs_device) -> (Box<sys::ibv_context>, Box<sys::ibv_qp>) {
        // SAFETY: both are integers, pointers and pthread objects: all-zero is valid.
        let mut ctx: Box<sys::ibv_context> = Box::new(unsafe { core::mem::zeroed() });
        ctx.device = &mut dev.device;
        // SAFETY: as above.
        let mut qp: Box<sys::ibv_qp> = Box::new(unsafe { core::mem::zeroed() });
        qp.context = &mut *ctx;
        (ctx, qp)
    }

    fn info(paths: *mut sys::metaroce_dv_path, capacity: u32) -> sys::metaroce_dv_qp_info {
        sys::metaroce_dv_qp_info {
            plane_mask: 0xdead,
            connected: 0xdead,
            planes: 0xdead,
            planes_up: 0xdead,
            num_paths: 0xdead,
            qps: 0xdead,
            num_path_entries: capacity,
            comp_mask: 0,
            paths,
        }
    }

    #[test]
    fn recognises_our_devices_only() {
        // SAFETY: only read through as a table libibverbs would hold; all-zero is valid.
        let other_ops: Box<sys::verbs_device_ops> = Box::new(unsafe { core::mem::zeroed() });
        let mut ours = device(&DEVICE_OPS.0);
        let mut theirs = device(&*other_ops);
        // SAFETY: NULL or live devices.
        unsafe {
            assert!(metaroce_dv_is_supported(&mut ours.device));
            assert!(!metaroce_dv_is_supported(&mut theirs.device));
            assert!(!metaroce_dv_is_supported(ptr::null_mut()));
        }
    }

    #[test]
    fn refuses_null_and_foreign_qps() {
        // SAFETY: as above.
        let other_ops: Box<sys::verbs_device_ops> = Box::new(unsafe { core::mem::zeroed() });
        let mut theirs = device(&*other_ops);
        let (_ctx, mut qp) = qp_of(&mut theirs);
        // SAFETY: as above.
        let mut orphan: Box<sys::ibv_qp> = Box::new(unsafe { core::mem::zeroed() });
        let mut paths = [dv::dv_path(&unsafe { core::mem::zeroed() }); 2];
        let mut inf = info(paths.as_mut_ptr(), 2);
        // SAFETY: NULL or readable QPs (none of ours, so no command is issued); inf and paths
        // are live.
        unsafe {
            assert_eq!(metaroce_dv_query_qp(ptr::null_mut(), &mut inf), EINVAL);
            assert_eq!(metaroce_dv_query_qp(&mut *qp, ptr::null_mut()), EINVAL);
            let mut no_array = info(ptr::null_mut(), 1);
            assert_eq!(metaroce_dv_query_qp(&mut *qp, &mut no_array), EINVAL);
            assert_eq!(metaroce_dv_query_qp(&mut *qp, &mut inf), EOPNOTSUPP);
            assert_eq!(metaroce_dv_query_qp(&mut *orphan, &mut inf), EOPNOTSUPP);
            let mut no_array = info(ptr::null_mut(), 0);
            assert_eq!(
                metaroce_dv_query_qp(&mut *orphan, &mut no_array),
                EOPNOTSUPP
            );
            assert_eq!(metaroce_dv_set_qp_planes(ptr::null_mut(), 1), EINVAL);
            assert_eq!(metaroce_dv_set_qp_planes(&mut *qp, 1), EOPNOTSUPP);
            assert_eq!(metaroce_dv_set_qp_planes(&mut *orphan, 0), EOPNOTSUPP);
            let mut rings: sys::metaroce_dv_qp_rings = core::mem::zeroed();
            rings.comp_mask = 0xdead;
            assert_eq!(metaroce_dv_qp_rings(ptr::null_mut(), &mut rings), EINVAL);
            assert_eq!(metaroce_dv_qp_rings(&mut *qp, ptr::null_mut()), EINVAL);
            assert_eq!(metaroce_dv_qp_rings(&mut *qp, &mut rings), EOPNOTSUPP);
            assert_eq!(metaroce_dv_qp_rings(&mut *orphan, &mut rings), EOPNOTSUPP);
            assert_eq!(rings.comp_mask, 0xdead);
            assert!(rings.sq.buf.is_null());
            assert_eq!(metaroce_dv_qp_doorbell(ptr::null_mut()), EINVAL);
            assert_eq!(metaroce_dv_qp_doorbell(&mut *qp), EOPNOTSUPP);
            assert_eq!(metaroce_dv_qp_doorbell(&mut *orphan), EOPNOTSUPP);
        }
        // Failures leave the caller's struct alone.
        assert_eq!((inf.plane_mask, inf.num_path_entries), (0xdead, 2));
    }

    #[test]
    fn response_buffer() {
        for room in [0, 1, 3, 256] {
            let mut buf = RespBuf::new(room).unwrap();
            assert_eq!(buf.len(), dv::resp_size(room));
            assert!(buf.words.iter().all(|w| *w == 0));
            // Zeroed: a kernel that wrote nothing.
            assert_eq!(
                dv::check_resp(buf.drv(), room),
                Err(dv::RespError::NotAnswered)
            );
            // What the kernel writes lands where drv() and paths() read it.
            let base = buf.as_mut_ptr().cast::<u8>();
            // SAFETY: offsets inside the buffer (resp_size(room) bytes), 4- and 2-aligned.
            unsafe {
                base.add(8).cast::<u32>().write(32 + 56 * room as u32); // response_length
                base.add(8 + 20).cast::<u32>().write(room as u32); // num_paths
                base.add(8 + 28).cast::<u32>().write(room as u32); // num_path_info
                for i in 0..room {
                    base.add(40 + 56 * i).cast::<u16>().write(i as u16 + 100); // path_id
                }
            }
            assert_eq!(dv::check_resp(buf.drv(), room), Ok(room));
            let ids: Vec<u16> = buf.paths(room).iter().map(|p| p.path_id).collect();
            assert_eq!(ids, (0..room as u16).map(|i| i + 100).collect::<Vec<_>>());
        }
    }
}
