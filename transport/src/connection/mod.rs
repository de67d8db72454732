// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A connection between two devices: its paths below, its streams above.
//!
//! Sans-IO, in the manner of quinn-proto: the caller feeds datagrams
//! ([`Connection::handle_packet`]) and timer expiries ([`Connection::handle_timeout`]) in, and
//! takes datagrams ([`Connection::poll_transmit`]), the next timer deadline
//! ([`Connection::poll_timeout`]) and completions ([`Connection::poll_event`]) out. Memory is
//! reached only through the caller's [`Memory`] implementation.
//!
//! - `path`: a path's state, window and timers; `sack`: the receiver's per-path SACK window and
//!   per-message segment windows; `retransmit`: the sender's in-flight table and loss
//!   detection; `rtt`: the RTT estimator; `timer`: the timers the caller arms; `streams`:
//!   where the streams live (caller storage, [`StreamSlots`]) and the index and lists that
//!   find the ones needing attention without scanning the rest.

pub mod path;
pub mod retransmit;
pub mod rtt;
pub mod sack;
pub mod streams;
pub mod timer;

use super::congestion::{
    CcConfig, CcStats, ConnCc, Grant, RateAllocator, SenderSlot, PACKET_OVERHEAD,
};
use super::memory::{Memory, QpMem};
use super::rng::XorShift;
use super::stream::requester::{RequesterStats, RespVerdict};
use super::stream::responder::{ResponderStats, ResponseKind, Verdict};
use super::stream::{
    CqStatus, Cqe, PostError, RecvWqe, SendWqe, Stream, StreamConfig, StreamId, WrOpcode,
};
use super::wire::{
    AckHeader, AckWriter, AtomicExt, BaseHeader, DataExt, Ext, Flags, Header, NakCode, NakExt,
    Opcode, Packet, ParseError, ReadReqExt, SendExt, WriteExt, MAX_HEADER_LEN, PATH_ACK_LEN,
    STREAM_ACK_LEN,
};
use super::zero::{zero_valid, ZeroValid};
use path::{Path, PathConfig, PathState, PathStats};
use retransmit::{ItemKind, Outcome, SentItem};
use streams::{Sched, ACK, EVENT, FREE, TIMER, WORK};
pub use streams::{StreamSlots, MAX_STREAMS};
use timer::{Earliest, Timer};

/// The default loss rate (of 65536) over which a path's runs are `Config::lossy_path_burst`
/// long (`Config::lossy_run_rate`): 1%.
pub const LOSSY_RUN_RATE: u16 = 655;

/// Connection settings. Both ends must agree on `mtu`, `initial_psn` and the path count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Our connection id (arriving packets carry it).
    pub local_conn_id: u32,
    /// The peer's connection id (our packets carry it).
    pub remote_conn_id: u32,
    /// Paths in use (at most the connection's path storage holds).
    pub num_paths: u16,
    /// Planes the paths are spread over (path i is on plane i % planes).
    pub planes: u8,
    /// Payload bytes per packet.
    pub mtu: u32,
    /// Packets in a row on one path while it has window room (1: every packet picked
    /// afresh). Longer runs let a caller hand a path's consecutive datagrams to its network
    /// stack as one (UDP GSO); the shares over time are the same (each packet is charged to
    /// the spraying credits as if picked alone).
    pub path_burst: u8,
    /// Runs on a path that loses packets (loss rate over `lossy_run_rate`): at most this
    /// many. A run that reaches a full tail-drop queue loses several packets at once, and
    /// the path's weight falls with them: short runs there keep the spraying even (TSO
    /// sizing that backs off under loss, as it were), long ones where nothing is lost.
    pub lossy_path_burst: u8,
    /// The loss rate (of 65536, see [`path::Path::loss_rate`]) over which a path's runs are
    /// `lossy_path_burst` long ([`LOSSY_RUN_RATE`]: 1%; 0: any loss still in the path's
    /// estimate).
    pub lossy_run_rate: u16,
    /// Data packets a stream sends in a row before the next stream with work takes its turn
    /// (deficit round-robin by packets; 1: every packet). A whole message or a few go out
    /// together, so messages complete one after the other rather than all at the end, as
    /// with per-packet turns among thousands of QPs.
    pub stream_quantum: u16,
    /// Tuning shared by all paths.
    pub path: PathConfig,
    /// ACK after this many packets even without ACK_REQ.
    pub ack_every: u16,
    /// Completion timeout of a stream: time without progress after which an unfinished
    /// message is resent (a retry), in ns.
    pub stall_timeout: u64,
    /// PRNG seed (entropy for UDP source ports).
    pub seed: u64,
    /// Congestion control (connection window, pacing; `docs/congestion.md`).
    pub cc: CcConfig,
}
zero_valid!(struct Config {
    local_conn_id, remote_conn_id, num_paths, planes, mtu, path_burst, lossy_path_burst,
    lossy_run_rate, stream_quantum, path, ack_every, stall_timeout, seed, cc,
});

impl Config {
    /// Defaults for a data-centre fabric: 32 paths, 4 KiB MTU, RTO 200 us .. 100 ms.
    pub fn new(local_conn_id: u32, remote_conn_id: u32) -> Self {
        Config {
            local_conn_id,
            remote_conn_id,
            num_paths: 32,
            planes: 1,
            mtu: 4096,
            path_burst: 1,
            lossy_path_burst: 1,
            lossy_run_rate: LOSSY_RUN_RATE,
            stream_quantum: 16,
            path: PathConfig {
                initial_psn: 0,
                initial_cwnd: 16,
                max_cwnd: 256,
                initial_rto: 1_000_000,
                min_rto: 200_000,
                max_rto: 100_000_000,
                ack_delay: 10_000,
                fail_after: 3,
                min_reorder_window: 10_000,
            },
            ack_every: 8,
            stall_timeout: 5_000_000,
            seed: 1,
            cc: CcConfig::new(),
        }
    }
}

/// Why a configuration or stream was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// `num_paths` is 0 or larger than the path storage.
    PathCount,
    /// `mtu` is 0 or too large for a packet length.
    Mtu,
    /// No free stream slot.
    NoStreamSlot,
    /// A stream with this local QP number is already open.
    DuplicateQp,
    /// `min_rto` or `stall_timeout` below 1 us, or `max_rto` below `min_rto`.
    Timers,
}

/// Smallest RTO and completion timeout accepted, in ns.
pub const MIN_TIMEOUT: u64 = 1_000;

/// What the network layer knows of an arriving datagram besides its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arrival {
    /// The IP header was CE-marked.
    pub ecn_ce: bool,
    /// The UDP source port: the sender's entropy for the packet's path. The ACKs and NAKs
    /// that travel on that path go back with it (`docs/wire-format.md`, "Encapsulation").
    pub src_port: u16,
}

/// Why an arriving datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// Not a valid MetaRoCE v1 packet.
    Parse(ParseError),
    /// Addressed to another connection id.
    WrongConnection,
    /// Path id beyond this connection's paths.
    UnknownPath,
    /// Destination QP is not an open stream.
    UnknownStream,
    /// The PSN is more than [`sack::RECV_WINDOW`] beyond its path's cumulative PSN: no
    /// conforming peer sends one (it is forged, or corrupt), so it was dropped unseen.
    OutOfWindow,
    /// A device-level packet (HELLO, DATAGRAM): the caller's to handle, not the connection's.
    DeviceLevel,
}

/// A datagram ready in the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes written at the start of the buffer.
    pub len: usize,
    /// Path index (= path id).
    pub path: u16,
    /// Plane (netdev) to send it on.
    pub plane: u8,
    /// UDP source port: the path's entropy.
    pub src_port: u16,
    /// Send ECN-capable (ECT(0)).
    pub ecn_capable: bool,
}

/// Something for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Completion of a send WQE.
    SendCompletion(Cqe),
    /// Completion of a receive WQE.
    RecvCompletion(Cqe),
    /// The stream's send queue has room again after a `post_send` was refused with
    /// `QueueFull` (its WQEs may have completed without completions: unsignaled): the caller
    /// can post what it held back.
    SendQueueRoom(StreamId),
    /// The stream (QP) went to the error state; its outstanding WQEs are being flushed.
    StreamError {
        /// The stream.
        stream: StreamId,
        /// The error that moved it (also the status of the failed WQE).
        status: CqStatus,
    },
}

/// Connection-wide counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Datagrams handed to `handle_packet`.
    pub packets_in: u64,
    /// Datagrams produced by `poll_transmit`.
    pub packets_out: u64,
    /// Datagrams rejected by the parser.
    pub parse_errors: u64,
    /// Datagrams dropped for another reason (connection id, path, QP, no room to track, PSN
    /// out of window).
    pub dropped_in: u64,
    /// Of those, sequenced packets whose PSN was more than [`sack::RECV_WINDOW`] beyond their
    /// path's cumulative PSN (all paths; per path in [`PathStats::out_of_window`]). A
    /// conforming peer sends none: a count here means forged (off-path injection) or corrupt
    /// packets.
    pub out_of_window_psn: u64,
    /// Data-bearing packets sent (requests and responses).
    pub data_packets_out: u64,
    /// Of those, retransmissions.
    pub retransmits: u64,
    /// ACKs sent.
    pub acks_out: u64,
    /// ACKs received.
    pub acks_in: u64,
    /// NAKs sent.
    pub naks_out: u64,
    /// NAKs received.
    pub naks_in: u64,
    /// NAKs sent, by code (index: the wire code, `NakCode as usize`; 0 unused).
    pub naks_out_by_code: [u64; 6],
    /// NAKs received, by code (as `naks_out_by_code`).
    pub naks_in_by_code: [u64; 6],
    /// NAKs not sent because the NAK queue was full.
    pub naks_dropped: u64,
    /// Probes sent (tail-loss and path probes).
    pub probes_out: u64,
    /// Path retransmission timeouts, all paths.
    pub timeouts: u64,
    /// Duplicate request packets received, all streams (already placed or completed).
    pub duplicates: u64,
    /// RNR NAKs received, all streams.
    pub rnr_naks_in: u64,
}
zero_valid!(struct ConnStats {
    packets_in, packets_out, parse_errors, dropped_in, out_of_window_psn, data_packets_out,
    retransmits, acks_out, acks_in, naks_out, naks_in, naks_out_by_code, naks_in_by_code,
    naks_dropped, probes_out, timeouts, duplicates, rnr_naks_in,
});

#[derive(Clone, Copy, Debug, Default)]
struct PendingNak {
    /// The requester's QP (the NAK's destination) and ours.
    dst_qp: u32,
    src_qp: u32,
    msn: u32,
    /// NAK code as on the wire (0 = none).
    code: u8,
    value: u32,
}
zero_valid!(struct PendingNak { dst_qp, src_qp, msn, code, value });

