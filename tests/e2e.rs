//! End to end: real operators create the pods, podgroup-sync creates the PodGroup, real
//! schedulers place the gang all or nothing (issue 6). Components: the test control plane,
//! kwok (simulated GPU nodes), the scheduler-plugins scheduler with Coscheduling plus its
//! controller, the Volcano scheduler plus its queue and pod-group controllers, training-operator
//! v1.9 (PyTorchJob, TFJob) and mpi-operator v0.8 (MPIJob v2beta1), both with gang scheduling off.
//! See `tests/e2e/start.sh`.
//!
//! Each scenario runs for both backends, in its own namespace, on its own kwok nodes (pods are
//! pinned by nodeSelector), and scenarios take turns: Volcano admits gangs against the capacity of
//! the whole cluster, so concurrent scenarios would change each other's outcome.
//!
//! Run alone with `cargo test --test e2e` (one backend: `cargo test --test e2e volcano`).

#[path = "e2e/alerts.rs"]
mod alerts;
#[path = "e2e/harness.rs"]
mod harness;
#[path = "e2e/kueue.rs"]
mod kueue;
mod support;
#[path = "e2e/topology.rs"]
mod topology;

use harness::{
    Link, Replicas, Scope, create_trainjob, exclusive, is_bound, jobset, names_of, raycluster,
    replicas, trainer_ar, training_job,
};
use kube::api::{DeleteParams, DynamicObject};
use serde_json::{Value, json};
use support::jobs::{self, Backend, Kind, spec};

fn tag(backend: Backend) -> &'static str {
    match backend {
        Backend::SchedulerPlugins => "sp",
        Backend::Volcano => "vc",
        Backend::Kubernetes => "k8s",
    }
}

/// The Event podgroup-sync reports for a gang the scheduler holds back: scheduler-plugins has
/// only a phase (Pending/Scheduling for longer than --gang-wait-warning-seconds), Volcano
/// writes an Unschedulable condition.
fn waiting_reason(backend: Backend) -> &'static str {
    match backend {
        Backend::SchedulerPlugins => "GangWaiting",
        Backend::Volcano | Backend::Kubernetes => "GangUnschedulable",
    }
}

fn pg_phase(pg: &kube::api::DynamicObject) -> Option<&str> {
    pg.data.pointer("/status/phase").and_then(Value::as_str)
}

fn pytorch(link: Link, name: &str, pool: &str, master: Replicas, workers: Replicas) -> Value {
    training_job(
        Kind::PyTorchJob,
        link,
        name,
        pool,
        &[master, workers],
        json!({}),
    )
}

macro_rules! for_each_backend {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn scheduler_plugins() {
                super::$scenario(super::Backend::SchedulerPlugins).await
            }
            #[tokio::test]
            async fn volcano() {
                super::$scenario(super::Backend::Volcano).await
            }
        }
    )*};
}

for_each_backend!(
    a_gang_waits_whole_for_capacity_then_binds_whole,
    b_without_our_pod_group_there_is_no_gang,
    c_mpijob_wait_for_workers_ready_runs_to_completion,
    d_tfjob_ps_worker_evaluator_are_one_gang,
    e_competing_jobs_one_runs_whole_the_other_waits_whole,
    f_a_finished_job_loses_its_pod_group,
    g_xgboostjob_run_by_training_operator_is_one_gang,
    h_a_gang_that_loses_a_node_is_broken_then_recovers,
    i_a_jobset_binds_none_then_all,
    j_a_raycluster_binds_whole,
    k_an_in_order_jobset_starts_step_by_step_without_deadlock,
    l_a_rayjob_runs_on_a_whole_gang_and_suspending_it_frees_the_pod_group,
    m_an_lws_of_3_groups_with_room_for_2_runs_exactly_2_whole_groups,
    n_a_trainjob_runs_as_one_gang_and_trainers_own_pod_group_is_left_alone,
    o_a_leader_ready_lws_starts_without_deadlock,
    p_kueue_admission_preemption_and_readmission_move_the_pod_group,
    q_kueue_partial_admission_and_a_gang_that_cannot_bind_before_eviction,
    r_a_jobset_and_a_rayjob_beside_kueue,
    s_a_sliced_job_lands_each_slice_in_one_rack,
);

/// (t) A real Prometheus fires every alert of dashboards/alerts.yaml on its real condition and
/// none on a healthy run; every dashboard query returns a series (tests/e2e/alerts.rs). Not one
/// of the scenarios that take turns: its nodes offer no GPUs, so it runs beside them.
#[tokio::test]
async fn t_a_real_prometheus_fires_every_alert() {
    alerts::every_alert_fires_on_its_real_condition_and_none_on_a_healthy_run().await;
}

/// A gang of `pods` pods needing `gpus` GPUs, created on too few one-GPU nodes: its PodGroup says
/// so, the backend reports the waiting gang, and no pod binds; one more GPU node and all run.
/// Returns the waiting Event's note.
async fn waits_whole_then_runs_whole(
    s: &mut Scope,
    backend: Backend,
    kind: Kind,
    job: &str,
    manifest: &Value,
    pods: usize,
    gpus: &str,
) -> String {
    let ns = s.ns.clone();
    s.create(&ns, kind, manifest).await;
    gang_waits_whole_then_runs_whole(s, backend, &format!("{kind:?}"), job, pods, gpus).await
}

