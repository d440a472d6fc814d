//! The job reconciles: how many, how long, why they failed, and what waits for a turn.

use prometheus::{Gauge, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Registry};

use super::{LATENCY_BUCKETS, counter_vec, gauge_vec, histogram_vec, names_of, registered};

pub struct ReconcileMetrics {
    /// `podgroup_sync_reconcile_total{kind,result}`.
    pub total: IntCounterVec,
    /// `podgroup_sync_reconcile_duration_seconds{kind}`.
    pub duration: HistogramVec,
    /// `podgroup_sync_reconcile_errors_total{kind,cause}`.
    pub errors: IntCounterVec,
    /// `podgroup_sync_queued_jobs{kind}`.
    pub queued: IntGaugeVec,
    /// `podgroup_sync_invalid_jobs_total{reason}`.
    pub invalid: IntCounterVec,
    /// `podgroup_sync_conflicts_total`.
    pub conflicts: IntCounter,
    /// `podgroup_sync_last_reconcile_timestamp_seconds`.
    pub last: Gauge,
}

impl ReconcileMetrics {
    pub fn new(registry: &Registry) -> Self {
        let m = ReconcileMetrics {
            total: counter_vec(
                registry,
                "podgroup_sync_reconcile_total",
                "Job reconciles by job kind and result (ok, invalid, conflict, error).",
                &["kind", "result"],
            ),
            duration: histogram_vec(
                registry,
                "podgroup_sync_reconcile_duration_seconds",
                "Time spent in one job reconcile.",
                &["kind"],
                LATENCY_BUCKETS,
            ),
            errors: counter_vec(
                registry,
                "podgroup_sync_reconcile_errors_total",
                "Failed job reconciles by kind and cause: write (a PodGroup write failed), event (an Event could not be published), not_found (the job was gone from the cache), runner; each is retried or logged.",
                &["kind", "cause"],
            ),
            queued: gauge_vec(
                registry,
                "podgroup_sync_queued_jobs",
                "Jobs waiting for a reconcile turn, by kind: taken first in, first out, at most --concurrency at a time.",
                &["kind"],
            ),
            invalid: counter_vec(
                registry,
                "podgroup_sync_invalid_jobs_total",
                "Job reconciles that found a spec no PodGroup can be made from, by reason.",
                &["reason"],
            ),
            conflicts: registered(
                registry,
                IntCounter::new(
                    "podgroup_sync_conflicts_total",
                    "Jobs whose PodGroup name is taken by a PodGroup that another owner controls.",
                )
                .expect("valid metric"),
            ),
            last: registered(
                registry,
                Gauge::new(
                    "podgroup_sync_last_reconcile_timestamp_seconds",
                    "Unix time of the last finished reconcile.",
                )
                .expect("valid metric"),
            ),
        };
        for k in crate::kinds::KINDS {
            m.queued.with_label_values(&[k.kind]);
            for r in ["ok", "standby", "invalid", "conflict", "error"] {
                m.total.with_label_values(&[k.kind, r]);
            }
            for c in ["write", "event", "not_found", "runner"] {
                m.errors.with_label_values(&[k.kind, c]);
            }
        }
        m
    }

    pub(crate) fn names(&self) -> Vec<String> {
        names_of(&[
            &self.total,
            &self.duration,
            &self.errors,
            &self.queued,
            &self.invalid,
        ])
    }
}
