// SPDX-License-Identifier: GPL-2.0

//! The QP state machine and the attributes `modify_qp` sets.
//!
//! [`modify_is_ok`] is the verbs' transition table (IBA 1.4 section 11.2.5, as the RDMA core's
//! `qp_state_table` and `ib_modify_qp_is_ok` encode it) for the QP types a RoCE device has:
//! which state changes exist, and for each the attributes that must and may come with it.
//! The module checks this table against the core's own function at load (`drivers/sys/abi.rs`),
//! so the two cannot disagree unnoticed.
//!
//! [`prepare`] judges a whole `modify_qp` (the transition, then each attribute's value) and
//! returns what the QP becomes without changing anything: the driver attaches with the new
//! attributes and commits only once that has worked.

use super::caps::limits;
use super::ib::{attr_mask as m, mtu, QpState, QpType};

/// What a transition requires and allows, per QP type.
#[derive(Clone, Copy, Default)]
struct Params {
    req: u32,
    opt: u32,
}

/// The attribute masks of a `cur -> next` transition for `t`; None if the transition does
/// not exist.
fn params(cur: QpState, next: QpState, t: QpType) -> Option<Params> {
    use QpState::*;
    use QpType::*;
    let p = |req: u32, opt: u32| Params { req, opt };
    // The transitions that exist; each arm gives the masks per type (none for the rest).
    let r = match (cur, next) {
        (Reset, Reset)
        | (Init, Reset)
        | (Rtr, Reset)
        | (Rts, Reset)
        | (Sqd, Reset)
        | (Sqe, Reset)
        | (Err, Reset) => Params::default(),
        (Init, Err) | (Rtr, Err) | (Rts, Err) | (Sqd, Err) | (Sqe, Err) | (Err, Err) => {
            Params::default()
        }
        (Reset, Init) => match t {
            Ud => p(m::PKEY_INDEX | m::PORT | m::QKEY, 0),
            Uc | Rc => p(m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS, 0),
            Smi | Gsi => p(m::PKEY_INDEX | m::QKEY, 0),
        },
        (Init, Init) => match t {
            Ud => p(0, m::PKEY_INDEX | m::PORT | m::QKEY),
            Uc | Rc => p(0, m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS),
            Smi | Gsi => p(0, m::PKEY_INDEX | m::QKEY),
        },
        (Init, Rtr) => match t {
            Ud => p(0, m::PKEY_INDEX | m::QKEY),
            Uc => p(
                m::AV | m::PATH_MTU | m::DEST_QPN | m::RQ_PSN,
                m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX,
            ),
            Rc => p(
                m::AV
                    | m::PATH_MTU
                    | m::DEST_QPN
                    | m::RQ_PSN
                    | m::MAX_DEST_RD_ATOMIC
                    | m::MIN_RNR_TIMER,
                m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX,
            ),
            Smi | Gsi => p(0, m::PKEY_INDEX | m::QKEY),
        },
        (Rtr, Rts) => match t {
            Ud | Smi | Gsi => p(m::SQ_PSN, m::CUR_STATE | m::QKEY),
            Uc => p(
                m::SQ_PSN,
                m::CUR_STATE | m::ALT_PATH | m::ACCESS_FLAGS | m::PATH_MIG_STATE,
            ),
            Rc => p(
                m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::SQ_PSN | m::MAX_QP_RD_ATOMIC,
                m::CUR_STATE | m::ALT_PATH | m::ACCESS_FLAGS | m::MIN_RNR_TIMER | m::PATH_MIG_STATE,
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match t {
            Ud | Smi | Gsi => p(0, m::CUR_STATE | m::QKEY),
            Uc => p(
                0,
                m::CUR_STATE | m::ACCESS_FLAGS | m::ALT_PATH | m::PATH_MIG_STATE,
            ),
            Rc => p(
                0,
                m::CUR_STATE | m::ACCESS_FLAGS | m::ALT_PATH | m::PATH_MIG_STATE | m::MIN_RNR_TIMER,
            ),
        },
        (Rts, Sqd) => p(0, m::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match t {
            Ud | Smi | Gsi => p(0, m::PKEY_INDEX | m::QKEY),
            Uc => p(
                0,
                m::AV | m::ALT_PATH | m::ACCESS_FLAGS | m::PKEY_INDEX | m::PATH_MIG_STATE,
            ),
            Rc => p(
                0,
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
            ),
        },
        (Sqe, Rts) => match t {
            Ud | Smi | Gsi => p(0, m::CUR_STATE | m::QKEY),
            Uc => p(0, m::CUR_STATE | m::ACCESS_FLAGS),
            // The table has no RC entry: SQE is not a state an RC QP can be in.
            Rc => Params::default(),
        },
        _ => return None,
    };
    Some(r)
}

/// The attributes a `cur -> next` transition of a QP of type `t` requires and allows
/// (besides `IB_QP_STATE` and `IB_QP_RATE_LIMIT`), or None if the transition does not exist.
pub fn transition_attrs(cur: QpState, next: QpState, t: QpType) -> Option<(u32, u32)> {
    params(cur, next, t).map(|p| (p.req, p.opt))
}

/// Whether `modify_qp` may take a QP of type `t` from `cur` to `next` with the attributes
/// `mask` names (`ib_modify_qp_is_ok`).
pub fn modify_is_ok(cur: QpState, next: QpState, t: QpType, mask: u32) -> bool {
    use QpState::*;
    if mask & m::CUR_STATE != 0 && !matches!(cur, Rtr | Rts | Sqd | Sqe) {
        return false;
    }
    let Some(p) = params(cur, next, t) else {
        return false;
    };
    mask & p.req == p.req && mask & !(p.req | p.opt | m::STATE | m::RATE_LIMIT) == 0
}

/// The address vector of a connected QP (`rdma_ah_attr` with its GRH, as RoCE uses it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressVector {
    /// The destination GID: an IPv4-mapped (`::ffff:a.b.c.d`) or IPv6 address.
    pub dgid: [u8; 16],
    /// Our GID table entry to send from.
    pub sgid_index: u8,
    /// The IP TTL / hop limit.
    pub hop_limit: u8,
    /// The IP DSCP and ECN bits.
    pub traffic_class: u8,
    /// The IPv6 flow label.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
}

/// The attributes of one `modify_qp` call (the fields of `struct ib_qp_attr` a RoCE device
/// reads), as the caller gave them; only those `mask` names count.
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)] // Each field is its `ib_qp_attr` namesake.
pub struct ModifyAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub pkey_index: u16,
    pub port_num: u32,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub ah: AddressVector,
}

