#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Verbs objects on a metaroce device through the stock pyverbs: PD, MR, CQ, SRQ, RC QP, the
QP state machine, query_qp, and the rings: WQEs posted by the provider come back as flush
completions when the QP moves to the error state. Prints TAP lines (numbered by run.sh's
helper through stdout parsing: 'ok - ...' / 'not ok - ...')."""
import errno
import sys
import time
import traceback

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pyverbs_error import PyverbsRDMAError
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



def cq_sizes():
    """max_cqe is enough for libfabric's ofi_rxm (its MSG CQ by default: a universe of 1,024
    peers times 128 send and 128 receive entries, 262,144); a CQ of max_cqe is created and
    holds that many; one more than max_cqe is EINVAL."""
    max_cqe = ctx.query_device().max_cqe
    assert max_cqe >= 262144, max_cqe
    cq = CQ(ctx, max_cqe)
    assert cq.cqe >= max_cqe, (cq.cqe, max_cqe)
    cq.close()
    try:
        CQ(ctx, max_cqe + 1).close()
        raise AssertionError("a CQ beyond max_cqe was created")
    except PyverbsRDMAError as ex:
        assert ex.error_code == errno.EINVAL, ex.error_code

def to_rts(qp, sq_psn, max_rd_atomic):
    """RTR -> RTS with the timeouts and retries every check here uses."""
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.sq_psn = sq_psn
    attr.max_rd_atomic = max_rd_atomic
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
              | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)


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
    to_rts(qp, 0x1234, 4)
    qattr, _ = qp.query(e.IBV_QP_STATE | e.IBV_QP_DEST_QPN | e.IBV_QP_SQ_PSN | e.IBV_QP_TIMEOUT)
    assert qattr.qp_state == e.IBV_QPS_RTS, qattr.qp_state
    assert qattr.dest_qp_num == qp.qp_num
    assert qattr.sq_psn == 0x1234 and qattr.timeout == 14 and qattr.retry_cnt == 7


def mr_keys_unpredictable():
    # rkeys go on the wire: one MR's must not give away the next one's. MR keys end in a
    # random byte (a counter gave key byte + 1 every time), and a slot used again gets a key
    # other than its last.
    pd = state["pd"]
    mrs = [MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE) for _ in range(16)]
    keys = [m.rkey for m in mrs]
    assert len(set(keys)) == 16, [hex(k) for k in keys]
    steps = sum(1 for a, b in zip(keys, keys[1:]) if (b & 0xff) == ((a + 1) & 0xff))
    assert steps < 4, f"{steps} of 15 keys are the previous key byte + 1: {[hex(k) for k in keys]}"
    old = mrs[5].rkey
    mrs[5].close()
    again = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    assert again.rkey != old, hex(old)
    again.close()
    for m in mrs:
        m.close()


def rtr_attrs(gid, sgid_index, dest_qp):
    gr = GlobalRoute(dgid=gid, sgid_index=sgid_index, hop_limit=64)
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
    attr.dest_qp_num = dest_qp
    attr.rq_psn = 0
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=1)
    return attr, (e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                  | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)


def connect_pairs(pairs, access, rd_atomic=1):
    """Each (qp, peer) of `pairs`: RESET -> INIT (port 1, `access`) -> RTR toward peer on this
    device's IPv4 GID -> RTS, `rd_atomic` READs/atomics outstanding each way."""
    gid = ctx.query_gid(1, 1)
    for qp, peer in pairs:
        attr = QPAttr(qp_state=e.IBV_QPS_INIT)
        attr.pkey_index = 0
        attr.port_num = 1
        attr.qp_access_flags = access
        qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                  | e.IBV_QP_ACCESS_FLAGS)
        attr, mask = rtr_attrs(gid, 1, peer.qp_num)
        attr.max_dest_rd_atomic = rd_atomic
        qp.modify(attr, mask)
        to_rts(qp, 0, rd_atomic)


