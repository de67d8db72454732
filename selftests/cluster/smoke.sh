#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The cluster's fabric and RDMA between guests, run on g1 (qemu-ci/run-cluster.sh; TAP): every
# guest answers on the control network and on every plane, ssh reaches it, and metaroce carries
# verbs traffic (ibv_rc_pingpong, ib_write_bw) and rdma_cm (rping) from g1 to each other guest
# on every port (plane).
set -u
. /opt/metaroce/selftests/lib.sh
. /opt/metaroce/selftests/cluster/lib.sh
N=$CLUSTER_N P=$CLUSTER_P

# pair_run "what" HOST PORT SERVER CLIENT: SERVER on HOST (in the background, through ssh),
# then CLIENT here once the server listens on PORT; both must succeed, and a server left
# behind is killed (its port would answer the next client). Output goes to files named after
# what.
pair_run() {
	local what="$1" host="$2" port="$3" server="$4" client="$5" log srv rc=0
	log=$(echo "$what" | tr -c 'a-zA-Z0-9\n' '_')
	remote "$host" "$server" >"$log.server" 2>&1 &
	srv=$!
	if wait_for 60 listening "$host" "$port"; then
		timeout 120 bash -c "$client" >"$log.client" 2>&1 || rc=$?
	else
		echo "the server did not listen on port $port within 60 s" >"$log.client"
		rc=1
	fi
	if ! wait_for 30 sh -c "! kill -0 $srv"; then
		remote "$host" "pkill -x ${server%% *}"
		kill "$srv" 2>/dev/null
		rc=1
	fi
	wait "$srv" || rc=$?
	if [ "$rc" != 0 ]; then
		sed 's/^/# server: /' "$log.server" | tail -n 15
		sed 's/^/# client: /' "$log.client" | tail -n 15
	fi
	_tap "$rc" "$what"
}

for j in $(seq 2 "$N"); do
	check "g$j answers on the control network" ping -c 2 -W 5 g$j
	for p in $(seq 1 "$P"); do
		check "g$j answers on plane $p" ping -c 2 -W 5 -I p$p g$j-p$p
	done
	check_output "ssh g$j runs a command there" "^g$j\$" remote g$j hostname
	check_output "g$j has mroce0 with $P ACTIVE ports" "^$P\$" \
		remote g$j "rdma link show | grep -c '^link mroce0/.* state ACTIVE'"
done

for j in $(seq 2 "$N"); do
	for p in $(seq 1 "$P"); do
		gid=$(ipv4_gid mroce0 "$p") || gid=1
		pair_run "ibv_rc_pingpong g1 -> g$j on port $p (plane $p), 200 x 4 KiB" g$j 18515 \
			"ibv_rc_pingpong -d mroce0 -i $p -g $gid -s 4096 -n 200" \
			"ibv_rc_pingpong -d mroce0 -i $p -g $gid -s 4096 -n 200 g$j"
	done
	pair_run "ib_write_bw g1 -> g$j on port 1, 64 KiB x 2000" g$j 18515 \
		"ib_write_bw -d mroce0 -i 1 -x $(ipv4_gid mroce0 1 || echo 1) -s 65536 -n 2000 -F" \
		"ib_write_bw -d mroce0 -i 1 -x $(ipv4_gid mroce0 1 || echo 1) -s 65536 -n 2000 -F g$j"
	for p in $(seq 1 "$P"); do
		pair_run "rping (rdma_cm) g1 -> g$j over plane $p, 50 x 4 KiB verified" g$j 7174 \
			"rping -s -a 10.$((100 + p)).0.$j -C 50 -S 4096 -V" \
			"rping -c -a 10.$((100 + p)).0.$j -C 50 -S 4096 -V"
	done
done
check_no_output "the kernel log has no oops, WARN or BUG on g1" "$KERNEL_TROUBLE" dmesg
for j in $(seq 2 "$N"); do
	check_no_output "the kernel log has no oops, WARN or BUG on g$j" "$KERNEL_TROUBLE" remote g$j dmesg
done
suite_end
