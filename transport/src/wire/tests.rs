// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

use super::*;
use proptest::prelude::*;
use std::vec::Vec;

fn base(opcode: Opcode) -> BaseHeader {
    BaseHeader {
        opcode,
        flags: Flags(Flags::ACK_REQ),
        dst_qp: 0x0102_0304,
        src_qp: 0x0506_0708,
        conn_id: 0xdead_beef,
        path_id: 0x0203,
        plane: 3,
        psn: 0xffff_fffe,
        msn: 77,
        timestamp: 123_456,
    }
}

fn roundtrip(h: Header, payload: &[u8]) -> Vec<u8> {
    let mut buf = [0u8; 256];
    let n = h.emit(&mut buf).expect("emit");
    assert_eq!(n, h.len());
    let mut v = buf[..n].to_vec();
    v.extend_from_slice(payload);
    let p = Packet::parse(&v).expect("parse");
    assert_eq!(p.header, h);
    assert_eq!(p.payload, payload);
    v
}

fn all_headers() -> Vec<(Header, Vec<u8>)> {
    let data = std::vec![0xabu8; 10];
    let mut last_imm = base(Opcode::SendWithImm);
    last_imm.flags = Flags(Flags::LAST | Flags::SOLICITED);
    let mut wimm = base(Opcode::RdmaWriteWithImm);
    wimm.flags = Flags(Flags::LAST | Flags::FIRST);
    std::vec![
        (
            Header {
                base: base(Opcode::Send),
                ext: Ext::Send(SendExt {
                    rsn: 5,
                    offset: 4096,
                    total_len: 5000,
                    payload_len: 10,
                    imm: None
                })
            },
            data.clone(),
        ),
        (
            Header {
                base: last_imm,
                ext: Ext::Send(SendExt {
                    rsn: 5,
                    offset: 0,
                    total_len: 10,
                    payload_len: 10,
                    imm: Some(0x1234_5678)
                })
            },
            data.clone(),
        ),
        (
            Header {
                base: base(Opcode::RdmaWrite),
                ext: Ext::Write(WriteExt {
                    va: 0x1122_3344_5566_7788,
                    rkey: 9,
                    rsn: 0,
                    offset: 1,
                    total_len: 11,
                    payload_len: 10,
                    imm: None
                })
            },
            data.clone(),
        ),
        (
            Header {
                base: wimm,
                ext: Ext::Write(WriteExt {
                    va: 1,
                    rkey: 9,
                    rsn: 3,
                    offset: 0,
                    total_len: 10,
                    payload_len: 10,
                    imm: Some(7)
                })
            },
            data.clone(),
        ),
        (
            Header {
                base: base(Opcode::ReadRequest),
                ext: Ext::ReadRequest(ReadReqExt {
                    va: 3,
                    rkey: 4,
                    len: 1 << 30
                })
            },
            Vec::new()
        ),
        (
            Header {
                base: base(Opcode::ReadResponse),
                ext: Ext::ReadResponse(DataExt {
                    offset: 0,
                    total_len: 10,
                    payload_len: 10
                })
            },
            data.clone(),
        ),
        (
            Header {
                base: base(Opcode::CmpSwap),
                ext: Ext::Atomic(AtomicExt {
                    va: 8,
                    rkey: 1,
                    swap_add: 2,
                    compare: 3
                })
            },
            Vec::new()
        ),
        (
            Header {
                base: base(Opcode::FetchAdd),
                ext: Ext::Atomic(AtomicExt {
                    va: 8,
                    rkey: 1,
                    swap_add: 2,
                    compare: 0
                })
            },
            Vec::new()
        ),
        (
            Header {
                base: base(Opcode::AtomicResponse),
                ext: Ext::AtomicResponse(u64::MAX)
            },
            Vec::new()
        ),
        (
            Header {
                base: base(Opcode::Nak),
                ext: Ext::Nak(packet_nak(3, 655))
            },
            Vec::new()
        ),
        (
            Header {
                base: base(Opcode::Probe),
                ext: Ext::Probe
            },
            Vec::new()
        ),
        (
            Header {
                base: base(Opcode::Ack),
                ext: Ext::Ack(ack_header()),
            },
            ack_entries(),
        ),
    ]
}

