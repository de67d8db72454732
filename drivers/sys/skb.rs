// SPDX-License-Identifier: GPL-2.0

//! Owned socket buffers and routes: each frees what it holds when dropped, so that no error
//! path of a send or a receive leaks an skb or a route reference, and each hands its pointer
//! on only to a call that consumes it.

use super::bindings;
use core::ptr::{self, NonNull};
use kernel::{
    ffi::{c_int, c_uint},
    prelude::*,
};

/// An skb we own. Dropped, it is freed as a drop (`kfree_skb`); [`Skb::consume`] frees it as
/// used, and [`Skb::into_raw`] hands it to a call that takes it.
pub(super) struct Skb(NonNull<bindings::sk_buff>);

impl Skb {
    /// Takes ownership of `skb`.
    ///
    /// # Safety
    ///
    /// `skb` must be null or an skb we own (handed over by the stack, or allocated by us) that
    /// nothing else frees.
    pub(super) unsafe fn from_raw(skb: *mut bindings::sk_buff) -> Option<Self> {
        NonNull::new(skb).map(Skb)
    }

    /// A new linear skb holding `payload`, with `headroom` bytes free in front of it.
    /// Atomic, so any context may call it.
    pub(super) fn with_payload(headroom: usize, payload: &[u8]) -> Result<Self> {
        let size = headroom.checked_add(payload.len()).ok_or(EMSGSIZE)?;
        let size = c_uint::try_from(size).map_err(|_| EMSGSIZE)?;
        let headroom = c_int::try_from(headroom).map_err(|_| EMSGSIZE)?;
        // SAFETY: plain allocation.
        let skb = unsafe { Self::from_raw(bindings::metaroce_glue_alloc_skb_atomic(size)) };
        let skb = skb.ok_or(ENOMEM)?;
        // SAFETY: our fresh, empty skb of `size` bytes: reserving `headroom` and then putting
        // `payload.len()` bytes stays within it (`size` is their sum); `skb_put` returns the
        // start of the bytes it added, which cannot overlap `payload`.
        unsafe {
            bindings::metaroce_glue_skb_reserve(skb.as_ptr(), headroom);
            let data = bindings::skb_put(skb.as_ptr(), payload.len() as c_uint);
            ptr::copy_nonoverlapping(payload.as_ptr(), data.cast::<u8>(), payload.len());
        }
        Ok(skb)
    }

    fn as_ptr(&self) -> *mut bindings::sk_buff {
        self.0.as_ptr()
    }

    /// Makes the data linear (it may reallocate the head buffer).
    pub(super) fn linearize(&mut self) -> Result {
        // SAFETY: the skb is ours.
        match unsafe { bindings::metaroce_glue_skb_linearize(self.as_ptr()) } {
            0 => Ok(()),
            _ => Err(ENOMEM),
        }
    }

    /// The IP header (network header up to the transport header) and the UDP header plus
    /// payload (transport header up to the end of the data) of a linear skb whose network and
    /// transport headers the stack set (the UDP header may have been pulled off the data
    /// already); None if they do not lie where they must.
    pub(super) fn headers(&self) -> Option<(&[u8], &[u8])> {
        let skb = self.as_ptr();
        // SAFETY: the skb is ours and live; reading its fields and header offsets.
        let (head, data, len, nh, th, nonlinear) = unsafe {
            (
                (*skb).head.cast_const(),
                (*skb).data.cast_const(),
                (*skb).len as usize,
                bindings::metaroce_glue_skb_network_header(skb).cast_const(),
                bindings::metaroce_glue_skb_transport_header(skb).cast_const(),
                (*skb).data_len != 0,
            )
        };
        if nonlinear {
            return None;
        }
        // SAFETY: a linear skb's `len` bytes from `data` are its data, inside its head buffer.
        let end = unsafe { data.add(len) };
        // The IP header lies between the buffer's start and the UDP header, which lies before
        // the end of the data: check it instead of trusting it, comparing addresses only.
        let (head_a, nh_a, th_a, end_a) = (head.addr(), nh.addr(), th.addr(), end.addr());
        if !(head_a <= nh_a && nh_a <= th_a && th_a <= end_a) {
            return None;
        }
        // SAFETY: `nh..th` and `th..end` lie within the skb's head buffer (checked above: from
        // `head` to the end of the linear data), which stays allocated and unmodified while we
        // own the skb and lend it (`&self`).
        unsafe {
            Some((
                core::slice::from_raw_parts(nh, th_a - nh_a),
                core::slice::from_raw_parts(th, end_a - th_a),
            ))
        }
    }

