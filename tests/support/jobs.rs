//! Jobs (Kubeflow's, JobSets, RayClusters) and PodGroups on the test control plane, as dynamic
//! objects.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::{Value, json};

use super::wait_for;

/// How long a test waits for the controller or the garbage collector.
pub const WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    PyTorchJob,
    TFJob,
    MPIJob,
    MPIJobV1,
    XGBoostJob,
    PaddleJob,
    JAXJob,
    /// `jobset.x-k8s.io/v1alpha2`: a driver Job and one Job per worker.
    JobSet,
    /// `ray.io/v1`: a head and one worker group.
    RayCluster,
    /// `batch/v1`: an Indexed Job annotated as a gang (the controller runs with --batch-jobs).
    IndexedJob,
}

/// The kinds of other operators (SPEC §11), through the same lifecycle rows.
pub const WORKLOAD_KINDS: [Kind; 3] = [Kind::JobSet, Kind::RayCluster, Kind::IndexedJob];

/// The kinds every lifecycle and webhook test covers (MPIJob as mpi-operator's v2beta1).
pub const KINDS: [Kind; 6] = [
    Kind::PyTorchJob,
    Kind::TFJob,
    Kind::MPIJob,
    Kind::XGBoostJob,
    Kind::PaddleJob,
    Kind::JAXJob,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    SchedulerPlugins,
    Volcano,
    /// Kubernetes' own `scheduling.k8s.io/v1beta1` (the native-gang tiers only).
    Kubernetes,
}

pub fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

impl Kind {
    pub fn ar(&self) -> ApiResource {
        match self {
            Kind::PyTorchJob => ar("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
            Kind::TFJob => ar("kubeflow.org", "v1", "TFJob", "tfjobs"),
            Kind::MPIJob => ar("kubeflow.org", "v2beta1", "MPIJob", "mpijobs"),
            Kind::MPIJobV1 => ar("kubeflow.org", "v1", "MPIJob", "mpijobs"),
            Kind::XGBoostJob => ar("kubeflow.org", "v1", "XGBoostJob", "xgboostjobs"),
            Kind::PaddleJob => ar("kubeflow.org", "v1", "PaddleJob", "paddlejobs"),
            Kind::JAXJob => ar("kubeflow.org", "v1", "JAXJob", "jaxjobs"),
            Kind::JobSet => ar("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
            Kind::RayCluster => ar("ray.io", "v1", "RayCluster", "rayclusters"),
            Kind::IndexedJob => ApiResource {
                group: "batch".into(),
                version: "v1".into(),
                api_version: "batch/v1".into(),
                kind: "Job".into(),
                plural: "jobs".into(),
            },
        }
    }

    pub fn specs_field(&self) -> &'static str {
        match self {
            Kind::PyTorchJob => "pytorchReplicaSpecs",
            Kind::TFJob => "tfReplicaSpecs",
            Kind::MPIJob | Kind::MPIJobV1 => "mpiReplicaSpecs",
            Kind::XGBoostJob => "xgbReplicaSpecs",
            Kind::PaddleJob => "paddleReplicaSpecs",
            Kind::JAXJob => "jaxReplicaSpecs",
            Kind::JobSet | Kind::RayCluster | Kind::IndexedJob => {
                unreachable!("{self:?} has no replica specs")
            }
        }
    }

    /// The one-pod head replica type (Master, PS, Launcher); JAXJob has only workers.
    pub fn head(&self) -> Option<&'static str> {
        match self {
            Kind::PyTorchJob | Kind::XGBoostJob | Kind::PaddleJob => Some("Master"),
            Kind::TFJob => Some("PS"),
            Kind::MPIJob | Kind::MPIJobV1 => Some("Launcher"),
            Kind::JAXJob | Kind::IndexedJob => None,
            Kind::JobSet => Some("driver"),
            Kind::RayCluster => Some("headgroup"),
        }
    }

    /// A patch that sets the number of workers (a JSON patch for the kinds whose pod sets are a
    /// list, which a merge patch would replace whole).
    pub fn scale(&self, workers: u32) -> Value {
        match self {
            Kind::JobSet | Kind::RayCluster => {
                json!([{"op": "replace", "path": self.worker_path(), "value": workers}])
            }
            // An Indexed Job is elastic when completions follow parallelism.
            Kind::IndexedJob => json!({"spec": {"parallelism": workers, "completions": workers}}),
            _ => json!({"spec": {self.specs_field(): {"Worker": {"replicas": workers}}}}),
        }
    }

    /// The replica type that scales.
    pub fn worker_path(&self) -> String {
        match self {
            Kind::JobSet => "/spec/replicatedJobs/1/replicas".into(),
            Kind::RayCluster => "/spec/workerGroupSpecs/0/replicas".into(),
            Kind::IndexedJob => "/spec/parallelism".into(),
            _ => format!("/spec/{}/Worker/replicas", self.specs_field()),
        }
    }

