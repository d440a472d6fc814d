//! XGBoostJob (training-operator, `kubeflow.org/v1`): Master and Worker, nil replicas ⇒ 1.

use super::{JobKind, KindRules, TRAINING_OPERATOR};

pub const XGBOOSTJOB: JobKind = JobKind {
    kind: "XGBoostJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "xgboostjobs",
    replica_specs_field: "xgbReplicaSpecs",
    replica_types: &["Master", "Worker"],
    default_manager: TRAINING_OPERATOR,
    rules: &XGBoost,
};

/// Σ replicas over Master and Worker (SPEC §3.1.5): the trait's defaults.
pub struct XGBoost;

impl KindRules for XGBoost {}
