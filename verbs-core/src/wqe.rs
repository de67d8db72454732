// SPDX-License-Identifier: GPL-2.0

//! Send and receive WQEs copied out of a ring: judged, then decoded.
//!
//! Userspace may write anything into its rings, so every WQE gets one of three verdicts:
//! - [`Judged::Fatal`]: an entry the provider could not have written (an unknown opcode or
//!   send flag, a non-zero reserved field, more SGEs than the device carries, more inline
//!   bytes than the entry holds, an inline length without `IB_SEND_INLINE` or SGEs with it). The ring is broken: the QP goes to the error state with
//!   `IB_EVENT_QP_FATAL` (an SRQ: `IB_EVENT_SRQ_ERR`), and the hardware counter ring_errors
//!   counts it.
//! - [`Judged::Refused`]: a well-formed request the device will not carry out (the inline
//!   key named by userspace, SGE lengths whose sum overflows a message length, inline data on
//!   a QP without inline support or on an operation without payload). It completes in error
//!   (`IB_WC_LOC_QP_OP_ERR` for a send, `IB_WC_LOC_LEN_ERR` for a receive), as a bad post
//!   would on hardware, and the queue goes on.
//! - [`Judged::Usable`]: the decoded work.

use super::abi::{self, RecvWqe, SendWqe};
use super::caps::limits;
use super::ib::{send_flags as sf, wr_opcode as op};
use super::mw::BindRequest;

/// The lkey that stands for a send WQE's inline payload, kept by the kernel; never valid in
/// a WQE from userspace (MR keys stay below it: index << 8 | key byte, index < `MAX_MR`).
pub const INLINE_LKEY: u32 = u32::MAX;
const _: () = assert!((limits::MAX_MR as u64) << 8 < INLINE_LKEY as u64);

/// The lkey that stands for a WQE's SGE list longer than the transport core carries, kept by
/// the kernel ([`super::lists`]); never valid in a WQE from userspace either. (`u32::MAX - 1`
/// is the module's `local_dma_lkey`, which kernel consumers' SGEs carry.)
pub const LIST_LKEY: u32 = u32::MAX - 2;
const _: () = assert!((limits::MAX_MR as u64) << 8 < LIST_LKEY as u64);

/// SGEs a send WQE may carry.
const MAX_SEND_SGE: usize = limits::MAX_SEND_SGE as usize;
/// SGEs a receive WQE may carry.
const MAX_RECV_SGE: usize = limits::MAX_RECV_SGE as usize;
/// The longest list a WQE may carry, either way.
pub const MAX_LIST: usize = if MAX_SEND_SGE > MAX_RECV_SGE {
    MAX_SEND_SGE
} else {
    MAX_RECV_SGE
};

/// A WQE's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged<T> {
    /// The ring is broken (see the module's documentation).
    Fatal,
    /// Completes in error; the queue goes on.
    Refused,
    /// The work to do.
    Usable(T),
}

/// A local scatter/gather list: at most [`MAX_LIST`] entries (`limits::MAX_SEND_SGE` of a
/// send, `limits::MAX_RECV_SGE` of a receive) whose lengths sum to a `u32`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SgList {
    sges: [abi::Sge; MAX_LIST],
    len: u8,
}

impl SgList {
    /// The list of `sges`, or None if there are too many, one names a key the kernel keeps
    /// ([`INLINE_LKEY`], [`LIST_LKEY`]), or their lengths overflow a message length.
    fn new(sges: impl Iterator<Item = abi::Sge>) -> Option<SgList> {
        let mut l = SgList::default();
        let mut total = 0u32;
        for s in sges {
            let slot = l.sges.get_mut(usize::from(l.len))?;
            if s.lkey == INLINE_LKEY || s.lkey == LIST_LKEY {
                return None;
            }
            total = total.checked_add(s.length)?;
            *slot = s;
            l.len += 1;
        }
        Some(l)
    }

    /// The entries, in order.
    pub fn sges(&self) -> &[abi::Sge] {
        self.sges.get(..usize::from(self.len)).unwrap_or(&[])
    }

    /// Their total length.
    pub fn total(&self) -> u32 {
        self.sges().iter().map(|s| s.length).sum()
    }
}