    /// A merge patch that suspends or resumes a job of this kind.
    pub fn suspend(&self, suspend: bool) -> Value {
        match self {
            Kind::JobSet | Kind::RayCluster | Kind::IndexedJob => {
                json!({"spec": {"suspend": suspend}})
            }
            _ => json!({"spec": {"runPolicy": {"suspend": suspend}}}),
        }
    }

    /// A status merge patch that finishes a job of this kind (`None`: a kind that never
    /// finishes, a RayCluster, or whose status only its controller may write: a batch/v1 Job's
    /// is kube-controller-manager's, and the API server refuses a Complete condition without
    /// the counts that go with it).
    pub fn finish(&self) -> Option<Value> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        match self {
            Kind::RayCluster | Kind::IndexedJob => None,
            Kind::JobSet => Some(
                json!({"status": {"terminalState": "Completed", "restarts": 0,
                "conditions": [{"type": "Completed", "status": "True", "reason": "Test",
                    "message": "done", "lastTransitionTime": now}]}}),
            ),
            _ => Some(
                json!({"status": {"conditions": [{"type": "Succeeded", "status": "True",
                "reason": "Test", "message": "done", "lastTransitionTime": now,
                "lastUpdateTime": now}]}}),
            ),
        }
    }
}

impl Backend {
    pub fn ar(&self) -> ApiResource {
        match self {
            Backend::SchedulerPlugins => {
                ar("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups")
            }
            Backend::Volcano => ar("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups"),
            Backend::Kubernetes => ar("scheduling.k8s.io", "v1beta1", "PodGroup", "podgroups"),
        }
    }

    /// The value of the `podgroup-sync.io/backend` annotation that chooses this backend.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::SchedulerPlugins => "scheduler-plugins",
            Backend::Volcano => "volcano",
            Backend::Kubernetes => "kubernetes",
        }
    }

    /// Template metadata and schedulerName that link pods to PodGroup `pg`.
    fn link(&self, pg: &str) -> (Value, &'static str) {
        match self {
            Backend::SchedulerPlugins => (
                json!({"labels": {"scheduling.x-k8s.io/pod-group": pg}}),
                "default-scheduler",
            ),
            Backend::Volcano => (
                json!({"annotations": {"scheduling.k8s.io/group-name": pg}}),
                "volcano",
            ),
            // Only the pod-link webhook can link pods to a native PodGroup.
            Backend::Kubernetes => (json!({}), "default-scheduler"),
        }
    }
}

fn template(backend: Backend, pg: &str, requests: Value, limits: Value) -> Value {
    let (meta, scheduler) = backend.link(pg);
    json!({"metadata": meta, "spec": {"schedulerName": scheduler, "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": requests, "limits": limits}}]}})
}

/// A job of `kind` with a 1-pod head (Master / PS / Launcher: 1 cpu, 1Gi) and `workers` workers
/// (2 cpu, 1 GPU as a limit only), linked to PodGroup `name` for `backend`.
pub fn job(kind: Kind, backend: Backend, name: &str, workers: u32) -> Value {
    let head = template(
        backend,
        name,
        json!({"cpu": "1", "memory": "1Gi"}),
        json!({}),
    );
    let worker = template(
        backend,
        name,
        json!({"cpu": "2"}),
        json!({"nvidia.com/gpu": 1}),
    );
    let ar = kind.ar();
    let mut metadata = json!({"name": name});
    if backend == Backend::Kubernetes {
        // No template field points at the native backend: the job chooses it.
        metadata["annotations"] = json!({"podgroup-sync.io/backend": "kubernetes"});
    }
    let spec = match kind {
        Kind::JobSet => json!({"replicatedJobs": [
            {"name": "driver", "replicas": 1, "template": {"spec": {"parallelism": 1,
                "completions": 1, "backoffLimit": 0, "template": head}}},
            {"name": "workers", "replicas": workers, "template": {"spec": {"parallelism": 1,
                "completions": 1, "backoffLimit": 0, "template": worker}}}]}),
        Kind::RayCluster => json!({"headGroupSpec": {"rayStartParams": {}, "template": head},
            "workerGroupSpecs": [{"groupName": "workers", "replicas": workers, "minReplicas": 0,
                "maxReplicas": 100, "rayStartParams": {}, "template": worker}]}),
        Kind::IndexedJob => {
            metadata["annotations"]["podgroup-sync.io/gang"] = json!("true");
            json!({"completionMode": "Indexed", "parallelism": workers, "completions": workers,
                "backoffLimit": 0, "template": worker})
        }
        _ => return kubeflow_job(kind, workers, metadata, head, worker),
    };
    json!({"apiVersion": ar.api_version, "kind": ar.kind, "metadata": metadata, "spec": spec})
}

