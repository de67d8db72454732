// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! The fabric and the event-driven core.
//!
//! Topology: `planes` identical two-tier Clos networks. In each plane, host `h` has one NIC
//! port to its leaf `h / hosts_per_leaf`; every leaf connects to every spine. Every link
//! direction is an egress [`Port`]: a FIFO served at the link's rate, with a buffer (tail
//! drop), ECN CE marking of ECN-capable packets when the queue holds more than a threshold
//! at enqueue (as DCTCP-style switches mark), a propagation delay and a random loss rate.
//! A leaf picks a spine by a hash of (src, dst, sport, dport) seeded per switch, as ECMP does;
//! a spine has one port towards each leaf.
//!
//! Failures: a link (both directions) or a whole spine goes down for a time window; what is
//! sent into a down port is lost. The leaves take a down link out of their ECMP groups only
//! `reroute_ns` after it went down (routing convergence); until then packets hashed onto it
//! are black-holed.
//!
//! Hosts: a NIC serves one packet at a time per port; when its ports hold fewer than
//! `NIC_BACKLOG` packets per plane it takes the next packet from its endpoints in round
//! robin (as a NIC's QP scheduler does), so a host never queues more than that locally.
//!
//! Endpoints: a host pair's two ends (one connection) are made when the pair's first flow
//! starts and dropped when its last flow completed, so that only the pairs in use hold
//! state; what arrives for a dropped end afterwards is discarded (a torn-down connection).
//!
//! Core: a binary heap of (time, sequence, event); the sequence number breaks ties in
//! insertion order, so a run is a function of the configuration and the seed.

use crate::endpoint::{End, EndCounters, HostCtx, Packet, DPORT};
use crate::rng::{ecmp_hash, Rng};
use crate::workload::Flow;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// Packets a host keeps queued on its NIC ports, per plane.
pub const NIC_BACKLOG: usize = 4;

/// A node of the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Host(u32),
    /// (plane, leaf)
    Leaf(u8, u16),
    /// (plane, spine)
    Spine(u8, u16),
}

/// What fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailTarget {
    /// The link between a leaf and a spine of a plane, both directions.
    Link { plane: u8, leaf: u16, spine: u16 },
    /// A spine switch: all its links.
    Spine { plane: u8, spine: u16 },
    /// A whole plane: every link of it, the hosts' NIC ports on it included.
    Plane { plane: u8 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub target: FailTarget,
    pub from_ns: u64,
    pub until_ns: u64,
}

/// The fabric's shape and its links' behaviour.
#[derive(Clone, Debug)]
pub struct FabricConfig {
    pub hosts: usize,
    pub planes: usize,
    pub hosts_per_leaf: usize,
    /// Spines per plane (unused when all hosts fit on one leaf).
    pub spines: usize,
    /// Host NIC port rate (each plane), Mbit/s.
    pub host_mbps: u64,
    /// Leaf-spine link rate, Mbit/s.
    pub core_mbps: u64,
    /// Propagation delay of every link, ns.
    pub link_delay_ns: u64,
    /// Egress buffer of a switch port, bytes.
    pub buffer_bytes: u64,
    /// CE marking above this many queued bytes.
    pub ecn_bytes: u64,
    /// Random loss on every leaf-to-host link (each packet crosses exactly one), ppm.
    pub loss_ppm: u32,
    /// Random loss on every leaf-spine link (each direction), ppm.
    pub core_loss_ppm: u32,
    /// Time from a link going down until the leaves route around it, ns.
    pub reroute_ns: u64,
    pub failures: Vec<Failure>,
    pub seed: u64,
}

impl FabricConfig {
    /// 100 Gbit/s ports, 1 us links, 512 KiB buffers marking above 100 KiB, `hosts_per_leaf`
    /// 8 and as many spines (no oversubscription), reroute after 1 ms.
    pub fn new(hosts: usize, planes: usize) -> Self {
        FabricConfig {
            hosts,
            planes,
            hosts_per_leaf: 8,
            spines: 8,
            host_mbps: 100_000,
            core_mbps: 100_000,
            link_delay_ns: 1_000,
            buffer_bytes: 512 << 10,
            ecn_bytes: 100 << 10,
            loss_ppm: 0,
            core_loss_ppm: 0,
            reroute_ns: 1_000_000,
            failures: Vec::new(),
            seed: 1,
        }
    }

