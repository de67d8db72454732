// SPDX-License-Identifier: GPL-2.0

//! A plane's UDP transport: kernel UDP tunnel sockets on `METAROCE_UDP_PORT`, bound to one
//! netdev, that hand received datagrams to an [`RxHandler`] and send datagrams out through
//! that netdev.
//!
//! A socket receives in one of two ways, and switches between them as its traffic changes:
//! - **one by one** (the default): as a tunnel's, through `encap_rcv`, called for each
//!   datagram. The stack cuts a UDP GSO packet (a train of datagrams that metaroce sent in
//!   one go, e.g. from a namespace over veth) into datagrams first: a copy and an skb each.
//! - **queued**: `encap_rcv` cleared, the stack queues datagrams on the socket as on any UDP
//!   socket, UDP GSO packets whole (the socket accepts them, as with `UDP_GRO`), and
//!   `data_ready` (its `sk_data_ready`) takes them at once and hands out a GSO packet's
//!   datagrams in place. Cheaper per byte, dearer per datagram (the queue's locks and memory
//!   accounting): a 2-byte round trip took 6 us more under TCG.
//!
//! `encap_rcv` switches to queued at a datagram cut from a GSO packet of at least
//! [`TRAIN`] datagrams; `data_ready` switches back after [`SINGLES_TO_ONE_BY_ONE`] datagrams
//! in a row that came alone or in shorter packets (a request and an ACK on the same path go
//! out as one GSO packet of 2: latency-bound traffic). Datagrams the stack is handing over
//! during a switch may take either way; both go to the handler.
//!
//! Life cycle and the rules that make it sound:
//!
//! - [`PlaneSocket::open`] creates an IPv4 socket and, when the kernel has IPv6, an IPv6-only
//!   one, each in the netdev's namespace, bound to its ifindex (`SO_BINDTODEVICE`), so several
//!   planes in one namespace can each own the port on their own netdev. `sk_user_data` points
//!   to an [`RxContext`] in a box the `PlaneSocket` owns.
//! - `encap_rcv` and `data_ready` run in softirq under RCU; they read `sk_user_data` with
//!   `rcu_dereference_sk_user_data` and do nothing if it is null (`data_ready` leaves what is
//!   queued to go with the socket).
//! - [`PlaneSocket::send`] reads the socket pointers under `rcu_read_lock`.
//! - [`PlaneSocket::close`] (also run by `drop`) unpublishes the sockets, waits for a grace
//!   period (no sender holds them any more), releases them (`udp_tunnel_sock_release` clears
//!   `sk_user_data` and closes), and waits for another grace period (no `encap_rcv` or
//!   `data_ready` still uses the context). Only then can the context, and the handler it
//!   holds, be freed.
//! - Kernel sockets hold no reference on their namespace, so a socket must be closed before
//!   its namespace is dismantled: the driver closes it when the netdev unregisters, which
//!   happens (under RTNL) before the namespace's UDP state goes away.

use super::{
    bindings,
    netdev::{NetDev, Rtnl},
    skb::{Dst, Dst6, Route4, Skb},
};
use crate::counters::{Counter, Counters};
use crate::net::{parse_ip_header, IpAddr, RxDrop, RxHandler, RxPacket, ECN_ECT0};
use core::{
    marker::PhantomData,
    mem::size_of,
    ptr,
    sync::atomic::{AtomicPtr, AtomicU32, Ordering},
};
use kernel::{
    error::from_err_ptr,
    ffi::c_int,
    prelude::*,
    sync::{rcu, Arc},
};

/// Our UDP destination port.
pub(crate) const UDP_PORT: u16 = bindings::METAROCE_UDP_PORT as u16;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IPPROTO_UDP: u8 = 17;
/// `IP_DF` in the IPv4 `frag_off` field.
const IP_DF: u16 = 0x4000;
const UDP_HEADER: usize = 8;
/// The segment size for `len` bytes asked as `seg`: at least 1, at most `len` (one datagram).
/// No `clamp` and no division here or in `segments`: their panic paths are calls objtool
/// does not know as noreturn.
fn seg_len(seg: usize, len: usize) -> usize {
    if seg == 0 || seg > len {
        len.max(1)
    } else {
        seg
    }
}

/// Datagrams of `seg` bytes (the last shorter) in `len` bytes: at least 1.
fn segments(len: usize, seg: usize) -> usize {
    match len.checked_div(seg) {
        Some(whole) if whole.saturating_mul(seg) == len => whole.max(1),
        Some(whole) => whole.saturating_add(1),
        None => 1,
    }
}

