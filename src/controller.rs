//! Wiring: the context caches, then a loop that discovers the served CRDs and lets [`Running`]
//! start and stop the PodGroup caches and job controllers to match (see `discovery`, `running`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{LimitRange, Namespace};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::backend::{BACKENDS, BackendKind, Phase, made_by};
use crate::caches::Caches;
use crate::discovery::{discover, discovery_retry};
use crate::enablement::Mode;
use crate::events::Events;
use crate::health::capacity::CapacityCaches;
use crate::liveness::{Liveness, Readiness};
use crate::reconcile::{self, Context};
use crate::running::Running;
use crate::trigger::Trigger;
use crate::watch::spawn_context_cache;

/// Settings of the controller runtime.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    pub concurrency: u16,
    pub discovery_interval: Duration,
}

/// How the runtime talks to the rest of the process.
pub struct Signals {
    /// Set once discovery ran and every cache synced.
    pub readiness: Readiness,
    /// Whether this instance holds the leader Lease (always true without leader election).
    pub leading: watch::Receiver<bool>,
    /// Unix time of the loop's last turn, for liveness.
    pub heartbeat: Arc<std::sync::atomic::AtomicI64>,
    /// Turns true on SIGTERM: finish in-flight reconciles and stop.
    pub shutdown: watch::Receiver<bool>,
    /// Reconciles in progress (for liveness).
    pub in_flight: Arc<crate::liveness::InFlight>,
    /// Receives the caches once they synced (the pod-link webhook reads them).
    pub caches: watch::Sender<Option<Caches>>,
}

/// The context caches every reconcile reads.
struct ContextCaches {
    namespaces: Store<Namespace>,
    limit_ranges: Store<LimitRange>,
    priority_classes: Store<PriorityClass>,
    runtime_classes: Store<RuntimeClass>,
    changes: Arc<std::sync::atomic::AtomicU64>,
    /// Read only for their changes: a policy that refused a PodGroup may pass it now.
    admission_policies: Store<ValidatingAdmissionPolicy>,
    policy_bindings: Store<ValidatingAdmissionPolicyBinding>,
    /// Nodes (and later Queues), with the feasibility check on.
    capacity: Option<CapacityCaches>,
    tasks: Vec<JoinHandle<()>>,
}

fn spawn_context_caches(
    client: &Client,
    triggers: &broadcast::Sender<Trigger>,
    liveness: &Liveness,
    metrics: &Arc<crate::metrics::Metrics>,
    feasibility: bool,
) -> ContextCaches {
    let changes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (namespaces, h1) = spawn_context_cache(
        Api::<Namespace>::all(client.clone()),
        triggers.clone(),
        // Any namespace change may flip its mode or backend.
        |n: &Namespace| Some(Trigger::Namespace(n.name_any())),
        liveness.probe("namespaces"),
        metrics.clone(),
        changes.clone(),
    );
    let (limit_ranges, h2) = spawn_context_cache(
        Api::<LimitRange>::all(client.clone()),
        triggers.clone(),
        |l: &LimitRange| l.namespace().map(Trigger::Namespace),
        liveness.probe("limitranges"),
        metrics.clone(),
        changes.clone(),
    );
    let (priority_classes, h3) = spawn_context_cache(
        Api::<PriorityClass>::all(client.clone()),
        triggers.clone(),
        |_| Some(Trigger::All),
        liveness.probe("priorityclasses"),
        metrics.clone(),
        changes.clone(),
    );
    let (runtime_classes, h4) = spawn_context_cache(
        Api::<RuntimeClass>::all(client.clone()),
        triggers.clone(),
        |_| Some(Trigger::All),
        liveness.probe("runtimeclasses"),
        metrics.clone(),
        changes.clone(),
    );
    // A PodGroup refused at admission is sent again at once when a policy or its binding
    // changes (see `refusal`); the others wait for their backoff.
    let (admission_policies, h5) = spawn_context_cache(
        Api::<ValidatingAdmissionPolicy>::all(client.clone()),
        triggers.clone(),
        |_| Some(Trigger::All),
        liveness.probe("validatingadmissionpolicies"),
        metrics.clone(),
        changes.clone(),
    );
    let (policy_bindings, h6) = spawn_context_cache(
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()),
        triggers.clone(),
        |_| Some(Trigger::All),
        liveness.probe("validatingadmissionpolicybindings"),
        metrics.clone(),
        changes.clone(),
    );
    let mut tasks = vec![h1, h2, h3, h4, h5, h6];
    let capacity = feasibility.then(|| {
        let (c, h) = CapacityCaches::spawn(client, liveness.probe("nodes"), metrics.clone());
        tasks.push(h);
        tasks.push(c.spawn_debounce(triggers.clone()));
        c
    });
    ContextCaches {
        namespaces,
        limit_ranges,
        priority_classes,
        runtime_classes,
        changes,
        admission_policies,
        policy_bindings,
        capacity,
        tasks,
    }
}

