// SPDX-License-Identifier: GPL-2.0

//! The planes of a device on the data path (`docs/multiplane.md`): one [`PlaneSocket`] per
//! plane, the peers' addresses on every plane (learned from HELLO), and the HELLO exchange.
//!
//! - Plane `k` is port `k + 1` of the device; plane 0 is the netdev `rdma link add` named, the
//!   others are added and removed at run time (`sys::planes`).
//! - A connection's paths are spread over the local planes (`Connection::set_planes`); a plane
//!   carries packets toward a peer only while the local plane exists and its link is up and the
//!   peer's address on it is known (`Connection::set_plane_up`).
//! - HELLO goes out on plane 0 (or, while plane 0 is down, the first plane that can reach the
//!   peer) when a connection is created, whenever the local plane set changes, and every 100 ms
//!   until the peer's own HELLO arrives, as long as the peer has QPs.
//! - HELLO carries the connection ids (`docs/wire-format.md`, HELLO): each end's, random, for
//!   the other; only a HELLO that carries ours proves its sender and may change what we know
//!   of the peer (its id, plane addresses, paths); the connection sends nothing until the
//!   peer's id is known. Others are answered (rate-limited) and counted, and change nothing.
//! - Lock order: a peer's lock, then the planes' lock. Nothing is taken under the latter.

use super::{addrcell::AddrCell, Conn, Engine, Peer, StreamId, MAX_DATAGRAM};
use crate::{
    counters::Counter,
    device::DeviceRx,
    net::{IpAddr, NodeAddr, RxHandler},
    sys::{
        netdev::{NetDev, Rtnl},
        udp::{PlaneDev, PlaneSocket},
    },
    transport::wire::{
        BaseHeader, Ext, Flags, HelloEntry, HelloHeader, Opcode, Packet, PlaneAddr,
        DEFAULT_PEER_PATHS, HELLO_HEADER_LEN,
    },
};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use kernel::{prelude::*, sync::Arc};

/// Planes one device may span (= its ports).
pub(crate) const MAX_PLANES: usize = crate::device::MAX_PLANES as usize;
/// HELLO is repeated this often until the peer's arrives.
const HELLO_INTERVAL_NS: u64 = 100_000_000;
/// An unproven HELLO is answered, and prompts our own, at most this often per peer.
const HELLO_ANSWER_NS: u64 = 10_000_000;
/// One plane of this device: its socket and whether its link is up.
pub(crate) struct LocalPlane {
    socket: PlaneSocket,
    up: bool,
}

/// The planes of this device, by plane number.
pub(crate) type LocalPlanes = [Option<LocalPlane>; MAX_PLANES];

/// What this device knows of a peer's planes. Atomics, so the receive path can find a peer by
/// any of its addresses without a lock.
pub(crate) struct PeerPlanes {
    /// The peer's address on each plane (none: unknown). Plane 0's is the address the QPs
    /// named (IPv4 or IPv6); the others are the IPv4 addresses its HELLO gave.
    addrs: [AddrCell; MAX_PLANES],
    /// Our connection id for the peer (what its packets carry): random, nonzero, fixed.
    local_id: u32,
    /// The peer's connection id for us, from its last proven HELLO; 0: not known yet.
    remote_id: AtomicU32,
    /// When we last answered an unproven HELLO (0: never).
    answered_ns: AtomicU64,
    /// The peer's epoch, from its last HELLO (0 before).
    epoch: AtomicU32,
    /// The peer's HELLO arrived since ours last changed.
    heard: AtomicBool,
    /// When our last HELLO with `reply` set went out (0: not yet).
    hello_sent_ns: AtomicU64,
    /// The peer's payload MTU differs from ours (said once in the kernel log).
    mtu_mismatch: AtomicBool,
}

