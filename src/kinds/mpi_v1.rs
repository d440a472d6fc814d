//! training-operator's MPIJob (`kubeflow.org/v1`): the launcher is a plain pod that counts like
//! any replica; nil Worker replicas ⇒ 0.

use serde_json::Value;

use super::kubeflow::{
    JOB_NAME_LABEL, Kubeflow, ReplicaRules, TRAINING_OPERATOR, require_launcher,
};
use crate::workload::{InvalidJob, JobKind, MinMemberRule, PodSet};

pub const MPIJOB_V1: JobKind = JobKind {
    kind: "MPIJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "mpijobs",
    replica_specs_field: "mpiReplicaSpecs",
    replica_types: &["Launcher", "Worker"],
    default_manager: TRAINING_OPERATOR,
    pod_label: JOB_NAME_LABEL,
    rules: &Kubeflow(&MpiV1),
};

/// Σ Launcher + Worker replicas (SPEC §3.1.5).
pub struct MpiV1;

impl ReplicaRules for MpiV1 {
    fn default_replicas(&self, replica_type: &str) -> u64 {
        if replica_type == "Worker" { 0 } else { 1 }
    }

    fn shape(
        &self,
        _spec: &Value,
        sets: &mut [PodSet],
        _warnings: &mut Vec<String>,
    ) -> Result<MinMemberRule, InvalidJob> {
        require_launcher(sets)?;
        Ok(MinMemberRule::SumOfReplicas)
    }

    fn needs_every_pod(&self) -> bool {
        true
    }
}
