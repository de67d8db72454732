#!/bin/bash
# Quick fuzzing of the wire parser and of a live connection, for `make check` (FUZZ_SECONDS
# per target, default 30).
#
# Works on the pinned stable toolchain: libFuzzer comes from libfuzzer-sys and the coverage
# instrumentation from stable -C flags (what cargo-fuzz passes, minus the sanitizer, which
# needs nightly; overflow checks and debug assertions are on instead). If the fuzzer cannot be
# built (no C++ compiler, no registry), falls back to the deterministic proptest "fuzz" of the
# same properties in the normal test suite.
set -eu
cd "$(dirname "$0")"
secs="${FUZZ_SECONDS:-30}"
host=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="$PWD/target"
flags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Coverflow-checks -Cdebug-assertions"
if RUSTFLAGS="$flags" cargo build --locked --release --target "$host" --bins; then
	# parse: the wire format alone; connection: datagrams against a live connection.
	for t in parse connection; do
		mkdir -p "corpus/$t" "artifacts/$t"
		"$CARGO_TARGET_DIR/$host/release/$t" "corpus/$t" -artifact_prefix="artifacts/$t/" \
			-max_total_time="$secs" -max_len=4096 -print_final_stats=1
	done
	exit 0
fi
echo "fuzzer build failed: running the proptest fuzz of the wire format instead"
cd ..
exec cargo test --locked -p metaroce-transport --lib wire::
