//! What `/healthz` and `/readyz` know about the watches: one probe per watched resource.
//!
//! A fault must end in one of two ways: the controller converges, or it says it cannot. Each
//! watch reports through its [`Probe`]: whether its cache has completed a list, whether it is in
//! the middle of a relist, whether its requests keep failing, and whether the task that drives it
//! is still running. Liveness fails when a watch's task stopped without being retired (its CRD
//! went away) or when a cache has not refreshed for longer than the stall limit; readiness fails
//! while any cache is unsynced, relisting or failing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::watcher;

/// Errors closer together than this are one failure streak. A failing watch retries within the
/// watch backoff cap (`WATCH_BACKOFF_MAX` in the watch module) plus a connect timeout, so a
/// longer quiet spell means its requests succeed again (a healthy watch may bring no events).
const STREAK_GAP: Duration = Duration::from_secs(15);

/// Readiness: true once discovery ran and every cache — jobs of each watched kind included —
/// is fresh (synced, not relisting, not failing).
#[derive(Clone, Default)]
pub struct Readiness {
    discovered: Arc<AtomicBool>,
    liveness: Liveness,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.not_ready().is_empty()
    }

    /// Why this instance is not ready; empty when it is.
    pub fn not_ready(&self) -> Vec<String> {
        let mut why = Vec::new();
        if !self.discovered.load(Ordering::Relaxed) {
            why.push("CRD discovery has not run".to_string());
        }
        why.extend(self.liveness.stale());
        why
    }

    /// The probes of every watch (for liveness).
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    pub(crate) fn set(&self, v: bool) {
        self.discovered.store(v, Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
struct WatchState {
    /// Which registration this is: a probe of an earlier registration (a watch stopped when its
    /// CRD went away) no longer reports.
    generation: u64,
    /// A complete list has reached the cache at least once.
    synced: bool,
    /// The task that drives the watch ended although nobody retired it.
    stopped: bool,
    /// A relist started (`Init`) and has not completed (`InitDone`).
    relisting_since: Option<Instant>,
    /// Start of the current failure streak.
    failing_since: Option<Instant>,
    last_error: Option<(Instant, String)>,
}

impl WatchState {
    fn failing(&self, now: Instant) -> Option<Duration> {
        let (at, _) = self.last_error.as_ref()?;
        if now.duration_since(*at) > STREAK_GAP {
            return None;
        }
        self.failing_since.map(|s| now.duration_since(s))
    }
}

/// The probes of every watch, by resource name.
#[derive(Clone, Default)]
pub struct Liveness(Arc<Mutex<Watches>>);

#[derive(Default)]
struct Watches {
    by_resource: BTreeMap<String, WatchState>,
    registrations: u64,
}

impl Liveness {
    /// Registers a watch (anew, if it was retired) and returns its probe.
    pub fn probe(&self, resource: impl Into<String>) -> Probe {
        let resource = resource.into();
        let mut watches = self.0.lock().expect("lock");
        watches.registrations += 1;
        let generation = watches.registrations;
        watches.by_resource.insert(
            resource.clone(),
            WatchState {
                generation,
                ..WatchState::default()
            },
        );
        Probe {
            resource,
            generation,
            liveness: self.clone(),
        }
    }

    /// Forgets a watch that was stopped on purpose (its CRD is no longer served).
    pub fn retire(&self, resource: &str) {
        self.0.lock().expect("lock").by_resource.remove(resource);
    }

    /// Why the process is not live: a stopped watch, or a cache that has not refreshed for
    /// `stall_after` (failing or relisting all that time). Empty when live.
    pub fn problems(&self, stall_after: Duration) -> Vec<String> {
        let now = Instant::now();
        let watches = self.0.lock().expect("lock");
        let mut out = Vec::new();
        for (resource, w) in watches.by_resource.iter() {
            if w.stopped {
                out.push(format!("the {resource} watch stopped"));
            }
            if let Some(d) = w.failing(now).filter(|d| *d >= stall_after) {
                let error = w.last_error.as_ref().map_or("", |(_, e)| e.as_str());
                out.push(format!(
                    "the {resource} cache has not refreshed for {}s: {error}",
                    d.as_secs()
                ));
            }
            if let Some(since) = w.relisting_since {
                let d = now.duration_since(since);
                if d >= stall_after {
                    out.push(format!(
                        "the {resource} relist has not completed for {}s",
                        d.as_secs()
                    ));
                }
            }
        }
        out
    }

    /// Caches that are not fresh now: never synced, relisting, failing, or stopped.
    pub fn stale(&self) -> Vec<String> {
        let now = Instant::now();
        let watches = self.0.lock().expect("lock");
        watches
            .by_resource
            .iter()
            .filter_map(|(resource, w)| {
                let why = if w.stopped {
                    "stopped"
                } else if !w.synced {
                    "not synced"
                } else if w.relisting_since.is_some() {
                    "relisting"
                } else if w.failing(now).is_some() {
                    "failing"
                } else {
                    return None;
                };
                Some(format!("{resource}: {why}"))
            })
            .collect()
    }

    fn update(&self, resource: &str, generation: u64, f: impl FnOnce(&mut WatchState)) {
        let mut watches = self.0.lock().expect("lock");
        if let Some(w) = watches.by_resource.get_mut(resource)
            && w.generation == generation
        {
            f(w);
        }
    }
}

/// One watch's handle on [`Liveness`].
#[derive(Clone)]
pub struct Probe {
    resource: String,
    generation: u64,
    liveness: Liveness,
}

impl Probe {
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Records one item of the watch stream. True when it starts a relist of a cache that had
    /// synced before (the watch expired or broke and could not resume).
    pub fn observe<K>(&self, event: &Result<watcher::Event<K>, watcher::Error>) -> bool {
        let now = Instant::now();
        let mut relist = false;
        self.liveness
            .update(&self.resource, self.generation, |w| match event {
                Ok(ev) => {
                    w.failing_since = None;
                    match ev {
                        watcher::Event::Init => {
                            relist = w.synced;
                            w.relisting_since = Some(now);
                        }
                        watcher::Event::InitDone => {
                            w.relisting_since = None;
                            w.synced = true;
                        }
                        _ => {}
                    }
                }
                Err(e) => {
                    let continues = w
                        .last_error
                        .as_ref()
                        .is_some_and(|(at, _)| now.duration_since(*at) <= STREAK_GAP);
                    if !continues || w.failing_since.is_none() {
                        w.failing_since = Some(now);
                    }
                    w.last_error = Some((now, e.to_string()));
                }
            });
        relist
    }

    /// A guard for the task that drives the watch: when the task ends (or panics) while the
    /// watch is still registered, liveness fails.
    pub fn task_guard(&self) -> TaskGuard {
        TaskGuard(self.clone())
    }
}

/// See [`Probe::task_guard`].
pub struct TaskGuard(Probe);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let p = &self.0;
        p.liveness
            .update(&p.resource, p.generation, |w| w.stopped = true);
    }
}

