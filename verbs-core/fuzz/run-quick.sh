#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Quick fuzzing of verbs-core's judgments of user input (WQEs, modify_qp, ring indices, driver
# data, create capacities: fuzz_targets/boundary.rs), for `make check` (FUZZ_SECONDS, default
# 30).
#
# Built as transport/fuzz/run-quick.sh builds its targets: on the pinned stable toolchain, with
# libFuzzer from libfuzzer-sys and the coverage instrumentation from stable -C flags (what
# cargo-fuzz passes, minus the sanitizer, which needs nightly; overflow checks and debug
# assertions are on instead). If the fuzzer cannot be built (no C++ compiler, no registry),
# falls back to the deterministic proptest counterpart of the WQE verdicts
# (verbs-core/tests/boundary.rs).
set -eu
cd "$(dirname "$0")"
secs="${FUZZ_SECONDS:-30}"
host=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="$PWD/target"
flags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Coverflow-checks -Cdebug-assertions"
if RUSTFLAGS="$flags" cargo build --locked --release --target "$host" --bins; then
	# A record is at most 257 bytes (a send WQE and its kind byte): 4096 holds 15 or more.
	for t in boundary; do
		mkdir -p "corpus/$t" "artifacts/$t"
		"$CARGO_TARGET_DIR/$host/release/$t" "corpus/$t" -artifact_prefix="artifacts/$t/" \
			-max_total_time="$secs" -max_len=4096 -print_final_stats=1
	done
	exit 0
fi
echo "fuzzer build failed: running the proptest counterpart of the WQE verdicts instead"
cd ../..
exec cargo test --locked -p metaroce-verbs-core --test boundary
