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

/// The pod metadata the decision reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMeta {
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub owner_references: Option<Vec<OwnerReference>>,
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
