//! Quota coherence with Kueue (SPEC §12), pure: the gang's requests against what Kueue admitted,
//! the cap on a Volcano PodGroup's minResources, and a gang timeout that outlasts Kueue's
//! `waitForPodsReady`.

use std::time::Duration;

use super::Admission;
use crate::backend::BackendKind;
use crate::gang::{Gang, MinResources};
use crate::quantity::Quantity;
use crate::reason::Reason;
use crate::resources::{ResourceError, ResourceMap, add_into, scale};

/// What the planner takes from Kueue for one gang.
#[derive(Debug, Default)]
pub struct Review {
    /// The gang with minResources capped at Kueue's admission (Volcano only), when that
    /// changes it.
    pub capped: Option<Gang>,
    /// The Events: quota that differs, a timeout that outlasts Kueue's.
    pub events: Vec<(Reason, String)>,
}

/// Reviews one active job's gang against its admitted Workload and Kueue's `waitForPodsReady`
/// timeout. `schedule_timeout_seconds` is the scheduler-plugins PodGroup's (`None` on the other
/// backends); `queued` says the job names a Kueue queue.
pub fn review(
    gang: &Gang,
    backend: BackendKind,
    admission: Option<&Admission>,
    queued: bool,
    schedule_timeout_seconds: Option<i32>,
    pods_ready: Option<Duration>,
) -> Review {
    let mut review = Review::default();
    if let Some(a) = admission.filter(|a| a.admitted && !a.pod_sets.is_empty()) {
        let kueue = a.admitted_usage();
        match gang_requests(gang) {
            Ok(pods) => {
                let diffs = differences(&pods, &kueue);
                if !diffs.is_empty() {
                    review
                        .events
                        .push((Reason::KueueQuotaDiffers, describe(&a.workload, &diffs)));
                }
            }
            Err(e) => review.events.push((
                Reason::KueueQuotaDiffers,
                format!("the gang's requests cannot be added up to compare with Kueue's: {e}"),
            )),
        }
        if let (BackendKind::Volcano, MinResources::Computed(min)) = (backend, &gang.min_resources)
        {
            let capped = cap(min, &kueue);
            if &capped != min {
                let mut g = gang.clone();
                g.min_resources = MinResources::Computed(capped);
                review.capped = Some(g);
            }
        }
    }
    if queued || admission.is_some() {
        let above = pods_ready.and_then(|t| timeout_above(schedule_timeout_seconds, t));
        if let Some(w) = above {
            review.events.push((Reason::GangTimeoutAboveKueue, w));
        }
    }
    review
}

/// Resources Kueue may count that no pod requests: `pods`, when a ClusterQueue covers it.
const NOT_REQUESTED: [&str; 1] = ["pods"];

/// The requests of every pod of the gang's pod sets — what Kueue reserves quota for (minResources
/// may count fewer pods: a gang smaller than the job).
pub fn gang_requests(gang: &Gang) -> Result<ResourceMap, ResourceError> {
    let mut total = ResourceMap::new();
    for m in &gang.members {
        add_into(&mut total, &scale(&m.pod_request, m.replicas)?)?;
    }
    Ok(total)
}

/// One resource on which the pods and Kueue disagree.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub resource: String,
    /// What the gang's pods request together.
    pub pods: Quantity,
    /// What Kueue admitted.
    pub kueue: Quantity,
}

/// Every resource on which the pods' requests and Kueue's admitted usage differ (a resource
/// one side lacks counts as zero there), sorted by name.
pub fn differences(pods: &ResourceMap, kueue: &ResourceMap) -> Vec<Difference> {
    let mut names: Vec<&String> = pods.keys().chain(kueue.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|n| !NOT_REQUESTED.contains(&n.as_str()))
        .filter_map(|n| {
            let p = pods.get(n).copied().unwrap_or_default();
            let k = kueue.get(n).copied().unwrap_or_default();
            (p.nanos() != k.nanos()).then(|| Difference {
                resource: n.clone(),
                pods: p,
                kueue: k,
            })
        })
        .collect()
}

