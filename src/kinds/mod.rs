//! The kinds podgroup-sync watches: one file per kind, each a [`JobKind`] row (where the kind is
//! served) and a [`KindRules`](crate::workload::KindRules) value that reads its objects into the
//! workload model (SPEC §3.1, §11). Adding a kind is one file and one entry in [`KINDS`].

pub mod batch_job;
mod jax;
pub mod jobset;
pub mod kubeflow;
pub mod lws;
mod mpi_v1;
mod mpi_v2;
mod paddle;
mod pytorch;
pub mod ray;
pub mod template;
mod tensorflow;
mod xgboost;

use crate::workload::JobKind;

pub use batch_job::BATCH_JOB;
pub use jax::JAXJOB;
pub use jobset::JOBSET;
pub use kubeflow::TRAINING_OPERATOR;
pub use lws::LEADERWORKERSET;
pub use mpi_v1::MPIJOB_V1;
pub use mpi_v2::MPIJOB_V2BETA1;
pub use paddle::PADDLEJOB;
pub use pytorch::PYTORCHJOB;
pub use ray::RAYCLUSTER;
pub use tensorflow::TFJOB;
pub use xgboost::XGBOOSTJOB;

/// Every kind podgroup-sync knows, in order of preference when a cluster serves several
/// versions of one kind (only one MPIJob version is served per cluster).
pub const KINDS: &[&JobKind] = &[
    &PYTORCHJOB,
    &TFJOB,
    &MPIJOB_V2BETA1,
    &MPIJOB_V1,
    &XGBOOSTJOB,
    &PADDLEJOB,
    &JAXJOB,
    &JOBSET,
    &RAYCLUSTER,
    &LEADERWORKERSET,
    &BATCH_JOB,
];

/// The kind that matches an object's `apiVersion` and `kind`, if podgroup-sync knows it.
pub fn lookup(api_version: &str, kind: &str) -> Option<&'static JobKind> {
    KINDS
        .iter()
        .copied()
        .find(|k| k.kind == kind && k.api_version() == api_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_one_table_row_with_unique_kind_and_version() {
        let mut seen = std::collections::BTreeSet::new();
        for k in KINDS {
            assert!(seen.insert((k.kind, k.version)), "{k:?} twice");
            assert_eq!(lookup(&k.api_version(), k.kind), Some(*k));
            if k.is_kubeflow() {
                assert!(k.replica_specs_field.ends_with("ReplicaSpecs"), "{k:?}");
                assert!(k.replica_types.contains(&"Worker"), "{k:?}");
            }
        }
    }

    #[test]
    fn replica_types_match_case_insensitively() {
        assert_eq!(XGBOOSTJOB.canonical_type("master"), Some("Master"));
        assert_eq!(JAXJOB.canonical_type("WORKER"), Some("Worker"));
        assert_eq!(JAXJOB.canonical_type("Master"), None);
    }
}
