// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Every `unsafe` line of the provider lives here: the generated rdma-core bindings, the
//! `verbs_device_ops` / `verbs_context_ops` tables handed to libibverbs, the callbacks behind
//! them, the constructor that registers the provider, and (in `dv`) the exported direct verbs.
//!
//! Object layout (all memory comes from the C allocator and goes back to `free`):
//! - [`Device`] embeds `struct verbs_device` at offset 0; `alloc_device` callocs it and
//!   `uninit_device` frees it.
//! - [`Context`] embeds `struct verbs_context` at offset 0; libibverbs callocs it in
//!   `_verbs_init_and_alloc_context` and `free_context` frees it.
//!
//! No callback lets a panic escape: each runs its body under [`guard`].

use crate::abi::{self, DeviceInfo};
use crate::ex::WrBatch;
use crate::ring::{Consumer, Geometry, Producer, RingMemory, CONSUMER_OFFSET, PRODUCER_OFFSET};
use crate::session::{Owner, Session};
use crate::wqe::{self, PostError, PostOutcome, SendLimits, SendWr, UdDest};
use core::ffi::{c_int, c_void};
use core::marker::PhantomData;
use core::mem::{offset_of, size_of, MaybeUninit};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The bindgen output for `src/wrapper.h` (rdma-core `driver.h`, `kern-abi.h`, our uapi header).
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unnecessary_transmutes,
    unsafe_op_in_unsafe_fn,
    clippy::all
)]
pub(crate) mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

// The plugin name (libibverbs/libmetaroce-rdmav34.so) and the symbol below are tied to this.
const _: () = assert!(sys::IBVERBS_PABI_VERSION == 34);

/// The exported direct verbs (`metaroce_dv.h`).
mod dv;
/// The extended CQ and QP verbs (`ibv_create_cq_ex`, `ibv_create_qp_ex`, `ibv_wr_*`).
mod ex;

/// Our `struct verbs_device` wrapper. `repr(C)` with `vdev` first, so a `*mut verbs_device`
/// from libibverbs is also a `*mut Device`.
#[repr(C)]
struct Device {
    vdev: sys::verbs_device,
    /// uverbs ABI version of the device's char device, as libibverbs read it.
    abi_ver: u32,
}

/// Our `struct verbs_context` wrapper, allocated by `_verbs_init_and_alloc_context`.
#[repr(C)]
struct Context {
    ibv_ctx: sys::verbs_context,
    info: DeviceInfo,
    /// The device's `phys_port_cnt`, asked the kernel at the first `create_ah` (0: not yet;
    /// calloc's zero bytes are that). It never changes while the device exists.
    num_ports: AtomicU8,
}

const _: () = assert!(offset_of!(Device, vdev) == 0);
const _: () = assert!(offset_of!(Context, ibv_ctx) == 0);

/// Read-only data holding raw pointers, shared with C.
#[repr(transparent)]
struct Shared<T>(T);
// SAFETY: the wrapped tables are immutable statics; their pointers only point to other
// immutable statics ('static strings and tables), so sharing them between threads is sound.
unsafe impl<T> Sync for Shared<T> {}

/// Match by the driver id netlink reports for the device, then the terminating empty entry
/// (`kind == VERBS_MATCH_SENTINEL`).
static MATCH_TABLE: Shared<[sys::verbs_match_ent; 2]> = Shared([
    sys::verbs_match_ent {
        driver_data: ptr::null_mut(),
        u: sys::verbs_match_ent__bindgen_ty_1 {
            driver_id: abi::DRIVER_ID as u64,
        },
        vendor: 0,
        device: 0,
        kind: sys::VERBS_MATCH_DRIVER_ID as u8,
    },
    sys::verbs_match_ent {
        driver_data: ptr::null_mut(),
        u: sys::verbs_match_ent__bindgen_ty_1 { driver_id: 0 },
        vendor: 0,
        device: 0,
        kind: sys::VERBS_MATCH_SENTINEL as u8,
    },
]);

static DEVICE_OPS: Shared<sys::verbs_device_ops> = Shared(sys::verbs_device_ops {
    name: abi::PROVIDER_NAME.as_ptr(),
    match_min_abi_version: abi::UVERBS_ABI_VERSION,
    match_max_abi_version: abi::UVERBS_ABI_VERSION,
    match_table: &MATCH_TABLE.0 as *const sys::verbs_match_ent,
    static_providers: ptr::null_mut(),
    match_device: None,
    alloc_context: Some(alloc_context),
    import_context: None,
    alloc_device: Some(alloc_device),
    uninit_device: Some(uninit_device),
});

/// The context ops. Everything not set stays NULL: `verbs_set_ops` skips NULL entries, so
/// libibverbs keeps its dummy ops, which fail with EOPNOTSUPP.
static CONTEXT_OPS: sys::verbs_context_ops = sys::verbs_context_ops {
    query_device_ex: Some(query_device_ex),
    query_port: Some(query_port),
    free_context: Some(free_context),
    alloc_pd: Some(alloc_pd),
    dealloc_pd: Some(dealloc_pd),
    alloc_mw: Some(alloc_mw),
    bind_mw: Some(bind_mw),
    dealloc_mw: Some(dealloc_mw),
    reg_mr: Some(reg_mr),
    rereg_mr: Some(rereg_mr),
    dereg_mr: Some(dereg_mr),
    create_cq: Some(create_cq),
    create_cq_ex: Some(ex::create_cq_ex),
    poll_cq: Some(poll_cq),
    req_notify_cq: Some(req_notify_cq),
    resize_cq: Some(resize_cq),
    destroy_cq: Some(destroy_cq),
    create_ah: Some(create_ah),
    destroy_ah: Some(destroy_ah),
    create_qp: Some(create_qp),
    create_qp_ex: Some(ex::create_qp_ex),
    query_qp: Some(query_qp),
    modify_qp: Some(modify_qp),
    destroy_qp: Some(destroy_qp),
    post_send: Some(post_send),
    post_recv: Some(post_recv),
    create_srq: Some(create_srq),
    modify_srq: Some(modify_srq),
    query_srq: Some(query_srq),
    destroy_srq: Some(destroy_srq),
    post_srq_recv: Some(post_srq_recv),
    attach_mcast: Some(attach_mcast),
    detach_mcast: Some(detach_mcast),
    // SAFETY: verbs_context_ops holds only `Option<extern "C" fn>` fields, for which all-zero
    // bytes are `None`.
    ..unsafe { core::mem::zeroed() }
};

/// Constructor: `.init_array` entries run when libibverbs dlopens the plugin, like the C
/// providers' `PROVIDER_DRIVER()` constructor. Not in unit-test binaries, which must not
/// register anything.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static REGISTER: extern "C" fn() = register_driver;

#[cfg_attr(test, allow(dead_code))]
extern "C" fn register_driver() {
    // SAFETY: DEVICE_OPS is a fully initialised 'static verbs_device_ops; libibverbs keeps the
    // pointer and only reads through it.
    unsafe { sys::verbs_register_driver_34(&DEVICE_OPS.0) }
}

/// What a verb returns if its Rust body panicked (a bug).
const PANIC_ERRNO: c_int = sys::EIO as c_int;

/// Runs `body`, turning a panic into `on_panic` (nothing may unwind into C).
fn guard<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(on_panic)
}

fn set_errno(value: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *sys::__errno_location() = value }
}

/// `container_of` for a field at `offset` inside `T`.
///
/// # Safety
/// `field` must point at that field of a live `T`.
unsafe fn container_of<F, T>(field: *mut F, offset: usize) -> *mut T {
    // SAFETY: per the contract, stepping back `offset` bytes stays inside the same allocation.
    unsafe { field.byte_sub(offset).cast::<T>() }
}

unsafe extern "C" fn alloc_device(sysfs_dev: *mut sys::verbs_sysfs_dev) -> *mut sys::verbs_device {
    guard(ptr::null_mut(), || {
        // SAFETY: calloc is safe to call; all-zero bytes are a valid Device (integers, raw
        // pointers, `Option<fn>`s). libibverbs fills in the verbs_device fields after we return.
        let dev =
            unsafe { sys::calloc(1, size_of::<Device>() as core::ffi::c_ulong) }.cast::<Device>();
        if dev.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: libibverbs passes its live sysfs device; dev is a fresh allocation.
        unsafe {
            if !sysfs_dev.is_null() {
                (*dev).abi_ver = (*sysfs_dev).abi_ver;
            }
            ptr::addr_of_mut!((*dev).vdev)
        }
    })
}

unsafe extern "C" fn uninit_device(vdev: *mut sys::verbs_device) {
    guard((), || {
        // SAFETY: vdev came from alloc_device, i.e. it is the `vdev` field of a calloc'ed Device,
        // and libibverbs calls this exactly once, after its last use.
        unsafe { sys::free(container_of::<_, Device>(vdev, offset_of!(Device, vdev)).cast()) }
    })
}

unsafe extern "C" fn alloc_context(
    ibdev: *mut sys::ibv_device,
    cmd_fd: c_int,
    _private_data: *mut c_void,
) -> *mut sys::verbs_context {
    guard(ptr::null_mut(), || {
        // SAFETY: the macro verbs_init_and_alloc_context(): calloc a Context, initialise its
        // verbs_context (which takes over cmd_fd, closing it on failure). The offset argument is
        // a byte offset disguised as a pointer, as in the macro.
        let ctx = unsafe {
            sys::_verbs_init_and_alloc_context(
                ibdev,
                cmd_fd,
                size_of::<Context>(),
                ptr::without_provenance_mut(offset_of!(Context, ibv_ctx)),
                abi::DRIVER_ID,
            )
        }
        .cast::<Context>();
        if ctx.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: ctx is a live, initialised Context we own until we return it.
        let vctx = unsafe { ptr::addr_of_mut!((*ctx).ibv_ctx) };

        // SAFETY: all-zero is a valid request (the library fills in the header) and response.
        let mut cmd: sys::ibv_get_context = unsafe { core::mem::zeroed() };
        let mut resp: sys::metaroce_get_context_resp = unsafe { core::mem::zeroed() };
        // SAFETY: vctx is initialised; cmd and resp are live buffers of the sizes passed.
        let ret = unsafe {
            sys::ibv_cmd_get_context(
                vctx,
                &mut cmd,
                size_of::<sys::ibv_get_context>(),
                ptr::addr_of_mut!(resp.ibv_resp),
                size_of::<sys::metaroce_get_context_resp>(),
            )
        };
        let info = if ret == 0 {
            DeviceInfo::from_ucontext_resp(&resp.drv_payload).map_err(|mismatch| {
                // Like the C providers' ABI complaints; never panics (eprintln! would if
                // stderr is closed).
                let _ = writeln!(std::io::stderr(), "{mismatch}");
                abi::ABI_MISMATCH_ERRNO
            })
        } else {
            // ibv_cmd_get_context returns the errno value and leaves errno set.
            Err(ret)
        };
        match info {
            Ok(info) => {
                // SAFETY: ctx and vctx are live; CONTEXT_OPS is 'static.
                unsafe {
                    (*ctx).info = info;
                    sys::verbs_set_ops(vctx, &CONTEXT_OPS);
                }
                vctx
            }
            Err(errno) => {
                // SAFETY: undo _verbs_init_and_alloc_context (closes cmd_fd); ctx is unused after.
                unsafe {
                    sys::verbs_uninit_context(vctx);
                    sys::free(ctx.cast());
                }
                set_errno(errno);
                ptr::null_mut()
            }
        }
    })
}

unsafe extern "C" fn free_context(ibctx: *mut sys::ibv_context) {
    guard((), || {
        // SAFETY: ibctx is the `context` field of the verbs_context inside a Context made by
        // alloc_context; libibverbs calls this once, when the device is closed.
        unsafe {
            let ctx = context_of(ibctx);
            sys::verbs_uninit_context(ptr::addr_of_mut!((*ctx).ibv_ctx));
            sys::free(ctx.cast());
        }
    })
}

unsafe extern "C" fn query_device_ex(
    ibctx: *mut sys::ibv_context,
    input: *const sys::ibv_query_device_ex_input,
    attr: *mut sys::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: all-zero is a valid response buffer.
        let mut resp: sys::ib_uverbs_ex_query_device_resp = unsafe { core::mem::zeroed() };
        let mut resp_size = size_of::<sys::ib_uverbs_ex_query_device_resp>();
        // SAFETY: arguments as libibverbs passed them; resp/resp_size describe a live buffer.
        let ret = unsafe {
            sys::ibv_cmd_query_device_any(ibctx, input, attr, attr_size, &mut resp, &mut resp_size)
        };
        if ret != 0 {
            return ret;
        }
        // SAFETY: libibverbs guarantees attr_size covers at least orig_attr (the first field).
        unsafe {
            let fw_ver = ptr::addr_of_mut!((*attr).orig_attr.fw_ver);
            fw_ver.write(abi::fw_ver_string(resp.base.fw_ver));
        }
        0
    })
}

