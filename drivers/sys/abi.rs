// SPDX-License-Identifier: GPL-2.0

//! Where `crate::verbs_core` (the verbs rules, host-tested) meets the kernel's types: every
//! number it defines is checked against its binding at compile time, every ring entry's layout
//! against the C header's, and its QP transition table against the core's own
//! `ib_modify_qp_is_ok` when the module loads. The conversions between `struct ib_qp_attr` /
//! `struct ib_qp_cap` and the rules' plain types live here too.

use super::bindings as b;
use crate::verbs_core::{
    abi, caps::Caps, ib, mr, mw, qp::AddressVector, qp::ModifyAttr, qp::QpAttrs, udata,
};
use core::mem::{offset_of, size_of};

macro_rules! same {
    ($($ours:expr => $theirs:expr),* $(,)?) => {
        $(const _: () = assert!($ours as u64 == $theirs as u64);)*
    };
}

same! {
    ib::QpState::Reset as u32 => b::ib_qp_state_IB_QPS_RESET,
    ib::QpState::Init as u32 => b::ib_qp_state_IB_QPS_INIT,
    ib::QpState::Rtr as u32 => b::ib_qp_state_IB_QPS_RTR,
    ib::QpState::Rts as u32 => b::ib_qp_state_IB_QPS_RTS,
    ib::QpState::Sqd as u32 => b::ib_qp_state_IB_QPS_SQD,
    ib::QpState::Sqe as u32 => b::ib_qp_state_IB_QPS_SQE,
    ib::QpState::Err as u32 => b::ib_qp_state_IB_QPS_ERR,
    ib::QpType::Smi as u32 => b::ib_qp_type_IB_QPT_SMI,
    ib::QpType::Gsi as u32 => b::ib_qp_type_IB_QPT_GSI,
    ib::QpType::Rc as u32 => b::ib_qp_type_IB_QPT_RC,
    ib::QpType::Uc as u32 => b::ib_qp_type_IB_QPT_UC,
    ib::QpType::Ud as u32 => b::ib_qp_type_IB_QPT_UD,
    ib::attr_mask::STATE => b::ib_qp_attr_mask_IB_QP_STATE,
    ib::attr_mask::CUR_STATE => b::ib_qp_attr_mask_IB_QP_CUR_STATE,
    ib::attr_mask::EN_SQD_ASYNC_NOTIFY => b::ib_qp_attr_mask_IB_QP_EN_SQD_ASYNC_NOTIFY,
    ib::attr_mask::ACCESS_FLAGS => b::ib_qp_attr_mask_IB_QP_ACCESS_FLAGS,
    ib::attr_mask::PKEY_INDEX => b::ib_qp_attr_mask_IB_QP_PKEY_INDEX,
    ib::attr_mask::PORT => b::ib_qp_attr_mask_IB_QP_PORT,
    ib::attr_mask::QKEY => b::ib_qp_attr_mask_IB_QP_QKEY,
    ib::attr_mask::AV => b::ib_qp_attr_mask_IB_QP_AV,
    ib::attr_mask::PATH_MTU => b::ib_qp_attr_mask_IB_QP_PATH_MTU,
    ib::attr_mask::TIMEOUT => b::ib_qp_attr_mask_IB_QP_TIMEOUT,
    ib::attr_mask::RETRY_CNT => b::ib_qp_attr_mask_IB_QP_RETRY_CNT,
    ib::attr_mask::RNR_RETRY => b::ib_qp_attr_mask_IB_QP_RNR_RETRY,
    ib::attr_mask::RQ_PSN => b::ib_qp_attr_mask_IB_QP_RQ_PSN,
    ib::attr_mask::MAX_QP_RD_ATOMIC => b::ib_qp_attr_mask_IB_QP_MAX_QP_RD_ATOMIC,
    ib::attr_mask::ALT_PATH => b::ib_qp_attr_mask_IB_QP_ALT_PATH,
    ib::attr_mask::MIN_RNR_TIMER => b::ib_qp_attr_mask_IB_QP_MIN_RNR_TIMER,
    ib::attr_mask::SQ_PSN => b::ib_qp_attr_mask_IB_QP_SQ_PSN,
    ib::attr_mask::MAX_DEST_RD_ATOMIC => b::ib_qp_attr_mask_IB_QP_MAX_DEST_RD_ATOMIC,
    ib::attr_mask::PATH_MIG_STATE => b::ib_qp_attr_mask_IB_QP_PATH_MIG_STATE,
    ib::attr_mask::CAP => b::ib_qp_attr_mask_IB_QP_CAP,
    ib::attr_mask::DEST_QPN => b::ib_qp_attr_mask_IB_QP_DEST_QPN,
    ib::attr_mask::RATE_LIMIT => b::ib_qp_attr_mask_IB_QP_RATE_LIMIT,
    ib::wr_opcode::RDMA_WRITE => b::ib_wr_opcode_IB_WR_RDMA_WRITE,
    ib::wr_opcode::RDMA_WRITE_WITH_IMM => b::ib_wr_opcode_IB_WR_RDMA_WRITE_WITH_IMM,
    ib::wr_opcode::SEND => b::ib_wr_opcode_IB_WR_SEND,
    ib::wr_opcode::SEND_WITH_IMM => b::ib_wr_opcode_IB_WR_SEND_WITH_IMM,
    ib::wr_opcode::RDMA_READ => b::ib_wr_opcode_IB_WR_RDMA_READ,
    ib::wr_opcode::ATOMIC_CMP_AND_SWP => b::ib_wr_opcode_IB_WR_ATOMIC_CMP_AND_SWP,
    ib::wr_opcode::ATOMIC_FETCH_AND_ADD => b::ib_wr_opcode_IB_WR_ATOMIC_FETCH_AND_ADD,
    ib::wr_opcode::LOCAL_INV => b::ib_wr_opcode_IB_WR_LOCAL_INV,
    ib::wr_opcode::BIND_MW => b::ib_uverbs_wr_opcode_IB_UVERBS_WR_BIND_MW,
    ib::wr_opcode::SEND_WITH_INV => b::ib_wr_opcode_IB_WR_SEND_WITH_INV,
    ib::wr_opcode::REG_MR => b::ib_wr_opcode_IB_WR_REG_MR,
    ib::send_flags::FENCE => b::ib_send_flags_IB_SEND_FENCE,
    ib::send_flags::SIGNALED => b::ib_send_flags_IB_SEND_SIGNALED,
    ib::send_flags::SOLICITED => b::ib_send_flags_IB_SEND_SOLICITED,
    ib::send_flags::INLINE => b::ib_send_flags_IB_SEND_INLINE,
    ib::send_flags::IP_CSUM => b::ib_send_flags_IB_SEND_IP_CSUM,
    ib::access::LOCAL_WRITE => b::ib_access_flags_IB_ACCESS_LOCAL_WRITE,
    ib::access::REMOTE_WRITE => b::ib_access_flags_IB_ACCESS_REMOTE_WRITE,
    ib::access::REMOTE_READ => b::ib_access_flags_IB_ACCESS_REMOTE_READ,
    ib::access::REMOTE_ATOMIC => b::ib_access_flags_IB_ACCESS_REMOTE_ATOMIC,
    ib::access::MW_BIND => b::ib_access_flags_IB_ACCESS_MW_BIND,
    ib::access::ZERO_BASED => b::ib_access_flags_IB_ZERO_BASED,
    mw::mw_type::ONE => b::ib_mw_type_IB_MW_TYPE_1,
    mw::mw_type::TWO => b::ib_mw_type_IB_MW_TYPE_2,
    ib::srq_type::BASIC => b::ib_srq_type_IB_SRQT_BASIC,
    mr::rereg::TRANS => b::ib_mr_rereg_flags_IB_MR_REREG_TRANS,
    mr::rereg::PD => b::ib_mr_rereg_flags_IB_MR_REREG_PD,
    mr::rereg::ACCESS => b::ib_mr_rereg_flags_IB_MR_REREG_ACCESS,
    mr::rereg::TRANS | mr::rereg::PD | mr::rereg::ACCESS
        => b::ib_mr_rereg_flags_IB_MR_REREG_SUPPORTED,
    ib::mtu::MTU_256 => b::ib_mtu_IB_MTU_256,
    ib::mtu::MTU_512 => b::ib_mtu_IB_MTU_512,
    ib::mtu::MTU_1024 => b::ib_mtu_IB_MTU_1024,
    ib::mtu::MTU_2048 => b::ib_mtu_IB_MTU_2048,
    ib::mtu::MTU_4096 => b::ib_mtu_IB_MTU_4096,
    ib::wc_status::SUCCESS => b::ib_wc_status_IB_WC_SUCCESS,
    ib::wc_status::LOC_LEN_ERR => b::ib_wc_status_IB_WC_LOC_LEN_ERR,
    ib::wc_status::LOC_QP_OP_ERR => b::ib_wc_status_IB_WC_LOC_QP_OP_ERR,
    ib::wc_status::LOC_PROT_ERR => b::ib_wc_status_IB_WC_LOC_PROT_ERR,
    ib::wc_status::WR_FLUSH_ERR => b::ib_wc_status_IB_WC_WR_FLUSH_ERR,
    ib::wc_status::MW_BIND_ERR => b::ib_wc_status_IB_WC_MW_BIND_ERR,
    ib::wc_status::REM_INV_REQ_ERR => b::ib_wc_status_IB_WC_REM_INV_REQ_ERR,
    ib::wc_status::REM_ACCESS_ERR => b::ib_wc_status_IB_WC_REM_ACCESS_ERR,
    ib::wc_status::REM_OP_ERR => b::ib_wc_status_IB_WC_REM_OP_ERR,
    ib::wc_status::RETRY_EXC_ERR => b::ib_wc_status_IB_WC_RETRY_EXC_ERR,
    ib::wc_status::RNR_RETRY_EXC_ERR => b::ib_wc_status_IB_WC_RNR_RETRY_EXC_ERR,
    ib::wc_opcode::SEND => b::ib_wc_opcode_IB_WC_SEND,
    ib::wc_opcode::RDMA_WRITE => b::ib_wc_opcode_IB_WC_RDMA_WRITE,
    ib::wc_opcode::RDMA_READ => b::ib_wc_opcode_IB_WC_RDMA_READ,
    ib::wc_opcode::COMP_SWAP => b::ib_wc_opcode_IB_WC_COMP_SWAP,
    ib::wc_opcode::FETCH_ADD => b::ib_wc_opcode_IB_WC_FETCH_ADD,
    ib::wc_opcode::BIND_MW => b::ib_wc_opcode_IB_WC_BIND_MW,
    ib::wc_opcode::LOCAL_INV => b::ib_wc_opcode_IB_WC_LOCAL_INV,
    ib::wc_opcode::REG_MR => b::ib_wc_opcode_IB_WC_REG_MR,
    ib::wc_opcode::RECV => b::ib_wc_opcode_IB_WC_RECV,
    ib::wc_opcode::RECV_RDMA_WITH_IMM => b::ib_wc_opcode_IB_WC_RECV_RDMA_WITH_IMM,
    ib::kernel_wc_flags::GRH => b::ib_wc_flags_IB_WC_GRH,
    ib::kernel_wc_flags::WITH_IMM => b::ib_wc_flags_IB_WC_WITH_IMM,
    ib::kernel_wc_flags::WITH_INVALIDATE => b::ib_wc_flags_IB_WC_WITH_INVALIDATE,
    ib::kernel_wc_flags::WITH_NETWORK_HDR_TYPE => b::ib_wc_flags_IB_WC_WITH_NETWORK_HDR_TYPE,
    ib::network_type::IPV4 => b::rdma_network_type_RDMA_NETWORK_IPV4,
    ib::network_type::IPV6 => b::rdma_network_type_RDMA_NETWORK_IPV6,
    abi::RING_HDR_SIZE => b::METAROCE_RING_HDR_SIZE,
    abi::SEND_WQE_DATA => b::METAROCE_SEND_WQE_DATA,
    abi::MAX_SEND_SGE => b::METAROCE_MAX_SEND_SGE,
    abi::MAX_INLINE => b::METAROCE_MAX_INLINE,
    abi::MAX_RECV_SGE => b::METAROCE_MAX_RECV_SGE,
    abi::MAX_SGE => b::METAROCE_MAX_SGE,
    abi::SEND_WQE_SIZE => b::METAROCE_SEND_WQE_SIZE,
    abi::RECV_WQE_SIZE => b::METAROCE_RECV_WQE_SIZE,
    udata::MODIFY_QP_PLANES => b::metaroce_modify_qp_comp_mask_METAROCE_MODIFY_QP_PLANES,
    udata::MODIFY_QP_CMD_SIZE => size_of::<b::metaroce_modify_qp_cmd>(),
}

