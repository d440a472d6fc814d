//! Step 1 of the pipeline: a watched Kubeflow job → a normalised [`Job`] (pure).
//!
//! The operators apply their defaulting inside their reconcile loops, so the stored object may
//! lack defaults (nil `replicas`, lower-case replica-type keys, missing elastic min/max). This
//! module applies the same defaulting before anything is computed (SPEC §3.1.1).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::api::DynamicObject;
use serde::Deserialize;
use serde_json::Value;

pub use crate::kinds::{
    JAXJOB, JobKind, KINDS, MPIJOB_V1, MPIJOB_V2BETA1, PADDLEJOB, PYTORCHJOB, TFJOB, XGBOOSTJOB,
};

/// Why a job cannot get a PodGroup. Each is reported as an `InvalidSpec` Warning Event and
/// counted by reason; none is retried until the job changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidJob {
    #[error("the job has no spec.{0}")]
    NoReplicaSpecs(&'static str),
    #[error("unknown replica type {0:?} (expected one of {1})")]
    UnknownReplicaType(String, String),
    #[error("replica types {0:?} and {1:?} are the same type in different case")]
    DuplicateReplicaType(String, String),
    #[error("replica type {0}: no pod template")]
    MissingTemplate(String),
    #[error("replica type {0}: invalid pod template: {1}")]
    InvalidTemplate(String, String),
    #[error("replica type {0}: replicas must be a non-negative integer, got {1}")]
    InvalidReplicas(String, String),
    #[error("the job has zero replicas in total")]
    ZeroReplicas,
    #[error("the gang has {0} pods, more than a PodGroup can hold (2147483647)")]
    TooManyReplicas(u128),
    #[error("invalid spec: {0}")]
    Malformed(String),
    #[error("schedulingPolicy.minAvailable must be at least 1, got {0}")]
    MinAvailableTooSmall(i64),
    #[error(
        "schedulingPolicy.minAvailable {min_available} is above the {total} pods the job has: the gang could never be scheduled"
    )]
    MinAvailableAboveTotal { min_available: u64, total: u64 },
    #[error("elasticPolicy: {0}")]
    InvalidElasticPolicy(String),
    #[error("{0}")]
    InvalidResources(String),
    #[error("an MPIJob needs a Launcher replica spec; its operator starts no job without one")]
    MissingLauncher,
    #[error("replica type {0}: the pod template has no containers")]
    NoContainers(String),
    #[error("{0}")]
    InvalidPodGroupName(String),
    #[error("{0}")]
    InvalidSchedulingPolicy(String),
    /// The API server refused the PodGroup the job asks for (422/400): retried only once the
    /// job changes.
    #[error("the API server refused the PodGroup: {0}")]
    RefusedByApiServer(String),
}

impl InvalidJob {
    /// A short CamelCase label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            InvalidJob::NoReplicaSpecs(_) => "NoReplicaSpecs",
            InvalidJob::UnknownReplicaType(..) => "UnknownReplicaType",
            InvalidJob::DuplicateReplicaType(..) => "DuplicateReplicaType",
            InvalidJob::MissingTemplate(_) => "MissingTemplate",
            InvalidJob::InvalidTemplate(..) => "InvalidTemplate",
            InvalidJob::InvalidReplicas(..) => "InvalidReplicas",
            InvalidJob::ZeroReplicas => "ZeroReplicas",
            InvalidJob::TooManyReplicas(_) => "TooManyReplicas",
            InvalidJob::Malformed(_) => "Malformed",
            InvalidJob::MinAvailableTooSmall(_) => "MinAvailableTooSmall",
            InvalidJob::MinAvailableAboveTotal { .. } => "MinAvailableAboveTotal",
            InvalidJob::InvalidElasticPolicy(_) => "InvalidElasticPolicy",
            InvalidJob::InvalidResources(_) => "InvalidResources",
            InvalidJob::MissingLauncher => "MissingLauncher",
            InvalidJob::NoContainers(_) => "NoContainers",
            InvalidJob::InvalidPodGroupName(_) => "InvalidPodGroupName",
            InvalidJob::InvalidSchedulingPolicy(_) => "InvalidSchedulingPolicy",
            InvalidJob::RefusedByApiServer(_) => "RefusedByApiServer",
        }
    }
}

