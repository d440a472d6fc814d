//! A real Prometheus (Debian's `prometheus` package, through tests/cluster/get-promtool.sh)
//! scrapes podgroup-sync replicas and evaluates `dashboards/alerts.yaml`; the scenario makes each
//! alert's real condition happen and asserts through Prometheus's HTTP API that it fires — and
//! that none fires on a healthy run — and that every dashboard query returns a series.
//!
//! The replicas are processes on loopback (the e2e tier has no kubelet), so Prometheus scrapes
//! them from a file of targets labelled as the chart's ServiceMonitor labels them (`job`: the
//! metrics Service's name, `namespace`: the release's, `instance`: the endpoint, `pod`). The
//! rules are the shipped ones with each `for:` cut to 3 s and GangWaitHigh's 300 s threshold to
//! 5 s, so that the scenario takes minutes, not hours; every expression is otherwise as shipped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::harness::{self, Link, Scope, replicas, training_job};
use crate::support::controller::{self, Controller, free_port, http_get, tether};
use crate::support::jobs::{self, Backend, Kind};
use crate::support::{self, webhook};

/// The extended resource the scenario's kwok nodes offer and its pods request instead of GPUs:
/// Volcano admits gangs against the whole cluster's capacity, and scenarios running meanwhile
/// count GPUs, which these nodes do not add to.
const SLOT: &str = "alerts.podgroup-sync.io/slot";
/// The annotation that enables the scenario's namespaces for its own replicas only (the shared
/// e2e controller leaves them alone).
const KEY: &str = "alerts.podgroup-sync.io/enabled";
/// The job label of the replicas' targets: the chart's metrics Service for release `pgs`.
const JOB: &str = "pgs-podgroup-sync-metrics";
const WAIT: Duration = Duration::from_secs(180);

/// The shipped rules with each `for:` cut to 3 s and GangWaitHigh's threshold to 5 s.
fn rules_for_the_test() -> String {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/alerts.yaml"),
    )
    .unwrap();
    let mut out = String::new();
    for line in shipped.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("for: ") {
            let indent = &line[..line.len() - trimmed.len()];
            out.push_str(&format!("{indent}for: 3s\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    let threshold = "[1h]))\n          ) > 300";
    assert!(out.contains(threshold), "GangWaitHigh's threshold moved");
    out.replace(threshold, "[1h]))\n          ) > 5")
}

