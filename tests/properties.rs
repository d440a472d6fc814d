//! Property test over the whole pure pipeline, no cluster: arbitrary job JSON of each kind →
//! normalise → gang → PodGroup name and checks → desired PodGroup of each backend, and the
//! offline `explain` of the same manifest. For every input: no panic, the same output twice,
//! and any PodGroup produced is one the API server can accept (a valid name that pods can link
//! to, minMember ≥ 1, no negative quantity).
//!
//! And the webhook against the planner: for arbitrary jobs and every default backend, a pod the
//! webhook links names exactly the PodGroup the planner writes for its job (same backend, same
//! name), and a job the planner writes no PodGroup for has no pod linked.
//!
//! CI runs `PROPTEST_CASES` cases (default below); a long run is
//! `PROPTEST_CASES=200000 cargo test --release --test properties`.

use std::collections::BTreeMap;

use k8s_openapi::api::scheduling::v1::PriorityClass;
use podgroup_sync::backend::BackendKind;
use podgroup_sync::backend::{self, BACKENDS, BackendOptions};
use podgroup_sync::enablement::{Enablement, Mode};
use podgroup_sync::gang::{self, Priorities};
use podgroup_sync::job::{self, JobKind, KINDS};
use podgroup_sync::plan::{self, PodGroups};
use podgroup_sync::quantity::Quantity;
use podgroup_sync::reconcile::{ResizePolicy, Settings};
use podgroup_sync::resources::AdmissionDefaults;
use podgroup_sync::webhook::link::{self, Decision, PodView};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Cases per property when `PROPTEST_CASES` is unset.
const DEFAULT_CASES: u32 = 2000;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// Any JSON, shallow: what a schema-less corner of a job may hold.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map("[a-zA-Z]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn quantity() -> impl Strategy<Value = Value> {
    prop_oneof![
        40 => prop::sample::select(vec!["1", "0", "500m", "1.5", "2Gi", "1e3", "12e-3", " 3 ", "+4"])
            .prop_map(Value::from),
        2 => prop::sample::select(vec![
            "-2", "-1Gi", "0.0000000001", "1Ei", "9223372036854775807",
            "99999999999999999999999999Ei", "two", "", "1.5.5", "1ki", "0x10",
        ])
        .prop_map(Value::from),
        1 => any::<i32>().prop_map(Value::from),
        1 => any_json(),
    ]
}

fn resource_map() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop::sample::select(vec![
            "cpu",
            "memory",
            "nvidia.com/gpu",
            "ephemeral-storage",
            "pods",
        ]),
        quantity(),
        0..3,
    )
    .prop_map(|m| json!(m))
}

fn container() -> impl Strategy<Value = Value> {
    (
        resource_map(),
        resource_map(),
        prop::option::of(prop::sample::select(vec!["Always", "Never", "OnFailure"])),
    )
        .prop_map(|(requests, limits, restart)| {
            let mut c = json!({"name": "c", "image": "i",
                "resources": {"requests": requests, "limits": limits}});
            if let Some(r) = restart {
                c["restartPolicy"] = json!(r);
            }
            c
        })
}

fn link_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("gang".to_string()),
        Just("Not_Valid".to_string()),
        Just("a".repeat(63)),
        Just("a".repeat(64)),
        Just("a".repeat(254)),
        "[a-z0-9.-]{0,20}",
        ".{0,10}",
    ]
}

fn template() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            9 => prop::collection::vec(container(), 1..3),
            1 => Just(Vec::new()),
        ],
        prop::collection::vec(container(), 0..2),
        prop::option::of(resource_map()),
        prop::option::of(prop::sample::select(vec![
            "",
            "high",
            "missing",
            "volcano",
            "default-scheduler",
        ])),
        prop::option::of(link_value()),
        prop::option::of(link_value()),
        prop::option::of(prop::sample::select(vec!["gvisor", "kata", ""])),
    )
        .prop_map(
            |(containers, init, overhead, class_or_scheduler, label, annotation, rc)| {
                let mut spec = json!({"containers": containers, "initContainers": init});
                if let Some(o) = overhead {
                    spec["overhead"] = o;
                }
                if let Some(s) = class_or_scheduler {
                    spec["priorityClassName"] = json!(s);
                    spec["schedulerName"] = json!(s);
                }
                if let Some(rc) = rc {
                    spec["runtimeClassName"] = json!(rc);
                }
                let mut meta = json!({});
                if let Some(l) = label {
                    meta["labels"] = json!({"scheduling.x-k8s.io/pod-group": l});
                }
                if let Some(a) = annotation {
                    meta["annotations"] = json!({"scheduling.k8s.io/group-name": a,
                        "volcano.sh/task-spec": "t"});
                }
                json!({"metadata": meta, "spec": spec})
            },
        )
}

