//! XGBoostJob (training-operator, `kubeflow.org/v1`): Master and Worker, nil replicas ⇒ 1.

use super::kubeflow::{JOB_NAME_LABEL, Kubeflow, ReplicaRules, TRAINING_OPERATOR};
use crate::workload::JobKind;

pub const XGBOOSTJOB: JobKind = JobKind {
    kind: "XGBoostJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "xgboostjobs",
    replica_specs_field: "xgbReplicaSpecs",
    replica_types: &["Master", "Worker"],
    default_manager: TRAINING_OPERATOR,
    pod_label: JOB_NAME_LABEL,
    rules: &Kubeflow(&XGBoost),
};

/// Σ replicas over Master and Worker (SPEC §3.1.5): the trait's defaults.
pub struct XGBoost;

impl ReplicaRules for XGBoost {}