/// Prometheus on loopback, scraping the targets in a file the scenario rewrites.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    targets: PathBuf,
    dir: PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, first: &[(SocketAddr, &str)]) -> Prometheus {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/get-promtool.sh");
        let out = support::stdout_of(Command::new(&script).stdin(Stdio::null()));
        let text = String::from_utf8_lossy(&out);
        let binary = text
            .lines()
            .find_map(|l| l.strip_prefix("PROMETHEUS="))
            .expect("get-promtool.sh names prometheus")
            .to_string();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("rules.yaml"), rules_for_the_test()).unwrap();
        let targets = dir.join("targets.json");
        std::fs::write(&targets, target_groups(first).to_string()).unwrap();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global: {{scrape_interval: 2s, scrape_timeout: 2s, evaluation_interval: 1s}}\n\
                 rule_files: [{rules}]\n\
                 scrape_configs:\n\
                 - job_name: podgroup-sync\n  file_sd_configs: [{{files: [{targets}], refresh_interval: 1s}}]\n",
                rules = dir.join("rules.yaml").display(),
                targets = targets.display()
            ),
        )
        .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        tether(child.id());
        let p = Prometheus {
            child,
            addr,
            targets,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + WAIT;
        while http_get(addr, "/-/ready").is_none_or(|(c, _)| c != 200) {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// Scrape exactly these replicas: (address, pod name).
    fn set_targets(&self, replicas: &[(SocketAddr, &str)]) {
        let tmp = self.targets.with_extension("tmp");
        std::fs::write(&tmp, target_groups(replicas).to_string()).unwrap();
        std::fs::rename(tmp, &self.targets).unwrap();
    }

    fn api(&self, path: &str) -> Value {
        let (code, body) = http_get(self.addr, path).unwrap_or_else(|| panic!("GET {path}"));
        assert_eq!(code, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// An instant query's result vector.
    fn query(&self, expr: &str) -> Vec<Value> {
        let v = self.api(&format!("/api/v1/query?query={}", encode(expr)));
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The alerts firing now, with their labels.
    fn firing(&self) -> Vec<Value> {
        self.api("/api/v1/alerts")["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["state"] == "firing")
            .collect()
    }

    /// Waits until `alert` fires; its labels.
    async fn wait_firing(&self, alert: &str) -> Value {
        self.wait_firing_on(alert, None).await
    }

    /// Waits until `alert` fires (for the replica at `instance`, if given); its labels.
    async fn wait_firing_on(&self, alert: &str, instance: Option<SocketAddr>) -> Value {
        let started = Instant::now();
        let instance = instance.map(|i| i.to_string());
        loop {
            if let Some(a) = self.firing().into_iter().find(|a| {
                a["labels"]["alertname"] == alert
                    && instance
                        .as_ref()
                        .is_none_or(|i| a["labels"]["instance"] == i.as_str())
            }) {
                eprintln!(
                    "[alerts] {alert} fires after {:.1} s: {}",
                    started.elapsed().as_secs_f64(),
                    a["labels"]
                );
                return a["labels"].clone();
            }
            assert!(
                started.elapsed() < WAIT,
                "{alert} never fired; firing: {:?}\npending/all: {}",
                self.firing()
                    .iter()
                    .map(|a| a["labels"]["alertname"].clone())
                    .collect::<Vec<_>>(),
                self.api("/api/v1/alerts")
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// File-based discovery's target groups: each replica labelled as the ServiceMonitor labels it.
fn target_groups(replicas: &[(SocketAddr, &str)]) -> Value {
    replicas
        .iter()
        .map(|(addr, pod)| {
            json!({"targets": [addr.to_string()],
                   "labels": {"job": JOB, "namespace": "podgroup-sync-system", "pod": pod}})
        })
        .collect()
}

/// Percent-encoding of a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A TCP forwarder between a replica and the API server that the scenario can cut: an API
/// server outage as that replica sees it, without stopping the API server the other tests use.
struct Cuttable {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
}

impl Cuttable {
    /// On a thread of its own: the test's runtime blocks while a replica starts.
    fn to(upstream: SocketAddr) -> Cuttable {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, rx) = watch::channel(false);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        return;
                    };
                    if *rx.borrow() {
                        continue; // dropped: refused
                    }
                    let mut rx = rx.clone();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await
                        else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = rx.wait_for(|c| *c) => {}
                        }
                    });
                }
            });
        });
        Cuttable { addr, cut }
    }
}

/// A kubeconfig for `token` at `server`, trusting the test cluster's CA.
fn token_kubeconfig(cluster: &support::Cluster, server: SocketAddr, token: &str, out: &Path) {
    let admin: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&cluster.kubeconfig).unwrap()).unwrap();
    let mut cl = admin["clusters"][0]["cluster"].clone();
    cl["server"] = json!(format!("https://{server}"));
    let kc = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cl}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    });
    std::fs::write(out, kc.to_string()).unwrap();
}

/// A kwok node of `pool` offering `slots` of [`SLOT`], Ready; its name.
async fn slot_node(s: &mut Scope, pool: &str, slots: u32) -> String {
    let resources = json!({"cpu": "8", "memory": "32Gi", "pods": "110", SLOT: slots.to_string()});
    s.add_node_with(pool, resources, json!({})).await
}

/// A PyTorchJob of a master and `workers`, each pod one [`SLOT`], linked by the webhook.
fn slot_job(name: &str, pool: &str, workers: u32) -> Value {
    let mut job = training_job(
        Kind::PyTorchJob,
        Link::Gang(Backend::SchedulerPlugins),
        name,
        pool,
        &[replicas("Master", 1, 1), replicas("Worker", workers, 1)],
        json!({}),
    );
    let text = job.to_string().replace(harness::GPU, SLOT);
    job = serde_json::from_str(&text).unwrap();
    job
}

struct Replica {
    controller: Controller,
    name: &'static str,
}

/// The scenario's replica flags: its own annotation key and instance, short health timings.
fn replica_args(
    ns: &str,
    identity: &str,
    webhook_port: u16,
    certs: &webhook::Certs,
) -> Vec<String> {
    let mut args = webhook::args(webhook_port, certs);
    args.extend(controller::leader_args(ns, identity));
    args.extend(
        [
            "--annotation-key",
            KEY,
            "--instance",
            "alerts",
            "--leader-elect-lease-name",
            "pgs-alerts",
            "--gang-wait-warning-seconds",
            "5",
            "--gang-broken-seconds",
            "3",
            "--gang-feasibility",
            "--audit-interval-seconds",
            "2",
            "--webhook-owner-wait-ms",
            "200",
            "--link-coscheduling-scheduler-name=",
        ]
        .map(String::from),
    );
    args
}

