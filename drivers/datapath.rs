// SPDX-License-Identifier: GPL-2.0

//! The MetaRoCE data path of a device: the transport core (`crate::transport`, the same
//! sans-IO source the host tests drive) fed with the QPs' rings, arriving datagrams and time.
//!
//! - One [`Peer`] per remote device address: it owns the unified [`Conn`] (paths, their
//!   sequence spaces and congestion state) on which every QP to that peer is a stream.
//! - Three contexts drive a peer: the doorbell syscall drives its QP's peer directly;
//!   arriving datagrams are processed in the UDP receive softirq that brings them
//!   ([`Engine::receive`]), once the burst they came in (a GSO packet the stack cuts up) is
//!   all in, so one run and one ACK cover the burst; timers are one soft high-resolution
//!   alarm per device whose callback runs them in softirq ([`CpuThreads::arm`]). Bulk
//!   receive runs (`Engine::rx_spread`) go to the receive thread of another CPU (one per CPU,
//!   real-time priority, so a busy-polling application does not delay it) than the one
//!   sending them, so that sending and receiving proceed in parallel. No thread wakeup on a
//!   small message's way (measurements: `docs/datapath.md`).
//! - Sending is batched like a NIC's TSO: the transport sends runs of up to [`PATH_BURST`]
//!   packets on one path (`Config::path_burst`; the spraying shares stay the same), and
//!   consecutive datagrams of one path go to the IP stack as one UDP GSO packet
//!   ([`TxBatch`], `UdpSocket::send_segments`): one route lookup, one pass through the
//!   qdiscs, the veth and the peer's IP layer for the run; the receiving socket's UDP layer
//!   cuts it up again. Streams take
//!   turns of 16 packets (`Config::stream_quantum`), so a QP's message goes out whole rather
//!   than interleaved packet by packet with thousands of others.
//! - Packets are as large as the link allows (`device::payload_mtu`): 1344 payload bytes on
//!   a 1500-byte link, not the IB MTU's 1024, so a 64 KiB message is 49 packets, not 64: the
//!   cost is per packet more than per byte.
//! - Nobody waits for a peer's lock on the data path: a doorbell, a softirq, a receive thread
//!   or the alarm that finds it locked leaves its work to the holder (`Peer::pending`), which
//!   does it before unlocking ([`Engine::release`]), as a socket's backlog is processed on
//!   release, rather than spinning while the holder sends a burst or an ACK.
//! - A connection carries any number of QPs: its streams live in chunks allocated as QPs
//!   attach ([`PeerStreams`]) and freed when the last one detaches. Nothing per packet or per
//!   run looks at every QP: a datagram's destination QP is fed from its rings just before the
//!   datagram is handled, and a QP whose doorbell rang or that got completions is queued for
//!   feeding ([`PeerInner::feed`]).
//! - Every lock the data path takes is a spinlock that disables bottom halves
//!   ([`crate::sys::bhlock`]), so that softirq may take it too; nothing under one sleeps or
//!   allocates (what a peer's state needs to grow is allocated before it is locked:
//!   `Engine::lock_with_room`). Lock order: a peer's, then the QP table's, then a QP's, then
//!   the MR table's (held across a copy to or from the MR: see `Verbs::with_mr`); the planes',
//!   the peer list's and the rate allocator's are taken under a peer's, and nothing under them.

