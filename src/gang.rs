//! Step 2 of the pipeline: a normalised [`Job`] → its [`Gang`]: minMember, the pods that make up
//! minResources, and the reasoning (pure; SPEC §3.1 and §3.2).

use std::collections::BTreeMap;

use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::quantity::Quantity;
use crate::resources::{AdmissionDefaults, ResourceMap, add_into, effective_pod_request, scale};
use crate::topology::Topology;
pub use crate::workload::MinMemberRule;
use crate::workload::{InvalidJob, Job, PodSet};

/// The largest minMember a PodGroup can carry (`int32`).
const MAX_MIN_MEMBER: u64 = i32::MAX as u64;

/// PriorityClass values by name, and the `globalDefault` one.
#[derive(Debug, Clone, Default)]
pub struct Priorities {
    pub values: BTreeMap<String, i32>,
    pub global_default: Option<i32>,
    /// Only some classes are known (`explain` offline): a class not among them is unknown,
    /// not missing.
    pub offline: bool,
}

impl Priorities {
    pub fn from_classes<'a>(classes: impl IntoIterator<Item = &'a PriorityClass>) -> Self {
        let mut p = Priorities::default();
        let mut defaults: Vec<(&str, i32)> = Vec::new();
        for pc in classes {
            let name = pc.metadata.name.as_deref().unwrap_or_default();
            p.values.insert(name.to_string(), pc.value);
            if pc.global_default == Some(true) {
                defaults.push((name, pc.value));
            }
        }
        // Admission uses the lowest-valued global default if several exist; be deterministic.
        p.global_default = defaults.iter().map(|(_, v)| *v).min();
        p
    }

    /// Whether a PriorityClass of this name exists.
    pub fn contains(&self, class: &str) -> bool {
        self.values.contains_key(class)
    }

    /// The priority a pod with this `priorityClassName` gets at admission.
    fn resolve(&self, class: Option<&str>) -> Resolved {
        match class.filter(|c| !c.is_empty()) {
            Some(c) => match self.values.get(c) {
                Some(v) => Resolved::Class(*v),
                None => Resolved::UnknownClass,
            },
            None => match self.global_default {
                Some(v) => Resolved::GlobalDefault(v),
                None => Resolved::Zero,
            },
        }
    }
}

enum Resolved {
    Class(i32),
    GlobalDefault(i32),
    Zero,
    UnknownClass,
}

/// One replica type's place in the gang.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The pod set's name.
    pub name: String,
    /// Pods of this type that exist in the gang.
    pub replicas: u64,
    /// Pods of this type counted towards minMember / minResources.
    pub counted: u64,
    pub priority: i32,
    pub priority_class_name: Option<String>,
    /// The effective request of one pod.
    pub pod_request: ResourceMap,
    /// `volcano.sh/task-spec` of the template, if any.
    pub task_spec: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MinResources {
    /// `schedulingPolicy.minResources`, passed through verbatim.
    FromPolicy(BTreeMap<String, K8sQuantity>),
    /// Σ counted pods × per-pod effective request.
    Computed(ResourceMap),
}

impl MinResources {
    /// The serialised map, entries sorted by name, zero entries omitted for computed values.
    pub fn to_k8s(&self) -> BTreeMap<String, K8sQuantity> {
        match self {
            MinResources::FromPolicy(m) => m.clone(),
            MinResources::Computed(m) => m
                .iter()
                .filter(|(_, q)| !q.is_zero())
                .map(|(k, q)| (k.clone(), q.to_k8s()))
                .collect(),
        }
    }
}

/// The gang of one job: everything a backend needs to build its PodGroup.
#[derive(Debug, Clone, PartialEq)]
pub struct Gang {
    pub min_member: u32,
    pub rule: MinMemberRule,
    /// Replica types in the order pods are counted (priority, then the tie order).
    pub members: Vec<Member>,
    pub min_resources: MinResources,
    /// Things worth a Warning Event that do not stop the PodGroup.
    pub warnings: Vec<String>,
    /// What the job asks of the placement of its pods (SPEC §13).
    pub topology: Topology,
}

