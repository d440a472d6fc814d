//! Wiring: discovery of the served job kinds and PodGroup backends, the shared caches, and one
//! kube-runtime `Controller` per served job kind. Kinds and backends whose CRDs appear later are
//! picked up without a restart; ones that disappear are dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::time::Duration;

use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::{LimitRange, Namespace};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use kube::runtime::controller::{self as runtime_controller, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::backend::{BACKENDS, BackendKind, MANAGED_BY_LABEL, MANAGED_BY_VALUE, Phase};
use crate::caches::Caches;
use crate::enablement::Mode;
use crate::events::Events;
use crate::job::{JobKind, KINDS};
use crate::liveness::Liveness;
use crate::reconcile::{self, Context};
use crate::trigger::{Trigger, job_refs};
use crate::watch::{
    LAST_APPLIED, WatchBackoff, settled_objects, spawn_context_cache, spawn_pod_group_cache,
};

/// How long a SIGTERM waits for in-flight reconciles.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Longest wait between discovery attempts after a failure (the first retry is after 1 s).
pub const DISCOVERY_RETRY_MAX: Duration = Duration::from_secs(4);

/// What the API server serves, as far as podgroup-sync cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    pub kinds: BTreeSet<(&'static str, &'static str)>,
    pub backends: BTreeSet<BackendKind>,
}

impl Served {
    pub fn has_kind(&self, kind: &JobKind) -> bool {
        self.kinds.contains(&(kind.kind, kind.version))
    }
}

/// Asks the API server which job kinds and PodGroup backends it serves.
pub async fn discover(client: &Client) -> Result<Served, kube::Error> {
    let mut served = Served::default();
    let mut lists: HashMap<String, Option<Vec<String>>> = HashMap::new();
    let mut resources_of = async |gv: String| -> Result<Option<Vec<String>>, kube::Error> {
        if let Some(r) = lists.get(&gv) {
            return Ok(r.clone());
        }
        let r = match client.list_api_group_resources(&gv).await {
            Ok(list) => Some(list.resources.into_iter().map(|r| r.name).collect()),
            Err(kube::Error::Api(e)) if e.code == 404 => None,
            Err(e) => return Err(e),
        };
        lists.insert(gv, r.clone());
        Ok(r)
    };
    for kind in KINDS {
        // Only one version of a kind (MPIJob) is watched: the first served in table order.
        if served.kinds.iter().any(|(k, _)| *k == kind.kind) {
            continue;
        }
        if resources_of(kind.api_version())
            .await?
            .is_some_and(|r| r.iter().any(|n| n == kind.plural))
        {
            served.kinds.insert((kind.kind, kind.version));
        }
    }
    for b in BACKENDS {
        let ar = b.backend().api_resource();
        if resources_of(ar.api_version.clone())
            .await?
            .is_some_and(|r| r.contains(&ar.plural))
        {
            served.backends.insert(b);
        }
    }
    Ok(served)
}

/// Settings of the controller runtime.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    pub concurrency: u16,
    pub discovery_interval: Duration,
}

/// Readiness: true once discovery ran and every cache — jobs of each watched kind included —
/// is fresh (synced, not relisting, not failing).
#[derive(Clone, Default)]
pub struct Readiness {
    discovered: Arc<AtomicBool>,
    liveness: Liveness,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.not_ready().is_empty()
    }

    /// Why this instance is not ready; empty when it is.
    pub fn not_ready(&self) -> Vec<String> {
        let mut why = Vec::new();
        if !self.discovered.load(Ordering::Relaxed) {
            why.push("CRD discovery has not run".to_string());
        }
        why.extend(self.liveness.stale());
        why
    }

    /// The probes of every watch (for liveness).
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    fn set(&self, v: bool) {
        self.discovered.store(v, Ordering::Relaxed)
    }
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
}

/// The running watches and controllers that discovery starts and stops.
struct Running {
    client: Client,
    ctx: Arc<Context>,
    caches: Caches,
    triggers: broadcast::Sender<Trigger>,
    metrics: Arc<crate::metrics::Metrics>,
    liveness: Liveness,
    concurrency: u16,
    shutdown: watch::Receiver<bool>,
    backends: BTreeMap<BackendKind, JoinHandle<()>>,
    kinds: BTreeMap<(&'static str, &'static str), JoinHandle<()>>,
}

