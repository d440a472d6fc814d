//! What the Kubeflow training kinds share: replica specs keyed by replica type under
//! `spec.<kind>ReplicaSpecs`, and `spec.runPolicy` (suspend, managedBy, schedulingPolicy). Each
//! kind's file says only how its operator defaults replicas and shapes its gang
//! ([`ReplicaRules`]); reading them into pod sets is done here once (SPEC §3.1.1).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::template::pod_template;
use crate::workload::{
    InvalidJob, JobKind, KindRules, MinMemberRule, ObjectIdentity, PodSet, SchedulingPolicy, Shape,
};
use crate::workload::{index_label, object_at};

/// The label the Kubeflow operators put on every pod they create, naming its job.
pub const JOB_NAME_LABEL: &str = "training.kubeflow.org/job-name";
/// The pod label holding the pod's index within its replica type (every Kubeflow operator).
pub const REPLICA_INDEX_LABEL: &str = "training.kubeflow.org/replica-index";
/// The pod label holding the pod's replica type, lowercase (every Kubeflow operator).
pub const REPLICA_TYPE_LABEL: &str = "training.kubeflow.org/replica-type";

/// The `runPolicy.managedBy` value of training-operator, which serves every v1 kind.
pub const TRAINING_OPERATOR: &str = "kubeflow.org/training-operator";

/// How one Kubeflow operator defaults its jobs and shapes their gang. The defaults are those of
/// a kind whose every replica type counts in full (SPEC §3.1.5).
pub trait ReplicaRules: Send + Sync {
    /// The operator's defaulting of a nil `replicas` (SPEC §3.1.1).
    fn default_replicas(&self, _replica_type: &str) -> u64 {
        1
    }

    /// Reads the kind's own spec fields once the replicas are defaulted: which sets are out of
    /// the gang, which have a minimum, what the operator would refuse to run; returns the rule
    /// minMember follows.
    fn shape(
        &self,
        _spec: &Value,
        _sets: &mut [PodSet],
        _warnings: &mut Vec<String>,
    ) -> Result<MinMemberRule, InvalidJob> {
        Ok(MinMemberRule::SumOfReplicas)
    }

    /// True when every pod must run for any to make progress (mpirun).
    fn needs_every_pod(&self) -> bool {
        false
    }
}

