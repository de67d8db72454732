#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The RDMA connection manager (rdma_cm) with stock tools between two namespaces: rping with its
# data validated, ucmatose (1 and 2 connections), librdmacm's rdma_server/rdma_client, perftest
# over rdma_cm (-R), qperf's RC tests over rdma_cm (-cm1) and rping over IPv6. Servers in ns2,
# clients in ns1; both ends must exit 0 and the client must report what it did.
#
# RDMACM_TYPES: the device types to run, TYPE:PREFIX each, in order (default "metaroce:mroce").
# "rxe:rxe metaroce:mroce" runs the same checks on rxe first as a baseline (its TAP lines start
# with "rxe:"); rxe is the reference for what the tools print, not part of the product.
# In the guest rxe's run takes about 40 s; one that fails fast about 35 s, and each check that
# hangs instead costs its client's timeout (CLI_TIMEOUT, 45 s).
source "$(dirname "$0")/../lib.sh"
dmesg_mark

RDMACM_TYPES="${RDMACM_TYPES:-metaroce:mroce}"
NS2_ADDR6=fd77::2
SRV_TIMEOUT=60 # a server outlives its client's timeout by the second between them and more
CLI_TIMEOUT=45

# The server is ready once it listens: an rdma_cm ID in LISTEN (rping, ucmatose, rdma_server,
# perftest -R) or, for qperf (whose rdma_cm ID comes with the client's request), its TCP
# control socket in ns2. A client started a fixed second after its server can find no
# listener on a loaded host (the CM rejects it, reason 8); perftest also has a second listen of
# its own to race with (`perftest_lost_listen_race`).
cm_listening() {
	$RDMA resource show cm_id 2>/dev/null | grep -q 'state LISTEN' ||
		$IP netns exec ns2 ss -Hltn 2>/dev/null | grep -q .
}

# cm_run "what" REGEX SERVER_CMD... -- CLIENT_CMD...: the server in ns2 in the background, the
# client in ns1 once the server listens (`cm_listening`, at most 15 s). Succeeds when both exit 0 and the client's output matches
# REGEX; otherwise prints the ends of both logs as TAP diagnostics. The client's output is
# left in $TAP_DIR/cm-client.log, the server's in $TAP_DIR/cm-server.log.
cm_run() {
	local what="$1" re="$2" srv crc=0 src=0
	local -a scmd=()
	shift 2
	while [ "$1" != -- ]; do scmd+=("$1"); shift; done
	shift
	$IP netns exec ns2 timeout "$SRV_TIMEOUT" "${scmd[@]}" >"$TAP_DIR/cm-server.log" 2>&1 &
	srv=$!
	wait_for 15 cm_listening || echo "# $what: the server is not listening after 15 s"
	$IP netns exec ns1 timeout "$CLI_TIMEOUT" "$@" >"$TAP_DIR/cm-client.log" 2>&1 || crc=$?
	# A client that failed leaves its server waiting for nobody; what rdma_cm held then is
	# printed below.
	local ids=""
	if [ "$crc" != 0 ]; then
		ids=$($RDMA resource show cm_id 2>&1)
		kill "$srv" 2>/dev/null
	fi
	wait "$srv" || src=$?
	if [ "$crc" = 0 ] && [ "$src" = 0 ] && grep -Eq -- "$re" "$TAP_DIR/cm-client.log"; then
		return 0
	fi
	echo "# $what: client: $*"
	tail -n 12 "$TAP_DIR/cm-client.log" | sed 's/^/# client: /'
	echo "# $what: server: ${scmd[*]}"
	tail -n 6 "$TAP_DIR/cm-server.log" | sed 's/^/# server: /'
	[ -z "$ids" ] || printf '%s\n' "$ids" | sed 's/^/# cm_id when the client failed: /'
	# Both devices' QPs, connections and error counters as the failure left them (for a
	# metaroce pair; rxe's files differ).
	local d c
	for d in ${PREFIX_DEVS:-}; do
		$RDMA resource show qp link "$d/1" 2>/dev/null | sed "s/^/# $d: /"
		head -n 20 "/sys/class/infiniband/$d/peers" 2>/dev/null | sed "s/^/# $d: /"
		for c in retransmits timeouts duplicates nak_sent_rnr nak_rcvd_rnr rnr_retries retry_exceeded ring_errors rx_no_connection datagrams_dropped; do
			printf '%s %s ' $c "$(cat "/sys/class/infiniband/$d/ports/1/hw_counters/$c" 2>/dev/null)"
		done | sed "s/^/# $d: /"
		echo
	done
	echo "# (client exit $crc$([ "$crc" = 124 ] && echo ' timed out'), server exit $src$(
		[ "$crc" != 0 ] && echo ', killed after the client failed'; [ "$src" = 124 ] && echo ' timed out'
	), wanted /$re/ from the client)"
	return 1
}

# cm_check "what" REGEX SERVER_CMD... -- CLIENT_CMD...: cm_run as one TAP line.
cm_check() {
	local rc=0
	cm_run "$@" || rc=1
	_tap "$rc" "$1"
}

