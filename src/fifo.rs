//! First in, first out: the order jobs reach a kind's reconciler.
//!
//! kube-runtime's runner holds the requests it cannot start yet (all `--concurrency` slots
//! busy) in a hash set and takes them in hash order, so under a burst a job created first may be
//! reconciled last (kube-runtime 5.0 `scheduler.rs`, `pending`). This stage sits in front of the
//! controller and hands it at most `concurrency` jobs that have not finished yet, in the order
//! they were asked for; the rest wait here, in a queue. The runner's own set then stays (nearly)
//! empty.
//!
//! A job asked for again while it waits keeps its place; while it was handed on but not started,
//! nothing more is needed (the reconcile reads the cache when it starts); while it runs, it is
//! queued once more when it finishes. A job handed on that never starts (deleted before its
//! turn: the runner reports it not found) is given back by `finished` as well; one that neither
//! started nor was reported within `STALE` is taken back, so a lost report costs order, never
//! progress.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::Stream;
use futures::stream::{Fuse, StreamExt};
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::packed::Packed;

/// A job: its namespace and name.
pub type Key = (String, String);

/// How long a job handed on may go without starting before its turn is taken back.
const STALE: Duration = Duration::from_secs(30);

/// The key of a job reference.
pub fn key<K: kube::Resource>(r: &ObjectRef<K>) -> Key {
    (r.namespace.clone().unwrap_or_default(), r.name.clone())
}

/// The key of a job.
pub fn job_key(job: &impl kube::Resource) -> Key {
    (
        job.meta().namespace.clone().unwrap_or_default(),
        job.meta().name.clone().unwrap_or_default(),
    )
}

/// A job handed on and not finished.
#[derive(Debug)]
struct Out {
    started: bool,
    /// Asked for again while it ran: queued once more when it finishes.
    again: bool,
    since: Instant,
}

/// The queue and the jobs handed on; pure, so it is tested without a runtime.
#[derive(Debug)]
pub struct State {
    queue: VecDeque<Key>,
    queued: HashSet<Key>,
    out: HashMap<Key, Out>,
    /// Jobs that may still be handed on; `usize::MAX` without a limit.
    credits: usize,
    waker: Option<Waker>,
}

impl State {
    /// `concurrency` 0 means no limit (as for kube-runtime).
    pub fn new(concurrency: u16) -> Self {
        State {
            queue: VecDeque::new(),
            queued: HashSet::new(),
            out: HashMap::new(),
            credits: if concurrency == 0 {
                usize::MAX
            } else {
                concurrency as usize
            },
            waker: None,
        }
    }

    /// A job is asked for.
    pub fn push(&mut self, key: Key) {
        if self.queued.contains(&key) {
            return;
        }
        match self.out.get_mut(&key) {
            Some(out) if out.started => out.again = true,
            Some(_) => {}
            None => self.enqueue(key),
        }
    }

    fn enqueue(&mut self, key: Key) {
        self.queued.insert(key.clone());
        self.queue.push_back(key);
    }

    /// The next job to hand on, if a turn is free.
    pub fn pop(&mut self, now: Instant) -> Option<Key> {
        if self.credits == 0 {
            self.reclaim(now);
        }
        if self.credits == 0 {
            return None;
        }
        let key = self.queue.pop_front()?;
        self.queued.remove(&key);
        self.credits -= 1;
        self.out.insert(
            key.clone(),
            Out {
                started: false,
                again: false,
                since: now,
            },
        );
        Some(key)
    }

    /// Takes back the turns of jobs handed on long ago that never started.
    fn reclaim(&mut self, now: Instant) {
        let stale: Vec<Key> = self
            .out
            .iter()
            .filter(|(_, o)| !o.started && now.duration_since(o.since) >= STALE)
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            self.finished(&k);
        }
    }

    /// A reconcile of the job starts (one this stage handed on, or the runner's own retry).
    pub fn started(&mut self, key: &Key) {
        if let Some(out) = self.out.get_mut(key) {
            out.started = true;
        }
    }

    /// A reconcile of the job ended, or the runner dropped it. True when a turn was freed.
    pub fn finished(&mut self, key: &Key) -> bool {
        let Entry::Occupied(e) = self.out.entry(key.clone()) else {
            return false;
        };
        let out = e.remove();
        self.credits = self.credits.saturating_add(1);
        if out.again {
            self.enqueue(key.clone());
        }
        true
    }

    /// Jobs waiting here.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }
}

