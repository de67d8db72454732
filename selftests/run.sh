#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Runs the guest selftests (tests/*.sh, or the ones named) and prints TAP with a closing
# "N passed, N failed" line. A suite that exits non-zero, or that never reaches its last line
# (`suite_end` in lib.sh: a crash or an exit halfway), is a failure. Exit status 0 only if all
# passed. Writes the counts to $1/summary
# when METAROCE_OUT is set (the host-side check.sh reads it).
# On a kernel with lockdep or kmemleak (the debug kernel) each suite is followed by the
# checkers' own checks: lockdep is still on (a report turns it off for the rest of the boot: the
# suite that did it is named) and kmemleak finds nothing the suite left unreferenced (two scans
# 6 s apart, then the list is cleared so that the next suite starts from none).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
export TAP_DIR=/tmp/metaroce-tap
rm -rf "$TAP_DIR"
mkdir -p "$TAP_DIR"
echo 0 >"$TAP_DIR/n"

tests=("$@")
[ "${#tests[@]}" -gt 0 ] || tests=("$HERE"/tests/*.sh)
source "$HERE/lib.sh"

KMEMLEAK=/sys/kernel/debug/kmemleak
checkers_after() { # suite
	local v n
	if [ -r /proc/lockdep_stats ]; then
		v=$(awk '$1 == "debug_locks:" { print $2 }' /proc/lockdep_stats)
		check "$1: lockdep still on after it (debug_locks $v)" test "$v" = 1
	fi
	[ -w $KMEMLEAK ] || return 0
	sleep 6
	if ! { echo scan >$KMEMLEAK && sleep 6 && echo scan >$KMEMLEAK; }; then
		_tap 1 "$1: kmemleak scans after it (kmemleak is off: $(dmesg | grep -m1 "kmemleak: "))"
		return 0
	fi
	n=$(grep -c '^unreferenced object' $KMEMLEAK)
	if [ "$n" != 0 ]; then
		sed 's/^/# /' $KMEMLEAK | head -n 200
		cp $KMEMLEAK "${METAROCE_OUT:-/tmp}/kmemleak-$1" 2>/dev/null
	fi
	_tap "$([ "$n" = 0 ]; echo $?)" "$1: kmemleak: nothing left unreferenced after it ($n objects)"
	echo clear >$KMEMLEAK
}
pin_static_keys
echo "TAP version 13"
for t in "${tests[@]}"; do
	[ -f "$t" ] || t="$HERE/tests/$t.sh"
	echo "# --- $(basename "$t" .sh)"
	# Each test file runs in its own shell so a failing one cannot poison the next.
	SUITE=$(basename "$t" .sh) bash "$t"
	rc=$?
	if [ "$rc" != 0 ]; then
		_tap 1 "$(basename "$t" .sh): script exited with status $rc"
	elif [ ! -e "$TAP_DIR/end-$(basename "$t" .sh)" ]; then
		_tap 1 "$(basename "$t" .sh): script stopped before its end (its later checks did not run)"
	fi
	checkers_after "$(basename "$t" .sh)"
done
n=$(cat "$TAP_DIR/n")
count() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
passed=$(count "$TAP_DIR/passed")
failed=$(count "$TAP_DIR/failed")
echo "1..$n"
if [ -n "${METAROCE_OUT:-}" ]; then
	echo "$passed $failed" >"$METAROCE_OUT/summary"
	if [ -f "$TAP_DIR/failed" ]; then cp "$TAP_DIR/failed" "$METAROCE_OUT/failed"; fi
fi
echo "guest: $passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$n" -gt 0 ]
