#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The benchmark's guest side: metaroce, rxe (the kernel's soft-RoCE, same kernel, same guest,
# same topology) and kernel TCP side by side, with stock tools only (perftest, qperf, iperf3).
#
#   run.sh [quick|full] [SCENARIO...]     (bench.sh boots the guest and calls it; see README.md)
#
# Writes to $METAROCE_OUT (default /tmp/bench-out): samples.csv (every raw sample, failures and
# scenarios that could not be measured included) and env.txt (what ran where), and prints one
# progress line per sample. A failing or hanging tool run (every one runs under `timeout`)
# records a "failed" sample and the run goes on; the exit status is 0 unless the runner itself
# broke. Scenarios, in this order (each also a name to run it alone):
#   bw_size  lossless bandwidth by message size (unshaped: what the CPU gives)
#   lat_size lossless latency by message size (perftest's t_typical, qperf tcp_lat)
#   qps      1, 8, 64 QPs (TCP: as many parallel streams)
#   loss     loss sweep on a rate-limited link, one direction and both
#   reorder  reordering with and without loss (rate-limited)
#   multipath leaf/spine fabric (selftests/fabric.sh), one spine lossy
#   planes   N rate-limited planes, each its own netdev, device and QP (or TCP flow), summed
#   cut      throughput around a cut: a plane (of 4) and a spine link (fabric.sh)
#   incast   N-to-1 through a bridge whose port to the receiver is rate-limited
#   conns    RC connection scaling: QPs open at once, kernel memory per QP and per device
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
SELFTESTS="$(dirname "$HERE")"
source "$SELFTESTS/lib.sh"
# The leaf/spine library, once there is one.
source "$SELFTESTS/fabric.sh"
pin_static_keys

PROFILE="${1:-${BENCH_PROFILE:-quick}}"
shift || true
ONLY=("$@")
OUT="${METAROCE_OUT:-/tmp/bench-out}"
mkdir -p "$OUT"
CSV="$OUT/samples.csv"
W=/tmp/bench-work
rm -rf "$W" && mkdir -p "$W"

# Profiles. DUR: seconds per bandwidth run, of which perftest leaves a quarter at each end out of
# the measurement (its default margin) and iperf3 the first quarter (-O): under TCG a
# transport's first WQEs can take seconds to complete (128 x 64 KiB in flight at tens of
# Mbit/s), so a short run would measure the start-up. RATE shapes the links of the loss, reorder, planes, multipath and cut scenarios so
# that the link and not the emulated CPU is the bottleneck for whoever can fill it; under TCG
# absolute numbers are small, the ratios within one run are what count.
case "$PROFILE" in
quick)
	# One point per scenario (two for loss): a few minutes, run by make check.
	REPS=1 DUR=4 LAT_N=100
	BW_SIZES="65536"
	LAT_SIZES="2"
	QPS="8"
	LOSSES="0 10"
	LOSS_DIRS="one-way"
	REORDER_LOSSES="0"
	SPINE_LOSSES="5"
	PLANES="2"
	CUT_PLANES=2
	INCAST="2"
	CONNS="16"
	CONN_PROCS=1
	CUT_DUR=8 CUT_AT=2 CUT_BACK=4 SPINE_CUT=0
	;;
full)
	REPS=3 DUR=8 LAT_N=500
	BW_SIZES="2 64 512 4096 16384 65536 262144 1048576 8388608"
	LAT_SIZES="2 64 512 4096 16384 65536 262144 1048576"
	QPS="1 8 64"
	LOSSES="0 0.1 0.5 1 2 5 10"
	LOSS_DIRS="one-way both"
	REORDER_LOSSES="0 0.1 1 5"
	SPINE_LOSSES="0 1 5"
	PLANES="1 4 8"
	CUT_PLANES=4
	INCAST="4 7"
	CONNS="4000"
	CONN_PROCS=4
	CUT_DUR=16 CUT_AT=4 CUT_BACK=8 SPINE_CUT=1
	;;
*)
	echo "bench: unknown profile $PROFILE (quick or full)" >&2
	exit 2
	;;
esac
REPS="${BENCH_REPS:-$REPS}"
RATE="${BENCH_RATE:-100mbit}"
# The planes' rate: low enough that 8 of them still leave the (emulated) CPU spare, so the
# scaling measured is the links' (8 x 100 Mbit/s was CPU-bound: 8 planes 4x one, 4 planes 3.5x).
PLANE_RATE="${BENCH_PLANE_RATE:-25mbit}"
INCAST_RATE="${BENCH_INCAST_RATE:-50mbit}"
REORDER="${BENCH_REORDER:-delay 1ms reorder 75% 50%}"
TRANSPORTS="metaroce rxe tcp"
TMO=$((DUR * 4 + 60))
START=$SECONDS

# --- samples ------------------------------------------------------------------------------
echo "scenario,case,x,transport,metric,unit,rep,value,status,note" >"$CSV"
progress() { printf '[bench %3d:%02d] %s\n' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) "$*"; }
isnum() { [[ "${1:-}" =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; }
csvq() { local s="${1//\"/\'}"; printf '"%s"' "${s//$'\n'/ }"; }
# sample SCENARIO CASE X TRANSPORT METRIC UNIT REP VALUE [NOTE]: a number is "ok", anything
# else a failed run whose NOTE says why.
sample() {
	local status=ok value="$8" note="${9:-}"
	if ! isnum "$value"; then
		status=failed
		[ -n "$note" ] || note="$value"
		value=""
	fi
	echo "$1,$(csvq "$2"),$3,$4,$5,$6,$7,$value,$status,$(csvq "$note")" >>"$CSV"
	progress "$1 | $2 | x=$3 | $4 rep $7: ${value:-FAILED ($note)} ${value:+$6}"
}
# not_measured SCENARIO CASE X TRANSPORT METRIC UNIT REASON
not_measured() {
	echo "$1,$(csvq "$2"),$3,$4,$5,$6,,,not-measured,$(csvq "$7")" >>"$CSV"
	progress "$1 | $2 | x=$3 | $4: not measured ($7)"
}
wanted() {
	[ "${#ONLY[@]}" = 0 ] && return 0
	local s
	for s in "${ONLY[@]}"; do [ "$s" = "$1" ] && return 0; done
	return 1
}

# --- environment --------------------------------------------------------------------------
{
	echo "profile=$PROFILE"
	echo "reps=$REPS"
	echo "duration_s=$DUR"
	echo "rate=$RATE"
	echo "plane_rate=$PLANE_RATE"
	echo "incast_rate=$INCAST_RATE"
	echo "reorder=$REORDER"
	echo "cut_at=$CUT_AT"
	echo "cut_back=$CUT_BACK"
	echo "guest_kernel=$(uname -r)"
	echo "guest_cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
	echo "guest_cpus=$(nproc)"
	echo "guest_mem_kib=$(awk '/MemTotal/ {print $2}' /proc/meminfo)"
	virt=$(systemd-detect-virt 2>/dev/null || echo unknown)
	# Under QEMU, systemd-detect-virt says "qemu" for TCG and "kvm" with KVM.
	case "$virt" in qemu) accel=tcg ;; kvm) accel=kvm ;; none) accel=none ;; *) accel="$virt" ;; esac
	echo "virt=$virt"
	echo "accel=$accel"
	echo "tools=$(dpkg-query -W -f '${Package} ${Version}; ' perftest qperf iperf3 rdma-core 2>/dev/null)"
	echo "fabric=$(type -t fab_leafspine >/dev/null && echo yes || echo no)"
	echo "started=$(date -u +%FT%TZ)"
} >"$OUT/env.txt"

