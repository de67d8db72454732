#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Verbs objects on a metaroce device through the stock pyverbs: PD, MR, CQ, SRQ, RC QP, the
QP state machine, query_qp, and the rings: WQEs posted by the provider come back as flush
completions when the QP moves to the error state. Prints TAP lines (numbered by run.sh's
helper through stdout parsing: 'ok - ...' / 'not ok - ...')."""
import sys
import traceback

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.srq import SRQ, SrqInitAttr, SrqAttr
from pyverbs.wr import RecvWR, SendWR, SGE

DEV = sys.argv[1] if len(sys.argv) > 1 else "mroce1"
failures = 0


def check(what, fn):
    global failures
    try:
        fn()
        print(f"ok - {what}")
    except Exception:  # noqa: BLE001 - report anything
        failures += 1
        print(f"not ok - {what}")
        for line in traceback.format_exc().splitlines():
            print(f"# {line}")


ctx = Context(name=DEV)
state = {}


def open_objects():
    state["pd"] = PD(ctx)
    state["mr"] = MR(state["pd"], 65536, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                     | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)
    assert state["mr"].lkey != 0 and state["mr"].rkey == state["mr"].lkey
    state["cq"] = CQ(ctx, 64)


def create_qp():
    cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
    init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=state["cq"], rcq=state["cq"], cap=cap)
    state["qp"] = QP(state["pd"], init)
    assert state["qp"].qp_num >= 256, state["qp"].qp_num


def too_big_qp_fails():
    cap = QPCap(max_send_wr=1 << 20, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
    init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=state["cq"], rcq=state["cq"], cap=cap)
    try:
        QP(state["pd"], init)
    except Exception:  # noqa: BLE001
        return
    raise AssertionError("a QP beyond max_qp_wr was created")


def walk_states():
    qp = state["qp"]
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.pkey_index = 0
    attr.port_num = 1
    attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
    gid = ctx.query_gid(1, 1)
    gr = GlobalRoute(dgid=gid, sgid_index=1, hop_limit=64)
    ah = AHAttr(gr=gr, is_global=1, port_num=1)
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
    attr.dest_qp_num = qp.qp_num
    attr.rq_psn = 0x1234
    attr.max_dest_rd_atomic = 4
    attr.min_rnr_timer = 12
    attr.ah_attr = ah
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
              | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.sq_psn = 0x1234
    attr.max_rd_atomic = 4
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
              | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
    qattr, _ = qp.query(e.IBV_QP_STATE | e.IBV_QP_DEST_QPN | e.IBV_QP_SQ_PSN | e.IBV_QP_TIMEOUT)
    assert qattr.qp_state == e.IBV_QPS_RTS, qattr.qp_state
    assert qattr.dest_qp_num == qp.qp_num
    assert qattr.sq_psn == 0x1234 and qattr.timeout == 14 and qattr.retry_cnt == 7


def bad_transition_fails():
    # RTS -> INIT is not a legal transition.
    try:
        state["qp"].modify(QPAttr(qp_state=e.IBV_QPS_INIT), e.IBV_QP_STATE)
    except Exception:  # noqa: BLE001
        return
    raise AssertionError("RTS -> INIT was accepted")


def flush_on_error():
    qp, mr, cq = state["qp"], state["mr"], state["cq"]
    for i in range(3):
        qp.post_recv(RecvWR(wr_id=100 + i, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
    qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
    got = []
    for _ in range(100):
        n, wcs = cq.poll(num_entries=16)
        got += wcs[:n]
        if len(got) >= 3:
            break
    ids = sorted(wc.wr_id for wc in got)
    assert ids == [100, 101, 102], ids
    assert all(wc.status == e.IBV_WC_WR_FLUSH_ERR for wc in got), [wc.status for wc in got]
    # A send posted in the error state completes with a flush too (the doorbell flushes).
    wr = SendWR(wr_id=7, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(mr.buf, 8, mr.lkey)])
    wr.send_flags = e.IBV_SEND_SIGNALED
    qp.post_send(wr)
    for _ in range(100):
        n, wcs = cq.poll(num_entries=1)
        if n:
            assert wcs[0].wr_id == 7 and wcs[0].status == e.IBV_WC_WR_FLUSH_ERR
            return
    raise AssertionError("no flush completion for the send")


def srq_objects():
    srq = SRQ(state["pd"], SrqInitAttr(SrqAttr(max_wr=32, max_sge=1)))
    a = srq.query()
    assert a.max_wr >= 32, a.max_wr
    cap = QPCap(max_send_wr=8, max_recv_wr=0, max_send_sge=1, max_recv_sge=0)
    init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=state["cq"], rcq=state["cq"], cap=cap, srq=srq)
    qp = QP(state["pd"], init)
    srq.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(state["mr"].buf, 64, state["mr"].lkey)]))
    qp.close()
    srq.close()


def close_all():
    state["qp"].close()
    state["cq"].close()
    state["mr"].close()
    state["pd"].close()


check("open PD, MR (lkey == rkey), CQ", open_objects)
check("create an RC QP (qpn >= 256)", create_qp)
check("a QP beyond the device's max_qp_wr is refused", too_big_qp_fails)
check("QP RESET -> INIT -> RTR -> RTS, query_qp reads the attributes back", walk_states)
check("an illegal transition (RTS -> INIT) is refused", bad_transition_fails)
check("posted WQEs flush to the CQ on the error state (rings, CQE)", flush_on_error)
check("SRQ create/query/post, QP on an SRQ", srq_objects)
check("destroy QP, CQ, MR, PD", close_all)
ctx.close()
sys.exit(1 if failures else 0)
