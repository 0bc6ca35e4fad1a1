#!/usr/bin/env python3
"""What the durable `change` record costs an API change (issue 35): warden is started with
`--audit on`, then `--audit off`, alternating for ROUNDS rounds, each in a fresh data dir; each
run makes CHANGES sequential `PATCH /v1/apps/b` with a new env value (what `warden apps update
b --env K=V` sends) over one keep-alive connection and prints the median and 90th percentile
latency in ms. With the trail on, each change waits for its `pending` record to be fsync'd
before the handler acts. Loopback only; every loop is bounded in count and time.

usage: bench/audit-changes.py WARDEN_BINARY [CHANGES=200] [ROUNDS=2]
"""
import http.client, json, os, shutil, statistics, subprocess, sys, tempfile, time

warden = sys.argv[1]
changes = int(sys.argv[2]) if len(sys.argv) > 2 else 200
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
LIMIT_S = 120  # a run's changes stop after this long, whatever their number


def wait_for(f, what, limit=60):
    end = time.time() + limit
    while time.time() < end:
        try:
            v = f()
            if v:
                return v
        except Exception:
            pass
        time.sleep(0.05)
    sys.exit(f"{what}: not within {limit} s")


def run(mode):
    top = tempfile.mkdtemp(prefix="audit-changes-")
    d = os.path.join(top, "data")
    proc = subprocess.Popen(
        [warden, "up", "--data-dir", d, "--listen", "127.0.0.1:0", "--api-listen",
         "127.0.0.1:0", "--data", "none", "--audit", mode],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ep = wait_for(lambda: json.load(open(os.path.join(d, "endpoints.json"))), "warden up")
        host = ep["api"].removeprefix("http://")
        token = open(os.path.join(d, "admin-token")).read().strip()
        headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        c = http.client.HTTPConnection(host, timeout=30)

        def call(method, path, body):
            c.request(method, path, json.dumps(body), headers)
            r = c.getresponse()
            r.read()
            return r.status

        assert call("POST", "/v1/apps", {"name": "b", "command": ["/bin/true"]}) == 201
        took, end = [], time.time() + LIMIT_S
        for i in range(changes):
            if time.time() > end:
                break
            t = time.perf_counter()
            status = call("PATCH", "/v1/apps/b", {"env": {"K": str(i)}})
            took.append((time.perf_counter() - t) * 1000)
            assert status == 200, status
        took.sort()
        return statistics.median(took), took[int(len(took) * 0.9) - 1], len(took)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(top, ignore_errors=True)


for r in range(rounds):
    for mode in ("on", "off"):
        med, p90, n = run(mode)
        print(f"round {r + 1} audit {mode}: {n} changes, median {med:.2f} ms, p90 {p90:.2f} ms",
              flush=True)
