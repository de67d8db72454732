// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Base header, per-opcode extension headers, and whole-packet parse/emit.

use super::ack::{AckHeader, PathAck, StreamAck, ACK_HEADER_LEN, PATH_ACK_LEN, STREAM_ACK_LEN};
use super::bytes::{Reader, Writer};
use super::hello::{self, HelloEntry, HelloHeader, HELLO_ENTRY_LEN, HELLO_HEADER_LEN};
use super::{EmitError, Flags, Opcode, ParseError, BASE_HEADER_LEN, VERSION};

/// The 32-byte header at the start of every packet (see `docs/wire-format.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseHeader {
    /// Packet type.
    pub opcode: Opcode,
    /// Flags.
    pub flags: Flags,
    /// The receiver's QP (stream) number; 0 on ACKs.
    pub dst_qp: u32,
    /// The sender's QP (stream) number; 0 on ACKs.
    pub src_qp: u32,
    /// The receiver's connection id.
    pub conn_id: u32,
    /// Logical path this packet travels on (its PSN space).
    pub path_id: u16,
    /// Fabric plane of that path.
    pub plane: u8,
    /// Packet sequence number on the path; 0 on ACK and NAK.
    pub psn: u32,
    /// Message sequence number in the stream (the requester's message for responses and NAKs).
    pub msn: u32,
    /// Sender's clock when sent: nanoseconds modulo 2^32; echoed in ACKs for RTT.
    pub timestamp: u32,
}

/// SEND / SEND_WITH_IMM: where this packet's bytes go in the message and which receive WQE the
/// message consumes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendExt {
    /// Receive sequence number: index of the receive WQE this message consumes.
    pub rsn: u32,
    /// Byte offset of this packet's payload in the message.
    pub offset: u32,
    /// Message length.
    pub total_len: u32,
    /// This packet's payload length.
    pub payload_len: u32,
    /// Immediate data: present exactly on the LAST packet of a WITH_IMM message.
    pub imm: Option<u32>,
}

/// RDMA_WRITE / RDMA_WRITE_WITH_IMM: every packet carries its own destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteExt {
    /// Remote virtual address of this packet's first payload byte.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Receive sequence number (WITH_IMM only; 0 otherwise).
    pub rsn: u32,
    /// Byte offset of this packet's payload in the message.
    pub offset: u32,
    /// Message length.
    pub total_len: u32,
    /// This packet's payload length.
    pub payload_len: u32,
    /// Immediate data: present exactly on the LAST packet of a WITH_IMM message.
    pub imm: Option<u32>,
}

/// RDMA_READ request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadReqExt {
    /// Remote address to read.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Bytes to read.
    pub len: u32,
}

/// READ response data: the requester's message is the base header's MSN.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataExt {
    /// Byte offset in the READ's data.
    pub offset: u32,
    /// The READ's length.
    pub total_len: u32,
    /// This packet's payload length.
    pub payload_len: u32,
}

/// CMP_SWP / FETCH_ADD request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicExt {
    /// Remote address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (CMP_SWP), addend (FETCH_ADD), the value (ATOMIC_WRITE) or the length
    /// (FLUSH).
    pub swap_add: u64,
    /// Compare value (CMP_SWP; 0 for FETCH_ADD and ATOMIC_WRITE); FLUSH: its placement type
    /// (bits 0-7, [`FLUSH_GLOBAL`] or [`FLUSH_PERSISTENT`]) and selectivity level (bits 8-15,
    /// [`FLUSH_RANGE`] or [`FLUSH_REGION`]).
    pub compare: u64,
}

/// FLUSH placement type: visible to every observer (IBV_FLUSH_GLOBAL).
pub const FLUSH_GLOBAL: u8 = 1;
/// FLUSH placement type: persistent (IBV_FLUSH_PERSISTENT).
pub const FLUSH_PERSISTENT: u8 = 2;
/// FLUSH selectivity level: the range `[va, va + length)` (IBV_FLUSH_RANGE).
pub const FLUSH_RANGE: u8 = 0;
/// FLUSH selectivity level: the whole region `rkey` names (IBV_FLUSH_MR).
pub const FLUSH_REGION: u8 = 1;

