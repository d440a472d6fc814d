//! The fault tier (`make faults`): each scenario runs the controller on a control plane of its
//! own, injects one fault in the middle of a burst of job creations — the API server killed and
//! started again (one instance; a leader-elected pair), etcd stopped and started again, the
//! controller killed, a forced watch expiry, the API server throttling the controller's
//! ServiceAccount to 429 — and then checks that nothing was lost:
//!
//! - every job in the enabled namespace has exactly one PodGroup, with the right spec and owner;
//! - no PodGroup appeared anywhere else, and the foreign PodGroups kept their resourceVersion;
//! - every invalid job has its `InvalidSpec` Event and every unlinked job its
//!   `MissingPodGroupLink` Event;
//! - the controller never panicked.
//!
//! Each scenario prints its recovery time (fault cleared → everything converged) as a figure; it
//! is not a pass/fail bound. Run one scenario at a time: `cargo test --test faults --
//! --test-threads=1 --nocapture` (what `make faults` does).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use support::controller::{self, Controller, metric_sum};
use support::faults::{self, Proc};
use support::jobs::{self, Backend, Kind};

const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");
/// How long a scenario may take to converge after its fault cleared.
const CONVERGE: Duration = Duration::from_secs(120);
/// How long the API server or etcd stays down.
const OUTAGE: Duration = Duration::from_secs(15);

/// What one job should end up with.
#[derive(Debug, Clone)]
struct Expect {
    name: String,
    kind: Kind,
    backend: Backend,
    workers: u32,
    /// None: no PodGroup; Some: the Event reason it must have.
    shape: Shape,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A linked, valid job: a PodGroup.
    Good,
    /// No pod link in its templates: a PodGroup and a `MissingPodGroupLink` Event.
    Unlinked,
    /// minAvailable above its pods: no PodGroup and an `InvalidSpec` Event.
    Invalid,
}

/// The `i`-th job of a batch named `prefix`: mostly linked PyTorchJobs on scheduler-plugins,
/// every third an MPIJob on Volcano; `bad` of them unlinked and `bad` invalid.
fn batch(prefix: &str, n: usize, bad: usize) -> Vec<Expect> {
    (0..n)
        .map(|i| {
            let (kind, backend) = if i % 3 == 2 {
                (Kind::MPIJob, Backend::Volcano)
            } else {
                (Kind::PyTorchJob, Backend::SchedulerPlugins)
            };
            let shape = if i < bad {
                Shape::Invalid
            } else if i < 2 * bad {
                Shape::Unlinked
            } else {
                Shape::Good
            };
            Expect {
                name: format!("{prefix}-{i:04}"),
                kind,
                backend,
                workers: 1 + (i % 4) as u32,
                shape,
            }
        })
        .collect()
}

fn manifest(e: &Expect) -> Value {
    let mut m = jobs::job(e.kind, e.backend, &e.name, e.workers);
    match e.shape {
        Shape::Good => {}
        Shape::Invalid => {
            m["spec"]["runPolicy"] = json!({"schedulingPolicy": {"minAvailable": 1000}});
        }
        Shape::Unlinked => {
            let field = if e.kind == Kind::MPIJob {
                "mpiReplicaSpecs"
            } else {
                "pytorchReplicaSpecs"
            };
            let specs = m["spec"][field].as_object_mut().expect("replica specs");
            for spec in specs.values_mut() {
                spec["template"]["metadata"] = json!({});
            }
        }
    }
    m
}

/// One scenario's control plane, namespaces and foreign PodGroups.
struct Scenario {
    cluster: support::Cluster,
    client: Client,
    ns: String,
    off_ns: String,
    /// (namespace, backend, name) → resourceVersion of PodGroups podgroup-sync must not touch.
    foreign: BTreeMap<(String, &'static str, String), String>,
}

impl Scenario {
    async fn new(name: &str) -> Scenario {
        Scenario::new_with(name, &[]).await
    }

