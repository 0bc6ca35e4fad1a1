#!/usr/bin/env python3
"""Seed 003 §6.2 side by side: requests through the gateway while agent nodes are killed.

warden: a 3-member etcd, one gateway node (with the API and the checker) and four agent nodes
on loopback addresses, the demo app kept at 12 instances (3 per label of the four demo users);
wrk sends requests with the users' Basic credentials in turn while a killer `kill -9`s a random
agent node every few seconds and starts it again a little later. A second run also kills one
etcd member once. Beside it, what an operator would do without warden: nginx with
`proxy_next_upstream` in front of the same 12 demo-app processes spread statically over four
"nodes" (process groups), killed and restarted on the same schedule. Each also runs once with no
kill, for the throughput to compare with.

Writes bench/out/heal.csv (per second), heal-kills.csv (per kill), heal.md and heal.png.
"""

import argparse
import base64
import csv
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

LABELS = ["UNCLASSIFIED", "CONFIDENTIAL", "SECRET", "TOP SECRET"]
USERS = ["dave", "bob", "alice", "carol"]  # one user per label, in that order
NODES = ["n1", "n2", "n3", "n4"]
PER_LABEL = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what, limit, f):
    end = time.time() + limit
    while time.time() < end:
        try:
            v = f()
            if v:
                return v
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def listening(port, host="127.0.0.1"):
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