impl Gang {
    /// The PriorityClass of the highest-priority replica type that names one.
    pub fn highest_priority_class(&self) -> Option<&str> {
        self.members
            .iter()
            .find_map(|m| m.priority_class_name.as_deref().filter(|c| !c.is_empty()))
    }
}

/// Deterministic order among Kubeflow replica types of equal priority (SPEC §3.2.2); the pod
/// sets of other kinds keep their order in the object (the head of a RayCluster first).
fn tie_rank(replica_type: &str) -> usize {
    const ORDER: [&str; 6] = ["Master", "Chief", "Launcher", "PS", "Worker", "Evaluator"];
    ORDER
        .iter()
        .position(|t| *t == replica_type)
        .unwrap_or(ORDER.len())
}

/// Computes the gang of a job (SPEC §3.1, §3.2).
pub fn compute(
    job: &Job,
    priorities: &Priorities,
    defaults: &AdmissionDefaults,
) -> Result<Gang, InvalidJob> {
    let mut warnings = Vec::new();
    // The pods that can belong to the gang, per replica type.
    let candidates: Vec<(&PodSet, u64)> = job
        .shape
        .pod_sets
        .iter()
        .filter(|s| s.in_gang)
        .map(|s| (s, s.count))
        .collect();
    let (min_member, rule) = min_member(job, &candidates, &mut warnings)?;

    // Order replica types by priority, highest first; ties broken deterministically.
    let mut members = candidates
        .into_iter()
        .map(|(r, count)| member(r, count, priorities, defaults, &mut warnings))
        .collect::<Result<Vec<_>, _>>()?;
    // Members keep the kind's order of pod sets so far: a stable sort leaves equal ones so.
    let kubeflow = job.kind.is_kubeflow();
    members.sort_by(|a, b| {
        let ties = if kubeflow {
            tie_rank(&a.name)
                .cmp(&tie_rank(&b.name))
                .then(a.name.cmp(&b.name))
        } else {
            std::cmp::Ordering::Equal
        };
        b.priority.cmp(&a.priority).then(ties)
    });
    let computed = count_in_order(&mut members, min_member)?;
    let min_resources = match job.shape.hints.min_resources.as_ref() {
        Some(given) => {
            for (name, q) in given {
                Quantity::parse_non_negative(q).map_err(|e| {
                    InvalidJob::InvalidResources(format!(
                        "schedulingPolicy.minResources[{name}]: {e}"
                    ))
                })?;
            }
            MinResources::FromPolicy(given.clone())
        }
        None => MinResources::Computed(computed),
    };
    Ok(Gang {
        min_member: min_member as u32,
        rule,
        members,
        min_resources,
        warnings,
        topology: crate::topology::read(job)?,
    })
}

/// minMember and the rule that set it (SPEC §3.1.2–§3.1.6, §11), from the pods that belong to
/// the gang per pod set.
fn min_member(
    job: &Job,
    candidates: &[(&PodSet, u64)],
    warnings: &mut Vec<String>,
) -> Result<(u64, MinMemberRule), InvalidJob> {
    let total: u128 = candidates.iter().map(|(_, n)| *n as u128).sum();
    if total == 0 {
        return Err(InvalidJob::ZeroReplicas);
    }
    if total > MAX_MIN_MEMBER as u128 {
        return Err(InvalidJob::TooManyReplicas(total));
    }
    let total = total as u64;
    let (min_member, rule) = match job.shape.hints.min_available {
        Some(m) if m < 1 => return Err(InvalidJob::MinAvailableTooSmall(m)),
        Some(m) if m as u64 > total => {
            return Err(InvalidJob::MinAvailableAboveTotal {
                min_available: m as u64,
                total,
            });
        }
        Some(m) => (m as u64, MinMemberRule::MinAvailable),
        None => {
            warnings.extend(job.shape.rule_warnings.iter().cloned());
            (minimum_pods(candidates, warnings), job.shape.rule)
        }
    };
    if min_member == 0 {
        return Err(InvalidJob::ZeroReplicas);
    }
    if rule == MinMemberRule::MinAvailable && min_member < total && job.kind.rules.needs_every_pod()
    {
        warnings.push(format!(
            "schedulingPolicy.minAvailable {min_member} is below the {total} pods of this MPIJob: mpirun waits for every worker unless the application is elastic"
        ));
    }
    Ok((min_member, rule))
}