def failed_modify_changes_nothing():
    # An RC QP cannot connect to a group: INIT -> RTR toward a multicast GID fails in the
    # driver's attach (the core resolves its MAC and lets it through), and the QP must still be
    # in INIT with its old attributes (a failed attach used to leave it in RTR with no
    # connection, its WQEs hanging); then RTR toward the IPv4 GID works.
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    qp = QP(state["pd"], QPInitAttr(qp_type=e.IBV_QPT_RC, scq=state["cq"], rcq=state["cq"], cap=cap))
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.pkey_index = 0
    attr.port_num = 1
    attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
    attr, mask = rtr_attrs(GID("ff0e:0000:0000:0000:0000:0000:0000:4242"), 1, 0x4242)
    try:
        qp.modify(attr, mask)
        raise AssertionError("RTR toward a multicast GID was accepted")
    except AssertionError:
        raise
    except Exception:  # noqa: BLE001 - the refusal is what we want
        pass
    qattr, _ = qp.query(e.IBV_QP_STATE | e.IBV_QP_DEST_QPN)
    assert qattr.qp_state == e.IBV_QPS_INIT, f"state {qattr.qp_state} after a failed modify"
    assert qattr.dest_qp_num != 0x4242, "the failed modify's attributes were kept"
    attr, mask = rtr_attrs(ctx.query_gid(1, 1), 1, qp.qp_num)
    qp.modify(attr, mask)
    qattr, _ = qp.query(e.IBV_QP_STATE)
    assert qattr.qp_state == e.IBV_QPS_RTR, qattr.qp_state
    qp.close()


def hw_counter(name):
    """The counter as the core shows it now. The core caches a port's counters for the
    port's hw_counters/lifespan (10 ms by default): a read that soon after another returns
    the cached values, so wait that long first."""
    base = f"/sys/class/infiniband/{DEV}/ports/1/hw_counters"
    with open(f"{base}/lifespan") as f:
        time.sleep(int(f.read()) / 1000 + 0.005)
    with open(f"{base}/{name}") as f:
        return int(f.read())


def peers_connected():
    with open(f"/sys/class/infiniband/{DEV}/peers") as f:
        return sum(1 for line in f if line.startswith("peer "))


def peer_listed(addr):
    with open(f"/sys/class/infiniband/{DEV}/peers") as f:
        return any(line.startswith(f"peer {addr} ") for line in f)


def v4_gid(addr):
    """The IPv4-mapped GID of addr, as pyverbs' GID() parses it (8 groups of 4 hex digits)."""
    a, b, c, d = (int(x) for x in addr.split("."))
    return GID(f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}")


def peers_are_bounded():
    # Any local user names any address in modify_qp, and each peer device costs a connection:
    # past max_peers, RTR toward a new address fails (ENOSPC), the QP stays in INIT, and
    # peers_refused counts it. A peer whose last QP went lingers (10 s), but a full table gives
    # it up for a new one. 10.77.0.50-.52 answer nobody: verbs.sh gives them static neighbour
    # entries so that the core resolves their MACs.
    path = f"/sys/class/infiniband/{DEV}/max_peers"
    with open(path) as f:
        old = int(f.read())
    have = peers_connected()
    refused = hw_counter("peers_refused")
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    qps = []

    def connect(addr, dest_qp):
        qp = QP(state["pd"], QPInitAttr(qp_type=e.IBV_QPT_RC, scq=state["cq"], rcq=state["cq"],
                                        cap=cap))
        qps.append(qp)
        attr = QPAttr(qp_state=e.IBV_QPS_INIT)
        attr.pkey_index = 0
        attr.port_num = 1
        qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
        attr, mask = rtr_attrs(v4_gid(addr), 1, dest_qp)
        qp.modify(attr, mask)
        return qp

    try:
        with open(path, "w") as f:
            f.write(str(have + 1))
        connect("10.77.0.50", 0x100)
        try:
            connect("10.77.0.51", 0x101)
            raise AssertionError(f"RTR toward a peer beyond max_peers ({have + 1}) was accepted")
        except AssertionError:
            raise
        except Exception as ex:  # noqa: BLE001
            assert getattr(ex, "error_code", None) in (None, 28), ex  # ENOSPC
        qattr, _ = qps[-1].query(e.IBV_QP_STATE)
        assert qattr.qp_state == e.IBV_QPS_INIT, qattr.qp_state
        assert peers_connected() == have + 1, peers_connected()
        assert hw_counter("peers_refused") == refused + 1, hw_counter("peers_refused")
        for qp in qps:
            qp.close()
        qps.clear()
        # Idle, 10.77.0.50 lingers; a new peer takes its place in the full table.
        assert peer_listed("10.77.0.50"), "the idle peer went at once"
        connect("10.77.0.52", 0x102)
        assert peer_listed("10.77.0.52") and not peer_listed("10.77.0.50"), \
            "the idle peer was not given up for a new one"
        assert peers_connected() == have + 1, peers_connected()
    finally:
        with open(path, "w") as f:
            f.write(str(old))
        for qp in qps:
            qp.close()


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


