//! The `admission.k8s.io/v1` AdmissionReview wire format: the request fields the webhook reads
//! and the response it sends (always allowed; a JSON Patch when something is added).

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{Value, json};

pub const API_VERSION: &str = "admission.k8s.io/v1";

/// An AdmissionReview as read: only the fields the webhook uses are kept, the object stays a
/// borrowed slice of the body until its few fields are read, and everything else is skipped
/// without being built (a body of any shape costs its own bytes, not a tree of them).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review<'a> {
    api_version: String,
    kind: String,
    #[serde(borrow)]
    request: Option<Request<'a>>,
}

/// The fields of an AdmissionRequest the webhook reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    pub uid: String,
    pub kind: Kind,
    pub operation: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default, borrow)]
    pub object: Option<&'a RawValue>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct Kind {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl Request<'_> {
    /// A Pod CREATE, the only request the webhook acts on.
    pub fn is_pod_create(&self) -> bool {
        self.kind.group.is_empty()
            && self.kind.version == "v1"
            && self.kind.kind == "Pod"
            && self.operation == "CREATE"
    }
}

/// The pod metadata the decision reads. Of the labels and annotations only the keys the
/// decision reads are kept ([`read_key`]), of the owner references only controllers: a pod of
/// any size is read in memory proportional to those few.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMeta {
    /// The pod's name, when its creator set one (a StatefulSet's pods carry their ordinal in
    /// it); a value longer than an object name can be is dropped.
    #[serde(default, deserialize_with = "object_name")]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default, deserialize_with = "picked")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "picked")]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "controllers")]
    pub owner_references: Option<Vec<OwnerReference>>,
}

/// At most this many kept entries per map or list; more is a malformed pod (a real one has a
/// handful, and the API server allows one controller).
const MAX_PICKED: usize = 64;

/// Whether the decision can read this label or annotation key: the Kubeflow operators' labels,
/// the label each kind's operator names its object by and those naming a pod's set (a JobSet's
/// replicated job, a Ray group, an LWS group and a pod's index in it), the indices slices are
/// cut by and the placement labels (SPEC §13), every backend's link key and the native link's
/// marker.
pub fn read_key(key: &str) -> bool {
    key.starts_with("training.kubeflow.org/")
        || crate::kinds::KINDS.iter().any(|k| k.pod_label == key)
        || key == crate::kinds::jobset::REPLICATED_JOB_LABEL
        || key == crate::kinds::ray::RAY_GROUP_LABEL
        || key == crate::kinds::lws::GROUP_INDEX_LABEL
        || key == crate::kinds::lws::WORKER_INDEX_LABEL
        // SPEC §13: the pod indices slices are cut by, and the placement labels themselves.
        || key == crate::kinds::jobset::JOB_INDEX_LABEL
        || key == crate::kinds::batch_job::COMPLETION_INDEX_LABEL
        || key == crate::topology::POD_SET_LABEL
        || key == crate::topology::SLICE_LABEL
        || key == crate::backend::LINKED_ANNOTATION
        || crate::backend::BACKENDS.iter().any(|b| {
            matches!(b.backend().link_key(),
                crate::backend::LinkKey::Label(k) | crate::backend::LinkKey::Annotation(k) if k == key)
        })
}

/// An object name: at most 253 characters, else `None`.
fn object_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = Option::<String>::deserialize(d)?;
    Ok(name.filter(|n| n.len() <= 253))
}

/// A map of strings, keeping only the [`read_key`] entries (`None` for null).
fn picked<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Visit;
    impl<'de> serde::de::Visitor<'de> for Visit {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> Result<Self::Value, A::Error> {
            let mut kept = BTreeMap::new();
            while let Some(key) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                if !read_key(&key) {
                    m.next_value::<StringOnly>()?;
                    continue;
                }
                if kept.len() == MAX_PICKED {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_PICKED} keys the webhook reads"
                    )));
                }
                kept.insert(key.into_owned(), m.next_value::<String>()?);
            }
            Ok(Some(kept))
        }
    }
    d.deserialize_any(Visit)
}

