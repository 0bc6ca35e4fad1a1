#!/usr/bin/env bash
# Issue 20's push-to-serving figure in one command: `warden push` of a Flask app until the
# gateway serves it, cold (a new build from PyPI), a code change (the serving venv reused) and
# cached (a tree built before), beside a
# fresh venv + pip install + gunicorn by hand (and gunicorn from an existing venv), interleaved
# in one run. Needs network access to PyPI. Writes bench/out/deploy.csv and deploy.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || install_packages python3-venv
cargo build --release --locked -p warden
mkdir -p bench/out
python3 bench/deploy.py --warden target/release/warden --out bench/out "$@"
