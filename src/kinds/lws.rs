//! LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`, SPEC §11): one gang per group — the leader
//! and its `size − 1` workers — so one LeaderWorkerSet of N groups has N PodGroups,
//! `<lws>-<group index>`, each of the same pod sets.
//!
//! **Which groups exist.** The LWS controller runs a leader StatefulSet of `spec.replicas` pods
//! (`<lws>-<i>`), and during a rolling update of `spec.replicas + maxSurge` (the surge rounded
//! up from a percentage, at most `replicas`); `status.replicas` counts the leaders created. The
//! groups are the larger of the two: a surge group gets its PodGroup before its pods come, and a
//! group being scaled away keeps its PodGroup until its leader is gone.
//!
//! **What can start together.** Under `startupPolicy: LeaderReady` the workers are created only
//! once the leader is ready: a gang of leader and workers would wait for pods that come only
//! after the gang runs. So the leader is then outside the gang (scheduled alone) and the gang is
//! the workers. A group of one pod (`size: 1`) is no gang at all: such an LWS gets no PodGroup.
//!
//! **Pods.** The leader pods carry `leaderworkerset.sigs.k8s.io/name` and `worker-index: "0"`
//! from the leader StatefulSet's template, the workers `name` and `group-index` from their
//! group's StatefulSet. A leader's `group-index` label is added by LWS's own pod webhook, which
//! may run after podgroup-sync's, so the webhook takes a leader's group from its name.

use serde_json::Value;

use super::template::{count, pod_template, text};
use crate::workload::object_at;
use crate::workload::{
    InvalidJob, JobKind, KindRules, MinMemberRule, ObjectIdentity, PodSet, SchedulingPolicy, Shape,
    condition_true,
};

pub const LEADERWORKERSET: JobKind = JobKind {
    kind: "LeaderWorkerSet",
    group: "leaderworkerset.x-k8s.io",
    version: "v1",
    plural: "leaderworkersets",
    replica_specs_field: "",
    replica_types: &[],
    default_manager: "",
    pod_label: LWS_NAME_LABEL,
    rules: &LeaderWorkerSetRules,
};

/// The label the LWS controller puts on every pod of a LeaderWorkerSet, naming it.
pub const LWS_NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
/// The label naming a pod's group (on the workers from their StatefulSet's template).
pub const GROUP_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/group-index";
/// The label of a pod's index in its group: `"0"` on every leader pod, from its template.
pub const WORKER_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/worker-index";
/// The pod sets.
pub const LEADER: &str = "leader";
pub const WORKER: &str = "worker";

pub struct LeaderWorkerSetRules;

impl KindRules for LeaderWorkerSetRules {
    fn read(
        &self,
        _kind: &'static JobKind,
        spec: &Value,
        _meta: &ObjectIdentity,
    ) -> Result<Shape, InvalidJob> {
        let lwt = spec
            .get("leaderWorkerTemplate")
            .filter(|t| !t.is_null())
            .ok_or(InvalidJob::NoReplicaSpecs("leaderWorkerTemplate"))?;
        let size = count(lwt, "size", 1, "leaderWorkerTemplate")?;
        if size == 0 {
            return Err(InvalidJob::InvalidReplicas(
                "leaderWorkerTemplate size".into(),
                "0".into(),
            ));
        }
        let worker = pod_template(WORKER, lwt.get("workerTemplate").cloned())?;
        let leader = match lwt.get("leaderTemplate") {
            None | Some(Value::Null) => worker.clone(),
            Some(t) => pod_template(LEADER, Some(t.clone()))?,
        };
        let leader_ready = text(spec, "startupPolicy") == Some("LeaderReady");
        let mut leader = PodSet::whole(LEADER, 1, leader);
        // Workers are created only once the leader is ready: the leader cannot wait for them.
        leader.in_gang = !leader_ready;
        Ok(Shape {
            pod_sets: vec![leader, PodSet::whole(WORKER, size - 1, worker)],
            hints: SchedulingPolicy::default(),
            suspended: false,
            managed_by: None,
            rule: MinMemberRule::SumOfPodSets,
            rule_warnings: Vec::new(),
            // A group of one pod is no gang.
            gang_requested: size > 1,
        })
    }

    /// A LeaderWorkerSet serves until it is deleted.
    fn finished(&self, _status: Option<&Value>) -> bool {
        false
    }