fn replicas() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (0u64..5).prop_map(Value::from),
        1 => Just(Value::Null),
        1 => prop::sample::select(vec![json!(-1), json!(2147483647u64), json!(1.5), json!("3")]),
    ]
}

/// Replica specs of the kind's own types, each with a template: mostly valid.
fn tidy_replica_specs(kind: &'static JobKind) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop::sample::select(kind.replica_types.to_vec()),
        ((0u64..5).prop_map(Value::from), template())
            .prop_map(|(r, t)| json!({"replicas": r, "template": t})),
        1..4,
    )
    .prop_flat_map(move |specs| {
        // MPIJobs need their Launcher; add one most of the time.
        let needs_launcher = kind.kind == "MPIJob" && !specs.contains_key("Launcher");
        (template(), 0..10u8).prop_map(move |(t, roll)| {
            let mut specs = specs.clone();
            if needs_launcher && roll > 0 {
                specs.insert("Launcher", json!({"replicas": 1, "template": t}));
            }
            json!(specs)
        })
    })
}

fn replica_specs(kind: &'static JobKind) -> impl Strategy<Value = Value> {
    prop_oneof![3 => tidy_replica_specs(kind), 1 => messy_replica_specs(kind)]
}

/// Anything goes: unknown and duplicate types, missing templates, odd values.
fn messy_replica_specs(kind: &'static JobKind) -> impl Strategy<Value = Value> {
    let mut keys: Vec<String> = kind.replica_types.iter().map(|s| s.to_string()).collect();
    keys.extend(kind.replica_types.iter().map(|s| s.to_lowercase()));
    keys.push("Foo".into());
    prop::collection::btree_map(
        prop::sample::select(keys),
        prop_oneof![
            8 => (replicas(), template())
                .prop_map(|(r, t)| json!({"replicas": r, "template": t})),
            1 => Just(json!({"replicas": 1})),
            1 => any_json(),
        ],
        0..4,
    )
    .prop_map(|m| json!(m))
}

fn run_policy() -> impl Strategy<Value = Value> {
    (
        prop::option::of(any::<bool>()),
        prop_oneof![
            6 => Just(None),
            2 => (-2i64..12).prop_map(|v| Some(Value::from(v))),
            1 => any_json().prop_map(Some),
        ],
        prop::option::of(prop::sample::select(vec![
            "q",
            "q",
            "q",
            "Bad_Queue",
            "",
            "a.b",
        ])),
        prop::option::of(resource_map()),
        prop::option::of(prop::sample::select(vec![
            "high",
            "missing",
            "Bad_Class",
            "",
        ])),
        prop::option::of(prop::sample::select(vec![-1, 0, 30, i32::MAX])),
    )
        .prop_map(
            |(suspend, min_available, queue, min_resources, pc, timeout)| {
                json!({"suspend": suspend, "schedulingPolicy": {
                "minAvailable": min_available, "queue": queue, "minResources": min_resources,
                "priorityClass": pc, "scheduleTimeoutSeconds": timeout}})
            },
        )
}

/// A job of another kind than Kubeflow's, with its own spec (SPEC §11). Kept apart from
/// [`job_json`]: one strategy choosing between the two nests deep enough to overflow a test
/// thread's stack in a debug build.
fn workload_json() -> impl Strategy<Value = (&'static JobKind, Value)> {
    let kinds: Vec<&'static JobKind> = KINDS.iter().copied().filter(|k| !k.is_kubeflow()).collect();
    prop::sample::select(kinds).prop_flat_map(|kind| {
        (workload_spec(kind), prop::bool::ANY).prop_map(move |(spec, gang)| {
            let annotations = if gang {
                json!({"podgroup-sync.io/gang": "true"})
            } else {
                json!({})
            };
            // A kind whose groups follow its status carries the status in the strategy's spec.
            let mut spec = spec;
            let status = spec.as_object_mut().and_then(|s| s.remove("__status"));
            let mut obj = json!({"apiVersion": kind.api_version(), "kind": kind.kind,
                "metadata": {"name": "w", "namespace": "ns", "uid": "u", "annotations": annotations},
                "spec": spec});
            if let Some(status) = status {
                obj["status"] = status;
            }
            (kind, obj)
        })
    })
}

