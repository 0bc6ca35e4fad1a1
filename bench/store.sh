#!/usr/bin/env bash
# Seed 003 §6.1 in one command: put/get/delete turns against warden's API on its embedded store
# and on a 3-member etcd, beside etcd itself, Redis (appendfsync always), PostgreSQL and SQLite,
# each operation on a new connection and on persistent ones; CSV, plot and a markdown table
# under bench/out/. Extra flags go to bench/store.py (for example --turns 300 --rounds 1).
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib.sh
need_packages redis-server:redis-server nginx:nginx-light etcd:etcd-server
# Debian keeps postgres off PATH.
[ -x /usr/lib/postgresql/15/bin/postgres ] || need_packages postgres:postgresql
# Debian keeps PostgreSQL's programs out of PATH.
for d in /usr/lib/postgresql/*/bin; do PATH="$PATH:$d"; done
export PATH
python3 -c 'import psycopg2' 2>/dev/null || python3 -m pip install --quiet psycopg2-binary
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet matplotlib

cargo build --release --locked -p warden
mkdir -p bench/out
ulimit -n "$(ulimit -Hn)" || true
python3 bench/store.py --warden target/release/warden --out bench/out "$@"
echo "wrote bench/out/store.md"
