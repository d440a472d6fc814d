//! Kubernetes Events on jobs (`events.k8s.io/v1`): de-duplicated, named so that the API server
//! always accepts the name, and counted as published only once the API server accepted them.
//!
//! An Event whose publication failed for a passing reason (the API server down or throttling)
//! is not remembered: the caller retries the reconcile, which publishes it again. An Event the
//! API server refuses (400/403/404/422) is logged, counted and not retried until the same Event
//! could be published again (after the de-duplication window or a change of the job).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::warn;

use crate::metrics::Metrics;

/// The `reportingController` of every Event.
pub const REPORTING_CONTROLLER: &str = "podgroup-sync";

/// How long a published Event suppresses an identical one on the same job.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(3600);

/// The longest object name the API server accepts.
const MAX_NAME: usize = 253;

/// An Event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(&self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Every reason podgroup-sync publishes an Event for, with its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No PodGroup can be made from the job's spec (or the API server refused it).
    InvalidSpec,
    /// The backend annotation names no known backend.
    InvalidBackend,
    /// The backend's PodGroup CRD is not served.
    BackendUnavailable,
    /// The PodGroup is made, but something in the spec is doubtful.
    GangSpecWarning,
    /// A replica template's pods will not join the PodGroup.
    MissingPodGroupLink,
    PodsNotLinked,
    /// A PodGroup of that name belongs to someone else.
    PodGroupConflict,
    /// An admission webhook or policy refused the PodGroup; sent again with a backoff.
    PodGroupRefused,
    /// The scheduler says the gang cannot be scheduled.
    GangUnschedulable,
    /// The gang has been waiting longer than the warning threshold.
    GangWaiting,
    /// A gang that ran whole has had fewer than minMember pods running past the threshold.
    GangBroken,
    /// A broken gang is whole again.
    GangRecovered,
    /// A pod of the gang fits no schedulable node, or minResources exceed them all together.
    GangInfeasible,
    /// A gang reported infeasible (or its queue unavailable) can be placed again.
    GangFeasible,
    /// The Volcano queue of the gang does not exist or is not Open.
    QueueUnavailable,
    /// On a PodGroup podgroup-sync did not make: its controller is gone or finished.
    StalePodGroup,
    /// Dry-run: the PodGroup that would be created.
    WouldCreatePodGroup,
    /// Dry-run: the PodGroup change that would be applied.
    WouldUpdatePodGroup,
    /// Dry-run: a stale PodGroup of ours that the audit would delete.
    WouldDeletePodGroup,
}

impl Reason {
    pub const ALL: [Reason; 19] = [
        Reason::InvalidSpec,
        Reason::InvalidBackend,
        Reason::BackendUnavailable,
        Reason::GangSpecWarning,
        Reason::MissingPodGroupLink,
        Reason::PodsNotLinked,
        Reason::PodGroupConflict,
        Reason::PodGroupRefused,
        Reason::GangUnschedulable,
        Reason::GangWaiting,
        Reason::GangBroken,
        Reason::GangRecovered,
        Reason::GangInfeasible,
        Reason::GangFeasible,
        Reason::QueueUnavailable,
        Reason::StalePodGroup,
        Reason::WouldCreatePodGroup,
        Reason::WouldUpdatePodGroup,
        Reason::WouldDeletePodGroup,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::InvalidSpec => "InvalidSpec",
            Reason::InvalidBackend => "InvalidBackend",
            Reason::BackendUnavailable => "BackendUnavailable",
            Reason::GangSpecWarning => "GangSpecWarning",
            Reason::MissingPodGroupLink => "MissingPodGroupLink",
            Reason::PodsNotLinked => "PodsNotLinked",
            Reason::PodGroupConflict => "PodGroupConflict",
            Reason::PodGroupRefused => "PodGroupRefused",
            Reason::GangUnschedulable => "GangUnschedulable",
            Reason::GangWaiting => "GangWaiting",
            Reason::GangBroken => "GangBroken",
            Reason::GangRecovered => "GangRecovered",
            Reason::GangInfeasible => "GangInfeasible",
            Reason::GangFeasible => "GangFeasible",
            Reason::QueueUnavailable => "QueueUnavailable",
            Reason::StalePodGroup => "StalePodGroup",
            Reason::WouldCreatePodGroup => "WouldCreatePodGroup",
            Reason::WouldUpdatePodGroup => "WouldUpdatePodGroup",
            Reason::WouldDeletePodGroup => "WouldDeletePodGroup",
        }
    }

    pub fn type_(&self) -> EventType {
        match self {
            Reason::WouldCreatePodGroup
            | Reason::WouldUpdatePodGroup
            | Reason::WouldDeletePodGroup
            | Reason::GangRecovered
            | Reason::GangFeasible => EventType::Normal,
            _ => EventType::Warning,
        }
    }
}

/// Why an Event was not published.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The API server could not take it now (unreachable, throttling, 5xx): retry.
    #[error("event {reason} not published, will retry: {source}")]
    Transient {
        reason: String,
        #[source]
        source: kube::Error,
    },
}

/// (job UID, reason, note)
type Key = (String, String, String);

/// Publishes Events on jobs.
pub struct Events {
    client: Client,
    reporting_instance: String,
    metrics: Arc<Metrics>,
    seen: Mutex<HashMap<Key, Instant>>,
}

