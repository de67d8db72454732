// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Native multipathing over an ECMP fabric (issue 4): packet spraying over many paths,
//! reordering that is not loss, link and plane failures routed around, a lossy path that
//! costs little, a failed plane re-admitted, 256 paths. Every run is seeded and
//! deterministic. `cargo test --release -p metaroce-transport --test multipath -- --nocapture`
//! prints the numbers; `multipath_table` prints them as one table.

mod sim;

use metaroce_transport::connection::path::PathState;
use metaroce_transport::stream::WrOpcode;
use sim::*;

const MTU: u64 = 1024;

fn writes(n: usize, len: u32) -> Vec<Msg> {
    (0..n)
        .map(|_| Msg {
            op: WrOpcode::RdmaWrite,
            len,
        })
        .collect()
}

/// 2 planes x 4 links, 5 us, 4 Gbit/s each; endpoints at 10 Gbit/s (the bottleneck).
fn fabric() -> EcmpFabric {
    EcmpFabric::uniform(2, 4, 5_000, 4_000)
}

/// Endpoint (NIC) rate and the unused single-link settings.
fn nic() -> LinkConfig {
    LinkConfig::clean()
}

fn path_sum(sim: &Sim, f: impl Fn(&metaroce_transport::connection::path::PathStats) -> u64) -> u64 {
    let c = &sim.ep[0].conn;
    (0..c.path_count())
        .map(|p| f(c.path_stats(p).unwrap()))
        .sum()
}

/// Per-plane shares, per mille, of per-path counts `s` (path i is on plane i % planes).
fn plane_shares(s: &[u64], planes: usize) -> Vec<u64> {
    let total: u64 = s.iter().sum();
    (0..planes)
        .map(|pl| s.iter().skip(pl).step_by(planes).sum::<u64>() * 1000 / total.max(1))
        .collect()
}

fn sent(sim: &Sim) -> Vec<u64> {
    let c = &sim.ep[0].conn;
    (0..c.path_count())
        .map(|p| c.path_stats(p).unwrap().sent)
        .collect()
}

/// Runs `msgs` (endpoint 0 to 1) and checks what `run_workload` checks (every message
/// exactly once, in order, successful, byte-exact) plus: no stream error on either side.
fn run(sim: &mut Sim, msgs: &[Msg]) -> WorkloadResult {
    let r = run_workload(sim, msgs, 5_000_000_000);
    assert!(r.completed, "did not complete: {r:?}");
    for ep in &sim.ep {
        assert!(ep.stream_errors.is_empty(), "{:?}", ep.stream_errors);
        assert!(ep.conn.stream_error(ep.stream).is_none());
    }
    r
}

// ------------------------------------------------------------------------- spreading

struct Spread {
    paths: usize,
    goodput: u64,
    min: u64,
    max: u64,
    mean: u64,
    planes: Vec<u64>,
}

fn spread(f: EcmpFabric, paths: u16, seed: u64) -> Spread {
    let planes = f.planes;
    let mut sim = Sim::with_fabric(f, nic(), paths, seed, |_| {});
    let r = run(&mut sim, &writes(240, 16384));
    assert_eq!(r.retransmits, 0, "clean fabric");
    let s = sent(&sim);
    Spread {
        paths: s.len(),
        goodput: r.goodput_mbps(),
        min: *s.iter().min().unwrap(),
        max: *s.iter().max().unwrap(),
        mean: s.iter().sum::<u64>() / s.len() as u64,
        planes: (0..planes)
            .map(|pl| s.iter().skip(pl).step_by(planes).sum())
            .collect(),
    }
}

/// Per-path sent counts within 25% of the mean (per-path windows follow each path's ECN);
/// planes within 5% of each other (hash collisions congest some links more than others).
fn assert_balanced(s: &Spread) {
    assert!(s.min > 0, "every path carries data");
    assert!(
        s.max * 100 <= s.mean * 125 && s.min * 100 >= s.mean * 75,
        "paths: min {} max {} mean {}",
        s.min,
        s.max,
        s.mean
    );
    let (lo, hi) = (
        *s.planes.iter().min().unwrap(),
        *s.planes.iter().max().unwrap(),
    );
    assert!(hi * 100 <= lo * 105, "planes {:?}", s.planes);
}

#[test]
fn spraying_spreads_over_every_path_and_plane() {
    for (paths, seed) in [(32u16, 1u64), (48, 2), (8, 3)] {
        let s = spread(fabric(), paths, seed);
        eprintln!(
            "spread: {} paths over 2 planes x 4 links: goodput {} Mbit/s, packets per path min {} mean {} max {}, per plane {:?}",
            s.paths, s.goodput, s.min, s.mean, s.max, s.planes
        );
        assert_balanced(&s);
    }
}

// ------------------------------------------------------------------------- reordering

fn delays() -> EcmpFabric {
    // Links of 2, 10, 50 and 200 us: heavy spraying over routes of very different delays.
    let mut f = fabric();
    let d = [2_000, 10_000, 50_000, 200_000];
    for (i, l) in f.links.iter_mut().enumerate() {
        l.delay_ns = d[i % 4];
    }
    f
}

