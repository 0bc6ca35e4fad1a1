#!/usr/bin/env bash
# Issue 39, aim 1, in one command: the same wrk load (alice's valid Basic credentials) through a
# gateway-only node to the demo instance on an agent node (node port, mutual TLS), through the
# agent node's own gateway (local), and through nginx proxying to an upstream nginx over mutual
# TLS and over plain HTTP (keep-alive upstreams); req/s, p50/p99 and each server's CPU per
# request, and the ratios cross/local and cross/nginx-mTLS, under bench/out/cluster-path.md.
# WARDEN=path runs that binary (warden-instance beside it) instead of building this tree's.
# Extra flags go to bench/cluster_path.py (--seconds, --connections 50,10, --runs, --pin).
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib.sh
need_packages wrk:wrk nginx:nginx-light etcd:etcd-server openssl:openssl
if [ -z "${WARDEN:-}" ]; then
  cargo build --release --locked -p warden
  WARDEN=target/release/warden
fi
mkdir -p bench/out
ulimit -n "$(ulimit -Hn)" || true
python3 bench/cluster_path.py --warden "$WARDEN" --out bench/out "$@"
echo "wrote bench/out/cluster-path.md and cluster-path.csv"