# --- tool runners -------------------------------------------------------------------------
# wait_listen NS PORT: until something listens on TCP PORT in NS (or 10 s).
wait_listen() {
	local deadline=$((SECONDS + 10))
	until $IP netns exec "$1" ss -Hltn "sport = :$2" 2>/dev/null | grep -q .; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.1
	done
}

# perf_run TAG CNS CDEV SNS SDEV SADDR PORT TOOL ARGS...: TOOL's server in SNS on SDEV, its
# client in CNS on CDEV (GID index 1, the IPv4 RoCEv2 GID), client output in $W/TAG.out.
# Returns non-zero if either side failed. Retried (3 tries in all) when perftest's clock
# calibration fails under TCG ("Correlation coefficient r^2 < 0.9").
perf_run() {
	local tag="$1" cns="$2" cdev="$3" sns="$4" sdev="$5" saddr="$6" port="$7" tool="$8" try rc srv
	shift 8
	for try in 1 2 3; do
		$IP netns exec "$sns" timeout "$TMO" "$tool" -d "$sdev" -x 1 -p "$port" --report_gbits "$@" \
			>"$W/$tag.srv" 2>&1 &
		srv=$!
		wait_listen "$sns" "$port"
		$IP netns exec "$cns" timeout "$TMO" "$tool" -d "$cdev" -x 1 -p "$port" --report_gbits "$@" \
			"$saddr" >"$W/$tag.out" 2>&1 && rc=0 || rc=$?
		if [ "$rc" != 0 ]; then kill "$srv" 2>/dev/null; fi
		wait "$srv" 2>/dev/null || [ "$rc" != 0 ] || rc=99
		if [ "$try" != 3 ] && grep -q 'Correlation coefficient' "$W/$tag.out" "$W/$tag.srv"; then continue; fi
		break
	done
	return "$rc"
}
# The last result line of a perftest run: "bytes iterations ..." (bw: $4 is the average Gb/s;
# lat: $5 is t_typical, the median, in us).
perf_lines() { grep -E '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$W/$1.out"; }
# keep_logs TAG: a failed or zero run's client and server output, kept in $OUT/logs.
keep_logs() {
	local name
	name="$OUT/logs/$(printf %04d $((SECONDS - START)))-$1-$RANDOM"
	mkdir -p "$OUT/logs"
	cp "$W/$1.out" "$name.client" 2>/dev/null
	cp "$W/$1.srv" "$name.server" 2>/dev/null
}
perf_why() { # a short reason for a failed run
	local f="$W/$1.out"
	grep -m1 -iE "couldn't|failed|error|unable|timeout|refused|correlation" "$f" 2>/dev/null ||
		echo "exit ${2:-?}, no result line"
}

# rdma_bw TAG CNS CDEV SNS SDEV SADDR PORT ARGS...: average Gb/s of ib_write_bw, or a reason.
rdma_bw() {
	local tag="$1" rc v
	shift
	perf_run "$tag" "$1" "$2" "$3" "$4" "$5" "$6" ib_write_bw "${@:7}" && rc=0 || rc=$?
	v=$(perf_lines "$tag" | tail -n 1 | awk '{print $4}')
	[ "$rc" = 0 ] && isnum "$v" && awk -v v="$v" 'BEGIN { exit !(v > 0) }' || keep_logs "$tag"
	if [ "$rc" = 0 ] && isnum "$v"; then echo "$v"; else perf_why "$tag" "$rc"; fi
}

# tcp_bw TAG CNS SNS SADDR PORT ARGS...: iperf3's received Gb/s, or a reason.
tcp_bw() {
	local v
	v=$(tcp_bw_once "$@")
	# iperf3's control connection sometimes gives up under a loaded TCG guest: one more try.
	isnum "$v" || v=$(tcp_bw_once "$@")
	echo "$v"
}
tcp_bw_once() {
	local tag="$1" cns="$2" sns="$3" saddr="$4" port="$5" rc v srv
	shift 5
	$IP netns exec "$sns" timeout "$TMO" iperf3 -s -1 -p "$port" >"$W/$tag.srv" 2>&1 &
	srv=$!
	wait_listen "$sns" "$port"
	$IP netns exec "$cns" timeout "$TMO" iperf3 -c "$saddr" -p "$port" -J -O $((DUR / 4)) "$@" \
		>"$W/$tag.out" 2>&1 && rc=0 || rc=$?
	kill "$srv" 2>/dev/null
	wait "$srv" 2>/dev/null
	v=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9)' \
		<"$W/$tag.out" 2>/dev/null)
	[ "$rc" = 0 ] && isnum "$v" && awk -v v="$v" 'BEGIN { exit !(v > 0) }' || keep_logs "$tag"
	if [ "$rc" = 0 ] && isnum "$v"; then echo "$v"; else
		grep -m1 '"error"' "$W/$tag.out" 2>/dev/null | sed 's/.*"error": *//' || echo "iperf3 exit $rc"
	fi
}

# qperf_lat SIZE: tcp_lat in us over the pair (server started by the caller), or a reason.
qperf_lat() {
	local out v
	out=$($IP netns exec ns1 timeout 60 qperf -t "$DUR" -m "$1" $NS2_ADDR tcp_lat 2>&1)
	v=$(printf '%s\n' "$out" | awk '/latency/ {
		v = $3; u = $4
		if (u == "ms") v *= 1000; else if (u == "sec") v *= 1000000; else if (u == "ns") v /= 1000
		print v }')
	if isnum "$v"; then echo "$v"; else printf '%s' "$out" | tail -n 1; fi
}

