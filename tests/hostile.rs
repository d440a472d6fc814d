//! Hostile input on a real control plane: a corpus of schema-valid bad jobs (the API server
//! accepts every one of them), each with the Event it must produce, beside good jobs that still
//! get their PodGroups promptly; and a PodGroup the API server refuses (a cluster policy)
//! reported as `PodGroupRefused`, sent again with a backoff, and created once the policy is relaxed.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use support::controller::{self, metric_sum};
use support::jobs::{self, Backend, Kind};

const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");

/// One controller at a time on the shared control plane.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sets `pointer` (e.g. `/spec/runPolicy/schedulingPolicy/minAvailable`) in `v`, creating
/// objects on the way; `Value::Null` removes the last key.
fn set(v: &mut Value, pointer: &str, value: Value) {
    let mut cur = v;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, p) in parts.iter().enumerate() {
        let last = i == parts.len() - 1;
        if let Ok(idx) = p.parse::<usize>() {
            cur = &mut cur[idx];
            if last {
                *cur = value;
                return;
            }
            continue;
        }
        if last {
            let obj = cur.as_object_mut().expect("object on the way");
            if value.is_null() {
                obj.remove(*p);
            } else {
                obj.insert(p.to_string(), value);
            }
            return;
        }
        if cur.get(*p).is_none_or(Value::is_null) {
            cur[*p] = json!({});
        }
        cur = &mut cur[*p];
    }
}

/// A replica type's template path.
fn t(kind: Kind, replica_type: &str) -> String {
    format!("/spec/{}/{replica_type}/template", kind.specs_field())
}

/// What a corpus job must produce.
struct Case {
    name: String,
    kind: Kind,
    backend: Backend,
    manifest: Value,
    reason: &'static str,
    /// Words the Event's note must contain.
    note: &'static str,
    pod_group: bool,
}

fn case(
    name: &str,
    kind: Kind,
    backend: Backend,
    reason: &'static str,
    note: &'static str,
    pod_group: bool,
    edit: impl FnOnce(&mut Value),
) -> Case {
    let mut manifest = jobs::job(kind, backend, name, 2);
    edit(&mut manifest);
    Case {
        name: name.to_string(),
        kind,
        backend,
        manifest,
        reason,
        note,
        pod_group,
    }
}

fn all_templates(kind: Kind, m: &mut Value, f: impl Fn(&mut Value)) {
    let specs = m["spec"][kind.specs_field()].as_object_mut().unwrap();
    for spec in specs.values_mut() {
        f(&mut spec["template"]);
    }
}

