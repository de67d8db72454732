#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# A/B of module builds in one guest boot: latency and bandwidth of each metaroce.ko variant and
# of rxe, on the same veth pair, in alternating rounds (so a change in the host's load hits
# every variant alike). A developer's tool, not a test.
#
#   make payload; cp other/metaroce.ko build/guest/variants/old.ko; cp metaroce.ko build/guest/variants/new.ko
#   make vm CMD='bash /opt/metaroce/selftests/ab.sh'      # ROUNDS=3 LAT_N=1000 DUR=4 by default
#   TESTS="write_lat send_lat write_bw send_bw reorder_bw reorder_retx loss1_bw loss10_bw write_kcpu"
#   (default: write_lat send_lat write_bw)
#
# Prints one line per run ("variant round test value unit") and a Markdown table of medians; a
# failed run's output goes to failed-*.log in the current directory.
set -u
source "$(dirname "$0")/lib.sh"
VARIANTS_DIR=${VARIANTS_DIR:-/mnt/ci/payload/variants}
ROUNDS=${ROUNDS:-3}
LAT_N=${LAT_N:-1000}
DUR=${DUR:-4}
TESTS=${TESTS:-"write_lat send_lat write_bw"}
UPDATES=/lib/modules/$(uname -r)/updates
OUT=$(mktemp -d)

