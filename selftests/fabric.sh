# SPDX-License-Identifier: GPL-2.0
# ECMP test fabrics inside the guest, out of network namespaces, veth pairs and router
# namespaces. Source it after lib.sh.
#
# Leaf/spine (fab_leafspine S): two hosts behind two leaves joined by S spines, every leaf
# spreading over the spines by ECMP hashed on the L4 5-tuple (fib_multipath_hash_policy=1), so
# on MetaRoCE's UDP source port, a path's entropy.
#
#   h1 eth0 10.80.1.1 -- leaf1 -+- s1:l1 spine1 l2:s1 -+- leaf2 -- h2 eth0 10.80.2.1
#                               +- sK:l1 spineK l2:sK -+
#   leaf1 sK 10.81.K.1 <-> spineK l1 10.81.K.2;  spineK l2 10.82.K.2 <-> leaf2 sK 10.82.K.1
#
# Planes (fab_planes P): P independent planes, each a router namespace planeK with its own
# subnets, and one netdev per plane on each host:
#
#   h1 pK 10.90.K.1 -- 10.90.K.254 planeK 10.91.K.254 -- h2 pK 10.91.K.1
#
# Both hosts are namespaces h1 and h2. RDMA devices are added separately, from inside their
# host's namespace: one per host netdev (fab_add_devices, metaroce or rxe), or one multi-plane
# metaroce device per host over its planes (fab_add_plane_devices).
#
# Links are named by a namespace and the interface in it (the near end); helpers shape them
# (tbf rate, netem delay/loss/reorder), cut and restore them while traffic runs, and read the
# byte and packet counters of either end.

FAB_H1_ADDR=10.80.1.1
FAB_H2_ADDR=10.80.2.1
FAB_SPINES=0
FAB_PLANES=0
FAB_NAMESPACES=()

_fab_ns() { # name: a namespace set up as a host or router (lo up, forwarding per role)
	$IP netns add "$1"
	FAB_NAMESPACES+=("$1")
	$IP -n "$1" link set lo up
	$IP netns exec "$1" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
}

_fab_router() { # name: forwarding, ECMP on the 5-tuple, nexthops over a dead link unused
	_fab_ns "$1"
	$IP netns exec "$1" sysctl -qw net.ipv4.ip_forward=1 \
		net.ipv4.fib_multipath_hash_policy=1 \
		net.ipv4.conf.all.ignore_routes_with_linkdown=1 \
		net.ipv4.conf.default.ignore_routes_with_linkdown=1
}

_fab_veth() { # ns1 dev1 addr1/len ns2 dev2 addr2/len
	$IP link add "$2" netns "$1" type veth peer name "$5" netns "$4"
	$IP -n "$1" addr add "$3" dev "$2"
	$IP -n "$4" addr add "$6" dev "$5"
	$IP -n "$1" link set "$2" up
	$IP -n "$4" link set "$5" up
}

# fab_leafspine [SPINES]: the leaf/spine fabric with SPINES spines (default 4).
fab_leafspine() {
	local s="${1:-4}" k nh1=() nh2=()
	FAB_SPINES=$s
	_fab_ns h1
	_fab_ns h2
	_fab_router leaf1
	_fab_router leaf2
	_fab_veth h1 eth0 $FAB_H1_ADDR/24 leaf1 host 10.80.1.254/24
	_fab_veth h2 eth0 $FAB_H2_ADDR/24 leaf2 host 10.80.2.254/24
	$IP -n h1 route add default via 10.80.1.254
	$IP -n h2 route add default via 10.80.2.254
	for k in $(seq 1 "$s"); do
		_fab_router spine$k
		_fab_veth leaf1 s$k 10.81.$k.1/24 spine$k l1 10.81.$k.2/24
		_fab_veth spine$k l2 10.82.$k.2/24 leaf2 s$k 10.82.$k.1/24
		_fab_spine_routes $k
		nh1+=(nexthop via 10.81.$k.2 dev s$k)
		nh2+=(nexthop via 10.82.$k.2 dev s$k)
	done
	$IP -n leaf1 route add 10.80.2.0/24 "${nh1[@]}"
	$IP -n leaf2 route add 10.80.1.0/24 "${nh2[@]}"
}

# _fab_spine_routes K: spine K's routes to the two hosts' subnets. A link set down loses the
# routes through it for good (the kernel flushes them; they do not come back with the link).
_fab_spine_routes() {
	$IP -n spine$1 route replace 10.80.1.0/24 via 10.81.$1.1
	$IP -n spine$1 route replace 10.80.2.0/24 via 10.82.$1.1
}

