// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A scenario (workload, fabric, impairments, seed) run with one transport, and its outcome
//! as Markdown and CSV.

use crate::baseline::{BaseConfig, Striped, DATA_HEADER, OVERHEAD};
use crate::endpoint::{CountingMemory, End, EndCounters, HostCtx};
use crate::fabric::{FabricConfig, FailTarget, Failure, RunStats, Sim};
use crate::meta::{MetaConfig, MetaEnd};
use crate::rng::mix;
use crate::slots::Slots;
use crate::workload::{build, jain, split, Kind};
use metaroce_transport::congestion::{CcConfig, RateAllocator};
use std::fmt::Write as _;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Meta,
    Roce,
    Irn,
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Meta, Proto::Roce, Proto::Irn];

    pub fn name(self) -> &'static str {
        match self {
            Proto::Meta => "metaroce",
            Proto::Roce => "rocev2",
            Proto::Irn => "irn",
        }
    }

    pub fn parse(s: &str) -> Option<Proto> {
        match s {
            "metaroce" | "meta" => Some(Proto::Meta),
            "rocev2" | "roce" => Some(Proto::Roce),
            "irn" => Some(Proto::Irn),
            _ => None,
        }
    }
}

/// A failure during the run: `target` is down from `at_ns` after the start for `dur_ns`.
#[derive(Clone, Copy, Debug)]
pub struct FailSpec {
    pub target: FailTarget,
    pub at_ns: u64,
    pub dur_ns: u64,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub kind: Kind,
    pub nodes: usize,
    pub planes: usize,
    /// Incast and All-to-All: bytes per flow; All-Reduce: bytes per node.
    pub bytes: u64,
    /// Random loss on every leaf-to-host link, ppm.
    pub loss_ppm: u32,
    /// Random loss on every leaf-spine link (each direction), ppm.
    pub core_loss_ppm: u32,
    pub fail: Option<FailSpec>,
    pub seed: u64,
    pub hosts_per_leaf: usize,
    pub spines: usize,
    /// Simulated time limit, ns.
    pub deadline_ns: u64,
    /// MetaRoCE's congestion control (experiments: one signal off, another initial window).
    pub meta_cc: CcConfig,
    /// MetaRoCE's RTO for a path without an RTT sample, ns.
    pub meta_initial_rto_ns: u64,
    /// QPs per flow: each flow's bytes are cut over this many QPs of its pair, all at once
    /// (MetaRoCE: streams of the pair's connection; baselines: QPs of their own).
    pub qps: u16,
}

impl Scenario {
    pub fn new(name: &str, kind: Kind, nodes: usize, planes: usize, bytes: u64) -> Self {
        Scenario {
            name: name.to_string(),
            kind,
            nodes,
            planes,
            bytes,
            loss_ppm: 0,
            core_loss_ppm: 0,
            fail: None,
            seed: 1,
            hosts_per_leaf: 8,
            spines: 8,
            deadline_ns: 2_000_000_000,
            meta_cc: CcConfig::new(),
            meta_initial_rto_ns: 200_000,
            qps: 1,
        }
    }

    pub fn fabric(&self) -> FabricConfig {
        let mut f = FabricConfig::new(self.nodes, self.planes);
        f.hosts_per_leaf = self.hosts_per_leaf;
        f.spines = self.spines;
        f.loss_ppm = self.loss_ppm;
        f.core_loss_ppm = self.core_loss_ppm;
        f.seed = self.seed;
        if let Some(fs) = self.fail {
            f.failures.push(Failure {
                target: fs.target,
                from_ns: 1_000 + fs.at_ns,
                until_ns: 1_000 + fs.at_ns + fs.dur_ns,
            });
        }
        f
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub proto: Proto,
    pub completed: bool,
    pub flows: usize,
    pub flows_done: usize,
    /// Collective completion time: first flow start to last flow end, ns.
    pub cct_ns: u64,
    /// Per-flow goodput (bytes over the flow's own lifetime), Gbit/s.
    pub goodput_mean: f64,
    pub goodput_min: f64,
    /// Jain's index of the per-flow goodputs.
    pub jain: f64,
    pub counters: EndCounters,
    /// Payload bytes the receivers placed, and what the flows carried.
    pub rx_bytes: u64,
    pub expected_bytes: u64,
    pub net: RunStats,
    pub wall_s: f64,
}

impl Outcome {
    /// Every flow completed, no message failed, and every receiver placed at least its bytes.
    pub fn correct(&self) -> bool {
        self.completed && self.counters.failed == 0 && self.rx_bytes >= self.expected_bytes
    }