/// Σ over the pod sets of the gang of their minimum (all their pods without one); a minimum above
/// the set's pods counts the pods, with a warning.
fn minimum_pods(candidates: &[(&PodSet, u64)], warnings: &mut Vec<String>) -> u64 {
    let mut sum = 0;
    for (set, count) in candidates {
        sum += match set.minimum {
            Some((min, field)) if min > *count => {
                warnings.push(format!(
                    "{field} {min} is above the {count} {} replicas; the gang counts {count}",
                    set.name
                ));
                *count
            }
            Some((min, _)) => min,
            None => *count,
        };
    }
    sum
}

/// One replica type's place in the gang: its priority and the request of one pod.
fn member(
    r: &PodSet,
    count: u64,
    priorities: &Priorities,
    defaults: &AdmissionDefaults,
    warnings: &mut Vec<String>,
) -> Result<Member, InvalidJob> {
    let spec = r
        .template
        .spec
        .as_ref()
        .expect("normalize guarantees a pod spec");
    let class = spec.priority_class_name.as_deref();
    let priority = match priorities.resolve(class) {
        Resolved::Class(v) | Resolved::GlobalDefault(v) => v,
        Resolved::Zero => 0,
        Resolved::UnknownClass if priorities.offline => {
            warnings.push(format!(
                "replica type {}: PriorityClass {:?} is unknown offline; counted as priority 0 (give the class with another -f, or use --kubeconfig)",
                r.name,
                class.unwrap_or_default()
            ));
            0
        }
        Resolved::UnknownClass => {
            warnings.push(format!(
                "replica type {}: PriorityClass {:?} does not exist; counted as priority 0 (its pods will be rejected at admission)",
                r.name,
                class.unwrap_or_default()
            ));
            0
        }
    };
    let pod_request = effective_pod_request(spec, defaults)
        .map_err(|e| InvalidJob::InvalidResources(format!("replica type {}: {e}", r.name)))?;
    let task_spec = r
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get("volcano.sh/task-spec"))
        .cloned();
    Ok(Member {
        name: r.name.clone(),
        replicas: count,
        counted: 0,
        priority,
        priority_class_name: class.map(str::to_string),
        pod_request,
        task_spec,
    })
}