impl PeerPlanes {
    pub(super) fn new(plane0: NodeAddr, local_id: u32) -> Self {
        let planes = PeerPlanes {
            addrs: [const { AddrCell::new() }; MAX_PLANES],
            local_id,
            remote_id: AtomicU32::new(0),
            answered_ns: AtomicU64::new(0),
            epoch: AtomicU32::new(0),
            heard: AtomicBool::new(false),
            hello_sent_ns: AtomicU64::new(0),
            mtu_mismatch: AtomicBool::new(false),
        };
        if let Some(a) = planes.addrs.first() {
            a.swap(plane0);
        }
        planes
    }

    /// The peer's addresses, by plane (none: unknown).
    pub(super) fn addrs(&self) -> [NodeAddr; MAX_PLANES] {
        core::array::from_fn(|k| self.addrs.get(k).map_or(NodeAddr::NONE, AddrCell::load))
    }

    /// Whether `addr` is the peer's address on one of its planes.
    pub(super) fn has(&self, addr: NodeAddr) -> bool {
        !addr.is_none() && self.addrs.iter().any(|x| x.load() == addr)
    }

    /// The peer's connection id for us, once a proven HELLO said it.
    fn remote_id(&self) -> Option<u32> {
        let id = self.remote_id.load(Ordering::Relaxed);
        (id != 0).then_some(id)
    }

    /// The peer's address on `plane`, if known.
    fn addr(&self, plane: usize) -> Option<NodeAddr> {
        let a = self.addrs.get(plane)?.load();
        (!a.is_none()).then_some(a)
    }
}

/// A datagram of our own making (HELLO): base header, HELLO header, one entry per plane.
const HELLO_MAX: usize = 32 + HELLO_HEADER_LEN + 20 * MAX_PLANES;
const _: () = assert!(HELLO_MAX <= MAX_DATAGRAM);

impl Engine {
    /// The device's epoch for HELLO: random, nonzero.
    pub(super) fn new_epoch() -> u32 {
        (crate::sys::work::random_u64() as u32) | 1
    }

    /// Opens plane 0's socket (device creation).
    pub(super) fn open_plane0(self: &Arc<Self>, ndev: &NetDev<'_>) -> Result {
        let socket = self.open_socket(ndev, 0)?;
        let up = ndev.link_up();
        if let Some(slot) = self.planes.lock().get_mut(0) {
            *slot = Some(LocalPlane { socket, up });
        }
        Ok(())
    }

    fn open_socket(self: &Arc<Self>, ndev: &NetDev<'_>, plane: usize) -> Result<PlaneSocket> {
        // The socket's handler holds the engine: `shutdown` breaks that cycle.
        let counters = self.plane_counters.get(plane).ok_or(EINVAL)?.clone();
        let rx: Arc<dyn RxHandler> = Arc::new(
            DeviceRx::new(counters.clone(), self.clone(), plane as u8),
            GFP_KERNEL,
        )?;
        PlaneSocket::open(ndev, rx, counters)
    }

    /// Whether the device is alive (plane 0 open; `shutdown` closes every plane).
    pub(crate) fn is_open(&self) -> bool {
        self.planes.lock().first().is_some_and(Option::is_some)
    }

    /// Adds plane `plane` on `ndev`: opens its socket, then spreads every connection over the
    /// new plane set and tells the peers (HELLO). `EBUSY` if the plane exists, `ENODEV` if the
    /// device is shutting down.
    ///
    /// Process context (opens sockets).
    pub(crate) fn add_plane(self: &Arc<Self>, plane: usize, ndev: &NetDev<'_>) -> Result {
        if plane == 0 || plane >= MAX_PLANES {
            return Err(EINVAL);
        }
        if !self.is_open() {
            return Err(ENODEV);
        }
        let socket = self.open_socket(ndev, plane)?;
        let up = ndev.link_up();
        {
            let mut planes = self.planes.lock();
            let slot = planes.get_mut(plane).ok_or(EINVAL)?;
            if slot.is_some() {
                return Err(EBUSY);
            }
            *slot = Some(LocalPlane { socket, up });
        }
        self.planes_changed();
        Ok(())
    }

