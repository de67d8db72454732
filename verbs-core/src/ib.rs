// SPDX-License-Identifier: GPL-2.0

//! The verbs' numbers, as the kernel's `include/rdma/ib_verbs.h` (and, where userspace shares
//! them, `include/uapi/rdma/ib_user_verbs.h`) defines them. The kernel module asserts at
//! compile time that each one equals its binding (`drivers/sys/abi.rs`), so a value here can
//! never drift from the kernel's.

/// A QP's state (`enum ib_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum QpState {
    /// `IB_QPS_RESET`.
    Reset = 0,
    /// `IB_QPS_INIT`.
    Init = 1,
    /// `IB_QPS_RTR`: ready to receive.
    Rtr = 2,
    /// `IB_QPS_RTS`: ready to send.
    Rts = 3,
    /// `IB_QPS_SQD`: send queue drained.
    Sqd = 4,
    /// `IB_QPS_SQE`: send queue error.
    Sqe = 5,
    /// `IB_QPS_ERR`.
    Err = 6,
}

impl QpState {
    /// Every state, in `enum ib_qp_state` order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The state numbered `n`, if there is one.
    pub fn from_ib(n: u32) -> Option<Self> {
        Self::ALL.get(usize::try_from(n).ok()?).copied()
    }

    /// Its `enum ib_qp_state` number.
    pub fn to_ib(self) -> u32 {
        self as u32
    }
}

/// A QP's transport service (`enum ib_qp_type`; only those a soft RoCE device may have).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpType {
    /// `IB_QPT_SMI`: QP0 (InfiniBand subnet management; none on Ethernet).
    Smi = 0,
    /// `IB_QPT_GSI`: QP1, the general services (CM MADs).
    Gsi = 1,
    /// `IB_QPT_RC`: reliable connected.
    Rc = 2,
    /// `IB_QPT_UC`: unreliable connected.
    Uc = 3,
    /// `IB_QPT_UD`: unreliable datagram.
    Ud = 4,
}

impl QpType {
    /// The type numbered `n`, if it is one of these.
    pub fn from_ib(n: u32) -> Option<Self> {
        Some(match n {
            0 => QpType::Smi,
            1 => QpType::Gsi,
            2 => QpType::Rc,
            3 => QpType::Uc,
            4 => QpType::Ud,
            _ => return None,
        })
    }

    /// Its `enum ib_qp_type` number.
    pub fn to_ib(self) -> u32 {
        self as u32
    }
}

/// `enum ib_qp_attr_mask`: which fields of a `modify_qp`'s attributes it sets.
pub mod attr_mask {
    /// `IB_QP_STATE`.
    pub const STATE: u32 = 1;
    /// `IB_QP_CUR_STATE`.
    pub const CUR_STATE: u32 = 1 << 1;
    /// `IB_QP_EN_SQD_ASYNC_NOTIFY`.
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    /// `IB_QP_ACCESS_FLAGS`.
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    /// `IB_QP_PKEY_INDEX`.
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// `IB_QP_PORT`.
    pub const PORT: u32 = 1 << 5;
    /// `IB_QP_QKEY`.
    pub const QKEY: u32 = 1 << 6;
    /// `IB_QP_AV`: the address vector (destination GID, hop limit, traffic class, ...).
    pub const AV: u32 = 1 << 7;
    /// `IB_QP_PATH_MTU`.
    pub const PATH_MTU: u32 = 1 << 8;
    /// `IB_QP_TIMEOUT`: the local ACK timeout.
    pub const TIMEOUT: u32 = 1 << 9;
    /// `IB_QP_RETRY_CNT`.
    pub const RETRY_CNT: u32 = 1 << 10;
    /// `IB_QP_RNR_RETRY`.
    pub const RNR_RETRY: u32 = 1 << 11;
    /// `IB_QP_RQ_PSN`.
    pub const RQ_PSN: u32 = 1 << 12;
    /// `IB_QP_MAX_QP_RD_ATOMIC`.
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    /// `IB_QP_ALT_PATH`.
    pub const ALT_PATH: u32 = 1 << 14;
    /// `IB_QP_MIN_RNR_TIMER`.
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    /// `IB_QP_SQ_PSN`.
    pub const SQ_PSN: u32 = 1 << 16;
    /// `IB_QP_MAX_DEST_RD_ATOMIC`.
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    /// `IB_QP_PATH_MIG_STATE`.
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    /// `IB_QP_CAP`.
    pub const CAP: u32 = 1 << 19;
    /// `IB_QP_DEST_QPN`.
    pub const DEST_QPN: u32 = 1 << 20;
    /// `IB_QP_RATE_LIMIT`.
    pub const RATE_LIMIT: u32 = 1 << 25;
}

