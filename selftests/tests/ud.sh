#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# UD QPs from userspace (DATAGRAM packets, datapath/ud.rs) with stock tools between two
# namespaces: ibv_ud_pingpong with data checked (-c), completion events, IPv6, both ends on one
# device; perftest's UD send bandwidth and latency; multicast; then the datagram counters and
# a clean kernel log.
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
setup_pair metaroce mroce

counter() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2"; }
sent0=$(counter mroce1 datagrams_sent)
rcvd0=$(counter mroce2 datagrams_rcvd)

# server in ns2 on mroce2 (UD_SERVER=1: in ns1 on mroce1, the client's device), client in ns1;
# GID index UD_GID (1: the IPv4 RoCEv2 GID).
ud_pingpong() { # what, extra args
	local what="$1" sdev=mroce2 sns=ns2 addr=$NS2_ADDR
	shift
	[ -z "${UD_SERVER:-}" ] || { sdev=mroce1; sns=ns1; addr=127.0.0.1; }
	$IP netns exec $sns timeout 60 ibv_ud_pingpong -d $sdev -g "${UD_GID:-1}" "$@" \
		>"$TAP_DIR/ud-server.log" 2>&1 &
	local srv=$!
	sleep 1
	check_output "$what" 'bytes in .* seconds' \
		$IP netns exec ns1 timeout 60 ibv_ud_pingpong -d mroce1 -g "${UD_GID:-1}" "$@" "$addr"
	wait $srv || { echo "# server:"; sed 's/^/# /' "$TAP_DIR/ud-server.log"; }
}
ud_pingpong "ibv_ud_pingpong, 1 KiB x 500, data checked (-c)" -n 500 -s 1024 -c
ud_pingpong "ibv_ud_pingpong with completion events (-e), data checked" -n 200 -s 512 -e -c
gid6=$(gid_index mroce1 '^fd77:')
UD_GID=$gid6 ud_pingpong "ibv_ud_pingpong over IPv6 (GID $gid6), data checked" -n 200 -s 1024 -c
UD_SERVER=1 ud_pingpong "ibv_ud_pingpong with both ends on mroce1, data checked" -n 200 -s 1024 -c

perftest "ib_send_bw -c UD, 1 KiB" ib_send_bw -c UD -s 1024 -n 500
perftest "ib_send_lat -c UD, 2 bytes" ib_send_lat -c UD -s 2 -n 200

# Multicast through the plain verbs (selftests/dv/metaroce_mcast_test.c): S on mroce1 sends to
# an IPv4 and an IPv6 group that A and B on mroce2 and C on mroce1 attached to; the device's
# limits. Each of its results is one TAP line.
MCAST=$(command -v metaroce_mcast_test || echo /usr/local/bin/metaroce_mcast_test)
timeout 300 "$MCAST" mroce1 mroce2 >"$TAP_DIR/mcast.out" 2>&1
mcast_rc=$?
grep -Ev '^(ok|FAIL) ' "$TAP_DIR/mcast.out" | sed 's/^/# /'
mcast() { # NAME "what": the program printed "ok NAME"
	if grep -qx "ok $1" "$TAP_DIR/mcast.out"; then
		_tap 0 "$2"
		return
	fi
	grep "^FAIL $1:" "$TAP_DIR/mcast.out" | sed 's/^/# /' | grep . || echo "# no result for $1"
	_tap 1 "$2"
}
for fam in ipv4 ipv6; do
	mcast attach_$fam "multicast ($fam group): three UD QPs attach (one twice: no error); a unicast GID and a group not attached are EINVAL"
	mcast deliver_$fam "multicast ($fam group): 8 datagrams reach each member, on the other host and on the sender's, data, immediate, source QP, GRH and sl (the header type) checked"
	mcast detach_$fam "multicast ($fam group): after a detach 4 more reach the other members and none the detached QP"
done
mcast limits_reported "max_mcast_grp, max_mcast_qp_attach reported, max_total_mcast_qp_attach their product"
mcast limit_per_group "max_mcast_qp_attach QPs attach to one group, one more is ENOMEM"
mcast limit_groups "one QP attaches to max_mcast_grp groups, one more is ENOMEM, all detach"
check "metaroce_mcast_test exit status 0 (exit $mcast_rc)" test "$mcast_rc" = 0

check "mroce1 counted its datagrams (datagrams_sent +$(($(counter mroce1 datagrams_sent) - sent0)))" \
	test "$(($(counter mroce1 datagrams_sent) - sent0))" -ge 700
check "mroce2 counted what it took (datagrams_rcvd +$(($(counter mroce2 datagrams_rcvd) - rcvd0)))" \
	test "$(($(counter mroce2 datagrams_rcvd) - rcvd0))" -ge 700

teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
