//! The watches and job controllers that discovery starts and stops: one PodGroup cache per served
//! backend, one kube-runtime `Controller` per served job kind.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, future};
use kube::runtime::controller::{self as runtime_controller, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::backend::{BACKENDS, BackendKind};
use crate::caches::Caches;
use crate::discovery::{Changes, Served, changes};
use crate::fifo::Fifo;
use crate::job::{JobKind, KINDS};
use crate::lean::LeanJob;
use crate::liveness::Liveness;
use crate::metrics::Metrics;
use crate::packed::Packed;
use crate::reconcile::{self, Context};
use crate::trigger::{Trigger, job_refs};
use crate::watch::{WatchBackoff, reflect_settled, spawn_pod_group_cache};

/// The liveness name of the Volcano Queue watch.
const QUEUES: &str = "queues.scheduling.volcano.sh";

/// How long a SIGTERM waits for in-flight reconciles.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// The running watches and controllers.
pub struct Running {
    pub client: Client,
    pub ctx: Arc<Context>,
    pub caches: Caches,
    pub triggers: broadcast::Sender<Trigger>,
    pub metrics: Arc<Metrics>,
    pub liveness: Liveness,
    pub concurrency: u16,
    pub shutdown: watch::Receiver<bool>,
    backends: BTreeMap<BackendKind, JoinHandle<()>>,
    kinds: BTreeMap<(&'static str, &'static str), JoinHandle<()>>,
    /// Whether a discovery was applied before (what is absent is logged once, at the first).
    applied_once: bool,
    /// The Volcano Queue cache of the feasibility check, while Volcano is served.
    queues: Option<JoinHandle<()>>,
    /// The Workload watch, while Kueue is served (SPEC §12).
    kueue: Option<JoinHandle<()>>,
    /// The HyperNode watch, while HyperNodes are served (SPEC §13).
    hyper_nodes: Option<JoinHandle<()>>,
}

impl Running {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        ctx: Arc<Context>,
        caches: Caches,
        triggers: broadcast::Sender<Trigger>,
        metrics: Arc<Metrics>,
        liveness: Liveness,
        concurrency: u16,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Running {
            client,
            ctx,
            caches,
            triggers,
            metrics,
            liveness,
            concurrency,
            shutdown,
            backends: BTreeMap::new(),
            kinds: BTreeMap::new(),
            applied_once: false,
            queues: None,
            kueue: None,
            hyper_nodes: None,
        }
    }

    /// What runs now, in the terms of a discovery.
    fn running(&self) -> Served {
        Served {
            kinds: self.kinds.keys().copied().collect(),
            backends: self.backends.keys().copied().collect(),
            kueue: self.kueue.is_some(),
            hyper_nodes: self.hyper_nodes.is_some(),
        }
    }

    /// Makes what runs match what is served. Backends first: a job controller needs the
    /// PodGroup cache of its backend. Returns false when a shutdown interrupted it.
    pub async fn apply(&mut self, served: &Served) -> bool {
        self.set_gauges(served);
        if !self.applied_once {
            self.applied_once = true;
            log_absent(served);
        }
        let Changes {
            start_backends,
            stop_backends,
            start_kinds,
            stop_kinds,
            kueue,
            hyper_nodes,
        } = changes(&self.running(), served);
        match kueue {
            Some(true) => self.start_kueue(),
            Some(false) => self.stop_kueue(),
            None => {}
        }
        match hyper_nodes {
            Some(true) => self.start_hyper_nodes(),
            Some(false) => self.stop_hyper_nodes(),
            None => {}
        }
        for b in stop_backends {
            self.stop_backend(b);
        }
        if !self.start_backends(start_backends).await {
            return false;
        }
        for kind in stop_kinds {
            self.stop_kind(kind);
        }
        for kind in start_kinds {
            self.start_kind(kind);
        }
        true
    }

    fn set_gauges(&self, served: &Served) {
        for b in BACKENDS {
            let is = served.backends.contains(&b);
            self.metrics
                .pod_groups
                .backend_served
                .with_label_values(&[b.as_str()])
                .set(is as i64);
        }
        for kind in KINDS {
            let is = served.has_kind(kind);
            for (label, v) in [("true", is), ("false", !is)] {
                self.metrics
                    .watches
                    .watched_kinds
                    .with_label_values(&[kind.kind, kind.version, label])
                    .set(v as i64);
            }
        }
    }

    /// Starts the PodGroup caches of these backends, listing at once, and waits for them to
    /// sync; one that cannot is tried again at the next discovery. False when a shutdown
    /// interrupted the wait.
    async fn start_backends(&mut self, backends: Vec<BackendKind>) -> bool {
        if backends.is_empty() {
            return true;
        }
        let spawned: Vec<_> = backends
            .into_iter()
            .map(|b| {
                let (store, h) = spawn_pod_group_cache(
                    self.client.clone(),
                    b,
                    self.triggers.clone(),
                    self.liveness.probe(backend_resource(b)),
                    self.metrics.clone(),
                    self.caches.owned.clone(),
                    self.caches.own_writes.clone(),
                );
                (b, store, h)
            })
            .collect();
        let waits = future::join_all(spawned.iter().map(|(_, s, _)| s.wait_until_ready()));
        let synced = tokio::select! {
            r = waits => Some(r),
            _ = self.shutdown.wait_for(|stop| *stop) => None,
        };
        let Some(synced) = synced else {
            for (b, _, h) in spawned {
                self.liveness.retire(&backend_resource(b));
                h.abort();
            }
            return false;
        };
        for ((b, store, h), r) in spawned.into_iter().zip(synced) {
            if r.is_err() {
                self.liveness.retire(&backend_resource(b));
                h.abort();
                warn!(backend = %b, "PodGroup cache could not sync; trying again at the next discovery");
                continue;
            }
            self.started_backend(b, store, h);
        }
        let _ = self.triggers.send(Trigger::All);
        true
    }

    /// Makes a synced PodGroup cache the one reconciles read.
    fn started_backend(
        &mut self,
        b: BackendKind,
        store: reflector::Store<Packed>,
        h: JoinHandle<()>,
    ) {
        self.caches
            .pod_groups
            .write()
            .expect("lock")
            .insert(b, store);
        self.backends.insert(b, h);
        info!(backend = %b, "PodGroup CRD served; watching PodGroups");
        if let (BackendKind::Volcano, Some(c)) = (b, &self.caches.capacity) {
            let probe = self.liveness.probe(QUEUES);
            self.queues = Some(c.spawn_queues(&self.client, probe, self.metrics.clone()));
        }
    }

    fn stop_backend(&mut self, b: BackendKind) {
        if let (BackendKind::Volcano, Some(c)) = (b, &self.caches.capacity) {
            c.stop_queues();
            self.liveness.retire(QUEUES);
            if let Some(h) = self.queues.take() {
                h.abort();
            }
        }
        self.caches.pod_groups.write().expect("lock").remove(&b);
        self.liveness.retire(&backend_resource(b));
        if let Some(h) = self.backends.remove(&b) {
            h.abort();
        }
        warn!(backend = %b, "PodGroup CRD no longer served");
    }

    fn start_kueue(&mut self) {
        let probe = self.liveness.probe(crate::kueue::watch::RESOURCE);
        self.kueue = Some(crate::kueue::watch::spawn(
            self.client.clone(),
            self.caches.kueue.clone(),
            self.triggers.clone(),
            probe,
            self.metrics.clone(),
        ));
        info!("Kueue's Workload CRD served; watching Workloads");
    }

    fn stop_kueue(&mut self) {
        if let Some(h) = self.kueue.take() {
            h.abort();
        }
        self.liveness.retire(crate::kueue::watch::RESOURCE);
        self.caches.kueue.clear();
        let _ = self.triggers.send(Trigger::All);
        warn!("Kueue's Workload CRD no longer served; stopped watching Workloads");
    }

    fn start_hyper_nodes(&mut self) {
        let probe = self.liveness.probe(crate::tiers::RESOURCE);
        self.hyper_nodes = Some(crate::tiers::spawn(
            self.client.clone(),
            self.caches.tiers.clone(),
            self.triggers.clone(),
            probe,
            self.metrics.clone(),
        ));
        info!("Volcano's HyperNode CRD served; watching HyperNode tiers");
    }

    fn stop_hyper_nodes(&mut self) {
        if let Some(h) = self.hyper_nodes.take() {
            h.abort();
        }
        self.liveness.retire(crate::tiers::RESOURCE);
        if self.caches.tiers.clear() {
            let _ = self.triggers.send(Trigger::All);
        }
        warn!("Volcano's HyperNode CRD no longer served; stopped watching HyperNodes");
    }

    fn start_kind(&mut self, kind: &'static JobKind) {
        let (h, store) = spawn_kind_controller(
            self.client.clone(),
            kind,
            self.ctx.clone(),
            self.triggers.subscribe(),
            self.concurrency,
            self.shutdown.clone(),
            &self.liveness,
        );
        self.kinds.insert((kind.kind, kind.version), h);
        self.caches
            .jobs
            .write()
            .expect("lock")
            .insert((kind.kind, kind.version), store);
        info!(kind = kind.kind, version = kind.version, "watching jobs");
    }

    fn stop_kind(&mut self, kind: &'static JobKind) {
        self.caches
            .jobs
            .write()
            .expect("lock")
            .remove(&(kind.kind, kind.version));
        self.liveness.retire(&kind_resource(kind));
        if let Some(h) = self.kinds.remove(&(kind.kind, kind.version)) {
            h.abort();
        }
        warn!(
            kind = kind.kind,
            version = kind.version,
            "CRD no longer served; stopped watching"
        );
    }

    /// Lets in-flight reconciles finish (up to the grace period), then stops every task.
    pub async fn stop(self, others: Vec<JoinHandle<()>>) {
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
        for h in self
            .backends
            .into_values()
            .chain(others)
            .chain(self.queues)
            .chain(self.kueue)
            .chain(self.hyper_nodes)
        {
            h.abort();
        }
    }
}

