//! Wiring: discovery of the served job kinds and PodGroup backends, the shared caches, and one
//! kube-runtime `Controller` per served job kind. Kinds and backends whose CRDs appear later are
//! picked up without a restart; ones that disappear are dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::time::Duration;

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::{LimitRange, Namespace};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::backend::{BACKENDS, BackendKind, MANAGED_BY_LABEL, MANAGED_BY_VALUE, Phase};
use crate::enablement::Mode;
use crate::job::{JobKind, KINDS};
use crate::reconcile::{self, Caches, Context};

/// How long a SIGTERM waits for in-flight reconciles.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A reason to look at jobs again, sent by the context watchers to every job controller.
#[derive(Debug, Clone)]
pub enum Trigger {
    /// Everything in a namespace (its annotations or LimitRanges changed).
    Namespace(String),
    /// Every job (a PriorityClass, RuntimeClass or served backend changed).
    All,
    /// One job, named by a PodGroup's controller reference.
    Job {
        api_version: String,
        kind: String,
        namespace: String,
        name: String,
    },
}

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

/// Runs a reflector for `api` and feeds every change into `triggers` through `to_trigger`.
fn spawn_reflector<K>(
    api: Api<K>,
    wc: watcher::Config,
    triggers: broadcast::Sender<Trigger>,
    to_trigger: impl Fn(&K) -> Option<Trigger> + Send + Sync + 'static,
    metrics: Arc<crate::metrics::Metrics>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, wc))
        .default_backoff()
        .touched_objects();
    let handle = tokio::spawn(async move {
        stream
            .for_each(|ev| {
                match ev {
                    Ok(obj) => {
                        if let Some(t) = to_trigger(&obj) {
                            let _ = triggers.send(t);
                        }
                    }
                    Err(e) => {
                        let resource = K::plural(&()).to_string();
                        metrics.watch_errors.with_label_values(&[&resource]).inc();
                        warn!(%resource, error = %e, "watch error");
                    }
                }
                future::ready(())
            })
            .await;
    });
    (reader, handle)
}

/// A PodGroup cache for one backend; changes requeue the owning job, deletions included.
fn spawn_pod_group_reflector(
    client: Client,
    backend: BackendKind,
    triggers: broadcast::Sender<Trigger>,
    metrics: Arc<crate::metrics::Metrics>,
    owned: reconcile::OwnedIndex,
) -> (Store<DynamicObject>, JoinHandle<()>) {
    let ar = backend.backend().api_resource();
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let reader = writer.as_reader();
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    // Only what podgroup-sync reads is kept in memory.
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|pg: &mut DynamicObject| {
            if let Some(a) = pg.metadata.annotations.as_mut() {
                a.remove(LAST_APPLIED);
            }
            // Its own field-manager entry says which fields it applied; the others are not read.
            if let Some(m) = pg.metadata.managed_fields.as_mut() {
                m.retain(|e| e.manager.as_deref() == Some(reconcile::FIELD_MANAGER));
            }
        });
    let stream = reflector::reflector(writer, stream);
    let handle = tokio::spawn(async move {
        stream
            .for_each(|ev| {
                match ev {
                    Ok(
                        ref ev @ (watcher::Event::Apply(ref pg)
                        | watcher::Event::Delete(ref pg)
                        | watcher::Event::InitApply(ref pg)),
                    ) => {
                        owned.observe(backend, pg, matches!(ev, watcher::Event::Delete(_)));
                        if let Some(t) = owner_trigger(pg) {
                            let _ = triggers.send(t);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let resource = format!("podgroups.{}", backend.backend().group());
                        metrics.watch_errors.with_label_values(&[&resource]).inc();
                        warn!(%resource, error = %e, "PodGroup watch error");
                    }
                }
                future::ready(())
            })
            .await;
    });
    (reader, handle)
}

fn owner_trigger(pg: &DynamicObject) -> Option<Trigger> {
    let owner = pg
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    Some(Trigger::Job {
        api_version: owner.api_version.clone(),
        kind: owner.kind.clone(),
        namespace: pg.namespace()?,
        name: owner.name.clone(),
    })
}

