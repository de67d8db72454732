// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! End-to-end tests over the simulated fabric.

mod sim;

use metaroce_transport::stream::{CqOpcode, CqStatus, RecvWqe, SendWqe, WrOpcode};
use sim::*;

const A_BUF: u64 = 0x100000;
const B_BUF: u64 = 0x200000;

fn recv(sim: &mut Sim, wr_id: u64, addr: u64, len: u32) {
    let s = sim.ep[1].stream;
    sim.ep[1]
        .conn
        .post_recv(
            s,
            RecvWqe {
                wr_id,
                local: sge(2, addr, len),
            },
        )
        .unwrap();
}

fn post(sim: &mut Sim, wqe: SendWqe) {
    let s = sim.ep[0].stream;
    let now = sim.now;
    sim.ep[0].conn.post_send(now, s, wqe).unwrap();
}

#[test]
fn write_and_send_byte_exact() {
    let mut sim = Sim::new(LinkConfig::clean(), 1);
    let data = pattern(1, 10_000);
    sim.ep[0].mem.fill(1, A_BUF, &data);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 10_000)).remote(B_BUF + 100, 2),
    );
    recv(&mut sim, 7, B_BUF + 20_000, 4096);
    post(
        &mut sim,
        SendWqe::new(2, WrOpcode::Send, sge(1, A_BUF + 5, 3000)),
    );
    assert!(sim.run_until(10_000_000, |s| s.ep[0].send_cqes.len() == 2
        && s.ep[1].recv_cqes.len() == 1));
    assert_eq!(sim.ep[1].mem.bytes(2, B_BUF + 100, 10_000), &data[..]);
    assert_eq!(sim.ep[1].mem.bytes(2, B_BUF + 20_000, 3000), &data[5..3005]);
    let c = &sim.ep[0].send_cqes;
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (1, CqStatus::Success, CqOpcode::RdmaWrite)
    );
    assert_eq!((c[1].wr_id, c[1].status), (2, CqStatus::Success));
    let r = &sim.ep[1].recv_cqes[0];
    assert_eq!(
        (r.wr_id, r.status, r.byte_len, r.opcode),
        (7, CqStatus::Success, 3000, CqOpcode::Recv)
    );
    assert_eq!(sim.retransmits(), 0);
}

fn bulk(n: usize, len: u32) -> Vec<Msg> {
    (0..n)
        .map(|_| Msg {
            op: WrOpcode::RdmaWrite,
            len,
        })
        .collect()
}

fn mixed(n: usize) -> Vec<Msg> {
    let ops = [
        WrOpcode::RdmaWrite,
        WrOpcode::Send,
        WrOpcode::RdmaRead,
        WrOpcode::SendWithImm,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::FetchAdd,
        WrOpcode::RdmaWrite,
        WrOpcode::CmpSwap,
    ];
    let sizes = [1u32, 1024, 3000, 16384, 0, 777, 8192, 2048];
    (0..n)
        .map(|i| Msg {
            op: ops[i % ops.len()],
            len: sizes[(i / ops.len() + i) % sizes.len()],
        })
        .collect()
}

#[test]
fn every_opcode_clean() {
    let mut sim = Sim::new(LinkConfig::clean(), 2);
    let r = run_workload(&mut sim, &mixed(64), 100_000_000);
    assert!(r.completed, "{r:?}");
    assert_eq!(r.retransmits, 0);
}

#[test]
fn atomics_return_original_values() {
    let mut sim = Sim::new(LinkConfig::clean(), 3);
    sim.ep[1].mem.fill(2, B_BUF + 64, &41u64.to_ne_bytes());
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::FetchAdd, sge(1, A_BUF, 8))
            .remote(B_BUF + 64, 2)
            .atomic(0, 1),
    );
    post(
        &mut sim,
        SendWqe::new(2, WrOpcode::CmpSwap, sge(1, A_BUF + 8, 8))
            .remote(B_BUF + 64, 2)
            .atomic(42, 7),
    );
    post(
        &mut sim,
        SendWqe::new(3, WrOpcode::CmpSwap, sge(1, A_BUF + 16, 8))
            .remote(B_BUF + 64, 2)
            .atomic(42, 9),
    );
    assert!(sim.run_until(10_000_000, |s| s.ep[0].send_cqes.len() == 3));
    let word = |sim: &Sim, ep: usize, key: u32, va: u64| {
        u64::from_ne_bytes(sim.ep[ep].mem.bytes(key, va, 8).try_into().unwrap())
    };
    assert_eq!(word(&sim, 0, 1, A_BUF), 41);
    assert_eq!(word(&sim, 0, 1, A_BUF + 8), 42);
    assert_eq!(
        word(&sim, 0, 1, A_BUF + 16),
        7,
        "compare failed: original returned"
    );
    assert_eq!(word(&sim, 1, 2, B_BUF + 64), 7);
    assert!(sim.ep[0]
        .send_cqes
        .iter()
        .all(|c| c.status == CqStatus::Success && c.byte_len == 8));
}

/// SEND_WITH_INV invalidates its rkey as its message completes, after every earlier message
/// (placed out of order, perhaps through that rkey): over a lossy, reordering link a WRITE
/// through the key lands whole, the SEND's receive completes with the key and `invalidated`,
/// and a WRITE through the key posted once the SEND completed fails with a remote access
/// error. (One posted right behind the SEND may land first: data is placed as it arrives, and
/// the key to invalidate comes with the SEND's last packet; `docs/wire-format.md`.)
#[test]
fn send_with_invalidate_after_earlier_writes() {
    for seed in [11, 12, 13] {
        let mut sim = Sim::new(LinkConfig::clean().loss(300).reorder(30, 30_000), seed);
        sim.ep[1].mem.add(5, 0x300000, 65536);
        let data = pattern(3, 40_000);
        sim.ep[0].mem.fill(1, A_BUF, &data);
        recv(&mut sim, 70, B_BUF, 4096);
        post(
            &mut sim,
            SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 40_000)).remote(0x300000, 5),
        );
        post(
            &mut sim,
            SendWqe::new(2, WrOpcode::SendWithInv, sge(1, A_BUF + 7, 100)).imm(5),
        );
        assert!(sim.run_until(100_000_000, |s| s.ep[0].send_cqes.len() == 2));
        post(
            &mut sim,
            SendWqe::new(3, WrOpcode::RdmaWrite, sge(1, A_BUF, 10)).remote(0x300000, 5),
        );
        assert!(sim.run_until(200_000_000, |s| s.ep[0].send_cqes.len() == 3));
        let got: Vec<_> = sim.ep[0]
            .send_cqes
            .iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, CqStatus::Success, CqOpcode::RdmaWrite),
                (2, CqStatus::Success, CqOpcode::Send),
                (3, CqStatus::RemAccessErr, CqOpcode::RdmaWrite),
            ],
            "seed {seed}"
        );
        assert_eq!(sim.ep[1].mem.bytes(5, 0x300000, 40_000), &data[..]);
        assert_eq!(sim.ep[1].mem.bytes(2, B_BUF, 100), &data[7..107]);
        assert_eq!(sim.ep[1].mem.invalidated, vec![5], "invalidated once");
        let r = sim.ep[1].recv_cqes[0];
        assert_eq!(
            (
                r.wr_id,
                r.status,
                r.byte_len,
                r.opcode,
                r.imm,
                r.invalidated
            ),
            (70, CqStatus::Success, 100, CqOpcode::Recv, Some(5), true)
        );
    }
}

