// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! HELLO: how two devices tell each other their planes (docs/wire-format.md, "HELLO").
//!
//! A device with several planes (independent networks, one netdev each) reaches a peer on plane
//! `k` at the peer's plane-`k` address, which the QP's address vector does not carry (it names
//! one GID). So when a connection starts, each side sends HELLO on plane 0 listing its address
//! on every plane, and the other answers with its own list. HELLO is device-level: it is not
//! sequenced, takes no PSN and belongs to no stream; the caller sends and handles it beside the
//! connection.

use super::bytes::{Reader, Writer};
use super::{EmitError, ParseError};

/// Planes a device may have (plane numbers are below this).
pub const MAX_PLANES: usize = 16;
/// Length of the HELLO extension header.
pub const HELLO_HEADER_LEN: usize = 12;
/// Paths every device has at least: what a peer may be sent on before its HELLO says
/// how many it has (or when it says 0).
pub const DEFAULT_PEER_PATHS: u16 = 8;
/// Length of one plane entry.
pub const HELLO_ENTRY_LEN: usize = 20;

/// The HELLO extension header; `plane_count` [`HelloEntry`]s follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HelloHeader {
    /// The sender wants a HELLO back (it has not heard the receiver's planes yet).
    pub reply: bool,
    /// Entries that follow (at most [`MAX_PLANES`]).
    pub plane_count: u8,
    /// Paths the sender's connections have (it drops packets on a higher path id), so the
    /// most the receiver may send on; 0 from a sender that does not say (take
    /// [`DEFAULT_PEER_PATHS`]).
    pub paths: u16,
    /// The sender device's incarnation: random, nonzero, fixed for the device's life; a new
    /// value from a known peer means the peer restarted.
    pub epoch: u32,
    /// The sender's connection id for the receiver: random, nonzero, what the receiver puts
    /// in the base header's `conn_id` of every packet to the sender. A HELLO whose own base
    /// `conn_id` is the receiver's id proves that its sender heard the receiver's HELLO: only
    /// such a HELLO may change what the receiver knows of the sender.
    pub conn_id: u32,
}

const FLAG_REPLY: u8 = 1;

impl HelloHeader {
    pub(crate) fn parse(r: &mut Reader<'_>) -> Result<HelloHeader, ParseError> {
        let flags = r.u8()?;
        if flags & !FLAG_REPLY != 0 {
            return Err(ParseError::ReservedNonZero);
        }
        let plane_count = r.u8()?;
        if usize::from(plane_count) > MAX_PLANES {
            return Err(ParseError::BadLength);
        }
        let paths = r.u16()?;
        let epoch = r.u32()?;
        let conn_id = r.u32()?;
        if conn_id == 0 {
            return Err(ParseError::BadField);
        }
        Ok(HelloHeader {
            reply: flags & FLAG_REPLY != 0,
            plane_count,
            paths,
            epoch,
            conn_id,
        })
    }

    pub(crate) fn emit(&self, w: &mut Writer<'_>) -> Result<(), EmitError> {
        if usize::from(self.plane_count) > MAX_PLANES || self.conn_id == 0 {
            return Err(EmitError::Inconsistent);
        }
        w.u8(if self.reply { FLAG_REPLY } else { 0 })?;
        w.u8(self.plane_count)?;
        w.u16(self.paths)?;
        w.u32(self.epoch)?;
        w.u32(self.conn_id)
    }
}

/// An address on a plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlaneAddr {
    /// IPv4.
    V4([u8; 4]),
    /// IPv6.
    V6([u8; 16]),
}

/// One plane of the sender: its number and the sender's address on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloEntry {
    /// Plane number (below [`MAX_PLANES`]).
    pub plane: u8,
    /// The sender's address on that plane.
    pub addr: PlaneAddr,
    /// Payload bytes per packet of the sender's connections (its payload MTU); 0 from a
    /// sender that does not say. Both ends derive it alike from their links' MTUs, so a
    /// different value than the receiver's own means the two cannot exchange data packets.
    pub mtu: u16,
}

impl HelloEntry {
    pub(crate) fn parse(c: &[u8]) -> Result<HelloEntry, ParseError> {
        let mut r = Reader::new(c);
        let plane = r.u8()?;
        if usize::from(plane) >= MAX_PLANES {
            return Err(ParseError::BadField);
        }
        let family = r.u8()?;
        let mtu = r.u16()?;
        let addr = match family {
            4 => {
                let a = r.array::<4>()?;
                r.reserved(12)?;
                PlaneAddr::V4(a)
            }
            6 => PlaneAddr::V6(r.array::<16>()?),
            _ => return Err(ParseError::BadField),
        };
        Ok(HelloEntry { plane, addr, mtu })
    }

    pub(crate) fn emit(&self, w: &mut Writer<'_>) -> Result<(), EmitError> {
        if usize::from(self.plane) >= MAX_PLANES {
            return Err(EmitError::Inconsistent);
        }
        w.u8(self.plane)?;
        match self.addr {
            PlaneAddr::V4(a) => {
                w.u8(4)?;
                w.u16(self.mtu)?;
                w.bytes(&a)?;
                w.zeros(12)
            }
            PlaneAddr::V6(a) => {
                w.u8(6)?;
                w.u16(self.mtu)?;
                w.bytes(&a)
            }
        }
    }
}

/// Checks the entries of a HELLO: exactly `count` of them, planes strictly increasing.
pub(crate) fn check_entries(rest: &[u8], count: u8) -> Result<(), ParseError> {
    let need = usize::from(count) * HELLO_ENTRY_LEN;
    if rest.len() < need {
        return Err(ParseError::Truncated);
    }
    if rest.len() > need {
        return Err(ParseError::TrailingBytes);
    }
    let mut last: Option<u8> = None;
    for c in rest.chunks_exact(HELLO_ENTRY_LEN) {
        let e = HelloEntry::parse(c)?;
        if last.is_some_and(|l| e.plane <= l) {
            return Err(ParseError::BadField);
        }
        last = Some(e.plane);
    }
    Ok(())
}