/// DATAGRAM / DATAGRAM_WITH_IMM: an unreliable datagram to QP `dst_qp` from QP `src_qp` (base
/// header), one packet (FIRST and LAST set), on no connection: `conn_id`, `path_id`, `psn`
/// and `msn` are 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatagramExt {
    /// The Q_Key the receiving QP must have (GSI: 0x8001_0000).
    pub qkey: u32,
    /// Partition key.
    pub pkey: u16,
    /// The payload's length.
    pub payload_len: u32,
    /// Immediate data: present exactly on DATAGRAM_WITH_IMM.
    pub imm: Option<u32>,
}

/// NAK for message `msn` of stream `dst_qp` (both in the base header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NakExt {
    /// Reason.
    pub code: NakCode,
    /// RNR: microseconds the requester waits before retrying; 0 otherwise.
    pub value: u32,
}

/// NAK reason codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NakCode {
    /// Remote access error.
    RemoteAccess = 1,
    /// Invalid request.
    InvalidRequest = 2,
    /// Receiver not ready: no receive WQE posted.
    Rnr = 3,
    /// Out of window / sequence error.
    OutOfWindow = 4,
    /// Remote operational error.
    RemoteOperational = 5,
}

impl NakCode {
    /// The code for a wire value, if defined.
    pub fn from_code(v: u8) -> Option<NakCode> {
        NakCode::from_u8(v).ok()
    }

    fn from_u8(v: u8) -> Result<NakCode, ParseError> {
        Ok(match v {
            1 => NakCode::RemoteAccess,
            2 => NakCode::InvalidRequest,
            3 => NakCode::Rnr,
            4 => NakCode::OutOfWindow,
            5 => NakCode::RemoteOperational,
            _ => return Err(ParseError::BadField),
        })
    }
}

/// The opcode-specific extension header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    /// SEND / SEND_WITH_IMM.
    Send(SendExt),
    /// RDMA_WRITE / RDMA_WRITE_WITH_IMM.
    Write(WriteExt),
    /// READ request.
    ReadRequest(ReadReqExt),
    /// READ response.
    ReadResponse(DataExt),
    /// CMP_SWP / FETCH_ADD.
    Atomic(AtomicExt),
    /// Original value at the remote address.
    AtomicResponse(u64),
    /// ACK (the entries follow as payload).
    Ack(AckHeader),
    /// NAK.
    Nak(NakExt),
    /// PROBE (no extension).
    Probe,
    /// HELLO (the plane entries follow as payload).
    Hello(HelloHeader),
    /// DATAGRAM / DATAGRAM_WITH_IMM.
    Datagram(DatagramExt),
}

/// Base header plus extension header: everything in a packet but the payload (for ACKs: but
/// the path and stream entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Base header.
    pub base: BaseHeader,
    /// Extension header.
    pub ext: Ext,
}

/// A parsed packet, borrowing the datagram.
#[derive(Clone, Copy, Debug)]
pub struct PacketView<'a> {
    /// The headers.
    pub header: Header,
    /// Data bytes (SEND, WRITE, READ response); for an ACK, its path and stream entries.
    pub payload: &'a [u8],
}

impl<'a> PacketView<'a> {
    /// The per-path entries of an ACK (empty for other packets).
    pub fn ack_paths(&self) -> impl Iterator<Item = PathAck> + 'a {
        let n = match self.header.ext {
            Ext::Ack(a) => usize::from(a.path_count),
            _ => 0,
        };
        entries(self.payload, 0, n, PATH_ACK_LEN, PathAck::parse)
    }

    /// The plane entries of a HELLO (empty for other packets).
    pub fn hello_entries(&self) -> impl Iterator<Item = HelloEntry> + 'a {
        let n = match self.header.ext {
            Ext::Hello(h) => usize::from(h.plane_count),
            _ => 0,
        };
        entries(self.payload, 0, n, HELLO_ENTRY_LEN, HelloEntry::parse)
    }

    /// The per-stream entries of an ACK (empty for other packets).
    pub fn ack_streams(&self) -> impl Iterator<Item = StreamAck> + 'a {
        let (p, s) = match self.header.ext {
            Ext::Ack(a) => (usize::from(a.path_count), usize::from(a.stream_count)),
            _ => (0, 0),
        };
        entries(
            self.payload,
            p.saturating_mul(PATH_ACK_LEN),
            s,
            STREAM_ACK_LEN,
            StreamAck::parse,
        )
    }
}

