#!/usr/bin/env python3
"""Seed 003 §6.1, extended: the store behind warden's API beside the stores people use.

Each of n turns, run by a pool of k workers: put key test::i = "i", get it, delete it, each
operation retried until it succeeds. Each operation on a new connection (as Cortex's modules
did), and again with one persistent connection per worker. Every system writes each operation
durably before it answers:

  warden-embedded  warden's API (apps: POST, GET, DELETE) on its embedded store (redb, fsync)
  warden-etcd      the same API on a 3-member etcd
  etcd             that 3-member etcd itself (its HTTP/JSON gateway: /v3/kv/put, range, deleterange)
  redis            Redis with appendonly yes, appendfsync always
  postgres         PostgreSQL, a table with a primary key, synchronous_commit on
  sqlite           SQLite, WAL, synchronous=FULL
  http-floor       nginx answering every operation with a constant, storing nothing: the most
                   this HTTP client reaches, the ceiling of every HTTP row (warden, etcd)

Everything runs on loopback on this machine, servers and client sharing its cores, as in the
seed. The client is this one Python program for every system, so its own cost is the same in
every row; absolute figures are the client's floor as much as the server's, the ratios are the
point. Output: CSV (one line per run), a markdown table and a plot.

--standing N first puts N other records that stay (apps, for warden) and are never touched
again, so that each turn runs beside a store that holds something: a write whose cost grows
with the records held shows here and not with an empty store.
"""
import argparse
import base64
import csv
import http.client
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {limit}s")


def retry(op):
    """Runs op until it succeeds (the seed's rule); gives up after 100 tries in a row."""
    for attempt in range(100):
        try:
            return op()
        except Exception:  # noqa: BLE001 - any failure is retried, as in the seed
            time.sleep(min(0.001 * 2**attempt, 0.1))
    raise RuntimeError("an operation failed 100 times in a row")


# --- clients: each has connect() -> conn, and put/get/delete(conn, i) ----------------------


