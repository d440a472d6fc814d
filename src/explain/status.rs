//! `podgroup-sync status NAMESPACE/NAME` (and `kubectl podgroup-sync status`): a job's gang, its
//! PodGroup, its pods, the last Events and what blocks it — rendered from what the caller read
//! (pure; `cli::status` reads the cluster).

use std::fmt::Write;

use serde_json::Value;

use super::Explained;
use crate::reason::{EventType, Reason};

/// A pod of the job, as `status` shows it.
#[derive(Debug, Clone, Default)]
pub struct PodState {
    pub name: String,
    /// `status.phase` (Pending, Running, ...).
    pub phase: String,
    pub node: Option<String>,
    /// Whether it carries the link to a PodGroup of any backend.
    pub linked: bool,
    /// The message of a `PodScheduled: False` condition, if the scheduler left one.
    pub unschedulable: Option<String>,
}

/// An Event on the job, its PodGroup or one of its pods.
#[derive(Debug, Clone, Default)]
pub struct EventLine {
    /// Seconds since it last happened, if the Event says when.
    pub ago_seconds: Option<i64>,
    /// Normal or Warning.
    pub type_: String,
    pub reason: String,
    /// `Kind/name` of the object it is about.
    pub object: String,
    pub message: String,
    pub count: i32,
}

/// Everything `status` prints.
pub struct StatusInput<'a> {
    pub explained: &'a Explained,
    /// `explain --job`'s comparison (`# ` lines).
    pub comparison: &'a str,
    /// The cluster's PodGroup of the job's backend and name.
    pub pod_group: Option<&'a Value>,
    pub pods: &'a [PodState],
    /// Oldest first; the caller keeps the last few.
    pub events: &'a [EventLine],
}

/// The number of pods the PodGroup needs together, whichever backend's field holds it.
pub fn min_count(pod_group: &Value) -> Option<u64> {
    let spec = pod_group.get("spec")?;
    spec.get("minMember")
        .or_else(|| spec.pointer("/schedulingPolicy/gang/minCount"))
        .and_then(Value::as_u64)
}

fn ago(seconds: Option<i64>) -> String {
    match seconds {
        None => "?".into(),
        Some(s) if s < 120 => format!("{}s", s.max(0)),
        Some(s) if s < 7200 => format!("{}m", s / 60),
        Some(s) if s < 172_800 => format!("{}h", s / 3600),
        Some(s) => format!("{}d", s / 86_400),
    }
}

/// One line for the PodGroup's status: its phase, its counters and its newest condition.
fn pod_group_status(pg: &Value) -> String {
    let Some(status) = pg.get("status").and_then(Value::as_object) else {
        return "no status yet (no scheduler has looked at it)".into();
    };
    let mut parts = Vec::new();
    if let Some(phase) = status.get("phase").and_then(Value::as_str) {
        parts.push(format!("phase {phase}"));
    }
    for (k, v) in status {
        if let Some(n) = v.as_i64() {
            parts.push(format!("{k} {n}"));
        }
    }
    let newest = status
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|c| {
            c.iter()
                .max_by_key(|c| c["lastTransitionTime"].as_str().unwrap_or_default())
        });
    if let Some(c) = newest {
        let field = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        parts.push(format!(
            "condition {}={} {}: {}",
            field("type"),
            field("status"),
            field("reason"),
            field("message")
        ));
    }
    if parts.is_empty() {
        "an empty status".into()
    } else {
        parts.join(", ")
    }
}

