#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Off-path injection: packets that carry the real peer's source address but not the
# connection ids the two devices agreed through HELLO (docs/wire-format.md, HELLO). Sent from
# ns1's own address (which is mroce1's, so they look like mroce1's) to mroce2 while the two
# devices have a connection: a HELLO that does not prove itself changes nothing (no plane
# address taken from it) and is counted; connection packets with the old fixed id 0 or a
# guessed one are dropped and counted; the connection carries data before and after. And the
# connections' life: one goes with its last QP, and a peer that kept its own restarts its
# paths when the other end comes back with a new connection id, also when a route drops every
# datagram of one 5-tuple (HELLO and the connection manager's MADs).
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
setup_pair metaroce mroce
CNT2=/sys/class/infiniband/mroce2/ports/1/hw_counters

pingpong() { # what
	$IP netns exec ns2 timeout 60 ibv_rc_pingpong -d mroce2 -g 1 -n 100 -s 4096 -c \
		>"$TAP_DIR/pp-server.log" 2>&1 &
	local srv=$!
	sleep 1
	check "$1" $IP netns exec ns1 timeout 60 ibv_rc_pingpong -d mroce1 -g 1 -n 100 -s 4096 -c $NS2_ADDR
	wait $srv
}

# forge KIND...: datagrams from ns1 ($NS1_ADDR, a port other than 4793) to mroce2. KIND:
#   hello0      HELLO asking for a reply, base conn_id 0, claiming plane 1 at 10.77.0.99
#   helloguess  the same with a guessed base conn_id
#   probe0      PROBE on path 0 with conn_id 0 (every connection's id before ids were random)
#   probeguess  the same with a guessed conn_id
forge() {
	$IP netns exec ns1 python3 -c '
import random, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
def base(opcode, conn_id, flags=0):
    # version, opcode, flags, dst_qp, src_qp, conn_id, path_id, plane, reserved, psn, msn, ts
    return struct.pack(">BBHIIIHBBIII", 1, opcode, flags, 0, 0, conn_id, 0, 0, 0, 0, 0, 1234)
def hello(conn_id):
    entry = lambda plane, a: struct.pack(">BBH", plane, 4, 0) + socket.inet_aton(a) + bytes(12)
    ext = struct.pack(">BBHII", 1, 2, 16, 0x5eed, random.getrandbits(31) | 1)
    return base(0x13, conn_id) + ext + entry(0, sys.argv[1]) + entry(1, "10.77.0.99")
for kind in sys.argv[3:]:
    guess = random.getrandbits(32) | 1
    pkt = {"hello0": lambda: hello(0), "helloguess": lambda: hello(guess),
           "probe0": lambda: base(0x12, 0, 1), "probeguess": lambda: base(0x12, guess, 1)}[kind]()
    s.sendto(pkt, (sys.argv[2], 4793))
print("sent", len(sys.argv) - 3)
' $NS1_ADDR $NS2_ADDR "$@"
}
ctr() { cat "$CNT2/$1"; }
# The peers file's line for mroce1 as mroce2 has it.
peer_line() { grep "^peer $NS1_ADDR " /sys/class/infiniband/mroce2/peers; }
# grows NAME BEFORE N: the counter reaches BEFORE + N within a few seconds.
grows() {
	wait_for 5 sh -c "[ \$(cat $CNT2/$1) -ge $(($2 + $3)) ]" ||
		{ echo "$1 is $(ctr "$1"), wanted $(($2 + $3))"; return 1; }
}

# An anchor: a QP on mroce2 toward mroce1 that stays (RTR, pyverbs, in the background), so
# that mroce2 keeps its connection to mroce1 while mroce1's device goes and comes back.
$IP netns exec ns2 python3 -c '
import sys, time
import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
ctx = Context(name="mroce2")
pd = PD(ctx)
cq = CQ(ctx, 4)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                      cap=QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)))
a = QPAttr(qp_state=e.IBV_QPS_INIT)
a.pkey_index, a.port_num = 0, 1
qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
a = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
a.dest_qp_num, a.rq_psn, a.max_dest_rd_atomic, a.min_rnr_timer = 0x4321, 0, 1, 12
o = [int(x) for x in sys.argv[1].split(".")]
gid = GID("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x" % tuple(o))
a.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=1, hop_limit=64), is_global=1, port_num=1)
qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
          | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
