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
    /// Serves `key` from now on.
    pub fn serve(&self, key: CertifiedKey) {
        *self.current.write().expect("lock") = Some(Arc::new(key));
    }

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
                            let expiry = key.cert.first().and_then(|c| not_after(c.as_ref()));
                            metrics.expiry.set(expiry.unwrap_or(0) as f64);
                            // Counted before it is served: a handshake with the new certificate
                            // never comes before the count that says it loaded.
                            metrics.reloads.with_label_values(&["ok"]).inc();
                            *self.current.write().expect("lock") = Some(Arc::new(key));
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
    /// `podgroup_sync_webhook_certificate_expiry_timestamp_seconds`.
    pub expiry: prometheus::Gauge,
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
        let expiry = prometheus::Gauge::new(
            "podgroup_sync_webhook_certificate_expiry_timestamp_seconds",
            "When the serving certificate the webhook serves expires (its notAfter, Unix seconds; 0 before one loads)",
        )
        .expect("metric");
        registry
            .register(Box::new(expiry.clone()))
            .expect("register");
        for r in ["ok", "error"] {
            reloads.with_label_values(&[r]);
        }
        TlsMetrics {
            reloads,
            loaded,
            expiry,
        }
    }
}

/// One DER element: its tag, its content and what follows it.
fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, b| (a << 8) | *b as usize);
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The `notAfter` of an X.509 certificate (DER), in Unix seconds.
pub fn not_after(cert: &[u8]) -> Option<i64> {
    validity(cert).map(|(_, to)| to)
}

/// The `notBefore` and `notAfter` of an X.509 certificate (DER), in Unix seconds.
pub fn validity(cert: &[u8]) -> Option<(i64, i64)> {
    let (0x30, cert, _) = tlv(cert)? else {
        return None;
    };
    let (0x30, tbs, _) = tlv(cert)? else {
        return None;
    };
    let (tag, _, after) = tlv(tbs)?;
    // The optional [0] version, then serialNumber, signature and issuer.
    let mut rest = if tag == 0xa0 { after } else { tbs };
    for _ in 0..3 {
        rest = tlv(rest)?.2;
    }
    let (0x30, validity, _) = tlv(rest)? else {
        return None;
    };
    let (from_tag, from, rest) = tlv(validity)?;
    let (to_tag, to, _) = tlv(rest)?;
    Some((asn1_time(from_tag, from)?, asn1_time(to_tag, to)?))
}

/// A UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`) in Unix seconds.
fn asn1_time(tag: u8, text: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 => {
            let yy: i16 = s.get(0..2)?.parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, s.get(2..)?)
        }
        0x18 => (s.get(0..4)?.parse().ok()?, s.get(4..)?),
        _ => return None,
    };
    if rest.len() != 10 {
        return None;
    }
    let two = |i: usize| rest.get(i..i + 2)?.parse::<i8>().ok();
    let dt = k8s_openapi::jiff::civil::DateTime::new(
        year,
        two(0)?,
        two(2)?,
        two(4)?,
        two(6)?,
        two(8)?,
        0,
    )
    .ok()?;
    let utc = dt.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC).ok()?;
    Some(utc.timestamp().as_second())
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

    /// A DER element of `tag` around `content` (short lengths only).
    fn el(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut v = vec![tag, content.len() as u8];
        v.extend_from_slice(content);
        v
    }

    #[test]
    fn the_expiry_is_read_from_the_certificate() {
        let validity = |not_after: Vec<u8>| {
            let mut v = el(0x17, b"260101000000Z");
            v.extend(not_after);
            el(0x30, &v)
        };
        let cert = |version: bool, not_after: Vec<u8>| {
            let mut tbs = Vec::new();
            if version {
                tbs.extend(el(0xa0, &el(0x02, &[2])));
            }
            tbs.extend(el(0x02, &[1]));
            tbs.extend(el(0x30, &[]));
            tbs.extend(el(0x30, &[]));
            tbs.extend(validity(not_after));
            tbs.extend(el(0x30, &[]));
            el(0x30, &el(0x30, &tbs))
        };
        // 2036-12-31T23:59:59Z and 2049-06-30T12:00:00Z.
        assert_eq!(
            not_after(&cert(true, el(0x18, b"20361231235959Z"))),
            Some(2_114_380_799)
        );
        assert_eq!(
            not_after(&cert(false, el(0x17, b"490630120000Z"))),
            Some(2_508_667_200)
        );
        assert_eq!(
            not_after(&cert(true, el(0x17, b"491332120000Z"))),
            None,
            "no 13th month"
        );
        assert_eq!(not_after(&cert(true, el(0x04, b"x"))), None);
        assert_eq!(not_after(b"\x30\x82"), None);
        assert_eq!(not_after(&[]), None);
    }

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
