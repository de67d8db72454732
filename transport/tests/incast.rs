// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Incast: N senders (N = 2..64) write to one receiver through one switch port that marks
//! ECN above a threshold and drops when its buffer is full (`sim::fabric`). For the full
//! algorithm, for ECN alone and for the receiver's rate alone: utilisation of the bottleneck,
//! Jain's fairness across the senders, peak queue, time until the queue settles, drops. The
//! table is printed (`cargo test --test incast -- --nocapture`) and asserted on.

mod sim;

use metaroce_transport::congestion::{CcConfig, RateAllocator};
use sim::fabric::{jain, Fabric, FabricConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// ECN windows and the receiver's grant.
    Full,
    /// ECN windows only: no grants.
    EcnOnly,
    /// The receiver's grant only: windows ignore ECN.
    RateOnly,
}

impl Mode {
    fn config(self) -> FabricConfig {
        let mut f = FabricConfig::default_10g();
        f.cc = CcConfig {
            ecn: self != Mode::RateOnly,
            receiver_rate: self != Mode::EcnOnly,
            initial_window: IW,
            ..CcConfig::new()
        };
        f.allocators = self != Mode::EcnOnly;
        f.buffer_bytes = 512 << 10;
        f
    }
}

#[derive(Clone, Debug)]
struct Row {
    mode: Mode,
    n: usize,
    /// Bottleneck utilisation after the first 100 us, %.
    util: f64,
    /// Jain's index of the senders' bytes through the bottleneck after the first 100 us.
    jain: f64,
    peak_kib: f64,
    /// Time from the start until the queue stays below twice the marking threshold, in
    /// base RTTs (None: never within the run).
    settle_rtts: Option<f64>,
    drops: u64,
    retransmits: u64,
    /// Time from the start until every sender paces at no more than its equal share (+10%),
    /// in base RTTs (None: no grants in this mode); and the incast's first round trip (base
    /// RTT plus draining every sender's initial window), in base RTTs.
    grant_rtts: Option<f64>,
    first_round_rtts: f64,
}

/// Base RTT of the fabric: four hops and two full packets' serialisation.
fn base_rtt(f: &FabricConfig) -> f64 {
    (4 * f.hop_delay_ns + 2 * f.wire_ns(f.mtu as usize + 64)) as f64
}

const IW: u32 = 4;
const RUN_NS: u64 = 4_000_000;
const WARMUP_NS: u64 = 100_000;

fn run(mode: Mode, n: usize) -> Row {
    let cfg = mode.config();
    let rtt = base_rtt(&cfg);
    let mut f = Fabric::new(cfg, n + 1);
    let start = f.now;
    let senders: Vec<usize> = (1..=n).map(|s| f.add_flow(s, 0)).collect();
    let fair = f.cfg.rate_mbps as f64 * 0.95 / n as f64;
    let mut last_unfair = start;
    let mut probe = |f: &Fabric| {
        let off = senders.iter().any(|&i| {
            let r = f.ends[i].conn.congestion().pacing_rate() as f64;
            r == 0.0 || r > fair * 1.1
        });
        if off {
            last_unfair = f.now;
        }
    };
    f.run_with(start + WARMUP_NS, &mut probe);
    f.start_measuring();
    f.run_with(start + RUN_NS, &mut probe);
    let grant_rtts = (mode != Mode::EcnOnly).then(|| (last_unfair - start) as f64 / rtt);
    // The first round trip of an incast includes draining everyone's first window.
    let first_round =
        rtt + (n as u64 * u64::from(IW)) as f64 * f.cfg.wire_ns(f.cfg.mtu as usize + 64) as f64;
    let p = &f.ports[0];
    let dur = (f.now - f.measure_from) as f64;
    let util = p.tx_bytes as f64 * 8.0 * 1000.0 / (f.cfg.rate_mbps as f64 * dur) * 100.0;
    let per: Vec<f64> = (1..=n)
        .map(|s| *p.tx_by_src.get(&s).unwrap_or(&0) as f64)
        .collect();
    let settle = if f.now - p.last_above < 200_000 && p.max_queue > f.settle_bytes {
        None
    } else {
        Some(p.last_above.saturating_sub(start) as f64 / rtt)
    };
    Row {
        mode,
        n,
        util,
        jain: jain(&per),
        peak_kib: p.max_queue as f64 / 1024.0,
        settle_rtts: settle,
        drops: f.ports.iter().map(|p| p.drops).sum(),
        retransmits: senders
            .iter()
            .map(|&i| f.ends[i].conn.stats().retransmits)
            .sum(),
        grant_rtts,
        first_round_rtts: first_round / rtt,
    }
}