    fn templates_mut<'a>(
        &self,
        _kind: &'static JobKind,
        spec: &'a mut Value,
    ) -> Vec<&'a mut serde_json::Map<String, Value>> {
        let Some(lwt) = spec
            .get_mut("leaderWorkerTemplate")
            .and_then(Value::as_object_mut)
        else {
            return Vec::new();
        };
        lwt.iter_mut()
            .filter(|(k, _)| *k == "leaderTemplate" || *k == "workerTemplate")
            .filter_map(|(_, v)| object_at(v, &[]))
            .collect()
    }

    fn status_fields(&self) -> &'static [&'static str] {
        &["conditions", "replicas"]
    }

    fn groups(&self, spec: &Value, status: Option<&Value>) -> Result<Option<u32>, InvalidJob> {
        let replicas = count(spec, "replicas", 1, "LeaderWorkerSet")?;
        let surge = if condition_true(status, &["UpdateInProgress"]) {
            let config = spec
                .get("rolloutStrategy")
                .and_then(|r| r.get("rollingUpdateConfiguration"));
            let max_surge = config.and_then(|c| c.get("maxSurge"));
            scaled(max_surge, replicas)?.min(replicas)
        } else {
            0
        };
        let created = status
            .and_then(|s| s.get("replicas"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let groups = (replicas + surge).max(created);
        u32::try_from(groups)
            .map(Some)
            .map_err(|_| InvalidJob::TooManyReplicas(groups as u128))
    }
}

/// An int-or-percent of `total`, a percentage rounded up (as the LWS controller scales
/// `maxSurge`); absent is 0.
fn scaled(value: Option<&Value>, total: u64) -> Result<u64, InvalidJob> {
    let bad =
        |v: &Value| InvalidJob::Malformed(format!("maxSurge: {v} is not a count or a percentage"));
    match value {
        None | Some(Value::Null) => Ok(0),
        Some(v @ Value::Number(_)) => v.as_u64().ok_or_else(|| bad(v)),
        Some(v @ Value::String(s)) => {
            let percent: u64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| bad(v))?;
            Ok((total * percent).div_ceil(100))
        }
        Some(v) => Err(bad(v)),
    }
}

/// The group a pod of a LeaderWorkerSet belongs to: its `group-index` label, else — a leader
/// pod before LWS's own webhook labelled it — the ordinal its StatefulSet put at the end of its
/// name (`<lws>-<i>`).
pub fn group_of(
    labels: Option<&std::collections::BTreeMap<String, String>>,
    pod_name: Option<&str>,
) -> Option<u32> {
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    if let Some(i) = label(GROUP_INDEX_LABEL) {
        return i.parse().ok();
    }
    let lws = label(LWS_NAME_LABEL)?;
    if label(WORKER_INDEX_LABEL) != Some("0") {
        return None;
    }
    pod_name?.strip_prefix(lws)?.strip_prefix('-')?.parse().ok()
}

