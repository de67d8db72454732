// SPDX-License-Identifier: GPL-2.0

//! A metaroce device: its identity and what it reports to the RDMA core.
//!
//! Everything here is safe code working on plain data; `sys::ibdev` calls it from the ops the
//! RDMA core invokes.

use crate::transport::connection::Arrival;
use crate::transport::wire::{Flags, BASE_HEADER_LEN};
use crate::{
    counters::{Counter, Counters},
    datapath::Engine,
    net::{NodeAddr, RxDrop, RxHandler, RxPacket},
    sys::netdev::NetDev,
    verbs_core::ib::mtu,
};
use core::sync::atomic::{AtomicU32, Ordering};
use kernel::{prelude::*, sync::Arc};

/// Bytes a MetaRoCE packet adds on top of the payload, at most: IPv6 (40) + UDP (8) + the
/// largest MetaRoCE header (64). The active MTU reported to verbs is what fits under it.
pub(crate) const WIRE_OVERHEAD: u32 = 40 + 8 + 64;

/// The MetaRoCE wire format version this driver speaks (the transport's).
pub(crate) const WIRE_VERSION: u32 = crate::transport::wire::VERSION as u32;
/// `fw_ver` as libibverbs prints it ("major.minor.sub" from `major << 32 | minor << 16 | sub`):
/// the driver's version, 0.1.0.
pub(crate) const FW_VERSION: u64 = 1 << 16;
/// Logical paths (UDP source ports) one connection may spray over.
pub(crate) const MAX_PATHS: u32 = 256;
/// Netdevs (planes) one device may span.
pub(crate) const MAX_PLANES: u32 = 8;
/// Protection domains per device.
pub(crate) const MAX_PD: u32 = 1 << 16;

/// The driver's state for one device, kept beside the `ib_device` it belongs to.
pub(crate) struct Device {
    /// The hardware counters (`rdma statistic`), shared with the UDP layer and the data path:
    /// port 1's.
    counters: Arc<Counters>,
    /// Each plane's socket counters (port `k + 1` for plane `k` > 0), which add to `counters`.
    plane_counters: [Arc<Counters>; MAX_PLANES as usize],
    node_guid: u64,
    /// User contexts open (`ibv_open_device`).
    contexts: AtomicU32,
}

impl Device {
    /// A device on the netdev `ndev`, named after its hardware address.
    pub(crate) fn new(ndev: &NetDev<'_>) -> Result<Self> {
        let counters = Arc::new(Counters::new(), GFP_KERNEL)?;
        let mut planes = KVec::with_capacity(MAX_PLANES as usize, GFP_KERNEL)?;
        for _ in 0..MAX_PLANES {
            planes.push(
                Arc::new(Counters::for_plane(counters.clone()), GFP_KERNEL)?,
                GFP_KERNEL,
            )?;
        }
        let plane_counters =
            core::array::from_fn(|k| planes.get(k).cloned().unwrap_or_else(|| counters.clone()));
        Ok(Device {
            counters,
            plane_counters,
            node_guid: node_guid_from_mac(ndev.mac()),
            contexts: AtomicU32::new(0),
        })
    }

    /// A user context was opened.
    pub(crate) fn context_opened(&self) {
        self.contexts.fetch_add(1, Ordering::Relaxed);
    }

    /// A user context was closed.
    pub(crate) fn context_closed(&self) {
        self.contexts.fetch_sub(1, Ordering::Relaxed);
    }

    /// User contexts open.
    pub(crate) fn contexts(&self) -> u32 {
        self.contexts.load(Ordering::Relaxed)
    }

