// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A deterministic fabric simulator: two endpoints, Vec-backed memory regions, and a link
//! model with loss, per-path delay and jitter (FIFO per path, so jitter reorders packets
//! across paths only, like ECMP routes), duplication and a serialisation rate; time advances
//! through an event queue. Everything is seeded.
//!
//! Two network models:
//! - the single link ([`LinkConfig`]): one behaviour for the whole connection, a FIFO route
//!   per path id;
//! - an ECMP fabric ([`EcmpFabric`], [`Sim::with_fabric`]): `planes` planes of `links_per_plane`
//!   links each; a packet's link is a hash of (plane, UDP source port), as an ECMP switch
//!   picks it, so a path that changes entropy moves to another link. Each link has its own
//!   loss, delay, jitter (FIFO or overtaking), rate and ECN marking, and can be cut
//!   (blackholed, both directions) for a time interval. The endpoint's own serialisation
//!   rate is still `LinkConfig::rate_bits_per_us`.
#![allow(dead_code)]

pub mod fabric;

pub use metaroce_transport::connection::Arrival;
use metaroce_transport::connection::{Config, Connection, Event, StreamSlots, Transmit};
use metaroce_transport::memory::{Access, AccessError, AtomicOp, Memory, SgList, Sge};
use metaroce_transport::stream::{
    CqStatus, Cqe, RecvWqe, SendWqe, Stream, StreamConfig, StreamId, WrOpcode,
};
use metaroce_transport::wire::Opcode;
use metaroce_transport::zero::ZeroValid;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Paths the simulated connections use unless a test configures more.
pub const PATHS: usize = 8;
/// Path capacity of the simulated connections (tests may use up to this many).
pub const MAX_PATHS: usize = 256;
pub const STREAMS: usize = 4;
pub type Conn = Connection<metaroce_transport::connection::Paths<MAX_PATHS>, SimSlots>;

/// Streams per chunk of [`SimSlots`].
pub const CHUNK: usize = 64;
/// Most chunks.
pub const MAX_CHUNKS: usize = 128;

/// Stream storage made the way the kernel makes its own: chunks allocated as streams open,
/// valid as all-zero bytes (no chunks), so a zeroed connection holding it is valid. Counts
/// every slot access, so tests can check that a packet's cost does not grow with the number
/// of streams.
pub struct SimSlots {
    chunks: [Option<Box<[Stream; CHUNK]>>; MAX_CHUNKS],
    count: usize,
    /// Slot accesses so far.
    pub visits: std::cell::Cell<u64>,
}

// No chunks: an `Option<Box<_>>` is `None` when all-zero (the null pointer, which std
// guarantees), and a `Cell` is its contents. Every field is named, as `zero_valid!` does in the
// transport; the box's type is pinned, since an `Option` is not `ZeroValid`.
impl ZeroValid for SimSlots {}
const _: () = {
    #[allow(dead_code)]
    fn check(slots: &SimSlots) {
        fn field<T: ZeroValid + ?Sized>(_: &T) {}
        let SimSlots {
            chunks,
            count,
            visits,
        } = slots;
        let _: &[Option<Box<[Stream; CHUNK]>>; MAX_CHUNKS] = chunks;
        field(count);
        field(visits);
    }
};

impl Default for SimSlots {
    fn default() -> Self {
        SimSlots {
            chunks: std::array::from_fn(|_| None),
            count: 0,
            visits: std::cell::Cell::new(0),
        }
    }
}

impl SimSlots {
    fn at(&self, i: usize) -> Option<&Stream> {
        self.visits.set(self.visits.get() + 1);
        self.chunks.get(i / CHUNK)?.as_ref()?.get(i % CHUNK)
    }
}

impl StreamSlots for SimSlots {
    fn slot_count(&self) -> usize {
        self.count * CHUNK
    }
    fn slot(&self, i: usize) -> Option<&Stream> {
        self.at(i)
    }
    fn slot_mut(&mut self, i: usize) -> Option<&mut Stream> {
        self.visits.set(self.visits.get() + 1);
        self.chunks.get_mut(i / CHUNK)?.as_mut()?.get_mut(i % CHUNK)
    }
    fn grow(&mut self) -> bool {
        let Some(c) = self.chunks.get_mut(self.count) else {
            return false;
        };
        // All-zero: closed streams (see `Connection::reset`).
        *c = Some(zeroed_box::<[Stream; CHUNK]>());
        self.count += 1;
        true
    }
    fn release(&mut self) {
        for c in self.chunks.iter_mut() {
            *c = None;
        }
        self.count = 0;
    }
}
/// Size of each endpoint's memory region.
pub const REGION: usize = 5 << 20;