/// The rest of [`waits_whole_then_runs_whole`], for a job `job` created another way (a TrainJob's
/// JobSet, made by Trainer). `what_kind` names the job's kind in the log.
async fn gang_waits_whole_then_runs_whole(
    s: &mut Scope,
    backend: Backend,
    what_kind: &str,
    job: &str,
    pods: usize,
    gpus: &str,
) -> String {
    let ns = s.ns.clone();
    let what = format!("minMember {pods}");
    let pg = s
        .wait_pg(&ns, backend, job, &what, |pg| {
            spec(pg)["minMember"] == pods as u64
        })
        .await;
    assert_eq!(
        spec(&pg)["minResources"][harness::GPU],
        gpus,
        "{}",
        s.diagnostics()
    );
    let note = s.wait_event(&ns, job, waiting_reason(backend)).await;
    s.wait_all_refused(&ns, job, pods).await;
    let waiting = s.pods(&ns, job).await;
    assert!(
        waiting.iter().all(|p| !is_bound(p)),
        "a gang of {pods} without room for all: no pod may bind: {:?}\n{}",
        names_of(&waiting),
        s.diagnostics()
    );
    // The first thing a user types when a job is Pending.
    let status = s
        .env
        .cluster
        .kubectl_plugin(&["status", &format!("{ns}/{job}")]);
    eprintln!("[{ns}] kubectl podgroup-sync status {ns}/{job}:\n{status}");
    assert!(
        status.contains(&format!("{pods} (0 Running, {pods} Pending")),
        "{status}"
    );
    assert!(
        ["GangWaiting", "GangUnschedulable"]
            .iter()
            .any(|r| status.contains(&format!("Blocked by: {r} ("))),
        "podgroup-sync's own report of the waiting gang: {status}"
    );
    let explained = s
        .env
        .cluster
        .kubectl_plugin(&["explain", &format!("{ns}/{job}")]);
    assert!(
        explained.contains("holds exactly what podgroup-sync applies"),
        "{explained}"
    );
    s.add_node(1).await;
    let running = s.wait_all_running(&ns, job, pods).await;
    eprintln!(
        "[{ns}] {what_kind} gang of {pods} runs whole: {:?}",
        names_of(&running)
    );
    note
}

/// (a) 1 master + 3 workers, 1 GPU each, on nodes with 3 GPUs: no pod binds and podgroup-sync
/// reports the waiting gang; one more GPU node: all 4 bind.
async fn a_gang_waits_whole_for_capacity_then_binds_whole(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-a-{}", tag(backend)), true).await;
    for _ in 0..3 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let job = format!("pt-{}", s.id);
    let manifest = pytorch(
        Link::Gang(backend),
        &job,
        s.pool(),
        replicas("Master", 1, 1),
        replicas("Worker", 3, 1),
    );
    let note =
        waits_whole_then_runs_whole(&mut s, backend, Kind::PyTorchJob, &job, &manifest, 4, "4")
            .await;
    eprintln!(
        "[{ns}] gang of 4 waited on 3 GPUs; {}: {note}",
        waiting_reason(backend)
    );
    s.wait_pg(&ns, backend, &job, "phase Running", |pg| {
        pg_phase(pg) == Some("Running")
    })
    .await;
    s.cleanup().await;
}

/// (b) The same job in a namespace that is not enabled gets no PodGroup. Its pods still carry
/// the pod link, and both schedulers hold linked pods without a PodGroup forever (no pod binds
/// even with room for all of them: SPEC §2's warning). The job without the link (the backend's
/// scheduler, no gang) binds 3 of its 4 pods on 3 GPUs: the all-or-nothing of (a) comes from
/// our PodGroup.
async fn b_without_our_pod_group_there_is_no_gang(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-b-{}", tag(backend)), false).await;
    let ns = s.ns.clone();
    let linked_pool = format!("{ns}-l");
    for _ in 0..4 {
        s.add_node_to(&linked_pool, 1).await;
    }
    for _ in 0..3 {
        s.add_node(1).await;
    }

    // The linked job first, on a pool with room for the whole gang.
    let linked = format!("linked-{}", s.id);
    // Linked by hand: in a namespace that is not enabled the webhook adds nothing.
    let manifest = pytorch(
        Link::HandLinked(backend),
        &linked,
        &linked_pool,
        replicas("Master", 1, 1),
        replicas("Worker", 3, 1),
    );
    s.create(&ns, Kind::PyTorchJob, &manifest).await;
    let plain = format!("plain-{}", s.id);
    let manifest = pytorch(
        Link::Plain(backend),
        &plain,
        s.pool(),
        replicas("Master", 1, 1),
        replicas("Worker", 3, 1),
    );
    s.create(&ns, Kind::PyTorchJob, &manifest).await;

    // Without a gang: 3 pods run, the 4th is refused for want of a GPU.
    let what = format!("3 of the 4 pods of {ns}/{plain} Running, the 4th refused");
    let pods = s
        .env
        .wait(&ns, &what, harness::SLOW, || async {
            let pods = s.pods(&ns, &plain).await;
            let running = pods.iter().filter(|p| harness::is_running(p)).count();
            let refused = pods.iter().filter(|p| harness::is_refused(p)).count();
            (pods.len() == 4 && running == 3 && refused == 1).then_some(pods)
        })
        .await;
    eprintln!("[{ns}] no link, no gang: {:?}", names_of(&pods));
    if backend == Backend::Volcano {
        // Volcano schedules only pods that have a PodGroup: its controller-manager made one of
        // minMember 1 for the unlinked pods (named after their owner), which is not ours.
        let pgs = jobs::api(&s.client, &ns, &backend.ar())
            .list(&Default::default())
            .await
            .expect("list Volcano PodGroups")
            .items;
        let theirs: Vec<_> = pgs
            .iter()
            .filter(|pg| {
                pg.metadata
                    .name
                    .as_deref()
                    .unwrap_or_default()
                    .starts_with("podgroup-")
                    && spec(pg)["minMember"] == 1
                    && pg
                        .metadata
                        .labels
                        .as_ref()
                        .is_none_or(|l| !l.contains_key("app.kubernetes.io/managed-by"))
            })
            .collect();
        assert_eq!(theirs.len(), 1, "{}", s.diagnostics());
    }

    // The linked job, created first, with a GPU for each of its pods: nothing bound.
    if backend == Backend::SchedulerPlugins {
        // kube-scheduler reports its Permit refusal ("PodGroup not found") on each pod; Volcano
        // does not look at pods whose PodGroup does not exist at all.
        s.wait_all_refused(&ns, &linked, 4).await;
    }
    let pods = s.pods(&ns, &linked).await;
    assert_eq!(pods.len(), 4, "{}", s.diagnostics());
    assert!(
        pods.iter().all(|p| !is_bound(p)),
        "linked pods without a PodGroup must not bind: {:?}\n{}",
        names_of(&pods),
        s.diagnostics()
    );
    for job in [&linked, &plain] {
        assert!(
            jobs::get_pg(&s.client, &ns, backend, job).await.is_none(),
            "podgroup-sync must not create a PodGroup in a namespace that is not enabled\n{}",
            s.diagnostics()
        );
    }
    s.cleanup().await;
}

