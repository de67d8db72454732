// SPDX-License-Identifier: GPL-2.0
//! A peer whose connection is a new one: its device was created again (or it freed its
//! connection with its last QP and made another), with a new connection id and its PSN
//! spaces from the start. The driver learns the new id from the peer's proven HELLO and calls
//! `set_remote_conn_id` and `restart_paths`; the connection then carries new QP pairs again.

mod sim;

use metaroce_transport::stream::{CqStatus, SendWqe, WrOpcode};
use sim::*;

/// 256 writes of 16 KiB (16 packets each): 4,096 packets, 256 per path.
fn writes() -> Vec<Msg> {
    vec![
        Msg {
            op: WrOpcode::RdmaWrite,
            len: 16 << 10,
        };
        256
    ]
}

/// Runs the writes `rounds` times on the default pair; every round must complete.
fn traffic(sim: &mut Sim, rounds: usize) {
    for _ in 0..rounds {
        // run_workload counts the completions of its pair from the start of the lists.
        sim.ep[0].send_cqes.clear();
        sim.ep[1].recv_cqes.clear();
        let deadline = sim.now + 5_000_000_000;
        let r = run_workload(sim, &writes(), deadline);
        assert!(r.completed, "round did not complete: {r:?}");
    }
}

/// Endpoint B made again: a connection with id 300 (A is 100), no streams, and a new QP pair
/// (0x33 on A, 0x44 on B) as the default pair. With `restart`, A takes the new id and
/// restarts its paths, as the driver does on the proven HELLO.
fn b_made_again(sim: &mut Sim, restart: bool) {
    let mut b = zeroed_conn();
    b.reset(config(300, 100, 0xbb)).expect("config");
    sim.ep[1].conn = b;
    sim.ep[0].conn.set_remote_conn_id(300);
    if restart {
        let now = sim.now;
        sim.ep[0].conn.restart_paths(now);
    }
    let (a, b) = sim.open_pair(0x33, 0x44);
    sim.ep[0].stream = a;
    sim.ep[1].stream = b;
}

#[test]
fn a_peer_made_again_gets_fresh_paths() {
    let mut sim = Sim::new(LinkConfig::clean(), 7);
    // Every path's PSNs far from their start (5 x 256 per path).
    traffic(&mut sim, 5);
    b_made_again(&mut sim, true);
    traffic(&mut sim, 2);
}

/// Why the restart: without it A's paths go on from PSNs the new connection's receive windows
/// are far behind (more than `RECV_WINDOW`): they drop every packet of A's, and A's message
/// fails with its retries exhausted.
#[test]
fn without_a_restart_the_peer_made_again_drops_everything() {
    let mut sim = Sim::new(LinkConfig::clean(), 9);
    traffic(&mut sim, 5);
    b_made_again(&mut sim, false);
    sim.ep[0].send_cqes.clear();
    let wqe = SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, 0x100000, 4096)).remote(0x200000, 2);
    let (now, a) = (sim.now, sim.ep[0].stream);
    sim.ep[0].conn.post_send(now, a, wqe).expect("post");
    let deadline = sim.now + 500_000_000;
    sim.run_until(deadline, |s| !s.ep[0].send_cqes.is_empty());
    let status = sim.ep[0].send_cqes.first().map(|c| c.status);
    assert!(status.is_some_and(|s| s != CqStatus::Success), "{status:?}");
    assert!(sim.ep[1].conn.stats().out_of_window_psn > 0);
}

/// The stale case: B is made again and A goes on sending with its old PSNs before it hears
/// B's HELLO: B drops them all, A's paths time out again and again until they fail (half of
/// them, here, before the test goes on). The
/// restart then gives A fresh paths, failure history included (it was the old peer's, not the
/// network's): every path is Active at once (before the change the failed ones stayed Failed
/// until their backed-off probes were answered), and the new QP pair's writes complete. Here
/// the round takes 3.8 ms either way (the paths that had not failed carry it, and the sim's
/// probes re-admit the others within it); what the test pins is the paths' state.
#[test]
fn paths_failed_by_the_stale_peer_start_afresh_on_restart() {
    use metaroce_transport::connection::path::PathState;
    let mut sim = Sim::new(LinkConfig::clean(), 11);
    traffic(&mut sim, 5);
    b_made_again(&mut sim, false);
    sim.ep[0].send_cqes.clear();
    let wqe = SendWqe::new(1, WrOpcode::RdmaWrite, sge(1, 0x100000, 64 << 10)).remote(0x200000, 2);
    let (now, a) = (sim.now, sim.ep[0].stream);
    sim.ep[0].conn.post_send(now, a, wqe).expect("post");
    let failed = |s: &Sim| {
        (0..PATHS)
            .filter(|&p| s.ep[0].conn.path_state(p) == Some(PathState::Failed))
            .count()
    };
    let deadline = sim.now + 2_000_000_000;
    sim.run_until(deadline, |s| {
        failed(s) >= PATHS / 2 || !s.ep[0].send_cqes.is_empty()
    });
    let cqes = &sim.ep[0].send_cqes;
    eprintln!("{} paths failed, completions {cqes:?}", failed(&sim));
    assert!(
        failed(&sim) >= PATHS / 2,
        "half the paths failed against the stale peer"
    );
    // The proven HELLO: A restarts (the driver calls set_remote_conn_id and restart_paths).
    let now = sim.now;
    sim.ep[0].conn.restart_paths(now);
    let usable = (0..PATHS)
        .filter(|&p| sim.ep[0].conn.path_state(p) == Some(PathState::Active))
        .count();
    assert_eq!(usable, PATHS, "a restarted path is a fresh one");
    let (a, b) = sim.open_pair(0x55, 0x66);
    sim.ep[0].stream = a;
    sim.ep[1].stream = b;
    sim.ep[0].send_cqes.clear();
    sim.ep[1].recv_cqes.clear();
    let start = sim.now;
    let r = run_workload(&mut sim, &writes(), start + 5_000_000_000);
    assert!(r.completed, "{r:?}");
}
