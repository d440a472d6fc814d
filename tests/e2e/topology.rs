//! Racks for the topology scenarios (SPEC §13): kwok nodes labelled with their rack, the Volcano
//! HyperNodes of the same tiers (named after the node labels, as Volcano's label discovery
//! names them), and where a job's pods landed, rack by rack.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams};
use serde_json::{Value, json};

use crate::harness::{Link, SLOW, Scope, names_of, replicas, training_job};
use crate::support::jobs::{self, Kind};

/// The node label of a rack, and of the zone that holds every rack of a scenario.
pub const RACK: &str = "topology.e2e.podgroup-sync.io/rack";
pub const ZONE: &str = "topology.e2e.podgroup-sync.io/zone";
/// The operators' pod label holding a replica's index.
const REPLICA_INDEX: &str = "training.kubeflow.org/replica-index";

/// A scenario's racks: which rack each node is in.
pub struct Racks {
    pub rack_of: BTreeMap<String, String>,
    pub names: Vec<String>,
}

/// `racks` racks of `per_rack` kwok nodes with `gpus` GPUs each, in this scope's pool.
pub async fn racks(s: &mut Scope, racks: u32, per_rack: u32, gpus: u32) -> Racks {
    let pool = s.pool().to_string();
    let zone = format!("{}-zone", s.id);
    let mut out = Racks {
        rack_of: BTreeMap::new(),
        names: Vec::new(),
    };
    for r in 0..racks {
        let rack = format!("{}-r{r}", s.id);
        for _ in 0..per_rack {
            let labels = json!({RACK: rack, ZONE: zone});
            let node = s.add_labelled_node(&pool, gpus, labels).await;
            out.rack_of.insert(node, rack.clone());
        }
        out.names.push(rack);
    }
    out
}

pub fn hyper_node_ar() -> ApiResource {
    jobs::ar("topology.volcano.sh", "v1alpha1", "HyperNode", "hypernodes")
}

/// The HyperNodes of the racks (tier 1, `tierName` the rack label) and of their zone (tier 2,
/// `tierName` the zone label): what Volcano's label discovery makes of these node labels.
/// Returns their names, for [`delete_hyper_nodes`].
pub async fn hyper_nodes(s: &Scope, racks: &Racks) -> Vec<String> {
    let api: Api<DynamicObject> = Api::all_with(s.client.clone(), &hyper_node_ar());
    let mut manifests: Vec<Value> = racks
        .names
        .iter()
        .map(|rack| {
            json!({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
                "metadata": {"name": rack},
                "spec": {"tier": 1, "tierName": RACK, "members": [
                    {"type": "Node", "selector": {"labelMatch": {"matchLabels": {RACK: rack}}}}]}})
        })
        .collect();
    let members: Vec<Value> = racks
        .names
        .iter()
        .map(|r| json!({"type": "HyperNode", "selector": {"exactMatch": {"name": r}}}))
        .collect();
    manifests.push(
        json!({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
        "metadata": {"name": format!("{}-zone", s.id)},
        "spec": {"tier": 2, "tierName": ZONE, "members": members}}),
    );
    let mut names = Vec::new();
    for m in manifests {
        let obj: DynamicObject = serde_json::from_value(m).expect("HyperNode manifest");
        let name = obj.metadata.name.clone().unwrap_or_default();
        api.create(&Default::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create HyperNode {name}: {e}"));
        names.push(name);
    }
    names
}

pub async fn delete_hyper_nodes(s: &Scope, names: &[String]) {
    let api: Api<DynamicObject> = Api::all_with(s.client.clone(), &hyper_node_ar());
    for n in names {
        let _ = api.delete(n, &DeleteParams::background()).await;
    }
}

/// A PyTorchJob of `workers` one-GPU workers in `pool`, with these annotations on the job and on
/// the Worker template.
pub fn pytorch(
    link: Link,
    name: &str,
    pool: &str,
    workers: u32,
    on_job: Value,
    on_worker: Value,
) -> Value {
    let mut job = training_job(
        Kind::PyTorchJob,
        link,
        name,
        pool,
        &[replicas("Worker", workers, 1)],
        json!({}),
    );
    let annotations = &mut job["metadata"]["annotations"];
    if annotations.is_null() {
        *annotations = json!({});
    }
    for (k, v) in on_job.as_object().into_iter().flatten() {
        annotations[k] = v.clone();
    }
    let worker = &mut job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"];
    for (k, v) in on_worker.as_object().into_iter().flatten() {
        worker["annotations"][k] = v.clone();
    }
    job
}

/// The racks the pods of each slice (replica index / `size`) landed on.
pub fn racks_per_slice(pods: &[Pod], racks: &Racks, size: u64) -> BTreeMap<u64, BTreeSet<String>> {
    let mut out: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for p in pods {
        let index: u64 = label(p, REPLICA_INDEX)
            .and_then(|i| i.parse().ok())
            .unwrap_or_else(|| panic!("pod {:?} has no {REPLICA_INDEX}", p.metadata.name));
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let rack = racks
            .rack_of
            .get(&node)
            .cloned()
            .unwrap_or_else(|| format!("?{node}"));
        out.entry(index / size).or_default().insert(rack);
    }
    out
}

pub fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Deletes job `name` and waits until its pods are gone (their GPUs free for the next run);
/// returns how long that took.
pub async fn delete_and_drain(s: &Scope, kind: Kind, name: &str) -> Duration {
    let start = Instant::now();
    jobs::delete(&s.client, &s.ns, &kind.ar(), name).await;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let selector = format!("{}={name}", crate::harness::JOB_LABEL);
    let what = format!("the pods of deleted job {name} to be gone");
    s.env
        .wait(&s.ns, &what, SLOW, || async {
            let left = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            left.items.is_empty().then_some(())
        })
        .await;
    start.elapsed()
}

/// Asserts that for a few seconds no pod of `job` binds (a gang that must not be placed).
pub async fn none_binds_for(s: &Scope, job: &str, secs: u64) {
    for _ in 0..secs {
        let pods = s.pods(&s.ns, job).await;
        assert!(
            pods.iter().all(|p| !crate::harness::is_bound(p)),
            "no pod of {job} may bind: {:?}\n{}",
            names_of(&pods),
            s.diagnostics()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The PodGroup writes podgroup-sync sent so far of `op` (`create`, `update`) on `backend`.
/// Whether the PodGroup's first sub-group gives its tier by number, as podgroup-sync applied it:
/// podgroup-sync's apply still owns `subGroupPolicy` (an atomic list, which Volcano's scheduler
/// would own had it rewritten a tier name into a number).
pub fn applied_tier_numbers(pg: &DynamicObject) -> bool {
    let by_number =
        pg.data["spec"]["subGroupPolicy"][0]["networkTopology"]["highestTierAllowed"].is_u64();
    let owned = pg.metadata.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() == Some("podgroup-sync")
            && m.operation.as_deref() == Some("Apply")
            && m.fields_v1.as_ref().is_some_and(|f| {
                let f = serde_json::to_value(f).unwrap_or_default();
                f.pointer("/f:spec/f:subGroupPolicy").is_some()
            })
    });
    by_number && owned
}

pub fn writes(s: &Scope, backend: &str, op: &str) -> f64 {
    s.env
        .controller
        .lock()
        .map(|c| {
            c.metric(
                "podgroup_sync_podgroup_writes_total",
                &[("backend", backend), ("op", op)],
            )
        })
        .unwrap_or_default()
}