impl Running {
    /// Starts the PodGroup caches of newly served backends and stops those no longer served.
    /// Returns false when a shutdown interrupted it.
    async fn apply_backends(&mut self, served: &Served, first: bool) -> bool {
        for b in BACKENDS {
            let is = served.backends.contains(&b);
            self.metrics
                .backend_served
                .with_label_values(&[b.as_str()])
                .set(is as i64);
            let resource = format!("podgroups.{}", b.backend().group());
            match (is, self.backends.contains_key(&b)) {
                (true, false) => {
                    let (store, h) = spawn_pod_group_cache(
                        self.client.clone(),
                        b,
                        self.triggers.clone(),
                        self.liveness.probe(&resource),
                        self.metrics.clone(),
                        self.caches.owned.clone(),
                    );
                    let synced = tokio::select! {
                        r = store.wait_until_ready() => r.is_ok(),
                        _ = self.shutdown.wait_for(|stop| *stop) => false,
                    };
                    if !synced {
                        self.liveness.retire(&resource);
                        h.abort();
                        if *self.shutdown.borrow() {
                            return false;
                        }
                        warn!(backend = %b, "PodGroup cache could not sync");
                        continue;
                    }
                    self.caches
                        .pod_groups
                        .write()
                        .expect("lock")
                        .insert(b, store);
                    self.backends.insert(b, h);
                    info!(backend = %b, "PodGroup CRD served; watching PodGroups");
                    let _ = self.triggers.send(Trigger::All);
                }
                (false, true) => {
                    self.caches.pod_groups.write().expect("lock").remove(&b);
                    self.liveness.retire(&resource);
                    if let Some(h) = self.backends.remove(&b) {
                        h.abort();
                    }
                    warn!(backend = %b, "PodGroup CRD no longer served");
                }
                (false, false) if first => {
                    warn!(backend = %b, crd = %b.backend().api_resource().api_version, "PodGroup CRD not served; jobs that want this backend get a BackendUnavailable event until it is");
                }
                _ => {}
            }
        }
        true
    }

    /// Starts a controller for each newly served job kind and stops those no longer served.
    fn apply_kinds(&mut self, served: &Served, first: bool) {
        for kind in KINDS {
            let key = (kind.kind, kind.version);
            let is = served.has_kind(kind);
            for (label, v) in [("true", is), ("false", !is)] {
                self.metrics
                    .watched_kinds
                    .with_label_values(&[kind.kind, kind.version, label])
                    .set(v as i64);
            }
            match (is, self.kinds.contains_key(&key)) {
                (true, false) => {
                    let h = spawn_kind_controller(
                        self.client.clone(),
                        kind,
                        self.ctx.clone(),
                        self.triggers.subscribe(),
                        self.concurrency,
                        self.shutdown.clone(),
                        &self.liveness,
                    );
                    self.kinds.insert(key, h);
                    info!(kind = kind.kind, version = kind.version, "watching jobs");
                }
                (false, true) => {
                    self.liveness.retire(&kind_resource(kind));
                    if let Some(h) = self.kinds.remove(&key) {
                        h.abort();
                    }
                    warn!(
                        kind = kind.kind,
                        version = kind.version,
                        "CRD no longer served; stopped watching"
                    );
                }
                (false, false) if first => {
                    info!(
                        kind = kind.kind,
                        version = kind.version,
                        "CRD not served; skipped until it is"
                    );
                }
                _ => {}
            }
        }
    }

    /// Lets in-flight reconciles finish (up to the grace period), then stops every task.
    async fn stop(self, others: Vec<JoinHandle<()>>) {
        // The controllers saw the shutdown signal and stop after their in-flight reconciles.
        for ((kind, _), mut h) in self.kinds {
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut h).await.is_err() {
                warn!(
                    kind,
                    "reconciles still running after {}s; stopping them",
                    SHUTDOWN_GRACE.as_secs()
                );
                h.abort();
            }
        }
        for h in self.backends.into_values().chain(others) {
            h.abort();
        }
    }
}

/// The context caches every reconcile reads.
struct ContextCaches {
    namespaces: Store<Namespace>,
    limit_ranges: Store<LimitRange>,
    priority_classes: Store<PriorityClass>,
    runtime_classes: Store<RuntimeClass>,
    tasks: Vec<JoinHandle<()>>,
}

