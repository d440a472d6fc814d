//! The native backend (SPEC §9) on a real Kubernetes 1.37 control plane with the
//! GenericWorkload gate on (tests/cluster/start.sh NATIVE_GANG=1): the lifecycle rows of SPEC §4
//! named as in `tests/lifecycle.rs`, the pod-link webhook called by the real API server, the
//! immutable priority class, and a restart that writes nothing. `make native` runs it;
//! `cargo test` leaves it out (it needs the 1.37 binaries).

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use support::controller::{self, Controller};
use support::jobs::{
    self, Backend, KINDS, Kind, WORKLOAD_KINDS, expected_spec_of, spec, wait_pg, wait_pg_gone,
};
use support::lifecycle::{Gang, Row};
use support::webhook::{self as wh, operator_pod};
use tokio::sync::OnceCell;

const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");
const NATIVE: (&str, &str) = ("podgroup-sync.io/backend", "kubernetes");
/// The namespace label the shared webhook configuration selects.
const WEBHOOK: &str = "pgs-native";
const B: Backend = Backend::Kubernetes;

struct Shared {
    controller: Mutex<Controller>,
}

static SHARED: OnceCell<Shared> = OnceCell::const_new();

/// The 1.37 control plane, one controller with the webhook on for the whole binary, and a
/// client.
async fn setup() -> Client {
    support::use_native_gang();
    support::use_workload_crds();
    let cluster = support::cluster().await;
    SHARED
        .get_or_init(|| async {
            let dir = std::env::temp_dir().join(format!("native-webhook-{}", std::process::id()));
            let certs = wh::certs(&dir, "native-ca");
            let port = controller::free_port();
            let mut args = wh::args(port, &certs);
            args.extend(["--gang-wait-warning-seconds", "3", "--batch-jobs"].map(String::from));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let c = controller::start(cluster, None, &args);
            let client = cluster.client().await;
            wh::register(&client, &wh::configuration(WEBHOOK, port, &certs.ca_pem)).await;
            Shared {
                controller: Mutex::new(c),
            }
        })
        .await;
    cluster.client().await
}

fn log() -> String {
    SHARED
        .get()
        .map(|s| s.controller.lock().unwrap().log_tail())
        .unwrap_or_default()
}

async fn namespace(client: &Client, annotations: &[(&str, &str)]) -> String {
    wh::namespace(client, WEBHOOK, annotations).await
}

async fn row(row: Row, kind: Kind) {
    let client = setup().await;
    let ns = namespace(&client, &[ENABLED]).await;
    let gang = Gang {
        client: &client,
        ns: &ns,
        kind,
        backend: B,
        name: "gang",
        log: &log,
    };
    // minCount is mutable in v1beta1: SpecChanged checks the same object is resized in place.
    gang.through(row).await;
}

async fn every_kind(r: Row) {
    let kinds = KINDS.into_iter().chain(WORKLOAD_KINDS);
    futures::future::join_all(kinds.map(|k| row(r, k))).await;
}

#[tokio::test]
async fn row_job_created_gets_the_exact_pod_group() {
    every_kind(Row::Created).await;
}

#[tokio::test]
async fn row_job_spec_change_is_followed() {
    every_kind(Row::SpecChanged).await;
}

#[tokio::test]
async fn row_pod_group_deleted_by_someone_is_recreated() {
    every_kind(Row::DeletedBySomeone).await;
}

#[tokio::test]
async fn row_job_suspended_deletes_and_resume_recreates_with_the_current_size() {
    every_kind(Row::SuspendedAndResumed).await;
}

#[tokio::test]
async fn row_job_succeeded_deletes_the_pod_group() {
    every_kind(Row::Finished).await;
}

#[tokio::test]
async fn row_job_deleted_lets_the_garbage_collector_remove_the_pod_group() {
    every_kind(Row::JobDeleted).await;
}

async fn set_mode(client: &Client, ns: &str, mode: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    api.patch(
        ns,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"annotations": {ENABLED.0: mode}}})),
    )
    .await
    .expect("annotate namespace");
}