# --- shaping ------------------------------------------------------------------------------
# shape NS DEV [rate R] [NETEM-ARGS...]: DEV's egress rate-limited by a tbf (R given), with
# netem under it for the rest. Not netem's own rate: packets netem reorders go out at once,
# past its rate, so "delay 1ms reorder 75%" with "rate 100mbit" let 0.4 Gbit/s through.
shape() {
	local ns="$1" dev="$2" rate="" parent=root
	shift 2
	if [ "${1:-}" = rate ]; then rate="$2"; shift 2; fi
	tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
	if [ -n "$rate" ]; then
		# About 3 ms of burst at 100 Mbit/s and 50 ms of queue.
		tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst 32kb latency 50ms
		parent="parent 1:1"
	fi
	# shellcheck disable=SC2086
	[ $# -eq 0 ] || tc -n "$ns" qdisc add dev "$dev" $parent handle 10: netem limit 10000 "$@"
}
unshape() { tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true; }
# netem's loss wants "loss X%" only when X > 0.
loss_args() { awk -v l="$1" 'BEGIN { if (l + 0 > 0) printf "loss %s%%", l }'; }

# --- the pair: ns1/veth1 <-> ns2/veth2, mroce1/2 and rxe1/2 on the same veths -------------
pair_up() {
	setup_pair metaroce mroce
	$IP netns exec ns1 $RDMA link add rxe1 type rxe netdev veth1
	$IP netns exec ns2 $RDMA link add rxe2 type rxe netdev veth2
}
pair_down() { teardown_pair; }

# bw_on_pair TAG TRANSPORT ARGS...: perftest (metaroce, rxe) or iperf3 (tcp) over the pair.
# ARGS for RDMA are ib_write_bw's; TCP gets "-t DUR" plus TCP_ARGS.
TCP_ARGS=()
bw_on_pair() {
	local tag="$1" t="$2"
	shift 2
	case "$t" in
	metaroce) rdma_bw "$tag" ns1 mroce1 ns2 mroce2 $NS2_ADDR 18515 "$@" ;;
	rxe) rdma_bw "$tag" ns1 rxe1 ns2 rxe2 $NS2_ADDR 18515 "$@" ;;
	tcp) tcp_bw "$tag" ns1 ns2 $NS2_ADDR 5201 -t "$DUR" "${TCP_ARGS[@]}" ;;
	esac
}
dev_of() { case "$1" in metaroce) echo mroce ;; rxe) echo rxe ;; esac; }

# Bandwidth by message size: one time-bounded run per size (perftest -a runs a fixed
# iteration count per size, which under TCG at a lossy or slow point can take many minutes).
scenario_bw_size() {
	local t rep s
	for rep in $(seq 1 "$REPS"); do
		for s in $BW_SIZES; do
			for t in metaroce rxe; do
				sample bw_size lossless "$s" $t bw Gb/s "$rep" "$(bw_on_pair bw $t -s "$s" -D "$DUR")"
			done
			TCP_ARGS=(-l "$s")
			sample bw_size lossless "$s" tcp bw Gb/s "$rep" "$(bw_on_pair bw tcp)"
			TCP_ARGS=()
		done
	done
}

scenario_lat_size() {
	local t rep s p v rc qsrv n
	$IP netns exec ns2 timeout $((TMO * 20)) qperf >"$W/qperf.srv" 2>&1 &
	qsrv=$!
	wait_listen ns2 19765
	for rep in $(seq 1 "$REPS"); do
		for s in $LAT_SIZES; do
			for t in metaroce rxe; do
				p=$(dev_of $t)
				# At most about 8 MiB each way per run: large messages get fewer round trips.
				n=$((8388608 / s))
				[ "$n" -le "$LAT_N" ] || n=$LAT_N
				[ "$n" -ge 10 ] || n=10
				perf_run lat ns1 ${p}1 ns2 ${p}2 $NS2_ADDR 18515 ib_write_lat -s "$s" -n "$n" && rc=0 || rc=$?
				v=$(perf_lines lat | tail -n 1 | awk '{print $5}')
				[ "$rc" = 0 ] && isnum "$v" || v=$(perf_why lat "$rc")
				sample lat_size lossless "$s" $t latency us "$rep" "$v"
			done
			sample lat_size lossless "$s" tcp latency us "$rep" "$(qperf_lat "$s")"
		done
	done
	kill "$qsrv" 2>/dev/null
	wait "$qsrv" 2>/dev/null
}

scenario_qps() {
	local t rep q
	for rep in $(seq 1 "$REPS"); do
		for q in $QPS; do
			for t in metaroce rxe; do
				sample qps "64 KiB writes" "$q" $t bw Gb/s "$rep" \
					"$(bw_on_pair qps $t -s 65536 -q "$q" -t 16 -D "$DUR")"
			done
			TCP_ARGS=(-P "$q")
			sample qps "64 KiB writes" "$q" tcp bw Gb/s "$rep" "$(bw_on_pair qps tcp)"
			TCP_ARGS=()
		done
	done
}

scenario_loss() {
	local t rep l dir
	for dir in $LOSS_DIRS; do
		for l in $LOSSES; do
			# shellcheck disable=SC2046 # loss_args is empty or two words
			shape ns1 veth1 rate "$RATE" $(loss_args "$l")
			if [ "$dir" = both ]; then shape ns2 veth2 rate "$RATE" $(loss_args "$l"); else unshape ns2 veth2; fi
			for rep in $(seq 1 "$REPS"); do
				for t in $TRANSPORTS; do
					sample loss "$dir, $RATE" "$l" $t bw Gb/s "$rep" \
						"$(bw_on_pair loss $t -s 65536 -D "$DUR")"
				done
			done
		done
	done
	unshape ns1 veth1
	unshape ns2 veth2
}

