//! The end-to-end environment: the test control plane (`support::cluster`), the components
//! started by `tests/e2e/start.sh` (kwok, both schedulers, the Kubeflow operators), and one
//! podgroup-sync process; plus kwok node pools, training-job manifests and pod observations.
//!
//! Everything is started once per test binary and tethered to it. Set `PGS_E2E_DIR` to the work
//! directory of a running `tests/e2e/start.sh` (together with `PGS_KUBECONFIG`) to reuse its
//! components instead.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::support::controller::{self, Controller};
use crate::support::jobs::{self, Backend, Kind};
use crate::support::{self, Cluster};

/// Namespace annotation that enables podgroup-sync.
pub const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");
/// Node label that ties a test's pods (via nodeSelector) to the test's own kwok nodes.
pub const POOL_LABEL: &str = "e2e.podgroup-sync.io/pool";
/// Pod template label linking a pod to its job for these tests (the operators copy it).
pub const JOB_LABEL: &str = "e2e.podgroup-sync.io/job";
/// Pods with this label set to "true" are made to exit 0 by the kwok stage in start.sh.
pub const SUCCEED_LABEL: &str = "e2e.podgroup-sync.io/succeed";
pub const GPU: &str = "nvidia.com/gpu";

/// How long a test waits for schedulers, operators and podgroup-sync to act (2 busy cores).
pub const SLOW: Duration = Duration::from_secs(240);

/// The running environment.
pub struct Env {
    pub cluster: &'static Cluster,
    /// start.sh's work directory (logs).
    pub dir: PathBuf,
    pub controller: Mutex<Controller>,
}

static ENV: OnceLock<Result<Env, String>> = OnceLock::new();

/// Scenarios need exclusive use of the schedulers' view of GPU capacity (Volcano admits gangs
/// against the whole cluster), so they run one at a time.
static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shared environment, started on first use (blocks while components start or build).
/// Panics when it cannot start: these tests fail, they never skip.
pub async fn env() -> &'static Env {
    // The JobSet controller and KubeRay need their CRDs.
    support::use_workload_crds();
    let cluster = support::cluster().await;
    match ENV.get_or_init(|| init(cluster)) {
        Ok(env) => env,
        Err(message) => panic!("{message}"),
    }
}

/// Waits for the right to use GPU capacity alone.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    EXCLUSIVE.lock().await
}

fn init(cluster: &'static Cluster) -> Result<Env, String> {
    let dir = match std::env::var_os("PGS_E2E_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if !dir.join("env").is_file() {
                return Err(format!(
                    "PGS_E2E_DIR={}: no env file (is tests/e2e/start.sh running there?)",
                    dir.display()
                ));
            }
            dir
        }
        None => start_components(cluster)?,
    };
    // The pod-link webhook on (coscheduling runs in the default scheduler here), reached by
    // the API server on loopback with a CA of the test's own.
    let certs = support::webhook::certs(&dir.join("webhook"), "e2e-webhook-ca");
    let port = support::controller::free_port();
    let mut args = support::webhook::args(port, &certs);
    args.extend(
        [
            "--gang-wait-warning-seconds",
            "3",
            "--gang-broken-seconds",
            "3",
            "--link-coscheduling-scheduler-name=",
            // SPEC §12: Kueue (start.sh) runs an Indexed Job.
            "--batch-jobs",
        ]
        .map(String::from),
    );
    // Kueue's waitForPodsReady timeout, as start.sh configures it.
    let pods_ready = std::env::var("KUEUE_PODS_READY_TIMEOUT").unwrap_or_else(|_| "40".into());
    args.extend(["--kueue-pods-ready-timeout-seconds".into(), pods_ready]);
    let controller = std::panic::catch_unwind(|| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        controller::start(cluster, None, &args)
    })
    .map_err(|e| {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("podgroup-sync could not start: {msg}")
    })?;
    let config = support::webhook::configuration_json("podgroup-sync-e2e", port, &certs.ca_pem);
    let path = dir.join("webhook.json");
    std::fs::write(&path, config.to_string()).map_err(|e| e.to_string())?;
    let out = cluster.kubectl(&["apply", "-f", &path.display().to_string()]);
    if !out.status.success() {
        return Err(format!(
            "registering the webhook: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Env {
        cluster,
        dir,
        controller: Mutex::new(controller),
    })
}

/// Starts the components; again in a fresh directory (up to 3 times) when one of them exited
/// because a port start.sh found free was taken before it bound it (the fault tier runs
/// beside this one and binds ports of its own).
fn start_components(cluster: &Cluster) -> Result<PathBuf, String> {
    let mut attempt = 1;
    loop {
        match start_components_once(cluster) {
            Ok(dir) => return Ok(dir),
            Err((_, dir)) if attempt < 3 && lost_a_port(&dir) => {
                eprintln!(
                    "[e2e] a component lost its port to another process (logs: {}); starting \
                     again, attempt {}",
                    dir.display(),
                    attempt + 1
                );
                attempt += 1;
            }
            Err((message, _)) => return Err(message),
        }
    }
}

