// SPDX-License-Identifier: GPL-2.0
//! What a stream's retry_cnt counts on a unified connection: the peer's silence, not its
//! paths' slowness. A message whose packets the paths are still recovering, on a connection
//! that delivers (other streams' packets are acknowledged), counts one retry every few
//! completion timeouts only; a peer that takes nothing still fails it.

mod sim;

use metaroce_transport::stream::{CqStatus, SendWqe, StreamId, WrOpcode};
use sim::*;
use std::{cell::Cell, rc::Rc};

/// sim::config's stall_timeout: the streams' completion timeout.
const STALL: u64 = 2_000_000;

/// 1 Gbit/s links; a second stream pair (QPs 0x33/0x44, returned) beside the default one
/// (0x11/0x22), whose one RDMA WRITE is posted. Data packets to QP 0x22 are dropped while
/// the returned flag is set, which it is.
fn setup(seed: u64) -> (Sim, Rc<Cell<bool>>, StreamId) {
    let mut link = LinkConfig::clean();
    link.rate_bits_per_us = 1_000;
    let mut sim = Sim::new(link, seed);
    let (b_pair, _) = sim.open_pair(0x33, 0x44);
    let drop_a = Rc::new(Cell::new(true));
    let d = drop_a.clone();
    sim.drop_if = Some(Box::new(move |from, bytes| {
        from == 0 && d.get() && bytes.get(4..8) == Some(&0x22u32.to_be_bytes()[..])
    }));
    let (now, a) = (sim.now, sim.ep[0].stream);
    sim.ep[0].conn.post_send(now, a, write(1, 0)).expect("post");
    (sim, drop_a, b_pair)
}

fn write(wr_id: u64, slot: u64) -> SendWqe {
    SendWqe::new(
        wr_id,
        WrOpcode::RdmaWrite,
        sge(1, 0x100000 + slot * SLOT, 16 << 10),
    )
    .remote(0x200000 + slot * SLOT, 2)
}

/// Runs until `until` (or A's message completes), keeping the other pair's queue full, so
/// that the connection delivers all along; returns A's completion status, if any.
fn run_with_other_traffic(
    sim: &mut Sim,
    b_pair: StreamId,
    next: &mut u64,
    until: u64,
    drop_a: &Rc<Cell<bool>>,
    undrop_at: u64,
) -> Option<CqStatus> {
    let a = sim.ep[0].stream;
    loop {
        while sim.ep[0]
            .conn
            .post_send(sim.now, b_pair, write(100 + *next, 16 + *next % 16))
            .is_ok()
        {
            *next += 1;
        }
        if sim.now >= undrop_at {
            drop_a.set(false);
        }
        if let Some(c) = sim.ep[0].send_cqes.iter().find(|c| c.stream == a) {
            return Some(c.status);
        }
        if sim.now > until || !sim.step() {
            return None;
        }
    }
}

#[test]
fn a_message_slowed_by_its_paths_on_a_delivering_connection_does_not_fail() {
    // A's packets are lost for 20 completion timeouts: more than retry_cnt (7) would allow,
    // fewer than retry_cnt times the slowness factor.
    let (mut sim, drop_a, b_pair) = setup(21);
    let t0 = sim.now;
    let mut next = 0;
    let status = run_with_other_traffic(
        &mut sim,
        b_pair,
        &mut next,
        t0 + 2_000_000_000,
        &drop_a,
        t0 + 20 * STALL,
    );
    let b_done = sim.ep[0]
        .send_cqes
        .iter()
        .filter(|c| c.stream == b_pair)
        .count();
    assert_eq!(
        status,
        Some(CqStatus::Success),
        "after {} us, {b_done} of the other pair's messages done, {} acks in",
        (sim.now - t0) / 1000,
        sim.ep[0].conn.stats().acks_in
    );
}

#[test]
fn a_message_the_peer_never_takes_still_fails_while_the_connection_delivers() {
    let (mut sim, drop_a, b_pair) = setup(22);
    let t0 = sim.now;
    let mut next = 0;
    let status = run_with_other_traffic(
        &mut sim,
        b_pair,
        &mut next,
        t0 + 3_000_000_000,
        &drop_a,
        u64::MAX,
    );
    assert_eq!(
        status,
        Some(CqStatus::RetryExcErr),
        "after {} us",
        (sim.now - t0) / 1000
    );
    assert!(
        next > 16,
        "the other pair did not keep delivering ({next} messages)"
    );
}
