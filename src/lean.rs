//! The objects of the job and PodGroup watches, read straight into their cached form (issue 29).
//! `DynamicObject`'s own reading goes through serde's buffered form of the whole object first
//! (its `types` and `data` are flattened), so every object the API server sends was built twice;
//! and a job's `managedFields` — as large as its spec, and dropped by [`crate::strip::job`]
//! right after — were built in full.
//!
//! [`LeanJob`] reads each top-level field once into its final place, the metadata straight into
//! `ObjectMeta` with `managedFields` skipped unread (the job is then stripped as a `Value`, which
//! depends on its kind). [`LeanPodGroup`] is read straight into its packed form: the metadata
//! typed, everything else written into the packed text as it is read (no `Value` tree at all),
//! stripped on the way (only podgroup-sync's field-manager entry kept, no last-applied copy).

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DynamicObject, TypeMeta};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::packed::Packed;
use crate::settings::FIELD_MANAGER;
use crate::transcode::{Managed, MetaWithout, Transcode};

/// A job as its watch reads it: without `managedFields`.
#[derive(Clone, Debug)]
pub struct LeanJob(pub DynamicObject);

impl From<LeanJob> for Packed {
    fn from(l: LeanJob) -> Self {
        Packed::pack(l.0)
    }
}

crate::packed::dynamic_resource!([] LeanJob; 0.metadata);

impl<'de> Deserialize<'de> for LeanJob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(JobVisitor).map(LeanJob)
    }
}

/// `apiVersion` and `kind` as one, if both came.
fn types(api_version: Option<String>, kind: Option<String>) -> Option<TypeMeta> {
    match (api_version, kind) {
        (Some(api_version), Some(kind)) => Some(TypeMeta { api_version, kind }),
        _ => None,
    }
}

fn metadata<E: de::Error>(metadata: Option<ObjectMeta>) -> Result<ObjectMeta, E> {
    metadata.ok_or_else(|| de::Error::missing_field("metadata"))
}

struct JobVisitor;

impl<'de> Visitor<'de> for JobVisitor {
    type Value = DynamicObject;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DynamicObject, A::Error> {
        let (mut api_version, mut kind, mut meta) = (None, None, None);
        let mut data = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "apiVersion" => api_version = Some(map.next_value::<String>()?),
                "kind" => kind = Some(map.next_value::<String>()?),
                "metadata" => meta = Some(map.next_value_seed(MetaWithout(Managed::Skip))?),
                _ => {
                    data.insert(key, map.next_value::<Value>()?);
                }
            }
        }
        Ok(DynamicObject {
            types: types(api_version, kind),
            metadata: metadata(meta)?,
            data: Value::Object(data),
        })
    }
}

/// A PodGroup as its watch reads it: packed and stripped as it is read.
#[derive(Clone, Debug)]
pub struct LeanPodGroup(pub Packed);

impl From<LeanPodGroup> for Packed {
    fn from(l: LeanPodGroup) -> Self {
        l.0
    }
}

crate::packed::dynamic_resource!(
    @[] LeanPodGroup as crate::packed::Kind;
    self => kube::Resource::meta(&self.0), kube::Resource::meta_mut(&mut self.0)
);

impl<'de> Deserialize<'de> for LeanPodGroup {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(PodGroupVisitor).map(LeanPodGroup)
    }
}

struct PodGroupVisitor;