fn set_name() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => prop::sample::select(vec!["driver", "workers", "gpu", "a"]).prop_map(|n| json!(n)),
        1 => prop::sample::select(vec![json!(""), json!(null), json!(7)]),
    ]
}

/// The spec of a JobSet, a RayCluster or a batch/v1 Job, mostly well-formed (one template
/// shared by the pod sets: a template strategy per set overflows the test thread's stack).
fn workload_spec(kind: &'static JobKind) -> BoxedStrategy<Value> {
    fn count() -> impl Strategy<Value = Value> {
        prop::sample::select(vec![
            json!(null),
            json!(0),
            json!(1),
            json!(2),
            json!(4),
            json!(-1),
        ])
    }
    let sets = prop::collection::vec(
        (
            set_name(),
            count(),
            count(),
            count(),
            prop::bool::weighted(0.2),
        ),
        0..4,
    );
    match kind.kind {
        "JobSet" => (template(), sets, prop::sample::select(vec![None, Some("InOrder"), Some("AnyOrder")]))
            .prop_map(|(template, sets, order)| {
                let jobs: Vec<Value> = sets
                    .into_iter()
                    .map(|(name, replicas, parallelism, completions, depends)| {
                        let mut j = json!({"name": name, "replicas": replicas, "template": {"spec": {
                            "parallelism": parallelism, "completions": completions,
                            "completionMode": "Indexed", "template": template}}});
                        if depends {
                            j["dependsOn"] = json!([{"name": "driver", "status": "Ready"}]);
                        }
                        j
                    })
                    .collect();
                json!({"replicatedJobs": jobs, "startupPolicy": order.map(|o| json!({"startupPolicyOrder": o}))})
            })
            .boxed(),
        "RayCluster" => (template(), sets)
            .prop_map(|(template, sets)| {
                let groups: Vec<Value> = sets
                    .into_iter()
                    .map(|(name, replicas, min, hosts, suspend)| json!({"groupName": name,
                        "replicas": replicas, "minReplicas": min, "numOfHosts": hosts,
                        "suspend": suspend, "template": template}))
                    .collect();
                json!({"headGroupSpec": {"template": template}, "workerGroupSpecs": groups})
            })
            .boxed(),
        "LeaderWorkerSet" => (
            (count(), count(), template()),
            prop::sample::select(vec![None, Some("LeaderReady"), Some("LeaderCreated")]),
            (count(), prop::bool::ANY, prop::sample::select(vec![json!(null), json!(1), json!("50%"), json!("x")])),
        )
            .prop_map(|((replicas, size, template), startup, (created, updating, surge))| {
                let conditions = if updating {
                    json!([{"type": "UpdateInProgress", "status": "True"}])
                } else {
                    json!([])
                };
                json!({"replicas": replicas, "startupPolicy": startup,
                    "leaderWorkerTemplate": {"size": size, "workerTemplate": template},
                    "rolloutStrategy": {"type": "RollingUpdate",
                        "rollingUpdateConfiguration": {"maxSurge": surge}},
                    "__status": {"replicas": created, "conditions": conditions}})
            })
            .boxed(),
        _ => (count(), count(), template(), prop::sample::select(vec!["Indexed", "NonIndexed"]))
            .prop_map(|(parallelism, completions, template, mode)| json!({"parallelism": parallelism,
                "completions": completions, "completionMode": mode, "template": template}))
            .boxed(),
    }
}

