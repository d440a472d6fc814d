//! Topology-aware gangs (SPEC §13), pure: what a job asks of the network placement of its pods,
//! read from the annotations Kueue's topology-aware scheduling already defines — on each pod
//! template, with the same keys on the job as a job-wide default — and how its pods split into
//! slices. What each backend makes of it is the backend's file (`backend::*::topology`).
//!
//! Nothing here imports a step of the pipeline: the model sits below the gang and the backends.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::workload::{InvalidJob, Job, PodSet};

/// All of the pod set's pods in one domain of this node label (a rack, a block).
pub const REQUIRED: &str = "kueue.x-k8s.io/podset-required-topology";
/// As close together as the scheduler can, ideally in one domain of this node label.
pub const PREFERRED: &str = "kueue.x-k8s.io/podset-preferred-topology";
/// Each slice of the pod set in one domain of this node label.
pub const SLICE_REQUIRED: &str = "kueue.x-k8s.io/podset-slice-required-topology";
/// The pods of one slice (consecutive pod indices).
pub const SLICE_SIZE: &str = "kueue.x-k8s.io/podset-slice-size";
/// `All`: the native PodGroup is disrupted (preempted) as a whole; `Single` (the API's default):
/// pod by pod.
pub const DISRUPTION_MODE: &str = "podgroup-sync.io/disruption-mode";

/// The pod label the pod-link webhook gives a pod whose set has a topology of its own on
/// Volcano: the pod set's name (the selector of its `subGroupPolicy` entry).
pub const POD_SET_LABEL: &str = "podgroup-sync.io/pod-set";
/// The pod label the pod-link webhook gives a pod of a sliced set on Volcano: its slice,
/// `index / slice size` (the `matchLabelKeys` of the set's `subGroupPolicy` entry).
pub const SLICE_LABEL: &str = "podgroup-sync.io/slice";

/// Whether the constraint must hold or is a preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Required,
    Preferred,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Required => "required",
            Mode::Preferred => "preferred",
        }
    }
}

/// One domain of a node label that pods should share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    /// The node label key (`topology.kubernetes.io/rack`, …).
    pub key: String,
    pub mode: Mode,
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} domain of {}", self.mode.as_str(), self.key)
    }
}

/// A pod set cut into slices of `size` consecutive pod indices, each slice in one domain of
/// `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slices {
    pub key: String,
    pub size: u64,
    /// How many slices the set has (its pods / size, exactly).
    pub count: u64,
}

impl Slices {
    /// The slice of the pod with this index.
    pub fn of(&self, index: u64) -> u64 {
        index / self.size
    }
}

/// What one pod set of the gang asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetRequest {
    pub pod_set: String,
    /// The set's pods.
    pub pods: u64,
    pub domain: Option<Domain>,
    pub slices: Option<Slices>,
}

/// Volcano's tier numbers by tier name (a node label key), from the cluster's HyperNodes.
pub type TierNumbers = BTreeMap<String, u32>;

/// Tier name → tier of HyperNodes given as `(tierName, tier)`. A name two HyperNodes give
/// different tiers is left out (Volcano would pick one of them at random); so is a tier that is
/// not a small non-negative number.
pub fn tier_numbers<'a>(
    hyper_nodes: impl IntoIterator<Item = (Option<&'a str>, Option<i64>)>,
) -> TierNumbers {
    let mut seen: BTreeMap<&str, Option<u32>> = BTreeMap::new();
    for (name, tier) in hyper_nodes {
        let (Some(name), Some(tier)) = (name.filter(|n| !n.is_empty()), tier) else {
            continue;
        };
        let tier = u32::try_from(tier).ok();
        seen.entry(name)
            .and_modify(|t| {
                if *t != tier {
                    *t = None;
                }
            })
            .or_insert(tier);
    }
    seen.into_iter()
        .filter_map(|(name, tier)| Some((name.to_string(), tier?)))
        .collect()
}

/// What a job asks of the placement of its gang. Empty for most jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// The pod sets of the gang that ask for something, in the job's order.
    pub sets: Vec<SetRequest>,
    /// Whether the job asks for its PodGroup to be disrupted as a whole.
    pub disruption_all: bool,
    /// Pod sets of the gang that ask for nothing (a domain shared by every other set is then
    /// not the whole gang's).
    pub unconstrained: Vec<String>,
    /// The cluster's tier numbers, when known (not read from the job: the planner sets them).
    pub tiers: Arc<TierNumbers>,
}

