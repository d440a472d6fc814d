//! The Prometheus registry and every metric podgroup-sync exports (SPEC §7), one file per area:
//! [`reconcile`] (the job reconciles), [`pod_groups`] (PodGroup writes, phases and waits),
//! [`events`] (Events published), [`watches`] (the caches and what discovery found), [`health`]
//! (gang health and the stale-PodGroup audit); the webhook's own are in `webhook::admit` and
//! `webhook::tls`, the API client's in `client`. Each area registers its metrics on the one
//! registry, and creates the series known in advance at zero so that `increase()` sees their
//! first sample (a counter that appears at 1 hides its first event from rate queries).

pub mod events;
pub mod health;
pub mod pod_groups;
pub mod reconcile;
pub mod watches;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Buckets from half a millisecond to ten minutes: reconciles are fast, API calls can be slow.
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0,
];

pub struct Metrics {
    pub registry: Registry,
    pub reconcile: reconcile::ReconcileMetrics,
    pub pod_groups: pod_groups::PodGroupMetrics,
    pub events: events::EventMetrics,
    pub watches: watches::WatchMetrics,
    pub health: health::HealthMetrics,
    /// `podgroup_sync_leader`: 1 while this instance holds the Lease and may write.
    pub leader: IntGauge,
    /// `podgroup_sync_build_info{version}`: always 1.
    pub build_info: IntGaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers a metric and returns it.
pub(crate) fn registered<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    c: C,
) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

pub(crate) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    registered(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

pub(crate) fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntGaugeVec {
    registered(
        registry,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

pub(crate) fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    registered(
        registry,
        HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
            labels,
        )
        .expect("valid metric"),
    )
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let leader = registered(
            &registry,
            IntGauge::new(
                "podgroup_sync_leader",
                "1 while this instance holds the leader Lease and may write.",
            )
            .expect("valid metric"),
        );
        let build_info = gauge_vec(
            &registry,
            "podgroup_sync_build_info",
            "Always 1; labels say which build is running.",
            &["version"],
        );
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        Metrics {
            reconcile: reconcile::ReconcileMetrics::new(&registry),
            pod_groups: pod_groups::PodGroupMetrics::new(&registry),
            events: events::EventMetrics::new(&registry),
            watches: watches::WatchMetrics::new(&registry),
            health: health::HealthMetrics::new(&registry),
            leader,
            build_info,
            registry,
        }
    }

    /// The name of every metric family this registry exports (histograms as their base name),
    /// whether or not a sample has been recorded yet.
    pub fn metric_names(&self) -> Vec<String> {
        use prometheus::core::Collector;
        let mut names: Vec<String> = self
            .registry
            .gather()
            .iter()
            .map(|mf| mf.name().to_string())
            .chain(self.build_info.desc().iter().map(|d| d.fq_name.clone()))
            .chain(self.reconcile.names())
            .chain(self.pod_groups.names())
            .chain(self.events.names())
            .chain(self.watches.names())
            .chain(self.health.names())
            .collect();
        names.sort();
        names.dedup();
        names
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

/// The names of the metric families behind these collectors (a vector without a series yet is
/// not gathered, but is exported all the same once it has one).
pub(crate) fn names_of(collectors: &[&dyn prometheus::core::Collector]) -> Vec<String> {
    collectors
        .iter()
        .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()))
        .collect()
}
