// SPDX-License-Identifier: GPL-2.0

//! metaroce: an RDMA device that speaks MetaRoCE over UDP on one or more netdevs.
//!
//! `rdma link add mroce0 type metaroce netdev eth0` creates a device. The crate is split the
//! way nova-core is: this root holds only the module; [`sys`] is the one layer that touches C
//! (bindings, ops tables, every `unsafe`); everything else is safe Rust.

use kernel::prelude::*;

mod counters;
mod datapath;
mod device;
mod frwr;
mod gsi;
mod mw;
mod net;
mod ops;
mod sys;

/// The MetaRoCE transport core: the same `no_std`, sans-IO source the host tests drive.
#[path = "../transport/src/lib.rs"]
#[allow(
    unused_attributes,
    unused_imports,
    unreachable_pub,
    missing_docs,
    dead_code,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks
)]
mod transport;
mod verbs;

/// The verbs rules (QP states and attributes, WQE verdicts, ring bounds, driver data): the
/// same `no_std`, safe source the host tests and fuzzes.
#[path = "../verbs-core/src/lib.rs"]
#[allow(
    unused_attributes,
    unused_imports,
    unreachable_pub,
    missing_docs,
    dead_code,
    clippy::all,
    clippy::pedantic
)]
mod verbs_core;

module! {
    type: MetaRoce,
    name: "metaroce",
    authors: ["The metaroce developers"],
    description: "MetaRoCE: multipath, loss-tolerant RDMA over UDP",
    license: "GPL",
    alias: ["rdma-link-metaroce"],
}

struct MetaRoce {
    _registration: sys::Registration,
}

impl kernel::Module for MetaRoce {
    fn init(module: &'static ThisModule) -> Result<Self> {
        let registration = sys::Registration::new(module)?;
        pr_info!("loaded (uverbs ABI {})\n", sys::UVERBS_ABI_VERSION);
        Ok(MetaRoce {
            _registration: registration,
        })
    }
}
