// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! The scenario table (`make sim`, `make sim-quick`): runs the scenarios with MetaRoCE and
//! both baselines and writes `report.md` and `results.csv`. The quick table (a small fabric,
//! seconds) also asserts properties: every collective completes with every byte delivered
//! and no failed message, and a second run of the same seed gives the same results.

use crate::fabric::{FailTarget, RX_BIN_NS};
use crate::scenario::{
    csv_header, csv_row, md_header, md_row, run, FailSpec, Outcome, Proto, Scenario,
};
use crate::workload::Kind;
use std::fmt::Write as _;
use std::path::Path;

struct Params {
    nodes: usize,
    hosts_per_leaf: usize,
    spines: usize,
    ar_bytes: u64,
    a2a_bytes: u64,
    incast_bytes: u64,
    losses: Vec<u32>,
    planes: Vec<usize>,
    /// All-Reduce bytes per node in the planes' table: large enough that a step is
    /// bandwidth-bound even with 8 planes.
    planes_bytes: u64,
    speed_nodes: Vec<usize>,
    speed_bytes: u64,
    /// All-to-All bytes per pair in the sizes' table.
    sizes: Vec<u64>,
    /// All-Reduce bytes per node in the All-Reduce sizes' table.
    ar_sizes: Vec<u64>,
    /// Seeds of the seeds' table (1 is the rest of the report's).
    seeds: Vec<u64>,
    /// Bytes each host sends in the many-QPs table.
    qps_bytes: u64,
    deadline_ns: u64,
}

impl Params {
    fn full() -> Self {
        Params {
            nodes: 64,
            hosts_per_leaf: 8,
            spines: 8,
            ar_bytes: 16 << 20,
            a2a_bytes: 256 << 10,
            incast_bytes: 4 << 20,
            losses: vec![10_000, 100_000],
            planes: vec![1, 4, 8],
            planes_bytes: 64 << 20,
            speed_nodes: vec![16, 64, 256],
            speed_bytes: 8 << 20,
            seeds: (1..=8).collect(),
            qps_bytes: 8 << 20,
            sizes: vec![8 << 10, 64 << 10, 1 << 20],
            ar_sizes: vec![1 << 20, 16 << 20, 256 << 20, 1 << 30],
            deadline_ns: 200_000_000,
        }
    }

    fn quick() -> Self {
        Params {
            nodes: 16,
            hosts_per_leaf: 4,
            spines: 4,
            ar_bytes: 1 << 20,
            a2a_bytes: 32 << 10,
            incast_bytes: 256 << 10,
            losses: vec![10_000],
            planes: vec![1, 4],
            planes_bytes: 4 << 20,
            speed_nodes: vec![16],
            speed_bytes: 1 << 20,
            seeds: vec![1, 2, 3],
            qps_bytes: 1 << 20,
            sizes: vec![8 << 10, 64 << 10],
            ar_sizes: vec![256 << 10, 4 << 20],
            deadline_ns: 100_000_000,
        }
    }

    fn scenario(&self, name: &str, kind: Kind, planes: usize) -> Scenario {
        let bytes = match kind {
            Kind::AllReduce => self.ar_bytes,
            Kind::AllToAll | Kind::AllToAllPairwise => self.a2a_bytes,
            Kind::Incast => self.incast_bytes,
            Kind::Shift => self.qps_bytes,
        };
        let mut sc = Scenario::new(name, kind, self.nodes, planes, bytes);
        sc.hosts_per_leaf = self.hosts_per_leaf;
        sc.spines = self.spines;
        sc.deadline_ns = self.deadline_ns;
        sc
    }
}

struct Report {
    md: String,
    csv: String,
    /// Per scenario: rocev2 and irn CCT over MetaRoCE's (None: a run did not finish).
    ratios: Vec<(String, Option<f64>, Option<f64>)>,
    problems: Vec<String>,
    check: bool,
}

impl Report {
    /// Runs `sc` with every transport, records the rows, checks the outcomes (quick mode).
    fn run_all(&mut self, sc: &Scenario) -> Vec<Outcome> {
        self.run_all_expecting(sc, false)
    }

    /// `baselines_may_fail`: only MetaRoCE must complete (a failure nothing routes around).
    fn run_all_expecting(&mut self, sc: &Scenario, baselines_may_fail: bool) -> Vec<Outcome> {
        let outs: Vec<Outcome> = Proto::ALL.iter().map(|&p| run(sc, p)).collect();
        for o in &outs {
            let _ = writeln!(self.csv, "{}", csv_row(sc, o, true));
            eprintln!(
                "{:>12} {:>9} n={} p={} loss={} {}: {} cct {:.1} us, {:.0} packets/s",
                sc.name,
                sc.kind.name(),
                sc.nodes,
                sc.planes,
                sc.loss_ppm,
                o.proto.name(),
                if o.completed { "done" } else { "DNF" },
                o.cct_ns as f64 / 1e3,
                o.packets_per_s()
            );
            let must = o.proto == Proto::Meta || !baselines_may_fail;
            if self.check && must && !o.correct() {
                self.problems.push(format!(
                    "{} {}: completed {} ({}/{} flows), failed messages {}, bytes placed {} of {}",
                    sc.name,
                    o.proto.name(),
                    o.completed,
                    o.flows_done,
                    o.flows,
                    o.counters.failed,
                    o.rx_bytes,
                    o.expected_bytes
                ));
            }
        }
        let ratio = |b: &Outcome| {
            (b.completed && outs[0].completed)
                .then(|| b.cct_ns as f64 / outs[0].cct_ns.max(1) as f64)
        };
        let label = format!("{} ({} planes)", sc.name, sc.planes);
        self.ratios.push((label, ratio(&outs[1]), ratio(&outs[2])));
        outs
    }
}