fn kubeflow_job(kind: Kind, workers: u32, metadata: Value, head: Value, worker: Value) -> Value {
    let ar = kind.ar();
    let mut specs = json!({"Worker": {"replicas": workers, "template": worker}});
    if let Some(head_type) = kind.head() {
        specs[head_type] = json!({"replicas": 1, "template": head});
    }
    json!({"apiVersion": ar.api_version, "kind": ar.kind, "metadata": metadata,
        "spec": {kind.specs_field(): specs, "runPolicy": {}}})
}

/// The PodGroup spec [`job`] of a kind with a head should get: minMember 1 + workers,
/// minResources of all pods.
pub fn expected_spec(backend: Backend, workers: u32) -> Value {
    expected_spec_of(Kind::PyTorchJob, backend, workers)
}

/// The PodGroup spec [`job`] of `kind` should get (as the API server stores it: the native
/// PodGroup gains the server's defaults, `disruptionMode` and the resolved `priority`, on a
/// cluster without a `globalDefault` PriorityClass).
pub fn expected_spec_of(kind: Kind, backend: Backend, workers: u32) -> Value {
    if backend == Backend::Kubernetes {
        let min_count = workers + u32::from(kind.head().is_some());
        return json!({"schedulingPolicy": {"gang": {"minCount": min_count}},
            "disruptionMode": {"single": {}}, "priority": 0});
    }
    let mut spec = match kind.head() {
        Some(_) => json!({"minMember": 1 + workers, "minResources": {
            "cpu": (1 + 2 * workers).to_string(), "memory": "1Gi", "nvidia.com/gpu": workers.to_string()}}),
        None => json!({"minMember": workers, "minResources": {
            "cpu": (2 * workers).to_string(), "nvidia.com/gpu": workers.to_string()}}),
    };
    if backend == Backend::Volcano {
        spec["queue"] = json!("default");
    }
    spec
}

pub fn api(client: &Client, ns: &str, ar: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, ar)
}

pub async fn create(client: &Client, ns: &str, kind: Kind, manifest: &Value) -> DynamicObject {
    let obj: DynamicObject = serde_json::from_value(manifest.clone()).expect("manifest");
    api(client, ns, &kind.ar())
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {kind:?}: {e}"))
}

pub async fn get_pg(
    client: &Client,
    ns: &str,
    backend: Backend,
    name: &str,
) -> Option<DynamicObject> {
    api(client, ns, &backend.ar())
        .get_opt(name)
        .await
        .expect("get PodGroup")
}

/// Waits until PodGroup `name` exists and `check` accepts it.
pub async fn wait_pg(
    client: &Client,
    ns: &str,
    backend: Backend,
    name: &str,
    what: &str,
    check: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    wait_for(&format!("PodGroup {ns}/{name}: {what}"), WAIT, || async {
        get_pg(client, ns, backend, name)
            .await
            .filter(|pg| check(pg))
    })
    .await
}

pub async fn wait_pg_gone(client: &Client, ns: &str, backend: Backend, name: &str, what: &str) {
    wait_for(
        &format!("PodGroup {ns}/{name} gone: {what}"),
        WAIT,
        || async {
            get_pg(client, ns, backend, name)
                .await
                .is_none()
                .then_some(())
        },
    )
    .await
}

/// JSON merge patch of a job (or its status with `status: true`); a JSON patch when `patch` is
/// a list of operations.
pub async fn patch(client: &Client, ns: &str, kind: Kind, name: &str, patch: Value, status: bool) {
    let api = api(client, ns, &kind.ar());
    let pp = PatchParams::default();
    let patch = match patch {
        Value::Array(_) => Patch::Json(serde_json::from_value(patch).expect("JSON patch")),
        merge => Patch::Merge(merge),
    };
    let r = if status {
        api.patch_status(name, &pp, &patch).await
    } else {
        api.patch(name, &pp, &patch).await
    };
    r.unwrap_or_else(|e| panic!("patch {kind:?} {name}: {e}"));
}

pub async fn delete(client: &Client, ns: &str, ar: &ApiResource, name: &str) {
    api(client, ns, ar)
        .delete(name, &DeleteParams::background())
        .await
        .unwrap_or_else(|e| panic!("delete {} {name}: {e}", ar.kind));
}

/// Events podgroup-sync reported on object `name` with `reason`.
pub async fn events(client: &Client, ns: &str, name: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

pub async fn wait_event(client: &Client, ns: &str, name: &str, reason: &str) -> Event {
    wait_for(&format!("Event {reason} on {ns}/{name}"), WAIT, || async {
        events(client, ns, name, reason).await.into_iter().next()
    })
    .await
}

pub fn spec(pg: &DynamicObject) -> Value {
    pg.data.get("spec").cloned().unwrap_or(Value::Null)
}
