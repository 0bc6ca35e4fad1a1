#!/usr/bin/env python3
"""Push to serving (issue 20): how long from `warden push` of a Flask app (served by gunicorn)
until the gateway answers with the new code, cold (a new app: a build, pip downloading from
PyPI), a code change (one line, the same requirements: the build starts from the serving
release's venv and installs nothing) and cached (a tree built before: no build), beside the floor an
operator gets by hand on the same machine in the same run: a fresh virtual environment, `pip
install` of the same requirements, gunicorn started and answering (cold), and gunicorn started
from the existing environment (warm). Docker would be the usual peer, but this machine has no
Docker daemon; the hand-made floor is what Docker's build and run would add layers to.

warden's figure includes what the floor does not: the upload, the sandboxed build, the trial
instance, the rollout with make-before-break, authentication at the gateway.

Writes bench/out/deploy.csv and bench/out/deploy.md.
"""

import argparse
import base64
import csv
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

APP = os.path.join(os.path.dirname(__file__), "..", "crates", "warden", "tests", "apps", "flask")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, auth=None):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.read().decode()


def until_answer(url, want, auth=None, limit=300):
    end = time.time() + limit
    while time.time() < end:
        try:
            if json.loads(get(url, auth)).get("answer") == want:
                return
        except Exception:
            pass
        time.sleep(0.02)
    raise SystemExit(f"{url} never answered {want!r}")


def tree(answer):
    d = tempfile.mkdtemp(prefix="warden-deploy-")
    for name in ("app.py", "requirements.txt", "Procfile", ".gitignore"):
        shutil.copy(os.path.join(APP, name), d)
    with open(os.path.join(d, "answer.txt"), "w") as f:
        f.write(answer)
    return d


def warden_run(binary, rnd):
    data = tempfile.mkdtemp(prefix="warden-bench-")
    port, api = free_port(), free_port()
    up = subprocess.Popen(
        [binary, "up", "--demo", "--data-dir", data, "--listen", f"127.0.0.1:{port}",
         "--api-listen", f"127.0.0.1:{api}", "--tls-listen", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        until = time.time() + 60
        while not os.path.exists(os.path.join(data, "demo-users.json")) and time.time() < until:
            time.sleep(0.1)
        time.sleep(1)
        users = json.load(open(os.path.join(data, "demo-users.json")))
        alice = next(u for u in users if u["name"] == "alice")
        auth = f"alice:{alice['password']}"
        url = f"http://127.0.0.1:{port}/apps/shop/"
        env = dict(os.environ, WARDEN_API=f"http://127.0.0.1:{api}",
                   WARDEN_TOKEN=open(os.path.join(data, "admin-token")).read().strip())

        def push(d, want):
            t0 = time.time()
            subprocess.run([binary, "push", "shop", d], env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            until_answer(url, want, auth)
            return time.time() - t0

        a, b = f"round {rnd} a", f"round {rnd} b"
        rows.append(("warden", "cold", rnd, push(tree(a), a)))
        # One line changed (the answer), the same requirements: the build starts from the
        # serving release's venv and installs nothing.
        rows.append(("warden", "change", rnd, push(tree(b), b)))
        # The first tree again: its slug is built, so the push only tries and rolls out.
        rows.append(("warden", "cached", rnd, push(tree(a), a)))
    finally:
        up.terminate()
        up.wait(timeout=60)
    return rows


def serve_once(d, port, want):
    """gunicorn from the venv in `d`, until it answers `want`; then stopped."""
    g = subprocess.Popen([os.path.join(d, ".venv/bin/gunicorn"), "--bind", f"127.0.0.1:{port}",
                          "--workers", "2", "app:app"], cwd=d,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until_answer(f"http://127.0.0.1:{port}/", want)
    finally:
        g.terminate()
        g.wait()


def floor_runs(rounds):
    rows = []
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
    for i in range(rounds):
        d = tree(f"floor {i}")
        port = free_port()
        t0 = time.time()
        subprocess.run([python, "-m", "venv", os.path.join(d, ".venv")], check=True)
        subprocess.run([os.path.join(d, ".venv/bin/pip"), "install", "--disable-pip-version-check",
                        "--no-input", "--no-cache-dir", "-r", os.path.join(d, "requirements.txt")],
                       check=True, stdout=subprocess.DEVNULL)
        serve_once(d, port, f"floor {i}")
        rows.append(("floor", "cold", i, time.time() - t0))
        # A line changed by hand: the same venv, gunicorn started again on the new code.
        with open(os.path.join(d, "answer.txt"), "w") as f:
            f.write(f"floor {i} b")
        t0 = time.time()
        serve_once(d, port, f"floor {i} b")
        rows.append(("floor", "change", i, time.time() - t0))
        t0 = time.time()
        serve_once(d, port, f"floor {i} b")
        rows.append(("floor", "cached", i, time.time() - t0))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warden", default="target/release/warden")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/out")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    # Interleaved, so that PyPI's and the machine's moods fall on both alike.
    for r in range(a.rounds):
        rows += [(w, k, r, s) for (w, k, _, s) in floor_runs(1)]
        rows += warden_run(a.warden, r)
    with open(os.path.join(a.out, "deploy.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["who", "path", "round", "seconds"])
        w.writerows(rows)
    med = {}
    for who in ("warden", "floor"):
        for path in ("cold", "change", "cached"):
            xs = [s for (w, p, _, s) in rows if w == who and p == path]
            med[(who, path)] = (statistics.median(xs), min(xs), max(xs))
    lines = ["| path | warden push → serving | floor by hand | ratio |", "|---|---|---|---|"]
    for path, floor_name in (("cold", "venv + pip install + gunicorn"),
                             ("change", "gunicorn again from the venv"),
                             ("cached", "gunicorn from the venv")):
        w, f = med[("warden", path)], med[("floor", path)]
        lines.append(f"| {path} | {w[0]:.2f} s ({w[1]:.2f}–{w[2]:.2f}) | {f[0]:.2f} s ({f[1]:.2f}–{f[2]:.2f}), {floor_name} | {w[0] / f[0]:.2f}× |")
    c, k = med[("warden", "change")][0], med[("warden", "cold")][0]
    text = "\n".join(lines) + f"\n\nmedian (min–max) of {a.rounds} rounds; a code change takes {c / k:.2f} of a cold push\n"
    open(os.path.join(a.out, "deploy.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
