//! Whether an active job gets a PodGroup, and which (SPEC §2–§3): the one decision the planner
//! and the pod-link webhook share, so that a pod is linked only to a PodGroup the planner
//! writes, under exactly the name it writes. Pure; the namespace's mode and the job's
//! normalisation are the callers' (each reports them its own way).

use std::collections::BTreeMap;

use std::sync::Arc;

use kube::api::DynamicObject;

use crate::backend::{self, BackendKind, BackendOptions};
use crate::enablement::{Enablement, UnknownBackend};
use crate::gang::{self, Gang, Priorities};
use crate::job::{InvalidJob, Job};
use crate::resources::AdmissionDefaults;

/// The PodGroup caches, as the planner and the webhook see them.
pub trait PodGroups {
    /// Whether the backend's CRD is served and its PodGroups are cached.
    fn served(&self, backend: BackendKind) -> bool;
    /// The cached PodGroup of that backend, namespace and name.
    fn get(&self, backend: BackendKind, namespace: &str, name: &str) -> Option<Arc<DynamicObject>>;
    /// The cached PodGroups whose controller is the job with this UID.
    fn controlled_by(&self, uid: &str) -> Vec<(BackendKind, Arc<DynamicObject>)>;
}

/// Whether this installation of podgroup-sync (`instance`) owns `pg` for the job with this UID:
/// the job is its controller and its labels say this installation made it
/// ([`backend::made_by`]). A PodGroup the job controls without them was made by someone else —
/// an operator whose gang mode is still on, Volcano's own `podgroup-<uid>` for pods without a
/// group annotation, or another installation of podgroup-sync — and is never touched.
pub fn ours(pg: &DynamicObject, uid: &str, instance: &str) -> bool {
    let controlled = pg.metadata.owner_references.as_ref().is_some_and(|refs| {
        refs.iter()
            .any(|r| r.controller == Some(true) && r.uid == uid)
    });
    controlled && backend::made_by(pg, instance)
}

/// What the decision reads besides the job.
pub struct Around<'a> {
    /// The annotations of the job's Namespace.
    pub namespace_annotations: Option<&'a BTreeMap<String, String>>,
    pub priorities: &'a Priorities,
    pub defaults: &'a Result<AdmissionDefaults, InvalidJob>,
    pub pod_groups: &'a dyn PodGroups,
    pub enablement: &'a Enablement,
    pub backend_options: &'a BackendOptions,
    /// `--keep-finished`: a finished job keeps its PodGroup.
    pub keep_finished: bool,
}

/// The PodGroup an active job gets (the PodGroups, one per group, of a job of several gangs).
#[derive(Debug)]
pub struct Target {
    pub backend: BackendKind,
    /// The PodGroup's name; of a job of several gangs, the base of its groups' names.
    pub name: String,
    /// Every PodGroup the job gets: `name` alone, or `<name>-<i>` for each group `i`.
    pub names: Vec<String>,
    /// The gang, the same for every group.
    pub gang: Gang,
    /// What is doubtful about the name or the backend's fields (not about the gang).
    pub warnings: Vec<String>,
    /// The job is several gangs, one per group.
    pub grouped: bool,
}

impl Target {
    /// The PodGroup a pod of group `group` joins: the job's one PodGroup, or its group's. A
    /// pod's group may be ahead of the job's status (a surge group's leader created before the
    /// status counts it): it is linked all the same, and the PodGroup follows once the status
    /// does. A pod of a job of groups whose group is unknown joins none.
    pub fn name_for(&self, group: Option<u32>) -> Option<String> {
        if !self.grouped {
            return Some(self.name.clone());
        }
        let name = backend::group_name(&self.name, group?);
        (name.len() <= self.backend.backend().max_name_len()).then_some(name)
    }
}

/// Why a job gets no PodGroup.
#[derive(Debug)]
pub enum NoPodGroup {
    /// The job's enablement annotation is "false".
    OptedOut,
    /// Another controller manages the job (`runPolicy.managedBy`).
    ManagedElsewhere,
    /// Succeeded or Failed (without `--keep-finished`).
    Finished,
    Suspended,
    /// No gang or no valid PodGroup can be made from the spec.
    Invalid(InvalidJob),
    UnknownBackend(UnknownBackend),
    /// The backend's PodGroup CRD is not served.
    NotServed(BackendKind),
}

/// The PodGroup `job` gets, or why it gets none; checked in the order the planner reports them.
pub fn target(job: &Job, around: &Around) -> Result<Target, NoPodGroup> {
    if !job.shape.gang_requested || around.enablement.job_opted_out(job) {
        return Err(NoPodGroup::OptedOut);
    }
    if job.managed_elsewhere() {
        return Err(NoPodGroup::ManagedElsewhere);
    }
    if job.finished && !around.keep_finished {
        return Err(NoPodGroup::Finished);
    }
    if job.suspended() {
        return Err(NoPodGroup::Suspended);
    }
    let gang = around
        .defaults
        .clone()
        .and_then(|defaults| gang::compute(job, around.priorities, &defaults))
        .map_err(NoPodGroup::Invalid)?;
    let (backend_kind, _) = around
        .enablement
        .backend(job, around.namespace_annotations, around.backend_options)
        .map_err(NoPodGroup::UnknownBackend)?;
    if !around.pod_groups.served(backend_kind) {
        return Err(NoPodGroup::NotServed(backend_kind));
    }
    let class_exists = |c: &str| around.priorities.contains(c);
    let (name, warnings) = backend::name_and_checks(backend_kind.backend(), job, &class_exists)
        .map_err(NoPodGroup::Invalid)?;
    let names = match job.groups {
        None => vec![name.clone()],
        Some(n) => (0..n).map(|i| backend::group_name(&name, i)).collect(),
    };
    Ok(Target {
        backend: backend_kind,
        name,
        names,
        gang,
        warnings,
        grouped: job.groups.is_some(),
    })
}
