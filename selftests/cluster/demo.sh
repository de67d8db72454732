#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# make demo-cluster, run on g1: MPI Allreduce and Alltoall across the guests over metaroce,
# rxe and TCP side by side (same guests, same fabric; every result checked), as a table, then
# a plane cut in the middle of a long Allreduce over metaroce against the same Allreduce with
# no cut. Writes collectives.csv and demo.md to the results directory.
#
#   DEMO_SIZES (bytes, comma-separated; default 8 B to 64 MiB), DEMO_SECONDS (per size, 1.5),
#   DEMO_GIVE_UP (seconds: an operation slower than this at one size is not run at larger
#   ones, 5; rxe's Allreduce of 1 MiB takes 10 s here)
set -u
. /opt/metaroce/selftests/lib.sh
. /opt/metaroce/selftests/cluster/lib.sh
SIZES=${DEMO_SIZES:-8,4096,65536,1048576,8388608,67108864}
SECS=${DEMO_SECONDS:-1.5}
GIVE_UP=${DEMO_GIVE_UP:-5}
TRANSPORTS=(metaroce rxe tcp)
rm -f collectives.csv

add_rxe || { echo "cannot add rxe0 on every guest" >&2; exit 1; }
for t in "${TRANSPORTS[@]}"; do
	echo "== $t: Allreduce and Alltoall, $SIZES bytes"
	mpi "$t" python3 $COLLECTIVES --sizes "$SIZES" --ops allreduce,alltoall --seconds "$SECS" \
		--min-reps 2 --give-up "$GIVE_UP" --label "$t" --out collectives.csv 2>&1 | grep -v '^\[g[0-9]*:[0-9]*\] \[ *[0-9]*\]' ||
		{ echo "$t: the job failed" >&2; exit 1; }
done

# The plane cut: 16 MiB Allreduces for 20 s, plane 2 taken down in every guest at 6 s.
echo "== plane cut: 16 MiB Allreduces over metaroce for 20 s, with and without a cut"
cut_run() { # label: one 20 s run; prints its repetitions
	mpi metaroce python3 $COLLECTIVES --sizes 16777216 --ops allreduce --seconds 20 \
		--label "$1" --out collectives.csv 2>&1 | grep -v '^\[g[0-9]*:[0-9]*\] \[ *[0-9]*\]'
}
cut_run nocut || { echo "the uncut run failed" >&2; exit 1; }
cut_run cut &
job=$!
sleep 6
plane_down 2
echo "plane 2 down in every guest"
wait $job || { plane_up 2; echo "the Allreduce with a plane cut failed" >&2; exit 1; }
plane_up 2

python3 - "$CLUSTER_N" "$CLUSTER_P" <<'EOF' | tee demo.md
import csv, sys
from collections import defaultdict
n, p = sys.argv[1], sys.argv[2]
rows = list(csv.reader(open("collectives.csv")))
t = defaultdict(dict)  # (op, size) -> transport -> median us
runs = {}
for label, op, size, reps, med, lo, hi in rows:
    if label in ("cut", "nocut"):
        runs[label] = (int(reps), float(med))
    else:
        t[(op, int(size))][label] = float(med)
def fmt(size):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= k:
            return f"{size // k} {unit}"
    return f"{size} B"
print(f"MPI collectives, {n} guests (one rank each), {p} planes; median time of one operation "
      "in microseconds (the slowest rank's)\n")
print("(\"gave up\": the operation took more than the give-up time at a smaller size)\n")
print("| operation | size | metaroce | rxe | TCP | rxe / metaroce | TCP / metaroce |")
print("|---|---|---|---|---|---|---|")
for (op, size), v in sorted(t.items()):
    m, r, c = v.get("metaroce"), v.get("rxe"), v.get("tcp")
    cell = lambda x: f"{x:,.0f}" if x is not None else "gave up"
    ratio = lambda x: f"{x / m:.2f}" if x is not None and m else "-"
    print(f"| {op} | {fmt(size)} | {cell(m)} | {cell(r)} | {cell(c)} | {ratio(r)} | {ratio(c)} |")
if "cut" in runs and "nocut" in runs:
    (rc, mc), (rn, mn) = runs["cut"], runs["nocut"]
    print(f"\n16 MiB Allreduce over metaroce, 20 s: {rn} operations (median {mn:,.0f} us) with no "
          f"cut; {rc} (median {mc:,.0f} us) with plane 2 taken down in every guest at 6 s, "
          "every result right")
EOF
