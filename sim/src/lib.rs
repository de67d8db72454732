// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! metaroce-sim: a deterministic packet-level simulator of a data-centre fabric (leaf-spine
//! Clos per plane, ECN-marking tail-drop egress queues, ECMP on the UDP 5-tuple, random loss,
//! link and switch failures) carrying collectives over the real MetaRoCE transport
//! (`metaroce-transport`, unchanged) and over two simple baselines in the same fabric: a
//! RoCEv2-like transport (one path per QP, go-back-N, DCQCN) and an IRN-like one (one path,
//! selective repeat, BDP window, DCQCN).

pub mod baseline;
pub mod endpoint;
pub mod fabric;
pub mod meta;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod slots;
pub mod workload;