/// WRITEs to the same bytes leave what in-order execution leaves, whatever order their
/// packets arrive in: over a lossy, reordering link, a burst of WRITEs (some WITH_IMM) that
/// rewrite one buffer (as UCX's `put_bw` does, polling a sequence number in its last bytes),
/// then overlap it and each other at offsets off the MTU. A late packet of an older WRITE
/// does not turn back bytes a newer one placed.
#[test]
fn overlapping_writes_end_as_in_order_execution() {
    let mut behind_newer = 0;
    for seed in [31, 32, 33, 34] {
        let mut sim = Sim::new(LinkConfig::clean().loss(200).reorder(40, 40_000), seed);
        let data = pattern(seed, 16 * 6_000);
        sim.ep[0].mem.fill(1, A_BUF, &data);
        let mut expect = sim.ep[1].mem.bytes(2, B_BUF, 12_000).to_vec();
        let mut rng = Rng::new(seed);
        let mut with_imm = 0;
        for i in 0..16u64 {
            // The first eight rewrite [0, 5000); the others land anywhere in [0, 12000).
            let (off, len) = if i < 8 {
                (0, 5_000)
            } else {
                (rng.below(6_000), 1 + rng.below(6_000))
            };
            let src = (i * 6_000) as usize;
            let op = if i % 5 == 4 {
                recv(&mut sim, i, B_BUF + 0x80000, 16);
                with_imm += 1;
                WrOpcode::RdmaWriteWithImm
            } else {
                WrOpcode::RdmaWrite
            };
            post(
                &mut sim,
                SendWqe::new(i, op, sge(1, A_BUF + src as u64, len as u32))
                    .remote(B_BUF + off, 2)
                    .imm(i as u32),
            );
            let (o, l) = (off as usize, len as usize);
            expect[o..o + l].copy_from_slice(&data[src..src + l]);
        }
        assert!(sim.run_until(200_000_000, |s| s.ep[0].send_cqes.len() == 16
            && s.ep[1].recv_cqes.len() == with_imm));
        assert!(sim.ep[0]
            .send_cqes
            .iter()
            .all(|c| c.status == CqStatus::Success));
        assert!(
            sim.ep[1].mem.bytes(2, B_BUF, 12_000) == &expect[..],
            "seed {seed}: memory differs from in-order execution"
        );
        let stream = sim.ep[1].stream;
        behind_newer += sim.ep[1].conn.stream_stats(stream).unwrap().1.behind_newer;
    }
    assert!(
        behind_newer > 0,
        "some packet arrived behind a newer WRITE's"
    );
}

/// A SEND_WITH_INV whose rkey the receiving QP may not invalidate (no such key, or another
/// protection domain's) fails the message: the requester gets a remote invalid request, the
/// responder's QP goes to error and the receive the message took flushes.
#[test]
fn send_with_invalidate_of_a_foreign_key_fails() {
    for foreign in [99, 6] {
        let mut sim = Sim::new(LinkConfig::clean(), 21);
        sim.ep[1].mem.add(6, 0x300000, 4096);
        sim.ep[1].mem.regions.get_mut(&6).unwrap().pd = 9;
        recv(&mut sim, 70, B_BUF, 4096);
        post(
            &mut sim,
            SendWqe::new(2, WrOpcode::SendWithInv, sge(1, A_BUF, 100)).imm(foreign),
        );
        assert!(sim.run_until(100_000_000, |s| !s.ep[0].send_cqes.is_empty()
            && !s.ep[1].recv_cqes.is_empty()));
        let c = sim.ep[0].send_cqes[0];
        assert_eq!(
            (c.wr_id, c.status),
            (2, CqStatus::RemInvReqErr),
            "key {foreign}"
        );
        let r = sim.ep[1].recv_cqes[0];
        assert_eq!((r.wr_id, r.status), (70, CqStatus::WrFlushErr));
        assert_eq!(
            sim.ep[1].stream_errors,
            vec![(sim.ep[1].stream, CqStatus::RemInvReqErr)]
        );
        assert!(sim.ep[1].mem.invalidated.is_empty());
    }
}

/// A WRITE, then an ATOMIC WRITE of a flag behind it and a FLUSH of both, over a reordering,
/// lossy link: the flag and the data arrive, the FLUSH completes after them, and a
/// persistent FLUSH (no persistent memory here) fails with a remote access error.
#[test]
fn atomic_write_and_flush() {
    for seed in [5, 6, 7] {
        let mut sim = Sim::new(LinkConfig::clean().loss(300).reorder(30, 30_000), seed);
        let data: Vec<u8> = (0..16384u32).map(|i| (i * 7) as u8).collect();
        sim.ep[0].mem.fill(1, A_BUF, &data);
        post(
            &mut sim,
            SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 16384)).remote(B_BUF, 2),
        );
        post(
            &mut sim,
            SendWqe::new(2, WrOpcode::AtomicWrite, Default::default())
                .remote(B_BUF + 16384, 2)
                .atomic(0, 0x1122_3344_5566_7788),
        );
        let global_range = u64::from(metaroce_transport::wire::FLUSH_GLOBAL);
        post(
            &mut sim,
            SendWqe::new(3, WrOpcode::Flush, Default::default())
                .remote(B_BUF, 2)
                .atomic(global_range, 16392),
        );
        assert!(sim.run_until(50_000_000, |s| s.ep[0].send_cqes.len() == 3));
        let got: Vec<_> = sim.ep[0]
            .send_cqes
            .iter()
            .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, CqStatus::Success, CqOpcode::RdmaWrite, 16384),
                (2, CqStatus::Success, CqOpcode::AtomicWrite, 8),
                (3, CqStatus::Success, CqOpcode::Flush, 0),
            ]
        );
        assert_eq!(sim.ep[1].mem.bytes(2, B_BUF, 16384), &data[..]);
        assert_eq!(
            sim.ep[1].mem.bytes(2, B_BUF + 16384, 8),
            0x1122_3344_5566_7788u64.to_be_bytes(),
            "the bytes in order"
        );
        assert_eq!(sim.ep[1].mem.flushes, 1, "executed once");
        let persistent = u64::from(metaroce_transport::wire::FLUSH_PERSISTENT);
        post(
            &mut sim,
            SendWqe::new(4, WrOpcode::Flush, Default::default())
                .remote(B_BUF, 2)
                .atomic(persistent, 8),
        );
        assert!(sim.run_until(100_000_000, |s| s.ep[0].send_cqes.len() == 4));
        assert_eq!(sim.ep[0].send_cqes[3].status, CqStatus::RemAccessErr);
    }
}

fn lossy(link: LinkConfig, seed: u64, msgs: &[Msg]) -> WorkloadResult {
    let mut sim = Sim::new(link, seed);
    let r = run_workload(&mut sim, msgs, 2_000_000_000);
    assert!(r.completed, "did not complete: {r:?}");
    r
}

#[test]
fn lossy_links_deliver_everything_once_in_order() {
    let msgs = mixed(160);
    for (name, link) in [
        ("1% loss", LinkConfig::clean().loss(100)),
        ("10% loss", LinkConfig::clean().loss(1000)),
        ("25% reorder", LinkConfig::clean().reorder(25, 30_000)),
        ("1% dup", LinkConfig::clean().dup(100)),
        (
            "all",
            LinkConfig::clean().loss(500).reorder(25, 30_000).dup(100),
        ),
    ] {
        let r = lossy(link, 11, &msgs);
        eprintln!(
            "{name}: goodput {} Mbit/s, retransmits {}, timeouts {}, pokes {}, net {:?}",
            r.goodput_mbps(),
            r.retransmits,
            r.timeouts,
            r.pokes,
            r.net
        );
    }
}

