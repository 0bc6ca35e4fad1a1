#!/usr/bin/env python3
"""The audit trail's cost from one `warden-bench gateway --audit-off-too` run.

Reads bench/out/gateway-rounds.csv (every round of every cell) and prints, per workload and
connection count, warden with its audit log (`warden`) against the same binary with `--audit
off` (`warden-audit-off`), both measured back to back in each round: the req/s ratio on ÷ off
and the CPU per request ratio on ÷ off of each round, then their medians.
Usage: python3 bench/report_audit.py [ROUNDS_CSV]
"""
import csv
import statistics
import sys
from collections import defaultdict

src = sys.argv[1] if len(sys.argv) > 1 else "bench/out/gateway-rounds.csv"
ON, OFF = "warden", "warden-audit-off"

runs = defaultdict(dict)
order = []
with open(src, newline="") as f:
    for r in csv.DictReader(f):
        key = (r["workload"], int(r["connections"]))
        if key not in order:
            order.append(key)
        runs[key + (int(r["round"]),)][r["server"]] = (
            float(r["requests_per_sec"]),
            float(r["proxy_user_us"]) + float(r["proxy_system_us"]),
        )

print("| workload | connections | req/s on ÷ off, per round | median | CPU µs/req on ÷ off, per round | median |")
print("|---|---|---|---|---|---|")
all_rps, all_cpu = [], []
for w, c in order:
    rps, cpu = [], []
    for (ww, cc, _), row in sorted(runs.items()):
        if (ww, cc) != (w, c) or ON not in row or OFF not in row:
            continue
        rps.append(row[ON][0] / row[OFF][0])
        cpu.append(row[ON][1] / row[OFF][1])
    if not rps:
        continue
    all_rps.append(statistics.median(rps))
    all_cpu.append(statistics.median(cpu))
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
    print(f"| {w} | {c} | {fmt(rps)} | {statistics.median(rps):.3f} | {fmt(cpu)} | {statistics.median(cpu):.3f} |")
if all_rps:
    print(f"\nOver all cells: req/s on ÷ off median {statistics.median(all_rps):.3f} "
          f"(min {min(all_rps):.3f}); CPU on ÷ off median {statistics.median(all_cpu):.3f} "
          f"(max {max(all_cpu):.3f}).")
