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

    /// The GID that names this address (IPv4 as an IPv4-mapped address).
    pub(crate) fn gid(self) -> [u8; 16] {
        match self.to_v6() {
            IpAddr::V6(g) => g,
            IpAddr::V4(_) => [0; 16],
        }
    }

    /// Whether this is a multicast address (IPv4 224.0.0.0/4, IPv6 ff00::/8).
    pub(crate) fn is_multicast(self) -> bool {
        crate::verbs_core::mcast::is_multicast(&self.gid())
    }
}

/// A node's address as the data path keys peers by it: 16 bytes, an IPv4 address as its
/// IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, as RoCE's GIDs write it); all zeros: none.
/// Ordered bytewise, so that an index of them can be searched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct NodeAddr(pub(crate) [u8; 16]);

impl NodeAddr {
    /// No address (unknown, or a plane with none).
    pub(crate) const NONE: NodeAddr = NodeAddr([0; 16]);

    /// The address a GID names (the GID is already in this form).
    pub(crate) const fn from_gid(g: &[u8; 16]) -> NodeAddr {
        NodeAddr(*g)
    }

    pub(crate) fn from_ip(a: IpAddr) -> NodeAddr {
        match a.to_v6() {
            IpAddr::V6(b) => NodeAddr(b),
            IpAddr::V4(_) => NodeAddr::NONE,
        }
    }

    /// The address to send to: IPv4 if it is IPv4-mapped, else IPv6. `None` for none.
    pub(crate) fn ip(self) -> Option<IpAddr> {
        (!self.is_none()).then(|| IpAddr::from_gid(&self.0))
    }

    pub(crate) fn is_none(self) -> bool {
        self.0 == [0; 16] || self.v4() == Some([0; 4])
    }

    /// The IPv4 address, if IPv4-mapped.
    pub(crate) fn v4(self) -> Option<[u8; 4]> {
        match IpAddr::from_gid(&self.0) {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }

    /// A multicast address (IPv6 `ff00::/8`, IPv4 `224.0.0.0/4`), or IPv4 limited broadcast:
    /// not one a connection can have at its other end.
    pub(crate) fn is_group(self) -> bool {
        match self.v4() {
            Some(a) => a[0] & 0xf0 == 0xe0 || a == [255; 4],
            None => self.0[0] == 0xff,
        }
    }

    /// The address as four words (for [`crate::datapath`]'s lock-free cells).
    pub(crate) fn words(self) -> [u32; 4] {
        core::array::from_fn(|i| {
            let b = &self.0[i * 4..i * 4 + 4];
            u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
        })
    }

    pub(crate) fn from_words(w: [u32; 4]) -> NodeAddr {
        let mut a = [0u8; 16];
        for (chunk, word) in a.chunks_exact_mut(4).zip(w) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        NodeAddr(a)
    }
}

/// For `pr_*!` (the kernel's own `Display`): as below.
impl kernel::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(self, f)
    }
}

/// `a.b.c.d` for an IPv4 address, else IPv6 text with the longest run of zero groups
/// (of two or more) written `::` (RFC 5952).
impl core::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if let Some([a, b, c, d]) = self.v4() {
            return write!(f, "{a}.{b}.{c}.{d}");
        }
        let g: [u16; 8] =
            core::array::from_fn(|i| u16::from_be_bytes([self.0[2 * i], self.0[2 * i + 1]]));
        // The longest run of zero groups, the first of equals.
        let (mut best, mut best_len, mut i) = (0, 0, 0);
        while i < 8 {
            let start = i;
            while i < 8 && g[i] == 0 {
                i += 1;
            }
            if i - start > best_len {
                (best, best_len) = (start, i - start);
            }
            i += 1;
        }
        let mut k = 0;
        while k < 8 {
            if best_len >= 2 && k == best {
                f.write_str(if k == 0 { "::" } else { ":" })?;
                k += best_len;
                continue;
            }
            write!(f, "{:x}", g[k])?;
            if k < 7 {
                f.write_str(":")?;
            }
            k += 1;
        }
        Ok(())
    }
}

/// One received MetaRoCE datagram: its addresses and its UDP payload, which it owns (in the
/// buffer the stack received it in, freed when the packet is dropped).
pub(crate) struct RxPacket {
    /// The sender's address (IP source).
    pub(crate) src: IpAddr,
    /// Our address it was sent to (IP destination).
    pub(crate) dst: IpAddr,
    /// The UDP source port: the path's entropy (see `docs/wire-format.md`).
    pub(crate) src_port: u16,
    /// The IP header carried ECN Congestion Experienced (CE, both ECN bits set).
    pub(crate) ecn_ce: bool,
    /// More datagrams of the same burst follow at once: this is not the last datagram of a
    /// UDP GSO packet, or more are queued on the socket behind it, and they are handed over
    /// one after the other, in this softirq.
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
    /// The UDP checksum is wrong.
    BadChecksum,
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