    /// Removes plane `plane` (closes its socket); what was in flight on it is recovered on the
    /// other planes. Process context (waits for RCU).
    pub(crate) fn remove_plane(self: &Arc<Self>, plane: usize) {
        let old = self.planes.lock().get_mut(plane).and_then(Option::take);
        if old.is_some() {
            // Closes the socket outside the lock.
            drop(old);
            self.planes_changed();
        }
    }

    /// Plane `plane`'s link went up or down: its paths carry packets again, or stop.
    pub(crate) fn set_plane_link(self: &Arc<Self>, plane: usize, up: bool) {
        let changed = match self.planes.lock().get_mut(plane) {
            Some(Some(lp)) if lp.up != up => {
                lp.up = up;
                true
            }
            _ => false,
        };
        if changed {
            for peer in self.peer_list().iter() {
                let mut p = peer.inner.lock();
                self.apply_planes(peer, &mut p.conn);
                self.run(peer, &mut p);
            }
        }
    }

    /// The device's first plane's netdev changed its MTU to `link_mtu` (`NETDEV_CHANGEMTU`).
    /// When that changes the device's packet size (`device::payload_mtu`), new connections take
    /// the new size, and each connection made with another one is retired: it cannot talk to a
    /// peer that made its own with the new size (each end rejects the other's full-size
    /// packets), nor, when the size shrank, fit the link. Its QPs move to the error state with
    /// `IB_EVENT_QP_FATAL` (what the transport held flushes first, then the rings, as for a
    /// broken ring), and its peer leaves the table, so that a new QP toward that device makes a
    /// new connection. The others' planes keep their own links: a plane whose link cannot carry
    /// the packets fails its paths (`EMSGSIZE`), and the connections avoid it.
    ///
    /// Process context.
    pub(crate) fn set_link_mtu(self: &Arc<Self>, link_mtu: u32) {
        let mtu = crate::device::payload_mtu(link_mtu);
        let old = self.mtu.swap(mtu, Ordering::AcqRel);
        if old == mtu {
            return;
        }
        let mut retired = 0u32;
        for peer in self.peer_list().iter() {
            let mut p = peer.inner.lock();
            if p.conn.config().mtu == mtu {
                continue;
            }
            let inner = &mut *p;
            for (i, slot) in inner.qps.iter_mut().enumerate() {
                let Some(qp) = slot.qp.clone() else {
                    continue;
                };
                let sid = StreamId(i as u16);
                if qp.fatal(&mut qp.inner.lock()) {
                    let _ = inner.conn.fail_stream(sid);
                    slot.failed = true;
                }
                slot.queue(&mut inner.feed, sid);
            }
            self.run(peer, &mut p);
            if !p.removed {
                p.removed = true;
                let addrs = peer.planes.addrs();
                let gone = self.peers.lock().remove(peer, &addrs);
                drop(gone);
            }
            retired += 1;
        }
        pr_info!(
            "link MTU {link_mtu}: packets of {mtu} payload bytes (were {old}); {retired} connections retired\n"
        );
    }

    /// The local plane set changed: every peer is told again (HELLO until answered).
    fn planes_changed(self: &Arc<Self>) {
        for peer in self.peer_list().iter() {
            peer.planes.heard.store(false, Ordering::Relaxed);
            peer.planes.hello_sent_ns.store(0, Ordering::Relaxed);
            let mut p = peer.inner.lock();
            self.apply_planes(peer, &mut p.conn);
            self.run(peer, &mut p);
        }
    }

    /// The peers, to work on without holding the list's lock. Process context (the list
    /// is allocated before the lock is taken; peers added meanwhile are left out).
    pub(super) fn peer_list(&self) -> KVec<Arc<Peer>> {
        let n = self.peers.lock().len();
        let Ok(mut v) = KVec::with_capacity(n, GFP_KERNEL) else {
            return KVec::new();
        };
        for p in self.peers.lock().iter().take(n) {
            // Within the capacity: no allocation.
            if v.push(p.clone(), GFP_ATOMIC).is_err() {
                break;
            }
        }
        v
    }