impl ContextCaches {
    /// Waits until every context cache listed once and hands them over as [`Caches`] with their
    /// tasks; `None` when a shutdown came first. A cache that cannot load (e.g. RBAC forbids the
    /// list) keeps readiness false; SIGTERM still stops the process at once.
    async fn wait_synced(
        self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Option<(Caches, Vec<JoinHandle<()>>)>, RunError> {
        tokio::select! {
            failed = self.synced() => if let Some(what) = failed {
                return Err(RunError::CacheSync(what));
            },
            _ = shutdown.wait_for(|stop| *stop) => {
                info!("shut down before the caches synced");
                for h in self.tasks {
                    h.abort();
                }
                return Ok(None);
            }
        }
        info!("namespace, LimitRange, PriorityClass and RuntimeClass caches synced");
        let caches = Caches {
            namespaces: self.namespaces,
            limit_ranges: self.limit_ranges,
            priority_classes: self.priority_classes,
            runtime_classes: self.runtime_classes,
            context_changes: self.changes,
            context_memo: Default::default(),
            pod_groups: Default::default(),
            owned: Default::default(),
            own_writes: Default::default(),
            jobs: Default::default(),
            unlinked: Default::default(),
            capacity: self.capacity,
            kueue: Default::default(),
            tiers: Default::default(),
        };
        Ok(Some((caches, self.tasks)))
    }

    /// Waits until every context cache listed once; the name of the first that cannot.
    async fn synced(&self) -> Option<&'static str> {
        let waits = [
            (
                "namespaces",
                self.namespaces.wait_until_ready().await.is_ok(),
            ),
            (
                "limitranges",
                self.limit_ranges.wait_until_ready().await.is_ok(),
            ),
            (
                "priorityclasses",
                self.priority_classes.wait_until_ready().await.is_ok(),
            ),
            (
                "runtimeclasses",
                self.runtime_classes.wait_until_ready().await.is_ok(),
            ),
            (
                "validatingadmissionpolicies",
                self.admission_policies.wait_until_ready().await.is_ok(),
            ),
            (
                "validatingadmissionpolicybindings",
                self.policy_bindings.wait_until_ready().await.is_ok(),
            ),
            (
                "nodes",
                match &self.capacity {
                    Some(c) => {
                        let ok = c.nodes.wait_until_ready().await.is_ok();
                        // No reconcile reads an empty capacity before the first list.
                        c.refresh();
                        ok
                    }
                    None => true,
                },
            ),
        ];
        waits.into_iter().find(|(_, ok)| !ok).map(|(what, _)| what)
    }
}