/// Reconciles in progress, for liveness: one stuck far longer than any API call could take
/// means the reconcile loop is wedged.
#[derive(Default)]
pub struct InFlight {
    next: std::sync::atomic::AtomicU64,
    started: Mutex<BTreeMap<u64, Instant>>,
}

/// Removes its reconcile from [`InFlight`] when dropped.
pub struct InFlightGuard<'a>(&'a InFlight, u64);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.started.lock().expect("lock").remove(&self.1);
    }
}

impl InFlight {
    pub fn enter(&self) -> InFlightGuard<'_> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.started
            .lock()
            .expect("lock")
            .insert(id, Instant::now());
        InFlightGuard(self, id)
    }

    /// How long the oldest reconcile in progress has been running.
    pub fn oldest(&self) -> Option<Duration> {
        self.started
            .lock()
            .expect("lock")
            .values()
            .map(|t| t.elapsed())
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err() -> Result<watcher::Event<()>, watcher::Error> {
        Err(watcher::Error::NoResourceVersion)
    }

    #[test]
    fn a_watch_is_stale_until_its_first_list_completes() {
        let l = Liveness::default();
        let p = l.probe("jobs");
        assert_eq!(l.stale(), vec!["jobs: not synced".to_string()]);
        p.observe::<()>(&Ok(watcher::Event::Init));
        p.observe::<()>(&Ok(watcher::Event::InitDone));
        assert!(l.stale().is_empty());
        assert!(l.problems(Duration::ZERO).is_empty());
    }

    #[test]
    fn a_relist_is_stale_until_done_and_a_problem_past_the_stall_limit() {
        let l = Liveness::default();
        let p = l.probe("jobs");
        assert!(!p.observe::<()>(&Ok(watcher::Event::Init)));
        p.observe::<()>(&Ok(watcher::Event::InitDone));
        assert!(p.observe::<()>(&Ok(watcher::Event::Init)), "a relist");
        assert_eq!(l.stale(), vec!["jobs: relisting".to_string()]);
        assert!(l.problems(Duration::from_secs(60)).is_empty());
        assert_eq!(l.problems(Duration::ZERO).len(), 1);
        p.observe::<()>(&Ok(watcher::Event::InitDone));
        assert!(l.problems(Duration::ZERO).is_empty());
    }

    #[test]
    fn failing_requests_make_a_cache_stale_and_any_success_ends_the_streak() {
        let l = Liveness::default();
        let p = l.probe("jobs");
        p.observe::<()>(&Ok(watcher::Event::InitDone));
        p.observe(&err());
        p.observe(&err());
        assert_eq!(l.stale(), vec!["jobs: failing".to_string()]);
        let problems = l.problems(Duration::ZERO);
        assert!(problems[0].contains("has not refreshed"), "{problems:?}");
        assert!(l.problems(Duration::from_secs(60)).is_empty());
        p.observe::<()>(&Ok(watcher::Event::InitDone));
        assert!(l.stale().is_empty());
    }

    #[test]
    fn a_task_that_ends_unretired_fails_liveness_and_a_retired_one_does_not() {
        let l = Liveness::default();
        let p = l.probe("jobs");
        drop(p.task_guard());
        assert_eq!(l.problems(Duration::from_secs(60)).len(), 1);
        let q = l.probe("podgroups");
        l.retire("podgroups");
        drop(q.task_guard());
        // A watch started again after its CRD returned is not hit by the old task's end.
        let old = l.probe("pytorchjobs");
        let _new = l.probe("pytorchjobs");
        drop(old.task_guard());
        l.retire("jobs");
        assert!(l.problems(Duration::from_secs(60)).is_empty());
    }
}
