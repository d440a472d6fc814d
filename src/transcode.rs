//! Reading parts of a watched object straight into compact JSON text, or into their typed form
//! without a detour (issue 29). A `serde_json::Value` tree built only to be written out again as
//! text (what a packed cache entry keeps) is an allocation per map entry and per string;
//! [`Transcode`] writes what any deserializer yields — serde_json's own, or serde's buffered form
//! of a list's items — into text as it is read. [`MetaWithout`] reads `metadata` into
//! `ObjectMeta` with `managedFields` handed elsewhere (skipped, or kept as text for one manager
//! only) instead of through a `Value` map first.

use std::fmt;
use std::io::Write;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::value::{MapAccessDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Appends the value read to the text, as compact JSON.
pub struct Transcode<'a>(pub &'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Transcode<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// Writes `v` as JSON (a string escaped, a non-finite number as `null`, as serde_json writes
/// them). Writing into a `Vec` cannot fail.
fn json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    let _ = serde_json::to_writer(out, v);
}

impl<'de> Visitor<'de> for Transcode<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.0.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        let _ = write!(self.0, "{v}");
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        let _ = write!(self.0, "{v}");
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        json(self.0, &v);
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        json(self.0, v);
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let out = self.0;
        out.push(b'[');
        let mut first = true;
        loop {
            // The comma goes before an element, and is taken back if none came.
            let mark = out.len();
            if !first {
                out.push(b',');
            }
            if seq.next_element_seed(Transcode(out))?.is_none() {
                out.truncate(mark);
                break;
            }
            first = false;
        }
        out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.0;
        out.push(b'{');
        let mut first = true;
        loop {
            let mark = out.len();
            if !first {
                out.push(b',');
            }
            if map.next_key_seed(Key(out))?.is_none() {
                out.truncate(mark);
                break;
            }
            out.push(b':');
            map.next_value_seed(Transcode(out))?;
            first = false;
        }
        out.push(b'}');
        Ok(())
    }
}

/// A map's key, written as a JSON string.
struct Key<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        json(self.0, v);
        Ok(())
    }
}

/// `managedFields` of one object, as JSON text holding only the entries of `manager`.
pub struct ManagedOf<'a> {
    pub manager: &'a str,
    pub out: &'a mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for ManagedOf<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // Any: `null` is a list of none, as `ObjectMeta` reads it.
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ManagedOf<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of field-manager entries")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let out = self.out;
        out.push(b'[');
        let mut entry = Vec::new();
        let mut first = true;
        while let Some(manager) = seq.next_element_seed(Entry(&mut entry))? {
            if manager.as_deref() == Some(self.manager) {
                if !first {
                    out.push(b',');
                }
                out.extend_from_slice(&entry);
                first = false;
            }
            entry.clear();
        }
        out.push(b']');
        Ok(())
    }
}

/// One field-manager entry written as text; its `manager` read on the way.
struct Entry<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Entry<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Entry<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field-manager entry")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
        let out = self.0;
        let mut manager = None;
        out.push(b'{');
        while let Some(key) = map.next_key::<String>()? {
            if out.len() > 1 {
                out.push(b',');
            }
            json(out, &key);
            out.push(b':');
            if key == "manager" {
                let m: Option<String> = map.next_value()?;
                json(out, &m);
                manager = m;
            } else {
                map.next_value_seed(Transcode(out))?;
            }
        }
        out.push(b'}');
        Ok(manager)
    }
}

/// What becomes of an object's `managedFields` while its metadata is read.
pub enum Managed<'a> {
    /// Skipped unread.
    Skip,
    /// Written to the text, `manager`'s entries only (see [`ManagedOf`]); left untouched when
    /// the object has none.
    KeepOf(&'a str, &'a mut Vec<u8>),
}

/// `metadata` read into `ObjectMeta` with its `managedFields` taken out (see [`Managed`]).
pub struct MetaWithout<'a>(pub Managed<'a>);

impl<'de> DeserializeSeed<'de> for MetaWithout<'_> {
    type Value = ObjectMeta;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ObjectMeta, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetaWithout<'_> {
    type Value = ObjectMeta;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("object metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ObjectMeta, A::Error> {
        let filtered = Filtered {
            inner: map,
            managed: self.0,
        };
        serde::Deserialize::deserialize(MapAccessDeserializer::new(filtered))
    }
}

