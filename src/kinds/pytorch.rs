//! PyTorchJob (training-operator, `kubeflow.org/v1`): Master and Worker, optionally elastic.

use super::kubeflow::{ElasticRules, JOB_NAME_LABEL, Kubeflow, TRAINING_OPERATOR};
use crate::workload::JobKind;

pub const PYTORCHJOB: JobKind = JobKind {
    kind: "PyTorchJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "pytorchjobs",
    replica_specs_field: "pytorchReplicaSpecs",
    replica_types: &["Master", "Worker"],
    default_manager: TRAINING_OPERATOR,
    pod_label: JOB_NAME_LABEL,
    rules: &Kubeflow(&ElasticRules),
};
