//! Step 3 of the pipeline: a [`Gang`] → the desired PodGroup object of one backend (pure).
//!
//! Each backend is one file implementing [`PodGroupBackend`]; [`BACKENDS`] is the table.

mod kubernetes;
mod scheduler_plugins;
mod volcano;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::gang::Gang;
use crate::job::{InvalidJob, Job};
use crate::packed::Labelled;

pub use kubernetes::{Kubernetes, LINKED_ANNOTATION};
pub use scheduler_plugins::SchedulerPlugins;
pub use volcano::Volcano;

pub use crate::names::{is_dns_subdomain, shorten, valid_label_value};

/// The label every PodGroup podgroup-sync writes carries.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "podgroup-sync";
/// The label the pod-link webhook sets, beside the link, on every pod it links (value: the
/// backend). The watch behind `PodsNotLinked` asks the API server for the operators' pods
/// without it, so linked pods — nearly all of them — are never sent to the controller. It is no
/// link: a pod counts as linked only by its backend's link.
pub const LINKED_LABEL: &str = "podgroup-sync.io/linked";
/// The label that names the installation (`--instance`) that made a PodGroup; absent on the
/// default installation's, as on every PodGroup written before installations had names.
pub const INSTANCE_LABEL: &str = "podgroup-sync.io/instance";

/// Whether a PodGroup's labels say installation `instance` made it: the managed-by label, and
/// the instance label naming `instance` (none for the default installation, `""`). Another
/// installation's PodGroups are foreign: never modified or deleted.
pub fn made_by(pg: &impl Labelled, instance: &str) -> bool {
    pg.label(MANAGED_BY_LABEL) == Some(MANAGED_BY_VALUE)
        && pg.label(INSTANCE_LABEL).unwrap_or("") == instance
}

/// The labels installation `instance` gives its PodGroups.
pub fn own_labels(instance: &str) -> Value {
    if instance.is_empty() {
        json!({ MANAGED_BY_LABEL: MANAGED_BY_VALUE })
    } else {
        json!({ MANAGED_BY_LABEL: MANAGED_BY_VALUE, INSTANCE_LABEL: instance })
    }
}

/// The backends podgroup-sync writes PodGroups for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum BackendKind {
    /// scheduler-plugins coscheduling, `scheduling.x-k8s.io/v1alpha1`.
    #[value(name = "scheduler-plugins")]
    SchedulerPlugins,
    /// Volcano, `scheduling.volcano.sh/v1beta1`.
    #[value(name = "volcano")]
    Volcano,
    /// Kubernetes' own gang scheduling, `scheduling.k8s.io/v1beta1` (1.37+, `GenericWorkload`).
    #[value(name = "kubernetes")]
    Kubernetes,
}

impl BackendKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            BackendKind::SchedulerPlugins => "scheduler-plugins",
            BackendKind::Volcano => "volcano",
            BackendKind::Kubernetes => "kubernetes",
        }
    }

    pub fn parse(s: &str) -> Option<BackendKind> {
        match s {
            "scheduler-plugins" => Some(BackendKind::SchedulerPlugins),
            "volcano" => Some(BackendKind::Volcano),
            "kubernetes" => Some(BackendKind::Kubernetes),
            _ => None,
        }
    }

    pub fn backend(&self) -> &'static dyn PodGroupBackend {
        match self {
            BackendKind::SchedulerPlugins => &SchedulerPlugins,
            BackendKind::Volcano => &Volcano,
            BackendKind::Kubernetes => &Kubernetes,
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every backend, in the order they are tried.
pub const BACKENDS: [BackendKind; 3] = [
    BackendKind::SchedulerPlugins,
    BackendKind::Volcano,
    BackendKind::Kubernetes,
];

/// Settings that shape PodGroups and the pod-link check.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// `schedulerName`s that run the coscheduling plugin.
    pub coscheduling_scheduler_names: Vec<String>,
    /// The `schedulerName` of the Volcano scheduler.
    pub volcano_scheduler_name: String,
    /// scheduler-plugins `scheduleTimeoutSeconds` when the job sets none.
    pub default_schedule_timeout_seconds: Option<i32>,
    /// The `schedulerName` the pod-link webhook gives coscheduling pods that ask for the default
    /// scheduler; `None` when coscheduling runs in the default scheduler.
    pub link_coscheduling_scheduler_name: Option<String>,
    /// The installation this is (`--instance`; empty: the default one): part of what makes a
    /// PodGroup its own ([`made_by`]).
    pub instance: String,
    /// The pod-link webhook labels each pod with its pod set and slice (SPEC §13): only then
    /// can a Volcano `subGroupPolicy` select them.
    pub pods_labelled: bool,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            coscheduling_scheduler_names: vec![
                "default-scheduler".into(),
                "scheduler-plugins-scheduler".into(),
            ],
            volcano_scheduler_name: "volcano".into(),
            default_schedule_timeout_seconds: None,
            link_coscheduling_scheduler_name: Some("scheduler-plugins-scheduler".into()),
            instance: String::new(),
            pods_labelled: false,
        }
    }
}

