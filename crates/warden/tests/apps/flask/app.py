"""A Flask app as a new user would write it, served by gunicorn (see Procfile)."""
import os
import pathlib

from flask import Flask, jsonify, request

app = Flask(__name__)
HERE = pathlib.Path(__file__).parent


@app.route("/", methods=["GET", "POST"])
def index():
    answer_file = HERE / "answer.txt"
    default = answer_file.read_text().strip() if answer_file.exists() else "hello from flask"
    return jsonify(
        answer=os.environ.get("ANSWER", default),
        label=os.environ.get("WARDEN_LABEL"),
        user=request.headers.get("X-Warden-User"),
    )


@app.route("/healthz")
def healthz():
    return "ok"
