#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Multi-plane devices (docs/multiplane.md): two namespaces joined by 4 veth pairs, one subnet
# per plane; a metaroce device per side on the plane-0 pair, planes 1-3 added through the
# sysfs file and the metaroce-plane CLI. Checks the paths-per-connection file, the planes
# listing, the direct verbs (a QP restricted to one plane), that traffic is sprayed
# over every plane, that 4 rate-limited planes carry several times what 1 does, that cutting
# a plane in the middle of a transfer costs no error, removal through the CLI, and a clean
# unload.
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
PLANE_CLI=$(command -v metaroce-plane || echo /usr/local/sbin/metaroce-plane)
setup_pair metaroce mroce
NS1_IF=(veth1 pl1a pl2a pl3a)
NS2_IF=(veth2 pl1b pl2b pl3b)
for k in 1 2 3; do
	$IP link add pl${k}a netns ns1 type veth peer name pl${k}b netns ns2
	$IP -n ns1 addr add 10.77.$k.1/24 dev pl${k}a
	$IP -n ns2 addr add 10.77.$k.2/24 dev pl${k}b
	$IP -n ns1 link set pl${k}a up
	$IP -n ns2 link set pl${k}b up
done
P1=/sys/class/infiniband/mroce1/planes
P2=/sys/class/infiniband/mroce2/planes

check_output "a new device lists plane 0 only" '^0 veth1 10\.77\.0\.1 up$' cat $P1
ports_of() { ibv_devinfo -d "$1" | grep -cE '^[[:space:]]+port:'; }
active_ports_of() { ibv_devinfo -d "$1" | grep -c PORT_ACTIVE; }
check_output "a new device has one port (one per plane)" '^1$' ports_of mroce1

# hold_device DEV: a process with DEV open (a user context) until unhold.
hold_device() {
	rm -f "$TAP_DIR/held"
	python3 -c "
import sys, time
from pyverbs.device import Context
c = Context(name='$1')
open('$TAP_DIR/held', 'w').close()
time.sleep(120)" &
	HOLDER=$!
	wait_for 20 test -f "$TAP_DIR/held"
}
unhold() { kill "$HOLDER" 2>/dev/null; wait "$HOLDER" 2>/dev/null; }

# Paths per connection: the device's `paths` file (8..256, default 16), for connections made
# from then on. Set before the first QP connects: 24 on both sides, so 6 per plane on 4 planes.
PATHS1=/sys/class/infiniband/mroce1/paths
PATHS2=/sys/class/infiniband/mroce2/paths
check_output "a new device makes connections of 16 paths" '^16$' cat $PATHS1
check "paths below 8, above 256 or not a number are refused" \
	sh -c "! echo 7 >$PATHS1 && ! echo 257 >$PATHS1 && ! echo x >$PATHS1 && test \$(cat $PATHS1) = 16"
check "set 24 paths on both devices" sh -c "echo 24 >$PATHS1 && echo 24 >$PATHS2 && test \$(cat $PATHS2) = 24"

# Throughput of ib_write_bw (Gbit/s, average), each ns1 veth limited to 5 Mbit/s by tbf: low
# enough that 4 planes together (20 Mbit/s) stay below what the guest's CPU can push under TCG
# (a few tens of Mbit/s), so the planes are what limits.
tbf() { # on|off
	local i
	for i in "${NS1_IF[@]}"; do
		if [ "$1" = on ]; then
			$IP netns exec ns1 tc qdisc replace dev $i root tbf rate 5mbit burst 16kb latency 200ms
		else
			$IP netns exec ns1 tc qdisc del dev $i root 2>/dev/null || true
		fi
	done
}
bw_of_last() { awk '{print $4}' "$TAP_DIR/last-result"; }
tbf on
perftest "ib_write_bw over 1 plane at 5 Mbit/s" ib_write_bw -s 16384 -D 4
BW1=$(bw_of_last)
# Both sides have 24, so each sends on 24 (the HELLO told each the other's count).
check_output "the connection has the 24 paths the devices were set to, and sends on all" \
	'^peer 10\.77\.0\.2 qps [0-9]+ paths 24/24 ' cat /sys/class/infiniband/mroce1/peers