const NAK_QUEUE: usize = 32;
/// Bound of a path's round-robin credit: a path left out for long (no window) must not hoard
/// credit.
const CREDIT_BOUND: i32 = 1 << 20;
/// Non-dirty streams whose state each ACK repeats.
const EXTRA_STREAM_ACKS: usize = 4;

/// What the scheduler picked to send.
enum Work {
    Request {
        stream: usize,
        msn: u32,
        seg: u32,
        attempt: u16,
        retransmit: bool,
    },
    Response {
        stream: usize,
        msn: u32,
        seg: u32,
        kind: ResponseKind,
        retransmit: bool,
    },
}

impl Work {
    fn stream(&self) -> usize {
        match *self {
            Work::Request { stream, .. } | Work::Response { stream, .. } => stream,
        }
    }
}

/// Where a connection's paths live: `[Path; N]` (see [`Paths`]), or a table the caller sizes
/// at run time to the paths it configures (the kernel allocates exactly those). Its length is
/// the most paths the connection can have.
pub trait PathSlots: AsRef<[Path]> + AsMut<[Path]> {}

impl<T: AsRef<[Path]> + AsMut<[Path]>> PathSlots for T {}

/// A fixed table of `N` paths.
pub type Paths<const N: usize> = [Path; N];

/// One MetaRoCE connection: its paths in `P` (for example [`Paths<32>`], or a table sized at
/// run time) and its streams in `S` (for example `[Stream; N]`, or storage that grows as
/// streams open).
pub struct Connection<P: PathSlots, S: StreamSlots> {
    cfg: Config,
    rng: XorShift,
    num_paths: usize,
    /// Paths we send on (`..send_paths`): what the peer accepts, at most `num_paths`
    /// ([`Connection::set_send_paths`]). Everything we send goes on these, ACKs included;
    /// we receive on all `num_paths`.
    send_paths: usize,
    /// The QP index and the lists of streams needing attention.
    sched: Sched,
    naks: [PendingNak; NAK_QUEUE],
    nak_head: usize,
    nak_len: usize,
    ack_now: bool,
    /// The delayed-ACK timer is armed for `ack_at`.
    ack_armed: bool,
    ack_at: u64,
    /// The armed ACK timer is for a tail repeat: one more ACK after the last one that carried
    /// news, in case that one was lost (nothing else would prompt the next).
    ack_repeat: bool,
    /// The grant our ACKs carry: the current one, except that a tail repeat carries the last
    /// one again rather than none (the allocator may no longer count an idle sender as
    /// active).
    ack_grant: Grant,
    unacked: u16,
    rr_ack_path: usize,
    /// When a path last acknowledged one of our packets (0: never): a connection that
    /// delivers is not stalled, whatever a stream waiting for its turn on it sees.
    delivered_at: u64,
    /// The path the last data packet went on, and how many more may follow it there
    /// (`Config::path_burst`).
    burst_path: usize,
    burst_left: u8,
    /// What the last full pick found (`Connection::spray`): the sum of the weights, the best
    /// health, the planes it picked among, and when. While nothing changes the paths after
    /// it (`run_fresh`; at the same time), a run's later packets go on without looking at the
    /// other paths again (`run_rounds` of them so far), and are charged at the next full pick.
    run_total: i32,
    run_health: u16,
    run_mask: u32,
    run_now: u64,
    run_fresh: bool,
    run_rounds: u32,
    /// The last pick of `pick_path`, which `commit_path` charges.
    last_pick: Pick,
    /// The stream whose turn it is, and the data packets its turn has left
    /// (`Config::stream_quantum`).
    turn_stream: usize,
    turn_left: u16,
    /// Planes (bit per plane number) that may carry packets: the caller clears a plane the
    /// peer cannot be reached on (not learned yet, or its netdev down).
    planes_up: u32,
    stats: ConnStats,
    /// Sender side: connection window, pacer, the peer's grant.
    cc: ConnCc,
    /// Receiver side: data arrived since the last `update_allocation`; our registration with
    /// the device's allocator; the grant our ACKs carry.
    rx_packets: u32,
    rx_bytes: u64,
    rx_marked: u32,
    rx_slot: SenderSlot,
    grant: Grant,
    /// Last: the caller's storage.
    paths: P,
    streams: S,
}

// The caller's storage must be `ZeroValid` too: `Paths<N>` and `[Stream; N]` are.
zero_valid!(struct Connection<P: PathSlots, S: StreamSlots> {
    cfg, rng, num_paths, send_paths, sched, naks, nak_head, nak_len, ack_now, ack_armed, ack_at,
    ack_repeat, ack_grant, unacked, rr_ack_path, delivered_at, burst_path, burst_left, run_total,
    run_health, run_mask, run_now, run_fresh, run_rounds, last_pick,
    turn_stream, turn_left, planes_up, stats, cc, rx_packets, rx_bytes, rx_marked, rx_slot, grant,
    paths, streams,
});

impl<const PATHS: usize, const N: usize> Connection<Paths<PATHS>, [Stream; N]> {
    /// A connection configured with `cfg`, with room for `PATHS` paths and `N` streams. It is
    /// large (tens to hundreds of KiB, depending on `PATHS` and `N`): in the kernel,
    /// zero-allocate and use [`Connection::reset`].
    pub fn new(cfg: Config) -> Result<Self, ConfigError> {
        Self::with_streams(cfg, core::array::from_fn(|_| Stream::closed()))
    }
}

impl<const PATHS: usize, S: StreamSlots> Connection<Paths<PATHS>, S> {
    /// A connection configured with `cfg`, its streams in `streams` (all closed).
    pub fn with_streams(cfg: Config, streams: S) -> Result<Self, ConfigError> {
        let mut rng = XorShift::new(cfg.seed);
        let planes = cfg.planes.max(1);
        let paths = core::array::from_fn(|i| {
            let id = i as u16;
            let plane = (i % usize::from(planes)) as u8;
            Path::new(id, plane, &cfg.path, &mut rng)
        });
        Self::with_storage(cfg, paths, streams)
    }
}

impl<P: PathSlots, S: StreamSlots> Connection<P, S> {
    /// A connection configured with `cfg`, its paths in `paths` (at least `cfg.num_paths`
    /// of them; reset here) and its streams in `streams` (all closed).
    pub fn with_storage(cfg: Config, mut paths: P, streams: S) -> Result<Self, ConfigError> {
        let num_paths = Self::check(&cfg, paths.as_ref().len())?;
        let mut rng = XorShift::new(cfg.seed);
        let planes = usize::from(cfg.planes.max(1));
        for (i, p) in paths.as_mut().iter_mut().take(num_paths).enumerate() {
            p.reset(i as u16, (i % planes) as u8, &cfg.path, &mut rng);
        }
        Ok(Connection {
            cfg,
            rng,
            paths,
            num_paths,
            send_paths: num_paths,
            sched: Sched::default(),
            streams,
            naks: [PendingNak::default(); NAK_QUEUE],
            nak_head: 0,
            nak_len: 0,
            ack_now: false,
            ack_armed: false,
            ack_at: 0,
            ack_repeat: false,
            ack_grant: Grant::default(),
            unacked: 0,
            rr_ack_path: 0,
            delivered_at: 0,
            burst_path: 0,
            burst_left: 0,
            run_total: 0,
            run_health: 0,
            run_mask: 0,
            run_now: 0,
            run_fresh: false,
            run_rounds: 0,
            last_pick: Pick::NONE,
            turn_stream: 0,
            turn_left: 0,
            planes_up: u32::MAX,
            stats: ConnStats::default(),
            cc: new_cc(&cfg, num_paths),
            rx_packets: 0,
            rx_bytes: 0,
            rx_marked: 0,
            rx_slot: SenderSlot::default(),
            grant: Grant::default(),
        })
    }

    /// Re-initialises this connection in place with `cfg`, as [`Connection::new`] would, but
    /// without building a whole connection on the stack. A connection is
    /// [`ZeroValid`] where its storage is (checked field by field
    /// down to the primitives), so a caller can allocate a zeroed connection and call this:
    /// how the kernel, with its small stacks, makes one. Every stream in the storage is
    /// closed.
    pub fn reset(&mut self, cfg: Config) -> Result<(), ConfigError> {
        let num_paths = Self::check(&cfg, self.paths.as_ref().len())?;
        self.cfg = cfg;
        self.rng = XorShift::new(cfg.seed);
        let planes = usize::from(cfg.planes.max(1));
        // Only the paths in use: the others are never touched (a zeroed connection's pages
        // for them stay untouched).
        for (i, p) in self.paths.as_mut().iter_mut().take(num_paths).enumerate() {
            p.reset(i as u16, (i % planes) as u8, &cfg.path, &mut self.rng);
        }
        self.num_paths = num_paths;
        self.send_paths = num_paths;
        for i in 0..self.streams.slot_count() {
            if let Some(s) = self.streams.slot_mut(i) {
                s.reset(None);
                s.links = streams::Links::default();
            }
        }
        self.sched = Sched::default();
        for n in self.naks.iter_mut() {
            *n = PendingNak::default();
        }
        self.nak_head = 0;
        self.nak_len = 0;
        self.ack_now = false;
        self.ack_armed = false;
        self.ack_at = 0;
        self.ack_repeat = false;
        self.ack_grant = Grant::default();
        self.unacked = 0;
        self.rr_ack_path = 0;
        self.delivered_at = 0;
        self.burst_path = 0;
        self.burst_left = 0;
        self.run_total = 0;
        self.run_health = 0;
        self.run_mask = 0;
        self.run_now = 0;
        self.run_fresh = false;
        self.run_rounds = 0;
        self.last_pick = Pick::NONE;
        self.turn_stream = 0;
        self.turn_left = 0;
        self.planes_up = u32::MAX;
        self.stats = ConnStats::default();
        self.cc = new_cc(&cfg, num_paths);
        self.rx_packets = 0;
        self.rx_bytes = 0;
        self.rx_marked = 0;
        self.rx_slot = SenderSlot::default();
        self.grant = Grant::default();
        Ok(())
    }

    /// [`Connection::reset`] with new path storage (a caller that sizes its path table at
    /// run time swaps it in here; the old one is dropped).
    pub fn reset_with_paths(&mut self, cfg: Config, paths: P) -> Result<(), ConfigError> {
        Self::check(&cfg, paths.as_ref().len())?;
        self.paths = paths;
        self.reset(cfg)
    }

