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
        memory::{for_each_piece, Access, AccessError, AtomicOp, Memory, SgList, Sge},
        stream::{self, CqOpcode, CqStatus, Stream, StreamConfig, StreamId, WrOpcode},
        wire::{Packet, DEFAULT_PEER_PATHS, MAX_HEADER_LEN},
        zero::{zero_valid, ZeroValid},
    },
    verbs::{self, Cqe, Qp, QpAttrs, QpState, SendWqe, Verbs},
    verbs_core::{
        ib::{access, kernel_wc_flags, wc_opcode, wc_status, QpType, WC_WITH_IMM, WC_WITH_INV},
        lists::{ListRef, Queue},
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
mod completions;
mod datagrams;
mod feed;
mod mcast;
mod mem;
mod peers;
mod planes;
mod ud;

use completions::deliver;
use feed::sges;
use mem::Mem;

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
/// packets at tail-drop queues they let some paths starve, so a path with any loss
/// (`LOSSY_RUN_RATE`) and any CE mark (`MARKED_RUN_RATE`) in its estimate sends runs of
/// [`LOSSY_PATH_BURST`] (`docs/datapath.md`).
const PATH_BURST: u8 = 16;
/// Runs on a path with any loss and any ECN mark in its estimate.
const LOSSY_PATH_BURST: u8 = 4;
/// The loss rate over which a path's runs are `LOSSY_PATH_BURST` long (`Config::lossy_run_rate`):
/// any.
const LOSSY_RUN_RATE: u16 = 0;
/// ... if its queues mark packets CE (`Config::marked_run_rate`): any mark still in the path's
/// estimate. A path that loses without marks (random loss) keeps its long runs.
const MARKED_RUN_RATE: u16 = 1;
/// Datagrams queued between softirq and the receive thread, each in the skb it arrived in:
/// a few milliseconds of a busy receiver.
const RX_ENTRIES: usize = 1024;
/// How long a burst's datagrams may wait for a last one that does not come (see
/// `Engine::receive`).
const RX_FLUSH_NS: u64 = 1_000_000;
/// Datagrams of one peer processed before its connection transmits (ACKs, responses).
const RX_BATCH: usize = 32;
/// Datagrams queued beyond this many arrive marked busy (see `Engine::receive`).
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
        // A long one marks it busy (`Arrival::rx_busy`), as a switch queue past its ECN
        // threshold would mark it CE: the senders' windows shrink before our queue adds
        // delay that fires their retransmission timers (with 7 senders into one receiver,
        // its 1,024 entries took tens of milliseconds to drain under emulation, and paths
        // failed). Apart from CE, because our queue is long whenever we are CPU-bound, on
        // every path alike: it says nothing about the paths.
        let (pushed, first) = {
            let mut q = self.rxq.lock();
            let first = q.len() == 0;
            let arrival = Arrival {
                rx_busy: q.len() >= RX_MARK,
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
        cfg.marked_run_rate = MARKED_RUN_RATE;
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
                inner.lists.clear();
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
