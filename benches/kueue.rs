//! Kueue soak (SPEC §12): jobs through one ClusterQueue of the real Kueue with room for a tenth
//! of them, a share of them at a higher priority that makes Kueue preempt, for a fixed time —
//! and what podgroup-sync's PodGroups did meanwhile.
//!
//! ```sh
//! cargo bench --bench kueue -- [--jobs 1000] [--seconds 600] [--room 100] [--out DIR]
//! ```
//! The end-to-end tier's components (`tests/e2e/start.sh`: kwok, scheduler-plugins,
//! training-operator, Kueue v0.17.0 with waitForPodsReady 40 s) and podgroup-sync with the
//! pod-link webhook run the jobs: zero-touch PyTorchJobs of a master and a worker (1 GPU each) in
//! a namespace whose ClusterQueue holds `--room` of them, on kwok nodes with exactly that many
//! GPUs. Jobs arrive at a steady rate over the first 70 % of the run; each runs for 20–60 s (the
//! bench then marks its master to exit 0: the job succeeds and training-operator deletes its
//! pods); a tenth are of the higher WorkloadPriorityClass.
//!
//! Checked throughout (a violation fails the run; timing never does):
//! - every pod is created after a PodGroup of its link exists, and before that PodGroup is
//!   deleted (etcd revisions of the watch events: a pod's creation against its PodGroup's);
//! - at every sample (every 2 s: jobs, then pods, then PodGroups listed), no PodGroup (the same
//!   UID) of a suspended or finished job at two samples running ("left"), and no live pod (the
//!   same UID) of an active job linked to a PodGroup that does not exist at two samples running.
//!   One sample alone is not a fault: the lists are a moment apart, and Kueue may admit and
//!   preempt a job within a second.
//!
//! Reported: admissions, preemptions, completions, the lag from a job's admission (its unsuspend
//! seen by a watch) to its PodGroup (seen by a watch) p50/p99/max, PodGroup creates per admission,
//! updates, and deletes per suspension or finish (`podgroup_sync_podgroup_writes_total`), the
//! controller's CPU and peak RSS. Run by
//! `cargo test --all-targets` (no `--bench`) it prints one line and exits.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "../tests/e2e/harness.rs"]
#[allow(dead_code)]
mod harness;

#[path = "../tests/e2e/kueue.rs"]
#[allow(dead_code)]
mod kueue;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::{Value, json};
use support::controller::{cpu_seconds, proc_status};
use support::jobs::{self, Backend, Kind};

#[derive(Parser, Debug)]
struct Cli {
    /// Jobs submitted over the run.
    #[arg(long, default_value_t = 1000)]
    jobs: usize,
    /// Length of the run, in seconds.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Jobs the ClusterQueue (and the nodes) have room for at once.
    #[arg(long, default_value_t = 100)]
    room: usize,
    /// Where RESULTS.md goes.
    #[arg(long, default_value = "target/bench/kueue")]
    out: PathBuf,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

const B: Backend = Backend::SchedulerPlugins;
const LINK: &str = "scheduling.x-k8s.io/pod-group";

/// A small deterministic generator (xorshift64*), so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One PodGroup's life as the watch saw it (etcd revisions).
#[derive(Debug, Clone)]
struct PgLife {
    name: String,
    created: u64,
    deleted: Option<u64>,
}

/// What the watches recorded.
#[derive(Default)]
struct Seen {
    /// PodGroup uid → life.
    pgs: HashMap<String, PgLife>,
    /// PodGroup name → when it (a new one) was first seen.
    pg_added_at: HashMap<String, Vec<Instant>>,
    /// Pod uid → (name, creation revision, link).
    pods: HashMap<String, (String, u64, Option<String>)>,
    /// Job name → whether it was suspended at its last event.
    suspended: HashMap<String, bool>,
    /// Job name → the instants it was unsuspended (admitted).
    admitted_at: HashMap<String, Vec<Instant>>,
    admissions: usize,
    preemptions: usize,
    /// Job name → when both its pods were first Running in its current admission.
    running_since: HashMap<String, Instant>,
    finished: HashSet<String>,
}

fn rv(o: &DynamicObject) -> u64 {
    o.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Watches `ar` in `ns` and hands every applied or deleted object to `f` with its event kind.
fn spawn_watch(
    client: &Client,
    ns: &str,
    ar: &kube::api::ApiResource,
    f: impl Fn(&DynamicObject, bool) + Send + 'static,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Apply(o) | Event::InitApply(o)) => f(&o, false),
                Ok(Event::Delete(o)) => f(&o, true),
                _ => {}
            }
        }
    });
}

