#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# A malicious application against the module: metaroce_hostile_test (selftests/dv/) gets its
# QPs' rings through the direct verbs (metaroce_dv_qp_rings) and writes what no provider would
# into them, on RC QP pairs between mroce1 (ns1) and mroce2 (ns2): a garbage WQE, a producer
# index far beyond the ring (SQ and RQ), a garbage receive WQE met by the peer's SEND, a storm
# of random indices and doorbells, a QP destroyed while the kernel fails it; and a well-formed
# WQE with more SGEs than its QP was created with (an error completion, not a broken ring). Each attacked QP
# must be in the error state with IBV_EVENT_QP_FATAL delivered (exactly once) and its work
# requests flushed with IBV_WC_WR_FLUSH_ERR, nothing it named may be read or written, the
# device's ring_errors counter counts each, and well-behaved QPs on the same devices keep
# moving data (the program's own check, then the stock ibv_rc_pingpong).
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
setup_pair metaroce mroce
HOSTILE=$(command -v metaroce_hostile_test || echo /usr/local/bin/metaroce_hostile_test)
OUT="$TAP_DIR/hostile.out"
hw() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2" 2>/dev/null || echo -1; }

before=$(hw mroce1 ring_errors)
timeout 600 "$HOSTILE" --seed 20261201 --storm 10000 mroce1 mroce2 >"$OUT" 2>&1
hostile_rc=$?
after=$(hw mroce1 ring_errors)
grep -Ev '^(ok|FAIL) ' "$OUT" | sed 's/^#* \{0,1\}/# /'

# expect NAME "what": the program printed "ok NAME" (its "FAIL NAME: why" otherwise).
expect() {
	if grep -qx "ok $1" "$OUT"; then
		_tap 0 "$2"
		return
	fi
	grep "^FAIL $1:" "$OUT" | sed 's/^/# /' | grep . || echo "# no result for $1: the program stopped before it"
	_tap 1 "$2"
}
expect sq_garbage_event "SQ, a garbage WQE then 3 valid ones: IBV_EVENT_QP_FATAL delivered"
expect sq_garbage_state "SQ garbage: ibv_query_qp says IBV_QPS_ERR"
expect sq_garbage_flush "SQ garbage: the 4 WQEs flushed (IBV_WC_WR_FLUSH_ERR) in ring order, nothing else"
expect sq_overflow_event "SQ producer index 2^30 beyond the ring: IBV_EVENT_QP_FATAL delivered"
expect sq_overflow_state "SQ overflow: IBV_QPS_ERR"
expect sq_overflow_nothing_taken "SQ overflow: nothing taken from the lying ring (no completion, consumer index unmoved, peer untouched)"
expect sq_overflow_flush "SQ overflow: with the index back in range the next doorbell flushes its 2 WQEs"
expect sq_overflow_peer_untouched "SQ overflow: the flushed RDMA WRITEs never reached the peer"
expect rq_overflow_taken "RQ: 2 posted receives taken into the transport at a doorbell"
expect rq_overflow_event "RQ producer index 2^31 away: IBV_EVENT_QP_FATAL delivered"
expect rq_overflow_state "RQ overflow: IBV_QPS_ERR"
expect rq_overflow_flush "RQ overflow: the 2 receives flushed (IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV)"
expect rq_garbage_event "RQ, a garbage receive WQE met by the peer's SEND: IBV_EVENT_QP_FATAL delivered"
expect rq_garbage_state "RQ garbage: IBV_QPS_ERR"
expect rq_garbage_flush "RQ garbage: both receive WQEs flushed in ring order"
expect rq_garbage_nothing_placed "RQ garbage: the SEND's data placed nowhere"
expect rq_garbage_sender "RQ garbage: the peer's SEND does not complete successfully"
expect long_list_completions "a WRITE with 6 SGEs on a QP created with 1 (well formed): after the WRITE before it succeeds, IBV_WC_LOC_QP_OP_ERR, the one after flushed"
expect long_list_state "that QP: IBV_QPS_ERR (no QP_FATAL, no ring error: a bad request, not a broken ring)"
expect storm_doorbells "storm: 10000 random producer indices and entries, a doorbell each, all doorbells answered"
expect storm_event "storm: IBV_EVENT_QP_FATAL delivered"
expect storm_state "storm: IBV_QPS_ERR"
expect storm_calm_qp "storm: 10000 empty doorbells leave a well-behaved QP in RTS"
expect storm_calm_data "storm: that QP then RDMA-writes 64 KiB and SENDs 256 B, data verified"
expect storm_failed_qp "storm: 10000 doorbells on a QP in the error state are answered, it stays in IBV_QPS_ERR"
expect ring_errors_counted "ring_errors on mroce1 counted exactly the 5 QPs failed"
expect ring_errors_peer_unchanged "ring_errors on mroce2 unchanged"
expect destroy_while_failing "a QP destroyed while the kernel fails it (broken RQ, a SEND arriving) goes cleanly"
expect healthy_pair "a new pair on the same devices RDMA-writes 64 KiB and SENDs, data verified"
expect events_exactly_once "exactly one IBV_EVENT_QP_FATAL per failed QP, none for the others, no other QP event (port events are the device's)"
expect teardown "every QP, CQ, MR destroyed cleanly"
# hostile_exit STATUS: 0 exactly when every result was ok, 1 when one failed (2, 3, 124, a
# signal: it broke). An argument: check's own `rc` is local, a global would be shadowed.
hostile_exit() {
	case "$1" in
	0) ! grep -q '^FAIL ' "$OUT" && grep -qx 'ok teardown' "$OUT" ;;
	1) grep -q '^FAIL ' "$OUT" ;;
	*) false ;;
	esac
}
check "metaroce_hostile_test exit status agrees with its results (exit $hostile_rc)" \
	hostile_exit "$hostile_rc"
check "ring_errors hardware counter of mroce1 grew by 5 or more ($before -> $after)" \
	test "$before" -ge 0 -a $((after - before)) -ge 5
check_output "rdma statistic shows ring_errors" 'ring_errors [1-9]' $RDMA statistic show link mroce1/1

# The devices still serve well-behaved applications: the stock pingpong, data checked.
$IP netns exec ns2 timeout 60 ibv_rc_pingpong -d mroce2 -g 1 -n 200 -s 4096 -c \
	>"$TAP_DIR/pp-server.log" 2>&1 &
srv=$!
sleep 1
check_output "ibv_rc_pingpong afterwards, 4 KiB x 200, data checked (-c)" 'bytes in .* seconds' \
	$IP netns exec ns1 timeout 60 ibv_rc_pingpong -d mroce1 -g 1 -n 200 -s 4096 -c $NS2_ADDR
wait $srv || { echo "# server:"; sed 's/^/# /' "$TAP_DIR/pp-server.log"; }

teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