/// (c) MPIJob v2beta1 with launcherCreationPolicy WaitForWorkersReady: the launcher is left out
/// of the gang (it only appears once the workers run), so the workers bind, the launcher follows
/// and the job completes; then its PodGroup is deleted.
async fn c_mpijob_wait_for_workers_ready_runs_to_completion(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-c-{}", tag(backend)), true).await;
    harness::mpijob_runs_to_completion(&mut s, backend, |pg, s| {
        assert_eq!(
            spec(pg)["minMember"],
            2,
            "launcher left out\n{}",
            s.diagnostics()
        );
        assert_eq!(
            spec(pg)["minResources"][harness::GPU],
            "2",
            "{}",
            s.diagnostics()
        );
    })
    .await;
    s.cleanup().await;
}

/// (d) TFJob with PS (no GPU), 2 Workers and an Evaluator (1 GPU each): the Evaluator is part of
/// the gang, so on 2 GPUs nothing binds (a gang without it would run PS + Workers); one more GPU
/// and all 4 run. Its templates are linked by hand (the path without the webhook); every other
/// scenario's templates carry no link and no schedulerName, and the webhook links the pods.
async fn d_tfjob_ps_worker_evaluator_are_one_gang(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-d-{}", tag(backend)), true).await;
    for _ in 0..2 {
        s.add_node(1).await;
    }
    let job = format!("tf-{}", s.id);
    let manifest = training_job(
        Kind::TFJob,
        Link::HandLinked(backend),
        &job,
        s.pool(),
        &[
            replicas("PS", 1, 0),
            replicas("Worker", 2, 1),
            replicas("Evaluator", 1, 1),
        ],
        json!({}),
    );
    waits_whole_then_runs_whole(&mut s, backend, Kind::TFJob, &job, &manifest, 4, "3").await;
    s.cleanup().await;
}

/// (e) Two gangs of 4 GPUs on 4 GPUs: one runs whole, the other waits whole (no deadlock of two
/// half-placed jobs); once the first is deleted the second runs whole.
async fn e_competing_jobs_one_runs_whole_the_other_waits_whole(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-e-{}", tag(backend)), true).await;
    harness::competing_gangs(&mut s, backend, waiting_reason(backend)).await;
    s.cleanup().await;
}

/// (f) A job whose master exits 0 succeeds, and podgroup-sync deletes its PodGroup (the job
/// itself stays).
async fn f_a_finished_job_loses_its_pod_group(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-f-{}", tag(backend)), true).await;
    for _ in 0..2 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let job = format!("done-{}", s.id);
    let mut master = replicas("Master", 1, 1);
    master.succeed = true;
    let manifest = pytorch(
        Link::Gang(backend),
        &job,
        s.pool(),
        master,
        replicas("Worker", 1, 1),
    );
    s.create(&ns, Kind::PyTorchJob, &manifest).await;

    s.wait_pg(&ns, backend, &job, "created", |_| true).await;
    s.wait_job_condition(&ns, Kind::PyTorchJob, &job, "Succeeded")
        .await;
    s.wait_pg_gone(&ns, backend, &job, "PyTorchJob Succeeded")
        .await;
    let still = jobs::api(&s.client, &ns, &Kind::PyTorchJob.ar())
        .get_opt(&job)
        .await
        .expect("get job");
    assert!(still.is_some(), "the finished job itself must stay");
    s.cleanup().await;
}

/// (g) A kind added by its own file: an XGBoostJob (1 Master + 2 Workers, 1 GPU each) that
/// training-operator runs with its gang mode off. On 2 GPUs nothing binds; a third GPU node and
/// all 3 run.
async fn g_xgboostjob_run_by_training_operator_is_one_gang(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-g-{}", tag(backend)), true).await;
    for _ in 0..2 {
        s.add_node(1).await;
    }
    let job = format!("xgb-{}", s.id);
    let manifest = training_job(
        Kind::XGBoostJob,
        Link::Gang(backend),
        &job,
        s.pool(),
        &[replicas("Master", 1, 1), replicas("Worker", 2, 1)],
        json!({}),
    );
    waits_whole_then_runs_whole(&mut s, backend, Kind::XGBoostJob, &job, &manifest, 3, "3").await;
    s.cleanup().await;
}