/// `enum ib_wr_opcode`: a send work request's operation (the values userspace shares,
/// `IB_UVERBS_WR_*`).
pub mod wr_opcode {
    /// `IB_WR_RDMA_WRITE`.
    pub const RDMA_WRITE: u32 = 0;
    /// `IB_WR_RDMA_WRITE_WITH_IMM`.
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    /// `IB_WR_SEND`.
    pub const SEND: u32 = 2;
    /// `IB_WR_SEND_WITH_IMM`.
    pub const SEND_WITH_IMM: u32 = 3;
    /// `IB_WR_RDMA_READ`.
    pub const RDMA_READ: u32 = 4;
    /// `IB_WR_ATOMIC_CMP_AND_SWP`.
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    /// `IB_WR_ATOMIC_FETCH_AND_ADD`.
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    /// `IB_WR_LOCAL_INV`.
    pub const LOCAL_INV: u32 = 7;
    /// `IB_UVERBS_WR_BIND_MW` (`IBV_WR_BIND_MW`).
    pub const BIND_MW: u32 = 8;
    /// `IB_WR_SEND_WITH_INV`.
    pub const SEND_WITH_INV: u32 = 9;
    /// `IB_WR_FLUSH`.
    pub const FLUSH: u32 = 14;
    /// `IB_WR_ATOMIC_WRITE`.
    pub const ATOMIC_WRITE: u32 = 15;
    /// `IB_WR_REG_MR` (kernel consumers only: no user WQE carries it).
    pub const REG_MR: u32 = 0x20;
}

/// `enum ib_send_flags`.
pub mod send_flags {
    /// `IB_SEND_FENCE`.
    pub const FENCE: u32 = 1;
    /// `IB_SEND_SIGNALED`.
    pub const SIGNALED: u32 = 1 << 1;
    /// `IB_SEND_SOLICITED`.
    pub const SOLICITED: u32 = 1 << 2;
    /// `IB_SEND_INLINE`.
    pub const INLINE: u32 = 1 << 3;
    /// `IB_SEND_IP_CSUM`.
    pub const IP_CSUM: u32 = 1 << 4;
}

/// `enum ib_access_flags`: what a QP or MR lets remote peers (and local receives) do.
pub mod access {
    /// `IB_ACCESS_LOCAL_WRITE`.
    pub const LOCAL_WRITE: u32 = 1;
    /// `IB_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: u32 = 1 << 1;
    /// `IB_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: u32 = 1 << 2;
    /// `IB_ACCESS_REMOTE_ATOMIC`.
    pub const REMOTE_ATOMIC: u32 = 1 << 3;
    /// `IB_ACCESS_MW_BIND`: memory windows may be bound to the MR.
    pub const MW_BIND: u32 = 1 << 4;
    /// `IB_ZERO_BASED`: remote addresses are offsets into the region (or window).
    pub const ZERO_BASED: u32 = 1 << 5;
    /// `IB_ACCESS_FLUSH_GLOBAL`: RDMA FLUSH to global visibility may target the region.
    pub const FLUSH_GLOBAL: u32 = 1 << 8;
    /// `IB_ACCESS_FLUSH_PERSISTENT`: RDMA FLUSH to persistence may target the region.
    pub const FLUSH_PERSISTENT: u32 = 1 << 9;
}

/// `enum ib_srq_type`.
pub mod srq_type {
    /// `IB_SRQT_BASIC`: a plain SRQ (no XRC, no tag matching).
    pub const BASIC: u32 = 0;
}

