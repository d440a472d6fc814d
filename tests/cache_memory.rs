//! The memory a cached job costs (issue 29: ≤ 4 KiB per job at 50,000 jobs).
//!
//! Heap bytes counted by a global allocator while 10,000 PyTorchJobs and their PodGroups — as
//! the API server sends them to the watches, through the same reading, stripping and packing —
//! go into kube-runtime stores keyed as the controller keys them, and the PodGroups into the
//! owner index. Each allocation is counted as glibc's malloc lays it out (an 8-byte header,
//! rounded up to 16 bytes, 32 at least), so the figure follows the resident memory the scale
//! benchmark measures (`bench/results/`), without its noise. The test holds a bound that the
//! caches before issue 29's last changes did not meet (about 5 KiB per job: each cache key with
//! an `ApiResource` of its own, labels in a B-tree node), and prints the figures. One test in
//! this binary: the count is process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use podgroup_sync::backend::{BackendKind, PodGroupBackend, SchedulerPlugins, own_labels};
use podgroup_sync::lean::{LeanJob, LeanPodGroup};
use podgroup_sync::owned::OwnedIndex;
use podgroup_sync::packed::{self, Labelled, Packed};
use serde_json::{Value, json};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicIsize = AtomicIsize::new(0);

/// glibc's chunk for a request of `n` bytes.
fn chunk(n: usize) -> isize {
    ((n + 8).div_ceil(16) * 16).max(32) as isize
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(chunk(l.size()), Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(chunk(l.size()), Ordering::Relaxed);
        ALLOCATIONS.fetch_sub(1, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const JOBS: usize = 10_000;
/// Bytes of heap per job: its cached job, its cached PodGroup and its owner-index entry.
const BOUND: f64 = 4_096.0;

fn uid(prefix: &str, i: usize) -> String {
    format!("{prefix}0c3a1e-1b2c-4d5e-8f90-{i:012}")
}

/// The scale benchmark's job (Master 1 + Worker 3) as the watch receives it.
fn job(i: usize) -> String {
    let name = format!("job-{i:05}");
    let template = |requests: Value, limits: Value| {
        json!({"metadata": {"labels": {"scheduling.x-k8s.io/pod-group": name}},
               "spec": {"restartPolicy": "Never", "containers": [{
                   "name": "pytorch", "image": "busybox",
                   "ports": [{"name": "pytorchjob-port", "containerPort": 23456}],
                   "resources": {"requests": requests, "limits": limits}}]}})
    };
    json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": format!("ns-{:03}", i % 100), "uid": uid("6f", i),
            "resourceVersion": format!("{}", 100_000 + i), "generation": 1,
            "creationTimestamp": "2026-12-07T10:00:00Z",
            "managedFields": [{"manager": "scale", "operation": "Update",
                "apiVersion": "kubeflow.org/v1", "time": "2026-12-07T10:00:00Z",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}, "f:runPolicy": {}}}}]},
        "spec": {"runPolicy": {}, "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "Never",
                       "template": template(json!({"cpu": "1", "memory": "1Gi"}), json!({}))},
            "Worker": {"replicas": 3, "restartPolicy": "Never",
                       "template": template(json!({"cpu": "2"}), json!({"nvidia.com/gpu": 1}))}}}
    })
    .to_string()
}

/// Its PodGroup as podgroup-sync applies it and the scheduler-plugins controller updates it.
fn pod_group(i: usize) -> String {
    let name = format!("job-{i:05}");
    let ours = |fields: Value| {
        json!({"manager": "podgroup-sync", "operation": "Apply",
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "time": "2026-12-07T10:00:00Z",
            "fieldsType": "FieldsV1", "fieldsV1": fields})
    };
    json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
      "metadata": {"name": name, "namespace": format!("ns-{:03}", i % 100), "uid": uid("7f", i),
        "resourceVersion": format!("{}", 200_000 + i), "generation": 1,
        "creationTimestamp": "2026-12-07T10:00:00Z",
        "labels": own_labels(""),
        "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name,
           "uid": uid("6f", i), "controller": true, "blockOwnerDeletion": true}],
        "managedFields": [
          ours(json!({"f:metadata": {"f:labels": {"f:app.kubernetes.io/managed-by": {}},
            "f:ownerReferences": {format!("k:{{\"uid\":\"{}\"}}", uid("6f", i)): {}}},
            "f:spec": {"f:minMember": {}, "f:minResources": {"f:cpu": {}, "f:memory": {},
              "f:nvidia.com/gpu": {}}, "f:scheduleTimeoutSeconds": {}}})),
          {"manager": "controller", "operation": "Update", "subresource": "status",
           "apiVersion": "scheduling.x-k8s.io/v1alpha1", "time": "2026-12-07T10:00:01Z",
           "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:phase": {}}}}]},
      "spec": {"minMember": 4, "minResources": {"cpu": "7", "memory": "1Gi", "nvidia.com/gpu": "3"},
        "scheduleTimeoutSeconds": 60},
      "status": {"phase": "Pending"}})
    .to_string()
}