fn jitter(ppm: u32, max_ns: u64, fifo: bool) -> EcmpFabric {
    let mut f = fabric();
    for l in f.links.iter_mut() {
        l.jitter_ppm = ppm;
        l.jitter_max_ns = max_ns;
        l.fifo = fifo;
    }
    f
}

struct Reorder {
    retransmits: u64,
    spurious: u64,
    reordered: u64,
    sent: u64,
    goodput: u64,
}

fn reorder_run(sim: &mut Sim, n: usize) -> Reorder {
    for ep in sim.ep.iter_mut() {
        ep.send_cqes.clear();
        ep.recv_cqes.clear();
    }
    let before = (
        sim.retransmits(),
        path_sum(sim, |s| s.spurious),
        path_sum(sim, |s| s.reordered),
        path_sum(sim, |s| s.sent),
    );
    let r = run(sim, &writes(n, 16384));
    assert_eq!(r.net.dropped, 0, "no loss in these runs");
    Reorder {
        retransmits: sim.retransmits() - before.0,
        spurious: path_sum(sim, |s| s.spurious) - before.1,
        reordered: path_sum(sim, |s| s.reordered) - before.2,
        sent: path_sum(sim, |s| s.sent) - before.3,
        goodput: r.goodput_mbps(),
    }
}

fn reorder_patterns() -> Vec<(&'static str, Option<EcmpFabric>, LinkConfig)> {
    vec![
        ("links of 2-200 us", Some(delays()), nic()),
        (
            "30% jitter <= 50 us (FIFO links)",
            Some(jitter(300_000, 50_000, true)),
            nic(),
        ),
        (
            "20% overtaking <= 5 us",
            Some(jitter(200_000, 5_000, false)),
            nic(),
        ),
        (
            "single link, 25% jitter <= 40 us",
            None,
            LinkConfig::clean().reorder(25, 40_000),
        ),
    ]
}

fn reorder_sim(f: Option<EcmpFabric>, link: LinkConfig, seed: u64) -> Sim {
    match f {
        Some(f) => Sim::with_fabric(f, link, 32, seed, |_| {}),
        None => Sim::with_config(link, seed, |c| c.num_paths = 32),
    }
}

#[test]
fn reordering_without_loss_retransmits_nothing() {
    for (name, f, link) in reorder_patterns() {
        for seed in 0..3 {
            let mut sim = reorder_sim(f.clone(), link.clone(), seed);
            let r = reorder_run(&mut sim, 200);
            eprintln!(
                "reorder {name}, seed {seed}: goodput {} Mbit/s, {} packets, reordered within a path {}, spurious losses {}, retransmits {}",
                r.goodput, r.sent, r.reordered, r.spurious, r.retransmits
            );
            assert_eq!((r.retransmits, r.spurious), (0, 0), "{name}, seed {seed}");
        }
    }
}

#[test]
fn heavy_reordering_within_paths_is_learned() {
    // 20% of packets overtaken by up to 20 or 100 us on every link: within a path, beyond
    // the reordering window a path starts with (a quarter of its RTT, at least 10 us). The
    // first such reorderings may cost a spurious retransmit or a few, then the learned
    // window (shared by all paths) covers them: a second transfer on the same connection
    // has next to none. (Not always none: the window covers a quarter more than the largest
    // reordering seen so far, and a later one may be larger still.)
    let (mut first_spurious, mut second_spurious) = (0, 0);
    for max_us in [20u64, 100] {
        for seed in 0..3 {
            let f = jitter(200_000, max_us * 1000, false);
            let mut sim = Sim::with_fabric(f, nic(), 32, seed, |_| {});
            let first = reorder_run(&mut sim, 120);
            let second = reorder_run(&mut sim, 120);
            eprintln!(
                "reorder 20% overtaking <= {max_us} us, seed {seed}: first transfer {} packets, reordered within a path {}, spurious {}; second transfer reordered {}, spurious {}, retransmits {}",
                first.sent, first.reordered, first.spurious, second.reordered, second.spurious, second.retransmits
            );
            assert!(first.spurious * 200 <= first.sent, "at most 0.5%");
            if max_us == 100 {
                assert!(first.reordered > 100 && second.reordered > 100);
            }
            assert!(second.spurious <= 1, "seed {seed}");
            assert_eq!(second.retransmits, second.spurious, "seed {seed}");
            first_spurious += first.spurious;
            second_spurious += second.spurious;
        }
    }
    assert!(
        second_spurious * 4 <= first_spurious,
        "second transfers {second_spurious}, first {first_spurious}"
    );
}

// ------------------------------------------------------------------------- failures

const BIN: u64 = 25_000;

/// Mean goodput (Mbit/s) over the trace bins in [from, to) ns.
fn mean_goodput(g: &[u64], from: u64, to: u64) -> u64 {
    let (a, b) = ((from / BIN) as usize, ((to / BIN) as usize).min(g.len()));
    if b <= a {
        return 0;
    }
    g[a..b].iter().sum::<u64>() / (b - a) as u64
}

