//! PaddleJob (training-operator, `kubeflow.org/v1`): Master and Worker, optionally elastic —
//! its operator defaults `elasticPolicy` exactly as PyTorchJob's.

use super::{ElasticRules, JobKind, TRAINING_OPERATOR};

pub const PADDLEJOB: JobKind = JobKind {
    kind: "PaddleJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "paddlejobs",
    replica_specs_field: "paddleReplicaSpecs",
    replica_types: &["Master", "Worker"],
    default_manager: TRAINING_OPERATOR,
    rules: &ElasticRules,
};
