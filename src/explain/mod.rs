//! `podgroup-sync explain`: the PodGroup a job would get and why — offline from manifests
//! (the job, and optionally the PriorityClasses, LimitRanges, RuntimeClasses and Nodes around
//! it), or in the context a cluster gives (`cluster`), compared with the PodGroup the cluster
//! holds (`compare`).

use std::fmt::Write;

use serde_json::Value;

use crate::backend::{self, BackendKind, BackendOptions};
use crate::enablement::{Enablement, Mode};
use crate::gang::{self, MinResources, Priorities};
use crate::health::feasible::{self, Capacity};
use crate::job::{self, JobKind};
use crate::resources::AdmissionDefaults;
use crate::webhook::link::{self, PodView};

pub mod cluster;
pub mod compare;
pub mod kueue;
pub mod status;
pub mod surroundings;
pub mod topology;

pub use surroundings::Surroundings;

/// Why `explain` could not produce a PodGroup.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("cannot parse the job manifest: {0}")]
    Parse(String),
    #[error("{0} is neither a job kind podgroup-sync manages ({known}) nor a PriorityClass, LimitRange, RuntimeClass, Node or Namespace", known = known_kinds())]
    UnknownKind(String),
    #[error("no PodGroup: {0}")]
    Invalid(#[from] job::InvalidJob),
    #[error("{0}")]
    Backend(String),
}

/// The reasoning behind minResources: which pods of which replica types were counted.
fn describe_min_resources(out: &mut String, job: &job::Job, gang: &gang::Gang) {
    match &gang.min_resources {
        MinResources::FromPolicy(_) => {
            let _ = writeln!(
                out,
                "# minResources: schedulingPolicy.minResources, passed through"
            );
        }
        MinResources::Computed(_) => {
            let _ = writeln!(
                out,
                "# minResources: the first {} pods by priority (highest first, ties {}):",
                gang.min_member,
                if job.kind.is_kubeflow() {
                    "Master, Chief, Launcher, PS, Worker, Evaluator"
                } else {
                    "in the object's order"
                }
            );
        }
    }
    for m in &gang.members {
        let request: Vec<String> = m
            .pod_request
            .iter()
            .map(|(k, q)| format!("{k}={q}"))
            .collect();
        let _ = writeln!(
            out,
            "#   {}: {} of {} pods counted, priority {}{}, each requests {{{}}}",
            m.name,
            m.counted,
            m.replicas,
            m.priority,
            m.priority_class_name
                .as_deref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default(),
            request.join(", ")
        );
    }
}

/// What the pod-link webhook adds to the pods of each replica template (SPEC §8).
fn describe_webhook(
    out: &mut String,
    b: &dyn backend::PodGroupBackend,
    job: &job::Job,
    gang: &gang::Gang,
    name: &str,
    opts: &BackendOptions,
) {
    let _ = writeln!(
        out,
        "# pod-link webhook (--webhook, namespace in mode true) adds to the pods of:"
    );
    for r in &job.shape.pod_sets {
        let meta = r.template.metadata.as_ref();
        let view = PodView {
            name: None,
            labels: meta.and_then(|m| m.labels.as_ref()),
            annotations: meta.and_then(|m| m.annotations.as_ref()),
            owner_references: &[],
            scheduler_name: r
                .template
                .spec
                .as_ref()
                .and_then(|s| s.scheduler_name.as_deref()),
            // The job CRDs prune spec.schedulingGroup from templates.
            scheduling_group: false,
        };
        let what = if !r.in_gang && r.name == "Launcher" {
            "nothing (the launcher is outside the gang: launcherCreationPolicy WaitForWorkersReady)"
                .to_string()
        } else if !r.in_gang {
            "nothing (outside the gang: its pods are created only once earlier ones are ready, or it runs none)"
                .to_string()
        } else {
            let mut added: Vec<String> = link::additions(b, &view, name, opts)
                .iter()
                .map(ToString::to_string)
                .collect();
            added.extend(placement(b.kind(), job, gang, &r.name));
            if added.is_empty() {
                "nothing (linked by the template)".to_string()
            } else {
                added.join(", ")
            }
        };
        let _ = writeln!(out, "#   {}: {what}", r.name);
    }
}