/// Small deterministic PRNG (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// True with probability `ppm` / 1e6.
    pub fn chance(&mut self, ppm: u32) -> bool {
        (self.next_u64() % 1_000_000) < u64::from(ppm)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// A memory region: keys are both lkey and rkey.
pub struct Region {
    pub base: u64,
    pub data: Vec<u8>,
    pub remote_write: bool,
    pub remote_read: bool,
    pub remote_atomic: bool,
    /// Its protection domain.
    pub pd: u32,
}

#[derive(Default)]
pub struct SimMemory {
    pub regions: HashMap<u32, Region>,
    /// The shared receive queue of every stream opened with `StreamConfig::srq`.
    pub srq: std::collections::VecDeque<RecvWqe>,
    /// WQEs taken from `srq`.
    pub srq_taken: u64,
    /// The protection domain of each local QP (a QP not listed is in PD 0).
    pub qp_pd: HashMap<u32, u32>,
    /// Local QPs that grant no remote access (`qp_access_flags` 0).
    pub qp_no_remote: std::collections::HashSet<u32>,
    /// FLUSHes carried out.
    pub flushes: u64,
    /// Keys invalidated (SEND_WITH_INV), in order: they name nothing any more (their bytes
    /// stay readable to the test).
    pub invalidated: Vec<u32>,
}

impl SimMemory {
    pub fn add(&mut self, key: u32, base: u64, len: usize) {
        self.regions.insert(
            key,
            Region {
                base,
                data: vec![0; len],
                remote_write: true,
                remote_read: true,
                remote_atomic: true,
                pd: 0,
            },
        );
    }

    /// The region with key `key`, if QP `qp` may name it (same protection domain).
    fn region_for(&self, qp: u32, key: u32) -> Result<&Region, AccessError> {
        let r = self.regions.get(&key).ok_or(AccessError::Key)?;
        if r.pd != self.qp_pd.get(&qp).copied().unwrap_or(0) || self.invalidated.contains(&key) {
            return Err(AccessError::Key);
        }
        Ok(r)
    }

    fn range(
        &self,
        key: u32,
        va: u64,
        len: usize,
    ) -> Result<(&Region, std::ops::Range<usize>), AccessError> {
        let r = self.regions.get(&key).ok_or(AccessError::Key)?;
        let off = va.checked_sub(r.base).ok_or(AccessError::Bounds)? as usize;
        let end = off.checked_add(len).ok_or(AccessError::Bounds)?;
        if end > r.data.len() {
            return Err(AccessError::Bounds);
        }
        Ok((r, off..end))
    }

    pub fn bytes(&self, key: u32, va: u64, len: usize) -> &[u8] {
        let (r, range) = self.range(key, va, len).expect("range");
        &r.data[range]
    }

    pub fn fill(&mut self, key: u32, va: u64, src: &[u8]) {
        let (_, range) = self.range(key, va, src.len()).expect("range");
        self.regions.get_mut(&key).unwrap().data[range].copy_from_slice(src);
    }

    fn write(&mut self, key: u32, va: u64, src: &[u8]) -> Result<(), AccessError> {
        let (_, range) = self.range(key, va, src.len())?;
        self.regions.get_mut(&key).unwrap().data[range].copy_from_slice(src);
        Ok(())
    }
}

impl Memory for SimMemory {
    /// A key of the QP's protection domain names nothing any more, as a memory window's
    /// does once invalidated.
    fn invalidate(&mut self, qp: u32, rkey: u32) -> Result<(), AccessError> {
        self.region_for(qp, rkey)?;
        self.invalidated.push(rkey);
        Ok(())
    }
    fn read_local(
        &mut self,
        qp: u32,
        sge: &Sge,
        offset: u32,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        if u64::from(offset) + out.len() as u64 > u64::from(sge.len) {
            return Err(AccessError::Length);
        }
        self.region_for(qp, sge.lkey)?;
        let (r, range) = self.range(sge.lkey, sge.addr + u64::from(offset), out.len())?;
        out.copy_from_slice(&r.data[range]);
        Ok(())
    }
    fn write_local(
        &mut self,
        qp: u32,
        sge: &Sge,
        offset: u32,
        data: &[u8],
    ) -> Result<(), AccessError> {
        if u64::from(offset) + data.len() as u64 > u64::from(sge.len) {
            return Err(AccessError::Length);
        }
        self.region_for(qp, sge.lkey)?;
        self.write(sge.lkey, sge.addr + u64::from(offset), data)
    }
    fn check_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        len: u32,
        access: Access,
    ) -> Result<(), AccessError> {
        self.region_for(qp, rkey)?;
        let (r, _) = self.range(rkey, va, len as usize)?;
        if self.qp_no_remote.contains(&qp) {
            return Err(AccessError::Permission);
        }
        let ok = match access {
            Access::Read => r.remote_read,
            Access::Write => r.remote_write,
            Access::Atomic => r.remote_atomic,
        };
        if ok {
            Ok(())
        } else {
            Err(AccessError::Permission)
        }
    }
    fn write_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        data: &[u8],
    ) -> Result<(), AccessError> {
        self.check_remote(qp, rkey, va, data.len() as u32, Access::Write)?;
        self.write(rkey, va, data)
    }
    fn read_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        self.check_remote(qp, rkey, va, out.len() as u32, Access::Read)?;
        let (r, range) = self.range(rkey, va, out.len())?;
        out.copy_from_slice(&r.data[range]);
        Ok(())
    }
    fn atomic(&mut self, qp: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        if !va.is_multiple_of(8) {
            return Err(AccessError::Alignment);
        }
        self.check_remote(qp, rkey, va, 8, op.access())?;
        let (r, range) = self.range(rkey, va, 8)?;
        let old = u64::from_ne_bytes(r.data[range].try_into().unwrap());
        let new = op.apply(old);
        self.write(rkey, va, &new.to_ne_bytes())?;
        Ok(old)
    }

    /// A region that allows remote writes allows a global flush of its range (or of all of
    /// it); nothing here is persistent memory. Counted in `flushes`.
    fn flush(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        len: u64,
        persistent: bool,
        whole_region: bool,
    ) -> Result<(), AccessError> {
        let len = if whole_region {
            0
        } else {
            u32::try_from(len).map_err(|_| AccessError::Bounds)?
        };
        self.check_remote(qp, rkey, va, len, Access::Write)?;
        if persistent {
            return Err(AccessError::Permission);
        }
        self.flushes += 1;
        Ok(())
    }

    fn shared_recv(&mut self, _qp: u32) -> Option<RecvWqe> {
        let w = self.srq.pop_front()?;
        self.srq_taken += 1;
        Some(w)
    }
}

