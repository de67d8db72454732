// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! libibverbs provider for the metaroce RDMA device.
//!
//! The cdylib is `libmetaroce.so.1`; rdma-core loads it as `libibverbs/libmetaroce-rdmav34.so`
//! (a symlink to it, named by `/etc/libibverbs.d/metaroce.driver`); its constructor registers a
//! `verbs_device_ops` that binds devices whose netlink driver id is `METAROCE_DRIVER_ID` and
//! whose uverbs ABI version is `METAROCE_UVERBS_ABI_VERSION` (both from `uapi/metaroce-abi.h`).
//! Applications link it (`-lmetaroce`) for the direct verbs of `metaroce_dv.h`, its only
//! exported symbols.
//!
//! `ffi` holds all unsafe code (bindings, callbacks, registration, the mapped rings, the
//! exported direct verbs); `abi`, `ring` (ring geometry, index math, producer/consumer), `wqe`
//! (WQE encoding, CQE translation), `session` (a lock held across calls), `ex` (the extended
//! CQ and QP verbs: accepted attributes, `ibv_wr_*` batches) and `dv` (the direct verbs'
//! command and response) are the safe logic.

#![deny(unsafe_code)]
#![warn(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod dv;
pub mod ex;
pub mod ring;
pub mod session;
pub mod wqe;

#[allow(unsafe_code)]
mod ffi;