    pub fn leaves(&self) -> usize {
        self.hosts.div_ceil(self.hosts_per_leaf.max(1))
    }

    /// Spines actually built (none with a single leaf).
    pub fn spine_count(&self) -> usize {
        if self.leaves() > 1 {
            self.spines.max(1)
        } else {
            0
        }
    }

    /// Round trip of a full packet between hosts on different leaves with empty queues, ns.
    pub fn base_rtt_ns(&self, wire: u32) -> u64 {
        let hops = if self.leaves() > 1 { 4 } else { 2 };
        let ser = |mbps: u64| u64::from(wire) * 8_000 / mbps.max(1);
        let one_way = hops * self.link_delay_ns + 2 * ser(self.host_mbps) + 2 * ser(self.core_mbps);
        one_way + hops * self.link_delay_ns
    }
}

/// An egress port: a queue in front of a link.
#[derive(Debug)]
pub struct Port {
    pub rate_mbps: u64,
    pub delay_ns: u64,
    /// Buffer (bytes; u64::MAX for a host NIC), ECN threshold (u64::MAX: never marks).
    pub buffer: u64,
    pub ecn: u64,
    pub loss_ppm: u32,
    pub to: Node,
    /// Set for a host's NIC port: the host.
    pub host_nic: Option<u32>,
    pub plane: u8,
    /// Is a switch port (its counters go into the fabric's statistics).
    pub switch: bool,
    /// Down intervals [from, until).
    pub down: Vec<(u64, u64)>,
    queue: VecDeque<Packet>,
    pub bytes: u64,
    busy: bool,
    pub max_bytes: u64,
    pub drops: u64,
    pub marks: u64,
    pub fail_drops: u64,
    pub loss_drops: u64,
    pub tx_packets: u64,
}

impl Port {
    fn new(rate_mbps: u64, delay_ns: u64, to: Node) -> Self {
        Port {
            rate_mbps,
            delay_ns,
            buffer: u64::MAX,
            ecn: u64::MAX,
            loss_ppm: 0,
            to,
            host_nic: None,
            plane: 0,
            switch: false,
            down: Vec::new(),
            queue: VecDeque::new(),
            bytes: 0,
            busy: false,
            max_bytes: 0,
            drops: 0,
            marks: 0,
            fail_drops: 0,
            loss_drops: 0,
            tx_packets: 0,
        }
    }

    fn switch(cfg: &FabricConfig, rate_mbps: u64, to: Node, loss_ppm: u32) -> Self {
        let mut p = Port::new(rate_mbps, cfg.link_delay_ns, to);
        p.buffer = cfg.buffer_bytes;
        p.ecn = cfg.ecn_bytes;
        p.loss_ppm = loss_ppm;
        p.switch = true;
        p
    }

    fn is_down(&self, now: u64) -> bool {
        self.down.iter().any(|&(a, b)| now >= a && now < b)
    }

    /// Down and known to routing (`reroute_ns` after it went down).
    fn routed_down(&self, now: u64, reroute_ns: u64) -> bool {
        self.down
            .iter()
            .any(|&(a, b)| now >= a.saturating_add(reroute_ns) && now < b)
    }

    fn ser_ns(&self, wire: u32) -> u64 {
        u64::from(wire) * 8_000 / self.rate_mbps.max(1)
    }
}

/// Port indices by role.
struct Topo {
    leaves: usize,
    spines: usize,
    hpl: usize,
    /// [host * planes + plane]
    nic: Vec<u32>,
    /// [plane * hosts + host]: leaf to host.
    down: Vec<u32>,
    /// [(plane * leaves + leaf) * spines + spine]: leaf to spine.
    up: Vec<u32>,
    /// [(plane * spines + spine) * leaves + leaf]: spine to leaf.
    sdown: Vec<u32>,
}

enum Ev {
    PortDone(u32),
    /// A packet in `Sim::arrivals` reaches its next node (kept out of the heap, whose
    /// entries stay small: sifting moved whole packets).
    Arrive(u32),
    /// End's timer armed for this deadline.
    Timer(u32, u64),
}

