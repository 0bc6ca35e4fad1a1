#!/usr/bin/env python3
"""Plot bench/out/gateway.csv like seed 001's Figures 2-5.

One row per workload: throughput (requests/s), mean latency (ms) and, when the CSV has it, the
proxy's own CPU time per request (us), against the number of wrk connections on a log axis,
one line per server. The floor (a relay doing no HTTP work, measured in the same run) is drawn
dashed: no proxy can pass it.
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
with_cpu = False
with open(src, newline="") as f:
    for r in csv.DictReader(f):
        cpu = None
        if r.get("proxy_user_us"):
            with_cpu = True
            cpu = float(r["proxy_user_us"]) + float(r["proxy_system_us"])
        w, s = r["workload"], r["server"]
        if w not in workloads:
            workloads.append(w)
        if s not in servers:
            servers.append(s)
        rows[w][s].append(
            (
                int(r["connections"]),
                float(r["requests_per_sec"]),
                float(r["mean_latency_ms"]),
                cpu,
            )
        )

cols = 3 if with_cpu else 2
fig, axes = plt.subplots(
    len(workloads), cols, figsize=(5.5 * cols, 3.2 * len(workloads)), squeeze=False
)
for i, w in enumerate(workloads):
    for s in servers:
        pts = sorted(rows[w][s])
        if not pts:
            continue
        xs = [p[0] for p in pts]
        style = (
            dict(linestyle="--", color="grey", marker=".", label="floor (no HTTP work)")
            if s == "floor"
            else dict(marker="o", label=s)
        )
        axes[i][0].plot(xs, [p[1] / 1000 for p in pts], **style)
        axes[i][1].plot(xs, [p[2] for p in pts], **style)
        if with_cpu:
            axes[i][2].plot(xs, [p[3] for p in pts], **style)
    axes[i][0].set_title(f"{w}: throughput")
    axes[i][0].set_ylabel("thousand requests/s")
    axes[i][1].set_title(f"{w}: mean latency")
    axes[i][1].set_ylabel("ms")
    if with_cpu:
        axes[i][2].set_title(f"{w}: proxy CPU per request")
        axes[i][2].set_ylabel("us (user + kernel)")
    for ax in axes[i]:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("connections")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes[i]:
        ax.set_ylim(bottom=0)
fig.tight_layout()
fig.savefig(dst, dpi=90)
print(f"wrote {dst}")
