//! The caches of the feasibility check (SPEC §10): Nodes stripped to allocatable, taints and
//! unschedulable, and Volcano Queues stripped to their state — so memory stays flat at
//! thousands of nodes. A change of what they keep (not a heartbeat) marks them dirty; a debounce
//! task rebuilds the snapshots reconciles read and looks at every job again, at most once per
//! [`DEBOUNCE`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::feasible::Capacity;
use crate::liveness::Probe;
use crate::metrics::Metrics;
use crate::trigger::Trigger;
use crate::watch::{WatchBackoff, observe};

/// How often at most a node or queue change makes every job be looked at again.
pub const DEBOUNCE: Duration = Duration::from_secs(2);

/// Objects per list page of the stripped caches.
const LIST_PAGE: u32 = 50;

/// The Volcano Queue resource (cluster-scoped).
pub fn queue_resource() -> ApiResource {
    ApiResource {
        group: "scheduling.volcano.sh".into(),
        version: "v1beta1".into(),
        api_version: "scheduling.volcano.sh/v1beta1".into(),
        kind: "Queue".into(),
        plural: "queues".into(),
    }
}

/// Every Volcano queue by name, and its `status.state`.
pub type QueueStates = Arc<BTreeMap<String, String>>;

/// The feasibility caches and the snapshots built from them.
#[derive(Clone)]
pub struct CapacityCaches {
    pub nodes: Store<Node>,
    capacity: Arc<RwLock<Arc<Capacity>>>,
    /// The Queue cache, while Volcano's CRDs are served.
    queues: Arc<RwLock<Option<Store<DynamicObject>>>>,
    queue_states: Arc<RwLock<Option<QueueStates>>>,
    dirty: Arc<AtomicBool>,
}

/// Keeps what the feasibility check reads of a Node, nothing else.
fn strip_node(node: &mut Node) {
    node.metadata = ObjectMeta {
        name: node.metadata.name.take(),
        ..ObjectMeta::default()
    };
    node.spec = node.spec.take().map(|s| NodeSpec {
        taints: s.taints,
        unschedulable: s.unschedulable,
        ..NodeSpec::default()
    });
    node.status = node.status.take().map(|s| NodeStatus {
        allocatable: s.allocatable,
        ..NodeStatus::default()
    });
}

/// Keeps a Queue's name and `status.state`, nothing else.
fn strip_queue(queue: &mut DynamicObject) {
    let state = queue
        .data
        .pointer("/status/state")
        .cloned()
        .unwrap_or(Value::Null);
    queue.metadata = ObjectMeta {
        name: queue.metadata.name.take(),
        ..ObjectMeta::default()
    };
    queue.data = json!({"status": {"state": state}});
}

impl CapacityCaches {
    /// Starts the Node cache; returns the caches and the watch task.
    pub fn spawn(client: &Client, probe: Probe, metrics: Arc<Metrics>) -> (Self, JoinHandle<()>) {
        let dirty = Arc::new(AtomicBool::new(true));
        let (nodes, handle) = spawn_stripped(
            Api::<Node>::all(client.clone()),
            (),
            strip_node,
            dirty.clone(),
            probe,
            metrics,
        );
        let caches = CapacityCaches {
            nodes,
            capacity: Default::default(),
            queues: Default::default(),
            queue_states: Default::default(),
            dirty,
        };
        (caches, handle)
    }

    /// Starts the Queue cache (Volcano's CRDs are served).
    pub fn spawn_queues(
        &self,
        client: &Client,
        probe: Probe,
        metrics: Arc<Metrics>,
    ) -> JoinHandle<()> {
        let ar = queue_resource();
        let (store, handle) = spawn_stripped(
            Api::<DynamicObject>::all_with(client.clone(), &ar),
            ar,
            strip_queue,
            self.dirty.clone(),
            probe,
            metrics,
        );
        *self.queues.write().expect("lock") = Some(store);
        handle
    }

    /// Forgets the Queue cache (Volcano's CRDs are no longer served).
    pub fn stop_queues(&self) {
        *self.queues.write().expect("lock") = None;
        *self.queue_states.write().expect("lock") = None;
    }

    /// The capacity snapshot reconciles read.
    pub fn capacity(&self) -> Arc<Capacity> {
        self.capacity.read().expect("lock").clone()
    }