    fn check(cfg: &Config, capacity: usize) -> Result<usize, ConfigError> {
        let num_paths = usize::from(cfg.num_paths);
        if num_paths == 0 || num_paths > capacity {
            return Err(ConfigError::PathCount);
        }
        if cfg.mtu == 0 || cfg.mtu > 65_000 {
            return Err(ConfigError::Mtu);
        }
        // Zero timeouts would make timers due again the moment they fire.
        let t = &cfg.path;
        if t.min_rto < MIN_TIMEOUT || t.max_rto < t.min_rto || cfg.stall_timeout < MIN_TIMEOUT {
            return Err(ConfigError::Timers);
        }
        Ok(num_paths)
    }

    fn ack_deadline(&self) -> Option<u64> {
        self.ack_armed.then_some(self.ack_at)
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Sets the peer's connection id (what every packet sent from now on carries in
    /// `conn_id`), once the caller has learned it (the driver: from a HELLO that proved it).
    pub fn set_remote_conn_id(&mut self, id: u32) {
        self.cfg.remote_conn_id = id;
    }

    /// The peer's connection to us is a new one (its device was created again, or it freed
    /// its connection and made another, with a new id): its PSN spaces start from
    /// `initial_psn`, so every path's do too, in both directions. What was in flight is
    /// resent as new packets (the streams keep their messages; the responder deduplicates
    /// by placement), and streams whose QP the peer no longer has are answered with NAKs.
    pub fn restart_paths(&mut self, now: u64) {
        self.paths_changed();
        let stall = self.cfg.stall_timeout;
        let path_cfg = self.cfg.path;
        let (paths, streams, sched) = (self.paths.as_mut(), &mut self.streams, &mut self.sched);
        for p in paths.iter_mut().take(self.num_paths) {
            p.inflight
                .on_timeout(|item, outcome, _| resolve(streams, sched, stall, now, item, outcome));
            p.restart_psns(&path_cfg);
        }
        self.ack_now = false;
        self.ack_armed = false;
    }

    /// Connection-wide counters.
    pub fn stats(&self) -> &ConnStats {
        &self.stats
    }

    /// Paths in use.
    pub fn path_count(&self) -> usize {
        self.num_paths
    }

    /// Paths we send on (the first `send_paths()` of them).
    pub fn send_paths(&self) -> usize {
        self.send_paths
    }

    /// Sends only on the first `n` paths (clamped to 1..=[`Connection::path_count`]): the
    /// paths the peer has (it drops packets on paths it does not have), as it told us. All
    /// paths after [`Connection::new`] and [`Connection::reset`]. Growing is always safe;
    /// shrinking leaves what is in flight on the paths given up to their timers, which
    /// recover it on the others (as a plane that goes down).
    pub fn set_send_paths(&mut self, n: usize) {
        self.paths_changed();
        self.send_paths = n.clamp(1, self.num_paths.max(1));
        if self.rr_ack_path >= self.send_paths {
            self.rr_ack_path = 0;
        }
    }

    /// Counters of path `path` (None beyond the paths in use).
    pub fn path_stats(&self, path: usize) -> Option<&PathStats> {
        self.paths
            .as_ref()
            .get(path)
            .filter(|_| path < self.num_paths)
            .map(|p| &p.stats)
    }

    /// State of path `path` (None beyond the paths in use).
    pub fn path_state(&self, path: usize) -> Option<PathState> {
        self.paths
            .as_ref()
            .get(path)
            .filter(|_| path < self.num_paths)
            .map(|p| p.state)
    }

    /// Path `path` itself, read-only (None beyond the paths in use): its RTT estimate,
    /// window, health, UDP source port.
    pub fn path(&self, path: usize) -> Option<&Path> {
        self.paths
            .as_ref()
            .get(path)
            .filter(|_| path < self.num_paths)
    }

    /// Receiver side of congestion control: reports to `alloc`, the allocator of the device
    /// this connection receives on (one per device, shared by every connection into it),
    /// the data (and CE-marked data) that arrived since the last call, and takes the grant the next ACKs carry to
    /// the peer. Call it after feeding arrivals and before `poll_transmit`. A connection
    /// whose caller never calls it sends no grant (its ACKs carry rate 0 and share 0).
    pub fn update_allocation(&mut self, now: u64, alloc: &mut RateAllocator) {
        if self.rx_packets > 0 {
            // Marks drain the grants only when ECN is in use.
            let marked = if self.cfg.cc.ecn { self.rx_marked } else { 0 };
            alloc.note_data(
                now,
                &mut self.rx_slot,
                self.rx_packets,
                self.rx_bytes,
                marked,
            );
            self.rx_packets = 0;
            self.rx_bytes = 0;
            self.rx_marked = 0;
        }
        self.grant = alloc.grant(now, &self.rx_slot);
    }

    /// The grant our ACKs carry to the peer (receiver side).
    pub fn grant_out(&self) -> Grant {
        self.grant
    }

    /// Sender side of congestion control: the peer's latest grant, the pacing rate, the
    /// connection window and counters.
    pub fn congestion(&self) -> &ConnCc {
        &self.cc
    }

    /// Congestion-control counters (sender side).
    pub fn cc_stats(&self) -> &CcStats {
        &self.cc.stats
    }

    /// Opens a stream (QP) on this connection, growing the stream storage if it is full and
    /// can grow.
    pub fn open_stream(&mut self, cfg: StreamConfig) -> Result<StreamId, ConfigError> {
        let (sched, slots) = (&mut self.sched, &mut self.streams);
        sched.adopt(slots);
        if sched.lookup(slots, cfg.local_qp).is_some() {
            return Err(ConfigError::DuplicateQp);
        }
        if sched.len(FREE) == 0 && sched.known() < MAX_STREAMS && slots.grow() {
            sched.adopt(slots);
        }
        // Slots on the free list are closed; the check only guards against misuse.
        let i = loop {
            let i = sched.pop(slots, FREE).ok_or(ConfigError::NoStreamSlot)?;
            if slots.slot(i).is_some_and(|s| !s.open) {
                break i;
            }
        };
        let s = slots.slot_mut(i).ok_or(ConfigError::NoStreamSlot)?;
        s.reset(Some(cfg));
        sched.index_insert(slots, i);
        Ok(StreamId(i as u16))
    }

    /// Closes a stream; everything outstanding on it is dropped without completions.
    pub fn close_stream(&mut self, id: StreamId) {
        let i = usize::from(id.0);
        let (sched, slots) = (&mut self.sched, &mut self.streams);
        if !slots.slot(i).is_some_and(|s| s.open) {
            return;
        }
        sched.index_remove(slots, i);
        if let Some(s) = slots.slot_mut(i) {
            s.reset(None);
        }
        sched.push(slots, FREE, i);
    }

    /// Stream slots in use by the connection (open or free for reuse).
    pub fn stream_slots(&self) -> usize {
        self.sched.known()
    }

    /// The stream storage.
    pub fn streams(&self) -> &S {
        &self.streams
    }

    /// With no stream open, lets the storage drop its slots ([`StreamSlots::release`]);
    /// false (nothing done) while a stream is open. The paths keep their state: the peer's
    /// connection continues with the same sequence spaces when a stream opens again.
    pub fn release_streams(&mut self) -> bool {
        let known = self.sched.known();
        if self.sched.len(FREE) != known
            || (0..known).any(|i| self.streams.slot(i).is_some_and(|s| s.open))
        {
            return false;
        }
        self.streams.release();
        self.sched = Sched::default();
        // Whatever slots remain (fixed storage keeps them) are adopted afresh.
        for i in 0..self.streams.slot_count() {
            if let Some(s) = self.streams.slot_mut(i) {
                s.links = streams::Links::default();
            }
        }
        true
    }

    /// Stream `i` changed: look at it for work, events and timers.
    fn touch(&mut self, i: usize) {
        let stall = self.cfg.stall_timeout;
        self.sched.touch(&mut self.streams, i, stall);
    }

    /// Moves a stream (QP) to the error state on the caller's request (`ib_modify_qp` to
    /// ERR): its outstanding send and receive WQEs complete with `WrFlushErr` through
    /// `poll_event`, and its packets are answered with NAKs. No `StreamError` event follows.
    pub fn fail_stream(&mut self, id: StreamId) -> Result<(), PostError> {
        let s = self.open_stream_mut(id)?;
        if s.error().is_none() {
            s.set_error(CqStatus::WrFlushErr);
            s.error_reported = true;
        }
        self.touch(usize::from(id.0));
        Ok(())
    }

    /// Configures the stream's requester: its first MSN, retry limits and completion timeout
    /// (the QP's send PSN, `retry_cnt`, `rnr_retry` and `timeout`, which verbs set at RTS). Possible until the first WQE
    /// is posted: a QP receives in RTR, before its own sending side is configured.
    pub fn start_requester(
        &mut self,
        id: StreamId,
        send_msn: u32,
        retry_cnt: u8,
        rnr_retry: u8,
        ack_timeout: u64,
    ) -> Result<(), PostError> {
        let s = self.open_stream_mut(id)?;
        if s.req.stats.posted != 0 {
            return Err(PostError::InvalidWqe);
        }
        s.cfg.send_msn = send_msn;
        s.cfg.retry_cnt = retry_cnt;
        s.cfg.rnr_retry = rnr_retry;
        s.cfg.ack_timeout = ack_timeout;
        s.req.reset(send_msn);
        self.touch(usize::from(id.0));
        Ok(())
    }

    /// Restricts the stream's packets to `planes` (bit `k`: plane `k`; 0: every plane; see
    /// [`StreamConfig::planes`]). Takes effect with the next packet the stream sends.
    pub fn set_stream_planes(&mut self, id: StreamId, planes: u32) -> Result<(), PostError> {
        self.open_stream_mut(id)?.cfg.planes = planes;
        Ok(())
    }

    /// Requester and responder counters of a stream.
    pub fn stream_stats(&self, id: StreamId) -> Option<(RequesterStats, ResponderStats)> {
        self.streams
            .slot(usize::from(id.0))
            .filter(|s| s.open)
            .map(|s| (s.req.stats, s.resp.stats))
    }

    /// The stream's error state, if any.
    pub fn stream_error(&self, id: StreamId) -> Option<CqStatus> {
        self.streams
            .slot(usize::from(id.0))
            .filter(|s| s.open)
            .and_then(|s| s.error())
    }

    fn open_stream_mut(&mut self, id: StreamId) -> Result<&mut Stream, PostError> {
        match self.streams.slot_mut(usize::from(id.0)) {
            Some(s) if s.open => Ok(s),
            _ => Err(PostError::NoSuchStream),
        }
    }

    /// Posts a send WQE. On a stream in error it is accepted and flushed.
    pub fn post_send(&mut self, now: u64, id: StreamId, wqe: SendWqe) -> Result<(), PostError> {
        let mtu = self.cfg.mtu;
        let s = self.open_stream_mut(id)?;
        let failed = s.error().is_some();
        if let Err(e) = s.req.post(wqe, mtu, now, failed) {
            if e == PostError::QueueFull {
                s.sq_refused = true;
            }
            return Err(e);
        }
        self.touch(usize::from(id.0));
        Ok(())
    }

    /// Asks for a [`Event::SendQueueRoom`] once the stream's send queue has room, as a
    /// refused `post_send` does: for a caller that holds a WQE back for a reason of its own
    /// (the kernel: no room for its inline payload until WQEs complete).
    pub fn want_send_room(&mut self, id: StreamId) {
        if let Ok(s) = self.open_stream_mut(id) {
            s.sq_refused = true;
        }
    }

    /// Asks for a [`Event::SendQueueRoom`] once every send WQE the stream holds has completed:
    /// for a caller whose next WQE is an operation of its own that completes in order with
    /// the others but sends nothing (the kernel: a memory window bind, a local invalidate).
    pub fn want_send_drained(&mut self, id: StreamId) {
        if let Ok(s) = self.open_stream_mut(id) {
            s.sq_refused = true;
            s.sq_drain = true;
        }
    }

    /// Send WQEs the stream holds that have not completed (0 for a stream not open).
    pub fn send_outstanding(&self, id: StreamId) -> u32 {
        self.streams
            .slot(usize::from(id.0))
            .filter(|s| s.open)
            .map_or(0, |s| s.req.outstanding())
    }

    /// Posts a receive WQE.
    pub fn post_recv(&mut self, id: StreamId, wqe: RecvWqe) -> Result<(), PostError> {
        let s = self.open_stream_mut(id)?;
        s.resp.post_recv(wqe)?;
        if s.error().is_some() {
            // Flushed at once: an event.
            self.touch(usize::from(id.0));
        }
        Ok(())
    }

    /// The open stream whose local QP is `qp` (O(1): a hash index).
    pub fn stream_by_qp(&self, qp: u32) -> Option<StreamId> {
        self.sched
            .lookup(&self.streams, qp)
            .map(|i| StreamId(i as u16))
    }

    fn stream_index(&self, qp: u32) -> Option<usize> {
        self.sched.lookup(&self.streams, qp)
    }

    // ---------------------------------------------------------------- receiving

    /// Processes one arriving datagram.
    pub fn handle_packet(
        &mut self,
        now: u64,
        data: &[u8],
        arrival: Arrival,
        mem: &mut impl Memory,
    ) -> Result<(), RecvError> {
        self.paths_changed();
        self.stats.packets_in += 1;
        let view = match Packet::parse(data) {
            Ok(v) => v,
            Err(e) => {
                self.stats.parse_errors += 1;
                return Err(RecvError::Parse(e));
            }
        };
        let b = view.header.base;
        // HELLO and DATAGRAM are the device's (HELLO is how connection ids are learned).
        if matches!(view.header.ext, Ext::Hello(_) | Ext::Datagram(_)) {
            return Err(RecvError::DeviceLevel);
        }
        if b.conn_id != self.cfg.local_conn_id {
            self.stats.dropped_in += 1;
            return Err(RecvError::WrongConnection);
        }
        match view.header.ext {
            Ext::Ack(h) => {
                self.stats.acks_in += 1;
                let stall = self.cfg.stall_timeout;
                let (paths, streams, sched) =
                    (self.paths.as_mut(), &mut self.streams, &mut self.sched);
                let mut cc = CcSample::default();
                let mut reorder_extent = 0;
                // The stream whose packets the ACK resolved last, touched once for its run of
                // them (an ACK's entries mostly resolve runs of one stream's packets).
                let mut touched: Option<usize> = None;
                for pa in view.ack_paths() {
                    let i = usize::from(pa.path_id);
                    if i >= self.num_paths {
                        continue;
                    }
                    let mut pa = pa;
                    if !self.cfg.cc.ecn {
                        pa.ecn_ce = 0;
                    }
                    if let Some(p) = paths.get_mut(i) {
                        let sum = p.on_ack(now, &pa, |item, outcome, _| {
                            let Some(i) = apply_outcome(streams, now, item, outcome) else {
                                return;
                            };
                            if let Some(j) = touched.replace(i).filter(|&j| j != i) {
                                sched.touch(streams, j, stall);
                            }
                        });
                        cc.add(sum.acked, pa.ecn_ce, p.rtt.srtt());
                        reorder_extent = reorder_extent.max(sum.reorder_extent);
                    }
                }
                if let Some(j) = touched {
                    sched.touch(streams, j, stall);
                }
                if reorder_extent > 0 {
                    // Reordering within one path is the fabric's doing (a reordering link):
                    // every path widens its reordering window, before it spuriously
                    // retransmits to learn the same.
                    for p in paths.iter_mut().take(self.num_paths) {
                        p.inflight.learn_reordering(reorder_extent);
                    }
                }
                if cc.acked > 0 {
                    self.delivered_at = now;
                }
                self.cc
                    .on_ack(now, cc.acked, cc.marked, cc.max_srtt, cc.min_srtt);
                self.cc.on_grant(Grant {
                    rate_mbps: h.rate_hint_mbps,
                    share: h.share,
                });
                for sa in view.ack_streams() {
                    let Some(i) = sched.lookup(streams, sa.qp) else {
                        continue;
                    };
                    if let Some(s) = streams.slot_mut(i) {
                        s.req.on_stream_ack(now, sa.completed_msn);
                    }
                    sched.touch(streams, i, stall);
                }
                Ok(())
            }
            Ext::Nak(n) => {
                self.stats.naks_in += 1;
                if let Some(c) = self.stats.naks_in_by_code.get_mut(n.code as usize) {
                    *c += 1;
                }
                let i = self
                    .stream_index(b.dst_qp)
                    .ok_or(RecvError::UnknownStream)?;
                if let Some(s) = self.streams.slot_mut(i) {
                    let rnr_retry = s.cfg.rnr_retry;
                    let before = s.req.stats.rnr_naks;
                    s.req.on_nak(now, b.msn, n.code, n.value, rnr_retry);
                    self.stats.rnr_naks_in += s.req.stats.rnr_naks.wrapping_sub(before);
                }
                self.touch(i);
                Ok(())
            }
            Ext::Hello(_) | Ext::Datagram(_) => Err(RecvError::DeviceLevel),
            _ => self.handle_sequenced(now, &view, data.len(), arrival, mem),
        }
    }

    fn handle_sequenced(
        &mut self,
        now: u64,
        view: &super::wire::PacketView<'_>,
        len: usize,
        arrival: Arrival,
        mem: &mut impl Memory,
    ) -> Result<(), RecvError> {
        let b = view.header.base;
        let ecn_ce = arrival.ecn_ce;
        let pi = usize::from(b.path_id);
        if pi >= self.num_paths {
            self.stats.dropped_in += 1;
            return Err(RecvError::UnknownPath);
        }
        // First of all: a PSN beyond the path's receive window is no peer's, and dropped
        // before anything sees it, so a spoofed packet cannot slide the window past the real
        // ones, place data, elicit an ACK or touch the path's state.
        if self
            .paths
            .as_mut()
            .get_mut(pi)
            .is_some_and(|p| !p.check_window(b.psn))
        {
            self.stats.out_of_window_psn += 1;
            self.stats.dropped_in += 1;
            return Err(RecvError::OutOfWindow);
        }
        let mtu = self.cfg.mtu;
        let verdict = if let Ext::Probe = view.header.ext {
            Verdict::Accept
        } else {
            let Some(si) = self.stream_index(b.dst_qp) else {
                // No such QP (closed, or never opened). Acknowledge the packet on its path so
                // the sender does not resend it as lost, and NAK requests so it fails fast.
                self.stats.dropped_in += 1;
                if let Some(p) = self.paths.as_mut().get_mut(pi) {
                    p.on_receive(now, b.psn, b.timestamp, arrival);
                }
                self.ack_now = true;
                if !matches!(
                    view.header.ext,
                    Ext::ReadResponse(_) | Ext::AtomicResponse(_)
                ) {
                    self.queue_nak(b.src_qp, b.dst_qp, b.msn, NakCode::RemoteOperational, 0);
                }
                return Err(RecvError::UnknownStream);
            };
            let Some(s) = self.streams.slot_mut(si) else {
                return Err(RecvError::UnknownStream);
            };
            let dups_before = s.resp.stats.duplicates;
            let rnr_us = s.cfg.rnr_timer_us;
            let solicited = b.flags.has(Flags::SOLICITED);
            if s.cfg.srq && s.error().is_none() {
                // A QP on a shared receive queue takes the WQEs a message needs as it arrives.
                let rsn = match view.header.ext {
                    Ext::Send(x) => Some(x.rsn),
                    Ext::Write(x) if b.opcode == Opcode::RdmaWriteWithImm => Some(x.rsn),
                    _ => None,
                };
                if let Some(rsn) = rsn {
                    while s.resp.wants_recv(rsn) {
                        let Some(w) = mem.shared_recv(s.cfg.local_qp) else {
                            break;
                        };
                        // Cannot fail: `wants_recv` saw room.
                        if s.resp.post_recv(w).is_err() {
                            break;
                        }
                    }
                }
            }
            let v = if s.error().is_some() {
                // A QP in error answers requests with a NAK so the peer fails fast: the
                // message that failed it with its own NAK again (that one may have been lost),
                // the others with a remote operational error.
                match (view.header.ext, s.resp.failed()) {
                    (Ext::ReadResponse(_) | Ext::AtomicResponse(_), _) => Verdict::Accept,
                    _ if super::wire::seq_lt(b.msn, s.resp.completed_msn()) => Verdict::Accept,
                    (_, Some(code)) if b.msn == s.resp.completed_msn() => Verdict::Nak(code, 0),
                    _ => Verdict::Nak(NakCode::RemoteOperational, 0),
                }
            } else {
                let mem = &mut QpMem::new(&mut *mem, s.cfg.local_qp);
                match view.header.ext {
                    Ext::Send(x) => s.resp.on_data(
                        b.opcode,
                        b.msn,
                        x.rsn,
                        0,
                        0,
                        x.offset,
                        x.total_len,
                        x.imm,
                        solicited,
                        view.payload,
                        mtu,
                        rnr_us,
                        mem,
                    ),
                    Ext::Write(x) => s.resp.on_data(
                        b.opcode,
                        b.msn,
                        x.rsn,
                        x.va,
                        x.rkey,
                        x.offset,
                        x.total_len,
                        x.imm,
                        solicited,
                        view.payload,
                        mtu,
                        rnr_us,
                        mem,
                    ),
                    Ext::ReadRequest(x) => {
                        s.resp.on_read_request(b.msn, x.va, x.rkey, x.len, mtu, mem)
                    }
                    Ext::Atomic(x) => s
                        .resp
                        .on_atomic(b.msn, x.va, x.rkey, x.compare, x.swap_add, b.opcode, mem),
                    Ext::ReadResponse(x) => match s.req.on_read_response(
                        now,
                        b.msn,
                        x.offset,
                        x.total_len,
                        view.payload,
                        mtu,
                        mem,
                    ) {
                        RespVerdict::Accept => Verdict::Accept,
                        RespVerdict::Drop => Verdict::Drop,
                    },
                    Ext::AtomicResponse(orig) => {
                        s.req.on_atomic_response(now, b.msn, orig, mem);
                        Verdict::Accept
                    }
                    _ => Verdict::Accept,
                }
            };
            if let Some(code) = s.resp.failed() {
                s.set_error(CqStatus::from_nak(code));
            }
            self.stats.duplicates += s.resp.stats.duplicates.wrapping_sub(dups_before);
            let report = !matches!(
                view.header.ext,
                Ext::ReadResponse(_) | Ext::AtomicResponse(_)
            );
            if report {
                s.ack_dirty = true;
                self.sched.push(&mut self.streams, ACK, si);
            }
            self.touch(si);
            match v {
                Verdict::Nak(code, value) => self.queue_nak(b.src_qp, b.dst_qp, b.msn, code, value),
                Verdict::NakMsn(msn, code) => self.queue_nak(b.src_qp, b.dst_qp, msn, code, 0),
                Verdict::Accept | Verdict::Drop => {}
            }
            v
        };
        if verdict == Verdict::Drop {
            self.stats.dropped_in += 1;
            return Ok(());
        }
        if let Some(p) = self.paths.as_mut().get_mut(pi) {
            p.on_receive(now, b.psn, b.timestamp, arrival);
        }
        // Inbound data makes the peer one of the device's active senders.
        if !matches!(view.header.ext, Ext::Probe) {
            self.rx_packets = self.rx_packets.saturating_add(1);
            self.rx_bytes = self
                .rx_bytes
                .saturating_add(len as u64 + u64::from(PACKET_OVERHEAD));
            self.rx_marked = self.rx_marked.saturating_add(u32::from(ecn_ce));
        }
        self.unacked = self.unacked.saturating_add(1);
        if b.flags.has(Flags::ACK_REQ)
            || self.unacked >= self.cfg.ack_every
            || matches!(verdict, Verdict::Nak(..) | Verdict::NakMsn(..))
        {
            self.ack_now = true;
        } else if !self.ack_armed || self.ack_repeat {
            self.ack_armed = true;
            self.ack_repeat = false;
            self.ack_at = now.saturating_add(self.cfg.path.ack_delay);
        }
        Ok(())
    }

    fn queue_nak(&mut self, dst_qp: u32, src_qp: u32, msn: u32, code: NakCode, value: u32) {
        // One pending NAK per message is enough.
        for k in 0..self.nak_len {
            if let Some(n) = self.naks.get((self.nak_head + k) % NAK_QUEUE) {
                if n.dst_qp == dst_qp && n.msn == msn && n.code == code as u8 {
                    return;
                }
            }
        }
        if self.nak_len >= NAK_QUEUE {
            self.stats.naks_dropped += 1;
            return;
        }
        if let Some(n) = self
            .naks
            .get_mut((self.nak_head + self.nak_len) % NAK_QUEUE)
        {
            *n = PendingNak {
                dst_qp,
                src_qp,
                msn,
                code: code as u8,
                value,
            };
            self.nak_len += 1;
        }
    }

    // ---------------------------------------------------------------- timers

    /// The earliest deadline the caller must arm a timer for.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.next_timer().map(|(t, _)| t)
    }