struct Recovery {
    /// Goodput before the event (the 500 us before it), Mbit/s.
    before: u64,
    /// Surviving capacity: mean goodput from 1 ms after the event to `end`.
    surviving: u64,
    /// Lowest 100 us goodput after the event.
    dip: u64,
    /// From the event until goodput stays at >= 80% of the surviving capacity (every 100 us
    /// window until `end`), ns.
    recovery: u64,
    /// RTO in force when the event happened.
    rto: u64,
}

fn recovery(sim: &Sim, t: u64, end: u64) -> Recovery {
    let g = sim.goodput_bins(MTU);
    let surviving = mean_goodput(&g, t + 1_000_000, end);
    let before = mean_goodput(&g, t.saturating_sub(500_000), t);
    let rto = sim.trace_rto[(t / BIN) as usize - 1];
    let mut dip = u64::MAX;
    let mut last_bad = None;
    let mut at = t;
    while at + 100_000 <= end {
        let m = mean_goodput(&g, at, at + 100_000);
        dip = dip.min(m);
        if m * 10 < surviving * 8 {
            last_bad = Some(at);
        }
        at += BIN;
    }
    Recovery {
        before,
        surviving,
        dip,
        recovery: last_bad.map_or(0, |b| b + 100_000 - t),
        rto,
    }
}

struct Cuts {
    link: Recovery,
    plane: Recovery,
    goodput: u64,
    timeouts: u64,
    failed: usize,
}

/// 2 planes x 4 links of 1 Gbit/s (the fabric is the bottleneck, 8 Gbit/s), ECN marking
/// above 30 us of queue. Link 1 of plane 0 is cut at 1 ms, all of plane 1 at 3 ms.
fn cuts(seed: u64) -> Cuts {
    let mut f = EcmpFabric::uniform(2, 4, 5_000, 1_000);
    for l in f.links.iter_mut() {
        l.ecn_queue_ns = 30_000;
    }
    let (t1, t2) = (1_000_000, 3_000_000);
    f.link_mut(0, 1).cut = Some((t1, u64::MAX));
    f.cut_plane(1, t2, u64::MAX);
    let mut sim = Sim::with_fabric(f, nic(), 32, seed, |_| {});
    sim.trace_bin_ns = BIN;
    let r = run(&mut sim, &writes(240, 16384));
    let end = sim.now - 200_000; // leave out the tail of the transfer
    let c = &sim.ep[0].conn;
    Cuts {
        link: recovery(&sim, t1, t2),
        plane: recovery(&sim, t2, end),
        goodput: r.goodput_mbps(),
        timeouts: r.timeouts,
        failed: (0..c.path_count())
            .filter(|&p| c.path_state(p) == Some(PathState::Failed))
            .count(),
    }
}

fn print_recovery(what: &str, r: &Recovery) {
    eprintln!(
        "{what}: goodput before {} Mbit/s, dip {} Mbit/s, back to >= 80% of the surviving {} Mbit/s after {} us = {:.1} RTO (RTO {} us)",
        r.before,
        r.dip,
        r.surviving,
        r.recovery / 1000,
        r.recovery as f64 / r.rto as f64,
        r.rto / 1000
    );
}

#[test]
fn cut_link_then_plane_completes_and_recovers_within_three_rtos() {
    for seed in [7, 8] {
        let c = cuts(seed);
        print_recovery(&format!("seed {seed}: cut 1 of 8 links"), &c.link);
        print_recovery(&format!("seed {seed}: then cut plane 1"), &c.plane);
        eprintln!(
            "seed {seed}: whole transfer {} Mbit/s, {} path timeouts, {} paths Failed at the end",
            c.goodput, c.timeouts, c.failed
        );
        for r in [&c.link, &c.plane] {
            assert!(
                r.recovery <= 3 * r.rto,
                "recovery {} > 3 RTO {}",
                r.recovery,
                r.rto
            );
        }
        // Plane 1 is gone: its 16 paths end up Failed (still probed), the others carry on.
        assert!(c.failed >= 16, "{} Failed", c.failed);
        // 3 links of 1 Gbit/s survive: at least two thirds of that.
        assert!(c.plane.surviving >= 2_000, "{}", c.plane.surviving);
    }
}

/// 1 plane of 4 links of 1 Gbit/s, link 1 cut at 1 ms for good, 16 paths: the ACKs lost
/// on the cut link and all the ACKs the receiver sent.
fn acks_across_a_cut(seed: u64) -> (u64, u64) {
    let mut f = EcmpFabric::uniform(1, 4, 5_000, 1_000);
    for l in f.links.iter_mut() {
        l.ecn_queue_ns = 30_000;
    }
    f.link_mut(0, 1).cut = Some((1_000_000, u64::MAX));
    let mut sim = Sim::with_fabric(f, nic(), 16, seed, |_| {});
    run(&mut sim, &writes(240, 16384));
    (sim.net.cut_acks, sim.ep[1].conn.stats().acks_out)
}