# Retransmissions the sender made so far: metaroce's hw counter, TCP's TcpRetransSegs (rxe
# counts none it would call that).
hw_count() { cat "/sys/class/infiniband/mroce1/ports/1/hw_counters/$1"; } # NAME: mroce1's
retx_count() { # TRANSPORT
	case "$1" in
	metaroce) cat /sys/class/infiniband/mroce1/ports/1/hw_counters/retransmits ;;
	tcp) $IP netns exec ns1 nstat -az TcpRetransSegs | awk '$1 == "TcpRetransSegs" { print $2 }' ;;
	esac
}
# Packets the guest dropped so far on the pair, none of which the netem reordering asked for:
# the per-CPU input backlogs (/proc/net/softnet_stat, all CPUs), veth1's root qdisc, both
# veths' own drop counters and metaroce's receive queues (rx_nomem: a full queue drops, as a
# NIC's full ring would). A retransmission during a reordering run with no loss set is
# spurious only if this did not move.
stack_drops() {
	local s=0 d
	for d in mroce1 mroce2; do s=$((s + $(cat /sys/class/infiniband/$d/ports/1/hw_counters/rx_nomem))); done
	while read -r _ d _; do s=$((s + 0x$d)); done </proc/net/softnet_stat
	s=$((s + $(tc -n ns1 -s qdisc show dev veth1 | awk '/dropped/ && !m { for (i = 1; i < NF; i++)
		if ($i == "(dropped") { v = $(i + 1); gsub(/,/, "", v); m = 1; print v + 0 } } END { if (!m) print 0 }')))
	for d in ns1:veth1 ns2:veth2; do
		s=$((s + $($IP netns exec "${d%%:*}" cat /proc/net/dev | awk -v n="${d##*:}" '
			(i = index($0, ":")) > 0 { name = substr($0, 1, i - 1); gsub(/ /, "", name)
				if (name == n) { split(substr($0, i + 1), f, " "); print f[4] + f[12]; m = 1 } }
			END { if (!m) print 0 }')))
	done
	echo "$s"
}
# Reordering on an unshaped link (compare with bw_size's lossless point): netem's reordering
# sends a packet it picks at once by putting it at the head of its queue, so behind a rate
# limit, with a backlog, the packets it picks leave in reverse order ahead of up to the whole
# queue (metaroce made 750-1200 spurious retransmissions in 4 s that way, TCP 500), which is
# no longer "25% of packets 1 ms late".
scenario_reorder() {
	local t rep l r0 d0 o0
	for l in $REORDER_LOSSES; do
		# shellcheck disable=SC2046,SC2086
		shape ns1 veth1 $REORDER $(loss_args "$l")
		for rep in $(seq 1 "$REPS"); do
			for t in $TRANSPORTS; do
				r0=$(retx_count $t) d0=$(stack_drops) o0=$(hw_count timeouts)
				sample reorder "$REORDER, unshaped" "$l" $t bw Gb/s "$rep" \
					"$(bw_on_pair reorder $t -s 65536 -D "$DUR")"
				sample reorder "$REORDER, unshaped: packets dropped in the guest (backlogs, qdisc, veths, metaroce's receive queues; netem's own loss included)" \
					"$l" $t drops count "$rep" "$(($(stack_drops) - d0))"
				if [ $t = metaroce ]; then
					sample reorder "$REORDER, unshaped: path retransmission timeouts" "$l" $t timeouts count "$rep" \
						"$(($(hw_count timeouts) - o0))"
				fi
				if [ $t = rxe ]; then
					not_measured reorder "$REORDER, unshaped: retransmissions" "$l" $t retx count "no such counter"
				else
					sample reorder "$REORDER, unshaped: retransmissions" "$l" $t retx count "$rep" \
						"$(($(retx_count $t) - r0))"
				fi
			done
		done
	done
	unshape ns1 veth1
}

# --- planes: P veth pairs between ns1 and ns2, 10.78.K.1 <-> 10.78.K.2, one device each -----
# Not multi-plane devices (one metaroce device over several netdevs does not exist yet): P
# independent devices, one QP (or TCP flow) each, their throughputs summed.
PLANES_UP=0
planes_up() { # P: also records kernel memory per device
	local p="$1" k before after t
	for k in $(seq 1 "$p"); do
		$IP link add pa$k netns ns1 type veth peer name pb$k netns ns2
		$IP -n ns1 addr add 10.78.$k.1/24 dev pa$k
		$IP -n ns2 addr add 10.78.$k.2/24 dev pb$k
		$IP -n ns1 link set pa$k up
		$IP -n ns2 link set pb$k up
		shape ns1 pa$k rate "$PLANE_RATE"
		shape ns2 pb$k rate "$PLANE_RATE"
	done
	# A second set of planes, pqK <-> prK (10.76.K.0/24), for one multi-plane metaroce device
	# (docs/multiplane.md) per side, made on plane 1; mp_planes sets how many it spans.
	for k in $(seq 1 "$p"); do
		$IP link add pq$k netns ns1 type veth peer name pr$k netns ns2
		$IP -n ns1 addr add 10.76.$k.1/24 dev pq$k
		$IP -n ns2 addr add 10.76.$k.2/24 dev pr$k
		$IP -n ns1 link set pq$k up
		$IP -n ns2 link set pr$k up
		shape ns1 pq$k rate "$PLANE_RATE"
		shape ns2 pr$k rate "$PLANE_RATE"
	done
	$IP netns exec ns1 $RDMA link add mrmp1 type metaroce netdev pq1
	$IP netns exec ns2 $RDMA link add mrmp2 type metaroce netdev pr1
	MP_PLANES=1
	[ -f /sys/class/infiniband/mrmp1/planes ] || MP_PLANES=0
	for t in metaroce rxe; do
		sync
		before=$(kmem_kib)
		for k in $(seq 1 "$p"); do
			$IP netns exec ns1 $RDMA link add "$(dev_of $t)1p$k" type $t netdev pa$k
			$IP netns exec ns2 $RDMA link add "$(dev_of $t)2p$k" type $t netdev pb$k
		done
		sleep 1
		after=$(kmem_kib)
		sample conns "kernel memory per device" - $t kmem_per_dev KiB 1 \
			"$(awk -v a="$after" -v b="$before" -v n=$((2 * p)) 'BEGIN { printf "%.1f", (a - b) / n }')"
	done
	PLANES_UP=$p
}
# mp_planes N: the multi-plane devices span planes 1..N (0 when there are none).
MP_PLANES=0
mp_planes() {
	local n="$1" k
	[ "$MP_PLANES" -gt 0 ] || return 1
	for k in $(seq $((MP_PLANES + 1)) "$n"); do
		echo "+pq$k" >/sys/class/infiniband/mrmp1/planes && echo "+pr$k" >/sys/class/infiniband/mrmp2/planes || return 1
	done
	for k in $(seq $((n + 1)) "$MP_PLANES"); do
		echo "-pq$k" >/sys/class/infiniband/mrmp1/planes && echo "-pr$k" >/sys/class/infiniband/mrmp2/planes || return 1
	done
	MP_PLANES=$n
}
# mp_run N DUR: one QP over the multi-plane devices (mp_planes N first, outside any
# subshell), or a reason.
mp_run() {
	[ "$MP_PLANES" = "$1" ] || { echo "no multi-plane device spanning $1 planes (planes file missing or refused)"; return; }
	rdma_bw mp ns1 mrmp1 ns2 mrmp2 10.76.1.2 18515 -s 65536 -D "$2"
}
planes_down() {
	local k
	for k in $(seq 1 "$PLANES_UP"); do $IP -n ns1 link del pa$k 2>/dev/null; $IP -n ns1 link del pq$k 2>/dev/null; done
	wait_for 10 sh -c "! $RDMA link show 2>/dev/null | grep -q 'p[0-9]\\|mrmp'" || true
	PLANES_UP=0
}
# planes_start T N TAGPREFIX DUR: N concurrent flows of T, one per plane, in the background;
# sets PIDS.
PIDS=()
plane_flow() { # T K TAG DUR
	local t="$1" k="$2" tag="$3" d="$4" p
	case "$t" in
	tcp) tcp_bw "$tag" ns1 ns2 10.78.$k.2 $((5300 + k)) -t "$d" -B 10.78.$k.1 ;;
	*)
		p=$(dev_of "$t")
		rdma_bw "$tag" ns1 ${p}1p$k ns2 ${p}2p$k 10.78.$k.2 $((18600 + k)) -s 65536 -D "$d"
		;;
	esac
}
planes_run() { # T N DUR -> sum of N concurrent flows (Gb/s) or a reason
	local t="$1" n="$2" d="$3" k sum=0 v bad=""
	for k in $(seq 1 "$n"); do
		plane_flow "$t" "$k" "pl$k" "$d" >"$W/pl$k.val" &
	done
	wait
	for k in $(seq 1 "$n"); do
		v=$(cat "$W/pl$k.val")
		if isnum "$v"; then sum=$(awk -v a="$sum" -v b="$v" 'BEGIN { print a + b }'); else bad="plane $k: $v"; fi
	done
	if [ -n "$bad" ]; then echo "$bad"; else echo "$sum"; fi
}

scenario_planes() {
	local rep n
	local mp="$PLANE_RATE per plane; metaroce: one multi-plane device, one QP; rxe: a device + QP per plane, summed; TCP: a flow per plane, summed"
	local each="$PLANE_RATE per plane; metaroce: a device + QP per plane, summed (as rxe above)"
	for rep in $(seq 1 "$REPS"); do
		for n in $PLANES; do
			mp_planes "$n" || true
			sample planes "$mp" "$n" metaroce bw Gb/s "$rep" "$(mp_run "$n" "$DUR")"
			sample planes "$mp" "$n" rxe bw Gb/s "$rep" "$(planes_run rxe "$n" "$DUR")"
			sample planes "$mp" "$n" tcp bw Gb/s "$rep" "$(planes_run tcp "$n" "$DUR")"
			sample planes "$each" "$n" metaroce bw Gb/s "$rep" "$(planes_run metaroce "$n" "$DUR")"
		done
	done
}

# --- cuts: throughput sampled every 0.25 s at the receiver while one path goes dark -----------
# A cut is a blackhole: every IPv4 packet dropped on ingress at both ends of the link (clsact +
# u32 drop), whatever the transport; the link stays up and its shaping (root qdisc) stays.
blackhole_cmd() { # NS DEV: the command line that blackholes DEV's ingress in NS
	echo "tc -n $1 qdisc add dev $2 clsact; tc -n $1 filter add dev $2 ingress protocol ip prio 1 u32 match u32 0 0 action drop"
}
unblackhole_cmd() { echo "tc -n $1 qdisc del dev $2 clsact"; }

# cut_sampler NS CUT_CMD RESTORE_CMD DEVS...: in NS at real-time priority (busy-polling perftest
# on two emulated CPUs, and the data paths' own real-time threads, starve everything else), every 0.25 s "epoch-seconds bytes" (rx_bytes
# summed over DEVS); time 0 ("T0 epoch") is when 200 kB have arrived (TCG takes seconds to start
# perftest); at CUT_AT s it runs CUT_CMD ("CUT epoch"), at CUT_BACK s RESTORE_CMD ("RESTORE
# epoch"). Bash builtins only, apart from the two commands.
cut_sampler() {
	local ns="$1" cut="$2" restore="$3"
	shift 3
	rm -f "$W/tick" && mkfifo "$W/tick"
	# exec: `ip netns exec` and chrt exec in turn, so the caller's $! is the sampler itself
	# (killing a subshell around it left it sampling after the scenario, into vanished devices).
	exec $IP netns exec "$ns" chrt -f 99 bash -c '
		tick="$1" cut="$2" restore="$3" at=$(($4 * 1000000)) back=$(($5 * 1000000))
		shift 5
		exec {fd}<>"$tick"
		b0="" t0="" state=0
		while :; do
			b=0
			for d in "$@"; do read -r v </sys/class/net/$d/statistics/rx_bytes; b=$((b + v)); done
			now=$EPOCHREALTIME
			echo "$now $b"
			[ -n "$b0" ] || b0=$b
			if [ -z "$t0" ] && [ $((b - b0)) -gt 200000 ]; then t0=$now; echo "T0 $now"; fi
			if [ -n "$t0" ]; then
				us=$((10#${now/./} - 10#${t0/./}))
				if [ "$state" = 0 ] && [ "$us" -ge "$at" ]; then
					eval "$cut" >/dev/null 2>&1; state=1; echo "CUT $EPOCHREALTIME"
				elif [ "$state" = 1 ] && [ "$us" -ge "$back" ]; then
					eval "$restore" >/dev/null 2>&1; state=2; echo "RESTORE $EPOCHREALTIME"
				fi
			fi
			read -r -t 0.25 -u "$fd"
		done' sampler "$W/tick" "$cut" "$restore" "$CUT_AT" "$CUT_BACK" "$@"
}

# cut_series CASE T RECV_NS "DEVS" CUT_CMD RESTORE_CMD REP FLOW_CMD...: runs FLOW_CMD (flows of
# CUT_DUR s) under cut_sampler; records the series (Mb/s between samples, time from T0), the cut
# and restore times, and the mean before (from T0), during and after (2 s) the cut.
cut_series() {
	local case="$1" t="$2" rns="$3" devs="$4" cut="$5" restore="$6" rep="$7" spid t0 tc tb phase from to v
	shift 7
	# shellcheck disable=SC2086 # DEVS is a list
	cut_sampler "$rns" "$cut" "$restore" $devs >"$W/series" &
	spid=$!
	# In a subshell: the flow's own `wait` must not wait for the sampler.
	("$@") >"$W/cutflow.val"
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	eval "$restore" >/dev/null 2>&1 # in case the flow ended before the restore
	t0=$(awk '$1 == "T0" { print $2 }' "$W/series")
	tc=$(awk -v t0="$t0" '$1 == "CUT" { printf "%.2f", $2 - t0 }' "$W/series")
	tb=$(awk -v t0="$t0" '$1 == "RESTORE" { printf "%.2f", $2 - t0 }' "$W/series")
	if [ -z "$t0" ] || [ -z "$tb" ]; then
		for phase in before during after; do
			sample cut "$case" "$phase" "$t" rx Mb/s "$rep" \
				"${t0:+the flows ended before the restore}${t0:-no traffic}" "flow: $(cat "$W/cutflow.val")"
		done
		return
	fi
	awk -v t0="$t0" '$1 ~ /^[0-9]/ { if (n++ && $1 > pt) printf "%.2f %.3f\n", $1 - t0, ($2 - pb) * 8 / ($1 - pt) / 1e6
		pt = $1; pb = $2 }' "$W/series" >"$W/series.mbps"
	{
		while read -r ts v; do echo "cut_ts,$(csvq "$case"),$ts,$t,rx,Mb/s,$rep,$v,ok,\"\""; done <"$W/series.mbps"
		echo "cut_ts,$(csvq "$case"),$tc,$t,event,cut,$rep,$tc,ok,\"\""
		echo "cut_ts,$(csvq "$case"),$tb,$t,event,restore,$rep,$tb,ok,\"\""
	} >>"$CSV"
	for phase in before during after; do
		case $phase in
		before) from=0 to=$tc ;;
		during) from=$(awk -v c="$tc" 'BEGIN { print c + 0.25 }') to=$tb ;;
		after) from=$(awk -v c="$tb" 'BEGIN { print c + 0.25 }') to=$(awk -v c="$tb" 'BEGIN { print c + 2.25 }') ;;
		esac
		v=$(awk -v f="$from" -v e="$to" '$1 > f && $1 <= e { s += $2; n++ }
			END { if (n) printf "%.3f", s / n; else print "no samples" }' "$W/series.mbps")
		sample cut "$case" "$phase" "$t" rx Mb/s "$rep" "$v" "flow: $(cat "$W/cutflow.val")"
	done
}

# The cut takes plane 2 away (every transport's). metaroce runs one QP over the multi-plane
# devices when there are, else a device + QP per plane like rxe.
mp_flow() { mp_run "$1" "$2"; }
scenario_cut() {
	local t rep devs mpdevs k case
	devs="" mpdevs=""
	for k in $(seq 1 "$CUT_PLANES"); do devs+="pb$k " mpdevs+="pr$k "; done
	case="plane 2 of $CUT_PLANES cut (blackholed) at ${CUT_AT}s, back at ${CUT_BACK}s"
	if mp_planes "$CUT_PLANES"; then
		case+="; metaroce: one QP over a multi-plane device; rxe: a device + QP per plane; TCP: a flow per plane"
	else
		case+="; a device + QP (TCP: a flow) per plane"
	fi
	for rep in $(seq 1 "$REPS"); do
		for t in $TRANSPORTS; do
			if [ "$t" = metaroce ] && mp_planes "$CUT_PLANES"; then
				cut_series "$case" \
					"$t" ns2 "$mpdevs" \
					"$(blackhole_cmd ns1 pq2); $(blackhole_cmd ns2 pr2)" \
					"$(unblackhole_cmd ns1 pq2); $(unblackhole_cmd ns2 pr2)" "$rep" \
					mp_flow "$CUT_PLANES" "$CUT_DUR"
			else
				cut_series "$case" \
					"$t" ns2 "$devs" \
					"$(blackhole_cmd ns1 pa2); $(blackhole_cmd ns2 pb2)" \
					"$(unblackhole_cmd ns1 pa2); $(unblackhole_cmd ns2 pb2)" "$rep" \
					planes_run "$t" "$CUT_PLANES" "$CUT_DUR"
			fi
		done
	done
}

# --- the leaf/spine fabric (selftests/fabric.sh) ---------------------------------------------
fabric_flow() { # T DUR [TAG]
	local t="$1" d="$2" tag="${3:-fab}" p
	case "$t" in
	tcp) tcp_bw "$tag" h1 h2 "$FAB_H2_ADDR" 5201 -t "$d" ;;
	*)
		p=$(dev_of "$t")
		rdma_bw "$tag" h1 ${p}1 h2 ${p}2 "$FAB_H2_ADDR" 18515 -s 65536 -D "$d"
		;;
	esac
}
fabric_up() {
	fab_leafspine 4
	fab_add_devices metaroce mroce
	fab_add_devices rxe rxe
	fab_spine_rate "$RATE"
	FAB_RATE=$RATE # fab_spine_netem keeps the spine's rate limit under its netem
}