unsafe extern "C" fn query_port(
    ibctx: *mut sys::ibv_context,
    port_num: u8,
    port_attr: *mut sys::ibv_port_attr,
) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: all-zero is a valid request; the library fills it in.
        let mut cmd: sys::ibv_query_port = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them; cmd is a live buffer of the size passed.
        unsafe {
            sys::ibv_cmd_query_port(
                ibctx,
                port_num,
                port_attr,
                &mut cmd,
                size_of::<sys::ibv_query_port>(),
            )
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Data path: PDs, MRs, CQs, QPs, SRQs and their shared-memory rings.
//
// Object layout: each object embeds the libibverbs structure at offset 0 (`ibv_pd`,
// `verbs_mr`, `verbs_cq`, `verbs_qp`, `verbs_srq`) and is a `Box` leaked to libibverbs by the
// create verb and reclaimed by the destroy verb once the kernel destroyed its side. The
// libibverbs part is written by libibverbs behind our back (e.g. `qp->state`), so the code never
// forms a reference to a whole object, only to our own fields (mutexes and plain values set
// before the object is handed out).

/// Entry types that may live in a ring shared with the kernel.
///
/// # Safety
/// Plain old data: `repr(C)`, a multiple of 8 bytes and 8-byte aligned, no padding-sensitive
/// invariants, every bit pattern valid; `MIN_SIZE` a multiple of 8, at most its size.
unsafe trait RingEntry: Copy {
    /// The smallest `entry_size` a ring of these may have: a ring of smaller entries than the
    /// type holds (send and receive entries, sized by the QP's SGEs) takes the type's first
    /// `entry_size` bytes, and gives back those bytes with zeroes after them.
    const MIN_SIZE: usize = size_of::<Self>();
}
// SAFETY: the bindgen'd WQE structure and plain SGEs (fixed-width integers and a union of
// integer arrays, no padding: `wqe.rs` asserts the layout); its first 256 bytes are the ABI's
// smallest send entry.
unsafe impl RingEntry for wqe::SendEntry {
    const MIN_SIZE: usize = size_of::<sys::metaroce_send_wqe>();
}
// SAFETY: as above (128 bytes: the smallest receive entry).
unsafe impl RingEntry for wqe::RecvEntry {
    const MIN_SIZE: usize = size_of::<sys::metaroce_recv_wqe>();
}
// SAFETY: a bindgen'd struct of fixed-width integers.
unsafe impl RingEntry for sys::metaroce_cqe {}

/// One ring inside a mapping shared with the kernel. Indices are accessed as atomics, entries
/// copied with volatile reads/writes; no `&`/`&mut` to an entry is ever formed.
#[derive(Debug)]
struct MappedRing<T> {
    base: NonNull<u8>,
    geo: Geometry,
    /// Bytes of an entry this ring holds: `T`'s size, or the stride if that is smaller.
    copy: usize,
    _entry: PhantomData<T>,
}

// SAFETY: the ring is plain shared memory; all access goes through atomics or volatile copies,
// and every user serialises producer/consumer work with a Mutex.
unsafe impl<T> Send for MappedRing<T> {}

impl<T: RingEntry> MappedRing<T> {
    /// # Safety
    /// `base` must point to `geo.map_len` readable and writable bytes, 8-byte aligned, that
    /// stay mapped while the ring is used, and `geo` must come from
    /// `Geometry::new(.., T::MIN_SIZE)` (so every entry offset is in bounds).
    unsafe fn new(base: NonNull<u8>, geo: Geometry) -> Self {
        debug_assert!(geo.stride >= T::MIN_SIZE && geo.map_len >= crate::ring::HDR_SIZE);
        debug_assert!(base.as_ptr().align_offset(8) == 0);
        Self {
            base,
            geo,
            copy: geo.stride.min(size_of::<T>()),
            _entry: PhantomData,
        }
    }

    fn index(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: offset is PRODUCER_OFFSET or CONSUMER_OFFSET, inside the 128-byte header of
        // the mapping (new()'s contract) and 4-byte aligned. The other side accesses these words
        // only with atomic (READ_ONCE / smp_load_acquire / smp_store_release) operations.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    /// The start of the mapping (the ring header).
    fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    fn geometry(&self) -> &Geometry {
        &self.geo
    }

    fn entry(&self, index: u32) -> *mut u64 {
        // SAFETY: entry_offset(index) + stride <= map_len for a checked geometry, and is
        // 8-byte aligned (stride and header are multiples of 8).
        unsafe { self.base.as_ptr().add(self.geo.entry_offset(index)).cast() }
    }
}

impl<T: RingEntry> RingMemory for MappedRing<T> {
    type Entry = T;
    fn num_entries(&self) -> u32 {
        self.geo.num_entries
    }
    fn load_producer(&self) -> u32 {
        self.index(PRODUCER_OFFSET).load(Ordering::Acquire)
    }
    fn load_consumer(&self) -> u32 {
        self.index(CONSUMER_OFFSET).load(Ordering::Acquire)
    }
    fn store_producer(&self, value: u32) {
        self.index(PRODUCER_OFFSET).store(value, Ordering::Release)
    }
    fn store_consumer(&self, value: u32) {
        self.index(CONSUMER_OFFSET).store(value, Ordering::Release)
    }
    fn write_entry(&self, index: u32, entry: &T) {
        let dst = self.entry(index);
        if self.copy == size_of::<T>() {
            // SAFETY: an in-bounds aligned slot of at least T's size (see entry()); the
            // consumer does not read this slot before the release store of `producer` that
            // publishes it.
            return unsafe { ptr::write_volatile(dst.cast::<T>(), *entry) };
        }
        let src = ptr::from_ref(entry).cast::<u64>();
        for i in 0..self.copy / 8 {
            // SAFETY: i * 8 < copy <= stride and size_of::<T>(): inside the slot and `entry`,
            // both 8-byte aligned (RingEntry); the slot is ours as above.
            unsafe { dst.add(i).write_volatile(src.add(i).read()) };
        }
    }
    fn read_entry(&self, index: u32) -> T {
        let src = self.entry(index);
        if self.copy == size_of::<T>() {
            // SAFETY: in-bounds aligned slot; T accepts any bit pattern (RingEntry); the
            // producer does not rewrite the slot before our release store of `consumer` frees
            // it.
            return unsafe { ptr::read_volatile(src.cast::<T>()) };
        }
        let mut out = MaybeUninit::<T>::zeroed();
        let dst = out.as_mut_ptr().cast::<u64>();
        for i in 0..self.copy / 8 {
            // SAFETY: as in write_entry.
            unsafe { dst.add(i).write(src.add(i).read_volatile()) };
        }
        // SAFETY: zeroed, then bytes written: any bit pattern is a T (RingEntry).
        unsafe { out.assume_init() }
    }
}

/// An mmap() of the uverbs fd, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    addr: NonNull<c_void>,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: addr/len are exactly what mmap() returned and nobody uses the range after
        // the owning object is dropped.
        unsafe { sys::munmap(self.addr.as_ptr(), self.len) };
    }
}

/// Maps the ring `info` describes from `cmd_fd`. Errors are errno values.
fn map_ring<T: RingEntry>(
    cmd_fd: c_int,
    info: &sys::metaroce_mmap_info,
    what: &str,
) -> Result<(Mapping, MappedRing<T>), c_int> {
    let geo = Geometry::new(info, T::MIN_SIZE).map_err(|e| {
        let _ = writeln!(std::io::stderr(), "metaroce: {what}: {e}");
        abi::ABI_MISMATCH_ERRNO
    })?;
    let offset = sys::__off_t::try_from(geo.offset).map_err(|_| sys::EINVAL as c_int)?;
    // SAFETY: a fresh shared mapping chosen by the kernel; no existing memory is affected.
    let addr = unsafe {
        sys::mmap(
            ptr::null_mut(),
            geo.map_len,
            (sys::PROT_READ | sys::PROT_WRITE) as c_int,
            sys::MAP_SHARED as c_int,
            cmd_fd,
            offset,
        )
    };
    if addr as usize == usize::MAX {
        // MAP_FAILED
        return Err(errno());
    }
    let addr = NonNull::new(addr).ok_or(sys::EIO as c_int)?;
    let mapping = Mapping {
        addr,
        len: geo.map_len,
    };
    // SAFETY: the mapping is map_len bytes, page aligned, read/write, and lives in the same
    // object as the ring (dropped after its last use); geo was checked for T.
    let ring = unsafe { MappedRing::new(addr.cast(), geo) };
    Ok((mapping, ring))
}

fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *sys::__errno_location() }
}

/// Locks `m`; a poisoned lock (a panic caught by `guard` while holding it) is still usable,
/// the ring state is consistent at every point where a panic can occur.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Boxes `T` with its first field (the libibverbs object) zeroed, the rest uninitialised.
fn new_object<T>() -> Box<MaybeUninit<T>> {
    // Zero everything: the libibverbs part must start zeroed (as calloc'ed in C providers);
    // our own fields are written before assume_init.
    Box::new_zeroed()
}

type SendRing = Producer<MappedRing<wqe::SendEntry>>;
type RecvRing = Producer<MappedRing<wqe::RecvEntry>>;
type CqRing = Consumer<MappedRing<sys::metaroce_cqe>>;

#[repr(C)]
struct Pd {
    ibv_pd: sys::ibv_pd,
}

#[repr(C)]
struct Mr {
    vmr: sys::verbs_mr,
}

/// A CQ's ring and the completion an extended poll (`ibv_start_poll` .. `ibv_end_poll`, the
/// session of [`Cq::ring`]) is at, which the `ibv_wc_read_*` functions read.
#[derive(Debug)]
struct CqState {
    ring: CqRing,
    cur: sys::metaroce_cqe,
    /// The mapping `ring` points into (None in tests, where the ring is heap memory); a
    /// resize replaces both.
    map: Option<Mapping>,
}

impl CqState {
    /// Over a ring in heap memory (tests).
    #[cfg(test)]
    fn new(ring: CqRing) -> Session<Self> {
        Self::mapped(ring, None)
    }

    fn mapped(ring: CqRing, map: Option<Mapping>) -> Session<Self> {
        // SAFETY: metaroce_cqe is plain integers; all-zero is a valid value.
        let cur = unsafe { core::mem::zeroed() };
        Session::new(Self { ring, cur, map })
    }
}

/// An SQ's ring and the `ibv_wr_*` batch being built (`ibv_wr_start` .. `ibv_wr_complete`,
/// the session of [`Qp::sq`]), if one is.
struct SqState {
    ring: SendRing,
    wr: Option<WrBatch>,
}

impl SqState {
    fn new(ring: SendRing) -> Session<Self> {
        Session::new(Self { ring, wr: None })
    }
}

#[repr(C)]
struct Cq {
    vcq: sys::verbs_cq,
    ring: Session<CqState>,
}

#[repr(C)]
struct Qp {
    vqp: sys::verbs_qp,
    limits: SendLimits,
    max_recv_sge: u32,
    /// None if the kernel gave no SQ (sq.length 0).
    sq: Option<Session<SqState>>,
    /// None if the QP receives through an SRQ (rq.length 0).
    rq: Option<Mutex<RecvRing>>,
    _maps: [Option<Mapping>; 2],
}

/// An address handle: the provider's alone (the kernel has no AH object for userspace; each
/// UD WQE carries the destination). Made by `create_ah`, freed by `destroy_ah`.
#[repr(C)]
struct Ah {
    ibv_ah: sys::ibv_ah,
    /// `grh.dgid` of the attributes it was made with.
    dgid: [u8; 16],
}

#[repr(C)]
struct Srq {
    vsrq: sys::verbs_srq,
    max_sge: u32,
    srq_num: u32,
    ring: Mutex<RecvRing>,
    /// The mapping `ring` points into; a resize replaces both (under `ring`'s lock, taken
    /// first).
    map: Mutex<Mapping>,
}

const _: () = assert!(offset_of!(Pd, ibv_pd) == 0);
const _: () = assert!(offset_of!(Mr, vmr) == 0);
const _: () = assert!(offset_of!(Cq, vcq) == 0);
const _: () = assert!(offset_of!(Qp, vqp) == 0);
const _: () = assert!(offset_of!(Srq, vsrq) == 0);
const _: () = assert!(offset_of!(Ah, ibv_ah) == 0);

/// The uverbs POST_SEND command with no work requests: our SQ doorbell.
#[repr(C)]
struct PostSendDoorbell {
    hdr: sys::ib_uverbs_cmd_hdr,
    cmd: sys::ib_uverbs_post_send,
}
const _: () = assert!(size_of::<PostSendDoorbell>() == 32);

/// Rings the SQ doorbell of `ibqp` (as rxe's `post_send_db`). Returns 0 or an errno value.
///
/// # Safety
/// `ibqp` must be a live QP of an open context.
unsafe fn ring_doorbell(ibqp: *mut sys::ibv_qp) -> c_int {
    let mut resp = sys::ib_uverbs_post_send_resp { bad_wr: 0 };
    // SAFETY: ibqp is live (contract); handle and context never change after creation.
    let (handle, cmd_fd) = unsafe { ((*ibqp).handle, (*(*ibqp).context).cmd_fd) };
    let db = PostSendDoorbell {
        hdr: sys::ib_uverbs_cmd_hdr {
            command: sys::ib_uverbs_write_cmds_IB_USER_VERBS_CMD_POST_SEND,
            in_words: (size_of::<PostSendDoorbell>() / 4) as u16,
            out_words: (size_of::<sys::ib_uverbs_post_send_resp>() / 4) as u16,
        },
        cmd: sys::ib_uverbs_post_send {
            response: ptr::addr_of_mut!(resp) as u64,
            qp_handle: handle,
            wr_count: 0,
            sge_count: 0,
            // The kernel refuses a wqe_size below its ib_uverbs_send_wr.
            wqe_size: size_of::<sys::ibv_send_wr>() as u32,
            send_wr: sys::__IncompleteArrayField::new(),
        },
    };
    // SAFETY: db is a live buffer of the size passed; the kernel writes resp, which outlives
    // the call.
    let n = unsafe {
        sys::write(
            cmd_fd,
            ptr::addr_of!(db).cast(),
            size_of::<PostSendDoorbell>(),
        )
    };
    match n {
        n if n == size_of::<PostSendDoorbell>() as isize => 0,
        n if n < 0 => errno(),
        _ => sys::EIO as c_int,
    }
}

/// A libibverbs work request list (`next`-linked).
trait Linked {
    fn next(&self) -> *mut Self;
}
impl Linked for sys::ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}
impl Linked for sys::ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

/// Walks a work request list, yielding each element's pointer.
struct WrIter<T: Linked>(*mut T);

impl<T: Linked> WrIter<T> {
    /// # Safety
    /// `head` must be NULL or the start of a valid, NULL-terminated list that is not modified
    /// while the iterator is used.
    unsafe fn new(head: *mut T) -> Self {
        Self(head)
    }
}

impl<T: Linked> Iterator for WrIter<T> {
    type Item = *mut T;
    fn next(&mut self) -> Option<*mut T> {
        let cur = self.0;
        if cur.is_null() {
            return None;
        }
        // SAFETY: a non-NULL element of a valid list (new()'s contract).
        self.0 = unsafe { (*cur).next() };
        Some(cur)
    }
}

/// The SGE list of a work request, refusing negative counts and (before touching the memory)
/// more than `max` entries.
///
/// # Safety
/// `sg_list` must point to `num_sge` SGEs when `0 < num_sge <= max`.
unsafe fn sg_list<'a>(
    sg_list: *const sys::ibv_sge,
    num_sge: c_int,
    max: u32,
) -> Result<&'a [sys::ibv_sge], PostError> {
    let n = u32::try_from(num_sge).map_err(|_| PostError::TooManySge)?;
    if n > max {
        return Err(PostError::TooManySge);
    }
    if n == 0 {
        return Ok(&[]);
    }
    if sg_list.is_null() {
        return Err(PostError::TooManySge);
    }
    // SAFETY: the caller's SGE array of n entries (contract); verbs callers do not modify it
    // during the post call.
    Ok(unsafe { core::slice::from_raw_parts(sg_list, n as usize) })
}

