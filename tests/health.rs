//! Gang health and hygiene (SPEC §10) on a real control plane: the stale-PodGroup audit (a
//! foreign PodGroup of a finished or deleted job is reported once and left alone; an orphan of
//! ours is removed after a restart), the feasibility check against real Node and Volcano Queue
//! objects, and `explain --kubeconfig` / `--job` against the cluster's PriorityClasses,
//! LimitRanges and RuntimeClasses. The tests run one at a time (each owns its controller).

mod support;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Api, Client};
use serde_json::{Value, json};
use support::controller::{self, Controller};
use support::jobs::{self, Backend, Kind, ar, spec, wait_pg, wait_pg_gone};

const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");
const AUDIT_EVERY_SECOND: [&str; 2] = ["--audit-interval-seconds", "1"];

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A PodGroup of `backend` named `name`, controlled by `owner` (a job object) and not made by
/// podgroup-sync (no managed-by label): what an operator with its own gang mode on leaves.
fn foreign_pod_group(backend: Backend, name: &str, owner: &DynamicObject) -> DynamicObject {
    let ar = backend.ar();
    let types = owner.types.clone().expect("owner types");
    serde_json::from_value(json!({
        "apiVersion": ar.api_version, "kind": "PodGroup",
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": types.api_version, "kind": types.kind,
            "name": owner.metadata.name, "uid": owner.metadata.uid, "controller": true}]},
        "spec": {"minMember": 2},
    }))
    .unwrap()
}

async fn create_pg(client: &Client, ns: &str, backend: Backend, pg: &DynamicObject) {
    jobs::api(client, ns, &backend.ar())
        .create(&PostParams::default(), pg)
        .await
        .expect("create foreign PodGroup");
}

/// Marks a job Succeeded through its status, as its operator would.
async fn finish(client: &Client, ns: &str, kind: Kind, name: &str) {
    let status = json!({"status": {"conditions": [{"type": "Succeeded", "status": "True",
        "reason": "Done", "message": "done", "lastTransitionTime": "2026-12-01T00:00:00Z",
        "lastUpdateTime": "2026-12-01T00:00:00Z"}], "replicaStatuses": {}}});
    jobs::patch(client, ns, kind, name, status, true).await;
}

/// Waits until the controller's metric (summed over the series with these labels) is `value`:
/// the audit sets its gauges and counters just after the writes and Events the test sees.
async fn wait_metric(ctl: &Controller, name: &str, labels: &[(&str, &str)], value: f64) {
    support::wait_for(
        &format!("{name} {labels:?} = {value}"),
        jobs::WAIT,
        || async { (ctl.metric(name, labels) == value).then_some(()) },
    )
    .await;
}

fn audit_controller(cluster: &support::Cluster, extra: &[&str]) -> Controller {
    let mut args = AUDIT_EVERY_SECOND.to_vec();
    args.extend_from_slice(extra);
    controller::start(cluster, None, &args)
}

#[tokio::test]
async fn a_foreign_pod_group_whose_job_finished_is_reported_once_and_left_alone() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    // Not enabled: the jobs there are not podgroup-sync's business, their PodGroups are audited.
    let ns = support::test_namespace(&client, "stale-foreign", &[]).await;
    let ctl = audit_controller(cluster, &[]);
    let job = jobs::create(
        &client,
        &ns,
        Kind::PyTorchJob,
        &jobs::job(Kind::PyTorchJob, Backend::Volcano, "done", 1),
    )
    .await;
    create_pg(
        &client,
        &ns,
        Backend::Volcano,
        &foreign_pod_group(Backend::Volcano, "done", &job),
    )
    .await;
    // A running job's PodGroup is not stale.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        jobs::events(&client, &ns, "done", "StalePodGroup")
            .await
            .is_empty()
    );
    finish(&client, &ns, Kind::PyTorchJob, "done").await;
    let event = jobs::wait_event(&client, &ns, "done", "StalePodGroup").await;
    let note = event.note.clone().unwrap_or_default();
    let regarding = event.regarding.clone().unwrap();
    eprintln!("StalePodGroup: {note}");
    assert_eq!(regarding.kind.as_deref(), Some("PodGroup"));
    assert_eq!(
        regarding.api_version.as_deref(),
        Some("scheduling.volcano.sh/v1beta1")
    );
    assert!(note.contains("its controller PyTorchJob done"), "{note}");
    assert!(note.contains("has finished"), "{note}");
    wait_metric(
        &ctl,
        "podgroup_sync_stale_podgroups",
        &[("backend", "volcano"), ("reason", "owner_finished")],
        1.0,
    )
    .await;
    // Several passes later: still one Event, the PodGroup untouched.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        jobs::events(&client, &ns, "done", "StalePodGroup")
            .await
            .len(),
        1
    );
    let pg = jobs::get_pg(&client, &ns, Backend::Volcano, "done")
        .await
        .expect("left alone");
    assert_eq!(spec(&pg)["minMember"], 2);
    assert_eq!(
        ctl.metric("podgroup_sync_stale_podgroups_deleted_total", &[]),
        0.0
    );
    assert!(ctl.metric("podgroup_sync_audit_duration_seconds_count", &[]) >= 4.0);
}