impl Topology {
    /// The tier number of node label `key`, when the cluster's HyperNodes name it.
    pub fn tier(&self, key: &str) -> Option<u32> {
        self.tiers.get(key).copied()
    }

    /// Whether the job asks for no placement at all.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    pub fn set(&self, pod_set: &str) -> Option<&SetRequest> {
        self.sets.iter().find(|s| s.pod_set == pod_set)
    }

    /// The domain of the whole gang: the one every pod set of the gang asks for, when they all
    /// ask for the same.
    pub fn common_domain(&self) -> Option<&Domain> {
        if !self.unconstrained.is_empty() {
            return None;
        }
        let first = self.sets.first()?.domain.as_ref()?;
        self.sets
            .iter()
            .all(|s| s.domain.as_ref() == Some(first))
            .then_some(first)
    }

    /// The pod sets that are sliced.
    pub fn sliced(&self) -> impl Iterator<Item = (&SetRequest, &Slices)> {
        self.sets
            .iter()
            .filter_map(|s| s.slices.as_ref().map(|sl| (s, sl)))
    }

    /// One line per request, for messages: `Worker: required domain of rack, slices of 8 in
    /// domains of host`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .sets
            .iter()
            .map(|s| {
                let mut what = Vec::new();
                if let Some(d) = &s.domain {
                    what.push(d.to_string());
                }
                if let Some(sl) = &s.slices {
                    what.push(format!(
                        "{} slices of {} pods, each in one domain of {}",
                        sl.count, sl.size, sl.key
                    ));
                }
                format!("{}: {}", s.pod_set, what.join(", "))
            })
            .collect();
        if self.disruption_all {
            parts.push("disrupted as a whole".into());
        }
        parts.join("; ")
    }
}

/// Reads what the job asks for (SPEC §13): for each pod set of the gang, the domain and slice
/// annotations of its template, else of the job. A malformed request is an invalid job: Kueue's
/// own webhook refuses the same values, and a gang placed otherwise than asked wastes the GPUs
/// it holds.
pub fn read(job: &Job) -> Result<Topology, InvalidJob> {
    let mut topology = Topology {
        disruption_all: disruption_all(&job.annotations)?,
        ..Default::default()
    };
    for set in job.shape.pod_sets.iter().filter(|s| s.in_gang) {
        let request = set_request(set, &job.annotations)?;
        if request.domain.is_none() && request.slices.is_none() {
            topology.unconstrained.push(set.name.clone());
        } else {
            topology.sets.push(request);
        }
    }
    Ok(topology)
}

fn disruption_all(annotations: &BTreeMap<String, String>) -> Result<bool, InvalidJob> {
    match annotations.get(DISRUPTION_MODE).map(String::as_str) {
        None | Some("Single") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(InvalidJob::InvalidTopology(format!(
            "annotation {DISRUPTION_MODE} is {:?}; it is All or Single",
            crate::names::shorten(other, 40)
        ))),
    }
}

/// The request of one pod set: each group of keys (the domain's, the slices') from the template
/// when the template has any key of the group, else from the job.
fn set_request(set: &PodSet, job: &BTreeMap<String, String>) -> Result<SetRequest, InvalidJob> {
    let empty = BTreeMap::new();
    let template = set
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .unwrap_or(&empty);
    let pick = |keys: &[&str]| -> (&BTreeMap<String, String>, &'static str) {
        if keys.iter().any(|k| template.contains_key(*k)) {
            (template, "template")
        } else {
            (job, "job")
        }
    };
    let at = |from: &'static str, key: &str| format!("{} {key} (on the {from})", set.name);

    let (from, source) = pick(&[REQUIRED, PREFERRED]);
    let domain = match (from.get(REQUIRED), from.get(PREFERRED)) {
        (Some(_), Some(_)) => {
            return Err(InvalidJob::InvalidTopology(format!(
                "{}: {REQUIRED} and {PREFERRED} are both set; a pod set has one or the other",
                set.name
            )));
        }
        (Some(k), None) => Some(Domain {
            key: label_key(k, &at(source, REQUIRED))?,
            mode: Mode::Required,
        }),
        (None, Some(k)) => Some(Domain {
            key: label_key(k, &at(source, PREFERRED))?,
            mode: Mode::Preferred,
        }),
        (None, None) => None,
    };

    let (from, source) = pick(&[SLICE_REQUIRED, SLICE_SIZE]);
    let slices = match (from.get(SLICE_REQUIRED), from.get(SLICE_SIZE)) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(InvalidJob::InvalidTopology(format!(
                "{}: {SLICE_SIZE} is set without {SLICE_REQUIRED}",
                at(source, SLICE_SIZE)
            )));
        }
        (Some(_), None) => {
            return Err(InvalidJob::InvalidTopology(format!(
                "{}: {SLICE_REQUIRED} needs {SLICE_SIZE} (the pods of one slice)",
                at(source, SLICE_REQUIRED)
            )));
        }
        (Some(k), Some(size)) => {
            let key = label_key(k, &at(source, SLICE_REQUIRED))?;
            let size = slice_size(size, set.count, &at(source, SLICE_SIZE))?;
            Some(Slices {
                key,
                size,
                count: set.count / size,
            })
        }
    };
    Ok(SetRequest {
        pod_set: set.name.clone(),
        pods: set.count,
        domain,
        slices,
    })
}