#[test]
fn reordering_without_loss_causes_no_retransmission() {
    for seed in 0..4 {
        let r = lossy(LinkConfig::clean().reorder(25, 40_000), seed, &mixed(96));
        assert_eq!(r.retransmits, 0, "seed {seed}: {r:?}");
    }
}

#[test]
fn goodput_under_loss() {
    let msgs = bulk(200, 16384);
    let t = std::time::Instant::now();
    let base = lossy(LinkConfig::clean(), 5, &msgs);
    let wall = t.elapsed();
    eprintln!(
        "simulator: {} datagrams in {:?} of CPU ({} ns per datagram, both ends, build profile of this test)",
        base.net.sent,
        wall,
        wall.as_nanos() as u64 / base.net.sent.max(1)
    );
    let l1 = lossy(LinkConfig::clean().loss(100), 5, &msgs);
    let l10 = lossy(LinkConfig::clean().loss(1000), 5, &msgs);
    eprintln!(
        "goodput: 0% {} Mbit/s; 1% {} Mbit/s ({}%, {} retransmits); 10% {} Mbit/s ({}%, {} retransmits)",
        base.goodput_mbps(),
        l1.goodput_mbps(),
        l1.goodput_mbps() * 100 / base.goodput_mbps().max(1),
        l1.retransmits,
        l10.goodput_mbps(),
        l10.goodput_mbps() * 100 / base.goodput_mbps().max(1),
        l10.retransmits,
    );
    assert!(
        l1.goodput_mbps() * 100 >= base.goodput_mbps() * 50,
        "1% loss keeps at least half"
    );
    assert!(
        l10.goodput_mbps() * 100 >= base.goodput_mbps() * 10,
        "10% loss keeps at least a tenth"
    );
}

#[test]
fn bad_rkey_gives_remote_access_error_and_flush() {
    let mut sim = Sim::new(LinkConfig::clean(), 4);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 100)).remote(B_BUF, 2),
    );
    post(
        &mut sim,
        SendWqe::new(2, WrOpcode::RdmaWrite, sge(1, A_BUF, 100)).remote(B_BUF, 99),
    );
    post(
        &mut sim,
        SendWqe::new(3, WrOpcode::RdmaWrite, sge(1, A_BUF, 100)).remote(B_BUF, 2),
    );
    assert!(sim.run_until(50_000_000, |s| s.ep[0].send_cqes.len() == 3));
    let st: Vec<_> = sim.ep[0]
        .send_cqes
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        st,
        vec![
            (1, CqStatus::Success),
            (2, CqStatus::RemAccessErr),
            (3, CqStatus::WrFlushErr)
        ]
    );
    assert_eq!(sim.ep[0].stream_errors.len(), 1);
    // The responder's QP went to error too.
    assert_eq!(sim.ep[1].stream_errors.len(), 1);
    assert_eq!(sim.ep[1].stream_errors[0].1, CqStatus::RemAccessErr);
    // Out-of-bounds READ and misaligned atomic on a fresh pair.
    let mut sim = Sim::new(LinkConfig::clean(), 5);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaRead, sge(1, A_BUF, 100))
            .remote(B_BUF + REGION as u64 - 50, 2),
    );
    assert!(sim.run_until(50_000_000, |s| !s.ep[0].send_cqes.is_empty()));
    assert_eq!(sim.ep[0].send_cqes[0].status, CqStatus::RemAccessErr);
}

#[test]
fn rnr_then_success_once_receive_posted() {
    let mut sim = Sim::new(LinkConfig::clean(), 6);
    let data = pattern(6, 5000);
    sim.ep[0].mem.fill(1, A_BUF, &data);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::Send, sge(1, A_BUF, 5000)),
    );
    post(
        &mut sim,
        SendWqe::new(2, WrOpcode::RdmaWrite, sge(1, A_BUF, 5000)).remote(B_BUF + 8192, 2),
    );
    // Let it bounce off the empty receive queue for a while.
    sim.run_until(sim.now + 2_000_000, |_| false);
    assert!(sim.ep[0].send_cqes.is_empty());
    let rnr = sim.ep[1].conn.stats().naks_out;
    assert!(rnr >= 2, "several RNR NAKs: {rnr}");
    recv(&mut sim, 9, B_BUF, 8000);
    assert!(
        sim.run_until(sim.now + 50_000_000, |s| s.ep[0].send_cqes.len() == 2
            && s.ep[1].recv_cqes.len() == 1)
    );
    assert!(sim.ep[0]
        .send_cqes
        .iter()
        .all(|c| c.status == CqStatus::Success));
    assert_eq!(sim.ep[0].send_cqes[0].wr_id, 1);
    assert_eq!(sim.ep[1].mem.bytes(2, B_BUF, 5000), &data[..]);
    assert_eq!(
        (
            sim.ep[1].recv_cqes[0].wr_id,
            sim.ep[1].recv_cqes[0].byte_len
        ),
        (9, 5000)
    );
}

#[test]
fn rnr_retry_exhausted() {
    let mut sim = Sim::new(LinkConfig::clean(), 7);
    let s = sim.ep[0].stream;
    sim.ep[0].conn.close_stream(s);
    let mut cfg = metaroce_transport::stream::StreamConfig::new(0x11, 0x22);
    cfg.rnr_retry = 2;
    sim.ep[0].stream = sim.ep[0].conn.open_stream(cfg).unwrap();
    post(&mut sim, SendWqe::new(1, WrOpcode::Send, sge(1, A_BUF, 10)));
    post(&mut sim, SendWqe::new(2, WrOpcode::Send, sge(1, A_BUF, 10)));
    assert!(sim.run_until(100_000_000, |s| s.ep[0].send_cqes.len() == 2));
    let st: Vec<_> = sim.ep[0].send_cqes.iter().map(|c| c.status).collect();
    assert_eq!(st, vec![CqStatus::RnrRetryExcErr, CqStatus::WrFlushErr]);
}

#[test]
fn peer_disappears_retry_exceeded_and_flush() {
    let mut sim = Sim::new(LinkConfig::clean(), 8);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 3000)).remote(B_BUF, 2),
    );
    assert!(sim.run_until(10_000_000, |s| s.ep[0].send_cqes.len() == 1));
    sim.b_dead = true;
    for i in 0..5 {
        post(
            &mut sim,
            SendWqe::new(10 + i, WrOpcode::RdmaWrite, sge(1, A_BUF, 3000)).remote(B_BUF, 2),
        );
    }
    let t0 = sim.now;
    assert!(sim.run_until(sim.now + 10_000_000_000, |s| s.ep[0].send_cqes.len() == 6));
    let st: Vec<_> = sim.ep[0].send_cqes[1..]
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(st[0], (10, CqStatus::RetryExcErr));
    assert!(st[1..].iter().all(|&(_, s)| s == CqStatus::WrFlushErr));
    assert_eq!(
        sim.ep[0].stream_errors,
        vec![(sim.ep[0].stream, CqStatus::RetryExcErr)]
    );
    eprintln!(
        "retry exceeded after {} us; paths {:?}",
        (sim.now - t0) / 1000,
        (0..PATHS)
            .map(|p| sim.ep[0].conn.path_state(p).unwrap())
            .collect::<Vec<_>>()
    );
    // Posting to the errored stream flushes at once.
    post(&mut sim, SendWqe::new(99, WrOpcode::Send, sge(1, A_BUF, 1)));
    sim.pump();
    assert_eq!(
        sim.ep[0].send_cqes.last().map(|c| (c.wr_id, c.status)),
        Some((99, CqStatus::WrFlushErr))
    );
}

