//! podgroup-sync: gang-scheduling PodGroups for Kubeflow training jobs.
//!
//! Data flows one way: a watched job → [`job`] (normalised, pure; each kind's rules in
//! [`kinds`]) → [`gang`] (minMember and minResources, pure) → [`backend`] (the desired PodGroup,
//! pure) → [`plan`] (what to delete, write and report, pure) → [`reconcile`] (carries the plan
//! out: the only I/O that writes) → [`events`] and [`metrics`]. [`discovery`] says which CRDs are
//! served and [`running`] starts and stops the watches to match; [`watch`] feeds the [`caches`]
//! and the reconcile queue so that nothing is lost across a fault; [`liveness`] says when a
//! cache is not fresh; [`own_writes`] keeps the echo of our own writes from requeueing a job;
//! [`controller`] wires it all. The pod-link [`webhook`] answers pod admissions from the same
//! caches, through the same backend choice and PodGroup name.

pub mod backend;
pub mod caches;
pub mod cli;
pub mod client;
pub mod controller;
pub mod diff;
pub mod discovery;
pub mod dropped;
pub mod enablement;
pub mod events;
pub mod explain;
pub mod fifo;
pub mod gang;
pub mod health;
pub mod http;
pub mod job;
pub mod kinds;
pub mod kueue;
pub mod leader;
pub mod lean;
pub mod listen;
pub mod liveness;
pub mod metrics;
pub mod names;
pub mod own_writes;
pub mod owned;
pub mod packed;
pub mod plan;
pub mod quantity;
pub mod reason;
pub mod reconcile;
pub mod refusal;
pub mod resources;
pub mod running;
pub mod settings;
pub mod strip;
pub mod target;
pub mod tiers;
pub mod topology;
pub mod transcode;
pub mod trigger;
pub mod unlinked;
pub mod watch;
pub mod webhook;
pub mod workload;