/// What keeps the job from running whole, the most fundamental cause first.
pub fn blocker(input: &StatusInput) -> String {
    let e = input.explained;
    let first_comparison_line = input
        .comparison
        .lines()
        .nth(1)
        .map(|l| l.trim_start_matches('#').trim().to_string())
        .unwrap_or_default();
    // No PodGroup kept, none made yet, or someone else's: nothing else matters before that.
    let no_gang = input.pod_group.is_none()
        || !(input.comparison.contains("holds exactly")
            || input.comparison.contains("differs from what"));
    if no_gang {
        return first_comparison_line;
    }
    let unlinked: Vec<&str> = input
        .pods
        .iter()
        .filter(|p| !p.linked && p.phase != "Succeeded" && p.phase != "Failed")
        .map(|p| p.name.as_str())
        .collect();
    if !unlinked.is_empty() {
        return format!(
            "{} pod(s) carry no link to the PodGroup ({}): they were created while the pod-link webhook was not answering; delete them and the operator recreates them linked",
            unlinked.len(),
            unlinked.join(", ")
        );
    }
    let needed = input.pod_group.and_then(min_count).unwrap_or(0) as usize;
    let running = input.pods.iter().filter(|p| p.phase == "Running").count();
    let done = input.pods.iter().filter(|p| p.phase == "Succeeded").count();
    if needed > 0 && running + done >= needed {
        return format!(
            "nothing: the gang runs ({running} pod(s) Running, {done} Succeeded; it needs {needed} together)"
        );
    }
    // podgroup-sync's newest Warning says more than the scheduler's per-pod message: it names
    // the gang, its PodGroup and what it is held to.
    let ours = input.events.iter().rev().find(|ev| {
        Reason::ALL.iter().any(|r| {
            r.as_str() == ev.reason && r.type_() == EventType::Warning && ev.type_ == "Warning"
        })
    });
    if let Some(ev) = ours {
        return format!(
            "{} ({} ago): {}",
            ev.reason,
            ago(ev.ago_seconds),
            ev.message
        );
    }
    if let Some(p) = input.pods.iter().find(|p| p.unschedulable.is_some()) {
        return format!(
            "the scheduler: pod {} is unschedulable: {}",
            p.name,
            p.unschedulable.as_deref().unwrap_or_default()
        );
    }
    if needed > input.pods.len() {
        return format!(
            "the {} operator has created {} of the {needed} pods the gang needs together",
            e.job.kind.kind,
            input.pods.len()
        );
    }
    if first_comparison_line.contains("differs") {
        return first_comparison_line;
    }
    format!(
        "nothing podgroup-sync can see: {running} of {needed} pods Running; the pods' Events and the scheduler's logs say more"
    )
}

