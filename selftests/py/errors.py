#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""RC error paths and data integrity between two metaroce devices, through the stock pyverbs.

Two processes, one per namespace: `--role server` (the responder side, in ns2 on mroce2) and
`--role client` (the requester side, in ns1 on mroce1, which runs the checks). They talk over a
plain TCP socket, one JSON object per line: the client asks, the server does (create a QP and
an MR, connect it, post receives, poll, read or fill its MR, destroy) and answers. Every wait
has a timeout. The client prints 'ok - ...' / 'not ok - ...' lines (tests/errors.sh turns them
into TAP).
"""
import argparse
import errno
import ctypes
import json
import mmap
import os
import socket
import struct
import sys
import time
import traceback

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.wr import RecvWR, SendWR, SGE

GID_INDEX = 1  # the IPv4 RoCEv2 GID
MR_SIZE = 256 * 1024
ALL_REMOTE = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
              | e.IBV_ACCESS_REMOTE_ATOMIC)
INLINE = 128  # max_inline_data every test QP asks for
RNR_TIMER_SMALL = 1  # 0.01 ms
RNR_TIMER_DEFAULT = 12  # 0.64 ms

WC_STATUS = {getattr(e, n): n for n in dir(e) if n.startswith("IBV_WC_") and n.endswith("_ERR")}
WC_STATUS[e.IBV_WC_SUCCESS] = "IBV_WC_SUCCESS"
QP_STATE = {getattr(e, n): n for n in dir(e) if n.startswith("IBV_QPS_")}


def status_name(s):
    return WC_STATUS.get(s, str(s))


# ---------------------------------------------------------------------------------------------
# Verbs plumbing shared by both roles


class Side:
    """One device: context, PD, and the QPs made on it, by name."""

    def __init__(self, dev):
        self.ctx = Context(name=dev)
        self.pd = PD(self.ctx)
        # A second protection domain: its MRs are no keys for QPs of the first.
        self.other_pd = PD(self.ctx)
        self.gid = str(self.ctx.query_gid(1, GID_INDEX))
        self.eps = {}

    def create(self, name, size=MR_SIZE, access=ALL_REMOTE, mr_other_pd=False,
               qp_access=None, uc=False):
        ep = Endpoint(self, size, access, mr_other_pd, qp_access, uc)
        old = self.eps.pop(name, None)
        if old:
            old.close()
        self.eps[name] = ep
        return ep


class Endpoint:
    """An RC (or UC) QP with its own send and receive CQs and one MR."""

    def __init__(self, side, size, access, mr_other_pd=False, qp_access=None, uc=False):
        self.side = side
        self.uc = uc
        self.scq = CQ(side.ctx, 64)
        self.rcq = CQ(side.ctx, 64)
        cap = QPCap(max_send_wr=32, max_recv_wr=32, max_send_sge=1, max_recv_sge=1,
                    max_inline_data=INLINE)
        init = QPInitAttr(qp_type=e.IBV_QPT_UC if uc else e.IBV_QPT_RC, scq=self.scq,
                          rcq=self.rcq, cap=cap)
        self.qp = QP(side.pd, init)
        self.mr = MR(side.other_pd if mr_other_pd else side.pd, size, access)
        self.size = size
        # Buffers an MR was moved to (rereg): they live as long as the endpoint.
        self.keep = []
        self.qp_access = (e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
                          | e.IBV_ACCESS_REMOTE_ATOMIC) if qp_access is None else qp_access
        self.to_init()

    def to_init(self):
        self.psn = int.from_bytes(os.urandom(3), "little")
        attr = QPAttr(qp_state=e.IBV_QPS_INIT)
        attr.pkey_index = 0
        attr.port_num = 1
        attr.qp_access_flags = self.qp_access
        self.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                       | e.IBV_QP_ACCESS_FLAGS)

    def reset(self):
        """Through RESET back to INIT, with a new PSN (connect again after it)."""
        self.qp.modify(QPAttr(qp_state=e.IBV_QPS_RESET), e.IBV_QP_STATE)
        self.to_init()

    def info(self):
        return {"qpn": self.qp.qp_num, "psn": self.psn, "rkey": self.mr.rkey,
                "addr": self.mr.buf, "size": self.size, "gid": self.side.gid}

    def connect(self, remote, min_rnr_timer=RNR_TIMER_DEFAULT, timeout=14, retry_cnt=7,
                rnr_retry=7, dest_qpn=None):
        gr = GlobalRoute(dgid=GID(remote["gid"]), sgid_index=GID_INDEX, hop_limit=64)
        ah = AHAttr(gr=gr, is_global=1, port_num=1)
        attr = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
        attr.dest_qp_num = remote["qpn"] if dest_qpn is None else dest_qpn
        attr.rq_psn = remote["psn"]
        attr.max_dest_rd_atomic = 4
        attr.min_rnr_timer = min_rnr_timer
        attr.ah_attr = ah
        mask = (e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                | e.IBV_QP_RQ_PSN)
        if self.uc:
            # UC takes no RNR timer, reads, timeouts or retry counts.
            self.qp.modify(attr, mask)
            attr = QPAttr(qp_state=e.IBV_QPS_RTS)
            attr.sq_psn = self.psn
            self.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_SQ_PSN)
            return
        self.qp.modify(attr, mask | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
        attr = QPAttr(qp_state=e.IBV_QPS_RTS)
        attr.timeout = timeout
        attr.retry_cnt = retry_cnt
        attr.rnr_retry = rnr_retry
        attr.sq_psn = self.psn
        attr.max_rd_atomic = 4
        self.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT
                       | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)

    def state(self):
        attr, _ = self.qp.query(e.IBV_QP_STATE)
        return attr.qp_state

    def post_recv(self, wr_id, length, offset=0):
        self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1,
                                 sg=[SGE(self.mr.buf + offset, length, self.mr.lkey)]))

    def close(self):
        for o in (self.qp, self.mr, self.scq, self.rcq):
            o.close()


def poll(cq, n, timeout):
    """Up to n completions within timeout seconds (fewer if the time runs out)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        k, wcs = cq.poll(num_entries=n - len(got))
        got += wcs[:k]
        if len(got) >= n:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.0005 if k else 0.002)
    return got


