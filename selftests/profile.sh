#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Where the CPU goes: a perftest run between two namespaces, metaroce and rxe in turn, with
# `perf record` (cpu-clock, every CPU, 5 s from 3 s in) in the guest; prints the hottest
# symbols and the share of each command (metaroce_rx/N: the receive threads; swapper: idle).
# A developer's tool, not a test.
#
#   make vm CMD='bash /opt/metaroce/selftests/profile.sh'
#   PROFILES="m-bw r-bw m-lat r-lat" (the default), LIMIT=0.7 (percent)
#
# Under TCG there is no PMU: cpu-clock samples on a timer. perftest itself is stripped, so
# its own loops show as addresses.
set -u
source "$(dirname "$0")/lib.sh"
PROFILES=${PROFILES:-"m-bw r-bw m-lat r-lat"}
LIMIT=${LIMIT:-0.7}
command -v perf >/dev/null || { echo "profile: no perf in this guest" >&2; exit 1; }
sysctl -qw kernel.perf_event_paranoid=-1 kernel.kptr_restrict=0
OUT=$(mktemp -d)

prof() { # tag dev1 dev2 tool args...
	local tag="$1" d1="$2" d2="$3" tool="$4"
	shift 4
	$IP netns exec ns2 timeout 60 "$tool" -d "$d2" -x 1 "$@" >"$OUT/srv.log" 2>&1 &
	sleep 1.5
	$IP netns exec ns1 timeout 60 "$tool" -d "$d1" -x 1 "$@" $NS2_ADDR >"$OUT/cli.log" 2>&1 &
	sleep 3
	perf record -q -a -g -e cpu-clock -F 2000 -o "$OUT/$tag.data" -- sleep 5 2>/dev/null
	wait
	echo "=== $tag: $tool $*: $(grep -E '^ +[0-9]+ +[0-9]+ ' "$OUT/cli.log" | tail -n 1)"
	perf report -i "$OUT/$tag.data" --no-children --sort sym -g none --percent-limit "$LIMIT" \
		--stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 45
	echo "--- $tag by command"
	perf report -i "$OUT/$tag.data" --no-children --sort comm -g none --stdio 2>/dev/null |
		grep -v '^#' | grep -v '^$' | head -n 10
}

for p in $PROFILES; do
	case "$p" in
	m-*) teardown_pair; modprobe metaroce && setup_pair metaroce mroce; d=mroce ;;
	r-*) teardown_pair; modprobe rdma_rxe && setup_pair rxe rxe; d=rxe ;;
	esac
	case "$p" in
	*-bw) prof "$p" ${d}1 ${d}2 ib_write_bw -s 65536 -D 10 --report_gbits ;;
	*-lat) prof "$p" ${d}1 ${d}2 ib_write_lat -s 2 -n 60000 ;;
	*) echo "profile: unknown profile $p" >&2 ;;
	esac
done
teardown_pair
rm -rf "$OUT"
