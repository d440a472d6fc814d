//! Effective pod requests, computed the way kube-scheduler does (SPEC §3.2.1).
//!
//! The pods are not created yet, so the admission plugins that will change them are applied
//! here first: LimitRanger's container defaults and RuntimeClass's pod overhead.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, LimitRange, LimitRangeItem, PodSpec};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::quantity::{Quantity, QuantityError};

/// Resource name → quantity; sorted, so iteration and output are deterministic.
pub type ResourceMap = BTreeMap<String, Quantity>;

/// Why a pod's request could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error("container {container:?}: resource {resource:?}: {source}")]
    Quantity {
        container: String,
        resource: String,
        source: QuantityError,
    },
    /// A quantity outside any container: pod overhead, pod-level resources, a LimitRange or a
    /// RuntimeClass. `field` says which, e.g. `spec.overhead` or `LimitRange "limits" default`.
    #[error("{field}: resource {resource:?}: {source}")]
    Field {
        field: String,
        resource: String,
        source: QuantityError,
    },
    #[error("resource arithmetic overflow")]
    Overflow,
}

/// What admission will add to a pod before it is scheduled.
#[derive(Debug, Clone, Default)]
pub struct AdmissionDefaults {
    /// LimitRange type=Container `defaultRequest`, merged over the namespace's LimitRanges
    /// (first LimitRange by name wins per resource).
    pub container_default_request: ResourceMap,
    /// LimitRange type=Container `default` (the default limit), merged the same way.
    pub container_default_limit: ResourceMap,
    /// RuntimeClass overhead.podFixed, keyed by RuntimeClass name.
    pub runtime_class_overhead: BTreeMap<String, ResourceMap>,
}

impl AdmissionDefaults {
    /// The container defaults LimitRanger applies from one namespace's LimitRanges.
    ///
    /// Each item gets the API server's LimitRange defaulting first (a missing `default` is
    /// `max`; a missing `defaultRequest` is `default`, else `min`), so objects read from a file
    /// behave like objects read from the cluster. Within a LimitRange a later Container item
    /// overrides an earlier one; across LimitRanges the first by name wins per resource, since
    /// LimitRanger never overwrites a value an earlier LimitRange set.
    pub fn from_limit_ranges(limit_ranges: &[LimitRange]) -> Result<Self, ResourceError> {
        let mut sorted: Vec<&LimitRange> = limit_ranges.iter().collect();
        sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

        let mut defaults = Self::default();
        for lr in sorted {
            let name = lr.metadata.name.as_deref().unwrap_or_default();
            let mut requests = ResourceMap::new();
            let mut limits = ResourceMap::new();
            let items = lr.spec.iter().flat_map(|s| &s.limits);
            for item in items.filter(|i| i.type_ == "Container") {
                let (item_requests, item_limits) = defaulted_container_item(name, item)?;
                requests.extend(item_requests);
                limits.extend(item_limits);
            }
            for (resource, q) in requests {
                defaults
                    .container_default_request
                    .entry(resource)
                    .or_insert(q);
            }
            for (resource, q) in limits {
                defaults
                    .container_default_limit
                    .entry(resource)
                    .or_insert(q);
            }
        }
        Ok(defaults)
    }

    /// LimitRange container defaults plus the pod overhead of every RuntimeClass.
    pub fn from_limit_ranges_and_runtime_classes(
        limit_ranges: &[LimitRange],
        runtime_classes: &[RuntimeClass],
    ) -> Result<Self, ResourceError> {
        let mut defaults = Self::from_limit_ranges(limit_ranges)?;
        for rc in runtime_classes {
            let Some(name) = rc.metadata.name.as_deref() else {
                continue;
            };
            let pod_fixed = rc.overhead.as_ref().and_then(|o| o.pod_fixed.as_ref());
            if let Some(pod_fixed) = pod_fixed {
                let field = format!("RuntimeClass {name:?} overhead.podFixed");
                defaults
                    .runtime_class_overhead
                    .insert(name.to_owned(), parse_field_map(&field, pod_fixed)?);
            }
        }
        Ok(defaults)
    }
}