// The ring entries: the rules' plain structs have the C header's layout, field by field.
same! {
    size_of::<abi::Sge>() => size_of::<b::metaroce_sge>(),
    offset_of!(abi::Sge, length) => offset_of!(b::metaroce_sge, length),
    offset_of!(abi::Sge, lkey) => offset_of!(b::metaroce_sge, lkey),
    abi::SEND_WQE_SIZE => size_of::<b::metaroce_send_wqe>(),
    offset_of!(abi::SendWqe, wr_id) => offset_of!(b::metaroce_send_wqe, wr_id),
    offset_of!(abi::SendWqe, opcode) => offset_of!(b::metaroce_send_wqe, opcode),
    offset_of!(abi::SendWqe, send_flags) => offset_of!(b::metaroce_send_wqe, send_flags),
    offset_of!(abi::SendWqe, num_sge) => offset_of!(b::metaroce_send_wqe, num_sge),
    offset_of!(abi::SendWqe, inline_len) => offset_of!(b::metaroce_send_wqe, inline_len),
    offset_of!(abi::SendWqe, imm_data) => offset_of!(b::metaroce_send_wqe, imm_data),
    offset_of!(abi::SendWqe, reserved0) => offset_of!(b::metaroce_send_wqe, reserved0),
    offset_of!(abi::SendWqe, remote_addr) => offset_of!(b::metaroce_send_wqe, remote_addr),
    offset_of!(abi::SendWqe, rkey) => offset_of!(b::metaroce_send_wqe, rkey),
    offset_of!(abi::SendWqe, reserved1) => offset_of!(b::metaroce_send_wqe, reserved1),
    offset_of!(abi::SendWqe, compare_add) => offset_of!(b::metaroce_send_wqe, compare_add),
    offset_of!(abi::SendWqe, swap) => offset_of!(b::metaroce_send_wqe, swap),
    offset_of!(abi::SendWqe, data) => offset_of!(b::metaroce_send_wqe, data),
    abi::RECV_WQE_SIZE => size_of::<b::metaroce_recv_wqe>(),
    offset_of!(abi::RecvWqe, num_sge) => offset_of!(b::metaroce_recv_wqe, num_sge),
    offset_of!(abi::RecvWqe, reserved) => offset_of!(b::metaroce_recv_wqe, reserved),
    offset_of!(abi::RecvWqe, sge) => offset_of!(b::metaroce_recv_wqe, sge),
    size_of::<abi::Cqe>() => size_of::<b::metaroce_cqe>(),
    offset_of!(abi::Cqe, status) => offset_of!(b::metaroce_cqe, status),
    offset_of!(abi::Cqe, opcode) => offset_of!(b::metaroce_cqe, opcode),
    offset_of!(abi::Cqe, vendor_err) => offset_of!(b::metaroce_cqe, vendor_err),
    offset_of!(abi::Cqe, byte_len) => offset_of!(b::metaroce_cqe, byte_len),
    offset_of!(abi::Cqe, imm_data) => offset_of!(b::metaroce_cqe, imm_data),
    offset_of!(abi::Cqe, qp_num) => offset_of!(b::metaroce_cqe, qp_num),
    offset_of!(abi::Cqe, src_qp) => offset_of!(b::metaroce_cqe, src_qp),
    offset_of!(abi::Cqe, wc_flags) => offset_of!(b::metaroce_cqe, wc_flags),
    offset_of!(abi::Cqe, pkey_index) => offset_of!(b::metaroce_cqe, pkey_index),
    offset_of!(abi::Cqe, slid) => offset_of!(b::metaroce_cqe, slid),
    offset_of!(abi::Cqe, sl) => offset_of!(b::metaroce_cqe, sl),
    offset_of!(abi::Cqe, dlid_path_bits) => offset_of!(b::metaroce_cqe, dlid_path_bits),
    offset_of!(abi::Cqe, reserved) => offset_of!(b::metaroce_cqe, reserved),
}

