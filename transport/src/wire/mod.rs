// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! MetaRoCE wire format, version 1. The normative description, with every field's offset and
//! width, is `docs/wire-format.md`; this module is its implementation.
//!
//! Parsing is zero-copy ([`Packet::parse`] returns a [`PacketView`] borrowing the datagram) and
//! checks every length before using it. Emitting writes a header into a caller's buffer and
//! returns its length; the caller (the connection) copies the payload behind it.

mod ack;
mod bytes;
mod hello;
mod packet;

use super::zero::{zero_valid, ZeroValid};
pub use ack::{
    AckHeader, AckWriter, PathAck, StreamAck, ACK_HEADER_LEN, PATH_ACK_LEN, STREAM_ACK_LEN,
};
pub use hello::{
    HelloEntry, HelloHeader, PlaneAddr, DEFAULT_PEER_PATHS, HELLO_ENTRY_LEN, HELLO_HEADER_LEN,
    MAX_PLANES,
};
pub use packet::{
    AtomicExt, BaseHeader, DataExt, DatagramExt, Ext, Header, NakCode, NakExt, Packet, PacketView,
    ReadReqExt, SendExt, WriteExt, FLUSH_GLOBAL, FLUSH_PERSISTENT, FLUSH_RANGE, FLUSH_REGION,
};

/// The only version this implementation speaks.
pub const VERSION: u8 = 1;
/// Length of the base header that starts every packet.
pub const BASE_HEADER_LEN: usize = 32;
/// Width of a path's selective-acknowledgement bitmap, in packets.
pub const SACK_BITS: usize = 256;
/// The same, in 64-bit words.
pub const SACK_WORDS: usize = SACK_BITS / 64;
/// Largest header any packet can have (WRITE_WITH_IMM on its last packet).
pub const MAX_HEADER_LEN: usize = BASE_HEADER_LEN + 32 + 4;

/// Packet type, the second byte of the base header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// SEND data.
    Send = 0x00,
    /// SEND data, immediate on the last packet.
    SendWithImm = 0x01,
    /// RDMA WRITE data.
    RdmaWrite = 0x02,
    /// RDMA WRITE data, immediate on the last packet.
    RdmaWriteWithImm = 0x03,
    /// RDMA READ request.
    ReadRequest = 0x04,
    /// RDMA READ response data.
    ReadResponse = 0x05,
    /// Atomic compare and swap request.
    CmpSwap = 0x06,
    /// Atomic fetch and add request.
    FetchAdd = 0x07,
    /// Atomic response (original value).
    AtomicResponse = 0x08,
    /// SEND data, and with the last packet the rkey the receiver invalidates (where a
    /// SEND_WITH_IMM has its immediate data).
    SendWithInv = 0x09,
    /// ATOMIC WRITE request: 8 bytes (AtomicExt's `swap_add`, in order) stored at once at an
    /// aligned address, in message order (after every earlier message's data).
    AtomicWrite = 0x0a,
    /// RDMA FLUSH request: what earlier messages placed in a range (AtomicExt: `va`, `rkey`,
    /// `swap_add` the length, `compare` the placement type and selectivity level) made
    /// visible, in message order.
    Flush = 0x0b,
    // 0x0c is the first free value: selftests/tests/udp.sh sends it as an unknown opcode (move
    // it on with a new opcode here).
    /// Acknowledgement (paths and streams).
    Ack = 0x10,
    /// Negative acknowledgement of a message.
    Nak = 0x11,
    /// Probe: takes a PSN, asks for an ACK.
    Probe = 0x12,
    /// HELLO: a device's planes and addresses (device-level, unsequenced).
    Hello = 0x13,
    /// DATAGRAM: one unreliable datagram (UD/GSI SEND), on no connection, unsequenced.
    Datagram = 0x14,
    /// DATAGRAM with immediate data.
    DatagramWithImm = 0x15,
}
// A free responder slot holds Send (`responder::Slot::free`).
zero_valid!(Opcode::Send);

