#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Verbs objects and the shared-memory rings through the stock pyverbs (selftests/py/objects.py).
source "$(dirname "$0")/../lib.sh"
dmesg_mark
modprobe metaroce
setup_pair metaroce mroce
# Addresses nobody answers, for the max_peers check: their MACs resolve from these.
for a in 50 51 52; do
	$IP -n ns1 neigh replace 10.77.0.$a lladdr 02:00:00:00:00:$a dev veth1 nud permanent
done
timeout 120 python3 "$(dirname "$0")/../py/objects.py" mroce1 >"$TAP_DIR/objects.out" 2>&1
objects_rc=$?
# Each "ok - ..." / "not ok - ..." line of the script becomes one TAP result.
while IFS= read -r line; do
	case "$line" in
	"ok - "*) _tap 0 "${line#ok - }" ;;
	"not ok - "*) _tap 1 "${line#not ok - }" ;;
	*) echo "$line" ;;
	esac
done <"$TAP_DIR/objects.out"
# A crash, a timeout or an exception outside a check prints fewer checks than the script has:
# its exit status must be 0, or 1 with a failed check printed.
objects_exit() {
	case "$1" in
	0) ! grep -q '^not ok - ' "$TAP_DIR/objects.out" ;;
	1) grep -q '^not ok - ' "$TAP_DIR/objects.out" ;;
	*) false ;;
	esac
}
check "objects.py ran every check (exit status $objects_rc)" objects_exit "$objects_rc"
teardown_pair
check "rmmod metaroce" rmmod metaroce
check_no_output "kernel log clean (no oops, WARN, leak)" "$KERNEL_TROUBLE" dmesg_since_mark
suite_end