/// The Warning's message: each resource with both figures and by how much they differ.
pub fn describe(workload: &str, diffs: &[Difference]) -> String {
    let parts: Vec<String> = diffs
        .iter()
        .map(|d| {
            let delta = d.pods.nanos() - d.kueue.nanos();
            let by = Quantity::from_nanos(delta.abs(), d.pods.format());
            let word = if delta > 0 { "more" } else { "less" };
            format!(
                "{}: the pods request {}, Kueue admitted {} ({by} {word})",
                d.resource, d.pods, d.kueue
            )
        })
        .collect();
    format!(
        "the gang's pods request other resources than Kueue admitted for Workload {workload} (a LimitRange, RuntimeClass overhead or template change Kueue did not count): {}",
        parts.join("; ")
    )
}

/// minResources capped at what Kueue admitted, resource by resource: a Volcano queue is never
/// asked for more than Kueue admitted. Resources Kueue did not count are kept.
pub fn cap(min_resources: &ResourceMap, kueue: &ResourceMap) -> ResourceMap {
    min_resources
        .iter()
        .map(|(n, q)| {
            let capped = match kueue.get(n) {
                Some(k) if k.nanos() < q.nanos() => *k,
                _ => *q,
            };
            (n.clone(), capped)
        })
        .collect()
}

/// The warning for a scheduler-plugins `scheduleTimeoutSeconds` above Kueue's `waitForPodsReady`
/// timeout: Kueue evicts the job before the scheduler gives up on the gang, so the two fight.
pub fn timeout_above(
    schedule_timeout_seconds: Option<i32>,
    pods_ready: Duration,
) -> Option<String> {
    let t = u64::try_from(schedule_timeout_seconds?).ok()?;
    (t > pods_ready.as_secs()).then(|| {
        format!(
            "scheduleTimeoutSeconds {t} is above Kueue's waitForPodsReady timeout of {}s: Kueue evicts the job before the scheduler stops waiting for the gang; set it below {}s",
            pods_ready.as_secs(),
            pods_ready.as_secs()
        )
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

    use super::*;

    fn map(entries: &[(&str, &str)]) -> ResourceMap {
        entries
            .iter()
            .map(|(k, v)| {
                let q = Quantity::parse_non_negative(&K8sQuantity((*v).into())).unwrap();
                (k.to_string(), q)
            })
            .collect()
    }

    #[test]
    fn rule_12_equal_requests_are_no_difference_and_pods_is_not_a_request() {
        let pods = map(&[("cpu", "4"), ("memory", "8Gi")]);
        let kueue = map(&[("cpu", "4000m"), ("memory", "8Gi"), ("pods", "2")]);
        assert!(differences(&pods, &kueue).is_empty());
    }

    #[test]
    fn rule_12_a_difference_says_by_how_much_either_way() {
        let pods = map(&[("cpu", "6"), ("memory", "8Gi")]);
        let kueue = map(&[("cpu", "4"), ("memory", "10Gi"), ("nvidia.com/gpu", "2")]);
        let d = differences(&pods, &kueue);
        assert_eq!(
            d.iter().map(|d| d.resource.as_str()).collect::<Vec<_>>(),
            vec!["cpu", "memory", "nvidia.com/gpu"]
        );
        let msg = describe("w", &d);
        assert!(
            msg.contains("cpu: the pods request 6, Kueue admitted 4 (2 more)"),
            "{msg}"
        );
        assert!(msg.contains("memory: the pods request 8Gi, Kueue admitted 10Gi (2Gi less)"));
        assert!(msg.contains("nvidia.com/gpu: the pods request 0, Kueue admitted 2"));
    }

    #[test]
    fn rule_12_volcano_min_resources_never_exceed_what_kueue_admitted() {
        let ours = map(&[("cpu", "6"), ("memory", "8Gi"), ("example.com/nic", "1")]);
        let kueue = map(&[("cpu", "4"), ("memory", "16Gi")]);
        assert_eq!(
            cap(&ours, &kueue),
            map(&[("cpu", "4"), ("memory", "8Gi"), ("example.com/nic", "1")])
        );
    }

    #[test]
    fn rule_12_a_gang_timeout_above_kueues_is_reported() {
        let kueue = Duration::from_secs(300);
        assert!(
            timeout_above(Some(600), kueue)
                .unwrap()
                .contains("below 300s")
        );
        assert_eq!(timeout_above(Some(300), kueue), None);
        assert_eq!(timeout_above(Some(-1), kueue), None);
        assert_eq!(timeout_above(None, kueue), None);
    }
}