#[test]
fn psn_and_msn_wrap() {
    // PSNs, MSNs and RSNs all cross 2^32 during the run, with loss.
    let mut sim = Sim::with_config(LinkConfig::clean().loss(300), 9, |c| {
        c.path.initial_psn = u32::MAX - 40
    });
    sim.set_initial_msn(u32::MAX - 30);
    let r = run_workload(&mut sim, &mixed(120), 2_000_000_000);
    assert!(r.completed);
}

#[test]
fn one_dead_path_is_routed_around() {
    // Path 3 drops everything in both directions: its packets time out, it changes entropy,
    // turns Suspect/Failed and traffic continues on the others.
    let mut link = LinkConfig::clean();
    link.path_delay_ns[3] = 1_000_000_000_000; // never arrives within the test
    let mut sim = Sim::new(link, 10);
    let r = run_workload(&mut sim, &bulk(100, 8192), 2_000_000_000);
    assert!(r.completed);
    let st = sim.ep[0].conn.path_state(3).unwrap();
    assert_ne!(st, metaroce_transport::connection::path::PathState::Active);
    assert!(sim.ep[0].conn.path_stats(3).unwrap().entropy_changes >= 1);
}

#[test]
fn zeroed_connection_is_inert_until_reset_and_sizes() {
    let mut c = zeroed_conn();
    let mut mem = SimMemory::default();
    let mut buf = [0u8; 2048];
    // All-zero: no paths, no streams, nothing to do, nothing panics.
    assert_eq!(c.poll_timeout(), None);
    assert!(c.poll_transmit(0, &mut buf, &mut mem).is_none());
    assert!(c.poll_event().is_none());
    c.handle_timeout(1_000_000);
    let _ = c.handle_packet(0, &[1, 0, 0, 0], Arrival::default(), &mut mem);
    eprintln!(
        "size_of Connection<{PATHS}, SimSlots> = {} bytes; Path = {}; Stream = {}",
        std::mem::size_of::<Conn>(),
        std::mem::size_of::<metaroce_transport::connection::path::Path>(),
        std::mem::size_of::<metaroce_transport::stream::Stream>()
    );
}

#[test]
fn streams_are_isolated() {
    // Stream 2 hits a bad rkey and goes to error; stream 1 keeps running to completion over
    // the same connection, with loss.
    let mut sim = Sim::new(LinkConfig::clean().loss(200), 12);
    let (a2, b2) = sim.open_pair(0x33, 0x44);
    let now = sim.now;
    sim.ep[0]
        .conn
        .post_send(
            now,
            a2,
            SendWqe::new(500, WrOpcode::RdmaWrite, sge(1, A_BUF, 100)).remote(B_BUF, 77),
        )
        .unwrap();
    sim.ep[0]
        .conn
        .post_send(
            now,
            a2,
            SendWqe::new(501, WrOpcode::Send, sge(1, A_BUF, 100)),
        )
        .unwrap();
    sim.ep[1]
        .conn
        .post_recv(
            b2,
            RecvWqe {
                wr_id: 600,
                local: sge(2, B_BUF + (4 << 20) + 512, 100),
            },
        )
        .unwrap();
    let r = run_workload(&mut sim, &mixed(80), 2_000_000_000);
    assert!(r.completed);
    sim.run_until(sim.now + 50_000_000, |s| {
        s.ep[0].send_cqes.len() >= 82 && s.ep[1].recv_cqes.len() >= 41
    });
    let other: Vec<_> = sim.ep[0]
        .send_cqes
        .iter()
        .filter(|c| c.stream == a2)
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        other,
        vec![(500, CqStatus::RemAccessErr), (501, CqStatus::WrFlushErr)]
    );
    assert!(sim.ep[0].conn.stream_error(a2).is_some());
    assert!(sim.ep[0].conn.stream_error(sim.ep[0].stream).is_none());
    // B's second stream went to error and flushed its receive.
    let flushed: Vec<_> = sim.ep[1]
        .recv_cqes
        .iter()
        .filter(|c| c.stream == b2)
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(flushed, vec![(600, CqStatus::WrFlushErr)]);
}

#[test]
fn ecn_marks_are_echoed_and_shrink_windows() {
    let mut link = LinkConfig::clean();
    link.ce_ppm = 50_000;
    let mut sim = Sim::new(link, 13);
    let r = run_workload(&mut sim, &bulk(100, 8192), 2_000_000_000);
    assert!(r.completed);
    let echoed: u64 = (0..PATHS)
        .map(|p| sim.ep[0].conn.path_stats(p).unwrap().ecn_ce)
        .sum();
    assert!(echoed > 0, "CE marks echoed back to the sender");
    assert_eq!(r.retransmits, 0, "ECN alone loses nothing");
}

#[test]
fn two_hundred_fifty_six_paths() {
    use metaroce_transport::connection::Connection;
    use metaroce_transport::stream::StreamConfig;
    type Big = Connection<
        metaroce_transport::connection::Paths<256>,
        [metaroce_transport::stream::Stream; 1],
    >;
    let mk = |l: u32, r: u32| -> Box<Big> {
        let mut c = zeroed_box::<Big>();
        let mut cfg = sim::config(l, r, u64::from(l));
        cfg.num_paths = 256;
        cfg.planes = 4;
        c.reset(cfg).unwrap();
        c
    };
    let mut ep = [mk(1, 2), mk(2, 1)];
    let sa = ep[0].open_stream(StreamConfig::new(1, 2)).unwrap();
    ep[1].open_stream(StreamConfig::new(2, 1)).unwrap();
    let mut mem = [SimMemory::default(), SimMemory::default()];
    mem[0].add(1, A_BUF, 1 << 20);
    mem[1].add(2, B_BUF, 1 << 20);
    let data = pattern(77, 1 << 20);
    mem[0].fill(1, A_BUF, &data);
    let mut rng = Rng::new(5);
    let mut queue: Vec<(u64, usize, Vec<u8>)> = Vec::new();
    let (mut now, mut posted, mut completed) = (0u64, 0u64, 0u64);
    let total = 256u64; // 256 WRITEs of 4 KiB
    let mut buf = vec![0u8; 2048];
    while completed < total && now < 1_000_000_000 {
        while posted < total {
            let off = posted * 4096;
            let w = SendWqe::new(posted, WrOpcode::RdmaWrite, sge(1, A_BUF + off, 4096))
                .remote(B_BUF + off, 2);
            if ep[0].post_send(now, sa, w).is_err() {
                break;
            }
            posted += 1;
        }
        for i in 0..2 {
            while let Some(t) = ep[i].poll_transmit(now, &mut buf, &mut mem[i]) {
                if !rng.chance(10_000) {
                    queue.push((
                        now + 10_000 + u64::from(t.path % 7) * 1_000,
                        1 - i,
                        buf[..t.len].to_vec(),
                    ));
                }
            }
            while let Some(e) = ep[i].poll_event() {
                if let metaroce_transport::connection::Event::SendCompletion(c) = e {
                    assert_eq!((c.wr_id, c.status), (completed, CqStatus::Success));
                    completed += 1;
                }
            }
        }
        let next_pkt = queue.iter().map(|q| q.0).min();
        let next_timer = ep.iter().filter_map(|c| c.poll_timeout()).min();
        let Some(t) = [next_pkt, next_timer].into_iter().flatten().min() else {
            break;
        };
        now = now.max(t);
        let (due, rest): (Vec<_>, Vec<_>) = queue.into_iter().partition(|q| q.0 <= now);
        queue = rest;
        for (_, to, bytes) in due {
            let _ = ep[to].handle_packet(now, &bytes, Arrival::default(), &mut mem[to]);
        }
        for c in ep.iter_mut() {
            if c.poll_timeout().is_some_and(|d| d <= now) {
                c.handle_timeout(now);
            }
        }
    }
    assert_eq!(completed, total);
    assert_eq!(mem[1].bytes(2, B_BUF, 1 << 20), &data[..]);
    let used = (0..256)
        .filter(|&p| ep[0].path_stats(p).unwrap().sent > 0)
        .count();
    assert_eq!(used, 256, "every path carried data");
}