check "add planes 1-2 through the sysfs file" sh -c "echo +pl1a >$P1 && echo +pl2a >$P1 && echo +pl1b >$P2 && echo +pl2b >$P2"
check "add plane 3 through metaroce-plane" sh -c "$PLANE_CLI add mroce1 pl3a && $PLANE_CLI add mroce2 pl3b"
check_output "the planes file lists the 4 planes" \
	'^0 veth1 10\.77\.0\.1 up
1 pl1a 10\.77\.1\.1 up
2 pl2a 10\.77\.2\.1 up
3 pl3a 10\.77\.3\.1 up$' cat $P1
check_output "metaroce-plane show lists them" '^mroce2 3 pl3b 10\.77\.3\.2 up$' $PLANE_CLI show
got="$(ports_of mroce1) $(active_ports_of mroce1)"
check_output "4 planes: 4 ports, all active (each added plane made the device again with a port more)" \
	'^4 4$' echo "$got"
check_output "the device made again kept its paths setting" '^24$' cat $PATHS1
$IP link add pl4a netns ns1 type veth peer name pl4b netns ns2
$IP -n ns1 link set pl4a up
hold_device mroce1
check_output "a plane that needs a new port while the device is in use is refused (EBUSY)" \
	'busy' sh -c "bash -c 'echo +pl4a >$P1' 2>&1; true"
unhold
check_output "the device in use kept its 4 ports" '^4$' ports_of mroce1
# (rdma link names a port's netdev only to a caller in the netdev's namespace.)
check_output "rdma link shows plane 3 as port 4 with its netdev" 'mroce1/4 state ACTIVE .*netdev pl3a' \
	$IP netns exec ns1 $RDMA link show mroce1/4
check "adding a netdev that is already a plane is refused" sh -c "! echo +veth1 >$P1"
check "adding a netdev that does not exist is refused" sh -c "! echo +nosuch0 >$P1"
check "removing plane 0 is refused" sh -c "! echo -veth1 >$P1"

perftest "ib_write_bw over 4 planes at 5 Mbit/s each" ib_write_bw -s 16384 -D 4
BW4=$(bw_of_last)
tbf off
ratio=$(awk -v a="$BW1" -v b="$BW4" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print 0 }')
echo "# 1 plane: $BW1 Gbit/s, 4 planes: $BW4 Gbit/s, ratio $ratio"
check "4 rate-limited planes carry >= 2.5x what 1 does (measured ${ratio}x)" \
	awk -v r="$ratio" 'BEGIN { exit !(r >= 2.5) }'

# Spraying: every plane's veth carries a fair share of the bytes of one transfer.
tx_bytes() { $IP netns exec ns1 cat /sys/class/net/$1/statistics/tx_bytes; }
declare -a before
# Per-plane hardware counters: port k + 1 reports what plane k's socket counted, port 1 the
# whole device (every plane; and the transport's counters).
hw() { cat "/sys/class/infiniband/$1/ports/$2/hw_counters/$3"; }
declare -a hw_tx_before hw_rx_before
for port in 1 2 3 4; do
	hw_tx_before[$port]=$(hw mroce1 $port tx_bytes)
	hw_rx_before[$port]=$(hw mroce2 $port rx_packets)
done
for k in 0 1 2 3; do before[$k]=$(tx_bytes ${NS1_IF[$k]}); done
# Over 2 s: the first ~100 ms carry what the rate-limited runs left (packets dropped with
# the tbf queues wait for their paths' RTOs, learned behind 200 ms queues, up to 100 ms), and
# a transfer of 150 ms (300 x 64 KiB) showed it (20/19/29/30%).
perftest "ib_write_bw over 4 planes, 64 KiB for 2 s" ib_write_bw -s 65536 -D 2
declare -a hw_tx hw_rx
for port in 1 2 3 4; do
	hw_tx[$port]=$(($(hw mroce1 $port tx_bytes) - hw_tx_before[port]))
	hw_rx[$port]=$(($(hw mroce2 $port rx_packets) - hw_rx_before[port]))
