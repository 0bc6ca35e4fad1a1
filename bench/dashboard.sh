#!/usr/bin/env bash
# The dashboard's overview render time with 100 apps and 1,000 instances in the store, beside
# GET /v1/status of the same store (the floor), through HTTP to the release binary; medians of
# 31 turns each. Extra flags go to bench/dashboard.py (for example -n 101).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p warden
python3 bench/dashboard.py --warden "${CARGO_TARGET_DIR:-target}/release/warden" "$@"