/// Whether a component's log in `dir` says its port was taken.
fn lost_a_port(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .any(|e| {
            std::fs::read_to_string(e.path())
                .is_ok_and(|text| text.contains("address already in use"))
        })
}

fn start_components_once(cluster: &Cluster) -> Result<PathBuf, (String, PathBuf)> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let base = cluster.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("e2e-{}-{nanos}", std::process::id()));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/start.sh");
    let fail = |what: String, tail: &str| {
        format!(
            "the e2e components could not start: {what}\nwork dir (logs): {}\n\
             (e2e tests fail rather than skip{})\n----- last lines of start.sh's stderr -----\n{tail}",
            dir.display(),
            if std::env::var_os("CI").is_some() {
                ", and CI is set"
            } else {
                ""
            }
        )
    };
    let mut command = Command::new(&script);
    command
        .arg(&dir)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .arg("--owner-pid")
        .arg(std::process::id().to_string())
        .env("PGS_BIN_DIR", &cluster.bin_dir);
    if support::native_gang() {
        command.env("E2E_NATIVE", "1");
    }
    support::run_start_script(command).map_err(|(what, tail)| (fail(what, &tail), dir.clone()))?;
    Ok(dir)
}

impl Env {
    pub async fn client(&self) -> Client {
        self.cluster.client().await
    }