#[tokio::test]
async fn namespace_annotation_off_removes_on_creates_dry_run_only_reports() {
    let client = setup().await;
    let ns = namespace(&client, &[ENABLED]).await;
    let kind = Kind::TFJob;
    jobs::create(&client, &ns, kind, &jobs::job(kind, B, "t", 1)).await;
    wait_pg(&client, &ns, B, "t", "created", |_| true).await;
    set_mode(&client, &ns, "false").await;
    wait_pg_gone(&client, &ns, B, "t", "namespace turned off").await;
    set_mode(&client, &ns, "dry-run").await;
    let ev = jobs::wait_event(&client, &ns, "t", "WouldCreatePodGroup").await;
    let note = ev.note.unwrap_or_default();
    assert!(note.contains("\"minCount\":2"), "{note}");
    assert!(jobs::get_pg(&client, &ns, B, "t").await.is_none());
    set_mode(&client, &ns, "true").await;
    let pg = wait_pg(&client, &ns, B, "t", "namespace turned on again", |_| true).await;
    assert_eq!(spec(&pg), expected_spec_of(kind, B, 1));
}

#[tokio::test]
async fn a_foreign_pod_group_of_the_same_name_is_left_untouched() {
    let client = setup().await;
    let ns = namespace(&client, &[ENABLED]).await;
    let foreign: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "taken"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 7}}}
    }))
    .unwrap();
    let created = jobs::api(&client, &ns, &B.ar())
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create a foreign PodGroup");
    let kind = Kind::PyTorchJob;
    jobs::create(&client, &ns, kind, &jobs::job(kind, B, "taken", 1)).await;
    let ev = jobs::wait_event(&client, &ns, "taken", "PodGroupConflict").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let now = jobs::get_pg(&client, &ns, B, "taken").await.expect("kept");
    assert_eq!(
        now.metadata.resource_version,
        created.metadata.resource_version,
        "the foreign PodGroup was modified\n{}",
        log()
    );
    assert_eq!(spec(&now)["schedulingPolicy"]["gang"]["minCount"], 7);
}

/// The pod's `spec.schedulingGroup.podGroupName` as the API server stored it (read untyped:
/// the typed 1.34 Pod has no such field).
async fn scheduling_group(client: &Client, ns: &str, pod: &str) -> Option<String> {
    let ar = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
    let pod = jobs::api(client, ns, &ar).get(pod).await.expect("get pod");
    pod.data
        .pointer("/spec/schedulingGroup/podGroupName")
        .and_then(Value::as_str)
        .map(str::to_string)
}

#[tokio::test]
async fn rule_9_the_webhook_links_pods_of_every_kind_through_the_scheduling_group() {
    let client = setup().await;
    let ns = namespace(&client, &[ENABLED, NATIVE]).await;
    for kind in KINDS {
        let name = format!("{}-job", kind.ar().plural.trim_end_matches('s'));
        let job = jobs::create(&client, &ns, kind, &jobs::job(kind, B, &name, 2)).await;
        for replica_type in kind.head().into_iter().chain(["Worker"]) {
            let launcher = if kind == Kind::MPIJob && replica_type == "Launcher" {
                Some(wh::launcher_job(&client, &ns, &job).await)
            } else {
                None
            };
            let pod = operator_pod(kind, &job, replica_type, launcher.as_ref());
            let pod = wh::create_pod(&client, &ns, &pod).await;
            let pod_name = pod.metadata.name.clone().unwrap();
            assert_eq!(
                scheduling_group(&client, &ns, &pod_name).await,
                Some(name.clone()),
                "{kind:?} {replica_type}\n{}",
                log()
            );
            // The annotation the metadata-only pod watch reads, and the default scheduler.
            assert_eq!(
                wh::link_of(&pod, B),
                (Some(name.clone()), Some("default-scheduler".into()))
            );
        }
        wait_pg(&client, &ns, B, &name, "created", |_| true).await;
    }
    // A job whose priority class is no valid name gets no PodGroup (InvalidSpec): its pods get
    // no link — for this backend an immutable one — to a PodGroup that never comes.
    let bad = with_class(jobs::job(Kind::PyTorchJob, B, "bad-class", 2), "Bad_Class");
    let job = jobs::create(&client, &ns, Kind::PyTorchJob, &bad).await;
    let pod = operator_pod(Kind::PyTorchJob, &job, "Worker", None);
    let pod = wh::create_pod(&client, &ns, &pod).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    assert_eq!(
        scheduling_group(&client, &ns, &pod_name).await,
        None,
        "{}",
        log()
    );
    jobs::wait_event(&client, &ns, "bad-class", "InvalidSpec").await;
    // With the webhook on, unlinked templates are expected: no MissingPodGroupLink.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        jobs::events(&client, &ns, "pytorchjob-job", "MissingPodGroupLink")
            .await
            .is_empty()
    );
}

