// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! An N-to-1 fabric for congestion tests: hosts with a NIC each (serialisation at a rate,
//! FIFO), all connected to one switch whose egress port towards each host is a FIFO queue
//! with a rate, a buffer (drops when full) and ECN marking above a threshold (instantaneous
//! queue at enqueue, as DCTCP-style switches mark). Each host owns a `RateAllocator` for its
//! inbound capacity, shared by all its connections. Senders keep RDMA WRITEs outstanding;
//! memory is not modelled (`NullMemory`: data integrity is the other tests' business).
//! Deterministic: no randomness at all besides the connections' seeded source ports.

use super::{Arrival, Conn, PATHS};
use metaroce_transport::congestion::{CcConfig, RateAllocator, PACKET_OVERHEAD};
use metaroce_transport::connection::{Config, Event, Transmit};
use metaroce_transport::memory::{Access, AccessError, AtomicOp, Memory, SgList, Sge};
use metaroce_transport::stream::{SendWqe, StreamConfig, StreamId, WrOpcode};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// Memory that accepts every access: reads give zeros, writes vanish.
pub struct NullMemory;

impl Memory for NullMemory {
    fn read_local(&mut self, _qp: u32, _: &Sge, _: u32, out: &mut [u8]) -> Result<(), AccessError> {
        out.fill(0);
        Ok(())
    }
    fn write_local(&mut self, _qp: u32, _: &Sge, _: u32, _: &[u8]) -> Result<(), AccessError> {
        Ok(())
    }
    fn check_remote(
        &mut self,
        _qp: u32,
        _: u32,
        _: u64,
        _: u32,
        _: Access,
    ) -> Result<(), AccessError> {
        Ok(())
    }
    fn write_remote(&mut self, _qp: u32, _: u32, _: u64, _: &[u8]) -> Result<(), AccessError> {
        Ok(())
    }
    fn read_remote(&mut self, _qp: u32, _: u32, _: u64, out: &mut [u8]) -> Result<(), AccessError> {
        out.fill(0);
        Ok(())
    }
    fn atomic(&mut self, _qp: u32, _: u32, _: u64, op: AtomicOp) -> Result<u64, AccessError> {
        Ok(op.apply(0))
    }
}

/// The fabric's shape.
#[derive(Clone, Debug)]
pub struct FabricConfig {
    /// NIC and switch-port rate, Mbit/s (= bits per microsecond).
    pub rate_mbps: u64,
    /// Egress buffer of each switch port, bytes.
    pub buffer_bytes: u64,
    /// ECN CE marking when the queue holds more than this, bytes.
    pub ecn_threshold_bytes: u64,
    /// One-way propagation, host to switch and switch to host, ns.
    pub hop_delay_ns: u64,
    /// Extra delay per path id (ECMP routes of slightly different length), ns.
    pub path_skew_ns: u64,
    /// Payload bytes per packet.
    pub mtu: u32,
    /// Congestion control of every connection.
    pub cc: CcConfig,
    /// The receivers' allocators know their capacity (else they grant nothing).
    pub allocators: bool,
}

impl FabricConfig {
    /// 10 Gbit/s everywhere, 1 MiB port buffers marking above 48 KiB, 2 us hops.
    pub fn default_10g() -> Self {
        FabricConfig {
            rate_mbps: 10_000,
            buffer_bytes: 1 << 20,
            ecn_threshold_bytes: 48 << 10,
            hop_delay_ns: 2_000,
            path_skew_ns: 100,
            mtu: 1024,
            cc: CcConfig::new(),
            allocators: true,
        }
    }

    /// Wire time of `bytes` (UDP payload) at the fabric's rate, ns.
    pub fn wire_ns(&self, bytes: usize) -> u64 {
        (bytes as u64 + u64::from(PACKET_OVERHEAD)) * 8 * 1_000 / self.rate_mbps.max(1)
    }
}

/// One connection end: host `host`'s connection to host `peer`.
pub struct End {
    pub host: usize,
    pub peer: usize,
    pub conn: Box<Conn>,
    pub stream: StreamId,
    /// This end keeps WRITEs outstanding (a flow's sender).
    pub sending: bool,
    /// Posted and completed WRITEs.
    pub posted: u64,
    pub completed: u64,
    /// Timer event scheduled for this deadline.
    timer_at: Option<u64>,
}

