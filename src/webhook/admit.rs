//! One admission: an AdmissionReview → the caches' view of the pod's job → the [`link`]
//! decision → the response, counted and timed. No API call: everything comes from the caches
//! the controller keeps. A job created a moment ago may reach the operator before it reaches
//! our cache: the admission waits for it (up to `owner_wait`), then admits the pod unchanged,
//! counted as an error and logged with the job's name. A pod of a job the cache still shows
//! suspended, or linked to a PodGroup the cache does not hold yet, is looked at again for a
//! moment ([`Look`]): the usual case right after Kueue admits a job.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::Resource as _;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::link::{self, Decision, Owner, PodView, Skip};
use super::memo::{JobPart, Memo, Version};
use super::review::{self, Request};
use crate::backend::BACKENDS;
use crate::caches::{CachedJob, Caches};
use crate::packed::Packed;
use crate::settings::Settings;
use crate::target::PodGroups;

/// How often a missing job or unsynced cache is looked at again while an admission waits.
const POLL: Duration = Duration::from_millis(10);

/// The admission result labels (SPEC §8) and the causes of `error`.
pub const RESULTS: [&str; 4] = ["linked", "unchanged", "skipped", "error"];
pub const ERRORS: [&str; 6] = [
    "malformed_review",
    "malformed_pod",
    "caches_not_synced",
    "owner_not_cached",
    "request_too_large",
    "overloaded",
];

/// The admission metrics.
#[derive(Clone)]
pub struct AdmissionMetrics {
    /// `podgroup_sync_admissions_total{result,reason}`.
    pub admissions: IntCounterVec,
    /// `podgroup_sync_admission_duration_seconds`.
    pub duration: Histogram,
    /// `podgroup_sync_webhook_connections_total{result}`: TLS connections accepted or failed.
    pub connections: IntCounterVec,
}

impl AdmissionMetrics {
    pub fn new(registry: &Registry) -> Self {
        let admissions = IntCounterVec::new(
            Opts::new(
                "podgroup_sync_admissions_total",
                "Pod admissions by the pod-link webhook, by result (linked, unchanged, skipped, error) and reason (the backend, why it was skipped, or the error)",
            ),
            &["result", "reason"],
        )
        .expect("metric");
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "podgroup_sync_admission_duration_seconds",
                "Time from an AdmissionReview's arrival to its response, waits for the cache included",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0, 2.5, 5.0,
            ]),
        )
        .expect("metric");
        registry
            .register(Box::new(admissions.clone()))
            .expect("register");
        registry
            .register(Box::new(duration.clone()))
            .expect("register");
        let connections = IntCounterVec::new(
            Opts::new(
                "podgroup_sync_webhook_connections_total",
                "TLS connections to the webhook, by result (accepted, handshake_failed; overflow: past the connection bound, served once); a rate close to the admissions' means the API server does not reuse connections",
            ),
            &["result"],
        )
        .expect("metric");
        registry
            .register(Box::new(connections.clone()))
            .expect("register");
        for r in ["accepted", "handshake_failed", "overflow"] {
            connections.with_label_values(&[r]);
        }
        // Every series exists from the start, so rates and alerts see zeros, not gaps.
        for b in BACKENDS {
            for result in ["linked", "unchanged"] {
                admissions.with_label_values(&[result, b.as_str()]);
            }
        }
        for s in Skip::ALL {
            admissions.with_label_values(&["skipped", s.as_str()]);
        }
        for e in ERRORS {
            admissions.with_label_values(&["error", e]);
        }
        AdmissionMetrics {
            admissions,
            duration,
            connections,
        }
    }
}

/// What an admission ends with: the result and reason labels and the patch, if any.
#[derive(Debug)]
struct Verdict {
    result: &'static str,
    reason: &'static str,
    patch: Option<Value>,
    warning: Option<String>,
}

impl Verdict {
    fn skipped(skip: Skip) -> Self {
        Verdict {
            result: "skipped",
            reason: skip.as_str(),
            patch: None,
            warning: None,
        }
    }