/// Link behaviour, the same in both directions. Probabilities in parts per million.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    pub loss_ppm: u32,
    pub dup_ppm: u32,
    /// Fraction of packets that get an extra delay (which, FIFO per path, also holds back
    /// the packets behind them on that path).
    pub reorder_ppm: u32,
    pub reorder_max_ns: u64,
    /// One-way delay of each path.
    pub path_delay_ns: Vec<u64>,
    /// Serialisation rate of each direction, bits per microsecond (10_000 = 10 Gbit/s).
    pub rate_bits_per_us: u64,
    /// Fraction of ECN-capable packets delivered with CE set.
    pub ce_ppm: u32,
}

impl LinkConfig {
    pub fn clean() -> Self {
        LinkConfig {
            loss_ppm: 0,
            dup_ppm: 0,
            reorder_ppm: 0,
            reorder_max_ns: 0,
            path_delay_ns: (0..PATHS as u64).map(|i| 5_000 + 1_000 * i).collect(),
            rate_bits_per_us: 10_000,
            ce_ppm: 0,
        }
    }
    pub fn loss(mut self, pct_x100: u32) -> Self {
        self.loss_ppm = pct_x100 * 100;
        self
    }
    pub fn reorder(mut self, pct: u32, max_ns: u64) -> Self {
        self.reorder_ppm = pct * 10_000;
        self.reorder_max_ns = max_ns;
        self
    }
    pub fn dup(mut self, pct_x100: u32) -> Self {
        self.dup_ppm = pct_x100 * 100;
        self
    }
}

/// One link of the ECMP fabric; both directions behave alike, each has its own queue.
/// Probabilities in parts per million.
#[derive(Clone, Debug)]
pub struct EcmpLink {
    pub loss_ppm: u32,
    /// One-way delay.
    pub delay_ns: u64,
    /// Fraction of packets that get an extra delay of up to `jitter_max_ns`.
    pub jitter_ppm: u32,
    pub jitter_max_ns: u64,
    /// FIFO (a switch queue: a delayed packet holds back the ones behind it), or packets may
    /// overtake each other on the link (reordering within a route).
    pub fifo: bool,
    /// Serialisation rate, bits per microsecond (0: unlimited).
    pub rate_bits_per_us: u64,
    /// Fraction of ECN-capable packets delivered with CE set.
    pub ce_ppm: u32,
    /// ECN-capable packets that waited longer than this in the link's queue are CE-marked
    /// (0: never), as a switch marks above a queue threshold.
    pub ecn_queue_ns: u64,
    /// Blackholed (both directions) from `.0` until `.1` (simulated ns).
    pub cut: Option<(u64, u64)>,
    /// A packet that would wait longer than this in the link's queue is dropped (tail drop,
    /// as a tbf qdisc's `latency`); 0: the queue is unbounded.
    pub queue_limit_ns: u64,
}

impl EcmpLink {
    pub fn clean(delay_ns: u64, rate_bits_per_us: u64) -> Self {
        EcmpLink {
            loss_ppm: 0,
            delay_ns,
            jitter_ppm: 0,
            jitter_max_ns: 0,
            fifo: true,
            rate_bits_per_us,
            ce_ppm: 0,
            ecn_queue_ns: 0,
            cut: None,
            queue_limit_ns: 0,
        }
    }

    pub fn is_cut(&self, now: u64) -> bool {
        self.cut.is_some_and(|(a, b)| now >= a && now < b)
    }
}

/// An ECMP fabric: `planes` x `links_per_plane` links, link `plane * links_per_plane + k`.
#[derive(Clone, Debug)]
pub struct EcmpFabric {
    pub planes: usize,
    pub links_per_plane: usize,
    pub links: Vec<EcmpLink>,
    /// ECN-capable packets that waited longer than this in the sending endpoint's own queue
    /// are CE-marked (0: never), as a host queue with ECN marks.
    pub nic_ecn_queue_ns: u64,
}

impl EcmpFabric {
    /// Every link clean with delay `delay_ns` and rate `rate_bits_per_us`.
    pub fn uniform(planes: usize, links_per_plane: usize, delay_ns: u64, rate: u64) -> Self {
        EcmpFabric {
            planes,
            links_per_plane,
            links: vec![EcmpLink::clean(delay_ns, rate); planes * links_per_plane],
            nic_ecn_queue_ns: 30_000,
        }
    }

    pub fn link_mut(&mut self, plane: usize, k: usize) -> &mut EcmpLink {
        &mut self.links[plane * self.links_per_plane + k]
    }

