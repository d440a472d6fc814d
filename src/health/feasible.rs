//! Infeasible gangs (SPEC §10): a gang whose pod fits no schedulable node, whose minResources
//! exceed what all schedulable nodes together offer, or whose Volcano queue cannot take it.
//!
//! Nodes are seen through a stripped cache (allocatable, taints, unschedulable: nothing else),
//! so node selectors and affinity are not considered: a gang found infeasible can never be
//! placed even on an empty cluster; one found feasible may still wait for capacity.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

use crate::gang::{Gang, MinResources};
use crate::job::Job;
use crate::quantity::Quantity;
use crate::resources::ResourceMap;

/// The taint kube-scheduler reads `spec.unschedulable` as.
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Taints the node lifecycle puts on a node for a passing condition (a new node is not ready
/// yet, a node under pressure): they say nothing about whether a gang can ever fit there.
const CONDITION_TAINTS: [&str; 6] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable",
];

/// One node as the feasibility check sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeCapacity {
    pub name: String,
    pub allocatable: ResourceMap,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
}

/// Every node of the cluster, as the feasibility check sees them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Capacity {
    pub nodes: Vec<NodeCapacity>,
}

impl NodeCapacity {
    /// A node's capacity; allocatable quantities that do not parse count as zero.
    pub fn from_node(node: &Node) -> Self {
        let spec = node.spec.as_ref();
        NodeCapacity {
            name: node.metadata.name.clone().unwrap_or_default(),
            allocatable: node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|(k, q)| Some((k.clone(), Quantity::parse_k8s(q).ok()?)))
                .collect(),
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        }
    }

    /// Whether a pod with these tolerations may be placed here at all (taints with effect
    /// NoSchedule or NoExecute, and cordoning).
    fn accepts(&self, tolerations: &[Toleration]) -> bool {
        let cordon = Taint {
            key: UNSCHEDULABLE_TAINT.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        (!self.unschedulable || tolerated(&cordon, tolerations))
            && self
                .taints
                .iter()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .filter(|t| !CONDITION_TAINTS.contains(&t.key.as_str()))
                .all(|t| tolerated(t, tolerations))
    }

    /// Whether one pod of this request fits the node's allocatable.
    fn fits(&self, request: &ResourceMap) -> bool {
        request
            .iter()
            .all(|(r, q)| q.is_zero() || self.allocatable.get(r).is_some_and(|a| a >= q))
    }
}

impl Capacity {
    pub fn from_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Self {
        let mut nodes: Vec<NodeCapacity> = nodes.into_iter().map(NodeCapacity::from_node).collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Capacity { nodes }
    }
}

/// Whether one of the tolerations tolerates the taint (the API's matching rules).
fn tolerated(taint: &Taint, tolerations: &[Toleration]) -> bool {
    tolerations.iter().any(|t| {
        let effect = t.effect.as_deref().unwrap_or_default();
        if !effect.is_empty() && effect != taint.effect {
            return false;
        }
        let key = t.key.as_deref().unwrap_or_default();
        match t.operator.as_deref() {
            Some("Exists") => key.is_empty() || key == taint.key,
            _ => {
                key == taint.key
                    && t.value.as_deref().unwrap_or_default()
                        == taint.value.as_deref().unwrap_or_default()
            }
        }
    })
}

