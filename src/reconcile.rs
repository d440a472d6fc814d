//! Step 4 of the pipeline: the one place that decides what to write (SPEC §3, §4, §5).
//!
//! A reconcile reads the job, its namespace and the cluster context from caches, computes the
//! desired PodGroup with the pure steps, compares it with the cached PodGroup, and applies or
//! deletes only when they differ. A job that cannot get a PodGroup is an outcome (a Warning
//! Event and a metric), never an error that retries forever.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{LimitRange, Namespace, ObjectReference};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt, api::DynamicObject};
use serde_json::Value;
use tracing::{debug, info, warn};

use crate::backend::{
    self, BackendKind, BackendOptions, MANAGED_BY_LABEL, MANAGED_BY_VALUE, Phase, PodGroupBackend,
};
use crate::diff::needs_apply;
use crate::enablement::{Enablement, Mode};
use crate::events::{EventError, Events, Reason};
use crate::gang::{self, Priorities};
use crate::job::{self, InvalidJob, JobKind};
use crate::metrics::Metrics;
use crate::resources::AdmissionDefaults;

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "podgroup-sync";

/// When a running gang's PodGroup may be resized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResizePolicy {
    /// Follow every change of replicas or policy (needed for HPA and elastic jobs).
    #[value(name = "always")]
    Always,
    /// Keep the size of an existing PodGroup; a suspended job's PodGroup is recreated on resume.
    #[value(name = "while-suspended")]
    WhileSuspended,
    /// Never change the size of an existing PodGroup.
    #[value(name = "never")]
    Never,
}

/// Behaviour settings, from flags.
#[derive(Debug, Clone)]
pub struct Settings {
    pub enablement: Enablement,
    pub backend_options: BackendOptions,
    pub resize: ResizePolicy,
    pub keep_finished: bool,
    /// How long a scheduler-plugins PodGroup may stay Pending/Scheduling before an Event says so.
    pub gang_wait_warning: Duration,
}

/// Read-only caches of the cluster, kept by reflectors.
#[derive(Clone)]
pub struct Caches {
    pub namespaces: Store<Namespace>,
    pub limit_ranges: Store<LimitRange>,
    pub priority_classes: Store<PriorityClass>,
    pub runtime_classes: Store<RuntimeClass>,
    /// PodGroups of each backend whose CRD is served and whose cache has synced.
    pub pod_groups: Arc<RwLock<BTreeMap<BackendKind, Store<DynamicObject>>>>,
    /// The cached PodGroups by the UID of the job that controls them.
    pub owned: OwnedIndex,
}

/// PodGroups by the UID of their controller, kept by the PodGroup reflectors, so that a
/// reconcile finds the PodGroups its job owns without scanning every cached PodGroup. Entries
/// may be stale (a delete missed across a re-list): readers check them against the cache.
#[derive(Clone, Default)]
pub struct OwnedIndex(Arc<Mutex<HashMap<String, BTreeSet<OwnedKey>>>>);

/// A cached PodGroup: its backend, namespace and name.
type OwnedKey = (BackendKind, String, String);

impl OwnedIndex {
    /// The controller UID and key of a PodGroup, if it has a controller.
    fn entry(backend: BackendKind, pg: &DynamicObject) -> Option<(String, OwnedKey)> {
        let uid = pg
            .metadata
            .owner_references
            .as_ref()?
            .iter()
            .find(|r| r.controller == Some(true))?
            .uid
            .clone();
        Some((
            uid,
            (backend, pg.namespace().unwrap_or_default(), pg.name_any()),
        ))
    }

    /// Records an applied (`deleted` false) or deleted PodGroup of `backend`.
    pub fn observe(&self, backend: BackendKind, pg: &DynamicObject, deleted: bool) {
        let Some((uid, key)) = Self::entry(backend, pg) else {
            return;
        };
        let mut index = self.0.lock().expect("lock");
        if deleted {
            if let Some(set) = index.get_mut(&uid) {
                set.remove(&key);
                if set.is_empty() {
                    index.remove(&uid);
                }
            }
        } else {
            index.entry(uid).or_default().insert(key);
        }
    }

