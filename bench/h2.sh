#!/usr/bin/env bash
# Issue 21's HTTP/2 figures in one command: h2load (Debian's nghttp2-client) against warden
# and nginx (http2 on, keepalive_requests raised) over TLS and h2c, and warden's HTTP/1.1 lane
# over TLS with the same connection count. Extra flags go to bench/h2.py (--seconds, --runs,
# --connections, --streams, --warden-arg).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_packages nginx:nginx-light h2load:nghttp2-client openssl:openssl
cargo build --release --locked -p warden
mkdir -p bench/out
ulimit -n "$(ulimit -Hn)" || true
python3 bench/h2.py --warden target/release/warden --out bench/out "$@"