/// The attributes of a `modify_qp` as the rules take them.
pub(crate) fn modify_attr(a: &b::ib_qp_attr) -> ModifyAttr {
    let grh = &a.ah_attr.grh;
    ModifyAttr {
        qp_state: a.qp_state,
        cur_qp_state: a.cur_qp_state,
        path_mtu: a.path_mtu,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags as u32,
        pkey_index: a.pkey_index,
        port_num: a.port_num,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ah: AddressVector {
            dgid: super::gid_bytes(&grh.dgid),
            sgid_index: grh.sgid_index,
            hop_limit: grh.hop_limit,
            traffic_class: grh.traffic_class,
            flow_label: grh.flow_label,
            sl: a.ah_attr.sl,
        },
    }
}

/// Fills what `query_qp` reports of a QP's attributes.
pub(crate) fn fill_qp_attr(s: &QpAttrs, attr: &mut b::ib_qp_attr) {
    attr.path_mtu = s.path_mtu;
    attr.qkey = s.qkey;
    attr.rq_psn = s.rq_psn;
    attr.sq_psn = s.sq_psn;
    attr.dest_qp_num = s.dest_qp_num;
    attr.qp_access_flags = s.access_flags as i32;
    attr.pkey_index = s.pkey_index;
    attr.port_num = s.port_num;
    attr.max_rd_atomic = s.max_rd_atomic;
    attr.max_dest_rd_atomic = s.max_dest_rd_atomic;
    attr.min_rnr_timer = s.min_rnr_timer;
    attr.timeout = s.timeout;
    attr.retry_cnt = s.retry_cnt;
    attr.rnr_retry = s.rnr_retry;
    attr.sq_draining = s.sq_draining;
    let av = &s.av;
    attr.ah_attr.grh.dgid.raw = av.dgid;
    attr.ah_attr.grh.sgid_index = av.sgid_index;
    attr.ah_attr.grh.hop_limit = av.hop_limit;
    attr.ah_attr.grh.traffic_class = av.traffic_class;
    attr.ah_attr.grh.flow_label = av.flow_label;
    attr.ah_attr.sl = av.sl;
    attr.ah_attr.port_num = s.port_num;
    attr.ah_attr.type_ = b::rdma_ah_attr_type_RDMA_AH_ATTR_TYPE_ROCE;
    attr.ah_attr.ah_flags = b::ib_ah_flags_IB_AH_GRH as u8;
}

