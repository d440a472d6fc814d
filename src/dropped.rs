//! Spec fields a cluster's PodGroup schema drops. An API server keeps only the fields its CRD's
//! schema knows (an older Volcano's PodGroup CRD has no `subGroupPolicy`) or its feature gates
//! allow (the native PodGroup's `schedulingConstraints` without `TopologyAwareWorkloadScheduling`),
//! and says nothing: a field sent but not stored is learned from the apply's answer, never sent
//! again by this process, and the job is told that what it asked for is not enforced. Without
//! this, every resync would apply the field again, and the job would never know.

use std::collections::BTreeSet;
use std::sync::Mutex;

use serde_json::Value;

use crate::backend::BackendKind;

/// The top-level `spec` fields of `sent` whose value the stored `stored` lost part or all of
/// (a field missing, at any depth of objects). Values the server normalises (a quantity written
/// another way, a default filled in) are not losses.
pub fn lost(sent: &Value, stored: &Value) -> Vec<String> {
    let Some(sent) = sent.as_object() else {
        return Vec::new();
    };
    sent.iter()
        .filter(|(k, v)| stored.get(k.as_str()).is_none_or(|s| lost_within(v, s)))
        .map(|(k, _)| k.clone())
        .collect()
}

fn lost_within(sent: &Value, stored: &Value) -> bool {
    match (sent, stored) {
        (Value::Object(s), Value::Object(t)) => s
            .iter()
            .any(|(k, v)| t.get(k).is_none_or(|tv| lost_within(v, tv))),
        (Value::Array(s), Value::Array(t)) => {
            s.len() > t.len() || s.iter().zip(t).any(|(a, b)| lost_within(a, b))
        }
        _ => false,
    }
}

/// What this process learned: per backend, the spec fields the cluster drops.
#[derive(Debug, Default)]
pub struct Dropped(Mutex<BTreeSet<(BackendKind, String)>>);

impl Dropped {
    /// Remembers fields found dropped; the ones not known before.
    pub fn learn(&self, backend: BackendKind, fields: Vec<String>) -> Vec<String> {
        let mut known = self.0.lock().expect("lock");
        fields
            .into_iter()
            .filter(|f| known.insert((backend, f.clone())))
            .collect()
    }

    pub fn snapshot(&self) -> BTreeSet<(BackendKind, String)> {
        self.0.lock().expect("lock").clone()
    }
}

/// Removes the fields `backend`'s PodGroups lose from the desired object's `spec`; the removed
/// ones.
pub fn strip(
    desired: &mut Value,
    backend: BackendKind,
    dropped: &BTreeSet<(BackendKind, String)>,
) -> Vec<String> {
    let Some(spec) = desired.get_mut("spec").and_then(Value::as_object_mut) else {
        return Vec::new();
    };
    dropped
        .iter()
        .filter(|(b, _)| *b == backend)
        .filter_map(|(_, f)| spec.remove(f).map(|_| f.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_field_the_schema_drops_is_lost_a_normalised_or_defaulted_one_is_not() {
        let sent = json!({
            "minMember": 16,
            "minResources": {"cpu": "1000m"},
            "networkTopology": {"mode": "hard", "highestTierName": "rack"},
            "subGroupPolicy": [{"name": "worker", "subGroupSize": 8}],
        });
        // Volcano v1.14: everything kept; quantities normalised, defaults added.
        let kept = json!({
            "minMember": 16, "queue": "default",
            "minResources": {"cpu": "1"},
            "networkTopology": {"mode": "hard", "highestTierName": "rack"},
            "subGroupPolicy": [{"name": "worker", "subGroupSize": 8, "minSubGroups": 0}],
        });
        assert!(lost(&sent, &kept).is_empty());
        // An older CRD: no subGroupPolicy, no highestTierName.
        let older = json!({
            "minMember": 16, "minResources": {"cpu": "1"},
            "networkTopology": {"mode": "hard"},
        });
        assert_eq!(lost(&sent, &older), ["networkTopology", "subGroupPolicy"]);
        // A pruned field inside a list item.
        let item = json!({"minMember": 16, "minResources": {"cpu": "1"},
            "networkTopology": {"mode": "hard", "highestTierName": "rack"},
            "subGroupPolicy": [{"name": "worker"}]});
        assert_eq!(lost(&sent, &item), ["subGroupPolicy"]);
    }

    #[test]
    fn learned_fields_are_stripped_for_their_backend_only() {
        let d = Dropped::default();
        assert_eq!(
            d.learn(BackendKind::Volcano, vec!["subGroupPolicy".into()]),
            ["subGroupPolicy"]
        );
        assert!(
            d.learn(BackendKind::Volcano, vec!["subGroupPolicy".into()])
                .is_empty(),
            "told once"
        );
        let mut pg = json!({"spec": {"minMember": 2, "subGroupPolicy": []}});
        let known = d.snapshot();
        assert!(strip(&mut pg, BackendKind::SchedulerPlugins, &known).is_empty());
        assert_eq!(
            strip(&mut pg, BackendKind::Volcano, &known),
            ["subGroupPolicy"]
        );
        assert_eq!(pg, json!({"spec": {"minMember": 2}}));
    }
}
