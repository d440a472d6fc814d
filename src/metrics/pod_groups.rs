//! PodGroups: the writes sent, the echoes of our own writes, the phases of ours, how long a
//! job waits for its PodGroup and a gang for its pods, and whether each backend is served.

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec, Registry};

use super::{LATENCY_BUCKETS, counter_vec, gauge_vec, histogram_vec, names_of};

/// Gangs of GPU jobs can wait for hours.
const GANG_WAIT_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0,
    28800.0,
];

pub struct PodGroupMetrics {
    /// `podgroup_sync_podgroup_writes_total{backend,op}`.
    pub writes: IntCounterVec,
    /// `podgroup_sync_own_write_echoes_total{backend}`.
    pub own_write_echoes: IntCounterVec,
    /// `podgroup_sync_podgroups{backend,phase}`.
    pub by_phase: IntGaugeVec,
    /// `podgroup_sync_job_to_podgroup_seconds{backend}`.
    pub job_to_pod_group: HistogramVec,
    /// `podgroup_sync_gang_wait_seconds{backend}`.
    pub gang_wait: HistogramVec,
    /// `podgroup_sync_backend_served{backend}`.
    pub backend_served: IntGaugeVec,
    /// `podgroup_sync_backend_unavailable_total{backend}`.
    pub backend_unavailable: IntCounterVec,
}

impl PodGroupMetrics {
    pub fn new(registry: &Registry) -> Self {
        let m = PodGroupMetrics {
            writes: counter_vec(
                registry,
                "podgroup_sync_podgroup_writes_total",
                "PodGroup writes sent to the API server by backend and operation (create, update, delete).",
                &["backend", "op"],
            ),
            own_write_echoes: counter_vec(
                registry,
                "podgroup_sync_own_write_echoes_total",
                "PodGroup watch events that only echoed podgroup-sync's own write, by backend: they requeue no job.",
                &["backend"],
            ),
            by_phase: gauge_vec(
                registry,
                "podgroup_sync_podgroups",
                "PodGroups owned by podgroup-sync by backend and normalised phase.",
                &["backend", "phase"],
            ),
            job_to_pod_group: histogram_vec(
                registry,
                "podgroup_sync_job_to_podgroup_seconds",
                "Time from a job's creationTimestamp to its PodGroup being created.",
                &["backend"],
                LATENCY_BUCKETS,
            ),
            gang_wait: histogram_vec(
                registry,
                "podgroup_sync_gang_wait_seconds",
                "Time from a PodGroup's creation to its first Running phase seen.",
                &["backend"],
                GANG_WAIT_BUCKETS,
            ),
            backend_served: gauge_vec(
                registry,
                "podgroup_sync_backend_served",
                "1 when the API server serves the backend's PodGroups (its CRD, or scheduling.k8s.io/v1beta1 for kubernetes).",
                &["backend"],
            ),
            backend_unavailable: counter_vec(
                registry,
                "podgroup_sync_backend_unavailable_total",
                "Job reconciles that wanted a backend whose PodGroups are not served.",
                &["backend"],
            ),
        };
        for b in crate::backend::BACKENDS {
            for op in ["create", "update", "delete"] {
                m.writes.with_label_values(&[b.as_str(), op]);
            }
            m.backend_unavailable.with_label_values(&[b.as_str()]);
            m.own_write_echoes.with_label_values(&[b.as_str()]);
        }
        m
    }

    pub(crate) fn names(&self) -> Vec<String> {
        names_of(&[
            &self.writes,
            &self.own_write_echoes,
            &self.by_phase,
            &self.job_to_pod_group,
            &self.gang_wait,
            &self.backend_served,
            &self.backend_unavailable,
        ])
    }
}
