#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Many QPs between two devices, all streams of one unified connection: perftest with 64 QPs
# (WRITE and SEND), then 2,000 QPs at once, with the kernel memory they take printed as
# diagnostics; afterwards the memory is given back; then 4 processes of 250 QPs each created
# at once; and the kernel log is clean.
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
setup_pair metaroce mroce

perftest "ib_write_bw 64 QPs" ib_write_bw -s 65536 -n 10 -q 64
perftest "ib_send_bw 64 QPs" ib_send_bw -s 16384 -n 10 -q 64

# Kernel memory in KiB: slab, vmalloc, and free pages (which also see large kmallocs and
# the user side: perftest's buffers, its mappings of the rings).
meminfo() { awk -v k="$1" '$1 == k":" { print $2 }' /proc/meminfo; }
snapshot() { echo "$(meminfo Slab) $(meminfo VmallocUsed) $(meminfo MemFree)"; }

# SCALE_QPS: fewer on the debug kernel (make check-debug), where creating 2,000 QPs under
# KASAN and lockdep takes longer than perftest's timeout.
QPS=${SCALE_QPS:-2000}
read -r slab0 vm0 free0 <<<"$(snapshot)"
during="$TAP_DIR/scale-during"
rm -f "$during"
# Sample while the QPs exist: the largest MemFree drop seen.
(
	min_free=$free0
	while [ ! -f "$TAP_DIR/scale-done" ]; do
		read -r s v f <<<"$(snapshot)"
		if [ "$f" -lt "$min_free" ]; then
			min_free=$f
			echo "$s $v $f" >"$during"
		fi
		sleep 0.5
	done
) &
sampler=$!
rm -f "$TAP_DIR/scale-done"
perftest "ib_write_bw $QPS QPs (one connection between the two devices)" \
	ib_write_bw -s 64 -n 5 -t 8 -q $QPS
touch "$TAP_DIR/scale-done"
wait $sampler
rm -f "$TAP_DIR/scale-done"
if [ -s "$during" ]; then
	read -r slab1 vm1 free1 <"$during"
	n=$((2 * QPS)) # both devices are in this guest
	echo "# $QPS QPs on each of the two devices: Slab +$((slab1 - slab0)) KiB," \
		"VmallocUsed +$((vm1 - vm0)) KiB (rings), MemFree -$((free0 - free1)) KiB (all, incl. user)"
	echo "# per QP: Slab $(((slab1 - slab0) / n)) KiB, vmalloc $(((vm1 - vm0) / n)) KiB," \
		"MemFree $(((free0 - free1) / n)) KiB"
fi
# Everything is given back once the QPs are gone (stream chunks included).
sleep 1
read -r slab2 vm2 free2 <<<"$(snapshot)"
echo "# after: Slab $((slab2 - slab0)) KiB, VmallocUsed $((vm2 - vm0)) KiB, MemFree $((free0 - free2)) KiB from the start"
if [[ " ${METAROCE_KERNEL_CHECKERS:-} " == *" kasan "* ]]; then
	# KASAN's quarantine holds freed objects (up to 1/32 of memory) before they go back, so
	# free memory does not return at once; there kmemleak judges what is left (run.sh).
	echo "# KASAN kernel: the memory given back is kmemleak's check after this suite"
else
	check "the memory of $QPS QPs is given back (MemFree within 8 MiB of before)" \
		test $((free0 - free2)) -lt 8192
fi
# No packet reached a connection without its QP, and none was retried out. Setup's own are
# counted apart: a HELLO that reached a device before any QP of it named the sender
# (rx_no_peer), and packets naming a connection one end had already made again after its linger
# (rx_wrong_connection); HELLO mends both.
counter() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2"; }
for dev in mroce1 mroce2; do
	noconn=$(counter $dev rx_no_connection) nopeer=$(counter $dev rx_no_peer)
	wrong=$(counter $dev rx_wrong_connection) retry=$(counter $dev retry_exceeded)
	check "$dev: no transport errors with $QPS QPs (rx_no_connection $noconn: rx_no_peer $nopeer, rx_wrong_connection $wrong, for no QP $((noconn - nopeer - wrong)); retry_exceeded $retry)" \
		test $((noconn - nopeer - wrong)) = 0 -a "$retry" = 0
done

# Several processes creating QPs and MRs at the same time on the same devices: each must get
# its own numbers (a race here once gave two QPs one number, and WQEs failed with
# LOC_PROT_ERR). 4 perftest pairs of 250 QPs each, started together, all complete.
procs_ok=0
spids=()
for k in 1 2 3 4; do
	$IP netns exec ns2 timeout 240 ib_write_bw -d mroce2 -x 1 -p $((18700 + k)) -s 4096 -n 20 \
		-t 8 -q 250 >"$TAP_DIR/conc-s$k.log" 2>&1 &
	spids+=($!)
done
# Under TCG the four servers take a while to listen.
wait_for 30 sh -c "[ \$($IP netns exec ns2 ss -ltnH 2>/dev/null | grep -c ':187[0-9][0-9] ') -ge 4 ]"
pids=()
for k in 1 2 3 4; do
	$IP netns exec ns1 timeout 240 ib_write_bw -d mroce1 -x 1 -p $((18700 + k)) -s 4096 -n 20 \
		-t 8 -q 250 $NS2_ADDR >"$TAP_DIR/conc-c$k.log" 2>&1 &
	pids+=($!)
done
# A client whose clock calibration failed after its transfer (see perftest_uncalibrated)
# has no report of its own; it counts only if it printed no error and its server, which
# exits 0 only after the client's closing handshake (every WRITE completed), did.
uncalibrated=0
for k in 1 2 3 4; do
	crc=0 src=0
	wait "${pids[k - 1]}" || crc=$?
	wait "${spids[k - 1]}" || src=$?
	if [ "$crc" = 0 ] && [ "$src" = 0 ]; then
		procs_ok=$((procs_ok + 1))
	elif [ "$src" = 0 ] && perftest_uncalibrated "$TAP_DIR/conc-c$k.log" &&
		! grep -qiE 'completion with error|failed status|couldn.t' "$TAP_DIR/conc-c$k.log"; then
		procs_ok=$((procs_ok + 1))
		uncalibrated=$((uncalibrated + 1))
	fi
done
for k in 1 2 3 4; do
	perftest_errors "$TAP_DIR/conc-c$k.log" "# process $k client: " | head -n 3
	perftest_errors "$TAP_DIR/conc-s$k.log" "# process $k server: " | head -n 3
done
check "4 processes x 250 QPs created and connected at once all complete ($procs_ok of 4; $uncalibrated of them finished but failed perftest's clock calibration)" \
	test "$procs_ok" = 4

teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