/// `spec.runPolicy`, the fields podgroup-sync reads.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct RunPolicy {
    pub suspend: Option<bool>,
    pub managed_by: Option<String>,
    pub scheduling_policy: Option<SchedulingPolicy>,
}

/// `spec.runPolicy.schedulingPolicy` (identical in shape for v1 and v2beta1).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct SchedulingPolicy {
    pub min_available: Option<i64>,
    pub queue: Option<String>,
    pub min_resources:
        Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    pub priority_class: Option<String>,
    pub schedule_timeout_seconds: Option<i32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ReplicaSpecIn {
    replicas: Option<Value>,
    template: Option<Value>,
}

/// One replica type after defaulting.
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    /// Canonical name (`Master`, `Worker`, `PS`, …).
    pub replica_type: &'static str,
    pub replicas: u64,
    pub template: PodTemplateSpec,
}

/// A job as its operator's defaulting would see it: everything the gang computation needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub kind: &'static JobKind,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub annotations: BTreeMap<String, String>,
    /// Replica types in canonical order of the kind's table.
    pub replicas: Vec<Replica>,
    pub run_policy: RunPolicy,
    /// PyTorch/Paddle `elasticPolicy.minReplicas` after defaulting, when an elastic policy is set.
    pub elastic_min_replicas: Option<u64>,
    /// MPIJob v2beta1 `launcherCreationPolicy: WaitForWorkersReady`.
    pub launcher_waits_for_workers: bool,
    /// A `Succeeded` or `Failed` condition is true.
    pub finished: bool,
}

impl Job {
    pub fn suspended(&self) -> bool {
        self.run_policy.suspend.unwrap_or(false)
    }

    pub fn scheduling_policy(&self) -> Option<&SchedulingPolicy> {
        self.run_policy.scheduling_policy.as_ref()
    }

    /// Whether another controller (e.g. MultiKueue) manages this job, so its operator — and we —
    /// leave it alone.
    pub fn managed_elsewhere(&self) -> bool {
        matches!(&self.run_policy.managed_by, Some(m) if !m.is_empty() && m != self.kind.default_manager)
    }

    /// Σ replicas over all replica types.
    pub fn total_replicas(&self) -> u64 {
        self.replicas.iter().map(|r| r.replicas).sum()
    }

    pub fn replica(&self, replica_type: &str) -> Option<&Replica> {
        self.replicas
            .iter()
            .find(|r| r.replica_type == replica_type)
    }
}

/// The identity of a job object, read even when its spec is invalid, so the failure can be
/// reported on it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectIdentity {
    pub name: String,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

