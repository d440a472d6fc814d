//! The pod-link decision of the admission webhook (SPEC §8), pure: a pod being created, its job
//! as the caches hold it and the settings → the link and schedulerName to add, or why nothing is
//! added. The PodGroup name and backend are those the controller uses ([`backend::pod_group_name`],
//! [`Enablement::backend`](crate::enablement::Enablement::backend)), so a linked pod always
//! names the PodGroup the controller writes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use serde_json::{Value, json};

use super::placement;
use crate::backend::{self, BackendKind, BackendOptions, LinkKey, PodGroupBackend};
use crate::enablement::{Enablement, Mode};
use crate::gang::Priorities;
use crate::job::{self, InvalidJob, JobKind};
use crate::kinds::jobset::{JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL};
use crate::kinds::lws::{self, LWS_NAME_LABEL};
use crate::kinds::ray::RAY_GROUP_LABEL;
use crate::kinds::{JOBSET, LEADERWORKERSET, MPIJOB_V2BETA1, RAYCLUSTER};
use crate::resources::AdmissionDefaults;
use crate::settings::Settings;
use crate::target::{Around, NoPodGroup, target};
use crate::target::{PodGroups, ours};

/// Labels the Kubeflow operators put on every pod they create (training-operator and
/// mpi-operator alike); the webhook's objectSelector requires the job-name one.
pub use crate::job::JOB_NAME_LABEL;
pub const OPERATOR_NAME_LABEL: &str = "training.kubeflow.org/operator-name";
pub const JOB_ROLE_LABEL: &str = "training.kubeflow.org/job-role";
pub use crate::kinds::kubeflow::REPLICA_TYPE_LABEL;
/// mpi-operator's `operator-name` label value and the suffix of its launcher's batch/v1 Job.
const MPI_OPERATOR: &str = "mpi-operator";
const LAUNCHER_JOB_SUFFIX: &str = "-launcher";

/// The pod fields the decision reads.
#[derive(Debug, Clone, Copy)]
pub struct PodView<'a> {
    /// The pod's name, when set at creation (a StatefulSet's pods).
    pub name: Option<&'a str>,
    pub labels: Option<&'a BTreeMap<String, String>>,
    pub annotations: Option<&'a BTreeMap<String, String>>,
    pub owner_references: &'a [OwnerReference],
    pub scheduler_name: Option<&'a str>,
    /// Whether the pod spec names a scheduling group (the native backend's link).
    pub scheduling_group: bool,
}

impl PodView<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels?.get(key).map(String::as_str)
    }

    /// Whether the pod carries a link at `key`, whatever its value. For the native backend only
    /// the spec field is a link: the marker annotation the webhook writes beside it could come
    /// from a template, which would claim a link the pod does not have.
    pub fn has_link(&self, key: LinkKey) -> bool {
        match key {
            LinkKey::Label(k) => self.labels.is_some_and(|l| l.contains_key(k)),
            LinkKey::Annotation(k) => self.annotations.is_some_and(|a| a.contains_key(k)),
            LinkKey::SchedulingGroup => self.scheduling_group,
        }
    }

    /// [`has_link`](Self::has_link) as a metadata-only watch sees it: the native link through the
    /// webhook's marker annotation (a template that carries the marker is reported on its job by
    /// [`backend::missing_links`]).
    pub fn has_link_in_metadata(&self, key: LinkKey) -> bool {
        match key {
            LinkKey::SchedulingGroup => self
                .annotations
                .is_some_and(|a| a.contains_key(backend::LINKED_ANNOTATION)),
            key => self.has_link(key),
        }
    }

    /// Whether the pod asks for the default scheduler (no name, empty, or its name).
    fn default_scheduler(&self) -> bool {
        matches!(
            self.scheduler_name,
            None | Some("") | Some("default-scheduler")
        )
    }
}

/// The job a pod belongs to, found from its controller reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub kind: &'static JobKind,
    pub name: String,
    /// The job's UID when the pod names the job itself (not when an operator creates the pod
    /// through a batch/v1 Job: the MPIJob launcher, a JobSet's pods).
    pub uid: Option<String>,
    /// The pod set the pod belongs to, where it matters: the MPIJob v2beta1 launcher
    /// (`Launcher`), a JobSet's replicated job, a RayCluster's group; `None` for the Kubeflow
    /// operators' other pods, whose replica types all belong to the gang.
    pub pod_set: Option<String>,
    /// The pod's group, for a kind whose object is one gang per group (a LeaderWorkerSet).
    pub group: Option<u32>,
}

impl Owner {
    /// The MPIJob v2beta1 launcher, created through mpi-operator's batch/v1 Job.
    pub fn launcher(&self) -> bool {
        self.kind == &MPIJOB_V2BETA1 && self.pod_set.as_deref() == Some("Launcher")
    }
}

/// Why a pod is admitted without a link (the `reason` label of the admission metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Not a Pod CREATE (the configuration sends none; answered all the same).
    NotPodCreate,
    /// No controller reference.
    NoOwner,
    /// Controlled by something other than a job kind podgroup-sync knows.
    ForeignOwner,
    NamespaceOff,
    NamespaceDryRun,
    /// The job's kind is not served or not watched (its CRD is absent).
    KindNotWatched,
    OptedOut,
    ManagedElsewhere,
    Finished,
    Suspended,
    /// The job gets no PodGroup (`InvalidSpec`): a linked pod would wait for nothing.
    InvalidJob,
    UnknownBackend,
    BackendNotServed,
    /// The MPIJob launcher under `launcherCreationPolicy: WaitForWorkersReady` (SPEC §3.1.4).
    LauncherOutsideGang,
    /// A pod of a pod set that is not part of the gang (a JobSet's replicated job created only
    /// after earlier ones are ready, a suspended Ray worker group; SPEC §11).
    OutsideGang,
    /// A PodGroup of that name belongs to someone else (`PodGroupConflict` on the job).
    Conflict,
    /// A pod of a job of one gang per group whose group could not be told (no group-index
    /// label, and a name that does not end in one).
    UnknownGroup,
    /// The controller reference names a job of that name cached with another UID (a stale or
    /// forged reference).
    OwnerUidMismatch,
}

