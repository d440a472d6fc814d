//! Kubernetes' own gang scheduling: `scheduling.k8s.io/v1beta1` PodGroup, read by kube-scheduler's
//! GangScheduling plugin (Kubernetes 1.37+, `GenericWorkload` gate; SPEC §9).
//!
//! Settled against the real 1.37 API server (see docs/usage.md): a standalone PodGroup needs no
//! Workload object (`spec.workloadRef` is optional); `schedulingPolicy.gang.minCount` is the one
//! mutable sizing field; `priorityClassName` is immutable and must name an existing
//! PriorityClass (the Priority admission plugin refuses the PodGroup otherwise, and fills in the
//! cluster's `globalDefault` class when none is named). There is no minResources, queue or
//! timeout in this API.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::{Map, Value, json};

use super::{BackendKind, BackendOptions, LinkKey, Phase, PodGroupBackend, is_dns_subdomain};
use crate::gang::Gang;
use crate::job::{InvalidJob, Job};
use crate::topology::Mode;

/// The condition kube-scheduler sets on a PodGroup once it has placed (or failed to place) the
/// whole gang.
pub const INITIALLY_SCHEDULED: &str = "PodGroupInitiallyScheduled";
/// The pod annotation the pod-link webhook adds next to `spec.schedulingGroup.podGroupName`: the
/// same name, visible to metadata-only pod watches (the link itself is a spec field).
pub const LINKED_ANNOTATION: &str = "podgroup-sync.io/pod-group";

pub struct Kubernetes;

impl PodGroupBackend for Kubernetes {
    fn kind(&self) -> BackendKind {
        BackendKind::Kubernetes
    }
    fn group(&self) -> &'static str {
        "scheduling.k8s.io"
    }
    fn version(&self) -> &'static str {
        "v1beta1"
    }

    /// Never from a template: the Kubeflow job CRDs' pod template schema has no
    /// `spec.schedulingGroup`, so the API server prunes it from every job; only the pod-link
    /// webhook links pods.
    fn template_link<'a>(&self, _template: &'a PodTemplateSpec) -> Option<&'a str> {
        None
    }

    fn link_key(&self) -> LinkKey {
        LinkKey::SchedulingGroup
    }

    fn missing_link(&self, name: &str) -> String {
        format!(
            "its pods need spec.schedulingGroup.podGroupName: {name}, which only the pod-link \
             webhook sets (--webhook; the job CRDs drop the field from templates)"
        )
    }

    /// kube-scheduler's default profile runs the GangScheduling plugin once the gate is on.
    fn link_scheduler_name<'a>(&self, _opts: &'a BackendOptions) -> Option<&'a str> {
        None
    }

    fn scheduler_matches(&self, scheduler: Option<&str>, _opts: &BackendOptions) -> bool {
        matches!(scheduler, None | Some("") | Some("default-scheduler"))
    }

    fn expected_schedulers(&self, _opts: &BackendOptions) -> String {
        "default-scheduler".into()
    }

    /// No template field points at the native gang; it is chosen by annotation or flag.
    fn template_prefers(&self, _template: &PodTemplateSpec, _opts: &BackendOptions) -> bool {
        false
    }

    fn spec(
        &self,
        job: &Job,
        gang: &Gang,
        _existing: Option<&Value>,
        _opts: &BackendOptions,
    ) -> Value {
        let mut spec = Map::new();
        spec.insert(
            "schedulingPolicy".into(),
            json!({"gang": {"minCount": gang.min_member}}),
        );
        if let Some(pc) = priority_class(job, gang) {
            spec.insert("priorityClassName".into(), json!(pc));
        }
        // SPEC §13: the one domain the whole gang must share; set at creation only.
        if let Some(d) = gang.topology.common_domain()
            && d.mode == Mode::Required
        {
            spec.insert(
                "schedulingConstraints".into(),
                json!({"topology": [{"key": d.key}]}),
            );
        }
        if gang.topology.disruption_all {
            spec.insert("disruptionMode".into(), json!({"all": {}}));
        }
        Value::Object(spec)
    }

    fn topology_gaps(&self, _job: &Job, gang: &Gang, _opts: &BackendOptions) -> Vec<String> {
        let t = &gang.topology;
        let mut gaps = Vec::new();
        match t.common_domain() {
            Some(d) if d.mode == Mode::Preferred => gaps.push(format!(
                "the {d}: the native PodGroup's topology is required only, so a preference is \
                 not expressed"
            )),
            Some(_) => {}
            None if t.sets.iter().any(|s| s.domain.is_some()) => gaps.push(format!(
                "the pod sets ask for different domains ({}): the native PodGroup has one \
                 topology for the whole gang, so none is expressed",
                t.describe()
            )),
            None => {}
        }
        for (s, slices) in t.sliced() {
            gaps.push(format!(
                "{}: slices of {} in domains of {}: the native PodGroup cannot express slices \
                 (one PodGroup per slice under a CompositePodGroup would, an alpha API)",
                s.pod_set, slices.size, slices.key
            ));
        }
        gaps
    }

    fn not_served(&self) -> String {
        "the API server does not serve scheduling.k8s.io/v1beta1 PodGroups (Kubernetes 1.37+ \
         with the GenericWorkload feature gate on and \
         --runtime-config=scheduling.k8s.io/v1beta1=true)"
            .into()
    }

    fn immutable_fields(&self) -> &'static [&'static str] {
        &[
            "priorityClassName",
            "schedulingConstraints",
            "disruptionMode",
        ]
    }

    /// The API server drops `schedulingConstraints` without a word while the
    /// `TopologyAwareWorkloadScheduling` gate is off (alpha in 1.37, off by default).
    fn immutable_hint(&self, field: &str, have: Option<&Value>) -> Option<&'static str> {
        (field == "schedulingConstraints" && have.is_none()).then_some(
            "or the API server dropped it at creation: it keeps schedulingConstraints only with \
             the TopologyAwareWorkloadScheduling feature gate on, alpha and off by default in \
             Kubernetes 1.37; the topology is not enforced",
        )
    }

    fn held_to(&self, pg: &Value) -> Option<String> {
        let key = pg
            .pointer("/spec/schedulingConstraints/topology/0/key")
            .and_then(Value::as_str)?;
        Some(format!("all its pods in one domain of {key}"))
    }

    fn dropped_hint(&self, field: &str) -> Option<&'static str> {
        (field == "schedulingConstraints").then_some(
            "the API server keeps it only with the TopologyAwareWorkloadScheduling feature gate \
             on, alpha and off by default in Kubernetes 1.37",
        )
    }

    fn absent_fields(&self) -> &'static [&'static str] {
        &["minResources", "queue", "scheduleTimeoutSeconds"]
    }

    fn check(
        &self,
        job: &Job,
        class_exists: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<String>, InvalidJob> {
        let Some(pc) = job
            .scheduling_policy()
            .and_then(|p| p.priority_class.as_deref())
            .filter(|c| !c.is_empty())
        else {
            return Ok(Vec::new());
        };
        if !is_dns_subdomain(pc) {
            return Err(InvalidJob::InvalidSchedulingPolicy(format!(
                "schedulingPolicy.priorityClass {:?} is not a valid PriorityClass name \
                 (lowercase letters, digits, '-' and '.', at most 253 characters)",
                super::shorten(pc, 80)
            )));
        }
        if !class_exists(pc) {
            // The Priority admission plugin refuses a native PodGroup naming a missing class,
            // and the field is immutable: wait for the class rather than create without it.
            return Err(InvalidJob::InvalidSchedulingPolicy(format!(
                "schedulingPolicy.priorityClass {pc:?} does not exist; the API server refuses a \
                 native PodGroup that names it, so the PodGroup is created once it exists"
            )));
        }
        Ok(Vec::new())
    }

    /// No phase field: the `PodGroupInitiallyScheduled` condition says whether the gang was
    /// placed (True), could not be (False), or is still being gathered (absent).
    fn phase(&self, status: Option<&Value>) -> Phase {
        match initially_scheduled(status).map(|c| c.status) {
            Some("True") => Phase::Running,
            _ => Phase::Pending,
        }
    }

    /// The native status counts no pods (and its condition never returns to False): a
    /// broken gang cannot be told from it.
    fn running_pods(&self, _status: Option<&Value>) -> Option<u32> {
        None
    }

    fn unschedulable(&self, status: Option<&Value>) -> Option<(String, String)> {
        let c = initially_scheduled(status)?;
        (c.status == "False").then(|| {
            (
                c.reason.unwrap_or("Unschedulable").to_string(),
                c.message.unwrap_or_default().to_string(),
            )
        })
    }
}

