//! Step 3 of the pipeline: a [`Gang`] → the desired PodGroup object of one backend (pure).
//!
//! Each backend is one file implementing [`PodGroupBackend`]; [`BACKENDS`] is the table.

mod scheduler_plugins;
mod volcano;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::gang::Gang;
use crate::job::Job;

pub use scheduler_plugins::SchedulerPlugins;
pub use volcano::Volcano;

/// The label every PodGroup podgroup-sync writes carries.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "podgroup-sync";

/// The backends podgroup-sync writes PodGroups for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum BackendKind {
    /// scheduler-plugins coscheduling, `scheduling.x-k8s.io/v1alpha1`.
    #[value(name = "scheduler-plugins")]
    SchedulerPlugins,
    /// Volcano, `scheduling.volcano.sh/v1beta1`.
    #[value(name = "volcano")]
    Volcano,
}

impl BackendKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            BackendKind::SchedulerPlugins => "scheduler-plugins",
            BackendKind::Volcano => "volcano",
        }
    }

    pub fn parse(s: &str) -> Option<BackendKind> {
        match s {
            "scheduler-plugins" => Some(BackendKind::SchedulerPlugins),
            "volcano" => Some(BackendKind::Volcano),
            _ => None,
        }
    }

    pub fn backend(&self) -> &'static dyn PodGroupBackend {
        match self {
            BackendKind::SchedulerPlugins => &SchedulerPlugins,
            BackendKind::Volcano => &Volcano,
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every backend, in the order they are tried.
pub const BACKENDS: [BackendKind; 2] = [BackendKind::SchedulerPlugins, BackendKind::Volcano];

/// Settings that shape PodGroups and the pod-link check.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// `schedulerName`s that run the coscheduling plugin.
    pub coscheduling_scheduler_names: Vec<String>,
    /// The `schedulerName` of the Volcano scheduler.
    pub volcano_scheduler_name: String,
    /// scheduler-plugins `scheduleTimeoutSeconds` when the job sets none.
    pub default_schedule_timeout_seconds: Option<i32>,
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
        }
    }
}

/// PodGroup phases of both backends, in one label set.
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

    /// The PodGroup name a replica template links its pods to, if it carries the link.
    fn template_link<'a>(&self, template: &'a PodTemplateSpec) -> Option<&'a str>;

    /// What to add to a template so its pods join PodGroup `name`.
    fn link_instruction(&self, name: &str) -> String;

    /// Whether pods with this `schedulerName` (None: the default scheduler) reach this backend.
    fn scheduler_matches(&self, scheduler_name: Option<&str>, opts: &BackendOptions) -> bool;

    /// Whether a template says its pods are meant for this backend (backend inference).
    fn template_prefers(&self, template: &PodTemplateSpec, opts: &BackendOptions) -> bool;

    /// The `spec` podgroup-sync owns. `existing` is the current PodGroup's `spec`, if any.
    fn spec(&self, job: &Job, gang: &Gang, existing: Option<&Value>, opts: &BackendOptions) -> Value;

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
}

/// The fields of `spec` that size the gang; frozen by `--resize` policies other than `always`.
pub const SIZING_FIELDS: [&str; 3] = ["minMember", "minResources", "minTaskMember"];

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
    if let (true, Some(existing), Some(obj)) = (freeze_sizing, existing_spec, spec.as_object_mut()) {
        for field in SIZING_FIELDS {
            match existing.get(field) {
                Some(v) => obj.insert(field.to_string(), v.clone()),
                None => obj.remove(field),
            };
        }
    }
    let mut metadata = json!({
        "name": name,
        "namespace": job.namespace,
        "labels": { MANAGED_BY_LABEL: MANAGED_BY_VALUE },
        "ownerReferences": [{
            "apiVersion": job.kind.api_version(),
            "kind": job.kind.kind,
            "name": job.name,
            "uid": job.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    });
    let annotations = backend.annotations(job);
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

/// The PodGroup name: the link value the replica templates agree on, else the job name.
/// Returns the name and, when templates disagree or name something invalid, why it fell back.
pub fn pod_group_name(backend: &dyn PodGroupBackend, job: &Job) -> (String, Option<String>) {
    let mut names: Vec<&str> = job
        .replicas
        .iter()
        .filter_map(|r| backend.template_link(&r.template))
        .collect();
    names.sort_unstable();
    names.dedup();
    match names.as_slice() {
        [] => (job.name.clone(), None),
        [one] if is_dns_subdomain(one) => (one.to_string(), None),
        [one] => (
            job.name.clone(),
            Some(format!(
                "the templates link to PodGroup {one:?}, which is not a valid object name; using {:?}",
                job.name
            )),
        ),
        many => (
            job.name.clone(),
            Some(format!(
                "the templates link to different PodGroups {many:?}; using the job name {:?}",
                job.name
            )),
        ),
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// Templates whose pods would not join PodGroup `name` through this backend, with what to add.
pub fn missing_links(
    backend: &dyn PodGroupBackend,
    job: &Job,
    name: &str,
    opts: &BackendOptions,
) -> Vec<String> {
    let mut out = Vec::new();
    for r in &job.replicas {
        let t = &r.template;
        if backend.template_link(t) != Some(name) {
            out.push(format!(
                "{}: add {} to the pod template",
                r.replica_type,
                backend.link_instruction(name)
            ));
        }
        let scheduler = t.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
        if !backend.scheduler_matches(scheduler, opts) {
            out.push(format!(
                "{}: schedulerName {:?} does not reach {} (expected {})",
                r.replica_type,
                scheduler.unwrap_or("default-scheduler"),
                backend.kind(),
                match backend.kind() {
                    BackendKind::SchedulerPlugins => opts.coscheduling_scheduler_names.join(" or "),
                    BackendKind::Volcano => opts.volcano_scheduler_name.clone(),
                }
            ));
        }
    }
    out
}

/// Backend inference from the job's pod templates (SPEC §2, third choice).
pub fn infer_from_templates(job: &Job, opts: &BackendOptions) -> Option<BackendKind> {
    BACKENDS.into_iter().find(|b| {
        job.replicas
            .iter()
            .any(|r| b.backend().template_prefers(&r.template, opts))
    })
}

fn template_label<'a>(t: &'a PodTemplateSpec, key: &str) -> Option<&'a str> {
    t.metadata.as_ref()?.labels.as_ref()?.get(key).map(String::as_str)
}

fn template_annotation<'a>(t: &'a PodTemplateSpec, key: &str) -> Option<&'a str> {
    t.metadata.as_ref()?.annotations.as_ref()?.get(key).map(String::as_str)
}

fn scheduler_name(t: &PodTemplateSpec) -> Option<&str> {
    t.spec.as_ref()?.scheduler_name.as_deref()
}