fn print(rows: &[Row]) {
    println!(
        "{:<9} {:>3} {:>7} {:>6} {:>9} {:>11} {:>6} {:>7} {:>10} {:>12}",
        "mode",
        "N",
        "util%",
        "jain",
        "peak KiB",
        "settle RTT",
        "drops",
        "retx",
        "grant RTT",
        "1st round RTT"
    );
    for r in rows {
        println!(
            "{:<9} {:>3} {:>7.1} {:>6.3} {:>9.1} {:>11} {:>6} {:>7} {:>10} {:>12.1}",
            format!("{:?}", r.mode),
            r.n,
            r.util,
            r.jain,
            r.peak_kib,
            r.settle_rtts
                .map_or("never".to_string(), |s| format!("{s:.1}")),
            r.drops,
            r.retransmits,
            r.grant_rtts.map_or("-".to_string(), |s| format!("{s:.1}")),
            r.first_round_rtts
        );
    }
}

#[test]
fn incast_table() {
    let ns = [2, 4, 8, 16, 32, 64];
    let mut rows = Vec::new();
    for mode in [Mode::Full, Mode::EcnOnly, Mode::RateOnly] {
        for n in ns {
            rows.push(run(mode, n));
        }
    }
    print(&rows);
    let row = |m: Mode, n: usize| rows.iter().find(|r| r.mode == m && r.n == n).unwrap();
    for n in ns {
        let r = row(Mode::Full, n);
        assert!(r.util >= 90.0, "{r:?}");
        assert!(r.jain >= 0.99, "{r:?}");
        assert_eq!(r.drops, 0, "{r:?}");
        assert_eq!(r.retransmits, 0, "{r:?}");
        let told = r.grant_rtts.unwrap();
        assert!(
            told <= r.first_round_rtts + 2.0,
            "every sender told its share: {r:?}"
        );
        let settled = r.settle_rtts.expect("the queue settles");
        assert!(settled <= r.first_round_rtts + 10.0, "{r:?}");
        let e = row(Mode::EcnOnly, n);
        assert!(
            r.drops <= e.drops && r.peak_kib <= e.peak_kib,
            "{r:?} vs {e:?}"
        );
        let q = row(Mode::RateOnly, n);
        assert!(q.util >= 90.0 && q.jain >= 0.99, "{q:?}");
    }
    // ECN alone keeps a standing queue, and at 64 senders overflows the buffer.
    assert!(row(Mode::EcnOnly, 64).drops > 0);
    let (e, full) = (row(Mode::EcnOnly, 16), row(Mode::Full, 16));
    assert!(e.peak_kib > 2.0 * full.peak_kib, "{e:?} vs {full:?}");
    // The receiver's rate alone settles a large incast's queue slower than with ECN.
    let (full, rate) = (row(Mode::Full, 64), row(Mode::RateOnly, 64));
    assert!(
        full.settle_rtts.unwrap() < rate.settle_rtts.unwrap(),
        "{full:?} vs {rate:?}"
    );
}

/// A sender that joins a running incast is told its share within about one RTT of its first
/// packet (plus the ACK delay), and so are the others.
#[test]
fn new_sender_gets_its_share_within_an_rtt() {
    let cfg = Mode::Full.config();
    let rtt = base_rtt(&cfg);
    let n = 8;
    let mut f = Fabric::new(cfg, n + 2);
    let start = f.now;
    let mut senders: Vec<usize> = (1..=n).map(|s| f.add_flow(s, 0)).collect();
    f.run(start + 500_000);
    let joined = f.now;
    senders.push(f.add_flow(n + 1, 0));
    let fair = f.cfg.rate_mbps as f64 * 0.95 / (n + 1) as f64;
    let (mut new_told, mut all_told) = (None, None);
    f.run_with(joined + 200_000, |f| {
        let rate = |i: usize| f.ends[i].conn.congestion().pacing_rate() as f64;
        let ok = |i: usize| rate(i) > 0.0 && rate(i) <= fair * 1.1;
        if new_told.is_none() && ok(*senders.last().unwrap()) {
            new_told = Some(f.now - joined);
        }
        if all_told.is_none() && senders.iter().all(|&i| ok(i)) {
            all_told = Some(f.now - joined);
        }
    });
    let (new_told, all_told) = (
        new_told.unwrap() as f64 / rtt,
        all_told.unwrap() as f64 / rtt,
    );
    println!("join: new sender told after {new_told:.2} base RTTs, everyone after {all_told:.2}");
    // One RTT plus the receiver's ACK delay (5 us here, half a base RTT).
    assert!(new_told <= 2.0, "{new_told}");
    assert!(all_told <= 3.0, "{all_told}");
}

