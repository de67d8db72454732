// SPDX-License-Identifier: GPL-2.0

//! The GSI QP (QP 1 of each port): the kernel MAD layer's unreliable datagram QP, over which the
//! connection manager (`ib_cm`, and through it `rdma_cm`: `rping`, `perftest -R`, `qperf -cm1`,
//! NVMe-oF, ...) exchanges its MADs. Its datagrams are MetaRoCE DATAGRAM packets
//! (`docs/wire-format.md`), on no connection; the data path sends and delivers them
//! (`datapath::datagrams`).
//!
//! Kernel consumers post work requests from any context (the MAD layer holds a spinlock with
//! interrupts off), so posting only queues: the receive thread sends. A work request's buffers
//! are kernel memory the consumer keeps until its completion ([`KernelBuf`]); they are only
//! touched under the QP's lock, and never after the QP is destroyed.

use crate::{
    sys::KernelBuf,
    verbs::{Caps, Cq, Fifo, KernelWc, QpState},
    verbs_core::{
        ib::{attr_mask as m, kernel_wc_flags, network_type, wc_opcode, wc_status},
        qp::{ModifyAttr, PSN_MASK},
    },
};
use kernel::{new_spinlock_irq, prelude::*, sync::Arc, sync::SpinLockIrq};

/// The GSI QP's number, on every port.
pub(crate) const GSI_QPN: u32 = 1;
/// Scatter/gather entries per GSI work request (the MAD layer uses 2 to send, 1 to receive).
pub(crate) const GSI_MAX_SGE: usize = 4;
/// Work requests each way (the MAD layer asks for 128 sends and 512 receives).
pub(crate) const GSI_MAX_WR: u32 = 1024;
/// Bytes of the GRH in front of every received datagram (UD semantics).
pub(crate) const GRH_LEN: usize = 40;

/// A scatter/gather list of kernel memory.
#[derive(Clone, Copy, Default)]
pub(crate) struct KernelSgl {
    pub(crate) sges: [KernelBuf; GSI_MAX_SGE],
    pub(crate) num: usize,
}

impl KernelSgl {
    fn bufs(&self) -> &[KernelBuf] {
        self.sges.get(..self.num).unwrap_or(&[])
    }

    /// Total bytes.
    pub(crate) fn len(&self) -> usize {
        self.bufs().iter().map(|b| b.len()).sum()
    }

    /// Copies the list's bytes, in order, to `out` (which is at least `len()` long).
    fn gather(&self, out: &mut [u8]) -> Option<usize> {
        let mut at = 0;
        for b in self.bufs() {
            let end = at + b.len();
            b.read(out.get_mut(at..end)?);
            at = end;
        }
        Some(at)
    }

    /// Writes the concatenation of `parts` at the start of the list; false if it is too short.
    fn scatter(&self, parts: &[&[u8]]) -> bool {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total > self.len() {
            return false;
        }
        let mut at = 0;
        parts.iter().all(|part| {
            let ok = self.write_at(at, part);
            at += part.len();
            ok
        })
    }

    /// Writes `data` at byte `offset` of the list; false if it does not fit.
    fn write_at(&self, mut offset: usize, mut data: &[u8]) -> bool {
        for b in self.bufs() {
            if data.is_empty() {
                break;
            }
            if offset >= b.len() {
                offset -= b.len();
                continue;
            }
            let (now, rest) = data.split_at((b.len() - offset).min(data.len()));
            b.write(offset, now);
            data = rest;
            offset = 0;
        }
        data.is_empty()
    }
}

/// A posted send: one datagram.
#[derive(Clone, Copy, Default)]
pub(crate) struct GsiSend {
    pub(crate) wr_id: u64,
    pub(crate) signaled: bool,
    pub(crate) solicited: bool,
    pub(crate) imm: Option<u32>,
    /// The destination GID (an IPv4-mapped or IPv6 address) from the address handle.
    pub(crate) dgid: [u8; 16],
    pub(crate) remote_qpn: u32,
    pub(crate) remote_qkey: u32,
    pub(crate) sgl: KernelSgl,
}

