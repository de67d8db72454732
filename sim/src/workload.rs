// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! Workloads as flows with dependencies: a flow (src -> dst, bytes) starts when every flow it
//! depends on completed (at its sender), and completes when its sender saw its last WRITE
//! acknowledged.

use crate::rng::Rng;

#[derive(Clone, Debug)]
pub struct Flow {
    pub src: u32,
    pub dst: u32,
    pub bytes: u64,
    /// The QP of the pair it goes on.
    pub qp: u16,
    pub deps: Vec<u32>,
    /// Flows that depend on this one.
    pub dependents: Vec<u32>,
    /// Dependencies not yet complete.
    pub pending: u32,
    pub start_ns: Option<u64>,
    pub end_ns: Option<u64>,
}

impl Flow {
    pub fn new(src: usize, dst: usize, bytes: u64, deps: Vec<u32>) -> Self {
        Flow {
            src: src as u32,
            dst: dst as u32,
            bytes,
            qp: 0,
            pending: deps.len() as u32,
            deps,
            dependents: Vec::new(),
            start_ns: None,
            end_ns: None,
        }
    }
}

/// Fills in `dependents` from `deps`.
fn link(mut flows: Vec<Flow>) -> Vec<Flow> {
    for i in 0..flows.len() {
        for d in flows[i].deps.clone() {
            flows[d as usize].dependents.push(i as u32);
        }
    }
    flows
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Every other node writes `bytes` to node 0 at once.
    Incast,
    /// Every node writes `bytes` to every other node at once.
    AllToAll,
    /// Every node writes `bytes` to node `s + N/4` (mod N) at once: a permutation whose pairs
    /// each carry one direction.
    Shift,
    /// All-to-All as a collective library runs it: N-1 rounds of pairwise exchange, a node's
    /// round k+1 starting when it sent and received round k. With a power-of-two N node `s`
    /// exchanges with `s ^ k` in round k, both directions at once (MPICH's pairwise
    /// algorithm), so every pair is used in one round and about N/2 connections are alive
    /// at a time; otherwise it sends to `s + k` and receives from `s - k` (mod N), and a
    /// pair's connection lives from round k to round N-k.
    AllToAllPairwise,
    /// Ring All-Reduce of `bytes` per node: 2(N-1) steps of `bytes / N` to the next node of
    /// a ring in a seeded random order (nodes scattered over the fabric, as a job's nodes
    /// are); a node's step k+1 starts when its step k and its predecessor's step k completed.
    AllReduce,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Incast => "incast",
            Kind::AllToAll => "alltoall",
            Kind::Shift => "shift",
            Kind::AllToAllPairwise => "alltoall-pairwise",
            Kind::AllReduce => "allreduce",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "incast" => Some(Kind::Incast),
            "alltoall" | "all-to-all" | "a2a" => Some(Kind::AllToAll),
            "shift" | "permutation" => Some(Kind::Shift),
            "alltoall-pairwise" | "pairwise" | "a2a-pw" => Some(Kind::AllToAllPairwise),
            "allreduce" | "all-reduce" | "ar" => Some(Kind::AllReduce),
            _ => None,
        }
    }
}

/// The flows of workload `kind` over `n` nodes.
pub fn build(kind: Kind, n: usize, bytes: u64, seed: u64) -> Vec<Flow> {
    assert!(n >= 2, "a collective needs two nodes");
    let flows = match kind {
        Kind::Incast => (1..n).map(|s| Flow::new(s, 0, bytes, Vec::new())).collect(),
        Kind::Shift => (0..n)
            .map(|s| Flow::new(s, (s + (n / 4).max(1)) % n, bytes, Vec::new()))
            .collect(),
        Kind::AllToAll => {
            let mut v = Vec::new();
            for s in 0..n {
                for k in 1..n {
                    v.push(Flow::new(s, (s + k) % n, bytes, Vec::new()));
                }
            }
            v
        }
        Kind::AllToAllPairwise => {
            let pof2 = n.is_power_of_two();
            let to = |s: usize, k: usize| if pof2 { s ^ k } else { (s + k) % n };
            let from = |s: usize, k: usize| if pof2 { s ^ k } else { (s + n - k) % n };
            let id = |k: usize, s: usize| ((k - 1) * n + s) as u32;
            let mut v = Vec::with_capacity(n * (n - 1));
            for k in 1..n {
                for s in 0..n {
                    let deps = if k == 1 {
                        Vec::new()
                    } else {
                        vec![id(k - 1, s), id(k - 1, from(s, k - 1))]
                    };
                    v.push(Flow::new(s, to(s, k), bytes, deps));
                }
            }
            v
        }
        Kind::AllReduce => {
            let order = Rng::new(seed ^ 0xa11_7ed0ce).permutation(n);
            let chunk = bytes.div_ceil(n as u64).max(1);
            let steps = 2 * (n - 1);
            let id = |k: usize, i: usize| (k * n + i) as u32;
            let mut v = Vec::with_capacity(steps * n);
            for k in 0..steps {
                for i in 0..n {
                    let deps = if k == 0 {
                        Vec::new()
                    } else {
                        vec![id(k - 1, i), id(k - 1, (i + n - 1) % n)]
                    };
                    v.push(Flow::new(order[i], order[(i + 1) % n], chunk, deps));
                }
            }
            v
        }
    };
    link(flows)
}

/// Each flow of a workload without dependencies cut into `qps` flows of a `qps`-th of its
/// bytes (at least one), one on each of the pair's QPs `0..qps`, all at once.
pub fn split(flows: Vec<Flow>, qps: u16) -> Vec<Flow> {
    if qps <= 1 {
        return flows;
    }
    assert!(
        flows.iter().all(|f| f.deps.is_empty()),
        "QPs split only workloads without dependencies"
    );
    let mut v = Vec::with_capacity(flows.len() * usize::from(qps));
    for f in flows {
        for q in 0..qps {
            let mut g = Flow::new(
                f.src as usize,
                f.dst as usize,
                f.bytes.div_ceil(u64::from(qps)).max(1),
                Vec::new(),
            );
            g.qp = q;
            v.push(g);
        }
    }
    v
}

/// Jain's fairness index (1 = all equal).
pub fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let q: f64 = xs.iter().map(|x| x * x).sum();
    if q == 0.0 {
        return 0.0;
    }
    s * s / (xs.len() as f64 * q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Every ordered pair once; round k+1 of a node waits for what it sent and received in
    /// round k; with a power-of-two N a round's pairs exchange both ways.
    #[test]
    fn pairwise_all_to_all_covers_every_pair_once_in_rounds() {
        for n in [8, 6] {
            let flows = build(Kind::AllToAllPairwise, n, 100, 1);
            assert_eq!(flows.len(), n * (n - 1));
            let pairs: HashSet<(u32, u32)> = flows.iter().map(|f| (f.src, f.dst)).collect();
            assert_eq!(pairs.len(), n * (n - 1));
            for (i, f) in flows.iter().enumerate() {
                let k = i / n + 1;
                if k == 1 {
                    assert!(f.deps.is_empty());
                    continue;
                }
                let d: Vec<&Flow> = f.deps.iter().map(|&d| &flows[d as usize]).collect();
                assert_eq!(d[0].src, f.src, "its own send of the round before");
                assert_eq!(d[1].dst, f.src, "its receive of the round before");
                if n.is_power_of_two() {
                    let back = flows[(k - 1) * n + f.dst as usize].dst;
                    assert_eq!(back, f.src, "both ways in the same round");
                }
            }
        }
    }
}
