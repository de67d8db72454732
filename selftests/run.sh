#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Runs the guest selftests (tests/*.sh, or the ones named) and prints TAP with a closing
# "N passed, N failed" line. A suite that exits non-zero, or that never reaches its last line
# (`suite_end` in lib.sh: a crash or an exit halfway), is a failure. Exit status 0 only if all
# passed. Writes the counts to $1/summary
# when METAROCE_OUT is set (the host-side check.sh reads it).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
export TAP_DIR=/tmp/metaroce-tap
rm -rf "$TAP_DIR"
mkdir -p "$TAP_DIR"
echo 0 >"$TAP_DIR/n"

tests=("$@")
[ "${#tests[@]}" -gt 0 ] || tests=("$HERE"/tests/*.sh)
source "$HERE/lib.sh"
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