fn watcher(
    api: Api<DynamicObject>,
    config: watcher::Config,
) -> impl futures::Stream<Item = Result<Event<DynamicObject>, watcher::Error>> {
    kube::runtime::watcher(api, config)
}

fn job_suspended(j: &DynamicObject) -> bool {
    j.data.pointer("/spec/runPolicy/suspend") == Some(&json!(true))
}

fn job_finished(j: &DynamicObject) -> bool {
    j.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                (c["type"] == "Succeeded" || c["type"] == "Failed") && c["status"] == "True"
            })
        })
}

fn start_watches(client: &Client, ns: &str, seen: &Arc<Mutex<Seen>>) {
    let s = seen.clone();
    spawn_watch(client, ns, &B.ar(), move |pg, deleted| {
        let uid = pg.metadata.uid.clone().unwrap_or_default();
        let name = pg.metadata.name.clone().unwrap_or_default();
        let mut s = s.lock().unwrap();
        if deleted {
            if let Some(l) = s.pgs.get_mut(&uid) {
                l.deleted = Some(rv(pg));
            }
        } else if let std::collections::hash_map::Entry::Vacant(e) = s.pgs.entry(uid) {
            e.insert(PgLife {
                name: name.clone(),
                created: rv(pg),
                deleted: None,
            });
            s.pg_added_at.entry(name).or_default().push(Instant::now());
        }
    });
    let s = seen.clone();
    spawn_watch(client, ns, &Kind::PyTorchJob.ar(), move |j, deleted| {
        if deleted {
            return;
        }
        let name = j.metadata.name.clone().unwrap_or_default();
        let now_suspended = job_suspended(j);
        let mut s = s.lock().unwrap();
        if job_finished(j) {
            s.finished.insert(name.clone());
        }
        let before = s.suspended.insert(name.clone(), now_suspended);
        match (before, now_suspended) {
            (Some(true), false) | (None, false) => {
                s.admissions += 1;
                s.admitted_at.entry(name).or_default().push(Instant::now());
            }
            (Some(false), true) => {
                s.preemptions += 1;
                s.running_since.remove(&name);
            }
            _ => {}
        }
    });
    let s = seen.clone();
    let pod_ar = kube::api::ApiResource::erase::<Pod>(&());
    spawn_watch(client, ns, &pod_ar, move |p, deleted| {
        if deleted {
            return;
        }
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let mut s = s.lock().unwrap();
        s.pods.entry(uid).or_insert_with(|| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                rv(p),
                labels.get(LINK).cloned(),
            )
        });
    });
}

/// The checks of one sample: PodGroups left for suspended or finished jobs, and live pods of
/// active jobs linked to a missing PodGroup (each: the set of offenders, to compare with the
/// sample before).
async fn sample(client: &Client, ns: &str) -> (HashSet<String>, HashSet<String>) {
    let jobs_api = jobs::api(client, ns, &Kind::PyTorchJob.ar());
    let pg_api = jobs::api(client, ns, &B.ar());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default();
    // One after another, in the order that keeps the lists' own lag from looking like a fault:
    // a job seen inactive lost its PodGroup before the later PodGroup list, unless it is left;
    // a pod seen has its PodGroup in the later list, unless that was deleted in between.
    let (Ok(js), Ok(pods), Ok(pgs)) = (
        jobs_api.list(&lp).await,
        pods.list(&lp).await,
        pg_api.list(&lp).await,
    ) else {
        return Default::default();
    };
    let inactive: HashSet<String> = js
        .items
        .iter()
        .filter(|j| job_suspended(j) || job_finished(j))
        .filter_map(|j| j.metadata.name.clone())
        .collect();
    let pg_names: HashSet<String> = pgs
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    // By UID: a PodGroup deleted and created again between two samples is not one left behind.
    let left: HashSet<String> = pgs
        .items
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_ref()
                .is_some_and(|n| inactive.contains(n))
        })
        .map(|p| name_uid(&p.metadata))
        .collect();
    let job_of = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(harness::JOB_LABEL))
            .cloned()
    };
    let dangling = pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| job_of(p).is_some_and(|j| !inactive.contains(&j)))
        .filter(|p| {
            let link = p.metadata.labels.as_ref().and_then(|l| l.get(LINK));
            link.is_some_and(|l| !pg_names.contains(l))
        })
        .map(|p| name_uid(&p.metadata))
        .collect();
    (left, dangling)
}

