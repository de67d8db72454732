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
#   checkers       written back on a debug kernel (CHECKERS in env): the checkers' verdict
# and, for a guest of a cluster (run-cluster.sh), the share 'cluster' mounted at /mnt/cluster
# (CLUSTER_SHARE=1 in env) and its host name (GUEST_NAME).

# No set -e: whatever happens, PID 1 must get to the power-off.
set -uo pipefail
CI=/mnt/ci
P=$CI/payload
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb
export METAROCE_PAYLOAD=$P METAROCE_OUT=$CI/out METAROCE_SELFTESTS=/opt/metaroce/selftests
MODE=batch CHECKERS="" GUEST_NAME=metaroce-ci CLUSTER_SHARE=0
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
echo "$GUEST_NAME" >/proc/sys/kernel/hostname
ip link set lo up || setup_failed "cannot bring up lo"
mount9p ciout $CI/out || setup_failed "cannot mount the result share 'ciout' at $CI/out"
if [ "$CLUSTER_SHARE" = 1 ]; then
	mkdir -p /mnt/cluster
	mount9p cluster /mnt/cluster || setup_failed "cannot mount the cluster share at /mnt/cluster"
fi
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

# The debug kernel's checkers, CHECKERS from run-vm.sh (lockdep, kasan, kmemleak: what the
# kernel's .config built in). A KASAN report taints the kernel, and lockdep turns itself off
# at the first taint or report ("Disabling lock debugging due to kernel taint") for the rest
# of the boot: a clean result from such a boot means nothing. So before the command every
# checker must be on and the kernel untainted (else the boot is refused and the command does
# not run), and after it every checker must still be on and have nothing to report. The
# verdict goes to $CI/checkers, one line each: "ok: ...", "refused: ..." or "report: ..."
# (run-vm.sh prints it and fails the run on a refusal or a report).
CHECKERS_OUT=$CI/checkers
KMEMLEAK=/sys/kernel/debug/kmemleak
TAINT_LETTERS=PFSRMBUDAWCIOELKXTNJ # kernel/panic.c's taint_flags, bit 0 first
# An out-of-tree (O, bit 12) or unsigned (E, bit 13) module is no report: metaroce.ko is one.
TAINT_MODULE=$(((1 << 12) | (1 << 13)))
has_checker() { [[ " $CHECKERS " == *" $1 "* ]]; }
verdict() { echo "$*" >>$CHECKERS_OUT; say "checkers: $*"; }
taint_letters() {
	local t=$1 i s=""
	for ((i = 0; i < ${#TAINT_LETTERS}; i++)); do
		if (((t >> i) & 1)); then s+=${TAINT_LETTERS:i:1}; fi
	done
	echo "$s"
}
# lockdep_off: prints why lockdep is not on, if it is not.
lockdep_off() {
	local v
	v=$(awk '$1 == "debug_locks:" { print $2 }' /proc/lockdep_stats 2>/dev/null)
	[ "$v" = 1 ] && return 0
	echo "lockdep is off (debug_locks ${v:-unreadable} in /proc/lockdep_stats):" \
		"$(dmesg | grep -m1 -E 'Disabling lock debugging|turning off the locking correctness validator' || echo 'no reason in the log')"
}
# kmemleak_scan: two scans 6 s apart (an object is reported once older than 5 s and unreferenced
# in kmemleak.min_unref_scans=2 consecutive scans, run-vm.sh), the first after a pause so that
# what was just allocated is old enough; fails if kmemleak is off (the write returns EPERM).
kmemleak_scan() {
	sleep 6
	echo scan >$KMEMLEAK 2>/dev/null || return 1
	sleep 6
	echo scan >$KMEMLEAK 2>/dev/null
}
if [ -n "$CHECKERS" ]; then
	rm -f $CHECKERS_OUT
	off=()
	if has_checker lockdep; then
		why=$(lockdep_off)
		[ -z "$why" ] || off+=("$why")
	fi
	if has_checker kasan && ! dmesg | grep -q 'KernelAddressSanitizer initialized'; then
		off+=("KASAN did not initialize (no 'KernelAddressSanitizer initialized' in the log)")
	fi
	if has_checker kmemleak; then
		if [ ! -e $KMEMLEAK ]; then
			off+=("kmemleak: no $KMEMLEAK")
		elif ! kmemleak_scan; then
			off+=("kmemleak is off (its scan is refused): $(dmesg | grep -m1 'kmemleak: ' || echo 'no reason in the log')")
		fi
	fi
	taint=$(cat /proc/sys/kernel/tainted)
	if [ "$taint" != 0 ]; then
		off+=("the kernel is tainted before the command ($taint: $(taint_letters "$taint")): $(dmesg | grep -m1 -E 'BUG:|WARNING:|Oops|taint' || echo 'no reason in the log')")
	fi
	if [ ${#off[@]} -gt 0 ]; then
		for why in "${off[@]}"; do verdict "refused: $why"; done
		say "the debug kernel's checkers are not all on: boot refused, the command does not run"
		power_off
	fi
	if has_checker kmemleak; then
		# What the boot left unreferenced is not ours: found by the scans above and painted
		# grey, so that only what is left from here on is reported.
		booted=$(grep -c '^unreferenced object' $KMEMLEAK)
		echo clear >$KMEMLEAK
		verdict "ok: kmemleak on; $booted objects left unreferenced by the boot cleared"
	fi
	verdict "ok: checkers on before the command:$CHECKERS; kernel not tainted"
fi

cd $CI/out || setup_failed "cannot cd to $CI/out"
# The command may ask which checkers run (a KASAN kernel's quarantine keeps freed memory a while,
# so free-memory counts do not come back at once).
export METAROCE_KERNEL_CHECKERS="$CHECKERS"
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
if [ -n "$CHECKERS" ]; then
	if has_checker kmemleak; then
		if ! kmemleak_scan; then
			verdict "report: kmemleak turned itself off during the command: $(dmesg | grep -m1 'kmemleak: ' || echo 'no reason in the log')"
		elif grep -q '^unreferenced object' $KMEMLEAK; then
			cp $KMEMLEAK $CI/kmemleak
			verdict "report: kmemleak: $(grep -c '^unreferenced object' $KMEMLEAK) objects left unreferenced (the list follows)"
			sed 's/^/metaroce-ci: kmemleak: /' $KMEMLEAK | head -n 400
		else
			verdict "ok: kmemleak: no object left unreferenced"
		fi
	fi
	if has_checker lockdep; then
		why=$(lockdep_off)
		if [ -n "$why" ]; then
			verdict "report: $why"
		else
			verdict "ok: lockdep still on ($(awk '$1 == "direct" && $2 == "dependencies:" { print $3 }' /proc/lockdep_stats) lock dependencies seen)"
		fi
	fi
	taint=$(cat /proc/sys/kernel/tainted)
	if [ $((taint & ~TAINT_MODULE)) != 0 ]; then
		verdict "report: the kernel is tainted ($taint: $(taint_letters "$taint"))"
	else
		verdict "ok: no taint but a module's (tainted: $taint $(taint_letters "$taint"))"
	fi
fi
echo "$rc" >$CI/exit-status
power_off