/// A slice size: a whole number from 1 to the set's pods that divides them (a last, smaller
/// slice would be a slice of another size).
fn slice_size(value: &str, pods: u64, at: &str) -> Result<u64, InvalidJob> {
    let size: u64 = value.trim().parse().map_err(|_| {
        InvalidJob::InvalidTopology(format!(
            "{at} is {:?}, not a whole number",
            crate::names::shorten(value, 40)
        ))
    })?;
    if size == 0 || size > pods {
        return Err(InvalidJob::InvalidTopology(format!(
            "{at} is {size}; it is between 1 and the set's {pods} pods"
        )));
    }
    if !pods.is_multiple_of(size) {
        return Err(InvalidJob::InvalidTopology(format!(
            "{at} is {size}, which does not divide the set's {pods} pods into whole slices \
             ({} of {size} and one of {})",
            pods / size,
            pods % size
        )));
    }
    Ok(size)
}

/// A node label key: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// alphanumerics, `-`, `_` and `.`, starting and ending with an alphanumeric.
fn label_key(value: &str, at: &str) -> Result<String, InvalidJob> {
    let (prefix, name) = match value.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, value),
    };
    let name_ok = !name.is_empty() && crate::names::valid_label_value(name);
    let prefix_ok = prefix.is_none_or(crate::names::is_dns_subdomain);
    if name_ok && prefix_ok {
        Ok(value.to_string())
    } else {
        Err(InvalidJob::InvalidTopology(format!(
            "{at} is {:?}, not a node label key",
            crate::names::shorten(value, 80)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::normalize;
    use crate::kinds::PYTORCHJOB;
    use serde_json::{Value, json};

    fn pytorch(job_annotations: Value, master: Value, worker: Value, workers: u64) -> Job {
        let template = |annotations: Value| {
            json!({"metadata": {"annotations": annotations},
                   "spec": {"containers": [{"name": "pytorch", "image": "x"}]}})
        };
        let mut replica_specs = json!({
            "Worker": {"replicas": workers, "template": template(worker)},
        });
        if !master.is_null() {
            replica_specs["Master"] = json!({"replicas": 1, "template": template(master)});
        }
        normalize(
            &PYTORCHJOB,
            &json!({
                "metadata": {"name": "t", "namespace": "ns", "uid": "u", "annotations": job_annotations},
                "spec": {"pytorchReplicaSpecs": replica_specs},
            }),
        )
        .unwrap()
    }

    fn err(t: Result<Topology, InvalidJob>) -> String {
        match t {
            Err(InvalidJob::InvalidTopology(m)) => m,
            other => panic!("expected InvalidTopology, got {other:?}"),
        }
    }

    #[test]
    fn rule_13_a_job_without_annotations_asks_for_nothing() {
        let t = read(&pytorch(json!({}), json!({}), json!({}), 4)).unwrap();
        assert!(t.is_empty());
        assert!(!t.disruption_all);
        assert_eq!(t.common_domain(), None);
    }

    #[test]
    fn rule_13_slices_split_the_indices_with_no_off_by_one() {
        let worker = json!({SLICE_REQUIRED: "rack", SLICE_SIZE: "8"});
        let t = read(&pytorch(json!({}), Value::Null, worker, 16)).unwrap();
        let (set, slices) = t.sliced().next().unwrap();
        assert_eq!((set.pod_set.as_str(), set.pods), ("Worker", 16));
        assert_eq!((slices.size, slices.count), (8, 2));
        let of: Vec<u64> = (0..16).map(|i| slices.of(i)).collect();
        assert_eq!(of[..8], [0; 8]);
        assert_eq!(of[8..], [1; 8]);
        // Sizes that cut the set exactly: 1, 2, 4, 8, 16 of 16.
        for (size, count) in [(1, 16), (2, 8), (4, 4), (16, 1)] {
            let w = json!({SLICE_REQUIRED: "rack", SLICE_SIZE: size.to_string()});
            let t = read(&pytorch(json!({}), Value::Null, w, 16)).unwrap();
            let s = t.sliced().next().unwrap().1;
            assert_eq!(s.count, count, "size {size}");
            assert_eq!(s.of(15), count - 1, "the last pod is in the last slice");
        }
    }

    #[test]
    fn rule_13_a_slice_size_that_does_not_cut_the_set_exactly_is_refused() {
        for (size, why) in [
            ("5", "does not divide the set's 16 pods"),
            ("17", "between 1 and the set's 16 pods"),
            ("0", "between 1 and the set's 16 pods"),
            ("-8", "not a whole number"),
            ("eight", "not a whole number"),
        ] {
            let w = json!({SLICE_REQUIRED: "rack", SLICE_SIZE: size});
            let m = err(read(&pytorch(json!({}), Value::Null, w, 16)));
            assert!(m.contains(why), "{size}: {m}");
            assert!(m.contains("Worker"), "{m}");
        }
        let m = err(read(&pytorch(
            json!({}),
            Value::Null,
            json!({SLICE_SIZE: "8"}),
            16,
        )));
        assert!(m.contains("without"), "{m}");
        let m = err(read(&pytorch(
            json!({}),
            Value::Null,
            json!({SLICE_REQUIRED: "rack"}),
            16,
        )));
        assert!(m.contains("needs"), "{m}");
    }

    #[test]
    fn rule_13_the_template_overrides_the_job_and_the_job_is_the_default() {
        let job = json!({REQUIRED: "block"});
        let t = read(&pytorch(
            job.clone(),
            json!({}),
            json!({PREFERRED: "rack"}),
            4,
        ))
        .unwrap();
        let d = |s: &str| t.set(s).unwrap().domain.clone().unwrap();
        assert_eq!(d("Master").key, "block");
        assert_eq!(d("Master").mode, Mode::Required);
        assert_eq!(d("Worker").key, "rack");
        assert_eq!(d("Worker").mode, Mode::Preferred);
        assert_eq!(t.common_domain(), None, "the sets disagree");
        // The job's default alone: one domain for the whole gang.
        let t = read(&pytorch(job, json!({}), json!({}), 4)).unwrap();
        assert_eq!(
            t.common_domain(),
            Some(&Domain {
                key: "block".into(),
                mode: Mode::Required
            })
        );
    }

    #[test]
    fn rule_13_a_domain_asked_by_some_sets_only_is_not_the_gangs() {
        let t = read(&pytorch(json!({}), json!({}), json!({REQUIRED: "rack"}), 4)).unwrap();
        assert_eq!(t.unconstrained, ["Master"]);
        assert_eq!(t.common_domain(), None);
    }

    #[test]
    fn rule_13_malformed_requests_are_refused_with_where_they_are() {
        let both = json!({REQUIRED: "rack", PREFERRED: "block"});
        assert!(err(read(&pytorch(json!({}), Value::Null, both, 4))).contains("both"));
        let m = err(read(&pytorch(
            json!({REQUIRED: "not a key"}),
            Value::Null,
            json!({}),
            4,
        )));
        assert!(
            m.contains("on the job") && m.contains("not a node label key"),
            "{m}"
        );
        let m = err(read(&pytorch(
            json!({DISRUPTION_MODE: "all"}),
            Value::Null,
            json!({}),
            4,
        )));
        assert!(m.contains("All or Single"), "{m}");
        let ok = read(&pytorch(
            json!({DISRUPTION_MODE: "All", REQUIRED: "topology.kubernetes.io/rack"}),
            Value::Null,
            json!({}),
            4,
        ))
        .unwrap();
        assert!(ok.disruption_all);
    }
}
