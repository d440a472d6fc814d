//! Scale benchmark (issue 7): how fast and how cheaply N PyTorchJobs get their PodGroups, on
//! fresh control planes started by `tests/cluster/start.sh`, side by side with
//!   * the limit: a bare client on the same kube client stack writing the same PodGroups
//!     (server-side apply, the same body, owned by the jobs) with the controller's concurrency;
//!   * training-operator v1.9 with `--gang-scheduler-name=scheduler-plugins`.
//!
//! ```sh
//! cargo build --release            # the controller under test: target/release/podgroup-sync
//! cargo bench --bench scale -- [--jobs N] [--namespaces M] [--concurrency C]
//!                              [--skip-training-operator] [--out DIR]
//! ```
//! (`bench/run.sh` does both and draws the plots.) Run by `cargo test --all-targets` (no
//! `--bench` argument) it prints one line and exits: it is not a test.
//!
//! Phases, each control plane fresh and stopped afterwards:
//!   1. bare client: (a) burst — N jobs created at once (`--creators` in flight) and each job's
//!      PodGroup applied as soon as its create response arrives (C in flight): an ideal
//!      controller with zero watch latency; (b) backlog — the PodGroups deleted, then the N
//!      PodGroups applied again from the known jobs (C in flight): the pure write limit.
//!   2. podgroup-sync: (a) burst — the release binary runs, N jobs created at once; (b) restart —
//!      SIGTERM, start again: time to /readyz and to every job reconciled, writes during it
//!      (must be 0); (c) backlog — stopped, PodGroups deleted, started: time to all PodGroups.
//!   3. training-operator: burst on the same N jobs; its time to PodGroups, then until it
//!      created every pod and service (its full cost), RSS, CPU and API requests.
//!
//! With `--floor` the podgroup-sync phases run the floor controller instead (`floor.rs`: a plain
//! kube-runtime controller writing the same PodGroups, the benchmark's own binary started as
//! `floor-controller`): what the client stack alone spends on the same work.
//!
//! Correctness (every job gets a correct PodGroup; 0 PodGroup writes on restart) makes the run
//! fail; timing never does. Every wait is bounded.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

pub(crate) type BoxErr = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Res<T> = Result<T, BoxErr>;

pub(crate) fn err(msg: impl Into<String>) -> BoxErr {
    msg.into().into()
}

macro_rules! log {
    ($($t:tt)*) => { log_line(format!($($t)*)) };
}

// The modules share one namespace: each brings the others' items in with `use crate::*`.
// The contenders (bare, ours, training_operator) add methods to `Bench`; `report` writes the
// summary `Bench` built.
// The integration tests' kit: namespaces and metric parsing are written once.
#[path = "../../tests/support/mod.rs"]
mod support;

mod bare;
mod bench;
mod cli;
mod floor;
mod matrix;
mod ours;
mod phase;
mod procs;
mod report;
mod requests;
mod training_operator;
mod util;
mod window;
mod workload;

use bench::*;
use cli::*;
use matrix::*;
use phase::*;
use procs::*;
use report::*;
use requests::*;
use util::*;
use window::*;
use workload::*;

/// The run's output directory (`--out`, else target/bench/scale-<unix time>), created.
fn out_dir(cli: &Cli, started: u64) -> Res<std::path::PathBuf> {
    let out = cli
        .out
        .clone()
        .unwrap_or_else(|| root().join(format!("target/bench/scale-{started}")));
    std::fs::create_dir_all(&out)?;
    Ok(out.canonicalize()?)
}

