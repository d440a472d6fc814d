//! The controller's lifecycle on a real control plane (SPEC §3, §4, §5): one podgroup-sync
//! process per test binary, each test in its own namespace.

mod support;

use std::sync::{Mutex, OnceLock};

use kube::Client;
use serde_json::json;
use support::controller::{self, Controller};
use support::jobs::{
    self, Backend, KINDS, Kind, WORKLOAD_KINDS, expected_spec_of, spec, wait_pg, wait_pg_gone,
};
use support::lifecycle::{Gang, Row, owner_ref_of};

const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");

static CONTROLLER: OnceLock<Mutex<Controller>> = OnceLock::new();

async fn setup(prefix: &str, annotations: &[(&str, &str)]) -> (Client, String) {
    support::use_workload_crds();
    let cluster = support::cluster().await;
    CONTROLLER.get_or_init(|| {
        Mutex::new(controller::start(
            cluster,
            None,
            &["--gang-wait-warning-seconds", "3", "--batch-jobs"],
        ))
    });
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, prefix, annotations).await;
    (client, ns)
}

fn controller_log() -> String {
    CONTROLLER
        .get()
        .map(|c| c.lock().unwrap().log_tail())
        .unwrap_or_default()
}

/// A fresh job of `kind` for `backend` in its own namespace, created (itself the first row's
/// check), then taken through `row`.
async fn row(row: Row, kind: Kind, backend: Backend) {
    let (client, ns) = setup(&format!("{row:?}-{kind:?}-{backend:?}"), &[ENABLED]).await;
    let gang = Gang {
        client: &client,
        ns: &ns,
        kind,
        backend,
        name: "gang",
        log: &controller_log,
    };
    gang.through(row).await;
}

/// `row` for every kind × backend at once.
async fn every_kind_and_backend(r: Row) {
    futures::future::join_all(combinations().into_iter().map(|(k, b)| row(r, k, b))).await;
}

#[tokio::test]
async fn row_job_created_gets_the_exact_pod_group() {
    every_kind_and_backend(Row::Created).await;
}

#[tokio::test]
async fn row_job_spec_change_is_followed() {
    every_kind_and_backend(Row::SpecChanged).await;
}

#[tokio::test]
async fn row_pod_group_deleted_by_someone_is_recreated() {
    every_kind_and_backend(Row::DeletedBySomeone).await;
}

#[tokio::test]
async fn row_job_suspended_deletes_and_resume_recreates_with_the_current_size() {
    every_kind_and_backend(Row::SuspendedAndResumed).await;
}

#[tokio::test]
async fn row_job_succeeded_deletes_the_pod_group() {
    every_kind_and_backend(Row::Finished).await;
}

#[tokio::test]
async fn row_job_deleted_lets_the_garbage_collector_remove_the_pod_group() {
    every_kind_and_backend(Row::JobDeleted).await;
}

/// Every kind × backend.
fn combinations() -> Vec<(Kind, Backend)> {
    KINDS
        .into_iter()
        .chain(WORKLOAD_KINDS)
        .flat_map(|k| [(k, Backend::SchedulerPlugins), (k, Backend::Volcano)])
        .collect()
}

async fn set_mode(client: &Client, ns: &str, mode: &str) {
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    api.patch(
        ns,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"metadata": {"annotations": {"podgroup-sync.io/enabled": mode}}}),
        ),
    )
    .await
    .expect("annotate namespace");
}

async fn toggle(kind: Kind, b: Backend) {
    let (client, ns) = setup(&format!("toggle-{kind:?}-{b:?}"), &[ENABLED]).await;
    jobs::create(&client, &ns, kind, &jobs::job(kind, b, "t", 1)).await;
    wait_pg(&client, &ns, b, "t", "created", |_| true).await;
    set_mode(&client, &ns, "false").await;
    wait_pg_gone(&client, &ns, b, "t", "namespace turned off").await;
    set_mode(&client, &ns, "dry-run").await;
    let ev = jobs::wait_event(&client, &ns, "t", "WouldCreatePodGroup").await;
    let note = ev.note.as_deref().unwrap_or_default();
    let min_member = format!(
        "\"minMember\":{}",
        expected_spec_of(kind, b, 1)["minMember"]
    );
    assert!(note.contains(&min_member), "{kind:?}/{b:?}: {note}");
    assert!(
        jobs::get_pg(&client, &ns, b, "t").await.is_none(),
        "dry-run wrote a PodGroup"
    );
    set_mode(&client, &ns, "true").await;
    let pg = wait_pg(&client, &ns, b, "t", "namespace turned on again", |_| true).await;
    assert_eq!(spec(&pg), expected_spec_of(kind, b, 1), "{kind:?}/{b:?}");
}