/// Where a pod carries its PodGroup link: a label or an annotation with this key, or the pod
/// spec's `schedulingGroup.podGroupName` (the native backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKey {
    Label(&'static str),
    Annotation(&'static str),
    SchedulingGroup,
}

/// PodGroup phases of every backend, in one label set (the native backend has conditions only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Created, not yet seen by the scheduler's controller.
    Unknown,
    /// Waiting for members or admission (`Pending`, Volcano `Inqueue`).
    Pending,
    /// Members are being scheduled (scheduler-plugins `Scheduling`).
    Scheduling,
    Running,
    /// `Finished` / `Completed`.
    Finished,
    Failed,
}

impl Phase {
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Unknown => "unknown",
            Phase::Pending => "pending",
            Phase::Scheduling => "scheduling",
            Phase::Running => "running",
            Phase::Finished => "finished",
            Phase::Failed => "failed",
        }
    }

    pub const ALL: [Phase; 6] = [
        Phase::Unknown,
        Phase::Pending,
        Phase::Scheduling,
        Phase::Running,
        Phase::Finished,
        Phase::Failed,
    ];
}

/// One PodGroup API: its object shape and how pods link to it.
pub trait PodGroupBackend: Sync {
    fn kind(&self) -> BackendKind;
    fn group(&self) -> &'static str;
    fn version(&self) -> &'static str;

    fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group().into(),
            version: self.version().into(),
            api_version: format!("{}/{}", self.group(), self.version()),
            kind: "PodGroup".into(),
            plural: "podgroups".into(),
        }
    }

    /// The PodGroup kind as the caches key it (one shared copy, see [`crate::packed::Kind`]).
    fn shared(&self) -> crate::packed::Kind {
        crate::packed::kind_of(self.group(), self.version(), "PodGroup", || {
            self.api_resource()
        })
    }

    /// The PodGroup name a replica template links its pods to, if it carries the link.
    fn template_link<'a>(&self, template: &'a PodTemplateSpec) -> Option<&'a str>;

    /// Where a pod carries its link to a PodGroup.
    fn link_key(&self) -> LinkKey;

    /// What to add to a template so its pods join PodGroup `name`.
    fn link_instruction(&self, name: &str) -> String {
        match self.link_key() {
            LinkKey::Label(key) => format!("label {key}: {name}"),
            LinkKey::Annotation(key) => format!("annotation {key}: {name}"),
            LinkKey::SchedulingGroup => format!("spec.schedulingGroup.podGroupName: {name}"),
        }
    }

    /// What a template without the link needs, for the MissingPodGroupLink message.
    fn missing_link(&self, name: &str) -> String {
        format!("add {} to the pod template", self.link_instruction(name))
    }

    /// The `schedulerName` the pod-link webhook gives pods that ask for the default scheduler
    /// (`None`: the default scheduler reaches this backend).
    fn link_scheduler_name<'a>(&self, opts: &'a BackendOptions) -> Option<&'a str>;

    /// Whether pods with this `schedulerName` (None: the default scheduler) reach this backend.
    fn scheduler_matches(&self, scheduler_name: Option<&str>, opts: &BackendOptions) -> bool;

    /// The `schedulerName`s that reach this backend, for messages.
    fn expected_schedulers(&self, opts: &BackendOptions) -> String;

    /// Whether a template says its pods are meant for this backend (backend inference).
    fn template_prefers(&self, template: &PodTemplateSpec, opts: &BackendOptions) -> bool;

    /// The `spec` podgroup-sync owns. `existing` is the current PodGroup's `spec`, if any.
    fn spec(
        &self,
        job: &Job,
        gang: &Gang,
        existing: Option<&Value>,
        opts: &BackendOptions,
    ) -> Value;

    /// Top-level `spec` fields the API server never lets change after creation: an existing
    /// PodGroup keeps its values (and the job is told when it asks for others).
    fn immutable_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// What of the job's topology request (SPEC §13) this backend's PodGroup does not express,
    /// one message per part; the planner says so in one Normal Event. The default: nothing is.
    fn topology_gaps(&self, _job: &Job, gang: &Gang, _opts: &BackendOptions) -> Vec<String> {
        if gang.topology.is_empty() && !gang.topology.disruption_all {
            return Vec::new();
        }
        vec![format!(
            "the {} PodGroup has no topology field: {} is not enforced",
            self.kind(),
            gang.topology.describe()
        )]
    }

    /// Why an immutable field may hold another value than the job asks for (`have`: the stored
    /// one), beyond a change of the job after creation.
    fn immutable_hint(&self, _field: &str, _have: Option<&Value>) -> Option<&'static str> {
        None
    }

    /// Annotations that record what the PodGroup's `spec` asked for, where the scheduler rewrites
    /// the spec in its own terms (see [`accept_rewrites`](Self::accept_rewrites)).
    fn spec_annotations(&self, _gang: &Gang, _spec: &Value) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Takes into the desired object the scheduler's rewrites of the stored one that say the same
    /// as what podgroup-sync asked for, so that they are not undone (and redone) for ever.
    fn accept_rewrites(&self, _desired: &mut Value, _actual: &Value) {}

    /// The placement constraints a stored PodGroup (the whole object) holds its gang to, in
    /// words (SPEC §13): said beside the scheduler's own reason for a gang it cannot place, which
    /// names no topology. `None` when it holds none.
    fn held_to(&self, _pg: &Value) -> Option<String> {
        None
    }

    /// Why the cluster may drop this spec field (see `dropped`), when the backend knows.
    fn dropped_hint(&self, _field: &str) -> Option<&'static str> {
        None
    }

    /// Fields of the other backends this API has no place for (`explain` says so).
    fn absent_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// What the API server lacks while this backend's PodGroups are not served, and what
    /// serves them.
    fn not_served(&self) -> String {
        format!(
            "the {} PodGroup CRD ({}) is not served by the API server",
            self.kind(),
            self.api_resource().api_version
        )
    }

    /// Job annotations copied onto the PodGroup.
    fn annotations(&self, _job: &Job) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// The normalised phase of a PodGroup's `status`.
    fn phase(&self, status: Option<&Value>) -> Phase;

    /// Why the scheduler holds the gang back, if it says (reason, message).
    fn unschedulable(&self, _status: Option<&Value>) -> Option<(String, String)> {
        None
    }

    /// Pods of the gang the status counts as running or succeeded (SPEC §10 broken gangs);
    /// `None` when the status has no such count.
    fn running_pods(&self, status: Option<&Value>) -> Option<u32> {
        let count = |field: &str| {
            status
                .and_then(|s| s.get(field))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        Some(u32::try_from(count("running") + count("succeeded")).unwrap_or(u32::MAX))
    }

    /// The queue a PodGroup spec names, for backends that have queues.
    fn queue<'a>(&self, _spec: &'a Value) -> Option<&'a str> {
        None
    }

    /// The longest PodGroup name pods can link to (a label value holds at most 63 characters).
    fn max_name_len(&self) -> usize {
        253
    }

    /// Checks the job's backend-specific fields before anything is written: a value the API
    /// server would refuse is an invalid job; a doubtful one is a warning. `class_exists` says
    /// whether a PriorityClass of that name exists.
    fn check(
        &self,
        _job: &Job,
        _class_exists: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<String>, InvalidJob> {
        Ok(Vec::new())
    }
}