/// The capacities a create asks for.
pub(crate) fn caps_of(c: &b::ib_qp_cap) -> Caps {
    Caps {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The capacities as the core reports them.
pub(crate) fn ib_caps(c: &Caps) -> b::ib_qp_cap {
    b::ib_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
        ..Default::default()
    }
}

/// Checks the rules' transition table against the core's `ib_modify_qp_is_ok`: for every
/// state pair and every QP type a RoCE device has, no attribute, the required ones, the
/// required and allowed ones, and the required ones with each attribute bit added, each with
/// and without `IB_QP_STATE`. Returns the first disagreement (current state, next state, type,
/// mask).
pub(crate) fn check_transition_table() -> Result<(), (u32, u32, u32, u32)> {
    use crate::verbs_core::qp::{modify_is_ok, transition_attrs};
    let types = [
        ib::QpType::Smi,
        ib::QpType::Gsi,
        ib::QpType::Rc,
        ib::QpType::Uc,
        ib::QpType::Ud,
    ];
    for cur in ib::QpState::ALL {
        for next in ib::QpState::ALL {
            for t in types {
                let (req, opt) = transition_attrs(cur, next, t).unwrap_or((0, 0));
                let singles = (0..26).map(|bit| req | 1u32 << bit);
                for m in [0, req, req | opt].into_iter().chain(singles) {
                    for mask in [m, m | ib::attr_mask::STATE] {
                        let ours = modify_is_ok(cur, next, t, mask);
                        // SAFETY: a pure function of its arguments, all in range.
                        let theirs = unsafe {
                            b::ib_modify_qp_is_ok(cur.to_ib(), next.to_ib(), t.to_ib(), mask)
                        };
                        if ours != theirs {
                            return Err((cur.to_ib(), next.to_ib(), t.to_ib(), mask));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