/// Reads the fields of `wr` its opcode uses; on a UD QP (`ud_ctx`: the QP's context) also
/// `wr.ud`, with its AH resolved against that context.
///
/// # Safety
/// `wr` must be a valid `ibv_send_wr` (with `num_sge` SGEs at `sg_list`), and on a UD QP its
/// `wr.ud.ah` NULL or a live AH.
unsafe fn send_wr_view<'a>(
    wr: *const sys::ibv_send_wr,
    ud_ctx: Option<*mut sys::ibv_context>,
) -> Result<SendWr<'a>, PostError> {
    // SAFETY: valid per contract.
    let w = unsafe { &*wr };
    // SAFETY: as above.
    let sg = unsafe { sg_list(w.sg_list, w.num_sge, wqe::MAX_SGE) }?;
    let mut view = SendWr {
        wr_id: w.wr_id,
        opcode: w.opcode,
        send_flags: w.send_flags,
        sg_list: sg,
        // SAFETY: both union members are u32; any value is valid.
        imm_data: unsafe { w.__bindgen_anon_1.imm_data },
        remote_addr: 0,
        rkey: 0,
        compare_add: 0,
        swap: 0,
        ud: None,
    };
    if let Some(ctx) = ud_ctx {
        // SAFETY: a UD QP's WR names its destination in the `ud` member (a pointer and two
        // integers).
        let ud = unsafe { w.wr.ud };
        // SAFETY: ud.ah is NULL or a live AH (contract).
        view.ud = unsafe { ud_dest(ctx, ud.ah, ud.remote_qpn, ud.remote_qkey) };
        return Ok(view);
    }
    match wqe::op_class(w.opcode) {
        Some(wqe::OpClass::Rdma) => {
            // SAFETY: RDMA opcodes use the `rdma` member (plain integers).
            let r = unsafe { w.wr.rdma };
            (view.remote_addr, view.rkey) = (r.remote_addr, r.rkey);
        }
        Some(wqe::OpClass::Atomic) => {
            // SAFETY: atomic opcodes use the `atomic` member (plain integers).
            let a = unsafe { w.wr.atomic };
            (view.remote_addr, view.rkey) = (a.remote_addr, a.rkey);
            (view.compare_add, view.swap) = (a.compare_add, a.swap);
        }
        Some(wqe::OpClass::Local) if w.opcode == sys::ibv_wr_opcode_IBV_WR_BIND_MW => {
            // SAFETY: BIND_MW uses the `bind_mw` member: the window and MR are the caller's
            // live objects (or NULL), read for their keys.
            let b = unsafe { w.__bindgen_anon_2.bind_mw };
            bind_view(&mut view, b.mw, b.rkey, &b.bind_info)?;
        }
        // `ibv_send_wr` has no member for ATOMIC_WRITE or FLUSH: only their `ibv_wr_*`
        // builders post them.
        Some(wqe::OpClass::Operands) => return Err(PostError::BadOpcode),
        _ => {}
    }
    Ok(view)
}

/// Fills the fields of a BIND_MW `view` (`wqe::SendWr`): window `mw` (its rkey now), its new
/// rkey, and what it is bound to (the MR's lkey, address, length and rights). A NULL window
/// is `EINVAL`; a NULL MR is lkey 0 (a type 1 unbind names none).
pub(super) fn bind_view(
    view: &mut SendWr<'_>,
    mw: *mut sys::ibv_mw,
    new_rkey: u32,
    info: &sys::ibv_mw_bind_info,
) -> Result<(), PostError> {
    if mw.is_null() {
        return Err(PostError::BadOpcode);
    }
    // SAFETY: a window of the caller's (non-NULL), live for the call.
    view.rkey = unsafe { (*mw).rkey };
    // SAFETY: as above for the MR, when given.
    let lkey = if info.mr.is_null() {
        0
    } else {
        unsafe { (*info.mr).lkey }
    };
    view.imm_data = new_rkey;
    view.remote_addr = info.addr;
    view.compare_add = info.length;
    view.swap = (u64::from(info.mw_access_flags) << 32) | u64::from(lkey);
    Ok(())
}

/// `encode_send`'s inline copy: `dst.len()` bytes from the SGE's address.
///
/// # Safety
/// With `IBV_SEND_INLINE` the application guarantees `sge.addr .. + sge.length` is readable
/// for the duration of the posting call; `encode_send` hands a `dst` of exactly `sge.length`
/// bytes.
unsafe fn copy_inline_sge(sge: &sys::ibv_sge, dst: &mut [u8]) {
    // SAFETY: per the contract.
    unsafe { ptr::copy_nonoverlapping(sge.addr as usize as *const u8, dst.as_mut_ptr(), dst.len()) }
}

/// The destination of a UD send to `ah` on the QP of context `qp_ctx`, or `None` if `ah` is
/// NULL or was made on another context (another device's, or another provider's: only ours
/// are on a context whose ops are ours, so the context tells an AH of ours from one we must
/// not read beyond its `ibv_ah`).
///
/// # Safety
/// `ah` must be NULL or a live `ibv_ah` (libibverbs sets its `context` after `create_ah`).
unsafe fn ud_dest(
    qp_ctx: *mut sys::ibv_context,
    ah: *mut sys::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) -> Option<UdDest> {
    // SAFETY: NULL or live (contract); `context` is the ibv_ah's own field.
    if ah.is_null() || unsafe { (*ah).context } != qp_ctx {
        return None;
    }
    // SAFETY: an AH of our context was made by create_ah: an Ah, whose dgid never changes.
    let dgid = unsafe { (*outer::<_, Ah>(ah)).dgid };
    Some(UdDest {
        dgid,
        remote_qpn,
        remote_qkey,
    })
}

/// Encodes and queues the send WRs of `head` into `sq` (under its lock), publishing them.
/// Refused (`EINVAL`, nothing posted) inside the caller's own `ibv_wr_start` .. `wr_complete`
/// on this QP. `ctx` is the QP's context (the one a UD send's AH must be of).
///
/// # Safety
/// `head` must be NULL or a valid send WR list (see [`send_wr_view`]) whose inline SGEs point
/// to readable memory.
unsafe fn post_send_list(
    sq: &Session<SqState>,
    limits: &SendLimits,
    ctx: *mut sys::ibv_context,
    head: *mut sys::ibv_send_wr,
) -> PostOutcome<*mut sys::ibv_send_wr> {
    let ud_ctx = (limits.qp_type == sys::ibv_qp_type_IBV_QPT_UD).then_some(ctx);
    let posted = sq.with(Owner::current(), |s| {
        // SAFETY: contract.
        let wrs = unsafe { WrIter::new(head) };
        wqe::post_list(s.ring.batch(), wrs, |&wr| {
            // SAFETY: an element of the caller's list.
            let view = unsafe { send_wr_view(wr, ud_ctx) }?;
            // SAFETY: IBV_SEND_INLINE SGEs of a WR being posted (contract).
            wqe::encode_send(&view, limits, |sge, dst| unsafe {
                copy_inline_sge(sge, dst)
            })
        })
    });
    posted.unwrap_or(PostOutcome {
        posted: 0,
        failed: Some((head, PostError::OutOfOrder)),
    })
}

/// Encodes and queues the receive WRs of `head` into `rq` (under its lock), publishing them.
///
/// # Safety
/// `head` must be NULL or a valid receive WR list.
unsafe fn post_recv_list(
    rq: &Mutex<RecvRing>,
    max_sge: u32,
    head: *mut sys::ibv_recv_wr,
) -> PostOutcome<*mut sys::ibv_recv_wr> {
    let mut ring = lock(rq);
    // SAFETY: contract.
    let wrs = unsafe { WrIter::new(head) };
    wqe::post_list(ring.batch(), wrs, |&wr| {
        // SAFETY: an element of the caller's list.
        let w = unsafe { &*wr };
        // SAFETY: num_sge SGEs at sg_list (verbs contract).
        let sg = unsafe { sg_list(w.sg_list, w.num_sge, wqe::MAX_SGE) }?;
        wqe::encode_recv(w.wr_id, sg, max_sge)
    })
}

/// Reports a post outcome the verbs way: `*bad_wr` = first WR not posted, errno value returned.
///
/// # Safety
/// `bad_wr` must be NULL or writable.
unsafe fn finish_post<W>(outcome: &PostOutcome<*mut W>, bad_wr: *mut *mut W) -> c_int {
    match outcome.failed {
        Some((wr, err)) => {
            if !bad_wr.is_null() {
                // SAFETY: writable per contract.
                unsafe { *bad_wr = wr };
            }
            err.errno()
        }
        None => 0,
    }
}

/// Says that the kernel broke a CQ ring's protocol (the application gets an error).
fn report_corrupt_cq(c: crate::ring::Corrupt) {
    let _ = writeln!(
        std::io::stderr(),
        "metaroce: CQ ring corrupt (producer {}, consumer {})",
        c.producer,
        c.consumer
    );
}

/// Moves up to `ne` completions from `cq` into `wc`; -1 if the kernel corrupted the ring, or
/// if the caller is inside its own `ibv_start_poll` .. `ibv_end_poll` on this CQ.
///
/// # Safety
/// `wc` must have room for `ne` entries.
unsafe fn poll_into(cq: &Session<CqState>, ne: c_int, wc: *mut sys::ibv_wc) -> c_int {
    let max = usize::try_from(ne).unwrap_or(0);
    let mut i = 0usize;
    let res = cq.with(Owner::current(), |s| {
        s.ring.poll(max, |cqe| {
            // SAFETY: i < max <= the room of wc (contract).
            unsafe { wc.add(i).write(wqe::cqe_to_wc(&cqe)) };
            i += 1;
        })
    });
    match res {
        Ok(Ok(n)) => n as c_int,
        Ok(Err(c)) => {
            report_corrupt_cq(c);
            -1
        }
        Err(_in_session) => -1,
    }
}

/// `container_of` from the embedded libibverbs object to our wrapper (offset 0).
fn outer<F, T>(field: *mut F) -> *mut T {
    field.cast()
}

unsafe extern "C" fn alloc_pd(ibctx: *mut sys::ibv_context) -> *mut sys::ibv_pd {
    guard(ptr::null_mut(), || {
        let mut pd = new_object::<Pd>();
        let p = pd.as_mut_ptr();
        // SAFETY: all-zero request/response buffers are valid.
        let mut cmd: sys::ibv_alloc_pd = unsafe { core::mem::zeroed() };
        let mut resp: sys::ib_uverbs_alloc_pd_resp = unsafe { core::mem::zeroed() };
        // SAFETY: p is a zeroed Pd at its final address; the buffers are live.
        let ret = unsafe {
            sys::ibv_cmd_alloc_pd(
                ibctx,
                ptr::addr_of_mut!((*p).ibv_pd),
                &mut cmd,
                size_of::<sys::ibv_alloc_pd>(),
                &mut resp,
                size_of::<sys::ib_uverbs_alloc_pd_resp>(),
            )
        };
        if ret != 0 {
            set_errno(ret);
            return ptr::null_mut();
        }
        // SAFETY: Pd is only the zeroed (now initialised) ibv_pd.
        let p = Box::into_raw(unsafe { pd.assume_init() });
        // SAFETY: p is live.
        unsafe { ptr::addr_of_mut!((*p).ibv_pd) }
    })
}

unsafe extern "C" fn dealloc_pd(ibpd: *mut sys::ibv_pd) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: ibpd came from alloc_pd and is deallocated once.
        let ret = unsafe { sys::ibv_cmd_dealloc_pd(ibpd) };
        if ret == 0 {
            // SAFETY: the Box leaked by alloc_pd; the kernel object is gone.
            drop(unsafe { Box::from_raw(outer::<_, Pd>(ibpd)) });
        }
        ret
    })
}

/// `ibv_alloc_mw` (type 1 or 2; the kernel refuses others with `EINVAL`): a window of the
/// kernel's, whose rkey the kernel chose.
unsafe extern "C" fn alloc_mw(ibpd: *mut sys::ibv_pd, kind: sys::ibv_mw_type) -> *mut sys::ibv_mw {
    guard(ptr::null_mut(), || {
        // SAFETY: an all-zero ibv_mw is valid; the command fills it in.
        let mw: *mut sys::ibv_mw = Box::into_raw(Box::new(unsafe { core::mem::zeroed() }));
        // SAFETY: all-zero request/response buffers are valid.
        let mut cmd: sys::ibv_alloc_mw = unsafe { core::mem::zeroed() };
        let mut resp: sys::ib_uverbs_alloc_mw_resp = unsafe { core::mem::zeroed() };
        // SAFETY: ibpd as libibverbs passed it; mw and the buffers are ours, of these sizes.
        let ret = unsafe {
            sys::ibv_cmd_alloc_mw(
                ibpd,
                kind,
                mw,
                &mut cmd,
                size_of::<sys::ibv_alloc_mw>(),
                &mut resp,
                size_of::<sys::ib_uverbs_alloc_mw_resp>(),
            )
        };
        if ret != 0 {
            // SAFETY: the Box made above, never handed out.
            drop(unsafe { Box::from_raw(mw) });
            set_errno(ret);
            return ptr::null_mut();
        }
        mw
    })
}

unsafe extern "C" fn dealloc_mw(mw: *mut sys::ibv_mw) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: mw came from alloc_mw and is deallocated once.
        let ret = unsafe { sys::ibv_cmd_dealloc_mw(mw) };
        if ret == 0 {
            // SAFETY: the Box leaked by alloc_mw; the kernel object is gone.
            drop(unsafe { Box::from_raw(mw) });
        }
        ret
    })
}

/// `ibv_attach_mcast`: the kernel keeps the groups (the provider has nothing to do for a
/// datagram to a group but address it, as any other).
unsafe extern "C" fn attach_mcast(
    qp: *mut sys::ibv_qp,
    gid: *const sys::ibv_gid,
    lid: u16,
) -> c_int {
    // SAFETY: the caller's live QP of ours and GID.
    guard(PANIC_ERRNO, || unsafe {
        sys::ibv_cmd_attach_mcast(qp, gid, lid)
    })
}

/// `ibv_detach_mcast`.
unsafe extern "C" fn detach_mcast(
    qp: *mut sys::ibv_qp,
    gid: *const sys::ibv_gid,
    lid: u16,
) -> c_int {
    // SAFETY: as in `attach_mcast`.
    guard(PANIC_ERRNO, || unsafe {
        sys::ibv_cmd_detach_mcast(qp, gid, lid)
    })
}

