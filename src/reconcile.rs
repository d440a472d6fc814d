//! Step 5 of the pipeline: carries out the [`Plan`] of one reconcile — the only place that
//! writes PodGroups (SPEC §3, §4, §5).
//!
//! A reconcile reads the job's namespace and the cluster context from the caches, asks
//! [`plan::plan`] what to do, deletes and applies what the plan says, publishes its Events and
//! counts its metrics. A job that cannot get a PodGroup is an outcome (a Warning Event and a
//! metric), never an error that retries forever; an API error is retried with backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt, api::DynamicObject};
use tracing::{debug, info, warn};

use crate::backend::{BackendKind, Phase};
use crate::caches::Caches;
use crate::events::{EventError, Events, Reason};
use crate::health::GangHealth;
use crate::job::{InvalidJob, JobKind};
use crate::liveness::InFlight;
use crate::metrics::Metrics;
use crate::packed::Packed;
use crate::plan::{self, Delete, Input, Op, Outcome, Plan, SeenPhase, Tally, Write};
use crate::refusal::Refusal;

pub use crate::settings::{FIELD_MANAGER, ResizePolicy, Settings};

/// Shared by every job kind's controller.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub caches: Caches,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// Consecutive failed reconciles per job UID, for the requeue backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// PodGroups the API server refused per job UID (see `refusal`): one the schema refused is
    /// not sent again until a job change alters it; one refused at admission is, with a backoff.
    refused: Mutex<HashMap<String, Refusal>>,
    /// PodGroups this process saw waiting (not Running): the gang wait is measured for these
    /// only, so a restart does not record every running gang with its whole age.
    waiting_seen: Mutex<std::collections::HashSet<String>>,
    /// Gang health per job UID (SPEC §10): what a PodGroup's status does not remember.
    health: Mutex<HashMap<String, GangHealth>>,
    /// False on a standby replica: it computes nothing and writes nothing.
    pub leading: tokio::sync::watch::Receiver<bool>,
    pub in_flight: Arc<InFlight>,
    /// Spec fields the cluster's PodGroups drop, learned from the writes' answers.
    pub dropped: crate::dropped::Dropped,
}

/// What went wrong talking to the API server; retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} PodGroup {namespace}/{name}: {source}")]
    Write {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Event(#[from] EventError),
}

impl Error {
    /// Whether the API server refused the request for load (429): retried no sooner than its
    /// `Retry-After` (a second).
    fn throttled(&self) -> bool {
        let source = match self {
            Error::Write { source, .. } => source,
            Error::Event(EventError::Transient { source, .. }) => source,
        };
        matches!(source, kube::Error::Api(e) if e.code == 429)
    }

    /// A label for the error metric.
    fn label(&self) -> &'static str {
        match self {
            Error::Write { .. } => "write",
            Error::Event(_) => "event",
        }
    }
}

/// First requeue delay after a failed reconcile.
pub const REQUEUE_MIN: Duration = Duration::from_millis(500);
/// Longest requeue delay after failed reconciles: a job whose writes failed during a fault is
/// retried within this of the fault clearing. At most `--concurrency` reconciles run at once, so
/// retries of many jobs cost at most that many requests in flight.
pub const REQUEUE_MAX: Duration = Duration::from_secs(4);

/// The shortest requeue after the API server refused a request for load (its `Retry-After`).
pub const THROTTLED_RETRY: Duration = Duration::from_secs(1);

/// The requeue delay after `failures` consecutive failed reconciles: 0.5 s doubling to 4 s.
pub fn requeue_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (REQUEUE_MIN * 2u32.pow(doublings)).min(REQUEUE_MAX)
}

impl Context {
    pub fn new(
        client: Client,
        settings: Settings,
        caches: Caches,
        events: Events,
        metrics: Arc<Metrics>,
        leading: tokio::sync::watch::Receiver<bool>,
        in_flight: Arc<InFlight>,
    ) -> Self {
        Context {
            in_flight,
            client,
            settings,
            caches,
            events,
            metrics,
            failures: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            waiting_seen: Mutex::new(Default::default()),
            health: Mutex::new(HashMap::new()),
            leading,
            dropped: Default::default(),
        }
    }