#[test]
fn lost_naks_are_recovered_by_the_completion_timeout() {
    // Every NAK is lost: the RNR never reaches the requester. Its completion timeout resends
    // the message, which lands once a receive is posted.
    let mut sim = Sim::new(LinkConfig::clean(), 14);
    sim.drop_if = Some(Box::new(|_, b| {
        b.get(1) == Some(&(metaroce_transport::wire::Opcode::Nak as u8))
    }));
    let data = pattern(14, 3000);
    sim.ep[0].mem.fill(1, A_BUF, &data);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::Send, sge(1, A_BUF, 3000)),
    );
    sim.run_until(sim.now + 1_000_000, |_| false);
    recv(&mut sim, 5, B_BUF, 4096);
    assert!(sim.run_until(sim.now + 50_000_000, |s| s.ep[0].send_cqes.len() == 1));
    assert_eq!(sim.ep[0].send_cqes[0].status, CqStatus::Success);
    assert_eq!(sim.ep[1].mem.bytes(2, B_BUF, 3000), &data[..]);
    assert!(
        sim.ep[0]
            .conn
            .stream_stats(sim.ep[0].stream)
            .unwrap()
            .0
            .pokes
            >= 1
    );
}

#[test]
fn sending_to_a_closed_qp_fails_fast() {
    let mut sim = Sim::new(LinkConfig::clean(), 15);
    let sb = sim.ep[1].stream;
    sim.ep[1].conn.close_stream(sb);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 5000)).remote(B_BUF, 2),
    );
    post(
        &mut sim,
        SendWqe::new(2, WrOpcode::RdmaWrite, sge(1, A_BUF, 5000)).remote(B_BUF, 2),
    );
    assert!(sim.run_until(sim.now + 1_000_000, |s| s.ep[0].send_cqes.len() == 2));
    let st: Vec<_> = sim.ep[0].send_cqes.iter().map(|c| c.status).collect();
    assert_eq!(st, vec![CqStatus::RemOpErr, CqStatus::WrFlushErr]);
    assert_eq!(sim.retransmits(), 0, "acknowledged on the path, not resent");
}

#[test]
fn config_is_validated() {
    use metaroce_transport::connection::{Config, ConfigError, Connection};
    type C = Connection<
        metaroce_transport::connection::Paths<32>,
        [metaroce_transport::stream::Stream; 1],
    >;
    // Built in place on the heap, as the kernel builds connections (`Connection::reset`
    // checks a configuration as `Connection::new` does): one is larger than a test thread's
    // stack in unoptimised code.
    let mut conn = zeroed_box::<C>();
    let mut new = |c: Config| conn.reset(c);
    let ok = Config::new(1, 2);
    assert!(new(ok).is_ok());
    let mut c = ok;
    c.num_paths = 33;
    assert_eq!(new(c).err(), Some(ConfigError::PathCount));
    c.num_paths = 0;
    assert_eq!(new(c).err(), Some(ConfigError::PathCount));
    let mut c = ok;
    c.mtu = 0;
    assert_eq!(new(c).err(), Some(ConfigError::Mtu));
    let mut c = ok;
    c.path.min_rto = 0;
    assert_eq!(new(c).err(), Some(ConfigError::Timers));
    let mut c = ok;
    c.stall_timeout = 0;
    assert_eq!(new(c).err(), Some(ConfigError::Timers));
    // Streams: duplicate QP numbers and a full table are refused.
    conn.reset(ok).unwrap();
    let s = conn
        .open_stream(metaroce_transport::stream::StreamConfig::new(5, 6))
        .unwrap();
    assert_eq!(
        conn.open_stream(metaroce_transport::stream::StreamConfig::new(5, 7))
            .err(),
        Some(ConfigError::DuplicateQp)
    );
    assert_eq!(
        conn.open_stream(metaroce_transport::stream::StreamConfig::new(8, 7))
            .err(),
        Some(ConfigError::NoStreamSlot)
    );
    conn.close_stream(s);
    assert!(conn
        .open_stream(metaroce_transport::stream::StreamConfig::new(8, 7))
        .is_ok());
}

#[test]
fn caller_can_move_a_stream_to_error_and_flush() {
    let mut sim = Sim::new(LinkConfig::clean(), 16);
    let (sa, sb) = (sim.ep[0].stream, sim.ep[1].stream);
    recv(&mut sim, 1, B_BUF, 100);
    recv(&mut sim, 2, B_BUF, 100);
    post(&mut sim, SendWqe::new(7, WrOpcode::Send, sge(1, A_BUF, 10)));
    assert!(sim.run_until(sim.now + 10_000_000, |s| s.ep[1].recv_cqes.len() == 1));
    sim.ep[1].conn.fail_stream(sb).unwrap();
    sim.pump();
    let r: Vec<_> = sim.ep[1]
        .recv_cqes
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(r, vec![(1, CqStatus::Success), (2, CqStatus::WrFlushErr)]);
    assert!(
        sim.ep[1].stream_errors.is_empty(),
        "no event for a requested transition"
    );
    // The peer's next message is refused.
    post(&mut sim, SendWqe::new(8, WrOpcode::Send, sge(1, A_BUF, 10)));
    assert!(sim.run_until(sim.now + 10_000_000, |s| s.ep[0].send_cqes.len() == 2));
    assert_eq!(sim.ep[0].send_cqes[1].status, CqStatus::RemOpErr);
    assert!(sim.ep[0].conn.stream_error(sa).is_some());
}

/// Packets endpoint 0 sent on the paths of `plane` (path `i` is on plane `i % planes`).
fn sent_on_plane(sim: &Sim, plane: usize, planes: usize) -> u64 {
    (0..sim.ep[0].conn.path_count())
        .filter(|&i| i % planes == plane)
        .map(|i| sim.ep[0].conn.path_stats(i).unwrap().sent)
        .sum()
}

#[test]
fn a_plane_that_is_down_carries_nothing_until_it_is_up() {
    let plane_of = |i: usize| i % 2;
    let sent_on = |sim: &Sim, plane: usize| sent_on_plane(sim, plane, 2);
    for plane1_up in [false, true] {
        let mut sim = Sim::new(LinkConfig::clean(), 11);
        for ep in sim.ep.iter_mut() {
            // A second plane joins (both sides agree on the mapping, as after a HELLO).
            ep.conn.set_planes(2);
            assert_eq!(ep.conn.config().planes, 2);
            ep.conn.set_plane_up(1, false);
            assert!(!ep.conn.plane_up(1) && ep.conn.plane_up(0));
            // Down, then up again before any traffic: as after a HELLO.
            ep.conn.set_plane_up(1, plane1_up);
        }
        let r = run_workload(&mut sim, &bulk(40, 8192), 2_000_000_000);
        assert!(r.completed, "{r:?}");
        assert!(sent_on(&sim, 0) > 0);
        if plane1_up {
            assert!(sent_on(&sim, 1) > 0, "plane 1 unused while up");
        } else {
            for ep in sim.ep.iter() {
                for i in (0..ep.conn.path_count()).filter(|&i| plane_of(i) == 1) {
                    assert_eq!(ep.conn.path_stats(i).unwrap().sent, 0, "path {i} sent");
                }
            }
        }
    }
}