/// The placement labels the webhook gives a pod of set `set` (SPEC §13), its slice shown as a
/// formula of the pod's index.
fn placement(backend: BackendKind, job: &job::Job, gang: &gang::Gang, set: &str) -> Vec<String> {
    use crate::topology::{POD_SET_LABEL, SLICE_LABEL};
    let Some(slices) = crate::webhook::placement::wanted(backend, job, gang, set) else {
        return Vec::new();
    };
    let mut out = vec![format!("label {POD_SET_LABEL}: {set}")];
    if let Some(sl) = slices {
        out.push(format!(
            "label {SLICE_LABEL}: <pod index> / {} (0 to {})",
            sl.size,
            sl.count - 1
        ));
    }
    out
}

/// Whether the gang can be placed on the nodes explain was given (SPEC §10), when it was given
/// any.
fn describe_feasibility(
    out: &mut String,
    around: &Surroundings,
    job: &job::Job,
    gang: &gang::Gang,
) {
    if let Some(nodes) = &around.nodes {
        let capacity = Capacity::from_nodes(nodes);
        let problems = feasible::problems(job, gang, &capacity);
        if problems.is_empty() {
            let _ = writeln!(
                out,
                "# feasibility: every pod fits a schedulable node and minResources fit the {} nodes together (selectors and affinity not considered)",
                capacity.nodes.len()
            );
        }
        for p in problems {
            let _ = writeln!(out, "# warning: GangInfeasible: {p}");
        }
    }
}

