#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Build the Debian trixie guest root file system (ext4, booted read-only through -snapshot).
#
#   qemu-ci/build-image.sh             prints the image path on stdout, logs on stderr
#
# The image is keyed by this script (package list and init included), so a warm run only checks
# the .done marker. It holds stock Debian userspace plus a fixed PID 1 that mounts the 9p share
# and hands over to guest-init.sh from the repository; the kernel, its modules and the metaroce
# payload all come through the share at run time, so they never force an image rebuild.
source "$(dirname "$0")/common.sh"
stdout_is_result

PKGS=(
	rdma-core ibverbs-utils ibverbs-providers libibverbs1 librdmacm1t64 rdmacm-utils perftest
	python3 python3-pyverbs qperf iperf3
	iproute2 kmod ethtool tcpdump iputils-ping procps util-linux strace linux-perf
	nvme-cli fio nfs-kernel-server
	openssh-server openssh-client openmpi-bin python3-mpi4py python3-numpy ucx-utils libfabric-bin
)
IMAGE_SIZE=2048M

key=$(input_hash "$(sha256sum <"$QEMU_CI_DIR/build-image.sh")" "$GUEST_SUITE" "${PKGS[*]}")
IMGDIR="$CACHE/image-$key"
if cache_ready "$IMGDIR"; then
	result "$IMGDIR/rootfs.ext4"
	exit 0
fi

# Parallel runs on a cold cache must not race on the same build.
exec 9>"$CACHE/image.lock"
flock 9
if cache_ready "$IMGDIR"; then
	result "$IMGDIR/rootfs.ext4"
	exit 0
fi

"$QEMU_CI_DIR/setup-host.sh" >&2
[ "$(id -u)" = 0 ] || die "debootstrap and mkfs.ext4 -d need root"

TMP="$IMGDIR.tmp"
# --one-file-system: an interrupted debootstrap may leave /proc or /sys mounted in there.
rm -rf --one-file-system "$TMP" "$IMGDIR"
mkdir -p "$TMP" "$CACHE/debootstrap-debs"
ROOT="$TMP/root"
log "debootstrap $GUEST_SUITE (minbase + ${#PKGS[@]} packages) into $ROOT"
# The .deb cache makes a rebuild after a script change cheap.
nice debootstrap --variant=minbase --components=main \
	--include="$(IFS=,; echo "${PKGS[*]}")" \
	--keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
	--cache-dir="$CACHE/debootstrap-debs" \
	"$GUEST_SUITE" "$ROOT" "$(host_mirror)" >&2

# The guest never runs apt; package lists and archives only cost space.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
echo metaroce-ci >"$ROOT/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tmetaroce-ci\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
	>"$ROOT/etc/hosts"
: >"$ROOT/etc/fstab"
mkdir -p "$ROOT/mnt/ci" "$ROOT/opt/metaroce" "$ROOT/lib/modules"

# Fixed on purpose: all boot logic that may change lives in guest-init.sh on the share.
cat >"$ROOT/sbin/metaroce-ci-init" <<'EOF'
#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# PID 1 of the metaroce CI guest: mount the basics and the 9p share, then run guest-init.sh
# from the share. On any failure power off, so the host never waits for its timeout.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
fail() {
	echo "metaroce-ci-init: $*; powering off" >&2
	echo o >/proc/sysrq-trigger
	sleep 30
	exit 1 # PID 1 exiting panics, and panic=-1 with -no-reboot ends QEMU as well
}
mount -t proc proc /proc || fail "cannot mount /proc"
mount -t sysfs sysfs /sys || fail "cannot mount /sys"
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev || fail "cannot mount /dev"
mount -t tmpfs -o mode=1777 tmpfs /tmp || fail "cannot mount /tmp"
mount -t tmpfs -o mode=0755 tmpfs /run || fail "cannot mount /run"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 ci /mnt/ci ||
	fail "cannot mount the 9p share 'ci' at /mnt/ci"
[ -f /mnt/ci/guest-init.sh ] || fail "/mnt/ci/guest-init.sh is missing"
exec /bin/bash /mnt/ci/guest-init.sh
fail "cannot run /mnt/ci/guest-init.sh"
EOF
chmod 0755 "$ROOT/sbin/metaroce-ci-init"

log "packing $(du -sh "$ROOT" | cut -f1) into a $IMAGE_SIZE ext4 image"
truncate -s "$IMAGE_SIZE" "$TMP/rootfs.ext4"
nice mkfs.ext4 -q -F -L metaroce-ci -d "$ROOT" "$TMP/rootfs.ext4" >&2
rm -rf --one-file-system "$ROOT"
touch "$TMP/.done"
mv "$TMP" "$IMGDIR"
log "image ready: $IMGDIR/rootfs.ext4"
result "$IMGDIR/rootfs.ext4"