/// A posted receive buffer.
#[derive(Clone, Copy, Default)]
pub(crate) struct GsiRecv {
    pub(crate) wr_id: u64,
    pub(crate) sgl: KernelSgl,
}

/// Why a work request was refused at posting (`-EINVAL` or `-ENOMEM` to the consumer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PostError {
    /// Not in a state that takes it, or a bad request.
    Invalid,
    /// The queue is full.
    Full,
}

struct GsiInner {
    state: QpState,
    qkey: u32,
    sq_psn: u32,
    pkey_index: u16,
    /// Destroyed: nothing is sent, delivered or completed any more.
    dead: bool,
    sq: Fifo<GsiSend>,
    rq: Fifo<GsiRecv>,
}

/// The GSI QP of one port.
#[pin_data]
pub(crate) struct GsiQp {
    /// Its port (plane `port - 1`).
    pub(crate) port: u32,
    /// The core's `ib_qp` (its address), for completions.
    ibqp: usize,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    sq_sig_all: bool,
    /// Work requests each way, as created; `GSI_MAX_SGE` SGEs each; no inline data.
    pub(crate) cap: Caps,
    #[pin]
    inner: SpinLockIrq<GsiInner>,
}

/// What a received datagram brings to [`GsiQp::deliver`].
pub(crate) struct Arrival<'a> {
    pub(crate) qkey: u32,
    pub(crate) src_qp: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) solicited: bool,
    /// The GRH the receive buffer starts with.
    pub(crate) grh: &'a [u8; GRH_LEN],
    /// `enum rdma_network_type` of the GRH.
    pub(crate) network_hdr_type: u8,
    pub(crate) payload: &'a [u8],
}

/// Why a received datagram was not delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DropReason {
    NotReady,
    WrongQkey,
    NoBuffer,
}

impl GsiQp {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        port: u32,
        ibqp: usize,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        sq_sig_all: bool,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> Result<impl PinInit<Self>> {
        let sq = Fifo::new(max_send_wr)?;
        let rq = Fifo::new(max_recv_wr)?;
        Ok(pin_init!(GsiQp {
            port,
            ibqp,
            send_cq,
            recv_cq,
            sq_sig_all,
            cap: Caps {
                max_send_wr,
                max_recv_wr,
                max_send_sge: GSI_MAX_SGE as u32,
                max_recv_sge: GSI_MAX_SGE as u32,
                max_inline_data: 0,
            },
            inner <- new_spinlock_irq!(GsiInner {
                state: QpState::Reset,
                qkey: 0,
                sq_psn: 0,
                pkey_index: 0,
                dead: false,
                sq,
                rq,
            }, "metaroce_gsi"),
        }))
    }

    pub(crate) fn state(&self) -> QpState {
        self.inner.lock().state
    }

    /// `modify_qp`, after its transition was checked (`crate::ops`).
    pub(crate) fn modify(&self, attr: &ModifyAttr, mask: u32) -> Result {
        let mut inner = self.inner.lock();
        if mask & m::QKEY != 0 {
            inner.qkey = attr.qkey;
        }
        if mask & m::SQ_PSN != 0 {
            inner.sq_psn = attr.sq_psn & PSN_MASK;
        }
        if mask & m::PKEY_INDEX != 0 {
            if attr.pkey_index != 0 {
                return Err(EINVAL);
            }
            inner.pkey_index = attr.pkey_index;
        }
        if mask & m::STATE != 0 {
            let next = QpState::from_ib(attr.qp_state).ok_or(EINVAL)?;
            inner.state = next;
            match next {
                QpState::Reset => {
                    inner.sq.clear();
                    inner.rq.clear();
                }
                QpState::Err => self.flush(&mut inner),
                _ => {}
            }
        }
        Ok(())
    }

