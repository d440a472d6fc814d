//! What each backend makes of a job's topology request (SPEC §13), for `explain`: the fields its
//! PodGroup gets and what it cannot express; for Volcano, whether the cluster's HyperNodes name
//! the tiers the request names.

use std::fmt::Write;

use serde_json::Value;

use super::Surroundings;
use crate::backend::{BACKENDS, BackendKind, BackendOptions};
use crate::gang::Gang;
use crate::job::Job;

/// The `spec` fields that carry a topology, of every backend.
const FIELDS: [&str; 4] = [
    "networkTopology",
    "subGroupPolicy",
    "schedulingConstraints",
    "disruptionMode",
];

/// The topology lines; nothing for a job that asks for no placement.
pub fn describe(
    out: &mut String,
    job: &Job,
    gang: &Gang,
    chosen: BackendKind,
    around: &Surroundings,
    opts: &BackendOptions,
) {
    let t = &gang.topology;
    if t.is_empty() && !t.disruption_all {
        return;
    }
    let _ = writeln!(out, "# topology (SPEC 13): {}", t.describe());
    for kind in BACKENDS {
        let b = kind.backend();
        let spec = b.spec(job, gang, None, opts);
        let fields: Vec<String> = FIELDS
            .iter()
            .filter_map(|f| spec.get(*f).map(|v| format!("{f}: {v}")))
            .collect();
        let mark = if kind == chosen { " (this job's)" } else { "" };
        let gets = if fields.is_empty() {
            "no topology field".to_string()
        } else {
            fields.join("; ")
        };
        let _ = writeln!(out, "#   {kind}{mark}: {gets}");
        if spec.get("schedulingConstraints").is_some() {
            let _ = writeln!(
                out,
                "#     needs: the TopologyAwareWorkloadScheduling feature gate (alpha, off by \
                 default in Kubernetes 1.37) on the API server, which otherwise drops the field, \
                 and on kube-scheduler"
            );
        }
        for gap in b.topology_gaps(job, gang, opts) {
            let _ = writeln!(out, "#     not expressed: {gap}");
        }
    }
    if chosen == BackendKind::Volcano {
        describe_tiers(out, gang, around);
    }
}

/// The tier numbers of the HyperNodes given or read (none when unknown), as the controller
/// keeps them.
pub fn tier_numbers(around: &Surroundings) -> std::sync::Arc<crate::topology::TierNumbers> {
    let hyper_nodes = around.hyper_nodes.iter().flatten();
    std::sync::Arc::new(crate::topology::tier_numbers(hyper_nodes.map(|h| {
        (
            h.pointer("/spec/tierName").and_then(Value::as_str),
            h.pointer("/spec/tier").and_then(Value::as_i64),
        )
    })))
}

/// Volcano resolves `highestTierName` through the HyperNodes' `spec.tierName`: say which node
/// labels name a tier and which do not (when HyperNodes were given or read).
fn describe_tiers(out: &mut String, gang: &Gang, around: &Surroundings) {
    let Some(hyper_nodes) = &around.hyper_nodes else {
        return;
    };
    let t = &gang.topology;
    let mut keys: Vec<&str> = t
        .sets
        .iter()
        .flat_map(|s| {
            let domain = s.domain.as_ref().map(|d| d.key.as_str());
            let slices = s.slices.as_ref().map(|sl| sl.key.as_str());
            domain.into_iter().chain(slices)
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        let tiers: Vec<i64> = hyper_nodes
            .iter()
            .filter(|h| h.pointer("/spec/tierName").and_then(Value::as_str) == Some(key))
            .filter_map(|h| h.pointer("/spec/tier").and_then(Value::as_i64))
            .collect();
        let line = match tiers.iter().min() {
            Some(tier) => format!(
                "tier {tier} is named {key} ({} HyperNodes): each domain is placed within one; \
                 the PodGroup gives the tier's number",
                tiers.len()
            ),
            None => format!(
                "warning: no HyperNode has tierName {key}: Volcano cannot resolve the tier the \
                 PodGroup names (its label discovery names each tier after its node label; give \
                 hand-made HyperNodes spec.tierName {key})"
            ),
        };
        let _ = writeln!(out, "# Volcano tiers: {line}");
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::{BackendKind, BackendOptions};

    const JOB: &str = r#"
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: llm
  namespace: ml
  annotations:
    kueue.x-k8s.io/podset-required-topology: topology.example.com/block
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 16
      template:
        metadata:
          annotations:
            kueue.x-k8s.io/podset-slice-required-topology: topology.example.com/rack
            kueue.x-k8s.io/podset-slice-size: "8"
        spec:
          containers: [{name: pytorch, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
---
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {name: rack-0}
spec:
  tier: 1
  tierName: topology.example.com/rack
  members: [{type: Node, selector: {labelMatch: {matchLabels: {topology.example.com/rack: r0}}}}]
"#;

    #[test]
    fn rule_13_explain_shows_each_backends_fields_what_it_cannot_express_and_the_tiers() {
        let opts = BackendOptions::default();
        let out = crate::explain::explain(JOB, Some(BackendKind::Volcano), &opts).unwrap();
        let line = |start: &str| {
            out.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no line {start:?} in\n{out}"))
                .to_string()
        };
        assert!(
            line("#   volcano (this job's): ").contains(r#""subGroupSize":8,"minSubGroups":2"#)
        );
        assert!(line("#   kubernetes: ").contains(r#"{"key":"topology.example.com/block"}"#));
        assert!(
            out.contains("the native PodGroup cannot express slices"),
            "{out}"
        );
        assert!(line("#   scheduler-plugins: ").ends_with("no topology field"));
        assert!(
            line("# Volcano tiers: tier 1 is named topology.example.com/rack")
                .contains("1 HyperNodes")
        );
        assert!(
            line("# Volcano tiers: warning: no HyperNode has tierName topology.example.com/block")
                .contains("spec.tierName")
        );
        assert!(
            line("#   Worker: annotation").contains(
                "label podgroup-sync.io/pod-set: Worker, \
                 label podgroup-sync.io/slice: <pod index> / 8 (0 to 1)"
            ),
            "{out}"
        );
        // The document is the controller's (with the webhook on): a tier the HyperNodes name by
        // its number, one they do not by its name.
        assert!(out.contains("highestTierAllowed: 1"), "{out}");
        assert!(
            out.contains("highestTierName: topology.example.com/block"),
            "{out}"
        );
    }
}
