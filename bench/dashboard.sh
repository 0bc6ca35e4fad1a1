#!/usr/bin/env bash
# Issue 37's render figure in one command: the dashboard's overview (GET /ui/, signed in) of a
# cluster with 100 apps and 1,000 instances, beside GET /v1/status of the same store in the
# same run (the same data as JSON). Needs etcd (Debian: etcd-server, etcd-client). Bounded: 50
# requests of each by default (--requests N). Writes bench/out/dashboard.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_packages etcd:etcd-server
cargo build --release --locked -p warden
mkdir -p bench/out
python3 bench/dashboard.py --warden target/release/warden --out bench/out "$@"
