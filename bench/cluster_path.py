#!/usr/bin/env python3
"""Issue 39, aim 1: a request that crosses a node port beside one that does not, and beside
nginx proxying to its upstream over mutual TLS.

warden: a 3-member etcd; node "alpha" runs a gateway and the API but no agent; node "beta" runs
a gateway and the agent, its node port on 127.0.0.2. The demo app's instance for alice's label
runs on beta. The same wrk load (alice's valid Basic credentials on every request) goes
  - local: through beta's gateway to the instance;
  - cross-node: through alpha's gateway, over beta's node port (mutual TLS) to the instance.
nginx: a front nginx proxies to an upstream nginx on 127.0.0.2 (keep-alive upstreams at both
hops), which proxies to the same demo app run on its own; the front-to-upstream hop
  - nginx mTLS: over mutual TLS (`proxy_ssl_certificate`, `proxy_ssl_verify on`), certificates
    from openssl in the run's temp dir (P-256, TLS 1.3);
  - nginx plain: over plain HTTP.
nginx authenticates nobody; warden's gateways check the cached Basic credentials and the label.

Per row: req/s, wrk's p50/p99, and each server process's CPU (utime + stime from /proc/PID/stat
before and after, a process's children counted apart) in microseconds per request. Writes
bench/out/cluster-path.md and .csv.
"""

import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening(port, host="127.0.0.1"):
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def wait(what, f, limit=60):
    end = time.time() + limit
    while time.time() < end:
        try:
            v = f()
            if v:
                return v
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def pinned(cpu, argv, pin):
    return ["taskset", "-c", str(cpu)] + argv if pin and shutil.which("taskset") else argv