    /// The link an ECMP switch of `plane` sends a packet with UDP source port `sport` to.
    pub fn route(&self, plane: u8, sport: u16) -> usize {
        let plane = usize::from(plane) % self.planes.max(1);
        let mut h = (u64::from(sport) << 8 | plane as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 32;
        plane * self.links_per_plane + (h % self.links_per_plane.max(1) as u64) as usize
    }

    /// Cuts every link of `plane` from `from` until `until`.
    pub fn cut_plane(&mut self, plane: usize, from: u64, until: u64) {
        for k in 0..self.links_per_plane {
            self.link_mut(plane, k).cut = Some((from, until));
        }
    }
}

pub struct Endpoint {
    pub conn: Box<Conn>,
    pub mem: SimMemory,
    pub send_cqes: Vec<Cqe>,
    pub recv_cqes: Vec<Cqe>,
    pub stream_errors: Vec<(StreamId, CqStatus)>,
    /// `SendQueueRoom` events.
    pub sq_room: Vec<StreamId>,
    pub stream: StreamId,
    /// Packets this endpoint handed to the network.
    pub tx: u64,
}

impl Endpoint {
    fn drain_events(&mut self) {
        while let Some(e) = self.conn.poll_event() {
            match e {
                Event::SendCompletion(c) => self.send_cqes.push(c),
                Event::RecvCompletion(c) => self.recv_cqes.push(c),
                Event::StreamError { stream, status } => self.stream_errors.push((stream, status)),
                Event::SendQueueRoom(s) => self.sq_room.push(s),
            }
        }
    }
}

#[derive(Default, Debug, Clone)]
pub struct NetStats {
    pub sent: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub delivered: u64,
    pub bytes_delivered: u64,
    /// ECMP fabric: packets that entered each link (both directions).
    pub link_packets: Vec<u64>,
    /// ECMP fabric: packets dropped because their link was cut.
    pub cut_drops: u64,
    /// ECMP fabric: ACKs among `cut_drops`.
    pub cut_acks: u64,
    /// ECMP fabric: packets dropped at a full link queue (`EcmpLink::queue_limit_ns`).
    pub queue_drops: u64,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: u64,
    seq: u64,
    to: usize,
    path: u16,
    src_port: u16,
    ce: bool,
    bytes: Vec<u8>,
}

/// A datagram filter: (sender index, bytes) -> drop?
pub type DropFilter = Box<dyn Fn(usize, &[u8]) -> bool>;

pub struct Sim {
    pub now: u64,
    pub ep: [Endpoint; 2],
    pub link: LinkConfig,
    pub net: NetStats,
    /// While true, everything to or from endpoint 1 vanishes.
    pub b_dead: bool,
    /// Drops the datagrams (sender index, bytes) it returns true for.
    pub drop_if: Option<DropFilter>,
    rng: Rng,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    link_free: [u64; 2],
    path_last: Vec<[u64; 2]>,
    /// The ECMP fabric, if the simulation uses one instead of the per-path single link.
    pub fabric: Option<EcmpFabric>,
    fab_free: Vec<[u64; 2]>,
    fab_last: Vec<[u64; 2]>,
    /// Every `trace_bin_ns` (0: off), the data packets endpoint 0 has had acknowledged so far,
    /// one entry per bin from time 0 (see [`Sim::goodput_bins`]).
    pub trace_bin_ns: u64,
    pub trace: Vec<u64>,
    /// Per trace bin: the largest RTO in force on endpoint 0's usable paths.
    pub trace_rto: Vec<u64>,
}

pub fn config(local: u32, remote: u32, seed: u64) -> Config {
    let mut c = Config::new(local, remote);
    c.num_paths = PATHS as u16;
    c.mtu = 1024;
    c.seed = seed;
    c.path.min_rto = 150_000;
    c.path.initial_rto = 300_000;
    c.path.max_rto = 5_000_000;
    c.path.ack_delay = 5_000;
    c.stall_timeout = 2_000_000;
    c
}

impl Sim {
    /// Two endpoints, each with one stream (QPs 0x11 and 0x22) and a 1 MiB region (keys
    /// 1 on A, 2 on B; base addresses 0x10000 and 0x20000 times 16).
    pub fn new(link: LinkConfig, seed: u64) -> Self {
        Self::with_config(link, seed, |_| {})
    }

    pub fn with_config(link: LinkConfig, seed: u64, tweak: impl Fn(&mut Config)) -> Self {
        let mut ca = config(100, 200, seed ^ 0xa);
        let mut cb = config(200, 100, seed ^ 0xb);
        tweak(&mut ca);
        tweak(&mut cb);
        // Both made the way the kernel makes one (a connection with room for 256 paths is
        // too large for a test thread's stack): zeroed allocation, then `reset` in place.
        let mut a = zeroed_conn();
        a.reset(ca).expect("config");
        let mut b = zeroed_conn();
        b.reset(cb).expect("config");
        let sa = a.open_stream(StreamConfig::new(0x11, 0x22)).unwrap();
        let sb = b.open_stream(StreamConfig::new(0x22, 0x11)).unwrap();
        let mut ma = SimMemory::default();
        ma.add(1, 0x100000, REGION);
        let mut mb = SimMemory::default();
        mb.add(2, 0x200000, REGION);
        let ep = |conn, mem, stream| Endpoint {
            conn,
            mem,
            send_cqes: Vec::new(),
            recv_cqes: Vec::new(),
            stream_errors: Vec::new(),
            sq_room: Vec::new(),
            stream,
            tx: 0,
        };
        let paths = link.path_delay_ns.len();
        Sim {
            now: 1_000,
            ep: [ep(a, ma, sa), ep(b, mb, sb)],
            link,
            net: NetStats::default(),
            b_dead: false,
            drop_if: None,
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            seq: 0,
            link_free: [0; 2],
            path_last: vec![[0; 2]; paths],
            fabric: None,
            fab_free: Vec::new(),
            fab_last: Vec::new(),
            trace_bin_ns: 0,
            trace: Vec::new(),
            trace_rto: Vec::new(),
        }
    }

