#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The device's UDP layer: its kernel socket on port 4793 bound to its netdev, several devices
# on one port in one namespace, rxe's 4791 beside it, and the receive path counting what
# arrives (rdma statistic hw counters) without the kernel minding garbage.
source "$(dirname "$0")/../lib.sh"
dmesg_mark

# counter DEV NAME: the value of one hw counter of DEV's port 1.
counter() {
	$RDMA statistic show link "$1/1" | tr -s ' \n' '\n' | awk -v n="$2" 'p { print; exit } $0 == n { p = 1 }'
}
# counter_is DEV NAME VALUE: waits (briefly) until the counter has that value.
counter_is() {
	local deadline=$((SECONDS + 5)) v
	until v=$(counter "$1" "$2") && [ "$v" = "$3" ]; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			echo "$1 $2 is '$v', wanted $3"
			$RDMA statistic show link "$1/1"
			return 1
		fi
		sleep 0.2
	done
}

# counter_ge DEV NAME MIN: the counter is at least MIN.
counter_ge() {
	local v
	v=$(counter "$1" "$2")
	[ -n "$v" ] && [ "$v" -ge "$3" ] || { echo "$1 $2 is '$v', wanted >= $3"; return 1; }
}

# send_udp NS ADDR [TOS [SEG]] < spec: sends datagrams to ADDR:4793 from namespace NS. Each
# line of the spec is a Python expression for one payload (bytes); with SEG, each payload goes
# as a UDP GSO packet of SEG-byte datagrams (UDP_SEGMENT).
send_udp() {
	$IP netns exec "$1" python3 -c '
import socket, sys, os, random
addr, tos, seg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
s = socket.socket(fam, socket.SOCK_DGRAM)
if seg:
    s.setsockopt(socket.IPPROTO_UDP, 103, seg)  # UDP_SEGMENT
if tos:
    if fam == socket.AF_INET:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    else:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
random.seed(7)
def hdr(version=1, opcode=0x12, flags=0, reserved=0):
    b = bytearray(32)
    b[0], b[1] = version, opcode
    b[2:4] = flags.to_bytes(2, "big")
    b[19] = reserved
    return bytes(b)
def garbage(n):
    return bytes(random.getrandbits(8) for _ in range(n))
n = 0
for line in sys.stdin:
    line = line.strip()
    if line and not line.startswith("#"):
        s.sendto(eval(line), (addr, 4793))
        n += 1
print(n, "sent")
' "$2" "${3:-0}" "${4:-0}"
}

# send_udp_gso NS ADDR SEG < spec: as send_udp, each payload sent as one UDP GSO packet of
# SEG-byte datagrams (the last one shorter), which veth carries whole.
send_udp_gso() { send_udp "$1" "$2" 0 "$3"; }

# sockets_on_port NS PORT: how many UDP sockets are bound to PORT in NS.
sockets_on_port() { $IP netns exec "$1" ss -ulnH "sport = :$2" | grep -c .; }

# bind_udp NS DEV: binds a user socket to :4793 in NS, to device DEV if not empty.
bind_udp() {
	$IP netns exec "$1" python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if sys.argv[1]:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, sys.argv[1].encode())
try:
    s.bind(("0.0.0.0", 4793))
    print("bound")
except OSError as e:
    print(e)
' "$2"
}

check "modprobe metaroce" modprobe metaroce
setup_pair metaroce mroce

# The socket: one per device, bound to its netdev, IPv4 and IPv6. (This ss does not print the
# bound device; binding shows in which sockets can coexist on the port, below.)
check_output "ss: mroce1's IPv4 socket on :4793" '0\.0\.0\.0:4793' $IP netns exec ns1 ss -ulnH 'sport = :4793'
check_output "ss: mroce1's IPv6 socket on :4793" '\*:4793|\[::\]:4793' $IP netns exec ns1 ss -ulnH 'sport = :4793'
check_no_output "ss: no socket on :4793 in the root namespace" ':4793' ss -ulnH 'sport = :4793'
check_output "hw counters listed by rdma statistic" 'rx_packets 0' $RDMA statistic show link mroce1/1
check_output "hw counters include nak_rcvd_rnr" 'nak_rcvd_rnr 0' $RDMA statistic show link mroce1/1
check_output "hw counters in sysfs" '^0$' cat /sys/class/infiniband/mroce1/ports/1/hw_counters/rx_malformed
check_output "a socket without a device cannot take :4793 in ns1" 'EADDRINUSE|in use' bind_udp ns1 ""
check_output "a socket bound to lo can (ours are bound to veth1)" '^bound$' bind_udp ns1 lo

