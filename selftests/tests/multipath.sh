#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Multipath over an ECMP fabric (selftests/fabric.sh): h1 and h2 behind two leaves and four
# spines that hash on the UDP source port. A connection's paths are its source ports, so:
# traffic spreads over every path and, as the hash places them, over the spines; transfers
# survive a spine link blackholed and a spine taken out mid-run and recover their throughput;
# a lossy spine costs about its share; reordering across paths costs no retransmits. Then
# planes: one multi-plane device over 1, 4 and 8 planes, scaling with them, and a plane cut.
#
# Throughput is read from interface counters (h2's uplink, every 0.5 s), not from perftest's
# clock, which TCG sometimes upsets. Spines are limited to $MP_RATE each so that TCG can fill
# them, and mark ECN as they fill (FAB_ECN, codel), as the switches MetaRoCE is built for do.
# How evenly 16 random source ports hash over 4 spines is the hash's business, not checked
# (the spines used are checked to be those the hash picks).
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../fabric.sh"
dmesg_mark
modprobe metaroce

MP_RATE="${MP_RATE:-10mbit}"
PLANE_RATE="${PLANE_RATE:-4mbit}"
export FAB_ECN="${FAB_ECN:-1}"
CNT=/sys/class/infiniband/mroce1/ports/1/hw_counters
CNT2=/sys/class/infiniband/mroce2/ports/1/hw_counters
PORT=18515

fab_leafspine 4
fab_add_devices metaroce mroce
check "leaf/spine fabric: h1 reaches h2 over 4 spines" \
	$IP netns exec h1 ping -c 1 -W 5 $FAB_H2_ADDR

# bw_start TOOL ARGS...: TOOL's server in h2 on mroce2, its client in h1 on mroce1, in the
# background; bw_wait then says whether both succeeded and leaves the client's output in
# $TAP_DIR/bw.log and its result line in $BW_LINE.
bw_start() {
	$IP netns exec h2 timeout 90 "$@" -d mroce2 -x 1 -p $PORT --report_gbits \
		>"$TAP_DIR/bw-server.log" 2>&1 &
	BW_SRV=$!
	wait_for 20 listening h2 $PORT
	$IP netns exec h1 timeout 90 "$@" -d mroce1 -x 1 -p $PORT --report_gbits $FAB_H2_ADDR \
		>"$TAP_DIR/bw.log" 2>&1 &
	BW_CLI=$!
	# A run still going after 30 s (they take seconds) is stuck: what both devices' data
	# paths looked like then, for bw_wait to show.
	rm -f "$TAP_DIR/bw-stuck.log"
	(
		sleep 30
		kill -0 $BW_CLI 2>/dev/null || exit 0
		for d in mroce1 mroce2; do
			echo "$d: $(cat /sys/class/infiniband/$d/peers 2>/dev/null | head -n 24 | tr '\n' ';')"
		done >"$TAP_DIR/bw-stuck.log"
	) &
	BW_WATCH=$!
}
bw_wait() {
	local rc=0 cli=0
	wait $BW_CLI || cli=1
	wait $BW_SRV || rc=1
	kill $BW_WATCH 2>/dev/null
	wait $BW_WATCH 2>/dev/null
	BW_LINE=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$TAP_DIR/bw.log" | tail -n 1)
	# perftest calibrates its clock only to print the report, after every transfer completed
	# (lib.sh): a client that failed there alone moved its data and has no figure (BW_UNCAL).
	BW_UNCAL=0
	if [ "$cli" != 0 ] && [ -z "$BW_LINE" ] && perftest_uncalibrated "$TAP_DIR/bw.log" &&
		! grep -qiE 'fail|error' "$TAP_DIR/bw.log"; then
		BW_UNCAL=1
		cli=0
		echo "# perftest's clock calibration failed after the transfer: no figure from it"
	fi
	[ "$cli" = 0 ] || rc=1
	[ -n "$BW_LINE" ] || [ "$BW_UNCAL" = 1 ] || rc=1
	if [ -s "$TAP_DIR/bw-stuck.log" ]; then
		sed 's/^/# stuck after 30 s: /' "$TAP_DIR/bw-stuck.log"
	fi
	if [ "$rc" != 0 ]; then
		# A failed clock calibration is perftest's, not the transfer's (lib.sh).
		perftest_errors "$TAP_DIR/bw.log" '# error: '
		grep -Ev '^ (GID|local address|remote address)|^-+$|^ [A-Za-z* ]+ +: ' \
			"$TAP_DIR/bw.log" | tail -n 10 | sed 's/^/# /'
		tail -n 5 "$TAP_DIR/bw-server.log" | sed 's/^/# server: /'
		# Both devices' connections as the failure left them, and how their ids were agreed.
		for d in mroce1 mroce2; do
			head -n 24 /sys/class/infiniband/$d/peers 2>/dev/null | sed "s/^/# $d: /"
			for c in peer_restarts hello_unproven rx_no_connection duplicates rx_out_of_window; do
				printf '%s %s ' $c "$(cat /sys/class/infiniband/$d/ports/1/hw_counters/$c 2>/dev/null)"
			done | sed "s/^/# $d: /"
			echo
		done
	fi
	return $rc
}
# The average Gb/s of $BW_LINE in Mbit/s.
bw_mbit() { echo "$BW_LINE" | awk '{ printf "%.1f", $4 * 1000 }'; }
# bw_measure TOOL ARGS...: bw_start and bw_wait for a run whose figure is wanted: one whose
# figure perftest could not give (BW_UNCAL) is run again, twice at most, as lib.sh's perftest.
bw_measure() {
	local try
	for try in 1 2 3; do
		bw_start "$@"
		bw_wait || return 1
		[ "$BW_UNCAL" = 1 ] || return 0
	done
	return 1
}

