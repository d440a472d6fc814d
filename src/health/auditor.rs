//! Runs the stale-PodGroup audit (SPEC §10) every `--audit-interval-seconds` on the leader, once
//! every cache is fresh: deletes podgroup-sync's own stale PodGroups (UID precondition) and
//! reports the others once with a `StalePodGroup` Event. Reads only the caches; the one request
//! before a delete confirms that the job is really gone.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::{self, Timestamp};
use kube::Api;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::audit::{self, Finding, Owner, Stale};
use crate::backend::{BACKENDS, BackendKind};
use crate::caches::{CachedJob, Caches};
use crate::enablement::Mode;
use crate::events::Reason;
use crate::liveness::Readiness;
use crate::packed::Packed;
use crate::plan::{Delete, PodGroups};
use crate::reconcile::{Context, delete_pod_group};

/// The age a PodGroup must reach before it is judged (and one audit interval, if shorter).
const MIN_AGE: Duration = Duration::from_secs(60);

/// How often a pass that could not run (not leading, caches not fresh) is tried again.
const RETRY: Duration = Duration::from_secs(1);

impl audit::Jobs for Caches {
    fn owner(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Owner {
        let Some(kind) = crate::kinds::lookup(api_version, kind) else {
            return Owner::NotWatched;
        };
        match self.job(kind, namespace, name) {
            CachedJob::KindNotWatched => Owner::NotWatched,
            CachedJob::Absent => Owner::Absent,
            CachedJob::Found(j) => Owner::Found {
                uid: j.uid().unwrap_or_default(),
                finished: kind.rules.finished(j.data().get("status")),
            },
        }
    }
}

/// Starts the audit loop (nothing when the interval is zero).
pub fn spawn(
    ctx: Arc<Context>,
    readiness: Readiness,
    mut shutdown: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let interval = ctx.settings.audit_interval;
    if interval.is_zero() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut reported = HashSet::new();
        loop {
            let wait = if *ctx.leading.borrow() && readiness.is_ready() {
                pass(&ctx, &mut reported).await;
                interval
            } else {
                RETRY
            };
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }))
}

/// One audit pass. `reported`: the foreign PodGroups reported by earlier passes.
async fn pass(ctx: &Context, reported: &mut HashSet<String>) {
    let started = Instant::now();
    let stores = ctx.caches.pod_groups.read().expect("lock").clone();
    let all: Vec<(BackendKind, Arc<Packed>)> = stores
        .iter()
        .flat_map(|(b, s)| s.state().into_iter().map(move |pg| (*b, pg)))
        .collect();
    // A PodGroup is judged once it is older than one audit interval (at most a minute).
    let grace = ctx.settings.audit_interval.min(MIN_AGE);
    let rules = audit::Rules {
        keep_finished: ctx.settings.keep_finished,
        instance: &ctx.settings.backend_options.instance,
        created_before: Timestamp::now()
            - jiff::SignedDuration::try_from(grace).unwrap_or_default(),
    };
    let findings = audit::audit(
        all.iter().map(|(b, pg)| (*b, pg.as_ref())),
        &ctx.caches,
        rules,
    );
    let mut foreign: BTreeMap<(BackendKind, Stale), i64> = BTreeMap::new();
    let mut deleted = 0;
    let mut kept_dry_run = 0;
    for f in &findings {
        // A dry-run namespace sees no write of any kind: ours are reported, not deleted.
        let dry_run = f.ours && namespace_mode(ctx, &f.namespace) == Mode::DryRun;
        if f.ours && !dry_run {
            deleted += delete_ours(ctx, f).await as usize;
            continue;
        }
        let (reason, note) = if dry_run {
            kept_dry_run += 1;
            (Reason::WouldDeletePodGroup, f.dry_run_note())
        } else {
            *foreign.entry((f.backend, f.reason)).or_default() += 1;
            (Reason::StalePodGroup, f.note())
        };
        if !reported.contains(&f.uid) && report(ctx, f, reason, note).await {
            reported.insert(f.uid.clone());
        }
    }
    reported.retain(|uid| findings.iter().any(|f| &f.uid == uid));
    for b in BACKENDS {
        for r in [Stale::OwnerDeleted, Stale::OwnerFinished] {
            ctx.metrics
                .health
                .stale_pod_groups
                .with_label_values(&[b.as_str(), r.as_str()])
                .set(foreign.get(&(b, r)).copied().unwrap_or(0));
        }
    }
    let took = started.elapsed();
    ctx.metrics
        .health
        .audit_duration
        .observe(took.as_secs_f64());
    let stale_foreign: i64 = foreign.values().sum();
    if deleted > 0 || stale_foreign > 0 || kept_dry_run > 0 {
        info!(
            podgroups = all.len(),
            deleted,
            stale_foreign,
            kept_dry_run,
            ms = took.as_millis() as u64,
            "stale-PodGroup audit"
        );
    } else {
        debug!(
            podgroups = all.len(),
            ms = took.as_millis() as u64,
            "stale-PodGroup audit: nothing stale"
        );
    }
}

