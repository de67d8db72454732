#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Quick fuzzing of verbs-core's judgments of user input (WQEs, modify_qp, ring indices, driver
# data, create capacities: fuzz_targets/boundary.rs), for `make check` (FUZZ_SECONDS, default
# 30). Built and run by tools/fuzz-quick.sh; without a fuzzer build, the proptest counterpart of
# the WQE verdicts (verbs-core/tests/boundary.rs). A record is at most 257 bytes (a send WQE and
# its kind byte): 4096 bytes hold 15 or more.
exec "$(dirname "$0")/../../tools/fuzz-quick.sh" "$(dirname "$0")" 4096 boundary -- \
	cargo test --locked -p metaroce-verbs-core --test boundary
