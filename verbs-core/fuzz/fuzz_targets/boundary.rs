// SPDX-License-Identifier: GPL-2.0

//! The kernel/user boundary of verbs-core, fed arbitrary bytes: send and receive WQEs as the
//! kernel copies them out of a ring, `modify_qp` calls against model QPs, ring indices, the
//! direct verbs' driver data and create capacities. Every verdict is checked against what the
//! ABI and the verbs say it must be (each condition written out here, independently of the
//! code under test; the transition table against the kernel's own, transcribed), not only for
//! panics.
//!
//! Input: a sequence of records, each a kind byte then the bytes its operation reads (zero past
//! the end of the input). The kind's low 3 bits pick the operation: 0 a send WQE (256 bytes),
//! 1 a receive WQE (128), 2, 6 and 7 a `modify_qp` (73), 3 ring indices (13), 4 driver data
//! (41), 5 create capacities (20); its high 5 bits are the operation's flags. Several flags
//! "tame" fields (small opcodes, counts and states, masks from the transition table) so that the
//! fuzzer spends its time near the boundaries rather than on values refused at the first check;
//! untamed bytes are always possible too.
#![no_main]

use core::mem::offset_of;
use libfuzzer_sys::fuzz_target;
use verbs_core::abi::{self, RecvWqe, SendWqe, Sge};
use verbs_core::caps::{limits, BeyondLimits, Caps};
use verbs_core::ib::{attr_mask as m, send_flags as sf, wr_opcode as op, QpState, QpType};
use verbs_core::qp::{self, AddressVector, ModifyAttr, ModifyError, QpAttrs, PSN_MASK};
use verbs_core::queue::{self, Overflow};
use verbs_core::udata::{self, DvModify, UdataError, MODIFY_QP_CMD_SIZE, MODIFY_QP_PLANES};
use verbs_core::wqe::{self, Judged, Payload, SendOp};

/// The rest of the input, read front to back; past its end every byte reads as zero (so every
/// record is whole and a short input is a WQE of mostly zeros, which is a usable one).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = N.min(self.0.len());
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        b
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_ne_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_ne_bytes(self.bytes())
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

/// `struct metaroce_sge` at `at` of a ring entry's bytes (host byte order, as the C struct).
fn sge_at(b: &[u8], at: usize) -> Sge {
    Sge {
        addr: u64_at(b, at),
        length: u32_at(b, at + 8),
        lkey: u32_at(b, at + 12),
    }
}

/// The SGE at `at` of an entry, zero past its end.
fn sge_in(b: &[u8], at: usize) -> Sge {
    if at + 16 <= b.len() {
        sge_at(b, at)
    } else {
        Sge::default()
    }
}

// The ring entries' layouts, as uapi/metaroce-abi.h has them: the byte offsets the entries
// below are read at, checked against the Rust structs so the two cannot drift apart.
const SEND_WQE_SIZE: usize = 256;
const SEND_DATA: usize = 64;
const RECV_WQE_SIZE: usize = 128;
const RECV_SGE: usize = 16;
const _: () = {
    assert!(SEND_WQE_SIZE == abi::SEND_WQE_SIZE && RECV_WQE_SIZE == abi::RECV_WQE_SIZE);
    assert!(offset_of!(SendWqe, wr_id) == 0);
    assert!(offset_of!(SendWqe, opcode) == 8);
    assert!(offset_of!(SendWqe, send_flags) == 12);
    assert!(offset_of!(SendWqe, num_sge) == 16);
    assert!(offset_of!(SendWqe, inline_len) == 20);
    assert!(offset_of!(SendWqe, imm_data) == 24);
    assert!(offset_of!(SendWqe, reserved0) == 28);
    assert!(offset_of!(SendWqe, remote_addr) == 32);
    assert!(offset_of!(SendWqe, rkey) == 40);
    assert!(offset_of!(SendWqe, reserved1) == 44);
    assert!(offset_of!(SendWqe, compare_add) == 48);
    assert!(offset_of!(SendWqe, swap) == 56);
    assert!(offset_of!(SendWqe, data) == SEND_DATA);
    assert!(offset_of!(RecvWqe, wr_id) == 0);
    assert!(offset_of!(RecvWqe, num_sge) == 8);
    assert!(offset_of!(RecvWqe, reserved) == 12);
    assert!(offset_of!(RecvWqe, sge) == RECV_SGE);
};

/// A send WQE from the bytes of its ring entry, field by field (what the kernel's whole-entry
/// copy amounts to, without `unsafe`).
fn send_wqe(b: &[u8; SEND_WQE_SIZE]) -> SendWqe {
    SendWqe {
        wr_id: u64_at(b, 0),
        opcode: u32_at(b, 8),
        send_flags: u32_at(b, 12),
        num_sge: u32_at(b, 16),
        inline_len: u32_at(b, 20),
        imm_data: u32_at(b, 24),
        reserved0: u32_at(b, 28),
        remote_addr: u64_at(b, 32),
        rkey: u32_at(b, 40),
        reserved1: u32_at(b, 44),
        compare_add: u64_at(b, 48),
        swap: u64_at(b, 56),
        // An entry of the smallest size: the SGEs past it read as zero, as the kernel's copy
        // of such an entry has them.
        data: core::array::from_fn(|i| b.get(SEND_DATA + i).copied().unwrap_or(0)),
    }
}

/// A receive WQE from the bytes of its ring entry.
fn recv_wqe(b: &[u8; RECV_WQE_SIZE]) -> RecvWqe {
    RecvWqe {
        wr_id: u64_at(b, 0),
        num_sge: u32_at(b, 8),
        reserved: u32_at(b, 12),
        sge: core::array::from_fn(|i| sge_in(b, RECV_SGE + 16 * i)),
    }
}