/// Many QPs: the same bytes per host over N QPs (one per host, to the host N/4 further),
/// over N(N-1) QPs (N-1 per pair of that permutation: 4,032 at 64 hosts) and over N(N-1) pairs
/// (All-to-All, one QP each). Aggregate goodput: all bytes over the CCT.
fn many_qps(r: &mut Report, p: &Params) {
    let n = p.nodes;
    let _ = writeln!(
        r.md,
        "\n## Many QPs ({n} hosts, 1 plane, {} MiB from each host)\n\n\
         The same bytes over {n} QPs, over {} (N-1 QPs for each pair of the same permutation: \
         MetaRoCE carries them as streams of one connection per host pair, the baselines as QPs \
         of their own, each its own source port and DCQCN state), and over {} flows of an \
         All-to-All (one per ordered pair). Goodput: all bytes / CCT, Gbit/s; kept: against the \
         {n}-QP row. State: MetaRoCE's transport state (both ends, `Connection` with its paths \
         and stream chunks) at its peak over the QPs.\n\n\
         | traffic | QPs | metaroce CCT us | rocev2 CCT us | irn CCT us | metaroce goodput | kept | \
         rocev2 goodput | kept | irn goodput | kept | metaroce state per QP KiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|",
        p.qps_bytes >> 20,
        n * (n - 1),
        n * (n - 1)
    );
    let goodput = |o: &Outcome| {
        if o.completed {
            o.expected_bytes as f64 * 8.0 / o.cct_ns.max(1) as f64
        } else {
            0.0
        }
    };
    let mut few: Option<Vec<f64>> = None;
    for (name, kind, qps) in [
        ("permutation", Kind::Shift, 1),
        ("permutation", Kind::Shift, n - 1),
        ("all-to-all", Kind::AllToAll, 1),
    ] {
        let mut sc = p.scenario(&format!("qps-{name}-{}", n * qps), kind, 1);
        sc.qps = qps as u16;
        if kind == Kind::AllToAll {
            sc.bytes = p.qps_bytes.div_ceil(n as u64 - 1);
        }
        let outs = r.run_all(&sc);
        let g: Vec<f64> = outs.iter().map(goodput).collect();
        let base = few.get_or_insert_with(|| g.clone()).clone();
        let kept = |i: usize| against(&g, &base, i, true);
        let _ = writeln!(
            r.md,
            "| {name} | {} | {} | {} | {} | {:.1} | {} | {:.1} | {} | {:.1} | {} | {:.1} |",
            outs[0].flows,
            us(&outs[0]),
            us(&outs[1]),
            us(&outs[2]),
            g[0],
            kept(0),
            g[1],
            kept(1),
            g[2],
            kept(2),
            outs[0].net.peak_state as f64 / 1024.0 / outs[0].flows as f64
        );
    }
}

/// Random loss on bulk transfers: the permutation of the many-QPs table (each host sends
/// `qps_bytes` to the host N/4 further, one QP each), lossless and through each loss rate on
/// every leaf-to-host link. This is what a throughput figure at a loss rate measures: no flow
/// waits on another, so a loss costs its flow only the resent packet if recovery overlaps
/// with new data. Goodput: each flow's bytes over its own lifetime, mean over the flows.
fn loss_bulk(r: &mut Report, p: &Params) {
    let n = p.nodes;
    let _ = writeln!(
        r.md,
        "\n## Random loss on bulk transfers ({n} flows, {} MiB each, host i to host i + {})\n\n\
         Loss on every leaf-to-host link, which each data packet crosses once. Goodput: mean \
         per-flow goodput, Gbit/s; kept: against the same transport's lossless goodput (a lossy \
         link's ceiling is 1 - loss: 99% at 1%, 90% at 10%).\n\n\
         | loss | metaroce CCT us | goodput | kept | rocev2 CCT us | goodput | kept | \
         irn CCT us | goodput | kept |\n\
         |---|---|---|---|---|---|---|---|---|---|",
        p.qps_bytes >> 20,
        n / 4
    );
    let rows = std::iter::once(0)
        .chain(p.losses.iter().copied())
        .map(|loss| {
            let mut sc = p.scenario(&format!("bulk-loss{}", loss / 10_000), Kind::Shift, 1);
            sc.loss_ppm = loss;
            (format!("{}%", loss as f64 / 1e4), sc)
        });
    goodput_rows(r, rows, true);
}