#[tokio::test]
async fn namespace_annotation_off_removes_on_creates_dry_run_only_reports() {
    futures::future::join_all(combinations().into_iter().map(|(k, b)| toggle(k, b))).await;
}

#[tokio::test]
async fn a_job_in_a_namespace_without_the_annotation_is_never_touched() {
    let (client, off) = setup("untouched", &[]).await;
    let on = support::test_namespace(&client, "touched", &[ENABLED]).await;
    let b = Backend::Volcano;
    jobs::create(
        &client,
        &off,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, b, "same", 1),
    )
    .await;
    jobs::create(
        &client,
        &on,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, b, "same", 1),
    )
    .await;
    // The enabled twin proves the controller saw both jobs by now.
    wait_pg(
        &client,
        &on,
        b,
        "same",
        "created in the enabled namespace",
        |_| true,
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(jobs::get_pg(&client, &off, b, "same").await.is_none());
    assert!(
        jobs::events(&client, &off, "same", "WouldCreatePodGroup")
            .await
            .is_empty()
    );
}

async fn conflict(kind: Kind, b: Backend) {
    let (client, ns) = setup(&format!("conflict-{kind:?}-{b:?}"), &[ENABLED]).await;
    let foreign: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": b.ar().api_version, "kind": "PodGroup",
        "metadata": {"name": "taken"}, "spec": {"minMember": 7}
    }))
    .unwrap();
    let created = jobs::api(&client, &ns, &b.ar())
        .create(&kube::api::PostParams::default(), &foreign)
        .await
        .expect("create foreign PodGroup");
    jobs::create(&client, &ns, kind, &jobs::job(kind, b, "taken", 1)).await;
    let ev = jobs::wait_event(&client, &ns, "taken", "PodGroupConflict").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let now = jobs::get_pg(&client, &ns, b, "taken")
        .await
        .expect("still there");
    assert_eq!(
        now.metadata.resource_version, created.metadata.resource_version,
        "{kind:?}/{b:?}: the foreign PodGroup was modified"
    );
    assert!(
        now.metadata.owner_references.is_none(),
        "{kind:?}/{b:?}: an owner was added"
    );
    assert_eq!(spec(&now)["minMember"], 7);
}

#[tokio::test]
async fn a_foreign_pod_group_of_the_same_name_is_left_untouched() {
    futures::future::join_all(combinations().into_iter().map(|(k, b)| conflict(k, b))).await;
}

#[tokio::test]
async fn an_existing_volcano_queue_is_never_changed() {
    let (client, ns) = setup("queue", &[ENABLED]).await;
    let b = Backend::Volcano;
    jobs::create(
        &client,
        &ns,
        Kind::PyTorchJob,
        &jobs::job(Kind::PyTorchJob, b, "q", 1),
    )
    .await;
    wait_pg(&client, &ns, b, "q", "created", |pg| {
        spec(pg)["queue"] == "default"
    })
    .await;
    // An admin (or a mutating webhook) moves the PodGroup to another queue.
    jobs::api(&client, &ns, &b.ar())
        .patch(
            "q",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"queue": "team-a"}})),
        )
        .await
        .expect("patch queue");
    // The job changes (scale, and a different queue annotation): the size follows, the queue stays.
    jobs::patch(
        &client,
        &ns,
        Kind::PyTorchJob,
        "q",
        json!({"metadata": {"annotations": {"scheduling.volcano.sh/queue-name": "other"}},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}}),
        false,
    )
    .await;
    let pg = wait_pg(&client, &ns, b, "q", "resized", |pg| {
        spec(pg)["minMember"] == 3
    })
    .await;
    assert_eq!(spec(&pg)["queue"], "team-a");
}