    fn next_timer(&self) -> Option<(u64, Timer)> {
        let mut e = Earliest::new();
        e.offer(self.ack_deadline(), Timer::Ack);
        e.offer(self.cc.deadline(), Timer::Pacing);
        for (i, p) in self.paths.as_ref().iter().take(self.num_paths).enumerate() {
            e.offer(p.deadline(), Timer::Path(i));
        }
        e.offer(
            self.sched.timer_hint(),
            Timer::Stream(self.sched.front(TIMER).unwrap_or(0)),
        );
        // Parked streams count on the connection delivering: when it last did plus their
        // timeout, they go back on the TIMER list.
        e.offer(
            self.sched
                .parked_stall()
                .map(|st| self.delivered_at.saturating_add(st)),
            Timer::Stream(0),
        );
        e.get()
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        self.paths_changed();
        if self.ack_deadline().is_some_and(|d| d <= now) {
            self.ack_now = true;
            self.ack_armed = false;
        }
        self.cc.on_timer(now);
        let stall = self.cfg.stall_timeout;
        let (paths, streams, sched, rng) = (
            self.paths.as_mut(),
            &mut self.streams,
            &mut self.sched,
            &mut self.rng,
        );
        for p in paths.iter_mut().take(self.num_paths) {
            if p.deadline().is_some_and(|d| d <= now) {
                p.on_timer(now, rng, |item, outcome, _| {
                    resolve(streams, sched, stall, now, item, outcome)
                });
            }
        }
        self.stats.timeouts = self.paths.as_ref().iter().map(|p| p.stats.timeouts).sum();
        if let Some(st) = self.sched.parked_stall() {
            if now >= self.delivered_at.saturating_add(st) {
                // Nothing delivered for a whole timeout: the waiting is the peer's silence
                // now, and every stream's timeout counts.
                self.sched.unpark_all(&mut self.streams, stall);
            }
        }
        if self.sched.timer_hint().is_some_and(|d| d <= now) {
            self.stream_timers(now);
        }
    }