def wc_dict(wc):
    return {"wr_id": wc.wr_id, "status": wc.status, "opcode": wc.opcode,
            "byte_len": wc.byte_len, "imm_data": wc.imm_data, "wc_flags": wc.wc_flags,
            "qp_num": wc.qp_num}


# ---------------------------------------------------------------------------------------------
# Server: does what the client asks, one JSON request per line.


def serve(args):
    side = Side(args.dev)
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("0.0.0.0", args.port))
    lsock.listen(1)
    lsock.settimeout(60)
    conn, _ = lsock.accept()
    conn.settimeout(300)
    rfile = conn.makefile("r")
    wfile = conn.makefile("w")
    print(f"server: client connected, gid {side.gid}", flush=True)
    op = None
    while True:
        line = rfile.readline()
        if not line:
            break
        req = json.loads(line)
        op = req.pop("op")
        after = None
        try:
            if op == "quit":
                wfile.write(json.dumps({"ok": True}) + "\n")
                wfile.flush()
                print("server: done", flush=True)
                break
            res, after = handle(side, op, req)
            res["ok"] = True
        except Exception as ex:  # noqa: BLE001 - report anything to the client
            res = {"ok": False, "error": f"{type(ex).__name__}: {ex}",
                   "trace": traceback.format_exc()}
            print(f"server: {op} failed: {res['trace']}", flush=True)
        wfile.write(json.dumps(res) + "\n")
        wfile.flush()
        if after:
            after()
    if op != "quit":
        print("server: the client went away before 'quit'", flush=True)
    for ep in side.eps.values():
        ep.close()


def handle(side, op, req):
    """Returns (answer, something to do after answering or None)."""
    if op == "create":
        ep = side.create(req["name"], req.get("size", MR_SIZE), req.get("access", ALL_REMOTE),
                         req.get("mr_other_pd", False), req.get("qp_access"),
                         req.get("uc", False))
        return ep.info(), None
    ep = side.eps[req["name"]]
    if op == "connect":
        ep.connect(req["remote"], **req.get("attrs", {}))
        return {}, None
    if op == "post_recv":
        ep.post_recv(req["wr_id"], req["length"], req.get("offset", 0))
        return {}, None
    if op == "post_recv_later":
        # Answer first, then wait and post: the client's SEND meanwhile meets an empty RQ.
        def later():
            time.sleep(req["delay"])
            ep.post_recv(req["wr_id"], req["length"], req.get("offset", 0))
            print(f"server: posted the late receive on qp {ep.qp.qp_num}", flush=True)
        return {}, later
    if op == "poll_recv":
        wcs = poll(ep.rcq, req.get("n", 1), req.get("timeout", 10))
        return {"wcs": [wc_dict(wc) for wc in wcs]}, None
    if op == "read":
        return {"data": ep.mr.read(req["length"], req["offset"]).hex()}, None
    if op == "fill":
        data = bytes.fromhex(req["data"])
        ep.mr.write(data, len(data), req["offset"])
        return {}, None
    if op == "state":
        return {"state": ep.state()}, None
    if op == "reset":
        ep.reset()
        return ep.info(), None
    if op == "rereg":
        # ibv_rereg_mr of the endpoint's MR: new rights (access), a new buffer of that many
        # bytes (size), the side's other PD (other_pd); the MR's keys and address after it.
        flags, access, pd = 0, 0, ep.side.pd
        if "access" in req:
            flags |= e.IBV_REREG_MR_CHANGE_ACCESS
            access = req["access"]
        addr, length = 0, 0
        if "size" in req:
            flags |= e.IBV_REREG_MR_CHANGE_TRANSLATION
            buf = mmap.mmap(-1, req["size"])
            ep.keep.append(buf)
            addr, length = ctypes.addressof(ctypes.c_char.from_buffer(buf)), req["size"]
        if req.get("other_pd"):
            flags |= e.IBV_REREG_MR_CHANGE_PD
            pd = ep.side.other_pd
        ep.mr.rereg(flags, pd, addr, length, access)
        return {"lkey": ep.mr.lkey, "rkey": ep.mr.rkey, "addr": ep.mr.buf}, None
    if op == "destroy":
        side.eps.pop(req["name"]).close()
        return {}, None
    raise ValueError(f"unknown op {op}")


# ---------------------------------------------------------------------------------------------
# Client: the checks.


class Peer:
    def __init__(self, host, port):
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        self.sock.settimeout(60)
        self.rfile = self.sock.makefile("r")
        self.wfile = self.sock.makefile("w")

    def __call__(self, op, **kw):
        kw["op"] = op
        self.wfile.write(json.dumps(kw) + "\n")
        self.wfile.flush()
        line = self.rfile.readline()
        if not line:
            raise ConnectionError("server went away")
        res = json.loads(line)
        if not res.pop("ok"):
            raise RuntimeError(f"server: {op}: {res['error']}\n{res.get('trace', '')}")
        return res


failures = 0


def check(what, fn):
    global failures
    t0 = time.monotonic()
    try:
        notes = fn() or []
    except Exception:  # noqa: BLE001 - report anything
        lines = traceback.format_exc().splitlines()
        failures += 1
        print(f"not ok - {what}")
        for line in lines[-12:]:
            print(f"# {line}")
        print(f"# ({time.monotonic() - t0:.2f} s)", flush=True)
        return
    print(f"ok - {what}")
    for n in notes:
        print(f"# {n}")
    sys.stdout.flush()