/// Where the checksum sits in the UDP header.
const UDP_CHECK_OFFSET: u16 = 6;
/// Datagrams in one UDP GSO packet at most (the stack's `UDP_MAX_SEGMENTS` is larger).
pub(crate) const MAX_GSO_SEGS: usize = 64;
const IPV4_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;
/// `encap_type` for our sockets: any non-zero value enables `encap_rcv` (rxe uses 1 too).
const ENCAP_TYPE: u8 = 1;
/// A UDP GSO packet of at least this many datagrams is a train: what the queued way is for.
pub(crate) const TRAIN: u16 = 4;
/// A queued socket goes back to one by one after this many datagrams in a row that came
/// alone or in packets shorter than a [`TRAIN`] (none queued behind them): traffic where the
/// queue's cost per datagram is paid for nothing. A bulk receiver sees a train far more often
/// than that (the sender's retransmissions and probes come alone).
pub(crate) const SINGLES_TO_ONE_BY_ONE: u32 = 32;
/// `MSG_DONTWAIT`: take what is queued, never wait.
const MSG_DONTWAIT: u32 = 0x40;
/// Receive buffer of our sockets, bytes: `data_ready` empties the queue as the stack fills it,
/// so this only has to hold what several CPUs queue at once (a UDP GSO packet is up to 64 KiB).
const RCVBUF: c_int = 4 << 20;

/// What `sk_user_data` points to: everything `encap_rcv` and `data_ready` need.
struct RxContext {
    handler: Arc<dyn RxHandler>,
    /// Datagrams in a row that a queued socket took alone (either socket of the plane).
    singles: AtomicU32,
    counters: Arc<Counters>,
}

/// The UDP sockets of one plane (netdev).
pub(crate) struct PlaneSocket {
    /// The IPv4 socket; null once closed.
    sk4: AtomicPtr<bindings::sock>,
    /// The IPv6 socket; null once closed or if the kernel has no IPv6.
    sk6: AtomicPtr<bindings::sock>,
    /// The namespace of the netdev (and the sockets); valid while a socket is open.
    net: *mut bindings::net,
    ifindex: c_int,
    counters: Arc<Counters>,
    /// Pointed to by the sockets' `sk_user_data` until they are closed.
    rx: KBox<RxContext>,
}

// SAFETY: the raw pointers are only used through the kernel's thread-safe socket and routing
// APIs, under the RCU protocol described in the module documentation; the context is
// immutable and holds only `Send + Sync` data.
unsafe impl Send for PlaneSocket {}
// SAFETY: as above; every method takes `&self` and synchronises through atomics and RCU.
unsafe impl Sync for PlaneSocket {}

impl PlaneSocket {
    /// Opens the plane's sockets on `ndev`: received datagrams go to `handler`; sends and
    /// their failures are counted in `counters` (`tx_*`), as are datagrams dropped before they
    /// reach the handler (`rx_nomem`, `rx_malformed`, `rx_bad_checksum`, through
    /// [`RxHandler::dropped`] too).
    ///
    /// Process context only (creates sockets).
    pub(crate) fn open(
        ndev: &NetDev<'_>,
        handler: Arc<dyn RxHandler>,
        counters: Arc<Counters>,
    ) -> Result<Self> {
        let rx = KBox::new(
            RxContext {
                handler,
                singles: AtomicU32::new(0),
                counters: counters.clone(),
            },
            GFP_KERNEL,
        )?;
        // SAFETY: `ndev` is alive for the call (type invariant); `dev_net` reads its namespace,
        // which lives at least as long as the netdev is registered in it.
        let net = unsafe { bindings::metaroce_glue_dev_net(ndev.as_ptr()) };
        // SAFETY: as above; `ifindex` is fixed while the netdev is registered.
        let ifindex = unsafe { (*ndev.as_ptr()).ifindex };
        let socket = PlaneSocket {
            sk4: AtomicPtr::new(ptr::null_mut()),
            sk6: AtomicPtr::new(ptr::null_mut()),
            net,
            ifindex,
            counters,
            rx,
        };
        let user_data = ptr::from_ref::<RxContext>(&*socket.rx).cast_mut().cast();
        // If anything below fails, dropping `socket` closes what was opened.
        let sk4 = open_socket(net, ifindex, AF_INET, user_data)?;
        socket.sk4.store(sk4, Ordering::Release);
        match open_socket(net, ifindex, AF_INET6, user_data) {
            Ok(sk6) => socket.sk6.store(sk6, Ordering::Release),
            // IPv6 disabled at boot (`ipv6.disable=1`): run IPv4 only.
            Err(e) if e == EAFNOSUPPORT || e == EPFNOSUPPORT => {}
            Err(e) => return Err(e),
        }
        Ok(socket)
    }

