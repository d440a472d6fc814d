//! `explain --kubeconfig` and `explain --job`: what the cluster holds around a job, read once
//! (lists and GETs; `explain` is a one-off command, not the controller).

use k8s_openapi::api::core::v1::{LimitRange, Namespace, Node};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use serde_json::Value;

use super::Surroundings;
use crate::backend::BackendKind;
use crate::job::KINDS;

/// Why the cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("no job {0} of any kind podgroup-sync manages")]
    NoJob(String),
    #[error("{0} names several jobs ({1}); rename or delete all but one")]
    Ambiguous(String, String),
}

fn read(what: &str) -> impl FnOnce(kube::Error) -> ClusterError + '_ {
    move |source| ClusterError::Read {
        what: what.to_string(),
        source,
    }
}

/// The PriorityClasses, the namespace's LimitRanges, the RuntimeClasses, the Namespace and —
/// when they may be listed — the Nodes of the cluster.
pub async fn surroundings(client: &Client, namespace: &str) -> Result<Surroundings, ClusterError> {
    let lp = ListParams::default();
    let priority_classes = Api::<PriorityClass>::all(client.clone())
        .list(&lp)
        .await
        .map_err(read("priorityclasses"))?
        .items;
    let limit_ranges = Api::<LimitRange>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(read("limitranges"))?
        .items;
    let runtime_classes = Api::<RuntimeClass>::all(client.clone())
        .list(&lp)
        .await
        .map_err(read("runtimeclasses"))?
        .items;
    let namespaces = Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await
        .map_err(read("the namespace"))?
        .into_iter()
        .collect();
    // Nodes only for the feasibility verdict: without the right to list them, none is given.
    let nodes = Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .ok()
        .map(|l| l.items);
    // Kueue's Workloads, when Kueue is installed (and they may be listed).
    let workloads = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &crate::kueue::workload_resource(),
    )
    .list(&lp)
    .await
    .map(|l| {
        l.items
            .into_iter()
            .filter_map(|w| serde_json::to_value(w).ok())
            .collect()
    })
    .unwrap_or_default();
    // Volcano's HyperNodes, when Volcano is installed (and they may be listed).
    let hyper_nodes = Api::<kube::api::DynamicObject>::all_with(
        client.clone(),
        &kube::api::ApiResource {
            group: "topology.volcano.sh".into(),
            version: "v1alpha1".into(),
            api_version: "topology.volcano.sh/v1alpha1".into(),
            kind: "HyperNode".into(),
            plural: "hypernodes".into(),
        },
    )
    .list(&lp)
    .await
    .ok()
    .map(|l| {
        l.items
            .into_iter()
            .filter_map(|h| serde_json::to_value(h).ok())
            .collect()
    });
    Ok(Surroundings {
        workloads,
        hyper_nodes,
        priority_classes,
        limit_ranges,
        runtime_classes,
        nodes,
        namespaces,
        from_cluster: true,
    })
}

/// The job `namespace/name` of whichever managed kind has one.
pub async fn find_job(client: &Client, namespace: &str, name: &str) -> Result<Value, ClusterError> {
    let mut found = Vec::new();
    for kind in KINDS {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &kind.api_resource());
        // A kind whose CRD is not served answers 404, like a missing job.
        if let Ok(Some(job)) = api.get_opt(name).await {
            let mut v = serde_json::to_value(&job).unwrap_or(Value::Null);
            v["apiVersion"] = Value::from(kind.api_version());
            v["kind"] = Value::from(kind.kind);
            found.push((kind, v));
        }
    }
    let what = format!("{namespace}/{name}");
    match found.len() {
        0 => Err(ClusterError::NoJob(what)),
        1 => Ok(found.remove(0).1),
        _ => Err(ClusterError::Ambiguous(
            what,
            found
                .iter()
                .map(|(k, _)| k.kind)
                .collect::<Vec<_>>()
                .join(", "),
        )),
    }
}

/// The cluster's PodGroup of that backend, namespace and name.
pub async fn pod_group(
    client: &Client,
    backend: BackendKind,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, ClusterError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &backend.backend().api_resource());
    let pg = api.get_opt(name).await.map_err(read("the PodGroup"))?;
    Ok(pg.map(|pg| serde_json::to_value(&pg).unwrap_or(Value::Null)))
}
