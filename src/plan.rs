//! Step 4 of the pipeline: what one reconcile does, decided without I/O (SPEC §2, §3, §4, §5).
//!
//! [`plan`] turns a job, its namespace's mode, the cached PodGroups and the settings into a
//! [`Plan`]: the PodGroups to delete, the one create or update, the Events, the metrics to count
//! and the outcome. `reconcile` only carries a plan out. Every lifecycle row of SPEC §4 and every
//! enablement rule of SPEC §2 is a unit test below.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::backend::{self, BackendKind, Phase};
use crate::diff::needs_apply;
use crate::enablement::Mode;
use crate::events::Reason;
use crate::gang::{Gang, Priorities};
use crate::health::feasible::{self, Capacity};
use crate::health::{GangHealth, JobHealth, broken};
use crate::job::{self, InvalidJob, Job, JobKind};
use crate::refusal::Refusal;
use crate::resources::AdmissionDefaults;
use crate::settings::{FIELD_MANAGER, ResizePolicy, Settings};
use crate::target::{Around, NoPodGroup, Target, target};
pub use crate::target::{PodGroups, ours};
use crate::topology::TierNumbers;

/// A resourceVersion no PodGroup can have (etcd's first revision belongs to the API server's own
/// bootstrap). A server-side apply that carries it creates the object when there is none and is
/// refused with 409 Conflict when there is one: a create-only apply, so a PodGroup someone else
/// made since the cache looked is never taken over, without a GET before every create.
pub const CREATE_ONLY: &str = "1";

/// The cached PodGroups, as the planner sees them.
/// Everything a reconcile decides from, read from the caches by the caller.
pub struct Input<'a> {
    pub kind: &'static JobKind,
    pub job: &'a DynamicObject,
    /// False on a standby replica.
    pub leading: bool,
    /// The annotations of the job's Namespace (`None` when it is not cached).
    pub namespace_annotations: Option<&'a BTreeMap<String, String>>,
    pub priorities: &'a Priorities,
    /// The namespace's LimitRange defaults and the RuntimeClass overheads.
    pub defaults: &'a Result<AdmissionDefaults, InvalidJob>,
    pub pod_groups: &'a dyn PodGroups,
    /// What the API server refused for this job last time.
    pub refused: Option<&'a Refusal>,
    /// The job's pods created without a PodGroup link (name, pod set where it matters); kept
    /// only with the pod-link webhook on.
    pub unlinked_pods: &'a [(String, Option<String>)],
    pub settings: &'a Settings,
    pub now: Timestamp,
    /// What this process remembers of the job's gang health (SPEC §10), per PodGroup.
    pub health: Option<&'a GangHealth>,
    /// The schedulable capacity of the cluster (`None` with the feasibility check off).
    pub capacity: Option<&'a Capacity>,
    /// Every Volcano queue and its state (`None` unless the feasibility check is on and the
    /// Queue cache has synced).
    pub queues: Option<&'a BTreeMap<String, String>>,
    /// The job's Kueue Workload (SPEC §12), while Kueue is served.
    pub kueue: Option<&'a crate::kueue::Admission>,
    /// Spec fields the cluster's PodGroups were found to drop, per backend (`dropped`).
    pub dropped: &'a BTreeSet<(BackendKind, String)>,
    /// Volcano's tier numbers by name, from the cluster's HyperNodes (SPEC §13).
    pub tiers: &'a Arc<TierNumbers>,
}

/// How a reconcile ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// A standby replica: it writes nothing.
    Standby,
    Invalid,
    Conflict,
    /// Wait for something outside the job (a CRD, a long Pending gang) and look again.
    RequeueAfter(Duration),
}

impl Outcome {
    /// The `result` label of the reconcile metric.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Done | Outcome::RequeueAfter(_) => "ok",
            Outcome::Standby => "standby",
            Outcome::Invalid => "invalid",
            Outcome::Conflict => "conflict",
        }
    }

    pub fn action(&self) -> Action {
        match self {
            Outcome::RequeueAfter(d) => Action::requeue(*d),
            Outcome::Standby => Action::await_change(),
            // Watches bring every change; the periodic resync (`controller::RESYNC`), one
            // trigger for every job, catches anything missed — a timer per job would cost
            // kube-runtime's scheduler about a kilobyte each.
            _ => Action::await_change(),
        }
    }
}

/// A PodGroup to delete, with its UID as the precondition.
#[derive(Debug, Clone, PartialEq)]
pub struct Delete {
    pub backend: BackendKind,
    pub name: String,
    pub uid: Option<String>,
}

/// Whether a write creates or updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Update,
}

impl Op {
    pub fn as_str(&self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Update => "update",
        }
    }
}

/// A server-side apply of a reconcile (one per PodGroup the job gets).
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub backend: BackendKind,
    pub name: String,
    pub op: Op,
    /// The apply body (a create carries [`CREATE_ONLY`]).
    pub body: Value,
    pub min_member: u32,
}

/// A metric a plan counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// `invalid_jobs_total{reason}`.
    Invalid(&'static str),
    Conflict,
    BackendUnavailable(BackendKind),
}

/// A PodGroup's phase as the reconcile saw it, for the gang-wait metric.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenPhase {
    pub backend: BackendKind,
    /// The PodGroup's name.
    pub name: String,
    pub uid: String,
    pub phase: Phase,
    /// Since the PodGroup was created.
    pub age: Duration,
}

/// What one reconcile does.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Deleted first, in this order.
    pub deletes: Vec<Delete>,
    /// Applied after the deletes, in this order: at most one per PodGroup.
    pub writes: Vec<Write>,
    /// Published on the job after the writes.
    pub events: Vec<(Reason, String)>,
    pub tallies: Vec<Tally>,
    /// The job is valid: an `InvalidSpec` it gets later is news again.
    pub valid: bool,
    /// The phase of each PodGroup the reconcile looked at.
    pub phases: Vec<SeenPhase>,
    pub outcome: Outcome,
    /// The gang health to remember for the job, per PodGroup (empty: forget it).
    pub health: GangHealth,
    /// Event reasons that are news again (a condition cleared).
    pub forget: Vec<Reason>,
    /// How many times the condition of an Event has occurred (e.g. pods left unlinked): its
    /// Event's series count.
    pub occurrences: Vec<(Reason, u32)>,
}

impl Plan {
    fn new(outcome: Outcome) -> Self {
        Plan {
            deletes: Vec::new(),
            writes: Vec::new(),
            events: Vec::new(),
            tallies: Vec::new(),
            valid: false,
            phases: Vec::new(),
            outcome,
            health: GangHealth::new(),
            forget: Vec::new(),
            occurrences: Vec::new(),
        }
    }

    /// Deletes every PodGroup podgroup-sync made for this job (in a managed namespace).
    fn delete_all(input: &Input, mode: Mode) -> Self {
        let mut plan = Plan::new(Outcome::Done);
        if mode != Mode::DryRun {
            plan.deletes = stale(input, None);
        }
        plan
    }

    /// An `InvalidSpec` Warning and its metric.
    pub fn invalid(invalid: &InvalidJob) -> Self {
        let mut plan = Plan::new(Outcome::Invalid);
        plan.add_invalid(invalid);
        plan
    }

    /// A reported problem (`warning`) is gone: a Normal `GangFeasible` says so, and the
    /// Warning is news again if it recurs.
    fn cleared(&mut self, warning: Reason, note: String) {
        self.events.push((Reason::GangFeasible, note));
        self.forget.push(warning);
    }

    /// The one write of a job of one gang (the first of several otherwise).
    pub fn write(&self) -> Option<&Write> {
        self.writes.first()
    }

    /// The phase of the job's one PodGroup (the first of several otherwise).
    pub fn phase(&self) -> Option<&SeenPhase> {
        self.phases.first()
    }

    /// What is remembered of the health of the job's one PodGroup (the first of several).
    pub fn job_health(&self) -> Option<&JobHealth> {
        self.health.values().next()
    }

    /// Adds what was decided for one more PodGroup of the job (`part`, planned on its own): its
    /// writes, Events (an Event already planned is not repeated), metrics, phase and health;
    /// the outcome is the more pressing of the two. `valid` stays the job's.
    fn absorb(&mut self, part: Plan) {
        self.deletes.extend(part.deletes);
        self.writes.extend(part.writes);
        for event in part.events {
            if !self.events.contains(&event) {
                self.events.push(event);
            }
        }
        self.tallies.extend(part.tallies);
        self.phases.extend(part.phases);
        self.health.extend(part.health);
        for reason in part.forget {
            if !self.forget.contains(&reason) {
                self.forget.push(reason);
            }
        }
        self.occurrences.extend(part.occurrences);
        self.outcome = more_pressing(self.outcome, part.outcome);
    }

    pub fn add_invalid(&mut self, invalid: &InvalidJob) {
        self.outcome = Outcome::Invalid;
        self.tallies.push(Tally::Invalid(invalid.reason()));
        self.events
            .push((Reason::InvalidSpec, format!("no PodGroup: {invalid}")));
    }
}

