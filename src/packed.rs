//! Cached objects kept compact (issue 15). A `serde_json::Value` tree costs several times the
//! object's JSON text: every map entry is a heap-allocated key beside a 32-byte-plus value in a
//! hash-indexed map. The job and PodGroup caches therefore keep each (stripped) object as its
//! metadata, typed, which watches, indexes and triggers read without unpacking, and everything
//! else — spec, status and the field-manager entries — as compact JSON text, parsed back into a
//! `DynamicObject` only when a reconcile, the webhook or an audit reads it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use kube::api::{DynamicObject, TypeMeta};
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use tracing::error;

/// A cached object: metadata typed, the rest as JSON text.
#[derive(Clone, Debug)]
pub struct Packed {
    pub types: Option<TypeMeta>,
    /// Without `managedFields` (they are packed).
    pub metadata: ObjectMeta,
    /// `[data, managedFields]`.
    rest: Box<str>,
}

impl Packed {
    pub fn pack(obj: DynamicObject) -> Self {
        let DynamicObject {
            types,
            mut metadata,
            data,
        } = obj;
        let managed = metadata.managed_fields.take();
        // Serialising a `Value` and typed metadata entries cannot fail.
        let rest = serde_json::to_string(&(&data, &managed)).unwrap_or_default();
        Packed {
            types,
            metadata,
            rest: rest.into_boxed_str(),
        }
    }

    /// The whole object again.
    pub fn unpack(&self) -> DynamicObject {
        let (data, managed) = self.rest_parts();
        let mut metadata = self.metadata.clone();
        metadata.managed_fields = managed;
        DynamicObject {
            types: self.types.clone(),
            metadata,
            data,
        }
    }

    /// Everything but the metadata: `spec`, `status` and the rest of the object's fields.
    pub fn data(&self) -> Value {
        self.rest_parts().0
    }

    fn rest_parts(&self) -> (Value, Option<Vec<ManagedFieldsEntry>>) {
        serde_json::from_str(&self.rest).unwrap_or_else(|e| {
            // Unreachable: the text was written by `pack`. Logged, never a panic.
            error!(error = %e, name = ?self.metadata.name, "a packed cache entry did not parse");
            (Value::Object(Default::default()), None)
        })
    }

    /// Bytes of packed text (for tests and measurements).
    pub fn packed_len(&self) -> usize {
        self.rest.len()
    }
}

impl From<DynamicObject> for Packed {
    fn from(obj: DynamicObject) -> Self {
        Packed::pack(obj)
    }
}

/// A watch event of whole objects as one of packed objects.
pub fn event<K: Into<Packed>>(ev: watcher::Event<K>) -> watcher::Event<Packed> {
    use watcher::Event as E;
    match ev {
        E::Apply(o) => E::Apply(o.into()),
        E::Delete(o) => E::Delete(o.into()),
        E::Init => E::Init,
        E::InitApply(o) => E::InitApply(o.into()),
        E::InitDone => E::InitDone,
    }
}

/// `kube::Resource` for a type that stands for any kind (its `DynamicType` is the
/// `ApiResource`), with its metadata at `self.<path>`: `[generics] Type; path`.
macro_rules! dynamic_resource {
    ([$($generics:tt)*] $ty:ty; $($path:tt)+) => {
        impl<$($generics)*> kube::Resource for $ty {
            type DynamicType = kube::api::ApiResource;
            type Scope = kube::core::DynamicResourceScope;

            fn group(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.group.as_str().into()
            }

            fn version(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.version.as_str().into()
            }

            fn kind(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.kind.as_str().into()
            }

            fn api_version(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.api_version.as_str().into()
            }

            fn plural(dt: &kube::api::ApiResource) -> std::borrow::Cow<'_, str> {
                dt.plural.as_str().into()
            }

            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.$($path)+
            }

            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.$($path)+
            }
        }
    };
}
pub(crate) use dynamic_resource;

dynamic_resource!([] Packed; metadata);

impl<'de> Deserialize<'de> for Packed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        DynamicObject::deserialize(d).map(Packed::pack)
    }
}

impl Serialize for Packed {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.unpack().serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pg() -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {
                "name": "pg", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"app.kubernetes.io/managed-by": "podgroup-sync"},
                "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                    "name": "j", "uid": "ju", "controller": true}],
                "managedFields": [{"manager": "podgroup-sync", "operation": "Apply",
                    "apiVersion": "scheduling.x-k8s.io/v1alpha1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:minMember": {}}}}]
            },
            "spec": {"minMember": 4, "minResources": {"cpu": "8", "nvidia.com/gpu": "4"}},
            "status": {"phase": "Running", "running": 4}
        }))
        .unwrap()
    }

    #[test]
    fn packing_keeps_every_field() {
        let whole = pg();
        let packed = Packed::pack(whole.clone());
        assert!(packed.metadata.managed_fields.is_none());
        assert_eq!(packed.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(
            serde_json::to_value(packed.unpack()).unwrap(),
            serde_json::to_value(&whole).unwrap()
        );
        assert_eq!(packed.data()["status"]["phase"], "Running");
        // Through serde as well (the controller's bound).
        let again: Packed = serde_json::from_value(serde_json::to_value(&packed).unwrap()).unwrap();
        assert_eq!(
            serde_json::to_value(again.unpack()).unwrap(),
            serde_json::to_value(&whole).unwrap()
        );
    }

    #[test]
    fn an_object_without_managed_fields_or_data_round_trips() {
        let mut whole = pg();
        whole.metadata.managed_fields = None;
        whole.data = json!({});
        let back = Packed::pack(whole.clone()).unpack();
        assert_eq!(back.metadata.managed_fields, None);
        assert_eq!(back.data, json!({}));
    }

    #[test]
    fn the_text_is_smaller_than_the_object_it_packs() {
        let whole = pg();
        let text = serde_json::to_string(&whole).unwrap().len();
        assert!(Packed::pack(whole).packed_len() < text);
    }
}
