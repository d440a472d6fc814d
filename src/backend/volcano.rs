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
use crate::names::valid_label_value;
use crate::topology::{Mode, POD_SET_LABEL, SLICE_LABEL, SetRequest, Topology};

/// The PodGroup annotation recording the tier names its spec asked for (see
/// `accept_rewrites`).
pub const TIER_NAMES_ANNOTATION: &str = "podgroup-sync.io/tier-names";

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
        opts: &BackendOptions,
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
        topology(job, gang, opts, &mut spec);
        Value::Object(spec)
    }

    fn topology_gaps(&self, job: &Job, gang: &Gang, opts: &BackendOptions) -> Vec<String> {
        let t = &gang.topology;
        let mut gaps = Vec::new();
        if t.disruption_all {
            gaps.push(
                "disruption-mode All: a Volcano PodGroup has no disruption mode (Volcano's \
                 gang plugin already evicts no pod of a running gang below minMember)"
                    .to_string(),
            );
        }
        let common = t.common_domain();
        for s in &t.sets {
            let own_domain = s.domain.as_ref().filter(|_| common.is_none());
            if (s.slices.is_some() || own_domain.is_some()) && !valid_label_value(&s.pod_set) {
                gaps.push(format!(
                    "{}: the pod set's name is no label value, so its pods cannot be told apart \
                     for a subGroupPolicy; its topology is not enforced",
                    s.pod_set
                ));
                continue;
            }
            if !opts.pods_labelled && (s.slices.is_some() || own_domain.is_some()) {
                gaps.push(format!(
                    "{}: its slices or a domain of its own need the pod-link webhook \
                     (--webhook), which labels each pod with its set and slice; not enforced",
                    s.pod_set
                ));
                continue;
            }
            if s.slices.is_some() && !job.kind.rules.indexes_pods() {
                gaps.push(format!(
                    "{}: the pods of a {} carry no index to cut slices by; the slices are not \
                     enforced",
                    s.pod_set, job.kind.kind
                ));
            }
            if let (Some(d), Some(_)) = (own_domain, &s.slices) {
                gaps.push(format!(
                    "{}: the {d} is not enforced: the set's subGroupPolicy entry holds its \
                     slices' topology, and the PodGroup's networkTopology is the whole gang's, \
                     which the other sets do not share",
                    s.pod_set
                ));
            }
        }
        gaps
    }

    /// The tier names the spec asks for (by name, or by the number the name has now), which
    /// the scheduler replaces by tier numbers.
    fn spec_annotations(&self, gang: &Gang, spec: &Value) -> BTreeMap<String, String> {
        let names = tier_names(&gang.topology, spec);
        if names.is_empty() {
            return BTreeMap::new();
        }
        [(TIER_NAMES_ANNOTATION.to_string(), names)].into()
    }

    /// Volcano's scheduler resolves `highestTierName` into `highestTierAllowed` in its own copy
    /// of the PodGroup and writes that copy back (a whole-object update) when the gang's status
    /// changes. The stored spec then says the same as the desired one in other words — as long
    /// as the tier names it was resolved from are the ones asked for now, which the annotation
    /// records.
    fn accept_rewrites(&self, desired: &mut Value, actual: &Value) {
        let recorded = |o: &Value| {
            o.pointer("/metadata/annotations")
                .and_then(|a| a.get(TIER_NAMES_ANNOTATION))
                .cloned()
        };
        if recorded(desired).is_none() || recorded(desired) != recorded(actual) {
            return;
        }
        for field in ["networkTopology", "subGroupPolicy"] {
            let (Some(want), Some(have)) = (desired["spec"].get(field), actual["spec"].get(field))
            else {
                continue;
            };
            if resolved(want, have) {
                desired["spec"][field] = have.clone();
            }
        }
    }

    fn held_to(&self, pg: &Value) -> Option<String> {
        let spec = pg.get("spec")?;
        // The names asked for, by field: the scheduler may have replaced them by numbers.
        let recorded: BTreeMap<&str, &str> = pg
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(TIER_NAMES_ANNOTATION))
            .and_then(Value::as_str)
            .into_iter()
            .flat_map(|v| v.split(','))
            .filter_map(|pair| pair.split_once('='))
            .collect();
        let hard = |t: &Value, field: &str| -> Option<String> {
            if t.get("mode").and_then(Value::as_str) != Some("hard") {
                return None;
            }
            let name = t.get("highestTierName").and_then(Value::as_str);
            let number = t.get("highestTierAllowed").and_then(Value::as_u64);
            match (name.or(recorded.get(field).copied()), number) {
                (Some(name), _) => Some(format!("one domain of {name}")),
                (None, Some(n)) => Some(format!("one HyperNode of tier {n}")),
                (None, None) => None,
            }
        };
        let mut held = Vec::new();
        if let Some(domain) = spec
            .get("networkTopology")
            .and_then(|t| hard(t, "networkTopology"))
        {
            held.push(format!("all its pods in {domain}"));
        }
        let policies = spec.get("subGroupPolicy").and_then(Value::as_array);
        for p in policies.into_iter().flatten() {
            let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
            if let (Some(domain), Some(size)) = (
                p.get("networkTopology").and_then(|t| hard(t, name)),
                p.get("subGroupSize").and_then(Value::as_u64),
            ) {
                held.push(format!("each sub-group {name} of {size} pods in {domain}"));
            }
        }
        (!held.is_empty()).then(|| held.join(", "))
    }

    fn dropped_hint(&self, field: &str) -> Option<&'static str> {
        matches!(field, "networkTopology" | "subGroupPolicy").then_some(
            "Volcano's PodGroup CRD has subGroupPolicy and networkTopology.highestTierName from \
             v1.14",
        )
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