/// The send flags the ABI defines (`IB_SEND_*` a provider may set).
const KNOWN_SEND_FLAGS: u32 = sf::FENCE | sf::SIGNALED | sf::SOLICITED | sf::INLINE | sf::IP_CSUM;
const MAX_SEND_SGE: usize = limits::MAX_SEND_SGE as usize;
const MAX_RECV_SGE: usize = limits::MAX_RECV_SGE as usize;

/// Whether a well-formed SGE list is one the device carries: its lengths sum to a message
/// length (`u32`) and none names the kernel's inline key (the two things that refuse it).
fn sges_ok(sges: &[Sge]) -> bool {
    let total = sges.iter().try_fold(0u32, |t, s| t.checked_add(s.length));
    total.is_some()
        && sges
            .iter()
            .all(|s| s.lkey != wqe::INLINE_LKEY && s.lkey != wqe::LIST_LKEY)
}

/// Checks the verdict on a list the device accepted: at most `wqe::MAX_LIST` entries, exactly the
/// ones posted, none with the inline key, a total that fits and that `total()` reports.
fn check_sg_list(l: &wqe::SgList, posted: &[Sge]) {
    assert!(l.sges().len() <= wqe::MAX_LIST);
    assert_eq!(l.sges(), posted, "the SGEs are the ones posted, in order");
    assert!(l
        .sges()
        .iter()
        .all(|s| s.lkey != wqe::INLINE_LKEY && s.lkey != wqe::LIST_LKEY));
    let total = l
        .sges()
        .iter()
        .try_fold(0u32, |t, s| t.checked_add(s.length));
    assert_eq!(total, Some(l.total()), "the total fits a u32");
}

/// Judges a send WQE (its entry's bytes `b`) and checks the verdict against the ABI's rules.
fn check_send(b: &[u8; SEND_WQE_SIZE], sq_sig_all: bool, inline_ok: bool) {
    let w = send_wqe(b);
    let v = wqe::judge_send(&w, sq_sig_all, inline_ok);
    assert_eq!(
        v,
        wqe::judge_send(&w, sq_sig_all, inline_ok),
        "a pure function"
    );

    let inline = w.send_flags & sf::INLINE != 0;
    let sized = if inline {
        w.num_sge == 0 && w.inline_len as usize <= abi::MAX_INLINE
    } else {
        w.num_sge as usize <= MAX_SEND_SGE && w.inline_len == 0
    };
    // What the provider can never write: the ring is broken. The opcodes are 0..=9
    // (IB_WR_RDMA_WRITE .. IB_WR_SEND_WITH_INV), 14 (IB_WR_FLUSH) and 15 (IB_WR_ATOMIC_WRITE);
    // the two local ones (LOCAL_INV, BIND_MW), FLUSH and ATOMIC_WRITE carry no data.
    let local = matches!(
        w.opcode,
        op::LOCAL_INV | op::BIND_MW | op::FLUSH | op::ATOMIC_WRITE
    );
    let known = w.opcode <= op::SEND_WITH_INV || matches!(w.opcode, op::FLUSH | op::ATOMIC_WRITE);
    let fatal = !known
        || w.send_flags & !KNOWN_SEND_FLAGS != 0
        || w.reserved0 != 0
        || w.reserved1 != 0
        || !sized
        || (local && (inline || w.num_sge != 0));
    assert_eq!(
        v == Judged::Fatal,
        fatal,
        "fatal exactly on a broken entry: {w:?}"
    );
    let carries_payload = matches!(
        w.opcode,
        op::SEND | op::SEND_WITH_IMM | op::SEND_WITH_INV | op::RDMA_WRITE | op::RDMA_WRITE_WITH_IMM
    );
    // The SGEs are read only when the entry is well formed (so num_sge <= MAX_SEND_SGE here).
    let posted: Vec<Sge> = (0..w.num_sge as usize)
        .take(MAX_SEND_SGE)
        .map(|i| sge_in(b, SEND_DATA + 16 * i))
        .collect();
    let refused = if inline {
        !inline_ok || !carries_payload
    } else {
        !sges_ok(&posted)
    };
    assert_eq!(v == Judged::Refused, !fatal && refused, "refused: {w:?}");

    if let Judged::Usable(s) = v {
        assert_eq!(SendOp::from_ib(w.opcode), Some(s.op));
        // LOCAL_INV and SEND_WITH_INV name their rkey where immediate data would be.
        let rkey = if matches!(w.opcode, op::LOCAL_INV | op::SEND_WITH_INV) {
            w.imm_data
        } else {
            w.rkey
        };
        assert_eq!(
            (s.wr_id, s.remote_addr, s.rkey),
            (w.wr_id, w.remote_addr, rkey)
        );
        let bind = (w.opcode == op::BIND_MW).then_some(verbs_core::mw::BindRequest {
            mw_rkey: w.rkey,
            new_rkey: w.imm_data,
            mr_key: w.swap as u32,
            addr: w.remote_addr,
            length: w.compare_add,
            access: (w.swap >> 32) as u32,
        });
        assert_eq!(
            s.bind, bind,
            "a bind iff BIND_MW, its fields as the ABI lays them out"
        );
        let with_imm = matches!(w.opcode, op::SEND_WITH_IMM | op::RDMA_WRITE_WITH_IMM);
        assert_eq!(
            s.imm,
            with_imm.then_some(w.imm_data),
            "imm iff a *WithImm op"
        );
        let atomic = match w.opcode {
            op::ATOMIC_CMP_AND_SWP => Some((w.compare_add, w.swap)),
            op::ATOMIC_FETCH_AND_ADD | op::ATOMIC_WRITE => Some((0, w.compare_add)),
            op::FLUSH => Some((w.swap, w.compare_add)),
            _ => None,
        };
        assert_eq!(s.atomic, atomic, "atomic iff an atomic op");
        assert_eq!(s.signaled, sq_sig_all || w.send_flags & sf::SIGNALED != 0);
        assert_eq!(s.solicited, w.send_flags & sf::SOLICITED != 0);
        assert_eq!(s.fence, w.send_flags & sf::FENCE != 0);
        match s.payload {
            Payload::Inline(len) => {
                assert!(inline && inline_ok && carries_payload);
                assert_eq!(len, w.inline_len);
                assert!(len as usize <= abi::MAX_INLINE);
            }
            Payload::Sges(l) => {
                assert!(!inline);
                check_sg_list(&l, &posted);
            }
        }
    }

    // What the verdict must not depend on. The bytes of the data area it does not read: all of
    // them for inline data (the caller copies the payload later), those past the posted SGEs
    // otherwise.
    let used = if inline {
        0
    } else {
        (w.num_sge as usize).min(abi::MAX_SEND_SGE) * 16
    };
    let mut other = *b;
    for x in &mut other[SEND_DATA + used..] {
        *x ^= 0xa5;
    }
    assert_eq!(wqe::judge_send(&send_wqe(&other), sq_sig_all, inline_ok), v);
    // sq_sig_all changes only `signaled`; inline support matters only to inline WQEs.
    let flipped = wqe::judge_send(&w, !sq_sig_all, inline_ok);
    match (v, flipped) {
        (Judged::Usable(a), Judged::Usable(b)) => assert_eq!(
            wqe::SendWork {
                signaled: false,
                ..a
            },
            wqe::SendWork {
                signaled: false,
                ..b
            }
        ),
        (a, b) => assert_eq!(a, b),
    }
    if !inline {
        assert_eq!(wqe::judge_send(&w, sq_sig_all, !inline_ok), v);
    }
}