done
planes_tx=$((hw_tx[2] + hw_tx[3] + hw_tx[4]))
plane0_tx=$((hw_tx[1] - planes_tx))
echo "# mroce1 tx_bytes: port 1 (device) ${hw_tx[1]}, ports 2-4 ${hw_tx[2]} ${hw_tx[3]} ${hw_tx[4]}; mroce2 rx_packets ports 1-4: ${hw_rx[*]:1}"
check "per-plane counters: ports 2-4 count their planes' traffic both ways (mroce1 tx_bytes, mroce2 rx_packets)" \
	test "${hw_tx[2]}" -gt 0 -a "${hw_tx[3]}" -gt 0 -a "${hw_tx[4]}" -gt 0 \
	-a "${hw_rx[2]}" -gt 0 -a "${hw_rx[3]}" -gt 0 -a "${hw_rx[4]}" -gt 0
check "per-plane counters: port 1 counts the device (more than planes 1-3 together; plane 0's ${plane0_tx} B is a fair share)" \
	test "$plane0_tx" -gt $((hw_tx[1] / 6)) -a "$plane0_tx" -lt $((hw_tx[1] / 3))
total=0
declare -a sent
for k in 0 1 2 3; do
	sent[$k]=$(($(tx_bytes ${NS1_IF[$k]}) - before[k]))
	total=$((total + sent[k]))
done
shares=""
ok=0
for k in 0 1 2 3; do
	pct=$((total > 0 ? sent[k] * 100 / total : 0))
	shares="$shares plane$k=${pct}%"
	# A fair share is 25% (measured 22-26% over 3 s; see docs/multiplane.md for what made
	# it 8-35%). Each plane must carry 18% to 32%.
	if [ "$pct" -lt 18 ] || [ "$pct" -gt 32 ]; then ok=1; fi
done
echo "# bytes per plane:$shares (total $total)"
_tap $ok "every plane carries 18-32% of the bytes (fair: 25%;$shares)"

# Direct verbs (metaroce_dv.h): a QP restricted to plane 1 sends its data there only, and
# reads its connection's planes and paths back. The program checks the data and the answers;
# here the per-plane counters of the sending device (port k + 1 is plane k) check where the
# bytes went.
DV_TEST=$(command -v metaroce_dv_test || echo /usr/local/bin/metaroce_dv_test)
for port in 1 2 3 4; do hw_tx_before[$port]=$(hw mroce1 $port tx_bytes); done
check_output "metaroce_dv_test: a QP restricted to plane 1 writes correct data and reads its 24 paths back" \
	'num_paths 24 ' $DV_TEST --planes 0x2 mroce1 mroce2
for port in 1 2 3 4; do hw_tx[$port]=$(($(hw mroce1 $port tx_bytes) - hw_tx_before[port])); done
plane0_tx=$((hw_tx[1] - hw_tx[2] - hw_tx[3] - hw_tx[4]))
echo "# mroce1 tx_bytes per plane during the restricted run: $plane0_tx ${hw_tx[2]} ${hw_tx[3]} ${hw_tx[4]}"
check "the restricted QP's bytes went on plane 1 (at least 95% of them)" \
	test $((hw_tx[2] * 100)) -ge $((hw_tx[1] * 95)) -a "${hw_tx[2]}" -gt 1000000
for port in 1 2 3 4; do hw_tx_before[$port]=$(hw mroce1 $port tx_bytes); done
check_output "metaroce_dv_test: an unrestricted QP reads back plane mask 0 and 4 planes up" \
	'planes 4 planes_up 0xf .*plane_mask 0x0' $DV_TEST mroce1 mroce2
for port in 1 2 3 4; do hw_tx[$port]=$(($(hw mroce1 $port tx_bytes) - hw_tx_before[port])); done
check "an unrestricted QP sprays over every plane" \
	test "${hw_tx[2]}" -gt $((hw_tx[1] / 8)) -a "${hw_tx[3]}" -gt $((hw_tx[1] / 8)) -a "${hw_tx[4]}" -gt $((hw_tx[1] / 8))

