//! Pods of managed jobs that were created without a PodGroup link, kept from metadata-only
//! watches of the operators' pods that lack the webhook's marker label, one per operator label
//! (only with the pod-link webhook on). A pod the webhook
//! did not admit — it was stopped or unreachable (failurePolicy Ignore lets the pod through), or
//! the job was not in its cache yet — would otherwise run outside its gang with nobody told:
//! the job's reconcile reports it as `PodsNotLinked`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::backend::BACKENDS;
use crate::job::{JobKind, KINDS};
use crate::liveness::Probe;
use crate::metrics::Metrics;
use crate::trigger::Trigger;
use crate::watch::{WatchBackoff, observe};
use crate::webhook::link::{self, JOB_NAME_LABEL, PodView};

/// A job: namespace, kind, version, name (both MPIJob versions share the kind's name).
type JobKey = (String, &'static str, &'static str, String);

/// Unlinked pods by job: pod name → the pod set it belongs to, where that matters (see
/// [`link::Owner::pod_set`]).
#[derive(Clone, Default)]
pub struct UnlinkedPods(Arc<Mutex<HashMap<JobKey, PodsOfJob>>>);

/// A job's unlinked pods: pod name → its pod set.
type PodsOfJob = BTreeMap<String, Option<String>>;

impl UnlinkedPods {
    /// The unlinked pods of a job: (pod name, its pod set).
    pub fn of(&self, namespace: &str, kind: &JobKind, job: &str) -> Vec<(String, Option<String>)> {
        let key = (
            namespace.to_string(),
            kind.kind,
            kind.version,
            job.to_string(),
        );
        self.0
            .lock()
            .expect("lock")
            .get(&key)
            .map(|pods| pods.iter().map(|(p, l)| (p.clone(), l.clone())).collect())
            .unwrap_or_default()
    }

    /// Records a pod (`deleted`: removes it); the job whose unlinked pods changed, if any.
    fn observe(&self, pod: &PartialObjectMeta<Pod>, deleted: bool) -> Option<Trigger> {
        let (key, set, linked) = classify(pod)?;
        let name = pod.name_any();
        let mut index = self.0.lock().expect("lock");
        let changed = if deleted || linked {
            let pods = index.get_mut(&key)?;
            let removed = pods.remove(&name).is_some();
            if pods.is_empty() {
                index.remove(&key);
            }
            removed
        } else {
            let pods = index.entry(key.clone()).or_default();
            pods.insert(name, set.clone()) != Some(set)
        };
        changed.then(|| job_trigger(&key))
    }

    /// Replaces the entries of the kinds whose pods carry `label` with the pods of a completed
    /// list of that label; the jobs whose unlinked pods changed.
    fn replace(&self, label: &str, pods: &[PartialObjectMeta<Pod>]) -> Vec<Trigger> {
        let mut fresh: HashMap<JobKey, PodsOfJob> = HashMap::new();
        for pod in pods {
            if let Some((key, set, false)) = classify(pod) {
                fresh.entry(key).or_default().insert(pod.name_any(), set);
            }
        }
        let of_label = |k: &JobKey| kind_of(k).is_some_and(|kind| kind.pod_label == label);
        let mut index = self.0.lock().expect("lock");
        let changed = index
            .iter()
            .filter(|(k, v)| of_label(k) && fresh.get(*k) != Some(*v))
            .chain(fresh.iter().filter(|(k, _)| !index.contains_key(*k)))
            .map(|(k, _)| job_trigger(k))
            .collect();
        index.retain(|k, _| !of_label(k));
        index.extend(fresh);
        changed
    }
}

