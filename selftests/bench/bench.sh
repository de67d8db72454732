#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# make bench / make bench-quick: boots the guest once, runs selftests/bench/run.sh in it (progress
# on the console), then turns its samples into build/bench/report.md, samples.csv and PNG plots.
#
#   selftests/bench/bench.sh [--check] [quick|full] [SCENARIO...]
#
# Expects `make payload image` done (the Makefile's bench targets do it). The plots need
# matplotlib: it is installed with pip (the host's pip configuration decides the index) into a
# venv in $METAROCE_CACHE (default ~/.cache/metaroce), keyed by a hash of requirements.txt;
# without it the report still comes, without plots. --check (make check): fail unless the
# report has every scenario's table with a number measured on metaroce in each, never on speeds.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO"
CHECK=()
if [ "${1:-}" = --check ]; then CHECK=(--check); shift; fi
PROFILE="${1:-full}"
shift || true
case "$PROFILE" in
quick) TIMEOUT=${BENCH_TIMEOUT:-1500} ;;
full) TIMEOUT=${BENCH_TIMEOUT:-14400} ;;
*) echo "bench: unknown profile $PROFILE (quick or full)" >&2; exit 2 ;;
esac
OUT="$REPO/build/bench"
RAW="$OUT/raw"
rm -rf "$OUT" && mkdir -p "$RAW"
[ -f build/kdir ] || { echo "bench: no build/kdir; run make payload first" >&2; exit 2; }

# The host's side of the environment.
{
	echo "commit=$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo '+dirty')"
	echo "commit_subject=$(git log -1 --format=%s 2>/dev/null | cut -c1-80)"
	echo "host_kernel=$(uname -r)"
	echo "host_cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
	echo "host_cpus=$(nproc)"
	echo "host_load=$(cut -d' ' -f1-3 /proc/loadavg)"
	echo "qemu=$(qemu-system-x86_64 --version | head -n 1)"
	echo "qemu_accel=tcg (qemu-ci/run-vm.sh)"
} >"$RAW/host-env.txt"

echo "bench: $PROFILE profile, one guest boot, progress below; results in $OUT"
# The guest side's settings, passed on when set here (see README.md).
fwd=()
for v in BENCH_REPS BENCH_RATE BENCH_PLANE_RATE BENCH_INCAST_RATE BENCH_REORDER; do
	if [ -n "${!v:-}" ]; then fwd+=("$v=${!v}"); fi
done
KDIR=$(cat build/kdir) qemu-ci/run-vm.sh --timeout "$TIMEOUT" --payload build/guest --out "$RAW" -- \
	env "${fwd[@]}" /opt/metaroce/selftests/bench/run.sh "$PROFILE" "$@"
rc=$?
[ "$rc" = 0 ] || echo "bench: the guest run exited with status $rc (report from what it wrote)" >&2

# matplotlib in a venv keyed by the requirements.
CACHE="${METAROCE_CACHE:-$HOME/.cache/metaroce}"
req="$HERE/requirements.txt"
venv="$CACHE/bench-venv-$( (cat "$req"; python3 --version) | sha256sum | cut -c1-16)"
if [ ! -f "$venv/.done" ]; then
	echo "bench: installing the plot dependencies into $venv"
	rm -rf "$venv"
	if python3 -m venv "$venv" && "$venv/bin/pip" install -q -r "$req"; then
		touch "$venv/.done"
	else
		echo "bench: could not install matplotlib; the report comes without plots" >&2
	fi
fi
py=python3
[ -f "$venv/.done" ] && py="$venv/bin/python3"
"$py" "$HERE/report.py" --raw "$RAW" --out "$OUT" "${CHECK[@]}"
rrc=$?
[ "$rrc" = 0 ] || exit "$rrc"
[ "$rc" = 0 ] || exit "$rc"
