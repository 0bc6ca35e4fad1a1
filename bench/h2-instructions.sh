#!/usr/bin/env bash
# Instructions per request through warden's HTTP/2 path beside nginx's, counted by callgrind
# (repeatable within about 0.5% where req/s moves 10-25% on this machine). See
# bench/h2_instructions.py for what is counted. Extra flags go to it (--requests).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v valgrind >/dev/null || need+=(valgrind)
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
python3 bench/h2_instructions.py --warden target/release/warden --out bench/out "$@"