    /// What a failing test prints: the namespace's objects and the components' log tails.
    pub fn diagnostics(&self, ns: &str) -> String {
        let mut s = String::new();
        for args in [
            vec!["get", "nodes", "-o", "wide", "--show-labels"],
            vec!["-n", ns, "get", "pods", "-o", "wide"],
            vec![
                "-n",
                ns,
                "get",
                "pods",
                "-o",
                "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,SCHEDULED:.status.conditions[?(@.type=='PodScheduled')].message",
            ],
            vec![
                "-n",
                ns,
                "get",
                if support::native_gang() {
                    "podgroups.scheduling.k8s.io"
                } else {
                    "podgroups.scheduling.x-k8s.io,podgroups.scheduling.volcano.sh"
                },
                "-o",
                "yaml",
            ],
            vec!["-n", ns, "get", "events", "--sort-by=.lastTimestamp"],
        ] {
            let out = self.cluster.kubectl(&args);
            s += &format!(
                "\n$ kubectl {}\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for log in [
            "sp-scheduler",
            "vc-scheduler",
            "kube-scheduler",
            "training-operator",
            "mpi-operator",
        ] {
            let text =
                std::fs::read_to_string(self.dir.join(format!("{log}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().filter(|l| l.contains(ns)).collect();
            s += &format!(
                "\n----- {log}.log, last lines naming {ns} -----\n{}",
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
        let tail = self
            .controller
            .lock()
            .map(|c| c.log_tail())
            .unwrap_or_default();
        s + &format!(
            "\n----- podgroup-sync log tail -----\n{tail}\n(logs: {})",
            self.dir.display()
        )
    }

    /// Polls `check` every 500 ms until it returns `Some`; on timeout panics with `what` and the
    /// namespace's diagnostics.
    pub async fn wait<T, F, Fut>(&self, ns: &str, what: &str, timeout: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(v)) = tokio::time::timeout_at(deadline, check()).await {
                return v;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for: {what}\n{}",
                    self.diagnostics(ns)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// A test's namespace and its own kwok nodes (labelled `POOL_LABEL=<namespace>`).
pub struct Scope {
    pub env: &'static Env,
    pub client: Client,
    pub ns: String,
    /// Short unique suffix for object names (the scheduler-plugins controller matches pods to
    /// PodGroups by name across all namespaces, so names are kept unique cluster-wide).
    pub id: String,
    nodes: Vec<String>,
    cleaned: bool,
}

impl Scope {
    pub async fn new(prefix: &str, enabled: bool) -> Scope {
        let env = env().await;
        let client = env.client().await;
        let annotations: &[(&str, &str)] = if enabled { &[ENABLED] } else { &[] };
        let ns = support::test_namespace(&client, prefix, annotations).await;
        let id = ns.rsplit('-').next().unwrap_or("x").to_string();
        Scope {
            env,
            client,
            ns,
            id,
            nodes: Vec::new(),
            cleaned: false,
        }
    }

    /// The node pool's label value (the main namespace's name).
    pub fn pool(&self) -> &str {
        &self.ns
    }

    /// Adds a kwok node (4 cpu, 16Gi, `gpus` × nvidia.com/gpu) to this scope's pool and waits
    /// until kwok reports it Ready.
    pub async fn add_node(&mut self, gpus: u32) -> String {
        let pool = self.ns.clone();
        self.add_node_to(&pool, gpus).await
    }

    /// Like [`Scope::add_node`], for another pool of this scope (a label value such as
    /// `<namespace>-b`).
    pub async fn add_node_to(&mut self, pool: &str, gpus: u32) -> String {
        self.add_labelled_node(pool, gpus, json!({})).await
    }

    /// Like [`Scope::add_node_to`], the node carrying these labels besides (a rack's).
    pub async fn add_labelled_node(&mut self, pool: &str, gpus: u32, extra: Value) -> String {
        let resources = json!({"cpu": "4", "memory": "16Gi", "pods": "110", GPU: gpus.to_string()});
        self.add_node_with(pool, resources, extra).await
    }

    /// A kwok node of `pool` with these resources (capacity and allocatable) and extra labels.
    pub async fn add_node_with(&mut self, pool: &str, resources: Value, extra: Value) -> String {
        let name = format!("{pool}-n{}", self.nodes.len() + 1);
        let mut labels = json!({
            POOL_LABEL: pool,
            "type": "kwok",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            labels[k] = v.clone();
        }
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": labels,
            },
            "status": {"capacity": resources, "allocatable": resources},
        }))
        .expect("node manifest");
        let api: Api<Node> = Api::all(self.client.clone());
        api.create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("create node {name}: {e}"));
        self.nodes.push(name.clone());
        let what = format!("kwok to make node {name} Ready");
        self.env
            .wait(&self.ns, &what, SLOW, || async {
                let node = api.get_opt(&name).await.ok()??;
                let ready = node
                    .status?
                    .conditions?
                    .into_iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(())
            })
            .await;
        name
    }

    pub async fn create(&self, ns: &str, kind: Kind, manifest: &Value) -> DynamicObject {
        jobs::create(&self.client, ns, kind, manifest).await
    }

    /// Creates `manifest`, an object of `ar` (a kind podgroup-sync does not watch itself, or a
    /// LeaderWorkerSet), in this scope's namespace.
    pub async fn create_as(&self, ar: &kube::api::ApiResource, manifest: Value) -> DynamicObject {
        let obj: DynamicObject = serde_json::from_value(manifest).expect("manifest");
        jobs::api(&self.client, &self.ns, ar)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {} in {}: {e}", ar.kind, self.ns))
    }

    /// The pods of job `job` in `ns` (by the test's job label).
    pub async fn pods(&self, ns: &str, job: &str) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().labels(&format!("{JOB_LABEL}={job}")))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// Waits until job `job` has exactly `count` pods and every one of them is Running on a
    /// node of this scope's pool; returns them.
    pub async fn wait_all_running(&self, ns: &str, job: &str, count: usize) -> Vec<Pod> {
        let what = format!(
            "all {count} pods of {ns}/{job} Running on pool {}",
            self.pool()
        );
        self.env
            .wait(ns, &what, SLOW, || async {
                let pods = self.pods(ns, job).await;
                (pods.len() == count && pods.iter().all(|p| is_running(p) && self.on_pool(p)))
                    .then_some(pods)
            })
            .await
    }

    /// Waits until job `job` has `count` pods that the scheduler has tried and refused
    /// (condition PodScheduled=False); returns them.
    pub async fn wait_all_refused(&self, ns: &str, job: &str, count: usize) -> Vec<Pod> {
        let what = format!(
            "all {count} pods of {ns}/{job} refused by their scheduler (PodScheduled=False)"
        );
        self.env
            .wait(ns, &what, SLOW, || async {
                let pods = self.pods(ns, job).await;
                (pods.len() == count && pods.iter().all(is_refused)).then_some(pods)
            })
            .await
    }

    fn on_pool(&self, pod: &Pod) -> bool {
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some_and(|n| self.nodes.contains(n))
    }

    /// Waits for an Event with `reason` on object `name` in `ns` (reported by podgroup-sync).
    pub async fn wait_event(&self, ns: &str, name: &str, reason: &str) -> String {
        let what = format!("Event {reason} on {ns}/{name}");
        self.env
            .wait(ns, &what, SLOW, || async {
                let events = jobs::events(&self.client, ns, name, reason).await;
                events
                    .into_iter()
                    .next()
                    .map(|e| e.note.unwrap_or_default())
            })
            .await
    }

    pub async fn wait_pg(
        &self,
        ns: &str,
        backend: Backend,
        name: &str,
        what: &str,
        check: impl Fn(&DynamicObject) -> bool,
    ) -> DynamicObject {
        let what = format!("PodGroup {ns}/{name}: {what}");
        self.env
            .wait(ns, &what, SLOW, || async {
                jobs::get_pg(&self.client, ns, backend, name)
                    .await
                    .filter(|pg| check(pg))
            })
            .await
    }

    pub async fn wait_pg_gone(&self, ns: &str, backend: Backend, name: &str, what: &str) {
        let what = format!("PodGroup {ns}/{name} gone: {what}");
        self.env
            .wait(ns, &what, SLOW, || async {
                jobs::get_pg(&self.client, ns, backend, name)
                    .await
                    .is_none()
                    .then_some(())
            })
            .await
    }

    /// Waits until the job's status has condition `type_` = True.
    pub async fn wait_job_condition(&self, ns: &str, kind: Kind, name: &str, type_: &str) {
        let what = format!("{kind:?} {ns}/{name} condition {type_}=True");
        let api = jobs::api(&self.client, ns, &kind.ar());
        self.env
            .wait(ns, &what, SLOW, || async {
                let job = api.get_opt(name).await.ok()??;
                let conditions = job.data.pointer("/status/conditions")?.as_array()?.clone();
                conditions
                    .iter()
                    .any(|c| c["type"] == type_ && c["status"] == "True")
                    .then_some(())
            })
            .await
    }

    pub fn diagnostics(&self) -> String {
        self.env.diagnostics(&self.ns)
    }

    /// A node of this scope is lost to the gang: cordoned, and the pod on it deleted at once
    /// (as a node drain or failure does), so the operator's replacement finds no room there.
    pub async fn lose_node(&mut self, node: &str, pod: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let cordon = json!({"spec": {"unschedulable": true}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&cordon))
            .await
            .unwrap_or_else(|e| panic!("cordon node {node}: {e}"));
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        pods.delete(pod, &DeleteParams::background().grace_period(0))
            .await
            .unwrap_or_else(|e| panic!("delete pod {pod}: {e}"));
    }

    /// Deletes the namespace, waits until its pods are gone (so nothing keeps reserving GPUs or
    /// Volcano queue capacity for the next test), then deletes the pool's nodes.
    pub async fn cleanup(mut self) {
        let ns_api: Api<Namespace> = Api::all(self.client.clone());
        let _ = ns_api.delete(&self.ns, &DeleteParams::background()).await;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let what = format!("the pods of deleted namespace {} to be gone", self.ns);
        self.env
            .wait(&self.ns, &what, SLOW, || async {
                pods.list(&ListParams::default())
                    .await
                    .ok()
                    .filter(|l| l.items.is_empty())
                    .map(|_| ())
            })
            .await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        for node in &self.nodes {
            let _ = nodes.delete(node, &DeleteParams::background()).await;
        }
        self.cleaned = true;
    }
}

impl Drop for Scope {
    /// A test that failed before `cleanup` still releases what it holds (without waiting), so
    /// that its gangs do not occupy Volcano queue capacity during the next test.
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let _ = self.env.cluster.kubectl(&[
            "delete",
            "namespace",
            "--wait=false",
            "--ignore-not-found",
            &self.ns,
        ]);
        if !self.nodes.is_empty() {
            let mut args = vec!["delete", "node", "--wait=false", "--ignore-not-found"];
            args.extend(self.nodes.iter().map(String::as_str));
            let _ = self.env.cluster.kubectl(&args);
        }
    }
}

pub fn is_bound(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
}

pub fn is_running(pod: &Pod) -> bool {
    is_bound(pod) && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The scheduler tried this pod and could not (or would not) place it.
pub fn is_refused(pod: &Pod) -> bool {
    !is_bound(pod)
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
}

pub fn names_of(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| {
            format!(
                "{}@{}",
                p.metadata.name.clone().unwrap_or_default(),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_else(|| "-".into())
            )
        })
        .collect()
}

/// How the pods of a test job refer to their scheduler and gang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Zero-touch: templates with no pod link and no schedulerName; the job names its backend
    /// by annotation and the pod-link webhook links the pods (SPEC §8).
    Gang(Backend),
    /// The backend's pod link to PodGroup `<job name>` and its scheduler in every template, by
    /// hand (the path without the webhook).
    HandLinked(Backend),
    /// The backend's scheduler, but no pod link: the scheduler treats each pod on its own.
    Plain(Backend),
}

impl Link {
    fn backend(self) -> Backend {
        match self {
            Link::Gang(b) | Link::HandLinked(b) | Link::Plain(b) => b,
        }
    }
}

/// One replica type of a test job.
#[derive(Debug, Clone, Copy)]
pub struct Replicas {
    pub type_: &'static str,
    pub count: u32,
    /// nvidia.com/gpu per pod (request = limit).
    pub gpus: u32,
    /// Its pods exit 0 two seconds after they start (kwok stage e2e-pod-succeed).
    pub succeed: bool,
}

pub const fn replicas(type_: &'static str, count: u32, gpus: u32) -> Replicas {
    Replicas {
        type_,
        count,
        gpus,
        succeed: false,
    }
}

/// A pod template for `link`, pinned to pool `pool`; 500m cpu, 512Mi, `gpus` GPUs.
pub fn template(link: Link, job: &str, pool: &str, container: &str, r: &Replicas) -> Value {
    let mut labels = BTreeMap::from([(JOB_LABEL.to_string(), job.to_string())]);
    let mut annotations = BTreeMap::new();
    if r.succeed {
        labels.insert(SUCCEED_LABEL.into(), "true".into());
    }
    let scheduler = match link.backend() {
        Backend::SchedulerPlugins => "default-scheduler",
        Backend::Volcano => "volcano",
        Backend::Kubernetes => "default-scheduler",
    };
    match link {
        Link::HandLinked(Backend::SchedulerPlugins) => {
            labels.insert("scheduling.x-k8s.io/pod-group".into(), job.into());
        }
        Link::HandLinked(Backend::Volcano) => {
            annotations.insert("scheduling.k8s.io/group-name".to_string(), job.to_string());
        }
        Link::HandLinked(Backend::Kubernetes) => {
            panic!("the job CRDs prune spec.schedulingGroup: only the webhook links native pods")
        }
        Link::Gang(_) | Link::Plain(_) => {}
    }
    let mut requests = json!({"cpu": "500m", "memory": "512Mi"});
    let mut limits = json!({});
    if r.gpus > 0 {
        requests[GPU] = json!(r.gpus.to_string());
        limits[GPU] = json!(r.gpus.to_string());
    }
    let mut template = json!({
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {POOL_LABEL: pool},
            "containers": [{
                "name": container,
                "image": "registry.invalid/e2e:never-pulled",
                "resources": {"requests": requests, "limits": limits},
            }],
        },
    });
    if matches!(link, Link::Gang(_)) {
        template["spec"]
            .as_object_mut()
            .unwrap()
            .remove("schedulerName");
    }
    template
}