#[tokio::test]
async fn invalid_jobs_get_a_warning_and_no_pod_group() {
    let (client, ns) = setup("invalid", &[ENABLED]).await;
    let b = Backend::SchedulerPlugins;
    let mut too_many = jobs::job(Kind::PyTorchJob, b, "min-above-total", 1);
    too_many["spec"]["runPolicy"] = json!({"schedulingPolicy": {"minAvailable": 5}});
    jobs::create(&client, &ns, Kind::PyTorchJob, &too_many).await;
    let mut zero = jobs::job(Kind::TFJob, b, "zero", 0);
    zero["spec"]["tfReplicaSpecs"]["PS"]["replicas"] = json!(0);
    jobs::create(&client, &ns, Kind::TFJob, &zero).await;
    // The CRD schema rejects malformed quantities, but its pattern admits ones too large to hold.
    let mut bad_quantity = jobs::job(Kind::TFJob, b, "bad-quantity", 1);
    bad_quantity["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]
        ["requests"]["cpu"] = json!("1e40");
    jobs::create(&client, &ns, Kind::TFJob, &bad_quantity).await;
    // A valid job created after them still gets its PodGroup: bad input blocks nothing.
    jobs::create(
        &client,
        &ns,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, b, "fine", 1),
    )
    .await;
    wait_pg(
        &client,
        &ns,
        b,
        "fine",
        "created despite the invalid jobs",
        |_| true,
    )
    .await;
    for (name, needle) in [
        ("min-above-total", "minAvailable 5 is above the 2 pods"),
        ("zero", "zero replicas"),
        ("bad-quantity", "overflow"),
    ] {
        let ev = jobs::wait_event(&client, &ns, name, "InvalidSpec").await;
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert!(
            ev.note.as_deref().unwrap_or_default().contains(needle),
            "{name}: {:?}",
            ev.note
        );
        assert!(
            jobs::get_pg(&client, &ns, b, name).await.is_none(),
            "{name} got a PodGroup"
        );
    }
}

#[tokio::test]
async fn a_template_without_the_pod_link_gets_a_warning_and_still_a_pod_group() {
    let (client, ns) = setup("nolink", &[ENABLED]).await;
    let b = Backend::SchedulerPlugins;
    let mut job = jobs::job(Kind::PyTorchJob, b, "nolink", 1);
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"] = json!({});
    jobs::create(&client, &ns, Kind::PyTorchJob, &job).await;
    wait_pg(&client, &ns, b, "nolink", "created anyway", |_| true).await;
    let ev = jobs::wait_event(&client, &ns, "nolink", "MissingPodGroupLink").await;
    assert!(
        ev.note
            .as_deref()
            .unwrap_or_default()
            .contains("Worker: add label scheduling.x-k8s.io/pod-group: nolink"),
        "{:?}",
        ev.note
    );
}

#[tokio::test]
async fn a_recreated_job_of_the_same_name_keeps_its_new_pod_group() {
    let (client, ns) = setup("recreate", &[ENABLED]).await;
    let b = Backend::Volcano;
    let first = jobs::create(
        &client,
        &ns,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, b, "again", 1),
    )
    .await;
    wait_pg(&client, &ns, b, "again", "first", |_| true).await;
    jobs::delete(&client, &ns, &Kind::TFJob.ar(), "again").await;
    wait_pg_gone(&client, &ns, b, "again", "collected with the first job").await;
    let second = jobs::create(
        &client,
        &ns,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, b, "again", 2),
    )
    .await;
    assert_ne!(first.metadata.uid, second.metadata.uid);
    let pg = wait_pg(&client, &ns, b, "again", "for the new job", |pg| {
        pg.metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o[0].uid == second.metadata.uid.clone().unwrap())
    })
    .await;
    assert_eq!(spec(&pg)["minMember"], 3);
}

/// A PodGroup the job controls but podgroup-sync did not make (an operator whose gang mode is
/// still on; Volcano's own `podgroup-<uid>`) is neither deleted nor modified.
#[tokio::test]
async fn a_pod_group_the_job_controls_but_we_did_not_make_is_left_alone() {
    let (client, ns) = setup("operator-pg", &[]).await;
    let b = Backend::Volcano;
    let job = jobs::create(
        &client,
        &ns,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, b, "op", 1),
    )
    .await;
    let operator_pg: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": b.ar().api_version, "kind": "PodGroup",
        "metadata": {"name": "op", "ownerReferences": owner_ref_of(&job)},
        "spec": {"minMember": 2, "queue": "default"}
    }))
    .unwrap();
    let created = jobs::api(&client, &ns, &b.ar())
        .create(&kube::api::PostParams::default(), &operator_pg)
        .await
        .expect("create the operator's PodGroup");
    // Not enabled: podgroup-sync deletes only what it made.
    let probe = support::test_namespace(&client, "operator-probe", &[ENABLED]).await;
    jobs::create(
        &client,
        &probe,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, b, "probe", 1),
    )
    .await;
    wait_pg(
        &client,
        &probe,
        b,
        "probe",
        "the controller is working",
        |_| true,
    )
    .await;
    // Enabled: a conflict, reported, and still no write.
    set_mode(&client, &ns, "true").await;
    let ev = jobs::wait_event(&client, &ns, "op", "PodGroupConflict").await;
    assert!(
        ev.note
            .as_deref()
            .unwrap_or_default()
            .contains("not made by podgroup-sync"),
        "{:?}",
        ev.note
    );
    let now = jobs::get_pg(&client, &ns, b, "op")
        .await
        .expect("still there");
    assert_eq!(
        now.metadata.resource_version,
        created.metadata.resource_version
    );
}