/// Judges a send WQE of a UD QP (its entry's bytes `b`) and checks the verdict: its address
/// vector is the 32 bytes from `remote_addr` on, as the C header lays it out.
fn check_ud_send(b: &[u8; SEND_WQE_SIZE], sq_sig_all: bool) {
    let w = send_wqe(b);
    let v = wqe::judge_ud_send(&w, sq_sig_all);
    let av_at = abi::UD_AV_OFFSET;
    let word = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
    let inline = w.send_flags & sf::INLINE != 0;
    let sized = if inline {
        w.num_sge == 0 && w.inline_len as usize <= abi::MAX_INLINE
    } else {
        w.num_sge as usize <= MAX_SEND_SGE && w.inline_len == 0
    };
    let fatal = !matches!(w.opcode, op::SEND | op::SEND_WITH_IMM)
        || w.send_flags & !(KNOWN_SEND_FLAGS & !sf::FENCE) != 0
        || w.reserved0 != 0
        || word(av_at + 24) != 0
        || word(av_at + 28) != 0
        || !sized;
    assert_eq!(
        v == Judged::Fatal,
        fatal,
        "UD fatal exactly on a broken entry: {w:?}"
    );
    let posted: Vec<Sge> = (0..w.num_sge as usize)
        .take(MAX_SEND_SGE)
        .map(|i| sge_in(b, SEND_DATA + 16 * i))
        .collect();
    let refused = !inline && !sges_ok(&posted);
    assert_eq!(v == Judged::Refused, !fatal && refused, "UD refused: {w:?}");
    if let Judged::Usable(s) = v {
        assert_eq!(
            &s.dgid[..],
            &b[av_at..av_at + 16],
            "the GID is the AV's bytes"
        );
        assert_eq!(
            (s.remote_qpn, s.remote_qkey),
            (word(av_at + 16), word(av_at + 20))
        );
        assert_eq!(s.imm, (w.opcode == op::SEND_WITH_IMM).then_some(w.imm_data));
        assert_eq!(s.signaled, sq_sig_all || w.send_flags & sf::SIGNALED != 0);
        match s.payload {
            Payload::Inline(len) => assert!(inline && len == w.inline_len),
            Payload::Sges(l) => check_sg_list(&l, &posted),
        }
    }
}

/// Judges a receive WQE (its entry's bytes `b`) and checks the verdict.
fn check_recv(b: &[u8; RECV_WQE_SIZE]) {
    let w = recv_wqe(b);
    let v = wqe::judge_recv(&w);
    assert_eq!(v, wqe::judge_recv(&w), "a pure function");
    let fatal = w.reserved != 0 || w.num_sge as usize > MAX_RECV_SGE;
    assert_eq!(
        v == Judged::Fatal,
        fatal,
        "fatal exactly on a broken entry: {w:?}"
    );
    let posted: Vec<Sge> = w.sge.iter().take(w.num_sge as usize).copied().collect();
    assert_eq!(
        v == Judged::Refused,
        !fatal && !sges_ok(&posted),
        "refused: {w:?}"
    );
    if let Judged::Usable(r) = v {
        assert_eq!(r.wr_id, w.wr_id);
        check_sg_list(&r.local, &posted);
    }
    // The entries past the posted ones are not read.
    let used = (w.num_sge as usize).min(abi::MAX_RECV_SGE) * 16;
    let mut other = *b;
    for x in &mut other[RECV_SGE + used..] {
        *x ^= 0x5a;
    }
    assert_eq!(wqe::judge_recv(&recv_wqe(&other)), v);
}

/// A QP as its owner (the driver) keeps it: `prepare` only judges, the caller commits.
#[derive(Clone, Copy, Debug)]
struct ModelQp {
    t: QpType,
    state: QpState,
    attrs: QpAttrs,
}

/// The state `modify_qp` asks for: `qp_state` with IB_QP_STATE (None: no such state), else the
/// current one.
fn requested(cur: QpState, a: &ModifyAttr, mask: u32) -> Option<QpState> {
    if mask & m::STATE != 0 {
        QpState::from_ib(a.qp_state)
    } else {
        Some(cur)
    }
}