print("anchored", flush=True)
time.sleep(600)
' $NS1_ADDR >"$TAP_DIR/anchor.log" 2>&1 &
anchor=$!
check "mroce2 holds a QP toward mroce1 (the anchor)" wait_for 20 grep -q anchored "$TAP_DIR/anchor.log"

pingpong "ibv_rc_pingpong between the two devices, data checked (connection ids agreed)"
check_output "mroce2 knows mroce1 proven, on plane 0 only" " proven 1 plane0 $NS1_ADDR\$" peer_line
check "mroce1's connection lingers after its last QP (qps 0)" \
	grep -q "^peer $NS2_ADDR qps 0 " /sys/class/infiniband/mroce1/peers

unproven=$(ctr hello_unproven)
check_output "forge 2 HELLOs from mroce1's address, base conn_id 0 and guessed" '^sent 2$' \
	forge hello0 helloguess
check "mroce2 counts both unproven" grows hello_unproven "$unproven" 2
check_output "they changed nothing: no plane 1 address taken from them" \
	" proven 1 plane0 $NS1_ADDR\$" peer_line

noconn=$(ctr rx_no_connection)
check_output "forge 2 PROBEs on the connection, conn_id 0 and guessed" '^sent 2$' forge probe0 probeguess
check "mroce2 drops and counts both (rx_no_connection)" grows rx_no_connection "$noconn" 2

# mroce1's device is made again, so its connection to mroce2 is new (a new id); mroce2, which
# kept its own (the anchor), restarts its paths' sequence numbers when it learns the new id.
restarts=$(ctr peer_restarts)
check "rdma link delete mroce1, then add it again" sh -c "
	$IP netns exec ns1 $RDMA link delete mroce1 &&
	$IP netns exec ns1 $RDMA link add mroce1 type metaroce netdev veth1"
pingpong "the new device's connection carries data, data checked"
check "mroce2 saw mroce1's new connection id and restarted its paths (peer_restarts)" \
	grows peer_restarts "$restarts" 1
pingpong "and again, data checked"

# Again, with everything mroce2 sends from UDP source port 4793 dropped on its link, as an ECMP
# route that swallows one 5-tuple would: HELLO leaves from a random port each time, so the ids
# are still agreed (from a fixed port, every HELLO of mroce2's would take that one route).
check "mroce2's datagrams from UDP source port 4793 are dropped on veth2" sh -c "
	$IP netns exec ns2 tc qdisc add dev veth2 clsact &&
	$IP netns exec ns2 tc filter add dev veth2 egress protocol ip prio 1 u32 \
		match ip protocol 17 0xff match ip sport 4793 0xffff action drop"
check "rdma link delete mroce1, then add it again" sh -c "
	$IP netns exec ns1 $RDMA link delete mroce1 &&
	$IP netns exec ns1 $RDMA link add mroce1 type metaroce netdev veth1"
# The filter works: a datagram of our own from port 4793 (a raw socket: the device owns the
# port) is dropped and counted.
check_output "the filter drops a datagram sent from port 4793" '^[1-9]' sh -c "
	$IP netns exec ns2 python3 -c '
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
s.sendto(struct.pack(\">HHHH\", 4793, 9, 12, 0) + b\"ping\", (\"$NS1_ADDR\", 0))' &&
	$IP netns exec ns2 tc -s filter show dev veth2 egress | awk '/Sent/ { print \$4; exit }'"
pingpong "the new connection's ids are agreed past the route that drops port 4793, data checked"
# The connection manager's MADs (the GSI QP's datagrams) too leave from random ports: rping
# connects through rdma_cm past the same route (from port 4793, mroce2's replies were lost).
$IP netns exec ns2 timeout 60 rping -s -a "$NS2_ADDR" -v >"$TAP_DIR/rping-server.log" 2>&1 &
rsrv=$!
wait_for 15 sh -c "$RDMA resource show cm_id 2>/dev/null | grep -q 'state LISTEN'" ||
	echo "# rping's server is not listening after 15 s"
check_output "rping connects through rdma_cm past the route that drops port 4793, data validated" \
	'ping data: rdma-ping-4: ' $IP netns exec ns1 timeout 60 rping -c -a "$NS2_ADDR" -C 5 -v -V
kill $rsrv 2>/dev/null
wait $rsrv 2>/dev/null
$IP netns exec ns2 tc qdisc del dev veth2 clsact
kill $anchor 2>/dev/null
wait $anchor 2>/dev/null

teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