/// The kinds podgroup-sync manages, e.g. `PyTorchJob kubeflow.org/v1, …`.
fn known_kinds() -> String {
    job::KINDS
        .iter()
        .map(|k| format!("{} {}", k.kind, k.api_version()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `explain` found for one job.
#[derive(Debug, Clone)]
pub struct Explained {
    /// The reasoning (`# ` lines) and the PodGroup as YAML.
    pub text: String,
    /// The PodGroup podgroup-sync would apply.
    pub object: Value,
    pub backend: BackendKind,
    pub job: job::Job,
}

/// Renders the PodGroup YAML for `manifest` (a job in YAML or JSON, optionally with the
/// PriorityClasses, LimitRanges, RuntimeClasses, Nodes and Namespace around it as further
/// documents) and the reasoning as `# ` comment lines above it.
pub fn explain(
    manifest: &str,
    backend: Option<BackendKind>,
    opts: &BackendOptions,
) -> Result<String, ExplainError> {
    let (job, around) = surroundings::read(&[manifest.to_string()])?;
    Ok(explain_job(&job, &around, backend, None, opts)?.text)
}

/// The PodGroup for a job object in its surroundings. `existing`: the spec of the PodGroup the
/// cluster holds, whose immutable fields (and Volcano queue) are kept as the controller does.
pub fn explain_job(
    value: &Value,
    around: &Surroundings,
    backend: Option<BackendKind>,
    existing: Option<&Value>,
    opts: &BackendOptions,
) -> Result<Explained, ExplainError> {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind_name = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind: &'static JobKind = crate::kinds::lookup(api_version, kind_name)
        .ok_or_else(|| ExplainError::UnknownKind(format!("{api_version} {kind_name}")))?;
    let mut job = job::normalize(kind, value)?;
    if job.namespace.is_empty() {
        job.namespace = "default".into();
    }
    if job.uid.is_empty() {
        job.uid = "<job uid>".into();
    }
    let mut priorities = Priorities::from_classes(&around.priority_classes);
    priorities.offline = !around.from_cluster;
    let defaults = AdmissionDefaults::from_limit_ranges_and_runtime_classes(
        &around.limit_ranges_in(&job.namespace),
        &around.runtime_classes,
    )
    .map_err(|e| job::InvalidJob::InvalidResources(format!("namespace admission defaults: {e}")))?;
    let mut gang = gang::compute(&job, &priorities, &defaults)?;
    // The tier numbers the controller writes, from the HyperNodes given or read.
    gang.topology.tiers = topology::tier_numbers(around);
    let enablement = Enablement {
        annotation_key: String::new(),
        default_mode: Mode::Manage,
        default_backend: BackendKind::SchedulerPlugins,
    };
    let ns_annotations = around.namespace_annotations(&job.namespace);
    let (backend_kind, why) = match backend {
        Some(b) => (b, "--backend"),
        None => enablement
            .backend(&job, ns_annotations, opts)
            .map_err(|e| ExplainError::Backend(e.to_string()))?,
    };
    let b = backend_kind.backend();
    // explain shows the pods as the pod-link webhook labels them (SPEC §13).
    let opts = &BackendOptions {
        pods_labelled: true,
        ..opts.clone()
    };
    // Offline, a PriorityClass that was not given may still exist.
    let exists = |c: &str| !around.from_cluster || priorities.contains(c);
    let (name, name_warnings) = backend::name_and_checks(b, &job, &exists)?;
    let names = group_names(&job, &name);
    let first = names.first().cloned().unwrap_or_else(|| name.clone());
    // Beside Kueue: a Volcano gang's minResources capped at the admission, as the controller does.
    let admission = kueue::admission(&job, around);
    let review =
        crate::kueue::quota::review(&gang, backend_kind, admission.as_ref(), false, None, None);
    let placed = review.capped.as_ref().unwrap_or(&gang);
    let object = backend::desired_object(b, &job, placed, &first, existing, false, opts);

    let mut out = String::new();
    let _ = writeln!(out, "# {} {}/{}", kind.kind, job.namespace, job.name);
    let _ = writeln!(out, "# backend: {backend_kind} (from {why})");
    describe_gang(&mut out, backend_kind, &job, &gang, &name, around);
    for w in gang.warnings.iter().chain(name_warnings.iter()) {
        let _ = writeln!(out, "# warning: {w}");
    }
    describe_feasibility(&mut out, around, &job, &gang);
    kueue::describe(
        &mut out,
        value,
        &job,
        &gang,
        backend_kind,
        admission.as_ref(),
    );
    let shown = match job.groups {
        Some(_) => format!("{name}-<group index>"),
        None => name.clone(),
    };
    topology::describe(&mut out, &job, &gang, backend_kind, around, opts);
    describe_webhook(&mut out, b, &job, &gang, &shown, opts);
    for m in backend::missing_links(b, &job, &name, opts, false) {
        let _ = writeln!(
            out,
            "# warning (without the webhook): MissingPodGroupLink: {m}"
        );
    }
    push_documents(&mut out, b, &job, placed, &names, &object, existing, opts)?;
    Ok(Explained {
        text: out,
        object,
        backend: backend_kind,
        job,
    })
}

/// The PodGroups of a job: `name` alone, or of a job of one gang per group, every group's
/// (the first's but for its name).
fn group_names(job: &job::Job, name: &str) -> Vec<String> {
    match job.groups {
        None => vec![name.to_string()],
        Some(n) => (0..n).map(|i| backend::group_name(name, i)).collect(),
    }
}

/// The gang's reasoning lines: the groups, minMember, minResources, the surroundings read and
/// the fields the backend has no place for.
fn describe_gang(
    out: &mut String,
    backend_kind: BackendKind,
    job: &job::Job,
    gang: &gang::Gang,
    name: &str,
    around: &Surroundings,
) {
    let kind = job.kind;
    let b = backend_kind.backend();
    if let Some(n) = job.groups {
        let _ = writeln!(
            out,
            "# groups: {n} — one PodGroup per group, {name}-<group index>, each of the gang below \
             (the groups the {} has now: its replicas, and during a rolling update its surge)",
            kind.kind
        );
    }
    let _ = writeln!(
        out,
        "# minMember: {} — {}",
        gang.min_member,
        gang.rule.describe()
    );
    describe_min_resources(out, job, gang);
    let _ = writeln!(out, "{}", around.describe());
    let absent = b.absent_fields();
    if !absent.is_empty() {
        let _ = writeln!(
            out,
            "# {backend_kind} PodGroups have no field for {}: the gang is held back until \
             minCount pods are placed, nothing more (minResources above is for reference only)",
            absent.join(", ")
        );
    }
}

/// The PodGroup documents, one per group (`---` between them); a grouped job with no groups
/// now has none.
#[allow(clippy::too_many_arguments)]
fn push_documents(
    out: &mut String,
    b: &dyn backend::PodGroupBackend,
    job: &job::Job,
    gang: &gang::Gang,
    names: &[String],
    object: &Value,
    existing: Option<&Value>,
    opts: &BackendOptions,
) -> Result<(), ExplainError> {
    for (i, n) in names.iter().enumerate() {
        let doc = if i == 0 {
            object.clone()
        } else {
            backend::desired_object(b, job, gang, n, existing, false, opts)
        };
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(
            &serde_yaml_ng::to_string(&doc).map_err(|e| ExplainError::Parse(e.to_string()))?,
        );
    }
    if names.is_empty() {
        let _ = writeln!(out, "# no groups now: no PodGroup");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PodGroup document of `explain`'s output (after the `# ` reasoning lines).
    fn pod_group(manifest: &str, backend: Option<BackendKind>) -> Value {
        let out = explain(manifest, backend, &BackendOptions::default()).unwrap();
        serde_yaml_ng::from_str(&out).unwrap()
    }

    #[test]
    fn every_example_gets_its_exact_pod_group() {
        let cases = [
            (
                include_str!("../../examples/pytorchjob.yaml"),
                "scheduling.x-k8s.io/v1alpha1",
                4,
                serde_json::json!({"cpu": "14", "memory": "32Gi", "nvidia.com/gpu": "4"}),
            ),
            (
                include_str!("../../examples/xgboostjob.yaml"),
                "scheduling.x-k8s.io/v1alpha1",
                3,
                serde_json::json!({"cpu": "5", "memory": "10Gi"}),
            ),
            // Elastic: Master + minReplicas 2 of the 4 Workers.
            (
                include_str!("../../examples/paddlejob.yaml"),
                "scheduling.volcano.sh/v1beta1",
                3,
                serde_json::json!({"cpu": "9", "memory": "34Gi", "nvidia.com/gpu": "2"}),
            ),
            (
                include_str!("../../examples/jaxjob.yaml"),
                "scheduling.x-k8s.io/v1alpha1",
                4,
                serde_json::json!({"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"}),
            ),
        ];
        for (manifest, api_version, min_member, min_resources) in cases {
            let pg = pod_group(manifest, None);
            let kind = &pg["metadata"]["ownerReferences"][0]["kind"];
            assert_eq!(pg["apiVersion"], api_version, "{kind}");
            assert_eq!(pg["spec"]["minMember"], min_member, "{kind}");
            assert_eq!(pg["spec"]["minResources"], min_resources, "{kind}");
        }
    }

    #[test]
    fn explain_says_what_the_webhook_adds_to_each_templates_pods() {
        let out = explain(
            include_str!("../../examples/pytorchjob.yaml"),
            None,
            &BackendOptions::default(),
        )
        .unwrap();
        let lines: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.starts_with("# pod-link webhook"))
            .skip(1)
            .take(2)
            .collect();
        assert_eq!(
            lines,
            [
                "#   Master: schedulerName: scheduler-plugins-scheduler",
                "#   Worker: schedulerName: scheduler-plugins-scheduler",
            ],
            "{out}"
        );
        let bare = include_str!("../../examples/pytorchjob.yaml")
            .replace("scheduling.x-k8s.io/pod-group", "example.com/unrelated");
        let out = explain(
            &bare,
            Some(BackendKind::Volcano),
            &BackendOptions::default(),
        )
        .unwrap();
        assert!(
            out.contains("#   Worker: annotation scheduling.k8s.io/group-name: pytorch-demo, schedulerName: volcano"),
            "{out}"
        );
    }

    #[test]
    fn a_paddle_job_without_an_elastic_policy_counts_every_pod() {
        let manifest = include_str!("../../examples/paddlejob.yaml").replace(
            "  elasticPolicy:\n    minReplicas: 2\n    maxReplicas: 4\n",
            "",
        );
        assert!(!manifest.contains("  elasticPolicy:"));
        let pg = pod_group(&manifest, None);
        assert_eq!(pg["spec"]["minMember"], 5);
        assert_eq!(pg["spec"]["minResources"]["nvidia.com/gpu"], "4");
        assert_eq!(pg["spec"]["minResources"]["cpu"], "17");
    }

    #[test]
    fn an_unknown_kind_names_every_kind_podgroup_sync_manages() {
        let err = explain(
            "apiVersion: kubeflow.org/v1\nkind: TrainJob\n",
            None,
            &BackendOptions::default(),
        )
        .unwrap_err()
        .to_string();
        for k in job::KINDS {
            assert!(err.contains(k.kind), "{err}");
        }
    }

    #[test]
    fn rule_9_explain_for_the_native_backend_shows_min_count_and_what_it_lacks() {
        let manifest = include_str!("../../examples/pytorchjob.yaml");
        let out = explain(
            manifest,
            Some(BackendKind::Kubernetes),
            &BackendOptions::default(),
        )
        .unwrap();
        let pg: Value = serde_yaml_ng::from_str(&out).unwrap();
        assert_eq!(pg["apiVersion"], "scheduling.k8s.io/v1beta1");
        assert_eq!(pg["spec"]["schedulingPolicy"]["gang"]["minCount"], 4);
        assert!(pg["spec"].get("minResources").is_none());
        assert!(
            out.contains("have no field for minResources, queue, scheduleTimeoutSeconds"),
            "{out}"
        );
        assert!(
            out.contains("spec.schedulingGroup.podGroupName: "),
            "what the webhook adds: {out}"
        );
        assert!(
            out.contains("Worker: its pods need spec.schedulingGroup.podGroupName: pytorch-demo, which only the pod-link webhook sets"),
            "{out}"
        );
    }

    #[test]
    fn rule_10_offline_context_comes_from_extra_manifests_and_unknown_classes_are_unknown_offline()
    {
        let job = include_str!("../../examples/pytorchjob.yaml").replacen(
            "schedulerName: default-scheduler\n",
            "schedulerName: default-scheduler\n          priorityClassName: urgent\n",
            1,
        );
        let out = explain(&job, None, &BackendOptions::default()).unwrap();
        assert!(
            out.contains("PriorityClass \"urgent\" is unknown offline"),
            "{out}"
        );
        let around = "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: urgent}\nvalue: 500\n---\n\
            apiVersion: v1\nkind: LimitRange\nmetadata: {name: lr}\nspec:\n  limits:\n  - type: Container\n    defaultRequest: {ephemeral-storage: 1Gi}\n---\n\
            apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: '64', memory: 512Gi, nvidia.com/gpu: '8', ephemeral-storage: 100Gi}}\n";
        let (v, s) = surroundings::read(&[job.clone(), around.to_string()]).unwrap();
        let e = explain_job(&v, &s, None, None, &BackendOptions::default()).unwrap();
        assert!(!e.text.contains("unknown offline"), "{}", e.text);
        assert!(e.text.contains("priority 500 (urgent)"), "{}", e.text);
        assert!(
            e.text.contains("# feasibility: every pod fits"),
            "{}",
            e.text
        );
        assert_eq!(
            e.object["spec"]["minResources"]["ephemeral-storage"], "4Gi",
            "the LimitRange default applies"
        );
        let two = surroundings::read(&[job.clone(), job])
            .unwrap_err()
            .to_string();
        assert!(two.contains("2 jobs"), "{two}");
    }
}
