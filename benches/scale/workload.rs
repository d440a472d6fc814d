//! Jobs, PodGroups and the PodGroup watcher.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use podgroup_sync::backend::{self, BackendOptions, PodGroupBackend, SchedulerPlugins};
use podgroup_sync::gang::{self, Priorities};
use podgroup_sync::job::{self, PYTORCHJOB};
use podgroup_sync::resources::AdmissionDefaults;

#[allow(unused_imports)]
use crate::*;

pub(crate) fn pytorchjob_ar() -> ApiResource {
    ApiResource {
        group: "kubeflow.org".into(),
        version: "v1".into(),
        api_version: "kubeflow.org/v1".into(),
        kind: "PyTorchJob".into(),
        plural: "pytorchjobs".into(),
    }
}

pub(crate) fn podgroup_ar() -> ApiResource {
    SchedulerPlugins.api_resource()
}

pub(crate) const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// Master 1 (1 cpu, 1Gi) + Worker 3 (2 cpu, 1 GPU as a limit only), every template linked to
/// PodGroup `name`; the container and port training-operator's defaulting webhook would add.
pub(crate) fn job_manifest(ns: &str, name: &str) -> Value {
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
pub(crate) fn desired_pod_group(ns: &str, name: &str, uid: &str) -> Res<Value> {
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
pub(crate) enum Check {
    /// minMember and minResources exactly as podgroup-sync computes them.
    Exact {
        min_member: i64,
        min_resources: Value,
    },
    /// minMember only (training-operator computes minResources its own way).
    MinMember(i64),
}

impl Check {
    pub(crate) fn exact() -> Res<Check> {
        let d = desired_pod_group("x", "x", "x")?;
        Ok(Check::Exact {
            min_member: d["spec"]["minMember"].as_i64().unwrap_or(-1),
            min_resources: d["spec"]["minResources"].clone(),
        })
    }

    pub(crate) fn passes(&self, pg: &DynamicObject) -> bool {
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

    pub(crate) fn describe(&self) -> String {
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
pub(crate) struct Seen {
    pub(crate) at: Instant,
    /// PodGroup creationTimestamp (unix seconds).
    pub(crate) created: Option<i64>,
}

pub(crate) struct WatchState {
    pub(crate) prefix: String,
    pub(crate) check: Check,
    /// ns/name of every PodGroup that exists.
    pub(crate) present: HashSet<String>,
    /// First time each PodGroup of the current phase was seen correct.
    pub(crate) correct: HashMap<String, Seen>,
    pub(crate) events: u64,
}

/// Watches every scheduling.x-k8s.io PodGroup; records when each was first seen correct.
pub(crate) struct PgWatch {
    pub(crate) state: Arc<Mutex<WatchState>>,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl PgWatch {
    pub(crate) async fn start(client: &Client) -> Res<PgWatch> {
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
    pub(crate) fn begin(&self, prefix: &str, check: Check) {
        let mut s = self.state.lock().expect("lock");
        s.prefix = prefix.into();
        s.check = check;
        s.correct.clear();
    }

    pub(crate) fn correct_count(&self) -> usize {
        self.state.lock().expect("lock").correct.len()
    }

    pub(crate) fn present_with_prefix(&self, prefix: &str) -> usize {
        self.state
            .lock()
            .expect("lock")
            .present
            .iter()
            .filter(|k| k.starts_with(prefix))
            .count()
    }

    pub(crate) fn records(&self) -> HashMap<String, Seen> {
        self.state.lock().expect("lock").correct.clone()
    }

    pub(crate) async fn wait_correct(&self, n: usize, timeout: Duration) -> bool {
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
pub(crate) struct Created {
    pub(crate) key: String,
    pub(crate) ns: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    /// When the create response arrived.
    pub(crate) at: Instant,
    /// The job's creationTimestamp (unix seconds).
    pub(crate) created: i64,
}

pub(crate) fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => matches!(s.code, 429 | 500 | 502 | 503 | 504),
        _ => true,
    }
}

pub(crate) async fn create_job(
    client: &Client,
    ns: &str,
    name: &str,
    posts: &AtomicU64,
) -> Res<Created> {
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

/// Creates one job and sends it to `tx`, if any (the bare client's PodGroup writer).
async fn create_and_send(
    client: &Client,
    ns: &str,
    name: &str,
    posts: &AtomicU64,
    tx: Option<tokio::sync::mpsc::UnboundedSender<Created>>,
) -> Res<Created> {
    let c = create_job(client, ns, name, posts).await?;
    if let Some(tx) = tx {
        let _ = tx.send(c.clone());
    }
    Ok(c)
}

/// Creates jobs `prefix-<i % m>/pj-<i>` for i in 0..n with `in_flight` creates at once; each
/// created job is also sent to `tx`.
pub(crate) async fn create_jobs(
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
                let ns = format!("{prefix}-{}", i % m);
                create_and_send(client, &ns, &format!("pj-{i:05}"), posts, tx).await
            }
        })
        .buffer_unordered(in_flight.max(1))
        .try_collect()
        .await
}

pub(crate) async fn create_namespaces(
    client: &Client,
    prefix: &str,
    m: usize,
    annotations: &[(&str, &str)],
) -> Res<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    futures::stream::iter(0..m)
        .map(|i| {
            let api = api.clone();
            let ns = support::namespace(&format!("{prefix}-{i}"), annotations);
            async move { api.create(&PostParams::default(), &ns).await.map(|_| ()) }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Applies the PodGroup of job `c` exactly as podgroup-sync does (same body, same field manager,
/// forced server-side apply).
pub(crate) async fn apply_pod_group(client: &Client, c: &Created) -> Res<()> {
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
pub(crate) async fn delete_pod_groups(
    client: &Client,
    watch: &PgWatch,
    prefix: &str,
    m: usize,
) -> Res<()> {
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
pub(crate) async fn verify_pod_groups(
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

/// Creates `count` jobs `prefix-<i % m>/steady-<i>` at a constant `rate` per second (each create
/// started on its tick, however long the previous ones take); each created job is also sent to
/// `tx`. The steady-state phase of issue 15.
pub(crate) async fn create_jobs_at_rate(
    client: &Client,
    prefix: &str,
    count: usize,
    m: usize,
    rate: f64,
    tx: Option<tokio::sync::mpsc::UnboundedSender<Created>>,
    posts: &AtomicU64,
) -> Res<Vec<Created>> {
    let t0 = tokio::time::Instant::now();
    let period = Duration::from_secs_f64(1.0 / rate.max(0.001));
    futures::stream::iter(0..count)
        .map(|i| {
            let tx = tx.clone();
            async move {
                tokio::time::sleep_until(t0 + period * i as u32).await;
                let ns = format!("{prefix}-{}", i % m);
                create_and_send(client, &ns, &format!("steady-{i:05}"), posts, tx).await
            }
        })
        // Enough in flight that a slow create never delays the next tick.
        .buffer_unordered(count.max(1))
        .try_collect()
        .await
}