/// `enum ib_mtu`.
pub mod mtu {
    /// `IB_MTU_256`.
    pub const MTU_256: u32 = 1;
    /// `IB_MTU_512`.
    pub const MTU_512: u32 = 2;
    /// `IB_MTU_1024`.
    pub const MTU_1024: u32 = 3;
    /// `IB_MTU_2048`.
    pub const MTU_2048: u32 = 4;
    /// `IB_MTU_4096`, the largest.
    pub const MTU_4096: u32 = 5;

    /// The largest MTU code whose size fits in `bytes` (at least 256).
    pub fn largest_within(bytes: u32) -> u32 {
        match bytes {
            4096.. => MTU_4096,
            2048.. => MTU_2048,
            1024.. => MTU_1024,
            512.. => MTU_512,
            _ => MTU_256,
        }
    }

    /// The MTU in bytes, if `code` is one.
    pub fn bytes(code: u32) -> Option<u32> {
        (MTU_256..=MTU_4096).contains(&code).then(|| 128 << code)
    }
}

/// `enum ib_wc_status`: a completion's status.
pub mod wc_status {
    /// `IB_WC_SUCCESS`.
    pub const SUCCESS: u32 = 0;
    /// `IB_WC_LOC_LEN_ERR`.
    pub const LOC_LEN_ERR: u32 = 1;
    /// `IB_WC_LOC_QP_OP_ERR`.
    pub const LOC_QP_OP_ERR: u32 = 2;
    /// `IB_WC_LOC_PROT_ERR`.
    pub const LOC_PROT_ERR: u32 = 4;
    /// `IB_WC_WR_FLUSH_ERR`.
    pub const WR_FLUSH_ERR: u32 = 5;
    /// `IB_WC_MW_BIND_ERR`.
    pub const MW_BIND_ERR: u32 = 6;
    /// `IB_WC_REM_INV_REQ_ERR`.
    pub const REM_INV_REQ_ERR: u32 = 9;
    /// `IB_WC_REM_ACCESS_ERR`.
    pub const REM_ACCESS_ERR: u32 = 10;
    /// `IB_WC_REM_OP_ERR`.
    pub const REM_OP_ERR: u32 = 11;
    /// `IB_WC_RETRY_EXC_ERR`.
    pub const RETRY_EXC_ERR: u32 = 12;
    /// `IB_WC_RNR_RETRY_EXC_ERR`.
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
}

/// `enum ib_wc_opcode`: what a completion completes.
pub mod wc_opcode {
    /// `IB_WC_SEND`.
    pub const SEND: u32 = 0;
    /// `IB_WC_RDMA_WRITE`.
    pub const RDMA_WRITE: u32 = 1;
    /// `IB_WC_RDMA_READ`.
    pub const RDMA_READ: u32 = 2;
    /// `IB_WC_COMP_SWAP`.
    pub const COMP_SWAP: u32 = 3;
    /// `IB_WC_FETCH_ADD`.
    pub const FETCH_ADD: u32 = 4;
    /// `IB_WC_BIND_MW`.
    pub const BIND_MW: u32 = 5;
    /// `IB_WC_LOCAL_INV`.
    pub const LOCAL_INV: u32 = 6;
    /// `IB_WC_REG_MR`.
    pub const REG_MR: u32 = 10;
    /// `IB_WC_FLUSH`.
    pub const FLUSH: u32 = 8;
    /// `IB_WC_ATOMIC_WRITE`.
    pub const ATOMIC_WRITE: u32 = 9;
    /// `IB_WC_RECV`: receive completions have this bit.
    pub const RECV: u32 = 1 << 7;
    /// `IB_WC_RECV_RDMA_WITH_IMM`.
    pub const RECV_RDMA_WITH_IMM: u32 = RECV + 1;

