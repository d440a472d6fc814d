//! CRDs that are missing at start-up, and CRDs that change, are picked up without a restart
//! (SPEC §1): the controller serves what exists, says so, and follows the API server.
//! This binary changes cluster-wide CRDs, so it has its own control plane and runs one test.

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::jobs::{self, Backend, Kind, wait_pg};

fn crds_dir(cluster: &support::Cluster) -> PathBuf {
    let env = cluster
        .work_dir
        .as_ref()
        .expect("a control plane of this test binary")
        .join("env");
    let out = Command::new("bash")
        .args(["-c", r#"source "$1" && printf %s "$CRDS""#, "bash"])
        .arg(env)
        .output()
        .expect("read env");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn delete_crd(cluster: &support::Cluster, name: &str) {
    cluster.kubectl_ok(&["delete", "crd", name, "--wait=true", "--timeout=120s"]);
}

async fn apply_crd(cluster: &support::Cluster, file: &std::path::Path, name: &str) {
    cluster.kubectl_ok(&["apply", "--server-side", "-f", file.to_str().unwrap()]);
    // `kubectl wait` fails outright while the new CRD has no status yet: poll instead.
    let path = r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#;
    support::wait_for(&format!("CRD {name} Established"), jobs::WAIT, || async {
        let out = cluster.kubectl(&["get", "crd", name, "-o", path]);
        (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
    })
    .await;
}

#[tokio::test]
async fn missing_crds_are_reported_and_picked_up_when_they_appear() {
    assert!(
        std::env::var_os("PGS_KUBECONFIG").is_none(),
        "this test changes cluster-wide CRDs: it needs a control plane of its own"
    );
    let cluster = support::cluster().await;
    let crds = crds_dir(cluster);
    // Start without Volcano, without PyTorchJob, and with no MPIJob at all.
    delete_crd(cluster, "podgroups.scheduling.volcano.sh");
    delete_crd(cluster, "pytorchjobs.kubeflow.org");
    delete_crd(cluster, "mpijobs.kubeflow.org");

    let ctrl = support::controller::start(cluster, None, &[]);
    let client = cluster.client().await;
    let ns = support::test_namespace(
        &client,
        "discovery",
        &[("podgroup-sync.io/enabled", "true")],
    )
    .await;
    assert_eq!(
        ctrl.metric("podgroup_sync_backend_served", &[("backend", "volcano")]),
        0.0
    );
    assert_eq!(
        ctrl.metric(
            "podgroup_sync_backend_served",
            &[("backend", "scheduler-plugins")]
        ),
        1.0
    );
    assert_eq!(
        ctrl.metric(
            "podgroup_sync_watched_kinds",
            &[("kind", "PyTorchJob"), ("served", "false")]
        ),
        1.0
    );
    let log = std::fs::read_to_string(&ctrl.log).unwrap_or_default();
    assert!(log.contains("PodGroup CRD not served"), "{log}");
    assert!(log.contains("CRD not served; skipped until it is"), "{log}");

    // A TFJob that wants Volcano: a Warning Event, a metric, and no crash.
    jobs::create(
        &client,
        &ns,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, Backend::Volcano, "wants-volcano", 1),
    )
    .await;
    let ev = jobs::wait_event(&client, &ns, "wants-volcano", "BackendUnavailable").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert!(
        ctrl.metric(
            "podgroup_sync_backend_unavailable_total",
            &[("backend", "volcano")]
        ) >= 1.0
    );

    // The native backend on a 1.34 API server: reported the same way, with what serves it.
    assert_eq!(
        ctrl.metric("podgroup_sync_backend_served", &[("backend", "kubernetes")]),
        0.0
    );
    jobs::create(
        &client,
        &ns,
        Kind::TFJob,
        &jobs::job(Kind::TFJob, Backend::Kubernetes, "wants-native", 1),
    )
    .await;
    let ev = jobs::wait_event(&client, &ns, "wants-native", "BackendUnavailable").await;
    let note = ev.note.unwrap_or_default();
    assert!(note.contains("GenericWorkload"), "{note}");

    // Volcano appears: the waiting job gets its PodGroup, without a restart.
    apply_crd(
        cluster,
        &crds.join("volcano/scheduling.volcano.sh_podgroups.yaml"),
        "podgroups.scheduling.volcano.sh",
    )
    .await;
    wait_pg(
        &client,
        &ns,
        Backend::Volcano,
        "wants-volcano",
        "created once Volcano is served",
        |_| true,
    )
    .await;

    // PyTorchJob appears.
    apply_crd(
        cluster,
        &crds.join("training-operator/kubeflow.org_pytorchjobs.yaml"),
        "pytorchjobs.kubeflow.org",
    )
    .await;
    support::wait_for("PyTorchJob watched", jobs::WAIT, || async {
        (ctrl.metric(
            "podgroup_sync_watched_kinds",
            &[("kind", "PyTorchJob"), ("served", "true")],
        ) == 1.0)
            .then_some(())
    })
    .await;
    jobs::create(
        &client,
        &ns,
        Kind::PyTorchJob,
        &jobs::job(Kind::PyTorchJob, Backend::SchedulerPlugins, "late", 2),
    )
    .await;
    wait_pg(
        &client,
        &ns,
        Backend::SchedulerPlugins,
        "late",
        "created for a kind served late",
        |_| true,
    )
    .await;

    // The cluster serves training-operator's MPIJob kubeflow.org/v1: that version is watched.
    apply_crd(
        cluster,
        &crds.join("training-operator/kubeflow.org_mpijobs.yaml"),
        "mpijobs.kubeflow.org",
    )
    .await;
    support::wait_for("MPIJob v1 watched", jobs::WAIT, || async {
        (ctrl.metric(
            "podgroup_sync_watched_kinds",
            &[("kind", "MPIJob"), ("version", "v1"), ("served", "true")],
        ) == 1.0)
            .then_some(())
    })
    .await;
    jobs::create(
        &client,
        &ns,
        Kind::MPIJobV1,
        &jobs::job(Kind::MPIJobV1, Backend::SchedulerPlugins, "mpi-v1", 2),
    )
    .await;
    let pg = wait_pg(
        &client,
        &ns,
        Backend::SchedulerPlugins,
        "mpi-v1",
        "created for MPIJob v1",
        |_| true,
    )
    .await;
    // MPIJob v1: launcher + workers, like every other replica type (SPEC §3.1.5).
    assert_eq!(
        jobs::spec(&pg),
        jobs::expected_spec(Backend::SchedulerPlugins, 2)
    );
    assert_eq!(
        pg.metadata.owner_references.as_ref().unwrap()[0].api_version,
        "kubeflow.org/v1"
    );
}
