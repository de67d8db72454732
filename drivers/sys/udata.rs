// SPDX-License-Identifier: GPL-2.0

//! The driver data of a uverbs call (`struct ib_udata`): the caller's input and output
//! buffers in user memory. A [`Udata`] lives for the one call; every copy goes through the
//! core's helpers (`ib_copy_from_udata`, `ib_copy_to_udata`, `ib_is_udata_cleared`), which check
//! the user buffer, so nothing here can touch memory the caller did not give.

use super::{bindings, ring::RingInfo};
use crate::datapath::{ConnInfo, PathInfo};
use core::{
    marker::PhantomData,
    mem::{offset_of, size_of},
    ptr::NonNull,
};
use kernel::{
    prelude::*,
    transmute::AsBytes,
    uaccess::{UserPtr, UserSlice},
};

/// A user address a command named for a ring's description (`struct metaroce_mmap_info`),
/// written through the kernel's user-copy checks.
pub(crate) struct RingInfoOut {
    addr: usize,
}

impl RingInfoOut {
    /// Writes `ring`'s description there (EFAULT if the caller's memory is not writable).
    pub(crate) fn write(&self, ring: RingInfo) -> Result {
        let info: bindings::metaroce_mmap_info = ring.into();
        let len = size_of::<bindings::metaroce_mmap_info>();
        UserSlice::new(UserPtr::from_addr(self.addr), len)
            .writer()
            .write(&info)
    }
}

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
    pub(crate) fn ucontext(&self) -> Result<Ucontext<'call>> {
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
        Ok(Ucontext {
            raw: NonNull::new(ctx).ok_or(EINVAL)?,
            _call: PhantomData,
        })
    }

    /// Answers a `create_cq` with its ring.
    pub(crate) fn respond_cq(&self, ring: RingInfo) -> Result {
        self.respond(&bindings::metaroce_create_cq_resp { ring: ring.into() })
    }

    /// Answers a `create_srq` with its ring and number.
    pub(crate) fn respond_srq(&self, ring: RingInfo, srqn: u32) -> Result {
        self.respond(&bindings::metaroce_create_srq_resp {
            ring: ring.into(),
            srq_num: srqn,
            reserved: 0,
        })
    }

    /// Where a `modify_srq` that resizes wants the new ring's description written
    /// (`struct metaroce_modify_srq_cmd`): EINVAL without one, EOPNOTSUPP for a longer command
    /// than this driver knows (its extra bytes not zero).
    pub(crate) fn modify_srq_ring_out(&self) -> Result<RingInfoOut> {
        let mut cmd = [0u8; size_of::<bindings::metaroce_modify_srq_cmd>()];
        if self.read_head(&mut cmd)? < cmd.len() {
            return Err(EINVAL);
        }
        if !self.cleared_from(cmd.len()) {
            return Err(EOPNOTSUPP);
        }
        let addr = u64::from_ne_bytes(cmd);
        if addr == 0 {
            return Err(EINVAL);
        }
        Ok(RingInfoOut {
            addr: usize::try_from(addr).map_err(|_| EINVAL)?,
        })
    }

    /// Answers a `create_qp` with its rings (no RQ with an SRQ) and inline room.
    pub(crate) fn respond_qp(&self, sq: RingInfo, rq: Option<RingInfo>, max_inline: u32) -> Result {
        self.respond(&bindings::metaroce_create_qp_resp {
            sq: sq.into(),
            rq: rq.map(Into::into).unwrap_or_default(),
            max_inline_data: max_inline,
            reserved: 0,
        })
    }

    /// How many path entries the direct verbs' `modify_qp` answer has room for, if it has room
    /// for its fixed part (a stock `modify_qp` gives none).
    pub(crate) fn modify_qp_path_room(&self) -> Option<usize> {
        let head = size_of::<bindings::metaroce_modify_qp_resp>();
        let entry = size_of::<bindings::metaroce_path_info>();
        let outlen = self.outlen();
        (outlen >= head).then(|| (outlen - head) / entry)
    }

    /// Answers a direct verbs' `modify_qp`: the QP's planes and connection, and its paths (as
    /// many as [`Self::modify_qp_path_room`] allows).
    pub(crate) fn respond_modify_qp(
        &self,
        plane_mask: u32,
        conn: Option<&ConnInfo>,
        paths: &[PathInfo],
    ) -> Result {
        let Some(room) = self.modify_qp_path_room() else {
            return Ok(());
        };
        let paths = paths.get(..room.min(paths.len())).unwrap_or(&[]);
        let head = size_of::<bindings::metaroce_modify_qp_resp>();
        let entry = size_of::<bindings::metaroce_path_info>();
        let mut out: KVec<u8> = KVec::with_capacity(head + paths.len() * entry, GFP_KERNEL)?;
        let mut resp = bindings::metaroce_modify_qp_resp {
            plane_mask,
            ..Default::default()
        };
        if let Some(c) = conn {
            resp.connected = 1;
            resp.planes = c.planes;
            resp.planes_up = c.planes_up;
            resp.num_paths = c.paths;
            resp.qps = c.qps;
            resp.num_path_info = paths.len() as u32;
        }
        resp.response_length = (head + paths.len() * entry) as u32;
        out.extend_from_slice(resp.as_bytes(), GFP_KERNEL)?;
        for p in paths {
            let e = bindings::metaroce_path_info {
                path_id: p.id,
                plane: p.plane,
                state: p.state,
                udp_sport: p.sport,
                reserved: 0,
                srtt_us: p.srtt_us,
                cwnd: p.cwnd,
                in_flight: p.in_flight,
                reserved1: 0,
                packets_sent: p.sent,
                retransmits: p.retransmits,
                ecn_marks: p.ecn_marks,
                timeouts: p.timeouts,
            };
            out.extend_from_slice(e.as_bytes(), GFP_KERNEL)?;
        }
        // At most `outlen` bytes: the fixed part and at most `room` entries.
        self.write(&out)
    }
}

/// The user context (`ibv_open_device`) of a uverbs call, for the call.
pub(crate) struct Ucontext<'call> {
    raw: NonNull<bindings::ib_ucontext>,
    _call: PhantomData<&'call bindings::ib_ucontext>,
}

impl Ucontext<'_> {
    /// The live context of one of our devices, for the call (type invariant).
    pub(super) fn as_ptr(&self) -> *mut bindings::ib_ucontext {
        self.raw.as_ptr()
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
unsafe impl AsBytes for bindings::metaroce_mmap_info {}
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
