# A notes app with nothing but Python's standard library and psql: GET /?add=TEXT writes a
# note, GET / lists the notes this instance may read, GET /env shows what it was given.
import json
import os
import subprocess
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

PSQL = "/usr/lib/postgresql/15/bin/psql"


def psql(sql, **vars):
    args = [PSQL, os.environ["DATABASE_URL"], "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"]
    for k, v in vars.items():
        args += ["-v", f"{k}={v}"]
    p = subprocess.run(args, input=sql, capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


class Notes(BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(url.query)
        if url.path.endswith("/env"):
            body = {k: os.environ.get(k) for k in ("DATABASE_URL", "PGHOST", "PGDATABASE")}
            body["PGPASSWORD"] = os.environ.get("PGPASSWORD")
            return self.reply(200, body)
        if url.path.endswith("/taint"):
            # Says it read something secret: warden must not let it keep its connections.
            return self.reply(200, {"pid": os.getpid()}, [("X-Warden-Taint", "S")])
        if "add" in q:
            rc, out, err = psql("INSERT INTO notes (body) VALUES (:'body');", body=q["add"][0])
        else:
            rc, out, err = psql("SELECT body FROM notes ORDER BY id;")
        if rc != 0:
            return self.reply(500, {"error": err})
        return self.reply(200, {"notes": [l for l in out.splitlines() if l]})

    def reply(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Notes).serve_forever()
