//! Cached objects kept compact (issue 15). A `serde_json::Value` tree costs several times the
//! object's JSON text: every map entry is a heap-allocated key beside a 32-byte-plus value in a
//! hash-indexed map. The job and PodGroup caches therefore keep each (stripped) object as its
//! metadata, typed, which watches, indexes and triggers read without unpacking, and everything
//! else — spec, status and the field-manager entries — as compact JSON text, parsed back into a
//! `DynamicObject` only when a reconcile, the webhook or an audit reads it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use kube::api::{ApiResource, DynamicObject, TypeMeta};
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use tracing::error;

/// The kind of a cached object, shared: every cache key ([`kube::runtime::reflector::ObjectRef`])
/// holds one, and a key of an `ApiResource` of its own costs five strings per cached object
/// (about 300 bytes with the hash table's slot) where this costs a pointer. Compared by value.
pub type Kind = Arc<ApiResource>;

/// The one shared copy of `ar` (kinds and backends are few; they are kept for good).
pub fn kind(ar: &ApiResource) -> Kind {
    static KINDS: Mutex<Vec<Kind>> = Mutex::new(Vec::new());
    shared(&KINDS, ar, ApiResource::clone)
}

/// The shared copy of the kind `group`/`version` `kind`, found without building an
/// `ApiResource` first (the reconcile, the webhook and every write look a kind up per call);
/// `make` builds it the first time.
pub fn kind_of(group: &str, version: &str, kind: &str, make: impl FnOnce() -> ApiResource) -> Kind {
    static FOUND: Mutex<Vec<Kind>> = Mutex::new(Vec::new());
    if let Some(k) = FOUND
        .lock()
        .expect("lock")
        .iter()
        .find(|k| k.kind == kind && k.version == version && k.group == group)
    {
        return k.clone();
    }
    let k = self::kind(&make());
    FOUND.lock().expect("lock").push(k.clone());
    k
}

/// The one shared copy of an object's `apiVersion` and `kind`.
fn types(t: TypeMeta) -> Arc<TypeMeta> {
    static TYPES: Mutex<Vec<Arc<TypeMeta>>> = Mutex::new(Vec::new());
    shared(&TYPES, &t, TypeMeta::clone)
}

/// The copy of `value` in `pool`, added the first time it is asked for.
fn shared<T: PartialEq>(pool: &Mutex<Vec<Arc<T>>>, value: &T, own: fn(&T) -> T) -> Arc<T> {
    let mut pool = pool.lock().expect("lock");
    if let Some(k) = pool.iter().find(|k| ***k == *value) {
        return k.clone();
    }
    let k = Arc::new(own(value));
    pool.push(k.clone());
    k
}

/// A cached object: metadata typed, the rest as JSON text.
///
/// Its labels and annotations are kept beside the metadata, not in it ([`Pairs`]): what
/// [`kube::Resource::meta`] gives has neither; read them with [`Labelled`] or [`Packed::unpack`].
#[derive(Clone, Debug)]
pub struct Packed {
    /// Shared by every object of the kind.
    types: Option<Arc<TypeMeta>>,
    /// Without `managedFields` (they are packed), labels and annotations.
    metadata: ObjectMeta,
    labels: Pairs,
    annotations: Pairs,
    /// `[data, managedFields]`.
    rest: Box<str>,
}

/// Labels or annotations, kept compact: a `BTreeMap` allocates a node for eleven entries (about
/// 550 bytes) however few it holds; this holds each pair in 32 bytes, sorted by key.
#[derive(Clone, Debug, Default, PartialEq)]
struct Pairs(Box<[(Box<str>, Box<str>)]>);

impl Pairs {
    fn new(map: Option<BTreeMap<String, String>>) -> Self {
        Pairs(
            map.into_iter()
                .flatten()
                .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        let i = self.0.binary_search_by(|(k, _)| (**k).cmp(key)).ok()?;
        Some(&self.0[i].1)
    }

    /// As the metadata holds them (`None` for none: the API server leaves an empty map out).
    fn map(&self) -> Option<BTreeMap<String, String>> {
        (!self.0.is_empty()).then(|| {
            self.0
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
    }
}

/// Reads one label of a cached object or of a whole one.
pub trait Labelled {
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labelled for Packed {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key)
    }
}

impl Labelled for DynamicObject {
    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }
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
        Packed::from_text(types, metadata, rest)
    }