/// What the QP's attributes must be after an accepted modify: each field the mask names takes
/// the caller's value (PSNs cut to 24 bits), every other one is unchanged.
fn expected_attrs(old: &QpAttrs, a: &ModifyAttr, mask: u32) -> QpAttrs {
    let pick = |bit: u32, new: u32, cur: u32| if mask & bit != 0 { new } else { cur };
    let pick8 = |bit: u32, new: u8, cur: u8| if mask & bit != 0 { new } else { cur };
    QpAttrs {
        path_mtu: pick(m::PATH_MTU, a.path_mtu, old.path_mtu),
        qkey: pick(m::QKEY, a.qkey, old.qkey),
        rq_psn: pick(m::RQ_PSN, a.rq_psn & PSN_MASK, old.rq_psn),
        sq_psn: pick(m::SQ_PSN, a.sq_psn & PSN_MASK, old.sq_psn),
        dest_qp_num: pick(m::DEST_QPN, a.dest_qp_num, old.dest_qp_num),
        access_flags: pick(m::ACCESS_FLAGS, a.qp_access_flags, old.access_flags),
        pkey_index: if mask & m::PKEY_INDEX != 0 {
            a.pkey_index
        } else {
            old.pkey_index
        },
        port_num: pick(m::PORT, a.port_num, old.port_num),
        max_rd_atomic: pick8(m::MAX_QP_RD_ATOMIC, a.max_rd_atomic, old.max_rd_atomic),
        max_dest_rd_atomic: pick8(
            m::MAX_DEST_RD_ATOMIC,
            a.max_dest_rd_atomic,
            old.max_dest_rd_atomic,
        ),
        min_rnr_timer: pick8(m::MIN_RNR_TIMER, a.min_rnr_timer, old.min_rnr_timer),
        timeout: pick8(m::TIMEOUT, a.timeout, old.timeout),
        retry_cnt: pick8(m::RETRY_CNT, a.retry_cnt, old.retry_cnt),
        rnr_retry: pick8(m::RNR_RETRY, a.rnr_retry, old.rnr_retry),
        sq_draining: old.sq_draining,
        av: if mask & m::AV != 0 { a.ah } else { old.av },
        av_set: old.av_set || mask & m::AV != 0,
    }
}

/// Runs one `modify_qp` against the model QP: checks the verdict (refused exactly when one of
/// the documented reasons holds, and then for one of them), commits an accepted change.
fn check_modify(qp: &mut ModelQp, a: &ModifyAttr, mask: u32) {
    let (cur, old, t) = (qp.state, qp.attrs, qp.t);
    let r = qp::prepare(cur, &old, t, a, mask);
    assert_eq!(r, qp::prepare(cur, &old, t, a, mask), "a pure function");

    let next = requested(cur, a, mask);
    let to = next.unwrap_or(cur);
    // Each reason to refuse the call, as the verbs (and the device's limits) give it.
    let transition = next.is_none()
        || mask != 0 && !qp::modify_is_ok(cur, to, t, mask)
        || mask & m::CUR_STATE != 0 && QpState::from_ib(a.cur_qp_state) != Some(cur);
    let path_mtu = mask & m::PATH_MTU != 0 && !(1..=5).contains(&a.path_mtu);
    let rd_atomic = mask & m::MAX_QP_RD_ATOMIC != 0
        && u32::from(a.max_rd_atomic) > limits::MAX_RD_ATOM
        || mask & m::MAX_DEST_RD_ATOMIC != 0
            && u32::from(a.max_dest_rd_atomic) > limits::MAX_RD_ATOM;
    let no_destination = mask & m::AV != 0 && a.ah.dgid == [0; 16];
    let no_av = to == QpState::Rtr
        && cur != QpState::Rtr
        && matches!(t, QpType::Rc | QpType::Uc)
        && !old.av_set
        && mask & m::AV == 0;
    let refused = transition || path_mtu || rd_atomic || no_destination || no_av;
    assert_eq!(
        r.is_err(),
        refused,
        "{cur:?} {t:?} mask {mask:#x} {a:?}: {r:?}"
    );

    let c = match r {
        Err(e) => {
            let why = match e {
                ModifyError::Transition => transition,
                ModifyError::PathMtu => path_mtu,
                ModifyError::RdAtomic => rd_atomic,
                ModifyError::NoDestination => no_destination,
                ModifyError::NoAddressVector => no_av,
            };
            assert!(
                why,
                "{e:?} without its reason: {cur:?} {t:?} {mask:#x} {a:?}"
            );
            return; // Nothing committed: the model is as it was.
        }
        Ok(c) => c,
    };
    if mask == 0 {
        assert_eq!(
            (c.state, c.attrs, c.access),
            (cur, old, None),
            "a zero mask changes nothing"
        );
    } else {
        assert!(qp::modify_is_ok(cur, c.state, t, mask));
    }
    assert_eq!(
        Some(c.state),
        next,
        "the state asked for (or the same without IB_QP_STATE)"
    );
    assert_eq!(c.attrs, expected_attrs(&old, a, mask));
    assert!(
        c.attrs.rq_psn <= PSN_MASK && c.attrs.sq_psn <= PSN_MASK,
        "PSNs are 24 bits"
    );
    assert_eq!(
        c.access,
        (mask & m::ACCESS_FLAGS != 0).then_some(a.qp_access_flags)
    );
    if c.state == QpState::Rtr && cur != QpState::Rtr && matches!(t, QpType::Rc | QpType::Uc) {
        assert!(c.attrs.av_set, "RTR without an address vector");
    }
    assert!(
        c.state != QpState::Sqe || cur == QpState::Sqe,
        "only the device enters SQE"
    );
    qp.state = c.state;
    qp.attrs = c.attrs;
}

