// SPDX-License-Identifier: GPL-2.0

//! Completions: the transport's events delivered to the QPs' CQs in verbs form.

use super::*;

/// Hands a transport event to the QP's CQs.
pub(super) fn deliver(qps: &[QpSlot], ev: Event) {
    match ev {
        Event::SendCompletion(c) | Event::RecvCompletion(c) => {
            let Some(qp) = qps.get(usize::from(c.stream.0)).and_then(|s| s.qp.as_ref()) else {
                return;
            };
            let recv = matches!(ev, Event::RecvCompletion(_));
            let cqe = Cqe {
                wr_id: c.wr_id,
                status: wc_status(c.status),
                opcode: wc_opcode(c.opcode),
                byte_len: c.byte_len,
                imm_data: c.imm.unwrap_or(0),
                // A kernel consumer's CQ takes the kernel's flags, a user's libibverbs'.
                wc_flags: match (c.imm, c.invalidated, qp.kernel.is_some()) {
                    (Some(_), true, false) => WC_WITH_INV,
                    (Some(_), true, true) => kernel_wc_flags::WITH_INVALIDATE,
                    (Some(_), false, _) => WC_WITH_IMM,
                    (None, _, _) => 0,
                },
                qp_num: qp.qpn,
                src_qp: c.src_qp,
                ..Default::default()
            };
            if recv {
                qp.complete_recv(&cqe, c.solicited);
            } else {
                qp.complete_send(&cqe);
            }
        }
        Event::StreamError { stream, .. } => {
            if let Some(qp) = qps.get(usize::from(stream.0)).and_then(|s| s.qp.as_ref()) {
                qp.set_error();
            }
        }
        Event::SendQueueRoom(_) => {}
    }
}

fn wc_status(s: CqStatus) -> u32 {
    use wc_status as w;
    match s {
        CqStatus::Success => w::SUCCESS,
        CqStatus::LocLenErr => w::LOC_LEN_ERR,
        CqStatus::LocProtErr => w::LOC_PROT_ERR,
        CqStatus::WrFlushErr => w::WR_FLUSH_ERR,
        CqStatus::RemAccessErr => w::REM_ACCESS_ERR,
        CqStatus::RemInvReqErr => w::REM_INV_REQ_ERR,
        CqStatus::RemOpErr => w::REM_OP_ERR,
        CqStatus::RetryExcErr => w::RETRY_EXC_ERR,
        CqStatus::RnrRetryExcErr => w::RNR_RETRY_EXC_ERR,
    }
}

fn wc_opcode(o: CqOpcode) -> u32 {
    use wc_opcode as w;
    match o {
        CqOpcode::Send => w::SEND,
        CqOpcode::RdmaWrite => w::RDMA_WRITE,
        CqOpcode::RdmaRead => w::RDMA_READ,
        CqOpcode::CmpSwap => w::COMP_SWAP,
        CqOpcode::FetchAdd => w::FETCH_ADD,
        CqOpcode::Recv => w::RECV,
        CqOpcode::RecvRdmaWithImm => w::RECV_RDMA_WITH_IMM,
        CqOpcode::AtomicWrite => w::ATOMIC_WRITE,
        CqOpcode::Flush => w::FLUSH,
    }
}