    /// Sends `payload` as one UDP datagram from this plane's netdev to `dst`, port
    /// [`UDP_PORT`], with UDP source port `src_port`. The source address is the one the route
    /// chooses; DF is set, the TTL/hop limit is the route's, the UDP checksum is filled in, and
    /// the IP header says ECT(0) when `ecn_capable`.
    ///
    /// Process or softirq context (timers included), not hard IRQ; allocates only the skb
    /// (`GFP_ATOMIC`).
    ///
    /// Errors: `ENETDOWN` once closed (or no IPv6 socket for an IPv6 destination),
    /// the route lookup's error (`ENETUNREACH`, `EHOSTUNREACH`, ...; counted as `tx_no_route`),
    /// `EMSGSIZE` if the datagram exceeds the route's MTU, `ENOMEM`. Every error counts in
    /// `tx_errors`. Success counts `tx_packets` and `tx_bytes`; it means the packet was handed
    /// to the IP stack, which may still drop it (queue full, neighbour unresolved); it returns
    /// the source address the route chose.
    pub(crate) fn send(
        &self,
        dst: &IpAddr,
        src_port: u16,
        ecn_capable: bool,
        payload: &[u8],
    ) -> Result<IpAddr> {
        self.send_segments(dst, src_port, ecn_capable, payload, payload.len())
    }

    /// Sends `payload` as datagrams of `seg` bytes each (the last may be shorter) to the same
    /// destination and ports, handed to the IP stack as one UDP GSO packet (`SKB_GSO_UDP_L4`),
    /// over IPv4 or IPv6: the route, the headers, the qdiscs and a veth are passed once for all of
    /// them; the stack cuts it into datagrams where it must (a device without UDP
    /// segmentation). A receiver such as ours takes it whole once queued (module docs).
    pub(crate) fn send_segments(
        &self,
        dst: &IpAddr,
        src_port: u16,
        ecn_capable: bool,
        payload: &[u8],
        seg: usize,
    ) -> Result<IpAddr> {
        let tos = if ecn_capable { ECN_ECT0 } else { 0 };
        let seg = seg_len(seg, payload.len());
        let segs = segments(payload.len(), seg);
        // Tunnel transmits count their nesting per CPU, so they run with bottom halves
        // disabled, as from a netdev's `ndo_start_xmit`.
        let _bh = BhDisabled::new();
        let result = match dst {
            IpAddr::V4(addr) => self.send4(*addr, src_port, tos, payload, seg),
            IpAddr::V6(addr) => self.send6(addr, src_port, tos, payload, seg),
        };
        match result {
            Ok(_) => {
                self.counters.add(Counter::TxPackets, segs as u64);
                self.counters.add(Counter::TxBytes, payload.len() as u64);
            }
            Err(_) => self.counters.add(Counter::TxErrors, segs as u64),
        }
        result
    }

    fn send4(
        &self,
        daddr: [u8; 4],
        src_port: u16,
        tos: u8,
        payload: &[u8],
        seg: usize,
    ) -> Result<IpAddr> {
        let _rcu = rcu::read_lock();
        let sk = self.sk4.load(Ordering::Acquire);
        if sk.is_null() {
            return Err(ENETDOWN);
        }
        let mut fl4 = bindings::flowi4::default();
        fl4.__fl_common.flowic_oif = self.ifindex;
        fl4.__fl_common.flowic_proto = IPPROTO_UDP;
        fl4.daddr = u32::from_ne_bytes(daddr);
        // The ports feed the multipath hash, so ECMP sees the path's entropy.
        fl4.uli.ports = bindings::flowi_uli__bindgen_ty_1 {
            dport: UDP_PORT.to_be(),
            sport: src_port.to_be(),
        };
        // SAFETY: `sk` is open (we are in the RCU section that `close` waits for after
        // unpublishing it), so its namespace `net` is alive; `fl4` is a live, initialised flow;
        // the result is a held route or an error pointer.
        let rt = unsafe { bindings::metaroce_glue_ip_route_output_key(self.net, &mut fl4) };
        let rt = from_err_ptr(rt).inspect_err(|_| self.counters.inc(Counter::TxNoRoute))?;
        // SAFETY: a route whose reference the lookup gave us.
        let rt = unsafe { Route4::from_raw(rt) }.ok_or(ENETUNREACH)?;
        let dst = rt.dst();
        let skb = self.build_skb(dst, IPV4_HEADER, payload, seg)?;
        let ttl = dst.ip4_hoplimit();
        // SAFETY: `rt` and `skb`, whose ownership the call takes, are a held route and our
        // skb with headroom for the UDP and IP headers the call pushes; `sk` is open (see
        // above); the addresses are the ones the route was looked up for (saddr chosen by the
        // lookup).
        unsafe {
            bindings::udp_tunnel_xmit_skb(
                rt.into_raw(),
                sk,
                skb.into_raw(),
                fl4.saddr,
                fl4.daddr,
                tos,
                ttl,
                IP_DF.to_be(),
                src_port.to_be(),
                UDP_PORT.to_be(),
                false, // xnet: same namespace
                false, // nocheck: the UDP checksum is mandatory for us
                0,
            )
        };
        Ok(IpAddr::V4(fl4.saddr.to_ne_bytes()))
    }

