// SPDX-License-Identifier: GPL-2.0

//! What the UDP layer ([`crate::sys::udp`]) hands to the rest of the driver: addresses,
//! received datagrams and the receive callback; plus the parsing of the IP header bytes the
//! FFI layer copies out of a received packet. Safe code only.

pub(crate) use crate::sys::udp::RxBuf;

/// An IP address, in network byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IpAddr {
    V4([u8; 4]),
    V6([u8; 16]),
}

impl IpAddr {
    /// The address as IPv6 (IPv4 as an IPv4-mapped address).
    pub(crate) fn to_v6(self) -> IpAddr {
        match self {
            IpAddr::V4(a) => {
                let mut m = [0u8; 16];
                m[10] = 0xff;
                m[11] = 0xff;
                m[12..].copy_from_slice(&a);
                IpAddr::V6(m)
            }
            v6 => v6,
        }
    }

    /// The address a GID names: IPv4 if it is IPv4-mapped, else IPv6.
    pub(crate) fn from_gid(g: &[u8; 16]) -> IpAddr {
        if g[..10].iter().all(|b| *b == 0) && g[10] == 0xff && g[11] == 0xff {
            IpAddr::V4([g[12], g[13], g[14], g[15]])
        } else {
            IpAddr::V6(*g)
        }
    }
}

/// One received MetaRoCE datagram: its addresses and its UDP payload, which it owns (in the
/// buffer the stack received it in, freed when the packet is dropped).
#[allow(dead_code)] // `dst` and `src_port` are for the multi-plane data path.
pub(crate) struct RxPacket {
    /// The sender's address (IP source).
    pub(crate) src: IpAddr,
    /// Our address it was sent to (IP destination).
    pub(crate) dst: IpAddr,
    /// The UDP source port: the path's entropy (see `docs/wire-format.md`).
    pub(crate) src_port: u16,
    /// The IP header carried ECN Congestion Experienced (CE, both ECN bits set).
    pub(crate) ecn_ce: bool,
    /// More datagrams of the same burst follow at once: the stack cut a UDP GSO packet into
    /// datagrams and hands them over one after the other, in this softirq, and this is not
    /// the last of them.
    pub(crate) more: bool,
    /// The UDP payload: the MetaRoCE packet, not yet validated.
    pub(crate) payload: RxBuf,
}

/// Why the UDP layer dropped a datagram before it reached [`RxHandler::receive`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RxDrop {
    /// The packet could not be made linear (no memory).
    NoMemory,
    /// The IP or UDP header is not one we can read (inconsistent offsets or lengths).
    BadHeaders,
}

/// Receives the datagrams of one plane socket.
///
/// Called in softirq context (under RCU, bottom halves disabled): must not sleep, must not
/// block on anything a process-context holder of the same lock could hold with bottom halves
/// enabled, and should be quick. The packet is the handler's: it may keep it.
pub(crate) trait RxHandler: Send + Sync {
    /// A datagram arrived on our port.
    fn receive(&self, pkt: RxPacket);
    /// A datagram arrived but was dropped before it could be handed over.
    fn dropped(&self, why: RxDrop);
}

/// ECN codepoint "Congestion Experienced" (RFC 3168), the low two bits of TOS/traffic class.
pub(crate) const ECN_CE: u8 = 0b11;
/// ECN codepoint ECT(0), what ECN-capable senders put in the IP header.
pub(crate) const ECN_ECT0: u8 = 0b10;

/// Source, destination and ECN CE of an IP header: `hdr` is the bytes from the start of the
/// network header up to the UDP header. `None` if they are not a plausible IPv4 or IPv6
/// header (the stack checked them already; this only guards our own reads).
pub(crate) fn parse_ip_header(hdr: &[u8]) -> Option<(IpAddr, IpAddr, bool)> {
    let first = *hdr.first()?;
    match first >> 4 {
        4 => {
            let h: &[u8; 20] = hdr.get(..20)?.try_into().ok()?;
            let src = IpAddr::V4(h[12..16].try_into().ok()?);
            let dst = IpAddr::V4(h[16..20].try_into().ok()?);
            Some((src, dst, h[1] & ECN_CE == ECN_CE))
        }
        6 => {
            let h: &[u8; 40] = hdr.get(..40)?.try_into().ok()?;
            // Traffic class: the low nibble of byte 0 and the high nibble of byte 1.
            let tclass = (h[0] << 4) | (h[1] >> 4);
            let src = IpAddr::V6(h[8..24].try_into().ok()?);
            let dst = IpAddr::V6(h[24..40].try_into().ok()?);
            Some((src, dst, tclass & ECN_CE == ECN_CE))
        }
        _ => None,
    }
}
