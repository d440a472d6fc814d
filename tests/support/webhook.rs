//! The pod-link webhook on the test control plane: certificates made with openssl, a
//! MutatingWebhookConfiguration that makes the real kube-apiserver call the controller on
//! loopback, and pods created the way training-operator and mpi-operator create them.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::batch::v1::Job as BatchJob;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::jobs::{Backend, Kind};

/// A serving certificate for 127.0.0.1 and the CA that signed it, as files in `dir`.
pub struct Certs {
    pub dir: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca_pem: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    super::stdout_of(Command::new("openssl").current_dir(dir).args(args));
}

/// A fresh CA named `ca_name` and a serving certificate for 127.0.0.1 signed by it, written as
/// `tls.crt`/`tls.key` in `dir` (replacing any there: a rotation).
pub fn certs(dir: &Path, ca_name: &str) -> Certs {
    certs_valid_for(dir, ca_name, 2)
}

/// [`certs`] valid for `days` days.
pub fn certs_valid_for(dir: &Path, ca_name: &str, days: u32) -> Certs {
    let days = days.to_string();
    let days = days.as_str();
    std::fs::create_dir_all(dir).unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let ca_subject = format!("/CN={ca_name}");
    let mut ca_args = vec!["req", "-x509", "-days", days, "-subj", &ca_subject];
    ca_args.extend(ec);
    ca_args.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
    openssl(dir, &ca_args);
    let mut csr_args = vec!["req", "-new", "-subj", "/CN=podgroup-sync-webhook"];
    csr_args.extend(ec);
    csr_args.extend(["-keyout", "next.key", "-out", "next.csr"]);
    openssl(dir, &csr_args);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "next.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            days,
            "-extfile",
            "san.ext",
            "-out",
            "next.crt",
        ],
    );
    // Key first, then the certificate: each file is replaced whole (rename), as a kubelet
    // updates a Secret volume.
    std::fs::rename(dir.join("next.key"), dir.join("tls.key")).unwrap();
    std::fs::rename(dir.join("next.crt"), dir.join("tls.crt")).unwrap();
    Certs {
        dir: dir.to_path_buf(),
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        ca_pem: std::fs::read_to_string(dir.join("ca.crt")).unwrap(),
    }
}

/// The controller flags that serve the webhook on `port` with `certs`.
pub fn args(port: u16, certs: &Certs) -> Vec<String> {
    vec![
        "--webhook".into(),
        "--webhook-addr".into(),
        format!("127.0.0.1:{port}"),
        "--webhook-cert-file".into(),
        certs.cert.display().to_string(),
        "--webhook-key-file".into(),
        certs.key.display().to_string(),
        // Tests stop these processes often; the node tier runs the chart's default.
        "--webhook-drain-seconds=1".into(),
    ]
}

/// The controller flags that serve the webhook on `port` with the certificate it manages in
/// Secret `secret` (NAMESPACE/NAME) for `hosts`, writing the caBundle of `configuration`.
pub fn managed_args(port: u16, secret: &str, configuration: &str, hosts: &str) -> Vec<String> {
    [
        "--webhook",
        "--webhook-addr",
        &format!("127.0.0.1:{port}"),
        "--webhook-cert-secret",
        secret,
        "--webhook-configuration",
        configuration,
        "--webhook-cert-hosts",
        hosts,
        "--webhook-drain-seconds=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The configuration the chart renders, reaching the webhook by URL on loopback: Pod CREATE,
/// failurePolicy Ignore, only pods with the operators' job-name label, and only namespaces
/// labelled `podgroup-sync.test/webhook=<name>` (tests of one binary share a control plane).
pub fn configuration(name: &str, port: u16, ca_pem: &str) -> MutatingWebhookConfiguration {
    let mut config = configuration_json(name, port, ca_pem);
    config["webhooks"][0]["namespaceSelector"] =
        json!({"matchLabels": {"podgroup-sync.test/webhook": name}});
    serde_json::from_value(config).expect("configuration")
}

/// The configuration for every namespace.
pub fn configuration_json(name: &str, port: u16, ca_pem: &str) -> Value {
    use base64::Engine;
    let mut config = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "pod-link.podgroup-sync.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/pod-link"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
            },
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods"], "scope": "Namespaced"}],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "reinvocationPolicy": "IfNeeded",
            "objectSelector": {"matchExpressions": [
                {"key": "training.kubeflow.org/job-name", "operator": "Exists"}]},
        }],
    });
    // One more entry per workload operator's pod label, as the chart registers them.
    let first = config["webhooks"][0].clone();
    for (name, label) in [
        ("jobset", "jobset.sigs.k8s.io/jobset-name"),
        ("lws", "leaderworkerset.sigs.k8s.io/name"),
        ("ray", "ray.io/cluster"),
    ] {
        let mut hook = first.clone();
        hook["name"] = json!(format!("{name}.pod-link.podgroup-sync.io"));
        hook["objectSelector"] =
            json!({"matchExpressions": [{"key": label, "operator": "Exists"}]});
        config["webhooks"].as_array_mut().unwrap().push(hook);
    }
    config
}

