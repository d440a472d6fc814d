//! PaddleJob (training-operator, `kubeflow.org/v1`): Master and Worker, optionally elastic —
//! its operator defaults `elasticPolicy` exactly as PyTorchJob's.

use serde_json::Value;

use super::{JobKind, KindFields, KindRules, TRAINING_OPERATOR};
use crate::gang::MinMemberRule;
use crate::job::{InvalidJob, Job, Replica};

pub const PADDLEJOB: JobKind = JobKind {
    kind: "PaddleJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "paddlejobs",
    replica_specs_field: "paddleReplicaSpecs",
    replica_types: &["Master", "Worker"],
    default_manager: TRAINING_OPERATOR,
    rules: &Paddle,
};

/// Elastic jobs gang on `elasticPolicy.minReplicas` workers (SPEC §3.1.3).
pub struct Paddle;

impl KindRules for Paddle {
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
