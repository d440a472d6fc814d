//! TFJob (training-operator, `kubeflow.org/v1`): every replica type counts, Evaluator included.

use super::kubeflow::{JOB_NAME_LABEL, Kubeflow, ReplicaRules, TRAINING_OPERATOR};
use crate::workload::JobKind;

pub const TFJOB: JobKind = JobKind {
    kind: "TFJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "tfjobs",
    replica_specs_field: "tfReplicaSpecs",
    replica_types: &["PS", "Worker", "Chief", "Master", "Evaluator"],
    default_manager: TRAINING_OPERATOR,
    pod_label: JOB_NAME_LABEL,
    rules: &Kubeflow(&TensorFlow),
};

/// Σ replicas over all types (SPEC §3.1.5): the trait's defaults.
pub struct TensorFlow;

impl ReplicaRules for TensorFlow {}