/// A switch egress port (towards one host).
#[derive(Default, Debug, Clone)]
pub struct Port {
    queue: VecDeque<Pkt>,
    pub queued_bytes: u64,
    busy: bool,
    /// Counters over the whole run.
    pub drops: u64,
    pub marks: u64,
    pub max_queue: u64,
    /// Wire bytes sent since `measure_from`, total and by source host.
    pub tx_bytes: u64,
    pub tx_by_src: HashMap<usize, u64>,
    /// Last time the queue exceeded `settle_bytes` (for convergence).
    pub last_above: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Pkt {
    from: usize,
    to: usize,
    ce: bool,
    ecn_capable: bool,
    src_port: u16,
    bytes: Vec<u8>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A packet reaches the switch.
    AtSwitch(Pkt),
    /// Port `to` finished sending its head packet.
    PortDone(usize),
    /// A packet reaches its host.
    Deliver(Pkt),
    /// End `i`'s timer.
    Timer(usize, u64),
}

pub struct Fabric {
    pub cfg: FabricConfig,
    pub now: u64,
    pub ends: Vec<End>,
    pub allocs: Vec<RateAllocator>,
    pub ports: Vec<Port>,
    nic_free: Vec<u64>,
    /// End index by (host, peer).
    index: HashMap<(usize, usize), usize>,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    /// Port statistics count from this time on.
    pub measure_from: u64,
    /// Queue level above which the fabric counts as unsettled.
    pub settle_bytes: u64,
    /// Bytes per WRITE and WRITEs kept outstanding per sending end.
    pub msg_len: u32,
    pub depth: u64,
    mem: NullMemory,
}

fn conn_config(cfg: &FabricConfig, host: usize, peer: usize, seed: u64) -> Config {
    let mut c = Config::new(conn_id(host, peer), conn_id(peer, host));
    c.num_paths = PATHS as u16;
    c.mtu = cfg.mtu;
    c.seed = seed;
    c.path.min_rto = 150_000;
    c.path.initial_rto = 300_000;
    c.path.max_rto = 5_000_000;
    c.path.ack_delay = 5_000;
    c.stall_timeout = 2_000_000;
    c.cc = cfg.cc;
    c
}

fn conn_id(host: usize, peer: usize) -> u32 {
    (host * 1000 + peer) as u32 + 1
}

impl Fabric {
    /// `hosts` hosts, no connections yet.
    pub fn new(cfg: FabricConfig, hosts: usize) -> Self {
        let cap = if cfg.allocators {
            cfg.rate_mbps as u32
        } else {
            0
        };
        Fabric {
            now: 1_000,
            ends: Vec::new(),
            allocs: (0..hosts)
                .map(|_| {
                    RateAllocator::new(cap)
                        .with_epoch(100_000)
                        .with_interval(20_000)
                })
                .collect(),
            ports: vec![Port::default(); hosts],
            nic_free: vec![0; hosts],
            index: HashMap::new(),
            events: BinaryHeap::new(),
            seq: 0,
            measure_from: 0,
            settle_bytes: cfg.ecn_threshold_bytes * 2,
            msg_len: 64 << 10,
            depth: 8,
            mem: NullMemory,
            cfg,
        }
    }

    fn end_for(&mut self, host: usize, peer: usize) -> usize {
        if let Some(&i) = self.index.get(&(host, peer)) {
            return i;
        }
        let seed = (host as u64) << 32 | peer as u64 | 1;
        let mut conn = super::zeroed_conn();
        conn.reset(conn_config(&self.cfg, host, peer, seed))
            .expect("config");
        let stream = conn
            .open_stream(StreamConfig::new(conn_id(host, peer), conn_id(peer, host)))
            .expect("stream");
        self.ends.push(End {
            host,
            peer,
            conn,
            stream,
            sending: false,
            posted: 0,
            completed: 0,
            timer_at: None,
        });
        let i = self.ends.len() - 1;
        self.index.insert((host, peer), i);
        i
    }

