#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Data between two namespaces with stock tools: ibv_rc_pingpong (data checked with -c, and
# with completion events -e; over IPv4, IPv6 and IPv6 link-local GIDs; both ends on one
# device), the perftest matrix, UC QPs (ibv_uc_pingpong, perftest -c UC), then the same under netem loss,
# reordering, duplication and corruption on the data direction.
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
setup_pair metaroce mroce

# server in ns2 on mroce2 (PP_SERVER: in ns1 on mroce1, the same device as the client), client
# in ns1; GID index PP_GID, by default 1, the IPv4 RoCEv2 GID.
pingpong() { # what, extra args
	local what="$1" sdev=mroce2 sns=ns2
	shift
	[ -z "${PP_SERVER:-}" ] || { sdev=mroce1; sns=ns1; }
	$IP netns exec $sns timeout 60 "${PP_TOOL:-ibv_rc_pingpong}" -d $sdev -g "${PP_GID:-1}" "$@" \
		>"$TAP_DIR/pp-server.log" 2>&1 &
	local srv=$!
	sleep 1
	check_output "$what" 'bytes in .* seconds' \
		$IP netns exec ns1 timeout 60 "${PP_TOOL:-ibv_rc_pingpong}" -d mroce1 -g "${PP_GID:-1}" "$@" \
		"$([ -n "${PP_SERVER:-}" ] && echo 127.0.0.1 || echo $NS2_ADDR)"
	wait $srv || { echo "# server:"; sed 's/^/# /' "$TAP_DIR/pp-server.log"; }
}
pingpong "ibv_rc_pingpong, 4 KiB x 500, data checked (-c)" -n 500 -s 4096 -c
pingpong "ibv_rc_pingpong with completion events (-e)" -n 200 -s 1024 -e
pingpong "ibv_rc_pingpong 64 KiB messages, data checked" -n 50 -s 65536 -c
# IPv6: the global address's GID and the link-local one (index 0, the GID rdma-core's own
# tests choose); and both ends on one device (a connection to itself), over IPv4 and IPv6.
gid6=$(gid_index mroce1 '^fd77:')
PP_GID=$gid6 pingpong "ibv_rc_pingpong over IPv6 (fd77::, GID $gid6), 4 KiB x 200, data checked" -n 200 -s 4096 -c
PP_GID=0 pingpong "ibv_rc_pingpong over IPv6 link-local (GID 0), 64 KiB x 50, data checked" -n 50 -s 65536 -c
PERF_GID=$gid6 perftest "ib_write_bw over IPv6 (fd77::)" ib_write_bw -s 65536 -n 100
PERF_GID=$gid6 perftest "ib_read_bw over IPv6 (fd77::)" ib_read_bw -s 65536 -n 50
PP_SERVER=1 pingpong "ibv_rc_pingpong with both ends on mroce1 (IPv4), data checked" -n 200 -s 4096 -c
PP_SERVER=1 PP_GID=0 pingpong "ibv_rc_pingpong with both ends on mroce1 (IPv6 link-local), data checked" -n 200 -s 4096 -c