fn live() -> (isize, isize) {
    (
        LIVE.load(Ordering::Relaxed),
        ALLOCATIONS.load(Ordering::Relaxed),
    )
}

#[test]
fn a_cached_job_and_its_pod_group_cost_at_most_4_kib() {
    let kind = &podgroup_sync::job::PYTORCHJOB;
    let jobs: Vec<String> = (0..JOBS).map(job).collect();
    let pod_groups: Vec<String> = (0..JOBS).map(pod_group).collect();
    // The shared kinds exist before counting (the controller makes them once).
    let job_kind = packed::kind(&kind.api_resource());
    let pg_kind = packed::kind(&SchedulerPlugins.api_resource());

    let start = live();
    let mut job_store = Writer::<Packed>::new(job_kind.clone());
    for text in &jobs {
        let mut job: LeanJob = serde_json::from_str(text).unwrap();
        podgroup_sync::strip::job(kind, &mut job.0);
        job_store.apply_watcher_event(&Event::Apply(Packed::pack(job.0)));
    }
    let after_jobs = live();
    let mut pg_store = Writer::<Packed>::new(pg_kind.clone());
    let owned = OwnedIndex::default();
    for text in &pod_groups {
        // Stripped and packed as it is read.
        let pg: LeanPodGroup = serde_json::from_str(text).unwrap();
        let pg = pg.0;
        owned.observe(BackendKind::SchedulerPlugins, &pg, false);
        pg_store.apply_watcher_event(&Event::Apply(pg));
    }
    let after_pgs = live();

    let per = |a: (isize, isize), b: (isize, isize)| {
        (
            (b.0 - a.0) as f64 / JOBS as f64,
            (b.1 - a.1) as f64 / JOBS as f64,
        )
    };
    let (job_bytes, job_allocs) = per(start, after_jobs);
    let (pg_bytes, pg_allocs) = per(after_jobs, after_pgs);
    println!("figure: cached job {job_bytes:.0} B in {job_allocs:.1} allocations");
    println!(
        "figure: cached PodGroup with its owner-index entry {pg_bytes:.0} B in {pg_allocs:.1} allocations"
    );
    println!(
        "figure: per job {:.0} B ({:.2} KiB)",
        job_bytes + pg_bytes,
        (job_bytes + pg_bytes) / 1024.0
    );

    // What was cached is what a reconcile reads.
    let jobs_reader = job_store.as_reader();
    let pgs_reader = pg_store.as_reader();
    assert_eq!(jobs_reader.len(), JOBS);
    assert_eq!(pgs_reader.len(), JOBS);
    let key = |i: usize, k: &packed::Kind| {
        ObjectRef::<Packed>::new_with(&format!("job-{i:05}"), k.clone())
            .within(&format!("ns-{:03}", i % 100))
    };
    let pg = pgs_reader.get(&key(4321, &pg_kind)).unwrap();
    assert!(podgroup_sync::backend::made_by(pg.as_ref(), ""));
    assert_eq!(
        pg.label("app.kubernetes.io/managed-by"),
        Some("podgroup-sync")
    );
    let whole = pg.unpack();
    assert_eq!(whole.metadata.labels.unwrap().len(), 1);
    assert_eq!(whole.metadata.managed_fields.unwrap().len(), 1);
    assert_eq!(whole.data["spec"]["minMember"], 4);
    assert_eq!(
        owned.owned_by(&uid("6f", 4321)),
        vec![(
            BackendKind::SchedulerPlugins,
            "ns-021".to_string(),
            "job-04321".to_string()
        )]
    );
    let job = jobs_reader.get(&key(4321, &job_kind)).unwrap().unpack();
    assert_eq!(
        job.data["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"],
        3
    );

    assert!(
        job_bytes + pg_bytes <= BOUND,
        "a job costs {:.0} B of cache, more than {BOUND}",
        job_bytes + pg_bytes
    );
}
