// SPDX-License-Identifier: GPL-2.0

//! The driver data of a uverbs call (`struct ib_udata`): the caller's input and output
//! buffers in user memory. A [`Udata`] lives for the one call; every copy goes through the
//! core's helpers (`ib_copy_from_udata`, `ib_copy_to_udata`, `ib_is_udata_cleared`), which check
//! the user buffer, so nothing here can touch memory the caller did not give.

use super::bindings;
use core::{marker::PhantomData, mem::offset_of, ptr::NonNull};
use kernel::{prelude::*, transmute::AsBytes};

/// The driver udata of the current uverbs call.
pub(crate) struct Udata<'call> {
    raw: NonNull<bindings::ib_udata>,
    _call: PhantomData<&'call mut bindings::ib_udata>,
}

impl<'call> Udata<'call> {
    /// The udata a trampoline got, or None for a kernel consumer's call (no udata).
    ///
    /// # Safety
    ///
    /// `raw` must be null or the live udata of the current uverbs call, for `'call`.
    pub(super) unsafe fn from_raw(raw: *mut bindings::ib_udata) -> Option<Self> {
        Some(Udata {
            raw: NonNull::new(raw)?,
            _call: PhantomData,
        })
    }

    fn get(&self) -> &bindings::ib_udata {
        // SAFETY: live for `'call` (type invariant); the core does not change it meanwhile.
        unsafe { self.raw.as_ref() }
    }

    /// Bytes of input the caller gave.
    pub(crate) fn inlen(&self) -> usize {
        self.get().inlen
    }

    /// Bytes of output room the caller gave.
    pub(crate) fn outlen(&self) -> usize {
        self.get().outlen
    }

    /// Copies the first `min(inlen, out.len())` bytes of the input into `out`; returns how many.
    pub(crate) fn read_head(&self, out: &mut [u8]) -> Result<usize> {
        let n = self.inlen().min(out.len());
        // SAFETY: `out` has `n` writable bytes; the helper checks the user buffer and copies
        // at most `n` (`n <= inlen`).
        let err = unsafe {
            bindings::metaroce_glue_copy_from_udata(out.as_mut_ptr().cast(), self.raw.as_ptr(), n)
        };
        if err != 0 {
            return Err(Error::from_errno(err));
        }
        Ok(n)
    }

    /// Whether every input byte from `from` on is zero (none: true). What a newer provider's
    /// longer command asks beyond what this driver knows must be nothing.
    pub(crate) fn cleared_from(&self, from: usize) -> bool {
        let len = self.inlen();
        // SAFETY: the helper reads at most `len - from` bytes of the user buffer at `from`,
        // checking it.
        len <= from
            || unsafe {
                bindings::metaroce_glue_is_udata_cleared(self.raw.as_ptr(), from, len - from)
            }
    }

    /// Writes as much of `bytes` as the output room takes.
    pub(crate) fn write(&self, bytes: &[u8]) -> Result {
        let n = bytes.len().min(self.outlen());
        // SAFETY: `bytes` has `n` readable bytes; the helper only reads them (its `src` is not
        // const in C) and checks the user buffer.
        let err = unsafe {
            bindings::metaroce_glue_copy_to_udata(
                self.raw.as_ptr(),
                bytes.as_ptr().cast_mut().cast(),
                n,
            )
        };
        if err != 0 {
            return Err(Error::from_errno(err));
        }
        Ok(())
    }

    /// Writes a driver response (as much of it as the output room takes).
    pub(crate) fn respond<T: AsBytes>(&self, resp: &T) -> Result {
        self.write(resp.as_bytes())
    }

    /// The user context of the call (the `uverbs_attr_bundle` this udata is part of).
    pub(super) fn ucontext(&self) -> Result<*mut bindings::ib_ucontext> {
        let offset = offset_of!(bindings::uverbs_attr_bundle, __bindgen_anon_1)
            + offset_of!(
                bindings::uverbs_attr_bundle__bindgen_ty_1__bindgen_ty_1,
                driver_udata
            );
        // SAFETY: a uverbs call's driver udata sits `offset` bytes into its bundle
        // (`rdma_udata_to_drv_context` does the same `container_of`); the bundle lives for the
        // call.
        let ctx = unsafe {
            let bundle = self
                .raw
                .as_ptr()
                .cast::<u8>()
                .sub(offset)
                .cast::<bindings::uverbs_attr_bundle>();
            (*bundle).__bindgen_anon_1.__bindgen_anon_1.context
        };
        if ctx.is_null() {
            return Err(EINVAL);
        }
        Ok(ctx)
    }
}

// The driver responses are plain `__u32`/`__u64` structs with explicit padding fields
// (`uapi/metaroce-abi.h`: "fixed widths, explicit padding"), so every byte is initialised.
// SAFETY: as above.
unsafe impl AsBytes for bindings::metaroce_alloc_ucontext_resp {}
// SAFETY: as above.
unsafe impl AsBytes for bindings::metaroce_create_cq_resp {}
// SAFETY: as above.
unsafe impl AsBytes for bindings::metaroce_create_srq_resp {}
// SAFETY: as above.
unsafe impl AsBytes for bindings::metaroce_create_qp_resp {}
// SAFETY: as above.
unsafe impl AsBytes for bindings::metaroce_path_info {}
// SAFETY: as above (its flexible array member is empty).
unsafe impl AsBytes for bindings::metaroce_modify_qp_resp {}

// No padding anywhere: each size is the sum of its fields'.
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<bindings::metaroce_alloc_ucontext_resp>() == 4 * 4 + 2 * 8);
    assert!(size_of::<bindings::metaroce_mmap_info>() == 2 * 8 + 2 * 4);
    assert!(size_of::<bindings::metaroce_create_cq_resp>() == 24);
    assert!(size_of::<bindings::metaroce_create_srq_resp>() == 24 + 2 * 4);
    assert!(size_of::<bindings::metaroce_create_qp_resp>() == 2 * 24 + 2 * 4);
    assert!(size_of::<bindings::metaroce_path_info>() == 2 + 1 + 1 + 2 + 2 + 4 * 4 + 4 * 8);
    assert!(size_of::<bindings::metaroce_modify_qp_resp>() == 8 * 4);
};
