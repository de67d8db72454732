#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""A hostile network for selftests/tests/netfuzz.sh: sends COUNT datagrams to a metaroce
device's UDP port (4793), mutations of real MetaRoCE packets (from a tcpdump capture) and of
packets built after docs/wire-format.md, and plain random datagrams of 0 to 9000 bytes.

It runs in the namespace of the device's peer, so an ordinary UDP socket sends with the peer's
source address (the device demultiplexes connections by source address and conn_id; the
captured packets carry the live connection's id, which an attacker off the path would have to
guess): mutated packets reach the real connection, its paths
(PSN windows, ACK and SACK processing) and its streams. A share of the datagrams goes from a
second address the device has no peer at (`--stranger`) and over IPv6 (`--dst6`).

Datagrams go out in batches of equal length, built as one buffer and mutated column by column
(slices and bytes.translate, little Python per datagram), with UDP GSO (UDP_SEGMENT) when they
fit one Ethernet frame: one sendmsg carries up to 64, which the receiving socket cuts apart
again, as it does the driver's own bursts. Natively that is some 400,000 a second; under TCG
about 6,500 a second per sender, the receiving kernel's work included (half the CPU).

QP numbers come from the capture (the warm-up's QPs, closed by then) and from guesses of the
driver's numbering (table index << 8 | generation), which hit a live QP now and then. A request
to a live QP with the connection's id, a PSN in the window and its right MSN, RSN and rkey is
taken as the peer's (an attacker on the path sees them all): the fuzzer does not aim at the
checked traffic's QPs.

Prints one line of statistics: `sent N in T s (R/s) ...`, with `base_bad`, the datagrams whose
base header the device must reject (short, version, opcode, flags, reserved byte: what it
counts in rx_malformed), computed as the device's `base_header_ok` does.
"""

import argparse
import os
import random
import socket
import struct
import sys
import time

PORT = 4793
SOL_UDP = 17
UDP_SEGMENT = 103
# A UDP payload that fits a 1500-byte frame over IPv4 (IPv6: 1452), and the most GSO segments.
GSO_MAX_V4 = 1472
GSO_MAX_V6 = 1452
GSO_SEGS = 64
GSO_BYTES = 60000

# Opcodes (docs/wire-format.md).
SEND, SEND_IMM, WRITE, WRITE_IMM, READ_REQ, READ_RESP, CMP_SWP, FETCH_ADD, ATOMIC_RESP = range(9)
ACK, NAK, PROBE, HELLO, DATAGRAM, DATAGRAM_IMM = 0x10, 0x11, 0x12, 0x13, 0x14, 0x15
OPCODES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15)
OPCODE_OK = bytes(1 if i in OPCODES else 0 for i in range(256))
# Flags.
ACK_REQ, SOLICITED, LAST, FIRST, RETRANSMIT = 1, 2, 4, 8, 16
GSI_QKEY = 0x80010000

BASE = struct.Struct(">BBHIIIHBBIII")
assert BASE.size == 32

I32 = (0, 1, 2, 3, 0x7F, 0x80, 0xFF, 0x100, 0xFFF, 0x1000, 0xFFFF, 0x10000, 0x7FFFFFFF,
       0x80000000, 0x80000001, 0xFFFFFFFE, 0xFFFFFFFF, 0xFFFF0000, 0x00FFFFFF, 0x01000000)
I16 = (0, 1, 2, 7, 8, 15, 16, 255, 256, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF)
I8 = (0, 1, 2, 4, 5, 6, 15, 16, 0x7F, 0x80, 0xFE, 0xFF)

# Where each opcode keeps its interesting fields: (offset, width) in bytes. The base header's
# first (dst_qp 4, src_qp 8, conn_id 12, path_id 16, plane 18, psn 20, msn 24, timestamp 28).
BASE_FIELDS = ((1, 1), (2, 2), (4, 4), (8, 4), (12, 4), (16, 2), (18, 1), (19, 1), (20, 4),
               (24, 4), (28, 4))
EXT_FIELDS = {
    SEND: ((32, 4), (36, 4), (40, 4), (44, 4)),
    SEND_IMM: ((32, 4), (36, 4), (40, 4), (44, 4), (48, 4)),
    WRITE: ((32, 8), (36, 4), (40, 4), (44, 4), (48, 4), (52, 4), (56, 4), (60, 4)),
    WRITE_IMM: ((32, 8), (40, 4), (44, 4), (48, 4), (52, 4), (56, 4), (60, 4), (64, 4)),
    READ_REQ: ((32, 8), (36, 4), (40, 4), (44, 4)),
    READ_RESP: ((32, 4), (36, 4), (40, 4), (44, 4)),
    CMP_SWP: ((32, 8), (36, 4), (40, 4), (44, 4), (48, 8), (56, 8)),
    FETCH_ADD: ((32, 8), (36, 4), (40, 4), (44, 4), (48, 8), (56, 8)),
    ATOMIC_RESP: ((32, 8), (36, 4)),
    ACK: ((32, 1), (33, 1), (34, 2), (36, 4), (40, 2), (42, 2),
          (44, 2), (46, 1), (47, 1), (48, 4), (52, 4), (56, 2), (58, 2), (60, 8), (68, 8),
          (76, 8), (84, 8), (92, 4), (96, 4)),
    NAK: ((32, 1), (33, 1), (36, 4)),
    PROBE: (),
    HELLO: ((32, 1), (33, 1), (34, 2), (36, 4), (40, 1), (41, 1), (42, 2), (44, 4), (48, 4)),
    DATAGRAM: ((32, 4), (36, 2), (38, 2), (40, 4), (44, 4)),
    DATAGRAM_IMM: ((32, 4), (36, 2), (38, 2), (40, 4), (44, 4)),
}


def packet_len(b, off=0):
    """The length of the MetaRoCE packet at b[off:] as its headers give it (None if they
    do not): splits what tcpdump captured of a GSO burst into its datagrams."""
    n = len(b) - off
    if n < 32 or b[off] != 1:
        return None
    op, flags = b[off + 1], b[off + 3]
    u32 = lambda o: struct.unpack_from(">I", b, off + o)[0] if off + o + 4 <= len(b) else None
    imm = 4 if flags & LAST else 0
    if op in (SEND, SEND_IMM):
        pl = u32(44)
        return None if pl is None else 48 + (imm if op == SEND_IMM else 0) + pl
    if op in (WRITE, WRITE_IMM):
        pl = u32(56)
        return None if pl is None else 64 + (imm if op == WRITE_IMM else 0) + pl
    if op == READ_REQ:
        return 48
    if op == READ_RESP:
        pl = u32(40)
        return None if pl is None else 48 + pl
    if op in (CMP_SWP, FETCH_ADD):
        return 64
    if op == ATOMIC_RESP:
        return 40
    if op == ACK:
        return None if n < 34 else 44 + 48 * b[off + 32] + 8 * b[off + 33]
    if op == NAK:
        return 40
    if op == PROBE:
        return 32
    if op == HELLO:
        return None if n < 34 else 40 + 20 * b[off + 33]
    if op in (DATAGRAM, DATAGRAM_IMM):
        pl = u32(40)
        return None if pl is None else 44 + (4 if op == DATAGRAM_IMM else 0) + pl
    return None


def read_pcap(path):
    """(IP source, UDP payload) of every UDP datagram to or from port 4793 in a pcap file
    (Ethernet or Linux cooked), each GSO burst cut into its packets."""
    out = []
    try:
        data = open(path, "rb").read()
    except OSError:
        return out
    if len(data) < 24:
        return out
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        end = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        end = ">"
    else:
        return out
    linktype = struct.unpack_from(end + "I", data, 20)[0]
    l2 = {1: 14, 113: 16}.get(linktype)
    if l2 is None:
        return out
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack_from(end + "I", data, off + 8)[0]
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        if len(frame) < l2 + 28:
            continue
        ethertype = struct.unpack_from(">H", frame, l2 - 2)[0]
        ip = frame[l2:]
        if ethertype == 0x0800 and ip[0] >> 4 == 4 and ip[9] == 17:
            ihl = (ip[0] & 15) * 4
            src = socket.inet_ntop(socket.AF_INET, ip[12:16])
            total = struct.unpack_from(">H", ip, 2)[0]
            frag = struct.unpack_from(">H", ip, 6)[0]
            if frag & 0x3FFF:
                continue  # fragments: not worth reassembling for templates
            udp = ip[ihl:total] if total else ip[ihl:]
        elif ethertype == 0x86DD and ip[0] >> 4 == 6 and ip[6] == 17:
            src = socket.inet_ntop(socket.AF_INET6, ip[8:24])
            udp = ip[40:]
        else:
            continue
        if len(udp) < 8:
            continue
        sport, dport = struct.unpack_from(">HH", udp, 0)
        if PORT not in (sport, dport):
            continue
        payload = udp[8:]
        p = 0
        while p < len(payload):
            n = packet_len(payload, p)
            if n is None or p + n > len(payload):
                break
            out.append((src, bytes(payload[p:p + n])))
            p += n
    return out


class Context:
    """Values of the real connection seen in the capture: QP numbers, MSNs, PSNs by path,
    keys and addresses; builders and mutations draw from them so that they hit real state."""

    def __init__(self, packets):
        self.qps, self.msns, self.rkeys, self.vas, self.rsns = set(), set(), set(), set(), set()
        self.psn = {}  # path id -> a PSN seen on it
        self.cum = {}  # path id -> a cumulative PSN seen in an ACK
        self.mads = []
        for b in packets:
            _, op, _, dq, sq, _, path, _, _, psn, msn, _ = BASE.unpack_from(b, 0)
            if op == ACK:
                pc, sc = b[32], b[33]
                for i in range(pc):
                    e = 44 + 48 * i
                    pid, cum = struct.unpack_from(">H", b, e)[0], struct.unpack_from(">I", b, e + 4)[0]
                    self.cum[pid] = cum
                for i in range(sc):
                    e = 44 + 48 * pc + 8 * i
                    q, m = struct.unpack_from(">II", b, e)
                    self.qps.add(q)
                    self.msns.add(m)
                continue
            if op in (DATAGRAM, DATAGRAM_IMM):
                self.mads.append(b[44 + (4 if op == DATAGRAM_IMM else 0):])
                continue
            if op in (HELLO,):
                continue
            self.qps.update((dq, sq))
            self.msns.add(msn)
            if op not in (NAK,):
                self.psn[path] = psn
            if op in (WRITE, WRITE_IMM, READ_REQ, CMP_SWP, FETCH_ADD) and len(b) >= 44:
                va, rkey = struct.unpack_from(">QI", b, 32)
                self.vas.add(va)
                self.rkeys.add(rkey)
            if op in (SEND, SEND_IMM):
                self.rsns.add(struct.unpack_from(">I", b, 32)[0])
        self.qps.discard(0)
        # Numbers a live QP may have: a table index (1..8) above a generation byte.
        self.qps.update((i << 8) | g for i in range(1, 5) for g in range(0, 256, 17))
        self.qps.update((0, 1, 0xFFFFFFFF, 0xFFFFFF00))
        self.qps, self.msns = sorted(self.qps), sorted(self.msns) or [0]
        self.rkeys = sorted(self.rkeys) or [0x100, 0x1FF]
        self.vas = sorted(self.vas) or [0x1000]
        self.rsns = sorted(self.rsns) or [0]
        for p in range(16):
            self.psn.setdefault(p, 0)
            self.cum.setdefault(p, self.psn[p])


def u32_near(r, values):
    """A value of `values`, moved a little, or an extreme."""
    c = r.random()
    if c < 0.6:
        return (r.choice(values) + r.randint(-4, 300)) & 0xFFFFFFFF
    if c < 0.85:
        return r.choice(I32)
    return r.getrandbits(32)


class Builder:
    """Packets built after docs/wire-format.md, valid or nearly (hostile values in valid
    places), with fields from the real connection."""

    def __init__(self, r, ctx):
        self.r, self.ctx = r, ctx

    def base(self, op, flags=None, path=None, psn=None, msn=None, dst_qp=None):
        r, c = self.r, self.ctx
        if path is None:
            path = r.randrange(16) if r.random() < 0.9 else r.choice(I16)
        if psn is None:
            psn = (c.psn.get(path, 0) + r.randint(-300, 600)) & 0xFFFFFFFF if r.random() < 0.8 else r.choice(I32)
        if msn is None:
            msn = u32_near(r, c.msns)
        if dst_qp is None:
            dst_qp = r.choice(c.qps)
        if flags is None:
            flags = r.getrandbits(5)
        conn = 0 if r.random() < 0.95 else r.choice(I32)
        return BASE.pack(1, op, flags, dst_qp, r.choice(c.qps), conn, path, 0, 0, psn, msn,
                         r.getrandbits(32))

    def payload(self, n):
        return os.urandom(n)

    def data_lengths(self):
        """(offset, total_len, payload_len) of a data packet: mostly consistent, some hostile."""
        r = self.r
        mtu = 1344
        c = r.random()
        if c < 0.5:
            total = r.choice((1, 2, 64, 1024, 1344, 4096, 65536, 1 << 20))
            seg = r.randrange(max(1, (total + mtu - 1) // mtu))
            off = seg * mtu
            pl = min(mtu, total - off)
            return off, total, pl, pl
        if c < 0.8:  # payload consistent with what follows, placement hostile
            pl = r.choice((0, 1, 8, 512, 1344))
            return r.choice(I32), r.choice(I32), pl, pl
        # the length field lies about what follows
        pl = r.choice((0, 1, 64, 1344))
        return r.choice(I32), r.choice(I32), r.choice(I32), pl

    def send(self):
        r, c = self.r, self.ctx
        op = r.choice((SEND, SEND_IMM))
        off, total, pl, real = self.data_lengths()
        flags = r.getrandbits(5)
        h = self.base(op, flags)
        ext = struct.pack(">IIII", u32_near(r, c.rsns), off, total, pl)
        if op == SEND_IMM and flags & LAST:
            ext += struct.pack(">I", r.getrandbits(32))
        return h + ext + self.payload(real)

    def write(self):
        r, c = self.r, self.ctx
        op = r.choice((WRITE, WRITE_IMM))
        off, total, pl, real = self.data_lengths()
        flags = r.getrandbits(5)
        va = r.choice(c.vas) + r.choice((0, off, r.getrandbits(16), -8, 1 << 40)) if r.random() < 0.8 else r.getrandbits(64)
        h = self.base(op, flags)
        ext = struct.pack(">QIIIIII", va & (2**64 - 1), u32_near(r, c.rkeys), u32_near(r, c.rsns),
                          off, total, pl, 0)
        if op == WRITE_IMM and flags & LAST:
            ext += struct.pack(">I", r.getrandbits(32))
        return h + ext + self.payload(real)

    def read_req(self):
        r, c = self.r, self.ctx
        return self.base(READ_REQ) + struct.pack(
            ">QII", (r.choice(c.vas) + r.randint(-64, 1 << 20)) & (2**64 - 1),
            u32_near(r, c.rkeys), r.choice((0, 1, 8, 4096, 1 << 20, 1 << 31, 0xFFFFFFFF)))

    def read_resp(self):
        off, total, pl, real = self.data_lengths()
        return self.base(READ_RESP) + struct.pack(">IIII", off, total, pl, 0) + self.payload(real)

    def atomic(self):
        r, c = self.r, self.ctx
        va = (r.choice(c.vas) + r.choice((0, 8, 1, 4, -8, 4096))) & (2**64 - 1)
        return self.base(r.choice((CMP_SWP, FETCH_ADD))) + struct.pack(
            ">QIIQQ", va, u32_near(r, c.rkeys), 0, r.getrandbits(64), r.getrandbits(64))

    def atomic_resp(self):
        return self.base(ATOMIC_RESP) + struct.pack(">Q", self.r.getrandbits(64))

    def ack(self):
        r, c = self.r, self.ctx
        pc = r.choice((0, 1, 1, 2, 4, 8, 16, 17)) if r.random() < 0.95 else r.randrange(256)
        sc = r.choice((0, 1, 1, 2, 4)) if r.random() < 0.95 else r.randrange(256)
        h = BASE.pack(1, ACK, 0, 0, 0, 0 if r.random() < 0.95 else r.getrandbits(32), 0, 0, 0,
                      0, 0, r.getrandbits(32))
        body = [struct.pack(">BBHIHH", pc, sc, 0, r.choice((0, 1, 10000, 0xFFFFFFFF, r.getrandbits(32))),
                            r.choice((0, 1, 65535, r.getrandbits(16))), 0)]
        for _ in range(pc):
            pid = r.randrange(16) if r.random() < 0.9 else r.choice(I16)
            cum = c.cum.get(pid, 0)
            cum = (cum + r.choice((0, 1, 2, 16, 255, 256, 257, 1000, -1, -256, 1 << 31))) & 0xFFFFFFFF
            k = r.random()
            if k < 0.3:
                sack = (0, 0, 0, 0)
            elif k < 0.5:
                sack = (2**64 - 1,) * 4
            else:
                sack = tuple(r.getrandbits(64) for _ in range(4))
            body.append(struct.pack(">HBBIIHHQQQQ", pid, 0, 0, cum, r.getrandbits(32),
                                    r.choice((0, 1, 0xFFFF)), 0, *sack))
        for _ in range(sc):
            body.append(struct.pack(">II", r.choice(c.qps), u32_near(r, c.msns)))
        return h + b"".join(body)

    def nak(self):
        r = self.r
        code = r.choice((1, 2, 3, 4, 5)) if r.random() < 0.9 else r.choice(I8)
        return self.base(NAK, flags=0, psn=0) + struct.pack(">BBBBI", code, 0, 0, 0,
                                                           r.choice((0, 1, 100, 0xFFFFFFFF)))

    def probe(self):
        return self.base(PROBE, flags=ACK_REQ)

    def hello(self):
        r = self.r
        n = r.choice((0, 1, 1, 2, 16)) if r.random() < 0.95 else r.choice(I8)
        h = BASE.pack(1, HELLO, 0, 0, 0, 0, 0, 0, 0, 0, 0, r.getrandbits(32))
        ext = struct.pack(">BBHI", r.choice((0, 1)), n, r.choice((0, 1, 8, 16, 256, 0xFFFF)),
                          r.choice((0, 1, r.getrandbits(32))))
        ents = []
        planes = sorted(r.sample(range(16), min(n, 16))) if r.random() < 0.8 else [r.choice(I8) for _ in range(n)]
        for p in planes:
            fam = 4 if r.random() < 0.8 else r.choice((6, 0, 5, 255))
            addr = bytes((10, 77, 0, r.choice((1, 2, 3, 99)))) + bytes(12) if fam == 4 else os.urandom(16)
            ents.append(struct.pack(">BBH", p & 0xFF, fam, r.choice((0, 1344, 4096, 1, 0xFFFF))) + addr)
        return h + ext + b"".join(ents[:n]) + (b"" if len(ents) >= n else os.urandom(20 * (n - len(ents))))

    def datagram(self):
        r, c = self.r, self.ctx
        op = r.choice((DATAGRAM, DATAGRAM_IMM))
        flags = FIRST | LAST | (SOLICITED if r.random() < 0.3 else 0)
        if r.random() < 0.1:
            flags = r.getrandbits(5)
        h = BASE.pack(1, op, flags, 1 if r.random() < 0.9 else r.choice(c.qps), r.choice((1, 1, 0, 7)),
                      0, 0, 0, 0, 0, 0, r.getrandbits(32))
        if c.mads and r.random() < 0.7:
            mad = bytearray(r.choice(c.mads))
            for _ in range(r.randrange(4)):
                if mad:
                    mad[r.randrange(len(mad))] ^= 1 << r.randrange(8)
        else:
            # A MAD header (base version 1, a class, version, method) then garbage.
            mad = bytearray(os.urandom(r.choice((0, 24, 256, 256, 1024))))
            if len(mad) >= 4:
                mad[0] = 1
                mad[1] = r.choice((0x07, 0x04, 0x01, 0x81, 0x03, 0x0A, 0x7F, 0x30))
                mad[2] = r.choice((1, 2, 3))
                mad[3] = r.choice((1, 2, 3, 5, 6, 7, 0x81, 0x13))
        qkey = GSI_QKEY if r.random() < 0.9 else r.getrandbits(32)
        ext = struct.pack(">IHHI", qkey, 0xFFFF if r.random() < 0.9 else r.getrandbits(16), 0, len(mad))
        if op == DATAGRAM_IMM:
            ext += struct.pack(">I", r.getrandbits(32))
        return h + ext + bytes(mad)

    def any(self):
        return self.r.choice(self.kinds)()

    @property
    def kinds(self):
        k = (self.send, self.send, self.write, self.write, self.read_req, self.read_resp,
             self.atomic, self.atomic_resp, self.ack, self.ack, self.ack, self.nak, self.probe,
             self.hello, self.datagram)
        return k


# Byte maps for bytes.translate: a random byte to a valid opcode, to an interesting byte, to
# flags with only defined bits; and the checks of the base header, a bad byte to 1.
TO_OPCODE = bytes(OPCODES[i % len(OPCODES)] for i in range(256))
TO_I8 = bytes(I8[i % len(I8)] for i in range(256))
TO_FLAGS = bytes(i & 0x1F for i in range(256))
BAD_VERSION = bytes(0 if i == 1 else 1 for i in range(256))
BAD_OPCODE = bytes(0 if OPCODE_OK[i] else 1 for i in range(256))
BAD_NONZERO = bytes(0 if i == 0 else 1 for i in range(256))
BAD_FLAGS_LOW = bytes(1 if i & 0xE0 else 0 for i in range(256))


def count_base_bad(big, n, k):
    """How many of the k datagrams of n bytes in `big` the device rejects at the base header
    (device.rs `base_header_ok`: short, version, opcode, reserved flag bits, reserved byte),
    column by column (every datagram's byte j is big[j::n]): no Python loop per datagram."""
    if k == 0:
        return 0
    if n < 32:
        return k
    bad = 0
    for j, table in ((0, BAD_VERSION), (1, BAD_OPCODE), (2, BAD_NONZERO), (3, BAD_FLAGS_LOW),
                     (19, BAD_NONZERO)):
        bad |= int.from_bytes(big[j::n].translate(table), "big")
    return bad.bit_count() if hasattr(bad, "bit_count") else bin(bad).count("1")


class Fuzzer:
    """Makes batches of datagrams: k of one length n, as one buffer of k * n bytes (what a
    UDP GSO send takes as is). Mutations work on columns (byte j of every datagram is
    big[j::n]) with slices and bytes.translate, so that Python does little per datagram."""

    # Built packets kept at hand (building one costs more than sending it many times).
    BUILT = 1024

    def __init__(self, r, templates, builder):
        self.r, self.templates, self.b = r, templates, builder
        self.pool = os.urandom(1 << 21)
        self.built = [builder.any() for _ in range(self.BUILT)]

    def rand_bytes(self, n):
        r = self.r
        if n > len(self.pool):
            return os.urandom(n)
        o = r.randrange(len(self.pool) - n + 1)
        return self.pool[o:o + n]

    def template(self):
        r = self.r
        if self.templates and r.random() < 0.6:
            return r.choice(self.templates)
        return r.choice(self.built)

    def flip_columns(self, big, n, k, hot, flips):
        """`flips` bit flips in every datagram, each at a random column below `hot` (one
        column and bit per flip and batch, a random subset of the datagrams per flip)."""
        r = self.r
        for _ in range(flips):
            j = r.randrange(hot)
            bit = 1 << r.randrange(8)
            col = big[j::n]
            # XOR the column with `bit` where a random byte is odd: about half the datagrams.
            mask = self.rand_bytes(k).translate(bytes((bit if i & 1 else 0) for i in range(256)))
            big[j::n] = (int.from_bytes(col, "big") ^ int.from_bytes(mask, "big")).to_bytes(k, "big")

    def flips(self, t, k):
        n = len(t)
        big = bytearray(t * k)
        hot = min(n, 100) if self.r.random() < 0.75 else n
        self.flip_columns(big, n, k, hot, 1 + self.r.randrange(4))
        return big

    def bytes_set(self, t, k):
        r, n = self.r, len(t)
        big = bytearray(t * k)
        for _ in range(1 + r.randrange(2)):
            j = r.randrange(min(n, 100))
            big[j::n] = self.rand_bytes(k).translate(TO_I8)
        return big

    def fields(self, t, k):
        """A header field set to extremes, moved a little or random, a different value in
        each datagram (lengths, PSN, MSN, QPs, conn_id, path_id, counts)."""
        r, n = self.r, len(t)
        spots = [f for f in BASE_FIELDS + EXT_FIELDS.get(t[1], ()) if f[0] + f[1] <= n]
        big = bytearray(t * k)
        for _ in range(1 + r.randrange(2)):
            o, w = r.choice(spots)
            old = int.from_bytes(t[o:o + w], "big")
            top = 1 << 8 * w
            extremes = I8 if w == 1 else I16 if w == 2 else I32
            c = r.random()
            if c < 0.4:
                deltas = (1, -1, 2, 255, 256, 257, 1344, -1344, 1 << 16, 1 << 31)
                vals = [(old + r.choice(deltas)) % top for _ in range(k)]
            elif c < 0.8:
                vals = [r.choice(extremes) % top for _ in range(k)]
            else:
                vals = [r.getrandbits(8 * w) for _ in range(k)]
            packed = b"".join(v.to_bytes(w, "big") for v in vals)
            for j in range(w):
                big[o + j::n] = packed[j::w]
        return big

    def opcode(self, t, k):
        n = len(t)
        big = bytearray(t * k)
        big[1::n] = self.rand_bytes(k).translate(TO_OPCODE)
        return big

    def truncate(self, t, k):
        r = self.r
        n = r.randrange(len(t)) if len(t) else 0
        if r.random() < 0.5:
            n = min(n, r.randrange(64))
        big = bytearray(t[:n] * k)
        if n and r.random() < 0.5:
            self.flip_columns(big, n, k, n, 1)
        return big, n

    def extend(self, t, k):
        r = self.r
        extra = r.choice((1, 2, 3, 4, 8, 16, 20, 48, 100, r.randrange(1, 1400)))
        n = len(t) + extra
        big = bytearray((t + bytes(extra)) * k)
        if r.random() < 0.5:
            for i in range(k):
                big[i * n + len(t):(i + 1) * n] = self.rand_bytes(extra)
        return big, n

    def random_dgrams(self, k):
        """Plain random datagrams of one random length, 0 to 9000 bytes; a third start with a
        valid base header's first bytes (conn_id 0 in half of them) so that they get past it."""
        r = self.r
        c = r.random()
        if c < 0.25:
            n = r.randrange(0, 64)
        elif c < 0.8:
            n = r.randrange(0, GSO_MAX_V4 + 1)
        else:
            n = r.randrange(GSO_MAX_V4, 9001)
        big = bytearray(self.rand_bytes(n * k))
        if n >= 32 and r.random() < 0.33:
            big[0::n] = b"\x01" * k
            big[1::n] = self.rand_bytes(k).translate(TO_OPCODE)
            big[2::n] = bytes(k)
            big[3::n] = self.rand_bytes(k).translate(TO_FLAGS)
            big[19::n] = bytes(k)
            if r.random() < 0.5:
                for j in range(12, 16):
                    big[j::n] = bytes(k)
        return big, n

    def huge(self):
        """One datagram past 9000 bytes, up to the largest IPv4 takes (IP fragments): random,
        or a valid DATAGRAM, SEND or WRITE header whose length fields say all of it."""
        r = self.r
        n = r.choice((9001, 16384, 32768, 65000, 65507))
        b = bytearray(self.rand_bytes(n))
        c = r.random()
        if c < 0.25:
            return b
        if c < 0.5:
            h = BASE.pack(1, DATAGRAM, FIRST | LAST, 1, 1, 0, 0, 0, 0, 0, 0, 0)
            b[:44] = h + struct.pack(">IHHI", GSI_QKEY, 0xFFFF, 0, n - 44)
        elif c < 0.75:
            b[:48] = self.b.base(SEND, FIRST | LAST) + struct.pack(">IIII", 0, 0, n - 48, n - 48)
        else:
            b[:64] = self.b.base(WRITE, FIRST | LAST) + struct.pack(
                ">QIIIIII", r.choice(self.b.ctx.vas), r.choice(self.b.ctx.rkeys), 0, 0, n - 64, n - 64, 0)
        return b

    def batch(self, k):
        """(kind, buffer, n): k datagrams of n bytes in one buffer; n None for a list of
        datagrams of any lengths."""
        r = self.r
        if r.random() < 0.25:
            self.built[r.randrange(self.BUILT)] = self.b.any()
        c = r.random()
        if c < 0.002:
            return "huge", [self.huge()], None
        if c < 0.3:
            big, n = self.random_dgrams(k)
            return "random", big, n
        if c < 0.38:
            # Built packets as they are (valid, or hostile values in valid places).
            return "built", [r.choice(self.built) for _ in range(min(k, 8))], None
        t = self.template()
        m = r.random()
        if m < 0.3:
            return "flip", self.flips(t, k), len(t)
        if m < 0.55:
            return "field", self.fields(t, k), len(t)
        if m < 0.65:
            return "byte", self.bytes_set(t, k), len(t)
        if m < 0.72:
            return "opcode", self.opcode(t, k), len(t)
        if m < 0.86:
            big, n = self.truncate(t, k)
            return "truncate", big, n
        big, n = self.extend(t, k)
        return "extend", big, n


def base_bad(b):
    """Whether the device rejects b at its base header (device.rs `base_header_ok`)."""
    return len(b) < 32 or b[0] != 1 or not OPCODE_OK[b[1]] or b[2] or b[3] & 0xE0 or b[19] != 0


class Sender:
    def __init__(self, family, dst, bind=None):
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        if bind:
            self.sock.bind((bind, 0))
        self.dst = (dst, PORT)
        self.gso_max = GSO_MAX_V4 if family == socket.AF_INET else GSO_MAX_V6
        self.gso = True
        self.errors = 0
        self.sent = 0

    def send_list(self, dgrams):
        """Sends datagrams of any lengths one by one; returns how many went out."""
        sent = 0
        for d in dgrams:
            try:
                self.sock.sendto(d, self.dst)
                sent += 1
            except OSError:
                self.errors += 1
                time.sleep(0.001)
        return sent

    def send_big(self, big, n, k):
        """Sends the k datagrams of n bytes in `big`: with UDP GSO, up to 64 a sendmsg, if
        they fit a frame; else one by one. Returns how many went out."""
        view = memoryview(big)
        if self.gso and k > 1 and 0 < n <= self.gso_max:
            per = max(1, min(GSO_SEGS, GSO_BYTES // n))
            cmsg = [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", n))]
            sent = 0
            for i in range(0, k, per):
                m = min(per, k - i)
                try:
                    self.sock.sendmsg([view[i * n:(i + m) * n]], cmsg, 0, self.dst)
                    sent += m
                except OSError as e:
                    if e.errno in (22, 5, 95, 97):  # EINVAL, EIO, EOPNOTSUPP: no GSO here
                        self.gso = False
                        return sent + self.send_big(view[i * n:], n, k - i)
                    self.errors += 1
                    time.sleep(0.001)
            return sent
        return self.send_list([view[i * n:(i + 1) * n] for i in range(k)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dst", required=True, help="the device's IPv4 address")
    ap.add_argument("--dst6", help="its IPv6 address (a few percent of the datagrams)")
    ap.add_argument("--stranger", help="a local address the device has no peer at")
    ap.add_argument("--count", type=int, default=500000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pcap", help="capture whose packets are mutated")
    ap.add_argument("--peer", help="use only captured packets from this source address")
    ap.add_argument("--keep", help="write the first datagrams of each kind here (hex lines)")
    args = ap.parse_args()

    r = random.Random(args.seed)
    caught = read_pcap(args.pcap) if args.pcap else []
    templates = [p for s, p in caught if not args.peer or s == args.peer]
    ctx = Context(templates)
    # Many WRITE data packets and ACKs, few of the rest: keep a variety, at most 64 of a kind.
    by_op = {}
    for t in templates:
        by_op.setdefault((t[1], len(t) > 200), []).append(t)
    variety = []
    for v in by_op.values():
        variety.extend(v[:: max(1, len(v) // 64)][:64])
    fz = Fuzzer(r, variety, Builder(r, ctx))

    main_s = Sender(socket.AF_INET, args.dst)
    stranger = Sender(socket.AF_INET, args.dst, args.stranger) if args.stranger else None
    v6 = Sender(socket.AF_INET6, args.dst6) if args.dst6 else None

    keep = open(args.keep, "w") if args.keep else None
    kept = {}
    by_kind, bad, total = {}, 0, 0
    t0, start = os.times(), time.monotonic()
    while total < args.count:
        k = min(args.count - total, r.choice((1, 8, 64, 64, 64, 64)))
        kind, big, n = fz.batch(k)
        c = r.random()
        s = stranger if stranger and c < 0.08 else v6 if v6 and c < 0.12 else main_s
        if n is None:
            sent = s.send_list(big)
            nbad = sum(1 for d in big if base_bad(d))
            k = len(big)
        else:
            sent = s.send_big(big, n, k)
            nbad = count_base_bad(big, n, k)
        total += sent
        s.sent += sent
        by_kind[kind] = by_kind.get(kind, 0) + sent
        bad += nbad if sent == k else nbad * sent // max(1, k)
        if keep and kept.get(kind, 0) < 20:
            kept[kind] = kept.get(kind, 0) + 1
            first = big[0] if n is None else big[:n]
            keep.write(f"{kind} {bytes(first).hex()}\n")
    elapsed = time.monotonic() - start
    t1 = os.times()
    errors = main_s.errors + (stranger.errors if stranger else 0) + (v6.errors if v6 else 0)
    kinds = " ".join(f"{k}={v}" for k, v in sorted(by_kind.items()))
    print(f"sent {total} in {elapsed:.1f} s ({total / max(elapsed, 1e-9):.0f}/s) base_bad {bad} "
          f"stranger {stranger.sent if stranger else 0} ipv6 {v6.sent if v6 else 0} "
          f"templates {len(templates)} gso {int(main_s.gso)} send_errors {errors} "
          f"cpu_user {t1.user - t0.user:.1f} cpu_sys {t1.system - t0.system:.1f} {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