/// The stage, shared by the input stream and the reconciles.
#[derive(Clone)]
pub struct Fifo {
    state: Arc<Mutex<State>>,
    /// Jobs waiting (`podgroup_sync_queued_jobs{kind}`).
    waiting: Option<prometheus::IntGauge>,
}

/// A reconcile in progress; dropping it (at the end, or when the reconcile is cancelled)
/// frees its turn.
pub struct Turn {
    fifo: Fifo,
    key: Key,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.fifo.finished(&self.key);
    }
}

impl Fifo {
    pub fn new(concurrency: u16) -> Self {
        Fifo {
            state: Arc::new(Mutex::new(State::new(concurrency))),
            waiting: None,
        }
    }

    /// Keeps `gauge` at the number of jobs waiting.
    pub fn with_gauge(mut self, gauge: prometheus::IntGauge) -> Self {
        self.waiting = Some(gauge);
        self
    }

    fn report(&self, state: &State) {
        if let Some(g) = &self.waiting {
            g.set(state.waiting() as i64);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is consistent after every method; a panic elsewhere cannot break it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reconcile of the job starts; its turn ends when the returned guard is dropped.
    pub fn begin(&self, key: Key) -> Turn {
        self.lock().started(&key);
        Turn {
            fifo: self.clone(),
            key,
        }
    }

    /// The runner dropped the job (gone from the cache) or its reconcile ended.
    pub fn finished(&self, key: &Key) {
        let waker = {
            let mut s = self.lock();
            let freed = s.finished(key);
            self.report(&s);
            if freed { s.waker.take() } else { None }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Jobs waiting for a turn.
    pub fn waiting(&self) -> usize {
        self.lock().waiting()
    }

    /// The job references of `input`, in order and at most `concurrency` unfinished at a time.
    /// The input is read as fast as it comes, so the watches behind it never wait.
    pub fn stream<S>(&self, input: S, ar: crate::packed::Kind) -> Gated<S>
    where
        S: Stream<Item = ObjectRef<Packed>>,
    {
        Gated {
            fifo: self.clone(),
            input: Box::pin(input.fuse()),
            ar,
            reclaim: None,
        }
    }
}

/// See [`Fifo::stream`].
pub struct Gated<S> {
    fifo: Fifo,
    input: Pin<Box<Fuse<S>>>,
    ar: crate::packed::Kind,
    /// Wakes the stream to take back stale turns while nothing else happens.
    reclaim: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Stream for Gated<S>
where
    S: Stream<Item = ObjectRef<Packed>>,
{
    type Item = ObjectRef<Packed>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let mut state = this.fifo.lock();
        while let Poll::Ready(Some(r)) = this.input.as_mut().poll_next(cx) {
            state.push(key(&r));
        }
        let next = state.pop(Instant::now());
        this.fifo.report(&state);
        if let Some((ns, name)) = next {
            this.reclaim = None;
            let r = ObjectRef::new_with(&name, this.ar.clone());
            return Poll::Ready(Some(if ns.is_empty() { r } else { r.within(&ns) }));
        }
        // Nothing to hand on: the input, a finished reconcile or the stale timer wakes us.
        state.waker = Some(cx.waker().clone());
        let waiting = state.waiting() > 0;
        drop(state);
        if waiting {
            let sleep = this
                .reclaim
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(STALE / 2)));
            if sleep.as_mut().poll(cx).is_ready() {
                this.reclaim = None;
                cx.waker().wake_by_ref();
            }
        }
        // The input never ends for good: the controller stops on shutdown.
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> Key {
        ("ns".to_string(), name.to_string())
    }

    fn drain(s: &mut State, now: Instant) -> Vec<String> {
        std::iter::from_fn(|| s.pop(now)).map(|(_, n)| n).collect()
    }

    #[test]
    fn jobs_are_handed_on_in_the_order_asked_and_at_most_concurrency_at_a_time() {
        let now = Instant::now();
        let mut s = State::new(2);
        for n in ["a", "b", "c", "d", "b"] {
            s.push(k(n));
        }
        assert_eq!(drain(&mut s, now), ["a", "b"]);
        s.started(&k("a"));
        assert!(s.finished(&k("a")));
        assert_eq!(drain(&mut s, now), ["c"]);
        s.finished(&k("b"));
        s.finished(&k("c"));
        assert_eq!(drain(&mut s, now), ["d"]);
        assert_eq!(s.waiting(), 0);
    }

    #[test]
    fn a_job_asked_for_while_it_runs_runs_again_after_and_not_before() {
        let now = Instant::now();
        let mut s = State::new(4);
        s.push(k("a"));
        assert_eq!(drain(&mut s, now), ["a"]);
        // Handed on, not started: the reconcile will read the newest cache anyway.
        s.push(k("a"));
        assert_eq!(s.waiting(), 0);
        s.started(&k("a"));
        s.push(k("a"));
        s.push(k("a"));
        // Not handed on while it runs: the runner would park it in its unordered set.
        assert_eq!(drain(&mut s, now), Vec::<String>::new());
        s.finished(&k("a"));
        assert_eq!(drain(&mut s, now), ["a"]);
    }

    #[test]
    fn retries_of_the_runner_neither_take_nor_free_turns() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.started(&k("retry"));
        assert!(!s.finished(&k("retry")));
        s.push(k("a"));
        s.push(k("b"));
        assert_eq!(drain(&mut s, now), ["a"]);
        assert!(!s.finished(&k("retry")));
        assert_eq!(drain(&mut s, now), Vec::<String>::new());
    }

    #[test]
    fn a_turn_handed_on_that_never_starts_is_taken_back_after_a_while() {
        let now = Instant::now();
        let mut s = State::new(1);
        s.push(k("gone"));
        s.push(k("next"));
        assert_eq!(drain(&mut s, now), ["gone"]);
        assert_eq!(drain(&mut s, now + STALE / 2), Vec::<String>::new());
        assert_eq!(drain(&mut s, now + STALE), ["next"]);
        // A started one is never taken back, however long it runs.
        s.started(&k("next"));
        s.push(k("last"));
        assert_eq!(drain(&mut s, now + STALE * 10), Vec::<String>::new());
    }

    #[test]
    fn no_limit_hands_on_everything() {
        let now = Instant::now();
        let mut s = State::new(0);
        for i in 0..1000 {
            s.push(k(&i.to_string()));
        }
        assert_eq!(drain(&mut s, now).len(), 1000);
    }

    /// Through the stream, with reconciles that finish: every job once, in order.
    #[tokio::test]
    async fn the_stream_hands_on_in_order_as_turns_free() {
        let ar = crate::packed::kind(&kube::discovery::ApiResource::erase::<
            k8s_openapi::api::core::v1::ConfigMap,
        >(&()));
        let fifo = Fifo::new(3);
        let refs: Vec<_> = (0..50)
            .map(|i| ObjectRef::new_with(&format!("j{i:02}"), ar.clone()).within("ns"))
            .collect();
        let input = futures::stream::iter(refs.clone()).chain(futures::stream::pending());
        let mut gated = Box::pin(fifo.stream(input, ar));
        let mut got = Vec::new();
        while got.len() < 50 {
            let r = gated.next().await.unwrap();
            let turn = fifo.begin(key(&r));
            got.push(r.name.clone());
            // Finish on another task, as the runner does.
            tokio::spawn(async move { drop(turn) });
        }
        let want: Vec<_> = refs.iter().map(|r| r.name.clone()).collect();
        assert_eq!(got, want);
    }
}