/// (h) A gang that ran whole loses a worker with its node (cordoned, the pod deleted): the
/// operator recreates the pod, which finds no room, so fewer than minMember pods run; past --gang-broken-seconds (3 s here) the job
/// gets GangBroken. A new node takes the replacement, the gang is whole again: GangRecovered.
async fn h_a_gang_that_loses_a_node_is_broken_then_recovers(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-h-{}", tag(backend)), true).await;
    for _ in 0..3 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let job = format!("pt-{}", s.id);
    let mut manifest = pytorch(
        Link::Gang(backend),
        &job,
        s.pool(),
        replicas("Master", 1, 1),
        replicas("Worker", 2, 1),
    );
    // training-operator counts a deleted pod as failed: with Never the job fails, with
    // OnFailure it is Restarting and the pod is recreated.
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = json!("OnFailure");
    s.create(&ns, Kind::PyTorchJob, &manifest).await;
    let running = s.wait_all_running(&ns, &job, 3).await;
    s.wait_pg(&ns, backend, &job, "3 pods running", |pg| {
        pg.data.pointer("/status/running") == Some(&json!(3))
    })
    .await;
    let worker = running
        .iter()
        .find(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.contains("worker"))
        })
        .expect("a worker pod");
    let node = worker
        .spec
        .as_ref()
        .and_then(|sp| sp.node_name.clone())
        .expect("bound");
    let pod = worker.metadata.name.clone().unwrap_or_default();
    s.lose_node(&node, &pod).await;
    let note = s.wait_event(&ns, &job, "GangBroken").await;
    eprintln!("[{ns}] {note}");
    assert!(
        note.contains("only 2 of minMember 3 pods"),
        "{note}\n{}",
        s.diagnostics()
    );
    assert!(
        jobs::events(&s.client, &ns, &job, "GangRecovered")
            .await
            .is_empty(),
        "not whole yet"
    );
    s.add_node(1).await;
    s.wait_all_running(&ns, &job, 3).await;
    let note = s.wait_event(&ns, &job, "GangRecovered").await;
    eprintln!("[{ns}] {note}");
    s.cleanup().await;
}

/// (i) SPEC §11: the real JobSet controller makes 2 Jobs of 4 pods (1 GPU each); with room for 7
/// none binds and the JobSet is told why; one more GPU and all 8 bind.
async fn i_a_jobset_binds_none_then_all(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-i-{}", tag(backend)), true).await;
    for _ in 0..7 {
        s.add_node(1).await;
    }
    let job = format!("js-{}", s.id);
    let manifest = jobset(
        Link::Gang(backend),
        &job,
        s.pool(),
        &[("workers", 2, 4, 1)],
        json!({}),
    );
    let note =
        waits_whole_then_runs_whole(&mut s, backend, Kind::JobSet, &job, &manifest, 8, "8").await;
    eprintln!("[{}] JobSet of 2x4 waited on 7 GPUs: {note}", s.ns);
    s.cleanup().await;
}

/// (j) SPEC §11: the real KubeRay operator makes a head (no GPU) and 2 replicas × 2 hosts of
/// GPU workers; on 3 GPUs not even the head binds, with a fourth the cluster binds whole.
async fn j_a_raycluster_binds_whole(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-j-{}", tag(backend)), true).await;
    for _ in 0..3 {
        s.add_node(1).await;
    }
    let job = format!("rc-{}", s.id);
    let manifest = raycluster(Link::Gang(backend), &job, s.pool(), 2, 2);
    let note =
        waits_whole_then_runs_whole(&mut s, backend, Kind::RayCluster, &job, &manifest, 5, "4")
            .await;
    eprintln!("[{}] RayCluster head + 2x2 waited on 3 GPUs: {note}", s.ns);
    s.cleanup().await;
}

/// (k) SPEC §11: `startupPolicy: InOrder` creates the workers only once the driver runs. The
/// gang is the driver alone (a gang of all pods would deadlock), so the driver binds, then the
/// workers are created and bind one by one; their pods carry no link.
async fn k_an_in_order_jobset_starts_step_by_step_without_deadlock(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-k-{}", tag(backend)), true).await;
    for _ in 0..4 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let job = format!("ord-{}", s.id);
    let manifest = jobset(
        Link::Gang(backend),
        &job,
        s.pool(),
        &[("driver", 1, 1, 1), ("workers", 1, 3, 1)],
        json!({"startupPolicy": {"startupPolicyOrder": "InOrder"}}),
    );
    s.create(&ns, Kind::JobSet, &manifest).await;
    let pg = s
        .wait_pg(&ns, backend, &job, "minMember 1 (the driver)", |pg| {
            spec(pg)["minMember"] == 1
        })
        .await;
    eprintln!("[{ns}] InOrder JobSet PodGroup: {}", spec(&pg));
    let running = s.wait_all_running(&ns, &job, 4).await;
    eprintln!(
        "[{ns}] InOrder JobSet ran step by step: {:?}",
        names_of(&running)
    );
    s.cleanup().await;
}

/// (l) SPEC §11: a RayJob's gang is the RayCluster KubeRay creates for it (`status.rayClusterName`):
/// head + 2 × 2 GPU workers wait whole on 3 GPUs and bind whole on 4 (the submitter is not a
/// RayCluster pod: outside the gang); suspending the RayJob deletes its RayCluster, and the
/// PodGroup goes with it.
async fn l_a_rayjob_runs_on_a_whole_gang_and_suspending_it_frees_the_pod_group(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-l-{}", tag(backend)), true).await;
    for _ in 0..3 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let job = format!("rj-{}", s.id);
    let rayjob_ar = harness::rayjob_ar();
    let api = jobs::api(&s.client, &ns, &rayjob_ar);
    s.create_as(
        &rayjob_ar,
        harness::rayjob(Link::Gang(backend), &job, s.pool(), 2, 2, json!({})),
    )
    .await;
    let cluster_name = harness::rayjob_cluster(&s, &job).await;
    let pg = s
        .wait_pg(&ns, backend, &cluster_name, "minMember 5", |pg| {
            spec(pg)["minMember"] == 5
        })
        .await;
    assert_eq!(spec(&pg)["minResources"][harness::GPU], "4");
    s.wait_all_refused(&ns, &job, 5).await;
    let waiting = s.pods(&ns, &job).await;
    assert!(
        waiting.iter().all(|p| !is_bound(p)),
        "{:?}\n{}",
        names_of(&waiting),
        s.diagnostics()
    );
    s.add_node(1).await;
    let running = s.wait_all_running(&ns, &job, 5).await;
    eprintln!(
        "[{ns}] RayJob's cluster {cluster_name} runs whole: {:?}",
        names_of(&running)
    );
    api.patch(
        &job,
        &Default::default(),
        &kube::api::Patch::Merge(json!({"spec": {"suspend": true}})),
    )
    .await
    .expect("suspend the RayJob");
    s.wait_pg_gone(&ns, backend, &cluster_name, "the RayJob suspended")
        .await;
    s.cleanup().await;
}

