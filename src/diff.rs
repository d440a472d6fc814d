//! Whether an existing PodGroup already says what podgroup-sync would apply (pure).
//!
//! Compared field by field, so a resync or restart with nothing changed writes nothing:
//! every field of the desired object must be present with an equal value (quantities compared
//! by value, so `1000m` equals `1`), and no field that podgroup-sync's field manager owns may
//! linger once the desired object drops it. Fields owned by others are ignored.

use serde_json::{Map, Value};

use crate::quantity::Quantity;

/// True when applying `desired` would change `actual`.
pub fn needs_apply(desired: &Value, actual: &Value, field_manager: &str) -> bool {
    !contains(desired, actual, false) || owned_field_dropped(desired, actual, field_manager)
}

/// Whether `actual` has every field of `desired` with an equal value.
fn contains(desired: &Value, actual: &Value, quantities: bool) -> bool {
    match (desired, actual) {
        (Value::Object(d), Value::Object(a)) => d.iter().all(|(k, dv)| {
            a.get(k)
                .is_some_and(|av| contains(dv, av, quantities || k == "minResources"))
        }),
        // Lists (ownerReferences): every desired element is matched by some actual element.
        (Value::Array(d), Value::Array(a)) => d
            .iter()
            .all(|dv| a.iter().any(|av| contains(dv, av, quantities))),
        (d, a) if quantities => match (as_quantity(d), as_quantity(a)) {
            (Some(dq), Some(aq)) => dq == aq,
            _ => d == a,
        },
        (d, a) => d == a,
    }
}

fn as_quantity(v: &Value) -> Option<Quantity> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.to_string().parse().ok(),
        _ => None,
    }
}

/// Whether a field this manager applied before is absent from `desired` but still set.
fn owned_field_dropped(desired: &Value, actual: &Value, field_manager: &str) -> bool {
    let Some(entries) = actual
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return false;
    };
    entries
        .iter()
        .filter(|e| {
            e.get("manager").and_then(Value::as_str) == Some(field_manager)
                && e.get("operation").and_then(Value::as_str) == Some("Apply")
        })
        .filter_map(|e| e.get("fieldsV1").and_then(Value::as_object))
        .any(|fields| dropped(fields, Some(desired), actual))
}

fn dropped(fields: &Map<String, Value>, desired: Option<&Value>, actual: &Value) -> bool {
    fields.iter().any(|(key, sub)| {
        // Only named fields ("f:name"); list items ("k:…", "v:…") stay with their list.
        let Some(name) = key.strip_prefix("f:") else {
            return false;
        };
        let Some(actual_child) = actual.get(name) else {
            return false;
        };
        match desired.and_then(|d| d.get(name)) {
            None => true,
            Some(desired_child) => match sub.as_object() {
                Some(m) if !m.is_empty() && actual_child.is_object() => {
                    dropped(m, Some(desired_child), actual_child)
                }
                _ => false,
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn actual(spec: Value, owned: Value) -> Value {
        json!({"metadata": {"name": "pg", "resourceVersion": "7", "managedFields": [
            {"manager": "podgroup-sync", "operation": "Apply", "fieldsV1": owned},
            {"manager": "volcano", "operation": "Update", "fieldsV1": {"f:status": {}}}
        ]}, "spec": spec, "status": {"phase": "Running"}})
    }

    #[test]
    fn equal_spec_needs_no_write() {
        let desired = json!({"metadata": {"name": "pg"}, "spec": {"minMember": 3, "minResources": {"cpu": "1500m"}}});
        let a = actual(
            json!({"minMember": 3, "minResources": {"cpu": "1.5"}, "networkTopology": {"mode": "hard"}}),
            json!({"f:spec": {"f:minMember": {}, "f:minResources": {"f:cpu": {}}}}),
        );
        assert!(!needs_apply(&desired, &a, "podgroup-sync"));
    }

    #[test]
    fn changed_value_needs_a_write() {
        let desired = json!({"spec": {"minMember": 4}});
        let a = actual(
            json!({"minMember": 3}),
            json!({"f:spec": {"f:minMember": {}}}),
        );
        assert!(needs_apply(&desired, &a, "podgroup-sync"));
    }

    #[test]
    fn a_field_we_own_and_no_longer_want_needs_a_write() {
        let desired = json!({"spec": {"minMember": 3}});
        let a = actual(
            json!({"minMember": 3, "scheduleTimeoutSeconds": 30}),
            json!({"f:spec": {"f:minMember": {}, "f:scheduleTimeoutSeconds": {}}}),
        );
        assert!(needs_apply(&desired, &a, "podgroup-sync"));
        let gone_resource = actual(
            json!({"minMember": 3, "minResources": {"cpu": "1", "nvidia.com/gpu": "2"}}),
            json!({"f:spec": {"f:minMember": {}, "f:minResources": {"f:cpu": {}, "f:nvidia.com/gpu": {}}}}),
        );
        let desired = json!({"spec": {"minMember": 3, "minResources": {"cpu": "1"}}});
        assert!(needs_apply(&desired, &gone_resource, "podgroup-sync"));
    }

    #[test]
    fn a_field_others_own_is_ignored() {
        let desired = json!({"spec": {"minMember": 3}});
        let a = actual(
            json!({"minMember": 3, "priorityClassName": "set-by-a-webhook"}),
            json!({"f:spec": {"f:minMember": {}}}),
        );
        assert!(!needs_apply(&desired, &a, "podgroup-sync"));
    }

    #[test]
    fn owner_reference_must_be_present() {
        let owner = json!({"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "name": "j", "uid": "u1", "controller": true, "blockOwnerDeletion": true});
        let desired = json!({"metadata": {"ownerReferences": [owner]}});
        let mut a = actual(json!({}), json!({}));
        a["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "x/v1", "kind": "Other", "name": "o", "uid": "u0"}, owner]);
        assert!(!needs_apply(&desired, &a, "podgroup-sync"));
        a["metadata"]["ownerReferences"] = json!([]);
        assert!(needs_apply(&desired, &a, "podgroup-sync"));
    }
}