    /// Replaces every entry of `backend` with the PodGroups of a freshly listed cache.
    pub fn replace(&self, backend: BackendKind, pgs: &[Arc<DynamicObject>]) {
        let entries: Vec<_> = pgs
            .iter()
            .filter_map(|pg| Self::entry(backend, pg))
            .collect();
        let mut index = self.0.lock().expect("lock");
        index.retain(|_, set| {
            set.retain(|(b, _, _)| *b != backend);
            !set.is_empty()
        });
        for (uid, key) in entries {
            index.entry(uid).or_default().insert(key);
        }
    }

    fn owned_by(&self, uid: &str) -> Vec<OwnedKey> {
        self.0
            .lock()
            .expect("lock")
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl Caches {
    fn pod_group_store(&self, backend: BackendKind) -> Option<Store<DynamicObject>> {
        self.pod_groups.read().expect("lock").get(&backend).cloned()
    }

    fn admission_defaults(&self, namespace: &str) -> Result<AdmissionDefaults, InvalidJob> {
        let mut lrs: Vec<LimitRange> = self
            .limit_ranges
            .state()
            .iter()
            .filter(|l| l.metadata.namespace.as_deref() == Some(namespace))
            .map(|l| (**l).clone())
            .collect();
        lrs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let rcs: Vec<RuntimeClass> = self
            .runtime_classes
            .state()
            .iter()
            .map(|r| (**r).clone())
            .collect();
        AdmissionDefaults::from_limit_ranges_and_runtime_classes(&lrs, &rcs)
            .map_err(|e| InvalidJob::InvalidResources(format!("namespace admission defaults: {e}")))
    }
}

/// Reconciles in progress, for liveness: one stuck far longer than any API call could take
/// means the reconcile loop is wedged.
#[derive(Default)]
pub struct InFlight {
    next: std::sync::atomic::AtomicU64,
    started: Mutex<BTreeMap<u64, Instant>>,
}

/// Removes its reconcile from [`InFlight`] when dropped.
pub struct InFlightGuard<'a>(&'a InFlight, u64);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.started.lock().expect("lock").remove(&self.1);
    }
}

impl InFlight {
    pub fn enter(&self) -> InFlightGuard<'_> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.started
            .lock()
            .expect("lock")
            .insert(id, Instant::now());
        InFlightGuard(self, id)
    }

    /// How long the oldest reconcile in progress has been running.
    pub fn oldest(&self) -> Option<Duration> {
        self.started
            .lock()
            .expect("lock")
            .values()
            .map(|t| t.elapsed())
            .max()
    }
}

/// Shared by every job kind's controller.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub caches: Caches,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    /// Consecutive failed reconciles per job UID, for the requeue backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// PodGroups the API server refused (422/400) per job UID: the refused object and the
    /// server's message. The same object is not sent again; a job change that alters it is.
    refused: Mutex<HashMap<String, (Value, String)>>,
    /// PodGroups this process saw waiting (not Running): the gang wait is measured for these
    /// only, so a restart does not record every running gang with its whole age.
    waiting_seen: Mutex<std::collections::HashSet<String>>,
    /// False on a standby replica: it computes nothing and writes nothing.
    pub leading: tokio::sync::watch::Receiver<bool>,
    pub in_flight: Arc<InFlight>,
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
    #[error("job object is not a known kind: {0}")]
    UnknownKind(String),
    #[error(transparent)]
    Event(#[from] EventError),
}