use crate::{
    counters::{Counter, Counters, COUNTED_PATHS, PATH_COUNTERS},
    mw::WindowError,
    net::{NodeAddr, RxBuf},
    sys::{
        bhlock::{new_spinlock_bh, SpinLockBh, SpinLockBhGuard},
        netdev::NetDev,
        work::{self, CpuThreads, KthreadWork},
        KernelMemory, ZeroedSlice, KERNEL_LKEY,
    },
    transport::{
        congestion::RateAllocator,
        connection::{
            path::Path, Arrival, Config, Connection, Event, RecvError, StreamSlots, Transmit,
        },
        memory::{Access, AccessError, AtomicOp, Memory, SgList, Sge},
        stream::{self, CqOpcode, CqStatus, Stream, StreamConfig, StreamId, WrOpcode},
        wire::{Packet, DEFAULT_PEER_PATHS, MAX_HEADER_LEN},
        zero::{zero_valid, ZeroValid},
    },
    verbs::{self, Cqe, Qp, QpAttrs, QpState, SendWqe, Verbs},
    verbs_core::{
        ib::{access, kernel_wc_flags, wc_opcode, wc_status, QpType, WC_WITH_IMM, WC_WITH_INV},
        mw::MwError,
        wqe::{
            self as vwqe, judge_kernel_send, judge_recv, judge_send, Judged, Payload, SendOp,
            SendWork,
        },
    },
};
use core::cell::Cell;
use core::sync::atomic::{fence, AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use kernel::{
    alloc::{KVBox, KVVec},
    c_str, new_spinlock_irq,
    prelude::*,
    sync::{Arc, SpinLockIrq},
};

mod addrcell;
mod datagrams;
mod mcast;
mod peers;
mod planes;
mod ud;

pub(crate) use datagrams::is_datagram;

/// A UDP source port for a datagram on no path (HELLO, a UD QP's): one of the dynamic range
/// 49152-65535, picked by the low 14 bits of `entropy`.
fn dynamic_port(entropy: u32) -> u16 {
    0xc000 | (entropy & 0x3fff) as u16
}

/// The UDP source port of a device-level datagram (HELLO, the GSI QP's MADs): a random one of
/// the dynamic range for each. Such datagrams are on no path, so any port would do; a fixed
/// one would put all of them between two devices on one ECMP route, and a route that drops
/// them (a gray failure) would keep the two from ever agreeing on their connections (HELLO)
/// or connecting their QPs (rdma_cm), however many other routes work.
fn random_port() -> u16 {
    dynamic_port(crate::sys::work::random_u64() as u32)
}

pub(crate) use planes::MAX_PLANES;

/// Logical paths of a new connection unless the device's `paths` file says otherwise.
pub(crate) const DEFAULT_PATHS: u16 = 16;
// Every path of a default connection has its hardware counters.
const _: () = assert!(COUNTED_PATHS == DEFAULT_PATHS as usize);
/// The fewest a device may be set to: what every device has, so what a connection sends on
/// before the peer's HELLO says how many it has (`DEFAULT_PEER_PATHS`).
pub(crate) const MIN_PATHS: u16 = DEFAULT_PEER_PATHS;

/// The unified connection to one peer device; its path table is allocated for the paths it
/// has (`Engine::paths` when it was made), from 8 to `device::MAX_PATHS`.
pub(crate) type Conn = Connection<ZeroedSlice<Path>, PeerStreams>;

/// Streams per allocation: as many as fit in 128 KiB, so that a chunk uses most of its
/// (power-of-two sized) kmalloc allocation, or of its pages if vmalloc'd.
const CHUNK: usize = {
    let n = (128 << 10) / core::mem::size_of::<Stream>();
    if n == 0 {
        1
    } else {
        n
    }
};
/// Chunks for the most streams one connection can need: one per QP of the device.
const MAX_CHUNKS: usize = (verbs::limits::MAX_QP as usize).div_ceil(CHUNK);

/// A chunk of streams.
type Chunk = KVBox<[Stream; CHUNK]>;

/// A connection's stream storage: chunks of streams allocated as QPs attach (in process
/// context, `GFP_KERNEL`, before the peer is locked: the connection takes the `spare` one when
/// it needs to grow), all freed when the last QP detaches. Valid as all-zero bytes (no
/// chunks: an `Option<KVBox>` is `None` when zero, and a `Cell` is its contents), so the
/// connection holding it is still made by zero-allocating.
pub(crate) struct PeerStreams {
    chunks: [Option<Chunk>; MAX_CHUNKS],
    count: usize,
    /// The next chunk, allocated ahead (`Engine::lock_with_room`); a `Cell` so that it can be
    /// put in through the connection's shared view of its storage (under the peer's lock).
    spare: Cell<Option<Chunk>>,
}
// No chunks when all-zero (`Option<KVBox<_>>`: see `crate::sys`).
zero_valid!(struct PeerStreams { chunks, count, spare });

impl PeerStreams {
    /// Whether the next chunk is still to be allocated.
    fn wants_spare(&self) -> bool {
        let spare = self.spare.take();
        let wants = spare.is_none() && self.count < MAX_CHUNKS;
        self.spare.set(spare);
        wants
    }
}

impl StreamSlots for PeerStreams {
    fn slot_count(&self) -> usize {
        self.count * CHUNK
    }

    fn slot(&self, i: usize) -> Option<&Stream> {
        self.chunks.get(i / CHUNK)?.as_ref()?.get(i % CHUNK)
    }

    fn slot_mut(&mut self, i: usize) -> Option<&mut Stream> {
        self.chunks.get_mut(i / CHUNK)?.as_mut()?.get_mut(i % CHUNK)
    }

    fn grow(&mut self) -> bool {
        let Some(c) = self.chunks.get_mut(self.count) else {
            return false;
        };
        // Allocated ahead: nothing allocates under the peer's lock.
        match self.spare.take() {
            Some(chunk) => {
                *c = Some(chunk);
                self.count += 1;
                true
            }
            None => false,
        }
    }

    fn release(&mut self) {
        // Freed under the peer's lock, with bottom halves off: `kvfree` defers what it cannot
        // free there.
        for c in self.chunks.iter_mut() {
            *c = None;
        }
        self.count = 0;
        self.spare.set(None);
    }
}

/// Largest datagram we send.
const MAX_DATAGRAM: usize = 4096 + MAX_HEADER_LEN;
/// A peer's transmit buffer: consecutive datagrams of one path are written one after the
/// other and handed to the IP stack as one UDP GSO packet (at most 64 KiB with its headers).
const TX_BUF: usize = 65_535 - 20 - 8;
/// Data packets the transport sends in a row on one path (`Config::path_burst`): what one
/// GSO packet carries at most. Long runs cost less CPU per packet, but on paths that lose
/// packets at tail-drop queues they let some paths starve, so a path with any loss in its
/// estimate (`LOSSY_RUN_RATE`) sends runs of [`LOSSY_PATH_BURST`] (`docs/datapath.md`).
const PATH_BURST: u8 = 16;
/// Runs on a path with any loss in its estimate.
const LOSSY_PATH_BURST: u8 = 4;
/// The loss rate over which a path's runs are `LOSSY_PATH_BURST` long (`Config::lossy_run_rate`):
/// any.
const LOSSY_RUN_RATE: u16 = 0;
/// Datagrams queued between softirq and the receive thread, each in the skb it arrived in:
/// a few milliseconds of a busy receiver.
const RX_ENTRIES: usize = 1024;
/// How long a burst's datagrams may wait for a last one that does not come (see
/// `Engine::receive`).
const RX_FLUSH_NS: u64 = 1_000_000;
/// Datagrams of one peer processed before its connection transmits (ACKs, responses).
const RX_BATCH: usize = 32;
/// Datagrams queued beyond this many arrive marked CE (see `Engine::receive`).
const RX_MARK: usize = 384;

/// A queued datagram.
struct RxItem {
    src: NodeAddr,
    arrival: Arrival,
    buf: RxBuf,
}

/// Datagrams waiting for the receive thread: a ring, allocated once.
type RxQueue<T = RxItem> = verbs::Fifo<T>;

/// The source of the oldest datagram of `q`.
fn head_src(q: &RxQueue) -> Option<NodeAddr> {
    q.peek().map(|i| i.src)
}

/// The data path of one device.
#[pin_data]
pub(crate) struct Engine {
    verbs: Arc<Verbs>,
    /// Payload bytes per packet of new connections, the same on both ends (derived from the
    /// first plane's netdev MTU, `device::payload_mtu`; see `set_link_mtu`).
    mtu: AtomicU32,
    /// The device's planes (their sockets), by plane number; taken out (and released) when
    /// the device goes away.
    #[pin]
    planes: SpinLockBh<planes::LocalPlanes>,
    /// This device's incarnation, for HELLO.
    epoch: u32,
    /// The device's hardware counters (`rdma statistic`).
    counters: Arc<Counters>,
    /// Each plane's (its socket counts there, and so in `counters` too).
    plane_counters: [Arc<Counters>; MAX_PLANES],
    /// Grown outside the lock (`Engine::peer_or_new`).
    #[pin]
    peers: SpinLockBh<peers::PeerTable>,
    #[pin]
    rxq: SpinLockIrq<RxQueue>,
    /// The receive threads, one per CPU (bulk receive runs, GSI datagrams), and the alarm;
    /// taken out (and stopped) when the device goes away.
    #[pin]
    rx_thread: SpinLockIrq<Option<CpuThreads<Engine>>>,
    /// Divides the device's inbound capacity among the peers sending to it (congestion
    /// control's receiver side; every peer's connection reports to it).
    #[pin]
    alloc: SpinLockBh<RateAllocator>,
    /// `rx_nomem` as last reported to the allocator.
    nomem_seen: AtomicU64,
    /// Receive runs have been large lately (bulk traffic): wake the receive thread of
    /// another CPU than the one the datagram arrived on, which is busy sending it (a veth
    /// delivers in the sender's context), so sending and receiving proceed in parallel.
    /// Small runs (request/response) are processed in the softirq they arrive in: no
    /// wakeup, no IPI.
    rx_spread: AtomicBool,
    /// Datagrams per receive run, average, in 1/16 (see `note_run`).
    rx_run_avg: AtomicU32,
    /// The GSI QPs, by port - 1, and the unreliable datagrams to and from them
    /// ([`datagrams`]).
    #[pin]
    datagrams: datagrams::Datagrams,
    /// Paths of the connections made from now on (the device's `paths` file).
    paths: AtomicU16,
    /// Peer devices this device keeps a connection to at most (the `max_peers` file): each
    /// costs its connection's paths and a transmit buffer (about 170 KiB with 16 paths), and
    /// any local user may name any address in `modify_qp`, so their number is bounded.
    max_peers: AtomicU32,
    /// Kernel QPs posted to where the data path's locks may not be taken (interrupts off):
    /// their doorbells, rung by the receive thread (IRQ-safe: posting may happen anywhere).
    #[pin]
    kernel_doorbells: SpinLockIrq<KernelDoorbells>,
}

/// QP numbers whose doorbell the receive thread rings ([`Engine::kernel_doorbell`]).
struct KernelDoorbells {
    qpns: [u32; 64],
    len: usize,
    /// More than fit: every kernel QP's is rung.
    overflow: bool,
}

/// `max_peers` of a new device.
const DEFAULT_MAX_PEERS: u32 = 1024;
/// How long a peer with no QP left keeps its connection (see `Engine::reap_idle`).
const PEER_LINGER_NS: u64 = 10_000_000_000;
/// The most `max_peers` may be set to.
const MAX_MAX_PEERS: u32 = 1 << 16;

/// Receive runs averaging at least this many datagrams make `Engine::rx_spread` true. A
/// request or a response is a run of 1; bulk data comes in runs of a GSO packet, `PATH_BURST`
/// (4) datagrams, whose average (rounded down in 1/16) settles just under 4.
const SPREAD_RUN: u32 = 3;

/// Inbound capacity the rate allocator divides, Mbit/s: 10 Gbit/s, what veth reports and a
/// common NIC speed. Reading the netdev's ethtool speed is still to do; a slower real link
/// is protected by ECN (the allocator's drain and the senders' windows).
const INBOUND_CAPACITY_MBPS: u32 = 10_000;
/// Pacing burst: what the pacer lets out at once. The alarm is a high-resolution timer, but
/// under emulation (QEMU TCG) its callback (a softirq, run by ksoftirqd when softirqs pile
/// up), like the thread it used to wake, runs tens of microseconds to a millisecond late.
const PACING_BURST_NS: u64 = 1_000_000;
/// How long a receiver may hold back an ACK: 0, sent when the batch that made it is done. A
/// delay (with `ack_every`, 8) only added latency: a burst arrives as one batch anyway.
const ACK_DELAY_NS: u64 = 0;
/// The allocator's clocks, fitted to a data path that may wake up a few milliseconds late on a
/// loaded emulated host: a sender stays active across a few wake-ups (epoch), the
/// marked fraction is taken over about one (drain interval), and a bottleneck before this
/// device (a marking hop slower than `INBOUND_CAPACITY_MBPS`) is measured over several.
const ALLOC_EPOCH_NS: u64 = 10_000_000;
const ALLOC_INTERVAL_NS: u64 = 4_000_000;
const ALLOC_RATE_PERIOD_NS: u64 = 16_000_000;
/// Smallest path retransmission timeout: 5 ms. RTT samples under emulation carry scheduling
/// delays of milliseconds when the host is busy, so it cannot go near the simulator's 150 us
/// (a spurious timeout declares every unresolved packet lost, halves the path's window and
/// makes the path Suspect); `docs/datapath.md` has what 5 and 20 ms measured.
const PATH_MIN_RTO_NS: u64 = 5_000_000;

/// One peer device and the connection to it.
#[pin_data]
pub(crate) struct Peer {
    /// The peer's addresses on every plane (plane 0: what the QPs named), and the HELLO
    /// exchange with it.
    planes: planes::PeerPlanes,
    #[pin]
    inner: SpinLockBh<PeerInner>,
    /// Work left to the holder of `inner` by whoever found it locked (`PENDING_*` bits): the
    /// holder does it before it unlocks ([`Engine::release`]), like a socket's backlog,
    /// instead of the others spinning on the lock while the holder sends a burst.
    pending: AtomicU8,
    /// The holder of `inner` is on the data path and does `pending` work before it unlocks
    /// ([`Engine::lock_data_path`], [`Engine::release`]). Others (QP setup and teardown,
    /// plane changes) do not: whoever finds them holding the lock waits for it instead.
    takes_pending: AtomicBool,
    /// The streams whose doorbells rang while `inner` was locked (`PENDING_DOORBELL`).
    #[pin]
    doorbells: SpinLockBh<Doorbells>,
}

/// `Peer::pending`: datagrams of the peer are queued.
const PENDING_RX: u8 = 1;
/// `Peer::pending`: doorbells are in `Peer::doorbells`.
const PENDING_DOORBELL: u8 = 2;
/// `Peer::pending`: the alarm went off.
const PENDING_TIMER: u8 = 4;

/// Doorbells that rang while their peer was locked.
struct Doorbells {
    streams: [StreamId; 16],
    len: usize,
    /// More rang than fit: every attached stream is fed.
    overflow: bool,
}

impl Doorbells {
    /// Notes `sid`'s doorbell (once).
    fn add(&mut self, sid: StreamId) {
        if self
            .streams
            .get(..self.len)
            .is_some_and(|s| s.contains(&sid))
        {
            return;
        }
        match self.streams.get_mut(self.len) {
            Some(slot) => {
                *slot = sid;
                self.len += 1;
            }
            None => self.overflow = true,
        }
    }
}

struct PeerInner {
    conn: KVBox<Conn>,
    /// Per stream (index: stream id): its QP and what the data path keeps for it.
    qps: KVVec<QpSlot>,
    /// QPs attached.
    attached: usize,
    /// Streams whose QP's rings are to be fed into the connection at the next run: its
    /// doorbell rang, or completions made room. Each at most once (`QpSlot::queued`), and
    /// room reserved for one entry per stream (`Engine::lock_with_room`), so pushing never
    /// allocates.
    feed: KVVec<StreamId>,
    /// Transmit and receive scratch buffers.
    buf: KVec<u8>,
    /// What of the connection's counters the device counters already hold.
    reported: Reported,
    /// Taken off the device's peer list (`Engine::reap_idle`): no QP may attach to it any
    /// more (`Engine::attach` makes a new peer instead).
    removed: bool,
    /// When its last QP went (0: it has QPs, or never had one yet).
    idle_since: u64,
}

/// A stream's QP and the data path's state for it.
#[derive(Default)]
struct QpSlot {
    qp: Option<Arc<Qp>>,
    /// On the feed queue.
    queued: bool,
    /// The QP was failed (userspace broke one of its rings, or its connection was retired)
    /// and so was its stream: the flushes of what the transport held come out of the next
    /// round of the run, the rings' at a feed after that (see [`Engine::feed`]).
    failed: bool,
}

impl QpSlot {
    /// Puts the slot's stream `sid` on `feed` (once).
    fn queue(&mut self, feed: &mut KVVec<StreamId>, sid: StreamId) {
        // Within the room reserved at attach: no allocation.
        if self.qp.is_some() && !self.queued && feed.push(sid, GFP_ATOMIC).is_ok() {
            self.queued = true;
        }
    }
}

impl PeerInner {
    /// Queues stream `sid`'s QP for feeding at the next run.
    fn queue_feed(&mut self, sid: StreamId) {
        if let Some(slot) = self.qps.get_mut(usize::from(sid.0)) {
            slot.queue(&mut self.feed, sid);
        }
    }
}

/// What feeding a QP found ([`Engine::feed`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fed {
    /// Nothing more to do until the next doorbell or completion.
    Done,
    /// Feed it again after this round's completions are delivered.
    Again,
    /// Userspace broke one of its rings: the QP failed (`IB_EVENT_QP_FATAL`), its stream too;
    /// fed again, as `Again`, to flush its rings. Counted in `ring_errors`.
    RingError,
}

/// Datagrams of one path waiting in a peer's transmit buffer (`buf[..end]`), `seg` bytes
/// each but the last.
struct TxBatch {
    plane: u8,
    src_port: u16,
    ecn: bool,
    seg: usize,
    count: usize,
    end: usize,
    /// The last one is shorter: nothing may follow it.
    closed: bool,
}

impl TxBatch {
    fn new(t: &Transmit) -> Self {
        TxBatch {
            plane: t.plane,
            src_port: t.src_port,
            ecn: t.ecn_capable,
            seg: t.len,
            count: 1,
            end: t.len,
            closed: false,
        }
    }

    /// Whether `t` (written right after the batch) can join it.
    fn takes(&self, t: &Transmit) -> bool {
        !self.closed
            && t.plane == self.plane
            && t.src_port == self.src_port
            && t.ecn_capable == self.ecn
            && t.len <= self.seg
            && t.len > 0
            && self.count < crate::sys::udp::MAX_GSO_SEGS
    }

    fn push(&mut self, len: usize) {
        self.count += 1;
        self.end += len;
        self.closed = len < self.seg;
    }
}

/// Counter values already added to the device's counters (the transport's only grow).
#[derive(Clone, Copy, Default)]
struct Reported {
    retransmits: u64,
    acks_out: u64,
    acks_in: u64,
    timeouts: u64,
    cc: [u64; 3],
    naks_out: [u64; 6],
    naks_in: [u64; 6],
    duplicates: u64,
    rnr_naks: u64,
    /// Per counted path: packets sent, retransmitted, lost.
    paths: [[u64; 3]; COUNTED_PATHS],
}

/// A QP's connection as the direct verbs report it (`Engine::qp_connection`).
pub(crate) struct ConnInfo {
    /// Planes the connection's paths are spread over.
    pub(crate) planes: u32,
    /// Bit per plane that carries packets to the peer now.
    pub(crate) planes_up: u32,
    /// Paths it sends on.
    pub(crate) paths: u32,
    /// QPs on it.
    pub(crate) qps: u32,
}