/// Issue 15: the watch event that only echoes the controller's own write requeues nothing —
/// and a change someone else makes right after that write is still seen and undone. A watcher
/// edits `minMember` the moment it sees each write of the controller (so the foreign write
/// lands between the controller's write and the processing of its echo, or just after); every
/// time, the controller restores it.
#[tokio::test]
async fn a_foreign_edit_right_after_our_write_is_not_lost_to_the_echo_skip() {
    use futures::StreamExt;
    use kube::api::{Patch, PatchParams};
    use kube::runtime::{WatchStreamExt, watcher};

    let (client, ns) = setup("echo", &[ENABLED]).await;
    let (kind, b) = (Kind::PyTorchJob, Backend::SchedulerPlugins);
    let echoes = |c: &Controller| c.metric("podgroup_sync_own_write_echoes_total", &[]);
    let echoes_before = echoes(&CONTROLLER.get().unwrap().lock().unwrap());
    jobs::create(&client, &ns, kind, &jobs::job(kind, b, "race", 1)).await;
    wait_pg(&client, &ns, b, "race", "created", |_| true).await;

    let pgs = jobs::api(&client, &ns, &b.ar());
    let cfg = watcher::Config::default().fields("metadata.name=race");
    let mut stream = Box::pin(watcher(pgs.clone(), cfg).applied_objects());
    let foreign = PatchParams {
        field_manager: Some("someone-else".into()),
        ..PatchParams::default()
    };
    for workers in 2..=11u32 {
        let want = expected_spec_of(kind, b, workers)["minMember"].clone();
        jobs::patch(&client, &ns, kind, "race", kind.scale(workers), false).await;
        // The controller's write, seen on the watch: edit it at once.
        let edited_after = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while let Some(Ok(pg)) = stream.next().await {
                if spec(&pg)["minMember"] == want {
                    let edit = json!({"spec": {"minMember": 99}});
                    let r = pgs.patch("race", &foreign, &Patch::Merge(&edit)).await;
                    return r.expect("foreign edit").metadata.resource_version;
                }
            }
            None
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the write for {workers} workers never came; {}",
                controller_log()
            )
        });
        let pg = wait_pg(&client, &ns, b, "race", "foreign edit undone", |pg| {
            spec(pg)["minMember"] == want && pg.metadata.resource_version != edited_after
        })
        .await;
        assert_eq!(
            spec(&pg),
            expected_spec_of(kind, b, workers),
            "{workers} workers"
        );
    }
    let echoes_after = echoes(&CONTROLLER.get().unwrap().lock().unwrap());
    assert!(
        echoes_after > echoes_before,
        "no echo was skipped ({echoes_before} → {echoes_after}): the test did not exercise the skip"
    );
}