def cq_resize():
    """ibv_resize_cq: completions not polled yet move to the new ring in order, later ones
    land there too; a size they do not fit is refused with EINVAL and changes nothing."""
    pd, mr = state["pd"], state["mr"]
    cq = CQ(ctx, 4)
    cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    qp.to_init(QPAttr(port_num=1))
    for i in range(3):
        qp.post_recv(RecvWR(wr_id=200 + i, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
    qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
    # The three flushes are in the CQ (the error state flushes at once); none is polled.
    time.sleep(0.1)
    try:
        cq.resize(1)
        raise AssertionError("resize to 1 entry with 3 completions waiting succeeded")
    except PyverbsRDMAError as ex:
        assert ex.error_code == errno.EINVAL, ex
    cq.resize(16)
    assert cq.cqe >= 16, cq.cqe

    def poll(n):
        got = []
        for _ in range(200):
            k, wcs = cq.poll(num_entries=8)
            got += wcs[:k]
            if len(got) >= n:
                break
            time.sleep(0.005)
        return got

    got = poll(3)
    assert [wc.wr_id for wc in got] == [200, 201, 202], [wc.wr_id for wc in got]
    assert all(wc.status == e.IBV_WC_WR_FLUSH_ERR for wc in got)
    # Empty now: smaller is fine, and completions made after it arrive in the new ring.
    cq.resize(2)
    assert 2 <= cq.cqe < 16, cq.cqe
    for i in range(2):
        wr = SendWR(wr_id=300 + i, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(mr.buf, 8, mr.lkey)])
        wr.send_flags = e.IBV_SEND_SIGNALED
        qp.post_send(wr)
    got = poll(2)
    assert [wc.wr_id for wc in got] == [300, 301], [wc.wr_id for wc in got]
    assert cq.poll(num_entries=1)[0] == 0, "a completion polled twice"
    qp.close()
    cq.close()


def memory_windows():
    """Memory windows between two QPs of this device connected to each other: a type 2
    window bound by a BIND_MW work request takes an RDMA WRITE through its new rkey (placed in
    the MR behind it, at the window's address), refuses one beyond it, and after a LOCAL_INV
    refuses one inside it, as after the peer's SEND_WITH_INV of its rkey; a type 1 window bound with ibv_bind_mw is read through, its MR
    cannot be deregistered while it is bound (EBUSY), and a bind with rights the MR cannot
    back fails with MW_BIND_ERR."""
    from pyverbs.mr import MW, MWBind, MWBindInfo
    from pyverbs.wr import SendWR as WR

    pd = PD(ctx)
    cq = CQ(ctx, 64)
    size = 4096
    target = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_MW_BIND)
    src = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE)
    cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
    remote = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_LOCAL_WRITE

    def make_pair():
        a = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
        b = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
        connect_pairs(((a, b), (b, a)), remote)
        return a, b

    def one(wr_id):
        for _ in range(2000):
            n, wcs = cq.poll(num_entries=1)
            if n:
                assert wcs[0].wr_id == wr_id, (wcs[0].wr_id, wr_id)
                return wcs[0]
            time.sleep(0.005)
        raise AssertionError(f"no completion for wr_id {wr_id}")

    def rdma(qp, wr_id, opcode, rkey, addr, length, at=0):
        wr = WR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[SGE(src.buf + at, length, src.lkey)])
        wr.send_flags = e.IBV_SEND_SIGNALED
        wr.set_wr_rdma(rkey, addr)
        qp.post_send(wr)
        return one(wr_id)

    a, b = make_pair()
    mw = MW(pd, e.IBV_MW_TYPE_2)
    info = MWBindInfo(target, target.buf + 1024, 512, e.IBV_ACCESS_REMOTE_WRITE)
    bind = WR(wr_id=1, opcode=e.IBV_WR_BIND_MW)
    bind.set_bind_wr(mw, info)
    bind.send_flags = e.IBV_SEND_SIGNALED
    b.post_send(bind)
    wc = one(1)
    assert wc.status == e.IBV_WC_SUCCESS and wc.opcode == e.IBV_WC_BIND_MW, (wc.status, wc.opcode)
    rkey = bind.rkey
    assert rkey != mw.rkey and rkey >> 8 == mw.rkey >> 8, (hex(rkey), hex(mw.rkey))
    payload = bytes((i * 7) & 0xff for i in range(256))
    src.write(payload, 256)
    wc = rdma(a, 2, e.IBV_WR_RDMA_WRITE, rkey, target.buf + 1024 + 128, 256)
    assert wc.status == e.IBV_WC_SUCCESS, wc.status
    got = target.read(256, 1024 + 128)
    assert got == payload, "the WRITE through the window was not placed at its address"
    # The old rkey reaches nothing; LOCAL_INV on b, then the window refuses a - the QP fails.
    inv = WR(wr_id=3, opcode=e.IBV_WR_LOCAL_INV)
    inv.imm_data = rkey
    inv.send_flags = e.IBV_SEND_SIGNALED
    b.post_send(inv)
    wc = one(3)
    assert wc.status == e.IBV_WC_SUCCESS and wc.opcode == e.IBV_WC_LOCAL_INV, (wc.status, wc.opcode)
    wc = rdma(a, 4, e.IBV_WR_RDMA_WRITE, rkey, target.buf + 1024, 8)
    assert wc.status == e.IBV_WC_REM_ACCESS_ERR, wc.status
    a.close()
    b.close()
    # Bound again (a new pair), then invalidated by the peer: a SEND_WITH_INV of its rkey
    # completes b's receive with IBV_WC_WITH_INV and the rkey, and the window refuses a WRITE.
    a, b = make_pair()
    bind = WR(wr_id=8, opcode=e.IBV_WR_BIND_MW)
    bind.set_bind_wr(mw, info)
    bind.send_flags = e.IBV_SEND_SIGNALED
    b.post_send(bind)
    assert one(8).status == e.IBV_WC_SUCCESS
    rkey = bind.rkey
    b.post_recv(RecvWR(wr_id=9, num_sge=1, sg=[SGE(src.buf + 3072, 64, src.lkey)]))
    sinv = WR(wr_id=10, opcode=e.IBV_WR_SEND_WITH_INV, num_sge=1,
              sg=[SGE(src.buf, 16, src.lkey)])
    sinv.imm_data = rkey
    sinv.send_flags = e.IBV_SEND_SIGNALED
    a.post_send(sinv)
    got = {}
    for _ in range(2):
        for _ in range(2000):
            n, wcs = cq.poll(num_entries=1)
            if n:
                got[wcs[0].wr_id] = wcs[0]
                break
            time.sleep(0.005)
    assert sorted(got) == [9, 10], sorted(got)
    assert got[10].status == e.IBV_WC_SUCCESS, got[10].status
    r = got[9]
    assert r.status == e.IBV_WC_SUCCESS and r.byte_len == 16, (r.status, r.byte_len)
    assert r.wc_flags & e.IBV_WC_WITH_INV and not r.wc_flags & e.IBV_WC_WITH_IMM, r.wc_flags
    assert r.imm_data == rkey, (hex(r.imm_data), hex(rkey))  # the union's invalidated_rkey
    wc = rdma(a, 11, e.IBV_WR_RDMA_WRITE, rkey, target.buf + 1024, 8)
    assert wc.status == e.IBV_WC_REM_ACCESS_ERR, wc.status
    a.close()
    b.close()
    mw.close()

    # Type 1: bound by ibv_bind_mw (a BIND_MW the provider posts), read through; beyond it no.
    a, b = make_pair()
    mw = MW(pd, e.IBV_MW_TYPE_1)
    target.write(payload, 256, 2048)
    b.bind_mw(mw, MWBind(MWBindInfo(target, target.buf + 2048, 256, e.IBV_ACCESS_REMOTE_READ),
                         e.IBV_SEND_SIGNALED))
    wc = one(0)
    assert wc.status == e.IBV_WC_SUCCESS and wc.opcode == e.IBV_WC_BIND_MW, (wc.status, wc.opcode)
    wc = rdma(a, 5, e.IBV_WR_RDMA_READ, mw.rkey, target.buf + 2048 + 64, 64, at=512)
    assert wc.status == e.IBV_WC_SUCCESS, wc.status
    assert src.read(64, 512) == payload[64:128], "the READ through the window read elsewhere"
    wc = rdma(a, 6, e.IBV_WR_RDMA_READ, mw.rkey, target.buf + 2048 + 250, 8)
    assert wc.status == e.IBV_WC_REM_ACCESS_ERR, wc.status
    a.close()
    b.close()
    # The type 1 window is still bound to `target`: its deregistration is EBUSY and it stays
    # (the window goes first at the end, then the MR).
    try:
        target.close()
        raise AssertionError("ibv_dereg_mr of an MR with a window bound to it succeeded")
    except PyverbsRDMAError as ex:
        assert ex.error_code == errno.EBUSY, ex.error_code
    assert target.read(8, 2048) == payload[:8]
    # Remote write through a window over an MR without local write: MW_BIND_ERR (a new pair:
    # an access error failed both QPs of the last).
    a, b = make_pair()
    plain = MR(pd, size, e.IBV_ACCESS_MW_BIND)
    bad = WR(wr_id=7, opcode=e.IBV_WR_BIND_MW)
    mw2 = MW(pd, e.IBV_MW_TYPE_2)
    bad.set_bind_wr(mw2, MWBindInfo(plain, plain.buf, 64, e.IBV_ACCESS_REMOTE_WRITE))
    bad.send_flags = e.IBV_SEND_SIGNALED
    b.post_send(bad)
    wc = one(7)
    assert wc.status == e.IBV_WC_MW_BIND_ERR, wc.status
    for o in (a, b, mw, mw2, plain, target, src, cq, pd):
        o.close()