/// podgroup-sync's PodGroup writes so far: creates, updates, deletes.
fn writes_by_op(c: &support::controller::Controller) -> [f64; 3] {
    let m = c.metrics();
    ["create", "update", "delete"].map(|op| {
        support::controller::metric_sum(&m, "podgroup_sync_podgroup_writes_total", &[("op", op)])
    })
}

/// `name/uid`: one object, not one name.
fn name_uid(m: &kube::api::ObjectMeta) -> String {
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    format!("{}/{}", text(&m.name), text(&m.uid))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Marks the master of every job that has run its time to exit 0.
async fn finish_due(
    client: &Client,
    ns: &str,
    seen: &Arc<Mutex<Seen>>,
    durations: &HashMap<String, Duration>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let running = pods
        .list(&ListParams::default().fields("status.phase=Running"))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut per_job: BTreeMap<String, usize> = BTreeMap::new();
    for p in &running {
        if let Some(j) = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(harness::JOB_LABEL))
        {
            *per_job.entry(j.clone()).or_default() += 1;
        }
    }
    let now = Instant::now();
    let mut due = Vec::new();
    {
        let mut s = seen.lock().unwrap();
        for (job, n) in &per_job {
            if *n < 2 || s.finished.contains(job) {
                continue;
            }
            let since = *s.running_since.entry(job.clone()).or_insert(now);
            if durations.get(job).is_some_and(|d| now >= since + *d) {
                due.push(job.clone());
            }
        }
    }
    let patch = json!({"metadata": {"labels": {harness::SUCCEED_LABEL: "true"}}});
    for job in due {
        let _ = pods
            .patch(
                &format!("{job}-master-0"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await;
    }
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if !cli.bench {
        println!("kueue soak: run with `cargo bench --bench kueue` (or `make bench-kueue`)");
        return;
    }
    std::fs::create_dir_all(&cli.out).expect("out dir");
    let mut s = harness::Scope::new("bench-kueue", true).await;
    let ns = s.ns.clone();
    let gpus = cli.room * 2;
    for _ in 0..gpus.div_ceil(8) {
        s.add_node(8).await;
    }
    let cq = kueue::queues(&s, gpus as u32, false).await;
    let client = s.client.clone();
    let seen = Arc::new(Mutex::new(Seen::default()));
    start_watches(&client, &ns, &seen);
    let (pid, writes_before, cpu_before) = {
        let c = s.env.controller.lock().unwrap();
        let pid = c.child.id();
        (pid, writes_by_op(&c), cpu_seconds(pid))
    };

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut durations = HashMap::new();
    let t0 = Instant::now();
    let run = Duration::from_secs(cli.seconds);
    let submit_over = run.mul_f64(0.7);
    let mut submitted = 0usize;
    let mut high = 0usize;
    let mut prev: (HashSet<String>, HashSet<String>) = Default::default();
    let (mut left, mut left_transient, mut dangling, mut dangling_transient, mut samples) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    let mut next_sample = t0;
    while t0.elapsed() < run {
        let due = (cli.jobs as f64 * t0.elapsed().as_secs_f64() / submit_over.as_secs_f64()).ceil()
            as usize;
        while submitted < due.min(cli.jobs) {
            let name = format!("j{submitted:04}");
            let is_high = rng.below(10) == 0;
            high += is_high as usize;
            let mut m = harness::training_job(
                Kind::PyTorchJob,
                harness::Link::Gang(B),
                &name,
                s.pool(),
                &[
                    harness::replicas("Master", 1, 1),
                    harness::replicas("Worker", 1, 1),
                ],
                json!({"runPolicy": {"cleanPodPolicy": "All"}}),
            );
            let priority = if is_high { kueue::HIGH } else { kueue::LOW };
            m["metadata"] = kueue::queued(m["metadata"].clone(), Some(priority));
            durations.insert(name.clone(), Duration::from_secs(20 + rng.below(41)));
            let obj: DynamicObject = serde_json::from_value(m).unwrap();
            if let Err(e) = jobs::api(&client, &ns, &Kind::PyTorchJob.ar())
                .create(&Default::default(), &obj)
                .await
            {
                eprintln!("create {name}: {e}");
            }
            submitted += 1;
        }
        finish_due(&client, &ns, &seen, &durations).await;
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(2);
            let now = sample(&client, &ns).await;
            samples += 1;
            left += now.0.intersection(&prev.0).count();
            left_transient += now.0.difference(&prev.0).count();
            dangling += now.1.intersection(&prev.1).count();
            dangling_transient += now.1.difference(&prev.1).count();
            if !now.0.is_empty() || !now.1.is_empty() {
                eprintln!(
                    "[{:>4}s] left {:?} dangling {:?}",
                    t0.elapsed().as_secs(),
                    now.0,
                    now.1
                );
            }
            prev = now;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (writes, cpu, rss_peak) = {
        let c = s.env.controller.lock().unwrap();
        let (_, peak) = proc_status(pid);
        (
            {
                let after = writes_by_op(&c);
                [0, 1, 2].map(|i| after[i] - writes_before[i])
            },
            cpu_seconds(pid) - cpu_before,
            peak,
        )
    };
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    // Every pod created while a PodGroup of its link existed (etcd revisions).
    let mut lives: HashMap<&str, Vec<&PgLife>> = HashMap::new();
    for l in seen.pgs.values() {
        lives.entry(l.name.as_str()).or_default().push(l);
    }
    let mut before_pg = Vec::new();
    let mut linked = 0usize;
    for (pod, created, link) in seen.pods.values() {
        let Some(link) = link else { continue };
        linked += 1;
        let ok = lives.get(link.as_str()).is_some_and(|ls| {
            ls.iter()
                .any(|l| l.created < *created && l.deleted.is_none_or(|d| d > *created))
        });
        if !ok {
            before_pg.push(pod.clone());
        }
    }
    let unlinked = seen.pods.values().filter(|(_, _, l)| l.is_none()).count();
    // Lag: each admission to the first PodGroup of that job seen after it.
    let mut lags: Vec<f64> = Vec::new();
    for (job, admitted) in &seen.admitted_at {
        let added = seen.pg_added_at.get(job).cloned().unwrap_or_default();
        for a in admitted {
            if let Some(p) = added.iter().filter(|p| *p >= a).min() {
                lags.push(p.duration_since(*a).as_secs_f64() * 1000.0);
            }
        }
    }
    lags.sort_by(f64::total_cmp);
    let mut r = String::new();
    let _ = writeln!(r, "# Kueue soak\n");
    let _ = writeln!(
        r,
        "{} PyTorchJobs (master + worker, 1 GPU each; {high} of the higher priority) through one ClusterQueue with room for {} at once, over {} s; samples every 2 s: {samples}.\n",
        cli.jobs, cli.room, cli.seconds
    );
    let _ = writeln!(r, "| figure | value |\n|---|---|");
    let rows = [
        ("jobs submitted", submitted.to_string()),
        ("admissions (unsuspends seen)", seen.admissions.to_string()),
        (
            "preemptions (suspends of a running job seen)",
            seen.preemptions.to_string(),
        ),
        ("jobs finished", seen.finished.len().to_string()),
        ("PodGroups created", seen.pgs.len().to_string()),
        (
            "pods created (linked / not linked)",
            format!("{linked} / {unlinked}"),
        ),
        (
            "**pods created before their PodGroup, or after it was deleted**",
            before_pg.len().to_string(),
        ),
        (
            "**PodGroups left for suspended or finished jobs (at two samples running)**",
            left.to_string(),
        ),
        (
            "PodGroups of jobs suspended or finished since the sample before",
            left_transient.to_string(),
        ),
        (
            "**live pods of active jobs linked to a missing PodGroup (two samples running)**",
            dangling.to_string(),
        ),
        ("the same, at one sample", dangling_transient.to_string()),
        (
            "lag admission → PodGroup p50 / p99 / max (ms)",
            format!(
                "{:.0} / {:.0} / {:.0} ({} admissions)",
                percentile(&lags, 0.5),
                percentile(&lags, 0.99),
                lags.last().copied().unwrap_or(f64::NAN),
                lags.len()
            ),
        ),
        (
            "PodGroup creates per admission; updates; deletes per suspension or finish",
            format!(
                "{:.2} ({} creates); {}; {:.2} ({} deletes)",
                writes[0] / seen.admissions.max(1) as f64,
                writes[0],
                writes[1],
                writes[2] / (seen.preemptions + seen.finished.len()).max(1) as f64,
                writes[2]
            ),
        ),
        (
            "controller CPU (s) / peak RSS (MiB)",
            format!("{cpu:.1} / {rss_peak:.0}"),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(r, "| {k} | {v} |");
    }
    print!("{r}");
    std::fs::write(cli.out.join("RESULTS.md"), &r).expect("write RESULTS.md");
    kueue::delete_cluster_queue(&client, &cq).await;
    s.cleanup().await;
    let failed = !before_pg.is_empty() || left > 0 || dangling > 0;
    if failed {
        eprintln!("kueue soak: invariants violated; pods before their PodGroup: {before_pg:?}");
        std::process::exit(1);
    }
}
