#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The kernel's own RDMA consumers over metaroce, and over rxe in the same boot: NVMe over
# Fabrics (the nvmet-rdma target and the nvme-rdma host) and NFSv4 over RDMA (nfsd's svcrdma
# and the client's xprtrdma) moving verified data. They need kernel RC QPs, fast registration
# (IB_WR_REG_MR, local and remote invalidate) and the rdma_rw API. Both ends run in the initial network namespace (the kernel's rdma_cm users
# bind there), on one device over a dummy netdev, as blktests runs its NVMe tests over rxe:
# the host's and the target's QPs are two QPs of that device, their traffic UDP to its own
# address.
source "$(dirname "$0")/../lib.sh"
dmesg_mark

ADDR=10.78.0.1
NQN=nqn.2026-12.org.metaroce:ulp
CFG=/sys/kernel/config/nvmet
BACKING=/tmp/ulp-backing.img
SIZE_MB=64

modprobe metaroce
modprobe rdma_rxe
check "modprobe nvmet-rdma and nvme-rdma" sh -c "modprobe nvmet-rdma && modprobe nvme-rdma"
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config

$IP link add ulp0 type dummy
$IP addr add $ADDR/24 dev ulp0
$IP link set ulp0 up

# The target: one subsystem, one namespace on a loop device over a file in tmpfs, one RDMA
# port on $ADDR.
truncate -s ${SIZE_MB}M $BACKING
LOOP=$(losetup -f --show $BACKING)
mkdir $CFG/subsystems/$NQN
echo 1 >$CFG/subsystems/$NQN/attr_allow_any_host
mkdir $CFG/subsystems/$NQN/namespaces/1
echo "$LOOP" >$CFG/subsystems/$NQN/namespaces/1/device_path
echo 1 >$CFG/subsystems/$NQN/namespaces/1/enable
mkdir $CFG/ports/1
echo rdma >$CFG/ports/1/addr_trtype
echo ipv4 >$CFG/ports/1/addr_adrfam
echo $ADDR >$CFG/ports/1/addr_traddr
echo 4420 >$CFG/ports/1/addr_trsvcid

# nvme_device: the block device of our subsystem's namespace, once the host has it.
nvme_device() {
	local c
	for c in /sys/class/nvme/nvme*; do
		[ -e "$c/subsysnqn" ] && [ "$(cat "$c/subsysnqn")" = "$NQN" ] || continue
		ls "$c" | grep -m1 -E '^nvme[0-9]+c?[0-9]*n1$' | sed -E 's/c[0-9]+n/n/'
		return 0
	done
	return 1
}

# run_over TYPE DEV [LABEL]: the host connects over device DEV (of link type TYPE) and moves
# data; checks are named LABEL (TYPE by default).
run_over() {
	local dev=$2 name blk fio_out
	name=${3:-$1}
	$RDMA link add "$dev" type "$1" netdev ulp0
	wait_for 5 sh -c "ibv_devinfo -d $dev | grep -q PORT_ACTIVE"
	ln -s $CFG/subsystems/$NQN $CFG/ports/1/subsystems/$NQN
	check "$name: nvme connect -t rdma to the target on $dev" \
		nvme connect -t rdma -a $ADDR -s 4420 -n $NQN
	if wait_for 20 nvme_device; then
		blk=/dev/$(nvme_device)
		wait_for 10 test -b "$blk"
		check_output "$name: the namespace appears as $blk, ${SIZE_MB} MiB" "^$((SIZE_MB * 1024 * 1024))\$" \
			blockdev --getsize64 "$blk"
		# Writes, then reads back and checks every block (crc32c), queue depth 16, 4 KiB to
		# 128 KiB blocks: many REG_MRs and invalidations in flight at once.
		fio_out="$TAP_DIR/fio-${name//[^a-z0-9]/_}.log"
		check "$name: fio writes ${SIZE_MB} MiB and verifies them (crc32c)" \
			fio --name=ulp --filename="$blk" --direct=1 --ioengine=libaio --iodepth=16 \
			--rw=randwrite --bsrange=4k-128k --size=${SIZE_MB}M --verify=crc32c \
			--do_verify=1 --verify_fatal=1 --output="$fio_out"
		sed -n 's/^ *\(WRITE\|READ\): bw=\([^ ]*\).*/# '"$name"': \1 \2/p' "$fio_out"
		# Data written through the block device is the target's file's.
		check "$name: dd pattern through nvme reads back from the target's file" bash -c "
			head -c 1048576 /dev/urandom >/tmp/ulp-pattern &&
			dd if=/tmp/ulp-pattern of=$blk bs=1M count=1 seek=3 oflag=direct status=none &&
			dd if=$blk of=/tmp/ulp-nvme bs=1M count=1 skip=3 iflag=direct status=none &&
			dd if=$LOOP of=/tmp/ulp-file bs=1M count=1 skip=3 iflag=direct status=none &&
			cmp /tmp/ulp-pattern /tmp/ulp-nvme && cmp /tmp/ulp-pattern /tmp/ulp-file"
		# rdma_cm made them for the kernel (comm [rdma_cm]): the host's and the target's of the
		# admin queue and each I/O queue, connected to each other.
		check "$name: rdma resource shows the kernel's RC QPs on $dev, in RTS, in pairs" bash -c "
			n=\$($RDMA resource show qp link $dev/1 | grep -c 'type RC state RTS .*comm \[rdma_cm\]')
			echo \"\$n RC QPs\"; [ \$n -ge 4 ] && [ \$((n % 2)) = 0 ]"
	else
		_tap 1 "$name: the namespace appears as a block device"
	fi
	check "$name: nvme disconnect" nvme disconnect -n $NQN
	rm $CFG/ports/1/subsystems/$NQN
	check "$name: rdma link delete $dev" $RDMA link delete "$dev"
}

