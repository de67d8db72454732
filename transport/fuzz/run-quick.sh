#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Quick fuzzing of the wire parser and of a live connection, for `make check` (FUZZ_SECONDS
# per target, default 30): parse, the wire format alone; connection, datagrams against a live
# connection. Built and run by tools/fuzz-quick.sh; without a fuzzer build, the proptest fuzz
# of the wire format in the normal test suite.
exec "$(dirname "$0")/../../tools/fuzz-quick.sh" "$(dirname "$0")" 4096 parse connection -- \
	cargo test --locked -p metaroce-transport --lib wire::
