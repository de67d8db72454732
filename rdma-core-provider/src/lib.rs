// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! libibverbs provider for the metaroce RDMA device.
//!
//! rdma-core loads this cdylib as `libmetaroce-rdmav34.so` (named by
//! `/etc/libibverbs.d/metaroce.driver`); its constructor registers a `verbs_device_ops` that
//! binds devices whose netlink driver id is `METAROCE_DRIVER_ID` and whose uverbs ABI version
//! is `METAROCE_UVERBS_ABI_VERSION` (both from `uapi/metaroce-abi.h`).
//!
//! `ffi` holds all unsafe code (bindings, callbacks, registration, the mapped rings); `abi`,
//! `ring` (ring geometry, index math, producer/consumer) and `wqe` (WQE encoding, CQE
//! translation) are the safe logic.

#![deny(unsafe_code)]
#![warn(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod ring;
pub mod wqe;

#[allow(unsafe_code)]
mod ffi;
