//! JobSet (`jobset.x-k8s.io/v1alpha2`, SPEC §11): one gang per JobSet; a pod set per replicated
//! job of `replicas` Jobs × the pods each Job runs at once.
//!
//! **What can start together.** With `startupPolicy.startupPolicyOrder: InOrder` the JobSet
//! controller creates a replicated job's Jobs only once every earlier one is ready, and a
//! replicated job with `dependsOn` only once the jobs it names are ready or complete. A gang of
//! every pod would then wait for pods that are created only after the gang runs: a deadlock. So
//! the gang is the pods created at once — the first replicated job under InOrder, the replicated
//! jobs without `dependsOn` otherwise — and the later ones are out of the gang (not linked, not
//! counted); they are scheduled one by one when they come. Restarts under `failurePolicy`
//! recreate the Jobs of the same JobSet: its gang and PodGroup stay.
//!
//! **Trainer v2.** A TrainJob runs as a JobSet it controls, of the same name. When the TrainJob's
//! runtime has a `podGroupPolicy`, Trainer makes the PodGroup itself and puts its link into the
//! JobSet's pod templates: that JobSet is managed elsewhere and podgroup-sync leaves it (and the
//! PodGroup) alone. Otherwise the JobSet's gang is podgroup-sync's, owned by the JobSet: the
//! JobSet is what carries the pods' shape and suspension, its pods' owner chain leads to it, and
//! it is deleted with its TrainJob, so the PodGroup goes with both (Trainer's runtimes are merged
//! into the JobSet by Trainer; reading them again would be computing Trainer's job twice).

use std::collections::BTreeMap;

use serde_json::Value;

use super::template::{count, pod_template, text};
use crate::workload::{
    InvalidJob, JobKind, KindRules, MinMemberRule, ObjectIdentity, PodSet, SchedulingPolicy, Shape,
    condition_true,
};
use crate::workload::{index_label, object_at};

pub const JOBSET: JobKind = JobKind {
    kind: "JobSet",
    group: "jobset.x-k8s.io",
    version: "v1alpha2",
    plural: "jobsets",
    replica_specs_field: "",
    replica_types: &[],
    default_manager: "jobset.sigs.k8s.io/jobset-controller",
    pod_label: JOBSET_NAME_LABEL,
    rules: &JobSetRules,
};

/// The label the JobSet controller puts on every Job and pod of a JobSet, naming it.
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";
/// The label naming a pod's replicated job.
pub const REPLICATED_JOB_LABEL: &str = "jobset.sigs.k8s.io/replicatedjob-name";
/// The `managedBy` Trainer's PodGroup policy stands for (a JobSet whose TrainJob's runtime makes
/// its own PodGroup).
pub const TRAINER_PODGROUP_POLICY: &str = "trainer.kubeflow.org/podgroup-policy";

/// Pod-template links Trainer's coscheduling and Volcano plugins write.
const TRAINER_LINKS: [&str; 2] = [
    "scheduling.x-k8s.io/pod-group",
    "scheduling.k8s.io/group-name",
];

pub struct JobSetRules;

/// The pod label holding the index of a pod's Job within its replicated job.
pub const JOB_INDEX_LABEL: &str = "jobset.sigs.k8s.io/job-index";

impl KindRules for JobSetRules {
    /// A pod's Job's index and its completion index within the Job (JobSet's Jobs are Indexed).
    fn indexes_pods(&self) -> bool {
        true
    }

    /// The Job's index × the pods of one Job + the pod's completion index: consecutive indices
    /// are the pods of one Job, then of the next.
    fn pod_index(&self, set: &PodSet, labels: &BTreeMap<String, String>) -> Option<u64> {
        let job = index_label(labels, JOB_INDEX_LABEL)?;
        let within = index_label(labels, super::batch_job::COMPLETION_INDEX_LABEL)?;
        let per_job = set.count / set.groups.max(1);
        (within < per_job).then(|| job * per_job + within)
    }