    fn send6(
        &self,
        daddr: &[u8; 16],
        src_port: u16,
        tclass: u8,
        payload: &[u8],
        seg: usize,
    ) -> Result<IpAddr> {
        let _rcu = rcu::read_lock();
        let sk = self.sk6.load(Ordering::Acquire);
        if sk.is_null() {
            return Err(ENETDOWN);
        }
        let mut fl6 = bindings::flowi6::default();
        fl6.__fl_common.flowic_oif = self.ifindex;
        fl6.__fl_common.flowic_proto = IPPROTO_UDP;
        fl6.daddr = bindings::in6_addr {
            in6_u: bindings::in6_addr__bindgen_ty_1 { u6_addr8: *daddr },
        };
        fl6.uli.ports = bindings::flowi_uli__bindgen_ty_1 {
            dport: UDP_PORT.to_be(),
            sport: src_port.to_be(),
        };
        // SAFETY: `sk` is open (see `send4`), so `net` is alive; `fl6` is live and initialised;
        // the call fills in the source address and returns a held entry or an error pointer.
        let dst = unsafe { bindings::ip6_dst_lookup_flow(self.net, sk, &mut fl6, ptr::null()) };
        let dst = from_err_ptr(dst).inspect_err(|_| self.counters.inc(Counter::TxNoRoute))?;
        // SAFETY: an entry whose reference the lookup gave us.
        let dst = unsafe { Dst6::from_raw(dst) }.ok_or(ENETUNREACH)?;
        let route_error = dst.dst().error();
        if route_error != 0 {
            self.counters.inc(Counter::TxNoRoute);
            return Err(Error::from_errno(route_error));
        }
        let skb = self.build_skb(dst.dst(), IPV6_HEADER, payload, seg)?;
        let hop_limit = dst.dst().ip6_hoplimit();
        // SAFETY: `dst` and `skb`, whose ownership the call takes, are a held entry and our
        // skb with headroom for the UDP and IPv6 headers; `sk` is open; the addresses are the
        // flow's, the source chosen by the lookup. No tunnel netdev, so no device statistics.
        unsafe {
            bindings::udp_tunnel6_xmit_skb(
                dst.into_raw(),
                sk,
                skb.into_raw(),
                ptr::null_mut(),
                &fl6.saddr,
                &fl6.daddr,
                tclass,
                hop_limit,
                0, // flow label
                src_port.to_be(),
                UDP_PORT.to_be(),
                false, // nocheck
                0,
            )
        };
        // SAFETY: the lookup filled in the source address; every bit pattern is valid.
        Ok(IpAddr::V6(unsafe { fl6.saddr.in6_u.u6_addr8 }))
    }

    /// An skb holding `payload`, with room in front for the link layer of `dst`'s device, an
    /// IP header of `ip_header` bytes and the UDP header: one datagram, or (`seg` shorter than
    /// `payload`) a UDP GSO packet of datagrams of `seg` bytes. `EMSGSIZE` if a datagram does
    /// not fit the route's MTU.
    fn build_skb(&self, dst: Dst<'_>, ip_header: usize, payload: &[u8], seg: usize) -> Result<Skb> {
        let seg = seg_len(seg, payload.len());
        let datagram = ip_header + UDP_HEADER + seg;
        let total = ip_header + UDP_HEADER + payload.len();
        let segs = segments(payload.len(), seg);
        if datagram > dst.mtu() || total > usize::from(u16::MAX) || segs > MAX_GSO_SEGS {
            return Err(EMSGSIZE);
        }
        let headroom = dst.ll_reserved_space() + ip_header + UDP_HEADER;
        let mut skb = Skb::with_payload(headroom, payload)?;
        if segs > 1 {
            skb.set_udp_gso(seg as u16, segs as u16, UDP_CHECK_OFFSET)?;
        }
        Ok(skb)
    }