impl Error {
    /// A label for the error metric.
    fn label(&self) -> &'static str {
        match self {
            Error::Write { .. } => "write",
            Error::UnknownKind(_) => "unknown_kind",
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
            leading,
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

    fn has_refusal(&self, uid: &str) -> bool {
        self.refused.lock().expect("lock").contains_key(uid)
    }

    /// The API server's message if it refused exactly this object for the job before.
    fn refusal(&self, uid: &str, object: &Value) -> Option<String> {
        let refused = self.refused.lock().expect("lock");
        refused
            .get(uid)
            .filter(|(o, _)| o == object)
            .map(|(_, m)| m.clone())
    }
}

/// The Events of one reconcile, on its job. A failed publication is remembered, so that the
/// reconcile is retried (with backoff) after its writes are done.
pub struct Report<'a> {
    ctx: &'a Context,
    job_ref: ObjectReference,
    failed: Option<EventError>,
}

impl<'a> Report<'a> {
    fn new(ctx: &'a Context, job_ref: ObjectReference) -> Self {
        Report {
            ctx,
            job_ref,
            failed: None,
        }
    }

    async fn event(&mut self, reason: Reason, note: String) {
        let result = self.ctx.events.publish(&self.job_ref, reason, note).await;
        if let Err(e) = result {
            debug!(error = %e, "event not published");
            self.failed.get_or_insert(e);
        }
    }

    fn uid(&self) -> &str {
        self.job_ref.uid.as_deref().unwrap_or_default()
    }
}

/// Whether podgroup-sync owns `pg` for the job with this UID: the job is its controller and it
/// carries the managed-by label. A PodGroup the job controls without the label was made by
/// someone else — an operator whose gang mode is still on, or Volcano's own `podgroup-<uid>`
/// for pods without a group annotation — and is never touched.
fn ours(pg: &DynamicObject, uid: &str) -> bool {
    let controlled = pg.metadata.owner_references.as_ref().is_some_and(|refs| {
        refs.iter()
            .any(|r| r.controller == Some(true) && r.uid == uid)
    });
    let labelled = pg
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY_VALUE);
    controlled && labelled
}

/// Reconciles one job of `kind`.
pub async fn reconcile(
    obj: Arc<DynamicObject>,
    ctx: Arc<Context>,
    kind: &'static JobKind,
) -> Result<Action, Error> {
    let started = Instant::now();
    let guard = ctx.in_flight.enter();
    let job_ref = ObjectReference {
        api_version: Some(kind.api_version()),
        kind: Some(kind.kind.to_string()),
        name: Some(obj.name_any()),
        namespace: obj.namespace(),
        uid: obj.uid(),
        resource_version: None,
        field_path: None,
    };
    let mut report = Report::new(&ctx, job_ref);
    let result = reconcile_inner(&obj, &ctx, kind, &mut report).await;
    // The writes are done; an Event that could not be published makes the reconcile retry.
    let result = match (result, report.failed.take()) {
        (Ok(_), Some(e)) => Err(Error::Event(e)),
        (r, _) => r,
    };
    drop(guard);
    let label = match &result {
        Ok(o) => o.label(),
        Err(_) => "error",
    };
    ctx.metrics
        .reconcile_total
        .with_label_values(&[kind.kind, label])
        .inc();
    ctx.metrics
        .reconcile_duration
        .with_label_values(&[kind.kind])
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics
        .last_reconcile
        .set(Timestamp::now().as_second() as f64);
    if result.is_ok() {
        ctx.succeeded(&obj.uid().unwrap_or_default());
    }
    result.map(|o| o.action())
}

/// How a reconcile ended.
enum Outcome {
    Done,
    Standby,
    Invalid,
    Conflict,
    /// Wait for something outside the job (a CRD, a long Pending gang) and look again.
    RequeueAfter(Duration),
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Done | Outcome::RequeueAfter(_) => "ok",
            Outcome::Standby => "standby",
            Outcome::Invalid => "invalid",
            Outcome::Conflict => "conflict",
        }
    }
    fn action(&self) -> Action {
        match self {
            Outcome::RequeueAfter(d) => Action::requeue(*d),
            Outcome::Standby => Action::await_change(),
            // Watches bring every change; a slow periodic look catches anything missed.
            _ => Action::requeue(Duration::from_secs(3600)),
        }
    }
}