    fn read(
        &self,
        _kind: &'static JobKind,
        spec: &Value,
        meta: &ObjectIdentity,
    ) -> Result<Shape, InvalidJob> {
        let jobs = match spec.get("replicatedJobs") {
            Some(Value::Array(jobs)) if !jobs.is_empty() => jobs,
            None | Some(Value::Null) | Some(Value::Array(_)) => {
                return Err(InvalidJob::NoReplicaSpecs("replicatedJobs"));
            }
            Some(other) => {
                return Err(InvalidJob::Malformed(format!(
                    "replicatedJobs: expected a list, got {other}"
                )));
            }
        };
        let in_order = spec
            .get("startupPolicy")
            .and_then(|p| text(p, "startupPolicyOrder"))
            == Some("InOrder");
        let mut pod_sets = Vec::with_capacity(jobs.len());
        for (i, job) in jobs.iter().enumerate() {
            let name = text(job, "name")
                .filter(|n| !n.is_empty())
                .ok_or_else(|| InvalidJob::Malformed(format!("replicatedJobs[{i}] has no name")))?;
            if pod_sets.iter().any(|s: &PodSet| s.name == name) {
                return Err(InvalidJob::DuplicateReplicaType(name.into(), name.into()));
            }
            let replicas = count(job, "replicas", 1, name)?;
            let job_spec = job.get("template").and_then(|t| t.get("spec"));
            let empty = Value::Null;
            let job_spec = job_spec.unwrap_or(&empty);
            let pods = pods_per_job(job_spec, name)?;
            let template = pod_template(name, job_spec.get("template").cloned())?;
            let count = replicas
                .checked_mul(pods)
                .ok_or(InvalidJob::TooManyReplicas(replicas as u128 * pods as u128))?;
            let mut set = PodSet::whole(name, count, template);
            set.groups = replicas;
            let waits = job
                .get("dependsOn")
                .and_then(Value::as_array)
                .is_some_and(|d| !d.is_empty());
            // Created only after earlier replicated jobs are ready: not part of what starts
            // together.
            set.in_gang = !(waits || (in_order && i > 0));
            pod_sets.push(set);
        }
        let managed_by = match text(spec, "managedBy") {
            Some(m) => Some(m.to_string()),
            None if trainer_makes_the_pod_group(meta, &pod_sets) => {
                Some(TRAINER_PODGROUP_POLICY.to_string())
            }
            None => None,
        };
        Ok(Shape {
            pod_sets,
            hints: SchedulingPolicy::default(),
            suspended: spec
                .get("suspend")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            managed_by,
            rule: MinMemberRule::SumOfPodSets,
            rule_warnings: Vec::new(),
            gang_requested: true,
        })
    }

    fn templates_mut<'a>(
        &self,
        _kind: &'static JobKind,
        spec: &'a mut Value,
    ) -> Vec<&'a mut serde_json::Map<String, Value>> {
        let jobs = spec.get_mut("replicatedJobs").and_then(Value::as_array_mut);
        jobs.into_iter()
            .flatten()
            .filter_map(|j| object_at(j, &["template", "spec", "template"]))
            .collect()
    }

    fn status_fields(&self) -> &'static [&'static str] {
        &["conditions", "terminalState"]
    }

    fn finished(&self, status: Option<&Value>) -> bool {
        status
            .and_then(|s| text(s, "terminalState"))
            .is_some_and(|t| t == "Completed" || t == "Failed")
            || condition_true(status, &["Completed", "Failed"])
    }
}

/// The pods one Job of a replicated job runs at once: `parallelism` (default 1), at most
/// `completions` when set (an Indexed Job runs min(parallelism, completions); a NonIndexed one
/// never more active pods than completions either).
fn pods_per_job(job_spec: &Value, set: &str) -> Result<u64, InvalidJob> {
    let parallelism = count(job_spec, "parallelism", 1, set)?;
    Ok(match job_spec.get("completions") {
        None | Some(Value::Null) => parallelism,
        Some(_) => parallelism.min(count(job_spec, "completions", 1, set)?),
    })
}