    /// Whether the stack has more datagrams of the same GSO packet after this one: it walks
    /// the datagrams it cut a GSO packet into as a list (`udp_queue_rcv_skb`) without
    /// unlinking them, and all but the last have a next one.
    pub(super) fn more(&self) -> bool {
        // SAFETY: the skb is ours; this only reads its `next`.
        !unsafe { bindings::metaroce_glue_skb_next(self.as_ptr()) }.is_null()
    }

    /// How many datagrams of the same GSO packet the stack has after this one (see
    /// [`Skb::more`]), counted up to `max`.
    pub(super) fn following(&self, max: usize) -> usize {
        let mut n = 0;
        // SAFETY: the skb is ours; this reads its `next`.
        let mut next = unsafe { bindings::metaroce_glue_skb_next(self.as_ptr()) };
        while !next.is_null() && n < max {
            n += 1;
            // SAFETY: `next` is a datagram of the list the stack is walking, which it hands
            // over after this one: alive and unchanged while we are called from that walk.
            next = unsafe { bindings::metaroce_glue_skb_next(next) };
        }
        n
    }

    /// The number of datagrams in a UDP GSO packet, as the sender's stack set it
    /// (`gso_segs`); 0 for a single datagram.
    pub(super) fn gso_segs(&self) -> u16 {
        let skb = self.as_ptr();
        // SAFETY: the skb is live; reading a field of its shared info.
        unsafe { (*bindings::metaroce_glue_skb_shinfo(skb)).gso_segs }
    }

    /// Another reference to this skb (its user count raised): each `Skb` frees its own, and
    /// the last one frees the skb. Only for an skb that is only read from then on (a shared
    /// skb must not be linearised or changed).
    pub(super) fn share(&self) -> Self {
        // SAFETY: the skb is live (we hold a reference); this takes another one, which the
        // new `Skb` owns.
        unsafe { bindings::metaroce_glue_skb_get(self.as_ptr()) };
        Skb(self.0)
    }

    /// The datagram size of a UDP GSO packet (`gso_size`); 0 for a single datagram.
    pub(super) fn gso_size(&self) -> u16 {
        let skb = self.as_ptr();
        // SAFETY: the skb is live; reading a field of its shared info.
        unsafe { (*bindings::metaroce_glue_skb_shinfo(skb)).gso_size }
    }

    /// Whether a datagram taken off a UDP socket's queue has a good UDP checksum (verified
    /// now if the device or the sender's stack has not: as `udp_recvmsg` does).
    pub(super) fn udp_csum_ok(&mut self) -> bool {
        // SAFETY: the skb is ours alone, dequeued from a UDP socket (so its UDP control block
        // is set); the check may update its checksum state.
        unsafe { bindings::metaroce_glue_udp_csum_ok(self.as_ptr()) }
    }

    /// Makes a datagram of `seg`-byte segments a UDP GSO packet of `segs` datagrams, as
    /// `udp_sendmsg` does: the checksum left partial (the stack finishes it per datagram),
    /// starting at the 8-byte UDP header that will be pushed just in front of the payload.
    /// The skb needs that much headroom (else `EINVAL`).
    pub(super) fn set_udp_gso(&mut self, seg: u16, segs: u16, udp_check_offset: u16) -> Result {
        const UDP_HEADER: c_uint = 8;
        let skb = self.as_ptr();
        // SAFETY: the skb is ours; reading its head and data pointers.
        let headroom = unsafe { ((*skb).data as usize).wrapping_sub((*skb).head as usize) };
        if headroom < UDP_HEADER as usize {
            return Err(EINVAL);
        }
        // SAFETY: the skb is ours and has at least 8 bytes in front of the payload: pushing
        // them and pulling them back leaves it as it was; in between, `skb_partial_csum_set`
        // records that place (offset 0 from `data`, the checksum field `udp_check_offset` in),
        // which lies within the skb. `skb_shinfo` is the skb's own shared info, which nobody
        // else sees yet.
        unsafe {
            bindings::skb_push(skb, UDP_HEADER);
            let ok = bindings::skb_partial_csum_set(skb, 0, udp_check_offset);
            bindings::skb_pull(skb, UDP_HEADER);
            if !ok {
                return Err(EINVAL);
            }
            let info = bindings::metaroce_glue_skb_shinfo(skb);
            (*info).gso_size = seg;
            (*info).gso_segs = segs;
            (*info).gso_type = bindings::SKB_GSO_UDP_L4 as c_uint;
        }
        Ok(())
    }

