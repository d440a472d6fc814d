//! The webhook certificate podgroup-sync manages itself (`--webhook-cert-secret`), pure: a CA of
//! its own and a serving certificate it signs, when each is due for renewal, and what the
//! Secret holds. The caBundle is the CA's certificate, which renewing the serving certificate
//! leaves unchanged; when the CA itself is renewed the caBundle carries the old and the new CA
//! until no serving certificate of the old one is left.

use std::collections::BTreeMap;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::tls::validity;

/// The Secret's keys.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const CERT: &str = "tls.crt";
pub const KEY: &str = "tls.key";
/// The hosts the serving certificate was made for (comma-separated), to notice a change.
pub const HOSTS: &str = "hosts";
/// The caBundle: the CA and, while one is being replaced, the previous CA.
pub const BUNDLE: &str = "ca-bundle.crt";

/// The CA's common name.
const CA_NAME: &str = "podgroup-sync webhook CA";
/// How long the CA is valid: ten serving certificates' worth at the default validity.
pub const CA_VALIDITY_FACTOR: u32 = 10;

/// What the Secret holds, as text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
    pub hosts: String,
    pub bundle: String,
}

impl Stored {
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Stored {
        let text = |k: &str| {
            data.get(k)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        Stored {
            ca_cert: text(CA_CERT),
            ca_key: text(CA_KEY),
            cert: text(CERT),
            key: text(KEY),
            hosts: text(HOSTS),
            bundle: text(BUNDLE),
        }
    }

    pub fn to_data(&self) -> BTreeMap<String, Vec<u8>> {
        [
            (CA_CERT, &self.ca_cert),
            (CA_KEY, &self.ca_key),
            (CERT, &self.cert),
            (KEY, &self.key),
            (HOSTS, &self.hosts),
            (BUNDLE, &self.bundle),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect()
    }
}

/// Why the Secret must be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Nothing usable is stored.
    Missing,
    /// The serving certificate is past two thirds of its life (or names other hosts).
    Serving,
    /// The CA is past two thirds of its life: a new CA, both CAs in the bundle.
    Ca,
}

/// Whether `stored` needs renewing at `now` (Unix seconds) for `hosts`.
pub fn due(stored: &Stored, hosts: &[String], now: i64) -> Option<Renewal> {
    let (Some(ca), Some(cert)) = (first_der(&stored.ca_cert), first_der(&stored.cert)) else {
        return Some(Renewal::Missing);
    };
    if KeyPair::from_pem(&stored.ca_key).is_err() || KeyPair::from_pem(&stored.key).is_err() {
        return Some(Renewal::Missing);
    }
    let past_two_thirds =
        |der: &[u8]| validity(der).is_none_or(|(from, to)| now >= from + (to - from) * 2 / 3);
    if past_two_thirds(&ca) {
        return Some(Renewal::Ca);
    }
    if past_two_thirds(&cert) || stored.hosts != hosts.join(",") {
        return Some(Renewal::Serving);
    }
    None
}

/// The renewed Secret content: a new serving certificate for `hosts`, valid for `validity`
/// from `now`, signed by the stored CA — or by a new CA when `renewal` says so, with the
/// previous CA kept in the bundle.
pub fn renew(
    stored: &Stored,
    renewal: Renewal,
    hosts: &[String],
    now: time::OffsetDateTime,
    validity: Duration,
) -> Result<Stored, String> {
    let err = |e: rcgen::Error| e.to_string();
    let (ca_key, ca_cert, bundle) = match renewal {
        Renewal::Serving => {
            let key = KeyPair::from_pem(&stored.ca_key).map_err(err)?;
            (key, stored.ca_cert.clone(), stored.bundle.clone())
        }
        Renewal::Missing | Renewal::Ca => {
            let key = KeyPair::generate().map_err(err)?;
            let cert = ca_params(now, validity * CA_VALIDITY_FACTOR)
                .self_signed(&key)
                .map_err(err)?
                .pem();
            // The previous CA stays trusted until the serving certificates it signed are gone.
            let bundle = if renewal == Renewal::Ca && first_der(&stored.ca_cert).is_some() {
                format!("{cert}{}", stored.ca_cert)
            } else {
                cert.clone()
            };
            (key, cert, bundle)
        }
    };
    let issuer = Issuer::new(ca_params(now, validity * CA_VALIDITY_FACTOR), &ca_key);
    let key = KeyPair::generate().map_err(err)?;
    let mut params = CertificateParams::new(hosts.to_vec()).map_err(err)?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts.first().cloned().unwrap_or_default(),
    );
    params.not_before = now - Duration::from_secs(60);
    params.not_after = now + validity;
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).map_err(err)?;
    // A bundle of two CAs shrinks back to one once the new CA signs the serving certificate
    // and the old one is past its life.
    let bundle = prune_bundle(&bundle, now.unix_timestamp());
    Ok(Stored {
        ca_cert,
        ca_key: ca_key.serialize_pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
        hosts: hosts.join(","),
        bundle,
    })
}

/// The CA's parameters; the same name and key give the same issuer for every certificate.
fn ca_params(now: time::OffsetDateTime, validity: Duration) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, CA_NAME);
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = now - Duration::from_secs(60);
    p.not_after = now + validity;
    p
}

