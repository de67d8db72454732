#!/bin/bash
# Quick fuzzing of the wire parser, for `make check`. With cargo-fuzz and a nightly toolchain:
# 30 s of libFuzzer on fuzz_targets/parse.rs. Without them (the pinned stable toolchain): the
# deterministic proptest "fuzz" of the same properties (random bytes never panic; mutated valid
# packets never panic and re-emit byte for byte; arbitrary headers round-trip).
set -eu
cd "$(dirname "$0")"
if cargo +nightly fuzz --version >/dev/null 2>&1; then
	exec cargo +nightly fuzz run parse -- -max_total_time="${FUZZ_SECONDS:-30}"
fi
echo "cargo-fuzz/nightly not available: running the proptest fuzz of the wire format"
cd ..
exec cargo test --locked -p metaroce-transport --lib wire::