    /// Frees the skb as used (`consume_skb`: no drop is counted).
    pub(super) fn consume(self) {
        let skb = self.into_raw();
        // SAFETY: ours, freed once, here.
        unsafe { bindings::consume_skb(skb) };
    }

    /// Hands the skb to a call that takes it (a transmit).
    pub(super) fn into_raw(self) -> *mut bindings::sk_buff {
        let skb = self.as_ptr();
        core::mem::forget(self);
        skb
    }
}

impl Drop for Skb {
    fn drop(&mut self) {
        // SAFETY: ours (type invariant), freed once, here.
        unsafe { bindings::metaroce_glue_kfree_skb(self.as_ptr()) };
    }
}

/// An IPv4 route we hold a reference on; dropped, the reference goes back.
pub(super) struct Route4(NonNull<bindings::rtable>);

impl Route4 {
    /// # Safety
    ///
    /// `rt` must be null or a route whose reference we hold and hand over.
    pub(super) unsafe fn from_raw(rt: *mut bindings::rtable) -> Option<Self> {
        NonNull::new(rt).map(Route4)
    }

    /// Its destination entry, live while the route is.
    pub(super) fn dst(&self) -> Dst<'_> {
        // SAFETY: the route is live while we hold its reference.
        let dst = unsafe { bindings::metaroce_glue_rt_dst(self.0.as_ptr()) };
        Dst(dst, core::marker::PhantomData)
    }

    /// Hands the reference to a call that takes it (a transmit).
    pub(super) fn into_raw(self) -> *mut bindings::rtable {
        let rt = self.0.as_ptr();
        core::mem::forget(self);
        rt
    }
}

impl Drop for Route4 {
    fn drop(&mut self) {
        // SAFETY: we hold the reference (type invariant) and give it back, once.
        unsafe { bindings::metaroce_glue_ip_rt_put(self.0.as_ptr()) };
    }
}

/// A destination entry we hold a reference on (an IPv6 route); dropped, the reference goes
/// back.
pub(super) struct Dst6(NonNull<bindings::dst_entry>);

impl Dst6 {
    /// # Safety
    ///
    /// `dst` must be null or an entry whose reference we hold and hand over.
    pub(super) unsafe fn from_raw(dst: *mut bindings::dst_entry) -> Option<Self> {
        NonNull::new(dst).map(Dst6)
    }

    pub(super) fn dst(&self) -> Dst<'_> {
        Dst(self.0.as_ptr(), core::marker::PhantomData)
    }

    /// Hands the reference to a call that takes it (a transmit).
    pub(super) fn into_raw(self) -> *mut bindings::dst_entry {
        let dst = self.0.as_ptr();
        core::mem::forget(self);
        dst
    }
}

impl Drop for Dst6 {
    fn drop(&mut self) {
        // SAFETY: we hold the reference (type invariant) and give it back, once.
        unsafe { bindings::dst_release(self.0.as_ptr()) };
    }
}

/// A destination entry, borrowed from the route that holds it.
#[derive(Clone, Copy)]
pub(super) struct Dst<'a>(*mut bindings::dst_entry, core::marker::PhantomData<&'a ()>);

impl Dst<'_> {
    /// The route's MTU.
    pub(super) fn mtu(&self) -> usize {
        // SAFETY: live while borrowed (see the constructors).
        unsafe { bindings::metaroce_glue_dst_mtu(self.0) as usize }
    }

    /// Bytes the link layer of its device needs in front.
    pub(super) fn ll_reserved_space(&self) -> usize {
        // SAFETY: as above.
        unsafe { bindings::metaroce_glue_dst_ll_reserved_space(self.0) as usize }
    }

    /// The route's route error (0: none), an errno.
    pub(super) fn error(&self) -> c_int {
        // SAFETY: as above.
        unsafe { (*self.0).error.into() }
    }

    /// The IPv4 TTL to send with.
    pub(super) fn ip4_hoplimit(&self) -> u8 {
        // SAFETY: as above.
        unsafe { bindings::metaroce_glue_ip4_dst_hoplimit(self.0) as u8 }
    }

    /// The IPv6 hop limit to send with.
    pub(super) fn ip6_hoplimit(&self) -> u8 {
        // SAFETY: as above.
        unsafe { bindings::ip6_dst_hoplimit(self.0) as u8 }
    }
}