/// A send operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum SendOp {
    Send,
    SendWithImm,
    /// A SEND whose receiver invalidates the rkey [`SendWork::rkey`] (a window of its own).
    SendWithInv,
    RdmaWrite,
    RdmaWriteWithImm,
    RdmaRead,
    CmpSwap,
    FetchAdd,
    /// A memory window bind ([`SendWork::bind`]); the device's own, it sends nothing.
    BindMw,
    /// A local invalidate of the memory window `rkey` names; sends nothing.
    LocalInv,
    /// ATOMIC WRITE of the 8 bytes in the WQE ([`SendWork::atomic`]: `(0, value)`).
    AtomicWrite,
    /// RDMA FLUSH ([`SendWork::atomic`]: `(placement type | selectivity level << 8,
    /// length)`).
    Flush,
    /// A fast registration of a kernel consumer's MR ([`SendWork::reg`]); sends nothing.
    RegMr,
}

impl SendOp {
    /// The operation a `wr_opcode` names, if the device carries it.
    pub fn from_ib(opcode: u32) -> Option<SendOp> {
        Some(match opcode {
            op::SEND => SendOp::Send,
            op::SEND_WITH_IMM => SendOp::SendWithImm,
            op::SEND_WITH_INV => SendOp::SendWithInv,
            op::RDMA_WRITE => SendOp::RdmaWrite,
            op::RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm,
            op::RDMA_READ => SendOp::RdmaRead,
            op::ATOMIC_CMP_AND_SWP => SendOp::CmpSwap,
            op::ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd,
            op::BIND_MW => SendOp::BindMw,
            op::LOCAL_INV => SendOp::LocalInv,
            op::ATOMIC_WRITE => SendOp::AtomicWrite,
            op::FLUSH => SendOp::Flush,
            _ => return None,
        })
    }

    /// Whether it carries a payload of its own (what inline data can stand for).
    pub fn carries_payload(self) -> bool {
        matches!(
            self,
            SendOp::Send
                | SendOp::SendWithImm
                | SendOp::SendWithInv
                | SendOp::RdmaWrite
                | SendOp::RdmaWriteWithImm
        )
    }

    /// Whether it carries immediate data.
    pub fn has_imm(self) -> bool {
        matches!(self, SendOp::SendWithImm | SendOp::RdmaWriteWithImm)
    }

    /// Whether it is an atomic.
    pub fn is_atomic(self) -> bool {
        matches!(self, SendOp::CmpSwap | SendOp::FetchAdd)
    }

    /// Whether the device carries it out itself, sending nothing (it completes in order with
    /// the others once they have).
    pub fn is_local(self) -> bool {
        matches!(self, SendOp::BindMw | SendOp::LocalInv | SendOp::RegMr)
    }

    /// Whether a UC QP may post it: SENDs and RDMA WRITEs (with immediate or not) and the
    /// local operations; a UC QP has no READ, no atomics, no SEND with invalidate, no ATOMIC
    /// WRITE and no FLUSH (the IBA's UC opcodes, rxe's `rxe_wr_opcode_info`).
    pub fn on_uc(self) -> bool {
        matches!(
            self,
            SendOp::Send
                | SendOp::SendWithImm
                | SendOp::RdmaWrite
                | SendOp::RdmaWriteWithImm
                | SendOp::BindMw
                | SendOp::LocalInv
        )
    }

    /// Whether it has no local data at all: its operands are in the WQE.
    pub fn dataless(self) -> bool {
        matches!(
            self,
            SendOp::BindMw | SendOp::LocalInv | SendOp::AtomicWrite | SendOp::Flush | SendOp::RegMr
        )
    }
}

/// Where a send's local data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// A judged list of up to 32 SGEs, used at once by the caller: boxing it would allocate for
// every WQE taken from a ring.
#[allow(clippy::large_enum_variant)]
pub enum Payload {
    /// In registered memory.
    Sges(SgList),
    /// In the WQE: its first `len` bytes of [`SendWqe::data`] (the caller keeps them, the WQE
    /// being a copy).
    Inline(u32),
}