/// The topology request of the gang (SPEC §13) in Volcano's terms: the domain every pod set
/// shares as the PodGroup's `networkTopology`; a set's slices, or a domain of its own, as a
/// `subGroupPolicy` entry selecting the set's pods by the labels the pod-link webhook gives them.
/// A tier is named by its node label (`highestTierName`): Volcano's label discovery names each
/// HyperNode tier after the node label it was built from.
fn topology(job: &Job, gang: &Gang, opts: &BackendOptions, spec: &mut Map<String, Value>) {
    let t = &gang.topology;
    if t.is_empty() {
        return;
    }
    let common = t.common_domain();
    if let Some(d) = common {
        spec.insert(
            "networkTopology".into(),
            network_topology(t, d.mode, &d.key),
        );
    }
    if !opts.pods_labelled {
        // An entry whose selector no pod matches would hold the gang for ever.
        return;
    }
    let mut policies = Vec::new();
    for s in t.sets.iter().filter(|s| valid_label_value(&s.pod_set)) {
        let counted = gang
            .members
            .iter()
            .find(|m| m.name == s.pod_set)
            .map_or(0, |m| m.counted);
        match (&s.slices, &s.domain) {
            (Some(slices), _) if job.kind.rules.indexes_pods() => {
                // Every slice the gang counts: the gang still means all of them.
                policies.push(policy(
                    s,
                    slices.size,
                    counted.div_ceil(slices.size),
                    SLICE_LABEL,
                    network_topology(t, Mode::Required, &slices.key),
                ));
            }
            (None, Some(d)) if common.is_none() => {
                // The whole set is one sub-group.
                policies.push(policy(
                    s,
                    s.pods,
                    u64::from(counted > 0),
                    POD_SET_LABEL,
                    network_topology(t, d.mode, &d.key),
                ));
            }
            _ => {}
        }
    }
    if !policies.is_empty() {
        spec.insert("subGroupPolicy".into(), Value::Array(policies));
    }
}

/// The tier by its number when the cluster's HyperNodes name it without doubt, by its name
/// otherwise (see `tiers`: Volcano 1.14 ignores a name in a `subGroupPolicy` entry until its
/// scheduler has written the PodGroup back).
fn network_topology(t: &Topology, mode: Mode, key: &str) -> Value {
    let mode = match mode {
        Mode::Required => "hard",
        Mode::Preferred => "soft",
    };
    match t.tier(key) {
        Some(tier) => json!({"mode": mode, "highestTierAllowed": tier}),
        None => json!({"mode": mode, "highestTierName": key}),
    }
}

/// One `subGroupPolicy` entry: the set's pods (by the webhook's pod-set label), grouped by the
/// values of `group_by`, `size` pods per group, at least `min` groups.
fn policy(s: &SetRequest, size: u64, min: u64, group_by: &str, topology: Value) -> Value {
    json!({
        "name": s.pod_set.to_ascii_lowercase(),
        "subGroupSize": size,
        "minSubGroups": min,
        "labelSelector": {"matchLabels": {POD_SET_LABEL: s.pod_set}},
        "matchLabelKeys": [group_by],
        "networkTopology": topology,
    })
}

/// `networkTopology=<name>` and `<sub-group>=<name>` for every tier the spec asks for: its
/// name, or, where the spec gives the tier's number, the name of the node label the job asked
/// for (the gang's domain, or the set's slices or domain).
fn tier_names(t: &Topology, spec: &Value) -> String {
    let name = |entry: Option<&Value>, key: Option<&str>| -> Option<String> {
        let entry = entry?;
        match entry.get("highestTierName").and_then(Value::as_str) {
            Some(n) => Some(n.to_string()),
            None if entry.get("highestTierAllowed").is_some() => key.map(str::to_string),
            None => None,
        }
    };
    let mut out = Vec::new();
    let common = t.common_domain().map(|d| d.key.as_str());
    if let Some(n) = name(spec.get("networkTopology"), common) {
        out.push(format!("networkTopology={n}"));
    }
    for p in spec
        .get("subGroupPolicy")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let policy = p.get("name").and_then(Value::as_str).unwrap_or_default();
        let key = t
            .sets
            .iter()
            .find(|s| s.pod_set.to_ascii_lowercase() == policy)
            .and_then(|s| match (&s.slices, &s.domain) {
                (Some(sl), _) => Some(sl.key.as_str()),
                (None, Some(d)) => Some(d.key.as_str()),
                (None, None) => None,
            });
        if let Some(n) = name(p.get("networkTopology"), key) {
            out.push(format!("{policy}={n}"));
        }
    }
    out.join(",")
}

/// Whether `have` is `want` with every tier name resolved into a tier number (and nothing else
/// changed).
fn resolved(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) if w.contains_key("highestTierName") => {
            !h.contains_key("highestTierName")
                && h.get("highestTierAllowed").is_some_and(Value::is_u64)
                && w.iter()
                    .filter(|(k, _)| k.as_str() != "highestTierName")
                    .all(|(k, v)| h.get(k) == Some(v))
        }
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| hv == v || resolved(v, hv))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| a == b || resolved(a, b))
        }
        _ => false,
    }
}