/// A training job of `kind` named `name` with the given replica types, its pods linked per `link`
/// and pinned to `pool`. `spec_extra` is merged into `spec` (e.g. the MPIJob launcher policy).
pub fn training_job(
    kind: Kind,
    link: Link,
    name: &str,
    pool: &str,
    replica_types: &[Replicas],
    spec_extra: Value,
) -> Value {
    let (field, container) = match kind {
        Kind::PyTorchJob => ("pytorchReplicaSpecs", "pytorch"),
        Kind::TFJob => ("tfReplicaSpecs", "tensorflow"),
        Kind::MPIJob | Kind::MPIJobV1 => ("mpiReplicaSpecs", "mpi"),
        Kind::XGBoostJob => ("xgbReplicaSpecs", "xgboost"),
        Kind::PaddleJob => ("paddleReplicaSpecs", "paddle"),
        Kind::JAXJob => ("jaxReplicaSpecs", "jax"),
        Kind::JobSet | Kind::RayCluster | Kind::IndexedJob => {
            unreachable!("{kind:?}: see jobset() and raycluster()")
        }
    };
    let mut specs = serde_json::Map::new();
    for r in replica_types {
        specs.insert(
            r.type_.to_string(),
            json!({
                "replicas": r.count,
                "restartPolicy": "Never",
                "template": template(link, name, pool, container, r),
            }),
        );
    }
    let ar = kind.ar();
    let spec = merged(json!({ field: specs }), &spec_extra);
    let metadata = backend_annotated(link, json!({"name": name}));
    json!({"apiVersion": ar.api_version, "kind": ar.kind, "metadata": metadata, "spec": spec})
}

