#!/usr/bin/env bash
# Seed 002's experiment in one command: first-request latency through the gateway for the JIT,
# slot-pool and warm-pool start paths (warden restarted for every sample), the agent's start and
# slot preparation times, the bare fork-exec floor, and memory per idle instance. Tables on
# stdout, samples in bench/out/starts.csv. Extra flags go to `warden-bench starts` (for example
# --runs 5 --idle 20 for a quick look, or --idle-only --idle 100 --check to fail if idle
# instances grew past the bounds docs/BENCHMARKS.md records).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked -p warden -p warden-bench
mkdir -p bench/out
target/release/warden-bench starts --warden target/release/warden --out bench/out "$@"
