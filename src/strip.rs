//! What the caches keep of a watched object: the fields podgroup-sync reads, nothing else
//! (issue 15). A job is kept with its metadata, its run and elastic policies and its replica
//! specs, but each pod template only with what the gang, the backend choice and the link
//! checks read; its status only with its conditions. A PodGroup loses the last-applied copy
//! and every field manager's entry but ours while it is read (by the PodGroup watch, `lean`).
//!
//! Reading is defined by what `job::normalize`, `gang`, `backend` and `health::feasible` look
//! at; the tests below compare `explain` of full and stripped jobs, so a new reader of a
//! dropped field fails there first.

use kube::api::DynamicObject;
use serde_json::{Map, Value};

use crate::job::JobKind;

/// Dropped from cached objects: a second copy of the whole object.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Pod-spec fields read (SPEC §3.2: requests, priority, overhead; §2: scheduler; §10:
/// tolerations; the native backend's scheduling group).
const POD_SPEC_FIELDS: &[&str] = &[
    "containers",
    "initContainers",
    "overhead",
    "priorityClassName",
    "resources",
    "runtimeClassName",
    "schedulerName",
    "schedulingGroup",
    "tolerations",
];

/// Container fields read: the name (required by the type), requests and limits, and
/// `restartPolicy` (an init container with `Always` is a sidecar).
const CONTAINER_FIELDS: &[&str] = &["name", "resources", "restartPolicy"];

/// Template metadata read: the link label or annotation and Volcano's task-spec annotation.
const TEMPLATE_METADATA_FIELDS: &[&str] = &["labels", "annotations"];

/// Strips a job of `kind` for the cache.
pub fn job(kind: &'static JobKind, job: &mut DynamicObject) {
    job.metadata.managed_fields = None;
    if let Some(a) = job.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
    let read = kind.rules.status_fields();
    if let Some(status) = job.data.get_mut("status").and_then(Value::as_object_mut) {
        status.retain(|k, _| read.contains(&k.as_str()));
    }
    let requested = kind.rules.requested(
        job.metadata
            .annotations
            .as_ref()
            .unwrap_or(&Default::default()),
    );
    if !requested {
        // Not a gang (a batch/v1 Job without the request): its metadata is all that is read.
        job.data = serde_json::json!({});
        return;
    }
    if let Some(spec) = job.data.get_mut("spec") {
        for template in kind.rules.templates_mut(kind, spec) {
            template_in_place(template);
        }
    }
}