fn start(
    cluster: &support::Cluster,
    kubeconfig: Option<&Path>,
    args: &[String],
    name: &'static str,
) -> Replica {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Replica {
        controller: controller::start(cluster, kubeconfig, &args),
        name,
    }
}

async fn annotate(client: &Client, ns: &str, key: &str) {
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: "true"}}})),
        )
        .await
        .unwrap();
}

/// The scenario's state: its scope, Prometheus, the replicas it scrapes.
struct Run {
    s: Scope,
    prom: Prometheus,
    replicas: Vec<Replica>,
    dir: PathBuf,
    /// The pool of the healthy gang and the jobs that need no room.
    pool: String,
    webhook_config: PathBuf,
}

fn targets(rs: &[Replica]) -> Vec<(SocketAddr, &'static str)> {
    rs.iter().map(|r| (r.controller.addr, r.name)).collect()
}

pub async fn every_alert_fires_on_its_real_condition_and_none_on_a_healthy_run() {
    let mut run = Run::start().await;
    run.healthy().await;
    run.gangs().await;
    run.configuration().await;
    run.webhook().await;
    run.restricted_and_cut_off().await;
    dashboard_queries_return_series(&run.prom);
    run.replicas_stop().await;
    let cluster = run.s.env.cluster;
    cluster.kubectl_ok(&[
        "delete",
        "mutatingwebhookconfiguration",
        "podgroup-sync-alerts",
    ]);
    run.s.cleanup().await;
}