/// An ACK goes back with the source port of the data it answers, so the data's sender picks
/// both routes of a path: its paths that move off a dead link after a timeout take their ACKs
/// with them. (The fabric's hash ignores direction, as Linux's multipath hash does in the
/// guest suite's leaf and spine fabric.) With the receiver's own source ports, those hashed
/// onto the cut link would lose every ACK sent on them for the rest of the run, which the
/// sender takes for losses on its healthy paths.
#[test]
fn acks_follow_their_paths_off_a_cut_link() {
    for seed in 1..=12 {
        let (lost, sent) = acks_across_a_cut(seed);
        eprintln!("seed {seed}: {lost} of {sent} ACKs lost on the cut link");
        // Those on their way when the link was cut, and those of paths still on it: a path
        // stays a candidate for ACKs for a minimum RTO after its last arrival.
        assert!(
            lost * 50 <= sent,
            "{lost} of {sent} ACKs lost on the cut link"
        );
    }
}

// ------------------------------------------------------------------------- lossy path

/// Drops 5% of the packets (both directions) whose path id is `path`, deterministically.
fn lossy_path_filter(path: u16) -> DropFilter {
    Box::new(move |_, b| {
        let Ok(v) = metaroce_transport::wire::Packet::parse(b) else {
            return false;
        };
        let h = v.header.base;
        if h.path_id != path {
            return false;
        }
        let mut x = (u64::from(h.psn) << 32 | u64::from(h.timestamp)) ^ u64::from(h.opcode as u8);
        x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 31;
        x % 100 < 5
    })
}

struct Lossy {
    paths: u64,
    clean: u64,
    lossy: u64,
    /// Goodput lost, per mille.
    cost_permille: u64,
    /// The lossy path's share of the packets sent, per mille.
    share_permille: u64,
    retransmits: u64,
}

fn lossy_path(paths: u16, seed: u64) -> Lossy {
    let msgs = writes(240, 16384);
    let mut clean = Sim::with_fabric(fabric(), nic(), paths, seed, |_| {});
    let c = run(&mut clean, &msgs);
    let mut sim = Sim::with_fabric(fabric(), nic(), paths, seed, |_| {});
    sim.drop_if = Some(lossy_path_filter(3));
    let l = run(&mut sim, &msgs);
    let s = sent(&sim);
    let total: u64 = s.iter().sum();
    Lossy {
        paths: u64::from(paths),
        clean: c.goodput_mbps(),
        lossy: l.goodput_mbps(),
        cost_permille: 1000u64.saturating_sub(l.goodput_mbps() * 1000 / c.goodput_mbps()),
        share_permille: s[3] * 1000 / total,
        retransmits: l.retransmits,
    }
}

#[test]
fn one_lossy_path_costs_less_than_its_share() {
    for (paths, seed) in [(8u16, 4u64), (32, 5)] {
        let l = lossy_path(paths, seed);
        eprintln!(
            "lossy path: 1 of {} paths at 5% loss: goodput {} vs {} Mbit/s clean, cost {:.1}% (its fair share {:.1}%), it carried {:.1}% of the packets, {} retransmits",
            l.paths,
            l.lossy,
            l.clean,
            l.cost_permille as f64 / 10.0,
            100.0 / l.paths as f64,
            l.share_permille as f64 / 10.0,
            l.retransmits
        );
        let fair = 1000 / l.paths;
        assert!(
            l.cost_permille <= fair,
            "cost {} > share {}",
            l.cost_permille,
            fair
        );
        assert!(
            l.share_permille < fair,
            "the lossy path carries less than its share"
        );
        assert!(l.retransmits > 0);
    }
}

// ------------------------------------------------------------------------- re-admission

struct Readmit {
    failures: u64,
    readmissions: u64,
    /// Share of the packets plane 1 carried after it came back, per mille.
    plane1_after_permille: u64,
    all_usable: bool,
}

/// Plane 1 is cut from 0.2 ms to 3 ms during a first transfer; its paths fail. A second
/// transfer runs after it is back.
fn readmit(seed: u64) -> Readmit {
    let mut f = fabric();
    f.cut_plane(1, 200_000, 3_000_000);
    let mut sim = Sim::with_fabric(f, nic(), 32, seed, |_| {});
    run(&mut sim, &writes(200, 16384));
    // Wait until past the outage and the paths' next background probes.
    sim.run_until(15_000_000, |_| false);
    second_transfer(&mut sim)
}

/// After an outage of plane 1 (odd paths): a second transfer, and what it shows of the
/// plane's paths.
fn second_transfer(sim: &mut Sim) -> Readmit {
    let plane1 = |sim: &Sim| -> u64 {
        let c = &sim.ep[0].conn;
        (1..c.path_count())
            .step_by(2)
            .map(|p| c.path_stats(p).unwrap().sent)
            .sum()
    };
    let (before_all, before_p1) = (path_sum(sim, |s| s.sent), plane1(sim));
    for ep in sim.ep.iter_mut() {
        ep.send_cqes.clear();
        ep.recv_cqes.clear();
    }
    run(sim, &writes(200, 16384));
    let c = &sim.ep[0].conn;
    Readmit {
        failures: path_sum(sim, |s| s.failures),
        readmissions: path_sum(sim, |s| s.readmissions),
        plane1_after_permille: (plane1(sim) - before_p1) * 1000
            / (path_sum(sim, |s| s.sent) - before_all),
        all_usable: (0..c.path_count()).all(|p| c.path(p).unwrap().usable()),
    }
}

