// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Every `unsafe` line of the provider lives here: the generated rdma-core bindings, the
//! `verbs_device_ops` / `verbs_context_ops` tables handed to libibverbs, the callbacks behind
//! them, and the constructor that registers the provider.
//!
//! Object layout (all memory comes from the C allocator and goes back to `free`):
//! - [`Device`] embeds `struct verbs_device` at offset 0; `alloc_device` callocs it and
//!   `uninit_device` frees it.
//! - [`Context`] embeds `struct verbs_context` at offset 0; libibverbs callocs it in
//!   `_verbs_init_and_alloc_context` and `free_context` frees it.
//!
//! No callback lets a panic escape: each runs its body under [`guard`].

use crate::abi::{self, DeviceInfo};
use core::ffi::{c_int, c_void};
use core::mem::{offset_of, size_of};
use core::ptr;
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

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

// The plugin file name (libmetaroce-rdmav34.so) and the symbol below are tied to this.
const _: () = assert!(sys::IBVERBS_PABI_VERSION == 34);

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
            let vctx = container_of::<_, sys::verbs_context>(
                ibctx,
                offset_of!(sys::verbs_context, context),
            );
            let ctx = container_of::<_, Context>(vctx, offset_of!(Context, ibv_ctx));
            sys::verbs_uninit_context(vctx);
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
        // The next issue fills these in; until then libibverbs answers EOPNOTSUPP.
        assert!(ops.alloc_pd.is_none() && ops.reg_mr.is_none());
        assert!(ops.create_cq.is_none() && ops.create_qp.is_none());
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
