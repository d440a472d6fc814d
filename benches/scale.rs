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
//! Correctness (every job gets a correct PodGroup; 0 PodGroup writes on restart) makes the run
//! fail; timing never does. Every wait is bounded.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{
    DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::ApiResource;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use podgroup_sync::backend::{self, BackendOptions, PodGroupBackend, SchedulerPlugins};
use podgroup_sync::gang::{self, Priorities};
use podgroup_sync::job::{self, PYTORCHJOB};
use podgroup_sync::resources::AdmissionDefaults;

type BoxErr = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxErr>;

fn err(msg: impl Into<String>) -> BoxErr {
    msg.into().into()
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "scale",
    about = "podgroup-sync scale benchmark (issue 7): podgroup-sync vs a bare client vs training-operator"
)]
struct Cli {
    /// PyTorchJobs per contender (Master 1 + Worker 3 each).
    #[arg(long, default_value_t = 5000)]
    jobs: usize,
    /// Namespaces the jobs are spread over (round robin).
    #[arg(long, default_value_t = 100)]
    namespaces: usize,
    /// The controller's --concurrency, the bare client's writes in flight and training-operator's
    /// --controller-threads.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Job creates in flight (the creator).
    #[arg(long, default_value_t = 32)]
    creators: usize,
    /// Leave out the training-operator phase.
    #[arg(long)]
    skip_training_operator: bool,
    /// Leave out the bare-client phase.
    #[arg(long)]
    skip_bare: bool,
    /// Leave out the podgroup-sync phase.
    #[arg(long)]
    skip_podgroup_sync: bool,
    /// Output directory (default target/bench/scale-<unix time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The controller binary (default: target/release/podgroup-sync next to this benchmark).
    #[arg(long)]
    controller_bin: Option<PathBuf>,
    /// An extra flag for podgroup-sync (repeatable), e.g. --controller-arg=--concurrency=32.
    #[arg(long = "controller-arg", allow_hyphen_values = true)]
    controller_args: Vec<String>,
    /// An environment variable for podgroup-sync (repeatable), e.g. --controller-env
    /// MALLOC_ARENA_MAX=2.
    #[arg(long = "controller-env")]
    controller_env: Vec<String>,
    /// Seconds each convergence of podgroup-sync and the bare client may take
    /// (default max(180, jobs/10)).
    #[arg(long)]
    timeout: Option<u64>,
    /// Seconds training-operator may take to create all PodGroups (default max(300, jobs*0.3)).
    #[arg(long)]
    to_timeout: Option<u64>,
    /// Seconds to wait after that for training-operator to create every pod and service.
    #[arg(long, default_value_t = 900)]
    to_settle_timeout: u64,
    /// training-operator --kube-api-qps (upstream default 20).
    #[arg(long, default_value_t = 1000)]
    to_qps: u32,
    /// training-operator --kube-api-burst (upstream default 30).
    #[arg(long, default_value_t = 2000)]
    to_burst: u32,
    /// training-operator --controller-threads (default: --concurrency; upstream default 1).
    #[arg(long)]
    to_threads: Option<u16>,
    /// Run training-operator with its upstream defaults (1 thread, 20 QPS, burst 30) instead.
    #[arg(long)]
    to_upstream_defaults: bool,
    /// Seconds get-e2e-binaries.sh may take to provide training-operator (it builds it if needed).
    #[arg(long, default_value_t = 900)]
    to_build_timeout: u64,
    /// Set by `cargo bench`; without it the binary only prints how to run it.
    #[arg(long, hide = true)]
    bench: bool,
}

// ------------------------------------------------------------------------------------------
// logging, paths, small helpers

static START: OnceLock<Instant> = OnceLock::new();

fn log_line(msg: String) {
    let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
    eprintln!("[scale +{t:7.1}s] {msg}");
}

macro_rules! log {
    ($($t:tt)*) => { log_line(format!($($t)*)) };
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn free_port() -> Res<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn sh(cmd: &str) -> String {
    Command::new("bash")
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Polls `f` every `every` until it is true or `timeout` passes; returns whether it became true.
async fn poll_until(timeout: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

// ------------------------------------------------------------------------------------------
// processes: control planes, the controller, training-operator

/// A control plane started by tests/cluster/start.sh; stopped by stop.sh on drop.
struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    bin: PathBuf,
    stopped: bool,
}

impl ControlPlane {
    fn start(dir: PathBuf) -> Res<Self> {
        std::fs::create_dir_all(&dir)?;
        let log_path = dir.join("start.log");
        let logf = std::fs::File::create(&log_path)?;
        log!("starting a control plane in {}", dir.display());
        let status = tokio::task::block_in_place(|| {
            Command::new(root().join("tests/cluster/start.sh"))
                .arg(&dir)
                .arg("--owner-pid")
                .arg(std::process::id().to_string())
                .stdin(Stdio::null())
                .stdout(logf.try_clone()?)
                .stderr(logf)
                .status()
        })?;
        if !status.success() {
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(30).collect();
            return Err(err(format!(
                "start.sh {} failed ({status}):\n{}",
                dir.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )));
        }
        let bin = sh(&format!(
            "source '{}' && printf %s \"$BIN\"",
            dir.join("env").display()
        ));
        if bin.is_empty() {
            return Err(err(format!("no BIN in {}/env", dir.display())));
        }
        Ok(ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            bin: PathBuf::from(bin),
            stopped: false,
        })
    }

    async fn client(&self) -> Res<Client> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        config.read_timeout = Some(Duration::from_secs(120));
        Ok(Client::try_from(config)?)
    }

    fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        log!("stopping the control plane in {}", self.dir.display());
        let _ = tokio::task::block_in_place(|| {
            Command::new(root().join("tests/cluster/stop.sh"))
                .arg(&self.dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
        });
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
struct ProcStats {
    rss_mib: f64,
    hwm_mib: f64,
    cpu_s: f64,
}

fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| sh("getconf CLK_TCK").parse().unwrap_or(100.0))
}

fn proc_stats(pid: u32) -> Option<ProcStats> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| -> Option<f64> {
        status
            .lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(ProcStats {
        rss_mib: round(kib("VmRSS:")? / 1024.0, 1),
        hwm_mib: round(kib("VmHWM:")? / 1024.0, 1),
        cpu_s: round((utime + stime) / clk_tck(), 2),
    })
}