struct Item {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    /// Reversed: the heap's top is the earliest.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Makes host `h`'s end towards peer `p`.
pub type MakeEnd = Box<dyn FnMut(u32, u32) -> Box<dyn End>>;

/// One end of a host pair's connection.
pub struct EndSlot {
    pub host: u32,
    pub peer: u32,
    /// The endpoint while the pair is in use (made at its first flow, dropped after its last).
    pub end: Option<Box<dyn End>>,
    /// The slot of the pair's other end.
    twin: u32,
    /// Flows of the pair (either direction) not yet complete.
    uses: u32,
    timer_at: Option<u64>,
    ready: bool,
    /// Its timer is re-armed when the current instant's work is done.
    dirty: bool,
}

pub struct Host {
    nic: Vec<u32>,
    /// Endpoints that may have something to send, in round-robin order.
    ready: VecDeque<u32>,
    /// Packets on the NIC's ports.
    backlog: usize,
    pub ctx: HostCtx,
    /// Packets this host's NIC took from its endpoints.
    pub tx_packets: u64,
}

/// Statistics of a run.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub events: u64,
    /// Packets the hosts sent (data and control).
    pub packets: u64,
    /// Largest queue of any switch port, bytes.
    pub max_queue: u64,
    pub drops: u64,
    pub marks: u64,
    pub fail_drops: u64,
    pub loss_drops: u64,
    /// Endpoints made (two per host pair used) and the most alive at once.
    pub ends_made: u64,
    pub peak_ends: u64,
    /// Most bytes of transport state the endpoints alive at once held (`End::state_bytes`).
    pub peak_state: u64,
    /// Packets that arrived for an endpoint already dropped (its pair was done).
    pub late_packets: u64,
    /// Data delivered to the hosts, wire bytes per [`RX_BIN_NS`] from time 0: packets of at
    /// least [`RX_DATA_BYTES`] (ACKs, NAKs and probes are far smaller), resends included.
    pub rx_bins: Vec<u64>,
}

/// Width of a bin of [`RunStats::rx_bins`], ns.
pub const RX_BIN_NS: u64 = 10_000;
/// Smallest packet [`RunStats::rx_bins`] counts as data, wire bytes.
pub const RX_DATA_BYTES: u32 = 1024;

pub struct Sim {
    pub cfg: FabricConfig,
    pub now: u64,
    heap: BinaryHeap<Item>,
    seq: u64,
    pub ports: Vec<Port>,
    topo: Topo,
    pub hosts: Vec<Host>,
    pub ends: Vec<EndSlot>,
    index: HashMap<(u32, u32), u32>,
    make_end: MakeEnd,
    /// Counters of the endpoints already dropped.
    retired: EndCounters,
    live_ends: u64,
    ends_made: u64,
    peak_ends: u64,
    live_state: u64,
    peak_state: u64,
    late_packets: u64,
    rx_bins: Vec<u64>,
    /// Endpoints to drop once the current instant's work is done.
    retire: Vec<u32>,
    switch_seed: Vec<u64>,
    rng: Rng,
    pub flows: Vec<Flow>,
    pub flows_left: usize,
    pub events: u64,
    done_buf: Vec<u32>,
    kicks: Vec<u32>,
    dirty: Vec<u32>,
    arrivals: Vec<Option<(Node, Packet)>>,
    free_arrivals: Vec<u32>,
    /// Time the workload started.
    pub start: u64,
}