/// (m) SPEC §11: the real LWS controller makes 3 groups of a leader and 3 workers (1 GPU each);
/// with room for 2 groups exactly 2 run whole, each pod linked to its group's PodGroup; with
/// room for 3 all do.
async fn m_an_lws_of_3_groups_with_room_for_2_runs_exactly_2_whole_groups(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-m-{}", tag(backend)), true).await;
    harness::lws_runs_whole_groups(&mut s, backend, |pg| spec(pg)["minMember"].clone()).await;
    s.cleanup().await;
}

/// (n) SPEC §11, Trainer v2 with the real Trainer controller (and the JobSet controller under
/// it): a TrainJob of 4 nodes (1 GPU each) on a runtime without a PodGroup policy runs as one
/// gang — podgroup-sync's PodGroup, owned by the JobSet Trainer made — binding none on 3 GPUs and
/// all 4 on 4. Then a TrainJob on a runtime whose PodGroup policy is this backend's: Trainer makes
/// the PodGroup and links the pods itself; podgroup-sync makes none and never writes Trainer's.
async fn n_a_trainjob_runs_as_one_gang_and_trainers_own_pod_group_is_left_alone(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-n-{}", tag(backend)), true).await;
    for _ in 0..3 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let job = format!("tj-{}", s.id);
    create_trainjob(&s, Link::Gang(backend), &job, 4, 1, None).await;
    let note = gang_waits_whole_then_runs_whole(&mut s, backend, "TrainJob", &job, 4, "4").await;
    eprintln!("[{ns}] TrainJob of 4 nodes waited on 3 GPUs: {note}");
    let pg = jobs::get_pg(&s.client, &ns, backend, &job)
        .await
        .expect("the TrainJob's PodGroup");
    let js = jobs::api(&s.client, &ns, &Kind::JobSet.ar())
        .get(&job)
        .await
        .expect("the JobSet Trainer made");
    let controller = |o: &DynamicObject| {
        let r = o.metadata.owner_references.iter().flatten();
        r.filter(|r| r.controller == Some(true))
            .map(|r| (r.kind.clone(), r.uid.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        controller(&pg),
        vec![("JobSet".to_string(), js.metadata.uid.clone().unwrap())],
        "podgroup-sync's PodGroup is the JobSet's"
    );
    assert_eq!(controller(&js)[0].0, "TrainJob", "Trainer's JobSet");

    // Trainer's own gang: the GPUs freed first.
    jobs::api(&s.client, &ns, &trainer_ar("TrainJob", "trainjobs"))
        .delete(&job, &DeleteParams::background())
        .await
        .expect("delete TrainJob");
    s.wait_pg_gone(&ns, backend, &job, "TrainJob deleted").await;
    s.env
        .wait(
            &ns,
            "the first TrainJob's pods gone",
            harness::SLOW,
            || async { s.pods(&ns, &job).await.is_empty().then_some(()) },
        )
        .await;
    let theirs = format!("tjp-{}", s.id);
    let policy = match backend {
        Backend::Volcano => json!({"volcano": {}}),
        _ => json!({"coscheduling": {"scheduleTimeoutSeconds": 60}}),
    };
    let tj = create_trainjob(&s, Link::Plain(backend), &theirs, 4, 1, Some(policy)).await;
    let running = s.wait_all_running(&ns, &theirs, 4).await;
    let pg = jobs::get_pg(&s.client, &ns, backend, &theirs)
        .await
        .expect("Trainer's PodGroup");
    assert_eq!(
        controller(&pg),
        vec![("TrainJob".to_string(), tj.metadata.uid.clone().unwrap())],
        "Trainer's PodGroup is the TrainJob's"
    );
    let managers = support::lifecycle::field_managers(&pg);
    assert!(
        !managers.iter().any(|m| m == "podgroup-sync"),
        "podgroup-sync never writes Trainer's PodGroup: {managers:?}"
    );
    let links = harness::pod_links(&s, &ns, &theirs, backend).await;
    assert!(
        links.len() == 4
            && links
                .iter()
                .all(|l| l.link.as_deref() == Some(theirs.as_str())),
        "every pod linked (by Trainer) to Trainer's PodGroup: {links:?}"
    );
    let pgs = jobs::api(&s.client, &ns, &backend.ar())
        .list(&Default::default())
        .await
        .expect("list PodGroups");
    let names: Vec<_> = pgs
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    assert_eq!(
        names,
        vec![theirs.clone()],
        "no PodGroup of podgroup-sync's beside Trainer's"
    );
    eprintln!(
        "[{ns}] TrainJob with Trainer's {backend:?} PodGroup ran: {:?}; its managers {managers:?}",
        names_of(&running)
    );
    s.cleanup().await;
}

/// (o) SPEC §11: an LWS under `startupPolicy: LeaderReady` creates its workers only once the
/// leader is ready; the gang is the workers, so the group starts without deadlock.
async fn o_a_leader_ready_lws_starts_without_deadlock(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-o-{}", tag(backend)), true).await;
    harness::lws_leader_ready_starts_without_deadlock(&mut s, backend, |pg| {
        spec(pg)["minMember"].clone()
    })
    .await;
    s.cleanup().await;
}

/// (p) SPEC §12 with the real Kueue: see [`kueue::admission_preemption_readmission`].
async fn p_kueue_admission_preemption_and_readmission_move_the_pod_group(backend: Backend) {
    let _turn = exclusive().await;
    let s = Scope::new(&format!("e2e-p-{}", tag(backend)), true).await;
    kueue::admission_preemption_readmission(s, backend, |pg| spec(pg)["minMember"].clone()).await;
}

/// (q) SPEC §12: partial admission — an Indexed Job of 4 (1 GPU a pod) that accepts 2, in a
/// ClusterQueue with 2 GPUs: Kueue admits 2, and the PodGroup is a gang of 2 with 2 GPUs. Then a
/// PyTorchJob of 4 that Kueue admits but whose gang cannot bind (3 GPUs): the backend's waiting
/// Event comes before Kueue's waitForPodsReady (40 s) evicts it; on scheduler-plugins its
/// scheduleTimeoutSeconds of 60 is reported as above Kueue's; evicted, it has no PodGroup.
async fn q_kueue_partial_admission_and_a_gang_that_cannot_bind_before_eviction(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-q-{}", tag(backend)), true).await;
    for _ in 0..3 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let cq = kueue::queues(&s, 2, false).await;
    let ij = format!("ij-{}", s.id);
    let link = Link::HandLinked(backend);
    let mut pod = harness::template(link, &ij, s.pool(), "main", &replicas("worker", 4, 1));
    pod["spec"]["restartPolicy"] = json!("Never");
    // kwok completes a Job's pods at once unless they carry this label (start.sh).
    pod["metadata"]["labels"]["e2e.podgroup-sync.io/keep-running"] = json!("true");
    let metadata = kueue::queued(
        json!({"name": ij, "annotations": {
            "podgroup-sync.io/gang": "true",
            "podgroup-sync.io/backend": backend.name(),
            "kueue.x-k8s.io/job-min-parallelism": "2",
            "kueue.x-k8s.io/job-completions-equal-parallelism": "true"}}),
        None,
    );
    let manifest = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
        "spec": {"parallelism": 4, "completions": 4, "completionMode": "Indexed",
            "backoffLimit": 0, "template": pod}});
    s.create(&ns, Kind::IndexedJob, &manifest).await;
    let pg = s
        .wait_pg(&ns, backend, &ij, "the 2 pods Kueue admitted", |pg| {
            spec(pg)["minMember"] == 2
        })
        .await;
    assert_eq!(spec(&pg)["minResources"][harness::GPU], "2");
    let running = s.wait_all_running(&ns, &ij, 2).await;
    eprintln!(
        "[{ns}] partially admitted: a gang of 2 runs: {:?}",
        names_of(&running)
    );
    jobs::api(&s.client, &ns, &Kind::IndexedJob.ar())
        .delete(&ij, &DeleteParams::background())
        .await
        .expect("delete the Indexed Job");
    s.wait_pg_gone(&ns, backend, &ij, "Job deleted").await;
    kueue::wait_pods_gone(&s, &ij, "Job deleted").await;

    kueue::patch_cluster_queue(&s.client, &cq, kueue::gpu_quota(4)).await;
    let big = format!("big-{}", s.id);
    let mut m = pytorch(
        Link::Gang(backend),
        &big,
        s.pool(),
        replicas("Master", 1, 1),
        replicas("Worker", 3, 1),
    );
    m["metadata"] = kueue::queued(m["metadata"].clone(), None);
    if backend == Backend::SchedulerPlugins {
        m["spec"]["runPolicy"] = json!({"schedulingPolicy": {"scheduleTimeoutSeconds": 60}});
    }
    let uid = s
        .create(&ns, Kind::PyTorchJob, &m)
        .await
        .metadata
        .uid
        .expect("uid");
    s.wait_pg(&ns, backend, &big, "minMember 4", |pg| {
        spec(pg)["minMember"] == 4
    })
    .await;
    let note = s.wait_event(&ns, &big, waiting_reason(backend)).await;
    let w = kueue::workload_of(&s.client, &ns, &uid)
        .await
        .expect("the Workload");
    assert!(
        kueue::condition(&w, "Admitted") && !kueue::condition(&w, "Evicted"),
        "the gang's wait is reported while Kueue still waits for its pods: {:?}",
        w.data.get("status")
    );
    eprintln!("[{ns}] admitted, cannot bind, reported before eviction: {note}");
    if backend == Backend::SchedulerPlugins {
        let note = s.wait_event(&ns, &big, "GangTimeoutAboveKueue").await;
        assert!(note.contains("scheduleTimeoutSeconds 60"), "{note}");
    }
    kueue::wait_workload(&s, &uid, "evicted by waitForPodsReady", |w| {
        kueue::condition(w, "Evicted") || w.data.pointer("/spec/active") == Some(&json!(false))
    })
    .await;
    s.wait_pg_gone(&ns, backend, &big, "evicted by Kueue").await;
    kueue::wait_pods_gone(&s, &big, "evicted by Kueue").await;
    let job = jobs::api(&s.client, &ns, &Kind::PyTorchJob.ar())
        .get(&big)
        .await
        .expect("the evicted job");
    assert!(
        kueue::suspended(&job, Kind::PyTorchJob),
        "Kueue suspended it"
    );
    kueue::delete_cluster_queue(&s.client, &cq).await;
    s.cleanup().await;
}

