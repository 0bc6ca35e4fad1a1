#!/usr/bin/env python3
"""What a cold start costs when the instance starts on another node.

A 3-member etcd; node "beta" runs the gateway and the agent (its node port on 127.0.0.2);
node "alpha" runs a gateway and the API but no agent. An app whose instances each serve one
request (lifetime per_request) makes every request a cold start: through beta's gateway the
start is local, through alpha's it is asked of beta over the node port and the request then
crosses it. Requests alternate between the two gateways; the median and quartiles of each, and
their difference, are the result. Also the same with a warm instance (lifetime shared), where
only the hop differs.
"""
import argparse
import base64
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
import http.client


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


def up(warden, work, name, args, procs):
    d = f"{work}/{name}"
    procs.append(subprocess.Popen(
        [warden, "up", "--data-dir", d, "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
         "--node-name", name, *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "WARDEN_LOG": "warn"}))
    ep = wait(f"{name} up", lambda: json.load(open(f"{d}/endpoints.json")))
    return d, ep


def get(url, auth):
    host = url.removeprefix("http://").split("/")[0]
    path = "/" + url.removeprefix("http://").split("/", 1)[1]
    c = http.client.HTTPConnection(host, timeout=60)
    t = time.perf_counter()
    c.request("GET", path, headers={"authorization": auth, "connection": "close"})
    r = c.getresponse()
    body = r.read()
    took = time.perf_counter() - t
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{r.status} {body[:200]!r}")
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--warden", required=True)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="warden-cluster-start")
    os.chmod(work, 0o711)
    procs = []
    try:
        ports = [free_port() for _ in range(6)]
        peers = ",".join(f"m{i}=http://127.0.0.1:{ports[2 * i + 1]}" for i in range(3))
        for i in range(3):
            c, p = ports[2 * i], ports[2 * i + 1]
            procs.append(subprocess.Popen([
                "etcd", f"--name=m{i}", f"--data-dir={work}/etcd{i}",
                f"--listen-client-urls=http://127.0.0.1:{c}", f"--advertise-client-urls=http://127.0.0.1:{c}",
                f"--listen-peer-urls=http://127.0.0.1:{p}", f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
                f"--initial-cluster={peers}", "--initial-cluster-state=new", "--log-level=error", "--logger=zap"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        store = "etcd://" + ",".join(f"127.0.0.1:{ports[2 * i]}" for i in range(3))
        adir, alpha = up(args.warden, work, "alpha", ["--store", store, "--roles", "gateway,api", "--demo",
                                                      "--tls-listen", "127.0.0.1:0"], procs)
        _, beta = up(args.warden, work, "beta", ["--store", store, "--roles", "gateway,agent",
                                                 "--advertise", "127.0.0.2:0",
                                                 "--join-token-file", f"{adir}/join-token"], procs)
        token = open(f"{adir}/admin-token").read().strip()
        users = json.load(open(f"{adir}/demo-users.json"))
        alice = next(u for u in users if u["name"] == "alice")
        auth = "Basic " + base64.b64encode(f"alice:{alice['password']}".encode()).decode()
        api = alpha["api"].removeprefix("http://")
        for name, lifetime in [("cold", "per_request"), ("warm", "shared")]:
            c = http.client.HTTPConnection(api, timeout=30)
            spec = {"name": name, "command": [os.path.abspath(args.warden), "demo-app"],
                    "lifetime": lifetime, "driver": "process"}
            c.request("POST", "/v1/apps", body=json.dumps(spec),
                      headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
            r = c.getresponse()
            assert r.status == 201, r.read()
            r.read()
        wait("beta's node port in the directory", lambda: get(f"{alpha['gateway']}/apps/warm/", auth), 30)
        lines = ["| app | path | requests | p25 ms | median ms | p75 ms |", "|---|---|---|---|---|---|"]
        medians = {}
        for app in ["cold", "warm"]:
            samples = {"local (beta's gateway)": [], "cross-node (alpha's gateway)": []}
            for _ in range(3):  # warm-up
                get(f"{beta['gateway']}/apps/{app}/", auth)
                get(f"{alpha['gateway']}/apps/{app}/", auth)
            for _ in range(args.requests):
                samples["local (beta's gateway)"].append(get(f"{beta['gateway']}/apps/{app}/", auth))
                samples["cross-node (alpha's gateway)"].append(get(f"{alpha['gateway']}/apps/{app}/", auth))
            for path, s in samples.items():
                q = statistics.quantiles([x * 1000 for x in s], n=4)
                medians[(app, path)] = q[1]
                lines.append(f"| {app} | {path} | {len(s)} | {q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} |")
        for app in ["cold", "warm"]:
            d = medians[(app, "cross-node (alpha's gateway)")] - medians[(app, "local (beta's gateway)")]
            lines.append(f"\n{app}: cross-node minus local, medians: {d:+.2f} ms")
        text = "\n".join(lines)
        print(text)
        os.makedirs(args.out, exist_ok=True)
        with open(f"{args.out}/cluster-start.md", "w") as f:
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