    /// The plane's IPv4 address (its netdev's primary one), if it has one and is open.
    pub(crate) fn local_v4(&self) -> Option<[u8; 4]> {
        let _rcu = rcu::read_lock();
        if self.sk4.load(Ordering::Acquire).is_null() {
            return None;
        }
        // SAFETY: the socket is open (we are in the RCU section that `close` waits for after
        // unpublishing it), so its namespace `net` is alive; we hold the RCU read lock the
        // lookup requires, and the netdev it returns stays alive until we leave it.
        let ndev = unsafe { bindings::dev_get_by_index_rcu(self.net, self.ifindex) };
        if ndev.is_null() {
            return None;
        }
        // SAFETY: `ndev` is alive for the RCU section (above); scope 0 (RT_SCOPE_UNIVERSE)
        // asks for a global address, none wanted toward any destination in particular.
        let addr = unsafe { bindings::inet_select_addr(ndev, 0, 0) };
        (addr != 0).then(|| addr.to_ne_bytes())
    }

    /// This plane's netdev while `rtnl` is held, for [`PlaneDev::set_multicast`]; None once
    /// closed.
    pub(crate) fn dev<'r>(&self, _rtnl: &'r Rtnl) -> Option<PlaneDev<'r>> {
        if self.sk4.load(Ordering::Acquire).is_null() {
            return None;
        }
        Some(PlaneDev {
            net: self.net,
            ifindex: self.ifindex,
            _rtnl: PhantomData,
        })
    }

    /// Closes the sockets: afterwards nothing is received and [`Self::send`] fails with
    /// `ENETDOWN`. Waits for in-flight sends and receive callbacks to finish. Idempotent.
    ///
    /// Process context only (sleeps); may hold RTNL.
    pub(crate) fn close(&self) {
        let sk4 = self.sk4.swap(ptr::null_mut(), Ordering::AcqRel);
        let sk6 = self.sk6.swap(ptr::null_mut(), Ordering::AcqRel);
        if sk4.is_null() && sk6.is_null() {
            return;
        }
        // Senders read the pointers under RCU: after this, none still uses them.
        rcu::synchronize_rcu();
        for sk in [sk4, sk6] {
            if !sk.is_null() {
                // SAFETY: `sk` is a socket we opened and nobody else can reach any more (we
                // took the only published pointer); this clears `sk_user_data` and closes it.
                unsafe { bindings::udp_tunnel_sock_release(sk) };
            }
        }
        // A receive callback that read `sk_user_data` before it was cleared runs under RCU:
        // after this, none still uses the context.
        rcu::synchronize_rcu();
    }
}

impl Drop for PlaneSocket {
    fn drop(&mut self) {
        self.close();
    }
}

/// Bottom halves disabled on this CPU while it lives.
struct BhDisabled;

impl BhDisabled {
    fn new() -> Self {
        // SAFETY: not called from hard IRQ (see `PlaneSocket::send`); `drop` re-enables.
        unsafe { bindings::metaroce_glue_local_bh_disable() };
        BhDisabled
    }
}

impl Drop for BhDisabled {
    fn drop(&mut self) {
        // SAFETY: paired with the disable in `new`, on the same CPU (no migration meanwhile).
        unsafe { bindings::metaroce_glue_local_bh_enable() };
    }
}

/// The netdev of an open plane, named while RTNL is held (`'r`). A plane's socket closes when
/// its netdev unregisters, under RTNL, before the netdev's namespace can go
/// (`ibdev::remove_device_of`, `planes::netdev_event`): so while the RTNL hold in which the
/// socket was seen open lasts, its netdev stays registered and its namespace alive, even if
/// the socket is closed meanwhile (device teardown closes it without RTNL).
#[derive(Clone, Copy)]
pub(crate) struct PlaneDev<'r> {
    net: *mut bindings::net,
    ifindex: c_int,
    _rtnl: PhantomData<&'r Rtnl>,
}

