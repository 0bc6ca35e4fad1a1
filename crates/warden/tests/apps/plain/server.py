"""A dependency-free app: answers JSON with its config var ANSWER, label and user."""
import http.server
import json
import os


class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self):
        body = json.dumps(
            {
                "answer": os.environ.get("ANSWER", "hello from plain"),
                "label": os.environ.get("WARDEN_LABEL"),
                "user": self.headers.get("X-Warden-User"),
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.answer()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.answer()

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