/// A JobSet named `name` of replicated jobs `(name, replicas, pods per Job, gpus per pod)`, each
/// Job Indexed with parallelism = completions = its pods, its pods per `link` and pinned to
/// `pool`; `spec_extra` is merged into `spec` (e.g. a startup policy).
pub fn jobset(
    link: Link,
    name: &str,
    pool: &str,
    jobs: &[(&'static str, u32, u32, u32)],
    spec_extra: Value,
) -> Value {
    let replicated: Vec<Value> = jobs
        .iter()
        .map(|&(rjob, replicas, pods, gpus)| {
            let r = self::replicas(rjob, pods, gpus);
            let mut pod = template(link, name, pool, "main", &r);
            pod["spec"]["restartPolicy"] = json!("Never");
            json!({"name": rjob, "replicas": replicas, "template": {"spec": {
                "parallelism": pods, "completions": pods, "completionMode": "Indexed",
                "backoffLimit": 0, "template": pod}}})
        })
        .collect();
    let spec = merged(json!({"replicatedJobs": replicated}), &spec_extra);
    workload(Kind::JobSet, link, name, spec)
}

/// Trainer v2's API group (TrainJob, TrainingRuntime).
pub fn trainer_ar(kind: &str, plural: &str) -> kube::api::ApiResource {
    jobs::ar("trainer.kubeflow.org", "v1alpha1", kind, plural)
}

/// A namespaced TrainingRuntime for the TrainJob `name`, named after it: Trainer's torch policy and one
/// replicated job `node` (the trainer step), whose pods are per `link` (a gang's backend is
/// annotated on the JobSet template), pinned to `pool`, with `gpus` GPUs each;
/// `pod_group_policy` (Trainer's own gang, e.g. `{"coscheduling": {}}`) when given.
pub fn training_runtime(
    link: Link,
    name: &str,
    pool: &str,
    gpus: u32,
    pod_group_policy: Option<Value>,
) -> Value {
    let mut pod = template(link, name, pool, "node", &self::replicas("node", 1, gpus));
    pod["spec"]["restartPolicy"] = json!("Never");
    // The JobSet Trainer makes carries the annotations of the runtime's template.
    let metadata = backend_annotated(link, json!({}));
    let mut spec = json!({
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {"metadata": metadata, "spec": {"replicatedJobs": [{"name": "node",
            "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                "spec": {"backoffLimit": 0, "template": pod}}}]}},
    });
    if let Some(policy) = pod_group_policy {
        spec["podGroupPolicy"] = policy;
    }
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
        "metadata": {"name": name}, "spec": spec})
}

/// A TrainJob named `name` of `nodes` nodes on the namespaced runtime of the same name.
pub fn trainjob(name: &str, nodes: u32) -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": name, "apiGroup": "trainer.kubeflow.org",
            "kind": "TrainingRuntime"}, "trainer": {"numNodes": nodes}}})
}

