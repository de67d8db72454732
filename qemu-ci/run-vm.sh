#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Boot the test kernel and the guest image under QEMU (TCG), run a command in it, exit with its
# status.
#
#   qemu-ci/run-vm.sh [options] [--] COMMAND...
#   qemu-ci/run-vm.sh [options] --cmd-file FILE
#   qemu-ci/run-vm.sh [options] --interactive [[--] COMMAND...]
#
#   --timeout S      kill the guest after S seconds, exit 124 (default 1800, none if interactive)
#   --memory MB      guest memory (default 2048)          --cpus N   guest CPUs (default 2)
#   --payload DIR    copied to /mnt/ci/payload (default: $REPO/build/guest if it exists)
#   --out DIR        result directory, the command's cwd (/mnt/ci/out) in the guest; also taken
#                    from $METAROCE_VM_OUT; default a temporary directory that is removed
#   --append ARGS    extra kernel command line arguments (e.g. loglevel=8)
#   --keep           keep the temporary share directory and print its path
#   --name NAME      the guest's host name (default metaroce-ci)
#   --nic GROUP:PORT,MAC   a virtio-net NIC on the UDP multicast "switch" GROUP:PORT of the
#                    host's loopback (QEMU's socket netdev): every guest given the same one
#                    shares an Ethernet segment with it, and nothing else (repeatable)
#   --cluster-dir D  a directory shared by several guests, mounted at /mnt/cluster
#   --env NAME=VALUE exported to the command (repeatable)
#   --interactive    a root shell on the console (after COMMAND, if given); Ctrl-A X quits QEMU
#
# One COMMAND argument is a bash script ('modprobe x && ibv_devices; exit 3'); several are run
# as a command with exactly those arguments. The kernel is $KDIR or build-kernel.sh's output.
# Exit status: the command's, 124 on timeout, 125 if the guest reported none (panic, oops,
# setup failure), 130 on Ctrl-C. On a debug kernel (lockdep, KASAN, kmemleak in its .config)
# also 126: a checker was off before the command (the boot is refused, the command did not
# run), and 123: the command succeeded but a checker reported something (kmemleak's list,
# lockdep turned off, a taint, a kernel report on the console at any time of the boot).
source "$(dirname "$0")/common.sh"

usage() { sed -n '3,/^source/{/^source/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }

TIMEOUT="" MEMORY=2048 CPUS=2 PAYLOAD="" OUT="${METAROCE_VM_OUT:-}" APPEND="" KEEP=0 MODE=batch
CMD_FILE="" NAME="" NICS=() CLUSTER_DIR="" ENVS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--timeout) TIMEOUT="$2"; shift 2 ;;
	--memory) MEMORY="$2"; shift 2 ;;
	--cpus) CPUS="$2"; shift 2 ;;
	--payload) PAYLOAD="$2"; shift 2 ;;
	--out) OUT="$2"; shift 2 ;;
	--append) APPEND="$2"; shift 2 ;;
	--cmd-file) CMD_FILE="$2"; shift 2 ;;
	--keep) KEEP=1; shift ;;
	--name) NAME="$2"; shift 2 ;;
	--nic) NICS+=("$2"); shift 2 ;;
	--cluster-dir) CLUSTER_DIR="$2"; shift 2 ;;
	--env) ENVS+=("$2"); shift 2 ;;
	--interactive) MODE=interactive; shift ;;
	-h | --help) usage ;;
	--) shift; break ;;
	-*) log "unknown option $1"; usage ;;
	*) break ;;
	esac
