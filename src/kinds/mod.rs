//! The job kinds podgroup-sync watches: one file per kind, each a [`JobKind`] row (where the kind
//! is served and where its replica specs live) and a [`KindRules`] value (how its operator
//! defaults it and how its gang is shaped, SPEC §3.1). Adding a kind is one file and one entry
//! in [`KINDS`].

mod jax;
mod mpi_v1;
mod mpi_v2;
mod paddle;
mod pytorch;
mod tensorflow;
mod xgboost;

use serde::Deserialize;
use serde_json::Value;

use crate::gang::MinMemberRule;
use crate::job::{InvalidJob, Job, Replica};

pub use jax::JAXJOB;
pub use mpi_v1::MPIJOB_V1;
pub use mpi_v2::MPIJOB_V2BETA1;
pub use paddle::PADDLEJOB;
pub use pytorch::PYTORCHJOB;
pub use tensorflow::TFJOB;
pub use xgboost::XGBOOSTJOB;

/// The `runPolicy.managedBy` value of training-operator, which serves every v1 kind.
pub const TRAINING_OPERATOR: &str = "kubeflow.org/training-operator";

/// Every kind podgroup-sync knows, in order of preference when a cluster serves several
/// versions of one kind (only one MPIJob version is served per cluster).
pub const KINDS: &[&JobKind] = &[
    &PYTORCHJOB,
    &TFJOB,
    &MPIJOB_V2BETA1,
    &MPIJOB_V1,
    &XGBOOSTJOB,
    &PADDLEJOB,
    &JAXJOB,
];

/// One Kubeflow job kind and version that podgroup-sync can watch.
pub struct JobKind {
    pub kind: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    /// The `spec` field holding the replica specs.
    pub replica_specs_field: &'static str,
    /// Canonical replica-type names; keys are matched case-insensitively against these.
    pub replica_types: &'static [&'static str],
    /// The `runPolicy.managedBy` value of the operator that serves this kind.
    pub default_manager: &'static str,
    /// How the kind is defaulted and how its gang is shaped.
    pub rules: &'static dyn KindRules,
}

impl PartialEq for JobKind {
    fn eq(&self, other: &Self) -> bool {
        (self.group, self.version, self.kind) == (other.group, other.version, other.kind)
    }
}

impl Eq for JobKind {}

impl std::fmt::Debug for JobKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.api_version(), self.kind)
    }
}

impl JobKind {
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// The kind as a dynamic API resource.
    pub fn api_resource(&self) -> kube::discovery::ApiResource {
        kube::discovery::ApiResource {
            group: self.group.into(),
            version: self.version.into(),
            api_version: self.api_version(),
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }

    /// The kind that matches an object's `apiVersion` and `kind`, if podgroup-sync knows it.
    pub fn lookup(api_version: &str, kind: &str) -> Option<&'static JobKind> {
        KINDS
            .iter()
            .copied()
            .find(|k| k.kind == kind && k.api_version() == api_version)
    }

    /// The canonical name of a replica-type key, matched case-insensitively.
    pub fn canonical_type(&self, key: &str) -> Option<&'static str> {
        self.replica_types
            .iter()
            .copied()
            .find(|t| t.eq_ignore_ascii_case(key))
    }
}

/// What a kind reads from its spec beyond the replica specs and the run policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindFields {
    /// `elasticPolicy.minReplicas` after the operator's defaulting, when an elastic policy is set.
    pub elastic_min_replicas: Option<u64>,
    /// MPIJob v2beta1 `launcherCreationPolicy: WaitForWorkersReady`.
    pub launcher_waits_for_workers: bool,
}

/// How one kind's operator defaults its jobs and how the gang of one is shaped. The defaults
/// are those of a kind whose every replica type counts in full (SPEC §3.1.5).
pub trait KindRules: Send + Sync {
    /// The operator's defaulting of a nil `replicas` (SPEC §3.1.1).
    fn default_replicas(&self, _replica_type: &str) -> u64 {
        1
    }

    /// Reads the kind's own spec fields once the replicas are defaulted, and checks what the
    /// operator would refuse to run.
    fn read_spec(&self, _spec: &Value, _replicas: &[Replica]) -> Result<KindFields, InvalidJob> {
        Ok(KindFields::default())
    }

    /// How many pods of a replica type belong to the gang; `None` leaves the type out.
    fn gang_pods(&self, _job: &Job, replica: &Replica) -> Option<u64> {
        Some(replica.replicas)
    }