/// What holds of every model QP between calls: a connected QP past INIT has a destination,
/// PSNs are 24 bits, and no `modify_qp` took it to SQE (the model starts in RESET).
fn check_model(qp: &ModelQp) {
    if matches!(qp.t, QpType::Rc | QpType::Uc)
        && matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
    {
        assert!(qp.attrs.av_set, "{qp:?}");
    }
    assert!(qp.attrs.rq_psn <= PSN_MASK && qp.attrs.sq_psn <= PSN_MASK);
    assert_ne!(qp.state, QpState::Sqe);
}

/// The transition table, from the state a QP is in with `mask` to every state: the kernel's
/// verdict; RESET and ERR always reachable (ERR but from RESET) with no attribute; and
/// IB_QP_STATE / IB_QP_RATE_LIMIT never decide a verdict (the core allows them with every
/// transition).
fn check_table(cur: QpState, t: QpType, mask: u32) {
    assert!(qp::modify_is_ok(cur, QpState::Reset, t, m::STATE));
    assert_eq!(
        qp::modify_is_ok(cur, QpState::Err, t, m::STATE),
        cur != QpState::Reset
    );
    for next in QpState::ALL {
        let ok = qp::modify_is_ok(cur, next, t, mask);
        assert_eq!(
            ok,
            kernel_modify_is_ok(cur, next, t, mask),
            "{cur:?} -> {next:?} {t:?} mask {mask:#x}: not the kernel's verdict"
        );
        assert_eq!(qp::modify_is_ok(cur, next, t, mask ^ m::RATE_LIMIT), ok);
        assert_eq!(qp::modify_is_ok(cur, next, t, mask ^ m::STATE), ok);
    }
}

/// The transition table around the `cur -> next` transition's own mask (its required
/// attributes and the optional ones `mask` names), where random masks rarely land: it and every
/// one-bit change of it (a required attribute missing, one not allowed added) get the kernel's
/// verdict.
fn check_table_around(cur: QpState, next: QpState, t: QpType, mask: u32) {
    let i = type_index(t);
    let (req, opt) = kernel_table(cur, next).map_or((0, 0), |(req, opt)| (req[i], opt[i]));
    let base = m::STATE | req | (mask & opt);
    for x in core::iter::once(base).chain((0..32).map(|b| base ^ (1 << b))) {
        assert_eq!(
            qp::modify_is_ok(cur, next, t, x),
            kernel_modify_is_ok(cur, next, t, x),
            "{cur:?} -> {next:?} {t:?} mask {x:#x}: not the kernel's verdict"
        );
    }
}

/// The state after `cur` on a QP's way up (RESET, INIT, RTR, RTS, then SQD and back), and out
/// of ERR; what a tamed `modify_qp` asks for half the time, so that the fuzzer gets deep.
fn successor(cur: QpState) -> QpState {
    use QpState::*;
    match cur {
        Reset => Init,
        Init => Rtr,
        Rtr | Sqd | Sqe => Rts,
        Rts => Sqd,
        Err => Reset,
    }
}

/// The kernel's `qp_state_table` (drivers/infiniband/core/verbs.c, Linux 7.3), transcribed
/// row by row for the QP types a RoCE device has, so that the fuzzer checks `modify_is_ok`
/// against the core's table on the host too (the module checks it at load, in the guest). A row
/// is (cur, next, required, optional), the masks indexed by `TYPES`' order: SMI, GSI, RC, UC,
/// UD. Transitions absent here are not valid.
fn kernel_table(cur: QpState, next: QpState) -> Option<([u32; 5], [u32; 5])> {
    use QpState::*;
    const NONE: [u32; 5] = [0; 5];
    const CUR: u32 = m::CUR_STATE;
    let same = |x: u32| [x; 5];
    Some(match (cur, next) {
        (_, Reset) => (NONE, NONE),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => (NONE, NONE),
        (Reset, Init) => (
            [
                m::PKEY_INDEX | m::QKEY,
                m::PKEY_INDEX | m::QKEY,
                m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS,
                m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS,
                m::PKEY_INDEX | m::PORT | m::QKEY,
            ],
            NONE,
        ),
        (Init, Init) => (
            NONE,
            [
                m::PKEY_INDEX | m::QKEY,
                m::PKEY_INDEX | m::QKEY,
                m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS,
                m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS,
                m::PKEY_INDEX | m::PORT | m::QKEY,
            ],
        ),
        (Init, Rtr) => (
            [
                0,
                0,
                m::AV
                    | m::PATH_MTU
                    | m::DEST_QPN
                    | m::RQ_PSN
                    | m::MAX_DEST_RD_ATOMIC
                    | m::MIN_RNR_TIMER,
                m::AV | m::PATH_MTU | m::DEST_QPN | m::RQ_PSN,
                0,
            ],
            [
                m::PKEY_INDEX | m::QKEY,
                m::PKEY_INDEX | m::QKEY,
                m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX,
                m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX,
                m::PKEY_INDEX | m::QKEY,
            ],
        ),
        (Rtr, Rts) => (
            [
                m::SQ_PSN,
                m::SQ_PSN,
                m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::SQ_PSN | m::MAX_QP_RD_ATOMIC,
                m::SQ_PSN,
                m::SQ_PSN,
            ],
            [
                CUR | m::QKEY,
                CUR | m::QKEY,
                CUR | m::ALT_PATH | m::ACCESS_FLAGS | m::MIN_RNR_TIMER | m::PATH_MIG_STATE,
                CUR | m::ALT_PATH | m::ACCESS_FLAGS | m::PATH_MIG_STATE,
                CUR | m::QKEY,
            ],
        ),
        (Rts | Sqd, Rts) => (
            NONE,
            [
                CUR | m::QKEY,
                CUR | m::QKEY,
                CUR | m::ACCESS_FLAGS | m::ALT_PATH | m::PATH_MIG_STATE | m::MIN_RNR_TIMER,
                CUR | m::ACCESS_FLAGS | m::ALT_PATH | m::PATH_MIG_STATE,
                CUR | m::QKEY,
            ],
        ),
        (Rts, Sqd) => (NONE, same(m::EN_SQD_ASYNC_NOTIFY)),
        (Sqd, Sqd) => (
            NONE,
            [
                m::PKEY_INDEX | m::QKEY,
                m::PKEY_INDEX | m::QKEY,
                m::PORT
                    | m::AV
                    | m::TIMEOUT
                    | m::RETRY_CNT
                    | m::RNR_RETRY
                    | m::MAX_QP_RD_ATOMIC
                    | m::MAX_DEST_RD_ATOMIC
                    | m::ALT_PATH
                    | m::ACCESS_FLAGS
                    | m::PKEY_INDEX
                    | m::MIN_RNR_TIMER
                    | m::PATH_MIG_STATE,
                m::AV | m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX | m::PATH_MIG_STATE,
                m::PKEY_INDEX | m::QKEY,
            ],
        ),
        // The kernel's row has no RC entry (all zero): SQE is not an RC state.
        (Sqe, Rts) => (
            NONE,
            [
                CUR | m::QKEY,
                CUR | m::QKEY,
                0,
                CUR | m::ACCESS_FLAGS,
                CUR | m::QKEY,
            ],
        ),
        _ => return None,
    })
}

