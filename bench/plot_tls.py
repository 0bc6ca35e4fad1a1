#!/usr/bin/env python3
"""Plot the TLS benchmark like seed 004's Figures 4, 6 and 7.

Top left: handshake cost (connections/s) per certificate, TLS version and handshake kind, one
bar per server. Then, against the number of emulated clients: replies per second (Figure 4),
the share of full handshakes among all handshakes (Figure 6), and client timeouts (Figure 7),
one line per server.
Usage: python3 bench/plot_tls.py [HANDSHAKES_CSV] [OVERLOAD_CSV] [PNG]
"""
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

hs = sys.argv[1] if len(sys.argv) > 1 else "bench/out/tls-handshakes.csv"
ov = sys.argv[2] if len(sys.argv) > 2 else "bench/out/tls-overload.csv"
dst = sys.argv[3] if len(sys.argv) > 3 else "bench/out/tls.png"

fig, axes = plt.subplots(2, 2, figsize=(13, 9))
ax = axes[0][0]
rates = defaultdict(dict)
with open(hs, newline="") as f:
    for r in csv.DictReader(f):
        key = f"{r['cert']} {r['tls']}\n{r['handshake']}"
        rates[r["server"]][key] = float(r["connections_per_sec"])
keys = list(next(iter(rates.values())).keys()) if rates else []
width = 0.8 / max(len(rates), 1)
for i, (server, by_key) in enumerate(rates.items()):
    xs = [k + i * width for k in range(len(keys))]
    ax.bar(xs, [by_key.get(k, 0) for k in keys], width, label=server)
ax.set_xticks([k + width * (len(rates) - 1) / 2 for k in range(len(keys))])
ax.set_xticklabels(keys, fontsize=7)
ax.set_yscale("log")
ax.set_ylabel("connections/s (handshake + 1 request)")
ax.set_title("Handshake cost")
ax.legend()

series = defaultdict(list)
if os.path.exists(ov):
    with open(ov, newline="") as f:
        for r in csv.DictReader(f):
            # The refusal floor serves no session: its figures are in the CSV, not the plots.
            if r["server"] == "refuse-all":
                continue
            full, resumed = int(r["full_handshakes"]), int(r["resumed_handshakes"])
            series[r["server"]].append(
                (
                    int(r["clients"]),
                    float(r["replies_per_sec"]),
                    full / max(full + resumed, 1) * 100,
                    int(r["timeouts"]),
                )
            )
for col, (ax, title, ylabel) in enumerate(
    [
        (axes[0][1], "Throughput (seed Fig. 4)", "replies/s"),
        (axes[1][0], "Full handshakes (seed Fig. 6)", "% of handshakes that are full"),
        (axes[1][1], "Client timeouts (seed Fig. 7)", "timeouts in the measured window"),
    ]
):
    for server, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[col + 1] for p in pts], marker="o", label=server)
    ax.set_xlabel("emulated clients")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
fig.tight_layout()
fig.savefig(dst, dpi=110)
print(f"wrote {dst}")