/// A child process, killed (SIGKILL) on drop and, through a detached tether, when this
/// benchmark exits in any way.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    spawned: Instant,
    http: Option<SocketAddr>,
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, log: PathBuf, http: Option<SocketAddr>) -> Res<Self> {
        let f = std::fs::File::create(&log)?;
        let spawned = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .map_err(|e| err(format!("spawning {name}: {e}")))?;
        let _ = Command::new("setsid")
            .args([
                "bash",
                "-c",
                "while kill -0 \"$1\" 2>/dev/null; do sleep 1; done; kill -9 \"$2\" 2>/dev/null",
                "bench-tether",
            ])
            .arg(std::process::id().to_string())
            .arg(child.id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        Ok(Proc {
            name: name.into(),
            child,
            log,
            spawned,
            http,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn stats(&self) -> ProcStats {
        proc_stats(self.pid()).unwrap_or_default()
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http?, path)
    }

    fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGTERM, wait up to `grace` for the exit (then SIGKILL); returns the time it took.
    fn terminate(&mut self, grace: Duration) -> Duration {
        let t = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        while t.elapsed() < grace {
            if !self.alive() {
                return t.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        log!(
            "{} did not exit within {grace:?} of SIGTERM; SIGKILL",
            self.name
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
        t.elapsed()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 GET on loopback: `(status code, body)`.
fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// Sum of a metric's samples whose labels include every `label="value"` given.
fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, r)) => (m, r.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let ok = labels
                .iter()
                .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            ok.then(|| value.parse::<f64>().ok()).flatten()
        })
        .fold(0.0, |a, b| a + b)
}

fn spawn_controller(cli: &Cli, bin: &Path, cp: &ControlPlane, log: PathBuf) -> Res<Proc> {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut cmd = Command::new(bin);
    cmd.arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .arg("--http-addr")
        .arg(addr.to_string())
        .arg(format!("--concurrency={}", cli.concurrency))
        .args(&cli.controller_args)
        .env_remove("PODGROUP_SYNC_LOG");
    for kv in &cli.controller_env {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        cmd.env(k, v);
    }
    Proc::spawn("podgroup-sync", cmd, log, Some(addr))
}

/// Polls /readyz every 25 ms; the time from spawn to 200.
async fn wait_ready(p: &mut Proc, timeout: Duration) -> Res<Duration> {
    let deadline = Instant::now() + timeout;
    loop {
        if !p.alive() {
            return Err(err(format!("{} exited:\n{}", p.name, p.log_tail(30))));
        }
        let pp = &*p;
        if tokio::task::block_in_place(|| pp.get("/readyz")).is_some_and(|(c, _)| c == 200) {
            return Ok(p.spawned.elapsed());
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "{} not ready after {timeout:?}:\n{}",
                p.name,
                p.log_tail(30)
            )));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ------------------------------------------------------------------------------------------
// the API server's own request counters

/// `apiserver_request_total`, keyed by (verb, resource, code).
#[derive(Debug, Clone, Default)]
struct Requests(BTreeMap<(String, String, String), f64>);

const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some((k, r)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = r.char_indices();
        let mut end = r.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(n);
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(k.trim_start_matches(',').to_string(), value);
        rest = &r[end..];
    }
    out
}

fn resource_label(l: &BTreeMap<String, String>) -> String {
    let get = |k: &str| l.get(k).map(String::as_str).unwrap_or("");
    let (r, g, sub) = (get("resource"), get("group"), get("subresource"));
    if r.is_empty() {
        return format!("(nonresource) {sub}");
    }
    let mut s = if g.is_empty() {
        r.to_string()
    } else {
        format!("{r}.{g}")
    };
    if !sub.is_empty() {
        s.push('/');
        s.push_str(sub);
    }
    s
}

impl Requests {
    async fn scrape(client: &Client) -> Res<Requests> {
        let req = hyper::Request::get("/metrics").body(Vec::new())?;
        let text = client.request_text(req).await?;
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let l = parse_labels(labels);
            let key = (
                l.get("verb").cloned().unwrap_or_default(),
                resource_label(&l),
                l.get("code").cloned().unwrap_or_default(),
            );
            *out.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
        Ok(Requests(out))
    }

    fn since(&self, before: &Requests) -> Requests {
        let mut out = BTreeMap::new();
        for (k, v) in &self.0 {
            let d = v - before.0.get(k).copied().unwrap_or(0.0);
            if d > 0.0 {
                out.insert(k.clone(), d);
            }
        }
        Requests(out)
    }

    fn sum(&self, f: impl Fn(&str, &str, &str) -> bool) -> f64 {
        self.0
            .iter()
            .filter(|((v, r, c), _)| f(v, r, c))
            .map(|(_, n)| n)
            .fold(0.0, |a, b| a + b)
    }

    /// The benchmark's own scrapes of /metrics are never counted.
    fn without_scrapes(&self) -> Requests {
        Requests(
            self.0
                .iter()
                .filter(|((_, r, _), _)| r != "(nonresource) /metrics")
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        )
    }

    /// "VERB resource" → count (codes summed).
    fn by_verb_resource(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for ((v, r, _), n) in &self.0 {
            *out.entry(format!("{v} {r}")).or_insert(0.0) += n;
        }
        out
    }

    fn podgroup_writes(&self) -> f64 {
        self.sum(|v, r, _| r.starts_with("podgroups.") && WRITE_VERBS.contains(&v))
    }

    fn writes(&self) -> f64 {
        self.sum(|v, _, _| WRITE_VERBS.contains(&v))
    }

    fn total(&self) -> f64 {
        self.sum(|_, _, _| true)
    }
}

// ------------------------------------------------------------------------------------------
// jobs, PodGroups and the PodGroup watcher

fn pytorchjob_ar() -> ApiResource {
    ApiResource {
        group: "kubeflow.org".into(),
        version: "v1".into(),
        api_version: "kubeflow.org/v1".into(),
        kind: "PyTorchJob".into(),
        plural: "pytorchjobs".into(),
    }
}

fn podgroup_ar() -> ApiResource {
    SchedulerPlugins.api_resource()
}

const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// Master 1 (1 cpu, 1Gi) + Worker 3 (2 cpu, 1 GPU as a limit only), every template linked to
/// PodGroup `name`; the container and port training-operator's defaulting webhook would add.
fn job_manifest(ns: &str, name: &str) -> Value {
    let template = |requests: Value, limits: Value| {
        json!({"metadata": {"labels": {POD_GROUP_LABEL: name}},
               "spec": {"restartPolicy": "Never", "containers": [{
                   "name": "pytorch", "image": "busybox",
                   "ports": [{"name": "pytorchjob-port", "containerPort": 23456}],
                   "resources": {"requests": requests, "limits": limits}}]}})
    };
    json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"runPolicy": {}, "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "Never",
                       "template": template(json!({"cpu": "1", "memory": "1Gi"}), json!({}))},
            "Worker": {"replicas": 3, "restartPolicy": "Never",
                       "template": template(json!({"cpu": "2"}), json!({"nvidia.com/gpu": 1}))}}}
    })
}

/// The PodGroup podgroup-sync applies for a job, computed by the crate's own pure pipeline.
fn desired_pod_group(ns: &str, name: &str, uid: &str) -> Res<Value> {
    let mut manifest = job_manifest(ns, name);
    manifest["metadata"]["uid"] = json!(uid);
    let job = job::normalize(&PYTORCHJOB, &manifest).map_err(|e| err(e.to_string()))?;
    let gang = gang::compute(&job, &Priorities::default(), &AdmissionDefaults::default())
        .map_err(|e| err(e.to_string()))?;
    let (pg_name, _) =
        backend::pod_group_name(&SchedulerPlugins, &job).map_err(|e| err(e.to_string()))?;
    Ok(backend::desired_object(
        &SchedulerPlugins,
        &job,
        &gang,
        &pg_name,
        None,
        false,
        &BackendOptions::default(),
    ))
}

/// What a PodGroup must say to count as correct.
#[derive(Debug, Clone)]
enum Check {
    /// minMember and minResources exactly as podgroup-sync computes them.
    Exact {
        min_member: i64,
        min_resources: Value,
    },
    /// minMember only (training-operator computes minResources its own way).
    MinMember(i64),
}

impl Check {
    fn exact() -> Res<Check> {
        let d = desired_pod_group("x", "x", "x")?;
        Ok(Check::Exact {
            min_member: d["spec"]["minMember"].as_i64().unwrap_or(-1),
            min_resources: d["spec"]["minResources"].clone(),
        })
    }

    fn passes(&self, pg: &DynamicObject) -> bool {
        let spec = pg.data.get("spec");
        let mm = spec
            .and_then(|s| s.get("minMember"))
            .and_then(Value::as_i64);
        match self {
            Check::Exact {
                min_member,
                min_resources,
            } => {
                mm == Some(*min_member)
                    && spec.and_then(|s| s.get("minResources")) == Some(min_resources)
            }
            Check::MinMember(m) => mm == Some(*m),
        }
    }

    fn describe(&self) -> String {
        match self {
            Check::Exact {
                min_member,
                min_resources,
            } => format!("minMember {min_member}, minResources {min_resources}"),
            Check::MinMember(m) => format!("minMember {m}"),
        }
    }
}

#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    /// PodGroup creationTimestamp (unix seconds).
    created: Option<i64>,
}

struct WatchState {
    prefix: String,
    check: Check,
    /// ns/name of every PodGroup that exists.
    present: HashSet<String>,
    /// First time each PodGroup of the current phase was seen correct.
    correct: HashMap<String, Seen>,
    events: u64,
}

/// Watches every scheduling.x-k8s.io PodGroup; records when each was first seen correct.
struct PgWatch {
    state: Arc<Mutex<WatchState>>,
    task: tokio::task::JoinHandle<()>,
}

impl PgWatch {
    async fn start(client: &Client) -> Res<PgWatch> {
        let state = Arc::new(Mutex::new(WatchState {
            prefix: "\u{0}".into(),
            check: Check::MinMember(-1),
            present: HashSet::new(),
            correct: HashMap::new(),
            events: 0,
        }));
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &podgroup_ar());
        let synced = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn({
            let state = state.clone();
            let synced = synced.clone();
            async move {
                let mut stream =
                    std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
                while let Some(ev) = stream.next().await {
                    let now = Instant::now();
                    match ev {
                        Ok(watcher::Event::Apply(pg) | watcher::Event::InitApply(pg)) => {
                            let ns = pg.namespace().unwrap_or_default();
                            let key = format!("{ns}/{}", pg.name_any());
                            let mut s = state.lock().expect("lock");
                            s.events += 1;
                            s.present.insert(key.clone());
                            if ns.starts_with(&s.prefix)
                                && !s.correct.contains_key(&key)
                                && s.check.passes(&pg)
                            {
                                let created = pg
                                    .metadata
                                    .creation_timestamp
                                    .as_ref()
                                    .map(|t| t.0.as_second());
                                s.correct.insert(key, Seen { at: now, created });
                            }
                        }
                        Ok(watcher::Event::Delete(pg)) => {
                            let key =
                                format!("{}/{}", pg.namespace().unwrap_or_default(), pg.name_any());
                            let mut s = state.lock().expect("lock");
                            s.events += 1;
                            s.present.remove(&key);
                        }
                        Ok(watcher::Event::InitDone) => synced.notify_one(),
                        Ok(watcher::Event::Init) => {}
                        Err(e) => log!("PodGroup watch error: {e}"),
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), synced.notified())
            .await
            .map_err(|_| err("the PodGroup watch did not sync within 60 s"))?;
        Ok(PgWatch { state, task })
    }

    /// Starts a phase: PodGroups in namespaces starting with `prefix` are checked with `check`.
    fn begin(&self, prefix: &str, check: Check) {
        let mut s = self.state.lock().expect("lock");
        s.prefix = prefix.into();
        s.check = check;
        s.correct.clear();
    }

    fn correct_count(&self) -> usize {
        self.state.lock().expect("lock").correct.len()
    }

    fn present_with_prefix(&self, prefix: &str) -> usize {
        self.state
            .lock()
            .expect("lock")
            .present
            .iter()
            .filter(|k| k.starts_with(prefix))
            .count()
    }

    fn records(&self) -> HashMap<String, Seen> {
        self.state.lock().expect("lock").correct.clone()
    }

    async fn wait_correct(&self, n: usize, timeout: Duration) -> bool {
        poll_until(timeout, Duration::from_millis(50), || {
            self.correct_count() >= n
        })
        .await
    }
}

impl Drop for PgWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One job the creator made.
#[derive(Debug, Clone)]
struct Created {
    key: String,
    ns: String,
    name: String,
    uid: String,
    /// When the create response arrived.
    at: Instant,
    /// The job's creationTimestamp (unix seconds).
    created: i64,
}

fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => matches!(s.code, 429 | 500 | 502 | 503 | 504),
        _ => true,
    }
}