/// A Kubeflow job: replica specs, run policy, elastic policy, annotations.
fn job_json() -> impl Strategy<Value = (&'static JobKind, Value)> {
    let kubeflow: Vec<&'static JobKind> =
        KINDS.iter().copied().filter(|k| k.is_kubeflow()).collect();
    prop::sample::select(kubeflow).prop_flat_map(|kind| {
        (
            replica_specs(kind),
            prop_oneof![8 => run_policy(), 1 => any_json()],
            prop::option::of(prop::collection::btree_map(
                prop::sample::select(vec![
                    "scheduling.volcano.sh/queue-name",
                    "volcano.sh/preemptable",
                    "podgroup-sync.io/backend",
                    // SPEC §13: topology requests, well- and ill-formed.
                    "kueue.x-k8s.io/podset-required-topology",
                    "kueue.x-k8s.io/podset-preferred-topology",
                    "kueue.x-k8s.io/podset-slice-required-topology",
                    "kueue.x-k8s.io/podset-slice-size",
                    "podgroup-sync.io/disruption-mode",
                ]),
                prop::sample::select(vec![
                    "q",
                    "Not A Queue!",
                    "volcano",
                    "kueue",
                    "",
                    "topology.example.com/rack",
                    "1",
                    "2",
                    "All",
                ]),
                0..5,
            )),
            prop::option::of((-1i64..6, -1i64..6)),
            prop::sample::select(vec!["j", "job-with-a-much-longer-name", "x"]),
        )
            .prop_map(move |(specs, run_policy, annotations, elastic, name)| {
                let mut spec = json!({kind.replica_specs_field: specs, "runPolicy": run_policy});
                if let Some((min, max)) = elastic {
                    spec["elasticPolicy"] = json!({"minReplicas": min, "maxReplicas": max});
                }
                if kind.kind == "MPIJob" {
                    spec["launcherCreationPolicy"] = json!("WaitForWorkersReady");
                }
                let name = if name == "x" {
                    "x".repeat(70)
                } else {
                    name.to_string()
                };
                let j = json!({"apiVersion": kind.api_version(), "kind": kind.kind,
                    "metadata": {"name": name, "namespace": "ns", "uid": "u",
                        "annotations": annotations.unwrap_or_default()},
                    "spec": spec});
                (kind, j)
            })
    })
}

fn priorities() -> Priorities {
    let mut high = PriorityClass::default();
    high.metadata.name = Some("high".into());
    high.value = 1000;
    Priorities::from_classes([&high])
}

/// The pipeline's result for every backend, as comparable text.
fn pipeline(kind: &'static JobKind, obj: &Value) -> Vec<String> {
    let opts = BackendOptions::default();
    let job = match job::normalize(kind, obj) {
        Ok(j) => j,
        Err(e) => return vec![format!("invalid: {e}")],
    };
    let priorities = priorities();
    let gang = match gang::compute(&job, &priorities, &AdmissionDefaults::default()) {
        Ok(g) => g,
        Err(e) => return vec![format!("invalid gang: {e}")],
    };
    assert!(gang.min_member >= 1, "minMember {}", gang.min_member);
    let mut out = Vec::new();
    for b in BACKENDS {
        let backend = b.backend();
        match backend::name_and_checks(backend, &job, &|c| priorities.contains(c)) {
            Err(e) => out.push(format!("{b}: invalid: {e}")),
            Ok((name, warnings)) => {
                assert!(backend::is_dns_subdomain(&name), "name {name:?}");
                assert!(name.len() <= backend.max_name_len(), "name {name:?}");
                let desired =
                    backend::desired_object(backend, &job, &gang, &name, None, false, &opts);
                for (r, q) in desired["spec"]["minResources"]
                    .as_object()
                    .into_iter()
                    .flatten()
                {
                    let q = Quantity::parse_k8s(&serde_json::from_value(q.clone()).unwrap())
                        .unwrap_or_else(|e| panic!("minResources[{r}] {q}: {e}"));
                    assert!(q.nanos() >= 0, "negative minResources[{r}]");
                }
                out.push(format!("{b}: {desired} {warnings:?}"));
            }
        }
    }
    out
}

/// Every backend served, no PodGroup cached yet.
struct NoneYet;

impl PodGroups for NoneYet {
    fn served(&self, _: BackendKind) -> bool {
        true
    }
    fn get(
        &self,
        _: BackendKind,
        _: &str,
        _: &str,
    ) -> Option<std::sync::Arc<kube::api::DynamicObject>> {
        None
    }
    fn controlled_by(
        &self,
        _: &str,
    ) -> Vec<(BackendKind, std::sync::Arc<kube::api::DynamicObject>)> {
        Vec::new()
    }
}

fn settings(default_backend: BackendKind) -> Settings {
    Settings {
        enablement: Enablement {
            annotation_key: "podgroup-sync.io/enabled".into(),
            default_mode: Mode::Off,
            default_backend,
        },
        backend_options: BackendOptions::default(),
        resize: ResizePolicy::Always,
        keep_finished: false,
        batch_jobs: false,
        gang_wait_warning: std::time::Duration::from_secs(120),
        webhook: true,
        gang_broken_after: std::time::Duration::from_secs(60),
        feasibility: false,
        audit_interval: std::time::Duration::ZERO,
        kueue_pods_ready_timeout: None,
    }
}