/// Of two outcomes of one job's PodGroups, the one the reconcile ends with: an invalid or
/// conflicting PodGroup first, then the earliest look again.
pub fn more_pressing(a: Outcome, b: Outcome) -> Outcome {
    let rank = |o: &Outcome| match o {
        Outcome::Standby => 4,
        Outcome::Invalid => 3,
        Outcome::Conflict => 2,
        Outcome::RequeueAfter(_) => 1,
        Outcome::Done => 0,
    };
    match (a, b) {
        (Outcome::RequeueAfter(x), Outcome::RequeueAfter(y)) => Outcome::RequeueAfter(x.min(y)),
        (a, b) if rank(&b) > rank(&a) => b,
        (a, _) => a,
    }
}

/// The PodGroups podgroup-sync made for this job in its namespace, except those of backend
/// `keep.0` named in `keep.1`.
fn stale(input: &Input, keep: Option<(BackendKind, &[String])>) -> Vec<Delete> {
    let uid = input.job.uid().unwrap_or_default();
    let namespace = input.job.namespace().unwrap_or_default();
    input
        .pod_groups
        .controlled_by(&uid)
        .into_iter()
        .filter(|(b, pg)| {
            pg.namespace().as_deref() == Some(namespace.as_str())
                && !keep.is_some_and(|(kb, names)| kb == *b && names.contains(&pg.name_any()))
                && ours(pg, &uid, &input.settings.backend_options.instance)
        })
        .map(|(backend, pg)| Delete {
            backend,
            name: pg.name_any(),
            uid: pg.uid(),
        })
        .collect()
}

/// Decides what one reconcile of a job does (SPEC §2 and §4: which jobs get a PodGroup at all).
pub fn plan(input: &Input) -> Plan {
    if !input.leading {
        // A standby writes nothing; every job is looked at again when it becomes the leader.
        return Plan::new(Outcome::Standby);
    }
    if input.job.meta().deletion_timestamp.is_some() {
        // The garbage collector removes the PodGroup through its ownerReference.
        return Plan::new(Outcome::Done);
    }
    let enablement = &input.settings.enablement;
    let mode = enablement.namespace_mode(input.namespace_annotations);
    if mode == Mode::Off {
        return Plan::delete_all(input, Mode::Manage);
    }
    let job = match job::normalize_object(input.kind, input.job) {
        Ok(j) => j,
        Err(invalid) => return Plan::invalid(&invalid),
    };
    let around = Around {
        namespace_annotations: input.namespace_annotations,
        priorities: input.priorities,
        defaults: input.defaults,
        pod_groups: input.pod_groups,
        enablement: &input.settings.enablement,
        backend_options: &input.settings.backend_options,
        keep_finished: input.settings.keep_finished,
    };
    match target(&job, &around) {
        Ok(t) => plan_active(input, mode, &job, t),
        Err(NoPodGroup::OptedOut | NoPodGroup::ManagedElsewhere) => {
            Plan::delete_all(input, Mode::Manage)
        }
        // A dry-run namespace never had a PodGroup written.
        Err(NoPodGroup::Finished | NoPodGroup::Suspended) => Plan::delete_all(input, mode),
        Err(NoPodGroup::Invalid(invalid)) => Plan::invalid(&invalid),
        Err(NoPodGroup::UnknownBackend(msg)) => {
            let mut plan = Plan::new(Outcome::Invalid);
            plan.tallies.push(Tally::Invalid("InvalidBackend"));
            plan.events.push((Reason::InvalidBackend, msg.to_string()));
            plan
        }
        Err(NoPodGroup::NotServed(backend_kind)) => {
            let mut plan = Plan::new(Outcome::RequeueAfter(Duration::from_secs(300)));
            plan.tallies.push(Tally::BackendUnavailable(backend_kind));
            plan.events.push((
                Reason::BackendUnavailable,
                format!(
                    "{}; the PodGroup is created once it is",
                    backend_kind.backend().not_served()
                ),
            ));
            plan
        }
    }
}

/// An active job with its PodGroups chosen ([`target`]): report what is off in the templates,
/// then create, update or leave each PodGroup (SPEC §3) — the job's one, or one per group.
/// The gang with the cluster's tier numbers, when it asks for a placement (SPEC §13).
fn with_tiers(mut gang: Gang, tiers: &Arc<TierNumbers>) -> Gang {
    if !gang.topology.is_empty() {
        gang.topology.tiers = tiers.clone();
    }
    gang
}

fn plan_active(input: &Input, mode: Mode, job: &Job, t: Target) -> Plan {
    let Target {
        backend: backend_kind,
        name,
        names,
        gang,
        warnings: name_warnings,
        grouped,
    } = t;
    let gang = &with_tiers(gang, input.tiers);
    let opts = &input.settings.backend_options;
    let backend = backend_kind.backend();
    let mut plan = Plan::new(Outcome::Done);
    // A job refused before stays reported until a write succeeds.
    plan.valid = input.refused.is_none();
    let existing: Vec<_> = names
        .iter()
        .map(|n| input.pod_groups.get(backend_kind, &job.namespace, n))
        .collect();
    let mut warnings = gang.warnings.clone();
    warnings.extend(name_warnings);
    let ours_spec = existing
        .iter()
        .flatten()
        .filter(|pg| ours(pg, &job.uid, &opts.instance))
        .filter_map(|pg| pg.data.get("spec"));
    for spec in ours_spec {
        let changes = backend::immutable_changes(backend, job, gang, spec, opts);
        // A field the cluster drops is reported as such (plan_pod_group), not as a change.
        let dropped = |f: &str| input.dropped.contains(&(backend_kind, f.to_string()));
        for (_, w) in changes.into_iter().filter(|(f, _)| !dropped(f)) {
            if !warnings.contains(&w) {
                warnings.push(w);
            }
        }
    }
    if !warnings.is_empty() {
        plan.events
            .push((Reason::GangSpecWarning, warnings.join("; ")));
    }
    let gaps = backend.topology_gaps(job, gang, opts);
    if !gaps.is_empty() {
        plan.events
            .push((Reason::TopologyNotEnforced, gaps.join("; ")));
    }
    // Beside Kueue (SPEC §12): quota coherence and timeouts; a Volcano gang's minResources
    // capped at what Kueue admitted.
    let kueue = kueue_review(input, job, gang, backend_kind, grouped);
    plan.events.extend(kueue.events);
    let gang = kueue.capped.as_ref().unwrap_or(gang);
    let shown = if grouped {
        format!("{name}-<group index>")
    } else {
        name.clone()
    };
    let missing = backend::missing_links(backend, job, &name, opts, input.settings.webhook);
    if !missing.is_empty() {
        plan.events.push((
            Reason::MissingPodGroupLink,
            format!(
                "pods of these templates will not join PodGroup {shown}: {}",
                missing.join("; ")
            ),
        ));
    }
    // Pods of a job whose every PodGroup name is held by someone else are left unlinked by the
    // webhook on purpose (PodGroupConflict says why): not reported as pods it missed.
    let all_held = existing.iter().all(|pg| {
        pg.as_ref()
            .is_some_and(|pg| !ours(pg, &job.uid, &opts.instance))
    });
    let unlinked = (!all_held)
        .then(|| unlinked_pods(input, mode, job, &shown))
        .flatten();
    if let Some((message, pods)) = unlinked {
        plan.events.push((Reason::PodsNotLinked, message));
        plan.occurrences.push((Reason::PodsNotLinked, pods));
    }
    if mode == Mode::Manage {
        // A PodGroup this job owns under another name or backend is stale (of a job of groups:
        // one of a group that is gone).
        plan.deletes = stale(input, Some((backend_kind, &names)));
    }
    for (name, pg) in names.iter().zip(existing) {
        let part = Plan::new(Outcome::Done);
        plan.absorb(plan_pod_group(
            input,
            mode,
            job,
            gang,
            backend_kind,
            name,
            pg,
            part,
        ));
    }
    plan
}

/// What Kueue's admission of the job changes (SPEC §12; see `kueue::quota`). A job of several
/// gangs has one Workload per group, which is not compared.
fn kueue_review(
    input: &Input,
    job: &Job,
    gang: &Gang,
    backend_kind: BackendKind,
    grouped: bool,
) -> crate::kueue::quota::Review {
    let queued = input
        .job
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(crate::kueue::QUEUE_LABEL));
    // Most jobs are not Kueue's: nothing to review, and no PodGroup spec built for it.
    if grouped || !(queued || input.kueue.is_some()) {
        return Default::default();
    }
    let opts = &input.settings.backend_options;
    let timeout = input.settings.kueue_pods_ready_timeout.and_then(|_| {
        let spec = backend_kind.backend().spec(job, gang, None, opts);
        let t = spec.get("scheduleTimeoutSeconds").and_then(Value::as_i64)?;
        i32::try_from(t).ok()
    });
    crate::kueue::quota::review(
        gang,
        backend_kind,
        input.kueue,
        queued,
        timeout,
        input.settings.kueue_pods_ready_timeout,
    )
}

/// Pods of the gang that the pod-link webhook did not link (SPEC §8): they run outside the
/// gang, so the job is told how many, how to find them and how to get them linked. The note
/// stays the same as more pods join them — one Event per job, whose series count is the number
/// of pods — so a 200-worker job without the webhook makes one Event, not 200.
fn unlinked_pods(input: &Input, mode: Mode, job: &Job, name: &str) -> Option<(String, u32)> {
    if !input.settings.webhook || mode != Mode::Manage {
        return None;
    }
    let pods = input
        .unlinked_pods
        .iter()
        .filter(|(_, set)| set.as_deref().is_none_or(|s| job.in_gang(s)))
        .count();
    if pods == 0 {
        return None;
    }
    Some((
        format!(
            "pods of this job were created without the link to PodGroup {name} and run outside the gang (the Event's count is how many); the pod-link webhook did not admit them (it was stopped or unreachable, or the job was not in its cache yet). Delete them and the operator recreates them linked: kubectl get pods -n {ns} -l {label}={job} lists the job's pods, and those without the link are the ones",
            ns = job.namespace,
            label = job.kind.pod_label,
            job = job.name,
        ),
        pods as u32,
    ))
}

