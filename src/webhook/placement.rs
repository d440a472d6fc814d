//! The labels that place a pod in its pod set's sub-group of a Volcano PodGroup (SPEC §13,
//! pure): the pod set's name, and for a sliced set the pod's slice (its index / the slice size),
//! read from the index label the kind's operator gives each pod.

use std::collections::BTreeMap;

use crate::backend::BackendKind;
use crate::gang::Gang;
use crate::job::Job;
use crate::kinds::kubeflow::REPLICA_TYPE_LABEL;
use crate::names::valid_label_value;
use crate::topology::{POD_SET_LABEL, SLICE_LABEL};

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
    let t = &gang.topology;
    if backend != BackendKind::Volcano || t.is_empty() {
        return Vec::new();
    }
    let Some(set) = pod_set(job, owner_set, pod_labels) else {
        return Vec::new();
    };
    let Some(request) = t.set(&set) else {
        return Vec::new();
    };
    let own_domain = request.domain.is_some() && t.common_domain().is_none();
    if !(request.slices.is_some() || own_domain) || !valid_label_value(&set) {
        return Vec::new();
    }
    let has = |key: &str| pod_labels.is_some_and(|l| l.contains_key(key));
    let mut out = Vec::new();
    if !has(POD_SET_LABEL) {
        out.push((POD_SET_LABEL, set.clone()));
    }
    let index = job
        .kind
        .rules
        .pod_index_label()
        .and_then(|key| pod_labels?.get(key))
        .and_then(|v| v.parse::<u64>().ok());
    if let (Some(slices), Some(i)) = (&request.slices, index)
        && !has(SLICE_LABEL)
    {
        out.push((SLICE_LABEL, slices.of(i).to_string()));
    }
    out
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
}
