//! The caches a reconcile reads, kept by the reflectors of `watch`, and the view of them the
//! planner sees.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{LimitRange, Namespace};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::backend::BackendKind;
use crate::gang::Priorities;
use crate::job::{InvalidJob, JobKind};
use crate::packed::Packed;
use crate::resources::AdmissionDefaults;
use crate::target::PodGroups;

/// Read-only caches of the cluster, kept by reflectors.
#[derive(Clone)]
pub struct Caches {
    pub namespaces: Store<Namespace>,
    pub limit_ranges: Store<LimitRange>,
    pub priority_classes: Store<PriorityClass>,
    pub runtime_classes: Store<RuntimeClass>,
    /// Counts the changes the context caches above (and the admission policies') applied: what
    /// the pod-link webhook worked out from them stays good while it stays the same.
    pub context_changes: Arc<AtomicU64>,
    /// What [`Caches::priorities`] and [`Caches::admission_defaults`] last built, by the count
    /// of context changes they were built at.
    pub context_memo: Arc<std::sync::Mutex<ContextMemo>>,
    /// PodGroups of each backend whose CRD is served and whose cache has synced.
    pub pod_groups: Arc<RwLock<BTreeMap<BackendKind, Store<Packed>>>>,
    /// The cached PodGroups by the UID of the job that controls them.
    pub owned: OwnedIndex,
    /// Our PodGroup writes whose watch events are still to come (their echo requeues nothing).
    pub own_writes: crate::own_writes::OwnWrites,
    /// The job cache of each watched kind (read by the pod-link webhook).
    pub jobs: JobStores,
    /// Pods of managed jobs created without a link (kept only with the webhook on).
    pub unlinked: crate::unlinked::UnlinkedPods,
    /// Nodes and Volcano Queues, stripped (kept only with the feasibility check on).
    pub capacity: Option<crate::health::capacity::CapacityCaches>,
    /// What Kueue admitted, per job (while Kueue's Workload CRD is served).
    pub kueue: crate::kueue::Admissions,
    /// Volcano's tier numbers by name (while HyperNodes are served).
    pub tiers: crate::tiers::Tiers,
}

/// The job cache of each watched kind and version.
pub type JobStores = Arc<RwLock<BTreeMap<(&'static str, &'static str), Store<Packed>>>>;

/// What the job caches say about one job.
#[derive(Debug)]
pub enum CachedJob {
    /// The kind is not watched (its CRD is not served, or discovery has not started it yet).
    KindNotWatched,
    /// Watched, but the cache holds no such job (yet).
    Absent,
    /// As cached: [`Packed::unpack`] gives the whole object.
    Found(Arc<Packed>),
}

pub use crate::owned::OwnedIndex;

/// A namespace's admission defaults, or why they cannot be used.
pub type Defaults = Result<AdmissionDefaults, InvalidJob>;

/// Namespaces whose defaults are remembered; past it the memo starts again empty.
const MEMO_NAMESPACES: usize = 10_000;

/// The context built from the caches, by the count of context changes it was built at.
#[derive(Default)]
pub struct ContextMemo {
    priorities: Option<(u64, Arc<Priorities>)>,
    defaults: std::collections::HashMap<String, (u64, Arc<Defaults>)>,
}

impl Caches {
    /// The cached job of `kind` with this namespace and name.
    pub fn job(&self, kind: &JobKind, namespace: &str, name: &str) -> CachedJob {
        let Some(store) = self
            .jobs
            .read()
            .expect("lock")
            .get(&(kind.kind, kind.version))
            .cloned()
        else {
            return CachedJob::KindNotWatched;
        };
        let key = ObjectRef::new_with(name, kind.shared()).within(namespace);
        match store.get(&key) {
            Some(job) => CachedJob::Found(job),
            None => CachedJob::Absent,
        }
    }

    pub fn pod_group_store(&self, backend: BackendKind) -> Option<Store<Packed>> {
        self.pod_groups.read().expect("lock").get(&backend).cloned()
    }

    /// The PriorityClasses as the gang computation reads them (built again only after a
    /// context cache changed).
    pub fn priorities(&self) -> Arc<Priorities> {
        // Counted before the stores are read: a change applied meanwhile builds them again.
        let at = self.context_changes.load(Ordering::Acquire);
        if let Some((built, p)) = &self.context_memo.lock().expect("lock").priorities
            && *built == at
        {
            return p.clone();
        }
        let p = Arc::new(Priorities::from_classes(
            self.priority_classes.state().iter().map(|p| p.as_ref()),
        ));
        self.context_memo.lock().expect("lock").priorities = Some((at, p.clone()));
        p
    }

    /// The namespace's LimitRange and the RuntimeClasses' defaults (built again only after a
    /// context cache changed).
    pub fn admission_defaults(&self, namespace: &str) -> Arc<Defaults> {
        let at = self.context_changes.load(Ordering::Acquire);
        if let Some((built, d)) = self
            .context_memo
            .lock()
            .expect("lock")
            .defaults
            .get(namespace)
            && *built == at
        {
            return d.clone();
        }
        let d = Arc::new(self.build_admission_defaults(namespace));
        let mut memo = self.context_memo.lock().expect("lock");
        if memo.defaults.len() >= MEMO_NAMESPACES && !memo.defaults.contains_key(namespace) {
            memo.defaults.clear();
        }
        memo.defaults.insert(namespace.to_string(), (at, d.clone()));
        d
    }

    fn build_admission_defaults(&self, namespace: &str) -> Defaults {
        let mut lrs: Vec<LimitRange> = self
            .limit_ranges
            .state()
            .iter()
            .filter(|l| l.metadata.namespace.as_deref() == Some(namespace))
            .map(|l| (**l).clone())
            .collect();
        lrs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let rcs: Vec<RuntimeClass> = self
            .runtime_classes
            .state()
            .iter()
            .map(|r| (**r).clone())
            .collect();
        AdmissionDefaults::from_limit_ranges_and_runtime_classes(&lrs, &rcs)
            .map_err(|e| InvalidJob::InvalidResources(format!("namespace admission defaults: {e}")))
    }
}

impl PodGroups for Caches {
    fn served(&self, backend: BackendKind) -> bool {
        self.pod_groups.read().expect("lock").contains_key(&backend)
    }

    fn get(&self, backend: BackendKind, namespace: &str, name: &str) -> Option<Arc<DynamicObject>> {
        let store = self.pod_group_store(backend)?;
        let key = ObjectRef::new_with(name, backend.backend().shared()).within(namespace);
        store.get(&key).map(|pg| Arc::new(pg.unpack()))
    }

    fn controlled_by(&self, uid: &str) -> Vec<(BackendKind, Arc<DynamicObject>)> {
        self.owned
            .owned_by(uid)
            .into_iter()
            .filter_map(|(backend, ns, name)| Some((backend, self.get(backend, &ns, &name)?)))
            .collect()
    }
}