    /// Spreads `conn` (the connection to `peer`) over the local planes and lets a plane carry
    /// packets only while it exists here, its link is up and the peer's address on it is known,
    /// and none before the peer's connection id is (its packets would be dropped).
    pub(super) fn apply_planes(&self, peer: &Peer, conn: &mut Conn) {
        let mut up = [false; MAX_PLANES];
        let mut count = 1;
        {
            let planes = self.planes.lock();
            for (k, (lp, u)) in planes.iter().zip(up.iter_mut()).enumerate() {
                if let Some(lp) = lp {
                    count = k + 1;
                    *u = lp.up;
                }
            }
        }
        conn.set_planes(count as u8);
        let known = peer.planes.remote_id().is_some();
        for (k, u) in up.iter().enumerate() {
            conn.set_plane_up(k as u8, known && *u && peer.planes.addr(k).is_some());
        }
    }

    /// Sends a batch of datagrams of `peer`'s connection, all of one path (`buf[..b.end]`), on
    /// its plane, to the peer's address there: one UDP GSO packet.
    pub(super) fn transmit_batch(&self, peer: &Peer, b: &super::TxBatch, buf: &[u8]) {
        let data = buf.get(..b.end).unwrap_or(&[]);
        let plane = usize::from(b.plane);
        let Some(dst) = peer.planes.addr(plane).and_then(NodeAddr::ip) else {
            self.counters.add(Counter::TxErrors, b.count as u64);
            return;
        };
        // A lost datagram is the transport's to resend.
        self.send_segments_on(plane, &dst, b.src_port, b.ecn, data, b.seg, b.count);
    }

    /// Sends a datagram on `plane` to `dst`. Its socket counts what it sends and what fails
    /// (`tx_packets`, `tx_errors`); a plane that does not exist counts in `tx_errors` here.
    /// The source address the route chose, if the datagram was handed to the IP stack.
    pub(super) fn send_on(
        &self,
        plane: usize,
        dst: &IpAddr,
        src_port: u16,
        ecn: bool,
        data: &[u8],
    ) -> Option<IpAddr> {
        self.send_segments_on(plane, dst, src_port, ecn, data, data.len(), 1)
    }

    /// Sends `data`, `count` datagrams of `seg` bytes (the last may be shorter), on `plane`
    /// to `dst`, as `send_on` sends one; the source address as `send_on` returns it.
    #[allow(clippy::too_many_arguments)]
    fn send_segments_on(
        &self,
        plane: usize,
        dst: &IpAddr,
        src_port: u16,
        ecn: bool,
        data: &[u8],
        seg: usize,
        count: usize,
    ) -> Option<IpAddr> {
        match self.planes.lock().get(plane) {
            Some(Some(lp)) => lp.socket.send_segments(dst, src_port, ecn, data, seg).ok(),
            _ => {
                self.counters.add(Counter::TxErrors, count as u64);
                None
            }
        }
    }