/// Runs discovery, caches and controllers until `signals.shutdown` turns true.
pub async fn run(
    client: Client,
    ctx_settings: reconcile::Settings,
    rt: RuntimeSettings,
    events: Events,
    metrics: Arc<crate::metrics::Metrics>,
    signals: Signals,
) -> Result<(), RunError> {
    let Signals {
        readiness,
        leading,
        heartbeat,
        mut shutdown,
        in_flight,
        caches: caches_out,
    } = signals;
    let liveness = readiness.liveness().clone();
    let (triggers, _) = broadcast::channel::<Trigger>(16_384);
    let context = spawn_context_caches(
        &client,
        &triggers,
        &liveness,
        &metrics,
        ctx_settings.feasibility,
    );
    // The first discovery and the list of earlier Events read no cache: they run while the
    // caches list, not after. A candidate not leading yet reads the Events when it takes the
    // lead (`spawn_leader_trigger`): reading them now as well would be done twice.
    let read_events = *leading.borrow();
    let kinds = ctx_settings.watched_kinds();
    let reads = first_reads(&client, &kinds, read_events, shutdown.clone());
    let (synced, early) = tokio::join!(context.wait_synced(&mut shutdown), reads);
    let (Some((caches, mut tasks)), Some((first_discovery, published))) = (synced?, early) else {
        return Ok(());
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        ctx_settings.clone(),
        caches.clone(),
        events,
        metrics.clone(),
        leading.clone(),
        in_flight,
    ));
    let _ = caches_out.send(Some(caches.clone()));
    remember_published_events(&ctx, published);
    tasks.extend(spawn_side_tasks(
        &ctx, &client, &triggers, leading, &readiness, &liveness, &shutdown,
    ));

    let mut running = Running::new(
        client.clone(),
        ctx.clone(),
        caches.clone(),
        triggers,
        metrics.clone(),
        liveness,
        rt.concurrency,
        shutdown.clone(),
    );
    let mut failures: u32 = 0;
    let mut first_discovery = Some(first_discovery);
    loop {
        let mut wait = rt.discovery_interval;
        let discovered = match first_discovery.take() {
            Some(d) => d,
            None => discover(&client, &ctx.settings.watched_kinds()).await,
        };
        match discovered {
            Ok(served) => {
                failures = 0;
                if !running.apply(&served).await {
                    break;
                }
                readiness.set(true);
            }
            Err(e) => {
                // Retry soon: the first discovery gates readiness, and a CRD change should not
                // wait a whole interval after a fault.
                failures += 1;
                wait = wait.min(discovery_retry(failures));
                warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "discovery failed; retrying");
            }
        }
        refresh_gauges(&metrics, &caches, &ctx_settings, &readiness);
        refresh_health_gauges(&metrics, &ctx);
        heartbeat.store(
            k8s_openapi::jiff::Timestamp::now().as_second(),
            Ordering::Relaxed,
        );
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    info!("shutting down: finishing in-flight reconciles");
    readiness.set(false);
    running.stop(tasks).await;
    Ok(())
}

/// The tasks beside the job controllers: the unlinked-pod watch (with the webhook), the leader
/// trigger, the hourly resync and the stale-PodGroup audit.
fn spawn_side_tasks(
    ctx: &Arc<Context>,
    client: &Client,
    triggers: &broadcast::Sender<Trigger>,
    leading: watch::Receiver<bool>,
    readiness: &Readiness,
    liveness: &Liveness,
    shutdown: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    if ctx.settings.webhook {
        for label in crate::unlinked::pod_labels(&ctx.settings.watched_kinds()) {
            tasks.push(crate::unlinked::spawn(
                client.clone(),
                label,
                ctx.caches.unlinked.clone(),
                triggers.clone(),
                liveness.probe(crate::unlinked::probe_name(label)),
                ctx.metrics.clone(),
            ));
        }
    }
    tasks.push(spawn_leader_trigger(
        leading,
        triggers.clone(),
        client.clone(),
        ctx.clone(),
    ));
    tasks.push(spawn_resync(triggers.clone()));
    tasks.extend(crate::health::auditor::spawn(
        ctx.clone(),
        readiness.clone(),
        shutdown.clone(),
    ));
    tasks
}

/// How often every job is looked at again, changed or not (Events muted for an hour are
/// published again then, and anything a watch missed is caught).
pub const RESYNC: Duration = Duration::from_secs(3600);

/// Sends one trigger for every job each `RESYNC`.
fn spawn_resync(triggers: broadcast::Sender<Trigger>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let start = tokio::time::Instant::now() + RESYNC;
        let mut tick = tokio::time::interval_at(start, RESYNC);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let _ = triggers.send(Trigger::All);
        }
    })
}

/// A new leader looks at every job: as a standby it skipped them. First it reads the Events the
/// leader before it published, so that it updates them rather than publishing them again.
fn spawn_leader_trigger(
    mut leading: watch::Receiver<bool>,
    triggers: broadcast::Sender<Trigger>,
    client: Client,
    ctx: Arc<Context>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while leading.changed().await.is_ok() {
            if *leading.borrow_and_update() {
                remember_published_events(&ctx, published_events(&client).await);
                let _ = triggers.send(Trigger::All);
            }
        }
    })
}