/// Planes on bulk transfers: the permutation of the many-QPs table with half the planes
/// table's bytes from each host, on 1, 4 and 8 planes. Throughput is what planes add: with
/// no step waiting on another, the per-flow goodput shows how much of the added ports a
/// transport uses (the All-Reduce's steps each add a round trip however many planes carry
/// them).
fn planes_bulk(r: &mut Report, p: &Params) {
    let n = p.nodes;
    let bytes = p.planes_bytes / 2;
    let _ = writeln!(
        r.md,
        "\n## Planes on bulk transfers ({n} flows, {} MiB each, host i to host i + {})\n\n\
         Goodput: mean per-flow goodput, Gbit/s; scaling: against the same transport on 1 \
         plane (ideal: the planes).\n\n\
         | planes | metaroce CCT us | goodput | scaling | rocev2 CCT us | goodput | scaling | \
         irn CCT us | goodput | scaling |\n\
         |---|---|---|---|---|---|---|---|---|---|",
        bytes >> 20,
        n / 4
    );
    let rows = p.planes.iter().map(|&planes| {
        let mut sc = p.scenario(&format!("bulk-planes{planes}"), Kind::Shift, planes);
        sc.bytes = bytes;
        (planes.to_string(), sc)
    });
    goodput_rows(r, rows, false);
}

/// Rows of a bulk table: per scenario its label, then each transport's CCT, mean per-flow
/// goodput and that goodput against the same transport's in the first row (`pct`: as a
/// percentage, else as a factor).
fn goodput_rows(r: &mut Report, rows: impl Iterator<Item = (String, Scenario)>, pct: bool) {
    let goodput = |o: &Outcome| if o.completed { o.goodput_mean } else { 0.0 };
    let mut first: Option<Vec<f64>> = None;
    for (label, sc) in rows {
        let outs = r.run_all(&sc);
        let g: Vec<f64> = outs.iter().map(goodput).collect();
        let base = first.get_or_insert_with(|| g.clone()).clone();
        let vs = |i: usize| against(&g, &base, i, pct);
        let _ = writeln!(
            r.md,
            "| {label} | {} | {:.1} | {} | {} | {:.1} | {} | {} | {:.1} | {} |",
            us(&outs[0]),
            g[0],
            vs(0),
            us(&outs[1]),
            g[1],
            vs(1),
            us(&outs[2]),
            g[2],
            vs(2)
        );
    }
}

/// Goodput `g[i]` against `base[i]`: a percentage (`pct`) or a factor, "-" where either is
/// zero (a run that did not finish).
fn against(g: &[f64], base: &[f64], i: usize, pct: bool) -> String {
    match (g.get(i), base.get(i)) {
        (Some(&x), Some(&b)) if x > 0.0 && b > 0.0 && pct => format!("{:.1}%", 100.0 * x / b),
        (Some(&x), Some(&b)) if x > 0.0 && b > 0.0 => format!("{:.2}", x / b),
        _ => "-".into(),
    }
}

/// A failure's recovery is judged by the data delivered over windows of this length...
const RECOVERY_WINDOW_NS: u64 = 50_000;
/// ...against this share of the rate before the failure...
const RECOVERY_SHARE_PCT: u64 = 90;
/// ...measured over this long before it...
const RECOVERY_BEFORE_NS: u64 = 200_000;
/// ...until 2 ms after the failure (its reroute is 1 ms) or this long before the run's end
/// (a collective's last steps deliver less as flows finish).
const RECOVERY_TAIL_NS: u64 = 200_000;

/// The share of its capacity a fabric of `planes` planes keeps when `target` fails: a
/// plane takes its share of every host's ports; a link or spine leaves the hosts' ports and
/// (after the reroute) routes around it.
pub fn capacity_left(target: &FailTarget, planes: usize) -> f64 {
    match target {
        FailTarget::Plane { .. } => 1.0 - 1.0 / planes.max(1) as f64,
        _ => 1.0,
    }
}

/// How long after a failure at `at` ns the data delivered to all hosts (`RunStats::rx_bins`)
/// over a [`RECOVERY_WINDOW_NS`] window was last below [`RECOVERY_SHARE_PCT`] of its rate
/// before the failure times `left` (the share of the capacity the failure left: 3/4 after
/// one plane of four), and the lowest window's rate against the rate before: "0 (97%)" when
/// it never dropped below. "-" for a run that did not finish or had nothing before the
/// failure. Meant for a workload whose flows end together (MetaRoCE's: Jain 0.99 or more):
/// where flows end over a long tail, the rate falls as they do, failure or not.
pub fn recovery(o: &Outcome, at: u64, left: f64) -> String {
    let bins = &o.net.rx_bins;
    let per = |ns: u64| (ns / RX_BIN_NS) as usize;
    let (w, before) = (
        per(RECOVERY_WINDOW_NS).max(1),
        per(RECOVERY_BEFORE_NS).max(1),
    );
    let first = per(at);
    if !o.completed || first < before || bins.len() < first {
        return "-".into();
    }
    let rate_before = bins[first - before..first].iter().sum::<u64>() as f64 / before as f64;
    let end_ns = o
        .cct_ns
        .saturating_sub(RECOVERY_TAIL_NS)
        .min(at.saturating_add(2_000_000));
    let last = per(end_ns).min(bins.len());
    if rate_before <= 0.0 || last < first + w {
        return "-".into();
    }
    let (mut below_until, mut lowest) = (None, f64::MAX);
    for k in first..=last - w {
        let share = bins[k..k + w].iter().sum::<u64>() as f64 / w as f64 / rate_before;
        lowest = lowest.min(share);
        if share * 100.0 < RECOVERY_SHARE_PCT as f64 * left {
            below_until = Some((k + w) as u64 * RX_BIN_NS);
        }
    }
    let after = below_until.map_or(0.0, |t| t.saturating_sub(at) as f64 / 1e3);
    format!("{after:.0} ({:.0}%)", 100.0 * lowest)
}