    /// Sends our HELLO to `peer`, whose connection has `paths` paths: on plane 0, or while
    /// that cannot reach the peer, on the first plane that can. `echo`: the base header's
    /// `conn_id`, the peer's id as we know it or as the HELLO we answer gave it (0: none).
    fn send_hello(&self, peer: &Peer, paths: usize, reply: bool, echo: u32, now: u64) {
        let planes = self.planes.lock();
        let mtu = u16::try_from(self.mtu()).unwrap_or(u16::MAX);
        let mut entries = [HelloEntry {
            plane: 0,
            addr: PlaneAddr::V4([0; 4]),
            mtu,
        }; MAX_PLANES];
        let mut n = 0;
        for (k, lp) in planes.iter().enumerate() {
            let (Some(lp), Some(e)) = (lp, entries.get_mut(n)) else {
                continue;
            };
            // A plane without an IPv4 address cannot be reached: not announced.
            if let Some(a) = lp.socket.local_v4() {
                *e = HelloEntry {
                    plane: k as u8,
                    addr: PlaneAddr::V4(a),
                    mtu,
                };
                n += 1;
            }
        }
        let base = BaseHeader {
            opcode: Opcode::Hello,
            flags: Flags::default(),
            dst_qp: 0,
            src_qp: 0,
            conn_id: echo,
            path_id: 0,
            plane: 0,
            psn: 0,
            msn: 0,
            timestamp: now as u32,
        };
        let mut buf = [0u8; HELLO_MAX];
        let hello = HelloHeader {
            reply,
            plane_count: 0,
            paths: u16::try_from(paths).unwrap_or(u16::MAX),
            epoch: self.epoch,
            conn_id: peer.planes.local_id,
        };
        let Ok(len) = Packet::emit_hello(&mut buf, base, hello, entries.get(..n).unwrap_or(&[]))
        else {
            return;
        };
        let target = planes.iter().enumerate().find_map(|(k, lp)| match lp {
            Some(lp) if lp.up => Some((lp, peer.planes.addr(k)?.ip()?)),
            _ => None,
        });
        if let (Some((lp, dst)), Some(data)) = (target, buf.get(..len)) {
            let _ = lp.socket.send(&dst, super::random_port(), false, data);
        }
    }

    /// While `peer`'s planes are unheard: sends HELLO (asking for one back) if none went out
    /// in the last 100 ms. Returns when the next one is due, if one is.
    pub(super) fn hello_tick(&self, peer: &Peer, paths: usize, now: u64) -> Option<u64> {
        let pp = &peer.planes;
        if pp.heard.load(Ordering::Relaxed) {
            return None;
        }
        let last = pp.hello_sent_ns.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < HELLO_INTERVAL_NS {
            return Some(last + HELLO_INTERVAL_NS);
        }
        self.send_hello(peer, paths, true, pp.remote_id().unwrap_or(0), now);
        pp.hello_sent_ns.store(now.max(1), Ordering::Relaxed);
        Some(now + HELLO_INTERVAL_NS)
    }

    /// A packet from `peer`'s address named a connection id that is not ours: the peer's
    /// connection does not know this one (it missed the HELLO that proved it, and neither side
    /// repeats HELLO once it has heard the other). Our HELLO, proving us with the peer's id as
    /// we know it and asking for one back, mends that; at most every `HELLO_ANSWER_NS`, as
    /// any answer to unproven input is.
    pub(super) fn on_wrong_connection(&self, peer: &Peer, paths: usize, now: u64) {
        let pp = &peer.planes;
        if let Some(id) = pp.remote_id() {
            if Self::answer_due(&pp.hello_sent_ns, now) {
                self.send_hello(peer, paths, true, id, now);
            }
        }
    }

    /// Whether the stamp `at` (0: never) is at least `HELLO_ANSWER_NS` old; if so, it is set
    /// to `now`.
    fn answer_due(at: &AtomicU64, now: u64) -> bool {
        let last = at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < HELLO_ANSWER_NS {
            return false;
        }
        at.store(now.max(1), Ordering::Relaxed);
        true
    }

    /// Whether `addr` is an address of a peer device other than `peer`.
    fn belongs_to_another(&self, peer: &Peer, addr: NodeAddr) -> bool {
        self.peers
            .lock()
            .find(addr)
            .is_some_and(|q| !core::ptr::eq::<Peer>(&**q, peer))
    }

