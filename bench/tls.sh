#!/usr/bin/env bash
# Seed 004's experiment in one command: TLS handshake cost and sessions under overload for
# warden (with and without handshake admission control) beside nginx. CSV and plots under
# bench/out/. Extra flags go to `warden-bench tls` (for example --overload-seconds 10).
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib.sh
need_packages nginx:nginx-light openssl:openssl
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet matplotlib

cargo build --release --locked -p warden -p warden-bench
# `--providers`: also a warden built with ring instead of aws-lc-rs (the default), whose
# handshake cost is measured in the same run (issue 21); the other flags go to warden-bench.
ALSO=()
if [ "${1:-}" = "--providers" ]; then
  shift
  cargo build --release --locked -p warden --no-default-features --target-dir target/ring
  ALSO=(--also-warden ring=target/ring/release/warden)
fi
mkdir -p bench/out
# Thousands of emulated clients, each with a socket: raise the soft limit to the hard limit.
ulimit -n "$(ulimit -Hn)" || true
# Both servers ask for a listen backlog of 65,535, which the kernel caps at net.core.somaxconn.
# At 4096 (the default) a flood of new clients overflows it, and a dropped SYN is retried only
# after a second, past the client timeout: a timeout where a refusal was due.
if [ "$(sysctl -n net.core.somaxconn)" -lt 65535 ]; then
  as_root sysctl -q -w net.core.somaxconn=65535 ||
    echo "warning: could not raise net.core.somaxconn; overload runs will show SYN drops as timeouts" >&2
fi
target/release/warden-bench tls --warden target/release/warden --out bench/out "${ALSO[@]}" "$@"
python3 bench/plot_tls.py bench/out/tls-handshakes.csv bench/out/tls-overload.csv bench/out/tls.png