    /// Simulated packets per second of wall time.
    pub fn packets_per_s(&self) -> f64 {
        self.net.packets as f64 / self.wall_s.max(1e-9)
    }
}

pub fn run(sc: &Scenario, proto: Proto) -> Outcome {
    let fc = sc.fabric();
    let flows = split(build(sc.kind, sc.nodes, sc.bytes, sc.seed), sc.qps);
    let expected: u64 = flows.iter().map(|f| f.bytes).sum();
    let mtu = 4096u32;
    let mut mc = MetaConfig::new(sc.planes, sc.seed);
    mc.cc = sc.meta_cc;
    mc.initial_rto_ns = sc.meta_initial_rto_ns;
    mc.qps = sc.qps.max(1);
    let qps = usize::from(mc.qps);
    let rtt = fc.base_rtt_ns(mtu + DATA_HEADER + OVERHEAD);
    let wire = u64::from(mtu + DATA_HEADER + OVERHEAD);
    let bdp = (fc.host_mbps * rtt / 8_000).div_ceil(wire);
    let (host_mbps, seed) = (fc.host_mbps, sc.seed);
    let planes = sc.planes.max(1);
    let make_end = move |h: u32, p: u32| -> Box<dyn End> {
        let sports: Vec<u16> = (0..(qps * planes) as u64)
            .map(|i| {
                let i = (i % planes as u64) | ((i / planes as u64) << 8);
                49_152 + (mix(seed ^ (u64::from(h) << 32 | u64::from(p)) ^ i << 56) % 16_384) as u16
            })
            .collect();
        match (proto, qps) {
            (Proto::Meta, 1) => match mc.paths {
                0..=16 => Box::new(MetaEnd::<16>::new(&mc, h, p)),
                17..=32 => Box::new(MetaEnd::<32>::new(&mc, h, p)),
                _ => Box::new(MetaEnd::<64>::new(&mc, h, p)),
            },
            (Proto::Meta, _) => match mc.paths {
                0..=16 => Box::new(MetaEnd::<16, Slots>::new(&mc, h, p)),
                17..=32 => Box::new(MetaEnd::<32, Slots>::new(&mc, h, p)),
                _ => Box::new(MetaEnd::<64, Slots>::new(&mc, h, p)),
            },
            (Proto::Roce, _) => Box::new(Striped::new(
                BaseConfig::roce(host_mbps, mtu),
                &sports,
                planes,
            )),
            (Proto::Irn, _) => Box::new(Striped::new(
                BaseConfig::irn(host_mbps, mtu, bdp),
                &sports,
                planes,
            )),
        }
    };
    let cap = (fc.host_mbps * fc.planes as u64).min(u64::from(u32::MAX)) as u32;
    let make_ctx = |_h: u32| HostCtx {
        alloc: RateAllocator::new(cap)
            .with_epoch(100_000)
            .with_interval(20_000),
        mem: CountingMemory::default(),
        rx_bytes: 0,
    };
    let t0 = Instant::now();
    let mut sim = Sim::new(fc, flows, Box::new(make_end), make_ctx);
    let completed = sim.run(sc.deadline_ns);
    let wall_s = t0.elapsed().as_secs_f64();
    let start = sim.start;
    let done: Vec<_> = sim.flows.iter().filter(|f| f.end_ns.is_some()).collect();
    let cct_ns = done.iter().filter_map(|f| f.end_ns).max().unwrap_or(start) - start;
    let gp: Vec<f64> = done
        .iter()
        .map(|f| {
            let d = f.end_ns.unwrap() - f.start_ns.unwrap();
            f.bytes as f64 * 8.0 / d.max(1) as f64
        })
        .collect();
    let counters = sim.counters();
    if std::env::var_os("METAROCE_SIM_DEBUG").is_some() {
        for e in &sim.ends {
            if let Some(end) = e.end.as_ref().filter(|end| end.counters().failed > 0) {
                eprintln!("end {} -> {}: {}", e.host, e.peer, end.debug());
            }
        }
    }
    let rx_bytes = sim
        .hosts
        .iter()
        .map(|h| h.ctx.mem.written + h.ctx.rx_bytes)
        .sum();
    Outcome {
        proto,
        completed,
        flows: sim.flows.len(),
        flows_done: done.len(),
        cct_ns,
        goodput_mean: if gp.is_empty() {
            0.0
        } else {
            gp.iter().sum::<f64>() / gp.len() as f64
        },
        goodput_min: gp.iter().copied().fold(f64::INFINITY, f64::min).min(1e12),
        jain: jain(&gp),
        counters,
        rx_bytes,
        expected_bytes: expected,
        net: sim.stats(),
        wall_s,
    }
}

pub fn csv_header() -> &'static str {
    "scenario,workload,nodes,planes,bytes,loss_ppm,core_loss_ppm,failure,seed,proto,completed,correct,flows,flows_done,cct_us,goodput_mean_gbps,goodput_min_gbps,jain,data_packets,retransmits,timeouts,failed,rx_bytes,expected_bytes,max_queue_bytes,drops,marks,fail_drops,loss_drops,sim_packets,events,ends_made,peak_ends,peak_state_bytes,late_packets,wall_s,packets_per_s"
}