/// The job of a pod, its pod set, and whether it carries a link of any backend; `None` for pods
/// whose controller is not a kind podgroup-sync knows.
fn classify(pod: &PartialObjectMeta<Pod>) -> Option<(JobKey, Option<String>, bool)> {
    let owners = pod.metadata.owner_references.clone().unwrap_or_default();
    let view = PodView {
        name: pod.metadata.name.as_deref(),
        labels: pod.metadata.labels.as_ref(),
        annotations: pod.metadata.annotations.as_ref(),
        owner_references: &owners,
        scheduler_name: None,
        // Not in metadata: a native link is seen through the webhook's LINKED_ANNOTATION.
        scheduling_group: false,
    };
    let owner = link::owner_of(&view).ok()?;
    let linked = BACKENDS
        .iter()
        .any(|b| view.has_link_in_metadata(b.backend().link_key()));
    let key = (
        pod.namespace()?,
        owner.kind.kind,
        owner.kind.version,
        owner.name,
    );
    Some((key, owner.pod_set, linked))
}

fn kind_of((_, kind, version, _): &JobKey) -> Option<&'static JobKind> {
    KINDS
        .iter()
        .copied()
        .find(|k| k.kind == *kind && k.version == *version)
}

fn job_trigger(key: &JobKey) -> Trigger {
    let (namespace, kind, _, name) = key;
    let api_version = kind_of(key).map(|k| k.api_version()).unwrap_or_default();
    Trigger::Job {
        api_version,
        kind: kind.to_string(),
        namespace: namespace.clone(),
        name: name.clone(),
    }
}