/// A dry-run namespace sees no write of any kind, the audit's deletes included: a stale
/// PodGroup of ours there is reported (`WouldDeletePodGroup`, once) and survives the audits.
#[tokio::test]
async fn a_stale_pod_group_of_ours_in_a_dry_run_namespace_survives_the_audit_and_is_reported() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "stale-dry-run", &[ENABLED]).await;
    let ctl = audit_controller(cluster, &[]);
    let b = Backend::SchedulerPlugins;
    let job = jobs::job(Kind::PyTorchJob, b, "finished", 1);
    jobs::create(&client, &ns, Kind::PyTorchJob, &job).await;
    wait_pg(&client, &ns, b, "finished", "created", |_| true).await;
    let dry_run = json!({"metadata": {"annotations": {ENABLED.0: "dry-run"}}});
    Api::<Namespace>::all(client.clone())
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&dry_run))
        .await
        .expect("namespace to dry-run");
    finish(&client, &ns, Kind::PyTorchJob, "finished").await;
    let event = jobs::wait_event(&client, &ns, "finished", "WouldDeletePodGroup").await;
    let note = event.note.clone().unwrap_or_default();
    eprintln!("WouldDeletePodGroup: {note}");
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert!(
        note.contains("has finished") && note.contains("dry-run"),
        "{note}"
    );
    // Two more audit passes (one a second) at least: still there, still one Event.
    let passes = ctl.metric("podgroup_sync_audit_duration_seconds_count", &[]);
    support::wait_for("two more audit passes", jobs::WAIT, || async {
        (ctl.metric("podgroup_sync_audit_duration_seconds_count", &[]) >= passes + 2.0)
            .then_some(())
    })
    .await;
    assert!(
        jobs::get_pg(&client, &ns, b, "finished").await.is_some(),
        "the PodGroup of a finished job in a dry-run namespace is kept"
    );
    assert_eq!(
        jobs::events(&client, &ns, "finished", "WouldDeletePodGroup")
            .await
            .len(),
        1
    );
    assert_eq!(
        ctl.metric("podgroup_sync_stale_podgroups_deleted_total", &[]),
        0.0
    );
}

#[tokio::test]
async fn an_orphan_of_ours_is_removed_after_a_restart() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "stale-orphan", &[ENABLED]).await;
    let mut first = audit_controller(cluster, &[]);
    let b = Backend::SchedulerPlugins;
    jobs::create(
        &client,
        &ns,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, b, "orphan", 1),
    )
    .await;
    jobs::create(
        &client,
        &ns,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, b, "kept", 1),
    )
    .await;
    wait_pg(&client, &ns, b, "orphan", "created", |_| true).await;
    wait_pg(&client, &ns, b, "kept", "created", |_| true).await;
    first.stop();
    // Deleted while the controller is down, with orphan propagation: the garbage collector
    // strips the ownerReference and leaves the PodGroup behind.
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    jobs::api(&client, &ns, &Kind::TFJob.ar())
        .delete("orphan", &dp)
        .await
        .expect("delete");
    wait_pg(
        &client,
        &ns,
        b,
        "orphan",
        "without an ownerReference",
        |pg| {
            pg.metadata
                .owner_references
                .as_ref()
                .is_none_or(|r| r.is_empty())
        },
    )
    .await;
    let second = audit_controller(cluster, &[]);
    wait_pg_gone(&client, &ns, b, "orphan", "removed by the audit").await;
    wait_metric(
        &second,
        "podgroup_sync_stale_podgroups_deleted_total",
        &[("reason", "no_owner")],
        1.0,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        jobs::get_pg(&client, &ns, b, "kept").await.is_some(),
        "a live job's PodGroup stays"
    );
}

