//! Leader election on a `coordination.k8s.io/v1` Lease: only the holder writes; standbys keep
//! warm caches and take over when the holder stops renewing.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{info, warn};

/// Lease settings, from flags.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long a holder's claim lasts without renewal.
    pub lease_duration: Duration,
    /// A leader that cannot renew for this long steps down (the process exits).
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost the leader Lease {0}: could not renew within the renew deadline")]
    Lost(String),
}

enum Attempt {
    Leading,
    Standby(String),
}

/// Runs the election until `shutdown` turns true, publishing leadership on `leading`.
/// On shutdown a leader releases the Lease so a standby takes over at once.
pub async fn run(
    client: Client,
    cfg: LeaseConfig,
    leading: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), LeaderError> {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_renew = tokio::time::Instant::now();
    loop {
        match try_acquire_or_renew(&api, &cfg).await {
            Ok(Attempt::Leading) => {
                last_renew = tokio::time::Instant::now();
                if !*leading.borrow() {
                    info!(lease = %cfg.name, identity = %cfg.identity, "became the leader");
                    let _ = leading.send(true);
                }
            }
            Ok(Attempt::Standby(holder)) => {
                if *leading.borrow() {
                    return Err(LeaderError::Lost(format!(
                        "{} (now held by {holder})",
                        cfg.name
                    )));
                }
            }
            Err(e) => {
                warn!(lease = %cfg.name, error = %e, "leader election request failed");
                if *leading.borrow() && last_renew.elapsed() > cfg.renew_deadline {
                    return Err(LeaderError::Lost(cfg.name.clone()));
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.retry_period) => {}
            _ = shutdown.changed() => {
                if *leading.borrow() {
                    release(&api, &cfg).await;
                    let _ = leading.send(false);
                }
                return Ok(());
            }
        }
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

async fn try_acquire_or_renew(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<Attempt, kube::Error> {
    let duration_secs = cfg.lease_duration.as_secs().max(1) as i32;
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(duration_secs),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Leading),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                Ok(Attempt::Standby("another candidate".into()))
            }
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(renewed), Some(d)) => {
            renewed.0 + SignedDuration::from_secs(d as i64) < Timestamp::now()
        }
        _ => true,
    };
    if holder != cfg.identity && !holder.is_empty() && !expired {
        return Ok(Attempt::Standby(holder));
    }
    if holder != cfg.identity {
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(duration_secs);
    // The resourceVersion in `lease` makes this a compare-and-swap: a rival's write wins.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(Attempt::Leading),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            Ok(Attempt::Standby("another candidate".into()))
        }
        Err(e) => Err(e),
    }
}

async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => info!(lease = %cfg.name, "released the leader Lease"),
        Err(e) => warn!(lease = %cfg.name, error = %e, "could not release the leader Lease"),
    }
}
