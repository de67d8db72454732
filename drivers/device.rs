// SPDX-License-Identifier: GPL-2.0

//! A metaroce device: its identity and what it reports to the RDMA core.
//!
//! Everything here is safe code working on plain data; `sys::ibdev` calls it from the ops the
//! RDMA core invokes.

use crate::transport::wire::{Flags, BASE_HEADER_LEN};
use crate::{
    counters::{Counter, Counters},
    datapath::Engine,
    net::{IpAddr, RxDrop, RxHandler, RxPacket},
    sys::{bindings, netdev::NetDev},
    verbs::limits,
};
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
        })
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

    /// `query_device`: what this device can do. Verbs that are not implemented yet report 0.
    pub(crate) fn query_device(&self, attr: &mut bindings::ib_device_attr) {
        *attr = bindings::ib_device_attr::default();
        attr.fw_ver = FW_VERSION;
        attr.sys_image_guid = self.node_guid;
        attr.vendor_id = 0xff_ffff;
        attr.vendor_part_id = 0;
        attr.hw_ver = WIRE_VERSION;
        attr.max_mr_size = u64::MAX;
        attr.page_size_cap = 0xffff_f000;
        attr.max_pd = MAX_PD;
        attr.max_pkeys = 1;
        attr.max_qp = limits::MAX_QP;
        attr.max_qp_wr = limits::MAX_QP_WR;
        attr.max_send_sge = limits::MAX_SGE;
        attr.max_recv_sge = limits::MAX_SGE;
        attr.max_sge_rd = limits::MAX_SGE;
        attr.max_cq = limits::MAX_CQ;
        attr.max_cqe = limits::MAX_CQE;
        attr.max_mr = limits::MAX_MR;
        attr.max_srq = limits::MAX_SRQ;
        attr.max_srq_wr = limits::MAX_SRQ_WR;
        attr.max_srq_sge = limits::MAX_SGE;
        attr.max_qp_rd_atom = limits::MAX_RD_ATOM;
        attr.max_qp_init_rd_atom = limits::MAX_RD_ATOM;
        attr.max_res_rd_atom = limits::MAX_RD_ATOM * limits::MAX_QP;
        attr.atomic_cap = bindings::ib_atomic_cap_IB_ATOMIC_HCA;
        attr.max_fast_reg_page_list_len = 0;
        attr.device_cap_flags = bindings::ib_device_cap_flags_IB_DEVICE_RC_RNR_NAK_GEN as u64;
        // `rdma link delete` may remove the device, as it may any soft device's.
        attr.kernel_cap_flags = u64::from(bindings::ib_kernel_cap_flags_IBK_ALLOW_USER_UNREG)
            | u64::from(bindings::ib_kernel_cap_flags_IBK_LOCAL_DMA_LKEY);
    }

    /// `query_port`: the port's state follows its netdev; a port without one (a plane not
    /// added) is down.
    pub(crate) fn query_port(&self, ndev: Option<&NetDev<'_>>, attr: &mut bindings::ib_port_attr) {
        // Speed and width were filled by the caller from the netdev's ethtool settings.
        let (speed, width) = (attr.active_speed, attr.active_width);
        *attr = bindings::ib_port_attr::default();
        attr.active_speed = speed;
        attr.active_width = width;
        attr.gid_tbl_len = 32;
        attr.port_cap_flags = bindings::ib_port_capability_mask_bits_IB_PORT_CM_SUP;
        attr.max_msg_sz = 1 << 31;
        attr.pkey_tbl_len = 1;
        attr.max_mtu = bindings::ib_mtu_IB_MTU_4096;
        let Some(ndev) = ndev else {
            attr.active_mtu = bindings::ib_mtu_IB_MTU_256;
            attr.state = bindings::ib_port_state_IB_PORT_DOWN;
            attr.phys_state = bindings::ib_port_phys_state_IB_PORT_PHYS_STATE_DISABLED as u8;
            return;
        };
        attr.active_mtu = ib_mtu_for(ndev.mtu().saturating_sub(WIRE_OVERHEAD));
        attr.state = ndev.port_state();
        attr.phys_state = if attr.state == bindings::ib_port_state_IB_PORT_ACTIVE {
            bindings::ib_port_phys_state_IB_PORT_PHYS_STATE_LINK_UP as u8
        } else if ndev.is_up() {
            bindings::ib_port_phys_state_IB_PORT_PHYS_STATE_POLLING as u8
        } else {
            bindings::ib_port_phys_state_IB_PORT_PHYS_STATE_DISABLED as u8
        };
    }

    /// The response to `alloc_ucontext` (`ibv_open_device`).
    pub(crate) fn ucontext_response(&self) -> bindings::metaroce_alloc_ucontext_resp {
        bindings::metaroce_alloc_ucontext_resp {
            abi_version: crate::sys::UVERBS_ABI_VERSION,
            wire_version: WIRE_VERSION,
            max_paths: MAX_PATHS,
            max_planes: MAX_PLANES,
            reserved: [0; 2],
        }
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
        match pkt.src {
            IpAddr::V4(src) => self.engine.receive(src, pkt.ecn_ce, pkt.more, pkt.payload),
            // The data path has IPv4 peers only, so far.
            IpAddr::V6(_) => self.counters.inc(Counter::RxNoConnection),
        }
    }

    fn dropped(&self, why: RxDrop) {
        self.counters.inc(match why {
            RxDrop::NoMemory => Counter::RxNoMem,
            RxDrop::BadHeaders => Counter::RxMalformed,
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
    match ib_mtu_for(room) {
        bindings::ib_mtu_IB_MTU_4096 => 4096,
        bindings::ib_mtu_IB_MTU_2048 => 2048,
        bindings::ib_mtu_IB_MTU_1024 if room >= ETHERNET_PAYLOAD => ETHERNET_PAYLOAD,
        bindings::ib_mtu_IB_MTU_1024 => 1024,
        bindings::ib_mtu_IB_MTU_512 => 512,
        _ => 256,
    }
}

/// The largest IB MTU that fits in `bytes` of payload (at least 256).
pub(crate) fn ib_mtu_for(bytes: u32) -> bindings::ib_mtu {
    match bytes {
        4096.. => bindings::ib_mtu_IB_MTU_4096,
        2048.. => bindings::ib_mtu_IB_MTU_2048,
        1024.. => bindings::ib_mtu_IB_MTU_1024,
        512.. => bindings::ib_mtu_IB_MTU_512,
        _ => bindings::ib_mtu_IB_MTU_256,
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