    fn error(cause: &'static str, warning: String) -> Self {
        Verdict {
            result: "error",
            reason: cause,
            patch: None,
            warning: Some(warning),
        }
    }
}

/// Answers AdmissionReviews from the controller's caches.
pub struct Admission {
    /// The caches, once the controller has synced them.
    pub caches: watch::Receiver<Option<Caches>>,
    pub settings: Settings,
    /// How long an admission waits for the caches and the pod's job (and for a job the cache
    /// still shows suspended).
    pub owner_wait: Duration,
    /// How long a linked pod waits for its PodGroup to reach the cache.
    pub pod_group_wait: Duration,
    pub metrics: AdmissionMetrics,
    /// Set once the process is stopping: every answer then closes its connection, so the API
    /// server opens its next one to another replica (see `--webhook-drain-seconds`).
    pub draining: Arc<AtomicBool>,
    /// The job parts of recent decisions.
    pub memo: Memo,
}

impl Admission {
    /// The response to an AdmissionReview body, or why the body is refused (one that is not an
    /// AdmissionReview has no uid to answer; the server replies 400 with the reason).
    pub async fn review(&self, body: &[u8]) -> Result<Vec<u8>, String> {
        let start = Instant::now();
        let request = match review::parse(body) {
            Ok(r) => r,
            Err(e) => {
                self.count("error", "malformed_review", start);
                warn!(error = %e, "malformed AdmissionReview refused");
                return Err(e);
            }
        };
        let verdict = self.decide(&request, start).await;
        self.count(verdict.result, verdict.reason, start);
        let warnings: Vec<String> = verdict.warning.into_iter().collect();
        Ok(review::response(
            &request.uid,
            verdict.patch.as_ref(),
            &warnings,
        ))
    }

    /// Counts a request that never reached a decision (the body was too large or too slow).
    pub fn refused(&self, cause: &'static str, start: Instant) {
        self.count("error", cause, start);
    }

    fn count(&self, result: &str, reason: &str, start: Instant) {
        self.metrics
            .admissions
            .with_label_values(&[result, reason])
            .inc();
        self.metrics.duration.observe(start.elapsed().as_secs_f64());
    }

    async fn decide(&self, request: &Request<'_>, start: Instant) -> Verdict {
        if !request.is_pod_create() {
            // The webhook configuration sends only Pod CREATE; anything else passes.
            return Verdict::skipped(Skip::NotPodCreate);
        }
        let pod = match review::pod(request) {
            Ok(p) => p,
            Err(e) => {
                warn!(uid = %request.uid, error = %e, "malformed pod admitted unchanged");
                return Verdict::error("malformed_pod", format!("podgroup-sync: {e}"));
            }
        };
        let owners = pod.metadata.owner_references.clone().unwrap_or_default();
        let view = PodView {
            name: pod.metadata.name.as_deref(),
            labels: pod.metadata.labels.as_ref(),
            annotations: pod.metadata.annotations.as_ref(),
            owner_references: &owners,
            scheduler_name: pod.scheduler_name.as_deref(),
            scheduling_group: pod.scheduling_group,
        };
        let owner = match link::owner_of(&view) {
            Ok(o) => o,
            Err(skip) => return Verdict::skipped(skip),
        };
        let namespace = request
            .namespace
            .clone()
            .or(pod.metadata.namespace.clone())
            .unwrap_or_default();
        let deadline = start + self.owner_wait;
        let Some(caches) = self.synced_caches(deadline).await else {
            warn!(namespace, job = %owner.name, "pod admitted unchanged: the caches are not synced yet");
            return Verdict::error(
                "caches_not_synced",
                "podgroup-sync: caches not synced; the pod is not linked to its PodGroup".into(),
            );
        };
        // Counted before the namespace is read: a change applied after this makes the job's
        // part be made again, never remembered from an older namespace.
        let context_changes = caches.context_changes.load(Ordering::Acquire);
        let ns = caches
            .namespaces
            .get(&kube::runtime::reflector::ObjectRef::new(&namespace));
        let ns_annotations = ns.as_ref().and_then(|n| n.metadata.annotations.as_ref());
        if let Some(skip) = link::namespace_gate(&self.settings.enablement, ns_annotations) {
            return Verdict::skipped(skip);
        }
        let job = match wait_for_job(&caches, &owner, &namespace, deadline).await {
            Ok(job) => job,
            Err(verdict) => {
                if verdict.result == "error" {
                    warn!(namespace, kind = owner.kind.kind, job = %owner.name, waited_ms = self.owner_wait.as_millis() as u64,
                        "pod admitted unchanged: its job is not in the cache; it is not linked to its PodGroup");
                }
                return verdict;
            }
        };
        let around = Around {
            namespace: &namespace,
            namespace_annotations: ns_annotations,
            context_changes,
        };
        let decision = self
            .settle(&view, &owner, job, &caches, around, start, deadline)
            .await;
        verdict_of(
            decision,
            &view,
            &namespace,
            &owner,
            request.dry_run == Some(true),
        )
    }