done
[ $# -gt 0 ] || [ -n "$CMD_FILE" ] || [ "$MODE" = interactive ] || usage
[ $# -eq 0 ] || [ -z "$CMD_FILE" ] || die "give either --cmd-file or a command, not both"
[ "$MODE" = batch ] && TIMEOUT="${TIMEOUT:-1800}"
[ -z "$TIMEOUT" ] || [[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout wants whole seconds"
[ "$MODE" = batch ] || [ -t 0 ] || die "--interactive needs a terminal on stdin"
if [ -z "$PAYLOAD" ] && [ -d "$REPO_DIR/build/guest" ]; then PAYLOAD="$REPO_DIR/build/guest"; fi
[ -z "$PAYLOAD" ] || [ -d "$PAYLOAD" ] || die "payload directory $PAYLOAD does not exist"
[ -z "$CLUSTER_DIR" ] || [ -d "$CLUSTER_DIR" ] || die "cluster directory $CLUSTER_DIR does not exist"
[ -z "$NAME" ] || [[ "$NAME" =~ ^[a-z][a-z0-9-]*$ ]] || die "--name wants a host name"
for nic in "${NICS[@]}"; do
	[[ "$nic" =~ ^239\.[0-9]+\.[0-9]+\.[0-9]+:[0-9]+,([0-9a-f]{2}:){5}[0-9a-f]{2}$ ]] ||
		die "--nic wants 239.X.Y.Z:PORT,MAC (an administratively scoped group), not $nic"
done
for e in "${ENVS[@]}"; do
	[[ "$e" =~ ^[A-Z_][A-Z0-9_]*= ]] || die "--env wants NAME=VALUE, not $e"
done

KDIR="${KDIR:-$("$QEMU_CI_DIR/build-kernel.sh")}"
[ -f "$KDIR/arch/x86/boot/bzImage" ] || die "no bzImage in $KDIR"
[ -d "$KDIR/modules-install/lib/modules" ] || die "no modules-install/lib/modules in $KDIR"
IMAGE="$("$QEMU_CI_DIR/build-image.sh")"

# The checkers the kernel has built in; guest-init.sh checks that each is on before the command
# and still on, with nothing to report, after it.
kconfig_y() { grep -q "^CONFIG_$1=y\$" "$KDIR/.config" 2>/dev/null; }
CHECKERS=""
if kconfig_y PROVE_LOCKING; then CHECKERS+=" lockdep"; fi
if kconfig_y KASAN; then CHECKERS+=" kasan"; fi
if kconfig_y DEBUG_KMEMLEAK; then CHECKERS+=" kmemleak"; fi
# What the console must never show, on a debug kernel, at any time of the boot: selftests/lib.sh's
# KERNEL_TROUBLE (the reports each suite looks for in its part of the log) and lockdep turning
# itself off. Kernel lines only: they start with the printk time.
KERNEL_REPORT="$(sed -n "s/^KERNEL_TROUBLE='\(.*\)'\$/\1/p" "$REPO_DIR/selftests/lib.sh")"
[ -n "$KERNEL_REPORT" ] || die "no KERNEL_TROUBLE in selftests/lib.sh"
KERNEL_REPORT="^\[ *[0-9]+\.[0-9]+\] .*($KERNEL_REPORT|Disabling lock debugging|turning off the locking correctness validator)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/metaroce-vm.XXXXXX")
SHARE="$TMP/share"
QEMU_PID=""
cleanup() {
	if [ -n "$QEMU_PID" ]; then
		kill "$QEMU_PID" 2>/dev/null || true
		wait "$QEMU_PID" 2>/dev/null || true
	fi
	if [ "$KEEP" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

mkdir -p "$SHARE/out"
if [ -n "$OUT" ]; then mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); else OUT="$TMP/out"; mkdir "$OUT"; fi
cp "$QEMU_CI_DIR/guest-init.sh" "$SHARE/"
if [ -n "$CMD_FILE" ]; then
	cp "$CMD_FILE" "$SHARE/cmd.sh"
elif [ $# -eq 1 ]; then
	printf '%s\n' "$1" >"$SHARE/cmd.sh"
elif [ $# -gt 1 ]; then
	printf '%q ' "$@" >"$SHARE/cmd.sh"
	echo >>"$SHARE/cmd.sh"
fi
{
	echo "MODE=$MODE"
	printf 'CHECKERS=%q\n' "$CHECKERS"
	[ -z "$NAME" ] || echo "GUEST_NAME=$NAME"
	[ -z "$CLUSTER_DIR" ] || echo "CLUSTER_SHARE=1"
	for e in "${ENVS[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done
	if [ "$MODE" = interactive ]; then
		printf 'HOST_TERM=%q\n' "${TERM:-vt100}"
		read -r rows cols < <(stty size 2>/dev/null || true)
		echo "ROWS=${rows:-24} COLS=${cols:-80}"
	fi
} >"$SHARE/env"
# Hard links: the modules are read-only for the guest's purposes and can be large.
cp -al "$KDIR/modules-install/lib/modules" "$SHARE/modules" 2>/dev/null ||
	cp -a "$KDIR/modules-install/lib/modules" "$SHARE/modules"
mkdir -p "$SHARE/payload"
[ -z "$PAYLOAD" ] || cp -rL "$PAYLOAD/." "$SHARE/payload/"

# An oops must fail the run clearly: oops=panic, and panic=-1 with -no-reboot ends QEMU.
cmdline="console=ttyS0 root=/dev/vda rw init=/sbin/metaroce-ci-init panic=-1 oops=panic"
# tsc=reliable: under TCG the clocksource watchdog sees the TSC skew whenever the host is busy and
# marks it unstable mid-run; that flips the sched_clock static key, and patching kernel text while
# another vCPU runs it sometimes dies in an oops under TCG (seen in CI at 19 s into a bench run).
# TCG's TSC comes from the host clock and is monotonic and the same on every vCPU.
cmdline+=" panic_on_warn=0 loglevel=5 mitigations=off tsc=reliable"
# KASAN: every report, not only the first. no5lvl: 4-level paging, as without KASAN it makes no
# difference to us. With 5-level paging (QEMU's -cpu max has LA57) KASAN takes an address in the
# direct map (0xff11...) for one without shadow whenever pgtable_l5_enabled() reads false, and it
# does for a moment in every boot: identify_boot_cpu() clears boot_cpu_data's capabilities
# (memset) before it reads CPUID again, with interrupts on, and before the alternatives are
# patched cpu_feature_enabled(X86_FEATURE_LA57) reads them. A timer interrupt in that window
# (handle_edge_irq taking its irq_desc's lock) is reported "BUG: KASAN: wild-memory-access in
# do_raw_spin_lock" at 0.004 s, taints the kernel and turns lockdep off for the whole boot.
if [[ "$CHECKERS" == *kasan* ]]; then cmdline+=" no5lvl kasan_multi_shot"; fi
# acpi=noirq on a debug kernel: its ACPI interpreter is so slow under TCG that the i440FX
# DSDT's _PRT (PCI interrupt routing, a loop) hits ACPICA's 30 s loop timeout, once per virtio
# device ("ACPI Error: ... AE_AML_LOOP_TIMEOUT", "PCI INT A: no GSI"): 90 s of every boot. The
# virtio devices use MSI-X, so the legacy routing is not needed; the rest of ACPI stays.
if [ -n "$CHECKERS" ]; then cmdline+=" acpi=noirq"; fi
# kmemleak: an object is a leak once unreferenced in two scans in a row, not one (guest-init.sh).
if [[ "$CHECKERS" == *kmemleak* ]]; then cmdline+=" kmemleak.min_unref_scans=2"; fi
cmdline+=" $APPEND"
qemu=(
	qemu-system-x86_64 -accel tcg -cpu max -smp "$CPUS" -m "$MEMORY"
	-nodefaults -display none -no-reboot -nic none
	-kernel "$KDIR/arch/x86/boot/bzImage" -append "$cmdline"
	-drive "file=$IMAGE,format=raw,if=virtio,snapshot=on"
	-virtfs "local,path=$SHARE,mount_tag=ci,security_model=none,id=ci"
	-virtfs "local,path=$OUT,mount_tag=ciout,security_model=none,id=ciout"
)
if [ -n "$CLUSTER_DIR" ]; then
	qemu+=(-virtfs "local,path=$CLUSTER_DIR,mount_tag=cluster,security_model=none,id=cluster")
fi
# Each NIC a member of a multicast group on the host's loopback: the frames one guest sends
# reach every other guest on the group (a hub; the virtio-net device drops unicast for other
# MACs), and nothing leaves the host (the groups are joined and sent to on the loopback).
i=0
for nic in "${NICS[@]}"; do
	qemu+=(-netdev "socket,id=nic$i,mcast=${nic%%,*},localaddr=127.0.0.1"
		-device "virtio-net-pci,netdev=nic$i,mac=${nic#*,}")
	i=$((i + 1))
done

start=$SECONDS
if [ "$MODE" = interactive ]; then
	# Ctrl-C goes to the guest; Ctrl-A X quits, Ctrl-A C is the QEMU monitor.
	rc=0
	${TIMEOUT:+timeout --foreground "$TIMEOUT"} "${qemu[@]}" \
		-chardev stdio,id=con,mux=on,signal=off -serial chardev:con \
		-mon chardev=con,mode=readline || rc=$?
	if [ -n "$TIMEOUT" ] && [ "$rc" = 124 ]; then
		log "run-vm: TIMEOUT after $TIMEOUT s"
		exit 124
	fi
else
	# Under TCG the guest kernel rarely dies while booting, before our code runs (an int3
	# oops in live text patching on a secondary CPU, a known TCG weakness). A guest that died
	# before starting the command is booted again, at most twice; one that died later is a
	# real failure and is reported as such.
	for boot in 1 2 3; do
		# stdin is /dev/null so that QEMU never touches the terminal; it runs in the
		# background so that the timeout and Ctrl-C (trap above) can end it.
		"${qemu[@]}" -serial stdio </dev/null > >(tee "$TMP/console.log") &
		QEMU_PID=$!
		while kill -0 "$QEMU_PID" 2>/dev/null; do
			if [ $((SECONDS - start)) -ge "$TIMEOUT" ]; then
				kill "$QEMU_PID" 2>/dev/null || true
				wait "$QEMU_PID" 2>/dev/null || true
				QEMU_PID=""
				echo
				log "run-vm: TIMEOUT after $TIMEOUT s"
				exit 124
			fi
			sleep 1 & wait $! # not a plain sleep: a trapped signal interrupts wait at once
		done
		wait "$QEMU_PID" || log "qemu exited with status $?"
		QEMU_PID=""
		if [ -f "$SHARE/exit-status" ] || [ -f "$SHARE/checkers" ] ||
			grep -q 'metaroce-ci: running the command' "$TMP/console.log"; then
			break
		fi
		[ "$boot" = 3 ] || log "run-vm: the guest died while booting; booting it again"
	done
fi

[ "$OUT" = "$TMP/out" ] || log "results in $OUT"
# A debug kernel's checkers: guest-init.sh's verdict, and the console (the whole boot's) free of
# kernel reports. The verdict is also left in $OUT/checkers.
if [ -n "$CHECKERS" ]; then
	if [ ! -f "$SHARE/checkers" ] && [ -f "$SHARE/exit-status" ]; then
		echo "report: the guest gave no verdict of the checkers" >"$SHARE/checkers"
	fi
	if [ -f "$TMP/console.log" ] && grep -qaE "$KERNEL_REPORT" "$TMP/console.log"; then
		grep -m 20 -aE "$KERNEL_REPORT" "$TMP/console.log" |
			sed 's/^/report: console: /' >>"$SHARE/checkers"
	fi
	touch "$SHARE/checkers"
	cp "$SHARE/checkers" "$OUT/checkers"
	[ ! -f "$SHARE/kmemleak" ] || cp "$SHARE/kmemleak" "$OUT/kmemleak"
	sed 's/^/run-vm: checkers: /' "$SHARE/checkers" >&2
	if grep -q '^refused' "$SHARE/checkers" && [ ! -f "$SHARE/exit-status" ]; then
		log "run-vm: REFUSED: the debug kernel's checkers were not all on before the command" \
			"(it did not run)"
		exit 126
	fi
fi
if [ ! -f "$SHARE/exit-status" ]; then
	log "run-vm: the guest reported no exit status after $((SECONDS - start)) s" \
		"(kernel panic or oops, guest setup failure or QEMU quit: see the console output above)"
	exit 125
fi
rc=$(cat "$SHARE/exit-status")
log "run-vm: guest command exited with status $rc after $((SECONDS - start)) s"
if [ -n "$CHECKERS" ] && grep -q '^report' "$SHARE/checkers"; then
	log "run-vm: the debug kernel's checkers reported problems: $(grep -c "^report" "$SHARE/checkers")" \
		"(run-vm: checkers: report: ... above)"
	[ "$rc" != 0 ] || rc=123
fi
exit "$rc"
