//! The webhook's serving certificate: read from PEM files and reloaded when they change, so a
//! rotated certificate (cert-manager renewal, a Secret update) is served without a restart.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus::{IntCounterVec, IntGauge};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};
use tracing::{info, warn};

/// How often the files are read for a change. A Secret volume update takes the kubelet up to a
/// minute; this adds at most a few seconds to it.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(3);

/// The certificate chain and private key files (PEM).
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The certificate served now; `None` until the files first load, when handshakes fail.
#[derive(Debug, Default)]
pub struct Reloading {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().expect("lock").clone()
    }
}

impl Reloading {
    pub fn loaded(&self) -> bool {
        self.current.read().expect("lock").is_some()
    }

    /// The TLS server configuration that serves whatever certificate is current (HTTP/1.1).
    pub fn server_config(self: &Arc<Self>) -> Result<ServerConfig, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Reads the files every [`RELOAD_INTERVAL`] and serves their content once it changed and
    /// parses; a pair that does not parse (e.g. caught half-written) keeps the previous one.
    pub async fn watch(self: Arc<Self>, files: CertFiles, metrics: TlsMetrics) {
        let mut last: Option<(Vec<u8>, Vec<u8>)> = None;
        loop {
            let read = std::fs::read(&files.cert).and_then(|c| Ok((c, std::fs::read(&files.key)?)));
            match read {
                Ok(pair) if last.as_ref() != Some(&pair) => {
                    match certified_key(&pair.0, &pair.1) {
                        Ok(key) => {
                            let first = !self.loaded();
                            *self.current.write().expect("lock") = Some(Arc::new(key));
                            metrics.reloads.with_label_values(&["ok"]).inc();
                            info!(cert = %files.cert.display(), first, "webhook serving certificate loaded");
                        }
                        Err(e) => {
                            metrics.reloads.with_label_values(&["error"]).inc();
                            warn!(cert = %files.cert.display(), key = %files.key.display(), error = %e,
                                "webhook certificate files do not parse; serving the previous certificate");
                        }
                    }
                    last = Some(pair);
                }
                Ok(_) => {}
                Err(e) => {
                    if last.take().is_some() || !self.loaded() {
                        warn!(cert = %files.cert.display(), error = %e, "webhook certificate files unreadable");
                    }
                }
            }
            metrics.loaded.set(self.loaded() as i64);
            tokio::time::sleep(RELOAD_INTERVAL).await;
        }
    }
}

/// The certificate metrics.
#[derive(Clone)]
pub struct TlsMetrics {
    /// `podgroup_sync_webhook_certificate_reloads_total{result}`.
    pub reloads: IntCounterVec,
    /// `podgroup_sync_webhook_certificate_loaded`.
    pub loaded: IntGauge,
}

impl TlsMetrics {
    pub fn new(registry: &prometheus::Registry) -> Self {
        let reloads = IntCounterVec::new(
            prometheus::Opts::new(
                "podgroup_sync_webhook_certificate_reloads_total",
                "Webhook serving certificate files read after a change, by result (ok, error)",
            ),
            &["result"],
        )
        .expect("metric");
        let loaded = IntGauge::new(
            "podgroup_sync_webhook_certificate_loaded",
            "1 while the webhook has a serving certificate (0: TLS handshakes fail)",
        )
        .expect("metric");
        registry
            .register(Box::new(reloads.clone()))
            .expect("register");
        registry
            .register(Box::new(loaded.clone()))
            .expect("register");
        for r in ["ok", "error"] {
            reloads.with_label_values(&[r]);
        }
        TlsMetrics { reloads, loaded }
    }
}

/// A certificate chain and its key from PEM.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if chain.is_empty() {
        return Err("certificate: no CERTIFICATE block".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("private key: {e}"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("private key: {e}"))?;
    let certified = CertifiedKey::new(chain, signer);
    certified
        .keys_match()
        .map_err(|e| format!("the key does not match the certificate: {e}"))?;
    Ok(certified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_refused_with_the_part_that_is_wrong() {
        assert!(
            certified_key(b"", b"")
                .unwrap_err()
                .starts_with("certificate")
        );
        let not_a_key = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let e = certified_key(not_a_key, b"nothing").unwrap_err();
        assert!(
            e.starts_with("private key") || e.starts_with("certificate"),
            "{e}"
        );
    }
}