    /// The link decision, looked at again while the cache is behind the pod ([`Look`]).
    #[allow(clippy::too_many_arguments)]
    async fn settle(
        &self,
        view: &PodView<'_>,
        owner: &Owner,
        job: Arc<Packed>,
        caches: &Caches,
        around: Around<'_>,
        start: Instant,
        deadline: Instant,
    ) -> Decision {
        let mut job = job;
        let pod_group_deadline = start + self.pod_group_wait;
        loop {
            let part = self.job_part(owner, &job, caches, &around);
            let decision = link::decide_prepared(view, owner, &part, caches, &self.settings);
            let look = Look {
                pod_group_cached: |b, n: &str| {
                    crate::target::PodGroups::get(caches, b, around.namespace, n).is_some()
                },
                now: Instant::now(),
                owner_deadline: deadline,
                pod_group_deadline,
            };
            if !look.again(&decision) {
                break decision;
            }
            tokio::time::sleep(POLL).await;
            if let CachedJob::Found(newer) = caches.job(owner.kind, around.namespace, &owner.name)
                && newer.meta().uid == job.meta().uid
            {
                job = newer;
            }
        }
    }

    /// The job's part of the decision, remembered per version of the job and of its
    /// surroundings ([`Memo`]).
    fn job_part(&self, owner: &Owner, job: &Packed, caches: &Caches, around: &Around) -> JobPart {
        let served = BACKENDS
            .iter()
            .enumerate()
            .filter(|(_, b)| caches.served(**b))
            .fold(0u8, |bits, (i, _)| bits | 1 << i);
        let version = job.meta().resource_version.clone().map(|rv| Version {
            uid: job.meta().uid.clone(),
            resource_version: rv,
            context: around.context_changes,
            served,
        });
        let make = || {
            let priorities = caches.priorities();
            let defaults = caches.admission_defaults(around.namespace);
            let ctx = link::Context {
                namespace_annotations: around.namespace_annotations,
                pod_groups: caches,
                priorities: &priorities,
                defaults: &defaults,
                settings: &self.settings,
            };
            link::prepare(owner.kind, &job.unpack(), &ctx)
        };
        let (part, _remembered) =
            self.memo
                .get_or_make(owner.kind, around.namespace, &owner.name, version, make);
        part
    }

    /// The caches, waiting for the controller to sync them until `deadline`.
    async fn synced_caches(&self, deadline: Instant) -> Option<Caches> {
        let mut rx = self.caches.clone();
        let wait = rx.wait_for(Option::is_some);
        match tokio::time::timeout_at(deadline.into(), wait).await {
            Ok(Ok(caches)) => caches.clone(),
            _ => None,
        }
    }
}