    /// Fires the streams' due completion timeouts and RNR back-offs: one pass over the
    /// streams on the TIMER list (those with outstanding work), which leaves on it only those
    /// that still have a deadline and makes the hint exact.
    ///
    /// A stream whose oldest message has not all gone out, on a connection that delivers,
    /// waits for its turn among the connection's streams, and its timeout would only restart
    /// (`Requester::on_timer`): it is parked off the list, so that thousands of streams
    /// waiting their turns are not all visited every timeout (with 4,000 QPs that pass was
    /// the busiest function). It goes back on the list when something happens to it, when
    /// its turn comes (`mark_sent`), or when the connection stops delivering.
    fn stream_timers(&mut self, now: u64) {
        let stall_default = self.cfg.stall_timeout;
        let (streams, sched) = (&mut self.streams, &mut self.sched);
        let mut earliest: Option<u64> = None;
        for _ in 0..sched.len(TIMER) {
            let Some(i) = sched.pop(streams, TIMER) else {
                break;
            };
            let Some(s) = streams.slot_mut(i) else {
                continue;
            };
            if !s.open || s.error().is_some() {
                continue;
            }
            let stall = s.ack_timeout(stall_default);
            if s.req.deadline(stall).is_some_and(|d| d <= now) {
                let retry_cnt = s.cfg.retry_cnt;
                let delivering =
                    self.delivered_at != 0 && now < self.delivered_at.saturating_add(stall);
                if s.req.on_timer(now, stall, retry_cnt, delivering) {
                    s.req.fail_retry_exceeded();
                }
                sched.push(streams, WORK, i);
                sched.push(streams, EVENT, i);
            }
            let Some(s) = streams.slot(i) else { continue };
            if let Some(d) = s.req.deadline(stall) {
                let delivering =
                    self.delivered_at != 0 && now < self.delivered_at.saturating_add(stall);
                if delivering && s.req.waiting_for_turn() {
                    sched.park(streams, i, stall);
                    // It wants to send: on the WORK list it is (or its turn never comes).
                    sched.push(streams, WORK, i);
                    continue;
                }
                earliest = Some(earliest.map_or(d, |e| e.min(d)));
                sched.push(streams, TIMER, i);
            }
        }
        sched.set_timer_hint(earliest);
    }

    // ---------------------------------------------------------------- sending

    /// Writes the next datagram to send into `buf` (at least `mtu` + 68 bytes for data) and
    /// describes it; None when there is nothing to send now.
    pub fn poll_transmit(
        &mut self,
        now: u64,
        buf: &mut [u8],
        mem: &mut impl Memory,
    ) -> Option<Transmit> {
        if self.ack_now || self.ack_deadline().is_some_and(|d| d <= now) {
            if let Some(t) = self.emit_ack(now, buf) {
                return Some(t);
            }
        }
        if let Some(t) = self.emit_nak(now, buf) {
            return Some(t);
        }
        if let Some(t) = self.emit_probe(now, buf) {
            return Some(t);
        }
        if buf.len() < MAX_HEADER_LEN.saturating_add(self.cfg.mtu as usize) {
            return None;
        }
        // Bounded: each failed attempt fails a WQE or a response.
        for _ in 0..8 {
            // No stream has anything to send: no path to pick (`pick_work` would say None).
            self.sched.front(WORK)?;
            let in_flight = self.in_flight();
            if !self.cc.has_room(in_flight) {
                return None;
            }
            // The work first: a stream on the WORK list may have nothing to send after all
            // (it leaves the list then), and a path pick looks at every path.
            let work = self.pick_work(now)?;
            let mut pi = self.pick_path(now, u32::MAX)?;
            let planes = self.streams.slot(work.stream()).map_or(0, |s| s.cfg.planes);
            // A stream restricted to some planes goes on the best of their paths; when none
            // of them has room, other streams go first (it waits for that room), unless none
            // of them is usable at all (then the restriction is set aside).
            let mut mask = u32::MAX;
            if planes != 0 {
                match self.pick_path(now, planes) {
                    Some(i) => (pi, mask) = (i, planes),
                    None if self.planes_usable(planes) => {
                        self.sched.rotate(&mut self.streams, WORK);
                        continue;
                    }
                    None => {}
                }
            }
            if !self.cc.ready(now) {
                // Held by the pacer (`poll_timeout` now includes its deadline); the next
                // call picks the same work again.
                return None;
            }
            self.commit_path(now, mask);
            // Deficit round-robin: the stream goes to the back of the WORK list once its turn
            // has sent `stream_quantum` packets.
            let si = work.stream();
            if si != self.turn_stream || self.turn_left == 0 {
                self.turn_stream = si;
                self.turn_left = self.cfg.stream_quantum.max(1);
            }
            self.turn_left -= 1;
            if self.turn_left == 0 {
                self.sched.rotate(&mut self.streams, WORK);
            }
            if let Some(t) = self.emit_data(now, pi, work, buf, mem) {
                self.cc.on_send(now, t.len);
                return Some(t);
            }
        }
        None
    }

    /// Unresolved packets on all paths.
    fn in_flight(&self) -> u32 {
        self.paths
            .as_ref()
            .iter()
            .take(self.num_paths)
            .map(|p| p.inflight.unresolved())
            .fold(0u32, u32::saturating_add)
    }

