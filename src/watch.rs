//! Watches that lose nothing across a fault: a short reconnect backoff, and objects handed on
//! only once the cache holds them.
//!
//! kube-runtime's reflector buffers a relist and swaps it into its store only when the relist
//! completes (`InitDone`), but passes each relisted object downstream as it arrives
//! (`InitApply`). Anything that looks an object up in the store on such an event — a
//! controller's reconcile, a trigger that scans the cache — reads the store of *before* the
//! relist, so an object created while the watch was down is not found and is dropped. After an
//! API-server restart that lost every job created during the outage. Here relisted objects are
//! handed on only at `InitDone`, when the store holds all of them, and a relist of a context
//! cache (namespaces, PodGroups, …) makes every job be looked at again.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt, future};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::backend::BackendKind;
use crate::liveness::Probe;
use crate::metrics::Metrics;
use crate::own_writes::OwnWrites;
use crate::owned::OwnedIndex;
use crate::packed::Packed;
use crate::trigger::{Trigger, owner_trigger};

/// Objects per page of a job cache's (re)list. A page is parsed whole before each object is
/// stripped (see `strip`), so the page bounds the transient memory of a list: 500 (the client's
/// default) jobs of realistic templates parse to ~70 MiB, which the allocator keeps as peak RSS.
/// 100 costs 5× the list requests (50 for 5,000 jobs, served from the API server's watch cache).
pub const LIST_PAGE_SIZE: u32 = 100;

/// Objects per page of a PodGroup cache's (re)list. A PodGroup is packed and stripped as it is
/// read (see `lean`), so a page costs its text and little more: 500 (the client's default) asks
/// for a fifth of the pages [`LIST_PAGE_SIZE`] would. A restart at 20,000 jobs was 12–33 %
/// quicker for it (two pairs of runs), with the same peak RSS.
pub const POD_GROUP_LIST_PAGE_SIZE: u32 = 500;

/// First reconnect delay of a failed watch.
pub const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// Longest reconnect delay of a failed watch: a watch is back within this (plus a connect) once
/// the API server is. A failing watch costs one request per this interval.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Exponential reconnect backoff for watches: 250 ms doubling to 2 s, each delay drawn from
/// [½, 1] of its step so that many watchers do not reconnect in step; reset by any success.
pub struct WatchBackoff {
    step: Duration,
    seed: u64,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        WatchBackoff {
            step: WATCH_BACKOFF_MIN,
            seed,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        // xorshift64: jitter needs no cryptographic randomness.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let fraction = 0.5 + (self.seed % 1000) as f64 / 2000.0;
        let delay = self.step.mul_f64(fraction);
        self.step = (self.step * 2).min(WATCH_BACKOFF_MAX);
        Some(delay)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.step = WATCH_BACKOFF_MIN;
    }
}

/// Where a cache's first list stands (see [`reflect_settled`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FirstList {
    NotStarted,
    /// Listed objects go straight into the (so far empty) store.
    Direct,
    /// The first list broke off and started over: objects go into the store and into the
    /// list's buffer, which replaces the store at the end, dropping what the broken attempt
    /// brought and the completed one did not.
    Buffered,
    Done,
}