#[test]
fn qps_sharing_a_receive_queue_take_wqes_as_messages_arrive() {
    use metaroce_transport::stream::StreamConfig;
    let mut sim = Sim::new(LinkConfig::clean().reorder(20, 20_000), 21);
    // Two more QP pairs; on endpoint 1 both take receives from the shared queue.
    let mut pairs = std::vec::Vec::new();
    for (qa, qb) in [(0x31, 0x41), (0x32, 0x42)] {
        let a = sim.ep[0]
            .conn
            .open_stream(StreamConfig::new(qa, qb))
            .unwrap();
        let mut cb = StreamConfig::new(qb, qa);
        cb.srq = true;
        let b = sim.ep[1].conn.open_stream(cb).unwrap();
        pairs.push((a, b));
    }
    let (n, len) = (12u64, 3000u32);
    for i in 0..2 * n {
        let w = RecvWqe {
            wr_id: 1000 + i,
            local: sge(2, B_BUF + i * 4096, 4096),
        };
        sim.ep[1].mem.srq.push_back(w);
    }
    let mut want = std::vec::Vec::new();
    for (k, (a, _)) in pairs.iter().enumerate() {
        for i in 0..n {
            let tag = (k as u64 * n + i) as u8 + 1;
            let at = A_BUF + (k as u64 * n + i) * 4096;
            sim.ep[0].mem.fill(1, at, &std::vec![tag; len as usize]);
            want.push(tag);
            sim.ep[0]
                .conn
                .post_send(0, *a, SendWqe::new(i, WrOpcode::Send, sge(1, at, len)))
                .unwrap();
        }
    }
    let total = 2 * n as usize;
    assert!(sim.run_until(1_000_000_000, |s| s.ep[1].recv_cqes.len() >= total));
    let mut got = std::vec::Vec::new();
    for c in &sim.ep[1].recv_cqes {
        assert_eq!(c.status, CqStatus::Success, "{c:?}");
        assert_eq!(c.byte_len, len);
        let buf = sim.ep[1]
            .mem
            .bytes(2, B_BUF + (c.wr_id - 1000) * 4096, len as usize);
        assert!(
            buf.iter().all(|&b| b == buf[0]),
            "a receive buffer holds one message"
        );
        got.push(buf[0]);
    }
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "every message landed once");
    assert_eq!(sim.ep[1].mem.srq_taken, total as u64);
    let rnr = sim.ep[1].conn.stats().naks_out_by_code[3];
    assert_eq!(rnr, 0, "no RNR while the shared queue had WQEs");
}

/// Protection domains and the QP's own access rights are checked on every access (IBA
/// 10.2.3, 10.6.3): a region of another PD is no key for the QP, on either side, and a QP
/// that grants no remote access refuses every RDMA request.
#[test]
fn other_pd_key_and_qp_without_remote_rights_are_refused() {
    // The responder's region is in PD 7, its QP (0x22) in PD 0: the WRITE is refused.
    let mut sim = Sim::new(LinkConfig::clean(), 21);
    sim.ep[1].mem.regions.get_mut(&2).unwrap().pd = 7;
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 100)).remote(B_BUF, 2),
    );
    assert!(sim.run_until(50_000_000, |s| !s.ep[0].send_cqes.is_empty()));
    assert_eq!(sim.ep[0].send_cqes[0].status, CqStatus::RemAccessErr);
    assert!(sim.ep[1].mem.bytes(2, B_BUF, 100).iter().all(|b| *b == 0));

    // Same PD again, but the responder's QP grants no remote rights: READ and atomic refused.
    for (seed, op) in [(22, WrOpcode::RdmaRead), (23, WrOpcode::FetchAdd)] {
        let mut sim = Sim::new(LinkConfig::clean(), seed);
        sim.ep[1].mem.qp_no_remote.insert(0x22);
        let len = if op == WrOpcode::FetchAdd { 8 } else { 64 };
        let mut w = SendWqe::new(1, op, sge(1, A_BUF, len)).remote(B_BUF, 2);
        if op == WrOpcode::FetchAdd {
            w = w.atomic(1, 0);
        }
        post(&mut sim, w);
        assert!(sim.run_until(50_000_000, |s| !s.ep[0].send_cqes.is_empty()));
        assert_eq!(
            sim.ep[0].send_cqes[0].status,
            CqStatus::RemAccessErr,
            "{op:?}"
        );
    }

    // The requester's local buffer is in another PD than its QP (0x11): a local protection
    // error, nothing sent.
    let mut sim = Sim::new(LinkConfig::clean(), 24);
    sim.ep[0].mem.qp_pd.insert(0x11, 3);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 100)).remote(B_BUF, 2),
    );
    assert!(sim.run_until(50_000_000, |s| !s.ep[0].send_cqes.is_empty()));
    assert_eq!(sim.ep[0].send_cqes[0].status, CqStatus::LocProtErr);
}

#[test]
fn a_stream_restricted_to_a_plane_sends_only_there_while_it_can() {
    let sent_on = |sim: &Sim, plane: usize| sent_on_plane(sim, plane, 2);
    for plane1_up in [true, false] {
        let mut sim = Sim::new(LinkConfig::clean(), 12);
        for ep in sim.ep.iter_mut() {
            ep.conn.set_planes(2);
            ep.conn.set_plane_up(1, plane1_up);
        }
        let s = sim.ep[0].stream;
        sim.ep[0].conn.set_stream_planes(s, 0b10).unwrap();
        let r = run_workload(&mut sim, &bulk(40, 8192), 2_000_000_000);
        assert!(r.completed, "{r:?}");
        if plane1_up {
            // Every data packet of the stream on plane 1; plane 0 carries nothing of ours.
            assert!(sent_on(&sim, 1) > 80, "plane 1 sent {}", sent_on(&sim, 1));
            assert_eq!(sent_on(&sim, 0), 0);
        } else {
            // Its plane is down: the restriction is set aside, the stream is not failed.
            assert!(sent_on(&sim, 0) > 80);
            assert_eq!(sent_on(&sim, 1), 0);
        }
        assert!(sim.ep[0].stream_errors.is_empty());
    }
    // A closed or unknown stream is refused.
    let mut sim = Sim::new(LinkConfig::clean(), 13);
    let s = sim.ep[0].stream;
    sim.ep[0].conn.close_stream(s);
    assert!(sim.ep[0].conn.set_stream_planes(s, 1).is_err());
}

