// SPDX-License-Identifier: GPL-2.0

//! The device's hardware counters: a fixed set of named 64-bit counters, bumped lock-free from
//! any context and read by `rdma statistic show link DEV/1` (and
//! `/sys/class/infiniband/DEV/ports/1/hw_counters/NAME`).
//!
//! The names are an interface (tests and users read them): never rename or reorder one, only
//! append. Each name is documented on its variant.

use core::sync::atomic::{AtomicU64, Ordering};
use kernel::{prelude::*, sync::Arc};

macro_rules! counters {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// One hardware counter.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub(crate) enum Counter {
            $($(#[$doc])* $variant,)*
        }

        /// The names the RDMA core reports, indexed by `Counter as usize`.
        pub(crate) const COUNTER_NAMES: [&CStr; Counter::ALL.len()] = [$($name,)*];

        impl Counter {
            /// Every counter, in index order.
            pub(crate) const ALL: &[Counter] = &[$(Counter::$variant,)*];
        }
    };
}

counters! {
    /// `rx_packets`: MetaRoCE packets received that passed the header checks.
    RxPackets => c"rx_packets",
    /// `rx_bytes`: UDP payload bytes of those packets.
    RxBytes => c"rx_bytes",
    /// `rx_malformed`: datagrams rejected by the header checks (short, bad version, unknown
    /// opcode, non-zero reserved bits, inconsistent lengths) or with unreadable IP/UDP headers.
    RxMalformed => c"rx_malformed",
    /// `rx_no_connection`: well-formed packets for no known connection or QP.
    RxNoConnection => c"rx_no_connection",
    /// `rx_ecn_ce`: accepted packets that arrived with ECN Congestion Experienced.
    RxEcnCe => c"rx_ecn_ce",
    /// `rx_nomem`: datagrams dropped for lack of memory before parsing, or because the queue
    /// from softirq to the data path was full (as a NIC's ring would be).
    RxNoMem => c"rx_nomem",
    /// `tx_packets`: datagrams handed to the IP stack.
    TxPackets => c"tx_packets",
    /// `tx_bytes`: UDP payload bytes of those datagrams.
    TxBytes => c"tx_bytes",
    /// `tx_errors`: sends that failed for any reason (includes `tx_no_route`).
    TxErrors => c"tx_errors",
    /// `tx_no_route`: sends that failed because no route leads to the destination from this
    /// plane's netdev.
    TxNoRoute => c"tx_no_route",
    /// `retransmits`: packets sent again (timeout, NAK or SACK gap).
    Retransmits => c"retransmits",
    /// `duplicates`: packets received more than once.
    Duplicates => c"duplicates",
    /// `out_of_order`: packets received ahead of a gap in their path's PSN space.
    OutOfOrder => c"out_of_order",
    /// `nak_sent_remote_access`: NAKs sent, code 1 (remote access error).
    NakSentRemoteAccess => c"nak_sent_remote_access",
    /// `nak_sent_invalid_request`: NAKs sent, code 2 (invalid request).
    NakSentInvalidRequest => c"nak_sent_invalid_request",
    /// `nak_sent_rnr`: NAKs sent, code 3 (receiver not ready).
    NakSentRnr => c"nak_sent_rnr",
    /// `nak_sent_out_of_window`: NAKs sent, code 4 (out of window / sequence error).
    NakSentOutOfWindow => c"nak_sent_out_of_window",
    /// `nak_sent_remote_op`: NAKs sent, code 5 (remote operational error).
    NakSentRemoteOp => c"nak_sent_remote_op",
    /// `nak_rcvd_remote_access`: NAKs received, code 1.
    NakRcvdRemoteAccess => c"nak_rcvd_remote_access",
    /// `nak_rcvd_invalid_request`: NAKs received, code 2.
    NakRcvdInvalidRequest => c"nak_rcvd_invalid_request",
    /// `nak_rcvd_rnr`: NAKs received, code 3.
    NakRcvdRnr => c"nak_rcvd_rnr",
    /// `nak_rcvd_out_of_window`: NAKs received, code 4.
    NakRcvdOutOfWindow => c"nak_rcvd_out_of_window",
    /// `nak_rcvd_remote_op`: NAKs received, code 5.
    NakRcvdRemoteOp => c"nak_rcvd_remote_op",
    /// `rnr_retries`: messages resent after an RNR NAK's wait.
    RnrRetries => c"rnr_retries",
    /// `retry_exceeded`: messages failed because their retry budget ran out.
    RetryExceeded => c"retry_exceeded",
    /// `acks_sent`: ACK packets sent.
    AcksSent => c"acks_sent",
    /// `acks_rcvd`: ACK packets received.
    AcksRcvd => c"acks_rcvd",
    /// `timeouts`: retransmission timeouts that fired.
    Timeouts => c"timeouts",
    /// `path0_tx_packets`: packets the transport sent on path 0 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path0TxPackets => c"path0_tx_packets",
    /// `path0_retransmits`: of those, retransmissions.
    Path0Retransmits => c"path0_retransmits",
    /// `path0_lost`: packets sent on path 0 declared lost (SACK gap or timeout).
    Path0Lost => c"path0_lost",
    /// `path1_tx_packets`: packets the transport sent on path 1 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path1TxPackets => c"path1_tx_packets",
    /// `path1_retransmits`: of those, retransmissions.
    Path1Retransmits => c"path1_retransmits",
    /// `path1_lost`: packets sent on path 1 declared lost (SACK gap or timeout).
    Path1Lost => c"path1_lost",
    /// `path2_tx_packets`: packets the transport sent on path 2 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path2TxPackets => c"path2_tx_packets",
    /// `path2_retransmits`: of those, retransmissions.
    Path2Retransmits => c"path2_retransmits",
    /// `path2_lost`: packets sent on path 2 declared lost (SACK gap or timeout).
    Path2Lost => c"path2_lost",
    /// `path3_tx_packets`: packets the transport sent on path 3 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path3TxPackets => c"path3_tx_packets",
    /// `path3_retransmits`: of those, retransmissions.
    Path3Retransmits => c"path3_retransmits",
    /// `path3_lost`: packets sent on path 3 declared lost (SACK gap or timeout).
    Path3Lost => c"path3_lost",
    /// `path4_tx_packets`: packets the transport sent on path 4 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path4TxPackets => c"path4_tx_packets",
    /// `path4_retransmits`: of those, retransmissions.
    Path4Retransmits => c"path4_retransmits",
    /// `path4_lost`: packets sent on path 4 declared lost (SACK gap or timeout).
    Path4Lost => c"path4_lost",
    /// `path5_tx_packets`: packets the transport sent on path 5 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path5TxPackets => c"path5_tx_packets",
    /// `path5_retransmits`: of those, retransmissions.
    Path5Retransmits => c"path5_retransmits",
    /// `path5_lost`: packets sent on path 5 declared lost (SACK gap or timeout).
    Path5Lost => c"path5_lost",
    /// `path6_tx_packets`: packets the transport sent on path 6 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path6TxPackets => c"path6_tx_packets",
    /// `path6_retransmits`: of those, retransmissions.
    Path6Retransmits => c"path6_retransmits",
    /// `path6_lost`: packets sent on path 6 declared lost (SACK gap or timeout).
    Path6Lost => c"path6_lost",
    /// `path7_tx_packets`: packets the transport sent on path 7 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path7TxPackets => c"path7_tx_packets",
    /// `path7_retransmits`: of those, retransmissions.
    Path7Retransmits => c"path7_retransmits",
    /// `path7_lost`: packets sent on path 7 declared lost (SACK gap or timeout).
    Path7Lost => c"path7_lost",
    /// `cc_paced`: times data was ready but the pacer (the receiver's grant) held it back.
    CcPaced => c"cc_paced",
    /// `cc_window_limited`: times data was ready but a connection window was full.
    CcWindowLimited => c"cc_window_limited",
    /// `cc_ecn_echoed`: marks the peers echoed for packets we sent (all paths): CE, and their own
    /// receive queue's (`busy`, `docs/congestion.md`).
    CcEcnEchoed => c"cc_ecn_echoed",
    /// `cc_rx_capacity_mbps` (a gauge, not a counter): the inbound capacity, Mbit/s, the rate
    /// allocator divides among the peers sending to this device: the configured capacity, or
    /// less while a marking bottleneck on the way has been measured below it.
    CcRxCapacityMbps => c"cc_rx_capacity_mbps",
    /// `datagrams_sent`: unreliable datagrams (the GSI QP's MADs: the connection manager)
    /// sent.
    DatagramsSent => c"datagrams_sent",
    /// `datagrams_rcvd`: datagrams placed in a receive buffer.
    DatagramsRcvd => c"datagrams_rcvd",
    /// `datagrams_dropped`: datagrams received and dropped: no such QP, a wrong Q_Key, no
    /// receive buffer posted, or too long for it (UD semantics: the sender is not told).
    DatagramsDropped => c"datagrams_dropped",
    /// `path8_tx_packets`: packets the transport sent on path 8 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path8TxPackets => c"path8_tx_packets",
    /// `path8_retransmits`: of those, retransmissions.
    Path8Retransmits => c"path8_retransmits",
    /// `path8_lost`: packets sent on path 8 declared lost (SACK gap or timeout).
    Path8Lost => c"path8_lost",
    /// `path9_tx_packets`: packets the transport sent on path 9 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path9TxPackets => c"path9_tx_packets",
    /// `path9_retransmits`: of those, retransmissions.
    Path9Retransmits => c"path9_retransmits",
    /// `path9_lost`: packets sent on path 9 declared lost (SACK gap or timeout).
    Path9Lost => c"path9_lost",
    /// `path10_tx_packets`: packets the transport sent on path 10 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path10TxPackets => c"path10_tx_packets",
    /// `path10_retransmits`: of those, retransmissions.
    Path10Retransmits => c"path10_retransmits",
    /// `path10_lost`: packets sent on path 10 declared lost (SACK gap or timeout).
    Path10Lost => c"path10_lost",
    /// `path11_tx_packets`: packets the transport sent on path 11 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path11TxPackets => c"path11_tx_packets",
    /// `path11_retransmits`: of those, retransmissions.
    Path11Retransmits => c"path11_retransmits",
    /// `path11_lost`: packets sent on path 11 declared lost (SACK gap or timeout).
    Path11Lost => c"path11_lost",
    /// `path12_tx_packets`: packets the transport sent on path 12 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path12TxPackets => c"path12_tx_packets",
    /// `path12_retransmits`: of those, retransmissions.
    Path12Retransmits => c"path12_retransmits",
    /// `path12_lost`: packets sent on path 12 declared lost (SACK gap or timeout).
    Path12Lost => c"path12_lost",
    /// `path13_tx_packets`: packets the transport sent on path 13 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path13TxPackets => c"path13_tx_packets",
    /// `path13_retransmits`: of those, retransmissions.
    Path13Retransmits => c"path13_retransmits",
    /// `path13_lost`: packets sent on path 13 declared lost (SACK gap or timeout).
    Path13Lost => c"path13_lost",
    /// `path14_tx_packets`: packets the transport sent on path 14 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path14TxPackets => c"path14_tx_packets",
    /// `path14_retransmits`: of those, retransmissions.
    Path14Retransmits => c"path14_retransmits",
    /// `path14_lost`: packets sent on path 14 declared lost (SACK gap or timeout).
    Path14Lost => c"path14_lost",
    /// `path15_tx_packets`: packets the transport sent on path 15 (data, retransmissions,
    /// probes), summed over the device's connections.
    Path15TxPackets => c"path15_tx_packets",
    /// `path15_retransmits`: of those, retransmissions.
    Path15Retransmits => c"path15_retransmits",
    /// `path15_lost`: packets sent on path 15 declared lost (SACK gap or timeout).
    Path15Lost => c"path15_lost",
    /// `hello_mtu_mismatch`: HELLOs from a peer whose payload MTU (from its links' MTU)
    /// differs from this device's: the two cannot exchange data packets (the kernel log
    /// names the peer once).
    HelloMtuMismatch => c"hello_mtu_mismatch",
    /// `peers_refused`: QPs refused a connection (`modify_qp` to RTR failing with `ENOSPC`)
    /// because the device already had `max_peers` peer devices.
    PeersRefused => c"peers_refused",
    /// `hello_unproven`: HELLOs that did not prove their sender (their `conn_id` was not our id
    /// for that peer): they change nothing; they are answered, at most every 10 ms per peer.
    HelloUnproven => c"hello_unproven",
    /// `peer_restarts`: peers whose connection to us was made again (a proven HELLO with a new
    /// connection id): our connection's paths restarted their sequence numbers.
    PeerRestarts => c"peer_restarts",
    /// `rx_out_of_window`: packets of a connection whose PSN lay beyond their path's receive
    /// window (more than 1024 past what it has received): dropped, never acknowledged.
    RxOutOfWindow => c"rx_out_of_window",
    /// `ring_errors`: user QPs and SRQs failed because userspace broke a ring it shares with
    /// the kernel: a producer index claiming more entries than the ring holds, or a work
    /// request the provider could not have written (`uapi/metaroce-abi.h`). The QP moved to
    /// the error state with `IB_EVENT_QP_FATAL` (an SRQ: `IB_EVENT_SRQ_ERR`); one count per
    /// QP or SRQ failed.
    RingErrors => c"ring_errors",
    /// `rx_no_peer`: of `rx_no_connection`, datagrams from an address of no peer device (a
    /// stranger; or a peer's HELLO that reached us before any QP of ours named it, which
    /// its next HELLO mends).
    RxNoPeer => c"rx_no_peer",
    /// `rx_wrong_connection`: of `rx_no_connection`, packets from a peer's address naming a
    /// connection id that is not ours: a connection of ours the peer still uses after we
    /// made a new one (each end lets an unused connection go after its own linger), which
    /// our HELLO, sent in answer, mends; or forged.
    RxWrongConnection => c"rx_wrong_connection",
    /// `rx_bad_checksum`: datagrams for our port whose UDP checksum was wrong, dropped, while
    /// the plane's socket took datagrams queued (`sys/udp.rs`); one by one, the stack drops
    /// them before we see them and counts them itself (`nstat`: `UdpInCsumErrors`).
    RxBadChecksum => c"rx_bad_checksum",
    /// `rx_gso_whole`: UDP GSO packets (trains of datagrams sent in one go) the plane's socket
    /// took whole, while queued; their datagrams count in the other counters one by one.
    RxGsoWhole => c"rx_gso_whole",
    /// `rx_queued`: times a plane's socket switched from taking datagrams one by one to taking
    /// them queued, at a train (`sys/udp.rs`).
    RxQueued => c"rx_queued",
}