def stop(procs, timeout=30):
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def proc_table():
    """{pid: (ppid, cpu ticks of the process itself, all its threads)}."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(pid)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def cpu_of(groups):
    """CPU seconds so far of each named group: ("self", pid) is that process alone,
    ("tree", pid) it and every descendant, ("children", pid) its descendants only."""
    table = proc_table()

    def descendants(root):
        found, changed = set(), True
        while changed:
            changed = False
            for pid, (pp, _) in table.items():
                if (pp == root or pp in found) and pid not in found:
                    found.add(pid)
                    changed = True
        return found

    out = {}
    for name, (kind, pid) in groups.items():
        pids = {pid} if kind == "self" else descendants(pid) | ({pid} if kind == "tree" else set())
        out[name] = sum(table[p][1] for p in pids if p in table) / TICK
    return out


def wrk(url, auth, connections, seconds, pin):
    cmd = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", "--latency"]
    if auth:
        cmd += ["-H", f"Authorization: {auth}"]
    out = subprocess.run(pinned(1, cmd + [url], pin), capture_output=True, text=True, check=True,
                         timeout=seconds + 60).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)

    def quantile(q):
        m = re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        v, unit = float(m.group(1)), m.group(2)
        return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v

    return {"rps": rate, "requests": total, "p50_ms": quantile(50), "p99_ms": quantile(99),
            "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": sum(int(x) for x in errors.groups()) if errors else 0}


def measure(url, auth, connections, seconds, groups, pin):
    wrk(url, auth, connections, 2, pin)  # warm-up: connections, pools, caches
    before = cpu_of(groups)
    r = wrk(url, auth, connections, seconds, pin)
    after = cpu_of(groups)
    r["cpu_us"] = {k: (after[k] - before[k]) * 1e6 / max(r["requests"], 1) for k in groups}
    return r


# ---------------------------------------------------------------- warden

def warden_up(binary, work, name, args, pin):
    d = f"{work}/{name}"
    os.makedirs(d, mode=0o700, exist_ok=True)
    log = open(f"{d}.log", "ab")
    p = subprocess.Popen(pinned(0, [binary, "up", "--data-dir", d, "--listen", "127.0.0.1:0",
                                    "--api-listen", "127.0.0.1:0", "--node-name", name, *args], pin),
                         stdout=log, stderr=log, env={**os.environ, "WARDEN_LOG": "warn"})
    ep = wait(f"{name} up", lambda: json.load(open(f"{d}/endpoints.json")))
    return p, d, ep


def warden_setup(a, work, procs):
    ports = [free_port() for _ in range(6)]
    peers = ",".join(f"m{i}=http://127.0.0.1:{ports[2 * i + 1]}" for i in range(3))
    etcds = []
    for i in range(3):
        c, p = ports[2 * i], ports[2 * i + 1]
        etcds.append(subprocess.Popen(pinned(0, [
            "etcd", f"--name=m{i}", f"--data-dir={work}/etcd{i}",
            f"--listen-client-urls=http://127.0.0.1:{c}", f"--advertise-client-urls=http://127.0.0.1:{c}",
            f"--listen-peer-urls=http://127.0.0.1:{p}", f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
            f"--initial-cluster={peers}", "--initial-cluster-state=new", "--log-level=error",
            "--logger=zap"], a.pin), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    procs += etcds
    store = "etcd://" + ",".join(f"127.0.0.1:{ports[2 * i]}" for i in range(3))
    alpha, adir, aep = warden_up(a.warden, work, "alpha", ["--store", store, "--roles", "gateway,api",
                                                           "--demo"], a.pin)
    procs.append(alpha)
    beta, _, bep = warden_up(a.warden, work, "beta", ["--store", store, "--roles", "gateway,agent",
                                                      "--advertise", "127.0.0.2:0",
                                                      "--join-token-file", f"{adir}/join-token"], a.pin)
    procs.append(beta)
    users = wait("the demo's users", lambda: json.load(open(f"{adir}/demo-users.json")))
    pw = next(u["password"] for u in users if u["name"] == "alice")
    auth = "Basic " + base64.b64encode(f"alice:{pw}".encode()).decode()

    def ok(url):
        req = urllib.request.Request(url, headers={"authorization": auth})
        return urllib.request.urlopen(req, timeout=10).status == 200

    # The first request starts alice's instance on beta (the only agent); alpha reaches it once
    # beta's node port is in the directory.
    wait("the demo instance through beta", lambda: ok(f"{bep['gateway']}/apps/demo/"), 60)
    wait("the demo instance through alpha", lambda: ok(f"{aep['gateway']}/apps/demo/"), 60)
    groups = {"alpha": ("self", alpha.pid), "beta": ("self", beta.pid),
              "instance": ("children", beta.pid)}
    # The three members, summed into one figure after the run.
    groups.update({f"etcd{i}": ("tree", e.pid) for i, e in enumerate(etcds)})
    return auth, aep, bep, groups


# ---------------------------------------------------------------- nginx

def certs(work):
    """A CA, the upstream's server certificate (DNS:upstream.test) and the front's client
    certificate, all P-256, in `work`."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", f"{work}/ca.key", "-out", f"{work}/ca.pem", "-days", "2",
        "-subj", "/CN=bench CA")
    for name, ext in [("server", "subjectAltName=DNS:upstream.test\nextendedKeyUsage=serverAuth"),
                      ("client", "subjectAltName=DNS:front.test\nextendedKeyUsage=clientAuth")]:
        open(f"{work}/{name}.ext", "w").write(ext + "\n")
        run("req", "-new", *ec, "-keyout", f"{work}/{name}.key", "-out", f"{work}/{name}.csr",
            "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{work}/{name}.csr", "-CA", f"{work}/ca.pem", "-CAkey",
            f"{work}/ca.key", "-CAcreateserial", "-out", f"{work}/{name}.pem", "-days", "2",
            "-extfile", f"{work}/{name}.ext")


NGINX_HEAD = """worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log error;
worker_rlimit_nofile 20000;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  keepalive_requests 10000000;
"""