/// Turns triggers into the job references one kind's controller should reconcile.
fn job_refs(
    triggers: broadcast::Receiver<Trigger>,
    jobs: Store<DynamicObject>,
    kind: &'static JobKind,
    ar: ApiResource,
) -> impl Stream<Item = ObjectRef<DynamicObject>> + Send + 'static {
    tokio_stream_from(triggers).flat_map(move |t| {
        let refs: Vec<ObjectRef<DynamicObject>> = match t {
            Some(Trigger::Job {
                api_version,
                kind: k,
                namespace,
                name,
            }) if k == kind.kind && api_version == kind.api_version() => {
                vec![ObjectRef::new_with(&name, ar.clone()).within(&namespace)]
            }
            Some(Trigger::Job { .. }) => vec![],
            Some(Trigger::Namespace(ns)) => jobs
                .state()
                .iter()
                .filter(|j| j.metadata.namespace.as_deref() == Some(ns.as_str()))
                .map(|j| ObjectRef::from_obj_with(j.as_ref(), ar.clone()))
                .collect(),
            // `None`: the receiver lagged and lost triggers; look at everything.
            Some(Trigger::All) | None => jobs
                .state()
                .iter()
                .map(|j| ObjectRef::from_obj_with(j.as_ref(), ar.clone()))
                .collect(),
        };
        futures::stream::iter(refs)
    })
}

/// A broadcast receiver as a stream; a lag becomes `None` ("you missed something").
fn tokio_stream_from(
    rx: broadcast::Receiver<Trigger>,
) -> impl Stream<Item = Option<Trigger>> + Send {
    futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(t) => Some((Some(t), rx)),
            Err(broadcast::error::RecvError::Lagged(_)) => Some((None, rx)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    })
}

/// Settings of the controller runtime.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    pub concurrency: u16,
    pub discovery_interval: Duration,
}

/// Readiness: true once discovery ran and every cache — jobs of each watched kind included —
/// synced.
#[derive(Clone, Default)]
pub struct Readiness {
    discovered: Arc<AtomicBool>,
    unsynced_job_caches: Arc<std::sync::atomic::AtomicUsize>,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.discovered.load(Ordering::Relaxed)
            && self.unsynced_job_caches.load(Ordering::Relaxed) == 0
    }
    fn set(&self, v: bool) {
        self.discovered.store(v, Ordering::Relaxed)
    }
    /// Holds readiness back until the returned gate opens: at a job cache's first complete
    /// list, or when its watch is dropped (its CRD went away).
    fn track(&self) -> JobCacheGate {
        self.unsynced_job_caches.fetch_add(1, Ordering::Relaxed);
        JobCacheGate {
            unsynced: self.unsynced_job_caches.clone(),
            opened: std::sync::Once::new(),
        }
    }
}

/// See [`Readiness::track`].
struct JobCacheGate {
    unsynced: Arc<std::sync::atomic::AtomicUsize>,
    opened: std::sync::Once,
}