#[test]
fn a_failed_plane_that_comes_back_is_readmitted() {
    for seed in [11, 12] {
        let r = readmit(seed);
        eprintln!(
            "re-admission, seed {seed}: {} path failures, {} re-admissions; plane 1 carried {:.1}% of the packets afterwards",
            r.failures,
            r.readmissions,
            r.plane1_after_permille as f64 / 10.0
        );
        assert!(r.failures >= 16, "all 16 paths of plane 1 failed");
        assert!(r.readmissions >= 16, "and all were re-admitted");
        assert!(r.all_usable);
        assert!(
            r.plane1_after_permille >= 450,
            "plane 1 takes its half again: {}",
            r.plane1_after_permille
        );
    }
}

/// Plane 1 blackholed for 0.6 s, with RTOs capped at 200 us: each of its paths sends about
/// 3,000 probes into the void, far more PSNs than the receive window (`RECV_WINDOW`) holds
/// beyond what the peer last acknowledged. They must still be re-admitted when it comes back,
/// and a second transfer must use them.
struct LongCut {
    /// Fewest probes a plane-1 path sent during the outage.
    min_probes: u64,
    /// Of all those probes, the ones that repeated an earlier PSN (path at the window limit).
    limit_probes: u64,
    /// Largest distance, at the end of the outage, from a plane-1 path's next PSN at the
    /// sender to the receiver's cumulative PSN of that path.
    max_ahead: u32,
    readmit: Readmit,
    /// Out-of-window drops at the receiver (none: the sender never runs past the window).
    out_of_window: u64,
}

fn long_cut(seed: u64) -> LongCut {
    const CUT_END: u64 = 600_000_000;
    let mut f = fabric();
    f.cut_plane(1, 200_000, CUT_END);
    let mut sim = Sim::with_fabric(f, nic(), 32, seed, |c| c.path.max_rto = 200_000);
    run(&mut sim, &writes(200, 16384));
    sim.run_until(CUT_END - 1, |_| false);
    let plane1: Vec<usize> = (1..32).step_by(2).collect();
    let (a, b) = (&sim.ep[0].conn, &sim.ep[1].conn);
    let min_probes = plane1
        .iter()
        .map(|&p| a.path_stats(p).unwrap().probes)
        .min()
        .unwrap();
    let limit_probes = plane1
        .iter()
        .map(|&p| a.path_stats(p).unwrap().limit_probes)
        .sum();
    let max_ahead = plane1
        .iter()
        .map(|&p| {
            let next = a.path(p).unwrap().inflight.next_psn();
            next.wrapping_sub(b.path(p).unwrap().recv.cum())
        })
        .max()
        .unwrap();
    // Past the outage and the paths' next probes.
    sim.run_until(CUT_END + 5_000_000, |_| false);
    let readmit = second_transfer(&mut sim);
    let out_of_window = sim
        .ep
        .iter()
        .map(|e| e.conn.stats().out_of_window_psn)
        .sum();
    LongCut {
        min_probes,
        limit_probes,
        max_ahead,
        readmit,
        out_of_window,
    }
}

#[test]
fn a_plane_blackholed_for_thousands_of_probes_is_readmitted() {
    use metaroce_transport::connection::sack::RECV_WINDOW;
    for seed in [13, 14] {
        let r = long_cut(seed);
        eprintln!(
            "long cut, seed {seed}: >= {} probes per plane-1 path ({} at the window limit in all), next PSN up to {} beyond the receiver's cum; {} failures, {} re-admissions; plane 1 carried {:.1}% afterwards",
            r.min_probes,
            r.limit_probes,
            r.max_ahead,
            r.readmit.failures,
            r.readmit.readmissions,
            r.readmit.plane1_after_permille as f64 / 10.0
        );
        assert!(
            r.min_probes > 2 * u64::from(RECV_WINDOW),
            "{}",
            r.min_probes
        );
        assert!(r.max_ahead <= RECV_WINDOW + 1, "{}", r.max_ahead);
        assert!(r.limit_probes > 0);
        assert_eq!(r.out_of_window, 0);
        assert!(
            r.readmit.readmissions >= 16,
            "all 16 paths of plane 1 re-admitted"
        );
        assert!(r.readmit.all_usable);
        assert!(
            r.readmit.plane1_after_permille >= 450,
            "plane 1 takes its half again: {}",
            r.readmit.plane1_after_permille
        );
    }
}

// ------------------------------------------------------------------------- 256 paths

#[test]
fn two_hundred_fifty_six_paths_over_four_planes() {
    let s = spread(EcmpFabric::uniform(4, 8, 5_000, 4_000), 256, 13);
    eprintln!(
        "256 paths over 4 planes x 8 links: goodput {} Mbit/s, packets per path min {} mean {} max {}, per plane {:?}",
        s.goodput, s.min, s.mean, s.max, s.planes
    );
    assert!(s.min > 0, "every path carries data");
    let (lo, hi) = (
        *s.planes.iter().min().unwrap(),
        *s.planes.iter().max().unwrap(),
    );
    assert!(hi * 100 <= lo * 105, "planes {:?}", s.planes);
}

