//! `podgroup-sync check`: the chart's `helm test` — from inside the cluster, that the controller
//! is Ready, that its pod-link webhook answers with a certificate the API server trusts, and that
//! its ServiceAccount holds every permission the controller needs with the flags it runs with.
//! The flags are read from the Deployment itself, so the check follows any values.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use super::explain::one_off_client;
use super::{CheckArgs, Cli, Command, RunArgs};
use clap::Parser;

/// One permission the controller needs: API group, resource, verb, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    pub group: String,
    pub resource: &'static str,
    pub verb: &'static str,
    /// A namespaced grant (the Lease, the certificate's Secret); `None`: cluster-wide.
    pub namespace: Option<String>,
    pub name: Option<String>,
}

fn cluster(group: &str, resource: &'static str, verbs: &[&'static str]) -> Vec<Permission> {
    verbs
        .iter()
        .map(|verb| Permission {
            group: group.to_string(),
            resource,
            verb,
            namespace: None,
            name: None,
        })
        .collect()
}

/// Every permission `podgroup-sync run` with these flags uses (pure): what the chart's RBAC must
/// grant its ServiceAccount.
pub fn required_permissions(run: &RunArgs) -> Vec<Permission> {
    let read = ["get", "list", "watch"];
    let mut out = Vec::new();
    for kind in crate::job::KINDS {
        if kind.kind == "Job" && !run.batch_jobs {
            continue;
        }
        out.extend(cluster(kind.group, kind.plural, &read));
    }
    out.extend(cluster("kueue.x-k8s.io", "workloads", &["list", "watch"]));
    out.extend(cluster(
        "topology.volcano.sh",
        "hypernodes",
        &["list", "watch"],
    ));
    for (group, resource) in [
        ("", "namespaces"),
        ("", "limitranges"),
        ("scheduling.k8s.io", "priorityclasses"),
        ("node.k8s.io", "runtimeclasses"),
        (
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
        ),
        (
            "admissionregistration.k8s.io",
            "validatingadmissionpolicybindings",
        ),
    ] {
        out.extend(cluster(group, resource, &["list", "watch"]));
    }
    for backend in crate::backend::BACKENDS {
        let ar = backend.backend().api_resource();
        out.extend(cluster(
            &ar.group,
            "podgroups",
            &["list", "watch", "create", "patch", "delete"],
        ));
    }
    out.extend(cluster(
        "events.k8s.io",
        "events",
        &["list", "create", "patch"],
    ));
    if run.health.gang_feasibility {
        out.extend(cluster("", "nodes", &["list", "watch"]));
        out.extend(cluster(
            "scheduling.volcano.sh",
            "queues",
            &["list", "watch"],
        ));
    }
    if run.webhook.serve {
        out.extend(cluster("", "pods", &["list", "watch"]));
        if let (Some(secret), Some(config)) =
            (&run.webhook.cert_secret, &run.webhook.webhook_configuration)
            && let Some((ns, name)) = secret.split_once('/')
        {
            for verb in ["get", "update"] {
                out.push(Permission {
                    group: String::new(),
                    resource: "secrets",
                    verb,
                    namespace: Some(ns.to_string()),
                    name: Some(name.to_string()),
                });
                out.push(Permission {
                    group: "admissionregistration.k8s.io".into(),
                    resource: "mutatingwebhookconfigurations",
                    verb,
                    namespace: None,
                    name: Some(config.clone()),
                });
            }
        }
    }
    if run.leader.enabled {
        let ns = run.leader.namespace.clone();
        out.push(Permission {
            group: "coordination.k8s.io".into(),
            resource: "leases",
            verb: "create",
            namespace: ns.clone(),
            name: None,
        });
        for verb in ["get", "update"] {
            out.push(Permission {
                group: "coordination.k8s.io".into(),
                resource: "leases",
                verb,
                namespace: ns.clone(),
                name: Some(run.leader.lease_name.clone()),
            });
        }
    }
    out
}

/// The `run` flags of the Deployment's controller container.
fn run_args_of(deployment: &Deployment) -> Result<(RunArgs, String), String> {
    let spec = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .ok_or("the Deployment has no pod template")?;
    let container = spec
        .containers
        .iter()
        .find(|c| c.name == "controller")
        .or(spec.containers.first())
        .ok_or("the Deployment has no container")?;
    let args = container.args.clone().unwrap_or_default();
    let cli = Cli::try_parse_from(std::iter::once("podgroup-sync".to_string()).chain(args))
        .map_err(|e| format!("the controller's arguments do not parse: {e}"))?;
    let run = match cli.command {
        Some(Command::Run(run)) => *run,
        None => cli.run,
        Some(_) => return Err("the controller container does not run the controller".into()),
    };
    let account = spec
        .service_account_name
        .clone()
        .unwrap_or_else(|| "default".into());
    Ok((run, account))
}

