//! PyTorchJob (training-operator, `kubeflow.org/v1`): Master and Worker, optionally elastic.

use super::{ElasticRules, JobKind, TRAINING_OPERATOR};

pub const PYTORCHJOB: JobKind = JobKind {
    kind: "PyTorchJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "pytorchjobs",
    replica_specs_field: "pytorchReplicaSpecs",
    replica_types: &["Master", "Worker"],
    default_manager: TRAINING_OPERATOR,
    rules: &ElasticRules,
};