class Http:
    """A JSON-over-HTTP/1.1 client (warden's API, etcd's gateway)."""

    def __init__(self, port, headers):
        self.port, self.headers = port, headers

    def connect(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def call(self, conn, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers=self.headers)
        r = conn.getresponse()
        payload = r.read()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {payload[:200]!r}")
        return payload


class WardenApi(Http):
    def __init__(self, port, token):
        super().__init__(port, {"authorization": f"Bearer {token}", "content-type": "application/json"})

    def put(self, c, i):
        self.call(c, "POST", "/v1/apps", {"name": f"test-{i}", "command": ["true"]})

    def get(self, c, i):
        self.call(c, "GET", f"/v1/apps/test-{i}")

    def delete(self, c, i):
        self.call(c, "DELETE", f"/v1/apps/test-{i}")


def b64(s):
    return base64.b64encode(s.encode()).decode()


class EtcdGateway(Http):
    def __init__(self, port):
        super().__init__(port, {"content-type": "application/json"})

    def put(self, c, i):
        self.call(c, "POST", "/v3/kv/put", {"key": b64(f"test::{i}"), "value": b64(str(i))})

    def get(self, c, i):
        self.call(c, "POST", "/v3/kv/range", {"key": b64(f"test::{i}")})

    def delete(self, c, i):
        self.call(c, "POST", "/v3/kv/deleterange", {"key": b64(f"test::{i}")})


class Floor(Http):
    def __init__(self, port):
        super().__init__(port, {"content-type": "application/json"})

    def put(self, c, i):
        self.call(c, "POST", f"/kv/test::{i}", {"value": str(i)})

    def get(self, c, i):
        self.call(c, "GET", f"/kv/test::{i}")

    def delete(self, c, i):
        self.call(c, "DELETE", f"/kv/test::{i}")


class Redis:
    def __init__(self, port):
        self.port = port

    def connect(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s.makefile("rwb")

    @staticmethod
    def command(f, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a.encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        f.write(out)
        f.flush()
        line = f.readline()
        if line.startswith(b"-"):
            raise RuntimeError(line.decode())
        if line.startswith(b"$") and not line.startswith(b"$-1"):
            f.read(int(line[1:]) + 2)

    def put(self, f, i):
        self.command(f, "SET", f"test::{i}", str(i))

    def get(self, f, i):
        self.command(f, "GET", f"test::{i}")

    def delete(self, f, i):
        self.command(f, "DEL", f"test::{i}")


class Postgres:
    def __init__(self, port):
        import psycopg2  # noqa: PLC0415 - installed by store.sh

        self.psycopg2, self.port = psycopg2, port

    def connect(self):
        c = self.psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        c.autocommit = True
        return c

    def run(self, c, sql, args):
        with c.cursor() as cur:
            cur.execute(sql, args)
            if cur.description:
                cur.fetchall()

    def put(self, c, i):
        self.run(c, "INSERT INTO kv VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = excluded.v", (f"test::{i}", str(i)))

    def get(self, c, i):
        self.run(c, "SELECT v FROM kv WHERE k = %s", (f"test::{i}",))

    def delete(self, c, i):
        self.run(c, "DELETE FROM kv WHERE k = %s", (f"test::{i}",))


class Sqlite:
    def __init__(self, path):
        self.path = path

    def connect(self):
        c = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        c.execute("PRAGMA synchronous=FULL")
        return c

    def put(self, c, i):
        c.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (f"test::{i}", str(i)))

    def get(self, c, i):
        c.execute("SELECT v FROM kv WHERE k = ?", (f"test::{i}",)).fetchall()

    def delete(self, c, i):
        c.execute("DELETE FROM kv WHERE k = ?", (f"test::{i}",))


def close(conn):
    try:
        conn.close()
    except Exception:  # noqa: BLE001
        pass


TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(roots):
    """CPU seconds used so far by the processes `roots` and every descendant (live ones, and
    the reaped ones counted in their parents)."""
    parent, times = {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(pid)] = int(fields[1])
        times[int(pid)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    wanted = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, pp in parent.items():
            if pp in wanted and pid not in wanted:
                wanted.add(pid)
                changed = True
    return sum(times.get(p, 0) for p in wanted) / TICK


def run(client, turns, workers, persistent):
    """Seconds for `turns` turns on `workers` workers."""
    local = threading.local()

    def conn():
        if not persistent:
            return client.connect()
        if getattr(local, "conn", None) is None:
            local.conn = client.connect()
        return local.conn

    def op(fn, i):
        def once():
            c = conn()
            try:
                fn(c, i)
            except Exception:
                if persistent:
                    close(local.conn)
                    local.conn = None
                raise
            finally:
                if not persistent:
                    close(c)

        retry(once)

    def turn(i):
        op(client.put, i)
        op(client.get, i)
        op(client.delete, i)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(turn, range(turns)))
    return time.perf_counter() - start


def stand(client, n):
    """Puts `n` records that stay for the whole run, on 10 workers with a connection each."""
    local = threading.local()

    def put(i):
        def once():
            if getattr(local, "conn", None) is None:
                local.conn = client.connect()
            try:
                client.put(local.conn, i)
            except Exception:
                close(local.conn)
                local.conn = None
                raise

        retry(once)

    with ThreadPoolExecutor(max_workers=10) as pool:
        list(pool.map(put, range(STANDING_BASE, STANDING_BASE + n)))


# Standing records' numbers: far past any turn's.
STANDING_BASE = 10_000_000


# --- servers: each a context that yields a client -----------------------------------------


class Servers:
    def __init__(self, warden, work):
        self.warden, self.work, self.procs = warden, work, []

    def spawn(self, args, **kw):
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []

    def etcd(self, n=3):
        d = tempfile.mkdtemp(dir=self.work)
        ports = [free_port() for _ in range(2 * n)]
        peers = ",".join(f"m{i}=http://127.0.0.1:{ports[2 * i + 1]}" for i in range(n))
        for i in range(n):
            c, p = ports[2 * i], ports[2 * i + 1]
            self.spawn([
                "etcd", f"--name=m{i}", f"--data-dir={d}/m{i}",
                f"--listen-client-urls=http://127.0.0.1:{c}", f"--advertise-client-urls=http://127.0.0.1:{c}",
                f"--listen-peer-urls=http://127.0.0.1:{p}", f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
                f"--initial-cluster={peers}", f"--initial-cluster-token=bench-{ports[0]}",
                "--initial-cluster-state=new", "--log-level=error", "--logger=zap",
            ])
        clients = [ports[2 * i] for i in range(n)]
        for c in clients:
            wait_port(c)
        # A write through the gateway succeeds once a leader is elected.
        retry(lambda: EtcdGateway(clients[0]).put(EtcdGateway(clients[0]).connect(), "warmup"))
        return clients

    def warden_up(self, store_args):
        d = tempfile.mkdtemp(dir=self.work)
        self.spawn([self.warden, "up", "--data-dir", f"{d}/data", "--listen", "127.0.0.1:0",
                    "--api-listen", "127.0.0.1:0", *store_args],
                   env={**os.environ, "WARDEN_LOG": "warn"})
        ep = f"{d}/data/endpoints.json"
        deadline = time.time() + 60
        while not os.path.exists(ep) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)
        api = json.load(open(ep))["api"]
        token = open(f"{d}/data/admin-token").read().strip()
        return WardenApi(int(api.rsplit(":", 1)[1]), token)

    def start(self, system):
        if system == "warden-embedded":
            return self.warden_up([])
        if system == "warden-etcd":
            clients = self.etcd()
            url = "etcd://" + ",".join(f"127.0.0.1:{c}" for c in clients)
            return self.warden_up(["--store", url])
        if system == "etcd":
            return EtcdGateway(self.etcd()[0])
        if system == "redis":
            port, d = free_port(), tempfile.mkdtemp(dir=self.work)
            self.spawn(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
                        "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                        "--maxclients", "10000"])
            wait_port(port)
            return Redis(port)
        if system == "postgres":
            return self.postgres()
        if system == "http-floor":
            d, port = tempfile.mkdtemp(dir=self.work), free_port()
            with open(f"{d}/nginx.conf", "w") as f:
                f.write(f"daemon off; pid {d}/pid; error_log {d}/error.log; worker_processes 1;"
                        f"events {{}} http {{ access_log off; server {{ listen 127.0.0.1:{port};"
                        f" keepalive_requests 1000000; location / {{ return 200 '{{}}'; }} }} }}")
            self.spawn(["nginx", "-c", f"{d}/nginx.conf", "-p", d])
            wait_port(port)
            return Floor(port)
        if system == "sqlite":
            path = os.path.join(tempfile.mkdtemp(dir=self.work), "kv.db")
            c = sqlite3.connect(path)
            c.execute("PRAGMA journal_mode=WAL")
            c.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)")
            c.commit()
            c.close()
            return Sqlite(path)
        raise ValueError(system)

    def postgres(self):
        d = tempfile.mkdtemp(dir=self.work)
        os.chmod(d, 0o777)
        data, port = f"{d}/pg", free_port()
        as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_pg, "initdb", "-D", data, "-A", "trust", "-U", "postgres"],
                       check=True, stdout=subprocess.DEVNULL)
        self.spawn([*as_pg, "postgres", "-D", data, "-p", str(port), "-k", d,
                    "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300",
                    "-c", "synchronous_commit=on", "-c", "fsync=on"])
        wait_port(port)
        pg = Postgres(port)
        c = retry(pg.connect)
        pg.run(c, "CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT)", ())
        c.close()
        return pg