impl JobCacheGate {
    fn open(&self) {
        self.opened.call_once(|| {
            self.unsynced.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

impl Drop for JobCacheGate {
    fn drop(&mut self) {
        self.open();
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
    pub in_flight: Arc<reconcile::InFlight>,
}

/// Runs discovery, caches and controllers until `signals.shutdown` turns true.
pub async fn run(
    client: Client,
    ctx_settings: reconcile::Settings,
    rt: RuntimeSettings,
    recorder: kube::runtime::events::Recorder,
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
    let (triggers, _) = broadcast::channel::<Trigger>(16_384);
    let mut tasks = Vec::new();
    let (namespaces, h) = spawn_reflector(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
        triggers.clone(),
        // Any namespace change may flip its mode or backend.
        |n: &Namespace| Some(Trigger::Namespace(n.name_any())),
        metrics.clone(),
    );
    tasks.push(h);
    let (limit_ranges, h) = spawn_reflector(
        Api::<LimitRange>::all(client.clone()),
        watcher::Config::default(),
        triggers.clone(),
        |l: &LimitRange| l.namespace().map(Trigger::Namespace),
        metrics.clone(),
    );
    tasks.push(h);
    let (priority_classes, h) = spawn_reflector(
        Api::<PriorityClass>::all(client.clone()),
        watcher::Config::default(),
        triggers.clone(),
        |_| Some(Trigger::All),
        metrics.clone(),
    );
    tasks.push(h);
    let (runtime_classes, h) = spawn_reflector(
        Api::<RuntimeClass>::all(client.clone()),
        watcher::Config::default(),
        triggers.clone(),
        |_| Some(Trigger::All),
        metrics.clone(),
    );
    tasks.push(h);
    let synced = async {
        let waits = [
            ("namespaces", namespaces.wait_until_ready().await.is_ok()),
            ("limitranges", limit_ranges.wait_until_ready().await.is_ok()),
            (
                "priorityclasses",
                priority_classes.wait_until_ready().await.is_ok(),
            ),
            (
                "runtimeclasses",
                runtime_classes.wait_until_ready().await.is_ok(),
            ),
        ];
        waits.into_iter().find(|(_, ok)| !ok).map(|(what, _)| what)
    };
    // A cache that cannot load (e.g. RBAC forbids the list) keeps readiness false; SIGTERM
    // still stops the process at once.
    tokio::select! {
        failed = synced => if let Some(what) = failed {
            return Err(RunError::CacheSync(what));
        },
        _ = shutdown.wait_for(|stop| *stop) => {
            info!("shut down before the caches synced");
            for h in tasks {
                h.abort();
            }
            return Ok(());
        }
    }
    info!("namespace, LimitRange, PriorityClass and RuntimeClass caches synced");

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
        recorder,
        metrics.clone(),
        leading.clone(),
        in_flight,
    ));
    remember_published_events(&client, &ctx).await;
    // A new leader looks at every job: as a standby it skipped them.
    tasks.push(tokio::spawn({
        let mut leading = leading.clone();
        let triggers = triggers.clone();
        async move {
            while leading.changed().await.is_ok() {
                if *leading.borrow_and_update() {
                    let _ = triggers.send(Trigger::All);
                }
            }
        }
    }));

    let mut backend_tasks: BTreeMap<BackendKind, JoinHandle<()>> = BTreeMap::new();
    let mut kind_tasks: BTreeMap<(&'static str, &'static str), JoinHandle<()>> = BTreeMap::new();
    let mut first = true;
    let mut last_served: Option<Served> = None;
    'discovery: loop {
        match discover(&client).await {
            Ok(served) => {
                if last_served.as_ref() != Some(&served) {
                    // Backends first: a job controller needs the PodGroup cache of its backend.
                    for b in BACKENDS {
                        let is = served.backends.contains(&b);
                        metrics
                            .backend_served
                            .with_label_values(&[b.as_str()])
                            .set(is as i64);
                        match (is, backend_tasks.contains_key(&b)) {
                            (true, false) => {
                                let (store, h) = spawn_pod_group_reflector(
                                    client.clone(),
                                    b,
                                    triggers.clone(),
                                    metrics.clone(),
                                    caches.owned.clone(),
                                );
                                let synced = tokio::select! {
                                    r = store.wait_until_ready() => r.is_ok(),
                                    _ = shutdown.wait_for(|stop| *stop) => false,
                                };
                                if !synced {
                                    h.abort();
                                    if *shutdown.borrow() {
                                        break 'discovery;
                                    }
                                    warn!(backend = %b, "PodGroup cache could not sync");
                                    continue;
                                }
                                caches.pod_groups.write().expect("lock").insert(b, store);
                                backend_tasks.insert(b, h);
                                info!(backend = %b, "PodGroup CRD served; watching PodGroups");
                                let _ = triggers.send(Trigger::All);
                            }
                            (false, true) => {
                                caches.pod_groups.write().expect("lock").remove(&b);
                                if let Some(h) = backend_tasks.remove(&b) {
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
                    for kind in KINDS {
                        let key = (kind.kind, kind.version);
                        let is = served.has_kind(kind);
                        metrics
                            .watched_kinds
                            .with_label_values(&[
                                kind.kind,
                                kind.version,
                                if is { "true" } else { "false" },
                            ])
                            .set(1);
                        metrics
                            .watched_kinds
                            .with_label_values(&[
                                kind.kind,
                                kind.version,
                                if is { "false" } else { "true" },
                            ])
                            .set(0);
                        match (is, kind_tasks.contains_key(&key)) {
                            (true, false) => {
                                let h = spawn_kind_controller(
                                    client.clone(),
                                    kind,
                                    ctx.clone(),
                                    triggers.subscribe(),
                                    rt.concurrency,
                                    shutdown.clone(),
                                    &readiness,
                                );
                                kind_tasks.insert(key, h);
                                info!(kind = kind.kind, version = kind.version, "watching jobs");
                            }
                            (false, true) => {
                                if let Some(h) = kind_tasks.remove(&key) {
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
                    last_served = Some(served);
                }
                if first {
                    readiness.set(true);
                    first = false;
                }
            }
            Err(e) => warn!(error = %e, "discovery failed; retrying"),
        }
        update_namespace_gauge(&metrics, &namespaces, &ctx_settings.enablement);
        update_pod_group_gauge(&metrics, &caches);
        heartbeat.store(
            k8s_openapi::jiff::Timestamp::now().as_second(),
            Ordering::Relaxed,
        );
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            _ = tokio::time::sleep(rt.discovery_interval) => {}
        }
    }
    info!("shutting down: finishing in-flight reconciles");
    readiness.set(false);
    // The controllers saw the same signal and stop after their in-flight reconciles.
    for ((kind, _), mut h) in kind_tasks {
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut h).await.is_err() {
            warn!(
                kind,
                "reconciles still running after {}s; stopping them",
                SHUTDOWN_GRACE.as_secs()
            );
            h.abort();
        }
    }
    for h in backend_tasks.into_values().chain(tasks) {
        h.abort();
    }
    Ok(())
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
            ctx.remember_events(
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

fn spawn_kind_controller(
    client: Client,
    kind: &'static JobKind,
    ctx: Arc<Context>,
    triggers: broadcast::Receiver<Trigger>,
    concurrency: u16,
    mut shutdown: watch::Receiver<bool>,
    readiness: &Readiness,
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
    // The cache keeps what a reconcile reads: field-manager bookkeeping and the last-applied
    // copy of the whole job are dropped (they can double a job's size).
    // Readiness follows the watcher's own end-of-initial-list event.
    let gate = readiness.track();
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .inspect(move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                gate.open();
            }
        })
        .modify(|job: &mut DynamicObject| {
            job.metadata.managed_fields = None;
            if let Some(a) = job.metadata.annotations.as_mut() {
                a.remove(LAST_APPLIED);
            }
        })
        .reflect(writer)
        .applied_objects();
    let controller = Controller::for_stream_with(stream, jobs.clone(), ar.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency));
    let controller = controller
        .reconcile_on(job_refs(triggers, jobs, kind, ar))
        .graceful_shutdown_on(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        });
    let metrics = ctx.metrics.clone();
    tokio::spawn(async move {
        controller
            .run(
                move |obj, ctx| reconcile::reconcile(obj, ctx, kind),
                reconcile::error_policy,
                ctx,
            )
            .for_each(|result| {
                // Reconcile errors are logged by the error policy; watch errors are logged here.
                if let Err(kube::runtime::controller::Error::QueueError(e)) = result {
                    metrics.watch_errors.with_label_values(&[kind.plural]).inc();
                    warn!(resource = kind.plural, error = %e, "watch error");
                }
                future::ready(())
            })
            .await;
    })
}

/// Why the controller runtime stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the {0} cache could not sync")]
    CacheSync(&'static str),
}