/// (r) SPEC §11 beside §12: a JobSet and a RayJob queued in a held ClusterQueue have no PodGroup;
/// released, each gets its PodGroup before its first pod and runs whole, every pod linked.
async fn r_a_jobset_and_a_rayjob_beside_kueue(backend: Backend) {
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-r-{}", tag(backend)), true).await;
    for _ in 0..4 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let cq = kueue::queues(&s, 8, true).await;
    let js = format!("js-{}", s.id);
    let mut m = jobset(
        Link::Gang(backend),
        &js,
        s.pool(),
        &[("w", 1, 2, 1)],
        json!({}),
    );
    m["metadata"] = kueue::queued(m["metadata"].clone(), None);
    let created = s.create(&ns, Kind::JobSet, &m).await;
    assert!(
        kueue::suspended(&created, Kind::JobSet),
        "Kueue suspends a queued JobSet"
    );

    let rj = format!("rj-{}", s.id);
    let queued = kueue::queued(json!({}), None);
    let rayjob_ar = harness::rayjob_ar();
    let created = s
        .create_as(
            &rayjob_ar,
            harness::rayjob(Link::Gang(backend), &rj, s.pool(), 2, 1, queued),
        )
        .await;
    assert_eq!(
        created.data.pointer("/spec/suspend"),
        Some(&json!(true)),
        "Kueue suspends a queued RayJob"
    );
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(
        jobs::get_pg(&s.client, &ns, backend, &js).await.is_none(),
        "a JobSet Kueue has not admitted has no PodGroup"
    );
    let pgs = jobs::api(&s.client, &ns, &backend.ar())
        .list(&Default::default())
        .await
        .expect("list PodGroups");
    assert!(pgs.items.is_empty(), "no PodGroup while Kueue holds both");

    kueue::patch_cluster_queue(&s.client, &cq, json!({"stopPolicy": "None"})).await;
    s.wait_all_running(&ns, &js, 2).await;
    kueue::assert_pod_group_first_and_every_pod_linked(&s, backend, &js).await;
    let cluster_name = harness::rayjob_cluster(&s, &rj).await;
    let pg = s
        .wait_pg(&ns, backend, &cluster_name, "minMember 3", |pg| {
            spec(pg)["minMember"] == 3
        })
        .await;
    assert_eq!(spec(&pg)["minResources"][harness::GPU], "2");
    let running = s.wait_all_running(&ns, &rj, 3).await;
    kueue::assert_no_pod_linked_to_a_missing_pod_group(&s, backend, "both admitted").await;
    eprintln!(
        "[{ns}] JobSet {js} and RayJob {rj} admitted by Kueue run whole: {:?}",
        names_of(&running)
    );
    kueue::delete_cluster_queue(&s.client, &cq).await;
    s.cleanup().await;
}

