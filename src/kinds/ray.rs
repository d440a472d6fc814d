//! KubeRay's RayCluster (`ray.io/v1`, SPEC §11): the head and every worker group that is not
//! suspended. A worker group counts `minReplicas` × `numOfHosts` pods when `minReplicas` > 0 —
//! so the autoscaler moving `replicas` between the minimum and the maximum changes nothing —
//! else `replicas` × `numOfHosts`. Pods above a group's count still join the PodGroup (the
//! webhook links every pod of the cluster); they are not part of minMember.
//!
//! A RayJob runs on a RayCluster it creates and controls (`status.rayClusterName`): that
//! RayCluster gets the gang like any other, its submitter (a batch/v1 Job of the RayJob) is
//! outside it, and suspending the RayJob deletes the RayCluster and so the PodGroup. A RayJob
//! needs nothing of its own.

use serde_json::Value;

use super::template::{count, flag, pod_template, text};
use crate::workload::object_at;
use crate::workload::{
    InvalidJob, JobKind, KindRules, MinMemberRule, ObjectIdentity, PodSet, SchedulingPolicy, Shape,
};

pub const RAYCLUSTER: JobKind = JobKind {
    kind: "RayCluster",
    group: "ray.io",
    version: "v1",
    plural: "rayclusters",
    replica_specs_field: "",
    replica_types: &[],
    default_manager: "ray.io/kuberay-operator",
    pod_label: RAY_CLUSTER_LABEL,
    rules: &RayClusterRules,
};

/// The label KubeRay puts on every pod of a RayCluster, naming it.
pub const RAY_CLUSTER_LABEL: &str = "ray.io/cluster";
/// The label naming a pod's group (`headgroup` for the head).
pub const RAY_GROUP_LABEL: &str = "ray.io/group";
/// The pod set of the head: KubeRay's group label value for it.
pub const HEAD: &str = "headgroup";

pub struct RayClusterRules;

impl KindRules for RayClusterRules {
    fn read(
        &self,
        _kind: &'static JobKind,
        spec: &Value,
        _meta: &ObjectIdentity,
    ) -> Result<Shape, InvalidJob> {
        let head = spec
            .get("headGroupSpec")
            .filter(|h| !h.is_null())
            .ok_or(InvalidJob::NoReplicaSpecs("headGroupSpec"))?;
        let mut pod_sets = vec![PodSet::whole(
            HEAD,
            1,
            pod_template(HEAD, head.get("template").cloned())?,
        )];
        let groups = match spec.get("workerGroupSpecs") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(g)) => &g[..],
            Some(other) => {
                return Err(InvalidJob::Malformed(format!(
                    "workerGroupSpecs: expected a list, got {other}"
                )));
            }
        };
        for (i, group) in groups.iter().enumerate() {
            let name = text(group, "groupName")
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    InvalidJob::Malformed(format!("workerGroupSpecs[{i}] has no groupName"))
                })?;
            if pod_sets.iter().any(|s: &PodSet| s.name == name) {
                return Err(InvalidJob::DuplicateReplicaType(name.into(), name.into()));
            }
            let min = count(group, "minReplicas", 0, name)?;
            let replicas = count(group, "replicas", 0, name)?;
            let hosts = count(group, "numOfHosts", 1, name)?;
            let per_host = if min > 0 { min } else { replicas };
            let pods = per_host
                .checked_mul(hosts)
                .ok_or(InvalidJob::TooManyReplicas(
                    per_host as u128 * hosts as u128,
                ))?;
            let mut set = PodSet::whole(
                name,
                pods,
                pod_template(name, group.get("template").cloned())?,
            );
            // A suspended worker group runs no pods.
            set.in_gang = !flag(group, "suspend");
            pod_sets.push(set);
        }
        Ok(Shape {
            pod_sets,
            hints: SchedulingPolicy::default(),
            suspended: flag(spec, "suspend"),
            managed_by: text(spec, "managedBy").map(str::to_string),
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
        let Some(spec) = spec.as_object_mut() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (field, v) in spec.iter_mut() {
            match field.as_str() {
                "headGroupSpec" => out.extend(object_at(v, &["template"])),
                "workerGroupSpecs" => out.extend(
                    v.as_array_mut()
                        .into_iter()
                        .flatten()
                        .filter_map(|g| object_at(g, &["template"])),
                ),
                _ => {}
            }
        }
        out
    }

    fn status_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// A RayCluster runs until it is deleted (a RayJob deletes its own when done).
    fn finished(&self, _status: Option<&Value>) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::gang::{Priorities, compute};
    use crate::job::normalize;
    use crate::resources::AdmissionDefaults;
    use crate::workload::Job;

    use super::*;

    fn template(cpu: &str) -> Value {
        json!({"spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": cpu}}}]}})
    }

    fn cluster(workers: Value) -> Job {
        normalize(
            &RAYCLUSTER,
            &json!({"metadata": {"name": "rc", "namespace": "n", "uid": "u"},
                "spec": {"headGroupSpec": {"template": template("1")}, "workerGroupSpecs": workers}}),
        )
        .unwrap()
    }

    fn min_member_and_cpu(job: &Job) -> (u32, String) {
        let g = compute(job, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        (g.min_member, g.min_resources.to_k8s()["cpu"].0.clone())
    }

    #[test]
    fn rule_11_head_plus_each_groups_minimum_times_its_hosts() {
        let rc = cluster(json!([
            {"groupName": "gpu", "replicas": 3, "minReplicas": 2, "maxReplicas": 5,
             "numOfHosts": 2, "template": template("4")},
            // minReplicas 0: the replicas.
            {"groupName": "cpu", "replicas": 3, "minReplicas": 0, "template": template("2")},
            // A suspended group runs no pods.
            {"groupName": "idle", "replicas": 4, "minReplicas": 4, "suspend": true,
             "template": template("8")},
        ]));
        // 1 head + 2×2 gpu + 3 cpu.
        assert_eq!(min_member_and_cpu(&rc), (8, "23".into()));
        assert!(!rc.in_gang("idle"));
        assert_eq!(rc.shape.pod_sets[0].name, HEAD);
    }

    #[test]
    fn rule_11_the_autoscaler_moving_replicas_above_the_minimum_changes_nothing() {
        let at = |replicas: u64| {
            min_member_and_cpu(&cluster(json!([
                {"groupName": "gpu", "replicas": replicas, "minReplicas": 2, "maxReplicas": 8,
                 "template": template("4")}
            ])))
        };
        assert_eq!(at(2), at(7));
        assert_eq!(at(2), (3, "9".into()));
    }

    #[test]
    fn rule_11_a_head_alone_is_a_gang_of_one_and_suspend_is_read() {
        let head_only = cluster(json!(null));
        assert_eq!(min_member_and_cpu(&head_only).0, 1);
        let suspended = normalize(
            &RAYCLUSTER,
            &json!({"metadata": {"name": "rc"}, "spec": {"suspend": true,
                "headGroupSpec": {"template": template("1")}}}),
        )
        .unwrap();
        assert!(suspended.suspended());
        let bad = normalize(
            &RAYCLUSTER,
            &json!({"metadata": {"name": "rc"}, "spec": {}}),
        );
        assert_eq!(bad.unwrap_err().reason(), "NoReplicaSpecs");
    }
}