impl Opcode {
    /// The opcode for a wire value; unknown values are an error.
    pub fn from_u8(v: u8) -> Result<Opcode, ParseError> {
        Ok(match v {
            0x00 => Opcode::Send,
            0x01 => Opcode::SendWithImm,
            0x02 => Opcode::RdmaWrite,
            0x03 => Opcode::RdmaWriteWithImm,
            0x04 => Opcode::ReadRequest,
            0x05 => Opcode::ReadResponse,
            0x06 => Opcode::CmpSwap,
            0x07 => Opcode::FetchAdd,
            0x08 => Opcode::AtomicResponse,
            0x09 => Opcode::SendWithInv,
            0x0a => Opcode::AtomicWrite,
            0x0b => Opcode::Flush,
            0x10 => Opcode::Ack,
            0x11 => Opcode::Nak,
            0x12 => Opcode::Probe,
            0x13 => Opcode::Hello,
            0x14 => Opcode::Datagram,
            0x15 => Opcode::DatagramWithImm,
            _ => return Err(ParseError::UnknownOpcode(v)),
        })
    }

    /// Carries immediate data (on its last packet; SEND_WITH_INV: the rkey to invalidate).
    pub fn has_imm(self) -> bool {
        matches!(
            self,
            Opcode::SendWithImm
                | Opcode::RdmaWriteWithImm
                | Opcode::DatagramWithImm
                | Opcode::SendWithInv
        )
    }

    /// A SEND (any of the three).
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::Send | Opcode::SendWithImm | Opcode::SendWithInv
        )
    }

    /// Consumes a receive WQE at its destination QP: SEND data, and a WRITE with immediate
    /// (whose immediate completes a receive).
    pub fn consumes_recv(self) -> bool {
        self.is_send() || self == Opcode::RdmaWriteWithImm
    }

    /// Takes a PSN on its path and is acknowledged (everything but ACK, NAK, HELLO and
    /// DATAGRAM).
    pub fn is_sequenced(self) -> bool {
        !matches!(
            self,
            Opcode::Ack | Opcode::Nak | Opcode::Hello | Opcode::Datagram | Opcode::DatagramWithImm
        )
    }

    /// Belongs to no connection: HELLO and DATAGRAM are handled by the device.
    pub fn is_device_level(self) -> bool {
        matches!(
            self,
            Opcode::Hello | Opcode::Datagram | Opcode::DatagramWithImm
        )
    }
}

/// Flag bits of the base header (bytes 2-3). Bits not defined here must be zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u16);

impl Flags {
    /// The receiver should acknowledge this packet at once.
    pub const ACK_REQ: u16 = 0x0001;
    /// Solicited event: the receiver's completion should wake a waiting consumer.
    pub const SOLICITED: u16 = 0x0002;
    /// Last packet of its message.
    pub const LAST: u16 = 0x0004;
    /// First packet of its message (offset 0).
    pub const FIRST: u16 = 0x0008;
    /// The payload was sent before under another PSN (informational).
    pub const RETRANSMIT: u16 = 0x0010;
    /// All defined bits.
    pub const DEFINED: u16 = 0x001f;

    /// Whether flag `bit` is set.
    pub fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }

    /// These flags with `bit` set or cleared.
    pub fn with(self, bit: u16, on: bool) -> Flags {
        if on {
            Flags(self.0 | bit)
        } else {
            Flags(self.0 & !bit)
        }
    }
}

/// Why a packet was rejected by [`Packet::parse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than its headers say.
    Truncated,
    /// Version byte other than [`VERSION`].
    UnknownVersion(u8),
    /// Opcode byte not defined by version 1.
    UnknownOpcode(u8),
    /// A reserved field or flag bit is not zero.
    ReservedNonZero,
    /// A length field disagrees with the datagram or with another length field.
    BadLength,
    /// Bytes after the end of the packet.
    TrailingBytes,
    /// A field has a value the opcode forbids (e.g. a flag on an ACK).
    BadField,
}

/// Why a header could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmitError {
    /// The buffer is too small for the header.
    BufferTooSmall,
    /// The extension header does not fit the opcode, or a length field is inconsistent.
    Inconsistent,
    /// An ACK can list at most 255 paths and 255 streams.
    TooManyEntries,
}

/// Serial-number comparison of 32-bit sequence numbers (PSN, MSN): `a - b` as a signed
/// distance, correct while the two are less than 2^31 apart.
pub fn seq_diff(a: u32, b: u32) -> i32 {
    a.wrapping_sub(b) as i32
}

/// `a` comes before `b` in wrapping sequence order.
pub fn seq_lt(a: u32, b: u32) -> bool {
    seq_diff(a, b) < 0
}

#[cfg(test)]
mod tests;