def atomic_write_and_flush():
    """ATOMIC WRITE and RDMA FLUSH between two QPs of this device, through the ibv_wr_* API: the
    8 bytes land in order at the target; FLUSH of a range and of the whole MR complete
    (IBV_WC_ATOMIC_WRITE, IBV_WC_FLUSH, in order with the WRITE before them); an MR asking for
    persistent flush is refused (no persistent memory), a persistent FLUSH fails with a remote
    access error, and a misaligned ATOMIC WRITE fails the batch (EINVAL)."""
    from pyverbs.qp import QPEx, QPInitAttrEx

    pd = PD(ctx)
    cq = CQ(ctx, 64)
    target = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                | e.IBV_ACCESS_FLUSH_GLOBAL)
    src = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    try:
        MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_FLUSH_PERSISTENT)
        raise AssertionError("an MR with IBV_ACCESS_FLUSH_PERSISTENT was registered")
    except PyverbsRDMAError:
        pass
    ops = (e.IBV_QP_EX_WITH_ATOMIC_WRITE | e.IBV_QP_EX_WITH_FLUSH
           | e.IBV_QP_EX_WITH_RDMA_WRITE)
    cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)

    def qpex():
        return QPEx(ctx, QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, pd=pd, cap=cap,
                                      send_ops_flags=ops,
                                      comp_mask=e.IBV_QP_INIT_ATTR_PD
                                      | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
    a, b = qpex(), qpex()
    connect_pairs(((a, b), (b, a)), e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_LOCAL_WRITE)

    def poll(n):
        got = []
        for _ in range(2000):
            k, wcs = cq.poll(num_entries=n - len(got))
            got += [(w.wr_id, w.status, w.opcode) for w in wcs[:k]]
            if len(got) == n:
                return got
            time.sleep(0.005)
        raise AssertionError(f"{len(got)} of {n} completions: {got}")

    data = bytes((i * 13) & 0xff for i in range(1024))
    src.write(data, len(data))
    flag = bytes(range(1, 9))
    a.wr_start()
    a.wr_id, a.wr_flags = 1, e.IBV_SEND_SIGNALED
    a.wr_rdma_write(target.rkey, target.buf)
    a.wr_set_sge(SGE(src.buf, len(data), src.lkey))
    a.wr_id = 2
    a.wr_atomic_write(target.rkey, target.buf + 1024, flag)
    a.wr_id = 3
    a.wr_flush(target.rkey, target.buf, 1032, e.IBV_FLUSH_GLOBAL, e.IBV_FLUSH_RANGE)
    a.wr_id = 4
    a.wr_flush(target.rkey, target.buf, 0, e.IBV_FLUSH_GLOBAL, e.IBV_FLUSH_MR)
    a.wr_complete()
    ok = e.IBV_WC_SUCCESS
    want = [(1, ok, e.IBV_WC_RDMA_WRITE), (2, ok, e.IBV_WC_ATOMIC_WRITE),
            (3, ok, e.IBV_WC_FLUSH), (4, ok, e.IBV_WC_FLUSH)]
    got = poll(4)
    assert got == want, got
    assert target.read(len(data), 0) == data, "the WRITE's data"
    assert target.read(8, 1024) == flag, f"the ATOMIC WRITE's bytes: {target.read(8, 1024)}"
    a.wr_start()
    a.wr_atomic_write(target.rkey, target.buf + 1028, flag)
    try:
        a.wr_complete()
        raise AssertionError("a misaligned ATOMIC WRITE was posted")
    except PyverbsRDMAError as ex:
        assert ex.error_code == errno.EINVAL, ex.error_code
    a.wr_start()
    a.wr_id = 5
    a.wr_flush(target.rkey, target.buf, 8, e.IBV_FLUSH_PERSISTENT, e.IBV_FLUSH_RANGE)
    a.wr_complete()
    got = poll(1)
    assert got == [(5, e.IBV_WC_REM_ACCESS_ERR, e.IBV_WC_FLUSH)], got
    for o in (a, b, target, src, cq, pd):
        o.close()


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


def srq_resize():
    """ibv_modify_srq(IBV_SRQ_MAX_WR): receives posted and not taken move to the new ring in
    order; a size they do not fit is EINVAL; posting goes on behind them; a QP on the SRQ takes
    them all, in posting order, across the resize."""
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1)))
    assert srq.query().max_wr == 4, srq.query().max_wr
    for i in range(3):
        srq.post_recv(RecvWR(wr_id=100 + i, num_sge=1, sg=[SGE(mr.buf + 64 * i, 64, mr.lkey)]))
    try:
        srq.modify(SrqAttr(max_wr=2), e.IBV_SRQ_MAX_WR)
        raise AssertionError("a resize below the receives posted succeeded")
    except PyverbsRDMAError as ex:
        assert ex.error_code == errno.EINVAL, ex.error_code
    srq.modify(SrqAttr(max_wr=20), e.IBV_SRQ_MAX_WR)
    got = srq.query().max_wr
    assert got >= 20, got
    for i in range(3, 24):
        srq.post_recv(RecvWR(wr_id=100 + i, num_sge=1, sg=[SGE(mr.buf + 64 * (i % 32), 64,
                                                                mr.lkey)]))
    cap = QPCap(max_send_wr=32, max_recv_wr=0, max_send_sge=1, max_recv_sge=0)
    recv = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, srq=srq))
    send = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    connect_pairs(((recv, send), (send, recv)), e.IBV_ACCESS_LOCAL_WRITE)
    for i in range(24):
        wr = SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(mr.buf + 2048, 8, mr.lkey)])
        wr.send_flags = e.IBV_SEND_SIGNALED
        send.post_send(wr)
    recvs, sends = [], 0
    for _ in range(4000):
        n, wcs = cq.poll(num_entries=16)
        for w in wcs[:n]:
            assert w.status == e.IBV_WC_SUCCESS, (w.wr_id, w.status)
            if w.opcode & e.IBV_WC_RECV:
                recvs.append(w.wr_id)
            else:
                sends += 1
        if len(recvs) == 24 and sends == 24:
            break
        time.sleep(0.005)
    assert recvs == [100 + i for i in range(24)], recvs
    for o in (recv, send, srq, mr, cq, pd):
        o.close()