/// Paths with their own counters (`path<i>_*`): as many as a connection has by default
/// (`datapath::DEFAULT_PATHS`); a connection's paths beyond these are not counted per path
/// (the direct verbs and the `peers` file show them).
pub(crate) const COUNTED_PATHS: usize = 16;

/// Per path id: its `[tx_packets, retransmits, lost]` counters.
pub(crate) const PATH_COUNTERS: [[Counter; 3]; COUNTED_PATHS] = [
    [
        Counter::Path0TxPackets,
        Counter::Path0Retransmits,
        Counter::Path0Lost,
    ],
    [
        Counter::Path1TxPackets,
        Counter::Path1Retransmits,
        Counter::Path1Lost,
    ],
    [
        Counter::Path2TxPackets,
        Counter::Path2Retransmits,
        Counter::Path2Lost,
    ],
    [
        Counter::Path3TxPackets,
        Counter::Path3Retransmits,
        Counter::Path3Lost,
    ],
    [
        Counter::Path4TxPackets,
        Counter::Path4Retransmits,
        Counter::Path4Lost,
    ],
    [
        Counter::Path5TxPackets,
        Counter::Path5Retransmits,
        Counter::Path5Lost,
    ],
    [
        Counter::Path6TxPackets,
        Counter::Path6Retransmits,
        Counter::Path6Lost,
    ],
    [
        Counter::Path7TxPackets,
        Counter::Path7Retransmits,
        Counter::Path7Lost,
    ],
    [
        Counter::Path8TxPackets,
        Counter::Path8Retransmits,
        Counter::Path8Lost,
    ],
    [
        Counter::Path9TxPackets,
        Counter::Path9Retransmits,
        Counter::Path9Lost,
    ],
    [
        Counter::Path10TxPackets,
        Counter::Path10Retransmits,
        Counter::Path10Lost,
    ],
    [
        Counter::Path11TxPackets,
        Counter::Path11Retransmits,
        Counter::Path11Lost,
    ],
    [
        Counter::Path12TxPackets,
        Counter::Path12Retransmits,
        Counter::Path12Lost,
    ],
    [
        Counter::Path13TxPackets,
        Counter::Path13Retransmits,
        Counter::Path13Lost,
    ],
    [
        Counter::Path14TxPackets,
        Counter::Path14Retransmits,
        Counter::Path14Lost,
    ],
    [
        Counter::Path15TxPackets,
        Counter::Path15Retransmits,
        Counter::Path15Lost,
    ],
];