/// One line for each kind and backend the first discovery did not find.
fn log_absent(served: &Served) {
    for b in BACKENDS
        .into_iter()
        .filter(|b| !served.backends.contains(b))
    {
        warn!(backend = %b, crd = %b.backend().api_resource().api_version, "PodGroup CRD not served; jobs that want this backend get a BackendUnavailable event until it is");
    }
    for kind in KINDS.iter().filter(|k| !served.has_kind(k)) {
        // Only one MPIJob version is served: the other is not news.
        if served.kinds.iter().any(|(k, _)| *k == kind.kind) {
            continue;
        }
        info!(
            kind = kind.kind,
            version = kind.version,
            "CRD not served; skipped until it is"
        );
    }
}

/// The liveness name of a backend's PodGroup watch.
fn backend_resource(b: BackendKind) -> String {
    format!("podgroups.{}", b.backend().group())
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
) -> (JoinHandle<()>, reflector::Store<Packed>) {
    let ar = kind.api_resource();
    let api: Api<LeanJob> = Api::all_with(client, &ar);
    let shared = crate::packed::kind(&ar);
    let writer = reflector::store::Writer::<Packed>::new(shared.clone());
    let jobs = writer.as_reader();
    let probe = liveness.probe(kind_resource(kind));
    let watch_probe = probe.clone();
    let watch_metrics = ctx.metrics.clone();
    let watch_ctx = ctx.clone();
    // The cache keeps what a reconcile reads (see `strip`): field-manager bookkeeping, the
    // last-applied copy and every template field no computation reads are dropped. Jobs reach
    // the queue only once the cache holds them; the first list's page by page (see
    // `reflect_settled`). A list asks for the most recent state, not `resourceVersion=0`: the
    // API server ignores the page size of a list at version 0 and sends every job at once.
    let config = watcher::Config::default().page_size(crate::watch::LIST_PAGE_SIZE);
    let stream = watcher(api, config)
        .backoff(WatchBackoff::default())
        // A job relist needs no trigger: `reflect_settled` hands every job on at its end.
        .inspect(move |event| {
            crate::watch::observe(&watch_probe, &watch_metrics, event);
            // What was kept for a deleted job goes with it.
            if let Ok(kube::runtime::watcher::Event::Delete(job)) = event {
                watch_ctx.forget_job(job.0.metadata.uid.as_deref().unwrap_or_default());
            }
        })
        .modify(move |job: &mut LeanJob| crate::strip::job(kind, &mut job.0))
        .map_ok(crate::packed::event);
    // Every reason to reconcile a job — its own watch, and triggers from the other caches —
    // passes one first-in-first-out stage (see `fifo`); the controller's own input stays empty.
    let requests = futures::stream::select(
        reflect_settled(stream, writer, shared.clone()),
        job_refs(triggers, jobs.clone(), kind, shared.clone()),
    );
    let fifo = Fifo::new(concurrency)
        .with_gauge(ctx.metrics.reconcile.queued.with_label_values(&[kind.kind]));
    let controller = Controller::for_stream_with(
        futures::stream::pending::<Result<Packed, watcher::Error>>(),
        jobs.clone(),
        shared.clone(),
    )
    .with_config(runtime_controller::Config::default().concurrency(concurrency))
    .reconcile_on(fifo.stream(requests, shared))
    .graceful_shutdown_on(async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    });
    let metrics = ctx.metrics.clone();
    let handle = tokio::spawn(async move {
        let _guard = probe.task_guard();
        let turns = fifo.clone();
        controller
            .run(
                move |obj: Arc<Packed>, ctx| {
                    let turn = turns.begin(crate::fifo::job_key(obj.as_ref()));
                    let job = Arc::new(obj.unpack());
                    async move {
                        let result = reconcile::reconcile(job, ctx, kind).await;
                        drop(turn);
                        result
                    }
                },
                reconcile::error_policy,
                ctx,
            )
            .for_each(|result| {
                if let Err(e) = result {
                    report_controller_error(&metrics, &fifo, kind, e);
                }
                future::ready(())
            })
            .await;
    });
    (handle, jobs)
}

/// Logs and counts what a job controller's run stream reports besides success. Reconcile
/// errors were logged by the error policy and are retried there.
fn report_controller_error(
    metrics: &crate::metrics::Metrics,
    fifo: &Fifo,
    kind: &JobKind,
    e: runtime_controller::Error<reconcile::Error, watcher::Error>,
) {
    use runtime_controller::Error as E;
    match e {
        E::ReconcilerFailed(..) => {}
        // Queued but gone from the cache: the job was deleted before its turn. (Before a
        // relist completed this also happened to jobs still in the list; see `watch`.)
        E::ObjectNotFound(obj) => {
            fifo.finished(&crate::fifo::key(&obj));
            metrics
                .reconcile
                .errors
                .with_label_values(&[kind.kind, "not_found"])
                .inc();
            info!(object = %obj, "job queued for reconcile is no longer in the cache; skipped");
        }
        // Counted and logged where the watch stream is observed.
        E::QueueError(_) => {}
        E::RunnerError(e) => {
            metrics
                .reconcile
                .errors
                .with_label_values(&[kind.kind, "runner"])
                .inc();
            warn!(kind = kind.kind, error = %e, "reconcile runner error");
        }
    }
}
