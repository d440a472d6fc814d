//! Restarts and high availability on a real control plane: a restart with nothing changed
//! writes nothing; with two instances only the leader writes, and a standby takes over when
//! the leader is killed. The tests of this binary run one at a time (each owns its controllers).

mod support;

use std::time::{Duration, Instant};

use kube::Client;
use support::controller::{self, Controller};
use support::jobs::{self, Backend, Kind, wait_pg};

const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn resource_versions(client: &Client, ns: &str, backend: Backend) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = jobs::api(client, ns, &backend.ar())
        .list(&Default::default())
        .await
        .expect("list PodGroups")
        .items
        .into_iter()
        .map(|pg| {
            (
                pg.metadata.name.unwrap_or_default(),
                pg.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn a_restart_with_nothing_changed_writes_nothing() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "restart", &[ENABLED]).await;
    let mut first = controller::start(cluster, None, &[]);

    let mut expected = 0;
    for kind in [Kind::PyTorchJob, Kind::TFJob, Kind::MPIJob] {
        for backend in [Backend::SchedulerPlugins, Backend::Volcano] {
            for i in 0..3 {
                let name = format!(
                    "{}-{}-{i}",
                    format!("{kind:?}").to_lowercase(),
                    format!("{backend:?}").to_lowercase()
                );
                jobs::create(&client, &ns, kind, &jobs::job(kind, backend, &name, 2)).await;
                expected += 1;
                wait_pg(&client, &ns, backend, &name, "created", |_| true).await;
            }
        }
    }
    // Jobs that leave Events behind: invalid, missing a pod link, and one in a dry-run namespace.
    let dry = support::test_namespace(
        &client,
        "restart-dry",
        &[("podgroup-sync.io/enabled", "dry-run")],
    )
    .await;
    let mut invalid = jobs::job(Kind::TFJob, Backend::Volcano, "invalid", 1);
    invalid["spec"]["runPolicy"] = serde_json::json!({"schedulingPolicy": {"minAvailable": 9}});
    jobs::create(&client, &ns, Kind::TFJob, &invalid).await;
    let mut unlinked = jobs::job(Kind::TFJob, Backend::SchedulerPlugins, "unlinked", 1);
    unlinked["spec"]["tfReplicaSpecs"]["Worker"]["template"]["metadata"] = serde_json::json!({});
    jobs::create(&client, &ns, Kind::TFJob, &unlinked).await;
    expected += 1;
    jobs::create(
        &client,
        &dry,
        Kind::PyTorchJob,
        &jobs::job(Kind::PyTorchJob, Backend::Volcano, "dry", 1),
    )
    .await;
    jobs::wait_event(&client, &ns, "invalid", "InvalidSpec").await;
    jobs::wait_event(&client, &ns, "unlinked", "MissingPodGroupLink").await;
    jobs::wait_event(&client, &dry, "dry", "WouldCreatePodGroup").await;
    wait_pg(
        &client,
        &ns,
        Backend::SchedulerPlugins,
        "unlinked",
        "created",
        |_| true,
    )
    .await;
    // Let the first instance settle (the PodGroup watch events of its own writes come back).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_rv = (
        resource_versions(&client, &ns, Backend::SchedulerPlugins).await,
        resource_versions(&client, &ns, Backend::Volcano).await,
    );
    assert_eq!(before_rv.0.len() + before_rv.1.len(), expected);
    assert_eq!(
        first.metric("podgroup_sync_podgroup_writes_total", &[("op", "create")]),
        expected as f64
    );
    first.stop();

    let before = cluster.pod_group_and_event_writes();
    let started = Instant::now();
    let second = controller::start(cluster, None, &[]);
    let ready_after = started.elapsed();
    // Every job has been looked at by the new instance.
    support::wait_for(
        "the restarted controller reconciled every job",
        jobs::WAIT,
        || async {
            (second.metric("podgroup_sync_reconcile_total", &[("result", "ok")]) >= expected as f64)
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = cluster.pod_group_and_event_writes();
    let after_rv = (
        resource_versions(&client, &ns, Backend::SchedulerPlugins).await,
        resource_versions(&client, &ns, Backend::Volcano).await,
    );
    eprintln!(
        "restart: ready after {:.2}s; {} jobs; apiserver PodGroup writes {} -> {}, Event writes {} -> {}",
        ready_after.as_secs_f64(),
        expected,
        before.0,
        after.0,
        before.1,
        after.1
    );
    assert_eq!(after_rv, before_rv, "a PodGroup changed on restart");
    assert_eq!(
        after.0, before.0,
        "the API server saw PodGroup writes after the restart"
    );
    assert_eq!(
        after.1, before.1,
        "the API server saw Event writes after the restart"
    );
    assert_eq!(
        second.metric("podgroup_sync_podgroup_writes_total", &[]),
        0.0
    );
}

fn start_candidate(cluster: &support::Cluster, ns: &str, identity: &str) -> Controller {
    let args = controller::leader_args(ns, identity);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    controller::start(cluster, None, &args)
}

#[tokio::test]
async fn only_the_leader_writes_and_a_standby_takes_over_after_kill_9() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let lease_ns = support::test_namespace(&client, "lease", &[]).await;
    let ns = support::test_namespace(&client, "ha", &[ENABLED]).await;
    let a = start_candidate(cluster, &lease_ns, "a");
    let b = start_candidate(cluster, &lease_ns, "b");
    support::wait_for("exactly one leader", jobs::WAIT, || {
        let leaders = a.metric("podgroup_sync_leader", &[]) + b.metric("podgroup_sync_leader", &[]);
        async move { (leaders == 1.0).then_some(()) }
    })
    .await;
    let (mut leader, standby) = if a.metric("podgroup_sync_leader", &[]) == 1.0 {
        (a, b)
    } else {
        (b, a)
    };

    for i in 0..4 {
        let name = format!("ha-{i}");
        jobs::create(
            &client,
            &ns,
            Kind::PyTorchJob,
            &jobs::job(Kind::PyTorchJob, Backend::SchedulerPlugins, &name, 1),
        )
        .await;
        wait_pg(
            &client,
            &ns,
            Backend::SchedulerPlugins,
            &name,
            "created by the leader",
            |_| true,
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader_writes = leader.metric("podgroup_sync_podgroup_writes_total", &[]);
    let standby_writes = standby.metric("podgroup_sync_podgroup_writes_total", &[]);
    eprintln!("HA: leader wrote {leader_writes}, standby wrote {standby_writes}");
    assert_eq!(leader_writes, 4.0);
    assert_eq!(standby_writes, 0.0, "a standby wrote");

    // kill -9 the leader: no release, the standby must wait for the Lease to expire.
    let killed = Instant::now();
    leader.child.kill().expect("kill -9");
    let _ = leader.child.wait();
    for i in 4..6 {
        let name = format!("ha-{i}");
        jobs::create(
            &client,
            &ns,
            Kind::PyTorchJob,
            &jobs::job(Kind::PyTorchJob, Backend::SchedulerPlugins, &name, 1),
        )
        .await;
    }
    support::wait_for("the standby to lead", jobs::WAIT, || {
        let l = standby.metric("podgroup_sync_leader", &[]);
        async move { (l == 1.0).then_some(()) }
    })
    .await;
    let takeover = killed.elapsed();
    for i in 4..6 {
        wait_pg(
            &client,
            &ns,
            Backend::SchedulerPlugins,
            &format!("ha-{i}"),
            "converged by the new leader",
            |_| true,
        )
        .await;
    }
    eprintln!(
        "HA: the standby led {:.2}s after kill -9 (lease duration 6s)",
        takeover.as_secs_f64()
    );
    assert_eq!(
        standby.metric("podgroup_sync_podgroup_writes_total", &[("op", "create")]),
        2.0
    );
}

#[tokio::test]
async fn sigterm_hands_the_lease_over_at_once() {
    let _serial = SERIAL.lock().await;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let lease_ns = support::test_namespace(&client, "handover", &[]).await;
    let mut first = start_candidate(cluster, &lease_ns, "first");
    support::wait_for("first leads", jobs::WAIT, || {
        let l = first.metric("podgroup_sync_leader", &[]);
        async move { (l == 1.0).then_some(()) }
    })
    .await;
    let second = start_candidate(cluster, &lease_ns, "second");
    assert_eq!(second.metric("podgroup_sync_leader", &[]), 0.0);
    let stopped = Instant::now();
    first.stop();
    support::wait_for("second leads", jobs::WAIT, || {
        let l = second.metric("podgroup_sync_leader", &[]);
        async move { (l == 1.0).then_some(()) }
    })
    .await;
    eprintln!(
        "handover after SIGTERM: {:.2}s (lease duration 6s)",
        stopped.elapsed().as_secs_f64()
    );
    let lease = cluster.kubectl_ok(&[
        "-n",
        &lease_ns,
        "get",
        "lease",
        "podgroup-sync",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert_eq!(lease, "second");
}