async fn reconcile_inner(
    obj: &DynamicObject,
    ctx: &Context,
    kind: &'static JobKind,
    report: &mut Report<'_>,
) -> Result<Outcome, Error> {
    if !*ctx.leading.borrow() {
        // A standby writes nothing; every job is looked at again when it becomes the leader.
        return Ok(Outcome::Standby);
    }
    let namespace = obj.namespace().unwrap_or_default();
    let uid = obj.uid().unwrap_or_default();
    let ns = ctx.caches.namespaces.get(&ObjectRef::new(&namespace));
    let ns_annotations = ns.as_ref().and_then(|n| n.metadata.annotations.as_ref());
    let mode = ctx.settings.enablement.namespace_mode(ns_annotations);
    if obj.meta().deletion_timestamp.is_some() {
        // The garbage collector removes the PodGroup through its ownerReference.
        return Ok(Outcome::Done);
    }
    if mode == Mode::Off {
        delete_owned(ctx, &namespace, &uid, None).await?;
        return Ok(Outcome::Done);
    }
    let value = serde_json::to_value(obj).map_err(|e| Error::UnknownKind(e.to_string()))?;
    let job = match job::normalize(kind, &value) {
        Ok(j) => j,
        Err(invalid) => return report_invalid(ctx, report, invalid).await,
    };
    if ctx.settings.enablement.job_opted_out(&job) || job.managed_elsewhere() {
        delete_owned(ctx, &namespace, &uid, None).await?;
        return Ok(Outcome::Done);
    }
    if job.finished && !ctx.settings.keep_finished {
        if mode == Mode::Manage {
            delete_owned(ctx, &namespace, &uid, None).await?;
        }
        return Ok(Outcome::Done);
    }
    if job.suspended() {
        if mode == Mode::Manage {
            delete_owned(ctx, &namespace, &uid, None).await?;
        }
        return Ok(Outcome::Done);
    }

    let priorities = Priorities::from_classes(
        ctx.caches
            .priority_classes
            .state()
            .iter()
            .map(|p| p.as_ref()),
    );
    let gang = match ctx
        .caches
        .admission_defaults(&namespace)
        .and_then(|defaults| gang::compute(&job, &priorities, &defaults))
    {
        Ok(g) => g,
        Err(invalid) => return report_invalid(ctx, report, invalid).await,
    };

    let opts = &ctx.settings.backend_options;
    let (backend_kind, _why) = match ctx.settings.enablement.backend(&job, ns_annotations, opts) {
        Ok(b) => b,
        Err(msg) => {
            report.event(Reason::InvalidBackend, msg).await;
            ctx.metrics
                .invalid_jobs
                .with_label_values(&["InvalidBackend"])
                .inc();
            return Ok(Outcome::Invalid);
        }
    };
    let backend = backend_kind.backend();
    let Some(store) = ctx.caches.pod_group_store(backend_kind) else {
        ctx.metrics
            .backend_unavailable
            .with_label_values(&[backend_kind.as_str()])
            .inc();
        report.event(
            Reason::BackendUnavailable,
            format!(
                "the {backend_kind} PodGroup CRD ({}) is not served by the API server; the PodGroup is created once it is",
                backend.api_resource().api_version
            ),
        )
        .await;
        return Ok(Outcome::RequeueAfter(Duration::from_secs(300)));
    };

    let (name, name_warnings) =
        match backend::name_and_checks(backend, &job, &|c| priorities.contains(c)) {
            Ok(n) => n,
            Err(invalid) => return report_invalid(ctx, report, invalid).await,
        };
    // The job is valid now: an InvalidSpec it gets again later is news.
    if !ctx.has_refusal(&uid) {
        ctx.events.forget(&uid, &[Reason::InvalidSpec]);
    }
    let mut warnings = gang.warnings.clone();
    warnings.extend(name_warnings);
    if !warnings.is_empty() {
        report
            .event(Reason::GangSpecWarning, warnings.join("; "))
            .await;
    }
    let missing = backend::missing_links(backend, &job, &name, opts);
    if !missing.is_empty() {
        report
            .event(
                Reason::MissingPodGroupLink,
                format!(
                    "pods of these templates will not join PodGroup {name}: {}",
                    missing.join("; ")
                ),
            )
            .await;
    }

    let existing = cached(backend, &store, &namespace, &name);
    if mode == Mode::Manage {
        // A PodGroup this job owns under another name or backend is stale.
        delete_owned(ctx, &namespace, &uid, Some((backend_kind, &name))).await?;
    }
    let existing_spec = existing.as_ref().and_then(|pg| pg.data.get("spec"));
    let freeze = existing.is_some() && ctx.settings.resize != ResizePolicy::Always;
    let desired = backend::desired_object(backend, &job, &gang, &name, existing_spec, freeze, opts);

    match existing {
        Some(pg) if !ours(&pg, &uid) => {
            ctx.metrics.conflicts.inc();
            let owner = pg
                .metadata
                .owner_references
                .as_ref()
                .and_then(|r| r.iter().find(|o| o.controller == Some(true)))
                .map(|o| format!("{} {}", o.kind, o.name))
                .unwrap_or_else(|| "no controller".into());
            let owner = if pg
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == uid)
            {
                "this job, but was not made by podgroup-sync (is the operator's own gang scheduling on?)".to_string()
            } else {
                owner
            };
            report.event(
                Reason::PodGroupConflict,
                format!(
                    "{backend_kind} PodGroup {name} already exists and is controlled by {owner}; podgroup-sync leaves it untouched"
                ),
            )
            .await;
            Ok(Outcome::Conflict)
        }
        Some(pg) => {
            let actual = serde_json::to_value(pg.as_ref()).unwrap_or(Value::Null);
            if needs_apply(&desired, &actual, FIELD_MANAGER) {
                if mode == Mode::DryRun {
                    report
                        .event(
                            Reason::WouldUpdatePodGroup,
                            format!("{backend_kind} PodGroup {name}: {}", desired["spec"]),
                        )
                        .await;
                } else if let Some(refused) =
                    write(ctx, report, backend, &namespace, &name, &desired, "update").await?
                {
                    return Ok(refused);
                }
            }
            Ok(report_status(ctx, report, backend, &pg).await)
        }
        None => {
            if mode == Mode::DryRun {
                report
                    .event(
                        Reason::WouldCreatePodGroup,
                        format!("{backend_kind} PodGroup {name}: {}", desired["spec"]),
                    )
                    .await;
                return Ok(Outcome::Done);
            }
            let mut create = desired.clone();
            create["metadata"]["resourceVersion"] = Value::from(CREATE_ONLY);
            match write(ctx, report, backend, &namespace, &name, &create, "create").await {
                Ok(None) => {}
                Ok(Some(refused)) => return Ok(refused),
                // A PodGroup of that name appeared since the cache looked: decide once the watch
                // has brought it in.
                Err(Error::Write {
                    source: kube::Error::Api(e),
                    ..
                }) if e.code == 409 => {
                    return Ok(Outcome::RequeueAfter(Duration::from_secs(1)));
                }
                Err(e) => return Err(e),
            }
            // Job creation → PodGroup: recreations (resume, a manual delete) are not first creations.
            let first_creation = obj.meta().generation.is_none_or(|g| g <= 1);
            if let (true, Some(created)) = (first_creation, obj.meta().creation_timestamp.as_ref())
            {
                let secs = Timestamp::now()
                    .duration_since(created.0)
                    .as_secs_f64()
                    .max(0.0);
                ctx.metrics
                    .job_to_podgroup
                    .with_label_values(&[backend_kind.as_str()])
                    .observe(secs);
            }
            info!(job = %job.name, namespace = %namespace, podgroup = %name, backend = %backend_kind, min_member = gang.min_member, "created PodGroup");
            Ok(Outcome::Done)
        }
    }
}