/// Takes pods in the members' order until minMember pods are counted (SPEC §3.2.3); the sum of
/// their requests, zero entries omitted.
fn count_in_order(members: &mut [Member], min_member: u64) -> Result<ResourceMap, InvalidJob> {
    let mut remaining = min_member;
    let mut computed = ResourceMap::new();
    for m in members {
        m.counted = m.replicas.min(remaining);
        remaining -= m.counted;
        if m.counted > 0 {
            let part = scale(&m.pod_request, m.counted)
                .map_err(|e| InvalidJob::InvalidResources(e.to_string()))?;
            add_into(&mut computed, &part)
                .map_err(|e| InvalidJob::InvalidResources(e.to_string()))?;
        }
    }
    computed.retain(|_, q| !q.is_zero());
    Ok(computed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{
        JAXJOB, JobKind, MPIJOB_V1, MPIJOB_V2BETA1, PADDLEJOB, PYTORCHJOB, TFJOB, XGBOOSTJOB,
        normalize,
    };
    use serde_json::{Value, json};

    fn container(requests: Value, limits: Value) -> Value {
        json!({"name": "c", "image": "i", "resources": {"requests": requests, "limits": limits}})
    }

    fn template(containers: Value) -> Value {
        json!({"spec": {"containers": containers}})
    }

    fn with_class(class: &str, containers: Value) -> Value {
        json!({"spec": {"priorityClassName": class, "containers": containers}})
    }

    fn job(kind: &'static JobKind, spec: Value) -> Job {
        normalize(
            kind,
            &json!({"metadata": {"name": "j", "namespace": "n", "uid": "u"}, "spec": spec}),
        )
        .unwrap()
    }

    fn gang_of(kind: &'static JobKind, spec: Value) -> Gang {
        compute(
            &job(kind, spec),
            &Priorities::default(),
            &AdmissionDefaults::default(),
        )
        .unwrap()
    }

    fn resources(g: &Gang) -> Vec<(String, String)> {
        g.min_resources
            .to_k8s()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect()
    }

    fn cpu(n: &str) -> Value {
        template(json!([container(json!({"cpu": n}), json!({}))]))
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn rule_3_1_2_min_available_overrides_and_is_validated() {
        let spec = |m: i64| {
            json!({"runPolicy": {"schedulingPolicy": {"minAvailable": m}},
                "pytorchReplicaSpecs": {"Master": {"template": cpu("1")}, "Worker": {"replicas": 3, "template": cpu("1")}}})
        };
        let g = gang_of(&PYTORCHJOB, spec(2));
        assert_eq!((g.min_member, g.rule), (2, MinMemberRule::MinAvailable));
        let err = |m| {
            compute(
                &job(&PYTORCHJOB, spec(m)),
                &Priorities::default(),
                &AdmissionDefaults::default(),
            )
            .unwrap_err()
        };
        assert_eq!(err(0), InvalidJob::MinAvailableTooSmall(0));
        assert_eq!(
            err(5),
            InvalidJob::MinAvailableAboveTotal {
                min_available: 5,
                total: 4
            }
        );
    }

    #[test]
    fn rule_3_1_3_elastic_pytorch_counts_min_replicas() {
        let g = gang_of(
            &PYTORCHJOB,
            json!({"elasticPolicy": {"minReplicas": 2, "maxReplicas": 8},
                "pytorchReplicaSpecs": {"Master": {"template": cpu("1")}, "Worker": {"replicas": 6, "template": cpu("2")}}}),
        );
        assert_eq!(
            (g.min_member, g.rule),
            (3, MinMemberRule::ElasticMinReplicas)
        );
        // The master and two workers make minResources.
        assert_eq!(resources(&g), pairs(&[("cpu", "5")]));
    }

    #[test]
    fn rule_3_1_3_elastic_paddle_counts_min_replicas_like_pytorch() {
        let spec = |ep: Value| {
            json!({"elasticPolicy": ep,
                "paddleReplicaSpecs": {"Master": {"template": cpu("1")}, "Worker": {"replicas": 4, "template": cpu("2")}}})
        };
        let g = gang_of(
            &PADDLEJOB,
            spec(json!({"minReplicas": 2, "maxReplicas": 4})),
        );
        assert_eq!(
            (g.min_member, g.rule),
            (3, MinMemberRule::ElasticMinReplicas)
        );
        assert_eq!(resources(&g), pairs(&[("cpu", "5")]));
        // Only max set: min = max (the operator's defaulting).
        let g = gang_of(&PADDLEJOB, spec(json!({"maxReplicas": 3})));
        assert_eq!(g.min_member, 4);
        // Not elastic: every pod counts.
        let g = gang_of(
            &PADDLEJOB,
            json!({"paddleReplicaSpecs": {"Master": {"template": cpu("1")}, "Worker": {"replicas": 4, "template": cpu("2")}}}),
        );
        assert_eq!((g.min_member, g.rule), (5, MinMemberRule::SumOfReplicas));
        assert_eq!(resources(&g), pairs(&[("cpu", "9")]));
    }

    #[test]
    fn rule_3_1_5_xgboost_and_jax_sum_their_replicas_nil_meaning_one() {
        let g = gang_of(
            &XGBOOSTJOB,
            json!({"xgbReplicaSpecs": {"Master": {"template": cpu("1")}, "Worker": {"replicas": 3, "template": cpu("500m")}}}),
        );
        assert_eq!((g.min_member, g.rule), (4, MinMemberRule::SumOfReplicas));
        assert_eq!(resources(&g), pairs(&[("cpu", "2500m")]));
        let g = gang_of(
            &XGBOOSTJOB,
            json!({"xgbReplicaSpecs": {"master": {"template": cpu("1")}, "worker": {"template": cpu("1")}}}),
        );
        assert_eq!(g.min_member, 2, "nil replicas ⇒ 1 for both types");
        let g = gang_of(
            &JAXJOB,
            json!({"jaxReplicaSpecs": {"Worker": {"replicas": 8, "template": cpu("4")}}}),
        );
        assert_eq!((g.min_member, g.rule), (8, MinMemberRule::SumOfReplicas));
        assert_eq!(resources(&g), pairs(&[("cpu", "32")]));
        let g = gang_of(
            &JAXJOB,
            json!({"jaxReplicaSpecs": {"Worker": {"template": cpu("4")}}}),
        );
        assert_eq!(g.min_member, 1, "nil replicas ⇒ 1");
    }

    #[test]
    fn rule_3_1_4_mpi_workers_plus_launcher() {
        let g = gang_of(
            &MPIJOB_V2BETA1,
            json!({"mpiReplicaSpecs": {"Launcher": {"template": cpu("1")}, "Worker": {"replicas": 4, "template": cpu("2")}}}),
        );
        assert_eq!(
            (g.min_member, g.rule),
            (5, MinMemberRule::MpiWorkersPlusLauncher)
        );
        assert_eq!(resources(&g), pairs(&[("cpu", "9")]));
    }

    #[test]
    fn rule_3_1_4_mpi_wait_for_workers_ready_leaves_the_launcher_out() {
        let g = gang_of(
            &MPIJOB_V2BETA1,
            json!({"launcherCreationPolicy": "WaitForWorkersReady",
                "mpiReplicaSpecs": {"Launcher": {"template": cpu("1")}, "Worker": {"replicas": 4, "template": cpu("2")}}}),
        );
        assert_eq!((g.min_member, g.rule), (4, MinMemberRule::MpiWorkersOnly));
        assert_eq!(resources(&g), pairs(&[("cpu", "8")]));
        assert!(g.members.iter().all(|m| m.name == "Worker"));
    }

    #[test]
    fn rule_3_1_4_run_launcher_as_worker_without_workers_is_a_gang_of_one() {
        let g = gang_of(
            &MPIJOB_V2BETA1,
            json!({"runLauncherAsWorker": true, "mpiReplicaSpecs": {"Launcher": {"template": cpu("3")}}}),
        );
        assert_eq!(g.min_member, 1);
        assert_eq!(resources(&g), pairs(&[("cpu", "3")]));
    }

    #[test]
    fn rule_3_1_5_sum_of_replicas_includes_tf_evaluator_and_mpi_v1_launcher() {
        let g = gang_of(
            &TFJOB,
            json!({"tfReplicaSpecs": {"PS": {"replicas": 2, "template": cpu("1")}, "Worker": {"replicas": 3, "template": cpu("1")},
                "Chief": {"template": cpu("1")}, "Evaluator": {"template": cpu("1")}}}),
        );
        assert_eq!((g.min_member, g.rule), (7, MinMemberRule::SumOfReplicas));
        assert_eq!(resources(&g), pairs(&[("cpu", "7")]));
        let g = gang_of(
            &MPIJOB_V1,
            json!({"mpiReplicaSpecs": {"Launcher": {"template": cpu("1")}, "Worker": {"replicas": 2, "template": cpu("1")}}}),
        );
        assert_eq!((g.min_member, g.rule), (3, MinMemberRule::SumOfReplicas));
    }

    #[test]
    fn rule_3_1_6_zero_replicas_is_invalid() {
        let j = job(
            &TFJOB,
            json!({"tfReplicaSpecs": {"Worker": {"replicas": 0, "template": cpu("1")}}}),
        );
        assert_eq!(
            compute(&j, &Priorities::default(), &AdmissionDefaults::default()).unwrap_err(),
            InvalidJob::ZeroReplicas
        );
    }

    #[test]
    fn rule_3_1_6_more_pods_than_int32_is_invalid_not_a_panic() {
        let j = job(
            &PYTORCHJOB,
            json!({"pytorchReplicaSpecs": {"Master": {"template": cpu("1")}, "Worker": {"replicas": 2147483647u64, "template": cpu("1")}}}),
        );
        assert_eq!(
            compute(&j, &Priorities::default(), &AdmissionDefaults::default())
                .unwrap_err()
                .reason(),
            "TooManyReplicas"
        );
        // Exactly 2^31-1 pods still fits, and the arithmetic does not overflow.
        let j = job(
            &PYTORCHJOB,
            json!({"pytorchReplicaSpecs": {"Worker": {"replicas": 2147483647u64, "template": cpu("64")}}}),
        );
        let g = compute(&j, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        assert_eq!(resources(&g), pairs(&[("cpu", "137438953408")]));
    }

    #[test]
    fn rule_3_2_1_init_containers_larger_than_containers() {
        let g = gang_of(
            &TFJOB,
            json!({"tfReplicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": {
                "initContainers": [container(json!({"cpu": "4", "memory": "1Gi"}), json!({}))],
                "containers": [container(json!({"cpu": "1", "memory": "4Gi"}), json!({}))]}}}}}),
        );
        assert_eq!(resources(&g), pairs(&[("cpu", "8"), ("memory", "8Gi")]));
    }

    #[test]
    fn rule_3_2_1_native_sidecars_add_to_containers() {
        let sidecar = json!({"name": "s", "image": "i", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}});
        let g = gang_of(
            &TFJOB,
            json!({"tfReplicaSpecs": {"Worker": {"template": {"spec": {
                "initContainers": [sidecar],
                "containers": [container(json!({"cpu": "1"}), json!({}))]}}}}}),
        );
        assert_eq!(resources(&g), pairs(&[("cpu", "1500m")]));
    }

    #[test]
    fn rule_3_2_1_pod_overhead_is_added() {
        let g = gang_of(
            &TFJOB,
            json!({"tfReplicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": {
                "overhead": {"cpu": "250m", "memory": "64Mi"},
                "containers": [container(json!({"cpu": "1", "memory": "1Gi"}), json!({}))]}}}}}),
        );
        assert_eq!(
            resources(&g),
            pairs(&[("cpu", "2500m"), ("memory", "2176Mi")])
        );
    }

    #[test]
    fn rule_3_2_1_gpus_given_only_as_limits_count() {
        let g = gang_of(
            &PYTORCHJOB,
            json!({"pytorchReplicaSpecs": {"Worker": {"replicas": 4, "template": template(json!([
                container(json!({"cpu": "2"}), json!({"nvidia.com/gpu": 1}))]))}}}),
        );
        assert_eq!(
            resources(&g),
            pairs(&[("cpu", "8"), ("nvidia.com/gpu", "4")])
        );
    }

    #[test]
    fn rule_3_2_1_limit_range_defaults_apply_where_the_template_sets_nothing() {
        let lr: k8s_openapi::api::core::v1::LimitRange = serde_json::from_value(json!({
            "metadata": {"name": "lr"},
            "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "300m"}, "default": {"memory": "512Mi"}}]}
        }))
        .unwrap();
        let defaults = AdmissionDefaults::from_limit_ranges(&[lr]).unwrap();
        let j = job(
            &TFJOB,
            json!({"tfReplicaSpecs": {"Worker": {"replicas": 2, "template": template(json!([{"name": "c", "image": "i"}]))}}}),
        );
        let g = compute(&j, &Priorities::default(), &defaults).unwrap();
        assert_eq!(resources(&g), pairs(&[("cpu", "600m"), ("memory", "1Gi")]));
    }

    fn priorities(classes: &[(&str, i32, bool)]) -> Priorities {
        let pcs: Vec<PriorityClass> = classes
            .iter()
            .map(|(n, v, g)| {
                serde_json::from_value(
                    json!({"metadata": {"name": n}, "value": v, "globalDefault": g}),
                )
                .unwrap()
            })
            .collect();
        Priorities::from_classes(&pcs)
    }

    #[test]
    fn rule_3_2_2_a_worker_that_outranks_the_launcher_is_counted_first() {
        // mpi-operator counted the launcher minMember-1 times here; take pods by priority instead.
        let j = job(
            &MPIJOB_V2BETA1,
            json!({"runPolicy": {"schedulingPolicy": {"minAvailable": 3}},
                "mpiReplicaSpecs": {
                "Launcher": {"template": with_class("low", json!([container(json!({"cpu": "1"}), json!({}))]))},
                "Worker": {"replicas": 4, "template": with_class("high", json!([container(json!({"cpu": "8"}), json!({}))]))}}}),
        );
        let g = compute(
            &j,
            &priorities(&[("low", 10, false), ("high", 1000, false)]),
            &AdmissionDefaults::default(),
        )
        .unwrap();
        assert_eq!(g.members[0].name, "Worker");
        assert_eq!(g.members[0].counted, 3);
        assert_eq!(g.members[1].counted, 0);
        assert_eq!(resources(&g), pairs(&[("cpu", "24")]));
    }

    #[test]
    fn rule_3_2_2_empty_class_takes_the_global_default() {
        let j = job(
            &TFJOB,
            json!({"runPolicy": {"schedulingPolicy": {"minAvailable": 1}},
                "tfReplicaSpecs": {
                "PS": {"template": with_class("batch", json!([container(json!({"cpu": "1"}), json!({}))]))},
                "Worker": {"template": template(json!([container(json!({"cpu": "5"}), json!({}))]))}}}),
        );
        // The Worker has no class: the global default (100) outranks "batch" (50).
        let g = compute(
            &j,
            &priorities(&[("batch", 50, false), ("cluster-default", 100, true)]),
            &AdmissionDefaults::default(),
        )
        .unwrap();
        assert_eq!(resources(&g), pairs(&[("cpu", "5")]));
    }

    #[test]
    fn rule_3_2_2_ties_are_broken_deterministically() {
        let j = job(
            &TFJOB,
            json!({"runPolicy": {"schedulingPolicy": {"minAvailable": 3}},
                "tfReplicaSpecs": {
                "Evaluator": {"template": cpu("100")},
                "Worker": {"replicas": 2, "template": cpu("10")},
                "PS": {"template": cpu("1")},
                "Chief": {"template": cpu("1000")}}}),
        );
        let g = compute(&j, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        let order: Vec<_> = g
            .members
            .iter()
            .map(|m| (m.name.as_str(), m.counted))
            .collect();
        assert_eq!(
            order,
            vec![("Chief", 1), ("PS", 1), ("Worker", 1), ("Evaluator", 0)]
        );
    }

    #[test]
    fn rule_3_2_3_only_the_first_min_member_pods_count_and_zeros_are_omitted() {
        let g = gang_of(
            &PYTORCHJOB,
            json!({"runPolicy": {"schedulingPolicy": {"minAvailable": 2}},
                "pytorchReplicaSpecs": {"Master": {"template": template(json!([container(json!({"cpu": "1", "memory": "0"}), json!({}))]))},
                "Worker": {"replicas": 5, "template": template(json!([container(json!({"cpu": "2", "memory": "0"}), json!({}))]))}}}),
        );
        assert_eq!(resources(&g), pairs(&[("cpu", "3")]));
        assert!(!g.min_resources.to_k8s().contains_key("pods"));
    }

    #[test]
    fn rule_3_2_min_resources_from_policy_pass_through_verbatim() {
        let g = gang_of(
            &TFJOB,
            json!({"runPolicy": {"schedulingPolicy": {"minResources": {"cpu": "1.5", "nvidia.com/gpu": 8}}},
                "tfReplicaSpecs": {"Worker": {"template": cpu("1")}}}),
        );
        assert_eq!(
            resources(&g),
            pairs(&[("cpu", "1.5"), ("nvidia.com/gpu", "8")])
        );
        let bad = job(
            &TFJOB,
            json!({"runPolicy": {"schedulingPolicy": {"minResources": {"cpu": "lots"}}}, "tfReplicaSpecs": {"Worker": {"template": cpu("1")}}}),
        );
        assert_eq!(
            compute(&bad, &Priorities::default(), &AdmissionDefaults::default())
                .unwrap_err()
                .reason(),
            "InvalidResources"
        );
    }

    #[test]
    fn unparseable_quantities_are_invalid_resources() {
        let j = job(
            &TFJOB,
            json!({"tfReplicaSpecs": {"Worker": {"template": cpu("three")}}}),
        );
        let err = compute(&j, &Priorities::default(), &AdmissionDefaults::default()).unwrap_err();
        assert_eq!(err.reason(), "InvalidResources");
        assert!(err.to_string().contains("Worker"), "{err}");
    }

    #[test]
    fn rule_3_2_4_identical_input_gives_byte_identical_output() {
        let spec = json!({"tfReplicaSpecs": {
            "Worker": {"replicas": 3, "template": template(json!([container(json!({"cpu": "1.5", "memory": "1.5Gi"}), json!({"nvidia.com/gpu": "1"}))]))},
            "PS": {"template": cpu("0.25")}}});
        let a =
            serde_json::to_string(&gang_of(&TFJOB, spec.clone()).min_resources.to_k8s()).unwrap();
        for _ in 0..20 {
            assert_eq!(
                serde_json::to_string(&gang_of(&TFJOB, spec.clone()).min_resources.to_k8s())
                    .unwrap(),
                a
            );
        }
        assert_eq!(
            a,
            r#"{"cpu":"4750m","memory":"4608Mi","nvidia.com/gpu":"3"}"#
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn tf_job(types: &[(&str, u64, u32)], min_available: Option<i64>, reversed: bool) -> Job {
            let mut specs = serde_json::Map::new();
            let mut ordered: Vec<_> = types.to_vec();
            if reversed {
                ordered.reverse();
            }
            for (t, n, millis) in ordered {
                specs.insert(
                    t.to_string(),
                    json!({"replicas": n, "template": cpu(&format!("{millis}m"))}),
                );
            }
            let mut spec = json!({"tfReplicaSpecs": specs});
            if let Some(m) = min_available {
                spec["runPolicy"] = json!({"schedulingPolicy": {"minAvailable": m}});
            }
            job(&TFJOB, spec)
        }

        proptest! {
            /// For any TFJob: the counted pods are exactly minMember, taken in priority-and-tie
            /// order; minResources is their sum; the input's key order never changes the output.
            #[test]
            fn counted_pods_make_min_member_and_min_resources(
                ps in 0u64..5, worker in 0u64..50, evaluator in 0u64..3, chief in 0u64..2,
                millis in proptest::collection::vec(1u32..100_000, 4),
                min_available in proptest::option::of(1i64..60),
            ) {
                let types = [("PS", ps, millis[0]), ("Worker", worker, millis[1]), ("Evaluator", evaluator, millis[2]), ("Chief", chief, millis[3])];
                let total = ps + worker + evaluator + chief;
                let j = tf_job(&types, min_available, false);
                let result = compute(&j, &Priorities::default(), &AdmissionDefaults::default());
                match (total, min_available) {
                    (0, _) => prop_assert_eq!(result.unwrap_err(), InvalidJob::ZeroReplicas),
                    (t, Some(m)) if m as u64 > t => prop_assert_eq!(result.unwrap_err().reason(), "MinAvailableAboveTotal"),
                    _ => {
                        let g = result.unwrap();
                        let counted: u64 = g.members.iter().map(|m| m.counted).sum();
                        prop_assert_eq!(counted, g.min_member as u64);
                        prop_assert_eq!(g.min_member as u64, min_available.map_or(total, |m| m as u64));
                        // Counting is greedy in order: only the last counted type may be partial.
                        let partial = g.members.iter().filter(|m| m.counted > 0 && m.counted < m.replicas).count();
                        prop_assert!(partial <= 1);
                        let expected_millis: u64 = g.members.iter().map(|m| {
                            let per = types.iter().find(|t| t.0 == m.name).unwrap().2 as u64;
                            m.counted * per
                        }).sum();
                        let want = if expected_millis == 0 { None } else { Some(Quantity::from_nanos(expected_millis as i128 * 1_000_000, crate::quantity::Format::DecimalSI)) };
                        let got = g.min_resources.to_k8s().get("cpu").map(|q| Quantity::parse_k8s(q).unwrap());
                        prop_assert_eq!(got, want);
                        let reordered = compute(&tf_job(&types, min_available, true), &Priorities::default(), &AdmissionDefaults::default()).unwrap();
                        prop_assert_eq!(
                            serde_json::to_string(&reordered.min_resources.to_k8s()).unwrap(),
                            serde_json::to_string(&g.min_resources.to_k8s()).unwrap()
                        );
                    }
                }
            }
        }
    }
}