    /// The device's hardware counters, to share.
    pub(crate) fn counters_arc(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The counters port `port` reports: the device's for port 1, plane `port - 1`'s for the
    /// others.
    pub(crate) fn port_counters(&self, port: u32) -> Option<&Counters> {
        match port {
            1 => Some(&self.counters),
            p => self
                .plane_counters
                .get((p as usize).checked_sub(1)?)
                .map(|c| &**c),
        }
    }

    /// Each plane's counters, to share (index: plane).
    pub(crate) fn plane_counters(&self) -> [Arc<Counters>; MAX_PLANES as usize] {
        self.plane_counters.clone()
    }

    /// The node GUID, in the byte order `ib_device.node_guid` (`__be64`) stores.
    pub(crate) fn node_guid(&self) -> u64 {
        self.node_guid
    }
}

/// What the device's UDP socket receives goes here: the base header is checked and counted,
/// then the packet goes to the data path.
pub(crate) struct DeviceRx {
    counters: Arc<Counters>,
    engine: Arc<Engine>,
    /// The plane whose socket this receives for.
    plane: u8,
}

impl DeviceRx {
    pub(crate) fn new(counters: Arc<Counters>, engine: Arc<Engine>, plane: u8) -> Self {
        DeviceRx {
            counters,
            engine,
            plane,
        }
    }
}

impl RxHandler for DeviceRx {
    fn receive(&self, pkt: RxPacket) {
        if !base_header_ok(pkt.payload.bytes()) {
            self.counters.inc(Counter::RxMalformed);
            return;
        }
        self.counters.inc(Counter::RxPackets);
        self.counters
            .add(Counter::RxBytes, pkt.payload.bytes().len() as u64);
        if pkt.ecn_ce {
            self.counters.inc(Counter::RxEcnCe);
        }
        if crate::datapath::is_datagram(pkt.payload.bytes()) {
            // The GSI QP's (IPv4 or IPv6): no connection.
            self.engine
                .receive_datagram(self.plane, pkt.src, pkt.dst, pkt.payload);
            return;
        }
        // A connection's packets go from one device to another, never to a group.
        if pkt.dst.is_multicast() {
            self.counters.inc(Counter::RxMalformed);
            return;
        }
        let arrival = Arrival {
            ecn_ce: pkt.ecn_ce,
            rx_busy: false,
            src_port: pkt.src_port,
        };
        self.engine
            .receive(NodeAddr::from_ip(pkt.src), arrival, pkt.more, pkt.payload);
    }

    fn dropped(&self, why: RxDrop) {
        self.counters.inc(match why {
            RxDrop::NoMemory => Counter::RxNoMem,
            RxDrop::BadHeaders => Counter::RxMalformed,
            RxDrop::BadChecksum => Counter::RxBadChecksum,
        });
    }
}

/// Whether `packet` starts with a plausible version 1 base header: long enough, version 1, a
/// known opcode, no reserved flag bit and a zero reserved byte. Extension headers and
/// lengths are the transport's to check.
pub(crate) fn base_header_ok(packet: &[u8]) -> bool {
    let Some(hdr) = packet.get(..BASE_HEADER_LEN) else {
        return false;
    };
    let flags = u16::from_be_bytes([hdr[2], hdr[3]]);
    hdr[0] == crate::transport::wire::VERSION
        && crate::transport::wire::Opcode::from_u8(hdr[1]).is_ok()
        && flags & !Flags::DEFINED == 0
        && hdr[19] == 0
}

/// Payload bytes per MetaRoCE packet on a standard 1500-byte Ethernet link: what fits under
/// `WIRE_OVERHEAD` (1388), rounded down to whole cache lines.
pub(crate) const ETHERNET_PAYLOAD: u32 = 1344;

/// Payload bytes per MetaRoCE packet on a link of `link_mtu`, which both ends of a connection
/// derive alike: the IB MTU that fits, or `ETHERNET_PAYLOAD` on a link of 1500 bytes (up to
/// 2159), whose IB MTU (1024) would leave a quarter of every packet unused.
pub(crate) fn payload_mtu(link_mtu: u32) -> u32 {
    let room = link_mtu.saturating_sub(WIRE_OVERHEAD);
    match mtu::largest_within(room) {
        mtu::MTU_1024 if room >= ETHERNET_PAYLOAD => ETHERNET_PAYLOAD,
        code => mtu::bytes(code).unwrap_or(256),
    }
}

/// The modified EUI-64 of a MAC address (as `addrconf_addr_eui48` builds it), as stored in a
/// `__be64`: the bytes in wire order.
pub(crate) fn node_guid_from_mac(mac: [u8; 6]) -> u64 {
    let eui = [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    u64::from_ne_bytes(eui)
}