fn spawn_context_caches(
    client: &Client,
    triggers: &broadcast::Sender<Trigger>,
    liveness: &Liveness,
    metrics: &Arc<crate::metrics::Metrics>,
) -> ContextCaches {
    let (namespaces, h1) = spawn_context_cache(
        Api::<Namespace>::all(client.clone()),
        triggers.clone(),
        // Any namespace change may flip its mode or backend.
        |n: &Namespace| Some(Trigger::Namespace(n.name_any())),
        liveness.probe("namespaces"),
        metrics.clone(),
    );
    let (limit_ranges, h2) = spawn_context_cache(
        Api::<LimitRange>::all(client.clone()),
        triggers.clone(),
        |l: &LimitRange| l.namespace().map(Trigger::Namespace),
        liveness.probe("limitranges"),
        metrics.clone(),
    );
    let (priority_classes, h3) = spawn_context_cache(
        Api::<PriorityClass>::all(client.clone()),
        triggers.clone(),
        |_| Some(Trigger::All),
        liveness.probe("priorityclasses"),
        metrics.clone(),
    );
    let (runtime_classes, h4) = spawn_context_cache(
        Api::<RuntimeClass>::all(client.clone()),
        triggers.clone(),
        |_| Some(Trigger::All),
        liveness.probe("runtimeclasses"),
        metrics.clone(),
    );
    ContextCaches {
        namespaces,
        limit_ranges,
        priority_classes,
        runtime_classes,
        tasks: vec![h1, h2, h3, h4],
    }
}