/// A JobSet that a TrainJob controls, whose pod templates carry the link Trainer's PodGroup
/// plugins write: Trainer made its PodGroup.
fn trainer_makes_the_pod_group(meta: &ObjectIdentity, sets: &[PodSet]) -> bool {
    let by_trainjob = meta.controller().is_some_and(|o| {
        o.kind == "TrainJob" && o.api_version.starts_with("trainer.kubeflow.org/")
    });
    by_trainjob
        && sets.iter().any(|s| {
            let m = s.template.metadata.as_ref();
            let has = |map: Option<&std::collections::BTreeMap<String, String>>| {
                map.is_some_and(|m| TRAINER_LINKS.iter().any(|k| m.contains_key(*k)))
            };
            has(m.and_then(|m| m.labels.as_ref())) || has(m.and_then(|m| m.annotations.as_ref()))
        })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::gang::{Priorities, compute};
    use crate::job::normalize;
    use crate::resources::AdmissionDefaults;
    use crate::workload::{InvalidJob, Job};

    use super::*;

    fn rjob(name: &str, replicas: Value, job_spec: Value) -> Value {
        let mut spec = job_spec;
        spec["template"] = json!({"spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": "1"}}}]}});
        json!({"name": name, "replicas": replicas, "template": {"spec": spec}})
    }

    fn jobset(spec: Value, meta: Value) -> Result<Job, InvalidJob> {
        let mut m = json!({"name": "js", "namespace": "n", "uid": "u"});
        if let (Some(m), Some(extra)) = (m.as_object_mut(), meta.as_object()) {
            m.extend(extra.clone());
        }
        normalize(&JOBSET, &json!({"metadata": m, "spec": spec}))
    }

    fn gang(job: &Job) -> (u32, Vec<(String, u64, bool)>) {
        let g = compute(job, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        let sets = job
            .shape
            .pod_sets
            .iter()
            .map(|s| (s.name.clone(), s.count, s.in_gang))
            .collect();
        (g.min_member, sets)
    }

    #[test]
    fn rule_11_each_replicated_job_counts_replicas_times_its_pods() {
        let j = jobset(
            json!({"replicatedJobs": [
                rjob("driver", json!(1), json!({})),
                rjob("workers", json!(2), json!({"parallelism": 4, "completions": 4, "completionMode": "Indexed"})),
                // Indexed: min(parallelism, completions).
                rjob("eval", json!(3), json!({"parallelism": 5, "completions": 2, "completionMode": "Indexed"})),
                // NonIndexed without completions: parallelism.
                rjob("loader", json!(null), json!({"parallelism": 2})),
            ]}),
            json!({}),
        )
        .unwrap();
        assert_eq!(
            gang(&j),
            (
                1 + 8 + 6 + 2,
                vec![
                    ("driver".into(), 1, true),
                    ("workers".into(), 8, true),
                    ("eval".into(), 6, true),
                    ("loader".into(), 2, true),
                ]
            )
        );
        assert_eq!(j.shape.rule, MinMemberRule::SumOfPodSets);
        assert!(!j.suspended() && !j.managed_elsewhere() && !j.finished);
    }

    #[test]
    fn rule_11_in_order_startup_gangs_only_what_starts_together() {
        let jobs = json!([
            rjob("ps", json!(1), json!({"parallelism": 2})),
            rjob("workers", json!(2), json!({"parallelism": 4})),
        ]);
        let in_order = jobset(
            json!({"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": jobs}),
            json!({}),
        )
        .unwrap();
        // The workers are created only once the ps pods are ready: a gang of all ten would
        // wait for pods that never come.
        assert_eq!(
            gang(&in_order),
            (
                2,
                vec![("ps".into(), 2, true), ("workers".into(), 8, false)]
            )
        );
        let any_order = jobset(
            json!({"startupPolicy": {"startupPolicyOrder": "AnyOrder"}, "replicatedJobs": jobs}),
            json!({}),
        )
        .unwrap();
        assert_eq!(gang(&any_order).0, 10);
        let depends = jobset(
            json!({"replicatedJobs": [
                rjob("init", json!(1), json!({})),
                {"dependsOn": [{"name": "init", "status": "Complete"}],
                 "name": "train", "replicas": 2,
                 "template": rjob("x", json!(1), json!({"parallelism": 3}))["template"]},
            ]}),
            json!({}),
        )
        .unwrap();
        assert_eq!(
            gang(&depends),
            (
                1,
                vec![("init".into(), 1, true), ("train".into(), 6, false)]
            )
        );
    }

    #[test]
    fn rule_11_lifecycle_suspend_managed_by_and_terminal_state() {
        let jobs = json!([rjob("w", json!(1), json!({}))]);
        let suspended =
            jobset(json!({"suspend": true, "replicatedJobs": jobs}), json!({})).unwrap();
        assert!(suspended.suspended());
        let multikueue = jobset(
            json!({"managedBy": "kueue.x-k8s.io/multikueue", "replicatedJobs": jobs}),
            json!({}),
        )
        .unwrap();
        assert!(multikueue.managed_elsewhere());
        let own = jobset(
            json!({"managedBy": "jobset.sigs.k8s.io/jobset-controller", "replicatedJobs": jobs}),
            json!({}),
        )
        .unwrap();
        assert!(!own.managed_elsewhere());
        for (status, done) in [
            (json!({"terminalState": "Completed"}), true),
            (json!({"terminalState": "Failed"}), true),
            (
                json!({"conditions": [{"type": "Completed", "status": "True"}]}),
                true,
            ),
            (json!({"restarts": 2}), false),
        ] {
            assert_eq!(JobSetRules.finished(Some(&status)), done, "{status}");
        }
    }

    #[test]
    fn rule_11_a_trainjob_whose_runtime_makes_the_pod_group_is_left_to_trainer() {
        let owned = json!({"ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob", "name": "js", "uid": "t", "controller": true}]});
        let mut linked = rjob("node", json!(1), json!({"parallelism": 2}));
        linked["template"]["spec"]["template"]["metadata"] =
            json!({"labels": {"scheduling.x-k8s.io/pod-group": "js"}});
        let by_trainer =
            jobset(json!({"replicatedJobs": [linked.clone()]}), owned.clone()).unwrap();
        assert!(by_trainer.managed_elsewhere());
        assert_eq!(
            by_trainer.shape.managed_by.as_deref(),
            Some(TRAINER_PODGROUP_POLICY)
        );
        // Without a PodGroup policy the TrainJob's JobSet is an ordinary gang.
        let plain = jobset(
            json!({"replicatedJobs": [rjob("node", json!(1), json!({"parallelism": 2}))]}),
            owned,
        )
        .unwrap();
        assert!(!plain.managed_elsewhere());
        // A user's own link on a JobSet nobody controls is a link, not Trainer's policy.
        let users = jobset(json!({"replicatedJobs": [linked]}), json!({})).unwrap();
        assert!(!users.managed_elsewhere());
    }

    #[test]
    fn bad_jobsets_are_invalid_never_a_panic() {
        let template = rjob("w", json!(1), json!({}))["template"].clone();
        for (spec, reason) in [
            (json!({}), "NoReplicaSpecs"),
            (json!({"replicatedJobs": []}), "NoReplicaSpecs"),
            (json!({"replicatedJobs": "x"}), "Malformed"),
            (
                json!({"replicatedJobs": [{"replicas": 1, "template": template}]}),
                "Malformed",
            ),
            (
                json!({"replicatedJobs": [{"name": "w", "replicas": -1, "template": template}]}),
                "InvalidReplicas",
            ),
            (
                json!({"replicatedJobs": [{"name": "w", "template": {"spec": {}}}]}),
                "MissingTemplate",
            ),
            (
                json!({"replicatedJobs": [{"name": "w", "template": template}, {"name": "w", "template": template}]}),
                "DuplicateReplicaType",
            ),
        ] {
            assert_eq!(
                jobset(spec.clone(), json!({})).unwrap_err().reason(),
                reason,
                "{spec}"
            );
        }
    }
}
