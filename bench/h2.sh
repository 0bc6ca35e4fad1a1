#!/usr/bin/env bash
# Issue 21's HTTP/2 figures in one command: h2load (Debian's nghttp2-client) against warden
# and nginx (http2 on, keepalive_requests raised) over TLS and h2c, and warden's HTTP/1.1 lane
# over TLS with the same connection count. Extra flags go to bench/h2.py (--seconds, --runs,
# --connections, --streams, --warden-arg).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y "${need[@]}"
fi
cargo build --release --locked -p warden
mkdir -p bench/out
ulimit -n "$(ulimit -Hn)" || true
python3 bench/h2.py --warden target/release/warden --out bench/out "$@"