impl Skip {
    pub fn as_str(&self) -> &'static str {
        match self {
            Skip::NotPodCreate => "not_pod_create",
            Skip::NoOwner => "no_owner",
            Skip::ForeignOwner => "foreign_owner",
            Skip::NamespaceOff => "namespace_off",
            Skip::NamespaceDryRun => "namespace_dry_run",
            Skip::KindNotWatched => "kind_not_watched",
            Skip::OptedOut => "opted_out",
            Skip::ManagedElsewhere => "managed_elsewhere",
            Skip::Finished => "finished",
            Skip::Suspended => "suspended",
            Skip::InvalidJob => "invalid_job",
            Skip::UnknownBackend => "unknown_backend",
            Skip::BackendNotServed => "backend_not_served",
            Skip::LauncherOutsideGang => "launcher_outside_gang",
            Skip::OutsideGang => "outside_gang",
            Skip::Conflict => "conflict",
            Skip::UnknownGroup => "unknown_group",
            Skip::OwnerUidMismatch => "owner_uid_mismatch",
        }
    }

    pub const ALL: [Skip; 18] = [
        Skip::NotPodCreate,
        Skip::NoOwner,
        Skip::ForeignOwner,
        Skip::NamespaceOff,
        Skip::NamespaceDryRun,
        Skip::KindNotWatched,
        Skip::OptedOut,
        Skip::ManagedElsewhere,
        Skip::Finished,
        Skip::Suspended,
        Skip::InvalidJob,
        Skip::UnknownBackend,
        Skip::BackendNotServed,
        Skip::LauncherOutsideGang,
        Skip::OutsideGang,
        Skip::Conflict,
        Skip::UnknownGroup,
        Skip::OwnerUidMismatch,
    ];
}

/// One thing the webhook adds to a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addition {
    Label(&'static str, String),
    Annotation(&'static str, String),
    SchedulerName(String),
    /// `spec.schedulingGroup.podGroupName` (with [`backend::LINKED_ANNOTATION`] of the same
    /// value, so that metadata-only watches see the link).
    SchedulingGroup(String),
}

impl std::fmt::Display for Addition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addition::Label(k, v) => write!(f, "label {k}: {v}"),
            Addition::Annotation(k, v) => write!(f, "annotation {k}: {v}"),
            Addition::SchedulerName(s) => write!(f, "schedulerName: {s}"),
            Addition::SchedulingGroup(n) => write!(f, "spec.schedulingGroup.podGroupName: {n}"),
        }
    }
}

/// What the webhook does with a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Add these to the pod so it joins PodGroup `name` of `backend`.
    Link {
        backend: BackendKind,
        name: String,
        additions: Vec<Addition>,
    },
    /// A pod of a managed job that already carries its link and scheduler.
    Unchanged {
        backend: BackendKind,
        name: String,
    },
    Skipped(Skip),
}

/// The object a pod's controller reference leads to. Directly a kind podgroup-sync knows (a
/// Kubeflow job, a RayCluster, an opted-in batch/v1 Job), or through the batch/v1 Job an operator
/// made for it, recognised by the labels the operator gives the pod — the JobSet's name label, or
/// mpi-operator's launcher labels and the name it gives the launcher's Job
/// (`<mpijob>-launcher`) — so no batch/v1 Job cache or API call is needed.
pub fn owner_of(pod: &PodView) -> Result<Owner, Skip> {
    let controller = pod
        .owner_references
        .iter()
        .find(|r| r.controller == Some(true))
        .ok_or(Skip::NoOwner)?;
    let through_job = controller.api_version == "batch/v1" && controller.kind == "Job";
    if through_job && let Some(jobset) = pod.label(JOBSET_NAME_LABEL) {
        return Ok(Owner {
            kind: &JOBSET,
            name: jobset.to_string(),
            uid: None,
            pod_set: pod.label(REPLICATED_JOB_LABEL).map(str::to_string),
            group: None,
        });
    }
    // A LeaderWorkerSet's leaders belong to its leader StatefulSet, each group's workers to a
    // StatefulSet of that group (controlled by the leader pod).
    let through_sts = controller.api_version == "apps/v1" && controller.kind == "StatefulSet";
    if through_sts && let Some(lws) = pod.label(LWS_NAME_LABEL) {
        return Ok(Owner {
            kind: &LEADERWORKERSET,
            name: lws.to_string(),
            uid: None,
            pod_set: Some(lws::pod_set_of(pod.labels).to_string()),
            group: lws::group_of(pod.labels, pod.name),
        });
    }
    let launcher_job = through_job
        && pod.label(OPERATOR_NAME_LABEL) == Some(MPI_OPERATOR)
        && pod.label(JOB_ROLE_LABEL) == Some("launcher");
    if launcher_job
        && let Some(job) = pod.label(JOB_NAME_LABEL)
        && controller.name.strip_suffix(LAUNCHER_JOB_SUFFIX) == Some(job)
    {
        return Ok(Owner {
            kind: &MPIJOB_V2BETA1,
            name: job.to_string(),
            uid: None,
            pod_set: Some("Launcher".into()),
            group: None,
        });
    }
    let kind = crate::kinds::lookup(&controller.api_version, &controller.kind)
        .ok_or(Skip::ForeignOwner)?;
    let pod_set = if kind == &RAYCLUSTER {
        pod.label(RAY_GROUP_LABEL).map(str::to_string)
    } else {
        None
    };
    Ok(Owner {
        kind,
        name: controller.name.clone(),
        uid: Some(controller.uid.clone()),
        pod_set,
        group: None,
    })
}