    /// [`Scenario::new`] with start.sh options (e.g. `AUDIT=1`).
    async fn new_with(name: &str, env: &'static [(&'static str, &'static str)]) -> Scenario {
        eprintln!("== fault scenario: {name}");
        let cluster = tokio::task::spawn_blocking(move || support::private_cluster_with(env))
            .await
            .expect("start control plane");
        let client = cluster.client().await;
        let ns = support::test_namespace(&client, "faults", &[ENABLED]).await;
        let off_ns = support::test_namespace(&client, "faults-off", &[]).await;
        let mut sc = Scenario {
            cluster,
            client,
            ns,
            off_ns,
            foreign: BTreeMap::new(),
        };
        // A user's own PodGroup in the managed namespace (no owner) and one in the other.
        for (ns, backend) in [
            (sc.ns.clone(), Backend::SchedulerPlugins),
            (sc.off_ns.clone(), Backend::Volcano),
        ] {
            let ar = backend.ar();
            let pg: DynamicObject = serde_json::from_value(json!({
                "apiVersion": ar.api_version, "kind": "PodGroup",
                "metadata": {"name": "users-own"}, "spec": {"minMember": 2}}))
            .unwrap();
            let created = jobs::api(&sc.client, &ns, &ar)
                .create(&PostParams::default(), &pg)
                .await
                .expect("create foreign PodGroup");
            sc.foreign.insert(
                (ns, backend_label(backend), "users-own".into()),
                created.metadata.resource_version.unwrap(),
            );
        }
        sc
    }

    fn controller(&self, kubeconfig: Option<&std::path::Path>, args: &[&str]) -> Controller {
        controller::start(&self.cluster, kubeconfig, args)
    }

    /// Creates the jobs, `concurrency` at a time, each retried until the API server accepts it
    /// (it may be down meanwhile); a job some earlier attempt created counts as created.
    async fn create(&self, batch: &[Expect]) {
        futures::stream::iter(batch)
            .for_each_concurrent(16, |e| {
                let client = self.client.clone();
                let ns = self.ns.clone();
                async move { create_until_accepted(&client, &ns, e).await }
            })
            .await;
    }

