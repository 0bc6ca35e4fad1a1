"""A notes app as a new user would write it: Flask, SQLAlchemy and psycopg2 against
DATABASE_URL, a connection per request. It never mentions labels: warden's database shows
each instance only the rows its label may read, and stamps every row it writes."""
import os

from flask import Flask, jsonify, request
from sqlalchemy import create_engine, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from models import Note

app = Flask(__name__)
# No client-side pool: every request connects, as many small apps do.
engine = create_engine(os.environ["DATABASE_URL"], poolclass=NullPool)


@app.get("/")
def index():
    with Session(engine) as s:
        notes = [n.body for n in s.scalars(select(Note).order_by(Note.id))]
    return jsonify(notes=notes, label=os.environ.get("WARDEN_LABEL"))


@app.post("/")
def add():
    body = request.get_data(as_text=True)
    with Session(engine) as s:
        s.add(Note(body=body))
        s.commit()
    return jsonify(added=body), 201


@app.post("/public")
def publish():
    """Writes a note down to the label the app was certified to declassify to: only an app an
    admin marked (`--declassify-to`) may, and warden records each such write."""
    body = request.get_data(as_text=True)
    with Session(engine) as s:
        s.execute(
            text("INSERT INTO notes (body, warden_label) VALUES (:b, warden.declassify_to())"),
            {"b": body},
        )
        s.commit()
    return jsonify(published=body), 201


@app.errorhandler(SQLAlchemyError)
def database_error(e):
    return jsonify(error=str(e.orig if hasattr(e, "orig") and e.orig else e)), 503


@app.get("/healthz")
def healthz():
    return "ok"
