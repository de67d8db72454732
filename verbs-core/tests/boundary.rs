// SPDX-License-Identifier: GPL-2.0

//! The deterministic counterpart of the fuzz target `fuzz/fuzz_targets/boundary.rs` for its
//! most important property, and what `fuzz/run-quick.sh` runs when the fuzzer cannot be built:
//! the verdict on a send or receive WQE copied out of a ring (bytes as userspace wrote them,
//! read field by field) is exactly what the ABI says. Fatal exactly on an entry the provider
//! could not have written; refused exactly on a well-formed one the device will not carry out;
//! otherwise the decoded work is the entry's (its SGEs, immediate, atomic operands, flags).
//! The checks are the fuzz target's, written out independently of `wqe`'s code.

use proptest::prelude::*;
use verbs_core::abi::{self, RecvWqe, SendWqe, Sge};
use verbs_core::caps::limits;
use verbs_core::ib::{send_flags as sf, wr_opcode as op};
use verbs_core::wqe::{self, Judged, Payload, SendOp};

const SEND_WQE_SIZE: usize = 256;
/// Where a send WQE's SGE / inline area starts.
const SEND_DATA: usize = 64;
const RECV_WQE_SIZE: usize = 128;
/// Where a receive WQE's SGEs start.
const RECV_SGE: usize = 16;
const MAX_SEND_SGE: usize = limits::MAX_SEND_SGE as usize;
const MAX_RECV_SGE: usize = limits::MAX_RECV_SGE as usize;
/// The send flags the ABI defines.
const KNOWN_SEND_FLAGS: u32 = sf::FENCE | sf::SIGNALED | sf::SOLICITED | sf::INLINE | sf::IP_CSUM;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

fn put(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

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

/// A send WQE from its ring entry's bytes (uapi/metaroce-abi.h's layout; `abi` asserts the
/// struct's size, the fuzz target each offset).
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

/// A receive WQE from its ring entry's bytes.
fn recv_wqe(b: &[u8; RECV_WQE_SIZE]) -> RecvWqe {
    RecvWqe {
        wr_id: u64_at(b, 0),
        num_sge: u32_at(b, 8),
        reserved: u32_at(b, 12),
        sge: core::array::from_fn(|i| sge_in(b, RECV_SGE + 16 * i)),
    }
}

/// Whether a well-formed SGE list is one the device carries: no inline key, a total that
/// fits a message length.
fn sges_ok(sges: &[Sge]) -> bool {
    let total = sges.iter().try_fold(0u32, |t, s| t.checked_add(s.length));
    total.is_some()
        && sges
            .iter()
            .all(|s| s.lkey != wqe::INLINE_LKEY && s.lkey != wqe::LIST_LKEY)
}

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
    // The opcodes the device carries are 0..=9 (IB_WR_RDMA_WRITE .. IB_WR_SEND_WITH_INV), 14
    // (IB_WR_FLUSH) and 15 (IB_WR_ATOMIC_WRITE); the two local ones (LOCAL_INV, BIND_MW), FLUSH
    // and ATOMIC_WRITE carry no data.
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
    assert_eq!(v == Judged::Fatal, fatal, "fatal: {w:?}");
    let carries_payload = matches!(
        w.opcode,
        op::SEND | op::SEND_WITH_IMM | op::SEND_WITH_INV | op::RDMA_WRITE | op::RDMA_WRITE_WITH_IMM
    );
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
        assert_eq!(s.bind, bind);
        let with_imm = matches!(w.opcode, op::SEND_WITH_IMM | op::RDMA_WRITE_WITH_IMM);
        assert_eq!(s.imm, with_imm.then_some(w.imm_data));
        let atomic = match w.opcode {
            op::ATOMIC_CMP_AND_SWP => Some((w.compare_add, w.swap)),
            op::ATOMIC_FETCH_AND_ADD | op::ATOMIC_WRITE => Some((0, w.compare_add)),
            op::FLUSH => Some((w.swap, w.compare_add)),
            _ => None,
        };
        assert_eq!(s.atomic, atomic);
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
    // The data bytes the verdict does not read (all for inline data, those past the posted
    // SGEs otherwise) do not change it.
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
}

fn check_recv(b: &[u8; RECV_WQE_SIZE]) {
    let w = recv_wqe(b);
    let v = wqe::judge_recv(&w);
    assert_eq!(v, wqe::judge_recv(&w), "a pure function");
    let fatal = w.reserved != 0 || w.num_sge as usize > MAX_RECV_SGE;
    assert_eq!(v == Judged::Fatal, fatal, "fatal: {w:?}");
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
    let used = (w.num_sge as usize).min(abi::MAX_RECV_SGE) * 16;
    let mut other = *b;
    for x in &mut other[RECV_SGE + used..] {
        *x ^= 0x5a;
    }
    assert_eq!(wqe::judge_recv(&recv_wqe(&other)), v);
}

/// A count near its bound (`bound` is the first value out of range) or any value.
fn near(bound: u32) -> impl Strategy<Value = u32> {
    prop_oneof![9 => 0..=bound, 1 => any::<u32>()]
}

