//! Reading what every kind's spec has: pod templates and small counts, with the operators'
//! checks, so that each kind's file reads only its own fields.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

use crate::workload::InvalidJob;

/// A pod template as the operators require it: present, well-formed, with containers.
pub fn pod_template(set: &str, template: Option<Value>) -> Result<PodTemplateSpec, InvalidJob> {
    let template = match template {
        None | Some(Value::Null) => return Err(InvalidJob::MissingTemplate(set.to_string())),
        Some(t) => serde_json::from_value::<PodTemplateSpec>(t)
            .map_err(|e| InvalidJob::InvalidTemplate(set.to_string(), e.to_string()))?,
    };
    match &template.spec {
        None => Err(InvalidJob::MissingTemplate(set.to_string())),
        Some(spec) if spec.containers.is_empty() => Err(InvalidJob::NoContainers(set.to_string())),
        Some(_) => Ok(template),
    }
}

/// A non-negative count at `field` of `obj` (`default` when absent or null), as the API server
/// would have validated it; a pod set name `set` for the error.
pub fn count(obj: &Value, field: &str, default: u64, set: &str) -> Result<u64, InvalidJob> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| InvalidJob::InvalidReplicas(format!("{set} {field}"), v.to_string())),
    }
}

/// A boolean at `field` of `obj` (false when absent).
pub fn flag(obj: &Value, field: &str) -> bool {
    obj.get(field).and_then(Value::as_bool).unwrap_or(false)
}

/// A string at `field` of `obj`.
pub fn text<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get(field).and_then(Value::as_str)
}
