//! podgroup-sync: gang-scheduling PodGroups for Kubeflow training jobs.
//!
//! Data flows one way: a watched job → [`job`] (normalised, pure) → [`gang`] (minMember and
//! minResources, pure) → [`backend`] (the desired PodGroup, pure) → [`reconcile`] (apply or
//! delete, the only I/O that writes) → Events and [`metrics`].

pub mod backend;
pub mod diff;
pub mod enablement;
pub mod gang;
pub mod job;
pub mod quantity;
pub mod resources;
pub mod controller;
pub mod explain;
pub mod http;
pub mod metrics;
pub mod reconcile;