    /// Two endpoints with `num_paths` paths each over the ECMP fabric `fabric` (paths spread
    /// over its planes); `nic` sets the endpoints' own rate and the unused single-link
    /// fields.
    pub fn with_fabric(
        fabric: EcmpFabric,
        nic: LinkConfig,
        num_paths: u16,
        seed: u64,
        tweak: impl Fn(&mut Config),
    ) -> Self {
        let planes = fabric.planes as u8;
        let mut sim = Self::with_config(nic, seed, |c| {
            c.num_paths = num_paths;
            c.planes = planes;
            tweak(c)
        });
        let n = fabric.links.len();
        sim.fab_free = vec![[0; 2]; n];
        sim.fab_last = vec![[0; 2]; n];
        sim.net.link_packets = vec![0; n];
        sim.fabric = Some(fabric);
        sim
    }

    /// Through the ECMP fabric: the arrival time of a packet that left its endpoint at
    /// `depart`, or None if it is lost.
    fn fabric_hop(
        &mut self,
        from: usize,
        t: &Transmit,
        depart: u64,
        bytes: &[u8],
    ) -> Option<(u64, bool)> {
        let len = bytes.len();
        let fab = self.fabric.as_ref()?;
        let ser = (len as u64 + 50) * 8 * 1_000 / self.link.rate_bits_per_us.max(1);
        let nic_queued = depart.saturating_sub(ser).saturating_sub(self.now);
        let nic_marked = fab.nic_ecn_queue_ns > 0 && nic_queued > fab.nic_ecn_queue_ns;
        let l = fab.route(t.plane, t.src_port);
        let link = fab.links[l].clone();
        self.net.link_packets[l] += 1;
        if link.is_cut(self.now) {
            self.net.cut_drops += 1;
            if bytes.get(1) == Some(&(Opcode::Ack as u8)) {
                self.net.cut_acks += 1;
            }
            return None;
        }
        if self.rng.chance(link.loss_ppm) {
            return None;
        }
        let mut out = depart;
        let mut queued = 0;
        if let Some(ser) = ((len as u64 + 50) * 8 * 1_000).checked_div(link.rate_bits_per_us) {
            let start = out.max(self.fab_free[l][from]);
            queued = start - out;
            if link.queue_limit_ns > 0 && queued > link.queue_limit_ns {
                self.net.queue_drops += 1;
                return None;
            }
            out = start + ser;
            self.fab_free[l][from] = out;
        }
        let mut at = out + link.delay_ns;
        if self.rng.chance(link.jitter_ppm) {
            at += self.rng.below(link.jitter_max_ns);
        }
        if link.fifo {
            at = at.max(self.fab_last[l][from]);
            self.fab_last[l][from] = at;
        }
        let marked = nic_marked || (link.ecn_queue_ns > 0 && queued > link.ecn_queue_ns);
        let ce = t.ecn_capable && (marked || self.rng.chance(link.ce_ppm));
        Some((at, ce))
    }

    fn send(&mut self, from: usize, t: Transmit, bytes: Vec<u8>) {
        self.net.sent += 1;
        let to = 1 - from;
        if self.drop_if.as_ref().is_some_and(|f| f(from, &bytes))
            || (self.b_dead && (from == 1 || to == 1))
        {
            self.net.dropped += 1;
            return;
        }
        // Serialisation on the sender's link (every packet, lost or not).
        let ser = (bytes.len() as u64 + 50) * 8 * 1_000 / self.link.rate_bits_per_us.max(1);
        let depart = self.now.max(self.link_free[from]) + ser;
        self.link_free[from] = depart;
        if self.fabric.is_some() {
            let Some((at, ce)) = self.fabric_hop(from, &t, depart, &bytes) else {
                self.net.dropped += 1;
                return;
            };
            self.seq += 1;
            self.queue.push(Reverse(InFlight {
                at,
                seq: self.seq,
                to,
                path: t.path,
                src_port: t.src_port,
                ce,
                bytes,
            }));
            return;
        }
        if self.rng.chance(self.link.loss_ppm) {
            self.net.dropped += 1;
            return;
        }
        let p = usize::from(t.path) % self.path_last.len();
        let mut at = depart + self.link.path_delay_ns[p];
        if self.rng.chance(self.link.reorder_ppm) {
            at += self.rng.below(self.link.reorder_max_ns);
        }
        // Each path is one route: FIFO.
        at = at.max(self.path_last[p][from]);
        self.path_last[p][from] = at;
        let ce = t.ecn_capable && self.rng.chance(self.link.ce_ppm);
        let copies = if self.rng.chance(self.link.dup_ppm) {
            2
        } else {
            1
        };
        if copies == 2 {
            self.net.duplicated += 1;
        }
        for _ in 0..copies {
            self.seq += 1;
            self.queue.push(Reverse(InFlight {
                at,
                seq: self.seq,
                to,
                path: t.path,
                src_port: t.src_port,
                ce,
                bytes: bytes.clone(),
            }));
        }
    }