/// Keeps what is read of one pod template.
fn template_in_place(template: &mut Map<String, Value>) {
    template.retain(|k, _| k == "metadata" || k == "spec");
    if let Some(meta) = template.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.retain(|k, _| TEMPLATE_METADATA_FIELDS.contains(&k.as_str()));
    }
    let Some(spec) = template.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.retain(|k, _| POD_SPEC_FIELDS.contains(&k.as_str()));
    for list in ["containers", "initContainers"] {
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            if let Some(c) = c.as_object_mut() {
                c.retain(|k, _| CONTAINER_FIELDS.contains(&k.as_str()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendKind, BackendOptions};
    use crate::explain;

    /// Everything the computation reads, and a lot it does not, in one job.
    const RICH: &str = r#"
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: rich
  namespace: team
  annotations: {podgroup-sync.io/backend: volcano, kubectl.kubernetes.io/last-applied-configuration: "{}"}
spec:
  runPolicy: {schedulingPolicy: {queue: q1, priorityClass: high}}
  elasticPolicy: {minReplicas: 2, maxReplicas: 4}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        metadata:
          labels: {scheduling.x-k8s.io/pod-group: rich-gang, app: x}
          annotations: {volcano.sh/task-spec: master, scheduling.k8s.io/group-name: rich-gang}
        spec:
          schedulerName: volcano
          priorityClassName: high
          runtimeClassName: kata
          tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]
          resources: {limits: {memory: 20Gi}}
          volumes: [{name: data, emptyDir: {}}]
          nodeSelector: {pool: a}
          initContainers:
            - {name: side, image: s, restartPolicy: Always, resources: {requests: {cpu: 500m}}, env: [{name: A, value: b}]}
            - {name: init, image: i, resources: {requests: {cpu: "3", memory: 1Gi}}, command: [x]}
          containers:
            - name: main
              image: big
              command: [python, train.py]
              args: [--epochs, "9"]
              env: [{name: X, value: "1"}, {name: Y, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
              volumeMounts: [{name: data, mountPath: /data}]
              ports: [{containerPort: 23456}]
              livenessProbe: {exec: {command: [/bin/true]}}
              resources: {requests: {cpu: "2", memory: 4Gi}, limits: {nvidia.com/gpu: 1}}
    Worker:
      replicas: 3
      template:
        metadata: {labels: {scheduling.x-k8s.io/pod-group: rich-gang}}
        spec:
          overhead: {cpu: 250m}
          containers:
            - {name: w, image: big, env: [{name: Z, value: "2"}], resources: {requests: {cpu: "4"}, limits: {nvidia.com/gpu: 2}}}
status:
  conditions: [{type: Created, status: "True", message: created}]
  replicaStatuses: {Master: {active: 1}}
  startTime: "2026-01-01T00:00:00Z"
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: kata}
handler: kata
overhead: {podFixed: {cpu: 100m, memory: 64Mi}}
---
apiVersion: v1
kind: LimitRange
metadata: {name: defaults, namespace: team}
spec:
  limits: [{type: Container, defaultRequest: {memory: 256Mi}}]
---
apiVersion: v1
kind: Node
metadata: {name: n1}
spec: {taints: [{key: gpu, effect: NoSchedule}]}
status: {allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: "4"}}
"#;

    fn examples() -> Vec<String> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
        let mut texts: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect();
        texts.push(RICH.to_string());
        texts
    }

    fn stripped(job: &Value) -> Value {
        let kind = crate::kinds::lookup(
            job["apiVersion"].as_str().unwrap(),
            job["kind"].as_str().unwrap(),
        )
        .unwrap();
        let mut obj: DynamicObject = serde_json::from_value(job.clone()).unwrap();
        super::job(kind, &mut obj);
        serde_json::to_value(obj).unwrap()
    }

    #[test]
    fn explain_of_a_stripped_job_equals_explain_of_the_whole_job_for_every_backend() {
        let opts = BackendOptions::default();
        for text in examples() {
            let (job, around) = explain::surroundings::read(&[text]).unwrap();
            let small = stripped(&job);
            assert!(small.to_string().len() <= job.to_string().len());
            for backend in [
                None,
                Some(BackendKind::SchedulerPlugins),
                Some(BackendKind::Volcano),
                Some(BackendKind::Kubernetes),
            ] {
                let whole = explain::explain_job(&job, &around, backend, None, &opts).unwrap();
                let part = explain::explain_job(&small, &around, backend, None, &opts).unwrap();
                assert_eq!(whole.text, part.text, "{}", job["metadata"]["name"]);
            }
        }
    }

    /// The reconcile's path — packed into the cache, unpacked, normalised from typed metadata —
    /// gives the job normalising the stripped object as one JSON value gives (the test above
    /// compares stripped and whole).
    #[test]
    fn a_job_through_the_cache_normalises_as_the_whole_job() {
        for text in examples() {
            let (job, _) = explain::surroundings::read(&[text]).unwrap();
            let kind = crate::kinds::lookup(
                job["apiVersion"].as_str().unwrap(),
                job["kind"].as_str().unwrap(),
            )
            .unwrap();
            let mut obj: DynamicObject = serde_json::from_value(job.clone()).unwrap();
            super::job(kind, &mut obj);
            let cached = crate::packed::Packed::pack(obj).unpack();
            assert_eq!(
                crate::job::normalize_object(kind, &cached).unwrap(),
                crate::job::normalize(kind, &stripped(&job)).unwrap(),
                "{}",
                job["metadata"]["name"]
            );
        }
    }

    #[test]
    fn a_stripped_template_keeps_only_what_is_read() {
        let (job, _) = explain::surroundings::read(&[RICH.to_string()]).unwrap();
        let small = stripped(&job);
        let master = &small["spec"]["pytorchReplicaSpecs"]["Master"]["template"];
        let main = &master["spec"]["containers"][0];
        assert_eq!(
            main.as_object().unwrap().keys().collect::<Vec<_>>(),
            vec!["name", "resources"]
        );
        assert!(master["spec"].get("volumes").is_none());
        assert!(master["spec"].get("nodeSelector").is_none());
        assert_eq!(
            master["spec"]["initContainers"][0]["restartPolicy"],
            "Always"
        );
        assert_eq!(small["status"].as_object().unwrap().len(), 1);
        assert!(small["metadata"]["annotations"].get(LAST_APPLIED).is_none());
        assert_eq!(small["spec"]["runPolicy"], job["spec"]["runPolicy"]);
        assert_eq!(small["spec"]["elasticPolicy"], job["spec"]["elasticPolicy"]);
    }
}
