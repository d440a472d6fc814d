//! The pod-link webhook on a real control plane (SPEC §8): the real kube-apiserver calls the
//! controller's webhook over TLS on loopback for pods created the way training-operator and
//! mpi-operator create them.

mod support;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DynamicObject, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::controller::{self, Controller};
use support::jobs::{self, Backend, KINDS, Kind};
use support::webhook::{self as wh, Certs, link_of, operator_pod};
use tokio::sync::OnceCell;

/// The namespace label that the shared controller's webhook configuration selects.
const SHARED: &str = "pgs-webhook-shared";

struct Shared {
    controller: Mutex<Controller>,
    certs: Certs,
    port: u16,
}

static SHARED_SETUP: OnceCell<Shared> = OnceCell::const_new();

fn work_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("webhook-{name}-{}", std::process::id()))
}

/// A controller serving the webhook, and the configuration that sends it the pods of
/// namespaces labelled `podgroup-sync.test/webhook=<config>`.
async fn start_with_webhook(config: &str, extra: &[&str]) -> (Controller, Certs, u16) {
    let cluster = support::cluster().await;
    let certs = wh::certs(&work_dir(config), &format!("{config}-ca"));
    let port = controller::free_port();
    let mut args = wh::args(port, &certs);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = controller::start(cluster, None, &args);
    let client = cluster.client().await;
    wh::register(&client, &wh::configuration(config, port, &certs.ca_pem)).await;
    (c, certs, port)
}

async fn shared() -> Client {
    SHARED_SETUP
        .get_or_init(|| async {
            let (c, certs, port) =
                start_with_webhook(SHARED, &["--webhook-owner-wait-ms", "1500"]).await;
            Shared {
                controller: Mutex::new(c),
                certs,
                port,
            }
        })
        .await;
    support::cluster().await.client().await
}

fn shared_metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    let s = SHARED_SETUP.get().expect("set up");
    s.controller.lock().unwrap().metric(name, labels)
}

fn shared_log() -> String {
    SHARED_SETUP
        .get()
        .map(|s| s.controller.lock().unwrap().log_tail())
        .unwrap_or_default()
}

use wh::namespace;

const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");

fn backend_annotation(b: Backend) -> (&'static str, &'static str) {
    ("podgroup-sync.io/backend", b.name())
}

fn scheduler_of(b: Backend) -> &'static str {
    match b {
        Backend::SchedulerPlugins => "scheduler-plugins-scheduler",
        Backend::Volcano => "volcano",
        Backend::Kubernetes => "default-scheduler",
    }
}

/// Creates a job whose templates carry no link and no schedulerName.
async fn unlinked_job(client: &Client, ns: &str, kind: Kind, name: &str) -> DynamicObject {
    let manifest = wh::unlinked(jobs::job(kind, Backend::SchedulerPlugins, name, 2));
    jobs::create(client, ns, kind, &manifest).await
}

/// Creates the pod of `replica_type` the job's operator would create (the MPIJob launcher
/// through its batch/v1 Job).
async fn operator_creates_pod(
    client: &Client,
    ns: &str,
    kind: Kind,
    job: &DynamicObject,
    replica_type: &str,
) -> Pod {
    let launcher = if kind == Kind::MPIJob && replica_type == "Launcher" {
        Some(wh::launcher_job(client, ns, job).await)
    } else {
        None
    };
    wh::create_pod(
        client,
        ns,
        &operator_pod(kind, job, replica_type, launcher.as_ref()),
    )
    .await
}

#[tokio::test]
async fn rule_8_pods_of_every_kind_and_backend_get_the_link_and_the_backends_scheduler() {
    let client = shared().await;
    for backend in [Backend::SchedulerPlugins, Backend::Volcano] {
        let ns = namespace(&client, SHARED, &[ENABLED, backend_annotation(backend)]).await;
        for kind in KINDS {
            let name = format!("{}-job", kind.ar().plural.trim_end_matches('s'));
            let job = unlinked_job(&client, &ns, kind, &name).await;
            for replica_type in kind.head().into_iter().chain(["Worker"]) {
                let pod = operator_creates_pod(&client, &ns, kind, &job, replica_type).await;
                assert_eq!(
                    link_of(&pod, backend),
                    (Some(name.clone()), Some(scheduler_of(backend).to_string())),
                    "{kind:?} {replica_type} pod on {backend:?}\n{}",
                    shared_log()
                );
            }
            // The pods name the PodGroup the controller makes.
            jobs::wait_pg(&client, &ns, backend, &name, "created", |_| true).await;
        }
    }
    for b in ["scheduler-plugins", "volcano"] {
        assert!(
            shared_metric(
                "podgroup_sync_admissions_total",
                &[("result", "linked"), ("reason", b)]
            ) >= 11.0
        );
    }
}