/// A map's entries as `ObjectMeta`'s own reading asks for them, `managedFields` taken out.
struct Filtered<'a, A> {
    inner: A,
    managed: Managed<'a>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Filtered<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.inner.next_key::<String>()? {
            if key != "managedFields" {
                return seed.deserialize(StringDeserializer::new(key)).map(Some);
            }
            match &mut self.managed {
                Managed::Skip => {
                    self.inner.next_value::<IgnoredAny>()?;
                }
                Managed::KeepOf(manager, out) => {
                    out.clear();
                    self.inner.next_value_seed(ManagedOf { manager, out })?;
                }
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.inner.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use serde_json::{Value, json};

    fn transcoded(text: &str) -> String {
        let mut out = Vec::new();
        Transcode(&mut out)
            .deserialize(&mut serde_json::Deserializer::from_str(text))
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn any_value_is_written_as_serde_json_writes_it() {
        let v = json!({"a": [1, -2, 3.5, 1e300, true, false, null, "x\"y\\z\n\u{1F600}"],
            "b": {}, "c": [], "d": {"e": {"f": [[], [{}]]}}, "": "", "ü": 18446744073709551615u64});
        let text = v.to_string();
        assert_eq!(transcoded(&text), text);
        // From serde's buffered form of a value (how kube reads a list's items) as well.
        let mut out = Vec::new();
        Transcode(&mut out).deserialize(v.clone()).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), text);
        // And whitespace is gone.
        assert_eq!(transcoded(" { \"a\" : [ 1 , 2 ] } "), r#"{"a":[1,2]}"#);
    }

    fn meta() -> Value {
        json!({"name": "pg", "namespace": "ns", "labels": {"a": "b"},
            "managedFields": [
                {"manager": "kube-scheduler", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {}}, "subresource": "status"},
                {"manager": "podgroup-sync", "operation": "Apply", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:minMember": {}}}},
                {"operation": "Update"}],
            "resourceVersion": "7"})
    }

    #[test]
    fn metadata_is_read_without_its_managed_fields() {
        let text = meta().to_string();
        let mut whole: ObjectMeta = serde_json::from_str(&text).unwrap();
        let read = MetaWithout(Managed::Skip)
            .deserialize(&mut serde_json::Deserializer::from_str(&text))
            .unwrap();
        let entries = whole.managed_fields.take().unwrap();
        assert_eq!(read, whole);
        // Kept for one manager: the rest of the metadata the same, that manager's entry as text.
        let mut out = Vec::new();
        let read = MetaWithout(Managed::KeepOf("podgroup-sync", &mut out))
            .deserialize(meta())
            .unwrap();
        assert_eq!(read, whole);
        let kept: Vec<ManagedFieldsEntry> = serde_json::from_slice(&out).unwrap();
        assert_eq!(kept, vec![entries[1].clone()]);
        // `null`: read as none, as `ObjectMeta` reads it.
        let mut out = Vec::new();
        let read = MetaWithout(Managed::KeepOf("podgroup-sync", &mut out))
            .deserialize(&mut serde_json::Deserializer::from_str(
                r#"{"name": "pg", "managedFields": null}"#,
            ))
            .unwrap();
        assert_eq!(read.name.as_deref(), Some("pg"));
        assert_eq!(out, b"null");
        // None of that manager: an empty list.
        let mut out = Vec::new();
        MetaWithout(Managed::KeepOf("someone", &mut out))
            .deserialize(&mut serde_json::Deserializer::from_str(&text))
            .unwrap();
        assert_eq!(out, b"[]");
    }

    #[test]
    fn bad_metadata_is_an_error_not_a_panic() {
        for bad in [
            json!({"name": 5}),
            json!({"managedFields": [{"manager": 5}]}),
            json!([]),
        ] {
            assert!(
                MetaWithout(Managed::KeepOf("m", &mut Vec::new()))
                    .deserialize(bad.clone())
                    .is_err(),
                "{bad}"
            );
        }
    }
}
