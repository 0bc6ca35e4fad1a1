#!/usr/bin/env bash
# Seed 003 §6.2 in one command: 10 kill -9s of agent nodes under load, warden (3-member etcd,
# a gateway node, four agent nodes) beside nginx + proxy_next_upstream over the same 12 demo-app
# processes; a second warden run also kills an etcd member. CSV, plot and a markdown table under
# bench/out/. Extra flags go to bench/heal.py (for example --kills 3 --runs warden-kills).
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib.sh
need_packages nginx:nginx-light etcd:etcd-server wrk:wrk
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet matplotlib

cargo build --release --locked -p warden
mkdir -p bench/out
ulimit -n "$(ulimit -Hn)" || true
python3 bench/heal.py --warden target/release/warden --out bench/out "$@"
echo "wrote bench/out/heal.md, heal.csv, heal-kills.csv and heal.png"