/// The corpus: every job here is accepted by the real CRD schemas.
fn corpus() -> Vec<Case> {
    use Backend::{SchedulerPlugins as S, Volcano as V};
    use Kind::{MPIJob as M, PyTorchJob as P, TFJob as T};
    const INVALID: &str = "InvalidSpec";
    const WARN: &str = "GangSpecWarning";
    let long_name = format!("long-{}", "n".repeat(235));
    vec![
        case(
            "zero-replicas",
            P,
            S,
            INVALID,
            "zero replicas",
            false,
            |m| {
                set(m, "/spec/pytorchReplicaSpecs/Master/replicas", json!(0));
                set(m, "/spec/pytorchReplicaSpecs/Worker/replicas", json!(0));
            },
        ),
        case(
            "tf-zero-replicas",
            T,
            S,
            INVALID,
            "zero replicas",
            false,
            |m| {
                set(m, "/spec/tfReplicaSpecs/PS/replicas", json!(0));
                set(m, "/spec/tfReplicaSpecs/Worker/replicas", json!(0));
            },
        ),
        case(
            "min-available-zero",
            P,
            S,
            INVALID,
            "at least 1",
            false,
            |m| {
                set(m, "/spec/runPolicy/schedulingPolicy/minAvailable", json!(0));
            },
        ),
        case(
            "min-available-negative",
            T,
            S,
            INVALID,
            "at least 1",
            false,
            |m| {
                set(
                    m,
                    "/spec/runPolicy/schedulingPolicy/minAvailable",
                    json!(-5),
                );
            },
        ),
        case(
            "mpi-min-available-zero",
            M,
            S,
            INVALID,
            "at least 1",
            false,
            |m| {
                set(m, "/spec/runPolicy/schedulingPolicy/minAvailable", json!(0));
            },
        ),
        case(
            "min-available-above",
            M,
            V,
            INVALID,
            "never be scheduled",
            false,
            |m| {
                set(
                    m,
                    "/spec/runPolicy/schedulingPolicy/minAvailable",
                    json!(100),
                );
            },
        ),
        case(
            "tf-min-available-above",
            T,
            V,
            INVALID,
            "never be scheduled",
            false,
            |m| {
                set(
                    m,
                    "/spec/runPolicy/schedulingPolicy/minAvailable",
                    json!(50),
                );
            },
        ),
        case(
            "elastic-min-zero",
            P,
            S,
            INVALID,
            "minReplicas must be at least 1",
            false,
            |m| {
                set(
                    m,
                    "/spec/elasticPolicy",
                    json!({"minReplicas": 0, "maxReplicas": 3}),
                );
            },
        ),
        case(
            "elastic-min-negative",
            P,
            V,
            INVALID,
            "minReplicas must be at least 1",
            false,
            |m| {
                set(m, "/spec/elasticPolicy", json!({"minReplicas": -1}));
            },
        ),
        case(
            "negative-cpu-request",
            P,
            S,
            INVALID,
            "negative",
            false,
            |m| {
                set(
                    m,
                    &(t(P, "Worker") + "/spec/containers/0/resources/requests/cpu"),
                    json!("-2"),
                );
            },
        ),
        case(
            "negative-memory-limit",
            T,
            S,
            INVALID,
            "negative",
            false,
            |m| {
                set(
                    m,
                    &(t(T, "PS") + "/spec/containers/0/resources/requests/memory"),
                    Value::Null,
                );
                set(
                    m,
                    &(t(T, "PS") + "/spec/containers/0/resources/limits/memory"),
                    json!("-1Gi"),
                );
            },
        ),
        case("negative-overhead", P, S, INVALID, "negative", false, |m| {
            set(
                m,
                &(t(P, "Master") + "/spec/overhead"),
                json!({"cpu": "-1"}),
            );
        }),
        case(
            "negative-min-resources",
            M,
            V,
            INVALID,
            "negative",
            false,
            |m| {
                set(
                    m,
                    "/spec/runPolicy/schedulingPolicy/minResources",
                    json!({"cpu": "-4"}),
                );
            },
        ),
        case(
            "negative-init-request",
            T,
            V,
            INVALID,
            "negative",
            false,
            |m| {
                set(
                    m,
                    &(t(T, "Worker") + "/spec/initContainers"),
                    json!([{"name": "init", "image": "i", "resources": {"requests": {"cpu": "-1"}}}]),
                );
            },
        ),
        case("negative-sidecar", P, S, INVALID, "negative", false, |m| {
            set(
                m,
                &(t(P, "Master") + "/spec/initContainers"),
                json!([{"name": "side", "image": "i", "restartPolicy": "Always",
                    "resources": {"requests": {"memory": "-5Mi"}}}]),
            );
        }),
        case(
            "negative-ephemeral",
            M,
            S,
            INVALID,
            "negative",
            false,
            |m| {
                set(
                    m,
                    &(t(M, "Worker") + "/spec/containers/0/resources/requests/ephemeral-storage"),
                    json!("-1Gi"),
                );
            },
        ),
        case(
            "negative-gpu-limit",
            P,
            V,
            INVALID,
            "negative",
            false,
            |m| {
                set(
                    m,
                    &(t(P, "Worker") + "/spec/containers/0/resources/limits/nvidia.com~1gpu"),
                    Value::Null,
                );
                set(
                    m,
                    &(t(P, "Worker") + "/spec/containers/0/resources/limits"),
                    json!({"nvidia.com/gpu": "-1"}),
                );
            },
        ),
        case(
            "no-containers",
            P,
            S,
            INVALID,
            "no containers",
            false,
            |m| {
                set(m, &(t(P, "Worker") + "/spec/containers"), json!([]));
            },
        ),
        case(
            "mpi-no-launcher",
            M,
            S,
            INVALID,
            "needs a Launcher",
            false,
            |m| {
                set(m, "/spec/mpiReplicaSpecs/Launcher", Value::Null);
            },
        ),
        case(
            "unknown-type",
            P,
            S,
            INVALID,
            "unknown replica type",
            false,
            |m| {
                let w = m["spec"]["pytorchReplicaSpecs"]["Worker"].clone();
                set(m, "/spec/pytorchReplicaSpecs/Chief", w);
            },
        ),
        case(
            "duplicate-type",
            T,
            S,
            INVALID,
            "same type in different case",
            false,
            |m| {
                let w = m["spec"]["tfReplicaSpecs"]["Worker"].clone();
                set(m, "/spec/tfReplicaSpecs/worker", w);
            },
        ),
        case(
            "too-many-replicas",
            P,
            S,
            INVALID,
            "more than a PodGroup can hold",
            false,
            |m| {
                set(
                    m,
                    "/spec/pytorchReplicaSpecs/Master/replicas",
                    json!(2147483647),
                );
                set(
                    m,
                    "/spec/pytorchReplicaSpecs/Worker/replicas",
                    json!(2147483647),
                );
            },
        ),
        case(
            "negative-replicas",
            T,
            S,
            INVALID,
            "non-negative integer",
            false,
            |m| {
                set(m, "/spec/tfReplicaSpecs/Worker/replicas", json!(-1));
            },
        ),
        case(
            "mpi-negative-workers",
            M,
            V,
            INVALID,
            "non-negative integer",
            false,
            |m| {
                set(m, "/spec/mpiReplicaSpecs/Worker/replicas", json!(-3));
            },
        ),
        case(
            "no-template",
            P,
            S,
            INVALID,
            "no pod template",
            false,
            |m| {
                set(m, "/spec/pytorchReplicaSpecs/Worker/template", Value::Null);
            },
        ),
        case(
            "no-replica-specs",
            P,
            S,
            INVALID,
            "pytorchReplicaSpecs",
            false,
            |m| {
                set(m, "/spec/pytorchReplicaSpecs", json!({}));
            },
        ),
        case("link-64", P, S, INVALID, "64 characters", false, |m| {
            all_templates(P, m, |t| {
                set(
                    t,
                    "/metadata/labels/scheduling.x-k8s.io~1pod-group",
                    Value::Null,
                );
                t["metadata"]["labels"] = json!({"scheduling.x-k8s.io/pod-group": "a".repeat(64)});
            });
        }),
        case(
            "link-not-a-name",
            P,
            S,
            INVALID,
            "not a valid object name",
            false,
            |m| {
                all_templates(P, m, |t| {
                    t["metadata"]["labels"] = json!({"scheduling.x-k8s.io/pod-group": "Not_Valid"});
                });
            },
        ),
        case(
            "volcano-link-not-a-name",
            M,
            V,
            INVALID,
            "not a valid object name",
            false,
            |m| {
                all_templates(M, m, |t| {
                    t["metadata"]["annotations"] =
                        json!({"scheduling.k8s.io/group-name": "Not A PG!"});
                });
            },
        ),
        case(
            "queue-annotation-invalid",
            P,
            V,
            INVALID,
            "not a valid Volcano Queue name",
            false,
            |m| {
                m["metadata"]["annotations"] =
                    json!({"scheduling.volcano.sh/queue-name": "Not A Queue!"});
            },
        ),
        case(
            "queue-policy-invalid",
            T,
            V,
            INVALID,
            "not a valid Volcano Queue name",
            false,
            |m| {
                set(
                    m,
                    "/spec/runPolicy/schedulingPolicy/queue",
                    json!("Bad_Queue"),
                );
            },
        ),
        case(
            "priority-class-300",
            P,
            V,
            INVALID,
            "not a valid PriorityClass name",
            false,
            |m| {
                set(
                    m,
                    "/spec/runPolicy/schedulingPolicy/priorityClass",
                    json!("p".repeat(300)),
                );
            },
        ),
        case(
            "priority-class-invalid",
            M,
            V,
            INVALID,
            "not a valid PriorityClass name",
            false,
            |m| {
                set(
                    m,
                    "/spec/runPolicy/schedulingPolicy/priorityClass",
                    json!("Bad_Class"),
                );
            },
        ),
        case(&long_name, P, S, INVALID, "characters", false, |_| {}),
        case(
            "invalid-backend",
            P,
            S,
            "InvalidBackend",
            "kueue",
            false,
            |m| {
                m["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "kueue"});
            },
        ),
        case(
            "timeout-negative",
            P,
            S,
            WARN,
            "scheduleTimeoutSeconds -1 is negative",
            true,
            |m| {
                set(
                    m,
                    "/spec/runPolicy/schedulingPolicy/scheduleTimeoutSeconds",
                    json!(-1),
                );
            },
        ),
        case(
            "priority-class-missing",
            P,
            V,
            WARN,
            "does not exist",
            true,
            |m| {
                set(
                    m,
                    "/spec/runPolicy/schedulingPolicy/priorityClass",
                    json!("does-not-exist"),
                );
            },
        ),
        case("template-class-unknown", T, S, WARN, "nope", true, |m| {
            set(m, &(t(T, "PS") + "/spec/priorityClassName"), json!("nope"));
        }),
        case(
            "links-disagree",
            P,
            S,
            WARN,
            "different PodGroups",
            true,
            |m| {
                set(
                    m,
                    &(t(P, "Master") + "/metadata/labels"),
                    json!({"scheduling.x-k8s.io/pod-group": "gang-a"}),
                );
                set(
                    m,
                    &(t(P, "Worker") + "/metadata/labels"),
                    json!({"scheduling.x-k8s.io/pod-group": "gang-b"}),
                );
            },
        ),
        case(
            "unlinked",
            T,
            S,
            "MissingPodGroupLink",
            "scheduling.x-k8s.io/pod-group",
            true,
            |m| {
                all_templates(T, m, |t| t["metadata"] = json!({}));
            },
        ),
        case(
            "wrong-scheduler",
            M,
            V,
            "MissingPodGroupLink",
            "schedulerName",
            true,
            |m| {
                all_templates(M, m, |t| {
                    t["spec"]["schedulerName"] = json!("default-scheduler")
                });
                m["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "volcano"});
            },
        ),
        case(
            &format!("volcano-{}", "v".repeat(230)),
            P,
            V,
            "MissingPodGroupLink",
            "group-name",
            true,
            |m| all_templates(P, m, |t| t["metadata"] = json!({})),
        ),
        case(
            "conflict",
            P,
            S,
            "PodGroupConflict",
            "leaves it untouched",
            false,
            |_| {},
        ),
    ]
}

/// Jobs with nothing wrong, on every kind and backend.
fn good_jobs() -> Vec<Case> {
    let mut out = Vec::new();
    for (i, (kind, backend)) in [
        (Kind::PyTorchJob, Backend::SchedulerPlugins),
        (Kind::PyTorchJob, Backend::Volcano),
        (Kind::TFJob, Backend::SchedulerPlugins),
        (Kind::TFJob, Backend::Volcano),
        (Kind::MPIJob, Backend::SchedulerPlugins),
        (Kind::MPIJob, Backend::Volcano),
    ]
    .into_iter()
    .enumerate()
    {
        for j in 0..2 {
            out.push(case(
                &format!("good-{i}-{j}"),
                kind,
                backend,
                "",
                "",
                true,
                |_| {},
            ));
        }
    }
    out
}

async fn events_by_object(client: &Client, ns: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let list = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list events");
    for e in list.items {
        if let (Some(name), Some(reason)) = (e.regarding.and_then(|r| r.name), e.reason) {
            out.entry((name, reason))
                .or_default()
                .push(e.note.unwrap_or_default());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_job_gets_its_event_and_good_jobs_their_pod_groups() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "hostile", &[ENABLED]).await;
    // The PodGroup the "conflict" job's name is taken by.
    let foreign: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "conflict"}, "spec": {"minMember": 7}}))
    .unwrap();
    let foreign = jobs::api(&client, &ns, &Backend::SchedulerPlugins.ar())
        .create(&PostParams::default(), &foreign)
        .await
        .expect("foreign PodGroup");
    let ctl = controller::start(cluster, None, &[]);

    let corpus = corpus();
    assert!(corpus.len() >= 40, "{} cases", corpus.len());
    let good = good_jobs();
    let started = Instant::now();
    for c in corpus.iter().chain(&good) {
        let obj: DynamicObject = serde_json::from_value(c.manifest.clone()).unwrap();
        jobs::api(&client, &ns, &c.kind.ar())
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("the API server refused corpus job {}: {e}", c.name));
    }

    // Good jobs: a PodGroup each, promptly.
    for g in &good {
        jobs::wait_pg(&client, &ns, g.backend, &g.name, "good job", |_| true).await;
    }
    println!(
        "figure: {} good jobs among {} hostile ones had their PodGroups {:.1} s after the first create",
        good.len(),
        corpus.len(),
        started.elapsed().as_secs_f64()
    );

    // Every hostile job: its Event, with the words that say what is wrong.
    let missing = support::wait_for("every corpus Event", Duration::from_secs(90), || async {
        let events = events_by_object(&client, &ns).await;
        let missing: Vec<String> = corpus
            .iter()
            .filter(|c| {
                !events
                    .get(&(c.name.clone(), c.reason.to_string()))
                    .is_some_and(|notes| notes.iter().any(|n| n.contains(c.note)))
            })
            .map(|c| format!("{} ({} {:?})", c.name, c.reason, c.note))
            .collect();
        missing.is_empty().then_some(missing)
    })
    .await;
    assert!(missing.is_empty());

    for c in &corpus {
        let pg = jobs::get_pg(&client, &ns, c.backend, &c.name).await;
        if c.name == "conflict" {
            let pg = pg.expect("the foreign PodGroup");
            assert_eq!(
                pg.metadata.resource_version, foreign.metadata.resource_version,
                "the foreign PodGroup was touched"
            );
        } else {
            assert_eq!(pg.is_some(), c.pod_group, "{}: PodGroup present", c.name);
        }
    }
    let timeout = jobs::get_pg(&client, &ns, Backend::SchedulerPlugins, "timeout-negative")
        .await
        .unwrap();
    assert!(jobs::spec(&timeout).get("scheduleTimeoutSeconds").is_none());
    // Each Event once: nothing was published twice.
    let events = events_by_object(&client, &ns).await;
    for ((name, reason), notes) in &events {
        assert_eq!(
            notes.len(),
            1,
            "{reason} on {name} published {} times",
            notes.len()
        );
    }
    assert_eq!(ctl.metric("podgroup_sync_events_failed_total", &[]), 0.0);
    println!(
        "figure: hostile corpus: {} bad jobs, {} Events, {} InvalidSpec",
        corpus.len(),
        events.len(),
        events.keys().filter(|(_, r)| r == "InvalidSpec").count()
    );
}