/// `ibv_inc_rkey`: the same key with its low byte, the consumer's, moved on.
fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// `ibv_bind_mw` of a type 1 window (type 2 windows are bound by a BIND_MW work request): a
/// BIND_MW posted on `ibqp` with the window's next rkey, which the window takes once it is
/// posted (as rxe's provider; the consumer undoes it if the completion is an error).
unsafe extern "C" fn bind_mw(
    ibqp: *mut sys::ibv_qp,
    mw: *mut sys::ibv_mw,
    bind: *mut sys::ibv_mw_bind,
) -> c_int {
    guard(PANIC_ERRNO, || {
        if mw.is_null() || bind.is_null() {
            return sys::EINVAL as c_int;
        }
        // SAFETY: the caller's live window and bind request.
        let (b, rkey, kind) = unsafe { (*bind, (*mw).rkey, (*mw).type_) };
        if kind != sys::ibv_mw_type_IBV_MW_TYPE_1
            || b.bind_info.mw_access_flags & sys::ibv_access_flags_IBV_ACCESS_ZERO_BASED != 0
        {
            return sys::EINVAL as c_int;
        }
        // SAFETY: an all-zero ibv_send_wr is valid.
        let mut wr: sys::ibv_send_wr = unsafe { core::mem::zeroed() };
        wr.wr_id = b.wr_id;
        wr.opcode = sys::ibv_wr_opcode_IBV_WR_BIND_MW;
        wr.send_flags = b.send_flags;
        wr.__bindgen_anon_2.bind_mw = sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
            mw,
            rkey: inc_rkey(rkey),
            bind_info: b.bind_info,
        };
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: ibqp as libibverbs passed it; wr is ours, its window the caller's.
        let ret = unsafe { post_send(ibqp, &mut wr, &mut bad) };
        if ret == 0 {
            // SAFETY: as above.
            unsafe { (*mw).rkey = inc_rkey(rkey) };
        }
        ret
    })
}

/// Our Context of an open `ibv_context`.
///
/// # Safety
/// `ibctx` must be the `context` of a live verbs_context made by `alloc_context`.
unsafe fn context_of(ibctx: *mut sys::ibv_context) -> *mut Context {
    // SAFETY: per the contract: the verbs_context is the first field of a Context.
    unsafe {
        let vctx =
            container_of::<_, sys::verbs_context>(ibctx, offset_of!(sys::verbs_context, context));
        container_of::<_, Context>(vctx, offset_of!(Context, ibv_ctx))
    }
}

/// The device's number of ports, asked the kernel once (a QUERY_DEVICE) and then remembered.
/// Errors are errno values.
///
/// # Safety
/// `ibctx` as for [`context_of`].
unsafe fn num_ports(ibctx: *mut sys::ibv_context) -> Result<u8, c_int> {
    // SAFETY: our own field of the live Context (contract), only ever accessed atomically.
    let cache = unsafe { &(*context_of(ibctx)).num_ports };
    let known = cache.load(Ordering::Relaxed);
    if known != 0 {
        return Ok(known);
    }
    // SAFETY: all-zero is a valid ibv_device_attr_ex (plain integers and arrays).
    let mut attr: sys::ibv_device_attr_ex = unsafe { core::mem::zeroed() };
    // SAFETY: a live context; attr has room for the size passed (only orig_attr: the plain
    // QUERY_DEVICE command); NULL input and response are allowed (the library uses its own).
    let ret = unsafe {
        sys::ibv_cmd_query_device_any(
            ibctx,
            ptr::null(),
            &mut attr,
            size_of::<sys::ibv_device_attr>(),
            ptr::null_mut(),
            ptr::null_mut(),
        )
    };
    if ret != 0 {
        return Err(ret);
    }
    let n = attr.orig_attr.phys_port_cnt;
    cache.store(n, Ordering::Relaxed);
    Ok(n)
}

/// `ibv_create_ah`: an address handle in userspace alone (no kernel command but, the first
/// time on a context, the QUERY_DEVICE that gives the number of ports). Refuses (`EINVAL`) a
/// NULL `attr`, and what [`wqe::check_ah_attr`] refuses.
unsafe extern "C" fn create_ah(
    ibpd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_ah_attr,
) -> *mut sys::ibv_ah {
    guard(ptr::null_mut(), || {
        if attr.is_null() {
            set_errno(sys::EINVAL as c_int);
            return ptr::null_mut();
        }
        // SAFETY: the caller's attributes (plain integers and a GID union of bytes).
        let a = unsafe { attr.read() };
        // SAFETY: the raw bytes of the GID union; every bit pattern is valid.
        let dgid = unsafe { a.grh.dgid.raw };
        // The checks that need no kernel first, with every port allowed; then the port range.
        let checked = wqe::check_ah_attr(a.is_global, a.port_num, dgid, u8::MAX).and_then(|_| {
            // SAFETY: ibpd is a live PD of an open context of ours.
            let ports = unsafe { num_ports((*ibpd).context) }?;
            wqe::check_ah_attr(a.is_global, a.port_num, dgid, ports)
        });
        let dgid = match checked {
            Ok(dgid) => dgid,
            Err(errno) => {
                set_errno(errno);
                return ptr::null_mut();
            }
        };
        let mut ah = new_object::<Ah>();
        let p = ah.as_mut_ptr();
        // SAFETY: writing our field of the zeroed Ah; its ibv_ah stays zero (libibverbs sets
        // context and pd after we return).
        unsafe { ptr::addr_of_mut!((*p).dgid).write(dgid) };
        // SAFETY: every field is initialised now.
        let p = Box::into_raw(unsafe { ah.assume_init() });
        // SAFETY: p is live.
        unsafe { ptr::addr_of_mut!((*p).ibv_ah) }
    })
}

/// `ibv_destroy_ah`: frees it (WQEs posted with it carry their own copy of the address).
unsafe extern "C" fn destroy_ah(ibah: *mut sys::ibv_ah) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: ibah came from create_ah (libibverbs calls this through its context's ops,
        // ours) and is destroyed once.
        drop(unsafe { Box::from_raw(outer::<_, Ah>(ibah)) });
        0
    })
}

unsafe extern "C" fn reg_mr(
    ibpd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    hca_va: u64,
    access: c_int,
) -> *mut sys::ibv_mr {
    guard(ptr::null_mut(), || {
        let mut mr = new_object::<Mr>();
        let p = mr.as_mut_ptr();
        // SAFETY: all-zero request/response buffers are valid.
        let mut cmd: sys::ibv_reg_mr = unsafe { core::mem::zeroed() };
        let mut resp: sys::ib_uverbs_reg_mr_resp = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them (hca_va is the iova of
        // ibv_reg_mr_iova, or addr); p is a zeroed Mr at its final address.
        let ret = unsafe {
            sys::ibv_cmd_reg_mr(
                ibpd,
                addr,
                length,
                hca_va,
                access,
                ptr::addr_of_mut!((*p).vmr),
                &mut cmd,
                size_of::<sys::ibv_reg_mr>(),
                &mut resp,
                size_of::<sys::ib_uverbs_reg_mr_resp>(),
            )
        };
        if ret != 0 {
            set_errno(ret);
            return ptr::null_mut();
        }
        // SAFETY: Mr is only the (now initialised) verbs_mr.
        let p = Box::into_raw(unsafe { mr.assume_init() });
        // SAFETY: p is live.
        unsafe { ptr::addr_of_mut!((*p).vmr.ibv_mr) }
    })
}

/// `ibv_rereg_mr`: any of the translation, the PD and the access rights, in place (the kernel
/// keeps the MR's keys and says them again). A new translation is named by its own address,
/// as `ibv_reg_mr` names it. Returns 0 or an errno value, which errno also holds.
unsafe extern "C" fn rereg_mr(
    vmr: *mut sys::verbs_mr,
    flags: c_int,
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: all-zero request/response buffers are valid.
        let mut cmd: sys::ibv_rereg_mr = unsafe { core::mem::zeroed() };
        let mut resp: sys::ib_uverbs_rereg_mr_resp = unsafe { core::mem::zeroed() };
        // SAFETY: vmr came from reg_mr; the other arguments are as ibv_rereg_mr checked them
        // (pd is read only with IBV_REREG_MR_CHANGE_PD).
        let ret = unsafe {
            sys::ibv_cmd_rereg_mr(
                vmr,
                flags as u32,
                addr,
                length,
                addr as u64,
                access,
                pd,
                &mut cmd,
                size_of::<sys::ibv_rereg_mr>(),
                &mut resp,
                size_of::<sys::ib_uverbs_rereg_mr_resp>(),
            )
        };
        if ret != 0 {
            set_errno(ret);
        }
        ret
    })
}

unsafe extern "C" fn dereg_mr(vmr: *mut sys::verbs_mr) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: vmr came from reg_mr and is deregistered once.
        let ret = unsafe { sys::ibv_cmd_dereg_mr(vmr) };
        if ret == 0 {
            // SAFETY: the Box leaked by reg_mr.
            drop(unsafe { Box::from_raw(outer::<_, Mr>(vmr)) });
        }
        ret
    })
}

unsafe extern "C" fn create_cq(
    ibctx: *mut sys::ibv_context,
    cqe: c_int,
    channel: *mut sys::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut sys::ibv_cq {
    guard(ptr::null_mut(), || {
        let mut cq = new_object::<Cq>();
        let p = cq.as_mut_ptr();
        // SAFETY: p is zeroed memory of a Cq; taking a field address.
        let ibcq = unsafe { ptr::addr_of_mut!((*p).vcq.__bindgen_anon_1.cq) };
        // SAFETY: all-zero request/response buffers are valid.
        let mut cmd: sys::ibv_create_cq = unsafe { core::mem::zeroed() };
        let mut resp: sys::metaroce_cmd_create_cq_resp = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them; ibcq is zeroed and stays at this address
        // (its address is the kernel's user_handle).
        let ret = unsafe {
            sys::ibv_cmd_create_cq(
                ibctx,
                cqe,
                channel,
                comp_vector,
                ibcq,
                &mut cmd,
                size_of::<sys::ibv_create_cq>(),
                ptr::addr_of_mut!(resp.ibv_resp),
                size_of::<sys::metaroce_cmd_create_cq_resp>(),
            )
        };
        if ret != 0 {
            set_errno(ret);
            return ptr::null_mut();
        }
        // SAFETY: the kernel CQ of cq, created on ibctx just now.
        let p = unsafe { finish_cq(cq, ibctx, &resp.drv_payload.ring) };
        if p.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: p is live; the same address the kernel got as user_handle.
        unsafe { ptr::addr_of_mut!((*p).vcq.__bindgen_anon_1.cq) }
    })
}

/// Maps the ring of a CQ the kernel just created for `cq` and fills in our fields: the live
/// Cq, or NULL with errno set after destroying the kernel CQ (the Box is freed without
/// dropping the uninitialised fields).
///
/// # Safety
/// `cq`'s `vcq` must be the CQ just created on the live `ibctx`, `ring` from its response.
unsafe fn finish_cq(
    mut cq: Box<MaybeUninit<Cq>>,
    ibctx: *mut sys::ibv_context,
    ring: &sys::metaroce_mmap_info,
) -> *mut Cq {
    let p = cq.as_mut_ptr();
    // SAFETY: ibctx is the live context.
    let cmd_fd = unsafe { (*ibctx).cmd_fd };
    let mapped = map_ring::<sys::metaroce_cqe>(cmd_fd, ring, "CQ").and_then(|(map, ring)| {
        Consumer::new(ring)
            .map(|ring| (map, ring))
            .map_err(|_| abi::ABI_MISMATCH_ERRNO)
    });
    match mapped {
        Ok((map, ring)) => {
            // SAFETY: writing our fields of the boxed Cq (vcq is initialised).
            unsafe {
                ptr::addr_of_mut!((*p).ring).write(CqState::mapped(ring, Some(map)));
            }
            // SAFETY: every field is initialised now.
            Box::into_raw(unsafe { cq.assume_init() })
        }
        Err(errno) => {
            // SAFETY: undo the kernel CQ (its ibv_cq is at its final address in the Box).
            unsafe { sys::ibv_cmd_destroy_cq(ptr::addr_of_mut!((*p).vcq.__bindgen_anon_1.cq)) };
            set_errno(errno);
            ptr::null_mut()
        }
    }
}

unsafe extern "C" fn poll_cq(ibcq: *mut sys::ibv_cq, ne: c_int, wc: *mut sys::ibv_wc) -> c_int {
    guard(-1, || {
        let cq = outer::<_, Cq>(ibcq);
        // SAFETY: ibcq came from create_cq (a live Cq); ring is our Mutex, wc has ne entries.
        unsafe { poll_into(&(*cq).ring, ne, wc) }
    })
}

/// `ibv_resize_cq`: the kernel moves the completions not polled yet into a new ring, which is
/// mapped in place of the old one. Pollers of the CQ wait meanwhile (its session); a poll
/// session of the calling thread open on it (`ibv_start_poll`) refuses it with EINVAL.
unsafe extern "C" fn resize_cq(ibcq: *mut sys::ibv_cq, cqe: c_int) -> c_int {
    guard(PANIC_ERRNO, || {
        let cq = outer::<_, Cq>(ibcq);
        // SAFETY: ibcq came from create_cq (a live Cq).
        let ring = unsafe { &(*cq).ring };
        // SAFETY: ibcq is live; its context's cmd_fd never changes.
        let cmd_fd = unsafe { (*(*ibcq).context).cmd_fd };
        ring.with(Owner::current(), |s| {
            // SAFETY: all-zero request/response buffers are valid.
            let mut cmd: sys::ibv_resize_cq = unsafe { core::mem::zeroed() };
            let mut resp: sys::metaroce_cmd_resize_cq_resp = unsafe { core::mem::zeroed() };
            // SAFETY: ibcq is live; the buffers are ours, of the sizes given.
            let ret = unsafe {
                sys::ibv_cmd_resize_cq(
                    ibcq,
                    cqe,
                    &mut cmd,
                    size_of::<sys::ibv_resize_cq>(),
                    ptr::addr_of_mut!(resp.ibv_resp),
                    size_of::<sys::metaroce_cmd_resize_cq_resp>(),
                )
            };
            if ret != 0 {
                return ret;
            }
            // The kernel fills the new ring from now on: map it, then let the old one go.
            match map_ring::<sys::metaroce_cqe>(cmd_fd, &resp.drv_payload.ring, "CQ").and_then(
                |(map, r)| {
                    Consumer::new(r)
                        .map(|r| (map, r))
                        .map_err(|_| abi::ABI_MISMATCH_ERRNO)
                },
            ) {
                Ok((map, r)) => {
                    s.ring = r;
                    s.map = Some(map);
                    0
                }
                // The kernel CQ is resized but cannot be polled from here: its completions
                // are lost to this process, as after any failed mapping.
                Err(errno) => errno,
            }
        })
        .unwrap_or(sys::EINVAL as c_int)
    })
}

unsafe extern "C" fn req_notify_cq(ibcq: *mut sys::ibv_cq, solicited_only: c_int) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: arguments as libibverbs passed them.
        unsafe { sys::ibv_cmd_req_notify_cq(ibcq, solicited_only) }
    })
}

unsafe extern "C" fn destroy_cq(ibcq: *mut sys::ibv_cq) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: ibcq came from create_cq and is destroyed once.
        let ret = unsafe { sys::ibv_cmd_destroy_cq(ibcq) };
        if ret == 0 {
            // SAFETY: the Box leaked by create_cq; dropping it unmaps the ring.
            drop(unsafe { Box::from_raw(outer::<_, Cq>(ibcq)) });
        }
        ret
    })
}