impl PlaneDev<'_> {
    /// Joins (`join`) or leaves the IP multicast group `group` on the netdev, as a socket's
    /// `IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP` would: the host then accepts the group's packets
    /// on it (and reports the membership with IGMP or MLD). Joins are counted by the stack, so
    /// each join is undone by one leave. `ENODEV` if the netdev has no IPv4 (IPv6)
    /// configuration, or the stack's error.
    ///
    /// Process context (sleeps).
    pub(crate) fn set_multicast(&self, group: &IpAddr, join: bool) -> Result {
        // SAFETY: RTNL is held for `'r` and the netdev registered in `net` (type invariant),
        // which keeps `net` alive; the lookup needs RTNL, and the netdev it returns stays
        // registered while we hold it.
        let ndev = unsafe { bindings::__dev_get_by_index(self.net, self.ifindex) };
        if ndev.is_null() {
            return Err(ENODEV);
        }
        let ret = match group {
            // SAFETY: `ndev` is registered and RTNL held (above), as the call requires.
            IpAddr::V4(a) => unsafe {
                bindings::metaroce_glue_ip_mc_group(ndev, u32::from_ne_bytes(*a), join)
            },
            IpAddr::V6(a) => {
                let addr = bindings::in6_addr {
                    in6_u: bindings::in6_addr__bindgen_ty_1 { u6_addr8: *a },
                };
                // SAFETY: `ndev` is registered (above); `addr` is live for the call, which
                // copies it. The calls take the device's own multicast lock.
                unsafe {
                    if join {
                        bindings::ipv6_dev_mc_inc(ndev, &addr)
                    } else {
                        bindings::ipv6_dev_mc_dec(ndev, &addr)
                    }
                }
            }
        };
        kernel::error::to_result(ret)
    }
}

/// Creates a UDP tunnel socket of `family` in `net`, bound to `ifindex` and our port, whose
/// `encap_rcv` and `data_ready` receive with `user_data` (an [`RxContext`]), one by one to
/// begin with (module docs).
fn open_socket(
    net: *mut bindings::net,
    ifindex: c_int,
    family: u8,
    user_data: *mut c_void,
) -> Result<*mut bindings::sock> {
    let mut cfg = bindings::udp_port_cfg {
        family,
        local_udp_port: UDP_PORT.to_be(),
        bind_ifindex: ifindex,
        ..Default::default()
    };
    // The IPv6 socket takes IPv6 only (the IPv4 one has the port for IPv4) and checks and
    // fills the UDP checksum (mandatory for us); IPv4 fills it too.
    cfg.set_use_udp_checksums(1);
    cfg.set_use_udp6_tx_checksums(1);
    cfg.set_use_udp6_rx_checksums(1);
    cfg.set_ipv6_v6only(1);
    let mut sock: *mut bindings::socket = ptr::null_mut();
    // SAFETY: `net` is the live namespace of the netdev we are called for; `cfg` and `sock`
    // are live locals; on success `sock` is a kernel socket we own.
    let err = unsafe {
        if family == AF_INET6 {
            bindings::udp_sock_create6(net, &mut cfg, &mut sock)
        } else {
            bindings::udp_sock_create4(net, &mut cfg, &mut sock)
        }
    };
    if err != 0 {
        return Err(Error::from_errno(err));
    }
    // SAFETY: `sock` is the live socket just created; its `sk` is set for a created socket.
    let sk = unsafe { (*sock).sk };
    let mut tunnel = bindings::udp_tunnel_sock_cfg {
        sk_user_data: user_data,
        encap_type: ENCAP_TYPE,
        encap_rcv: Some(encap_rcv),
        ..Default::default()
    };
    // SAFETY: `sk` is our fresh socket in `net`; `user_data` points to an `RxContext` that
    // outlives the socket (see `PlaneSocket::close`); `encap_rcv` and `data_ready` match the
    // callback types and read the user data under RCU.
    unsafe {
        bindings::setup_udp_tunnel_sock(net, sk, &mut tunnel);
        // A tunnel socket asks for received checksums in their final form (`convert_csum`),
        // for the inner packets of encapsulations; we have none. Left on, it made the stack
        // compute the checksum of every datagram it cuts a GSO packet into (`skb_segment`).
        bindings::metaroce_glue_inet_dec_convert_csum(sk);
        // For the queued way (module docs): GSO packets whole, and our `data_ready`.
        bindings::metaroce_glue_udp_accept_gso(sk);
        bindings::metaroce_glue_sk_set_data_ready(sk, Some(data_ready), RCVBUF);
    }
    Ok(sk)
}