/// A QP's connection attributes, as `modify_qp` set them and `query_qp` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // Each field is its `ib_qp_attr` namesake.
pub struct QpAttrs {
    pub path_mtu: u32,
    pub qkey: u32,
    /// 24 bits.
    pub rq_psn: u32,
    /// 24 bits.
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub access_flags: u32,
    pub pkey_index: u16,
    pub port_num: u32,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub sq_draining: u8,
    pub av: AddressVector,
    /// Whether an address vector was ever set (RTR needs one).
    pub av_set: bool,
}

/// PSNs are 24 bits.
pub const PSN_MASK: u32 = 0x00ff_ffff;

impl QpAttrs {
    /// Takes the fields `mask` names from `a`.
    pub fn apply(&mut self, a: &ModifyAttr, mask: u32) {
        let has = |bit: u32| mask & bit != 0;
        if has(m::PATH_MTU) {
            self.path_mtu = a.path_mtu;
        }
        if has(m::QKEY) {
            self.qkey = a.qkey;
        }
        if has(m::RQ_PSN) {
            self.rq_psn = a.rq_psn & PSN_MASK;
        }
        if has(m::SQ_PSN) {
            self.sq_psn = a.sq_psn & PSN_MASK;
        }
        if has(m::DEST_QPN) {
            self.dest_qp_num = a.dest_qp_num;
        }
        if has(m::ACCESS_FLAGS) {
            self.access_flags = a.qp_access_flags;
        }
        if has(m::PKEY_INDEX) {
            self.pkey_index = a.pkey_index;
        }
        if has(m::PORT) {
            self.port_num = a.port_num;
        }
        if has(m::MAX_QP_RD_ATOMIC) {
            self.max_rd_atomic = a.max_rd_atomic;
        }
        if has(m::MAX_DEST_RD_ATOMIC) {
            self.max_dest_rd_atomic = a.max_dest_rd_atomic;
        }
        if has(m::MIN_RNR_TIMER) {
            self.min_rnr_timer = a.min_rnr_timer;
        }
        if has(m::TIMEOUT) {
            self.timeout = a.timeout;
        }
        if has(m::RETRY_CNT) {
            self.retry_cnt = a.retry_cnt;
        }
        if has(m::RNR_RETRY) {
            self.rnr_retry = a.rnr_retry;
        }
        if has(m::AV) {
            self.av = a.ah;
            self.av_set = true;
        }
    }
}