#[tokio::test]
async fn rule_8_pods_that_are_not_ours_to_link_are_admitted_unchanged() {
    let client = shared().await;
    let unchanged = |pod: &Pod, what: &str| {
        // The API server defaults the schedulerName; nothing else is set.
        assert_eq!(
            link_of(pod, Backend::SchedulerPlugins),
            (None, Some("default-scheduler".into())),
            "{what}\n{}",
            shared_log()
        );
        assert_eq!(link_of(pod, Backend::Volcano).0, None, "{what}");
    };
    let dry = namespace(&client, SHARED, &[("podgroup-sync.io/enabled", "dry-run")]).await;
    let job = unlinked_job(&client, &dry, Kind::PyTorchJob, "dry").await;
    unchanged(
        &operator_creates_pod(&client, &dry, Kind::PyTorchJob, &job, "Worker").await,
        "dry-run namespace",
    );
    let off = namespace(&client, SHARED, &[]).await;
    let job = unlinked_job(&client, &off, Kind::PyTorchJob, "off").await;
    unchanged(
        &operator_creates_pod(&client, &off, Kind::PyTorchJob, &job, "Worker").await,
        "namespace not enabled",
    );

    let on = namespace(&client, SHARED, &[ENABLED]).await;
    let mut manifest = wh::unlinked(jobs::job(
        Kind::PyTorchJob,
        Backend::SchedulerPlugins,
        "opted-out",
        2,
    ));
    manifest["metadata"]["annotations"] = json!({"podgroup-sync.io/enabled": "false"});
    let job = jobs::create(&client, &on, Kind::PyTorchJob, &manifest).await;
    unchanged(
        &operator_creates_pod(&client, &on, Kind::PyTorchJob, &job, "Worker").await,
        "opted-out job",
    );

    // A job whose Volcano queue name is no valid name gets no PodGroup (the planner reports
    // InvalidSpec): its pods are not linked to one that never comes.
    let mut manifest = wh::unlinked(jobs::job(
        Kind::PyTorchJob,
        Backend::Volcano,
        "bad-queue",
        2,
    ));
    manifest["metadata"]["annotations"] = json!({"podgroup-sync.io/backend": "volcano"});
    manifest["spec"]["runPolicy"] = json!({"schedulingPolicy": {"queue": "Bad_Queue"}});
    let job = jobs::create(&client, &on, Kind::PyTorchJob, &manifest).await;
    let before = shared_metric(
        "podgroup_sync_admissions_total",
        &[("result", "skipped"), ("reason", "invalid_job")],
    );
    unchanged(
        &operator_creates_pod(&client, &on, Kind::PyTorchJob, &job, "Worker").await,
        "a job on an invalid Volcano queue name",
    );
    let after = shared_metric(
        "podgroup_sync_admissions_total",
        &[("result", "skipped"), ("reason", "invalid_job")],
    );
    assert_eq!(after, before + 1.0);
    jobs::wait_event(&client, &on, "bad-queue", "InvalidSpec").await;

    // A pod with the operators' label whose controller is not a job.
    let cm: ConfigMap = Api::namespaced(client.clone(), &on)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let foreign: Pod = serde_json::from_value(json!({"metadata": {"generateName": "foreign-",
        "labels": {"training.kubeflow.org/job-name": "owner"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": cm.uid().unwrap(), "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})).unwrap();
    unchanged(
        &wh::create_pod(&client, &on, &foreign).await,
        "pod of another owner",
    );

    // A pod that carries a link and a schedulerName of its own keeps both.
    let mut manifest = jobs::job(Kind::PyTorchJob, Backend::SchedulerPlugins, "own-link", 2);
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"] =
        json!({"labels": {"scheduling.x-k8s.io/pod-group": "own-link"}});
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["schedulerName"] =
        json!("my-scheduler");
    let job = jobs::create(&client, &on, Kind::PyTorchJob, &manifest).await;
    let pod = operator_creates_pod(&client, &on, Kind::PyTorchJob, &job, "Worker").await;
    assert_eq!(
        link_of(&pod, Backend::SchedulerPlugins),
        (Some("own-link".into()), Some("my-scheduler".into()))
    );

    // The launcher of an MPIJob that waits for its workers is outside the gang; its workers
    // are linked.
    let mut manifest = wh::unlinked(jobs::job(
        Kind::MPIJob,
        Backend::SchedulerPlugins,
        "wait",
        2,
    ));
    manifest["spec"]["launcherCreationPolicy"] = json!("WaitForWorkersReady");
    let job = jobs::create(&client, &on, Kind::MPIJob, &manifest).await;
    unchanged(
        &operator_creates_pod(&client, &on, Kind::MPIJob, &job, "Launcher").await,
        "launcher outside the gang",
    );
    let worker = operator_creates_pod(&client, &on, Kind::MPIJob, &job, "Worker").await;
    assert_eq!(
        link_of(&worker, Backend::SchedulerPlugins).0.as_deref(),
        Some("wait")
    );

    for reason in [
        "namespace_dry_run",
        "namespace_off",
        "opted_out",
        "foreign_owner",
        "launcher_outside_gang",
    ] {
        assert!(
            shared_metric(
                "podgroup_sync_admissions_total",
                &[("result", "skipped"), ("reason", reason)]
            ) >= 1.0,
            "{reason}"
        );
    }
    assert!(shared_metric("podgroup_sync_admissions_total", &[("result", "unchanged")]) >= 1.0);
}

#[tokio::test]
async fn rule_8_a_pod_right_after_its_job_is_linked_and_one_whose_job_never_comes_is_counted() {
    let client = shared().await;
    let ns = namespace(&client, SHARED, &[ENABLED]).await;
    // The operator's pod follows the job at once: the admission waits for our cache.
    let job = unlinked_job(&client, &ns, Kind::TFJob, "fresh").await;
    let pod = operator_creates_pod(&client, &ns, Kind::TFJob, &job, "PS").await;
    assert_eq!(
        link_of(&pod, Backend::SchedulerPlugins).0.as_deref(),
        Some("fresh"),
        "{}",
        shared_log()
    );

    // A pod whose job never reaches the cache is admitted unlinked after the wait, logged and
    // counted: never held past the API server's timeout, never rejected.
    let before = shared_metric(
        "podgroup_sync_admissions_total",
        &[("result", "error"), ("reason", "owner_not_cached")],
    );
    let ghost: Pod = serde_json::from_value(json!({"metadata": {"generateName": "ghost-",
        "labels": {"training.kubeflow.org/job-name": "ghost"},
        "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "ghost",
            "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
    .unwrap();
    let start = Instant::now();
    let pod = wh::create_pod(&client, &ns, &ghost).await;
    let took = start.elapsed();
    assert_eq!(
        link_of(&pod, Backend::SchedulerPlugins),
        (None, Some("default-scheduler".into()))
    );
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let after = shared_metric(
        "podgroup_sync_admissions_total",
        &[("result", "error"), ("reason", "owner_not_cached")],
    );
    assert_eq!(after, before + 1.0);
    assert!(
        shared_log().contains("its job is not in the cache"),
        "{}",
        shared_log()
    );

    // A pod naming the cached job but another UID (stale or forged): answered after a short
    // look, unlinked, counted as skipped — not an error, and no owner-wait.
    let before = shared_metric(
        "podgroup_sync_admissions_total",
        &[("result", "skipped"), ("reason", "owner_uid_mismatch")],
    );
    let mut forged = operator_pod(Kind::TFJob, &job, "PS", None);
    for r in forged.metadata.owner_references.iter_mut().flatten() {
        r.uid = "00000000-0000-0000-0000-000000000002".into();
    }
    let start = Instant::now();
    let pod = wh::create_pod(&client, &ns, &forged).await;
    let took = start.elapsed();
    assert_eq!(link_of(&pod, Backend::SchedulerPlugins).0, None);
    assert!(took < Duration::from_millis(1000), "{took:?}");
    let after = shared_metric(
        "podgroup_sync_admissions_total",
        &[("result", "skipped"), ("reason", "owner_uid_mismatch")],
    );
    assert_eq!(after, before + 1.0);
}

#[tokio::test]
async fn rule_8_a_certificate_rotated_on_disk_is_served_without_restart() {
    const CONFIG: &str = "pgs-webhook-rotation";
    let key = "podgroup-sync.test/rotation";
    let (mut c, certs, port) = start_with_webhook(
        CONFIG,
        &["--annotation-key", key, "--default-backend", "volcano"],
    )
    .await;
    let client = support::cluster().await.client().await;
    let ns = namespace(&client, CONFIG, &[(key, "true")]).await;
    let job = unlinked_job(&client, &ns, Kind::PyTorchJob, "rotate").await;
    let linked = |pod: &Pod| link_of(pod, Backend::Volcano).0.is_some();
    let pid = c.child.id();
    assert!(
        linked(&operator_creates_pod(&client, &ns, Kind::PyTorchJob, &job, "Worker").await),
        "{}",
        c.log_tail()
    );

    // A new CA and certificate on disk, and the configuration trusting only the new CA (as
    // cert-manager's CA injection does): pods are linked again once the new one is served.
    let rotated = wh::certs(&certs.dir, "rotated-ca");
    wh::register(&client, &wh::configuration(CONFIG, port, &rotated.ca_pem)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pod = operator_creates_pod(&client, &ns, Kind::PyTorchJob, &job, "Worker").await;
        if linked(&pod) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rotated certificate is not served\n{}",
            c.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(c.child.id(), pid);
    assert!(c.child.try_wait().unwrap().is_none(), "no restart");
    assert_eq!(
        c.metric(
            "podgroup_sync_webhook_certificate_reloads_total",
            &[("result", "ok")]
        ),
        2.0
    );
    assert_eq!(
        c.metric("podgroup_sync_webhook_certificate_loaded", &[]),
        1.0
    );
    // The certificates are made for 2 days: the expiry gauge says when the served one ends.
    let expiry = c.metric(
        "podgroup_sync_webhook_certificate_expiry_timestamp_seconds",
        &[],
    );
    let now = k8s_openapi::jiff::Timestamp::now().as_second() as f64;
    let left = expiry - now;
    assert!(
        (86_400.0 * 1.9..=86_400.0 * 2.0 + 60.0).contains(&left),
        "expiry {expiry}: {left} s from now"
    );
    c.stop();
}

/// The certificate the controller manages itself (`--webhook-cert-secret`): made in an empty
/// Secret, its CA written into the configuration's caBundle, renewed at two thirds of its life
/// (30 s here, the shortest allowed) while a pod is created every 100 ms — not one of them unlinked — and the caBundle
/// unchanged by the renewal.
#[tokio::test]
async fn rule_8_a_certificate_the_controller_manages_is_renewed_with_no_pod_left_unlinked() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;
    const CONFIG: &str = "pgs-webhook-managed";
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let secret_ns = support::test_namespace(&client, "managed-cert", &[]).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &secret_ns);
    let empty: Secret =
        serde_json::from_value(json!({"metadata": {"name": "webhook-tls"}})).unwrap();
    secrets
        .create(&PostParams::default(), &empty)
        .await
        .expect("Secret");
    let port = controller::free_port();
    let secret = format!("{secret_ns}/webhook-tls");
    let mut args = wh::managed_args(port, &secret, CONFIG, "127.0.0.1,localhost");
    args.extend(
        [
            "--webhook-cert-validity-seconds",
            "30",
            "--annotation-key",
            "podgroup-sync.test/managed",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = controller::start(cluster, None, &args);
    // Registered with no caBundle: the controller writes it.
    wh::register(&client, &wh::configuration(CONFIG, port, "")).await;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let bundle = || async {
        let config = configs.get(CONFIG).await.ok()?;
        let b = config.webhooks?.first()?.client_config.ca_bundle.clone()?;
        (!b.0.is_empty()).then_some(b.0)
    };
    let first_bundle =
        support::wait_for("the caBundle written", Duration::from_secs(30), || async {
            bundle().await
        })
        .await;
    assert!(String::from_utf8_lossy(&first_bundle).contains("BEGIN CERTIFICATE"));
    let ns = namespace(
        &client,
        CONFIG,
        &[("podgroup-sync.test/managed", "true"), ENABLED],
    )
    .await;
    let job = unlinked_job(&client, &ns, Kind::PyTorchJob, "managed").await;
    // 25 s of pods, one every 100 ms, across the renewal at 20 s.
    let start = Instant::now();
    let (mut pods, mut unlinked) = (0, Vec::new());
    while start.elapsed() < Duration::from_secs(25) {
        let pod = operator_creates_pod(&client, &ns, Kind::PyTorchJob, &job, "Worker").await;
        pods += 1;
        if link_of(&pod, Backend::SchedulerPlugins).0.as_deref() != Some("managed") {
            unlinked.push(pod.name_any());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reloads = c.metric(
        "podgroup_sync_webhook_certificate_reloads_total",
        &[("result", "ok")],
    );
    println!(
        "figure: managed certificate: {pods} pods over 25 s, {} unlinked; {reloads} certificates served (first + renewals)",
        unlinked.len()
    );
    assert!(
        unlinked.is_empty(),
        "unlinked: {unlinked:?}\n{}",
        c.log_tail()
    );
    assert!(
        reloads >= 2.0,
        "no renewal served: {reloads}\n{}",
        c.log_tail()
    );
    assert_eq!(
        bundle().await,
        Some(first_bundle),
        "the renewal left the caBundle alone"
    );
    let stored = secrets
        .get("webhook-tls")
        .await
        .unwrap()
        .data
        .unwrap_or_default();
    for key in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(stored.contains_key(key), "{key} in the Secret");
    }
    c.stop();
}

#[tokio::test]
async fn rule_8_with_the_webhook_stopped_pods_are_created_and_the_job_is_told() {
    const CONFIG: &str = "pgs-webhook-stopped";
    let key = "podgroup-sync.test/stopped";
    let (mut c, _certs, _) = start_with_webhook(CONFIG, &["--annotation-key", key]).await;
    // The shared controller stands for the leader that keeps running while the replica the
    // API server calls is gone.
    let client = shared().await;
    let ns = namespace(&client, CONFIG, &[(key, "true"), ENABLED]).await;
    let job = unlinked_job(&client, &ns, Kind::PyTorchJob, "stopped").await;
    let linked = operator_creates_pod(&client, &ns, Kind::PyTorchJob, &job, "Master").await;
    assert_eq!(
        link_of(&linked, Backend::SchedulerPlugins).0.as_deref(),
        Some("stopped"),
        "{}",
        c.log_tail()
    );
    // Beside the link, the marker that keeps linked pods out of the unlinked pods' watch (the
    // API server filters them out); the pods below have none, and the watch still sees them.
    assert_eq!(
        linked
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("podgroup-sync.io/linked"))
            .map(String::as_str),
        Some("scheduler-plugins")
    );
    c.stop();

    let start = Instant::now();
    let pod = operator_creates_pod(&client, &ns, Kind::PyTorchJob, &job, "Worker").await;
    assert_eq!(
        link_of(&pod, Backend::SchedulerPlugins).0,
        None,
        "failurePolicy Ignore admits it unchanged"
    );
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    let event = jobs::wait_event(&client, &ns, "stopped", "PodsNotLinked").await;
    let note = event.note.clone().unwrap_or_default();
    assert!(note.contains("link to PodGroup stopped"), "{note}");
    assert!(
        note.contains("training.kubeflow.org/job-name=stopped"),
        "{note}"
    );
    assert!(event.series.is_none(), "one pod: {:?}", event.series);

    // 199 more pods come unlinked: the same Event counts them, no new Event per pod.
    const PODS: i32 = 200;
    for _ in 1..PODS {
        operator_creates_pod(&client, &ns, Kind::PyTorchJob, &job, "Worker").await;
    }
    let counted = support::wait_for(
        "the PodsNotLinked Event counting 200 pods",
        Duration::from_secs(60),
        || async {
            let events = jobs::events(&client, &ns, "stopped", "PodsNotLinked").await;
            let count = events
                .iter()
                .filter_map(|e| e.series.as_ref().map(|s| s.count))
                .max();
            (count == Some(PODS)).then_some(events)
        },
    )
    .await;
    println!(
        "figure: {PODS} unlinked pods of one job: {} PodsNotLinked Event object(s)",
        counted.len()
    );
    assert!(counted.len() <= 2, "{} Event objects", counted.len());
}

#[tokio::test]
async fn rule_8_a_dry_run_create_is_linked_the_same_and_leaves_nothing_behind() {
    let client = shared().await;
    let ns = namespace(&client, SHARED, &[ENABLED]).await;
    let job = unlinked_job(&client, &ns, Kind::PyTorchJob, "dry-create").await;
    let pod = operator_pod(Kind::PyTorchJob, &job, "Worker", None);
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let answered = wh::dry_run_create(&client, &ns, &pod).await;
    assert_eq!(
        link_of(&answered, Backend::SchedulerPlugins),
        (
            Some("dry-create".into()),
            Some("scheduler-plugins-scheduler".into())
        )
    );
    assert!(
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing was created"
    );
}

/// POSTs `body` to the shared webhook with curl (trusting the test CA); (status, body).
fn post(body_file: &std::path::Path) -> (u16, String) {
    let s = SHARED_SETUP.get().expect("set up");
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "--cacert",
        ])
        .arg(s.certs.dir.join("ca.crt"))
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{}", body_file.display()))
        .arg(format!("https://127.0.0.1:{}/pod-link", s.port))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[tokio::test]
async fn rule_8_bad_requests_get_a_clear_answer_and_are_counted() {
    let _client = shared().await;
    let dir = work_dir("bad-requests");
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, content: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        p
    };
    let count = |reason: &str| {
        shared_metric(
            "podgroup_sync_admissions_total",
            &[("result", "error"), ("reason", reason)],
        )
    };

    let before = count("malformed_review");
    let (code, body) = post(&file("garbage.json", b"{\"apiVersion\": 7"));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("not an AdmissionReview"), "{body}");
    assert_eq!(count("malformed_review"), before + 1.0);

    // Larger than any pod the API server stores: refused before it is parsed.
    let before = count("request_too_large");
    let (code, body) = post(&file("huge.json", &vec![b' '; 5 * 1024 * 1024]));
    assert_eq!(code, 413, "{body}");
    assert_eq!(count("request_too_large"), before + 1.0);

    // A pod without an owner: allowed, nothing added.
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "namespace": "default", "object": {"metadata": {"name": "p"}, "spec": {"containers": []}}}});
    let (code, body) = post(&file("orphan.json", review.to_string().as_bytes()));
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"], json!({"uid": "u-1", "allowed": true}));

    // A pod whose metadata is not an object's: allowed with a warning, counted.
    let before = count("malformed_pod");
    let mut bad = review.clone();
    bad["request"]["object"]["metadata"]["labels"] = json!(["not", "a", "map"]);
    let (code, body) = post(&file("bad-pod.json", bad.to_string().as_bytes()));
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    assert!(
        answer["response"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("pod metadata"),
        "{body}"
    );
    assert_eq!(count("malformed_pod"), before + 1.0);
}

#[tokio::test]
async fn rule_8_a_pod_near_the_size_limit_is_linked() {
    let client = shared().await;
    let ns = namespace(&client, SHARED, &[ENABLED]).await;
    let job = unlinked_job(&client, &ns, Kind::PyTorchJob, "big").await;
    let mut pod = operator_pod(Kind::PyTorchJob, &job, "Worker", None);
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("example.com/blob".into(), "x".repeat(200 * 1024));
    let created = wh::create_pod(&client, &ns, &pod).await;
    assert_eq!(
        link_of(&created, Backend::SchedulerPlugins).0.as_deref(),
        Some("big")
    );
}
