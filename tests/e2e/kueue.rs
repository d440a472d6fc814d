//! Kueue's objects for the scenarios beside Kueue (SPEC §12): a ResourceFlavor and two
//! WorkloadPriorityClasses shared by every scenario, a ClusterQueue and a LocalQueue per
//! scenario, and the Workload Kueue made for a job. Kueue itself runs from `tests/e2e/start.sh`.

use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::harness::{GPU, Link, Scope, names_of, replicas, training_job};
use crate::support::jobs::{self, Backend, Kind};

/// The label that puts a job in a LocalQueue.
pub const QUEUE: &str = "kueue.x-k8s.io/queue-name";
/// The label that gives a job a WorkloadPriorityClass.
pub const PRIORITY: &str = "kueue.x-k8s.io/priority-class";
/// The LocalQueue of every scenario's namespace.
pub const LOCAL_QUEUE: &str = "lq";
/// WorkloadPriorityClasses: a `HIGH` job preempts a `LOW` one in the same ClusterQueue.
pub const LOW: &str = "e2e-low";
pub const HIGH: &str = "e2e-high";
const FLAVOR: &str = "e2e-flavor";
/// A RuntimeClass with a pod overhead (the handler is never run: kwok runs the pods).
const OVERHEAD_CLASS: &str = "e2e-kueue-overhead";

pub fn ar(kind: &str, plural: &str) -> ApiResource {
    jobs::ar("kueue.x-k8s.io", "v1beta2", kind, plural)
}

/// Creates a cluster-scoped object unless it exists.
async fn ensure(client: &Client, ar: &ApiResource, manifest: Value) {
    let obj: DynamicObject = serde_json::from_value(manifest).expect("manifest");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    match api.create(&Default::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create {}: {e}", ar.kind),
    }
}

/// A ClusterQueue of this scope (`<namespace>`) with room for `gpus` GPUs (and plenty of CPU and
/// memory), preempting lower priorities within itself, held (admitting nothing) when `hold`; and
/// the namespace's LocalQueue pointing to it. Returns the ClusterQueue's name.
pub async fn queues(s: &Scope, gpus: u32, hold: bool) -> String {
    let c = &s.client;
    ensure(
        c,
        &ar("ResourceFlavor", "resourceflavors"),
        json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR}, "spec": {}}),
    )
    .await;
    for (name, value) in [(LOW, 10), (HIGH, 1000)] {
        ensure(
            c,
            &ar("WorkloadPriorityClass", "workloadpriorityclasses"),
            json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
            "metadata": {"name": name}, "value": value}),
        )
        .await;
    }
    let cq = s.ns.clone();
    let mut spec = gpu_quota(gpus);
    spec["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": s.ns}});
    spec["preemption"] = json!({"withinClusterQueue": "LowerPriority"});
    if hold {
        spec["stopPolicy"] = json!("Hold");
    }
    ensure(
        c,
        &ar("ClusterQueue", "clusterqueues"),
        json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": cq}, "spec": spec}),
    )
    .await;
    s.create_as(
        &ar("LocalQueue", "localqueues"),
        json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": s.ns},
        "spec": {"clusterQueue": cq}}),
    )
    .await;
    cq
}

/// Merges `patch` into ClusterQueue `cq`'s spec (e.g. releases a held one, changes its quota).
pub async fn patch_cluster_queue(client: &Client, cq: &str, patch: Value) {
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &ar("ClusterQueue", "clusterqueues"));
    api.patch(
        cq,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": patch})),
    )
    .await
    .unwrap_or_else(|e| panic!("patch ClusterQueue {cq}: {e}"));
}

/// The GPU quota of ClusterQueue `cq`, as a merge patch of its spec.
pub fn gpu_quota(gpus: u32) -> Value {
    json!({"resourceGroups": [{"coveredResources": ["cpu", "memory", GPU], "flavors": [{
        "name": FLAVOR, "resources": [
            {"name": "cpu", "nominalQuota": "100"},
            {"name": "memory", "nominalQuota": "100Gi"},
            {"name": GPU, "nominalQuota": gpus.to_string()}]}]}]})
}

pub async fn delete_cluster_queue(client: &Client, cq: &str) {
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &ar("ClusterQueue", "clusterqueues"));
    let _ = api.delete(cq, &DeleteParams::background()).await;
}

/// `metadata` with the queue label (and a priority class).
pub fn queued(mut metadata: Value, priority: Option<&str>) -> Value {
    metadata["labels"][QUEUE] = json!(LOCAL_QUEUE);
    if let Some(p) = priority {
        metadata["labels"][PRIORITY] = json!(p);
    }
    metadata
}

/// The Workload Kueue made for the job with this UID, if any.
pub async fn workload_of(client: &Client, ns: &str, job_uid: &str) -> Option<DynamicObject> {
    let api = jobs::api(client, ns, &ar("Workload", "workloads"));
    let list = api.list(&ListParams::default()).await.ok()?;
    list.items.into_iter().find(|w| {
        w.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == job_uid && o.controller == Some(true))
    })
}