#[tokio::test]
async fn without_a_garbage_collector_stale_pod_groups_of_deleted_jobs_are_removed_if_ours_reported_if_not()
 {
    let _serial = SERIAL.lock().await;
    let cluster = support::private_cluster_with(&[("START_KCM", "0")]);
    let client = cluster.client().await;
    // No namespace controller either: namespaces are created, never deleted.
    let ns = "gcless";
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &support::namespace(ns, &[ENABLED]))
        .await
        .expect("namespace");
    let mut first = audit_controller(&cluster, &[]);
    let b = Backend::SchedulerPlugins;
    jobs::create(
        &client,
        ns,
        Kind::PyTorchJob,
        &jobs::job(Kind::PyTorchJob, b, "ours", 1),
    )
    .await;
    let other = jobs::job(Kind::PyTorchJob, b, "other", 1);
    let mut other = other;
    other["metadata"]["annotations"] = json!({"podgroup-sync.io/enabled": "false"});
    let other = jobs::create(&client, ns, Kind::PyTorchJob, &other).await;
    create_pg(&client, ns, b, &foreign_pod_group(b, "foreign", &other)).await;
    wait_pg(&client, ns, b, "ours", "created", |_| true).await;
    first.stop();
    jobs::delete(&client, ns, &Kind::PyTorchJob.ar(), "ours").await;
    jobs::delete(&client, ns, &Kind::PyTorchJob.ar(), "other").await;
    let second = audit_controller(&cluster, &[]);
    wait_pg_gone(&client, ns, b, "ours", "removed by the audit").await;
    let event = jobs::wait_event(&client, ns, "foreign", "StalePodGroup").await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("PyTorchJob other") && note.contains("no longer exists"),
        "{note}"
    );
    assert!(
        jobs::get_pg(&client, ns, b, "foreign").await.is_some(),
        "not ours: never deleted"
    );
    wait_metric(
        &second,
        "podgroup_sync_stale_podgroups_deleted_total",
        &[("reason", "owner_deleted")],
        1.0,
    )
    .await;
    wait_metric(
        &second,
        "podgroup_sync_stale_podgroups",
        &[
            ("backend", "scheduler-plugins"),
            ("reason", "owner_deleted"),
        ],
        1.0,
    )
    .await;
    drop(second);
    support::stop_cluster(&cluster);
}

/// A Node with this allocatable (set through the status subresource, as a kubelet would).
async fn node(client: &Client, name: &str, cpu: &str, gpus: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let n: Node =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"test": "health"}}}))
            .unwrap();
    nodes
        .create(&PostParams::default(), &n)
        .await
        .expect("create node");
    let status = json!({"status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110", "nvidia.com/gpu": gpus},
        "capacity": {"cpu": cpu, "memory": "64Gi", "pods": "110", "nvidia.com/gpu": gpus}}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
    // Admission taints a new node not-ready (no kubelet clears it here): a passing condition
    // the feasibility check ignores, as it does for a node that is just joining.
    let n = nodes.get(name).await.expect("node");
    let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .all(|t| t.key.starts_with("node.kubernetes.io/")),
        "{taints:?}"
    );
}

async fn delete_nodes(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes
        .delete_collection(
            &DeleteParams::default(),
            &kube::api::ListParams::default().labels("test=health"),
        )
        .await;
}