impl<'de> Visitor<'de> for PodGroupVisitor {
    type Value = Packed;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Packed, A::Error> {
        let (mut api_version, mut kind, mut meta) = (None, None, None);
        // `[data, managedFields]`, as `Packed::pack` writes it.
        let mut rest = Vec::with_capacity(256);
        let mut managed = Vec::new();
        rest.extend_from_slice(b"[{");
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "apiVersion" => api_version = Some(map.next_value::<String>()?),
                "kind" => kind = Some(map.next_value::<String>()?),
                "metadata" => {
                    let seed = MetaWithout(Managed::KeepOf(FIELD_MANAGER, &mut managed));
                    meta = Some(map.next_value_seed(seed)?);
                }
                _ => {
                    if rest.len() > 2 {
                        rest.push(b',');
                    }
                    // Writing a string into a `Vec` cannot fail.
                    let _ = serde_json::to_writer(&mut rest, &key);
                    rest.push(b':');
                    map.next_value_seed(Transcode(&mut rest))?;
                }
            }
        }
        rest.extend_from_slice(b"},");
        rest.extend_from_slice(if managed.is_empty() {
            b"null"
        } else {
            &managed
        });
        rest.push(b']');
        let mut meta = metadata(meta)?;
        if let Some(a) = meta.annotations.as_mut() {
            a.remove(crate::strip::LAST_APPLIED);
        }
        // Only ever valid UTF-8: strings are written by serde_json, the rest is ASCII.
        let rest = String::from_utf8(rest).map_err(de::Error::custom)?;
        Ok(Packed::from_text(types(api_version, kind), meta, rest))
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
    fn a_lean_job_is_the_dynamic_object_serde_reads_without_managed_fields() {
        let text = object().to_string();
        let mut expected: DynamicObject = serde_json::from_str(&text).unwrap();
        expected.metadata.managed_fields = None;
        let job: LeanJob = serde_json::from_str(&text).unwrap();
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

    fn pod_group() -> Value {
        json!({
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "pg", "namespace": "ns", "uid": "u", "resourceVersion": "5",
                "labels": {"app.kubernetes.io/managed-by": "podgroup-sync"},
                "annotations": {"c": "d", crate::strip::LAST_APPLIED: "{\"big\":1}"},
                "managedFields": [
                    {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:metadata": {"f:annotations": {}}}},
                    {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsType": "FieldsV1",
                        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                        "fieldsV1": {"f:spec": {"f:minMember": {}}}}]},
            "spec": {"minMember": 4, "minResources": {"cpu": "8", "nvidia.com/gpu": "4"},
                "scheduleTimeoutSeconds": 60, "ratio": 0.5},
            "status": {"phase": "Running", "running": 4, "note": "ü \" \\"}
        })
    }

    /// What the PodGroup watch kept before: the whole object, stripped, then packed.
    fn stripped(v: Value) -> DynamicObject {
        let mut pg: DynamicObject = serde_json::from_value(v).unwrap();
        pg.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(crate::strip::LAST_APPLIED);
        if let Some(m) = pg.metadata.managed_fields.as_mut() {
            m.retain(|e| e.manager.as_deref() == Some(FIELD_MANAGER));
        }
        pg
    }

    #[test]
    fn a_lean_pod_group_is_the_stripped_object_packed_as_it_is_read() {
        let expected = stripped(pod_group());
        let text = pod_group().to_string();
        let read: LeanPodGroup = serde_json::from_str(&text).unwrap();
        assert_eq!(read.0.unpack(), expected);
        assert_eq!(
            read.0.packed_len(),
            Packed::pack(expected.clone()).packed_len()
        );
        // From serde's buffered form (a list's items) and in a watch event: the same.
        let list: kube::core::ObjectList<LeanPodGroup> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "List", "metadata": {}, "items": [pod_group()]}))
        .unwrap();
        assert_eq!(list.items[0].0.unpack(), expected);
        let ev: kube::core::WatchEvent<LeanPodGroup> =
            serde_json::from_str(&format!(r#"{{"type":"MODIFIED","object":{text}}}"#)).unwrap();
        let kube::core::WatchEvent::Modified(pg) = ev else {
            panic!()
        };
        assert_eq!(pg.0.unpack(), expected);
        use crate::packed::Labelled;
        assert_eq!(
            pg.0.label("app.kubernetes.io/managed-by"),
            Some("podgroup-sync")
        );
        assert_eq!(pg.0.kind_name(), "PodGroup");
    }

    #[test]
    fn a_pod_group_without_managed_fields_or_data_is_read_too() {
        let mut v = pod_group();
        v["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        v.as_object_mut().unwrap().remove("spec");
        v.as_object_mut().unwrap().remove("status");
        let read: LeanPodGroup = serde_json::from_value(v.clone()).unwrap();
        let whole = read.0.unpack();
        assert_eq!(whole.metadata.managed_fields, None);
        assert_eq!(whole.data, json!({}));
        assert_eq!(whole, stripped(v));
        // Only other managers' entries: an empty list, as stripping left it.
        let mut v = pod_group();
        v["metadata"]["managedFields"].as_array_mut().unwrap().pop();
        let read: LeanPodGroup = serde_json::from_value(v).unwrap();
        assert_eq!(read.0.unpack().metadata.managed_fields, Some(vec![]));
    }

    #[test]
    fn an_object_without_metadata_or_with_bad_fields_is_refused() {
        let err = serde_json::from_value::<LeanJob>(json!({"kind": "X", "spec": {}})).unwrap_err();
        assert!(err.to_string().contains("metadata"), "{err}");
        let err =
            serde_json::from_value::<LeanPodGroup>(json!({"kind": "X", "spec": {}})).unwrap_err();
        assert!(err.to_string().contains("metadata"), "{err}");
        for bad in [
            json!({"metadata": {"name": 1}}),
            json!({"metadata": {"managedFields": {}}}),
            json!({"metadata": {}, "kind": 3}),
        ] {
            assert!(
                serde_json::from_value::<LeanPodGroup>(bad.clone()).is_err(),
                "{bad}"
            );
            assert!(
                serde_json::from_str::<LeanPodGroup>(&bad.to_string()).is_err(),
                "{bad}"
            );
        }
    }
}