run_over metaroce mrk0
run_over rxe rxek0

# The same through loss and reordering: the device's traffic to its own address goes through
# lo, where a netem for MetaRoCE's port (4793) drops 1% and reorders, both directions.
tc qdisc add dev lo root handle 1: prio
tc qdisc add dev lo parent 1:3 handle 30: netem loss 1% delay 1ms reorder 75% 50%
tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip protocol 17 0xff \
	match ip dport 4793 0xffff flowid 1:3
run_over metaroce mrk0 "metaroce at 1% loss with reordering"
check_output "the netem on lo dropped MetaRoCE packets meanwhile" 'dropped [1-9]' \
	sh -c "tc -s qdisc show dev lo | grep -A1 'netem 30:'"
tc qdisc del dev lo root

# NFSv4 over RDMA: nfsd exports a tmpfs (NFSv4 only: no rpcbind, mountd for the export cache)
# and listens for RDMA on port 20049; the client mounts it over the device, writes a file, and
# reads it back through a fresh mount (nothing cached); the server's copy is compared too.
modprobe nfsd
modprobe rpcrdma
mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd
mkdir -p /srv/ulp /mnt/ulp
mount -t tmpfs tmpfs /srv/ulp
# The image is read-only: nfs-utils' state in a tmpfs.
mount -t tmpfs tmpfs /var/lib/nfs
mkdir -p /var/lib/nfs/v4recovery /var/lib/nfs/rpc_pipefs
touch /var/lib/nfs/etab /var/lib/nfs/rmtab
check "nfsd: export a tmpfs" exportfs -o rw,sync,no_root_squash,insecure,no_subtree_check,fsid=0 '*:/srv/ulp'
rpc.mountd -N 2 -N 3 --no-udp
# A short grace period: the mounts below come at once.
echo 10 >/proc/fs/nfsd/nfsv4gracetime
echo 10 >/proc/fs/nfsd/nfsv4leasetime
check "nfsd: start (NFSv4 only)" rpc.nfsd -N 3 -U 4
check "nfsd: listen for RDMA on port 20049" sh -c "echo 'rdma 20049' >/proc/fs/nfsd/portlist"
head -c 8388608 /dev/urandom >/tmp/ulp-nfs-pattern
nfs_over() { # TYPE DEV
	local type=$1 dev=$2 mnt="mount -t nfs4 -o proto=rdma,port=20049 $ADDR:/ /mnt/ulp"
	$RDMA link add "$dev" type "$type" netdev ulp0
	wait_for 5 sh -c "ibv_devinfo -d $dev | grep -q PORT_ACTIVE"
	check "$type: mount -t nfs4 -o proto=rdma over $dev" timeout 60 $mnt
	check_output "$type: the mount is over RDMA" 'xprt:[[:space:]]+rdma' cat /proc/self/mountstats
	check "$type: 8 MiB written through NFS/RDMA are the server's file" bash -c "
		cp /tmp/ulp-nfs-pattern /mnt/ulp/f-$type && sync && cmp /tmp/ulp-nfs-pattern /srv/ulp/f-$type"
	check "$type: and read back through a fresh mount" bash -c "
		umount /mnt/ulp && timeout 60 $mnt && cmp /tmp/ulp-nfs-pattern /mnt/ulp/f-$type"
	umount /mnt/ulp 2>/dev/null
	check "$type: rdma link delete $dev" $RDMA link delete "$dev"
}
nfs_over metaroce mrk0
nfs_over rxe rxek0
rpc.nfsd 0
pkill rpc.mountd
exportfs -ua
umount /var/lib/nfs /srv/ulp
rm -f /tmp/ulp-nfs-pattern

# Nothing left: the target's objects go, the module's QPs and MRs with them.
rmdir $CFG/ports/1
echo 0 >$CFG/subsystems/$NQN/namespaces/1/enable
rmdir $CFG/subsystems/$NQN/namespaces/1
rmdir $CFG/subsystems/$NQN
losetup -d "$LOOP"
rm -f $BACKING /tmp/ulp-pattern /tmp/ulp-nvme /tmp/ulp-file
$IP link del ulp0
check_no_output "no kernel warning, oops or metaroce error" \
	'WARNING:|BUG:|Oops|metaroce.*(error|fail)' dmesg_since_mark
suite_end
