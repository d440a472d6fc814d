//! The labels that place a pod in its pod set's sub-group of a Volcano PodGroup (SPEC §13,
//! pure): the pod set's name, and for a sliced set the pod's slice (its index / the slice size),
//! read from the index label the kind's operator gives each pod.

use std::collections::BTreeMap;

use crate::backend::BackendKind;
use crate::gang::Gang;
use crate::job::Job;
use crate::kinds::kubeflow::REPLICA_TYPE_LABEL;
use crate::names::valid_label_value;
use crate::topology::{POD_SET_LABEL, SLICE_LABEL, Slices};

/// The labels the webhook adds for the placement of one pod of `job` on `backend`, given the
/// pod set its owner names (`owner_set`) and the pod's labels; none for a job that asks for no
/// placement, on another backend than Volcano, or for a label the pod already has (whatever its
/// value: a template's own label is never changed).
pub fn labels(
    backend: BackendKind,
    job: &Job,
    gang: &Gang,
    owner_set: Option<&str>,
    pod_labels: Option<&BTreeMap<String, String>>,
) -> Vec<(&'static str, String)> {
    let Some(set) = pod_set(job, owner_set, pod_labels) else {
        return Vec::new();
    };
    let Some(slices) = wanted(backend, job, gang, &set) else {
        return Vec::new();
    };
    let has = |key: &str| pod_labels.is_some_and(|l| l.contains_key(key));
    let mut out = Vec::new();
    if !has(POD_SET_LABEL) {
        out.push((POD_SET_LABEL, set.clone()));
    }
    let index = job
        .pod_set(&set)
        .zip(pod_labels)
        .and_then(|(s, labels)| job.kind.rules.pod_index(s, labels));
    if let (Some(slices), Some(i)) = (slices, index)
        && !has(SLICE_LABEL)
    {
        out.push((SLICE_LABEL, slices.of(i).to_string()));
    }
    out
}

/// Whether the pods of set `set` get placement labels on `backend`: `None` when they get none,
/// else the set's slices (`Some(None)`: the pod-set label only, for a domain of its own).
pub fn wanted<'a>(
    backend: BackendKind,
    job: &Job,
    gang: &'a Gang,
    set: &str,
) -> Option<Option<&'a Slices>> {
    let t = &gang.topology;
    if backend != BackendKind::Volcano || t.is_empty() || !valid_label_value(set) {
        return None;
    }
    let request = t.set(set)?;
    let slices = request
        .slices
        .as_ref()
        .filter(|_| job.kind.rules.indexes_pods());
    let own_domain = request.domain.is_some() && t.common_domain().is_none();
    (slices.is_some() || own_domain).then_some(slices)
}

