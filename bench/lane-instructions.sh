#!/usr/bin/env bash
# Instructions warden's user space spends per request forwarded on the HTTP/1.1 lane, counted by
# callgrind: repeatable for the same binary and load whatever else the machine does, unlike
# req/s. The count is the whole process's while the load runs (agent and store included, a
# small share on an idle platform), divided by the requests. warden runs under valgrind (the demo app it starts does not), is warmed up with one
# request and 3 s of load, and counts only during 10 s of wrk with 10 connections and valid
# Basic credentials. Prints requests, instructions and instructions per request; the profile
# is left in bench/out/lane.callgrind for callgrind_annotate.
# Note: valgrind runs SHA-256 in software where the machine would use SHA-NI, so SHA-256 weighs
# more here than it does natively.
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib.sh
need_packages valgrind:valgrind wrk:wrk
# WARDEN=path counts that binary instead of building this tree's.
if [ -z "${WARDEN:-}" ]; then
  cargo build --release --locked -p warden
  WARDEN=target/release/warden
fi
mkdir -p bench/out
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
api=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/cg.out" \
  "$WARDEN" up --data-dir "$work/data" --listen "127.0.0.1:$port" \
  --api-listen "127.0.0.1:$api" --demo >"$work/warden.log" 2>&1 &
vg=$!
trap 'kill $vg 2>/dev/null || true; wait $vg 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 120); do
  # The demo's users are written after the gateway answers.
  [ -s "$work/data/demo-users.json" ] && curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break
  sleep 1
done
password=$(python3 -c "import json,sys; print(next(u['password'] for u in json.load(open(sys.argv[1])) if u['name']=='alice'))" "$work/data/demo-users.json")
auth="Authorization: Basic $(printf 'alice:%s' "$password" | base64 -w0)"
url="http://127.0.0.1:$port/apps/demo/"
curl -s -o /dev/null -H "$auth" "$url"
wrk -t1 -c10 -d3s -H "$auth" "$url" >/dev/null
callgrind_control -i on "$vg" >/dev/null 2>&1
requests=$(wrk -t1 -c10 -d10s -H "$auth" "$url" | awk '/requests in/ {print $1}')
callgrind_control -i off "$vg" >/dev/null 2>&1
callgrind_control -d "$vg" >/dev/null 2>&1
sleep 1
profile=$(ls -S "$work"/cg.out* | head -n 1)
cp "$profile" bench/out/lane.callgrind
total=$(callgrind_annotate bench/out/lane.callgrind 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "requests $requests, instructions $total, per request $((total / requests))"
