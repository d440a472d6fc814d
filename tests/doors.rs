//! Every door bounded (issue 25), on a real control plane, in the fault tier (`make faults`):
//!
//! - the webhook under a flood of maximum-size hostile AdmissionReviews from 32 concurrent
//!   callers for 30 s: peak RSS within idle + 64 MiB, the process alive, and the pods the real
//!   API server creates meanwhile still linked;
//! - the metrics and health port under 2,000 idle connections: every one closed after the idle
//!   timeout, `/metrics` answering throughout, the CPU idle, and the controller's own API work
//!   (a job's PodGroup) unaffected.
//!
//! - two installations on one control plane, each with its own annotation key and instance,
//!   each taking a job through the whole lifecycle at once: no write or delete by one of them
//!   touches the other's PodGroups (the API server's audit log);
//! - an upgrade over 100 PodGroups written by the default installation: the new build writes
//!   nothing (`PGS_PREVIOUS_BIN` runs the first phase with an earlier build).
//!
//! Each prints its figures. One at a time: `cargo test --test doors -- --test-threads=1`.

mod support;

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::controller::{self, Controller, cpu_seconds, proc_status};
use support::faults::{self, AuditedWrite};
use support::jobs::{self, Backend, Kind};
use support::lifecycle::Gang;
use support::webhook::{self as wh, link_of, operator_pod};

const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn work_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("doors-{name}-{}", std::process::id()))
}

/// Resets the process's peak RSS (VmHWM) to its current RSS.
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("clear_refs");
}