/// A horizontal bar chart of the ratios, by hand: two bars per scenario (rocev2, irn), a
/// line at 1 (MetaRoCE's own CCT), "DNF" where a run did not finish.
fn ratios_svg(rows: &[(String, Option<f64>, Option<f64>)]) -> String {
    let max = rows
        .iter()
        .flat_map(|(_, a, b)| [a.unwrap_or(0.0), b.unwrap_or(0.0)])
        .fold(1.0f64, f64::max)
        .ceil();
    let (left, width, row_h) = (190.0, 520.0, 34.0);
    let height = 60.0 + row_h * rows.len() as f64;
    let x = |v: f64| left + width * v / max;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n\
         <text x=\"10\" y=\"16\" font-size=\"13\">Baseline CCT / MetaRoCE CCT \
         (right of the line: MetaRoCE faster)</text>\n\
         <rect x=\"{left}\" y=\"24\" width=\"10\" height=\"10\" fill=\"#c0504d\"/>\
         <text x=\"{}\" y=\"33\">rocev2</text>\n\
         <rect x=\"{}\" y=\"24\" width=\"10\" height=\"10\" fill=\"#4f81bd\"/>\
         <text x=\"{}\" y=\"33\">irn</text>\n",
        left + width + 60.0,
        left + 14.0,
        left + 70.0,
        left + 84.0
    );
    for (i, (label, a, b)) in rows.iter().enumerate() {
        let y = 44.0 + row_h * i as f64;
        let _ = writeln!(s, "<text x=\"10\" y=\"{}\">{label}</text>", y + 18.0);
        for (k, (v, color)) in [(a, "#c0504d"), (b, "#4f81bd")].into_iter().enumerate() {
            let yy = y + 4.0 + 13.0 * k as f64;
            match v {
                Some(v) => {
                    let _ = writeln!(
                        s,
                        "<rect x=\"{left}\" y=\"{yy}\" width=\"{:.1}\" height=\"11\" fill=\"{color}\"/>\
                         <text x=\"{:.1}\" y=\"{}\">{v:.2}</text>",
                        x(*v) - left,
                        x(*v) + 4.0,
                        yy + 10.0
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "<text x=\"{left}\" y=\"{}\" fill=\"{color}\">DNF</text>",
                        yy + 10.0
                    );
                }
            }
        }
    }
    let _ = writeln!(
        s,
        "<line x1=\"{0:.1}\" y1=\"40\" x2=\"{0:.1}\" y2=\"{1}\" stroke=\"black\"/>\
         <text x=\"{2:.1}\" y=\"{3}\">1</text>\n<text x=\"{4:.1}\" y=\"{3}\">{max}</text>\n</svg>",
        x(1.0),
        height - 12.0,
        x(1.0) - 3.0,
        height - 2.0,
        x(max) - 8.0
    );
    s
}

fn us(o: &Outcome) -> String {
    if o.completed {
        format!("{:.1}", o.cct_ns as f64 / 1e3)
    } else {
        format!("DNF ({}/{})", o.flows_done, o.flows)
    }
}

/// `o`'s CCT over `base`'s, two decimals (how many times faster `base` was), or "-" if either
/// did not complete.
fn ratio(base: &Outcome, o: &Outcome) -> String {
    if o.completed && base.completed {
        format!("{:.2}", o.cct_ns as f64 / base.cct_ns.max(1) as f64)
    } else {
        "-".into()
    }
}

/// `base` CCT over `o`'s, as a percentage (the share of the baseline's speed kept).
fn kept(base: &Outcome, o: &Outcome) -> String {
    if o.completed && base.completed {
        format!(
            "{:.1}%",
            100.0 * base.cct_ns as f64 / o.cct_ns.max(1) as f64
        )
    } else {
        "-".into()
    }
}