/// A decoded send WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWork {
    /// The caller's id, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// The local data (the read target of an RDMA READ, the result of an atomic).
    pub payload: Payload,
    /// The remote address and key (RDMA and atomics).
    pub remote_addr: u64,
    /// The remote key.
    pub rkey: u32,
    /// Immediate data (big-endian, as posted) of the `*WithImm` operations.
    pub imm: Option<u32>,
    /// Compare-and-swap: (compare, swap); fetch-and-add: (0, add); ATOMIC WRITE: (0, the
    /// 8 bytes read as a big-endian number); FLUSH: (placement type | selectivity level << 8,
    /// length).
    pub atomic: Option<(u64, u64)>,
    /// Completes with a CQE even when the QP signals only requested ones.
    pub signaled: bool,
    /// Sets the solicited event bit.
    pub solicited: bool,
    /// Waits for earlier RDMA READs and atomics.
    pub fence: bool,
    /// BIND_MW: the bind (the WQE's fields as `uapi/metaroce-abi.h` lays them out for it).
    pub bind: Option<BindRequest>,
    /// REG_MR: the registration.
    pub reg: Option<RegRequest>,
}

/// An `IB_WR_REG_MR` as the kernel writes it into a kernel QP's send queue: the key in `rkey`,
/// the rights in `imm_data`, the MR's iova and length (as they were at posting) in
/// `remote_addr` and `compare_add`; the MR is the one the key's index names.
pub type RegRequest = super::frwr::RegWr;

/// The send flags a provider may set.
const SEND_FLAGS: u32 = sf::FENCE | sf::SIGNALED | sf::SOLICITED | sf::INLINE | sf::IP_CSUM;

/// Judges a send WQE of a user QP (`sq_sig_all`: every WQE is signaled; `inline_ok`: the QP
/// was created with inline support).
pub fn judge_send(w: &SendWqe, sq_sig_all: bool, inline_ok: bool) -> Judged<SendWork> {
    judge(w, sq_sig_all, inline_ok, false)
}

/// Judges a send WQE of a kernel consumer's QP (the kernel wrote it: it may also be a
/// REG_MR).
pub fn judge_kernel_send(w: &SendWqe, sq_sig_all: bool, inline_ok: bool) -> Judged<SendWork> {
    judge(w, sq_sig_all, inline_ok, true)
}

fn judge(w: &SendWqe, sq_sig_all: bool, inline_ok: bool, kernel: bool) -> Judged<SendWork> {
    let opcode = match SendOp::from_ib(w.opcode) {
        Some(op) => op,
        None if kernel && w.opcode == op::REG_MR => SendOp::RegMr,
        None => return Judged::Fatal,
    };
    let inline = w.send_flags & sf::INLINE != 0;
    let sized = if inline {
        w.num_sge == 0 && w.inline_len as usize <= abi::MAX_INLINE
    } else {
        w.num_sge as usize <= MAX_SEND_SGE && w.inline_len == 0
    };
    if w.send_flags & !SEND_FLAGS != 0 || w.reserved0 != 0 || w.reserved1 != 0 || !sized {
        return Judged::Fatal;
    }
    // The local operations, ATOMIC WRITE and FLUSH carry no data: their fields are the
    // bind's, the rkey, the value or the range.
    if opcode.dataless() && (inline || w.num_sge != 0) {
        return Judged::Fatal;
    }
    let payload = if inline {
        if !inline_ok || !opcode.carries_payload() {
            return Judged::Refused;
        }
        Payload::Inline(w.inline_len)
    } else {
        let sges = (0..w.num_sge as usize).map_while(|i| w.sge(i));
        match SgList::new(sges) {
            Some(l) => Payload::Sges(l),
            None => return Judged::Refused,
        }
    };
    let atomic = match opcode {
        SendOp::CmpSwap => Some((w.compare_add, w.swap)),
        SendOp::FetchAdd => Some((0, w.compare_add)),
        SendOp::AtomicWrite => Some((0, w.compare_add)),
        SendOp::Flush => Some((w.swap, w.compare_add)),
        _ => None,
    };
    Judged::Usable(SendWork {
        wr_id: w.wr_id,
        op: opcode,
        payload,
        remote_addr: w.remote_addr,
        // LOCAL_INV and SEND_WITH_INV name the rkey to invalidate where immediate data would be.
        rkey: if matches!(opcode, SendOp::LocalInv | SendOp::SendWithInv) {
            w.imm_data
        } else {
            w.rkey
        },
        imm: opcode.has_imm().then_some(w.imm_data),
        atomic,
        signaled: sq_sig_all || w.send_flags & sf::SIGNALED != 0,
        solicited: w.send_flags & sf::SOLICITED != 0,
        fence: w.send_flags & sf::FENCE != 0,
        bind: (opcode == SendOp::BindMw).then_some(BindRequest {
            mw_rkey: w.rkey,
            new_rkey: w.imm_data,
            mr_key: w.swap as u32,
            addr: w.remote_addr,
            length: w.compare_add,
            access: (w.swap >> 32) as u32,
        }),
        reg: (opcode == SendOp::RegMr).then_some(RegRequest {
            key: w.rkey,
            access: w.imm_data,
            iova: w.remote_addr,
            length: w.compare_add,
        }),
    })
}