/// The PodGroup itself: a conflict, an update of ours, or a create (SPEC §3, §4).
#[allow(clippy::too_many_arguments)]
fn plan_pod_group(
    input: &Input,
    mode: Mode,
    job: &Job,
    gang: &Gang,
    backend_kind: BackendKind,
    name: &str,
    existing: Option<Arc<DynamicObject>>,
    mut plan: Plan,
) -> Plan {
    let backend = backend_kind.backend();
    let opts = &input.settings.backend_options;
    let existing_spec = existing.as_ref().and_then(|pg| pg.data.get("spec"));
    let freeze = existing.is_some() && input.settings.resize != ResizePolicy::Always;
    let mut desired =
        backend::desired_object(backend, job, gang, name, existing_spec, freeze, opts);
    crate::dropped::strip(&mut desired, backend_kind, input.dropped);
    if let Some(note) = dropped_note(input, job, gang, backend_kind, existing_spec) {
        plan.events.push((Reason::GangSpecWarning, note));
    }
    let running = existing
        .as_ref()
        .is_some_and(|pg| backend.phase(pg.data.get("status")) == Phase::Running);
    if mode == Mode::Manage && !running {
        plan = feasibility(input, plan, job, gang, backend_kind, name, &desired["spec"]);
    }
    let Some(pg) = existing else {
        if mode == Mode::DryRun {
            plan.events.push((
                Reason::WouldCreatePodGroup,
                format!("{backend_kind} PodGroup {name}: {}", desired["spec"]),
            ));
            return plan;
        }
        let mut body = desired;
        body["metadata"]["resourceVersion"] = Value::from(CREATE_ONLY);
        return with_write(input, plan, backend_kind, name, Op::Create, body, gang);
    };
    if !ours(&pg, &job.uid, &input.settings.backend_options.instance) {
        return conflict(plan, &pg, &job.uid, backend_kind, name);
    }
    let mut actual = serde_json::to_value(pg.as_ref()).unwrap_or(Value::Null);
    // The items of a list of a built-in API (the native backend's) carry no apiVersion and
    // kind, so a PodGroup cached from a relist has none: they are the backend's by definition.
    for field in ["apiVersion", "kind"] {
        if actual.get(field).is_none() {
            actual[field] = desired[field].clone();
        }
    }
    backend.accept_rewrites(&mut desired, &actual);
    if needs_apply(&desired, &actual, FIELD_MANAGER) {
        if mode == Mode::DryRun {
            plan.events.push((
                Reason::WouldUpdatePodGroup,
                format!("{backend_kind} PodGroup {name}: {}", desired["spec"]),
            ));
        } else {
            plan = with_write(input, plan, backend_kind, name, Op::Update, desired, gang);
            if plan.outcome == Outcome::Invalid {
                return plan;
            }
        }
    }
    status(input, plan, backend_kind, &pg, gang.min_member)
}

/// What the job asks for in fields the cluster drops (see `dropped`), said once; `None` when it
/// asks for none. The backend's own spec is read, not the desired object: an immutable field is
/// already out of that when the stored PodGroup lacks it.
fn dropped_note(
    input: &Input,
    job: &Job,
    gang: &Gang,
    backend_kind: BackendKind,
    existing_spec: Option<&Value>,
) -> Option<String> {
    let fields: Vec<&str> = input
        .dropped
        .iter()
        .filter(|(b, _)| *b == backend_kind)
        .map(|(_, f)| f.as_str())
        .collect();
    if fields.is_empty() {
        return None;
    }
    let backend = backend_kind.backend();
    let wanted = backend.spec(job, gang, existing_spec, &input.settings.backend_options);
    let lost: Vec<&str> = fields
        .into_iter()
        .filter(|f| wanted.get(*f).is_some())
        .collect();
    let hint = lost
        .iter()
        .find_map(|f| backend.dropped_hint(f))
        .unwrap_or("a PodGroup CRD older than the field, or a feature gate off");
    (!lost.is_empty()).then(|| {
        format!(
            "the cluster's {backend_kind} PodGroups drop spec.{}: the API server does not keep {} \
             ({hint}), so what the job asks there is not enforced and not sent again",
            lost.join(", spec."),
            if lost.len() == 1 { "it" } else { "them" },
        )
    })
}

/// Adds the write, unless the PodGroup's schema refused this very object for the job before:
/// then the refusal is reported again and nothing is sent until a job change alters the object.
/// An object refused at admission is sent again (see `refusal`).
fn with_write(
    input: &Input,
    mut plan: Plan,
    backend: BackendKind,
    name: &str,
    op: Op,
    body: Value,
    gang: &Gang,
) -> Plan {
    if let Some(r) = input.refused.filter(|r| r.holds_back(&body)) {
        plan.add_invalid(&InvalidJob::RefusedByApiServer(r.message.clone()));
        return plan;
    }
    plan.writes.push(Write {
        backend,
        name: name.to_string(),
        op,
        body,
        min_member: gang.min_member,
    });
    plan
}

/// A PodGroup of that name that podgroup-sync did not make for this job: left untouched.
fn conflict(
    mut plan: Plan,
    pg: &DynamicObject,
    uid: &str,
    backend_kind: BackendKind,
    name: &str,
) -> Plan {
    let refs = pg.metadata.owner_references.iter().flatten();
    let owner = if refs.clone().any(|o| o.uid == uid) {
        "this job, but was not made by podgroup-sync (is the operator's own gang scheduling on?)"
            .to_string()
    } else {
        refs.clone()
            .find(|o| o.controller == Some(true))
            .map(|o| format!("{} {}", o.kind, o.name))
            .unwrap_or_else(|| "no controller".into())
    };
    plan.outcome = Outcome::Conflict;
    plan.tallies.push(Tally::Conflict);
    plan.events.push((
        Reason::PodGroupConflict,
        format!(
            "{backend_kind} PodGroup {name} already exists and is controlled by {owner}; podgroup-sync leaves it untouched"
        ),
    ));
    plan
}

/// Whether the gang can be placed at all (SPEC §10): a pod that fits no schedulable node,
/// minResources above them all, a Volcano queue that cannot take it. Reported, never blocking;
/// a gang reported before and fine now is reported as feasible again.
fn feasibility(
    input: &Input,
    mut plan: Plan,
    job: &Job,
    gang: &Gang,
    backend_kind: BackendKind,
    name: &str,
    spec: &Value,
) -> Plan {
    let mut health = plan_health(input, &plan, backend_kind, name);
    if let Some(capacity) = input.capacity {
        let problems = feasible::problems(job, gang, capacity);
        if !problems.is_empty() {
            plan.events.push((
                Reason::GangInfeasible,
                format!(
                    "the gang cannot be placed on this cluster's nodes as they are: {}. The PodGroup is kept and waits (node selectors and affinity not considered)",
                    problems.join("; ")
                ),
            ));
        } else if health.infeasible {
            plan.cleared(
                Reason::GangInfeasible,
                "the gang fits the cluster's schedulable nodes now".into(),
            );
        }
        health.infeasible = !problems.is_empty();
    }
    if let (Some(queues), Some(queue)) = (input.queues, backend_kind.backend().queue(spec)) {
        let problem = feasible::queue_problem(queue, queues);
        if let Some(p) = &problem {
            plan.events.push((Reason::QueueUnavailable, p.clone()));
        } else if health.queue_unavailable {
            plan.cleared(
                Reason::QueueUnavailable,
                format!("Volcano queue {queue:?} is Open"),
            );
        }
        health.queue_unavailable = problem.is_some();
    }
    plan.health.insert(name.to_string(), health);
    plan
}

/// The health of PodGroup `name` the plan carries so far, else what was remembered (for this
/// backend).
fn plan_health(input: &Input, plan: &Plan, backend_kind: BackendKind, name: &str) -> JobHealth {
    plan.health
        .get(name)
        .or_else(|| input.health.and_then(|h| h.get(name)))
        .cloned()
        .filter(|h| h.backend == Some(backend_kind))
        .unwrap_or_else(|| JobHealth {
            backend: Some(backend_kind),
            ..JobHealth::default()
        })
}

/// A gang that ran whole and lost pods (SPEC §10), from the PodGroup's status.
fn broken_gang(
    input: &Input,
    mut plan: Plan,
    backend_kind: BackendKind,
    pg: &DynamicObject,
    min_member: u32,
) -> Plan {
    let name = pg.name_any();
    let mut health = plan_health(input, &plan, backend_kind, &name);
    let look = broken::look(
        Some(&health.gang),
        (&pg.uid().unwrap_or_default(), &name),
        backend_kind.backend().running_pods(pg.data.get("status")),
        min_member,
        input.now,
        input.settings.gang_broken_after,
    );
    if let Some((reason, note)) = look.event {
        if reason == Reason::GangRecovered {
            plan.forget.push(Reason::GangBroken);
        }
        plan.events.push((reason, note));
    }
    if let (Some(d), Outcome::Done) = (look.again_in, plan.outcome) {
        plan.outcome = Outcome::RequeueAfter(d);
    }
    health.gang = look.memory;
    plan.health.insert(name, health);
    plan
}