    /// Packet spraying: smooth weighted round-robin over the usable (Active or Probing) paths
    /// with window room, each weighted by its score ([`Path::weight`]: recent loss, ECN, RTT
    /// inflation). Equal paths take turns in index order, so the planes (path i is on plane
    /// i % planes) stay evenly loaded; a degraded path gets a smaller share and a smaller
    /// window. Only when no path is usable does data go out on Suspect/Failed paths (so a dead
    /// peer still exhausts the retry count).
    ///
    /// Only paths on the planes in `mask` (bit per plane; `u32::MAX`: all) take part.
    fn pick_path(&mut self, now: u64, mask: u32) -> Option<usize> {
        self.spray(now, false, mask)
    }

    /// Charges the pick [`Connection::pick_path`] made with `mask` to the round-robin
    /// credits, once the packet is sure to leave (nothing changed in between, so the same
    /// path is charged): with the weights the pick found, or, if the last pick was made
    /// with another mask, by spraying again.
    fn commit_path(&mut self, now: u64, mask: u32) {
        let Some((picked_mask, i)) = core::mem::replace(&mut self.last_pick, Pick::NONE).get()
        else {
            self.spray(now, true, mask);
            return;
        };
        if picked_mask != mask {
            self.spray(now, true, mask);
            return;
        }
        // The pick's credits, with the weights of the full pick it was or whose run it went
        // on with: charged at the next full pick (`spray`), which is where they are
        // read.
        self.charge_burst(i);
        self.run_rounds = self.run_rounds.saturating_add(1);
    }

    /// The run of packets on one path (`Config::path_burst`): path `i` takes the next packet.
    fn charge_burst(&mut self, i: usize) {
        if i == self.burst_path && self.burst_left > 0 {
            self.burst_left -= 1;
        } else {
            self.burst_path = i;
            let limit = self.cfg.lossy_run_rate;
            let lossy = self
                .paths
                .as_ref()
                .get(i)
                .is_some_and(|p| p.loss_rate() > limit);
            let run = if lossy {
                self.cfg.path_burst.min(self.cfg.lossy_path_burst)
            } else {
                self.cfg.path_burst
            };
            self.burst_left = run.saturating_sub(1);
        }
    }

    /// Whether a path on the planes in `mask` is usable (Active or Probing, its plane up),
    /// with or without window room.
    fn planes_usable(&self, mask: u32) -> bool {
        let ok = self.planes_up & mask;
        self.paths
            .as_ref()
            .iter()
            .take(self.send_paths)
            .any(|p| plane_bit(p.plane) & ok != 0 && p.usable())
    }

    /// One round of smooth weighted round-robin: every eligible path earns its weight, the
    /// one with the most credit is picked and pays the total. With `commit` false nothing
    /// changes (the credits are only read). Only paths on the planes in `mask` take part.
    fn spray(&mut self, now: u64, commit: bool, mask: u32) -> Option<usize> {
        // A pick that finds no path leaves nothing to charge.
        self.last_pick = Pick::NONE;
        if let Some(i) = self.run_goes_on(now, mask) {
            if commit {
                self.run_rounds = self.run_rounds.saturating_add(1);
                self.charge_burst(i);
            } else {
                self.last_pick = Pick {
                    valid: true,
                    mask,
                    path: i,
                };
            }
            return Some(i);
        }
        // The picks charged since the last full pick (`commit_path`): its path pays their
        // total now, and each path it weighed earns its weight per pick in the pass below,
        // before its new weight is taken.
        let rounds = i32::try_from(core::mem::replace(&mut self.run_rounds, 0)).unwrap_or(i32::MAX);
        if rounds > 0 {
            let total = self.run_total.saturating_mul(rounds);
            if let Some(p) = self.paths.as_mut().get_mut(self.burst_path) {
                p.credit = p.credit.saturating_sub(total);
            }
        }
        let n = self.send_paths;
        let planes_up = self.planes_up & mask;
        let paths = self.paths.as_mut().get_mut(..n)?;
        let up = |p: &Path| plane_bit(p.plane) & planes_up != 0;
        // One pass for the best health and RTT, among the usable paths and among all that
        // are up (those count when none is usable).
        let mut any_usable = false;
        let (mut usable_health, mut usable_srtt) = (0u16, u64::MAX);
        let (mut up_health, mut up_srtt) = (0u16, u64::MAX);
        for p in paths.iter_mut().filter(|p| up(p)) {
            p.age(now);
            let srtt = if p.rtt.has_sample() {
                p.rtt.srtt()
            } else {
                u64::MAX
            };
            up_health = up_health.max(p.health());
            up_srtt = up_srtt.min(srtt);
            if p.usable() {
                any_usable = true;
                usable_health = usable_health.max(p.health());
                usable_srtt = usable_srtt.min(srtt);
            }
        }
        let eligible = |p: &Path| up(p) && (p.usable() || !any_usable);
        let (best_health, best_srtt) = if any_usable {
            (usable_health, usable_srtt)
        } else {
            (up_health, up_srtt)
        };
        let best_srtt = if best_srtt == u64::MAX { 0 } else { best_srtt };
        let mut total: i32 = 0;
        let mut best: Option<usize> = None;
        let mut best_credit = i32::MIN;
        let (burst_path, mut burst_ok) = (self.burst_path, false);
        for (i, p) in paths.iter_mut().enumerate() {
            if rounds > 0 && p.pick_weight != 0 {
                p.credit = p
                    .credit
                    .saturating_add(p.pick_weight.saturating_mul(rounds))
                    .clamp(-CREDIT_BOUND, CREDIT_BOUND);
            }
            p.pick_weight = 0;
            if !eligible(p) || !p.has_window(best_health) {
                continue;
            }
            let w = p.weight(best_srtt, now);
            p.pick_weight = w;
            let credit = p
                .credit
                .saturating_add(w)
                .clamp(-CREDIT_BOUND, CREDIT_BOUND);
            if commit {
                p.credit = credit;
            }
            total = total.saturating_add(w);
            if credit > best_credit {
                best_credit = credit;
                best = Some(i);
            }
            burst_ok |= i == burst_path;
        }
        // A run on the last path goes on while it may (and the path may take it).
        let i = if burst_ok && self.burst_left > 0 {
            burst_path
        } else {
            best?
        };
        (self.run_total, self.run_health, self.run_mask) = (total, best_health, mask);
        (self.run_now, self.run_fresh) = (now, true);
        if commit {
            if let Some(p) = paths.get_mut(i) {
                p.credit = p.credit.saturating_sub(total);
            }
            self.last_pick = Pick::NONE;
            self.charge_burst(i);
        } else {
            self.last_pick = Pick {
                valid: true,
                mask,
                path: i,
            };
        }
        Some(i)
    }

    /// The path of the current run, if its next packet may go there without a full pick:
    /// the run has packets left, the pick is among the same planes, and the path is still
    /// usable, on a plane that is up, with window room (against the best health the run's
    /// full pick found). Else a full pick decides (it also deals with runs on paths that
    /// are only picked because none is usable).
    fn run_goes_on(&self, now: u64, mask: u32) -> Option<usize> {
        if !self.run_fresh
            || now != self.run_now
            || self.burst_left == 0
            || mask != self.run_mask
            || self.burst_path >= self.send_paths
        {
            return None;
        }
        let i = self.burst_path;
        let p = self.paths.as_ref().get(i)?;
        let ok = plane_bit(p.plane) & self.planes_up & mask != 0
            && p.usable()
            && p.pick_weight != 0
            && p.has_window(self.run_health);
        ok.then_some(i)
    }

    /// Something changed the paths (a packet or a timeout came, a probe went, the paths or
    /// planes were changed): the next pick is a full one.
    fn paths_changed(&mut self) {
        self.run_fresh = false;
    }

    /// The first stream on the WORK list with something to send (the caller moves it to the
    /// back when it sends: round-robin); within a stream, responses first, then requests. A
    /// stream found with nothing to send leaves the list (something that gives it work puts
    /// it back).
    fn pick_work(&mut self, now: u64) -> Option<Work> {
        let (streams, sched) = (&mut self.streams, &mut self.sched);
        loop {
            let i = sched.front(WORK)?;
            let Some(s) = streams.slot_mut(i) else {
                sched.pop(streams, WORK);
                continue;
            };
            if !s.open || s.error().is_some() {
                sched.pop(streams, WORK);
                continue;
            }
            if let Some(r) = s.resp.next_segment() {
                return Some(Work::Response {
                    stream: i,
                    msn: r.msn,
                    seg: r.seg,
                    kind: r.kind,
                    retransmit: r.retransmit,
                });
            }
            if let Some(r) = s.req.next_segment(now) {
                return Some(Work::Request {
                    stream: i,
                    msn: r.msn,
                    seg: r.seg,
                    attempt: r.attempt,
                    retransmit: r.retransmit,
                });
            }
            sched.pop(streams, WORK);
        }
    }

    fn transmit(&mut self, path: usize, len: usize, ecn_capable: bool) -> Option<Transmit> {
        let p = self.paths.as_ref().get(path)?;
        self.stats.packets_out += 1;
        Some(Transmit {
            len,
            path: p.id,
            plane: p.plane,
            src_port: p.sport,
            ecn_capable,
        })
    }

    /// As [`Connection::transmit`], for an ACK or NAK on control path `path`: it goes out
    /// with the source port the peer's latest packet on that path came with
    /// ([`Path::reply_port`]), so that the peer's entropy picks both routes of the path's
    /// round trip. A path whose ACKs die on their way back times out at the peer, which
    /// gives it a new source port: that moves its ACKs too. (With our own port, an ACK route
    /// that crosses a dead link stays dead: nothing we send on it is ever acknowledged.)
    fn reply(&mut self, path: usize, len: usize) -> Option<Transmit> {
        let mut t = self.transmit(path, len, false)?;
        if let Some(p) = self.paths.as_ref().get(path) {
            t.src_port = p.reply_port();
        }
        Some(t)
    }

    /// A path for control packets (ACK, NAK): round-robin over Active paths, else any.
    ///
    /// Preferred: Active paths that received a packet lately (within the minimum RTO of the
    /// latest arrival on any path). A plane that delivers nothing to us (cut, or the peer
    /// stopped using it because it failed) most likely drops our ACKs too.
    fn control_path(&mut self) -> usize {
        let n = self.send_paths.max(1);
        let planes_up = self.planes_up;
        let up = |p: &Path| plane_bit(p.plane) & planes_up != 0;
        let paths = self.paths.as_ref().get(..self.send_paths).unwrap_or(&[]);
        let newest = paths.iter().map(|p| p.last_rx).max().unwrap_or(0);
        let fresh_after = newest.saturating_sub(self.cfg.path.min_rto);
        // An Active path on a plane that is up and that received lately; else any Active
        // path on a plane that is up; else any path on a plane that is up.
        for (active_only, fresh) in [(true, true), (true, false), (false, false)] {
            for k in 0..n {
                let i = (self.rr_ack_path + k) % n;
                if paths.get(i).is_some_and(|p| {
                    up(p)
                        && (!active_only || p.state == PathState::Active)
                        && (!fresh || p.last_rx >= fresh_after)
                }) {
                    self.rr_ack_path = (i + 1) % n;
                    return i;
                }
            }
        }
        self.rr_ack_path = (self.rr_ack_path + 1) % n;
        self.rr_ack_path
    }