    /// An object read as text already (the PodGroup watch reads them so): `rest` is
    /// `[data, managedFields]` as [`Packed::pack`] writes it; `metadata` comes without
    /// `managedFields`.
    pub(crate) fn from_text(
        types: Option<TypeMeta>,
        mut metadata: ObjectMeta,
        rest: String,
    ) -> Self {
        let labels = Pairs::new(metadata.labels.take());
        let annotations = Pairs::new(metadata.annotations.take());
        Packed {
            types: types.map(self::types),
            metadata,
            labels,
            annotations,
            rest: rest.into_boxed_str(),
        }
    }

    /// The whole object again.
    pub fn unpack(&self) -> DynamicObject {
        let (data, managed) = self.rest_parts();
        let mut metadata = self.metadata.clone();
        metadata.managed_fields = managed;
        metadata.labels = self.labels.map();
        metadata.annotations = self.annotations.map();
        DynamicObject {
            types: self.types.as_deref().cloned(),
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

    /// One annotation of the object.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key)
    }

    /// The object's `kind` ("" if it came without one).
    pub fn kind_name(&self) -> &str {
        self.types.as_ref().map_or("", |t| t.kind.as_str())
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
/// `ApiResource`, or `Type as Shared` for another type that derefs to one), with its metadata at
/// `self.<path>`: `[generics] Type; path` (or through two expressions of `self`:
/// `@[generics] Type as DynamicType; self => shared, mutable`).
macro_rules! dynamic_resource {
    ([$($generics:tt)*] $ty:ty; $($path:tt)+) => {
        $crate::packed::dynamic_resource!([$($generics)*] $ty as kube::api::ApiResource; $($path)+);
    };
    ([$($generics:tt)*] $ty:ty as $dt:ty; $($path:tt)+) => {
        $crate::packed::dynamic_resource!(
            @[$($generics)*] $ty as $dt; self => &self.$($path)+, &mut self.$($path)+
        );
    };
    // The metadata through two expressions of `self` (shared, mutable).
    (@[$($generics:tt)*] $ty:ty as $dt:ty; $s:ident => $meta:expr, $meta_mut:expr) => {
        impl<$($generics)*> kube::Resource for $ty {
            type DynamicType = $dt;
            type Scope = kube::core::DynamicResourceScope;

            fn group(dt: &$dt) -> std::borrow::Cow<'_, str> {
                dt.group.as_str().into()
            }

            fn version(dt: &$dt) -> std::borrow::Cow<'_, str> {
                dt.version.as_str().into()
            }

            fn kind(dt: &$dt) -> std::borrow::Cow<'_, str> {
                dt.kind.as_str().into()
            }

            fn api_version(dt: &$dt) -> std::borrow::Cow<'_, str> {
                dt.api_version.as_str().into()
            }

            fn plural(dt: &$dt) -> std::borrow::Cow<'_, str> {
                dt.plural.as_str().into()
            }

            fn meta(&$s) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                $meta
            }

            fn meta_mut(&mut $s) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                $meta_mut
            }
        }
    };
}
pub(crate) use dynamic_resource;

dynamic_resource!([] Packed as Kind; metadata);

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
    fn labels_and_annotations_are_read_beside_the_metadata() {
        let mut whole = pg();
        let pairs = |n: usize| -> BTreeMap<String, String> {
            (0..n)
                .map(|i| (format!("k{i:02}"), format!("v{i}")))
                .collect()
        };
        whole.metadata.labels = Some(pairs(13));
        whole.metadata.annotations = Some(pairs(2));
        let packed = Packed::pack(whole.clone());
        // Not in the metadata kube-runtime and `ResourceExt` read...
        use kube::ResourceExt;
        assert!(packed.labels().is_empty() && packed.annotations().is_empty());
        // ...but each one found by key, and all of them in the whole object again.
        for i in 0..13 {
            let v = format!("v{i}");
            assert_eq!(packed.label(&format!("k{i:02}")), Some(v.as_str()));
        }
        assert_eq!(packed.label("k13"), None);
        assert_eq!(packed.annotation("k01"), Some("v1"));
        assert_eq!(packed.annotation("k02"), None);
        assert_eq!(packed.label("k01"), whole.label("k01"));
        assert_eq!(packed.unpack(), whole);
        // A kind is shared, whatever copy of it is asked for.
        let ar = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
        assert!(Arc::ptr_eq(&kind(&ar), &kind(&ar.clone())));
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
