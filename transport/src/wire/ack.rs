// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! ACK body: a 12-byte ACK header, then per-path entries (48 bytes each), then per-stream
//! entries (8 bytes each).

use super::bytes::{Reader, Writer};
use super::packet::{BaseHeader, Ext, Header};
use super::{EmitError, Opcode, ParseError, BASE_HEADER_LEN, SACK_WORDS};

/// Length of the fixed ACK header after the base header.
pub const ACK_HEADER_LEN: usize = 12;
/// Length of one path entry.
pub const PATH_ACK_LEN: usize = 48;
/// Length of one stream entry.
pub const STREAM_ACK_LEN: usize = 8;

/// Fixed part of an ACK.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckHeader {
    /// Number of path entries.
    pub path_count: u8,
    /// Number of stream entries.
    pub stream_count: u8,
    /// Receiver's suggested rate for this sender in Mbit/s; 0 = no hint. Reserved for congestion
    /// control: sent as 0 by this version, carried through unchanged.
    pub rate_hint_mbps: u32,
    /// Share of the receiver's inbound bandwidth allocated to this sender, in 1/65536; 0 = none.
    pub share: u16,
}

impl AckHeader {
    pub(crate) fn parse(r: &mut Reader<'_>) -> Result<AckHeader, ParseError> {
        let path_count = r.u8()?;
        let stream_count = r.u8()?;
        r.reserved(2)?;
        let rate_hint_mbps = r.u32()?;
        let share = r.u16()?;
        r.reserved(2)?;
        Ok(AckHeader {
            path_count,
            stream_count,
            rate_hint_mbps,
            share,
        })
    }

    pub(crate) fn emit(&self, w: &mut Writer<'_>) -> Result<(), EmitError> {
        w.u8(self.path_count)?;
        w.u8(self.stream_count)?;
        w.zeros(2)?;
        w.u32(self.rate_hint_mbps)?;
        w.u16(self.share)?;
        w.zeros(2)
    }
}

/// Acknowledgement state of one path, as seen by the receiver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathAck {
    /// The acknowledged path (of the ACK's receiver).
    pub path_id: u16,
    /// Its plane.
    pub plane: u8,
    /// Cumulative PSN: the lowest PSN not yet received; every PSN before it is received or
    /// below the receiver's window.
    pub cum_psn: u32,
    /// Timestamp of the most recent packet received on the path.
    pub echo_ts: u32,
    /// Packets received with ECN CE since the previous ACK (saturating): marks of the
    /// network's queues.
    pub ecn_ce: u16,
    /// Packets received without CE since the previous ACK that the receiver marked itself
    /// because its own receive queue was long (saturating): it is busy, not the path. The
    /// sender slows for them as for CE, but they say nothing about the path.
    pub busy: u16,
    /// Bit `i` (word `i / 64`, bit `i % 64`, least significant first) set = PSN
    /// `cum_psn + 1 + i` received.
    pub sack: [u64; SACK_WORDS],
}

impl PathAck {
    pub(crate) fn parse(c: &[u8]) -> Result<PathAck, ParseError> {
        let mut r = Reader::new(c);
        let path_id = r.u16()?;
        let plane = r.u8()?;
        r.reserved(1)?;
        let cum_psn = r.u32()?;
        let echo_ts = r.u32()?;
        let ecn_ce = r.u16()?;
        let busy = r.u16()?;
        let mut sack = [0u64; SACK_WORDS];
        for word in sack.iter_mut() {
            *word = r.u64()?;
        }
        Ok(PathAck {
            path_id,
            plane,
            cum_psn,
            echo_ts,
            ecn_ce,
            busy,
            sack,
        })
    }

    fn emit(&self, w: &mut Writer<'_>) -> Result<(), EmitError> {
        w.u16(self.path_id)?;
        w.u8(self.plane)?;
        w.u8(0)?;
        w.u32(self.cum_psn)?;
        w.u32(self.echo_ts)?;
        w.u16(self.ecn_ce)?;
        w.u16(self.busy)?;
        for word in self.sack {
            w.u64(word)?;
        }
        Ok(())
    }

