//! LeaderWorkerSets for the control-plane tiers (SPEC §11): one PodGroup per group,
//! `<lws>-<group index>`, through creation, scaling, a rolling update's surge, a changed group
//! size, `startupPolicy: LeaderReady`, a PodGroup deleted by someone and the LWS deleted. No LWS
//! controller runs here: the test writes the status the controller would (`replicas`, the
//! `UpdateInProgress` condition).

use std::time::Duration;

use kube::Client;
use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

use super::jobs::{self, Backend};
use super::lifecycle::owner_ref_of;

pub fn ar() -> ApiResource {
    jobs::ar(
        "leaderworkerset.x-k8s.io",
        "v1",
        "LeaderWorkerSet",
        "leaderworkersets",
    )
}

fn template(backend: Backend, requests: Value, limits: Value) -> Value {
    let scheduler = match backend {
        Backend::Volcano => "volcano",
        _ => "default-scheduler",
    };
    json!({"spec": {"schedulerName": scheduler, "containers": [{"name": "main",
        "image": "busybox", "resources": {"requests": requests, "limits": limits}}]}})
}

/// A LeaderWorkerSet of `replicas` groups of `size` pods: a leader (1 cpu, 1Gi) and `size − 1`
/// workers (2 cpu, 1 GPU as a limit only), for `backend` by its annotation (a group's PodGroup
/// has no name a template could carry: the webhook links the pods).
pub fn lws(backend: Backend, name: &str, replicas: u32, size: u32) -> Value {
    json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "annotations": {"podgroup-sync.io/backend": backend.name()}},
        "spec": {"replicas": replicas, "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 1}},
            "leaderWorkerTemplate": {"size": size,
                "leaderTemplate": template(backend, json!({"cpu": "1", "memory": "1Gi"}), json!({})),
                "workerTemplate": template(backend, json!({"cpu": "2"}), json!({"nvidia.com/gpu": 1}))}}})
}

/// The spec of one group's PodGroup: the leader (when in the gang) and `size − 1` workers.
pub fn expected_group_spec(backend: Backend, size: u32, leader_in_gang: bool) -> Value {
    let workers = size - 1;
    let min = workers + u32::from(leader_in_gang);
    if backend == Backend::Kubernetes {
        return json!({"schedulingPolicy": {"gang": {"minCount": min}},
            "disruptionMode": {"single": {}}, "priority": 0});
    }
    let mut spec = if leader_in_gang {
        json!({"minMember": min, "minResources": {"cpu": (1 + 2 * workers).to_string(),
            "memory": "1Gi", "nvidia.com/gpu": workers.to_string()}})
    } else {
        json!({"minMember": min, "minResources": {"cpu": (2 * workers).to_string(),
            "nvidia.com/gpu": workers.to_string()}})
    };
    if backend == Backend::Volcano {
        spec["queue"] = json!("default");
    }
    spec
}

async fn patch(client: &Client, ns: &str, name: &str, patch: Value, status: bool) {
    let api = jobs::api(client, ns, &ar());
    let pp = kube::api::PatchParams::default();
    let p = kube::api::Patch::Merge(patch);
    let r = if status {
        api.patch_status(name, &pp, &p).await
    } else {
        api.patch(name, &pp, &p).await
    };
    r.unwrap_or_else(|e| panic!("patch LeaderWorkerSet {name}: {e}"));
}

/// The status the LWS controller writes: `replicas` groups created, an update in progress.
fn status(replicas: u32, updating: bool) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    json!({"status": {"replicas": replicas, "conditions": [{"type": "UpdateInProgress",
        "status": if updating { "True" } else { "False" }, "reason": "Test", "message": "test",
        "lastTransitionTime": now}]}})
}

/// Waits until exactly the groups `0..n` of LWS `name` have their PodGroup, each of `spec`.
async fn groups(
    client: &Client,
    ns: &str,
    b: Backend,
    name: &str,
    n: u32,
    spec: &Value,
    what: &str,
) {
    for i in 0..n {
        let pg = format!("{name}-{i}");
        jobs::wait_pg(client, ns, b, &pg, what, |pg| jobs::spec(pg) == *spec).await;
    }
    jobs::wait_pg_gone(client, ns, b, &format!("{name}-{n}"), what).await;
}

/// The whole lifecycle of one LeaderWorkerSet for `b` in namespace `ns`.
pub async fn through(client: &Client, ns: &str, b: Backend) {
    let name = "serve";
    let obj: DynamicObject = serde_json::from_value(lws(b, name, 3, 4)).unwrap();
    let lws = jobs::api(client, ns, &ar())
        .create(&PostParams::default(), &obj)
        .await
        .expect("create LeaderWorkerSet");
    let four = expected_group_spec(b, 4, true);
    groups(client, ns, b, name, 3, &four, "one PodGroup per group").await;
    for i in 0..3 {
        let pg = jobs::get_pg(client, ns, b, &format!("{name}-{i}"))
            .await
            .unwrap();
        assert_eq!(
            serde_json::to_value(&pg.metadata.owner_references).unwrap(),
            owner_ref_of(&lws),
            "group {i}'s PodGroup is owned by the LeaderWorkerSet"
        );
    }

    // Scaled down: the group being removed keeps its PodGroup while its leader is there.
    patch(client, ns, name, status(3, false), true).await;
    patch(client, ns, name, json!({"spec": {"replicas": 2}}), false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        jobs::get_pg(client, ns, b, &format!("{name}-2"))
            .await
            .is_some(),
        "a group whose leader is still there keeps its PodGroup"
    );
    patch(client, ns, name, status(2, false), true).await;
    groups(
        client,
        ns,
        b,
        name,
        2,
        &four,
        "the group gone, its PodGroup deleted",
    )
    .await;

    // A rolling update with maxSurge 1: the surge group has its PodGroup before its pods.
    patch(client, ns, name, status(2, true), true).await;
    groups(client, ns, b, name, 3, &four, "the surge group's PodGroup").await;
    patch(client, ns, name, status(2, false), true).await;
    groups(client, ns, b, name, 2, &four, "the surge over").await;

    // A new group size resizes every group; LeaderReady leaves the leader outside the gang.
    patch(
        client,
        ns,
        name,
        json!({"spec": {"leaderWorkerTemplate": {"size": 3}}}),
        false,
    )
    .await;
    let three = expected_group_spec(b, 3, true);
    groups(client, ns, b, name, 2, &three, "groups of 3").await;
    patch(
        client,
        ns,
        name,
        json!({"spec": {"startupPolicy": "LeaderReady"}}),
        false,
    )
    .await;
    let workers = expected_group_spec(b, 3, false);
    groups(
        client,
        ns,
        b,
        name,
        2,
        &workers,
        "LeaderReady: the workers are the gang",
    )
    .await;

    // A group's PodGroup deleted by someone is made again; the LWS deleted takes them all.
    let first = format!("{name}-0");
    let old = jobs::get_pg(client, ns, b, &first)
        .await
        .unwrap()
        .metadata
        .uid;
    jobs::delete(client, ns, &b.ar(), &first).await;
    jobs::wait_pg(client, ns, b, &first, "recreated", |pg| {
        pg.metadata.uid != old && jobs::spec(pg) == workers
    })
    .await;
    jobs::delete(client, ns, &ar(), name).await;
    for i in 0..2 {
        jobs::wait_pg_gone(
            client,
            ns,
            b,
            &format!("{name}-{i}"),
            "the garbage collector",
        )
        .await;
    }
}