/// The namespace's mode as a reason to skip (only `true` namespaces get links).
pub fn namespace_gate(
    enablement: &Enablement,
    annotations: Option<&BTreeMap<String, String>>,
) -> Option<Skip> {
    match enablement.namespace_mode(annotations) {
        Mode::Manage => None,
        Mode::DryRun => Some(Skip::NamespaceDryRun),
        Mode::Off => Some(Skip::NamespaceOff),
    }
}

/// What the caches say around a job, read by the caller (as for the planner's `Input`).
pub struct Context<'a> {
    /// The annotations of the pod's Namespace.
    pub namespace_annotations: Option<&'a BTreeMap<String, String>>,
    pub pod_groups: &'a dyn PodGroups,
    pub priorities: &'a Priorities,
    pub defaults: &'a Result<AdmissionDefaults, InvalidJob>,
    pub settings: &'a Settings,
}

/// What a pod's decision needs from its job, worked out once per version of the job and of its
/// surroundings (the webhook remembers it: [`super::memo`]): the job normalised and the PodGroup
/// the planner would keep for it, or why none.
#[derive(Debug)]
pub struct Prepared {
    job: job::Job,
    target: Result<crate::target::Target, NoPodGroup>,
}

/// The job's part of the decision; `Err` when the job cannot be read as its kind.
pub fn prepare(
    kind: &'static JobKind,
    job: &DynamicObject,
    ctx: &Context,
) -> Result<Prepared, Skip> {
    let job = job::normalize_object(kind, job).map_err(|_| Skip::InvalidJob)?;
    let settings = ctx.settings;
    let around = Around {
        namespace_annotations: ctx.namespace_annotations,
        priorities: ctx.priorities,
        defaults: ctx.defaults,
        pod_groups: ctx.pod_groups,
        enablement: &settings.enablement,
        backend_options: &settings.backend_options,
        keep_finished: settings.keep_finished,
    };
    let target = target(&job, &around);
    Ok(Prepared { job, target })
}

/// Decides what the webhook adds to a pod of `owner`, whose job the cache holds as `job`. A pod
/// is linked only when its job gets a PodGroup (the checks the planner makes before it writes
/// one): a pod linked to a PodGroup that never comes would wait for ever.
pub fn decide(pod: &PodView, owner: &Owner, job: &DynamicObject, ctx: &Context) -> Decision {
    if let Some(skip) = namespace_gate(&ctx.settings.enablement, ctx.namespace_annotations) {
        return Decision::Skipped(skip);
    }
    decide_prepared(
        pod,
        owner,
        &prepare(owner.kind, job, ctx),
        ctx.pod_groups,
        ctx.settings,
    )
}

/// [`decide`] from the job's [`Prepared`] part (the namespace's gate already passed): what is
/// left depends on the pod and on the PodGroups cached now.
pub fn decide_prepared(
    pod: &PodView,
    owner: &Owner,
    prepared: &Result<Prepared, Skip>,
    pod_groups: &dyn PodGroups,
    settings: &Settings,
) -> Decision {
    let Prepared { job, target } = match prepared {
        Ok(p) => p,
        Err(skip) => return Decision::Skipped(*skip),
    };
    // The planner's own decision: the pod is linked only to the PodGroup the planner writes.
    let (backend_kind, name, gang) = match target {
        Ok(t) => match t.name_for(owner.group) {
            Some(name) => (t.backend, name, &t.gang),
            None => return Decision::Skipped(Skip::UnknownGroup),
        },
        Err(why) => {
            return Decision::Skipped(match why {
                NoPodGroup::OptedOut => Skip::OptedOut,
                NoPodGroup::ManagedElsewhere => Skip::ManagedElsewhere,
                NoPodGroup::Finished => Skip::Finished,
                NoPodGroup::Suspended => Skip::Suspended,
                NoPodGroup::Invalid(_) => Skip::InvalidJob,
                NoPodGroup::UnknownBackend(_) => Skip::UnknownBackend,
                NoPodGroup::NotServed(_) => Skip::BackendNotServed,
            });
        }
    };
    if owner.pod_set.as_deref().is_some_and(|s| !job.in_gang(s)) {
        return Decision::Skipped(if owner.launcher() {
            Skip::LauncherOutsideGang
        } else {
            Skip::OutsideGang
        });
    }
    let opts = &settings.backend_options;
    let backend = backend_kind.backend();
    if let Some(pg) = pod_groups.get(backend_kind, &job.namespace, &name)
        && !ours(&pg, &job.uid, &opts.instance)
    {
        return Decision::Skipped(Skip::Conflict);
    }
    let mut additions = additions(backend, pod, &name, opts);
    // SPEC §13: the pod's set and slice, for a Volcano subGroupPolicy.
    let placement = placement::labels(
        backend_kind,
        job,
        gang,
        owner.pod_set.as_deref(),
        pod.labels,
    );
    additions.extend(placement.into_iter().map(|(k, v)| Addition::Label(k, v)));
    // A pod patched anyway gets the marker that keeps it out of the unlinked pods' watch.
    let marker = backend_kind.as_str();
    if !additions.is_empty() && pod.label(backend::LINKED_LABEL) != Some(marker) {
        additions.push(Addition::Label(backend::LINKED_LABEL, marker.to_string()));
    }
    if additions.is_empty() {
        Decision::Unchanged {
            backend: backend_kind,
            name,
        }
    } else {
        Decision::Link {
            backend: backend_kind,
            name,
            additions,
        }
    }
}

