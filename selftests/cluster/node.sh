#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# A guest of a cluster (qemu-ci/run-cluster.sh): joins the fabric, then runs the cluster's
# command or serves until it is done.
#
# What the command finds, on every guest gI (I = 1..N):
#   NICs      ctl 10.99.0.I/24 (control: ssh, launchers) and p1..pP, plane p 10.(100+p).0.I/24,
#             each plane one Ethernet segment shared by all guests
#   names     /etc/hosts: gJ (control address) and gJ-pP (plane addresses) of every guest
#   ssh       sshd on every guest, root logs in to any guest with the run's key (no prompts)
#   RDMA      mroce0: a metaroce device with one port per plane (port p on pp)
#   /mnt/cluster/cluster.env  CLUSTER_GUESTS, CLUSTER_PLANES, CLUSTER_ALL (and CLUSTER_INDEX
#             in the environment); /mnt/cluster is shared by all guests
# The command runs from /mnt/ci/out (gI's results directory on the host) on g1, or on every
# guest with --all; the others wait until it is done (every guest's, with --all). A guest that
# failed leaves /mnt/cluster/abort and the others stop waiting; poweroff_guest (cluster/lib.sh)
# powers a guest off mid-job.
set -uo pipefail
# shellcheck source=../lib.sh
. /opt/metaroce/selftests/lib.sh
SHARED=/mnt/cluster
# shellcheck disable=SC1091
. $SHARED/cluster.env
I=$CLUSTER_INDEX N=$CLUSTER_GUESTS P=$CLUSTER_PLANES
say() { echo "cluster g$I: $*"; }
fail() {
	say "setup failed: $*"
	touch $SHARED/abort
	exit 1
}
# wait_files SECONDS FILE...: until every FILE exists; fails at once on an abort.
wait_files() {
	local deadline=$((SECONDS + $1)) f
	shift
	for f in "$@"; do
		until [ -e "$f" ]; do
			[ ! -e $SHARED/abort ] || return 2
			[ "$SECONDS" -lt "$deadline" ] || return 1
			sleep 0.5
		done
	done
}

# NICs by MAC (run-cluster.sh: 52:54:00:4d:NN:II, NN 0 control, p plane p).
for dev in /sys/class/net/*; do
	mac=$(cat "$dev/address")
	[[ "$mac" == 52:54:00:4d:* ]] || continue
	n=$((16#$(cut -d: -f5 <<<"$mac")))
	name=ctl
	[ "$n" = 0 ] || name=p$n
	$IP link set dev "${dev##*/}" name $name || fail "cannot rename ${dev##*/} to $name"
done
$IP addr add 10.99.0.$I/24 dev ctl && $IP link set ctl up || fail "no control network"
for p in $(seq 1 "$P"); do
	$IP addr add 10.$((100 + p)).0.$I/24 dev p$p && $IP link set p$p up || fail "no plane $p"
done
{
	echo "127.0.0.1 localhost"
	for j in $(seq 1 "$N"); do
		echo "10.99.0.$j g$j"
		for p in $(seq 1 "$P"); do echo "10.$((100 + p)).0.$j g$j-p$p"; done
	done
} >/etc/hosts

# ssh with a key made for this run by g1 (the image has no keys of its own).
mkdir -p /root/.ssh /run/sshd && chmod 700 /root/.ssh
if [ "$I" = 1 ]; then
	mkdir -p $SHARED/ssh
	ssh-keygen -q -t ed25519 -N "" -C "cluster" -f $SHARED/ssh/tmp-key &&
		mv $SHARED/ssh/tmp-key.pub $SHARED/ssh/id_ed25519.pub &&
		mv $SHARED/ssh/tmp-key $SHARED/ssh/id_ed25519 || fail "ssh-keygen"
fi
wait_files 120 $SHARED/ssh/id_ed25519.pub || fail "no ssh key from g1"
install -m 600 $SHARED/ssh/id_ed25519 /root/.ssh/id_ed25519 || fail "no ssh key"
cp $SHARED/ssh/id_ed25519.pub /root/.ssh/authorized_keys
cat >/root/.ssh/config <<EOF
Host *
	StrictHostKeyChecking no
	UserKnownHostsFile /dev/null
	LogLevel ERROR
EOF
ssh-keygen -A >/dev/null || fail "no host keys"
/usr/sbin/sshd -o PermitRootLogin=prohibit-password -o UseDNS=no -o ListenAddress=10.99.0.$I ||
	fail "sshd did not start"

# Under TCG patching static keys while another CPU runs the code can oops: pin them first.
pin_static_keys
modprobe metaroce || fail "modprobe metaroce"
$RDMA link add mroce0 type metaroce netdev p1 || fail "rdma link add mroce0"
for p in $(seq 2 "$P"); do
	echo "+p$p" >/sys/class/infiniband/mroce0/planes || fail "plane p$p"
done
wait_for 20 sh -c "[ \$($RDMA link show | grep -c '^link mroce0/.* state ACTIVE') = $P ]" ||
	fail "mroce0 has not $P ACTIVE ports: $($RDMA link show)"

touch $SHARED/ready.g$I
ready=()
for j in $(seq 1 "$N"); do ready+=($SHARED/ready.g$j); done
wait_files 300 "${ready[@]}" || fail "not every guest got ready"
say "fabric up: $N guests, $P planes; mroce0 ports $(ls /sys/class/infiniband/mroce0/ports | tr '\n' ' ')"

rc=0
if [ "$CLUSTER_ALL" = 1 ] || [ "$I" = 1 ]; then
	cd /mnt/ci/out || fail "no results directory"
	bash $SHARED/cmd.sh </dev/null
	rc=$?
	say "command exited with status $rc"
	echo "$rc" >$SHARED/done.g$I
fi
# Serve (or, with --all, stay up for the others) until every command is done, or until a
# test asks this guest to go: /mnt/cluster/poweroff.gI (a machine lost mid-job: the power goes
# at once, its processes and QPs with it, and its run counts as a success).
done_files=($SHARED/done.g1)
if [ "$CLUSTER_ALL" = 1 ]; then
	done_files=()
	for j in $(seq 1 "$N"); do done_files+=($SHARED/done.g$j); done
fi
while ! wait_files 1 "${done_files[@]}"; do
	if [ -e $SHARED/abort ]; then
		say "a guest failed; stopping"
		break
	fi
	if [ -e $SHARED/poweroff.g$I ]; then
		say "powering off on request"
		break
	fi
done
exit "$rc"