class Client:
    def __init__(self, args):
        self.side = Side(args.dev)
        self.peer = Peer(args.server, args.port)
        self.n = 0

    def pair(self, name, server_access=ALL_REMOTE, server_attrs=None, point_at=None,
             server_create=None, uc=False, **client_attrs):
        """A connected QP pair (RC, or UC with uc): our endpoint and the server's info (qpn,
        rkey, addr, size). point_at overrides where our QP sends to (qpn, gid); server_create
        adds arguments to the server's endpoint (mr_other_pd, qp_access)."""
        ep = self.side.create(name, uc=uc)
        if uc:
            server_create = dict(server_create or {}, uc=True)
        remote = self.peer("create", name=name, access=server_access, **(server_create or {}))
        self.peer("connect", name=name, remote=ep.info(), attrs=server_attrs or {})
        ep.connect(dict(remote, **(point_at or {})), **client_attrs)
        return ep, remote

    def drop(self, name, remote_too=True):
        self.side.eps.pop(name).close()
        if remote_too:
            self.peer("destroy", name=name)

    def post(self, ep, opcode, length, rkey=None, addr=None, offset=0, imm=0,
             compare_add=0, swap=0, inline=False):
        self.n += 1
        wr = SendWR(wr_id=self.n, opcode=opcode, num_sge=1, imm_data=imm,
                    sg=[SGE(ep.mr.buf + offset, length, ep.mr.lkey)])
        wr.send_flags = e.IBV_SEND_SIGNALED | (e.IBV_SEND_INLINE if inline else 0)
        if opcode in (e.IBV_WR_ATOMIC_CMP_AND_SWP, e.IBV_WR_ATOMIC_FETCH_AND_ADD):
            wr.set_wr_atomic(rkey, addr, compare_add, swap)
        elif rkey is not None:
            wr.set_wr_rdma(rkey, addr)
        ep.qp.post_send(wr)
        return self.n

    def expect(self, ep, wr_id, status, timeout=10):
        """The next send completion is wr_id's, with this status."""
        t0 = time.monotonic()
        wcs = poll(ep.scq, 1, timeout)
        took = time.monotonic() - t0
        assert wcs, f"no send completion within {timeout} s (wanted {status_name(status)})"
        wc = wcs[0]
        assert wc.wr_id == wr_id, f"completion for wr_id {wc.wr_id}, wanted {wr_id}"
        assert wc.status == status, \
            f"wr {wr_id}: status {status_name(wc.status)} ({wc.status}), " \
            f"vendor_err {wc.vendor_err}, wanted {status_name(status)}"
        return wc, took

    def expect_error_state(self, ep):
        """The QP is in the error state, and work posted now flushes."""
        st = ep.state()
        if st != e.IBV_QPS_ERR:
            time.sleep(1)
            st2 = ep.state()
            raise AssertionError(f"query_qp: {QP_STATE.get(st, st)} after the error completion "
                                 f"({QP_STATE.get(st2, st2)} a second later), wanted ERR")
        wr = self.post(ep, e.IBV_WR_SEND, 8)
        self.expect(ep, wr, e.IBV_WC_WR_FLUSH_ERR, timeout=5)

    # -- 1-3: remote access errors ------------------------------------------------------------

    def access_error(self, name, opcode, rkey_of, addr_of, length=64, server_access=ALL_REMOTE,
                     server_create=None):
        """opcode with a bad rkey/address/right completes with REM_ACCESS_ERR, the WR queued
        behind it flushes, the QP is in ERR, and later work flushes."""
        def run():
            ep, remote = self.pair(name, server_access=server_access, server_create=server_create)
            c0 = counters("mroce1")
            try:
                ep.mr.write(os.urandom(64), 64)
                if server_access & e.IBV_ACCESS_REMOTE_WRITE and not server_create:
                    # A good WRITE first: the pair works, so the error is the access's.
                    wr = self.post(ep, e.IBV_WR_RDMA_WRITE, 64, remote["rkey"], remote["addr"])
                    self.expect(ep, wr, e.IBV_WC_SUCCESS)
                bad = self.post(ep, opcode, length, rkey_of(remote), addr_of(remote))
                behind = self.post(ep, e.IBV_WR_SEND, 8)
                wc, took = self.expect(ep, bad, e.IBV_WC_REM_ACCESS_ERR)
                self.expect(ep, behind, e.IBV_WC_WR_FLUSH_ERR, timeout=5)
                self.expect_error_state(ep)
                return [f"REM_ACCESS_ERR after {took * 1000:.1f} ms; "
                        f"responder QP: {QP_STATE.get(self.peer('state', name=name)['state'])}; "
                        f"mroce1 counters: {delta(c0, counters('mroce1'))}"]
            finally:
                self.drop(name)
        return run

    def uc(self):
        """A UC pair: the responder drops what fails and goes on, the requester never hears
        of it. A WRITE with a stale rkey and a WRITE_WITH_IMM with one complete successfully
        at the requester; the second completes the responder's receive with REM_ACCESS_ERR;
        a SEND after them lands byte-exact in the next receive; both QPs stay in RTS; an RDMA
        READ, which UC does not have, is refused at post (EINVAL)."""
        name = "uc"
        ep, remote = self.pair(name, uc=True)
        try:
            payload = os.urandom(64)
            ep.mr.write(payload, 64)
            self.peer("fill", name=name, data=bytes(128).hex(), offset=0)
            self.peer("post_recv", name=name, wr_id=1, length=64, offset=64)
            self.peer("post_recv", name=name, wr_id=2, length=64, offset=64)
            stale = remote["rkey"] ^ 0x80
            for opcode in (e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_WRITE_WITH_IMM):
                wr = self.post(ep, opcode, 64, stale, remote["addr"], imm=7)
                self.expect(ep, wr, e.IBV_WC_SUCCESS)
            wr = self.post(ep, e.IBV_WR_SEND, 64)
            self.expect(ep, wr, e.IBV_WC_SUCCESS)
            wcs = self.peer("poll_recv", name=name, n=2, timeout=10)["wcs"]
            got = [(w["wr_id"], status_name(w["status"])) for w in wcs]
            assert got == [(1, "IBV_WC_REM_ACCESS_ERR"), (2, "IBV_WC_SUCCESS")], got
            assert wcs[1]["byte_len"] == 64, wcs[1]
            data = bytes.fromhex(self.peer("read", name=name, length=128, offset=0)["data"])
            assert data[:64] == bytes(64), "the stale rkey's WRITE was placed"
            assert data[64:] == payload, f"SEND data differs at byte {first_diff(data[64:], payload)}"
            st = (QP_STATE.get(ep.state()), QP_STATE.get(self.peer("state", name=name)["state"]))
            assert st == ("IBV_QPS_RTS", "IBV_QPS_RTS"), st
            try:
                self.post(ep, e.IBV_WR_RDMA_READ, 8, remote["rkey"], remote["addr"])
                raise AssertionError("an RDMA READ was posted on a UC QP")
            except PyverbsRDMAError as ex:
                assert ex.error_code == errno.EINVAL, ex.error_code
        finally:
            self.drop(name)

    def rereg(self):
        """ibv_rereg_mr of the responder's MR, keys kept: new rights (a WRITE refused before
        is placed after), new memory (WRITEs land in the new buffer), another PD (a WRITE is
        refused: REM_ACCESS_ERR)."""
        name = "rereg"
        ep, remote = self.pair(name, server_access=e.IBV_ACCESS_LOCAL_WRITE
                               | e.IBV_ACCESS_REMOTE_READ)
        try:
            r = self.peer("rereg", name=name, access=ALL_REMOTE)
            assert (r["rkey"], r["addr"]) == (remote["rkey"], remote["addr"]), (r, remote)
            self.write_placed(ep, name, r, 4096, "after the new rights")
            moved = self.peer("rereg", name=name, size=2 * 4096)
            assert moved["rkey"] == remote["rkey"] and moved["addr"] != remote["addr"], \
                (moved, remote)
            self.write_placed(ep, name, moved, 2 * 4096, "in the new buffer")
            self.peer("rereg", name=name, other_pd=True)
            wr = self.post(ep, e.IBV_WR_RDMA_WRITE, 64, moved["rkey"], moved["addr"])
            self.expect(ep, wr, e.IBV_WC_REM_ACCESS_ERR)
        finally:
            self.drop(name)

    def write_placed(self, ep, name, remote, size, what):
        """An RDMA WRITE of size random bytes to the start of the server's MR (its rkey and
        address in remote) completes and lands byte-exact; returns the bytes."""
        data = os.urandom(size)
        ep.mr.write(data, size)
        wr = self.post(ep, e.IBV_WR_RDMA_WRITE, size, remote["rkey"], remote["addr"])
        self.expect(ep, wr, e.IBV_WC_SUCCESS)
        got = bytes.fromhex(self.peer("read", name=name, length=size, offset=0)["data"])
        assert got == data, f"{what}: {first_diff(got, data)}"
        return data

    def reset_and_reuse(self):
        """Both QPs of a pair that failed (REM_ACCESS_ERR) go through RESET, INIT, RTR and
        RTS again, with new PSNs: a receive posted before the reset is discarded (no
        completion), and the pair carries a WRITE and a SEND byte-exact."""
        name = "reuse"
        ep, remote = self.pair(name)
        try:
            bad = self.post(ep, e.IBV_WR_RDMA_WRITE, 64, remote["rkey"] ^ 0x00a5a500,
                            remote["addr"])
            self.expect(ep, bad, e.IBV_WC_REM_ACCESS_ERR)
            ep.reset()
            ep.post_recv(0xdead, 64)
            ep.reset()
            remote = self.peer("reset", name=name)
            self.peer("connect", name=name, remote=ep.info())
            ep.connect(remote)
            data = self.write_placed(ep, name, remote, 4096, "WRITE after the reset")
            self.peer("post_recv", name=name, wr_id=7, length=len(data), offset=8192)
            wr = self.post(ep, e.IBV_WR_SEND, len(data))
            self.expect(ep, wr, e.IBV_WC_SUCCESS)
            wcs = self.peer("poll_recv", name=name)["wcs"]
            assert [(w["wr_id"], w["status"]) for w in wcs] == [(7, e.IBV_WC_SUCCESS)], wcs
            got = bytes.fromhex(self.peer("read", name=name, length=len(data),
                                          offset=8192)["data"])
            assert got == data, f"SEND after the reset: {first_diff(got, data)}"
            stray = poll(ep.rcq, 1, 0.5)
            assert not stray, f"a receive posted before the reset completed: {wc_dict(stray[0])}"
        finally:
            self.drop(name)

    # -- 4: RNR -------------------------------------------------------------------------------

    def rnr_infinite(self):
        name = "rnr7"
        ep, remote = self.pair(name, server_attrs={"min_rnr_timer": 14}, rnr_retry=7)
        try:
            data = os.urandom(1000)
            ep.mr.write(data, len(data))
            c0 = counters("mroce1")
            self.peer("post_recv_later", name=name, wr_id=77, length=4096, delay=1.0)
            t0 = time.monotonic()
            wr = self.post(ep, e.IBV_WR_SEND, len(data))
            wc, took = self.expect(ep, wr, e.IBV_WC_SUCCESS, timeout=20)
            rw = self.peer("poll_recv", name=name, timeout=10)["wcs"]
            assert rw, "the receive did not complete"
            assert rw[0]["status"] == e.IBV_WC_SUCCESS, status_name(rw[0]["status"])
            assert rw[0]["byte_len"] == len(data), rw[0]
            got = bytes.fromhex(self.peer("read", name=name, offset=0, length=len(data))["data"])
            assert got == data, "the data that arrived differs from what was sent"
            assert took > 0.5, f"SEND completed after {took:.2f} s, before the receive was posted"
            return [f"SEND completed after {time.monotonic() - t0:.2f} s; "
                    f"mroce1 counters: {delta(c0, counters('mroce1'))}"]
        finally:
            self.drop(name)

    def rnr_exceeded(self):
        name = "rnr1"
        ep, remote = self.pair(name, server_attrs={"min_rnr_timer": RNR_TIMER_SMALL},
                               rnr_retry=1)
        c0 = counters("mroce1")
        try:
            wr = self.post(ep, e.IBV_WR_SEND, 100)
            behind = self.post(ep, e.IBV_WR_SEND, 100)
            wc, took = self.expect(ep, wr, e.IBV_WC_RNR_RETRY_EXC_ERR, timeout=20)
            self.expect(ep, behind, e.IBV_WC_WR_FLUSH_ERR, timeout=5)
            self.expect_error_state(ep)
            return [f"RNR_RETRY_EXC_ERR after {took * 1000:.1f} ms; "
                    f"mroce1 counters: {delta(c0, counters('mroce1'))}"]
        finally:
            self.drop(name)

    # -- 5: unreachable peer ------------------------------------------------------------------

    def unreachable(self, name, how, status, within):
        """A WRITE to a peer that is not there completes with status within `within` s, the
        24 WRs behind it flush in posting order, the QP is in ERR, later work flushes."""
        def run():
            point_at = {"noqp": {"qpn": 0xfff5a5},
                        "noaddr": {"gid": "0000:0000:0000:0000:0000:ffff:0a4d:0063"}}.get(how)
            if how == "noaddr":
                # 10.77.0.99 resolves (a permanent neighbour entry: RTR resolves the address
                # and fails with ETIMEDOUT otherwise) to a MAC nobody has: nothing answers.
                ip("neigh", "replace", "10.77.0.99", "lladdr", "02:00:00:00:00:99", "dev",
                   "veth1", "nud", "permanent")
            ep, remote = self.pair(name, retry_cnt=2, timeout=10, rnr_retry=7, point_at=point_at)
            c0 = counters("mroce1")
            try:
                if how in ("destroyed", "linkdown"):
                    # The pair works, then the remote QP or the link goes away.
                    wr = self.post(ep, e.IBV_WR_RDMA_WRITE, 64, remote["rkey"], remote["addr"])
                    self.expect(ep, wr, e.IBV_WC_SUCCESS)
                    if how == "destroyed":
                        self.peer("destroy", name=name)
                    else:
                        ip("-n", "ns2", "link", "set", "veth2", "down")
                t0 = time.monotonic()
                wr = self.post(ep, e.IBV_WR_RDMA_WRITE, 64, remote["rkey"], remote["addr"])
                # More behind it than the transport takes from the ring at once (a stream
                # holds 16 WQEs): those still in the ring flush after the ones it held, all in
                # posting order.
                behind = [self.post(ep, e.IBV_WR_SEND, 8) for _ in range(24)]
                self.expect(ep, wr, status, timeout=max(10, 2 * within))
                took = time.monotonic() - t0
                assert took < within, f"{status_name(status)} took {took:.2f} s"
                if status == e.IBV_WC_RETRY_EXC_ERR:
                    # The first attempt and retry_cnt=2 retries, each waiting the local ACK
                    # timeout 4.096 us * 2^10 at least.
                    least = 3 * 4.096e-6 * 2 ** 10
                    assert took >= least, \
                        f"RETRY_EXC_ERR after {took * 1000:.1f} ms, before 3 timeouts " \
                        f"({least * 1000:.1f} ms)"
                for b in behind:
                    self.expect(ep, b, e.IBV_WC_WR_FLUSH_ERR, timeout=5)
                self.expect_error_state(ep)
                return [f"{status_name(status)} after {took:.3f} s, the 24 behind it flushed "
                        f"in order; mroce1 counters: "
                        + delta(c0, counters("mroce1"))]
            finally:
                if how == "noaddr":
                    ip("neigh", "del", "10.77.0.99", "dev", "veth1")
                if how == "linkdown":
                    ip("-n", "ns2", "link", "set", "veth2", "up")
                    wait_link()
                self.drop(name, remote_too=how != "destroyed")
        return run

    # -- 6: data integrity --------------------------------------------------------------------

    def integrity(self, what, size, inline=False):
        def run():
            ep, remote = self.data
            payload = os.urandom(size)
            loff, roff = 5, 11  # odd offsets on both sides
            if what == "write":
                ep.mr.write(payload, size, loff)
                wr = self.post(ep, e.IBV_WR_RDMA_WRITE, size, remote["rkey"],
                               remote["addr"] + roff, offset=loff, inline=inline)
                if inline:
                    # The payload was taken at post time: changing the buffer now is harmless.
                    ep.mr.write(bytes(size), size, loff)
                self.expect(ep, wr, e.IBV_WC_SUCCESS, timeout=30)
                got = self.remote_read(roff, size)
            elif what == "read":
                self.peer("fill", name="data", offset=roff, data=payload.hex())
                ep.mr.write(bytes(size), size, loff)
                wr = self.post(ep, e.IBV_WR_RDMA_READ, size, remote["rkey"],
                               remote["addr"] + roff, offset=loff)
                wc, _ = self.expect(ep, wr, e.IBV_WC_SUCCESS, timeout=30)
                assert wc.opcode == e.IBV_WC_RDMA_READ, f"opcode {wc.opcode}"
                got = ep.mr.read(size, loff)
            elif what in ("send_imm", "write_imm"):
                imm = int.from_bytes(os.urandom(4), "little")
                self.peer("post_recv", name="data", wr_id=500 + size, length=MR_SIZE - roff,
                          offset=roff)
                ep.mr.write(payload, size, loff)
                if what == "send_imm":
                    wr = self.post(ep, e.IBV_WR_SEND_WITH_IMM, size, offset=loff, imm=imm,
                                   inline=inline)
                else:
                    # The data goes to another place than the receive buffer, to tell them apart.
                    wr = self.post(ep, e.IBV_WR_RDMA_WRITE_WITH_IMM, size, remote["rkey"],
                                   remote["addr"] + roff + 7, offset=loff, imm=imm,
                                   inline=inline)
                if inline:
                    ep.mr.write(bytes(size), size, loff)
                self.expect(ep, wr, e.IBV_WC_SUCCESS, timeout=30)
                rw = self.peer("poll_recv", name="data", timeout=10)["wcs"]
                assert rw, "no receive completion"
                r = rw[0]
                assert r["status"] == e.IBV_WC_SUCCESS, status_name(r["status"])
                assert r["wr_id"] == 500 + size, r
                want_op = e.IBV_WC_RECV if what == "send_imm" else e.IBV_WC_RECV_RDMA_WITH_IMM
                assert r["opcode"] == want_op, f"receive opcode {r['opcode']}, wanted {want_op}"
                assert r["wc_flags"] & e.IBV_WC_WITH_IMM, f"wc_flags {r['wc_flags']:#x}"
                assert r["imm_data"] == imm, f"imm {r['imm_data']:#x}, sent {imm:#x}"
                assert r["byte_len"] == size, f"byte_len {r['byte_len']}, sent {size}"
                got = self.remote_read(roff + (0 if what == "send_imm" else 7), size)
            assert len(got) == size and got == payload, first_diff(got, payload)
        return run

    def inline_burst(self):
        """More inline WRITEs posted at once than the driver keeps payloads for: all complete,
        each lands byte-exact."""
        ep, remote = self.data
        n, size = 30, 100
        payloads = [os.urandom(size) for _ in range(n)]
        first = self.n + 1
        for i, p in enumerate(payloads):
            ep.mr.write(p, size, 0)
            self.post(ep, e.IBV_WR_RDMA_WRITE, size, remote["rkey"], remote["addr"] + i * size,
                      inline=True)
        ep.mr.write(bytes(size), size, 0)
        wcs = poll(ep.scq, n, 30)
        assert len(wcs) == n, f"{len(wcs)} of {n} completions"
        for k, wc in enumerate(wcs):
            assert wc.status == e.IBV_WC_SUCCESS and wc.wr_id == first + k, wc_dict(wc)
        got = self.remote_read(0, n * size)
        assert got == b"".join(payloads), first_diff(got, b"".join(payloads))

    def inline_too_long(self):
        """An inline payload beyond the QP's max_inline_data is refused at post time."""
        ep, remote = self.data
        attr, init = ep.qp.query(e.IBV_QP_CAP)
        cap = init.cap.max_inline_data
        assert cap >= INLINE, f"max_inline_data {cap}, asked for {INLINE}"
        try:
            self.post(ep, e.IBV_WR_RDMA_WRITE, cap + 1, remote["rkey"], remote["addr"],
                      inline=True)
        except PyverbsRDMAError:
            return
        raise AssertionError(f"a {cap + 1}-byte inline post was accepted")

    def remote_read(self, offset, length):
        return bytes.fromhex(self.peer("read", name="data", offset=offset, length=length)["data"])

    def atomics(self):
        ep, remote = self.data
        off = 4096  # 8-byte aligned
        v0, v1, add = (int.from_bytes(os.urandom(8), "little") for _ in range(3))
        self.peer("fill", name="data", offset=off, data=struct.pack("<Q", v0).hex())
        target = remote["addr"] + off
        rd = lambda: struct.unpack("<Q", self.remote_read(off, 8))[0]  # noqa: E731
        old = lambda: struct.unpack("<Q", ep.mr.read(8, 64))[0]  # noqa: E731
        # CMP_SWP that matches: swaps.
        ep.mr.write(bytes(8), 8, 64)
        wr = self.post(ep, e.IBV_WR_ATOMIC_CMP_AND_SWP, 8, remote["rkey"], target, offset=64,
                       compare_add=v0, swap=v1)
        wc, _ = self.expect(ep, wr, e.IBV_WC_SUCCESS)
        assert wc.opcode == e.IBV_WC_COMP_SWAP, f"opcode {wc.opcode}"
        assert old() == v0, f"CMP_SWP returned {old():#x}, target held {v0:#x}"
        assert rd() == v1, f"target {rd():#x} after CMP_SWP, wanted {v1:#x}"
        # CMP_SWP that does not match: returns the value, leaves it.
        wr = self.post(ep, e.IBV_WR_ATOMIC_CMP_AND_SWP, 8, remote["rkey"], target, offset=64,
                       compare_add=v0 ^ 1, swap=v0)
        self.expect(ep, wr, e.IBV_WC_SUCCESS)
        assert old() == v1, f"failed CMP_SWP returned {old():#x}, target held {v1:#x}"
        assert rd() == v1, f"target {rd():#x} after a failed CMP_SWP, wanted {v1:#x}"
        return []

    def fetch_add(self):
        ep, remote = self.data
        off = 4096 + 64
        v0, add = (int.from_bytes(os.urandom(8), "little") for _ in range(2))
        self.peer("fill", name="data", offset=off, data=struct.pack("<Q", v0).hex())
        ep.mr.write(bytes(8), 8, 128)
        wr = self.post(ep, e.IBV_WR_ATOMIC_FETCH_AND_ADD, 8, remote["rkey"],
                       remote["addr"] + off, offset=128, compare_add=add)
        wc, _ = self.expect(ep, wr, e.IBV_WC_SUCCESS)
        assert wc.opcode == e.IBV_WC_FETCH_ADD, f"opcode {wc.opcode}"
        got_old = struct.unpack("<Q", ep.mr.read(8, 128))[0]
        got_new = struct.unpack("<Q", self.remote_read(off, 8))[0]
        want = (v0 + add) & (2 ** 64 - 1)
        assert got_old == v0, f"FETCH_ADD returned {got_old:#x}, target held {v0:#x}"
        assert got_new == want, f"target {got_new:#x} after FETCH_ADD, wanted {want:#x}"

    def idle(self, when):
        """Diagnostics: packets sent and received while no QP has work, for 2 s."""
        a0, b0 = counters("mroce1"), counters("mroce2")
        time.sleep(2)
        a1, b1 = counters("mroce1"), counters("mroce2")
        d = lambda c0, c1, k: c1.get(k, 0) - c0.get(k, 0)  # noqa: E731
        print(f"# idle 2 s {when}: mroce1 tx +{d(a0, a1, 'tx_packets')} rx "
              f"+{d(a0, a1, 'rx_packets')}, mroce2 tx +{d(b0, b1, 'tx_packets')} rx "
              f"+{d(b0, b1, 'rx_packets')}", flush=True)

    def quiet_after_dead_peer(self):
        time.sleep(2)
        a0, b0 = counters("mroce1"), counters("mroce2")
        time.sleep(2)
        a1, b1 = counters("mroce1"), counters("mroce2")
        tx = a1["tx_packets"] - a0["tx_packets"]
        txb = a1["tx_bytes"] - a0["tx_bytes"]
        rx2 = b1["rx_packets"] - b0["rx_packets"]
        assert tx == 0, f"mroce1 sent {tx} packets ({txb} bytes) in 2 s, mroce2 received {rx2} " \
            "of them: the rest went to the dead 10.77.0.99"

    def counter_check(self, c0, c1, wants):
        """wants: (device, counter, at least) -- the counters moved at least that much."""
        def run():
            bad = []
            for dev, name, least in wants:
                if name not in c1[dev]:
                    bad.append(f"{dev} has no counter {name}")
                    continue
                d = c1[dev][name] - c0[dev].get(name, 0)
                if d < least:
                    bad.append(f"{dev} {name} +{d}, wanted at least +{least}")
            assert not bad, "; ".join(bad)
        return run

    def run(self):
        snap = lambda: {d: counters(d) for d in ("mroce1", "mroce2")}  # noqa: E731
        c_start = snap()
        bad_rkey = lambda r: r["rkey"] ^ 0x00a5a500  # noqa: E731
        base = lambda r: r["addr"]  # noqa: E731
        check("bad rkey: RDMA WRITE -> REM_ACCESS_ERR, QP in ERR, later WRs flush",
              self.access_error("badw", e.IBV_WR_RDMA_WRITE, bad_rkey, base))
        check("bad rkey: RDMA READ -> REM_ACCESS_ERR, QP in ERR, later WRs flush",
              self.access_error("badr", e.IBV_WR_RDMA_READ, bad_rkey, base))
        check("out of bounds: RDMA WRITE past the end of the remote MR -> REM_ACCESS_ERR",
              self.access_error("oob", e.IBV_WR_RDMA_WRITE, lambda r: r["rkey"],
                                lambda r: r["addr"] + r["size"] - 32, length=64))
        check("out of bounds: RDMA READ before the start of the remote MR -> REM_ACCESS_ERR",
              self.access_error("oobr", e.IBV_WR_RDMA_READ, lambda r: r["rkey"],
                                lambda r: r["addr"] - 64, length=64))
        check("access rights: RDMA WRITE to an MR without REMOTE_WRITE -> REM_ACCESS_ERR",
              self.access_error("ro", e.IBV_WR_RDMA_WRITE, lambda r: r["rkey"], base,
                                server_access=e.IBV_ACCESS_LOCAL_WRITE
                                | e.IBV_ACCESS_REMOTE_READ))
        check("protection domains: RDMA WRITE with the rkey of an MR in another PD of the"
              " responder -> REM_ACCESS_ERR",
              self.access_error("otherpd", e.IBV_WR_RDMA_WRITE, lambda r: r["rkey"], base,
                                server_create={"mr_other_pd": True}))
        check("QP access flags: RDMA READ from a QP whose qp_access_flags lack REMOTE_READ"
              " (its MR allows it) -> REM_ACCESS_ERR",
              self.access_error("qpflags", e.IBV_WR_RDMA_READ, lambda r: r["rkey"], base,
                                server_create={"qp_access": e.IBV_ACCESS_REMOTE_WRITE}))
        c_access = snap()
        check("RNR, rnr_retry=7: SEND waits for a receive posted 1 s later, data byte-exact",
              self.rnr_infinite)
        check("RNR, rnr_retry=1, no receive: SEND -> RNR_RETRY_EXC_ERR, QP in ERR, flushes",
              self.rnr_exceeded)
        c_rnr = snap()
        self.idle("before the unreachable-peer checks")
        check("unreachable: peer address does not answer (10.77.0.99), retry_cnt=2 timeout=10"
              " -> RETRY_EXC_ERR within 5 s, 24 behind flush in order",
              self.unreachable("noaddr", "noaddr", e.IBV_WC_RETRY_EXC_ERR, 5))
        check("unreachable: peer link down (veth2), retry_cnt=2 timeout=10"
              " -> RETRY_EXC_ERR within 5 s, 24 behind flush in order",
              self.unreachable("down", "linkdown", e.IBV_WC_RETRY_EXC_ERR, 5))
        c_retry = snap()
        check("a dead peer gets no more packets once its QPs are destroyed (mroce1 sends"
              " nothing in the 2 s from 2 s after)", self.quiet_after_dead_peer)
        # MetaRoCE answers a request for a QP that is not open with NAK "remote operational
        # error" (docs/wire-format.md, "Unknown QP"), where IB/RoCE drop it silently and the
        # requester runs out of retries: fail fast with REM_OP_ERR.
        check("no such remote QPN (live peer) -> REM_OP_ERR at once (NAK, wire-format.md),"
              " 24 behind flush in order", self.unreachable("noqp", "noqp", e.IBV_WC_REM_OP_ERR, 2))
        check("remote QP destroyed (live peer) -> REM_OP_ERR at once (NAK, wire-format.md),"
              " 24 behind flush in order", self.unreachable("gone", "destroyed", e.IBV_WC_REM_OP_ERR, 2))
        c_remop = snap()
        self.data = self.pair("data")
        for what, label in (("write", "RDMA WRITE"), ("read", "RDMA READ"),
                            ("send_imm", "SEND_WITH_IMM (IBV_WC_WITH_IMM, imm)"),
                            ("write_imm", "WRITE_WITH_IMM (IBV_WC_RECV_RDMA_WITH_IMM, imm)")):
            for size in (1, 1000, 5000, 100 * 1024):
                check(f"data: {label}, {size} B byte-exact", self.integrity(what, size))
        for what, label in (("write", "RDMA WRITE"), ("send_imm", "SEND_WITH_IMM"),
                            ("write_imm", "WRITE_WITH_IMM")):
            for size in (1, INLINE):
                check(f"data: inline {label}, {size} B byte-exact (buffer cleared after post)",
                      self.integrity(what, size, inline=True))
        check("data: 30 inline WRITEs posted at once all complete, byte-exact",
              self.inline_burst)
        check("inline beyond max_inline_data: post_send fails", self.inline_too_long)
        check("data: CMP_SWP returns the old value, swaps only on a match", self.atomics)
        check("data: FETCH_ADD returns the old value, target holds the sum", self.fetch_add)
        self.drop("data")
        c_end = snap()
        # The counters the README documents for these events (diagnostics for operators).
        check("counters: the 7 remote access errors are counted (nak_sent_remote_access on the"
              " responder, nak_rcvd_remote_access on the requester)",
              self.counter_check(c_start, c_access, [("mroce2", "nak_sent_remote_access", 7),
                                                     ("mroce1", "nak_rcvd_remote_access", 7)]))
        check("counters: RNR is counted (nak_sent_rnr, nak_rcvd_rnr, rnr_retries)",
              self.counter_check(c_access, c_rnr, [("mroce2", "nak_sent_rnr", 2),
                                                   ("mroce1", "nak_rcvd_rnr", 2),
                                                   ("mroce1", "rnr_retries", 2)]))
        # (Path timeouts need not happen: toward an address that never answered HELLO the
        # connection sends nothing, and a QP may exhaust its retries before a path times out.)
        check("counters: retries exceeded are counted (retry_exceeded)",
              self.counter_check(c_rnr, c_retry, [("mroce1", "retry_exceeded", 2)]))
        check("counters: requests for no QP are counted (rx_no_connection, nak_sent_remote_op,"
              " nak_rcvd_remote_op)",
              self.counter_check(c_retry, c_remop, [("mroce2", "rx_no_connection", 2),
                                                    ("mroce2", "nak_sent_remote_op", 2),
                                                    ("mroce1", "nak_rcvd_remote_op", 2)]))
        check("counters: ACKs are counted (acks_sent on the responder, acks_rcvd on the"
              " requester)",
              self.counter_check(c_remop, c_end, [("mroce2", "acks_sent", 1),
                                                  ("mroce1", "acks_rcvd", 1)]))
        check("a failed QP pair reset and connected again (RESET, INIT, RTR, RTS, new PSNs):"
              " WRITE and SEND byte-exact, a receive posted before the reset discarded",
              self.reset_and_reuse)
        check("ibv_rereg_mr, keys kept: new rights (a refused WRITE is placed after), new"
              " memory (WRITEs land in the new buffer, byte-exact), another PD (REM_ACCESS_ERR)",
              self.rereg)
        check("UC: WRITE and WRITE_WITH_IMM with a stale rkey dropped by the responder (its"
              " receive REM_ACCESS_ERR), the requester succeeds, a SEND after them byte-exact,"
              " both QPs in RTS, RDMA READ refused at post", self.uc)
        self.peer("quit")
        print("# client: done", flush=True)