/// `ib_modify_qp_is_ok` over [`kernel_table`], as verbs.c writes it.
fn kernel_modify_is_ok(cur: QpState, next: QpState, t: QpType, mask: u32) -> bool {
    use QpState::*;
    if mask & m::CUR_STATE != 0 && !matches!(cur, Rtr | Rts | Sqd | Sqe) {
        return false;
    }
    let Some((req, opt)) = kernel_table(cur, next) else {
        return false;
    };
    let (req, opt) = (req[type_index(t)], opt[type_index(t)]);
    mask & req == req && mask & !(req | opt | m::STATE | m::RATE_LIMIT) == 0
}

/// A `modify_qp`'s attributes from the input.
fn modify_attr(inp: &mut Input) -> ModifyAttr {
    ModifyAttr {
        qp_state: inp.u32(),
        cur_qp_state: inp.u32(),
        path_mtu: inp.u32(),
        qkey: inp.u32(),
        rq_psn: inp.u32(),
        sq_psn: inp.u32(),
        dest_qp_num: inp.u32(),
        qp_access_flags: inp.u32(),
        pkey_index: inp.u16(),
        port_num: inp.u32(),
        max_rd_atomic: inp.u8(),
        max_dest_rd_atomic: inp.u8(),
        min_rnr_timer: inp.u8(),
        timeout: inp.u8(),
        retry_cnt: inp.u8(),
        rnr_retry: inp.u8(),
        ah: AddressVector {
            dgid: inp.bytes(),
            sgid_index: inp.u8(),
            hop_limit: inp.u8(),
            traffic_class: inp.u8(),
            flow_label: inp.u32(),
            sl: inp.u8(),
        },
    }
}

/// The attribute mask bits the verbs define (IB_QP_STATE .. IB_QP_DEST_QPN, IB_QP_RATE_LIMIT).
const KNOWN_MASK: u32 = ((m::DEST_QPN << 1) - 1) | m::RATE_LIMIT;

/// Checks ring index arithmetic for a ring of `n` (a power of two) with the kernel's index `k`
/// and userspace's `u`, both ways round (the kernel consumes an SQ/RQ/SRQ and produces a CQ).
fn check_ring(k: u32, u: u32, n: u32, take: u32) {
    // Kernel as consumer: userspace's producer index may claim at most the ring.
    let avail = queue::available(k, u, n);
    match avail {
        Ok(a) => {
            assert!(a <= n);
            assert_eq!(k.wrapping_add(a), u, "consumer + available == producer");
            // Taking some of them leaves the rest.
            let took = if a == 0 { 0 } else { take % (a + 1) };
            assert_eq!(queue::available(k.wrapping_add(took), u, n), Ok(a - took));
        }
        Err(Overflow) => assert!(u.wrapping_sub(k) > n),
    }
    // Kernel as producer: room exactly while userspace has not fallen a whole ring behind
    // (or claims to be ahead, which reads as full).
    let room = queue::has_room(k, u, n);
    assert_eq!(room, matches!(queue::available(u, k, n), Ok(a) if a < n));
    let used = k.wrapping_sub(u);
    if used < n {
        assert!(queue::has_room(k.wrapping_add(n - used - 1), u, n));
        assert!(
            !queue::has_room(k.wrapping_add(n - used), u, n),
            "full after n - used"
        );
    } else {
        assert!(!room);
    }
    for i in [k, u, k.wrapping_add(take), u32::MAX, 0] {
        let s = queue::slot(i, n);
        assert!(s < n as usize);
        assert_eq!(s, (i % n) as usize);
        assert_eq!(queue::slot(i.wrapping_add(n), n), s, "slots repeat every n");
    }
}