async fn create_job(client: &Client, ns: &str, name: &str, posts: &AtomicU64) -> Res<Created> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &pytorchjob_ar());
    let obj: DynamicObject = serde_json::from_value(job_manifest(ns, name))?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        posts.fetch_add(1, Ordering::Relaxed);
        let r = match api.create(&PostParams::default(), &obj).await {
            // A retried create whose first attempt went through.
            Err(kube::Error::Api(s)) if s.code == 409 && attempt > 1 => api.get(name).await,
            r => r,
        };
        match r {
            Ok(job) => {
                return Ok(Created {
                    key: format!("{ns}/{name}"),
                    ns: ns.into(),
                    name: name.into(),
                    uid: job.uid().unwrap_or_default(),
                    at: Instant::now(),
                    created: job
                        .metadata
                        .creation_timestamp
                        .map(|t| t.0.as_second())
                        .unwrap_or(0),
                });
            }
            Err(e) if attempt < 6 && transient(&e) => {
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
            Err(e) => return Err(err(format!("create PyTorchJob {ns}/{name}: {e}"))),
        }
    }
}

/// Creates jobs `prefix-<i % m>/pj-<i>` for i in 0..n with `in_flight` creates at once; each
/// created job is also sent to `tx`.
async fn create_jobs(
    client: &Client,
    prefix: &str,
    n: usize,
    m: usize,
    in_flight: usize,
    tx: Option<tokio::sync::mpsc::UnboundedSender<Created>>,
    posts: &AtomicU64,
) -> Res<Vec<Created>> {
    futures::stream::iter(0..n)
        .map(|i| {
            let tx = tx.clone();
            async move {
                let c = create_job(
                    client,
                    &format!("{prefix}-{}", i % m),
                    &format!("pj-{i:05}"),
                    posts,
                )
                .await?;
                if let Some(tx) = tx {
                    let _ = tx.send(c.clone());
                }
                Ok::<_, BoxErr>(c)
            }
        })
        .buffer_unordered(in_flight.max(1))
        .try_collect()
        .await
}