/// Creates TrainJob `name` of `nodes` nodes (`gpus` GPUs each) on a TrainingRuntime of its own
/// (see [`training_runtime`]) in `s`'s namespace; returns the TrainJob.
pub async fn create_trainjob(
    s: &Scope,
    link: Link,
    name: &str,
    nodes: u32,
    gpus: u32,
    pod_group_policy: Option<Value>,
) -> DynamicObject {
    let runtime = training_runtime(link, name, s.pool(), gpus, pod_group_policy);
    s.create_as(&trainer_ar("TrainingRuntime", "trainingruntimes"), runtime)
        .await;
    let trainjob = trainjob(name, nodes);
    s.create_as(&trainer_ar("TrainJob", "trainjobs"), trainjob)
        .await
}

/// A RayCluster named `name`: a head without GPUs and one worker group of `replicas` ×
/// `hosts` pods of one GPU (minReplicas = replicas), its pods per `link`, pinned to `pool`.
pub fn raycluster(link: Link, name: &str, pool: &str, replicas: u32, hosts: u32) -> Value {
    let head = template(link, name, pool, "ray-head", &self::replicas("head", 1, 0));
    let worker = template(
        link,
        name,
        pool,
        "ray-worker",
        &self::replicas("worker", 1, 1),
    );
    let spec = json!({
        "headGroupSpec": {"rayStartParams": {}, "template": head},
        "workerGroupSpecs": [{"groupName": "gpu", "replicas": replicas, "minReplicas": replicas,
            "maxReplicas": replicas + 2, "numOfHosts": hosts, "rayStartParams": {},
            "template": worker}],
    });
    workload(Kind::RayCluster, link, name, spec)
}

pub fn rayjob_ar() -> kube::api::ApiResource {
    jobs::ar("ray.io", "v1", "RayJob", "rayjobs")
}

/// A RayJob `name` whose RayCluster is [`raycluster`]`(link, name, pool, replicas, hosts)`, with
/// `metadata_extra`'s labels (e.g. a Kueue queue) merged into its metadata. KubeRay suspends only
/// a RayJob that shuts its cluster down when done, so it does.
pub fn rayjob(
    link: Link,
    name: &str,
    pool: &str,
    replicas: u32,
    hosts: u32,
    metadata_extra: Value,
) -> Value {
    let cluster = raycluster(link, name, pool, replicas, hosts);
    let mut metadata = cluster["metadata"].clone();
    if let Some(labels) = metadata_extra.get("labels") {
        metadata["labels"] = labels.clone();
    }
    json!({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata,
        "spec": {"entrypoint": "python -c 'print(1)'", "shutdownAfterJobFinishes": true,
            "rayClusterSpec": cluster["spec"]}})
}