# fab_planes P: P independent planes (see the top).
fab_planes() {
	local p="$1" k
	FAB_PLANES=$p
	_fab_ns h1
	_fab_ns h2
	for k in $(seq 1 "$p"); do
		_fab_router plane$k
		_fab_veth h1 p$k 10.90.$k.1/24 plane$k h1 10.90.$k.254/24
		_fab_veth h2 p$k 10.91.$k.1/24 plane$k h2 10.91.$k.254/24
		$IP -n h1 route add 10.91.$k.0/24 via 10.90.$k.254 dev p$k
		$IP -n h2 route add 10.90.$k.0/24 via 10.91.$k.254 dev p$k
	done
}

# fab_plane_addr HOST K: the address of host 1 or 2 on plane K.
fab_plane_addr() { echo "10.9$(($1 - 1)).$2.1"; }

# fab_add_devices TYPE PREFIX: an RDMA device of TYPE (metaroce, rxe) on every host netdev,
# made from inside the host's namespace: on the leaf/spine fabric PREFIX1 in h1 and PREFIX2 in
# h2; on the planes PREFIX1pK and PREFIX2pK for plane K.
fab_add_devices() {
	local type="$1" prefix="$2" h k
	for h in 1 2; do
		if [ "$FAB_PLANES" -gt 0 ]; then
			for k in $(seq 1 "$FAB_PLANES"); do
				$IP netns exec h$h $RDMA link add ${prefix}${h}p$k type "$type" netdev p$k
			done
		else
			$IP netns exec h$h $RDMA link add ${prefix}${h} type "$type" netdev eth0
		fi
	done
}

# fab_add_plane_devices PREFIX [P]: one multi-plane metaroce device per host over planes 1..P
# (default all): PREFIX1 in h1 and PREFIX2 in h2, made on p1, the other planes added in order
# through the device's planes file (docs/multiplane.md). fab_grow_planes PREFIX P adds planes
# up to P later.
fab_add_plane_devices() {
	local prefix="$1" h
	for h in 1 2; do
		$IP netns exec h$h $RDMA link add ${prefix}$h type metaroce netdev p1
	done
	fab_grow_planes "$prefix" "${2:-$FAB_PLANES}"
}
fab_grow_planes() {
	local prefix="$1" p="$2" h k
	for h in 1 2; do
		for k in $(seq 2 "$p"); do
			if ! grep -q " p$k " /sys/class/infiniband/${prefix}$h/planes; then
				echo "+p$k" >/sys/class/infiniband/${prefix}$h/planes
			fi
		done
	done
}

# fab_teardown: every namespace the fabric made, then wait for their RDMA devices to go.
fab_teardown() {
	local ns
	for ns in "${FAB_NAMESPACES[@]}"; do
		$IP netns del "$ns" 2>/dev/null || true
	done
	FAB_NAMESPACES=()
	FAB_SPINES=0
	FAB_PLANES=0
	wait_for 20 sh -c "! $RDMA link show 2>/dev/null | grep -q 'mroce\|rxe'" || true
}