/// How many counters there are.
pub(crate) const NUM_COUNTERS: usize = Counter::ALL.len();

/// A set of counters: the device's (port 1: everything, over all planes), or one plane's
/// (port `k + 1` for plane `k`: what its socket counts), which also counts in the device's.
pub(crate) struct Counters {
    values: [AtomicU64; NUM_COUNTERS],
    /// The device's counters, for a plane's.
    device: Option<Arc<Counters>>,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            values: [const { AtomicU64::new(0) }; NUM_COUNTERS],
            device: None,
        }
    }

    /// A plane's counters, adding to `device`'s too.
    pub(crate) fn for_plane(device: Arc<Counters>) -> Self {
        Counters {
            values: [const { AtomicU64::new(0) }; NUM_COUNTERS],
            device: Some(device),
        }
    }

    /// Adds one to `counter`.
    pub(crate) fn inc(&self, counter: Counter) {
        self.add(counter, 1);
    }

    /// Adds `n` to `counter` (wrapping, like hardware counters), and to the device's if these
    /// are a plane's.
    pub(crate) fn add(&self, counter: Counter, n: u64) {
        // Most of what the data path reports after a run is 0: no atomic for it.
        if n == 0 {
            return;
        }
        self.values[counter as usize].fetch_add(n, Ordering::Relaxed);
        if let Some(d) = &self.device {
            d.add(counter, n);
        }
    }

    /// Sets `counter` to `value` (for a gauge).
    pub(crate) fn set(&self, counter: Counter, value: u64) {
        self.values[counter as usize].store(value, Ordering::Relaxed);
    }

    /// The current value of `counter`.
    #[allow(dead_code)]
    pub(crate) fn get(&self, counter: Counter) -> u64 {
        self.values[counter as usize].load(Ordering::Relaxed)
    }

    /// Copies the counters, in index order, into `out` (as many as fit).
    pub(crate) fn snapshot(&self, out: &mut [u64]) {
        for (o, v) in out.iter_mut().zip(self.values.iter()) {
            *o = v.load(Ordering::Relaxed);
        }
    }
}

// The RDMA core's table and ours must agree on the count.
const _: () = assert!(COUNTER_NAMES.len() == NUM_COUNTERS);