/// The first discovery and (with `events`) the Events an earlier instance published; `None` on
/// shutdown.
async fn first_reads(
    client: &Client,
    kinds: &[&'static crate::workload::JobKind],
    events: bool,
    mut shutdown: watch::Receiver<bool>,
) -> Option<(
    Result<crate::discovery::Served, kube::Error>,
    Option<Vec<k8s_openapi::api::events::v1::Event>>,
)> {
    let published = async {
        if events {
            published_events(client).await
        } else {
            None
        }
    };
    tokio::select! {
        r = futures::future::join(discover(client, kinds), published) => Some(r),
        _ = shutdown.wait_for(|stop| *stop) => None,
    }
}

/// The Events an earlier instance published (listed at start-up); `None` when they could not
/// be read.
async fn published_events(client: &Client) -> Option<Vec<k8s_openapi::api::events::v1::Event>> {
    use k8s_openapi::api::events::v1::Event;
    let api: Api<Event> = Api::all(client.clone());
    let lp = kube::api::ListParams::default().fields("reportingController=podgroup-sync");
    match api.list(&lp).await {
        Ok(list) => Some(list.items),
        Err(e) => {
            warn!(error = %e, "could not read earlier Events; some may be published again");
            None
        }
    }
}

/// Seeds the Event de-duplication with the Events an earlier instance published, so a restart
/// with nothing changed publishes nothing. A failure to list them only costs repeated Events.
fn remember_published_events(
    ctx: &Context,
    published: Option<Vec<k8s_openapi::api::events::v1::Event>>,
) {
    let Some(items) = published else { return };
    let n = items.len();
    ctx.events.remember(items);
    info!(events = n, "remembered Events published earlier");
}

/// The gauges read off the caches, refreshed once per discovery interval.
fn refresh_gauges(
    metrics: &crate::metrics::Metrics,
    caches: &Caches,
    settings: &crate::settings::Settings,
    readiness: &Readiness,
) {
    update_namespace_gauge(metrics, &caches.namespaces, &settings.enablement);
    update_pod_group_gauge(metrics, caches, &settings.backend_options.instance);
    metrics
        .watches
        .stale_caches
        .set(readiness.liveness().stale().len() as i64);
}

/// The broken and infeasible gang gauges, from what the reconciles remember.
fn refresh_health_gauges(metrics: &crate::metrics::Metrics, ctx: &Context) {
    let counts = ctx.health_counts();
    let get = |b: BackendKind, what: &str| counts.get(&(b, what)).copied().unwrap_or(0);
    for b in BACKENDS {
        metrics
            .health
            .broken_gangs
            .with_label_values(&[b.as_str()])
            .set(get(b, "broken"));
        for (label, what) in [("capacity", "infeasible"), ("queue", "queue_unavailable")] {
            metrics
                .health
                .infeasible_gangs
                .with_label_values(&[b.as_str(), label])
                .set(get(b, what));
        }
    }
}

fn update_pod_group_gauge(metrics: &crate::metrics::Metrics, caches: &Caches, instance: &str) {
    let stores = caches.pod_groups.read().expect("lock").clone();
    for b in BACKENDS {
        let mut counts: HashMap<Phase, i64> = HashMap::new();
        if let Some(store) = stores.get(&b) {
            for pg in store.state() {
                if made_by(pg.as_ref(), instance) {
                    let data = pg.data();
                    *counts
                        .entry(b.backend().phase(data.get("status")))
                        .or_default() += 1;
                }
            }
        }
        for phase in Phase::ALL {
            metrics
                .pod_groups
                .by_phase
                .with_label_values(&[b.as_str(), phase.as_str()])
                .set(counts.get(&phase).copied().unwrap_or(0));
        }
    }
}

fn update_namespace_gauge(
    metrics: &crate::metrics::Metrics,
    namespaces: &Store<Namespace>,
    e: &crate::enablement::Enablement,
) {
    let mut counts: HashMap<Mode, i64> = HashMap::new();
    for ns in namespaces.state() {
        *counts
            .entry(e.namespace_mode(ns.metadata.annotations.as_ref()))
            .or_default() += 1;
    }
    for mode in [Mode::Manage, Mode::DryRun] {
        metrics
            .watches
            .managed_namespaces
            .with_label_values(&[mode.as_str()])
            .set(counts.get(&mode).copied().unwrap_or(0));
    }
}

/// Why the controller runtime stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the {0} cache could not sync")]
    CacheSync(&'static str),
}