/// What the webhook does with a worker pod of the job, and the PodGroup (backend, name) the
/// planner writes for it, for one default backend.
fn webhook_and_planner(
    kind: &'static JobKind,
    obj: &Value,
    default_backend: BackendKind,
) -> Option<(Decision, Vec<(BackendKind, String)>)> {
    let job: kube::api::DynamicObject = serde_json::from_value(obj.clone()).ok()?;
    let s = settings(default_backend);
    let ns = BTreeMap::from([("podgroup-sync.io/enabled".to_string(), "true".to_string())]);
    let priorities = priorities();
    let defaults = Ok(AdmissionDefaults::default());
    let (owners, labels, pod_name) = pod_of(kind, &job);
    let pod = PodView {
        name: pod_name.as_deref(),
        labels: Some(&labels),
        annotations: None,
        owner_references: &owners,
        scheduler_name: None,
        scheduling_group: false,
    };
    let owner = link::owner_of(&pod).ok()?;
    let ctx = link::Context {
        namespace_annotations: Some(&ns),
        pod_groups: &NoneYet,
        priorities: &priorities,
        defaults: &defaults,
        settings: &s,
    };
    let decision = link::decide(&pod, &owner, &job, &ctx);
    let planned = plan::plan(&plan::Input {
        kind,
        job: &job,
        leading: true,
        namespace_annotations: Some(&ns),
        priorities: &priorities,
        defaults: &defaults,
        pod_groups: &NoneYet,
        refused: None,
        unlinked_pods: &[],
        settings: &s,
        now: "2026-12-01T00:10:00Z".parse().unwrap(),
        health: None,
        capacity: None,
        queues: None,
        kueue: None,
        dropped: &Default::default(),
        tiers: &Default::default(),
    });
    let written = planned
        .writes
        .iter()
        .map(|w| {
            let name = w.body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (w.backend, name)
        })
        .collect();
    Some((decision, written))
}

/// A pod of `job` as its operator creates it: the Kubeflow operators' and KubeRay's own pods,
/// a JobSet's through a batch/v1 Job of its first replicated job, a batch/v1 Job's own, the
/// leader of a LeaderWorkerSet's first group (through its StatefulSet, by its name).
fn pod_of(
    kind: &'static JobKind,
    job: &kube::api::DynamicObject,
) -> (
    Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    BTreeMap<String, String>,
    Option<String>,
) {
    let name = job.metadata.name.clone().unwrap_or_default();
    let owner = |api_version: &str, kind: &str, name: &str| {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            controller: Some(true),
            ..Default::default()
        }
    };
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let (owners, labels) = match kind.kind {
        "LeaderWorkerSet" => {
            return (
                vec![owner("apps/v1", "StatefulSet", &name)],
                labels(&[
                    ("leaderworkerset.sigs.k8s.io/name", &name),
                    ("leaderworkerset.sigs.k8s.io/worker-index", "0"),
                ]),
                Some(format!("{name}-0")),
            );
        }
        "JobSet" => {
            let rjob = job
                .data
                .pointer("/spec/replicatedJobs/0/name")
                .and_then(Value::as_str)
                .unwrap_or("r");
            (
                vec![owner("batch/v1", "Job", &format!("{name}-{rjob}-0"))],
                labels(&[
                    ("jobset.sigs.k8s.io/jobset-name", &name),
                    ("jobset.sigs.k8s.io/replicatedjob-name", rjob),
                ]),
            )
        }
        "RayCluster" => (
            vec![owner(&kind.api_version(), kind.kind, &name)],
            labels(&[("ray.io/cluster", &name), ("ray.io/group", "headgroup")]),
        ),
        "Job" => (
            vec![owner("batch/v1", "Job", &name)],
            labels(&[("batch.kubernetes.io/job-name", &name)]),
        ),
        _ => (
            vec![owner(&kind.api_version(), kind.kind, &name)],
            labels(&[(link::JOB_NAME_LABEL, &name)]),
        ),
    };
    (owners, labels, None)
}