variants=()
for f in "$VARIANTS_DIR"/*.ko; do [ -e "$f" ] && variants+=("$(basename "$f" .ko)"); done
[ "${#variants[@]}" -gt 0 ] || variants=(installed)

use() { # variant: load it (or rxe) and set up the pair
	teardown_pair
	modprobe -r metaroce 2>/dev/null
	if [ "$1" = rxe ]; then
		modprobe rdma_rxe && setup_pair rxe rxe
		return
	fi
	if [ "$1" != installed ]; then
		mkdir -p "$UPDATES" && cp "$VARIANTS_DIR/$1.ko" "$UPDATES/metaroce.ko" && depmod -a
	fi
	modprobe metaroce && setup_pair metaroce mroce
}

REORDER=${REORDER:-delay 1ms reorder 75% 50%}
retransmits() { cat /sys/class/infiniband/mroce1/ports/1/hw_counters/retransmits 2>/dev/null || echo 0; }

# Kernel CPU time so far, all CPUs, in USER_HZ ticks: system, irq and softirq (where the
# transports run; perftest's busy polling of its CQ is user time and is left out).
kernel_ticks() { awk '$1 == "cpu" { print $4 + $7 + $8 }' /proc/stat; }
# Bytes veth2 (the receiving end) has received so far.
rx_bytes() { $IP netns exec ns2 cat /sys/class/net/veth2/statistics/rx_bytes; }

# run PREFIX TEST -> the value (us for latency, t_typical; Gb/s for bandwidth; a count) or
# "failed". reorder_bw: write_bw with netem $REORDER on the data direction; reorder_retx: the
# retransmissions metaroce made in the reorder_bw run before it (rxe has no such counter);
# loss1_bw, loss10_bw: write_bw at line rate with netem dropping 1% or 10% of the data
# direction's packets.
run() {
	local p="$1" t="$2" tool args col try v r0
	case "$t" in
	reorder_retx)
		cat "$OUT/retx" 2>/dev/null || echo failed
		return
		;;
	write_kcpu)
		# Kernel CPU per byte moved: ns of kernel time (both ends, every CPU) per KiB that
		# reached veth2, over a write_bw run: a change in the data path's cost shows here
		# when the throughput's spread between runs under TCG hides it.
		local k0 b0 k1 b1 hz
		hz=$(getconf CLK_TCK)
		k0=$(kernel_ticks) b0=$(rx_bytes)
		v=$(run "$p" write_bw)
		k1=$(kernel_ticks) b1=$(rx_bytes)
		[ "$v" = failed ] && { echo failed; return; }
		awk -v k=$((k1 - k0)) -v b=$((b1 - b0)) -v hz="$hz" 'BEGIN { printf "%.0f\n", k * 1e9 / hz / (b / 1024) }'
		return
		;;
	reorder_bw)
		r0=$(retransmits)
		# shellcheck disable=SC2086
		tc -n ns1 qdisc replace dev veth1 root netem limit 10000 $REORDER
		v=$(run "$p" write_bw)
		tc -n ns1 qdisc del dev veth1 root
		if [ "$p" = mroce ]; then
			echo $(($(retransmits) - r0)) >"$OUT/retx"
			grep '^peer' /sys/class/infiniband/mroce1/peers | sed 's/^/# mroce1 /' >&2
		else
			echo - >"$OUT/retx"
		fi
		echo "$v"
		return
		;;
	loss1_bw | loss10_bw)
		local pct=${t#loss}
		tc -n ns1 qdisc replace dev veth1 root netem limit 10000 loss "${pct%_bw}%"
		v=$(run "$p" write_bw)
		tc -n ns1 qdisc del dev veth1 root
		echo "$v"
		return
		;;
	write_lat) tool=ib_write_lat args=(-s 2 -n "$LAT_N") col=5 ;;
	send_lat) tool=ib_send_lat args=(-s 2 -n "$LAT_N") col=5 ;;
	write_bw) tool=ib_write_bw args=(-s 65536 -D "$DUR" --report_gbits) col=4 ;;
	send_bw) tool=ib_send_bw args=(-s 65536 -D "$DUR" --report_gbits) col=4 ;;
	*) echo "unknown"; return ;;
	esac
	for try in 1 2 3; do
		$IP netns exec ns2 timeout 120 "$tool" -d "${p}2" -x 1 "${args[@]}" >"$OUT/srv" 2>&1 &
		sleep 1
		$IP netns exec ns1 timeout 120 "$tool" -d "${p}1" -x 1 "${args[@]}" $NS2_ADDR >"$OUT/cli" 2>&1
		wait
		v=$(grep -E '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$OUT/cli" | tail -n 1 | awk -v c="$col" '{ print $c }')
		[ -n "$v" ] && { echo "$v"; return; }
		perftest_uncalibrated "$OUT/cli" || break
	done
	# The last try's output, for a look afterwards: in the result directory (the cwd).
	{
		echo "== client: $tool ${args[*]}"
		cat "$OUT/cli"
		echo "== server"
		cat "$OUT/srv"
		echo "== counters"
		rdma statistic show link "${p}1/1"
		rdma statistic show link "${p}2/1"
		echo "== kernel log"
		dmesg | tail -n 30
	} >"failed-$p-$t-$(date +%s).log" 2>&1
	echo failed
}

modprobe rdma_rxe
for r in $(seq 1 "$ROUNDS"); do
	for v in "${variants[@]}" rxe; do
		use "$v" || { echo "$v $r load failed"; continue; }
		p=mroce
		[ "$v" = rxe ] && p=rxe
		for t in $TESTS; do
			echo "$v $r $t $(run "$p" "$t")" | tee -a "$OUT/all"
		done
	done
done
teardown_pair

echo
echo "| variant | $(echo "$TESTS" | sed 's/ / | /g') |"
echo "|---$(for _ in $TESTS; do printf '|---'; done)|"
for v in "${variants[@]}" rxe; do
	printf '| %s |' "$v"
	for t in $TESTS; do
		awk -v v="$v" -v t="$t" '$1 == v && $3 == t && $4 ~ /^[0-9.]+$/ { x[n++] = $4 + 0 }
			END {
				if (!n) { printf " - |"; exit }
				for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (x[j] < x[i]) { s = x[i]; x[i] = x[j]; x[j] = s }
				m = (n % 2) ? x[int(n / 2)] : (x[n / 2 - 1] + x[n / 2]) / 2
				printf " %s (%s-%s, n=%d) |", m, x[0], x[n - 1], n
			}' "$OUT/all"
	done
	echo
done
