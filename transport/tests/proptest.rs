// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Property tests over the simulated fabric: whatever the loss (below 100%), reordering and
//! duplication, every message is delivered exactly once, byte-exact, with completions in
//! posting order.

mod sim;

use metaroce_transport::stream::WrOpcode;
use proptest::prelude::*;
use sim::*;

fn arb_msg() -> impl Strategy<Value = Msg> {
    (
        prop::sample::select(vec![
            WrOpcode::Send,
            WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaWriteWithImm,
            WrOpcode::RdmaRead,
            WrOpcode::FetchAdd,
            WrOpcode::CmpSwap,
        ]),
        prop_oneof![0u32..64, 0u32..5000, Just(16384u32)],
    )
        .prop_map(|(op, len)| Msg { op, len })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(24), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn exactly_once_in_order(
        seed in any::<u64>(),
        loss_pct_x100 in 0u32..4000,
        reorder_pct in 0u32..60,
        reorder_max_us in 0u64..80,
        dup_pct_x100 in 0u32..1000,
        msgs in prop::collection::vec(arb_msg(), 1..48),
        msn_start in prop_oneof![Just(0u32), (u32::MAX - 64)..=u32::MAX],
        psn_start in prop_oneof![Just(0u32), (u32::MAX - 300)..=u32::MAX],
    ) {
        let link = LinkConfig::clean()
            .loss(loss_pct_x100)
            .reorder(reorder_pct, reorder_max_us * 1000)
            .dup(dup_pct_x100);
        let mut sim = Sim::with_config(link, seed, |c| c.path.initial_psn = psn_start);
        // Under extreme loss a finite retry count can legitimately run out: use a large one.
        // Sequence numbers may start just before they wrap.
        sim.reconfigure_streams(|c| {
            c.retry_cnt = 255;
            c.send_msn = msn_start;
            c.recv_msn = msn_start;
        });
        let r = run_workload(&mut sim, &msgs, 60_000_000_000);
        prop_assert!(r.completed, "not completed: {:?}", r);
    }

    #[test]
    fn reordering_alone_never_retransmits(
        seed in any::<u64>(),
        reorder_pct in 0u32..60,
        reorder_max_us in 0u64..60,
        msgs in prop::collection::vec(arb_msg(), 1..32),
    ) {
        let mut sim = Sim::new(LinkConfig::clean().reorder(reorder_pct, reorder_max_us * 1000), seed);
        let r = run_workload(&mut sim, &msgs, 10_000_000_000);
        prop_assert!(r.completed);
        prop_assert_eq!(r.retransmits, 0);
    }
}

mod hostile {
    //! Arbitrary, mostly well-formed packets thrown at a live connection: nothing panics, and
    //! the connection still works afterwards.
    use super::*;
    use metaroce_transport::wire::{
        AckHeader, AckWriter, AtomicExt, BaseHeader, DataExt, Ext, Flags, Header, NakCode, NakExt,
        Opcode, PathAck, ReadReqExt, SendExt, StreamAck, WriteExt,
    };

    fn small_or_any() -> impl Strategy<Value = u32> {
        prop_oneof![0u32..40, any::<u32>(), Just(u32::MAX)]
    }