/// How many times the sliced job is placed (SPEC §13: "in 20 of 20 runs").
const SLICED_RUNS: usize = 20;

/// (s) SPEC §13. 4 racks of 4 two-GPU nodes (32 GPUs, room for 16 pods twice over). Volcano, with
/// the racks' HyperNodes (tier 1, named after the rack label) and their zone's (tier 2): without
/// a topology the 16 one-GPU workers of a PyTorchJob spread over the racks; with
/// `podset-slice-required-topology: rack` and `podset-slice-size: 8` on the Worker template, each
/// slice (replica index / 8) lands in one rack, in every one of 20 runs, its pods labelled with
/// their slice by the webhook; a JobSet of 2 Jobs × 4 two-GPU pods in slices of 4 has each Job
/// in one rack; a job of 12 requiring one rack (8 GPUs each) binds nothing and says why. scheduler-plugins: the same sliced job runs (the backend has no topology) and is
/// told once, in a Normal Event, that its topology is not enforced.
async fn s_a_sliced_job_lands_each_slice_in_one_rack(backend: Backend) {
    use topology::{RACK, delete_and_drain, racks_per_slice};
    const RACK_SLICE: &str = "kueue.x-k8s.io/podset-slice-required-topology";
    const SLICE_SIZE: &str = "kueue.x-k8s.io/podset-slice-size";
    let _turn = exclusive().await;
    let mut s = Scope::new(&format!("e2e-s-{}", tag(backend)), true).await;
    let ns = s.ns.clone();
    let racks = topology::racks(&mut s, 4, 4, 2).await;
    let sliced = json!({
        "kueue.x-k8s.io/podset-slice-required-topology": RACK,
        "kueue.x-k8s.io/podset-slice-size": "8",
    });
    let link = Link::Gang(backend);
    if backend == Backend::SchedulerPlugins {
        let job = format!("sl-{}", s.id);
        let m = topology::pytorch(link, &job, s.pool(), 16, json!({}), sliced);
        s.create(&ns, Kind::PyTorchJob, &m).await;
        let note = s.wait_event(&ns, &job, "TopologyNotEnforced").await;
        assert!(
            note.contains("no topology field") && note.contains("2 slices of 8"),
            "{note}"
        );
        s.wait_all_running(&ns, &job, 16).await;
        let events = jobs::events(&s.client, &ns, &job, "TopologyNotEnforced").await;
        assert_eq!(events.len(), 1, "one Event: {events:?}");
        assert_eq!(events[0].type_.as_deref(), Some("Normal"));
        eprintln!("[{ns}] scheduler-plugins: the sliced job runs, told: {note}");
        s.cleanup().await;
        return;
    }
    let hyper_nodes = topology::hyper_nodes(&s, &racks).await;

    // Without a topology, the scheduler spreads the workers over the racks.
    let job = format!("spread-{}", s.id);
    let m = topology::pytorch(link, &job, s.pool(), 16, json!({}), json!({}));
    s.create(&ns, Kind::PyTorchJob, &m).await;
    let pods = s.wait_all_running(&ns, &job, 16).await;
    let spread = racks_per_slice(&pods, &racks, 8);
    eprintln!("[{ns}] without a topology, slices of 8 on racks {spread:?}");
    assert!(
        spread.values().any(|r| r.len() > 1),
        "without a topology some slice spans racks, or the test proves nothing: {spread:?}"
    );
    delete_and_drain(&s, Kind::PyTorchJob, &job).await;

    let updates_before = topology::writes(&s, "volcano", "update");
    let mut times = Vec::new();
    for run in 0..SLICED_RUNS {
        let start = std::time::Instant::now();
        let job = format!("sl-{}-{run}", s.id);
        let m = topology::pytorch(link, &job, s.pool(), 16, json!({}), sliced.clone());
        s.create(&ns, Kind::PyTorchJob, &m).await;
        let pg = s
            .wait_pg(&ns, backend, &job, "a subGroupPolicy", |pg| {
                spec(pg)["subGroupPolicy"].is_array()
            })
            .await;
        assert_eq!(spec(&pg)["subGroupPolicy"][0]["minSubGroups"], 2);
        assert!(
            topology::applied_tier_numbers(&pg),
            "run {run}: podgroup-sync's own apply gives the slices' tier by number (Volcano 1.14 \
             ignores a sub-group's tier name until its scheduler has written the PodGroup back: \
             volcano-sh/volcano#5189): {:?}",
            pg.metadata.managed_fields
        );
        let pods = s.wait_all_running(&ns, &job, 16).await;
        let placed = racks_per_slice(&pods, &racks, 8);
        assert!(
            placed.len() == 2 && placed.values().all(|r| r.len() == 1),
            "run {run}: each slice of 8 in one rack: {placed:?} {:?}",
            names_of(&pods)
        );
        for p in &pods {
            let index: u64 = topology::label(p, "training.kubeflow.org/replica-index")
                .and_then(|i| i.parse().ok())
                .unwrap();
            assert_eq!(
                topology::label(p, "podgroup-sync.io/slice"),
                Some((index / 8).to_string().as_str()),
                "the webhook labels each pod with its slice"
            );
        }
        let placed_in = start.elapsed();
        let drained = delete_and_drain(&s, Kind::PyTorchJob, &job).await;
        times.push((placed_in, drained));
        eprintln!("[{ns}] run {run}: slices on racks {placed:?} in {placed_in:.1?}");
    }
    // Volcano's scheduler writes its PodGroups back with the tier names resolved into numbers:
    // the same request in its words, accepted, never undone.
    let updates = topology::writes(&s, "volcano", "update") - updates_before;
    assert_eq!(updates, 0.0, "PodGroup updates during {SLICED_RUNS} runs");
    let mean = times.iter().map(|t| t.0).sum::<std::time::Duration>() / times.len() as u32;
    eprintln!(
        "[{ns}] {SLICED_RUNS} of {SLICED_RUNS} runs: each slice in one rack; created to all \
         running in {mean:.1?} on average"
    );

    // A JobSet of 2 Jobs × 4 two-GPU pods in slices of 4: each Job (its pods' Job index × 4 +
    // completion index, / 4) fills one rack.
    let js = format!("js-{}", s.id);
    let mut m = jobset(link, &js, s.pool(), &[("w", 2, 4, 2)], json!({}));
    m["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["annotations"]
        [RACK_SLICE] = json!(RACK);
    m["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["annotations"]
        [SLICE_SIZE] = json!("4");
    s.create(&ns, Kind::JobSet, &m).await;
    let pg = s
        .wait_pg(&ns, backend, &js, "a subGroupPolicy", |pg| {
            spec(pg)["subGroupPolicy"].is_array()
        })
        .await;
    assert!(
        topology::applied_tier_numbers(&pg),
        "the JobSet's slices' tier by number: {:?}",
        pg.metadata.managed_fields
    );
    let pods = s.wait_all_running(&ns, &js, 8).await;
    let mut by_job: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for p in &pods {
        let job = topology::label(p, "jobset.sigs.k8s.io/job-index").unwrap_or("?");
        assert_eq!(
            topology::label(p, "podgroup-sync.io/slice"),
            Some(job),
            "a JobSet pod's slice is its Job's index"
        );
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        by_job
            .entry(job.to_string())
            .or_default()
            .insert(racks.rack_of[&node].clone());
    }
    assert!(
        by_job.len() == 2 && by_job.values().all(|r| r.len() == 1),
        "each Job of the JobSet in one rack: {by_job:?} {:?}",
        names_of(&pods)
    );
    eprintln!("[{ns}] JobSet in slices of one Job: racks {by_job:?}");
    delete_and_drain(&s, Kind::JobSet, &js).await;

    // 12 pods in one rack of 8 GPUs: nothing binds, the job says why.
    let job = format!("rack-{}", s.id);
    let one_rack = json!({"kueue.x-k8s.io/podset-required-topology": RACK});
    let m = topology::pytorch(link, &job, s.pool(), 12, one_rack, json!({}));
    s.create(&ns, Kind::PyTorchJob, &m).await;
    let pg = s
        .wait_pg(&ns, backend, &job, "a network topology", |pg| {
            spec(pg)["networkTopology"].is_object()
        })
        .await;
    // As podgroup-sync wrote it, or as Volcano's scheduler writes it back once it has resolved
    // the tier's name (the rack HyperNodes' tier 1) while the name asked for stays recorded.
    let topology = &spec(&pg)["networkTopology"];
    assert!(
        *topology == json!({"mode": "hard", "highestTierName": RACK})
            || *topology == json!({"mode": "hard", "highestTierAllowed": 1}),
        "{topology}"
    );
    assert_eq!(
        pg.metadata.annotations.as_ref().unwrap()["podgroup-sync.io/tier-names"],
        format!("networkTopology={RACK}")
    );
    let note = s.wait_event(&ns, &job, waiting_reason(backend)).await;
    assert!(
        note.contains(&format!(
            "holds the gang to all its pods in one domain of {RACK}"
        )),
        "the job is told why: {note}"
    );
    topology::none_binds_for(&s, &job, 5).await;
    eprintln!("[{ns}] 12 pods required in one rack of 8 GPUs: none binds; the job is told: {note}");
    delete_and_drain(&s, Kind::PyTorchJob, &job).await;
    topology::delete_hyper_nodes(&s, &hyper_nodes).await;
    s.cleanup().await;
}
