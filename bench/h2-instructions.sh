#!/usr/bin/env bash
# Instructions per request through warden's HTTP/2 path beside nginx's, counted by callgrind
# (repeatable within about 0.5% where req/s moves 10-25% on this machine). See
# bench/h2_instructions.py for what is counted. Extra flags go to it (--requests).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_packages valgrind:valgrind nginx:nginx-light h2load:nghttp2-client openssl:openssl
cargo build --release --locked -p warden
mkdir -p bench/out
python3 bench/h2_instructions.py --warden target/release/warden --out bench/out "$@"