/// One path of a connection as the direct verbs report it.
pub(crate) struct PathInfo {
    pub(crate) id: u16,
    pub(crate) plane: u8,
    /// `PathState` as its number (the ABI's `enum metaroce_path_state`).
    pub(crate) state: u8,
    pub(crate) sport: u16,
    /// Smoothed RTT (0 before a sample).
    pub(crate) srtt_us: u32,
    pub(crate) cwnd: u32,
    pub(crate) in_flight: u32,
    pub(crate) sent: u64,
    pub(crate) retransmits: u64,
    pub(crate) ecn_marks: u64,
    pub(crate) timeouts: u64,
}

/// Where a QP sits on the data path: its peer and its stream there.
#[derive(Clone)]
pub(crate) struct Binding {
    peer: Arc<Peer>,
    stream: StreamId,
}

impl Engine {
    /// The data path of a device on `ndev`, with its socket open.
    pub(crate) fn new(
        verbs: Arc<Verbs>,
        mtu: u32,
        ndev: &NetDev<'_>,
        counters: Arc<Counters>,
        plane_counters: [Arc<Counters>; MAX_PLANES],
    ) -> Result<Arc<Self>> {
        let rxq = RxQueue::new(RX_ENTRIES as u32)?;
        let datagrams = datagrams::Datagrams::new()?;
        let own_counters = counters.clone();
        let engine = Arc::pin_init(
            pin_init!(Engine {
                verbs,
                mtu: AtomicU32::new(mtu),
                planes <- new_spinlock_bh!([const { None }; MAX_PLANES], "metaroce_planes"),
                epoch: Engine::new_epoch(),
                counters: own_counters,
                plane_counters,
                peers <- new_spinlock_bh!(peers::PeerTable::new(), "metaroce_peers"),
                rxq <- new_spinlock_irq!(rxq, "metaroce_rxq"),
                rx_thread <- new_spinlock_irq!(None, "metaroce_rx_thread"),
                alloc <- new_spinlock_bh!(
                    RateAllocator::new(INBOUND_CAPACITY_MBPS)
                        .with_epoch(ALLOC_EPOCH_NS)
                        .with_interval(ALLOC_INTERVAL_NS)
                        .with_rate_period(ALLOC_RATE_PERIOD_NS),
                    "metaroce_alloc"
                ),
                nomem_seen: AtomicU64::new(0),
                rx_spread: AtomicBool::new(false),
                rx_run_avg: AtomicU32::new(0),
                datagrams <- datagrams,
                paths: AtomicU16::new(DEFAULT_PATHS),
                max_peers: AtomicU32::new(DEFAULT_MAX_PEERS),
                kernel_doorbells <- new_spinlock_irq!(
                    KernelDoorbells {
                        qpns: [0; 64],
                        len: 0,
                        overflow: false,
                    },
                    "metaroce_kdoorbells"
                ),
            }),
            GFP_KERNEL,
        )?;
        // The receive thread holds the engine too.
        let thread = CpuThreads::new(c_str!("metaroce_rx/%u"), engine.clone())?;
        *engine.rx_thread.lock() = Some(thread);
        if let Err(e) = engine.open_plane0(ndev) {
            engine.shutdown();
            return Err(e);
        }
        Ok(engine)
    }

    /// The device is going away: release the sockets (after which nothing arrives and
    /// nothing is sent); work items still queued find nothing to do.
    pub(crate) fn shutdown(&self) {
        self.close_planes();
        // Nothing kicks the threads any more; stop them (this waits for runs in progress).
        let thread = self.rx_thread.lock().take();
        drop(thread);
        let peers = self.peers.lock().take();
        drop(peers);
    }

    /// A datagram arrived (softirq). It is queued, and the queue processed here, in softirq,
    /// once the burst it came in is all in (`more`: the next datagram of a GSO packet follows
    /// at once), so that one run and one ACK cover the burst. While receive runs are large
    /// (bulk traffic, `rx_spread`) the queue goes to another CPU's receive thread instead,
    /// so that this CPU, which is sending them (a veth delivers in the sender's context),
    /// keeps sending while that one receives.
    pub(crate) fn receive(
        self: &Arc<Self>,
        src: NodeAddr,
        arrival: Arrival,
        more: bool,
        buf: RxBuf,
    ) {
        // A full queue drops the datagram, as a full NIC ring would; the transport recovers it.
        // A long one marks it Congestion Experienced, as a switch queue past its ECN threshold
        // would: the senders' windows shrink before our queue adds delay that fires their
        // retransmission timers (with 7 senders into one receiver, its 1,024 entries took
        // tens of milliseconds to drain under emulation, and paths failed).
        let (pushed, first) = {
            let mut q = self.rxq.lock();
            let first = q.len() == 0;
            let arrival = Arrival {
                ecn_ce: arrival.ecn_ce || q.len() >= RX_MARK,
                ..arrival
            };
            (q.push(RxItem { src, arrival, buf }), first)
        };
        if pushed.is_err() {
            self.counters.inc(Counter::RxNoMem);
        }
        if more {
            // `more` is a hint (the stack's list of a GSO packet's datagrams): the next one
            // may still be dropped before it reaches us (a bad checksum, a filter). The alarm
            // then processes what the burst left queued (`process_timers`), armed once per
            // burst, on its first datagram.
            if first {
                let now = work::now_ns();
                if let Some(t) = &*self.rx_thread.lock() {
                    t.arm(now.saturating_add(RX_FLUSH_NS), now);
                }
            }
            return;
        }
        if self.rx_spread.load(Ordering::Relaxed) {
            self.kick_rx();
        } else {
            self.process_rx();
        }
    }

    /// Datagrams waiting in the receive queue.
    pub(crate) fn rx_queued(&self) -> usize {
        self.rxq.lock().len()
    }

    /// Wakes a receive thread: this CPU's, or the next one's while runs are large (see
    /// `rx_spread`). Any context.
    fn kick_rx(&self) {
        if let Some(t) = &*self.rx_thread.lock() {
            t.kick(self.rx_spread.load(Ordering::Relaxed));
        }
    }

    /// The peer with address `addr` on any plane.
    fn peer(&self, addr: NodeAddr) -> Option<Arc<Peer>> {
        self.peers.lock().find(addr).cloned()
    }

    /// The `i`th peer: walks the peers without allocating (softirq).
    fn peer_at(&self, i: usize) -> Option<Arc<Peer>> {
        self.peers.lock().get(i).cloned()
    }

    fn peer_or_new(&self, addr: NodeAddr) -> Result<Arc<Peer>> {
        // A peer idle past its linger is not reused: it goes (`reap_idle`), and the QP gets a
        // new connection. Otherwise the side that reaped its peer made a new connection while
        // the other reused its stale one (two incast senders stalled from their first WQE).
        if let Some(p) = self
            .peer(addr)
            .filter(|p| !Self::expired(&p.inner.lock(), work::now_ns()))
        {
            return Ok(p);
        }
        self.reap_idle(true);
        if self.peers_full() {
            return Err(self.refuse_peer());
        }
        // Made unlocked (nothing allocates under the table's lock); a peer another thread
        // added meanwhile wins.
        let peer = self.new_peer(addr)?;
        let mut room = peers::Room::new();
        loop {
            let mut peers = self.peers.lock();
            if let Some(p) = peers.find(addr) {
                let p = p.clone();
                drop(peers);
                return Ok(p);
            }
            if peers.len() >= self.max_peers() as usize {
                drop(peers);
                return Err(self.refuse_peer());
            }
            room = peers.grow(room);
            match peers.room_wanted() {
                None => {
                    // There is room now: cannot fail.
                    if peers.push(peer.clone(), addr).is_err() {
                        return Err(ENOMEM);
                    }
                    break;
                }
                Some((list, index)) => {
                    drop(peers);
                    drop(room);
                    room = peers::Room::with_capacity(list, index)?;
                }
            }
        }
        drop(room);
        // Its paths go over our planes; only plane 0 reaches the peer until its HELLO arrives.
        self.apply_planes(&peer, &mut peer.inner.lock().conn);
        Ok(peer)
    }

    /// A peer at `addr` with a connection of `paths()` paths and no streams. Process context.
    fn new_peer(&self, addr: NodeAddr) -> Result<Arc<Peer>> {
        // Our id for the peer: random and nonzero; the peer's is learned from its HELLO.
        let local_id = (work::random_u64() as u32).max(1);
        let mut cfg = Config::new(local_id, 0);
        cfg.mtu = self.mtu();
        cfg.num_paths = self.paths();
        cfg.seed = work::random_u64() | 1;
        // ACK at the end of each processed batch (or sooner, see `ACK_DELAY_NS`): batches are
        // whole bursts, so that is one ACK per burst, and no timer.
        cfg.path.ack_delay = ACK_DELAY_NS;
        cfg.cc.pacing_burst_ns = PACING_BURST_NS;
        cfg.path.min_rto = PATH_MIN_RTO_NS;
        cfg.path_burst = PATH_BURST;
        cfg.lossy_path_burst = LOSSY_PATH_BURST;
        cfg.lossy_run_rate = LOSSY_RUN_RATE;
        let mut conn = crate::sys::zeroed_box::<Conn>()?;
        let table = ZeroedSlice::new(usize::from(cfg.num_paths))?;
        conn.reset_with_paths(cfg, table).map_err(|_| EINVAL)?;
        // The peer may have fewer paths: until its HELLO says, only those every device has.
        conn.set_send_paths(usize::from(DEFAULT_PEER_PATHS));
        let mut buf = KVec::new();
        buf.extend_with(TX_BUF, 0u8, GFP_KERNEL)?;
        Arc::pin_init(
            pin_init!(Peer {
                planes: planes::PeerPlanes::new(addr, local_id),
                inner <- new_spinlock_bh!(PeerInner {
                    conn,
                    qps: KVVec::new(),
                    attached: 0,
                    feed: KVVec::new(),
                    buf,
                    reported: Reported::default(),
                    removed: false,
                    idle_since: 0,
                }, "metaroce_peer"),
                pending: AtomicU8::new(0),
                takes_pending: AtomicBool::new(false),
                doorbells <- new_spinlock_bh!(Doorbells {
                    streams: [StreamId(0); 16],
                    len: 0,
                    overflow: false,
                }, "metaroce_doorbells"),
            }),
            GFP_KERNEL,
        )
    }