perftest "ib_write_bw 64 KiB" ib_write_bw -s 65536 -n 100
perftest "ib_write_bw 1 MiB" ib_write_bw -s 1048576 -n 5
perftest "ib_write_bw 2 bytes" ib_write_bw -s 2 -n 200
perftest "ib_write_bw 2 QPs" ib_write_bw -s 65536 -n 50 -q 2
perftest "ib_write_bw 8 QPs" ib_write_bw -s 65536 -n 50 -q 8
perftest "ib_write_bw bidirectional" ib_write_bw -s 65536 -n 50 -b
perftest "ib_write_bw all sizes 2 B .. 8 MiB" ib_write_bw -a -n 5
perftest "ib_send_bw with completion events" ib_send_bw -s 65536 -n 50 -e
perftest "ib_send_bw over an SRQ" ib_send_bw -s 65536 -n 50 --use-srq
perftest "ib_send_bw, 4 QPs sharing one SRQ" ib_send_bw -s 65536 -n 50 -q 4 --use-srq
perftest "ib_send_bw 4 KiB, 8 QPs sharing one SRQ" ib_send_bw -s 4096 -n 200 -q 8 --use-srq
perftest "ib_read_bw 64 KiB" ib_read_bw -s 65536 -n 50
perftest "ib_send_bw 64 KiB" ib_send_bw -s 65536 -n 50
perftest "ib_atomic_bw" ib_atomic_bw -n 200
perftest "ib_write_lat 2 bytes" ib_write_lat -s 2 -n 200
perftest "ib_read_lat 2 bytes" ib_read_lat -s 2 -n 100
perftest "ib_send_lat 2 bytes" ib_send_lat -s 2 -n 200
perftest "ib_write_lat 64 bytes inline (-I 64)" ib_write_lat -s 64 -I 64 -n 200
perftest "ib_send_bw 128 bytes inline (-I 128)" ib_send_bw -s 128 -I 128 -n 500
perftest "ib_atomic_lat" ib_atomic_lat -n 100
# UC QPs ride the same streams as RC (a failed message is dropped, not NAKed).
PP_TOOL=ibv_uc_pingpong pingpong "ibv_uc_pingpong, 4 KiB x 500, data checked (-c)" -n 500 -s 4096 -c
perftest "ib_write_bw -c UC 64 KiB" ib_write_bw -c UC -s 65536 -n 100
perftest "ib_send_bw -c UC 4 KiB" ib_send_bw -c UC -s 4096 -n 200
perftest "ib_write_lat -c UC 2 bytes" ib_write_lat -c UC -s 2 -n 200

# qperf's RC tests run over rdma_cm (-cm1) in rdmacm.sh: without it, Debian's qperf 0.4.11 sets
# no GRH in the address vector, which the RDMA core refuses on any RoCE port (rxe's too).

# A lossy, reordering, duplicating, corrupting link in the data direction (ns1 -> ns2).
tc -n ns1 qdisc add dev veth1 root netem loss 1%
perftest "ib_write_bw 64 KiB at 1% loss" ib_write_bw -s 65536 -n 100
perftest "ib_read_bw 64 KiB at 1% loss" ib_read_bw -s 65536 -n 50
tc -n ns1 qdisc change dev veth1 root netem loss 10%
retx_before=$(cat /sys/class/infiniband/mroce1/ports/1/hw_counters/retransmits)
perftest "ib_write_bw 64 KiB at 10% loss" ib_write_bw -s 65536 -n 100
retx_after=$(cat /sys/class/infiniband/mroce1/ports/1/hw_counters/retransmits)
check "10% loss: the sender's retransmits counter grew ($retx_before -> $retx_after)" \
	test "$retx_after" -gt "$retx_before"
check_output "rdma statistic shows the transport counters" 'retransmits [1-9]' \
	$RDMA statistic show link mroce1/1
perftest "ib_send_bw 64 KiB at 10% loss" ib_send_bw -s 65536 -n 50
pingpong "ibv_rc_pingpong at 10% loss, data checked" -n 100 -s 4096 -c
# UC would lose whole messages here; over MetaRoCE's streams it loses none.
PP_TOOL=ibv_uc_pingpong pingpong "ibv_uc_pingpong at 10% loss, data checked: no message lost" -n 100 -s 4096 -c
tc -n ns1 qdisc change dev veth1 root netem delay 1ms reorder 75% 50%
perftest "ib_write_bw 64 KiB, 25% reordered" ib_write_bw -s 65536 -n 100
tc -n ns1 qdisc change dev veth1 root netem duplicate 1% corrupt 1%
perftest "ib_write_bw 64 KiB, 1% duplicated and 1% corrupted" ib_write_bw -s 65536 -n 100
pingpong "ibv_rc_pingpong, 1% duplicated and corrupted, data checked" -n 100 -s 4096 -c
tc -n ns1 qdisc del dev veth1 root

teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
