#!/usr/bin/env python3
"""Memory after connection floods (issue 17 #6): starts `warden up` from BINARY on loopback,
then floods its gateway ROUNDS times with CONNS idle connections that each send half a request
head (so the gateway holds a read buffer for each), holds them, closes them, and reads warden's
resident memory (VmRSS) before, during and after each flood. Bounded: CONNS connections per
round, ROUNDS rounds, loopback only.

usage: bench/memory-flood.py BINARY [CONNS=3000] [ROUNDS=5]
prints one JSON object: rss_mib before, peak and after each round.
"""
import json, os, resource, signal, socket, subprocess, sys, tempfile, time

binary = sys.argv[1]
conns = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0

data = tempfile.mkdtemp(prefix="warden-flood-")
proc = subprocess.Popen(
    [binary, "up", "--data-dir", data + "/d", "--listen", "127.0.0.1:0", "--api-listen",
     "127.0.0.1:0", "--max-connections", str(conns + 100)],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    ep = data + "/d/endpoints.json"
    for _ in range(600):
        if os.path.exists(ep):
            try:
                gateway = json.load(open(ep))["gateway"]
                break
            except ValueError:
                pass
        time.sleep(0.1)
    else:
        sys.exit("warden did not start")
    host, port = gateway.removeprefix("http://").rsplit(":", 1)
    time.sleep(1)
    out = {"binary": binary, "conns": conns, "rounds": rounds,
           "before": round(rss_mib(proc.pid), 1), "peak": [], "after": []}
    for _ in range(rounds):
        socks = []
        for _ in range(conns):
            s = socket.create_connection((host, int(port)))
            s.sendall(b"GET /apps/demo/ HTTP/1.1\r\nHost: a\r\nX-Pad: " + b"p" * 2000)
            socks.append(s)
        time.sleep(2)
        out["peak"].append(round(rss_mib(proc.pid), 1))
        for s in socks:
            s.close()
        time.sleep(3)
        out["after"].append(round(rss_mib(proc.pid), 1))
        out.setdefault("fds_after", []).append(len(os.listdir(f"/proc/{proc.pid}/fd")))
    print(json.dumps(out))
finally:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