impl Run {
    /// Two replicas (A leads, B stands by) with a webhook certificate valid for 30 days, A's
    /// webhook registered; Prometheus scraping both.
    async fn start() -> Run {
        let mut s = Scope::new("e2e-alerts", false).await;
        let cluster = s.env.cluster;
        let ns = s.ns.clone();
        annotate(&s.client, &ns, KEY).await;
        // The healthy gang's node exists before the replicas start: a gang judged against a
        // node cache that has not seen its node yet is reported infeasible until the node
        // arrives, which with `for:` cut to 3 s would fire on a healthy run.
        let pool = format!("{ns}-p");
        slot_node(&mut s, &pool, 2).await;
        let dir = cluster
            .work_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir)
            .join(format!("alerts-{}", s.id));
        let certs = webhook::certs_valid_for(&dir.join("certs"), "alerts-ca", 30);
        let port_a = free_port();
        let a = start(
            cluster,
            None,
            &replica_args(&ns, "replica-a", port_a, &certs),
            "pgs-a",
        );
        let b_args = replica_args(&ns, "replica-b", free_port(), &certs);
        let b = start(cluster, None, &b_args, "pgs-b");
        let config = webhook::configuration_json("podgroup-sync-alerts", port_a, &certs.ca_pem);
        let webhook_config = dir.join("webhook.json");
        std::fs::write(&webhook_config, config.to_string()).unwrap();
        cluster.kubectl_ok(&["apply", "-f", webhook_config.to_str().unwrap()]);
        let replicas = vec![a, b];
        // Prometheus starts with both replicas as its targets, as it finds a running release.
        let prom = Prometheus::start(&dir.join("prometheus"), &targets(&replicas));
        Run {
            s,
            prom,
            replicas,
            dir,
            pool,
            webhook_config,
        }
    }

    /// A healthy run: a gang that fits runs whole; nothing fires over 15 s of evaluations.
    async fn healthy(&mut self) {
        let (ns, pool) = (self.s.ns.clone(), self.pool.clone());
        let job = slot_job("healthy", &pool, 1);
        self.s.create(&ns, Kind::PyTorchJob, &job).await;
        self.s.wait_all_running(&ns, "healthy", 2).await;
        let up = Instant::now();
        while self.prom.query(&format!("up{{job=\"{JOB}\"}} == 1")).len() < 2 {
            assert!(
                up.elapsed() < WAIT,
                "both replicas never scraped:\n{}",
                self.prom.log()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Before its first scrapes Prometheus sees no target up, and with `for:` cut to 3 s
        // PodgroupSyncDown fires then (shipped, it waits 5 minutes): the healthy run is judged
        // from two evaluations after both replicas are up.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let quiet_until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < quiet_until {
            let firing = self.prom.firing();
            assert!(
                firing.is_empty(),
                "alerts fire on a healthy run: {firing:?}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        eprintln!("[alerts] healthy: nothing fired over 15 s, both replicas scraped");
    }

    /// One gang waits for room (GangsWaiting), then runs after waiting long (GangWaitHigh),
    /// then loses a worker with its node and runs short (GangsBroken); one can never fit
    /// (GangsInfeasible).
    async fn gangs(&mut self) {
        let ns = self.s.ns.clone();
        let big_pool = format!("{ns}-b");
        slot_node(&mut self.s, &big_pool, 1).await;
        let mut big = slot_job("big", &big_pool, 2);
        // training-operator counts a deleted pod as failed: with OnFailure it recreates it.
        big["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = json!("OnFailure");
        self.s.create(&ns, Kind::PyTorchJob, &big).await;
        self.prom.wait_firing("PodgroupSyncGangsWaiting").await;
        let n3 = slot_node(&mut self.s, &big_pool, 2).await;
        self.s.wait_all_running(&ns, "big", 3).await;
        self.prom.wait_firing("PodgroupSyncGangWaitHigh").await;
        let worker = self
            .s
            .pods(&ns, "big")
            .await
            .into_iter()
            .filter(harness::is_running)
            .find(|p| {
                p.name_any().contains("worker")
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n3.as_str())
            })
            .expect("a worker of big on the node with 2 slots");
        self.s.lose_node(&n3, &worker.name_any()).await;
        self.prom.wait_firing("PodgroupSyncGangsBroken").await;
        let mut huge = slot_job("huge", &self.pool, 1);
        huge["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"] =
            json!({"requests": {SLOT: "64"}, "limits": {SLOT: "64"}});
        self.s.create(&ns, Kind::PyTorchJob, &huge).await;
        self.prom.wait_firing("PodgroupSyncGangsInfeasible").await;
    }

    /// A PodGroup of the job's name made by someone else (Conflicts); a job asking for the
    /// native backend, not served on 1.34 (BackendUnavailable); a job that finished, with a
    /// PodGroup someone else made for it (StalePodGroups).
    async fn configuration(&mut self) {
        let (ns, pool) = (self.s.ns.clone(), self.pool.clone());
        let sp = Backend::SchedulerPlugins.ar();
        let pgs: Api<DynamicObject> = jobs::api(&self.s.client, &ns, &sp);
        let foreign = |name: &str, owner: Option<&DynamicObject>| {
            let mut pg = json!({"apiVersion": sp.api_version, "kind": "PodGroup",
                "metadata": {"name": name}, "spec": {"minMember": 1}});
            if let Some(o) = owner {
                pg["metadata"]["ownerReferences"] = json!([{"apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob", "name": o.name_any(), "uid": o.uid().unwrap(),
                    "controller": true}]);
            }
            serde_json::from_value::<DynamicObject>(pg).unwrap()
        };
        pgs.create(&PostParams::default(), &foreign("taken", None))
            .await
            .unwrap();
        self.s
            .create(&ns, Kind::PyTorchJob, &slot_job("taken", &pool, 1))
            .await;
        self.prom.wait_firing("PodgroupSyncConflicts").await;
        let mut native = slot_job("native", &pool, 1);
        native["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "kubernetes"});
        self.s.create(&ns, Kind::PyTorchJob, &native).await;
        self.prom
            .wait_firing("PodgroupSyncBackendUnavailable")
            .await;

        let done_pool = format!("{ns}-d");
        slot_node(&mut self.s, &done_pool, 1).await;
        let mut done = slot_job("done", &done_pool, 0);
        done["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"]
            [harness::SUCCEED_LABEL] = json!("true");
        done["spec"]["pytorchReplicaSpecs"]
            .as_object_mut()
            .unwrap()
            .remove("Worker");
        let done = self.s.create(&ns, Kind::PyTorchJob, &done).await;
        pgs.create(
            &PostParams::default(),
            &foreign("done-leftover", Some(&done)),
        )
        .await
        .unwrap();
        self.s
            .wait_job_condition(&ns, Kind::PyTorchJob, "done", "Succeeded")
            .await;
        self.prom.wait_firing("PodgroupSyncStalePodGroups").await;
    }

    /// A pod whose job is in no cache (AdmissionErrors); pods created while the webhook is not
    /// registered (PodsNotLinked); the serving certificate replaced by one that expires in 2
    /// days (WebhookCertificateExpiring); a replica whose certificate files do not exist
    /// (WebhookDown).
    async fn webhook(&mut self) {
        let (ns, pool) = (self.s.ns.clone(), self.pool.clone());
        let cluster = self.s.env.cluster;
        let ghost = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ghost-worker-0",
                "labels": {"training.kubeflow.org/job-name": "ghost",
                    "training.kubeflow.org/replica-type": "worker"},
                "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                    "name": "ghost", "uid": "00000000-0000-0000-0000-000000000001",
                    "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/never"}]}});
        let ghost: Pod = serde_json::from_value(ghost).unwrap();
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        for _ in 0..3 {
            Api::<Pod>::namespaced(self.s.client.clone(), &ns)
                .create(&dry, &ghost)
                .await
                .unwrap();
        }
        self.prom.wait_firing("PodgroupSyncAdmissionErrors").await;
        // Nothing so far was created unlinked by mistake (a conflicting job's pods are
        // unlinked on purpose and not reported).
        let firing = self.prom.firing();
        assert!(
            !firing
                .iter()
                .any(|a| a["labels"]["alertname"] == "PodgroupSyncPodsNotLinked"),
            "PodsNotLinked before any pod was created unlinked: {firing:?}"
        );
        cluster.kubectl_ok(&[
            "delete",
            "mutatingwebhookconfiguration",
            "podgroup-sync-alerts",
        ]);
        self.s
            .create(&ns, Kind::PyTorchJob, &slot_job("unlinked", &pool, 1))
            .await;
        self.prom.wait_firing("PodgroupSyncPodsNotLinked").await;
        cluster.kubectl_ok(&["apply", "-f", self.webhook_config.to_str().unwrap()]);

        webhook::certs_valid_for(&self.dir.join("certs"), "alerts-ca-2", 2);
        let a = Some(self.replicas[0].controller.addr);
        self.prom
            .wait_firing_on("PodgroupSyncWebhookCertificateExpiring", a)
            .await;
        let certs = webhook::certs_valid_for(&self.dir.join("certs-d"), "alerts-ca-d", 30);
        let mut no_cert = replica_args(&ns, "replica-d", free_port(), &certs);
        for a in no_cert.iter_mut() {
            if a.ends_with("tls.crt") {
                *a = self.dir.join("missing/tls.crt").display().to_string();
            }
        }
        // Spawned without waiting for /readyz: it has no certificate to serve.
        let no_cert: Vec<&str> = no_cert.iter().map(String::as_str).collect();
        let mut d = controller::spawn(cluster, None, &no_cert);
        let with_d = [targets(&self.replicas), vec![(d.addr, "pgs-d")]].concat();
        self.prom.set_targets(&with_d);
        self.prom
            .wait_firing_on("PodgroupSyncWebhookDown", Some(d.addr))
            .await;
        d.stop();
        self.prom.set_targets(&targets(&self.replicas));
    }

    /// A replica of its own ServiceAccount, which may read everything but write neither
    /// PodGroups nor Events, reaching the API server through a connection the scenario cuts:
    /// ReconcileErrors, EventsNotPublished, then CachesStale.
    async fn restricted_and_cut_off(&mut self) {
        let cluster = self.s.env.cluster;
        let client = self.s.client.clone();
        let c_ns = support::test_namespace(&client, "e2e-alerts-c", &[]).await;
        let c_key = "alerts-c.podgroup-sync.io/enabled";
        annotate(&client, &c_ns, c_key).await;
        let token = self.reader_token(&c_ns);
        let cut = Cuttable::to(api_server(cluster));
        let kubeconfig = self.dir.join("reader.kubeconfig");
        token_kubeconfig(cluster, cut.addr, &token, &kubeconfig);
        let c_args: Vec<String> = ["--annotation-key", c_key, "--instance", "alerts-c"]
            .map(String::from)
            .to_vec();
        self.replicas
            .push(start(cluster, Some(&kubeconfig), &c_args, "pgs-c"));
        self.prom.set_targets(&targets(&self.replicas));
        self.s
            .create(&c_ns, Kind::PyTorchJob, &slot_job("refused", &self.pool, 1))
            .await;
        let c = Some(self.replicas[2].controller.addr);
        self.prom
            .wait_firing_on("PodgroupSyncReconcileErrors", c)
            .await;
        // A job whose Event (InvalidBackend) the replica may not publish.
        let mut invalid = slot_job("invalid", &self.pool, 1);
        invalid["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "no-such-backend"});
        self.s.create(&c_ns, Kind::PyTorchJob, &invalid).await;
        self.prom
            .wait_firing("PodgroupSyncEventsNotPublished")
            .await;
        cut.cut.send(true).unwrap();
        self.prom.wait_firing_on("PodgroupSyncCachesStale", c).await;
        let mut c = self.replicas.pop().unwrap();
        c.controller.stop();
        self.prom.set_targets(&targets(&self.replicas));
        let _ = Api::<Namespace>::all(client)
            .delete(&c_ns, &DeleteParams::background())
            .await;
    }

    /// A ServiceAccount in `ns` that may read everything and write nothing; its token.
    fn reader_token(&self, ns: &str) -> String {
        let cluster = self.s.env.cluster;
        let role = format!("{ns}-reader");
        let rbac = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "reader", "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": role},
             "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": role},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
             "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]}]});
        let file = self.dir.join("reader.json");
        std::fs::write(&file, rbac.to_string()).unwrap();
        cluster.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
        cluster
            .kubectl_ok(&["create", "token", "reader", "-n", ns, "--duration=2h"])
            .trim()
            .to_string()
    }

    /// One replica of two stopped (InstanceDown); the Lease held by something that is no
    /// replica (NoLeader); all stopped (Down).
    async fn replicas_stop(&mut self) {
        let cluster = self.s.env.cluster;
        self.replicas[1].controller.stop();
        let b = Some(self.replicas[1].controller.addr);
        self.prom
            .wait_firing_on("PodgroupSyncInstanceDown", b)
            .await;
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "pgs-alerts", "namespace": self.s.ns},
            "spec": {"holderIdentity": "not-a-replica", "leaseDurationSeconds": 3600,
                "renewTime": micro_time_now()}});
        let file = self.dir.join("lease.json");
        std::fs::write(&file, lease.to_string()).unwrap();
        cluster.kubectl_ok(&["replace", "--force", "-f", file.to_str().unwrap()]);
        self.prom.wait_firing("PodgroupSyncNoLeader").await;
        for r in self.replicas.iter_mut() {
            r.controller.stop();
        }
        self.prom.wait_firing("PodgroupSyncDown").await;
    }
}

