//! Beside Kueue (SPEC §12). Kueue admits a job by unsuspending it and preempts it by suspending
//! it again; the lifecycle follows that through the job's `suspend` alone (no PodGroup while
//! suspended). What Kueue admitted — the counts and the resources of each pod set — is on the
//! job's `kueue.x-k8s.io` Workload, read here: the planner compares it with the gang's requests
//! ([`quota`]), caps a Volcano PodGroup's minResources at it, and `explain` shows it. The
//! Workloads are watched ([`watch`]) only while their CRD is served.

pub mod quota;
pub mod watch;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use kube::discovery::ApiResource;
use serde_json::Value;

use crate::quantity::Quantity;
use crate::resources::ResourceMap;

/// The label that puts a job in a Kueue LocalQueue.
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";

/// The Workload resource podgroup-sync reads (`kueue.x-k8s.io/v1beta2`, served since Kueue 0.15).
pub fn workload_resource() -> ApiResource {
    ApiResource {
        group: "kueue.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "kueue.x-k8s.io/v1beta2".into(),
        kind: "Workload".into(),
        plural: "workloads".into(),
    }
}

/// What Kueue admitted for one pod set of a job.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSetAdmission {
    /// Kueue's name of the pod set (e.g. `master`, `worker`).
    pub name: String,
    /// The pods admitted (below the pod set's count under partial admission).
    pub count: Option<u64>,
    /// The requests Kueue reserved for all of them.
    pub usage: ResourceMap,
}

/// One of a job's Workloads, as far as podgroup-sync cares.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Admission {
    pub workload: String,
    /// The ClusterQueue that reserved the quota.
    pub cluster_queue: Option<String>,
    /// The `Admitted` condition is true.
    pub admitted: bool,
    /// Evicted (preempted, or past `waitForPodsReady`), with the reason.
    pub evicted: Option<String>,
    /// The pods each pod set asks for (`spec.podSets[].count`).
    pub requested: Vec<(String, u64)>,
    /// What Kueue admitted, per pod set (empty until quota is reserved).
    pub pod_sets: Vec<PodSetAdmission>,
    /// Quantities Kueue wrote that could not be read (skipped in every comparison).
    pub unreadable: Vec<String>,
}

impl Admission {
    /// The requests Kueue admitted for the whole job, resource by resource.
    pub fn admitted_usage(&self) -> ResourceMap {
        let mut total = ResourceMap::new();
        for set in &self.pod_sets {
            for (name, q) in &set.usage {
                let sum = match total.get(name) {
                    Some(t) => t.checked_add(*q).unwrap_or(*t),
                    None => *q,
                };
                total.insert(name.clone(), sum);
            }
        }
        total
    }
}

/// Reads a Workload (pure; anything missing or malformed reads as absent, never an error: a
/// Workload is Kueue's object, and podgroup-sync only reports what it says).
pub fn read(workload: &Value) -> Admission {
    let name = workload.pointer("/metadata/name").and_then(Value::as_str);
    read_named(name.unwrap_or_default(), workload)
}

/// [`read`] of Workload `name` whose `spec` and `status` are in `workload` (a watched object's
/// data, its metadata typed apart).
pub fn read_named(name: &str, workload: &Value) -> Admission {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let status = workload.get("status");
    let conditions = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let condition = |t: &str| {
        conditions
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(t))
            .filter(|c| c.get("status").and_then(Value::as_str) == Some("True"))
    };
    let admission = status.and_then(|s| s.get("admission"));
    let mut unreadable = Vec::new();
    let pod_sets = admission
        .and_then(|a| a.get("podSetAssignments"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let name = text(p, "name").unwrap_or_default();
            let mut usage = ResourceMap::new();
            let list = p.get("resourceUsage").and_then(Value::as_object);
            for (resource, q) in list.into_iter().flatten() {
                let parsed = q
                    .as_str()
                    .and_then(|s| Quantity::parse_non_negative(&K8sQuantity(s.into())).ok());
                match parsed {
                    Some(q) => {
                        usage.insert(resource.clone(), q);
                    }
                    None => unreadable.push(format!("{name}/{resource}")),
                }
            }
            PodSetAdmission {
                count: p.get("count").and_then(Value::as_u64),
                name,
                usage,
            }
        })
        .collect();
    let requested = workload
        .pointer("/spec/podSets")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let count = p.get("count").and_then(Value::as_u64).unwrap_or(1);
            (text(p, "name").unwrap_or_default(), count)
        })
        .collect();
    Admission {
        workload: name.to_string(),
        cluster_queue: admission.and_then(|a| text(a, "clusterQueue")),
        admitted: condition("Admitted").is_some(),
        evicted: condition("Evicted").map(|c| text(c, "reason").unwrap_or_default()),
        requested,
        pod_sets,
        unreadable,
    }
}

/// The Workloads of one job, by name.
pub type JobWorkloads = BTreeMap<String, Arc<Admission>>;

/// The Workloads of every job, by the job's UID and the Workload's name.
#[derive(Clone, Default)]
pub struct Admissions(Arc<RwLock<HashMap<String, JobWorkloads>>>);

