#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""MPI collectives with every result checked (mpi4py; run by mpirun on every guest).

    collectives.py [--sizes 8,4096,...] [--ops allreduce,alltoall,bcast] [--seconds S]
                   [--min-reps N] [--give-up S] [--label NAME] [--out FILE]

For each operation and message size (bytes per rank; for Alltoall the whole send buffer, split
evenly among the ranks) rank 0 prints one line per size: label, operation, size, repetitions
and the median, minimum and maximum time of one operation in microseconds (the slowest rank's
time of each repetition). Every repetition's result is compared with what it must be; a wrong
byte anywhere aborts the job with a non-zero status. --out appends the lines as CSV. With
--give-up S, an operation whose median took more than S seconds at one size is not run at the
larger ones (its line says "gave up").
"""

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

OPS = ("allreduce", "alltoall", "bcast")


def pattern(rank, rep, count):
    """Distinct int64 values for each rank, repetition and element."""
    return (np.arange(count, dtype=np.int64) * 7919 + rank * 1_000_003 + rep * 97) % (1 << 40)


def run_op(comm, op, size, rep):
    rank, n = comm.Get_rank(), comm.Get_size()
    if op == "allreduce":
        count = max(1, size // 8)
        send = pattern(rank, rep, count)
        recv = np.empty(count, dtype=np.int64)
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(send, recv, op=MPI.SUM)
        t = time.perf_counter() - t
        want = sum(pattern(r, rep, count) for r in range(n))
        ok = np.array_equal(recv, want)
    elif op == "alltoall":
        block = max(1, size // (8 * n))
        send = np.concatenate([pattern(rank * n + dst, rep, block) for dst in range(n)])
        recv = np.empty(block * n, dtype=np.int64)
        comm.Barrier()
        t = time.perf_counter()
        comm.Alltoall(send, recv)
        t = time.perf_counter() - t
        want = np.concatenate([pattern(src * n + rank, rep, block) for src in range(n)])
        ok = np.array_equal(recv, want)
    else:
        count = max(1, size // 8)
        buf = pattern(0, rep, count) if rank == 0 else np.zeros(count, dtype=np.int64)
        comm.Barrier()
        t = time.perf_counter()
        comm.Bcast(buf, root=0)
        t = time.perf_counter() - t
        ok = np.array_equal(buf, pattern(0, rep, count))
    return t, ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,512,32768,1048576,8388608,67108864")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--seconds", type=float, default=2.0,
                    help="time budget per operation and size (at least 3 repetitions)")
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--give-up", type=float, default=0.0,
                    help="seconds: larger sizes of an operation slower than this are not run")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in OPS:
            sys.exit(f"unknown operation {o}")
    lines = []
    for op in ops:
        too_slow = False
        for size in sizes:
            if too_slow:
                if rank == 0:
                    print(f"{args.label},{op},{size},gave up", flush=True)
                continue
            times, rep, start = [], 0, time.perf_counter()
            while True:
                t, ok = run_op(comm, op, size, rep)
                bad = comm.allreduce(0 if ok else 1, op=MPI.SUM)
                if bad:
                    if rank == 0:
                        print(f"{op} {size} B repetition {rep}: wrong result on {bad} of {n} "
                              "ranks", file=sys.stderr, flush=True)
                    comm.Abort(3)
                times.append(comm.allreduce(t, op=MPI.MAX))
                rep += 1
                # Every rank decides alike: rank 0's clock decides.
                done = comm.bcast(rep >= args.min_reps
                                  and time.perf_counter() - start >= args.seconds
                                  or rep >= 1000, root=0)
                if done:
                    break
            median = sorted(times)[len(times) // 2]
            too_slow = args.give_up > 0 and median > args.give_up
            if rank == 0:
                us = sorted(x * 1e6 for x in times)
                line = (f"{args.label},{op},{size},{len(us)},{us[len(us) // 2]:.1f},"
                        f"{us[0]:.1f},{us[-1]:.1f}")
                print(line, flush=True)
                lines.append(line)
    if rank == 0 and args.out:
        with open(args.out, "a") as f:
            for line in lines:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
