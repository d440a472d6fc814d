//! The Prometheus registry and every metric podgroup-sync exports (SPEC §7).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Buckets from a millisecond to ten minutes: reconciles are fast, gangs can wait long.
/// Gangs of GPU jobs can wait for hours.
const GANG_WAIT_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0,
    28800.0,
];

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0,
];

pub struct Metrics {
    pub registry: Registry,
    pub reconcile_total: IntCounterVec,
    pub reconcile_duration: HistogramVec,
    pub podgroup_writes: IntCounterVec,
    pub own_write_echoes: IntCounterVec,
    pub queued_jobs: IntGaugeVec,
    pub podgroups: IntGaugeVec,
    pub job_to_podgroup: HistogramVec,
    pub gang_wait: HistogramVec,
    pub conflicts: IntCounter,
    pub invalid_jobs: IntCounterVec,
    pub managed_namespaces: IntGaugeVec,
    pub watched_kinds: IntGaugeVec,
    pub backend_served: IntGaugeVec,
    pub backend_unavailable: IntCounterVec,
    pub events: IntCounterVec,
    pub events_failed: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub watch_errors: IntCounterVec,
    pub cache_relists: IntCounterVec,
    pub stale_caches: IntGauge,
    pub leader: IntGauge,
    pub build_info: IntGaugeVec,
    pub last_reconcile: prometheus::Gauge,
    pub broken_gangs: IntGaugeVec,
    pub infeasible_gangs: IntGaugeVec,
    pub stale_podgroups: IntGaugeVec,
    pub stale_deleted: IntCounterVec,
    pub audit_duration: prometheus::Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers a metric and returns it.
fn registered<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

impl Metrics {
    // The catalogue of exported metrics (SPEC §7): one entry per metric and no logic, kept in one
    // function so that it reads as the list it is.
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let histogram_vec = |name: &str, help: &str, labels: &[&str]| {
            let buckets = if name == "podgroup_sync_gang_wait_seconds" {
                GANG_WAIT_BUCKETS
            } else {
                LATENCY_BUCKETS
            };
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("valid metric");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
        };
        let reconcile_total = counter_vec(
            "podgroup_sync_reconcile_total",
            "Job reconciles by job kind and result (ok, invalid, conflict, error).",
            &["kind", "result"],
        );
        let reconcile_duration = histogram_vec(
            "podgroup_sync_reconcile_duration_seconds",
            "Time spent in one job reconcile.",
            &["kind"],
        );
        let podgroup_writes = counter_vec(
            "podgroup_sync_podgroup_writes_total",
            "PodGroup writes sent to the API server by backend and operation (create, update, delete).",
            &["backend", "op"],
        );
        let own_write_echoes = counter_vec(
            "podgroup_sync_own_write_echoes_total",
            "PodGroup watch events that only echoed podgroup-sync's own write, by backend: they requeue no job.",
            &["backend"],
        );
        let queued_jobs = gauge_vec(
            "podgroup_sync_queued_jobs",
            "Jobs waiting for a reconcile turn, by kind: taken first in, first out, at most --concurrency at a time.",
            &["kind"],
        );
        let podgroups = gauge_vec(
            "podgroup_sync_podgroups",
            "PodGroups owned by podgroup-sync by backend and normalised phase.",
            &["backend", "phase"],
        );
        let job_to_podgroup = histogram_vec(
            "podgroup_sync_job_to_podgroup_seconds",
            "Time from a job's creationTimestamp to its PodGroup being created.",
            &["backend"],
        );
        let gang_wait = histogram_vec(
            "podgroup_sync_gang_wait_seconds",
            "Time from a PodGroup's creation to its first Running phase seen.",
            &["backend"],
        );
        let conflicts = registered(
            &registry,
            IntCounter::new(
                "podgroup_sync_conflicts_total",
                "Jobs whose PodGroup name is taken by a PodGroup that another owner controls.",
            )
            .expect("valid metric"),
        );
        let invalid_jobs = counter_vec(
            "podgroup_sync_invalid_jobs_total",
            "Job reconciles that found a spec no PodGroup can be made from, by reason.",
            &["reason"],
        );
        let managed_namespaces = gauge_vec(
            "podgroup_sync_managed_namespaces",
            "Namespaces by enablement mode (true, dry-run).",
            &["mode"],
        );
        let watched_kinds = gauge_vec(
            "podgroup_sync_watched_kinds",
            "Job kinds podgroup-sync knows; served=\"true\" when the API server serves the CRD and it is watched.",
            &["kind", "version", "served"],
        );
        let backend_served = gauge_vec(
            "podgroup_sync_backend_served",
            "1 when the API server serves the backend's PodGroups (its CRD, or scheduling.k8s.io/v1beta1 for kubernetes).",
            &["backend"],
        );
        let backend_unavailable = counter_vec(
            "podgroup_sync_backend_unavailable_total",
            "Job reconciles that wanted a backend whose PodGroups are not served.",
            &["backend"],
        );
        let events = counter_vec(
            "podgroup_sync_events_total",
            "Kubernetes Events emitted on jobs, by type and reason.",
            &["type", "reason"],
        );
        let events_failed = counter_vec(
            "podgroup_sync_events_failed_total",
            "Events the API server did not accept, by reason and cause: transient (retried with the reconcile) or refused (not retried).",
            &["reason", "cause"],
        );
        let reconcile_errors = counter_vec(
            "podgroup_sync_reconcile_errors_total",
            "Failed job reconciles by kind and cause: write (a PodGroup write failed), event (an Event could not be published), not_found (the job was gone from the cache), runner; each is retried or logged.",
            &["kind", "cause"],
        );
        let stale_caches = registered(
            &registry,
            IntGauge::new(
                "podgroup_sync_stale_caches",
                "Caches that are not fresh now: not synced, relisting, failing or stopped (see /readyz).",
            )
            .expect("valid metric"),
        );
        let cache_relists = counter_vec(
            "podgroup_sync_cache_relists_total",
            "Relists of a synced cache, by resource: its watch expired (410) or broke and could not resume.",
            &["resource"],
        );
        let watch_errors = counter_vec(
            "podgroup_sync_watch_errors_total",
            "Errors listing or watching a resource (e.g. RBAC forbids it), by resource.",
            &["resource"],
        );
        let leader = registered(
            &registry,
            IntGauge::new(
                "podgroup_sync_leader",
                "1 while this instance holds the leader Lease and may write.",
            )
            .expect("valid metric"),
        );
        let build_info = gauge_vec(
            "podgroup_sync_build_info",
            "Always 1; labels say which build is running.",
            &["version"],
        );
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let last_reconcile = registered(
            &registry,
            prometheus::Gauge::new(
                "podgroup_sync_last_reconcile_timestamp_seconds",
                "Unix time of the last finished reconcile.",
            )
            .expect("valid metric"),
        );
        let broken_gangs = gauge_vec(
            "podgroup_sync_broken_gangs",
            "Gangs that ran whole and have had fewer than minMember pods running for longer than --gang-broken-seconds (GangBroken), by backend.",
            &["backend"],
        );
        let infeasible_gangs = gauge_vec(
            "podgroup_sync_infeasible_gangs",
            "Waiting gangs that cannot be placed (--gang-feasibility), by backend and reason: capacity (a pod fits no schedulable node, or minResources exceed them all) or queue (the Volcano queue does not exist or is not Open).",
            &["backend", "reason"],
        );
        let stale_podgroups = gauge_vec(
            "podgroup_sync_stale_podgroups",
            "PodGroups not made by podgroup-sync whose controller job is gone (owner_deleted) or finished (owner_finished), as of the last audit; reported, never deleted.",
            &["backend", "reason"],
        );
        let stale_deleted = counter_vec(
            "podgroup_sync_stale_podgroups_deleted_total",
            "PodGroups of podgroup-sync's own that the audit deleted because their job was gone (owner_deleted, no_owner) or finished (owner_finished).",
            &["backend", "reason"],
        );
        let audit_duration = registered(
            &registry,
            prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "podgroup_sync_audit_duration_seconds",
                    "Time one stale-PodGroup audit pass took (from the caches; deletes and Events included).",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
            )
            .expect("valid metric"),
        );
        let m = Metrics {
            registry,
            reconcile_total,
            reconcile_duration,
            podgroup_writes,
            own_write_echoes,
            queued_jobs,
            podgroups,
            job_to_podgroup,
            gang_wait,
            conflicts,
            invalid_jobs,
            managed_namespaces,
            watched_kinds,
            backend_served,
            backend_unavailable,
            events,
            events_failed,
            reconcile_errors,
            watch_errors,
            cache_relists,
            stale_caches,
            leader,
            build_info,
            last_reconcile,
            broken_gangs,
            infeasible_gangs,
            stale_podgroups,
            stale_deleted,
            audit_duration,
        };
        m.zero_known_series();
        m
    }

    /// Creates the series that are known in advance at zero, so `increase()` sees their first
    /// sample (a counter that appears at 1 hides its first event from rate queries).
    fn zero_known_series(&self) {
        for b in crate::backend::BACKENDS {
            for op in ["create", "update", "delete"] {
                self.podgroup_writes.with_label_values(&[b.as_str(), op]);
            }
            self.backend_unavailable.with_label_values(&[b.as_str()]);
            self.own_write_echoes.with_label_values(&[b.as_str()]);
            self.broken_gangs.with_label_values(&[b.as_str()]);
            for r in ["capacity", "queue"] {
                self.infeasible_gangs.with_label_values(&[b.as_str(), r]);
            }
            for r in crate::health::audit::Stale::ALL {
                self.stale_deleted
                    .with_label_values(&[b.as_str(), r.as_str()]);
            }
            for r in [
                crate::health::audit::Stale::OwnerDeleted,
                crate::health::audit::Stale::OwnerFinished,
            ] {
                self.stale_podgroups
                    .with_label_values(&[b.as_str(), r.as_str()]);
            }
        }
        for k in crate::job::KINDS {
            self.queued_jobs.with_label_values(&[k.kind]);
            for r in ["ok", "standby", "invalid", "conflict", "error"] {
                self.reconcile_total.with_label_values(&[k.kind, r]);
            }
            for c in ["write", "event", "not_found", "runner"] {
                self.reconcile_errors.with_label_values(&[k.kind, c]);
            }
        }
        for r in crate::events::Reason::ALL {
            self.events
                .with_label_values(&[r.type_().as_str(), r.as_str()]);
            for cause in ["transient", "refused"] {
                self.events_failed.with_label_values(&[r.as_str(), cause]);
            }
        }
    }

    /// The name of every metric family this registry exports (histograms as their base name),
    /// whether or not a sample has been recorded yet.
    pub fn metric_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .registry
            .gather()
            .iter()
            .map(|mf| mf.name().to_string())
            .chain(self.vec_names())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    fn vec_names(&self) -> Vec<String> {
        use prometheus::core::Collector;
        let mut out = Vec::new();
        let mut add = |descs: Vec<&prometheus::core::Desc>| {
            out.extend(descs.iter().map(|d| d.fq_name.clone()))
        };
        add(self.reconcile_total.desc());
        add(self.reconcile_duration.desc());
        add(self.podgroup_writes.desc());
        add(self.own_write_echoes.desc());
        add(self.queued_jobs.desc());
        add(self.podgroups.desc());
        add(self.job_to_podgroup.desc());
        add(self.gang_wait.desc());
        add(self.invalid_jobs.desc());
        add(self.managed_namespaces.desc());
        add(self.watched_kinds.desc());
        add(self.backend_served.desc());
        add(self.backend_unavailable.desc());
        add(self.events.desc());
        add(self.events_failed.desc());
        add(self.reconcile_errors.desc());
        add(self.watch_errors.desc());
        add(self.cache_relists.desc());
        add(self.build_info.desc());
        add(self.broken_gangs.desc());
        add(self.infeasible_gangs.desc());
        add(self.stale_podgroups.desc());
        add(self.stale_deleted.desc());
        out
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding never fails");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}