# pp_start ARGS...: ibv_rc_pingpong (data checked with -c by the caller's ARGS) h1 -> h2 in
# the background; pp_wait: both ends succeeded.
pp_start() {
	$IP netns exec h2 timeout 90 ibv_rc_pingpong -d mroce2 -g 1 -p $PORT "$@" \
		>"$TAP_DIR/pp-server.log" 2>&1 &
	PP_SRV=$!
	wait_for 20 listening h2 $PORT
	$IP netns exec h1 timeout 90 ibv_rc_pingpong -d mroce1 -g 1 -p $PORT "$@" $FAB_H2_ADDR \
		>"$TAP_DIR/pp.log" 2>&1 &
	PP_CLI=$!
}
# pp_midrun: waits until the pingpong has moved 100 of its messages (mroce2's datagrams), then
# checks that it is still running: the cut that follows must hit it mid-run, or the check
# after it would pass for a pingpong the cut never touched. PP_COUNT messages make it last
# several seconds at the fabric's TCG pace.
PP_COUNT=3000
pp_midrun() {
	local rx0="$1"
	wait_for 30 sh -c "[ \$(cat $CNT2/rx_packets) -gt $((rx0 + 100)) ]"
	check "the pingpong is running when the cut comes" kill -0 $PP_CLI
}
pp_wait() {
	local rc=0
	wait $PP_CLI || rc=1
	wait $PP_SRV || rc=1
	grep -q 'bytes in .* seconds' "$TAP_DIR/pp.log" || rc=1
	if [ "$rc" != 0 ]; then
		tail -n 5 "$TAP_DIR/pp.log" | sed 's/^/# /'
		tail -n 5 "$TAP_DIR/pp-server.log" | sed 's/^/# server: /'
	fi
	return $rc
}