/// Switches `sk` to one by one (`encap_rcv` set) or queued (cleared; module docs).
///
/// # Safety
///
/// `sk` must be one of our sockets, live.
unsafe fn set_one_by_one(sk: *mut bindings::sock, one_by_one: bool) {
    let f: Option<unsafe extern "C" fn(*mut bindings::sock, *mut bindings::sk_buff) -> c_int> =
        if one_by_one { Some(encap_rcv) } else { None };
    // SAFETY: `sk` is our live socket, set up as a tunnel's (so the stack reads `encap_rcv`
    // with READ_ONCE, and falls through to queueing while it is null).
    unsafe { bindings::metaroce_glue_udp_set_encap_rcv(sk, f) };
}

/// A received datagram's UDP payload, left in the skb the stack handed us (no copy); our
/// reference to the skb goes (as used) when this is dropped. The datagrams of one UDP GSO
/// packet share its skb, each with its own reference.
pub(crate) struct RxBuf {
    /// Never None but in `drop`.
    skb: Option<Skb>,
    data: *const u8,
    len: usize,
}

// SAFETY: we hold a reference to the skb, whose data nobody changes any more (it was taken
// off the socket's queue, and no one holding a reference writes it), and it may be read and
// released on any CPU, in any context.
unsafe impl Send for RxBuf {}

impl RxBuf {
    /// # Safety
    ///
    /// `skb` must be linear, and `data..data+len` lie in its data, which no holder of a
    /// reference to it changes.
    unsafe fn new(skb: Skb, data: *const u8, len: usize) -> Self {
        RxBuf {
            skb: Some(skb),
            data,
            len,
        }
    }

    /// The payload.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: by `new`'s contract the bytes are in the linear data of the skb we hold,
        // which nothing changes or frees while we hold it.
        unsafe { core::slice::from_raw_parts(self.data, self.len) }
    }
}

impl Drop for RxBuf {
    fn drop(&mut self) {
        if let Some(skb) = self.skb.take() {
            skb.consume();
        }
    }
}

/// The `sk_data_ready` callback of our sockets: the stack queued a datagram, or a UDP GSO
/// packet of several, on `sk`. Takes everything queued and hands every datagram to the
/// handler, in order.
///
/// # Safety
///
/// Called only by the stack, for a socket we set up (in softirq, or with bottom halves
/// disabled).
unsafe extern "C" fn data_ready(sk: *mut bindings::sock) {
    // The handler runs with bottom halves disabled (`RxHandler`), also if the stack ever
    // calls this from process context.
    let _bh = BhDisabled::new();
    let _rcu = rcu::read_lock();
    // SAFETY: `sk` is live for the callback; we hold the RCU read lock.
    let ctx = unsafe { bindings::metaroce_glue_sk_user_data(sk) }.cast::<RxContext>();
    // SAFETY: a non-null `sk_user_data` is our `RxContext`, kept alive until a grace period
    // after it is cleared (see `PlaneSocket::close`), and we are inside that RCU section.
    let Some(ctx) = (unsafe { ctx.as_ref() }) else {
        // Closing: what is queued goes with the socket.
        return;
    };
    let mut retried = false;
    loop {
        let (mut off, mut err) = (0, 0);
        // SAFETY: `sk` is a live UDP socket; the locals are live. Without waiting (it returns
        // null at once when nothing is queued), it dequeues one skb, uncharged from the
        // socket, which is then ours to free.
        let skb = unsafe { bindings::__skb_recv_udp(sk, MSG_DONTWAIT, &mut off, &mut err) };
        // SAFETY: null, or an skb now ours alone (above).
        let Some(skb) = (unsafe { Skb::from_raw(skb) }) else {
            // A pending socket error is reported (and cleared) instead of a datagram: what
            // is queued behind it is taken now, not at the next datagram.
            if err != EAGAIN.to_errno() && !retried {
                retried = true;
                continue;
            }
            break;
        };
        // SAFETY: `sk` is live; this reads whether its queues are empty.
        let more = unsafe { bindings::metaroce_glue_udp_rx_pending(sk) };
        if skb.gso_size() != 0 {
            ctx.counters.inc(Counter::RxGsoWhole);
        }
        if more || skb.gso_segs() >= TRAIN {
            ctx.singles.store(0, Ordering::Relaxed);
        } else if ctx.singles.fetch_add(1, Ordering::Relaxed) + 1 >= SINGLES_TO_ONE_BY_ONE {
            ctx.singles.store(0, Ordering::Relaxed);
            // SAFETY: `sk` is our live socket.
            unsafe { set_one_by_one(sk, true) };
        }
        deliver(ctx, skb, more, false);
        if !more {
            // Whatever another CPU queues from now on, its own call takes.
            break;
        }
    }
}

