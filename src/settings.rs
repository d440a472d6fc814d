//! The behaviour settings every step reads (from flags), and the field manager of every write:
//! below the steps that share them.

use std::time::Duration;

use crate::backend::BackendOptions;
use crate::enablement::Enablement;
use crate::kinds::{BATCH_JOB, KINDS};
use crate::workload::JobKind;

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "podgroup-sync";

/// When a running gang's PodGroup may be resized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResizePolicy {
    /// Follow every change of replicas or policy (needed for HPA and elastic jobs).
    #[value(name = "always")]
    Always,
    /// Keep the size of an existing PodGroup; a suspended job's PodGroup is recreated on resume.
    #[value(name = "while-suspended")]
    WhileSuspended,
    /// Never change the size of an existing PodGroup.
    #[value(name = "never")]
    Never,
}

/// Behaviour settings, from flags.
#[derive(Debug, Clone)]
pub struct Settings {
    pub enablement: Enablement,
    pub backend_options: BackendOptions,
    pub resize: ResizePolicy,
    pub keep_finished: bool,
    /// Watch batch/v1 Jobs (`--batch-jobs`; Indexed ones opt in by annotation).
    pub batch_jobs: bool,
    /// How long a scheduler-plugins PodGroup may stay Pending/Scheduling before an Event says so.
    pub gang_wait_warning: Duration,
    /// The pod-link webhook links pods (SPEC §8): templates without links are expected.
    pub webhook: bool,
    /// How long a gang that ran whole may run short of minMember pods before `GangBroken`.
    pub gang_broken_after: Duration,
    /// Report gangs no schedulable node or queue can take (SPEC §10; watches Nodes and Queues).
    pub feasibility: bool,
    /// Seconds between stale-PodGroup audits (zero: no audit).
    pub audit_interval: Duration,
    /// Kueue's `waitForPodsReady.timeout`, when the cluster's Kueue sets one (SPEC §12).
    pub kueue_pods_ready_timeout: Option<Duration>,
}

impl Settings {
    /// The kinds this process watches when they are served: every kind, but batch/v1 Jobs only
    /// with `--batch-jobs`.
    pub fn watched_kinds(&self) -> Vec<&'static JobKind> {
        KINDS
            .iter()
            .copied()
            .filter(|k| self.batch_jobs || *k != &BATCH_JOB)
            .collect()
    }
}
