//! PaddleJob (training-operator, `kubeflow.org/v1`): Master and Worker, optionally elastic —
//! its operator defaults `elasticPolicy` exactly as PyTorchJob's.

use super::kubeflow::{ElasticRules, JOB_NAME_LABEL, Kubeflow, TRAINING_OPERATOR};
use crate::workload::JobKind;

pub const PADDLEJOB: JobKind = JobKind {
    kind: "PaddleJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "paddlejobs",
    replica_specs_field: "paddleReplicaSpecs",
    replica_types: &["Master", "Worker"],
    default_manager: TRAINING_OPERATOR,
    pod_label: JOB_NAME_LABEL,
    rules: &Kubeflow(&ElasticRules),
};