/// The PodGroup a pod of `obj` is linked to is the one the planner writes, for every default
/// backend; a pod skipped while the planner writes one is a pod of a set outside the gang.
fn webhook_agrees_with_the_planner(
    kind: &'static JobKind,
    obj: &Value,
) -> Result<(), proptest::test_runner::TestCaseError> {
    for default_backend in BACKENDS {
        let Some((decision, written)) = webhook_and_planner(kind, obj, default_backend) else {
            continue;
        };
        match decision {
            Decision::Link { backend, name, .. } | Decision::Unchanged { backend, name } => {
                // A LeaderWorkerSet's pod of group 0 is linked even while its status counts no
                // group (the pod is ahead of the status): then the planner writes nothing yet.
                let groups = job::normalize(kind, obj).ok().and_then(|j| j.groups);
                if groups == Some(0) {
                    prop_assert!(written.is_empty(), "{}", obj);
                    continue;
                }
                let all = groups.map_or(1, |n| n as usize);
                prop_assert_eq!(written.len(), all, "{}", obj);
                prop_assert!(
                    written.contains(&(backend, name.clone())),
                    "{:?} not in {:?}: {}",
                    name,
                    written,
                    obj
                );
            }
            Decision::Skipped(link::Skip::OutsideGang | link::Skip::LauncherOutsideGang) => {}
            Decision::Skipped(skip) => {
                prop_assert!(
                    written.is_empty(),
                    "{:?} but the planner writes {:?}: {}",
                    skip,
                    written,
                    obj
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn a_pod_the_webhook_links_names_the_pod_group_the_planner_writes((kind, obj) in job_json()) {
        webhook_agrees_with_the_planner(kind, &obj)?;
    }

    #[test]
    fn a_workload_pod_the_webhook_links_names_the_pod_group_the_planner_writes((kind, obj) in workload_json()) {
        webhook_agrees_with_the_planner(kind, &obj)?;
    }

    #[test]
    fn a_workload_through_the_pipeline_never_panics_and_is_deterministic((kind, obj) in workload_json()) {
        prop_assert_eq!(pipeline(kind, &obj), pipeline(kind, &obj));
    }

    #[test]
    fn the_pipeline_never_panics_and_is_deterministic((kind, obj) in job_json()) {
        let first = pipeline(kind, &obj);
        let second = pipeline(kind, &obj);
        prop_assert_eq!(first, second);
    }

    #[test]
    fn explain_never_panics_and_is_deterministic((_kind, obj) in job_json()) {
        let manifest = serde_json::to_string(&obj).unwrap();
        let opts = BackendOptions::default();
        let a = podgroup_sync::explain::explain(&manifest, None, &opts).map_err(|e| e.to_string());
        let b = podgroup_sync::explain::explain(&manifest, None, &opts).map_err(|e| e.to_string());
        prop_assert_eq!(a, b);
    }

    #[test]
    fn arbitrary_json_in_place_of_a_job_never_panics(v in any_json(), k in 0..KINDS.len()) {
        let _ = pipeline(KINDS[k], &v);
        let _ = pipeline(KINDS[k], &json!({"spec": v}));
    }
}

#[test]
fn the_generator_reaches_valid_and_invalid_jobs() {
    // A property test whose inputs are all rejected early proves little: make sure valid jobs
    // (a PodGroup for some backend) and each kind of rejection are reached.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    let mut pod_groups_by_kind: BTreeMap<&str, u32> = BTreeMap::new();
    for i in 0..3000 {
        let (kind, obj) = if i % 4 == 3 {
            workload_json().new_tree(&mut runner).unwrap().current()
        } else {
            job_json().new_tree(&mut runner).unwrap().current()
        };
        for line in pipeline(kind, &obj) {
            let class = if line.starts_with("invalid") {
                "invalid job"
            } else if line.contains(": invalid: ") {
                "invalid for a backend"
            } else {
                *pod_groups_by_kind.entry(kind.kind).or_default() += 1;
                "podgroup"
            };
            *seen.entry(class).or_default() += 1;
        }
    }
    println!(
        "figure: 3000 generated jobs reached {seen:?}; PodGroups by kind {pod_groups_by_kind:?}"
    );
    for class in ["invalid job", "invalid for a backend", "podgroup"] {
        assert!(seen.get(class).copied().unwrap_or(0) >= 30, "{seen:?}");
    }
    for kind in KINDS {
        assert!(
            pod_groups_by_kind.get(kind.kind).copied().unwrap_or(0) >= 10,
            "{} never reaches a PodGroup: {pod_groups_by_kind:?}",
            kind.kind
        );
    }
}