/// What joins a pod to PodGroup `name`: the backend's link unless the pod has one (whatever its
/// value), and the backend's schedulerName when the pod asks for the default scheduler.
pub fn additions(
    backend: &dyn PodGroupBackend,
    pod: &PodView,
    name: &str,
    opts: &BackendOptions,
) -> Vec<Addition> {
    let mut out = Vec::new();
    let key = backend.link_key();
    if !pod.has_link(key) {
        out.push(match key {
            LinkKey::Label(k) => Addition::Label(k, name.to_string()),
            LinkKey::Annotation(k) => Addition::Annotation(k, name.to_string()),
            LinkKey::SchedulingGroup => Addition::SchedulingGroup(name.to_string()),
        });
    }
    if let Some(scheduler) = backend.link_scheduler_name(opts)
        && pod.default_scheduler()
        && pod.scheduler_name != Some(scheduler)
    {
        out.push(Addition::SchedulerName(scheduler.to_string()));
    }
    out
}

/// The RFC 6902 JSON Patch that makes the additions to the pod.
pub fn json_patch(pod: &PodView, additions: &[Addition]) -> Value {
    let mut ops = Vec::new();
    let (mut labels, mut annotations) = (pod.labels.is_some(), pod.annotations.is_some());
    for a in additions {
        match a {
            Addition::Label(k, v) => add_entry(&mut ops, &mut labels, "labels", k, v),
            Addition::Annotation(k, v) => {
                add_entry(&mut ops, &mut annotations, "annotations", k, v)
            }
            Addition::SchedulerName(s) => {
                ops.push(json!({"op": "add", "path": "/spec/schedulerName", "value": s}));
            }
            Addition::SchedulingGroup(n) => {
                ops.push(json!({"op": "add", "path": "/spec/schedulingGroup", "value": {"podGroupName": n}}));
                let key = backend::LINKED_ANNOTATION;
                add_entry(&mut ops, &mut annotations, "annotations", key, n);
            }
        }
    }
    Value::Array(ops)
}

/// The ops that set `metadata.<map>[key] = value`, creating the map first unless `present`.
fn add_entry(ops: &mut Vec<Value>, present: &mut bool, map: &str, key: &str, value: &str) {
    if !std::mem::replace(present, true) {
        ops.push(json!({"op": "add", "path": format!("/metadata/{map}"), "value": {}}));
    }
    let path = format!("/metadata/{map}/{}", escape(key));
    ops.push(json!({"op": "add", "path": path, "value": value}));
}