// ------------------------------------------------------------------------- the table

#[test]
fn multipath_table() {
    let mut rows: Vec<(String, String)> = Vec::new();
    let s = spread(fabric(), 32, 1);
    rows.push((
        "spread, 32 paths / 2 planes x 4 links (packets per path min/mean/max; per plane)".into(),
        format!("{}/{}/{}; {:?}", s.min, s.mean, s.max, s.planes),
    ));
    let s = spread(EcmpFabric::uniform(4, 8, 5_000, 4_000), 256, 13);
    rows.push((
        "spread, 256 paths / 4 planes x 8 links (min/mean/max; per plane)".into(),
        format!("{}/{}/{}; {:?}", s.min, s.mean, s.max, s.planes),
    ));
    for (name, f, link) in reorder_patterns() {
        let mut sim = reorder_sim(f, link, 0);
        let r = reorder_run(&mut sim, 200);
        rows.push((
            format!("reordering, no loss: {name} (retransmits; reordered within a path)"),
            format!("{}; {}", r.retransmits, r.reordered),
        ));
    }
    for max_us in [20u64, 100] {
        let f = jitter(200_000, max_us * 1000, false);
        let mut sim = Sim::with_fabric(f, nic(), 32, 0, |_| {});
        let a = reorder_run(&mut sim, 120);
        let b = reorder_run(&mut sim, 120);
        rows.push((
            format!(
                "reordering, no loss: 20% overtaking <= {max_us} us (spurious retransmits, first / second transfer)"
            ),
            format!("{} of {} / {} of {}", a.spurious, a.sent, b.spurious, b.sent),
        ));
    }
    for seed in [7u64, 8] {
        let c = cuts(seed);
        for (what, r) in [
            ("cut 1 of 8 links at 1 ms", &c.link),
            ("then plane 1 of 2 at 3 ms", &c.plane),
        ] {
            rows.push((
                format!(
                    "seed {seed}: {what} (Mbit/s before -> lowest 100 us -> surviving; back to >= 80%)"
                ),
                format!(
                    "{} -> {} -> {}; {} us = {:.1} RTO",
                    r.before,
                    r.dip,
                    r.surviving,
                    r.recovery / 1000,
                    r.recovery as f64 / r.rto as f64
                ),
            ));
        }
    }
    for paths in [8u16, 32] {
        let l = lossy_path(paths, 4);
        rows.push((
            format!("1 of {paths} paths at 5% loss (goodput cost; fair share; its packets)"),
            format!(
                "{:.1}%; {:.1}%; {:.1}%",
                l.cost_permille as f64 / 10.0,
                100.0 / paths as f64,
                l.share_permille as f64 / 10.0
            ),
        ));
    }
    let r = readmit(11);
    rows.push((
        "plane down 2.8 ms then back (failures; re-admissions; plane's share after)".into(),
        format!(
            "{}; {}; {:.1}%",
            r.failures,
            r.readmissions,
            r.plane1_after_permille as f64 / 10.0
        ),
    ));
    use metaroce_transport::connection::{path::Path, Connection};
    use metaroce_transport::stream::Stream;
    rows.push((
        "size_of: Path (256-entry in-flight table); Connection<Paths<32>, [Stream; 16]>; Connection<Paths<256>, [Stream; 16]>".into(),
        format!(
            "{} B; {} KiB; {} KiB",
            std::mem::size_of::<Path>(),
            std::mem::size_of::<Connection<metaroce_transport::connection::Paths<32>, [Stream; 16]>>() >> 10,
            std::mem::size_of::<Connection<metaroce_transport::connection::Paths<256>, [Stream; 16]>>() >> 10
        ),
    ));
    eprintln!("\n| multipath (transport simulator) | result |\n|---|---|");
    for (k, v) in rows {
        eprintln!("| {k} | {v} |");
    }
}

// ------------------------------------------------------------------------- runs per path

/// Per-plane shares (per mille of the data packets) and per-path sent counts of a bulk
/// transfer over `planes` planes of one rate-limited link each, whose queue drops what would
/// wait over 20 ms (a tbf qdisc, as the guest's planes test has), with runs of `burst`
/// packets per path.
fn runs_over_limited_planes(
    planes: usize,
    paths: u16,
    burst: u8,
    seed: u64,
) -> (Vec<u64>, Vec<u64>, WorkloadResult, u64) {
    let mut f = EcmpFabric::uniform(planes, 1, 50_000, 40);
    for l in &mut f.links {
        l.queue_limit_ns = 20_000_000;
    }
    let mut sim = Sim::with_fabric(f, nic(), paths, seed, |c| {
        c.path_burst = burst;
        c.path.max_rto = 100_000_000;
        c.stall_timeout = 200_000_000;
        // The bounds below were set with 16 packets before the first ACK over all planes,
        // as the initial window was then: the first runs' paths lose their early packets to
        // the 20 ms queue and stay the least used (72-81 packets of a mean of 185 with 16,
        // 57-85 with 16 per plane: one path 4 packets under a third of the mean).
        c.cc.initial_window = 16 / planes as u32;
    });
    // 120 messages of 64 KiB, several message windows (`MSG_WINDOW`), so that the bounds
    // judge the spraying rather than the first window (with 60, a 32-message window held
    // half the transfer).
    let r = run(&mut sim, &writes(120, 65536));
    let s = sent(&sim);
    (
        plane_shares(&s, planes),
        s,
        r,
        path_sum(&sim, |p| p.spurious),
    )
}