impl Sim {
    /// Builds the fabric, a slot per (host, peer) that a flow needs (both directions), whose
    /// endpoint `make_end(host, peer)` makes when the pair's first flow starts, and one
    /// context per host by `make_ctx(host)`.
    pub fn new(
        cfg: FabricConfig,
        flows: Vec<Flow>,
        make_end: MakeEnd,
        mut make_ctx: impl FnMut(u32) -> HostCtx,
    ) -> Self {
        let (hosts, planes) = (cfg.hosts, cfg.planes.max(1));
        let (leaves, spines, hpl) = (cfg.leaves(), cfg.spine_count(), cfg.hosts_per_leaf.max(1));
        let mut ports = Vec::new();
        let mut add = |p: Port| {
            ports.push(p);
            (ports.len() - 1) as u32
        };
        let mut nic = vec![0; hosts * planes];
        for h in 0..hosts {
            for pl in 0..planes {
                let mut p = Port::new(
                    cfg.host_mbps,
                    cfg.link_delay_ns,
                    Node::Leaf(pl as u8, (h / hpl) as u16),
                );
                p.host_nic = Some(h as u32);
                p.plane = pl as u8;
                nic[h * planes + pl] = add(p);
            }
        }
        let mut add = |mut p: Port, pl: usize| {
            p.plane = pl as u8;
            add(p)
        };
        let mut down = vec![0; planes * hosts];
        for pl in 0..planes {
            for h in 0..hosts {
                down[pl * hosts + h] = add(
                    Port::switch(&cfg, cfg.host_mbps, Node::Host(h as u32), cfg.loss_ppm),
                    pl,
                );
            }
        }
        let mut up = vec![0; planes * leaves * spines];
        let mut sdown = vec![0; planes * spines * leaves];
        for pl in 0..planes {
            for l in 0..leaves {
                for s in 0..spines {
                    up[(pl * leaves + l) * spines + s] = add(
                        Port::switch(
                            &cfg,
                            cfg.core_mbps,
                            Node::Spine(pl as u8, s as u16),
                            cfg.core_loss_ppm,
                        ),
                        pl,
                    );
                    sdown[(pl * spines + s) * leaves + l] = add(
                        Port::switch(
                            &cfg,
                            cfg.core_mbps,
                            Node::Leaf(pl as u8, l as u16),
                            cfg.core_loss_ppm,
                        ),
                        pl,
                    );
                }
            }
        }
        let topo = Topo {
            leaves,
            spines,
            hpl,
            nic,
            down,
            up,
            sdown,
        };
        for f in &cfg.failures {
            let win = (f.from_ns, f.until_ns);
            match f.target {
                FailTarget::Link { plane, leaf, spine } => {
                    let (pl, l, s) = (usize::from(plane), usize::from(leaf), usize::from(spine));
                    if pl < planes && l < leaves && s < spines {
                        ports[topo.up[(pl * leaves + l) * spines + s] as usize]
                            .down
                            .push(win);
                        ports[topo.sdown[(pl * spines + s) * leaves + l] as usize]
                            .down
                            .push(win);
                    }
                }
                FailTarget::Plane { plane } => {
                    for p in ports.iter_mut().filter(|p| p.plane == plane) {
                        p.down.push(win);
                    }
                }
                FailTarget::Spine { plane, spine } => {
                    let (pl, s) = (usize::from(plane), usize::from(spine));
                    if pl < planes && s < spines {
                        for l in 0..leaves {
                            ports[topo.up[(pl * leaves + l) * spines + s] as usize]
                                .down
                                .push(win);
                            ports[topo.sdown[(pl * spines + s) * leaves + l] as usize]
                                .down
                                .push(win);
                        }
                    }
                }
            }
        }
        let mut rng = Rng::new(cfg.seed ^ 0x5157_5eed);
        let switch_seed = (0..planes * leaves).map(|_| rng.next_u64()).collect();
        let mut ends: Vec<EndSlot> = Vec::new();
        let mut index = HashMap::new();
        for f in &flows {
            let mut slot = |h: u32, p: u32| {
                *index.entry((h, p)).or_insert_with(|| {
                    ends.push(EndSlot {
                        host: h,
                        peer: p,
                        end: None,
                        twin: 0,
                        uses: 0,
                        timer_at: None,
                        ready: false,
                        dirty: false,
                    });
                    (ends.len() - 1) as u32
                })
            };
            let (a, b) = (slot(f.src, f.dst), slot(f.dst, f.src));
            for (x, y) in [(a, b), (b, a)] {
                ends[x as usize].twin = y;
                ends[x as usize].uses += 1;
            }
        }
        let hosts_v = (0..hosts)
            .map(|h| Host {
                nic: (0..planes).map(|pl| topo.nic[h * planes + pl]).collect(),
                ready: VecDeque::new(),
                backlog: 0,
                ctx: make_ctx(h as u32),
                tx_packets: 0,
            })
            .collect();
        let flows_left = flows.len();
        Sim {
            cfg,
            now: 1_000,
            heap: BinaryHeap::new(),
            seq: 0,
            ports,
            topo,
            hosts: hosts_v,
            ends,
            index,
            make_end,
            retired: EndCounters::default(),
            live_ends: 0,
            ends_made: 0,
            peak_ends: 0,
            live_state: 0,
            peak_state: 0,
            late_packets: 0,
            rx_bins: Vec::new(),
            retire: Vec::new(),
            switch_seed,
            rng,
            flows,
            flows_left,
            events: 0,
            done_buf: Vec::new(),
            kicks: Vec::new(),
            dirty: Vec::new(),
            arrivals: Vec::new(),
            free_arrivals: Vec::new(),
            start: 1_000,
        }
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// Runs the workload until every flow completed or simulated time passes `deadline`;
    /// returns whether every flow completed.
    pub fn run(&mut self, deadline: u64) -> bool {
        self.start = self.now;
        for f in 0..self.flows.len() {
            if self.flows[f].deps.is_empty() {
                self.start_flow(f as u32);
            }
        }
        self.run_kicks();
        while self.flows_left > 0 {
            let Some(item) = self.heap.pop() else { break };
            if item.at > deadline {
                self.now = deadline;
                break;
            }
            self.now = self.now.max(item.at);
            self.events += 1;
            match item.ev {
                Ev::PortDone(p) => self.port_done(p),
                Ev::Arrive(i) => {
                    let (node, pkt) = self.arrivals[i as usize].take().expect("an arrival");
                    self.free_arrivals.push(i);
                    self.arrive(node, pkt)
                }
                Ev::Timer(e, d) => {
                    let now = self.now;
                    let slot = &mut self.ends[e as usize];
                    if slot.timer_at == Some(d) {
                        slot.timer_at = None;
                        let Some(end) = slot.end.as_mut() else {
                            continue;
                        };
                        if end.next_timeout().is_some_and(|t| t <= now) {
                            end.on_timeout(now, &mut self.hosts[slot.host as usize].ctx);
                        }
                        self.touch(e);
                    }
                }
            }
            self.run_kicks();
        }
        self.flows_left == 0
    }

    /// The current instant's deferred work: the NICs take what their endpoints have, then
    /// the timers of the endpoints touched are re-armed (once each, however often they were
    /// touched: nothing else happens in between, so only the last deadline matters).
    fn run_kicks(&mut self) {
        while let Some(h) = self.kicks.pop() {
            self.kick(h);
        }
        while let Some(e) = self.dirty.pop() {
            self.ends[e as usize].dirty = false;
            self.rearm(e);
        }
        while let Some(e) = self.retire.pop() {
            let slot = &mut self.ends[e as usize];
            if let Some(end) = slot.end.take() {
                let c = end.counters();
                let r = &mut self.retired;
                r.data_packets += c.data_packets;
                r.retransmits += c.retransmits;
                r.timeouts += c.timeouts;
                r.failed += c.failed;
                slot.timer_at = None;
                self.live_ends -= 1;
                self.live_state -= end.state_bytes();
            }
        }
    }

    /// Makes the endpoints of the pair of slot `e` if they are not there yet.
    fn open(&mut self, e: u32) {
        let twin = self.ends[e as usize].twin;
        for x in [e, twin] {
            let slot = &mut self.ends[x as usize];
            if slot.end.is_none() {
                let end = (self.make_end)(slot.host, slot.peer);
                self.live_state += end.state_bytes();
                slot.end = Some(end);
                self.live_ends += 1;
                self.ends_made += 1;
            }
        }
        self.peak_ends = self.peak_ends.max(self.live_ends);
        self.peak_state = self.peak_state.max(self.live_state);
    }

    /// Counters of every endpoint, dropped ones included.
    pub fn counters(&self) -> EndCounters {
        let mut r = self.retired;
        for c in self
            .ends
            .iter()
            .filter_map(|s| s.end.as_ref())
            .map(|e| e.counters())
        {
            r.data_packets += c.data_packets;
            r.retransmits += c.retransmits;
            r.timeouts += c.timeouts;
            r.failed += c.failed;
        }
        r
    }

    fn mark_dirty(&mut self, e: u32) {
        let slot = &mut self.ends[e as usize];
        if !slot.dirty {
            slot.dirty = true;
            self.dirty.push(e);
        }
    }

    fn start_flow(&mut self, f: u32) {
        let now = self.now;
        let fl = &mut self.flows[f as usize];
        fl.start_ns = Some(now);
        let (e, bytes, qp) = (self.index[&(fl.src, fl.dst)], fl.bytes, fl.qp);
        self.open(e);
        if let Some(end) = self.ends[e as usize].end.as_mut() {
            end.post(now, f, qp, bytes);
        }
        self.touch(e);
    }

    fn complete_flow(&mut self, f: u32) {
        let now = self.now;
        let fl = &mut self.flows[f as usize];
        assert!(fl.end_ns.is_none(), "flow {f} completed twice");
        fl.end_ns = Some(now);
        let e = self.index[&(fl.src, fl.dst)];
        self.flows_left -= 1;
        let twin = self.ends[e as usize].twin;
        for x in [e, twin] {
            let slot = &mut self.ends[x as usize];
            slot.uses -= 1;
            if slot.uses == 0 {
                self.retire.push(x);
            }
        }
        let deps = std::mem::take(&mut fl.dependents);
        for &d in &deps {
            let g = &mut self.flows[d as usize];
            g.pending -= 1;
            if g.pending == 0 {
                self.start_flow(d);
            }
        }
        self.flows[f as usize].dependents = deps;
    }

    /// After anything happened to end `e`: its finished flows, its place in its host's
    /// round robin, its timer.
    fn touch(&mut self, e: u32) {
        let mut done = std::mem::take(&mut self.done_buf);
        if let Some(end) = self.ends[e as usize].end.as_mut() {
            end.take_done(&mut done);
        }
        for &f in &done {
            self.complete_flow(f);
        }
        done.clear();
        self.done_buf = done;
        let slot = &mut self.ends[e as usize];
        if slot.end.is_none() {
            return;
        }
        if !slot.ready {
            slot.ready = true;
            self.hosts[slot.host as usize].ready.push_back(e);
        }
        self.kicks.push(slot.host);
        self.mark_dirty(e);
    }

    fn rearm(&mut self, e: u32) {
        let now = self.now;
        let slot = &mut self.ends[e as usize];
        if let Some(d) = slot.end.as_ref().and_then(|end| end.next_timeout()) {
            // Due now but waiting for its turn at the NIC: its turn re-arms it.
            if d <= now && slot.ready {
                return;
            }
            let d = d.max(now);
            if slot.timer_at.is_none_or(|t| d < t || t < now) {
                slot.timer_at = Some(d);
                self.push(d, Ev::Timer(e, d));
            }
        }
    }

    /// The NIC of host `h` takes packets from its endpoints while it has room.
    fn kick(&mut self, h: u32) {
        let now = self.now;
        let planes = self.cfg.planes.max(1);
        let limit = NIC_BACKLOG * planes;
        loop {
            let host = &mut self.hosts[h as usize];
            if host.backlog >= limit {
                break;
            }
            let Some(e) = host.ready.pop_front() else {
                break;
            };
            let slot = &mut self.ends[e as usize];
            let Some(end) = slot.end.as_mut() else {
                slot.ready = false;
                continue;
            };
            match end.poll_transmit(now, &mut host.ctx) {
                Some(mut pkt) => {
                    pkt.src = h;
                    pkt.dst = slot.peer;
                    let port = host.nic[usize::from(pkt.plane) % planes];
                    host.ready.push_back(e);
                    host.backlog += 1;
                    host.tx_packets += 1;
                    self.mark_dirty(e);
                    self.enqueue(port, pkt);
                }
                None => {
                    slot.ready = false;
                    let mut done = std::mem::take(&mut self.done_buf);
                    end.take_done(&mut done);
                    for &f in &done {
                        self.complete_flow(f);
                    }
                    done.clear();
                    self.done_buf = done;
                    self.mark_dirty(e);
                }
            }
        }
    }

    fn enqueue(&mut self, port: u32, mut pkt: Packet) {
        let now = self.now;
        let p = &mut self.ports[port as usize];
        if p.is_down(now) {
            p.fail_drops += 1;
            self.nic_release(port);
            return;
        }
        let wire = u64::from(pkt.wire);
        if p.bytes + wire > p.buffer {
            p.drops += 1;
            self.nic_release(port);
            return;
        }
        if pkt.ecn_capable && p.bytes > p.ecn {
            pkt.ce = true;
            p.marks += 1;
        }
        p.bytes += wire;
        p.max_bytes = p.max_bytes.max(p.bytes);
        p.queue.push_back(pkt);
        if !p.busy {
            self.start_port(port);
        }
    }

    fn nic_release(&mut self, port: u32) {
        if let Some(h) = self.ports[port as usize].host_nic {
            self.hosts[h as usize].backlog -= 1;
            self.kicks.push(h);
        }
    }

    fn start_port(&mut self, port: u32) {
        let p = &mut self.ports[port as usize];
        match p.queue.front() {
            Some(pkt) => {
                p.busy = true;
                let at = self.now + p.ser_ns(pkt.wire);
                self.push(at, Ev::PortDone(port));
            }
            None => p.busy = false,
        }
    }

    fn port_done(&mut self, port: u32) {
        let now = self.now;
        let p = &mut self.ports[port as usize];
        let Some(pkt) = p.queue.pop_front() else {
            p.busy = false;
            return;
        };
        p.bytes -= u64::from(pkt.wire);
        p.tx_packets += 1;
        let (to, at) = (p.to, now + p.delay_ns);
        let lost = self.rng.chance(p.loss_ppm);
        if lost {
            self.ports[port as usize].loss_drops += 1;
        } else {
            let i = match self.free_arrivals.pop() {
                Some(i) => {
                    self.arrivals[i as usize] = Some((to, pkt));
                    i
                }
                None => {
                    self.arrivals.push(Some((to, pkt)));
                    (self.arrivals.len() - 1) as u32
                }
            };
            self.push(at, Ev::Arrive(i));
        }
        self.nic_release(port);
        self.start_port(port);
    }

    fn arrive(&mut self, node: Node, pkt: Packet) {
        match node {
            Node::Host(h) => {
                if pkt.wire >= RX_DATA_BYTES {
                    let bin = (self.now / RX_BIN_NS) as usize;
                    if self.rx_bins.len() <= bin {
                        self.rx_bins.resize(bin + 1, 0);
                    }
                    self.rx_bins[bin] += u64::from(pkt.wire);
                }
                let Some(&e) = self.index.get(&(h, pkt.src)) else {
                    return;
                };
                let now = self.now;
                let Some(end) = self.ends[e as usize].end.as_mut() else {
                    self.late_packets += 1;
                    return;
                };
                end.on_packet(now, pkt, &mut self.hosts[h as usize].ctx);
                self.touch(e);
            }
            Node::Leaf(pl, l) => {
                let port = self.leaf_route(usize::from(pl), usize::from(l), &pkt);
                self.enqueue(port, pkt);
            }
            Node::Spine(pl, s) => {
                let t = &self.topo;
                let dl = pkt.dst as usize / t.hpl;
                let port = t.sdown[(usize::from(pl) * t.spines + usize::from(s)) * t.leaves + dl];
                self.enqueue(port, pkt);
            }
        }
    }

    /// Leaf `l` of plane `pl`: down to the host, or up to a spine chosen by ECMP among the
    /// spines routing believes reach the destination's leaf.
    fn leaf_route(&self, pl: usize, l: usize, pkt: &Packet) -> u32 {
        let t = &self.topo;
        let dl = pkt.dst as usize / t.hpl;
        if dl == l {
            return t.down[pl * self.cfg.hosts + pkt.dst as usize];
        }
        let (now, rr) = (self.now, self.cfg.reroute_ns);
        let usable = |s: usize| {
            !self.ports[t.up[(pl * t.leaves + l) * t.spines + s] as usize].routed_down(now, rr)
                && !self.ports[t.sdown[(pl * t.spines + s) * t.leaves + dl] as usize]
                    .routed_down(now, rr)
        };
        let h = ecmp_hash(
            self.switch_seed[pl * t.leaves + l],
            pkt.src,
            pkt.dst,
            pkt.sport,
            DPORT,
        );
        let mut s = (h % t.spines as u64) as usize;
        if !usable(s) {
            let alive: Vec<usize> = (0..t.spines).filter(|&s| usable(s)).collect();
            if !alive.is_empty() {
                s = alive[(h % alive.len() as u64) as usize];
            }
        }
        t.up[(pl * t.leaves + l) * t.spines + s]
    }

    /// Fabric statistics over the switch ports.
    pub fn stats(&self) -> RunStats {
        let mut r = RunStats {
            events: self.events,
            packets: self.hosts.iter().map(|h| h.tx_packets).sum(),
            ends_made: self.ends_made,
            peak_ends: self.peak_ends,
            peak_state: self.peak_state,
            late_packets: self.late_packets,
            rx_bins: self.rx_bins.clone(),
            ..RunStats::default()
        };
        for p in self.ports.iter().filter(|p| p.switch) {
            r.max_queue = r.max_queue.max(p.max_bytes);
            r.drops += p.drops;
            r.marks += p.marks;
            r.fail_drops += p.fail_drops;
            r.loss_drops += p.loss_drops;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::{Body, CountingMemory};
    use metaroce_transport::congestion::RateAllocator;

    fn sim(cfg: FabricConfig) -> Sim {
        Sim::new(
            cfg,
            Vec::new(),
            Box::new(|_, _| unreachable!("no flows, no endpoints")),
            |_| HostCtx {
                alloc: RateAllocator::new(0),
                mem: CountingMemory::default(),
                rx_bytes: 0,
            },
        )
    }

    fn pkt(src: u32, dst: u32, sport: u16) -> Packet {
        Packet {
            src,
            dst,
            plane: 0,
            sport,
            wire: 100,
            ecn_capable: false,
            ce: false,
            qp: 0,
            body: Body::Meta(Vec::new()),
        }
    }

    /// The spine a packet from leaf 0 goes to.
    fn spine_of(s: &Sim, p: &Packet) -> Option<u16> {
        let port = s.leaf_route(0, 0, p);
        match s.ports[port as usize].to {
            Node::Spine(_, sp) => Some(sp),
            _ => None,
        }
    }

    #[test]
    fn topology_has_the_ports_it_should() {
        let mut cfg = FabricConfig::new(20, 3);
        cfg.hosts_per_leaf = 8;
        cfg.spines = 5;
        assert_eq!(cfg.leaves(), 3);
        let s = sim(cfg);
        // NIC and leaf-to-host ports per host and plane, two per leaf-spine pair and plane.
        assert_eq!(s.ports.len(), 20 * 3 * 2 + 3 * 3 * 5 * 2);
        assert_eq!(
            s.ports.iter().filter(|p| p.switch).count(),
            20 * 3 + 3 * 3 * 5 * 2
        );
    }

    #[test]
    fn ecmp_spreads_by_source_port_and_is_stable() {
        let mut cfg = FabricConfig::new(16, 1);
        cfg.spines = 4;
        let s = sim(cfg);
        // Same host on the same leaf: no spine.
        assert_eq!(spine_of(&s, &pkt(0, 1, 1000)), None);
        let mut seen = [0u32; 4];
        for sport in 49_152..49_152 + 400 {
            let a = spine_of(&s, &pkt(0, 9, sport)).unwrap();
            assert_eq!(
                spine_of(&s, &pkt(0, 9, sport)),
                Some(a),
                "a function of the 5-tuple"
            );
            seen[usize::from(a)] += 1;
        }
        assert!(
            seen.iter().all(|&n| n > 60),
            "spread over the spines: {seen:?}"
        );
    }

    #[test]
    fn leaves_route_around_a_failed_spine_after_reroute_time() {
        let mut cfg = FabricConfig::new(16, 1);
        cfg.spines = 4;
        cfg.reroute_ns = 1_000_000;
        cfg.failures.push(Failure {
            target: FailTarget::Spine { plane: 0, spine: 2 },
            from_ns: 10_000,
            until_ns: 5_000_000,
        });
        let mut s = sim(cfg);
        let count = |s: &Sim| {
            (0..400u16)
                .filter(|&i| spine_of(s, &pkt(0, 9, 49_152 + i)) == Some(2))
                .count()
        };
        s.now = 500_000; // down, not yet routed around: black-holed
        assert!(count(&s) > 60);
        s.now = 1_010_000;
        assert_eq!(count(&s), 0);
        s.now = 5_000_000; // back
        assert!(count(&s) > 60);
    }
}
