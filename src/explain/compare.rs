//! `explain --job`: the PodGroup podgroup-sync would apply for a job in the cluster, compared
//! with the one the cluster holds, and why they differ (pure; the caller reads the cluster).

use std::collections::BTreeMap;
use std::fmt::Write;

use kube::api::DynamicObject;
use serde_json::Value;

use super::Explained;
use crate::backend::SIZING_FIELDS;
use crate::enablement::{Enablement, Mode};
use crate::quantity::Quantity;
use crate::target::ours;

/// Why podgroup-sync keeps no PodGroup for this job, if it keeps none.
fn no_pod_group(
    e: &Explained,
    ns_annotations: Option<&BTreeMap<String, String>>,
    key: &str,
) -> Option<String> {
    let enablement = Enablement {
        annotation_key: key.to_string(),
        default_mode: Mode::Off,
        default_backend: e.backend,
    };
    let job = &e.job;
    if job.finished {
        return Some("the job has finished (Succeeded or Failed): its PodGroup is deleted unless the controller runs with --keep-finished".into());
    }
    if job.suspended() {
        return Some(
            "the job is suspended: its PodGroup is deleted and recreated on resume".into(),
        );
    }
    if enablement.job_opted_out(job) {
        return Some(format!("the job opts out ({key}: \"false\")"));
    }
    if job.managed_elsewhere() {
        return Some("runPolicy.managedBy names another controller".into());
    }
    match ns_annotations.and_then(|a| a.get(key)).map(String::as_str) {
        Some("true") => None,
        Some("dry-run") => Some(format!(
            "namespace {} is in dry-run mode: podgroup-sync only reports (WouldCreatePodGroup Events)",
            job.namespace
        )),
        None => Some(format!(
            "namespace {} has no {key} annotation: it is managed only if the controller runs with --default-mode true",
            job.namespace
        )),
        Some(v) => Some(format!(
            "namespace {} has {key}: {v:?}: podgroup-sync is off there",
            job.namespace
        )),
    }
}

/// The fields of `desired` that `actual` lacks or holds another value for, as
/// `path: the cluster has X, podgroup-sync applies Y` (quantities compared by value).
pub fn differences(desired: &Value, actual: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk("", desired, Some(actual), false, &mut out);
    out
}

fn walk(path: &str, d: &Value, a: Option<&Value>, quantities: bool, out: &mut Vec<String>) {
    match (d, a) {
        (Value::Object(dm), Some(Value::Object(am))) => {
            for (k, dv) in dm {
                if k == "resourceVersion" {
                    continue;
                }
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(&p, dv, am.get(k), quantities || k == "minResources", out);
            }
        }
        (d, Some(a)) if quantities => {
            let q = |v: &Value| match v {
                Value::String(s) => s.parse::<Quantity>().ok(),
                Value::Number(n) => n.to_string().parse().ok(),
                _ => None,
            };
            if q(d).is_none_or(|dq| Some(dq) != q(a)) && d != a {
                out.push(format!(
                    "{path}: the cluster has {a}, podgroup-sync applies {d}"
                ));
            }
        }
        (Value::Array(dl), Some(Value::Array(al))) => {
            let missing = dl
                .iter()
                .any(|dv| !al.iter().any(|av| differences(dv, av).is_empty()));
            if missing {
                out.push(format!(
                    "{path}: the cluster has {}, podgroup-sync applies {}",
                    Value::Array(al.clone()),
                    d
                ));
            }
        }
        (d, Some(a)) if d != a => {
            out.push(format!(
                "{path}: the cluster has {a}, podgroup-sync applies {d}"
            ));
        }
        (_, Some(_)) => {}
        (d, None) => out.push(format!(
            "{path}: absent in the cluster, podgroup-sync applies {d}"
        )),
    }
}