/// Waits until RayJob `name` of this scope names the RayCluster KubeRay made for it.
pub async fn rayjob_cluster(s: &Scope, name: &str) -> String {
    let api = jobs::api(&s.client, &s.ns, &rayjob_ar());
    s.env
        .wait(&s.ns, "the RayJob's RayCluster", SLOW, || async {
            let rj = api.get_opt(name).await.ok()??;
            rj.data
                .pointer("/status/rayClusterName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
        })
        .await
}

/// `metadata` with the annotation choosing the backend of a zero-touch gang (`Link::Gang`).
fn backend_annotated(link: Link, mut metadata: Value) -> Value {
    if let Link::Gang(b) = link {
        metadata["annotations"] = json!({"podgroup-sync.io/backend": b.name()});
    }
    metadata
}

/// `spec` with the fields of `extra` (an object) set on it.
fn merged(mut spec: Value, extra: &Value) -> Value {
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    spec
}

fn workload(kind: Kind, link: Link, name: &str, spec: Value) -> Value {
    let ar = kind.ar();
    let metadata = backend_annotated(link, json!({"name": name}));
    json!({"apiVersion": ar.api_version, "kind": ar.kind, "metadata": metadata, "spec": spec})
}

/// Two zero-touch PyTorchJob gangs of 4 (1 GPU a pod) on `backend`, with room for one (two
/// 2-GPU nodes): one runs whole and the other waits whole, with `waiting_reason` on it; the
/// winner deleted, the other runs whole.
pub async fn competing_gangs(s: &mut Scope, backend: Backend, waiting_reason: &str) {
    for _ in 0..2 {
        s.add_node(2).await;
    }
    let ns = s.ns.clone();
    let names = [format!("one-{}", s.id), format!("two-{}", s.id)];
    for job in &names {
        let manifest = training_job(
            Kind::PyTorchJob,
            Link::Gang(backend),
            job,
            s.pool(),
            &[replicas("Master", 1, 1), replicas("Worker", 3, 1)],
            json!({}),
        );
        s.create(&ns, Kind::PyTorchJob, &manifest).await;
    }
    let what = "one job with 4 pods Running, the other with 4 pods all refused";
    let (winner, loser) = s
        .env
        .wait(&ns, what, SLOW, || async {
            let a = s.pods(&ns, &names[0]).await;
            let b = s.pods(&ns, &names[1]).await;
            let whole = |p: &Vec<_>| p.len() == 4 && p.iter().all(is_running);
            let waiting = |p: &Vec<_>| p.len() == 4 && p.iter().all(is_refused);
            if whole(&a) && waiting(&b) {
                Some((names[0].clone(), names[1].clone()))
            } else if whole(&b) && waiting(&a) {
                Some((names[1].clone(), names[0].clone()))
            } else {
                None
            }
        })
        .await;
    eprintln!("[{ns}] {winner} runs whole, {loser} waits whole");
    s.wait_event(&ns, &loser, waiting_reason).await;
    jobs::delete(&s.client, &ns, &Kind::PyTorchJob.ar(), &winner).await;
    let pods = s.wait_all_running(&ns, &loser, 4).await;
    eprintln!(
        "[{ns}] {winner} deleted; {loser} runs whole: {:?}",
        names_of(&pods)
    );
}

/// A zero-touch MPIJob v2beta1 (1 launcher, 2 one-GPU workers) with launcherCreationPolicy
/// WaitForWorkersReady on two one-GPU nodes, on `backend`: `check` sees its PodGroup once
/// created; the job must then succeed and its PodGroup go.
pub async fn mpijob_runs_to_completion(
    s: &mut Scope,
    backend: Backend,
    check: impl Fn(&DynamicObject, &Scope),
) {
    for _ in 0..2 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let job = format!("mpi-{}", s.id);
    let manifest = training_job(
        Kind::MPIJob,
        Link::Gang(backend),
        &job,
        s.pool(),
        &[replicas("Launcher", 1, 0), replicas("Worker", 2, 1)],
        json!({
            "launcherCreationPolicy": "WaitForWorkersReady",
            "slotsPerWorker": 1,
            "runPolicy": {"cleanPodPolicy": "Running"},
        }),
    );
    s.create(&ns, Kind::MPIJob, &manifest).await;
    let pg = s.wait_pg(&ns, backend, &job, "created", |_| true).await;
    check(&pg, s);
    s.wait_job_condition(&ns, Kind::MPIJob, &job, "Succeeded")
        .await;
    eprintln!("[{ns}] MPIJob {job} Succeeded");
    s.wait_pg_gone(&ns, backend, &job, "MPIJob Succeeded").await;
}

/// A LeaderWorkerSet named `name`: `replicas` groups of a leader and `size − 1` workers, each
/// pod with `gpus` GPUs (SPEC §11: one PodGroup per group, `<name>-<group index>`).
pub fn leaderworkerset(
    link: Link,
    name: &str,
    pool: &str,
    replicas: u32,
    size: u32,
    gpus: u32,
) -> Value {
    leaderworkerset_with(link, name, pool, replicas, size, gpus, json!({}))
}

/// [`leaderworkerset`] with `spec_extra` merged into `spec` (e.g. a startup policy).
pub fn leaderworkerset_with(
    link: Link,
    name: &str,
    pool: &str,
    replicas: u32,
    size: u32,
    gpus: u32,
    spec_extra: Value,
) -> Value {
    let leader = template(
        link,
        name,
        pool,
        "leader",
        &self::replicas("leader", 1, gpus),
    );
    let worker = template(
        link,
        name,
        pool,
        "worker",
        &self::replicas("worker", 1, gpus),
    );
    let metadata = backend_annotated(link, json!({"name": name}));
    let spec = json!({"replicas": replicas, "leaderWorkerTemplate": {"size": size,
        "leaderTemplate": leader, "workerTemplate": worker}});
    let spec = merged(spec, &spec_extra);
    json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": metadata, "spec": spec})
}

/// A pod of a test job and the PodGroup it is linked to.
#[derive(Debug)]
pub struct PodLink {
    pub pod: String,
    /// The LWS group index label (empty for other kinds).
    pub group: String,
    /// The PodGroup named by the backend's link.
    pub link: Option<String>,
}

/// The PodGroup each pod of `job` is linked to, by the backend's link, with its group index —
/// untyped: the 1.34 Pod type has no `schedulingGroup`.
pub async fn pod_links(s: &Scope, ns: &str, job: &str, b: Backend) -> Vec<PodLink> {
    let ar = kube::api::ApiResource::erase::<Pod>(&());
    let pods = jobs::api(&s.client, ns, &ar)
        .list(&ListParams::default().labels(&format!("{JOB_LABEL}={job}")))
        .await
        .expect("list pods")
        .items;
    let at = |p: &DynamicObject, ptr: &str| {
        p.data
            .pointer(ptr)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    pods.iter()
        .map(|p| {
            let group = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("leaderworkerset.sigs.k8s.io/group-index"))
                .cloned()
                .unwrap_or_default();
            let link = match b {
                Backend::SchedulerPlugins => p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("scheduling.x-k8s.io/pod-group"))
                    .cloned(),
                Backend::Volcano => p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("scheduling.k8s.io/group-name"))
                    .cloned(),
                Backend::Kubernetes => at(p, "/spec/schedulingGroup/podGroupName"),
            };
            PodLink {
                pod: p.metadata.name.clone().unwrap_or_default(),
                group,
                link,
            }
        })
        .collect()
}

