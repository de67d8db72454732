#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# make check: host tests and lint, the module build, then the guest selftests, as TAP, ending
# with one "N passed, N failed" line for everything. `check.sh host` stops after the host part.
# `check.sh debug` (make check-debug, with KERNEL_PROFILE=debug) skips the host part and runs
# DEBUG_SUITES on the debug kernel (lockdep, KASAN, kmemleak, DEBUG_LIST): first the checkers'
# own failures (a boot with kmemleak off is refused, a taint fails the run), then the suites,
# each followed by its lockdep and kmemleak checks (run.sh), then the run's verdict of the
# checkers (qemu-ci/guest-init.sh, run-vm.sh) as TAP lines.
set -u
MODE="${1:-all}"
case "$MODE" in all | host | debug) ;; *) echo "usage: $0 [all|host|debug]" >&2; exit 2 ;; esac
# The suites that check behaviour, not speed: incast, multipath and planes' rate ratio judge
# throughput and fairness, which mean nothing at KASAN's pace under TCG. netfuzz sends
# NETFUZZ_COUNT datagrams (200,000 here, 10^6 in make check); scale makes SCALE_QPS QPs at once
# (500 here, 2,000 in make check). ulp is left out: NVMe over RDMA sets off a lockdep report of
# the kernel's own (docs/debug-kernel.md), after which lockdep is off for the whole boot.
DEBUG_SUITES="${DEBUG_SUITES:-device verbs udp errors traffic forge hostile teardown rdmacm scale netfuzz ud rdma-core}"
cd "$(dirname "$0")/.."
REPO=$PWD
mkdir -p build
LOG=build/check
rm -rf "$LOG" && mkdir -p "$LOG"
export PATH="/usr/lib/llvm-22/bin:$HOME/.cargo/bin:$PATH"

passed=0 failed=0 n=0
step() { # name command...: one TAP line per step, its output in build/check/<name>.log ($STEP)
	local name="$1" start=$SECONDS rc
	shift
	n=$((n + 1))
	echo "# running: $name" >&2
	STEP=$name "$@" >"$LOG/$name.log" 2>&1 && rc=0 || rc=$?
	if [ "$rc" = 0 ]; then
		passed=$((passed + 1))
		echo "ok $n - $name ($((SECONDS - start)) s)"
	else
		failed=$((failed + 1))
		echo "not ok $n - $name ($((SECONDS - start)) s, exit $rc)"
		tail -n 60 "$LOG/$name.log" | sed 's/^/# /'
	fi
	return "$rc"
}

# guest_selftests TIMEOUT [SUITE...]: the guest selftests (all, or the SUITEs) in one boot, their
# TAP lines folded into ours; the guest's run-vm.sh result directory is build/vm-out.
guest_selftests() {
	local timeout="$1" out="$REPO/build/vm-out" rc
	shift
	rm -rf "$out" && mkdir -p "$out"
	n=$((n + 1))
	echo "# running: guest selftests${*:+ ($*)}" >&2
	# shellcheck disable=SC2086 # GUEST_ENV is a list of VAR=value
	KDIR=$(cat build/kdir) qemu-ci/run-vm.sh --timeout "$timeout" \
		--payload build/guest --out "$out" -- \
		env ${GUEST_ENV:-} /opt/metaroce/selftests/run.sh "$@" \
		>"$LOG/guest.log" 2>&1
	rc=$?
	grep -E '^(not )?ok [0-9]+ |^# ' "$LOG/guest.log" | sed 's/^/    /'
	fold_summary "guest selftests" "$out/summary" "$LOG/guest.log" "$rc"
}

# cluster_selftests TIMEOUT: selftests/cluster's suites (smoke.sh, check.sh) on g1 of 3 guests on
# 2 planes (qemu-ci/run-cluster.sh), folded in likewise; results in build/cluster-out/gI.
cluster_selftests() {
	local out="$REPO/build/cluster-out" rc c=/opt/metaroce/selftests/cluster
	rm -rf "$out" && mkdir -p "$out"
	n=$((n + 1))
	echo "# running: cluster selftests" >&2
	KDIR=$(cat build/kdir) qemu-ci/run-cluster.sh --guests 3 --planes 2 --timeout "$1" \
		--payload build/guest --out "$out" -- \
		"/opt/metaroce/selftests/run.sh $c/smoke.sh $c/check.sh" >"$LOG/cluster.log" 2>&1
	rc=$?
	sed -n 's/^g1| //p' "$LOG/cluster.log" | grep -E '^(not )?ok [0-9]+ |^# ' | sed 's/^/    /'
	fold_summary "cluster selftests" "$out/g1/summary" "$LOG/cluster.log" "$rc"
}

# fold_summary WHAT SUMMARY LOG RC: counts a guest run's "passed failed" SUMMARY into ours (one
# more failure if the run failed with none counted); a run that left none is one failure.
fold_summary() {
	local gp gf
	if [ -f "$2" ]; then
		read -r gp gf <"$2"
		passed=$((passed + gp))
		failed=$((failed + gf))
		n=$((n + gp + gf - 1))
		[ "$4" = 0 ] || [ "$gf" != 0 ] || { failed=$((failed + 1)); n=$((n + 1)); }
		echo "# $1: $gp passed, $gf failed (exit $4)"
	else
		failed=$((failed + 1))
		echo "not ok $n - $1 did not report (exit $4)"
		tail -n 60 "$3" | sed 's/^/# /'
	fi
}

