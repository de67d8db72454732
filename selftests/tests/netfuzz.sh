#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# A hostile network: NETFUZZ_COUNT (default 1,000,000) mutated and random datagrams at both
# devices' UDP port while real traffic runs between them (selftests/py/netfuzz.py). ns1 sends
# to mroce2 and ns2 to mroce1, from the peer's own address, so they reach the real connection:
# mutations (bit flips, truncations, extensions, header fields and lengths pushed to extremes,
# conn_id/path_id/psn/msn/dst_qp varied) of the packets tcpdump captured during a warm-up
# (SEND, WRITE, READ, ACK with SACK bitmaps, HELLO, the connection manager's DATAGRAMs) and of
# packets built after docs/wire-format.md, and random datagrams of 0 to 9000 bytes; a share
# from an address neither device has a peer at (10.77.0.11, .12) and over IPv6.
# Then: no oops/WARN in the kernel log, every ibv_rc_pingpong run (data checked) during the
# fuzz completed, rx_malformed grew by what the fuzzers sent that fails the base header
# checks, the connection still carries data, no QP/MR left behind, rmmod works, and a fresh
# pair works. NETFUZZ_SEED fixes the fuzzers' choices (printed; the capture still differs).
# 2 to 2.5 minutes in the guest for 10^6 datagrams (80-100 s of fuzz at 10,000-12,000 a
# second under TCG; the rate and the suite's time are printed).
source "$(dirname "$0")/../lib.sh"
PY="$(dirname "$0")/../py/netfuzz.py"
NETFUZZ_COUNT="${NETFUZZ_COUNT:-1000000}"
NETFUZZ_SEED="${NETFUZZ_SEED:-$((RANDOM * 32768 + RANDOM))}"
STRANGER1=10.77.0.11
STRANGER2=10.77.0.12
dmesg_mark

counter() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2"; }
# resources: the RDMA resource summary of mroce1 and mroce2 (pd, cq, qp, cm_id, mr, ctx, srq).
resources() { $RDMA resource show | grep -E '^[0-9]+: mroce[12]: ' | sed 's/^[0-9]*: //'; }

# pingpong_run LOG ARGS...: one ibv_rc_pingpong (server in ns2, client in ns1), both ends'
# output in LOG; succeeds if both exit 0 and the client reports its transfer.
pingpong_run() {
	local log="$1" srv rc=0
	shift
	$IP netns exec ns2 timeout 40 ibv_rc_pingpong -d mroce2 -g 1 "$@" >"$log.srv" 2>&1 &
	srv=$!
	sleep 1
	$IP netns exec ns1 timeout 40 ibv_rc_pingpong -d mroce1 -g 1 "$@" $NS2_ADDR >"$log" 2>&1 || rc=$?
	[ "$rc" = 0 ] || kill "$srv" 2>/dev/null
	wait "$srv" || rc=${rc/#0/server-failed}
	sed 's/^/server: /' "$log.srv" >>"$log"
	[ "$rc" = 0 ] && grep -q 'bytes in .* seconds' "$log"
}

# exited_ok STATUS LOG: a fuzzer's exit status was 0 (else its log's end).
exited_ok() { [ "$1" = 0 ] || { tail -n 20 "$2"; return 1; }; }
# traffic_ok RUNS FAILED: at least 2 runs, none failed (else the log and the failed runs' ends).
traffic_ok() {
	[ "$1" -ge 2 ] && [ "$2" = 0 ] && return 0
	cat "$TAP_DIR/netfuzz-traffic.log"
	local f
	for f in $(sed -nE 's/^run ([0-9]+) FAILED.*/\1/p' "$TAP_DIR/netfuzz-traffic.log" | head -n 3); do
		echo "run $f:"
		tail -n 8 "$TAP_DIR/netfuzz-run-$f.log"
	done
	return 1
}
# resources_unchanged: the resource summary is what it was before any traffic.
resources_unchanged() {
	local now
	now=$(resources)
	[ "$now" = "$before_resources" ] && return 0
	printf 'before:\n%s\nnow:\n%s\n' "$before_resources" "$now"
	return 1
}

check "modprobe metaroce" modprobe metaroce
setup_pair metaroce mroce
# Addresses neither device will have a peer at.
$IP -n ns1 addr add $STRANGER1/24 dev veth1
$IP -n ns2 addr add $STRANGER2/24 dev veth2
before_resources=$(resources)
echo "# seed $NETFUZZ_SEED, count $NETFUZZ_COUNT"

# Warm-up, captured: the packets the fuzzers mutate (HELLO goes out with the first QP).
pcap="$TAP_DIR/netfuzz.pcap"
$IP netns exec ns2 tcpdump -i veth2 -s 0 -U -c 30000 -w "$pcap" udp port 4793 >/dev/null 2>&1 &
cap=$!
sleep 1
check "warm-up: ibv_rc_pingpong 4 KiB x 100, data checked" pingpong_run "$TAP_DIR/pp-warm.log" -n 100 -s 4096 -c
perftest "warm-up: ib_write_bw 64 KiB x 20" ib_write_bw -s 65536 -n 20
$IP netns exec ns2 timeout 30 rping -s -a $NS2_ADDR -v >/dev/null 2>&1 &
srv=$!
sleep 1
check_output "warm-up: rping (connection manager DATAGRAMs, RDMA READ and WRITE)" 'ping data' \
	$IP netns exec ns1 timeout 30 rping -c -a $NS2_ADDR -C 3 -v -V
wait "$srv" 2>/dev/null
sleep 0.5
kill "$cap" 2>/dev/null
wait "$cap" 2>/dev/null
check "tcpdump captured MetaRoCE packets ($(stat -c %s "$pcap") bytes)" test "$(stat -c %s "$pcap")" -gt 10000

malformed1=$(counter mroce1 rx_malformed)
malformed2=$(counter mroce2 rx_malformed)
noconn1=$(counter mroce1 rx_no_connection)
noconn2=$(counter mroce2 rx_no_connection)
packets1=$(counter mroce1 rx_packets)
packets2=$(counter mroce2 rx_packets)

# Real traffic for as long as the fuzzers send: ibv_rc_pingpong runs one after the other,
# every one with its data checked (-c), single- and multi-packet messages, one with events.
done_flag="$TAP_DIR/netfuzz-done"
rm -f "$done_flag" "$TAP_DIR"/netfuzz-run-*.log
(
	i=0
	while [ ! -e "$done_flag" ]; do
		i=$((i + 1))
		case $((i % 3)) in
		1) set -- -n 100 -s 4096 -c ;;
		2) set -- -n 20 -s 65536 -c ;;
		0) set -- -n 100 -s 1024 -c -e ;;
		esac
		if pingpong_run "$TAP_DIR/netfuzz-run-$i.log" "$@"; then
			echo "run $i ok: $*"
		else
			echo "run $i FAILED: $*"
		fi
	done
) >"$TAP_DIR/netfuzz-traffic.log" 2>&1 &
traffic=$!
sleep 2

