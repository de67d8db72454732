// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause

//! A connection between two devices: its paths below, its streams above.
//!
//! Sans-IO, in the manner of quinn-proto: the caller feeds datagrams
//! ([`Connection::handle_packet`]) and timer expiries ([`Connection::handle_timeout`]) in, and
//! takes datagrams ([`Connection::poll_transmit`]), the next timer deadline
//! ([`Connection::poll_timeout`]) and completions ([`Connection::poll_event`]) out. Memory is
//! reached only through the caller's [`Memory`] implementation.
//!
//! - This file: the connection, its setup and the verbs' side (streams, posting, events);
//!   `receive`: datagrams in; `send`: data packets out; `spray`: which path a data packet
//!   takes; `control`: ACKs, NAKs and probes out; `timer`: the timers the caller arms and what
//!   fires when they expire.
//! - `path`: a path's state, window and timers; `sack`: the receiver's per-path SACK window and
//!   per-message segment windows; `retransmit`: the sender's in-flight table and loss
//!   detection; `rtt`: the RTT estimator; `streams`: where the streams live (caller storage,
//!   [`StreamSlots`]) and the index and lists that find the ones needing attention without
//!   scanning the rest.

mod control;
pub mod path;
mod receive;
pub mod retransmit;
pub mod rtt;
pub mod sack;
mod send;
mod spray;
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
use path::{Behind, Path, PathConfig, PathState, PathStats};
use retransmit::{ItemKind, Outcome, SentItem};
use spray::Pick;
use streams::{Sched, ACK, EVENT, FREE, TIMER, WORK};
pub use streams::{StreamSlots, MAX_STREAMS};

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
    /// The ECN rate (of 65536, see [`path::Path::ecn_rate`]; the network's CE marks only,
    /// not the receiver's [`Arrival::rx_busy`]) at or over which a losing path's runs are
    /// `lossy_path_burst` long (0, the default: any losing path). At 1, a path that loses
    /// without its queues marking (random loss: a bad link, a flapping optic) keeps its long
    /// runs: they do not make a queue overflow, which is what short runs are for.
    pub marked_run_rate: u16,
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
    lossy_run_rate, marked_run_rate, stream_quantum, path, ack_every, stall_timeout, seed, cc,
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
            marked_run_rate: 0,
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
    /// The receiver's own queue of arrivals was long when this one joined it: the caller
    /// marks it as a switch queue past its ECN threshold would, but apart from the
    /// network's marks (an ACK echoes it as [`PathAck::busy`](crate::wire::PathAck::busy)).
    pub rx_busy: bool,
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
    /// When the newest packet a path acknowledged was sent (0: none yet): a path whose
    /// unanswered tail is older is behind the others ([`Path::deadline`]).
    delivered_sent: u64,
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
    ack_repeat, ack_grant, unacked, rr_ack_path, delivered_at, delivered_sent, burst_path,
    burst_left, run_total, run_health, run_mask, run_now, run_fresh, run_rounds, last_pick,
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
            delivered_sent: 0,
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
        self.delivered_sent = 0;
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
        self.planes_changed();
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

    // ---------------------------------------------------------------- timers

    // ---------------------------------------------------------------- sending

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
        self.planes_changed();
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
        self.planes_changed();
    }

    /// The planes that carry paths changed: a connection that has not had an ACK yet may
    /// put its initial window on each of them ([`ConnCc::set_planes`]).
    fn planes_changed(&mut self) {
        let planes_up = self.planes_up;
        let n = planes_with_paths(self.cfg.planes, self.send_paths);
        let carrying = (0..n)
            .filter(|&k| plane_bit(k as u8) & planes_up != 0)
            .count();
        self.cc.set_planes(carrying.max(1) as u32);
    }

    /// Whether plane `plane` may carry packets.
    pub fn plane_up(&self, plane: u8) -> bool {
        self.planes_up & plane_bit(plane) != 0
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

/// The congestion state of a fresh connection: its paths on `cfg.planes` planes, all up.
fn new_cc(cfg: &Config, num_paths: usize) -> ConnCc {
    let packet = cfg.mtu.saturating_add(MAX_HEADER_LEN as u32);
    let mut cc = ConnCc::new(cfg.cc, packet, num_paths as u32);
    cc.set_planes(planes_with_paths(cfg.planes, num_paths) as u32);
    cc
}

/// How many of `planes` planes `paths` paths reach (path `i` is on plane `i mod planes`).
fn planes_with_paths(planes: u8, paths: usize) -> usize {
    usize::from(planes.max(1)).min(paths.max(1))
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
