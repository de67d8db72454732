// SPDX-License-Identifier: GPL-2.0

//! The device's UDP socket: a kernel UDP tunnel socket on port 4793 in the netdev's network
//! namespace, bound to that netdev (so several devices in one namespace each have their own),
//! receiving through `encap_rcv` and sending with `udp_tunnel_xmit_skb`.
//!
//! IPv4 for now. Every datagram that arrives is handed, as bytes, to the device's data path
//! ([`Engine::receive`]); nothing here interprets it.

use super::{bindings, netdev::NetDev};
use crate::datapath::{Engine, Transmitter};
use core::ptr::{self, NonNull};
use kernel::{
    ffi::c_int,
    prelude::*,
    sync::{Arc, ArcBorrow},
};

const UDP_HDR: usize = 8;
const IP_HDR: usize = 20;
/// `IP_DF` in network order.
const DF: u16 = 0x4000;
/// ECT(0) in the IP TOS byte.
const ECT0: u8 = 0x02;

/// An open UDP tunnel socket; released on drop.
pub(crate) struct UdpSocket {
    sock: NonNull<bindings::socket>,
    net: NonNull<bindings::net>,
    ifindex: c_int,
    port: u16,
}

// SAFETY: the socket is a kernel object usable from any thread; we only release it in drop.
unsafe impl Send for UdpSocket {}
// SAFETY: sending on a kernel socket from several threads at once is allowed.
unsafe impl Sync for UdpSocket {}

impl UdpSocket {
    /// Opens the socket on `ndev` and delivers what arrives to `engine`.
    ///
    /// The socket keeps a non-counted pointer to `engine`: the caller must drop the socket
    /// before the last reference to `engine` goes (dropping waits out every receive call).
    pub(crate) fn open(ndev: &NetDev<'_>, engine: &Arc<Engine>) -> Result<Self> {
        let port = bindings::METAROCE_UDP_PORT as u16;
        // SAFETY: `ndev` is alive for the call; its namespace outlives its devices.
        let net = NonNull::new(unsafe { bindings::metaroce_glue_dev_net(ndev.as_ptr()) })
            .ok_or(EINVAL)?;
        // SAFETY: the netdev is alive for the call.
        let ifindex = unsafe { (*ndev.as_ptr()).ifindex };
        let mut cfg = bindings::udp_port_cfg {
            family: bindings::AF_INET as u8,
            local_udp_port: port.to_be(),
            bind_ifindex: ifindex,
            ..Default::default()
        };
        let mut sock: *mut bindings::socket = ptr::null_mut();
        // SAFETY: `net` is live; on success `sock` is a socket we own.
        let err = unsafe { bindings::metaroce_glue_udp_sock_create(net.as_ptr(), &mut cfg, &mut sock) };
        if err != 0 {
            return Err(Error::from_errno(err));
        }
        let sock = NonNull::new(sock).ok_or(ENOMEM)?;
        let mut tcfg = bindings::udp_tunnel_sock_cfg {
            sk_user_data: Arc::as_ptr(engine).cast_mut().cast(),
            encap_type: 1,
            encap_rcv: Some(encap_rcv),
            ..Default::default()
        };
        // SAFETY: the socket is ours and unused so far; after this `encap_rcv` may run with
        // our engine pointer, which stays valid until `drop` (see above).
        unsafe { bindings::setup_udp_tunnel_sock(net.as_ptr(), (*sock.as_ptr()).sk, &mut tcfg) };
        Ok(UdpSocket {
            sock,
            net,
            ifindex,
            port,
        })
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        // SAFETY: ours since `open`; the release unhooks `encap_rcv` and waits an RCU grace
        // period, so no receive call is running or will start afterwards.
        unsafe { bindings::udp_tunnel_sock_release((*self.sock.as_ptr()).sk) }
    }
}