/// Hands the datagrams in `skb` (one, or a UDP GSO packet's) to `ctx`'s handler after the
/// checks `udp_recvmsg` makes (the checksum's unless `verified`); `more`: others follow at
/// once.
fn deliver(ctx: &RxContext, mut skb: Skb, more: bool, verified: bool) {
    if !verified && !skb.udp_csum_ok() {
        ctx.handler.dropped(RxDrop::BadChecksum);
        return;
    }
    // Linearising may reallocate the head, so the headers are read after.
    if skb.linearize().is_err() {
        ctx.handler.dropped(RxDrop::NoMemory);
        return;
    }
    let parsed = skb.headers().and_then(|(ip, udp)| {
        let (src, dst, ecn_ce) = parse_ip_header(ip)?;
        let src_port = u16::from_be_bytes([*udp.first()?, *udp.get(1)?]);
        let payload = udp.get(UDP_HEADER..)?;
        Some((src, dst, src_port, ecn_ce, payload.as_ptr(), payload.len()))
    });
    let Some((src, dst, src_port, ecn_ce, data, len)) = parsed else {
        ctx.handler.dropped(RxDrop::BadHeaders);
        return;
    };
    // A GSO packet's datagrams are `gso_size` bytes each, the last one shorter.
    let seg = seg_len(usize::from(skb.gso_size()), len);
    let count = segments(len, seg);
    let mut skb = Some(skb);
    let mut at = 0;
    for k in 0..count {
        let n = seg.min(len - at);
        // Every datagram but the last holds a reference of its own; the last takes ours.
        let piece = if k + 1 == count {
            skb.take()
        } else {
            skb.as_ref().map(Skb::share)
        };
        let Some(piece) = piece else {
            return;
        };
        // SAFETY: `skb` is linear and `data..data+len` is its UDP payload (`headers`), of
        // which `at..at+n` is a part (`at + n <= len`); once shared, nobody changes it.
        let payload = unsafe { RxBuf::new(piece, data.add(at), n) };
        ctx.handler.receive(RxPacket {
            src,
            dst,
            src_port,
            ecn_ce,
            more: more || k + 1 < count,
            payload,
        });
        at += n;
    }
}

/// The `encap_rcv` callback (one by one, module docs): a datagram for our port.
///
/// # Safety
///
/// Called only by the UDP stack, in softirq under RCU, for a socket we set up, with an skb we
/// then own (the UDP checksum verified, `data` at the UDP header, trimmed to the UDP length).
unsafe extern "C" fn encap_rcv(sk: *mut bindings::sock, skb: *mut bindings::sk_buff) -> c_int {
    // SAFETY: the skb is ours (see the contract); dropped, it is freed.
    let Some(skb) = (unsafe { Skb::from_raw(skb) }) else {
        return 0;
    };
    // SAFETY: `sk` is live for the callback; the caller holds the RCU read lock.
    let ctx = unsafe { bindings::metaroce_glue_sk_user_data(sk) }.cast::<RxContext>();
    // SAFETY: a non-null `sk_user_data` is our `RxContext`, kept alive until a grace period
    // after it is cleared (see `PlaneSocket::close`), and we are inside that RCU section.
    let Some(ctx) = (unsafe { ctx.as_ref() }) else {
        // Closing: the datagram is dropped.
        return 0;
    };
    let more = skb.more();
    if more && skb.following(usize::from(TRAIN)) + 1 >= usize::from(TRAIN) {
        // Cut from a train: the queued way takes the next ones whole.
        ctx.singles.store(0, Ordering::Relaxed);
        ctx.counters.inc(Counter::RxQueued);
        // SAFETY: `sk` is our live socket.
        unsafe { set_one_by_one(sk, false) };
    }
    deliver(ctx, skb, more, true);
    0
}

const _: () = assert!(size_of::<bindings::udphdr>() == UDP_HEADER);
const _: () = assert!(size_of::<bindings::iphdr>() == IPV4_HEADER);
const _: () = assert!(size_of::<bindings::ipv6hdr>() == IPV6_HEADER);