/// (defaultRequest, default) of one Container item after the API server's defaulting
/// (`SetDefaults_LimitRangeItem`).
fn defaulted_container_item(
    lr_name: &str,
    item: &LimitRangeItem,
) -> Result<(ResourceMap, ResourceMap), ResourceError> {
    let parse = |key: &str, map: &Option<BTreeMap<String, K8sQuantity>>| match map {
        Some(m) => parse_field_map(&format!("LimitRange {lr_name:?} {key}"), m),
        None => Ok(ResourceMap::new()),
    };
    let mut limits = parse("default", &item.default)?;
    let mut requests = parse("defaultRequest", &item.default_request)?;
    for (resource, q) in parse("max", &item.max)? {
        limits.entry(resource).or_insert(q);
    }
    for (resource, q) in &limits {
        requests.entry(resource.clone()).or_insert(*q);
    }
    for (resource, q) in parse("min", &item.min)? {
        requests.entry(resource).or_insert(q);
    }
    Ok((requests, limits))
}

fn parse_field_map(
    field: &str,
    map: &BTreeMap<String, K8sQuantity>,
) -> Result<ResourceMap, ResourceError> {
    map.iter()
        .map(|(resource, q)| {
            let parsed = Quantity::parse_admitted(q).map_err(|source| ResourceError::Field {
                field: field.to_owned(),
                resource: resource.clone(),
                source,
            })?;
            Ok((resource.clone(), parsed))
        })
        .collect()
}

/// The request one container will have once admitted, resource by resource:
/// `requests[r]`, else `limits[r]` (the API server defaults a missing request to the limit),
/// else LimitRange `defaultRequest[r]`, else `default[r]` (LimitRanger fills only resources the
/// container sets in neither requests nor limits).
pub fn container_request(
    c: &Container,
    d: &AdmissionDefaults,
) -> Result<ResourceMap, ResourceError> {
    let empty = BTreeMap::new();
    let resources = c.resources.as_ref();
    let requests = resources
        .and_then(|r| r.requests.as_ref())
        .unwrap_or(&empty);
    let limits = resources.and_then(|r| r.limits.as_ref()).unwrap_or(&empty);

    let names: BTreeSet<&String> = requests
        .keys()
        .chain(limits.keys())
        .chain(d.container_default_request.keys())
        .chain(d.container_default_limit.keys())
        .collect();

    let mut out = ResourceMap::new();
    for name in names {
        let parse = |q: &K8sQuantity| {
            Quantity::parse_admitted(q).map_err(|source| ResourceError::Quantity {
                container: c.name.clone(),
                resource: name.clone(),
                source,
            })
        };
        let request = if let Some(q) = requests.get(name) {
            parse(q)?
        } else if let Some(q) = limits.get(name) {
            parse(q)?
        } else if let Some(q) = d.container_default_request.get(name) {
            *q
        } else if let Some(q) = d.container_default_limit.get(name) {
            *q
        } else {
            continue;
        };
        out.insert(name.clone(), request);
    }
    Ok(out)
}