impl Transmitter for UdpSocket {
    fn send(&self, dst: [u8; 4], src_port: u16, ecn_capable: bool, payload: &[u8]) -> Result {
        let daddr = u32::from_ne_bytes(dst);
        let mut fl = bindings::flowi4::default();
        fl.__fl_common.flowic_oif = self.ifindex;
        fl.__fl_common.flowic_proto = bindings::IPPROTO_UDP as u8;
        fl.daddr = daddr;
        // SAFETY: the namespace outlives the socket; `fl` is a valid flow key.
        let rt = unsafe { bindings::metaroce_glue_ip_route_output_key(self.net.as_ptr(), &mut fl) };
        if rt.is_null() || (-4095..0).contains(&(rt as isize)) {
            return Err(ENETUNREACH);
        }
        // SAFETY: `rt` is a route we hold until `ip_rt_put` or the transmit consumes it.
        let (dev, ttl) = unsafe {
            (
                bindings::metaroce_glue_rt_dev(rt),
                bindings::metaroce_glue_ip4_dst_hoplimit(rt),
            )
        };
        // SAFETY: the route's device is alive while we hold the route.
        let headroom = unsafe { bindings::metaroce_glue_ll_reserved_space(dev) } as usize
            + IP_HDR
            + UDP_HDR;
        let total = headroom + payload.len();
        // SAFETY: plain allocation.
        let skb = unsafe { bindings::metaroce_glue_alloc_skb(total as u32) };
        if skb.is_null() {
            // SAFETY: we hold the route.
            unsafe { bindings::metaroce_glue_ip_rt_put(rt) };
            return Err(ENOMEM);
        }
        // SAFETY: a fresh skb of `total` bytes: reserve the headroom, then put the payload;
        // `udp_tunnel_xmit_skb` takes over both the skb and the route reference. Tunnel
        // transmits count their nesting per CPU, so they must not migrate: BH is disabled
        // around it, as in every in-kernel tunnel's transmit path.
        unsafe {
            bindings::metaroce_glue_local_bh_disable();
            bindings::metaroce_glue_skb_reserve(skb, headroom as c_int);
            let data = bindings::skb_put(skb, payload.len() as u32).cast::<u8>();
            ptr::copy_nonoverlapping(payload.as_ptr(), data, payload.len());
            bindings::udp_tunnel_xmit_skb(
                rt,
                (*self.sock.as_ptr()).sk,
                skb,
                fl.saddr,
                daddr,
                if ecn_capable { ECT0 } else { 0 },
                ttl as u8,
                DF.to_be(),
                src_port.to_be(),
                self.port.to_be(),
                false,
                false,
                0,
            );
            bindings::metaroce_glue_local_bh_enable();
        }
        Ok(())
    }
}

/// `encap_rcv`: a datagram for our port arrived (softirq).
///
/// # Safety
///
/// Called only by the UDP stack for our socket, with an skb we now own.
unsafe extern "C" fn encap_rcv(sk: *mut bindings::sock, skb: *mut bindings::sk_buff) -> c_int {
    // SAFETY: per the contract; the user data is the engine pointer set in `open`, valid
    // until the socket is released (which waits for us).
    unsafe {
        let engine = bindings::metaroce_glue_sk_user_data(sk).cast::<Engine>();
        if engine.is_null() || bindings::metaroce_glue_skb_linearize(skb) != 0 {
            bindings::metaroce_glue_kfree_skb(skb);
            return 0;
        }
        let len = (*skb).len as usize;
        let iph = bindings::metaroce_glue_ip_hdr(skb);
        if len < UDP_HDR || iph.is_null() {
            bindings::metaroce_glue_kfree_skb(skb);
            return 0;
        }
        // At `encap_rcv` time `data` points at the UDP header.
        let payload = core::slice::from_raw_parts((*skb).data.add(UDP_HDR), len - UDP_HDR);
        let src = (*iph).__bindgen_anon_1.__bindgen_anon_1.saddr.to_ne_bytes();
        let ce = (*iph).tos & 0x3 == 0x3;
        let engine = ArcBorrow::from_raw(engine);
        Engine::receive(&engine.into(), src, ce, payload);
        bindings::metaroce_glue_consume_skb(skb);
    }
    0
}