fn ack_header() -> AckHeader {
    AckHeader {
        path_count: 1,
        stream_count: 1,
        rate_hint_mbps: 5,
        share: 6,
    }
}

/// One path entry and one stream entry, as bytes.
fn ack_entries() -> Vec<u8> {
    let mut buf = [0u8; 256];
    let mut w = AckWriter::new(&mut buf, base(Opcode::Ack), AckHeader::default()).unwrap();
    let sack = [6, 7, 8, 9];
    w.push_path(&PathAck {
        path_id: 1,
        plane: 2,
        cum_psn: 3,
        echo_ts: 4,
        ecn_ce: 5,
        busy: 7,
        sack,
    })
    .unwrap();
    w.push_stream(&StreamAck {
        qp: 10,
        completed_msn: 11,
    })
    .unwrap();
    let n = w.finish();
    buf[BASE_HEADER_LEN + ACK_HEADER_LEN..n].to_vec()
}

fn packet_nak(code: u8, value: u32) -> NakExt {
    let code = match code {
        1 => NakCode::RemoteAccess,
        2 => NakCode::InvalidRequest,
        3 => NakCode::Rnr,
        4 => NakCode::OutOfWindow,
        _ => NakCode::RemoteOperational,
    };
    NakExt { code, value }
}

use super::packet::NakCode;

#[test]
fn every_opcode_round_trips() {
    for (h, p) in all_headers() {
        roundtrip(h, &p);
    }
}