unsafe extern "C" fn create_qp(
    ibpd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    guard(ptr::null_mut(), || {
        let mut qp = new_object::<Qp>();
        let p = qp.as_mut_ptr();
        // SAFETY: p is zeroed memory of a Qp; taking a field address.
        let ibqp = unsafe { ptr::addr_of_mut!((*p).vqp.__bindgen_anon_1.qp) };
        // SAFETY: all-zero request/response buffers are valid.
        let mut cmd: sys::ibv_create_qp = unsafe { core::mem::zeroed() };
        let mut resp: sys::metaroce_cmd_create_qp_resp = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them; ibqp is zeroed and stays at this address.
        let ret = unsafe {
            sys::ibv_cmd_create_qp(
                ibpd,
                ibqp,
                attr,
                &mut cmd,
                size_of::<sys::ibv_create_qp>(),
                ptr::addr_of_mut!(resp.ibv_resp),
                size_of::<sys::metaroce_cmd_create_qp_resp>(),
            )
        };
        if ret != 0 {
            set_errno(ret);
            return ptr::null_mut();
        }
        // SAFETY: the kernel QP of qp, created on ibpd's context just now; attr is the
        // caller's, holding the kernel's capabilities.
        let p = unsafe {
            finish_qp(
                qp,
                (*(*ibpd).context).cmd_fd,
                (*attr).qp_type,
                ptr::addr_of_mut!((*attr).cap),
                &resp.drv_payload,
            )
        };
        if p.is_null() {
            return ptr::null_mut();
        }
        // SAFETY: p is live; the same address the kernel got as user_handle.
        unsafe { ptr::addr_of_mut!((*p).vqp.__bindgen_anon_1.qp) }
    })
}

/// Maps the rings of a QP the kernel just created for `qp` and fills in our fields; `cap` (the
/// caller's, holding the kernel's capabilities) gets the limits we enforce. The live Qp, or
/// NULL with errno set after destroying the kernel QP (the Box is freed without dropping the
/// uninitialised fields; a mapping made before the failure is unmapped).
///
/// # Safety
/// `qp`'s `vqp` must be the QP just created on the context of `cmd_fd`, `drv` from its
/// response; `cap` must be writable.
unsafe fn finish_qp(
    mut qp: Box<MaybeUninit<Qp>>,
    cmd_fd: c_int,
    qp_type: u32,
    cap: *mut sys::ibv_qp_cap,
    drv: &sys::metaroce_create_qp_resp,
) -> *mut Qp {
    let p = qp.as_mut_ptr();
    // SAFETY: readable per the contract.
    let kernel_cap = unsafe { cap.read() };
    let rings = (|| -> Result<_, c_int> {
        let sq = if drv.sq.length != 0 {
            let (m, r) = map_ring::<wqe::SendEntry>(cmd_fd, &drv.sq, "SQ")?;
            let r = Producer::new(r).map_err(|_| abi::ABI_MISMATCH_ERRNO)?;
            Some((m, r))
        } else {
            None
        };
        let rq = if drv.rq.length != 0 {
            let (m, r) = map_ring::<wqe::RecvEntry>(cmd_fd, &drv.rq, "RQ")?;
            let r = Producer::new(r).map_err(|_| abi::ABI_MISMATCH_ERRNO)?;
            Some((m, r))
        } else {
            None
        };
        Ok((sq, rq))
    })();
    match rings {
        Ok((sq, rq)) => {
            // The SGEs a WQE may carry: the kernel's caps, at most what the entries hold.
            let sq_stride = sq.as_ref().map(|(_, r)| r.ring().geometry().stride);
            let rq_stride = rq.as_ref().map(|(_, r)| r.ring().geometry().stride);
            let limits = SendLimits {
                qp_type,
                max_sge: kernel_cap
                    .max_send_sge
                    .min(sq_stride.map_or(wqe::MAX_SEND_SGE, wqe::send_sge_capacity)),
                max_inline: drv.max_inline_data.min(wqe::MAX_INLINE),
            };
            let max_recv_sge = kernel_cap
                .max_recv_sge
                .min(rq_stride.map_or(wqe::MAX_RECV_SGE, wqe::recv_sge_capacity));
            let (sq_map, sq) = sq.map_or((None, None), |(m, r)| (Some(m), Some(SqState::new(r))));
            let (rq_map, rq) = rq.map_or((None, None), |(m, r)| (Some(m), Some(Mutex::new(r))));
            // SAFETY: writing our fields of the boxed Qp; cap is the caller's (contract).
            unsafe {
                ptr::addr_of_mut!((*p).limits).write(limits);
                ptr::addr_of_mut!((*p).max_recv_sge).write(max_recv_sge);
                ptr::addr_of_mut!((*p).sq).write(sq);
                ptr::addr_of_mut!((*p).rq).write(rq);
                ptr::addr_of_mut!((*p)._maps).write([sq_map, rq_map]);
                (*cap).max_send_sge = limits.max_sge;
                (*cap).max_recv_sge = max_recv_sge;
                (*cap).max_inline_data = limits.max_inline;
            }
            // SAFETY: every field is initialised now.
            Box::into_raw(unsafe { qp.assume_init() })
        }
        Err(errno) => {
            // SAFETY: undo the kernel QP (its ibv_qp is at its final address in the Box).
            unsafe { sys::ibv_cmd_destroy_qp(ptr::addr_of_mut!((*p).vqp.__bindgen_anon_1.qp)) };
            set_errno(errno);
            ptr::null_mut()
        }
    }
}

unsafe extern "C" fn query_qp(
    ibqp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: an all-zero request is valid.
        let mut cmd: sys::ibv_query_qp = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them.
        let ret = unsafe {
            sys::ibv_cmd_query_qp(
                ibqp,
                attr,
                attr_mask,
                init_attr,
                &mut cmd,
                size_of::<sys::ibv_query_qp>(),
            )
        };
        if ret == 0 && !init_attr.is_null() {
            // Report the inline limit we enforce (the core response does not know it).
            let qp = outer::<_, Qp>(ibqp);
            // SAFETY: ibqp is a live Qp; limits never change; init_attr/attr are writable.
            unsafe {
                let max_inline = (*qp).limits.max_inline;
                (*init_attr).cap.max_inline_data = max_inline;
                if !attr.is_null() {
                    (*attr).cap.max_inline_data = max_inline;
                }
            }
        }
        ret
    })
}

unsafe extern "C" fn modify_qp(
    ibqp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: an all-zero request is valid.
        let mut cmd: sys::ibv_modify_qp = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them.
        let ret = unsafe {
            sys::ibv_cmd_modify_qp(
                ibqp,
                attr,
                attr_mask,
                &mut cmd,
                size_of::<sys::ibv_modify_qp>(),
            )
        };
        // SAFETY: attr is the caller's, read only when the state is named.
        let reset = attr_mask as u32 & sys::ibv_qp_attr_mask_IBV_QP_STATE != 0
            && unsafe { (*attr).qp_state } == sys::ibv_qp_state_IBV_QPS_RESET;
        if ret == 0 && reset {
            // SAFETY: ibqp is live, and so are its CQs (a CQ outlives its QPs).
            unsafe { clean_cqs(ibqp) };
        }
        ret
    })
}

/// A QP gone to RESET leaves nothing in its CQs: the completions it made that were not polled
/// yet are removed (as mlx4 and mlx5 do), so that a QP reset and connected again, as rdma-core's
/// tests restate a failed pair, does not hand its consumer the flushes of its old life.
///
/// # Safety
/// `ibqp` must be a live QP of ours, with live CQs.
unsafe fn clean_cqs(ibqp: *mut sys::ibv_qp) {
    // SAFETY: per the contract.
    let (qpn, send, recv) = unsafe { ((*ibqp).qp_num, (*ibqp).send_cq, (*ibqp).recv_cq) };
    for (i, ibcq) in [send, recv].into_iter().enumerate() {
        if ibcq.is_null() || (i == 1 && ibcq == send) {
            continue;
        }
        let cq = outer::<_, Cq>(ibcq);
        // SAFETY: a live Cq (contract). A poll session of this thread open on it keeps it.
        let _ = unsafe { &(*cq).ring }.with(Owner::current(), |s| {
            s.ring.discard_where(|e| e.qp_num == qpn)
        });
    }
}

unsafe extern "C" fn destroy_qp(ibqp: *mut sys::ibv_qp) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: ibqp came from create_qp and is destroyed once.
        let ret = unsafe { sys::ibv_cmd_destroy_qp(ibqp) };
        if ret == 0 {
            // SAFETY: the Box leaked by create_qp; dropping it unmaps the rings.
            drop(unsafe { Box::from_raw(outer::<_, Qp>(ibqp)) });
        }
        ret
    })
}

unsafe extern "C" fn post_send(
    ibqp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad_wr: *mut *mut sys::ibv_send_wr,
) -> c_int {
    guard(PANIC_ERRNO, || {
        let qp = outer::<_, Qp>(ibqp);
        // SAFETY: ibqp came from create_qp: a live Qp whose limits/sq/context never change;
        // `state` is libibverbs' record of the last modify_qp.
        let (limits, sq, ctx, state) =
            unsafe { ((*qp).limits, &(*qp).sq, (*ibqp).context, (*ibqp).state) };
        let sq = sq.as_ref().filter(|_| wqe::sends_allowed(state));
        let Some(sq) = sq else {
            if !bad_wr.is_null() {
                // SAFETY: writable (verbs contract).
                unsafe { *bad_wr = wr };
            }
            return sys::EINVAL as c_int;
        };
        // SAFETY: the caller's WR list (verbs contract).
        let outcome = unsafe { post_send_list(sq, &limits, ctx, wr) };
        // SAFETY: bad_wr is the caller's.
        let ret = unsafe { finish_post(&outcome, bad_wr) };
        if outcome.posted == 0 {
            return ret;
        }
        // SAFETY: ibqp is live.
        match unsafe { ring_doorbell(ibqp) } {
            0 => ret,
            db_err if ret == 0 => db_err,
            _ => ret,
        }
    })
}

unsafe extern "C" fn post_recv(
    ibqp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    guard(PANIC_ERRNO, || {
        let qp = outer::<_, Qp>(ibqp);
        // SAFETY: ibqp came from create_qp: a live Qp whose rq/max_recv_sge never change;
        // `state` is libibverbs' record of the last modify_qp.
        let (max_sge, rq, state) = unsafe { ((*qp).max_recv_sge, &(*qp).rq, (*ibqp).state) };
        let Some(rq) = rq.as_ref().filter(|_| wqe::recvs_allowed(state)) else {
            // The QP receives through an SRQ, or is in RESET.
            if !bad_wr.is_null() {
                // SAFETY: writable (verbs contract).
                unsafe { *bad_wr = wr };
            }
            return sys::EINVAL as c_int;
        };
        // SAFETY: the caller's WR list; bad_wr is the caller's.
        unsafe {
            let outcome = post_recv_list(rq, max_sge, wr);
            finish_post(&outcome, bad_wr)
        }
    })
}

unsafe extern "C" fn create_srq(
    ibpd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_srq_init_attr,
) -> *mut sys::ibv_srq {
    guard(ptr::null_mut(), || {
        let mut srq = new_object::<Srq>();
        let p = srq.as_mut_ptr();
        // SAFETY: p is zeroed memory of a Srq; taking a field address.
        let ibsrq = unsafe { ptr::addr_of_mut!((*p).vsrq.srq) };
        // SAFETY: all-zero request/response buffers are valid.
        let mut cmd: sys::ibv_create_srq = unsafe { core::mem::zeroed() };
        let mut resp: sys::metaroce_cmd_create_srq_resp = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them; ibsrq is zeroed at its final address.
        let ret = unsafe {
            sys::ibv_cmd_create_srq(
                ibpd,
                ibsrq,
                attr,
                &mut cmd,
                size_of::<sys::ibv_create_srq>(),
                ptr::addr_of_mut!(resp.ibv_resp),
                size_of::<sys::metaroce_cmd_create_srq_resp>(),
            )
        };
        if ret != 0 {
            set_errno(ret);
            return ptr::null_mut();
        }
        let drv = resp.drv_payload;
        // SAFETY: ibpd is live; attr now holds the kernel's max_wr/max_sge.
        let (cmd_fd, max_sge) = unsafe { ((*(*ibpd).context).cmd_fd, (*attr).attr.max_sge) };
        let mapped =
            map_ring::<wqe::RecvEntry>(cmd_fd, &drv.ring, "SRQ").and_then(|(map, ring)| {
                Producer::new(ring)
                    .map(|ring| (map, ring))
                    .map_err(|_| abi::ABI_MISMATCH_ERRNO)
            });
        match mapped {
            Ok((map, ring)) => {
                // The kernel's max_sge, at most what the entries hold.
                let max_sge = max_sge.min(wqe::recv_sge_capacity(ring.ring().geometry().stride));
                // SAFETY: writing our fields of the boxed Srq; attr is the caller's.
                unsafe {
                    ptr::addr_of_mut!((*p).max_sge).write(max_sge);
                    ptr::addr_of_mut!((*p).srq_num).write(drv.srq_num);
                    ptr::addr_of_mut!((*p).ring).write(Mutex::new(ring));
                    ptr::addr_of_mut!((*p).map).write(Mutex::new(map));
                    (*attr).attr.max_sge = max_sge;
                }
                // SAFETY: every field is initialised now.
                let p = Box::into_raw(unsafe { srq.assume_init() });
                // SAFETY: p is live; the same address the kernel got as user_handle.
                unsafe { ptr::addr_of_mut!((*p).vsrq.srq) }
            }
            Err(errno) => {
                // SAFETY: undo the kernel SRQ; the Box is freed without dropping uninit fields.
                unsafe { sys::ibv_cmd_destroy_srq(ibsrq) };
                set_errno(errno);
                ptr::null_mut()
            }
        }
    })
}

unsafe extern "C" fn modify_srq(
    ibsrq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
    attr_mask: c_int,
) -> c_int {
    guard(PANIC_ERRNO, || {
        let srq = outer::<_, Srq>(ibsrq);
        // SAFETY: ibsrq came from create_srq: a live Srq.
        let (ring, map) = unsafe { (&(*srq).ring, &(*srq).map) };
        // Posts wait while the SRQ may move to a new ring (`metaroce_modify_srq_cmd`).
        let mut ring = lock(ring);
        // SAFETY: plain integers; all-zero is valid.
        let mut info: sys::metaroce_mmap_info = unsafe { core::mem::zeroed() };
        // SAFETY: an all-zero request is valid.
        let mut cmd: sys::metaroce_cmd_modify_srq = unsafe { core::mem::zeroed() };
        cmd.drv_payload.mmap_info_addr = ptr::addr_of_mut!(info) as u64;
        // SAFETY: arguments as libibverbs passed them; `info` outlives the call.
        let ret = unsafe {
            sys::ibv_cmd_modify_srq(
                ibsrq,
                attr,
                attr_mask,
                ptr::addr_of_mut!(cmd.ibv_cmd),
                size_of::<sys::metaroce_cmd_modify_srq>(),
            )
        };
        if ret != 0 || attr_mask as u32 & sys::ibv_srq_attr_mask_IBV_SRQ_MAX_WR == 0 {
            return ret;
        }
        // The kernel took the new ring: posting goes on there, from its producer index. A
        // failure to map it leaves an SRQ that takes no more receives (as a CQ's resize).
        // SAFETY: ibsrq is live.
        let cmd_fd = unsafe { (*(*ibsrq).context).cmd_fd };
        let mapped = map_ring::<wqe::RecvEntry>(cmd_fd, &info, "SRQ").and_then(|(m, r)| {
            Producer::new(r)
                .map(|r| (m, r))
                .map_err(|_| abi::ABI_MISMATCH_ERRNO)
        });
        match mapped {
            Ok((m, r)) => {
                *ring = r;
                // The old mapping goes only now that nothing points into it.
                *lock(map) = m;
                0
            }
            Err(errno) => errno,
        }
    })
}