/// SPEC §11: a batch/v1 Job is a gang only when it asks (the annotation) and is Indexed. A plain
/// Job beside an annotated twin gets nothing and hears nothing; an annotated NonIndexed Job is
/// told why it gets no PodGroup.
#[tokio::test]
async fn only_an_indexed_job_that_asks_is_a_gang() {
    let (client, ns) = setup("batch-jobs", &[ENABLED]).await;
    let b = Backend::Volcano;
    let asks = jobs::job(Kind::IndexedJob, b, "asks", 2);
    let mut plain = jobs::job(Kind::IndexedJob, b, "plain", 2);
    plain["metadata"]["annotations"] = json!({});
    let mut non_indexed = jobs::job(Kind::IndexedJob, b, "non-indexed", 2);
    non_indexed["spec"]["completionMode"] = json!("NonIndexed");
    for job in [&plain, &non_indexed, &asks] {
        jobs::create(&client, &ns, Kind::IndexedJob, job).await;
    }
    let ev = jobs::wait_event(&client, &ns, "non-indexed", "InvalidSpec").await;
    assert!(
        ev.note
            .as_deref()
            .unwrap_or_default()
            .contains("only an Indexed Job"),
        "{ev:?}"
    );
    // The twin created last proves the controller saw the others by now.
    wait_pg(&client, &ns, b, "asks", "created", |_| true).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    for name in ["plain", "non-indexed"] {
        assert!(
            jobs::get_pg(&client, &ns, b, name).await.is_none(),
            "{name}"
        );
    }
    let said = jobs::events(&client, &ns, "plain", "InvalidSpec").await;
    assert!(
        said.is_empty(),
        "a plain Job is no gang and is told nothing: {said:?}"
    );
}

/// SPEC §11, Trainer v2: a TrainJob's JobSet whose templates carry the link Trainer's PodGroup
/// policy writes is Trainer's — its PodGroup (owned by the TrainJob) is never touched and no
/// other is made; a TrainJob's JobSet without one gets podgroup-sync's PodGroup, owned by the
/// JobSet. With the real TrainJob and JobSet CRDs.
#[tokio::test]
async fn a_trainjob_with_a_pod_group_policy_is_left_to_trainer() {
    let (client, ns) = setup("trainjob", &[ENABLED]).await;
    let b = Backend::SchedulerPlugins;
    let trainjob_ar = jobs::ar("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs");
    let mut owners = Vec::new();
    for name in ["by-trainer", "by-us"] {
        let tj: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": "torch-distributed"}}}))
        .unwrap();
        let tj = jobs::api(&client, &ns, &trainjob_ar)
            .create(&kube::api::PostParams::default(), &tj)
            .await
            .expect("create TrainJob");
        owners.push(
            json!([{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "name": name, "uid": tj.metadata.uid, "controller": true, "blockOwnerDeletion": true}]),
        );
    }
    // Trainer's own PodGroup, as its coscheduling plugin makes it: owned by the TrainJob.
    let theirs: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "by-trainer", "ownerReferences": owners[0]},
        "spec": {"minMember": 3}}))
    .unwrap();
    let theirs = jobs::api(&client, &ns, &b.ar())
        .create(&kube::api::PostParams::default(), &theirs)
        .await
        .expect("Trainer's PodGroup");
    // Trainer's JobSet: the link in its templates (the job() of a hand-linked backend).
    let mut by_trainer = jobs::job(Kind::JobSet, b, "by-trainer", 2);
    by_trainer["metadata"]["ownerReferences"] = owners[0].clone();
    let mut by_us = jobs::job(Kind::JobSet, Backend::Kubernetes, "by-us", 2);
    by_us["metadata"] = json!({"name": "by-us", "ownerReferences": owners[1]});
    jobs::create(&client, &ns, Kind::JobSet, &by_trainer).await;
    let js = jobs::create(&client, &ns, Kind::JobSet, &by_us).await;
    let ours = wait_pg(
        &client,
        &ns,
        b,
        "by-us",
        "made for the TrainJob's JobSet",
        |_| true,
    )
    .await;
    assert_eq!(
        serde_json::to_value(&ours.metadata.owner_references).unwrap(),
        owner_ref_of(&js),
        "owned by the JobSet"
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let now = jobs::get_pg(&client, &ns, b, "by-trainer")
        .await
        .expect("still there");
    assert_eq!(
        now.metadata.resource_version,
        theirs.metadata.resource_version
    );
    let conflicts = jobs::events(&client, &ns, "by-trainer", "PodGroupConflict").await;
    assert!(
        conflicts.is_empty(),
        "Trainer's is not a conflict: {conflicts:?}"
    );
}

/// SPEC §11, LeaderWorkerSet: one PodGroup per group through scaling, a rolling update's surge,
/// a new group size and LeaderReady, for both CRD backends.
#[tokio::test]
async fn a_leaderworkerset_has_one_pod_group_per_group() {
    let mut runs = Vec::new();
    for b in [Backend::SchedulerPlugins, Backend::Volcano] {
        runs.push(async move {
            let (client, ns) = setup(&format!("lws-{b:?}"), &[ENABLED]).await;
            support::lws::through(&client, &ns, b).await;
        });
    }
    futures::future::join_all(runs).await;
}