    /// What `query_qp` reports: (state, qkey, SQ PSN, P_Key index).
    pub(crate) fn attrs(&self) -> (QpState, u32, u32, u16) {
        let inner = self.inner.lock();
        (inner.state, inner.qkey, inner.sq_psn, inner.pkey_index)
    }

    /// Queues a send (any context). The receive thread sends it.
    pub(crate) fn post_send(&self, wr: GsiSend) -> core::result::Result<(), PostError> {
        let mut inner = self.inner.lock();
        match inner.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                let wc = self.wc(wr.wr_id, wc_status::WR_FLUSH_ERR, true);
                self.send_cq.complete_wc(wc, false);
                return Ok(());
            }
            _ => return Err(PostError::Invalid),
        }
        inner.sq.push(wr).map_err(|_| PostError::Full)
    }

    /// Queues a receive buffer (any context).
    pub(crate) fn post_recv(&self, wr: GsiRecv) -> core::result::Result<(), PostError> {
        let mut inner = self.inner.lock();
        match inner.state {
            QpState::Reset => Err(PostError::Invalid),
            QpState::Err => {
                let wc = self.wc(wr.wr_id, wc_status::WR_FLUSH_ERR, false);
                self.recv_cq.complete_wc(wc, false);
                Ok(())
            }
            _ => inner.rq.push(wr).map_err(|_| PostError::Full),
        }
    }

    /// Takes the oldest queued send and builds its datagram with `build` (given the send, the
    /// Q_Key to use and `scratch`; it gathers the send's bytes and returns the datagram's
    /// length), under the QP's lock: the consumer keeps the buffers until the completion, and
    /// destroying the QP waits for the lock. Returns the send and the datagram's length.
    pub(crate) fn next_send(
        &self,
        scratch: &mut [u8],
        build: impl FnOnce(&GsiSend, u32, &mut [u8]) -> Option<usize>,
    ) -> Option<(GsiSend, Option<usize>)> {
        let mut inner = self.inner.lock();
        if inner.dead || !matches!(inner.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        let wr = inner.sq.pop()?;
        let qkey = if wr.remote_qkey & 0x8000_0000 != 0 {
            // A Q_Key with its high bit set means the QP's own (IBA 10.2.5).
            inner.qkey
        } else {
            wr.remote_qkey
        };
        let len = build(&wr, qkey, scratch);
        Some((wr, len))
    }

    /// Copies a send's bytes to `out` (from [`GsiQp::next_send`]'s `build`, under the lock).
    pub(crate) fn gather(wr: &GsiSend, out: &mut [u8]) -> Option<usize> {
        wr.sgl.gather(out)
    }

    /// Completes a send taken with [`GsiQp::next_send`] (unless the QP is gone).
    pub(crate) fn complete_send(&self, wr: &GsiSend, ok: bool) {
        let inner = self.inner.lock();
        if inner.dead {
            return;
        }
        if wr.signaled || self.sq_sig_all || !ok {
            let status = if ok {
                wc_status::SUCCESS
            } else {
                wc_status::LOC_LEN_ERR
            };
            let mut wc = self.wc(wr.wr_id, status, true);
            wc.cqe.byte_len = wr.sgl.len() as u32;
            self.send_cq.complete_wc(wc, false);
        }
    }

    /// Places a received datagram in the next receive buffer and completes it.
    pub(crate) fn deliver(&self, a: &Arrival<'_>) -> core::result::Result<(), DropReason> {
        let mut inner = self.inner.lock();
        if inner.dead || !matches!(inner.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return Err(DropReason::NotReady);
        }
        if a.qkey != inner.qkey {
            return Err(DropReason::WrongQkey);
        }
        let wr = inner.rq.pop().ok_or(DropReason::NoBuffer)?;
        let fits = wr.sgl.scatter(&[a.grh.as_slice(), a.payload]);
        let status = if fits {
            wc_status::SUCCESS
        } else {
            wc_status::LOC_LEN_ERR
        };
        let mut wc = self.wc(wr.wr_id, status, false);
        if fits {
            wc.cqe.byte_len = (GRH_LEN + a.payload.len()) as u32;
            wc.cqe.src_qp = a.src_qp;
            wc.cqe.wc_flags = kernel_wc_flags::GRH | kernel_wc_flags::WITH_NETWORK_HDR_TYPE;
            if let Some(imm) = a.imm {
                wc.cqe.imm_data = imm.to_be();
                wc.cqe.wc_flags |= kernel_wc_flags::WITH_IMM;
            }
            wc.network_hdr_type = a.network_hdr_type;
        }
        self.recv_cq.complete_wc(wc, a.solicited);
        Ok(())
    }

    /// The QP is being destroyed: after this, its buffers are never touched again and nothing
    /// completes.
    pub(crate) fn kill(&self) {
        let mut inner = self.inner.lock();
        inner.dead = true;
        inner.sq.clear();
        inner.rq.clear();
    }

    /// Error state: every queued request completes flushed.
    fn flush(&self, inner: &mut GsiInner) {
        while let Some(wr) = inner.sq.pop() {
            let wc = self.wc(wr.wr_id, wc_status::WR_FLUSH_ERR, true);
            self.send_cq.complete_wc(wc, false);
        }
        while let Some(wr) = inner.rq.pop() {
            let wc = self.wc(wr.wr_id, wc_status::WR_FLUSH_ERR, false);
            self.recv_cq.complete_wc(wc, false);
        }
    }

    fn wc(&self, wr_id: u64, status: u32, send: bool) -> KernelWc {
        let mut wc = KernelWc {
            ibqp: self.ibqp,
            port_num: self.port as u8,
            ..KernelWc::default()
        };
        wc.cqe.wr_id = wr_id;
        wc.cqe.status = status;
        wc.cqe.opcode = if send {
            wc_opcode::SEND
        } else {
            wc_opcode::RECV
        };
        wc.cqe.qp_num = GSI_QPN;
        wc
    }
}

