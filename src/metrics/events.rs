//! The Events published on jobs and PodGroups, and those the API server did not take.

use prometheus::{IntCounterVec, Registry};

use super::{counter_vec, names_of};
use crate::reason::Reason;

pub struct EventMetrics {
    /// `podgroup_sync_events_total{type,reason}`.
    pub published: IntCounterVec,
    /// `podgroup_sync_events_failed_total{reason,cause}`.
    pub failed: IntCounterVec,
}

impl EventMetrics {
    pub fn new(registry: &Registry) -> Self {
        let m = EventMetrics {
            published: counter_vec(
                registry,
                "podgroup_sync_events_total",
                "Kubernetes Events emitted on jobs, by type and reason.",
                &["type", "reason"],
            ),
            failed: counter_vec(
                registry,
                "podgroup_sync_events_failed_total",
                "Events the API server did not accept, by reason and cause: transient (retried with the reconcile) or refused (not retried).",
                &["reason", "cause"],
            ),
        };
        for r in Reason::ALL {
            m.published
                .with_label_values(&[r.type_().as_str(), r.as_str()]);
            for cause in ["transient", "refused"] {
                m.failed.with_label_values(&[r.as_str(), cause]);
            }
        }
        m
    }

    pub(crate) fn names(&self) -> Vec<String> {
        names_of(&[&self.published, &self.failed])
    }
}