/// Applies a watch stream to `writer`'s store and yields the objects to reconcile, as
/// references, each only once the store holds it: an applied object as it comes; after a
/// relist, every object of the store at `InitDone`, when the store holds them all (until then
/// it must keep what it held before). The **first** list is different: the store is still
/// empty, so nothing can be read stale by filling it early, and each listed object goes into
/// the store and is handed on as its page arrives — work starts with the first page, not after
/// the last (5,000 jobs are 50 pages). The store is marked ready at once (kube-runtime's
/// controller holds its runner until then); readiness of the process still waits for the list
/// (see `liveness`). Errors are dropped: `observe` counts and logs them, and the watcher retries.
pub fn reflect_settled<K, S>(
    stream: S,
    mut writer: reflector::store::Writer<K>,
    dt: K::DynamicType,
) -> impl Stream<Item = ObjectRef<K>> + Send
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    type Items<K> = Box<dyn Iterator<Item = ObjectRef<K>> + Send>;
    // An empty list's end: swaps the empty buffer into the empty store and marks it ready.
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let store = writer.as_reader();
    let mut first = FirstList::NotStarted;
    stream.flat_map(move |event| {
        let one = |obj: &K| -> Items<K> {
            Box::new(std::iter::once(ObjectRef::from_obj_with(obj, dt.clone())))
        };
        let items: Items<K> = match (event, first) {
            (Ok(watcher::Event::Init), FirstList::NotStarted) => {
                first = FirstList::Direct;
                Box::new(std::iter::empty())
            }
            (Ok(ev @ watcher::Event::Init), FirstList::Direct | FirstList::Buffered) => {
                first = FirstList::Buffered;
                writer.apply_watcher_event(&ev);
                Box::new(std::iter::empty())
            }
            (Ok(watcher::Event::InitApply(obj)), FirstList::Direct) => {
                let items = one(&obj);
                writer.apply_watcher_event(&watcher::Event::Apply(obj));
                items
            }
            (Ok(watcher::Event::InitApply(obj)), FirstList::Buffered) => {
                let items = one(&obj);
                writer.apply_watcher_event(&watcher::Event::Apply(obj.clone()));
                writer.apply_watcher_event(&watcher::Event::InitApply(obj));
                items
            }
            (Ok(watcher::Event::InitDone), FirstList::Direct) => {
                // The store holds the whole list already; the buffer is empty.
                first = FirstList::Done;
                Box::new(std::iter::empty())
            }
            (Ok(ev @ watcher::Event::InitDone), FirstList::Buffered) => {
                first = FirstList::Done;
                writer.apply_watcher_event(&ev);
                Box::new(std::iter::empty())
            }
            (Ok(ev @ watcher::Event::InitDone), _) => {
                writer.apply_watcher_event(&ev);
                let dt = dt.clone();
                Box::new(
                    store
                        .state()
                        .into_iter()
                        .map(move |o| ObjectRef::from_obj_with(o.as_ref(), dt.clone())),
                )
            }
            (Ok(watcher::Event::Apply(obj)), _) => {
                let items = one(&obj);
                writer.apply_watcher_event(&watcher::Event::Apply(obj));
                items
            }
            (Ok(ev), _) => {
                writer.apply_watcher_event(&ev);
                Box::new(std::iter::empty())
            }
            (Err(_), _) => Box::new(std::iter::empty()),
        };
        futures::stream::iter(items)
    })
}

/// Records one item of a watch stream: the probe, relists and errors (counted and logged).
/// True when the item starts a relist of a cache that had synced before.
pub fn observe<K>(
    probe: &Probe,
    metrics: &Metrics,
    ev: &Result<watcher::Event<K>, watcher::Error>,
) -> bool {
    let resource = probe.resource();
    let relist = probe.observe(ev);
    if matches!(ev, Ok(watcher::Event::InitDone)) {
        // Each resource's counters exist from its first list on, at 0: a dashboard panel of a
        // cluster where no watch ever broke shows zeros, not "no data".
        metrics.watches.relists.with_label_values(&[resource]);
        metrics.watches.errors.with_label_values(&[resource]);
        metrics.watches.events.with_label_values(&[resource]);
    }
    if let Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitApply(_)) =
        ev
    {
        metrics.watches.events.with_label_values(&[resource]).inc();
    }
    if relist {
        metrics.watches.relists.with_label_values(&[resource]).inc();
        info!(%resource, "relisting: the watch could not resume");
    }
    if let Err(e) = ev {
        metrics.watches.errors.with_label_values(&[resource]).inc();
        warn!(%resource, error = %e, "watch error; retrying");
    }
    relist
}

/// Runs a cache of a context resource (namespaces, LimitRanges, …) and sends `to_trigger` of
/// every change to the job controllers; a completed relist sends [`Trigger::All`], since the
/// relist may have brought changes that no single event announced. `changes` is counted up
/// after each event the store applied.
pub fn spawn_context_cache<K>(
    api: Api<K>,
    triggers: broadcast::Sender<Trigger>,
    to_trigger: impl Fn(&K) -> Option<Trigger> + Send + Sync + 'static,
    probe: Probe,
    metrics: Arc<Metrics>,
    changes: Arc<std::sync::atomic::AtomicU64>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .backoff(WatchBackoff::default())
        .reflect(writer);
    let handle = tokio::spawn(async move {
        let _guard = probe.task_guard();
        let mut relisting = false;
        stream
            .for_each(|ev| {
                relisting |= observe(&probe, &metrics, &ev);
                if ev.is_ok() {
                    changes.fetch_add(1, std::sync::atomic::Ordering::Release);
                }
                let trigger = match &ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => to_trigger(o),
                    // The first list needs none: no job is reconciled before it completes.
                    Ok(watcher::Event::InitDone) if std::mem::take(&mut relisting) => {
                        Some(Trigger::All)
                    }
                    _ => None,
                };
                if let Some(t) = trigger {
                    let _ = triggers.send(t);
                }
                future::ready(())
            })
            .await;
    });
    (reader, handle)
}

