#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Verbs objects and the shared-memory rings through the stock pyverbs (selftests/py/objects.py).
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
setup_pair metaroce mroce
timeout 120 python3 "$(dirname "$0")/../py/objects.py" mroce1 >"$TAP_DIR/objects.out" 2>&1
# Each "ok - ..." / "not ok - ..." line of the script becomes one TAP result.
while IFS= read -r line; do
	case "$line" in
	"ok - "*) _tap 0 "${line#ok - }" ;;
	"not ok - "*) _tap 1 "${line#not ok - }" ;;
	*) echo "$line" ;;
	esac
done <"$TAP_DIR/objects.out"
teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