    /// Counts a failed reconcile of the job `uid` and returns how long to wait before the next.
    fn failed(&self, uid: &str) -> Duration {
        let mut failures = self.failures.lock().expect("lock");
        let n = failures.entry(uid.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        requeue_backoff(*n)
    }

    fn succeeded(&self, uid: &str) {
        let mut failures = self.failures.lock().expect("lock");
        if !failures.is_empty() {
            failures.remove(uid);
        }
    }

    /// What the API server refused for the job last time.
    fn refusal(&self, uid: &str) -> Option<Refusal> {
        self.refused.lock().expect("lock").get(uid).cloned()
    }

    /// Forgets what is kept per job (failures, refusals, gang health, published Events) for a
    /// job that was deleted.
    pub fn forget_job(&self, uid: &str) {
        self.failures.lock().expect("lock").remove(uid);
        self.refused.lock().expect("lock").remove(uid);
        self.health.lock().expect("lock").remove(uid);
        self.waiting_seen.lock().expect("lock").remove(uid);
        self.events.forget_object(uid);
    }
    /// Keeps (or forgets) what the plan says to remember of a job's gang health.
    fn remember_health(&self, uid: &str, mut health: GangHealth) {
        health.retain(|_, h| !h.is_blank());
        let mut map = self.health.lock().expect("lock");
        if health.is_empty() {
            map.remove(uid);
        } else {
            map.insert(uid.to_string(), health);
        }
    }

    /// Gangs reported broken, infeasible or without their queue, by backend; entries of jobs
    /// no longer cached are dropped first.
    pub fn health_counts(&self) -> HashMap<(BackendKind, &'static str), i64> {
        let mut counts = HashMap::new();
        let mut map = self.health.lock().expect("lock");
        // A deleted job is not reconciled again; its PodGroups go with it.
        map.retain(|uid, _| !self.caches.owned.owned_by(uid).is_empty());
        for h in map.values().flat_map(|g| g.values()) {
            let Some(b) = h.backend else { continue };
            for (on, what) in [
                (h.gang.broken, "broken"),
                (h.infeasible, "infeasible"),
                (h.queue_unavailable, "queue_unavailable"),
            ] {
                if on {
                    *counts.entry((b, what)).or_default() += 1;
                }
            }
        }
        counts
    }

    /// Measures the gang wait of a PodGroup this process saw waiting, once it runs; a restart
    /// does not record every running gang with its whole age.
    fn saw_phase(&self, seen: &SeenPhase) {
        let mut waiting = self.waiting_seen.lock().expect("lock");
        match seen.phase {
            Phase::Running => {
                if waiting.remove(&seen.uid) {
                    self.metrics
                        .pod_groups
                        .gang_wait
                        .with_label_values(&[seen.backend.as_str()])
                        .observe(seen.age.as_secs_f64());
                }
            }
            Phase::Unknown | Phase::Pending | Phase::Scheduling => {
                if waiting.len() > 100_000 {
                    waiting.clear();
                }
                waiting.insert(seen.uid.clone());
            }
            Phase::Finished | Phase::Failed => {}
        }
    }
}

/// Reconciles one job of `kind`: plan, then carry the plan out.
pub async fn reconcile(
    obj: Arc<DynamicObject>,
    ctx: Arc<Context>,
    kind: &'static JobKind,
) -> Result<Action, Error> {
    let started = Instant::now();
    let guard = ctx.in_flight.enter();
    let plan = plan_for(&obj, &ctx, kind);
    let result = execute(&obj, &ctx, kind, plan).await;
    drop(guard);
    let label = match &result {
        Ok(o) => o.label(),
        Err(_) => "error",
    };
    ctx.metrics
        .reconcile
        .total
        .with_label_values(&[kind.kind, label])
        .inc();
    ctx.metrics
        .reconcile
        .duration
        .with_label_values(&[kind.kind])
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics
        .reconcile
        .last
        .set(Timestamp::now().as_second() as f64);
    if result.is_ok() {
        ctx.succeeded(&obj.uid().unwrap_or_default());
    }
    result.map(|o| o.action())
}

/// Reads what the planner needs from the caches and asks it.
fn plan_for(obj: &DynamicObject, ctx: &Context, kind: &'static JobKind) -> Plan {
    let namespace = obj.namespace().unwrap_or_default();
    let ns = ctx.caches.namespaces.get(&ObjectRef::new(&namespace));
    let priorities = ctx.caches.priorities();
    let defaults = ctx.caches.admission_defaults(&namespace);
    let refused = ctx.refusal(&obj.uid().unwrap_or_default());
    let health = ctx
        .health
        .lock()
        .expect("lock")
        .get(&obj.uid().unwrap_or_default())
        .cloned();
    let capacity = ctx.caches.capacity.as_ref().map(|c| c.capacity());
    let queues = ctx.caches.capacity.as_ref().and_then(|c| c.queue_states());
    let unlinked = if ctx.settings.webhook {
        ctx.caches.unlinked.of(&namespace, kind, &obj.name_any())
    } else {
        Vec::new()
    };
    let kueue = ctx.caches.kueue.of(&obj.uid().unwrap_or_default());
    let dropped = ctx.dropped.snapshot();
    plan::plan(&Input {
        kind,
        job: obj,
        leading: *ctx.leading.borrow(),
        namespace_annotations: ns.as_ref().and_then(|n| n.metadata.annotations.as_ref()),
        priorities: &priorities,
        defaults: &defaults,
        pod_groups: &ctx.caches,
        refused: refused.as_ref(),
        unlinked_pods: &unlinked,
        settings: &ctx.settings,
        now: Timestamp::now(),
        health: health.as_ref(),
        capacity: capacity.as_deref(),
        queues: queues.as_deref(),
        kueue: kueue.as_deref(),
        dropped: &dropped,
        tiers: &ctx.caches.tiers.get(),
    })
}

/// Carries a plan out: deletes, the write, then the Events and metrics. An Event that could not
/// be published makes the reconcile fail (and retry) once the writes are done.
async fn execute(
    obj: &DynamicObject,
    ctx: &Context,
    kind: &'static JobKind,
    mut plan: Plan,
) -> Result<Outcome, Error> {
    let namespace = obj.namespace().unwrap_or_default();
    let uid = obj.uid().unwrap_or_default();
    for delete in &plan.deletes {
        delete_pod_group(ctx, &namespace, delete).await?;
    }
    // A job of many PodGroups (a LeaderWorkerSet of N groups) has them written side by side,
    // never one slow answer holding back the next writes; the answers are then taken in the
    // plan's order, and the first error is the reconcile's once every answer is taken.
    let writes = std::mem::take(&mut plan.writes);
    let namespace_ref = namespace.as_str();
    let mut answers: Vec<_> = futures::stream::iter(writes.into_iter().enumerate())
        .map(|(i, write)| async move {
            let answer = apply(ctx, namespace_ref, &write).await;
            (i, write, answer)
        })
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect()
        .await;
    answers.sort_unstable_by_key(|(i, _, _)| *i);
    let mut failed = None;
    for (_, write, answer) in answers {
        if let Err(e) = settle_write(obj, ctx, &mut plan, write, answer) {
            failed.get_or_insert(e);
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    if plan.valid {
        ctx.events.forget(&uid, &[Reason::InvalidSpec]);
    }
    if !plan.forget.is_empty() {
        ctx.events.forget(&uid, &plan.forget);
    }
    ctx.remember_health(&uid, std::mem::take(&mut plan.health));
    for seen in &plan.phases {
        ctx.saw_phase(seen);
    }
    count(ctx, &plan.tallies);
    publish(obj, ctx, kind, &plan.events, &plan.occurrences).await?;
    Ok(plan.outcome)
}

/// PodGroup writes of one job in flight at once (the controller's default `--concurrency`).
const WRITES_IN_FLIGHT: usize = 16;

/// Takes the answer to one PodGroup write of a plan: a refusal is reported on the plan (and
/// remembered), a create that found the PodGroup made since the cache looked is looked at again.
/// (The reconcile's own error type, as every step returns it.)
#[allow(clippy::result_large_err)]
fn settle_write(
    obj: &DynamicObject,
    ctx: &Context,
    plan: &mut Plan,
    write: Write,
    answer: Result<bool, Error>,
) -> Result<(), Error> {
    let namespace = obj.namespace().unwrap_or_default();
    let uid = obj.uid().unwrap_or_default();
    match answer {
        Ok(learned) => {
            ctx.refused.lock().expect("lock").remove(&uid);
            if write.op == Op::Create {
                created(obj, ctx, &write);
            }
            if learned {
                // Tell the job at once, and stop sending what the cluster drops.
                let soon = Outcome::RequeueAfter(Duration::from_secs(1));
                plan.outcome = plan::more_pressing(plan.outcome, soon);
            }
        }
        // A PodGroup of that name appeared since the cache looked: decide once the watch
        // has brought it in.
        Err(Error::Write {
            source: kube::Error::Api(e),
            ..
        }) if e.code == 409 && write.op == Op::Create => {
            let again = Outcome::RequeueAfter(Duration::from_secs(1));
            plan.outcome = plan::more_pressing(plan.outcome, again);
        }
        // Refused: by the schema (a value the job's spec gave; not sent again until it
        // changes), or at admission (sent again with a backoff; see `refusal`).
        Err(Error::Write {
            source: kube::Error::Api(e),
            action,
            namespace: ns,
            name,
        }) => {
            let before = ctx.refusal(&uid);
            let Some(refusal) = Refusal::of(
                e.code,
                &e.message,
                write.body,
                before.as_ref(),
                Instant::now(),
            ) else {
                let source = kube::Error::Api(e);
                return Err(Error::Write {
                    action,
                    namespace: ns,
                    name,
                    source,
                });
            };
            refused(plan, &namespace, &write.name, &refusal);
            ctx.refused.lock().expect("lock").insert(uid, refusal);
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Reports a refused PodGroup on the plan: the schema's as `InvalidSpec`, an admission refusal
/// as `PodGroupRefused` naming who refused, with a retry after its backoff.
fn refused(plan: &mut Plan, namespace: &str, name: &str, refusal: &Refusal) {
    plan.valid = false;
    plan.phases.retain(|p| p.name != name);
    let (Some(by), Some(retry)) = (&refusal.by, refusal.retry_after()) else {
        warn!(namespace, podgroup = name, error = %refusal.message, "the API server refused the PodGroup; not retried until the job changes");
        plan.add_invalid(&InvalidJob::RefusedByApiServer(refusal.message.clone()));
        return;
    };
    warn!(namespace, podgroup = name, by, attempts = refusal.attempts, retry_in = ?retry, error = %refusal.message, "the PodGroup was refused at admission; sent again after a backoff");
    plan.outcome = plan::more_pressing(plan.outcome, Outcome::RequeueAfter(retry));
    plan.events.push((
        Reason::PodGroupRefused,
        format!(
            "{by} refused PodGroup {name}: {}. podgroup-sync sends it again with a backoff (at most {}s), and at once when the namespace, a PriorityClass, an admission policy or its binding, or (with --gang-feasibility) a Volcano Queue changes",
            refusal.message,
            crate::refusal::ADMISSION_RETRY_MAX.as_secs()
        ),
    ));
}

/// Counts a plan's metrics.
fn count(ctx: &Context, tallies: &[Tally]) {
    for tally in tallies {
        match tally {
            Tally::Invalid(reason) => {
                debug!(reason, "invalid job");
                ctx.metrics
                    .reconcile
                    .invalid
                    .with_label_values(&[reason])
                    .inc()
            }
            Tally::Conflict => ctx.metrics.reconcile.conflicts.inc(),
            Tally::BackendUnavailable(b) => ctx
                .metrics
                .pod_groups
                .backend_unavailable
                .with_label_values(&[b.as_str()])
                .inc(),
        }
    }
}

/// Publishes a plan's Events on the job; the first failure is returned after trying them all.
async fn publish(
    obj: &DynamicObject,
    ctx: &Context,
    kind: &JobKind,
    events: &[(Reason, String)],
    occurrences: &[(Reason, u32)],
) -> Result<(), EventError> {
    if events.is_empty() {
        return Ok(());
    }
    let job_ref = ObjectReference {
        api_version: Some(kind.api_version()),
        kind: Some(kind.kind.to_string()),
        name: Some(obj.name_any()),
        namespace: obj.namespace(),
        uid: obj.uid(),
        resource_version: None,
        field_path: None,
    };
    let mut failed = None;
    for (reason, note) in events {
        let n = occurrences
            .iter()
            .find(|(r, _)| r == reason)
            .map(|(_, n)| *n);
        let published = ctx
            .events
            .publish_counted(&job_ref, *reason, note.clone(), n)
            .await;
        if let Err(e) = published {
            debug!(error = %e, "event not published");
            failed.get_or_insert(e);
        }
    }
    failed.map_or(Ok(()), Err)
}

/// After a create: the job-creation-to-PodGroup latency, for first creations only
/// (recreations on resume or after a manual delete are not).
fn created(obj: &DynamicObject, ctx: &Context, write: &Write) {
    let first_creation = obj.meta().generation.is_none_or(|g| g <= 1);
    if let (true, Some(created)) = (first_creation, obj.meta().creation_timestamp.as_ref()) {
        let secs = Timestamp::now()
            .duration_since(created.0)
            .as_secs_f64()
            .max(0.0);
        ctx.metrics
            .pod_groups
            .job_to_pod_group
            .with_label_values(&[write.backend.as_str()])
            .observe(secs);
    }
    info!(job = %obj.name_any(), namespace = obj.namespace().unwrap_or_default(), podgroup = %write.name, backend = %write.backend, min_member = write.min_member, "created PodGroup");
}

/// What is read of an apply's answer: the version it left and the spec as stored. The rest —
/// field-manager entries, status, labels — is skipped unread (the watch brings the whole
/// object to the cache anyway).
#[derive(serde::Deserialize)]
struct Applied {
    metadata: AppliedMeta,
    #[serde(default)]
    spec: serde_json::Value,
}

#[derive(serde::Deserialize)]
struct AppliedMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
}

/// Applies the write; whether the answer showed spec fields the cluster drops that were not
/// known before (see `dropped`).
async fn apply(ctx: &Context, namespace: &str, write: &Write) -> Result<bool, Error> {
    let failed = |source| Error::Write {
        action: write.op.as_str(),
        namespace: namespace.into(),
        name: write.name.clone(),
        source,
    };
    let ar = write.backend.backend().shared();
    // Force: the fields podgroup-sync owns are its to set, even after someone edited them.
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut request = kube::core::Request::new(DynamicObject::url_path(&ar, Some(namespace)))
        .patch(&write.name, &params, &Patch::Apply(&write.body))
        .map_err(|e| failed(kube::Error::BuildRequest(e)))?;
    request.extensions_mut().insert("patch");
    let written: Applied = ctx.client.request(request).await.map_err(failed)?;
    // The watch event of this write tells the job nothing new: it need not requeue it.
    if let Some(version) = written.metadata.resource_version.as_deref() {
        let key = ObjectRef::new_with(&write.name, ar.clone()).within(namespace);
        let cached = ctx
            .caches
            .pod_group_store(write.backend)
            .and_then(|store| store.get(&key));
        ctx.caches.own_writes.wrote(
            write.backend,
            namespace,
            &write.name,
            version,
            cached
                .as_ref()
                .and_then(|c| c.meta().resource_version.as_deref()),
        );
    }
    ctx.metrics
        .pod_groups
        .writes
        .with_label_values(&[write.backend.as_str(), write.op.as_str()])
        .inc();
    let lost = crate::dropped::lost(&write.body["spec"], &written.spec);
    let learned = ctx.dropped.learn(write.backend, lost);
    if !learned.is_empty() {
        warn!(
            backend = write.backend.as_str(),
            fields = ?learned,
            "the API server dropped these PodGroup spec fields (a CRD without them, or a feature \
             gate off): not sent again by this process; the jobs that ask for them are told"
        );
    }
    Ok(!learned.is_empty())
}

/// Deletes one PodGroup with its UID as a precondition, so a PodGroup recreated meanwhile (for a
/// new job of the same name) is never hit.
pub(crate) async fn delete_pod_group(
    ctx: &Context,
    namespace: &str,
    delete: &Delete,
) -> Result<(), Error> {
    let backend = delete.backend;
    let api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &backend.backend().api_resource(),
    );
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: delete.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&delete.name, &params).await {
        Ok(_) => {
            ctx.metrics
                .pod_groups
                .writes
                .with_label_values(&[backend.as_str(), "delete"])
                .inc();
            info!(namespace, podgroup = %delete.name, backend = %backend, "deleted PodGroup");
            Ok(())
        }
        // Already gone, or replaced by a new object: nothing of ours to delete.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(Error::Write {
            action: "delete",
            namespace: namespace.into(),
            name: delete.name.clone(),
            source,
        }),
    }
}

/// After a failed reconcile: log, count, and retry with a per-job backoff (0.5 s doubling to
/// 4 s); the watch also brings the next change.
pub fn error_policy(obj: Arc<Packed>, err: &Error, ctx: Arc<Context>) -> Action {
    let mut delay = ctx.failed(&obj.uid().unwrap_or_default());
    if err.throttled() {
        delay = delay.max(THROTTLED_RETRY);
    }
    let kind = obj.kind_name();
    ctx.metrics
        .reconcile
        .errors
        .with_label_values(&[kind, err.label()])
        .inc();
    warn!(
        job = %obj.name_any(),
        namespace = obj.namespace().unwrap_or_default(),
        error = %err,
        retry_in_ms = delay.as_millis() as u64,
        "reconcile failed; retrying"
    );
    Action::requeue(delay)
}
