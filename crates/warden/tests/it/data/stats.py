# A declassifier's app with nothing but Python's standard library and psql: GET /?add=TEXT
# writes a note at the instance's label, GET /?down=TEXT writes one at the label the app may
# declassify to (warden.declassify_to(), which fails unless an admin marked the app), GET /
# lists the notes this instance may read.
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


class Stats(BaseHTTPRequestHandler):
    def do_GET(self):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        if "add" in q:
            rc, out, err = psql("INSERT INTO notes (body) VALUES (:'body');", body=q["add"][0])
        elif "down" in q:
            rc, out, err = psql(
                "INSERT INTO notes (body, warden_label) VALUES (:'body', warden.declassify_to());",
                body=q["down"][0],
            )
        else:
            rc, out, err = psql("SELECT body FROM notes ORDER BY id;")
        if rc != 0:
            return self.reply(500, {"error": err})
        return self.reply(200, {"notes": [l for l in out.splitlines() if l]})

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Stats).serve_forever()
