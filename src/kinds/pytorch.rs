//! PyTorchJob (training-operator, `kubeflow.org/v1`): Master and Worker, optionally elastic.

use serde_json::Value;

use super::{JobKind, KindFields, KindRules, TRAINING_OPERATOR};
use crate::gang::MinMemberRule;
use crate::job::{InvalidJob, Job, Replica};

pub const PYTORCHJOB: JobKind = JobKind {
    kind: "PyTorchJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "pytorchjobs",
    replica_specs_field: "pytorchReplicaSpecs",
    replica_types: &["Master", "Worker"],
    default_manager: TRAINING_OPERATOR,
    rules: &PyTorch,
};

/// Elastic jobs gang on `elasticPolicy.minReplicas` workers (SPEC §3.1.3).
pub struct PyTorch;

impl KindRules for PyTorch {
    fn read_spec(&self, spec: &Value, replicas: &[Replica]) -> Result<KindFields, InvalidJob> {
        Ok(KindFields {
            elastic_min_replicas: super::elastic_min_replicas(spec, replicas)?,
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
        super::elastic_min_member(job, members, total, warnings)
    }
}
