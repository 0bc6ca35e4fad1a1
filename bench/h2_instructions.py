#!/usr/bin/env python3
"""Instructions per request through warden's HTTP/2 path and nginx's, counted by callgrind.

Request rates on this machine move 10-25% from run to run; instruction counts for the same
binary and load repeat within about 0.5%, so they show where the work goes and what a change
saves. Each server runs under valgrind (its upstream, the demo app, does not), gets h2load's
connections warmed with 2,000 requests, then counts only while h2load sends N more (50
connections x 10 streams). warden: h2c, HTTP/2 over TLS, and its HTTP/1.1 lane over TLS with
the same flags (--h1); admission control off, so no connection is refused under valgrind's
slowness. nginx (1 worker, no master): h2c and HTTP/2 over TLS. The 50 TLS handshakes are in
the TLS counts.

valgrind runs SHA-256 in software where the machine uses SHA-NI, so warden's two SHA-256 uses
per request (the credential cache key and the identity signature) weigh far more here than
natively; the table gives them on their own line. Writes bench/out/h2-instructions.csv.
"""

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h2 import ec_cert, free_port, listening, nginx_conf, stop, wait  # noqa: E402


def count(vg, work, name, url, args, header=None, h1=False):
    """Instructions per request while h2load sends `args.requests` requests to `url`."""
    cmd = ["h2load", "-c", "50", "-m", "10", "-t", "1"] + (["--h1"] if h1 else [])
    cmd += ["-H", header] if header else []
    subprocess.run(cmd + ["-n", "2000", url], capture_output=True, check=True)
    subprocess.run(["callgrind_control", "-z", str(vg.pid)], capture_output=True, check=True)
    out = subprocess.run(cmd + ["-n", str(args.requests), url], capture_output=True, text=True).stdout
    done = int(re.search(r"(\d+) succeeded", out).group(1))
    before = set(os.listdir(work))
    subprocess.run(["callgrind_control", "-d", name, str(vg.pid)], capture_output=True, check=True)
    for _ in range(100):
        dumps = [f for f in set(os.listdir(work)) - before if f.startswith("cg.")]
        if dumps:
            break
        time.sleep(0.1)
    time.sleep(0.5)
    total, sha = 0, 0
    for f in dumps:
        text = open(os.path.join(work, f)).read()
        total += int(re.search(r"^summary: (\d+)", text, re.M).group(1))
        sha += self_cost(text, "sha2::sha256::compress256")
        os.rename(os.path.join(work, f), os.path.join(work, f"{name}.callgrind"))
    return done, total / max(done, 1), sha / max(done, 1)