    /// Every queue and its state, once the Queue cache has synced.
    pub fn queue_states(&self) -> Option<QueueStates> {
        self.queue_states.read().expect("lock").clone()
    }

    /// Rebuilds the snapshots from the caches.
    pub fn refresh(&self) {
        let capacity = Capacity::from_nodes(self.nodes.state().iter().map(|n| n.as_ref()));
        *self.capacity.write().expect("lock") = Arc::new(capacity);
        let queues = self.queues.read().expect("lock").clone();
        let states = queues.filter(synced).map(|store| {
            Arc::new(
                store
                    .state()
                    .iter()
                    .map(|q| {
                        let state = q.data.pointer("/status/state").and_then(Value::as_str);
                        (
                            q.metadata.name.clone().unwrap_or_default(),
                            state.unwrap_or_default().to_string(),
                        )
                    })
                    .collect(),
            )
        });
        *self.queue_states.write().expect("lock") = states;
    }

    /// Rebuilds the snapshots and looks at every job again after a change, at most once per
    /// [`DEBOUNCE`].
    pub fn spawn_debounce(&self, triggers: broadcast::Sender<Trigger>) -> JoinHandle<()> {
        let caches = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(DEBOUNCE);
            loop {
                tick.tick().await;
                if caches.dirty.swap(false, Ordering::Relaxed) {
                    caches.refresh();
                    let _ = triggers.send(Trigger::All);
                }
            }
        })
    }
}

/// Whether a store has listed once (without waiting).
fn synced<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    use futures::FutureExt;
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|r| r.is_ok())
}

/// A cache of stripped objects; a change of what is kept (an add, a delete, a relist, a
/// different stripped object) marks `dirty`.
fn spawn_stripped<K>(
    api: Api<K>,
    dynamic: K::DynamicType,
    strip: fn(&mut K),
    dirty: Arc<AtomicBool>,
    probe: Probe,
    metrics: Arc<Metrics>,
) -> (Store<K>, JoinHandle<()>)
where
    K: kube::Resource
        + Clone
        + PartialEq
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let writer = reflector::store::Writer::<K>::new(dynamic.clone());
    let reader = writer.as_reader();
    let before = reader.clone();
    // Small consistent pages: a list of thousands of full Nodes never sits in memory whole
    // (each page is stripped before the next is read; a list from the watch cache would come
    // in one piece).
    let config = watcher::Config::default().page_size(LIST_PAGE);
    let stream = watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(strip)
        .inspect(move |ev| {
            let changed = match ev {
                Ok(watcher::Event::Apply(o)) => {
                    let key = ObjectRef::from_obj_with(o, dynamic.clone());
                    before.get(&key).is_none_or(|old| old.as_ref() != o)
                }
                Ok(watcher::Event::Delete(_)) | Ok(watcher::Event::InitDone) => true,
                _ => false,
            };
            if changed {
                dirty.store(true, Ordering::Relaxed);
            }
        })
        .reflect(writer);
    let handle = tokio::spawn(async move {
        let _guard = probe.task_guard();
        stream
            .for_each(|ev| {
                observe(&probe, &metrics, &ev);
                future::ready(())
            })
            .await;
    });
    (reader, handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_10_a_cached_node_keeps_allocatable_taints_and_unschedulable_only() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {"a": "b"}, "annotations": {"x": "y"}, "resourceVersion": "7"},
            "spec": {"podCIDR": "10.0.0.0/24", "unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "8"}, "capacity": {"cpu": "8"},
                "images": [{"names": ["a-large-image"], "sizeBytes": 1}], "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        strip_node(&mut node);
        assert_eq!(
            serde_json::to_value(&node).unwrap(),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]},
                "status": {"allocatable": {"cpu": "8"}}})
        );
        let mut q: DynamicObject = serde_json::from_value(json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": "q", "resourceVersion": "3"}, "spec": {"weight": 1}, "status": {"state": "Open", "running": 4}})).unwrap();
        strip_queue(&mut q);
        assert_eq!(q.data, json!({"status": {"state": "Open"}}));
        assert_eq!(q.metadata.name.as_deref(), Some("q"));
    }
}