/// The class the PodGroup names: the run policy's, else the gang's highest member's (as for
/// Volcano).
fn priority_class<'a>(job: &'a Job, gang: &'a Gang) -> Option<&'a str> {
    job.scheduling_policy()
        .and_then(|p| p.priority_class.as_deref())
        .filter(|c| !c.is_empty())
        .or(gang.highest_priority_class())
}

struct Condition<'a> {
    status: &'a str,
    reason: Option<&'a str>,
    message: Option<&'a str>,
}

fn initially_scheduled(status: Option<&Value>) -> Option<Condition<'_>> {
    let conditions = status?.get("conditions")?.as_array()?;
    conditions.iter().find_map(|c| {
        (c.get("type")?.as_str()? == INITIALLY_SCHEDULED).then(|| Condition {
            status: c.get("status").and_then(Value::as_str).unwrap_or_default(),
            reason: c.get("reason").and_then(Value::as_str),
            message: c.get("message").and_then(Value::as_str),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_9_phase_and_unschedulable_come_from_the_initially_scheduled_condition() {
        let k = Kubernetes;
        assert_eq!(k.phase(None), Phase::Pending);
        let placed = json!({"conditions": [{"type": INITIALLY_SCHEDULED, "status": "True", "reason": "Scheduled"}]});
        assert_eq!(k.phase(Some(&placed)), Phase::Running);
        assert_eq!(k.unschedulable(Some(&placed)), None);
        let stuck = json!({"conditions": [
            {"type": "DisruptionTarget", "status": "False"},
            {"type": INITIALLY_SCHEDULED, "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient cpu"}]});
        assert_eq!(k.phase(Some(&stuck)), Phase::Pending);
        assert_eq!(
            k.unschedulable(Some(&stuck)),
            Some((
                "Unschedulable".into(),
                "0/3 nodes are available: 3 Insufficient cpu".into()
            ))
        );
    }
}