# cm_perftest TYPE PREFIX "what" TOOL ARGS...: TOOL over rdma_cm (-R; the GID comes from the
# address, so no -x), server on ${PREFIX}2, client on ${PREFIX}1, and a result line. As in
# lib.sh's perftest, a failed clock calibration under TCG is retried, twice at most.
# So is a lost race of perftest's own: with -R it makes two connections one after the other,
# the first to exchange parameters (the server listens, accepts, destroys that listener), then
# the test's (the server listens again); a client whose second REQ arrives before the second
# listen is rejected by the CM with reason 8 (IB_CM_REJ_INVALID_SERVICE_ID) and gives up. Seen
# in 1 of 36 runs in a loop on a loaded TCG guest, each time with the server holding the first
# connection (a cm_id with a dst-addr) when the client failed; only that is retried.
perftest_lost_listen_race() {
	grep -q 'RDMA_CM_EVENT_REJECTED; error: 8' "$TAP_DIR/cm-client.log" &&
		grep -q 'cm_id when the client failed: .* dst-addr ' "$TAP_DIR/cm-diag"
}
cm_perftest() {
	local type="$1" prefix="$2" what="$3" tool="$4" try rc
	shift 4
	for try in 1 2 3; do
		rc=0
		cm_run "$type: $what" '^ +[0-9]+ +[0-9]+ +[0-9.]+' \
			"$tool" -d "${prefix}2" -R --report_gbits "$@" -- \
			"$tool" -d "${prefix}1" -R --report_gbits "$@" "$NS2_ADDR" >"$TAP_DIR/cm-diag" || rc=1
		if [ "$rc" != 0 ] && [ "$try" != 3 ] && perftest_uncalibrated "$TAP_DIR/cm-client.log"; then
			continue
		fi
		if [ "$rc" != 0 ] && [ "$try" != 3 ] && perftest_lost_listen_race; then
			echo "# $type: $what: perftest's client lost the race to the server's second listen (REJ 8), run again"
			continue
		fi
		break
	done
	if [ "$rc" = 0 ]; then
		echo "# $(grep -E '^ +[0-9]+ +[0-9]+ +[0-9.]+' "$TAP_DIR/cm-client.log" | tail -n 1)"
	else
		grep -Ev '^ (GID|local address|remote address)|^-+$|^ [A-Za-z* ]+ +: ' "$TAP_DIR/cm-diag"
	fi
	_tap "$rc" "$type: $what"
}

# qperf_cm TYPE TEST: one of qperf's RC tests over rdma_cm (-cm1; with it qperf takes the device
# and the GID from the address, so no -i), against the qperf server running in ns2; the client
# must print a number. qperf 0.4.11 tells the client the server's rdma_cm port before it listens
# (fixed upstream after 0.4.11, "Fix rdmacm race"): a run the server rejected is retried once.
qperf_cm() {
	local type="$1" t="$2" out rc try
	for try in 1 2; do
		out=$($IP netns exec ns1 timeout "$CLI_TIMEOUT" qperf -cm1 -t 2 "$NS2_ADDR" "$t" 2>&1) && rc=0 || rc=$?
		if [ "$try" = 1 ] && printf '%s\n' "$out" | grep -q 'unexpected event from RDMA CM: Event rejected'; then
			echo "# qperf $t: the server rejected the first connection (its listen race), again"
			continue
		fi
		break
	done
	check_output "$type: qperf -cm1 $t" '^ *(bw|latency) *= *[0-9.]+ [A-Za-z/]+' \
		sh -c 'printf "%s\n" "$1"; exit "$2"' sh "$out" "$rc"
	printf '%s\n' "$out" | grep -E '^ *(bw|latency) *=' | sed "s/^ */# $t: /"
}

# mckey_check TYPE: rdma_cm's multicast (mckey, UD QPs attached to an IPv4 group): the
# receiver in ns2 joins the group, which the host then has joined on veth2 (what rdma_cm and
# the device's attach do, so that the stack accepts the group's datagrams); the sender in ns1
# joins too and sends 20 datagrams to the group; the receiver must get all 20 (no loss on a
# veth) and both leave: the group is gone from veth2 afterwards.
MC_GROUP=230.77.0.9
# `ip maddr` prints "inet  GROUP", and "users N" after it when more than one joined.
mc_joined() { $IP -n ns2 maddr show dev veth2 | grep -Eq "inet +$MC_GROUP( |\$)"; }
mckey_check() {
	local type="$1" rc=0 srv
	$IP netns exec ns2 timeout "$SRV_TIMEOUT" mckey -m $MC_GROUP -b "$NS2_ADDR" -C 20 \
		>"$TAP_DIR/mckey-recv.log" 2>&1 &
	srv=$!
	# The receiver waits 3 s after its join before it polls, the sender 3 s before it sends.
	wait_for 15 mc_joined || { echo "# mckey: veth2 has not joined $MC_GROUP after 15 s"; rc=1; }
	$IP netns exec ns1 timeout "$CLI_TIMEOUT" mckey -m $MC_GROUP -b "$NS1_ADDR" -s -C 20 \
		>"$TAP_DIR/mckey-send.log" 2>&1 || rc=1
	wait $srv || rc=1
	grep -q 'data transfers complete' "$TAP_DIR/mckey-recv.log" || rc=1
	if [ "$rc" != 0 ]; then
		tail -n 8 "$TAP_DIR/mckey-send.log" | sed 's/^/# sender: /'
		tail -n 8 "$TAP_DIR/mckey-recv.log" | sed 's/^/# receiver: /'
	fi
	_tap $rc "$type: mckey, 20 datagrams to the multicast group $MC_GROUP, each received in the other namespace"
	check "$type: the group left with its last member (not joined on veth2)" wait_for 5 sh -c "! $IP -n ns2 maddr show dev veth2 | grep -Eq 'inet +$MC_GROUP( |\$)'"
}

