//! `warden-bench`: end-to-end measurements of the real `warden` binary, reported as figures.
//!
//! Owns benchmark drivers only; nothing here is a test and nothing asserts timings. Every load
//! goes to loopback and every loop is bounded in count.
#![forbid(unsafe_code)]

mod apps;
mod cpu;
mod first_request;
mod gateway;
mod idle;
mod relay;
mod starts;
mod tls;
mod wrk;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Benchmarks of warden against its own binary")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Cold (first) and warm (second) request latency of the demo app through the gateway, with
    /// warden restarted on a fresh data dir for every sample.
    FirstRequest {
        /// Samples
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// The warden binary to measure
        #[arg(long, default_value = "target/release/warden")]
        warden: PathBuf,
        /// Directory for the CSV
        #[arg(long, default_value = "bench/out")]
        out: PathBuf,
    },
    /// Seed 001's experiment: authentication and authorisation throughput and mean latency with
    /// wrk at 50..3200 connections, warden beside nginx and haproxy in front of one upstream.
    Gateway(gateway::Args),
    /// Seed 004's experiment: TLS handshake cost (ECDSA and RSA, TLS 1.2 and 1.3, full and
    /// resumed) and sessions under overload, warden with and without handshake admission control
    /// beside nginx.
    Tls(tls::Args),
    /// Seed 002's experiment: end-to-end first-request latency for the JIT, slot-pool and
    /// warm-pool start paths (warden restarted per sample), the agent's start and slot
    /// preparation times, the bare fork-exec floor, and memory per idle instance.
    Starts(starts::Args),
    /// The gateway benchmark's floor: a byte relay doing no HTTP work, one current-thread
    /// runtime per core; started by `gateway`, which measures it beside the peers.
    Relay {
        /// Port to listen on at 127.0.0.1
        #[arg(long)]
        listen: u16,
        /// Port of the upstream at 127.0.0.1
        #[arg(long)]
        upstream: u16,
        /// File of `STATUS NEEDLE` lines: a read holding NEEDLE gets a canned STATUS response
        #[arg(long)]
        refusals: Option<PathBuf>,
    },
    /// The floor of a TLS refusal: refuses every connection with an alert after one read, the
    /// least a TLS server can do; started by `tls --servers refuse-all`.
    TlsRefuser {
        /// Port to listen on at 127.0.0.1
        #[arg(long)]
        listen: u16,
    },
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::FirstRequest { runs, warden, out } => {
            first_request::run(runs.clamp(1, 1000), &warden, &out)
        }
        Cmd::Gateway(args) => gateway::run(&args),
        Cmd::Tls(args) => tls::run(&args),
        Cmd::Starts(args) => starts::run(&args),
        Cmd::Relay {
            listen,
            upstream,
            refusals,
        } => relay::run(listen, upstream, refusals.as_deref()),
        Cmd::TlsRefuser { listen } => tls::refuser::run(listen),
    }
}
