//! The benchmark's command line.

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "scale",
    about = "podgroup-sync scale benchmark (issue 7): podgroup-sync vs a bare client vs training-operator"
)]
pub(crate) struct Cli {
    /// PyTorchJobs per contender (Master 1 + Worker 3 each).
    #[arg(long, default_value_t = 5000)]
    pub(crate) jobs: usize,
    /// Namespaces the jobs are spread over (round robin).
    #[arg(long, default_value_t = 100)]
    pub(crate) namespaces: usize,
    /// The controller's --concurrency, the bare client's writes in flight and training-operator's
    /// --controller-threads.
    #[arg(long, default_value_t = 16)]
    pub(crate) concurrency: u16,
    /// Job creates in flight (the creator).
    #[arg(long, default_value_t = 32)]
    pub(crate) creators: usize,
    /// Leave out the training-operator phase.
    #[arg(long)]
    pub(crate) skip_training_operator: bool,
    /// Leave out the bare-client phase.
    #[arg(long)]
    pub(crate) skip_bare: bool,
    /// Leave out the podgroup-sync phase.
    #[arg(long)]
    pub(crate) skip_podgroup_sync: bool,
    /// Output directory (default target/bench/scale-<unix time>).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Run the floor controller (benches/scale/floor.rs: the least a kube-runtime controller
    /// does for the same PodGroups) in podgroup-sync's place; its phases keep podgroup-sync's
    /// names.
    #[arg(long)]
    pub(crate) floor: bool,
    /// The controller binary (default: target/release/podgroup-sync next to this benchmark).
    #[arg(long)]
    pub(crate) controller_bin: Option<PathBuf>,
    /// An extra flag for podgroup-sync (repeatable), e.g. --controller-arg=--concurrency=32.
    #[arg(long = "controller-arg", allow_hyphen_values = true)]
    pub(crate) controller_args: Vec<String>,
    /// An environment variable for podgroup-sync (repeatable), e.g. --controller-env
    /// MALLOC_ARENA_MAX=2.
    #[arg(long = "controller-env")]
    pub(crate) controller_env: Vec<String>,
    /// Seconds each convergence of podgroup-sync and the bare client may take
    /// (default max(180, jobs/10)).
    #[arg(long)]
    pub(crate) timeout: Option<u64>,
    /// Seconds training-operator may take to create all PodGroups (default max(300, jobs*0.3)).
    #[arg(long)]
    pub(crate) to_timeout: Option<u64>,
    /// Seconds to wait after that for training-operator to create every pod and service.
    #[arg(long, default_value_t = 900)]
    pub(crate) to_settle_timeout: u64,
    /// training-operator --kube-api-qps (upstream default 20).
    #[arg(long, default_value_t = 1000)]
    pub(crate) to_qps: u32,
    /// training-operator --kube-api-burst (upstream default 30).
    #[arg(long, default_value_t = 2000)]
    pub(crate) to_burst: u32,
    /// training-operator --controller-threads (default: --concurrency; upstream default 1).
    #[arg(long)]
    pub(crate) to_threads: Option<u16>,
    /// Run training-operator with its upstream defaults (1 thread, 20 QPS, burst 30) instead.
    #[arg(long)]
    pub(crate) to_upstream_defaults: bool,
    /// Seconds get-e2e-binaries.sh may take to provide training-operator (it builds it if needed).
    #[arg(long, default_value_t = 900)]
    pub(crate) to_build_timeout: u64,
    /// Steady state (issue 15): jobs created at this constant rate per second into the cluster
    /// already holding --jobs, after the backlog phase (podgroup-sync and the bare client).
    #[arg(long, default_value_t = 50.0)]
    pub(crate) steady_rate: f64,
    /// Seconds of the steady state (0: no steady-state phase).
    #[arg(long, default_value_t = 0)]
    pub(crate) steady_seconds: u64,
    /// Runs of every contender at --jobs (each on fresh control planes); the report gives the
    /// median and the spread.
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: usize,
    /// Further sizes, run once each after the --repeat runs, as JOBS:NAMESPACES (repeatable or
    /// comma-separated), e.g. --growth 1000:100,20000:1000: the growth table and plot.
    #[arg(long, value_delimiter = ',')]
    pub(crate) growth: Vec<String>,
    /// The sizes at which training-operator runs (default: every size up to 5000).
    #[arg(long, value_delimiter = ',')]
    pub(crate) to_sizes: Vec<usize>,
    /// Runs of training-operator per size (at most --repeat): one run at 5,000 jobs takes ~7
    /// minutes here, most of it creating 20,000 pods and services.
    #[arg(long, default_value_t = 1)]
    pub(crate) to_runs: usize,
    /// Set by `cargo bench`; without it the binary only prints how to run it.
    #[arg(long, hide = true)]
    pub(crate) bench: bool,
}
