#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# make check: host tests and lint, the module build, then the guest selftests, as TAP, ending
# with one "N passed, N failed" line for everything. `check.sh host` stops after the host part.
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
mkdir -p build
LOG=build/check
rm -rf "$LOG" && mkdir -p "$LOG"
export PATH="/usr/lib/llvm-22/bin:$HOME/.cargo/bin:$PATH"

passed=0 failed=0 n=0
step() { # name command...: one TAP line per step, its output in build/check/<name>.log
	local name="$1" start=$SECONDS rc
	shift
	n=$((n + 1))
	echo "# running: $name" >&2
	"$@" >"$LOG/$name.log" 2>&1 && rc=0 || rc=$?
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

echo "TAP version 13"
step setup-host qemu-ci/setup-host.sh
step cargo-test cargo test --workspace --locked
grep -h '^test result:' "$LOG/cargo-test.log" | sed 's/^/# /'
step cargo-clippy cargo clippy --workspace --all-targets --locked -- -D warnings
step cargo-fmt cargo fmt --all --check
# The module's crate is not a Cargo package: rustfmt follows its mod lines from the root.
step drivers-fmt rustfmt --edition 2021 --check drivers/metaroce_main.rs
if [ -x transport/fuzz/run-quick.sh ]; then step fuzz-quick transport/fuzz/run-quick.sh; fi
# The kernel's judgments of user input (WQEs, modify_qp, ring indices, driver data).
if [ -x verbs-core/fuzz/run-quick.sh ]; then step fuzz-verbs verbs-core/fuzz/run-quick.sh; fi

if [ "${1:-all}" != host ]; then
	step kernel make --no-print-directory kernel
	step module make --no-print-directory module
	step provider make --no-print-directory provider
	step image make --no-print-directory image
	if step payload make --no-print-directory payload; then
		out="$REPO/build/vm-out"
		rm -rf "$out" && mkdir -p "$out"
		n=$((n + 1))
		echo "# running: guest selftests" >&2
		KDIR=$(cat build/kdir) qemu-ci/run-vm.sh --timeout "${SELFTEST_TIMEOUT:-2400}" \
			--payload build/guest --out "$out" -- \
			/opt/metaroce/selftests/run.sh \
			>"$LOG/guest.log" 2>&1
		rc=$?
		grep -E '^(not )?ok [0-9]+ |^# ' "$LOG/guest.log" | sed 's/^/    /'
		if [ -f "$out/summary" ]; then
			read -r gp gf <"$out/summary"
			passed=$((passed + gp))
			failed=$((failed + gf))
			n=$((n + gp + gf - 1))
			[ "$rc" = 0 ] || [ "$gf" != 0 ] || { failed=$((failed + 1)); n=$((n + 1)); }
			echo "# guest selftests: $gp passed, $gf failed (vm exit $rc)"
		else
			failed=$((failed + 1))
			echo "not ok $n - guest selftests did not report (vm exit $rc)"
			tail -n 60 "$LOG/guest.log" | sed 's/^/# /'
		fi
		# make bench's quick profile, so the benchmark never rots: it must produce every
		# scenario's table with a number measured on metaroce; speeds are not judged here.
		if step bench-quick selftests/bench/bench.sh --check quick; then
			sed -n '/^## Headline/,/^## /{/^|/p}' build/bench/report.md | sed 's/^/# /'
		fi
	fi
fi
echo "1..$n"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