fn show(m: &ResourceMap) -> String {
    let parts: Vec<String> = m
        .iter()
        .filter(|(_, q)| !q.is_zero())
        .map(|(k, q)| format!("{k}={q}"))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// What makes the gang infeasible on these nodes, with the figures; empty when it is not.
pub fn problems(job: &Job, gang: &Gang, capacity: &Capacity) -> Vec<String> {
    let mut problems = Vec::new();
    // Nodes that take at least one pod of the gang, by their taints.
    let mut usable = vec![false; capacity.nodes.len()];
    for m in gang.members.iter().filter(|m| m.counted > 0) {
        let tolerations = job
            .pod_set(&m.name)
            .and_then(|r| r.template.spec.as_ref())
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        let mut accepting = 0;
        let mut most = ResourceMap::new();
        let mut fits = false;
        for (i, node) in capacity.nodes.iter().enumerate() {
            if !node.accepts(&tolerations) {
                continue;
            }
            usable[i] = true;
            accepting += 1;
            fits |= node.fits(&m.pod_request);
            for (r, _) in m.pod_request.iter() {
                let a = node
                    .allocatable
                    .get(r)
                    .cloned()
                    .unwrap_or_else(Quantity::zero);
                let e = most.entry(r.clone()).or_insert_with(Quantity::zero);
                *e = (*e).max(a);
            }
        }
        if !fits {
            problems.push(format!(
                "a {} pod requests {} and fits no schedulable node: {} of {} nodes accept its tolerations{}",
                m.name,
                show(&m.pod_request),
                accepting,
                capacity.nodes.len(),
                if accepting > 0 {
                    format!(", the most any of them offers is {}", show_all(&most))
                } else {
                    String::new()
                }
            ));
        }
    }
    let total = usable
        .iter()
        .zip(&capacity.nodes)
        .filter(|(u, _)| **u)
        .fold(ResourceMap::new(), |mut acc, (_, n)| {
            for (r, q) in &n.allocatable {
                let e = acc.entry(r.clone()).or_insert_with(Quantity::zero);
                *e = (*e).checked_add(*q).unwrap_or(*e);
            }
            acc
        });
    let schedulable = usable.iter().filter(|u| **u).count();
    for (r, need) in min_resources(gang) {
        let have = total.get(&r).cloned().unwrap_or_else(Quantity::zero);
        if need > have {
            problems.push(format!(
                "minResources {r}={need} exceeds the {have} allocatable on all {schedulable} schedulable nodes together"
            ));
        }
    }
    problems
}

/// Like [`show`], zeros included (a node offering none of a resource says so).
fn show_all(m: &ResourceMap) -> String {
    let parts: Vec<String> = m.iter().map(|(k, q)| format!("{k}={q}")).collect();
    format!("{{{}}}", parts.join(", "))
}

fn min_resources(gang: &Gang) -> ResourceMap {
    match &gang.min_resources {
        MinResources::Computed(m) => m
            .iter()
            .filter(|(_, q)| !q.is_zero())
            .map(|(k, q)| (k.clone(), *q))
            .collect(),
        MinResources::FromPolicy(m) => m
            .iter()
            .filter_map(|(k, q)| Some((k.clone(), Quantity::parse_k8s(q).ok()?)))
            .filter(|(_, q)| !q.is_zero())
            .collect(),
    }
}

/// Why a Volcano queue cannot take the gang, if it cannot: `queues` maps every queue to its
/// `status.state` (empty while the queue controller has not set one).
pub fn queue_problem(queue: &str, queues: &BTreeMap<String, String>) -> Option<String> {
    match queues.get(queue).map(String::as_str) {
        None => Some(format!(
            "Volcano queue {queue:?} does not exist: the PodGroup stays Pending until it is created"
        )),
        Some("Open") | Some("") => None,
        Some(state) => Some(format!(
            "Volcano queue {queue:?} is {state}: it admits no new PodGroups until it is Open again"
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::gang;
    use crate::job::{self, KINDS};
    use crate::resources::AdmissionDefaults;

    fn node(name: &str, cpu: &str, gpu: &str, taints: serde_json::Value, cordoned: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"taints": taints, "unschedulable": cordoned},
            "status": {"allocatable": {"cpu": cpu, "nvidia.com/gpu": gpu, "pods": "110"}},
        }))
        .unwrap()
    }

    fn gang_of(workers: u64, gpus: u64, tolerations: serde_json::Value) -> (Job, Gang) {
        let kind = KINDS.iter().find(|k| k.kind == "PyTorchJob").unwrap();
        let t = json!({"spec": {"tolerations": tolerations, "containers": [{"name": "c", "resources": {
            "requests": {"cpu": "4"}, "limits": {"nvidia.com/gpu": gpus.to_string()}}}]}});
        let v = json!({"metadata": {"name": "j", "namespace": "ns", "uid": "u"},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers, "template": t}}}});
        let job = job::normalize(kind, &v).unwrap();
        let g = gang::compute(&job, &Default::default(), &AdmissionDefaults::default()).unwrap();
        (job, g)
    }

    #[test]
    fn rule_10_a_pod_that_fits_no_node_is_reported_with_the_figures() {
        let (job, gang) = gang_of(2, 8, json!([]));
        let cap = Capacity::from_nodes(&[
            node("a", "16", "4", json!([]), false),
            node("b", "16", "4", json!([]), false),
        ]);
        let p = problems(&job, &gang, &cap);
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(
            p[0],
            "a Worker pod requests {cpu=4, nvidia.com/gpu=8} and fits no schedulable node: 2 of 2 nodes accept its tolerations, the most any of them offers is {cpu=16, nvidia.com/gpu=4}"
        );
        assert_eq!(
            p[1],
            "minResources nvidia.com/gpu=16 exceeds the 8 allocatable on all 2 schedulable nodes together"
        );
        let big = Capacity::from_nodes(&[
            node("a", "16", "8", json!([]), false),
            node("c", "16", "8", json!([]), false),
        ]);
        assert!(problems(&job, &gang, &big).is_empty());
    }

    #[test]
    fn rule_10_tainted_and_cordoned_nodes_count_only_for_pods_that_tolerate_them() {
        let gpu_taint =
            json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]);
        let nodes = [
            node("g", "16", "8", gpu_taint.clone(), false),
            node("h", "16", "8", json!([]), true),
            node(
                "p",
                "16",
                "8",
                json!([{"key": "x", "effect": "PreferNoSchedule"}]),
                false,
            ),
            // A condition taint (a node not ready yet) is passing: the node counts.
            node(
                "r",
                "16",
                "8",
                json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]),
                false,
            ),
        ];
        let cap = Capacity::from_nodes(&nodes);
        let (job, gang) = gang_of(3, 8, json!([]));
        let p = problems(&job, &gang, &cap);
        assert_eq!(
            p,
            [
                "minResources nvidia.com/gpu=24 exceeds the 16 allocatable on all 2 schedulable nodes together"
            ]
        );
        let (job, gang) = gang_of(
            3,
            8,
            json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]),
        );
        assert!(problems(&job, &gang, &cap).is_empty());
        let (job, gang) = gang_of(
            3,
            8,
            json!([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}]),
        );
        assert_eq!(problems(&job, &gang, &cap).len(), 1);
        let (job, gang) = gang_of(4, 8, json!([{"operator": "Exists"}]));
        assert!(
            problems(&job, &gang, &cap).is_empty(),
            "tolerates everything, cordon included"
        );
    }

    #[test]
    fn rule_10_no_nodes_at_all_is_infeasible_and_says_so() {
        let (job, gang) = gang_of(1, 1, json!([]));
        let p = problems(&job, &gang, &Capacity::default());
        assert!(
            p[0].ends_with("fits no schedulable node: 0 of 0 nodes accept its tolerations"),
            "{p:?}"
        );
    }

    #[test]
    fn rule_10_a_missing_or_closed_queue_is_reported() {
        let queues: BTreeMap<String, String> = [
            ("default".into(), "Open".into()),
            ("q".into(), "Closed".into()),
            ("new".into(), String::new()),
        ]
        .into();
        assert_eq!(queue_problem("default", &queues), None);
        assert_eq!(queue_problem("new", &queues), None);
        assert!(queue_problem("q", &queues).unwrap().contains("is Closed"));
        assert!(
            queue_problem("gone", &queues)
                .unwrap()
                .contains("does not exist")
        );
    }
}