# Malformed datagrams: counted, dropped, nothing else.
check_output "send 14 malformed IPv4 datagrams from ns2" '^14 sent' send_udp ns2 $NS1_ADDR <<'EOF'
b""
b"\x01"
b"\x01\x12" + bytes(29)
hdr(version=0)
hdr(version=2)
hdr(opcode=0x0c)
hdr(opcode=0x0f)
hdr(opcode=0x16)
hdr(opcode=0xff)
hdr(flags=0x20)
hdr(reserved=1)
garbage(100)
garbage(1400)
b"\x02" + garbage(60000)
EOF
check "rx_malformed counts all 14" counter_is mroce1 rx_malformed 14
check_output "rx_packets still 0" '^0$' counter mroce1 rx_packets

# Valid-looking base headers: 1 PROBE, 1 SEND with data, 1 ACK, 1 large (IP fragments).
check_output "send 4 valid-looking IPv4 packets" '^4 sent' send_udp ns2 $NS1_ADDR <<'EOF'
hdr()
hdr(opcode=0x00, flags=0x1f) + bytes(100)
hdr(opcode=0x10) + bytes(12)
hdr(opcode=0x02) + garbage(30000)
EOF
check "rx_packets counts 4" counter_is mroce1 rx_packets 4
check_output "rx_bytes counts their payloads" '^30240$' counter mroce1 rx_bytes
check_output "rx_malformed unchanged" '^14$' counter mroce1 rx_malformed
check_output "no ECN CE seen yet" '^0$' counter mroce1 rx_ecn_ce

# IPv6 and ECN CE.
check_output "send 2 valid + 2 malformed IPv6 packets with ECN CE" '^4 sent' send_udp ns2 fd77::1 3 <<'EOF'
hdr()
hdr(opcode=0x11) + bytes(8)
b""
hdr(version=7)
EOF
check "IPv6: rx_packets 6" counter_is mroce1 rx_packets 6
check "IPv6: rx_malformed 16" counter_is mroce1 rx_malformed 16
check_output "ECN CE counted" '^2$' counter mroce1 rx_ecn_ce
check_output "mroce2 saw nothing" '^0 0$' sh -c "echo \$($RDMA statistic show link mroce2/1 | grep -Eo '(rx_packets|rx_malformed) [0-9]+' | cut -d' ' -f2)"

# UDP GSO packets (sys/udp.rs): the socket takes datagrams one by one, and the stack cuts a
# GSO packet into datagrams for it; at a datagram of a train (a GSO packet of 4 or more) it
# switches to queued, and takes the next GSO packets whole (rx_gso_whole), handing out their
# datagrams one by one (the last one shorter); 32 datagrams in a row that come alone (or in
# shorter packets) switch it back.
bad5='(hdr(version=2) + bytes(168)) * 4 + hdr(version=2) + bytes(18)'
good5='(hdr() + bytes(168)) * 4 + hdr() + bytes(18)'
good3='(hdr() + bytes(468)) * 2 + hdr() + bytes(1)'
check_output "GSO: a train of 5 malformed datagrams, cut by the stack" '^1 sent' send_udp_gso ns2 $NS1_ADDR 200 <<<"$bad5"
check "GSO: rx_malformed counts its 5 datagrams" counter_is mroce1 rx_malformed 21
check_output "GSO: not taken whole" '^0$' counter mroce1 rx_gso_whole
check_output "GSO: the socket switched to queued" '^1$' counter mroce1 rx_queued
check_output "GSO: another train of 5 malformed datagrams" '^1 sent' send_udp_gso ns2 $NS1_ADDR 200 <<<"$bad5"
check "GSO: taken whole" counter_is mroce1 rx_gso_whole 1
check_output "GSO: rx_malformed counts the 5" '^26$' counter mroce1 rx_malformed
check_output "GSO: a packet of 3 valid-looking datagrams" '^1 sent' send_udp_gso ns2 $NS1_ADDR 500 <<<"$good3"
check "GSO: taken whole too" counter_is mroce1 rx_gso_whole 2
check_output "GSO: rx_packets counts the 3" '^9$' counter mroce1 rx_packets
singles=$(for _ in $(seq 32); do echo 'hdr()'; done)
check_output "GSO: send 32 datagrams alone" '^32 sent' send_udp ns2 $NS1_ADDR <<<"$singles"
check "GSO: rx_packets counts them" counter_is mroce1 rx_packets 41
check_output "GSO: a packet of 3 after those" '^1 sent' send_udp_gso ns2 $NS1_ADDR 500 <<<"$good3"
check "GSO: its datagrams counted" counter_is mroce1 rx_packets 44
check_output "GSO: cut by the stack (back to one by one), and too short to switch" '^2$' counter mroce1 rx_gso_whole
check_output "GSO: a train of 5 valid-looking datagrams" '^1 sent' send_udp_gso ns2 $NS1_ADDR 200 <<<"$good5"
check "GSO: its datagrams counted" counter_is mroce1 rx_packets 49
check_output "GSO: cut by the stack" '^2$' counter mroce1 rx_gso_whole
check_output "GSO: and queued again" '^2$' counter mroce1 rx_queued
check_output "GSO: and the next train" '^1 sent' send_udp_gso ns2 $NS1_ADDR 200 <<<"$good5"
check "GSO: taken whole" counter_is mroce1 rx_gso_whole 3
check "GSO: rx_packets 54" counter_is mroce1 rx_packets 54
check_output "GSO: no bad checksums" '^0$' counter mroce1 rx_bad_checksum

