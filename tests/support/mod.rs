//! Shared helpers for the integration tests that run against a real control plane
//! (etcd + kube-apiserver + kube-controller-manager started by `tests/cluster/start.sh`).
//!
//! Use from a file in `tests/` with `mod support;`:
//!
//! ```ignore
//! let cluster = support::cluster().await;          // started once per test binary
//! let client = cluster.client().await;             // a fresh client for this test's runtime
//! let ns = support::test_namespace(&client, "sync", &[]).await;
//! ```
//!
//! One control plane is started per test binary, on first use, by running `start.sh` with
//! `--owner-pid <this process>`: its reaper stops every process as soon as the test binary exits,
//! whether it passed, panicked or was killed. Set `PGS_KUBECONFIG` to a kubeconfig to reuse a
//! running control plane instead (nothing is started then; `start.sh DIR` and
//! `PGS_KUBECONFIG=DIR/kubeconfig` give a fast edit-test loop).
//!
//! If the control plane cannot start, every test that asks for it panics: these tests fail,
//! they never skip.
#![allow(dead_code)]

pub mod chart;
pub mod controller;
pub mod faults;
pub mod jobs;
pub mod lifecycle;
pub mod lws;
pub mod webhook;

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// A control plane the tests can talk to.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Admin kubeconfig (client certificate in group system:masters).
    pub kubeconfig: PathBuf,
    /// start.sh's work directory (logs, PKI, `env`, `pids`); `None` when reusing `PGS_KUBECONFIG`.
    pub work_dir: Option<PathBuf>,
    /// Directory with etcd, kube-apiserver, kube-controller-manager and kubectl.
    pub bin_dir: PathBuf,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// Whether this test binary's control planes run Kubernetes' own gang scheduling (1.37 with the
/// GenericWorkload gate; start.sh's NATIVE_GANG=1).
static NATIVE_GANG: AtomicBool = AtomicBool::new(false);

/// Makes every control plane this test binary starts a native-gang one (Kubernetes 1.37,
/// scheduling.k8s.io/v1beta1 served, kube-scheduler available). Call it before the first
/// [`cluster`] in every test of such a binary.
pub fn use_native_gang() {
    NATIVE_GANG.store(true, Ordering::SeqCst);
}

/// Whether this test binary's native control planes also have the
/// TopologyAwareWorkloadScheduling gate on (start.sh's TOPOLOGY_GATE=1).
static TOPOLOGY_GATE: AtomicBool = AtomicBool::new(false);

/// Makes every native control plane this test binary starts keep a PodGroup's
/// `schedulingConstraints` (SPEC §13). Call it before the first [`cluster`].
pub fn use_topology_gate() {
    TOPOLOGY_GATE.store(true, Ordering::SeqCst);
}

/// Whether this test binary's control planes also serve the other operators' CRDs (JobSet,
/// LeaderWorkerSet, RayCluster, RayJob, TrainJob; start.sh's WORKLOAD_CRDS=1).
static WORKLOAD_CRDS: AtomicBool = AtomicBool::new(false);

/// Makes every control plane this test binary starts serve the other operators' CRDs. Call it
/// before the first [`cluster`] in every test of such a binary.
pub fn use_workload_crds() {
    WORKLOAD_CRDS.store(true, Ordering::SeqCst);
}

/// Whether [`use_native_gang`] was called.
pub fn native_gang() -> bool {
    NATIVE_GANG.load(Ordering::SeqCst)
}

/// The control plane shared by every test of this test binary, started on first use.
///
/// Blocks the calling thread while the control plane starts (tens of seconds warm; tens of
/// minutes when get-binaries.sh has to build the binaries). Panics if it cannot start; the
/// failure is remembered, so later tests fail at once with the same message.
pub async fn cluster() -> &'static Cluster {
    match CLUSTER.get_or_init(init_cluster) {
        Ok(cluster) => cluster,
        Err(message) => panic!("{message}"),
    }
}

