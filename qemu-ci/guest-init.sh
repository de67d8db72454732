#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# PID 1 of the CI guest, exec'd by /sbin/metaroce-ci-init from the image, read from the 9p share
# so that boot logic changes need no image rebuild. Installs the test kernel's modules and the
# metaroce payload, runs /mnt/ci/cmd.sh (or a shell with --interactive), records its exit
# status in /mnt/ci/exit-status and powers off.
#
# Share layout (written by run-vm.sh):
#   env            MODE=batch|interactive; HOST_TERM, ROWS, COLS for the interactive shell
#   cmd.sh         the command, run with bash from /mnt/ci/out (optional in interactive mode)
#   modules/       <kernel version>/... as made by `make modules_install`
#   payload/       metaroce.ko, selftests/, rootfs/ and rootfs.symlinks (the provider is in
#                  rootfs/); also understood: a plugin file libmetaroce-rdmav34.so and
#                  metaroce.driver at the top
#   out/           mount point of the second share 'ciout', the caller's result directory

# No set -e: whatever happens, PID 1 must get to the power-off.
set -uo pipefail
CI=/mnt/ci
P=$CI/payload
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb
export METAROCE_PAYLOAD=$P METAROCE_OUT=$CI/out METAROCE_SELFTESTS=/opt/metaroce/selftests
MODE=batch
# shellcheck disable=SC1091
[ -f $CI/env ] && . $CI/env

say() { echo "metaroce-ci: $*"; }
HALT_FIFO=/run/metaroce-ci-halt
mkfifo $HALT_FIFO
power_off() {
	sync
	echo o >/proc/sysrq-trigger
	# The power-off is asynchronous and soon takes the disk away, so wait with builtins only:
	# no data ever comes through the FIFO. Should it not happen, exiting PID 1 panics, which
	# ends QEMU too (panic=-1, -no-reboot).
	read -rt 60 <>$HALT_FIFO
	exit 1
}
# A setup failure must not look like a test result: no exit-status, the runner reports it.
setup_failed() {
	say "setup failed: $*"
	power_off
}
mount9p() { mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 "$@"; }

read -r up _ </proc/uptime
say "setting up the guest (uptime ${up}s)"
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
[ -d /sys/kernel/debug ] && mount -t debugfs debugfs /sys/kernel/debug
[ -d /sys/kernel/config ] && mount -t configfs configfs /sys/kernel/config
echo metaroce-ci >/proc/sys/kernel/hostname
ip link set lo up || setup_failed "cannot bring up lo"
mount9p ciout $CI/out || setup_failed "cannot mount the result share 'ciout' at $CI/out"
ulimit -l unlimited

kver=$(uname -r)
if [ -d "$CI/modules/$kver" ]; then
	mkdir -p /lib/modules
	cp -a "$CI/modules/$kver" /lib/modules/ || setup_failed "cannot copy the modules of $kver"
else
	say "warning: no modules for $kver on the share; modprobe will not work"
fi
if [ -f $P/metaroce.ko ]; then
	mkdir -p "/lib/modules/$kver/updates"
	cp $P/metaroce.ko "/lib/modules/$kver/updates/" || setup_failed "cannot install metaroce.ko"
fi
if [ -f $P/metaroce.ko ] || [ ! -f "/lib/modules/$kver/modules.dep" ]; then
	depmod -a || setup_failed "depmod failed"
fi
if [ -f $P/libmetaroce-rdmav34.so ]; then
	cp $P/libmetaroce-rdmav34.so /usr/lib/x86_64-linux-gnu/libibverbs/ ||
		setup_failed "cannot install the provider"
fi
if [ -f $P/metaroce.driver ]; then
	cp $P/metaroce.driver /etc/libibverbs.d/ || setup_failed "cannot install metaroce.driver"
fi
if [ -d $P/selftests ]; then
	mkdir -p /opt/metaroce
	cp -a $P/selftests /opt/metaroce/ || setup_failed "cannot install the selftests"
fi
# Anything else the build wants in the guest (the provider, tools) goes under payload/rootfs/.
if [ -d $P/rootfs ]; then
	# tar, not cp: /lib, /bin, /sbin are symlinks into /usr and must stay so.
	tar -C $P/rootfs -c . | tar -C / -x --keep-directory-symlink --no-same-owner ||
		setup_failed "cannot copy payload/rootfs"
	# run-vm.sh copies the payload with symlinks dereferenced: make those rootfs.symlinks
	# lists ("LINK TARGET", LINK relative to /) links again. The provider's plugin name
	# libibverbs/libmetaroce-rdmav34.so must be a link to libmetaroce.so.1, not a copy
	# (a second file: a program linking -lmetaroce would load the provider twice).
	if [ -f $P/rootfs.symlinks ]; then
		while read -r link target; do
			ln -sfn "$target" "/$link" || setup_failed "cannot make the symlink /$link"
		done <$P/rootfs.symlinks
	fi
	ldconfig
fi

cd $CI/out || setup_failed "cannot cd to $CI/out"
rc=0
if [ -f $CI/cmd.sh ]; then
	read -r up _ </proc/uptime
	say "running the command (guest uptime ${up}s)"
	if [ "$MODE" = interactive ]; then
		bash $CI/cmd.sh </dev/console
	else
		bash $CI/cmd.sh </dev/null
	fi
	rc=$?
	say "command exited with status $rc"
fi
if [ "$MODE" = interactive ]; then
	say "root shell; exit it (or Ctrl-A X) to power off"
	stty -F /dev/ttyS0 sane rows "${ROWS:-24}" cols "${COLS:-80}" 2>/dev/null
	TERM=${HOST_TERM:-vt100} setsid -w -c bash -l <>/dev/ttyS0 >&0 2>&0
	rc=$?
fi
echo "$rc" >$CI/exit-status
power_off