# The checks, for one device type: its devices ${PREFIX}1 in ns1 and ${PREFIX}2 in ns2.
rdmacm_checks() {
	local type="$1" prefix="$2" failed_before
	failed_before=$(cat "$TAP_DIR/failed" 2>/dev/null | wc -l)
	echo "# rdma_cm on $type (${prefix}1 in ns1 at $NS1_ADDR, ${prefix}2 in ns2 at $NS2_ADDR)"

	cm_check "$type: rping, 10 pings of 256 bytes, data validated (-V)" 'ping data: rdma-ping-9: ' \
		rping -s -a "$NS2_ADDR" -S 256 -v -- \
		rping -c -a "$NS2_ADDR" -C 10 -S 256 -v -V
	cm_check "$type: ucmatose, 1 connection" 'return status 0' \
		ucmatose -- \
		ucmatose -s "$NS2_ADDR"
	cm_check "$type: ucmatose, 2 connections (-c 2)" 'return status 0' \
		ucmatose -c 2 -- \
		ucmatose -s "$NS2_ADDR" -c 2
	# rdmacm-utils ships both (the image's package list has it).
	cm_check "$type: rdma_server / rdma_client (librdmacm example)" 'rdma_client: end 0' \
		rdma_server -s "$NS2_ADDR" -- \
		rdma_client -s "$NS2_ADDR"

	cm_check "$type: udaddy, UD QPs through rdma_cm, 10 datagrams each way" 'return status 0' \
		udaddy -- \
		udaddy -s "$NS2_ADDR"
	mckey_check "$type"

	cm_perftest "$type" "$prefix" "ib_write_bw -R, 4 KiB x 200" ib_write_bw -s 4096 -n 200
	cm_perftest "$type" "$prefix" "ib_send_bw -R, 4 KiB x 200" ib_send_bw -s 4096 -n 200
	cm_perftest "$type" "$prefix" "ib_read_lat -R, 64 bytes x 200" ib_read_lat -s 64 -n 200

	# The qperf server outlives its four clients, each retried once at most.
	$IP netns exec ns2 timeout $((CLI_TIMEOUT * 8 + 10)) qperf >"$TAP_DIR/qperf-server.log" 2>&1 &
	local qsrv=$! t
	wait_for 15 cm_listening || echo "# qperf: the server is not listening after 15 s"
	for t in rc_bw rc_lat rc_rdma_write_bw rc_rdma_read_bw; do
		qperf_cm "$type" "$t"
	done
	$IP netns exec ns1 timeout 10 qperf "$NS2_ADDR" quit >/dev/null 2>&1
	kill "$qsrv" 2>/dev/null
	wait "$qsrv" 2>/dev/null
	if grep -q . "$TAP_DIR/qperf-server.log"; then sed 's/^/# qperf server: /' "$TAP_DIR/qperf-server.log" | tail -n 5; fi

	cm_check "$type: rping over IPv6 ($NS2_ADDR6), 5 pings, data validated" 'ping data: rdma-ping-4: ' \
		rping -s -a "$NS2_ADDR6" -v -- \
		rping -c -a "$NS2_ADDR6" -C 5 -v -V

	# What the kernel said about the connection manager and the MADs, when something failed.
	if [ "$(cat "$TAP_DIR/failed" 2>/dev/null | wc -l)" != "$failed_before" ]; then
		dmesg_since_mark | grep -Ei "ib_mad|ib_cm|rdma_cm|cma|mad|gsi|qp1|$type|$prefix" | tail -n 20 | sed 's/^/# dmesg: /'
	fi
}

for pair in $RDMACM_TYPES; do
	type="${pair%%:*}" prefix="${pair#*:}"
	module="$type"
	[ "$type" = rxe ] && module=rdma_rxe
	check "$type: modprobe $module" modprobe "$module"
	setup_pair "$type" "$prefix"
	PREFIX_DEVS="${prefix}1 ${prefix}2"
	rdmacm_checks "$type" "$prefix"
	teardown_pair
	check "$type: rmmod $module" rmmod "$module"
done
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