impl Cluster {
    /// The PID of the control plane's process named `comm` (e.g. `kube-apiserver`, `etcd`) from
    /// start.sh's `pids`; `None` for a cluster this process did not start.
    pub fn component_pid(&self, comm: &str) -> Option<u32> {
        let pids = std::fs::read_to_string(self.work_dir.as_ref()?.join("pids")).ok()?;
        pids.lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
            })
    }

    /// A kube `Config` built from the admin kubeconfig.
    pub async fn config(&self) -> Config {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.kubeconfig.display()));
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("loading {}: {e}", self.kubeconfig.display()))
    }

    /// A new admin client. Make one per test: a client must not outlive the tokio runtime it
    /// was first used on, and every `#[tokio::test]` has its own runtime.
    pub async fn client(&self) -> Client {
        Client::try_from(self.config().await)
            .unwrap_or_else(|e| panic!("building a client for {}: {e}", self.kubeconfig.display()))
    }

    /// Runs `kubectl --kubeconfig=<admin kubeconfig> ARGS...` and returns its output, whatever its
    /// exit status. Panics only if kubectl cannot be run at all.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        let kubectl = self.bin_dir.join("kubectl");
        Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", kubectl.display()))
    }

    /// The API server's own count of the PodGroup and the Event writes it served (every verb
    /// that writes), from its `/metrics`.
    pub fn pod_group_and_event_writes(&self) -> (f64, f64) {
        let text = self.kubectl_ok(&["get", "--raw", "/metrics"]);
        let writes = |resource: &str| -> f64 {
            ["POST", "PUT", "PATCH", "DELETE", "APPLY"]
                .iter()
                .map(|verb| {
                    controller::metric_sum(
                        &text,
                        "apiserver_request_total",
                        &[("resource", resource), ("verb", verb)],
                    )
                })
                .sum()
        };
        (writes("podgroups"), writes("events"))
    }

    /// `kubectl podgroup-sync ARGS...` as a user runs it: this build's binary through a link
    /// named as kubectl's plugin convention wants (`kubectl-podgroup_sync`) on `PATH`, the
    /// cluster through `KUBECONFIG` (kubectl passes no flags of its own to a plugin). Panics
    /// unless it succeeds; returns stdout.
    pub fn kubectl_plugin(&self, args: &[&str]) -> String {
        let dir = std::env::temp_dir().join(format!("pgs-plugin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("plugin dir");
        let link = dir.join("kubectl-podgroup_sync");
        if !link.exists() {
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_podgroup-sync"), &link)
                .expect("plugin link");
        }
        let path = format!(
            "{}:{}",
            dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new(self.bin_dir.join("kubectl"))
            .arg("podgroup-sync")
            .args(args)
            .env("PATH", path)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl podgroup-sync {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Like [`Cluster::kubectl`], but panics (with stderr) unless kubectl succeeds; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A Namespace object named `name` with the given annotations.
pub fn namespace(name: &str, annotations: &[(&str, &str)]) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            annotations: (!annotations.is_empty()).then(|| {
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// Creates a namespace named `<prefix>-<suffix>` (the API server's `generateName` picks the
/// suffix) with the given annotations and returns its name. `prefix` should be a short DNS label
/// (lower case, digits, '-').
pub async fn test_namespace(client: &Client, prefix: &str, annotations: &[(&str, &str)]) -> String {
    let api: Api<Namespace> = Api::all(client.clone());
    let prefix: String = prefix.to_ascii_lowercase().chars().take(48).collect();
    let mut ns = namespace("", annotations);
    ns.metadata.name = None;
    ns.metadata.generate_name = Some(format!("{}-", prefix.trim_end_matches('-')));
    // generateName may collide (409) on a rare suffix clash: try again.
    for _ in 0..5 {
        match api.create(&PostParams::default(), &ns).await {
            Ok(created) => return created.metadata.name.expect("a generated name"),
            Err(kube::Error::Api(status)) if status.is_already_exists() => continue,
            Err(e) => panic!("creating a namespace named {prefix}-…: {e}"),
        }
    }
    panic!("could not create a namespace for prefix {prefix:?}")
}

/// Polls `f` every 200 ms until it returns `Some`, and returns that value. Panics, naming
/// `what`, when `timeout` passes first (also if a single call of `f` is still running then).
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, f()).await {
            Ok(Some(value)) => return value,
            Ok(None) => {}
            Err(_) => {
                panic!("timed out after {timeout:?} waiting for {what} (the last check hung)")
            }
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn cluster_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("cluster")
}

fn init_cluster() -> Result<Cluster, String> {
    match std::env::var_os("PGS_KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(kubeconfig) => reuse_cluster(PathBuf::from(kubeconfig)),
        None => start_cluster(&[]),
    }
}

/// `PGS_KUBECONFIG` is set: use that control plane. kubectl comes from `PGS_BIN_DIR`, else from
/// the `env` file start.sh wrote next to the kubeconfig, else from get-binaries.sh.
fn reuse_cluster(kubeconfig: PathBuf) -> Result<Cluster, String> {
    if !kubeconfig.is_file() {
        return Err(format!(
            "PGS_KUBECONFIG={} is not a file",
            kubeconfig.display()
        ));
    }
    let env_file = kubeconfig.parent().map(|d| d.join("env"));
    let bin_dir = if let Some(dir) = std::env::var_os("PGS_BIN_DIR").filter(|v| !v.is_empty()) {
        PathBuf::from(dir)
    } else if let Some(env_file) = env_file.filter(|f| f.is_file()) {
        bin_from_env_file(&env_file)?
    } else {
        let script = cluster_dir().join("get-binaries.sh");
        let out = Command::new(&script)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match stdout
            .lines()
            .filter_map(|l| l.strip_prefix("BIN="))
            .next_back()
        {
            Some(bin) if out.status.success() => PathBuf::from(bin),
            _ => return Err(format!("{} failed ({})", script.display(), out.status)),
        }
    };
    Ok(Cluster {
        kubeconfig,
        work_dir: None,
        bin_dir,
    })
}

/// Runs `command` and returns its standard output; panics unless it ran and succeeded, naming
/// the command and quoting its stderr.
pub fn stdout_of(command: &mut Command) -> Vec<u8> {
    let what = format!("{command:?}");
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A control plane of the caller's own (not the shared one), started now: for tests that stop
/// and kill its processes. Stopped when this test process exits, like the shared one.
pub fn private_cluster() -> Cluster {
    private_cluster_with(&[])
}

/// [`private_cluster`] with start.sh options as environment variables (e.g. `START_KCM=0`: no
/// kube-controller-manager, so no garbage collector).
pub fn private_cluster_with(env: &[(&str, &str)]) -> Cluster {
    start_cluster(env).unwrap_or_else(|message| panic!("{message}"))
}

/// Stops a control plane started by [`private_cluster`] now (its logs stay).
pub fn stop_cluster(cluster: &Cluster) {
    if let Some(dir) = &cluster.work_dir {
        let _ = Command::new(cluster_dir().join("stop.sh"))
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs start.sh in a fresh directory under the system temp dir, owned by this process.
fn start_cluster(env: &[(&str, &str)]) -> Result<Cluster, String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let work_dir =
        std::env::temp_dir().join(format!("podgroup-sync-cp-{}-{nanos}", std::process::id()));
    let script = cluster_dir().join("start.sh");
    let fail = |what: String, stderr_tail: &str| {
        format!(
            "the test control plane could not start: {what}\n\
             work dir (logs): {}\n\
             (control-plane tests fail rather than skip{}; set PGS_KUBECONFIG to reuse a running one)\n\
             ----- last lines of start.sh's stderr -----\n{stderr_tail}",
            work_dir.display(),
            if std::env::var_os("CI").is_some() {
                ", and CI is set"
            } else {
                ""
            },
        )
    };

    let mut command = Command::new(&script);
    command
        .arg(&work_dir)
        .arg("--owner-pid")
        .arg(std::process::id().to_string());
    if native_gang() {
        command.env("NATIVE_GANG", "1");
    }
    if TOPOLOGY_GATE.load(Ordering::SeqCst) {
        command.env("TOPOLOGY_GATE", "1");
    }
    if WORKLOAD_CRDS.load(Ordering::SeqCst) {
        command.env("WORKLOAD_CRDS", "1");
    }
    command.envs(env.iter().copied());
    let tail = run_start_script(command).map_err(|(what, tail)| fail(what, &tail))?;

    let kubeconfig = work_dir.join("kubeconfig");
    let bin_dir = bin_from_env_file(&work_dir.join("env")).map_err(|e| fail(e, &tail))?;
    if !kubeconfig.is_file() || !bin_dir.join("kubectl").is_file() {
        return Err(fail(
            format!(
                "start.sh succeeded but {} or {}/kubectl is missing",
                kubeconfig.display(),
                bin_dir.display()
            ),
            &tail,
        ));
    }
    Ok(Cluster {
        kubeconfig,
        work_dir: Some(work_dir),
        bin_dir,
    })
}

/// The value of BIN in a shell-sourceable `env` file written by start.sh.
fn bin_from_env_file(env_file: &Path) -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .args(["-c", r#"source "$1" && printf %s "$BIN""#, "bash"])
        .arg(env_file)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running bash to read {}: {e}", env_file.display()))?;
    if !out.status.success() || out.stdout.is_empty() {
        return Err(format!("no BIN in {}", env_file.display()));
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// Runs a start script with its progress forwarded to the real stderr (not libtest's capture:
/// a cold build takes many minutes). Returns the last lines of its stderr, or what failed and
/// those lines.
pub fn run_start_script(mut command: Command) -> Result<String, (String, String)> {
    let script = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| (format!("cannot run {script}: {e}"), String::new()))?;
    let stderr = child.stderr.take().expect("piped stderr");
    let forwarder = std::thread::spawn(move || {
        let mut tail: Vec<String> = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(std::io::stderr(), "{line}");
            tail.push(line);
            if tail.len() > 80 {
                tail.remove(0);
            }
        }
        tail.join("\n")
    });
    let out = child
        .wait_with_output()
        .map_err(|e| (format!("waiting for {script}: {e}"), String::new()))?;
    let tail = forwarder.join().unwrap_or_default();
    if out.status.success() {
        Ok(tail)
    } else {
        Err((format!("{script} exited with {}", out.status), tail))
    }
}