/// The PodGroup cache of one backend. A change requeues the owning job — unless it is only the
/// echo of our own write (see `own_writes`); a completed relist rebuilds the owner index from
/// the store (a PodGroup deleted while the watch was down leaves no event behind) and requeues
/// every job.
pub fn spawn_pod_group_cache(
    client: Client,
    backend: BackendKind,
    triggers: broadcast::Sender<Trigger>,
    probe: Probe,
    metrics: Arc<Metrics>,
    owned: OwnedIndex,
    own_writes: OwnWrites,
) -> (Store<Packed>, JoinHandle<()>) {
    let ar = backend.backend().api_resource();
    let shared = crate::packed::kind(&ar);
    let writer = reflector::store::Writer::<Packed>::new(shared.clone());
    let reader = writer.as_reader();
    let store = reader.clone();
    // Only what podgroup-sync reads is kept in memory: each PodGroup is stripped as it is read.
    let api: Api<crate::lean::LeanPodGroup> = Api::all_with(client, &shared);
    let stream = watcher(
        api,
        watcher::Config::default().page_size(POD_GROUP_LIST_PAGE_SIZE),
    )
    .backoff(WatchBackoff::default())
    .map_ok(crate::packed::event)
    .reflect(writer);
    let handle = tokio::spawn(async move {
        let _guard = probe.task_guard();
        let mut relisting = false;
        stream
            .for_each(|ev| {
                relisting |= observe(&probe, &metrics, &ev);
                match &ev {
                    Ok(watcher::Event::Apply(pg)) | Ok(watcher::Event::Delete(pg)) => {
                        let deleted = matches!(ev, Ok(watcher::Event::Delete(_)));
                        owned.observe(backend, pg, deleted);
                        let echo = if deleted {
                            own_writes.forget(backend, pg);
                            false
                        } else {
                            own_writes.is_echo(backend, pg)
                        };
                        if echo {
                            metrics
                                .pod_groups
                                .own_write_echoes
                                .with_label_values(&[backend.as_str()])
                                .inc();
                        } else if let Some(t) = owner_trigger(pg) {
                            let _ = triggers.send(t);
                        }
                    }
                    // A relist's objects are not echoes of anything remembered.
                    Ok(watcher::Event::Init) => own_writes.forget_backend(backend),
                    Ok(watcher::Event::InitDone) => {
                        owned.replace(backend, &store.state());
                        // After the first list, the discovery loop requeues every job once the
                        // cache is in place; after a relist, this does.
                        if std::mem::take(&mut relisting) {
                            let _ = triggers.send(Trigger::All);
                        }
                    }
                    _ => {}
                }
                future::ready(())
            })
            .await;
    });
    (reader, handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    use kube::runtime::reflector;
    use kube::runtime::utils::WatchStreamExt;

    fn cm(name: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ns".into());
        c
    }

    /// Runs `events` through `reflect_settled`: the names handed on, each checked to be in the
    /// store when handed on, and the store.
    async fn settle(
        events: Vec<watcher::Result<watcher::Event<ConfigMap>>>,
    ) -> (Vec<String>, Store<ConfigMap>) {
        let (reader, writer) = reflector::store::<ConfigMap>();
        let check = reader.clone();
        let out = reflect_settled(futures::stream::iter(events), writer, ())
            .inspect(|key| {
                assert!(
                    check.get(key).is_some(),
                    "{key} handed on before the store held it"
                );
            })
            .map(|r| r.name)
            .collect()
            .await;
        (out, reader)
    }

    fn names(store: &Store<ConfigMap>) -> Vec<String> {
        let mut n: Vec<String> = store.state().iter().map(|o| o.name_any()).collect();
        n.sort();
        n
    }

    /// The lost-job defect: during a relist, an object reaches the consumer only when the store
    /// already holds it, so a lookup by the consumer always finds it; the relist's end hands on
    /// every object once and drops what is gone.
    #[tokio::test]
    async fn relisted_objects_are_handed_on_only_once_the_store_holds_them() {
        let (mut got, store) = settle(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(cm("old"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(cm("live"))),
            // The watch broke; a relist brings a job created meanwhile, and drops "live".
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(cm("a-new"))),
            Ok(watcher::Event::InitApply(cm("old"))),
            Ok(watcher::Event::InitDone),
        ])
        .await;
        got[2..].sort();
        assert_eq!(got, vec!["old", "live", "a-new", "old"]);
        assert_eq!(names(&store), vec!["a-new", "old"]);
    }

    /// Until a relist ends, the store keeps what it held: nothing it brings is handed on yet.
    #[tokio::test]
    async fn an_unfinished_relist_changes_nothing() {
        let (got, store) = settle(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(cm("a"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(cm("c"))),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(cm("d"))),
        ])
        .await;
        assert_eq!(got, vec!["a", "c"]);
        assert_eq!(names(&store), vec!["a", "c"]);
    }

    /// The first list fills the store page by page, each object handed on once as it comes;
    /// the store is ready before any of it (kube-runtime's controller waits for that).
    #[tokio::test]
    async fn the_first_list_is_handed_on_as_it_comes() {
        let (reader, writer) = reflector::store::<ConfigMap>();
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut refs = Box::pin(reflect_settled(rx, writer, ()));
        tokio::time::timeout(Duration::from_secs(1), reader.wait_until_ready())
            .await
            .expect("the store is ready before the first list")
            .unwrap();
        for ev in [watcher::Event::Init, watcher::Event::InitApply(cm("a"))] {
            tx.unbounded_send(Ok(ev)).unwrap();
        }
        assert_eq!(refs.next().await.unwrap().name, "a");
        assert_eq!(names(&reader), vec!["a"], "the list has not ended");
        for ev in [watcher::Event::InitApply(cm("b")), watcher::Event::InitDone] {
            tx.unbounded_send(Ok(ev)).unwrap();
        }
        drop(tx);
        let rest: Vec<String> = refs.map(|r| r.name).collect().await;
        assert_eq!(rest, vec!["b"], "the list's end hands on nothing again");
        assert_eq!(names(&reader), vec!["a", "b"]);
    }

    /// A first list that broke off and started over ends with exactly the objects of the list
    /// that completed: one deleted in between is dropped.
    #[tokio::test]
    async fn a_first_list_started_over_keeps_only_what_the_completed_one_brought() {
        let (got, store) = settle(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(cm("gone"))),
            Ok(watcher::Event::InitApply(cm("a"))),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(cm("a"))),
            Ok(watcher::Event::InitApply(cm("b"))),
            Ok(watcher::Event::InitDone),
        ])
        .await;
        assert_eq!(got, vec!["gone", "a", "a", "b"]);
        assert_eq!(names(&store), vec!["a", "b"]);
    }

    /// Pins the upstream behaviour `reflect_settled` exists for: kube-runtime's reflector hands
    /// relisted objects on before its store holds them. If an upgrade changes this, this test
    /// says so.
    #[tokio::test]
    async fn upstream_reflector_hands_relisted_objects_on_before_the_store_holds_them() {
        let (reader, writer) = reflector::store::<ConfigMap>();
        let events = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(cm("a-new"))),
            Ok(watcher::Event::InitDone),
        ];
        let missing: Vec<bool> = futures::stream::iter(events)
            .reflect(writer)
            .applied_objects()
            .map(|r| {
                let key = reflector::ObjectRef::from_obj(&r.unwrap());
                reader.get(&key).is_none()
            })
            .collect()
            .await;
        assert_eq!(missing, vec![true]);
    }

    #[test]
    fn the_backoff_grows_to_its_cap_with_jitter_and_resets() {
        let mut b = WatchBackoff::default();
        let delays: Vec<Duration> = (&mut b).take(8).collect();
        assert!(delays[0] >= WATCH_BACKOFF_MIN / 2 && delays[0] <= WATCH_BACKOFF_MIN);
        assert!(delays.iter().all(|d| *d <= WATCH_BACKOFF_MAX));
        assert!(delays[7] >= WATCH_BACKOFF_MAX / 2);
        b.reset();
        assert!(b.next().unwrap() <= WATCH_BACKOFF_MIN);
    }
}