    /// Locks `peer` with room for one more stream: its QP slot, its place on the feed queue
    /// and the chunk of streams the connection may need, all allocated before locking
    /// (nothing allocates under a peer's lock). Process context.
    fn lock_with_room(peer: &Peer) -> Result<SpinLockBhGuard<'_, PeerInner>> {
        let mut qps: KVVec<QpSlot> = KVVec::new();
        let mut feed: KVVec<StreamId> = KVVec::new();
        let mut chunk: Option<Chunk> = None;
        loop {
            let mut p = peer.inner.lock();
            // A new stream's id is a free slot's or the first of a new chunk: below
            // `stream_slots() + 1`.
            let want_qps = p.conn.stream_slots().saturating_add(1);
            let want_feed = p.attached.saturating_add(1);
            if p.qps.capacity() < want_qps && qps.capacity() >= want_qps {
                for slot in p.qps.drain_all() {
                    // Within `qps`' capacity: no allocation.
                    qps.push(slot, GFP_ATOMIC)?;
                }
                core::mem::swap(&mut p.qps, &mut qps);
            }
            if p.feed.capacity() < want_feed && feed.capacity() >= want_feed {
                for sid in p.feed.drain_all() {
                    // Within `feed`'s capacity: no allocation.
                    feed.push(sid, GFP_ATOMIC)?;
                }
                core::mem::swap(&mut p.feed, &mut feed);
            }
            let streams = p.conn.streams();
            if streams.wants_spare() && chunk.is_some() {
                streams.spare.set(chunk.take());
            }
            let wants_chunk = p.conn.streams().wants_spare();
            if p.qps.capacity() >= want_qps && p.feed.capacity() >= want_feed && !wants_chunk {
                // What was replaced is empty; freed with bottom halves off, `kvfree` defers
                // what it cannot free there.
                return Ok(p);
            }
            drop(p);
            if qps.capacity() < want_qps {
                qps = KVVec::with_capacity(want_qps.saturating_mul(2).max(16), GFP_KERNEL)?;
            }
            if feed.capacity() < want_feed {
                feed = KVVec::with_capacity(want_feed.saturating_mul(2).max(16), GFP_KERNEL)?;
            }
            if wants_chunk && chunk.is_none() {
                chunk = Some(crate::sys::zeroed_box::<[Stream; CHUNK]>()?);
            }
        }
    }

    /// Payload bytes per packet of new connections.
    pub(crate) fn mtu(&self) -> u32 {
        self.mtu.load(Ordering::Acquire)
    }

    /// Peer devices this device connects to at most.
    pub(crate) fn max_peers(&self) -> u32 {
        self.max_peers.load(Ordering::Relaxed)
    }

    /// Sets `max_peers`: 1 to `MAX_MAX_PEERS`, else `EINVAL`. Peers already connected stay.
    pub(crate) fn set_max_peers(&self, n: u32) -> Result {
        if !(1..=MAX_MAX_PEERS).contains(&n) {
            return Err(EINVAL);
        }
        self.max_peers.store(n, Ordering::Relaxed);
        Ok(())
    }

    /// Paths a connection made now gets.
    pub(crate) fn paths(&self) -> u16 {
        self.paths.load(Ordering::Relaxed)
    }

    /// Sets the paths of the connections made from now on: `MIN_PATHS..=MAX_PATHS`, else
    /// `EINVAL`. A connection is made when the first QP toward a peer device connects and
    /// kept until its last QP goes, with the paths it was made with: the setting applies to
    /// connections made from now on.
    pub(crate) fn set_paths(&self, n: u32) -> Result {
        let n = u16::try_from(n).map_err(|_| EINVAL)?;
        if !(MIN_PATHS..=crate::device::MAX_PATHS as u16).contains(&n) {
            return Err(EINVAL);
        }
        self.paths.store(n, Ordering::Relaxed);
        Ok(())
    }

    /// The QP is going to RTS with attributes `a` (not committed yet): its requester gets
    /// its first MSN and retry limits.
    pub(crate) fn start_sending(self: &Arc<Self>, qp: &Arc<Qp>, a: &QpAttrs) -> Result {
        let binding = qp.inner.lock().binding.clone();
        let b = binding.ok_or(EINVAL)?;
        let mut p = b.peer.inner.lock();
        p.conn
            .start_requester(
                b.stream,
                a.sq_psn,
                a.retry_cnt.min(7),
                a.rnr_retry.min(7),
                ack_timeout_ns(a.timeout),
            )
            .map_err(|_| EINVAL)?;
        p.queue_feed(b.stream);
        self.run(&b.peer, &mut p);
        Ok(())
    }

    /// The QP is going to RTR with attributes `a` (not committed yet: a failure here leaves
    /// the QP as it was): open its stream on the connection to its destination (the
    /// connection's stream storage grows by a chunk if it is full).
    pub(crate) fn attach(self: &Arc<Self>, qp: &Arc<Qp>, a: &QpAttrs) -> Result {
        let (dest, cfg) = {
            let inner = qp.inner.lock();
            if inner.binding.is_some() {
                return Ok(());
            }
            // IPv4 (an IPv4-mapped GID) or IPv6; a group address has no connection.
            let dest = NodeAddr::from_gid(&a.av.dgid);
            if dest.is_none() || dest.is_group() {
                return Err(EINVAL);
            }
            // A UC QP has no retry counts, RNR timer or timeout (the verbs take none for it):
            // its stream retries as an RC QP with 7, 7 (no limit), 0.64 ms and the
            // connection's stall timeout would.
            let uc = qp.qp_type == QpType::Uc;
            let cfg = StreamConfig {
                local_qp: qp.qpn,
                remote_qp: a.dest_qp_num,
                retry_cnt: if uc { 7 } else { a.retry_cnt.min(7) },
                rnr_retry: if uc { 7 } else { a.rnr_retry.min(7) },
                rnr_timer_us: rnr_timer_us(if uc { 12 } else { a.min_rnr_timer }),
                send_msn: a.sq_psn,
                recv_msn: a.rq_psn,
                ack_timeout: if uc { 0 } else { ack_timeout_ns(a.timeout) },
                srq: qp.srq.is_some(),
                planes: qp.planes(),
                unreliable: uc,
            };
            (dest, cfg)
        };
        loop {
            let peer = self.peer_or_new(dest)?;
            // Room first (for the QP's slot, its place on the feed queue, its stream), so that
            // nothing can fail once the stream is open.
            let mut p = Self::lock_with_room(&peer)?;
            if p.removed {
                // Its last QP went since we found it: the next lookup makes a new peer.
                continue;
            }
            let stream = match Self::open_slot(&mut p, cfg) {
                Ok(s) => s,
                Err(e) => {
                    // A peer made for this QP alone goes with the failure.
                    let unused = self.unlist_if_unused(&peer, &mut p);
                    drop(p);
                    drop(unused);
                    return Err(e);
                }
            };
            if let Some(slot) = p.qps.get_mut(usize::from(stream.0)) {
                *slot = QpSlot {
                    qp: Some(qp.clone()),
                    queued: false,
                    failed: false,
                };
            }
            p.attached += 1;
            p.idle_since = 0;
            {
                let mut inner = qp.inner.lock();
                // A new stream counts its WQEs from zero.
                if let Some(store) = inner.inline.as_mut() {
                    store.clear();
                }
                inner.binding = Some(Binding {
                    peer: peer.clone(),
                    stream,
                });
            }
            p.queue_feed(stream);
            self.run(&peer, &mut p);
            return Ok(());
        }
    }

    /// Opens a stream for `cfg` on a peer locked with room (`lock_with_room`), with its QP
    /// slot.
    fn open_slot(p: &mut PeerInner, cfg: StreamConfig) -> Result<StreamId> {
        let stream = p.conn.open_stream(cfg).map_err(|_| ENOSPC)?;
        let i = usize::from(stream.0);
        while p.qps.len() <= i {
            // Within the room reserved: cannot fail, and does not allocate.
            if p.qps.push(QpSlot::default(), GFP_ATOMIC).is_err() {
                p.conn.close_stream(stream);
                return Err(ENOMEM);
            }
        }
        Ok(stream)
    }

    /// A peer with no QP left is taken off the device's list (marked `removed`, so that no QP
    /// attaches to it any more) and returned, to be dropped once unlocked: its connection
    /// goes with its last reference. The peer finds it gone (its packets are dropped) and
    /// learns of our next connection, with a new id, from its HELLO.
    fn unlist_if_unused(&self, peer: &Arc<Peer>, p: &mut PeerInner) -> Option<Arc<Peer>> {
        if p.attached != 0 || p.removed {
            return None;
        }
        p.removed = true;
        let addrs = peer.planes.addrs();
        self.peers.lock().remove(peer, &addrs)
    }

    /// Takes off the list the peers that have had no QP for `PEER_LINGER_NS`, and with
    /// `room`, when the table is full, the one idle longest as well. A peer lingers after its
    /// last QP so that what its peer still sends to a QP just destroyed is answered (a NAK
    /// "remote operational error", not silence) and QPs made again soon reuse the connection.
    /// Process context.
    fn reap_idle(&self, room: bool) {
        let now = work::now_ns();
        // One pass: the expired go; the longest idle of the others is kept in mind.
        let mut oldest: Option<(u64, Arc<Peer>)> = None;
        for peer in self.peer_list().iter() {
            let mut p = peer.inner.lock();
            if p.attached != 0 || p.idle_since == 0 {
                continue;
            }
            if !Self::expired(&p, now) {
                if oldest.as_ref().is_none_or(|(t, _)| p.idle_since < *t) {
                    oldest = Some((p.idle_since, peer.clone()));
                }
                continue;
            }
            let gone = self.unlist_if_unused(peer, &mut p);
            drop(p);
            drop(gone);
        }
        if let Some((_, peer)) = oldest.filter(|_| room && self.peers_full()) {
            let mut p = peer.inner.lock();
            let gone = self.unlist_if_unused(&peer, &mut p);
            drop(p);
            drop(gone);
        }
    }

    /// Whether a peer has had no QP for `PEER_LINGER_NS`.
    fn expired(p: &PeerInner, now: u64) -> bool {
        p.attached == 0 && p.idle_since != 0 && now.saturating_sub(p.idle_since) >= PEER_LINGER_NS
    }

    /// Whether the table holds `max_peers` peers.
    fn peers_full(&self) -> bool {
        self.peers.lock().len() >= self.max_peers() as usize
    }

    /// A new peer refused: the table is full.
    fn refuse_peer(&self) -> Error {
        self.counters.inc(Counter::PeersRefused);
        ENOSPC
    }

    /// The QP moved to the error state: the transport flushes what it holds.
    pub(crate) fn fail(self: &Arc<Self>, qp: &Qp) {
        let binding = qp.inner.lock().binding.clone();
        if let Some(b) = binding {
            let mut p = b.peer.inner.lock();
            let _ = p.conn.fail_stream(b.stream);
            self.run(&b.peer, &mut p);
        }
        qp.flush();
    }

    /// Restricts the QP's packets to `planes` (bit per plane; 0: every plane): now if its
    /// stream is open, and when it opens.
    pub(crate) fn set_qp_planes(&self, qp: &Qp, planes: u32) {
        qp.set_planes(planes);
        let binding = qp.inner.lock().binding.clone();
        if let Some(b) = binding {
            // The stream may have closed since: then the QP's value is what counts.
            let _ = b.peer.inner.lock().conn.set_stream_planes(b.stream, planes);
        }
    }

    /// The connection the QP rides, for the direct verbs: its planes and QPs, and each of
    /// its paths passed to `each_path` in order. None before the QP is connected (RTR).
    pub(crate) fn qp_connection(
        &self,
        qp: &Qp,
        mut each_path: impl FnMut(PathInfo),
    ) -> Option<ConnInfo> {
        let binding = qp.inner.lock().binding.clone()?;
        let p = binding.peer.inner.lock();
        let conn = &p.conn;
        let planes = conn.config().planes.max(1);
        let planes_up = (0..planes)
            .filter(|&k| conn.plane_up(k))
            .fold(0u32, |m, k| m | 1u32 << k.min(31));
        for i in 0..conn.send_paths() {
            let Some(path) = conn.path(i) else { break };
            each_path(PathInfo {
                id: path.id,
                plane: path.plane,
                state: path.state as u8,
                sport: path.sport,
                srtt_us: if path.rtt.has_sample() {
                    u32::try_from(path.rtt.srtt() / 1000).unwrap_or(u32::MAX)
                } else {
                    0
                },
                cwnd: path.cc.cwnd(),
                in_flight: path.inflight.unresolved(),
                sent: path.stats.sent,
                retransmits: path.stats.retransmitted,
                ecn_marks: path.stats.ecn_ce,
                timeouts: path.stats.timeouts,
            });
        }
        Some(ConnInfo {
            planes: u32::from(planes),
            planes_up,
            paths: conn.send_paths() as u32,
            qps: p.attached as u32,
        })
    }

    /// The QP is being destroyed: close its stream; nothing completes for it afterwards.
    /// When it was the connection's last, the peer lingers idle, then goes with its connection
    /// (`reap_idle`; a later QP makes a new one, with a new id, and the peer's connection
    /// restarts its paths on learning it).
    pub(crate) fn detach(&self, qp: &Qp) {
        let binding = qp.inner.lock().binding.take();
        if let Some(b) = binding {
            let mut p = b.peer.inner.lock();
            p.conn.close_stream(b.stream);
            // Our reference to the QP and the storage given up are dropped after unlocking.
            let mut gone = None;
            if let Some(slot) = p.qps.get_mut(usize::from(b.stream.0)) {
                gone = slot.qp.take();
                if gone.is_some() {
                    p.attached = p.attached.saturating_sub(1);
                }
            }
            let mut storage = None;
            if p.attached == 0 && p.conn.release_streams() {
                storage = Some((
                    core::mem::replace(&mut p.qps, KVVec::new()),
                    core::mem::replace(&mut p.feed, KVVec::new()),
                ));
            }
            if p.attached == 0 {
                p.idle_since = work::now_ns().max(1);
            }
            drop(p);
            drop(storage);
            drop(gone);
            // Process context: peers idle for long go now.
            self.reap_idle(false);
        }
    }

    /// The doorbell: userspace posted to the QP's SQ.
    pub(crate) fn doorbell(self: &Arc<Self>, qp: &Arc<Qp>) {
        // What we send to a local peer (over a veth) is received in the softirq that runs
        // when we unlock: the whole burst at once.
        let binding = qp.inner.lock().binding.clone();
        if let Some(b) = binding {
            match Self::lock_data_path(&b.peer) {
                Some(mut p) => {
                    p.queue_feed(b.stream);
                    self.run(&b.peer, &mut p);
                    self.release(&b.peer, p);
                }
                None => {
                    // Busy: the holder feeds the stream before it unlocks.
                    b.peer.doorbells.lock().add(b.stream);
                    if let Some(p) = self.leave_to_holder(&b.peer, PENDING_DOORBELL) {
                        self.release(&b.peer, p);
                    }
                }
            }
        }
        // Work posted in the error state completes at once, flushed.
        if qp.state() == QpState::Err {
            qp.flush();
        }
    }

    /// A kernel consumer posted to `qp`: its doorbell now, or (where the data path's locks
    /// may not be taken: a consumer posting with interrupts off) from the receive thread.
    pub(crate) fn kernel_doorbell(self: &Arc<Self>, qp: &Arc<Qp>) {
        if work::may_take_bh_locks() {
            self.doorbell(qp);
            return;
        }
        {
            let mut d = self.kernel_doorbells.lock();
            let len = d.len;
            if d.qpns.iter().take(len).any(|&n| n == qp.qpn) {
                return;
            }
            match d.qpns.get_mut(len) {
                Some(slot) => {
                    *slot = qp.qpn;
                    d.len += 1;
                }
                None => d.overflow = true,
            }
        }
        self.kick_rx();
    }

    /// The receive thread rings the doorbells [`Engine::kernel_doorbell`] left to it.
    fn process_kernel_doorbells(self: &Arc<Self>) {
        let (qpns, len, overflow) = {
            let mut d = self.kernel_doorbells.lock();
            let taken = (d.qpns, d.len, d.overflow);
            d.len = 0;
            d.overflow = false;
            taken
        };
        let ring = |qp: Option<Arc<Qp>>| {
            if let Some(qp) = qp.filter(|q| q.kernel.is_some()) {
                self.doorbell(&qp);
            }
        };
        for &qpn in qpns.iter().take(len) {
            ring(self.verbs.qp(qpn));
        }
        if overflow {
            let Ok(mut all) = KVec::with_capacity(verbs::limits::MAX_QP as usize, GFP_KERNEL)
            else {
                // Retried at the next post, or the next kick.
                self.kernel_doorbells.lock().overflow = true;
                return;
            };
            self.verbs.kernel_qps(&mut all);
            for qp in all {
                ring(Some(qp));
            }
        }
    }

    /// Moves posted work of the queued QPs into the connection, sends what it has to send,
    /// delivers its completions (queueing their QPs for feeding: there is room now) and
    /// arms the timer.
    fn run(&self, peer: &Peer, p: &mut PeerInner) {
        let now = work::now_ns();
        // A few rounds: completions make room for more of the rings' WQEs, which may complete
        // at once (flushed in the error state). What is left waits for the timer.
        for _ in 0..4 {
            self.feed_queued(p, now);
            let PeerInner { conn, buf, .. } = &mut *p;
            let mut mem = Mem::new(&self.verbs);
            {
                let mut alloc = self.alloc.lock();
                // Datagrams the full receive queue dropped: the host is the bottleneck.
                let nomem = self.counters.get(Counter::RxNoMem);
                let seen = self.nomem_seen.swap(nomem, Ordering::Relaxed);
                if nomem > seen {
                    alloc.note_dropped(now, (nomem - seen).min(u64::from(u32::MAX)) as u32);
                }
                conn.update_allocation(now, &mut alloc);
                let cap = u64::from(alloc.effective_capacity());
                self.counters.set(Counter::CcRxCapacityMbps, cap);
            }
            // Datagrams of one path in a row (the transport sends runs of `PATH_BURST`) go
            // out as one GSO packet: all of one size but the last.
            let mut batch: Option<TxBatch> = None;
            loop {
                let end = batch.as_ref().map_or(0, |b| b.end);
                if end + MAX_DATAGRAM > buf.len() {
                    if let Some(b) = batch.take() {
                        self.transmit_batch(peer, &b, buf);
                    }
                    continue;
                }
                let Some(t) =
                    conn.poll_transmit(now, buf.get_mut(end..).unwrap_or(&mut []), &mut mem)
                else {
                    break;
                };
                match batch.as_mut() {
                    Some(b) if b.takes(&t) => b.push(t.len),
                    _ => {
                        if let Some(b) = batch.take() {
                            self.transmit_batch(peer, &b, buf);
                            // The new datagram starts the next batch, at the front.
                            buf.copy_within(end..end + t.len, 0);
                        }
                        batch = Some(TxBatch::new(&t));
                    }
                }
            }
            if let Some(b) = batch.take() {
                self.transmit_batch(peer, &b, buf);
            }
            while let Some(ev) = p.conn.poll_event() {
                match &ev {
                    Event::SendCompletion(c) => {
                        if c.status == CqStatus::RetryExcErr {
                            self.counters.inc(Counter::RetryExceeded);
                        }
                        p.queue_feed(c.stream);
                    }
                    Event::RecvCompletion(c) => p.queue_feed(c.stream),
                    // Unsignaled WQEs completed: the ring's held-back WQEs fit now.
                    Event::SendQueueRoom(sid) => p.queue_feed(*sid),
                    // The rings flush at the next feed: after the completions of what the
                    // transport held, which follow this event (`Qp::set_error`).
                    Event::StreamError { stream, .. } => p.queue_feed(*stream),
                }
                deliver(&p.qps, ev);
            }
            if p.feed.is_empty() {
                break;
            }
        }
        self.report(&p.conn, &mut p.reported);
        // A connection with no QP left on it goes quiet: no probes of its paths, no timers,
        // until a QP opens a stream on it again.
        // So does HELLO: it is repeated only while the peer has QPs and has not answered.
        let deadline = if p.attached == 0 {
            None
        } else {
            let hello = self.hello_tick(peer, p.conn.path_count(), now);
            let conn = if p.feed.is_empty() {
                p.conn.poll_timeout()
            } else {
                Some(now)
            };
            match (conn, hello) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        };
        if let Some(deadline) = deadline {
            if let Some(t) = &*self.rx_thread.lock() {
                t.arm(deadline, now);
            }
        }
    }

    /// Adds what the connection counted since the last time to the device's counters.
    fn report(&self, conn: &Conn, r: &mut Reported) {
        let s = conn.stats();
        let c = &self.counters;
        let add = |counter, now: u64, before: &mut u64| {
            c.add(counter, now.saturating_sub(*before));
            *before = now;
        };
        add(Counter::Retransmits, s.retransmits, &mut r.retransmits);
        add(Counter::AcksSent, s.acks_out, &mut r.acks_out);
        add(Counter::AcksRcvd, s.acks_in, &mut r.acks_in);
        add(Counter::Timeouts, s.timeouts, &mut r.timeouts);
        let cc = conn.congestion().stats;
        let [paced, limited, echoed] = &mut r.cc;
        add(Counter::CcPaced, cc.paced, paced);
        add(Counter::CcWindowLimited, cc.window_limited, limited);
        add(Counter::CcEcnEchoed, cc.ecn_ce, echoed);
        // By NAK code (docs/wire-format.md): 1 remote access, 2 invalid request, 3 RNR,
        // 4 out of window, 5 remote operational.
        const SENT: [Counter; 5] = [
            Counter::NakSentRemoteAccess,
            Counter::NakSentInvalidRequest,
            Counter::NakSentRnr,
            Counter::NakSentOutOfWindow,
            Counter::NakSentRemoteOp,
        ];
        const RCVD: [Counter; 5] = [
            Counter::NakRcvdRemoteAccess,
            Counter::NakRcvdInvalidRequest,
            Counter::NakRcvdRnr,
            Counter::NakRcvdOutOfWindow,
            Counter::NakRcvdRemoteOp,
        ];
        for (code, (sent, rcvd)) in SENT.iter().zip(RCVD.iter()).enumerate() {
            let code = code + 1;
            if let (Some(now), Some(before)) =
                (s.naks_out_by_code.get(code), r.naks_out.get_mut(code))
            {
                add(*sent, *now, before);
            }
            if let (Some(now), Some(before)) =
                (s.naks_in_by_code.get(code), r.naks_in.get_mut(code))
            {
                add(*rcvd, *now, before);
            }
        }
        add(Counter::Duplicates, s.duplicates, &mut r.duplicates);
        // Each RNR NAK received means one more try after the back-off.
        add(Counter::RnrRetries, s.rnr_naks_in, &mut r.rnr_naks);
        for (i, (counters, before)) in PATH_COUNTERS.iter().zip(r.paths.iter_mut()).enumerate() {
            if let Some(ps) = conn.path_stats(i) {
                let now = [ps.sent, ps.retransmitted, ps.lost];
                for ((counter, now), before) in counters.iter().zip(now).zip(before.iter_mut()) {
                    add(*counter, now, before);
                }
            }
        }
    }

    /// Feeds the QPs on the feed queue; those that want another round stay on it.
    fn feed_queued(&self, p: &mut PeerInner, now: u64) {
        let PeerInner {
            conn, qps, feed, ..
        } = p;
        let mut again = false;
        for &sid in feed.iter() {
            if let Some(slot) = qps.get_mut(usize::from(sid.0)) {
                // Failed before this round: its transport flushes come out of this round.
                let failed_before = slot.failed;
                let fed = Self::feed(&self.verbs, conn, slot, sid, now);
                if fed == Fed::RingError {
                    self.counters.inc(Counter::RingErrors);
                }
                if failed_before {
                    slot.failed = false;
                }
                slot.queued = fed != Fed::Done;
                again |= slot.queued;
            }
        }
        if again {
            feed.retain(|sid| qps.get(usize::from(sid.0)).is_some_and(|s| s.queued));
        } else {
            feed.clear();
        }
    }

    /// Copies posted WQEs out of a QP's rings into its stream while there is room; in the
    /// error state flushes them instead (`Qp::flush`).
    ///
    /// Userspace may have written anything into its rings: a producer index claiming more
    /// than a ring holds, or a WQE the provider could not have written
    /// (`sys::send_wqe_decodes`, `sys::recv_wqe_decodes`), fails the QP (`Qp::fatal`:
    /// the error state, `IB_EVENT_QP_FATAL`) and its stream. The WQE stays in the ring and
    /// flushes with the others, after what the transport held for the QP: that flushes as
    /// the run's next round delivers its completions, and the rings wait for a feed after
    /// that ([`QpSlot::failed`]).
    fn feed(verbs: &Verbs, conn: &mut Conn, slot: &mut QpSlot, sid: StreamId, now: u64) -> Fed {
        let QpSlot { qp, failed, .. } = slot;
        let Some(qp) = qp.as_ref() else {
            return Fed::Done;
        };
        if *failed {
            return Fed::Again;
        }
        let mut inner = qp.inner.lock();
        if inner.state == QpState::Err {
            drop(inner);
            qp.flush();
            return Fed::Done;
        }
        // Receives are taken from RTR on, sends only in RTS.
        let receiving = matches!(inner.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
        let sending = inner.state == QpState::Rts;
        let mut broken = false;
        if let Some(rq) = qp.queues.rq.as_ref().filter(|_| receiving) {
            loop {
                let wqe = match rq.peek() {
                    Ok(Some(wqe)) => wqe,
                    Ok(None) => break,
                    Err(_) => {
                        broken = true;
                        break;
                    }
                };
                let local = match judge_recv(&wqe) {
                    Judged::Usable(w) => sg_list(&w.local),
                    // Unusable SGEs: the WQE completes in error, like a bad post would.
                    Judged::Refused => {
                        rq.pop();
                        qp.recv_error(wqe.wr_id, wc_status::LOC_LEN_ERR);
                        continue;
                    }
                    Judged::Fatal => {
                        broken = true;
                        break;
                    }
                };
                let posted = conn.post_recv(
                    sid,
                    stream::RecvWqe {
                        wr_id: wqe.wr_id,
                        local,
                    },
                );
                match posted {
                    Ok(()) => rq.pop(),
                    Err(_) => break,
                }
            }
        }
        if let (Some(store), Some((req, _))) = (inner.inline.as_mut(), conn.stream_stats(sid)) {
            store.release(req.completed);
        }
        while sending && !broken {
            let wqe = match qp.queues.sq.peek() {
                Ok(Some(wqe)) => wqe,
                Ok(None) => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            };
            // A kernel consumer's ring holds what the kernel wrote (REG_MR among it).
            let judge = if qp.kernel.is_some() {
                judge_kernel_send
            } else {
                judge_send
            };
            let work = match judge(&wqe, qp.sq_sig_all, inner.inline.is_some()) {
                // A UC QP has no READ, atomics, SEND with invalidate, ATOMIC WRITE or FLUSH
                // (the provider refuses them at post).
                Judged::Usable(w) if qp.qp_type == QpType::Uc && !w.op.on_uc() => None,
                Judged::Usable(w) => Some(w),
                Judged::Refused => None,
                Judged::Fatal => {
                    broken = true;
                    break;
                }
            };
            // A bind, a registration or a local invalidate (it sends nothing): carried out
            // once every WQE before it has completed, so that its completion follows theirs.
            // An unsignaled, unfenced bind or registration that succeeds has no completion:
            // it takes effect at once, as rxe's requester does (no earlier WQE can be using a
            // window or an MR being bound or registered). A local invalidate always waits: an
            // earlier WQE still in flight may be resent and read through the lkey it revokes.
            if let Some(w) = work.filter(|w| w.op.is_local()) {
                if conn.send_outstanding(sid) != 0 {
                    let early = !w.signaled && !w.fence && w.op != SendOp::LocalInv;
                    // One that fails changes nothing: it waits, and fails in order.
                    if !(early && Self::apply_local(verbs, qp, &w)) {
                        conn.want_send_drained(sid);
                        break;
                    }
                    qp.queues.sq.pop();
                    continue;
                }
                qp.queues.sq.pop();
                if !Self::local_op(verbs, qp, &w) {
                    // Refused: completed in error, and the QP fails (what follows flushes).
                    inner.state = QpState::Err;
                    drop(inner);
                    let _ = conn.fail_stream(sid);
                    *failed = true;
                    return Fed::Again;
                }
                continue;
            }
            let stash = match &work {
                Some(w) => stash_inline(&mut inner, &wqe, w, qp.qpn, conn.stream_stats(sid)),
                None => Stash::NotInline,
            };
            let twqe = match (work, stash) {
                (Some(w), Stash::NotInline) => send_wqe(&w, None),
                (Some(w), Stash::Stored(sge)) => send_wqe(&w, Some(sge)),
                // Every slot holds a payload still in flight: wait for completions (which
                // may be unsignaled: ask to hear of them).
                (Some(_), Stash::Full) => {
                    conn.want_send_room(sid);
                    break;
                }
                (None, _) | (Some(_), Stash::Invalid) => None,
            };
            let Some(twqe) = twqe else {
                qp.queues.sq.pop();
                let cqe = Cqe::status_only(
                    wqe.wr_id,
                    wc_status::LOC_QP_OP_ERR,
                    wc_opcode::for_send(wqe.opcode),
                    qp.qpn,
                );
                qp.complete_send(&cqe);
                continue;
            };
            match conn.post_send(now, sid, twqe) {
                Ok(()) => qp.queues.sq.pop(),
                Err(_) => {
                    // Not taken: its payload is stashed again next time.
                    if let (Stash::Stored(_), Some(store)) = (stash, inner.inline.as_mut()) {
                        store.unstore_newest();
                    }
                    break;
                }
            }
        }
        if broken && qp.fatal(&mut inner) {
            drop(inner);
            let _ = conn.fail_stream(sid);
            *failed = true;
            return Fed::RingError;
        }
        Fed::Done
    }

    /// Carries out the bind, registration or local invalidate `w` of `qp` (`mw.rs`, `frwr.rs`)
    /// and completes it: with a CQE if it is signaled, or in error (`IB_WC_MW_BIND_ERR`,
    /// `IB_WC_LOC_QP_OP_ERR`, as rxe) always. Returns whether it succeeded.
    fn local_op(verbs: &Verbs, qp: &Qp, w: &SendWork) -> bool {
        let done = Self::apply_local(verbs, qp, w);
        let (opcode, error) = match w.op {
            SendOp::BindMw => (wc_opcode::BIND_MW, wc_status::MW_BIND_ERR),
            SendOp::RegMr => (wc_opcode::REG_MR, wc_status::LOC_QP_OP_ERR),
            _ => (wc_opcode::LOCAL_INV, wc_status::LOC_QP_OP_ERR),
        };
        let status = if done { wc_status::SUCCESS } else { error };
        if w.signaled || !done {
            let cqe = Cqe::status_only(w.wr_id, status, opcode, qp.qpn);
            qp.complete_send(&cqe);
        }
        done
    }

    /// The effect of the bind, registration or local invalidate `w` of `qp`: whether it took
    /// place (a refused one changes nothing).
    fn apply_local(verbs: &Verbs, qp: &Qp, w: &SendWork) -> bool {
        match (w.op, w.bind, w.reg) {
            (SendOp::BindMw, Some(b), _) => verbs.bind_mw(qp.pd, qp.qpn, &b).is_ok(),
            (SendOp::RegMr, _, Some(r)) => verbs.reg_fast(qp.pd, &r).is_ok(),
            (SendOp::LocalInv, _, _) => verbs.invalidate(qp.pd, w.rkey),
            _ => false,
        }
    }

    /// Processes the receive queue (softirq, or a receive thread).
    fn process_rx(self: &Arc<Self>) {
        let mut handled = 0u32;
        loop {
            // The peer of the datagram at the head; with the peer locked, take its datagrams
            // while they are at the head (another CPU may have taken them first: then the
            // batch is empty).
            let Some(peer) = self.next_rx_peer() else {
                break;
            };
            // Busy (a doorbell sending, another CPU): its holder takes them on release.
            let Some(mut p) =
                Self::lock_data_path(&peer).or_else(|| self.leave_to_holder(&peer, PENDING_RX))
            else {
                break;
            };
            handled = handled.saturating_add(self.receive_batch(&peer, &mut p));
            self.run(&peer, &mut p);
            self.release(&peer, p);
        }
        // A run that found its datagrams taken (by another CPU, or left to the holder) says
        // nothing of their size.
        if handled > 0 {
            self.note_run(handled);
        }
    }

    /// Handles the datagrams of `peer` at the head of the receive queue, `RX_BATCH` at most
    /// (one run after them: one ACK covers the batch); returns how many.
    fn receive_batch(&self, peer: &Peer, p: &mut PeerInner) -> u32 {
        let now = work::now_ns();
        let mut handled = 0;
        let mut mem = Mem::new(&self.verbs);
        for _ in 0..RX_BATCH {
            let mut q = self.rxq.lock();
            if !head_src(&q).is_some_and(|src| peer.planes.has(src)) {
                break;
            }
            let Some(item) = q.pop() else {
                break;
            };
            drop(q);
            handled += 1;
            let PeerInner {
                conn,
                qps,
                feed,
                attached,
                idle_since,
                ..
            } = &mut *p;
            let data = item.buf.bytes();
            // Receive WQEs posted since the last run must be in the stream before the data
            // that consumes them (receives have no doorbell): feed the destination QP, and
            // only it, and only for a datagram that consumes one (WRITE data and ACKs, most
            // of a bulk transfer, need none: the QP's lock and rings are left alone).
            let dst = Packet::peek_recv_qp(data).and_then(|qpn| conn.stream_by_qp(qpn));
            if let Some(sid) = dst {
                if let Some(slot) = qps.get_mut(usize::from(sid.0)) {
                    let fed = Self::feed(&self.verbs, conn, slot, sid, now);
                    if fed == Fed::RingError {
                        self.counters.inc(Counter::RingErrors);
                    }
                    if fed != Fed::Done {
                        // The run after the batch flushes it.
                        slot.queue(feed, sid);
                    }
                }
            }
            match conn.handle_packet(now, data, item.arrival, &mut mem) {
                Ok(()) => {}
                Err(RecvError::DeviceLevel) => {
                    // A peer made again proved its new connection to this one, which it now
                    // uses: it lingers afresh. Else a QP of ours opened within the linger
                    // would find it expired and make another connection, which the peer
                    // (talking to this one) would have to learn anew; meanwhile its first
                    // messages reach a connection without their QP.
                    if self.on_hello(peer, conn, data, now) && *attached == 0 && *idle_since != 0 {
                        *idle_since = now.max(1);
                    }
                }
                Err(RecvError::UnknownStream) => self.counters.inc(Counter::RxNoConnection),
                Err(RecvError::WrongConnection) => {
                    self.counters.inc(Counter::RxNoConnection);
                    self.counters.inc(Counter::RxWrongConnection);
                    self.on_wrong_connection(peer, conn.path_count(), now);
                }
                Err(RecvError::OutOfWindow) => self.counters.inc(Counter::RxOutOfWindow),
                // Malformed for the transport: dropped (its own stats count it).
                Err(_) => {}
            }
        }
        self.counters.add(Counter::RingErrors, mem.ring_errors);
        handled
    }

    /// Leaves `what` (`PENDING_*`) to the holder of `peer`'s lock, which we failed to take;
    /// returns the lock if it was released meanwhile (then the work is ours after all, and
    /// the caller does it through [`Engine::release`]).
    fn leave_to_holder<'a>(
        &self,
        peer: &'a Peer,
        what: u8,
    ) -> Option<SpinLockBhGuard<'a, PeerInner>> {
        peer.pending.fetch_or(what, Ordering::SeqCst);
        // Pairs with the fence in `release`: either the holder sees our bit after unlocking,
        // or we see the lock free.
        fence(Ordering::SeqCst);
        if let Some(p) = Self::lock_data_path(peer) {
            return Some(p);
        }
        if peer.takes_pending.load(Ordering::SeqCst) {
            return None;
        }
        // A holder off the data path (or one just leaving): wait for the lock.
        Some(Self::lock_data_path_waiting(peer))
    }

    /// Takes `peer`'s lock if it is free, as a data path holder (one that runs
    /// [`Engine::release`] to unlock).
    fn lock_data_path(peer: &Peer) -> Option<SpinLockBhGuard<'_, PeerInner>> {
        let p = peer.inner.try_lock()?;
        peer.takes_pending.store(true, Ordering::SeqCst);
        Some(p)
    }

    /// [`Engine::lock_data_path`], waiting for the lock if it is held.
    fn lock_data_path_waiting(peer: &Peer) -> SpinLockBhGuard<'_, PeerInner> {
        let p = peer.inner.lock();
        peer.takes_pending.store(true, Ordering::SeqCst);
        p
    }

    /// Unlocks `peer`, first doing the work others left to us because we held it
    /// (`Peer::pending`), the way a socket's backlog is processed on release.
    fn release<'a>(&self, peer: &'a Peer, mut p: SpinLockBhGuard<'a, PeerInner>) {
        loop {
            loop {
                let bits = peer.pending.swap(0, Ordering::SeqCst);
                if bits == 0 {
                    break;
                }
                if bits & PENDING_DOORBELL != 0 {
                    let (streams, len, overflow) = {
                        let mut d = peer.doorbells.lock();
                        let taken = (d.streams, d.len, d.overflow);
                        d.len = 0;
                        d.overflow = false;
                        taken
                    };
                    for sid in streams.iter().take(len) {
                        p.queue_feed(*sid);
                    }
                    if overflow {
                        for sid in 0..p.qps.len() {
                            if p.qps.get(sid).is_some_and(|q| q.qp.is_some()) {
                                p.queue_feed(StreamId(sid as u16));
                            }
                        }
                    }
                }
                if bits & PENDING_TIMER != 0 && p.attached != 0 {
                    p.conn.handle_timeout(work::now_ns());
                }
                if bits & PENDING_RX != 0 {
                    while self.receive_batch(peer, &mut p) > 0 {
                        self.run(peer, &mut p);
                    }
                }
                self.run(peer, &mut p);
            }
            peer.takes_pending.store(false, Ordering::SeqCst);
            drop(p);
            // Whoever found the peer locked set its bit before trying again: one of us sees
            // the other.
            fence(Ordering::SeqCst);
            if peer.pending.load(Ordering::SeqCst) == 0 {
                break;
            }
            p = match Self::lock_data_path(peer) {
                Some(p) => p,
                // A data path holder sees the bits when it releases.
                None if peer.takes_pending.load(Ordering::SeqCst) => break,
                // One off the data path does not: wait for it, then do them.
                None => Self::lock_data_path_waiting(peer),
            };
        }
        // Datagrams of other peers may wait behind ours: the threads take them.
        if head_src(&self.rxq.lock()).is_some() {
            self.kick_rx();
        }
    }

    /// Learns from a receive run's size (`handled` datagrams) where the next one should run
    /// (see `rx_spread`).
    fn note_run(&self, handled: u32) {
        // Average datagrams per run, in 1/16, over about the last four runs.
        let avg = self.rx_run_avg.load(Ordering::Relaxed);
        let avg = (avg * 3 + handled.min(1024) * 16) / 4;
        self.rx_run_avg.store(avg, Ordering::Relaxed);
        self.rx_spread
            .store(avg >= SPREAD_RUN * 16, Ordering::Relaxed);
    }

    /// The peer of the oldest queued datagram; datagrams from unknown peers are dropped.
    fn next_rx_peer(&self) -> Option<Arc<Peer>> {
        loop {
            let src = {
                let q = self.rxq.lock();
                head_src(&q)?
            };
            if let Some(peer) = self.peer(src) {
                return Some(peer);
            }
            // Drop it, if another CPU's thread has not taken it meanwhile.
            let mut q = self.rxq.lock();
            if head_src(&q) == Some(src) {
                let item = q.pop();
                drop(q);
                drop(item);
                self.counters.inc(Counter::RxNoConnection);
                self.counters.inc(Counter::RxNoPeer);
            }
        }
    }

    /// The alarm went off (softirq): every peer's timers, each peer's run by whoever holds it.
    fn process_timers(self: &Arc<Self>) {
        let mut i = 0;
        while let Some(peer) = self.peer_at(i) {
            i += 1;
            let peer = &peer;
            let Some(mut p) =
                Self::lock_data_path(peer).or_else(|| self.leave_to_holder(peer, PENDING_TIMER))
            else {
                continue;
            };
            if p.attached != 0 {
                p.conn.handle_timeout(work::now_ns());
                self.run(peer, &mut p);
            }
            self.release(peer, p);
        }
        // A burst whose last datagram never came in (dropped by the UDP layer) is still
        // queued: `receive` armed the alarm for it.
        if self.rx_queued() > 0 {
            self.kick_rx();
        }
    }
}

