//! podgroup-sync: gang-scheduling PodGroups for Kubeflow training jobs.
//!
//! Data flows one way: a watched job → [`job`] (normalised, pure) → [`gang`] (minMember and
//! minResources, pure) → [`backend`] (the desired PodGroup, pure) → [`reconcile`] (apply or
//! delete, the only I/O that writes) → [`events`] and [`metrics`]. [`watch`] feeds the caches and
//! the reconcile queue so that nothing is lost across a fault; [`liveness`] says when a cache is
//! not fresh.

pub mod backend;
pub mod caches;
pub mod controller;
pub mod diff;
pub mod discovery;
pub mod enablement;
pub mod events;
pub mod explain;
pub mod gang;
pub mod http;
pub mod job;
pub mod kinds;
pub mod leader;
pub mod liveness;
pub mod metrics;
pub mod plan;
pub mod quantity;
pub mod reconcile;
pub mod resources;
pub mod running;
pub mod trigger;
pub mod watch;