/// `count` fixed-size entries of `len` bytes from `skip` bytes into `payload`, each parsed by
/// `parse` (`Packet::parse` has already validated every one, so none is dropped here).
fn entries<'a, T: 'a>(
    payload: &'a [u8],
    skip: usize,
    count: usize,
    len: usize,
    parse: fn(&[u8]) -> Result<T, ParseError>,
) -> impl Iterator<Item = T> + 'a {
    let end = skip.saturating_add(count.saturating_mul(len));
    payload
        .get(skip..end)
        .unwrap_or(&[])
        .chunks_exact(len)
        .filter_map(move |c| parse(c).ok())
}

/// Entry points for parsing and emitting whole packets.
pub struct Packet;

/// Checks that a data packet's lengths agree: `payload_len` is what follows and the bytes lie
/// inside the message.
fn check_data(offset: u32, total: u32, payload_len: u32, rest: &[u8]) -> Result<(), ParseError> {
    let end = offset
        .checked_add(payload_len)
        .ok_or(ParseError::BadLength)?;
    if end > total {
        return Err(ParseError::BadLength);
    }
    match usize::try_from(payload_len) {
        Ok(n) if n == rest.len() => Ok(()),
        Ok(n) if n < rest.len() => Err(ParseError::TrailingBytes),
        _ => Err(ParseError::Truncated),
    }
}

impl Packet {
    /// Writes a HELLO with the header `hello` (its `plane_count` is set here) carrying
    /// `entries` (planes strictly increasing) into `buf`; returns its length. `base` gives
    /// the connection id and timestamp; its opcode, flags, QPs, path, PSN and MSN are set
    /// here.
    pub fn emit_hello(
        buf: &mut [u8],
        base: BaseHeader,
        hello: HelloHeader,
        entries: &[HelloEntry],
    ) -> Result<usize, EmitError> {
        let plane_count = u8::try_from(entries.len()).map_err(|_| EmitError::Inconsistent)?;
        if entries
            .windows(2)
            .any(|w| w.get(1).map(|b| b.plane) <= w.first().map(|a| a.plane))
        {
            return Err(EmitError::Inconsistent);
        }
        let h = Header {
            base: BaseHeader {
                opcode: Opcode::Hello,
                flags: Flags::default(),
                dst_qp: 0,
                src_qp: 0,
                path_id: 0,
                plane: 0,
                psn: 0,
                msn: 0,
                ..base
            },
            ext: Ext::Hello(HelloHeader {
                plane_count,
                ..hello
            }),
        };
        let hl = h.emit(buf)?;
        let mut w = Writer::new(buf.get_mut(hl..).ok_or(EmitError::BufferTooSmall)?);
        for e in entries {
            e.emit(&mut w)?;
        }
        Ok(hl + w.pos())
    }

    /// The destination connection id of a datagram, without parsing the rest: for an
    /// endpoint's demultiplexing fast path. None if too short or not version 1.
    pub fn peek_conn_id(buf: &[u8]) -> Option<u32> {
        if *buf.first()? != VERSION {
            return None;
        }
        let b: [u8; 4] = buf.get(12..16)?.try_into().ok()?;
        Some(u32::from_be_bytes(b))
    }

    /// The destination QP of a datagram, without parsing the rest (0 for connection-level
    /// packets: ACKs, probes): lets a caller prepare that QP before handing the datagram in.
    /// None if too short or not version 1.
    pub fn peek_dst_qp(buf: &[u8]) -> Option<u32> {
        if *buf.first()? != VERSION {
            return None;
        }
        let b: [u8; 4] = buf.get(4..8)?.try_into().ok()?;
        Some(u32::from_be_bytes(b))
    }

    /// The destination QP of a datagram that consumes a receive WQE there (see
    /// [`Opcode::consumes_recv`]), without parsing the rest; None for every other datagram
    /// (RDMA WRITE and READ data, requests, ACKs...), too short ones and other versions. Lets
    /// a caller move that QP's posted receives in first (receives have no doorbell) only
    /// when a datagram may need one.
    pub fn peek_recv_qp(buf: &[u8]) -> Option<u32> {
        let op = Opcode::from_u8(*buf.get(1)?).ok()?;
        if !op.consumes_recv() {
            return None;
        }
        Self::peek_dst_qp(buf)
    }