def long_sge_lists():
    """SGE lists as long as the device carries (32, rxe's limit; the transport keeps 4 in a
    WQE, so the driver keeps longer lists, and a ring entry holds 12 send or 7 receive SGEs in
    its structure, more past it when the QP asks for them): for QPs created with 12/7, 20/9 and
    32/32 send/receive SGEs, 40 SENDs of full lists into RQ receives of full lists, 40 more into
    an SRQ's, an RDMA WRITE gathered from a full list and an RDMA READ scattered into one, every
    byte checked (more WQEs than the driver has slots for lists, so its slots go round); a QP or
    SRQ asking for one SGE more than 32 is refused."""
    import random

    attr = ctx.query_device()
    assert (attr.max_sge, attr.max_sge_rd, attr.max_srq_sge) == (32, 32, 32), \
        (attr.max_sge, attr.max_sge_rd, attr.max_srq_sge)
    pd = PD(ctx)
    cq = CQ(ctx, 256)
    n = 40
    region = 4096
    flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
    src = MR(pd, n * region, flags)
    dst = MR(pd, n * region, flags)
    rnd = random.Random(7)
    src.write(bytes(rnd.getrandbits(8) for _ in range(n * region)), n * region)
    # Every prefix of the receive lengths used below holds the send prefix it receives.
    all_send = [1, 3, 17, 64, 129, 255, 256, 300, 511, 700, 33, 2,
                7, 9, 40, 1, 90, 13, 5, 77, 2, 31, 8, 16, 4, 60, 3, 11, 29, 6, 50, 1]
    all_recv = [5, 100, 250, 333, 700, 900, 1000] + [10] * 25

    def spread(mr, base, lens, gap):
        """SGEs of `lens` from `base` on, `gap` bytes apart."""
        sges, at = [], base
        for length in lens:
            sges.append(SGE(mr.buf + at, length, mr.lkey))
            at += length + gap
        assert at <= base + region, (base, at)
        return sges

    def gathered(mr, sges):
        return b"".join(mr.read(s.length, s.addr - mr.buf) for s in sges)

    def wait(count):
        got = []
        for _ in range(4000):
            k, wcs = cq.poll(num_entries=32)
            got += [(w.wr_id, w.status, w.opcode, w.byte_len) for w in wcs[:k]]
            if len(got) >= count:
                return got
            time.sleep(0.005)
        raise AssertionError(f"{len(got)} of {count} completions: {got[:8]}")

    for nsend, nrecv in ((12, 7), (20, 9), (32, 32)):
        send_lens, recv_lens = all_send[:nsend], all_recv[:nrecv]
        total = sum(send_lens)
        big = QPCap(max_send_wr=64, max_recv_wr=64, max_send_sge=nsend, max_recv_sge=nrecv)
        srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=64, max_sge=nrecv)))
        a = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=big))
        b = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=big))
        c = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=big, srq=srq))
        d = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=big))
        connect_pairs(((a, b), (b, a), (c, d), (d, c)), flags, rd_atomic=4)
        what = f"{nsend}/{nrecv} SGEs"
        for receiver, sender, post_recv, name in ((b, a, b.post_recv, "RQ"),
                                                  (c, d, srq.post_recv, "SRQ")):
            dst.write(bytes(n * region), n * region)
            recvs = [spread(dst, i * region, recv_lens, 5) for i in range(n)]
            for i in range(n):
                post_recv(RecvWR(wr_id=1000 + i, num_sge=nrecv, sg=recvs[i]))
            sends = [spread(src, i * region, send_lens, 7) for i in range(n)]
            for i in range(n):
                wr = SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=nsend, sg=sends[i])
                wr.send_flags = e.IBV_SEND_SIGNALED
                sender.post_send(wr)
            got = wait(2 * n)
            assert all(g[1] == e.IBV_WC_SUCCESS for g in got), \
                (what, [g for g in got if g[1]][:4])
            rx = sorted(g for g in got if g[0] >= 1000)
            assert [(g[0], g[3]) for g in rx] == [(1000 + i, total) for i in range(n)], \
                (what, rx[:4])
            for i in range(n):
                want = gathered(src, sends[i])
                placed = gathered(dst, recvs[i])[:total]
                assert placed == want, f"{what} {name} message {i}: the bytes placed differ"
            assert gathered(dst, recvs[0])[total:] == bytes(sum(recv_lens) - total), \
                (what, name)

        # An RDMA WRITE gathered from a full list lands contiguous at the remote address; an
        # RDMA READ of it scatters back into a full list.
        dst.write(bytes(n * region), n * region)
        gather = spread(src, 0, send_lens, 11)
        wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=nsend, sg=gather)
        wr.send_flags = e.IBV_SEND_SIGNALED
        wr.set_wr_rdma(dst.rkey, dst.buf + 3)
        a.post_send(wr)
        assert wait(1)[0][:2] == (1, e.IBV_WC_SUCCESS), what
        want = gathered(src, gather)
        assert dst.read(total, 3) == want, f"{what}: the gathered WRITE differs"
        scatter = spread(dst, 2 * region, list(reversed(send_lens)), 13)
        wr = SendWR(wr_id=2, opcode=e.IBV_WR_RDMA_READ, num_sge=nsend, sg=scatter)
        wr.send_flags = e.IBV_SEND_SIGNALED
        wr.set_wr_rdma(dst.rkey, dst.buf + 3)
        a.post_send(wr)
        assert wait(1)[0][:2] == (2, e.IBV_WC_SUCCESS), what
        assert gathered(dst, scatter) == want, f"{what}: the scattered READ differs"
        for o in (a, b, c, d, srq):
            o.close()

    for over in (QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=33, max_recv_sge=1),
                 QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=33)):
        try:
            QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=over)).close()
            raise AssertionError(f"a QP with {over} was created")
        except PyverbsRDMAError as ex:
            assert ex.error_code == errno.EINVAL, ex.error_code
    try:
        SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=33))).close()
        raise AssertionError("an SRQ with 33 SGEs was created")
    except PyverbsRDMAError as ex:
        assert ex.error_code == errno.EINVAL, ex.error_code
    for o in (src, dst, cq, pd):
        o.close()


