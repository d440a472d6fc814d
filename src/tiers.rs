//! Volcano's HyperNode tiers by name (SPEC §13). A PodGroup names the tier its pods may not
//! cross by the node label the tier was built from (`highestTierName`). Volcano 1.14 resolves
//! such a name for the PodGroup's own `networkTopology` but not for a `subGroupPolicy` entry
//! (volcano-sh/volcano#5189, fixed in 1.15): the sub-group's constraint is then dropped until the
//! scheduler has written the resolved PodGroup back, and a gang scheduled before that has its
//! slices placed anywhere. So the PodGroup carries the tier's number (`highestTierAllowed`)
//! wherever the HyperNodes name it without doubt, and the name only where they do not.
//!
//! The watch keeps one map, tier name → tier, and wakes every job only when that map changes
//! (a HyperNode's status or membership changing does not).

use std::borrow::Cow;
use std::sync::{Arc, RwLock};

use futures::{StreamExt, future};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::Deserialize;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::liveness::Probe;
use crate::metrics::Metrics;
use crate::trigger::Trigger;
use crate::watch::{WatchBackoff, observe};

/// The liveness name of the HyperNode watch.
pub const RESOURCE: &str = "hypernodes.topology.volcano.sh/v1alpha1";

pub use crate::topology::{TierNumbers, tier_numbers as numbers};

/// A HyperNode as the tier map needs it: its tier and the tier's name, nothing else.
#[derive(Debug, Clone, Deserialize)]
pub struct HyperNode {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: HyperNodeSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HyperNodeSpec {
    #[serde(default)]
    pub tier: Option<i64>,
    #[serde(default)]
    pub tier_name: Option<String>,
}

impl kube::Resource for HyperNode {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "HyperNode".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "topology.volcano.sh".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "hypernodes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The HyperNode resource, for discovery.
pub fn hyper_node_resource() -> ApiResource {
    ApiResource::erase::<HyperNode>(&())
}

/// The tier map reconciles read; empty while HyperNodes are not served or not yet listed.
#[derive(Clone, Default)]
pub struct Tiers(Arc<RwLock<Arc<TierNumbers>>>);

impl Tiers {
    pub fn get(&self) -> Arc<TierNumbers> {
        self.0.read().expect("lock").clone()
    }

    /// Replaces the map; whether it changed.
    fn set(&self, numbers: TierNumbers) -> bool {
        let mut held = self.0.write().expect("lock");
        if **held == numbers {
            return false;
        }
        *held = Arc::new(numbers);
        true
    }

    /// Forgets every tier (HyperNodes no longer served); whether there were any.
    pub fn clear(&self) -> bool {
        self.set(TierNumbers::new())
    }
}

fn numbers_of(store: &Store<HyperNode>) -> TierNumbers {
    let state = store.state();
    numbers(
        state
            .iter()
            .map(|h| (h.spec.tier_name.as_deref(), h.spec.tier)),
    )
}

/// Watches HyperNodes until aborted; a change of the tier map wakes every job (its PodGroup
/// may name a tier that now has a number, or another one).
pub fn spawn(
    client: Client,
    tiers: Tiers,
    triggers: broadcast::Sender<Trigger>,
    probe: Probe,
    metrics: Arc<Metrics>,
) -> JoinHandle<()> {
    let (reader, writer) = reflector::store();
    let stream = watcher(Api::<HyperNode>::all(client), watcher::Config::default())
        .backoff(WatchBackoff::default())
        .reflect(writer);
    tokio::spawn(async move {
        let _guard = probe.task_guard();
        stream
            .for_each(|ev| {
                observe(&probe, &metrics, &ev);
                let settled = matches!(
                    ev,
                    Ok(watcher::Event::Apply(_)
                        | watcher::Event::Delete(_)
                        | watcher::Event::InitDone)
                );
                if settled && tiers.set(numbers_of(&reader)) {
                    let _ = triggers.send(Trigger::All);
                }
                future::ready(())
            })
            .await;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_13_a_tier_name_maps_to_its_tier_unless_hyper_nodes_disagree() {
        let n = numbers([
            (Some("rack"), Some(1)),
            (Some("rack"), Some(1)),
            (Some("zone"), Some(2)),
            (Some("block"), Some(2)),
            (Some("block"), Some(3)),
            (None, Some(4)),
            (Some(""), Some(5)),
            (Some("spine"), None),
            (Some("odd"), Some(-1)),
        ]);
        assert_eq!(
            n,
            TierNumbers::from([("rack".into(), 1), ("zone".into(), 2)])
        );
    }

    #[test]
    fn a_hyper_node_is_read_for_its_tier_and_name_only() {
        let h: HyperNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": {"name": "rack-0"},
            "spec": {"tier": 1, "tierName": "topology.example.com/rack",
                     "members": [{"type": "Node", "selector": {"exactMatch": {"name": "n1"}}}]},
            "status": {"nodeCount": 1}
        }))
        .unwrap();
        assert_eq!(h.spec.tier, Some(1));
        assert_eq!(
            h.spec.tier_name.as_deref(),
            Some("topology.example.com/rack")
        );
        let tiers = Tiers::default();
        assert!(tiers.set(numbers([(h.spec.tier_name.as_deref(), h.spec.tier)])));
        assert!(!tiers.set(numbers([(h.spec.tier_name.as_deref(), h.spec.tier)])));
        assert_eq!(tiers.get().get("topology.example.com/rack"), Some(&1));
        assert!(tiers.clear());
    }
}
