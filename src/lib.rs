//! podgroup-sync: gang-scheduling PodGroups for Kubeflow training jobs.
//!
//! Data flows one way: a watched job → [`job`] (normalised, pure) → [`gang`] (minMember and
//! minResources, pure) → [`backend`] (the desired PodGroup, pure) → [`reconcile`] (apply or
//! delete, the only I/O that writes) → Events and [`metrics`].

pub mod backend;
pub mod controller;
pub mod diff;
pub mod enablement;
pub mod explain;
pub mod gang;
pub mod http;
pub mod job;
pub mod leader;
pub mod metrics;
pub mod quantity;
pub mod reconcile;
pub mod resources;
