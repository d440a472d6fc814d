//! Kubernetes' own Indexed Job (`batch/v1`, SPEC §11), a gang only on request: most Jobs are
//! not gangs, so a Job is one only with the annotation `podgroup-sync.io/gang: "true"`, and only
//! when Indexed (its pods are the ranks of one computation). Its gang is the pods it runs at
//! once: min(`parallelism`, `completions`). Watched only with `--batch-jobs`: every Job of the
//! cluster is then cached, those without the annotation as their metadata alone.

use std::collections::BTreeMap;

use serde_json::Value;

use super::template::{count, flag, pod_template, text};
use crate::workload::{
    InvalidJob, JobKind, KindRules, MinMemberRule, ObjectIdentity, PodSet, SchedulingPolicy, Shape,
    condition_true,
};
use crate::workload::{index_label, object_at};

pub const BATCH_JOB: JobKind = JobKind {
    kind: "Job",
    group: "batch",
    version: "v1",
    plural: "jobs",
    replica_specs_field: "",
    replica_types: &[],
    default_manager: "kubernetes.io/job-controller",
    pod_label: "batch.kubernetes.io/job-name",
    rules: &BatchJobRules,
};

/// The annotation that makes an Indexed Job a gang.
pub const GANG_ANNOTATION: &str = "podgroup-sync.io/gang";

/// The pod label holding an Indexed Job's pod's completion index.
pub const COMPLETION_INDEX_LABEL: &str = "batch.kubernetes.io/job-completion-index";

/// The name of the one pod set.
const PODS: &str = "pods";

pub struct BatchJobRules;

impl KindRules for BatchJobRules {
    fn read(
        &self,
        _kind: &'static JobKind,
        spec: &Value,
        meta: &ObjectIdentity,
    ) -> Result<Shape, InvalidJob> {
        let mut shape = Shape {
            pod_sets: Vec::new(),
            hints: SchedulingPolicy::default(),
            suspended: flag(spec, "suspend"),
            managed_by: text(spec, "managedBy").map(str::to_string),
            rule: MinMemberRule::SumOfPodSets,
            rule_warnings: Vec::new(),
            gang_requested: self.requested(&meta.annotations),
        };
        if !shape.gang_requested {
            return Ok(shape);
        }
        if text(spec, "completionMode") != Some("Indexed") {
            return Err(InvalidJob::NotAGang(format!(
                "{GANG_ANNOTATION} is set, but only an Indexed Job is a gang (completionMode {})",
                text(spec, "completionMode").unwrap_or("NonIndexed")
            )));
        }
        let parallelism = count(spec, "parallelism", 1, PODS)?;
        let completions = count(spec, "completions", parallelism, PODS)?;
        let template = pod_template(PODS, spec.get("template").cloned())?;
        shape
            .pod_sets
            .push(PodSet::whole(PODS, parallelism.min(completions), template));
        Ok(shape)
    }

    fn finished(&self, status: Option<&Value>) -> bool {
        condition_true(status, &["Complete", "Failed"])
    }

    fn templates_mut<'a>(
        &self,
        _kind: &'static JobKind,
        spec: &'a mut Value,
    ) -> Vec<&'a mut serde_json::Map<String, Value>> {
        object_at(spec, &["template"]).into_iter().collect()
    }

    /// The Job controller labels each pod of an Indexed Job with its completion index.
    fn indexes_pods(&self) -> bool {
        true
    }

    fn pod_index(&self, _set: &PodSet, labels: &BTreeMap<String, String>) -> Option<u64> {
        index_label(labels, COMPLETION_INDEX_LABEL)
    }

    fn requested(&self, annotations: &BTreeMap<String, String>) -> bool {
        annotations.get(GANG_ANNOTATION).map(String::as_str) == Some("true")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::gang::{Priorities, compute};
    use crate::job::normalize;
    use crate::resources::AdmissionDefaults;

    use super::*;

    fn job(annotations: Value, spec: Value) -> Result<crate::workload::Job, InvalidJob> {
        let mut spec = spec;
        spec["template"] = json!({"spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": "1"}}}]}});
        normalize(
            &BATCH_JOB,
            &json!({"metadata": {"name": "j", "annotations": annotations}, "spec": spec}),
        )
    }

    #[test]
    fn rule_11_an_indexed_job_with_the_annotation_is_a_gang_of_the_pods_it_runs_at_once() {
        let on = json!({GANG_ANNOTATION: "true"});
        for (parallelism, completions, pods) in [(4, 4, 4), (4, 2, 2), (2, 8, 2)] {
            let j = job(
                on.clone(),
                json!({"completionMode": "Indexed", "parallelism": parallelism, "completions": completions}),
            )
            .unwrap();
            assert!(j.shape.gang_requested);
            let g = compute(&j, &Priorities::default(), &AdmissionDefaults::default()).unwrap();
            assert_eq!(g.min_member as u64, pods, "{parallelism}/{completions}");
        }
        let suspended = job(
            on.clone(),
            json!({"completionMode": "Indexed", "suspend": true}),
        );
        assert!(suspended.unwrap().suspended());
    }

    #[test]
    fn rule_11_other_jobs_are_no_gang_and_an_annotated_non_indexed_job_is_told_why() {
        let plain = job(
            json!({}),
            json!({"completionMode": "Indexed", "parallelism": 4}),
        )
        .unwrap();
        assert!(!plain.shape.gang_requested);
        assert!(plain.shape.pod_sets.is_empty());
        let wrong = job(json!({GANG_ANNOTATION: "true"}), json!({"parallelism": 4}));
        assert_eq!(wrong.unwrap_err().reason(), "NotAGang");
        assert!(BatchJobRules.finished(Some(
            &json!({"conditions": [{"type": "Complete", "status": "True"}]})
        )));
        assert!(!BatchJobRules.finished(Some(
            &json!({"conditions": [{"type": "Suspended", "status": "True"}]})
        )));
    }
}