class Etcd:
    def __init__(self, work, n=3):
        self.work = work
        ports = [free_port() for _ in range(2 * n)]
        peers = ",".join(f"m{i}=http://127.0.0.1:{ports[2*i+1]}" for i in range(n))
        self.clients = [ports[2 * i] for i in range(n)]
        self.args = []
        for i in range(n):
            c, p = ports[2 * i], ports[2 * i + 1]
            self.args.append([
                "etcd", f"--name=m{i}", f"--data-dir={work}/etcd-m{i}",
                f"--listen-client-urls=http://127.0.0.1:{c}",
                f"--advertise-client-urls=http://127.0.0.1:{c}",
                f"--listen-peer-urls=http://127.0.0.1:{p}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
                f"--initial-cluster={peers}", "--initial-cluster-token=heal",
                "--initial-cluster-state=new", "--log-level=error", "--logger=zap",
            ])
        self.procs = [None] * n
        for i in range(n):
            self.start(i)
        for c in self.clients:
            wait(f"etcd on {c}", 30, lambda c=c: listening(c))

    def start(self, i):
        self.procs[i] = subprocess.Popen(self.args[i], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait()

    def url(self):
        return "etcd://" + ",".join(f"127.0.0.1:{c}" for c in self.clients)

    def stop(self):
        for p in self.procs:
            if p and p.poll() is None:
                p.kill()
                p.wait()


class Warden:
    """One `warden up` process."""

    def __init__(self, binary, work, name, args):
        self.binary, self.dir, self.name, self.args = binary, f"{work}/{name}", name, args
        os.makedirs(self.dir, mode=0o711, exist_ok=True)
        self.proc = None
        self.start()

    def start(self):
        ep = f"{self.dir}/endpoints.json"
        if os.path.exists(ep):
            os.remove(ep)
        log = open(f"{self.dir}/warden.log", "ab")
        env = dict(os.environ, WARDEN_LOG="warn")
        self.proc = subprocess.Popen(
            [self.binary, "up", "--data-dir", self.dir, "--node-name", self.name] + self.args,
            stdout=log, stderr=log, env=env)
        self.endpoints = wait(f"{self.name} to start", 60, lambda: [json.load(open(ep))])[0]

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def api(gw, method, path, body=None):
    req = urllib.request.Request(gw.endpoints["api"] + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    token = open(f"{gw.dir}/admin-token").read().strip()
    req.add_header("authorization", f"Bearer {token}")
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


WRK_LUA = """
local creds = {CREDS}
local i = 0
counts = {}
local threads = {}
function setup(thread) table.insert(threads, thread) end
function request()
  i = i + 1
  local h = {}
  if #creds > 0 then h["Authorization"] = creds[(i % #creds) + 1] end
  return wrk.format("GET", "{PATH}", h)
end
function response(status, headers, body)
  local k = os.time() .. (status < 300 and ":ok" or ":bad")
  counts[k] = (counts[k] or 0) + 1
end
function done(summary, latency, requests)
  local all = {}
  for _, t in ipairs(threads) do
    local c = t:get("counts")
    for k, v in pairs(c) do all[k] = (all[k] or 0) + v end
  end
  local e = summary.errors
  io.write(string.format("ERRORS %d %d %d %d %d\\n", e.connect, e.read, e.write, e.status, e.timeout))
  for k, v in pairs(all) do io.write("COUNT " .. k .. " " .. v .. "\\n") end
end
"""


def run_wrk(url, path, creds, seconds, work, connections):
    lua = WRK_LUA.replace("{CREDS}", "{" + ",".join(json.dumps(c) for c in creds) + "}")
    lua = lua.replace("{PATH}", path)
    script = f"{work}/load.lua"
    open(script, "w").write(lua)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", "-s", script, url],
        capture_output=True, text=True, check=True).stdout
    per_second, errors = {}, {}
    for line in out.splitlines():
        if line.startswith("COUNT "):
            _, k, v = line.split()
            sec, kind = k.split(":")
            per_second.setdefault(int(sec), {"ok": 0, "bad": 0})[kind] += int(v)
        elif line.startswith("ERRORS "):
            c, r, w, s, t = map(int, line.split()[1:])
            errors = {"connect": c, "read": r, "write": w, "timeout": t}
    return per_second, errors


class Sampler(threading.Thread):
    """Polls how many instances serve, ten times a second."""

    def __init__(self, count):
        super().__init__(daemon=True)
        self.count, self.samples, self.stopped = count, [], False

    def run(self):
        while not self.stopped:
            try:
                self.samples.append((time.time(), *self.count()))
            except Exception:
                pass
            time.sleep(0.1)


def killer(schedule, kill, restart, log):
    """Runs the (at, node, back) kills; each node starts again `back` seconds after its kill.
    Logs {node, killed, back} with times."""
    t0 = time.time()
    timers = []
    for at, node, back in schedule:
        while time.time() - t0 < at:
            time.sleep(0.01)
        entry = {"node": node, "killed": time.time()}
        log.append(entry)
        kill(node)

        def back_up(n=node, e=entry):
            restart(n)
            e["back"] = time.time()

        t = threading.Timer(back, back_up)
        t.start()
        timers.append(t)
    for t in timers:
        t.join()


def schedule_of(kills, every, back, seed, start):
    rng = random.Random(seed)
    out, down_until = [], {}
    for k in range(kills):
        at = start + k * every
        alive = [n for n in NODES if down_until.get(n, 0) <= at]
        node = rng.choice(alive)
        down_until[node] = at + back + 1
        out.append((at, node, back))
    return out


def warden_run(args, work, kills, etcd_kill):
    etcd = Etcd(work)
    even = f"{work}/even-load.json"
    # Every node here shares one host, whose load says nothing about any one of them.
    open(even, "w").write('{"memory_used": 0.1, "cpu_busy": 0.1, "load_per_core": 0.1}')
    gw = Warden(args.warden, work, "gw", [
        "--demo", "--store", etcd.url(), "--roles", "gateway,api,checker",
        "--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0"])
    agents = {}
    for i, n in enumerate(NODES):
        agents[n] = Warden(args.warden, work, n, [
            "--store", etcd.url(), "--roles", "agent", "--advertise", f"127.0.0.{i+2}:0",
            "--join-token-file", f"{gw.dir}/join-token", "--load-file", even])
    try:
        api(gw, "POST", "/v1/apps/demo/scale", {"desired": {l: PER_LABEL for l in LABELS}})
        down = set()

        def serving():
            recs = api(gw, "GET", "/v1/instances")
            live = [r for r in recs if r["app"] == "demo" and r.get("kept")
                    and r["state"] == "ready" and r["node"] not in down]
            stale = sum(1 for r in recs if r["node"] in down)
            return len(live), stale, [r["id"] for r in live]

        wait("12 instances ready", 60, lambda: serving()[0] == 12)
        time.sleep(2)
        users = {u["name"]: u["password"] for u in json.load(open(f"{gw.dir}/demo-users.json"))}
        creds = ["Basic " + base64.b64encode(f"{u}:{users[u]}".encode()).decode() for u in USERS]
        sampler = Sampler(serving)
        sampler.start()
        log = []

        def kill(n):
            if n == "etcd":
                etcd.kill(0)
                return
            down.add(n)
            agents[n].kill()

        def restart(n):
            if n == "etcd":
                etcd.start(0)
                return
            agents[n].start()
            down.discard(n)

        sched = schedule_of(kills, args.every, args.back, args.seed, args.warmup)
        if etcd_kill:
            sched.append((args.warmup + kills * args.every / 2 + 1, "etcd", args.back))
            sched.sort()
        k = threading.Thread(target=killer, args=(sched, kill, restart, log))
        began = time.time()
        k.start()
        per_second, errors = run_wrk(gw.endpoints["gateway"], "/apps/demo/", creds,
                                     args.duration, work, args.connections)
        k.join()
        sampler.stopped = True
        sampler.join()
        return began, per_second, errors, sampler.samples, log
    finally:
        for w in list(agents.values()) + [gw]:
            w.stop()
        etcd.stop()


NGINX_CONF = """worker_processes 2;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log error;
worker_rlimit_nofile 20000;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  client_body_temp_path {dir}/nginx-body;
  proxy_temp_path {dir}/nginx-proxy;
  upstream app {{
{servers}
    keepalive 256;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=65535;
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_next_upstream error timeout http_502 http_503;
      proxy_next_upstream_tries 0;
      proxy_connect_timeout 1s;
    }}
  }}
}}
"""


def nginx_run(args, work, kills):
    ports = {n: [free_port() for _ in range(PER_LABEL)] for n in NODES}
    procs = {}

    def start(n):
        procs[n] = []
        for p in ports[n]:
            env = {"PATH": os.environ["PATH"], "PORT": str(p)}
            procs[n].append(subprocess.Popen([args.warden, "demo-app"], env=env,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             start_new_session=True))
        for p in ports[n]:
            wait(f"demo app on {p}", 10, lambda p=p: listening(p))

    def kill(n):
        for pr in procs[n]:
            os.killpg(pr.pid, signal.SIGKILL)
            pr.wait()

    for n in NODES:
        start(n)
    port = free_port()
    servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;"
                        for n in NODES for p in ports[n])
    conf = f"{work}/nginx.conf"
    open(conf, "w").write(NGINX_CONF.format(dir=work, servers=servers, port=port))
    ngx = subprocess.Popen(["nginx", "-e", "stderr", "-g", "daemon off; master_process on; user root;",
                            "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait("nginx", 10, lambda: listening(port))
    try:
        def serving():
            alive = sum(1 for n in NODES for pr in procs[n] if pr.poll() is None)
            return alive, 0, []

        sampler = Sampler(serving)
        sampler.start()
        log = []
        sched = schedule_of(kills, args.every, args.back, args.seed, args.warmup)
        k = threading.Thread(target=killer, args=(sched, kill, start, log))
        began = time.time()
        k.start()
        per_second, errors = run_wrk(f"http://127.0.0.1:{port}", "/", [], args.duration, work,
                                     args.connections)
        k.join()
        sampler.stopped = True
        sampler.join()
        return began, per_second, errors, sampler.samples, log
    finally:
        ngx.send_signal(signal.SIGTERM)
        ngx.wait()
        for n in NODES:
            kill(n)


def kill_figures(log, samples, began):
    """Per kill: seconds until the dead node's records were gone, until a replacement served,
    until 12 served again (None: not within the run)."""
    rows = []
    for e in log:
        if e["node"] == "etcd":
            rows.append({"node": "etcd member", "killed_s": round(e["killed"] - began, 2)})
            continue
        t0 = e["killed"]
        after = [s for s in samples if s[0] >= t0]
        before = [s for s in samples if s[0] < t0]
        ids_before = set(before[-1][3]) if before else set()
        # nginx has no records: its upstream list is static.
        gone = None if not any(s[3] for s in samples) else next(
            (s[0] - t0 for s in after if s[2] == 0), None)
        first_new = next((s[0] - t0 for s in after if set(s[3]) - ids_before), None)
        full = next((s[0] - t0 for s in after if s[1] >= PER_LABEL * len(LABELS)
                     and s[0] - t0 > 0.05), None)
        r = lambda x: None if x is None else round(x, 2)
        rows.append({"node": e["node"], "killed_s": round(t0 - began, 2), "records_gone_s": r(gone),
                     "replacement_serving_s": r(first_new), "back_to_12_s": r(full)})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warden", required=True)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--every", type=float, default=6.0, help="seconds between kills")
    ap.add_argument("--back", type=float, default=3.0, help="seconds a killed node stays down")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--runs", default="warden-calm,warden-kills,warden-kills-etcd,nginx-calm,nginx-kills")
    args = ap.parse_args()
    args.duration = int(args.warmup + args.kills * args.every + 5)
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for run in args.runs.split(","):
        work = tempfile.mkdtemp(prefix=f"warden-heal-{run}-")
        os.chmod(work, 0o711)
        kills = 0 if run.endswith("calm") else args.kills
        print(f"== {run}: {args.duration}s, {kills} kills", flush=True)
        if run.startswith("warden"):
            res = warden_run(args, work, kills, run.endswith("etcd"))
        else:
            res = nginx_run(args, work, kills)
        results[run] = res
        began, per_second, errors, samples, log = res
        ok = sum(v["ok"] for v in per_second.values())
        bad = sum(v["bad"] for v in per_second.values())
        print(f"   {ok} ok, {bad} non-2xx, socket errors {errors}", flush=True)
        shutil.rmtree(work, ignore_errors=True)
    write(args, results)


def write(args, results):
    rows, kill_rows, summary = [], [], []
    for run, (began, per_second, errors, samples, log) in results.items():
        start = int(began)
        for sec in sorted(per_second):
            t = sec - start
            inst = [s[1] for s in samples if int(s[0]) == sec]
            rows.append({"run": run, "t": t, "ok": per_second[sec]["ok"], "bad": per_second[sec]["bad"],
                         "instances_min": min(inst) if inst else ""})
        for k in kill_figures(log, samples, began):
            kill_rows.append({"run": run, **k})
        secs = sorted(per_second)[1:-1]  # whole seconds only
        ok = sum(per_second[s]["ok"] for s in secs)
        bad = sum(v["bad"] for v in per_second.values())
        sock = sum(errors.values())
        summary.append((run, ok / max(len(secs), 1), bad, sock, errors))
    with open(f"{args.out}/heal.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["run", "t", "ok", "bad", "instances_min"])
        w.writeheader()
        w.writerows(rows)
    with open(f"{args.out}/heal-kills.csv", "w", newline="") as f:
        fields = ["run", "node", "killed_s", "records_gone_s", "replacement_serving_s", "back_to_12_s"]
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(kill_rows)
    calm = {r[0].split("-")[0]: r[1] for r in summary if r[0].endswith("calm")}
    with open(f"{args.out}/heal.md", "w") as f:
        f.write("| run | req/s (mean of whole seconds) | vs calm | non-2xx | socket errors |\n")
        f.write("|---|---|---|---|---|\n")
        for run, rps, bad, sock, errors in summary:
            base = calm.get(run.split("-")[0])
            ratio = f"{rps / base:.3f}" if base else ""
            f.write(f"| {run} | {rps:.0f} | {ratio} | {bad} | {sock} {errors if sock else ''} |\n")
        f.write("\n| run | node | killed at s | records gone s | replacement serving s | back to 12 s |\n")
        f.write("|---|---|---|---|---|---|\n")
        for k in kill_rows:
            f.write("| {run} | {node} | {killed_s} | {records_gone_s} | {replacement_serving_s} | {back_to_12_s} |\n"
                    .format(**{x: k.get(x, "") for x in ["run", "node", "killed_s", "records_gone_s",
                                                         "replacement_serving_s", "back_to_12_s"]}))
    plot(args, results)
    print(open(f"{args.out}/heal.md").read())


def plot(args, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    shown = [r for r in ["warden-kills", "warden-kills-etcd", "nginx-kills"] if r in results]
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 3.2 * len(shown)), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], shown):
        began, per_second, errors, samples, log = results[run]
        start = int(began)
        secs = sorted(per_second)
        ax.plot([s - start for s in secs], [per_second[s]["ok"] for s in secs], label="2xx / s")
        ax.plot([s - start for s in secs], [per_second[s]["bad"] for s in secs], "r", label="failed / s")
        ax.set_ylabel("requests / s")
        ax2 = ax.twinx()
        ax2.plot([s[0] - began for s in samples], [s[1] for s in samples], "g", alpha=0.6, label="instances")
        ax2.set_ylim(0, PER_LABEL * len(LABELS) + 2)
        ax2.set_ylabel("instances serving")
        for e in log:
            ax.axvline(e["killed"] - began, color="k", alpha=0.3, linestyle="--")
        ax.set_title(run)
        ax.legend(loc="lower left")
        ax2.legend(loc="lower right")
    axes[-1, 0].set_xlabel("seconds (dashed: a kill -9)")
    fig.tight_layout()
    fig.savefig(f"{args.out}/heal.png", dpi=90)


if __name__ == "__main__":
    main()
