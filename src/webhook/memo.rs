//! The job's part of a pod's link decision ([`link::Prepared`]: the job normalised, its
//! PodGroup target with the gang computed), worked out once per version of the job and of its
//! surroundings instead of once per pod: an operator creates a gang's pods in a burst, every one
//! asking the same question about the same job.
//!
//! An entry is good while the job's UID and resourceVersion, the count of changes the context
//! caches applied (namespaces, LimitRanges, PriorityClasses, RuntimeClasses: what the gang and
//! the backend are computed from) and the set of served backends are those it was made with.
//! What can change between two pods of one job version — the PodGroups cached, the pod itself
//! — is read for every pod. A job without a resourceVersion is never remembered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::link::{Prepared, Skip};
use crate::job::JobKind;

/// How many jobs are remembered; past it the memo starts again empty (a burst of pods keeps
/// asking about the same few jobs, so the next admissions refill it with the jobs in use).
const CAPACITY: usize = 4096;

/// What a decision needs from a job, or why the job cannot be read.
pub type JobPart = Arc<Result<Prepared, Skip>>;

/// A job: namespace, kind, version, name.
type Key = (String, &'static str, &'static str, String);

/// What an entry was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub uid: Option<String>,
    pub resource_version: String,
    /// [`crate::caches::Caches::context_changes`] when it was read.
    pub context: u64,
    /// The backends served then, one bit each.
    pub served: u8,
}

/// The remembered job parts.
#[derive(Default)]
pub struct Memo {
    entries: Mutex<HashMap<Key, (Version, JobPart)>>,
}

impl Memo {
    /// The job part of `name` at `version` (`None`: not to be remembered), made by `make` unless
    /// remembered; whether it was remembered.
    pub fn get_or_make(
        &self,
        kind: &'static JobKind,
        namespace: &str,
        name: &str,
        version: Option<Version>,
        make: impl FnOnce() -> Result<Prepared, Skip>,
    ) -> (JobPart, bool) {
        let Some(version) = version else {
            return (Arc::new(make()), false);
        };
        let key = (
            namespace.to_string(),
            kind.kind,
            kind.version,
            name.to_string(),
        );
        if let Some((v, part)) = self.entries.lock().expect("lock").get(&key)
            && *v == version
        {
            return (part.clone(), true);
        }
        // Made outside the lock: admissions of other jobs do not wait for this one.
        let part = Arc::new(make());
        let mut entries = self.entries.lock().expect("lock");
        if entries.len() >= CAPACITY && !entries.contains_key(&key) {
            entries.clear();
        }
        entries.insert(key, (version, part.clone()));
        (part, false)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().expect("lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::PYTORCHJOB;

    fn version(rv: &str, context: u64) -> Option<Version> {
        Some(Version {
            uid: Some("u".into()),
            resource_version: rv.into(),
            context,
            served: 1,
        })
    }

    #[test]
    fn a_job_part_is_made_once_per_version_of_the_job_and_its_surroundings() {
        let memo = Memo::default();
        let made = std::cell::Cell::new(0);
        let ask = |v: Option<Version>| {
            memo.get_or_make(&PYTORCHJOB, "ns", "train", v, || {
                made.set(made.get() + 1);
                Err(Skip::InvalidJob)
            })
            .1
        };
        assert!(!ask(version("1", 0)), "first: made");
        assert!(ask(version("1", 0)), "same version: remembered");
        assert!(!ask(version("2", 0)), "the job changed");
        assert!(!ask(version("2", 1)), "a context cache changed");
        let mut other_uid = version("2", 1);
        other_uid.as_mut().unwrap().uid = Some("v".into());
        assert!(!ask(other_uid), "recreated under its name");
        let mut unserved = version("2", 1);
        unserved.as_mut().unwrap().served = 0;
        assert!(!ask(unserved), "a backend's API went away");
        assert!(!ask(None), "no resourceVersion: never remembered");
        assert!(!ask(None));
        assert_eq!(made.get(), 7);
    }

    #[test]
    fn the_memo_is_bounded() {
        let memo = Memo::default();
        for i in 0..CAPACITY + 10 {
            memo.get_or_make(&PYTORCHJOB, "ns", &format!("j{i}"), version("1", 0), || {
                Err(Skip::InvalidJob)
            });
        }
        assert!(memo.len() <= CAPACITY, "{}", memo.len());
    }
}