half=$((NETFUZZ_COUNT / 2))
cpu_before=$(head -n 1 /proc/stat)
start=$EPOCHREALTIME
$IP netns exec ns1 nice -n 5 timeout 900 python3 "$PY" --dst $NS2_ADDR --dst6 fd77::2 \
	--stranger $STRANGER1 --count "$half" --seed "$NETFUZZ_SEED" --pcap "$pcap" --peer $NS1_ADDR \
	>"$TAP_DIR/netfuzz-1.out" 2>&1 &
fz1=$!
$IP netns exec ns2 nice -n 5 timeout 900 python3 "$PY" --dst $NS1_ADDR --dst6 fd77::1 \
	--stranger $STRANGER2 --count "$((NETFUZZ_COUNT - half))" --seed "$((NETFUZZ_SEED + 1))" \
	--pcap "$pcap" --peer $NS2_ADDR >"$TAP_DIR/netfuzz-2.out" 2>&1 &
fz2=$!
rc1=0 rc2=0
wait "$fz1" || rc1=$?
wait "$fz2" || rc2=$?
end=$EPOCHREALTIME
cpu_after=$(head -n 1 /proc/stat)
touch "$done_flag"
wait "$traffic"

out1=$(tail -n 1 "$TAP_DIR/netfuzz-1.out")
out2=$(tail -n 1 "$TAP_DIR/netfuzz-2.out")
echo "# ns1 -> mroce2: $out1"
echo "# ns2 -> mroce1: $out2"
# Where the guest's CPUs went meanwhile (user includes nice: the fuzzers run at nice 5).
awk -v a="$cpu_before" -v b="$cpu_after" 'BEGIN {
	split(a, A, " "); split(b, B, " ")
	for (i = 2; i <= 8; i++) { d[i] = B[i] - A[i]; t += d[i] }
	if (t > 0) printf "# CPU during the fuzz: user %.0f%% nice %.0f%% system %.0f%% idle %.0f%% irq %.0f%% softirq %.0f%%\n",
		100 * d[2] / t, 100 * d[3] / t, 100 * d[4] / t, 100 * (d[5] + d[6]) / t, 100 * d[7] / t, 100 * d[8] / t
}'
check "fuzzer ns1 -> mroce2 ran (exit $rc1)" exited_ok "$rc1" "$TAP_DIR/netfuzz-1.out"
check "fuzzer ns2 -> mroce1 ran (exit $rc2)" exited_ok "$rc2" "$TAP_DIR/netfuzz-2.out"
field() { printf '%s\n' "$1" | sed -nE "s/.*(^| )$2 ([0-9]+).*/\\2/p"; }
sent1=$(field "$out1" sent)
sent2=$(field "$out2" sent)
sent=$((${sent1:-0} + ${sent2:-0}))
secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
rate=$(awk -v n="$sent" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
check "sent $sent datagrams (${sent1:-0} to mroce2, ${sent2:-0} to mroce1) in $secs s, $rate/s: at least $NETFUZZ_COUNT" \
	test "$sent" -ge "$NETFUZZ_COUNT"

runs=$(grep -c '^run ' "$TAP_DIR/netfuzz-traffic.log")
failed_runs=$(grep -c 'FAILED' "$TAP_DIR/netfuzz-traffic.log")
check "real traffic during the fuzz: $runs ibv_rc_pingpong runs, data checked, all completed" \
	traffic_ok "$runs" "$failed_runs"

bad1=$(field "$out2" base_bad)
bad2=$(field "$out1" base_bad)
m1=$(($(counter mroce1 rx_malformed) - malformed1))
m2=$(($(counter mroce2 rx_malformed) - malformed2))
# Every datagram that fails the base header checks is counted, and nothing else is (the real
# traffic is well formed): as many as the fuzzer sent, less any the stack might drop before
# the device sees them (none so far; 1% allowed).
check "mroce1 rx_malformed grew by $m1: the ${bad1:-?} bad base headers the fuzzer sent it" \
	test "$m1" -gt 0 -a "$((100 * m1))" -ge "$((99 * ${bad1:-1}))" -a "$m1" -le "${bad1:-0}"
check "mroce2 rx_malformed grew by $m2: the ${bad2:-?} bad base headers the fuzzer sent it" \
	test "$m2" -gt 0 -a "$((100 * m2))" -ge "$((99 * ${bad2:-1}))" -a "$m2" -le "${bad2:-0}"
check "mroce1 and mroce2 took the rest as MetaRoCE packets (rx_packets +$(($(counter mroce1 rx_packets) - packets1)), +$(($(counter mroce2 rx_packets) - packets2)))" \
	test "$(($(counter mroce1 rx_packets) - packets1))" -gt "$(((${sent2:-0} - ${bad1:-0}) / 2))" \
	-a "$(($(counter mroce2 rx_packets) - packets2))" -gt "$(((${sent1:-0} - ${bad2:-0}) / 2))"
check "rx_no_connection grew (datagrams from strangers, over IPv6, to unknown QPs) (+$(($(counter mroce1 rx_no_connection) - noconn1)), +$(($(counter mroce2 rx_no_connection) - noconn2)))" \
	test "$(counter mroce1 rx_no_connection)" -gt "$noconn1" -a "$(counter mroce2 rx_no_connection)" -gt "$noconn2"
for d in mroce1 mroce2; do
	echo "# $d: $($RDMA statistic show link $d/1 | tr -s ' \n' ' ' | grep -Eo '(rx_[a-z_]+|retransmits|duplicates|timeouts|retry_exceeded|nak_[a-z_]+|datagrams_[a-z]+|hello_mtu_mismatch) [0-9]+' | grep -v ' 0$' | tr '\n' ' ')"
	sed "s/^/# $d peers: /" "/sys/class/infiniband/$d/peers" | head -n 8
done
check_no_output "kernel log clean after the fuzz (no oops, WARN, BUG)" "$KERNEL_TROUBLE" dmesg_since_mark

# The fuzzed connection still carries data, and nothing was left behind.
check "after the fuzz: ibv_rc_pingpong on the same connection, data checked" \
	pingpong_run "$TAP_DIR/pp-after.log" -n 200 -s 4096 -c
perftest "after the fuzz: ib_send_bw 64 KiB" ib_send_bw -s 65536 -n 50
check "no QP, MR, CQ or PD left behind by the traffic (rdma resource as before it)" resources_unchanged
teardown_pair
check_no_output "rdma resource: no metaroce device left after teardown" 'mroce' $RDMA resource show
check "rmmod metaroce" rmmod metaroce

# A fresh module and pair.
check "modprobe metaroce again" modprobe metaroce
setup_pair metaroce mroce
check "fresh pair: ibv_rc_pingpong, data checked" pingpong_run "$TAP_DIR/pp-fresh.log" -n 200 -s 4096 -c
teardown_pair
check "rmmod metaroce after the fresh pair" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, BUG, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
echo "# netfuzz took $SECONDS s"
suite_end