/// The comparison `explain --job` prints (`# ` lines). `actual`: the cluster's PodGroup of that
/// backend and name; `key`: the enablement annotation.
pub fn compare(
    e: &Explained,
    actual: Option<&Value>,
    ns_annotations: Option<&BTreeMap<String, String>>,
    key: &str,
) -> String {
    let mut out = String::new();
    let name = e.object["metadata"]["name"].as_str().unwrap_or_default();
    let what = format!("{} PodGroup {}/{name}", e.backend, e.job.namespace);
    let _ = writeln!(out, "# compared with the cluster:");
    if let Some(why) = no_pod_group(e, ns_annotations, key) {
        let _ = writeln!(
            out,
            "#   podgroup-sync keeps no PodGroup for this job: {why}"
        );
        if actual.is_some() {
            let _ = writeln!(
                out,
                "#   yet the cluster holds {what}: a PodGroup of ours is deleted at the next reconcile or audit; one that is not ours is left alone"
            );
        }
        return out;
    }
    let Some(actual) = actual else {
        let _ = writeln!(
            out,
            "#   the cluster has no {what}: the controller creates it at its next reconcile; if it does not, check that podgroup-sync runs and leads, that it watches {} (is its CRD served?), and the job's Events",
            e.job.kind.kind
        );
        return out;
    };
    let pg: Option<DynamicObject> = serde_json::from_value(actual.clone()).ok();
    // The installation the explanation was made for, as its object's labels name it.
    let instance = e.object["metadata"]["labels"][crate::backend::INSTANCE_LABEL]
        .as_str()
        .unwrap_or_default();
    if !pg.as_ref().is_some_and(|pg| ours(pg, &e.job.uid, instance)) {
        let _ = writeln!(
            out,
            "#   {what} exists but was not made by podgroup-sync for this job (another controller, or the operator's own gang mode): it is left untouched and the job gets PodGroupConflict"
        );
        return out;
    }
    let diffs = differences(&e.object, actual);
    if diffs.is_empty() {
        let _ = writeln!(out, "#   {what} holds exactly what podgroup-sync applies");
        return out;
    }
    let _ = writeln!(out, "#   {what} differs from what podgroup-sync applies:");
    for d in &diffs {
        let _ = writeln!(out, "#     {d}");
    }
    let sizing = diffs.iter().any(|d| {
        SIZING_FIELDS
            .iter()
            .any(|f| d.starts_with(&format!("spec.{f}")))
    });
    if sizing {
        let _ = writeln!(
            out,
            "#   a size that differs is kept on purpose when the controller runs with --resize while-suspended or never"
        );
    }
    let _ = writeln!(
        out,
        "#   otherwise the job changed since the last reconcile, or the controller is not running or not leading (see its podgroup_sync_leader metric and logs)"
    );
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::backend::BackendOptions;
    use crate::explain::{Surroundings, explain_job};

    fn explained() -> (Value, Explained) {
        let job: Value =
            serde_yaml_ng::from_str(include_str!("../../examples/pytorchjob.yaml")).unwrap();
        let mut job = job;
        job["metadata"]["uid"] = json!("u1");
        let e = explain_job(
            &job,
            &Surroundings {
                from_cluster: true,
                ..Default::default()
            },
            None,
            None,
            &BackendOptions::default(),
        )
        .unwrap();
        (job, e)
    }

    #[test]
    fn explain_job_says_why_the_cluster_differs() {
        let (_, e) = explained();
        let on: BTreeMap<String, String> =
            [("podgroup-sync.io/enabled".into(), "true".into())].into();
        let key = "podgroup-sync.io/enabled";
        let same = e.object.clone();
        assert!(
            compare(&e, Some(&same), Some(&on), key)
                .contains("holds exactly what podgroup-sync applies")
        );
        let mut smaller = e.object.clone();
        smaller["spec"]["minMember"] = json!(3);
        smaller["spec"]["minResources"]["cpu"] = json!("14000m");
        let out = compare(&e, Some(&smaller), Some(&on), key);
        assert!(
            out.contains("spec.minMember: the cluster has 3, podgroup-sync applies 4"),
            "{out}"
        );
        assert!(
            !out.contains("spec.minResources.cpu"),
            "14000m equals 14: {out}"
        );
        assert!(out.contains("--resize while-suspended or never"), "{out}");
        let mut foreign = e.object.clone();
        foreign["metadata"]["labels"] = json!({});
        assert!(compare(&e, Some(&foreign), Some(&on), key).contains("not made by podgroup-sync"));
        assert!(
            compare(&e, None, Some(&on), key)
                .contains("the cluster has no scheduler-plugins PodGroup")
        );
        assert!(
            compare(&e, None, None, key).contains("has no podgroup-sync.io/enabled annotation")
        );
    }
}
