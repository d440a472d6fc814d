//! Leader election on a `coordination.k8s.io/v1` Lease: only the holder writes; standbys keep
//! warm caches and take over when the holder stops renewing. A holder that cannot renew stops
//! writing at its renew deadline, before its Lease can expire (the [`Fence`] every write
//! passes), and stays in the election as a standby.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::client::Fence;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// Lease settings, from flags.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long a holder's claim lasts without renewal.
    pub lease_duration: Duration,
    /// A leader stops writing this long after the start of its last successful renewal, unless
    /// it renews again first; shorter than `lease_duration`, so it stops before a standby can
    /// take the Lease.
    pub renew_deadline: Duration,
    /// Time between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// Why these settings cannot guarantee one writer at a time, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "the renew deadline ({:?}) must be shorter than the lease duration ({:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(format!(
                "the retry period ({:?}) must be shorter than the renew deadline ({:?})",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }
}

enum Attempt {
    Leading,
    Standby(String),
}

/// Runs the election until `shutdown` turns true, publishing leadership on `leading` and
/// opening `fence` (every write of the process passes it) until the renew deadline after the
/// start of each successful renewal. An attempt is abandoned at that deadline; a leader that has
/// not renewed by then steps down — its writes stop at once — and campaigns again as a standby.
/// On shutdown a leader releases the Lease so a standby takes over at once.
pub async fn run(
    client: Client,
    cfg: LeaseConfig,
    fence: Arc<Fence>,
    leading: watch::Sender<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    // While leading: when the last successful renewal stops letting this replica write.
    let mut acting_until: Option<Instant> = None;
    loop {
        let started = Instant::now();
        let bound = acting_until.unwrap_or(started + cfg.renew_deadline);
        match tokio::time::timeout_at(bound, try_acquire_or_renew(&api, &cfg)).await {
            Ok(Ok(Attempt::Leading)) => {
                let until = started + cfg.renew_deadline;
                fence.open_until(until);
                acting_until = Some(until);
                if !*leading.borrow() {
                    info!(lease = %cfg.name, identity = %cfg.identity, "became the leader");
                    let _ = leading.send(true);
                }
            }
            Ok(Ok(Attempt::Standby(holder))) => {
                if acting_until.take().is_some() {
                    step_down(
                        &fence,
                        &leading,
                        &cfg,
                        &format!("the Lease is held by {holder}"),
                    );
                }
            }
            Ok(Err(e)) => {
                warn!(lease = %cfg.name, error = %e, "leader election request failed");
            }
            Err(_) => {
                warn!(lease = %cfg.name, waited = ?bound - started, "leader election request got no answer in time");
            }
        }
        if acting_until.is_some_and(|t| Instant::now() >= t) {
            acting_until = None;
            step_down(
                &fence,
                &leading,
                &cfg,
                "could not renew the Lease within the renew deadline",
            );
        }
        // Wake for the next attempt, and no later than the renew deadline.
        let next = Instant::now() + cfg.retry_period;
        let wake = acting_until.map_or(next, |t| next.min(t));
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = shutdown.changed() => {
                if *leading.borrow() {
                    release(&api, &cfg).await;
                    fence.close();
                    let _ = leading.send(false);
                }
                return;
            }
        }
    }
}

/// Stops writing now and tells the controllers; the election goes on as a standby.
fn step_down(fence: &Fence, leading: &watch::Sender<bool>, cfg: &LeaseConfig, why: &str) {
    fence.close();
    let _ = leading.send(false);
    warn!(lease = %cfg.name, identity = %cfg.identity, why, "stepped down: no writes until the Lease is held again");
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