    /// Lets both endpoints send everything they have now and collects their events.
    pub fn pump(&mut self) {
        let mut buf = vec![0u8; 2048];
        loop {
            let mut any = false;
            for i in 0..2 {
                let now = self.now;
                let ep = &mut self.ep[i];
                if let Some(t) = ep.conn.poll_transmit(now, &mut buf, &mut ep.mem) {
                    ep.tx += 1;
                    let bytes = buf[..t.len].to_vec();
                    self.send(i, t, bytes);
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
        for ep in &mut self.ep {
            ep.drain_events();
        }
    }

    /// Advances to the next event (packet arrival or timer). Returns false if there is none.
    pub fn step(&mut self) -> bool {
        self.pump();
        let mut next = self.queue.peek().map(|Reverse(p)| p.at);
        for ep in &self.ep {
            if let Some(t) = ep.conn.poll_timeout() {
                next = Some(next.map_or(t, |n: u64| n.min(t)));
            }
        }
        let Some(t) = next else { return false };
        self.now = self.now.max(t);
        while let Some(Reverse(p)) = self.queue.peek() {
            if p.at > self.now {
                break;
            }
            let Reverse(p) = self.queue.pop().unwrap();
            self.net.delivered += 1;
            self.net.bytes_delivered += p.bytes.len() as u64;
            let now = self.now;
            let ep = &mut self.ep[p.to];
            let _ = ep.conn.handle_packet(
                now,
                &p.bytes,
                Arrival {
                    ecn_ce: p.ce,
                    rx_busy: false,
                    src_port: p.src_port,
                },
                &mut ep.mem,
            );
        }
        for ep in &mut self.ep {
            if ep.conn.poll_timeout().is_some_and(|d| d <= self.now) {
                ep.conn.handle_timeout(self.now);
            }
            // Completions are seen at the time they happen: a workload that is done must not
            // wait for the next timer (which may be far) to notice.
            ep.drain_events();
        }
        self.record_trace();
        true
    }

    fn record_trace(&mut self) {
        if self.trace_bin_ns == 0 {
            return;
        }
        let c = &self.ep[0].conn;
        let acked: u64 = (0..c.path_count())
            .filter_map(|p| c.path_stats(p))
            .map(|s| s.acked)
            .sum();
        let rto = (0..c.path_count())
            .filter_map(|p| c.path(p))
            .filter(|p| p.usable())
            .map(|p| p.rtt.rto())
            .max()
            .unwrap_or(0);
        let bin = (self.now / self.trace_bin_ns) as usize;
        let last = self.trace.last().copied().unwrap_or(0);
        let last_rto = self.trace_rto.last().copied().unwrap_or(0);
        while self.trace.len() < bin {
            self.trace.push(last);
            self.trace_rto.push(last_rto);
        }
        if self.trace.len() == bin {
            self.trace.push(acked);
            self.trace_rto.push(rto);
        } else {
            if let Some(v) = self.trace.last_mut() {
                *v = acked;
            }
            if let Some(v) = self.trace_rto.last_mut() {
                *v = rto;
            }
        }
    }

    /// Goodput of endpoint 0 per trace bin, in Mbit/s (packets of `mtu` payload bytes).
    pub fn goodput_bins(&self, mtu: u64) -> Vec<u64> {
        let mut prev = 0;
        self.trace
            .iter()
            .map(|&v| {
                let d = v.saturating_sub(prev);
                prev = v;
                d * mtu * 8 * 1_000 / self.trace_bin_ns.max(1)
            })
            .collect()
    }

    /// Runs until `done` or `deadline` (simulated ns); returns whether `done` became true.
    pub fn run_until(&mut self, deadline: u64, mut done: impl FnMut(&Sim) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.now > deadline || !self.step() {
                self.pump();
                return done(self);
            }
        }
    }

    pub fn retransmits(&self) -> u64 {
        self.ep.iter().map(|e| e.conn.stats().retransmits).sum()
    }
}

/// A connection allocated zeroed on the heap, never on the stack (reset it before use).
pub fn zeroed_conn() -> Box<Conn> {
    zeroed_box::<Conn>()
}

/// A `T` allocated zeroed on the heap, as the kernel allocates connections and streams.
pub fn zeroed_box<T: ZeroValid>() -> Box<T> {
    // SAFETY: `T: ZeroValid`: all-zero bytes are a valid `T`, which the compiler checked down
    // to the primitives (each struct's implementation names every field and requires its type
    // to be `ZeroValid`; each enum's asserts its variant 0; see `metaroce_transport::zero`).
    unsafe { Box::<T>::new_zeroed().assume_init() }
}

pub fn sge(key: u32, addr: u64, len: u32) -> SgList {
    SgList::single(Sge {
        addr,
        len,
        lkey: key,
    })
}

/// Deterministic test pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// One message of a workload: endpoint 0 is the requester.
#[derive(Clone, Copy, Debug)]
pub struct Msg {
    pub op: WrOpcode,
    pub len: u32,
}

/// Bytes reserved per message in both regions.
pub const SLOT: u64 = 16 << 10;
/// Offset of the FETCH_ADD counter in endpoint 1's region.
pub const COUNTER: u64 = 4 << 20;

#[derive(Debug, Clone)]
pub struct WorkloadResult {
    pub completed: bool,
    pub elapsed_ns: u64,
    pub payload_bytes: u64,
    pub retransmits: u64,
    /// Completion-timeout resends (each one a retry).
    pub pokes: u64,
    pub timeouts: u64,
    pub net: NetStats,
}

impl WorkloadResult {
    /// Payload goodput in Mbit/s (bits per microsecond).
    pub fn goodput_mbps(&self) -> u64 {
        self.payload_bytes * 8 * 1_000 / self.elapsed_ns.max(1)
    }
}

/// One stream pair's share of a workload: messages from `a` (on endpoint 0) to `b` (on
/// endpoint 1), using message slots from `slot0` on and the FETCH_ADD counter at `counter`.
#[derive(Clone, Debug)]
pub struct Job {
    pub a: StreamId,
    pub b: StreamId,
    pub msgs: Vec<Msg>,
    pub slot0: u64,
    pub counter: u64,
    /// Receive WQEs are posted only from this long after the start (exercises RNR).
    pub recv_delay_ns: u64,
}

struct JobState {
    consumers: Vec<usize>,
    next_send: usize,
    next_recv: usize,
}

/// Runs `msgs` from endpoint 0 to endpoint 1 on the default stream pair (posting as the queues
/// allow) and checks that every message completed exactly once, in order, successfully and
/// byte-exact.
pub fn run_workload(sim: &mut Sim, msgs: &[Msg], deadline: u64) -> WorkloadResult {
    let job = Job {
        a: sim.ep[0].stream,
        b: sim.ep[1].stream,
        msgs: msgs.to_vec(),
        slot0: 0,
        counter: COUNTER,
        recv_delay_ns: 0,
    };
    run_jobs(sim, &[job], deadline)
}

fn sends_of(sim: &Sim, s: StreamId) -> Vec<Cqe> {
    sim.ep[0]
        .send_cqes
        .iter()
        .filter(|c| c.stream == s)
        .copied()
        .collect()
}

fn recvs_of(sim: &Sim, s: StreamId) -> Vec<Cqe> {
    sim.ep[1]
        .recv_cqes
        .iter()
        .filter(|c| c.stream == s)
        .copied()
        .collect()
}

/// Runs several stream pairs' workloads at once over the same connection, with the checks of
/// [`run_workload`] for each.
pub fn run_jobs(sim: &mut Sim, jobs: &[Job], deadline: u64) -> WorkloadResult {
    let a_base = 0x100000u64;
    let b_base = 0x200000u64;
    let a_pat = pattern(0xa, COUNTER as usize);
    let b_pat = pattern(0xb, COUNTER as usize);
    sim.ep[0].mem.fill(1, a_base, &a_pat);
    sim.ep[1].mem.fill(2, b_base, &b_pat);
    for j in jobs {
        assert!((j.slot0 + j.msgs.len() as u64) * SLOT <= COUNTER);
        assert!(j.counter >= COUNTER && j.counter + 16 <= REGION as u64);
        sim.ep[1].mem.fill(2, b_base + j.counter, &[0u8; 16]);
    }
    let mut st: Vec<JobState> = jobs
        .iter()
        .map(|j| JobState {
            consumers: (0..j.msgs.len())
                .filter(|&i| j.msgs[i].op.consumes_recv())
                .collect(),
            next_send: 0,
            next_recv: 0,
        })
        .collect();
    let start = sim.now;
    let mut last_done = start;
    let done = |sim: &Sim, st: &[JobState]| {
        jobs.iter().zip(st).all(|(j, s)| {
            sends_of(sim, j.a).len() == j.msgs.len()
                && recvs_of(sim, j.b).len() == s.consumers.len()
        })
    };
    let total_sends = |sim: &Sim| jobs.iter().map(|j| sends_of(sim, j.a).len()).sum::<usize>();
    loop {
        // Keep the queues topped up.
        for (j, s) in jobs.iter().zip(st.iter_mut()) {
            while s.next_recv < s.consumers.len() && sim.now >= start + j.recv_delay_ns {
                let i = s.consumers[s.next_recv];
                let slot = (j.slot0 + i as u64) * SLOT;
                let w = RecvWqe {
                    wr_id: i as u64,
                    local: sge(2, b_base + slot, j.msgs[i].len),
                };
                if sim.ep[1].conn.post_recv(j.b, w).is_err() {
                    break;
                }
                s.next_recv += 1;
            }
            while s.next_send < j.msgs.len() {
                let i = s.next_send;
                let m = j.msgs[i];
                let slot = (j.slot0 + i as u64) * SLOT;
                let wqe = match m.op {
                    WrOpcode::RdmaRead => {
                        SendWqe::new(i as u64, m.op, sge(1, a_base + slot, m.len))
                            .remote(b_base + slot, 2)
                    }
                    WrOpcode::FetchAdd => SendWqe::new(i as u64, m.op, sge(1, a_base + slot, 8))
                        .remote(b_base + j.counter, 2)
                        .atomic(0, 1),
                    WrOpcode::CmpSwap => SendWqe::new(i as u64, m.op, sge(1, a_base + slot, 8))
                        .remote(b_base + j.counter + 8, 2)
                        .atomic(0, 0),
                    _ => SendWqe::new(i as u64, m.op, sge(1, a_base + slot, m.len))
                        .remote(b_base + slot, 2)
                        .imm(i as u32 ^ 0x5a5a),
                };
                let now = sim.now;
                if sim.ep[0].conn.post_send(now, j.a, wqe).is_err() {
                    break;
                }
                s.next_send += 1;
            }
        }
        let before = total_sends(sim);
        if done(sim, &st) || sim.now > deadline {
            break;
        }
        if !sim.step() {
            sim.pump();
            if !done(sim, &st) {
                break;
            }
        }
        if total_sends(sim) != before {
            last_done = sim.now;
        }
    }
    let completed = done(sim, &st);
    let mut payload_bytes = 0u64;
    if completed {
        for (j, s) in jobs.iter().zip(&st) {
            let msgs = &j.msgs;
            // Exactly once, in posting order, successful.
            for (k, c) in sends_of(sim, j.a).iter().enumerate() {
                assert_eq!(c.wr_id, k as u64, "send completions in order");
                assert_eq!(
                    c.status,
                    CqStatus::Success,
                    "message {k} ({:?})",
                    msgs[k].op
                );
            }
            for (k, c) in recvs_of(sim, j.b).iter().enumerate() {
                let i = s.consumers[k];
                assert_eq!(c.wr_id, i as u64, "receive completions in order");
                assert_eq!(c.status, CqStatus::Success);
                match msgs[i].op {
                    WrOpcode::Send => assert_eq!((c.byte_len, c.imm), (msgs[i].len, None)),
                    WrOpcode::SendWithImm => {
                        assert_eq!((c.byte_len, c.imm), (msgs[i].len, Some(i as u32 ^ 0x5a5a)))
                    }
                    _ => assert_eq!((c.byte_len, c.imm), (msgs[i].len, Some(i as u32 ^ 0x5a5a))),
                }
            }
            let mut adds = 0u64;
            for (i, m) in msgs.iter().enumerate() {
                let slot = (j.slot0 + i as u64) * SLOT;
                let (lo, len) = (slot as usize, m.len as usize);
                match m.op {
                    WrOpcode::RdmaRead => {
                        assert_eq!(
                            sim.ep[0].mem.bytes(1, a_base + slot, len),
                            &b_pat[lo..lo + len],
                            "READ {i}"
                        );
                    }
                    WrOpcode::FetchAdd => {
                        let got = u64::from_ne_bytes(
                            sim.ep[0].mem.bytes(1, a_base + slot, 8).try_into().unwrap(),
                        );
                        assert!(got < msgs.len() as u64);
                        adds += 1;
                    }
                    WrOpcode::CmpSwap => {}
                    _ => {
                        assert_eq!(
                            sim.ep[1].mem.bytes(2, b_base + slot, len),
                            &a_pat[lo..lo + len],
                            "{:?} {i}",
                            m.op
                        );
                    }
                }
                payload_bytes += if matches!(m.op, WrOpcode::FetchAdd | WrOpcode::CmpSwap) {
                    8
                } else {
                    u64::from(m.len)
                };
            }
            let counter = u64::from_ne_bytes(
                sim.ep[1]
                    .mem
                    .bytes(2, b_base + j.counter, 8)
                    .try_into()
                    .unwrap(),
            );
            assert_eq!(counter, adds, "every FETCH_ADD executed exactly once");
        }
    }
    WorkloadResult {
        completed,
        elapsed_ns: last_done.saturating_sub(start),
        payload_bytes,
        retransmits: sim.retransmits(),
        pokes: sim
            .ep
            .iter()
            .filter_map(|e| e.conn.stream_stats(e.stream))
            .map(|(r, _)| r.pokes)
            .sum(),
        timeouts: sim.ep.iter().map(|e| e.conn.stats().timeouts).sum(),
        net: sim.net.clone(),
    }
}

impl Sim {
    /// Reopens the default stream pair with settings changed by `f` (applied to both ends).
    pub fn reconfigure_streams(&mut self, f: impl Fn(&mut StreamConfig)) {
        for (i, (l, r)) in [(0x11, 0x22), (0x22, 0x11)].into_iter().enumerate() {
            let ep = &mut self.ep[i];
            ep.conn.close_stream(ep.stream);
            let mut cfg = StreamConfig::new(l, r);
            f(&mut cfg);
            ep.stream = ep.conn.open_stream(cfg).unwrap();
        }
    }

    /// Reopens both streams with their MSNs (and RSNs) starting at `start` in both directions.
    pub fn set_initial_msn(&mut self, start: u32) {
        for (i, (l, r)) in [(0x11, 0x22), (0x22, 0x11)].into_iter().enumerate() {
            let ep = &mut self.ep[i];
            ep.conn.close_stream(ep.stream);
            let mut cfg = StreamConfig::new(l, r);
            cfg.send_msn = start;
            cfg.recv_msn = start;
            ep.stream = ep.conn.open_stream(cfg).unwrap();
        }
    }

    /// Reopens both streams with another retry count (property tests at extreme loss).
    pub fn set_retry_cnt(&mut self, retry_cnt: u8) {
        for (i, (l, r)) in [(0x11, 0x22), (0x22, 0x11)].into_iter().enumerate() {
            let ep = &mut self.ep[i];
            ep.conn.close_stream(ep.stream);
            let mut cfg = StreamConfig::new(l, r);
            cfg.retry_cnt = retry_cnt;
            ep.stream = ep.conn.open_stream(cfg).unwrap();
        }
    }
}

impl Sim {
    /// Opens one more stream pair (QP `qa` on A, `qb` on B).
    pub fn open_pair(&mut self, qa: u32, qb: u32) -> (StreamId, StreamId) {
        let a = self.ep[0]
            .conn
            .open_stream(StreamConfig::new(qa, qb))
            .unwrap();
        let b = self.ep[1]
            .conn
            .open_stream(StreamConfig::new(qb, qa))
            .unwrap();
        (a, b)
    }
}

/// Property-test case count: `default`, or `PROPTEST_CASES` from the environment (for long
/// stress runs).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