    /// Parses one datagram. Never panics; every length is checked before it is used.
    pub fn parse(buf: &[u8]) -> Result<PacketView<'_>, ParseError> {
        let mut r = Reader::new(buf);
        let version = r.u8()?;
        if version != VERSION {
            return Err(ParseError::UnknownVersion(version));
        }
        let opcode = Opcode::from_u8(r.u8()?)?;
        let flags = Flags(r.u16()?);
        if flags.0 & !Flags::DEFINED != 0 {
            return Err(ParseError::ReservedNonZero);
        }
        let dst_qp = r.u32()?;
        let src_qp = r.u32()?;
        let conn_id = r.u32()?;
        let path_id = r.u16()?;
        let plane = r.u8()?;
        r.reserved(1)?;
        let psn = r.u32()?;
        let msn = r.u32()?;
        let timestamp = r.u32()?;
        let base = BaseHeader {
            opcode,
            flags,
            dst_qp,
            src_qp,
            conn_id,
            path_id,
            plane,
            psn,
            msn,
            timestamp,
        };
        let last = flags.has(Flags::LAST);
        let imm = |r: &mut Reader<'_>| -> Result<Option<u32>, ParseError> {
            if opcode.has_imm() && last {
                Ok(Some(r.u32()?))
            } else {
                Ok(None)
            }
        };
        let ext = match opcode {
            Opcode::Send | Opcode::SendWithImm | Opcode::SendWithInv => {
                let rsn = r.u32()?;
                let offset = r.u32()?;
                let total_len = r.u32()?;
                let payload_len = r.u32()?;
                let imm = imm(&mut r)?;
                check_data(offset, total_len, payload_len, r.rest())?;
                Ext::Send(SendExt {
                    rsn,
                    offset,
                    total_len,
                    payload_len,
                    imm,
                })
            }
            Opcode::RdmaWrite | Opcode::RdmaWriteWithImm => {
                let va = r.u64()?;
                let rkey = r.u32()?;
                let rsn = r.u32()?;
                let offset = r.u32()?;
                let total_len = r.u32()?;
                let payload_len = r.u32()?;
                r.reserved(4)?;
                let imm = imm(&mut r)?;
                check_data(offset, total_len, payload_len, r.rest())?;
                Ext::Write(WriteExt {
                    va,
                    rkey,
                    rsn,
                    offset,
                    total_len,
                    payload_len,
                    imm,
                })
            }
            Opcode::ReadRequest => {
                let va = r.u64()?;
                let rkey = r.u32()?;
                let len = r.u32()?;
                Ext::ReadRequest(ReadReqExt { va, rkey, len })
            }
            Opcode::ReadResponse => {
                let offset = r.u32()?;
                let total_len = r.u32()?;
                let payload_len = r.u32()?;
                r.reserved(4)?;
                check_data(offset, total_len, payload_len, r.rest())?;
                Ext::ReadResponse(DataExt {
                    offset,
                    total_len,
                    payload_len,
                })
            }
            Opcode::CmpSwap | Opcode::FetchAdd | Opcode::AtomicWrite | Opcode::Flush => {
                let va = r.u64()?;
                let rkey = r.u32()?;
                r.reserved(4)?;
                let swap_add = r.u64()?;
                let compare = r.u64()?;
                Ext::Atomic(AtomicExt {
                    va,
                    rkey,
                    swap_add,
                    compare,
                })
            }
            Opcode::AtomicResponse => Ext::AtomicResponse(r.u64()?),
            Opcode::Ack => {
                let a = AckHeader::parse(&mut r)?;
                let need = usize::from(a.path_count)
                    .checked_mul(PATH_ACK_LEN)
                    .and_then(|p| {
                        usize::from(a.stream_count)
                            .checked_mul(STREAM_ACK_LEN)?
                            .checked_add(p)
                    })
                    .ok_or(ParseError::BadLength)?;
                let rest = r.rest();
                if rest.len() < need {
                    return Err(ParseError::Truncated);
                }
                if rest.len() > need {
                    return Err(ParseError::TrailingBytes);
                }
                // Validate every entry now so the iterators can never meet a bad one.
                let (paths, streams) = rest.split_at(
                    need.saturating_sub(usize::from(a.stream_count).saturating_mul(STREAM_ACK_LEN)),
                );
                for c in paths.chunks_exact(PATH_ACK_LEN) {
                    PathAck::parse(c)?;
                }
                for c in streams.chunks_exact(STREAM_ACK_LEN) {
                    StreamAck::parse(c)?;
                }
                Ext::Ack(a)
            }
            Opcode::Nak => {
                let code = NakCode::from_u8(r.u8()?)?;
                r.reserved(3)?;
                let value = r.u32()?;
                Ext::Nak(NakExt { code, value })
            }
            Opcode::Probe => Ext::Probe,
            Opcode::Hello => {
                let h = HelloHeader::parse(&mut r)?;
                hello::check_entries(r.rest(), h.plane_count)?;
                Ext::Hello(h)
            }
            Opcode::Datagram | Opcode::DatagramWithImm => {
                let whole = Flags::FIRST | Flags::LAST;
                if flags.0 & !(whole | Flags::SOLICITED) != 0 || flags.0 & whole != whole {
                    return Err(ParseError::BadField);
                }
                if conn_id != 0 || path_id != 0 || plane != 0 || psn != 0 || msn != 0 {
                    return Err(ParseError::BadField);
                }
                let qkey = r.u32()?;
                let pkey = r.u16()?;
                r.reserved(2)?;
                let payload_len = r.u32()?;
                let imm = imm(&mut r)?;
                check_data(0, payload_len, payload_len, r.rest())?;
                Ext::Datagram(DatagramExt {
                    qkey,
                    pkey,
                    payload_len,
                    imm,
                })
            }
        };
        let payload = r.rest();
        let carries_payload = matches!(
            ext,
            Ext::Send(_)
                | Ext::Write(_)
                | Ext::ReadResponse(_)
                | Ext::Ack(_)
                | Ext::Hello(_)
                | Ext::Datagram(_)
        );
        if !carries_payload && !payload.is_empty() {
            return Err(ParseError::TrailingBytes);
        }
        Ok(PacketView {
            header: Header { base, ext },
            payload,
        })
    }
}

