#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Side-by-side ib_write_bw (64 KiB) for metaroce and rxe on the same veth pair in one guest,
# at 0%, 1% and 10% loss on the data direction. Prints a Markdown table. (make bench grows
# out of this.)
set -u
source "$(dirname "$0")/lib.sh"
modprobe metaroce
modprobe rdma_rxe
setup_pair metaroce mroce
$IP netns exec ns1 $RDMA link add rxe1 type rxe netdev veth1
$IP netns exec ns2 $RDMA link add rxe2 type rxe netdev veth2
ITER=${ITER:-200}

bw() { # device-prefix -> average Gb/s of ib_write_bw 64 KiB
	local dev="$1" out try
	for try in 1 2 3; do
		$IP netns exec ns2 timeout 120 ib_write_bw -d "${dev}2" -x 1 -s 65536 -n "$ITER" \
			--report_gbits >/dev/null 2>&1 &
		sleep 1
		out=$($IP netns exec ns1 timeout 120 ib_write_bw -d "${dev}1" -x 1 -s 65536 -n "$ITER" \
			--report_gbits $NS2_ADDR 2>&1)
		wait
		out=$(printf '%s\n' "$out" | awk '$1 == 65536 {print $4}' | tail -n 1)
		[ -n "$out" ] && { echo "$out"; return; }
	done
	echo "failed"
}

echo "| loss | metaroce Gb/s | rxe Gb/s | metaroce/rxe | metaroce kept | rxe kept |"
echo "|---|---|---|---|---|---|"
base_m="" base_r=""
for loss in 0 1 10; do
	if [ "$loss" = 0 ]; then
		tc -n ns1 qdisc del dev veth1 root 2>/dev/null || true
	else
		tc -n ns1 qdisc replace dev veth1 root netem loss "$loss%"
	fi
	m=$(bw mroce)
	r=$(bw rxe)
	[ -n "$base_m" ] || base_m=$m
	[ -n "$base_r" ] || base_r=$r
	ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == a + 0 && b == b + 0 && b > 0) printf "%.2f", a / b; else print "-" }'; }
	echo "| $loss% | $m | $r | $(ratio "$m" "$r") | $(ratio "$m" "$base_m") | $(ratio "$r" "$base_r") |"
done