pub fn run_check(args: CheckArgs) -> std::process::ExitCode {
    let failures = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(check(&args));
    match failures {
        Ok(0) => {
            println!("podgroup-sync check: every check passed");
            std::process::ExitCode::SUCCESS
        }
        Ok(n) => {
            println!("podgroup-sync check: {n} check(s) failed");
            std::process::ExitCode::from(1)
        }
        Err(e) => {
            println!("FAIL {e}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Prints `ok …` or `FAIL …` per check; the number of failures.
async fn check(args: &CheckArgs) -> Result<usize, String> {
    let client = one_off_client(None).await?;
    let ns = &args.namespace;
    let mut failed = 0;
    let mut report = |ok: bool, what: String| {
        println!("{} {what}", if ok { "ok  " } else { "FAIL" });
        failed += usize::from(!ok);
    };
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(&args.deployment)
        .await
        .map_err(|e| format!("reading Deployment {ns}/{}: {e}", args.deployment))?;
    let wanted = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let ready = deployment
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    report(
        ready >= wanted && wanted > 0,
        format!(
            "Deployment {ns}/{}: {ready} of {wanted} replicas Ready",
            args.deployment
        ),
    );
    if let Some(service) = &args.metrics_service {
        let r = readyz(&client, ns, service).await;
        report(
            r.is_ok(),
            format!(
                "GET /readyz through Service {ns}/{service}: {}",
                r.unwrap_or_else(|e| e)
            ),
        );
    }
    let (run, account) = run_args_of(&deployment)?;
    if run.webhook.serve {
        let name = args
            .webhook_configuration
            .clone()
            .unwrap_or_else(|| args.deployment.clone());
        let r = webhook(&client, &name).await;
        report(
            r.is_ok(),
            format!(
                "MutatingWebhookConfiguration {name}: {}",
                r.unwrap_or_else(|e| e)
            ),
        );
    }
    let user = format!("system:serviceaccount:{ns}:{account}");
    let mut run = run;
    if run.leader.namespace.is_none() {
        run.leader.namespace = Some(ns.clone());
    }
    let mut denied = Vec::new();
    let needed = required_permissions(&run);
    for p in &needed {
        if !allowed(&client, &user, ns, p).await? {
            denied.push(format!(
                "{} {}{}{}",
                p.verb,
                if p.group.is_empty() {
                    String::new()
                } else {
                    format!("{}/", p.group)
                },
                p.resource,
                match (&p.namespace, &p.name) {
                    (Some(n), Some(x)) => format!(" {n}/{x}"),
                    (Some(n), None) => format!(" in {n}"),
                    (None, Some(x)) => format!(" {x}"),
                    (None, None) => String::new(),
                }
            ));
        }
    }
    report(
        denied.is_empty(),
        format!(
            "RBAC of {user}: {} of {} permissions the controller uses with its flags are granted{}",
            needed.len() - denied.len(),
            needed.len(),
            if denied.is_empty() {
                String::new()
            } else {
                format!("; missing: {}", denied.join(", "))
            }
        ),
    );
    Ok(failed)
}

/// Whether `user` may do what `p` names (a SubjectAccessReview).
async fn allowed(
    client: &kube::Client,
    user: &str,
    ns: &str,
    p: &Permission,
) -> Result<bool, String> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(p.group.clone()),
                resource: Some(p.resource.to_string()),
                verb: Some(p.verb.to_string()),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| format!("SubjectAccessReview: {e}"))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

async fn cluster_ip(client: &kube::Client, ns: &str, name: &str) -> Result<(String, i32), String> {
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| format!("reading Service {ns}/{name}: {e}"))?;
    let spec = svc.spec.unwrap_or_default();
    let ip = spec
        .cluster_ip
        .filter(|ip| !ip.is_empty() && ip != "None")
        .ok_or("no cluster IP")?;
    let port = spec
        .ports
        .unwrap_or_default()
        .first()
        .map(|p| p.port)
        .ok_or("no port")?;
    Ok((ip, port))
}

/// `GET /readyz` through the metrics Service (kube-proxy's route, as a scraper's).
async fn readyz(client: &kube::Client, ns: &str, service: &str) -> Result<String, String> {
    let (ip, port) = cluster_ip(client, ns, service).await?;
    let stream = tokio::time::timeout(
        Duration::from_secs(10),
        TcpStream::connect((ip.as_str(), port as u16)),
    )
    .await
    .map_err(|_| format!("{ip}:{port}: no connection within 10 s"))?
    .map_err(|e| format!("{ip}:{port}: {e}"))?;
    let request = hyper::Request::get("/readyz")
        .header("host", format!("{ip}:{port}"))
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let (status, body) = exchange(stream, request).await?;
    if status == 200 {
        Ok(format!("200 {}", body.trim()))
    } else {
        Err(format!("{status} {}", body.trim()))
    }
}

/// One HTTP/1.1 exchange on a connected stream, within 10 seconds.
async fn exchange<S>(
    stream: S,
    request: hyper::Request<Full<Bytes>>,
) -> Result<(u16, String), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let work = async {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
}

/// Every entry of the webhook configuration: its Service answers an AdmissionReview over TLS
/// whose certificate verifies, for the Service's DNS name, against the entry's caBundle — what
/// the API server checks before it calls.
async fn webhook(client: &kube::Client, name: &str) -> Result<String, String> {
    let config = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(name)
        .await
        .map_err(|e| format!("reading it: {e}"))?;
    let entries = config.webhooks.unwrap_or_default();
    if entries.is_empty() {
        return Err("no webhook entries".into());
    }
    for entry in &entries {
        let cc = &entry.client_config;
        let svc = cc
            .service
            .as_ref()
            .ok_or(format!("{}: no service", entry.name))?;
        let bundle = cc
            .ca_bundle
            .as_ref()
            .ok_or(format!("{}: no caBundle", entry.name))?;
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&bundle.0) {
            let c = c.map_err(|e| format!("{}: caBundle: {e}", entry.name))?;
            roots
                .add(c)
                .map_err(|e| format!("{}: caBundle: {e}", entry.name))?;
        }
        let tls = tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let (ip, _) = cluster_ip(client, &svc.namespace, &svc.name).await?;
        let port = svc.port.unwrap_or(443) as u16;
        let host = format!("{}.{}.svc", svc.name, svc.namespace);
        let tcp = tokio::time::timeout(
            Duration::from_secs(10),
            TcpStream::connect((ip.as_str(), port)),
        )
        .await
        .map_err(|_| format!("{host} ({ip}:{port}): no connection within 10 s"))?
        .map_err(|e| format!("{host} ({ip}:{port}): {e}"))?;
        let server = ServerName::try_from(host.clone()).map_err(|e| e.to_string())?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(server, tcp)
            .await
            .map_err(|e| format!("{}: TLS to {host} with the caBundle: {e}", entry.name))?;
        let uid = "00000000-0000-0000-0000-00000000c4ec";
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": svc.namespace, "operation": "CREATE", "dryRun": true,
                "userInfo": {"username": "podgroup-sync-check"},
                "object": {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "podgroup-sync-check", "namespace": svc.namespace},
                    "spec": {"containers": [{"name": "c", "image": "none"}]}}}
        });
        let request = hyper::Request::post(svc.path.clone().unwrap_or_else(|| "/".into()))
            .header("host", &host)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(review.to_string())))
            .map_err(|e| e.to_string())?;
        let (status, body) = exchange(stream, request).await?;
        let answer: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| format!("{}: HTTP {status}, not an AdmissionReview: {e}", entry.name))?;
        if answer["response"]["uid"] != uid || answer["response"]["allowed"] != true {
            return Err(format!("{}: unexpected answer {answer}", entry.name));
        }
    }
    Ok(format!(
        "{} entr{} answer over TLS verified against their caBundle",
        entries.len(),
        if entries.len() == 1 { "y" } else { "ies" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> RunArgs {
        let cli = Cli::try_parse_from(["podgroup-sync", "run"].iter().chain(args)).unwrap();
        match cli.command {
            Some(Command::Run(r)) => *r,
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_permissions_follow_the_flags() {
        let has = |ps: &[Permission], resource: &str, verb: &str| {
            ps.iter().any(|p| p.resource == resource && p.verb == verb)
        };
        let bare = required_permissions(&run(&[]));
        assert!(has(&bare, "pytorchjobs", "watch"));
        assert!(has(&bare, "podgroups", "delete"));
        assert!(!has(&bare, "pods", "watch"), "no webhook, no pod watch");
        assert!(
            !has(&bare, "jobs", "list"),
            "batch/v1 Jobs only with --batch-jobs"
        );
        assert!(!has(&bare, "leases", "update"));
        let full = required_permissions(&run(&[
            "--webhook",
            "--batch-jobs",
            "--gang-feasibility",
            "--leader-elect",
            "--leader-elect-namespace=sys",
            "--webhook-cert-secret=sys/cert",
            "--webhook-configuration=pgs",
            "--webhook-cert-hosts=a",
        ]));
        assert!(has(&full, "pods", "watch"));
        assert!(has(&full, "jobs", "list"));
        assert!(has(&full, "nodes", "list"));
        let lease = full
            .iter()
            .find(|p| p.resource == "leases" && p.verb == "update")
            .unwrap();
        assert_eq!(lease.namespace.as_deref(), Some("sys"));
        let secret = full
            .iter()
            .find(|p| p.resource == "secrets" && p.verb == "update")
            .unwrap();
        assert_eq!(secret.name.as_deref(), Some("cert"));
    }
}