def self_cost(text, symbol):
    """The cost callgrind charges to `symbol` itself (not to what it calls)."""
    names, cost, current, after_call = {}, 0, None, False
    for line in text.splitlines():
        if line.startswith(("fn=", "cfn=")):
            m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
            if m and m.group(2):
                names[m.group(1)] = m.group(2)
            if line.startswith("fn="):
                current = names.get(m.group(1)) if m else line[3:]
            continue
        if line.startswith("calls="):
            after_call = True
            continue
        parts = line.split()
        if len(parts) >= 2 and (line[:1].isdigit() or line[:1] in "+-*"):
            if after_call:
                after_call = False
            elif current == symbol:
                cost += int(parts[1])
    return cost


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warden", default="target/release/warden")
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--requests", type=int, default=20000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="warden-h2i-")
    cert, key = ec_cert(work)
    rows, procs = [], []
    try:
        # warden, under callgrind.
        wdir = os.path.join(work, "w")
        os.makedirs(wdir)
        data = os.path.join(work, "data")
        wtls, wh1, api = free_port(), free_port(), free_port()
        vg = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={wdir}/cg.%p",
                               a.warden, "up", "--demo", "--data-dir", data, "--listen", f"127.0.0.1:{wh1}",
                               "--tls-listen", f"127.0.0.1:{wtls}", "--api-listen", f"127.0.0.1:{api}",
                               "--tls-cert", cert, "--tls-key", key, "--no-tls-admission"],
                              stdout=open(os.path.join(work, "warden.log"), "w"), stderr=subprocess.STDOUT)
        procs.append(vg)
        wait("warden under valgrind", lambda: os.path.exists(os.path.join(data, "demo-users.json"))
             and listening(wtls), limit=600)
        users = json.load(open(os.path.join(data, "demo-users.json")))
        pw = next(u["password"] for u in users if u["name"] == "alice")
        basic = "Basic " + base64.b64encode(f"alice:{pw}".encode()).decode()
        req = urllib.request.Request(f"http://127.0.0.1:{wh1}/apps/demo/", headers={"authorization": basic})
        wait("the demo instance", lambda: urllib.request.urlopen(req, timeout=60).status == 200, limit=600)
        auth = "authorization: " + basic
        for path, url, h1 in [("HTTP/2 cleartext (h2c)", f"http://127.0.0.1:{wh1}/apps/demo/", False),
                              ("HTTP/2 over TLS", f"https://127.0.0.1:{wtls}/apps/demo/", False),
                              ("HTTP/1.1 lane over TLS", f"https://127.0.0.1:{wtls}/apps/demo/", True)]:
            name = "warden-" + ("h1" if h1 else "tls" if "TLS" in path else "h2c")
            rows.append((path, "warden") + count(vg, wdir, name, url, a, auth, h1))
            print(rows[-1], flush=True)
        vg.terminate()
        vg.wait(timeout=60)
        procs.remove(vg)

        # nginx, under callgrind, in front of the demo app run on its own.
        ndir = os.path.join(work, "n")
        os.makedirs(ndir)
        up = free_port()
        procs.append(subprocess.Popen([a.warden, "demo-app"], env=dict(os.environ, PORT=str(up)),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait("the upstream", lambda: listening(up))
        ntls, nh2c = free_port(), free_port()
        conf = os.path.join(work, "nginx.conf")
        open(conf, "w").write(nginx_conf(work, cert, key, up, ntls, nh2c)
                              .replace("worker_processes 1;", "worker_processes 1;\nmaster_process off;"))
        vg = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={ndir}/cg.%p",
                               "nginx", "-c", conf, "-g", "daemon off;"],
                              stdout=open(os.path.join(work, "nginx.log"), "w"), stderr=subprocess.STDOUT)
        procs.append(vg)
        wait("nginx under valgrind", lambda: listening(nh2c) and listening(ntls), limit=120)
        for path, url in [("HTTP/2 cleartext (h2c)", f"http://127.0.0.1:{nh2c}/"),
                          ("HTTP/2 over TLS", f"https://127.0.0.1:{ntls}/")]:
            name = "nginx-" + ("tls" if "TLS" in path else "h2c")
            rows.append((path, "nginx") + count(vg, ndir, name, url, a))
            print(rows[-1], flush=True)
    finally:
        stop(procs, timeout=60)
    with open(os.path.join(a.out, "h2-instructions.csv"), "w") as f:
        f.write("path,server,requests,instructions_per_request,sha256_per_request\n")
        for r in rows:
            f.write(f"{r[0]},{r[1]},{r[2]},{r[3]:.0f},{r[4]:.0f}\n")
    print("\n| path | warden | of which SHA-256 | nginx | warden ÷ nginx (without SHA-256) |")
    print("|---|---|---|---|---|")
    for path in ("HTTP/2 cleartext (h2c)", "HTTP/2 over TLS", "HTTP/1.1 lane over TLS"):
        w = next(r for r in rows if r[0] == path and r[1] == "warden")
        n = next((r for r in rows if r[0] == path and r[1] == "nginx"), None)
        ratio = f"{w[3] / n[3]:.2f} ({(w[3] - w[4]) / n[3]:.2f})" if n else ""
        print(f"| {path} | {w[3]:,.0f} | {w[4]:,.0f} | {f'{n[3]:,.0f}' if n else ''} | {ratio} |")
    print(f"\n{a.requests} requests per cell; profiles in {work}")


if __name__ == "__main__":
    main()
