#!/usr/bin/env python3
"""Acknowledged writes across kill -9, warden beside etcd (issue 17): WRITERS concurrent clients
write new records as fast as each gets answers, the server is killed with SIGKILL at a random
moment, restarted on the same data, and every write it acknowledged is looked for. Prints,
per server and round: writes acknowledged, acknowledged-but-missing (must be 0) and
acknowledged writes per second; then the totals. Loopback only; every loop is bounded in count
and time.

warden's writes are `POST /v1/apps` (one app each, through the API as `warden apps create`
does); etcd's are `PUT` of one key each through its v3 JSON gateway, both over keep-alive HTTP.

usage: bench/ack-writes.py WARDEN_BINARY [WRITERS=8] [ROUNDS=5] [SECONDS=3]
needs: etcd (Debian: etcd-server)
"""
import base64, http.client, json, os, random, shutil, signal, socket, subprocess, sys
import tempfile, threading, time

warden = sys.argv[1]
writers = int(sys.argv[2]) if len(sys.argv) > 2 else 8
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 3.0
MAX_WRITES = 200_000  # per writer and round


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


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


class Warden:
    name = "warden"

    def __init__(self, d):
        self.dir = d

    def start(self):
        ep = os.path.join(self.dir, "endpoints.json")
        if os.path.exists(ep):
            os.remove(ep)
        self.proc = subprocess.Popen(
            [warden, "up", "--data-dir", self.dir, "--listen", "127.0.0.1:0",
             "--api-listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        e = wait_for(lambda: json.load(open(ep)), "warden up")
        self.host = e["api"].removeprefix("http://")
        self.token = open(os.path.join(self.dir, "admin-token")).read().strip()

    def write(self, conn, key):
        body = json.dumps({"name": key, "command": ["/bin/true"]})
        conn.request("POST", "/v1/apps", body, {"authorization": f"Bearer {self.token}",
                                                "content-type": "application/json"})
        r = conn.getresponse()
        r.read()
        return r.status == 201

    def present(self):
        c = http.client.HTTPConnection(self.host, timeout=30)
        c.request("GET", "/v1/apps", headers={"authorization": f"Bearer {self.token}"})
        return {a["name"] for a in json.loads(c.getresponse().read())}


class Etcd:
    name = "etcd"

    def __init__(self, d):
        self.dir = d
        self.client, self.peer = free_port(), free_port()

    def start(self):
        c, p = f"http://127.0.0.1:{self.client}", f"http://127.0.0.1:{self.peer}"
        self.proc = subprocess.Popen(
            ["etcd", "--name", "bench", "--data-dir", self.dir, "--listen-client-urls", c,
             "--advertise-client-urls", c, "--listen-peer-urls", p,
             "--initial-advertise-peer-urls", p, "--initial-cluster", f"bench={p}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.host = f"127.0.0.1:{self.client}"

        def healthy():
            h = http.client.HTTPConnection(self.host, timeout=2)
            h.request("GET", "/health")
            return json.loads(h.getresponse().read()).get("health") == "true"
        wait_for(healthy, "etcd")

    def write(self, conn, key):
        b = lambda s: base64.b64encode(s.encode()).decode()
        conn.request("POST", "/v3/kv/put", json.dumps({"key": b("w/" + key), "value": b(key)}))
        r = conn.getresponse()
        r.read()
        return r.status == 200

    def present(self):
        b = lambda s: base64.b64encode(s.encode()).decode()
        c = http.client.HTTPConnection(self.host, timeout=30)
        c.request("POST", "/v3/kv/range",
                  json.dumps({"key": b("w/"), "range_end": b("w0"), "keys_only": True}))
        kvs = json.loads(c.getresponse().read()).get("kvs", [])
        return {base64.b64decode(kv["key"]).decode()[2:] for kv in kvs}


def round_of(server, r):
    server.start()
    acked = [[] for _ in range(writers)]
    stop = threading.Event()

    def writer(i):
        conn = http.client.HTTPConnection(server.host, timeout=10)
        for n in range(MAX_WRITES):
            if stop.is_set():
                return
            key = f"r{r}-w{i}-{n}"
            try:
                if server.write(conn, key):
                    acked[i].append(key)
            except Exception:
                return  # the server is gone
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    began = time.time()
    for t in threads:
        t.start()
    time.sleep(random.uniform(seconds / 3, seconds))
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    took = time.time() - began
    stop.set()
    for t in threads:
        t.join(timeout=30)
    server.start()
    present = server.present()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(timeout=30)
    all_acked = [k for a in acked for k in a]
    missing = [k for k in all_acked if k not in present]
    return len(all_acked), len(missing), len(all_acked) / took


def main():
    random.seed(int(os.environ.get("SEED", "1")))
    totals = {}
    for make in (Warden, Etcd):
        d = tempfile.mkdtemp(prefix="ack-writes-")
        server = make(os.path.join(d, "data"))
        acked = missing = 0
        rates = []
        for r in range(rounds):
            a, m, rate = round_of(server, r)
            acked, missing = acked + a, missing + m
            rates.append(rate)
            print(f"{server.name} round {r}: {a} acknowledged, {m} missing, {rate:.0f} acknowledged writes/s", flush=True)
        totals[server.name] = (acked, missing, sorted(rates)[len(rates) // 2])
        shutil.rmtree(d, ignore_errors=True)
    for name, (a, m, rate) in totals.items():
        print(f"{name}: {a} acknowledged over {rounds} kills, {m} missing, median {rate:.0f} acknowledged writes/s")


main()