/// An init container with `restartPolicy: Always` is a native sidecar: it keeps running.
fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Resources kube-scheduler takes from pod-level `spec.resources` (PodLevelResources, beta
/// and on by default in 1.34): cpu, memory and hugepages-*.
fn is_pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// The request kube-scheduler will see for one pod of this template (SPEC §3.2.1):
/// `max(max_i(init_i + Σ sidecars before i), Σ sidecars + Σ containers)` per resource, then
/// pod-level requests where set, plus overhead (`spec.overhead`, else the RuntimeClass's).
/// Zero entries are omitted.
pub fn effective_pod_request(
    spec: &PodSpec,
    d: &AdmissionDefaults,
) -> Result<ResourceMap, ResourceError> {
    let mut running = ResourceMap::new();
    for c in &spec.containers {
        add_into(&mut running, &container_request(c, d)?)?;
    }

    let init_containers = spec.init_containers.as_deref().unwrap_or_default();
    let mut sidecars = ResourceMap::new();
    let mut init_peak = ResourceMap::new();
    for c in init_containers {
        let request = container_request(c, d)?;
        if is_sidecar(c) {
            // A sidecar runs alongside everything started after it, including the containers.
            add_into(&mut running, &request)?;
            add_into(&mut sidecars, &request)?;
            max_into(&mut init_peak, &sidecars);
        } else {
            // An ordinary init container runs alone, next to the sidecars declared before it.
            let mut during = request;
            add_into(&mut during, &sidecars)?;
            max_into(&mut init_peak, &during);
        }
    }
    let mut pod = running;
    max_into(&mut pod, &init_peak);

    apply_pod_level_resources(spec, &mut pod)?;

    match &spec.overhead {
        Some(overhead) if !overhead.is_empty() => {
            add_into(&mut pod, &parse_field_map("spec.overhead", overhead)?)?;
        }
        // RuntimeClass admission sets spec.overhead from the class when the pod has none.
        _ => {
            let class = spec.runtime_class_name.as_deref();
            if let Some(overhead) = class.and_then(|n| d.runtime_class_overhead.get(n)) {
                add_into(&mut pod, overhead)?;
            }
        }
    }

    pod.retain(|_, q| !q.is_zero());
    Ok(pod)
}

/// Pod-level `spec.resources`: a pod-level request replaces the containers' sum for that
/// resource. A pod-level limit with no request becomes the request when no container sets the
/// resource (the API server's `defaultPodRequests`; otherwise it defaults to the containers'
/// sum, which `pod` already holds).
fn apply_pod_level_resources(spec: &PodSpec, pod: &mut ResourceMap) -> Result<(), ResourceError> {
    let Some(resources) = &spec.resources else {
        return Ok(());
    };
    let empty = BTreeMap::new();
    let requests = resources.requests.as_ref().unwrap_or(&empty);
    let limits = resources.limits.as_ref().unwrap_or(&empty);

    let set_by_a_container = |name: &str| {
        let init = spec.init_containers.as_deref().unwrap_or_default();
        spec.containers.iter().chain(init).any(|c| {
            c.resources.as_ref().is_some_and(|r| {
                r.requests.as_ref().is_some_and(|m| m.contains_key(name))
                    || r.limits.as_ref().is_some_and(|m| m.contains_key(name))
            })
        })
    };

    for (name, q) in requests.iter().filter(|(n, _)| is_pod_level_resource(n)) {
        let parsed = parse_pod_level("spec.resources.requests", name, q)?;
        pod.insert(name.clone(), parsed);
    }
    for (name, q) in limits.iter().filter(|(n, _)| is_pod_level_resource(n)) {
        if !requests.contains_key(name) && !set_by_a_container(name) {
            let parsed = parse_pod_level("spec.resources.limits", name, q)?;
            pod.insert(name.clone(), parsed);
        }
    }
    Ok(())
}

fn parse_pod_level(field: &str, name: &str, q: &K8sQuantity) -> Result<Quantity, ResourceError> {
    Quantity::parse_admitted(q).map_err(|source| ResourceError::Field {
        field: field.to_owned(),
        resource: name.to_owned(),
        source,
    })
}

/// `acc += other`, resource by resource.
pub fn add_into(acc: &mut ResourceMap, other: &ResourceMap) -> Result<(), ResourceError> {
    for (name, q) in other {
        let sum = match acc.get(name) {
            Some(existing) => existing
                .checked_add(*q)
                .map_err(|_| ResourceError::Overflow)?,
            None => *q,
        };
        acc.insert(name.clone(), sum);
    }
    Ok(())
}

/// `acc = max(acc, other)`, resource by resource; `acc` keeps its value on a tie.
fn max_into(acc: &mut ResourceMap, other: &ResourceMap) {
    for (name, q) in other {
        acc.entry(name.clone())
            .and_modify(|existing| *existing = Quantity::max(*existing, *q))
            .or_insert(*q);
    }
}

/// `n × m`, resource by resource.
pub fn scale(m: &ResourceMap, n: u64) -> Result<ResourceMap, ResourceError> {
    m.iter()
        .map(|(name, q)| {
            let scaled = q.checked_mul(n).map_err(|_| ResourceError::Overflow)?;
            Ok((name.clone(), scaled))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{LimitRangeSpec, ResourceRequirements};
    use k8s_openapi::api::node::v1::Overhead;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn k8s_map(entries: &[(&str, &str)]) -> BTreeMap<String, K8sQuantity> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string())))
            .collect()
    }

    fn map(entries: &[(&str, &str)]) -> ResourceMap {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
            .collect()
    }

    /// The map as canonical strings, to compare bytes as well as values.
    fn printed(m: &ResourceMap) -> BTreeMap<String, String> {
        m.iter().map(|(k, v)| (k.clone(), v.to_string())).collect()
    }

    fn strings(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: name.to_owned(),
            resources: Some(ResourceRequirements {
                requests: (!requests.is_empty()).then(|| k8s_map(requests)),
                limits: (!limits.is_empty()).then(|| k8s_map(limits)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sidecar(name: &str, requests: &[(&str, &str)]) -> Container {
        Container {
            restart_policy: Some("Always".to_owned()),
            ..container(name, requests, &[])
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>) -> PodSpec {
        PodSpec {
            containers,
            init_containers: (!init.is_empty()).then_some(init),
            ..Default::default()
        }
    }

    fn limit_range(name: &str, items: Vec<LimitRangeItem>) -> LimitRange {
        LimitRange {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            spec: Some(LimitRangeSpec { limits: items }),
        }
    }

    fn container_item(
        default_request: &[(&str, &str)],
        default: &[(&str, &str)],
    ) -> LimitRangeItem {
        LimitRangeItem {
            type_: "Container".to_owned(),
            default_request: (!default_request.is_empty()).then(|| k8s_map(default_request)),
            default: (!default.is_empty()).then(|| k8s_map(default)),
            ..Default::default()
        }
    }

    fn request(spec: &PodSpec, d: &AdmissionDefaults) -> BTreeMap<String, String> {
        printed(&effective_pod_request(spec, d).unwrap())
    }

    #[test]
    fn init_container_larger_than_containers() {
        let spec = pod(
            vec![container("main", &[("cpu", "1"), ("memory", "1Gi")], &[])],
            vec![container(
                "setup",
                &[("cpu", "4"), ("memory", "512Mi")],
                &[],
            )],
        );
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("cpu", "4"), ("memory", "1Gi")])
        );
    }

    #[test]
    fn native_sidecar_before_an_init_container() {
        // The sidecar keeps running while the later init container runs: 1 + 3 = 4 CPUs.
        // An init container declared before the sidecar does not see it.
        let spec = pod(
            vec![container("main", &[("cpu", "1")], &[])],
            vec![
                container("early", &[("cpu", "3500m")], &[]),
                sidecar("proxy", &[("cpu", "1")]),
                container("late", &[("cpu", "3")], &[]),
            ],
        );
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("cpu", "4")])
        );
    }

    #[test]
    fn sidecars_plus_containers() {
        // Sidecars add to the running sum rather than counting as a one-off init container.
        let spec = pod(
            vec![
                container("main", &[("cpu", "2"), ("memory", "1Gi")], &[]),
                container("helper", &[("cpu", "500m")], &[]),
            ],
            vec![
                sidecar("proxy", &[("cpu", "250m"), ("memory", "128Mi")]),
                sidecar("logs", &[("cpu", "250m")]),
                container("setup", &[("cpu", "1")], &[]),
            ],
        );
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("cpu", "3"), ("memory", "1152Mi")])
        );
    }

    #[test]
    fn pod_overhead() {
        let mut spec = pod(vec![container("main", &[("cpu", "1")], &[])], vec![]);
        spec.overhead = Some(k8s_map(&[("cpu", "250m"), ("memory", "120Mi")]));
        spec.runtime_class_name = Some("kata".to_owned());
        let d = AdmissionDefaults {
            runtime_class_overhead: [("kata".to_owned(), map(&[("cpu", "9")]))].into(),
            ..Default::default()
        };
        // spec.overhead wins over the RuntimeClass (admission rejects a mismatch anyway).
        assert_eq!(
            request(&spec, &d),
            strings(&[("cpu", "1250m"), ("memory", "120Mi")])
        );
    }

    #[test]
    fn runtime_class_overhead_when_the_template_sets_none() {
        let mut spec = pod(vec![container("main", &[("cpu", "1")], &[])], vec![]);
        spec.runtime_class_name = Some("kata".to_owned());
        let kata = RuntimeClass {
            metadata: ObjectMeta {
                name: Some("kata".to_owned()),
                ..Default::default()
            },
            handler: "kata".to_owned(),
            overhead: Some(Overhead {
                pod_fixed: Some(k8s_map(&[("cpu", "250m"), ("memory", "160Mi")])),
            }),
            scheduling: None,
        };
        let d = AdmissionDefaults::from_limit_ranges_and_runtime_classes(&[], &[kata]).unwrap();
        assert_eq!(
            request(&spec, &d),
            strings(&[("cpu", "1250m"), ("memory", "160Mi")])
        );

        spec.runtime_class_name = Some("runc".to_owned());
        assert_eq!(request(&spec, &d), strings(&[("cpu", "1")]));
    }

    #[test]
    fn gpu_given_only_as_limits() {
        let spec = pod(
            vec![container(
                "trainer",
                &[("cpu", "4")],
                &[("nvidia.com/gpu", "1")],
            )],
            vec![],
        );
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("cpu", "4"), ("nvidia.com/gpu", "1")])
        );
    }

    #[test]
    fn limit_fallback_is_per_resource() {
        // memory has both (request wins); cpu only a limit (the limit is the request).
        let c = container(
            "main",
            &[("memory", "1Gi")],
            &[("memory", "2Gi"), ("cpu", "2")],
        );
        let got = container_request(&c, &AdmissionDefaults::default()).unwrap();
        assert_eq!(printed(&got), strings(&[("cpu", "2"), ("memory", "1Gi")]));
    }

    #[test]
    fn limit_range_default_request_then_default() {
        let d = AdmissionDefaults::from_limit_ranges(&[
            // Sorted by name, "a-limits" comes first and wins for cpu.
            limit_range(
                "b-limits",
                vec![container_item(
                    &[("cpu", "300m")],
                    &[("cpu", "1"), ("ephemeral-storage", "1Gi")],
                )],
            ),
            limit_range(
                "a-limits",
                vec![
                    container_item(&[("cpu", "100m")], &[("cpu", "500m"), ("memory", "256Mi")]),
                    LimitRangeItem {
                        type_: "Pod".to_owned(),
                        max: Some(k8s_map(&[("cpu", "64")])),
                        ..Default::default()
                    },
                ],
            ),
        ])
        .unwrap();

        // Sets neither: defaultRequest (cpu), else default (memory, ephemeral-storage).
        let bare = container("bare", &[], &[]);
        assert_eq!(
            printed(&container_request(&bare, &d).unwrap()),
            strings(&[
                ("cpu", "100m"),
                ("ephemeral-storage", "1Gi"),
                ("memory", "256Mi")
            ])
        );
        // Sets a limit or a request for a resource: no default for that resource.
        let partial = container("partial", &[("memory", "1Gi")], &[("cpu", "2")]);
        assert_eq!(
            printed(&container_request(&partial, &d).unwrap()),
            strings(&[
                ("cpu", "2"),
                ("ephemeral-storage", "1Gi"),
                ("memory", "1Gi")
            ])
        );

        // A hand-built default limit with no default request is still a request.
        let only_limit = AdmissionDefaults {
            container_default_limit: map(&[("memory", "64Mi")]),
            ..Default::default()
        };
        assert_eq!(
            printed(&container_request(&bare, &only_limit).unwrap()),
            strings(&[("memory", "64Mi")])
        );
    }

    #[test]
    fn limit_range_max_and_min_are_defaulted_like_the_api_server() {
        let item = LimitRangeItem {
            type_: "Container".to_owned(),
            max: Some(k8s_map(&[("cpu", "4")])),
            min: Some(k8s_map(&[("memory", "32Mi")])),
            ..Default::default()
        };
        let d = AdmissionDefaults::from_limit_ranges(&[limit_range("lr", vec![item])]).unwrap();
        assert_eq!(
            printed(&d.container_default_limit),
            strings(&[("cpu", "4")])
        );
        assert_eq!(
            printed(&d.container_default_request),
            strings(&[("cpu", "4"), ("memory", "32Mi")])
        );
    }

    #[test]
    fn limit_ranges_apply_to_init_containers_too() {
        let d = AdmissionDefaults::from_limit_ranges(&[limit_range(
            "lr",
            vec![container_item(&[("cpu", "2")], &[])],
        )])
        .unwrap();
        let spec = pod(
            vec![container("main", &[("cpu", "1")], &[])],
            vec![container("setup", &[], &[])],
        );
        assert_eq!(request(&spec, &d), strings(&[("cpu", "2")]));
    }

    #[test]
    fn unparseable_quantity_error_names_container() {
        let spec = pod(
            vec![
                container("ok", &[("cpu", "1")], &[]),
                container("trainer", &[], &[("nvidia.com/gpu", "one")]),
            ],
            vec![],
        );
        let err = effective_pod_request(&spec, &AdmissionDefaults::default()).unwrap_err();
        assert!(matches!(
            &err,
            ResourceError::Quantity { container, resource, source: QuantityError::Invalid(_) }
                if container == "trainer" && resource == "nvidia.com/gpu"
        ));
        let message = err.to_string();
        assert!(
            message.contains("\"trainer\"") && message.contains("\"one\""),
            "{message}"
        );

        let mut spec = pod(vec![container("ok", &[("cpu", "1")], &[])], vec![]);
        spec.overhead = Some(k8s_map(&[("memory", "1 Gi")]));
        let err = effective_pod_request(&spec, &AdmissionDefaults::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("spec.overhead: resource \"memory\""),
            "{err}"
        );

        let bad = limit_range("lr", vec![container_item(&[("cpu", "1KB")], &[])]);
        let err = AdmissionDefaults::from_limit_ranges(&[bad]).unwrap_err();
        assert!(
            err.to_string().contains("LimitRange \"lr\" defaultRequest"),
            "{err}"
        );
    }

    #[test]
    fn zero_entries_omitted() {
        let spec = pod(
            vec![container(
                "main",
                &[("cpu", "1"), ("memory", "0"), ("example.com/foo", "0Ki")],
                &[],
            )],
            vec![container("setup", &[("nvidia.com/gpu", "0")], &[])],
        );
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("cpu", "1")])
        );
        assert!(
            effective_pod_request(&pod(vec![], vec![]), &AdmissionDefaults::default())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn overflow_is_an_error() {
        let huge = "170141183460469231731687303715884105727n";
        // Already whole milli-units, so the rounding does not overflow before the sum does.
        let huge_milli = "170141183460469231731687303715884m";
        let spec = pod(
            vec![
                container("a", &[("cpu", huge_milli)], &[]),
                container("b", &[("cpu", huge_milli)], &[]),
            ],
            vec![],
        );
        assert_eq!(
            effective_pod_request(&spec, &AdmissionDefaults::default()),
            Err(ResourceError::Overflow)
        );
        assert_eq!(
            scale(&map(&[("cpu", huge)]), 2),
            Err(ResourceError::Overflow)
        );
        let mut acc = map(&[("cpu", huge)]);
        assert_eq!(
            add_into(&mut acc, &map(&[("cpu", "1n")])),
            Err(ResourceError::Overflow)
        );
    }

    #[test]
    fn rule_3_2_1_pod_level_requests_stand_for_the_resources_they_name() {
        let mut spec = pod(
            vec![container(
                "main",
                &[("cpu", "1"), ("memory", "1Gi"), ("nvidia.com/gpu", "1")],
                &[],
            )],
            vec![],
        );
        spec.resources = Some(ResourceRequirements {
            requests: Some(k8s_map(&[("cpu", "3"), ("nvidia.com/gpu", "8")])),
            ..Default::default()
        });
        spec.overhead = Some(k8s_map(&[("cpu", "100m")]));
        // gpu is not a pod-level resource: the pod-level value is ignored.
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("cpu", "3100m"), ("memory", "1Gi"), ("nvidia.com/gpu", "1")])
        );
    }

    #[test]
    fn rule_3_2_1_pod_level_limit_is_the_request_when_no_container_sets_the_resource() {
        let mut spec = pod(vec![container("main", &[("cpu", "1")], &[])], vec![]);
        spec.resources = Some(ResourceRequirements {
            limits: Some(k8s_map(&[("cpu", "4"), ("memory", "8Gi")])),
            ..Default::default()
        });
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("cpu", "1"), ("memory", "8Gi")])
        );
    }

    #[test]
    fn rule_3_2_1_quantities_round_up_to_milli_per_container_before_summing() {
        // The API server stores 0.1m as 1m on each container: three are 3m, not 0.3m → 1m.
        let spec = pod(
            vec![
                container("a", &[("cpu", "100u")], &[]),
                container("b", &[("cpu", "0.0001")], &[]),
                container("c", &[("cpu", "1n"), ("memory", "1.0001")], &[]),
            ],
            vec![],
        );
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("cpu", "3m"), ("memory", "1001m")])
        );
    }

    #[test]
    fn rule_3_2_1_overhead_rounds_up_to_milli_before_it_is_added() {
        let mut spec = pod(vec![container("main", &[("cpu", "1")], &[])], vec![]);
        spec.overhead = Some(k8s_map(&[("cpu", "250500u")]));
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("cpu", "1251m")])
        );
    }

    #[test]
    fn rule_3_2_1_an_explicit_zero_request_wins_over_a_limit() {
        let spec = pod(
            vec![container(
                "main",
                &[("cpu", "0"), ("nvidia.com/gpu", "0")],
                &[("cpu", "4"), ("nvidia.com/gpu", "2"), ("memory", "1Gi")],
            )],
            vec![],
        );
        // cpu and gpu requests are explicitly zero; memory falls back to its limit.
        assert_eq!(
            request(&spec, &AdmissionDefaults::default()),
            strings(&[("memory", "1Gi")])
        );
    }

    #[test]
    fn scale_and_add_are_resource_by_resource() {
        let mut acc = map(&[("cpu", "500m")]);
        add_into(
            &mut acc,
            &scale(&map(&[("cpu", "250m"), ("memory", "1Gi")]), 4).unwrap(),
        )
        .unwrap();
        assert_eq!(
            printed(&acc),
            strings(&[("cpu", "1500m"), ("memory", "4Gi")])
        );
    }
}
