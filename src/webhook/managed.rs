//! The webhook certificate podgroup-sync manages itself (`--webhook-cert-secret`), with neither
//! cert-manager nor a chart that looks objects up: every replica reads the one Secret and serves
//! what it holds; the replica that may write (the leader, or the only one) makes the CA and the
//! serving certificate, renews each at two thirds of its life ([`certs`]), and keeps the
//! `caBundle` of its own MutatingWebhookConfiguration equal to the Secret's bundle — the bundle
//! first, then the Secret, so no replica serves a certificate the API server does not trust yet.
//! RBAC: get and update on that one Secret, get and update on that one configuration
//! (`resourceNames`); the chart creates the Secret empty, so no create is needed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::{info, warn};

use super::certs::{self, Stored};
use super::tls::{Reloading, TlsMetrics, certified_key, not_after};
use crate::client::Fence;

/// How often the Secret is read once a certificate is served (before: every second).
const POLL: Duration = Duration::from_secs(10);
const POLL_UNTIL_LOADED: Duration = Duration::from_secs(1);

/// The certificate's settings, from flags.
#[derive(Debug, Clone)]
pub struct Managed {
    pub namespace: String,
    pub secret: String,
    /// The MutatingWebhookConfiguration whose caBundle is written.
    pub configuration: String,
    /// The DNS names and IP addresses the serving certificate is for.
    pub hosts: Vec<String>,
    /// How long a serving certificate is valid (renewed at two thirds; the CA lives ten times
    /// as long).
    pub validity: Duration,
}

/// Keeps the certificate current and served until the task is dropped.
pub async fn run(
    client: Client,
    cfg: Managed,
    tls: Arc<Reloading>,
    fence: Arc<Fence>,
    metrics: TlsMetrics,
) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client);
    let mut served = String::new();
    loop {
        match secrets.get_opt(&cfg.secret).await {
            Ok(Some(secret)) => {
                let mut stored = stored_of(&secret);
                if fence.remaining() != Some(Duration::ZERO) {
                    stored = keep_current(&secrets, &configs, &cfg, secret, stored).await;
                }
                serve(&tls, &stored, &mut served, &metrics, &cfg);
            }
            Ok(None) => warn!(namespace = %cfg.namespace, secret = %cfg.secret,
                "the webhook certificate Secret does not exist; create it empty (the chart does)"),
            Err(e) => {
                warn!(secret = %cfg.secret, error = %e, "could not read the webhook certificate Secret")
            }
        }
        metrics.loaded.set(tls.loaded() as i64);
        let wait = if tls.loaded() {
            POLL
        } else {
            POLL_UNTIL_LOADED
        };
        tokio::time::sleep(wait).await;
    }
}

fn stored_of(secret: &Secret) -> Stored {
    let data = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    Stored::from_data(&data)
}

/// Renews what is due and brings the caBundle in line; what the Secret holds afterwards.
async fn keep_current(
    secrets: &Api<Secret>,
    configs: &Api<MutatingWebhookConfiguration>,
    cfg: &Managed,
    mut secret: Secret,
    stored: Stored,
) -> Stored {
    let now = time::OffsetDateTime::now_utc();
    let Some(renewal) = certs::due(&stored, &cfg.hosts, now.unix_timestamp()) else {
        ensure_bundle(configs, cfg, &stored.bundle).await;
        return stored;
    };
    let renewed = match certs::renew(&stored, renewal, &cfg.hosts, now, cfg.validity) {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "could not make a webhook certificate");
            return stored;
        }
    };
    // The API server must trust the new CA before any replica serves what it signed.
    if !ensure_bundle(configs, cfg, &renewed.bundle).await {
        return stored;
    }
    secret.data = Some(
        renewed
            .to_data()
            .into_iter()
            .map(|(k, v)| (k, ByteString(v)))
            .collect(),
    );
    secret.string_data = None;
    // The resourceVersion makes this a compare-and-swap: another writer's renewal wins.
    match secrets
        .replace(&cfg.secret, &PostParams::default(), &secret)
        .await
    {
        Ok(_) => {
            info!(?renewal, secret = %cfg.secret, hosts = ?cfg.hosts, "webhook certificate renewed");
            renewed
        }
        Err(e) => {
            warn!(error = %e, "could not write the webhook certificate Secret; tried again shortly");
            stored
        }
    }
}

/// Sets every webhook's caBundle of the configuration to `bundle` unless it is so already (a
/// compare-and-swap replace); true when it is.
async fn ensure_bundle(
    configs: &Api<MutatingWebhookConfiguration>,
    cfg: &Managed,
    bundle: &str,
) -> bool {
    let mut config = match configs.get(&cfg.configuration).await {
        Ok(c) => c,
        Err(e) => {
            warn!(configuration = %cfg.configuration, error = %e, "could not read the webhook configuration");
            return false;
        }
    };
    let want = ByteString(bundle.as_bytes().to_vec());
    let mut changed = 0;
    for hook in config.webhooks.iter_mut().flatten() {
        if hook.client_config.ca_bundle.as_ref() != Some(&want) {
            hook.client_config.ca_bundle = Some(want.clone());
            changed += 1;
        }
    }
    if changed == 0 {
        return true;
    }
    match configs
        .replace(&cfg.configuration, &PostParams::default(), &config)
        .await
    {
        Ok(_) => {
            info!(configuration = %cfg.configuration, webhooks = changed, "caBundle written");
            true
        }
        Err(e) => {
            warn!(configuration = %cfg.configuration, error = %e, "could not write the caBundle");
            false
        }
    }
}

/// Serves the stored pair if it is new and usable.
fn serve(
    tls: &Reloading,
    stored: &Stored,
    served: &mut String,
    metrics: &TlsMetrics,
    cfg: &Managed,
) {
    if stored.cert.is_empty() || stored.cert == *served {
        return;
    }
    match certified_key(stored.cert.as_bytes(), stored.key.as_bytes()) {
        Ok(key) => {
            let expiry = key.cert.first().and_then(|c| not_after(c.as_ref()));
            metrics.expiry.set(expiry.unwrap_or(0) as f64);
            let first = !tls.loaded();
            // Counted before it is served (see `tls::Reloading::watch`).
            metrics.reloads.with_label_values(&["ok"]).inc();
            tls.serve(key);
            info!(secret = %cfg.secret, first, "webhook serving certificate loaded from its Secret");
            *served = stored.cert.clone();
        }
        Err(e) => {
            metrics.reloads.with_label_values(&["error"]).inc();
            warn!(secret = %cfg.secret, error = %e, "the webhook certificate Secret does not parse");
        }
    }
}