# Cutting a plane in the middle of a transfer: the other planes finish it. TOOL runs with
# -d mroce2 in ns2 (server) and -d mroce1 in ns1 (client). A perftest client whose clock
# calibration failed (`perftest_uncalibrated` in lib.sh) is run again, cut and all, twice at
# most.
cut_plane_during() { # what plane delay TOOL ARGS...
	local what="$1" k="$2" delay="$3" tool="$4" srv cli rc try cut_at
	shift 4
	for try in 1 2 3; do
		$IP netns exec ns2 timeout 90 "$tool" -d mroce2 "$@" >"$TAP_DIR/cut-server.log" 2>&1 &
		srv=$!
		sleep 1
		$IP netns exec ns1 timeout 90 "$tool" -d mroce1 "$@" $NS2_ADDR >"$TAP_DIR/cut-client.log" \
			2>"$TAP_DIR/cut-client.err" &
		cli=$!
		sleep "$delay"
		cut_at=$SECONDS
		$IP -n ns1 link set ${NS1_IF[$k]} down
		wait $cli && rc=0 || rc=$?
		wait $srv || rc=${rc/#0/server-failed}
		echo "# finished $((SECONDS - cut_at)) s after the cut"
		$IP -n ns1 link set ${NS1_IF[$k]} up
		wait_for 10 sh -c "grep -q '^$k ${NS1_IF[$k]} .* up\$' $P1"
		if [ "$rc" != 0 ] && [ "$try" != 3 ] && perftest_uncalibrated "$TAP_DIR/cut-client.err"; then
			echo "# perftest's clock calibration failed (TCG): run again"
			continue
		fi
		break
	done
	if [ "$rc" != 0 ]; then
		# Errors go to stderr, unbuffered: they would come before the buffered report.
		sed 's/^/# client stderr: /' "$TAP_DIR/cut-client.err"
		tail -n 15 "$TAP_DIR/cut-client.log" | sed 's/^/# /'
		tail -n 5 "$TAP_DIR/cut-server.log" | sed 's/^/# server: /'
		echo "# (exit status $rc)"
		local d c
		for d in mroce1 mroce2; do
			echo "# $d: $(cd /sys/class/infiniband/$d/ports/1/hw_counters && for c in retransmits timeouts retry_exceeded nak_sent_* nak_rcvd_* tx_errors tx_no_route rx_malformed rx_no_connection; do echo -n "$c $(cat $c) "; done)"
		done
	else
		grep -E '^ +[0-9]+ +[0-9]+ |bytes in' "$TAP_DIR/cut-client.log" | tail -n 1 | sed 's/^/# /'
	fi
	_tap "$rc" "$what"
}
cut_plane_during "ib_write_bw completes with plane 2 cut in the middle" 2 3 \
	ib_write_bw -x 1 --report_gbits -s 65536 -D 6
cut_plane_during "ibv_rc_pingpong -c completes with plane 1 cut in the middle" 1 2 \
	ibv_rc_pingpong -g 1 -n 1500 -s 4096 -c
check_output "a plane that comes back is listed up again" '^1 pl1a 10\.77\.1\.1 up$' cat $P1

check "remove plane 3 through metaroce-plane" sh -c "$PLANE_CLI del mroce1 pl3a && $PLANE_CLI del mroce2 pl3b"
check_no_output "the planes file no longer lists it" 'pl3a' cat $P1
check_output "its port is down again, without a netdev" 'mroce1/4 state DOWN physical_state DISABLED *$' \
	$IP netns exec ns1 $RDMA link show mroce1/4
hold_device mroce1
check "a plane added while the device is in use takes the free port 4" sh -c "echo +pl4a >$P1"
unhold
got="$(ports_of mroce1) $($IP netns exec ns1 $RDMA link show mroce1/4)"
check_output "port 4 is plane 3 on pl4a, the device still has 4 ports" '^4 .*mroce1/4 .*netdev pl4a' \
	echo "$got"
check "and it is removed again" sh -c "echo -pl4a >$P1"
perftest "ib_write_bw over the 3 remaining planes" ib_write_bw -s 65536 -n 100

teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