impl Admissions {
    /// The Workload that speaks for a job: the admitted one, else any (a job has one Workload;
    /// for a moment after a change of its spec, an old one beside a new one).
    pub fn of(&self, job_uid: &str) -> Option<Arc<Admission>> {
        let map = self.0.read().expect("lock");
        let all = map.get(job_uid)?;
        all.values()
            .find(|a| a.admitted)
            .or_else(|| all.values().next())
            .cloned()
    }

    /// Every Workload of a job, by name.
    pub fn all(&self, job_uid: &str) -> Option<JobWorkloads> {
        self.0.read().expect("lock").get(job_uid).cloned()
    }

    /// Records a Workload; false when nothing changed.
    pub fn insert(&self, job_uid: &str, admission: Admission) -> bool {
        let mut map = self.0.write().expect("lock");
        let all = map.entry(job_uid.to_string()).or_default();
        if all.get(&admission.workload).map(Arc::as_ref) == Some(&admission) {
            return false;
        }
        all.insert(admission.workload.clone(), Arc::new(admission));
        true
    }

    /// Forgets a Workload.
    pub fn remove(&self, job_uid: &str, workload: &str) {
        let mut map = self.0.write().expect("lock");
        if let Some(all) = map.get_mut(job_uid) {
            all.remove(workload);
            if all.is_empty() {
                map.remove(job_uid);
            }
        }
    }

    /// Replaces everything (after a relist).
    pub fn replace(&self, fresh: HashMap<String, JobWorkloads>) {
        *self.0.write().expect("lock") = fresh;
    }

    /// Forgets every Workload (the CRD is no longer served).
    pub fn clear(&self) {
        self.0.write().expect("lock").clear();
    }

    pub fn len(&self) -> usize {
        self.0
            .read()
            .expect("lock")
            .values()
            .map(BTreeMap::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn workload() -> Value {
        json!({
            "metadata": {"name": "pytorchjob-train-1a2b3", "ownerReferences": [
                {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train",
                 "uid": "u1", "controller": true}]},
            "spec": {"queueName": "team", "podSets": [
                {"name": "master", "count": 1}, {"name": "worker", "count": 4}]},
            "status": {
                "admission": {"clusterQueue": "cq", "podSetAssignments": [
                    {"name": "master", "count": 1, "resourceUsage": {"cpu": "2", "memory": "4Gi"}},
                    {"name": "worker", "count": 2, "resourceUsage": {"cpu": "4", "nvidia.com/gpu": "2"}}]},
                "conditions": [
                    {"type": "QuotaReserved", "status": "True"},
                    {"type": "Admitted", "status": "True"}]}
        })
    }

    #[test]
    fn rule_12_a_workload_reads_as_its_admitted_counts_and_requests() {
        let w = workload();
        let a = read(&w);
        assert!(a.admitted && a.evicted.is_none());
        assert_eq!(a.cluster_queue.as_deref(), Some("cq"));
        assert_eq!(
            a.requested,
            vec![("master".to_string(), 1), ("worker".to_string(), 4)]
        );
        assert_eq!(a.pod_sets[1].count, Some(2));
        let total = a.admitted_usage();
        let q = |s: &str| Quantity::parse_non_negative(&K8sQuantity(s.into())).unwrap();
        assert_eq!(total["cpu"], q("6"));
        assert_eq!(total["memory"], q("4Gi"));
        assert_eq!(total["nvidia.com/gpu"], q("2"));
    }

    #[test]
    fn rule_12_a_suspended_or_malformed_workload_reads_as_not_admitted_and_never_fails() {
        let mut w = workload();
        w["status"]["conditions"] = json!([
            {"type": "Admitted", "status": "False"},
            {"type": "Evicted", "status": "True", "reason": "Preempted"}]);
        w["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]["cpu"] = json!("lots");
        let a = read(&w);
        assert!(!a.admitted);
        assert_eq!(a.evicted.as_deref(), Some("Preempted"));
        assert_eq!(a.unreadable, vec!["master/cpu".to_string()]);
        for junk in [
            json!(null),
            json!({"status": 3}),
            json!({"spec": {"podSets": "x"}}),
        ] {
            let a = read(&junk);
            assert!(!a.admitted && a.pod_sets.is_empty());
        }
    }

    #[test]
    fn rule_12_the_admitted_workload_speaks_for_its_job() {
        let index = Admissions::default();
        let old = Admission {
            workload: "a-old".into(),
            ..Default::default()
        };
        let new = Admission {
            workload: "b-new".into(),
            admitted: true,
            ..Default::default()
        };
        assert!(index.insert("u1", old.clone()));
        assert!(!index.insert("u1", old), "nothing changed");
        assert!(index.insert("u1", new));
        assert_eq!(index.of("u1").unwrap().workload, "b-new");
        index.remove("u1", "b-new");
        assert_eq!(index.of("u1").unwrap().workload, "a-old");
        index.remove("u1", "a-old");
        assert!(index.of("u1").is_none() && index.is_empty());
    }
}