/// Zero (what the provider writes) mostly, or anything.
fn mostly_zero() -> impl Strategy<Value = u32> {
    prop_oneof![9 => Just(0u32), 1 => any::<u32>()]
}

/// Send flags: the ABI's mostly, or with an unknown bit.
fn send_flags() -> impl Strategy<Value = u32> {
    prop_oneof![8 => 0..=KNOWN_SEND_FLAGS, 1 => 0u32..0x40, 1 => any::<u32>()]
}

/// SGEs written over the raw bytes: lengths that sum to a u32 or may not, keys that are the
/// inline key, an MR's or anything.
fn sges(n: usize) -> impl Strategy<Value = Vec<(u32, u32)>> {
    let length = prop_oneof![3 => 0u32..(1 << 29), 1 => any::<u32>()];
    let lkey = prop_oneof![
        1 => Just(wqe::INLINE_LKEY),
        1 => Just(wqe::LIST_LKEY),
        3 => 0u32..(1 << 24),
        1 => any::<u32>()
    ];
    prop::collection::vec((length, lkey), n)
}

/// A send entry: random bytes with fields set near the ABI's boundaries.
fn send_entry() -> impl Strategy<Value = [u8; SEND_WQE_SIZE]> {
    (
        prop::collection::vec(any::<u8>(), SEND_WQE_SIZE),
        (near(16), send_flags(), near(limits::MAX_SEND_SGE + 1)),
        (
            near(abi::MAX_INLINE as u32 + 1),
            mostly_zero(),
            mostly_zero(),
        ),
        sges(abi::MAX_SEND_SGE),
    )
        .prop_map(
            |(raw, (opcode, flags, num_sge), (inline_len, r0, r1), sges)| {
                let mut b: [u8; SEND_WQE_SIZE] = raw.try_into().unwrap();
                put(&mut b, 8, opcode);
                put(&mut b, 12, flags);
                // Inline data comes without SGEs, and a count only with IB_SEND_INLINE (mostly).
                let num_sge = if flags & sf::INLINE == 0 || num_sge % 4 == 0 {
                    num_sge
                } else {
                    0
                };
                put(&mut b, 16, num_sge);
                let inline_len = if flags & sf::INLINE != 0 || inline_len % 8 == 0 {
                    inline_len
                } else {
                    0
                };
                put(&mut b, 20, inline_len);
                put(&mut b, 28, r0);
                put(&mut b, 44, r1);
                for (i, (length, lkey)) in sges.into_iter().enumerate() {
                    put(&mut b, SEND_DATA + 16 * i + 8, length);
                    put(&mut b, SEND_DATA + 16 * i + 12, lkey);
                }
                b
            },
        )
}

/// A receive entry: random bytes with fields set near the ABI's boundaries.
fn recv_entry() -> impl Strategy<Value = [u8; RECV_WQE_SIZE]> {
    (
        prop::collection::vec(any::<u8>(), RECV_WQE_SIZE),
        near(limits::MAX_RECV_SGE + 1),
        mostly_zero(),
        sges(abi::MAX_RECV_SGE),
    )
        .prop_map(|(raw, num_sge, reserved, sges)| {
            let mut b: [u8; RECV_WQE_SIZE] = raw.try_into().unwrap();
            put(&mut b, 8, num_sge);
            put(&mut b, 12, reserved);
            for (i, (length, lkey)) in sges.into_iter().enumerate() {
                put(&mut b, RECV_SGE + 16 * i + 8, length);
                put(&mut b, RECV_SGE + 16 * i + 12, lkey);
            }
            b
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn send_verdicts(b in send_entry(), sq_sig_all: bool, inline_ok: bool) {
        check_send(&b, sq_sig_all, inline_ok);
    }

    #[test]
    fn send_verdicts_on_raw_bytes(raw in prop::collection::vec(any::<u8>(), SEND_WQE_SIZE), sq_sig_all: bool, inline_ok: bool) {
        check_send(&raw.try_into().unwrap(), sq_sig_all, inline_ok);
    }

    #[test]
    fn recv_verdicts(b in recv_entry()) {
        check_recv(&b);
    }

    #[test]
    fn recv_verdicts_on_raw_bytes(raw in prop::collection::vec(any::<u8>(), RECV_WQE_SIZE)) {
        check_recv(&raw.try_into().unwrap());
    }
}

/// The strategies reach every verdict (a check that only ever sees Fatal proves little).
#[test]
fn every_verdict_is_reached() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut send, mut recv) = ([0u32; 3], [0u32; 3]);
    fn kind<T>(v: &Judged<T>) -> usize {
        match v {
            Judged::Fatal => 0,
            Judged::Refused => 1,
            Judged::Usable(_) => 2,
        }
    }
    for _ in 0..2000 {
        let b = send_entry().new_tree(&mut runner).unwrap().current();
        send[kind(&wqe::judge_send(&send_wqe(&b), false, true))] += 1;
        let b = recv_entry().new_tree(&mut runner).unwrap().current();
        recv[kind(&wqe::judge_recv(&recv_wqe(&b)))] += 1;
    }
    assert!(send.iter().all(|n| *n > 100), "send verdicts {send:?}");
    assert!(recv.iter().all(|n| *n > 100), "recv verdicts {recv:?}");
}