#[tokio::test]
async fn nodes_too_small_for_a_gang_are_reported_with_the_figures_and_cleared_by_a_big_node() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    delete_nodes(&client).await;
    node(&client, "health-small", "8", "1").await;
    // An annotation of its own: jobs the other tests left in enabled namespaces stay out of the
    // gauge this test reads.
    let ns =
        support::test_namespace(&client, "infeasible", &[("health.test/enabled", "true")]).await;
    let ctl = audit_controller(
        cluster,
        &[
            "--gang-feasibility",
            "--annotation-key",
            "health.test/enabled",
        ],
    );
    let b = Backend::SchedulerPlugins;
    let mut job = jobs::job(Kind::PyTorchJob, b, "big", 2);
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]
        ["limits"] = json!({"nvidia.com/gpu": 2});
    jobs::create(&client, &ns, Kind::PyTorchJob, &job).await;
    // Reported, never blocking: the PodGroup is there.
    wait_pg(&client, &ns, b, "big", "created", |_| true).await;
    let note = jobs::wait_event(&client, &ns, "big", "GangInfeasible")
        .await
        .note
        .unwrap_or_default();
    eprintln!("GangInfeasible: {note}");
    assert!(
        note.contains("a Worker pod requests {cpu=2, nvidia.com/gpu=2} and fits no schedulable node: 1 of 1 nodes accept its tolerations, the most any of them offers is {cpu=8, nvidia.com/gpu=1}"),
        "{note}"
    );
    assert!(note.contains("minResources nvidia.com/gpu=4 exceeds the 1 allocatable on all 1 schedulable nodes together"), "{note}");
    support::wait_for("the infeasible gauge", jobs::WAIT, || async {
        (ctl.metric("podgroup_sync_infeasible_gangs", &[("reason", "capacity")]) == 1.0)
            .then_some(())
    })
    .await;
    node(&client, "health-big", "32", "4").await;
    let cleared = jobs::wait_event(&client, &ns, "big", "GangFeasible").await;
    assert_eq!(cleared.type_.as_deref(), Some("Normal"));
    support::wait_for("the infeasible gauge back at 0", jobs::WAIT, || async {
        (ctl.metric("podgroup_sync_infeasible_gangs", &[("reason", "capacity")]) == 0.0)
            .then_some(())
    })
    .await;
    // The big node's status arrives after the node (as a kubelet's does): a note with the
    // interim figures may come in between, so the Events are not counted.
    delete_nodes(&client).await;
}

async fn queue(client: &Client, name: &str, state: Option<&str>) {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ar("scheduling.volcano.sh", "v1beta1", "Queue", "queues"),
    );
    let q: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": name}, "spec": {"weight": 1}}),
    )
    .unwrap();
    api.create(&PostParams::default(), &q)
        .await
        .expect("create queue");
    if let Some(state) = state {
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"state": state}})),
        )
        .await
        .expect("queue status");
    }
}

fn volcano_job(name: &str, queue: &str) -> Value {
    let mut job = jobs::job(Kind::PyTorchJob, Backend::Volcano, name, 1);
    job["spec"]["runPolicy"] = json!({"schedulingPolicy": {"queue": queue}});
    job
}

#[tokio::test]
async fn a_missing_or_closed_volcano_queue_is_reported() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "queues", &[ENABLED]).await;
    let _ctl = audit_controller(cluster, &["--gang-feasibility"]);
    let missing = format!("{ns}-later");
    let closed = format!("{ns}-closed");
    queue(&client, &closed, Some("Closed")).await;
    jobs::create(
        &client,
        &ns,
        Kind::PyTorchJob,
        &volcano_job("later", &missing),
    )
    .await;
    jobs::create(
        &client,
        &ns,
        Kind::PyTorchJob,
        &volcano_job("shut", &closed),
    )
    .await;
    let note = jobs::wait_event(&client, &ns, "later", "QueueUnavailable")
        .await
        .note
        .unwrap_or_default();
    assert!(
        note.contains(&format!("Volcano queue {missing:?} does not exist")),
        "{note}"
    );
    let note = jobs::wait_event(&client, &ns, "shut", "QueueUnavailable")
        .await
        .note
        .unwrap_or_default();
    assert!(
        note.contains(&format!("Volcano queue {closed:?} is Closed")),
        "{note}"
    );
    wait_pg(
        &client,
        &ns,
        Backend::Volcano,
        "later",
        "created anyway",
        |pg| spec(pg)["queue"] == missing.as_str(),
    )
    .await;
    queue(&client, &missing, Some("Open")).await;
    let note = jobs::wait_event(&client, &ns, "later", "GangFeasible")
        .await
        .note
        .unwrap_or_default();
    assert!(note.contains("is Open"), "{note}");
}

/// `podgroup-sync explain` with these arguments; its standard output.
fn explain(args: &[&str]) -> String {
    String::from_utf8(support::stdout_of(
        Command::new(env!("CARGO_BIN_EXE_podgroup-sync"))
            .arg("explain")
            .args(args),
    ))
    .unwrap()
}