/// SPEC §11 with the real LWS controller: 3 groups of 4 pods (1 GPU each) on 8 one-GPU nodes.
/// Each group has its PodGroup (minimum 4, read by `min`); exactly 2 groups run whole and the
/// third waits whole, no pod of it bound; every pod is linked to its own group's PodGroup; 4
/// more GPUs and the third group runs whole too.
pub async fn lws_runs_whole_groups(
    s: &mut Scope,
    b: Backend,
    min: impl Fn(&DynamicObject) -> Value,
) {
    for _ in 0..8 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let job = format!("lws-{}", s.id);
    let manifest = leaderworkerset(Link::Gang(b), &job, s.pool(), 3, 4, 1);
    s.create_as(&support::lws::ar(), manifest).await;
    for g in 0..3 {
        s.wait_pg(&ns, b, &format!("{job}-{g}"), "minimum 4", |pg| {
            min(pg) == 4
        })
        .await;
    }
    let what = "8 pods Running and 4 refused by their scheduler";
    let pods = s
        .env
        .wait(&ns, what, SLOW, || async {
            let pods = s.pods(&ns, &job).await;
            let running = pods.iter().filter(|p| is_running(p)).count();
            let refused = pods.iter().filter(|p| is_refused(p)).count();
            (pods.len() == 12 && running == 8 && refused == 4).then_some(pods)
        })
        .await;
    let mut by_group: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for p in &pods {
        let g = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("leaderworkerset.sigs.k8s.io/group-index"))
            .cloned()
            .unwrap_or_default();
        let e = by_group.entry(g).or_default();
        e.0 += 1;
        e.1 += usize::from(is_bound(p));
    }
    let mut bound: Vec<usize> = by_group.values().map(|&(_, bound)| bound).collect();
    bound.sort_unstable();
    assert_eq!(
        (by_group.len(), bound),
        (3, vec![0, 4, 4]),
        "2 whole groups bound, the third none: {by_group:?}\n{}",
        s.diagnostics()
    );
    let links = pod_links(s, &ns, &job, b).await;
    assert!(
        links
            .iter()
            .all(|l| l.link.as_deref() == Some(format!("{job}-{}", l.group).as_str())),
        "every pod linked to its group's PodGroup: {links:?}"
    );
    for _ in 0..4 {
        s.add_node(1).await;
    }
    let running = s.wait_all_running(&ns, &job, 12).await;
    eprintln!(
        "[{ns}] {b:?}: LWS of 3 groups of 4 on 8 GPUs ran 2 whole groups ({by_group:?}); on 12 all: {:?}",
        names_of(&running)
    );
}

/// SPEC §11 with the real LWS controller: under `startupPolicy: LeaderReady` the workers are
/// created only once the leader is ready, so the gang is the workers (a gang of leader and workers
/// would wait for pods that come only after it runs). One group of a leader and 3 workers (1 GPU
/// each) on 4 one-GPU nodes: the PodGroup's minimum is 3 (read by `min`), the leader carries no
/// link and binds alone, then the workers come, linked to the group's PodGroup, and all 4 run.
pub async fn lws_leader_ready_starts_without_deadlock(
    s: &mut Scope,
    b: Backend,
    min: impl Fn(&DynamicObject) -> Value,
) {
    for _ in 0..4 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let job = format!("lr-{}", s.id);
    let startup = json!({"startupPolicy": "LeaderReady"});
    let manifest = leaderworkerset_with(Link::Gang(b), &job, s.pool(), 1, 4, 1, startup);
    s.create_as(&support::lws::ar(), manifest).await;
    let group = format!("{job}-0");
    s.wait_pg(&ns, b, &group, "minimum 3 (the workers)", |pg| min(pg) == 3)
        .await;
    let running = s.wait_all_running(&ns, &job, 4).await;
    // The leader pod is named after its group.
    let mut links: Vec<(bool, Option<String>)> = pod_links(s, &ns, &job, b)
        .await
        .into_iter()
        .map(|l| (l.pod == group, l.link))
        .collect();
    links.sort();
    let worker = Some(group.clone());
    assert_eq!(
        links,
        vec![
            (false, worker.clone()),
            (false, worker.clone()),
            (false, worker),
            (true, None)
        ],
        "the workers linked to the group's PodGroup, the leader to none\n{}",
        s.diagnostics()
    );
    eprintln!(
        "[{ns}] {b:?}: LeaderReady LWS started without deadlock: {:?}",
        names_of(&running)
    );
}
