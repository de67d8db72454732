// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! metaroce-sim: run one scenario, or the scenario table that `make sim` reports.

use metaroce_sim::fabric::FailTarget;
use metaroce_sim::scenario::{
    self, csv_header, csv_row, md_header, md_row, FailSpec, Proto, Scenario,
};
use metaroce_sim::workload::Kind;
use std::process::ExitCode;

const USAGE: &str = "usage:
  metaroce-sim run [--scenario incast|alltoall|alltoall-pairwise|allreduce|shift]
                   [--proto all|metaroce|rocev2|irn] [--qps Q]
                   [--nodes N] [--planes P] [--seed S] [--loss PPM] [--core-loss PPM] [--bytes B]
                   [--hosts-per-leaf H] [--spines S] [--fail-link US] [--fail-spine US] [--fail-plane US]
                   [--fail-for US] [--meta-cc full|ecn-only|rate-only] [--initial-window PKTS_PER_PLANE]
                   [--initial-rto US] [--deadline-ms MS]
                   [--csv]
      one scenario, a Markdown table row per transport (--csv: CSV lines)
  metaroce-sim table [--quick] [--out DIR] [--nodes N[,N...]]
      the scenario table: DIR/report.md and DIR/results.csv (default build/sim);
      --nodes: its core (All-Reduce, pairwise All-to-All, 1% loss, 4 planes; bulk
      transfers lossless, at 1% and 10% loss, on 4 and 8 planes, over 4 QPs per pair, with
      a spine failure) again at each of these host counts (e.g. 256,1024; empty: none);
      --quick: a small fabric in seconds, asserting that every collective completes with
      every byte delivered and that a second run with the same seed gives the same results";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let res = match args.first().map(String::as_str) {
        Some("run") => cmd_run(&args[1..]),
        Some("table") => cmd_table(&args[1..]),
        _ => Err(USAGE.to_string()),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn num(v: Option<&String>, flag: &str) -> Result<u64, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.replace('_', "")
        .parse()
        .map_err(|_| format!("{flag}: not a number: {v}"))
}

fn cmd_run(args: &[String]) -> Result<(), String> {
    let mut sc = Scenario::new("cli", Kind::AllReduce, 16, 1, 4 << 20);
    let mut protos = Proto::ALL.to_vec();
    let mut csv = false;
    // What fails (0 link, 1 spine, 2 plane: the first one of each), and when.
    let mut fail: Option<(u8, u64)> = None;
    let mut fail_for = u64::MAX / 4;
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1);
        match args[i].as_str() {
            "--scenario" => {
                let v = v.ok_or("--scenario needs a value")?;
                sc.kind = Kind::parse(v).ok_or_else(|| format!("unknown scenario {v}"))?;
            }
            "--proto" => {
                let v = v.ok_or("--proto needs a value")?;
                protos = if v == "all" {
                    Proto::ALL.to_vec()
                } else {
                    vec![Proto::parse(v).ok_or_else(|| format!("unknown proto {v}"))?]
                };
            }
            "--nodes" => sc.nodes = num(v, "--nodes")? as usize,
            "--planes" => sc.planes = num(v, "--planes")? as usize,
            "--seed" => sc.seed = num(v, "--seed")?,
            "--qps" => sc.qps = num(v, "--qps")?.clamp(1, 1024) as u16,
            "--loss" => sc.loss_ppm = num(v, "--loss")? as u32,
            "--core-loss" => sc.core_loss_ppm = num(v, "--core-loss")? as u32,
            "--bytes" => sc.bytes = num(v, "--bytes")?,
            "--hosts-per-leaf" => sc.hosts_per_leaf = num(v, "--hosts-per-leaf")? as usize,
            "--spines" => sc.spines = num(v, "--spines")? as usize,
            "--fail-link" => fail = Some((0, num(v, "--fail-link")? * 1_000)),
            "--fail-spine" => fail = Some((1, num(v, "--fail-spine")? * 1_000)),
            "--fail-plane" => fail = Some((2, num(v, "--fail-plane")? * 1_000)),
            "--fail-for" => fail_for = num(v, "--fail-for")? * 1_000,
            "--meta-cc" => match v.map(String::as_str) {
                Some("full") => sc.meta_cc.ecn = true,
                Some("ecn-only") => sc.meta_cc.receiver_rate = false,
                Some("rate-only") => sc.meta_cc.ecn = false,
                _ => return Err("--meta-cc: full, ecn-only or rate-only".into()),
            },
            "--deadline-ms" => sc.deadline_ns = num(v, "--deadline-ms")? * 1_000_000,
            "--initial-rto" => sc.meta_initial_rto_ns = num(v, "--initial-rto")? * 1_000,
            "--initial-window" => sc.meta_cc.initial_window = num(v, "--initial-window")? as u32,
            "--csv" => {
                csv = true;
                i += 1;
                continue;
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
        i += 2;
    }
    if sc.nodes < 2 || sc.planes == 0 || sc.planes > 16 || sc.hosts_per_leaf == 0 {
        return Err("need --nodes >= 2, 1 <= --planes <= 16, --hosts-per-leaf >= 1".into());
    }
    sc.name = sc.kind.name().into();
    sc.fail = fail.map(|(what, at_ns)| FailSpec {
        target: match what {
            0 => FailTarget::Link {
                plane: 0,
                leaf: 0,
                spine: 0,
            },
            1 => FailTarget::Spine { plane: 0, spine: 0 },
            _ => FailTarget::Plane { plane: 0 },
        },
        at_ns,
        dur_ns: fail_for,
    });
    let outs: Vec<_> = protos.iter().map(|&p| scenario::run(&sc, p)).collect();
    if csv {
        println!("{}", csv_header());
        for o in &outs {
            println!("{}", csv_row(&sc, o, true));
        }
    } else {
        print!("{}{}", md_header(), md_row(&sc, &outs));
        if let Some(f) = &sc.fail {
            let left = metaroce_sim::report::capacity_left(&f.target, sc.planes);
            for o in &outs {
                println!(
                    "\n{}: recovery after the failure {}",
                    o.proto.name(),
                    metaroce_sim::report::recovery(o, f.at_ns, left)
                );
            }
        }
        for o in &outs {
            println!(
                "\n{}: {} packets in {:.2} s of wall time ({:.0} packets/s), {} events, \
                 {} endpoints alive at most ({} made)",
                o.proto.name(),
                o.net.packets,
                o.wall_s,
                o.packets_per_s(),
                o.net.events,
                o.net.peak_ends,
                o.net.ends_made
            );
        }
    }
    Ok(())
}

fn cmd_table(args: &[String]) -> Result<(), String> {
    let mut quick = false;
    let mut out = "build/sim".to_string();
    let mut scale = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => quick = true,
            "--nodes" => {
                i += 1;
                let v = args.get(i).ok_or("--nodes needs a value")?;
                for n in v.split(',').filter(|s| !s.trim().is_empty()) {
                    let n: usize = n
                        .trim()
                        .parse()
                        .map_err(|_| format!("--nodes: not a number: {n}"))?;
                    if !(2..=4096).contains(&n) {
                        return Err("--nodes: 2 to 4096 hosts".into());
                    }
                    scale.push(n);
                }
            }
            "--out" => {
                i += 1;
                out = args.get(i).ok_or("--out needs a value")?.clone();
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
        i += 1;
    }
    metaroce_sim::report::table(quick, std::path::Path::new(&out), &scale)
}