# checkers_verdict FILE: the debug kernel's checkers' verdict of a run (run-vm.sh's
# $OUT/checkers), a TAP line each: "ok: ..." passes, "refused: ..." and "report: ..." fail.
checkers_verdict() {
	local kind what
	if [ ! -s "$1" ]; then
		n=$((n + 1)) failed=$((failed + 1))
		echo "not ok $n - debug kernel: the run left no verdict of the checkers ($1)"
		return
	fi
	while read -r kind what; do
		n=$((n + 1))
		if [ "$kind" = ok: ]; then
			passed=$((passed + 1))
			echo "ok $n - debug kernel: $what"
		else
			failed=$((failed + 1))
			echo "not ok $n - debug kernel: $kind $what"
		fi
	done <"$1"
}

# vm_expect STATUS REGEX RUN-VM-ARGS...: run-vm.sh exits with STATUS and its output matches REGEX.
vm_expect() {
	local want="$1" re="$2" rc
	shift 2
	KDIR=$(cat build/kdir) qemu-ci/run-vm.sh --timeout 900 --payload build/guest "$@" && rc=0 || rc=$?
	echo "run-vm.sh exited with status $rc (wanted $want)"
	[ "$rc" = "$want" ] && grep -Eq -- "$re" "$LOG/$STEP.log"
}

echo "TAP version 13"
step setup-host qemu-ci/setup-host.sh
if [ "$MODE" != debug ]; then
	step cargo-test cargo test --workspace --locked
	grep -h '^test result:' "$LOG/cargo-test.log" | sed 's/^/# /'
	step cargo-clippy cargo clippy --workspace --all-targets --locked -- -D warnings
	step cargo-fmt cargo fmt --all --check
	# The fabric simulator's small scenario table: completion, delivery counts, determinism.
	step sim-quick make --no-print-directory sim-quick
	# The fuzz crates are not workspace members: each is checked in its own directory.
	step fuzz-fmt sh -c 'cd transport/fuzz && cargo fmt --check && cd ../../verbs-core/fuzz && cargo fmt --check'
	# The module's crate is not a Cargo package: rustfmt follows its mod lines from the root.
	step drivers-fmt rustfmt --edition 2021 --check drivers/metaroce_main.rs
	if [ -x transport/fuzz/run-quick.sh ]; then step fuzz-quick transport/fuzz/run-quick.sh; fi
	# The kernel's judgments of user input (WQEs, modify_qp, ring indices, driver data).
	if [ -x verbs-core/fuzz/run-quick.sh ]; then step fuzz-verbs verbs-core/fuzz/run-quick.sh; fi
fi

if [ "$MODE" != host ]; then
	step kernel make --no-print-directory kernel
	step module make --no-print-directory module
	step provider make --no-print-directory provider
	step image make --no-print-directory image
	if ! step payload make --no-print-directory payload; then
		:
	elif [ "$MODE" = all ]; then
		guest_selftests "${SELFTEST_TIMEOUT:-2400}"
		# Several guests, each its own kernel, on a two-plane fabric: MPI over metaroce
		# and the faults (a lossy plane, a plane cut, a guest lost mid-job).
		cluster_selftests "${CLUSTER_TIMEOUT:-1200}"
		# make bench's quick profile, so the benchmark never rots: it must produce every
		# scenario's table with a number measured on metaroce; speeds are not judged here.
		if step bench-quick selftests/bench/bench.sh --check quick; then
			sed -n '/^## Headline/,/^## /{/^|/p}' build/bench/report.md | sed 's/^/# /'
		fi
	else
		if ! grep -q '^CONFIG_KASAN=y' "$(cat build/kdir)/.config"; then
			n=$((n + 1)) failed=$((failed + 1))
			echo "not ok $n - the kernel in build/kdir is no debug kernel (KERNEL_PROFILE=debug?)"
		else
			# The checkers' plumbing can fail: a boot whose kmemleak is off is refused and
			# the command does not run; a taint during the command fails the run.
			step checkers-refuse-off vm_expect 126 'refused: kmemleak is off' \
				--append kmemleak=off -- 'echo the command ran'
			step checkers-report-taint vm_expect 123 'report: the kernel is tainted \([0-9]+: U\)' \
				-- 'echo 64 >/proc/sys/kernel/tainted'
			# shellcheck disable=SC2086 # DEBUG_SUITES is a list
			GUEST_ENV="NETFUZZ_COUNT=${NETFUZZ_COUNT:-200000} SCALE_QPS=${SCALE_QPS:-500}" \
				guest_selftests "${SELFTEST_TIMEOUT:-5400}" $DEBUG_SUITES
			checkers_verdict build/vm-out/checkers
		fi
	fi
fi
echo "1..$n"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
