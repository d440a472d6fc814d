//! JAXJob (training-operator, `kubeflow.org/v1`): Workers only, nil replicas ⇒ 1.

use super::kubeflow::{JOB_NAME_LABEL, Kubeflow, ReplicaRules, TRAINING_OPERATOR};
use crate::workload::JobKind;

pub const JAXJOB: JobKind = JobKind {
    kind: "JAXJob",
    group: "kubeflow.org",
    version: "v1",
    plural: "jaxjobs",
    replica_specs_field: "jaxReplicaSpecs",
    replica_types: &["Worker"],
    default_manager: TRAINING_OPERATOR,
    pod_label: JOB_NAME_LABEL,
    rules: &Kubeflow(&Jax),
};

/// Σ Worker replicas (SPEC §3.1.5): the trait's defaults.
pub struct Jax;

impl ReplicaRules for Jax {}
