//! The watches and what discovery found: errors and relists per resource, caches not fresh,
//! the kinds served and watched, the namespaces managed.

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter_vec, gauge_vec, names_of, registered};

pub struct WatchMetrics {
    /// `podgroup_sync_watch_errors_total{resource}`.
    pub errors: IntCounterVec,
    /// `podgroup_sync_cache_relists_total{resource}`.
    pub relists: IntCounterVec,
    /// `podgroup_sync_watch_events_total{resource}`.
    pub events: IntCounterVec,
    /// `podgroup_sync_stale_caches`.
    pub stale_caches: IntGauge,
    /// `podgroup_sync_watched_kinds{kind,version,served}`.
    pub watched_kinds: IntGaugeVec,
    /// `podgroup_sync_managed_namespaces{mode}`.
    pub managed_namespaces: IntGaugeVec,
}

impl WatchMetrics {
    pub fn new(registry: &Registry) -> Self {
        WatchMetrics {
            errors: counter_vec(
                registry,
                "podgroup_sync_watch_errors_total",
                "Errors listing or watching a resource (e.g. RBAC forbids it), by resource.",
                &["resource"],
            ),
            relists: counter_vec(
                registry,
                "podgroup_sync_cache_relists_total",
                "Relists of a synced cache, by resource: its watch expired (410) or broke and could not resume.",
                &["resource"],
            ),
            events: counter_vec(
                registry,
                "podgroup_sync_watch_events_total",
                "Objects the API server sent to a watch (a list's objects included), by resource: the load podgroup-sync's caches put on the API server.",
                &["resource"],
            ),
            stale_caches: registered(
                registry,
                IntGauge::new(
                    "podgroup_sync_stale_caches",
                    "Caches that are not fresh now: not synced, relisting, failing or stopped (see /readyz).",
                )
                .expect("valid metric"),
            ),
            watched_kinds: gauge_vec(
                registry,
                "podgroup_sync_watched_kinds",
                "Job kinds podgroup-sync knows; served=\"true\" when the API server serves the CRD and it is watched.",
                &["kind", "version", "served"],
            ),
            managed_namespaces: gauge_vec(
                registry,
                "podgroup_sync_managed_namespaces",
                "Namespaces by enablement mode (true, dry-run).",
                &["mode"],
            ),
        }
    }

    pub(crate) fn names(&self) -> Vec<String> {
        names_of(&[
            &self.errors,
            &self.relists,
            &self.events,
            &self.watched_kinds,
            &self.managed_namespaces,
        ])
    }
}