unsafe extern "C" fn query_srq(ibsrq: *mut sys::ibv_srq, attr: *mut sys::ibv_srq_attr) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: an all-zero request is valid.
        let mut cmd: sys::ibv_query_srq = unsafe { core::mem::zeroed() };
        // SAFETY: arguments as libibverbs passed them.
        unsafe { sys::ibv_cmd_query_srq(ibsrq, attr, &mut cmd, size_of::<sys::ibv_query_srq>()) }
    })
}

unsafe extern "C" fn destroy_srq(ibsrq: *mut sys::ibv_srq) -> c_int {
    guard(PANIC_ERRNO, || {
        // SAFETY: ibsrq came from create_srq and is destroyed once.
        let ret = unsafe { sys::ibv_cmd_destroy_srq(ibsrq) };
        if ret == 0 {
            // SAFETY: the Box leaked by create_srq; dropping it unmaps the ring.
            drop(unsafe { Box::from_raw(outer::<_, Srq>(ibsrq)) });
        }
        ret
    })
}

unsafe extern "C" fn post_srq_recv(
    ibsrq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    guard(PANIC_ERRNO, || {
        let srq = outer::<_, Srq>(ibsrq);
        // SAFETY: ibsrq came from create_srq: a live Srq whose max_sge/ring never change; the
        // WR list and bad_wr are the caller's.
        unsafe {
            let outcome = post_recv_list(&(*srq).ring, (*srq).max_sge, wr);
            finish_post(&outcome, bad_wr)
        }
    })
}

/// Safe views of the plain-data unions, for the tests of the safe modules.
#[cfg(test)]
pub(crate) mod union_views {
    use super::sys;

    /// The SGE member of a send WQE's payload.
    pub(crate) fn sge_of(w: &sys::metaroce_send_wqe) -> [sys::metaroce_sge; 12] {
        // SAFETY: both union members are integer arrays; every bit pattern is valid.
        unsafe { w.data.sge }
    }

    /// The inline-bytes member of a send WQE's payload.
    pub(crate) fn inline_of(w: &sys::metaroce_send_wqe) -> [u8; 192] {
        // SAFETY: as above.
        unsafe { w.data.inline_data }
    }

