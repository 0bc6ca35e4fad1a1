#!/usr/bin/env bash
# Seed 001's experiment in one command: warden, nginx and haproxy in front of one upstream,
# wrk at 50..3200 connections, with a relay that does no HTTP work as the floor; CSV, plot and
# markdown tables under bench/out/.
# Extra flags go to `warden-bench gateway` (for example --seconds 10 --connections 50,400).
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib.sh
need_packages wrk:wrk nginx:nginx-light haproxy:haproxy
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet matplotlib

cargo build --release --locked -p warden -p warden-bench
mkdir -p bench/out
# Many connections per run: raise the soft limit as far as the hard limit allows.
ulimit -n "$(ulimit -Hn)" || true
target/release/warden-bench gateway --warden target/release/warden --out bench/out "$@"
python3 bench/plot_gateway.py bench/out/gateway.csv bench/out/gateway.png
python3 bench/report_gateway.py bench/out/gateway.csv > bench/out/gateway.md
echo "wrote bench/out/gateway.md"
# With --audit-off-too: what the audit trail costs, per cell and round.
if grep -q '^[0-9]*,[^,]*,warden-audit-off,' bench/out/gateway-rounds.csv 2>/dev/null; then
  python3 bench/report_audit.py bench/out/gateway-rounds.csv > bench/out/audit.md
  echo "wrote bench/out/audit.md"
fi