impl KthreadWork for Engine {
    fn run(this: &Arc<Engine>) {
        this.process_kernel_doorbells();
        this.process_datagrams();
        this.process_rx();
    }

    fn alarm(this: &Arc<Engine>) {
        this.process_timers();
    }
}

/// The transport's view of our MR table: every access on behalf of a QP, checked against that
/// QP's protection domain and (remote accesses) its `qp_access_flags` as well as the MR's own
/// rights.
struct Mem<'a> {
    verbs: &'a Verbs,
    /// The QP last asked about: a run or a batch mostly serves one.
    last: Option<QpRights>,
    /// SRQs found broken by userspace (`SrqTake::RingError`), for `ring_errors`.
    ring_errors: u64,
}

/// What the checks need of a QP.
#[derive(Clone, Copy)]
struct QpRights {
    qpn: u32,
    pd: usize,
    access: u32,
    /// A kernel consumer's QP: its SGEs under `local_dma_lkey` name kernel memory.
    kmem: Option<KernelMemory>,
}

fn access_error(e: verbs::MrError) -> AccessError {
    match e {
        verbs::MrError::Bounds => AccessError::Bounds,
        verbs::MrError::Permission => AccessError::Permission,
    }
}

impl<'a> Mem<'a> {
    fn new(verbs: &'a Verbs) -> Self {
        Mem {
            verbs,
            last: None,
            ring_errors: 0,
        }
    }