/// A JSON Pointer reference token (RFC 6901): `~` → `~0`, `/` → `~1`.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::BACKENDS;
    use crate::enablement::Enablement;
    use crate::kinds::BATCH_JOB;
    use crate::reconcile::ResizePolicy;
    use std::time::Duration;

    struct Served(Vec<BackendKind>, Option<DynamicObject>);

    impl PodGroups for Served {
        fn served(&self, b: BackendKind) -> bool {
            self.0.contains(&b)
        }
        fn get(&self, _: BackendKind, _: &str, _: &str) -> Option<Arc<DynamicObject>> {
            self.1.clone().map(Arc::new)
        }
        fn controlled_by(&self, _: &str) -> Vec<(BackendKind, Arc<DynamicObject>)> {
            Vec::new()
        }
    }

    fn all_served() -> Served {
        Served(BACKENDS.to_vec(), None)
    }

    fn settings(default_backend: BackendKind) -> Settings {
        Settings {
            enablement: Enablement {
                annotation_key: "podgroup-sync.io/enabled".into(),
                default_mode: Mode::Off,
                default_backend,
            },
            backend_options: BackendOptions::default(),
            resize: ResizePolicy::Always,
            keep_finished: false,
            batch_jobs: false,
            gang_wait_warning: Duration::from_secs(120),
            gang_broken_after: Duration::from_secs(60),
            feasibility: false,
            audit_interval: Duration::ZERO,
            kueue_pods_ready_timeout: None,
            webhook: true,
        }
    }

    fn managed() -> BTreeMap<String, String> {
        BTreeMap::from([("podgroup-sync.io/enabled".into(), "true".into())])
    }

    fn pytorch(annotations: Value, template_meta: Value) -> DynamicObject {
        let t = json!({"metadata": template_meta, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "ns", "uid": "job-uid", "annotations": annotations},
            "spec": {"pytorchReplicaSpecs": {"Master": {"template": t}, "Worker": {"replicas": 2, "template": t}}}
        }))
        .unwrap()
    }

    fn mpijob(launcher_policy: &str) -> DynamicObject {
        let t = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
        serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "metadata": {"name": "mpi", "namespace": "ns", "uid": "mpi-uid"},
            "spec": {"launcherCreationPolicy": launcher_policy,
                "mpiReplicaSpecs": {"Launcher": {"template": t}, "Worker": {"replicas": 2, "template": t}}}
        }))
        .unwrap()
    }

    fn owner_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    struct Pod {
        name: Option<String>,
        labels: Option<BTreeMap<String, String>>,
        annotations: Option<BTreeMap<String, String>>,
        owners: Vec<OwnerReference>,
        scheduler: Option<String>,
        scheduling_group: bool,
    }

    impl Pod {
        fn of(owner: OwnerReference) -> Pod {
            Pod {
                name: None,
                labels: Some(BTreeMap::from([(
                    JOB_NAME_LABEL.into(),
                    owner.name.clone(),
                )])),
                annotations: None,
                owners: vec![owner],
                scheduler: None,
                scheduling_group: false,
            }
        }
        fn view(&self) -> PodView<'_> {
            PodView {
                name: self.name.as_deref(),
                labels: self.labels.as_ref(),
                annotations: self.annotations.as_ref(),
                owner_references: &self.owners,
                scheduler_name: self.scheduler.as_deref(),
                scheduling_group: self.scheduling_group,
            }
        }
    }

    fn pytorch_pod() -> Pod {
        Pod::of(owner_ref(
            "kubeflow.org/v1",
            "PyTorchJob",
            "train",
            "job-uid",
        ))
    }

    fn decide_with(
        pod: &Pod,
        job: &DynamicObject,
        ns: Option<&BTreeMap<String, String>>,
        pod_groups: &dyn PodGroups,
        s: &Settings,
    ) -> Decision {
        let owner = owner_of(&pod.view()).expect("owner");
        let ctx = Context {
            namespace_annotations: ns,
            pod_groups,
            priorities: &Priorities::default(),
            defaults: &Ok(AdmissionDefaults::default()),
            settings: s,
        };
        decide(&pod.view(), &owner, job, &ctx)
    }

    fn decide_for(
        pod: &Pod,
        job: &DynamicObject,
        ns: Option<&BTreeMap<String, String>>,
        s: &Settings,
    ) -> Decision {
        decide_with(pod, job, ns, &all_served(), s)
    }

    #[test]
    fn rule_8_pod_of_a_managed_job_gets_the_link_and_the_backends_scheduler() {
        let cases = [
            (
                BackendKind::SchedulerPlugins,
                Addition::Label("scheduling.x-k8s.io/pod-group", "train".into()),
                "scheduler-plugins-scheduler",
            ),
            (
                BackendKind::Volcano,
                Addition::Annotation("scheduling.k8s.io/group-name", "train".into()),
                "volcano",
            ),
        ];
        for (backend, link, scheduler) in cases {
            let d = decide_for(
                &pytorch_pod(),
                &pytorch(json!({}), json!({})),
                Some(&managed()),
                &settings(backend),
            );
            let additions = vec![
                link,
                Addition::SchedulerName(scheduler.into()),
                marker(backend),
            ];
            let name = "train".into();
            assert_eq!(
                d,
                Decision::Link {
                    backend,
                    name,
                    additions
                }
            );
        }
    }

    /// The label the webhook adds beside every link it makes.
    fn marker(backend: BackendKind) -> Addition {
        Addition::Label(backend::LINKED_LABEL, backend.as_str().into())
    }

    #[test]
    fn rule_9_native_pods_get_the_scheduling_group_and_keep_the_default_scheduler() {
        let s = settings(BackendKind::Kubernetes);
        let job = pytorch(json!({}), json!({}));
        let d = decide_for(&pytorch_pod(), &job, Some(&managed()), &s);
        let Decision::Link { additions, .. } = &d else {
            panic!("{d:?}")
        };
        assert_eq!(
            additions,
            &vec![
                Addition::SchedulingGroup("train".into()),
                marker(BackendKind::Kubernetes)
            ]
        );
        let pod = pytorch_pod();
        assert_eq!(
            json_patch(&pod.view(), additions),
            json!([
                {"op": "add", "path": "/spec/schedulingGroup", "value": {"podGroupName": "train"}},
                {"op": "add", "path": "/metadata/annotations", "value": {}},
                {"op": "add", "path": "/metadata/annotations/podgroup-sync.io~1pod-group", "value": "train"},
                {"op": "add", "path": "/metadata/labels/podgroup-sync.io~1linked", "value": "kubernetes"},
            ])
        );
        // A pod that already names a scheduling group is never changed.
        let mut linked = pytorch_pod();
        linked.scheduling_group = true;
        assert!(matches!(
            decide_for(&linked, &job, Some(&managed()), &s),
            Decision::Unchanged { .. }
        ));
        // The metadata-only pod watch sees the link through the annotation.
        let mut marked = pytorch_pod();
        marked.annotations = Some(BTreeMap::from([(
            backend::LINKED_ANNOTATION.into(),
            "train".into(),
        )]));
        assert!(marked.view().has_link_in_metadata(LinkKey::SchedulingGroup));
        assert!(
            !pytorch_pod()
                .view()
                .has_link_in_metadata(LinkKey::SchedulingGroup)
        );
        // The marker alone (from a template) is no link: the webhook adds the spec field, and
        // its patch replaces the marker's value with the PodGroup's name.
        assert!(!marked.view().has_link(LinkKey::SchedulingGroup));
        marked.annotations = Some(BTreeMap::from([(
            backend::LINKED_ANNOTATION.into(),
            "forged".into(),
        )]));
        let d = decide_for(&marked, &job, Some(&managed()), &s);
        let Decision::Link { additions, .. } = &d else {
            panic!("a pod with only the marker is linked: {d:?}")
        };
        assert_eq!(
            json_patch(&marked.view(), additions),
            json!([
                {"op": "add", "path": "/spec/schedulingGroup", "value": {"podGroupName": "train"}},
                {"op": "add", "path": "/metadata/annotations/podgroup-sync.io~1pod-group", "value": "train"},
                {"op": "add", "path": "/metadata/labels/podgroup-sync.io~1linked", "value": "kubernetes"},
            ])
        );
        // A template that carries the marker is reported on its job.
        let forged = pytorch(
            json!({}),
            json!({"annotations": {backend::LINKED_ANNOTATION: "train"}}),
        );
        let j = job::normalize(&job::PYTORCHJOB, &serde_json::to_value(&forged).unwrap()).unwrap();
        let missing = backend::missing_links(
            BackendKind::Kubernetes.backend(),
            &j,
            "train",
            &s.backend_options,
            true,
        );
        assert!(
            missing
                .iter()
                .any(|m| m.contains("only the pod-link webhook sets")),
            "{missing:?}"
        );
        // So is one that carries the label that keeps pods out of the unlinked pods' watch,
        // whatever the backend.
        let hidden = pytorch(
            json!({}),
            json!({"labels": {backend::LINKED_LABEL: "volcano"}}),
        );
        let j = job::normalize(&job::PYTORCHJOB, &serde_json::to_value(&hidden).unwrap()).unwrap();
        for b in crate::backend::BACKENDS {
            let missing =
                backend::missing_links(b.backend(), &j, "train", &s.backend_options, true);
            assert!(
                missing
                    .iter()
                    .any(|m| m.contains("hidden from PodsNotLinked")),
                "{b:?}: {missing:?}"
            );
        }
    }

    #[test]
    fn rule_8_no_scheduler_name_when_coscheduling_runs_in_the_default_scheduler() {
        let mut s = settings(BackendKind::SchedulerPlugins);
        s.backend_options.link_coscheduling_scheduler_name = None;
        let d = decide_for(
            &pytorch_pod(),
            &pytorch(json!({}), json!({})),
            Some(&managed()),
            &s,
        );
        let Decision::Link { additions, .. } = d else {
            panic!("{d:?}")
        };
        assert_eq!(
            additions,
            vec![
                Addition::Label("scheduling.x-k8s.io/pod-group", "train".into()),
                marker(BackendKind::SchedulerPlugins)
            ]
        );
    }

    #[test]
    fn rule_8_a_link_or_scheduler_name_already_present_is_never_changed() {
        let s = settings(BackendKind::Volcano);
        let job = pytorch(json!({}), json!({}));
        let mut pod = pytorch_pod();
        pod.annotations = Some(BTreeMap::from([(
            "scheduling.k8s.io/group-name".into(),
            "other".into(),
        )]));
        pod.scheduler = Some("my-scheduler".into());
        assert_eq!(
            decide_for(&pod, &job, Some(&managed()), &s),
            Decision::Unchanged {
                backend: BackendKind::Volcano,
                name: "train".into()
            }
        );
        // A link but the default scheduler: only the scheduler is added.
        pod.scheduler = Some("default-scheduler".into());
        let Decision::Link { additions, .. } = decide_for(&pod, &job, Some(&managed()), &s) else {
            panic!()
        };
        assert_eq!(
            additions,
            vec![
                Addition::SchedulerName("volcano".into()),
                marker(BackendKind::Volcano)
            ]
        );
        // The marker is not added again (and alone it is no reason to patch).
        pod.labels
            .get_or_insert_default()
            .insert(backend::LINKED_LABEL.into(), "volcano".into());
        let Decision::Link { additions, .. } = decide_for(&pod, &job, Some(&managed()), &s) else {
            panic!()
        };
        assert_eq!(additions, vec![Addition::SchedulerName("volcano".into())]);
    }

    #[test]
    fn rule_8_the_name_is_the_one_the_controller_uses() {
        // A template linked by hand names the PodGroup; the unlinked ones' pods get that name.
        let s = settings(BackendKind::SchedulerPlugins);
        let job = pytorch(
            json!({}),
            json!({"labels": {"scheduling.x-k8s.io/pod-group": "gang-a"}}),
        );
        let Decision::Link { name, .. } = decide_for(&pytorch_pod(), &job, Some(&managed()), &s)
        else {
            panic!()
        };
        assert_eq!(name, "gang-a");
        // The backend follows the job annotation, then the namespace annotation.
        let job = pytorch(json!({"podgroup-sync.io/backend": "volcano"}), json!({}));
        let Decision::Link { backend, .. } = decide_for(&pytorch_pod(), &job, Some(&managed()), &s)
        else {
            panic!()
        };
        assert_eq!(backend, BackendKind::Volcano);
        let mut ns = managed();
        ns.insert("podgroup-sync.io/backend".into(), "volcano".into());
        let Decision::Link { backend, .. } = decide_for(
            &pytorch_pod(),
            &pytorch(json!({}), json!({})),
            Some(&ns),
            &s,
        ) else {
            panic!()
        };
        assert_eq!(backend, BackendKind::Volcano);
    }

    #[test]
    fn rule_8_dry_run_and_off_namespaces_and_opted_out_jobs_are_skipped() {
        let s = settings(BackendKind::SchedulerPlugins);
        let job = pytorch(json!({}), json!({}));
        let dry = BTreeMap::from([("podgroup-sync.io/enabled".into(), "dry-run".into())]);
        assert_eq!(
            decide_for(&pytorch_pod(), &job, Some(&dry), &s),
            Decision::Skipped(Skip::NamespaceDryRun)
        );
        assert_eq!(
            decide_for(&pytorch_pod(), &job, None, &s),
            Decision::Skipped(Skip::NamespaceOff)
        );
        let opted = pytorch(json!({"podgroup-sync.io/enabled": "false"}), json!({}));
        assert_eq!(
            decide_for(&pytorch_pod(), &opted, Some(&managed()), &s),
            Decision::Skipped(Skip::OptedOut)
        );
        let unknown = pytorch(json!({"podgroup-sync.io/backend": "kai"}), json!({}));
        assert_eq!(
            decide_for(&pytorch_pod(), &unknown, Some(&managed()), &s),
            Decision::Skipped(Skip::UnknownBackend)
        );
    }

    #[test]
    fn rule_8_no_link_to_a_pod_group_that_will_not_exist_or_is_someone_elses() {
        let s = settings(BackendKind::SchedulerPlugins);
        let job = pytorch(json!({}), json!({}));
        let pod = pytorch_pod();
        let none = Served(vec![BackendKind::Volcano], None);
        assert_eq!(
            decide_with(&pod, &job, Some(&managed()), &none, &s),
            Decision::Skipped(Skip::BackendNotServed)
        );
        let foreign: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup", "metadata": {"name": "train", "namespace": "ns"}}))
            .unwrap();
        let taken = Served(BACKENDS.to_vec(), Some(foreign));
        assert_eq!(
            decide_with(&pod, &job, Some(&managed()), &taken, &s),
            Decision::Skipped(Skip::Conflict)
        );
        let zero: DynamicObject = serde_json::from_value(json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "ns", "uid": "job-uid"},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 0, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}}})).unwrap();
        assert_eq!(
            decide_for(&pod, &zero, Some(&managed()), &s),
            Decision::Skipped(Skip::InvalidJob)
        );
    }

    #[test]
    fn rule_11_a_jobset_pod_is_found_through_its_batch_job_and_linked_by_its_replicated_job() {
        let s = settings(BackendKind::SchedulerPlugins);
        let template = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
        let jobset: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "ns", "uid": "js-uid"},
            "spec": {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [
                {"name": "ps", "replicas": 1, "template": {"spec": {"template": template}}},
                {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2, "template": template}}}]}}))
        .unwrap();
        let pod_of = |rjob: &str| {
            let mut pod = Pod::of(owner_ref(
                "batch/v1",
                "Job",
                &format!("js-{rjob}-0"),
                "job-uid",
            ));
            pod.labels = Some(BTreeMap::from([
                (JOBSET_NAME_LABEL.into(), "js".into()),
                (REPLICATED_JOB_LABEL.into(), rjob.into()),
                (
                    "batch.kubernetes.io/job-name".into(),
                    format!("js-{rjob}-0"),
                ),
            ]));
            pod
        };
        let ps = pod_of("ps");
        assert_eq!(
            owner_of(&ps.view()).unwrap(),
            Owner {
                kind: &JOBSET,
                name: "js".into(),
                uid: None,
                pod_set: Some("ps".into()),
                group: None,
            }
        );
        assert_eq!(
            decide_for(&ps, &jobset, Some(&managed()), &s),
            Decision::Link {
                backend: BackendKind::SchedulerPlugins,
                name: "js".into(),
                additions: vec![
                    Addition::Label("scheduling.x-k8s.io/pod-group", "js".into()),
                    Addition::SchedulerName("scheduler-plugins-scheduler".into()),
                    marker(BackendKind::SchedulerPlugins)
                ]
            }
        );
        // InOrder: the workers come after the gang runs; a link would hold them for nothing.
        assert_eq!(
            decide_for(&pod_of("workers"), &jobset, Some(&managed()), &s),
            Decision::Skipped(Skip::OutsideGang)
        );
        // A batch/v1 Job pod without the JobSet's label belongs to that Job (a gang only when it
        // asks to be one, and only with --batch-jobs).
        let mut bare = pod_of("ps");
        bare.labels = None;
        assert_eq!(owner_of(&bare.view()).unwrap().kind, &BATCH_JOB);
    }

    #[test]
    fn rule_11_an_lws_pod_is_linked_to_its_groups_pod_group() {
        let s = settings(BackendKind::SchedulerPlugins);
        let lws_of = |startup: &str| -> DynamicObject {
            let t = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
            serde_json::from_value(json!({
                "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                "metadata": {"name": "serve", "namespace": "ns", "uid": "lws-uid"},
                "spec": {"replicas": 2, "startupPolicy": startup,
                    "leaderWorkerTemplate": {"size": 3, "workerTemplate": t}}}))
            .unwrap()
        };
        let pod = |name: &str, sts: &str, labels: &[(&str, &str)]| {
            let mut p = Pod::of(owner_ref("apps/v1", "StatefulSet", sts, "sts-uid"));
            p.name = Some(name.into());
            p.labels = Some(
                [(lws::LWS_NAME_LABEL, "serve")]
                    .iter()
                    .chain(labels)
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            p
        };
        // A leader before LWS's own webhook gave it its group-index label: from its name.
        let leader = pod("serve-1", "serve", &[(lws::WORKER_INDEX_LABEL, "0")]);
        assert_eq!(
            owner_of(&leader.view()).unwrap(),
            Owner {
                kind: &LEADERWORKERSET,
                name: "serve".into(),
                uid: None,
                pod_set: Some(lws::LEADER.into()),
                group: Some(1),
            }
        );
        let worker = pod("serve-1-2", "serve-1", &[(lws::GROUP_INDEX_LABEL, "1")]);
        let link = |name: &str| Decision::Link {
            backend: BackendKind::SchedulerPlugins,
            name: name.into(),
            additions: vec![
                Addition::Label("scheduling.x-k8s.io/pod-group", name.into()),
                Addition::SchedulerName("scheduler-plugins-scheduler".into()),
                marker(BackendKind::SchedulerPlugins),
            ],
        };
        let created = lws_of("LeaderCreated");
        assert_eq!(
            decide_for(&leader, &created, Some(&managed()), &s),
            link("serve-1")
        );
        assert_eq!(
            decide_for(&worker, &created, Some(&managed()), &s),
            link("serve-1")
        );
        let group0 = pod("serve-0-1", "serve-0", &[(lws::GROUP_INDEX_LABEL, "0")]);
        assert_eq!(
            decide_for(&group0, &created, Some(&managed()), &s),
            link("serve-0")
        );
        // LeaderReady: the workers come once the leader runs; the leader is scheduled alone.
        let ready = lws_of("LeaderReady");
        assert_eq!(
            decide_for(&leader, &ready, Some(&managed()), &s),
            Decision::Skipped(Skip::OutsideGang)
        );
        assert_eq!(
            decide_for(&worker, &ready, Some(&managed()), &s),
            link("serve-1")
        );
        // A pod whose group cannot be told is left alone, never linked to a guess.
        for odd in [
            pod("other-1", "serve", &[(lws::WORKER_INDEX_LABEL, "0")]),
            pod("serve-x-1", "serve-x", &[(lws::GROUP_INDEX_LABEL, "x")]),
            pod("serve-1-1", "serve-1", &[]),
        ] {
            assert_eq!(
                decide_for(&odd, &created, Some(&managed()), &s),
                Decision::Skipped(Skip::UnknownGroup),
                "{:?}",
                odd.name
            );
        }
    }

    #[test]
    fn rule_11_a_ray_pod_names_its_cluster_directly() {
        let mut pod = Pod::of(owner_ref("ray.io/v1", "RayCluster", "rc", "rc-uid"));
        pod.labels = Some(BTreeMap::from([
            ("ray.io/cluster".into(), "rc".into()),
            (RAY_GROUP_LABEL.into(), "gpu".into()),
        ]));
        assert_eq!(
            owner_of(&pod.view()).unwrap(),
            Owner {
                kind: &RAYCLUSTER,
                name: "rc".into(),
                uid: Some("rc-uid".into()),
                pod_set: Some("gpu".into()),
                group: None,
            }
        );
    }

    #[test]
    fn rule_8_the_mpijob_launcher_is_found_through_its_batch_job() {
        let s = settings(BackendKind::SchedulerPlugins);
        let mut pod = Pod::of(owner_ref("batch/v1", "Job", "mpi-launcher", "batch-uid"));
        pod.labels = Some(BTreeMap::from([
            (JOB_NAME_LABEL.into(), "mpi".into()),
            (OPERATOR_NAME_LABEL.into(), "mpi-operator".into()),
            (JOB_ROLE_LABEL.into(), "launcher".into()),
        ]));
        let owner = owner_of(&pod.view()).unwrap();
        assert_eq!(
            owner,
            Owner {
                kind: &MPIJOB_V2BETA1,
                name: "mpi".into(),
                uid: None,
                pod_set: Some("Launcher".into()),
                group: None,
            }
        );
        let Decision::Link { name, .. } =
            decide_for(&pod, &mpijob("AtStartup"), Some(&managed()), &s)
        else {
            panic!()
        };
        assert_eq!(name, "mpi");
        assert_eq!(
            decide_for(&pod, &mpijob("WaitForWorkersReady"), Some(&managed()), &s),
            Decision::Skipped(Skip::LauncherOutsideGang)
        );
        // The workers of that job are linked.
        let worker = Pod::of(owner_ref(
            "kubeflow.org/v2beta1",
            "MPIJob",
            "mpi",
            "mpi-uid",
        ));
        assert!(matches!(
            decide_for(
                &worker,
                &mpijob("WaitForWorkersReady"),
                Some(&managed()),
                &s
            ),
            Decision::Link { .. }
        ));
    }

    #[test]
    fn rule_8_pods_of_other_owners_are_not_ours() {
        let view = |owners: &[OwnerReference], labels: Option<&BTreeMap<String, String>>| {
            owner_of(&PodView {
                name: None,
                labels,
                annotations: None,
                owner_references: owners,
                scheduler_name: None,
                scheduling_group: false,
            })
        };
        assert_eq!(view(&[], None), Err(Skip::NoOwner));
        let rs = owner_ref("apps/v1", "ReplicaSet", "web-123", "u");
        assert_eq!(view(&[rs], None), Err(Skip::ForeignOwner));
        // A batch/v1 Job that is not mpi-operator's launcher of that job is the plain Job.
        let labels = BTreeMap::from([
            (JOB_NAME_LABEL.into(), "mpi".into()),
            (OPERATOR_NAME_LABEL.into(), "mpi-operator".into()),
            (JOB_ROLE_LABEL.into(), "launcher".into()),
        ]);
        let other = owner_ref("batch/v1", "Job", "nightly", "u");
        let owner = view(&[other], Some(&labels)).unwrap();
        assert_eq!((owner.kind, owner.name.as_str()), (&BATCH_JOB, "nightly"));
        // A reference that is not the controller does not count.
        let mut not_controller = owner_ref("kubeflow.org/v1", "PyTorchJob", "train", "u");
        not_controller.controller = None;
        assert_eq!(view(&[not_controller], None), Err(Skip::NoOwner));
    }

    #[test]
    fn rule_8_the_patch_creates_missing_maps_and_escapes_keys() {
        let labels = BTreeMap::new();
        let view = PodView {
            name: None,
            labels: Some(&labels),
            annotations: None,
            owner_references: &[],
            scheduler_name: None,
            scheduling_group: false,
        };
        let patch = json_patch(
            &view,
            &[
                Addition::Label("scheduling.x-k8s.io/pod-group", "g".into()),
                Addition::Annotation("scheduling.k8s.io/group-name", "g".into()),
                Addition::SchedulerName("volcano".into()),
            ],
        );
        assert_eq!(
            patch,
            json!([
                {"op": "add", "path": "/metadata/labels/scheduling.x-k8s.io~1pod-group", "value": "g"},
                {"op": "add", "path": "/metadata/annotations", "value": {}},
                {"op": "add", "path": "/metadata/annotations/scheduling.k8s.io~1group-name", "value": "g"},
                {"op": "add", "path": "/spec/schedulerName", "value": "volcano"},
            ])
        );
    }
}
