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
            Kind::AllReduce => "allreduce",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "incast" => Some(Kind::Incast),
            "alltoall" | "all-to-all" | "a2a" => Some(Kind::AllToAll),
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
        Kind::AllToAll => {
            let mut v = Vec::new();
            for s in 0..n {
                for k in 1..n {
                    v.push(Flow::new(s, (s + k) % n, bytes, Vec::new()));
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

/// Jain's fairness index (1 = all equal).
pub fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let q: f64 = xs.iter().map(|x| x * x).sum();
    if q == 0.0 {
        return 0.0;
    }
    s * s / (xs.len() as f64 * q)
}