    /// Lets plane `plane` carry packets, or stops it (its paths are then left alone: their
    /// packets in flight are recovered on the other planes as they time out). All planes are
    /// up after [`Connection::new`] and [`Connection::reset`].
    pub fn set_plane_up(&mut self, plane: u8, up: bool) {
        self.paths_changed();
        if up {
            self.planes_up |= plane_bit(plane);
        } else {
            self.planes_up &= !plane_bit(plane);
        }
    }

    /// Spreads the paths over `planes` planes (path `i` on plane `i mod planes`), as when the
    /// device gains or loses a plane. Safe with packets in flight: a path keeps its sequence
    /// space, window and UDP source port, only its plane changes. 0 is taken as 1.
    pub fn set_planes(&mut self, planes: u8) {
        self.paths_changed();
        let n = usize::from(planes.max(1));
        self.cfg.planes = planes.max(1);
        for (i, p) in self.paths.as_mut().iter_mut().enumerate() {
            p.plane = (i % n) as u8;
        }
    }

    /// Whether plane `plane` may carry packets.
    pub fn plane_up(&self, plane: u8) -> bool {
        self.planes_up & plane_bit(plane) != 0
    }

    fn emit_ack(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        let any_path = self
            .paths
            .as_ref()
            .iter()
            .take(self.num_paths)
            .any(|p| p.recv_pending);
        // Stale entries (closed, or already reported) leave the front of the ACK list.
        while let Some(i) = self.sched.front(ACK) {
            if self.streams.slot(i).is_some_and(|s| s.open && s.ack_dirty) {
                break;
            }
            self.sched.pop(&mut self.streams, ACK);
        }
        let any_stream = self.sched.len(ACK) != 0;
        // The repeat timer fired (through `handle_timeout`, which sets `ack_now`, or found due).
        let repeat =
            self.ack_repeat && (self.ack_now || self.ack_deadline().is_some_and(|d| d <= now));
        if !any_path && !any_stream && !repeat {
            self.ack_now = false;
            self.ack_armed = false;
            self.ack_repeat = false;
            self.unacked = 0;
            return None;
        }
        let cp = self.control_path();
        let base = self.control_base(cp, Opcode::Ack, now);
        if any_path || any_stream || self.grant.rate_mbps != 0 {
            self.ack_grant = self.grant;
        }
        let info = AckHeader {
            rate_hint_mbps: self.ack_grant.rate_mbps,
            share: self.ack_grant.share,
            ..AckHeader::default()
        };
        let mut w = AckWriter::new(buf, base, info).ok()?;
        let dirty_streams = self.sched.len(ACK);
        let stream_room = dirty_streams.min(255).saturating_mul(STREAM_ACK_LEN);
        let mut left_over = false;
        // Repeats of recent entries first, in the room the new ones leave (best effort).
        let pending = self
            .paths
            .as_ref()
            .iter()
            .take(self.num_paths)
            .filter(|p| p.recv_pending)
            .count();
        let reserve = pending
            .saturating_add(1)
            .saturating_mul(PATH_ACK_LEN)
            .saturating_add(stream_room);
        for p in self.paths.as_mut().iter_mut().take(self.num_paths) {
            if w.remaining() < reserve || w.path_count() >= u8::MAX - pending.min(254) as u8 {
                break;
            }
            if let Some(a) = p.take_repeat() {
                if w.push_path(&a).is_err() {
                    break;
                }
            }
        }
        for p in self.paths.as_mut().iter_mut().take(self.num_paths) {
            if !p.recv_pending {
                continue;
            }
            if w.remaining() < PATH_ACK_LEN + stream_room || w.path_count() == u8::MAX {
                left_over = true;
                break;
            }
            let a = p.take_ack();
            if w.push_path(&a).is_err() {
                left_over = true;
                break;
            }
        }
        while let Some(i) = self.sched.front(ACK) {
            let Some(s) = self.streams.slot_mut(i) else {
                self.sched.pop(&mut self.streams, ACK);
                continue;
            };
            if s.open && s.ack_dirty {
                let e = super::wire::StreamAck {
                    qp: s.cfg.remote_qp,
                    completed_msn: s.resp.completed_msn(),
                };
                if w.push_stream(&e).is_err() {
                    left_over = true;
                    break;
                }
                s.ack_dirty = false;
                self.sched.note_reported(i);
            }
            self.sched.pop(&mut self.streams, ACK);
        }
        // Also repeat the state of a few recently reported streams, round-robin: an ACK that
        // carried a stream's last change may have been lost, and a requester with nothing
        // left in flight would otherwise wait for its completion timeout.
        let mut extra = 0;
        for _ in 0..streams::REPEAT {
            if extra >= EXTRA_STREAM_ACKS || w.remaining() < STREAM_ACK_LEN {
                break;
            }
            let Some(i) = self.sched.next_repeat() else {
                break;
            };
            let Some(s) = self.streams.slot(i) else {
                continue;
            };
            if !s.open || s.error().is_some() {
                continue;
            }
            let e = super::wire::StreamAck {
                qp: s.cfg.remote_qp,
                completed_msn: s.resp.completed_msn(),
            };
            if w.push_stream(&e).is_err() {
                break;
            }
            extra += 1;
        }
        let len = w.finish();
        self.ack_now = left_over;
        // After an ACK with news, one repeat once ACKs stop (a lost last ACK would otherwise
        // cost the sender a probe timeout, or its completion timeout for a stream's state).
        let news = any_path || any_stream;
        self.ack_armed = news;
        self.ack_repeat = news;
        self.ack_at = now.saturating_add(self.cfg.path.min_rto.max(self.cfg.path.ack_delay));
        self.unacked = 0;
        self.stats.acks_out += 1;
        self.reply(cp, len)
    }

    fn emit_nak(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        if self.nak_len == 0 {
            return None;
        }
        let n = *self.naks.get(self.nak_head)?;
        self.nak_head = (self.nak_head + 1) % NAK_QUEUE;
        self.nak_len -= 1;
        let code = NakCode::from_code(n.code)?;
        let cp = self.control_path();
        let mut base = self.control_base(cp, Opcode::Nak, now);
        base.dst_qp = n.dst_qp;
        base.src_qp = n.src_qp;
        base.msn = n.msn;
        let h = Header {
            base,
            ext: Ext::Nak(NakExt {
                code,
                value: n.value,
            }),
        };
        let len = h.emit(buf).ok()?;
        self.stats.naks_out += 1;
        if let Some(c) = self.stats.naks_out_by_code.get_mut(code as usize) {
            *c += 1;
        }
        self.reply(cp, len)
    }

    /// The base header of a control packet (ACK, NAK, probe) on path `path`.
    fn control_base(&self, path: usize, opcode: Opcode, now: u64) -> BaseHeader {
        base_header(&self.cfg, self.paths.as_ref().get(path), opcode, None, now)
    }

    fn emit_probe(&mut self, now: u64, buf: &mut [u8]) -> Option<Transmit> {
        let i = self
            .paths
            .as_ref()
            .iter()
            .take(self.send_paths)
            .position(|p| {
                p.need_probe && p.can_probe() && plane_bit(p.plane) & self.planes_up != 0
            })?;
        let mut base = self.control_base(i, Opcode::Probe, now);
        base.flags = Flags(Flags::ACK_REQ);
        let p = self.paths.as_mut().get_mut(i)?;
        // Write first, then claim the PSN: nothing is consumed if the buffer is too small.
        let h = Header {
            base,
            ext: Ext::Probe,
        };
        if buf.len() < h.len() {
            return None;
        }
        let psn = p.on_send_probe(now)?;
        p.need_probe = false;
        self.run_fresh = false;
        p.stats.probes += 1;
        let h = Header {
            base: BaseHeader { psn, ..base },
            ext: Ext::Probe,
        };
        let len = h.emit(buf).ok()?;
        self.stats.probes_out += 1;
        self.transmit(i, len, true)
    }

