//! The `admission.k8s.io/v1` AdmissionReview wire format: the request fields the webhook reads
//! and the response it sends (always allowed; a JSON Patch when something is added).

use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Value, json};

pub const API_VERSION: &str = "admission.k8s.io/v1";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    api_version: String,
    kind: String,
    request: Option<Request>,
}

/// The fields of an AdmissionRequest the webhook reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub uid: String,
    pub kind: Kind,
    pub operation: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub object: Option<Value>,
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

impl Request {
    /// A Pod CREATE, the only request the webhook acts on.
    pub fn is_pod_create(&self) -> bool {
        self.kind.group.is_empty()
            && self.kind.version == "v1"
            && self.kind.kind == "Pod"
            && self.operation == "CREATE"
    }
}

/// The pod fields the decision reads, parsed from the request's object.
#[derive(Debug)]
pub struct Pod {
    pub metadata: ObjectMeta,
    pub scheduler_name: Option<String>,
    /// Whether the pod already names a scheduling group (`spec.schedulingGroup`, the native
    /// backend's link), whatever its content.
    pub scheduling_group: bool,
}

/// Parses an AdmissionReview body; the error says what is wrong with it.
pub fn parse(body: &[u8]) -> Result<Request, String> {
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
    let object = request.object.as_ref().ok_or("the request has no object")?;
    let metadata = match object.get("metadata") {
        Some(m) => ObjectMeta::deserialize(m).map_err(|e| format!("pod metadata: {e}"))?,
        None => ObjectMeta::default(),
    };
    let scheduler_name = match object.pointer("/spec/schedulerName") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(format!("pod spec.schedulerName is not a string: {other}")),
    };
    let scheduling_group = !matches!(
        object.pointer("/spec/schedulingGroup"),
        None | Some(Value::Null)
    );
    Ok(Pod {
        metadata,
        scheduler_name,
        scheduling_group,
    })
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
            parse(body.as_bytes()).unwrap()
        };
        assert!(
            pod(&review(r#"{"metadata":{"labels":"no"}}"#))
                .unwrap_err()
                .starts_with("pod metadata")
        );
        assert!(
            pod(&review(r#"{"spec":{"schedulerName":7}}"#))
                .unwrap_err()
                .contains("not a string")
        );
        let ok = pod(&review(
            r#"{"metadata":{"name":"p"},"spec":{"schedulerName":"volcano"}}"#,
        ))
        .unwrap();
        assert_eq!(ok.scheduler_name.as_deref(), Some("volcano"));
        assert!(review("{}").is_pod_create());
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
