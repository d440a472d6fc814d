//! What `explain` knows of the cluster around a job: PriorityClasses, LimitRanges,
//! RuntimeClasses, Nodes, the job's Namespace and Kueue Workloads — read from the cluster (`--kubeconfig`) or
//! given as extra manifests (`-f` repeated, or several documents in one file).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LimitRange, Namespace, Node};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::ExplainError;

/// The objects around a job that change its PodGroup.
#[derive(Debug, Clone, Default)]
pub struct Surroundings {
    pub priority_classes: Vec<PriorityClass>,
    /// LimitRanges of any namespace; only the job's are applied.
    pub limit_ranges: Vec<LimitRange>,
    pub runtime_classes: Vec<RuntimeClass>,
    /// `None`: nodes unknown (no feasibility verdict).
    pub nodes: Option<Vec<Node>>,
    pub namespaces: Vec<Namespace>,
    /// Kueue Workloads (`kueue.x-k8s.io/v1beta2`, SPEC §12) of the job's namespace.
    pub workloads: Vec<Value>,
    /// Volcano HyperNodes (`topology.volcano.sh/v1alpha1`, SPEC §13); `None`: not known.
    pub hyper_nodes: Option<Vec<Value>>,
    /// Read from a cluster: what is absent does not exist. Otherwise only what the manifests
    /// give is known.
    pub from_cluster: bool,
}

impl Surroundings {
    /// The annotations of a namespace, when it is known.
    pub fn namespace_annotations(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .and_then(|n| n.metadata.annotations.as_ref())
    }

    /// The LimitRanges that apply in a namespace (offline, one without a namespace applies to
    /// the job's).
    pub fn limit_ranges_in(&self, namespace: &str) -> Vec<LimitRange> {
        self.limit_ranges
            .iter()
            .filter(|l| {
                l.metadata
                    .namespace
                    .as_deref()
                    .is_none_or(|n| n == namespace)
            })
            .cloned()
            .collect()
    }

    /// Adds the PriorityClasses, LimitRanges and RuntimeClasses given as manifests to those read
    /// from a cluster (the given ones first, so they win where the first of a name is taken).
    pub fn add_given(&mut self, mut given: Surroundings) {
        fn before<T>(given: &mut Vec<T>, read: &mut Vec<T>) {
            given.append(read);
            std::mem::swap(given, read);
        }
        before(&mut given.priority_classes, &mut self.priority_classes);
        before(&mut given.limit_ranges, &mut self.limit_ranges);
        before(&mut given.runtime_classes, &mut self.runtime_classes);
    }

    /// One line saying where the context came from and what it holds.
    pub fn describe(&self) -> String {
        let nodes = match &self.nodes {
            Some(n) => format!(", {} Nodes", n.len()),
            None => String::new(),
        };
        let counts = format!(
            "{} PriorityClasses, {} LimitRanges, {} RuntimeClasses{nodes}",
            self.priority_classes.len(),
            self.limit_ranges.len(),
            self.runtime_classes.len()
        );
        if self.from_cluster {
            format!("# context from the cluster: {counts}")
        } else {
            format!(
                "# context offline, from the manifests: {counts} (a cluster may add requests and priorities; --kubeconfig reads its own)"
            )
        }
    }
}

/// The job and its surroundings from manifests (YAML or JSON, several documents each).
pub fn read(texts: &[String]) -> Result<(Value, Surroundings), ExplainError> {
    let mut jobs = Vec::new();
    let mut s = Surroundings::default();
    for text in texts {
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let v: Value = serde::Deserialize::deserialize(doc)
                .map_err(|e: serde_yaml_ng::Error| ExplainError::Parse(e.to_string()))?;
            if v.is_null() {
                continue;
            }
            add(v, &mut jobs, &mut s)?;
        }
    }
    match jobs.len() {
        1 => Ok((jobs.remove(0), s)),
        0 => Err(ExplainError::Parse(
            "the manifests hold no job (give a job with -f)".into(),
        )),
        n => Err(ExplainError::Parse(format!(
            "the manifests hold {n} jobs; explain takes one"
        ))),
    }
}

fn typed<K: DeserializeOwned>(v: Value) -> Result<K, ExplainError> {
    serde_json::from_value(v).map_err(|e| ExplainError::Parse(e.to_string()))
}

/// Sorts one document into the job or its surroundings; a `List` is unpacked.
fn add(v: Value, jobs: &mut Vec<Value>, s: &mut Surroundings) -> Result<(), ExplainError> {
    let api_version = v
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    match (api_version, kind) {
        (_, "List") => {
            for item in v
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                add(item, jobs, s)?;
            }
        }
        ("scheduling.k8s.io/v1", "PriorityClass") => s.priority_classes.push(typed(v)?),
        ("v1", "LimitRange") => s.limit_ranges.push(typed(v)?),
        ("node.k8s.io/v1", "RuntimeClass") => s.runtime_classes.push(typed(v)?),
        ("v1", "Node") => s.nodes.get_or_insert_with(Vec::new).push(typed(v)?),
        ("v1", "Namespace") => s.namespaces.push(typed(v)?),
        ("kueue.x-k8s.io/v1beta2", "Workload") => s.workloads.push(v),
        ("topology.volcano.sh/v1alpha1", "HyperNode") => {
            s.hyper_nodes.get_or_insert_with(Vec::new).push(v)
        }
        _ if crate::kinds::lookup(api_version, kind).is_some() => jobs.push(v),
        _ => {
            return Err(ExplainError::UnknownKind(format!("{api_version} {kind}")));
        }
    }
    Ok(())
}