scenario_multipath() {
	local t rep l
	fabric_up
	for l in $SPINE_LOSSES; do
		# shellcheck disable=SC2046
		fab_spine_netem 1 $(loss_args "$l")
		for rep in $(seq 1 "$REPS"); do
			for t in $TRANSPORTS; do
				sample multipath "4 spines at $RATE, spine 1 lossy" "$l" $t bw Gb/s "$rep" "$(fabric_flow $t "$DUR")"
			done
		done
	done
	fab_teardown
}

scenario_spine_cut() {
	local t rep
	if [ "$SPINE_CUT" = 0 ]; then
		for t in $TRANSPORTS; do
			not_measured cut "spine link cut" - $t rx Mb/s "full profile only"
		done
		return
	fi
	fabric_up
	for rep in $(seq 1 "$REPS"); do
		for t in $TRANSPORTS; do
			# leaf1's link to spine 1 (leaf1 s1 <-> spine1 l1, see fabric.sh), in the data direction.
			cut_series "spine 1 of 4 cut (blackholed) at ${CUT_AT}s, back at ${CUT_BACK}s" "$t" h2 eth0 \
				"$(blackhole_cmd leaf1 s1); $(blackhole_cmd spine1 l1)" \
				"$(unblackhole_cmd leaf1 s1); $(unblackhole_cmd spine1 l1)" "$rep" fabric_flow "$t" "$CUT_DUR" fabcut
		done
	done
	fab_teardown
}

