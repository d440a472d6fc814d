//! scheduler-plugins coscheduling: `scheduling.x-k8s.io/v1alpha1` PodGroup (SPEC §3.3).

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::{Map, Value, json};

use super::{BackendKind, BackendOptions, LinkKey, Phase, PodGroupBackend, template_label};
use crate::gang::Gang;
use crate::job::InvalidJob;
use crate::job::Job;

/// The pod label coscheduling reads to find a pod's PodGroup.
pub const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

pub struct SchedulerPlugins;

impl PodGroupBackend for SchedulerPlugins {
    fn kind(&self) -> BackendKind {
        BackendKind::SchedulerPlugins
    }
    fn group(&self) -> &'static str {
        "scheduling.x-k8s.io"
    }
    fn version(&self) -> &'static str {
        "v1alpha1"
    }

    fn template_link<'a>(&self, template: &'a PodTemplateSpec) -> Option<&'a str> {
        template_label(template, POD_GROUP_LABEL)
    }

    fn link_key(&self) -> LinkKey {
        LinkKey::Label(POD_GROUP_LABEL)
    }

    fn link_scheduler_name<'a>(&self, opts: &'a BackendOptions) -> Option<&'a str> {
        opts.link_coscheduling_scheduler_name
            .as_deref()
            .filter(|s| !s.is_empty())
    }

    fn scheduler_matches(&self, scheduler: Option<&str>, opts: &BackendOptions) -> bool {
        let s = scheduler
            .filter(|s| !s.is_empty())
            .unwrap_or("default-scheduler");
        opts.coscheduling_scheduler_names.iter().any(|n| n == s)
    }

    fn expected_schedulers(&self, opts: &BackendOptions) -> String {
        opts.coscheduling_scheduler_names.join(" or ")
    }

    fn template_prefers(&self, template: &PodTemplateSpec, _opts: &BackendOptions) -> bool {
        self.template_link(template).is_some()
    }

    fn spec(
        &self,
        job: &Job,
        gang: &Gang,
        _existing: Option<&Value>,
        opts: &BackendOptions,
    ) -> Value {
        let mut spec = Map::new();
        spec.insert("minMember".into(), json!(gang.min_member));
        let min_resources = gang.min_resources.to_k8s();
        if !min_resources.is_empty() {
            spec.insert("minResources".into(), json!(min_resources));
        }
        let timeout = job
            .scheduling_policy()
            .and_then(|p| p.schedule_timeout_seconds)
            // A negative timeout is ignored (with a warning from `check`).
            .filter(|t| *t >= 0)
            .or(opts.default_schedule_timeout_seconds);
        if let Some(t) = timeout {
            spec.insert("scheduleTimeoutSeconds".into(), json!(t));
        }
        Value::Object(spec)
    }

    fn max_name_len(&self) -> usize {
        // The pod link is a label value.
        63
    }

    fn check(
        &self,
        job: &Job,
        _class_exists: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<String>, InvalidJob> {
        let mut warnings = Vec::new();
        if let Some(t) = job
            .scheduling_policy()
            .and_then(|p| p.schedule_timeout_seconds)
            .filter(|t| *t < 0)
        {
            warnings.push(format!(
                "schedulingPolicy.scheduleTimeoutSeconds {t} is negative and is ignored"
            ));
        }
        Ok(warnings)
    }

    fn phase(&self, status: Option<&Value>) -> Phase {
        match status.and_then(|s| s.get("phase")).and_then(Value::as_str) {
            Some("Pending") => Phase::Pending,
            Some("Scheduling") | Some("PreScheduling") => Phase::Scheduling,
            Some("Running") | Some("Scheduled") => Phase::Running,
            Some("Finished") => Phase::Finished,
            Some("Failed") => Phase::Failed,
            _ => Phase::Unknown,
        }
    }
}