/// The whole `status` text.
pub fn render(input: &StatusInput) -> String {
    let e = input.explained;
    let mut out = String::new();
    let name = e.object["metadata"]["name"].as_str().unwrap_or_default();
    let _ = writeln!(
        out,
        "Job:       {} {}/{}",
        e.job.kind.kind, e.job.namespace, e.job.name
    );
    let wants = serde_json::to_string(&e.object["spec"]).unwrap_or_default();
    let _ = writeln!(out, "Gang:      {} PodGroup {name}: {wants}", e.backend);
    match input.pod_group {
        Some(pg) => {
            let _ = writeln!(out, "PodGroup:  {}", pod_group_status(pg));
        }
        None => {
            let _ = writeln!(out, "PodGroup:  none in the cluster");
        }
    }
    for line in input.comparison.lines().skip(1) {
        let _ = writeln!(out, "           {}", line.trim_start_matches('#').trim());
    }
    let count = |phase: &str| input.pods.iter().filter(|p| p.phase == phase).count();
    let unlinked = input.pods.iter().filter(|p| !p.linked).count();
    let _ = writeln!(
        out,
        "Pods:      {} ({} Running, {} Pending, {} Succeeded, {} Failed; {unlinked} not linked)",
        input.pods.len(),
        count("Running"),
        count("Pending"),
        count("Succeeded"),
        count("Failed")
    );
    for p in input.pods {
        let _ = writeln!(
            out,
            "           {} {}{}{}",
            p.name,
            p.phase,
            p.node
                .as_deref()
                .map(|n| format!(" on {n}"))
                .unwrap_or_default(),
            if p.linked { "" } else { " (not linked)" }
        );
    }
    let _ = writeln!(out, "Events:    {}", input.events.len());
    for ev in input.events {
        let times = if ev.count > 1 {
            format!(" (x{})", ev.count)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  {:>4} ago  {} {}{times}  {}: {}",
            ago(ev.ago_seconds),
            ev.type_,
            ev.reason,
            ev.object,
            ev.message
        );
    }
    let _ = writeln!(out, "Blocked by: {}", blocker(input));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::backend::BackendOptions;
    use crate::explain::{Surroundings, explain_job};

    fn explained() -> Explained {
        let mut job: Value =
            serde_yaml_ng::from_str(include_str!("../../examples/pytorchjob.yaml")).unwrap();
        job["metadata"]["uid"] = json!("u1");
        let around = Surroundings {
            from_cluster: true,
            ..Default::default()
        };
        explain_job(&job, &around, None, None, &BackendOptions::default()).unwrap()
    }

    fn pod(name: &str, phase: &str, linked: bool) -> PodState {
        PodState {
            name: name.into(),
            phase: phase.into(),
            linked,
            ..Default::default()
        }
    }

    const SAME: &str = "# compared with the cluster:\n#   scheduler-plugins PodGroup x/y holds exactly what podgroup-sync applies\n";

    #[test]
    fn the_most_fundamental_cause_is_named_first() {
        let e = explained();
        let pg = e.object.clone();
        let needed = min_count(&pg).unwrap() as usize;
        assert_eq!(needed, 4);
        let pending: Vec<PodState> = (0..needed)
            .map(|i| pod(&format!("p{i}"), "Pending", true))
            .collect();
        let unschedulable = EventLine {
            ago_seconds: Some(30),
            type_: "Warning".into(),
            reason: "GangUnschedulable".into(),
            object: "PyTorchJob/y".into(),
            message: "0/3 nodes are available".into(),
            count: 2,
        };
        let scheduler = EventLine {
            reason: "FailedScheduling".into(),
            ..unschedulable.clone()
        };
        let status = |pods: &[PodState], events: &[EventLine], comparison: &str| {
            let input = StatusInput {
                explained: &e,
                comparison,
                pod_group: Some(&pg),
                pods,
                events,
            };
            (blocker(&input), render(&input))
        };
        let (b, text) = status(&pending, &[unschedulable.clone(), scheduler.clone()], SAME);
        assert_eq!(b, "GangUnschedulable (30s ago): 0/3 nodes are available");
        assert!(text.contains("4 (0 Running, 4 Pending"), "{text}");
        assert!(text.contains("GangUnschedulable (x2)"), "{text}");

        // No Event of ours: the scheduler's condition on a pod.
        let mut refused = pending.clone();
        refused[2].unschedulable = Some("0/3 nodes: Insufficient nvidia.com/gpu".into());
        assert!(
            status(&refused, &[scheduler], SAME)
                .0
                .contains("pod p2 is unschedulable: 0/3 nodes")
        );
        // An unlinked pod comes before any scheduler message.
        let mut unlinked = pending.clone();
        unlinked[1].linked = false;
        assert!(
            status(&unlinked, std::slice::from_ref(&unschedulable), SAME)
                .0
                .starts_with("1 pod(s) carry no link to the PodGroup (p1)")
        );
        // The operator has not made all the pods.
        assert!(
            status(&pending[..2], &[], SAME)
                .0
                .contains("has created 2 of the 4 pods")
        );
        // Running whole: nothing blocks.
        let running: Vec<PodState> = (0..needed)
            .map(|i| pod(&format!("p{i}"), "Running", true))
            .collect();
        assert!(
            status(&running, &[unschedulable], SAME)
                .0
                .starts_with("nothing: the gang runs")
        );
        // No PodGroup kept: the comparison's reason, before any pod.
        let off = "# compared with the cluster:\n#   podgroup-sync keeps no PodGroup for this job: namespace x has no podgroup-sync.io/enabled annotation\n";
        let input = StatusInput {
            explained: &e,
            comparison: off,
            pod_group: None,
            pods: &pending,
            events: &[],
        };
        assert!(blocker(&input).starts_with("podgroup-sync keeps no PodGroup"));
        assert!(render(&input).contains("PodGroup:  none in the cluster"));
    }

    #[test]
    fn the_pod_group_status_is_one_line_whatever_the_backend() {
        let volcano = json!({"status": {"phase": "Pending", "running": 0, "conditions": [
            {"type": "Scheduled", "status": "True", "lastTransitionTime": "2026-12-07T05:00:00Z"},
            {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
             "message": "4/4 tasks in gang unschedulable", "lastTransitionTime": "2026-12-07T06:00:00Z"}]}});
        let line = pod_group_status(&volcano);
        assert_eq!(
            line,
            "phase Pending, running 0, condition Unschedulable=True NotEnoughResources: 4/4 tasks in gang unschedulable"
        );
        assert!(pod_group_status(&json!({})).starts_with("no status yet"));
        assert_eq!(
            min_count(&json!({"spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}})),
            Some(3)
        );
        assert_eq!(ago(Some(7300)), "2h");
    }
}
