//! Step 1 of the pipeline: a watched object → the workload model (a normalised [`Job`], pure).
//!
//! The operators apply their defaulting inside their reconcile loops, so the stored object may
//! lack defaults (nil `replicas`, lower-case replica-type keys, missing elastic min/max). This
//! module applies the same defaulting before anything is computed (SPEC §3.1.1).

use kube::api::DynamicObject;
use serde::Deserialize;
use serde_json::Value;

pub use crate::kinds::{
    JAXJOB, KINDS, MPIJOB_V1, MPIJOB_V2BETA1, PADDLEJOB, PYTORCHJOB, TFJOB, XGBOOSTJOB, lookup,
};
pub use crate::workload::{
    InvalidJob, Job, JobKind, MinMemberRule, ObjectIdentity, Owner, PodSet, SchedulingPolicy, Shape,
};

pub use crate::kinds::kubeflow::JOB_NAME_LABEL;

/// Normalises an object (as JSON: `metadata`, `spec`, `status`) of the given kind.
pub fn normalize(kind: &'static JobKind, obj: &Value) -> Result<Job, InvalidJob> {
    let meta = obj
        .get("metadata")
        .map(ObjectIdentity::deserialize)
        .transpose()
        .map_err(|e| InvalidJob::Malformed(format!("metadata: {e}")))?
        .unwrap_or_default();
    normalize_parts(kind, meta, obj.get("spec"), obj.get("status"))
}

/// [`normalize`] of an object as the caches hand it over: its metadata already typed, so the
/// whole object is not copied into one JSON value first.
pub fn normalize_object(kind: &'static JobKind, obj: &DynamicObject) -> Result<Job, InvalidJob> {
    let m = &obj.metadata;
    let meta = ObjectIdentity {
        name: m.name.clone().unwrap_or_default(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        annotations: m.annotations.clone().unwrap_or_default(),
        owner_references: m
            .owner_references
            .iter()
            .flatten()
            .map(|r| Owner {
                api_version: r.api_version.clone(),
                kind: r.kind.clone(),
                name: r.name.clone(),
                controller: r.controller,
            })
            .collect(),
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
    let shape = kind.rules.read(kind, spec, &meta)?;
    let groups = kind.rules.groups(spec, status)?;
    Ok(Job {
        kind,
        name: meta.name,
        namespace: meta.namespace.unwrap_or_default(),
        uid: meta.uid.unwrap_or_default(),
        annotations: meta.annotations,
        shape,
        finished: kind.rules.finished(status),
        groups,
    })
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
            .shape
            .pod_sets
            .iter()
            .map(|r| (r.name.as_str(), r.count))
            .collect();
        assert_eq!(got, vec![("Master", 1), ("Worker", 3)]);
    }

    #[test]
    fn rule_3_1_1_mpi_worker_nil_defaults_to_zero_and_launcher_to_one() {
        let obj = json!({"metadata": {"name": "j"},
            "spec": {"mpiReplicaSpecs": {"Launcher": {"template": template()}, "Worker": {"template": template()}}}});
        for kind in [&MPIJOB_V2BETA1, &MPIJOB_V1] {
            let job = normalize(kind, &obj).unwrap();
            assert_eq!(job.pod_set("Launcher").unwrap().count, 1);
            assert_eq!(job.pod_set("Worker").unwrap().count, 0);
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
                .pod_set("Worker")
                .and_then(|w| w.minimum)
                .map(|(m, _)| m)
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
