#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""make bench, host side: the guest's samples.csv and env.txt (plus host-env.txt) into a
Markdown report (one table per scenario: metaroce, rxe and TCP as median with spread, and the
ratios metaroce/rxe and metaroce/TCP), a copy of the raw CSV and PNG plots.

    report.py --raw DIR --out DIR [--check]

--check: exit 1 unless every scenario has its table with at least one number measured on
metaroce (it checks that the benchmark measured what it reports, never speeds).
"""

import argparse
import csv
import os
import shutil
import statistics
import sys
import textwrap
from collections import OrderedDict, defaultdict

TRANSPORTS = ("metaroce", "rxe", "tcp")
LABEL = {"metaroce": "metaroce", "rxe": "rxe", "tcp": "TCP"}

# name, title, x axis, what it measures.
SCENARIOS = [
    ("bw_size", "Lossless bandwidth by message size", "message size (B)",
     "ib_write_bw -s SIZE -D; TCP: iperf3 -l SIZE. Unshaped veth pair: what the (emulated) CPU gives."),
    ("lat_size", "Lossless latency by message size", "message size (B)",
     "ib_write_lat t_typical (median, us); TCP: qperf tcp_lat. Lower is better, so a ratio below 1 favours metaroce."),
    ("qps", "Bandwidth by number of QPs", "QPs (TCP: parallel streams)",
     "ib_write_bw -q N 64 KiB; TCP: iperf3 -P N. Unshaped."),
    ("loss", "Loss sweep", "loss (%)",
     "ib_write_bw 64 KiB / iperf3 over a rate-limited veth with netem loss on the data direction (one-way) "
     "or on both directions."),
    ("reorder", "Reordering, with and without loss", "loss (%)",
     "netem reordering (see the case) on the data direction of an unshaped veth (compare with the lossless point of `bw_size`)."),
    ("multipath", "Multipath fabric, one path lossy", "loss on spine 1 (%)",
     "leaf/spine fabric (selftests/fabric.sh), 4 rate-limited spines, ECMP on the 5-tuple; netem loss on spine 1."),
    ("planes", "Rate-limited planes", "planes",
     "N veth planes, each rate-limited. metaroce: one multi-plane device per side spanning the N planes "
     "(docs/multiplane.md) and one QP; rxe: a device pair and a QP per plane, summed; TCP: a flow per plane, "
     "summed. The second table has metaroce the way rxe runs (a device and a QP per plane)."),
    ("cut", "A path cut mid-run", "phase",
     "Receiver's link throughput (all planes / the receiving host's uplink, Mb/s) before, during and after one "
     "plane (metaroce: of its multi-plane device) or spine link "
     "path is blackholed (every IPv4 packet dropped on ingress at both ends; link up, shaping kept) and "
     "restored; time series in cut.png."),
    ("incast", "Incast", "senders",
     "N senders to one receiver through a bridge whose port to the receiver is rate-limited: the sum of what "
     "the senders' perftest/iperf3 report (goodput) and Jain's fairness index over it (1 = fair); and from the "
     "bridge's own byte counters over the middle of the runs, the bottleneck's load (bytes towards the receiver "
     "over the line rate, retransmissions included) and Jain's index over the bytes each sender put in."),
    ("conns", "Connection scaling and kernel memory", "QPs",
     "N RC QPs open and active at once (several perftest processes), the most seen open, and kernel memory "
     "(slab + vmalloc from /proc/meminfo) per QP and per device; split into the rings (vmalloc: both "
     "transports' rings are vmalloc_user) and the rest (slab, where kmallocs over a page are counted too)."),
]

NOT_MEASURED = "not measured"


def read_kv(path):
    kv = OrderedDict()
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    kv[k] = v
    return kv


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def fmt(v):
    if v is None:
        return "-"
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 0.01:
        return f"{v:.3g}"
    return f"{v:.2e}"


def xkey(x):
    """Sort x values numerically where they are numbers, phases in time order."""
    order = {"before": 0, "during": 1, "after": 2, "-": -1}
    if x in order:
        return (0, order[x], "")
    n = num(x)
    return (1, n, "") if n is not None else (2, 0, x)


class Cell:
    def __init__(self):
        self.values = []
        self.failed = []
        self.not_measured = []

    def median(self):
        return statistics.median(self.values) if self.values else None

    def text(self):
        return self._text().replace("|", "/").replace("\t", " ")

    def _text(self):
        if self.values:
            s = fmt(self.median())
            if len(self.values) > 1:
                s += f" ({fmt(min(self.values))}-{fmt(max(self.values))}, n={len(self.values)})"
            if self.failed:
                s += f"; {len(self.failed)} failed"
            return s
        if self.not_measured:
            return f"{NOT_MEASURED}: {self.not_measured[0]}"
        if self.failed:
            return f"failed ({len(self.failed)}x): {self.failed[0][:80]}"
        return "-"


def load(raw):
    rows = []
    with open(os.path.join(raw, "samples.csv"), newline="") as f:
        for r in csv.DictReader(f):
            rows.append(r)
    return rows


def group(rows):
    """scenario -> (case, metric, unit) -> x -> transport -> Cell"""
    g = defaultdict(lambda: OrderedDict())
    for r in rows:
        if r["scenario"] == "cut_ts":
            continue
        key = (r["case"], r["metric"], r["unit"])
        table = g[r["scenario"]].setdefault(key, {})
        cell = table.setdefault(r["x"], {}).setdefault(r["transport"], Cell())
        if r["status"] == "ok" and num(r["value"]) is not None:
            cell.values.append(num(r["value"]))
        elif r["status"] == "not-measured":
            cell.not_measured.append(r["note"])
        else:
            cell.failed.append(r["note"] or "failed")
    return g


def ratio(a, b):
    ma, mb = a.median() if a else None, b.median() if b else None
    if ma is None or mb is None or mb == 0:
        return "-"
    return f"{ma / mb:.2f}"


def table_md(key, xs, xlabel):
    case, metric, unit = key
    out = [f"**{case}** - {metric} ({unit})", "",
           f"| {xlabel} | metaroce | rxe | TCP | metaroce/rxe | metaroce/TCP |",
           "|---|---|---|---|---|---|"]
    for x in sorted(xs, key=xkey):
        cells = xs[x]
        m, r, t = (cells.get(tr) for tr in TRANSPORTS)
        out.append(f"| {x} | " + " | ".join(c.text() if c else "-" for c in (m, r, t))
                   + f" | {ratio(m, r)} | {ratio(m, t)} |")
    return out


def headline(g):
    """A few points picked from the scenarios, one row each."""
    picks = [
        ("bw_size", "bw", "65536", "lossless 64 KiB write, Gb/s"),
        ("lat_size", "latency", "2", "lossless 2 B write latency, us (lower is better)"),
        ("loss", "bw", "1", "1% loss one-way, Gb/s"),
        ("loss", "bw", "10", "10% loss one-way, Gb/s"),
        ("reorder", "bw", "0", "reordering, no loss, Gb/s"),
        ("reorder", "retx", "0", "reordering, no loss, retransmissions (lower is better)"),
        ("reorder", "bw", "1", "reordering + 1% loss, Gb/s"),
        ("multipath", "bw", "5", "4 spines, spine 1 at 5% loss, Gb/s"),
        ("planes", "bw", None, "most planes, summed, Gb/s"),
        ("incast", "bw", None, "N-to-1 incast, summed goodput, Gb/s"),
        ("incast", "load", None, "N-to-1 incast, bottleneck load at the bridge (1 = line rate)"),
        ("conns", "bw", None, "N RC QPs at once, 4 KiB writes, summed, Gb/s"),
        ("conns", "scaling", None, "N RC QPs over 8 QPs, same writes (goal: at least 0.9)"),
        ("conns", "kmem_per_qp", None, "kernel memory per QP, KiB (lower is better)"),
        ("conns", "kmem_slab_per_qp", None, "kernel memory per QP beyond its rings, KiB (lower is better)"),
    ]
    out = ["| point | metaroce | rxe | TCP | metaroce/rxe | metaroce/TCP |", "|---|---|---|---|---|---|"]
    for scen, metric, x, label in picks:
        for key, xs in g.get(scen, {}).items():
            if key[1] != metric or (scen == "loss" and not key[0].startswith("one-way")):
                continue
            xx = x if x is not None else max(xs, key=xkey)
            if xx not in xs:
                continue
            cells = xs[xx]
            m, r, t = (cells.get(tr) for tr in TRANSPORTS)
            lab = label if x is not None else f"{label} (x={xx})"
            out.append(f"| {lab} | " + " | ".join(c.text() if c else "-" for c in (m, r, t))
                       + f" | {ratio(m, r)} | {ratio(m, t)} |")
            break
    return out


def plots(rows, g, env, out):
    """PNG plots; returns a list of (file, caption) or a reason they are missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (bench.sh installs it into a venv; see its output)"
    made = []
    colors = {"metaroce": "tab:red", "rxe": "tab:blue", "tcp": "tab:green"}

    def series(scen, metric, case_filter=None):
        for key, xs in g.get(scen, {}).items():
            if key[1] != metric or (case_filter and not case_filter(key[0])):
                continue
            for tr in TRANSPORTS:
                pts = [(num(x), xs[x][tr]) for x in xs if tr in xs[x] and num(x) is not None
                       and xs[x][tr].values]
                pts.sort(key=lambda p: p[0])
                if pts:
                    yield key[0], tr, pts

    def xy_plot(fname, title, scen, metric, xlabel, ylabel, logx=False, logy=True):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        styles = ["-", "--", ":", "-."]
        cases = []
        any_pts = False
        for case, tr, pts in series(scen, metric):
            if case not in cases:
                cases.append(case)
            if logy:  # a zero has no place on a log axis: left out (the tables have it)
                pts = [p for p in pts if p[1].median() > 0]
                if not pts:
                    continue
            xs = [p[0] for p in pts]
            med = [p[1].median() for p in pts]
            lo = [m - min(p[1].values) for m, p in zip(med, pts)]
            hi = [max(p[1].values) - m for m, p in zip(med, pts)]
            label = LABEL[tr] + (f" ({case})" if len({k[0] for k in g[scen] if k[1] == metric}) > 1 else "")
            ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, color=colors[tr],
                        linestyle=styles[cases.index(case) % len(styles)], label=label)
            any_pts = True
        if not any_pts:
            plt.close(fig)
            return
        if logx:
            ax.set_xscale("symlog" if scen == "loss" else "log", **({"linthresh": 0.1} if scen == "loss" else {}))
        if logy:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, fname), dpi=110)
        plt.close(fig)
        made.append((fname, title + (" (log scale: zero medians left out)" if logy else "")))

    xy_plot("loss.png", "Throughput against loss rate", "loss", "bw", "loss (%)", "Gb/s", logx=True)
    xy_plot("bw_size.png", "Throughput against message size (lossless)", "bw_size", "bw",
            "message size (B)", "Gb/s", logx=True)
    xy_plot("lat_size.png", "Latency against message size (lossless)", "lat_size", "latency",
            "message size (B)", "us", logx=True)
    xy_plot("planes.png", "Plane scaling (rate-limited planes, summed)", "planes", "bw", "planes", "Gb/s",
            logy=False)

    ts = defaultdict(list)
    events = defaultdict(list)
    for r in rows:
        if r["scenario"] != "cut_ts" or num(r["value"]) is None:
            continue
        if r["metric"] == "event":
            events[r["case"]].append((r["transport"], num(r["value"])))
        else:
            ts[(r["case"], r["transport"], r["rep"])].append((num(r["x"]), num(r["value"])))
    cases = sorted({k[0] for k in ts})
    if cases:
        fig, axes = plt.subplots(len(cases), 1, figsize=(7, 3.2 * len(cases)), squeeze=False)
        for ax, case in zip(axes[:, 0], cases):
            for (c, tr, rep), pts in sorted(ts.items()):
                if c != case:
                    continue
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[tr], alpha=0.8,
                        label=f"{LABEL[tr]}" + (f" rep {rep}" if rep != "1" else ""))
            for tr, t in events.get(case, []):
                ax.axvline(t, color=colors[tr], linestyle="--", alpha=0.5)
            ax.set_title("\n".join(textwrap.wrap(case, 90)), fontsize=8)
            ax.set_xlabel("s since traffic started")
            ax.set_ylabel("received Mb/s")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "cut.png"), dpi=110)
        plt.close(fig)
        made.append(("cut.png", "Throughput around a cut (dashed: cut and restore, per transport)"))
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", required=True, help="the guest's output directory (samples.csv, env.txt)")
    ap.add_argument("--out", required=True, help="where report.md, samples.csv and the PNGs go")
    ap.add_argument("--check", action="store_true", help="fail unless every scenario has its table")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if not os.path.exists(os.path.join(a.raw, "samples.csv")):
        print(f"report: no samples.csv in {a.raw}", file=sys.stderr)
        return 1
    rows = load(a.raw)
    env = read_kv(os.path.join(a.raw, "env.txt"))
    host = read_kv(os.path.join(a.raw, "host-env.txt"))
    if os.path.abspath(a.raw) != os.path.abspath(a.out):
        shutil.copy(os.path.join(a.raw, "samples.csv"), os.path.join(a.out, "samples.csv"))
    g = group(rows)
    made = plots(rows, g, env, a.out)

    md = [f"# metaroce benchmark ({env.get('profile', '?')} profile)", "",
          "metaroce, rxe (the kernel's soft-RoCE) and kernel TCP in one guest boot, on the same kernel and "
          "the same topology, with stock tools (perftest, qperf, iperf3). Each cell: median "
          "(min-max, n=repetitions). Under QEMU TCG absolute numbers are small and depend on the host's "
          "load; compare the ratios within this run, not absolutes across runs. A 0 is what the tool "
          "reported: nothing completed within its measurement window (perftest leaves a quarter of the "
          "run out at each end). Failed runs keep their client and server output in raw/logs/.", "",
          "## Environment", "", "| | |", "|---|---|"]
    for k, v in list(host.items()) + list(env.items()):
        md.append(f"| {k} | {v} |")
    md += ["", "## Headline", ""] + headline(g) + [""]
    problems = []
    for name, title, xlabel, what in SCENARIOS:
        md += [f"## {title} (`{name}`)", "", what, ""]
        tables = g.get(name, {})
        if not tables:
            md += [f"{NOT_MEASURED}: the run recorded no sample for this scenario", ""]
            problems.append(f"{name}: no samples")
            continue
        # The check asks for a number from metaroce in every scenario: a scenario whose
        # metaroce runs all failed, or were all "not measured", has measured nothing of ours.
        measured = False
        for key, xs in tables.items():
            md += table_md(key, xs, xlabel) + [""]
            for cells in xs.values():
                c = cells.get("metaroce")
                measured = measured or bool(c and c.values)
        if not measured:
            problems.append(f"{name}: no metaroce run measured anything")
    md += ["## Plots", ""]
    if isinstance(made, str):
        md += [f"No plots: {made}.", ""]
    else:
        md += [f"![{cap}]({f})" for f, cap in made] + [""]
    fails = sum(1 for r in rows if r["status"] == "failed")
    md += ["## Raw data", "", f"`samples.csv`: {len(rows)} samples ({fails} failed runs), one line per tool run "
           "(scenario, case, x, transport, metric, unit, repetition, value, status, note); `cut_ts` rows are the "
           "time series behind cut.png.", ""]
    trouble = os.path.join(a.raw, "kernel-trouble.txt")
    if os.path.exists(trouble) and os.path.getsize(trouble) > 0:
        md += ["## Kernel log trouble during the run", "", "```"] + open(trouble).read().splitlines() + ["```", ""]
        problems.append("kernel log trouble (see the report)")
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(md))
    print(f"report: {os.path.join(a.out, 'report.md')} ({len(rows)} samples, {fails} failed)")
    if a.check:
        if problems:
            for p in problems:
                print(f"report check: {p}", file=sys.stderr)
            return 1
        print("report check: every scenario has its table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
