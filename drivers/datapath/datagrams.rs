// SPDX-License-Identifier: GPL-2.0

//! Unreliable datagrams on the data path: the GSI QP of each port (`crate::gsi`) sends and
//! receives MetaRoCE DATAGRAM packets (`docs/wire-format.md`), which belong to no connection;
//! so do userspace's UD QPs (`ud.rs`), whose arrivals come through here.
//!
//! - Sends are posted from any context into the QP's queue; the receive thread sends them
//!   ([`Engine::process_datagrams`]) on the plane of the QP's port, to the address the work
//!   request's address handle names, and completes them.
//! - Arriving datagrams are queued in softirq ([`Engine::receive_datagram`]) and delivered by
//!   the receive thread into the port's GSI QP, behind a GRH made from their IP header, as a
//!   RoCE NIC delivers a UD SEND.
//! - A datagram the QP cannot take (none on that port, a wrong Q_Key, no receive buffer) is
//!   dropped and counted (`datagrams_dropped`), as UD does; the MAD layer retries.

use super::{Engine, RxQueue, MAX_DATAGRAM, MAX_PLANES};
use crate::{
    counters::Counter,
    gsi::{self, Arrival, GsiQp, GSI_QPN},
    net::{IpAddr, RxBuf},
    sys::work,
    transport::wire::{BaseHeader, DatagramExt, Ext, Flags, Header, Opcode, Packet},
    verbs_core::mcast::{Group, MULTICAST_QPN},
};
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::{
    new_mutex, new_spinlock, new_spinlock_irq,
    prelude::*,
    sync::{Arc, Mutex, SpinLock, SpinLockIrq},
};

/// Received datagrams waiting for the receive thread (connection management is light).
const DG_ENTRIES: usize = 256;

/// Where a datagram came from and went to, as its receiver sees it.
#[derive(Clone, Copy)]
pub(super) struct DgFrom {
    /// The plane it arrived on.
    pub(super) plane: u8,
    pub(super) src: IpAddr,
    pub(super) dst: IpAddr,
    /// Its length in bytes: headers and payload (UDP's payload).
    pub(super) len: usize,
}

/// A received datagram.
pub(super) struct DgItem {
    pub(super) plane: u8,
    pub(super) src: IpAddr,
    pub(super) dst: IpAddr,
    pub(super) buf: RxBuf,
}

/// The device's GSI QPs and datagram queues.
#[pin_data]
pub(super) struct Datagrams {
    /// By port - 1.
    #[pin]
    gsi: SpinLockIrq<[Option<Arc<GsiQp>>; MAX_PLANES]>,
    #[pin]
    rxq: SpinLockIrq<RxQueue<DgItem>>,
    /// Where a datagram is built before it is sent.
    #[pin]
    pub(super) scratch: Mutex<KVec<u8>>,
    /// Sends were posted since the receive thread last looked.
    tx_pending: AtomicBool,
    /// The multicast groups (`mcast.rs`): `mcast::MAX_GROUPS` slots from the first attach on,
    /// none before. Read by the receive thread, changed by attach and detach.
    #[pin]
    pub(super) groups: SpinLock<KVVec<Group>>,
    /// Held across an attach or a detach and the IP join or leave it makes, so that those
    /// follow the table's changes in order.
    #[pin]
    pub(super) joins: Mutex<()>,
}

impl Datagrams {
    pub(super) fn new() -> Result<impl PinInit<Self>> {
        let rxq = RxQueue::new(DG_ENTRIES as u32)?;
        let mut scratch = KVec::new();
        scratch.extend_with(MAX_DATAGRAM, 0u8, GFP_KERNEL)?;
        Ok(pin_init!(Datagrams {
            gsi <- new_spinlock_irq!([const { None }; MAX_PLANES], "metaroce_gsi_qps"),
            rxq <- new_spinlock_irq!(rxq, "metaroce_dg_rxq"),
            scratch <- new_mutex!(scratch, "metaroce_dg_scratch"),
            tx_pending: AtomicBool::new(false),
            groups <- new_spinlock!(KVVec::new(), "metaroce_mcast_groups"),
            joins <- new_mutex!((), "metaroce_mcast_joins"),
        }))
    }
}

/// Whether a datagram that passed the base header checks is a DATAGRAM (device level, for a
/// GSI QP) rather than a connection's packet.
pub(crate) fn is_datagram(packet: &[u8]) -> bool {
    packet
        .get(1)
        .and_then(|op| Opcode::from_u8(*op).ok())
        .is_some_and(|op| matches!(op, Opcode::Datagram | Opcode::DatagramWithImm))
}

impl Engine {
    /// Sets (or clears) the GSI QP of `port`. `EBUSY` if it has one already.
    pub(crate) fn set_gsi(&self, port: u32, qp: Option<Arc<GsiQp>>) -> Result {
        let mut gsi = self.datagrams.gsi.lock();
        let slot = gsi.get_mut((port as usize).wrapping_sub(1)).ok_or(EINVAL)?;
        if qp.is_some() && slot.is_some() {
            return Err(EBUSY);
        }
        *slot = qp;
        Ok(())
    }

    /// Datagrams waiting for the GSI QPs.
    pub(crate) fn dg_queued(&self) -> usize {
        self.datagrams.rxq.lock().len()
    }