/// The labels of the operators' pods, one watch each: every watched kind's `pod_label`, once.
pub fn pod_labels(kinds: &[&'static JobKind]) -> Vec<&'static str> {
    let mut labels: Vec<&'static str> = Vec::new();
    for k in kinds {
        if !labels.contains(&k.pod_label) {
            labels.push(k.pod_label);
        }
    }
    labels
}

/// The liveness probe name of the watch of pods with `label` (`pods` for the Kubeflow
/// operators' label, as before there were others).
pub fn probe_name(label: &str) -> String {
    if label == JOB_NAME_LABEL {
        "pods".to_string()
    } else {
        format!("pods/{label}")
    }
}

/// Watches the metadata of pods with one operator's label (a term of the webhook's
/// objectSelector) and keeps `index`; a change to a job's unlinked pods requeues the job.
pub fn spawn(
    client: Client,
    label: &'static str,
    index: UnlinkedPods,
    triggers: broadcast::Sender<Trigger>,
    probe: Probe,
    metrics: Arc<Metrics>,
) -> JoinHandle<()> {
    // Metadata only: labels, annotations and owners are all the index reads.
    let api: Api<PartialObjectMeta<Pod>> = Api::all(client);
    // Only pods without the webhook's marker: the API server filters out every pod the webhook
    // linked, so a burst of linked pods costs it no watch events (the marker is no proof of a
    // link: `classify` still checks each pod sent).
    let selector = format!("{label},!{}", crate::backend::LINKED_LABEL);
    let config = watcher::Config::default().labels(&selector).any_semantic();
    let stream = watcher(api, config).backoff(WatchBackoff::default());
    tokio::spawn(async move {
        let _guard = probe.task_guard();
        let mut listed: Vec<PartialObjectMeta<Pod>> = Vec::new();
        stream
            .for_each(|ev| {
                observe(&probe, &metrics, &ev);
                match ev {
                    Ok(watcher::Event::Init) => listed.clear(),
                    Ok(watcher::Event::InitApply(p)) => listed.push(p),
                    Ok(watcher::Event::InitDone) => {
                        for t in index.replace(label, &std::mem::take(&mut listed)) {
                            let _ = triggers.send(t);
                        }
                    }
                    Ok(watcher::Event::Apply(p)) => {
                        if let Some(t) = index.observe(&p, false) {
                            let _ = triggers.send(t);
                        }
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        if let Some(t) = index.observe(&p, true) {
                            let _ = triggers.send(t);
                        }
                    }
                    Err(_) => {}
                }
                future::ready(())
            })
            .await;
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::PYTORCHJOB;
    use serde_json::json;

    fn pod(
        name: &str,
        labels: serde_json::Value,
        annotations: serde_json::Value,
        owner: serde_json::Value,
    ) -> PartialObjectMeta<Pod> {
        serde_json::from_value(json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "namespace": "ns", "labels": labels, "annotations": annotations,
                "ownerReferences": [owner]}}))
        .unwrap()
    }

    fn owned_by_job() -> serde_json::Value {
        json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train", "uid": "u", "controller": true})
    }

    #[test]
    fn unlinked_pods_of_a_job_are_kept_until_linked_or_deleted() {
        let index = UnlinkedPods::default();
        let labels = json!({"training.kubeflow.org/job-name": "train"});
        let bare = pod("train-worker-0", labels.clone(), json!({}), owned_by_job());
        let t = index
            .observe(&bare, false)
            .expect("a new unlinked pod triggers its job");
        assert_eq!(
            t,
            Trigger::Job {
                api_version: "kubeflow.org/v1".into(),
                kind: "PyTorchJob".into(),
                namespace: "ns".into(),
                name: "train".into()
            }
        );
        assert_eq!(index.observe(&bare, false), None, "seen again: no news");
        assert_eq!(
            index.of("ns", &PYTORCHJOB, "train"),
            vec![("train-worker-0".to_string(), None)]
        );
        // Linked for Volcano: no longer unlinked.
        let volcano = pod(
            "train-worker-0",
            labels.clone(),
            json!({"scheduling.k8s.io/group-name": "train"}),
            owned_by_job(),
        );
        assert!(index.observe(&volcano, false).is_some());
        assert!(index.of("ns", &PYTORCHJOB, "train").is_empty());
        // A linked pod never enters; a deleted unlinked one leaves.
        let linked = pod(
            "train-worker-1",
            json!({"training.kubeflow.org/job-name": "train", "scheduling.x-k8s.io/pod-group": "train"}),
            json!({}),
            owned_by_job(),
        );
        assert_eq!(index.observe(&linked, false), None);
        index.observe(&bare, false);
        assert!(index.observe(&bare, true).is_some());
        assert!(index.of("ns", &PYTORCHJOB, "train").is_empty());
        // Pods of other owners are not kept.
        let other = pod(
            "web-1",
            labels,
            json!({}),
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "r", "controller": true}),
        );
        assert_eq!(index.observe(&other, false), None);
    }

    #[test]
    fn a_relist_replaces_the_index_and_names_the_jobs_that_changed() {
        let index = UnlinkedPods::default();
        let labels = json!({"training.kubeflow.org/job-name": "train"});
        index.observe(
            &pod("gone", labels.clone(), json!({}), owned_by_job()),
            false,
        );
        let changed = index.replace(
            JOB_NAME_LABEL,
            &[pod("new", labels, json!({}), owned_by_job())],
        );
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert_eq!(
            index.of("ns", &PYTORCHJOB, "train"),
            vec![("new".to_string(), None)]
        );
        assert!(
            index
                .replace(
                    JOB_NAME_LABEL,
                    &[pod(
                        "new",
                        json!({"training.kubeflow.org/job-name": "train"}),
                        json!({}),
                        owned_by_job()
                    )]
                )
                .is_empty()
        );
    }

    #[test]
    fn an_mpijob_v1_pod_requeues_the_v1_job_not_the_v2beta1_one() {
        let index = UnlinkedPods::default();
        let owner = json!({"apiVersion": "kubeflow.org/v1", "kind": "MPIJob", "name": "mpi", "uid": "u", "controller": true});
        let p = pod(
            "mpi-worker-0",
            json!({"training.kubeflow.org/job-name": "mpi"}),
            json!({}),
            owner,
        );
        let Some(Trigger::Job { api_version, .. }) = index.observe(&p, false) else {
            panic!()
        };
        assert_eq!(api_version, "kubeflow.org/v1");
        assert_eq!(index.of("ns", &crate::job::MPIJOB_V1, "mpi").len(), 1);
        assert!(
            index
                .of("ns", &crate::job::MPIJOB_V2BETA1, "mpi")
                .is_empty()
        );
    }
}