async fn create_namespaces(
    client: &Client,
    prefix: &str,
    m: usize,
    annotations: &[(&str, &str)],
) -> Res<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    futures::stream::iter(0..m)
        .map(|i| {
            let api = api.clone();
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(format!("{prefix}-{i}")),
                    annotations: (!annotations.is_empty()).then(|| {
                        annotations
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect()
                    }),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            async move { api.create(&PostParams::default(), &ns).await.map(|_| ()) }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Applies the PodGroup of job `c` exactly as podgroup-sync does (same body, same field manager,
/// forced server-side apply).
async fn apply_pod_group(client: &Client, c: &Created) -> Res<()> {
    let body = desired_pod_group(&c.ns, &c.name, &c.uid)?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &c.ns, &podgroup_ar());
    let params = PatchParams::apply("podgroup-sync").force();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match api.patch(&c.name, &params, &Patch::Apply(&body)).await {
            Ok(_) => return Ok(()),
            Err(e) if attempt < 6 && transient(&e) => {
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
            Err(e) => return Err(err(format!("apply PodGroup {}: {e}", c.key))),
        }
    }
}

/// Deletes every PodGroup in the phase's namespaces and waits until the watch saw them go.
async fn delete_pod_groups(client: &Client, watch: &PgWatch, prefix: &str, m: usize) -> Res<()> {
    futures::stream::iter(0..m)
        .map(|i| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &format!("{prefix}-{i}"), &podgroup_ar());
            async move {
                api.delete_collection(&DeleteParams::default(), &ListParams::default())
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    let p = format!("{prefix}-");
    if !poll_until(Duration::from_secs(120), Duration::from_millis(100), || {
        watch.present_with_prefix(&p) == 0
    })
    .await
    {
        return Err(err(format!(
            "{} PodGroups in {prefix}-* still there 120 s after deletecollection",
            watch.present_with_prefix(&p)
        )));
    }
    Ok(())
}

/// Lists the PodGroups of the phase and checks each against its job: exact spec, one controller
/// ownerReference to the job's UID, the managed-by label. Returns the problems (at most 10).
async fn verify_pod_groups(
    client: &Client,
    jobs: &[Created],
    check: &Check,
    owned: bool,
) -> Res<Vec<String>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &podgroup_ar());
    let list = api.list(&ListParams::default()).await?;
    let by_key: HashMap<String, DynamicObject> = list
        .items
        .into_iter()
        .map(|pg| {
            (
                format!("{}/{}", pg.namespace().unwrap_or_default(), pg.name_any()),
                pg,
            )
        })
        .collect();
    let mut problems = Vec::new();
    for c in jobs {
        let problem = match by_key.get(&c.key) {
            None => Some("no PodGroup".to_string()),
            Some(pg) if !check.passes(pg) => Some(format!(
                "spec {} (want {})",
                pg.data["spec"],
                check.describe()
            )),
            Some(pg) if owned => {
                let refs = pg.metadata.owner_references.clone().unwrap_or_default();
                let ok_owner = refs.len() == 1
                    && refs[0].uid == c.uid
                    && refs[0].controller == Some(true)
                    && refs[0].block_owner_deletion == Some(true);
                let ok_label = pg
                    .labels()
                    .get(backend::MANAGED_BY_LABEL)
                    .is_some_and(|v| v == backend::MANAGED_BY_VALUE);
                (!ok_owner || !ok_label)
                    .then(|| format!("ownerReferences {refs:?}, labels {:?}", pg.labels()))
            }
            Some(_) => None,
        };
        if let Some(p) = problem {
            problems.push(format!("{}: {p}", c.key));
            if problems.len() >= 10 {
                break;
            }
        }
    }
    Ok(problems)
}

// ------------------------------------------------------------------------------------------
// results

#[derive(Debug, Clone, Default, Serialize)]
struct Latency {
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Latency {
    fn of(mut v: Vec<f64>) -> Latency {
        v.sort_by(f64::total_cmp);
        Latency {
            p50_ms: round(pct(&v, 50.0), 1),
            p90_ms: round(pct(&v, 90.0), 1),
            p99_ms: round(pct(&v, 99.0), 1),
            max_ms: round(v.last().copied().unwrap_or(f64::NAN), 1),
        }
    }
}

/// One measured phase.
#[derive(Debug, Clone, Default, Serialize)]
struct Phase {
    name: String,
    jobs: usize,
    /// Every job has a correct PodGroup.
    converged: bool,
    correct: usize,
    /// Start (first job create, process spawn or first write) → last job created.
    create_s: Option<f64>,
    /// Start → the last PodGroup seen correct by the watch.
    converge_s: Option<f64>,
    /// Last job created → last PodGroup seen correct.
    tail_s: Option<f64>,
    /// Create response of the job → its PodGroup first seen correct by the watch.
    latency: Option<Latency>,
    /// PodGroup creationTimestamp − job creationTimestamp (1 s resolution), p50 / p99, s.
    server_latency_p50_s: Option<f64>,
    server_latency_p99_s: Option<f64>,
    /// API server requests in the window, "VERB resource" → count; the benchmark's own scrapes
    /// of /metrics are left out.
    requests: BTreeMap<String, f64>,
    /// Requests the benchmark itself made in the window (job creates), left out of the per-job
    /// figures.
    bench_requests: f64,
    podgroup_writes: f64,
    podgroup_writes_per_job: f64,
    requests_per_job: f64,
    writes_per_job: f64,
    /// The contender's process (podgroup-sync, training-operator) at the end of the window.
    process: Option<ProcStats>,
    /// CPU seconds of the process during the window.
    cpu_s: Option<f64>,
    /// Phase-specific figures.
    extra: BTreeMap<String, Value>,
    /// Per job: seconds from the start to its create response and to its PodGroup seen correct.
    #[serde(skip)]
    per_job: Vec<(String, f64, f64)>,
    #[serde(skip)]
    window_len_s: f64,
}

impl Phase {
    fn new(name: &str, jobs: usize) -> Phase {
        Phase {
            name: name.into(),
            jobs,
            ..Phase::default()
        }
    }

    /// Fills the timing figures from the creator's records and the watch's.
    fn timing(
        &mut self,
        t0: Instant,
        created: &[Created],
        seen: &HashMap<String, Seen>,
        per_job_start: Option<Instant>,
    ) {
        self.correct = seen.len();
        self.converged = seen.len() >= self.jobs;
        let last_seen = seen.values().map(|s| s.at).max();
        let last_created = created.iter().map(|c| c.at).max();
        if let Some(l) = last_seen.filter(|_| self.converged) {
            self.converge_s = Some(secs(l.saturating_duration_since(t0)));
        }
        if let (Some(lc), Some(ls)) = (
            last_created.filter(|_| per_job_start.is_none()),
            last_seen.filter(|_| self.converged),
        ) {
            self.create_s = Some(secs(lc.saturating_duration_since(t0)));
            self.tail_s = Some(secs(ls.saturating_duration_since(lc)));
        }
        let mut lat = Vec::new();
        let mut server = Vec::new();
        for c in created {
            let Some(s) = seen.get(&c.key) else { continue };
            let from = per_job_start.unwrap_or(c.at);
            lat.push(s.at.saturating_duration_since(from).as_secs_f64() * 1000.0);
            if per_job_start.is_none()
                && let Some(pc) = s.created
            {
                server.push((pc - c.created) as f64);
            }
            self.per_job.push((
                c.key.clone(),
                if per_job_start.is_none() {
                    c.at.saturating_duration_since(t0).as_secs_f64()
                } else {
                    0.0
                },
                s.at.saturating_duration_since(t0).as_secs_f64(),
            ));
        }
        if !lat.is_empty() {
            self.latency = Some(Latency::of(lat));
        }
        if !server.is_empty() {
            server.sort_by(f64::total_cmp);
            self.server_latency_p50_s = Some(pct(&server, 50.0));
            self.server_latency_p99_s = Some(pct(&server, 99.0));
        }
    }

    fn requests(&mut self, d: &Requests, bench_requests: f64) {
        let d = d.without_scrapes();
        let n = self.jobs.max(1) as f64;
        self.requests = d.by_verb_resource();
        self.bench_requests = bench_requests;
        self.podgroup_writes = d.podgroup_writes();
        self.podgroup_writes_per_job = round(self.podgroup_writes / n, 3);
        self.requests_per_job = round((d.total() - bench_requests) / n, 3);
        self.writes_per_job = round((d.writes() - bench_requests) / n, 3);
    }
}

// ------------------------------------------------------------------------------------------
// the phases

struct Bench {
    cli: Cli,
    out: PathBuf,
    controller_bin: PathBuf,
    failures: Vec<String>,
    notes: Vec<String>,
    phases: Vec<Phase>,
    to_status: String,
    to_flags: Vec<String>,
    /// `kube-apiserver --version` of the control planes.
    apiserver: String,
}

impl Bench {
    fn converge_timeout(&self) -> Duration {
        Duration::from_secs(
            self.cli
                .timeout
                .unwrap_or((self.cli.jobs as u64 / 10).max(180)),
        )
    }

    fn fail(&mut self, msg: String) {
        log!("FAIL: {msg}");
        self.failures.push(msg);
    }

    /// Phase 1: the bare client.
    async fn bare(&mut self) -> Res<()> {
        let (n, m, c) = (
            self.cli.jobs,
            self.cli.namespaces,
            self.cli.concurrency as usize,
        );
        let mut cp = ControlPlane::start(self.out.join("cp-bare"))?;
        let client = cp.client().await?;
        create_namespaces(&client, "bare", m, &[]).await?;
        let watch = PgWatch::start(&client).await?;
        let check = Check::exact()?;

        // (a) burst: jobs created at once, each PodGroup applied on the job's create response.
        log!(
            "bare client, burst: {n} jobs ({} creates in flight), each PodGroup applied at once ({c} in flight)",
            self.cli.creators
        );
        watch.begin("bare-", check.clone());
        let before = Requests::scrape(&client).await?;
        let posts = AtomicU64::new(0);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Created>();
        let t0 = Instant::now();
        let writer = {
            let client = client.clone();
            tokio::spawn(async move {
                futures::stream::unfold(
                    rx,
                    |mut rx| async move { rx.recv().await.map(|c| (c, rx)) },
                )
                .map(|job| {
                    let client = client.clone();
                    async move { apply_pod_group(&client, &job).await }
                })
                .buffer_unordered(c.max(1))
                .try_collect::<Vec<()>>()
                .await
            })
        };
        let created =
            create_jobs(&client, "bare", n, m, self.cli.creators, Some(tx), &posts).await?;
        writer.await.map_err(|e| err(e.to_string()))??;
        let ok = watch.wait_correct(n, self.converge_timeout()).await;
        let after = Requests::scrape(&client).await?;
        let mut p = Phase::new("bare-burst", n);
        p.timing(t0, &created, &watch.records(), None);
        p.requests(&after.since(&before), posts.load(Ordering::Relaxed) as f64);
        p.window_len_s = t0.elapsed().as_secs_f64();
        if !ok {
            self.fail(format!(
                "bare client burst: {} of {n} PodGroups correct",
                p.correct
            ));
        }
        log!("bare client, burst: converged in {:?} s", p.converge_s);
        self.phases.push(p);

        // (b) backlog: the same N PodGroups written again from the known jobs.
        delete_pod_groups(&client, &watch, "bare", m).await?;
        log!("bare client, backlog: {n} PodGroups applied, {c} in flight");
        watch.begin("bare-", check.clone());
        let before = Requests::scrape(&client).await?;
        let t0 = Instant::now();
        futures::stream::iter(created.iter())
            .map(|job| apply_pod_group(&client, job))
            .buffer_unordered(c.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        let ok = watch.wait_correct(n, self.converge_timeout()).await;
        let after = Requests::scrape(&client).await?;
        let mut p = Phase::new("bare-backlog", n);
        p.timing(t0, &created, &watch.records(), Some(t0));
        p.requests(&after.since(&before), 0.0);
        p.window_len_s = t0.elapsed().as_secs_f64();
        if !ok {
            self.fail(format!(
                "bare client backlog: {} of {n} PodGroups correct",
                p.correct
            ));
        }
        let problems = verify_pod_groups(&client, &created, &check, true).await?;
        if !problems.is_empty() {
            self.fail(format!("bare client: wrong PodGroups: {problems:?}"));
        }
        log!("bare client, backlog: converged in {:?} s", p.converge_s);
        self.phases.push(p);
        drop(watch);
        cp.stop();
        Ok(())
    }

    /// Phase 2: podgroup-sync.
    async fn podgroup_sync(&mut self) -> Res<()> {
        let (n, m) = (self.cli.jobs, self.cli.namespaces);
        let mut cp = ControlPlane::start(self.out.join("cp-podgroup-sync"))?;
        self.apiserver = sh(&format!("'{}/kube-apiserver' --version", cp.bin.display()));
        let client = cp.client().await?;
        create_namespaces(&client, "pgs", m, &[("podgroup-sync.io/enabled", "true")]).await?;
        let watch = PgWatch::start(&client).await?;
        let check = Check::exact()?;

        // (a) burst
        let mut ctl = spawn_controller(
            &self.cli,
            &self.controller_bin,
            &cp,
            self.out.join("podgroup-sync-1.log"),
        )?;
        let ready = wait_ready(&mut ctl, Duration::from_secs(120)).await?;
        log!(
            "podgroup-sync ready in {:.2} s (pid {}); burst: {n} jobs, {} creates in flight",
            ready.as_secs_f64(),
            ctl.pid(),
            self.cli.creators
        );
        watch.begin("pgs-", check.clone());
        let before = Requests::scrape(&client).await?;
        let cpu0 = ctl.stats().cpu_s;
        let posts = AtomicU64::new(0);
        let t0 = Instant::now();
        let created = create_jobs(&client, "pgs", n, m, self.cli.creators, None, &posts).await?;
        log!(
            "podgroup-sync, burst: {n} jobs created in {:.1} s; waiting for PodGroups",
            t0.elapsed().as_secs_f64()
        );
        let ok = watch.wait_correct(n, self.converge_timeout()).await;
        // Let trailing requests (the reconciles the PodGroup events trigger) land in the window.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = Requests::scrape(&client).await?;
        let stats = ctl.stats();
        let metrics = tokio::task::block_in_place(|| ctl.get("/metrics"))
            .map(|(_, b)| b)
            .unwrap_or_default();
        let mut p = Phase::new("podgroup-sync-burst", n);
        p.timing(t0, &created, &watch.records(), None);
        p.requests(&after.since(&before), posts.load(Ordering::Relaxed) as f64);
        p.window_len_s = t0.elapsed().as_secs_f64();
        p.process = Some(stats);
        p.cpu_s = Some(round(stats.cpu_s - cpu0, 2));
        p.extra.insert("ready_s".into(), json!(secs(ready)));
        p.extra.insert(
            "controller_podgroup_writes".into(),
            json!(metric_sum(
                &metrics,
                "podgroup_sync_podgroup_writes_total",
                &[]
            )),
        );
        p.extra.insert(
            "controller_reconciles".into(),
            json!(metric_sum(&metrics, "podgroup_sync_reconcile_total", &[])),
        );
        p.extra.insert(
            "controller_reconcile_errors".into(),
            json!(metric_sum(
                &metrics,
                "podgroup_sync_reconcile_total",
                &[("result", "error")]
            )),
        );
        p.extra.insert(
            "controller_events".into(),
            json!(metric_sum(&metrics, "podgroup_sync_events_total", &[])),
        );
        if !ok {
            self.fail(format!(
                "podgroup-sync burst: {} of {n} PodGroups correct within {:?}",
                p.correct,
                self.converge_timeout()
            ));
        }
        let problems = verify_pod_groups(&client, &created, &check, true).await?;
        if !problems.is_empty() {
            self.fail(format!(
                "podgroup-sync burst: wrong PodGroups: {problems:?}"
            ));
        }
        log!(
            "podgroup-sync, burst: converged in {:?} s; {} PodGroup writes; peak RSS {} MiB",
            p.converge_s,
            p.podgroup_writes,
            stats.hwm_mib
        );
        self.phases.push(p);

        // (b) restart with nothing changed
        let pre = ctl.stats();
        let shutdown = tokio::task::block_in_place(|| ctl.terminate(Duration::from_secs(30)));
        log!(
            "podgroup-sync stopped (SIGTERM → exit {:.2} s); restarting",
            shutdown.as_secs_f64()
        );
        let before = Requests::scrape(&client).await?;
        let t0 = Instant::now();
        let mut ctl = spawn_controller(
            &self.cli,
            &self.controller_bin,
            &cp,
            self.out.join("podgroup-sync-2.log"),
        )?;
        let ready = wait_ready(&mut ctl, Duration::from_secs(120)).await?;
        let reconciles = |c: &Proc| -> f64 {
            c.get("/metrics")
                .map(|(_, b)| metric_sum(&b, "podgroup_sync_reconcile_total", &[]))
                .unwrap_or(0.0)
        };
        let mut reconciled_at = None;
        let mut last = (0.0, Instant::now());
        let deadline = Instant::now() + self.converge_timeout();
        while Instant::now() < deadline {
            let r = tokio::task::block_in_place(|| reconciles(&ctl));
            if reconciled_at.is_none() && r >= n as f64 {
                reconciled_at = Some(t0.elapsed());
            }
            if r != last.0 {
                last = (r, Instant::now());
            } else if reconciled_at.is_some() && last.1.elapsed() > Duration::from_secs(3) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let settled = last.1.saturating_duration_since(t0);
        let after = Requests::scrape(&client).await?;
        let stats = ctl.stats();
        let metrics = tokio::task::block_in_place(|| ctl.get("/metrics"))
            .map(|(_, b)| b)
            .unwrap_or_default();
        let mut p = Phase::new("podgroup-sync-restart", n);
        let d = after.since(&before);
        p.requests(&d, 0.0);
        p.window_len_s = t0.elapsed().as_secs_f64();
        p.process = Some(stats);
        p.cpu_s = Some(stats.cpu_s);
        p.converged = reconciled_at.is_some();
        p.correct = watch.present_with_prefix("pgs-");
        p.extra.insert("shutdown_s".into(), json!(secs(shutdown)));
        p.extra.insert("ready_s".into(), json!(secs(ready)));
        p.extra
            .insert("all_reconciled_s".into(), json!(reconciled_at.map(secs)));
        p.extra
            .insert("reconciles_settled_s".into(), json!(secs(settled)));
        p.extra
            .insert("controller_reconciles".into(), json!(last.0));
        p.extra.insert(
            "controller_podgroup_writes".into(),
            json!(metric_sum(
                &metrics,
                "podgroup_sync_podgroup_writes_total",
                &[]
            )),
        );
        p.extra.insert(
            "controller_events".into(),
            json!(metric_sum(&metrics, "podgroup_sync_events_total", &[])),
        );
        p.extra.insert(
            "event_writes".into(),
            json!(d.sum(|v, r, _| r.starts_with("events") && WRITE_VERBS.contains(&v))),
        );
        p.extra
            .insert("first_instance_before_sigterm".into(), json!(pre));
        if reconciled_at.is_none() {
            self.fail(format!(
                "podgroup-sync restart: reconcile_total {} < {n} within {:?}",
                last.0,
                self.converge_timeout()
            ));
        }
        let controller_writes = metric_sum(&metrics, "podgroup_sync_podgroup_writes_total", &[]);
        if p.podgroup_writes != 0.0 || controller_writes != 0.0 {
            self.fail(format!(
                "podgroup-sync restart: {} PodGroup writes at the API server ({controller_writes} by the controller's count); must be 0",
                p.podgroup_writes
            ));
        }
        log!(
            "podgroup-sync, restart: ready {:.2} s, all reconciled {:?}, PodGroup writes {}",
            ready.as_secs_f64(),
            reconciled_at,
            p.podgroup_writes
        );
        self.phases.push(p);

        // (c) backlog: stopped, every PodGroup deleted, started again
        tokio::task::block_in_place(|| ctl.terminate(Duration::from_secs(30)));
        delete_pod_groups(&client, &watch, "pgs", m).await?;
        log!("podgroup-sync, backlog: {n} jobs without PodGroups; starting the controller");
        watch.begin("pgs-", check.clone());
        let before = Requests::scrape(&client).await?;
        let mut ctl = spawn_controller(
            &self.cli,
            &self.controller_bin,
            &cp,
            self.out.join("podgroup-sync-3.log"),
        )?;
        let t0 = ctl.spawned;
        let ready = wait_ready(&mut ctl, Duration::from_secs(120)).await?;
        let ok = watch.wait_correct(n, self.converge_timeout()).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = Requests::scrape(&client).await?;
        let stats = ctl.stats();
        let mut p = Phase::new("podgroup-sync-backlog", n);
        p.timing(t0, &created, &watch.records(), Some(t0));
        p.requests(&after.since(&before), 0.0);
        p.window_len_s = t0.elapsed().as_secs_f64();
        p.process = Some(stats);
        p.cpu_s = Some(stats.cpu_s);
        p.extra.insert("ready_s".into(), json!(secs(ready)));
        if let Some(c) = p.converge_s {
            p.extra.insert(
                "converge_after_ready_s".into(),
                json!(round(c - ready.as_secs_f64(), 3)),
            );
        }
        if !ok {
            self.fail(format!(
                "podgroup-sync backlog: {} of {n} PodGroups correct",
                p.correct
            ));
        }
        let problems = verify_pod_groups(&client, &created, &check, true).await?;
        if !problems.is_empty() {
            self.fail(format!(
                "podgroup-sync backlog: wrong PodGroups: {problems:?}"
            ));
        }
        log!(
            "podgroup-sync, backlog: converged in {:?} s from spawn",
            p.converge_s
        );
        self.phases.push(p);
        tokio::task::block_in_place(|| ctl.terminate(Duration::from_secs(30)));
        drop(watch);
        cp.stop();
        Ok(())
    }

    /// Finds training-operator: $TRAINING_OPERATOR, else tests/e2e/get-e2e-binaries.sh (which
    /// builds it when needed, or waits for another run building it), bounded in time.
    fn find_training_operator(&self) -> Result<PathBuf, String> {
        if let Some(p) = std::env::var_os("TRAINING_OPERATOR").filter(|p| !p.is_empty()) {
            return Ok(PathBuf::from(p));
        }
        // A complete build in the cache (the script's `.done` marker) is used as is: the script
        // itself would first wait for any other get-e2e-binaries.sh run on the machine.
        let cache = std::env::var_os("PGS_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(sh("echo $HOME")).join(".cache/podgroup-sync"));
        let mut built: Vec<PathBuf> = std::fs::read_dir(cache.join("bin"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|d| {
                d.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("training-operator-v1.9."))
                    && d.join(".done").is_file()
                    && d.join("training-operator.v1").is_file()
            })
            .collect();
        built.sort();
        if let Some(d) = built.pop() {
            return Ok(d.join("training-operator.v1"));
        }
        use std::os::unix::process::CommandExt;
        let script = root().join("tests/e2e/get-e2e-binaries.sh");
        let log_path = self.out.join("get-e2e-binaries.log");
        let logf = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
        let out_path = self.out.join("get-e2e-binaries.out");
        let outf = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
        log!(
            "locating training-operator with {} (may build it; at most {} s)",
            script.display(),
            self.cli.to_build_timeout
        );
        let mut child = Command::new(&script)
            .arg("training-operator")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(outf)
            .stderr(logf)
            .spawn()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        let deadline = Instant::now() + Duration::from_secs(self.cli.to_build_timeout);
        let status = loop {
            if let Ok(Some(s)) = child.try_wait() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = Command::new("kill")
                    .args(["-TERM", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                return Err(format!(
                    "get-e2e-binaries.sh training-operator did not finish within {} s (log: {})",
                    self.cli.to_build_timeout,
                    log_path.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let out = std::fs::read_to_string(&out_path).unwrap_or_default();
        match out
            .lines()
            .filter_map(|l| l.strip_prefix("TRAINING_OPERATOR="))
            .next_back()
        {
            Some(p) if status.success() && Path::new(p).is_file() => Ok(PathBuf::from(p)),
            _ => Err(format!(
                "get-e2e-binaries.sh training-operator failed ({status}); log: {}",
                log_path.display()
            )),
        }
    }

    /// Phase 3: training-operator v1.9 with gang scheduling on (scheduler-plugins).
    async fn training_operator(&mut self) -> Res<()> {
        let (n, m) = (self.cli.jobs, self.cli.namespaces);
        let bin = match tokio::task::block_in_place(|| self.find_training_operator()) {
            Ok(b) => b,
            Err(why) => {
                self.to_status = format!("not measured: {why}");
                log!("training-operator {}", self.to_status);
                return Ok(());
            }
        };
        let mut cp = ControlPlane::start(self.out.join("cp-training-operator"))?;
        let client = cp.client().await?;
        // Its certificate rotator waits for the webhook Secret (namespace $MY_POD_NAMESPACE) and
        // for /tmp/k8s-webhook-server/serving-certs/tls.crt (a constant path it only checks
        // exists); its webhook server loads the certificate from $TMPDIR. No
        // ValidatingWebhookConfiguration exists, so the API server never calls the webhook.
        let nsapi: Api<Namespace> = Api::all(client.clone());
        let kubeflow = Namespace {
            metadata: ObjectMeta {
                name: Some("kubeflow".into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        nsapi.create(&PostParams::default(), &kubeflow).await?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("training-operator-webhook-cert".into()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        Api::<Secret>::namespaced(client.clone(), "kubeflow")
            .create(&PostParams::default(), &secret)
            .await?;
        let tmp = self.out.join("training-operator-tmp");
        let certs = tmp.join("k8s-webhook-server/serving-certs");
        std::fs::create_dir_all(&certs)?;
        let openssl = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "7",
            ])
            .args([
                "-subj",
                "/CN=training-operator.kubeflow.svc",
                "-addext",
                "subjectAltName=DNS:training-operator.kubeflow.svc",
            ])
            .arg("-keyout")
            .arg(certs.join("tls.key"))
            .arg("-out")
            .arg(certs.join("tls.crt"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !openssl.success() {
            return Err(err("openssl failed"));
        }
        let global = Path::new("/tmp/k8s-webhook-server/serving-certs");
        if !global.join("tls.crt").exists() {
            std::fs::create_dir_all(global)?;
            let tmpf = global.join(format!(".tls.crt.{}", std::process::id()));
            std::fs::copy(certs.join("tls.crt"), &tmpf)?;
            if !global.join("tls.crt").exists() {
                std::fs::rename(&tmpf, global.join("tls.crt"))?;
            } else {
                let _ = std::fs::remove_file(&tmpf);
            }
        }
        let (p_metrics, p_probe, p_webhook) = (free_port()?, free_port()?, free_port()?);
        let threads = self.cli.to_threads.unwrap_or(self.cli.concurrency);
        self.to_flags = vec![
            "--gang-scheduler-name=scheduler-plugins".into(),
            "--enable-scheme=pytorchjob".into(),
            "--leader-elect=false".into(),
        ];
        if !self.cli.to_upstream_defaults {
            self.to_flags
                .push(format!("--controller-threads={threads}"));
            self.to_flags
                .push(format!("--kube-api-qps={}", self.cli.to_qps));
            self.to_flags
                .push(format!("--kube-api-burst={}", self.cli.to_burst));
        }
        let mut cmd = Command::new(&bin);
        cmd.env_remove("KUBECONFIG")
            .env("TMPDIR", &tmp)
            .env("MY_POD_NAMESPACE", "kubeflow")
            .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
            .arg(format!("--metrics-bind-address=127.0.0.1:{p_metrics}"))
            .arg(format!("--health-probe-bind-address=127.0.0.1:{p_probe}"))
            .arg(format!("--webhook-server-port={p_webhook}"))
            .args(&self.to_flags);
        let probe: SocketAddr = format!("127.0.0.1:{p_probe}").parse()?;
        let mut to = Proc::spawn(
            "training-operator",
            cmd,
            self.out.join("training-operator.log"),
            Some(probe),
        )?;
        let ready = wait_ready(&mut to, Duration::from_secs(180)).await?;
        // Controllers start only after the certificates are ready.
        let log_path = to.log.clone();
        let started = poll_until(Duration::from_secs(180), Duration::from_millis(200), || {
            std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("Starting workers"))
        })
        .await;
        if !started {
            self.to_status = format!(
                "not measured: training-operator never started its workers:\n{}",
                to.log_tail(20)
            );
            return Ok(());
        }
        let workers_s = to.spawned.elapsed();
        log!(
            "training-operator ready in {:.1} s, workers started at {:.1} s (flags {:?})",
            ready.as_secs_f64(),
            workers_s.as_secs_f64(),
            self.to_flags
        );

        create_namespaces(&client, "to", m, &[]).await?;
        let watch = PgWatch::start(&client).await?;
        watch.begin("to-", Check::MinMember(4));
        let before = Requests::scrape(&client).await?;
        let cpu0 = to.stats().cpu_s;
        let posts = AtomicU64::new(0);
        let t0 = Instant::now();
        let created = create_jobs(&client, "to", n, m, self.cli.creators, None, &posts).await?;
        log!(
            "training-operator, burst: {n} jobs created in {:.1} s; waiting for PodGroups",
            t0.elapsed().as_secs_f64()
        );
        let to_timeout = Duration::from_secs(
            self.cli
                .to_timeout
                .unwrap_or(((n as f64 * 0.3) as u64).max(300)),
        );
        let mut last_log = Instant::now();
        let deadline = Instant::now() + to_timeout;
        while watch.correct_count() < n && Instant::now() < deadline && to.alive() {
            if last_log.elapsed() > Duration::from_secs(15) {
                log!(
                    "training-operator: {} of {n} PodGroups after {:.0} s",
                    watch.correct_count(),
                    t0.elapsed().as_secs_f64()
                );
                last_log = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let at_pg = Requests::scrape(&client).await?;
        let stats_pg = to.stats();
        let mut p = Phase::new("training-operator-burst", n);
        p.timing(t0, &created, &watch.records(), None);
        p.requests(&at_pg.since(&before), posts.load(Ordering::Relaxed) as f64);
        p.window_len_s = t0.elapsed().as_secs_f64();
        p.process = Some(stats_pg);
        p.cpu_s = Some(round(stats_pg.cpu_s - cpu0, 2));
        p.extra.insert("ready_s".into(), json!(secs(ready)));
        p.extra
            .insert("workers_started_s".into(), json!(secs(workers_s)));
        log!(
            "training-operator: {} of {n} PodGroups, converge {:?} s; now waiting for its pods and services",
            p.correct,
            p.converge_s
        );

        // Its full cost: until it created 4 pods and 4 services per job (or stopped writing).
        let settle_deadline = Instant::now() + Duration::from_secs(self.cli.to_settle_timeout);
        let (mut last_total, mut last_change) = (0.0, Instant::now());
        let mut done_at = None;
        while Instant::now() < settle_deadline && to.alive() {
            let d = Requests::scrape(&client).await?.since(&before);
            let pods = d.sum(|v, r, c| v == "POST" && r == "pods" && c == "201");
            let svcs = d.sum(|v, r, c| v == "POST" && r == "services" && c == "201");
            if pods >= 4.0 * n as f64 && svcs >= 4.0 * n as f64 {
                done_at = Some(t0.elapsed());
                break;
            }
            let total = d.without_scrapes().total();
            if total != last_total {
                (last_total, last_change) = (total, Instant::now());
            } else if last_change.elapsed() > Duration::from_secs(30) {
                break;
            }
            if last_log.elapsed() > Duration::from_secs(15) {
                log!(
                    "training-operator: {pods} pods, {svcs} services created after {:.0} s",
                    t0.elapsed().as_secs_f64()
                );
                last_log = Instant::now();
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = Requests::scrape(&client).await?;
        let stats = to.stats();
        let d = after.since(&before).without_scrapes();
        let full_total = d.total() - p.bench_requests;
        p.extra.insert(
            "pods_created".into(),
            json!(d.sum(|v, r, c| v == "POST" && r == "pods" && c == "201")),
        );
        p.extra.insert(
            "services_created".into(),
            json!(d.sum(|v, r, c| v == "POST" && r == "services" && c == "201")),
        );
        p.extra
            .insert("all_pods_and_services_s".into(), json!(done_at.map(secs)));
        p.extra.insert(
            "full_requests_per_job".into(),
            json!(round(full_total / n as f64, 3)),
        );
        p.extra.insert(
            "full_writes_per_job".into(),
            json!(round((d.writes() - p.bench_requests) / n as f64, 3)),
        );
        p.extra
            .insert("full_requests".into(), json!(d.by_verb_resource()));
        p.extra.insert("process_at_end".into(), json!(stats));
        p.extra
            .insert("cpu_s_at_end".into(), json!(round(stats.cpu_s - cpu0, 2)));
        p.extra.insert("sample_podgroup_spec".into(), {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), "to-0", &podgroup_ar());
            api.get_opt("pj-00000")
                .await
                .ok()
                .flatten()
                .map(|pg| pg.data["spec"].clone())
                .unwrap_or(Value::Null)
        });
        self.to_status = if p.converged {
            "measured".into()
        } else {
            format!(
                "measured, but only {} of {n} PodGroups within {to_timeout:?}",
                p.correct
            )
        };
        log!(
            "training-operator: all pods and services at {:?}; peak RSS {} MiB",
            done_at,
            stats.hwm_mib
        );
        self.phases.push(p);
        tokio::task::block_in_place(|| to.terminate(Duration::from_secs(30)));
        drop(watch);
        cp.stop();
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// report

fn phase<'a>(b: &'a Bench, name: &str) -> Option<&'a Phase> {
    b.phases.iter().find(|p| p.name == name)
}

fn f(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.digits$}"),
        _ => "—".into(),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn machine() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert(
        "cpu".into(),
        sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'"),
    );
    m.insert("cores".into(), sh("nproc"));
    m.insert(
        "memory".into(),
        sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo"),
    );
    m.insert("kernel".into(), sh("uname -sr"));
    m.insert("rustc".into(), sh("rustc --version"));
    m.insert(
        "commit".into(),
        sh(&format!(
            "cd '{}' && git rev-parse --short HEAD && (git status --porcelain src Cargo.lock | grep -q . && echo '(src modified)' || true)",
            root().display()
        ))
        .replace('\n', " "),
    );
    m
}

fn write_outputs(
    b: &Bench,
    machine: &BTreeMap<String, String>,
    load_start: &str,
    load_end: &str,
    started: u64,
) -> Res<()> {
    let cli = &b.cli;
    let (n, m) = (cli.jobs, cli.namespaces);
    // per-job CSVs and the downsampled curves
    let mut curves = String::from("phase,series,x,y\n");
    for p in &b.phases {
        if p.per_job.is_empty() {
            continue;
        }
        let mut csv = String::from("job,created_s,podgroup_s\n");
        for (k, c, s) in &p.per_job {
            let _ = writeln!(csv, "{k},{c:.4},{s:.4}");
        }
        std::fs::write(b.out.join(format!("{}.jobs.csv", p.name)), csv)?;
        let mut pg: Vec<f64> = p.per_job.iter().map(|r| r.2).collect();
        pg.sort_by(f64::total_cmp);
        let mut cr: Vec<f64> = p.per_job.iter().map(|r| r.1).collect();
        cr.sort_by(f64::total_cmp);
        let mut lat: Vec<f64> = p.per_job.iter().map(|r| (r.2 - r.1) * 1000.0).collect();
        lat.sort_by(f64::total_cmp);
        let step = (pg.len() / 200).max(1);
        let idx: Vec<usize> = (0..pg.len())
            .step_by(step)
            .chain(std::iter::once(pg.len() - 1))
            .collect();
        for &i in &idx {
            let _ = writeln!(curves, "{},podgroups,{:.3},{}", p.name, pg[i], i + 1);
        }
        if p.name.ends_with("burst") {
            for &i in &idx {
                let _ = writeln!(curves, "{},jobs,{:.3},{}", p.name, cr[i], i + 1);
            }
            for &i in &idx {
                let _ = writeln!(
                    curves,
                    "{},latency_ms,{:.1},{:.4}",
                    p.name,
                    lat[i],
                    (i + 1) as f64 / lat.len() as f64
                );
            }
        }
    }
    std::fs::write(b.out.join("curves.csv"), curves)?;

    let bare = phase(b, "bare-burst");
    let bare_b = phase(b, "bare-backlog");
    let pgs = phase(b, "podgroup-sync-burst");
    let restart = phase(b, "podgroup-sync-restart");
    let pgs_b = phase(b, "podgroup-sync-backlog");
    let to = phase(b, "training-operator-burst");
    let conv = |p: Option<&Phase>| p.and_then(|p| p.converge_s);
    let hwm = |p: Option<&Phase>| p.and_then(|p| p.process).map(|s| s.hwm_mib);
    let to_hwm_end = to
        .and_then(|p| p.extra.get("process_at_end"))
        .and_then(|v| v.get("hwm_mib"))
        .and_then(Value::as_f64)
        .or(hwm(to));

    let mut goals = Vec::new();
    let verdict = |ok: Option<bool>| match ok {
        Some(true) => "met",
        Some(false) => "**not met**",
        None => "not measured",
    };
    let r_bare = ratio(conv(pgs), conv(bare));
    goals.push((
        "converge ≤ 1.2× the bare client (burst)".to_string(),
        format!(
            "{} s vs {} s = {}×",
            f(conv(pgs), 2),
            f(conv(bare), 2),
            f(r_bare, 2)
        ),
        verdict(r_bare.map(|r| r <= 1.2)),
    ));
    let r_bare_b = ratio(conv(pgs_b), conv(bare_b));
    goals.push((
        "(backlog: N jobs without PodGroups, controller started) ≤ 1.2× the bare client"
            .to_string(),
        format!(
            "{} s (from spawn) vs {} s = {}×",
            f(conv(pgs_b), 2),
            f(conv(bare_b), 2),
            f(r_bare_b, 2)
        ),
        verdict(r_bare_b.map(|r| r <= 1.2)),
    ));
    let r_to = ratio(conv(pgs), conv(to));
    goals.push((
        "converge ≤ 0.5× training-operator".to_string(),
        format!(
            "{} s vs {} s = {}×",
            f(conv(pgs), 2),
            f(conv(to), 2),
            f(r_to, 2)
        ),
        verdict(r_to.map(|r| r <= 0.5)),
    ));
    let r_rss = ratio(hwm(pgs), to_hwm_end);
    goals.push((
        "peak RSS ≤ 0.5× training-operator's".to_string(),
        format!(
            "{} MiB vs {} MiB = {}×",
            f(hwm(pgs), 1),
            f(to_hwm_end, 1),
            f(r_rss, 2)
        ),
        verdict(r_rss.map(|r| r <= 0.5)),
    ));
    let w = pgs.map(|p| p.podgroup_writes_per_job);
    goals.push((
        "1 PodGroup write per job on creation".to_string(),
        format!("{} per job", f(w, 3)),
        verdict(w.map(|w| (w - 1.0).abs() < 1e-9)),
    ));
    let rw = restart.map(|p| p.podgroup_writes);
    goals.push((
        "0 PodGroup writes on restart / resync".to_string(),
        f(rw, 0),
        verdict(rw.map(|w| w == 0.0)),
    ));

    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Scale benchmark: podgroup-sync vs the bare client vs training-operator\n"
    );
    let _ = writeln!(
        md,
        "{n} PyTorchJobs (Master 1 + Worker 3, every template labelled `{POD_GROUP_LABEL}: <job>`) across {m} namespaces, created at once ({} creates in flight); controller `--concurrency={}`{}. Each contender on a fresh control plane (etcd 3.6.5, kube-apiserver and kube-controller-manager v1.34.4, `tests/cluster/start.sh`), one after another, same machine.\n",
        cli.creators,
        cli.concurrency,
        if cli.controller_args.is_empty() && cli.controller_env.is_empty() {
            String::new()
        } else {
            format!(
                " plus `{}`",
                cli.controller_env
                    .iter()
                    .chain(&cli.controller_args)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        }
    );
    let _ = writeln!(
        md,
        "Generated by `cargo bench --bench scale -- --jobs {n} --namespaces {m} --concurrency {}{}` (bench/run.sh); started {} (unix {started}).\n",
        cli.concurrency,
        if cli.skip_training_operator {
            " --skip-training-operator"
        } else {
            ""
        },
        sh(&format!("date -u -d @{started} '+%Y-%m-%d %H:%M UTC'"))
    );
    let _ = writeln!(
        md,
        "## Goals (issue 7)\n\n| goal | measured | |\n|---|---|---|"
    );
    for (g, v, ok) in &goals {
        let _ = writeln!(md, "| {g} | {v} | {ok} |");
    }
    let _ = writeln!(md, "\n## Burst: {n} jobs created at once\n");
    let _ = writeln!(
        md,
        "| | podgroup-sync | bare client (limit) | training-operator |\n|---|---|---|---|"
    );
    let cols = [pgs, bare, to];
    let row = |md: &mut String, label: &str, g: &dyn Fn(&Phase) -> String| {
        let cells: Vec<String> = cols
            .iter()
            .map(|p| p.map(g).unwrap_or_else(|| "—".into()))
            .collect();
        let _ = writeln!(md, "| {label} | {} |", cells.join(" | "));
    };
    row(
        &mut md,
        "all jobs created (s after the first create)",
        &|p| f(p.create_s, 2),
    );
    row(&mut md, "**every job has a correct PodGroup (s)**", &|p| {
        if p.converged {
            format!("**{}**", f(p.converge_s, 2))
        } else {
            format!("not converged ({} of {})", p.correct, p.jobs)
        }
    });
    row(&mut md, "… after the last job was created (s)", &|p| {
        f(p.tail_s, 2)
    });
    row(
        &mut md,
        "job→PodGroup latency p50 / p90 / p99 / max (ms; create response → watch)",
        &|p| {
            p.latency
                .as_ref()
                .map(|l| {
                    format!(
                        "{:.0} / {:.0} / {:.0} / {:.0}",
                        l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
                    )
                })
                .unwrap_or_else(|| "—".into())
        },
    );
    row(
        &mut md,
        "creationTimestamp difference p50 / p99 (s, 1 s resolution)",
        &|p| {
            format!(
                "{} / {}",
                f(p.server_latency_p50_s, 0),
                f(p.server_latency_p99_s, 0)
            )
        },
    );
    row(&mut md, "PodGroup writes per job (API server)", &|p| {
        f(Some(p.podgroup_writes_per_job), 3)
    });
    row(
        &mut md,
        "API requests per job (all, minus the creator's job POSTs)",
        &|p| f(Some(p.requests_per_job), 2),
    );
    row(&mut md, "writes per job (all kinds)", &|p| {
        f(Some(p.writes_per_job), 2)
    });
    row(&mut md, "peak RSS (MiB, VmHWM)", &|p| {
        if p.name.starts_with("training") {
            format!(
                "{} at PodGroups, {} at the end",
                f(p.process.map(|s| s.hwm_mib), 1),
                f(to_hwm_end, 1)
            )
        } else {
            f(p.process.map(|s| s.hwm_mib), 1)
        }
    });
    row(&mut md, "CPU seconds (utime+stime) in the window", &|p| {
        if p.name.starts_with("training") {
            format!(
                "{} at PodGroups, {} at the end",
                f(p.cpu_s, 1),
                f(p.extra.get("cpu_s_at_end").and_then(Value::as_f64), 1)
            )
        } else {
            f(p.cpu_s, 1)
        }
    });
    if let Some(t) = to {
        let _ = writeln!(
            md,
            "\ntraining-operator, beyond its PodGroups: {} pods and {} services created; all of them after {} s; then {} API requests and {} writes per job in total.",
            f(t.extra.get("pods_created").and_then(Value::as_f64), 0),
            f(t.extra.get("services_created").and_then(Value::as_f64), 0),
            f(
                t.extra
                    .get("all_pods_and_services_s")
                    .and_then(Value::as_f64),
                1
            ),
            f(
                t.extra.get("full_requests_per_job").and_then(Value::as_f64),
                2
            ),
            f(
                t.extra.get("full_writes_per_job").and_then(Value::as_f64),
                2
            ),
        );
        let _ = writeln!(
            md,
            "Its PodGroup spec: `{}` (podgroup-sync: `{}`).",
            t.extra
                .get("sample_podgroup_spec")
                .cloned()
                .unwrap_or(Value::Null),
            desired_pod_group("a", "a", "a")
                .map(|d| d["spec"].clone())
                .unwrap_or(Value::Null)
        );
    }
    let _ = writeln!(
        md,
        "\ntraining-operator: {}; flags `{}`.",
        if b.to_status.is_empty() {
            "not run"
        } else {
            &b.to_status
        },
        b.to_flags.join(" ")
    );

    let _ = writeln!(
        md,
        "\n## Backlog: {n} jobs exist, no PodGroups\n\n| | podgroup-sync (started) | bare client |\n|---|---|---|"
    );
    let _ = writeln!(
        md,
        "| every job has a correct PodGroup (s) | {} from spawn ({} after /readyz at {} s) | {} from the first write |",
        f(conv(pgs_b), 2),
        f(
            pgs_b
                .and_then(|p| p.extra.get("converge_after_ready_s"))
                .and_then(Value::as_f64),
            2
        ),
        f(
            pgs_b
                .and_then(|p| p.extra.get("ready_s"))
                .and_then(Value::as_f64),
            2
        ),
        f(conv(bare_b), 2)
    );
    let _ = writeln!(
        md,
        "| PodGroup writes per job | {} | {} |",
        f(pgs_b.map(|p| p.podgroup_writes_per_job), 3),
        f(bare_b.map(|p| p.podgroup_writes_per_job), 3)
    );
    let _ = writeln!(
        md,
        "| API requests per job | {} | {} |",
        f(pgs_b.map(|p| p.requests_per_job), 2),
        f(bare_b.map(|p| p.requests_per_job), 2)
    );
    let _ = writeln!(
        md,
        "| peak RSS (MiB) / CPU s | {} / {} | — |",
        f(hwm(pgs_b), 1),
        f(pgs_b.and_then(|p| p.cpu_s), 1)
    );

    if let Some(r) = restart {
        let g = |k: &str| r.extra.get(k).and_then(Value::as_f64);
        let _ = writeln!(
            md,
            "\n## Restart with nothing changed (steady state)\n\n| | podgroup-sync |\n|---|---|"
        );
        let _ = writeln!(md, "| SIGTERM → exit (s) | {} |", f(g("shutdown_s"), 2));
        let _ = writeln!(md, "| spawn → /readyz 200 (s) | {} |", f(g("ready_s"), 2));
        let _ = writeln!(
            md,
            "| spawn → `podgroup_sync_reconcile_total` ≥ {n} (s) | {} |",
            f(g("all_reconciled_s"), 2)
        );
        let _ = writeln!(
            md,
            "| reconciles (settled at {} s) | {} |",
            f(g("reconciles_settled_s"), 2),
            f(g("controller_reconciles"), 0)
        );
        let _ = writeln!(
            md,
            "| **PodGroup writes** (API server / controller's count) | **{}** / {} |",
            f(Some(r.podgroup_writes), 0),
            f(g("controller_podgroup_writes"), 0)
        );
        let _ = writeln!(md, "| Event writes | {} |", f(g("event_writes"), 0));
        let _ = writeln!(
            md,
            "| API requests (all) | {} |",
            f(Some(r.requests.values().sum()), 0)
        );
        let _ = writeln!(
            md,
            "| peak RSS (MiB) / CPU s | {} / {} |",
            f(hwm(Some(r)), 1),
            f(r.cpu_s, 1)
        );
    }

    let _ = writeln!(
        md,
        "\n## API requests by verb and resource (API server `apiserver_request_total` deltas)\n"
    );
    let names: Vec<&Phase> = b.phases.iter().collect();
    let mut keys: Vec<String> = names
        .iter()
        .flat_map(|p| p.requests.keys().cloned())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    keys.sort();
    let _ = writeln!(
        md,
        "| request | {} |\n|---|{}",
        names
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(names.len())
    );
    for k in &keys {
        let cells: Vec<String> = names
            .iter()
            .map(|p| {
                p.requests
                    .get(k)
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_default()
            })
            .collect();
        let _ = writeln!(md, "| `{k}` | {} |", cells.join(" | "));
    }
    let _ = writeln!(
        md,
        "\nEach window runs from just before the first request of the phase to 2 s after convergence (training-operator: until the PodGroups; its full window to the last pod is in summary.json). The counters are the whole API server's: the creator's job POSTs ({n} per burst) are subtracted from the per-job figures; kube-controller-manager's and the API server's own background (about 0.1 request/s: lease renewals, discovery) and the benchmark's PodGroup watch (one LIST, one WATCH per 290 s) are included. A WATCH is counted when it ends."
    );

    let _ = writeln!(md, "\n## Machine\n\n| | |\n|---|---|");
    for (k, v) in machine {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    let _ = writeln!(
        md,
        "| control plane | {}, etcd 3.6.5 (tests/cluster/get-binaries.sh) |",
        b.apiserver
    );
    let _ = writeln!(
        md,
        "| load average (1/5/15 min) at start | {load_start} |\n| load average at end | {load_end} |"
    );
    let _ = writeln!(
        md,
        "| other work on the machine | other engineers' builds and tests may run concurrently; see the load averages |"
    );
    if !b.notes.is_empty() {
        let _ = writeln!(md, "\n## Notes\n");
        for n in &b.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    if !b.failures.is_empty() {
        let _ = writeln!(md, "\n## FAILURES\n");
        for f in &b.failures {
            let _ = writeln!(md, "- {f}");
        }
    }
    std::fs::write(b.out.join("RESULTS.md"), &md)?;

    let summary = json!({
        "jobs": n, "namespaces": m, "concurrency": cli.concurrency, "creators": cli.creators,
        "controller_args": cli.controller_args, "controller_env": cli.controller_env,
        "training_operator": {"status": b.to_status, "flags": b.to_flags},
        "started_unix": started, "machine": machine, "load_start": load_start, "load_end": load_end,
        "goals": goals.iter().map(|(g, v, ok)| json!({"goal": g, "measured": v, "verdict": ok})).collect::<Vec<_>>(),
        "phases": b.phases, "failures": b.failures,
    });
    std::fs::write(
        b.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)? + "\n",
    )?;
    Ok(())
}

// ------------------------------------------------------------------------------------------

async fn run(cli: Cli) -> Res<Bench> {
    let started = unix_now();
    let out = cli
        .out
        .clone()
        .unwrap_or_else(|| root().join(format!("target/bench/scale-{started}")));
    std::fs::create_dir_all(&out)?;
    let out = out.canonicalize()?;
    let controller_bin = match &cli.controller_bin {
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
    if cli.controller_bin.is_none() {
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
    write_outputs(&b, &machine, &load_start, &load_end, started)?;
    log!(
        "wrote {}/RESULTS.md, summary.json, curves.csv",
        out.display()
    );
    Ok(b)
}

fn main() -> ExitCode {
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
    match rt.block_on(run(cli)) {
        Ok(b) if b.failures.is_empty() => ExitCode::SUCCESS,
        Ok(b) => {
            eprintln!("scale: {} correctness failure(s):", b.failures.len());
            for f in &b.failures {
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
