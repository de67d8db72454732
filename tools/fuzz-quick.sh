#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# fuzz-quick.sh DIR MAX_LEN TARGET... -- FALLBACK...: builds the libFuzzer targets of the fuzz
# crate in DIR and runs each FUZZ_SECONDS (default 30) on its corpus (DIR/corpus/TARGET, crashes
# to DIR/artifacts/TARGET), inputs of at most MAX_LEN bytes; for `make check`.
#
# Built on the pinned stable toolchain: libFuzzer comes from libfuzzer-sys and the coverage
# instrumentation from stable -C flags (what cargo-fuzz passes, minus the sanitizer, which needs
# nightly; overflow checks and debug assertions are on instead). If the fuzzer cannot be built
# (no C++ compiler, no registry), runs FALLBACK (from the repository's root) instead: the
# deterministic proptest counterpart of the same properties.
set -eu
dir="$1" max_len="$2"
shift 2
targets=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
	targets+=("$1")
	shift
done
[ $# -gt 1 ] || { echo "usage: $0 DIR MAX_LEN TARGET... -- FALLBACK..." >&2; exit 2; }
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$dir"
secs="${FUZZ_SECONDS:-30}"
host=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="$PWD/target"
flags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Coverflow-checks -Cdebug-assertions"
if RUSTFLAGS="$flags" cargo build --locked --release --target "$host" --bins; then
	for t in "${targets[@]}"; do
		mkdir -p "corpus/$t" "artifacts/$t"
		"$CARGO_TARGET_DIR/$host/release/$t" "corpus/$t" -artifact_prefix="artifacts/$t/" \
			-max_total_time="$secs" -max_len="$max_len" -print_final_stats=1
	done
	exit 0
fi
echo "fuzzer build failed: running $* instead"
cd "$root"
exec "$@"
