//! Which PodGroups each job controls, by the job's UID: kept by the PodGroup watches, read by
//! the planner's caches. Below both.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::{Resource, ResourceExt};

use crate::backend::BackendKind;

/// PodGroups by the UID of their controller, kept by the PodGroup reflectors, so that a
/// reconcile finds the PodGroups its job owns without scanning every cached PodGroup. Entries
/// may be stale (a delete missed across a re-list): readers check them against the cache.
/// A job almost always has one PodGroup, so each entry is a short sorted vector (a B-tree set
/// allocates a node for eleven).
#[derive(Clone, Default)]
pub struct OwnedIndex(Arc<Mutex<HashMap<String, Vec<OwnedKey>>>>);

/// A cached PodGroup: its backend, namespace and name.
type OwnedKey = (BackendKind, String, String);

impl OwnedIndex {
    /// The controller UID and key of a PodGroup, if it has a controller.
    fn entry(backend: BackendKind, pg: &impl Resource) -> Option<(String, OwnedKey)> {
        let uid = pg
            .meta()
            .owner_references
            .as_ref()?
            .iter()
            .find(|r| r.controller == Some(true))?
            .uid
            .clone();
        Some((
            uid,
            (backend, pg.namespace().unwrap_or_default(), pg.name_any()),
        ))
    }

    /// Records an applied (`deleted` false) or deleted PodGroup of `backend`.
    pub fn observe(&self, backend: BackendKind, pg: &impl Resource, deleted: bool) {
        let Some((uid, key)) = Self::entry(backend, pg) else {
            return;
        };
        let mut index = self.0.lock().expect("lock");
        if deleted {
            if let Some(set) = index.get_mut(&uid) {
                if let Ok(i) = set.binary_search(&key) {
                    set.remove(i);
                }
                if set.is_empty() {
                    index.remove(&uid);
                }
            }
        } else {
            insert_sorted(index.entry(uid).or_default(), key);
        }
    }

    /// Replaces every entry of `backend` with the PodGroups of a freshly listed cache.
    pub fn replace<K: Resource>(&self, backend: BackendKind, pgs: &[Arc<K>]) {
        let entries: Vec<_> = pgs
            .iter()
            .filter_map(|pg| Self::entry(backend, pg.as_ref()))
            .collect();
        let mut index = self.0.lock().expect("lock");
        index.retain(|_, set| {
            set.retain(|(b, _, _)| *b != backend);
            !set.is_empty()
        });
        for (uid, key) in entries {
            insert_sorted(index.entry(uid).or_default(), key);
        }
    }

    pub fn owned_by(&self, uid: &str) -> Vec<OwnedKey> {
        self.0
            .lock()
            .expect("lock")
            .get(uid)
            .map(|s| s.to_vec())
            .unwrap_or_default()
    }
}

fn insert_sorted(set: &mut Vec<OwnedKey>, key: OwnedKey) {
    if let Err(i) = set.binary_search(&key) {
        // Room for this one only: a growing vector makes room for four at once, and most jobs
        // have one PodGroup.
        set.reserve_exact(1);
        set.insert(i, key);
    }
}