    /// `ibv_wc.imm_data` (shares its u32 with `invalidated_rkey`).
    pub(crate) fn wc_imm(wc: &sys::ibv_wc) -> u32 {
        // SAFETY: both union members are u32.
        unsafe { wc.__bindgen_anon_1.imm_data }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::ffi::CStr;

    #[test]
    fn device_ops() {
        let ops = &DEVICE_OPS.0;
        // SAFETY: name points at a 'static C string.
        assert_eq!(unsafe { CStr::from_ptr(ops.name) }, c"metaroce");
        assert_eq!(
            (ops.match_min_abi_version, ops.match_max_abi_version),
            (1, 1)
        );
        assert!(ops.alloc_device.is_some() && ops.uninit_device.is_some());
        assert!(ops.alloc_context.is_some());
        assert!(ops.match_device.is_none() && ops.import_context.is_none());
        assert!(ops.static_providers.is_null());
        assert!(ptr::eq(ops.match_table, MATCH_TABLE.0.as_ptr()));
    }

    #[test]
    fn match_table_is_our_driver_id_then_sentinel() {
        let [ours, end] = &MATCH_TABLE.0;
        assert_eq!(u32::from(ours.kind), sys::VERBS_MATCH_DRIVER_ID);
        // SAFETY: the entry was initialised through the driver_id member.
        assert_eq!(unsafe { ours.u.driver_id }, 0x4d52);
        assert_eq!(u32::from(end.kind), sys::VERBS_MATCH_SENTINEL);
        assert_eq!(sys::VERBS_MATCH_SENTINEL, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { end.u.driver_id }, 0);
        assert!(end.driver_data.is_null());
    }

    #[test]
    fn context_ops_only_what_is_implemented() {
        let ops = &CONTEXT_OPS;
        assert!(
            ops.query_device_ex.is_some() && ops.query_port.is_some() && ops.free_context.is_some()
        );
        assert!(ops.alloc_pd.is_some() && ops.dealloc_pd.is_some());
        assert!(ops.reg_mr.is_some() && ops.rereg_mr.is_some() && ops.dereg_mr.is_some());
        assert!(ops.create_cq.is_some() && ops.poll_cq.is_some() && ops.destroy_cq.is_some());
        assert!(ops.req_notify_cq.is_some());
        assert!(ops.create_qp.is_some() && ops.modify_qp.is_some() && ops.query_qp.is_some());
        assert!(ops.destroy_qp.is_some() && ops.post_send.is_some() && ops.post_recv.is_some());
        assert!(ops.create_srq.is_some() && ops.modify_srq.is_some() && ops.query_srq.is_some());
        assert!(ops.destroy_srq.is_some() && ops.post_srq_recv.is_some());
        assert!(ops.create_cq_ex.is_some() && ops.create_qp_ex.is_some());
        assert!(ops.create_ah.is_some() && ops.destroy_ah.is_some());
        assert!(ops.resize_cq.is_some());
        // Not implemented: libibverbs answers EOPNOTSUPP.
        assert!(ops.cq_event.is_none());
        assert!(ops.alloc_parent_domain.is_none() && ops.open_xrcd.is_none());
        assert!(ops.alloc_mw.is_some() && ops.bind_mw.is_some() && ops.dealloc_mw.is_some());
    }

    /// Ring memory in ordinary (8-aligned) heap memory: the Vec owns it, rings point into it.
    /// Its entries are of the smallest size (`T::MIN_SIZE`).
    pub(super) fn test_ring<T: RingEntry>(n: u32) -> (Vec<u64>, Geometry) {
        test_ring_of(n, T::MIN_SIZE)
    }

    /// A ring of `n` entries of `stride` bytes.
    pub(super) fn test_ring_of(n: u32, stride: usize) -> (Vec<u64>, Geometry) {
        let len = crate::ring::HDR_SIZE + n as usize * stride;
        let info = sys::metaroce_mmap_info {
            offset: 0,
            length: len as u64,
            num_entries: n,
            entry_size: stride as u32,
        };
        (vec![0u64; len / 8], Geometry::new(&info, stride).unwrap())
    }

    pub(super) fn view<T: RingEntry>(buf: &mut [u64], geo: Geometry) -> MappedRing<T> {
        // SAFETY: buf is 8-aligned, geo.map_len bytes, outlives every use in the test.
        unsafe { MappedRing::new(NonNull::new(buf.as_mut_ptr().cast()).unwrap(), geo) }
    }

    #[test]
    fn entries_larger_than_the_ring_stride_keep_their_first_stride_bytes() {
        let mut e = wqe::encode_send(
            &SendWr {
                wr_id: 7,
                opcode: sys::ibv_wr_opcode_IBV_WR_SEND,
                ..SendWr::default()
            },
            &RC,
            |_, _| {},
        )
        .unwrap();
        for (i, s) in e.more.iter_mut().enumerate() {
            s.addr = 0x1000 + i as u64;
            s.length = 1;
        }
        // The smallest entries: the structure only; the neighbours are not touched and what
        // is read back has zero SGEs past the structure.
        let (mut buf, geo) = test_ring::<wqe::SendEntry>(4);
        assert_eq!(geo.stride, 256);
        {
            let r = view::<wqe::SendEntry>(&mut buf, geo);
            r.write_entry(1, &e);
            let back = r.read_entry(1);
            assert_eq!(back.wr_id, 7);
            assert!(back.more.iter().all(|s| s.addr == 0));
            assert_eq!(r.read_entry(2).wr_id, 0);
        }
        let hdr = crate::ring::HDR_SIZE / 8;
        assert!(buf[hdr..hdr + 32].iter().all(|&w| w == 0));
        assert!(buf[hdr + 64..].iter().all(|&w| w == 0));
        // Entries of 20 SGEs: 8 of `more` kept.
        let (mut buf, geo) = test_ring_of(4, 64 + 16 * 20);
        let r = view::<wqe::SendEntry>(&mut buf, geo);
        r.write_entry(3, &e);
        let back = r.read_entry(3);
        assert_eq!(back.more[7].addr, 0x1007);
        assert_eq!(back.more[8].addr, 0);
        assert_eq!(r.read_entry(0).wr_id, 0);
        // The largest: all of it.
        let (mut buf, geo) = test_ring_of(2, 576);
        let r = view::<wqe::SendEntry>(&mut buf, geo);
        r.write_entry(0, &e);
        assert_eq!(r.read_entry(0).more[19].addr, 0x1013);
    }

    pub(super) fn send_wr(opcode: u32, sg: &mut [sys::ibv_sge]) -> sys::ibv_send_wr {
        // SAFETY: all-zero is a valid ibv_send_wr.
        let mut wr: sys::ibv_send_wr = unsafe { core::mem::zeroed() };
        wr.wr_id = 1000 + u64::from(opcode);
        wr.opcode = opcode;
        wr.sg_list = sg.as_mut_ptr();
        wr.num_sge = sg.len() as c_int;
        wr.send_flags = sys::ibv_send_flags_IBV_SEND_SIGNALED;
        wr
    }

    pub(super) fn link(wrs: &mut [sys::ibv_send_wr]) {
        for i in 1..wrs.len() {
            let next: *mut sys::ibv_send_wr = &mut wrs[i];
            wrs[i - 1].next = next;
        }
    }

    pub(super) const RC: SendLimits = SendLimits {
        qp_type: sys::ibv_qp_type_IBV_QPT_RC,
        max_sge: 4,
        max_inline: 64,
    };

    #[test]
    fn post_send_list_writes_wqes_and_stops_at_the_first_bad_wr() {
        let (mut buf, geo) = test_ring::<wqe::SendEntry>(8);
        let sq = SqState::new(Producer::new(view(&mut buf, geo)).unwrap());
        let payload = *b"hello, metaroce!";
        let mut inline_sg = [sys::ibv_sge {
            addr: payload.as_ptr() as u64,
            length: payload.len() as u32,
            lkey: 0,
        }];
        let mut sg2 = [
            sys::ibv_sge {
                addr: 0x1000,
                length: 100,
                lkey: 7,
            },
            sys::ibv_sge {
                addr: 0x2000,
                length: 200,
                lkey: 8,
            },
        ];
        let mut sg5 = [sys::ibv_sge {
            addr: 0,
            length: 1,
            lkey: 1,
        }; 5];
        let mut sg1 = [sys::ibv_sge {
            addr: 0x3000,
            length: 8,
            lkey: 9,
        }];
        let mut wrs = [
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM, &mut inline_sg),
            send_wr(sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE, &mut sg2),
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg5), // 5 SGEs > max 4
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg1),
        ];
        wrs[0].send_flags |= sys::ibv_send_flags_IBV_SEND_INLINE;
        wrs[0].__bindgen_anon_1.imm_data = 0x0102_0304;
        wrs[1].wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: 0xdead_0000,
            rkey: 0x55,
        };
        link(&mut wrs);
        let head: *mut sys::ibv_send_wr = &mut wrs[0];
        let bad_expected: *mut sys::ibv_send_wr = &mut wrs[2];
        // SAFETY: a valid list over live SGEs.
        let out = unsafe { post_send_list(&sq, &RC, ptr::null_mut(), head) };
        assert_eq!(out.posted, 2);
        assert_eq!(out.failed, Some((bad_expected, PostError::TooManySge)));
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: bad is writable.
        assert_eq!(unsafe { finish_post(&out, &mut bad) }, sys::EINVAL as c_int);
        assert_eq!(bad, bad_expected);

        let r = view::<wqe::SendEntry>(&mut buf, geo);
        assert_eq!((r.load_producer(), r.load_consumer()), (2, 0));
        let w0 = r.read_entry(0);
        assert_eq!(
            (w0.wr_id, w0.opcode, w0.num_sge, w0.inline_len),
            (1003, 3, 0, 16)
        );
        assert_eq!(w0.imm_data, 0x0102_0304);
        assert_eq!(w0.send_flags, 0x0a);
        // SAFETY: inline WQE: the bytes member.
        assert_eq!(unsafe { &w0.data.inline_data[..16] }, &payload);
        let w1 = r.read_entry(1);
        assert_eq!(
            (w1.wr_id, w1.opcode, w1.num_sge, w1.inline_len),
            (1000, 0, 2, 0)
        );
        assert_eq!((w1.remote_addr, w1.rkey), (0xdead_0000, 0x55));
        // SAFETY: SGE WQE.
        let s = unsafe { w1.data.sge };
        assert_eq!((s[1].addr, s[1].length, s[1].lkey), (0x2000, 200, 8));
    }

    #[test]
    fn post_send_list_enomem_when_full_and_einval_for_negative_num_sge() {
        let (mut buf, geo) = test_ring::<wqe::SendEntry>(2);
        let sq = SqState::new(Producer::new(view(&mut buf, geo)).unwrap());
        let mut sg = [sys::ibv_sge {
            addr: 0x3000,
            length: 8,
            lkey: 9,
        }];
        let mut wrs = [
            send_wr(sys::ibv_wr_opcode_IBV_WR_RDMA_READ, &mut sg),
            send_wr(sys::ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD, &mut sg),
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg),
        ];
        link(&mut wrs);
        let third: *mut sys::ibv_send_wr = &mut wrs[2];
        // SAFETY: a valid list.
        let out = unsafe { post_send_list(&sq, &RC, ptr::null_mut(), &mut wrs[0]) };
        assert_eq!(out.posted, 2);
        assert_eq!(out.failed, Some((third, PostError::QueueFull)));
        assert_eq!(out.failed.unwrap().1.errno(), sys::ENOMEM as c_int);
        // The kernel consumes one; a WR with a negative num_sge is refused untouched.
        view::<wqe::SendEntry>(&mut buf, geo).store_consumer(1);
        let mut neg = send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg);
        neg.num_sge = -1;
        // SAFETY: a one-element list.
        let out = unsafe { post_send_list(&sq, &RC, ptr::null_mut(), &mut neg) };
        assert_eq!(
            (out.posted, out.failed.unwrap().1.errno()),
            (0, sys::EINVAL as c_int)
        );
        // SAFETY: a NULL list posts nothing.
        let out = unsafe { post_send_list(&sq, &RC, ptr::null_mut(), ptr::null_mut()) };
        assert_eq!((out.posted, out.failed), (0, None));
    }

    /// A Qp as create_qp builds it, with an SQ in heap memory and a socket as "cmd_fd".
    pub(super) fn test_qp(sq: MappedRing<wqe::SendEntry>, ctx: *mut sys::ibv_context) -> *mut Qp {
        let mut qp = new_object::<Qp>();
        let p = qp.as_mut_ptr();
        // SAFETY: writing the fields of a zeroed Qp, as create_qp does.
        unsafe {
            (*p).vqp.__bindgen_anon_1.qp.context = ctx;
            (*p).vqp.__bindgen_anon_1.qp.handle = 77;
            // Posting takes an RTS QP (`wqe::sends_allowed`).
            (*p).vqp.__bindgen_anon_1.qp.state = sys::ibv_qp_state_IBV_QPS_RTS;
            ptr::addr_of_mut!((*p).limits).write(RC);
            ptr::addr_of_mut!((*p).max_recv_sge).write(1);
            ptr::addr_of_mut!((*p).sq).write(Some(SqState::new(Producer::new(sq).unwrap())));
            ptr::addr_of_mut!((*p).rq).write(None);
            ptr::addr_of_mut!((*p)._maps).write([None, None]);
            Box::into_raw(qp.assume_init())
        }
    }

    #[test]
    fn post_send_rings_the_doorbell_once_per_list() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let (kernel, user) = std::os::unix::net::UnixStream::pair().unwrap();
        kernel.set_nonblocking(true).unwrap();
        // SAFETY: all-zero is a valid ibv_context for reading cmd_fd.
        let mut ctx: Box<sys::ibv_context> = Box::new(unsafe { core::mem::zeroed() });
        ctx.cmd_fd = user.as_raw_fd();
        let (mut buf, geo) = test_ring::<wqe::SendEntry>(4);
        let qp = test_qp(view(&mut buf, geo), &mut *ctx);
        // SAFETY: qp is live.
        let ibqp = unsafe { ptr::addr_of_mut!((*qp).vqp.__bindgen_anon_1.qp) };
        let mut sg = [sys::ibv_sge {
            addr: 0x3000,
            length: 8,
            lkey: 9,
        }];
        let mut wrs = [
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg),
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg),
        ];
        link(&mut wrs);
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the callback as libibverbs calls it.
        assert_eq!(unsafe { post_send(ibqp, &mut wrs[0], &mut bad) }, 0);
        assert!(bad.is_null());
        let mut db = [0u8; 64];
        let n = (&kernel).read(&mut db).unwrap();
        assert_eq!(n, 32, "exactly one doorbell");
        let word = |i: usize| u32::from_ne_bytes(db[i..i + 4].try_into().unwrap());
        assert_eq!(
            word(0),
            sys::ib_uverbs_write_cmds_IB_USER_VERBS_CMD_POST_SEND
        );
        assert_eq!(u16::from_ne_bytes([db[4], db[5]]), 8); // in_words
        assert_eq!(u16::from_ne_bytes([db[6], db[7]]), 1); // out_words
        assert_ne!(u64::from_ne_bytes(db[8..16].try_into().unwrap()), 0); // response
        assert_eq!((word(16), word(20), word(24)), (77, 0, 0)); // handle, wr_count, sge_count
        assert_eq!(word(28) as usize, size_of::<sys::ibv_send_wr>());

        // A list whose first WR is bad: EINVAL, bad_wr set, no doorbell.
        wrs[0].opcode = sys::ibv_wr_opcode_IBV_WR_BIND_MW;
        // SAFETY: as above.
        assert_eq!(
            unsafe { post_send(ibqp, &mut wrs[0], &mut bad) },
            sys::EINVAL as c_int
        );
        assert_eq!(bad, &mut wrs[0] as *mut _);
        assert!(
            (&kernel).read(&mut db).is_err(),
            "no doorbell without new WQEs"
        );

        // A full ring: the WRs that fit are posted and rung, the rest refused with ENOMEM.
        wrs[0].opcode = sys::ibv_wr_opcode_IBV_WR_SEND;
        let mut more = [send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg)];
        wrs[1].next = &mut more[0];
        // SAFETY: as above.
        assert_eq!(
            unsafe { post_send(ibqp, &mut wrs[0], &mut bad) },
            sys::ENOMEM as c_int
        );
        assert_eq!(bad, &mut more[0] as *mut _);
        assert_eq!((&kernel).read(&mut db).unwrap(), 32);
        // SAFETY: the Box leaked by test_qp.
        drop(unsafe { Box::from_raw(qp) });
    }

    /// metaroce_dv_qp_rings() and metaroce_dv_qp_doorbell() on a QP of our device: the
    /// addresses are the mapped ring's, what an application writes through them is what the
    /// kernel's side of the ring reads, and the doorbell is the empty POST_SEND.
    #[test]
    fn dv_qp_rings_and_doorbell() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let (kernel, user) = std::os::unix::net::UnixStream::pair().unwrap();
        kernel.set_nonblocking(true).unwrap();
        // SAFETY: all-zero is a valid verbs_device / ibv_context for what is read of them.
        let mut dev: Box<sys::verbs_device> = Box::new(unsafe { core::mem::zeroed() });
        dev.ops = &DEVICE_OPS.0;
        // SAFETY: as above.
        let mut ctx: Box<sys::ibv_context> = Box::new(unsafe { core::mem::zeroed() });
        ctx.device = &mut dev.device;
        ctx.cmd_fd = user.as_raw_fd();
        let (mut buf, geo) = test_ring::<wqe::SendEntry>(8);
        let base = buf.as_mut_ptr().cast::<u8>() as usize;
        let qp = test_qp(view(&mut buf, geo), &mut *ctx);
        // SAFETY: qp is live.
        let ibqp = unsafe { ptr::addr_of_mut!((*qp).vqp.__bindgen_anon_1.qp) };
        // SAFETY: all-zero is a valid struct.
        let mut rings: sys::metaroce_dv_qp_rings = unsafe { core::mem::zeroed() };
        rings.comp_mask = 0x5;
        // SAFETY: a live QP of our device, a writable struct.
        assert_eq!(unsafe { dv::metaroce_dv_qp_rings(ibqp, &mut rings) }, 0);
        assert_eq!((rings.comp_mask, rings.reserved), (0, 0));
        let sq = rings.sq;
        assert_eq!(sq.buf as usize, base + crate::ring::HDR_SIZE);
        assert_eq!(sq.producer as usize, base + PRODUCER_OFFSET);
        assert_eq!(sq.consumer as usize, base + CONSUMER_OFFSET);
        assert_eq!(sq.entry_size as usize, size_of::<sys::metaroce_send_wqe>());
        assert_eq!(sq.num_entries, 8);
        // No RQ (test_qp has none, as a QP on an SRQ): all zero.
        assert!(rings.rq.buf.is_null() && rings.rq.producer.is_null());
        assert_eq!((rings.rq.entry_size, rings.rq.num_entries), (0, 0));

        // An application posts two WQEs itself, from slot 7 on (wrapping to slot 0).
        let kernel_view = view::<wqe::SendEntry>(&mut buf, geo);
        kernel_view.store_producer(7);
        kernel_view.store_consumer(7);
        for (i, index) in [7u32, 8].into_iter().enumerate() {
            // SAFETY: all-zero is a valid WQE.
            let mut w: sys::metaroce_dv_send_wqe = unsafe { core::mem::zeroed() };
            w.wr_id = 500 + i as u64;
            w.opcode = sys::ibv_wr_opcode_IBV_WR_SEND;
            let slot = (index & (sq.num_entries - 1)) as usize;
            // SAFETY: the slot's entry is inside the ring, 8-aligned; then the release store
            // of the producer index, as metaroce_dv.h tells applications to.
            unsafe {
                sq.buf
                    .cast::<u8>()
                    .add(slot * sq.entry_size as usize)
                    .cast::<sys::metaroce_dv_send_wqe>()
                    .write_volatile(w);
                AtomicU32::from_ptr(sq.producer).store(index + 1, Ordering::Release);
            }
        }
        assert_eq!(kernel_view.load_producer(), 9);
        let got: Vec<u64> = [7, 8].map(|i| kernel_view.read_entry(i).wr_id).to_vec();
        assert_eq!(got, [500, 501]);
        // The kernel's consumer index, as the application reads it.
        kernel_view.store_consumer(9);
        // SAFETY: the consumer index word of the ring header.
        assert_eq!(
            unsafe { AtomicU32::from_ptr(sq.consumer).load(Ordering::Acquire) },
            9
        );

        // SAFETY: a live QP of our device.
        assert_eq!(unsafe { dv::metaroce_dv_qp_doorbell(ibqp) }, 0);
        let mut db = [0u8; 64];
        assert_eq!((&kernel).read(&mut db).unwrap(), 32, "one empty POST_SEND");
        let word = |i: usize| u32::from_ne_bytes(db[i..i + 4].try_into().unwrap());
        assert_eq!(
            (word(0), word(16), word(20)),
            (sys::ib_uverbs_write_cmds_IB_USER_VERBS_CMD_POST_SEND, 77, 0)
        );
        // A failing command: its errno (EPIPE: nobody reads the "uverbs fd" any more).
        drop(kernel);
        // SAFETY: as above.
        assert_eq!(unsafe { dv::metaroce_dv_qp_doorbell(ibqp) }, 32);
        // SAFETY: the Box leaked by test_qp.
        drop(unsafe { Box::from_raw(qp) });
    }

    #[test]
    fn concurrent_posters_and_a_consuming_kernel() {
        use std::collections::HashSet;
        use std::sync::atomic::AtomicBool;
        const THREADS: u64 = 4;
        const PER_THREAD: u64 = 2000;
        let (mut buf, geo) = test_ring::<wqe::SendEntry>(16);
        let kernel = view::<wqe::SendEntry>(&mut buf, geo);
        // Start just below the u32 wrap.
        kernel.store_producer(u32::MAX - 5);
        kernel.store_consumer(u32::MAX - 5);
        let sq = SqState::new(Producer::new(view(&mut buf, geo)).unwrap());
        let done = AtomicBool::new(false);
        let done = &done;
        let (seen, last) = std::thread::scope(|s| {
            let consumer = s.spawn(move || {
                let mut seen = HashSet::new();
                let mut cons = kernel.load_consumer();
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let prod = kernel.load_producer();
                    assert!(prod.wrapping_sub(cons) <= 16);
                    while cons != prod {
                        let w = kernel.read_entry(cons);
                        assert!(seen.insert(w.wr_id), "wr_id {} twice", w.wr_id);
                        cons = cons.wrapping_add(1);
                    }
                    kernel.store_consumer(cons);
                    if finished && kernel.load_producer() == cons {
                        return (seen, cons);
                    }
                    std::thread::yield_now();
                }
            });
            let posters: Vec<_> = (0..THREADS)
                .map(|t| {
                    let sq = &sq;
                    s.spawn(move || {
                        let mut sg = [sys::ibv_sge {
                            addr: 0x1000,
                            length: 8,
                            lkey: 1,
                        }];
                        let mut next = 0;
                        while next < PER_THREAD {
                            let mut wr = send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg);
                            wr.wr_id = t << 32 | next;
                            // SAFETY: a one-element list over a live SGE.
                            let out = unsafe { post_send_list(sq, &RC, ptr::null_mut(), &mut wr) };
                            match out.failed {
                                None => next += 1,
                                Some((_, PostError::QueueFull)) => std::thread::yield_now(),
                                Some((_, e)) => panic!("{e:?}"),
                            }
                        }
                    })
                })
                .collect();
            for p in posters {
                p.join().unwrap();
            }
            done.store(true, Ordering::Release);
            consumer.join().unwrap()
        });
        assert_eq!(seen.len() as u64, THREADS * PER_THREAD);
        assert_eq!(
            last,
            (u32::MAX - 5).wrapping_add((THREADS * PER_THREAD) as u32)
        ); // wrapped
    }

    #[test]
    fn post_recv_list_checks_sges() {
        let (mut buf, geo) = test_ring::<wqe::RecvEntry>(4);
        let rq = Mutex::new(Producer::new(view(&mut buf, geo)).unwrap());
        let mut sg = [sys::ibv_sge {
            addr: 0x5000,
            length: 64,
            lkey: 3,
        }; 3];
        // SAFETY: all-zero is a valid ibv_recv_wr.
        let mut wrs: [sys::ibv_recv_wr; 2] = unsafe { core::mem::zeroed() };
        wrs[0].wr_id = 1;
        wrs[0].sg_list = sg.as_mut_ptr();
        wrs[0].num_sge = 2;
        wrs[1].wr_id = 2;
        wrs[1].sg_list = sg.as_mut_ptr();
        wrs[1].num_sge = 3;
        wrs[0].next = &mut wrs[1];
        let second: *mut sys::ibv_recv_wr = &mut wrs[1];
        // SAFETY: a valid list.
        let out = unsafe { post_recv_list(&rq, 2, &mut wrs[0]) };
        assert_eq!(out.posted, 1);
        assert_eq!(out.failed, Some((second, PostError::TooManySge)));
        let r = lock(&rq);
        let e = r.ring().read_entry(0);
        assert_eq!(
            (e.wr_id, e.num_sge, e.sge[1].addr, e.sge[1].lkey),
            (1, 2, 0x5000, 3)
        );
        assert_eq!(r.ring().load_producer(), 1);
    }

    /// A Context as alloc_context makes it (zeroed, as calloc'ed), its number of ports already
    /// known (so create_ah asks the kernel nothing), its commands going to `cmd_fd`.
    pub(super) fn test_context(num_ports: u8, cmd_fd: c_int) -> Box<Context> {
        // SAFETY: all-zero is a valid Context (integers, raw pointers, Option<fn>s, atomics).
        let mut ctx: Box<Context> = unsafe { Box::new_zeroed().assume_init() };
        ctx.num_ports.store(num_ports, Ordering::Relaxed);
        ctx.ibv_ctx.context.cmd_fd = cmd_fd;
        ctx
    }

    /// A PD on `ctx`, as far as create_ah looks at it.
    pub(super) fn test_pd(ctx: &mut Context) -> Box<sys::ibv_pd> {
        // SAFETY: all-zero is a valid ibv_pd.
        let mut pd: Box<sys::ibv_pd> = Box::new(unsafe { core::mem::zeroed() });
        pd.context = &mut ctx.ibv_ctx.context;
        pd
    }

    /// The attributes of an AH to `dgid` through port 1.
    pub(super) fn ah_attr(dgid: [u8; 16]) -> sys::ibv_ah_attr {
        // SAFETY: all-zero is a valid ibv_ah_attr.
        let mut a: sys::ibv_ah_attr = unsafe { core::mem::zeroed() };
        a.is_global = 1;
        a.port_num = 1;
        a.grh.dgid.raw = dgid;
        a.grh.sgid_index = 3;
        a.grh.hop_limit = 64;
        a
    }

    /// `ibv_create_ah` as libibverbs runs it: the op, then the AH's context and PD set.
    pub(super) fn make_ah(pd: &mut sys::ibv_pd, attr: &mut sys::ibv_ah_attr) -> *mut sys::ibv_ah {
        // SAFETY: the callback as libibverbs calls it, on a PD of our context.
        let ah = unsafe { create_ah(pd, attr) };
        if !ah.is_null() {
            // SAFETY: a live AH; what ibv_create_ah does after the op.
            unsafe {
                (*ah).context = pd.context;
                (*ah).pd = pd;
            }
        }
        ah
    }

    pub(super) const GID_V4: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 9];

    #[test]
    fn address_handles_live_in_userspace() {
        let mut ctx = test_context(2, -1);
        let mut pd = test_pd(&mut ctx);
        for port in [1, 2] {
            let mut a = ah_attr(GID_V4);
            a.port_num = port;
            let ah = make_ah(&mut pd, &mut a);
            assert!(!ah.is_null(), "port {port}");
            // SAFETY: a live AH of ours.
            assert_eq!(unsafe { (*outer::<_, Ah>(ah)).dgid }, GID_V4);
            // SAFETY: the callback as libibverbs calls it.
            assert_eq!(unsafe { destroy_ah(ah) }, 0);
        }
        // What ibv_init_ah_from_wc makes of a UD receive from an IPv4 sender (is_global, the
        // sender's GID from the GRH, dlid/sl/src_path_bits from the completion): accepted.
        let mut a = ah_attr(GID_V4);
        (a.dlid, a.sl, a.src_path_bits, a.grh.flow_label) = (0, 0, 0, 0);
        a.grh.traffic_class = 0;
        let ah = make_ah(&mut pd, &mut a);
        assert!(!ah.is_null());
        // SAFETY: as above.
        assert_eq!(unsafe { destroy_ah(ah) }, 0);

        // Refused, EINVAL, no AH.
        type Spoil = fn(&mut sys::ibv_ah_attr);
        let refusals: [(&str, Spoil); 4] = [
            ("no GRH", |a| a.is_global = 0),
            ("port 0", |a| a.port_num = 0),
            ("port 3 of 2", |a| a.port_num = 3),
            ("all-zero GID", |a| a.grh.dgid.raw = [0; 16]),
        ];
        for (what, spoil) in refusals {
            let mut a = ah_attr(GID_V4);
            spoil(&mut a);
            set_errno(0);
            assert!(make_ah(&mut pd, &mut a).is_null(), "{what}");
            assert_eq!(errno(), sys::EINVAL as c_int, "{what}");
        }
        set_errno(0);
        // SAFETY: the callback with a NULL attribute pointer.
        assert!(unsafe { create_ah(&mut *pd, ptr::null_mut()) }.is_null());
        assert_eq!(errno(), sys::EINVAL as c_int);
    }

    /// The ring memory of `buf` as bytes, and the bytes of slot `i` of a send ring in it.
    fn send_slot(buf: &[u64], i: usize) -> Vec<u8> {
        let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let at = crate::ring::HDR_SIZE + i * size_of::<sys::metaroce_send_wqe>();
        bytes[at..at + size_of::<sys::metaroce_send_wqe>()].to_vec()
    }

    pub(super) const UD: SendLimits = SendLimits {
        qp_type: sys::ibv_qp_type_IBV_QPT_UD,
        ..RC
    };

    #[test]
    fn ud_post_send_writes_the_address_vector() {
        use std::os::fd::AsRawFd;
        let (kernel, user) = std::os::unix::net::UnixStream::pair().unwrap();
        kernel.set_nonblocking(true).unwrap();
        let mut ctx = test_context(1, user.as_raw_fd());
        let mut pd = test_pd(&mut ctx);
        let ah = make_ah(&mut pd, &mut ah_attr(GID_V4));
        let (mut buf, geo) = test_ring::<wqe::SendEntry>(8);
        let qp = test_qp(view(&mut buf, geo), &mut ctx.ibv_ctx.context);
        // SAFETY: qp is live and not shared yet; a UD QP.
        let ibqp = unsafe {
            ptr::addr_of_mut!((*qp).limits).write(UD);
            ptr::addr_of_mut!((*qp).vqp.__bindgen_anon_1.qp)
        };
        let payload = *b"datagram";
        let mut sg = [sys::ibv_sge {
            addr: 0x3000,
            length: 8,
            lkey: 9,
        }];
        let mut inline_sg = [sys::ibv_sge {
            addr: payload.as_ptr() as u64,
            length: 8,
            lkey: 0,
        }];
        let mut wrs = [
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg),
            send_wr(sys::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM, &mut inline_sg),
        ];
        wrs[0].wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn: 0x00ab_cdef,
            remote_qkey: 0x1122_3344,
        };
        wrs[1].wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn: 1,
            remote_qkey: 0x8000_0000,
        };
        wrs[1].send_flags |= sys::ibv_send_flags_IBV_SEND_INLINE;
        wrs[1].__bindgen_anon_1.imm_data = 0x0102_0304u32.to_be();
        link(&mut wrs);
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the callback as libibverbs calls it, on a valid list.
        assert_eq!(unsafe { post_send(ibqp, &mut wrs[0], &mut bad) }, 0);
        let mut db = [0u8; 64];
        assert_eq!(std::io::Read::read(&mut &kernel, &mut db).unwrap(), 32);
        // The WQE bytes, exactly: header, then the address vector at offset 32, then the SGE.
        let expect = |wr_id: u64, opcode: u32, flags: u32, sges: u32, inline: u32, imm: u32| {
            let mut v = Vec::new();
            v.extend(wr_id.to_ne_bytes());
            for x in [opcode, flags, sges, inline, imm, 0] {
                v.extend(x.to_ne_bytes());
            }
            v
        };
        let s0 = send_slot(&buf, 0);
        assert_eq!(&s0[..32], &expect(1002, 2, 2, 1, 0, 0)[..]);
        assert_eq!(&s0[32..48], &GID_V4);
        assert_eq!(&s0[48..52], &0x00ab_cdefu32.to_ne_bytes());
        assert_eq!(&s0[52..56], &0x1122_3344u32.to_ne_bytes());
        assert_eq!(&s0[56..64], &[0; 8]);
        let mut sge = 0x3000u64.to_ne_bytes().to_vec();
        sge.extend(8u32.to_ne_bytes());
        sge.extend(9u32.to_ne_bytes());
        assert_eq!(&s0[64..80], &sge[..]);
        assert!(s0[80..].iter().all(|&b| b == 0));
        let s1 = send_slot(&buf, 1);
        assert_eq!(
            &s1[..32],
            &expect(1003, 3, 2 | 8, 0, 8, 0x0102_0304u32.to_be())[..]
        );
        assert_eq!(&s1[32..48], &GID_V4);
        assert_eq!(&s1[48..56], &[1, 0, 0, 0, 0, 0, 0, 0x80]);
        assert_eq!(&s1[64..72], &payload);

        // Refused with EINVAL and bad_wr, nothing posted: a NULL AH, a foreign AH (another
        // context's), an RDMA write, a read.
        let mut other_ctx = test_context(1, -1);
        let mut other_pd = test_pd(&mut other_ctx);
        let foreign = make_ah(&mut other_pd, &mut ah_attr(GID_V4));
        let mut w = send_wr(sys::ibv_wr_opcode_IBV_WR_SEND, &mut sg);
        for (what, opcode, ah) in [
            ("NULL AH", sys::ibv_wr_opcode_IBV_WR_SEND, ptr::null_mut()),
            ("foreign AH", sys::ibv_wr_opcode_IBV_WR_SEND, foreign),
            ("RDMA write", sys::ibv_wr_opcode_IBV_WR_RDMA_WRITE, ah),
            ("RDMA read", sys::ibv_wr_opcode_IBV_WR_RDMA_READ, ah),
            ("atomic", sys::ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD, ah),
        ] {
            w.opcode = opcode;
            w.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                ah,
                remote_qpn: 5,
                remote_qkey: 6,
            };
            bad = ptr::null_mut();
            // SAFETY: as above.
            let ret = unsafe { post_send(ibqp, &mut w, &mut bad) };
            assert_eq!(
                (ret, bad),
                (sys::EINVAL as c_int, &mut w as *mut _),
                "{what}"
            );
        }
        assert!(
            std::io::Read::read(&mut &kernel, &mut db).is_err(),
            "no doorbell"
        );
        assert_eq!(view::<wqe::SendEntry>(&mut buf, geo).load_producer(), 2);
        // SAFETY: the AHs and the Box leaked by test_qp, each freed once.
        unsafe {
            assert_eq!(destroy_ah(ah), 0);
            assert_eq!(destroy_ah(foreign), 0);
            drop(Box::from_raw(qp));
        }
    }

    /// A UD receive's completion as the kernel writes it (ABI: GRH in front, byte_len 40 +
    /// the payload, IBV_WC_GRH, src_qp).
    pub(super) const UD_RECV: sys::metaroce_cqe = sys::metaroce_cqe {
        wr_id: 77,
        status: 0,
        opcode: sys::ibv_wc_opcode_IBV_WC_RECV,
        vendor_err: 0,
        byte_len: 40 + 100,
        imm_data: 0x0a0b_0c0du32.to_be(),
        qp_num: 0x11,
        src_qp: 0x00ab_cdef,
        wc_flags: sys::ibv_wc_flags_IBV_WC_GRH | sys::ibv_wc_flags_IBV_WC_WITH_IMM,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
        reserved: [0; 18],
    };

    #[test]
    fn a_ud_receive_completes_with_its_source() {
        let (mut buf, geo) = test_ring::<sys::metaroce_cqe>(4);
        let cq = CqState::new(Consumer::new(view::<sys::metaroce_cqe>(&mut buf, geo)).unwrap());
        let kernel = view::<sys::metaroce_cqe>(&mut buf, geo);
        kernel.write_entry(0, &UD_RECV);
        let mut plain = UD_RECV;
        (plain.wc_flags, plain.imm_data, plain.byte_len) = (sys::ibv_wc_flags_IBV_WC_GRH, 0, 40);
        (plain.pkey_index, plain.sl, plain.slid) = (2, 5, 0x1234);
        kernel.write_entry(1, &plain);
        kernel.store_producer(2);
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wc: [sys::ibv_wc; 2] = unsafe { core::mem::zeroed() };
        // SAFETY: wc has room for 2.
        assert_eq!(unsafe { poll_into(&cq, 2, wc.as_mut_ptr()) }, 2);
        let w = &wc[0];
        assert_eq!((w.wr_id, w.status, w.opcode), (77, 0, 128));
        assert_eq!((w.byte_len, w.qp_num, w.src_qp), (140, 0x11, 0x00ab_cdef));
        assert_eq!(w.wc_flags, 3); // IBV_WC_GRH | IBV_WC_WITH_IMM, libibverbs' bits
        assert_eq!(union_views::wc_imm(w), 0x0a0b_0c0du32.to_be());
        let w = &wc[1];
        assert_eq!((w.byte_len, w.wc_flags, w.src_qp), (40, 1, 0x00ab_cdef));
        assert_eq!((w.pkey_index, w.sl, w.slid), (2, 5, 0x1234));
    }

    #[test]
    fn poll_into_translates_and_frees_cqes() {
        let (mut buf, geo) = test_ring::<sys::metaroce_cqe>(4);
        let cq = CqState::new(Consumer::new(view::<sys::metaroce_cqe>(&mut buf, geo)).unwrap());
        let kernel = view::<sys::metaroce_cqe>(&mut buf, geo);
        for i in 0..3u32 {
            kernel.write_entry(
                i,
                &sys::metaroce_cqe {
                    wr_id: 500 + u64::from(i),
                    status: 0,
                    opcode: sys::ibv_wc_opcode_IBV_WC_RECV,
                    vendor_err: 0,
                    byte_len: 10 * i,
                    imm_data: 0,
                    qp_num: 9,
                    src_qp: 0,
                    wc_flags: 0,
                    pkey_index: 0,
                    slid: 0,
                    sl: 0,
                    dlid_path_bits: 0,
                    reserved: [0; 18],
                },
            );
        }
        kernel.store_producer(3);
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wc: [sys::ibv_wc; 4] = unsafe { core::mem::zeroed() };
        // SAFETY: wc has room for 4.
        assert_eq!(unsafe { poll_into(&cq, 2, wc.as_mut_ptr()) }, 2);
        assert_eq!(
            (wc[0].wr_id, wc[1].wr_id, wc[1].byte_len, wc[1].qp_num),
            (500, 501, 10, 9)
        );
        assert_eq!(kernel.load_consumer(), 2);
        // SAFETY: as above.
        assert_eq!(unsafe { poll_into(&cq, 4, wc.as_mut_ptr()) }, 1);
        assert_eq!((wc[0].wr_id, wc[0].opcode), (502, 128));
        // SAFETY: as above; ne <= 0 polls nothing.
        assert_eq!(unsafe { poll_into(&cq, 4, wc.as_mut_ptr()) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { poll_into(&cq, -1, wc.as_mut_ptr()) }, 0);
        // A producer claiming more than the ring: an error, nothing consumed.
        kernel.store_producer(3 + 5);
        // SAFETY: as above.
        assert_eq!(unsafe { poll_into(&cq, 4, wc.as_mut_ptr()) }, -1);
        assert_eq!(kernel.load_consumer(), 3);
    }

    #[test]
    fn device_alloc_and_free() {
        // SAFETY: all-zero is a valid verbs_sysfs_dev for reading abi_ver.
        let mut sysfs: sys::verbs_sysfs_dev = unsafe { core::mem::zeroed() };
        sysfs.abi_ver = 1;
        // SAFETY: the callbacks as libibverbs would call them.
        unsafe {
            let vdev = alloc_device(&mut sysfs);
            assert!(!vdev.is_null());
            assert_eq!((*vdev.cast::<Device>()).abi_ver, 1);
            assert!((*vdev).ops.is_null());
            uninit_device(vdev);
        }
    }

    #[test]
    fn guard_contains_panics() {
        assert_eq!(guard(7, || -> i32 { panic!("boom") }), 7);
        assert_eq!(guard(7, || 3), 3);
    }
}
