//! Volcano: `scheduling.volcano.sh/v1beta1` PodGroup (SPEC §3.3).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::{Map, Value, json};

use super::{
    BackendKind, BackendOptions, LinkKey, Phase, PodGroupBackend, is_dns_subdomain, scheduler_name,
    template_annotation,
};
use crate::gang::Gang;
use crate::job::{InvalidJob, Job};

/// The pod annotation the Volcano scheduler reads to find a pod's PodGroup.
pub const GROUP_NAME_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// The job annotation naming the Volcano queue (mpi-operator and Trainer convention).
pub const QUEUE_NAME_ANNOTATION: &str = "scheduling.volcano.sh/queue-name";

pub struct Volcano;

impl PodGroupBackend for Volcano {
    fn kind(&self) -> BackendKind {
        BackendKind::Volcano
    }
    fn group(&self) -> &'static str {
        "scheduling.volcano.sh"
    }
    fn version(&self) -> &'static str {
        "v1beta1"
    }

    fn template_link<'a>(&self, template: &'a PodTemplateSpec) -> Option<&'a str> {
        template_annotation(template, GROUP_NAME_ANNOTATION)
    }

    fn link_key(&self) -> LinkKey {
        LinkKey::Annotation(GROUP_NAME_ANNOTATION)
    }

    fn link_scheduler_name<'a>(&self, opts: &'a BackendOptions) -> Option<&'a str> {
        Some(opts.volcano_scheduler_name.as_str())
    }

    fn scheduler_matches(&self, scheduler: Option<&str>, opts: &BackendOptions) -> bool {
        scheduler == Some(opts.volcano_scheduler_name.as_str())
    }

    fn expected_schedulers(&self, opts: &BackendOptions) -> String {
        opts.volcano_scheduler_name.clone()
    }

    fn template_prefers(&self, template: &PodTemplateSpec, opts: &BackendOptions) -> bool {
        self.template_link(template).is_some()
            || scheduler_name(template) == Some(opts.volcano_scheduler_name.as_str())
    }

    fn spec(
        &self,
        job: &Job,
        gang: &Gang,
        existing: Option<&Value>,
        _opts: &BackendOptions,
    ) -> Value {
        let policy = job.scheduling_policy();
        let mut spec = Map::new();
        spec.insert("minMember".into(), json!(gang.min_member));
        // Always present: Volcano's queue admission (enqueue) gates on it.
        spec.insert("minResources".into(), json!(gang.min_resources.to_k8s()));
        // Never change the queue of an existing PodGroup (a webhook or an admin may have set it).
        let existing_queue = existing
            .and_then(|s| s.get("queue"))
            .and_then(Value::as_str)
            .filter(|q| !q.is_empty());
        let queue = existing_queue
            .or(policy
                .and_then(|p| p.queue.as_deref())
                .filter(|q| !q.is_empty()))
            .or(job
                .annotations
                .get(QUEUE_NAME_ANNOTATION)
                .map(String::as_str)
                .filter(|q| !q.is_empty()))
            .unwrap_or("default");
        spec.insert("queue".into(), json!(queue));
        let priority_class = policy
            .and_then(|p| p.priority_class.as_deref())
            .filter(|c| !c.is_empty())
            .or(gang.highest_priority_class());
        if let Some(pc) = priority_class {
            spec.insert("priorityClassName".into(), json!(pc));
        }
        // Only when every template names its task: otherwise Volcano would wait forever.
        if !gang.members.is_empty() && gang.members.iter().all(|m| m.task_spec.is_some()) {
            let mut tasks: BTreeMap<&str, u64> = BTreeMap::new();
            for m in &gang.members {
                *tasks
                    .entry(m.task_spec.as_deref().unwrap_or_default())
                    .or_default() += m.counted;
            }
            tasks.retain(|_, n| *n > 0);
            if !tasks.is_empty() {
                spec.insert("minTaskMember".into(), json!(tasks));
            }
        }
        Value::Object(spec)
    }

    fn annotations(&self, job: &Job) -> BTreeMap<String, String> {
        job.annotations
            .iter()
            .filter(|(k, _)| {
                k.starts_with("volcano.sh/") || k.starts_with("scheduling.volcano.sh/")
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn check(
        &self,
        job: &Job,
        class_exists: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<String>, InvalidJob> {
        let policy = job.scheduling_policy();
        let queues = [
            (
                "schedulingPolicy.queue",
                policy.and_then(|p| p.queue.as_deref()),
            ),
            (
                "annotation scheduling.volcano.sh/queue-name",
                job.annotations
                    .get(QUEUE_NAME_ANNOTATION)
                    .map(String::as_str),
            ),
        ];
        for (field, queue) in queues {
            if let Some(q) = queue.filter(|q| !q.is_empty() && !is_dns_subdomain(q)) {
                return Err(InvalidJob::InvalidSchedulingPolicy(format!(
                    "{field} {q:?} is not a valid Volcano Queue name (lowercase letters, digits, \
                     '-' and '.', at most 253 characters)"
                )));
            }
        }
        let mut warnings = Vec::new();
        if let Some(pc) = policy
            .and_then(|p| p.priority_class.as_deref())
            .filter(|c| !c.is_empty())
        {
            if !is_dns_subdomain(pc) {
                return Err(InvalidJob::InvalidSchedulingPolicy(format!(
                    "schedulingPolicy.priorityClass {:?} is not a valid PriorityClass name \
                     (lowercase letters, digits, '-' and '.', at most 253 characters)",
                    super::shorten(pc, 80)
                )));
            }
            if !class_exists(pc) {
                warnings.push(format!(
                    "schedulingPolicy.priorityClass {pc:?} does not exist; Volcano gives the gang \
                     no priority until it does"
                ));
            }
        }
        Ok(warnings)
    }

    fn phase(&self, status: Option<&Value>) -> Phase {
        match status.and_then(|s| s.get("phase")).and_then(Value::as_str) {
            Some("Pending") | Some("Inqueue") => Phase::Pending,
            Some("Running") => Phase::Running,
            Some("Completed") => Phase::Finished,
            _ => Phase::Unknown,
        }
    }

    fn queue<'a>(&self, spec: &'a Value) -> Option<&'a str> {
        spec.get("queue").and_then(Value::as_str)
    }

    fn unschedulable(&self, status: Option<&Value>) -> Option<(String, String)> {
        let conditions = status?.get("conditions")?.as_array()?;
        conditions.iter().find_map(|c| {
            (c.get("type")?.as_str()? == "Unschedulable" && c.get("status")?.as_str()? == "True")
                .then(|| {
                    (
                        c.get("reason")
                            .and_then(Value::as_str)
                            .unwrap_or("Unschedulable")
                            .to_string(),
                        c.get("message")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                    )
                })
        })
    }
}