/// A decoded receive WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWork {
    /// The caller's id, returned in the completion.
    pub wr_id: u64,
    /// Where the message goes.
    pub local: SgList,
}

/// A decoded send WQE of a UD QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdSendWork {
    /// The caller's id, returned in the completion.
    pub wr_id: u64,
    /// The local data.
    pub payload: Payload,
    /// Immediate data (big-endian, as posted) of SEND_WITH_IMM.
    pub imm: Option<u32>,
    /// The address handle's destination GID.
    pub dgid: [u8; 16],
    /// The destination QP.
    pub remote_qpn: u32,
    /// The Q_Key as posted (bit 31 set: the QP's own, which the caller substitutes).
    pub remote_qkey: u32,
    /// Completes with a CQE even when the QP signals only requested ones.
    pub signaled: bool,
    /// Sets the solicited event bit.
    pub solicited: bool,
}

impl UdSendWork {
    /// The payload's length in bytes.
    pub fn len(&self) -> u32 {
        match self.payload {
            Payload::Sges(l) => l.total(),
            Payload::Inline(n) => n,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The send flags a UD provider may set (no fence: UD has no RDMA READ or atomics to wait for).
const UD_SEND_FLAGS: u32 = sf::SIGNALED | sf::SOLICITED | sf::INLINE | sf::IP_CSUM;

/// Judges a send WQE copied out of a UD QP's ring: SEND or SEND_WITH_IMM with its address
/// vector (`abi::UdAv`); what the provider cannot have written is fatal, as for RC.
pub fn judge_ud_send(w: &SendWqe, sq_sig_all: bool) -> Judged<UdSendWork> {
    let imm = match w.opcode {
        op::SEND => None,
        op::SEND_WITH_IMM => Some(w.imm_data),
        _ => return Judged::Fatal,
    };
    let av = w.ud_av();
    let inline = w.send_flags & sf::INLINE != 0;
    let sized = if inline {
        w.num_sge == 0 && w.inline_len as usize <= abi::MAX_INLINE
    } else {
        w.num_sge as usize <= MAX_SEND_SGE && w.inline_len == 0
    };
    if w.send_flags & !UD_SEND_FLAGS != 0 || w.reserved0 != 0 || av.reserved != [0; 2] || !sized {
        return Judged::Fatal;
    }
    let payload = if inline {
        Payload::Inline(w.inline_len)
    } else {
        let sges = (0..w.num_sge as usize).map_while(|i| w.sge(i));
        match SgList::new(sges) {
            Some(l) => Payload::Sges(l),
            None => return Judged::Refused,
        }
    };
    Judged::Usable(UdSendWork {
        wr_id: w.wr_id,
        payload,
        imm,
        dgid: av.dgid,
        remote_qpn: av.remote_qpn,
        remote_qkey: av.remote_qkey,
        signaled: sq_sig_all || w.send_flags & sf::SIGNALED != 0,
        solicited: w.send_flags & sf::SOLICITED != 0,
    })
}

/// Judges a receive WQE (RQ or SRQ).
pub fn judge_recv(w: &RecvWqe) -> Judged<RecvWork> {
    if w.reserved != 0 || w.num_sge as usize > MAX_RECV_SGE {
        return Judged::Fatal;
    }
    match SgList::new(w.sge.iter().take(w.num_sge as usize).copied()) {
        Some(local) => Judged::Usable(RecvWork {
            wr_id: w.wr_id,
            local,
        }),
        None => Judged::Refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::Sge;

    #[test]
    fn uc_opcodes() {
        let uc: [u32; 6] = [
            op::SEND,
            op::SEND_WITH_IMM,
            op::RDMA_WRITE,
            op::RDMA_WRITE_WITH_IMM,
            op::BIND_MW,
            op::LOCAL_INV,
        ];
        for o in 0..32 {
            if let Some(s) = SendOp::from_ib(o) {
                assert_eq!(s.on_uc(), uc.contains(&o), "opcode {o}");
            }
        }
    }

    fn sge(len: u32) -> Sge {
        Sge {
            addr: 0x1000,
            length: len,
            lkey: 0x101,
        }
    }

    fn write(n: u32) -> SendWqe {
        let mut w = SendWqe {
            wr_id: 9,
            opcode: op::RDMA_WRITE,
            num_sge: n,
            remote_addr: 0x5000,
            rkey: 0x202,
            ..Default::default()
        };
        for i in 0..n as usize {
            w.set_sge(i, sge(10));
        }
        w
    }

    fn ud_send(n: u32) -> SendWqe {
        let mut w = SendWqe {
            wr_id: 3,
            opcode: op::SEND,
            num_sge: n,
            ..Default::default()
        };
        w.set_ud_av(&abi::UdAv {
            dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            remote_qpn: 0x123,
            remote_qkey: 0x8000_0000,
            reserved: [0; 2],
        });
        for i in 0..n as usize {
            w.set_sge(i, sge(10));
        }
        w
    }

    #[test]
    fn a_ud_send_decodes_with_its_address_vector() {
        let Judged::Usable(s) = judge_ud_send(&ud_send(2), false) else {
            panic!()
        };
        assert_eq!(
            (s.remote_qpn, s.remote_qkey, s.imm, s.len()),
            (0x123, 0x8000_0000, None, 20)
        );
        assert_eq!(s.dgid[0], 0xfe);
        let mut w = ud_send(0);
        w.opcode = op::SEND_WITH_IMM;
        w.imm_data = 0x0102_0304;
        w.send_flags = sf::INLINE | sf::SOLICITED;
        w.inline_len = 5;
        let Judged::Usable(s) = judge_ud_send(&w, true) else {
            panic!()
        };
        assert_eq!(
            (s.imm, s.payload, s.signaled, s.solicited),
            (Some(0x0102_0304), Payload::Inline(5), true, true)
        );
    }

    #[test]
    fn a_ud_wqe_the_provider_cannot_write_is_fatal() {
        let ok = ud_send(1);
        let mut cases = [ok; 6];
        cases[0].opcode = op::RDMA_WRITE; // UD sends only
        cases[1].send_flags = sf::FENCE;
        cases[2].reserved0 = 1;
        let mut av = ok.ud_av();
        av.reserved[1] = 1;
        cases[3].set_ud_av(&av);
        cases[4].num_sge = limits::MAX_SEND_SGE + 1;
        cases[5].inline_len = 1;
        for (i, w) in cases.iter().enumerate() {
            assert!(matches!(judge_ud_send(w, false), Judged::Fatal), "case {i}");
        }
        // The GID's bytes lie where RC has rkey and reserved1: they are not judged as those.
        let mut av = ok.ud_av();
        av.dgid = [0xff; 16];
        let mut w = ok;
        w.set_ud_av(&av);
        assert!(matches!(judge_ud_send(&w, false), Judged::Usable(_)));
    }

    #[test]
    fn reg_mr_only_from_the_kernel() {
        let mut w = SendWqe {
            opcode: op::REG_MR,
            rkey: 0x0004_2a07,
            imm_data: super::super::ib::access::LOCAL_WRITE,
            remote_addr: 0xffff_8880_0000_1000,
            compare_add: 8192,
            ..SendWqe::default()
        };
        // A user ring cannot hold one: the provider never writes it.
        assert_eq!(judge_send(&w, false, false), Judged::Fatal);
        let Judged::Usable(s) = judge_kernel_send(&w, false, false) else {
            panic!("a kernel REG_MR is usable");
        };
        assert_eq!(s.op, SendOp::RegMr);
        assert!(s.op.is_local());
        assert_eq!(
            s.reg,
            Some(RegRequest {
                key: 0x0004_2a07,
                access: super::super::ib::access::LOCAL_WRITE,
                iova: 0xffff_8880_0000_1000,
                length: 8192,
            })
        );
        // It carries no data.
        w.num_sge = 1;
        assert_eq!(judge_kernel_send(&w, false, false), Judged::Fatal);
    }

    #[test]
    fn a_plain_write_decodes() {
        let Judged::Usable(s) = judge_send(&write(2), false, false) else {
            panic!()
        };
        assert_eq!(s.op, SendOp::RdmaWrite);
        let Payload::Sges(l) = s.payload else {
            panic!()
        };
        assert_eq!(l.sges().len(), 2);
        assert_eq!(l.total(), 20);
        assert_eq!(
            (s.remote_addr, s.rkey, s.imm, s.signaled),
            (0x5000, 0x202, None, false)
        );
        let Judged::Usable(s) = judge_send(&write(0), true, false) else {
            panic!()
        };
        assert!(s.signaled, "sq_sig_all signals every WQE");
    }

    #[test]
    fn what_the_provider_cannot_write_is_fatal() {
        let ok = write(1);
        let mut cases = [ok; 7];
        cases[0].opcode = 7; // IB_WR_BIND_MW: not ours
        cases[1].send_flags = 1 << 5;
        cases[2].reserved0 = 1;
        cases[3].reserved1 = 1;
        cases[4].num_sge = limits::MAX_SEND_SGE + 1;
        cases[5].inline_len = 1; // without IBV_SEND_INLINE
        cases[6].send_flags = sf::INLINE; // with SGEs
        for (i, w) in cases.iter().enumerate() {
            assert_eq!(judge_send(w, false, true), Judged::Fatal, "case {i}");
        }
        let mut inline = SendWqe {
            opcode: op::SEND,
            send_flags: sf::INLINE,
            inline_len: abi::MAX_INLINE as u32 + 1,
            ..Default::default()
        };
        assert_eq!(judge_send(&inline, false, true), Judged::Fatal);
        inline.inline_len = abi::MAX_INLINE as u32;
        assert_eq!(
            judge_send(&inline, false, true),
            Judged::Usable(SendWork {
                wr_id: 0,
                op: SendOp::Send,
                payload: Payload::Inline(abi::MAX_INLINE as u32),
                remote_addr: 0,
                rkey: 0,
                imm: None,
                atomic: None,
                signaled: false,
                solicited: false,
                fence: false,
                bind: None,
                reg: None,
            })
        );
    }

    #[test]
    fn the_longest_lists_decode() {
        let n = limits::MAX_SEND_SGE;
        let Judged::Usable(s) = judge_send(&write(n), false, false) else {
            panic!()
        };
        let Payload::Sges(l) = s.payload else {
            panic!()
        };
        assert_eq!((l.sges().len(), l.total()), (n as usize, 10 * n));
        let mut r = RecvWqe {
            num_sge: limits::MAX_RECV_SGE,
            ..Default::default()
        };
        r.sge = [sge(3); abi::MAX_SGE];
        let Judged::Usable(w) = judge_recv(&r) else {
            panic!()
        };
        assert_eq!(w.local.total(), 3 * limits::MAX_RECV_SGE);
        // A list key is the kernel's: refused as the inline key is.
        let mut w = write(3);
        w.set_sge(
            2,
            Sge {
                lkey: LIST_LKEY,
                ..sge(1)
            },
        );
        assert_eq!(judge_send(&w, false, true), Judged::Refused);
        r.sge[31].lkey = LIST_LKEY;
        assert_eq!(judge_recv(&r), Judged::Refused);
    }

    #[test]
    fn well_formed_but_unusable_is_refused() {
        let mut w = write(2);
        w.set_sge(
            1,
            Sge {
                lkey: INLINE_LKEY,
                ..sge(1)
            },
        );
        assert_eq!(judge_send(&w, false, true), Judged::Refused);
        let mut w = write(2);
        w.set_sge(0, sge(u32::MAX));
        assert_eq!(
            judge_send(&w, false, true),
            Judged::Refused,
            "lengths overflow"
        );
        let inline = SendWqe {
            opcode: op::SEND,
            send_flags: sf::INLINE,
            inline_len: 4,
            ..Default::default()
        };
        assert_eq!(
            judge_send(&inline, false, false),
            Judged::Refused,
            "no inline support"
        );
        let read = SendWqe {
            opcode: op::RDMA_READ,
            ..inline
        };
        assert_eq!(
            judge_send(&read, false, true),
            Judged::Refused,
            "inline READ"
        );
    }

    #[test]
    fn atomics_and_immediates() {
        let mut w = write(1);
        w.opcode = op::ATOMIC_FETCH_AND_ADD;
        w.compare_add = 5;
        w.swap = 99;
        let Judged::Usable(s) = judge_send(&w, false, false) else {
            panic!()
        };
        assert_eq!(s.atomic, Some((0, 5)));
        w.opcode = op::ATOMIC_CMP_AND_SWP;
        let Judged::Usable(s) = judge_send(&w, false, false) else {
            panic!()
        };
        assert_eq!(s.atomic, Some((5, 99)));
        w.opcode = op::SEND_WITH_IMM;
        w.imm_data = 0x1234;
        w.send_flags = sf::SOLICITED | sf::FENCE;
        let Judged::Usable(s) = judge_send(&w, false, false) else {
            panic!()
        };
        assert_eq!(
            (s.imm, s.atomic, s.solicited, s.fence),
            (Some(0x1234), None, true, true)
        );
    }

    /// ATOMIC WRITE and FLUSH carry their operands in the WQE and no data.
    #[test]
    fn atomic_write_and_flush() {
        let w = SendWqe {
            opcode: op::ATOMIC_WRITE,
            remote_addr: 64,
            rkey: 3,
            compare_add: 0x0102_0304_0506_0708,
            swap: 7,
            ..Default::default()
        };
        let Judged::Usable(s) = judge_send(&w, false, false) else {
            panic!()
        };
        assert_eq!(
            (s.op, s.atomic, s.rkey, s.remote_addr),
            (SendOp::AtomicWrite, Some((0, 0x0102_0304_0506_0708)), 3, 64)
        );
        let f = SendWqe {
            opcode: op::FLUSH,
            compare_add: 4096,
            swap: 1 | 1 << 8,
            ..w
        };
        let Judged::Usable(s) = judge_send(&f, false, false) else {
            panic!()
        };
        assert_eq!((s.op, s.atomic), (SendOp::Flush, Some((1 | 1 << 8, 4096))));
        for mut bad in [w, f] {
            bad.num_sge = 1;
            assert_eq!(judge_send(&bad, false, true), Judged::Fatal, "with an SGE");
            bad.num_sge = 0;
            bad.send_flags = sf::INLINE;
            assert_eq!(judge_send(&bad, false, true), Judged::Fatal, "inline");
        }
    }

    #[test]
    fn receives() {
        let mut r = RecvWqe {
            wr_id: 3,
            num_sge: 2,
            ..Default::default()
        };
        r.sge[0] = sge(8);
        r.sge[1] = sge(8);
        let Judged::Usable(w) = judge_recv(&r) else {
            panic!()
        };
        assert_eq!((w.wr_id, w.local.total()), (3, 16));
        r.sge[1].length = u32::MAX;
        assert_eq!(judge_recv(&r), Judged::Refused);
        r.num_sge = limits::MAX_RECV_SGE + 1;
        assert_eq!(
            judge_recv(&r),
            Judged::Fatal,
            "more SGEs than the device carries"
        );
        r.num_sge = 1;
        r.reserved = 1;
        assert_eq!(judge_recv(&r), Judged::Fatal);
    }
}