# fab_shape NS DEV RATE [NETEM ARGS...]: the egress of DEV in NS limited to RATE (tbf, e.g.
# 20mbit; "" for none), then, if given, netem (delay 5ms 2ms, loss 5%, reorder ...). With
# FAB_ECN=1 and no netem, the rate-limited queue marks ECN (codel) instead of only dropping at
# its tail, as a switch with ECN marking does. Replaces what was there; fab_unshape removes it.
fab_shape() {
	local ns="$1" dev="$2" rate="$3" parent=root
	shift 3
	$IP netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
	if [ -n "$rate" ]; then
		# A burst of ~10 ms of traffic (at least 32 KiB) and 50 ms of queue: rate-limited,
		# not policed to one packet.
		$IP netns exec "$ns" tc qdisc add dev "$dev" root handle 1: tbf rate "$rate" \
			burst 32kb latency 50ms
		parent="parent 1:1"
	fi
	if [ $# -gt 0 ]; then
		# shellcheck disable=SC2086
		$IP netns exec "$ns" tc qdisc add dev "$dev" $parent handle 10: netem limit 10000 "$@"
	elif [ -n "$rate" ] && [ "${FAB_ECN:-0}" = 1 ]; then
		$IP netns exec "$ns" tc qdisc add dev "$dev" $parent handle 10: codel limit 1000 \
			target 2ms interval 20ms ecn
	fi
}
fab_unshape() { $IP netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null || true; }

# fab_spine_rate RATE: every spine's capacity limited to RATE in both directions (the leaves'
# egress towards the spines). The hosts' own links stay unlimited.
fab_spine_rate() {
	local k
	for k in $(seq 1 "$FAB_SPINES"); do
		fab_shape leaf1 s$k "$1"
		fab_shape leaf2 s$k "$1"
	done
}

# fab_spine_netem K NETEM ARGS...: netem on spine K's data direction (leaf1 -> spine K),
# keeping RATE if given as FAB_RATE.
fab_spine_netem() {
	local k="$1"
	shift
	fab_shape leaf1 s$k "${FAB_RATE:-}" "$@"
}

# fab_plane_rate RATE: every plane's capacity limited to RATE in both directions.
fab_plane_rate() {
	local k
	for k in $(seq 1 "$FAB_PLANES"); do
		fab_shape plane$k h2 "$1"
		fab_shape plane$k h1 "$1"
	done
}

# fab_link_down NS DEV / fab_link_up NS DEV: `ip link set down/up` of one end. The peer loses
# carrier; routers at either end stop using nexthops over it (ignore_routes_with_linkdown),
# routers further away do not (as before routing converges).
fab_link_down() { $IP -n "$1" link set "$2" down; }
fab_link_up() { $IP -n "$1" link set "$2" up; }

# fab_blackhole NS DEV / fab_unblackhole NS DEV: the link between DEV in NS and its peer
# silently drops every UDP datagram in both directions while staying up, so routing keeps
# sending into it (a gray failure). Other traffic (the tests' TCP control connections) passes.
fab_blackhole() {
	local ns="$1" dev="$2" peer_ns peer_dev end
	read -r peer_ns peer_dev <<<"$(_fab_peer "$ns" "$dev")"
	for end in "$ns $dev" "$peer_ns $peer_dev"; do
		# shellcheck disable=SC2086
		set -- $end
		$IP netns exec "$1" tc qdisc add dev "$2" clsact
		$IP netns exec "$1" tc filter add dev "$2" ingress protocol ip prio 1 u32 \
			match ip protocol 17 0xff action drop
	done
}
fab_unblackhole() {
	local ns="$1" dev="$2" peer_ns peer_dev
	read -r peer_ns peer_dev <<<"$(_fab_peer "$ns" "$dev")"
	$IP netns exec "$ns" tc qdisc del dev "$dev" clsact 2>/dev/null || true
	$IP netns exec "$peer_ns" tc qdisc del dev "$peer_dev" clsact 2>/dev/null || true
}

# _fab_peer NS DEV: "peer-namespace peer-dev" of a fabric veth.
_fab_peer() {
	local ns="$1" dev="$2" idx n d
	idx=$($IP netns exec "$ns" cat /sys/class/net/"$dev"/iflink)
	for n in "${FAB_NAMESPACES[@]}"; do
		[ "$n" != "$ns" ] || continue
		d=$($IP -n "$n" -o link show 2>/dev/null | awk -F': ' -v i="$idx" '$1 == i { sub(/@.*/, "", $2); print $2 }')
		if [ -n "$d" ] && [ "$($IP netns exec "$n" cat /sys/class/net/"$d"/iflink)" = \
			"$($IP netns exec "$ns" cat /sys/class/net/"$dev"/ifindex)" ]; then
			echo "$n $d"
			return
		fi
	done
}

# fab_spine_down K / fab_spine_up K: spine K out of service (both its links down, so both
# leaves take it out of their ECMP groups: a failure after routing converged) and back.
fab_spine_down() {
	$IP -n spine$1 link set l1 down
	$IP -n spine$1 link set l2 down
}
fab_spine_up() {
	$IP -n spine$1 link set l1 up
	$IP -n spine$1 link set l2 up
	# Its routes went with its links: without them it would drop all it is given (it did,
	# for every test after the cut, until this was seen).
	_fab_spine_routes "$1"
	# Nexthops come back with the carrier; give the neighbours a moment.
	wait_for 5 sh -c "$IP -n leaf1 route show 10.80.2.0/24 | grep -q 's$1 .*weight' && \
		! $IP -n leaf1 route show 10.80.2.0/24 | grep -q 'dev s$1 .*linkdown'"
}

# fab_stat NS DEV STAT: one counter of an interface (rx_bytes, tx_bytes, rx_packets, ...).
fab_stat() { $IP netns exec "$1" cat /sys/class/net/"$2"/statistics/"$3"; }

# fab_spine_bytes: each spine's bytes forwarded in the data direction h1 -> h2 (received
# from leaf1), one line per spine.
fab_spine_bytes() {
	local k
	for k in $(seq 1 "$FAB_SPINES"); do
		fab_stat spine$k l1 rx_bytes
	done
}

# fab_sample NS DEV STAT INTERVAL COUNT [STOPFILE]: prints "seconds value" every INTERVAL
# seconds, COUNT times or until STOPFILE exists (run it in the background to follow a
# transfer). One shell inside NS reads the counter, so a sample costs no process but sleep.
fab_sample() {
	# shellcheck disable=SC2016
	$IP netns exec "$1" bash -c 'for ((i = 0; i < $4; i++)); do read -r v </sys/class/net/$1/statistics/$2
		echo "$EPOCHREALTIME $v"; [ -z "$5" ] || [ ! -e "$5" ] || break; sleep $3; done' \
		fab_sample "$2" "$3" "$4" "$5" "${6:-}"
}