pub fn fail_name(sc: &Scenario) -> String {
    match sc.fail {
        None => "none".into(),
        Some(f) => {
            let what = match f.target {
                FailTarget::Link { plane, leaf, spine } => {
                    format!("link p{plane} l{leaf}-s{spine}")
                }
                FailTarget::Spine { plane, spine } => format!("spine p{plane} s{spine}"),
                FailTarget::Plane { plane } => format!("plane {plane}"),
            };
            format!("{what} at {} us", f.at_ns / 1_000)
        }
    }
}

/// One CSV line. `timing`: include the wall-clock columns (which differ between runs).
pub fn csv_row(sc: &Scenario, o: &Outcome, timing: bool) -> String {
    let (wall, pps) = if timing {
        (
            format!("{:.3}", o.wall_s),
            format!("{:.0}", o.packets_per_s()),
        )
    } else {
        (String::new(), String::new())
    };
    format!(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.1},{:.2},{:.2},{:.4},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
        sc.name,
        sc.kind.name(),
        sc.nodes,
        sc.planes,
        sc.bytes,
        sc.loss_ppm,
        sc.core_loss_ppm,
        fail_name(sc),
        sc.seed,
        o.proto.name(),
        o.completed,
        o.correct(),
        o.flows,
        o.flows_done,
        o.cct_ns as f64 / 1e3,
        o.goodput_mean,
        o.goodput_min,
        o.jain,
        o.counters.data_packets,
        o.counters.retransmits,
        o.counters.timeouts,
        o.counters.failed,
        o.rx_bytes,
        o.expected_bytes,
        o.net.max_queue,
        o.net.drops,
        o.net.marks,
        o.net.fail_drops,
        o.net.loss_drops,
        o.net.packets,
        o.net.events,
        o.net.ends_made,
        o.net.peak_ends,
        o.net.peak_state,
        o.net.late_packets,
        wall,
        pps
    )
}

fn cct(o: &Outcome) -> String {
    if o.completed {
        format!("{:.1}", o.cct_ns as f64 / 1e3)
    } else {
        format!("DNF ({}/{})", o.flows_done, o.flows)
    }
}

/// Baseline CCT over MetaRoCE's: how many times faster MetaRoCE finished.
fn ratio(meta: &Outcome, base: Option<&Outcome>) -> String {
    match base {
        Some(b) if meta.completed && b.completed => {
            format!("{:.2}", b.cct_ns as f64 / meta.cct_ns.max(1) as f64)
        }
        Some(b) if meta.completed && !b.completed => "DNF".into(),
        Some(_) => "-".into(),
        None => "".into(),
    }
}

pub fn md_header() -> String {
    "| scenario | workload | nodes | planes | loss | failure | metaroce CCT us | rocev2 CCT us | irn CCT us | rocev2/metaroce | irn/metaroce | metaroce retx % | rocev2 retx % | irn retx % | metaroce max queue KiB | metaroce Jain | rocev2 Jain |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n".into()
}

/// One Markdown row: MetaRoCE first in `outs`, the baselines after it if run.
pub fn md_row(sc: &Scenario, outs: &[Outcome]) -> String {
    let get = |p: Proto| outs.iter().find(|o| o.proto == p);
    let cell = |p: Proto, f: &dyn Fn(&Outcome) -> String| get(p).map(f).unwrap_or_default();
    let retx = |o: &Outcome| {
        format!(
            "{:.2}",
            100.0 * o.counters.retransmits as f64 / o.counters.data_packets.max(1) as f64
        )
    };
    let meta = get(Proto::Meta);
    let mut s = String::new();
    let _ =
        writeln!(
        s,
        "| {} | {} | {} | {} | {}% | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        sc.name,
        sc.kind.name(),
        sc.nodes,
        sc.planes,
        sc.loss_ppm as f64 / 1e4,
        fail_name(sc),
        cell(Proto::Meta, &cct),
        cell(Proto::Roce, &cct),
        cell(Proto::Irn, &cct),
        meta.map(|m| ratio(m, get(Proto::Roce))).unwrap_or_default(),
        meta.map(|m| ratio(m, get(Proto::Irn))).unwrap_or_default(),
        cell(Proto::Meta, &retx),
        cell(Proto::Roce, &retx),
        cell(Proto::Irn, &retx),
        cell(Proto::Meta, &|o| format!("{:.0}", o.net.max_queue as f64 / 1024.0)),
        cell(Proto::Meta, &|o| format!("{:.3}", o.jain)),
        cell(Proto::Roce, &|o| format!("{:.3}", o.jain)),
    );
    s
}