FRONT = NGINX_HEAD + """  upstream tls_up {{ server 127.0.0.2:{tls_port}; keepalive 32; }}
  upstream plain_up {{ server 127.0.0.2:{plain_port}; keepalive 32; }}
  server {{
    listen 127.0.0.1:{mtls_front} backlog=4096;
    location / {{
      proxy_pass https://tls_up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_ssl_certificate {work}/client.pem;
      proxy_ssl_certificate_key {work}/client.key;
      proxy_ssl_trusted_certificate {work}/ca.pem;
      proxy_ssl_verify on;
      proxy_ssl_name upstream.test;
      proxy_ssl_protocols TLSv1.3;
      proxy_ssl_session_reuse on;
    }}
  }}
  server {{
    listen 127.0.0.1:{plain_front} backlog=4096;
    location / {{
      proxy_pass http://plain_up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""

UPSTREAM = NGINX_HEAD + """  upstream app {{ server 127.0.0.1:{app}; keepalive 32; }}
  server {{
    listen 127.0.0.2:{tls_port} ssl backlog=4096;
    ssl_certificate {work}/server.pem;
    ssl_certificate_key {work}/server.key;
    ssl_client_certificate {work}/ca.pem;
    ssl_verify_client on;
    ssl_protocols TLSv1.3;
    location / {{
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
  server {{
    listen 127.0.0.2:{plain_port} backlog=4096;
    location / {{
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""


def nginx_setup(a, work, procs):
    certs(work)
    app = free_port()
    demo = subprocess.Popen(pinned(0, [a.warden, "demo-app"], a.pin),
                            env={"PATH": os.environ["PATH"], "PORT": str(app)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(demo)
    wait("the demo app", lambda: listening(app))
    ports = {"app": app, "tls_port": free_port("127.0.0.2"), "plain_port": free_port("127.0.0.2"),
             "mtls_front": free_port(), "plain_front": free_port(), "work": work,
             "workers": a.nginx_workers}
    started = {}
    for name, tmpl in [("upstream", UPSTREAM), ("front", FRONT)]:
        d = f"{work}/{name}"
        os.makedirs(d, exist_ok=True)
        open(f"{d}/nginx.conf", "w").write(tmpl.format(dir=d, **ports))
        p = subprocess.Popen(pinned(0, ["nginx", "-e", "stderr", "-c", f"{d}/nginx.conf",
                                        "-g", "daemon off; master_process on; user root;"], a.pin),
                             stdout=subprocess.DEVNULL, stderr=open(f"{d}/stderr", "wb"))
        procs.append(p)
        started[name] = p
    wait("the upstream nginx", lambda: listening(ports["tls_port"], "127.0.0.2"))
    wait("the front nginx", lambda: listening(ports["mtls_front"]))
    wait("nginx's mTLS path", lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{ports['mtls_front']}/", timeout=10).status == 200)
    groups = {"front nginx": ("tree", started["front"].pid),
              "upstream nginx": ("tree", started["upstream"].pid), "demo app": ("self", demo.pid)}
    return ports, groups


# ---------------------------------------------------------------- report

def served(r):
    """CPU per request of the processes on the request's path (etcd's is background: the
    members' heartbeats, about the same per second whatever the load)."""
    return sum(v for k, v in r["cpu_us"].items() if k != "etcd")


def table(rows):
    lines = ["| run | connections | path | req/s | p50 ms | p99 ms | non-2xx / socket errors | "
             "CPU µs per request, each process |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_us"].items() if v >= 0.05)
        lines.append(f"| {r['run']} | {r['connections']} | {r['path']} | {r['rps']:,.0f} | "
                     f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['non2xx']} / {r['socket_errors']} | "
                     f"{cpu} (path {served(r):.1f}) |")
    lines += ["", "| run | connections | cross ÷ local | cross ÷ nginx mTLS | nginx mTLS ÷ nginx plain | "
              "CPU per request, cross ÷ local | cross ÷ nginx mTLS |", "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["run"], r["connections"]) for r in rows})
    for run, c in keys:
        by = {r["path"]: r for r in rows if r["run"] == run and r["connections"] == c}
        cpu = {p: served(r) for p, r in by.items()}
        lines.append(f"| {run} | {c} | **{by['cross-node']['rps'] / by['local']['rps']:.2f}** | "
                     f"**{by['cross-node']['rps'] / by['nginx mTLS']['rps']:.2f}** | "
                     f"{by['nginx mTLS']['rps'] / by['nginx plain']['rps']:.2f} | "
                     f"{cpu['cross-node'] / cpu['local']:.2f} | {cpu['cross-node'] / cpu['nginx mTLS']:.2f} |")
    return "\n".join(lines)


def main():
    # A SIGTERM (a profiler's script ending a --hold run) still stops every process this run
    # started, through the finally below.
    def on_term(*_):
        raise SystemExit(143)
    signal.signal(signal.SIGTERM, on_term)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warden", required=True)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--connections", default="50,10", help="wrk connection counts, comma-separated")
    ap.add_argument("--runs", type=int, default=1, help="rounds of every row")
    ap.add_argument("--nginx-workers", type=int, default=2)
    ap.add_argument("--pin", action="store_true",
                    help="servers on CPU 0, wrk on CPU 1 (taskset); default: unpinned")
    ap.add_argument("--hold", type=int, default=0,
                    help="after setup, print the PIDs and URLs and sleep this many seconds (to profile)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    a.warden = os.path.abspath(a.warden)
    if not a.seconds or a.seconds > 120:
        raise SystemExit("--seconds: 1..120")
    conns = [int(c) for c in a.connections.split(",")]
    work = tempfile.mkdtemp(prefix="warden-cluster-path-")
    os.chmod(work, 0o711)
    procs, rows = [], []
    try:
        auth, aep, bep, wgroups = warden_setup(a, work, procs)
        ports, ngroups = nginx_setup(a, work, procs)
        paths = [("local", f"{bep['gateway']}/apps/demo/", auth, wgroups),
                 ("cross-node", f"{aep['gateway']}/apps/demo/", auth, wgroups),
                 ("nginx mTLS", f"http://127.0.0.1:{ports['mtls_front']}/", None, ngroups),
                 ("nginx plain", f"http://127.0.0.1:{ports['plain_front']}/", None, ngroups)]
        if a.hold:
            # The credentials stay in the data dir (mode 0700); a profiler reads them there.
            print(json.dumps({"alpha": wgroups["alpha"][1], "beta": wgroups["beta"][1],
                              "paths": {p[0]: p[1] for p in paths},
                              "users": f"{work}/alpha/demo-users.json"}), flush=True)
            time.sleep(a.hold)
            return
        for run in range(1, a.runs + 1):
            for c in conns:
                for path, url, cred, groups in paths:
                    r = measure(url, cred, c, a.seconds, groups, a.pin)
                    # The three etcd members as one figure.
                    etcd = sum(v for k, v in r["cpu_us"].items() if k.startswith("etcd"))
                    r["cpu_us"] = {k: v for k, v in r["cpu_us"].items() if not k.startswith("etcd")}
                    if path in ("local", "cross-node"):
                        r["cpu_us"]["etcd"] = etcd
                    r.update(run=run, connections=c, path=path)
                    rows.append(r)
                    print(f"run {run} c{c} {path:<12} {r['rps']:>9,.0f} req/s  p50 {r['p50_ms']:.2f} ms  "
                          f"p99 {r['p99_ms']:.2f} ms  non-2xx {r['non2xx']}  errors {r['socket_errors']}  "
                          + "  ".join(f"{k} {v:.1f}µs" for k, v in r["cpu_us"].items()), flush=True)
    finally:
        stop(procs)
        shutil.rmtree(work, ignore_errors=True)
    if not rows:
        return
    with open(os.path.join(a.out, "cluster-path.csv"), "w") as f:
        f.write("run,connections,path,requests_per_sec,p50_ms,p99_ms,non_2xx,socket_errors,cpu_us_per_request\n")
        for r in rows:
            cpu = ";".join(f"{k}={v:.2f}" for k, v in r["cpu_us"].items())
            f.write(f"{r['run']},{r['connections']},{r['path']},{r['rps']:.0f},{r['p50_ms']:.3f},"
                    f"{r['p99_ms']:.3f},{r['non2xx']},{r['socket_errors']},{cpu}\n")
    text = table(rows) + (f"\n\nwrk -t2 -c<connections> -d{a.seconds}s after a 2 s warm-up per row; "
                          "CPU \"path\": the processes on the request's path (etcd apart); "
                          f"{'servers pinned to CPU 0, wrk to CPU 1' if a.pin else 'unpinned'}; "
                          f"nginx worker_processes {a.nginx_workers}\n")
    open(os.path.join(a.out, "cluster-path.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