/// The pod set of a pod of a LeaderWorkerSet: the leader carries `worker-index: "0"` (from its
/// template), a worker anything else or nothing yet.
pub fn pod_set_of(labels: Option<&std::collections::BTreeMap<String, String>>) -> &'static str {
    match labels
        .and_then(|l| l.get(WORKER_INDEX_LABEL))
        .map(String::as_str)
    {
        Some("0") => LEADER,
        _ => WORKER,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use crate::gang::{Priorities, compute};
    use crate::job::normalize;
    use crate::resources::AdmissionDefaults;
    use crate::workload::{InvalidJob, Job};

    use super::*;

    fn pod(cpu: &str) -> Value {
        json!({"spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": cpu}}}]}})
    }

    fn lws(spec: Value, status: Value) -> Result<Job, InvalidJob> {
        normalize(
            &LEADERWORKERSET,
            &json!({"metadata": {"name": "serve", "namespace": "n", "uid": "u"},
                "spec": spec, "status": status}),
        )
    }

    fn spec(replicas: u64, size: u64) -> Value {
        json!({"replicas": replicas, "leaderWorkerTemplate": {"size": size,
            "leaderTemplate": pod("2"), "workerTemplate": pod("1")}})
    }

    fn gang(job: &Job) -> (u32, String) {
        let g = compute(job, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        (g.min_member, g.min_resources.to_k8s()["cpu"].0.clone())
    }

    #[test]
    fn rule_11_lws_one_gang_per_group_of_leader_and_workers() {
        let job = lws(spec(3, 4), json!({})).unwrap();
        assert_eq!(job.groups, Some(3));
        assert_eq!(gang(&job), (4, "5".into()), "leader 2 cpu + 3 workers of 1");
        let sets: Vec<_> = job
            .shape
            .pod_sets
            .iter()
            .map(|s| (s.name.as_str(), s.count, s.in_gang))
            .collect();
        assert_eq!(sets, [(LEADER, 1, true), (WORKER, 3, true)]);
    }

    #[test]
    fn rule_11_lws_defaults_one_group_of_one_pod_and_the_leader_template_to_the_workers() {
        let job = lws(
            json!({"leaderWorkerTemplate": {"size": 2, "workerTemplate": pod("1")}}),
            json!({}),
        )
        .unwrap();
        assert_eq!(job.groups, Some(1), "replicas defaults to 1");
        assert_eq!(
            gang(&job),
            (2, "2".into()),
            "the leader uses the worker template"
        );
        let single = lws(
            json!({"leaderWorkerTemplate": {"workerTemplate": pod("1")}}),
            json!({}),
        );
        assert!(
            !single.unwrap().shape.gang_requested,
            "size defaults to 1: a group of one pod is no gang"
        );
    }

    #[test]
    fn rule_11_lws_leader_ready_keeps_the_leader_out_of_the_gang() {
        let mut s = spec(2, 4);
        s["startupPolicy"] = json!("LeaderReady");
        let job = lws(s, json!({})).unwrap();
        assert!(!job.in_gang(LEADER));
        assert_eq!(gang(&job), (3, "3".into()), "the 3 workers alone");
    }

    #[test]
    fn rule_11_lws_groups_follow_scale_and_the_rolling_update_surge() {
        let updating = |created: u64| {
            json!({"replicas": created,
                "conditions": [{"type": "UpdateInProgress", "status": "True"}]})
        };
        let with_surge = |surge: Value| {
            let mut s = spec(4, 2);
            s["rolloutStrategy"] =
                json!({"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxSurge": surge}});
            s
        };
        let groups = |s: Value, st: Value| lws(s, st).unwrap().groups.unwrap();
        assert_eq!(
            groups(with_surge(json!(1)), json!({"replicas": 4})),
            4,
            "no update"
        );
        assert_eq!(
            groups(with_surge(json!(1)), updating(4)),
            5,
            "surge group ahead of its pods"
        );
        assert_eq!(
            groups(with_surge(json!(1)), updating(5)),
            5,
            "not counted twice"
        );
        assert_eq!(
            groups(with_surge(json!("25%")), updating(4)),
            5,
            "25% of 4 = 1"
        );
        assert_eq!(
            groups(with_surge(json!("30%")), updating(4)),
            6,
            "30% of 4 rounds up to 2"
        );
        assert_eq!(
            groups(with_surge(json!(9)), updating(4)),
            8,
            "at most replicas"
        );
        assert_eq!(
            groups(spec(2, 2), json!({"replicas": 4})),
            4,
            "scaling down from 4"
        );
        assert_eq!(groups(spec(0, 2), json!({})), 0);
        let bad = lws(with_surge(json!("lots")), updating(4)).unwrap_err();
        assert_eq!(bad.reason(), "Malformed");
    }

    #[test]
    fn rule_11_lws_bad_input_is_an_invalid_job() {
        for (s, reason) in [
            (json!({}), "NoReplicaSpecs"),
            (
                json!({"leaderWorkerTemplate": {"size": 2}}),
                "MissingTemplate",
            ),
            (
                json!({"leaderWorkerTemplate": {"size": 0, "workerTemplate": pod("1")}}),
                "InvalidReplicas",
            ),
            (
                json!({"replicas": -1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": pod("1")}}),
                "InvalidReplicas",
            ),
        ] {
            assert_eq!(
                lws(s.clone(), json!({})).unwrap_err().reason(),
                reason,
                "{s}"
            );
        }
    }

    #[test]
    fn rule_11_lws_a_pods_group_from_its_label_or_its_leaders_name() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let worker = labels(&[(LWS_NAME_LABEL, "serve"), (GROUP_INDEX_LABEL, "2")]);
        assert_eq!(group_of(Some(&worker), Some("serve-2-1")), Some(2));
        assert_eq!(pod_set_of(Some(&worker)), WORKER);
        let leader = labels(&[(LWS_NAME_LABEL, "serve"), (WORKER_INDEX_LABEL, "0")]);
        assert_eq!(group_of(Some(&leader), Some("serve-7")), Some(7));
        assert_eq!(pod_set_of(Some(&leader)), LEADER);
        assert_eq!(group_of(Some(&leader), Some("other-7")), None);
        assert_eq!(group_of(Some(&leader), Some("serve-x")), None);
        assert_eq!(group_of(Some(&leader), None), None);
        let unknown = labels(&[(LWS_NAME_LABEL, "serve")]);
        assert_eq!(group_of(Some(&unknown), Some("serve-1-1")), None);
    }
}