# --- incast: N senders and one receiver on a bridge (namespace isw), the receiver's port
# rate-limited to INCAST_RATE --------------------------------------------------------------
incast_up() { # N
	local n="$1" k
	$IP netns add isw
	$IP -n isw link add br0 type bridge
	$IP -n isw link set br0 up
	for k in $(seq 0 "$n"); do
		$IP netns add in$k
		$IP -n in$k link set lo up
		$IP link add eth0 netns in$k type veth peer name port$k netns isw
		$IP -n in$k addr add 10.79.0.$((k + 1))/24 dev eth0
		$IP -n in$k link set eth0 up
		$IP -n isw link set port$k master br0
		$IP -n isw link set port$k up
		$IP netns exec in$k $RDMA link add mri$k type metaroce netdev eth0
		$IP netns exec in$k $RDMA link add rxi$k type rxe netdev eth0
	done
	shape isw port0 rate "$INCAST_RATE" limit 200
	# A process in isw whose /proc/PID/net/dev is the bridge's counters (no process started
	# per sample: `ip netns exec` takes a second on a loaded guest).
	$IP netns exec isw sleep 100000 &
	ISW_PID=$!
}
incast_down() {
	local k
	kill "$ISW_PID" 2>/dev/null
	wait "$ISW_PID" 2>/dev/null
	for k in $(seq 0 "$1"); do $IP netns del in$k 2>/dev/null; done
	$IP netns del isw 2>/dev/null
	wait_for 10 sh -c "! $RDMA link show 2>/dev/null | grep -q 'mri\\|rxi'" || true
}
incast_flow() { # T K DUR
	local t="$1" k="$2" d="$3"
	case "$t" in
	tcp) tcp_bw in$k in$k in0 10.79.0.1 $((5300 + k)) -t "$d" ;;
	metaroce) rdma_bw in$k in$k mri$k in0 mri0 10.79.0.1 $((18700 + k)) -s 65536 -D "$d" ;;
	rxe) rdma_bw in$k in$k rxi$k in0 rxi0 10.79.0.1 $((18700 + k)) -s 65536 -D "$d" ;;
	esac
}
# isw_window N SECS -> two lines "<time ns> <port0 tx> <port1 rx> .. <portN rx>" SECS apart
# (what left the bottleneck towards the receiver, what each sender put in, retransmissions
# included), the first once every sender has put 256 KiB into the bridge (so all flows run in
# the window), or after DUR/2 seconds (`net_window` in lib.sh).
isw_window() {
	net_window "$ISW_PID" $((DUR / 2 + 1)) "$2" 3 0 tx:port0 $(seq -f 'rx:port%g' 1 "$1")
}
# tc rate (50mbit, 1gbit, ...) in Gb/s.
rate_gbps() {
	echo "$1" | awk '{ v = $1 + 0; u = tolower($1); sub(/^[0-9.]+/, "", u)
		m = (u ~ /^g/) ? 1 : (u ~ /^m/) ? 1e-3 : (u ~ /^k/) ? 1e-6 : 1e-9
		if (u ~ /bps$/) m *= 8
		print v * m }'
}
scenario_incast() {
	local t rep n k v sum sumsq bad win case pids
	for n in $INCAST; do
		incast_up "$n"
		case="$n-to-1, receiver port $INCAST_RATE"
		for rep in $(seq 1 "$REPS"); do
			for t in $TRANSPORTS; do
				pids=()
				for k in $(seq 1 "$n"); do
					incast_flow $t "$k" "$DUR" >"$W/in$k.val" &
					pids+=($!)
				done
				# The bridge's counters over the middle of the runs: what perftest reports
				# rests on its cycle counter, calibrated at start, which a loaded TCG
				# guest makes unreliable; and rxe's load is mostly go-back-N resends.
				win=$(isw_window "$n" $((DUR / 2)))
				wait "${pids[@]}"
				sum=0 sumsq=0 bad=""
				for k in $(seq 1 "$n"); do
					v=$(cat "$W/in$k.val")
					if isnum "$v"; then
						sum=$(awk -v a="$sum" -v b="$v" 'BEGIN { print a + b }')
						sumsq=$(awk -v a="$sumsq" -v b="$v" 'BEGIN { print a + b * b }')
					else bad="sender $k: $v"; fi
				done
				sample incast "$case" "$n" $t bw Gb/s "$rep" "${bad:-$sum}"
				# Jain's fairness index over the senders: 1 is a fair share each.
				sample incast "$case" "$n" $t fairness jain "$rep" "${bad:-$(awk \
					-v s="$sum" -v q="$sumsq" -v n="$n" 'BEGIN { if (q > 0) printf "%.3f", s * s / (n * q); else print "zero throughput" }')}"
				# From the bridge: the bottleneck's load (bytes towards the receiver over its
				# rate, retransmissions included) and Jain over what each sender put in.
				sample incast "$case, bottleneck load at the bridge (1 = line rate)" "$n" $t load ratio "$rep" \
					"$(echo "$win" | awk -v r="$(rate_gbps "$INCAST_RATE")" 'NR == 1 { split($0, A) }
						NR == 2 { split($0, B); dt = (B[1] - A[1]) / 1e9
							if (dt > 0 && r > 0) printf "%.3f", (B[2] - A[2]) * 8 / dt / 1e9 / r
							else print "no window" }')"
				sample incast "$case, Jain over the bytes each sender put into the bridge" "$n" $t jain_bridge jain "$rep" \
					"$(echo "$win" | awk 'NR == 1 { split($0, A) }
						NR == 2 { n = split($0, B); s = 0; q = 0
							for (i = 3; i <= n; i++) { d = B[i] - A[i]; s += d; q += d * d }
							if (q > 0) printf "%.3f", s * s / ((n - 2) * q); else print "nothing sent" }')"
			done
		done
		incast_down "$n"
	done
}

