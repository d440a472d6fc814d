//! End to end on Kubernetes' own gang scheduling (SPEC §9): a 1.37 control plane with the
//! GenericWorkload gate, its kube-scheduler (GangScheduling in the default profile), kwok nodes,
//! training-operator and mpi-operator with their gang modes off, job templates unchanged and the
//! pod-link webhook on (`tests/e2e/start.sh` with E2E_NATIVE=1). The scenarios take turns, as in
//! `tests/e2e.rs`. `make native` runs them.

// Shared with tests/e2e.rs, whose hand-linked and unlinked jobs have no native counterpart.
#[path = "e2e/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "e2e/kueue.rs"]
#[allow(dead_code)]
mod kueue;
mod support;
#[path = "e2e/topology.rs"]
#[allow(dead_code)]
mod topology;

use harness::{Link, Replicas, Scope, exclusive, is_bound, names_of, replicas, training_job};
use kube::api::DynamicObject;
use serde_json::{Value, json};
use support::jobs::{self, Backend, Kind, spec};

const B: Backend = Backend::Kubernetes;

async fn scope(prefix: &str, enabled: bool) -> Scope {
    support::use_native_gang();
    support::use_workload_crds();
    // SPEC §13: kube-scheduler's topology-aware workload scheduling (alpha in 1.37).
    support::use_topology_gate();
    Scope::new(prefix, enabled).await
}

fn pytorch(name: &str, pool: &str, master: Replicas, workers: Replicas) -> Value {
    training_job(
        Kind::PyTorchJob,
        Link::Gang(B),
        name,
        pool,
        &[master, workers],
        json!({}),
    )
}

/// Three one-GPU nodes and a zero-touch PyTorchJob of 1 master + 3 workers (1 GPU each) on
/// them: the job's name.
async fn gang_of_four_on_three_gpus(s: &mut Scope) -> String {
    for _ in 0..3 {
        s.add_node(1).await;
    }
    let job = format!("pt-{}", s.id);
    let manifest = pytorch(
        &job,
        s.pool(),
        replicas("Master", 1, 1),
        replicas("Worker", 3, 1),
    );
    let ns = s.ns.clone();
    s.create(&ns, Kind::PyTorchJob, &manifest).await;
    job
}

fn min_count(pg: &DynamicObject) -> Value {
    spec(pg)["schedulingPolicy"]["gang"]["minCount"].clone()
}

/// The `PodGroupInitiallyScheduled` condition's status, as kube-scheduler wrote it.
fn initially_scheduled(pg: &DynamicObject) -> Option<&str> {
    pg.data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "PodGroupInitiallyScheduled")?
        .get("status")?
        .as_str()
}

