//! podgroup-sync: gang-scheduling PodGroups for Kubeflow training jobs.

pub mod quantity;
pub mod resources;