#[test]
fn base_header_layout_is_network_order() {
    let (h, p) = all_headers().remove(0);
    let v = roundtrip(h, &p);
    assert_eq!(v[0], VERSION);
    assert_eq!(v[1], Opcode::Send as u8);
    assert_eq!(&v[2..4], &[0, 1]);
    assert_eq!(&v[4..8], &[1, 2, 3, 4]);
    assert_eq!(&v[8..12], &[5, 6, 7, 8]);
    assert_eq!(&v[12..16], &[0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(&v[16..18], &[2, 3]);
    assert_eq!(v[18], 3);
    assert_eq!(v[19], 0);
    assert_eq!(&v[20..24], &[0xff, 0xff, 0xff, 0xfe]);
    assert_eq!(&v[24..28], &[0, 0, 0, 77]);
    assert_eq!(v.len(), BASE_HEADER_LEN + 16 + 10);
}

#[test]
fn every_truncation_is_rejected() {
    for (h, p) in all_headers() {
        let v = roundtrip(h, &p);
        for n in 0..v.len() {
            assert!(
                Packet::parse(&v[..n]).is_err(),
                "{:?} truncated to {}",
                h.base.opcode,
                n
            );
        }
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    for (h, p) in all_headers() {
        let mut v = roundtrip(h, &p);
        v.push(0);
        assert!(Packet::parse(&v).is_err(), "{:?}", h.base.opcode);
    }
}

#[test]
fn unknown_version_opcode_flags_reserved_rejected() {
    let (h, p) = all_headers().remove(0);
    let v = roundtrip(h, &p);
    let mut x = v.clone();
    x[0] = 2;
    assert_eq!(
        Packet::parse(&x).unwrap_err(),
        ParseError::UnknownVersion(2)
    );
    let mut x = v.clone();
    x[1] = 0x7f;
    assert_eq!(
        Packet::parse(&x).unwrap_err(),
        ParseError::UnknownOpcode(0x7f)
    );
    let mut x = v.clone();
    x[2] = 0x80;
    assert_eq!(Packet::parse(&x).unwrap_err(), ParseError::ReservedNonZero);
    let mut x = v.clone();
    x[19] = 1;
    assert_eq!(Packet::parse(&x).unwrap_err(), ParseError::ReservedNonZero);
}

#[test]
fn data_lengths_must_agree() {
    // offset + payload_len > total_len
    let h = Header {
        base: base(Opcode::Send),
        ext: Ext::Send(SendExt {
            rsn: 0,
            offset: 0,
            total_len: 10,
            payload_len: 10,
            imm: None,
        }),
    };
    let mut v = roundtrip(h, &[1u8; 10]);
    v[BASE_HEADER_LEN + 8..BASE_HEADER_LEN + 12].copy_from_slice(&9u32.to_be_bytes());
    assert_eq!(Packet::parse(&v).unwrap_err(), ParseError::BadLength);
    // offset overflow
    v[BASE_HEADER_LEN + 4..BASE_HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(Packet::parse(&v).unwrap_err(), ParseError::BadLength);
    // huge payload_len
    let mut v = roundtrip(h, &[1u8; 10]);
    v[BASE_HEADER_LEN + 8..BASE_HEADER_LEN + 12].copy_from_slice(&u32::MAX.to_be_bytes());
    v[BASE_HEADER_LEN + 12..BASE_HEADER_LEN + 16].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(Packet::parse(&v).unwrap_err(), ParseError::Truncated);
}

#[test]
fn emit_rejects_inconsistent_headers() {
    let mut buf = [0u8; 128];
    // WITH_IMM opcode, LAST flag, but no imm.
    let mut b = base(Opcode::SendWithImm);
    b.flags = Flags(Flags::LAST);
    let h = Header {
        base: b,
        ext: Ext::Send(SendExt::default()),
    };
    assert_eq!(h.emit(&mut buf), Err(EmitError::Inconsistent));
    // Extension of another opcode.
    let h = Header {
        base: base(Opcode::RdmaWrite),
        ext: Ext::Probe,
    };
    assert_eq!(h.emit(&mut buf), Err(EmitError::Inconsistent));
    // Buffer too small.
    let h = Header {
        base: base(Opcode::Probe),
        ext: Ext::Probe,
    };
    assert_eq!(h.emit(&mut buf[..31]), Err(EmitError::BufferTooSmall));
}

#[test]
fn ack_round_trip_and_sack_bits() {
    let mut buf = [0u8; 512];
    let info = AckHeader {
        path_count: 0,
        stream_count: 0,
        rate_hint_mbps: 100_000,
        share: 0x8000,
    };
    let mut w = AckWriter::new(&mut buf, base(Opcode::Ack), info).unwrap();
    let mut sack = [0u64; SACK_WORDS];
    sack[0] = 0b101; // cum+1, cum+3
    sack[3] = 1 << 63; // cum+256
    let pa = PathAck {
        path_id: 7,
        plane: 1,
        cum_psn: u32::MAX - 1,
        echo_ts: 99,
        ecn_ce: 4,
        busy: 0,
        sack,
    };
    w.push_path(&pa).unwrap();
    w.push_path(&PathAck {
        path_id: 300,
        ..PathAck::default()
    })
    .unwrap();
    w.push_stream(&StreamAck {
        qp: 17,
        completed_msn: 1000,
    })
    .unwrap();
    assert_eq!(w.push_path(&pa), Err(EmitError::Inconsistent));
    let n = w.finish();
    assert_eq!(
        n,
        BASE_HEADER_LEN + ACK_HEADER_LEN + 2 * PATH_ACK_LEN + STREAM_ACK_LEN
    );
    let p = Packet::parse(&buf[..n]).unwrap();
    let paths: Vec<_> = p.ack_paths().collect();
    let streams: Vec<_> = p.ack_streams().collect();
    assert_eq!(paths.len(), 2);
    assert_eq!(paths[0], pa);
    assert_eq!(paths[1].path_id, 300);
    assert_eq!(
        streams,
        std::vec![StreamAck {
            qp: 17,
            completed_msn: 1000
        }]
    );
    match p.header.ext {
        Ext::Ack(a) => {
            assert_eq!(a.rate_hint_mbps, 100_000);
            assert_eq!(a.share, 0x8000);
        }
        _ => panic!(),
    }
    // cum = MAX-1: MAX-2 below (acked), MAX-1 missing, MAX (cum+1) acked, 0 (cum+2) missing,
    // 1 (cum+3) acked, cum+256 acked, cum+257 not.
    assert!(pa.acks(u32::MAX - 2));
    assert!(!pa.acks(u32::MAX - 1));
    assert!(pa.acks(u32::MAX));
    assert!(!pa.acks(0));
    assert!(pa.acks(1));
    assert!(pa.acks((u32::MAX - 1).wrapping_add(256)));
    assert!(!pa.acks((u32::MAX - 1).wrapping_add(257)));
    // A count larger than the entries is truncation; a smaller one leaves trailing bytes.
    buf[BASE_HEADER_LEN] = 3;
    assert_eq!(Packet::parse(&buf[..n]).unwrap_err(), ParseError::Truncated);
    buf[BASE_HEADER_LEN] = 1;
    assert_eq!(
        Packet::parse(&buf[..n]).unwrap_err(),
        ParseError::TrailingBytes
    );
}

#[test]
fn peek_conn_id() {
    let (h, p) = all_headers().remove(0);
    let v = roundtrip(h, &p);
    assert_eq!(Packet::peek_conn_id(&v), Some(0xdead_beef));
    assert_eq!(Packet::peek_conn_id(&v[..15]), None);
    assert_eq!(Packet::peek_conn_id(&[2; 32]), None);
    assert_eq!(Packet::peek_conn_id(&[]), None);
}

#[test]
fn seq_compare_wraps() {
    assert!(seq_lt(u32::MAX, 0));
    assert!(seq_lt(5, 6));
    assert!(!seq_lt(6, 6));
    assert_eq!(seq_diff(2, u32::MAX), 3);
}

fn arb_opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select(std::vec![
        Opcode::Send,
        Opcode::SendWithImm,
        Opcode::RdmaWrite,
        Opcode::RdmaWriteWithImm,
        Opcode::ReadRequest,
        Opcode::ReadResponse,
        Opcode::CmpSwap,
        Opcode::FetchAdd,
        Opcode::AtomicResponse,
        Opcode::Nak,
        Opcode::Probe,
    ])
}

prop_compose! {
    fn arb_header()(op in arb_opcode(), flags in 0u16..=Flags::DEFINED, dst in any::<u32>(), src in any::<u32>(),
        conn in any::<u32>(), path in any::<u16>(), plane in any::<u8>(), psn in any::<u32>(), msn in any::<u32>(),
        ts in any::<u32>(), a in any::<u64>(), b in any::<u64>(), c in any::<u32>(), off in any::<u32>(),
        plen in 0u32..64, extra in any::<u32>(), imm in any::<u32>(), code in 1u8..=5) -> (Header, usize) {
        let base = BaseHeader { opcode: op, flags: Flags(flags), dst_qp: dst, src_qp: src, conn_id: conn,
            path_id: path, plane, psn, msn, timestamp: ts };
        let imm = if op.has_imm() && base.flags.has(Flags::LAST) { Some(imm) } else { None };
        let off = off.min(u32::MAX - plen);
        let total = off.saturating_add(plen).saturating_add(extra % 4096);
        let ext = match op {
            Opcode::Send | Opcode::SendWithImm => Ext::Send(SendExt { rsn: c, offset: off, total_len: total, payload_len: plen, imm }),
            Opcode::RdmaWrite | Opcode::RdmaWriteWithImm => Ext::Write(WriteExt { va: a, rkey: c, rsn: extra, offset: off, total_len: total, payload_len: plen, imm }),
            Opcode::ReadRequest => Ext::ReadRequest(ReadReqExt { va: a, rkey: c, len: extra }),
            Opcode::ReadResponse => Ext::ReadResponse(DataExt { offset: off, total_len: total, payload_len: plen }),
            Opcode::CmpSwap | Opcode::FetchAdd => Ext::Atomic(AtomicExt { va: a, rkey: c, swap_add: b, compare: a ^ b }),
            Opcode::AtomicResponse => Ext::AtomicResponse(b),
            Opcode::Nak => Ext::Nak(packet_nak(code, extra)),
            _ => Ext::Probe,
        };
        let h = Header { base, ext };
        (h, h.payload_len() as usize)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = Packet::parse(&bytes);
    }

    #[test]
    fn mutated_valid_packets_never_panic_and_reparse(idx in 0usize..12, pos in any::<usize>(), val in any::<u8>()) {
        let (h, p) = all_headers().swap_remove(idx);
        let mut v = roundtrip(h, &p);
        let i = pos % v.len();
        v[i] = val;
        if let Ok(view) = Packet::parse(&v) {
            let mut out = [0u8; 256];
            let n = view.header.emit(&mut out).unwrap();
            out[n..n + view.payload.len()].copy_from_slice(view.payload);
            prop_assert_eq!(&out[..n + view.payload.len()], &v[..]);
        }
    }

    #[test]
    fn arbitrary_headers_round_trip((h, plen) in arb_header()) {
        let payload = std::vec![0x5au8; plen];
        roundtrip(h, &payload);
    }

    #[test]
    fn arbitrary_acks_round_trip(paths in prop::collection::vec((any::<u16>(), any::<u32>(), any::<u32>(), any::<[u64; 4]>()), 0..8),
        streams in prop::collection::vec((any::<u32>(), any::<u32>()), 0..8), rate in any::<u32>(), share in any::<u16>()) {
        let mut buf = [0u8; 1024];
        let info = AckHeader { path_count: 0, stream_count: 0, rate_hint_mbps: rate, share };
        let mut w = AckWriter::new(&mut buf, base(Opcode::Ack), info).unwrap();
        for (id, cum, ts, sack) in &paths {
            w.push_path(&PathAck { path_id: *id, plane: 0, cum_psn: *cum, echo_ts: *ts, ecn_ce: 0, busy: 0, sack: *sack }).unwrap();
        }
        for (qp, msn) in &streams {
            w.push_stream(&StreamAck { qp: *qp, completed_msn: *msn }).unwrap();
        }
        let n = w.finish();
        let p = Packet::parse(&buf[..n]).unwrap();
        prop_assert_eq!(p.ack_paths().count(), paths.len());
        let got: Vec<_> = p.ack_streams().map(|s| (s.qp, s.completed_msn)).collect();
        prop_assert_eq!(got, streams);
    }
}

fn hello_entries() -> Vec<HelloEntry> {
    std::vec![
        HelloEntry {
            plane: 0,
            addr: PlaneAddr::V4([10, 77, 0, 1]),
            mtu: 1344,
        },
        HelloEntry {
            plane: 3,
            addr: PlaneAddr::V6([0xfd; 16]),
            mtu: 0,
        },
    ]
}

#[test]
fn hello_roundtrip() {
    let entries = hello_entries();
    let mut buf = [0u8; 256];
    let hello = HelloHeader {
        reply: true,
        plane_count: 0,
        paths: 24,
        epoch: 0x1234_5678,
        conn_id: 0x0bad_cafe,
    };
    let n = Packet::emit_hello(&mut buf, base(Opcode::Hello), hello, &entries).expect("emit");
    assert_eq!(n, BASE_HEADER_LEN + HELLO_HEADER_LEN + 2 * HELLO_ENTRY_LEN);
    let p = Packet::parse(&buf[..n]).expect("parse");
    assert_eq!(p.header.base.opcode, Opcode::Hello);
    assert_eq!((p.header.base.psn, p.header.base.dst_qp), (0, 0));
    assert_eq!(p.header.base.conn_id, 0xdead_beef);
    assert_eq!(
        p.header.ext,
        Ext::Hello(HelloHeader {
            reply: true,
            plane_count: 2,
            paths: 24,
            epoch: 0x1234_5678,
            conn_id: 0x0bad_cafe,
        })
    );
    assert_eq!(p.hello_entries().collect::<Vec<_>>(), entries);
    assert!(!Opcode::Hello.is_sequenced());
}

/// A HELLO header of `paths` paths, epoch 1, connection id 7.
fn hello_header(paths: u16) -> HelloHeader {
    HelloHeader {
        reply: false,
        plane_count: 0,
        paths,
        epoch: 1,
        conn_id: 7,
    }
}

#[test]
fn hello_rejects_bad_entries() {
    let entries = hello_entries();
    let mut buf = [0u8; 256];
    let n = Packet::emit_hello(&mut buf, base(Opcode::Hello), hello_header(8), &entries).unwrap();
    let hdr = BASE_HEADER_LEN + HELLO_HEADER_LEN;
    let mutate = |at: usize, v: u8| {
        let mut b = buf[..n].to_vec();
        b[at] = v;
        Packet::parse(&b).err()
    };
    // Unknown flag, too many planes, family, plane number, order.
    assert_eq!(
        mutate(BASE_HEADER_LEN, 2),
        Some(ParseError::ReservedNonZero)
    );
    assert!(mutate(BASE_HEADER_LEN + 1, 17).is_some());
    // The payload MTU is any value (0: not said), big-endian.
    assert!(mutate(hdr + 2, 1).is_none());
    let mut b = buf[..n].to_vec();
    b[hdr + 2] = 0x02;
    b[hdr + 3] = 0x00;
    let p = Packet::parse(&b).expect("parse");
    assert_eq!(p.hello_entries().next().map(|e| e.mtu), Some(512));
    // The path count is any value (0: the default).
    assert!(mutate(BASE_HEADER_LEN + 2, 1).is_none());
    // The sender's connection id is never 0 (bytes 8-11 of the HELLO header).
    let mut b = buf[..n].to_vec();
    b[BASE_HEADER_LEN + 8..BASE_HEADER_LEN + 12].fill(0);
    assert_eq!(Packet::parse(&b).err(), Some(ParseError::BadField));
    let mut zero = hello_header(8);
    zero.conn_id = 0;
    assert!(Packet::emit_hello(&mut [0u8; 256], base(Opcode::Hello), zero, &entries).is_err());
    assert_eq!(mutate(hdr + 1, 5), Some(ParseError::BadField));
    assert_eq!(mutate(hdr, 16), Some(ParseError::BadField));
    assert_eq!(mutate(hdr + HELLO_ENTRY_LEN, 0), Some(ParseError::BadField));
    // IPv4 entries have zero padding.
    assert_eq!(mutate(hdr + 8, 1), Some(ParseError::ReservedNonZero));
    // Count and length must agree.
    assert_eq!(
        Packet::parse(&buf[..n - 1]).err(),
        Some(ParseError::Truncated)
    );
    let mut longer = buf[..n].to_vec();
    longer.push(0);
    assert_eq!(
        Packet::parse(&longer).err(),
        Some(ParseError::TrailingBytes)
    );
    // Emitting out of order or too many is refused.
    let mut rev = entries.clone();
    rev.reverse();
    assert!(Packet::emit_hello(&mut buf, base(Opcode::Hello), hello_header(8), &rev).is_err());
    let many: Vec<_> = (0..17u8)
        .map(|plane| HelloEntry {
            plane: plane.min(15),
            addr: PlaneAddr::V4([0; 4]),
            mtu: 0,
        })
        .collect();
    assert!(Packet::emit_hello(
        &mut [0u8; 1024],
        base(Opcode::Hello),
        hello_header(8),
        &many
    )
    .is_err());
}

fn datagram_base(opcode: Opcode) -> BaseHeader {
    BaseHeader {
        opcode,
        flags: Flags(Flags::FIRST | Flags::LAST),
        dst_qp: 1,
        src_qp: 1,
        conn_id: 0,
        path_id: 0,
        plane: 0,
        psn: 0,
        msn: 0,
        timestamp: 99,
    }
}

#[test]
fn datagram_round_trips_with_and_without_imm() {
    let mad = [0x5au8; 256];
    let h = Header {
        base: datagram_base(Opcode::Datagram),
        ext: Ext::Datagram(DatagramExt {
            qkey: 0x8001_0000,
            pkey: 0xffff,
            payload_len: 256,
            imm: None,
        }),
    };
    let v = roundtrip(h, &mad);
    assert_eq!(v.len(), BASE_HEADER_LEN + 12 + 256);
    // qkey, pkey, reserved, payload length right after the base header, big-endian.
    assert_eq!(
        &v[32..44],
        &[0x80, 0x01, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 1, 0]
    );
    let mut b = datagram_base(Opcode::DatagramWithImm);
    b.flags = Flags(b.flags.0 | Flags::SOLICITED);
    let h = Header {
        base: b,
        ext: Ext::Datagram(DatagramExt {
            qkey: 7,
            pkey: 0x7fff,
            payload_len: 3,
            imm: Some(0xfeed_f00d),
        }),
    };
    let v = roundtrip(h, &[1, 2, 3]);
    assert_eq!(&v[44..48], &0xfeed_f00du32.to_be_bytes());
    assert!(!Opcode::Datagram.is_sequenced());
    assert!(Opcode::Datagram.is_device_level() && Opcode::DatagramWithImm.is_device_level());
    assert!(!Opcode::Send.is_device_level());
}

#[test]
fn datagram_must_be_one_unsequenced_packet() {
    let ext = Ext::Datagram(DatagramExt {
        qkey: 1,
        pkey: 0xffff,
        payload_len: 4,
        imm: None,
    });
    let good = datagram_base(Opcode::Datagram);
    let mut buf = [0u8; 128];
    let n = Header { base: good, ext }.emit(&mut buf).unwrap();
    let mut v = buf[..n].to_vec();
    v.extend_from_slice(&[9; 4]);
    assert!(Packet::parse(&v).is_ok());
    // Not FIRST|LAST, ACK_REQ set, or a connection, path, PSN or MSN: rejected both ways.
    let bad: [fn(&mut BaseHeader); 7] = [
        |b| b.flags = Flags(Flags::LAST),
        |b| b.flags = Flags(Flags::FIRST),
        |b| b.flags = Flags(b.flags.0 | Flags::ACK_REQ),
        |b| b.conn_id = 5,
        |b| b.path_id = 1,
        |b| b.psn = 1,
        |b| b.msn = 1,
    ];
    for f in bad {
        let mut b = good;
        f(&mut b);
        assert_eq!(
            Header { base: b, ext }.emit(&mut buf),
            Err(EmitError::Inconsistent)
        );
        let mut w = v.clone();
        w[2..4].copy_from_slice(&b.flags.0.to_be_bytes());
        w[12..16].copy_from_slice(&b.conn_id.to_be_bytes());
        w[16..18].copy_from_slice(&b.path_id.to_be_bytes());
        w[20..24].copy_from_slice(&b.psn.to_be_bytes());
        w[24..28].copy_from_slice(&b.msn.to_be_bytes());
        assert_eq!(Packet::parse(&w).unwrap_err(), ParseError::BadField);
    }
    // The payload length must be what follows.
    let mut short = v.clone();
    short.pop();
    assert!(Packet::parse(&short).is_err());
    v.push(0);
    assert!(Packet::parse(&v).is_err());
    // A reserved byte set.
    let mut r = buf[..n].to_vec();
    r.extend_from_slice(&[9; 4]);
    r[38] = 1;
    assert_eq!(Packet::parse(&r).unwrap_err(), ParseError::ReservedNonZero);
}