/// Whether a Workload's condition `type_` is True.
pub fn condition(w: &DynamicObject, type_: &str) -> bool {
    w.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == type_ && c["status"] == "True")
        })
}

/// Waits for the Workload of the job with this UID to satisfy `check`.
pub async fn wait_workload(
    s: &Scope,
    job_uid: &str,
    what: &str,
    check: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    let what = format!("the Workload of job {job_uid}: {what}");
    s.env
        .wait(&s.ns, &what, crate::harness::SLOW, || async {
            workload_of(&s.client, &s.ns, job_uid)
                .await
                .filter(|w| check(w))
        })
        .await
}

/// Every pod of this scope's namespace that is not terminating is linked to a PodGroup that
/// exists (SPEC §12: nothing linked to a missing PodGroup).
pub async fn assert_no_pod_linked_to_a_missing_pod_group(s: &Scope, backend: Backend, when: &str) {
    let ar = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
    let pods = jobs::api(&s.client, &s.ns, &ar)
        .list(&Default::default())
        .await
        .expect("list pods");
    for p in pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let job = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::harness::JOB_LABEL));
        let Some(job) = job else { continue };
        for link in crate::harness::pod_links(s, &s.ns, job, backend).await {
            let Some(name) = link.link else { continue };
            assert!(
                jobs::get_pg(&s.client, &s.ns, backend, &name)
                    .await
                    .is_some(),
                "{when}: pod {} is linked to PodGroup {name}, which does not exist\n{}",
                link.pod,
                s.diagnostics()
            );
        }
    }
}

/// Every pod of `job` is linked to its PodGroup `job`, created no later than the first pod.
pub async fn assert_pod_group_first_and_every_pod_linked(s: &Scope, backend: Backend, job: &str) {
    let pg = jobs::get_pg(&s.client, &s.ns, backend, job)
        .await
        .unwrap_or_else(|| panic!("PodGroup {job}\n{}", s.diagnostics()));
    let pods = s.pods(&s.ns, job).await;
    let first = pods
        .iter()
        .filter_map(|p| p.metadata.creation_timestamp.clone())
        .min()
        .expect("the job's pods");
    let created = pg.metadata.creation_timestamp.clone().expect("created");
    assert!(
        created <= first,
        "PodGroup {job} created at {:?}, after its first pod ({:?})",
        created.0,
        first.0
    );
    let links = crate::harness::pod_links(s, &s.ns, job, backend).await;
    assert!(
        !links.is_empty() && links.iter().all(|l| l.link.as_deref() == Some(job)),
        "every pod of {job} linked to its PodGroup: {links:?}"
    );
}

/// Waits until job `job` has no pod left (not even a terminating one).
pub async fn wait_pods_gone(s: &Scope, job: &str, what: &str) {
    let what = format!("the pods of {job} gone: {what}");
    s.env
        .wait(&s.ns, &what, crate::harness::SLOW, || async {
            s.pods(&s.ns, job).await.is_empty().then_some(())
        })
        .await
}

pub fn suspended(job: &DynamicObject, kind: Kind) -> bool {
    let at = match kind {
        Kind::PyTorchJob => "/spec/runPolicy/suspend",
        _ => "/spec/suspend",
    };
    job.data.pointer(at) == Some(&json!(true))
}