#[test]
fn runs_per_path_keep_tail_drop_planes_even() {
    // The guest's planes test (4 planes, each a tbf that drops beyond 20 ms of queue) got
    // 14-39% of the bytes per plane with runs of 16 packets per path, before path estimates
    // aged ([`Path::age`]): a path that lost part of a run kept the low weight of a stale
    // loss rate and RTT. This simulator does not reproduce that unevenness (every variant
    // gives 24-26% with or without aging); it holds the conditions to the same bounds:
    // every plane within 20-30%, every path at least a third of the mean.
    for (burst, seed) in [(16u8, 1u64), (4, 1), (1, 1)] {
        let (shares, s, r, spurious) = runs_over_limited_planes(4, 24, burst, seed);
        eprintln!(
            "runs of {burst}, 24 paths over 4 planes at 40 Mbit/s, seed {seed}: per plane {shares:?} per mille, per path {s:?}; goodput {} Mbit/s, {} queue drops, {} retransmits, {} timeouts, spurious {}",
            r.goodput_mbps(),
            r.net.queue_drops,
            r.retransmits, r.timeouts, spurious
        );
        assert!(
            shares.iter().all(|&x| (200..=300).contains(&x)),
            "every plane within 20-30%: {shares:?}"
        );
        let mean = s.iter().sum::<u64>() / s.len() as u64;
        assert!(
            s.iter().all(|&n| n * 3 >= mean),
            "every path at least a third of the mean: {s:?}"
        );
    }
}

/// Runs of 8 where nothing is lost, of 2 on path 3, which loses 5%, over 12 seeds with
/// `Config::marked_run_rate` at `marked`; `nic_ecn`: the sender's NIC queue marks CE (on
/// every path) past its threshold. Returns the runs of path 3 longer than 2 in the second
/// half of each transfer (its loss rate known by then), and the longest of them.
fn lossy_path_runs(marked: u16, nic_ecn: bool) -> (usize, usize) {
    let (mut long_runs, mut longest_lossy) = (0, 0);
    for seed in 1..=12 {
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut f = fabric();
        if !nic_ecn {
            f.nic_ecn_queue_ns = 0;
        }
        let mut sim = Sim::with_fabric(f, nic(), 8, seed, |c| {
            c.path_burst = 8;
            c.lossy_path_burst = 2;
            c.marked_run_rate = marked;
            // 16 packets before the first ACK over both planes, as when the bound of 6 below
            // was set: it is near what the connection window lets a run have (seeds 1-12:
            // the longest run of a clean path is 6-8 with 16, 5-8 with 16 per plane).
            c.cc.initial_window = 8;
        });
        let (log, lossy) = (seen.clone(), lossy_path_filter(3));
        sim.drop_if = Some(Box::new(move |from, b| {
            if from == 0 && b.len() > 1000 {
                if let Ok(v) = metaroce_transport::wire::Packet::parse(b) {
                    log.borrow_mut().push(v.header.base.path_id);
                }
            }
            lossy(from, b)
        }));
        run(&mut sim, &writes(240, 16384));
        let seen = seen.borrow();
        // The longest run per path over the second half.
        let mut longest = [0usize; 8];
        let half = &seen[seen.len() / 2..];
        for run in half.chunk_by(|a, b| a == b) {
            let p = usize::from(run[0]) % 8;
            longest[p] = longest[p].max(run.len());
            long_runs += usize::from(p == 3 && run.len() > 2);
        }
        eprintln!("seed {seed}: longest runs per path over the second half: {longest:?}");
        assert!(
            longest.iter().enumerate().any(|(p, &n)| p != 3 && n >= 6),
            "{longest:?}"
        );
        longest_lossy = longest_lossy.max(longest[3]);
    }
    eprintln!("runs of 3 or more on the lossy path: {long_runs}, the longest {longest_lossy}");
    (long_runs, longest_lossy)
}

#[test]
fn runs_are_short_on_a_lossy_path() {
    // A run that meets a full tail-drop queue loses several packets at once. A few runs of
    // more than 2 start while the lossy path's loss estimate has dipped under 1%
    // (`Config::lossy_run_rate`), where runs of 8 are allowed (4 with the spraying that
    // charged a pick what the others earned, 6 with one that charges the round's total to
    // paths with window room; 33 before a lossy path's run was kept from following its own).
    for marked in [0, 1] {
        let (long_runs, _) = lossy_path_runs(marked, true);
        assert!(long_runs <= 8, "{long_runs}");
    }
}