    /// minMember when `schedulingPolicy.minAvailable` is unset, from the pods that belong to
    /// the gang per replica type (`members`) and their sum (`total`).
    fn min_member(
        &self,
        _job: &Job,
        _members: &[(&Replica, u64)],
        total: u64,
        _warnings: &mut Vec<String>,
    ) -> (u64, MinMemberRule) {
        (total, MinMemberRule::SumOfReplicas)
    }

    /// True when every pod must run for any to make progress (mpirun), so a minAvailable below
    /// the total is worth a warning.
    fn needs_every_pod(&self) -> bool {
        false
    }
}

/// Kinds whose operator runs them elastic with an `elasticPolicy` (PyTorchJob, PaddleJob): the
/// gang is the non-Worker pods plus `elasticPolicy.minReplicas` Workers (SPEC §3.1.3); without
/// an elastic policy, every pod.
pub struct ElasticRules;

impl KindRules for ElasticRules {
    fn read_spec(&self, spec: &Value, replicas: &[Replica]) -> Result<KindFields, InvalidJob> {
        Ok(KindFields {
            elastic_min_replicas: elastic_min_replicas(spec, replicas)?,
            ..KindFields::default()
        })
    }

    fn min_member(
        &self,
        job: &Job,
        members: &[(&Replica, u64)],
        total: u64,
        warnings: &mut Vec<String>,
    ) -> (u64, MinMemberRule) {
        elastic_min_member(job, members, total, warnings)
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
fn elastic_min_replicas(spec: &Value, replicas: &[Replica]) -> Result<Option<u64>, InvalidJob> {
    let Some(v) = spec.get("elasticPolicy").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let ep = ElasticPolicySpec::deserialize(v)
        .map_err(|e| InvalidJob::InvalidElasticPolicy(e.to_string()))?;
    let workers = replicas
        .iter()
        .find(|r| r.replica_type == "Worker")
        .map_or(0, |r| r.replicas);
    match ep.min_replicas.or(ep.max_replicas) {
        None => Ok(Some(workers)),
        Some(m) if m < 1 => Err(InvalidJob::InvalidElasticPolicy(format!(
            "minReplicas must be at least 1, got {m}"
        ))),
        Some(m) => Ok(Some(m as u64)),
    }
}

/// SPEC §3.1.3: Σ non-Worker pods + `elasticPolicy.minReplicas` (capped at the Worker replicas,
/// with a warning); the plain sum without an elastic policy.
fn elastic_min_member(
    job: &Job,
    members: &[(&Replica, u64)],
    total: u64,
    warnings: &mut Vec<String>,
) -> (u64, MinMemberRule) {
    let Some(mut min) = job.elastic_min_replicas else {
        return (total, MinMemberRule::SumOfReplicas);
    };
    let workers = job.replica("Worker").map_or(0, |r| r.replicas);
    let others: u64 = members
        .iter()
        .filter(|(r, _)| r.replica_type != "Worker")
        .map(|(_, n)| n)
        .sum();
    if min > workers {
        warnings.push(format!(
            "elasticPolicy.minReplicas {min} is above the {workers} Worker replicas; the gang counts {workers}"
        ));
        min = workers;
    }
    (others + min, MinMemberRule::ElasticMinReplicas)
}

/// An MPIJob needs a launcher: its operator starts nothing without one.
fn require_launcher(replicas: &[Replica]) -> Result<(), InvalidJob> {
    if replicas.iter().any(|r| r.replica_type == "Launcher") {
        Ok(())
    } else {
        Err(InvalidJob::MissingLauncher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_one_table_row_with_unique_kind_and_version() {
        let mut seen = std::collections::BTreeSet::new();
        for k in KINDS {
            assert!(seen.insert((k.kind, k.version)), "{k:?} twice");
            assert_eq!(JobKind::lookup(&k.api_version(), k.kind), Some(*k));
            assert!(k.replica_specs_field.ends_with("ReplicaSpecs"), "{k:?}");
            assert!(k.replica_types.contains(&"Worker"), "{k:?}");
        }
    }

    #[test]
    fn replica_types_match_case_insensitively() {
        assert_eq!(XGBOOSTJOB.canonical_type("master"), Some("Master"));
        assert_eq!(JAXJOB.canonical_type("WORKER"), Some("Worker"));
        assert_eq!(JAXJOB.canonical_type("Master"), None);
    }
}