/// Deletes one of our stale PodGroups; for a job missing from the cache, one GET first
/// confirms it is gone (a cache can lag). True when deleted.
async fn delete_ours(ctx: &Context, f: &Finding) -> bool {
    if let (Stale::OwnerDeleted, Some(pg)) =
        (f.reason, ctx.caches.get(f.backend, &f.namespace, &f.name))
        && !owner_gone(ctx, &pg).await
    {
        return false;
    }
    let delete = Delete {
        backend: f.backend,
        name: f.name.clone(),
        uid: Some(f.uid.clone()),
    };
    match delete_pod_group(ctx, &f.namespace, &delete).await {
        Ok(()) => {
            ctx.metrics
                .health
                .stale_deleted
                .with_label_values(&[f.backend.as_str(), f.reason.as_str()])
                .inc();
            info!(namespace = %f.namespace, podgroup = %f.name, backend = %f.backend, reason = f.reason.as_str(), owner = ?f.owner, "deleted a stale PodGroup of ours");
            true
        }
        Err(e) => {
            warn!(error = %e, "could not delete a stale PodGroup; the next audit tries again");
            false
        }
    }
}

/// Whether the PodGroup's controller job is really gone (not found, or another UID).
async fn owner_gone(ctx: &Context, pg: &DynamicObject) -> bool {
    let Some(owner) = pg
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
    else {
        return true;
    };
    let Some(kind) = crate::kinds::lookup(&owner.api_version, &owner.kind) else {
        return false;
    };
    let api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &pg.namespace().unwrap_or_default(),
        &kind.api_resource(),
    );
    match api.get_opt(&owner.name).await {
        Ok(None) => true,
        Ok(Some(job)) => job.uid().as_deref() != Some(owner.uid.as_str()),
        Err(e) => {
            warn!(error = %e, job = %owner.name, "could not confirm a job is gone; its PodGroup is kept for now");
            false
        }
    }
}

/// The mode of a namespace, from the namespace cache.
fn namespace_mode(ctx: &Context, namespace: &str) -> Mode {
    let ns = ctx.caches.namespaces.get(&ObjectRef::new(namespace));
    ctx.settings
        .enablement
        .namespace_mode(ns.as_ref().and_then(|n| n.metadata.annotations.as_ref()))
}

/// Publishes a stale PodGroup's Event (`StalePodGroup` on a foreign one, `WouldDeletePodGroup`
/// on one of ours in a dry-run namespace); true when published (or refused for good).
async fn report(ctx: &Context, f: &Finding, reason: Reason, note: String) -> bool {
    let ar = f.backend.backend().api_resource();
    let regarding = ObjectReference {
        api_version: Some(ar.api_version),
        kind: Some(ar.kind),
        name: Some(f.name.clone()),
        namespace: Some(f.namespace.clone()),
        uid: Some(f.uid.clone()),
        ..ObjectReference::default()
    };
    match ctx.events.publish(&regarding, reason, note).await {
        Ok(()) => true,
        Err(e) => {
            debug!(error = %e, reason = reason.as_str(), "stale-PodGroup Event not published; the next audit tries again");
            false
        }
    }
}