# Device counters: ctr NAME [DIR] and, over all paths, paths NAME (one value per path).
ctr() { cat "${2:-$CNT}/$1"; }
paths() { local i; for i in $(seq 0 15); do ctr path${i}_$1; done; }
# sub "a b c" "x y z": element-wise difference.
sub() { awk -v a="$(echo $1)" -v b="$(echo $2)" 'BEGIN { n = split(a, x, " "); split(b, y, " ");
	for (i = 1; i <= n; i++) printf "%s ", x[i] - y[i] }'; }
# within LO HI VALUES...: every value within [LO, HI] times their mean.
within() {
	local lo="$1" hi="$2"
	shift 2
	echo "$@" | awk -v lo="$lo" -v hi="$hi" '{ for (i = 1; i <= NF; i++) s += $i; m = s / NF;
		for (i = 1; i <= NF; i++) if (m == 0 || $i < lo * m || $i > hi * m) exit 1 }'
}
# shares VALUES...: each value as a percentage of their sum.
shares() { echo "$@" | awk '{ for (i = 1; i <= NF; i++) s += $i; for (i = 1; i <= NF; i++) printf "%.0f%% ", s ? 100 * $i / s : 0 }'; }

# Timeline of h2's received bytes, every 0.5 s: sample_start COUNT, then sample_stop.
sample_start() {
	rm -f "$TAP_DIR/sample-stop"
	fab_sample h2 eth0 rx_bytes 0.5 "$1" "$TAP_DIR/sample-stop" >"$TAP_DIR/samples" &
	SAMPLER=$!
}
sample_stop() {
	touch "$TAP_DIR/sample-stop"
	wait $SAMPLER
}
# rate T0 T1: Mbit/s received between T0 and T1 (seconds since the epoch), the counter
# interpolated between the samples around each (a loaded host samples irregularly).
rate() {
	awk -v a="$1" -v b="$2" '{ t[n] = $1; v[n++] = $2 }
		function at(x,  i) { if (x <= t[0]) return v[0]; for (i = 1; i < n; i++) if (x <= t[i])
			return v[i - 1] + (v[i] - v[i - 1]) * (x - t[i - 1]) / (t[i] - t[i - 1]); return v[n - 1] }
		END { printf "%.1f", (n > 1 && b > a) ? (at(b) - at(a)) * 8 / (b - a) / 1e6 : 0 }' "$TAP_DIR/samples"
}
# dip T0 T1: the lowest rate over 0.5 s between T0 and T1, Mbit/s.
dip() {
	local t="$1" r min=""
	while ge "$2" "$(plus "$t" 0.5)"; do
		r=$(rate "$t" "$(plus "$t" 0.5)")
		if [ -z "$min" ] || ge "$min" "$r"; then min=$r; fi
		t=$(plus "$t" 0.25)
	done
	echo "${min:-0}"
}
# timeline T_CUT T_END: the 0.5 s rates, Mbit/s, "|" at the cut, "]" at T_END.
timeline() {
	awk -v c="$1" -v e="$2" '{ if (n++) { if (!m && $1 >= c) { printf "| "; m = 1 }
		if (!f && $1 >= e) { printf "] "; f = 1 }
		printf "%.0f ", ($2 - v) * 8 / ($1 - t) / 1e6 } t = $1; v = $2 }' "$TAP_DIR/samples"
}
# plus T D: T + D seconds.
plus() { awk -v t="$1" -v d="$2" 'BEGIN { printf "%.3f", t + d }'; }
now() { date +%s.%N; }
# listening NS PORT: a TCP socket listens on PORT in NS (a perftest or pingpong server is up).
listening() { $IP netns exec "$1" ss -Hltn "sport = :$2" | grep -q .; }
# rx_above BYTES: h2 has received more than BYTES.
rx_above() { [ "$(fab_stat h2 eth0 rx_bytes)" -gt "$1" ]; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }

# --- Spread: every path carries traffic, and the spines carry it as the hash places the
# paths' source ports. Spines limited to $MP_RATE from here on.
fab_spine_rate "$MP_RATE"
p0=$(paths tx_packets)
s0=$(fab_spine_bytes)
# Data packets only (ACKs and probes are short), all of the run's: a path changes its source
# port after a timeout, so the first few hundred packets need not show where the rest went.
$IP netns exec h1 timeout 30 tcpdump -nn -q -i eth0 -s 64 -w "$TAP_DIR/data.pcap" \
	udp dst port 4793 and greater 1000 2>/dev/null &
dump=$!
bw_measure ib_write_bw -s 65536 -D 3 && rc=0 || rc=1
clean=$(bw_mbit)
_tap $rc "ib_write_bw over the fabric, spines at $MP_RATE: $clean Mbit/s"
sleep 0.5
kill -INT $dump 2>/dev/null
wait $dump
p=$(sub "$(paths tx_packets)" "$p0")
spine=$(sub "$(fab_spine_bytes)" "$s0")
echo "# packets per path: $p"
echo "# spine shares (data direction): $(shares $spine)"
# Each path's window follows its own spine's congestion, so the paths need not carry the same;
# each carries its part.
check "every path carries traffic, each at least 20% of the mean" within 0.2 1000 $p
# Where the hash sends each data packet, by its source port.
$IP netns exec h1 tcpdump -nn -q -r "$TAP_DIR/data.pcap" 2>/dev/null |
	awk '{ n = split($3, a, "."); print a[n] }' | sort | uniq -c >"$TAP_DIR/sports"
hashed=()
for k in $(seq 1 $FAB_SPINES); do hashed[k]=0; done
while read -r n sport; do
	k=$($IP -n leaf1 route get $FAB_H2_ADDR from $FAB_H1_ADDR iif host \
		ipproto udp sport "$sport" dport 4793 | grep -o 'dev s[0-9]*' | tr -dc 0-9)
	hashed[k]=$((hashed[k] + n))
done <"$TAP_DIR/sports"
echo "# $(wc -l <"$TAP_DIR/sports") source ports in $(awk '{ s += $1 } END { print s + 0 }' "$TAP_DIR/sports") data packets; spine shares their hash predicts: $(shares "${hashed[@]:1}")"
# The spines that carry traffic are those the hash sends the source ports to (how much each
# carries depends on the rate limits and the transport's per-path windows): every spine with
# over 1% of the bytes had packets hashed to it, and every spine the hash gave 3% of the
# packets carries over 1% of the bytes (bytes and packet counts are taken a little apart).
used=$(echo $spine | awk '{ for (i = 1; i <= NF; i++) s += $i; for (i = 1; i <= NF; i++) if ($i > 0.01 * s) printf "%d ", i }')
predicted=$(echo "${hashed[@]:1}" | awk '{ for (i = 1; i <= NF; i++) if ($i > 0) printf "%d ", i }')
major=$(echo "${hashed[@]:1}" | awk '{ for (i = 1; i <= NF; i++) s += $i; for (i = 1; i <= NF; i++) if ($i >= 0.03 * s) printf "%d ", i }')
# subset A B: every word of A is in B.
subset() { local x; for x in $1; do [[ " $2 " == *" $x "* ]] || return 1; done; }
spines_as_hashed() { subset "$used" "$predicted" && subset "$major" "$used"; }
check "the spines used ($used) are those the ECMP hash of the source ports picks ($predicted; 3% or more: $major)" \
	spines_as_hashed
# The spines by load: the busiest, and the least busy one with at least 5% of the traffic.
busiest=$(echo $spine | tr ' ' '\n' | awk '{ if ($1 > m) { m = $1; k = NR } } END { print k }')
lightest=$(echo $spine | awk '{ for (i = 1; i <= NF; i++) s += $i;
	for (i = 1; i <= NF; i++) if ($i > 0.05 * s && (m == "" || $i < m)) { m = $i; k = i } print k }')
share_light=$(echo $spine | awk -v k="$lightest" '{ for (i = 1; i <= NF; i++) s += $i; printf "%.2f", $k / s }')