    /// Whether the entry reports `psn` as received.
    pub fn acks(&self, psn: u32) -> bool {
        let d = super::seq_diff(psn, self.cum_psn);
        if d < 0 {
            return true;
        }
        // d >= 0 here; bit d-1 for PSN cum+1+(d-1).
        let Some(i) = usize::try_from(d).ok().and_then(|d| d.checked_sub(1)) else {
            return false;
        };
        match self.sack.get(i / 64) {
            Some(w) => (w >> (i % 64)) & 1 == 1,
            None => false,
        }
    }
}

/// Per-stream completion state for the requester whose QP is `qp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamAck {
    /// The requester's QP number (the stream at the ACK's receiver).
    pub qp: u32,
    /// Every message with MSN before this one is complete at the responder.
    pub completed_msn: u32,
}

impl StreamAck {
    pub(crate) fn parse(c: &[u8]) -> Result<StreamAck, ParseError> {
        let mut r = Reader::new(c);
        Ok(StreamAck {
            qp: r.u32()?,
            completed_msn: r.u32()?,
        })
    }

    fn emit(&self, w: &mut Writer<'_>) -> Result<(), EmitError> {
        w.u32(self.qp)?;
        w.u32(self.completed_msn)
    }
}

/// Builds an ACK in place: base header, ACK header, then entries; the counts are patched in by
/// [`AckWriter::finish`].
pub struct AckWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
    paths: u8,
    streams: u8,
}

impl<'a> AckWriter<'a> {
    /// Starts an ACK in `buf` with the given base header (its opcode is forced to ACK) and
    /// congestion fields.
    pub fn new(buf: &'a mut [u8], base: BaseHeader, info: AckHeader) -> Result<Self, EmitError> {
        let mut base = base;
        base.opcode = Opcode::Ack;
        let h = Header {
            base,
            ext: Ext::Ack(AckHeader {
                path_count: 0,
                stream_count: 0,
                ..info
            }),
        };
        let len = h.emit(buf)?;
        Ok(AckWriter {
            buf,
            len,
            paths: 0,
            streams: 0,
        })
    }

    /// Room left for entries.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.len)
    }

    /// Appends a path entry (all path entries come before stream entries).
    pub fn push_path(&mut self, p: &PathAck) -> Result<(), EmitError> {
        if self.streams != 0 {
            return Err(EmitError::Inconsistent);
        }
        let n = self.paths.checked_add(1).ok_or(EmitError::TooManyEntries)?;
        let dst = self
            .buf
            .get_mut(self.len..)
            .ok_or(EmitError::BufferTooSmall)?;
        let mut w = Writer::new(dst);
        p.emit(&mut w)?;
        self.len = self.len.saturating_add(w.pos());
        self.paths = n;
        Ok(())
    }

    /// Appends a stream entry.
    pub fn push_stream(&mut self, s: &StreamAck) -> Result<(), EmitError> {
        let n = self
            .streams
            .checked_add(1)
            .ok_or(EmitError::TooManyEntries)?;
        let dst = self
            .buf
            .get_mut(self.len..)
            .ok_or(EmitError::BufferTooSmall)?;
        let mut w = Writer::new(dst);
        s.emit(&mut w)?;
        self.len = self.len.saturating_add(w.pos());
        self.streams = n;
        Ok(())
    }

    /// Path entries written so far.
    pub fn path_count(&self) -> u8 {
        self.paths
    }

    /// Patches the counts and returns the ACK's total length.
    pub fn finish(self) -> usize {
        if let Some(b) = self.buf.get_mut(BASE_HEADER_LEN) {
            *b = self.paths;
        }
        if let Some(b) = self.buf.get_mut(BASE_HEADER_LEN + 1) {
            *b = self.streams;
        }
        self.len
    }
}