/// Whether a job's `status` has a true `Succeeded` or `Failed` condition (read without
/// normalising the job: the stale-PodGroup audit asks it of every owner).
pub fn finished(status: Option<&Value>) -> bool {
    let conditions = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array);
    conditions.into_iter().flatten().any(|c| {
        matches!(
            c.get("type").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        ) && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

/// The label the Kubeflow operators put on every pod they create, naming its job.
pub const JOB_NAME_LABEL: &str = "training.kubeflow.org/job-name";

/// Normalises a job object (as JSON: `metadata`, `spec`, `status`) of the given kind.
pub fn normalize(kind: &'static JobKind, obj: &Value) -> Result<Job, InvalidJob> {
    let meta = obj
        .get("metadata")
        .map(ObjectIdentity::deserialize)
        .transpose()
        .map_err(|e| InvalidJob::Malformed(format!("metadata: {e}")))?
        .unwrap_or_default();
    normalize_parts(kind, meta, obj.get("spec"), obj.get("status"))
}

/// [`normalize`] of a job as the caches hand it over: its metadata already typed, so the whole
/// object is not copied into one JSON value first.
pub fn normalize_object(kind: &'static JobKind, obj: &DynamicObject) -> Result<Job, InvalidJob> {
    let m = &obj.metadata;
    let meta = ObjectIdentity {
        name: m.name.clone().unwrap_or_default(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        annotations: m.annotations.clone().unwrap_or_default(),
    };
    normalize_parts(kind, meta, obj.data.get("spec"), obj.data.get("status"))
}

fn normalize_parts(
    kind: &'static JobKind,
    meta: ObjectIdentity,
    spec: Option<&Value>,
    status: Option<&Value>,
) -> Result<Job, InvalidJob> {
    let empty = Value::Object(Default::default());
    let spec = spec.unwrap_or(&empty);
    let run_policy = match spec.get("runPolicy") {
        Some(v) if !v.is_null() => RunPolicy::deserialize(v)
            .map_err(|e| InvalidJob::Malformed(format!("runPolicy: {e}")))?,
        _ => RunPolicy::default(),
    };
    let finished = finished(status);

    let replicas = normalize_replicas(kind, spec.get(kind.replica_specs_field))?;

    let fields = kind.rules.read_spec(spec, &replicas)?;
    Ok(Job {
        kind,
        name: meta.name,
        namespace: meta.namespace.unwrap_or_default(),
        uid: meta.uid.unwrap_or_default(),
        annotations: meta.annotations,
        replicas,
        run_policy,
        elastic_min_replicas: fields.elastic_min_replicas,
        launcher_waits_for_workers: fields.launcher_waits_for_workers,
        finished,
    })
}

fn normalize_replicas(
    kind: &'static JobKind,
    specs: Option<&Value>,
) -> Result<Vec<Replica>, InvalidJob> {
    let specs: BTreeMap<String, Option<ReplicaSpecIn>> = match specs {
        None | Some(Value::Null) => {
            return Err(InvalidJob::NoReplicaSpecs(kind.replica_specs_field));
        }
        Some(v) => BTreeMap::<String, Option<ReplicaSpecIn>>::deserialize(v)
            .map_err(|e| InvalidJob::Malformed(format!("{}: {e}", kind.replica_specs_field)))?,
    };
    if specs.is_empty() {
        return Err(InvalidJob::NoReplicaSpecs(kind.replica_specs_field));
    }
    let mut by_type: BTreeMap<&'static str, (String, ReplicaSpecIn)> = BTreeMap::new();
    for (key, spec) in specs {
        let canonical = kind.canonical_type(&key).ok_or_else(|| {
            InvalidJob::UnknownReplicaType(key.clone(), kind.replica_types.join(", "))
        })?;
        if let Some((other, _)) = by_type.get(canonical) {
            return Err(InvalidJob::DuplicateReplicaType(other.clone(), key));
        }
        by_type.insert(canonical, (key, spec.unwrap_or_default()));
    }
    let mut out = Vec::with_capacity(by_type.len());
    for replica_type in kind.replica_types {
        let Some((_, spec)) = by_type.remove(replica_type) else {
            continue;
        };
        let replicas = match spec.replicas {
            None | Some(Value::Null) => kind.rules.default_replicas(replica_type),
            Some(v) => v.as_u64().ok_or_else(|| {
                InvalidJob::InvalidReplicas(replica_type.to_string(), v.to_string())
            })?,
        };
        let template = match spec.template {
            None | Some(Value::Null) => {
                return Err(InvalidJob::MissingTemplate(replica_type.to_string()));
            }
            Some(t) => serde_json::from_value::<PodTemplateSpec>(t).map_err(|e| {
                InvalidJob::InvalidTemplate(replica_type.to_string(), e.to_string())
            })?,
        };
        match &template.spec {
            None => return Err(InvalidJob::MissingTemplate(replica_type.to_string())),
            Some(spec) if spec.containers.is_empty() => {
                return Err(InvalidJob::NoContainers(replica_type.to_string()));
            }
            Some(_) => {}
        }
        out.push(Replica {
            replica_type,
            replicas,
            template,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template() -> Value {
        json!({"spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    #[test]
    fn rule_3_1_1_replica_type_keys_are_canonicalised_and_nil_replicas_default_to_one() {
        let obj = json!({"metadata": {"name": "j", "namespace": "n", "uid": "u"},
            "spec": {"pytorchReplicaSpecs": {"master": {"template": template()}, "WORKER": {"replicas": 3, "template": template()}}}});
        let job = normalize(&PYTORCHJOB, &obj).unwrap();
        let got: Vec<_> = job
            .replicas
            .iter()
            .map(|r| (r.replica_type, r.replicas))
            .collect();
        assert_eq!(got, vec![("Master", 1), ("Worker", 3)]);
    }

    #[test]
    fn rule_3_1_1_mpi_worker_nil_defaults_to_zero_and_launcher_to_one() {
        let obj = json!({"metadata": {"name": "j"},
            "spec": {"mpiReplicaSpecs": {"Launcher": {"template": template()}, "Worker": {"template": template()}}}});
        for kind in [&MPIJOB_V2BETA1, &MPIJOB_V1] {
            let job = normalize(kind, &obj).unwrap();
            assert_eq!(job.replica("Launcher").unwrap().replicas, 1);
            assert_eq!(job.replica("Worker").unwrap().replicas, 0);
        }
    }

    #[test]
    fn rule_3_1_1_elastic_min_max_defaulting() {
        let mk = |ep: Value| {
            json!({"metadata": {"name": "j"}, "spec": {"elasticPolicy": ep,
                "pytorchReplicaSpecs": {"Worker": {"replicas": 4, "template": template()}}}})
        };
        let min = |ep| {
            normalize(&PYTORCHJOB, &mk(ep))
                .unwrap()
                .elastic_min_replicas
        };
        assert_eq!(
            min(json!({})),
            Some(4),
            "neither set: both = Worker replicas"
        );
        assert_eq!(
            min(json!({"maxReplicas": 6})),
            Some(6),
            "only max set: min = max"
        );
        assert_eq!(min(json!({"minReplicas": 2, "maxReplicas": 6})), Some(2));
        assert!(matches!(
            normalize(&PYTORCHJOB, &mk(json!({"minReplicas": -1}))),
            Err(InvalidJob::InvalidElasticPolicy(_))
        ));
    }

    #[test]
    fn bad_input_is_an_invalid_job_never_a_panic() {
        let cases = [
            (
                json!({"metadata": {"name": "j"}, "spec": {}}),
                "NoReplicaSpecs",
            ),
            (
                json!({"metadata": {"name": "j"}, "spec": {"pytorchReplicaSpecs": {}}}),
                "NoReplicaSpecs",
            ),
            (
                json!({"metadata": {"name": "j"}, "spec": {"pytorchReplicaSpecs": {"Boss": {"template": template()}}}}),
                "UnknownReplicaType",
            ),
            (
                json!({"metadata": {"name": "j"}, "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}}),
                "MissingTemplate",
            ),
            (
                json!({"metadata": {"name": "j"}, "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": "three", "template": template()}}}}),
                "InvalidReplicas",
            ),
            (
                json!({"metadata": {"name": "j"}, "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": -2, "template": template()}}}}),
                "InvalidReplicas",
            ),
            (
                json!({"metadata": {"name": "j"}, "spec": {"pytorchReplicaSpecs": {"worker": {"template": template()}, "Worker": {"template": template()}}}}),
                "DuplicateReplicaType",
            ),
            (
                json!({"metadata": {"name": "j"}, "spec": {"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": "nope"}}}}}}),
                "InvalidTemplate",
            ),
            (
                json!({"metadata": {"name": "j"}, "spec": {"runPolicy": {"suspend": "yes"}, "pytorchReplicaSpecs": {"Worker": {"template": template()}}}}),
                "Malformed",
            ),
        ];
        for (obj, reason) in cases {
            let err = normalize(&PYTORCHJOB, &obj).unwrap_err();
            assert_eq!(err.reason(), reason, "{obj}");
        }
    }

    #[test]
    fn finished_when_succeeded_or_failed_condition_is_true() {
        for (t, s, want) in [
            ("Succeeded", "True", true),
            ("Failed", "True", true),
            ("Succeeded", "False", false),
            ("Running", "True", false),
        ] {
            let obj = json!({"metadata": {"name": "j"},
                "spec": {"tfReplicaSpecs": {"Worker": {"template": template()}}},
                "status": {"conditions": [{"type": t, "status": s}]}});
            assert_eq!(normalize(&TFJOB, &obj).unwrap().finished, want, "{t}={s}");
        }
    }

    #[test]
    fn managed_by_another_controller_is_detected() {
        let mk = |m: &str| {
            json!({"metadata": {"name": "j"}, "spec": {"runPolicy": {"managedBy": m},
                "tfReplicaSpecs": {"Worker": {"template": template()}}}})
        };
        assert!(
            normalize(&TFJOB, &mk("kueue.x-k8s.io/multikueue"))
                .unwrap()
                .managed_elsewhere()
        );
        assert!(
            !normalize(&TFJOB, &mk("kubeflow.org/training-operator"))
                .unwrap()
                .managed_elsewhere()
        );
    }
}