    fn rights(&mut self, qpn: u32) -> Result<QpRights, AccessError> {
        if let Some(r) = self.last.filter(|r| r.qpn == qpn) {
            return Ok(r);
        }
        let r = self
            .verbs
            .with_qp(qpn, |qp| QpRights {
                qpn,
                pd: qp.pd,
                access: qp.access_flags(),
                kmem: qp.kernel.map(|k| k.mem),
            })
            .ok_or(AccessError::Key)?;
        self.last = Some(r);
        Ok(r)
    }

    /// A kernel QP's SGE under `local_dma_lkey`: the kernel address `offset` bytes into it,
    /// if `len` bytes fit there. Err(Key) for a user QP (no user MR has that key).
    fn kernel_sge(
        &mut self,
        qpn: u32,
        sge: &Sge,
        offset: u32,
        len: usize,
    ) -> Result<(KernelMemory, u64), AccessError> {
        let mem = self.rights(qpn)?.kmem.ok_or(AccessError::Key)?;
        let end = u64::from(offset) + len as u64;
        if end > u64::from(sge.len) {
            return Err(AccessError::Bounds);
        }
        Ok((mem, sge.addr.wrapping_add(u64::from(offset))))
    }

    /// `f` applied to the MR `lkey` names, if it is in QP `qpn`'s protection domain (under
    /// the MR table's lock: see `Verbs::with_mr`).
    fn local_mr<R>(
        &mut self,
        qpn: u32,
        lkey: u32,
        f: impl FnOnce(&verbs::Mr) -> Result<R, verbs::MrError>,
    ) -> Result<R, AccessError> {
        let pd = self.rights(qpn)?.pd;
        self.verbs
            .with_mr(lkey, Some(pd), f)
            .ok_or(AccessError::Key)?
            .map_err(access_error)
    }