/// A string value that is checked and dropped.
struct StringOnly;

impl<'de> Deserialize<'de> for StringOnly {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = StringOnly;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, _: &str) -> Result<StringOnly, E> {
                Ok(StringOnly)
            }
        }
        d.deserialize_str(Visit)
    }
}

/// The owner references, keeping only controllers (`None` for null).
fn controllers<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<OwnerReference>>, D::Error> {
    struct Visit;
    impl<'de> serde::de::Visitor<'de> for Visit {
        type Value = Option<Vec<OwnerReference>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of owner references")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut s: A,
        ) -> Result<Self::Value, A::Error> {
            let mut kept = Vec::new();
            while let Some(r) = s.next_element::<OwnerReference>()? {
                if r.controller != Some(true) {
                    continue;
                }
                if kept.len() == MAX_PICKED {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_PICKED} controller references"
                    )));
                }
                kept.push(r);
            }
            Ok(Some(kept))
        }
    }
    d.deserialize_any(Visit)
}

/// The pod spec fields the decision reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    #[serde(default)]
    scheduler_name: Option<String>,
    /// Present (whatever its content) or not.
    #[serde(default)]
    scheduling_group: Option<IgnoredAny>,
}

/// The pod's two parts, each read on its own so that an error names the part.
#[derive(Debug, Deserialize)]
struct PodParts<'a> {
    #[serde(default, borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(default, borrow)]
    spec: Option<&'a RawValue>,
}

/// The pod fields the decision reads, parsed from the request's object.
#[derive(Debug)]
pub struct Pod {
    pub metadata: PodMeta,
    pub scheduler_name: Option<String>,
    /// Whether the pod already names a scheduling group (`spec.schedulingGroup`, the native
    /// backend's link), whatever its content.
    pub scheduling_group: bool,
}

/// Parses an AdmissionReview body; the error says what is wrong with it.
pub fn parse(body: &[u8]) -> Result<Request<'_>, String> {
    let review: Review =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    if review.api_version != API_VERSION || review.kind != "AdmissionReview" {
        return Err(format!(
            "expected {API_VERSION} AdmissionReview, got {} {}",
            review.api_version, review.kind
        ));
    }
    review
        .request
        .ok_or_else(|| "the AdmissionReview has no request".to_string())
}

/// The pod of a request, or what is wrong with it.
pub fn pod(request: &Request) -> Result<Pod, String> {
    let object = request.object.ok_or("the request has no object")?;
    let parts: PodParts = serde_json::from_str(object.get()).map_err(|e| format!("pod: {e}"))?;
    let metadata = match parts.metadata {
        Some(m) => serde_json::from_str::<Option<PodMeta>>(m.get())
            .map_err(|e| format!("pod metadata: {e}"))?
            .unwrap_or_default(),
        None => PodMeta::default(),
    };
    let spec = match parts.spec {
        Some(s) => serde_json::from_str::<Option<PodSpec>>(s.get())
            .map_err(|e| format!("pod spec: {e}"))?
            .unwrap_or_default(),
        None => PodSpec::default(),
    };
    Ok(Pod {
        metadata,
        scheduler_name: spec.scheduler_name,
        scheduling_group: spec.scheduling_group.is_some(),
    })
}

/// The `request.uid` of an AdmissionReview from its first bytes, for an answer without reading
/// the rest: the API server writes the request's `uid` first (`{"kind":…,"apiVersion":…,
/// "request":{"uid":"…"`). `None` when it is not there or is not a UID's characters.
pub fn uid_from_prefix(prefix: &[u8]) -> Option<&str> {
    const KEY: &[u8] = br#""request":{"uid":""#;
    let at = prefix.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &prefix[at..];
    let len = rest.iter().position(|b| *b == b'"')?;
    let uid = std::str::from_utf8(&rest[..len]).ok()?;
    let valid = !uid.is_empty()
        && uid.len() <= 128
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    valid.then_some(uid)
}

