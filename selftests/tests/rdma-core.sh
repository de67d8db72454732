#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# rdma-core 56.1's own test suite (its tests/, from the source the provider is built against,
# run with the guest's stock pyverbs) on rxe and on metaroce in the same boot, one device on a
# veth with IPv4 and IPv6 addresses, as a user would run it (`--dev`, the suite's own choice of
# port and GID: the first, the IPv6 link-local one). Fails when metaroce passes fewer tests than
# rxe or any test fails or errors on metaroce; prints both counts and what differs.
# Part of `make check`; alone: make vm CMD='bash /opt/metaroce/selftests/run.sh rdma-core'.
# RDMA_CORE_MODULES (test_qp,test_mr,...: commas or spaces) limits it to some modules.
source "$(dirname "$0")/../lib.sh"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
TESTS=/opt/metaroce/rdma-core-tests/tests
dmesg_mark
check "rdma-core's tests/ are in the payload" test -f "$TESTS/run_tests.py"

# run_suite TYPE PREFIX: the suite on ${PREFIX}1 (in ns1), results in $TAP_DIR/rdma-core-TYPE.
run_suite() {
	local type="$1" prefix="$2" out="$TAP_DIR/rdma-core-$1"
	setup_pair "$type" "$prefix"
	# shellcheck disable=SC2086 # a list of module names
	$IP netns exec ns1 python3 "$HERE/py/rdma_core_tests.py" "$TESTS" "${prefix}1" "$out" \
		${RDMA_CORE_MODULES//,/ } >"$out.summary" 2>&1
	echo "# $(tail -n 1 "$out.summary")"
	teardown_pair
}

modprobe rdma_rxe
run_suite rxe rxe
rmmod rdma_rxe
modprobe metaroce
run_suite metaroce mroce

count() { awk -F'\t' -v o="$2" '$1 == o' "$1" | wc -l; }
rxe=$TAP_DIR/rdma-core-rxe
mr=$TAP_DIR/rdma-core-metaroce
rxe_pass=$(count "$rxe" pass)
mr_pass=$(count "$mr" pass)
check "rdma-core tests ran on rxe ($rxe_pass passed)" test "$rxe_pass" -gt 0
# Every test that did not pass or skip on rxe (the reference has its own failures), then on
# metaroce, with why.
awk -F'\t' '$1 != "pass" && $1 != "skip" { print "# rxe " $1 ": " $2 ": " $3 }' "$rxe"
awk -F'\t' '$1 != "pass" && $1 != "skip" { print "# metaroce " $1 ": " $2 ": " $3 }' "$mr"
check "rdma-core tests: none fails or errors on metaroce ($(count "$mr" fail) failed, $(count "$mr" error) errors)" \
	test "$(awk -F'\t' '$1 != "pass" && $1 != "skip"' "$mr" | wc -l)" = 0
# What passes on rxe and not on metaroce (skipped there, say), with metaroce's reason.
awk -F'\t' 'NR == FNR { if ($1 == "pass") want[$2] = 1; next }
	($2 in want) && $1 != "pass" { print "# passes on rxe, " $1 " on metaroce: " $2 ": " $3 }' "$rxe" "$mr"
check "rdma-core tests: metaroce passes at least as many as rxe ($mr_pass vs $rxe_pass)" \
	test "$mr_pass" -ge "$rxe_pass"
rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
cp "$rxe" "$mr" "${METAROCE_OUT:-/tmp}/" 2>/dev/null || true
suite_end