impl Header {
    /// Length of this header on the wire (for an ACK: without its entries).
    pub fn len(&self) -> usize {
        let imm = |o: Option<u32>| if o.is_some() { 4 } else { 0 };
        BASE_HEADER_LEN
            + match self.ext {
                Ext::Send(s) => 16 + imm(s.imm),
                Ext::Write(w) => 32 + imm(w.imm),
                Ext::ReadRequest(_) => 16,
                Ext::ReadResponse(_) => 16,
                Ext::Atomic(_) => 32,
                Ext::AtomicResponse(_) => 8,
                Ext::Ack(_) => ACK_HEADER_LEN,
                Ext::Nak(_) => 8,
                Ext::Probe => 0,
                Ext::Hello(_) => HELLO_HEADER_LEN,
                Ext::Datagram(d) => 12 + imm(d.imm),
            }
    }

    /// Always false: a header has at least its base.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the header into `buf` and returns its length. The caller appends the payload of
    /// exactly the announced `payload_len` (for ACKs, use [`super::AckWriter`]).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        self.check()?;
        let b = &self.base;
        let mut w = Writer::new(buf);
        w.u8(VERSION)?;
        w.u8(b.opcode as u8)?;
        w.u16(b.flags.0)?;
        w.u32(b.dst_qp)?;
        w.u32(b.src_qp)?;
        w.u32(b.conn_id)?;
        w.u16(b.path_id)?;
        w.u8(b.plane)?;
        w.u8(0)?;
        w.u32(b.psn)?;
        w.u32(b.msn)?;
        w.u32(b.timestamp)?;
        match self.ext {
            Ext::Send(s) => {
                w.u32(s.rsn)?;
                w.u32(s.offset)?;
                w.u32(s.total_len)?;
                w.u32(s.payload_len)?;
                if let Some(i) = s.imm {
                    w.u32(i)?;
                }
            }
            Ext::Write(x) => {
                w.u64(x.va)?;
                w.u32(x.rkey)?;
                w.u32(x.rsn)?;
                w.u32(x.offset)?;
                w.u32(x.total_len)?;
                w.u32(x.payload_len)?;
                w.zeros(4)?;
                if let Some(i) = x.imm {
                    w.u32(i)?;
                }
            }
            Ext::ReadRequest(x) => {
                w.u64(x.va)?;
                w.u32(x.rkey)?;
                w.u32(x.len)?;
            }
            Ext::ReadResponse(x) => {
                w.u32(x.offset)?;
                w.u32(x.total_len)?;
                w.u32(x.payload_len)?;
                w.zeros(4)?;
            }
            Ext::Atomic(x) => {
                w.u64(x.va)?;
                w.u32(x.rkey)?;
                w.zeros(4)?;
                w.u64(x.swap_add)?;
                w.u64(x.compare)?;
            }
            Ext::AtomicResponse(v) => w.u64(v)?,
            Ext::Ack(a) => a.emit(&mut w)?,
            Ext::Nak(n) => {
                w.u8(n.code as u8)?;
                w.zeros(3)?;
                w.u32(n.value)?;
            }
            Ext::Probe => {}
            Ext::Hello(h) => h.emit(&mut w)?,
            Ext::Datagram(d) => {
                w.u32(d.qkey)?;
                w.u16(d.pkey)?;
                w.zeros(2)?;
                w.u32(d.payload_len)?;
                if let Some(i) = d.imm {
                    w.u32(i)?;
                }
            }
        }
        Ok(w.pos())
    }

    /// The extension must match the opcode, immediate data must sit exactly on the LAST packet
    /// of a WITH_IMM message, and the data lengths must be consistent.
    fn check(&self) -> Result<(), EmitError> {
        let op = self.base.opcode;
        if self.base.flags.0 & !Flags::DEFINED != 0 {
            return Err(EmitError::Inconsistent);
        }
        let imm_ok =
            |imm: Option<u32>| imm.is_some() == (op.has_imm() && self.base.flags.has(Flags::LAST));
        let data_ok =
            |off: u32, total: u32, len: u32| off.checked_add(len).is_some_and(|e| e <= total);
        let ok = match self.ext {
            Ext::Send(s) => {
                op.is_send() && imm_ok(s.imm) && data_ok(s.offset, s.total_len, s.payload_len)
            }
            Ext::Write(x) => {
                matches!(op, Opcode::RdmaWrite | Opcode::RdmaWriteWithImm)
                    && imm_ok(x.imm)
                    && data_ok(x.offset, x.total_len, x.payload_len)
            }
            Ext::ReadRequest(_) => op == Opcode::ReadRequest,
            Ext::ReadResponse(x) => {
                op == Opcode::ReadResponse && data_ok(x.offset, x.total_len, x.payload_len)
            }
            Ext::Atomic(_) => matches!(
                op,
                Opcode::CmpSwap | Opcode::FetchAdd | Opcode::AtomicWrite | Opcode::Flush
            ),
            Ext::AtomicResponse(_) => op == Opcode::AtomicResponse,
            Ext::Ack(_) => op == Opcode::Ack,
            Ext::Nak(_) => op == Opcode::Nak,
            Ext::Probe => op == Opcode::Probe,
            Ext::Hello(_) => op == Opcode::Hello,
            Ext::Datagram(d) => {
                let b = &self.base;
                let whole = Flags::FIRST | Flags::LAST;
                matches!(op, Opcode::Datagram | Opcode::DatagramWithImm)
                    && imm_ok(d.imm)
                    && b.flags.0 & whole == whole
                    && b.flags.0 & !(whole | Flags::SOLICITED) == 0
                    && b.conn_id == 0
                    && b.path_id == 0
                    && b.plane == 0
                    && b.psn == 0
                    && b.msn == 0
            }
        };
        if ok {
            Ok(())
        } else {
            Err(EmitError::Inconsistent)
        }
    }

    /// Payload bytes the header announces (data packets), else 0.
    pub fn payload_len(&self) -> u32 {
        match self.ext {
            Ext::Send(s) => s.payload_len,
            Ext::Write(w) => w.payload_len,
            Ext::ReadResponse(d) => d.payload_len,
            Ext::Datagram(d) => d.payload_len,
            _ => 0,
        }
    }
}