# --- connection scaling -----------------------------------------------------------------------
# Kernel memory in KiB: "slab vmalloc". Both transports' rings are vmalloc_user, so vmalloc is
# the rings and slab what a QP costs beyond them (kmalloc allocations over a page, taken from
# the page allocator, are counted in Slab too).
kmem_kib() { awk '/^Slab:/ { s = $2 } /^VmallocUsed:/ { v = $2 } END { print s, v }' /proc/meminfo; }
qps_open() { # the most QPs any one device of PREFIX has
	$RDMA resource show 2>/dev/null | awk -v p="$1" '$2 ~ "^"p {
		for (i = 3; i < NF; i++) if ($i == "qp") { if ($(i + 1) > m) m = $(i + 1) } }
		END { print m + 0 }'
}
scenario_conns() {
	local t rep q="$CONNS" procs="$CONN_PROCS" per k p before peak open maxopen sum v bad d base
	local sbefore vbefore speak vpeak sv vv
	# One table for the baseline and the big run: the same writes, the same depth per QP.
	local case="RC QPs, 4 KiB writes, 16 outstanding per QP (8: one perftest process; $q: $procs processes)"
	per=$((q / procs))
	d=$((DUR + per / 100 + 4))
	# Setting up and connecting a thousand QPs takes a while under TCG (dynamic scope: the
	# tool runners below see this TMO).
	local TMO=$((d * 4 + 60 + per / 4))
	for rep in $(seq 1 "$REPS"); do
		for t in metaroce rxe; do
			p=$(dev_of $t)
			# The baseline the goal compares with ("at least 90% of the 8-QP figure"): 8 QPs
			# moving the same 4 KiB writes (the qps scenario's 64 KiB ones move 16x the bytes
			# per WQE).
			base=$(rdma_bw cb ns1 ${p}1 ns2 ${p}2 $NS2_ADDR 18800 -s 4096 -q 8 -t 16 -D "$DUR")
			sample conns "$case" 8 $t bw Gb/s "$rep" "$base"
			sync
			read -r sbefore vbefore <<<"$(kmem_kib)"
			before=$((sbefore + vbefore))
			for k in $(seq 1 "$procs"); do
				rdma_bw cn$k ns1 ${p}1 ns2 ${p}2 $NS2_ADDR $((18800 + k)) -s 4096 -q "$per" -t 16 -D "$d" \
					>"$W/cn$k.val" &
			done
			peak=$before speak=$sbefore vpeak=$vbefore maxopen=0
			# Sample while the runs are on: the most QPs open at once and the kernel memory then.
			while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
				open=$(qps_open "${p}1")
				if [ "$open" -ge "$maxopen" ]; then
					maxopen=$open
					read -r sv vv <<<"$(kmem_kib)"
					v=$((sv + vv))
					[ "$v" -le "$peak" ] || { peak=$v speak=$sv vpeak=$vv; }
				fi
				sleep 0.5
			done
			wait
			sum=0 bad=""
			for k in $(seq 1 "$procs"); do
				v=$(cat "$W/cn$k.val")
				if isnum "$v"; then sum=$(awk -v a="$sum" -v b="$v" 'BEGIN { print a + b }'); else bad="process $k: $v"; fi
			done
			sample conns "$case" "$q" $t bw Gb/s "$rep" "${bad:-$sum}"
			sample conns "$case" "$q" $t qps_open count "$rep" "$maxopen"
			if [ -z "$bad" ] && isnum "$base" && awk -v b="$base" 'BEGIN { exit !(b > 0) }'; then
				sample conns "throughput at $q QPs over that at 8 QPs (the goal: at least 0.9)" "$q" $t \
					scaling ratio "$rep" "$(awk -v a="$sum" -v b="$base" 'BEGIN { printf "%.3f", a / b }')"
			else
				sample conns "throughput at $q QPs over that at 8 QPs (the goal: at least 0.9)" "$q" $t \
					scaling ratio "$rep" "no baseline or no total"
			fi
			if [ "$maxopen" -gt 0 ]; then
				# Both ends are in this guest: 2 x maxopen QPs (with perftest's MRs and CQs).
				sample conns "kernel memory per QP (slab + vmalloc, both ends, MR/CQ share included)" "$q" $t \
					kmem_per_qp KiB "$rep" "$(awk -v a="$peak" -v b="$before" -v n=$((2 * maxopen)) \
					'BEGIN { printf "%.2f", (a - b) / n }')"
				sample conns "kernel memory per QP beyond its rings (slab, both ends, MR/CQ share included)" "$q" $t \
					kmem_slab_per_qp KiB "$rep" "$(awk -v a="$speak" -v b="$sbefore" -v n=$((2 * maxopen)) \
					'BEGIN { printf "%.2f", (a - b) / n }')"
				sample conns "rings per QP (vmalloc, both ends)" "$q" $t \
					kmem_rings_per_qp KiB "$rep" "$(awk -v a="$vpeak" -v b="$vbefore" -v n=$((2 * maxopen)) \
					'BEGIN { printf "%.2f", (a - b) / n }')"
			else
				sample conns "kernel memory per QP (slab + vmalloc, both ends, MR/CQ share included)" "$q" $t \
					kmem_per_qp KiB "$rep" "no QP seen open"
			fi
		done
		not_measured conns "$case" "$q" tcp bw Gb/s "RC QPs only"
	done
}