    /// Polls [`Scenario::check`] until it passes; panics with its last finding after
    /// [`CONVERGE`]. Returns the time from `since` to convergence.
    async fn converged(&self, expect: &[Expect], since: Instant, what: &str) -> Duration {
        let deadline = Instant::now() + CONVERGE;
        loop {
            match self.check(expect).await {
                Ok(()) => {
                    let took = since.elapsed();
                    println!(
                        "figure: {what}: converged {:.1} s after the fault cleared ({} jobs)",
                        took.as_secs_f64(),
                        expect.len()
                    );
                    return took;
                }
                Err(finding) if Instant::now() > deadline => {
                    panic!("{what}: not converged after {CONVERGE:?}: {finding}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    /// Everything that must hold once the controller converged.
    async fn check(&self, expect: &[Expect]) -> Result<(), String> {
        let uids = self.job_uids().await?;
        let mut pgs: BTreeMap<(&'static str, String), DynamicObject> = BTreeMap::new();
        for backend in [Backend::SchedulerPlugins, Backend::Volcano] {
            for ns in [&self.ns, &self.off_ns] {
                for pg in list(&self.client, ns, &backend.ar()).await? {
                    let key = (
                        ns.clone(),
                        backend_label(backend),
                        pg.metadata.name.clone().unwrap_or_default(),
                    );
                    if let Some(rv) = self.foreign.get(&key) {
                        if pg.metadata.resource_version.as_ref() != Some(rv) {
                            return Err(format!("foreign PodGroup {key:?} was modified"));
                        }
                        continue;
                    }
                    if ns != &self.ns {
                        return Err(format!("PodGroup {key:?} in a namespace not enabled"));
                    }
                    pgs.insert((key.1, key.2), pg);
                }
            }
        }
        let events = self.event_reasons().await?;
        let mut wanted: BTreeSet<(&'static str, String)> = BTreeSet::new();
        for e in expect {
            let uid = uids
                .get(&(e.kind.ar().kind, e.name.clone()))
                .ok_or_else(|| format!("job {} not found", e.name))?;
            let reason = match e.shape {
                Shape::Good => None,
                Shape::Unlinked => Some("MissingPodGroupLink"),
                Shape::Invalid => Some("InvalidSpec"),
            };
            if let Some(reason) = reason
                && !events.contains(&(e.name.clone(), reason.to_string()))
            {
                return Err(format!("no {reason} Event on {}", e.name));
            }
            if e.shape == Shape::Invalid {
                continue;
            }
            let key = (backend_label(e.backend), e.name.clone());
            let pg = pgs
                .get(&key)
                .ok_or_else(|| format!("no PodGroup for {}", e.name))?;
            let owner = pg
                .metadata
                .owner_references
                .as_ref()
                .and_then(|o| o.iter().find(|r| r.controller == Some(true)))
                .map(|r| r.uid.clone());
            if owner.as_ref() != Some(uid) {
                return Err(format!("PodGroup {} has controller {owner:?}", e.name));
            }
            let spec = jobs::spec(pg);
            let want = jobs::expected_spec(e.backend, e.workers);
            for (field, value) in want.as_object().unwrap() {
                if spec.get(field) != Some(value) {
                    return Err(format!(
                        "PodGroup {}: {field} is {:?}",
                        e.name,
                        spec.get(field)
                    ));
                }
            }
            wanted.insert(key);
        }
        let extra: Vec<_> = pgs.keys().filter(|k| !wanted.contains(*k)).collect();
        if !extra.is_empty() {
            return Err(format!("PodGroups no job should have: {extra:?}"));
        }
        Ok(())
    }

    async fn job_uids(&self) -> Result<BTreeMap<(String, String), String>, String> {
        let mut out = BTreeMap::new();
        for kind in [Kind::PyTorchJob, Kind::MPIJob] {
            for j in list(&self.client, &self.ns, &kind.ar()).await? {
                out.insert(
                    (kind.ar().kind, j.metadata.name.unwrap_or_default()),
                    j.metadata.uid.unwrap_or_default(),
                );
            }
        }
        Ok(out)
    }

    /// (object name, reason) of every Event podgroup-sync published in the enabled namespace.
    async fn event_reasons(&self) -> Result<BTreeSet<(String, String)>, String> {
        let list = Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("list events: {e}"))?;
        Ok(list
            .items
            .into_iter()
            .filter(|e| e.reporting_controller.as_deref() == Some("podgroup-sync"))
            .filter_map(|e| Some((e.regarding?.name?, e.reason?)))
            .collect())
    }

    fn process(&self, binary: &str) -> Proc {
        faults::process(&self.cluster, binary)
    }
}

impl Drop for Scenario {
    /// The next scenario gets the machine to itself.
    fn drop(&mut self) {
        support::stop_cluster(&self.cluster);
    }
}

fn backend_label(b: Backend) -> &'static str {
    b.name()
}

async fn list(
    client: &Client,
    ns: &str,
    ar: &kube::discovery::ApiResource,
) -> Result<Vec<DynamicObject>, String> {
    jobs::api(client, ns, ar)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| format!("list {}: {e}", ar.plural))
}

async fn create_until_accepted(client: &Client, ns: &str, e: &Expect) {
    let obj: DynamicObject = serde_json::from_value(manifest(e)).expect("manifest");
    let api = jobs::api(client, ns, &e.kind.ar());
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => return,
            Err(err) if Instant::now() > deadline => panic!("create {}: {err}", e.name),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The controller never panicked.
fn assert_no_panic(c: &Controller) {
    let log = std::fs::read_to_string(&c.log).unwrap_or_default();
    assert!(
        !log.contains("panicked"),
        "the controller panicked:\n{}",
        c.log_tail()
    );
}

/// Creates the first batch and waits until it converged, so that the fault meets a cache with
/// more jobs than one list page (500) holds.
async fn prepare(sc: &Scenario, n: usize) -> Vec<Expect> {
    let before = batch("pre", n, 5);
    sc.create(&before).await;
    sc.converged(&before, Instant::now(), "before the fault")
        .await;
    before
}

/// The fault meets a burst: `fault` runs while a burst of jobs (with invalid and unlinked ones)
/// is being created, and returns when the fault cleared; jobs named to sort first are created
/// right after. Returns every job and when the fault cleared.
async fn burst_with_fault(
    sc: &Scenario,
    fault: impl FnOnce() -> Instant + Send + 'static,
) -> (Vec<Expect>, Instant) {
    let burst = batch("burst", 150, 20);
    let cleared = {
        let creating = sc.create(&burst);
        let faulting = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            tokio::task::spawn_blocking(fault).await.expect("fault")
        };
        let ((), cleared) = futures::join!(creating, faulting);
        cleared
    };
    // Jobs created just after the fault cleared, while the controller's watches are still
    // catching up; their names sort into the first list page.
    let late = batch("a-new", 100, 0);
    sc.create(&late).await;
    let mut all = burst;
    all.extend(late);
    (all, cleared)
}

/// The fault of the API-server scenarios: kill -9, [`OUTAGE`] down, started again; returns
/// when it is ready.
fn api_server_outage(sc: &Scenario) -> impl FnOnce() -> Instant + Send + 'static {
    let api = sc.process("kube-apiserver");
    let cluster = sc.cluster.clone();
    move || {
        faults::kill9(&api);
        std::thread::sleep(OUTAGE);
        faults::relaunch(&cluster, &api);
        faults::wait_api_ready(&cluster)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_server_killed_mid_burst_single_instance() {
    let sc = Scenario::new("API server killed mid-burst, one instance").await;
    let ctl = sc.controller(None, &[]);
    let mut expect = prepare(&sc, 550).await;
    let (more, cleared) = burst_with_fault(&sc, api_server_outage(&sc)).await;
    expect.extend(more);
    sc.converged(
        &expect,
        cleared,
        "API server kill -9, 15 s down, one instance",
    )
    .await;
    print_retries(&ctl);
    assert_eq!(
        ctl.get("/healthz").map(|(c, _)| c),
        Some(200),
        "live after recovery"
    );
    wait_ready(&ctl).await;
    assert_no_panic(&ctl);
}

/// What the fault cost the controller: retried Events and reconciles.
fn print_retries(c: &Controller) {
    println!(
        "figure: Events retried after a failed publish: {}; failed reconciles retried: {}; jobs not in the cache when their turn came: {}",
        c.metric(
            "podgroup_sync_events_failed_total",
            &[("cause", "transient")]
        ),
        c.metric("podgroup_sync_reconcile_errors_total", &[]),
        c.metric(
            "podgroup_sync_reconcile_errors_total",
            &[("cause", "not_found")]
        ),
    );
}

/// Waits until the controller reports ready again (its caches fresh).
async fn wait_ready(c: &Controller) {
    support::wait_for(
        "the controller ready again",
        Duration::from_secs(60),
        || async {
            c.get("/readyz")
                .filter(|(code, _)| *code == 200)
                .map(|_| ())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_server_killed_mid_burst_leader_elected_pair() {
    let sc = Scenario::new("API server killed mid-burst, leader-elected pair").await;
    let lease_ns = support::test_namespace(&sc.client, "lease", &[]).await;
    let args_a = controller::leader_args(&lease_ns, "a");
    let args_b = controller::leader_args(&lease_ns, "b");
    let mut a = sc.controller(None, &args_a.iter().map(String::as_str).collect::<Vec<_>>());
    let mut b = sc.controller(None, &args_b.iter().map(String::as_str).collect::<Vec<_>>());
    let mut expect = prepare(&sc, 550).await;
    let (more, cleared) = burst_with_fault(&sc, api_server_outage(&sc)).await;
    expect.extend(more);
    // A leader that cannot renew its Lease steps down and stays a standby; one of the two
    // leads again once the API server is back, and converges.
    let took = sc
        .converged(
            &expect,
            cleared,
            "API server kill -9, 15 s down, leader-elected pair",
        )
        .await;
    let exited: Vec<&str> = [("a", &mut a), ("b", &mut b)]
        .into_iter()
        .filter_map(|(n, c)| c.child.try_wait().ok().flatten().map(|_| n))
        .collect();
    println!(
        "figure: leader-elected pair: {:.1} s to converge (lease 6 s); instances that exited: {exited:?}",
        took.as_secs_f64()
    );
    for c in [&a, &b] {
        assert_no_panic(c);
    }
    assert!(exited.is_empty(), "instances exited: {exited:?}");
}

/// The renew deadline and lease of [`controller::leader_args`].
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
const LEASE: Duration = Duration::from_secs(6);

/// A leader whose connection to the API server stalls — a loopback proxy stops forwarding,
/// without closing, for 40 s — while jobs keep coming: it stops writing at its renew deadline,
/// before its Lease can expire; the standby leads within lease + 5 s; in the API server's audit
/// log no PodGroup write of the stalled replica follows the new leader's first; and once the
/// proxy forwards again the stalled replica is back as a live, ready standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_whose_api_connection_stalls_stops_writing_before_its_lease_expires() {
    const STALL: Duration = Duration::from_secs(40);
    let sc = Scenario::new_with(
        "the leader's API connection stalls for 40 s",
        &[("AUDIT", "1")],
    )
    .await;
    let lease_ns = support::test_namespace(&sc.client, "lease", &[]).await;
    let api: std::net::SocketAddr = faults::env(&sc.cluster, "API_URL")
        .trim_start_matches("https://")
        .parse()
        .expect("API server address");
    let proxy = faults::StallingProxy::start(api).await;
    let (cluster, ns) = (sc.cluster.clone(), lease_ns.clone());
    let (kc_a, kc_b) = tokio::task::spawn_blocking(move || {
        let a = faults::service_account_kubeconfig(&cluster, &ns, "leader-a");
        let b = faults::service_account_kubeconfig(&cluster, &ns, "leader-b");
        (a, b)
    })
    .await
    .unwrap();
    let kc_a = faults::kubeconfig_via(&kc_a, proxy.port);
    let user = |who: &str| format!("system:serviceaccount:{lease_ns}:leader-{who}");
    let args = |who: &str| controller::leader_args(&lease_ns, who);
    let args_a = args("a");
    let mut a = sc.controller(
        Some(&kc_a),
        &args_a.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let leading = |c: &Controller| c.metric("podgroup_sync_leader", &[]) == 1.0;
    support::wait_for("a leads", Duration::from_secs(30), || async {
        leading(&a).then_some(())
    })
    .await;
    let args_b = args("b");
    let mut b = sc.controller(
        Some(&kc_b),
        &args_b.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut expect = batch("pre", 20, 0);
    sc.create(&expect).await;
    sc.converged(&expect, Instant::now(), "before the stall")
        .await;

    proxy.stall(true);
    let stalled = Instant::now();
    let (mut a_stepped_down, mut b_leads) = (None, None);
    let mut during = Vec::new();
    let mut i = 0;
    while stalled.elapsed() < STALL {
        if a_stepped_down.is_none() && !leading(&a) {
            a_stepped_down = Some(stalled.elapsed());
        }
        if b_leads.is_none() && leading(&b) {
            b_leads = Some(stalled.elapsed());
        }
        if i % 5 == 0 {
            let job = batch(&format!("stall-{i}"), 1, 0);
            sc.create(&job).await;
            during.extend(job);
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.stall(false);
    let released = Instant::now();
    expect.extend(during);
    sc.converged(&expect, released, "a leader's API connection stalled 40 s")
        .await;
    wait_ready(&a).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes: Vec<faults::AuditedWrite> = faults::audited_writes(&sc.cluster)
        .into_iter()
        .filter(|w| (200..300).contains(&w.code))
        .collect();
    let by = |who: &str| writes.iter().filter(|w| w.user == user(who)).count();
    let first_b = writes.iter().position(|w| w.user == user("b"));
    let last_a = writes.iter().rposition(|w| w.user == user("a"));
    let a_after_b: Vec<&faults::AuditedWrite> = first_b
        .map(|f| writes[f..].iter().filter(|w| w.user == user("a")).collect())
        .unwrap_or_default();
    println!(
        "figure: stalled leader: stepped down {:?} after the stall (renew deadline {RENEW_DEADLINE:?}, lease {LEASE:?}); standby led after {:?}; PodGroup writes: {} by the stalled replica (last at {}), {} by the new leader (first at {}); {} writes of the stalled replica after the new leader's first",
        a_stepped_down,
        b_leads,
        by("a"),
        last_a.map_or("-", |i| writes[i].at.as_str()),
        by("b"),
        first_b.map_or("-", |i| writes[i].at.as_str()),
        a_after_b.len()
    );
    assert!(
        a_stepped_down.is_some_and(|d| d < LEASE),
        "the stalled leader did not stop before its lease could expire: {a_stepped_down:?}\n{}",
        a.log_tail()
    );
    assert!(
        b_leads.is_some_and(|d| d < LEASE + Duration::from_secs(5)),
        "the standby did not lead within lease + 5 s: {b_leads:?}"
    );
    assert!(by("a") > 0 && by("b") > 0, "both led: {writes:?}");
    assert!(a_after_b.is_empty(), "writes overlap: {a_after_b:?}");
    assert!(
        a.child.try_wait().unwrap().is_none(),
        "the stalled replica exited:\n{}",
        a.log_tail()
    );
    assert!(!leading(&a) && leading(&b), "one leader, the new one");
    for c in [&mut a, &mut b] {
        assert_no_panic(c);
        c.stop();
    }
}

/// A leader killed while 100 jobs carry Warnings: the standby, started before they were
/// published, reads them when it takes the lead and publishes none of them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_leader_publishes_no_warning_the_old_one_published() {
    let sc = Scenario::new("leader killed while 100 jobs carry Warnings").await;
    let lease_ns = support::test_namespace(&sc.client, "lease", &[]).await;
    let args = |who: &str| controller::leader_args(&lease_ns, who);
    let (args_a, args_b) = (args("a"), args("b"));
    let a = sc.controller(None, &args_a.iter().map(String::as_str).collect::<Vec<_>>());
    let leading = |c: &Controller| c.metric("podgroup_sync_leader", &[]) == 1.0;
    support::wait_for("a leads", Duration::from_secs(30), || async {
        leading(&a).then_some(())
    })
    .await;
    let b = sc.controller(None, &args_b.iter().map(String::as_str).collect::<Vec<_>>());
    // 100 jobs with a Warning each: 50 invalid (InvalidSpec), 50 whose templates lack the pod
    // link (MissingPodGroupLink; no webhook).
    let warned = batch("warned", 100, 50);
    sc.create(&warned).await;
    sc.converged(&warned, Instant::now(), "100 jobs with Warnings")
        .await;
    let events: Api<Event> = Api::namespaced(sc.client.clone(), &sc.ns);
    let lp = ListParams::default().fields("reportingController=podgroup-sync");
    let before = events.list(&lp).await.unwrap().items.len();
    faults::kill9(&faults::Proc {
        pid: a.child.id(),
        argv: Vec::new(),
    });
    let killed = Instant::now();
    support::wait_for("b leads", Duration::from_secs(30), || async {
        leading(&b).then_some(())
    })
    .await;
    let took = killed.elapsed();
    // Its first pass over every job is done.
    support::wait_for(
        "b reconciled every job",
        Duration::from_secs(60),
        || async {
            (b.metric("podgroup_sync_reconcile_total", &[]) >= warned.len() as f64).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = events.list(&lp).await.unwrap().items.len();
    println!(
        "figure: leader killed with {} Warnings out: the standby led after {:.1} s and created {} new Event objects ({before} before, {after} after)",
        warned.len(),
        took.as_secs_f64(),
        after - before
    );
    assert!(
        before >= warned.len(),
        "{before} Events for {} jobs",
        warned.len()
    );
    assert_eq!(after, before, "the new leader published Events again");
    assert_no_panic(&b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_stopped_mid_burst() {
    let sc = Scenario::new("etcd stopped mid-burst").await;
    let ctl = sc.controller(None, &[]);
    let mut expect = prepare(&sc, 550).await;
    // Jobs whose PodGroups are due when etcd goes: the controller is frozen while they are
    // created (their watch events wait in its connections) and thawed once etcd is down, so
    // its writes meet the outage.
    let pid = ctl.child.id();
    faults::signal(pid, "STOP");
    let burst = batch("burst", 150, 20);
    sc.create(&burst).await;
    let etcd = sc.process("etcd");
    let cluster = sc.cluster.clone();
    let cleared = tokio::task::spawn_blocking(move || {
        faults::stop(&etcd);
        faults::signal(pid, "CONT");
        std::thread::sleep(OUTAGE);
        faults::relaunch(&cluster, &etcd);
        faults::wait_api_ready(&cluster)
    })
    .await
    .expect("fault");
    let late = batch("a-new", 100, 0);
    sc.create(&late).await;
    expect.extend(burst);
    expect.extend(late);
    sc.converged(&expect, cleared, "etcd stopped, 15 s down")
        .await;
    print_retries(&ctl);
    // The API server holds writes while etcd is away (up to its request timeout): the fault
    // shows as reconciles that failed, or that waited out the outage.
    let failed = ctl.metric("podgroup_sync_reconcile_errors_total", &[])
        + ctl.metric("podgroup_sync_events_failed_total", &[]);
    let waited = ctl.metric("podgroup_sync_reconcile_duration_seconds_count", &[])
        - ctl.metric(
            "podgroup_sync_reconcile_duration_seconds_bucket",
            &[("le", "5")],
        );
    println!(
        "figure: etcd outage: {failed} failed writes, {waited} reconciles that waited it out (> 5 s)"
    );
    assert!(
        failed + waited > 0.0,
        "the outage never reached the controller's writes"
    );
    wait_ready(&ctl).await;
    assert_no_panic(&ctl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forced_watch_expiry_mid_burst() {
    let sc = Scenario::new("forced watch expiry (410) mid-burst").await;
    let ctl = sc.controller(None, &[]);
    let mut expect = prepare(&sc, 550).await;
    let relists_before = ctl.metric("podgroup_sync_cache_relists_total", &[]);
    let api = sc.process("kube-apiserver");
    let cluster = sc.cluster.clone();
    let (more, cleared) = burst_with_fault(&sc, move || {
        // History compacted to now and the watch cache dropped: every watch that resumes is
        // answered 410 Gone and relists.
        faults::compact_etcd(&cluster);
        faults::kill9(&api);
        faults::relaunch(&cluster, &api);
        faults::wait_api_ready(&cluster)
    })
    .await;
    expect.extend(more);
    sc.converged(&expect, cleared, "forced watch expiry").await;
    let relists = ctl.metric("podgroup_sync_cache_relists_total", &[]) - relists_before;
    println!("figure: forced watch expiry: {relists} cache relists");
    assert!(relists >= 1.0, "the fault forced no relist");
    assert_no_panic(&ctl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_killed_mid_burst_then_a_restart_writes_nothing() {
    let sc = Scenario::new("controller kill -9 mid-burst, then a restart").await;
    let first = sc.controller(None, &[]);
    let mut expect = prepare(&sc, 200).await;
    let pid = first.child.id();
    let (more, cleared) = {
        let burst = batch("burst", 150, 20);
        let creating = sc.create(&burst);
        let killing = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            faults::signal(pid, "KILL");
        };
        futures::join!(creating, killing);
        (burst, Instant::now())
    };
    drop(first);
    expect.extend(more);
    let second = sc.controller(None, &[]);
    sc.converged(&expect, cleared, "controller kill -9, restarted")
        .await;
    let mut second = second;
    second.stop();
    assert_no_panic(&second);
    // A restart with nothing changed writes nothing: neither PodGroups nor Events.
    let before = sc.cluster.pod_group_and_event_writes();
    let third = sc.controller(None, &[]);
    let total = expect.len() as f64;
    support::wait_for("every job reconciled", Duration::from_secs(60), || async {
        (third.metric("podgroup_sync_reconcile_total", &[]) >= total).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = sc.cluster.pod_group_and_event_writes();
    println!(
        "figure: restart after the kill: {} PodGroup writes, {} Event writes",
        after.0 - before.0,
        after.1 - before.1
    );
    assert_eq!(after, before, "a restart with nothing changed wrote");
    assert_no_panic(&third);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_server_throttles_the_controller_to_429() {
    let sc = Scenario::new("API server throttling the controller's ServiceAccount (429)").await;
    let sa_ns = support::test_namespace(&sc.client, "pgs-system", &[]).await;
    let kubeconfig = faults::service_account_kubeconfig(&sc.cluster, &sa_ns, "podgroup-sync");
    faults::throttle_service_account(&sc.cluster, &sa_ns, "podgroup-sync");
    let ctl = sc.controller(Some(&kubeconfig), &[]);
    let started = Instant::now();
    let mut expect = batch("throttled", 400, 20);
    sc.create(&expect).await;
    let late = batch("a-new", 100, 0);
    sc.create(&late).await;
    let created = Instant::now();
    expect.extend(late);
    sc.converged(
        &expect,
        started,
        "throttled to 429 (from the first job created)",
    )
    .await;
    let after_burst = created.elapsed();
    // The two counts are read until they agree (a 429 may be on its way back while they are
    // read), for 10 s at most; then they must be equal.
    let read = || {
        let text = sc.cluster.kubectl_ok(&["get", "--raw", "/metrics"]);
        let rejected = metric_sum(
            &text,
            "apiserver_flowcontrol_rejected_requests_total",
            &[("flow_schema", "pgs-throttle")],
        );
        (
            rejected,
            ctl.metric("podgroup_sync_api_throttled_total", &[]),
        )
    };
    let agreed = Instant::now() + Duration::from_secs(10);
    let (mut rejected, mut seen) = read();
    while seen != rejected && Instant::now() < agreed {
        tokio::time::sleep(Duration::from_millis(500)).await;
        (rejected, seen) = read();
    }
    println!(
        "figure: throttling: converged {:.1} s after the last job was created; the API server rejected {rejected} of the controller's requests with 429 ({:.2} per job; the controller counted {seen}); lowest in-flight limit now {}",
        after_burst.as_secs_f64(),
        rejected / expect.len() as f64,
        ctl.metric("podgroup_sync_api_in_flight_limit", &[])
    );
    assert!(rejected > 0.0, "the API server throttled nothing");
    // It slows down when told to: fewer 429s than jobs, and every one of them seen.
    assert!(
        rejected <= expect.len() as f64,
        "{rejected} 429s for {} jobs",
        expect.len()
    );
    assert_eq!(seen, rejected);
    assert_no_panic(&ctl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_says_so_while_a_fault_lasts_and_recovers_after() {
    let sc = Scenario::new("/healthz and /readyz through an API-server outage").await;
    let ctl = sc.controller(None, &["--cache-stall-seconds", "5"]);
    let expect = prepare(&sc, 20).await;
    let api = sc.process("kube-apiserver");
    faults::kill9(&api);
    // Readiness drops first (a cache is failing), liveness once the stall limit passed.
    let body = support::wait_for("/readyz failing", Duration::from_secs(30), || async {
        ctl.get("/readyz")
            .filter(|(c, _)| *c == 503)
            .map(|(_, b)| b)
    })
    .await;
    assert!(body.contains("failing"), "{body}");
    let body = support::wait_for("/healthz failing", Duration::from_secs(60), || async {
        ctl.get("/healthz")
            .filter(|(c, _)| *c == 503)
            .map(|(_, b)| b)
    })
    .await;
    assert!(body.contains("has not refreshed"), "{body}");
    println!(
        "figure: /healthz during the outage: {}",
        body.lines().next().unwrap_or("")
    );
    let stale = ctl.metric("podgroup_sync_stale_caches", &[]);
    assert!(stale >= 1.0, "stale caches gauge {stale}");
    let cluster = sc.cluster.clone();
    let cleared = tokio::task::spawn_blocking(move || {
        faults::relaunch(&cluster, &api);
        faults::wait_api_ready(&cluster)
    })
    .await
    .unwrap();
    support::wait_for(
        "/healthz and /readyz ok again",
        Duration::from_secs(60),
        || async {
            let live = ctl.get("/healthz").is_some_and(|(c, _)| c == 200);
            let ready = ctl.get("/readyz").is_some_and(|(c, _)| c == 200);
            (live && ready).then_some(())
        },
    )
    .await;
    println!(
        "figure: /healthz and /readyz ok {:.1} s after the API server was ready",
        cleared.elapsed().as_secs_f64()
    );
    sc.converged(&expect, cleared, "after the health check")
        .await;
    assert_no_panic(&ctl);
}