/// The response: allowed, with the JSON Patch when there is one, and warnings for the client.
pub fn response(uid: &str, patch: Option<&Value>, warnings: &[String]) -> Vec<u8> {
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(p) = patch {
        let bytes = serde_json::to_vec(p).expect("a JSON value serialises");
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    serde_json::to_vec(&json!({
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "response": response,
    }))
    .expect("a JSON value serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_that_is_not_one_is_refused_with_the_reason() {
        assert!(
            parse(b"{")
                .unwrap_err()
                .starts_with("not an AdmissionReview")
        );
        let v1beta1 = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#;
        assert!(
            parse(v1beta1)
                .unwrap_err()
                .contains("expected admission.k8s.io/v1")
        );
        let empty = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        assert_eq!(
            parse(empty).unwrap_err(),
            "the AdmissionReview has no request"
        );
    }

    /// SPEC §13: the indices slices are cut by survive the parse (without them no pod got its
    /// slice label and a sliced JobSet's gang could never be placed: found end to end).
    #[test]
    fn rule_13_the_index_labels_slices_are_cut_by_are_read() {
        for key in [
            "jobset.sigs.k8s.io/job-index",
            "batch.kubernetes.io/job-completion-index",
            "training.kubeflow.org/replica-index",
            "leaderworkerset.sigs.k8s.io/worker-index",
            "podgroup-sync.io/pod-set",
            "podgroup-sync.io/slice",
        ] {
            assert!(read_key(key), "{key}");
        }
        assert!(!read_key("app.kubernetes.io/name"));
    }

    /// The labels the pod-link decision reads survive the parse: a JobSet's pod is found
    /// through its batch/v1 Job by the JobSet's label, not taken for the plain Job (which is
    /// what happened when only the Kubeflow labels were kept).
    #[test]
    fn every_label_the_decision_reads_is_kept() {
        let object = r#"{"metadata":{"labels":{"jobset.sigs.k8s.io/jobset-name":"js",
            "jobset.sigs.k8s.io/replicatedjob-name":"workers","ray.io/group":"gpu",
            "ray.io/cluster":"rc","batch.kubernetes.io/job-name":"js-workers-0","other":"x"},
            "ownerReferences":[{"apiVersion":"batch/v1","kind":"Job","name":"js-workers-0",
            "uid":"j","controller":true}]}}"#;
        let body = format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u",
            "kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"CREATE","object":{object}}}}}"#
        );
        let request = parse(body.as_bytes()).unwrap();
        let pod = pod(&request).unwrap();
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels.len(), 5, "{labels:?}");
        let owners = pod.metadata.owner_references.clone().unwrap_or_default();
        let view = crate::webhook::link::PodView {
            name: None,
            labels: Some(&labels),
            annotations: None,
            owner_references: &owners,
            scheduler_name: None,
            scheduling_group: false,
        };
        let owner = crate::webhook::link::owner_of(&view).unwrap();
        assert_eq!(
            (
                owner.kind.kind,
                owner.name.as_str(),
                owner.pod_set.as_deref()
            ),
            ("JobSet", "js", Some("workers"))
        );
    }

    #[test]
    fn a_malformed_pod_is_an_error_not_a_panic() {
        let review = |object: &str| {
            let body = format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u",
                "kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"CREATE","object":{object}}}}}"#
            );
            let body: &'static [u8] = Box::leak(body.into_bytes().into_boxed_slice());
            parse(body).unwrap()
        };
        assert!(
            pod(&review(r#"{"metadata":{"labels":"no"}}"#))
                .unwrap_err()
                .starts_with("pod metadata")
        );
        assert!(
            pod(&review(r#"{"spec":{"schedulerName":7}}"#))
                .unwrap_err()
                .starts_with("pod spec")
        );
        assert!(pod(&review("7")).unwrap_err().starts_with("pod:"));
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(
            pod(&review(&deep)).is_err(),
            "nesting is refused, not recursed into"
        );
        let bodies: Vec<String> = ["{}", r#"{"metadata":null,"spec":null}"#]
            .iter()
            .map(|o| o.to_string())
            .collect();
        for o in &bodies {
            assert!(pod(&review(o)).is_ok(), "{o}");
        }
        let ok = pod(&review(
            r#"{"metadata":{"name":"p"},"spec":{"schedulerName":"volcano"}}"#,
        ))
        .unwrap();
        assert_eq!(ok.scheduler_name.as_deref(), Some("volcano"));
        assert!(review("{}").is_pod_create());
    }

    #[test]
    fn only_the_keys_and_owners_the_decision_reads_are_kept() {
        let mut labels: serde_json::Map<String, Value> = (0..10_000)
            .map(|i| (format!("example.com/l{i}"), json!("v")))
            .collect();
        labels.insert("training.kubeflow.org/job-name".into(), json!("train"));
        labels.insert("scheduling.x-k8s.io/pod-group".into(), json!("train"));
        let object = json!({"metadata": {"labels": labels,
            "annotations": {"example.com/blob": "x", "podgroup-sync.io/pod-group": "train"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "1"},
                {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train", "uid": "2", "controller": true}]}});
        let body = review_body(&object.to_string());
        let p = pod(&parse(&body).unwrap()).unwrap();
        let kept: Vec<&String> = p.metadata.labels.as_ref().unwrap().keys().collect();
        assert_eq!(
            kept,
            [
                "scheduling.x-k8s.io/pod-group",
                "training.kubeflow.org/job-name"
            ]
        );
        let annotations = p.metadata.annotations.unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["podgroup-sync.io/pod-group"]
        );
        let owners = p.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].name, "train");
        // An empty map is still a map (the patch must not create it again).
        let body = review_body(r#"{"metadata":{"labels":{"a":"b"},"annotations":null}}"#);
        let p = pod(&parse(&body).unwrap()).unwrap();
        assert_eq!(p.metadata.labels, Some(BTreeMap::new()));
        assert_eq!(p.metadata.annotations, None);
        // More keys of the kinds read than any real pod has: malformed, not kept.
        let many: serde_json::Map<String, Value> = (0..=MAX_PICKED)
            .map(|i| (format!("training.kubeflow.org/k{i}"), json!("v")))
            .collect();
        let body = review_body(&json!({"metadata": {"labels": many}}).to_string());
        let e = pod(&parse(&body).unwrap()).unwrap_err();
        assert!(
            e.starts_with("pod metadata") && e.contains("more than"),
            "{e}"
        );
        // Values of skipped keys are still checked.
        let body = review_body(r#"{"metadata":{"labels":{"a":7}}}"#);
        assert!(pod(&parse(&body).unwrap()).is_err());
    }

    fn review_body(object: &str) -> Vec<u8> {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u",
            "kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"CREATE","object":{object}}}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn the_uid_is_found_in_the_first_bytes_the_api_server_sends() {
        let body = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"0b9c6d6e-1f1a-4c4e-9b1e-3c2f4a5b6c7d","kind":{"group":""#;
        assert_eq!(
            uid_from_prefix(body),
            Some("0b9c6d6e-1f1a-4c4e-9b1e-3c2f4a5b6c7d")
        );
        assert_eq!(uid_from_prefix(br#"{"request":{"uid":"a\"b"}}"#), None);
        assert_eq!(uid_from_prefix(br#"{"request":{"uid":""}}"#), None);
        assert_eq!(uid_from_prefix(br#"{"request":{"uid":"unterminated"#), None);
        assert_eq!(uid_from_prefix(b"[[],[],[]]"), None);
    }

    #[test]
    fn the_response_allows_and_carries_the_patch_in_base64() {
        let patch = json!([{"op": "add", "path": "/spec/schedulerName", "value": "volcano"}]);
        let body: Value = serde_json::from_slice(&response("u-1", Some(&patch), &[])).unwrap();
        assert_eq!(body["response"]["allowed"], true);
        assert_eq!(body["response"]["uid"], "u-1");
        assert_eq!(body["response"]["patchType"], "JSONPatch");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(body["response"]["patch"].as_str().unwrap())
            .unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&decoded).unwrap(), patch);
        let plain: Value = serde_json::from_slice(&response("u-2", None, &[])).unwrap();
        assert!(plain["response"].get("patch").is_none());
    }
}