# --- main ---------------------------------------------------------------------------------
modprobe metaroce || { echo "bench: modprobe metaroce failed" >&2; exit 1; }
modprobe rdma_rxe || { echo "bench: modprobe rdma_rxe failed" >&2; exit 1; }
progress "profile $PROFILE: $REPS repetition(s), ${DUR}s per run, shaped links $RATE (planes $PLANE_RATE); samples in $CSV"

pair_up
for s in bw_size lat_size qps loss reorder conns; do
	wanted $s || continue
	progress "--- $s"
	"scenario_$s"
done
if wanted planes || wanted cut; then
	max=$CUT_PLANES
	for n in $PLANES; do [ "$n" -le "$max" ] || max=$n; done
	planes_up "$max"
	if wanted planes; then progress "--- planes"; scenario_planes; fi
	if wanted cut; then progress "--- cut (plane)"; scenario_cut; fi
	planes_down
fi
pair_down
if wanted multipath; then progress "--- multipath"; scenario_multipath; fi
if wanted cut; then progress "--- cut (spine)"; scenario_spine_cut; fi
if wanted incast; then progress "--- incast"; scenario_incast; fi

echo "finished=$(date -u +%FT%TZ)" >>"$OUT/env.txt"
echo "elapsed_s=$((SECONDS - START))" >>"$OUT/env.txt"
dmesg | grep -E "$KERNEL_TROUBLE" | head -n 20 >"$OUT/kernel-trouble.txt" || true
progress "done: $(($(wc -l <"$CSV") - 1)) samples"
