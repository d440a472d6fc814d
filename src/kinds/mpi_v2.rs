//! mpi-operator's MPIJob (`kubeflow.org/v2beta1`): the launcher is a batch/v1 Job running one
//! pod, and may be created only after the workers are ready (SPEC §3.1.4).

use serde_json::Value;

use super::{JobKind, KindFields, KindRules};
use crate::gang::MinMemberRule;
use crate::job::{InvalidJob, Job, Replica};

pub const MPIJOB_V2BETA1: JobKind = JobKind {
    kind: "MPIJob",
    group: "kubeflow.org",
    version: "v2beta1",
    plural: "mpijobs",
    replica_specs_field: "mpiReplicaSpecs",
    replica_types: &["Launcher", "Worker"],
    default_manager: "kubeflow.org/mpi-operator",
    rules: &MpiV2,
};

/// Workers + 1 launcher; with `WaitForWorkersReady` the workers only.
pub struct MpiV2;

impl KindRules for MpiV2 {
    fn default_replicas(&self, replica_type: &str) -> u64 {
        if replica_type == "Worker" { 0 } else { 1 }
    }

    fn read_spec(&self, spec: &Value, replicas: &[Replica]) -> Result<KindFields, InvalidJob> {
        super::require_launcher(replicas)?;
        Ok(KindFields {
            launcher_waits_for_workers: spec.get("launcherCreationPolicy").and_then(Value::as_str)
                == Some("WaitForWorkersReady"),
            ..KindFields::default()
        })
    }

    fn gang_pods(&self, job: &Job, replica: &Replica) -> Option<u64> {
        match replica.replica_type {
            // The launcher appears only after the workers run: counting it deadlocks the gang.
            "Launcher" if job.launcher_waits_for_workers => None,
            // mpi-operator runs exactly one launcher.
            "Launcher" => Some(1),
            _ => Some(replica.replicas),
        }
    }

    fn min_member(
        &self,
        job: &Job,
        _members: &[(&Replica, u64)],
        total: u64,
        _warnings: &mut Vec<String>,
    ) -> (u64, MinMemberRule) {
        if job.launcher_waits_for_workers {
            (total, MinMemberRule::MpiWorkersOnly)
        } else {
            (total, MinMemberRule::MpiWorkersPlusLauncher)
        }
    }

    fn needs_every_pod(&self) -> bool {
        true
    }
}