    fn arb_packet() -> impl Strategy<Value = Vec<u8>> {
        (
            0usize..12,
            0u16..=Flags::DEFINED,
            prop_oneof![Just(0x22u32), Just(0x11u32), any::<u32>()],
            prop_oneof![Just(200u32), any::<u32>()],
            prop_oneof![0u16..10, any::<u16>()],
            small_or_any(),
            small_or_any(),
            (
                small_or_any(),
                prop_oneof![Just(1024u32), small_or_any()],
                any::<u64>(),
                any::<u32>(),
            ),
            (0usize..1500, any::<[u64; 4]>(), 1u8..6),
        )
            .prop_map(
                |(op, flags, dst, conn, path, psn, msn, (a, b, va, key), (plen, sack, code))| {
                    let ops = [
                        Opcode::Send,
                        Opcode::SendWithImm,
                        Opcode::RdmaWrite,
                        Opcode::RdmaWriteWithImm,
                        Opcode::ReadRequest,
                        Opcode::ReadResponse,
                        Opcode::CmpSwap,
                        Opcode::FetchAdd,
                        Opcode::AtomicResponse,
                        Opcode::Ack,
                        Opcode::Nak,
                        Opcode::Probe,
                    ];
                    let opcode = ops[op];
                    let base = BaseHeader {
                        opcode,
                        flags: Flags(flags),
                        dst_qp: dst,
                        src_qp: 0x11,
                        conn_id: conn,
                        path_id: path,
                        plane: 0,
                        psn,
                        msn,
                        timestamp: a,
                    };
                    let mut buf = vec![0u8; 4096];
                    if opcode == Opcode::Ack {
                        let mut w = AckWriter::new(&mut buf, base, AckHeader::default()).unwrap();
                        w.push_path(&PathAck {
                            path_id: path,
                            plane: 0,
                            cum_psn: psn,
                            echo_ts: a,
                            ecn_ce: 1,
                            busy: 1,
                            sack,
                        })
                        .unwrap();
                        w.push_stream(&StreamAck {
                            qp: dst,
                            completed_msn: msn,
                        })
                        .unwrap();
                        let n = w.finish();
                        buf.truncate(n);
                        return buf;
                    }
                    let last = Flags(flags).has(Flags::LAST);
                    let imm = (opcode.has_imm() && last).then_some(key);
                    let off = a.min(u32::MAX - plen as u32);
                    let total = off.saturating_add(plen as u32).saturating_add(b % 3);
                    let ext = match opcode {
                        Opcode::Send | Opcode::SendWithImm => Ext::Send(SendExt {
                            rsn: b % 4,
                            offset: off,
                            total_len: total,
                            payload_len: plen as u32,
                            imm,
                        }),
                        Opcode::RdmaWrite | Opcode::RdmaWriteWithImm => Ext::Write(WriteExt {
                            va,
                            rkey: key % 4,
                            rsn: b % 4,
                            offset: off,
                            total_len: total,
                            payload_len: plen as u32,
                            imm,
                        }),
                        Opcode::ReadRequest => Ext::ReadRequest(ReadReqExt {
                            va,
                            rkey: key % 4,
                            len: b,
                        }),
                        Opcode::ReadResponse => Ext::ReadResponse(DataExt {
                            offset: off,
                            total_len: total,
                            payload_len: plen as u32,
                        }),
                        Opcode::CmpSwap | Opcode::FetchAdd => Ext::Atomic(AtomicExt {
                            va,
                            rkey: key % 4,
                            swap_add: va,
                            compare: 0,
                        }),
                        Opcode::AtomicResponse => Ext::AtomicResponse(va),
                        Opcode::Nak => {
                            let c = [
                                NakCode::RemoteAccess,
                                NakCode::InvalidRequest,
                                NakCode::Rnr,
                                NakCode::OutOfWindow,
                                NakCode::RemoteOperational,
                            ][usize::from(code - 1)];
                            Ext::Nak(NakExt {
                                code: c,
                                value: b % 100_000,
                            })
                        }
                        _ => Ext::Probe,
                    };
                    let h = Header { base, ext };
                    let n = h.emit(&mut buf).unwrap();
                    let len = n + h.payload_len() as usize;
                    buf.truncate(len);
                    buf
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(160), failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn hostile_packets_never_panic(pkts in prop::collection::vec(arb_packet(), 1..40), seed in any::<u64>()) {
            let mut sim = Sim::new(LinkConfig::clean(), seed);
            // Some state to disturb: a completed SEND, a posted receive, a WRITE in flight.
            let (sa, sb) = (sim.ep[0].stream, sim.ep[1].stream);
            for w in 0..2 {
                sim.ep[1].conn.post_recv(sb, metaroce_transport::stream::RecvWqe { wr_id: w, local: sge(2, 0x200000, 4096) }).unwrap();
            }
            let now = sim.now;
            sim.ep[0].conn.post_send(now, sa, metaroce_transport::stream::SendWqe::new(1, WrOpcode::Send, sge(1, 0x100000, 3000))).unwrap();
            prop_assert!(sim.run_until(sim.now + 10_000_000, |s| s.ep[1].recv_cqes.len() == 1));
            sim.ep[0].conn.post_send(now, sa, metaroce_transport::stream::SendWqe::new(9, WrOpcode::RdmaWrite, sge(1, 0x100000, 9000)).remote(0x200000, 2)).unwrap();
            sim.pump();
            let mut buf = vec![0u8; 2048];
            for p in &pkts {
                for i in 0..2 {
                    let now = sim.now;
                    let ep = &mut sim.ep[i];
                    let _ = ep.conn.handle_packet(now, p, Arrival { ecn_ce: true, rx_busy: true, src_port: 0 }, &mut ep.mem);
                    while ep.conn.poll_transmit(now, &mut buf, &mut ep.mem).is_some() {}
                    while ep.conn.poll_event().is_some() {}
                    ep.conn.handle_timeout(now + 10_000_000);
                }
                // Truncations and bit flips of the same packet.
                let mut q = p.clone();
                q.truncate(p.len() / 2);
                let now = sim.now;
                let _ = sim.ep[1].conn.handle_packet(now, &q, Arrival::default(), &mut sim.ep[1].mem);
            }
            // Time still moves and timers still fire without panicking.
            sim.run_until(sim.now + 20_000_000, |_| false);
        }
    }
}

mod hostile_user {
    //! Arbitrary work requests (any opcode, keys, addresses, lengths) on a lossy link:
    //! posting never panics, every accepted WQE completes exactly once, in order.
    use super::*;
    use metaroce_transport::memory::{SgList, Sge};
    use metaroce_transport::stream::{RecvWqe, SendWqe};

    fn arb_sge() -> impl Strategy<Value = Sge> {
        (
            prop_oneof![Just(1u32), Just(2u32), any::<u32>()],
            prop_oneof![0x100000u64..0x140000, any::<u64>()],
            prop_oneof![0u32..9000, any::<u32>()],
        )
            .prop_map(|(lkey, addr, len)| Sge { addr, len, lkey })
    }

    fn arb_wqe() -> impl Strategy<Value = SendWqe> {
        (
            prop::sample::select(vec![
                WrOpcode::Send,
                WrOpcode::SendWithImm,
                WrOpcode::RdmaWrite,
                WrOpcode::RdmaWriteWithImm,
                WrOpcode::RdmaRead,
                WrOpcode::FetchAdd,
                WrOpcode::CmpSwap,
            ]),
            prop::collection::vec(arb_sge(), 0..5),
            prop_oneof![0x200000u64..0x240000, any::<u64>()],
            prop_oneof![Just(2u32), any::<u32>()],
            any::<bool>(),
        )
            .prop_map(|(op, sges, va, rkey, signaled)| {
                let local = SgList::new(&sges).unwrap_or_default();
                let mut w = SendWqe::new(0, op, local).remote(va, rkey);
                w.signaled = signaled;
                w
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(48), failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_work_requests(wqes in prop::collection::vec(arb_wqe(), 1..24), recvs in prop::collection::vec(arb_sge(), 0..8), seed in any::<u64>()) {
            let mut sim = Sim::new(LinkConfig::clean().loss(300), seed);
            let (sa, sb) = (sim.ep[0].stream, sim.ep[1].stream);
            for (i, r) in recvs.iter().enumerate() {
                let _ = sim.ep[1].conn.post_recv(sb, RecvWqe { wr_id: i as u64, local: SgList::new(&[*r]).unwrap() });
            }
            let mut accepted = Vec::new();
            for (i, mut w) in wqes.into_iter().enumerate() {
                w.wr_id = i as u64;
                let now = sim.now;
                if sim.ep[0].conn.post_send(now, sa, w).is_ok() {
                    accepted.push((i as u64, w.signaled));
                }
            }
            // RNR retries are infinite by default and a SEND may never find a receive: give
            // every path a bound by time, not by completion.
            sim.run_until(sim.now + 200_000_000, |s| s.ep[0].send_cqes.len() == accepted.len());
            let got: Vec<u64> = sim.ep[0].send_cqes.iter().map(|c| c.wr_id).collect();
            // In order, each at most once; unsignaled successes are silent.
            let mut last = None;
            for id in &got {
                prop_assert!(last.is_none_or(|l| *id > l), "order {:?}", got);
                last = Some(*id);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(12), failure_persistence: None, ..ProptestConfig::default() })]

    /// Several streams (QPs) on one connection, concurrently, over a lossy, reordering,
    /// duplicating link, with receives posted late (RNR): each stream's messages complete
    /// exactly once, in its own order.
    #[test]
    fn many_streams_exactly_once_in_order(
        seed in any::<u64>(),
        loss_pct_x100 in 0u32..2000,
        reorder_pct in 0u32..40,
        dup_pct_x100 in 0u32..500,
        jobs in prop::collection::vec(prop::collection::vec(arb_msg(), 1..24), 1..4),
        recv_delay_us in prop::collection::vec(prop_oneof![Just(0u64), 0u64..3000], 4),
    ) {
        let link = LinkConfig::clean().loss(loss_pct_x100).reorder(reorder_pct, 30_000).dup(dup_pct_x100);
        let mut sim = Sim::new(link, seed);
        sim.set_retry_cnt(255);
        let mut specs = Vec::new();
        let mut slot0 = 0;
        for (k, msgs) in jobs.into_iter().enumerate() {
            let (a, b) = if k == 0 {
                (sim.ep[0].stream, sim.ep[1].stream)
            } else {
                sim.open_pair(0x100 + k as u32, 0x200 + k as u32)
            };
            let n = msgs.len() as u64;
            specs.push(Job {
                a,
                b,
                msgs,
                slot0,
                counter: COUNTER + 16 * k as u64,
                recv_delay_ns: recv_delay_us[k] * 1000,
            });
            slot0 += n;
        }
        let r = run_jobs(&mut sim, &specs, 60_000_000_000);
        prop_assert!(r.completed, "not completed: {:?}", r);
    }
}