/// A flow to another receiver, from a host that also takes part in an incast, keeps its
/// throughput: the incast's congestion stays at the incast's port and connection.
#[test]
fn victim_flow_keeps_its_throughput() {
    let n = 16;
    let victim_rx = n + 1;
    let measure = |incast: bool| {
        let mut f = Fabric::new(Mode::Full.config(), n + 2);
        let start = f.now;
        f.add_flow(1, victim_rx);
        if incast {
            for s in 1..=n {
                f.add_flow(s, 0);
            }
        }
        f.run(start + WARMUP_NS);
        f.start_measuring();
        f.run(start + 2_000_000);
        let dur = (f.now - f.measure_from) as f64;
        let mbps = |p: usize| f.ports[p].tx_bytes as f64 * 8.0 * 1000.0 / dur;
        (
            mbps(victim_rx),
            mbps(0),
            f.ports.iter().map(|p| p.drops).sum::<u64>(),
        )
    };
    let (alone, _, _) = measure(false);
    let (victim, incast, drops) = measure(true);
    println!(
        "victim: {alone:.0} Mbit/s alone, {victim:.0} Mbit/s during a {n}-to-1 incast \
         ({incast:.0} Mbit/s into the incast port, {drops} drops)"
    );
    // The victim's host also sends its 1/16 share into the incast over the same NIC.
    let nic_left = 10_000.0 - 10_000.0 / n as f64;
    assert!(victim >= 0.9 * alone.min(nic_left), "{victim} vs {alone}");
    assert!(incast >= 9_000.0);
    assert_eq!(drops, 0);
}

/// The bottleneck is a marking hop before the receiver, slower than the capacity the
/// receiver's allocator divides (in the kernel: the allocator assumes 10 Gbit/s, a router's
/// rate limit is 40 Mbit/s). The grants alone would not hold the senders back; the allocator
/// measures what arrives while the marks say a queue is building and grants from that. Without
/// the estimate (the old behaviour) the senders rely on their ECN windows alone and keep a
/// standing queue; with it the queue settles and utilisation stays high.
#[test]
fn bottleneck_before_the_receiver_is_measured() {
    let run = |n: usize, estimate: bool| {
        let cfg = Mode::Full.config();
        let rate = cfg.rate_mbps as u32;
        let mut f = Fabric::new(cfg, n + 1);
        // The receiver believes it has four times the port's rate.
        let period = if estimate { 100_000 } else { u64::MAX / 4 };
        f.allocs[0] = RateAllocator::new(rate * 4)
            .with_epoch(100_000)
            .with_interval(20_000)
            .with_rate_period(period);
        let start = f.now;
        let senders: Vec<usize> = (1..=n).map(|s| f.add_flow(s, 0)).collect();
        f.run(start + 1_000_000);
        f.start_measuring();
        let mut queue_sum = 0.0f64;
        let mut samples = 0.0f64;
        f.run_with(start + RUN_NS, |f| {
            queue_sum += f.ports[0].queued_bytes as f64;
            samples += 1.0;
        });
        let p = &f.ports[0];
        let dur = (f.now - f.measure_from) as f64;
        let util = p.tx_bytes as f64 * 8.0 * 1000.0 / (f.cfg.rate_mbps as f64 * dur) * 100.0;
        let per: Vec<f64> = (1..=n)
            .map(|s| *p.tx_by_src.get(&s).unwrap_or(&0) as f64)
            .collect();
        let retx: u64 = senders
            .iter()
            .map(|&i| f.ends[i].conn.stats().retransmits)
            .sum();
        let drops: u64 = f.ports.iter().map(|p| p.drops).sum();
        let est = f.allocs[0].effective_capacity();
        let q = queue_sum / samples.max(1.0) / 1024.0;
        println!(
            "bottleneck before the receiver, N={n:2}, estimate {estimate:5}: util {util:5.1}% \
             jain {:.3} mean queue {q:6.1} KiB drops {drops} retx {retx} (capacity used {est})",
            jain(&per)
        );
        (util, jain(&per), q, drops, retx)
    };
    for n in [8, 16] {
        let (util, j, q, drops, retx) = run(n, true);
        let (_, _, q_old, _, _) = run(n, false);
        assert!(util >= 85.0 && j >= 0.95, "N={n}: {util} {j}");
        assert_eq!((drops, retx), (0, 0), "N={n}");
        assert!(
            q < q_old,
            "N={n}: mean queue {q} vs {q_old} without the estimate"
        );
    }
}