/// A Kubeflow kind: the shared reading, then the kind's [`ReplicaRules`].
pub struct Kubeflow(pub &'static dyn ReplicaRules);

/// `spec.runPolicy`, the fields podgroup-sync reads.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
struct RunPolicy {
    suspend: Option<bool>,
    managed_by: Option<String>,
    scheduling_policy: Option<SchedulingPolicy>,
}

impl KindRules for Kubeflow {
    /// Every Kubeflow operator labels a pod with its replica's index.
    fn indexes_pods(&self) -> bool {
        true
    }

    fn pod_index(&self, _set: &PodSet, labels: &BTreeMap<String, String>) -> Option<u64> {
        index_label(labels, REPLICA_INDEX_LABEL)
    }

    fn read(
        &self,
        kind: &'static JobKind,
        spec: &Value,
        _meta: &ObjectIdentity,
    ) -> Result<Shape, InvalidJob> {
        let run_policy = match spec.get("runPolicy") {
            Some(v) if !v.is_null() => RunPolicy::deserialize(v)
                .map_err(|e| InvalidJob::Malformed(format!("runPolicy: {e}")))?,
            _ => RunPolicy::default(),
        };
        let mut pod_sets = replica_specs(kind, self.0, spec.get(kind.replica_specs_field))?;
        let mut rule_warnings = Vec::new();
        let rule = self.0.shape(spec, &mut pod_sets, &mut rule_warnings)?;
        Ok(Shape {
            pod_sets,
            hints: run_policy.scheduling_policy.unwrap_or_default(),
            suspended: run_policy.suspend.unwrap_or(false),
            managed_by: run_policy.managed_by,
            rule,
            rule_warnings,
            gang_requested: true,
        })
    }

    fn needs_every_pod(&self) -> bool {
        self.0.needs_every_pod()
    }

    fn templates_mut<'a>(
        &self,
        kind: &'static JobKind,
        spec: &'a mut Value,
    ) -> Vec<&'a mut serde_json::Map<String, Value>> {
        let specs = spec
            .get_mut(kind.replica_specs_field)
            .and_then(Value::as_object_mut);
        specs
            .into_iter()
            .flat_map(|m| m.values_mut())
            .filter_map(|r| object_at(r, &["template"]))
            .collect()
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ReplicaSpecIn {
    replicas: Option<Value>,
    template: Option<Value>,
}

/// The replica specs as pod sets in the kind's canonical order, keys canonicalised and nil
/// replicas defaulted (SPEC §3.1.1).
fn replica_specs(
    kind: &'static JobKind,
    rules: &dyn ReplicaRules,
    specs: Option<&Value>,
) -> Result<Vec<PodSet>, InvalidJob> {
    let specs: BTreeMap<String, Option<ReplicaSpecIn>> = match specs {
        None | Some(Value::Null) => {
            return Err(InvalidJob::NoReplicaSpecs(kind.replica_specs_field));
        }
        Some(v) => BTreeMap::<String, Option<ReplicaSpecIn>>::deserialize(v)
            .map_err(|e| InvalidJob::Malformed(format!("{}: {e}", kind.replica_specs_field)))?,
    };
    if specs.is_empty() {
        return Err(InvalidJob::NoReplicaSpecs(kind.replica_specs_field));
    }
    let mut by_type: BTreeMap<&'static str, (String, ReplicaSpecIn)> = BTreeMap::new();
    for (key, spec) in specs {
        let canonical = kind.canonical_type(&key).ok_or_else(|| {
            InvalidJob::UnknownReplicaType(key.clone(), kind.replica_types.join(", "))
        })?;
        if let Some((other, _)) = by_type.get(canonical) {
            return Err(InvalidJob::DuplicateReplicaType(other.clone(), key));
        }
        by_type.insert(canonical, (key, spec.unwrap_or_default()));
    }
    let mut out = Vec::with_capacity(by_type.len());
    for replica_type in kind.replica_types {
        let Some((_, spec)) = by_type.remove(replica_type) else {
            continue;
        };
        let replicas = match spec.replicas {
            None | Some(Value::Null) => rules.default_replicas(replica_type),
            Some(v) => v.as_u64().ok_or_else(|| {
                InvalidJob::InvalidReplicas(replica_type.to_string(), v.to_string())
            })?,
        };
        let template = pod_template(replica_type, spec.template)?;
        out.push(PodSet::whole(*replica_type, replicas, template));
    }
    Ok(out)
}

/// Kinds whose operator runs them elastic with an `elasticPolicy` (PyTorchJob, PaddleJob): the
/// gang is the non-Worker pods plus `elasticPolicy.minReplicas` Workers (SPEC §3.1.3); without
/// an elastic policy, every pod.
pub struct ElasticRules;

impl ReplicaRules for ElasticRules {
    fn shape(
        &self,
        spec: &Value,
        sets: &mut [PodSet],
        warnings: &mut Vec<String>,
    ) -> Result<MinMemberRule, InvalidJob> {
        let Some(min) = elastic_min_replicas(spec, sets)? else {
            return Ok(MinMemberRule::SumOfReplicas);
        };
        match sets.iter_mut().find(|s| s.name == "Worker") {
            Some(workers) => workers.minimum = Some((min, "elasticPolicy.minReplicas")),
            None if min > 0 => warnings.push(format!(
                "elasticPolicy.minReplicas {min} is above the 0 Worker replicas; the gang counts 0"
            )),
            None => {}
        }
        Ok(MinMemberRule::ElasticMinReplicas)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ElasticPolicySpec {
    min_replicas: Option<i64>,
    max_replicas: Option<i64>,
}

/// `elasticPolicy.minReplicas` as the PyTorch and Paddle operators default it: one of min/max
/// set ⇒ both; neither ⇒ both = Worker replicas. `None` without an elastic policy.
fn elastic_min_replicas(spec: &Value, sets: &[PodSet]) -> Result<Option<u64>, InvalidJob> {
    let Some(v) = spec.get("elasticPolicy").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let ep = ElasticPolicySpec::deserialize(v)
        .map_err(|e| InvalidJob::InvalidElasticPolicy(e.to_string()))?;
    let workers = sets
        .iter()
        .find(|r| r.name == "Worker")
        .map_or(0, |r| r.count);
    match ep.min_replicas.or(ep.max_replicas) {
        None => Ok(Some(workers)),
        Some(m) if m < 1 => Err(InvalidJob::InvalidElasticPolicy(format!(
            "minReplicas must be at least 1, got {m}"
        ))),
        Some(m) => Ok(Some(m as u64)),
    }
}

/// An MPIJob needs a launcher: its operator starts nothing without one.
pub fn require_launcher(sets: &[PodSet]) -> Result<(), InvalidJob> {
    if sets.iter().any(|r| r.name == "Launcher") {
        Ok(())
    } else {
        Err(InvalidJob::MissingLauncher)
    }
}