#[tokio::test]
async fn explain_with_the_clusters_context_gives_the_pod_group_the_controller_writes() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "explain", &[ENABLED]).await;
    let id = &ns[ns.len() - 5..];
    let (base, low, kata) = (
        format!("base-{id}"),
        format!("low-{id}"),
        format!("kata-{id}"),
    );
    let context = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": base}, "value": 50, "globalDefault": true},
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": low}, "value": 100},
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": kata}, "handler": "kata",
            "overhead": {"podFixed": {"cpu": "250m", "memory": "128Mi"}}},
        {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults", "namespace": ns},
            "spec": {"limits": [{"type": "Container", "defaultRequest": {"memory": "2Gi"}, "default": {"memory": "4Gi"}}]}},
    ]});
    let dir = std::env::temp_dir().join(format!("pgs-explain-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let context_file = dir.join("context.json");
    std::fs::write(&context_file, context.to_string()).unwrap();
    cluster.kubectl_ok(&["apply", "-f", &context_file.display().to_string()]);

    // 1 Master (global default, 50) and 3 Workers (low, 100) with the RuntimeClass; minAvailable
    // 2 counts the two highest-priority pods: two Workers — offline, unknown classes count 0 and
    // the Master goes first.
    let mut job = jobs::job(Kind::PyTorchJob, Backend::Volcano, "ctx", 3);
    job["metadata"]["namespace"] = json!(ns);
    job["spec"]["runPolicy"] = json!({"schedulingPolicy": {"minAvailable": 2}});
    let worker = &mut job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"];
    worker["priorityClassName"] = json!(low);
    worker["runtimeClassName"] = json!(kata);
    let job_file = dir.join("job.json");
    std::fs::write(&job_file, job.to_string()).unwrap();

    let _ctl = controller::start(cluster, None, &[]);
    jobs::create(&client, &ns, Kind::PyTorchJob, &job).await;
    let written = wait_pg(&client, &ns, Backend::Volcano, "ctx", "created", |_| true).await;
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let job_path = job_file.display().to_string();
    let pod_group =
        |out: &str| -> Value { serde_yaml_ng::from_str(out).expect("explain's PodGroup") };

    let online = explain(&["-f", &job_path, "--kubeconfig", &kubeconfig]);
    eprintln!("{online}");
    assert!(online.contains("# context from the cluster"), "{online}");
    assert_eq!(
        pod_group(&online)["spec"],
        spec(&written),
        "explain --kubeconfig = the controller's PodGroup"
    );
    // Memory from the LimitRange, cpu and memory overhead from the RuntimeClass, two Workers.
    assert_eq!(
        spec(&written)["minResources"],
        json!({"cpu": "4500m", "memory": "4352Mi", "nvidia.com/gpu": "2"})
    );
    assert_eq!(spec(&written)["priorityClassName"], json!(low));

    let offline = explain(&["-f", &job_path]);
    assert!(
        offline.contains(&format!("PriorityClass {low:?} is unknown offline")),
        "{offline}"
    );
    assert_ne!(
        pod_group(&offline)["spec"],
        spec(&written),
        "offline lacks the cluster's context"
    );
    // The same context given as manifests gives the same PodGroup offline.
    let given = explain(&["-f", &job_path, "-f", &context_file.display().to_string()]);
    assert_eq!(pod_group(&given)["spec"], spec(&written));

    let compared = explain(&["--job", &format!("{ns}/ctx"), "--kubeconfig", &kubeconfig]);
    assert!(
        compared.contains("holds exactly what podgroup-sync applies"),
        "{compared}"
    );
    jobs::patch(
        &client,
        &ns,
        Kind::PyTorchJob,
        "ctx",
        json!({"spec": {"runPolicy": {"schedulingPolicy": {"minAvailable": 3}}}}),
        false,
    )
    .await;
    wait_pg(&client, &ns, Backend::Volcano, "ctx", "resized", |pg| {
        spec(pg)["minMember"] == 3
    })
    .await;
    let api: Api<DynamicObject> = jobs::api(&client, &ns, &Backend::Volcano.ar());
    // Someone edits the size behind the controller's back, while it is stopped.
    drop(_ctl);
    api.patch(
        "ctx",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minMember": 7}})),
    )
    .await
    .expect("edit");
    let compared = explain(&["--job", &format!("{ns}/ctx"), "--kubeconfig", &kubeconfig]);
    assert!(
        compared.contains("spec.minMember: the cluster has 7, podgroup-sync applies 3"),
        "{compared}"
    );
    cluster.kubectl_ok(&["delete", "-f", &context_file.display().to_string()]);
}