/// A namespace the webhook configuration `config` selects, with these annotations.
pub async fn namespace(client: &Client, config: &str, annotations: &[(&str, &str)]) -> String {
    let mut ns = super::namespace("", annotations);
    ns.metadata.name = None;
    ns.metadata.generate_name = Some("webhook-".into());
    ns.metadata.labels = Some(std::collections::BTreeMap::from([(
        "podgroup-sync.test/webhook".to_string(),
        config.to_string(),
    )]));
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace")
        .name_any()
}

/// Creates or replaces the configuration.
pub async fn register(client: &Client, config: &MutatingWebhookConfiguration) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let _ = api
        .delete(&config.name_any(), &DeleteParams::default())
        .await;
    api.create(&PostParams::default(), config)
        .await
        .expect("create MutatingWebhookConfiguration");
}

/// The labels an operator puts on the pods of replica type `replica_type` of job `job`.
fn operator_labels(kind: Kind, job: &str, replica_type: &str) -> Value {
    match kind {
        Kind::MPIJob => json!({
            "training.kubeflow.org/operator-name": "mpi-operator",
            "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/job-role": replica_type.to_ascii_lowercase(),
        }),
        _ => json!({
            "training.kubeflow.org/operator-name": format!("{}-controller", kind.ar().kind.to_ascii_lowercase()),
            "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/replica-type": replica_type.to_ascii_lowercase(),
            "training.kubeflow.org/replica-index": "0",
        }),
    }
}

/// A pod of `replica_type` of `job`, made from the job's template the way its operator makes
/// it: the template's metadata and spec, the operator's labels, a controller reference to the
/// job (or, for the mpi-operator launcher, to the batch/v1 Job `launcher` made for it).
pub fn operator_pod(
    kind: Kind,
    job: &DynamicObject,
    replica_type: &str,
    launcher: Option<&BatchJob>,
) -> Pod {
    let name = job.name_any();
    let template = job.data["spec"][kind.specs_field()][replica_type]["template"].clone();
    let mut metadata = template.get("metadata").cloned().unwrap_or(json!({}));
    let labels = metadata["labels"].as_object().cloned().unwrap_or_default();
    let mut all = operator_labels(kind, &name, replica_type);
    for (k, v) in labels {
        all[k] = v;
    }
    metadata["labels"] = all;
    metadata["generateName"] = json!(format!("{name}-{}-", replica_type.to_ascii_lowercase()));
    let owner = match launcher {
        Some(l) => json!({"apiVersion": "batch/v1", "kind": "Job", "name": l.name_any(),
            "uid": l.uid().unwrap(), "controller": true, "blockOwnerDeletion": true}),
        None => json!({"apiVersion": job.types.as_ref().unwrap().api_version,
            "kind": job.types.as_ref().unwrap().kind, "name": name, "uid": job.uid().unwrap(),
            "controller": true, "blockOwnerDeletion": true}),
    };
    metadata["ownerReferences"] = json!([owner]);
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": template["spec"]}),
    )
    .expect("pod")
}

/// mpi-operator's batch/v1 Job for an MPIJob's launcher (suspended: the test makes its pod).
pub async fn launcher_job(client: &Client, ns: &str, mpijob: &DynamicObject) -> BatchJob {
    let job: BatchJob = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": format!("{}-launcher", mpijob.name_any()),
            "labels": {"app": mpijob.name_any()},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                "name": mpijob.name_any(), "uid": mpijob.uid().unwrap(), "controller": true,
                "blockOwnerDeletion": true}]},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "launcher", "image": "busybox"}]}}},
    }))
    .unwrap();
    Api::<BatchJob>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &job)
        .await
        .expect("create the launcher Job")
}

pub async fn create_pod(client: &Client, ns: &str, pod: &Pod) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), pod)
        .await
        .expect("create pod")
}

/// A dry-run create of `pod`: what the API server (and every admission webhook) would store.
pub async fn dry_run_create(client: &Client, ns: &str, pod: &Pod) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            pod,
        )
        .await
        .expect("dry-run create")
}

/// The pod's link for `backend` (label or annotation) and its schedulerName.
pub fn link_of(pod: &Pod, backend: Backend) -> (Option<String>, Option<String>) {
    let link = match backend {
        Backend::SchedulerPlugins => pod.labels().get("scheduling.x-k8s.io/pod-group"),
        Backend::Volcano => pod.annotations().get("scheduling.k8s.io/group-name"),
        // The link is spec.schedulingGroup, which this typed Pod (1.34 API) drops; the webhook
        // writes the same name into this annotation.
        Backend::Kubernetes => pod.annotations().get("podgroup-sync.io/pod-group"),
    };
    (
        link.cloned(),
        pod.spec.as_ref().and_then(|s| s.scheduler_name.clone()),
    )
}

/// Removes the pod links and schedulerNames from every replica template of a job manifest.
pub fn unlinked(mut manifest: Value) -> Value {
    let specs = manifest["spec"]
        .as_object_mut()
        .and_then(|s| s.values_mut().find(|v| v.get("Worker").is_some()))
        .expect("replica specs");
    for spec in specs.as_object_mut().unwrap().values_mut() {
        let t = &mut spec["template"];
        t.as_object_mut().unwrap().remove("metadata");
        t["spec"].as_object_mut().unwrap().remove("schedulerName");
    }
    manifest
}
