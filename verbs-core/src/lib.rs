// SPDX-License-Identifier: GPL-2.0

//! metaroce's verbs rules: everything the driver decides about what userspace hands it, with
//! no kernel types, no `unsafe` and no allocation, so that it is unit-tested and fuzzed on the
//! host and compiled unchanged into the kernel module (`#[path]`, as the transport core is).
//!
//! - [`ib`]: the verbs' numbers (QP states and types, attribute mask bits, opcodes, flags,
//!   completion statuses) as the kernel's `ib_verbs.h` defines them; the module checks each
//!   against its bindings at compile time.
//! - [`qp`]: the QP state machine (which `modify_qp` is allowed, the core's table) and the
//!   attributes a modify sets, validated before anything is committed.
//! - [`caps`]: the device's limits and the queue capacities a create asks for.
//! - [`mr`]: what an `ibv_rereg_mr` may change of a memory region.
//! - [`frwr`]: fast registration MRs of kernel consumers (`IB_WR_REG_MR`, invalidation).
//! - [`mw`]: memory windows: binding, invalidating, and remote access through one.
//! - [`mcast`]: multicast groups and the UD QPs attached to them.
//! - [`abi`]: the shared-ring entries of `uapi/metaroce-abi.h`, as plain data.
//! - [`lists`]: SGE lists longer than the transport core carries, kept per QP.
//! - [`wqe`]: send and receive WQEs copied out of a ring, judged (fatal, refused, usable) and
//!   decoded.
//! - [`queue`]: ring index arithmetic: what a user-written producer index may claim.
//! - [`udata`]: the driver data of the direct verbs' `modify_qp`.
//!
//! This file holds only attributes and `mod` lines; the modules refer to each other with
//! `super::` (in the kernel this tree is a module, not a crate).
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(test)]
extern crate std;

pub mod abi;
pub mod caps;
pub mod frwr;
pub mod ib;
pub mod lists;
pub mod mcast;
pub mod mr;
pub mod mw;
pub mod qp;
pub mod queue;
pub mod udata;
pub mod wqe;
