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
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tracing::warn;

use crate::metrics::Metrics;

/// The `reportingController` of every Event.
pub const REPORTING_CONTROLLER: &str = "podgroup-sync";

/// How long a published Event suppresses an identical one on the same job.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(3600);

/// The longest object name the API server accepts.
const MAX_NAME: usize = 253;

pub use crate::reason::{EventType, Reason};

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

/// (regarded object's UID, reason, note)
type Key = (String, String, String);

/// An Event podgroup-sync published (or an earlier instance did), kept to update rather than
/// repeat it.
#[derive(Debug, Clone)]
struct Published {
    name: String,
    namespace: String,
    /// Occurrences so far (the Event's `series.count`, 1 without a series).
    count: i32,
    /// When it was published or last updated.
    at: Instant,
    /// Forgotten: the next publication updates it even within the window.
    stale: bool,
}

/// Publishes Events on jobs: one Event object per object, reason and note. The same Event again
/// (after the de-duplication window, or once it was forgotten) or more occurrences of it
/// update that object's `series` (count and last-observed time) instead of creating another;
/// the note of an Event cannot change, so a different note is another Event.
pub struct Events {
    client: Client,
    reporting_instance: String,
    metrics: Arc<Metrics>,
    seen: Mutex<HashMap<Key, Published>>,
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
        self.publish_counted(regarding, reason, note, None).await
    }

    /// [`publish`](Self::publish) of something that happened `occurrences` times (e.g. pods
    /// left unlinked): a higher count than published updates the Event's series at once.
    pub async fn publish_counted(
        &self,
        regarding: &ObjectReference,
        reason: Reason,
        note: String,
        occurrences: Option<u32>,
    ) -> Result<(), EventError> {
        let note = truncate(note, 1000);
        let key = (
            regarding.uid.clone().unwrap_or_default(),
            reason.as_str().to_string(),
            note,
        );
        let known = self.seen.lock().expect("lock").get(&key).cloned();
        let wanted = occurrences.map(|n| n.min(i32::MAX as u32) as i32);
        let result = match known {
            Some(p) => {
                let due = p.stale || p.at.elapsed() >= DEDUP_WINDOW;
                let count = match wanted {
                    Some(n) if n > p.count => n,
                    _ if due => p.count.saturating_add(1),
                    _ => return Ok(()),
                };
                // One the API server refused before has no object to update.
                let update = if p.name.is_empty() {
                    None
                } else {
                    Some(self.update(&p, count).await)
                };
                match update {
                    None => self.create(regarding, reason, &key.2, wanted).await,
                    Some(Err(kube::Error::Api(s))) if s.code == 404 => {
                        // Expired (the API server keeps Events for an hour): publish it anew.
                        self.create(regarding, reason, &key.2, wanted).await
                    }
                    Some(other) => other.map(|()| Published {
                        count,
                        at: Instant::now(),
                        stale: false,
                        ..p
                    }),
                }
            }
            None => self.create(regarding, reason, &key.2, wanted).await,
        };
        let type_ = reason.type_().as_str();
        let reason = reason.as_str();
        match result {
            Ok(published) => {
                keep(&mut self.seen.lock().expect("lock"), key, published);
                self.metrics
                    .events
                    .published
                    .with_label_values(&[type_, reason])
                    .inc();
                Ok(())
            }
            Err(kube::Error::Api(status)) if refused(status.code) => {
                // Retrying cannot help: say so once, and not again within the window.
                let namespace = regarding.namespace.clone().unwrap_or_default();
                let marker = Published {
                    name: String::new(),
                    namespace: namespace.clone(),
                    count: i32::MAX,
                    at: Instant::now(),
                    stale: false,
                };
                keep(&mut self.seen.lock().expect("lock"), key, marker);
                self.metrics
                    .events
                    .failed
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
                    .events
                    .failed
                    .with_label_values(&[reason, "transient"])
                    .inc();
                Err(EventError::Transient {
                    reason: reason.to_string(),
                    source,
                })
            }
        }
    }

    /// Creates the Event (with a series when it already happened more than once).
    async fn create(
        &self,
        regarding: &ObjectReference,
        reason: Reason,
        note: &str,
        occurrences: Option<i32>,
    ) -> Result<Published, kube::Error> {
        let now = Timestamp::now();
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = event_name(
            regarding.name.as_deref().unwrap_or(REPORTING_CONTROLLER),
            now.as_nanosecond() as u64,
        );
        let count = occurrences.unwrap_or(1).max(1);
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some("Reconcile".into()),
            reason: Some(reason.as_str().to_string()),
            note: Some(note.to_string()),
            type_: Some(reason.type_().as_str().into()),
            event_time: Some(MicroTime(now)),
            series: (count > 1).then_some(EventSeries {
                count,
                last_observed_time: MicroTime(now),
            }),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.reporting_instance.clone()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        Ok(Published {
            name,
            namespace,
            count,
            at: Instant::now(),
            stale: false,
        })
    }

    /// Sets an Event's series to `count` occurrences, the last one now.
    async fn update(&self, p: &Published, count: i32) -> Result<(), kube::Error> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &p.namespace);
        let series = json!({"series": {"count": count.max(2), "lastObservedTime": MicroTime(Timestamp::now())}});
        api.patch(&p.name, &PatchParams::default(), &Patch::Merge(&series))
            .await
            .map(|_| ())
    }

    /// Remembers Events as published — those an earlier instance (or the leader this replica
    /// takes over from) published, read back — so that none is published again, and a repeat
    /// updates the same Event object.
    pub fn remember(&self, events: impl IntoIterator<Item = Event>) {
        let mut seen = self.seen.lock().expect("lock");
        for e in events {
            let (Some(uid), Some(reason), Some(name), Some(namespace)) = (
                e.regarding.and_then(|r| r.uid),
                e.reason,
                e.metadata.name,
                e.metadata.namespace,
            ) else {
                continue;
            };
            let count = e.series.map_or(1, |s| s.count);
            let key = (uid, reason, e.note.unwrap_or_default());
            let newer = seen.get(&key).is_none_or(|p| p.count <= count);
            if newer {
                let p = Published {
                    name,
                    namespace,
                    count,
                    at: Instant::now(),
                    stale: false,
                };
                keep(&mut seen, key, p);
            }
        }
    }

    /// Lets a job's Events of these reasons be published again if they recur (as updates of
    /// the same Event objects).
    pub fn forget(&self, uid: &str, reasons: &[Reason]) {
        for ((u, r, _), p) in self.seen.lock().expect("lock").iter_mut() {
            if u == uid && reasons.iter().any(|x| x.as_str() == r) {
                p.stale = true;
            }
        }
    }

    /// Drops everything kept for an object that is gone.
    pub fn forget_object(&self, uid: &str) {
        self.seen
            .lock()
            .expect("lock")
            .retain(|(u, _, _), _| u != uid);
    }
}

/// Remembers a published Event; past 50,000 remembered, those older than the window go first
/// (a deleted job's go with it: `Events::forget_object`).
fn keep(seen: &mut HashMap<Key, Published>, key: Key, published: Published) {
    if seen.len() > 50_000 {
        seen.retain(|_, p| p.at.elapsed() < DEDUP_WINDOW);
    }
    seen.insert(key, published);
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
    fn reasons_are_unique_and_only_dry_run_recovery_and_topology_notes_are_normal() {
        let names: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(Reason::as_str).collect();
        assert_eq!(names.len(), Reason::ALL.len());
        for r in Reason::ALL {
            let normal = r.as_str().starts_with("Would")
                || matches!(
                    r,
                    Reason::GangRecovered | Reason::GangFeasible | Reason::TopologyNotEnforced
                );
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