async fn report_invalid(
    ctx: &Context,
    report: &mut Report<'_>,
    invalid: InvalidJob,
) -> Result<Outcome, Error> {
    ctx.metrics
        .invalid_jobs
        .with_label_values(&[invalid.reason()])
        .inc();
    debug!(job = ?report.job_ref.name, reason = invalid.reason(), "invalid job");
    report
        .event(Reason::InvalidSpec, format!("no PodGroup: {invalid}"))
        .await;
    Ok(Outcome::Invalid)
}

/// The cached PodGroup, if any. A miss is not asked of the API server: the PodGroup is then
/// created with a create-only apply (see `CREATE_ONLY`).
fn cached(
    backend: &dyn PodGroupBackend,
    store: &Store<DynamicObject>,
    namespace: &str,
    name: &str,
) -> Option<Arc<DynamicObject>> {
    store.get(&ObjectRef::new_with(name, backend.api_resource()).within(namespace))
}

/// Sends a PodGroup write unless the API server refused this very object for the job before.
/// A refusal (400/422: a value the PodGroup's schema does not allow) comes from the job's spec:
/// it is reported as `InvalidSpec` with the server's message, which names the field, and the
/// same object is not sent again — only a job change that alters it is. `Some` is that outcome.
async fn write(
    ctx: &Context,
    report: &mut Report<'_>,
    backend: &dyn PodGroupBackend,
    namespace: &str,
    name: &str,
    body: &Value,
    op: &'static str,
) -> Result<Option<Outcome>, Error> {
    let uid = report.uid().to_string();
    if let Some(message) = ctx.refusal(&uid, body) {
        let invalid = InvalidJob::RefusedByApiServer(message);
        return report_invalid(ctx, report, invalid).await.map(Some);
    }
    match apply(ctx, backend, namespace, name, body, op).await {
        Ok(()) => {
            ctx.refused.lock().expect("lock").remove(&uid);
            Ok(None)
        }
        Err(Error::Write {
            source: kube::Error::Api(e),
            ..
        }) if e.code == 400 || e.code == 422 => {
            warn!(namespace, podgroup = name, code = e.code, error = %e.message, "the API server refused the PodGroup; not retried until the job changes");
            ctx.refused
                .lock()
                .expect("lock")
                .insert(uid, (body.clone(), e.message.clone()));
            let invalid = InvalidJob::RefusedByApiServer(e.message);
            report_invalid(ctx, report, invalid).await.map(Some)
        }
        Err(e) => Err(e),
    }
}