# Two devices on two netdevs in one namespace share the port (each socket bound to its own).
$IP link add vetha netns ns1 type veth peer name vethb netns ns2
$IP -n ns1 addr add 10.78.0.1/24 dev vetha
$IP -n ns2 addr add 10.78.0.2/24 dev vethb
$IP -n ns1 link set vetha up
$IP -n ns2 link set vethb up
check "rdma link add mroce3 on vetha (same netns as mroce1)" $IP netns exec ns1 $RDMA link add mroce3 type metaroce netdev vetha
check_output "ss: two IPv4 and two IPv6 sockets on :4793 in ns1" '^4$' sockets_on_port ns1 4793
check_output "send 1 valid packet to mroce3's address" '^1 sent' send_udp ns2 10.78.0.1 <<<'hdr()'
check "mroce3 counts it" counter_is mroce3 rx_packets 1
check_output "mroce1 does not" '^54$' counter mroce1 rx_packets

# rxe's 4791 beside ours, on the same netdev.
check "modprobe rdma_rxe" modprobe rdma_rxe
check "rdma link add rxe1 on veth1 (beside mroce1)" $IP netns exec ns1 $RDMA link add rxe1 type rxe netdev veth1
check_output "ss: rxe's :4791 listening" ':4791' $IP netns exec ns1 ss -ulnH
check_output "ss: ours still listening" '^4$' sockets_on_port ns1 4793
check_output "send 1 valid packet to mroce1 with rxe present" '^1 sent' send_udp ns2 $NS1_ADDR <<<'hdr()'
check "mroce1 still receives" counter_is mroce1 rx_packets 55
check "rdma link delete rxe1" $IP netns exec ns1 $RDMA link delete rxe1

# Removing a device closes its socket; the other one keeps the port.
check "rdma link delete mroce3" $IP netns exec ns1 $RDMA link delete mroce3
check_output "ss: mroce3's sockets are gone, mroce1's remain" '^2$' sockets_on_port ns1 4793
check_output "mroce1 still receives" '^1 sent' send_udp ns2 $NS1_ADDR <<<'hdr()'
check "mroce1 counts it" counter_is mroce1 rx_packets 56
check "rdma link add mroce3 again" $IP netns exec ns1 $RDMA link add mroce3 type metaroce netdev vetha
check_output "ss: and its sockets are back" '^4$' sockets_on_port ns1 4793

# The send side, driven by the data path: a short ibv_rc_pingpong (its outcome is traffic.sh's
# business; here only what went through the sockets counts).
$IP netns exec ns2 timeout 30 ibv_rc_pingpong -d mroce2 -g 1 -n 20 -s 64 >/dev/null 2>&1 &
srv=$!
sleep 1
$IP netns exec ns1 timeout 30 ibv_rc_pingpong -d mroce1 -g 1 -n 20 -s 64 $NS2_ADDR >/dev/null 2>&1
wait "$srv"
check "send: mroce1 counted tx_packets" counter_ge mroce1 tx_packets 1
check "send: mroce1 counted tx_bytes" counter_ge mroce1 tx_bytes 32
check_output "send: no tx_errors" '^0$' counter mroce1 tx_errors
check "receive: mroce2 took them as valid packets" counter_ge mroce2 rx_packets 1
check_output "receive: none malformed at mroce2" '^0$' counter mroce2 rx_malformed

# Traffic while the namespace (and with it the netdevs and devices) goes away.
$IP netns exec ns2 python3 -c '
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end = time.time() + 3
while time.time() < end:
    try:
        s.sendto(b"\x01\x12" + bytes(30), ("10.77.0.1", 4793))
    except OSError:
        pass
' &
flood=$!
sleep 1
check "ip netns del ns1 under traffic" $IP netns del ns1
wait "$flood"
wait_for 10 sh -c "! ibv_devices | grep -q 'mroce1\|mroce3'"
check_no_output "mroce1 and mroce3 gone with ns1" 'mroce1|mroce3' ibv_devices
teardown_pair
check "rmmod metaroce" rmmod metaroce
check "rmmod rdma_rxe" rmmod rdma_rxe
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