/// The pod set a pod belongs to: what its owner says (a JobSet's replicated job, a Ray group),
/// else a Kubeflow operator's replica-type label, else the job's only set.
fn pod_set(
    job: &Job,
    owner_set: Option<&str>,
    labels: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    if let Some(set) = owner_set {
        return Some(set.to_string());
    }
    if job.kind.is_kubeflow() {
        let label = labels?.get(REPLICA_TYPE_LABEL)?;
        return job.kind.canonical_type(label).map(str::to_string);
    }
    match job.shape.pod_sets.as_slice() {
        [one] => Some(one.name.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gang::{Priorities, compute};
    use crate::job::normalize;
    use crate::kinds::batch_job::COMPLETION_INDEX_LABEL;
    use crate::kinds::kubeflow::REPLICA_INDEX_LABEL;
    use crate::kinds::{BATCH_JOB, PYTORCHJOB};
    use crate::resources::AdmissionDefaults;
    use crate::topology::{REQUIRED, SLICE_REQUIRED, SLICE_SIZE};
    use serde_json::json;

    fn pytorch(worker_annotations: serde_json::Value) -> (Job, Gang) {
        let t = |a: serde_json::Value| {
            json!({"metadata": {"annotations": a},
                   "spec": {"containers": [{"name": "c", "image": "i"}]}})
        };
        let job = normalize(
            &PYTORCHJOB,
            &json!({"metadata": {"name": "t", "namespace": "ns", "uid": "u"},
                "spec": {"pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": t(json!({}))},
                    "Worker": {"replicas": 16, "template": t(worker_annotations)}}}}),
        )
        .unwrap();
        let gang = compute(&job, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        (job, gang)
    }

    fn pod(kind: &str, index: &str) -> BTreeMap<String, String> {
        [
            (REPLICA_TYPE_LABEL.to_string(), kind.to_string()),
            (REPLICA_INDEX_LABEL.to_string(), index.to_string()),
        ]
        .into()
    }

    #[test]
    fn rule_13_each_worker_is_labelled_with_its_slice_index_over_slice_size() {
        let (job, gang) = pytorch(json!({SLICE_REQUIRED: "rack", SLICE_SIZE: "8"}));
        let at = |i: u64| {
            labels(
                BackendKind::Volcano,
                &job,
                &gang,
                None,
                Some(&pod("worker", &i.to_string())),
            )
        };
        for i in 0..16 {
            let want = vec![
                (POD_SET_LABEL, "Worker".to_string()),
                (SLICE_LABEL, (i / 8).to_string()),
            ];
            assert_eq!(at(i), want, "worker {i}");
        }
        // The Master asks for nothing; other backends get no labels; a label already there
        // stays as it is.
        let master = pod("master", "0");
        assert!(labels(BackendKind::Volcano, &job, &gang, None, Some(&master)).is_empty());
        let worker = pod("worker", "3");
        for b in [BackendKind::SchedulerPlugins, BackendKind::Kubernetes] {
            assert!(labels(b, &job, &gang, None, Some(&worker)).is_empty());
        }
        let mut labelled = pod("worker", "3");
        labelled.insert(SLICE_LABEL.into(), "7".into());
        assert_eq!(
            labels(BackendKind::Volcano, &job, &gang, None, Some(&labelled)),
            vec![(POD_SET_LABEL, "Worker".to_string())]
        );
    }

    #[test]
    fn rule_13_a_set_with_a_domain_of_its_own_is_labelled_without_a_slice() {
        let (job, gang) = pytorch(json!({REQUIRED: "rack"}));
        assert_eq!(
            labels(
                BackendKind::Volcano,
                &job,
                &gang,
                None,
                Some(&pod("worker", "2"))
            ),
            vec![(POD_SET_LABEL, "Worker".to_string())]
        );
    }

    #[test]
    fn rule_13_an_indexed_jobs_pods_are_sliced_by_completion_index() {
        let job = normalize(
            &BATCH_JOB,
            &json!({"metadata": {"name": "j", "namespace": "ns", "uid": "u",
                    "annotations": {"podgroup-sync.io/gang": "true"}},
                "spec": {"completionMode": "Indexed", "completions": 4, "parallelism": 4,
                    "template": {"metadata": {"annotations": {SLICE_REQUIRED: "rack", SLICE_SIZE: "2"}},
                        "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
        )
        .unwrap();
        let gang = compute(&job, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        let pod: BTreeMap<String, String> =
            [(COMPLETION_INDEX_LABEL.to_string(), "3".into())].into();
        let got = labels(BackendKind::Volcano, &job, &gang, None, Some(&pod));
        assert_eq!(got[1], (SLICE_LABEL, "1".to_string()), "{got:?}");
    }

    fn gang_of(job: &Job) -> Gang {
        compute(job, &Priorities::default(), &AdmissionDefaults::default()).unwrap()
    }

    fn labelled(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn rule_13_a_jobset_pod_is_sliced_by_its_jobs_index_and_its_completion_index() {
        use crate::kinds::JOBSET;
        use crate::kinds::jobset::JOB_INDEX_LABEL;
        let template = json!({"metadata": {"annotations": {SLICE_REQUIRED: "rack", SLICE_SIZE: "4"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let job = normalize(
            &JOBSET,
            &json!({"metadata": {"name": "js", "namespace": "ns", "uid": "u"},
                "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": {
                    "parallelism": 4, "completions": 4, "template": template}}}]}}),
        )
        .unwrap();
        let gang = gang_of(&job);
        // Job 0's pods are indices 0-3 (slice 0), job 1's 4-7 (slice 1).
        for (job_index, completion, slice) in [("0", "3", "0"), ("1", "0", "1"), ("1", "3", "1")] {
            let pod = labelled(&[
                (JOB_INDEX_LABEL, job_index),
                (COMPLETION_INDEX_LABEL, completion),
            ]);
            let got = labels(
                BackendKind::Volcano,
                &job,
                &gang,
                Some("workers"),
                Some(&pod),
            );
            assert_eq!(
                got,
                vec![
                    (POD_SET_LABEL, "workers".to_string()),
                    (SLICE_LABEL, slice.to_string())
                ],
                "job {job_index}, completion {completion}"
            );
        }
    }
}