    /// `f` applied to what `rkey` reaches for `len` bytes at `va`, if the QP `qpn` grants
    /// `right` (an `IB_ACCESS_REMOTE_*` flag): an MR of the QP's protection domain, with `va`
    /// and `right` (the MR's own rights are checked on access); or, through a memory window
    /// (`mw.rs`), its MR with the address in it and the right the MR itself needs.
    fn remote_mr<R>(
        &mut self,
        qpn: u32,
        rkey: u32,
        (va, len, right): (u64, u64, u32),
        f: impl FnOnce(&verbs::Mr, u64, u32) -> Result<R, verbs::MrError>,
    ) -> Result<R, AccessError> {
        let r = self.rights(qpn)?;
        if r.access & right != right {
            return Err(AccessError::Permission);
        }
        if rkey & verbs::MW_KEY_BIT != 0 && rkey != verbs::INLINE_LKEY {
            return self
                .verbs
                .with_window(rkey, r.pd, qpn, (va, len, right), f)
                .map_err(|e| match e {
                    WindowError::Window(MwError::Bounds) => AccessError::Bounds,
                    WindowError::Window(MwError::Rights) => AccessError::Permission,
                    WindowError::Mr(e) => access_error(e),
                    WindowError::Window(_) | WindowError::NoMr => AccessError::Key,
                });
        }
        self.verbs
            .with_mr(rkey, Some(r.pd), |mr| f(mr, va, right))
            .ok_or(AccessError::Key)?
            .map_err(access_error)
    }
}

