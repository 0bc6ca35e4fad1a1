#!/usr/bin/env bash
# How soon a sandbox's init tells the agent that a Python app listens: `warden up --demo`, an
# app running Python's http.server with a lifetime of one request (so every request is a JIT
# start in a new sandbox), N requests through the gateway under `perf record` on the app's
# `listen` and init's `sendmsg` (its word to the agent), and the median and mean of the time
# between them. Needs perf and root (system-wide tracepoints).
#   WARDEN=DIR/warden bash bench/listen-word.sh [N]   (default 30; without WARDEN= it builds)
# DELAY=S makes the app wait S seconds before it listens (a long start: heavy imports).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-30}
if [ -z "${WARDEN:-}" ]; then
  cargo build --release --locked -p warden
  WARDEN=target/release/warden
fi
work=$(mktemp -d /tmp/listen-word.XXXXXX)
chmod 755 "$work"
cat > "$work/app.py" <<'EOF'
import http.server, os, time
time.sleep(float(os.environ.get("DELAY", "0")))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("content-length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
EOF
chmod 644 "$work/app.py"
WARDEN_LOG=warn "$WARDEN" up --data-dir "$work/data" --listen 127.0.0.1:0 --api-listen 127.0.0.1:0 \
  --tls-listen 127.0.0.1:0 --demo > "$work/out.log" 2>&1 < /dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 300); do grep -q "stop with" "$work/out.log" && break; sleep 0.2; done
gateway=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['gateway'])" "$work/data/endpoints.json")
api=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['api'])" "$work/data/endpoints.json")
password=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['alice'])" "$work/data/demo-users.json" 2>/dev/null \
  || grep -m1 'curl -u alice' "$work/out.log" | sed 's/.*-u alice:\([^ ]*\) .*/\1/')
curl -sf -o /dev/null -X POST -H "Authorization: Bearer $(cat "$work/data/admin-token")" \
  -H 'content-type: application/json' "$api/v1/apps" \
  -d "{\"name\":\"py\",\"command\":[\"/usr/bin/python3\",\"app.py\"],\"workdir\":\"$work\",\"lifetime\":\"per_request\",\"driver\":\"sandbox\",\"env\":{\"DELAY\":\"${DELAY:-0}\"}}"
perf record -q -a -o "$work/p.perf" -e 'syscalls:sys_exit_listen,syscalls:sys_enter_sendmsg' --exclude-perf -- \
  bash -c "for i in \$(seq $n); do curl -sf -o /dev/null -u 'alice:$password' '$gateway/apps/py/' || echo failed; done"
# Init's process name is its argv[0], a digit; the word is its first sendmsg after the app's listen.
perf script -i "$work/p.perf" -F comm,pid,time,event 2>/dev/null | python3 -c '
import re, statistics as st, sys
gaps, since = [], None
for line in sys.stdin:
    m = re.match(r"\s*(\S+)\s+(\d+)\s+([\d.]+):\s+(\S+):", line)
    if not m:
        continue
    comm, _, t, ev = m.groups()
    if ev.endswith("sys_exit_listen") and comm == "python3":
        since = float(t)
    elif ev.endswith("sys_enter_sendmsg") and comm.isdigit() and since is not None:
        gaps.append((float(t) - since) * 1e3)
        since = None
if not gaps:
    sys.exit("no start seen")
print(f"{len(gaps)} starts: the app listens -> init tells the agent, median {st.median(gaps):.3f} ms, mean {st.mean(gaps):.3f} ms")
'