SYSTEMS = ["warden-embedded", "warden-etcd", "etcd", "redis", "postgres", "sqlite", "http-floor"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warden", required=True)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--workers", default="10,100")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--standing", type=int, default=0,
                    help="records put before the turns and kept (default 0)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="warden-store-bench")
    os.chmod(work, 0o755)
    rows = []
    try:
        for system in args.systems.split(","):
            servers = Servers(args.warden, work)
            try:
                client = servers.start(system)
                stand(client, args.standing)
                for persistent in (False, True):
                    for k in [int(x) for x in args.workers.split(",")]:
                        for rnd in range(args.rounds):
                            roots = [p.pid for p in servers.procs]
                            cpu = tree_cpu(roots)
                            secs = run(client, args.turns, k, persistent)
                            cpu = tree_cpu(roots) - cpu
                            ops = 3 * args.turns / secs
                            us = 1e6 * cpu / (3 * args.turns)
                            mode = "persistent" if persistent else "new-connection"
                            rows.append([system, mode, k, rnd, f"{secs:.3f}", f"{ops:.0f}", f"{us:.0f}"])
                            print(f"{system:16} {mode:14} k={k:<4} round {rnd}: {ops:8.0f} ops/s,"
                                  f" server CPU {us:5.0f} us/op", flush=True)
            finally:
                servers.stop_all()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(f"{args.out}/store.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "mode", "k", "round", "seconds", "ops_per_s", "server_cpu_us_per_op"])
        w.writerows(rows)
    report(rows, args, f"{args.out}/store.md")
    plot(rows, f"{args.out}/store.png")


def medians(rows, column=5):
    cells = {}
    for row in rows:
        cells.setdefault((row[0], row[1], row[2]), []).append(float(row[column]))
    return {c: statistics.median(v) for c, v in cells.items()}


def report(rows, args, path):
    m = medians(rows)
    modes = ["new-connection", "persistent"]
    ks = sorted({k for (_, _, k) in m})
    systems = [s for s in SYSTEMS if any(c[0] == s for c in m)]
    lines = [f"{args.turns} turns (put, get, delete: {3 * args.turns} operations) per run, "
             f"{args.standing} standing records, "
             f"median of {args.rounds} runs, operations per second.", ""]
    head = "| system | " + " | ".join(f"{mode} k={k}" for mode in modes for k in ks) + " |"
    lines += [head, "|" + "---|" * (1 + len(modes) * len(ks))]
    for s in systems:
        cells = [f"{m.get((s, mode, k), 0):.0f}" for mode in modes for k in ks]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    for peer in ["redis", "etcd", "http-floor"]:
        if "warden-embedded" in systems and peer in systems:
            cells = []
            for mode in modes:
                for k in ks:
                    w, p = m.get(("warden-embedded", mode, k)), m.get((peer, mode, k))
                    cells.append(f"{w / p:.2f}x" if w and p else "-")
            lines.append(f"| warden-embedded / {peer} | " + " | ".join(cells) + " |")
    cpu = medians(rows, 6)
    lines += ["", "Server CPU time per operation (all the system's processes, user + system), "
              "microseconds, median:", "", head, "|" + "---|" * (1 + len(modes) * len(ks))]
    for s in systems:
        cells = [f"{cpu.get((s, mode, k), 0):.0f}" for mode in modes for k in ks]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(rows, path):
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    m = medians(rows)
    systems = [s for s in SYSTEMS if any(c[0] == s for c in m)]
    cells = sorted({(mode, k) for (_, mode, k) in m}, key=lambda c: (c[0], c[1]))
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(systems)
    for j, s in enumerate(systems):
        ax.bar([i + j * width for i in range(len(cells))], [m.get((s, mode, k), 0) for mode, k in cells],
               width, label=s)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cells))])
    ax.set_xticklabels([f"{mode}\nk={k}" for mode, k in cells])
    ax.set_ylabel("operations per second (durable)")
    ax.set_title("put/get/delete turns, seed 003 §6.1 (higher is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