impl ContextCaches {
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
    } = signals;
    let liveness = readiness.liveness().clone();
    let (triggers, _) = broadcast::channel::<Trigger>(16_384);
    let context = spawn_context_caches(&client, &triggers, &liveness, &metrics);
    // A cache that cannot load (e.g. RBAC forbids the list) keeps readiness false; SIGTERM
    // still stops the process at once.
    tokio::select! {
        failed = context.synced() => if let Some(what) = failed {
            return Err(RunError::CacheSync(what));
        },
        _ = shutdown.wait_for(|stop| *stop) => {
            info!("shut down before the caches synced");
            for h in context.tasks {
                h.abort();
            }
            return Ok(());
        }
    }
    info!("namespace, LimitRange, PriorityClass and RuntimeClass caches synced");
    let ContextCaches {
        namespaces,
        limit_ranges,
        priority_classes,
        runtime_classes,
        mut tasks,
    } = context;
    let caches = Caches {
        namespaces: namespaces.clone(),
        limit_ranges,
        priority_classes,
        runtime_classes,
        pod_groups: Default::default(),
        owned: Default::default(),
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
    remember_published_events(&client, &ctx).await;
    tasks.push(spawn_leader_trigger(leading, triggers.clone()));

    let mut running = Running {
        client: client.clone(),
        ctx,
        caches: caches.clone(),
        triggers,
        metrics: metrics.clone(),
        liveness,
        concurrency: rt.concurrency,
        shutdown: shutdown.clone(),
        backends: BTreeMap::new(),
        kinds: BTreeMap::new(),
    };
    let mut last_served: Option<Served> = None;
    let mut failures: u32 = 0;
    loop {
        let mut wait = rt.discovery_interval;
        match discover(&client).await {
            Ok(served) => {
                failures = 0;
                if last_served.as_ref() != Some(&served) {
                    let first = last_served.is_none();
                    // Backends first: a job controller needs the PodGroup cache of its backend.
                    if !running.apply_backends(&served, first).await {
                        break;
                    }
                    running.apply_kinds(&served, first);
                    last_served = Some(served);
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
        update_namespace_gauge(&metrics, &namespaces, &ctx_settings.enablement);
        update_pod_group_gauge(&metrics, &caches);
        metrics
            .stale_caches
            .set(readiness.liveness().stale().len() as i64);
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

/// The wait before discovery attempt `failures + 1`: 1 s doubling to [`DISCOVERY_RETRY_MAX`].
pub fn discovery_retry(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(8);
    (Duration::from_secs(1) * 2u32.pow(doublings)).min(DISCOVERY_RETRY_MAX)
}

/// A new leader looks at every job: as a standby it skipped them.
fn spawn_leader_trigger(
    mut leading: watch::Receiver<bool>,
    triggers: broadcast::Sender<Trigger>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while leading.changed().await.is_ok() {
            if *leading.borrow_and_update() {
                let _ = triggers.send(Trigger::All);
            }
        }
    })
}

/// Seeds the Event de-duplication with the Events an earlier instance published, so a restart
/// with nothing changed publishes nothing. A failure only costs repeated Events.
async fn remember_published_events(client: &Client, ctx: &Context) {
    use k8s_openapi::api::events::v1::Event;
    let api: Api<Event> = Api::all(client.clone());
    let lp = kube::api::ListParams::default().fields("reportingController=podgroup-sync");
    match api.list(&lp).await {
        Ok(list) => {
            let n = list.items.len();
            ctx.events.remember(
                list.items.into_iter().filter_map(|e| {
                    Some((e.regarding?.uid?, e.reason?, e.note.unwrap_or_default()))
                }),
            );
            info!(events = n, "remembered Events published earlier");
        }
        Err(e) => warn!(error = %e, "could not read earlier Events; some may be published again"),
    }
}

fn update_pod_group_gauge(metrics: &crate::metrics::Metrics, caches: &Caches) {
    let stores = caches.pod_groups.read().expect("lock").clone();
    for b in BACKENDS {
        let mut counts: HashMap<Phase, i64> = HashMap::new();
        if let Some(store) = stores.get(&b) {
            for pg in store.state() {
                let ours = pg
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(MANAGED_BY_LABEL))
                    .is_some_and(|v| v == MANAGED_BY_VALUE);
                if ours {
                    *counts
                        .entry(b.backend().phase(pg.data.get("status")))
                        .or_default() += 1;
                }
            }
        }
        for phase in Phase::ALL {
            metrics
                .podgroups
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
            .managed_namespaces
            .with_label_values(&[mode.as_str()])
            .set(counts.get(&mode).copied().unwrap_or(0));
    }
}

/// The liveness name of a job kind's watch, e.g. `pytorchjobs.kubeflow.org/v1`.
fn kind_resource(kind: &JobKind) -> String {
    format!("{}.{}/{}", kind.plural, kind.group, kind.version)
}

fn spawn_kind_controller(
    client: Client,
    kind: &'static JobKind,
    ctx: Arc<Context>,
    triggers: broadcast::Receiver<Trigger>,
    concurrency: u16,
    mut shutdown: watch::Receiver<bool>,
    liveness: &Liveness,
) -> JoinHandle<()> {
    let ar = ApiResource {
        group: kind.group.into(),
        version: kind.version.into(),
        api_version: kind.api_version(),
        kind: kind.kind.into(),
        plural: kind.plural.into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let jobs = writer.as_reader();
    let probe = liveness.probe(kind_resource(kind));
    let watch_probe = probe.clone();
    let watch_metrics = ctx.metrics.clone();
    // The cache keeps what a reconcile reads: field-manager bookkeeping and the last-applied
    // copy of the whole job are dropped (they can double a job's size). Jobs reach the queue
    // only once the cache holds them (see `settled_objects`).
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .backoff(WatchBackoff::default())
        // A job relist needs no trigger: `settled_objects` hands every job on at its end.
        .inspect(move |event| {
            crate::watch::observe(&watch_probe, &watch_metrics, event);
        })
        .modify(|job: &mut DynamicObject| {
            job.metadata.managed_fields = None;
            if let Some(a) = job.metadata.annotations.as_mut() {
                a.remove(LAST_APPLIED);
            }
        })
        .reflect(writer);
    let stream = settled_objects(stream, jobs.clone());
    // The controller backs its input off once more after every error; without a backoff of
    // ours, its default one (up to 30 s) delays the watch's own reconnects after a fault.
    let controller = Controller::for_stream_with(stream, jobs.clone(), ar.clone())
        .with_config(runtime_controller::Config::default().concurrency(concurrency))
        .trigger_backoff(WatchBackoff::default());
    let controller = controller
        .reconcile_on(job_refs(triggers, jobs, kind, ar))
        .graceful_shutdown_on(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        });
    let metrics = ctx.metrics.clone();
    tokio::spawn(async move {
        let _guard = probe.task_guard();
        controller
            .run(
                move |obj, ctx| reconcile::reconcile(obj, ctx, kind),
                reconcile::error_policy,
                ctx,
            )
            .for_each(|result| {
                if let Err(e) = result {
                    report_controller_error(&metrics, kind, e);
                }
                future::ready(())
            })
            .await;
    })
}

/// Logs and counts what a job controller's run stream reports besides success. Reconcile
/// errors were logged by the error policy and are retried there.
fn report_controller_error(
    metrics: &crate::metrics::Metrics,
    kind: &JobKind,
    e: runtime_controller::Error<reconcile::Error, watcher::Error>,
) {
    use runtime_controller::Error as E;
    match e {
        E::ReconcilerFailed(..) => {}
        // Queued but gone from the cache: the job was deleted before its turn. (Before a
        // relist completed this also happened to jobs still in the list; see `watch`.)
        E::ObjectNotFound(obj) => {
            metrics
                .reconcile_errors
                .with_label_values(&[kind.kind, "not_found"])
                .inc();
            info!(object = %obj, "job queued for reconcile is no longer in the cache; skipped");
        }
        // Counted and logged where the watch stream is observed.
        E::QueueError(_) => {}
        E::RunnerError(e) => {
            metrics
                .reconcile_errors
                .with_label_values(&[kind.kind, "runner"])
                .inc();
            warn!(kind = kind.kind, error = %e, "reconcile runner error");
        }
    }
}

/// Why the controller runtime stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the {0} cache could not sync")]
    CacheSync(&'static str),
}
