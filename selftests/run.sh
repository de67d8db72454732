#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Runs the guest selftests (tests/*.sh, or the ones named) and prints TAP with a closing
# "N passed, N failed" line (", N skipped" added when there are TODOs: known driver bugs, which
# do not count as failures). Exit status 0 only if all passed. Writes the counts to $1/summary
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
	bash "$t"
	rc=$?
	if [ "$rc" != 0 ]; then
		source "$HERE/lib.sh"
		_tap 1 "$(basename "$t" .sh): script exited with status $rc"
	fi
done
n=$(cat "$TAP_DIR/n")
count() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
passed=$(count "$TAP_DIR/passed")
failed=$(count "$TAP_DIR/failed")
todos=$(count "$TAP_DIR/todo")
echo "1..$n"
if [ -n "${METAROCE_OUT:-}" ]; then
	echo "$passed $failed" >"$METAROCE_OUT/summary"
	if [ -f "$TAP_DIR/failed" ]; then cp "$TAP_DIR/failed" "$METAROCE_OUT/failed"; fi
fi
if [ "$todos" -gt 0 ]; then
	echo "guest: $passed passed, $failed failed, $todos skipped"
else
	echo "guest: $passed passed, $failed failed"
fi
[ "$failed" = 0 ] && [ "$n" -gt 0 ]
