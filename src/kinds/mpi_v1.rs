//! training-operator's MPIJob (`kubeflow.org/v1`): the launcher is a plain pod that counts like
//! any replica; nil Worker replicas ⇒ 0.

use serde_json::Value;

use super::{JobKind, KindFields, KindRules, TRAINING_OPERATOR};
use crate::job::{InvalidJob, Replica};

pub const MPIJOB_V1: JobKind = JobKind {
    kind: "MPIJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "mpijobs",
    replica_specs_field: "mpiReplicaSpecs",
    replica_types: &["Launcher", "Worker"],
    default_manager: TRAINING_OPERATOR,
    rules: &MpiV1,
};

/// Σ Launcher + Worker replicas (SPEC §3.1.5).
pub struct MpiV1;

impl KindRules for MpiV1 {
    fn default_replicas(&self, replica_type: &str) -> u64 {
        if replica_type == "Worker" { 0 } else { 1 }
    }

    fn read_spec(&self, _spec: &Value, replicas: &[Replica]) -> Result<KindFields, InvalidJob> {
        super::require_launcher(replicas)?;
        Ok(KindFields::default())
    }

    fn needs_every_pod(&self) -> bool {
        true
    }
}
