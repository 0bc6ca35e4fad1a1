#!/usr/bin/env python3
"""Markdown tables of bench/out/gateway.csv, as docs/BENCHMARKS.md shows them.

Per workload: requests per second of warden, nginx, haproxy and the floor (a relay doing no
HTTP work), warden and the floor each divided by the better peer, mean latency, and the proxy's
own CPU time per request. Then a summary over connection counts per workload, and over all
cells.
Usage: python3 bench/report_gateway.py [CSV]
"""
import csv
import statistics
import sys
from collections import defaultdict

src = sys.argv[1] if len(sys.argv) > 1 else "bench/out/gateway.csv"
PEERS = ("nginx", "haproxy")
SERVERS = ("warden", "nginx", "haproxy", "floor")
TITLES = {
    "auth-valid": "100% valid Basic credentials",
    "auth-invalid": "100% invalid",
    "auth-mixed": "89% valid / 11% invalid",
    "authz-admin": "admin session cookie, 200",
    "authz-user": "non-admin session cookie, 403",
}

cells = defaultdict(dict)
workloads = []
with open(src, newline="") as f:
    for r in csv.DictReader(f):
        w = r["workload"]
        if w not in workloads:
            workloads.append(w)
        cells[(w, int(r["connections"]))][r["server"]] = {
            "rps": float(r["requests_per_sec"]),
            "ms": float(r["mean_latency_ms"]),
            "cpu": float(r["proxy_user_us"]) + float(r["proxy_system_us"]),
        }


def spread(xs):
    return f"{min(xs):.2f}, {statistics.median(xs):.2f}, {max(xs):.2f}"


summary = []
all_ratio, all_floor, all_cpu = [], [], []
for w in workloads:
    conns = sorted(c for (ww, c) in cells if ww == w)
    print(f"**{w}** ({TITLES.get(w, w)}):\n")
    print(
        "| connections | warden | nginx | haproxy | floor | warden ÷ best peer "
        "| floor ÷ best peer | mean latency ms w / n / h / f | proxy CPU µs/req w / n / h / f |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ratios, floors, cpus = [], [], []
    for c in conns:
        row = cells[(w, c)]
        if not all(s in row for s in SERVERS):
            continue
        best = max(row[p]["rps"] for p in PEERS)
        cheaper = min(row[p]["cpu"] for p in PEERS)
        ratio, floor = row["warden"]["rps"] / best, row["floor"]["rps"] / best
        ratios.append(ratio)
        floors.append(floor)
        cpus.append(row["warden"]["cpu"] / cheaper)
        rps = " | ".join(f"{row[s]['rps']:,.0f}" for s in SERVERS)
        ms = " / ".join(f"{row[s]['ms']:.1f}" for s in SERVERS)
        cpu = " / ".join(f"{row[s]['cpu']:.1f}" for s in SERVERS)
        print(f"| {c} | {rps} | {ratio:.2f} | {floor:.2f} | {ms} | {cpu} |")
    print()
    if ratios:
        summary.append((w, spread(ratios), spread(floors), spread(cpus)))
        all_ratio += ratios
        all_floor += floors
        all_cpu += cpus

print(
    "| workload | warden ÷ better peer, req/s | floor ÷ better peer, req/s "
    "| warden ÷ cheaper peer, proxy CPU per request |"
)
print("|---|---|---|---|")
for w, r, f, c in summary:
    print(f"| {w} | {r} | {f} | {c} |")
print()
if all_ratio:
    n = len(all_ratio)
    print(
        f"Over all {n} cells (lowest, median, highest): warden ÷ better peer {spread(all_ratio)}; "
        f"floor ÷ better peer {spread(all_floor)}; "
        f"cells where warden reaches 1.2x the better peer: {sum(r >= 1.2 for r in all_ratio)}; "
        f"where the floor does: {sum(f >= 1.2 for f in all_floor)}; "
        f"where warden is at or above the better peer: {sum(r >= 1.0 for r in all_ratio)}."
    )