/// Now as a Kubernetes MicroTime (RFC 3339 with exactly six fractional digits).
fn micro_time_now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!("{}.000000Z", now.strftime("%Y-%m-%dT%H:%M:%S"))
}

/// The test API server's address, from the admin kubeconfig.
fn api_server(cluster: &support::Cluster) -> SocketAddr {
    let admin: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&cluster.kubeconfig).unwrap()).unwrap();
    let server = admin["clusters"][0]["cluster"]["server"].as_str().unwrap();
    server.trim_start_matches("https://").parse().unwrap()
}

/// Every expression of the dashboard's panels, its variables set as a user leaves them (all
/// namespaces and jobs, the 30 m latency window, a 1 m rate interval), returns a series.
fn dashboard_queries_return_series(prom: &Prometheus) {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/podgroup-sync.json"),
        )
        .unwrap(),
    )
    .unwrap();
    fn exprs(panel: &Value, out: &mut Vec<String>) {
        for t in panel["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push(e.to_string());
            }
        }
        for p in panel["panels"].as_array().into_iter().flatten() {
            exprs(p, out);
        }
    }
    let mut all = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        exprs(p, &mut all);
    }
    let mut empty = Vec::new();
    for e in &all {
        let q = e
            .replace("$namespace", ".*")
            .replace("$job", ".*")
            .replace("$__rate_interval", "1m")
            .replace("$window", "30m");
        if prom.query(&q).is_empty() {
            empty.push(e.clone());
        }
    }
    eprintln!(
        "[alerts] dashboard: {} of {} queries return a series",
        all.len() - empty.len(),
        all.len()
    );
    assert!(empty.is_empty(), "panels with no data: {empty:#?}");
}