/// The core of the table at `n` hosts (the same fabric shape, more leaves): All-Reduce of
/// 16 MiB per node, the pairwise All-to-All of the same 16 MiB from each node, All-Reduce
/// through 1% loss and on 4 planes; then what each run cost the simulator.
fn at_scale(r: &mut Report, p: &Params, n: usize) {
    let mut q = Params {
        nodes: n,
        ..Params::full()
    };
    q.deadline_ns = p.deadline_ns;
    let a2a = (q.ar_bytes / (n as u64 - 1)).max(4096) / 4096 * 4096;
    let _ = writeln!(
        r.md,
        "\n## At {n} hosts\n\n\
         The same fabric with {} leaves: All-Reduce of {} MiB per node, the pairwise \
         All-to-All (N-1 rounds) of {} KiB per pair (the same bytes from each node), \
         All-Reduce through 1% loss and on 4 planes; then bulk transfers (`bulk`: each host \
         {} MiB to the host N/4 further) lossless, through 1% and 10% loss, on 4 and 8 \
         planes, over 4 QPs per pair ({} QPs), and with spine 0 failing halfway through \
         MetaRoCE's lossless run (rerouted around 1 ms later).\n\n{}",
        n.div_ceil(q.hosts_per_leaf),
        q.ar_bytes >> 20,
        a2a >> 10,
        q.qps_bytes >> 20,
        4 * n,
        md_header().trim_end()
    );
    let mut cost = Vec::new();
    for (name, kind, planes, loss) in [
        ("allreduce", Kind::AllReduce, 1, 0),
        ("a2a-pairwise", Kind::AllToAllPairwise, 1, 0),
        ("loss1", Kind::AllReduce, 1, 10_000),
        ("planes4", Kind::AllReduce, 4, 0),
    ] {
        let mut sc = q.scenario(&format!("{name}-n{n}"), kind, planes);
        sc.loss_ppm = loss;
        if kind == Kind::AllToAllPairwise {
            sc.bytes = a2a;
        }
        let outs = r.run_all(&sc);
        r.md.push_str(&md_row(&sc, &outs));
        cost.push((sc, outs));
    }
    // Bulk transfers at this scale: the permutation (each host `qps_bytes` to the host N/4
    // further) lossless, through 1% and 10% loss, on 4 and 8 planes, over 4 QPs per pair,
    // and with a spine failing halfway through MetaRoCE's lossless run.
    let mut half = 0;
    for (name, planes, loss, qps, spine) in [
        ("bulk", 1, 0, 1, false),
        ("bulk-loss1", 1, 10_000, 1, false),
        ("bulk-loss10", 1, 100_000, 1, false),
        ("bulk-planes4", 4, 0, 1, false),
        ("bulk-planes8", 8, 0, 1, false),
        ("bulk-qps4", 1, 0, 4, false),
        ("bulk-spine", 1, 0, 1, true),
    ] {
        let mut sc = q.scenario(&format!("{name}-n{n}"), Kind::Shift, planes);
        sc.loss_ppm = loss;
        sc.qps = qps;
        if spine {
            sc.fail = Some(FailSpec {
                target: FailTarget::Spine { plane: 0, spine: 0 },
                at_ns: half,
                dur_ns: u64::MAX / 4,
            });
        }
        let outs = r.run_all(&sc);
        if half == 0 {
            half = outs[0].cct_ns / 2;
        }
        r.md.push_str(&md_row(&sc, &outs));
        cost.push((sc, outs));
    }
    let _ = writeln!(
        r.md,
        "\nWhat the runs cost the simulator (wall time on this machine, shared; endpoints: \
         connection ends alive at once, of those made; state: MetaRoCE's `Connection`s at \
         their peak; the process's peak RSS per run, measured apart with `/usr/bin/time -v`, \
         is in sim/README.md).\n\n\
         | scenario | transport | wall s | packets | packets/s | endpoints (made) | state MiB |\n\
         |---|---|---|---|---|---|---|"
    );
    for (sc, outs) in &cost {
        for o in outs {
            let _ = writeln!(
                r.md,
                "| {} | {} | {:.1} | {} | {:.0} | {} ({}) | {} |",
                sc.name,
                o.proto.name(),
                o.wall_s,
                o.net.packets,
                o.packets_per_s(),
                o.net.peak_ends,
                o.net.ends_made,
                if o.net.peak_state > 0 {
                    format!("{:.0}", o.net.peak_state as f64 / (1 << 20) as f64)
                } else {
                    "-".into()
                }
            );
        }
    }
}