/// Judges driver data (`head`, `tail_cleared`) and checks it against the ABI of
/// `struct metaroce_modify_qp_cmd`.
fn check_udata(head: &[u8], tail_cleared: bool) {
    assert!(head.len() <= MODIFY_QP_CMD_SIZE);
    let r = udata::modify_qp_cmd(head, tail_cleared);
    assert_eq!(
        r,
        udata::modify_qp_cmd(head, tail_cleared),
        "a pure function"
    );
    // The command as the kernel reads it: a short one is zero past its end.
    let mut cmd = [0u8; MODIFY_QP_CMD_SIZE];
    cmd[..head.len()].copy_from_slice(head);
    let comp_mask = u32_at(&cmd, 0);
    let plane_mask = u32_at(&cmd, 4);
    let expected = if head.is_empty() {
        Ok(DvModify { planes: None }) // a stock modify_qp
    } else if !tail_cleared || comp_mask & !MODIFY_QP_PLANES != 0 {
        Err(UdataError::Unsupported) // a newer provider's request
    } else if cmd[8..].iter().any(|b| *b != 0) {
        Err(UdataError::Invalid)
    } else {
        Ok(DvModify {
            planes: (comp_mask & MODIFY_QP_PLANES != 0).then_some(plane_mask),
        })
    };
    assert_eq!(r, expected, "{head:?} tail_cleared {tail_cleared}");
    if let Ok(DvModify { planes: Some(_) }) = r {
        assert!(comp_mask & MODIFY_QP_PLANES != 0);
    }
    if !head.is_empty() {
        assert_eq!(
            udata::modify_qp_cmd(&cmd, tail_cleared),
            r,
            "zero-extension is a no-op"
        );
    }
}

/// Checks a create's capacities against the device limits.
fn check_caps(asked: &Caps, has_srq: bool) {
    let r = Caps::check(asked, has_srq);
    let beyond = asked.max_send_wr > limits::MAX_QP_WR
        || asked.max_recv_wr > limits::MAX_QP_WR
        || asked.max_send_sge > limits::MAX_SEND_SGE
        || asked.max_recv_sge > limits::MAX_RECV_SGE
        || asked.max_inline_data > limits::MAX_INLINE;
    let Ok(got) = r else {
        assert_eq!(r, Err(BeyondLimits));
        assert!(beyond, "{asked:?} refused within the limits");
        return;
    };
    assert!(!beyond, "{asked:?} accepted beyond the limits");
    let ring = |asked: u32, got: u32| {
        assert!(got.is_power_of_two() && got >= asked && got <= limits::MAX_QP_WR);
        assert!(
            got / 2 < asked.max(1),
            "the smallest power of two that holds it"
        );
    };
    ring(asked.max_send_wr, got.max_send_wr);
    assert!(
        got.max_send_sge >= asked.max_send_sge.max(1) && got.max_send_sge <= limits::MAX_SEND_SGE
    );
    if has_srq {
        assert_eq!(
            (got.max_recv_wr, got.max_recv_sge),
            (0, 0),
            "no RQ with an SRQ"
        );
    } else {
        ring(asked.max_recv_wr, got.max_recv_wr);
        assert!(got.max_recv_sge >= asked.max_recv_sge.max(1));
        assert!(got.max_recv_sge <= limits::MAX_RECV_SGE);
    }
    let inline = if asked.max_inline_data > 0 {
        limits::MAX_INLINE
    } else {
        0
    };
    assert_eq!(got.max_inline_data, inline, "the whole inline area or none");
}

/// The QP types a RoCE device has, in `enum ib_qp_type` order (the kernel table's columns).
const TYPES: [QpType; 5] = [QpType::Smi, QpType::Gsi, QpType::Rc, QpType::Uc, QpType::Ud];