/// What an admission read around the pod's job: its namespace, and the context caches' change
/// count from before the namespace was read.
#[derive(Clone, Copy)]
struct Around<'a> {
    namespace: &'a str,
    namespace_annotations: Option<&'a std::collections::BTreeMap<String, String>>,
    context_changes: u64,
}

/// Whether a decision is the cache being behind the pod, and so worth another look (SPEC §12):
/// a pod of a job the cache still shows suspended (an operator makes no pods for a suspended
/// job: Kueue admitted it a moment ago) until the owner deadline, and a pod linked to a
/// PodGroup the cache does not hold yet (the controller is creating it) until the PodGroup
/// deadline — so a gang's PodGroup exists before its first pod.
struct Look<F> {
    pod_group_cached: F,
    now: Instant,
    owner_deadline: Instant,
    pod_group_deadline: Instant,
}

impl<F: Fn(crate::backend::BackendKind, &str) -> bool> Look<F> {
    fn again(&self, decision: &Decision) -> bool {
        match decision {
            Decision::Skipped(Skip::Suspended) => self.now < self.owner_deadline,
            Decision::Link { backend, name, .. } => {
                self.now < self.pod_group_deadline && !(self.pod_group_cached)(*backend, name)
            }
            _ => false,
        }
    }
}

/// How long a pod whose controller reference names a cached job of another UID waits for the
/// cache to catch up (a job deleted and recreated under its name, its new pods a moment ahead
/// of our watch) before it is taken for a stale or forged reference.
const OTHER_UID_WAIT: Duration = Duration::from_millis(250);