/// SPEC §12 with the real Kueue: a PyTorchJob of 4 (1 GPU a pod) queued in a held
/// ClusterQueue is suspended by Kueue and has no PodGroup; admitted, its PodGroup exists before
/// its first pod and every pod is linked; a higher-priority job makes Kueue preempt it: its
/// PodGroup goes, no pod is linked to a missing PodGroup, the other runs whole; that one deleted,
/// Kueue admits it again and it gets one PodGroup of its size. Last, a LimitRange Kueue did not
/// count when it admitted the job is reported with KueueQuotaDiffers.
/// `min` reads a PodGroup's minimum (its field differs per backend).
pub async fn admission_preemption_readmission(
    mut s: Scope,
    backend: Backend,
    min: impl Fn(&DynamicObject) -> Value,
) {
    for _ in 0..4 {
        s.add_node(1).await;
    }
    let ns = s.ns.clone();
    let cq = queues(&s, 4, true).await;
    // Pods with a RuntimeClass overhead: Kueue and podgroup-sync must count it alike.
    ensure(
        &s.client,
        &kube::api::ApiResource::erase::<k8s_openapi::api::node::v1::RuntimeClass>(&()),
        json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": OVERHEAD_CLASS}, "handler": "runc",
        "overhead": {"podFixed": {"cpu": "250m", "memory": "64Mi"}}}),
    )
    .await;
    let gang = |name: &str, priority| {
        let mut m = training_job(
            Kind::PyTorchJob,
            Link::Gang(backend),
            name,
            s.pool(),
            &[replicas("Master", 1, 1), replicas("Worker", 3, 1)],
            json!({}),
        );
        for t in ["Master", "Worker"] {
            m["spec"]["pytorchReplicaSpecs"][t]["template"]["spec"]["runtimeClassName"] =
                json!(OVERHEAD_CLASS);
        }
        m["metadata"] = queued(m["metadata"].clone(), Some(priority));
        m
    };
    let low = format!("low-{}", s.id);
    let created = s.create(&ns, Kind::PyTorchJob, &gang(&low, LOW)).await;
    assert!(
        suspended(&created, Kind::PyTorchJob),
        "Kueue's webhook suspends a queued job: {:?}",
        created.data
    );
    let uid = created.metadata.uid.clone().expect("uid");
    wait_workload(&s, &uid, "pending in the held ClusterQueue", |w| {
        !condition(w, "QuotaReserved")
    })
    .await;
    for _ in 0..4 {
        assert!(
            jobs::get_pg(&s.client, &ns, backend, &low).await.is_none(),
            "a job Kueue has not admitted has no PodGroup\n{}",
            s.diagnostics()
        );
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    patch_cluster_queue(&s.client, &cq, json!({"stopPolicy": "None"})).await;
    let running = s.wait_all_running(&ns, &low, 4).await;
    assert_pod_group_first_and_every_pod_linked(&s, backend, &low).await;
    eprintln!(
        "[{ns}] admitted by Kueue, runs whole: {:?}",
        names_of(&running)
    );

    let high = format!("high-{}", s.id);
    s.create(&ns, Kind::PyTorchJob, &gang(&high, HIGH)).await;
    s.wait_pg_gone(&ns, backend, &low, "preempted by Kueue")
        .await;
    assert_no_pod_linked_to_a_missing_pod_group(&s, backend, "after the preemption").await;
    wait_pods_gone(&s, &low, "preempted").await;
    let running = s.wait_all_running(&ns, &high, 4).await;
    assert_pod_group_first_and_every_pod_linked(&s, backend, &high).await;
    assert_no_pod_linked_to_a_missing_pod_group(&s, backend, "the preemptor running").await;
    let evicted = workload_of(&s.client, &ns, &uid)
        .await
        .expect("the preempted job's Workload");
    assert!(
        !condition(&evicted, "Admitted"),
        "Kueue preempted the low-priority job"
    );
    eprintln!(
        "[{ns}] preempted by {high}, which runs whole: {:?}",
        names_of(&running)
    );

    jobs::api(&s.client, &ns, &Kind::PyTorchJob.ar())
        .delete(&high, &DeleteParams::background())
        .await
        .expect("delete the preemptor");
    let pg = s
        .wait_pg(&ns, backend, &low, "re-admitted: a gang of 4", |pg| {
            min(pg) == 4
        })
        .await;
    if backend != Backend::Kubernetes {
        assert_eq!(jobs::spec(&pg)["minResources"][GPU], "4");
    }
    s.wait_all_running(&ns, &low, 4).await;
    assert_pod_group_first_and_every_pod_linked(&s, backend, &low).await;
    assert_no_pod_linked_to_a_missing_pod_group(&s, backend, "re-admitted").await;

    // Kueue's admitted requests and the gang's agree (overhead included): no KueueQuotaDiffers,
    // and minResources counts 4 × (500m + 250m overhead) CPUs.
    if backend != Backend::Kubernetes {
        assert_eq!(
            jobs::spec(&pg)["minResources"]["cpu"],
            "3",
            "the overhead counted"
        );
    }
    let w = workload_of(&s.client, &ns, &uid)
        .await
        .expect("the Workload");
    let cpu: Vec<&Value> = w
        .data
        .pointer("/status/admission/podSetAssignments")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.pointer("/resourceUsage/cpu"))
        .collect();
    eprintln!("[{ns}] Kueue admitted cpu {cpu:?} for the pod sets; podgroup-sync counts 3");
    assert!(
        jobs::events(&s.client, &ns, &low, "KueueQuotaDiffers")
            .await
            .is_empty(),
        "Kueue's admission and the gang's requests agree\n{}",
        s.diagnostics()
    );

    // A LimitRange Kueue did not see when it admitted the job: the pods' requests and Kueue's
    // quota now differ, and the job is told by how much.
    let lr: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
        "spec": {"limits": [{"type": "Container",
            "defaultRequest": {"ephemeral-storage": "1Gi"}, "default": {"ephemeral-storage": "1Gi"}}]}}))
    .unwrap();
    let lr_ar = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::LimitRange>(&());
    jobs::api(&s.client, &ns, &lr_ar)
        .create(&Default::default(), &lr)
        .await
        .expect("create LimitRange");
    let note = s.wait_event(&ns, &low, "KueueQuotaDiffers").await;
    assert!(
        note.contains("ephemeral-storage: the pods request 4Gi, Kueue admitted 0"),
        "{note}"
    );
    eprintln!("[{ns}] KueueQuotaDiffers: {note}");
    delete_cluster_queue(&s.client, &cq).await;
    s.cleanup().await;
}