/// The API server's count of PodGroup writes it answered 422.
fn refused_pod_group_writes(cluster: &support::Cluster) -> f64 {
    let text = cluster.kubectl_ok(&["get", "--raw", "/metrics"]);
    metric_sum(
        &text,
        "apiserver_request_total",
        &[("resource", "podgroups"), ("code", "422")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_group_refused_by_an_admission_policy_is_retried_with_a_backoff_and_created_once_the_policy_is_relaxed()
 {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "refused", &[ENABLED]).await;
    cluster.kubectl_ok(&["label", "namespace", &ns, &format!("pgs-refuse={ns}")]);
    // A cluster policy the controller cannot know of: gangs above 50 pods are refused (422).
    let policy = |max: u32| {
        format!(
            r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: max-gang-{ns}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: ["scheduling.x-k8s.io"]
      apiVersions: ["*"]
      operations: ["CREATE", "UPDATE"]
      resources: ["podgroups"]
  validations:
  - expression: "object.spec.minMember <= {max}"
    message: "spec.minMember: at most 50 pods per gang in this cluster"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: max-gang-{ns}
spec:
  policyName: max-gang-{ns}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels:
        pgs-refuse: {ns}
"#
        )
    };
    let file = std::env::temp_dir().join(format!("vap-{ns}.yaml"));
    std::fs::write(&file, policy(50)).unwrap();
    cluster.kubectl_ok(&["apply", "-f", &file.display().to_string()]);
    // The policy takes effect once the API server has loaded it.
    support::wait_for("the policy in force", Duration::from_secs(30), || async {
        let probe: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "probe"}, "spec": {"minMember": 51}}))
        .unwrap();
        let pp = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match jobs::api(&client, &ns, &Backend::SchedulerPlugins.ar())
            .create(&pp, &probe)
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 422 => Some(()),
            _ => None,
        }
    })
    .await;

    let ctl = controller::start(cluster, None, &[]);
    let before = refused_pod_group_writes(cluster);
    let manifest = jobs::job(Kind::PyTorchJob, Backend::SchedulerPlugins, "too-big", 60);
    jobs::create(&client, &ns, Kind::PyTorchJob, &manifest).await;
    let event = jobs::wait_event(&client, &ns, "too-big", "PodGroupRefused").await;
    let note = event.note.unwrap_or_default();
    eprintln!("PodGroupRefused: {note}");
    assert!(
        note.contains(&format!("ValidatingAdmissionPolicy \"max-gang-{ns}\""))
            && note.contains("at most 50 pods"),
        "{note}"
    );
    // Sent again with a backoff (1, 2, 4, 8 s), and at once when the namespace changes.
    cluster.kubectl_ok(&["annotate", "namespace", &ns, "touched=1"]);
    tokio::time::sleep(Duration::from_secs(12)).await;
    let refused = refused_pod_group_writes(cluster) - before;
    println!("figure: PodGroup refused at admission: {refused} write(s) in 12 s");
    assert!(
        (3.0..=7.0).contains(&refused),
        "{refused} refused writes in 12 s: expected a backoff of 1, 2, 4, 8 s"
    );
    assert!(
        jobs::get_pg(&client, &ns, Backend::SchedulerPlugins, "too-big")
            .await
            .is_none()
    );
    assert_eq!(
        jobs::events(&client, &ns, "too-big", "PodGroupRefused")
            .await
            .len(),
        1,
        "one Event for the same refusal"
    );
    assert_eq!(
        jobs::events(&client, &ns, "too-big", "InvalidSpec")
            .await
            .len(),
        0,
        "an admission refusal is no fault of the job's spec"
    );

    // The policy is relaxed: the PodGroup follows at once, with no restart and no job change.
    std::fs::write(&file, policy(100)).unwrap();
    cluster.kubectl_ok(&["apply", "-f", &file.display().to_string()]);
    let relaxed = std::time::Instant::now();
    jobs::wait_pg(
        &client,
        &ns,
        Backend::SchedulerPlugins,
        "too-big",
        "created once the policy is relaxed",
        |pg| jobs::spec(pg)["minMember"] == 61,
    )
    .await;
    let took = relaxed.elapsed();
    println!("figure: PodGroup created {took:?} after the policy was relaxed");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let _ = ctl;
    cluster.kubectl(&["delete", "-f", &file.display().to_string()]);
}
