// SPDX-License-Identifier: GPL-2.0

//! The device's limits, and the queue capacities a QP create asks for.

/// Limits the device reports (`query_device`) and enforces.
pub mod limits {
    /// QPs per device.
    pub const MAX_QP: u32 = 1 << 14;
    /// CQs per device.
    pub const MAX_CQ: u32 = 1 << 14;
    /// SRQs per device.
    pub const MAX_SRQ: u32 = 1 << 12;
    /// MRs per device.
    pub const MAX_MR: u32 = 1 << 16;
    /// Memory windows per device.
    pub const MAX_MW: u32 = 1 << 16;
    /// Work requests per send or receive queue.
    pub const MAX_QP_WR: u32 = 1 << 14;
    /// Entries per CQ (64 bytes each: the largest ring is 32 MiB). Room for what libfabric's
    /// `ofi_rxm` asks of its MSG CQ by default: (128 send + 128 receive entries) times its
    /// universe of 1,024 peers, 262,144 entries.
    pub const MAX_CQE: u32 = (1 << 19) - 1;
    /// Work requests per SRQ.
    pub const MAX_SRQ_WR: u32 = 1 << 14;
    /// SGEs per send WQE (also an RDMA READ's, `max_sge_rd`): what the largest send entry of
    /// the rings holds (a QP's entries are sized by its `max_send_sge`). Lists longer than
    /// the transport core carries are kept by the driver ([`super::super::lists`]).
    pub const MAX_SEND_SGE: u32 = super::super::abi::MAX_SGE as u32;
    /// SGEs per receive WQE (RQ and SRQ), likewise.
    pub const MAX_RECV_SGE: u32 = super::super::abi::MAX_SGE as u32;
    /// Inline payload per send WQE: what a WQE's data area holds.
    pub const MAX_INLINE: u32 = super::super::abi::MAX_INLINE as u32;
    /// Outstanding RDMA READ / atomic operations per QP, each way.
    pub const MAX_RD_ATOM: u32 = 16;
}

/// The capacities a QP is created with (`struct ib_qp_cap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // Each field is its `ib_qp_cap` namesake.
pub struct Caps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// Why a create is refused (`EINVAL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeyondLimits;

impl Caps {
    /// Checks the capacities `asked` against the device limits (verbs semantics: a request
    /// beyond them fails the create) and returns what the QP gets: queue sizes rounded up to
    /// the rings' powers of two, at least one of everything, no receive queue with an SRQ,
    /// and the whole inline area or none.
    pub fn check(asked: &Caps, has_srq: bool) -> Result<Caps, BeyondLimits> {
        if asked.max_send_wr > limits::MAX_QP_WR
            || asked.max_recv_wr > limits::MAX_QP_WR
            || asked.max_send_sge > limits::MAX_SEND_SGE
            || asked.max_recv_sge > limits::MAX_RECV_SGE
            || asked.max_inline_data > limits::MAX_INLINE
        {
            return Err(BeyondLimits);
        }
        Ok(Caps {
            max_send_wr: asked.max_send_wr.max(1).next_power_of_two(),
            max_recv_wr: if has_srq {
                0
            } else {
                asked.max_recv_wr.max(1).next_power_of_two()
            },
            max_send_sge: asked.max_send_sge.max(1),
            max_recv_sge: if has_srq {
                0
            } else {
                asked.max_recv_sge.max(1)
            },
            max_inline_data: if asked.max_inline_data > 0 {
                limits::MAX_INLINE
            } else {
                0
            },
        })
    }
}

/// The receives an SRQ is created or resized to hold, `max_wr` as asked: 1 to
/// [`limits::MAX_SRQ_WR`] (the ring rounds it up to a power of two).
pub fn srq_wr(max_wr: u32) -> Result<u32, BeyondLimits> {
    if (1..=limits::MAX_SRQ_WR).contains(&max_wr) {
        Ok(max_wr)
    } else {
        Err(BeyondLimits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_and_refuses_beyond_the_limits() {
        let asked = Caps {
            max_send_wr: 100,
            max_recv_wr: 0,
            max_send_sge: 2,
            max_recv_sge: 0,
            max_inline_data: 1,
        };
        let got = Caps::check(&asked, false).unwrap();
        assert_eq!(got.max_send_wr, 128);
        assert_eq!(got.max_recv_wr, 1);
        assert_eq!(got.max_recv_sge, 1);
        assert_eq!(got.max_inline_data, limits::MAX_INLINE);
        let srq = Caps::check(&asked, true).unwrap();
        assert_eq!((srq.max_recv_wr, srq.max_recv_sge), (0, 0));
        for over in [
            Caps {
                max_send_wr: limits::MAX_QP_WR + 1,
                ..asked
            },
            Caps {
                max_recv_sge: limits::MAX_RECV_SGE + 1,
                ..asked
            },
            Caps {
                max_send_sge: limits::MAX_SEND_SGE + 1,
                ..asked
            },
            Caps {
                max_inline_data: limits::MAX_INLINE + 1,
                ..asked
            },
            Caps {
                max_recv_wr: u32::MAX,
                ..asked
            },
        ] {
            assert_eq!(Caps::check(&over, false), Err(BeyondLimits));
        }
        let most = Caps {
            max_send_wr: limits::MAX_QP_WR,
            max_recv_wr: limits::MAX_QP_WR,
            max_send_sge: limits::MAX_SEND_SGE,
            max_recv_sge: limits::MAX_RECV_SGE,
            max_inline_data: 0,
        };
        assert_eq!(
            Caps::check(&most, false).unwrap().max_send_wr,
            limits::MAX_QP_WR
        );
    }

    #[test]
    fn srq_sizes() {
        assert_eq!(srq_wr(0), Err(BeyondLimits));
        assert_eq!(srq_wr(1), Ok(1));
        assert_eq!(srq_wr(limits::MAX_SRQ_WR), Ok(limits::MAX_SRQ_WR));
        assert_eq!(srq_wr(limits::MAX_SRQ_WR + 1), Err(BeyondLimits));
    }
}
