//! The PodGroup writes this process made whose watch event has not come back yet, so that the
//! event announcing nothing but our own write does not reconcile the job again (issue 15: that
//! echo was almost half of all reconciles of a burst).
//!
//! A write is remembered by the resourceVersion of the API server's response. An event of the
//! PodGroup watch with exactly that resourceVersion is our write coming back: nothing changed
//! that the reconcile which wrote it did not already know. Any other event — someone else's
//! write, even one that landed between ours and its echo — carries another resourceVersion and
//! requeues the job as before. A relist forgets every entry (its events are not the echoes);
//! entries older than [`OWN_WRITE_TTL`] are dropped, so a missed echo costs a few bytes for a
//! minute at most, never a skipped change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::{Resource, ResourceExt};

use crate::backend::BackendKind;

/// How long an unmatched write is remembered.
pub const OWN_WRITE_TTL: Duration = Duration::from_secs(60);

/// A PodGroup: backend, namespace, name.
type Key = (BackendKind, String, String);

/// Our PodGroup writes whose watch events are still to come.
#[derive(Clone, Default)]
pub struct OwnWrites(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    pending: HashMap<Key, (String, Instant)>,
    /// When expired entries were last dropped.
    swept: Option<Instant>,
}

impl OwnWrites {
    /// Remembers that our write left the PodGroup at `resource_version`, unless the cache
    /// already holds that version (`cached_version`): then the echo has passed already.
    pub fn wrote(
        &self,
        backend: BackendKind,
        namespace: &str,
        name: &str,
        resource_version: &str,
        cached_version: Option<&str>,
    ) {
        if cached_version == Some(resource_version) {
            return;
        }
        let now = Instant::now();
        let mut inner = self.0.lock().expect("lock");
        if inner
            .swept
            .is_none_or(|s| now.duration_since(s) >= OWN_WRITE_TTL)
        {
            inner
                .pending
                .retain(|_, (_, at)| now.duration_since(*at) < OWN_WRITE_TTL);
            inner.swept = Some(now);
        }
        inner.pending.insert(
            (backend, namespace.to_string(), name.to_string()),
            (resource_version.to_string(), now),
        );
    }

    /// Whether an applied PodGroup from the watch is the echo of our own last write; an echo is
    /// forgotten once seen. Anything else (no entry, another version) is news.
    pub fn is_echo(&self, backend: BackendKind, pg: &impl Resource) -> bool {
        let Some(version) = pg.meta().resource_version.as_deref() else {
            return false;
        };
        let key = (backend, pg.namespace().unwrap_or_default(), pg.name_any());
        let mut inner = self.0.lock().expect("lock");
        match inner.pending.get(&key) {
            Some((v, _)) if v == version => {
                inner.pending.remove(&key);
                true
            }
            _ => false,
        }
    }

    /// Forgets one PodGroup (it was deleted).
    pub fn forget(&self, backend: BackendKind, pg: &impl Resource) {
        let key = (backend, pg.namespace().unwrap_or_default(), pg.name_any());
        self.0.lock().expect("lock").pending.remove(&key);
    }

    /// Forgets every write to `backend`'s PodGroups (its watch relists).
    pub fn forget_backend(&self, backend: BackendKind) {
        self.0
            .lock()
            .expect("lock")
            .pending
            .retain(|(b, _, _), _| *b != backend);
    }

    /// Writes still waiting for their echo.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.0.lock().expect("lock").pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;

    fn pg(name: &str, rv: &str) -> DynamicObject {
        let mut o = DynamicObject::new(
            name,
            &BackendKind::SchedulerPlugins.backend().api_resource(),
        )
        .within("ns");
        o.metadata.resource_version = Some(rv.into());
        o
    }

    const SP: BackendKind = BackendKind::SchedulerPlugins;

    #[test]
    fn the_echo_of_our_write_is_recognised_once() {
        let w = OwnWrites::default();
        w.wrote(SP, "ns", "a", "10", None);
        assert!(w.is_echo(SP, &pg("a", "10")));
        // Seen once: the same version again (a relist, a replay) is not skipped.
        assert!(!w.is_echo(SP, &pg("a", "10")));
        assert_eq!(w.pending(), 0);
    }

    #[test]
    fn someone_elses_write_is_news_before_and_after_our_echo() {
        let w = OwnWrites::default();
        w.wrote(SP, "ns", "a", "10", None);
        // Another writer's version that the watch brings before ours (it wrote first) …
        assert!(!w.is_echo(SP, &pg("a", "9")));
        assert!(w.is_echo(SP, &pg("a", "10")));
        // … or after ours.
        assert!(!w.is_echo(SP, &pg("a", "11")));
    }

    #[test]
    fn other_pod_groups_and_backends_are_not_echoes() {
        let w = OwnWrites::default();
        w.wrote(SP, "ns", "a", "10", None);
        assert!(!w.is_echo(SP, &pg("b", "10")));
        assert!(!w.is_echo(BackendKind::Volcano, &pg("a", "10")));
        assert!(w.is_echo(SP, &pg("a", "10")));
    }

    #[test]
    fn a_write_the_cache_already_holds_is_not_remembered() {
        let w = OwnWrites::default();
        // The watch delivered the echo before the write's response was handled.
        w.wrote(SP, "ns", "a", "10", Some("10"));
        assert_eq!(w.pending(), 0);
        assert!(!w.is_echo(SP, &pg("a", "10")));
        // The cache is behind our write: its echo is still to come.
        w.wrote(SP, "ns", "a", "12", Some("11"));
        assert_eq!(w.pending(), 1);
    }

    #[test]
    fn deletes_and_relists_forget() {
        let w = OwnWrites::default();
        w.wrote(SP, "ns", "a", "10", None);
        w.wrote(SP, "ns", "b", "11", None);
        w.wrote(BackendKind::Volcano, "ns", "c", "12", None);
        w.forget(SP, &pg("a", "13"));
        assert!(!w.is_echo(SP, &pg("a", "10")));
        w.forget_backend(SP);
        assert!(!w.is_echo(SP, &pg("b", "11")));
        assert_eq!(w.pending(), 1);
    }
}