impl Memory for Mem<'_> {
    fn read_local(
        &mut self,
        qp: u32,
        sge: &Sge,
        offset: u32,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        if sge.lkey == verbs::INLINE_LKEY {
            // An inline payload: in the store of the QP named by the address's high half,
            // which must be the QP sending it.
            if (sge.addr >> 32) as u32 != qp {
                return Err(AccessError::Key);
            }
            let at = (sge.addr as u32 as usize).saturating_add(offset as usize);
            return self
                .verbs
                .with_qp(qp, |qp| {
                    let inner = qp.inner.lock();
                    let store = inner.inline.as_ref().ok_or(AccessError::Key)?;
                    store.read(at, out).ok_or(AccessError::Bounds)
                })
                .ok_or(AccessError::Key)?;
        }
        if sge.lkey == KERNEL_LKEY {
            let (mem, addr) = self.kernel_sge(qp, sge, offset, out.len())?;
            return mem.read(addr, out).map_err(|_| AccessError::Bounds);
        }
        let va = sge
            .addr
            .checked_add(u64::from(offset))
            .ok_or(AccessError::Bounds)?;
        self.local_mr(qp, sge.lkey, |mr| mr.read(va, out, 0))
    }

    fn write_local(
        &mut self,
        qp: u32,
        sge: &Sge,
        offset: u32,
        data: &[u8],
    ) -> Result<(), AccessError> {
        if sge.lkey == KERNEL_LKEY {
            let (mem, addr) = self.kernel_sge(qp, sge, offset, data.len())?;
            return mem.write(addr, data).map_err(|_| AccessError::Bounds);
        }
        let va = sge
            .addr
            .checked_add(u64::from(offset))
            .ok_or(AccessError::Bounds)?;
        self.local_mr(qp, sge.lkey, |mr| mr.write(va, data, access::LOCAL_WRITE))
    }

    fn check_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        len: u32,
        access: Access,
    ) -> Result<(), AccessError> {
        let right = remote_right(access);
        self.remote_mr(qp, rkey, (va, u64::from(len), right), |mr, va, right| {
            mr.check(va, u64::from(len), right)
        })
    }

    fn write_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        data: &[u8],
    ) -> Result<(), AccessError> {
        let right = access::REMOTE_WRITE;
        let len = data.len() as u64;
        self.remote_mr(qp, rkey, (va, len, right), |mr, va, right| {
            mr.write(va, data, right)
        })
    }

    fn read_remote(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        let right = access::REMOTE_READ;
        let len = out.len() as u64;
        self.remote_mr(qp, rkey, (va, len, right), |mr, va, right| {
            mr.read(va, out, right)
        })
    }

    /// A SEND_WITH_INV's rkey: a type 2 window of the QP's PD (`mw.rs`), or a kernel
    /// consumer's fast registration MR (`frwr.rs`).
    fn invalidate(&mut self, qp: u32, rkey: u32) -> Result<(), AccessError> {
        let pd = self.rights(qp)?.pd;
        if self.verbs.invalidate(pd, rkey) {
            Ok(())
        } else {
            Err(AccessError::Key)
        }
    }

    fn shared_recv(&mut self, qp: u32) -> Option<stream::RecvWqe> {
        let (taken, broke) = self
            .verbs
            .with_qp(qp, |qp| {
                let srq = qp.srq.as_ref()?;
                loop {
                    match srq.take() {
                        verbs::SrqTake::Taken(w) => {
                            let local = sg_list(&w.local);
                            break Some((
                                Some(stream::RecvWqe {
                                    wr_id: w.wr_id,
                                    local,
                                }),
                                false,
                            ));
                        }
                        // Unusable SGEs: it completes in error on this QP, like a bad post
                        // would; the next one may do.
                        verbs::SrqTake::Refused(wr_id) => {
                            qp.recv_error(wr_id, wc_status::LOC_LEN_ERR);
                        }
                        verbs::SrqTake::Empty => break Some((None, false)),
                        verbs::SrqTake::RingError => break Some((None, true)),
                    }
                }
            })
            .flatten()?;
        if broke {
            self.ring_errors += 1;
        }
        taken
    }

    fn atomic(&mut self, qp: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        if va % 8 != 0 {
            return Err(AccessError::Alignment);
        }
        let right = remote_right(op.access());
        self.remote_mr(qp, rkey, (va, 8, right), |mr, va, right| {
            mr.atomic(va, right, |old| op.apply(old))
        })
    }

    /// The region must grant the flush's placement type (`IB_ACCESS_FLUSH_GLOBAL`; the device
    /// has no persistent memory, so no region grants `IB_ACCESS_FLUSH_PERSISTENT`) and hold
    /// the range; a memory window's rkey is refused (windows grant no flush). Data is placed
    /// by CPU stores as it arrives, and every earlier message's is (the transport runs a
    /// FLUSH in message order): a full barrier makes it visible to every observer.
    fn flush(
        &mut self,
        qp: u32,
        rkey: u32,
        va: u64,
        len: u64,
        persistent: bool,
        whole_region: bool,
    ) -> Result<(), AccessError> {
        if rkey & verbs::MW_KEY_BIT != 0 {
            return Err(AccessError::Key);
        }
        let right = if persistent {
            access::FLUSH_PERSISTENT
        } else {
            access::FLUSH_GLOBAL
        };
        // The QP's own access flags have no flush bits: the region's decide.
        self.remote_mr(qp, rkey, (va, len, 0), |mr, va, _| {
            if whole_region {
                mr.check(mr.iova, 0, right)
            } else {
                mr.check(va, len, right)
            }
        })?;
        core::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }
}

fn remote_right(access: Access) -> u32 {
    match access {
        Access::Read => access::REMOTE_READ,
        Access::Write => access::REMOTE_WRITE,
        Access::Atomic => access::REMOTE_ATOMIC,
    }
}

/// A judged SGE list as the transport takes it (the same bounds: at most `MAX_SGE` entries,
/// whose lengths sum to a `u32`; `sys::abi` asserts the limits agree).
fn sg_list(l: &vwqe::SgList) -> SgList {
    let mut list = [Sge::default(); crate::transport::memory::MAX_SGE];
    for (d, s) in list.iter_mut().zip(l.sges()) {
        *d = Sge {
            addr: s.addr,
            len: s.length,
            lkey: s.lkey,
        };
    }
    SgList::new(list.get(..l.sges().len()).unwrap_or(&[])).unwrap_or_default()
}

/// What became of a send WQE's inline payload.
#[derive(Clone, Copy)]
enum Stash {
    NotInline,
    /// Kept; the SGE that stands for it.
    Stored(Sge),
    /// No free slot now.
    Full,
    /// The QP has no transport stream to count it against.
    Invalid,
}

/// Keeps the inline payload of `work` (if it has one: its bytes are the first of `wqe.data`)
/// in the QP's store.
fn stash_inline(
    inner: &mut verbs::QpInner,
    wqe: &SendWqe,
    work: &SendWork,
    qpn: u32,
    stats: Option<(
        stream::requester::RequesterStats,
        stream::responder::ResponderStats,
    )>,
) -> Stash {
    let Payload::Inline(len) = work.payload else {
        return Stash::NotInline;
    };
    let (Some(store), Some((req, _))) = (inner.inline.as_mut(), stats) else {
        return Stash::Invalid;
    };
    // `judge_send` bounded `len` by the data area.
    let Some(data) = wqe.data.get(..len as usize) else {
        return Stash::Invalid;
    };
    match store.store(req.posted, data) {
        Some(offset) => Stash::Stored(Sge {
            addr: (u64::from(qpn) << 32) | u64::from(offset),
            len,
            lkey: verbs::INLINE_LKEY,
        }),
        None => Stash::Full,
    }
}

/// A judged send WQE as the transport takes it (`inline`: the SGE standing for its inline
/// payload, kept in the QP's [`verbs::InlineStore`]); None for an inline payload not stashed.
fn send_wqe(w: &SendWork, inline: Option<Sge>) -> Option<stream::SendWqe> {
    let local = match (w.payload, inline) {
        (_, Some(sge)) => SgList::single(sge),
        (Payload::Sges(l), None) => sg_list(&l),
        (Payload::Inline(_), None) => return None,
    };
    let opcode = match w.op {
        SendOp::Send => WrOpcode::Send,
        SendOp::SendWithImm => WrOpcode::SendWithImm,
        SendOp::SendWithInv => WrOpcode::SendWithInv,
        SendOp::RdmaWrite => WrOpcode::RdmaWrite,
        SendOp::RdmaWriteWithImm => WrOpcode::RdmaWriteWithImm,
        SendOp::RdmaRead => WrOpcode::RdmaRead,
        SendOp::CmpSwap => WrOpcode::CmpSwap,
        SendOp::FetchAdd => WrOpcode::FetchAdd,
        SendOp::AtomicWrite => WrOpcode::AtomicWrite,
        SendOp::Flush => WrOpcode::Flush,
        // Carried out by the feeder (`Engine::local_op`), never by the transport.
        SendOp::BindMw | SendOp::LocalInv | SendOp::RegMr => return None,
    };
    let mut t = stream::SendWqe::new(w.wr_id, opcode, local).remote(w.remote_addr, w.rkey);
    if let Some(imm) = w.imm {
        t = t.imm(imm);
    }
    if w.op == SendOp::SendWithInv {
        // The rkey the receiver invalidates travels where immediate data would.
        t = t.imm(w.rkey);
    }
    if let Some((compare_add, swap)) = w.atomic {
        t = t.atomic(compare_add, swap);
    }
    t.signaled = w.signaled;
    t.solicited = w.solicited;
    Some(t)
}

fn wc_status(s: CqStatus) -> u32 {
    use wc_status as w;
    match s {
        CqStatus::Success => w::SUCCESS,
        CqStatus::LocLenErr => w::LOC_LEN_ERR,
        CqStatus::LocProtErr => w::LOC_PROT_ERR,
        CqStatus::WrFlushErr => w::WR_FLUSH_ERR,
        CqStatus::RemAccessErr => w::REM_ACCESS_ERR,
        CqStatus::RemInvReqErr => w::REM_INV_REQ_ERR,
        CqStatus::RemOpErr => w::REM_OP_ERR,
        CqStatus::RetryExcErr => w::RETRY_EXC_ERR,
        CqStatus::RnrRetryExcErr => w::RNR_RETRY_EXC_ERR,
    }
}

fn wc_opcode(o: CqOpcode) -> u32 {
    use wc_opcode as w;
    match o {
        CqOpcode::Send => w::SEND,
        CqOpcode::RdmaWrite => w::RDMA_WRITE,
        CqOpcode::RdmaRead => w::RDMA_READ,
        CqOpcode::CmpSwap => w::COMP_SWAP,
        CqOpcode::FetchAdd => w::FETCH_ADD,
        CqOpcode::Recv => w::RECV,
        CqOpcode::RecvRdmaWithImm => w::RECV_RDMA_WITH_IMM,
        CqOpcode::AtomicWrite => w::ATOMIC_WRITE,
        CqOpcode::Flush => w::FLUSH,
    }
}

/// Hands a transport event to the QP's CQs.
fn deliver(qps: &[QpSlot], ev: Event) {
    match ev {
        Event::SendCompletion(c) | Event::RecvCompletion(c) => {
            let Some(qp) = qps.get(usize::from(c.stream.0)).and_then(|s| s.qp.as_ref()) else {
                return;
            };
            let recv = matches!(ev, Event::RecvCompletion(_));
            let cqe = Cqe {
                wr_id: c.wr_id,
                status: wc_status(c.status),
                opcode: wc_opcode(c.opcode),
                byte_len: c.byte_len,
                imm_data: c.imm.unwrap_or(0),
                // A kernel consumer's CQ takes the kernel's flags, a user's libibverbs'.
                wc_flags: match (c.imm, c.invalidated, qp.kernel.is_some()) {
                    (Some(_), true, false) => WC_WITH_INV,
                    (Some(_), true, true) => kernel_wc_flags::WITH_INVALIDATE,
                    (Some(_), false, _) => WC_WITH_IMM,
                    (None, _, _) => 0,
                },
                qp_num: qp.qpn,
                src_qp: c.src_qp,
                ..Default::default()
            };
            if recv {
                qp.complete_recv(&cqe, c.solicited);
            } else {
                qp.complete_send(&cqe);
            }
        }
        Event::StreamError { stream, .. } => {
            if let Some(qp) = qps.get(usize::from(stream.0)).and_then(|s| s.qp.as_ref()) {
                qp.set_error();
            }
        }
        Event::SendQueueRoom(_) => {}
    }
}

/// The verbs local ACK timeout (4.096 us x 2^code; 0 means infinite) in nanoseconds, at
/// least 250 ms: a software device on a loaded (or emulated) host must not exhaust retries
/// on scheduling delays, and path timeouts recover lost packets long before this anyway.
fn ack_timeout_ns(code: u8) -> u64 {
    if code == 0 {
        return u64::MAX / 4;
    }
    (4096u64 << code.min(31)).max(250_000_000)
}

/// The IB RNR timer code (5 bits) in microseconds.
fn rnr_timer_us(code: u8) -> u32 {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    US.get(usize::from(code & 31)).copied().unwrap_or(655_360)
}