#[test]
fn runs_stay_long_on_a_path_that_loses_without_marks() {
    // With `Config::marked_run_rate` at 1, runs shorten only where the network marks too
    // (a queue that overflows marks before it drops; above, the sender's NIC queue marked
    // every path): random loss keeps the long runs, which cost the sender less per packet.
    let (long_runs, longest) = lossy_path_runs(1, false);
    assert!(long_runs > 50, "{long_runs}");
    assert!(longest >= 6, "{longest}");
}

/// The receiver's ACKs die on 7 of its 16 paths (its routes through a dead spine: it only
/// ACKs, so no timeout of its own ever moves them to other routes), and the sender's data sees
/// 2% loss: ACKs repeat what others carried, so the transfer completes without a single
/// completion-timeout resend. (A guest multipath run once failed with RETRY_EXC with 43% of
/// the receiver's ACKs lost this way; this does not reproduce it.)
#[test]
fn acks_lost_on_dead_reverse_routes_cost_no_message_retry() {
    for seed in 1..7 {
        let mut sim = Sim::with_fabric(fabric(), nic(), 16, seed, |_| {});
        sim.drop_if = Some(Box::new(|from, b| {
            let Ok(v) = metaroce_transport::wire::Packet::parse(b) else {
                return false;
            };
            let h = v.header.base;
            if from == 1 {
                return [1, 3, 4, 6, 9, 11, 12].contains(&h.path_id);
            }
            let x = (u64::from(h.psn) << 32 | u64::from(h.timestamp))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (x >> 40) % 100 < 2
        }));
        let r = run(&mut sim, &writes(200, 4096));
        eprintln!(
            "seed {seed}: {} us, pokes {}, timeouts {}, retransmits {}",
            r.elapsed_ns / 1000,
            r.pokes,
            r.timeouts,
            r.retransmits
        );
        assert_eq!(r.pokes, 0, "seed {seed}");
    }
}

#[test]
fn learned_reordering_outlasts_a_clean_transfer() {
    // Reordering comes and goes (a route whose jitter depends on other traffic): a
    // transfer without reordering between two with it must not make the connection forget
    // what it learned, as a window that decays with clean ACKs did (the guest's reordering
    // benchmark, run after lossless ones, retransmitted 4-111 packets a run, nearly all
    // spurious). RFC 8985 keeps a widened window until loss recoveries show it was not
    // needed (`reo_wnd_persist`); loss, not the absence of reordering, shrinks it.
    for seed in 0..3 {
        let reordering = jitter(200_000, 100_000, false);
        let mut sim = Sim::with_fabric(reordering.clone(), nic(), 32, seed, |_| {});
        let first = reorder_run(&mut sim, 120);
        *sim.fabric.as_mut().unwrap() = fabric();
        let mut clean = reorder_run(&mut sim, 250);
        for _ in 0..30 {
            let more = reorder_run(&mut sim, 250);
            clean.sent += more.sent;
            clean.reordered += more.reordered;
            clean.spurious += more.spurious;
        }
        *sim.fabric.as_mut().unwrap() = reordering;
        let again = reorder_run(&mut sim, 120);
        eprintln!(
            "reordering, clean, reordering again, seed {seed}: spurious {} / {} / {}, reordered {} / {} / {}, clean packets per path {}",
            first.spurious, clean.spurious, again.spurious, first.reordered, clean.reordered,
            again.reordered, clean.sent / 32
        );
        assert_eq!(clean.reordered, 0);
        assert!(
            clean.sent / 32 > 1024,
            "enough clean ACKs per path to decay a window"
        );
        assert_eq!((again.spurious, again.retransmits), (0, 0), "seed {seed}");
    }
}

#[test]
fn spraying_with_window_room_everywhere_is_even() {
    // The sender, not the windows, limits (a 1 Gbit/s NIC, planes of 40 Gbit/s, no ECN at
    // the NIC's queue): every path has window room at nearly every pick, and runs of 16
    // make every waiting path's credit reach its cap. Charging a pick only what the others
    // earned then charged nothing once they were all at the cap: the lowest-numbered paths
    // with room took every pick (here 42-307 packets per path, planes 22-27%; in the guest,
    // windows grew to 256 on a few paths per plane and a plane got 10% of the bytes).
    // (A clean fabric: the seed changes nothing.)
    let mut f = EcmpFabric::uniform(4, 1, 20_000, 40_000);
    f.nic_ecn_queue_ns = 0;
    let mut link = nic();
    link.rate_bits_per_us = 1_000;
    let mut sim = Sim::with_fabric(f, link, 24, 1, |c| {
        c.path_burst = 16;
        c.lossy_path_burst = 4;
    });
    run(&mut sim, &writes(240, 16384));
    let s = sent(&sim);
    let mean = s.iter().sum::<u64>() / s.len() as u64;
    let planes = plane_shares(&s, 4);
    eprintln!("per plane {planes:?} per mille, per path {s:?}");
    assert!(
        planes.iter().all(|&x| (240..=260).contains(&x)),
        "{planes:?}"
    );
    assert!(
        s.iter().all(|&n| n * 4 <= mean * 5),
        "no path over 1.25x the mean: {s:?}"
    );
}
