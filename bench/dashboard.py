"""The dashboard's overview render time on a large cluster's store (issue 37: under 200 ms for
100 apps and 1,000 instances), through HTTP to the real binary, beside the floor of the same
run: `GET /v1/status` of the same store, which the overview calls and renders.

How the store gets large without 1,000 processes: a demo warden is backed up, stopped, and the
backup gets 100 apps (desired nothing, so nothing starts) and 1,000 instance records on four
nodes that are not this one (ready, each with a release), then is restored into its data dir
(`warden store restore`) and warden started again. The records are what `warden status` and
the overview read; no process stands behind them, and no request reaches them.
"""
import argparse
import base64
import hashlib
import hmac
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path, headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r, body


def start(binary, data):
    port, api = free_port(), free_port()
    up = subprocess.Popen(
        [binary, "up", "--demo", "--data-dir", data, "--listen", f"127.0.0.1:{port}",
         "--api-listen", f"127.0.0.1:{api}", "--tls-listen", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until = time.time() + 120
    while time.time() < until:
        try:
            if get(api, "/readyz")[0].status == 200 and os.path.exists(os.path.join(data, "demo-users.json")):
                return up, api
        except OSError:
            pass
        time.sleep(0.2)
    up.kill()
    raise SystemExit("warden did not become ready in 120 s")


def stop(up):
    up.send_signal(signal.SIGTERM)
    up.wait(timeout=60)


def grow(backup, apps, instances, now_ms):
    """`backup` with `apps` apps and `instances` instance records added, unsealed."""
    records = {r["key"]: r["value"] for r in backup["records"]}
    demo = json.loads(base64.b64decode(records["apps/demo/spec"]))
    for a in range(apps):
        name = f"bench{a:03d}"
        spec = dict(demo, name=name, desired={})
        spec.pop("data", None)
        records[f"apps/{name}/spec"] = base64.b64encode(json.dumps(spec).encode()).decode()
    labels = ["UNCLASSIFIED", "CONFIDENTIAL", "SECRET", "TOP SECRET"]
    for i in range(instances):
        app = f"bench{i % apps:03d}"
        rec = {
            "id": f"b{i:05d}", "app": app, "label": labels[i % 4], "node": f"bench-node-{i % 4}",
            "addr": f"127.0.0.1:{20000 + i}", "pid": 100000 + i, "state": "ready",
            "started_at_ms": now_ms - 60_000, "release": 1,
        }
        records[f"instances/{app}/b{i:05d}"] = base64.b64encode(json.dumps(rec).encode()).decode()
    backup = dict(backup)
    backup["records"] = [{"key": k, "value": v} for k, v in sorted(records.items())]
    backup.pop("digest", None)
    backup.pop("mac", None)
    return backup


def seal(backup, key):
    """As `warden_store::backup::Backup::seal`."""
    h = hashlib.sha256()

    def field(b):
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    field(backup["format"].encode())
    field(int(backup["revision"]).to_bytes(8, "little"))
    field(len(backup["records"]).to_bytes(8, "little"))
    for r in backup["records"]:
        field(r["key"].encode())
        field(r["value"].encode())
    digest = "sha256:" + h.hexdigest()
    backup["digest"] = digest
    backup["mac"] = "hmac-sha256:" + hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()


def sign_in(api, token):
    """A dashboard session with the admin token: the `Cookie` header."""
    r, body = get(api, "/ui/login")
    csrf = re.search(r"warden_ui_csrf=([A-Za-z0-9]+)", r.getheader("set-cookie")).group(1)
    field = re.search(rb'name="csrf" value="([0-9a-f]{64})"', body).group(1).decode()
    c = http.client.HTTPConnection("127.0.0.1", api, timeout=30)
    c.request("POST", "/ui/login", body=f"token={token}&csrf={field}",
              headers={"content-type": "application/x-www-form-urlencoded",
                       "cookie": f"warden_ui_csrf={csrf}"})
    r = c.getresponse()
    r.read()
    session = re.search(r"warden_ui=([A-Za-z0-9]+)", r.getheader("set-cookie")).group(1)
    return f"warden_ui_csrf={csrf}; warden_ui={session}"


def timed(api, path, headers):
    t0 = time.perf_counter()
    r, body = get(api, path, headers)
    ms = (time.perf_counter() - t0) * 1000
    assert r.status == 200, (path, r.status, body[:300])
    return ms, body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warden", default="target/release/warden")
    ap.add_argument("--apps", type=int, default=100)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("-n", type=int, default=31)
    a = ap.parse_args()
    data = tempfile.mkdtemp(prefix="warden-dash-")
    up, api = start(a.warden, data)
    token = open(os.path.join(data, "admin-token")).read().strip()
    env = dict(os.environ, WARDEN_API=f"http://127.0.0.1:{api}", WARDEN_TOKEN=token)
    path = os.path.join(data, "..", os.path.basename(data) + "-backup.json")
    subprocess.run([a.warden, "store", "backup", path], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    stop(up)
    backup = grow(json.load(open(path)), a.apps, a.instances, int(time.time() * 1000))
    seal(backup, open(os.path.join(data, "backup-key")).read().strip().encode())
    json.dump(backup, open(path, "w"))
    subprocess.run([a.warden, "store", "restore", path, "--data-dir", data], check=True,
                   stdout=subprocess.DEVNULL)
    up, api = start(a.warden, data)
    try:
        bearer = {"authorization": f"Bearer {token}"}
        _, inst = timed(api, "/v1/instances", bearer)
        have = sum(1 for i in json.loads(inst) if i["id"].startswith("b"))
        cookie = {"cookie": sign_in(api, token)}
        _, page = timed(api, "/ui/", cookie)
        rows = page.count(b'data-app="bench')
        print(f"store: {have} bench instance records; overview: {len(page)} bytes, {rows} bench app rows")
        assert have == a.instances and rows >= a.apps, "the store did not keep what was restored"
        ui, status = [], []
        for _ in range(a.n):
            status.append(timed(api, "/v1/status", bearer)[0])
            ui.append(timed(api, "/ui/", cookie)[0])
        for name, xs in (("GET /ui/ (overview)", ui), ("GET /v1/status (floor)", status)):
            xs.sort()
            print(f"| {name} | {statistics.median(xs):.1f} ms | {xs[int(len(xs) * 0.9)]:.1f} ms | {len(xs)} |")
    finally:
        stop(up)


if __name__ == "__main__":
    main()
