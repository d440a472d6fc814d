//! The objects of the job and PodGroup watches, read straight into a `DynamicObject` (issue 29).
//! `DynamicObject`'s own reading goes through serde's buffered form of the whole object first
//! (its `types` and `data` are flattened), so every object the API server sends was built twice;
//! and a job's `managedFields` — as large as its spec, and dropped by [`crate::strip::job`]
//! right after — were built in full. [`Lean`] reads each top-level field once into its final
//! place and, for jobs, skips `metadata.managedFields` without building it.

use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DynamicObject, TypeMeta};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::packed::Packed;

/// A watched object. `MANAGED`: whether `metadata.managedFields` is kept (PodGroups: the
/// planner reads its own entry) or skipped while reading (jobs).
#[derive(Clone, Debug)]
pub struct Lean<const MANAGED: bool>(pub DynamicObject);

/// A job as its watch reads it: without `managedFields`.
pub type LeanJob = Lean<false>;
/// A PodGroup as its watch reads it.
pub type LeanPodGroup = Lean<true>;

impl<const M: bool> From<Lean<M>> for Packed {
    fn from(l: Lean<M>) -> Self {
        Packed::pack(l.0)
    }
}

crate::packed::dynamic_resource!([const M: bool] Lean<M>; 0.metadata);

impl<'de, const M: bool> Deserialize<'de> for Lean<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ObjectVisitor::<M>).map(Lean)
    }
}

struct ObjectVisitor<const M: bool>;

impl<'de, const M: bool> Visitor<'de> for ObjectVisitor<M> {
    type Value = DynamicObject;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DynamicObject, A::Error> {
        let (mut api_version, mut kind, mut metadata) = (None, None, None);
        let mut data = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "apiVersion" => api_version = Some(map.next_value::<String>()?),
                "kind" => kind = Some(map.next_value::<String>()?),
                "metadata" => metadata = Some(map.next_value::<Meta<M>>()?.0),
                _ => {
                    data.insert(key, map.next_value::<Value>()?);
                }
            }
        }
        let types = match (api_version, kind) {
            (Some(api_version), Some(kind)) => Some(TypeMeta { api_version, kind }),
            _ => None,
        };
        Ok(DynamicObject {
            types,
            metadata: metadata.ok_or_else(|| de::Error::missing_field("metadata"))?,
            data: Value::Object(data),
        })
    }
}

/// `metadata`, with or without `managedFields`.
struct Meta<const M: bool>(ObjectMeta);

impl<'de, const M: bool> Deserialize<'de> for Meta<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if M {
            return ObjectMeta::deserialize(d).map(Meta);
        }
        let fields = d.deserialize_map(WithoutManagedFields(PhantomData))?;
        ObjectMeta::deserialize(Value::Object(fields))
            .map(Meta)
            .map_err(de::Error::custom)
    }
}

/// A map's entries but `managedFields`, which is skipped unread.
struct WithoutManagedFields<'de>(PhantomData<&'de ()>);

impl<'de> Visitor<'de> for WithoutManagedFields<'de> {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("object metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == "managedFields" {
                map.next_value::<IgnoredAny>()?;
            } else {
                let value = map.next_value::<Value>()?;
                out.insert(key, value);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object() -> Value {
        json!({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u", "resourceVersion": "5",
                "labels": {"a": "b"}, "annotations": {"c": "d"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "xu"}],
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                    "apiVersion": "kubeflow.org/v1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:pytorchReplicaSpecs": {}}}}]},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}},
            "status": {"conditions": []}
        })
    }

    #[test]
    fn a_lean_object_is_the_dynamic_object_serde_reads_less_what_it_skips() {
        let text = object().to_string();
        let whole: DynamicObject = serde_json::from_str(&text).unwrap();
        // A PodGroup keeps everything, from text and from any other deserializer.
        let pg: LeanPodGroup = serde_json::from_str(&text).unwrap();
        assert_eq!(pg.0, whole);
        let pg: LeanPodGroup = serde_json::from_value(object()).unwrap();
        assert_eq!(pg.0, whole);
        // A job is the same without its managedFields.
        let job: LeanJob = serde_json::from_str(&text).unwrap();
        let mut expected = whole.clone();
        expected.metadata.managed_fields = None;
        assert_eq!(job.0, expected);
        // Within a list (kube reads lists through serde's buffered form): the same.
        let list: kube::core::ObjectList<LeanJob> = serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJobList",
            "metadata": {"resourceVersion": "9"}, "items": [object()]}))
        .unwrap();
        assert_eq!(list.items[0].0, expected);
        // And in a watch event.
        let ev: kube::core::WatchEvent<LeanJob> =
            serde_json::from_str(&format!(r#"{{"type":"ADDED","object":{text}}}"#)).unwrap();
        let kube::core::WatchEvent::Added(job) = ev else {
            panic!()
        };
        assert_eq!(job.0, expected);
    }

    #[test]
    fn an_object_without_metadata_is_refused() {
        let err = serde_json::from_value::<LeanJob>(json!({"kind": "X", "spec": {}})).unwrap_err();
        assert!(err.to_string().contains("metadata"), "{err}");
    }
}