    /// A HELLO from `peer`'s address (the connection `conn`) arrived. Proven (it carries our
    /// id for the peer): the peer's id, planes and paths are recorded and used, and it is
    /// answered if it asks. Not proven: nothing changes; it is answered with a HELLO that
    /// proves us to its sender, and prompts our own when it names an id we do not know, both
    /// at most every `HELLO_ANSWER_NS`. Returns whether the peer proved a new connection id
    /// (its connection to us is a new one, and ours restarted its paths).
    pub(super) fn on_hello(&self, peer: &Peer, conn: &mut Conn, data: &[u8], now: u64) -> bool {
        let Ok(view) = Packet::parse(data) else {
            self.counters.inc(Counter::RxMalformed);
            return false;
        };
        let Ext::Hello(h) = view.header.ext else {
            return false;
        };
        let pp = &peer.planes;
        if view.header.base.conn_id != pp.local_id {
            self.counters.inc(Counter::HelloUnproven);
            if h.reply && Self::answer_due(&pp.answered_ns, now) {
                self.send_hello(peer, conn.path_count(), false, h.conn_id, now);
            }
            if pp.remote_id() != Some(h.conn_id) && Self::answer_due(&pp.hello_sent_ns, now) {
                self.send_hello(
                    peer,
                    conn.path_count(),
                    true,
                    pp.remote_id().unwrap_or(0),
                    now,
                );
            }
            return false;
        }
        let mut addrs = [NodeAddr::NONE; MAX_PLANES];
        let mut theirs_mtu = 0;
        for e in view.hello_entries() {
            theirs_mtu = theirs_mtu.max(e.mtu);
            // The planes beyond 0 are reached over IPv4 (HELLO's IPv6 entries are not used
            // yet); an address of another peer device is not this one's to claim.
            if let (PlaneAddr::V4(a), Some(slot)) = (e.addr, addrs.get_mut(usize::from(e.plane))) {
                let a = NodeAddr::from_ip(IpAddr::V4(a));
                if !self.belongs_to_another(peer, a) {
                    *slot = a;
                }
            }
        }
        // Both ends derive the payload MTU from their links' (`device::payload_mtu`); with
        // different ones each rejects the other's full-size packets (not at its MTU's
        // offsets), and QPs fail with retries exceeded. Said, as it cannot be mended here.
        if theirs_mtu != 0 && u32::from(theirs_mtu) != self.mtu() {
            self.counters.inc(Counter::HelloMtuMismatch);
            if !pp.mtu_mismatch.swap(true, Ordering::Relaxed) {
                let a = pp.addr(0).unwrap_or(NodeAddr::NONE);
                pr_warn!(
                    "peer {a} sends {theirs_mtu}-byte packets, this device {}: their links' \
                     MTUs must match\n",
                    self.mtu()
                );
            }
        }
        // Plane 0 stays the address the QPs named: that is how the peer was found. The
        // others are indexed, so that the peer's datagrams from them find it.
        let plane0 = pp.addr(0).unwrap_or(NodeAddr::NONE);
        for (slot, a) in pp.addrs.iter().zip(addrs.iter()).skip(1) {
            let old = slot.swap(*a);
            if old != *a {
                self.peers.lock().readdress(peer, plane0, old, *a);
            }
        }
        pp.epoch.store(h.epoch, Ordering::Relaxed);
        let old = pp.remote_id.swap(h.conn_id, Ordering::Relaxed);
        conn.set_remote_conn_id(h.conn_id);
        let restarted = old != 0 && old != h.conn_id;
        if restarted {
            // The peer's connection to us is a new one (its device was created again, or it
            // freed its connection with its last QP): its PSN spaces start afresh, so ours do.
            conn.restart_paths(now);
            self.counters.inc(Counter::PeerRestarts);
        }
        pp.heard.store(true, Ordering::Relaxed);
        self.apply_planes(peer, conn);
        // We send on as many paths as both connections have.
        let theirs = if h.paths == 0 {
            DEFAULT_PEER_PATHS
        } else {
            h.paths
        };
        conn.set_send_paths(usize::from(theirs));
        if h.reply {
            self.send_hello(peer, conn.path_count(), false, h.conn_id, now);
        }
        restarted
    }