async fn run(cli: Cli) -> Res<Bench> {
    let started = unix_now();
    let out = out_dir(&cli, started)?;
    let controller_bin = match &cli.controller_bin {
        _ if cli.floor => std::env::current_exe()?,
        Some(p) => p.clone(),
        None => {
            let exe = std::env::current_exe()?;
            exe.parent()
                .and_then(Path::parent)
                .map(|d| d.join("podgroup-sync"))
                .ok_or_else(|| err("cannot locate target/release"))?
        }
    };
    if !controller_bin.is_file() {
        return Err(err(format!(
            "{} is missing: run `cargo build --release` first",
            controller_bin.display()
        )));
    }
    let mut notes = Vec::new();
    if cli.controller_bin.is_none() && !cli.floor {
        // A stale release binary measures old code: say so (bench/run.sh always builds first).
        let newest_src = sh(&format!(
            "find '{}/src' '{}/Cargo.toml' -type f -printf '%T@\\n' | sort -n | tail -1",
            root().display(),
            root().display()
        ));
        let bin_mtime = sh(&format!("stat -c %Y '{}'", controller_bin.display()));
        if let (Ok(s), Ok(b)) = (newest_src.parse::<f64>(), bin_mtime.parse::<f64>())
            && s > b + 1.0
        {
            let msg = format!(
                "{} is older than src/ (run `cargo build --release` first; bench/run.sh does)",
                controller_bin.display()
            );
            log!("WARNING: {msg}");
            notes.push(msg);
        }
    }
    let load_start = loadavg();
    log!(
        "output in {}; controller {}; load average {load_start}",
        out.display(),
        controller_bin.display()
    );
    let mut b = Bench {
        cli: cli.clone(),
        out: out.clone(),
        controller_bin,
        failures: Vec::new(),
        notes,
        phases: Vec::new(),
        to_status: String::new(),
        to_flags: Vec::new(),
        apiserver: String::new(),
    };
    let machine = machine();
    if !cli.skip_bare
        && let Err(e) = b.bare().await
    {
        b.fail(format!("bare-client phase: {e}"));
    }
    if !cli.skip_podgroup_sync
        && let Err(e) = b.podgroup_sync().await
    {
        b.fail(format!("podgroup-sync phase: {e}"));
    }
    if cli.skip_training_operator {
        b.to_status = "not measured: --skip-training-operator".into();
    } else if let Err(e) = b.training_operator().await {
        b.to_status = format!("not measured: {e}");
        b.notes.push(format!("training-operator phase failed: {e}"));
    }
    let load_end = loadavg();
    write_outputs(&b, machine, &load_start, &load_end, started)?;
    log!(
        "wrote {}/RESULTS.md, summary.json, curves.csv",
        out.display()
    );
    Ok(b)
}

/// The matrix of issue 15 (see `matrix`): its runs, then the top-level report.
async fn run_matrix(cli: Cli) -> Res<Vec<String>> {
    let started = unix_now();
    let out = out_dir(&cli, started)?;
    let load_start = loadavg();
    let runs = matrix(cli.clone(), &out).await?;
    let load_end = loadavg();
    write_matrix(&cli, &out, &runs, &load_start, &load_end, started)?;
    log!(
        "wrote {}/RESULTS.md, matrix.json, growth.csv",
        out.display()
    );
    Ok(runs
        .iter()
        .flat_map(|r| r.failures.iter().map(move |f| format!("{}: {f}", r.dir)))
        .collect())
}

fn main() -> ExitCode {
    // Run as the floor controller in podgroup-sync's place (`--floor`).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(floor::SUBCOMMAND) {
        return floor::floor_main(&args[2..]);
    }
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "scale: a benchmark, not a test; run it with `cargo bench --bench scale -- --help` (or bench/run.sh)"
        );
        return ExitCode::SUCCESS;
    }
    let cli = Cli::parse();
    START.get_or_init(Instant::now);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("scale: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = if cli.repeat > 1 || !cli.growth.is_empty() {
        rt.block_on(run_matrix(cli))
    } else {
        rt.block_on(run(cli)).map(|b| b.failures)
    };
    match result {
        Ok(failures) if failures.is_empty() => ExitCode::SUCCESS,
        Ok(failures) => {
            eprintln!("scale: {} correctness failure(s):", failures.len());
            for f in &failures {
                eprintln!("  - {f}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("scale: {e}");
            ExitCode::FAILURE
        }
    }
}