# cut_run WHAT CUT-COMMAND...: ib_write_bw of 600 x 64 KiB (about 8-10 s at the 30-40 Mbit/s
# the spines allow: at least 3 s after the cut to measure), CUT-COMMAND 1 s after data starts
# to flow, then throughput before the cut (1 s), its
# dip (the lowest 0.5 s in the 2.5 s after it) and after it (the last 2 s of the transfer)
# against the surviving capacity. A fixed amount of data, not a duration: a transfer that
# stalls after the cut does not end on time and pass, it takes longer and shows it.
cut_run() {
	local what="$1" retx tmo rx0 t_cut t_last pre d post want acks_out acks_in lost
	shift
	retx=$(ctr retransmits)
	tmo=$(ctr timeouts)
	acks_out=$(ctr acks_sent "$CNT2")
	acks_in=$(ctr acks_rcvd)
	rx0=$(fab_stat h2 eth0 rx_bytes)
	sample_start 80
	bw_start ib_write_bw -s 65536 -n 600
	wait_for 20 rx_above $((rx0 + 500000))
	sleep 1
	t_cut=$(now)
	"$@"
	bw_wait && rc=0 || rc=1
	sample_stop
	_tap $rc "ib_write_bw completes while $what mid-run"
	# Where the last interval that saw data (more than 20 kB: not just the perftest's closing
	# TCP exchange) began: that interval itself is partly idle, the transfer ending in it.
	t_last=$(awk 'NR > 1 && $2 > v + 20000 { t = p } { v = $2; p = $1 }
		END { print t }' "$TAP_DIR/samples")
	pre=$(rate "$(plus "$t_cut" -1)" "$t_cut")
	d=$(dip "$t_cut" "$(plus "$t_cut" 2.5)")
	post=$(rate "$(plus "$t_last" -2)" "$t_last")
	echo "# $what: Mbit/s per 0.5 s: $(timeline "$t_cut" "$t_last")"
	echo "# before $pre Mbit/s, dip $d, after (the last 2 s, to $(plus "$t_last" "-$t_cut") s after the cut) $post; retransmits $(($(ctr retransmits) - retx)), timeouts $(($(ctr timeouts) - tmo)); perftest: $BW_LINE"
	# At least half the surviving capacity: a transfer that recovers, not one that stalls or
	# collapses. Full recovery is a goal not met yet: the paths moved off the lost spine take
	# new random source ports, which hash unevenly over the 3 left (0.66-0.68 of the
	# surviving capacity in 2 of 5 runs this session, 0.8 or more in the others).
	want=$(awk -v p="$pre" -v s=$FAB_SPINES 'BEGIN { printf "%.1f", 0.5 * p * (s - 1) / s }')
	check "$what: throughput recovers to at least half the surviving capacity ($post Mbit/s in the last 2 s, ending $(plus "$t_last" "-$t_cut") s after the cut; want >= $want)" \
		sh -c "awk -v a='$post' -v b='$want' 'BEGIN { exit !(a >= b) }' &&
			awk -v a='$(plus "$t_last" "-$t_cut")' 'BEGIN { exit !(a >= 3) }'"
	# ACKs go back with the source port of the data they answer, so they move off the cut
	# with the paths that time out: only those on their way at the cut are lost. (With the
	# receiver's own ports, all those hashed onto the cut would be lost, for good.)
	acks_out=$(($(ctr acks_sent "$CNT2") - acks_out))
	acks_in=$(($(ctr acks_rcvd) - acks_in))
	lost=$((acks_out - acks_in))
	check "$what: the ACKs come back ($lost of $acks_out lost; at most 2%)" \
		test $((lost * 50)) -le "$acks_out"
}

# --- A spine link blackholed mid-run (a gray failure: routing keeps hashing into it).
cut_run "leaf1-spine$busiest (the busiest) is blackholed" fab_blackhole leaf1 s$busiest
rx0=$(ctr rx_packets "$CNT2")
pp_start -n $PP_COUNT -s 4096 -c
pp_midrun "$rx0"
fab_unblackhole leaf1 s$busiest
pp_wait && rc=0 || rc=1
_tap $rc "ibv_rc_pingpong -c completes, data checked, while the blackhole is lifted mid-run"

# --- A whole spine taken out mid-run (both leaves stop using it), then back.
cut_run "spine$busiest goes down" fab_spine_down $busiest
rx0=$(ctr rx_packets "$CNT2")
pp_start -n $PP_COUNT -s 4096 -c
pp_midrun "$rx0"
fab_blackhole leaf1 s$lightest
pp_wait && rc=0 || rc=1
_tap $rc "ibv_rc_pingpong -c completes, data checked, while leaf1-spine$lightest is blackholed mid-run (spine$busiest down)"
fab_unblackhole leaf1 s$lightest
fab_spine_up $busiest
# Back in service: it routes to both hosts again (a spine that lost its routes with its links
# would drop all the leaves hash to it, for every test after this one).
check "spine$busiest routes to both hosts again" sh -c \
	"$IP -n spine$busiest route get $FAB_H1_ADDR && $IP -n spine$busiest route get $FAB_H2_ADDR"

echo "# ($SECONDS s)"
# --- One lossy spine (5%, data direction) among clean ones.
FAB_RATE="$MP_RATE" fab_spine_netem "$lightest" loss 5%
retx0=$(ctr retransmits)
bw_measure ib_write_bw -s 65536 -D 3 && rc=0 || rc=1
lossy=$(bw_mbit)
_tap $rc "ib_write_bw with 5% loss on spine$lightest: $lossy Mbit/s (clean $clean)"
want=$(awk -v c="$clean" -v s="$share_light" 'BEGIN { printf "%.1f", 0.8 * c * (1 - s) }')
echo "# spine$lightest carries ${share_light} of the traffic; retransmits $(($(ctr retransmits) - retx0))"
# Without a clean figure there is nothing to compare with: that fails too.
lossy_share() { ge "${clean:-0}" 0.1 && ge "$lossy" "$want"; }
check "a 5% lossy spine costs about its share ($lossy Mbit/s, clean $clean, want >= $want)" \
	lossy_share
fab_spine_rate ""

echo "# ($SECONDS s)"
# --- Reordering without loss: each spine delays differently (paths arrive out of order with
# each other, in order on each path), then jitter on one spine (out of order within paths).
# At most 2 messages (128 packets) in flight, so no queue overflows.
delays() {
	local k
	for k in $(seq 1 "$FAB_SPINES"); do
		fab_spine_netem "$k" delay "$(((k - 1) * 2))ms" "$@"
	done
}
reorder_run() { # what
	local retx tx rx nomem sent
	retx=$(ctr retransmits)
	nomem=$(ctr rx_nomem "$CNT2")
	tx=$(ctr tx_packets)
	rx=$(ctr rx_packets "$CNT2")
	bw_measure ib_write_bw -s 65536 -D 2 -t 2 && rc=0 || rc=1
	# perftest in duration mode exits 0 with a 0 when nothing completed in its window: a
	# transfer that moved nothing (a stuck connection) fails here, not in the checks below,
	# which a connection that sends nothing would pass.
	ge "$(bw_mbit)" 0.1 || rc=1
	_tap $rc "ib_write_bw, $1: $(bw_mbit) Mbit/s (moves data: >= 0.1)"
	retx=$(($(ctr retransmits) - retx))
	sent=$(($(ctr tx_packets) - tx))
	lost=$((($(ctr tx_packets) - tx) - ($(ctr rx_packets "$CNT2") - rx)))
	nomem=$(($(ctr rx_nomem "$CNT2") - nomem))
	echo "# $1: $retx retransmits; datagrams lost: $lost in all, $nomem of them by the receiver's queue"
	# Reordering is no loss: nothing is resent for it. A path's timeout can still fire when
	# TCG holds a vCPU for longer than the RTO (and jitter reorders within a path, which the
	# reordering window absorbs only once it has seen it), so the bound is 1% of the data
	# packets sent, where go-back-N resends a window per event.
	check "$1: retransmits at most 1% of the packets sent ($retx of $sent)" \
		test $((retx * 100)) -le "$sent"
}
delays
reorder_run "spines delayed 0/2/4/6 ms"
delays 1ms
reorder_run "spines delayed 0/2/4/6 ms with 1 ms jitter"
for k in $(seq 1 "$FAB_SPINES"); do fab_unshape leaf1 s$k; done

fab_teardown

echo "# ($SECONDS s)"
# --- Planes: 8 independent planes, each limited to $PLANE_RATE, one multi-plane metaroce
# device per host (docs/multiplane.md) over 1, then 4, then 8 of them: ib_write_bw scales with
# the planes; then a whole plane is cut mid-run.
fab_planes 8
fab_add_plane_devices mroce 1
fab_plane_rate "$PLANE_RATE"
plane_bw() { # P: ib_write_bw over the device's P planes, Mbit/s
	local rc
	fab_grow_planes mroce "$1"
	wait_for 10 sh -c "[ \$(grep -c ' up\$' /sys/class/infiniband/mroce1/planes) = $1 ] &&
		[ \$(grep -c ' up\$' /sys/class/infiniband/mroce2/planes) = $1 ]"
	bw_measure ib_write_bw -s 65536 -D 2 && rc=0 || rc=1
	_tap $rc "ib_write_bw over $1 plane(s) at $PLANE_RATE each: $(bw_mbit) Mbit/s"
}
FAB_H2_ADDR=$(fab_plane_addr 2 1)
plane_bw 1
one=$(bw_mbit)
for p in 4 8; do
	plane_bw $p
	agg=$(bw_mbit)
	want=$(awk -v o="$one" -v p="$p" 'BEGIN { printf "%.1f", 0.8 * o * p }')
	check "$p planes scale to >= 80% of $p x one plane ($agg Mbit/s, one plane $one, want >= $want)" \
		sh -c "awk -v o='${one:-0}' 'BEGIN { exit !(o >= 0.1) }' && awk -v a='${agg:-0}' -v w='$want' 'BEGIN { exit !(a >= w) }'"
done
echo "# planes: $(tr '\n' ';' </sys/class/infiniband/mroce1/planes)"
# A whole plane cut mid-run: plane 2's router drops every datagram (routing and the netdevs
# stay up, so only the transport can notice), then its link goes down on h1 (the device sees
# it) during a pingpong with data checked.
rxb0=$(ctr rx_bytes "$CNT2")
bw_start ib_write_bw -s 65536 -D 4
sleep 2.5
fab_blackhole plane2 h1
bw_wait && rc=0 || rc=1
# Without perftest's figure (BW_UNCAL), what mroce2 received over the 4 s run says the same.
if [ "$BW_UNCAL" = 1 ]; then
	BW_LINE="0 0 0 $(awk -v b="$(($(ctr rx_bytes "$CNT2") - rxb0))" 'BEGIN { print b * 8 / 4 / 1e9 }')"
fi
ge "$(bw_mbit)" 0.1 || rc=1
_tap $rc "ib_write_bw over 8 planes completes while the plane of p2 is blackholed mid-run: $(bw_mbit) Mbit/s (moves data: >= 0.1)"
rx0=$(ctr rx_packets "$CNT2")
pp_start -n $PP_COUNT -s 4096 -c
pp_midrun "$rx0"
fab_link_down h1 p3
pp_wait && rc=0 || rc=1
_tap $rc "ibv_rc_pingpong -c completes, data checked, while the plane of p3 goes down mid-run (that of p2 blackholed)"
fab_teardown
echo "# ($SECONDS s)"
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
