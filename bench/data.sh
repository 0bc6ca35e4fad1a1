#!/usr/bin/env bash
# Issue 34's connection figures in one command: pgbench select-only (-S) and TPC-B-like, each
# with connections held for the run and with -C (a new connection per transaction), direct to
# PostgreSQL (SCRAM per connection), through pgbouncer (session mode, DISCARD ALL between
# clients, as warden) and through warden's data proxy (crates/data/examples/proxy.rs), in one
# run on one PostgreSQL. Writes bench/out/data.md.
# Knobs: SECONDS_PER_RUN (10), CLIENTS (8), SCALE (10), PROXY_MAX_IDLE (32, the proxy's
# default idle server connections per role; pgbouncer here keeps up to 50).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need_packages pgbouncer:pgbouncer
PGBIN=/usr/lib/postgresql/15/bin
[ -x "$PGBIN/postgres" ] || install_packages postgresql
cargo build --release --locked -p warden-data --example proxy
PROXY="${CARGO_TARGET_DIR:-target}/release/examples/proxy"

RUN_SECONDS=${SECONDS_PER_RUN:-10}
CLIENTS=${CLIENTS:-8}
SCALE=${SCALE:-10}
PASSWORD="bench-password-$RANDOM$RANDOM"
work=$(mktemp -d /tmp/warden-data-bench.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/pg" "$work/bouncer" "$work/warden" bench/out

# PostgreSQL and pgbouncer refuse root: run them as postgres when root.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
[ "$(id -u)" -eq 0 ] && chown -R postgres: "$work/pg" "$work/bouncer"

cleanup() {
  [ -n "${proxy_pid:-}" ] && kill "$proxy_pid" 2>/dev/null || true
  [ -f "$work/bouncer/pid" ] && kill "$(cat "$work/bouncer/pid")" 2>/dev/null || true
  as_pg "$PGBIN/pg_ctl" stop -m fast -D "$work/pg/data" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "$PASSWORD" > "$work/pg/pw"
[ "$(id -u)" -eq 0 ] && chown postgres: "$work/pg/pw"
as_pg "$PGBIN/initdb" -D "$work/pg/data" -U postgres --auth=scram-sha-256 --pwfile="$work/pg/pw" -N >/dev/null
as_pg "$PGBIN/pg_ctl" start -w -D "$work/pg/data" -l "$work/pg/log" \
  -o "-k $work/pg -c listen_addresses='' -c max_connections=200 -c shared_buffers=256MB" >/dev/null
export PGPASSWORD="$PASSWORD"
psql -X -q -h "$work/pg" -U postgres -d postgres \
  -c "CREATE ROLE bench LOGIN PASSWORD '$PASSWORD'" -c "CREATE DATABASE bench OWNER bench"
pgbench -i -q -s "$SCALE" -h "$work/pg" -U bench bench >/dev/null 2>&1

# pgbouncer: clients in without a password (as through warden's socket), SCRAM to the server.
cat > "$work/bouncer/pgbouncer.ini" <<EOF
[databases]
bench = host=$work/pg port=5432 dbname=bench user=bench
[pgbouncer]
listen_addr =
unix_socket_dir = $work/bouncer
listen_port = 6432
auth_type = trust
auth_file = $work/bouncer/users.txt
pool_mode = session
server_reset_query = DISCARD ALL
max_client_conn = 500
default_pool_size = 50
logfile = $work/bouncer/log
pidfile = $work/bouncer/pid
EOF
echo "\"bench\" \"$PASSWORD\"" > "$work/bouncer/users.txt"
[ "$(id -u)" -eq 0 ] && chown -R postgres: "$work/bouncer"
as_pg pgbouncer -d "$work/bouncer/pgbouncer.ini"

WARDEN_PROXY_MAX_IDLE="${PROXY_MAX_IDLE:-32}" WARDEN_PROXY_PASSWORD="$PASSWORD" "$PROXY" "$work/warden/.s.PGSQL.5432" "$work/pg" bench bench 500 2>/dev/null &
proxy_pid=$!
sleep 1
unset PGPASSWORD

# run DIR PORT PASSWORD ARGS...: one pgbench run; prints "tps connection-ms".
run() {
  local dir=$1 port=$2 pw=$3; shift 3
  local out tps conn
  out=$(PGPASSWORD="$pw" pgbench -n -T "$RUN_SECONDS" -c "$CLIENTS" -j 2 -h "$dir" -p "$port" -U bench "$@" bench 2>&1)
  tps=$(sed -n 's/^tps = \([0-9]*\).*/\1/p' <<<"$out" | head -1)
  conn=$(sed -n 's/.*connection time = \([0-9.]*\) ms.*/\1/p' <<<"$out" | head -1)
  echo "${tps:-0} ${conn:--}"
}

# median N...: the middle value (the lower middle of an even count).
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }

ROUNDS=${ROUNDS:-3}
{
  echo "pgbench, $CLIENTS clients, -j 2, $RUN_SECONDS s per run, scale $SCALE, $ROUNDS rounds"
  echo "interleaved (direct, pgbouncer, warden in turn); $(nproc) cores,"
  echo "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); $(date -u +%F)."
  echo "Connection time is pgbench's: with -C the average per new connection, else the initial"
  echo "connection of every client."
  echo
  echo "| pgbench flags | path | tps, median (each round) | connection time ms, median (each round) |"
  echo "|---|---|---|---|"
  for flags in "-S" "-S -C" "" "-C"; do
    declare -A tps=() conn=()
    for _ in $(seq "$ROUNDS"); do
      for path in direct pgbouncer warden; do
        case $path in
          direct) args=("$work/pg" 5432 "$PASSWORD") ;;
          pgbouncer) args=("$work/bouncer" 6432 "") ;;
          warden) args=("$work/warden" 5432 "") ;;
        esac
        # shellcheck disable=SC2086
        read -r t c < <(run "${args[@]}" $flags)
        tps[$path]+="$t "
        conn[$path]+="$c "
      done
    done
    for path in direct pgbouncer warden; do
      # shellcheck disable=SC2086
      printf '| %s | %s | %s (%s) | %s (%s) |\n' "${flags:-TPC-B}" "$path" \
        "$(median ${tps[$path]})" "${tps[$path]% }" "$(median ${conn[$path]})" "${conn[$path]% }"
    done
    unset tps conn
  done
} | tee bench/out/data.md