/// The pods' `spec.schedulingGroup.podGroupName`s (untyped: the 1.34 Pod type has no field).
async fn scheduling_groups(s: &Scope, ns: &str, job: &str) -> Vec<Option<String>> {
    let ar = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
    let pods = jobs::api(&s.client, ns, &ar)
        .list(&kube::api::ListParams::default().labels(&format!("{}={job}", harness::JOB_LABEL)))
        .await
        .expect("list pods")
        .items;
    pods.iter()
        .map(|p| {
            p.data
                .pointer("/spec/schedulingGroup/podGroupName")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect()
}

/// (a) 1 master + 3 workers, 1 GPU each, on nodes with 3 GPUs: the native PodGroup says
/// minCount 4, kube-scheduler binds none and says why (mirrored as GangUnschedulable); one more
/// GPU node and all 4 bind, and the PodGroup is marked initially scheduled.
#[tokio::test]
async fn a_gang_waits_whole_for_capacity_then_binds_whole() {
    let _turn = exclusive().await;
    let mut s = scope("e2e-na", true).await;
    let job = gang_of_four_on_three_gpus(&mut s).await;
    let ns = s.ns.clone();
    s.wait_pg(&ns, B, &job, "minCount 4", |pg| min_count(pg) == 4)
        .await;
    let note = s.wait_event(&ns, &job, "GangUnschedulable").await;
    s.wait_all_refused(&ns, &job, 4).await;
    let waiting = s.pods(&ns, &job).await;
    assert!(
        waiting.iter().all(|p| !is_bound(p)),
        "a gang of 4 with room for 3: no pod may bind: {:?}\n{}",
        names_of(&waiting),
        s.diagnostics()
    );
    assert_eq!(
        scheduling_groups(&s, &ns, &job).await,
        vec![Some(job.clone()); 4],
        "the webhook links every pod\n{}",
        s.diagnostics()
    );
    s.add_node(1).await;
    let running = s.wait_all_running(&ns, &job, 4).await;
    eprintln!(
        "[{ns}] native gang of 4 waited on 3 GPUs ({note}); runs whole: {:?}",
        names_of(&running)
    );
    s.wait_pg(&ns, B, &job, "initially scheduled", |pg| {
        initially_scheduled(pg) == Some("True")
    })
    .await;
    s.cleanup().await;
}

/// (b) The same zero-touch job in a namespace that is not enabled: no PodGroup, no link (the
/// webhook adds nothing there), so kube-scheduler places pods one by one: 3 of 4 run on 3 GPUs.
#[tokio::test]
async fn b_without_our_pod_group_there_is_no_gang() {
    let _turn = exclusive().await;
    let mut s = scope("e2e-nb", false).await;
    let job = gang_of_four_on_three_gpus(&mut s).await;
    let ns = s.ns.clone();
    let what = format!("3 of the 4 pods of {ns}/{job} Running, the 4th refused");
    let pods = s
        .env
        .wait(&ns, &what, harness::SLOW, || async {
            let pods = s.pods(&ns, &job).await;
            let running = pods.iter().filter(|p| harness::is_running(p)).count();
            let refused = pods.iter().filter(|p| harness::is_refused(p)).count();
            (pods.len() == 4 && running == 3 && refused == 1).then_some(pods)
        })
        .await;
    eprintln!("[{ns}] not enabled, no gang: {:?}", names_of(&pods));
    assert_eq!(scheduling_groups(&s, &ns, &job).await, vec![None; 4]);
    assert!(
        jobs::get_pg(&s.client, &ns, B, &job).await.is_none(),
        "no PodGroup in a namespace that is not enabled\n{}",
        s.diagnostics()
    );
    s.cleanup().await;
}

/// (c) Two gangs of 4 on room for 4: one runs whole, the other waits whole; the first deleted,
/// the second runs whole.
#[tokio::test]
async fn c_competing_jobs_one_runs_whole_the_other_waits_whole() {
    let _turn = exclusive().await;
    let mut s = scope("e2e-nc", true).await;
    harness::competing_gangs(&mut s, B, "GangUnschedulable").await;
    s.cleanup().await;
}

/// (d) MPIJob v2beta1 with launcherCreationPolicy WaitForWorkersReady: the launcher is left out
/// of the gang (minCount 2), the workers bind as one, the launcher follows through its batch
/// Job, the job succeeds and its PodGroup goes.
#[tokio::test]
async fn d_mpijob_wait_for_workers_ready_runs_to_completion() {
    let _turn = exclusive().await;
    let mut s = scope("e2e-nd", true).await;
    harness::mpijob_runs_to_completion(&mut s, B, |pg, s| {
        assert_eq!(min_count(pg), 2, "launcher left out\n{}", s.diagnostics());
    })
    .await;
    s.cleanup().await;
}

/// A zero-touch workload of another operator (SPEC §11) created on too few one-GPU nodes: the
/// native PodGroup says minCount `pods`, kube-scheduler binds none, every pod is linked through
/// its scheduling group; one more GPU node and all bind.
async fn native_waits_whole_then_binds_whole(
    s: &mut Scope,
    kind: Kind,
    job: &str,
    manifest: &Value,
    pods: usize,
) {
    let ns = s.ns.clone();
    s.create(&ns, kind, manifest).await;
    native_gang_waits_then_binds(s, &format!("{kind:?}"), job, pods).await;
}

/// The rest of [`native_waits_whole_then_binds_whole`], for a job `job` made another way (a
/// TrainJob's JobSet, made by Trainer); `what_kind` names it in messages.
async fn native_gang_waits_then_binds(s: &mut Scope, what_kind: &str, job: &str, pods: usize) {
    let ns = s.ns.clone();
    s.wait_pg(&ns, B, job, &format!("minCount {pods}"), |pg| {
        min_count(pg) == pods as u64
    })
    .await;
    let note = s.wait_event(&ns, job, "GangUnschedulable").await;
    s.wait_all_refused(&ns, job, pods).await;
    let waiting = s.pods(&ns, job).await;
    assert!(
        waiting.iter().all(|p| !is_bound(p)),
        "{what_kind}: a gang of {pods} without room for all: no pod may bind: {:?}\n{}",
        names_of(&waiting),
        s.diagnostics()
    );
    assert_eq!(
        scheduling_groups(s, &ns, job).await,
        vec![Some(job.to_string()); pods],
        "{what_kind}: the webhook links every pod\n{}",
        s.diagnostics()
    );
    s.add_node(1).await;
    let running = s.wait_all_running(&ns, job, pods).await;
    eprintln!(
        "[{ns}] native {what_kind} gang of {pods} waited ({note}); runs whole: {:?}",
        names_of(&running)
    );
}

/// (e) The real JobSet controller's 2 Jobs of 4 pods (1 GPU each) on 7 GPUs: none binds, then
/// all 8 on the eighth.
#[tokio::test]
async fn e_a_jobset_binds_none_then_all() {
    let _turn = exclusive().await;
    let mut s = scope("e2e-ne", true).await;
    for _ in 0..7 {
        s.add_node(1).await;
    }
    let job = format!("js-{}", s.id);
    let manifest = harness::jobset(
        Link::Gang(B),
        &job,
        s.pool(),
        &[("workers", 2, 4, 1)],
        json!({}),
    );
    native_waits_whole_then_binds_whole(&mut s, Kind::JobSet, &job, &manifest, 8).await;
    s.cleanup().await;
}

/// (f) The real KubeRay operator's head (no GPU) and 2 × 2 GPU workers on 3 GPUs: not even the
/// head binds; with a fourth GPU the cluster binds whole.
#[tokio::test]
async fn f_a_raycluster_binds_whole() {
    let _turn = exclusive().await;
    let mut s = scope("e2e-nf", true).await;
    for _ in 0..3 {
        s.add_node(1).await;
    }
    let job = format!("rc-{}", s.id);
    let manifest = harness::raycluster(Link::Gang(B), &job, s.pool(), 2, 2);
    native_waits_whole_then_binds_whole(&mut s, Kind::RayCluster, &job, &manifest, 5).await;
    s.cleanup().await;
}

/// (g) The real LWS controller's 3 groups of 4 pods (1 GPU each) on 8 GPUs: one native PodGroup
/// per group, exactly 2 groups bind whole, the third on 4 more GPUs.
#[tokio::test]
async fn g_an_lws_of_3_groups_with_room_for_2_runs_exactly_2_whole_groups() {
    let _turn = exclusive().await;
    let mut s = scope("e2e-ng", true).await;
    harness::lws_runs_whole_groups(&mut s, B, min_count).await;
    s.cleanup().await;
}

/// (h) The real Trainer v2 controller's TrainJob of 4 nodes (1 GPU each) on a runtime without a
/// PodGroup policy, on 3 GPUs: its JobSet's native PodGroup holds every pod back; with a fourth
/// GPU all bind.
#[tokio::test]
async fn h_a_trainjob_runs_as_one_gang() {
    let _turn = exclusive().await;
    let mut s = scope("e2e-nh", true).await;
    for _ in 0..3 {
        s.add_node(1).await;
    }
    let job = format!("tj-{}", s.id);
    harness::create_trainjob(&s, Link::Gang(B), &job, 4, 1, None).await;
    native_gang_waits_then_binds(&mut s, "TrainJob", &job, 4).await;
    s.cleanup().await;
}

/// (i) The real LWS controller under `startupPolicy: LeaderReady`: the gang is the workers, so
/// the leader binds alone and the group starts without deadlock.
#[tokio::test]
async fn i_a_leader_ready_lws_starts_without_deadlock() {
    let _turn = exclusive().await;
    let mut s = scope("e2e-ni", true).await;
    harness::lws_leader_ready_starts_without_deadlock(&mut s, B, min_count).await;
    s.cleanup().await;
}

/// (j) SPEC §12 beside the real Kueue (v0.17.0), on Kubernetes' own gang scheduling: held, no
/// PodGroup; admitted, the PodGroup before the first pod and every pod linked; preempted by a
/// higher priority, the PodGroup gone and nothing linked to it; re-admitted, one PodGroup of 4;
/// a LimitRange Kueue did not count reported (see [`kueue::admission_preemption_readmission`]).
#[tokio::test]
async fn j_kueue_admission_preemption_and_readmission_move_the_pod_group() {
    let _turn = exclusive().await;
    let s = scope("e2e-nj", true).await;
    kueue::admission_preemption_readmission(s, B, min_count).await;
}

/// How many times the rack-bound job is placed (SPEC §13: "in 20 of 20 runs").
const RACK_RUNS: usize = 20;

/// (k) SPEC §13 on the native API, with kube-scheduler's topology-aware workload scheduling
/// (TopologyAwareWorkloadScheduling on the API server and kube-scheduler). 4 racks of 4 two-GPU
/// nodes: without a topology the 8 one-GPU workers of a PyTorchJob spread over the racks; with
/// `podset-required-topology: rack` on the job its PodGroup carries
/// `schedulingConstraints.topology` (and `disruptionMode: All`, asked by annotation) and all 8
/// land in one rack, in every one of 20 runs; 12 workers required in one rack (8 GPUs each)
/// bind nothing and the job says why.
#[tokio::test]
async fn k_a_rack_bound_gang_lands_in_one_rack() {
    use topology::{RACK, delete_and_drain, racks_per_slice};
    let _turn = exclusive().await;
    let mut s = scope("e2e-native-k", true).await;
    let ns = s.ns.clone();
    let racks = topology::racks(&mut s, 4, 4, 2).await;
    let link = Link::Gang(B);

    let job = format!("spread-{}", s.id);
    let m = topology::pytorch(link, &job, s.pool(), 8, json!({}), json!({}));
    s.create(&ns, Kind::PyTorchJob, &m).await;
    let pods = s.wait_all_running(&ns, &job, 8).await;
    let spread = racks_per_slice(&pods, &racks, 8);
    eprintln!("[{ns}] without a topology, the 8 workers on racks {spread:?}");
    assert!(
        spread[&0].len() > 1,
        "without a topology the gang spans racks, or the test proves nothing: {spread:?}"
    );
    delete_and_drain(&s, Kind::PyTorchJob, &job).await;

    let asks = json!({
        "kueue.x-k8s.io/podset-required-topology": RACK,
        "podgroup-sync.io/disruption-mode": "All",
    });
    let mut times = Vec::new();
    for run in 0..RACK_RUNS {
        let start = std::time::Instant::now();
        let job = format!("rk-{}-{run}", s.id);
        let m = topology::pytorch(link, &job, s.pool(), 8, asks.clone(), json!({}));
        s.create(&ns, Kind::PyTorchJob, &m).await;
        let pg = s
            .wait_pg(&ns, B, &job, "schedulingConstraints", |pg| {
                spec(pg)["schedulingConstraints"].is_object()
            })
            .await;
        assert_eq!(
            spec(&pg)["schedulingConstraints"],
            json!({"topology": [{"key": RACK}]}),
            "the API server keeps the constraint (the gate is on)"
        );
        assert_eq!(spec(&pg)["disruptionMode"], json!({"all": {}}));
        let pods = s.wait_all_running(&ns, &job, 8).await;
        let placed = racks_per_slice(&pods, &racks, 8);
        assert!(
            placed[&0].len() == 1,
            "run {run}: the gang in one rack: {placed:?} {:?}",
            names_of(&pods)
        );
        times.push(start.elapsed());
        delete_and_drain(&s, Kind::PyTorchJob, &job).await;
    }
    let mean = times.iter().sum::<std::time::Duration>() / times.len() as u32;
    eprintln!(
        "[{ns}] {RACK_RUNS} of {RACK_RUNS} runs: the gang in one rack; created to all running in \
         {mean:.1?} on average"
    );

    let job = format!("rack-{}", s.id);
    let one_rack = json!({"kueue.x-k8s.io/podset-required-topology": RACK});
    let m = topology::pytorch(link, &job, s.pool(), 12, one_rack, json!({}));
    s.create(&ns, Kind::PyTorchJob, &m).await;
    let note = s.wait_event(&ns, &job, "GangUnschedulable").await;
    assert!(
        note.contains(&format!(
            "holds the gang to all its pods in one domain of {RACK}"
        )),
        "the job is told why: {note}"
    );
    topology::none_binds_for(&s, &job, 5).await;
    eprintln!("[{ns}] 12 pods required in one rack of 8 GPUs: none binds; the job is told: {note}");
    s.cleanup().await;
}