/// The fields of `spec` that size the gang; frozen by `--resize` policies other than `always`.
pub const SIZING_FIELDS: [&str; 4] = [
    "minMember",
    "minResources",
    "minTaskMember",
    // The native backend's `gang.minCount` lives here.
    "schedulingPolicy",
];

/// The full object podgroup-sync applies for a job (server-side apply body).
pub fn desired_object(
    backend: &dyn PodGroupBackend,
    job: &Job,
    gang: &Gang,
    name: &str,
    existing_spec: Option<&Value>,
    freeze_sizing: bool,
    opts: &BackendOptions,
) -> Value {
    let mut spec = backend.spec(job, gang, existing_spec, opts);
    if let (Some(existing), Some(obj)) = (existing_spec, spec.as_object_mut()) {
        let frozen = SIZING_FIELDS.iter().filter(|_| freeze_sizing);
        for field in frozen.chain(backend.immutable_fields()) {
            match existing.get(*field) {
                Some(v) => obj.insert(field.to_string(), v.clone()),
                None => obj.remove(*field),
            };
        }
    }
    let mut metadata = json!({
        "name": name,
        "namespace": job.namespace,
        "labels": own_labels(&opts.instance),
        "ownerReferences": [{
            "apiVersion": job.kind.api_version(),
            "kind": job.kind.kind,
            "name": job.name,
            "uid": job.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    });
    let mut annotations = backend.annotations(job);
    annotations.extend(backend.spec_annotations(gang, &spec));
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    json!({
        "apiVersion": format!("{}/{}", backend.group(), backend.version()),
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": spec,
    })
}

/// The PodGroup name: the link value the replica templates agree on, else the job name, with a
/// warning when templates disagree. A name pods could not link to (not an object name, or too
/// long for the backend's pod link) makes the job invalid: its pods could never join.
pub fn pod_group_name(
    backend: &dyn PodGroupBackend,
    job: &Job,
) -> Result<(String, Option<String>), InvalidJob> {
    if let Some(groups) = job.groups {
        return groups_base_name(backend, job, groups).map(|n| (n, None));
    }
    let mut names: Vec<&str> = job
        .shape
        .pod_sets
        .iter()
        .filter_map(|r| backend.template_link(&r.template))
        .collect();
    names.sort_unstable();
    names.dedup();
    let (name, warning) = match names.as_slice() {
        [] => (job.name.clone(), None),
        [one] if is_dns_subdomain(one) => (one.to_string(), None),
        [one] => {
            return Err(InvalidJob::InvalidPodGroupName(format!(
                "the templates link to PodGroup {one:?}, which is not a valid object name \
                 (lowercase letters, digits, '-' and '.', at most 253 characters)"
            )));
        }
        many => (
            job.name.clone(),
            Some(format!(
                "the templates link to different PodGroups {many:?}; using the job name {:?}",
                job.name
            )),
        ),
    };
    let max = backend.max_name_len();
    if name.len() > max {
        let from = if names.is_empty() {
            "the job name"
        } else {
            "the templates' link"
        };
        return Err(InvalidJob::InvalidPodGroupName(format!(
            "PodGroup name {name:?} ({from}) has {} characters; pods link to a {} PodGroup with \
             a value of at most {max}: {}",
            name.len(),
            backend.kind(),
            if names.is_empty() {
                "link the templates to a shorter PodGroup name"
            } else {
                "use a shorter link value"
            }
        )));
    }
    Ok((name, warning))
}

/// The name a job of several gangs gives its PodGroups, `<name>-<group index>`
/// ([`group_name`]): the job's own. A template link would join every group's pods to one
/// PodGroup, and the longest group name must fit the backend's pod link.
fn groups_base_name(
    backend: &dyn PodGroupBackend,
    job: &Job,
    groups: u32,
) -> Result<String, InvalidJob> {
    if let Some(link) = job
        .shape
        .pod_sets
        .iter()
        .find_map(|r| backend.template_link(&r.template))
    {
        return Err(InvalidJob::InvalidPodGroupName(format!(
            "the templates link the pods of every group to PodGroup {link:?}, but a {} gets one \
             PodGroup per group ({}-<group index>), to which the pod-link webhook links each \
             group's pods: remove the link from the templates",
            job.kind.kind, job.name
        )));
    }
    let longest = group_name(&job.name, groups.saturating_sub(1));
    let max = backend.max_name_len();
    if longest.len() > max {
        return Err(InvalidJob::InvalidPodGroupName(format!(
            "PodGroup name {longest:?} (the {}'s name and its group index) has {} characters; \
             pods link to a {} PodGroup with a value of at most {max}: use a shorter name",
            job.kind.kind,
            longest.len(),
            backend.kind(),
        )));
    }
    Ok(job.name.clone())
}

/// The PodGroup of group `index` of a job of several gangs.
pub fn group_name(base: &str, index: u32) -> String {
    format!("{base}-{index}")
}

/// The PodGroup name and the warnings about the job's link and backend fields, or why the job
/// cannot get a PodGroup of this backend at all.
pub fn name_and_checks(
    backend: &dyn PodGroupBackend,
    job: &Job,
    class_exists: &dyn Fn(&str) -> bool,
) -> Result<(String, Vec<String>), InvalidJob> {
    let (name, warning) = pod_group_name(backend, job)?;
    let mut warnings: Vec<String> = warning.into_iter().collect();
    warnings.extend(backend.check(job, class_exists)?);
    Ok((name, warnings))
}

/// What the job asks for in fields the existing PodGroup (its `spec`, `existing`) can no longer
/// change (the PodGroup keeps its values), one message per field, with the field. A field the job leaves unset
/// is no change: the API server may have filled it in (the native PodGroup's default priority
/// class). Backends without immutable fields cost nothing here.
pub fn immutable_changes(
    backend: &dyn PodGroupBackend,
    job: &Job,
    gang: &Gang,
    existing: &Value,
    opts: &BackendOptions,
) -> Vec<(&'static str, String)> {
    let fields = backend.immutable_fields();
    if fields.is_empty() {
        return Vec::new();
    }
    let wanted = backend.spec(job, gang, Some(existing), opts);
    fields
        .iter()
        .filter_map(|f| {
            let want = wanted.get(*f)?;
            let have = existing.get(*f);
            (have != Some(want)).then(|| {
                let hint = backend
                    .immutable_hint(f, have)
                    .map(|h| format!(" ({h})"))
                    .unwrap_or_default();
                let message = format!(
                    "{f} cannot change on an existing {} PodGroup: it keeps {}, the job asks for \
                     {want}{hint}; suspend and resume the job to recreate the PodGroup",
                    backend.kind(),
                    have.map(Value::to_string).unwrap_or_else(|| "none".into()),
                );
                (*f, message)
            })
        })
        .collect()
}

/// Templates whose pods would not join PodGroup `name` through this backend, with what to add.
/// With the pod-link webhook on (`webhook`), a template without the link or asking for the
/// default scheduler is expected: the webhook adds the link and the backend's scheduler to its
/// pods; a link to another PodGroup or a scheduler that does not reach the backend still counts.
pub fn missing_links(
    backend: &dyn PodGroupBackend,
    job: &Job,
    name: &str,
    opts: &BackendOptions,
    webhook: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    if job.groups.is_some() && !webhook {
        out.push(format!(
            "the pods of a {} join the PodGroup of their group ({}-<group index>) only through \
             the pod-link webhook, which is off",
            job.kind.kind, job.name
        ));
    }
    for r in &job.shape.pod_sets {
        let t = &r.template;
        if t.metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .is_some_and(|a| a.contains_key(LINKED_ANNOTATION))
        {
            out.push(format!(
                "{}: carries the annotation {LINKED_ANNOTATION}, which only the pod-link webhook \
                 sets: it is no link (only spec.schedulingGroup is) and would hide pods left \
                 unlinked from PodsNotLinked; remove it",
                r.name
            ));
        }
        if t.metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .is_some_and(|l| l.contains_key(LINKED_LABEL))
        {
            out.push(format!(
                "{}: carries the label {LINKED_LABEL}, which only the pod-link webhook sets: \
                 pods made from it would be hidden from PodsNotLinked if left unlinked; remove it",
                r.name
            ));
        }
        let link = backend.template_link(t);
        if link != Some(name) && !(webhook && link.is_none()) && job.groups.is_none() {
            out.push(format!("{}: {}", r.name, backend.missing_link(name)));
        }
        let asked = t.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
        let default = matches!(asked, None | Some("") | Some("default-scheduler"));
        let scheduler = match backend.link_scheduler_name(opts) {
            Some(linked) if webhook && default => Some(linked),
            _ => asked,
        };
        if !backend.scheduler_matches(scheduler, opts) {
            out.push(format!(
                "{}: schedulerName {:?} does not reach {} (expected {})",
                r.name,
                scheduler.unwrap_or("default-scheduler"),
                backend.kind(),
                backend.expected_schedulers(opts)
            ));
        }
    }
    out
}

/// Backend inference from the job's pod templates (SPEC §2, third choice).
pub fn infer_from_templates(job: &Job, opts: &BackendOptions) -> Option<BackendKind> {
    BACKENDS.into_iter().find(|b| {
        job.shape
            .pod_sets
            .iter()
            .any(|r| b.backend().template_prefers(&r.template, opts))
    })
}

fn template_label<'a>(t: &'a PodTemplateSpec, key: &str) -> Option<&'a str> {
    t.metadata
        .as_ref()?
        .labels
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn template_annotation<'a>(t: &'a PodTemplateSpec, key: &str) -> Option<&'a str> {
    t.metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn scheduler_name(t: &PodTemplateSpec) -> Option<&str> {
    t.spec.as_ref()?.scheduler_name.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gang::{Priorities, compute};
    use crate::job::{PYTORCHJOB, normalize};
    use crate::resources::AdmissionDefaults;

    fn job(annotations: Value, run_policy: Value, templates_meta: Value) -> Job {
        let t = json!({"metadata": templates_meta, "spec": {"schedulerName": "volcano", "priorityClassName": "",
            "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}});
        normalize(
            &PYTORCHJOB,
            &json!({"metadata": {"name": "j", "namespace": "n", "uid": "u", "annotations": annotations},
                "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": {"Master": {"template": t}, "Worker": {"replicas": 2, "template": t}}}}),
        )
        .unwrap()
    }

    fn volcano_spec(job: &Job, existing: Option<&Value>) -> Value {
        let gang = compute(job, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        Volcano.spec(job, &gang, existing, &BackendOptions::default())
    }

    #[test]
    fn rule_3_3_volcano_queue_fallbacks() {
        let from_policy = job(
            json!({"scheduling.volcano.sh/queue-name": "ann"}),
            json!({"schedulingPolicy": {"queue": "pol"}}),
            json!({}),
        );
        assert_eq!(volcano_spec(&from_policy, None)["queue"], "pol");
        let from_annotation = job(
            json!({"scheduling.volcano.sh/queue-name": "ann"}),
            json!({}),
            json!({}),
        );
        assert_eq!(volcano_spec(&from_annotation, None)["queue"], "ann");
        let fallback = job(json!({}), json!({}), json!({}));
        assert_eq!(volcano_spec(&fallback, None)["queue"], "default");
    }

    #[test]
    fn rule_3_3_volcano_never_changes_an_existing_queue() {
        let j = job(
            json!({}),
            json!({"schedulingPolicy": {"queue": "pol"}}),
            json!({}),
        );
        let existing = json!({"queue": "set-by-webhook", "minMember": 3});
        assert_eq!(volcano_spec(&j, Some(&existing))["queue"], "set-by-webhook");
    }

    #[test]
    fn rule_3_3_volcano_always_has_min_resources_and_policy_priority_class() {
        let j = job(
            json!({}),
            json!({"schedulingPolicy": {"priorityClass": "urgent"}}),
            json!({}),
        );
        let spec = volcano_spec(&j, None);
        assert_eq!(spec["minResources"], json!({"cpu": "3"}));
        assert_eq!(spec["priorityClassName"], "urgent");
        assert_eq!(spec["minMember"], 3);
        assert!(spec.get("minTaskMember").is_none());
    }

    #[test]
    fn rule_3_3_volcano_min_task_member_only_when_every_template_names_its_task() {
        let j = job(
            json!({}),
            json!({}),
            json!({"annotations": {"volcano.sh/task-spec": "trainer"}}),
        );
        assert_eq!(
            volcano_spec(&j, None)["minTaskMember"],
            json!({"trainer": 3})
        );
    }

    #[test]
    fn rule_3_3_volcano_copies_only_volcano_annotations() {
        let j = job(
            json!({"volcano.sh/preemptable": "true", "scheduling.volcano.sh/queue-name": "q", "team": "x",
                "kubectl.kubernetes.io/last-applied-configuration": "{}"}),
            json!({}),
            json!({}),
        );
        let keys: Vec<_> = Volcano.annotations(&j).into_keys().collect();
        assert_eq!(
            keys,
            vec!["scheduling.volcano.sh/queue-name", "volcano.sh/preemptable"]
        );
    }

    #[test]
    fn rule_3_3_scheduler_plugins_timeout_from_policy_else_default_else_omitted() {
        let with = job(
            json!({}),
            json!({"schedulingPolicy": {"scheduleTimeoutSeconds": 90}}),
            json!({}),
        );
        let without = job(json!({}), json!({}), json!({}));
        let gang =
            |j: &Job| compute(j, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        let mut opts = BackendOptions::default();
        assert_eq!(
            SchedulerPlugins.spec(&with, &gang(&with), None, &opts)["scheduleTimeoutSeconds"],
            90
        );
        assert!(
            SchedulerPlugins
                .spec(&without, &gang(&without), None, &opts)
                .get("scheduleTimeoutSeconds")
                .is_none()
        );
        opts.default_schedule_timeout_seconds = Some(30);
        assert_eq!(
            SchedulerPlugins.spec(&without, &gang(&without), None, &opts)["scheduleTimeoutSeconds"],
            30
        );
        assert_eq!(
            SchedulerPlugins.spec(&with, &gang(&with), None, &opts)["scheduleTimeoutSeconds"],
            90
        );
    }

    #[test]
    fn rule_3_name_comes_from_agreeing_template_links_else_the_job_name() {
        let linked = job(
            json!({}),
            json!({}),
            json!({"labels": {"scheduling.x-k8s.io/pod-group": "my-gang"}}),
        );
        assert_eq!(
            pod_group_name(&SchedulerPlugins, &linked),
            Ok(("my-gang".to_string(), None))
        );
        let unlinked = job(json!({}), json!({}), json!({}));
        assert_eq!(
            pod_group_name(&SchedulerPlugins, &unlinked),
            Ok(("j".to_string(), None))
        );
        let bad = job(
            json!({}),
            json!({}),
            json!({"labels": {"scheduling.x-k8s.io/pod-group": "Not_Valid"}}),
        );
        assert!(matches!(
            pod_group_name(&SchedulerPlugins, &bad),
            Err(InvalidJob::InvalidPodGroupName(_))
        ));
        // A label value holds 63 characters: a 64-character link can never be carried by pods.
        let long = job(
            json!({}),
            json!({}),
            json!({"labels": {"scheduling.x-k8s.io/pod-group": "a".repeat(64)}}),
        );
        assert!(matches!(
            pod_group_name(&SchedulerPlugins, &long),
            Err(InvalidJob::InvalidPodGroupName(m)) if m.contains("64 characters")
        ));
        let volcano_long = job(
            json!({}),
            json!({}),
            json!({"annotations": {"scheduling.k8s.io/group-name": "a".repeat(64)}}),
        );
        assert!(pod_group_name(&Volcano, &volcano_long).is_ok());
    }

    #[test]
    fn rule_3_pod_link_check_names_the_template_and_the_exact_label() {
        let unlinked = job(json!({}), json!({}), json!({}));
        let problems = missing_links(
            &SchedulerPlugins,
            &unlinked,
            "j",
            &BackendOptions::default(),
            false,
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("Master: add label scheduling.x-k8s.io/pod-group: j")),
            "{problems:?}"
        );
        // The templates say schedulerName volcano, which does not reach coscheduling.
        assert!(
            problems
                .iter()
                .any(|p| p.contains("schedulerName \"volcano\"")),
            "{problems:?}"
        );
        let volcano_linked = job(
            json!({}),
            json!({}),
            json!({"annotations": {"scheduling.k8s.io/group-name": "j"}}),
        );
        assert!(
            missing_links(
                &Volcano,
                &volcano_linked,
                "j",
                &BackendOptions::default(),
                false
            )
            .is_empty()
        );
    }

    #[test]
    fn rule_3_ownership_is_one_controller_reference_and_the_managed_by_label() {
        let j = job(json!({}), json!({}), json!({}));
        let gang = compute(&j, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        let obj = desired_object(
            &Volcano,
            &j,
            &gang,
            "j",
            None,
            false,
            &BackendOptions::default(),
        );
        assert_eq!(
            obj["metadata"]["ownerReferences"],
            json!([{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j", "uid": "u", "controller": true, "blockOwnerDeletion": true}])
        );
        assert_eq!(
            obj["metadata"]["labels"],
            json!({"app.kubernetes.io/managed-by": "podgroup-sync"})
        );
    }

    #[test]
    fn resize_policy_freezes_sizing_fields_of_an_existing_pod_group() {
        let j = job(json!({}), json!({}), json!({}));
        let gang = compute(&j, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
        let existing = json!({"minMember": 2, "minResources": {"cpu": "2"}, "queue": "q"});
        let obj = desired_object(
            &Volcano,
            &j,
            &gang,
            "j",
            Some(&existing),
            true,
            &BackendOptions::default(),
        );
        assert_eq!(obj["spec"]["minMember"], 2);
        assert_eq!(obj["spec"]["minResources"], json!({"cpu": "2"}));
    }

    #[test]
    fn backend_is_inferred_from_templates() {
        let opts = BackendOptions::default();
        let volcano = job(json!({}), json!({}), json!({}));
        assert_eq!(
            infer_from_templates(&volcano, &opts),
            Some(BackendKind::Volcano)
        );
    }

    #[test]
    fn an_installation_owns_its_own_labels_only() {
        // Read from a whole object and from a cached one alike.
        let labels = |pairs: &[(&str, &str)]| -> (kube::api::DynamicObject, crate::packed::Packed) {
            let mut pg = kube::api::DynamicObject::new("pg", &SchedulerPlugins.api_resource());
            pg.metadata.labels = (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            });
            (pg.clone(), crate::packed::Packed::pack(pg))
        };
        let legacy = labels(&[(MANAGED_BY_LABEL, MANAGED_BY_VALUE)]);
        let b = labels(&[(MANAGED_BY_LABEL, MANAGED_BY_VALUE), (INSTANCE_LABEL, "b")]);
        let neither = labels(&[(INSTANCE_LABEL, "b")]);
        let none = labels(&[]);
        for (pg, cached) in [&legacy, &b, &neither, &none] {
            for instance in ["", "b"] {
                assert_eq!(made_by(pg, instance), made_by(cached, instance));
            }
        }
        assert!(made_by(&legacy.1, ""));
        assert!(!made_by(&legacy.0, "b"));
        assert!(made_by(&b.1, "b"));
        assert!(!made_by(&b.0, ""));
        assert!(!made_by(&neither.1, "b"));
        assert!(!made_by(&none.0, ""));
        assert_eq!(own_labels(""), json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE}));
        assert!(valid_label_value("") && valid_label_value("team-b.1"));
        assert!(
            !valid_label_value("-b")
                && !valid_label_value("a/b")
                && !valid_label_value(&"a".repeat(64))
        );
    }
}