fn type_index(t: QpType) -> usize {
    TYPES.iter().position(|x| *x == t).unwrap()
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    // One model QP of each type, all in RESET; and the kernel's index of one ring.
    let mut qps = TYPES.map(|t| ModelQp {
        t,
        state: QpState::Reset,
        attrs: QpAttrs::default(),
    });
    let mut ring_k = 0u32;
    while !inp.0.is_empty() {
        let kind = inp.u8();
        let flag = |bit: u8| kind & (1 << bit) != 0;
        match kind & 7 {
            // A send WQE; flags: sq_sig_all, inline support, tame fields, tame SGEs.
            0 => {
                let mut b: [u8; SEND_WQE_SIZE] = inp.bytes();
                if flag(5) {
                    // Opcodes 0..7 (7 unknown), flags in the low 6 bits (one unknown), up to 5
                    // SGEs (5 too many), up to 193 inline bytes (193 too many); without
                    // IB_SEND_INLINE an inline count, and the reserved fields, mostly 0 (x &
                    // x >> 31: 1 only with the top and bottom bits set).
                    let w = send_wqe(&b);
                    let set = |b: &mut [u8; SEND_WQE_SIZE], at: usize, v: u32| {
                        b[at..at + 4].copy_from_slice(&v.to_ne_bytes())
                    };
                    set(&mut b, 8, w.opcode % 8);
                    set(&mut b, 12, w.send_flags & 0x3f);
                    set(&mut b, 16, w.num_sge % 6);
                    let inline_len = if w.send_flags & sf::INLINE != 0 {
                        w.inline_len % 194
                    } else {
                        w.inline_len & (w.inline_len >> 31)
                    };
                    set(&mut b, 20, inline_len);
                    set(&mut b, 28, w.reserved0 & (w.reserved0 >> 31));
                    set(&mut b, 44, w.reserved1 & (w.reserved1 >> 31));
                }
                if flag(6) {
                    // SGE lengths that cannot overflow, and the keys the kernel keeps where a
                    // key's low byte is 0xff or 0xfe.
                    for i in 0..abi::MAX_SEND_SGE {
                        let at = SEND_DATA + 16 * i;
                        let s = sge_at(&b, at);
                        b[at + 8..at + 12].copy_from_slice(&(s.length >> 3).to_ne_bytes());
                        if s.lkey & 0xff == 0xff {
                            b[at + 12..at + 16].copy_from_slice(&wqe::INLINE_LKEY.to_ne_bytes());
                        } else if s.lkey & 0xff == 0xfe {
                            b[at + 12..at + 16].copy_from_slice(&wqe::LIST_LKEY.to_ne_bytes());
                        }
                    }
                }
                check_send(&b, flag(3), flag(4));
                check_ud_send(&b, flag(3));
            }
            // A receive WQE; flags: tame fields (up to one SGE more than the device carries,
            // reserved mostly 0), tame SGEs.
            1 => {
                let mut b: [u8; RECV_WQE_SIZE] = inp.bytes();
                if flag(3) {
                    let n = u32_at(&b, 8) % (limits::MAX_RECV_SGE + 2);
                    b[8..12].copy_from_slice(&n.to_ne_bytes());
                    let r = u32_at(&b, 12);
                    b[12..16].copy_from_slice(&(r & (r >> 31)).to_ne_bytes());
                }
                if flag(4) {
                    for i in 0..abi::MAX_RECV_SGE {
                        let at = RECV_SGE + 16 * i;
                        let s = sge_at(&b, at);
                        b[at + 8..at + 12].copy_from_slice(&(s.length >> 3).to_ne_bytes());
                        if s.lkey & 0xff == 0xff {
                            b[at + 12..at + 16].copy_from_slice(&wqe::INLINE_LKEY.to_ne_bytes());
                        } else if s.lkey & 0xff == 0xfe {
                            b[at + 12..at + 16].copy_from_slice(&wqe::LIST_LKEY.to_ne_bytes());
                        }
                    }
                }
                check_recv(&b);
            }
            // Ring indices: the kernel's (kept) moves by a fuzzed step, userspace's is fuzzed.
            3 => {
                let n = 1u32 << (inp.u8() % 32);
                ring_k = ring_k.wrapping_add(inp.u32());
                let u = inp.u32();
                let u = if flag(3) {
                    ring_k.wrapping_add(u % n.saturating_mul(2).max(2))
                } else {
                    u
                };
                check_ring(ring_k, u, n, inp.u32());
            }
            // Driver data: the caller's bytes (0..=40 of them; the kernel reads the first 16
            // and checks that the rest is zero), and the same head with a fuzzed tail verdict.
            4 => {
                let len = usize::from(inp.u8() % 41);
                let mut buf: [u8; 40] = inp.bytes();
                if flag(3) {
                    // A comp_mask this kernel knows.
                    buf[0] &= 1;
                    buf[1..4].fill(0);
                }
                if flag(4) {
                    buf[8..].fill(0); // reserved and tail zero
                }
                let buf = &buf[..len];
                let head = &buf[..len.min(MODIFY_QP_CMD_SIZE)];
                let tail_cleared = buf[head.len()..].iter().all(|b| *b == 0);
                check_udata(head, tail_cleared);
                check_udata(head, flag(5));
            }
            // A create's capacities; flags: with an SRQ, tame (around the limits).
            5 => {
                let mut c = Caps {
                    max_send_wr: inp.u32(),
                    max_recv_wr: inp.u32(),
                    max_send_sge: inp.u32(),
                    max_recv_sge: inp.u32(),
                    max_inline_data: inp.u32(),
                };
                if flag(4) {
                    c.max_send_wr %= 2 * limits::MAX_QP_WR + 2;
                    c.max_recv_wr %= 2 * limits::MAX_QP_WR + 2;
                    c.max_send_sge %= limits::MAX_SEND_SGE + 2;
                    c.max_recv_sge %= limits::MAX_RECV_SGE + 2;
                    c.max_inline_data %= limits::MAX_INLINE + 2;
                }
                check_caps(&c, flag(3));
            }
            // modify_qp on one of the model QPs (2, 6, 7: the state machine gets the most).
            _ => {
                // The QP, and a transition to check the table at (the model QPs never reach
                // SQE: only the device enters it): the byte's 5 x 7 x 7 combinations.
                let pick = usize::from(inp.u8());
                let qp = &mut qps[pick % TYPES.len()];
                let probe = QpState::ALL[pick / TYPES.len() % QpState::ALL.len()];
                let probe_next = QpState::ALL[pick / 35 % QpState::ALL.len()];
                let mut mask = inp.u32();
                let mut a = modify_attr(&mut inp);
                if flag(4) {
                    // Values near their bounds: state 7, MTU 0 and 6, 17 and more READs are out
                    // of range; the next state up and the current state right half the time
                    // each; a destination GID (IPv4-mapped) half the time.
                    a.qp_state = match a.qp_state % 16 {
                        8.. => successor(qp.state).to_ib(),
                        s => s,
                    };
                    a.cur_qp_state = match a.cur_qp_state % 16 {
                        8.. => qp.state.to_ib(),
                        s => s,
                    };
                    a.path_mtu %= 7;
                    a.max_rd_atomic %= 20;
                    a.max_dest_rd_atomic %= 20;
                    if a.ah.sl & 1 == 0 {
                        a.ah.dgid[10..12].fill(0xff);
                    }
                }
                match (flag(3), flag(5)) {
                    (false, false) => {} // any mask
                    (false, true) => mask = (mask & KNOWN_MASK) | m::STATE,
                    // The mask the transition to the state asked for takes (by the kernel's
                    // table): its required attributes and (without flag 5) some of its
                    // optional ones; with bit 31 set, one bit flipped (a required one missing,
                    // one not allowed added).
                    (true, _) => {
                        let next = QpState::from_ib(a.qp_state).unwrap_or(qp.state);
                        let i = pick % TYPES.len();
                        let (req, opt) = kernel_table(qp.state, next)
                            .map_or((0, 0), |(req, opt)| (req[i], opt[i]));
                        let flip = if mask >> 31 != 0 {
                            1 << ((mask >> 24) & 31)
                        } else {
                            0
                        };
                        let keep = if flag(5) { 0 } else { opt };
                        mask = (m::STATE | req | (mask & keep)) ^ flip;
                    }
                }
                check_table(qp.state, qp.t, mask);
                check_table(probe, qp.t, mask);
                check_table_around(probe, probe_next, qp.t, mask);
                check_modify(qp, &a, mask);
                check_model(qp);
            }
        }
    }
});