    fn emit_data(
        &mut self,
        now: u64,
        pi: usize,
        work: Work,
        buf: &mut [u8],
        mem: &mut impl Memory,
    ) -> Option<Transmit> {
        let mtu = self.cfg.mtu;
        let (si, header, item, retransmit) = match work {
            Work::Request {
                stream,
                msn,
                seg,
                attempt,
                retransmit,
            } => {
                let s = self.streams.slot_mut(stream)?;
                let cfg = s.cfg;
                let info = s.req.segment_info(msn, seg, mtu)?;
                let opcode = match info.opcode {
                    WrOpcode::Send => Opcode::Send,
                    WrOpcode::SendWithImm => Opcode::SendWithImm,
                    WrOpcode::SendWithInv => Opcode::SendWithInv,
                    WrOpcode::RdmaWrite => Opcode::RdmaWrite,
                    WrOpcode::RdmaWriteWithImm => Opcode::RdmaWriteWithImm,
                    WrOpcode::RdmaRead => Opcode::ReadRequest,
                    WrOpcode::CmpSwap => Opcode::CmpSwap,
                    WrOpcode::FetchAdd => Opcode::FetchAdd,
                    WrOpcode::AtomicWrite => Opcode::AtomicWrite,
                    WrOpcode::Flush => Opcode::Flush,
                };
                let mut base = base_header(
                    &self.cfg,
                    self.paths.as_ref().get(pi),
                    opcode,
                    Some(&cfg),
                    now,
                );
                base.msn = msn;
                let mut flags = Flags::default()
                    .with(Flags::FIRST, info.first)
                    .with(Flags::LAST, info.last)
                    .with(Flags::ACK_REQ, info.last || retransmit)
                    .with(Flags::RETRANSMIT, retransmit);
                if info.last && info.wqe.solicited {
                    flags = flags.with(Flags::SOLICITED, true);
                }
                base.flags = flags;
                let imm = (opcode.has_imm() && info.last).then_some(info.wqe.imm);
                let w = info.wqe;
                let ext = match opcode {
                    Opcode::Send | Opcode::SendWithImm | Opcode::SendWithInv => {
                        Ext::Send(SendExt {
                            rsn: info.rsn,
                            offset: info.offset,
                            total_len: info.total_len,
                            payload_len: info.payload_len,
                            imm,
                        })
                    }
                    Opcode::RdmaWrite | Opcode::RdmaWriteWithImm => Ext::Write(WriteExt {
                        va: w.remote_va.wrapping_add(u64::from(info.offset)),
                        rkey: w.rkey,
                        rsn: info.rsn,
                        offset: info.offset,
                        total_len: info.total_len,
                        payload_len: info.payload_len,
                        imm,
                    }),
                    Opcode::ReadRequest => Ext::ReadRequest(ReadReqExt {
                        va: w.remote_va,
                        rkey: w.rkey,
                        len: w.local.total(),
                    }),
                    _ => Ext::Atomic(AtomicExt {
                        va: w.remote_va,
                        rkey: w.rkey,
                        swap_add: w.swap_add,
                        compare: if matches!(opcode, Opcode::CmpSwap | Opcode::Flush) {
                            w.compare
                        } else {
                            0
                        },
                    }),
                };
                let h = Header { base, ext };
                // Payload first (it may fail), straight into the buffer behind the header.
                let hl = h.len();
                let pl = h.payload_len() as usize;
                let dst = buf.get_mut(hl..hl.checked_add(pl)?)?;
                let res =
                    w.local
                        .for_each_piece(info.offset, pl, |sge, off, r| match dst.get_mut(r) {
                            Some(d) => mem.read_local(cfg.local_qp, sge, off, d),
                            None => Err(super::memory::AccessError::Length),
                        });
                if let Err(e) = res {
                    s.req.fail_local(msn, e);
                    self.touch(stream);
                    return None;
                }
                let item = SentItem {
                    kind: ItemKind::Request,
                    stream: stream as u16,
                    msn,
                    seg,
                    attempt,
                };
                (stream, h, item, retransmit)
            }
            Work::Response {
                stream,
                msn,
                seg,
                kind,
                retransmit,
            } => {
                let s = self.streams.slot_mut(stream)?;
                let cfg = s.cfg;
                let opcode = match kind {
                    ResponseKind::Read { .. } => Opcode::ReadResponse,
                    ResponseKind::Atomic { .. } => Opcode::AtomicResponse,
                };
                let mut base = base_header(
                    &self.cfg,
                    self.paths.as_ref().get(pi),
                    opcode,
                    Some(&cfg),
                    now,
                );
                base.msn = msn;
                let h = match kind {
                    ResponseKind::Read { va, rkey, len } => {
                        let offset = seg.checked_mul(mtu)?;
                        let payload_len = len.saturating_sub(offset).min(mtu);
                        let last = offset.saturating_add(payload_len) >= len;
                        base.flags = Flags::default()
                            .with(Flags::FIRST, seg == 0)
                            .with(Flags::LAST, last)
                            .with(Flags::ACK_REQ, last || retransmit)
                            .with(Flags::RETRANSMIT, retransmit);
                        let h = Header {
                            base,
                            ext: Ext::ReadResponse(DataExt {
                                offset,
                                total_len: len,
                                payload_len,
                            }),
                        };
                        let hl = h.len();
                        let dst = buf.get_mut(hl..hl.checked_add(payload_len as usize)?)?;
                        if !dst.is_empty() {
                            let src = va.wrapping_add(u64::from(offset));
                            if mem.read_remote(cfg.local_qp, rkey, src, dst).is_err() {
                                s.resp.abort_response(msn);
                                self.touch(stream);
                                self.queue_nak(
                                    cfg.remote_qp,
                                    cfg.local_qp,
                                    msn,
                                    NakCode::RemoteAccess,
                                    0,
                                );
                                return None;
                            }
                        }
                        h
                    }
                    ResponseKind::Atomic { orig } => {
                        base.flags = Flags(Flags::FIRST | Flags::LAST | Flags::ACK_REQ)
                            .with(Flags::RETRANSMIT, retransmit);
                        Header {
                            base,
                            ext: Ext::AtomicResponse(orig),
                        }
                    }
                };
                let item = SentItem {
                    kind: ItemKind::Response,
                    stream: stream as u16,
                    msn,
                    seg,
                    attempt: 0,
                };
                (stream, h, item, retransmit)
            }
        };
        // Claim the PSN and write the header.
        let p = self.paths.as_mut().get_mut(pi)?;
        let psn = p.on_send(now, item, retransmit)?;
        let mut header = header;
        header.base.psn = psn;
        let hl = header.emit(buf).ok()?;
        let len = hl.checked_add(header.payload_len() as usize)?;
        let s = self.streams.slot_mut(si)?;
        match item.kind {
            ItemKind::Request => {
                s.req.mark_sent(now, item.msn, item.seg);
                // Its turn came: its completion timeout runs again.
                if s.parked {
                    let stall = self.cfg.stall_timeout;
                    self.sched.note_deadline(&mut self.streams, si, stall);
                }
            }
            _ => s.resp.mark_sent(item.msn, item.seg),
        }
        self.stats.data_packets_out += 1;
        if retransmit {
            self.stats.retransmits += 1;
        }
        self.transmit(pi, len, true)
    }

    // ---------------------------------------------------------------- events

    /// The next completion or stream event of the streams on the EVENT list; None when there
    /// is none. A stream stays first on the list while it has events, and leaves it when it
    /// has none.
    pub fn poll_event(&mut self) -> Option<Event> {
        loop {
            let i = self.sched.front(EVENT)?;
            let Some(s) = self.streams.slot_mut(i).filter(|s| s.open) else {
                self.sched.pop(&mut self.streams, EVENT);
                continue;
            };
            if let Some(code) = s.resp.failed() {
                if s.error().is_none() {
                    s.set_error(CqStatus::from_nak(code));
                }
            }
            if let Some(status) = s.error() {
                if !s.error_reported {
                    s.error_reported = true;
                    return Some(Event::StreamError {
                        stream: StreamId(i as u16),
                        status,
                    });
                }
            }
            let in_error = s.error().is_some();
            if let Some((cqe, fatal)) = s.req.pop_completion(StreamId(i as u16), in_error) {
                if fatal {
                    s.set_error(cqe.status);
                }
                return Some(Event::SendCompletion(cqe));
            }
            let src_qp = s.cfg.remote_qp;
            if let Some(cqe) = s.resp.pop_completion(StreamId(i as u16), src_qp, in_error) {
                return Some(Event::RecvCompletion(cqe));
            }
            self.sched.pop(&mut self.streams, EVENT);
            if s_room(self.streams.slot_mut(i)) {
                return Some(Event::SendQueueRoom(StreamId(i as u16)));
            }
        }
    }
}

fn new_cc(cfg: &Config, num_paths: usize) -> ConnCc {
    let packet = cfg.mtu.saturating_add(MAX_HEADER_LEN as u32);
    ConnCc::new(cfg.cc, packet, num_paths as u32)
}

/// What one ACK's path entries say, for the connection's congestion control.
#[derive(Default)]
struct CcSample {
    acked: u32,
    marked: u32,
    max_srtt: u64,
    min_srtt: u64,
}

impl CcSample {
    fn add(&mut self, acked: u32, marked: u16, srtt: u64) {
        self.acked = self.acked.saturating_add(acked);
        self.marked = self.marked.saturating_add(u32::from(marked));
        if srtt != 0 {
            self.max_srtt = self.max_srtt.max(srtt);
            self.min_srtt = if self.min_srtt == 0 {
                srtt
            } else {
                self.min_srtt.min(srtt)
            };
        }
    }
}

/// The stream refused a send WQE for want of room and now has room, or was asked to report
/// when it holds none any more and holds none (once per request).
fn s_room(s: Option<&mut Stream>) -> bool {
    match s {
        Some(s) if s.sq_refused => {
            let n = s.req.outstanding();
            let room = if s.sq_drain {
                n == 0
            } else {
                (n as usize) < super::stream::SQ_DEPTH
            };
            if room {
                s.sq_refused = false;
                s.sq_drain = false;
            }
            room
        }
        _ => false,
    }
}

/// A path pick not charged yet: its planes mask and path (the weights of the full pick behind
/// it are in `Path::pick_weight`, their total in `Connection::run_total`). Plain fields, not an `Option` of a tuple: a connection is
/// built from all-zero bytes (`ZeroValid`), which must be a valid value of every field, and
/// here all-zero is "no pick".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pick {
    valid: bool,
    mask: u32,
    path: usize,
}
zero_valid!(struct Pick { valid, mask, path });

impl Pick {
    const NONE: Pick = Pick {
        valid: false,
        mask: 0,
        path: 0,
    };

    /// The pick, if there is one.
    fn get(self) -> Option<(u32, usize)> {
        self.valid.then_some((self.mask, self.path))
    }
}

/// A base header for a packet on path `path` (of stream `stream`, if any); PSN, MSN and flags
/// are filled in by the caller.
fn base_header(
    cfg: &Config,
    path: Option<&Path>,
    opcode: Opcode,
    stream: Option<&StreamConfig>,
    now: u64,
) -> BaseHeader {
    BaseHeader {
        opcode,
        flags: Flags::default(),
        dst_qp: stream.map_or(0, |s| s.remote_qp),
        src_qp: stream.map_or(0, |s| s.local_qp),
        conn_id: cfg.remote_conn_id,
        path_id: path.map_or(0, |p| p.id),
        plane: path.map_or(0, |p| p.plane),
        psn: 0,
        msn: 0,
        // The wire carries the clock modulo 2^32.
        timestamp: now as u32,
    }
}

/// The bit of `plane` in a plane mask (planes beyond 31 share bit 31).
fn plane_bit(plane: u8) -> u32 {
    1u32 << plane.min(31)
}

/// Routes a resolved packet to its owner.
fn resolve<S: StreamSlots>(
    streams: &mut S,
    sched: &mut Sched,
    stall: u64,
    now: u64,
    item: SentItem,
    outcome: Outcome,
) {
    if let Some(i) = apply_outcome(streams, now, item, outcome) {
        sched.touch(streams, i, stall);
    }
}

/// Gives a resolved packet's outcome to its stream; returns the stream, which the caller
/// touches ([`Sched::touch`]) before the scheduler's lists are read again.
fn apply_outcome<S: StreamSlots>(
    streams: &mut S,
    now: u64,
    item: SentItem,
    outcome: Outcome,
) -> Option<usize> {
    let i = usize::from(item.stream);
    let s = streams.slot_mut(i)?;
    if !s.open {
        return None;
    }
    match item.kind {
        ItemKind::Request => s
            .req
            .on_outcome(now, item.msn, item.seg, item.attempt, outcome),
        ItemKind::Response => s.resp.on_outcome(item.msn, item.seg, outcome),
        ItemKind::Probe => return None,
    }
    Some(i)
}