/// A resourceVersion no PodGroup can have (etcd's first revision belongs to the API server's own
/// bootstrap). A server-side apply that carries it creates the object when there is none and is
/// refused with 409 Conflict when there is one: a create-only apply, so a PodGroup someone else
/// made since the cache looked is never taken over, without a GET before every create.
const CREATE_ONLY: &str = "1";

async fn apply(
    ctx: &Context,
    backend: &dyn PodGroupBackend,
    namespace: &str,
    name: &str,
    desired: &Value,
    op: &'static str,
) -> Result<(), Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &backend.api_resource());
    // Force: the fields podgroup-sync owns are its to set, even after someone edited them.
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(desired))
        .await
        .map_err(|source| Error::Write {
            action: op,
            namespace: namespace.into(),
            name: name.into(),
            source,
        })?;
    ctx.metrics
        .podgroup_writes
        .with_label_values(&[backend.kind().as_str(), op])
        .inc();
    Ok(())
}

/// Deletes the PodGroups controlled by the job `uid` in `namespace`, except `keep`.
/// Each delete carries the PodGroup's UID as a precondition, so a PodGroup recreated meanwhile
/// (for a new job of the same name) is never hit.
async fn delete_owned(
    ctx: &Context,
    namespace: &str,
    uid: &str,
    keep: Option<(BackendKind, &str)>,
) -> Result<(), Error> {
    let stores: BTreeMap<BackendKind, Store<DynamicObject>> =
        ctx.caches.pod_groups.read().expect("lock").clone();
    for (kind, ns, name) in ctx.caches.owned.owned_by(uid) {
        if ns != namespace || keep == Some((kind, name.as_str())) {
            continue;
        }
        let Some(store) = stores.get(&kind) else {
            continue;
        };
        let key = ObjectRef::new_with(&name, kind.backend().api_resource()).within(&ns);
        let owned = store.get(&key).filter(|pg| ours(pg, uid));
        if let Some(pg) = owned {
            let name = pg.name_any();
            let api: Api<DynamicObject> = Api::namespaced_with(
                ctx.client.clone(),
                namespace,
                &kind.backend().api_resource(),
            );
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: pg.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    ctx.metrics
                        .podgroup_writes
                        .with_label_values(&[kind.as_str(), "delete"])
                        .inc();
                    info!(namespace, podgroup = %name, backend = %kind, "deleted PodGroup");
                }
                // Already gone, or replaced by a new object: nothing of ours to delete.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(source) => {
                    return Err(Error::Write {
                        action: "delete",
                        namespace: namespace.into(),
                        name,
                        source,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Mirrors why the scheduler holds a gang back as Events; asks to look again while it waits.
async fn report_status(
    ctx: &Context,
    report: &mut Report<'_>,
    backend: &dyn PodGroupBackend,
    pg: &DynamicObject,
) -> Outcome {
    let status = pg.data.get("status");
    let phase = backend.phase(status);
    let pg_uid = pg.uid().unwrap_or_default();
    let age = pg
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| Duration::try_from(Timestamp::now().duration_since(t.0)).unwrap_or_default())
        .unwrap_or_default();
    if phase == Phase::Running {
        if ctx.waiting_seen.lock().expect("lock").remove(&pg_uid) {
            ctx.metrics
                .gang_wait
                .with_label_values(&[backend.kind().as_str()])
                .observe(age.as_secs_f64());
        }
        return Outcome::Done;
    }
    if matches!(phase, Phase::Unknown | Phase::Pending | Phase::Scheduling) {
        let mut waiting = ctx.waiting_seen.lock().expect("lock");
        if waiting.len() > 100_000 {
            waiting.clear();
        }
        waiting.insert(pg_uid.clone());
    }
    if let Some((reason, message)) = backend.unschedulable(status) {
        report
            .event(
                Reason::GangUnschedulable,
                format!("PodGroup {}: {reason}: {message}", pg.name_any()),
            )
            .await;
        return Outcome::Done;
    }
    if matches!(phase, Phase::Pending | Phase::Scheduling) {
        let limit = ctx.settings.gang_wait_warning;
        if age >= limit {
            report.event(
                Reason::GangWaiting,
                format!(
                    "PodGroup {} has been {} for more than {}s: the gang is waiting for its pods or for capacity",
                    pg.name_any(),
                    phase.as_str(),
                    limit.as_secs()
                ),
            )
            .await;
        } else {
            return Outcome::RequeueAfter(limit - age + Duration::from_secs(1));
        }
    }
    Outcome::Done
}

/// After a failed reconcile: log, count, and retry with a per-job backoff (0.5 s doubling to
/// 4 s); the watch also brings the next change.
pub fn error_policy(obj: Arc<DynamicObject>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.failed(&obj.uid().unwrap_or_default());
    let kind = obj.types.as_ref().map_or("", |t| t.kind.as_str());
    ctx.metrics
        .reconcile_errors
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
