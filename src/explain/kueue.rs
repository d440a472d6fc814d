//! What Kueue changes about a job's PodGroup (SPEC §12), for `explain`: the queue the job is in,
//! whether it is suspended now (no PodGroup until admitted), what its Workload admitted, and how
//! that compares with the gang's requests.

use std::fmt::Write;

use serde_json::Value;

use super::Surroundings;
use crate::backend::BackendKind;
use crate::gang::Gang;
use crate::job::Job;
use crate::kueue::{self, Admission, quota};

/// The job's Workload among those `explain` was given or read: the one its controller reference
/// names (by UID, or offline by kind and name).
fn workload_of<'a>(job: &Job, around: &'a Surroundings) -> Option<&'a Value> {
    around.workloads.iter().find(|w| {
        let owners = w
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array);
        owners.into_iter().flatten().any(|o| {
            o.get("controller").and_then(Value::as_bool) == Some(true)
                && (o.get("uid").and_then(Value::as_str) == Some(job.uid.as_str())
                    || (o.get("kind").and_then(Value::as_str) == Some(job.kind.kind)
                        && o.get("name").and_then(Value::as_str) == Some(job.name.as_str())))
        })
    })
}

/// The job's Workload read, when it has one.
pub fn admission(job: &Job, around: &Surroundings) -> Option<Admission> {
    workload_of(job, around).map(kueue::read)
}

/// The Kueue lines; nothing for a job that is not in a Kueue queue and has no Workload.
/// `capped`: the gang as a Volcano PodGroup gets it, when Kueue's admission lowers minResources.
pub fn describe(
    out: &mut String,
    value: &Value,
    job: &Job,
    gang: &Gang,
    backend: BackendKind,
    admission: Option<&Admission>,
) {
    let queue = value
        .pointer("/metadata/labels")
        .and_then(|l| l.get(kueue::QUEUE_LABEL))
        .and_then(Value::as_str);
    if queue.is_none() && admission.is_none() {
        return;
    }
    if let Some(q) = queue {
        let _ = writeln!(out, "# Kueue: queued in LocalQueue {q}");
    }
    if job.suspended() {
        let _ = writeln!(
            out,
            "# Kueue: suspended now — no PodGroup until Kueue admits the job (unsuspends it); the PodGroup below is what admission brings, and a preemption (suspend) deletes it"
        );
    }
    let Some(a) = admission else {
        let _ = writeln!(out, "# Kueue: no Workload given or found");
        return;
    };
    let state = match (&a.evicted, a.admitted) {
        (Some(reason), _) => format!("evicted ({reason})"),
        (None, true) => format!(
            "admitted by ClusterQueue {}",
            a.cluster_queue.as_deref().unwrap_or("?")
        ),
        (None, false) => "pending: not admitted yet".to_string(),
    };
    let _ = writeln!(out, "# Kueue: Workload {}: {state}", a.workload);
    for (name, requested) in &a.requested {
        let admitted = a.pod_sets.iter().find(|p| &p.name == name);
        let count = admitted.and_then(|p| p.count);
        let line = match count {
            Some(c) if c < *requested => format!(
                "{c} of {requested} pods admitted (partial admission: the gang follows the counts Kueue writes into the job)"
            ),
            Some(c) => format!("{c} of {requested} pods admitted"),
            None => format!("{requested} pods requested"),
        };
        let _ = writeln!(out, "#   {name}: {line}");
    }
    if !a.admitted {
        return;
    }
    let review = quota::review(gang, backend, Some(a), false, None, None);
    if review.events.is_empty() {
        let _ = writeln!(out, "# Kueue: the gang's pods request what Kueue admitted");
    }
    for (reason, message) in &review.events {
        let _ = writeln!(out, "# warning: {}: {message}", reason.as_str());
    }
    if review.capped.is_some() {
        let _ = writeln!(
            out,
            "# Kueue: minResources capped at what Kueue admitted (a Volcano queue is never asked for more)"
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::backend::BackendOptions;

    #[test]
    fn rule_12_explain_says_suspended_and_what_kueue_admitted() {
        let job = r#"
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: train, namespace: ml, labels: {kueue.x-k8s.io/queue-name: team}, annotations: {podgroup-sync.io/backend: volcano}}
spec:
  runPolicy: {suspend: true}
  pytorchReplicaSpecs:
    Worker:
      replicas: 4
      template: {spec: {containers: [{name: c, image: i, resources: {requests: {cpu: "1"}}}]}}
"#;
        let out = crate::explain::explain(job, None, &BackendOptions::default()).unwrap();
        assert!(out.contains("# Kueue: queued in LocalQueue team"), "{out}");
        assert!(out.contains("suspended now — no PodGroup"), "{out}");
        assert!(out.contains("no Workload given or found"), "{out}");
        let workload = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "pytorchjob-train", "namespace": "ml", "ownerReferences": [
                {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train",
                 "uid": "u", "controller": true}]},
            "spec": {"podSets": [{"name": "worker", "count": 4}]},
            "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "worker", "count": 4, "resourceUsage": {"cpu": "3"}}]},
                "conditions": [{"type": "Admitted", "status": "True"}]}});
        let admitted = job.replace("runPolicy: {suspend: true}", "runPolicy: {}");
        let text = format!(
            "{admitted}\n---\n{}",
            serde_json::to_string(&workload).unwrap()
        );
        let out = crate::explain::explain(&text, None, &BackendOptions::default()).unwrap();
        assert!(!out.contains("suspended now"), "{out}");
        assert!(
            out.contains("# Kueue: Workload pytorchjob-train: admitted by ClusterQueue cq"),
            "{out}"
        );
        assert!(out.contains("#   worker: 4 of 4 pods admitted"), "{out}");
        assert!(
            out.contains("KueueQuotaDiffers: the gang's pods request other resources"),
            "{out}"
        );
        assert!(
            out.contains("minResources capped at what Kueue admitted"),
            "{out}"
        );
        assert!(
            out.contains("cpu: '3'") || out.contains("cpu: \"3\""),
            "{out}"
        );
    }
}