def first_diff(got, want):
    if len(got) != len(want):
        return f"{len(got)} bytes, wanted {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            bad = sum(1 for x, y in zip(got, want) if x != y)
            return f"{bad} bytes differ, the first at offset {i}: {a:#04x}, wanted {b:#04x}"
    return "equal"


def counters(dev):
    """The device's port-1 counters, {name: value} (empty if unreadable)."""
    import subprocess
    try:
        r = subprocess.run(["/usr/bin/rdma", "-j", "statistic", "show", "link", f"{dev}/1"],
                           capture_output=True, text=True, timeout=10)
        out = {}

        def walk(o):
            if isinstance(o, dict):
                for k, v in o.items():
                    if isinstance(v, int) and not isinstance(v, bool):
                        out[k] = v
                    else:
                        walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)
        walk(json.loads(r.stdout))
        out.pop("port", None)
        return out
    except Exception:  # noqa: BLE001 - diagnostics only
        return {}


def delta(c0, c1):
    d = {k: c1[k] - c0.get(k, 0) for k in c1 if c1[k] != c0.get(k, 0)
         and k not in ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "acks_sent",
                       "acks_rcvd")}
    return " ".join(f"{k}+{v}" for k, v in sorted(d.items())) or "no change"


def ip(*args):
    import subprocess
    subprocess.run(["/usr/sbin/ip", *args], check=True, timeout=10)


def wait_link():
    """veth2 back up and the control connection's path usable again."""
    import subprocess
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = subprocess.run(["/usr/sbin/ip", "-n", "ns2", "-br", "link", "show", "veth2"],
                           capture_output=True, text=True, timeout=10)
        if "UP" in r.stdout.split()[1:2]:
            return
        time.sleep(0.2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=("server", "client"), required=True)
    p.add_argument("--dev", required=True)
    p.add_argument("--server", default="10.77.0.2")
    p.add_argument("--port", type=int, default=18600)
    args = p.parse_args()
    if args.role == "server":
        serve(args)
        return 0
    Client(args).run()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