    /// Sends were posted to a GSI QP (any context): the receive thread sends them.
    pub(crate) fn kick_datagrams(&self) {
        self.datagrams.tx_pending.store(true, Ordering::Release);
        self.kick_rx();
    }

    /// A DATAGRAM arrived on `plane` (softirq): queue it for the receive thread.
    pub(crate) fn receive_datagram(&self, plane: u8, src: IpAddr, dst: IpAddr, buf: RxBuf) {
        let pushed = self.datagrams.rxq.lock().push(DgItem {
            plane,
            src,
            dst,
            buf,
        });
        if pushed.is_ok() {
            self.kick_rx();
        } else {
            self.counters.inc(Counter::DatagramsDropped);
        }
    }

    /// The receive thread's share of datagram work: delivers what arrived, sends what was
    /// posted.
    pub(super) fn process_datagrams(&self) {
        loop {
            let item = self.datagrams.rxq.lock().pop();
            let Some(item) = item else { break };
            if self.deliver_datagram(&item).is_err() {
                self.counters.inc(Counter::DatagramsDropped);
            } else {
                self.counters.inc(Counter::DatagramsRcvd);
            }
        }
        if self.datagrams.tx_pending.swap(false, Ordering::AcqRel) {
            let qps: [Option<Arc<GsiQp>>; MAX_PLANES] = self.datagrams.gsi.lock().clone();
            for qp in qps.iter().flatten() {
                self.send_datagrams(qp);
            }
        }
    }

    fn deliver_datagram(&self, item: &DgItem) -> core::result::Result<(), ()> {
        let data = item.buf.bytes();
        let view = Packet::parse(data).map_err(|_| ())?;
        let (b, Ext::Datagram(d)) = (view.header.base, view.header.ext) else {
            return Err(());
        };
        // A multicast datagram names QP MULTICAST_QPN, and only it may (IBA 9.8.1).
        if item.dst.is_multicast() != (b.dst_qp == MULTICAST_QPN) {
            return Err(());
        }
        let from = DgFrom {
            plane: item.plane,
            src: item.src,
            dst: item.dst,
            len: data.len(),
        };
        if b.dst_qp == MULTICAST_QPN {
            return match self.mcast_deliver(&from, &b, &d, view.payload) {
                Some(true) => Ok(()),
                _ => Err(()),
            };
        }
        if b.dst_qp != GSI_QPN {
            return self.ud_deliver(b.dst_qp, &from, &b, &d, view.payload);
        }
        let qp = self
            .datagrams
            .gsi
            .lock()
            .get(usize::from(item.plane))
            .cloned()
            .flatten()
            .ok_or(())?;
        let (grh, network_hdr_type) = gsi::make_grh(&item.src, &item.dst, data.len());
        qp.deliver(&Arrival {
            qkey: d.qkey,
            src_qp: b.src_qp,
            imm: d.imm,
            solicited: b.flags.has(Flags::SOLICITED),
            grh: &grh,
            network_hdr_type,
            payload: view.payload,
        })
        .map_err(|_| ())
    }

    /// Sends every queued datagram of `qp`.
    fn send_datagrams(&self, qp: &GsiQp) {
        let plane = (qp.port as usize).wrapping_sub(1);
        let mut scratch = self.datagrams.scratch.lock();
        loop {
            let mut dst = IpAddr::V4([0; 4]);
            let taken = qp.next_send(&mut scratch, |wr, qkey, buf| {
                dst = IpAddr::from_gid(&wr.dgid);
                build(wr, qkey, buf)
            });
            let Some((wr, len)) = taken else { break };
            let sent = len.and_then(|len| {
                // A datagram that does not leave is lost, as on any UD QP (the MAD layer
                // retries); each leaves from a random source port, so that the MAD layer's
                // retries take other ECMP routes.
                self.send_on(
                    plane,
                    &dst,
                    super::random_port(),
                    false,
                    scratch.get(..len)?,
                );
                Some(())
            });
            if sent.is_some() {
                self.counters.inc(Counter::DatagramsSent);
            }
            qp.complete_send(&wr, sent.is_some());
        }
    }
}

/// Writes the DATAGRAM for `wr` (header, then its bytes) into `buf`; None if it is longer than
/// a datagram may be.
fn build(wr: &gsi::GsiSend, qkey: u32, buf: &mut [u8]) -> Option<usize> {
    let len = wr.sgl.len();
    let solicited = Flags(Flags::FIRST | Flags::LAST).with(Flags::SOLICITED, wr.solicited);
    let header = Header {
        base: BaseHeader {
            opcode: if wr.imm.is_some() {
                Opcode::DatagramWithImm
            } else {
                Opcode::Datagram
            },
            flags: solicited,
            dst_qp: wr.remote_qpn,
            src_qp: GSI_QPN,
            conn_id: 0,
            path_id: 0,
            plane: 0,
            psn: 0,
            msn: 0,
            timestamp: work::now_ns() as u32,
        },
        ext: Ext::Datagram(DatagramExt {
            qkey,
            pkey: 0xffff,
            payload_len: u32::try_from(len).ok()?,
            imm: wr.imm,
        }),
    };
    let hl = header.emit(buf).ok()?;
    let end = hl.checked_add(len)?;
    GsiQp::gather(wr, buf.get_mut(hl..end)?)?;
    Some(end)
}