def close_all():
    state["qp"].close()
    state["cq"].close()
    state["mr"].close()
    state["pd"].close()


check("open PD, MR (lkey == rkey), CQ", open_objects)
check("create an RC QP (qpn >= 256)", create_qp)
check("a QP beyond the device's max_qp_wr is refused", too_big_qp_fails)
check("a CQ of max_cqe (>= 262,144, ofi_rxm's default) entries is created, one more is EINVAL",
      cq_sizes)
check("QP RESET -> INIT -> RTR -> RTS, query_qp reads the attributes back", walk_states)
check("an illegal transition (RTS -> INIT) is refused", bad_transition_fails)
check("MR keys end in a random byte: 16 in a row do not count up, a reused slot gets a new key",
      mr_keys_unpredictable)
check("a failed INIT -> RTR (multicast GID) leaves the QP in INIT with its old attributes",
      failed_modify_changes_nothing)
check("peer devices are bounded by max_peers: one more is refused (ENOSPC, counted), its QP stays "
      "in INIT; an idle peer lingers, and gives its place to a new one", peers_are_bounded)
check("posted WQEs flush to the CQ on the error state (rings, CQE)", flush_on_error)
check("ibv_resize_cq: waiting completions move in order, later ones follow; too small is EINVAL",
      cq_resize)
check("memory windows: type 2 bound by a work request takes a WRITE at its address, refuses "
      "after LOCAL_INV and after the peer's SEND_WITH_INV (IBV_WC_WITH_INV); type 1 bound by ibv_bind_mw is read through, not beyond; its MR's "
      "dereg is EBUSY while it is bound; a bind the MR cannot back is MW_BIND_ERR", memory_windows)
check("ATOMIC WRITE lands its 8 bytes in order, FLUSH of a range and of an MR complete in order, "
      "a persistent FLUSH is a remote access error (ibv_wr_* API)", atomic_write_and_flush)
check("SRQ create/query/post, QP on an SRQ", srq_objects)
check("ibv_modify_srq(IBV_SRQ_MAX_WR): receives posted move to the new ring in order, "
      "too small is EINVAL, a QP on the SRQ takes all 24 in order across the resize", srq_resize)
check("SGE lists as long as the device carries (32, send, READ and receive, RQ and SRQ; QPs of "
      "12/7, 20/9 and 32/32): 40 SENDs each way, a gathered WRITE and a scattered READ place "
      "every byte; 33 SGEs is EINVAL", long_sge_lists)
check("destroy QP, CQ, MR, PD", close_all)
ctx.close()
sys.exit(1 if failures else 0)