/// The GRH of a datagram from `src` to `dst` whose UDP payload is `udp_payload` bytes: for IPv4,
/// 20 zero bytes and the IPv4 header (checksummed: the core verifies it), for IPv6 the IPv6
/// header; and the `enum rdma_network_type` to report with it.
pub(crate) fn make_grh(
    src: &crate::net::IpAddr,
    dst: &crate::net::IpAddr,
    udp_payload: usize,
) -> ([u8; GRH_LEN], u8) {
    use crate::net::IpAddr;
    let mut g = [0u8; GRH_LEN];
    let udp_len = (8 + udp_payload) as u16;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut g[20..];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
            h[6] = 0x40; // don't fragment
            h[8] = 64; // TTL
            h[9] = 17; // UDP
            h[12..16].copy_from_slice(s);
            h[16..20].copy_from_slice(d);
            let csum = ipv4_checksum(h);
            h[10..12].copy_from_slice(&csum.to_be_bytes());
            (g, network_type::IPV4)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            g[0] = 0x60;
            g[4..6].copy_from_slice(&udp_len.to_be_bytes());
            g[6] = 17; // next header: UDP
            g[7] = 64; // hop limit
            g[8..24].copy_from_slice(s);
            g[24..40].copy_from_slice(d);
            (g, network_type::IPV6)
        }
        // Mixed families cannot happen on one socket; report an IPv6 GRH of mapped addresses.
        (s, d) => make_grh(&s.to_v6(), &d.to_v6(), udp_payload),
    }
}

/// The Internet checksum of a header whose checksum field is zero.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in h.chunks(2) {
        let hi = u32::from(*c.first().unwrap_or(&0)) << 8;
        let lo = u32::from(*c.get(1).unwrap_or(&0));
        sum += hi | lo;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