/// Why a `modify_qp` is refused (each is `EINVAL` to the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModifyError {
    /// No such state, or a transition (or attribute mask) the verbs do not allow.
    Transition,
    /// A path MTU that is no `enum ib_mtu` value.
    PathMtu,
    /// More outstanding RDMA READs / atomics than the device supports.
    RdAtomic,
    /// An address vector with no destination GID.
    NoDestination,
    /// RTR of a connected (RC, UC) QP with no address vector set, now or before.
    NoAddressVector,
}

/// What a `modify_qp` makes of a QP (see [`prepare`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpChange {
    /// The QP's attributes after the call.
    pub attrs: QpAttrs,
    /// Its state after the call.
    pub state: QpState,
    /// The access flags, if the call sets them.
    pub access: Option<u32>,
}

/// Judges a `modify_qp` of a QP of type `t` in state `cur` with attributes `attrs`: the
/// transition (unless `mask` is 0, the direct verbs' call that changes no attribute and is
/// allowed in any state), then each value the mask names. Returns what the QP becomes;
/// changes nothing.
pub fn prepare(
    cur: QpState,
    attrs: &QpAttrs,
    t: QpType,
    a: &ModifyAttr,
    mask: u32,
) -> Result<QpChange, ModifyError> {
    let next = if mask & m::STATE != 0 {
        QpState::from_ib(a.qp_state).ok_or(ModifyError::Transition)?
    } else {
        cur
    };
    if mask != 0 && !modify_is_ok(cur, next, t, mask) {
        return Err(ModifyError::Transition);
    }
    if mask & m::CUR_STATE != 0 && QpState::from_ib(a.cur_qp_state) != Some(cur) {
        // The caller's idea of the current state is wrong: IBA 11.2.5 lets a CI refuse it.
        return Err(ModifyError::Transition);
    }
    if mask & m::PATH_MTU != 0 && mtu::bytes(a.path_mtu).is_none() {
        return Err(ModifyError::PathMtu);
    }
    if mask & m::MAX_QP_RD_ATOMIC != 0 && u32::from(a.max_rd_atomic) > limits::MAX_RD_ATOM
        || mask & m::MAX_DEST_RD_ATOMIC != 0
            && u32::from(a.max_dest_rd_atomic) > limits::MAX_RD_ATOM
    {
        return Err(ModifyError::RdAtomic);
    }
    if mask & m::AV != 0 && a.ah.dgid == [0; 16] {
        return Err(ModifyError::NoDestination);
    }
    let mut new = *attrs;
    new.apply(a, mask);
    // Only the connected services have a destination; UD, GSI and SMI QPs take one per
    // work request (and their transitions allow no IB_QP_AV).
    let connected = matches!(t, QpType::Rc | QpType::Uc);
    if next == QpState::Rtr && cur != QpState::Rtr && !new.av_set && connected {
        return Err(ModifyError::NoAddressVector);
    }
    Ok(QpChange {
        attrs: new,
        state: next,
        access: (mask & m::ACCESS_FLAGS != 0).then_some(a.qp_access_flags),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::{Init, Reset, Rtr, Rts, Sqd};

    const RC_INIT: u32 = m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS;
    const RC_RTR: u32 = m::STATE
        | m::AV
        | m::PATH_MTU
        | m::DEST_QPN
        | m::RQ_PSN
        | m::MAX_DEST_RD_ATOMIC
        | m::MIN_RNR_TIMER;
    const RC_RTS: u32 =
        m::STATE | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::SQ_PSN | m::MAX_QP_RD_ATOMIC;

    fn to(state: QpState) -> ModifyAttr {
        ModifyAttr {
            qp_state: state.to_ib(),
            path_mtu: mtu::MTU_4096,
            ah: AddressVector {
                dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2],
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_rc_bring_up_is_allowed_and_each_required_attribute_is_required() {
        assert!(modify_is_ok(Reset, Init, QpType::Rc, RC_INIT));
        assert!(modify_is_ok(Init, Rtr, QpType::Rc, RC_RTR));
        assert!(modify_is_ok(Rtr, Rts, QpType::Rc, RC_RTS));
        for (cur, next, mask) in [
            (Reset, Init, RC_INIT),
            (Init, Rtr, RC_RTR),
            (Rtr, Rts, RC_RTS),
        ] {
            for bit in 1..32 {
                let b = 1u32 << bit;
                if mask & b != 0 {
                    assert!(
                        !modify_is_ok(cur, next, QpType::Rc, mask & !b),
                        "{cur:?}->{next:?} {b:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn attributes_outside_a_transition_are_refused() {
        // QKEY is not an RC attribute; CAP is nobody's.
        assert!(!modify_is_ok(Reset, Init, QpType::Rc, RC_INIT | m::QKEY));
        assert!(!modify_is_ok(Rts, Rts, QpType::Rc, m::CAP));
        // RATE_LIMIT and STATE are always allowed.
        assert!(modify_is_ok(Rts, Rts, QpType::Rc, m::STATE | m::RATE_LIMIT));
        // CUR_STATE only from RTR, RTS, SQD, SQE.
        assert!(!modify_is_ok(Init, Init, QpType::Rc, m::CUR_STATE));
        assert!(modify_is_ok(Rts, Rts, QpType::Rc, m::CUR_STATE));
    }

    #[test]
    fn every_state_goes_to_reset_and_error_but_reset_to_error() {
        for s in QpState::ALL {
            for t in [QpType::Rc, QpType::Uc, QpType::Ud, QpType::Gsi] {
                assert!(modify_is_ok(s, Reset, t, m::STATE));
                assert_eq!(modify_is_ok(s, QpState::Err, t, m::STATE), s != Reset);
            }
        }
        assert!(!modify_is_ok(Reset, Rtr, QpType::Rc, RC_RTR));
        assert!(!modify_is_ok(QpState::Err, Rts, QpType::Rc, m::STATE));
    }

    #[test]
    fn datagram_qps_need_a_qkey_and_no_address_vector() {
        let init = m::STATE | m::PKEY_INDEX | m::PORT | m::QKEY;
        assert!(modify_is_ok(Reset, Init, QpType::Ud, init));
        assert!(modify_is_ok(Init, Rtr, QpType::Ud, m::STATE));
        assert!(!modify_is_ok(Init, Rtr, QpType::Ud, m::STATE | m::AV));
        for t in [QpType::Ud, QpType::Gsi, QpType::Smi] {
            let c = prepare(Init, &QpAttrs::default(), t, &to(Rtr), m::STATE).unwrap();
            assert_eq!(c.state, Rtr, "{t:?}");
        }
    }

    #[test]
    fn prepare_checks_values_and_changes_only_what_the_mask_names() {
        let before = QpAttrs::default();
        let mut a = to(Rtr);
        a.rq_psn = 0xabcd_ef12;
        a.sq_psn = 0x77;
        let c = prepare(Init, &before, QpType::Rc, &a, RC_RTR).unwrap();
        assert_eq!(c.state, Rtr);
        assert_eq!(c.attrs.rq_psn, 0xcd_ef12, "PSNs are 24 bits");
        assert_eq!(c.attrs.sq_psn, 0, "SQ_PSN was not in the mask");
        assert!(c.attrs.av_set);
        assert_eq!(
            c.attrs.av.dgid,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2]
        );
        assert_eq!(c.access, None);

        let mut bad = a;
        bad.path_mtu = 6;
        assert_eq!(
            prepare(Init, &before, QpType::Rc, &bad, RC_RTR),
            Err(ModifyError::PathMtu)
        );
        let mut bad = a;
        bad.max_dest_rd_atomic = (limits::MAX_RD_ATOM + 1) as u8;
        assert_eq!(
            prepare(Init, &before, QpType::Rc, &bad, RC_RTR),
            Err(ModifyError::RdAtomic)
        );
        let mut bad = a;
        bad.ah.dgid = [0; 16];
        assert_eq!(
            prepare(Init, &before, QpType::Rc, &bad, RC_RTR),
            Err(ModifyError::NoDestination)
        );
        let mut bad = a;
        bad.qp_state = 9;
        assert_eq!(
            prepare(Init, &before, QpType::Rc, &bad, RC_RTR),
            Err(ModifyError::Transition)
        );
    }

    #[test]
    fn a_zero_mask_changes_nothing_in_any_state() {
        for s in QpState::ALL {
            let c = prepare(
                s,
                &QpAttrs::default(),
                QpType::Rc,
                &ModifyAttr::default(),
                0,
            )
            .unwrap();
            assert_eq!(c.state, s);
            assert_eq!(c.attrs, QpAttrs::default());
        }
    }

    #[test]
    fn a_wrong_current_state_is_refused() {
        let mut a = to(Rts);
        a.cur_qp_state = Rts.to_ib();
        let mask = m::STATE | m::CUR_STATE;
        assert!(prepare(Rts, &QpAttrs::default(), QpType::Rc, &a, mask).is_ok());
        a.cur_qp_state = Sqd.to_ib();
        assert_eq!(
            prepare(Rts, &QpAttrs::default(), QpType::Rc, &a, mask),
            Err(ModifyError::Transition)
        );
    }
}