#[test]
fn a_connection_sends_only_on_the_paths_its_peer_has() {
    let mut sim = Sim::new(LinkConfig::clean(), 14);
    let total = sim.ep[0].conn.path_count();
    assert!(total > 4);
    for ep in sim.ep.iter_mut() {
        assert_eq!(ep.conn.send_paths(), total);
        ep.conn.set_send_paths(4);
        assert_eq!(ep.conn.send_paths(), 4);
    }
    let r = run_workload(&mut sim, &bulk(40, 8192), 2_000_000_000);
    assert!(r.completed, "{r:?}");
    for ep in sim.ep.iter() {
        for i in 0..total {
            let st = ep.conn.path_stats(i).unwrap();
            if i < 4 {
                // Data one way, ACKs (not counted as sent) the other.
                assert!(st.sent + st.received > 0, "path {i} unused");
            } else {
                assert_eq!((st.sent, st.received), (0, 0), "path {i} used");
            }
        }
    }
    // Clamped to the paths there are, and to at least one.
    sim.ep[0].conn.set_send_paths(0);
    assert_eq!(sim.ep[0].conn.send_paths(), 1);
    sim.ep[0].conn.set_send_paths(10_000);
    assert_eq!(sim.ep[0].conn.send_paths(), total);
}

#[test]
fn a_path_burst_sends_runs_on_one_path_with_the_same_shares() {
    // What goes out before any ACK: runs of `path_burst` packets per path.
    let mut sim = Sim::with_config(LinkConfig::clean(), 15, |c| c.path_burst = 4);
    let s = sim.ep[0].stream;
    let wqe = SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 64 * 1024)).remote(B_BUF, 2);
    sim.ep[0].conn.post_send(0, s, wqe).unwrap();
    let mut buf = std::vec![0u8; 8192];
    let mut paths = std::vec::Vec::new();
    let ep = &mut sim.ep[0];
    while let Some(t) = ep.conn.poll_transmit(0, &mut buf, &mut ep.mem) {
        paths.push(t.path);
    }
    assert!(paths.len() >= 8, "{paths:?}");
    for run in paths.chunks(4).take(paths.len() / 4) {
        assert!(
            run.iter().all(|&p| p == run[0]),
            "runs of 4 on one path: {paths:?}"
        );
    }
    // A whole transfer: every path carries about its share, as with single-packet spraying.
    let mut sim = Sim::with_config(LinkConfig::clean(), 16, |c| c.path_burst = 4);
    let r = run_workload(&mut sim, &bulk(40, 65536), 2_000_000_000);
    assert!(r.completed, "{r:?}");
    let sent: std::vec::Vec<u64> = (0..sim.ep[0].conn.path_count())
        .map(|i| sim.ep[0].conn.path_stats(i).unwrap().sent)
        .collect();
    let mean = sent.iter().sum::<u64>() / sent.len() as u64;
    assert!(
        sent.iter()
            .all(|&n| n * 10 >= mean * 7 && n * 10 <= mean * 13),
        "shares within 30% of the mean: {sent:?}"
    );
}

#[test]
fn streams_take_turns_of_a_quantum_of_packets() {
    use metaroce_transport::stream::StreamConfig;
    use metaroce_transport::wire::Packet;
    // 32 more streams, each with two 4-packet writes (4 KiB MTU): with a quantum of 16
    // packets each stream sends both messages in its turn; with 1, packets alternate.
    for (quantum, want_run) in [(16u16, 8usize), (1, 1)] {
        let mut sim = Sim::with_config(LinkConfig::clean(), 17, |c| c.stream_quantum = quantum);
        let mut qps = std::vec::Vec::new();
        for k in 0..32u32 {
            let (qa, qb) = (0x100 + k, 0x200 + k);
            let a = sim.ep[0]
                .conn
                .open_stream(StreamConfig::new(qa, qb))
                .unwrap();
            sim.ep[1]
                .conn
                .open_stream(StreamConfig::new(qb, qa))
                .unwrap();
            for m in 0..2u64 {
                let at = u64::from(k) * 32768 + m * 16384;
                let w = SendWqe::new(m, WrOpcode::RdmaWrite, sge(1, A_BUF + at, 16384))
                    .remote(B_BUF + at, 2);
                sim.ep[0].conn.post_send(0, a, w).unwrap();
            }
            qps.push(qb);
        }
        // Everything the windows let out before any ACK, by destination QP.
        let mut order = std::vec::Vec::new();
        let mut buf = std::vec![0u8; 8192];
        let ep = &mut sim.ep[0];
        for _ in 0..64 {
            let Some(t) = ep.conn.poll_transmit(0, &mut buf, &mut ep.mem) else {
                break;
            };
            order.push(Packet::peek_dst_qp(&buf[..t.len]).unwrap());
        }
        assert!(order.len() >= 16, "{order:?}");
        let runs: std::vec::Vec<usize> = order.chunk_by(|a, b| a == b).map(|r| r.len()).collect();
        // The last run may be cut by the window.
        let whole = &runs[..runs.len() - 1];
        assert!(
            whole.iter().all(|&n| n == want_run),
            "quantum {quantum}: runs {runs:?}"
        );
    }
}

/// A WRITE (valid header, open QP, valid rkey and address, the next MSN) whose PSN is 2^20
/// beyond path 0's window, as an off-path attacker would spoof one: dropped unseen and
/// counted. Before the receive window was bounded it slid path 0's window to just below
/// it (the real packets "below window") and placed its data.
#[test]
fn a_forged_packet_far_beyond_the_window_is_dropped_and_counted() {
    use metaroce_transport::connection::sack::RECV_WINDOW;
    use metaroce_transport::connection::RecvError;
    use metaroce_transport::wire::{BaseHeader, Ext, Flags, Header, Opcode, WriteExt};
    let mut sim = Sim::new(LinkConfig::clean(), 21);
    // Real traffic first, so path 0 has history.
    let data = pattern(21, 20_000);
    sim.ep[0].mem.fill(1, A_BUF, &data);
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 20_000)).remote(B_BUF, 2),
    );
    assert!(sim.run_until(sim.now + 10_000_000, |s| s.ep[0].send_cqes.len() == 1));
    let b = &sim.ep[1].conn;
    let (window, last_rx) = (b.path(0).unwrap().recv, b.path(0).unwrap().last_rx);
    let path_stats = *b.path_stats(0).unwrap();
    let cum = window.cum();
    assert_ne!(cum, 0, "path 0 carried the first WRITE");
    let forge = |psn: u32, opcode: Opcode, ext: Ext, payload: &[u8]| {
        let header = Header {
            base: BaseHeader {
                opcode,
                flags: Flags(Flags::FIRST | Flags::LAST | Flags::ACK_REQ),
                dst_qp: 0x22,
                src_qp: 0x11,
                conn_id: 200,
                path_id: 0,
                plane: 0,
                psn,
                msn: 1,
                timestamp: 0,
            },
            ext,
        };
        let mut buf = vec![0u8; header.len()];
        header.emit(&mut buf).unwrap();
        buf.extend_from_slice(payload);
        buf
    };
    let evil = [0xee; 64];
    let write = Ext::Write(WriteExt {
        va: B_BUF + 50_000,
        rkey: 2,
        rsn: 0,
        offset: 0,
        total_len: 64,
        payload_len: 64,
        imm: None,
    });
    let packets = [
        forge(cum.wrapping_add(1 << 20), Opcode::RdmaWrite, write, &evil),
        forge(
            cum.wrapping_add(RECV_WINDOW + 1),
            Opcode::RdmaWrite,
            write,
            &evil,
        ),
        forge(cum.wrapping_add(1 << 20), Opcode::Probe, Ext::Probe, &[]),
    ];
    let (now, out_before) = (sim.now, sim.ep[1].conn.stats().packets_out);
    for p in &packets {
        let ep = &mut sim.ep[1];
        assert_eq!(
            ep.conn
                .handle_packet(now, p, Arrival::default(), &mut ep.mem),
            Err(RecvError::OutOfWindow)
        );
    }
    let ep = &mut sim.ep[1];
    assert_eq!(ep.conn.stats().out_of_window_psn, 3);
    let p = ep.conn.path(0).unwrap();
    assert_eq!(p.stats.out_of_window, 3);
    assert_eq!((p.recv, p.last_rx), (window, last_rx), "window unchanged");
    let mut others = p.stats;
    others.out_of_window = path_stats.out_of_window;
    assert_eq!(others, path_stats, "no other path counter moved");
    assert!(
        ep.conn
            .poll_transmit(now, &mut [0u8; 2048], &mut ep.mem)
            .is_none(),
        "no ACK"
    );
    assert_eq!(ep.conn.stats().packets_out, out_before);
    assert_eq!(
        ep.mem.bytes(2, B_BUF + 50_000, 64),
        &[0u8; 64][..],
        "not placed"
    );
    // The real message 1 to the same place completes normally, byte-exact.
    post(
        &mut sim,
        SendWqe::new(2, WrOpcode::RdmaWrite, sge(1, A_BUF, 8_000)).remote(B_BUF + 50_000, 2),
    );
    assert!(sim.run_until(sim.now + 10_000_000, |s| s.ep[0].send_cqes.len() == 2));
    assert!(sim.ep[0]
        .send_cqes
        .iter()
        .all(|c| c.status == CqStatus::Success));
    assert_eq!(
        sim.ep[1].mem.bytes(2, B_BUF + 50_000, 8_000),
        &data[..8_000]
    );
    assert_eq!(sim.retransmits(), 0);
    // Path 0 at B received exactly what A sent on it.
    assert_eq!(
        sim.ep[1].conn.path(0).unwrap().recv.cum(),
        sim.ep[0].conn.path(0).unwrap().inflight.next_psn()
    );
    assert_eq!(sim.ep[1].conn.stats().out_of_window_psn, 3);
}

