#!/usr/bin/env python3
"""Plot bench/out/gateway.csv like seed 001's Figures 2-5.

One row per workload; left column throughput (requests/s), right column mean latency (ms),
both against the number of wrk connections on a log axis, one line per server.
Usage: python3 bench/plot_gateway.py [CSV] [PNG]
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src = sys.argv[1] if len(sys.argv) > 1 else "bench/out/gateway.csv"
dst = sys.argv[2] if len(sys.argv) > 2 else "bench/out/gateway.png"

rows = defaultdict(lambda: defaultdict(list))
workloads, servers = [], []
with open(src, newline="") as f:
    for r in csv.DictReader(f):
        w, s = r["workload"], r["server"]
        if w not in workloads:
            workloads.append(w)
        if s not in servers:
            servers.append(s)
        rows[w][s].append(
            (int(r["connections"]), float(r["requests_per_sec"]), float(r["mean_latency_ms"]))
        )

fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.2 * len(workloads)), squeeze=False)
for i, w in enumerate(workloads):
    for s in servers:
        pts = sorted(rows[w][s])
        if not pts:
            continue
        xs = [p[0] for p in pts]
        axes[i][0].plot(xs, [p[1] / 1000 for p in pts], marker="o", label=s)
        axes[i][1].plot(xs, [p[2] for p in pts], marker="o", label=s)
    axes[i][0].set_title(f"{w}: throughput")
    axes[i][0].set_ylabel("thousand requests/s")
    axes[i][1].set_title(f"{w}: mean latency")
    axes[i][1].set_ylabel("ms")
    for ax in axes[i]:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("connections")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[i][0].set_ylim(bottom=0)
    axes[i][1].set_ylim(bottom=0)
fig.tight_layout()
fig.savefig(dst, dpi=90)
print(f"wrote {dst}")