async fn priority_class(client: &Client, name: &str, value: i32) {
    let pc: k8s_openapi::api::scheduling::v1::PriorityClass =
        serde_json::from_value(json!({"metadata": {"name": name}, "value": value})).unwrap();
    let api: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
    match api.create(&PostParams::default(), &pc).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create PriorityClass {name}: {e}"),
    }
}

fn with_class(mut manifest: Value, class: &str) -> Value {
    manifest["spec"]["runPolicy"] = json!({"schedulingPolicy": {"priorityClass": class}});
    manifest
}

#[tokio::test]
async fn rule_9_the_priority_class_is_set_at_creation_and_a_change_is_reported_not_retried() {
    let client = setup().await;
    let ns = namespace(&client, &[ENABLED]).await;
    let kind = Kind::PyTorchJob;
    // A class that does not exist yet: the API server would refuse the PodGroup, so the job is
    // told and the PodGroup follows once the class exists.
    let class = format!("native-{}", ns.rsplit('-').next().unwrap());
    let manifest = with_class(jobs::job(kind, B, "prio", 1), &class);
    jobs::create(&client, &ns, kind, &manifest).await;
    let ev = jobs::wait_event(&client, &ns, "prio", "InvalidSpec").await;
    assert!(ev.note.unwrap_or_default().contains("does not exist"));
    priority_class(&client, &class, 1000).await;
    let pg = wait_pg(
        &client,
        &ns,
        B,
        "prio",
        "created once the class exists",
        |_| true,
    )
    .await;
    assert_eq!(spec(&pg)["priorityClassName"], json!(class));
    assert_eq!(spec(&pg)["priority"], 1000);

    // Another class: immutable on the server, so reported once and never sent.
    priority_class(&client, "native-other", 10).await;
    jobs::patch(
        &client,
        &ns,
        kind,
        "prio",
        json!({"spec": {"runPolicy": {"schedulingPolicy": {"priorityClass": "native-other"}}}}),
        false,
    )
    .await;
    let ev = jobs::wait_event(&client, &ns, "prio", "GangSpecWarning").await;
    let note = ev.note.unwrap_or_default();
    assert!(note.contains("priorityClassName cannot change"), "{note}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = jobs::get_pg(&client, &ns, B, "prio").await.unwrap();
    assert_eq!(
        now.metadata.resource_version,
        pg.metadata.resource_version,
        "the PodGroup was written\n{}",
        log()
    );
    // A resize still goes through, with the class the PodGroup has.
    jobs::patch(&client, &ns, kind, "prio", kind.scale(3), false).await;
    let resized = wait_pg(&client, &ns, B, "prio", "resized", |pg| {
        spec(pg)["schedulingPolicy"]["gang"]["minCount"] == 4
    })
    .await;
    assert_eq!(spec(&resized)["priorityClassName"], json!(class));
}

/// SPEC §13 with the TopologyAwareWorkloadScheduling gate off (alpha and off by default in
/// 1.37, as on this control plane): the API server drops `schedulingConstraints` from the
/// PodGroup without a word; the controller learns it from the create's answer, the job is told
/// that the topology is not enforced and why, and nothing is sent again. `disruptionMode` (no
/// gate) is kept.
#[tokio::test]
async fn rule_13_a_topology_the_api_server_drops_without_its_gate_is_reported_not_retried() {
    let client = setup().await;
    let ns = namespace(&client, &[ENABLED]).await;
    let kind = Kind::PyTorchJob;
    let mut manifest = jobs::job(kind, B, "rack", 1);
    manifest["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] =
        json!("topology.kubernetes.io/rack");
    manifest["metadata"]["annotations"]["podgroup-sync.io/disruption-mode"] = json!("All");
    jobs::create(&client, &ns, kind, &manifest).await;
    let pg = wait_pg(&client, &ns, B, "rack", "created", |_| true).await;
    assert_eq!(
        spec(&pg).get("schedulingConstraints"),
        None,
        "dropped by the server"
    );
    assert_eq!(spec(&pg)["disruptionMode"], json!({"all": {}}));
    let ev = jobs::wait_event(&client, &ns, "rack", "GangSpecWarning").await;
    let note = ev.note.unwrap_or_default();
    assert!(
        note.contains("drop spec.schedulingConstraints")
            && note.contains("TopologyAwareWorkloadScheduling"),
        "{note}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = jobs::get_pg(&client, &ns, B, "rack").await.unwrap();
    assert_eq!(
        now.metadata.resource_version,
        pg.metadata.resource_version,
        "the PodGroup was written again\n{}",
        log()
    );
}

#[tokio::test]
async fn a_restart_with_nothing_changed_writes_nothing() {
    // A control plane of its own: the API server's write counters must see only this test.
    support::use_native_gang();
    support::use_workload_crds();
    let cluster = support::private_cluster();
    let client = cluster.client().await;
    // The Priority admission plugin fills this class into PodGroups that name none.
    let pc: k8s_openapi::api::scheduling::v1::PriorityClass = serde_json::from_value(
        json!({"metadata": {"name": "cluster-default"}, "value": 100, "globalDefault": true}),
    )
    .unwrap();
    Api::all(client.clone())
        .create(&PostParams::default(), &pc)
        .await
        .expect("globalDefault PriorityClass");
    let ns = support::test_namespace(&client, "restart", &[ENABLED]).await;
    let mut first = controller::start(&cluster, None, &[]);
    for kind in KINDS {
        let name = format!("{kind:?}").to_lowercase();
        jobs::create(&client, &ns, kind, &jobs::job(kind, B, &name, 2)).await;
        let pg = wait_pg(&client, &ns, B, &name, "created", |_| true).await;
        assert_eq!(spec(&pg)["priorityClassName"], "cluster-default");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let expected = KINDS.len() as f64;
    assert_eq!(
        first.metric("podgroup_sync_podgroup_writes_total", &[("op", "create")]),
        expected
    );
    first.stop();
    let before = cluster.pod_group_and_event_writes();
    let started = Instant::now();
    let second = controller::start(&cluster, None, &[]);
    support::wait_for(
        "the restarted controller reconciled every job",
        jobs::WAIT,
        || async {
            (second.metric("podgroup_sync_reconcile_total", &[("result", "ok")]) >= expected)
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = cluster.pod_group_and_event_writes();
    eprintln!(
        "native restart: ready after {:.2}s; PodGroup writes {} -> {}, Event writes {} -> {}",
        started.elapsed().as_secs_f64(),
        before.0,
        after.0,
        before.1,
        after.1
    );
    assert_eq!(
        after,
        before,
        "the API server saw writes after the restart; the controller's: {}\n{}",
        second.metric("podgroup_sync_podgroup_writes_total", &[]),
        second.log_tail()
    );
    assert_eq!(
        second.metric("podgroup_sync_podgroup_writes_total", &[]),
        0.0
    );
    support::stop_cluster(&cluster);
}

#[tokio::test]
async fn the_charts_rbac_is_enough_for_the_native_lifecycle() {
    // A control plane of its own: no other controller may manage its namespaces.
    support::use_native_gang();
    support::use_workload_crds();
    let cluster = support::private_cluster();
    let client = cluster.client().await;
    let release_ns = support::test_namespace(&client, "chart", &[]).await;
    let release = support::chart::install(&cluster, &release_ns);
    assert!(release.can_i(&cluster, "patch", "podgroups.scheduling.k8s.io", None));
    assert!(!release.can_i(&cluster, "create", "workloads.scheduling.k8s.io", None));
    let ctl = controller::start(&cluster, Some(&release.kubeconfig), &release.args());
    let ns = support::test_namespace(&client, "chart-native", &[ENABLED]).await;
    let ctl_log = || ctl.log_tail();
    Gang {
        client: &client,
        ns: &ns,
        kind: Kind::PyTorchJob,
        backend: B,
        name: "gang",
        log: &ctl_log,
    }
    .whole_lifecycle()
    .await;
    support::stop_cluster(&cluster);
}

/// SPEC §11, LeaderWorkerSet on the native backend: one PodGroup per group, resized in place.
#[tokio::test]
async fn a_leaderworkerset_has_one_pod_group_per_group() {
    let client = setup().await;
    let ns = namespace(&client, &[ENABLED]).await;
    support::lws::through(&client, &ns, B).await;
}
