#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Data between two namespaces with stock tools: ibv_rc_pingpong (data checked with -c, and
# with completion events -e), then perftest.
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
setup_pair metaroce mroce

# server in ns2, client in ns1; GID index 1 is the IPv4 RoCEv2 GID.
pingpong() { # what, extra args
	local what="$1"
	shift
	$IP netns exec ns2 timeout 60 ibv_rc_pingpong -d mroce2 -g 1 "$@" >"$TAP_DIR/pp-server.log" 2>&1 &
	local srv=$!
	sleep 1
	check_output "$what" 'bytes in .* seconds' \
		$IP netns exec ns1 timeout 60 ibv_rc_pingpong -d mroce1 -g 1 "$@" $NS2_ADDR
	wait $srv || { echo "# server:"; sed 's/^/# /' "$TAP_DIR/pp-server.log"; }
}
pingpong "ibv_rc_pingpong, 4 KiB x 500, data checked (-c)" -n 500 -s 4096 -c
pingpong "ibv_rc_pingpong with completion events (-e)" -n 200 -s 1024 -e
pingpong "ibv_rc_pingpong 64 KiB messages" -n 50 -s 65536 -c

teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