    /// The completion opcode of a send work request's opcode (`super::wr_opcode`).
    pub fn for_send(wr_opcode: u32) -> u32 {
        use super::wr_opcode as wr;
        match wr_opcode {
            wr::RDMA_WRITE | wr::RDMA_WRITE_WITH_IMM => RDMA_WRITE,
            wr::RDMA_READ => RDMA_READ,
            wr::ATOMIC_CMP_AND_SWP => COMP_SWAP,
            wr::ATOMIC_FETCH_AND_ADD => FETCH_ADD,
            wr::BIND_MW => BIND_MW,
            wr::LOCAL_INV => LOCAL_INV,
            wr::REG_MR => REG_MR,
            wr::FLUSH => FLUSH,
            wr::ATOMIC_WRITE => ATOMIC_WRITE,
            _ => SEND,
        }
    }
}

/// `enum ib_wc_flags`: the kernel's completion flags (kernel consumers' completions; a user
/// CQ ring carries libibverbs' flags instead, [`WC_WITH_IMM`]).
pub mod kernel_wc_flags {
    /// `IB_WC_GRH`: a GRH precedes the payload.
    pub const GRH: u32 = 1;
    /// `IB_WC_WITH_IMM`.
    pub const WITH_IMM: u32 = 1 << 1;
    /// `IB_WC_WITH_INVALIDATE`: `ex.invalidate_rkey` is the rkey a SEND_WITH_INV invalidated.
    pub const WITH_INVALIDATE: u32 = 1 << 2;
    /// `IB_WC_WITH_NETWORK_HDR_TYPE`: `network_hdr_type` is set.
    pub const WITH_NETWORK_HDR_TYPE: u32 = 1 << 6;
}

/// `enum rdma_network_type`: what a RoCEv2 GRH holds.
pub mod network_type {
    /// `RDMA_NETWORK_IPV4`.
    pub const IPV4: u8 = 2;
    /// `RDMA_NETWORK_IPV6`.
    pub const IPV6: u8 = 3;
}

/// The `sl` of a UD receive completion of a packet of `network` (a [`network_type`]): the L3
/// header type, as mlx5 reports it there on RoCE (1 IPv6, 2 IPv4; RoCE has no service level
/// on the wire). Consumers read it to tell how the 40-byte GRH area is laid out: an IPv4
/// packet's holds the IPv4 header in its last 20 bytes. UCX's UD transport does: without it
/// UCX takes every IPv4 datagram's GRH for an IPv6 header of another destination and drops it.
pub const fn ud_recv_sl(network: u8) -> u8 {
    match network {
        network_type::IPV4 => 2,
        _ => 1,
    }
}

/// `IBV_WC_WITH_IMM`: libibverbs' `wc_flags` bit for a completion with immediate data (the
/// CQ ring carries libibverbs' flags, which the provider passes through).
pub const WC_WITH_IMM: u32 = 1 << 1;
/// `IBV_WC_WITH_INV`: a receive of a SEND_WITH_INV; `imm_data` is the rkey it invalidated.
pub const WC_WITH_INV: u32 = 1 << 3;
/// `IBV_WC_GRH`: libibverbs' `wc_flags` bit for a receive whose first 40 bytes are the GRH
/// (every UD receive).
pub const WC_GRH: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_nothing_else_is_one() {
        for s in QpState::ALL {
            assert_eq!(QpState::from_ib(s.to_ib()), Some(s));
        }
        assert_eq!(QpState::from_ib(7), None);
        assert_eq!(QpState::from_ib(u32::MAX), None);
        for n in 0..8 {
            if let Some(t) = QpType::from_ib(n) {
                assert_eq!(t.to_ib(), n);
            } else {
                assert!(n > 4);
            }
        }
    }

    #[test]
    fn mtu_codes() {
        assert_eq!(mtu::bytes(0), None);
        assert_eq!(mtu::bytes(1), Some(256));
        assert_eq!(mtu::bytes(3), Some(1024));
        assert_eq!(mtu::bytes(5), Some(4096));
        assert_eq!(mtu::bytes(6), None);
        for b in [0, 255, 256, 511, 1500, 2048, 4095, 4096, 9000] {
            let code = mtu::largest_within(b);
            let size = mtu::bytes(code).unwrap();
            assert!(
                size <= b.max(256) && (code == mtu::MTU_4096 || mtu::bytes(code + 1).unwrap() > b)
            );
        }
    }
}