/// The scenario table (quick: a small fabric, with checks), then the core of it again at
/// each of `scale` hosts.
pub fn table(quick: bool, out: &Path, scale: &[usize]) -> Result<(), String> {
    let p = if quick {
        Params::quick()
    } else {
        Params::full()
    };
    let mut r = Report {
        md: String::new(),
        csv: format!("{}\n", csv_header()),
        ratios: Vec::new(),
        problems: Vec::new(),
        check: quick,
    };
    let _ = writeln!(
        r.md,
        "# metaroce-sim report{}\n\nFabric: {} hosts, {} per leaf, {} spines per plane, 100 Gbit/s \
         ports and links, 1 us per link, 512 KiB port buffers, ECN above 100 KiB, MTU 4096. \
         Baselines: RoCEv2-like (go-back-N, DCQCN, one source port per QP, one QP per plane) and \
         IRN-like (selective repeat, BDP window, DCQCN). CCT: collective completion time. Ratios: \
         baseline CCT / MetaRoCE CCT (above 1: MetaRoCE faster). Seed 1.\n",
        if quick { " (quick)" } else { "" },
        p.nodes,
        p.hosts_per_leaf,
        p.spines
    );

    // Collectives against the baselines.
    let _ = writeln!(r.md, "## Collectives\n\n{}", md_header().trim_end());
    let mut base_ar = None;
    for (name, kind) in [
        ("allreduce", Kind::AllReduce),
        ("alltoall", Kind::AllToAll),
        ("a2a-pairwise", Kind::AllToAllPairwise),
        ("incast", Kind::Incast),
    ] {
        let sc = p.scenario(name, kind, 1);
        let outs = r.run_all(&sc);
        r.md.push_str(&md_row(&sc, &outs));
        if kind == Kind::AllReduce {
            base_ar = Some(outs);
        }
    }
    let base_ar = base_ar.unwrap();
    {
        let sc = p.scenario("alltoall-4p", Kind::AllToAll, 4);
        let outs = r.run_all(&sc);
        r.md.push_str(&md_row(&sc, &outs));
    }
    // Control: one switch, no ECMP choice to make; the transports should agree here.
    for (name, kind) in [
        ("allreduce-1sw", Kind::AllReduce),
        ("alltoall-1sw", Kind::AllToAll),
    ] {
        let mut sc = p.scenario(name, kind, 1);
        sc.hosts_per_leaf = sc.nodes;
        let outs = r.run_all(&sc);
        r.md.push_str(&md_row(&sc, &outs));
    }
    let _ = writeln!(
        r.md,
        "\n(`-1sw`: all hosts on one switch, a control without ECMP collisions.)"
    );

    // MetaRoCE's congestion control variants on the incast.
    let _ = writeln!(
        r.md,
        "\n## MetaRoCE congestion control on the incast ({} to 1)\n\n\
         Full: ECN windows and the receiver's grant; ecn-only: no grants; rate-only: windows \
         ignore ECN. IW: `CcConfig::initial_window` (default 16 packets per plane, here one).\n\n\
         | variant | IW | CCT us | retx % | timeouts | drops | max queue KiB |\n\
         |---|---|---|---|---|---|---|",
        p.nodes - 1
    );
    for (name, ecn, rate, iw) in [
        ("full", true, true, 16),
        ("ecn-only", true, false, 16),
        ("rate-only", false, true, 16),
        ("full", true, true, 4),
    ] {
        let mut sc = p.scenario(&format!("incast-{name}-iw{iw}"), Kind::Incast, 1);
        sc.meta_cc.ecn = ecn;
        sc.meta_cc.receiver_rate = rate;
        sc.meta_cc.initial_window = iw;
        let o = run(&sc, Proto::Meta);
        let _ = writeln!(r.csv, "{}", csv_row(&sc, &o, true));
        if r.check && !o.correct() {
            r.problems.push(format!("{}: incomplete", sc.name));
        }
        let _ = writeln!(
            r.md,
            "| {name} | {iw} | {} | {:.2} | {} | {} | {:.0} |",
            us(&o),
            100.0 * o.counters.retransmits as f64 / o.counters.data_packets.max(1) as f64,
            o.counters.timeouts,
            o.net.drops,
            o.net.max_queue as f64 / 1024.0
        );
    }

    many_qps(&mut r, &p);

    // All-Reduce sizes: from steps of a few packets per flow to bandwidth-bound ones.
    let _ = writeln!(
        r.md,
        "\n## All-Reduce sizes (1 plane, lossless; a step carries bytes / {} per flow)\n\n\
         | bytes per node | metaroce CCT us | rocev2 CCT us | irn CCT us | rocev2/metaroce | irn/metaroce |\n\
         |---|---|---|---|---|---|",
        p.nodes
    );
    for &bytes in &p.ar_sizes {
        let mut sc = p.scenario(&format!("ar-{}k", bytes >> 10), Kind::AllReduce, 1);
        sc.bytes = bytes;
        // A 1 GiB All-Reduce takes tens of ms even lossless; the baselines' longer.
        sc.deadline_ns = sc.deadline_ns.max(bytes.saturating_mul(2));
        let outs = r.run_all(&sc);
        let q = |i: usize| ratio(&outs[0], &outs[i]);
        let _ = writeln!(
            r.md,
            "| {} MiB | {} | {} | {} | {} | {} |",
            bytes as f64 / (1 << 20) as f64,
            us(&outs[0]),
            us(&outs[1]),
            us(&outs[2]),
            q(1),
            q(2)
        );
    }

    // Message sizes.
    let _ = writeln!(
        r.md,
        "\n## Message sizes (All-to-All, 1 plane, lossless and 1% loss)\n\n\
         | bytes per pair | loss | metaroce CCT us | rocev2 CCT us | irn CCT us | rocev2/metaroce | irn/metaroce |\n\
         |---|---|---|---|---|---|---|"
    );
    for &bytes in &p.sizes {
        for loss in [0, 10_000] {
            let mut sc = p.scenario(
                &format!("a2a-{}k-loss{}", bytes >> 10, loss / 10_000),
                Kind::AllToAll,
                1,
            );
            sc.bytes = bytes;
            sc.loss_ppm = loss;
            let outs = r.run_all(&sc);
            let q = |i: usize| ratio(&outs[0], &outs[i]);
            let _ = writeln!(
                r.md,
                "| {} KiB | {}% | {} | {} | {} | {} | {} |",
                bytes >> 10,
                loss as f64 / 1e4,
                us(&outs[0]),
                us(&outs[1]),
                us(&outs[2]),
                q(1),
                q(2)
            );
        }
    }

    // Seeds: how much of the gap is one draw of ring order, hashes and source ports.
    let _ = writeln!(
        r.md,
        "\n## Seeds (All-Reduce, 1 plane, lossless)\n\n\
         The seed draws the ring order, the switches' hash seeds and the source ports.\n\n\
         | seed | metaroce CCT us | rocev2 CCT us | irn CCT us | rocev2/metaroce | irn/metaroce |\n\
         |---|---|---|---|---|---|"
    );
    let mut sums = (0.0, 0.0, 0usize);
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for &seed in &p.seeds {
        let outs = if seed == 1 {
            base_ar.clone()
        } else {
            let mut sc = p.scenario(&format!("seed{seed}"), Kind::AllReduce, 1);
            sc.seed = seed;
            r.run_all(&sc)
        };
        let q = |i: usize| outs[i].cct_ns as f64 / outs[0].cct_ns.max(1) as f64;
        if outs.iter().all(|o| o.completed) {
            sums = (sums.0 + q(1), sums.1 + q(2), sums.2 + 1);
            lo = lo.min(q(1));
            hi = hi.max(q(1));
        }
        let _ = writeln!(
            r.md,
            "| {seed} | {} | {} | {} | {:.2} | {:.2} |",
            us(&outs[0]),
            us(&outs[1]),
            us(&outs[2]),
            q(1),
            q(2)
        );
    }
    if sums.2 > 0 {
        let n = sums.2 as f64;
        let _ = writeln!(
            r.md,
            "| mean | | | | {:.2} (min {lo:.2}, max {hi:.2}) | {:.2} |",
            sums.0 / n,
            sums.1 / n
        );
    }

    // Random loss: the share of the lossless speed each transport keeps.
    let _ = writeln!(
        r.md,
        "\n## Random loss (All-Reduce; loss on every leaf-to-host link, or on every leaf-spine link)\n\n\
         Kept: lossless CCT / lossy CCT of the same transport.\n\n\
         | loss | metaroce CCT us | kept | rocev2 CCT us | kept | irn CCT us | kept | rocev2/metaroce | irn/metaroce |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    let mut variants: Vec<(u32, bool)> = p.losses.iter().map(|&l| (l, false)).collect();
    variants.push((10_000, true));
    for (loss, core) in variants {
        let mut sc = p.scenario(
            &format!("{}loss{}", if core { "core-" } else { "" }, loss / 10_000),
            Kind::AllReduce,
            1,
        );
        if core {
            sc.core_loss_ppm = loss;
        } else {
            sc.loss_ppm = loss;
        }
        let outs = r.run_all(&sc);
        let _ = writeln!(
            r.md,
            "| {}%{} | {} | {} | {} | {} | {} | {} | {} | {} |",
            loss as f64 / 1e4,
            if core { " on leaf-spine links" } else { "" },
            us(&outs[0]),
            kept(&base_ar[0], &outs[0]),
            us(&outs[1]),
            kept(&base_ar[1], &outs[1]),
            us(&outs[2]),
            kept(&base_ar[2], &outs[2]),
            ratio(&outs[0], &outs[1]),
            ratio(&outs[0], &outs[2]),
        );
    }
    loss_bulk(&mut r, &p);

    // Planes.
    let _ = writeln!(
        r.md,
        "\n## Planes (All-Reduce of {} MiB per node; each plane adds a 100 Gbit/s port per host)\n\n\
         Speed-up: CCT with 1 plane / CCT with P planes (ideal: P).\n\n\
         | planes | metaroce CCT us | speed-up | rocev2 CCT us | speed-up | irn CCT us | speed-up | rocev2/metaroce | irn/metaroce |\n\
         |---|---|---|---|---|---|---|---|---|",
        p.planes_bytes >> 20
    );
    let mut one: Option<Vec<Outcome>> = None;
    for &planes in &p.planes {
        let mut sc = p.scenario(&format!("planes{planes}"), Kind::AllReduce, planes);
        sc.bytes = p.planes_bytes;
        let outs = r.run_all(&sc);
        let base = one.get_or_insert_with(|| outs.clone());
        let up = |i: usize| {
            if outs[i].completed && base[i].completed {
                format!(
                    "{:.2}",
                    base[i].cct_ns as f64 / outs[i].cct_ns.max(1) as f64
                )
            } else {
                "-".into()
            }
        };
        let vs = |i: usize| ratio(&outs[0], &outs[i]);
        let _ = writeln!(
            r.md,
            "| {planes} | {} | {} | {} | {} | {} | {} | {} | {} |",
            us(&outs[0]),
            up(0),
            us(&outs[1]),
            up(1),
            us(&outs[2]),
            up(2),
            vs(1),
            vs(2)
        );
    }

    planes_bulk(&mut r, &p);

    // A failure in the middle of a collective, or of bulk transfers.
    let base4 = r.run_all(&p.scenario("planes4-ar", Kind::AllReduce, 4));
    let bulk = r.run_all(&p.scenario("bulk-base", Kind::Shift, 1));
    let _ = writeln!(
        r.md,
        "\n## Failure\n\n\
         Something fails halfway through MetaRoCE's lossless run of the same workload and \
         fabric ({:.0} us into the All-Reduce on 1 plane, {:.0} us on 4, {:.0} us into the \
         bulk permutation of {} MiB per host) until the end: a leaf-spine link (leaf 0 - \
         spine 0 of plane 0) or a whole spine (spine 0 of plane 0), which the leaves route \
         around 1 ms after it failed; or, on a 4-plane fabric, all of plane 0 (nothing to \
         route around: the baselines' QPs on it never finish, DNF at the {} ms limit). Kept: \
         CCT without the failure / CCT with it. Recovery: how long after the failure the data \
         delivered to all hosts over {} us was last below {}% of its rate in the {} us before \
         the failure (of 3/4 of it after a plane failure, which takes a quarter of the \
         capacity), looked at until 2 ms after the failure or {} us before the end, whichever \
         is first (0: never below), and the lowest such rate: MetaRoCE's only, whose flows \
         end together (the baselines' end over a long tail, and their rate falls as they \
         do). A ring All-Reduce waits for its slowest step: one stalled flow stalls them \
         all.\n\n\
         | failure | workload | planes | metaroce CCT us | kept | recovery us (lowest) | \
         rocev2 CCT us | kept | irn CCT us | kept |\n\
         |---|---|---|---|---|---|---|---|---|---|",
        base_ar[0].cct_ns as f64 / 2e3,
        base4[0].cct_ns as f64 / 2e3,
        bulk[0].cct_ns as f64 / 2e3,
        p.qps_bytes >> 20,
        p.deadline_ns / 1_000_000,
        RECOVERY_WINDOW_NS / 1_000,
        RECOVERY_SHARE_PCT,
        RECOVERY_BEFORE_NS / 1_000,
        RECOVERY_TAIL_NS / 1_000
    );
    let link = FailTarget::Link {
        plane: 0,
        leaf: 0,
        spine: 0,
    };
    let spine = FailTarget::Spine { plane: 0, spine: 0 };
    for (name, target, kind, planes) in [
        ("link", link, Kind::AllReduce, 1),
        ("spine", spine, Kind::AllReduce, 1),
        ("plane", FailTarget::Plane { plane: 0 }, Kind::AllReduce, 4),
        ("spine", spine, Kind::Shift, 1),
    ] {
        let base = match (kind, planes) {
            (Kind::Shift, _) => &bulk,
            (_, 1) => &base_ar,
            _ => &base4,
        };
        let at = base[0].cct_ns / 2;
        let left = capacity_left(&target, planes);
        let mut sc = p.scenario(&format!("fail-{name}-{}", kind.name()), kind, planes);
        sc.fail = Some(FailSpec {
            target,
            at_ns: at,
            dur_ns: u64::MAX / 4,
        });
        let outs = r.run_all_expecting(&sc, planes > 1);
        let _ = writeln!(
            r.md,
            "| {name} | {} | {planes} | {} | {} | {} | {} | {} | {} | {} |",
            kind.name(),
            us(&outs[0]),
            kept(&base[0], &outs[0]),
            recovery(&outs[0], at, left),
            us(&outs[1]),
            kept(&base[1], &outs[1]),
            us(&outs[2]),
            kept(&base[2], &outs[2]),
        );
    }

    // Determinism: the same seed gives the same results.
    if quick {
        for kind in [Kind::AllReduce, Kind::AllToAll] {
            let mut sc = p.scenario("determinism", kind, 2);
            sc.loss_ppm = 10_000;
            for proto in Proto::ALL {
                let a = csv_row(&sc, &run(&sc, proto), false);
                let b = csv_row(&sc, &run(&sc, proto), false);
                if a != b {
                    r.problems
                        .push(format!("same seed, different results:\n{a}\n{b}"));
                }
            }
        }
    }

    // The simulator's own speed.
    let _ = writeln!(
        r.md,
        "\n## Simulator speed (MetaRoCE All-Reduce of {} MiB per node, 1 plane)\n\n\
         Wall time on this machine (shared, release build); packets: datagrams the hosts sent.\n\n\
         | nodes | simulated CCT us | packets | events | wall s | packets/s | events/s |\n\
         |---|---|---|---|---|---|---|",
        p.speed_bytes >> 20
    );
    for &n in &p.speed_nodes {
        let mut sc = p.scenario("speed", Kind::AllReduce, 1);
        sc.nodes = n;
        sc.bytes = p.speed_bytes;
        let o = run(&sc, Proto::Meta);
        let _ = writeln!(r.csv, "{}", csv_row(&sc, &o, true));
        if r.check && !o.correct() {
            r.problems
                .push(format!("speed run with {n} nodes incomplete"));
        }
        let _ = writeln!(
            r.md,
            "| {n} | {} | {} | {} | {:.2} | {:.0} | {:.0} |",
            us(&o),
            o.net.packets,
            o.net.events,
            o.wall_s,
            o.packets_per_s(),
            o.net.events as f64 / o.wall_s.max(1e-9)
        );
    }

    for &n in scale {
        at_scale(&mut r, &p, n);
    }

    let _ = writeln!(
        r.md,
        "\n## All ratios\n\n![baseline CCT / MetaRoCE CCT](ratios.svg)"
    );
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let md_path = out.join("report.md");
    let csv_path = out.join("results.csv");
    std::fs::write(&md_path, &r.md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    std::fs::write(&csv_path, &r.csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    let svg_path = out.join("ratios.svg");
    std::fs::write(&svg_path, ratios_svg(&r.ratios))
        .map_err(|e| format!("{}: {e}", svg_path.display()))?;
    print!("{}", r.md);
    println!("\nwritten: {} {}", md_path.display(), csv_path.display());
    if r.problems.is_empty() {
        Ok(())
    } else {
        Err(format!("sim-quick failed:\n{}", r.problems.join("\n")))
    }
}