/// The job of `owner` from the cache; while it is absent, looks again until `deadline`. A job of
/// that name cached with another UID is looked at again only for [`OTHER_UID_WAIT`]: then the
/// pod is skipped (`owner_uid_mismatch`), not counted as an error.
async fn wait_for_job(
    caches: &Caches,
    owner: &Owner,
    namespace: &str,
    deadline: Instant,
) -> Result<Arc<Packed>, Verdict> {
    let mut other_uid_since = None;
    loop {
        let seen = caches.job(owner.kind, namespace, &owner.name);
        let now = Instant::now();
        match judge(&seen, owner, namespace, now, &mut other_uid_since, deadline) {
            Wait::Found => {
                let CachedJob::Found(job) = seen else {
                    unreachable!("judged found")
                };
                return Ok(job);
            }
            Wait::Again => {}
            Wait::Done(verdict) => return Err(verdict),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What one look at the cache decides.
#[derive(Debug)]
enum Wait {
    Found,
    Again,
    Done(Verdict),
}

/// One look at the cache (pure): found, look again, or the verdict.
fn judge(
    seen: &CachedJob,
    owner: &Owner,
    namespace: &str,
    now: Instant,
    other_uid_since: &mut Option<Instant>,
    deadline: Instant,
) -> Wait {
    match seen {
        CachedJob::Found(job)
            if owner.uid.is_none() || job.meta().uid.as_ref() == owner.uid.as_ref() =>
        {
            return Wait::Found;
        }
        CachedJob::Found(_) => {
            let since = *other_uid_since.get_or_insert(now);
            if now >= since + OTHER_UID_WAIT {
                return Wait::Done(Verdict::skipped(Skip::OwnerUidMismatch));
            }
        }
        _ => *other_uid_since = None,
    }
    if now < deadline {
        return Wait::Again;
    }
    Wait::Done(match seen {
        CachedJob::KindNotWatched => Verdict::skipped(Skip::KindNotWatched),
        _ => Verdict::error(
            "owner_not_cached",
            format!(
                "podgroup-sync: {} {namespace}/{} is not in its cache yet; the pod is not linked to its PodGroup",
                owner.kind.kind, owner.name
            ),
        ),
    })
}

fn verdict_of(
    decision: Decision,
    view: &PodView,
    namespace: &str,
    owner: &Owner,
    dry_run: bool,
) -> Verdict {
    match decision {
        Decision::Link {
            backend,
            name,
            additions,
        } => {
            let added: Vec<String> = additions.iter().map(ToString::to_string).collect();
            debug!(namespace, job = %owner.name, %backend, pod_group = %name, dry_run, added = ?added, "pod linked");
            Verdict {
                result: "linked",
                reason: backend.as_str(),
                patch: Some(link::json_patch(view, &additions)),
                warning: None,
            }
        }
        Decision::Unchanged { backend, .. } => Verdict {
            result: "unchanged",
            reason: backend.as_str(),
            patch: None,
            warning: None,
        },
        Decision::Skipped(skip) => {
            if matches!(
                skip,
                Skip::Conflict | Skip::InvalidJob | Skip::UnknownBackend
            ) {
                info!(namespace, job = %owner.name, reason = skip.as_str(), "pod admitted without a link");
            }
            Verdict::skipped(skip)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kube::api::DynamicObject;
    use serde_json::json;

    use super::*;

    fn job(uid: &str) -> CachedJob {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "train", "namespace": "ns", "uid": uid}}))
        .unwrap();
        CachedJob::Found(Arc::new(crate::packed::Packed::pack(obj)))
    }

    fn owner(uid: &str) -> Owner {
        Owner {
            kind: &crate::job::PYTORCHJOB,
            name: "train".into(),
            uid: Some(uid.into()),
            pod_set: None,
            group: None,
        }
    }

    #[test]
    fn rule_12_a_suspended_job_or_an_uncached_pod_group_is_looked_at_again_until_its_deadline() {
        let t0 = Instant::now();
        let look = |now, cached: bool| Look {
            pod_group_cached: move |_, _: &str| cached,
            now,
            owner_deadline: t0 + Duration::from_secs(2),
            pod_group_deadline: t0 + Duration::from_secs(1),
        };
        let link = Decision::Link {
            backend: crate::backend::BackendKind::Volcano,
            name: "train".into(),
            additions: vec![],
        };
        let suspended = Decision::Skipped(Skip::Suspended);
        assert!(look(t0, false).again(&link));
        assert!(!look(t0, true).again(&link), "the PodGroup is cached");
        assert!(!look(t0 + Duration::from_secs(1), false).again(&link));
        assert!(look(t0 + Duration::from_secs(1), false).again(&suspended));
        assert!(!look(t0 + Duration::from_secs(2), false).again(&suspended));
        assert!(!look(t0, false).again(&Decision::Skipped(Skip::Finished)));
    }

    #[test]
    fn a_pod_of_another_uid_than_the_cached_jobs_is_skipped_after_a_short_wait() {
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(2);
        let mut since = None;
        let forged = owner("forged");
        assert!(matches!(
            judge(&job("real"), &forged, "ns", t0, &mut since, deadline),
            Wait::Again
        ));
        let later = t0 + OTHER_UID_WAIT;
        let Wait::Done(v) = judge(&job("real"), &forged, "ns", later, &mut since, deadline) else {
            panic!("still waiting")
        };
        assert_eq!((v.result, v.reason), ("skipped", "owner_uid_mismatch"));
        // The cache catching up within the wait finds the job.
        let mut since = None;
        let _ = judge(&job("old"), &owner("new"), "ns", t0, &mut since, deadline);
        assert!(matches!(
            judge(
                &job("new"),
                &owner("new"),
                "ns",
                t0 + OTHER_UID_WAIT / 2,
                &mut since,
                deadline
            ),
            Wait::Found
        ));
        // A job absent from the cache is waited for until the deadline, then an error.
        let mut since = None;
        assert!(matches!(
            judge(
                &CachedJob::Absent,
                &forged,
                "ns",
                t0 + OTHER_UID_WAIT,
                &mut since,
                deadline
            ),
            Wait::Again
        ));
        let Wait::Done(v) = judge(
            &CachedJob::Absent,
            &forged,
            "ns",
            deadline,
            &mut since,
            deadline,
        ) else {
            panic!("still waiting")
        };
        assert_eq!((v.result, v.reason), ("error", "owner_not_cached"));
    }
}
