#!/usr/bin/env python3
"""HTTP/2 through the gateway beside nginx (issue 21): h2load against warden (authenticating
every request with cached Basic credentials) and nginx (no authentication), both in front of
the demo app, over TLS (h2 by ALPN) and cleartext (h2c, prior knowledge); and warden's own
HTTP/1.1 lane over TLS with the same connection count, as the floor HTTP/2 should reach.

Servers and the upstream are pinned to CPU 0, h2load to CPU 1. Writes bench/out/h2.csv and
bench/out/h2.md.
"""

import argparse
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait(what, f, limit=60):
    end = time.time() + limit
    while time.time() < end:
        try:
            if f():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def ec_cert(work):
    """A self-signed P-256 certificate for localhost and 127.0.0.1 in `work`: (cert, key)."""
    cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def stop(procs, timeout=30):
    """Terminates `procs`, killing those that do not end within `timeout` seconds."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except Exception:
            p.kill()


def pinned(cpu, argv):
    return ["taskset", "-c", str(cpu)] + argv if shutil.which("taskset") else argv


def h2load(url, args, header=None, h1=False):
    cmd = ["h2load", "-c", str(args.connections), "-m", str(args.streams), "-D", str(args.seconds),
           "--warm-up-time", "2", "-t", "1"]
    if h1:
        cmd.append("--h1")
    if header:
        cmd += ["-H", header]
    out = subprocess.run(pinned(1, cmd + [url]), capture_output=True, text=True, timeout=args.seconds + 120).stdout
    rate = float(re.search(r"finished in [\d.]+\w*, ([\d.]+) req/s", out).group(1))
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", out)
    ok, failed = (int(m.group(1)), int(m.group(2))) if m else (0, -1)
    st = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    non2xx = sum(int(x) for x in st.groups()[1:]) if st else -1
    return rate, failed, non2xx


def nginx_conf(work, cert, key, up, tls_port, h2c_port):
    return f"""
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  keepalive_timeout 60s;
  upstream app {{ server 127.0.0.1:{up}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{tls_port} ssl http2 backlog=4096;
    listen 127.0.0.1:{h2c_port} http2 backlog=4096;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location / {{
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warden", default="target/release/warden")
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--streams", type=int, default=10)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--warden-arg", action="append", default=[])
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="warden-h2-")
    cert, key = ec_cert(work)
    procs = []
    rows = []
    try:
        # The upstream for nginx: the demo app warden runs for itself, on its own.
        up = free_port()
        procs.append(subprocess.Popen(pinned(0, [a.warden, "demo-app"]), env=dict(os.environ, PORT=str(up)),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait("the upstream", lambda: listening(up))
        ntls, nh2c = free_port(), free_port()
        conf = os.path.join(work, "nginx.conf")
        open(conf, "w").write(nginx_conf(work, cert, key, up, ntls, nh2c))
        procs.append(subprocess.Popen(pinned(0, ["nginx", "-c", conf, "-g", "daemon off;"]),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait("nginx", lambda: listening(ntls))

        data = os.path.join(work, "warden")
        wtls, wh1, api = free_port(), free_port(), free_port()
        procs.append(subprocess.Popen(pinned(0, [a.warden, "up", "--demo", "--data-dir", data,
                                                 "--listen", f"127.0.0.1:{wh1}", "--tls-listen", f"127.0.0.1:{wtls}",
                                                 "--api-listen", f"127.0.0.1:{api}", "--tls-cert", cert, "--tls-key", key,
                                                 "--max-connections", "16000"] + a.warden_arg),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait("warden", lambda: os.path.exists(os.path.join(data, "demo-users.json")) and listening(wtls))
        users = json.load(open(os.path.join(data, "demo-users.json")))
        pw = next(u["password"] for u in users if u["name"] == "alice")
        auth = "authorization: Basic " + base64.b64encode(f"alice:{pw}".encode()).decode()
        # The first request starts alice's instance.
        req = urllib.request.Request(f"http://127.0.0.1:{wh1}/apps/demo/", headers={"authorization": auth.split(": ", 1)[1]})
        wait("the demo instance", lambda: urllib.request.urlopen(req, timeout=10).status == 200)

        cells = [
            ("HTTP/2 over TLS", "warden", f"https://127.0.0.1:{wtls}/apps/demo/", auth, False),
            ("HTTP/2 over TLS", "nginx", f"https://127.0.0.1:{ntls}/", None, False),
            ("HTTP/2 cleartext (h2c)", "warden", f"http://127.0.0.1:{wh1}/apps/demo/", auth, False),
            ("HTTP/2 cleartext (h2c)", "nginx", f"http://127.0.0.1:{nh2c}/", None, False),
            ("HTTP/1.1 over TLS", "warden", f"https://127.0.0.1:{wtls}/apps/demo/", auth, True),
        ]
        for run in range(a.runs):
            for path, server, url, header, h1 in cells:
                rate, failed, non2xx = h2load(url, a, header, h1)
                print(f"{path:<24} {server:<7} {rate:>10.0f} req/s  failed {failed}  non-2xx {non2xx}", flush=True)
                rows.append((run, path, server, rate, failed, non2xx))
    finally:
        stop(procs)
    with open(os.path.join(a.out, "h2.csv"), "w") as f:
        f.write("run,path,server,requests_per_sec,failed,non_2xx\n")
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")
    def rates(path, server):
        return [r[3] for r in rows if r[1] == path and r[2] == server]
    lines = ["| path | warden | nginx | warden ÷ nginx |", "|---|---|---|---|"]
    for path in ("HTTP/2 over TLS", "HTTP/2 cleartext (h2c)"):
        w, n = rates(path, "warden"), rates(path, "nginx")
        lines.append(f"| {path} | {', '.join(f'{x:,.0f}' for x in w)} | {', '.join(f'{x:,.0f}' for x in n)} | "
                     + ", ".join(f"{x / y:.2f}" for x, y in zip(w, n)) + " |")
    h1 = rates("HTTP/1.1 over TLS", "warden")
    w2 = rates("HTTP/2 over TLS", "warden")
    lines.append(f"| warden HTTP/1.1 lane over TLS | {', '.join(f'{x:,.0f}' for x in h1)} | | "
                 + "h2 ÷ h1.1: " + ", ".join(f"{x / y:.2f}" for x, y in zip(w2, h1)) + " |")
    text = "\n".join(lines) + f"\n\n{a.connections} connections × {a.streams} streams, {a.seconds} s per cell, {a.runs} runs\n"
    open(os.path.join(a.out, "h2.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