impl Events {
    pub fn new(client: Client, instance: Option<String>, metrics: Arc<Metrics>) -> Self {
        Events {
            client,
            reporting_instance: instance.unwrap_or_else(|| REPORTING_CONTROLLER.to_string()),
            metrics,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes an Event on `regarding` unless the same one was published within the window.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        reason: Reason,
        note: String,
    ) -> Result<(), EventError> {
        let (type_, reason) = (reason.type_(), reason.as_str());
        let note = truncate(note, 1000);
        let key = (
            regarding.uid.clone().unwrap_or_default(),
            reason.to_string(),
            note.clone(),
        );
        if self.recently_seen(&key) {
            return Ok(());
        }
        let now = Timestamp::now();
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name(
                    regarding.name.as_deref().unwrap_or(REPORTING_CONTROLLER),
                    now.as_nanosecond() as u64,
                )),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some("Reconcile".into()),
            reason: Some(reason.to_string()),
            note: Some(note),
            type_: Some(type_.as_str().into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.reporting_instance.clone()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => {
                self.remember([key]);
                self.metrics
                    .events
                    .with_label_values(&[type_.as_str(), reason])
                    .inc();
                Ok(())
            }
            Err(kube::Error::Api(status)) if refused(status.code) => {
                // Retrying cannot help: say so once, and not again within the window.
                self.remember([key]);
                self.metrics
                    .events_failed
                    .with_label_values(&[reason, "refused"])
                    .inc();
                warn!(
                    reason,
                    job = ?regarding.name,
                    namespace = %namespace,
                    code = status.code,
                    error = %status.message,
                    "the API server refused an Event"
                );
                Ok(())
            }
            Err(source) => {
                self.metrics
                    .events_failed
                    .with_label_values(&[reason, "transient"])
                    .inc();
                Err(EventError::Transient {
                    reason: reason.to_string(),
                    source,
                })
            }
        }
    }

    fn recently_seen(&self, key: &Key) -> bool {
        let mut seen = self.seen.lock().expect("lock");
        if seen.len() > 50_000 {
            seen.retain(|_, t| t.elapsed() < DEDUP_WINDOW);
        }
        seen.get(key).is_some_and(|t| t.elapsed() < DEDUP_WINDOW)
    }

    /// Remembers Events as published (also those an earlier instance published, read back at
    /// start-up, so a restart publishes none of them again).
    pub fn remember(&self, events: impl IntoIterator<Item = Key>) {
        let mut seen = self.seen.lock().expect("lock");
        let now = Instant::now();
        for key in events {
            seen.insert(key, now);
        }
    }

    /// Forgets a job's Events of these reasons, so they are published again if they recur.
    pub fn forget(&self, uid: &str, reasons: &[Reason]) {
        self.seen
            .lock()
            .expect("lock")
            .retain(|(u, r, _), _| !(u == uid && reasons.iter().any(|x| x.as_str() == r)));
    }
}

/// A status the API server gives for a request that will never succeed as it is.
fn refused(code: u16) -> bool {
    matches!(code, 400 | 403 | 404 | 422)
}

/// An Event name that always fits: the object's name, cut so that `.<timestamp in hex>` fits in
/// 253 characters, without a trailing `-` or `.` (each part of a DNS subdomain ends in a letter or
/// digit).
pub fn event_name(object: &str, nanos: u64) -> String {
    let suffix = format!(".{nanos:x}");
    let room = MAX_NAME - suffix.len();
    let mut prefix: &str = if object.len() > room {
        let mut cut = room;
        while !object.is_char_boundary(cut) {
            cut -= 1;
        }
        &object[..cut]
    } else {
        object
    };
    prefix = prefix.trim_end_matches(['-', '.']);
    if prefix.is_empty() {
        prefix = REPORTING_CONTROLLER;
    }
    format!("{prefix}{suffix}")
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_always_fit_and_stay_valid() {
        let nanos = u64::MAX;
        assert_eq!(event_name("job", 0x1f), "job.1f");
        for len in [1, 200, 236, 237, 252, 253] {
            let name = "a".repeat(len);
            let e = event_name(&name, nanos);
            assert!(e.len() <= 253, "{len}: {}", e.len());
            assert!(e.ends_with(".ffffffffffffffff"));
        }
        // A cut that would end a part in '-' or '.' is trimmed back to a letter or digit.
        let tricky = format!("{}-.-{}", "b".repeat(234), "c".repeat(20));
        let e = event_name(&tricky, nanos);
        assert!(e.len() <= 253);
        assert!(e.starts_with(&"b".repeat(234)));
        assert!(!e.contains("-."), "{e}");
    }

    #[test]
    fn reasons_are_unique_and_only_dry_run_and_recovery_ones_are_normal() {
        let names: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(Reason::as_str).collect();
        assert_eq!(names.len(), Reason::ALL.len());
        for r in Reason::ALL {
            let normal = r.as_str().starts_with("Would")
                || matches!(r, Reason::GangRecovered | Reason::GangFeasible);
            assert_eq!(r.type_() == EventType::Normal, normal, "{r:?}");
        }
    }

    #[test]
    fn only_requests_that_can_never_succeed_are_refusals() {
        for code in [400, 403, 404, 422] {
            assert!(refused(code));
        }
        for code in [409, 429, 500, 503, 504] {
            assert!(!refused(code));
        }
    }
}
