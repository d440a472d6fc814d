//! Gang health and hygiene (SPEC §10): broken and infeasible gangs, stale PodGroups found and
//! deleted by the audit, and how long an audit pass takes.

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Registry};

use super::{LATENCY_BUCKETS, counter_vec, gauge_vec, names_of, registered};
use crate::health::audit::Stale;

pub struct HealthMetrics {
    /// `podgroup_sync_broken_gangs{backend}`.
    pub broken_gangs: IntGaugeVec,
    /// `podgroup_sync_infeasible_gangs{backend,reason}`.
    pub infeasible_gangs: IntGaugeVec,
    /// `podgroup_sync_stale_podgroups{backend,reason}`.
    pub stale_pod_groups: IntGaugeVec,
    /// `podgroup_sync_stale_podgroups_deleted_total{backend,reason}`.
    pub stale_deleted: IntCounterVec,
    /// `podgroup_sync_audit_duration_seconds`.
    pub audit_duration: Histogram,
}

impl HealthMetrics {
    pub fn new(registry: &Registry) -> Self {
        let m = HealthMetrics {
            broken_gangs: gauge_vec(
                registry,
                "podgroup_sync_broken_gangs",
                "Gangs that ran whole and have had fewer than minMember pods running for longer than --gang-broken-seconds (GangBroken), by backend.",
                &["backend"],
            ),
            infeasible_gangs: gauge_vec(
                registry,
                "podgroup_sync_infeasible_gangs",
                "Waiting gangs that cannot be placed (--gang-feasibility), by backend and reason: capacity (a pod fits no schedulable node, or minResources exceed them all) or queue (the Volcano queue does not exist or is not Open).",
                &["backend", "reason"],
            ),
            stale_pod_groups: gauge_vec(
                registry,
                "podgroup_sync_stale_podgroups",
                "PodGroups not made by podgroup-sync whose controller job is gone (owner_deleted) or finished (owner_finished), as of the last audit; reported, never deleted.",
                &["backend", "reason"],
            ),
            stale_deleted: counter_vec(
                registry,
                "podgroup_sync_stale_podgroups_deleted_total",
                "PodGroups of podgroup-sync's own that the audit deleted because their job was gone (owner_deleted, no_owner) or finished (owner_finished).",
                &["backend", "reason"],
            ),
            audit_duration: registered(
                registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "podgroup_sync_audit_duration_seconds",
                        "Time one stale-PodGroup audit pass took (from the caches; deletes and Events included).",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                )
                .expect("valid metric"),
            ),
        };
        for b in crate::backend::BACKENDS {
            m.broken_gangs.with_label_values(&[b.as_str()]);
            for r in ["capacity", "queue"] {
                m.infeasible_gangs.with_label_values(&[b.as_str(), r]);
            }
            for r in Stale::ALL {
                m.stale_deleted.with_label_values(&[b.as_str(), r.as_str()]);
            }
            for r in [Stale::OwnerDeleted, Stale::OwnerFinished] {
                m.stale_pod_groups
                    .with_label_values(&[b.as_str(), r.as_str()]);
            }
        }
        m
    }

    pub(crate) fn names(&self) -> Vec<String> {
        names_of(&[
            &self.broken_gangs,
            &self.infeasible_gangs,
            &self.stale_pod_groups,
            &self.stale_deleted,
        ])
    }
}