    /// A flow from `src` to `dst`, starting now; returns the sender's end index.
    pub fn add_flow(&mut self, src: usize, dst: usize) -> usize {
        let s = self.end_for(src, dst);
        self.end_for(dst, src);
        self.ends[s].sending = true;
        self.service(s);
        s
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, ev)));
    }

    /// Keeps WRITEs outstanding, feeds the connection's allocator, sends what the end has
    /// to send and re-arms its timer.
    fn service(&mut self, i: usize) {
        let now = self.now;
        let msg_len = self.msg_len;
        let depth = self.depth;
        let e = &mut self.ends[i];
        while let Some(ev) = e.conn.poll_event() {
            if let Event::SendCompletion(c) = ev {
                assert_eq!(c.status, metaroce_transport::stream::CqStatus::Success);
                e.completed += 1;
            }
        }
        while e.sending && e.posted - e.completed < depth {
            let wqe = SendWqe::new(
                e.posted,
                WrOpcode::RdmaWrite,
                SgList::single(Sge {
                    addr: 0,
                    len: msg_len,
                    lkey: 1,
                }),
            )
            .remote(0, 1);
            if e.conn.post_send(now, e.stream, wqe).is_err() {
                break;
            }
            e.posted += 1;
        }
        let alloc = &mut self.allocs[e.host];
        e.conn.update_allocation(now, alloc);
        let mut buf = vec![0u8; self.cfg.mtu as usize + 200];
        let mut out: Vec<(Transmit, Vec<u8>)> = Vec::new();
        while let Some(t) = e.conn.poll_transmit(now, &mut buf, &mut self.mem) {
            out.push((t, buf[..t.len].to_vec()));
        }
        let (host, peer) = (e.host, e.peer);
        let deadline = e.conn.poll_timeout();
        for (t, bytes) in out {
            self.send(host, peer, t, bytes);
        }
        let e = &mut self.ends[i];
        if let Some(d) = deadline {
            let d = d.max(now);
            if e.timer_at.is_none_or(|t| d < t || t < now) {
                e.timer_at = Some(d);
                self.push(d, Ev::Timer(i, d));
            }
        }
    }

    fn send(&mut self, from: usize, to: usize, t: Transmit, bytes: Vec<u8>) {
        let ser = self.cfg.wire_ns(bytes.len());
        let depart = self.now.max(self.nic_free[from]) + ser;
        self.nic_free[from] = depart;
        let at = depart + self.cfg.hop_delay_ns + self.cfg.path_skew_ns * u64::from(t.path);
        let pkt = Pkt {
            from,
            to,
            ce: false,
            ecn_capable: t.ecn_capable,
            src_port: t.src_port,
            bytes,
        };
        self.push(at, Ev::AtSwitch(pkt));
    }

    fn enqueue(&mut self, mut pkt: Pkt) {
        let wire = pkt.bytes.len() as u64 + u64::from(PACKET_OVERHEAD);
        let (buffer, k, settle, now) = (
            self.cfg.buffer_bytes,
            self.cfg.ecn_threshold_bytes,
            self.settle_bytes,
            self.now,
        );
        let to = pkt.to;
        let p = &mut self.ports[to];
        if p.queued_bytes + wire > buffer {
            p.drops += 1;
            return;
        }
        if pkt.ecn_capable && p.queued_bytes > k {
            pkt.ce = true;
            p.marks += 1;
        }
        p.queued_bytes += wire;
        p.max_queue = p.max_queue.max(p.queued_bytes);
        if p.queued_bytes > settle {
            p.last_above = now;
        }
        p.queue.push_back(pkt);
        if !p.busy {
            self.start_port(to);
        }
    }

    fn start_port(&mut self, to: usize) {
        let ser = match self.ports[to].queue.front() {
            Some(p) => self.cfg.wire_ns(p.bytes.len()),
            None => {
                self.ports[to].busy = false;
                return;
            }
        };
        self.ports[to].busy = true;
        self.push(self.now + ser, Ev::PortDone(to));
    }

    fn port_done(&mut self, to: usize) {
        let measuring = self.now >= self.measure_from;
        let p = &mut self.ports[to];
        let Some(pkt) = p.queue.pop_front() else {
            p.busy = false;
            return;
        };
        let wire = pkt.bytes.len() as u64 + u64::from(PACKET_OVERHEAD);
        p.queued_bytes -= wire;
        if measuring {
            p.tx_bytes += wire;
            *p.tx_by_src.entry(pkt.from).or_default() += wire;
        }
        let at = self.now + self.cfg.hop_delay_ns;
        self.push(at, Ev::Deliver(pkt));
        self.start_port(to);
    }

    /// Runs until `until` (simulated ns).
    pub fn run(&mut self, until: u64) {
        self.run_with(until, |_| {});
    }

    /// Runs until `until`, calling `probe` after every event.
    pub fn run_with(&mut self, until: u64, mut probe: impl FnMut(&Fabric)) {
        while let Some(Reverse((at, _, _))) = self.events.peek() {
            if *at > until {
                break;
            }
            let Reverse((at, _, ev)) = self.events.pop().unwrap();
            self.now = self.now.max(at);
            match ev {
                Ev::AtSwitch(p) => self.enqueue(p),
                Ev::PortDone(to) => self.port_done(to),
                Ev::Deliver(p) => {
                    let Some(&i) = self.index.get(&(p.to, p.from)) else {
                        continue;
                    };
                    let now = self.now;
                    let e = &mut self.ends[i];
                    let _ = e.conn.handle_packet(
                        now,
                        &p.bytes,
                        Arrival {
                            ecn_ce: p.ce,
                            rx_busy: false,
                            src_port: p.src_port,
                        },
                        &mut self.mem,
                    );
                    self.service(i);
                }
                Ev::Timer(i, d) => {
                    if self.ends[i].timer_at != Some(d) {
                        continue;
                    }
                    self.ends[i].timer_at = None;
                    let now = self.now;
                    let e = &mut self.ends[i];
                    if e.conn.poll_timeout().is_some_and(|t| t <= now) {
                        e.conn.handle_timeout(now);
                    }
                    self.service(i);
                }
            }
            probe(self);
        }
        self.now = self.now.max(until);
    }

    /// Starts port statistics afresh from now.
    pub fn start_measuring(&mut self) {
        self.measure_from = self.now;
        for p in &mut self.ports {
            p.tx_bytes = 0;
            p.tx_by_src.clear();
        }
    }
}

/// Jain's fairness index of `xs` (1 = all equal, 1/n = one takes all).
pub fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let q: f64 = xs.iter().map(|x| x * x).sum();
    if q == 0.0 {
        return 0.0;
    }
    s * s / (xs.len() as f64 * q)
}
