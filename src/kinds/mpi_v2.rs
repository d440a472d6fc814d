//! mpi-operator's MPIJob (`kubeflow.org/v2beta1`): the launcher is a batch/v1 Job running one
//! pod, and may be created only after the workers are ready (SPEC §3.1.4).

use serde_json::Value;

use super::kubeflow::{JOB_NAME_LABEL, Kubeflow, ReplicaRules, require_launcher};
use crate::workload::{InvalidJob, JobKind, MinMemberRule, PodSet};

pub const MPIJOB_V2BETA1: JobKind = JobKind {
    kind: "MPIJob",
    group: "kubeflow.org",
    version: "v2beta1",
    plural: "mpijobs",
    replica_specs_field: "mpiReplicaSpecs",
    replica_types: &["Launcher", "Worker"],
    default_manager: "kubeflow.org/mpi-operator",
    pod_label: JOB_NAME_LABEL,
    rules: &Kubeflow(&MpiV2),
};

/// Workers + 1 launcher; with `WaitForWorkersReady` the workers only.
pub struct MpiV2;

impl ReplicaRules for MpiV2 {
    fn default_replicas(&self, replica_type: &str) -> u64 {
        if replica_type == "Worker" { 0 } else { 1 }
    }

    fn shape(
        &self,
        spec: &Value,
        sets: &mut [PodSet],
        _warnings: &mut Vec<String>,
    ) -> Result<MinMemberRule, InvalidJob> {
        require_launcher(sets)?;
        let waits = spec.get("launcherCreationPolicy").and_then(Value::as_str)
            == Some("WaitForWorkersReady");
        for set in sets.iter_mut().filter(|s| s.name == "Launcher") {
            // mpi-operator runs exactly one launcher, which appears only after the workers run
            // under WaitForWorkersReady: counting it then deadlocks the gang.
            set.count = 1;
            set.in_gang = !waits;
        }
        Ok(if waits {
            MinMemberRule::MpiWorkersOnly
        } else {
            MinMemberRule::MpiWorkersPlusLauncher
        })
    }

    fn needs_every_pod(&self) -> bool {
        true
    }
}
