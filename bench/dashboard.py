#!/usr/bin/env python3
"""What the dashboard's overview costs on a large cluster (issue 37: "the overview of a cluster
with 100 apps and 1,000 instances renders in under 200 ms").

One warden (gateway, agent and API, --demo) on a one-member etcd. The apps are made through the
API (POST /v1/apps, as `warden apps create` makes them). The instances and their nodes are
written into etcd the way agents write them: the JSON of a real record (the demo app's instance
that a request started, and this node's own record, read back from the store), copied with
another id, app, label and node, under a lease, at the keys agents use (`instances/APP/ID`,
`nodes/NODE`). Nothing but the count differs from a cluster whose agents run them: the API
lists the same keys and decodes the same bytes. Running 1,000 real processes on this 2-core
machine would measure the machine, not the page.

Then, signed in (the session cookie the dashboard's sign-in sets, holding the admin token),
`GET /ui/` and `GET /v1/status` (the same data as JSON: the overview renders that answer, so
it is the floor) are timed alternately, N times each, on kept-alive connections. Prints and
writes bench/out/dashboard.md.
"""
import argparse
import base64
import http.client
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what, f, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            v = f()
            if v:
                return v
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


class Client:
    """Kept-alive HTTP/1.1 to one host."""

    def __init__(self, url, headers):
        self.host = url.removeprefix("http://").rstrip("/")
        self.headers = headers
        self.c = http.client.HTTPConnection(self.host, timeout=60)

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body)
        h = dict(self.headers)
        if data is not None:
            h["content-type"] = "application/json"
        self.c.request(method, path, body=data, headers=h)
        r = self.c.getresponse()
        return r.status, r.read()


def etcd_put(etcd, key, value, lease):
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    status, body = etcd.call("POST", "/v3/kv/put", {"key": b64(key), "value": b64(value), "lease": lease})
    assert status == 200, body


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--warden", required=True)
    ap.add_argument("--apps", type=int, default=100)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="warden-dashboard-bench")
    os.chmod(work, 0o711)
    procs = []
    try:
        c, p = free_port(), free_port()
        procs.append(subprocess.Popen([
            "etcd", "--name=m0", f"--data-dir={work}/etcd",
            f"--listen-client-urls=http://127.0.0.1:{c}", f"--advertise-client-urls=http://127.0.0.1:{c}",
            f"--listen-peer-urls=http://127.0.0.1:{p}", f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
            f"--initial-cluster=m0=http://127.0.0.1:{p}", "--initial-cluster-state=new",
            "--log-level=error", "--logger=zap"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        d = f"{work}/alpha"
        procs.append(subprocess.Popen(
            [args.warden, "up", "--data-dir", d, "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
             "--node-name", "alpha", "--store", f"etcd://127.0.0.1:{c}", "--demo"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "WARDEN_LOG": "warn"}))
        ep = wait("warden up", lambda: json.load(open(f"{d}/endpoints.json")))
        token = open(f"{d}/admin-token").read().strip()
        api = Client(ep["api"], {"authorization": f"Bearer {token}"})
        wait("the API", lambda: api.call("GET", "/readyz")[0] == 200)
        users = json.load(open(f"{d}/demo-users.json"))
        alice = next(u for u in users if u["name"] == "alice")
        auth = "Basic " + base64.b64encode(f"alice:{alice['password']}".encode()).decode()
        gw = Client(ep["gateway"], {"authorization": auth})
        # A real instance and a real node record: the templates of what agents write.
        wait("the demo app's instance", lambda: gw.call("GET", "/apps/demo/")[0] == 200)
        template = json.loads(api.call("GET", "/v1/instances")[1])[0]
        node = json.loads(api.call("GET", "/v1/nodes")[1])[0]
        levels = json.loads(api.call("GET", "/v1/lattice")[1])["levels"]

        for i in range(args.apps):
            spec = {"name": f"app{i:03}", "command": [os.path.abspath(args.warden), "demo-app"],
                    "driver": "process"}
            status, body = api.call("POST", "/v1/apps", spec)
            assert status == 201, body
        etcd = Client(f"http://127.0.0.1:{c}", {})
        status, body = etcd.call("POST", "/v3/lease/grant", {"TTL": 3600})
        assert status == 200, body
        lease = json.loads(body)["ID"]
        now = int(time.time() * 1000)
        for n in range(args.nodes):
            rec = dict(node, id=f"bench{n:02}", hostname=f"bench{n:02}", started_at_ms=now - 3_600_000)
            etcd_put(etcd, f"nodes/bench{n:02}", json.dumps(rec), lease)
        for i in range(args.instances):
            app = f"app{i % args.apps:03}"
            iid = f"bench{i:05}"
            rec = dict(template, id=iid, app=app, label=levels[i % len(levels)],
                       node=f"bench{i % args.nodes:02}", pid=100000 + i,
                       state="starting" if i % 50 == 0 else "ready",
                       started_at_ms=now - 1000 * i, kept=i % 2 == 0)
            etcd_put(etcd, f"instances/{app}/{iid}", json.dumps(rec), lease)

        st = json.loads(api.call("GET", "/v1/status")[1])
        listed = json.loads(api.call("GET", "/v1/instances")[1])
        print(f"store: {len(st['apps'])} apps, {len(listed)} instances, {len(st['by_node'])} nodes, "
              f"damaged: {len(st.get('damaged', []))}")
        assert len(listed) >= args.instances and not st.get("damaged"), st.get("damaged")

        ui = Client(ep["api"], {"cookie": f"warden_ui={token}"})
        status, page = ui.call("GET", "/ui/")
        assert status == 200 and b"app099" in page, (status, page[:300])
        samples = {"GET /ui/ (overview page)": [], "GET /v1/status (JSON, the floor)": []}
        for _ in range(5):  # warm-up
            ui.call("GET", "/ui/")
            api.call("GET", "/v1/status")
        for _ in range(args.requests):
            for name, client, path in [("GET /ui/ (overview page)", ui, "/ui/"),
                                       ("GET /v1/status (JSON, the floor)", api, "/v1/status")]:
                t = time.perf_counter()
                status, body = client.call("GET", path)
                samples[name].append((time.perf_counter() - t) * 1000)
                assert status == 200, body[:200]
        lines = [f"{len(st['apps'])} apps, {len(listed)} instances on {len(st['by_node'])} nodes; "
                 f"overview page {len(page)} bytes",
                 "", "| request | n | median ms | p90 ms | max ms |", "|---|---|---|---|---|"]
        for name, s in samples.items():
            q = statistics.quantiles(s, n=10)
            lines.append(f"| {name} | {len(s)} | {statistics.median(s):.1f} | {q[8]:.1f} | {max(s):.1f} |")
        text = "\n".join(lines)
        print(text)
        os.makedirs(args.out, exist_ok=True)
        with open(f"{args.out}/dashboard.md", "w") as f:
            f.write(text + "\n")
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