    /// The netdev of every plane there is, while `rtnl` is held.
    pub(super) fn plane_devs<'r>(&self, rtnl: &'r Rtnl) -> [Option<PlaneDev<'r>>; MAX_PLANES] {
        let planes = self.planes.lock();
        core::array::from_fn(|i| {
            planes
                .get(i)
                .and_then(Option::as_ref)
                .and_then(|lp| lp.socket.dev(rtnl))
        })
    }

    /// Closes every plane's socket (device going away).
    pub(super) fn close_planes(&self) {
        let planes: LocalPlanes =
            core::mem::replace(&mut *self.planes.lock(), [const { None }; MAX_PLANES]);
        drop(planes);
    }
}

impl Engine {
    /// The `peers` file: per peer, its address and connection, then a line for each path
    /// that is not Active or has packets unresolved (a page holds about 40 lines).
    /// Diagnostics, not an interface: the format may change.
    pub(crate) fn describe_peers(&self, w: &mut impl core::fmt::Write) {
        let _ = write!(
            w,
            "rxq {} dgq {} threads",
            self.rx_queued(),
            self.dg_queued()
        );
        if let Some(t) = &*self.rx_thread.lock() {
            t.pending(|i, bits| {
                let _ = write!(w, " {i}:{bits}");
            });
        }
        let _ = writeln!(w);
        for peer in self.peer_list().iter() {
            let addr = peer.planes.addr(0).unwrap_or(NodeAddr::NONE);
            let p = peer.inner.lock();
            let conn = &p.conn;
            let s = conn.stats();
            let cc = conn.congestion();
            // Packets acknowledged after a later one of their path, and of those declared
            // lost, the ones acknowledged after all (spurious retransmissions); tails an early
            // probe handed back to be sent again.
            let (mut reordered, mut spurious, mut tail_resends) = (0u64, 0u64, 0u64);
            for i in 0..conn.path_count() {
                if let Some(path) = conn.path(i) {
                    reordered += path.stats.reordered;
                    spurious += path.stats.spurious;
                    tail_resends += path.stats.tail_resends;
                }
            }
            let _ = write!(
                w,
                "peer {addr} qps {} paths {}/{} in {} out {} dropped_in {} retx {} \
                 timeouts {} reordered {reordered} spurious {spurious} \
                 tail_resends {tail_resends} acks {}/{} cwnd {} \
                 pace {} grant_in {} grant_out {}",
                p.attached,
                conn.send_paths(),
                conn.path_count(),
                s.packets_in,
                s.packets_out,
                s.dropped_in,
                s.retransmits,
                s.timeouts,
                s.acks_in,
                s.acks_out,
                cc.window(),
                cc.pacing_rate(),
                cc.grant().rate_mbps,
                conn.grant_out().rate_mbps,
            );
            // Whether the peer proved itself (its connection id known; the ids themselves are
            // not shown: the file is world-readable) and its addresses on its planes.
            let _ = write!(w, " proven {}", u8::from(peer.planes.remote_id().is_some()));
            for k in 0..MAX_PLANES {
                if let Some(a) = peer.planes.addr(k) {
                    let _ = write!(w, " plane{k} {a}");
                }
            }
            let _ = writeln!(w);
            for i in 0..conn.path_count() {
                let Some(path) = conn.path(i) else { continue };
                if path.state == crate::transport::connection::path::PathState::Active
                    && path.inflight.unresolved() == 0
                {
                    continue;
                }
                let st = &path.stats;
                let _ = writeln!(
                    w,
                    " path {i} {:?} sport {} unres {} cwnd {} srtt {} rto {} sent {} acked {} \
                     lost {} to {} rx {} dup {} cum {}",
                    path.state,
                    path.sport,
                    path.inflight.unresolved(),
                    path.cc.cwnd(),
                    path.rtt.srtt() / 1000,
                    path.rtt.rto() / 1000,
                    st.sent,
                    st.acked,
                    st.lost,
                    st.timeouts,
                    st.received,
                    st.duplicates,
                    path.recv.cum(),
                );
            }
        }
    }
}