/// The certificates of a PEM bundle that are still valid at `now`.
fn prune_bundle(bundle: &str, now: i64) -> String {
    let kept: Vec<String> = CertificateDer::pem_slice_iter(bundle.as_bytes())
        .filter_map(Result::ok)
        .filter(|c| validity(c.as_ref()).is_some_and(|(_, to)| to > now))
        .map(|c| pem("CERTIFICATE", c.as_ref()))
        .collect();
    kept.concat()
}

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// The first certificate of a PEM text, as DER.
fn first_der(pem: &str) -> Option<Vec<u8>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()
        .map(|c| c.as_ref().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::tls::certified_key;

    const DAY: Duration = Duration::from_secs(86_400);

    fn hosts() -> Vec<String> {
        vec!["pgs-webhook.ops.svc".into(), "127.0.0.1".into()]
    }

    fn at(secs: i64) -> time::OffsetDateTime {
        time::OffsetDateTime::from_unix_timestamp(secs).unwrap()
    }

    #[test]
    fn a_certificate_is_made_kept_renewed_at_two_thirds_and_the_ca_outlives_it() {
        let t0 = 1_800_000_000;
        assert_eq!(
            due(&Stored::default(), &hosts(), t0),
            Some(Renewal::Missing)
        );
        let s = renew(
            &Stored::default(),
            Renewal::Missing,
            &hosts(),
            at(t0),
            30 * DAY,
        )
        .unwrap();
        certified_key(s.cert.as_bytes(), s.key.as_bytes()).expect("a usable pair");
        assert_eq!(s.bundle, s.ca_cert);
        assert_eq!(due(&s, &hosts(), t0), None);
        assert_eq!(due(&s, &hosts(), t0 + 19 * 86_400), None);
        assert_eq!(due(&s, &hosts(), t0 + 21 * 86_400), Some(Renewal::Serving));
        assert_eq!(due(&s, &["other.svc".into()], t0), Some(Renewal::Serving));
        // Renewing the serving certificate keeps the CA, and so the caBundle.
        let t1 = t0 + 21 * 86_400;
        let r = renew(&s, Renewal::Serving, &hosts(), at(t1), 30 * DAY).unwrap();
        assert_eq!(
            (&r.ca_cert, &r.ca_key, &r.bundle),
            (&s.ca_cert, &s.ca_key, &s.bundle)
        );
        assert_ne!(r.cert, s.cert);
        assert_eq!(due(&r, &hosts(), t1), None);
        // The CA (ten serving lives) is renewed at two thirds of its own life, the old one
        // staying in the bundle while it is valid.
        let late = t0 + 201 * 86_400;
        assert_eq!(due(&r, &hosts(), late), Some(Renewal::Ca));
        let n = renew(&r, Renewal::Ca, &hosts(), at(late), 30 * DAY).unwrap();
        assert_ne!(n.ca_cert, r.ca_cert);
        assert!(n.bundle.starts_with(&n.ca_cert) && n.bundle.ends_with(&r.ca_cert));
        // Past the old CA's end, the bundle holds the new one only.
        let after = renew(
            &n,
            Renewal::Serving,
            &hosts(),
            at(t0 + 301 * 86_400),
            30 * DAY,
        )
        .unwrap();
        assert_eq!(after.bundle, n.ca_cert);
        // What the Secret holds comes back the same.
        assert_eq!(Stored::from_data(&n.to_data()), n);
    }

    /// Whether a client trusting `bundle` accepts `s`'s serving certificate for `host` at `now`.
    fn trusted(bundle: &str, s: &Stored, host: &str, now: i64) -> bool {
        use std::sync::Arc;
        use tokio_rustls::rustls::{self, pki_types::ServerName, pki_types::UnixTime};
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        let leaf = CertificateDer::from_pem_slice(s.cert.as_bytes()).unwrap();
        use rustls::client::danger::ServerCertVerifier;
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from(host.to_string()).unwrap(),
                &[],
                UnixTime::since_unix_epoch(Duration::from_secs(now as u64)),
            )
            .is_ok()
    }

    #[test]
    fn clients_that_trust_the_bundle_trust_every_serving_certificate_of_its_cas() {
        let t0 = 1_800_000_000;
        let s = renew(
            &Stored::default(),
            Renewal::Missing,
            &hosts(),
            at(t0),
            30 * DAY,
        )
        .unwrap();
        assert!(trusted(&s.bundle, &s, "127.0.0.1", t0));
        assert!(trusted(&s.bundle, &s, "pgs-webhook.ops.svc", t0));
        assert!(!trusted(&s.bundle, &s, "elsewhere.svc", t0));
        // The renewed certificate is trusted under the bundle the API server already has.
        let r = renew(
            &s,
            Renewal::Serving,
            &hosts(),
            at(t0 + 20 * 86_400),
            30 * DAY,
        )
        .unwrap();
        assert!(trusted(&s.bundle, &r, "127.0.0.1", t0 + 20 * 86_400));
        // A new CA: the new bundle trusts the old serving certificate and the new one.
        let late = t0 + 201 * 86_400;
        let old = renew(&s, Renewal::Serving, &hosts(), at(late - 86_400), 30 * DAY).unwrap();
        let n = renew(&old, Renewal::Ca, &hosts(), at(late), 30 * DAY).unwrap();
        assert!(trusted(&n.bundle, &old, "127.0.0.1", late));
        assert!(trusted(&n.bundle, &n, "127.0.0.1", late));
        assert!(!trusted(&old.bundle, &n, "127.0.0.1", late));
    }

    #[test]
    fn a_broken_secret_is_made_anew() {
        let s = renew(
            &Stored::default(),
            Renewal::Missing,
            &hosts(),
            at(1_800_000_000),
            DAY,
        )
        .unwrap();
        let broken = Stored {
            ca_key: "not a key".into(),
            ..s.clone()
        };
        assert_eq!(
            due(&broken, &hosts(), 1_800_000_000),
            Some(Renewal::Missing)
        );
        let broken = Stored {
            cert: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
            ..s
        };
        assert!(due(&broken, &hosts(), 1_800_000_000).is_some());
    }
}
