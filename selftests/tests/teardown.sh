#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Teardown under traffic, as hot-unplug and crashes do it: the netdev removed, both ends killed
# with SIGKILL, `rdma link delete`, the link MTU changed, a CPU taken offline, and `rmmod`, each
# while ib_write_bw
# runs between the two namespaces. The devices go at once (the core disassociates the processes' contexts: their
# later calls fail), the processes can be killed at once, nothing is left behind (`rdma
# resource`: no QP or MR, the `peers` file: no QP), and the kernel log stays clean.
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce

# bw_start: ib_write_bw for up to 60 s, server in ns2 on mroce2, client in ns1 on mroce1, in
# the background ($SRV, $CLI); returns once data flows.
bw_start() {
	$IP netns exec ns2 ib_write_bw -d mroce2 -x 1 -D 60 -s 65536 >"$TAP_DIR/td-srv.log" 2>&1 &
	SRV=$!
	wait_for 20 sh -c "$IP netns exec ns2 ss -ltnH | grep -q ':18515 '"
	$IP netns exec ns1 ib_write_bw -d mroce1 -x 1 -D 60 -s 65536 $NS2_ADDR >"$TAP_DIR/td-cli.log" 2>&1 &
	CLI=$!
	wait_for 20 sh -c "[ \$(cat /sys/class/infiniband/mroce1/ports/1/hw_counters/tx_packets 2>/dev/null || echo 0) -gt 2000 ]"
}
# alive PID...: one of the PIDs is still a live process. A zombie is not (it has exited; only
# its status waits for this shell to reap it, and `kill -0` would still find it).
alive() {
	local p
	for p in "$@"; do
		[ -e "/proc/$p" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$p/status" 2>/dev/null && return 0
	done
	return 1
}
# gone SECS PID...: every PID has exited within SECS seconds (SIGKILL for those that did not);
# of one that did not, where it is stuck (state, kernel stack).
gone() {
	local secs="$1" p left=0 deadline=$((SECONDS + $1))
	shift
	while alive "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || { left=1; break; }
		sleep 0.2
	done
	for p in "$@"; do
		if [ "$left" = 1 ] && alive "$p"; then
			echo "$p: $(grep -E '^(Name|State):' "/proc/$p/status" | tr '\n' ' ')"
			cat "/proc/$p/stack" 2>/dev/null | head -n 12
		fi
		kill -9 "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	return $left
}
# no_device NAME...: none of the devices is registered any more.
no_device() {
	local d
	for d in "$@"; do $RDMA link show 2>/dev/null | grep -q "link $d/" && return 1; done
	return 0
}
# nothing_left DEV: no RC QP and no MR of DEV in `rdma resource`, no QP on a connection in its
# peers file (a connection lingers idle for a while after its last QP).
nothing_left() {
	local qps mrs peers
	qps=$($RDMA resource show qp link "$1/1" 2>/dev/null | grep -c 'type RC')
	mrs=$($RDMA resource show mr 2>/dev/null | grep -c "dev $1 ")
	peers=$(grep -c '^peer .* qps [1-9]' "/sys/class/infiniband/$1/peers")
	[ "$qps" = 0 ] && [ "$mrs" = 0 ] && [ "$peers" = 0 ] ||
		{ echo "$1: $qps RC QPs, $mrs MRs, $peers peers left"; return 1; }
}

# --- The netdev goes (veth1 and its peer veth2 with it).
setup_pair metaroce mroce
bw_start
t0=$SECONDS
$IP -n ns1 link del veth1
check "the netdev's removal under traffic removes mroce1 and mroce2 at once (within 10 s)" \
	wait_for 10 no_device mroce1 mroce2
echo "# devices gone after $((SECONDS - t0)) s"
# They busy-poll their CQs (in memory the device no longer fills) until a verb fails: they
# need not notice, but killing them must work at once (nothing of theirs hangs in the kernel).
kill -9 $CLI $SRV 2>/dev/null
check "both ib_write_bw ends go at once when killed" gone 10 $CLI $SRV
teardown_pair

# --- Both ends killed (SIGKILL) mid-transfer: their objects are destroyed with their files.
setup_pair metaroce mroce
bw_start
kill -9 $CLI $SRV
wait $CLI $SRV 2>/dev/null
check "after SIGKILL of both ends nothing is left on mroce1 (QPs, MRs, the connection)" \
	wait_for 10 nothing_left mroce1
check "nor on mroce2" wait_for 10 nothing_left mroce2
check "a new transfer works after the kill" sh -c "
	$IP netns exec ns2 timeout 60 ibv_rc_pingpong -d mroce2 -g 1 -n 50 -s 4096 -c >/dev/null 2>&1 &
	sleep 1
	$IP netns exec ns1 timeout 60 ibv_rc_pingpong -d mroce1 -g 1 -n 50 -s 4096 -c $NS2_ADDR"

# --- rdma link delete of one end mid-transfer: it goes at once; the other end's QP fails.
bw_start
$IP netns exec ns1 $RDMA link delete mroce1
check "rdma link delete mroce1 under traffic: gone within 10 s" wait_for 10 no_device mroce1
# The server only waits (WRITE is one-sided): it need not notice; it is killed.
kill -9 $CLI $SRV 2>/dev/null
check "both ib_write_bw ends go at once when killed" gone 10 $CLI $SRV
check "nothing is left on mroce2" wait_for 10 nothing_left mroce2
teardown_pair

# --- The link MTU changes on both ends mid-transfer, 1500 -> 1280 (1344-byte packets become
# 1024-byte ones) and back. A connection made with the old size cannot carry on (each end would
# reject the other's packets, and the old ones no longer fit the link): it is retired, its QPs
# fail (IB_EVENT_QP_FATAL), nothing is left, and new QPs get a connection of the new size.
# pingpong: ibv_rc_pingpong (50 x 4 KiB, data checked) from ns1 to ns2.
pingpong() {
	$IP netns exec ns2 timeout 60 ibv_rc_pingpong -d mroce2 -g 1 -n 50 -s 4096 -c >/dev/null 2>&1 &
	sleep 1
	$IP netns exec ns1 timeout 60 ibv_rc_pingpong -d mroce1 -g 1 -n 50 -s 4096 -c $NS2_ADDR
}
setup_pair metaroce mroce
bw_start
$IP -n ns1 link set veth1 mtu 1280
$IP -n ns2 link set veth2 mtu 1280
exited=0
wait_for 15 sh -c "for p in $CLI $SRV; do kill -0 \$p 2>/dev/null && exit 1; done; exit 0" && exited=1
kill -9 $CLI $SRV 2>/dev/null
crc=0
wait $CLI 2>/dev/null || crc=$?
wait $SRV 2>/dev/null
check "link MTU 1500 -> 1280 under traffic: ib_write_bw's QP fails, both ends exit within 15 s ($exited; client status $crc)" \
	test "$exited" = 1 -a "$crc" != 0
retired() { dmesg_since_mark | grep -c 'packets of 1024 payload bytes (were 1344); 1 connections retired'; }
check "both devices retired their connection of 1344-byte packets ($(retired) of 2 said so)" \
	test "$(retired)" = 2
both_clean() { nothing_left mroce1 && nothing_left mroce2; }
check "nothing is left on mroce1 or mroce2" wait_for 10 both_clean
check "a new transfer works with 1024-byte packets" pingpong
$IP -n ns1 link set veth1 mtu 1500
$IP -n ns2 link set veth2 mtu 1500
check "and back at MTU 1500, with 1344-byte packets" pingpong
check "the peers never saw each other's packets of another size (hello_mtu_mismatch 0)" \
	test "$(cat /sys/class/infiniband/mroce1/ports/1/hw_counters/hello_mtu_mismatch)" = 0
teardown_pair

# --- A CPU goes offline mid-transfer and comes back. The receive threads are per CPU, and a
# kick never goes to an offline CPU's thread (which could not run until the CPU is back): the
# transfer goes on while CPU 1 is offline and both ends finish well. The guest has 2 vCPUs.
# The transfer lasts 20 s: taking a CPU offline can take seconds on the debug kernel under
# TCG (a run of 8 s was over before the offline returned, and no packet was counted), and the
# check says how long it took.
CPU1=/sys/devices/system/cpu/cpu1/online
setup_pair metaroce mroce
$IP netns exec ns2 ib_write_bw -d mroce2 -x 1 -F -D 20 -s 65536 >"$TAP_DIR/td-srv.log" 2>&1 &
SRV=$!
wait_for 20 sh -c "$IP netns exec ns2 ss -ltnH | grep -q ':18515 '"
$IP netns exec ns1 ib_write_bw -d mroce1 -x 1 -F -D 20 -s 65536 $NS2_ADDR >"$TAP_DIR/td-cli.log" 2>&1 &
CLI=$!
tx() { cat /sys/class/infiniband/mroce1/ports/1/hw_counters/tx_packets; }
tx_above() { [ "$(tx)" -gt "$1" ]; }
wait_for 20 tx_above 2000
off=0
t0=$SECONDS
echo 0 >"$CPU1" && off=1
toff=$((SECONDS - t0))
sleep 1
tx0=$(tx)
sleep 2
tx1=$(tx)
running=0
alive $CLI && running=1
echo 1 >"$CPU1"
crc=0 src=0
wait $CLI || crc=$?
wait $SRV || src=$?
check "CPU 1 offline mid-transfer: it went offline ($off, in $toff s), ib_write_bw went on meanwhile ($tx0 -> $tx1 packets sent in 2 s, still running $running), both ends exit 0 (client $crc, server $src)" \
	test "$off" = 1 -a "$running" = 1 -a "$tx1" -gt "$((tx0 + 100))" -a "$crc" = 0 -a "$src" = 0
check "CPU 1 is back online" grep -qx 1 "$CPU1"
teardown_pair

# --- rmmod mid-transfer: the module goes with its devices; the processes' contexts are
# disassociated, so they do not pin it.
setup_pair metaroce mroce
bw_start
check "rmmod metaroce under traffic succeeds within 30 s" timeout 30 rmmod metaroce
check "mroce1 and mroce2 are gone" no_device mroce1 mroce2
kill -9 $CLI $SRV 2>/dev/null
check "both ib_write_bw ends go at once when killed" gone 10 $CLI $SRV
teardown_pair
check "modprobe metaroce again" modprobe metaroce
setup_pair metaroce mroce
check "a transfer works on the devices made again" sh -c "
	$IP netns exec ns2 timeout 60 ibv_rc_pingpong -d mroce2 -g 1 -n 50 -s 4096 -c >/dev/null 2>&1 &
	sleep 1
	$IP netns exec ns1 timeout 60 ibv_rc_pingpong -d mroce1 -g 1 -n 50 -s 4096 -c $NS2_ADDR"
teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