/// An AdmissionReview of `size` bytes whose object is hostile: `shape` 0 is a flat nest of
/// empty arrays (the shape that once took a whole JSON tree per byte), 1 a pod whose labels
/// are a map of ~3 MiB of tiny entries (a typed map of them would cost 8x its bytes).
fn hostile_review(size: usize, shape: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"hostile-{shape}","kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"CREATE","namespace":"default","object":"#
    );
    let mut body = head.into_bytes();
    let tail: &[u8] = if shape == 0 { b"[]]}}" } else { b"}}}}}" };
    if shape == 0 {
        body.push(b'[');
        let mut first = true;
        while body.len() + tail.len() + 3 < size {
            if !first {
                body.push(b',');
            }
            body.extend_from_slice(b"[]");
            first = false;
        }
        body.push(b',');
    } else {
        body.extend_from_slice(br#"{"metadata":{"labels":{"#);
        let mut i = 0u64;
        loop {
            let entry = format!(r#""l{i}":"","#);
            if body.len() + entry.len() + tail.len() + 8 >= size {
                break;
            }
            body.extend_from_slice(entry.as_bytes());
            i += 1;
        }
        body.extend_from_slice(br#""l":"""#);
    }
    body.extend_from_slice(tail);
    body
}

/// POSTs `file` to the webhook with curl; the HTTP status (0: no answer).
fn post(port: u16, ca: &Path, file: &Path) -> u16 {
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg("--cacert")
        .arg(ca)
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{}", file.display()))
        .arg(format!("https://127.0.0.1:{port}/pod-link"))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_stays_bounded_under_a_flood_of_maximum_size_hostile_reviews() {
    let _serial = SERIAL.lock().await;
    const CONFIG: &str = "pgs-doors-flood";
    const CALLERS: usize = 32;
    const FLOOD: Duration = Duration::from_secs(30);
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let dir = work_dir("flood");
    let certs = wh::certs(&dir, "doors-flood-ca");
    let port = controller::free_port();
    let args = wh::args(port, &certs);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut ctl = controller::start(cluster, None, &args);
    wh::register(&client, &wh::configuration(CONFIG, port, &certs.ca_pem)).await;
    let ns = wh::namespace(&client, CONFIG, &[ENABLED]).await;
    let manifest = wh::unlinked(jobs::job(
        Kind::PyTorchJob,
        Backend::SchedulerPlugins,
        "real",
        2,
    ));
    let job = jobs::create(&client, &ns, Kind::PyTorchJob, &manifest).await;
    // Warm: one real pod linked before the flood.
    let first = wh::create_pod(
        &client,
        &ns,
        &operator_pod(Kind::PyTorchJob, &job, "Worker", None),
    )
    .await;
    assert_eq!(
        link_of(&first, Backend::SchedulerPlugins).0.as_deref(),
        Some("real")
    );
    let pid = ctl.child.id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (idle_rss, _) = proc_status(pid);
    reset_peak(pid);

    let max = 3 * 1024 * 1024;
    let files: Vec<PathBuf> = (0..2)
        .map(|shape| {
            let f = dir.join(format!("hostile-{shape}.json"));
            let body = hostile_review(max, shape);
            assert!(body.len() <= max && body.len() > max - 64);
            serde_json::from_slice::<serde::de::IgnoredAny>(&body).expect("valid JSON");
            std::fs::write(&f, body).unwrap();
            f
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, answered) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut callers = Vec::new();
    for i in 0..CALLERS {
        let (file, ca) = (files[i % 2].clone(), certs.dir.join("ca.crt"));
        let (stop, sent, answered) = (stop.clone(), sent.clone(), answered.clone());
        callers.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                sent.fetch_add(1, Ordering::Relaxed);
                if post(port, &ca, &file) != 0 {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Real pods through the API server meanwhile, each must be linked.
    let start = Instant::now();
    let (mut pods, mut unlinked, mut slowest) = (0, Vec::new(), Duration::ZERO);
    while start.elapsed() < FLOOD {
        let t = Instant::now();
        let pod = wh::create_pod(
            &client,
            &ns,
            &operator_pod(Kind::PyTorchJob, &job, "Worker", None),
        )
        .await;
        slowest = slowest.max(t.elapsed());
        pods += 1;
        if link_of(&pod, Backend::SchedulerPlugins).0.as_deref() != Some("real") {
            unlinked.push(pod.metadata.name.clone().unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.join().unwrap();
    }
    let (rss, peak) = proc_status(pid);
    let overloaded = ctl.metric(
        "podgroup_sync_admissions_total",
        &[("result", "error"), ("reason", "overloaded")],
    );
    let malformed = ctl.metric(
        "podgroup_sync_admissions_total",
        &[("result", "error"), ("reason", "malformed_pod")],
    );
    eprintln!(
        "flood: {CALLERS} callers x {FLOOD:?} of {max}-byte reviews: {} sent, {} answered \
         ({malformed} read and refused as malformed pods, {overloaded} answered past the bound); \
         RSS idle {idle_rss:.1} MiB, peak {peak:.1} MiB (+{:.1}), after {rss:.1} MiB; \
         {pods} real pods created, {} unlinked, slowest create {slowest:?}",
        sent.load(Ordering::Relaxed),
        answered.load(Ordering::Relaxed),
        peak - idle_rss,
        unlinked.len()
    );
    assert!(
        ctl.child.try_wait().unwrap().is_none(),
        "the controller died: {}",
        ctl.log_tail()
    );
    assert!(
        peak <= idle_rss + 64.0,
        "peak RSS {peak:.1} MiB over idle {idle_rss:.1} + 64 MiB"
    );
    assert!(
        unlinked.is_empty(),
        "pods not linked during the flood: {unlinked:?}"
    );
    assert!(malformed > 0.0, "the flood was read");
    assert!(pods >= 20, "only {pods} real pods were created");
    ctl.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_port_closes_idle_connections_and_answers_throughout() {
    let _serial = SERIAL.lock().await;
    const IDLE: usize = 2_000;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "doors-idle", &[ENABLED]).await;
    let mut ctl = controller::start(cluster, None, &[]);
    let pid = ctl.child.id();
    let addr = ctl.addr;
    let opened = Instant::now();
    let conns: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    let cpu_before = cpu_seconds(pid);
    // The controller's own API work goes on: a job gets its PodGroup.
    let b = Backend::SchedulerPlugins;
    jobs::create(
        &client,
        &ns,
        Kind::PyTorchJob,
        &jobs::job(Kind::PyTorchJob, b, "during", 2),
    )
    .await;
    let created = Instant::now();
    jobs::wait_pg(
        &client,
        &ns,
        b,
        "during",
        "created during the idle flood",
        |_| true,
    )
    .await;
    let pg_after = created.elapsed();
    // /metrics answers throughout, until every idle connection is closed.
    let (mut scrapes, mut slowest) = (0, Duration::ZERO);
    let mut open: Vec<TcpStream> = conns;
    let deadline = opened + Duration::from_secs(60);
    while !open.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} idle connections still open after 60 s",
            open.len()
        );
        let t = Instant::now();
        let (code, body) = controller::http_get(addr, "/metrics").expect("/metrics answers");
        slowest = slowest.max(t.elapsed());
        assert_eq!(code, 200);
        assert!(body.contains("podgroup_sync_"));
        scrapes += 1;
        open.retain(|c| !closed_by_peer(c));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_closed = opened.elapsed();
    let cpu = cpu_seconds(pid) - cpu_before;
    eprintln!(
        "idle flood: {IDLE} idle connections all closed by the controller {all_closed:?} after \
         they opened; {scrapes} scrapes answered meanwhile (slowest {slowest:?}); controller CPU \
         {cpu:.2} s over that time; a job's PodGroup {pg_after:?} after its creation"
    );
    assert!(
        cpu < 0.2 * all_closed.as_secs_f64(),
        "CPU {cpu:.2} s over {all_closed:?}: not idle"
    );
    assert!(ctl.child.try_wait().unwrap().is_none());
    ctl.stop();
}

/// Whether the peer closed the connection (a read returns end of stream).
fn closed_by_peer(c: &TcpStream) -> bool {
    c.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 1];
    match (&*c).read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// A control plane of the test's own with the audit log on, stopped when dropped.
struct Audited(support::Cluster);

impl Audited {
    async fn start() -> Audited {
        let c = tokio::task::spawn_blocking(|| support::private_cluster_with(&[("AUDIT", "1")]))
            .await
            .expect("start control plane");
        Audited(c)
    }

    /// A kubeconfig of a ServiceAccount of its own (the audit log names it as the writer), and
    /// that user's name.
    async fn identity(&self, ns: &str, name: &str) -> (PathBuf, String) {
        let (c, n, sa) = (self.0.clone(), ns.to_string(), name.to_string());
        let kc =
            tokio::task::spawn_blocking(move || faults::service_account_kubeconfig(&c, &n, &sa))
                .await
                .unwrap();
        (kc, format!("system:serviceaccount:{ns}:{name}"))
    }

    /// The PodGroup writes the API server completed.
    fn writes(&self) -> Vec<AuditedWrite> {
        faults::audited_writes(&self.0)
            .into_iter()
            .filter(|w| (200..300).contains(&w.code))
            .collect()
    }
}

impl Drop for Audited {
    fn drop(&mut self) {
        support::stop_cluster(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_installations_never_touch_each_others_pod_groups() {
    let _serial = SERIAL.lock().await;
    let cp = Audited::start().await;
    let client = cp.0.client().await;
    let ids = support::test_namespace(&client, "installations", &[]).await;
    let ns_a = support::test_namespace(&client, "team-a", &[("a.example/enabled", "true")]).await;
    let ns_b = support::test_namespace(&client, "team-b", &[("b.example/enabled", "true")]).await;
    let (kc_a, user_a) = cp.identity(&ids, "team-a").await;
    let (kc_b, user_b) = cp.identity(&ids, "team-b").await;
    let start = |kc: &Path, key: &str, instance: &str| -> Controller {
        let args = ["--annotation-key", key, "--instance", instance];
        controller::start(&cp.0, Some(kc), &args)
    };
    let mut a = start(&kc_a, "a.example/enabled", "team-a");
    let mut b = start(&kc_b, "b.example/enabled", "team-b");
    let log_a = || a.log_tail();
    let log_b = || b.log_tail();
    let gang = |ns, name, log| Gang {
        client: &client,
        ns,
        kind: Kind::PyTorchJob,
        backend: Backend::SchedulerPlugins,
        name,
        log,
    };
    let (gang_a, gang_b) = (gang(&ns_a, "job-a", &log_a), gang(&ns_b, "job-b", &log_b));
    // Both at once: each installation sees the other's namespace as off.
    futures::join!(gang_a.whole_lifecycle(), gang_b.whole_lifecycle());
    // And a job of each that stays, through a few of the other's resyncs.
    let b_job = jobs::job(Kind::PyTorchJob, Backend::SchedulerPlugins, "stays", 2);
    jobs::create(&client, &ns_b, Kind::PyTorchJob, &b_job).await;
    let pg = jobs::wait_pg(
        &client,
        &ns_b,
        Backend::SchedulerPlugins,
        "stays",
        "created",
        |_| true,
    )
    .await;
    let labels = pg.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("podgroup-sync.io/instance").map(String::as_str),
        Some("team-b")
    );
    let mut present = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = jobs::get_pg(&client, &ns_b, Backend::SchedulerPlugins, "stays").await;
        present += now.is_some_and(|p| p.metadata.uid == pg.metadata.uid) as usize;
    }
    let writes = cp.writes();
    let of = |user: &str| writes.iter().filter(|w| w.user == user).collect::<Vec<_>>();
    let (by_a, by_b) = (of(&user_a), of(&user_b));
    let strays: Vec<&&AuditedWrite> = by_a
        .iter()
        .filter(|w| w.namespace != ns_a)
        .chain(by_b.iter().filter(|w| w.namespace != ns_b))
        .collect();
    println!(
        "figure: two installations: {} PodGroup writes by team-a, {} by team-b, {} in the other's namespace; team-b's PodGroup present in {present} of 20 samples",
        by_a.len(),
        by_b.len(),
        strays.len()
    );
    assert!(strays.is_empty(), "writes across installations: {strays:?}");
    assert!(
        !by_a.is_empty() && !by_b.is_empty(),
        "both wrote: {writes:?}"
    );
    assert_eq!(present, 20);
    a.stop();
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_over_100_pod_groups_writes_nothing() {
    let _serial = SERIAL.lock().await;
    const JOBS: usize = 100;
    let cp = Audited::start().await;
    let client = cp.0.client().await;
    let ids = support::test_namespace(&client, "upgrade-ids", &[]).await;
    let ns = support::test_namespace(&client, "upgrade", &[ENABLED]).await;
    let (kc_old, _) = cp.identity(&ids, "previous").await;
    let (kc_new, user_new) = cp.identity(&ids, "upgraded").await;
    // The previous release (PGS_PREVIOUS_BIN, else this build as the default installation).
    let previous = std::env::var("PGS_PREVIOUS_BIN").ok();
    let mut old = match &previous {
        Some(bin) => {
            // SAFETY: set before any thread of this test reads it; the tests run one at a time.
            unsafe { std::env::set_var("PGS_CONTROLLER_BIN", bin) };
            let c = controller::start(&cp.0, Some(&kc_old), &[]);
            unsafe { std::env::remove_var("PGS_CONTROLLER_BIN") };
            c
        }
        None => controller::start(&cp.0, Some(&kc_old), &[]),
    };
    let b = Backend::SchedulerPlugins;
    for i in 0..JOBS {
        let name = format!("up-{i}");
        jobs::create(
            &client,
            &ns,
            Kind::PyTorchJob,
            &jobs::job(Kind::PyTorchJob, b, &name, 2),
        )
        .await;
    }
    support::wait_for("every PodGroup", Duration::from_secs(120), || async {
        let n = jobs::api(&client, &ns, &b.ar())
            .list(&Default::default())
            .await
            .ok()?
            .items
            .len();
        (n == JOBS).then_some(())
    })
    .await;
    old.stop();
    let new = controller::start(&cp.0, Some(&kc_new), &[]);
    // Past the first reconcile of every job, and an audit pass.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let reconciled = new.metric("podgroup_sync_reconcile_total", &[]);
    let writes: Vec<AuditedWrite> = cp
        .writes()
        .into_iter()
        .filter(|w| w.user == user_new)
        .collect();
    let pgs = jobs::api(&client, &ns, &b.ar())
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let labelled = pgs
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("podgroup-sync.io/instance"))
        })
        .count();
    println!(
        "figure: upgrade over {JOBS} PodGroups (previous: {}): {reconciled} reconciles, {} PodGroup writes, {labelled} PodGroups with an instance label",
        previous.as_deref().unwrap_or("this build"),
        writes.len()
    );
    assert!(
        reconciled >= JOBS as f64,
        "every job reconciled: {reconciled}"
    );
    assert!(writes.is_empty(), "the upgrade wrote: {writes:?}");
    assert_eq!(labelled, 0);
    assert_eq!(pgs.len(), JOBS);
}
