// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! MetaRoCE sans-IO transport core.
//!
//! The protocol logic with no I/O, no allocation and no clock of its own: the caller feeds
//! datagrams and time in and takes datagrams, timer deadlines and completions out. The Linux
//! kernel module compiles this source tree in as a module (`#[path]`), so this file holds only
//! attributes and `mod`/`pub use` lines, and the modules refer to each other with `super::`.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(test)]
extern crate std;

pub mod congestion;
pub mod connection;
pub mod memory;
mod rng;
pub mod stream;
pub mod wire;
pub mod zero;