/// A message's last packet (ACK_REQ) overtakes one of its others, as on another path or
/// plane: the ACK it gets at once cannot report the message complete, and the packet that
/// completes it is answered at once too, not after `ack_delay` (which held the requester's
/// completion, and a collective's next step, that long).
#[test]
fn a_message_completed_after_its_ack_req_is_acknowledged_at_once() {
    use metaroce_transport::wire::{Flags, Opcode, Packet};
    let mut sim = Sim::new(LinkConfig::clean(), 22);
    let delay = sim.ep[1].conn.config().path.ack_delay;
    assert!(delay > 0);
    // Three packets of 1 KiB (the simulator's MTU), taken from A without the fabric.
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 3 * 1024)).remote(B_BUF, 2),
    );
    let now = sim.now;
    let mut buf = std::vec![0u8; 8192];
    let mut packets = std::vec::Vec::new();
    let ep = &mut sim.ep[0];
    while let Some(t) = ep.conn.poll_transmit(now, &mut buf, &mut ep.mem) {
        packets.push((buf[..t.len].to_vec(), t.src_port));
    }
    assert_eq!(packets.len(), 3);
    let flags = |p: &[u8]| Packet::parse(p).unwrap().header.base.flags;
    assert!(!flags(&packets[1].0).has(Flags::ACK_REQ));
    assert!(flags(&packets[2].0).has(Flags::ACK_REQ));
    // B: what it sends at `now`, and the completion point of the ACK among it.
    let deliver = |sim: &mut Sim, k: usize| {
        let ep = &mut sim.ep[1];
        let (p, port) = &packets[k];
        let arrival = Arrival {
            ecn_ce: false,
            rx_busy: false,
            src_port: *port,
        };
        ep.conn.handle_packet(now, p, arrival, &mut ep.mem).unwrap();
    };
    let acked_msn = |sim: &mut Sim| -> Option<u32> {
        let ep = &mut sim.ep[1];
        let mut buf = std::vec![0u8; 8192];
        let mut msn = None;
        while let Some(t) = ep.conn.poll_transmit(now, &mut buf, &mut ep.mem) {
            let v = Packet::parse(&buf[..t.len]).unwrap();
            if v.header.base.opcode == Opcode::Ack {
                msn = v.ack_streams().map(|s| s.completed_msn).last().or(msn);
            }
        }
        msn
    };
    deliver(&mut sim, 0);
    assert_eq!(acked_msn(&mut sim), None, "a first packet waits for more");
    deliver(&mut sim, 2);
    assert_eq!(
        acked_msn(&mut sim),
        Some(0),
        "ACK_REQ answered: not complete yet"
    );
    deliver(&mut sim, 1);
    assert_eq!(
        acked_msn(&mut sim),
        Some(1),
        "the packet that completes the message is answered at once, not {delay} ns later"
    );
    // No second ACK for the same news when the delay would have run out.
    assert_eq!(
        sim.ep[1].conn.poll_timeout().map(|t| t > now + delay),
        Some(true)
    );
}

/// A fresh connection's two-packet message whose last packet is lost: that packet's path has
/// no RTT sample, but the first packet's path has one, and the lost packet's path is the
/// only one with anything unanswered, so it probes by that RTT and the message completes in
/// a few round trips, not after the initial RTO.
#[test]
fn a_fresh_paths_lost_last_packet_is_probed_by_the_other_paths_rtt() {
    use std::cell::Cell;
    let mut sim = Sim::new(LinkConfig::clean(), 23);
    let rto = sim.ep[0].conn.config().path.initial_rto;
    let sent = Cell::new(0u32);
    sim.drop_if = Some(Box::new(move |from, _| {
        if from != 0 {
            return false;
        }
        sent.set(sent.get() + 1);
        sent.get() == 2
    }));
    post(
        &mut sim,
        SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, A_BUF, 2 * 1024)).remote(B_BUF, 2),
    );
    let start = sim.now;
    assert!(sim.run_until(start + 10 * rto, |s| s.ep[0].send_cqes.len() == 1));
    assert_eq!(sim.ep[0].send_cqes[0].status, CqStatus::Success);
    let took = sim.now - start;
    assert!(took < rto / 2, "{took} ns, initial RTO {rto} ns");
    assert_eq!(sim.retransmits(), 1);
}

#[test]
fn a_new_connection_puts_its_initial_window_on_each_plane() {
    // Data packets A sends at one instant before any ACK, per plane, on `planes` planes of
    // which those in `down` cannot carry packets.
    let first_window = |planes: u8, down: &[u8]| -> Vec<u64> {
        let mut sim = Sim::with_config(LinkConfig::clean(), 23, |c| c.planes = planes);
        for &k in down {
            sim.ep[0].conn.set_plane_up(k, false);
        }
        let iw = sim.ep[0].conn.config().cc.initial_window;
        assert_eq!(iw, 16);
        // 256 packets of 1 KiB (the simulator's MTU): more than any first window here.
        for i in 0..16 {
            post(
                &mut sim,
                SendWqe::new(i, WrOpcode::RdmaWrite, sge(1, A_BUF + i * 16_384, 16_384))
                    .remote(B_BUF + i * 16_384, 2),
            );
        }
        let now = sim.now;
        let mut buf = std::vec![0u8; 8192];
        let ep = &mut sim.ep[0];
        while ep.conn.poll_transmit(now, &mut buf, &mut ep.mem).is_some() {}
        (0..usize::from(planes))
            .map(|k| sent_on_plane(&sim, k, usize::from(planes)))
            .collect()
    };
    assert_eq!(first_window(1, &[]), [16]);
    assert_eq!(first_window(4, &[]), [16, 16, 16, 16]);
    assert_eq!(first_window(4, &[1, 3]), [16, 0, 16, 0]);
}