/// Mirrors why the scheduler holds a gang back as Events, and asks to look again while it waits
/// (SPEC §5).
fn status(
    input: &Input,
    mut plan: Plan,
    backend_kind: BackendKind,
    pg: &DynamicObject,
    min_member: u32,
) -> Plan {
    let backend = backend_kind.backend();
    let status = pg.data.get("status");
    let phase = backend.phase(status);
    plan = broken_gang(input, plan, backend_kind, pg, min_member);
    let age = pg
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| Duration::try_from(input.now.duration_since(t.0)).unwrap_or_default())
        .unwrap_or_default();
    plan.phases.push(SeenPhase {
        backend: backend_kind,
        name: pg.name_any(),
        uid: pg.uid().unwrap_or_default(),
        phase,
        age,
    });
    if phase == Phase::Running {
        return plan;
    }
    if let Some((reason, message)) = backend.unschedulable(status) {
        // The scheduler's reason names no topology: a gang held to one domain may find no room
        // there while the cluster has plenty (SPEC §13).
        let held = serde_json::to_value(pg)
            .ok()
            .and_then(|pg| backend.held_to(&pg))
            .map(|h| {
                format!(
                    "; its PodGroup holds the gang to {h}: room elsewhere in the cluster does \
                     not help"
                )
            })
            .unwrap_or_default();
        plan.events.push((
            Reason::GangUnschedulable,
            format!("PodGroup {}: {reason}: {message}{held}", pg.name_any()),
        ));
        return plan;
    }
    if matches!(phase, Phase::Pending | Phase::Scheduling) {
        let limit = input.settings.gang_wait_warning;
        if age >= limit {
            plan.events.push((
                Reason::GangWaiting,
                format!(
                    "PodGroup {} has been {} for more than {}s: the gang is waiting for its pods or for capacity",
                    pg.name_any(),
                    phase.as_str(),
                    limit.as_secs()
                ),
            ));
        } else if plan.outcome == Outcome::Done {
            plan.outcome = Outcome::RequeueAfter(limit - age + Duration::from_secs(1));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    //! One test per row of SPEC §4 and per enablement rule of SPEC §2, on the planner alone.

    use std::collections::{BTreeMap, BTreeSet};

    use serde_json::json;

    use super::*;
    use crate::backend::BackendOptions;
    use crate::enablement::Enablement;

    const UID: &str = "job-uid-1";

    /// SPEC §13 rows: what each backend's PodGroup gets of a topology request.
    mod topology;

    /// PodGroups as the caches would hold them.
    #[derive(Default)]
    struct Cached {
        served: BTreeSet<BackendKind>,
        pgs: BTreeMap<(BackendKind, String, String), Arc<DynamicObject>>,
    }

    impl Cached {
        fn serving_both() -> Self {
            Cached {
                served: [BackendKind::SchedulerPlugins, BackendKind::Volcano].into(),
                ..Cached::default()
            }
        }

        fn with(mut self, backend: BackendKind, pg: Value) -> Self {
            let pg: DynamicObject = serde_json::from_value(pg).unwrap();
            let key = (backend, pg.namespace().unwrap(), pg.name_any());
            self.pgs.insert(key, Arc::new(pg));
            self
        }
    }

    impl PodGroups for Cached {
        fn served(&self, backend: BackendKind) -> bool {
            self.served.contains(&backend)
        }
        fn get(&self, b: BackendKind, ns: &str, name: &str) -> Option<Arc<DynamicObject>> {
            self.pgs.get(&(b, ns.into(), name.into())).cloned()
        }
        fn controlled_by(&self, uid: &str) -> Vec<(BackendKind, Arc<DynamicObject>)> {
            self.pgs
                .iter()
                .filter(|(_, pg)| {
                    pg.owner_references()
                        .iter()
                        .any(|r| r.controller == Some(true) && r.uid == uid)
                })
                .map(|((b, _, _), pg)| (*b, pg.clone()))
                .collect()
        }
    }

    fn settings() -> Settings {
        Settings {
            enablement: Enablement {
                annotation_key: "podgroup-sync.io/enabled".into(),
                default_mode: Mode::Off,
                default_backend: BackendKind::SchedulerPlugins,
            },
            backend_options: BackendOptions::default(),
            resize: ResizePolicy::Always,
            keep_finished: false,
            batch_jobs: false,
            gang_wait_warning: Duration::from_secs(300),
            gang_broken_after: Duration::from_secs(60),
            feasibility: false,
            audit_interval: Duration::ZERO,
            kueue_pods_ready_timeout: None,
            webhook: false,
        }
    }

    fn worker(replicas: u64) -> Value {
        json!({"replicas": replicas, "template": {
            "metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "train"}},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}}})
    }

    /// A PyTorchJob `train` in namespace `ml` with `workers` workers.
    fn job(workers: u64) -> Value {
        json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "ml", "uid": UID, "generation": 1,
                "creationTimestamp": "2026-12-01T00:00:00Z"},
            "spec": {"pytorchReplicaSpecs": {"Worker": worker(workers)}}})
    }

    fn annotations(mode: &str) -> BTreeMap<String, String> {
        [("podgroup-sync.io/enabled".to_string(), mode.to_string())].into()
    }

    /// Plans `job` in a namespace with these annotations, against these PodGroups.
    fn plan_with(
        job: &Value,
        ns: Option<&BTreeMap<String, String>>,
        pgs: &Cached,
        s: &Settings,
    ) -> Plan {
        plan_full(job, ns, pgs, s, None, true)
    }

    fn plan_full(
        job: &Value,
        ns: Option<&BTreeMap<String, String>>,
        pgs: &Cached,
        s: &Settings,
        refused: Option<&Refusal>,
        leading: bool,
    ) -> Plan {
        plan_unlinked(job, ns, pgs, s, refused, leading, &[])
    }

    fn plan_unlinked(
        job: &Value,
        ns: Option<&BTreeMap<String, String>>,
        pgs: &Cached,
        s: &Settings,
        refused: Option<&Refusal>,
        leading: bool,
        unlinked_pods: &[(String, Option<String>)],
    ) -> Plan {
        let obj: DynamicObject = serde_json::from_value(job.clone()).unwrap();
        let kind = crate::kinds::lookup(
            job["apiVersion"].as_str().unwrap(),
            job["kind"].as_str().unwrap(),
        )
        .unwrap();
        plan(&Input {
            kind,
            job: &obj,
            leading,
            namespace_annotations: ns,
            priorities: &Priorities::default(),
            defaults: &Ok(AdmissionDefaults::default()),
            pod_groups: pgs,
            refused,
            unlinked_pods,
            settings: s,
            now: "2026-12-01T00:10:00Z".parse().unwrap(),
            health: None,
            capacity: None,
            queues: None,
            kueue: None,
            dropped: &BTreeSet::new(),
            tiers: &Default::default(),
        })
    }

    fn managed(job: &Value, pgs: &Cached) -> Plan {
        plan_with(job, Some(&annotations("true")), pgs, &settings())
    }

    /// The PodGroup the API server would hold after `write` was applied.
    fn stored(write: &Write, status: Value) -> Value {
        let mut pg = write.body.clone();
        let meta = pg["metadata"].as_object_mut().unwrap();
        meta.remove("resourceVersion");
        meta.insert("uid".into(), json!("pg-uid-1"));
        meta.insert("creationTimestamp".into(), json!("2026-12-01T00:09:00Z"));
        pg["status"] = status;
        pg
    }

    fn created(job: &Value) -> (Write, Cached) {
        let write = managed(job, &Cached::serving_both())
            .write()
            .cloned()
            .unwrap();
        let pgs =
            Cached::serving_both().with(write.backend, stored(&write, json!({"phase": "Running"})));
        (write, pgs)
    }

    fn reasons(p: &Plan) -> Vec<Reason> {
        p.events.iter().map(|(r, _)| *r).collect()
    }

    fn set(v: &mut Value, pointer: &str, value: Value) {
        *v.pointer_mut(pointer).unwrap() = value;
    }

    #[test]
    fn row_job_created_in_an_enabled_namespace_creates_the_pod_group() {
        let p = managed(&job(3), &Cached::serving_both());
        let w = p.write().cloned().expect("a write");
        assert_eq!(
            (w.op, w.backend, w.name.as_str()),
            (Op::Create, BackendKind::SchedulerPlugins, "train")
        );
        assert_eq!(w.body["spec"]["minMember"], 3);
        assert_eq!(w.body["spec"]["minResources"]["cpu"], "3");
        assert_eq!(
            w.body["metadata"]["resourceVersion"], CREATE_ONLY,
            "create-only apply"
        );
        assert_eq!(w.body["metadata"]["ownerReferences"][0]["uid"], UID);
        assert!(p.deletes.is_empty() && p.events.is_empty());
        assert_eq!(p.outcome, Outcome::Done);
    }

    /// A LeaderWorkerSet `serve` of `replicas` groups of 3, `created` groups in its status.
    fn lws(replicas: u64, created: u64, updating: bool) -> Value {
        let t = json!({"spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": "1"}}}]}});
        json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "serve", "namespace": "ml", "uid": UID, "generation": 1,
                "creationTimestamp": "2026-12-01T00:00:00Z"},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": 3, "workerTemplate": t},
                "rolloutStrategy": {"rollingUpdateConfiguration": {"maxSurge": "50%"}}},
            "status": {"replicas": created, "conditions": [{"type": "UpdateInProgress",
                "status": if updating { "True" } else { "False" }}]}})
    }

    #[test]
    fn row_11_an_lws_gets_one_pod_group_per_group_and_loses_only_the_groups_gone() {
        let p = managed(&lws(3, 0, false), &Cached::serving_both());
        let names: Vec<&str> = p.writes.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["serve-0", "serve-1", "serve-2"]);
        assert!(p.writes.iter().all(|w| w.op == Op::Create
            && w.body["spec"]["minMember"] == 3
            && w.body["spec"]["minResources"]["cpu"] == "3"));
        let mut pgs = Cached::serving_both();
        for w in &p.writes {
            pgs = pgs.with(w.backend, stored(w, json!({"phase": "Running"})));
        }
        // Nothing changed: nothing written.
        let again = managed(&lws(3, 3, false), &pgs);
        assert!(
            again.writes.is_empty() && again.deletes.is_empty(),
            "{again:?}"
        );
        // Scaled to 2 while the third leader is still there: its PodGroup stays.
        assert!(managed(&lws(2, 3, false), &pgs).deletes.is_empty());
        // The third group gone: only its PodGroup is deleted.
        let down = managed(&lws(2, 2, false), &pgs);
        let gone: Vec<&str> = down.deletes.iter().map(|d| d.name.as_str()).collect();
        assert_eq!((gone, down.writes.len()), (vec!["serve-2"], 0));
        // A rolling update with maxSurge 50% of 2 groups: one surge group, before its pods.
        let surge = managed(&lws(2, 2, true), &pgs);
        assert!(surge.deletes.is_empty());
        assert!(surge.writes.is_empty(), "serve-2 is still there: {surge:?}");
        let mut two = Cached::serving_both();
        for w in &p.writes[..2] {
            two = two.with(w.backend, stored(w, json!({"phase": "Running"})));
        }
        let surge = managed(&lws(2, 2, true), &two);
        let made: Vec<&str> = surge.writes.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(made, ["serve-2"]);
        // Off: every group's PodGroup goes.
        let off = plan_with(
            &lws(2, 2, false),
            Some(&annotations("false")),
            &pgs,
            &settings(),
        );
        assert_eq!(off.deletes.len(), 3);
    }

    #[test]
    fn row_job_spec_change_updates_the_difference_only() {
        let (_, pgs) = created(&job(3));
        let p = managed(&job(5), &pgs);
        let w = p.write().cloned().expect("an update");
        assert_eq!(w.op, Op::Update);
        assert_eq!(w.body["spec"]["minMember"], 5);
        assert!(
            w.body["metadata"].get("resourceVersion").is_none(),
            "an update is no create-only apply"
        );
    }

    #[test]
    fn row_resize_while_suspended_and_never_keep_the_size_of_an_existing_pod_group() {
        let (_, pgs) = created(&job(3));
        for resize in [ResizePolicy::WhileSuspended, ResizePolicy::Never] {
            let s = Settings {
                resize,
                ..settings()
            };
            let p = plan_with(&job(5), Some(&annotations("true")), &pgs, &s);
            assert_eq!(p.write(), None, "{resize:?}: the size stays 3");
        }
        // A new PodGroup (after a suspend) gets the new size.
        let s = Settings {
            resize: ResizePolicy::WhileSuspended,
            ..settings()
        };
        let p = plan_with(
            &job(5),
            Some(&annotations("true")),
            &Cached::serving_both(),
            &s,
        );
        assert_eq!(p.write().cloned().unwrap().body["spec"]["minMember"], 5);
    }

    #[test]
    fn row_nothing_changed_writes_nothing() {
        let (_, pgs) = created(&job(3));
        let p = managed(&job(3), &pgs);
        assert_eq!((p.write(), p.deletes.len(), p.events.len()), (None, 0, 0));
        assert_eq!(p.outcome, Outcome::Done);
    }

    #[test]
    fn row_job_finished_deletes_the_pod_group_unless_finished_ones_are_kept() {
        let (_, pgs) = created(&job(3));
        for condition in ["Succeeded", "Failed"] {
            let mut j = job(3);
            j["status"] = json!({"conditions": [{"type": condition, "status": "True"}]});
            let p = managed(&j, &pgs);
            assert_eq!(
                p.deletes,
                vec![Delete {
                    backend: BackendKind::SchedulerPlugins,
                    name: "train".into(),
                    uid: Some("pg-uid-1".into())
                }],
                "{condition}"
            );
            assert_eq!(p.write(), None);
            let keep = Settings {
                keep_finished: true,
                batch_jobs: false,
                ..settings()
            };
            let p = plan_with(&j, Some(&annotations("true")), &pgs, &keep);
            assert!(p.deletes.is_empty(), "--keep-finished");
        }
    }

    #[test]
    fn row_job_suspended_deletes_and_resume_recreates() {
        let (_, pgs) = created(&job(3));
        let mut j = job(3);
        j["spec"]["runPolicy"] = json!({"suspend": true});
        let p = managed(&j, &pgs);
        assert_eq!(p.deletes.len(), 1);
        assert_eq!(p.write(), None);
        set(&mut j, "/spec/runPolicy/suspend", json!(false));
        let p = managed(&j, &Cached::serving_both());
        assert_eq!(p.write().cloned().unwrap().op, Op::Create);
    }

    #[test]
    fn row_job_deleted_leaves_the_pod_group_to_the_garbage_collector() {
        let (_, pgs) = created(&job(3));
        let mut j = job(3);
        j["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:05:00Z");
        let p = managed(&j, &pgs);
        assert_eq!(
            (p.write(), p.deletes.len(), p.outcome),
            (None, 0, Outcome::Done)
        );
    }

    #[test]
    fn row_pod_group_deleted_by_someone_while_the_job_is_active_is_recreated() {
        let (_, pgs) = created(&job(3));
        assert_eq!(managed(&job(3), &pgs).write(), None);
        // The watch of owned PodGroups takes it out of the cache: the next reconcile recreates.
        let p = managed(&job(3), &Cached::serving_both());
        assert_eq!(p.write().cloned().unwrap().op, Op::Create);
    }

    #[test]
    fn row_job_recreated_with_the_same_name_never_touches_the_other_jobs_pod_group() {
        let (_, pgs) = created(&job(3));
        let mut j = job(3);
        j["metadata"]["uid"] = json!("job-uid-2");
        let p = managed(&j, &pgs);
        assert_eq!(p.write(), None);
        assert!(p.deletes.is_empty());
        assert_eq!(p.outcome, Outcome::Conflict);
        assert_eq!(p.tallies, vec![Tally::Conflict]);
        // The old job's PodGroups are deleted with its PodGroup's UID as the precondition.
        let mut old = job(3);
        old["spec"]["runPolicy"] = json!({"suspend": true});
        let d = managed(&old, &pgs).deletes;
        assert_eq!(d[0].uid.as_deref(), Some("pg-uid-1"));
    }

    #[test]
    fn row_namespace_turned_off_deletes_what_podgroup_sync_made_there() {
        let (_, pgs) = created(&job(3));
        for off in [Some(annotations("false")), Some(annotations("yes")), None] {
            let p = plan_with(&job(3), off.as_ref(), &pgs, &settings());
            assert_eq!(p.deletes.len(), 1, "{off:?}");
            assert_eq!(p.write(), None);
        }
    }

    #[test]
    fn row_namespace_in_dry_run_reports_and_never_writes() {
        let dry = annotations("dry-run");
        let p = plan_with(&job(3), Some(&dry), &Cached::serving_both(), &settings());
        assert_eq!(p.write(), None);
        assert_eq!(reasons(&p), vec![Reason::WouldCreatePodGroup]);
        assert!(
            p.events[0].1.contains("\"minMember\":3"),
            "{}",
            p.events[0].1
        );
        let (_, pgs) = created(&job(3));
        let p = plan_with(&job(4), Some(&dry), &pgs, &settings());
        assert_eq!(
            (p.write(), reasons(&p)),
            (None, vec![Reason::WouldUpdatePodGroup])
        );
        // Finishing in dry-run deletes nothing.
        let mut j = job(3);
        j["status"] = json!({"conditions": [{"type": "Succeeded", "status": "True"}]});
        assert!(
            plan_with(&j, Some(&dry), &pgs, &settings())
                .deletes
                .is_empty()
        );
    }

    #[test]
    fn rule_2_default_mode_enables_namespaces_without_the_annotation() {
        let s = Settings {
            enablement: Enablement {
                default_mode: Mode::Manage,
                ..settings().enablement
            },
            ..settings()
        };
        assert!(
            plan_with(&job(2), None, &Cached::serving_both(), &s)
                .write()
                .is_some()
        );
        // The annotation still decides where it is set.
        assert!(
            plan_with(
                &job(2),
                Some(&annotations("off")),
                &Cached::serving_both(),
                &s
            )
            .write()
            .is_none()
        );
    }

    #[test]
    fn rule_2_the_annotation_key_is_configurable() {
        let s = Settings {
            enablement: Enablement {
                annotation_key: "example.com/gang".into(),
                ..settings().enablement
            },
            ..settings()
        };
        let ns: BTreeMap<String, String> =
            [("example.com/gang".to_string(), "true".to_string())].into();
        assert!(
            plan_with(&job(2), Some(&ns), &Cached::serving_both(), &s)
                .write()
                .is_some()
        );
        assert!(
            plan_with(
                &job(2),
                Some(&annotations("true")),
                &Cached::serving_both(),
                &s
            )
            .write()
            .is_none()
        );
    }

    #[test]
    fn rule_2_a_job_opts_out_with_false() {
        let (_, pgs) = created(&job(3));
        let mut j = job(3);
        j["metadata"]["annotations"] = json!({"podgroup-sync.io/enabled": "false"});
        let p = managed(&j, &pgs);
        assert_eq!((p.write(), p.deletes.len()), (None, 1));
    }

    #[test]
    fn rule_2_a_job_managed_by_another_controller_is_skipped() {
        let mut j = job(3);
        j["spec"]["runPolicy"] = json!({"managedBy": "kueue.x-k8s.io/multikueue"});
        let p = managed(&j, &Cached::serving_both());
        assert_eq!((p.write(), p.events.len()), (None, 0));
        j["spec"]["runPolicy"]["managedBy"] = json!("kubeflow.org/training-operator");
        assert!(managed(&j, &Cached::serving_both()).write().is_some());
    }

    #[test]
    fn rule_2_backend_job_annotation_beats_namespace_annotation_beats_templates_beats_default() {
        let backend = |job_ann: Option<&str>, ns_ann: Option<&str>, volcano_template: bool| {
            let mut j = job(2);
            if let Some(b) = job_ann {
                j["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": b});
            }
            if volcano_template {
                let t = &mut j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"];
                t["metadata"] = json!({"annotations": {"scheduling.k8s.io/group-name": "train"}});
                t["spec"]["schedulerName"] = json!("volcano");
            }
            let mut ns = annotations("true");
            if let Some(b) = ns_ann {
                ns.insert("podgroup-sync.io/backend".into(), b.into());
            }
            plan_with(&j, Some(&ns), &Cached::serving_both(), &settings())
                .write()
                .unwrap()
                .backend
        };
        use BackendKind::{SchedulerPlugins as Sp, Volcano as Vc};
        assert_eq!(backend(None, None, false), Sp, "the default");
        assert_eq!(backend(None, None, true), Vc, "inferred from the templates");
        assert_eq!(
            backend(None, Some("scheduler-plugins"), true),
            Sp,
            "namespace beats templates"
        );
        assert_eq!(
            backend(Some("volcano"), Some("scheduler-plugins"), false),
            Vc,
            "job beats namespace"
        );
    }

    #[test]
    fn rule_2_an_unknown_backend_is_reported_not_written() {
        let mut j = job(2);
        j["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "kai"});
        let p = managed(&j, &Cached::serving_both());
        assert_eq!((&p.write(), p.outcome), (&None, Outcome::Invalid));
        assert_eq!(reasons(&p), vec![Reason::InvalidBackend]);
        assert_eq!(p.tallies, vec![Tally::Invalid("InvalidBackend")]);
    }

    #[test]
    fn rule_2_a_backend_whose_crd_is_not_served_is_reported_and_looked_at_again() {
        let p = managed(&job(2), &Cached::default());
        assert_eq!(p.write(), None);
        assert_eq!(reasons(&p), vec![Reason::BackendUnavailable]);
        assert_eq!(
            p.tallies,
            vec![Tally::BackendUnavailable(BackendKind::SchedulerPlugins)]
        );
        assert!(matches!(p.outcome, Outcome::RequeueAfter(_)));
    }

    #[test]
    fn rule_3_a_pod_group_of_that_name_not_made_for_this_job_is_a_conflict() {
        let theirs = json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "ml", "uid": "x",
                "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train", "uid": UID, "controller": true}]},
            "spec": {"minMember": 1}});
        let pgs = Cached::serving_both().with(BackendKind::SchedulerPlugins, theirs);
        let p = managed(&job(3), &pgs);
        assert_eq!((p.write(), p.outcome), (None, Outcome::Conflict));
        assert!(
            p.events[0].1.contains("not made by podgroup-sync"),
            "{}",
            p.events[0].1
        );
        assert!(p.deletes.is_empty(), "never deleted: it is not ours");
    }

    #[test]
    fn another_installations_pod_group_is_never_touched_and_the_default_one_adopts_unnamed_ones() {
        let pg = |labels: Value| {
            json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "ml", "uid": "x", "labels": labels,
                "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train", "uid": UID, "controller": true}]},
            "spec": {"minMember": 1}})
        };
        let team_b = json!({"app.kubernetes.io/managed-by": "podgroup-sync", "podgroup-sync.io/instance": "team-b"});
        let legacy = json!({"app.kubernetes.io/managed-by": "podgroup-sync"});
        let named = |instance: &str| {
            let mut s = settings();
            s.backend_options.instance = instance.into();
            s
        };
        for (instance, labels, ours) in [
            ("", legacy.clone(), true),
            ("", team_b.clone(), false),
            ("team-a", team_b.clone(), false),
            ("team-a", legacy.clone(), false),
            ("team-b", team_b.clone(), true),
        ] {
            let pgs =
                Cached::serving_both().with(BackendKind::SchedulerPlugins, pg(labels.clone()));
            let s = named(instance);
            let p = plan_with(&job(3), Some(&annotations("true")), &pgs, &s);
            if ours {
                assert_eq!(p.outcome, Outcome::Done, "{instance}: {labels}");
                let w = p.write().cloned().expect("resized");
                let written = &w.body["metadata"]["labels"];
                assert_eq!(
                    written
                        .get("podgroup-sync.io/instance")
                        .and_then(Value::as_str),
                    Some(instance).filter(|i| !i.is_empty())
                );
            } else {
                assert_eq!(
                    (&p.write(), p.outcome),
                    (&None, Outcome::Conflict),
                    "{instance}: {labels}"
                );
            }
            // A namespace off for this installation deletes only its own.
            let off = plan_with(&job(3), Some(&annotations("false")), &pgs, &s);
            assert_eq!(off.deletes.len(), ours as usize, "{instance}: {labels}");
        }
    }

    #[test]
    fn rule_3_a_template_without_the_pod_link_is_reported_and_the_pod_group_still_made() {
        let mut j = job(2);
        j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"] = json!({});
        let p = managed(&j, &Cached::serving_both());
        assert!(p.write().is_some());
        assert_eq!(reasons(&p), vec![Reason::MissingPodGroupLink]);
    }

    #[test]
    fn rule_8_with_the_webhook_on_templates_without_links_are_expected() {
        let mut j = job(2);
        j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"] = json!({});
        let s = Settings {
            webhook: true,
            ..settings()
        };
        let p = plan_with(&j, Some(&annotations("true")), &Cached::serving_both(), &s);
        assert!(p.write().is_some());
        assert_eq!(reasons(&p), vec![], "{:?}", p.events);
        // A schedulerName that does not reach the backend is still reported: the webhook never
        // changes one the pod asks for.
        j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["schedulerName"] =
            json!("my-scheduler");
        let p = plan_with(&j, Some(&annotations("true")), &Cached::serving_both(), &s);
        assert_eq!(reasons(&p), vec![Reason::MissingPodGroupLink]);
        assert!(
            p.events[0]
                .1
                .contains("Worker: schedulerName \"my-scheduler\""),
            "{}",
            p.events[0].1
        );
    }

    #[test]
    fn rule_8_pods_created_without_the_link_are_reported_on_the_job() {
        let s = Settings {
            webhook: true,
            ..settings()
        };
        let ns = annotations("true");
        let pods = [
            ("train-worker-0".to_string(), None),
            ("train-worker-1".to_string(), None),
        ];
        let p = plan_unlinked(
            &job(2),
            Some(&ns),
            &Cached::serving_both(),
            &s,
            None,
            true,
            &pods,
        );
        assert_eq!(reasons(&p), vec![Reason::PodsNotLinked]);
        assert!(
            p.events[0]
                .1
                .starts_with("pods of this job were created without the link to PodGroup train"),
            "{}",
            p.events[0].1
        );
        assert_eq!(p.occurrences, vec![(Reason::PodsNotLinked, 2)]);
        // More unlinked pods: the same note, a higher count.
        let three = [
            pods[0].clone(),
            pods[1].clone(),
            ("train-worker-2".into(), None),
        ];
        let more = plan_unlinked(
            &job(2),
            Some(&ns),
            &Cached::serving_both(),
            &s,
            None,
            true,
            &three,
        );
        assert_eq!(more.events, p.events);
        assert_eq!(more.occurrences, vec![(Reason::PodsNotLinked, 3)]);
        assert!(p.write().is_some(), "the PodGroup is still made");
        // Not without the webhook (MissingPodGroupLink covers templates then), not in dry-run.
        let off = plan_unlinked(
            &job(2),
            Some(&ns),
            &Cached::serving_both(),
            &settings(),
            None,
            true,
            &pods,
        );
        assert_eq!(reasons(&off), vec![]);
        let dry = plan_unlinked(
            &job(2),
            Some(&annotations("dry-run")),
            &Cached::serving_both(),
            &s,
            None,
            true,
            &pods,
        );
        assert!(!reasons(&dry).contains(&Reason::PodsNotLinked));
        // A job whose PodGroup name someone else holds: its pods are unlinked on purpose
        // (the webhook skips them); PodGroupConflict says why, PodsNotLinked would be a false
        // alarm (seen by the end-to-end tier's Prometheus).
        let theirs = json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "ml", "uid": "x"},
            "spec": {"minMember": 1}});
        let held = plan_unlinked(
            &job(2),
            Some(&ns),
            &Cached::serving_both().with(BackendKind::SchedulerPlugins, theirs),
            &s,
            None,
            true,
            &pods,
        );
        assert_eq!(held.outcome, Outcome::Conflict);
        assert!(
            !reasons(&held).contains(&Reason::PodsNotLinked),
            "{:?}",
            held.events
        );
    }

    #[test]
    fn rule_3_a_pod_group_under_another_name_or_backend_is_stale_and_deleted() {
        let (w, _) = created(&job(3));
        let mut old = stored(&w, json!({}));
        old["metadata"]["name"] = json!("old-name");
        let pgs = Cached::serving_both().with(BackendKind::SchedulerPlugins, old);
        let p = managed(&job(3), &pgs);
        assert_eq!(
            p.deletes
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>(),
            vec!["old-name"]
        );
        assert_eq!(p.write().cloned().unwrap().op, Op::Create);
    }

    #[test]
    fn rule_3_an_invalid_job_gets_an_invalid_spec_event_and_no_write() {
        let p = managed(&job(0), &Cached::serving_both());
        assert_eq!((&p.write(), p.outcome), (&None, Outcome::Invalid));
        assert_eq!(reasons(&p), vec![Reason::InvalidSpec]);
        assert_eq!(p.tallies, vec![Tally::Invalid("ZeroReplicas")]);
        assert!(!p.valid);
        let tf = json!({"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
            "metadata": {"name": "t", "namespace": "ml", "uid": "u"}, "spec": {}});
        assert_eq!(
            managed(&tf, &Cached::serving_both()).tallies,
            vec![Tally::Invalid("NoReplicaSpecs")]
        );
    }

    #[test]
    fn rule_3_an_object_the_api_server_refused_is_not_sent_again_until_it_changes() {
        let body = managed(&job(3), &Cached::serving_both())
            .write()
            .unwrap()
            .body
            .clone();
        let refused = Refusal::of(
            422,
            "spec.minMember: Invalid value",
            body,
            None,
            std::time::Instant::now(),
        )
        .unwrap();
        let p = plan_full(
            &job(3),
            Some(&annotations("true")),
            &Cached::serving_both(),
            &settings(),
            Some(&refused),
            true,
        );
        assert_eq!((&p.write(), p.outcome), (&None, Outcome::Invalid));
        assert!(p.events[0].1.contains("spec.minMember: Invalid value"));
        // A job change that alters the object is sent.
        let p = plan_full(
            &job(4),
            Some(&annotations("true")),
            &Cached::serving_both(),
            &settings(),
            Some(&refused),
            true,
        );
        assert!(p.write().is_some());
        assert!(
            !p.valid,
            "the old refusal stays reported until a write succeeds"
        );
    }

    #[test]
    fn rule_6_a_standby_replica_plans_nothing() {
        let p = plan_full(
            &job(3),
            Some(&annotations("true")),
            &Cached::serving_both(),
            &settings(),
            None,
            false,
        );
        assert_eq!(p, Plan::new(Outcome::Standby));
    }

    #[test]
    fn rule_5_a_gang_waiting_past_the_limit_is_reported_and_one_before_it_looked_at_again() {
        let (w, _) = created(&job(3));
        let pending = |created: &str| {
            let mut pg = stored(&w, json!({"phase": "Pending"}));
            pg["metadata"]["creationTimestamp"] = json!(created);
            Cached::serving_both().with(BackendKind::SchedulerPlugins, pg)
        };
        let p = managed(&job(3), &pending("2026-12-01T00:09:00Z"));
        assert_eq!(p.outcome, Outcome::RequeueAfter(Duration::from_secs(241)));
        assert_eq!(p.phase().map(|s| s.phase), Some(Phase::Pending));
        let p = managed(&job(3), &pending("2026-12-01T00:00:00Z"));
        assert_eq!(reasons(&p), vec![Reason::GangWaiting]);
        assert_eq!(p.outcome, Outcome::Done);
    }

    #[test]
    fn rule_5_volcano_unschedulable_conditions_are_mirrored() {
        let mut j = job(2);
        j["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "volcano"});
        let w = managed(&j, &Cached::serving_both())
            .write()
            .cloned()
            .unwrap();
        let pg = stored(
            &w,
            json!({"phase": "Pending", "conditions": [
            {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources", "message": "2/2 tasks in gang unschedulable"}]}),
        );
        let p = managed(&j, &Cached::serving_both().with(BackendKind::Volcano, pg));
        assert!(
            reasons(&p).contains(&Reason::GangUnschedulable),
            "{:?}",
            p.events
        );
    }

    /// A job on the native backend, and PodGroup caches serving only that backend.
    fn native_job(workers: u64) -> (Value, Cached) {
        let mut j = job(workers);
        j["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "kubernetes"});
        let served = Cached {
            served: [BackendKind::Kubernetes].into(),
            ..Cached::default()
        };
        (j, served)
    }

    #[test]
    fn rule_9_native_pod_group_has_min_count_and_needs_the_webhook() {
        let (j, served) = native_job(2);
        let p = managed(&j, &served);
        let w = p.write().expect("a write");
        assert_eq!((w.op, w.backend), (Op::Create, BackendKind::Kubernetes));
        assert_eq!(w.body["apiVersion"], "scheduling.k8s.io/v1beta1");
        assert_eq!(
            w.body["spec"],
            json!({"schedulingPolicy": {"gang": {"minCount": 2}}})
        );
        assert_eq!(reasons(&p), vec![Reason::MissingPodGroupLink]);
        assert!(p.events[0].1.contains("--webhook"), "{}", p.events[0].1);
        let webhook = Settings {
            webhook: true,
            ..settings()
        };
        let p = plan_with(&j, Some(&annotations("true")), &served, &webhook);
        assert!(p.write().is_some());
        assert_eq!(reasons(&p), vec![]);
    }

    #[test]
    fn rule_9_native_server_defaults_are_kept_and_min_count_follows_the_job() {
        let (j, served) = native_job(2);
        let w = managed(&j, &served).write().cloned().unwrap();
        // What the API server stores: the Priority admission plugin fills in the default class
        // and the priority; defaulting adds disruptionMode.
        let mut pg = stored(&w, json!({}));
        pg["spec"]["priorityClassName"] = json!("cluster-default");
        pg["spec"]["priority"] = json!(1000);
        pg["spec"]["disruptionMode"] = json!({"single": {}});
        // Items of a list of a built-in API have no apiVersion and kind (a relist at start-up).
        let meta = pg.as_object_mut().unwrap();
        meta.remove("apiVersion");
        meta.remove("kind");
        let cached = served.with(BackendKind::Kubernetes, pg);
        let p = managed(&j, &cached);
        assert!(p.write().is_none(), "nothing changed: {:?}", p.write());
        assert_eq!(reasons(&p), vec![Reason::MissingPodGroupLink]);
        assert_eq!(p.phase().cloned().unwrap().phase, Phase::Pending);
        // Scaled: minCount follows, the immutable class and disruption mode stay as stored (sent
        // back as they are, so that an apply never drops an immutable field it set before).
        let p = managed(&native_job(3).0, &cached);
        let w = p.write().cloned().expect("an update");
        assert_eq!(w.op, Op::Update);
        assert_eq!(
            w.body["spec"],
            json!({"schedulingPolicy": {"gang": {"minCount": 3}}, "priorityClassName": "cluster-default",
                "disruptionMode": {"single": {}}})
        );
        // --resize never: minCount stays too.
        let never = Settings {
            resize: ResizePolicy::Never,
            ..settings()
        };
        let p = plan_with(
            &native_job(3).0,
            Some(&annotations("true")),
            &cached,
            &never,
        );
        assert!(p.write().is_none(), "{:?}", p.write());
    }

    #[test]
    fn rule_9_a_class_change_the_server_would_refuse_is_reported_not_sent() {
        let (mut j, served) = native_job(2);
        let w = managed(&j, &served).write().cloned().unwrap();
        let mut pg = stored(&w, json!({}));
        pg["spec"]["priorityClassName"] = json!("low");
        let cached = served.with(BackendKind::Kubernetes, pg);
        j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["priorityClassName"] =
            json!("high");
        let p = managed(&j, &cached);
        assert!(p.write().is_none(), "{:?}", p.write());
        let warning = p
            .events
            .iter()
            .find(|(r, _)| *r == Reason::GangSpecWarning)
            .expect("a warning");
        assert!(
            warning.1.contains("priorityClassName cannot change")
                && warning.1.contains("\"low\"")
                && warning.1.contains("\"high\""),
            "{}",
            warning.1
        );
    }

    #[test]
    fn rule_9_native_unschedulable_condition_is_mirrored() {
        let (j, served) = native_job(2);
        let w = managed(&j, &served).write().cloned().unwrap();
        let pg = stored(
            &w,
            json!({"conditions": [{"type": "PodGroupInitiallyScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available"}]}),
        );
        let p = managed(&j, &served.with(BackendKind::Kubernetes, pg));
        let (_, message) = p
            .events
            .iter()
            .find(|(r, _)| *r == Reason::GangUnschedulable)
            .expect("GangUnschedulable");
        assert!(message.contains("0/3 nodes are available"), "{message}");
    }

    /// Plans a managed `job` beside Kueue.
    fn plan_kueue(job: &Value, admission: &crate::kueue::Admission, s: &Settings) -> Plan {
        let obj: DynamicObject = serde_json::from_value(job.clone()).unwrap();
        let ns = annotations("true");
        plan(&Input {
            kind: crate::kinds::lookup("kubeflow.org/v1", "PyTorchJob").unwrap(),
            job: &obj,
            leading: true,
            namespace_annotations: Some(&ns),
            priorities: &Priorities::default(),
            defaults: &Ok(AdmissionDefaults::default()),
            pod_groups: &Cached::serving_both(),
            refused: None,
            unlinked_pods: &[],
            settings: s,
            now: "2026-12-01T00:10:00Z".parse().unwrap(),
            health: None,
            capacity: None,
            queues: None,
            kueue: Some(admission),
            dropped: &BTreeSet::new(),
            tiers: &Default::default(),
        })
    }

    #[test]
    fn rule_12_quota_kueue_did_not_admit_is_reported_and_capped_on_volcano() {
        // Kueue admitted 3 CPUs for the 4 one-CPU workers (it did not see a change since).
        let w = json!({
            "metadata": {"name": "pytorchjob-train", "ownerReferences": [
                {"uid": UID, "controller": true}]},
            "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "worker", "count": 4, "resourceUsage": {"cpu": "3"}}]},
                "conditions": [{"type": "Admitted", "status": "True"}]}});
        let admission = crate::kueue::read(&w);
        let mut j = job(4);
        j["metadata"]["labels"] = json!({crate::kueue::QUEUE_LABEL: "team"});
        j["spec"]["runPolicy"] = json!({"schedulingPolicy": {"scheduleTimeoutSeconds": 900}});
        let mut s = settings();
        s.kueue_pods_ready_timeout = Some(Duration::from_secs(600));
        let p = plan_kueue(&j, &admission, &s);
        let said = |r: Reason| {
            p.events
                .iter()
                .find(|(x, _)| *x == r)
                .map(|(_, m)| m.clone())
        };
        let differs = said(Reason::KueueQuotaDiffers).expect("KueueQuotaDiffers");
        assert!(
            differs.contains("cpu: the pods request 4, Kueue admitted 3 (1 more)"),
            "{differs}"
        );
        let timeout = said(Reason::GangTimeoutAboveKueue).expect("GangTimeoutAboveKueue");
        assert!(timeout.contains("scheduleTimeoutSeconds 900"), "{timeout}");
        // scheduler-plugins gets the pods' requests; Volcano is never asked for more than Kueue
        // admitted.
        let sp = p.write().unwrap();
        assert_eq!(sp.body["spec"]["minResources"]["cpu"], json!("4"));
        j["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "volcano"});
        let p = plan_kueue(&j, &admission, &s);
        let vc = p.write().unwrap();
        assert_eq!(vc.body["spec"]["minResources"]["cpu"], json!("3"));
        assert!(
            !p.events
                .iter()
                .any(|(r, _)| *r == Reason::GangTimeoutAboveKueue),
            "Volcano PodGroups have no scheduleTimeoutSeconds"
        );
        // Kueue admitting exactly what the pods request says nothing.
        let mut equal = w.clone();
        equal["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]["cpu"] = json!("4");
        j["spec"]["runPolicy"] = json!({});
        let p = plan_kueue(&j, &crate::kueue::read(&equal), &s);
        assert!(
            !p.events.iter().any(|(r, _)| matches!(
                r,
                Reason::KueueQuotaDiffers | Reason::GangTimeoutAboveKueue
            )),
            "{:?}",
            p.events
        );
    }

    /// Plans a managed `job` with gang-health inputs.
    fn plan_health(
        job: &Value,
        pgs: &Cached,
        health: Option<&JobHealth>,
        capacity: Option<&Capacity>,
        queues: Option<&BTreeMap<String, String>>,
    ) -> Plan {
        let obj: DynamicObject = serde_json::from_value(job.clone()).unwrap();
        let s = settings();
        let ns = annotations("true");
        // Remembered of the job's one PodGroup, named after the job.
        let health = health.map(|h| GangHealth::from([("train".to_string(), h.clone())]));
        plan(&Input {
            kind: crate::kinds::lookup("kubeflow.org/v1", "PyTorchJob").unwrap(),
            job: &obj,
            leading: true,
            namespace_annotations: Some(&ns),
            priorities: &Priorities::default(),
            defaults: &Ok(AdmissionDefaults::default()),
            pod_groups: pgs,
            refused: None,
            unlinked_pods: &[],
            settings: &s,
            now: "2026-12-01T00:10:00Z".parse().unwrap(),
            health: health.as_ref(),
            capacity,
            queues,
            kueue: None,
            dropped: &BTreeSet::new(),
            tiers: &Default::default(),
        })
    }

    fn cpu_node(cpu: &str) -> Capacity {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(
            json!({"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": cpu}}}),
        )
        .unwrap();
        Capacity::from_nodes([&node])
    }

    #[test]
    fn rule_10_an_infeasible_gang_is_reported_still_created_and_cleared_when_it_fits() {
        let p = plan_health(
            &job(3),
            &Cached::serving_both(),
            None,
            Some(&cpu_node("2")),
            None,
        );
        assert_eq!(reasons(&p), [Reason::GangInfeasible]);
        assert!(
            p.events[0]
                .1
                .contains("minResources cpu=3 exceeds the 2 allocatable"),
            "{:?}",
            p.events
        );
        assert_eq!(
            p.write().as_ref().map(|w| w.op),
            Some(Op::Create),
            "never blocks"
        );
        let remembered = p.job_health().cloned().unwrap();
        assert!(remembered.infeasible);
        let p = plan_health(
            &job(3),
            &Cached::serving_both(),
            Some(&remembered),
            Some(&cpu_node("4")),
            None,
        );
        assert_eq!(reasons(&p), [Reason::GangFeasible]);
        assert_eq!(p.forget, [Reason::GangInfeasible]);
        assert!(!p.job_health().cloned().unwrap().infeasible);
        // A running gang is not judged.
        let (_, running) = created(&job(3));
        let p = plan_health(&job(3), &running, None, Some(&cpu_node("1")), None);
        assert!(reasons(&p).is_empty(), "{:?}", p.events);
    }

    #[test]
    fn rule_10_a_volcano_queue_that_cannot_take_the_gang_is_reported() {
        let mut j = job(2);
        j["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "volcano", "scheduling.volcano.sh/queue-name": "team"});
        let closed: BTreeMap<String, String> = [("team".into(), "Closed".into())].into();
        let p = plan_health(&j, &Cached::serving_both(), None, None, Some(&closed));
        // The templates carry the coscheduling label, not Volcano's: MissingPodGroupLink too.
        assert_eq!(
            reasons(&p),
            [Reason::MissingPodGroupLink, Reason::QueueUnavailable]
        );
        assert!(
            p.events[1].1.contains("\"team\" is Closed"),
            "{:?}",
            p.events
        );
        let open: BTreeMap<String, String> = [("team".into(), "Open".into())].into();
        let p = plan_health(
            &j,
            &Cached::serving_both(),
            p.job_health(),
            None,
            Some(&open),
        );
        assert_eq!(
            reasons(&p),
            [Reason::MissingPodGroupLink, Reason::GangFeasible]
        );
    }

    #[test]
    fn rule_10_a_gang_that_ran_whole_and_runs_short_is_broken_after_the_threshold() {
        let j = job(3);
        let w = managed(&j, &Cached::serving_both())
            .write()
            .cloned()
            .unwrap();
        let with = |status: Value| Cached::serving_both().with(w.backend, stored(&w, status));
        let whole = plan_health(
            &j,
            &with(json!({"phase": "Running", "running": 3})),
            None,
            None,
            None,
        );
        let h = whole.job_health().cloned().unwrap();
        assert!(h.gang.ran && whole.events.is_empty());
        let short = with(json!({"phase": "Running", "running": 2}));
        let p = plan_health(&j, &short, Some(&h), None, None);
        assert!(reasons(&p).is_empty());
        assert_eq!(p.outcome, Outcome::RequeueAfter(Duration::from_secs(61)));
        let mut h = p.job_health().cloned().unwrap();
        h.gang.short_since = Some("2026-12-01T00:08:00Z".parse().unwrap());
        let p = plan_health(&j, &short, Some(&h), None, None);
        assert_eq!(reasons(&p), [Reason::GangBroken]);
        assert!(
            p.events[0].1.contains("only 2 of minMember 3 pods"),
            "{:?}",
            p.events
        );
        let p = plan_health(
            &j,
            &with(json!({"phase": "Running", "running": 3})),
            p.job_health(),
            None,
            None,
        );
        assert_eq!(reasons(&p), [Reason::GangRecovered]);
        assert_eq!(p.forget, [Reason::GangBroken]);
    }
}
